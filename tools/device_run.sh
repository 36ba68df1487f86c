#!/usr/bin/env bash
# One call of the device tool (carry [".deps"]): builds the project on the GPU machine and runs
# the requested phases, each capped so that the whole call ends within $BUDGET seconds (default
# 570); logs and JSON go to $OUT; a short summary is printed last.
#   bash tools/device_run.sh build gpu multigpu driver sanitize bench
# Phases: build (all targets, or BUILD_TARGETS; sm_90a) | gpu (ctest -L gpu, capped at GPU_CAP
#   seconds, default 300: the whole label takes about 450 s on an H100, test_indexer alone 226 s,
#   so run it after the build in a call of its own on the same warm machine, `BUDGET=590
#   GPU_CAP=580 bash tools/device_run.sh gpu`; GPU_REGEX = ctest -R;
#   GPU_FILTER: instead only the cases whose name contains it, of the binaries in GPU_TESTS,
#   default test_indexer) |
#   multigpu (ctest -L multigpu) |
#   consumer (ctest -L consumer: the downstream projects, run on the GPU) |
#   driver (the README main command on the GPU, --check, --json) | sanitize (the gpu tests under
#   compute-sanitizer memcheck and racecheck, STEP5_GPU_TEST_QUICK=1; SAN_TESTS / SAN_ONLY select,
#   SAN_FILTER runs only the cases whose name contains it; SAN_PER_CASE=1 one run per case;
#   SAN_CAP seconds per run, default 150) | bench (every bench binary,
#   JSON per binary; BENCH_FILTER, or BENCH_FILTER_<binary> for one binary, limits them; BENCH_CAP
#   seconds per binary, default 150).
set -u
OUT=${OUT:-/tmp/step5-out}; mkdir -p "$OUT"
RES=$OUT          # JSON results come back as they are
OUT=$RES/logs     # logs are packed into logs.tgz at the end (the device tool returns <= 8 files)
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET=${BUDGET:-570}
B=build-device
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()
note() { summary+=("$*"); echo "== $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
for phase in "$@"; do
  case $phase in
    build)
      t=$(date +%s)
      do_build() { . tools/device_build.sh ${BUILD_TARGETS:-}; }   # BUILD_TARGETS unset: every target
      do_build > "$OUT/build.log" 2>&1
      cp $B.build.log "$OUT/build_full.log" 2>/dev/null
      # counted over the whole build log (build.log holds device_build.sh's first 60 matching lines)
      note "build: $(( $(date +%s) - t )) s, $(grep -E 'build exit code' "$OUT/build.log"), $(grep -c ' error' $B.build.log 2>/dev/null) error lines, $(grep -ci 'spill' $B.build.log 2>/dev/null) spill lines"
      ;;
    gpu|multigpu|consumer)
      if [ "$phase" = gpu ] && [ -n "${GPU_FILTER:-}" ]; then
        # only the cases whose name contains GPU_FILTER (the tests' argv[1]) of the binaries in
        # GPU_TESTS, run directly (ctest cannot select cases)
        for t in ${GPU_TESTS:-test_indexer}; do
          timeout "$(cap 300)" $B/tests/$t "$GPU_FILTER" > "$OUT/gpu_${t}_filtered.txt" 2>&1
          note "$t [$GPU_FILTER]: rc=$? $(grep -E 'passed, .* failed' "$OUT/gpu_${t}_filtered.txt" | tail -1)"
          grep -E "^\[FAIL\]" "$OUT/gpu_${t}_filtered.txt" | head -10
        done
        continue
      fi
      timeout "$(cap ${GPU_CAP:-300})" ctest --test-dir $B -L "^$phase\$" ${GPU_REGEX:+-R "$GPU_REGEX"} --output-on-failure -j1 > "$OUT/ctest_$phase.txt" 2>&1
      note "ctest -L $phase: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest_$phase.txt" | tail -1)"
      grep -E "\*\*\*Failed|Not Run|Timeout" "$OUT/ctest_$phase.txt" | head -20
      ;;
    driver)
      # The README main command on the GPU (the default), then --check runs: tp 1, tp 2 over NCCL
      # when two GPUs are present, tp 8 simulated on one GPU.
      timeout "$(cap 120)" $B/examples/step5_driver --backend cuda --cache-dir /tmp/step5-cache > "$OUT/driver.txt" 2>&1
      note "driver default (cuda): rc=$?"
      cat "$OUT/driver.txt" | grep -v "^\[step5\] \(prefill\|decode\) step"
      ngpu=$(nvidia-smi -L | wc -l)
      for args in "--tp 1" "--tp 2" "--tp 8 --simulate-tp"; do
        [ "$args" = "--tp 2" ] && [ "$ngpu" -lt 2 ] && continue
        tag=$(echo "$args" | tr -d ' -')
        timeout "$(cap 150)" $B/examples/step5_driver --backend cuda $args --check --json --cache-dir /tmp/step5-cache \
          > "$RES/driver_$tag.json" 2> "$OUT/driver_$tag.log"
        note "driver $args --check: rc=$? $(tr -d '\n ' < "$RES/driver_$tag.json" | grep -o '"check":{[^}]*}')"
      done
      ;;
    sanitize)
      for t in ${SAN_TESTS:-test_gemm test_attention test_indexer test_topk test_layer test_step_bounds}; do
        for tool in memcheck racecheck; do
          [ -n "${SAN_ONLY:-}" ] && [ "$SAN_ONLY" != "$t.$tool" ] && continue
          filter=""   # racecheck of the GEMM's wgmma pipeline is slow: its odd-shapes case runs every path
          [ "$t.$tool" = test_gemm.racecheck ] && filter="odd shapes"
          [ -n "${SAN_FILTER:-}" ] && filter=$SAN_FILTER   # a case-name substring (the tests' argv[1])
          if [ -n "${SAN_PER_CASE:-}" ] && [ -z "$filter" ]; then
            # one sanitizer run per case (each with its own SAN_CAP), so that a slow case does not
            # hide the others: the names come from `<test> --list`
            i=0
            while IFS= read -r case_name; do
              i=$((i + 1))
              STEP5_GPU_TEST_QUICK=1 timeout "$(cap ${SAN_CAP:-150})" compute-sanitizer --tool $tool --error-exitcode 9 \
                $B/tests/$t "$case_name" > "$OUT/san_${t}_${tool}_$i.txt" 2>&1
              note "sanitize $t $tool [$case_name]: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${t}_${tool}_$i.txt" | tail -1) | $(grep -E 'passed, .* failed' "$OUT/san_${t}_${tool}_$i.txt" | tail -1)"
            done < <($B/tests/$t --list)
            continue
          fi
          STEP5_GPU_TEST_QUICK=1 timeout "$(cap ${SAN_CAP:-150})" compute-sanitizer --tool $tool --error-exitcode 9 \
            $B/tests/$t ${filter:+"$filter"} > "$OUT/san_${t}_$tool.txt" 2>&1
          note "sanitize $t $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${t}_$tool.txt" | tail -1) | $(grep -E 'passed, .* failed' "$OUT/san_${t}_$tool.txt" | tail -1)"
        done
      done
      ;;
    bench)
      for b in ${BENCH_ONLY:-bench_layer bench_gemm bench_attention bench_indexer}; do
        [ -x $B/bench/$b ] || { note "$b: not built"; continue; }
        f=BENCH_FILTER_$b; f=${!f:-${BENCH_FILTER:-.}}   # BENCH_FILTER_<binary> overrides BENCH_FILTER
        timeout "$(cap ${BENCH_CAP:-150})" $B/bench/$b --benchmark_filter="$f" \
          --benchmark_out="$RES/$b.json" --benchmark_out_format=json > "$OUT/$b.txt" 2>&1
        note "$b: rc=$?"
        tail -25 "$OUT/$b.txt"
      done
      ;;
    *) note "unknown phase $phase" ;;
  esac
done
tar -czf "$RES/logs.tgz" -C "$RES" logs && rm -rf "$RES/logs"
echo "---------------- summary ($(( $(date +%s) - T0 )) s)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
printf '%s\n' "${summary[@]}"
