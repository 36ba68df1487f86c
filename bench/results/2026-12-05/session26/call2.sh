#!/usr/bin/env bash
# Twenty-sixth session, call 2 (call 1 found no machine): the cluster top-k's histograms and
# compaction totals exchanged by st.async pushes (TopkExchange) instead of release cluster barriers
# and DSMEM loads, against 84541f0; and the twenty-fifth session's unrun review fixes.
# Here first: bash tools/device_ab.sh prepare 84541f0; device carry [".deps", "build-abold"].
#   1. builds (working tree; build-abold) in parallel; 2. test_topk quick (the pushes), test_attention
#   quick (ce7349a / 3a874f5 / 8fc3bc8, not yet run); 3. bench_indexer top-k + decode A/B;
#   4. bench_attention decode + prefill (H200: issue 14's decode >= 0.85 of copy, issue 15's
#   synthetic >= 400 TFLOP/s); 5. bench_layer decode batch 1 A/B; 6. memcheck of the cluster ties.
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 545 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_indexer bench_layer) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_topk test_attention bench_indexer bench_layer bench_attention > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log)"
for t in test_topk test_attention; do
  STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -5; pack
done
OUT=$O/l/ab2 timeout 100 bash tools/device_ab.sh run bench_indexer '^(copy|indexer_decode/tp:(1|8)/batch:(1|16|64)/ctx:131072|topk/(0|8|radix_cluster|cand_cta)/rows:(1|16|64)/)' 2 > $O/l/ab_indexer.txt 2>&1
rc=$?; echo "$(el) bench_indexer A/B rc=$rc"; grep -vE "^/" $O/l/ab_indexer.txt | head -40; pack
[ "$(left)" -gt 100 ] && { timeout 90 build-device/bench/bench_attention --benchmark_filter='^(copy|attention/)' --benchmark_out=$O/l/bench_attention.json --benchmark_out_format=json > $O/l/bench_attention.txt 2>&1; rc=$?; echo "$(el) bench_attention rc=$rc"; grep -A45 "^copy bandwidth" $O/l/bench_attention.txt | cut -c1-150; pack; }
[ "$(left)" -gt 60 ] && { OUT=$O/l/ab timeout $(( $(left) - 30 < 100 ? $(left) - 30 : 100 )) bash tools/device_ab.sh run bench_layer '^(copy|layer/.*/tokens:(1|16)/)' 2 > $O/l/ab_layer.txt 2>&1; rc=$?; echo "$(el) bench_layer A/B rc=$rc"; grep -E "layer/|copy" $O/l/ab_layer.txt; pack; }
[ "$(left)" -gt 25 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 5 )) compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_topk "ties across cluster ranks" > $O/l/memcheck_topk.txt 2>&1; echo "$(el) memcheck topk cluster ties rc=$? $(grep -E 'ERROR SUMMARY' $O/l/memcheck_topk.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/memcheck_topk.txt | tail -n 1)"; pack; }
echo "$(el) done"; pack; rm -rf $O/l
