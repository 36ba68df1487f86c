#!/usr/bin/env bash
# For the next session's first device call (carry [".deps"]): the GPU checks session 47 could not
# run. Its fix of the top-k staging tail (d9a6584: topk_slice_keys, one 16-byte load of the last
# partial four) was compiled only; memcheck had stopped test_topk at the candidate-cap case (the
# read past the staging), so the cases after it never ran under memcheck either. Then the
# selection rows of bench_indexer and bench_layer's prefill rows, to show the fix costs nothing.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/logs; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
. tools/device_build.sh test_topk test_layer bench_indexer bench_layer > $O/logs/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/logs/build.log); spill lines: $(grep -ci spill build-device.build.log)"
timeout 100 build-device/tests/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL" $O/logs/test_topk.txt | head -8
for s in "memcheck|" "racecheck|rows that end" "racecheck|candidate compaction"; do
  IFS='|' read -r tool f <<< "$s"; [ $(left) -gt 150 ] || { echo "skip $tool [$f]: time"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_topk ${f:+"$f"} > $O/logs/san_topk_${tool}_${f// /_}.txt 2>&1
  echo "$(el) $tool [$f] rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/logs/san_topk_${tool}_${f// /_}.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_topk_${tool}_${f// /_}.txt | tail -1)"
done
STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/test_layer > $O/logs/test_layer.txt 2>&1
echo "$(el) test_layer quick rc=$? $(grep -E 'passed, .* failed' $O/logs/test_layer.txt | tail -1)"
timeout 60 build-device/bench/bench_indexer --benchmark_filter='^(copy/d2d|topk/(ours|radix_cta(32|128|256))/rows:(4096|8192|16384|32768|65536)/ld:(1024|2048|4096|8192))' --benchmark_out=$O/bench_indexer.json --benchmark_out_format=json > $O/logs/bench_indexer.txt 2>&1
echo "$(el) bench_indexer rc=$?"
timeout 60 build-device/bench/bench_layer --benchmark_filter='^(copy|cublas/|layer/step5_preview/tp:(1|8)/tokens:(8192|32768)/ctx:0/)' --benchmark_out=$O/bench_layer.json --benchmark_out_format=json > $O/logs/bench_layer.txt 2>&1
echo "$(el) bench_layer rc=$?"; grep -E "^  prefill" $O/logs/bench_layer.txt
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
