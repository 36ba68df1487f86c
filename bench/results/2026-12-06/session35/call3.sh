#!/usr/bin/env bash
# Thirty-fifth session, call 3 (carry [".deps"], about 330 s): kAuto's kGemv with X in windows
# (gemm_auto_gemv_config; T = 9..16 on >= 128 MiB) and the K = 0 case's even ldc, on the working tree:
#   1. build test_gemm, bench_gemm; test_gemm quick "kAuto takes", "K = 0", "odd shapes", "gemv bit-identical";
#   2. racecheck and synccheck of "K = 0" (the windowed partitions: two groups of window sums);
#   3. bench_gemm: cublaslt/, gemm_auto/, gemm_gemv/, gemm_gemv_win/ at T = 4, 8, 16, tp 1, 2, 4, 8 (fused);
#   4. warp stall samples of the windowed kernel at tp 8, T = 16 (where it loses) and tp 1, T = 16.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for c in "kAuto takes" "K = 0" "odd shapes" "gemv bit-identical"; do
  f="$O/l/t_${c//[ =]/_}.txt"
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm "$c" > "$f" 2>&1; rc=$?
  echo "$(el) test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$f" | tail -1)"; grep -E "FAIL" "$f" | head -6
done
pack
for tool in racecheck synccheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "K = 0" > "$O/l/san_${tool}.txt" 2>&1; rc=$?
  echo "$(el) $tool test_gemm [K = 0] rc=$rc $(grep -E 'passed, .* failed' "$O/l/san_${tool}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}.txt" | tail -1)"
done
pack
timeout 100 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(cublaslt|gemm_auto|gemm_gemv|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:(1|2|4|8)/tokens:(4|8|16)/)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench rc=$?"
python3 - $O/l/bench_gemm.json <<'PY'
import json, sys
js = json.load(open(sys.argv[1]))
for b in js["benchmarks"]:
    n = b["name"].split("/iterations")[0].replace("/min_time:0.020", "").replace("/manual_time", "")
    x = b.get('x_cublasLt', ''); x = f"{x:.3f}" if x != '' else ''
    print(f"{n:56s} {b['real_time']:8.2f} {x:6s} {b.get('label', '')}")
PY
pack
for f in 'gemm_gemv_win/step5_preview/tp:8/tokens:16/' 'gemm_gemv_win/step5_preview/tp:1/tokens:16/'; do
  echo "== stalls $f"; OUT=$O/l timeout 90 bash tools/ncu_sass.sh bench_gemm "$f" gemm_gemv_mma 3 1 6 2>&1 | head -40
done
echo "$(el) done"; pack
