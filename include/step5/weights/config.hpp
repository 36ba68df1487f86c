#pragma once
/// \file step5/weights/config.hpp
/// `ModelConfig`: the attention-relevant part of a HF `config.json` of the Step5 family
/// (SPEC.md §1, §6, §7), and the derived `layout::Geometry`.
///
/// Where fields are looked up: Step5 nests the text model under `text_config`; every text field
/// is looked up there first and then at the top level (flat configs are accepted). Indexer
/// fields live in `sparse_config` (itself under `text_config` or at the top level).
///
/// Fields read (JSON type; all required unless marked optional):
///  - `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_attention_groups`,
///    `head_dim` (integers), `rms_norm_eps` (number), `num_nextn_predict_layers` (integer,
///    optional, default 0: the MTP layers).
///  - `gate_output_size` (integer; in the text section or `sparse_config`), else
///    `use_head_wise_attn_gate` (bool: true → `num_attention_heads`, false → 0).
///  - `layer_types_with_mtp` / `layer_types` (arrays of strings; SPEC §6: the first non-empty
///    one is the per-layer attention type list). At least one must be non-empty; where both
///    are non-empty, `layer_types` must be a prefix of `layer_types_with_mtp`.
///  - `rope_theta`: array of numbers (one per layer, MTP layers included) or a number (all layers).
///  - `partial_rotary_factors`: array (one per layer), else `partial_rotary_factor` (number).
///  - `rope_scaling` (optional object or null): `rope_type` (or `type`) "llama3" with
///    `factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`;
///    "default" means none; any other type is refused (kUnsupported).
///  - `yarn_only_types` (optional array of strings): the layer types the rope scaling applies
///    to (absent or empty: every layer, as the reference engine); a non-empty one must name at
///    least one layer's type.
///  - `sparse_config`: `num_provider_groups` (= index_tp_size), `proxy_dim`, `topk` (1..1024),
///    `sparse_indexer_rope_dim`, `region_block_size`, `sparse_indexer_num_heads`,
///    `sparse_indexer_num_k_heads`, `apply_to_layer_types` (array of strings). Optional fields
///    that say which maths the checkpoint expects must, where present, say this library's
///    (kUnsupported naming the field otherwise: the run would be silently wrong): `enabled` and
///    `sparse_indexer_use_rope` true, `sparse_indexer_q_norm_type` RMSNorm and
///    `sparse_indexer_k_norm_type` LayerNorm (SPEC §4 step 3; compared ignoring case and '_').
/// Per-layer lists must have `num_hidden_layers` or `num_hidden_layers +
/// num_nextn_predict_layers` entries. `parse_model_config` reads them in this order, one function
/// per step (`detail::config_read_*`, then `config_check_consistency`, `config_derive_rot_main`,
/// `config_derive_geometry`); the first problem found is the one reported.
///
/// Derived geometry (SPEC §1): H, KV, D, Ni, P, Nk, gate as above; `rot_main` =
/// `partial_rotary_factor × head_dim` of the DSA layers (layers whose type is in
/// `apply_to_layer_types`; all must agree and give an even integer ≤ D); `rot_idx` =
/// `sparse_indexer_rope_dim`; R = `region_block_size`. By default the geometry must be a row of
/// `layout::kGeometries` (SPEC §8); the error lists the rows.
///
/// Errors (`step5::Error`, message names the file, the field with its path, expected and
/// found): missing field (kNotFound, says where it was looked for), wrong JSON type or a value
/// out of range (kInvalidArgument; the numbers used as fp32 — `rms_norm_eps`, `rope_theta`, the
/// llama3 factors — must be in [smallest positive float, FLT_MAX], so that they neither overflow
/// to inf nor round to 0 as floats), values contradicting each other (num_provider_groups !=
/// num_attention_groups, list length != number of layers, DSA layers with different rotary
/// factors, `layer_types` not the prefix of `layer_types_with_mtp`), geometry not in the list
/// (kUnsupported), malformed JSON, a field given twice in one object, a config file that is not a
/// regular file or is above kMaxConfigBytes (kIoError), a missing file (kNotFound). Never crashes
/// on arbitrary input (fuzzed by tests/fuzz/fuzz_config.cpp).
///
/// Host only (g++); needs nlohmann-json.
#include <algorithm>  // std::find (yarn_only_types)
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "step5/core/mapped_file.hpp"
#include "step5/core/numeric.hpp"  // is_positive_fp32
#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/layout/model.hpp"
#include "step5/weights/json_keys.hpp"

namespace step5 {

/// llama3 RoPE scaling parameters (SPEC §1 `theta` row).
struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 0;
};

