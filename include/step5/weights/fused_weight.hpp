#pragma once
/// \file step5/weights/fused_weight.hpp
/// Assembly of one rank's fused projection weight from checkpoint tensors, and the loader
/// contract of SPEC.md §3. Host-only (g++).
///
/// The fused matrix is bf16, row-major `[rank.padded_rows, hidden]` (docs/ARCHITECTURE.md):
///   rows `[0, rank.fused_rows)`: the seven shards q, k, v, index_q, index_k, index_z, index_g at
///   `rank.shard(s).dst_row`; then `sparse_indexer_w` rows at `rank.indexer_w.dst_row`
///   (`rank.index_local_heads` rows); then zero rows up to `rank.padded_rows`.
/// Source rows come from `RankLayout`'s shard map only (no offsets are recomputed here).
///
/// Decisions (SPEC leaves them to us):
/// - Loader shard ids: `q k v index_q index_k index_z index_g` (SPEC §3) plus `index_w` for
///   `sparse_indexer_w`. `index_w` is REQUIRED: the fused GEMM produces the indexer score
///   weights from those rows, and zero rows would silently zero every score. `index_g` is
///   required iff `gate_size > 0` (and refused when `gate_size == 0`).
/// - dtypes: BF16 is copied bit-exactly; F32 and F16 are accepted for every shard and rounded
///   to bf16 round-to-nearest-even (`step5::float_to_bf16_bits`; F16 -> F32 is exact, so one
///   rounding). `sparse_indexer_w` is F32 in Step5 checkpoints. Quantized dtypes (F8_E4M3,
///   F8_E5M2, I8, U8) are refused as quantized; every other dtype (F64, integers, BOOL) is refused
///   as unsupported. Errors name the tensor, what was expected and what was found.
/// - Reload safety: the matrix is exposed (`weight()`) only after a successful
///   `assert_fully_loaded`. The first `load` after that (or after a failed check / a reset)
///   starts a new load: the matrix is zeroed and hidden again, so rows not supplied by the new
///   load can never be used. `assert_fully_loaded` forgets the record of loaded shards whether it
///   succeeds or fails (a failure also zeroes the matrix). Loading a shard twice within one
///   load overwrites its rows.
/// - Errors are `step5::Error` (host loading code, docs/ARCHITECTURE.md).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/core/tensor.hpp"
#include "step5/layout/parallel.hpp"

