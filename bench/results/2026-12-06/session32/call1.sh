#!/usr/bin/env bash
# Thirty-second session, call 1: the CUDA-core kGemv kernel on a TMA weight ring (working tree)
# against 9fcab58 (build-abold). Carry [".deps", "build-abold"].
#   1. build test_gemm, test_graph, test_layer, bench_gemm; test_gemm full, test_layer and
#      test_graph quick; memcheck + racecheck + synccheck of test_gemm's gemv cases (quick);
#   2. A/B bench_gemm (3 rounds): T = 1 and 4, the forced kGemv rows, kAuto and cuBLASLt, fused and
#      o_proj shapes, and the copy ceiling.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( 585 - ($(date +%s) - T0) )); }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_gemm test_graph test_layer bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE " error|spill" $O/l/build.log | head
timeout 150 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1
echo "$(el) test_gemm full rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -1)"; grep -E "FAIL" $O/l/test_gemm.txt | head -8
for t in test_layer test_graph; do
  STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"; grep -E "FAIL" $O/l/$t.txt | head -5
done
for c in "gemv bit-identical" "odd shapes"; do for tool in memcheck racecheck synccheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "$c" > "$O/l/san_${tool}_${c// /_}.txt" 2>&1
  echo "$(el) $tool test_gemm [$c] rc=$? $(grep -E 'passed, .* failed' "$O/l/san_${tool}_${c// /_}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}_${c// /_}.txt" | tail -1)"
done; done
pack
OUT=$O/l/abg timeout $(( $(left) - 5 )) bash tools/device_ab.sh run bench_gemm '^(copy|((gemm_gemv|gemm_gemv_mma|gemm_auto|cublaslt)/(o_proj/)?[a-z0-9_]+/tp:(1|8)/tokens:(1|4)/))' 3 > $O/l/ab_gemm.txt 2>&1
echo "$(el) A/B bench_gemm rc=$?"; cut -c1-110 $O/l/ab_gemm.txt
echo "$(el) done"; pack; rm -rf $O/l