/// `sparse_config` of the DSA indexer (SPEC §1, §7).
struct SparseConfig {
  int num_provider_groups = 0;        ///< G = index_tp_size
  int proxy_dim = 0;                  ///< P
  int topk = 0;                       ///< regions selected per (token, group), 1..1024
  int sparse_indexer_rope_dim = 0;    ///< rot_idx
  int region_block_size = 0;          ///< R
  int sparse_indexer_num_heads = 0;   ///< Ni
  int sparse_indexer_num_k_heads = 0; ///< Nk
  std::vector<std::string> apply_to_layer_types;  ///< layer types that run DSA
};

/// The attention-relevant model configuration (see the file comment for the fields).
struct ModelConfig {
  std::string source;  ///< file (or label) it was parsed from, for messages
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_nextn_predict_layers = 0;  ///< MTP layers (after the dense stack)
  int num_attention_heads = 0;
  int num_attention_groups = 0;
  int head_dim = 0;
  int gate_output_size = 0;
  double rms_norm_eps = 0.0;
  std::vector<double> rope_theta;              ///< per layer (a scalar is replicated to total_layers())
  std::vector<double> partial_rotary_factors;  ///< per layer (a scalar is replicated)
  std::vector<std::string> layer_types;
  std::vector<std::string> layer_types_with_mtp;
  std::optional<RopeScaling> rope_scaling;
  std::optional<std::vector<std::string>> yarn_only_types;
  SparseConfig sparse;
  layout::Geometry geometry;  ///< derived, SPEC §1
  std::string geometry_name;  ///< the matching row of geometries.def ("" if none and not required)

  /// Dense layers plus MTP layers.
  int total_layers() const { return num_hidden_layers + num_nextn_predict_layers; }
  /// Per-layer attention types, SPEC §6 (`layer_types_with_mtp` if non-empty, else
  /// `layer_types`; `layout::resolve_layer_types`).
  std::vector<std::string> attention_layer_types() const {
    return layout::resolve_layer_types(layer_types_with_mtp, layer_types);
  }
  /// True when layer `layer` runs DSA (its type is in `sparse.apply_to_layer_types`).
  bool is_dsa_layer(int layer) const {
    const auto t = attention_layer_types();
    if (layer < 0 || layer >= static_cast<int>(t.size())) return false;
    return layout::is_dsa_layer(t[static_cast<std::size_t>(layer)], sparse.apply_to_layer_types);
  }
  /// Indices of the DSA layers (`layout::dsa_layer_indices`).
  std::vector<int> dsa_layers() const {
    return layout::dsa_layer_indices(attention_layer_types(), sparse.apply_to_layer_types);
  }
  /// RoPE base of `layer`; throws `Error` (kInvalidArgument) when the list does not cover it.
  double rope_theta_of(int layer) const {
    if (layer < 0 || layer >= static_cast<int>(rope_theta.size()))
      throw Error(StatusCode::kInvalidArgument, source + ": rope_theta has " + std::to_string(rope_theta.size()) +
                                                    " entries, no entry for layer " + std::to_string(layer));
    return rope_theta[static_cast<std::size_t>(layer)];
  }
  /// True when `rope_scaling` applies to `layer` (its type is in `yarn_only_types`, or
  /// `yarn_only_types` is absent or empty: an empty list restricts nothing, as in the reference
  /// engine's `if yarn_only_types and layer_type not in yarn_only_types`).
  bool rope_scaling_applies(int layer) const {
    if (!rope_scaling) return false;
    if (!yarn_only_types || yarn_only_types->empty()) return true;
    const auto t = attention_layer_types();
    if (layer < 0 || layer >= static_cast<int>(t.size())) return false;
    for (const auto& y : *yarn_only_types)
      if (y == t[static_cast<std::size_t>(layer)]) return true;
    return false;
  }
  /// The parallel layout of this model at `tp` (index_tp_size = num_provider_groups).
  layout::ParallelLayout parallel_layout(int tp) const { return {tp, sparse.num_provider_groups}; }
};

