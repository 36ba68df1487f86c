#!/usr/bin/env bash
# Forty-second session, call 2 (device, carry [".deps"]), on the tree with exp_l2.patch applied:
# the decode score kernel's summary loads marked evict-first in the L2 (STEP5_EXP_L2=1; 0 = main),
# so that the score rows it writes stay in the L2 for the selection that reads them next (the
# summaries stream 268 MB through a 50 MB L2 at 128K batch 64). Stages, each skipped once CALL_S
# (default 560) seconds are spent: (1) test_indexer quick with the hint on, (2) A/B of
# bench_indexer's decode rows, ROUNDS rounds, (3) A/B of bench_layer's decode rows at 128K
# (equal and mixed depths, 9d07e22), the layer tables of side 0 kept for the issue tables.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - T0) )); }
. tools/device_build.sh test_indexer bench_indexer bench_layer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
STEP5_EXP_L2=1 STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/test_indexer > $O/test_indexer.txt 2>&1; rc=$?
echo "$(el) test_indexer quick, hint on: rc=$rc $(tail -1 $O/test_indexer.txt)"; grep -E "ERROR|FAIL" $O/test_indexer.txt | head -5
B=build-device/bench/bench_indexer
F='^(copy/d2d|(indexer_decode|scores_decode)/tp:(1|8)/batch:(1|16|64|128)/ctx:(32768|131072))'
for i in $(seq 1 ${ROUNDS:-3}); do
  for side in 0 1; do
    [ $(left) -gt 150 ] || { echo "skip indexer side $side round $i: time"; continue; }
    STEP5_EXP_L2=$side timeout 90 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json \
      --benchmark_out_format=json > $O/ab/idx_side${side}_$i.txt 2>&1 || echo "side $side round $i rc=$?"
  done
done
echo "$(el) indexer A/B done"; grep -E "^copy" $O/ab/idx_side0_1.txt | cut -c1-100
L=build-device/bench/bench_layer
FL='^(copy/d2d|cublas|layer/step5_preview/tp:(1|8)/tokens:(1|16|64)/ctx:131072)'
for i in $(seq 1 ${LROUNDS:-2}); do
  for side in 0 1; do
    [ $(left) -gt 60 ] || { echo "skip layer side $side round $i: time"; continue; }
    STEP5_EXP_L2=$side timeout 120 $L --benchmark_filter="$FL" --benchmark_out=$O/ab/layer_side${side}_$i.json \
      --benchmark_out_format=json > $O/ab/layer_side${side}_$i.txt 2>&1 || echo "layer side $side round $i rc=$?"
  done
done
echo "$(el) layer A/B done"
python3 - $O/ab <<'PY'
import json, statistics, sys, glob, re
d = sys.argv[1]
t = {"0": {}, "1": {}}
for f in glob.glob(d + "/side*_*.json"):
    side = f.split("/side")[1][0]
    try: js = json.load(open(f))
    except Exception: continue
    for b in js.get("benchmarks", []):
        if b.get("error_occurred"): continue
        n = b["name"].split("/iterations:")[0].replace("/manual_time", "")
        t[side].setdefault(n, []).append(b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "us")])
# layer tables: the summary row "layer/... layer_us floor x graph_us x | stages"
for f in glob.glob(d + "/layer_side*_*.txt"):
    side = f.split("layer_side")[1][0]
    for line in open(f):
        m = re.match(r"^(layer/\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\|(.*)", line)
        if m:
            t[side].setdefault(m.group(1) + " (eager)", []).append(float(m.group(2)))
            t[side].setdefault(m.group(1) + " (graph)", []).append(float(m.group(5)))
            st = m.group(7).split()
            if len(st) >= 4: t[side].setdefault(m.group(1) + " select", []).append(float(st[3].split("/")[0]))
print(f"{'median us (0 = main, 1 = summary loads evict-first)':70s} {'0':>8s} {'1':>8s} {'1/0':>6s} {'n':>3s}")
med = lambda s, n: statistics.median(t[s][n]) if n in t[s] else float("nan")
for n in sorted(set(t["0"]) | set(t["1"])):
    a, b = med("0", n), med("1", n)
    print(f"{n:70s} {a:8.1f} {b:8.1f} {b / a:6.3f} {len(t['1'].get(n, [])):3d}")
PY

sed -n '/^SPEC/,$p' $O/ab/layer_side0_1.txt
echo "$(el) all done"
