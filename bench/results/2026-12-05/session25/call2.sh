#!/usr/bin/env bash
# Twenty-fifth session, call 2: the one-query (decode) attention instance against HEAD 05e0141.
# Here first: bash tools/device_ab.sh prepare 05e0141; device carry [".deps", "build-abold"].
#   1. builds: the working tree and build-abold (HEAD) in parallel;
#   2. test_attention quick (the new instance-equality check, the competing-plan race);
#   3. bench_attention decode A/B, 2 rounds; 4. bench_layer decode A/B, 2 rounds;
#   5. if time is left: test_topk full (0e5f15c's form), memcheck of test_attention's decode cases.
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_attention bench_layer) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_attention test_topk bench_attention bench_layer > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log); spill lines $(grep -ci spill build-device.build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 150 build-device/tests/test_attention > $O/l/test_attention.txt 2>&1
rc=$?; echo "$(el) test_attention rc=$rc $(grep -E 'passed, .* failed' $O/l/test_attention.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAIL' $O/l/test_attention.txt | head -8; pack
OUT=$O/l/ab timeout 100 bash tools/device_ab.sh run bench_attention '^(copy|attention/decode)' 2 | tee $O/l/ab_attention.txt; pack
echo "$(el) attention A/B done"
[ "$(left)" -gt 70 ] && { OUT=$O/l/ab2 timeout $(( $(left) - 60 < 120 ? $(left) - 60 : 120 )) bash tools/device_ab.sh run bench_layer '^(copy|cublas|layer/.*/tokens:(1|16|64)/)' 2 > $O/l/ab_layer.txt 2>&1; echo "$(el) bench_layer A/B"; grep -E "layer/|copy" $O/l/ab_layer.txt; pack; }
[ "$(left)" -gt 60 ] && { timeout $(( $(left) - 10 )) build-device/tests/test_topk > $O/l/test_topk_full.txt 2>&1; rc=$?; echo "$(el) test_topk full rc=$rc $(grep -E 'passed, .* failed' $O/l/test_topk_full.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/test_topk_full.txt | head -5; pack; }
echo "$(el) done"; pack; rm -rf $O/l
