#pragma once
/// \file step5/reference/prepare.hpp
/// CPU reference of SPEC.md §4.2 (main q/k: zero-centred RMSNorm × (1 + w), partial NeoX RoPE,
/// paged KV-cache write) and §4.3 (indexer q RMSNorm + RoPE → e4m3, indexer k LayerNorm + RoPE,
/// z raw, score weights). Host-safe (g++).
///
/// Op order of the main q/k norm follows golden "semantics.main_qk" (the reference kernel
/// `fused_qknorm_rope`): sum of squares as 16 lanes × (D/16)-element fp32 fma chains over dims
/// `block*64 + lane*4 + e` (block-major, then e), lanes combined by an XOR butterfly (1, 2, 4, 8),
/// `mean = sum / D`, `rinv = 1/sqrt(mean + eps)` (the kernel's libdevice rsqrt may differ by an
/// ulp), `y = bf16((x * rinv) * (w + 1))`; then `apply_neox_rope`. When D % 64 != 0 the sum is a
/// plain sequential fp32 sum. The indexer norms' reduction order is not pinned by the reference
/// (Triton tl.sum): we use a sequential fp32 sum.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/reference/common.hpp"
#include "step5/reference/rope.hpp"

namespace step5::reference {

/// The most values of one head the preparation functions below take (head_dim / proxy_dim): their
/// fp32 working row is a stack array of this size; `model::kMaxRopeRot` is the same bound on rot.
inline constexpr int kMaxHeadValues = model::kMaxRopeRot;

/// Sum of squares of `x[0..D)` in the main-norm order described in the file comment.
inline float main_norm_sum_squares(const float* x, int D) {
  if (D % 64 != 0) {
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s = std::fma(x[d], x[d], s);
    return s;
  }
  const int blocks = D / 64;
  float lane[16];
  for (int l = 0; l < 16; ++l) {
    float acc = 0.0f;
    for (int b = 0; b < blocks; ++b)
      for (int e = 0; e < 4; ++e) {
        const float v = x[b * 64 + l * 4 + e];
        acc = std::fma(v, v, acc);
      }
    lane[l] = acc;
  }
  for (int m = 1; m < 16; m <<= 1) {
    float next[16];
    for (int l = 0; l < 16; ++l) next[l] = lane[l] + lane[l ^ m];
    for (int l = 0; l < 16; ++l) lane[l] = next[l];
  }
  return lane[0];
}

/// The rotated dims of one head of `dim` values (`dim_name` = its name): even and in [0, dim],
/// the rule of the three head functions below (apply_neox_rope reads and writes x[0, rot)).
inline void require_head_rot(const char* where, int rot, int dim, const char* dim_name) {
  require(rot >= 0 && rot <= dim && rot % 2 == 0, where,
          "rot = " + std::to_string(rot) + ", expected even and in [0, " + dim_name + " " + std::to_string(dim) + "]");
}

/// One main q or k head (SPEC §4.2): `out = rope(bf16(x * rsqrt(mean(x²) + eps) * (1 + w)))`.
/// x: D bf16 values (raw projection); w: [D] fp32 norm weight (`q_norm` / `k_norm`); rope rows of
/// the token's position (`rot/2` bf16 each; rot may be 0). out: D bf16 (may alias x).
inline void main_qk_head(const bf16* x, bf16* out, int D, const float* w, float eps, int rot, const bf16* cos_row,
                         const bf16* sin_row) {
  float buf[kMaxHeadValues];
  require(D > 0 && D <= kMaxHeadValues, "main_qk_head",
          "head_dim = " + std::to_string(D) + ", expected in [1, " + std::to_string(kMaxHeadValues) + "]");
  require_head_rot("main_qk_head", rot, D, "head_dim");
  for (int d = 0; d < D; ++d) buf[d] = to_float(x[d]);
  const float mean = main_norm_sum_squares(buf, D) / static_cast<float>(D);
  const float rinv = 1.0f / std::sqrt(mean + eps);
  for (int d = 0; d < D; ++d) buf[d] = round_bf16((buf[d] * rinv) * (w[d] + 1.0f));
  if (rot > 0) apply_neox_rope(buf, rot, cos_row, sin_row);
  for (int d = 0; d < D; ++d) out[d] = to_bf16(buf[d]);
}

/// Main q and k of T tokens (SPEC §4.2). `q_raw` row t holds `num_q_heads*D` values at
/// `q_raw + t*ld_q`; `k_raw` likewise `num_k_heads*D` at `k_raw + t*ld_k` (views into the fused
/// GEMM output C are fine). positions [T] index the rope tables (must be < max_position).
/// Outputs: q_out [T, num_q_heads, D], k_out [T, num_k_heads, D] bf16 contiguous.
inline void prepare_main_qk(int T, int num_q_heads, int num_k_heads, int D, const bf16* q_raw, int ld_q,
                            const bf16* k_raw, int ld_k, const float* q_norm, const float* k_norm, float eps,
                            const RopeTable& rope, const std::int32_t* positions, bf16* q_out, bf16* k_out) {
  model::check_rope_table(rope, "prepare_main_qk", "rope");  // cos_row / sin_row below trust its fields
  require(rope.rot <= D, "prepare_main_qk", "rope rot = " + std::to_string(rope.rot) + " > head_dim " + std::to_string(D));
  for (int t = 0; t < T; ++t)
    require(positions[t] >= 0 && positions[t] < rope.max_position, "prepare_main_qk",
            "position " + std::to_string(positions[t]) + " of token " + std::to_string(t) +
                " outside the rope table [0, " + std::to_string(rope.max_position) + ")");
  parallel_for(T, [&](int t) {
    const bf16* c = rope.cos_row(positions[t]);
    const bf16* s = rope.sin_row(positions[t]);
    for (int h = 0; h < num_q_heads; ++h)
      main_qk_head(q_raw + static_cast<std::size_t>(t) * ld_q + static_cast<std::size_t>(h) * D,
                   q_out + (static_cast<std::size_t>(t) * num_q_heads + h) * D, D, q_norm, eps, rope.rot, c, s);
    for (int h = 0; h < num_k_heads; ++h)
      main_qk_head(k_raw + static_cast<std::size_t>(t) * ld_k + static_cast<std::size_t>(h) * D,
                   k_out + (static_cast<std::size_t>(t) * num_k_heads + h) * D, D, k_norm, eps, rope.rot, c, s);
  });
}

/// Writes k [T, KVl, D] and v (row t at `v + t*ld_v`, KVl*D values) into the paged caches
/// `k_cache`/`v_cache [num_blocks, block_size, KVl, D]` bf16 (SPEC §5): token t of request b at
/// position p goes to block `bt.block_of(b, p)`, row `p % block_size`.
inline void write_kv_cache(const BatchView& batch, const BlockTableView& bt, int KVl, int D, const bf16* k, int ld_k,
                           const bf16* v, int ld_v, bf16* k_cache, bf16* v_cache) {
  validate_step(batch, bt, "write_kv_cache");
  const std::size_t row = static_cast<std::size_t>(KVl) * D;
  for (int b = 0; b < batch.num_requests; ++b)
    for (int t = batch.cu_seqlens_q[b]; t < batch.cu_seqlens_q[b + 1]; ++t) {
      const int p = batch.past_len(b) + (t - batch.cu_seqlens_q[b]);
      const std::size_t dst = (static_cast<std::size_t>(bt.block_of(b, p)) * bt.block_size + p % bt.block_size) * row;
      for (std::size_t i = 0; i < row; ++i) {
        k_cache[dst + i] = k[static_cast<std::size_t>(t) * ld_k + i];
        v_cache[dst + i] = v[static_cast<std::size_t>(t) * ld_v + i];
      }
    }
}

/// Indexer q head (SPEC §4.3): `bf16(x * rsqrt(mean(x²) + eps) * (bf16(w) + 1))`, then NeoX RoPE
/// on the first `rot` dims. x: P bf16; w: [P] fp32 checkpoint weight (rounded to bf16 here).
/// out: P values as bf16.
inline void index_q_head(const bf16* x, bf16* out, int P, const float* w, float eps, int rot, const bf16* cos_row,
                         const bf16* sin_row) {
  float buf[kMaxHeadValues];
  require(P > 0 && P <= kMaxHeadValues, "index_q_head",
          "proxy_dim = " + std::to_string(P) + ", expected in [1, " + std::to_string(kMaxHeadValues) + "]");
  require_head_rot("index_q_head", rot, P, "proxy_dim");
  float ss = 0.0f;
  for (int d = 0; d < P; ++d) {
    buf[d] = to_float(x[d]);
    ss += buf[d] * buf[d];
  }
  const float rinv = 1.0f / std::sqrt(ss / static_cast<float>(P) + eps);
  for (int d = 0; d < P; ++d) buf[d] = round_bf16((buf[d] * rinv) * (round_bf16(w[d]) + 1.0f));
  if (rot > 0) apply_neox_rope(buf, rot, cos_row, sin_row);
  for (int d = 0; d < P; ++d) out[d] = to_bf16(buf[d]);
}

/// Indexer k head (SPEC §4.3): LayerNorm with `mean = E[x]`, `var = E[x²] − E[x]²` (fp32),
/// `bf16((x − mean) * rsqrt(var + eps) * bf16(w) + bf16(b))`, then NeoX RoPE on `rot` dims.
inline void index_k_head(const bf16* x, bf16* out, int P, const float* w, const float* bias, float eps, int rot,
                         const bf16* cos_row, const bf16* sin_row) {
  float buf[kMaxHeadValues];
  require(P > 0 && P <= kMaxHeadValues, "index_k_head",
          "proxy_dim = " + std::to_string(P) + ", expected in [1, " + std::to_string(kMaxHeadValues) + "]");
  require_head_rot("index_k_head", rot, P, "proxy_dim");
  // Signed zero (SPEC §4 "Signed zero"): Σx starts from its first term (Triton tl.sum), so a row of
  // −0.0 has mean −0.0 and x − mean = +0.0 (starting from +0.0 would give mean +0.0, x − mean = −0.0).
  buf[0] = to_float(x[0]);
  float s = buf[0], ss = buf[0] * buf[0];
  for (int d = 1; d < P; ++d) {
    buf[d] = to_float(x[d]);
    s += buf[d];
    ss += buf[d] * buf[d];
  }
  const float mean = s / static_cast<float>(P);
  const float var = ss / static_cast<float>(P) - mean * mean;
  const float rinv = 1.0f / std::sqrt(var + eps);
  for (int d = 0; d < P; ++d) buf[d] = round_bf16((buf[d] - mean) * rinv * round_bf16(w[d]) + round_bf16(bias[d]));
  if (rot > 0) apply_neox_rope(buf, rot, cos_row, sin_row);
  for (int d = 0; d < P; ++d) out[d] = to_bf16(buf[d]);
}

/// Indexer preparation of T tokens (SPEC §4.3), local heads Il = hpg_i * lg:
/// - index_q_raw row t: Il*P bf16 at `index_q_raw + t*ld_iq`  → index_q_out [T, Il, P] bf16
///   (optional, may be null) and index_q_e4m3 [T, Il, P] uint8 (e4m3 bits of the bf16 values,
///   RNE, saturating to ±448 as SPEC §4.5 says).
/// - index_k_raw row t: P bf16 (Nk local = 1)            → index_k_out [T, P] bf16
/// - index_z_raw row t: P bf16                           → index_z_out [T, P] bf16 (copy)
/// - w_raw row t: Il bf16 (the sparse_indexer_w GEMM out)→ weights_out [T, Il] fp32 =
///   float(w) * hpg_i^-0.5.
/// `q_norm_w [P]`, `k_norm_w [P]`, `k_norm_b [P]` are the fp32 checkpoint values.
inline void prepare_indexer(int T, int Il, int hpg_i, int P, const bf16* index_q_raw, int ld_iq, const bf16* index_k_raw,
                            int ld_ik, const bf16* index_z_raw, int ld_iz, const bf16* w_raw, int ld_w,
                            const float* q_norm_w, const float* k_norm_w, const float* k_norm_b, float eps,
                            const RopeTable& rope, const std::int32_t* positions, bf16* index_q_out,
                            std::uint8_t* index_q_e4m3, bf16* index_k_out, bf16* index_z_out, float* weights_out) {
  require(hpg_i > 0 && Il % hpg_i == 0, "prepare_indexer",
          "Il = " + std::to_string(Il) + " is not a multiple of hpg_i = " + std::to_string(hpg_i));
  model::check_rope_table(rope, "prepare_indexer", "rope");  // cos_row / sin_row below trust its fields
  require(rope.rot <= P, "prepare_indexer", "rope rot = " + std::to_string(rope.rot) + " > proxy_dim " + std::to_string(P));
  for (int t = 0; t < T; ++t)
    require(positions[t] >= 0 && positions[t] < rope.max_position, "prepare_indexer",
            "position " + std::to_string(positions[t]) + " of token " + std::to_string(t) +
                " outside the rope table [0, " + std::to_string(rope.max_position) + ")");
  const float wscale = 1.0f / std::sqrt(static_cast<float>(hpg_i));
  parallel_for(T, [&](int t) {
    const bf16* c = rope.cos_row(positions[t]);
    const bf16* s = rope.sin_row(positions[t]);
    std::vector<bf16> tmp(static_cast<std::size_t>(P));
    for (int h = 0; h < Il; ++h) {
      index_q_head(index_q_raw + static_cast<std::size_t>(t) * ld_iq + static_cast<std::size_t>(h) * P, tmp.data(), P,
                   q_norm_w, eps, rope.rot, c, s);
      const std::size_t o = (static_cast<std::size_t>(t) * Il + h) * P;
      for (int d = 0; d < P; ++d) {
        if (index_q_out) index_q_out[o + d] = tmp[d];
        index_q_e4m3[o + d] = float_to_e4m3_bits(to_float(tmp[d]));
      }
    }
    index_k_head(index_k_raw + static_cast<std::size_t>(t) * ld_ik, index_k_out + static_cast<std::size_t>(t) * P, P,
                 k_norm_w, k_norm_b, eps, rope.rot, c, s);
    for (int d = 0; d < P; ++d)
      index_z_out[static_cast<std::size_t>(t) * P + d] = index_z_raw[static_cast<std::size_t>(t) * ld_iz + d];
    for (int h = 0; h < Il; ++h)
      weights_out[static_cast<std::size_t>(t) * Il + h] = to_float(w_raw[static_cast<std::size_t>(t) * ld_w + h]) * wscale;
  });
}

}  // namespace step5::reference
