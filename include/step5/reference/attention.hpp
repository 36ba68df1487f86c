#pragma once
/// \file step5/reference/attention.hpp
/// CPU reference of the sparse GQA attention (SPEC.md §4.7) and the head-wise gate (SPEC §4.8),
/// golden "semantics.attention" / "semantics.gate". Host-safe (g++).
///
/// Attention, per token t (request b, position p) and local q head h of local group
/// g = h / hpg_q (KV head g of the rank's caches): the keys/values are the 8 tokens of every
/// selected history region (the first count−1 ids of `topk_ids[g, t]`, in row order) followed by
/// tokens 8*(p/8) .. p of the current region. Logits `s = fp32(q·k) * D^-0.5` (dot summed in
/// fp32, d ascending). Online softmax over tiles of `regions_per_tile` regions (the reference
/// kernel's prefill tile: min(16, next_pow2(topk+1)) regions): per tile `m' = max(m, max s)`,
/// `α = exp(m − m')`, `p_j = exp(s_j − m')`, `l = l·α + Σ p_j` (fp32), `acc = acc·α + Σ bf16(p_j)·v_j`
/// (probabilities rounded to bf16 before P·V). `out = bf16(acc / l)`,
/// `lse = m + ln(l)` (natural log, scaled-logit units). A row without keys gives out 0, lse −inf.
/// A GPU kernel with other tiles or exp2-based math agrees within bf16 tolerance, not bitwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/reference/common.hpp"

