#!/usr/bin/env bash
# Twenty-fifth session, call 3 (measurement, HEAD 640a431): where the batch-1 decode step goes now.
#   1. build bench_layer; 2. Nsight Compute kernel durations of bench_layer decode batch 1 at 128K,
#   tp 8 and tp 1 (tools/ncu_kernels.sh; cold caches per kernel, as in a layer step);
#   3. warp-stall samples per SASS instruction (tools/ncu_sass.sh) of the batch-1 top-k, score,
#   attention and fused-GEMM kernels at tp 8 (no_inst = waiting for instructions);
#   4. cuobjdump -sass of the attention and top-k kernels (code size per instance).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for tp in 8 1; do
  f="layer/step5_preview/tp:$tp/tokens:1/ctx:131072/"
  timeout 100 bash tools/ncu_kernels.sh bench_layer "$f" 0 200 > $O/l/ncu_kernels_tp${tp}_b1.txt 2>&1
  echo "$(el) ncu kernels tp $tp batch 1"; sed -n '/median us/,$p' $O/l/ncu_kernels_tp${tp}_b1.txt; pack
done
for k in topk_select sparse_attention indexer_scores gemm_; do
  [ "$(left)" -gt 60 ] || break
  OUT=$O/l timeout 60 bash tools/ncu_sass.sh bench_layer 'layer/step5_preview/tp:8/tokens:1/ctx:131072/' "$k" 5 8 6 > $O/l/sass_$k.txt 2>&1
  mv $O/l/sass.csv $O/l/sass_$k.csv 2>/dev/null; gzip -f $O/l/sass_$k.csv 2>/dev/null
  echo "$(el) sass $k: $(head -n 1 $O/l/sass_$k.txt | cut -c1-300)"; pack
done
cuobjdump -sass build-device/bench/bench_layer 2>/dev/null | grep -E "Function :|^\s+/\*[0-9a-f]{4,}\*/" | awk '/Function :/{if(n)print n, f; f=$3; n=0; next}{n++}END{print n, f}' | sort -n | tail -40 > $O/l/sass_sizes.txt
echo "$(el) sass sizes (instructions per kernel, largest)"; tail -n 12 $O/l/sass_sizes.txt | cut -c1-150
echo "$(el) done"; pack; rm -rf $O/l
