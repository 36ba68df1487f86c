#!/usr/bin/env bash
# Forty-third session, call 1 (not run: no machine came; call2.sh supersedes it) (device, carry [".deps"]), on the tree with exp_evict_last.patch
# applied. Does a step's score row stay in L2 for its selection when the score kernel stores it
# with an evict-last L2 policy? Sides (environment of one binary):
#   A  main                                   STEP5_EXP_L2=0
#   B  evict-last score stores                STEP5_EXP_L2=2
#   C  B + the selection's loads evict-first  STEP5_EXP_L2=6
#   D  B with a persisting L2 set-aside       STEP5_EXP_L2=2 STEP5_EXP_PERSIST_MB=40 (clamped to the device max)
#   E  C with the set-aside                   STEP5_EXP_L2=6 STEP5_EXP_PERSIST_MB=40
# Stages, each skipped once CALL_S (default 560) seconds are spent: (1) build (also bench_attention and
# bench_gemm, for call 2 on the same machine); (2) test_indexer "decode batches" on side E; (3) the
# A/B of indexer_decode at 128K, ROUNDS rounds; (4) bench_layer batch 16 / 64 at 128K, sides A B D.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - T0) )); }
side_env() { case $1 in A) echo "STEP5_EXP_L2=0";; B) echo "STEP5_EXP_L2=2";; C) echo "STEP5_EXP_L2=6";;
  D) echo "STEP5_EXP_L2=2 STEP5_EXP_PERSIST_MB=40";; E) echo "STEP5_EXP_L2=6 STEP5_EXP_PERSIST_MB=40";; esac; }
. tools/device_build.sh test_indexer bench_indexer bench_layer bench_attention bench_gemm > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"; grep -c spill $O/build.log
env $(side_env E) STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/test_indexer "decode batches" > $O/test_indexer.txt 2>&1; rc=$?
echo "$(el) test_indexer decode batches, side E: rc=$rc $(tail -1 $O/test_indexer.txt)"; grep -E "ERROR|FAIL|EXPERIMENT" $O/test_indexer.txt | head -5
B=build-device/bench/bench_indexer
F='^(copy/d2d|indexer_decode/tp:(1|8)/batch:(16|64)/ctx:131072)'
for i in $(seq 1 ${ROUNDS:-3}); do
  for side in A B C D E; do
    [ $(left) -gt 150 ] || { echo "skip indexer side $side round $i: time"; continue; }
    env $(side_env $side) timeout 90 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json \
      --benchmark_out_format=json > $O/ab/idx_side${side}_$i.txt 2>&1 || echo "side $side round $i rc=$?"
  done
  echo "$(el) indexer round $i done"
done
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:(16|64)/ctx:131072'
for side in A B D; do
  [ $(left) -gt 40 ] || { echo "skip layer side $side: time"; continue; }
  env $(side_env $side) timeout 110 $L --benchmark_filter="$FL" > $O/ab/layer_side${side}_1.txt 2>&1 || echo "layer side $side rc=$?"
  echo "$(el) layer side $side done"
done
python3 - $O/ab <<'PY'
import json, statistics, sys, glob, re
d = sys.argv[1]
S = "ABCDE"
t = {s: {} for s in S}
for f in glob.glob(d + "/side*_*.json"):
    side = f.split("/side")[1][0]
    try: js = json.load(open(f))
    except Exception: continue
    for b in js.get("benchmarks", []):
        if b.get("error_occurred"): continue
        n = b["name"].split("/iterations:")[0].replace("/manual_time", "")
        t[side].setdefault(n, []).append(b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "us")])
for f in glob.glob(d + "/layer_side*_*.txt"):
    side = f.split("layer_side")[1][0]
    for line in open(f):
        m = re.match(r"^(layer/\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\|(.*)", line)
        if m:
            t[side].setdefault(m.group(1) + " (eager)", []).append(float(m.group(2)))
            t[side].setdefault(m.group(1) + " (graph)", []).append(float(m.group(5)))
            st = m.group(7).split()
            if len(st) >= 4: t[side].setdefault(m.group(1) + " select", []).append(float(st[3].split("/")[0]))
print(f"{'median us (A main, B evict-last stores, C +sel evict-first, D B+set-aside, E C+set-aside)':70s} " + " ".join(f"{s:>8s}" for s in S) + " " + " ".join(f"{s + '/A':>6s}" for s in S[1:]))
med = lambda s, n: statistics.median(t[s][n]) if n in t[s] else float("nan")
for n in sorted(set(t["A"]) | set(t["B"])):
    v = [med(s, n) for s in S]
    print(f"{n:70s} " + " ".join(f"{x:8.1f}" for x in v) + " " + " ".join(f"{x / v[0]:6.3f}" for x in v[1:]))
PY
echo "$(el) all done"
