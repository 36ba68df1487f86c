#!/usr/bin/env bash
# Session 33, call 5 (carry [".deps", "build-abold"]; build-abold = main before the owner masks):
# the owner masks only where a launch has at most one row per SM (topk_owner_masks_pay: call 4
# measured 256 rows slower). test_topk quick, then bench_indexer A/B, 2 rounds.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l ab 2>/dev/null; }
. tools/device_build.sh test_topk > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/test_topk > $O/l/test_topk.txt 2>&1; rc=$?
echo "$(el) test_topk quick rc=$rc $(grep -E 'passed, .* failed' $O/l/test_topk.txt | tail -1)"; grep -E "FAIL" $O/l/test_topk.txt | head -8
pack
OUT=$O timeout 300 bash tools/device_ab.sh run bench_indexer '^(copy|topk/cand_cta/rows:(1|64|512)/|indexer_decode/tp:(1|8)/batch:(16|64)/ctx:131072)' 2 2>&1 | tail -20
echo "$(el) done"; pack
