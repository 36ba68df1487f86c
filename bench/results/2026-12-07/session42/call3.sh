#!/usr/bin/env bash
# Forty-second session, call 3 (device, carry [".deps"]), on the tree with exp_l2_owner.patch
# applied: a 2 x 2 A/B of the score kernel's evict-first summary loads (STEP5_EXP_L2=1) and the
# one-CTA selection's owner masks on every row count (STEP5_EXP_OWNER=1; main takes them only where
# a launch has at most one row per SM: 256 rows at tp 1 batch 64 take the ballots). Sides: 0 main,
# 1 hint, 2 owner masks, 3 both. Stages, each skipped once CALL_S (default 560) seconds are spent:
# (1) test_topk quick and test_indexer "decode batches" with the owner masks forced, (2) the A/B
# of bench_indexer's decode rows and the selection rows, ROUNDS rounds, (3) bench_layer's decode
# rows at batch 64, 128K (equal and mixed depths), LROUNDS rounds.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - T0) )); }
side_env() { case $1 in 0) echo "STEP5_EXP_L2=0 STEP5_EXP_OWNER_OFF=1";; 1) echo "STEP5_EXP_L2=1";; 2) echo "STEP5_EXP_OWNER=1";; 3) echo "STEP5_EXP_L2=1 STEP5_EXP_OWNER=1";; esac; }
. tools/device_build.sh test_topk test_indexer bench_indexer bench_layer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
STEP5_EXP_OWNER=1 STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/test_topk > $O/test_topk.txt 2>&1; rc=$?
echo "$(el) test_topk quick, owner masks forced: rc=$rc $(tail -1 $O/test_topk.txt)"; grep -E "ERROR|FAIL" $O/test_topk.txt | head -5
STEP5_EXP_OWNER=1 STEP5_EXP_L2=1 STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/test_indexer "decode batches" > $O/test_indexer.txt 2>&1; rc=$?
echo "$(el) test_indexer decode batches, both on: rc=$rc $(tail -1 $O/test_indexer.txt)"; grep -E "ERROR|FAIL" $O/test_indexer.txt | head -5
B=build-device/bench/bench_indexer
F='^(copy/d2d|indexer_decode/tp:(1|8)/batch:(1|16|64|128)/ctx:(32768|131072)|topk/(1|cand_cta)/rows:(64|128|256|512)/(i|m))'
for i in $(seq 1 ${ROUNDS:-3}); do
  for side in 0 1 2 3; do
    [ $(left) -gt 120 ] || { echo "skip indexer side $side round $i: time"; continue; }
    env $(side_env $side) timeout 90 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json \
      --benchmark_out_format=json > $O/ab/idx_side${side}_$i.txt 2>&1 || echo "side $side round $i rc=$?"
  done
done
echo "$(el) indexer A/B done"
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:64/ctx:131072'
for i in $(seq 1 ${LROUNDS:-1}); do
  for side in 0 1 2 3; do
    [ $(left) -gt 50 ] || { echo "skip layer side $side round $i: time"; continue; }
    env $(side_env $side) timeout 100 $L --benchmark_filter="$FL" > $O/ab/layer_side${side}_$i.txt 2>&1 || echo "layer side $side round $i rc=$?"
  done
done
echo "$(el) layer A/B done"
python3 - $O/ab <<'PY'
import json, statistics, sys, glob, re
d = sys.argv[1]
t = {"0": {}, "1": {}, "2": {}, "3": {}}
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
print(f"{'median us (0 main, 1 L2 hint, 2 owner masks, 3 both)':70s} {'0':>8s} {'1':>8s} {'2':>8s} {'3':>8s} {'1/0':>6s} {'2/0':>6s} {'3/0':>6s}")
med = lambda s, n: statistics.median(t[s][n]) if n in t[s] else float("nan")
for n in sorted(set(t["0"]) | set(t["1"])):
    a, b, c, e = med("0", n), med("1", n), med("2", n), med("3", n)
    print(f"{n:70s} {a:8.1f} {b:8.1f} {c:8.1f} {e:8.1f} {b / a:6.3f} {c / a:6.3f} {e / a:6.3f}")
PY

echo "$(el) all done"
