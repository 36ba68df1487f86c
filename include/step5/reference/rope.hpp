#pragma once
/// \file step5/reference/rope.hpp
/// The NeoX rotation of SPEC.md §4.2–4.3 (golden manifest "semantics.main_qk") on the RoPE tables
/// of step5/model/rope.hpp. Host-safe (g++).
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/model/rope.hpp"
#include "step5/reference/common.hpp"

namespace step5::reference {

// The tables are the library's model types (step5/model/rope.hpp); these aliases keep the
// reference's spelling (`reference::RopeTable`, ...) for its callers.
using model::Llama3Scaling;
using model::make_rope_table;
using model::rope_inv_freq;
using model::RopeTable;

/// NeoX rotation in place of the first `rot` dims of one head `x` (values already bf16-rounded,
/// held as fp32): for i < rot/2, a = x[i], b = x[i + rot/2]:
///   a' = bf16(a·cos − b·sin)  (two fp32 products, one fp32 subtraction)
///   b' = bf16(fma(a, sin, b·cos))
/// (golden "semantics.main_qk"; SPEC §4.2). Dims >= rot are untouched.
inline void apply_neox_rope(float* x, int rot, const bf16* cos_row, const bf16* sin_row) {
  const int half = rot / 2;
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    const float c = to_float(cos_row[i]), s = to_float(sin_row[i]);
    const float ac = a * c, bs = b * s, bc = b * c;
    x[i] = round_bf16(ac - bs);
    x[i + half] = round_bf16(std::fma(a, s, bc));
  }
}

}  // namespace step5::reference
