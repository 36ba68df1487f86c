#!/usr/bin/env bash
# Forty-fourth session, call 2 (device, carry [".deps"]): the warp-row top-k with the experiment
# switches of the working tree (launch_topk: STEP5_EXP_TOPK_MODE 0 = main's rule, no automatic warp
# rows; 1 = warp rows staged through registers (call 1's kernel, now at 48 registers); 2 (default) =
# warp rows staged by one bulk copy per row; STEP5_EXP_TOPK_WARP_MAXLD = the automatic warp rows'
# longest ld, default kTopkWarpMaxLd = 4096). Sides: A mode 0, B mode 1, C mode 2, D mode 2 with
# max ld 2048.
#   1. build test_topk, test_indexer, test_layer, test_graph, bench_indexer, bench_layer
#   2. test_topk (every case; the forced warp rows take the bulk staging), test_indexer / test_layer /
#      test_graph quick (the automatic warp rows inside indexer_select and the layer)
#   3. bench_indexer: the prefill-shaped top-k rows and indexer_prefill, sides A B C (2 rounds)
#   4. bench_layer prefill rows, sides A B C D (3 rounds): layer_us, select_us
#   5. compute-sanitizer memcheck and racecheck of test_topk's prefill-shaped case (quick)
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/ab $O/abl $O/logs; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - T0) )); }
side_env() { case $1 in A) echo "STEP5_EXP_TOPK_MODE=0";; B) echo "STEP5_EXP_TOPK_MODE=1";; C) echo "STEP5_EXP_TOPK_MODE=2";;
  D) echo "STEP5_EXP_TOPK_MODE=2 STEP5_EXP_TOPK_WARP_MAXLD=2048";; esac; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
. tools/device_build.sh test_topk test_indexer test_layer test_graph bench_indexer bench_layer > $O/logs/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/logs/build.log); spill lines: $(grep -ci spill build-device.build.log)"
grep -A3 "topk_warp_rows" build-device.build.log | grep -E "registers|spill" | head -6
timeout 100 build-device/tests/test_topk > $O/logs/test_topk.txt 2>&1
echo "$(el) test_topk rc=$? $(grep -E 'passed, .* failed' $O/logs/test_topk.txt | tail -1)"; grep -E "FAIL" $O/logs/test_topk.txt | head -8
for t in test_indexer test_layer test_graph; do
  [ $(left) -gt 330 ] || { echo "skip $t: time"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout 80 build-device/tests/$t > $O/logs/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/logs/$t.txt | tail -1)"; grep -E "FAIL" $O/logs/$t.txt | head -5
done
B=build-device/bench/bench_indexer
F='^(copy/d2d|topk/(ours|radix_cta(32|128))/rows:[0-9]+/ld:|indexer_prefill/step5_preview/tp:1/tokens:(4096|16384)/ctx:(0|32768))'
for i in 1 2; do for side in A B C; do
  [ $(left) -gt 200 ] || { echo "skip indexer $side $i: time"; continue; }
  env $(side_env $side) timeout 60 $B --benchmark_filter="$F" --benchmark_out=$O/ab/side${side}_$i.json --benchmark_out_format=json > $O/logs/indexer_${side}_$i.txt 2>&1 || echo "indexer $side $i rc=$?"
done; echo "$(el) indexer round $i"; done
python3 tools/ab_medians.py $O/ab sideA sideB sideC
L=build-device/bench/bench_layer
FL='^layer/step5_preview/tp:(1|8)/tokens:(8192|32768)/ctx:0'
for i in 1 2 3; do for side in A B C D; do
  [ $(left) -gt 90 ] || { echo "skip layer $side $i: time"; continue; }
  env $(side_env $side) timeout 60 $L --benchmark_filter="$FL" --benchmark_out=$O/abl/side${side}_$i.json --benchmark_out_format=json > $O/logs/layer_${side}_$i.txt 2>&1 || echo "layer $side $i rc=$?"
done; echo "$(el) layer round $i"; done
python3 tools/ab_medians.py --counter layer_us --counter select_us --counter select_x_floor $O/abl sideA sideB sideC sideD
for tool in memcheck racecheck; do
  [ $(left) -gt 40 ] || { echo "skip $tool: time"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 15 )) /usr/local/cuda/bin/compute-sanitizer --tool $tool build-device/tests/test_topk "prefill-shaped" > $O/logs/san_$tool.txt 2>&1
  echo "$(el) $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/logs/san_$tool.txt | tail -1) $(grep -E 'passed, .* failed' $O/logs/san_$tool.txt | tail -1)"
done
tar -czf $O/logs.tgz -C $O logs && rm -rf $O/logs
echo "$(el) all done"
