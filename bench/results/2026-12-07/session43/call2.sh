#!/usr/bin/env bash
# Forty-third session, call 2 (device, carry [".deps"]; builds bench_indexer and bench_layer only, no
# test_indexer: device time): an A/B of evict-last score stores, on the tree with
# exp_evict_last.patch applied (sides, see side_env: A main, B evict-last score stores, C B + the
# selection's loads evict-first, D B + a persisting L2 set-aside, E C + the set-aside), plus session 42's
# unrun check of bench_common.hpp warm_up (STEP5_BENCH_WARMUP_MS, default 200 ms) folded in: bench_layer
# side A runs traced with the default and with STEP5_BENCH_WARMUP_MS=0; bench_indexer side A also with
# 0; bench_attention and bench_gemm decode rows with 200 and 0 as time allows. Stages are skipped once
# CALL_S (default 420: the session had about 630 s of device time left) seconds are spent.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-420} - ($(date +%s) - T0) )); }
side_env() { case $1 in A) echo "STEP5_EXP_L2=0";; B) echo "STEP5_EXP_L2=2";; C) echo "STEP5_EXP_L2=6";;
  D) echo "STEP5_EXP_L2=2 STEP5_EXP_PERSIST_MB=40";; E) echo "STEP5_EXP_L2=6 STEP5_EXP_PERSIST_MB=40";; esac; }
. tools/device_build.sh bench_indexer bench_layer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"; grep -c spill $O/build.log
B=build-device/bench/bench_indexer
F='^(copy/d2d|indexer_decode/tp:(1|8)/batch:(16|64)/ctx:131072)'
for i in $(seq 1 ${ROUNDS:-2}); do
  for side in A B D C E; do
    [ $(left) -gt 90 ] || { echo "skip indexer side $side round $i: time"; continue; }
    env $(side_env $side) timeout 60 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json \
      --benchmark_out_format=json > $O/ab/idx_side${side}_$i.txt 2>&1 || echo "side $side round $i rc=$?"
  done
  echo "$(el) indexer round $i done"
done
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:(1|16|64)/ctx:131072'
for run in A:200 B:200 A:0; do
  side=${run%:*}; w=${run#*:}
  [ $(left) -gt 45 ] || { echo "skip layer $run: time"; continue; }
  env $(side_env $side) STEP5_BENCH_WARMUP_MS=$w STEP5_BENCH_LAYER_TRACE=1 timeout $(( $(left) - 10 )) $L --benchmark_filter="$FL" \
    > $O/ab/layer_side${side}_w$w.txt 2> $O/layer_side${side}_w${w}_trace.txt || echo "layer $run rc=$?"
  echo "$(el) layer side $side warm-up $w done"
  python3 - $O/layer_side${side}_w${w}_trace.txt <<'PY'
import sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 6 or p[0] != "trace": continue
    rows.setdefault(p[1][20:], []).append(float(p[5]))
for n, v in rows.items():
    print(f"  {n:40s} first 5 steps {' '.join(f'{x:.1f}' for x in v[:5])}  median {sorted(v)[len(v) // 2]:.1f}  max/min {max(v) / min(v):.3f}")
PY
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
for f in glob.glob(d + "/layer_side*_w200.txt"):
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
for w in 0 200; do
  [ $(left) -gt 25 ] || { echo "skip indexer warm-up $w: time"; continue; }
  STEP5_BENCH_WARMUP_MS=$w timeout 40 $B --benchmark_filter='^(copy/d2d|indexer_decode/tp:(1|8)/batch:(1|16|64)/ctx:131072)' > $O/indexer_w$w.txt 2>&1
  echo "$(el) bench_indexer decode, warm-up $w ms: rc=$?"; grep -E "^indexer_decode" $O/indexer_w$w.txt | grep -v manual_time | cut -c1-120
done
for w in 200 0; do
  [ -x build-device/bench/bench_attention ] || { echo "bench_attention / bench_gemm not built (time)"; break; }
  [ $(left) -gt 25 ] || { echo "skip attention/gemm warm-up $w: time"; continue; }
  STEP5_BENCH_WARMUP_MS=$w timeout 40 build-device/bench/bench_attention --benchmark_filter='^(copy/d2d|attention/decode/.*/ctx:131072)' > $O/attention_w$w.txt 2>&1
  echo "$(el) bench_attention decode, warm-up $w ms: rc=$?"; grep -E "^attention/decode" $O/attention_w$w.txt | grep -v manual_time | cut -c1-120
  [ $(left) -gt 20 ] || continue
  STEP5_BENCH_WARMUP_MS=$w timeout 30 build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(gemm|cublaslt)/.*/tokens:1/)' > $O/gemm_w$w.txt 2>&1
  echo "$(el) bench_gemm T = 1, warm-up $w ms: rc=$?"; grep -E "^(gemm|cublaslt)/" $O/gemm_w$w.txt | grep -v manual_time | cut -c1-120 | head -12
done
echo "$(el) all done"
