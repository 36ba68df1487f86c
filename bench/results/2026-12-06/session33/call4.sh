#!/usr/bin/env bash
# Session 33, call 4 (carry [".deps", "build-abold"]; build-abold = main before the owner masks):
#   1. build test_topk, test_gemm (the owner-mask top-k; kAuto's gemv rule at 4 MiB / K >= 512);
#   2. test_topk quick; test_gemm quick: the kAuto case and the gemv cases;
#   3. compute-sanitizer memcheck + racecheck of test_topk's decode-shaped rows and candidate-cap cases;
#   4. bench_indexer A/B (old = build-abold, new = this tree), 3 rounds: the top-k rows of 1, 16, 64
#      decode rows and indexer_decode at 128K.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l ab 2>/dev/null; }
. tools/device_build.sh test_topk test_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 150 build-device/tests/test_topk > $O/l/test_topk.txt 2>&1; rc=$?
echo "$(el) test_topk quick rc=$rc $(grep -E 'passed, .* failed' $O/l/test_topk.txt | tail -1)"; grep -E "FAIL" $O/l/test_topk.txt | head -8
STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/test_gemm "kAuto takes" "gemv" > $O/l/test_gemm.txt 2>&1; rc=$?
echo "$(el) test_gemm quick (kAuto, gemv) rc=$rc $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -1)"; grep -E "FAIL" $O/l/test_gemm.txt | head -8
for c in "decode-shaped rows" "candidate compaction bit-identical"; do for tool in memcheck racecheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_topk "$c" > "$O/l/san_${tool}_${c// /_}.txt" 2>&1; rc=$?
  echo "$(el) $tool test_topk [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/san_${tool}_${c// /_}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}_${c// /_}.txt" | tail -1)"
done; done
pack
OUT=$O timeout 330 bash tools/device_ab.sh run bench_indexer '^(copy|topk/(0|1|cand_cta)/rows:(1|16|64)/|indexer_decode/tp:(1|8)/batch:(1|16|64)/ctx:131072)' 3 2>&1 | tail -30
echo "$(el) done"; pack
