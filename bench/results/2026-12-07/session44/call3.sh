#!/usr/bin/env bash
# Forty-fourth session, call 3 (device, carry [".deps"]): the warp-row top-k as it lands (bulk
# staging, kTopkWarpMaxLd 2048, kTopkWarpMinRowsPerSm) — its GPU tests, its sanitizers, and the
# row count from which the warp rows pay (bench_indexer, full rows of ld 2048, 16 to 4096 rows), and
# Nsight Compute stalls of the warp rows at ld 1024 / 2048 (tools/ncu_stalls.sh).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/logs; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
. tools/device_build.sh test_topk test_indexer test_layer test_graph bench_indexer > $O/logs/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/logs/build.log); spill lines: $(grep -ci spill build-device.build.log)"
grep -A3 "topk_warp_rows" build-device.build.log | grep -E "registers|spill" | head -4
B=build-device/bench/bench_indexer
timeout 60 $B --benchmark_filter='^(copy/d2d|topk/(ours|radix_cta(32|128))/rows:[0-9]+/ld:(1024|2048))' --benchmark_out=$O/indexer.json --benchmark_out_format=json > $O/logs/indexer.txt 2>&1
echo "$(el) bench_indexer rc=$?"; grep -E "^(topk|copy)" $O/logs/indexer.txt | grep -v manual_time | cut -c1-100
timeout 100 build-device/tests/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL" $O/logs/test_topk.txt | head -8
for t in test_layer test_graph test_indexer; do
  [ $(left) -gt 150 ] || { echo "skip $t: time"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout 80 build-device/tests/$t > $O/logs/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/logs/$t.txt | tail -1)"; grep -E "FAIL" $O/logs/$t.txt | head -5
done
for sh in '^topk/ours/rows:32768/ld:1024' '^topk/ours/rows:65536/ld:2048/'; do
  [ $(left) -gt 100 ] || { echo "skip ncu $sh: time"; continue; }
  timeout 60 bash tools/ncu_stalls.sh bench_indexer "$sh" topk_warp_rows 3 1 > $O/logs/ncu_$(echo $sh | tr -dc 'a-z0-9').txt 2>&1
  echo "$(el) ncu $sh rc=$?"; head -30 $O/logs/ncu_$(echo $sh | tr -dc 'a-z0-9').txt
done
for tool in memcheck racecheck; do
  [ $(left) -gt 40 ] || { echo "skip $tool: time"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 15 )) /usr/local/cuda/bin/compute-sanitizer --tool $tool build-device/tests/test_topk "prefill-shaped" > $O/logs/san_$tool.txt 2>&1
  echo "$(el) $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/logs/san_$tool.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_$tool.txt | tail -1)"
done
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
