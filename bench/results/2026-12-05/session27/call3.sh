set -u; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }; pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt; git rev-parse HEAD > $O/l/commit.txt
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1; echo "$(el) build: $(tail -n 1 $O/l/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1; echo "$(el) test_gemm quick rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED' $O/l/test_gemm.txt | head -6 | cut -c1-220; pack
timeout 200 build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm_auto|gemm_gemv|gemm_gemv_mma)/.*(tokens:(1|4|8|16|32|256)/|d2d)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench_gemm rc=$?"; pack
grep -E "^(cublaslt|gemm_auto|gemm_gemv|gemm_gemv_mma)/" $O/l/bench_gemm.txt | awk '{print $1, $2}' | sed 's|/min_time:0.020/manual_time||' | cut -c1-90
echo "$(el) done"; pack