namespace detail {

/// Field lookup over the sections of a config (text_config first, then the top level).
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& root, std::string source) : root_(root), source_(std::move(source)) {
    if (!root_.is_object())
      fail(StatusCode::kInvalidArgument, "config must be a JSON object, got " + std::string(root_.type_name()));
    auto t = root_.find("text_config");
    if (t != root_.end() && !t->is_null()) {
      if (!t->is_object())
        fail(StatusCode::kInvalidArgument, "field 'text_config' must be an object, got " + std::string(t->type_name()));
      text_ = &*t;
    }
  }
  [[noreturn]] void fail(StatusCode c, const std::string& m) const { throw Error(c, source_ + ": " + m); }
  const std::string& source() const { return source_; }

  /// The text-section field `name` (text_config, then top level), or nullptr. `path` receives
  /// the dotted path where it was found.
  const nlohmann::json* find(const std::string& name, std::string* path = nullptr) const {
    if (text_) {
      auto it = text_->find(name);
      if (it != text_->end() && !it->is_null()) {
        if (path) *path = "text_config." + name;
        return &*it;
      }
    }
    auto it = root_.find(name);
    if (it != root_.end() && !it->is_null()) {
      if (path) *path = name;
      return &*it;
    }
    return nullptr;
  }
  std::string where() const { return text_ ? "in text_config and at the top level" : "at the top level"; }
  [[noreturn]] void missing(const std::string& name) const {
    fail(StatusCode::kNotFound, "missing field '" + name + "' (looked " + where() + ")");
  }
  const nlohmann::json& require(const std::string& name, std::string* path) const {
    const nlohmann::json* j = find(name, path);
    if (!j) missing(name);
    return *j;
  }

  static std::string describe(const nlohmann::json& j) {
    if (j.is_number_float()) return "number " + num_text(j.get<double>());
    // unsigned first: is_number_integer() is true for unsigned values too, and one above
    // INT64_MAX read as int64 would be named as a negative number
    if (j.is_number_unsigned()) return "integer " + std::to_string(j.get<std::uint64_t>());
    if (j.is_number_integer()) return "integer " + std::to_string(j.get<std::int64_t>());
    if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
    return std::string("a JSON ") + j.type_name();
  }
  /// `v` with the fewest digits (15 to 17) that read back as `v`: 1e+39, not 9.9999999999999994e+38.
  static std::string num_text(double v) {
    std::string t;
    for (int digits = 15; digits <= 17; ++digits) {
      std::ostringstream s;
      s.precision(digits);
      s << v;
      t = s.str();
      std::istringstream back(t);
      double r = 0;
      if ((back >> r) && r == v) break;
    }
    return t;
  }

  int as_int(const nlohmann::json& j, const std::string& path, std::int64_t lo, std::int64_t hi) const {
    std::int64_t v = 0;
    if (j.is_number_unsigned()) {
      const std::uint64_t u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(hi))
        fail(StatusCode::kInvalidArgument, "field '" + path + "' = " + std::to_string(u) + " is outside [" +
                                               std::to_string(lo) + ", " + std::to_string(hi) + "]");
      v = static_cast<std::int64_t>(u);
    } else if (j.is_number_integer()) {
      v = j.get<std::int64_t>();
    } else {
      fail(StatusCode::kInvalidArgument, "field '" + path + "' must be an integer, got " + describe(j));
    }
    if (v < lo || v > hi)
      fail(StatusCode::kInvalidArgument, "field '" + path + "' = " + std::to_string(v) + " is outside [" +
                                             std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<int>(v);
  }
  double as_number(const nlohmann::json& j, const std::string& path) const {
    if (!j.is_number()) fail(StatusCode::kInvalidArgument, "field '" + path + "' must be a number, got " + describe(j));
    const double v = j.get<double>();
    if (!std::isfinite(v)) fail(StatusCode::kInvalidArgument, "field '" + path + "' must be finite, got " + num_text(v));
    return v;
  }
  /// A number the library later uses as fp32 (rms_norm_eps, rope_theta, the llama3 rope_scaling
  /// factors): `as_number`, then > 0 ("must be > 0"), at most FLT_MAX (a larger one would become
  /// inf as a float) and at least the smallest positive float (a smaller one would become 0).
  double as_positive_float(const nlohmann::json& j, const std::string& path) const {
    const double v = as_number(j, path);
    if (!(v > 0.0)) fail(StatusCode::kInvalidArgument, "field '" + path + "' = " + num_text(v) + " must be > 0");
    if (v > kMaxFloat)
      fail(StatusCode::kInvalidArgument, "field '" + path + "' = " + num_text(v) + " exceeds the largest float " +
                                             num_text(kMaxFloat) + " (FLT_MAX; it is used as an fp32 value)");
    if (!is_positive_fp32(v))
      fail(StatusCode::kInvalidArgument, "field '" + path + "' = " + num_text(v) + " is below the smallest positive float " +
                                             num_text(kMinPositiveFloat) + " (it is used as an fp32 value)");
    return v;
  }
  std::vector<std::string> as_strings(const nlohmann::json& j, const std::string& path) const {
    if (!j.is_array()) fail(StatusCode::kInvalidArgument, "field '" + path + "' must be an array of strings, got " + describe(j));
    std::vector<std::string> r;
    r.reserve(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_string())
        fail(StatusCode::kInvalidArgument, "field '" + path + "[" + std::to_string(i) + "]' must be a string, got " +
                                               describe(j[i]));
      r.push_back(j[i].get<std::string>());
    }
    return r;
  }
  int get_int(const std::string& name, std::int64_t lo, std::int64_t hi) const {
    std::string p;
    const auto& j = require(name, &p);
    return as_int(j, p, lo, hi);
  }

  const nlohmann::json& root() const { return root_; }

 private:
  const nlohmann::json& root_;
  const nlohmann::json* text_ = nullptr;
  std::string source_;
};

