#pragma once
/// \file step5/weights/layer_loader.hpp
/// Loads one DSA layer of a Step5-format checkpoint (SPEC.md §7) for one TP rank into the
/// library's model type `model::LayerWeights` (step5/model/layer.hpp; the CPU reference consumes it), which the GPU backend uploads as
/// they are: the fused projection matrix through `FusedWeightLoader` (SPEC §3: the rank's rows
/// only, with `sparse_indexer_w` appended), the rank's o_proj columns (the columns of its q
/// heads, `rank.shard(Shard::kQ)`), the fp32 norm weights, and the layer's RoPE tables
/// (`rope_theta[layer]`, llama3 scaling only where `yarn_only_types` says). Only the rank's rows
/// of the memory-mapped tensors are read. Throws `step5::Error` naming the tensor, expected and
/// got. Host only (g++).
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "step5/core/status.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/model/layer.hpp"
#include "step5/model/rope.hpp"
#include "step5/weights/config.hpp"
#include "step5/weights/fused_weight.hpp"
#include "step5/weights/safetensors.hpp"

namespace step5 {

/// Bytes of checkpoint tensor data a rank's load touched (its shards' rows, its o_proj
/// columns, the norm vectors).
struct LayerLoadStats {
  std::size_t bytes_read = 0;
};

/// The checkpoint name prefix of layer `layer`: "model.layers.N.self_attn.".
inline std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + ".self_attn."; }

namespace detail {
/// `v` (the config field `name` of `cfg`) as fp32; throws `Error` (kInvalidArgument) naming the
/// field, the value and the range unless it is a positive fp32 value, in [denorm_min, FLT_MAX]
/// (`parse_model_config` refuses such configs already; this guards hand-built `ModelConfig`s,
/// where the cast would give inf or 0).
inline float config_float(const ModelConfig& cfg, double v, const char* name) {
  if (!is_positive_fp32(v))
    throw Error(StatusCode::kInvalidArgument, "load_layer_weights: config field '" + std::string(name) + "' = " +
                                                  model::detail::rope_num_text(v) + " (" + cfg.source +
                                                  ") is not a positive fp32 value in [" +
                                                  model::detail::rope_num_text(kMinPositiveFloat) + ", " +
                                                  model::detail::rope_num_text(kMaxFloat) + "]");
  return static_cast<float>(v);
}
/// An integer config field used as int, refused unless in [1, INT32_MAX] (parse_model_config
/// bounds it so; a hand-built ModelConfig does not go through it).
inline int config_positive_int(const ModelConfig& cfg, std::int64_t v, const char* name) {
  if (v < 1 || v > INT32_MAX)
    throw Error(StatusCode::kInvalidArgument, "load_layer_weights: config field '" + std::string(name) + "' = " +
                                                  std::to_string(v) + " (" + cfg.source + ") is not in [1, " +
                                                  std::to_string(INT32_MAX) + "]");
  return static_cast<int>(v);
}
}  // namespace detail

