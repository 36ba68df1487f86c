#!/usr/bin/env bash
# Forty-seventh session, call 2 (device, carry [".deps"]): main with warp-keys merged (db59627):
# a device build of the GPU tests that cover the top-k and the layer, the README main command on
# the GPU, and the issue tables of bench_layer (every row) and bench_indexer (the indexer and
# top-k rows), each against its same-binary ceilings.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/logs; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
. tools/device_build.sh test_topk test_layer test_graph test_step_bounds bench_indexer bench_layer step5_driver > $O/logs/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/logs/build.log); spill lines: $(grep -ci spill build-device.build.log)"
timeout 100 build-device/tests/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL" $O/logs/test_topk.txt | head -8
for t in test_layer test_graph test_step_bounds; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/$t > $O/logs/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/logs/$t.txt | tail -1)"; grep -E "FAIL" $O/logs/$t.txt | head -5
done
timeout 60 build-device/examples/step5_driver --backend cuda --cache-dir /tmp/step5-cache > $O/logs/driver.txt 2>&1
echo "$(el) driver (cuda, README default) rc=$? $(grep -E 'checksum' $O/logs/driver.txt | tail -1)"
c=$(( $(left) - 110 )); [ $c -gt 220 ] && c=220
timeout $c build-device/bench/bench_layer --benchmark_out=$O/bench_layer.json --benchmark_out_format=json > $O/logs/bench_layer.txt 2>&1
echo "$(el) bench_layer rc=$? (cap $c s)"
c=$(( $(left) - 10 )); [ $c -gt 100 ] && c=100
timeout $c build-device/bench/bench_indexer --benchmark_filter='^(copy/d2d|cublaslt|scores|indexer|topk/ours)' --benchmark_out=$O/bench_indexer.json --benchmark_out_format=json > $O/logs/bench_indexer.txt 2>&1
echo "$(el) bench_indexer rc=$? (cap $c s)"
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
