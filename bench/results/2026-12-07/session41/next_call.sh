#!/usr/bin/env bash
# Prepared for the next session (not run): what two co-resident 512-thread selection CTAs share
# (issue 14, tp 1 decode batch 64: 256 rows take 28.5 µs where 64 take 15.6, call 2). Device,
# carry [".deps"], about 330 s after the machine starts. Stages:
# (1) bench_indexer's selection on full 16384-key rows at 64 / 128 / 256 / 512 rows, the
#     launcher's choice (topk/1), the forced algorithms on one CTA (cand_cta, radix_cta) and on
#     clusters, CUB (new rows: 128 and 256, 8c84a1b), and one CTA of 128 / 256 threads on the
#     full rows (topk/<algo>_cta<T>/rows:R/full);
# (2) Nsight Compute stall digests of topk/1/rows:64 and topk/1/rows:256 (tools/ncu_sass.sh), so
#     that the instructions whose samples grow with the second CTA per SM are named;
# (3) indexer_decode at 128K batch 64, tp 1 / 8 (equal and mixed depths), for the issue table,
#     and test_indexer's long-chunk case (1903822's forced decode CTAs of 2048 regions; not yet
#     run on a GPU) and its plan cases;
# (4) with this folder's exp_match_hist.patch applied first (git apply; not to land as is): the
#     candidates' first-digit histogram with one shared atomic per distinct bin of a warp
#     (__match_any_sync; STEP5_EXP_MATCH_HIST=1) against one per key (0), in one binary: test_topk
#     quick with it on, then the A/B of the selection rows and indexer_decode (stage 4 is skipped
#     when the patch is not applied).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
. tools/device_build.sh bench_indexer > $O/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/build.log)"
B=build-device/bench/bench_indexer
timeout 150 $B --benchmark_filter='^(copy/d2d|topk/(cub|0|1|8|cand_cta|radix_cta|cand_cluster|radix_cluster)/rows:(64|128|256|512)/(i|m)|topk/(cand|radix)_cta(128|256)/rows:(64|256)/full)' \
  > $O/topk_rows.txt 2>&1; echo "$(el) topk rows rc=$?"
grep -E "^topk/" $O/topk_rows.txt | grep -v manual_time | cut -c1-110
for r in 64 256; do
  OUT=$O/sass_$r; mkdir -p $OUT
  OUT=$OUT timeout 120 bash tools/ncu_sass.sh bench_indexer "topk/1/rows:$r/(i|m)" topk_select_kernel 2 1 14 > $O/sass_$r.txt 2>&1
  echo "$(el) -- ncu_sass topk/1/rows:$r rc=$?"; head -40 $O/sass_$r.txt
  rm -f $OUT/sass.csv
done
timeout 60 $B --benchmark_filter='^(copy/d2d|indexer_decode/tp:(1|8)/batch:64/ctx:131072/(i|m))' > $O/decode.txt 2>&1
echo "$(el) decode rc=$?"; grep -E "^(indexer_decode|copy)" $O/decode.txt | grep -v manual_time | cut -c1-140
. tools/device_build.sh test_indexer >> $O/build.log 2>&1
for c in "long region chunks" "score plans"; do
  STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_indexer "$c" > "$O/test_indexer_${c// /_}.txt" 2>&1
  echo "$(el) test_indexer \"$c\" rc=$? $(tail -1 "$O/test_indexer_${c// /_}.txt")"
  grep -E "FAIL|ERROR|forced" "$O/test_indexer_${c// /_}.txt" | head -6
done
if grep -q STEP5_EXP_MATCH_HIST include/step5/kernels/sm90/indexer_topk.cuh; then
  . tools/device_build.sh test_topk >> $O/build.log 2>&1
  STEP5_EXP_MATCH_HIST=1 STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/test_topk > $O/test_topk_match.txt 2>&1
  echo "$(el) test_topk quick, match histogram on: rc=$? $(tail -1 $O/test_topk_match.txt)"
  F='^(topk/(1|cand_cta)/rows:(64|256)/(i|m)|indexer_decode/tp:(1|8)/batch:64/ctx:131072/(i|m))'
  for i in 1 2; do for side in 0 1; do
    STEP5_EXP_MATCH_HIST=$side timeout 60 $B --benchmark_filter="$F" > $O/match_${side}_$i.txt 2>&1
  done; done
  for side in 0 1; do echo "-- match histogram $side"; cat $O/match_${side}_*.txt | grep -E "^(topk|indexer_decode)" | grep -v manual_time | sort | cut -c1-100; done
fi
echo "$(el) all done"
