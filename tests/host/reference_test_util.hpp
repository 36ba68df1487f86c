#pragma once
// Helpers shared by tests/host/test_reference_*.cpp: random data, per-rank weight assembly from
// global (checkpoint-shaped) tensors, golden-file access (golden_data.hpp) and error metrics. Test-only.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "golden_data.hpp"
#include "step5/core/numeric.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/reference/layer.hpp"
#include "step5/weights/safetensors.hpp"

namespace reftest {

using step5::bf16;
namespace ref = step5::reference;

inline std::vector<bf16> random_bf16(std::size_t n, float stddev, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<bf16> v(n);
  for (auto& x : v) x = step5::to_bf16(dist(rng));
  return v;
}
inline std::vector<float> random_f32(std::size_t n, float stddev, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Global (tp = 1, checkpoint-shaped) weights of one layer.
struct GlobalWeights {
  step5::layout::Geometry geometry;
  int hidden = 0;
  std::vector<bf16> q, k, v, index_q, index_k, index_z, index_g, o_proj;  // [rows, hidden]; o_proj [hidden, H*D]
  std::vector<float> index_w;                                               // [Ni, hidden] fp32
  std::vector<float> q_norm, k_norm, iq_norm, ik_norm_w, ik_norm_b;
};

inline GlobalWeights random_global_weights(const step5::layout::Geometry& g, int hidden, std::uint64_t seed) {
  GlobalWeights w;
  w.geometry = g;
  w.hidden = hidden;
  const std::size_t H = g.num_heads, D = g.head_dim, KV = g.num_kv_heads, P = g.proxy_dim, hd = hidden;
  const float s = 1.0f / std::sqrt(static_cast<float>(hidden));
  w.q = random_bf16(H * D * hd, s, seed + 1);
  w.k = random_bf16(KV * D * hd, s, seed + 2);
  w.v = random_bf16(KV * D * hd, s, seed + 3);
  w.index_q = random_bf16(g.index_num_heads * P * hd, s, seed + 4);
  w.index_k = random_bf16(g.index_num_kv_heads * P * hd, s, seed + 5);
  w.index_z = random_bf16(g.index_num_kv_heads * P * hd, 2.0f * s, seed + 6);
  w.index_g = random_bf16(static_cast<std::size_t>(g.gate_size) * hd, s, seed + 7);
  w.o_proj = random_bf16(hd * H * D, 1.0f / std::sqrt(static_cast<float>(H * D)), seed + 8);
  w.index_w = random_f32(g.index_num_heads * hd, s, seed + 9);
  w.q_norm = random_f32(D, 0.1f, seed + 10);
  w.k_norm = random_f32(D, 0.1f, seed + 11);
  w.iq_norm = random_f32(P, 0.1f, seed + 12);
  w.ik_norm_w = random_f32(P, 0.1f, seed + 13);
  w.ik_norm_b = random_f32(P, 0.1f, seed + 14);
  return w;
}

/// The rank's LayerWeights (fused matrix assembled from the shard map of SPEC §3).
inline ref::LayerWeights rank_weights(const GlobalWeights& gw, int tp, int rank, const ref::RopeTable& rope_main,
                                      const ref::RopeTable& rope_idx) {
  using step5::layout::Shard;
  const auto& g = gw.geometry;
  step5::layout::RankLayout rl;
  step5::throw_if_error(step5::layout::rank_layout(g, step5::layout::standard_layout(g, tp), rank, &rl));
  ref::LayerWeights w;
  w.rank = rl;
  w.hidden = gw.hidden;
  w.fused.assign(static_cast<std::size_t>(rl.padded_rows) * gw.hidden, bf16{});
  const std::vector<bf16>* src[7] = {&gw.q, &gw.k, &gw.v, &gw.index_q, &gw.index_k, &gw.index_z, &gw.index_g};
  for (int s = 0; s < 7; ++s) {
    const auto& sp = rl.shards[s];
    std::memcpy(w.fused.data() + static_cast<std::size_t>(sp.dst_row) * gw.hidden,
                src[s]->data() + static_cast<std::size_t>(sp.src_row) * gw.hidden,
                static_cast<std::size_t>(sp.rows) * gw.hidden * sizeof(bf16));
  }
  for (int i = 0; i < rl.indexer_w.rows; ++i)
    for (int k = 0; k < gw.hidden; ++k)
      w.fused[static_cast<std::size_t>(rl.indexer_w.dst_row + i) * gw.hidden + k] =
          step5::to_bf16(gw.index_w[static_cast<std::size_t>(rl.indexer_w.src_row + i) * gw.hidden + k]);
  const int HD = g.num_heads * g.head_dim, HlD = rl.local_heads * g.head_dim;
  w.o_proj.resize(static_cast<std::size_t>(gw.hidden) * HlD);
  for (int o = 0; o < gw.hidden; ++o)
    for (int c = 0; c < HlD; ++c)
      w.o_proj[static_cast<std::size_t>(o) * HlD + c] = gw.o_proj[static_cast<std::size_t>(o) * HD + rank * HlD + c];
  w.q_norm = gw.q_norm;
  w.k_norm = gw.k_norm;
  w.index_q_norm = gw.iq_norm;
  w.index_k_norm_weight = gw.ik_norm_w;
  w.index_k_norm_bias = gw.ik_norm_b;
  w.rope_main = rope_main;
  w.rope_idx = rope_idx;
  return w;
}

/// A StepBatch whose request b owns blocks [b*blocks_per_req, (b+1)*blocks_per_req), tail slot b.
inline ref::StepBatch make_step(const std::vector<int>& q_lens, const std::vector<int>& seq_lens, int blocks_per_req,
                                const std::vector<int>& slot_of = {}) {
  ref::StepBatch s;
  const int B = static_cast<int>(q_lens.size());
  s.cu_seqlens_q.push_back(0);
  for (int b = 0; b < B; ++b) s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + q_lens[b]);
  s.seq_lens.assign(seq_lens.begin(), seq_lens.end());
  s.max_blocks = blocks_per_req;
  for (int b = 0; b < B; ++b) {
    const int owner = slot_of.empty() ? b : slot_of[b];
    for (int j = 0; j < blocks_per_req; ++j) s.block_table.push_back(owner * blocks_per_req + j);
    s.tail_slot.push_back(owner);
  }
  return s;
}

/// ‖a − b‖ / ‖b‖ over bf16 vectors.
inline double rel_err(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = step5::to_float(a[i]), y = step5::to_float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double max_abs(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(step5::to_float(a[i]) - step5::to_float(b[i]))));
  return m;
}
inline std::size_t count_bits_diff(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += a[i].bits != b[i].bits;
  return n;
}

