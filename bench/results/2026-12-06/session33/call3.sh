#!/usr/bin/env bash
# Session 33, call 3 (carry [".deps"]): where the cluster top-k's time goes at decode (rows: 1),
# with 20 launches of stall samples per variant (call 2's single launch gave 13-70 samples), and
# the four forced variants' bench_indexer times at rows 1 and 16.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
. tools/device_build.sh bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
timeout 60 build-device/bench/bench_indexer --benchmark_filter='^(copy|topk/(radix|cand)_(cta|cluster)/rows:(1|16)/)' > $O/l/topk.txt 2>&1
echo "$(el) bench"; grep -E "^topk" $O/l/topk.txt | cut -c1-110
for f in radix_cluster cand_cluster cand_cta; do
  echo "== sass $f"; OUT=$O/l timeout 120 bash tools/ncu_sass.sh bench_indexer "topk/$f/rows:1/iter" topk_select 3 20 40 > $O/l/sass_$f.txt 2>&1; head -3 $O/l/sass_$f.txt
  cp $O/l/sass.csv $O/l/sass_$f.csv
done
echo "$(el) done"; pack
