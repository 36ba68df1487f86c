#!/usr/bin/env bash
# Per-kernel GPU durations of one benchmark case under Nsight Compute (device machine; the
# build from tools/device_build.sh). Prints one line per kernel launch: id, duration in µs,
# grid and block size, name, so that a stage's kernel time can be told from the gaps between
# launches; then the median duration per kernel name.
#   bash tools/ncu_kernels.sh <bench binary> <benchmark filter> [launch skip] [launch count]
# e.g. bash tools/ncu_kernels.sh bench_layer 'layer/step5_preview/tp:8/tokens:1/ctx:131072/' 0 250
set -u
bin=$1 filter=$2 skip=${3:-0} count=${4:-300}
B=${BUILD_DIR:-build-device}
ncu --clock-control none --launch-skip "$skip" --launch-count "$count" \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size --csv --print-units base \
    "$B/bench/$bin" --benchmark_filter="$filter" 2>/dev/null | python3 "$(dirname "$0")/ncu_kernels.py"