// ---------------------------------------------------------------------------------------------
// The steps of parse_model_config, in the order it runs them (the file comment lists the fields).
// Each reads or checks one part of the config into `c` and throws like parse_model_config.
// ---------------------------------------------------------------------------------------------

inline constexpr std::int64_t kConfigMaxDim = 1 << 24;      ///< bound of any size field
inline constexpr std::int64_t kConfigMaxLayers = 100000;    ///< bound of num_hidden_layers

/// Step 1: the text-section scalars (text_config nested or flat, `ConfigReader`): hidden_size,
/// num_hidden_layers, num_nextn_predict_layers (optional), num_attention_heads,
/// num_attention_groups, head_dim, rms_norm_eps (a positive fp32 value: `as_positive_float`).
inline void config_read_text_fields(const ConfigReader& r, ModelConfig& c) {
  c.hidden_size = r.get_int("hidden_size", 1, kConfigMaxDim);
  c.num_hidden_layers = r.get_int("num_hidden_layers", 1, kConfigMaxLayers);
  {
    std::string p;
    const nlohmann::json* j = r.find("num_nextn_predict_layers", &p);
    c.num_nextn_predict_layers = j ? r.as_int(*j, p, 0, 1024) : 0;
  }
  c.num_attention_heads = r.get_int("num_attention_heads", 1, kConfigMaxDim);
  c.num_attention_groups = r.get_int("num_attention_groups", 1, kConfigMaxDim);
  c.head_dim = r.get_int("head_dim", 1, kConfigMaxDim);
  {
    std::string p;
    c.rms_norm_eps = r.as_positive_float(r.require("rms_norm_eps", &p), p);
  }
}

/// A per-layer list at `path` with `n` entries must have num_hidden_layers or
/// num_hidden_layers + num_nextn_predict_layers entries (needs step 1).
inline void config_check_layer_count(const ConfigReader& r, const ModelConfig& c, std::size_t n, const std::string& path) {
  const int total = c.total_layers();
  if (n != static_cast<std::size_t>(c.num_hidden_layers) && n != static_cast<std::size_t>(total))
    r.fail(StatusCode::kInvalidArgument,
           "field '" + path + "' has " + std::to_string(n) + " entries, expected one per layer: num_hidden_layers = " +
               std::to_string(c.num_hidden_layers) +
               (c.num_nextn_predict_layers ? " or num_hidden_layers + num_nextn_predict_layers = " + std::to_string(total)
                                           : std::string()));
}

/// The `sparse_config` object and its dotted path (for fields looked up in it).
struct SparseSection {
  const nlohmann::json* json = nullptr;
  std::string path;
};

/// Step 2: `sparse_config` (under text_config or at the top level) into `c.sparse`.
inline SparseSection config_read_sparse(const ConfigReader& r, ModelConfig& c) {
  std::string sp;
  const nlohmann::json& s = r.require("sparse_config", &sp);
  if (!s.is_object()) r.fail(StatusCode::kInvalidArgument, "field '" + sp + "' must be an object, got " + ConfigReader::describe(s));
  auto sfield = [&](const char* name) -> std::pair<const nlohmann::json*, std::string> {
    auto it = s.find(name);
    const std::string path = sp + "." + name;
    if (it == s.end() || it->is_null())
      r.fail(StatusCode::kNotFound, "missing field '" + std::string(name) + "' in '" + sp + "'");
    return {&*it, path};
  };
  auto sint = [&](const char* name, std::int64_t lo, std::int64_t hi) {
    auto [j, p] = sfield(name);
    return r.as_int(*j, p, lo, hi);
  };
  c.sparse.num_provider_groups = sint("num_provider_groups", 1, kConfigMaxDim);
  c.sparse.proxy_dim = sint("proxy_dim", 1, kConfigMaxDim);
  c.sparse.topk = sint("topk", 1, layout::kMaxTopk);
  c.sparse.sparse_indexer_rope_dim = sint("sparse_indexer_rope_dim", 0, kConfigMaxDim);
  c.sparse.region_block_size = sint("region_block_size", 1, kConfigMaxDim);
  c.sparse.sparse_indexer_num_heads = sint("sparse_indexer_num_heads", 1, kConfigMaxDim);
  c.sparse.sparse_indexer_num_k_heads = sint("sparse_indexer_num_k_heads", 1, kConfigMaxDim);
  {
    auto [j, p] = sfield("apply_to_layer_types");
    c.sparse.apply_to_layer_types = r.as_strings(*j, p);
  }
  // Optional switches of the maths: where present they must name what this library computes.
  for (const char* name : {"enabled", "sparse_indexer_use_rope"}) {
    auto it = s.find(name);
    if (it == s.end() || it->is_null()) continue;
    const std::string path = sp + "." + name;
    if (!it->is_boolean()) r.fail(StatusCode::kInvalidArgument, "field '" + path + "' must be a boolean, got " + ConfigReader::describe(*it));
    if (!it->get<bool>())
      r.fail(StatusCode::kUnsupported, "field '" + path + "' = false is not supported: this library computes DSA " +
                                           "attention with the indexer's RoPE (SPEC §4), expected true");
  }
  const std::pair<const char*, const char*> norms[] = {{"sparse_indexer_q_norm_type", "rmsnorm"},
                                                       {"sparse_indexer_k_norm_type", "layernorm"}};
  for (const auto& [name, want] : norms) {
    auto it = s.find(name);
    if (it == s.end() || it->is_null()) continue;
    const std::string path = sp + "." + name;
    if (!it->is_string()) r.fail(StatusCode::kInvalidArgument, "field '" + path + "' must be a string, got " + ConfigReader::describe(*it));
    std::string v;
    for (const char ch : it->get_ref<const std::string&>())
      if (ch != '_') v += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    if (v != want)
      r.fail(StatusCode::kUnsupported, "field '" + path + "' = '" + it->get<std::string>() + "' is not supported: expected '" +
                                           want + "' (SPEC §4 step 3; compared ignoring case and '_')");
  }
  return {&s, sp};
}

