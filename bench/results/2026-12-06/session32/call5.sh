#!/usr/bin/env bash
# Thirty-second session, call 5: main (de2b10c) + an uncommitted experiment knob
# STEP5_GEMV_RING_STAGES (caps the weight ring's stages; gemm_launch.cuh) — does a smaller ring
# (less dynamic shared memory per CTA) change the batch-1 layer, eager and graph? Carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_layer bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for r in 1 2; do for st in 8 4 2; do
  STEP5_GEMV_RING_STAGES=$st timeout 40 build-device/bench/bench_layer --benchmark_filter='^layer/step5_preview/tp:8/tokens:1/ctx:(32768|131072)/' --benchmark_out=$O/l/layer_s${st}_r$r.json --benchmark_out_format=json > /dev/null 2>&1
  echo "$(el) layer stages $st round $r rc=$?"
done; done
pack
for st in 8 4 2; do
  STEP5_GEMV_RING_STAGES=$st timeout 30 build-device/bench/bench_gemm --benchmark_filter='^(gemm_gemv|cublaslt)/(o_proj/)?step5_preview/tp:(1|8)/tokens:1/' --benchmark_out=$O/l/gemm_s$st.json --benchmark_out_format=json > /dev/null 2>&1
  echo "$(el) gemm stages $st rc=$?"
done
python3 - $O/l <<'PY'
import json, glob, sys, statistics
d = sys.argv[1]
for st in (8, 4, 2):
    rows = {}
    for f in sorted(glob.glob(f"{d}/layer_s{st}_r*.json")):
        for b in json.load(open(f)).get("benchmarks", []):
            rows.setdefault(b["name"].split("/iterations:")[0], []).append(b)
    for n, v in rows.items():
        m = lambda k: statistics.median([x.get(k, 0) for x in v])
        print(f"stages {st} {n[:42]} graph {m('graph_us'):.1f} eager {m('layer_us'):.1f} fused {m('fused_gemm_us'):.1f} prepare {m('prepare_us'):.1f} select {m('select_us'):.1f} attn {m('attention_us'):.1f} o_proj {m('o_proj_gemm_us'):.1f}")
    try:
        for b in json.load(open(f"{d}/gemm_s{st}.json")).get("benchmarks", []):
            print(f"stages {st} {b['name'].split('/min_time')[0]:45s} {b['real_time']:.2f}")
    except Exception as e:
        print(e)
PY
echo "$(el) done"; pack
