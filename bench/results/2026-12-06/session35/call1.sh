#!/usr/bin/env bash
# Thirty-fifth session, call 1 (carry [".deps"]): the thirty-fourth session's next_call.sh (its unrun
# checks: the kAuto rule commit 1e83059, the review's cases, the refactors), on the working tree,
# which also stages kGemv's X by cp.async (all of a thread's pieces in flight before one wait) in
# place of one dependent load per piece.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for c in "kAuto takes" "odd shapes" "gemv bit-identical" "K = 0" "stale ring bytes"; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm "$c" > "$O/l/test_gemm_${c// /_}.txt" 2>&1; rc=$?
  echo "$(el) test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/test_gemm_${c// /_}.txt" | tail -1)"; grep -E "FAIL" "$O/l/test_gemm_${c// /_}.txt" | head -6
done
for tc in "racecheck:K = 0" "synccheck:K = 0" "memcheck:stale ring bytes"; do
  tool=${tc%%:*} c=${tc#*:}
  STEP5_GPU_TEST_QUICK=1 timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_gemm "$c" > "$O/l/san_${tool}.txt" 2>&1; rc=$?
  echo "$(el) $tool test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$O/l/san_${tool}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}.txt" | tail -1)"
done
pack
timeout 150 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(cublaslt|gemm|gemm_auto|gemm_gemv|gemm_gemv_mma|gemm_gemv_cuda)/(o_proj/)?(step5_preview|dsa_h64_kv8_d128)/tp:(1|2|4|8)/tokens:(1|4|8|16)/)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench rc=$?"
python3 - $O/l/bench_gemm.json <<'PY'
import json, sys
js = json.load(open(sys.argv[1]))
for b in js["benchmarks"]:
    n = b["name"].split("/iterations")[0].replace("/min_time:0.020", "").replace("/manual_time", "")
    print(f"{n:64s} {b['real_time']:9.2f} {b.get('x_cublasLt', '')} {b.get('label', '')}")
PY
echo "$(el) done"; pack
