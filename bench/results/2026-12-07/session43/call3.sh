#!/usr/bin/env bash
# Forty-third session, call 3 (device, carry [".deps"]), on main: the rest of session 42's unrun
# check of bench_common.hpp warm_up — bench_attention's decode rows at 128K and bench_gemm's
# tokens:1 rows with STEP5_BENCH_WARMUP_MS=200 (the default) and 0. Call 2 covered bench_layer
# and bench_indexer. Stages are skipped once CALL_S (default 230: about 390 s of device time were left) seconds are spent.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-230} - ($(date +%s) - T0) )); }
. tools/device_build.sh bench_attention bench_gemm > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
for w in 200 0; do
  [ $(left) -gt 30 ] || { echo "skip bench_attention warm-up $w: time"; continue; }
  STEP5_BENCH_WARMUP_MS=$w timeout $(( $(left) - 5 )) build-device/bench/bench_attention --benchmark_filter='^(copy/d2d|attention/decode/.*/ctx:131072)' > $O/attention_w$w.txt 2>&1
  echo "$(el) bench_attention decode, warm-up $w ms: rc=$?"; grep -E "^attention/decode" $O/attention_w$w.txt | grep -v manual_time | cut -c1-120
done
for w in 200 0; do
  [ $(left) -gt 20 ] || { echo "skip bench_gemm warm-up $w: time"; continue; }
  STEP5_BENCH_WARMUP_MS=$w timeout $(( $(left) - 5 )) build-device/bench/bench_gemm --benchmark_filter='^(copy/d2d|(gemm|cublaslt)/.*/tokens:1/)' > $O/gemm_w$w.txt 2>&1
  echo "$(el) bench_gemm T = 1, warm-up $w ms: rc=$?"; grep -E "^(gemm|cublaslt)/" $O/gemm_w$w.txt | grep -v manual_time | cut -c1-120 | head -12
done
echo "$(el) all done"
