#!/usr/bin/env bash
# Thirty-first session, call 3: the register top-k kernel (working tree) on the GPU. Builds every
# target, runs test_topk quick (every variant against the reference; the new prefill-shaped ld 8192
# rows and repeat cases), test_indexer, test_layer and test_graph quick (the selection inside
# indexer_select and the layer; the graph's PDL rule by kernel name), then compute-sanitizer memcheck
# and racecheck of test_topk's prefill-shaped case. Carry [".deps"].
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE "spill|error" $O/l/build.log | head -5
for t in test_topk test_graph test_layer test_indexer; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"; grep -E "^\[FAIL\]|FAIL" $O/l/$t.txt | head -5
  pack
done
for tool in memcheck racecheck; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build-device/tests/test_topk "prefill-shaped" > $O/l/san_$tool.txt 2>&1
  echo "$(el) $tool test_topk [prefill-shaped] rc=$? $(grep -E 'passed, .* failed' $O/l/san_$tool.txt | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/l/san_$tool.txt | tail -1)"
  pack
done
echo "$(el) done"; pack; rm -rf $O/l
