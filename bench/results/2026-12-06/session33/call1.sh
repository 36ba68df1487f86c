#!/usr/bin/env bash
# Session 33, call 1 (carry [".deps"]): the thirty-second session's unrun GPU checks
# (session32/next_call.sh, trimmed to one call) and where the decode top-k spends its time.
#   1. build test_gemm, bench_gemm, bench_indexer;
#   2. test_gemm full (the ring shapes, K = 0, N = 1 / 7, the partition bit-identity case);
#   3. compute-sanitizer racecheck, synccheck, memcheck of test_gemm "K = 0" (quick);
#   4. bench_gemm T = 1 rows at tp 2, 4, 16 (the rule's unmeasured shapes) and tp 1 / 8, 3 repetitions;
#   5. per-kernel durations (Nsight Compute) of the decode top-k rows: 1 and 16 (cluster radix and
#      one-CTA candidates), and the SASS stall samples of both at rows: 1.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_gemm bench_gemm bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
timeout 120 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1
echo "$(el) test_gemm full rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -1)"; grep -E "FAIL" $O/l/test_gemm.txt | head -8
c="K = 0"
for tool in racecheck synccheck memcheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "$c" > "$O/l/san_${tool}_K0.txt" 2>&1
  echo "$(el) $tool test_gemm [$c] rc=$? $(grep -E 'passed, .* failed' "$O/l/san_${tool}_K0.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}_K0.txt" | tail -1)"
done
pack
timeout 100 build-device/bench/bench_gemm --benchmark_filter='^(copy|((gemm_gemv|gemm_auto|cublaslt)/(o_proj/)?[a-z0-9_]+/tp:(1|2|4|8|16)/tokens:1/))' --benchmark_repetitions=3 --benchmark_out=$O/l/gemm.json --benchmark_out_format=json > $O/l/gemm.txt 2>&1
echo "$(el) bench_gemm rc=$?"; tail -32 $O/l/gemm.txt | cut -c1-140
pack
for f in 'topk/radix_cluster/rows:1$' 'topk/cand_cta/rows:1$' 'topk/radix_cluster/rows:16$' 'topk/cand_cta/rows:16$'; do
  echo "== ncu $f"; timeout 60 bash tools/ncu_kernels.sh bench_indexer "$f" 0 40 2>&1 | tail -4
done
echo "$(el) ncu durations"
for f in 'radix_cluster' 'cand_cta'; do
  echo "== sass $f"; OUT=$O/l timeout 90 bash tools/ncu_sass.sh bench_indexer "topk/$f/rows:1\$" topk_select 3 1 14 > $O/l/sass_$f.txt 2>&1; head -40 $O/l/sass_$f.txt
done
echo "$(el) done"; pack
