#!/usr/bin/env bash
# Prepared for the next session (not run). The thirty-fifth session ran test_gemm's gemv cases,
# racecheck / synccheck of "K = 0" and bench_gemm on an H100, but not:
#   - the GPU tests of the layer (kAuto's GEMM changed at T = 2..16: X in windows at tp 1 / 2, T = 9..16
#     now kGemv at tp 1, tp 4 back to cuBLASLt), test_gemm in full mode, memcheck / racecheck of
#     "odd shapes" and "gemv bit-identical" (config 3 in them);
#   - test_gemm's "kAuto's kGemv runs its plan's kernel" (written after the last call: kAuto's bits
#     equal its planned config's, forced; X whole and in windows differ; kAuto at T = 2, 3, 6, 7 back
#     to X whole) and the kAuto case with dsa's tp 2 o_proj pinned;
#   - the closing refactor (after the last call): the CUDA-core kernel's consumer on ring_walk (the one
#     unit order) and both kernels' X staging through stage_x_rows — test_gemm full covers them;
#     bench_gemm's gemm_gemv/ rows at T = 1 / 4 / 8 / 16 must read as in call 2-3 (ratios to cuBLASLt);
#   - bench_layer at decode batch 16 (T = 16: the tp 1 fused projection now on kGemv in windows,
#     54.0 against cuBLASLt's 58.7 µs in bench_gemm) against d4fca7b.
# Here first: `bash tools/device_ab.sh prepare d4fca7b`; then carry [".deps", "build-abold"], about 560 s:
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm test_layer test_graph bench_layer bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for t in test_layer test_graph; do
  timeout 150 build-device/tests/$t > $O/l/$t.txt 2>&1; echo "$(el) $t rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"
done
STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/test_gemm "kAuto" > $O/l/test_gemm_kauto.txt 2>&1; echo "$(el) test_gemm kAuto rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm_kauto.txt | tail -1)"
timeout 150 build-device/tests/test_gemm > $O/l/test_gemm_full.txt 2>&1; echo "$(el) test_gemm full rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm_full.txt | tail -1)"
for tc in "memcheck:gemv bit-identical" "racecheck:stale ring bytes"; do
  tool=${tc%%:*} c=${tc#*:}
  STEP5_GPU_TEST_QUICK=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "$c" > "$O/l/san_${tool}.txt" 2>&1
  echo "$(el) $tool [$c] rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}.txt" | tail -1)"
done
pack
timeout 90 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(cublaslt|gemm_auto|gemm_gemv|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:(1|8)/tokens:(1|4|8|16)/)' > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench_gemm rc=$?"; grep -E "^(cublaslt|gemm_auto|gemm_gemv)" $O/l/bench_gemm.txt | awk '{print $1, $2, $NF}' | head -60
OUT=$O bash tools/device_ab.sh run bench_layer 'layer/(step5_preview|dsa_h64_kv8_d128)/tp:1/tokens:16/ctx:131072' 2 2>&1 | tail -12
echo "$(el) done"; pack
