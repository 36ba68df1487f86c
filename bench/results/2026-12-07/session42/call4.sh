#!/usr/bin/env bash
# Forty-second session, call 4 (device, carry [".deps"]), on the tree with exp_l2_owner.patch:
# where indexer_decode's selection loses its time in a step at 128K batch 64 (in bench_indexer the
# step takes 134.3 µs at tp 1, the scores alone 104.7 and the selection alone 19.8 on warm rows;
# call 2's evict-first summary loads made the step slower at tp 1, faster at tp 8). Nsight Compute
# durations of the score and selection kernels, one launch each after two skipped, clocks not
# locked, with the L2 flushed before each kernel (--cache-control all, ncu's default) and kept
# (none: the selection finds what the score kernel left in the L2; ncu serialises the kernels, so
# no PDL overlap either way), main (STEP5_EXP_L2=0) and hint (1). Plus L2 hit rate and DRAM bytes
# of the selection kernel.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
. tools/device_build.sh bench_indexer > $O/build.log 2>&1
echo "[$(( $(date +%s) - T0 )) s] build: $(tail -n 1 $O/build.log)"
M=gpu__time_duration.sum,launch__grid_size,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active
for f in 'indexer_decode/tp:1/batch:64/ctx:131072/[im]' 'indexer_decode/tp:8/batch:64/ctx:131072/[im]'; do
  for cc in all none; do for side in 0 1; do
    echo "-- $f cache-control $cc STEP5_EXP_L2=$side"
    STEP5_EXP_L2=$side timeout 45 ncu --clock-control none --cache-control $cc -k 'regex:topk|scores' --launch-skip 2 --launch-count 2 \
      --metrics $M --csv --print-units base build-device/bench/bench_indexer --benchmark_filter="$f" 2>&1 | grep -v "^==" |
      grep -E '^"[0-9]' | awk -F'","' '{print $1" "substr($5,1,34)" | "$(NF-2)" = "$NF}' | head -12
  done; done
done
echo "[$(( $(date +%s) - T0 )) s] all done"
