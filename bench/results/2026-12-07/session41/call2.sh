#!/usr/bin/env bash
# Forty-first session, call 2 (device, carry [".deps"]): where indexer_decode's time goes at 128K
# batch 64 after 24a719f (the 256-region decode chunks): Nsight Compute durations and occupancy
# limits of the score and selection kernels at tp 1 (256 selection rows: the ballot path) and tp 8
# (64 rows: owner masks). One launch of each after two skipped; clocks not locked; ncu's default
# cache control (caches flushed before each profiled kernel, so the selection reads its scores
# from DRAM, not from the L2 as in a step). The first form of this script anchored the benchmark
# filter with "$", which matches no name (names end in /iterations:N/manual_time): it profiled
# nothing; the loop below is what ran, on the warm machine after the build.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
. tools/device_build.sh bench_indexer > $O/build.log 2>&1
echo "[$(( $(date +%s) - T0 )) s] build: $(tail -n 1 $O/build.log)"
M=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active
for f in 'indexer_decode/tp:1/batch:64/ctx:131072/[im]' 'indexer_decode/tp:8/batch:64/ctx:131072/[im]'; do
  echo "-- $f"
  timeout 45 ncu --clock-control none -k 'regex:topk|scores' --launch-skip 2 --launch-count 2 --metrics $M --csv \
    --print-units base build-device/bench/bench_indexer --benchmark_filter="$f" 2>&1 | grep -v "^==" | grep -E '^"[0-9]' |
    awk -F'","' '{print $1" "substr($5,1,40)" | "$(NF-2)" = "$NF}' | head -20
done