namespace step5 {

/// Loader shard ids (SPEC §3) in fused-row order; index 7 (`index_w`) is `sparse_indexer_w`.
/// Indices 0..6 equal `layout::Shard`.
inline constexpr int kNumLoaderShards = layout::kNumShards + 1;
inline constexpr int kIndexWShard = layout::kNumShards;
inline constexpr std::array<std::string_view, kNumLoaderShards> kLoaderShardIds = {
    "q", "k", "v", "index_q", "index_k", "index_z", "index_g", "index_w"};

/// The loader shard index of a shard id ("q" ... "index_w"), or nullopt.
constexpr std::optional<int> loader_shard_index(std::string_view shard_id) {
  for (int i = 0; i < kNumLoaderShards; ++i)
    if (kLoaderShardIds[i] == shard_id) return i;
  return std::nullopt;
}

/// The separate projection tensors of a layer (SPEC §7 name suffix, loader shard id), in load order.
inline constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kProjectionTensors = {{
    {"q_proj.weight", "q"},
    {"k_proj.weight", "k"},
    {"v_proj.weight", "v"},
    {"g_proj.weight", "index_g"},
    {"sparse_indexer_q.weight", "index_q"},
    {"sparse_indexer_k.weight", "index_k"},
    {"sparse_indexer_z.weight", "index_z"},
    {"sparse_indexer_w.weight", "index_w"},
}};

/// Maps a checkpoint tensor name (SPEC §7) to its loader shard id:
/// `*.q_proj.weight` -> q, `*.k_proj.weight` -> k, `*.v_proj.weight` -> v, `*.g_proj.weight` ->
/// index_g, `*.sparse_indexer_{q,k,z,w}.weight` -> index_{q,k,z,w}. The name may carry any prefix
/// (`model.layers.N.self_attn.`) or none. Other names (o_proj, norms, ssmax_s, ...) -> nullopt.
/// A pre-fused `qkv_indexer_proj` is not mapped (see `FusedWeightLoader::load_named`).
constexpr std::optional<std::string_view> checkpoint_shard_id(std::string_view name) {
  for (const auto& [suffix, id] : kProjectionTensors) {
    if (name == suffix) return id;
    if (name.size() > suffix.size() && name.ends_with(suffix) && name[name.size() - suffix.size() - 1] == '.')
      return id;
  }
  return std::nullopt;
}

/// True for a pre-fused projection tensor name (contains the component `qkv_indexer_proj`).
constexpr bool is_prefused_projection_name(std::string_view name) {
  return name.find("qkv_indexer_proj") != std::string_view::npos;
}

namespace detail::fused_weight {
constexpr bool is_quantized(DType t) {
  return t == DType::kF8E4M3 || t == DType::kF8E5M2 || t == DType::kI8 || t == DType::kU8;
}
}  // namespace detail::fused_weight

/// Owns and assembles the fused projection weight of one TP rank (SPEC §3), enforcing the
/// loader contract. Typical use:
/// \code
///   step5::FusedWeightLoader loader(rank_layout, hidden);
///   for (const TensorView& t : layer_tensors) loader.load_named(t);   // or load("q", t), ...
///   loader.assert_fully_loaded("model.layers.3.self_attn");            // throws on a gap
///   upload(loader.weight());                                           // [padded_rows, hidden] bf16
/// \endcode
class FusedWeightLoader {
 public:
  /// `rank`: a valid layout (from `make_rank_layout`/`rank_layout`); `hidden` > 0 (GEMM K).
  /// Throws `Error(kInvalidArgument)` on a non-positive hidden or a layout that is not exactly
  /// make_rank_layout's (`layout::check_rank_layout`: an edited shard offset would make the copies
  /// read past a tensor or write past the fused matrix). The matrix is allocated when the first
  /// tensor passes its checks (`load`), so a `hidden` the tensors do not have is refused by their
  /// shape instead of by an allocation of `rank.padded_rows × hidden` that cannot succeed.
  FusedWeightLoader(const layout::RankLayout& rank, int hidden) : rank_(rank), hidden_(hidden) {
    if (hidden <= 0)
      throw Error(StatusCode::kInvalidArgument,
                  "FusedWeightLoader: hidden must be > 0, got " + std::to_string(hidden));
    throw_if_error(layout::check_rank_layout(rank, "FusedWeightLoader"));
  }

  const layout::RankLayout& rank() const { return rank_; }
  int hidden() const { return hidden_; }
  /// Rows of the fused matrix (`rank.padded_rows`).
  int rows() const { return rank_.padded_rows; }

  /// Global checkpoint row count of a loader shard (SPEC §1): q H*D, k/v KV*D, index_q Ni*P,
  /// index_k/z Nk*P, index_g gate, index_w Ni.
  int global_rows(int shard) const {
    const auto& g = rank_.geometry;
    switch (shard) {
      case 0: return g.num_heads * g.head_dim;
      case 1: case 2: return g.num_kv_heads * g.head_dim;
      case 3: return g.index_num_heads * g.proxy_dim;
      case 4: case 5: return g.index_num_kv_heads * g.proxy_dim;
      case 6: return g.gate_size;
      default: return g.index_num_heads;
    }
  }

  /// The shard map entry of a loader shard (index_w -> `rank.indexer_w`).
  const layout::ShardSpec& spec(int shard) const {
    return shard == kIndexWShard ? rank_.indexer_w : rank_.shards[static_cast<std::size_t>(shard)];
  }

  /// Shard ids this layer requires, in fused-row order (index_g only when gate_size > 0).
  std::vector<std::string> required_shards() const {
    std::vector<std::string> out;
    for (int i = 0; i < kNumLoaderShards; ++i)
      if (required(i)) out.emplace_back(kLoaderShardIds[i]);
    return out;
  }

