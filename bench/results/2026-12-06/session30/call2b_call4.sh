#!/usr/bin/env bash
# Thirtieth session, calls 2b and 4 (device, repository root; both on a warm H100 after call 2 /
# call 3). Here first: bash tools/device_ab.sh prepare 5b570ec (carry [".deps", "build-abold"]).
#   2b: the tree of scores_early_loads_not_landed.patch (prefetch limited to each warp's first
#       m-tile): CASES='tp:(1|8)/tokens:(1|16|64)/ctx:131072'
#   4:  main with kGemmGemvAutoMinBytes = 16 MiB (ops/gemm.hpp): CASES='tp:8/tokens:1/ctx:(32768|131072)'
# Prints device_ab's eager medians, then the medians of the bench_layer counters per side.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; rm -rf $O/ab
OUT=$O bash tools/device_ab.sh run bench_layer "^layer/step5_preview/${CASES:?}/" 3 2>&1 | tail -8
python3 - $O/ab 3 <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
vals = {}
for side in ("old", "new"):
    for i in range(1, rounds + 1):
        try: js = json.load(open(f"{d}/{side}_{i}.json"))
        except Exception: continue
        for b in js["benchmarks"]:
            n = b["name"].split("/iterations")[0]
            for k in ("layer_us", "graph_us", "fused_gemm_us", "prepare_us", "select_us"):
                if k in b: vals.setdefault((n, k, side), []).append(b[k])
for n in sorted({n for (n, k, s) in vals}):
    row = [n.replace("layer/step5_preview/", "")]
    for k in ("layer_us", "graph_us", "fused_gemm_us", "prepare_us", "select_us"):
        o, w = vals.get((n, k, "old")), vals.get((n, k, "new"))
        if o and w:
            mo, mw = statistics.median(o), statistics.median(w)
            row.append(f"{k} {mo:.1f}->{mw:.1f} ({mw/mo:.3f})")
    print("  " + " | ".join(row))
PY
