#!/usr/bin/env bash
# Session 24, device call 3 on an H100 (the H200 did not start): bench_attention's decode rows with
# the region gather ceiling, L2 flushed by a memset (write) and by a read, twice each alternately.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_attention > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
BB=build-device/bench
F='^(copy|attention/decode/step5_preview/tp:(1|8)/)'
for i in 1 2; do for m in write read; do
  STEP5_BENCH_L2_FLUSH=$m timeout 60 $BB/bench_attention --benchmark_filter="$F" --benchmark_out=$O/l/attn_${m}_$i.json --benchmark_out_format=json > $O/l/attn_${m}_$i.txt 2>&1
  echo "$(el) attention $m $i"; grep -A14 "^copy bandwidth" $O/l/attn_${m}_$i.txt | cut -c1-140; pack
done; done
echo "$(el) done"; pack; rm -rf $O/l
