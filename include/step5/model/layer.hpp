#pragma once
/// \file step5/model/layer.hpp
/// The library's model types of one DSA layer on one TP rank: its host weights (`LayerWeights`,
/// with the RoPE tables of step5/model/rope.hpp) and its host KV / summary / tail caches
/// (`LayerCache`, SPEC §5). Produced by the checkpoint loader (step5/weights/), consumed by the
/// CPU reference (step5/reference/) and uploaded by GPU engines (device views: `ops::DsaLayerWeights`,
/// `ops::DsaLayerCaches`, ops/layer.hpp). Host-safe (g++). Layouts: docs/ARCHITECTURE.md.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/model/rope.hpp"
#include "step5/ops/batch_check.hpp"  // block_size_ok

namespace step5::model {

/// The host weights of one DSA layer for one TP rank (SPEC §3–4), what the checkpoint loader
/// produces (step5/weights/layer_loader.hpp; weights/fused_weight.hpp builds `fused`), what the
/// CPU reference consumes and what a GPU engine uploads as they are (`ops::DsaLayerWeights`).
/// Plain owning vectors; dtypes and shapes per field. `validate_weights` checks them.
struct LayerWeights {
  layout::RankLayout rank{};            ///< the rank's layout (SPEC §2–3)
  int hidden = 0;                       ///< hidden size (GEMM K)
  float eps = 1e-5f;                    ///< rms_norm_eps (also the indexer norms' eps)
  std::vector<bf16> fused;              ///< [rank.padded_rows, hidden]: shards (SPEC §3) + sparse_indexer_w rows + zero rows
  std::vector<bf16> o_proj;             ///< [hidden, Hl*D]: the rank's o_proj columns
  std::vector<float> q_norm, k_norm;    ///< [D] fp32
  std::vector<float> index_q_norm;      ///< [P] fp32 checkpoint values (rounded to bf16 at use)
  std::vector<float> index_k_norm_weight, index_k_norm_bias;  ///< [P] fp32 (rounded to bf16 at use)
  RopeTable rope_main;                  ///< rot = rot_main
  RopeTable rope_idx;                   ///< rot = rot_idx
};

/// Checks every size of `w` against its layout; throws `step5::Error` naming the field.
inline void validate_weights(const LayerWeights& w) {
  const auto& r = w.rank;
  const auto& g = r.geometry;
  auto sz = [](std::size_t v) { return std::to_string(v); };
  require(w.hidden > 0, "LayerWeights", "hidden = " + std::to_string(w.hidden) + ", expected > 0");
  throw_if_error(layout::check_rank_layout(r, "LayerWeights"));
  throw_if_error(check_norm_eps(w.eps, "LayerWeights: eps"));
  require(r.index_local_kv_heads == 1, "LayerWeights",
          "index_local_kv_heads = " + std::to_string(r.index_local_kv_heads) + ", the reference supports 1");
  require(g.region_size == layout::kRegionSize, "LayerWeights", "region_size = " + std::to_string(g.region_size) + ", expected " + std::to_string(layout::kRegionSize));
  require(r.local_gate == 0 || r.local_gate == r.local_heads, "LayerWeights",
          "local gate outputs = " + std::to_string(r.local_gate) + ", expected 0 or local heads " + std::to_string(r.local_heads));
  const std::size_t fused = static_cast<std::size_t>(r.padded_rows) * w.hidden;
  require(w.fused.size() == fused, "LayerWeights", "fused has " + sz(w.fused.size()) + " elements, expected padded_rows " +
                                                       std::to_string(r.padded_rows) + " x hidden " + std::to_string(w.hidden));
  const std::size_t o = static_cast<std::size_t>(w.hidden) * r.local_heads * g.head_dim;
  require(w.o_proj.size() == o, "LayerWeights", "o_proj has " + sz(w.o_proj.size()) + " elements, expected " + sz(o));
  require(w.q_norm.size() == static_cast<std::size_t>(g.head_dim) && w.k_norm.size() == w.q_norm.size(), "LayerWeights",
          "q_norm/k_norm have " + sz(w.q_norm.size()) + "/" + sz(w.k_norm.size()) + " elements, expected head_dim " +
              std::to_string(g.head_dim));
  const std::size_t P = static_cast<std::size_t>(g.proxy_dim);
  require(w.index_q_norm.size() == P && w.index_k_norm_weight.size() == P && w.index_k_norm_bias.size() == P,
          "LayerWeights", "indexer norm vectors (index_q_norm, index_k_norm weight, bias) have " +
                              sz(w.index_q_norm.size()) + "/" + sz(w.index_k_norm_weight.size()) + "/" +
                              sz(w.index_k_norm_bias.size()) + " elements, expected proxy_dim = " + sz(P));
  require(w.rope_main.rot == g.rot_main && w.rope_idx.rot == g.rot_idx, "LayerWeights",
          "rope tables rot " + std::to_string(w.rope_main.rot) + "/" + std::to_string(w.rope_idx.rot) +
              ", expected rot_main " + std::to_string(g.rot_main) + " / rot_idx " + std::to_string(g.rot_idx));
  // the tables hold max_position rows of rot/2 (the reference reads row `position` of each)
  check_rope_table(w.rope_main, "LayerWeights", "rope_main");
  check_rope_table(w.rope_idx, "LayerWeights", "rope_idx");
}

/// The caches of one rank (SPEC §5), owning.
struct LayerCache {
  int num_blocks = 0, block_size = 0, num_slots = 0;
  int kv_heads = 0, head_dim = 0, proxy_dim = 0;
  std::vector<bf16> k_cache, v_cache;       ///< [num_blocks, block_size, KVl, D]
  std::vector<std::uint8_t> summary_cache;  ///< [num_blocks, block_size/8, P] e4m3 bits
  std::vector<bf16> tail;                   ///< [num_slots, 8, 2, P] (index_k, index_z)

