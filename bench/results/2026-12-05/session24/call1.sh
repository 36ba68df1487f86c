#!/usr/bin/env bash
# Session 24, device call 1: GPU cases of 40a4010..6e74a0a, and the two prepared patches (applied
# in the working tree) A/B against HEAD (build-abold).
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $O/l/gpu.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_indexer bench_attention) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_topk test_gemm test_indexer test_attention bench_indexer bench_attention > $O/l/new_build.log 2>&1
echo "$(el) new build: $(tail -1 $O/l/new_build.log); spill lines $(grep -ci spill build-device.build.log)"
cp build-device.build.log $O/l/
B=build-device/tests
pack() { tar -czf $O/logs.tgz -C $O l ai aa 2>/dev/null; }
run() { local n=$1 c=$2; shift 2; timeout $c "$@" > $O/l/$n.txt 2>&1; echo "$(el) $n rc=$? $(grep -E 'passed, .* failed' $O/l/$n.txt | tail -1)"; grep -E '^\[FAIL\]|error' $O/l/$n.txt | head -5; pack; }
run topk 100 $B/test_topk
run gemm_pre 60 $B/test_gemm preconditions
run idx_wgmma 90 $B/test_indexer "wgmma path"
STEP5_GPU_TEST_QUICK=1 run attn_quick 150 $B/test_attention
wait $OLD; echo "$(el) old build: $(tail -1 $O/l/old_build.log)"
OUT=$O/ai timeout 150 bash tools/device_ab.sh run bench_indexer '^scores_prefill/' 2 | tee $O/l/ab_idx.txt; pack
STEP5_BENCH_SCORE_TILES_FORWARD=1 timeout 40 build-device/bench/bench_indexer --benchmark_filter='^scores_prefill/' > $O/l/fwd.txt 2>&1; echo "$(el) forward rc=$?"; grep -E '^scores' $O/l/fwd.txt | head -20; pack
OUT=$O/aa timeout 200 bash tools/device_ab.sh run bench_attention '^(attention/decode|copy)' 2 | tee $O/l/ab_attn.txt
echo "$(el) done"
pack; rm -rf $O/l $O/ai $O/aa
