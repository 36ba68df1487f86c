#!/usr/bin/env bash
# Thirty-seventh session, the smallest form of session36/next_call.sh (about 240 s of device time
# were left; xbufs.patch + exp_xbufs.patch applied here first; carry [".deps"]): test_gemm's gemv
# cases (quick) at NB = 3, bench_gemm cuBLASLt / kAuto / X in windows at tp 1 / 2 / 8, T = 16, NB
# = 2 and 3, then racecheck "stale ring bytes" at NB = 3 and the gemv cases at NB = 2.
# Not run: every machine start of the thirty-seventh session failed or was refused (the whole 1800 s
# went on them). With more time, session36/next_call.sh is the full form (T = 4 / 8 / 16, tp 1 / 2 /
# 4 / 8, NB 3 on 120 CTAs).
# Found here without a GPU (host test test_gemm_gemv with kGemmGemvXBuffers = 3): every (T, K)
# still fits with >= the preferred ring stages, but a constant NB = 3 moves kAuto's T = 4 / 5 at K
# 4096 from X in windows back to X whole (gemm_auto_gemv_config compares the rings' stages: the
# windowed ring drops 6 -> 5 stages at T = 4), and T = 16 gets 6 stages of 512 instead of 4 of 1024.
# So if NB = 3 wins at T = 16, land it as a rule by T (NB = 3 from T = 9, the T = 9..16 class), not
# as the constant, and keep T = 2..8 at two buffers unless measured.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
gemv_tests() {
  STEP5_EXP_XBUFS=$1 STEP5_GPU_TEST_QUICK=1 timeout 40 build-device/tests/test_gemm gemv > $O/l/test_gemm_nb$1.txt 2>&1; rc=$?
  echo "$(el) test_gemm [gemv] NB=$1 rc=$rc $(grep -E 'passed, .* failed' $O/l/test_gemm_nb$1.txt | tail -1)"; grep -E "ERROR|FAIL" $O/l/test_gemm_nb$1.txt | head -5
}
gemv_tests 3
F='^(cublaslt|gemm_auto|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:(1|2|8)/tokens:16/'
for nb in 2 3; do
  STEP5_EXP_XBUFS=$nb timeout 40 build-device/bench/bench_gemm --benchmark_filter="$F" > $O/l/bench_nb$nb.txt 2>&1; rc=$?
  echo "-- NB $nb (rc $rc)"; grep -E "^(cublaslt|gemm_)" $O/l/bench_nb$nb.txt | awk '{print $1, $2, $NF}' | sed 's#/min_time:0.020/manual_time##'
done
STEP5_EXP_XBUFS=3 STEP5_GPU_TEST_QUICK=1 timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_gemm "stale ring bytes" > $O/l/race_nb3.txt 2>&1; rc=$?
echo "$(el) racecheck NB=3 rc=$rc $(grep -E 'RACECHECK SUMMARY' $O/l/race_nb3.txt | tail -1)"
gemv_tests 2
echo "$(el) done"
