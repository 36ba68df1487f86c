#!/usr/bin/env bash
# Thirty-second session, call 3: the one-query (decode) attention instance triggers its dependent
# launch right after its PDL wait (working tree), against 8c71bba (the weight-ring kGemv;
# build-abold). Carry [".deps", "build-abold"].
#   1. build test_attention, test_graph, bench_layer; test_attention and test_graph quick;
#   2. A/B bench_layer (2 rounds): decode batch 1, 16, 64 at 128K, tp 1 and 8.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( 585 - ($(date +%s) - T0) )); }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_attention test_graph bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE " error|spill" $O/l/build.log | head
for t in test_attention test_graph; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"; grep -E "FAIL" $O/l/$t.txt | head -5
done
pack
OUT=$O/l/abl timeout $(( $(left) )) bash tools/device_ab.sh run bench_layer '^layer/step5_preview/tp:(1|8)/tokens:(1|16|64)/ctx:131072/' 2 > $O/l/ab_layer.txt 2>&1
echo "$(el) A/B bench_layer rc=$?"; cut -c1-110 $O/l/ab_layer.txt
python3 - $O/l/abl <<'PY' 2>/dev/null
import json, glob, sys
for side in ("old", "new"):
    rows = {}
    for f in sorted(glob.glob(f"{sys.argv[1]}/ab/{side}_*.json")):
        for b in json.load(open(f)).get("benchmarks", []):
            n = b["name"].split("/iterations:")[0]
            rows.setdefault(n, []).append((b.get("graph_us", 0), b.get("layer_us", 0), b.get("attention_us", 0), b.get("o_proj_gemm_us", 0)))
    for n, v in rows.items():
        print(side, n, "graph", ["%.1f" % x[0] for x in v], "eager", ["%.1f" % x[1] for x in v], "attn", ["%.1f" % x[2] for x in v], "o_proj", ["%.1f" % x[3] for x in v])
PY
echo "$(el) done"; pack; rm -rf $O/l
