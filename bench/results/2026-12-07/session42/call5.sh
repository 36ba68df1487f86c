#!/usr/bin/env bash
# Forty-second session, call 5 (device, carry [".deps"]): the eager-order effect of bench_layer
# (RESULTS, forty-second session: a row run right after the tp 1 batch-64 row reads its GEMM and
# attention stages 10-20 % slow in eager steps, while its graph replays do not). Per-step traces
# (STEP5_BENCH_LAYER_TRACE=1) of the batch-64 rows at 128K in registration order, with the
# default warm-up (one step) and with 40 more untimed steps (STEP5_BENCH_LAYER_WARMUP=40), and
# the tp 1 mixed row alone.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
. tools/device_build.sh bench_layer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:64/ctx:131072'
STEP5_BENCH_LAYER_TRACE=1 timeout 100 $L --benchmark_filter="$FL" > $O/w0.txt 2> $O/w0_trace.txt; echo "$(el) warm-up 1 rc=$?"
STEP5_BENCH_LAYER_TRACE=1 STEP5_BENCH_LAYER_WARMUP=40 timeout 100 $L --benchmark_filter="$FL" > $O/w40.txt 2> $O/w40_trace.txt; echo "$(el) warm-up 41 rc=$?"
STEP5_BENCH_LAYER_TRACE=1 timeout 60 $L --benchmark_filter='^layer/step5_preview/tp:1/tokens:64/ctx:131072/mixed' > $O/alone.txt 2> $O/alone_trace.txt; echo "$(el) alone rc=$?"
for f in w0 w40 alone; do
  echo "== $f"; grep -E "^layer/" $O/$f.txt | grep -v manual_time | cut -c1-200
  python3 - $O/${f}_trace.txt <<'PY'
import sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 6 or p[0] != "trace": continue
    d = dict(zip(p[4::2], p[5::2]))
    rows.setdefault(p[1][20:], []).append((d["layer_us"], d["fused_gemm"], d["attention"]))
for n, v in rows.items():
    print(n, "layer:", " ".join(x[0] for x in v))
    print(n, "fused:", " ".join(x[1] for x in v))
PY
done
echo "$(el) all done"