/// One golden file (golden_data.hpp: `golden_file`), typed access to its tensors.
struct Golden {
  step5::SafetensorsFile file;
  explicit Golden(const std::string& name) : file(golden_file(name)) {}
  template <class T>
  std::vector<T> get(const std::string& name, step5::DType dtype, std::vector<std::int64_t> shape = {}) const {
    step5::TensorView v = file.view(name);
    if (v.dtype != dtype)
      throw std::runtime_error("golden " + name + ": dtype " + std::string(step5::dtype_name(v.dtype)) + ", expected " +
                               std::string(step5::dtype_name(dtype)));
    if (!shape.empty() && v.shape != shape)
      throw std::runtime_error("golden " + name + ": shape " + step5::shape_string(v.shape) + ", expected " +
                               step5::shape_string(shape));
    std::vector<T> out(v.nbytes() / sizeof(T));
    std::memcpy(out.data(), v.data, v.nbytes());
    return out;
  }
  std::vector<bf16> bf(const std::string& n, std::vector<std::int64_t> s = {}) const { return get<bf16>(n, step5::DType::kBF16, s); }
  std::vector<float> f32(const std::string& n, std::vector<std::int64_t> s = {}) const { return get<float>(n, step5::DType::kF32, s); }
  std::vector<std::int32_t> i32(const std::string& n, std::vector<std::int64_t> s = {}) const { return get<std::int32_t>(n, step5::DType::kI32, s); }
  std::vector<std::uint8_t> u8(const std::string& n, std::vector<std::int64_t> s = {}) const { return get<std::uint8_t>(n, step5::DType::kU8, s); }
  std::vector<std::int64_t> shape(const std::string& n) const { return file.view(n).shape; }
};

}  // namespace reftest
