#!/usr/bin/env bash
# Thirtieth session, call 3, main's tree (5b570ec): Nsight Compute kernel durations (cold caches
# per kernel, tools/ncu_kernels.sh) of the decode cases that miss issue 14's targets, for the
# closing note's "what limits": bench_layer batch 1 at 128K, tp 8 and tp 1; bench_indexer's
# indexer_decode tp 1 batch 16 at 128K (scores against selection). Device carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_layer bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for tp in 8 1; do
  timeout 120 bash tools/ncu_kernels.sh bench_layer "^layer/step5_preview/tp:$tp/tokens:1/ctx:131072/" 0 200 > $O/l/ncu_layer_tp${tp}_b1.txt 2>&1
  echo "$(el) ncu layer tp $tp batch 1 rc=$?"; sed -n '/^median/,$p' $O/l/ncu_layer_tp${tp}_b1.txt | cut -c1-150; pack
done
timeout 120 bash tools/ncu_kernels.sh bench_indexer "^indexer_decode/step5_preview/tp:1/batch:16/ctx:131072/" 0 80 > $O/l/ncu_indexer_tp1_b16.txt 2>&1
echo "$(el) ncu indexer_decode tp 1 batch 16 rc=$?"; sed -n '/^median/,$p' $O/l/ncu_indexer_tp1_b16.txt | cut -c1-150
echo "$(el) done"; pack
