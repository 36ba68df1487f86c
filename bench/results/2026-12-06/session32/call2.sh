#!/usr/bin/env bash
# Thirty-second session, call 2: the weight-ring kGemv with per-thread stage releases, and kAuto
# taking it at T = 1 on weights >= 8 MiB (working tree), against 9fcab58 (build-abold).
# Carry [".deps", "build-abold"].
#   1. build test_gemm, test_layer, test_graph, bench_gemm, bench_layer; test_gemm full, test_layer
#      and test_graph quick; racecheck of test_gemm's gemv repeat case, memcheck of its odd shapes;
#   2. bench_gemm (new tree, once): T = 1 at tp 2, 4, 16 (the rule's other weights);
#   3. A/B bench_layer (3 rounds): decode batch 1 at 32K and 128K, tp 1 and 8.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( 585 - ($(date +%s) - T0) )); }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $O/l/gpu.txt
. tools/device_build.sh test_gemm test_graph test_layer bench_gemm bench_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"; grep -iE " error|spill" $O/l/build.log | head
timeout 100 build-device/tests/test_gemm > $O/l/test_gemm.txt 2>&1
echo "$(el) test_gemm full rc=$? $(grep -E 'passed, .* failed' $O/l/test_gemm.txt | tail -1)"; grep -E "FAIL" $O/l/test_gemm.txt | head -8
for t in test_layer test_graph; do
  STEP5_GPU_TEST_QUICK=1 timeout 60 build-device/tests/$t > $O/l/$t.txt 2>&1
  echo "$(el) $t quick rc=$? $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -1)"; grep -E "FAIL" $O/l/$t.txt | head -5
done
STEP5_GPU_TEST_QUICK=1 timeout 70 compute-sanitizer --tool racecheck --error-exitcode 9 build-device/tests/test_gemm "gemv bit-identical" > $O/l/san_racecheck.txt 2>&1
echo "$(el) racecheck test_gemm [gemv bit-identical] rc=$? $(grep -E 'passed, .* failed' $O/l/san_racecheck.txt | tail -1) $(grep -E 'RACECHECK SUMMARY' $O/l/san_racecheck.txt | tail -1)"
STEP5_GPU_TEST_QUICK=1 timeout 30 compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_gemm "odd shapes" > $O/l/san_memcheck.txt 2>&1
echo "$(el) memcheck test_gemm [odd shapes] rc=$? $(grep -E 'passed, .* failed' $O/l/san_memcheck.txt | tail -1) $(grep -E 'ERROR SUMMARY' $O/l/san_memcheck.txt | tail -1)"
pack
timeout 80 build-device/bench/bench_gemm --benchmark_filter='^(copy|((gemm_gemv|gemm_auto|cublaslt)/(o_proj/)?[a-z0-9_]+/tp:(2|4|16)/tokens:1/))' --benchmark_out=$O/l/gemm_tp2416.json --benchmark_out_format=json > $O/l/gemm_tp2416.txt 2>&1
echo "$(el) bench_gemm tp 2/4/16 rc=$?"; grep -E "^(gemm_gemv|gemm_auto|cublaslt|copy)" $O/l/gemm_tp2416.txt | awk '{print $1, $2, $3}' | head -40
pack
OUT=$O/l/abl timeout $(( $(left) )) bash tools/device_ab.sh run bench_layer '^layer/step5_preview/tp:(1|8)/tokens:1/ctx:(32768|131072)/' 3 > $O/l/ab_layer.txt 2>&1
echo "$(el) A/B bench_layer rc=$?"; cut -c1-110 $O/l/ab_layer.txt
python3 - $O/l/abl <<'PY' 2>/dev/null
import json, glob, sys
for side in ("old", "new"):
    rows = {}
    for f in sorted(glob.glob(f"{sys.argv[1]}/ab/{side}_*.json")):
        for b in json.load(open(f)).get("benchmarks", []):
            n = b["name"].split("/iterations:")[0]
            rows.setdefault(n, []).append((b.get("graph_us", 0), b.get("layer_us", 0), b.get("fused_gemm_us", 0), b.get("o_proj_gemm_us", 0)))
    for n, v in rows.items():
        print(side, n, "graph", ["%.1f" % x[0] for x in v], "eager", ["%.1f" % x[1] for x in v], "gemm", ["%.1f" % x[2] for x in v], "o_proj", ["%.1f" % x[3] for x in v])
PY
echo "$(el) done"; pack; rm -rf $O/l
