#!/usr/bin/env bash
# Forty-fifth session, call 2 (device, carry ["build-carry-z"], no device build): the warp rows
# with fewer instructions per key (branch warp-keys: warp_hist_add_keys, id tests only on a row's
# last step, the greater-only compaction step) and the one-CTA radix select's sweeps over staged
# keys four at a time (radix_refine kStaged4, float4 staging), test_topk and bench_indexer built here (nvcc 13.0,
# sm_90a, Release, stripped, xz-packed with Debian's libbenchmark1debian). The 128-thread CTA
# is changed too; the A/B reference is main 35d430a's bench_indexer and bench_layer
# (build-carry-z/all.tar.xz: *_old), rounds alternating old/new on one machine. Also
# test_indexer and test_layer (quick), and the sanitizers on test_topk's prefill-shaped case.
set -u
[ -x build-carry/test_topk ] || { mkdir -p build-carry && xz -dc build-carry-z/all.tar.xz | tar -xf - -C build-carry; }
[ -d /tmp/deps/usr ] || dpkg -x build-carry-z/libbenchmark1debian_1.7.1-1_amd64.deb /tmp/deps
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/o}; mkdir -p $O/logs $O/idx $O/layer; T0=$(date +%s); CALL_S=${CALL_S:-500}
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { [ $(( CALL_S - ($(date +%s) - T0) )) -gt "$1" ]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 120 build-carry/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL|ERROR" $O/logs/test_topk.txt | head -12
F='^(copy/d2d|topk/(ours|radix_cta(32|128|256))/rows:(4096|8192|16384|32768|65536)/ld:(1024|2048|4096|8192))'
for r in 1 2; do
for side in old new; do
  [ $r = 1 ] || left 250 || { echo "$(el) skip bench_indexer $side $r (time)"; continue; }
  b=build-carry/bench_indexer; [ $side = old ] && b=build-carry/bench_indexer_old
  timeout 60 $b --benchmark_filter="$F" --benchmark_out=$O/idx/${side}_$r.json --benchmark_out_format=json > $O/logs/indexer_${side}_$r.txt 2>&1
  echo "$(el) bench_indexer $side round $r rc=$?"
done
done
python3 tools/ab_medians.py $O/idx old new
L='^layer/step5_preview/tp:(1|8)/tokens:(8192|32768)/ctx:0/'
for r in 1 2; do
for side in old new; do
  [ $r = 1 ] && { left 60 || continue; } ; [ $r = 1 ] || left 150 || { echo "$(el) skip bench_layer $side $r (time)"; continue; }
  b=build-carry/bench_layer; [ $side = old ] && b=build-carry/bench_layer_old
  timeout 100 $b --benchmark_filter="$L" --benchmark_out=$O/layer/${side}_$r.json --benchmark_out_format=json > $O/logs/layer_${side}_$r.txt 2>&1
  echo "$(el) bench_layer $side round $r rc=$?"
done
done
python3 tools/ab_medians.py --counter select_us --counter select_x_floor --counter layer_us --counter x_floor $O/layer old new
for t in test_indexer test_layer; do
  left 90 || { echo "$(el) skip $t (time)"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout 80 build-carry/$t > $O/logs/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed|test cases' $O/logs/$t.txt | tail -1)"; grep -E "FAIL|ERROR" $O/logs/$t.txt | head -5
done
for tool in memcheck racecheck; do
  left 60 || { echo "skip $tool (time)"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool build-carry/test_topk "prefill-shaped" > $O/logs/san_$tool.txt 2>&1
  echo "$(el) $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/logs/san_$tool.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_$tool.txt | tail -1)"
done
mkdir -p bc/bench && ln -sf "$PWD/build-carry/bench_indexer" bc/bench/bench_indexer
for spec in "topk/radix_cta32/rows:32768/ld:1024/iter|topk_warp_rows|warp1024" "topk/radix_cta32/rows:65536/ld:2048/iter|topk_warp_rows|warp2048" "topk/radix_cta128/rows:16384/ld:4096/iter|topk_select_kernel|cta4096"; do
  IFS='|' read -r f k tag <<< "$spec"
  left 60 || { echo "$(el) skip ncu $tag (time)"; continue; }
  mkdir -p $O/ncu_$tag
  OUT=$O/ncu_$tag BUILD_DIR=bc timeout 150 bash tools/ncu_sass.sh bench_indexer "$f" "$k" 2 1 6 > $O/logs/ncu_$tag.txt 2>&1
  echo "$(el) ncu $tag rc=$?"; head -3 $O/logs/ncu_$tag.txt
  gzip -f $O/ncu_$tag/sass.csv 2>/dev/null; rm -f $O/ncu_$tag/sass_ncu.log
done
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
