#pragma once
/// \file step5/weights/checkpoint_generator.hpp
/// Writes a synthetic Step5-format checkpoint (SPEC.md §7) for any geometry of the list
/// (geometries.def, by name), any number of layers and any hidden size: `config.json` (text
/// fields nested under `text_config`, indexer fields under `text_config.sparse_config`, as the
/// Step-5 Preview release) plus `model.safetensors`, or `model-0000i-of-0000N.safetensors`
/// shards with `model.safetensors.index.json`.
///
/// Tensors of layer N, under `model.layers.N.self_attn.` (shapes `[rows, hidden]` unless noted):
///   q_proj `[H*D]`, k_proj `[KV*D]`, v_proj `[KV*D]`, o_proj `[hidden, H*D]`, g_proj `[gate]`
///   (only when gate > 0) — bf16, std 0.02;
///   q_norm, k_norm `[D]` — fp32, std 0.1 (zero-centred weights, used as 1 + w);
///   sparse_indexer_q `[Ni*P]`, sparse_indexer_k `[Nk*P]` — bf16, std 0.02;
///   sparse_indexer_z `[Nk*P]` — bf16, std hidden^-0.5; sparse_indexer_w `[Ni]` — fp32, std 0.02;
///   sparse_indexer_q_norm.weight, sparse_indexer_k_norm.weight, sparse_indexer_k_norm.bias `[P]`
///   — fp32, std 0.1; ssmax_s `[H]` — fp32 zeros (unused, SPEC §4.7).
/// These are the shapes, dtypes and scales of the golden data (tests/data/golden/manifest.json
/// "weights"). Layer types follow Step-5 Preview: `full_attention` on layers 4k+3 (the DSA
/// layers), `sliding_attention` otherwise. Decision: by default NON-DSA layers get the same
/// full set of tensors, indexer included (so a driver may run any layer through the DSA path);
/// `indexer_on_all_layers = false` writes indexer tensors only on DSA layers, like the real
/// checkpoint.
///
/// Values are deterministic given the seed. Element i of a tensor uses a counter-based
/// splitmix64 stream keyed by `FNV-1a-64("{seed}:{prng_name}")`, where `prng_name` is the
/// tensor name without `model.layers.N.self_attn.` for layer 0 (the golden convention) and
/// `layers.N.<that>` for N > 0:
///   - `WeightPrng::kGoldenExact`: the golden generator exactly (manifest "generator": 12
///     uniforms per element, Irwin-Hall, value = n*std in float64, rounded to fp32 then bf16),
///     so layer 0 of a step5_preview checkpoint with hidden 512 and seed 20250601 reproduces
///     the golden layer's weights tensor for tensor, bit for bit (the manifest's sha256 per
///     tensor; the golden tests regenerate them this way: tests/host/golden_data.hpp). ~12x slower.
///   - `WeightPrng::kFast` (default): one splitmix64 draw per element, the sum of its four
///     16-bit uniforms rescaled to unit variance (Irwin-Hall n=4, |n| < 3.47), times std
///     (bf16 tensors compute it in fp32 with one folded scale: a few ns per element).
/// Tensors are generated in chunks (split over `num_threads` threads) and streamed to the file
/// (memory use is 4 MB per thread whatever the size). Throws `step5::Error` (unknown geometry — the message lists the rows —, bad
/// options, I/O failures naming the file).
///
/// Host only (g++); needs nlohmann-json.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/core/tensor.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/weights/config.hpp"  // kConfigMaxLayers, kConfigMaxDim: the bounds its reader applies
#include "step5/weights/safetensors_writer.hpp"

