#!/usr/bin/env bash
# Prepared for the next session (not run): the GPU checks the thirty-second session's last commit
# could not run (no device time left). Carry [".deps"].
#   1. build test_gemm, bench_gemm; test_gemm full (the new ring shapes, K = 0, N = 1 / 7, the
#      partition bit-identity case);
#   2. compute-sanitizer on test_gemm quick: racecheck + synccheck of "odd shapes" and of the new
#      "K = 0" case (the final kernel; give racecheck of the odd shapes >= 150 s), memcheck of the
#      new case;
#   3. bench_gemm T = 1 and 4 rows (gemm_gemv, gemm_auto, cublaslt) at tp 1 and 8, and the T = 1
#      rows at tp 2, 4 and 16 (registered since 31c4a80's successor: the rule's unmeasured shapes),
#      3 repetitions.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
timeout 120 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1
echo "$(el) test_gemm full rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -1)"; grep -E "FAIL" $O/l/test_gemm.txt | head -8
for c in "K = 0" "odd shapes"; do for tool in racecheck synccheck memcheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 160 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "$c" > "$O/l/san_${tool}_${c// /_}.txt" 2>&1
  echo "$(el) $tool test_gemm [$c] rc=$? $(grep -E 'passed, .* failed' "$O/l/san_${tool}_${c// /_}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}_${c// /_}.txt" | tail -1)"
done; done
pack
timeout 150 build-device/bench/bench_gemm --benchmark_filter='^(copy|((gemm_gemv|gemm_gemv_mma|gemm_auto|cublaslt)/(o_proj/)?[a-z0-9_]+/(tp:(1|8)/tokens:(1|4)|tp:(2|4|16)/tokens:1)/))' --benchmark_repetitions=3 --benchmark_out=$O/l/gemm.json --benchmark_out_format=json > $O/l/gemm.txt 2>&1
echo "$(el) bench_gemm rc=$?"; tail -45 $O/l/gemm.txt | cut -c1-140
echo "$(el) done"; pack
