#!/usr/bin/env bash
# Twenty-fifth session, call 4: the exit cluster barrier as an execution barrier (arrive.relaxed)
# in the cluster top-k and the attention's cluster merge, against HEAD 640a431.
# Here first: bash tools/device_ab.sh prepare 640a431; device carry [".deps", "build-abold"].
#   1. builds (working tree; build-abold) in parallel; 2. test_topk quick, test_attention quick;
#   3. bench_layer decode A/B; 4. bench_indexer decode + top-k A/B; 5. memcheck of the cluster cases.
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 500 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_layer bench_indexer) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_topk test_attention bench_layer bench_indexer > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log)"
for t in test_topk test_attention; do
  STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -5; pack
done
OUT=$O/l/ab timeout 110 bash tools/device_ab.sh run bench_layer '^(copy|layer/.*/tokens:(1|16|64)/)' 2 > $O/l/ab_layer.txt 2>&1
echo "$(el) bench_layer A/B"; grep -E "layer/|copy" $O/l/ab_layer.txt; pack
[ "$(left)" -gt 50 ] && { OUT=$O/l/ab2 timeout $(( $(left) - 40 < 90 ? $(left) - 40 : 90 )) bash tools/device_ab.sh run bench_indexer '^(copy|indexer_decode/tp:(1|8)/batch:(1|16|64)/ctx:131072|topk/(0|8|radix_cluster|cand_cta)/rows:(1|16|64)/)' 2 > $O/l/ab_indexer.txt 2>&1; echo "$(el) bench_indexer A/B"; grep -vE "^/" $O/l/ab_indexer.txt | head -30; pack; }
[ "$(left)" -gt 30 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_topk "ties across cluster ranks" > $O/l/memcheck_topk.txt 2>&1; echo "$(el) memcheck topk cluster ties rc=$? $(grep -E 'ERROR SUMMARY' $O/l/memcheck_topk.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/memcheck_topk.txt | tail -n 1)"; pack; }
echo "$(el) done"; pack; rm -rf $O/l