  /// Loads one checkpoint tensor `[rows_global, hidden]` as shard `shard_id`, copying this
  /// rank's rows into place (converting F32/F16 to bf16, RNE). Starts a new load when none is in
  /// progress (zeroes the matrix and hides it until `assert_fully_loaded`). Throws `Error`:
  /// a pre-fused `qkv_indexer_proj` name (kUnsupported, as `load_named`), unknown shard id or
  /// index_g with gate_size 0 (kInvalidArgument), quantized dtype or other unsupported dtype
  /// (kUnsupported), wrong shape or null data (kInvalidArgument).
  void load(std::string_view shard_id, const TensorView& t) {
    const std::string tname = t.name.empty() ? std::string("<unnamed ") + std::string(shard_id) + " tensor>" : t.name;
    if (is_prefused_projection_name(t.name)) throw prefused_error(t.name);
    const auto idx = loader_shard_index(shard_id);
    if (!idx) {
      std::string ids;
      for (auto s : kLoaderShardIds) {
        if (!ids.empty()) ids += ' ';
        ids += s;
      }
      throw Error(StatusCode::kInvalidArgument, "fused weight: unknown shard id '" + std::string(shard_id) +
                                                    "' for tensor " + tname + "; expected one of: " + ids);
    }
    const int shard = *idx;
    if (shard == static_cast<int>(layout::Shard::kIndexG) && rank_.geometry.gate_size == 0)
      throw Error(StatusCode::kInvalidArgument, "fused weight: tensor " + tname +
                                                    " (shard index_g) given, but this geometry has gate_size 0 "
                                                    "(no head-wise gate)");
    if (detail::fused_weight::is_quantized(t.dtype))
      throw Error(StatusCode::kUnsupported,
                  "fused weight: tensor " + tname + " (shard " + std::string(shard_id) + ") is quantized (dtype " +
                      std::string(dtype_name(t.dtype)) +
                      "); expected BF16 (F32/F16 are converted): quantized attention projections are refused");
    if (t.dtype != DType::kBF16 && t.dtype != DType::kF32 && t.dtype != DType::kF16)
      throw Error(StatusCode::kUnsupported, "fused weight: tensor " + tname + " (shard " + std::string(shard_id) +
                                                ") has unsupported dtype " + std::string(dtype_name(t.dtype)) +
                                                "; expected BF16 (or F32/F16, converted to bf16)");
    const std::vector<std::int64_t> expected = {global_rows(shard), hidden_};
    if (t.shape != expected)
      throw Error(StatusCode::kInvalidArgument, "fused weight: tensor " + tname + " (shard " +
                                                    std::string(shard_id) + ") has shape " + shape_string(t.shape) +
                                                    "; expected " + shape_string(expected));
    if (t.data == nullptr && t.numel() > 0)
      throw Error(StatusCode::kInvalidArgument, "fused weight: tensor " + tname + " has no data (null pointer)");

    begin_load_if_needed();
    const layout::ShardSpec& s = spec(shard);
    const std::size_t h = static_cast<std::size_t>(hidden_);
    for (int r = 0; r < s.rows; ++r) {
      const std::size_t src = static_cast<std::size_t>(s.src_row + r) * h;
      bf16* dst = matrix_.data() + static_cast<std::size_t>(s.dst_row + r) * h;
      // Memory-mapped safetensors data has no per-element alignment guarantee: read it through
      // memcpy from byte pointers, never through a typed pointer.
      switch (t.dtype) {
        case DType::kBF16:
          std::memcpy(static_cast<void*>(dst), static_cast<const unsigned char*>(t.data) + src * sizeof(std::uint16_t),
                      h * sizeof(std::uint16_t));
          break;
        case DType::kF32: {
          const auto* p = static_cast<const unsigned char*>(t.data) + src * sizeof(float);
          for (std::size_t c = 0; c < h; ++c) {
            float x;
            std::memcpy(&x, p + c * sizeof(float), sizeof x);
            dst[c].bits = float_to_bf16_bits(x);
          }
          break;
        }
        default: {  // F16
          const auto* p = static_cast<const unsigned char*>(t.data) + src * sizeof(std::uint16_t);
          for (std::size_t c = 0; c < h; ++c) {
            std::uint16_t x;
            std::memcpy(&x, p + c * sizeof(std::uint16_t), sizeof x);
            dst[c].bits = float_to_bf16_bits(f16_bits_to_float(x));
          }
          break;
        }
      }
    }
    loaded_[static_cast<std::size_t>(shard)] = true;
  }

