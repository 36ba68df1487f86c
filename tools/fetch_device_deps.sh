#!/usr/bin/env bash
# Downloads (here, where Debian's registry is reachable) the packages the GPU machine lacks into
# the git-ignored .deps/ folder; name .deps in the device tool's `carry`.
set -eu
mkdir -p .deps && cd .deps
apt-get download doctest-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev libcli11-dev \
  libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libopenblas0 libgfortran5