namespace step5 {

/// Random stream used for the generated weights (see the file comment).
enum class WeightPrng { kFast, kGoldenExact };

/// Options of `generate_checkpoint`.
struct CheckpointOptions {
  std::string geometry = "step5_preview";  ///< a row id of geometries.def
  int num_layers = 4;                      ///< num_hidden_layers (no MTP layers are written)
  int hidden = 0;                          ///< hidden_size; 0 = the row's default
  std::uint64_t seed = 20250601;           ///< the golden data's seed by default
  int num_shards = 1;                      ///< 1 = model.safetensors; >1 = shards + index json
  int topk = 512;                          ///< sparse_config.topk
  double rope_theta_full = 5e6;            ///< rope_theta of full_attention (DSA) layers
  double rope_theta_sliding = 1e4;         ///< rope_theta of sliding_attention layers
  double rms_norm_eps = 1e-5;
  WeightPrng prng = WeightPrng::kFast;
  bool indexer_on_all_layers = true;       ///< see the file comment
  /// Write tensors only for the DSA (full_attention) layers; config.json still describes all
  /// num_layers layers. For drivers that run only the DSA layers (examples/step5_driver): a
  /// Step-5 Preview–pattern checkpoint of 4N layers then holds N layers' tensors.
  bool dsa_layers_only = false;
  int num_threads = 0;                     ///< generator threads; 0 = hardware threads (at most 16).
                                           ///< The output does not depend on it.
  /// Per-layer types (num_layers entries, "full_attention" = DSA); empty = the Step-5 Preview
  /// pattern (full_attention on 4k+3). Note that a checkpoint needs at least one full_attention
  /// layer for `parse_model_config` to derive the geometry (1-3 layer checkpoints need this).
  std::vector<std::string> layer_types;
};

/// What `generate_checkpoint` wrote.
struct GeneratedCheckpoint {
  std::string dir;
  std::vector<std::string> files;   ///< safetensors files (full paths), in order
  std::uint64_t data_bytes = 0;     ///< total tensor bytes
  nlohmann::json config;            ///< the config.json written
};

/// One tensor to generate: spec, normal std (0 = zeros) and PRNG stream name.
struct WeightInit {
  TensorSpec spec;
  double std = 0.0;
  std::string prng_name;
};

namespace detail {

inline std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

inline std::uint64_t splitmix_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline const layout::GeometryEntry& geometry_entry_or_throw(const std::string& name) {
  if (const auto* e = layout::find_geometry(name)) return *e;
  throw Error(StatusCode::kUnsupported,
              "unknown geometry '" + name + "'; supported: " + layout::supported_layouts());
}

}  // namespace detail

/// The PRNG key of a tensor stream: FNV-1a-64 of "{seed}:{prng_name}".
inline std::uint64_t weight_stream_key(std::uint64_t seed, const std::string& prng_name) {
  return detail::fnv1a64(std::to_string(seed) + ":" + prng_name);
}

/// The unit-variance draw of element `i` of the stream `key` (n; the weight is n × std).
/// kGoldenExact returns the exact float64 Irwin-Hall(12) value of the golden generator.
inline double weight_normal(std::uint64_t key, std::uint64_t i, WeightPrng prng) {
  constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  if (prng == WeightPrng::kGoldenExact) {
    double s = 0.0;
    for (std::uint64_t j = 0; j < 12; ++j) {
      const std::uint64_t z = detail::splitmix_mix(key + (12 * i + j + 1) * kGamma);
      s += static_cast<double>(z >> 40) * (1.0 / 16777216.0);
    }
    return s - 6.0;
  }
  const std::uint64_t z = detail::splitmix_mix(key + (i + 1) * kGamma);
  const std::uint32_t s = static_cast<std::uint32_t>(z & 0xffff) + static_cast<std::uint32_t>((z >> 16) & 0xffff) +
                          static_cast<std::uint32_t>((z >> 32) & 0xffff) + static_cast<std::uint32_t>(z >> 48);
  // u_k = (x_k + 0.5) / 65536; sum of 4 has mean 2 and variance 1/3
  return ((static_cast<double>(s) + 2.0) * (1.0 / 65536.0) - 2.0) * 1.7320508075688772;
}

/// Layer types of a generated checkpoint: Step-5 Preview pattern (full_attention on 4k+3).
inline std::vector<std::string> preview_layer_types(int num_layers) {
  std::vector<std::string> t;
  for (int i = 0; i < num_layers; ++i) t.push_back(i % 4 == 3 ? "full_attention" : "sliding_attention");
  return t;
}

/// The tensors of layer `layer` (see the file comment), in the order they are written.
inline std::vector<WeightInit> layer_weight_inits(const layout::Geometry& g, int hidden, int layer, bool with_indexer) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
  const std::string pprefix = layer == 0 ? std::string() : "layers." + std::to_string(layer) + ".";
  const std::int64_t h = hidden, H = g.num_heads, KV = g.num_kv_heads, D = g.head_dim, Ni = g.index_num_heads,
                     P = g.proxy_dim, Nk = g.index_num_kv_heads;
  std::vector<WeightInit> r;
  auto add = [&](const std::string& n, DType t, std::vector<std::int64_t> shape, double std) {
    r.push_back({TensorSpec{prefix + n, t, std::move(shape)}, std, pprefix + n});
  };
  add("q_proj.weight", DType::kBF16, {H * D, h}, 0.02);
  add("k_proj.weight", DType::kBF16, {KV * D, h}, 0.02);
  add("v_proj.weight", DType::kBF16, {KV * D, h}, 0.02);
  add("o_proj.weight", DType::kBF16, {h, H * D}, 0.02);
  if (g.gate_size > 0) add("g_proj.weight", DType::kBF16, {g.gate_size, h}, 0.02);
  add("q_norm.weight", DType::kF32, {D}, 0.1);
  add("k_norm.weight", DType::kF32, {D}, 0.1);
  if (with_indexer) {
    add("sparse_indexer_q.weight", DType::kBF16, {Ni * P, h}, 0.02);
    add("sparse_indexer_k.weight", DType::kBF16, {Nk * P, h}, 0.02);
    add("sparse_indexer_z.weight", DType::kBF16, {Nk * P, h}, 1.0 / std::sqrt(static_cast<double>(hidden)));
    add("sparse_indexer_w.weight", DType::kF32, {Ni, h}, 0.02);
    add("sparse_indexer_q_norm.weight", DType::kF32, {P}, 0.1);
    add("sparse_indexer_k_norm.weight", DType::kF32, {P}, 0.1);
    add("sparse_indexer_k_norm.bias", DType::kF32, {P}, 0.1);
    add("ssmax_s", DType::kF32, {H}, 0.0);
  }
  return r;
}

