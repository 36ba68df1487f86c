#!/usr/bin/env bash
# Thirty-first session, call 1, main's tree (ddaa409). Device carry [".deps"].
# On an H200: the issue tables (session28/next_call_h200.sh, about 500 s) and nothing else.
# Otherwise: the GPU runs the thirtieth session's host checks did not get (test_attention quick,
# with its adapted precondition case; test_graph and test_layer quick, whose layer launcher got
# the new refusals; the consumer projects on the GPU), then Nsight Compute stall digests of the
# prefill top-k (issue 15's selection stage): the 256-thread instance on the rows of a 16K chunk
# after 32K (topk/ours/rows:16384/ld:6144/from:4096) and the 128-thread one (rows:65536/ld:2048).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu" | tee $O/l/gpu.txt
if echo "$gpu" | grep -q H200; then
  bash bench/results/2026-12-05/session28/next_call_h200.sh; exit
fi
. tools/device_build.sh > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for t in test_attention test_graph test_layer; do
  STEP5_GPU_TEST_QUICK=1 timeout 150 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"; grep -E "^\[FAIL\]" $O/l/$t.txt | head -5
done
pack
timeout 200 ctest --test-dir build-device -L '^consumer$' --output-on-failure -j4 > $O/l/ctest_consumer.txt 2>&1
echo "$(el) ctest consumer rc=$? $(grep -E 'tests passed|tests failed' $O/l/ctest_consumer.txt)"; grep -E "Passed|Failed|Skipped|Not Run" $O/l/ctest_consumer.txt | head; pack
for f in 'topk/ours/rows:16384/ld:6144/from:4096$' 'topk/ours/rows:65536/ld:2048$'; do
  timeout 90 bash tools/ncu_stalls.sh bench_indexer "^$f" topk_select 2 1 > $O/l/ncu_stalls_$(echo $f | tr -c 'a-z0-9\n' _).txt 2>&1
  echo "$(el) ncu stalls $f rc=$?"; cat $O/l/ncu_stalls_$(echo $f | tr -c 'a-z0-9\n' _).txt | head -40 | cut -c1-150
done
echo "$(el) done"; pack; rm -rf $O/l
