#!/usr/bin/env bash
# Thirty-ninth session, prepared, not run (no device time left). The indexer decode score kernel's
# prologue (call 5: 17 % of its warp stall samples before the first summary load; SM active 79 %).
# prologue_prefetch.patch (a) loads the tile_start bounds of a tile's guessed request in the round
# trip that loads the tile count, and searches only when the guess misses (a decode tile: no search;
# a miss starts the search where it started before), and (b) stages the block table first and
# requests each page's share of the CTA's first pass into the L2 (cp.async.bulk.prefetch.L2) while
# q is staged. Same stores, same bits. (A subagent review found no fault; its points are in.)
# Here first: `git apply bench/results/2026-12-07/session39/prologue_prefetch.patch` and
# `bash tools/device_ab.sh prepare HEAD` (the old tree, before the patch: HEAD must not contain it).
# Device, carry [".deps", "build-abold"], two calls:
#   bash call9.sh test   (about 250 s) test_indexer and test_topk quick on the patched tree (every
#                        case against the CPU reference), memcheck of test_indexer quick;
#   bash call9.sh ab     (about 400 s) A/B of bench_indexer's decode rows at 128K (uniform, mixed
#                        depth, MTP q:2) and prefill rows (the requests:R rows miss the guess)
#                        (old = HEAD, new = patched), 2 rounds; then the new score kernel's
#                        SM-active and DRAM shares under Nsight Compute (call 5's figures: 79 %,
#                        64.6 %; sm__cycles_active.avg over the section's elapsed cycles).
# Land (a) and (b) if the tests pass and no decode or prefill row slows (beyond noise).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
case ${1:-test} in
  test)
    . tools/device_build.sh test_indexer test_topk > $O/build.log 2>&1
    echo "$(el) build: $(tail -n 1 $O/build.log)"
    for t in test_indexer test_topk; do
      STEP5_GPU_TEST_QUICK=1 timeout 150 build-device/tests/$t > $O/$t.txt 2>&1; rc=$?
      echo "$(el) $t rc=$rc $(grep -E 'passed, .* failed' $O/$t.txt | tail -1)"; grep -E "ERROR|FAIL" $O/$t.txt | head -5
    done
    STEP5_GPU_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_indexer > $O/memcheck.txt 2>&1; rc=$?
    echo "$(el) memcheck test_indexer rc=$rc $(grep -E 'ERROR SUMMARY' $O/memcheck.txt | tail -1)"
    ;;
  ab)
    timeout 400 bash tools/device_ab.sh run bench_indexer '^((scores|indexer)_decode/tp:(1|8)/batch:(16|64)/ctx:131072|read/summaries/|(scores|indexer)_prefill/)' 2 2>&1 | tail -50
    timeout 60 ncu --clock-control none -k regex:indexer_scores --launch-skip 2 --launch-count 1 --metrics \
      sm__cycles_active.avg,sm__cycles_elapsed.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
      build-device/bench/bench_indexer --benchmark_filter='scores_decode/tp:1/batch:16/ctx:131072/' > $O/ncu.txt 2>&1
    echo "$(el) ncu rc=$?"; grep -E "sm__|dram__|gpu__time" $O/ncu.txt
    ;;
esac
echo "$(el) all done"
