#!/usr/bin/env bash
# Twenty-fifth session, call 5 (the review's fixes): test_topk and test_attention quick on the
# working tree (the top-k's empty-slice ranks skip their DSMEM loads; the instance-equality check
# with the plan's ring and merge forced; the competing plan's query-tile fallback).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
. tools/device_build.sh test_topk test_attention > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for t in test_topk test_attention; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -5
  gzip -f $O/l/$t.txt
done
