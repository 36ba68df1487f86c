#!/usr/bin/env bash
# The twenty-seventh session's second GPU call (written then, not run): after next_call.sh, on
# branch session27-exp, the decode chain's early loads (attention, scores, top-k, prepare: one
# round trip less each) measured where they add up, against main. Here first: git checkout
# session27-exp && bash tools/device_ab.sh prepare main; device carry [".deps", "build-abold"];
# about 540 s.
#   1. builds: bench_layer, bench_indexer (working tree and build-abold), in parallel;
#   2. bench_indexer decode A/B (scores + top-k, batch 1 / 16 / 64 at 128K, tp 1 / 8);
#   3. bench_layer decode A/B (batch 1 and 16 at 32K / 128K, tp 1 / 8: eager and graph);
#   4. racecheck of test_attention's forced-split decode case (the twenty-sixth session's pushed
#      merge, never raced), if time is left.
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 540 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
{ git rev-parse HEAD; cat build-abold/COMMIT; } > $O/l/commits.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_indexer bench_layer) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh bench_indexer bench_layer test_attention > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log)"
OUT=$O/l/ab2 timeout 100 bash tools/device_ab.sh run bench_indexer '^(copy|indexer_decode/tp:(1|8)/batch:(1|16|64)/ctx:131072)' 2 > $O/l/ab_indexer.txt 2>&1
rc=$?; echo "$(el) bench_indexer A/B rc=$rc"; grep -vE "^/" $O/l/ab_indexer.txt | head -30; pack
OUT=$O/l/ab timeout $(( $(left) - 60 < 220 ? $(left) - 60 : 220 )) bash tools/device_ab.sh run bench_layer '^(copy|layer/.*/tokens:(1|16)/)' 2 > $O/l/ab_layer.txt 2>&1
rc=$?; echo "$(el) bench_layer A/B rc=$rc"; grep -E "layer/|copy" $O/l/ab_layer.txt; pack
[ "$(left)" -gt 30 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_attention "decode: full selection topk 512, forced splits" > $O/l/racecheck_attention.txt 2>&1; echo "$(el) racecheck attention forced splits rc=$? $(grep -E 'RACECHECK SUMMARY' $O/l/racecheck_attention.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/racecheck_attention.txt | tail -n 1)"; pack; }
echo "$(el) done"; pack; rm -rf $O/l
