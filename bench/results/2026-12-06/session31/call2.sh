#!/usr/bin/env bash
# Thirty-first session, call 2, main's tree: Nsight Compute stall digests and SASS stall samples of
# the prefill top-k (issue 15's selection stage): the 256-thread instance on the rows of a 16K chunk
# after 32K (topk/ours/rows:16384/ld:6144/from:4096) and the 128-thread one (rows:65536/ld:2048).
# (call 1's filters ended in '$', which the benchmark names' suffixes never match.) Carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
i=0
for f in 'topk/ours/rows:16384/ld:6144/from:4096' 'topk/ours/rows:65536/ld:2048/'; do
  i=$((i+1))
  timeout 100 bash tools/ncu_stalls.sh bench_indexer "^$f" topk_select 2 1 > $O/l/ncu_stalls_$i.txt 2>&1
  echo "$(el) ncu stalls $f rc=$?"; head -40 $O/l/ncu_stalls_$i.txt | cut -c1-160
  OUT=$O/l timeout 150 bash tools/ncu_sass.sh bench_indexer "^$f" topk_select 2 1 25 > $O/l/ncu_sass_$i.txt 2>&1
  echo "$(el) ncu sass $f rc=$?"; head -150 $O/l/ncu_sass_$i.txt | cut -c1-170; gzip -f $O/l/sass.csv; mv $O/l/sass.csv.gz $O/l/sass_$i.csv.gz
  pack
done
echo "$(el) done"; pack; rm -rf $O/l
