#!/usr/bin/env bash
# Thirty-fifth session, call 4 (carry [".deps"], about 130 s): kAuto's kGemv rule without the tp 4
# fused rows (4096 < N < 8192 at T = 2..8), on the working tree:
#   1. build test_gemm, bench_gemm; test_gemm quick "kAuto takes" (pins tp 1, 2, 8 taken, tp 4 not;
#      the windowed config at tp 1 / 2) and "odd shapes";
#   2. bench_gemm: cublaslt/, gemm_auto/, gemm_gemv/, gemm_gemv_win/ of the fused projection and
#      o_proj at tp 2 and 4, T = 4 and 8 (dsa_h64_kv8_d128's K 4096 o_proj at tp 2 is taken at
#      T = 2..8: never measured).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_gemm bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for c in "kAuto takes" "odd shapes"; do
  f="$O/l/t_${c//[ =]/_}.txt"
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm "$c" > "$f" 2>&1; rc=$?
  echo "$(el) test_gemm [$c] rc=$rc $(grep -E 'passed, .* failed' "$f" | tail -1)"; grep -E "FAIL" "$f" | head -6
done
pack
timeout 100 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(cublaslt|gemm_auto|gemm_gemv|gemm_gemv_win)/(o_proj/)?(step5_preview|dsa_h64_kv8_d128)/tp:(2|4)/tokens:(4|8)/)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench rc=$?"
python3 - $O/l/bench_gemm.json <<'PY'
import json, sys
js = json.load(open(sys.argv[1]))
for b in js["benchmarks"]:
    n = b["name"].split("/iterations")[0].replace("/min_time:0.020", "").replace("/manual_time", "")
    x = b.get('x_cublasLt', ''); x = f"{x:.3f}" if x != '' else ''
    print(f"{n:56s} {b['real_time']:8.2f} {x:6s} {b.get('label', '')}")
PY
echo "$(el) done"; pack
