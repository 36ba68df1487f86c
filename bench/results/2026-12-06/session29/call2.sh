#!/usr/bin/env bash
# Twenty-ninth session, second device call (branch s29 + an experiment switch, working tree; that
# tree's prefetch code is l2_prefetch_from_prepare_not_landed.patch in this folder, not on main):
#   1. builds bench_layer, bench_attention, bench_indexer;
#   2. bench_layer decode batch 1 at 128K, tp 1 / 8: the L2 prefetches off, bulk (call 1's form) and
#      per-line (prefetch.global.L2, STEP5_EXP_PREFETCH_LINES=1; o_proj, summaries, both),
#      alternating in one binary, three rounds: do the prefetch CTAs still lengthen the prepare
#      stage when they issue line prefetches instead of bulk ones?
#   3. the issue tables with the prefetches off (main's behaviour): bench_attention decode +
#      prefill, bench_layer every single-GPU case, bench_indexer decode.
# Device carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 380 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_gemm bench_layer bench_attention bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE "error|spill" $O/l/build.log | head -5
STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1; echo "$(el) test_gemm quick rc=$? $(grep -E "passed, .* failed" $O/l/test_gemm.txt | tail -n 1)"; grep -E "cuBLASLt algorithms checked|FAIL" $O/l/test_gemm.txt | head -4
F='^layer/step5_preview/tp:(1|8)/tokens:1/ctx:131072/'
for r in 1 2 3; do for m in 0 both lines_both lines_o_proj lines_summaries; do
  pf=${m#lines_}; lines=""; [ "$pf" != "$m" ] && lines=1
  env STEP5_BENCH_LAYER_L2_PREFETCH=$pf ${lines:+STEP5_EXP_PREFETCH_LINES=1} timeout 60 build-device/bench/bench_layer --benchmark_filter="$F" > $O/l/layer_${m}_r$r.txt 2>&1
  echo "$(el) $m round $r rc=$? $(grep -E '^layer/' $O/l/layer_${m}_r$r.txt | grep -v iterations | awk '{printf "%s eager %s graph %s | ", substr($1, 21, 4), $2, $5}')"
  grep -E "^layer/" $O/l/layer_${m}_r$r.txt | grep iterations | awk '{s=substr($1, 21, 4); for (i = 2; i <= NF; i++) if ($i ~ /^(o_proj_gemm_us|select_us|prepare_us)=/) s = s " " $i; print "   " s}'
done; done; pack
[ "$(left)" -gt 100 ] && timeout 90 build-device/bench/bench_attention --benchmark_filter='^(copy|attention/)' --benchmark_out=$O/l/bench_attention.json --benchmark_out_format=json > $O/l/bench_attention.txt 2>&1
echo "$(el) bench_attention rc=$?"; grep -A45 "^copy bandwidth" $O/l/bench_attention.txt | cut -c1-150; pack
L=$(left); [ "$L" -gt 150 ] && { STEP5_BENCH_LAYER_L2_PREFETCH=0 timeout $(( L - 60 )) build-device/bench/bench_layer --benchmark_out=$O/l/bench_layer.json --benchmark_out_format=json > $O/l/bench_layer.txt 2>&1; echo "$(el) bench_layer rc=$?"; grep -E "^layer \(us|^layer/" $O/l/bench_layer.txt | grep -v iterations | cut -c1-230; pack; }
L=$(left); [ "$L" -gt 30 ] && { timeout $(( L - 5 )) build-device/bench/bench_indexer --benchmark_filter='^(copy|indexer_decode/)' --benchmark_out=$O/l/bench_indexer.json --benchmark_out_format=json > $O/l/bench_indexer.txt 2>&1; echo "$(el) bench_indexer rc=$?"; grep -E "^indexer_decode/step5_preview/tp:(1|8)/batch:(16|64)/ctx:131072 " $O/l/bench_indexer.txt; }
echo "$(el) done"; pack; rm -rf $O/l