  /// Zero-filled caches for `rank`: `num_blocks` blocks of `block_size` tokens (a multiple of 8, at
  /// most ops::kMaxBlockSize), `num_slots` tail slots. Throws `step5::Error` (kInvalidArgument)
  /// naming the value for counts out of range, or a rank of no KV heads, head_dim or proxy_dim
  /// (a default RankLayout, not make_rank_layout's: caches that `validate` would refuse).
  static LayerCache create(const layout::RankLayout& rank, int num_blocks, int block_size, int num_slots) {
    require(num_blocks > 0 && ops::block_size_ok(block_size) && num_slots > 0, "LayerCache::create",
            "num_blocks = " + std::to_string(num_blocks) + ", block_size = " + std::to_string(block_size) +
                ", num_slots = " + std::to_string(num_slots) +
                "; expected > 0, block_size a multiple of 8 of at most " + std::to_string(ops::kMaxBlockSize) +
                " (ops::kMaxBlockSize, as every step)");
    LayerCache c;
    c.num_blocks = num_blocks;
    c.block_size = block_size;
    c.num_slots = num_slots;
    c.kv_heads = rank.local_kv_heads;
    c.head_dim = rank.geometry.head_dim;
    c.proxy_dim = rank.geometry.proxy_dim;
    c.check_counts("LayerCache::create");
    c.k_cache.assign(c.kv_elems(), bf16{});
    c.v_cache.assign(c.kv_elems(), bf16{});
    c.summary_cache.assign(c.summary_elems(), 0);
    c.tail.assign(c.tail_elems(), bf16{});
    return c;
  }
  /// Elements each buffer holds for these fields (the one rule of `create` and `validate`): the
  /// products of `kv_shape`, `summary_shape` and `tail_shape` (check_counts bounds them first).
  std::size_t kv_elems() const { return product(kv_shape()); }
  std::size_t summary_elems() const { return product(summary_shape()); }
  std::size_t tail_elems() const { return product(tail_shape()); }
  /// Checks the (public, editable) fields against each other: positive counts, a block size every
  /// step takes, and every buffer of its size. Throws `step5::Error` (kInvalidArgument) naming `op`
  /// and the buffer.
  void validate(const char* op) const {
    check_counts(op);
    const auto check = [&](const char* name, std::size_t have, std::size_t want, const char* shape) {
      require(have == want, op, std::string("cache ") + name + " has " + std::to_string(have) + " elements, expected " +
                                    shape + " = " + std::to_string(want));
    };
    check("k_cache", k_cache.size(), kv_elems(), "num_blocks x block_size x kv_heads x head_dim");
    check("v_cache", v_cache.size(), kv_elems(), "num_blocks x block_size x kv_heads x head_dim");
    check("summary_cache", summary_cache.size(), summary_elems(), "num_blocks x block_size/8 x proxy_dim");
    check("tail", tail.size(), tail_elems(), "num_slots x 8 x 2 x proxy_dim");
  }

