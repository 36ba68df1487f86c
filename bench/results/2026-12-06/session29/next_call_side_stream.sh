#!/usr/bin/env bash
# Written in the twenty-ninth session, not run. Here first: git apply
# bench/results/2026-12-06/session29/l2_prefetch_side_stream_not_run.patch (the L2 prefetches on a
# side stream, ops::DsaLayerSideStream). Device carry [".deps"]; any H100 / H200 (about 250 s).
#   1. builds test_graph, test_layer, bench_layer;
#   2. test_graph quick (six paths: the side stream eager and captured must equal the baseline bit
#      for bit; one prefetch node without a programmatic edge; the refusals), test_layer quick;
#   3. bench_layer decode batch 1 at 128K, tp 1 / 8: STEP5_BENCH_LAYER_SIDE=0 / 1 alternating in one
#      binary, three rounds (graph_us is the figure: does the chain get the o_proj and selection
#      gains without the prepare cost?).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_graph test_layer bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE "error|spill" $O/l/build.log | head -5
for t in test_graph test_layer; do
  STEP5_GPU_TEST_QUICK=1 timeout 100 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]|FAILED|side stream' $O/l/$t.txt | head -6 | cut -c1-200
done
F='^layer/step5_preview/tp:(1|8)/tokens:1/ctx:131072/'
for r in 1 2 3; do for side in 0 1; do
  STEP5_BENCH_LAYER_SIDE=$side timeout 60 build-device/bench/bench_layer --benchmark_filter="$F" > $O/l/layer_side${side}_r$r.txt 2>&1
  echo "$(el) side=$side round $r rc=$? $(grep -E '^layer/' $O/l/layer_side${side}_r$r.txt | grep -v iterations | awk '{printf "%s eager %s graph %s | ", substr($1, 21, 4), $2, $5}')"
  grep -E "^layer/" $O/l/layer_side${side}_r$r.txt | grep iterations | awk '{s=substr($1, 21, 4); for (i = 2; i <= NF; i++) if ($i ~ /^(o_proj_gemm_us|select_us|prepare_us)=/) s = s " " $i; print "   " s}'
done; done
tar -czf $O/logs.tgz -C $O l; rm -rf $O/l; echo "$(el) done"
