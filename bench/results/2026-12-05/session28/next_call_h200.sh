#!/usr/bin/env bash
# The issue tables on the H200 in one device call (written in the twenty-eighth session, not run;
# about 500 s with the builds). Device carry [".deps"]; ask for nvidia-h200 (issues 14 / 15 quote
# H200 figures; the latest full tables are the twenty-fifth session's, the twenty-eighth's are
# H100's). Main's tree.
#   1. bench_attention decode and prefill rows (issue 14: decode >= 0.85 of copy from batch 32;
#      issue 15: synthetic prefill >= 400 TFLOP/s);
#   2. bench_layer, every single-GPU case (issue 14 decode, issue 15 prefill tables);
#   3. bench_indexer decode rows and the cluster top-k (issue 14: >= 70 % of copy);
#   4. bench_gemm's kAuto / cublaslt rows at T <= 256 with both plans' algorithms (issue 14:
#      >= 1.0x cuBLASLt at T <= 256).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh bench_attention bench_layer bench_indexer bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
timeout 90 build-device/bench/bench_attention --benchmark_filter='^(copy|attention/)' --benchmark_out=$O/l/bench_attention.json --benchmark_out_format=json > $O/l/bench_attention.txt 2>&1
echo "$(el) bench_attention rc=$?"; grep -A45 "^copy bandwidth" $O/l/bench_attention.txt | cut -c1-150; pack
timeout 200 build-device/bench/bench_layer --benchmark_out=$O/l/bench_layer.json --benchmark_out_format=json > $O/l/bench_layer.txt 2>&1
echo "$(el) bench_layer rc=$?"; grep -E "^layer \(us|^layer/" $O/l/bench_layer.txt | grep -v iterations | cut -c1-230; pack
[ "$(left)" -gt 120 ] && { timeout 60 build-device/bench/bench_indexer --benchmark_filter='^(copy|indexer_decode/|topk/(0|8|radix_cluster)/rows:(1|16|64)/)' --benchmark_out=$O/l/bench_indexer.json --benchmark_out_format=json > $O/l/bench_indexer.txt 2>&1; echo "$(el) bench_indexer rc=$?"; grep -E "^indexer_decode/step5_preview/tp:(1|8)/batch:(16|64)/ctx:131072 " $O/l/bench_indexer.txt; pack; }
[ "$(left)" -gt 40 ] && { timeout $(( $(left) - 10 )) build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm_auto)/.*(tokens:(1|4|8|16|32|64|128|256)/|d2d)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench_gemm rc=$?"; grep -E "^(gemm_auto)/" $O/l/bench_gemm.txt | awk '{x=""; for (i = 1; i <= NF; i++) if ($i ~ /^x_cublasLt=/) x = $i; print $1, $2, x, $NF}' | sed 's|/min_time:0.020||; s|/manual_time||' | cut -c1-120; pack; }
echo "$(el) done"; pack; rm -rf $O/l