 private:
  // Each buffer's shape (k_cache / v_cache bf16, summary_cache e4m3 bytes, tail bf16), one list
  // for its size and for the bound on it.
  std::array<std::uint64_t, 4> kv_shape() const {
    return {u64(num_blocks), u64(block_size), u64(kv_heads), u64(head_dim)};
  }
  std::array<std::uint64_t, 3> summary_shape() const {
    return {u64(num_blocks), u64(block_size / layout::kRegionSize), u64(proxy_dim)};
  }
  std::array<std::uint64_t, 4> tail_shape() const { return {u64(num_slots), u64(layout::kRegionSize), 2, u64(proxy_dim)}; }
  static std::uint64_t u64(int v) { return static_cast<std::uint64_t>(v); }
  template <std::size_t N>
  static std::size_t product(const std::array<std::uint64_t, N>& shape) {
    std::uint64_t n = 1;
    for (const std::uint64_t f : shape) n *= f;
    return static_cast<std::size_t>(n);
  }
  // The counts' rule of `create` and `validate`: positive counts and a block size every step takes.
  void check_counts(const char* op) const {
    require(num_blocks > 0 && ops::block_size_ok(block_size) && num_slots > 0 && kv_heads > 0 && head_dim > 0 &&
                proxy_dim > 0,
            op, "cache num_blocks = " + std::to_string(num_blocks) + ", block_size = " + std::to_string(block_size) +
                    ", num_slots = " + std::to_string(num_slots) + ", kv_heads = " + std::to_string(kv_heads) +
                    ", head_dim = " + std::to_string(head_dim) + ", proxy_dim = " + std::to_string(proxy_dim) +
                    "; expected positive counts and a block size of LayerCache::create");
    // kv_elems() and the other sizes are size_t products: fields whose product passes 2^63 - 1
    // bytes would wrap to a small size that a buffer of that size then passed `validate` with
    // (rows read past it)
    const auto fits = [](const auto& shape, std::uint64_t elem_bytes) {
      std::uint64_t left = max_elements_in_bytes(elem_bytes);
      for (const std::uint64_t f : shape) {
        if (f > left) return false;
        left /= f;
      }
      return true;
    };
    require(fits(kv_shape(), sizeof(bf16)) && fits(summary_shape(), 1) && fits(tail_shape(), sizeof(bf16)), op,
            "cache num_blocks = " + std::to_string(num_blocks) + ", block_size = " + std::to_string(block_size) +
                ", kv_heads = " + std::to_string(kv_heads) + ", head_dim = " + std::to_string(head_dim) +
                ", num_slots = " + std::to_string(num_slots) + ", proxy_dim = " + std::to_string(proxy_dim) +
                ": a buffer (num_blocks x block_size x kv_heads x head_dim, num_blocks x block_size/8 x proxy_dim "
                "or num_slots x 16 x proxy_dim values) passes 2^63 - 1 bytes, expected every buffer within it");
  }
};

}  // namespace step5::model
