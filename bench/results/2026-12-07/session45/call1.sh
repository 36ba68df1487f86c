#!/usr/bin/env bash
# Forty-fifth session, call 1 (device, carry ["build-carry-z"]: build-carry/ xz-packed, no device build): session 44's
# call4.sh on binaries rebuilt from main 35d430a (test_topk, bench_indexer: nvcc 13.0, sm_90a,
# Release, stripped; `cmake --build build --target test_topk bench_indexer`), plus Nsight Compute
# per-SASS-instruction counters of the warp rows (ld 1024) and of the 128-thread CTA (ld 4096) for
# where the top-k's instructions per key go.
set -u
[ -x build-carry/test_topk ] || { mkdir -p build-carry && xz -dc build-carry-z/bins.tar.xz | tar -xf - -C build-carry; }
[ -d /tmp/deps/usr ] || dpkg -x build-carry-z/libbenchmark1debian_1.7.1-1_amd64.deb /tmp/deps
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/o}; mkdir -p $O/logs; T0=$(date +%s); CALL_S=${CALL_S:-500}
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { [ $(( CALL_S - ($(date +%s) - T0) )) -gt "$1" ]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
timeout 90 build-carry/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL|launched" $O/logs/test_topk.txt | head -8
fi
timeout 90 build-carry/bench_indexer --benchmark_filter='^(copy/d2d|topk/(ours|radix_cta(32|128))/rows:(4096|8192|16384|32768)/ld:(1024|2048|4096))' > $O/logs/indexer.txt 2>&1
echo "$(el) bench_indexer rc=$?"; grep -E "^(topk|copy)" $O/logs/indexer.txt | grep -v manual_time | cut -c1-100
[ -z "${SKIP_TESTS:-}" ] && STEP5_GPU_TEST_QUICK=1 timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck build-carry/test_topk "PDL as" > $O/logs/san_memcheck_pdl.txt 2>&1
echo "$(el) memcheck (PDL case: unstaged warp rows) rc=$? $(grep -E 'ERROR SUMMARY' $O/logs/san_memcheck_pdl.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_memcheck_pdl.txt | tail -1)"
mkdir -p bc/bench && ln -sf "$PWD/build-carry/bench_indexer" bc/bench/bench_indexer
for spec in "topk/radix_cta32/rows:32768/ld:1024/iter|topk_warp_rows|warp1024" "topk/radix_cta128/rows:16384/ld:4096/iter|topk_select_kernel|cta4096" "topk/radix_cta32/rows:65536/ld:2048/iter|topk_warp_rows|warp2048"; do
  IFS='|' read -r f k tag <<< "$spec"
  left 60 || { echo "$(el) skip ncu $tag (time)"; continue; }
  mkdir -p $O/ncu_$tag
  OUT=$O/ncu_$tag BUILD_DIR=bc timeout 150 bash tools/ncu_sass.sh bench_indexer "$f" "$k" 2 1 10 > $O/logs/ncu_$tag.txt 2>&1
  echo "$(el) ncu $tag rc=$?"; head -30 $O/logs/ncu_$tag.txt
  gzip -f $O/ncu_$tag/sass.csv 2>/dev/null; rm -f $O/ncu_$tag/sass_ncu.log
done
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
