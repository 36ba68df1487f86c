#!/usr/bin/env bash
# Prepared in the thirty-sixth session (not run: the device time was spent on failed machine starts).
# The windowed kGemv kernel with X prefetched NB - 1 windows ahead in NB buffers (xbufs.patch: the
# kernel, ops::gemm_gemv_x_buffers / kGemmGemvXBuffers = 2, GemvArgs::x_bufs; NB = 2 keeps the
# landed kernel's buffers, order and bits, one empty cp.async group more at the end; a subagent
# review found no race or accounting error) and exp_xbufs.patch (not to land: STEP5_EXP_XBUFS sets
# gemm_gemv_x_buffers, STEP5_EXP_GEMV_GRID the kGemv grid, at run time). Call 2 found each window
# costing about 1 us where a CTA has few row blocks (tp 8: X's next window is requested one window
# ahead and lands late).
# Here first: `git apply bench/results/2026-12-06/session36/xbufs.patch bench/results/2026-12-06/session36/exp_xbufs.patch`
# (revert exp_xbufs.patch after the call); device, carry [".deps"], about 320 s:
#   1. test_gemm (quick, every case) with NB = 2 and 3; racecheck "stale ring bytes" at 3;
#   2. bench_gemm cublaslt / gemm_auto / gemm_gemv_win, fused, tp 1 / 2 / 4 / 8, T = 4 / 8 / 16, NB = 2, 3;
#      X in windows at NB = 3 on 120 CTAs at tp 8.
# If NB = 3 wins at tp 8 T = 16 without losing at tp 1 / 2: kGemmGemvXBuffers = 3 (the host test's
# pins of two buffers and the ring's stages change: T = 16 K 4096 gets 6 stages of 512), or a rule by
# row blocks per CTA; then kAuto's T = 9..16 rule (gemm_auto_takes_gemv: 128 MiB) from the tp 2 / 4 / 8 rows.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for nb in 2 3; do
  STEP5_EXP_XBUFS=$nb STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/test_gemm > $O/l/test_gemm_nb$nb.txt 2>&1; rc=$?
  echo "$(el) test_gemm NB=$nb rc=$rc $(grep -E 'passed, .* failed' $O/l/test_gemm_nb$nb.txt | tail -1)"; grep -E "ERROR|FAIL" $O/l/test_gemm_nb$nb.txt | head -5
done
for nb in 3; do
  STEP5_EXP_XBUFS=$nb STEP5_GPU_TEST_QUICK=1 timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_gemm "stale ring bytes" > $O/l/race_nb$nb.txt 2>&1; rc=$?
  echo "$(el) racecheck NB=$nb rc=$rc $(grep -E 'RACECHECK SUMMARY' $O/l/race_nb$nb.txt | tail -1)"
done
F='^(cublaslt|gemm_auto|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:(1|2|4|8)/tokens:(4|8|16)/'
for nb in 2 3; do
  STEP5_EXP_XBUFS=$nb timeout 60 build-device/bench/bench_gemm --benchmark_filter="$F" > $O/l/bench_nb$nb.txt 2>&1; rc=$?
  echo "-- NB $nb (rc $rc)"; grep -E "^(cublaslt|gemm_)" $O/l/bench_nb$nb.txt | awk '{print $1, $2, $NF}' | sed 's#/min_time:0.020/manual_time##'
done
# the grid at tp 8 (STEP5_EXP_GEMV_GRID, the same patch): call 2 read 14.5 against 14.9 us at 120 CTAs
F8='^(gemm_gemv|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:8/tokens:(8|16)/'
for v in "3 120"; do
  set -- $v
  STEP5_EXP_XBUFS=$1 STEP5_EXP_GEMV_GRID=$2 timeout 40 build-device/bench/bench_gemm --benchmark_filter="$F8" > $O/l/bench_nb$1_grid$2.txt 2>&1; rc=$?
  echo "-- NB $1 grid $2 (rc $rc)"; grep -E "^gemm_" $O/l/bench_nb$1_grid$2.txt | awk '{print $1, $2, $NF}' | sed 's#/min_time:0.020/manual_time##'
done
echo "$(el) done"
