#!/usr/bin/env bash
# Prepared for the next session (not run): the thirty-third session's last commits ran on no GPU
# (device time spent). Carry [".deps", "build-abold"] with build-abold = 584289b
# (`bash tools/device_ab.sh prepare 584289b`), about 500 s:
#   1. build test_topk, test_gemm; test_topk quick (the new "ld 40000" case: staged rows past the
#      owner masks' 16384 keys, the ballot path inside the owner-mask instance);
#   2. compute-sanitizer memcheck, racecheck and synccheck of that case and of "decode-shaped rows"
#      (the final gate: masks at most one row per SM); racecheck of test_gemm "odd shapes" (the
#      thirty-second session's kernel, never racechecked on those shapes; give it 200 s);
#   3. bench_layer A/B against 584289b, decode at 128K tp 1 batch 16 / 64 and tp 8 batch 64 (the
#      layers whose selection runs one CTA per row), 2 rounds.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l ab 2>/dev/null; }
. tools/device_build.sh test_topk test_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/test_topk > $O/l/test_topk.txt 2>&1; rc=$?
echo "$(el) test_topk quick rc=$rc $(grep -E 'passed, .* failed' $O/l/test_topk.txt | tail -1)"; grep -E "FAIL" $O/l/test_topk.txt | head -8
for c in "ld 40000" "decode-shaped rows"; do for tool in memcheck racecheck synccheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_topk "$c" > "$O/l/san_${tool}_${c// /_}.txt" 2>&1; rc=$?
  echo "$(el) $tool test_topk [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/san_${tool}_${c// /_}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}_${c// /_}.txt" | tail -1)"
done; done
STEP5_GPU_TEST_QUICK=1 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_gemm "odd shapes" > $O/l/san_racecheck_odd.txt 2>&1; rc=$?
echo "$(el) racecheck test_gemm [odd shapes] rc=$rc $(grep -E 'passed, .* failed' $O/l/san_racecheck_odd.txt | tail -1) $(grep -E 'RACECHECK SUMMARY' $O/l/san_racecheck_odd.txt | tail -1)"
pack
OUT=$O timeout 280 bash tools/device_ab.sh run bench_layer 'layer/step5_preview/(tp:1/tokens:(16|64)|tp:8/tokens:64)/ctx:131072/' 2 2>&1 | tail -12
echo "$(el) done"; pack
