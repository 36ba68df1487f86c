#pragma once
/// \file step5/reference/summaries.hpp
/// CPU reference of the CSA region summaries (SPEC.md §4.4) and the per-request tail buffer
/// (SPEC §5), golden "semantics.summaries". Host-safe (g++).
///
/// Per complete region of R = 8 tokens (rows = index_k after norm+RoPE and index_z, bf16 [8, P]):
/// `m = max z over the whole 8×P block`; for each d, `e_t = exp(z[t,d] − m)` (fp32),
/// `num = Σ_t e_t·k[t,d]`, `den = Σ_t e_t` (t ascending, fp32, each sum starting from its first term),
/// `S = den > 0 ? num / max(den, 1e-20) : 0`, stored as `e4m3(bf16(S))` (RNE, saturating to ±448).
/// Signed zero (SPEC §4 "Signed zero"): S is −0.0 exactly when every product e_t·k[t,d] is −0.0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/reference/common.hpp"

namespace step5::reference {

using layout::kRegionSize;  // R (SPEC §1), layout/geometry.hpp

/// The summary of one complete region. `k_rows[t]`, `z_rows[t]` (t < 8) point at P bf16 values
/// each. Writes `s_fp32 [P]` (the fp32 summary before rounding; may be null) and `e4m3_out [P]`
/// (e4m3 bits of bf16(S); may be null).
inline void region_summary(const bf16* const* k_rows, const bf16* const* z_rows, int P, float* s_fp32,
                           std::uint8_t* e4m3_out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < kRegionSize; ++t)
    for (int d = 0; d < P; ++d) m = std::max(m, to_float(z_rows[t][d]));
  for (int d = 0; d < P; ++d) {
    // Signed zero (SPEC §4 "Signed zero"): the sums start from their first term (Triton tl.sum),
    // not from +0.0, so eight −0.0 products give num = −0.0 and S = −0.0 (e4m3 byte 0x80).
    const float e0 = std::exp(to_float(z_rows[0][d]) - m);
    float num = e0 * to_float(k_rows[0][d]), den = e0;
    for (int t = 1; t < kRegionSize; ++t) {
      const float e = std::exp(to_float(z_rows[t][d]) - m);
      num += e * to_float(k_rows[t][d]);
      den += e;
    }
    const float s = den > 0.0f ? num / std::max(den, 1e-20f) : 0.0f;
    if (s_fp32) s_fp32[d] = s;
    if (e4m3_out) e4m3_out[d] = float_to_e4m3_bits(round_bf16(s));
  }
}

/// A region completed by `update_summaries` (for tests and the golden comparison).
struct CompletedRegion {
  int request = 0;            ///< request index in the batch
  int region = 0;             ///< logical region id (position / 8)
  std::vector<float> s_fp32;  ///< [P] fp32 summary before rounding
};

/// Byte offset of region `r` of request `b` in a summary cache `[num_blocks, block_size/8, P]`.
inline std::size_t summary_offset(const BlockTableView& bt, int b, int r, int P) {
  const int blk = bt.block_of(b, kRegionSize * r);
  const int slot = (kRegionSize * r % bt.block_size) / kRegionSize;
  return (static_cast<std::size_t>(blk) * (bt.block_size / kRegionSize) + slot) * P;
}

/// One step of the summary cache and the tail buffer (SPEC §4.4, §5), for every request b:
/// - pending rows before the step: `n_pend = past_len(b) % 8`, held in
///   `tail[tail_slot[b]][0..n_pend)` as (k, z) pairs; tail is `[num_slots, 8, 2, P]` bf16.
/// - every region completed by this step (tail rows + new rows, or new rows only) is summarised
///   into `summary_cache [num_blocks, block_size/8, P]` (e4m3 bits) through the block table;
/// - the rows of the region left incomplete go to `tail[tail_slot[b]][0 .. seq_len % 8)`.
/// `index_k`/`index_z`: row t (packed token) at `index_k + t*ld_k` / `index_z + t*ld_z`, P bf16.
/// Call this BEFORE scoring (later queries of the same chunk see the new summaries).
/// `completed` (optional) receives the completed regions, request-major, region ascending.
/// Throws `step5::Error` (kInvalidArgument) as `validate_step` (rules 1-5: `tail_slot` is the host
/// array rule 5 checks) and when `tail_slot` is null in a step with tokens.
inline void update_summaries(const BatchView& batch, const BlockTableView& bt, int P, const bf16* index_k, int ld_k,
                             const bf16* index_z, int ld_z, bf16* tail, int num_slots, const std::int32_t* tail_slot,
                             std::uint8_t* summary_cache, std::vector<CompletedRegion>* completed = nullptr) {
  ops::StepCheck check = step_check("update_summaries", batch, bt);
  check.tail_slot_host = tail_slot;  // rule 5: a slot in [0, num_slots) of its own per request with rows
  check.num_slots = num_slots;
  require_valid(check);
  // rule 5 runs only on a given host array: a null one skipped it, then tail_slot[b] was read
  require(tail_slot != nullptr || check.num_tokens == 0, "update_summaries",
          "tail_slot is null, expected the tail slots [B] of a step of " + std::to_string(check.num_tokens) + " tokens");
  require(P > 0, "update_summaries", "proxy_dim = " + std::to_string(P) + ", expected > 0");
  constexpr int R = kRegionSize;
  auto tail_row = [&](int slot, int i, int which) -> bf16* {
    return tail + ((static_cast<std::size_t>(slot) * R + i) * 2 + which) * P;
  };
  for (int b = 0; b < batch.num_requests; ++b) {
    const int q_len = batch.q_len(b);
    if (q_len == 0) continue;
    const int slot = tail_slot[b];
    const int past = batch.past_len(b), len = batch.seq_lens[b], t0 = batch.cu_seqlens_q[b];
    auto k_at = [&](int pos) -> const bf16* {
      return pos < past ? tail_row(slot, pos % R, 0) : index_k + static_cast<std::size_t>(t0 + pos - past) * ld_k;
    };
    auto z_at = [&](int pos) -> const bf16* {
      return pos < past ? tail_row(slot, pos % R, 1) : index_z + static_cast<std::size_t>(t0 + pos - past) * ld_z;
    };
    for (int r = past / R; r < len / R; ++r) {  // (r + 1) * R <= len, without its overflow near INT_MAX
      const bf16* kr[R];
      const bf16* zr[R];
      for (int i = 0; i < R; ++i) {
        kr[i] = k_at(r * R + i);
        zr[i] = z_at(r * R + i);
      }
      CompletedRegion cr{b, r, std::vector<float>(static_cast<std::size_t>(P))};
      region_summary(kr, zr, P, cr.s_fp32.data(), summary_cache + summary_offset(bt, b, r, P));
      if (completed) completed->push_back(std::move(cr));
    }
    // Leftover rows of the incomplete last region; rows already in the tail stay where they are.
    for (int pos = std::max(past, len / R * R); pos < len; ++pos) {
      const bf16* k = k_at(pos);
      const bf16* z = z_at(pos);
      std::copy(k, k + P, tail_row(slot, pos % R, 0));
      std::copy(z, z + P, tail_row(slot, pos % R, 1));
    }
  }
}

}  // namespace step5::reference