namespace step5::reference {

/// `min(16, next_pow2(topk + 1))`: the reference kernel's regions per prefill tile (1 for
/// topk <= 0). The doubling stops at 16 (it ran past 2^30 into a signed overflow, then looped
/// for ever at 0, for a topk above 2^30).
inline int default_regions_per_tile(int topk) {
  int p = 1;
  while (p < 16 && p <= topk) p <<= 1;
  return p;
}

/// Sparse attention of one step. Inputs:
/// - `q [T, Hl, D]` bf16 (prepared), Hl = lg * hpg_q;
/// - `k_cache`, `v_cache [num_blocks, block_size, KVl, D]` bf16 with KVl == lg (local KV head g
///   serves local group g), addressed through `bt`;
/// - `topk_ids [lg, T, topk + 1]`, `counts [lg, T]` from `select_topk`.
/// Outputs `out [T, Hl, D]` bf16 (before the gate) and `lse [T, Hl]` fp32 (may be null).
/// `regions_per_tile <= 0` selects `default_regions_per_tile(topk)`. Throws when topk is outside
/// [1, 1024] (ops::check_topk, as the GPU launcher), an id lies outside [0, p/8] or a count
/// outside [0, topk + 1].
inline void sparse_attention(const BatchView& batch, const BlockTableView& bt, int lg, int hpg_q, int D, int topk,
                             const bf16* q, const bf16* k_cache, const bf16* v_cache, const std::int32_t* topk_ids,
                             const std::int32_t* counts, bf16* out, float* lse, int regions_per_tile = 0) {
  validate_step(batch, bt, "sparse_attention");
  require(lg > 0 && hpg_q > 0 && D > 0, "sparse_attention",
          "lg = " + std::to_string(lg) + ", hpg_q = " + std::to_string(hpg_q) + ", D = " + std::to_string(D) +
              ", expected all > 0");
  throw_if_error(ops::check_topk("sparse_attention", topk));  // before topk + 1 (a row's width)
  if (regions_per_tile <= 0) regions_per_tile = default_regions_per_tile(topk);
  const int T = batch.num_tokens(), Hl = lg * hpg_q, KVl = lg, W = topk + 1;
  const std::vector<std::int32_t> pos = token_positions(batch);
  const std::vector<std::int32_t> req = token_requests(batch);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // validate the selection rows first (exceptions inside parallel_for are rethrown, but early is clearer)
  for (int g = 0; g < lg; ++g)
    for (int t = 0; t < T; ++t) {
      const int row = g * T + t, c = counts[row], cur = pos[t] / layout::kRegionSize;
      require(c >= 0 && c <= W, "sparse_attention",
              "counts[" + std::to_string(g) + "][" + std::to_string(t) + "] = " + std::to_string(c) +
                  ", expected in [0, topk + 1 = " + std::to_string(W) + "]");
      for (int i = 0; i < c; ++i) {
        const int id = topk_ids[static_cast<std::size_t>(row) * W + i];
        require(id >= 0 && id <= cur, "sparse_attention",
                "topk_ids[" + std::to_string(g) + "][" + std::to_string(t) + "][" + std::to_string(i) + "] = " +
                    std::to_string(id) + ", expected in [0, current region " + std::to_string(cur) + "]");
      }
    }
  parallel_for(T * Hl, [&](int th) {
    const int t = th / Hl, h = th % Hl, g = h / hpg_q;
    const int b = req[t], p = pos[t], row = g * T + t, c = counts[row];
    const bf16* qh = q + static_cast<std::size_t>(th) * D;
    std::vector<float> qf(static_cast<std::size_t>(D)), acc(static_cast<std::size_t>(D), 0.0f);
    for (int d = 0; d < D; ++d) qf[d] = to_float(qh[d]);
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    std::vector<float> s;
    std::vector<const bf16*> vrows;
    for (int i0 = 0; i0 < c; i0 += regions_per_tile) {
      s.clear();
      vrows.clear();
      for (int i = i0; i < std::min(c, i0 + regions_per_tile); ++i) {
        const int r = topk_ids[static_cast<std::size_t>(row) * W + i];
        const int last = std::min(layout::kRegionSize * r + layout::kRegionSize - 1, p);  // the current region stops at p
        for (int tok = layout::kRegionSize * r; tok <= last; ++tok) {
          const std::size_t off =
              ((static_cast<std::size_t>(bt.block_of(b, tok)) * bt.block_size + tok % bt.block_size) * KVl + g) * D;
          float dot = 0.0f;
          for (int d = 0; d < D; ++d) dot += qf[d] * to_float(k_cache[off + d]);
          s.push_back(dot * scale);
          vrows.push_back(v_cache + off);
        }
      }
      if (s.empty()) continue;
      const float m_new = std::max(m, *std::max_element(s.begin(), s.end()));
      const float alpha = std::exp(m - m_new);  // exp(-inf) = 0 on the first tile
      float tile_sum = 0.0f;
      for (float& x : acc) x *= alpha;
      for (std::size_t j = 0; j < s.size(); ++j) {
        const float pj = std::exp(s[j] - m_new);
        tile_sum += pj;
        const float pb = round_bf16(pj);
        for (int d = 0; d < D; ++d) acc[d] += pb * to_float(vrows[j][d]);
      }
      l = l * alpha + tile_sum;
      m = m_new;
    }
    bf16* o = out + static_cast<std::size_t>(th) * D;
    if (l > 0.0f) {
      for (int d = 0; d < D; ++d) o[d] = to_bf16(acc[d] / l);
      if (lse) lse[th] = m + std::log(l);
    } else {
      for (int d = 0; d < D; ++d) o[d] = to_bf16(0.0f);
      if (lse) lse[th] = -std::numeric_limits<float>::infinity();
    }
  });
}

/// The head-wise gate value of SPEC §4.8: `bf16(sigmoid(g))` with g a bf16 value, sigmoid in fp32
/// as `1 / (1 + exp(−g))`.
inline float gate_value(bf16 g) { return round_bf16(1.0f / (1.0f + std::exp(-to_float(g)))); }

/// Applies the gate (SPEC §4.8): `out[t, h, :] = bf16(attn[t, h, :] * gate_value(g[t, h]))`.
/// `attn [T, Hl, D]` bf16; `g` row t has Hl bf16 values at `g + t*ld_g` (the index_g columns of
/// the fused GEMM output; gl == Hl); `gate_out [T, Hl]` bf16 (may be null); `out` may be attn itself
/// (the same pointer: each element is read before it is written), not a shifted overlap.
inline void apply_gate(int T, int Hl, int D, const bf16* attn, const bf16* g, int ld_g, bf16* out, bf16* gate_out = nullptr) {
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hl; ++h) {
      const float gv = gate_value(g[static_cast<std::size_t>(t) * ld_g + h]);
      if (gate_out) gate_out[static_cast<std::size_t>(t) * Hl + h] = to_bf16(gv);
      const std::size_t o = (static_cast<std::size_t>(t) * Hl + h) * D;
      for (int d = 0; d < D; ++d) out[o + d] = to_bf16(to_float(attn[o + d]) * gv);
    }
}

}  // namespace step5::reference