/// The layer types a generated checkpoint uses (`o.layer_types` or the Preview pattern).
inline std::vector<std::string> checkpoint_layer_types(const CheckpointOptions& o) {
  if (o.layer_types.empty()) return preview_layer_types(o.num_layers);
  if (o.layer_types.size() != static_cast<std::size_t>(std::max(o.num_layers, 0)))
    throw Error(StatusCode::kInvalidArgument, "checkpoint generator: layer_types has " + std::to_string(o.layer_types.size()) +
                                                  " entries, num_layers = " + std::to_string(o.num_layers));
  return o.layer_types;
}

/// Every tensor a generated checkpoint holds, in the order they are written (layer by layer;
/// `o.dsa_layers_only` skips the non-DSA layers). Throws `Error` on an unknown geometry or bad
/// layer_types.
inline std::vector<WeightInit> checkpoint_weight_inits(const CheckpointOptions& o) {
  const auto& e = detail::geometry_entry_or_throw(o.geometry);
  const int hidden = o.hidden > 0 ? o.hidden : e.hidden;
  const auto types = checkpoint_layer_types(o);
  std::vector<WeightInit> all;
  for (int l = 0; l < o.num_layers; ++l) {
    const bool dsa = types[static_cast<std::size_t>(l)] == "full_attention";
    if (o.dsa_layers_only && !dsa) continue;
    auto v = layer_weight_inits(e.geometry, hidden, l, o.indexer_on_all_layers || dsa);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

/// Bytes of tensor data `generate_checkpoint(dir, o)` writes (the safetensors files add a JSON
/// header of about 200 bytes per tensor, and config.json a few KB). Computed without writing, to
/// check the free disk space first.
inline std::uint64_t checkpoint_data_bytes(const CheckpointOptions& o) {
  std::uint64_t n = 0;
  for (const auto& w : checkpoint_weight_inits(o)) n += w.spec.nbytes();
  return n;
}

/// The config.json (nested under text_config) describing a generated checkpoint.
inline nlohmann::json make_checkpoint_config(const CheckpointOptions& o) {
  const auto& e = detail::geometry_entry_or_throw(o.geometry);
  const auto& g = e.geometry;
  const int hidden = o.hidden > 0 ? o.hidden : e.hidden;
  const auto types = checkpoint_layer_types(o);
  std::vector<double> theta, factors;
  for (const auto& t : types) {
    const bool full = t == "full_attention";
    theta.push_back(full ? o.rope_theta_full : o.rope_theta_sliding);
    factors.push_back(full ? static_cast<double>(g.rot_main) / g.head_dim : 1.0);
  }
  nlohmann::json sparse = {
      {"enabled", true},
      {"proxy_dim", g.proxy_dim},
      {"sparse_indexer_rope_dim", g.rot_idx},
      {"sparse_indexer_use_rope", true},
      {"sparse_indexer_num_heads", g.index_num_heads},
      {"sparse_indexer_num_k_heads", g.index_num_kv_heads},
      {"sparse_indexer_q_norm_type", "rmsnorm"},
      {"sparse_indexer_k_norm_type", "layernorm"},
      {"sparse_indexer_csa_z_norm_type", "none"},
      {"num_provider_groups", g.num_kv_heads},
      {"topk", o.topk},
      {"region_block_size", g.region_size},
      {"compression_method", "csa_block_compress"},
      {"attention_impl", "sparse_gqa"},
      {"apply_to_layer_types", {"full_attention"}},
  };
  nlohmann::json text = {
      {"model_type", "step4"},
      {"architectures", {"Step4ForCausalLM"}},
      {"hidden_size", hidden},
      {"num_hidden_layers", o.num_layers},
      {"num_nextn_predict_layers", 0},
      {"num_attention_heads", g.num_heads},
      {"num_attention_groups", g.num_kv_heads},
      {"head_dim", g.head_dim},
      {"rms_norm_eps", o.rms_norm_eps},
      {"layer_types", types},
      {"rope_theta", theta},
      {"partial_rotary_factors", factors},
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"factor", 1.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 32.0},
        {"original_max_position_embeddings", 1048576}}},
      {"yarn_only_types", {"full_attention"}},
      {"torch_dtype", "bfloat16"},
      {"sparse_config", sparse},
  };
  if (g.gate_size == g.num_heads || g.gate_size == 0)
    text["use_head_wise_attn_gate"] = g.gate_size > 0;
  else
    text["gate_output_size"] = g.gate_size;
  return {{"model_type", "step3p5v"},
          {"text_config", text},
          {"step5_generator",
           {{"geometry", o.geometry},
            {"seed", o.seed},
            {"prng", o.prng == WeightPrng::kGoldenExact ? "golden_exact" : "fast"},
            {"indexer_on_all_layers", o.indexer_on_all_layers}}}};
}

