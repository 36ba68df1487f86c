#!/usr/bin/env bash
# Prepared for the next session (not run): b87d64e's 200 ms warm-up of bench_layer's eager steps on
# a GPU. bench_layer's decode rows at 128K (batch 1, 16, 64, equal and mixed depths, tp 1 and 8) in
# registration order with the per-step trace, the default warm-up against STEP5_BENCH_LAYER_WARMUP_MS=0
# (the first step only, as before b87d64e). Expect: no slow first steps in the traces with the
# default, and the tp 1 batch-16 mixed row's PDL graph at or below its no-PDL graph. Device, carry
# [".deps"], about 150 s after the machine starts.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
. tools/device_build.sh bench_layer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
L=build-device/bench/bench_layer
FL='^(copy/d2d|cublas|layer/step5_preview/tp:(1|8)/tokens:(1|16|64)/ctx:131072)'
for w in 200 0; do
  STEP5_BENCH_LAYER_WARMUP_MS=$w STEP5_BENCH_LAYER_TRACE=1 timeout 200 $L --benchmark_filter="$FL" \
    --benchmark_out=$O/layer_w$w.json --benchmark_out_format=json > $O/layer_w$w.txt 2> $O/layer_w${w}_trace.txt
  echo "$(el) warm-up $w ms rc=$?"; sed -n '/^SPEC/,$p' $O/layer_w$w.txt | cut -c1-200
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
echo "$(el) all done"
