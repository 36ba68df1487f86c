#!/usr/bin/env bash
# The twenty-sixth session's "Next on a GPU" in one device call (written then, not run; about 550 s
# with the builds). Device carry [".deps"]; ask for nvidia-h200 (the issue tables are H200's).
#   1. test_topk and test_attention quick on e034ff7 and fe2e3e0 (one weighted_split_sum, merges_by_cluster: PTX
#      identical up to register names, not yet run);
#   2. bench_layer decode + prefill and bench_indexer decode on the H200 with the pushes (9cfa40b,
#      f9dc686): the issue 14 / 15 tables;
#   3. racecheck of test_topk's cluster-ties case (60 s was too short in the twenty-sixth session)
#      and of test_attention's forced-split decode case (the pushed merge; not yet run).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_topk test_attention bench_layer bench_indexer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -i spill $O/l/build.log | head -3
for t in test_topk test_attention; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -5; pack
done
timeout 200 build-device/bench/bench_layer --benchmark_out=$O/l/bench_layer.json --benchmark_out_format=json > $O/l/bench_layer.txt 2>&1
echo "$(el) bench_layer rc=$?"; tail -n 30 $O/l/bench_layer.txt | cut -c1-170; pack
[ "$(left)" -gt 150 ] && { timeout 60 build-device/bench/bench_indexer --benchmark_filter='^(copy|indexer_decode/|topk/(0|8|radix_cluster)/rows:(1|16|64)/)' --benchmark_out=$O/l/bench_indexer.json --benchmark_out_format=json > $O/l/bench_indexer.txt 2>&1; echo "$(el) bench_indexer rc=$?"; grep -E "^(indexer_decode|topk)/" $O/l/bench_indexer.txt | cut -c1-150; pack; }
[ "$(left)" -gt 60 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) / 2 )) compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_attention "decode: full selection topk 512, forced splits" > $O/l/racecheck_attention.txt 2>&1; echo "$(el) racecheck attention forced splits rc=$? $(grep -E 'RACECHECK SUMMARY' $O/l/racecheck_attention.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/racecheck_attention.txt | tail -n 1)"; pack; }
[ "$(left)" -gt 30 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_topk "ties across cluster ranks" > $O/l/racecheck_topk.txt 2>&1; echo "$(el) racecheck topk ties rc=$? $(grep -E 'RACECHECK SUMMARY' $O/l/racecheck_topk.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/racecheck_topk.txt | tail -n 1)"; pack; }
echo "$(el) done"; pack; rm -rf $O/l
