#!/usr/bin/env bash
# Forty-first session, call 1 (device, carry [".deps"]), on the tree with exp_call1.patch applied:
# the decode score plan's region-chunk cap (kScoreDecodeMaxRegionsPerCta = 256; the patch's
# STEP5_EXP_OLD_RPC=1 restores the fill rule alone) and an experiment that splits a decode
# selection of more rows than SMs into launches of <= SMs rows on the owner-mask path
# (STEP5_EXP_TOPK_SPLIT=1). Stages, each skipped once CALL_S (default 570) seconds are spent:
# (1) test_indexer quick (the cap on), (2) test_indexer's decode-batch case with the split on,
# (3) A/B/C of bench_indexer's decode rows (0 = fill rule, 1 = cap, 2 = cap + split), ROUNDS
# rounds, (4) the same sides of bench_layer's decode rows, (5) memcheck of the decode-batch case
# with the split on.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-570} - ($(date +%s) - T0) )); }
side_env() { case $1 in 0) echo "STEP5_EXP_OLD_RPC=1";; 1) echo "STEP5_EXP_OLD_RPC=0";; 2) echo "STEP5_EXP_TOPK_SPLIT=1";; esac; }
. tools/device_build.sh test_indexer bench_indexer bench_layer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
t=$(( $(left) - 300 )); [ $t -gt 60 ] || t=60
STEP5_GPU_TEST_QUICK=1 timeout $t build-device/tests/test_indexer > $O/test_indexer.txt 2>&1; rc=$?
echo "$(el) test_indexer rc=$rc $(tail -1 $O/test_indexer.txt)"; grep -E "ERROR|FAIL|regions per CTA" $O/test_indexer.txt | grep -v "^  .*regions per CTA, [0-9]* region chunks" | head -8
STEP5_EXP_TOPK_SPLIT=1 STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_indexer "decode batches" > $O/test_split.txt 2>&1; rc=$?
echo "$(el) test_indexer decode batches, split on: rc=$rc $(tail -1 $O/test_split.txt)"; grep -E "ERROR|FAIL" $O/test_split.txt | head -5
B=build-device/bench/bench_indexer
F='^(indexer_decode|scores_decode)/tp:(1|8)/batch:(1|16|64|128)/ctx:(32768|131072)'
for i in $(seq 1 ${ROUNDS:-2}); do
  for side in 0 1 2; do
    [ $(left) -gt 120 ] || { echo "skip indexer side $side round $i: time"; continue; }
    env $(side_env $side) timeout 90 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json \
      --benchmark_out_format=json > /dev/null 2>&1 || echo "side $side round $i rc=$?"
  done
done
echo "$(el) indexer A/B done"
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:(1|64)/ctx:131072'
for i in $(seq 1 ${ROUNDS:-2}); do
  for side in 0 1 2; do
    [ $(left) -gt 60 ] || { echo "skip layer side $side round $i: time"; continue; }
    env $(side_env $side) timeout 60 $L --benchmark_filter="$FL" > $O/ab/layer_side${side}_$i.txt 2>&1 || echo "layer side $side round $i rc=$?"
  done
done
echo "$(el) layer A/B done"
python3 - $O/ab <<'PY'
import json, statistics, sys, glob, re
d = sys.argv[1]
t = {"0": {}, "1": {}, "2": {}}
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
print(f"{'median us (0 = fill rule, 1 = cap 256, 2 = cap + split)':70s} {'0':>8s} {'1':>8s} {'2':>8s} {'1/0':>6s} {'2/0':>6s}")
med = lambda s, n: statistics.median(t[s][n]) if n in t[s] else float("nan")
for n in sorted(set(t["0"]) | set(t["1"])):
    a, b, c = med("0", n), med("1", n), med("2", n)
    print(f"{n:70s} {a:8.1f} {b:8.1f} {c:8.1f} {b / a:6.3f} {c / a:6.3f}")
PY
if [ $(left) -gt 45 ]; then
  STEP5_EXP_TOPK_SPLIT=1 STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 \
    build-device/tests/test_indexer "decode batches" > $O/memcheck.txt 2>&1; rc=$?
  echo "$(el) memcheck decode batches (split on) rc=$rc $(grep -E 'ERROR SUMMARY' $O/memcheck.txt | tail -1)"
fi
echo "$(el) all done"
