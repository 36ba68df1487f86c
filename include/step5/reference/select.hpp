#pragma once
/// \file step5/reference/select.hpp
/// Deterministic top-k region selection of SPEC.md §4.6 (golden "semantics.selection").
/// Host-safe (g++).
///
/// Order: a region ranks above another when its score is greater; NaN ranks above every number
/// (+inf included; all NaNs are equal); −0 == +0; equal scores rank by lower region id. The top
/// `n = min(topk, num_history)` are emitted in ascending id order, then the current region, then
/// −1 padding up to `topk + 1` entries; `count = n + 1`.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "step5/reference/common.hpp"

namespace step5::reference {

using layout::kMaxTopk;  ///< SPEC §1: 1 <= topk <= 1024 (step5/layout/geometry.hpp)

/// True when (score a, id ia) ranks strictly above (score b, id ib) in the order above.
inline bool ranks_above(float a, int ia, float b, int ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;  // -0 == +0 compares equal here
  return ia < ib;
}

/// Selection of one (token, group) row (SPEC §4.6): `scores [num_history]` of the history
/// regions 0..num_history-1 (= p/8 for a token at position p), `current_region` (= p/8).
/// Writes `out_row [topk + 1]` and returns the count `min(topk, num_history) + 1`.
/// Throws when topk is outside [1, 1024] or num_history < 0.
inline int select_row(const float* scores, int num_history, int topk, int current_region, std::int32_t* out_row) {
  if (const Status st = ops::check_topk("select_row", topk); !st.ok()) throw Error(st);
  require(num_history >= 0, "select_row", "num_history = " + std::to_string(num_history) + ", expected >= 0");
  const int n = std::min(topk, num_history);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_history));
  std::iota(ids.begin(), ids.end(), 0);
  auto cmp = [&](std::int32_t x, std::int32_t y) { return ranks_above(scores[x], x, scores[y], y); };
  if (n < num_history) std::nth_element(ids.begin(), ids.begin() + n, ids.end(), cmp);
  std::sort(ids.begin(), ids.begin() + n);
  for (int i = 0; i < n; ++i) out_row[i] = ids[i];
  out_row[n] = current_region;
  for (int i = n + 1; i <= topk; ++i) out_row[i] = -1;
  return n + 1;
}

/// Selection of every (group, token) row: `scores [lg, T, ld_scores]` fp32 (row g*T + t holds
/// the scores of regions 0 .. positions[t]/8 − 1; other columns are ignored), positions [T].
/// Outputs `topk_ids [lg, T, topk + 1]` int32 and `counts [lg, T]` int32 (group-major, like the
/// golden data and ARCHITECTURE.md). Throws when topk is outside [1, 1024] or a row needs more
/// than `ld_scores` columns.
inline void select_topk(int lg, int T, const float* scores, int ld_scores, const std::int32_t* positions, int topk,
                        std::int32_t* topk_ids, std::int32_t* counts) {
  throw_if_error(ops::check_topk("select_topk", topk));  // before topk + 1 (the rows' stride)
  for (int t = 0; t < T; ++t)
    require(positions[t] >= 0 && positions[t] / layout::kRegionSize <= ld_scores, "select_topk",
            "token " + std::to_string(t) + " at position " + std::to_string(positions[t]) + " needs " +
                std::to_string(positions[t] / layout::kRegionSize) + " score columns, ld_scores = " + std::to_string(ld_scores));
  parallel_for(lg * T, [&](int row) {
    const int t = row % T;
    const int p = positions[t];
    counts[row] = select_row(scores + static_cast<std::size_t>(row) * ld_scores, p / layout::kRegionSize, topk, p / layout::kRegionSize,
                             topk_ids + static_cast<std::size_t>(row) * (topk + 1));
  });
}

}  // namespace step5::reference
