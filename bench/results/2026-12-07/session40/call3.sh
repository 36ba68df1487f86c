#!/usr/bin/env bash
# Fortieth session, prepared, not run (no machine came this session): the
# tree with session 39's prologue_prefetch.patch and exp_score_rpc.patch applied, plus
# exp_prologue_switch (this folder's exp_combined.patch holds all three): STEP5_EXP_PROLOGUE=0 runs
# main's score prologue (the search always, no L2 prefetch) in the same binary, so the A/B needs
# no second build. Stages, each skipped once CALL_S (default 585) seconds are spent:
# (1) test_indexer quick on the candidate (every case against the CPU reference), (2) A/B of
# bench_indexer's scores_decode rows at 128K (uniform, mixed depth, MTP q:2) and the 4096-token
# scores_prefill rows (requests:4 / 16 miss the guess), side 0 = main's prologue, side 1 = the
# candidate, alternating, ROUNDS (default 2) rounds, (3) memcheck of test_indexer quick, (4) the regions-per-CTA
# sweep (STEP5_EXP_SCORE_RPC), (5) test_topk quick. Device, carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-585} - ($(date +%s) - T0) )); }
. tools/device_build.sh test_indexer bench_indexer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 60 )) build-device/tests/test_indexer > $O/test_indexer.txt 2>&1; rc=$?
echo "$(el) test_indexer rc=$rc $(grep -E 'test cases' $O/test_indexer.txt | tail -1)"; grep -E "ERROR|FAIL" $O/test_indexer.txt | head -5
B=build-device/bench/bench_indexer
F='^(scores_decode/tp:(1|8)/batch:(16|64)/ctx:131072|scores_prefill/tokens:4096/ctx:32768)'
for i in $(seq 1 ${ROUNDS:-2}); do
  for side in 0 1; do
    [ $(left) -gt 40 ] || { echo "skip ab $side round $i: time"; continue; }
    STEP5_EXP_PROLOGUE=$side timeout 60 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json \
      --benchmark_out_format=json > /dev/null 2>&1 || echo "side $side round $i rc=$?"
  done
done
python3 - $O/ab <<'PY'
import json, statistics, sys, glob
t = {"0": {}, "1": {}}
for f in glob.glob(sys.argv[1] + "/side*_*.json"):
    side = f.split("/side")[1][0]
    try: js = json.load(open(f))
    except Exception: continue
    for b in js.get("benchmarks", []):
        if b.get("error_occurred"): continue
        n = b["name"].split("/iterations:")[0].replace("/manual_time", "")
        t[side].setdefault(n, []).append(b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "us")])
print(f"{'benchmark (0 = main prologue, 1 = candidate)':66s} {'0 us':>8s} {'1 us':>8s} {'1/0':>6s}")
for n in t["1"]:
    o = statistics.median(t["0"][n]) if n in t["0"] else float("nan"); m = statistics.median(t["1"][n])
    print(f"{n:66s} {o:8.1f} {m:8.1f} {m / o:6.3f}")
PY
echo "$(el) ab done"
if [ $(left) -gt 45 ]; then m=$(left); [ $m -gt 105 ] && m=105
  STEP5_GPU_TEST_QUICK=1 timeout $(( m - 5 )) compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_indexer > $O/memcheck.txt 2>&1; rc=$?
  echo "$(el) memcheck test_indexer rc=$rc $(grep -E 'ERROR SUMMARY' $O/memcheck.txt | tail -1)"
fi
F2='^(scores_decode/tp:(1|8)/batch:(16|64)/ctx:131072/|read/summaries/batch:(16|64)/)'
for rpc in "" 1024 512 256 128; do
  [ $(left) -gt 30 ] || { echo "skip rpc ${rpc:-plan}: time"; continue; }
  if [ -z "$rpc" ]; then unset STEP5_EXP_SCORE_RPC; else export STEP5_EXP_SCORE_RPC=$rpc; fi
  timeout 25 $B --benchmark_filter="$F2" > $O/rpc_${rpc:-plan}.txt 2>&1
  echo "-- rpc ${rpc:-plan} (rc $?)"; grep -E "^(scores_decode|read/)" $O/rpc_${rpc:-plan}.txt | grep -v manual_time | cut -c1-140
done
unset STEP5_EXP_SCORE_RPC
if [ $(left) -gt 60 ]; then
  . tools/device_build.sh test_topk >> $O/build.log 2>&1
  STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 5 )) build-device/tests/test_topk > $O/test_topk.txt 2>&1; rc=$?
  echo "$(el) test_topk rc=$rc $(grep -E 'test cases' $O/test_topk.txt | tail -1)"
fi
echo "$(el) all done"