/// Step 3: the gate width: `gate_output_size` (text section, then `sparse_config`), else
/// `use_head_wise_attn_gate` (true → num_attention_heads, false → 0).
inline void config_read_gate(const ConfigReader& r, ModelConfig& c, const SparseSection& sparse) {
  const nlohmann::json& s = *sparse.json;
  const std::string& sp = sparse.path;
  std::string p;
  const nlohmann::json* g = r.find("gate_output_size", &p);
  if (!g) {
    auto it = s.find("gate_output_size");
    if (it != s.end() && !it->is_null()) {
      g = &*it;
      p = sp + ".gate_output_size";
    }
  }
  if (g) {
    c.gate_output_size = r.as_int(*g, p, 0, kConfigMaxDim);
  } else if (const nlohmann::json* u = r.find("use_head_wise_attn_gate", &p)) {
    if (!u->is_boolean())
      r.fail(StatusCode::kInvalidArgument, "field '" + p + "' must be a boolean, got " + ConfigReader::describe(*u));
    c.gate_output_size = u->get<bool>() ? c.num_attention_heads : 0;
  } else {
    r.fail(StatusCode::kNotFound, "missing field 'gate_output_size' (looked " + r.where() + " and in '" + sp +
                                      "') and no 'use_head_wise_attn_gate' to derive it from");
  }
}

/// Step 4: the per-layer attention types (`layer_types`, `layer_types_with_mtp`; SPEC §6): at
/// least one non-empty, each of a valid length, and where both are non-empty they agree on the
/// layers both cover (the reference config refuses a `layer_types` that is not the dense prefix
/// of `layer_types_with_mtp`; taking one silently would move DSA layers).
inline void config_read_layer_types(const ConfigReader& r, ModelConfig& c) {
  const int total = c.total_layers();
  std::string p, lt_path;
  if (const nlohmann::json* j = r.find("layer_types", &p)) {
    c.layer_types = r.as_strings(*j, p);
    if (!c.layer_types.empty()) config_check_layer_count(r, c, c.layer_types.size(), p);
    lt_path = p;
  }
  if (const nlohmann::json* j = r.find("layer_types_with_mtp", &p)) {
    c.layer_types_with_mtp = r.as_strings(*j, p);
    if (!c.layer_types_with_mtp.empty() && c.layer_types_with_mtp.size() != static_cast<std::size_t>(total))
      r.fail(StatusCode::kInvalidArgument, "field '" + p + "' has " + std::to_string(c.layer_types_with_mtp.size()) +
                                               " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
                                               std::to_string(total));
    if (!c.layer_types_with_mtp.empty())
      for (std::size_t i = 0; i < c.layer_types.size(); ++i)  // layer_types has at most `total` entries
        if (c.layer_types[i] != c.layer_types_with_mtp[i])
          r.fail(StatusCode::kInvalidArgument,
                 "field '" + lt_path + "[" + std::to_string(i) + "]' = '" + c.layer_types[i] + "' contradicts '" + p +
                     "[" + std::to_string(i) + "]' = '" + c.layer_types_with_mtp[i] +
                     "': layer_types must be the prefix of layer_types_with_mtp (the same layer types)");
  }
  if (c.attention_layer_types().empty())
    r.fail(StatusCode::kNotFound, "missing field 'layer_types_with_mtp' or 'layer_types' (looked " + r.where() +
                                      "): needed to tell which layers run DSA");
}

