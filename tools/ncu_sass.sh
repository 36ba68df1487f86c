#!/usr/bin/env bash
# Where a kernel's warps wait, per SASS instruction: Nsight Compute's warp-stall samples of the
# first `count` launches of the kernels matching `kernel_regex` in one benchmark case (after `skip`
# such launches), digested by tools/ncu_sass.py (stall reasons over the kernel, then the `top`
# instructions by samples with the lines before each). Device machine, the build from
# tools/device_build.sh. The full per-instruction table is left in $OUT (or /tmp) as sass.csv.
#   bash tools/ncu_sass.sh <bench binary> <benchmark filter> <kernel regex> [skip] [count] [top]
# e.g. bash tools/ncu_sass.sh bench_indexer 'scores_prefill_path/wgmma_f16/' indexer_scores_wgmma 1 1 12
set -u
bin=$1 filter=$2 kernel=$3 skip=${4:-3} count=${5:-1} top=${6:-12}
B=${BUILD_DIR:-build-device}
dir=${OUT:-/tmp}
ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count "$count" \
    --section SourceCounters --section WarpStateStats --import-source no -o "$dir/sass_report" -f \
    "$B/bench/$bin" --benchmark_filter="$filter" > "$dir/sass_ncu.log" 2>&1 || { tail -5 "$dir/sass_ncu.log"; exit 1; }
ncu -i "$dir/sass_report.ncu-rep" --page source --csv --print-source sass > "$dir/sass.csv" 2>&1
rm -f "$dir/sass_report.ncu-rep"
python3 "$(dirname "$0")/ncu_sass.py" "$dir/sass.csv" "$top"
