#!/usr/bin/env bash
# Session 24, device call 2: the score patch's full GPU case, the golden layer, the H200 score
# figure against cuBLASLt e4m3 in one binary, Nsight Compute of the score kernel and of decode
# attention, then bench_layer's single-GPU rows.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_indexer test_layer bench_indexer bench_layer bench_attention > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log); spill lines $(grep -ci spill build-device.build.log)"
B=build-device/tests
run() { local n=$1 c=$2; shift 2; timeout $c "$@" > $O/l/$n.txt 2>&1; local rc=$?; echo "$(el) $n rc=$rc $(grep -E 'passed, .* failed' $O/l/$n.txt | tail -1)"; grep -E '^\[FAIL\]' $O/l/$n.txt | head -5; pack; }
STEP5_GPU_TEST_QUICK=1 run indexer_quick 200 $B/test_indexer
STEP5_GPU_TEST_QUICK=1 run layer_quick 120 $B/test_layer
run bench_indexer 90 build-device/bench/bench_indexer --benchmark_filter='^(copy|cublas|scores_prefill|indexer_prefill|indexer_decode/step5_preview/tp:./batch:(16|64)/ctx:131072)' --benchmark_out=$O/l/bench_indexer.json --benchmark_out_format=json
tail -n 30 $O/l/bench_indexer.txt
timeout 90 bash tools/ncu_sections.sh bench_indexer '^scores_prefill/tokens:16384/ctx:32768' indexer_scores_wgmma 1 1 > $O/l/ncu_scores.txt 2> $O/l/ncu_scores_digest.txt; echo "$(el) ncu scores"; cat $O/l/ncu_scores_digest.txt | head -30; pack
timeout 90 bash tools/ncu_sections.sh bench_attention '^attention/decode/step5_preview/tp:1/batch:32/ctx:131072' sparse_attention 3 1 > $O/l/ncu_attn.txt 2> $O/l/ncu_attn_digest.txt; echo "$(el) ncu attention"; cat $O/l/ncu_attn_digest.txt | head -30; pack
run attn_decode 60 build-device/bench/bench_attention --benchmark_filter='^(copy|attention/decode/step5_preview/tp:(1|8)/)' --benchmark_out=$O/l/bench_attention_decode.json --benchmark_out_format=json
tail -n 16 $O/l/attn_decode.txt
for s in 1 2 3 4 6; do STEP5_BENCH_ATTN_SPLITS=$s timeout 40 build-device/bench/bench_attention --benchmark_filter='^attention/decode/step5_preview/tp:(1/batch:(32|64)|8/batch:64)/' > $O/l/attn_splits_$s.txt 2>&1; echo "splits $s"; grep -E '^attention/decode' $O/l/attn_splits_$s.txt | tail -n 3; done; pack
run bench_layer 200 build-device/bench/bench_layer --benchmark_filter='^(copy|cublas|layer/)' --benchmark_out=$O/l/bench_layer.json --benchmark_out_format=json
tail -n 40 $O/l/bench_layer.txt
echo "$(el) done"; pack; rm -rf $O/l
