#!/usr/bin/env bash
# Forty-fourth session, call 1 (device, carry [".deps", "build-abold"]; build-abold = main dbac075,
# `bash tools/device_ab.sh prepare dbac075`): the warp-row top-k (topk_warp_rows_kernel, one warp
# per row for rows of ld <= kTopkWarpMaxLd) on the working tree.
#   1. build test_topk, bench_indexer, bench_layer (new) and bench_layer (old, build-abold)
#   2. test_topk, every case (the warp rows against the reference on every pattern)
#   3. bench_indexer: the prefill-shaped top-k rows, every threads-per-row in one binary, and indexer_prefill
#   4. bench_layer A/B (old main, new) of the prefill rows, 2 rounds: layer_us and select_us
#   5. compute-sanitizer memcheck and racecheck of test_topk's prefill-shaped case (quick)
# Stages are skipped once CALL_S (default 540) seconds are spent.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab $O/logs; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
root=$PWD
(cd build-abold/src && cp -r "$root/.deps" . 2>/dev/null; BUILD_DIR="$root/build-abold/build" . tools/device_build.sh bench_layer) > $O/logs/build_old.log 2>&1 &
. tools/device_build.sh test_topk bench_indexer bench_layer > $O/logs/build.log 2>&1
wait
echo "$(el) build new: $(tail -n 1 $O/logs/build.log); old: $(tail -n 1 $O/logs/build_old.log); spill lines: $(grep -ci spill build-device.build.log)"
grep -A3 "topk_warp_rows" build-device.build.log | grep -E "registers|spill" | head -4
timeout $(( $(left) > 150 ? 150 : $(left) )) build-device/tests/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL" $O/logs/test_topk.txt | head -8
B=build-device/bench/bench_indexer
F='^(copy/d2d|topk/(ours|radix_cta(32|128|256))/rows:[0-9]+/ld:|indexer_prefill/)'
[ $(left) -gt 200 ] && { timeout 100 $B --benchmark_filter="$F" --benchmark_out=$O/indexer.json --benchmark_out_format=json > $O/logs/indexer.txt 2>&1;
  echo "$(el) bench_indexer rc=$?"; grep -E "^(topk|indexer_prefill|copy)" $O/logs/indexer.txt | grep -v manual_time | cut -c1-150; }
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:(8192|32768)/ctx:0'
for i in 1 2; do
  for side in old new; do
    [ $(left) -gt 100 ] || { echo "skip layer $side round $i: time"; continue; }
    b=$L; [ $side = old ] && b=build-abold/build/bench/bench_layer
    timeout $(( $(left) - 60 )) $b --benchmark_filter="$FL" --benchmark_out=$O/ab/${side}_$i.json --benchmark_out_format=json > $O/logs/layer_${side}_$i.txt 2>&1 || echo "layer $side $i rc=$?"
    echo "$(el) layer $side round $i"
  done
done
python3 tools/ab_medians.py --counter layer_us --counter select_us --counter select_x_floor --counter x_floor $O/ab old new
for tool in memcheck racecheck; do
  [ $(left) -gt 40 ] || { echo "skip $tool: time"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 20 )) /usr/local/cuda/bin/compute-sanitizer --tool $tool build-device/tests/test_topk "prefill-shaped" > $O/logs/san_$tool.txt 2>&1
  echo "$(el) $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/logs/san_$tool.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_$tool.txt | tail -1)"
done
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
