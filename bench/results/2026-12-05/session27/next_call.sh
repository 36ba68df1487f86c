#!/usr/bin/env bash
# The twenty-seventh session's first GPU call (written then, not run: no device was lent that
# session): the GPU tests of branch session27-exp (main + branches gemv-mma and
# decode-early-loads, not yet on main). Here first: git checkout session27-exp; device carry
# [".deps"]; about 560 s; any H100/H200.
#   1. builds the five test binaries below;
#   2. quick GPU tests of every kernel the branches touch, against the CPU reference: test_gemm
#      (both kGemv kernels forced, T = 1..16, odd shapes, refusals, bit-identity with noise),
#      test_attention (the early decode loads; the shifted device cu_seqlens_q case), test_indexer
#      (scores and prepare with the request guess), test_topk (indexer-mode rows), test_layer (the
#      step, golden cases); main's e034ff7 / fe2e3e0 (never run) with them;
#   3. memcheck of test_gemm's odd shapes (ragged N and K, T = 2 at the shared-memory limit).
# Then next_call2.sh (the measurements), then the twenty-sixth session's next_call.sh.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
pack() { tar -czf $O/logs.tgz -C $O l 2>/dev/null; }
left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $O/l/gpu.txt
git rev-parse HEAD > $O/l/commit.txt
. tools/device_build.sh test_gemm test_attention test_indexer test_topk test_layer > $O/l/build.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build.log)"
for t in test_gemm test_attention test_indexer test_topk test_layer; do
  [ "$(left)" -gt 60 ] || { echo "$(el) $t skipped (time)"; continue; }
  STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 40 < 90 ? $(left) - 40 : 90 )) build-device/tests/$t > $O/l/$t.txt 2>&1
  rc=$?; echo "$(el) $t quick rc=$rc $(grep -E 'passed, .* failed' $O/l/$t.txt | tail -n 1)"; grep -E '^\[FAIL\]' $O/l/$t.txt | head -6 | cut -c1-200; pack
done
grep -E "gemv" $O/l/test_gemm.txt | head -30 | cut -c1-150
[ "$(left)" -gt 30 ] && { STEP5_GPU_TEST_QUICK=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 build-device/tests/test_gemm "odd shapes" > $O/l/memcheck_gemm_odd.txt 2>&1; echo "$(el) memcheck test_gemm odd shapes rc=$? $(grep -E 'ERROR SUMMARY' $O/l/memcheck_gemm_odd.txt | tail -n 1) | $(grep -E 'passed, .* failed' $O/l/memcheck_gemm_odd.txt | tail -n 1)"; pack; }
echo "$(el) done"; pack; rm -rf $O/l
