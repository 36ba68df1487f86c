#!/usr/bin/env bash
# Thirty-first session, call 5: the radix select's first pass counted in the staging sweep
# (working tree) against ddaa409 (build-abold). Carry [".deps", "build-abold"].
#   1. build every target; test_topk quick (every variant against the reference), test_indexer and
#      test_layer quick; memcheck + racecheck of test_topk's prefill-shaped and decode-rows cases;
#   2. A/B bench_indexer (3 rounds): prefill-shaped top-k rows, indexer_prefill, the cluster top-k
#      and indexer_decode at 128K;
#   3. A/B bench_layer (2 rounds, as the time allows): prefill rows, decode batch 1 at 128K.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( 585 - ($(date +%s) - T0) )); }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for t in test_topk test_indexer test_layer; do
  STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"; grep -E "FAIL" $O/l/$t.txt | head -5
done
for c in "prefill-shaped" "decode-shaped"; do for tool in memcheck racecheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_topk "$c" > "$O/l/san_${tool}_${c// /_}.txt" 2>&1
  echo "$(el) $tool test_topk [$c] rc=$? $(grep -E 'passed, .* failed' "$O/l/san_${tool}_${c// /_}.txt" | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/l/san_${tool}_${c// /_}.txt" | tail -1)"
done; done
pack
OUT=$O/l/abi timeout $(( $(left) - 100 )) bash tools/device_ab.sh run bench_indexer '^(copy|topk/(ours|radix_cta128|radix_cta256)/rows:(65536|16384|4096)/ld:|topk/(0|8)/rows:(16|64)/|topk/radix_cluster/rows:1/|indexer_prefill/|indexer_decode/step5_preview/tp:(1|8)/batch:(1|16|64)/ctx:131072)' 3 > $O/l/ab_indexer.txt 2>&1
echo "$(el) A/B bench_indexer rc=$?"; cut -c1-110 $O/l/ab_indexer.txt; pack
OUT=$O/l/abl timeout $(( $(left) )) bash tools/device_ab.sh run bench_layer '^layer/step5_preview/tp:(1|8)/tokens:(1/ctx:131072|8192/ctx:0|32768/ctx:0)/' 2 > $O/l/ab_layer.txt 2>&1
echo "$(el) A/B bench_layer rc=$?"; cut -c1-110 $O/l/ab_layer.txt
python3 - $O/l/abl <<'PY' 2>/dev/null
import json, glob, sys
for side in ("old", "new"):
    rows = {}
    for f in sorted(glob.glob(f"{sys.argv[1]}/ab/{side}_*.json")):
        for b in json.load(open(f)).get("benchmarks", []):
            n = b["name"].split("/iterations:")[0]
            rows.setdefault(n, []).append((b.get("select_us", 0), b.get("select_x_floor", 0), b.get("graph_us", 0)))
    for n, v in rows.items():
        print(side, n, "select_us", ["%.1f" % x[0] for x in v], "select_x_floor", ["%.2f" % x[1] for x in v], "graph_us", ["%.1f" % x[2] for x in v])
PY
echo "$(el) done"; pack; rm -rf $O/l
