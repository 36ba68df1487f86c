#!/usr/bin/env bash
# Thirtieth session, call 1, on branch s30-side = main 5b570ec + session29/l2_prefetch_side_stream_not_run.patch.
# Device carry [".deps"]; any H100 / H200.
#   1. build test_graph test_layer test_indexer bench_layer bench_gemm;
#   2. test_graph / test_layer / test_indexer quick (test_indexer: the score_tile mend ff7d4b2, not
#      GPU-run in session 29);
#   3. bench_layer batch 1 at 128K, tp 1 / 8, STEP5_BENCH_LAYER_SIDE=0 / 1 alternating, 3 rounds;
#   4. session29/call5.sh's Nsight Compute durations of the o_proj tp 8 T = 1 rows (peer, kAuto).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_graph test_layer test_indexer bench_layer bench_gemm > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE "error|spill" $O/l/build.log | head -5
for t in test_graph test_layer test_indexer; do
  STEP5_GPU_TEST_QUICK=1 timeout 150 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed.*failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED|ERROR' $O/l/$t.txt | head -6 | cut -c1-200
done; pack
F='^layer/step5_preview/tp:(1|8)/tokens:1/ctx:131072/'
for r in 1 2 3; do for side in 0 1; do
  STEP5_BENCH_LAYER_SIDE=$side timeout 60 build-device/bench/bench_layer --benchmark_filter="$F" > $O/l/layer_side${side}_r$r.txt 2>&1
  echo "$(el) side=$side round $r rc=$? $(grep -E '^layer/' $O/l/layer_side${side}_r$r.txt | grep -v iterations | awk '{printf "%s eager %s graph %s | ", substr($1, 21, 4), $2, $5}')"
  grep -E "^layer/" $O/l/layer_side${side}_r$r.txt | grep iterations | awk '{s=substr($1, 21, 4); for (i = 2; i <= NF; i++) if ($i ~ /^(o_proj_gemm_us|select_us|prepare_us|attention_us)=/) s = s " " $i; print "   " s}'
done; done; pack
for f in cublaslt gemm_auto; do
  timeout 60 bash tools/ncu_kernels.sh bench_gemm "^$f/o_proj/step5_preview/tp:8/tokens:1/" 0 120 > $O/l/ncu_$f.txt 2>&1
  echo "$(el) ncu $f rc=$?"; tail -n 6 $O/l/ncu_$f.txt | cut -c1-160
done
echo "$(el) done"; pack; rm -rf $O/l
