#!/usr/bin/env bash
# Why a kernel waits: its warp-stall reasons (average warps stalled per issued instruction, largest
# first), instruction count and cycles, and the memory-request counters that tell a request-bound
# gather from a bandwidth-bound one (global load / LDGSTS requests and sectors, L2 hit rate, DRAM
# read rate, shared-memory bank conflicts) for the first `count` launches of the kernels matching
# `kernel_regex` in one benchmark case, after `skip` such launches (device machine; the build from
# tools/device_build.sh). The stall digest is the one the sixth session's profiles used
# (bench/RESULTS.md, "What limits decode attention"). Written after the last device call of that
# session: the memory metric names are not yet checked on the device (a missing one prints n/a).
#   bash tools/ncu_stalls.sh <bench binary> <benchmark filter> <kernel regex> [skip] [count]
# e.g. bash tools/ncu_stalls.sh bench_attention '^attention/decode/step5_preview/tp:8/batch:64/ctx:131072' sparse_attention 3 1
set -u
bin=$1 filter=$2 kernel=$3 skip=${4:-3} count=${5:-1}
B=${BUILD_DIR:-build-device}
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio'
M="$M,smsp__inst_executed.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum"
M="$M,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
M="$M,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"
M="$M,lts__t_sector_hit_rate.pct,dram__bytes_read.sum.per_second"
M="$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count "$count" --metrics "$M" \
    --csv --print-units base "$B/bench/$bin" --benchmark_filter="$filter" 2>/dev/null |
  python3 "$(dirname "$0")/ncu_stalls.py"
