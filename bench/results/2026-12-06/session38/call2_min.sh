#!/usr/bin/env bash
# Thirty-eighth session, the last ~300 s of device time (xbufs.patch + exp_xbufs.patch applied
# here first; carry [".deps"]): test_gemm's gemv cases at NB = 3 (quick), then bench_gemm cuBLASLt /
# kAuto / X in windows at tp 1 and 8, T = 16, NB = 2 and 3. (call1_min.sh without racecheck and the
# NB = 2 test run.) Not run: too little device time was left to start a machine when it was written.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
STEP5_EXP_XBUFS=3 STEP5_GPU_TEST_QUICK=1 timeout 40 build-device/tests/test_gemm gemv > $O/l/test_gemm_nb3.txt 2>&1; rc=$?
echo "$(el) test_gemm [gemv] NB=3 rc=$rc $(grep -E 'passed, .* failed' $O/l/test_gemm_nb3.txt | tail -1)"; grep -E "ERROR|FAIL" $O/l/test_gemm_nb3.txt | head -5
F='^(cublaslt|gemm_auto|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:(1|8)/tokens:16/'
for nb in 2 3; do
  STEP5_EXP_XBUFS=$nb timeout 40 build-device/bench/bench_gemm --benchmark_filter="$F" > $O/l/bench_nb$nb.txt 2>&1; rc=$?
  echo "-- NB $nb (rc $rc)"; grep -E "^(cublaslt|gemm_)" $O/l/bench_nb$nb.txt | awk '{print $1, $2, $NF}' | sed 's#/min_time:0.020/manual_time##'
done
echo "$(el) done"
