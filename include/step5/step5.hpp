#pragma once
/// \file step5/step5.hpp
/// Umbrella of the host-safe headers (compile with g++ alone): status, numeric types, the
/// geometry list, compile-time and run-time parallel layouts. Device code lives in
/// step5/kernels/sm90/*.cuh; launchers in step5/ops/*.hpp; NCCL wrappers in step5/comm/*.hpp.
#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/layout/static_layout.hpp"
