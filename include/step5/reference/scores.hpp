#pragma once
/// \file step5/reference/scores.hpp
/// CPU reference of the indexer scores, SPEC.md §4.5 (golden "semantics.scores"). Host-safe (g++).
///
/// For token t at position p, local group g, history region r < p/8:
///   `score = Σ_{h < hpg_i} ReLU(dot_h) * weights[t, g*hpg_i + h]` in fp32, heads in order, each
///   head accumulated with one fused multiply-add `score = fma(relu(dot_h), w_h, score)` (what the
///   reference Triton kernel compiles to: bit-exact against the golden prefill and decode scores),
///   with `dot_h = <e4m3 q[t, g*hpg_i + h, :], S[r]>`.
/// The dot of two e4m3 vectors of length ≤ 1024 is computed exactly (in double: every product has
/// ≤ 8 significant bits and the exponent span fits 53 bits) and rounded once to fp32, the value
/// any fp32-accumulating kernel approximates; GPU kernels summing in fp32 may differ in the last
/// ulps (compare scores with a relative tolerance, selections exactly when fed identical scores).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/reference/common.hpp"
#include "step5/reference/summaries.hpp"

namespace step5::reference {

namespace detail {
/// The 256 e4m3 values as doubles (e4m3_bits_to_float of every bit pattern, NaN included).
inline const std::array<double, 256>& e4m3_double_table() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int b = 0; b < 256; ++b) t[static_cast<std::size_t>(b)] = e4m3_bits_to_float(static_cast<std::uint8_t>(b));
    return t;
  }();
  return table;
}
}  // namespace detail

/// Exact dot of two e4m3 vectors of length P, rounded to fp32. Every product and every partial
/// sum is exact in double (see the file comment), so four interleaved partial sums (they only
/// shorten the dependency chain) give the value of one running sum in element order. A NaN
/// element gives a NaN (its sign, as in IEEE arithmetic, unspecified; SPEC §4.6 ranks every NaN
/// alike).
inline float e4m3_dot(const std::uint8_t* a, const std::uint8_t* b, int P) {
  const auto& v = detail::e4m3_double_table();
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  int d = 0;
  for (; d + 4 <= P; d += 4)
    for (int j = 0; j < 4; ++j) acc[j] += v[a[d + j]] * v[b[d + j]];
  for (; d < P; ++d) acc[0] += v[a[d]] * v[b[d]];
  return static_cast<float>((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

/// The score of one region for one (token, group): `q_e4m3 [hpg_i, P]` (the group's heads),
/// `weights [hpg_i]` (already × hpg_i^-0.5), `summary [P]` e4m3 bits.
inline float region_score(const std::uint8_t* q_e4m3, const float* weights, int hpg_i, int P,
                          const std::uint8_t* summary) {
  // Signed zero (SPEC §4 "Signed zero"): unlike the region sums, the reference seeds the head sum
  // with +0.0 (its accumulator is zero-initialised), so a score of zero is always +0.0, whatever the
  // signs of the weights and of the zero dots; the sign of ReLU's zero therefore never shows.
  float score = 0.0f;
  for (int h = 0; h < hpg_i; ++h) {
    const float dot = e4m3_dot(q_e4m3 + static_cast<std::size_t>(h) * P, summary, P);
    // ReLU keeps NaN (torch.relu; the score kernel's relu_keep_nan), so a NaN input reaches the
    // selection, where NaN ranks above every number (SPEC §4.5–4.6).
    const float relu = dot < 0.0f ? 0.0f : dot;
    score = std::fma(relu, weights[h], score);
  }
  return score;
}

/// Scores of every (group, token, history region) of one step (SPEC §4.5):
/// `index_q_e4m3 [T, Il, P]` uint8 (Il = lg*hpg_i), `weights [T, Il]` fp32, the summary cache
/// `[num_blocks, block_size/8, P]` e4m3 bits addressed through `bt`; output
/// `scores [lg, T, ld_scores]` fp32 (row g*T + t), columns [0, p/8) defined, columns
/// [p/8, ld_scores) set to 0. Throws when some p/8 > ld_scores.
inline void compute_scores(const BatchView& batch, const BlockTableView& bt, int lg, int hpg_i, int P,
                           const std::uint8_t* index_q_e4m3, const float* weights, const std::uint8_t* summary_cache,
                           float* scores, int ld_scores) {
  validate_step(batch, bt, "compute_scores");
  const int T = batch.num_tokens();
  const std::vector<std::int32_t> pos = token_positions(batch);
  const std::vector<std::int32_t> req = token_requests(batch);
  for (int t = 0; t < T; ++t)
    require(pos[t] / layout::kRegionSize <= ld_scores, "compute_scores",
            "token " + std::to_string(t) + " at position " + std::to_string(pos[t]) + " has " +
                std::to_string(pos[t] / layout::kRegionSize) + " history regions, ld_scores = " + std::to_string(ld_scores));
  const int Il = lg * hpg_i;
  parallel_for(lg * T, [&](int row) {
    const int g = row / T, t = row % T;
    const int nh = pos[t] / layout::kRegionSize;
    float* out = scores + static_cast<std::size_t>(row) * ld_scores;
    const std::uint8_t* q = index_q_e4m3 + (static_cast<std::size_t>(t) * Il + static_cast<std::size_t>(g) * hpg_i) * P;
    const float* w = weights + static_cast<std::size_t>(t) * Il + static_cast<std::size_t>(g) * hpg_i;
    for (int r = 0; r < nh; ++r) out[r] = region_score(q, w, hpg_i, P, summary_cache + summary_offset(bt, req[t], r, P));
    for (int r = nh; r < ld_scores; ++r) out[r] = 0.0f;
  });
}

}  // namespace step5::reference
