#!/usr/bin/env bash
# Forty-fourth session, call 4 (device, carry ["build-carry"]): no build on the device (267 s of
# device time were left). build-carry/ holds test_topk and bench_indexer built on the development
# machine (nvcc 13.0, sm_90a, Release; `cmake --build build --target test_topk bench_indexer`) from
# the tree after the review's mends: the final rule (48 rows per SM), the new GPU case (the
# launcher's own choice named by a captured launch), the PDL case's warp-row entry (the unstaged
# instance), and bench_indexer's full-row shapes. To prepare it again (build-carry/ is git-ignored):
#   cmake --build build --target test_topk bench_indexer && mkdir -p build-carry &&
#   cp build/tests/test_topk build/bench/bench_indexer build-carry/ && strip build-carry/*
# (the device has CUDA 13.0's libcudart / libcublasLt; about 60 MB stripped, under the 64 MiB carry).
# Refused in the forty-fourth session (267 s of device time left): not run.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/logs; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 60 build-carry/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL|launched" $O/logs/test_topk.txt | head -8
timeout 50 build-carry/bench_indexer --benchmark_filter='^(copy/d2d|topk/(ours|radix_cta(32|128))/rows:(4096|8192|16384)/ld:2048/from)' > $O/logs/indexer.txt 2>&1
echo "$(el) bench_indexer rc=$?"; grep -E "^(topk|copy)" $O/logs/indexer.txt | grep -v manual_time | cut -c1-100
STEP5_GPU_TEST_QUICK=1 timeout 40 /usr/local/cuda/bin/compute-sanitizer --tool memcheck build-carry/test_topk "PDL as" > $O/logs/san_memcheck_pdl.txt 2>&1
echo "$(el) memcheck (PDL case: unstaged warp rows) rc=$? $(grep -E 'ERROR SUMMARY' $O/logs/san_memcheck_pdl.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_memcheck_pdl.txt | tail -1)"
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
