#!/usr/bin/env bash
# Twenty-sixth session, call 4: the one-query attention instance's cluster split merge by st.async
# pushes (cluster_merge_pushed) instead of a release cluster barrier and two rounds of DSMEM loads,
# against 9cfa40b. Here first: bash tools/device_ab.sh prepare 9cfa40b; device carry [".deps",
# "build-abold"].
#   1. builds (working tree; build-abold) in parallel; 2. test_topk and test_attention quick (the
#   review's follow-ups: per-instance opt-in threshold, mapa not volatile); 3. bench_attention decode
#   A/B; 4. memcheck of the forced-split decode case if time is left. (Cut to fit the session's
#   last 399 s of device time after a failed start: no bench_layer A/B, no racecheck.)
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 290 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_attention) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_attention test_topk bench_attention > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log)"; grep -i spill $O/l/build.log | head -3
for t in test_topk test_attention; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -5; pack
done
OUT=$O/l/ab timeout $(( $(left) - 40 < 90 ? $(left) - 40 : 90 )) bash tools/device_ab.sh run bench_attention '^(copy|attention/decode/step5_preview/tp:(1|8)/batch:(1|8|32)/ctx:131072)' 2 > $O/l/ab_attention.txt 2>&1
rc=$?; echo "$(el) bench_attention A/B rc=$rc"; grep -E "attention/|copy" $O/l/ab_attention.txt; pack
for tool in memcheck; do
  [ "$(left)" -gt 25 ] || break
  STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 15 < 45 ? $(left) - 15 : 45 )) compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_attention "decode: full selection topk 512, forced splits" > $O/l/${tool}_forced_splits.txt 2>&1
  echo "$(el) $tool forced splits rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/l/${tool}_forced_splits.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/${tool}_forced_splits.txt | tail -n 1)"
done
echo "$(el) done"; pack; rm -rf $O/l
