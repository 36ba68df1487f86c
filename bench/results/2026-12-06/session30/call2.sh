#!/usr/bin/env bash
# Thirtieth session, call 2, on branch s30-early (main 5b570ec + the scores' early loads: the
# decode / MTP prepare lets its dependent start after its wait; the score kernel locates its tile,
# stages its block-table entries and L2-prefetches the summary rows of regions completed before
# the step, before its own wait). Here first: bash tools/device_ab.sh prepare 5b570ec.
# Device carry [".deps", "build-abold"]; any H100 / H200.
#   1. bench_layer decode at 128K, tp 1 / 8, batch 1 / 16 / 64: old (5b570ec) against new,
#      alternating, ROUNDS rounds (default 3); eager (real time) and graph_us medians per side;
#   2. test_indexer / test_layer / test_graph / test_step_bounds quick on the new tree;
#   3. compute-sanitizer memcheck + racecheck of test_indexer's decode-batches case.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l ab 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
if [ "${SKIP_AB:-0}" != 1 ]; then
OUT=$O bash tools/device_ab.sh run bench_layer '^layer/step5_preview/tp:(1|8)/tokens:(1|16|64)/ctx:131072/' ${ROUNDS:-3} > $O/l/ab.txt 2>&1
echo "$(el) A/B rc=$?"; cat $O/l/ab.txt | cut -c1-160
python3 - $O/ab ${ROUNDS:-3} <<'PY'
import json, statistics, sys, glob
d, rounds = sys.argv[1], int(sys.argv[2])
vals = {}
for side in ("old", "new"):
    for i in range(1, rounds + 1):
        try: js = json.load(open(f"{d}/{side}_{i}.json"))
        except Exception: continue
        for b in js["benchmarks"]:
            n = b["name"].split("/iterations")[0]
            for k in ("graph_us", "select_us", "prepare_us", "layer_us"):
                if k in b: vals.setdefault((n, k, side), []).append(b[k])
names = sorted({n for (n, k, s) in vals})
for n in names:
    row = [n.replace("layer/step5_preview/", "")]
    for k in ("layer_us", "graph_us", "prepare_us", "select_us"):
        o, w = vals.get((n, k, "old")), vals.get((n, k, "new"))
        if o and w:
            mo, mw = statistics.median(o), statistics.median(w)
            row.append(f"{k} {mo:.1f}->{mw:.1f} ({mw/mo:.3f})")
    print("  " + " | ".join(row))
PY
pack
fi
. tools/device_build.sh test_indexer test_layer test_graph test_step_bounds > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE "error|spill" $O/l/build.log | head -5
for t in test_indexer test_layer test_graph test_step_bounds; do
  STEP5_GPU_TEST_QUICK=1 timeout 150 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed.*failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED|ERROR' $O/l/$t.txt | head -6 | cut -c1-200
done; pack
for tool in memcheck racecheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_indexer "decode batches of 1, 16, 64" > $O/l/san_$tool.txt 2>&1
  echo "$(el) $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/l/san_$tool.txt | tail -1) | $(grep -E 'passed.*failed' $O/l/san_$tool.txt | tail -1)"
done
echo "$(el) done"; pack