/// Loads DSA layer `layer` for `rank` (a valid RankLayout of `cfg.geometry`). RoPE tables cover
/// positions [0, max_position) (every position the caller will run must be below it);
/// max_position must be in [1, model::kMaxRopePositions] (checked first, before any tensor is
/// read: `Error` kInvalidArgument naming the value and the bound). Dtypes:
/// projections and o_proj bf16 (fp32/fp16 accepted and rounded to bf16, quantized refused, as
/// `FusedWeightLoader`), norm weights and bias fp32 `[D]`/`[P]`. Throws `Error` on a missing or
/// misshaped tensor, or an incomplete load (the missing shard ids are named), on a rank layout
/// whose geometry differs from cfg.geometry (kInvalidArgument), or on a config value used as fp32 (rms_norm_eps, rope_theta,
/// the llama3 factors) that is not a positive fp32 value (above FLT_MAX it would become inf) or a
/// llama3 scaling that model::rope_inv_freq refuses (low_freq_factor not below high_freq_factor
/// as fp32 values: parse_model_config refuses it first, a hand-built ModelConfig reaches it); on a
/// `layer` that is not a DSA layer of `cfg` (its RoPE and norms differ; kInvalidArgument naming
/// its type and the DSA layers) and on a RankLayout that is not make_rank_layout's.
/// SPEC §3 (shards), §4.2–4.3 (norms, RoPE), §7 (names).
inline model::LayerWeights load_layer_weights(const Checkpoint& ckpt, const ModelConfig& cfg, int layer,
                                                  const layout::RankLayout& rank, int max_position,
                                                  LayerLoadStats* stats = nullptr) {
  model::check_rope_max_position(max_position, "load_layer_weights");
  throw_if_error(layout::check_rank_layout(rank, "load_layer_weights"));
  if (!cfg.is_dsa_layer(layer)) {  // the tables below use the DSA layers' rotary dims (geometry)
    const std::vector<std::string> types = cfg.attention_layer_types();
    std::string dsa, apply;
    for (const int l : cfg.dsa_layers()) dsa += (dsa.empty() ? "" : ", ") + std::to_string(l);
    for (const std::string& t : cfg.sparse.apply_to_layer_types) apply += (apply.empty() ? "'" : ", '") + t + "'";
    const bool in_range = layer >= 0 && layer < static_cast<int>(types.size());
    throw Error(StatusCode::kInvalidArgument,
                "load_layer_weights: layer " + std::to_string(layer) + " (" + cfg.source + ") " +
                    (in_range ? "is '" + types[static_cast<std::size_t>(layer)] + "', not a DSA layer type ([" +
                                    apply + (apply.empty() ? "" : "'") + "] in apply_to_layer_types)"
                              : "is outside the " + std::to_string(types.size()) + " layers") +
                    "; expected one of the DSA layers [" + dsa + "]");
  }
  const std::string prefix = layer_prefix(layer);
  const layout::Geometry& g = rank.geometry;
  if (!(g == cfg.geometry))
    throw Error(StatusCode::kInvalidArgument, "load_layer_weights: the rank layout's geometry " + layout::describe(g) +
                                                  " differs from the config's (" + cfg.source + "): " +
                                                  layout::describe(cfg.geometry));
  const int hidden = cfg.hidden_size;
  LayerLoadStats st;
  // Fused projection (SPEC §3). A pre-fused tensor is refused by the loader (load_named).
  FusedWeightLoader loader(rank, hidden);
  if (const std::string fused = prefix + "qkv_indexer_proj.weight"; ckpt.contains(fused))
    loader.load_named(ckpt.view(fused));  // refused with a message (a pre-fused tensor)
  for (const auto& [suffix, id] : kProjectionTensors) {
    const std::string name = prefix + std::string(suffix);
    if (!ckpt.contains(name)) continue;
    const TensorView v = ckpt.view(name);
    if (loader.load_named(v))
      st.bytes_read += static_cast<std::size_t>(loader.spec(loader_shard_index(id).value_or(0)).rows) * hidden *
                       dtype_size(v.dtype);
  }
  loader.assert_fully_loaded(prefix.substr(0, prefix.size() - 1));
  model::LayerWeights w;
  w.rank = rank;
  w.hidden = hidden;
  w.eps = detail::config_float(cfg, cfg.rms_norm_eps, "rms_norm_eps");
  w.fused.assign(loader.weight().begin(), loader.weight().end());

  // o_proj [hidden, H*D]: this rank's columns are those of its q heads (row-parallel, SPEC §4.8).
  const layout::ShardSpec& qs = rank.shard(layout::Shard::kQ);
  // Dtype rules as the fused loader's: bf16 copied, fp32/fp16 rounded to bf16 (RNE), others refused.
  const TensorView o = ckpt.view(prefix + "o_proj.weight");
  const std::int64_t cols = static_cast<std::int64_t>(g.num_heads) * g.head_dim;
  const DType odt = o.dtype == DType::kF32 || o.dtype == DType::kF16 ? o.dtype : DType::kBF16;
  expect_tensor(o, odt, {hidden, cols});
  w.o_proj.resize(static_cast<std::size_t>(hidden) * qs.rows);
  for (int i = 0; i < hidden; ++i)
    for (int j = 0; j < qs.rows; ++j) {
      const std::int64_t e = static_cast<std::int64_t>(i) * cols + qs.src_row + j;
      bf16& dst = w.o_proj[static_cast<std::size_t>(i) * qs.rows + j];
      if (odt == DType::kBF16) std::memcpy(&dst, static_cast<const unsigned char*>(o.data) + e * 2, 2);
      else dst = to_bf16(element_as_float(o, e));
    }
  st.bytes_read += w.o_proj.size() * dtype_size(odt);

  auto vec = [&](const std::string& n, int len) {
    const TensorView v = ckpt.view(prefix + n);
    expect_tensor(v, DType::kF32, {len});
    st.bytes_read += v.nbytes();
    return to_float_vector(v);
  };
  w.q_norm = vec("q_norm.weight", g.head_dim);
  w.k_norm = vec("k_norm.weight", g.head_dim);
  w.index_q_norm = vec("sparse_indexer_q_norm.weight", g.proxy_dim);
  w.index_k_norm_weight = vec("sparse_indexer_k_norm.weight", g.proxy_dim);
  w.index_k_norm_bias = vec("sparse_indexer_k_norm.bias", g.proxy_dim);

  std::optional<model::Llama3Scaling> scaling;
  if (cfg.rope_scaling_applies(layer)) {
    const RopeScaling& s = *cfg.rope_scaling;
    scaling = model::Llama3Scaling{detail::config_float(cfg, s.factor, "rope_scaling.factor"),
                                       detail::config_float(cfg, s.low_freq_factor, "rope_scaling.low_freq_factor"),
                                       detail::config_float(cfg, s.high_freq_factor, "rope_scaling.high_freq_factor"),
                                       detail::config_positive_int(cfg, s.original_max_position_embeddings,
                                                                   "rope_scaling.original_max_position_embeddings")};
  }
  const double theta = cfg.rope_theta_of(layer);
  w.rope_main = model::make_rope_table(max_position, g.rot_main, theta, scaling);
  w.rope_idx = model::make_rope_table(max_position, g.rot_idx, theta, scaling);
  model::validate_weights(w);
  if (stats) stats->bytes_read += st.bytes_read;
  return w;
}

}  // namespace step5
