#!/usr/bin/env bash
# Thirty-sixth session, call 2 (carry [".deps"], about 150 s): what limits the tensor-core kGemv
# with X in windows at tp 8, T = 16 (0.93x cuBLASLt in session 35) — Nsight Compute throughputs
# (DRAM, L2, L1/shared, SM issue) of one launch each: our windowed kernel at T = 16, our X-whole
# kernel at T = 8 (12.9 us, ahead of cuBLASLt) and cuBLASLt at T = 16, step5_preview tp 8 fused;
# then the kGemv grid, X's window and the ring's stage cap swept (exp_gemv.patch, applied for the call).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sector_hit_rate.pct,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,launch__grid_size
for c in "gemm_gemv_win/step5_preview/tp:8/tokens:16/|gemm_gemv" "gemm_gemv/step5_preview/tp:8/tokens:8/|gemm_gemv" "gemm_gemv/step5_preview/tp:8/tokens:16/|gemm_gemv" "cublaslt/step5_preview/tp:8/tokens:16/|nvjet|xmma|cutlass|splitK|gemm" "gemm_gemv_win/step5_preview/tp:1/tokens:16/|gemm_gemv"; do
  f=${c%%|*} k=${c#*|}
  echo "== $f (kernel ~ $k)"
  timeout 120 ncu --clock-control none -k "regex:$k" --launch-skip 5 --launch-count 1 --metrics $M --csv --print-units base \
    build-device/bench/bench_gemm --benchmark_filter="^${f}" > $O/l/ncu_$(echo $f | tr '/:' '__').csv 2>&1; python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
h = rows[0]; iN, iM, iV = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
for r in rows[1:]: print(f"  {r[iN][:40]:40s} {r[iM]:62s} {r[iV]}")' < $O/l/ncu_$(echo $f | tr '/:' '__').csv || tail -4 $O/l/ncu_$(echo $f | tr '/:' '__').csv
done
# sweeps (exp_gemv.patch applied for this call, not landed): STEP5_EXP_GEMV_GRID (the kGemv grid's
# SM count), STEP5_EXP_XWINDOW (X's window, values) and STEP5_EXP_MAXSTAGES (the ring's cap; 8 landed)
F='^(cublaslt|gemm_gemv|gemm_gemv_win)/(step5_preview|dsa_h64_kv8_d128)/tp:(1|8)/tokens:(8|16)/'
for v in "132 1024 8" "120 1024 8" "100 1024 8" "66 1024 8" "132 512 8" "132 512 16" "132 256 16"; do
  set -- $v
  STEP5_EXP_GEMV_GRID=$1 STEP5_EXP_XWINDOW=$2 STEP5_EXP_MAXSTAGES=$3 timeout 60 build-device/bench/bench_gemm --benchmark_filter="$F" > $O/l/sweep_$1_$2_$3.txt 2>&1
  echo "-- grid $1 window $2 max_stages $3 (rc $?)"; grep -E "^(cublaslt|gemm_gemv)" $O/l/sweep_$1_$2_$3.txt | awk '{print $1, $2, $NF}' | sed 's#/min_time:0.020/manual_time##'
done
echo "$(el) done"
