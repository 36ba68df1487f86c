#!/usr/bin/env bash
# Session 33, call 2 (carry [".deps"]): call 1's Nsight Compute steps with the benchmark names
# matched (google-benchmark appends /manual_time), and bench_gemm's o_proj T = 1 rows at tp 16
# (call 1 ran out of time before dsa_h64_kv8_d128's).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_gemm bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
[ -n "${SKIP_GEMM:-}" ] || timeout 60 build-device/bench/bench_gemm --benchmark_filter='^(copy|((gemm_gemv|gemm_auto|cublaslt)/o_proj/[a-z0-9_]+/tp:16/tokens:1/))' --benchmark_repetitions=3 > $O/l/gemm.txt 2>&1
rc=$?; echo "$(el) bench_gemm rc=$rc"; grep manual_time_median $O/l/gemm.txt | cut -c1-120
for f in radix_cluster cand_cta radix_cta; do for r in 1 16; do
  echo "== ncu topk/$f/rows:$r"; timeout 60 bash tools/ncu_kernels.sh bench_indexer "topk/$f/rows:$r/iter" 0 30 2>&1 | tail -3
done; done
echo "$(el) ncu durations"
for f in radix_cluster cand_cta; do
  echo "== sass $f"; OUT=$O/l timeout 90 bash tools/ncu_sass.sh bench_indexer "topk/$f/rows:1/iter" topk_select 3 1 16 > $O/l/sass_$f.txt 2>&1; head -60 $O/l/sass_$f.txt
done
echo "$(el) done"; pack