/// Step 5: `rope_theta`, per layer (array) or one number for every layer; each a positive fp32
/// value (`as_positive_float`: > 0 and <= FLT_MAX).
inline void config_read_rope_theta(const ConfigReader& r, ModelConfig& c) {
  std::string p;
  const nlohmann::json& t = r.require("rope_theta", &p);
  if (t.is_array()) {
    config_check_layer_count(r, c, t.size(), p);
    for (std::size_t i = 0; i < t.size(); ++i) {
      c.rope_theta.push_back(r.as_positive_float(t[i], p + "[" + std::to_string(i) + "]"));
    }
  } else {
    c.rope_theta.assign(static_cast<std::size_t>(c.total_layers()), r.as_positive_float(t, p));
  }
}

/// Step 6: `partial_rotary_factors` (per layer), else `partial_rotary_factor`; each in [0, 1].
inline void config_read_partial_rotary_factors(const ConfigReader& r, ModelConfig& c) {
  std::string p;
  auto read_factor = [&](const nlohmann::json& j, const std::string& path) {
    const double v = r.as_number(j, path);
    if (!(v >= 0.0 && v <= 1.0))
      r.fail(StatusCode::kInvalidArgument, "field '" + path + "' = " + ConfigReader::num_text(v) + " is outside [0, 1]");
    return v;
  };
  if (const nlohmann::json* f = r.find("partial_rotary_factors", &p)) {
    if (!f->is_array()) r.fail(StatusCode::kInvalidArgument, "field '" + p + "' must be an array of numbers, got " + ConfigReader::describe(*f));
    config_check_layer_count(r, c, f->size(), p);
    for (std::size_t i = 0; i < f->size(); ++i) c.partial_rotary_factors.push_back(read_factor((*f)[i], p + "[" + std::to_string(i) + "]"));
  } else if (const nlohmann::json* f1 = r.find("partial_rotary_factor", &p)) {
    c.partial_rotary_factors.assign(static_cast<std::size_t>(c.total_layers()), read_factor(*f1, p));
  } else {
    r.fail(StatusCode::kNotFound, "missing field 'partial_rotary_factors' or 'partial_rotary_factor' (looked " + r.where() + ")");
  }
}

/// Step 7: `rope_scaling` (optional; llama3 or default; the llama3 factors positive fp32 values,
/// `as_positive_float`) and `yarn_only_types` (optional).
inline void config_read_rope_scaling(const ConfigReader& r, ModelConfig& c) {
  std::string p;
  if (const nlohmann::json* rs = r.find("rope_scaling", &p)) {
    if (!rs->is_object()) r.fail(StatusCode::kInvalidArgument, "field '" + p + "' must be an object or null, got " + ConfigReader::describe(*rs));
    auto it = rs->find("rope_type");
    std::string tp = p + ".rope_type";
    if (it == rs->end()) {
      it = rs->find("type");
      tp = p + ".type";
    }
    if (it == rs->end()) r.fail(StatusCode::kNotFound, "missing field 'rope_type' in '" + p + "'");
    if (!it->is_string()) r.fail(StatusCode::kInvalidArgument, "field '" + tp + "' must be a string, got " + ConfigReader::describe(*it));
    const std::string type = it->get<std::string>();
    if (type == "llama3") {
      RopeScaling sc;
      auto num = [&](const char* name) {
        auto f = rs->find(name);
        if (f == rs->end()) r.fail(StatusCode::kNotFound, "missing field '" + std::string(name) + "' in '" + p + "' (rope_type llama3)");
        return r.as_positive_float(*f, p + "." + name);
      };
      sc.factor = num("factor");
      sc.low_freq_factor = num("low_freq_factor");
      sc.high_freq_factor = num("high_freq_factor");
      // as the fp32 values the RoPE tables use (core/numeric.hpp, model::rope_inv_freq's rule too)
      if (!llama3_freq_factors_ordered(sc.low_freq_factor, sc.high_freq_factor))
        r.fail(StatusCode::kInvalidArgument, "'" + p + "': high_freq_factor " + ConfigReader::num_text(sc.high_freq_factor) +
                                                 " must be > low_freq_factor " + ConfigReader::num_text(sc.low_freq_factor) +
                                                 " as fp32 values");
      auto o = rs->find("original_max_position_embeddings");
      if (o == rs->end()) r.fail(StatusCode::kNotFound, "missing field 'original_max_position_embeddings' in '" + p + "' (rope_type llama3)");
      sc.original_max_position_embeddings = r.as_int(*o, p + ".original_max_position_embeddings", 1, INT32_MAX);
      c.rope_scaling = sc;
    } else if (type != "default") {
      r.fail(StatusCode::kUnsupported, "field '" + tp + "' = '" + type + "' is not supported (expected 'llama3' or 'default')");
    }
  }
  if (const nlohmann::json* y = r.find("yarn_only_types", &p)) c.yarn_only_types = r.as_strings(*y, p);
}

