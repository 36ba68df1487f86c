#!/usr/bin/env bash
# One device call: build everything on the GPU machine, run the gpu tests (plain, then under
# compute-sanitizer memcheck/racecheck when SANITIZE=1), the benchmarks (JSON into $OUT), and
# the driver on the GPU; prints a short summary last.  Usage (device tool, carry [".deps"]):
#   bash tools/gpu_all.sh [bench-filter-regex]
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. tools/device_build.sh > "$OUT/build.txt" 2>&1
echo "build: $(grep -c 'error' "$OUT/build.txt") error lines"; grep -E "error" "$OUT/build.txt" | head -20
B=build-device
summary=()
for t in $B/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  timeout 300 "$t" > "$OUT/$name.txt" 2>&1; rc=$?
  summary+=("$name rc=$rc $(tail -1 "$OUT/$name.txt")")
done
if [ "${SANITIZE:-0}" = 1 ]; then
  for t in $B/tests/test_*; do
    name=$(basename "$t")
    for tool in memcheck racecheck; do
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$t" ${SAN_FILTER:-} > "$OUT/$name.$tool.txt" 2>&1
      summary+=("$name $tool rc=$? $(grep -E 'ERROR SUMMARY|passed' "$OUT/$name.$tool.txt" | tail -1)")
    done
  done
fi
for b in $B/bench/bench_*; do
  [ -x "$b" ] || continue
  name=$(basename "$b")
  timeout 240 "$b" --benchmark_filter="${1:-.}" --benchmark_out="$OUT/$name.json" --benchmark_out_format=json \
    > "$OUT/$name.txt" 2>&1
  summary+=("$name rc=$?")
done
printf '%s\n' "${summary[@]}"
