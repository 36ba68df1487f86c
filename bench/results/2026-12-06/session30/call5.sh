#!/usr/bin/env bash
# Thirtieth session, call 5, main's tree: the indexer decode split at 128K (issue 14's >= 70 % of
# copy at batch >= 16): bench_indexer's indexer_decode, scores_decode, read/summaries and the
# top-k rows of the same shapes in one binary, then Nsight Compute kernel durations of
# indexer_decode tp 1 batch 16. Device carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
timeout 60 build-device/bench/bench_indexer --benchmark_filter='^(copy|indexer_decode/tp:(1|8)/batch:(16|64)/ctx:131072|scores_decode/tp:(1|8)/batch:(16|64)/ctx:131072|read/summaries/batch:(16|64)/ctx:131072|topk/(0|cub)/rows:(16|64)/)' --benchmark_out=$O/l/bench_indexer.json --benchmark_out_format=json > $O/l/bench_indexer.txt 2>&1
echo "$(el) bench_indexer rc=$?"; sed -n '/^benchmark /,$p' $O/l/bench_indexer.txt | cut -c1-140; pack
timeout 60 bash tools/ncu_kernels.sh bench_indexer "^indexer_decode/tp:1/batch:16/ctx:131072/" 0 60 > $O/l/ncu_indexer_tp1_b16.txt 2>&1
echo "$(el) ncu rc=$?"; sed -n '/^median/,$p' $O/l/ncu_indexer_tp1_b16.txt | cut -c1-140
echo "$(el) done"; pack
