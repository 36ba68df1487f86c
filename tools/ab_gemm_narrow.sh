#!/usr/bin/env bash
# Issue 14 §1 (narrow tp 8 fused GEMM, T = 64..256): one device call (carry [".deps"]) that builds
# test_gemm + bench_gemm, runs the wgmma GEMM tests, the bench rows of the tp 8 shapes, and a sweep
# of every wgmma tile kind × forced split factor through the bench's env knobs
# (STEP5_BENCH_GEMM_CONFIG = kind + 1, STEP5_BENCH_GEMM_SPLIT_K = splits). Prints compact lines.
#   bash tools/ab_gemm_narrow.sh [build] [test] [rows] [sweep]     (default: all four)
# Env: SWEEP_KINDS (configs, default "1 4 5 6"), SWEEP_SPLITS (default "1 2 3 4 5 6 7 8 9 10 12 16"),
#      SWEEP_T (default "64|128"), TEST_FILTER (test_gemm case-name substring, default "wgmma"),
#      ROWS_SHAPES / ROWS_T (the rows phase's shape and token regexes).
set -u
OUT=${OUT:-/tmp/step5-out}; mkdir -p "$OUT"
B=build-device
phases=${*:-build test rows sweep}
shapes='(step5_preview|dsa_h64_kv8_d128)/tp:8'
for ph in $phases; do
  case $ph in
    build)
      . tools/device_build.sh test_gemm bench_gemm > "$OUT/build.log" 2>&1
      tail -3 "$OUT/build.log" ;;
    test)
      timeout ${TEST_CAP:-240} $B/tests/test_gemm "${TEST_FILTER:-wgmma}" > "$OUT/test_gemm.txt" 2>&1
      echo "test_gemm rc=$?"; grep -E "FAIL|passed|failed|error" "$OUT/test_gemm.txt" | grep -v " ok$" | head -30 ;;
    rows)
      $B/bench/bench_gemm --benchmark_filter="^(cublaslt|gemm|gemm_wgmma[a-z0-9]*|gemm_wgmma_sk[0-9]+)/(${ROWS_SHAPES:-$shapes})/tokens:(${ROWS_T:-64|128|256})/" \
        > "$OUT/bench_rows.txt" 2>&1
      grep -E "^cublaslt_algo|manual_time" "$OUT/bench_rows.txt" | sed -E 's/\/min_time:0.020\/manual_time//; s/ +[0-9.]+ us +[0-9]+ +/  /' ;;
    sweep)
      for c in ${SWEEP_KINDS:-1 4 5 6}; do
        for s in ${SWEEP_SPLITS:-1 2 3 4 5 6 7 8 9 10 12 16}; do
          STEP5_BENCH_GEMM_CONFIG=$c STEP5_BENCH_GEMM_SPLIT_K=$s $B/bench/bench_gemm \
            --benchmark_filter="^gemm/$shapes/tokens:(${SWEEP_T:-64|128})/" 2>&1 |
            grep manual_time | sed -E "s/\/min_time:0.020\/manual_time//; s/^/c$c s$s /; s/TFLOP.*x_cublasLt=/xLt=/"
        done
      done > "$OUT/sweep.txt"
      cat "$OUT/sweep.txt" ;;
  esac
done
