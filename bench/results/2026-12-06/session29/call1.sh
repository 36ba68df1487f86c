#!/usr/bin/env bash
# Twenty-ninth session, first device call: branch s29 = main + the conditional cuBLASLt reduction
# mask (147f0ec; the twenty-eighth session's branch did not survive and was re-written) + the o_proj
# L2 prefetch from the prepare launch + the summary-page prefetch (working tree). Device carry [".deps"]; any H100 / H200.
#   1. builds test_gemm, bench_gemm, test_indexer, test_topk, test_layer, bench_layer;
#   2. test_gemm quick (the narrow long-K cuBLASLt rows, the new "reduces K splits in fp32" case);
#   3. bench_layer decode batch 1 at 128K, tp 1 / 8: the L2 prefetches (o_proj weight,
#      summary pages) off / o_proj only / summaries only / both, alternating in one binary
#      (STEP5_BENCH_LAYER_L2_PREFETCH), two rounds;
#   4. test_indexer, test_layer, test_topk quick (the prefetch CTAs; 5bbe39b's request-row mend);
#   5. bench_gemm kAuto / cublaslt rows with both plans' algorithm lines (the o_proj tp 8 gap).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
which nsys ncu > $O/l/tools.txt 2>&1
. tools/device_build.sh test_gemm bench_gemm test_indexer test_topk test_layer bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE "error|spill" $O/l/build.log | head -5
STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1
echo "$(el) test_gemm quick rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED' $O/l/test_gemm.txt | head -8 | cut -c1-220; pack
F='^layer/step5_preview/tp:(1|8)/tokens:1/ctx:131072/'
for r in 1 2; do for pf in 0 o_proj summaries both; do
  [ "$(left)" -lt 200 ] && break 2
  STEP5_BENCH_LAYER_L2_PREFETCH=$pf timeout 60 build-device/bench/bench_layer --benchmark_filter="$F" > $O/l/layer_pf${pf}_r$r.txt 2>&1
  echo "$(el) bench_layer prefetch=$pf round $r rc=$?"
  grep -E "^layer/" $O/l/layer_pf${pf}_r$r.txt | grep -v iterations | awk '{print $1, $2, $5}' | cut -c1-100
  grep -E "^layer/" $O/l/layer_pf${pf}_r$r.txt | grep iterations | awk '{s=$1; for (i = 2; i <= NF; i++) if ($i ~ /^(o_proj_gemm_us|select_us|prepare_us|attention_us)=/) s = s " " $i; print s}' | sed 's|/iterations[^ ]*||' | cut -c1-200
done; done; pack
for t in test_indexer test_layer test_topk; do
  [ "$(left)" -lt 150 ] && break
  STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED' $O/l/$t.txt | head -4 | cut -c1-200
done; pack
L=$(left); [ "$L" -gt 40 ] && { timeout $(( L - 10 )) build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm_auto)/.*(o_proj/.*tokens:(1|4|16)/|tokens:(1|16|256)/|d2d)' > $O/l/bench_gemm.txt 2>&1
  echo "$(el) bench_gemm rc=$?"
  grep -E "^(gemm_auto)/" $O/l/bench_gemm.txt | awk '{x=""; for (i = 1; i <= NF; i++) if ($i ~ /^x_cublasLt=/) x = $i; print $1, $2, x, $NF}' | sed 's|/min_time:0.020||; s|/manual_time||' | cut -c1-110
  grep -E "^cublaslt_algo(_auto)? o_proj/.*tp:8" $O/l/bench_gemm.txt | cut -c1-150; }
echo "$(el) done"; pack; rm -rf $O/l
