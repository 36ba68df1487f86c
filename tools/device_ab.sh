#!/usr/bin/env bash
# A/B of one benchmark binary between an older tree and the working tree, in one device call.
#   here:   bash tools/device_ab.sh prepare <commit>      # the old tree into build-abold/src (git-ignored)
#   device: bash tools/device_ab.sh run <bench binary> '<benchmark filter>' [rounds]
#           (carry [".deps", "build-abold"]; the filter must not end with '$': Google Benchmark
#           appends /iterations:N/manual_time to the names)
# `run` builds <bench binary> from both trees (tools/device_build.sh; old in build-abold/build,
# new in build-device), then runs old, new, old, new, ... `rounds` times each (default 3) with the
# same filter and environment, and prints per benchmark the median real time of each side and
# new/old. JSON of every run goes to $OUT/ab/.
set -u
cmd=${1:?prepare|run}
shift
case $cmd in
  prepare)
    commit=${1:?commit}
    rm -rf build-abold && mkdir -p build-abold/src
    # the build needs no recorded results (bench/results: about half the tree), and the device
    # tool's carry is 64 MiB in all
    git archive "$commit" -- . ':(exclude)bench/results' | tar -x -C build-abold/src
    git rev-parse "$commit" > build-abold/COMMIT
    echo "build-abold/src = $(cat build-abold/COMMIT)"
    ;;
  run)
    bin=${1:?bench binary} filter=${2:?filter} rounds=${3:-3}
    OUT=${OUT:-/tmp/step5-out}
    mkdir -p "$OUT/ab"
    root=$PWD
    (cd build-abold/src && cp -r "$root/.deps" . 2>/dev/null; BUILD_DIR="$root/build-abold/build" . tools/device_build.sh "$bin") > "$OUT/ab/build_old.log" 2>&1
    . tools/device_build.sh "$bin" > "$OUT/ab/build_new.log" 2>&1   # sourced: keeps LD_LIBRARY_PATH
    for f in "$OUT/ab/build_old.log" "$OUT/ab/build_new.log"; do echo "$f: $(tail -n 1 "$f")"; done
    for i in $(seq 1 "$rounds"); do
      for side in old new; do
        b=build-device/bench/$bin
        [ $side = old ] && b=build-abold/build/bench/$bin
        "$b" --benchmark_filter="$filter" --benchmark_out="$OUT/ab/${side}_$i.json" --benchmark_out_format=json > /dev/null 2>&1 ||
          echo "$side round $i: rc=$?"
      done
    done
    python3 tools/ab_medians.py "$OUT/ab" old new
    ;;
  *) echo "usage: $0 prepare <commit> | run <bench binary> <filter> [rounds]"; exit 2 ;;
esac
