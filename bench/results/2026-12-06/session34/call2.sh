#!/usr/bin/env bash
# Session 34, call 2 (carry [".deps"]; trimmed to the device time left): the tensor-core kGemv
# kernel on the weight ring (gemm_gemv_mma_kernel<NT>: 16-row stages, ldmatrix, mma.sync m16n8k16,
# warps by k16 steps). test_gemm's gemv cases (quick), memcheck and racecheck of the partition
# case, then bench_gemm once at T = 1, 4, 8, 16 (tp 1 and 8; cuBLASLt in the same binary).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for c in "odd shapes" "gemv bit-identical" "K = 0"; do
  STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/test_gemm "$c" > "$O/l/test_gemm_${c// /_}.txt" 2>&1; rc=$?
  echo "$(el) test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/test_gemm_${c// /_}.txt" | tail -1)"; grep -E "FAIL" "$O/l/test_gemm_${c// /_}.txt" | head -6
done
for tool in memcheck racecheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "K = 0" > "$O/l/san_${tool}.txt" 2>&1; rc=$?
  echo "$(el) $tool test_gemm [K = 0] rc=$rc $(grep -E 'passed, .* failed' "$O/l/san_${tool}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}.txt" | tail -1)"
done
pack
timeout 120 build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm_auto|gemm_gemv|gemm_gemv_mma)/(o_proj/)?(step5_preview|dsa_h64_kv8_d128)/tp:(1|8)/tokens:(1|4|8|16)/' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench rc=$?"
python3 - $O/l/bench_gemm.json <<'PY'
import json, sys
js = json.load(open(sys.argv[1]))
for b in js["benchmarks"]:
    n = b["name"].split("/iterations")[0].replace("/min_time:0.020", "").replace("/manual_time", "")
    print(f"{n:64s} {b['real_time']:9.2f} {b.get('x_cublasLt', '')}")
PY
echo "$(el) done"; pack
