#!/usr/bin/env bash
# Twenty-eighth session, first device call (branch lt-fp32-reduction = main + gemv-mma + the
# cuBLASLt fp32-reduction mask). Here first: bash tools/device_ab.sh prepare 67441ab (main before the
# early decode loads); device carry [".deps", "build-abold"]; any H100 / H200 (ratios per binary).
#   1. builds: test_gemm, bench_gemm, bench_layer (working tree) and 67441ab's bench_layer, in parallel;
#   2. test_gemm quick: the cuBLASLt rows that failed in session 27's call 2 must pass with the mask;
#   3. bench_gemm at T = 1, 4, 8, 16, 32, 256: kAuto / cuBLASLt / kGemv (both kernels) / copy,
#      fused projections and o_proj shapes (does the mask slow kAuto's cuBLASLt plans? where does
#      the tensor-core kGemv win?);
#   4. bench_layer decode A/B against 67441ab, batch 1 and 16 (the early loads, merged in 656dc34).
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
cat build-abold/COMMIT > $O/l/commits.txt 2>/dev/null
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_layer) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_gemm bench_gemm bench_layer > $O/l/build.log 2>&1
echo "$(el) build new: $(tail -n 1 $O/l/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1
echo "$(el) test_gemm quick rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED' $O/l/test_gemm.txt | head -6 | cut -c1-220; pack
timeout 170 build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm_auto|gemm_gemv|gemm_gemv_mma)/.*(tokens:(1|4|8|16|32|256)/|d2d)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1
echo "$(el) bench_gemm rc=$?"; pack
grep -E "^(copy|cublaslt|gemm_auto|gemm_gemv|gemm_gemv_mma)" $O/l/bench_gemm.txt | awk '{print $1, $2}' | sed 's|/min_time:0.020||; s|/manual_time||' | cut -c1-90
wait $OLD; echo "$(el) build old: $(tail -n 1 $O/l/old_build.log)"
L=$(left); [ "$L" -gt 60 ] && { OUT=$O/l/ab timeout $(( L - 10 )) bash tools/device_ab.sh run bench_layer '^(copy|layer/step5_preview/.*/tokens:(1|16)/)' 2 > $O/l/ab_layer.txt 2>&1; echo "$(el) bench_layer A/B rc=$?"; grep -E "layer/|copy" $O/l/ab_layer.txt | cut -c1-120; }
echo "$(el) done"; pack; rm -rf $O/l
