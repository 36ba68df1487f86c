#!/usr/bin/env bash
# Thirty-first session, call 4: A/B of the register top-k kernel (working tree) against ddaa409
# (build-abold, prepared with `bash tools/device_ab.sh prepare ddaa409`). Carry [".deps", "build-abold"].
#   1. bench_indexer, 3 rounds: the prefill-shaped top-k rows (the launcher's choice and the radix
#      select forced on 128 / 256 threads) and indexer_prefill (scores + selection);
#   2. bench_layer, 2 rounds: the four prefill rows (issue 15's select_x_floor).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
OUT=$O/l/abi timeout 330 bash tools/device_ab.sh run bench_indexer '^(copy|topk/(ours|radix_cta128|radix_cta256)/rows:(65536|16384|4096)/ld:|indexer_prefill/)' 3 > $O/l/ab_indexer.txt 2>&1
echo "$(el) A/B bench_indexer rc=$?"; cut -c1-110 $O/l/ab_indexer.txt; pack
OUT=$O/l/abl timeout $(( 590 - ($(date +%s) - T0) )) bash tools/device_ab.sh run bench_layer '^layer/step5_preview/tp:(1|8)/tokens:(8192|32768)/ctx:0/' 2 > $O/l/ab_layer.txt 2>&1
echo "$(el) A/B bench_layer rc=$?"; cut -c1-110 $O/l/ab_layer.txt
python3 - $O/l/abl <<'PY' 2>/dev/null
import json, glob, sys, statistics
for side in ("old", "new"):
    rows = {}
    for f in sorted(glob.glob(f"{sys.argv[1]}/ab/{side}_*.json")):
        for b in json.load(open(f)).get("benchmarks", []):
            n = b["name"].split("/iterations:")[0]
            rows.setdefault(n, []).append((b.get("select_us", 0), b.get("select_x_floor", 0), b.get("x_floor", 0)))
    for n, v in rows.items():
        print(side, n, "select_us", ["%.0f" % x[0] for x in v], "select_x_floor", ["%.2f" % x[1] for x in v], "x_floor", ["%.2f" % x[2] for x in v])
PY
echo "$(el) done"; pack; rm -rf $O/l
