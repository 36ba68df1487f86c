#!/usr/bin/env bash
# The twenty-seventh session's second GPU call (written then, not run): the measurements of branch
# session27-exp against main, after next_call.sh passed. Here first: git checkout session27-exp &&
# bash tools/device_ab.sh prepare main; device carry [".deps", "build-abold"]; about 560 s; any
# H100/H200 (every ratio is within one binary or one A/B call).
#   1. builds: bench_gemm, bench_attention, bench_layer (working tree) and main's bench_attention,
#      bench_layer (build-abold), in parallel;
#   2. bench_gemm at T = 1, 4, 8, 16: the kGemv rows (T = 1 both kernels) against cuBLASLt, kAuto
#      and copy, for the fused projections and the o_proj shapes (o_proj/<geometry>/... rows);
#   3. bench_attention decode A/B (the one-query instance's early loads);
#   4. bench_layer decode A/B, batch 1 and 16 at 32K / 128K, tp 1 / 8 (every early load of the
#      decode chain together: attention, scores, top-k, prepare).
set -u
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
{ git rev-parse HEAD; cat build-abold/COMMIT; } > $O/l/commits.txt
(cd build-abold/src && cp -r $R/.deps . && BUILD_DIR=$R/build-abold/build . tools/device_build.sh bench_attention bench_layer) > $O/l/old_build.log 2>&1 &
OLD=$!
. tools/device_build.sh bench_gemm bench_attention bench_layer > $O/l/build.log 2>&1
wait $OLD
echo "$(el) builds: new $(tail -n 1 $O/l/build.log); old $(tail -n 1 $O/l/old_build.log)"
timeout 120 build-device/bench/bench_gemm --benchmark_filter='^(copy|cublaslt|gemm|gemm_gemv|gemm_gemv_mma|gemm_auto)/.*(tokens:(1|4|8|16)/|d2d)' --benchmark_out=$O/l/bench_gemm.json --benchmark_out_format=json > $O/l/bench_gemm.txt 2>&1
echo "$(el) bench_gemm rc=$?"; grep -E "^(copy|cublaslt|gemm)" $O/l/bench_gemm.txt | awk '{print $1, $4, $NF}' | cut -c1-150; pack
OUT=$O/l/ab timeout 90 bash tools/device_ab.sh run bench_attention '^(copy|attention/decode/(step5_preview/tp:(1|8)|dsa_h64_kv8_d128/tp:1)/batch:(1|8|32)/ctx:131072)' 2 > $O/l/ab_attention.txt 2>&1
rc=$?; echo "$(el) bench_attention A/B rc=$rc"; grep -E "attention/|copy" $O/l/ab_attention.txt; pack
OUT=$O/l/ab2 timeout $(( $(left) - 15 < 200 ? $(left) - 15 : 200 )) bash tools/device_ab.sh run bench_layer '^(copy|layer/.*/tokens:(1|16)/)' 2 > $O/l/ab_layer.txt 2>&1
rc=$?; echo "$(el) bench_layer A/B rc=$rc"; grep -E "layer/|copy" $O/l/ab_layer.txt; pack
echo "$(el) done"; pack; rm -rf $O/l
