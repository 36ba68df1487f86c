#!/usr/bin/env bash
# Thirty-fifth session (carry [".deps"], about 560 s): on the working tree,
#   1. build test_gemm, bench_gemm;
#   2. test_gemm quick: the thirty-fourth session's unrun cases ("kAuto takes", "odd shapes", "gemv
#      bit-identical", "K = 0", "stale ring bytes") — with X staged by cp.async (1281b44) and the
#      windowed tensor-core kernel (config 3) added to the odd shapes, the bit-identity, the
#      partition (two groups of window sums at N = 36000) and the +Inf stale-ring case;
#   3. compute-sanitizer: racecheck and synccheck of "K = 0", memcheck of "stale ring bytes";
#   4. bench_gemm at T = 1, 4, 8, 16 with copy: cuBLASLt, gemm_auto/, gemm_gemv/ (X whole),
#      gemm_gemv_win/ (X in windows), tp 1 and 8 fused and o_proj shapes.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for c in "kAuto takes" "odd shapes" "gemv bit-identical" "K = 0" "stale ring bytes"; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm "$c" > "$O/l/test_gemm_${c// /_}.txt" 2>&1; rc=$?
  echo "$(el) test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/test_gemm_${c// /_}.txt" | tail -1)"; grep -E "FAIL" "$O/l/test_gemm_${c// /_}.txt" | head -6
done
pack
for tc in "racecheck:K = 0" "synccheck:K = 0" "memcheck:stale ring bytes"; do
  tool=${tc%%:*} c=${tc#*:}
  STEP5_GPU_TEST_QUICK=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "$c" > "$O/l/san_${tool}.txt" 2>&1; rc=$?
  echo "$(el) $tool test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/san_${tool}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}.txt" | tail -1)"
done
pack
timeout 130 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(cublaslt|gemm_auto|gemm_gemv|gemm_gemv_win)/(o_proj/)?(step5_preview|dsa_h64_kv8_d128)/tp:(1|8)/tokens:(1|4|8|16)/)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench rc=$?"
python3 - $O/l/bench_gemm.json <<'PY'
import json, sys
js = json.load(open(sys.argv[1]))
for b in js["benchmarks"]:
    n = b["name"].split("/iterations")[0].replace("/min_time:0.020", "").replace("/manual_time", "")
    x = b.get('x_cublasLt', ''); x = f"{x:.3f}" if x != '' else ''
    print(f"{n:60s} {b['real_time']:8.2f} {x:6s} {b.get('label', '')}")
PY
echo "$(el) done"; pack
