#!/usr/bin/env bash
# The twenty-fourth session's "Next on a GPU" in one device call (about 450 s; written then, not
# run). Here, first:
#   bash tools/device_ab.sh prepare HEAD
#   git apply bench/results/2026-12-05/session24/decode_region_list_batched_loads.patch
# then the device tool with carry [".deps", "build-abold"]:
#   bash bench/results/2026-12-05/session24/next_h200_call.sh
# Steps (each packed into $OUT/logs.tgz as it ends; later ones skipped when time runs short):
#   1. builds: the working tree (patched) and HEAD (build-abold) in parallel;
#   2. test_attention, quick (the patch's decode, invalid-selection and bounds cases);
#   3. bench_attention decode A/B, HEAD against the patch (read flush, the default);
#   4. the patched bench_attention's decode rows under STEP5_BENCH_L2_FLUSH=write (the flush A/B);
#   5. bench_indexer: the e4m3 rate, scores and selection after a history, the new top-k rows;
#   6. l2_flush_check.cu; 7. bench_layer's single-GPU rows.
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_attention) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_attention bench_attention bench_indexer bench_layer > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log); spill lines $(grep -ci spill build-device.build.log)"
STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_attention > $O/l/test_attention.txt 2>&1
rc=$?; echo "$(el) test_attention rc=$rc $(grep -E 'passed, .* failed' $O/l/test_attention.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/test_attention.txt | head -5; pack
OUT=$O/l/ab timeout 120 bash tools/device_ab.sh run bench_attention '^(copy|attention/decode)' 2 | tee $O/l/ab_attention.txt; pack
STEP5_BENCH_L2_FLUSH=write timeout 40 build-device/bench/bench_attention --benchmark_filter='^(copy|attention/decode)' --benchmark_out=$O/l/attn_write.json --benchmark_out_format=json > $O/l/attn_write.txt 2>&1
echo "$(el) attention, memset flush"; grep -A30 "^copy bandwidth" $O/l/attn_write.txt | cut -c1-140; pack
[ "$(left)" -gt 60 ] && { timeout $(( $(left) < 90 ? $(left) - 20 : 90 )) build-device/bench/bench_indexer --benchmark_filter='^(copy|cublas|(indexer|scores)_prefill/|topk/.*/from:4096)' --benchmark_out=$O/l/bench_indexer.json --benchmark_out_format=json > $O/l/bench_indexer.txt 2>&1; echo "$(el) bench_indexer"; tail -n 30 $O/l/bench_indexer.txt | cut -c1-150; pack; }
[ "$(left)" -gt 40 ] && { nvcc -O3 -arch=sm_90a -o /tmp/l2fc bench/results/2026-12-05/session24/l2_flush_check.cu && timeout 30 /tmp/l2fc > $O/l/l2_flush_check.txt 2>&1; echo "$(el) l2_flush_check"; cat $O/l/l2_flush_check.txt; pack; }
[ "$(left)" -gt 60 ] && { timeout $(( $(left) - 10 )) build-device/bench/bench_layer --benchmark_filter='^(copy|cublas|layer/)' --benchmark_out=$O/l/bench_layer.json --benchmark_out_format=json > $O/l/bench_layer.txt 2>&1; echo "$(el) bench_layer"; grep -A25 "^SPEC §9 floors:" $O/l/bench_layer.txt | cut -c1-160; pack; }
echo "$(el) done"; pack; rm -rf $O/l
