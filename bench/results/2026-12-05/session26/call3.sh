#!/usr/bin/env bash
# Twenty-sixth session, call 3: call 2's pushes with the launcher's shared-memory opt-in fixed (the
# receive buffers raised the cluster instances' static shared memory, and launches of 16-32 KiB
# dynamic no longer fitted 48 KiB without the opt-in: test_topk's two global-memory cluster cases
# failed to launch in call 2). Device carry [".deps"].
#   1. test_topk quick; memcheck and racecheck of the cluster cases; 2. the batch-1 decode plan
#   swept (forced splits x ring depth) on the one-query instance; 3. bench_gemm (not run since the
#   twentieth session).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 545 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_topk bench_attention bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/test_topk > $O/l/test_topk.txt 2>&1
rc=$?; echo "$(el) test_topk quick rc=$rc $(grep -E 'passed, .* failed' $O/l/test_topk.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/test_topk.txt | head -5; pack
for tool in memcheck racecheck; do for c in "ties across cluster ranks" "rows longer than kTopkCluster" "decode-shaped rows"; do
  [ "$(left)" -gt 200 ] || break 2
  STEP5_GPU_TEST_QUICK=1 timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_topk "$c" > "$O/l/${tool}_${c// /_}.txt" 2>&1
  echo "$(el) $tool '$c' rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/${tool}_${c// /_}.txt" | tail -n 1) | $(grep -E 'passed, .* failed' "$O/l/${tool}_${c// /_}.txt" | tail -n 1)"
done; done; pack
for st in 0 2 3 4; do for sp in 0 8 13 16; do
  [ "$(left)" -gt 110 ] || break 2
  r=$(STEP5_BENCH_ATTN_SPLITS=$sp STEP5_BENCH_ATTN_STAGES=$st timeout 20 build-device/bench/bench_attention --benchmark_filter='^attention/decode/.*/batch:(1|8)/ctx:131072' 2>/dev/null | grep -E "^attention/decode" | awk '{printf "%s=%s ", $1, $2}')
  echo "stages $st splits $sp: $r" | sed 's|attention/decode/step5_preview/||g; s|/iterations:[0-9]*/manual_time||g; s|/ctx:131072||g' | tee -a $O/l/sweep.txt
done; done; pack
[ "$(left)" -gt 40 ] && { timeout $(( $(left) - 5 )) build-device/bench/bench_gemm --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench_gemm rc=$?"; grep -E "^copy|^cublas|x_cublasLt" $O/l/bench_gemm.txt | head -3; tail -n 45 $O/l/bench_gemm.txt | cut -c1-170; }
echo "$(el) done"; pack; rm -rf $O/l
