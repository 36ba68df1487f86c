#!/usr/bin/env bash
# Twenty-sixth session, call 1: the twenty-fifth session's next_call.sh as written (about 450 s
# with the builds). Device carry [".deps"]; ask for nvidia-h200 (issue 14/15 figures are H200's).
#   1. test_topk and test_attention quick on ce7349a / 3a874f5 (the review's fixes, not yet run);
#   2. bench_attention decode and prefill rows, one binary (issue 14: decode >= 0.85 of copy from
#      batch 32 with the read flush; issue 15: the synthetic prefill >= 400 TFLOP/s);
#   3. the batch-1 decode plan swept with the one-query instance: forced splits x ring depth
#      (STEP5_BENCH_ATTN_SPLITS / _STAGES; the fifteenth session's sweep ran the general instance,
#      whose deeper rings were slower, possibly from their larger cold code);
#   4. bench_gemm (not run since the twentieth session).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_topk test_attention bench_attention bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for t in test_topk test_attention; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -5; pack
done
timeout 90 build-device/bench/bench_attention --benchmark_filter='^(copy|attention/)' --benchmark_out=$O/l/bench_attention.json --benchmark_out_format=json > $O/l/bench_attention.txt 2>&1
echo "$(el) bench_attention"; grep -A45 "^copy bandwidth" $O/l/bench_attention.txt | cut -c1-150; pack
for st in 0 2 3 4; do for sp in 0 8 13 16; do
  [ "$(left)" -gt 100 ] || break 2
  r=$(STEP5_BENCH_ATTN_SPLITS=$sp STEP5_BENCH_ATTN_STAGES=$st timeout 20 build-device/bench/bench_attention --benchmark_filter='^attention/decode/.*/batch:(1|8)/ctx:131072' 2>/dev/null | grep -E "^attention/decode" | awk '{printf "%s=%s ", $1, $2}')
  echo "stages $st splits $sp: $r" | sed 's|attention/decode/||g; s|/iterations:[0-9]*/manual_time||g' | tee -a $O/l/sweep.txt
done; done; pack
[ "$(left)" -gt 40 ] && { timeout $(( $(left) - 10 )) build-device/bench/bench_gemm --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1; echo "$(el) bench_gemm"; tail -n 40 $O/l/bench_gemm.txt | cut -c1-160; }
echo "$(el) done"; pack; rm -rf $O/l