/// Fills `out[0..n)` with the values (as raw bytes of `w.spec.dtype`) of elements
/// `first .. first+n` of tensor `w` (only BF16 and F32 are generated).
inline void generate_weight_chunk(const WeightInit& w, std::uint64_t key, std::uint64_t first, std::size_t n,
                                  WeightPrng prng, void* out) {
  if (w.spec.dtype == DType::kBF16) {
    auto* o = static_cast<std::uint16_t*>(out);
    if (w.std == 0.0) {
      std::fill(o, o + n, std::uint16_t{0});
      return;
    }
    if (prng == WeightPrng::kFast) {
      // weight_normal(kFast) * std with the constants folded into one fp32 scale (the sum of the
      // four 16-bit uniforms minus its mean is an exact integer): vectorizable hot loop.
      constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;
      const float scale = static_cast<float>(w.std * 1.7320508075688772 / 65536.0);
      for (std::size_t k = 0; k < n; ++k) {
        const std::uint64_t z = detail::splitmix_mix(key + (first + k + 1) * kGamma);
        const std::int32_t sum = static_cast<std::int32_t>((z & 0xffff) + ((z >> 16) & 0xffff) + ((z >> 32) & 0xffff) + (z >> 48));
        o[k] = float_to_bf16_bits(static_cast<float>(sum - 131070) * scale);
      }
      return;
    }
    for (std::size_t k = 0; k < n; ++k)
      o[k] = float_to_bf16_bits(static_cast<float>(weight_normal(key, first + k, prng) * w.std));
  } else if (w.spec.dtype == DType::kF32) {
    auto* o = static_cast<float*>(out);
    if (w.std == 0.0) {
      std::fill(o, o + n, 0.0f);
      return;
    }
    for (std::size_t k = 0; k < n; ++k) o[k] = static_cast<float>(weight_normal(key, first + k, prng) * w.std);
  } else {
    throw Error(StatusCode::kUnsupported, "checkpoint generator: dtype " + std::string(dtype_name(w.spec.dtype)) +
                                              " of '" + w.spec.name + "' is not generated");
  }
}

