#!/usr/bin/env bash
# Prepared for the next session (not run): bench_common.hpp warm_up (STEP5_BENCH_WARMUP_MS,
# default 200 ms of untimed launches before a case's timed ones) on a GPU, in all four benches.
# (1) bench_layer's decode rows at 128K (batch 1, 16, 64, equal and mixed depths, tp 1 and 8) in
# registration order with the per-step trace, the default against STEP5_BENCH_WARMUP_MS=0 (the first
# step only, as before): expect no slow first steps with the default, and the tp 1 batch-16
# mixed row's PDL graph at or below its no-PDL graph; (2) bench_attention's decode rows at 128K,
# bench_indexer's indexer_decode rows at 128K and bench_gemm's tokens:1 rows, each with 200 and 0.
# Device, carry [".deps"], about 300 s after the machine starts.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
. tools/device_build.sh bench_layer bench_attention bench_indexer bench_gemm > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
L=build-device/bench/bench_layer
FL='^(copy/d2d|cublas|layer/step5_preview/tp:(1|8)/tokens:(1|16|64)/ctx:131072)'
for w in 200 0; do
  STEP5_BENCH_WARMUP_MS=$w STEP5_BENCH_LAYER_TRACE=1 timeout 200 $L --benchmark_filter="$FL" \
    --benchmark_out=$O/layer_w$w.json --benchmark_out_format=json > $O/layer_w$w.txt 2> $O/layer_w${w}_trace.txt
  echo "$(el) bench_layer, warm-up $w ms: rc=$?"; sed -n '/^SPEC/,$p' $O/layer_w$w.txt | cut -c1-200
  python3 - $O/layer_w${w}_trace.txt <<'PY'
import sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 6 or p[0] != "trace": continue
    rows.setdefault(p[1][20:], []).append(float(p[5]))
for n, v in rows.items():
    print(f"{n:40s} first 5 steps {' '.join(f'{x:.1f}' for x in v[:5])}  median {sorted(v)[len(v) // 2]:.1f}  max/min {max(v) / min(v):.3f}")
PY
done
for w in 200 0; do
  STEP5_BENCH_WARMUP_MS=$w timeout 120 build-device/bench/bench_attention --benchmark_filter='^(copy/d2d|attention/decode/.*/ctx:131072)' > $O/attention_w$w.txt 2>&1
  echo "$(el) bench_attention decode, warm-up $w ms: rc=$?"; grep -E "^attention/decode" $O/attention_w$w.txt | grep -v manual_time | cut -c1-120
  STEP5_BENCH_WARMUP_MS=$w timeout 90 build-device/bench/bench_indexer --benchmark_filter='^(copy/d2d|indexer_decode/tp:(1|8)/batch:(1|16|64)/ctx:131072)' > $O/indexer_w$w.txt 2>&1
  echo "$(el) bench_indexer decode, warm-up $w ms: rc=$?"; grep -E "^indexer_decode" $O/indexer_w$w.txt | grep -v manual_time | cut -c1-120
  STEP5_BENCH_WARMUP_MS=$w timeout 90 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(gemm|cublaslt)/.*/tokens:1/)' > $O/gemm_w$w.txt 2>&1
  echo "$(el) bench_gemm T = 1, warm-up $w ms: rc=$?"; grep -E "^(gemm|cublaslt)/" $O/gemm_w$w.txt | grep -v manual_time | cut -c1-120 | head -12
done
echo "$(el) all done"