  /// Loads a tensor by its checkpoint name (`t.name`, SPEC §7; see `checkpoint_shard_id`).
  /// Returns false (and does nothing) for a tensor that is not part of the fused weight
  /// (o_proj, norms, ssmax_s, ...). Throws `Error(kUnsupported)` for a pre-fused
  /// `qkv_indexer_proj` tensor (Step5 requires the separate projections), and as `load`.
  bool load_named(const TensorView& t) {
    if (is_prefused_projection_name(t.name)) throw prefused_error(t.name);
    const auto id = checkpoint_shard_id(t.name);
    if (!id) return false;
    load(*id, t);
    return true;
  }

  /// Shard ids loaded since the current load began, in fused-row order.
  std::vector<std::string> loaded_shards() const {
    std::vector<std::string> out;
    for (int i = 0; i < kNumLoaderShards; ++i)
      if (loaded_[static_cast<std::size_t>(i)]) out.emplace_back(kLoaderShardIds[i]);
    return out;
  }

  /// Required shard ids not loaded in the current load, sorted (lexicographically).
  std::vector<std::string> missing_shards() const {
    std::vector<std::string> out;
    for (int i = 0; i < kNumLoaderShards; ++i)
      if (required(i) && !loaded_[static_cast<std::size_t>(i)]) out.emplace_back(kLoaderShardIds[i]);
    std::sort(out.begin(), out.end());
    return out;
  }

  /// SPEC §3: succeeds iff every required shard was loaded in the current load; then the matrix
  /// becomes available through `weight()`. Either way the record is forgotten, so the next load
  /// must supply every shard again. On failure throws `Error(kNotFound)` naming `prefix` and the
  /// sorted missing shard ids, and zeroes the matrix (nothing partial can be used).
  void assert_fully_loaded(std::string_view prefix) {
    const std::vector<std::string> missing = missing_shards();
    loaded_.fill(false);
    if (!missing.empty()) {
      ready_ = false;
      std::fill(matrix_.begin(), matrix_.end(), bf16{});
      loading_ = false;
      std::string list;
      for (const auto& m : missing) {
        if (!list.empty()) list += ", ";
        list += m;
      }
      throw Error(StatusCode::kNotFound, std::string(prefix) + ": fused projection weight (tp_rank " +
                                             std::to_string(rank_.tp_rank) + " of " +
                                             std::to_string(rank_.parallel.tp_size) +
                                             ") is missing shards [" + list + "]");
    }
    ready_ = true;
    loading_ = false;
  }

  /// Forgets the current load: clears the record, zeroes and hides the matrix.
  void reset_load_state() {
    loaded_.fill(false);
    ready_ = false;
    loading_ = false;
    std::fill(matrix_.begin(), matrix_.end(), bf16{});
  }

  /// True when the matrix is complete (after a successful `assert_fully_loaded`, before the next
  /// `load`/reset).
  bool ready() const { return ready_; }

  /// The fused matrix, bf16 row-major `[rows(), hidden()]` (padding rows are zero). Throws
  /// `Error(kInvalidArgument)` unless `ready()`.
  std::span<const bf16> weight() const {
    if (!ready_)
      throw Error(StatusCode::kInvalidArgument,
                  "fused weight: the matrix is not available: call assert_fully_loaded() after loading every "
                  "shard (a load in progress or a failed check hides it)");
    return {matrix_.data(), matrix_.size()};
  }

 private:
  bool required(int shard) const {
    if (shard == static_cast<int>(layout::Shard::kIndexG)) return rank_.geometry.gate_size > 0;
    return true;
  }
  void begin_load_if_needed() {
    if (loading_) return;
    matrix_.assign(static_cast<std::size_t>(rank_.padded_rows) * static_cast<std::size_t>(hidden_), bf16{});
    loaded_.fill(false);
    ready_ = false;
    loading_ = true;
  }
  static Error prefused_error(const std::string& name) {
    return Error(StatusCode::kUnsupported,
                 "fused weight: pre-fused tensor " + name +
                     " refused: Step5 checkpoints must provide the separate projections (q_proj, k_proj, v_proj, "
                     "sparse_indexer_q/k/z/w, g_proj) so each rank can cut its own rows (SPEC §3)");
  }

  layout::RankLayout rank_;
  int hidden_;
  std::vector<bf16> matrix_;
  std::array<bool, kNumLoaderShards> loaded_{};
  bool loading_ = false;
  bool ready_ = false;
};

}  // namespace step5
