#!/usr/bin/env bash
# Thirty-ninth session: is the indexer decode score kernel's tail (SM active 79 % of the elapsed
# cycles, call 5) a granularity limit? exp_score_rpc.patch (applied here first, not to land) sets
# the mma.sync plan's regions_per_cta from STEP5_EXP_SCORE_RPC. bench_indexer scores_decode tp 1 / 8
# at batch 16 / 64 for the plan's choice and 2048 ... 128 regions per CTA (more, shorter CTAs:
# the hardware dispatches later waves to the SMs that free first), and the SM-active share of the
# read ceiling kernel for comparison. Device, carry [".deps"], about 200 s on a fresh machine.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
. tools/device_build.sh bench_indexer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
B=build-device/bench/bench_indexer
F='^(scores_decode/tp:(1|8)/batch:(16|64)/|read/summaries/batch:(16|64)/)'
for rpc in "" 2048 1024 512 256 128; do
  if [ -z "$rpc" ]; then unset STEP5_EXP_SCORE_RPC; else export STEP5_EXP_SCORE_RPC=$rpc; fi
  timeout 60 $B --benchmark_filter="$F" > $O/rpc_${rpc:-plan}.txt 2>&1
  echo "-- rpc ${rpc:-plan} (rc $?)"; grep -E "^(scores_decode|read/)" $O/rpc_${rpc:-plan}.txt | grep -v manual_time
done
unset STEP5_EXP_SCORE_RPC
for k in read_ceiling indexer_scores; do
  timeout 60 ncu --clock-control none -k regex:$k --launch-skip 2 --launch-count 1 --metrics \
    sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__cycles_elapsed.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
    $B --benchmark_filter="$( [ $k = read_ceiling ] && echo 'read/summaries/batch:16/' || echo 'scores_decode/tp:1/batch:16/')" > $O/ncu_$k.txt 2>&1
  echo "-- ncu $k (rc $?)"; grep -E "sm__|dram__|gpu__time" $O/ncu_$k.txt
done
echo "$(el) all done"