/// Step 8: fields that must agree (SPEC §2): num_provider_groups = num_attention_groups,
/// sparse_indexer_num_heads a multiple of it, sparse_indexer_rope_dim even and <= proxy_dim.
inline void config_check_consistency(const ConfigReader& r, const ModelConfig& c) {
  if (c.sparse.num_provider_groups != c.num_attention_groups)
    r.fail(StatusCode::kInvalidArgument,
           "sparse_config.num_provider_groups = " + std::to_string(c.sparse.num_provider_groups) +
               " must equal num_attention_groups = " + std::to_string(c.num_attention_groups) +
               " (DSA provider groups must align with attention KV groups, SPEC §2)");
  if (c.sparse.sparse_indexer_num_heads % c.sparse.num_provider_groups != 0)
    r.fail(StatusCode::kInvalidArgument, "sparse_config.sparse_indexer_num_heads = " +
                                             std::to_string(c.sparse.sparse_indexer_num_heads) +
                                             " is not a multiple of num_provider_groups = " +
                                             std::to_string(c.sparse.num_provider_groups));
  if (c.sparse.sparse_indexer_rope_dim % 2 != 0 || c.sparse.sparse_indexer_rope_dim > c.sparse.proxy_dim)
    r.fail(StatusCode::kInvalidArgument, "sparse_config.sparse_indexer_rope_dim = " +
                                             std::to_string(c.sparse.sparse_indexer_rope_dim) +
                                             " must be even and <= proxy_dim = " + std::to_string(c.sparse.proxy_dim));
  // a non-empty yarn_only_types names at least one type of layer_types / layer_types_with_mtp (a
  // misspelt one left the scaling off every layer, silently; an extra type no layer has is fine)
  if (c.yarn_only_types && !c.yarn_only_types->empty()) {
    std::vector<std::string> types = c.layer_types;
    types.insert(types.end(), c.layer_types_with_mtp.begin(), c.layer_types_with_mtp.end());
    bool any = false;
    for (const std::string& y : *c.yarn_only_types) any = any || std::find(types.begin(), types.end(), y) != types.end();
    if (!any) {
      std::string listed, known;
      for (const std::string& y : *c.yarn_only_types) listed += (listed.empty() ? "'" : ", '") + y + "'";
      for (const std::string& t : types)
        if (known.find("'" + t + "'") == std::string::npos) known += (known.empty() ? "'" : ", '") + t + "'";
      r.fail(StatusCode::kInvalidArgument, "yarn_only_types [" + listed + "] names no layer's type, so the rope " +
                                               "scaling would apply to no layer (the layer types: " + known + ")");
    }
  }
}

/// Step 9: rot_main (SPEC §1) = partial_rotary_factor × head_dim of the DSA layers: at least one
/// DSA layer, every one covered by the per-layer lists, an even integer, the same on all.
inline int config_derive_rot_main(const ConfigReader& r, const ModelConfig& c) {
  const std::vector<int> dsa = c.dsa_layers();
  if (dsa.empty())
    r.fail(StatusCode::kInvalidArgument, "no layer has a type listed in sparse_config.apply_to_layer_types (" +
                                             std::to_string(c.attention_layer_types().size()) + " layers)");
  int rot_main = -1, first = -1;
  for (int l : dsa) {
    if (l >= static_cast<int>(c.partial_rotary_factors.size()))
      r.fail(StatusCode::kInvalidArgument, "partial_rotary_factors has " + std::to_string(c.partial_rotary_factors.size()) +
                                               " entries, none for DSA layer " + std::to_string(l));
    if (l >= static_cast<int>(c.rope_theta.size()))
      r.fail(StatusCode::kInvalidArgument, "rope_theta has " + std::to_string(c.rope_theta.size()) +
                                               " entries, none for DSA layer " + std::to_string(l));
    const double f = c.partial_rotary_factors[static_cast<std::size_t>(l)];
    const double rd = f * c.head_dim;
    const double rr = std::round(rd);
    if (std::fabs(rd - rr) > 1e-6 * std::max(1.0, rd) || static_cast<long long>(rr) % 2 != 0)
      r.fail(StatusCode::kInvalidArgument, "partial_rotary_factors[" + std::to_string(l) + "] = " + ConfigReader::num_text(f) +
                                               " x head_dim " + std::to_string(c.head_dim) + " = " + ConfigReader::num_text(rd) +
                                               " is not an even number of rotated dims");
    const int rot = static_cast<int>(rr);
    if (rot_main >= 0 && rot != rot_main)
      r.fail(StatusCode::kInvalidArgument, "DSA layers " + std::to_string(first) + " and " + std::to_string(l) +
                                               " have different rotary dims (" + std::to_string(rot_main) + " vs " +
                                               std::to_string(rot) + " of head_dim " + std::to_string(c.head_dim) + ")");
    if (rot_main < 0) {
      rot_main = rot;
      first = l;
    }
  }
  return rot_main;
}

