#!/usr/bin/env bash
# Written in the twenty-ninth session, NOT RUN (no device time was left); main at ec47c80: per-kernel GPU durations (Nsight Compute,
# tools/ncu_kernels.sh) of bench_gemm's o_proj tp 8 T = 1 rows, the peer (cublaslt/) and kAuto
# (gemm_auto/), which read 6.66 against 7.00 µs with identical algorithms: is the gap in the kernel
# or around it? Device carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for f in cublaslt gemm_auto; do
  timeout 60 bash tools/ncu_kernels.sh bench_gemm "^$f/o_proj/step5_preview/tp:8/tokens:1/" 0 120 > $O/l/ncu_$f.txt 2>&1
  echo "$(el) $f rc=$?"; tail -n 6 $O/l/ncu_$f.txt | cut -c1-160
done
gzip $O/l/*.txt
