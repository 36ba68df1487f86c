#!/usr/bin/env bash
# Thirty-second session, call 4, main's tree (8c71bba, the weight-ring kGemv): Nsight Compute kernel
# durations (cold caches per kernel, tools/ncu_kernels.sh) of bench_layer decode batch 1 at 128K,
# tp 8 and tp 1: the new kGemv kernels inside the layer against the thirtieth session's table.
# Device carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for tp in 8 1; do
  timeout 100 bash tools/ncu_kernels.sh bench_layer "^layer/step5_preview/tp:$tp/tokens:1/ctx:131072/" 0 200 > $O/l/ncu_layer_tp${tp}_b1.txt 2>&1
  echo "$(el) ncu layer tp $tp batch 1 rc=$?"; sed -n '/^median/,$p' $O/l/ncu_layer_tp${tp}_b1.txt | cut -c1-150; pack
done
echo "$(el) done"; pack