/// Step 10: the geometry (SPEC §1) and its row of geometries.def; with
/// `require_listed_geometry` a geometry outside the list is refused (kUnsupported, lists the rows).
inline void config_derive_geometry(const ConfigReader& r, ModelConfig& c, int rot_main, bool require_listed_geometry) {
  c.geometry = layout::Geometry{c.num_attention_heads,
                                c.num_attention_groups,
                                c.head_dim,
                                c.sparse.sparse_indexer_num_heads,
                                c.sparse.proxy_dim,
                                c.sparse.sparse_indexer_num_k_heads,
                                c.gate_output_size,
                                rot_main,
                                c.sparse.sparse_indexer_rope_dim,
                                c.sparse.region_block_size};
  if (const layout::GeometryEntry* e = layout::find_geometry(c.geometry)) c.geometry_name = std::string(e->name);
  if (c.geometry_name.empty() && require_listed_geometry) {
    std::string list;
    for (const auto& e : layout::kGeometries) list += "\n  " + layout::describe(e.geometry);
    r.fail(StatusCode::kUnsupported, "geometry " + layout::describe(c.geometry) + " matches no supported geometry (SPEC §8):" + list);
  }
}

}  // namespace detail

/// Parses a config already read into JSON. `source` names it in messages. With
/// `require_listed_geometry` (default) the derived geometry must be a row of geometries.def.
/// Throws `step5::Error` (see the file comment). Runs the steps of `detail::config_*` in order:
/// text fields, sparse_config, gate, layer types, rope_theta, partial rotary factors, rope
/// scaling, consistency, rot_main, geometry.
inline ModelConfig parse_model_config(const nlohmann::json& root, const std::string& source = "config.json",
                                      bool require_listed_geometry = true) {
  const detail::ConfigReader r(root, source);
  ModelConfig c;
  c.source = source;
  detail::config_read_text_fields(r, c);
  const detail::SparseSection sparse = detail::config_read_sparse(r, c);
  detail::config_read_gate(r, c, sparse);
  detail::config_read_layer_types(r, c);
  detail::config_read_rope_theta(r, c);
  detail::config_read_partial_rotary_factors(r, c);
  detail::config_read_rope_scaling(r, c);
  detail::config_check_consistency(r, c);
  const int rot_main = detail::config_derive_rot_main(r, c);
  detail::config_derive_geometry(r, c, rot_main, require_listed_geometry);
  return c;
}

/// Parses config JSON text. Malformed JSON throws `Error` (kIoError) naming `source`.
inline ModelConfig parse_model_config_text(std::string_view text, const std::string& source = "config.json",
                                           bool require_listed_geometry = true) {
  nlohmann::json j;
  std::optional<std::string> repeated;
  try {
    j = detail::parse_json_checking_keys(text.begin(), text.end(), &repeated);
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kIoError, source + ": malformed JSON: " + e.what());
  }
  if (repeated)
    throw Error(StatusCode::kIoError, source + ": field '" + *repeated + "' appears twice in one object");
  return parse_model_config(j, source, require_listed_geometry);
}

/// The largest config.json `load_model_config` reads (a real one is a few KiB).
inline constexpr std::uint64_t kMaxConfigBytes = 64ull << 20;

/// Reads `config.json` from `path` (the file, or a checkpoint directory holding it): a regular
/// file of at most kMaxConfigBytes (a FIFO, a device such as /dev/zero or a larger file is
/// refused with kIoError naming it, instead of blocking or reading without end); kNotFound when
/// it does not exist.
inline ModelConfig load_model_config(const std::string& path, bool require_listed_geometry = true) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path);
  if (fs::is_directory(p, ec)) p /= "config.json";
  MappedFile f;
  try {
    f = MappedFile(p.string());
  } catch (const Error& e) {
    if (e.code() != StatusCode::kNotFound) throw;
    throw Error(StatusCode::kNotFound, "cannot open config file '" + p.string() +
                                           "' (expected a config.json file or a checkpoint directory holding config.json)");
  }
  if (f.size() > kMaxConfigBytes)
    throw Error(StatusCode::kIoError, "config file '" + p.string() + "' has " + std::to_string(f.size()) +
                                          " bytes, expected at most " + std::to_string(kMaxConfigBytes));
  const std::string_view text(reinterpret_cast<const char*>(f.data()), static_cast<std::size_t>(f.size()));
  return parse_model_config_text(text, p.string(), require_listed_geometry);
}

}  // namespace step5
