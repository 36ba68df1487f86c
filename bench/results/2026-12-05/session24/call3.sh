#!/usr/bin/env bash
# Session 24, device call 3 (H200): the score figure against cuBLASLt e4m3 in one binary; decode
# attention with the region gather ceiling, L2 flushed by a memset (write) and by a read, twice
# each alternately; then bench_layer's decode rows in both flush modes while time is left.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_indexer bench_attention bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
BB=build-device/bench
timeout 60 $BB/bench_indexer --benchmark_filter='^(copy|cublas|scores_prefill/)' > $O/l/indexer.txt 2>&1
echo "$(el) indexer"; grep -E "^(cublaslt|scores_prefill)/step5" $O/l/indexer.txt | cut -c1-150; pack
F='^(copy|attention/decode/step5_preview/tp:(1|8)/)'
for i in 1 2; do for m in write read; do
  STEP5_BENCH_L2_FLUSH=$m timeout 60 $BB/bench_attention --benchmark_filter="$F" --benchmark_out=$O/l/attn_${m}_$i.json --benchmark_out_format=json > $O/l/attn_${m}_$i.txt 2>&1
  echo "$(el) attention $m $i"; grep -A14 "^copy bandwidth" $O/l/attn_${m}_$i.txt | cut -c1-140; pack
done; done
L='^(copy|cublas|layer/step5_preview/tp:(1|8)/tokens:(1|64)/ctx:131072)'
for m in write read; do
  [ $(( $(date +%s) - T0 )) -gt 400 ] && { echo "$(el) layer $m skipped (time)"; continue; }
  STEP5_BENCH_L2_FLUSH=$m timeout 70 $BB/bench_layer --benchmark_filter="$L" --benchmark_out=$O/l/layer_$m.json --benchmark_out_format=json > $O/l/layer_$m.txt 2>&1
  echo "$(el) layer $m"; grep -A6 "^layer (us" $O/l/layer_$m.txt | cut -c1-120; grep -A5 "^targets" $O/l/layer_$m.txt; pack
done
echo "$(el) done"; pack; rm -rf $O/l