/// Writes a checkpoint into directory `dir` (created if needed; existing files of the same
/// names are overwritten). See the file comment. Throws `step5::Error`.
inline GeneratedCheckpoint generate_checkpoint(const std::string& dir, const CheckpointOptions& o) {
  namespace fs = std::filesystem;
  (void)detail::geometry_entry_or_throw(o.geometry);
  // the bounds parse_model_config reads the written config.json with (a checkpoint it would refuse
  // is not written; a huge num_layers was attempted as its list of tensors: std::bad_alloc)
  if (o.num_layers < 1 || o.num_layers > detail::kConfigMaxLayers)
    throw Error(StatusCode::kInvalidArgument, "checkpoint generator: num_layers = " + std::to_string(o.num_layers) +
                                                  " outside [1, kConfigMaxLayers = " + std::to_string(detail::kConfigMaxLayers) + "]");
  if (o.hidden < 0 || o.hidden > detail::kConfigMaxDim)
    throw Error(StatusCode::kInvalidArgument, "checkpoint generator: hidden = " + std::to_string(o.hidden) +
                                                  " outside [0, kConfigMaxDim = " + std::to_string(detail::kConfigMaxDim) +
                                                  "] (0: the geometry's default)");
  if (o.topk < 1 || o.topk > layout::kMaxTopk)
    throw Error(StatusCode::kInvalidArgument, "checkpoint generator: topk = " + std::to_string(o.topk) + " outside [1, " +
                                                  std::to_string(layout::kMaxTopk) + "]");
  // every check before the first file: a refused call leaves no config.json behind
  const std::vector<WeightInit> all = checkpoint_weight_inits(o);
  const int shards = o.num_shards;
  if (shards < 1 || static_cast<std::size_t>(shards) > all.size())
    throw Error(StatusCode::kInvalidArgument, "checkpoint generator: num_shards = " + std::to_string(shards) +
                                                  " outside [1, " + std::to_string(all.size()) + "] (number of tensors)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    throw Error(StatusCode::kIoError, "checkpoint generator: cannot create directory '" + dir + "'");

  GeneratedCheckpoint out;
  out.dir = dir;
  out.config = make_checkpoint_config(o);
  {
    const std::string cfg = (fs::path(dir) / "config.json").string();
    std::ofstream f(cfg, std::ios::binary | std::ios::trunc);
    f << out.config.dump(2) << "\n";
    if (!f) throw Error(StatusCode::kIoError, "checkpoint generator: cannot write '" + cfg + "'");
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const int nt = o.num_threads > 0 ? std::min(o.num_threads, 64)
                                   : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  std::vector<std::uint8_t> buf((std::size_t{1} << 22) * static_cast<std::size_t>(nt));
  // Fills buf with elements [first, first+n) of `wi`, split over nt threads (counter-based PRNG:
  // the bytes do not depend on the split).
  auto fill = [&](const WeightInit& wi, std::uint64_t key, std::uint64_t first, std::size_t n, std::size_t es) {
    if (nt == 1 || n < (std::size_t{1} << 16)) {
      generate_weight_chunk(wi, key, first, n, o.prng, buf.data());
      return;
    }
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(nt));
    const std::size_t per = (n + static_cast<std::size_t>(nt) - 1) / static_cast<std::size_t>(nt);
    for (int t = 0; t < nt; ++t) {
      const std::size_t lo = std::min(n, per * static_cast<std::size_t>(t)), hi = std::min(n, lo + per);
      if (lo == hi) break;
      threads.emplace_back([&, t, lo, hi] {
        try {
          generate_weight_chunk(wi, key, first + lo, hi - lo, o.prng, buf.data() + lo * es);
        } catch (...) {
          errors[static_cast<std::size_t>(t)] = std::current_exception();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  };
  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < shards; ++s) {
    const std::size_t lo = all.size() * static_cast<std::size_t>(s) / static_cast<std::size_t>(shards);
    const std::size_t hi = all.size() * static_cast<std::size_t>(s + 1) / static_cast<std::size_t>(shards);
    char name[64];
    if (shards == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    const std::string path = (fs::path(dir) / name).string();
    std::vector<TensorSpec> specs;
    for (std::size_t i = lo; i < hi; ++i) {
      specs.push_back(all[i].spec);
      weight_map[all[i].spec.name] = name;
    }
    SafetensorsWriter w(path, specs, meta);
    for (std::size_t i = lo; i < hi; ++i) {
      const WeightInit& wi = all[i];
      const std::uint64_t key = weight_stream_key(o.seed, wi.prng_name);
      const std::size_t es = dtype_size(wi.spec.dtype);
      const std::uint64_t numel = wi.spec.nbytes() / es;
      const std::size_t per = buf.size() / es;
      for (std::uint64_t first = 0; first < numel; first += per) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(per, numel - first));
        fill(wi, key, first, n, es);
        w.append(buf.data(), n * es);
      }
    }
    w.finish();
    out.data_bytes += w.data_bytes();
    out.files.push_back(path);
  }
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  if (shards > 1) {
    nlohmann::json idx = {{"metadata", {{"total_size", out.data_bytes}}}, {"weight_map", weight_map}};
    std::ofstream f(index, std::ios::binary | std::ios::trunc);
    f << idx.dump(2) << "\n";
    if (!f) throw Error(StatusCode::kIoError, "checkpoint generator: cannot write '" + index + "'");
  } else {
    fs::remove(index, ec);  // a stale index from an earlier sharded run would shadow model.safetensors
  }
  return out;
}

/// `generate_checkpoint` into a temporary sibling directory `<dir>.partial-<pid>`, renamed to
/// `dir` only when every file is written: `dir` either does not exist or holds a complete
/// checkpoint, whatever fails (the temporary is removed on an error; after a kill it stays as
/// `<dir>.partial-<pid>`). `dir` must not exist yet (kInvalidArgument); if another process
/// renames its own complete copy to `dir` first, that copy is kept and ours removed. Returns
/// what was written, with paths under `dir`. Throws `step5::Error`.
inline GeneratedCheckpoint generate_checkpoint_atomically(const std::string& dir, const CheckpointOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path final_dir = fs::path(dir).lexically_normal();
  const fs::path target = final_dir.has_filename() ? final_dir : final_dir.parent_path();
  if (fs::exists(target, ec))
    throw Error(StatusCode::kInvalidArgument, "checkpoint generator: '" + target.string() +
                                                  "' already exists (refusing to write into it)");
  const fs::path tmp = target.string() + ".partial-" + std::to_string(static_cast<long long>(::getpid()));
  fs::remove_all(tmp, ec);
  GeneratedCheckpoint out;
  try {
    out = generate_checkpoint(tmp.string(), o);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove_all(tmp, ec);
    if (!fs::exists(target / "config.json", ec))  // else another process completed it first
      throw Error(StatusCode::kIoError, "checkpoint generator: cannot rename '" + tmp.string() + "' to '" +
                                            target.string() + "': " + why);
  }
  out.dir = target.string();
  for (auto& f : out.files) f = (target / fs::path(f).filename()).string();
  return out;
}

}  // namespace step5
