#!/usr/bin/env bash
# The twenty-seventh session's first GPU call (written then, not run: no device was lent that
# session). Run it on branch session27-exp (main + branches gemv-mma and decode-early-loads, not
# yet on main). Here first: git checkout session27-exp && bash tools/device_ab.sh prepare main;
# device carry [".deps", "build-abold"]; about 560 s; any H100/H200 (every ratio is within one
# binary or one A/B call).
#   1. builds: the tests below, bench_attention, bench_gemm (working tree) and main's
#      bench_attention (build-abold), in parallel;
#   2. quick GPU tests of every kernel the branches touch against the CPU reference: test_attention
#      (the early decode loads, the shifted device cu_seqlens_q case), test_indexer (scores and
#      prepare with the request guess), test_topk (indexer-mode rows), test_gemm (both kGemv kernels
#      forced, T = 1..16), test_layer (the step, golden cases);
#   3. bench_attention decode A/B against main (one round trip less per launch);
#   4. bench_gemm kGemv rows against cuBLASLt and copy (T = 1, 4, 8, 16);
#   5. memcheck of test_gemm's odd shapes (ragged N and K), if time is left.
# Then next_call2.sh (bench_layer and bench_indexer A/B), and the twenty-sixth session's
# next_call.sh (H200 tables, racecheck).
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
{ git rev-parse HEAD; cat build-abold/COMMIT; } > $O/l/commits.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_attention) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh test_attention test_indexer test_topk test_gemm test_layer bench_attention bench_gemm > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log)"
for t in test_attention test_indexer test_topk test_gemm test_layer; do
  [ "$(left)" -gt 200 ] || { echo "$(el) $t skipped (time)"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout 90 build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -6 | cut -c1-200; pack
done
grep -E "gemv" $O/l/test_gemm.txt | head -24 | cut -c1-150
OUT=$O/l/ab timeout $(( $(left) - 110 < 100 ? $(left) - 110 : 100 )) bash tools/device_ab.sh run bench_attention '^(copy|attention/decode/(step5_preview/tp:(1|8)|dsa_h64_kv8_d128/tp:1)/batch:(1|8|32)/ctx:131072)' 2 > $O/l/ab_attention.txt 2>&1
rc=$?; echo "$(el) bench_attention A/B rc=$rc"; grep -E "attention/|copy" $O/l/ab_attention.txt; pack
timeout $(( $(left) - 40 < 80 ? $(left) - 40 : 80 )) build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm_gemv|gemm_gemv_mma|gemm_auto)/.*(tokens:(1|4|8|16)/|d2d)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1
echo "$(el) bench_gemm rc=$?"; grep -E "^(copy|cublaslt|gemm_gemv|gemm_auto)" $O/l/bench_gemm.txt | awk '{print $1, $4, $NF}' | cut -c1-150; pack
[ "$(left)" -gt 30 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_gemm "odd shapes" > $O/l/memcheck_gemm_odd.txt 2>&1; echo "$(el) memcheck test_gemm odd shapes rc=$? $(grep -E 'ERROR SUMMARY' $O/l/memcheck_gemm_odd.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/memcheck_gemm_odd.txt | tail -n 1)"; pack; }
echo "$(el) done"; pack; rm -rf $O/l
