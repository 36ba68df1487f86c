#!/usr/bin/env bash
# Nsight Compute sections (speed of light, compute and memory workload, occupancy, warp states,
# launch, scheduler) of the first `count` launches of the kernels whose name matches
# `kernel_regex` in one benchmark case, after `skip` such launches (warm-up); device machine, the
# build from tools/device_build.sh. Prints the report's text; a one-line digest per launch
# (duration, DRAM and L2 throughput, SM issue, occupancy, the top warp stall, the busiest pipe)
# goes to stderr.
#   bash tools/ncu_sections.sh <bench binary> <benchmark filter> <kernel regex> [skip] [count]
# e.g. bash tools/ncu_sections.sh bench_gemm 'gemm/step5_preview/tp:8/tokens:64/' 'gemm_wgmma' 3 1
set -u
bin=$1 filter=$2 kernel=$3 skip=${4:-3} count=${5:-1}
B=${BUILD_DIR:-build-device}
ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count "$count" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --section SchedulerStats \
    "$B/bench/$bin" --benchmark_filter="$filter" 2>/dev/null |
  tee >(grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issued Warp Per Scheduler|Eligible Warps|Stall|Dynamic Shared|highest-utilized|SM Busy|Issue Slots Busy|Executed Ipc" 1>&2)
