#!/usr/bin/env bash
# Builds the project on the GPU machine (no package registry there): unpacks the Debian packages
# carried in .deps/ (fetched here with tools/fetch_device_deps.sh) into /tmp/deps, configures a
# Release build for sm_90a in ${BUILD_DIR:-build-device} and builds the given targets (all when
# none). Source it (". tools/device_build.sh [targets]") to keep LD_LIBRARY_PATH for the runs.
# STEP5_DEVICE_CUDA_FLAGS (optional) sets CMAKE_CUDA_FLAGS, e.g. "-lineinfo" so that
# compute-sanitizer (racecheck, memcheck) names source lines instead of SASS offsets.
set -u
DEPS=/tmp/deps
if [ ! -d "$DEPS/usr" ]; then
  for f in .deps/*.deb; do dpkg -x "$f" "$DEPS"; done
fi
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu/openblas-pthread:$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH=/usr/local/cuda/bin:$PATH
BUILD_DIR=${BUILD_DIR:-build-device}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" \
  -DBLAS_LIBRARIES="$DEPS/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so" \
  -DBLAS_FOUND=TRUE ${STEP5_DEVICE_CUDA_FLAGS:+-DCMAKE_CUDA_FLAGS="$STEP5_DEVICE_CUDA_FLAGS"} ${CMAKE_EXTRA:-} > "$BUILD_DIR.configure.log" 2>&1 || { tail -30 "$BUILD_DIR.configure.log"; return 1 2>/dev/null || exit 1; }
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}" > "$BUILD_DIR.build.log" 2>&1
build_rc=$?
grep -E "error|warning|spill|Error" "$BUILD_DIR.build.log" | head -60
echo "build exit code: $build_rc (full log: $BUILD_DIR.build.log)"
