#!/usr/bin/env bash
# Thirty-eighth session, call 1 (xbufs.patch + exp_xbufs.patch applied here first; carry [".deps"]):
# builds test_gemm, bench_gemm, test_attention and test_topk, runs session36/next_call.sh (NB = 2 /
# 3 tests, racecheck, bench_gemm T = 4 / 8 / 16 at tp 1 / 2 / 4 / 8), then test_attention's and
# test_topk's quick cases (the gate-alignment precondition case of the thirty-seventh session and
# the kTopkMaxLd refusal of this session's audit, f5ba3db: compiled, never run). About 450 s.
# Not run in the thirty-eighth session: every machine start failed or was refused (the whole
# 1800 s went on them), as in the thirty-seventh. Run it first next time, as it stands.
set -u
O=${OUT:-/tmp/o}; mkdir -p $O/l; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
. tools/device_build.sh test_gemm bench_gemm test_attention test_topk > $O/l/build0.log 2>&1
echo "$(el) build: $(tail -n 1 $O/l/build0.log)"
bash bench/results/2026-12-06/session36/next_call.sh
STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_attention > $O/l/test_attention.txt 2>&1; rc=$?
echo "$(el) test_attention rc=$rc $(grep -E 'passed, .* failed' $O/l/test_attention.txt | tail -1)"; grep -E "ERROR|FAIL" $O/l/test_attention.txt | head -8
STEP5_GPU_TEST_QUICK=1 timeout 120 build-device/tests/test_topk > $O/l/test_topk.txt 2>&1; rc=$?
echo "$(el) test_topk rc=$rc $(grep -E 'passed, .* failed' $O/l/test_topk.txt | tail -1)"; grep -E "ERROR|FAIL" $O/l/test_topk.txt | head -8
echo "$(el) all done"
