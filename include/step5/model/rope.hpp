#pragma once
/// \file step5/model/rope.hpp
/// RoPE tables of SPEC.md §4.2–4.3 (golden manifest "semantics.rope"), the library's model type:
/// built by the checkpoint loader (weights/layer_loader.hpp), consumed by the CPU reference and
/// uploaded as they are for the GPU kernels. Host-safe (g++).
///
/// Tables: `inv_freq[i] = 1 / theta^(2i/rot)` in fp32 (i < rot/2; the exponent `(2i)/rot` is an
/// fp32 division, the power an fp32 `powf`), optionally llama3-scaled (HF/Meta
/// `_apply_llama3_scaling`, fp32), `freqs[p][i] = float(p) * inv_freq[i]` (fp32), and
/// `cos`/`sin [max_position, rot/2]` = bf16(cos/sin(freqs)). Storage: bf16 bits, row-major.
/// `max_position` is in [1, kMaxRopePositions].
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"

namespace step5::model {

/// The most positions (rows) a RoPE table may have: `make_rope_table` and `load_layer_weights`
/// refuse a larger `max_position` with `step5::Error` (kInvalidArgument) instead of attempting
/// the allocation (bf16 cos + sin, 2 * rot/2 * 2 bytes per position: 2 GiB each for rot = 128).
/// 2^24 = 16M positions, 16x the longest context the library is tested for (1M: test_indexer, test_topk; the
/// example driver caps positions at 2^20).
inline constexpr int kMaxRopePositions = 1 << 24;

/// The widest rotary span (rot, values per head) a RoPE table may have: `rope_inv_freq` and so
/// `make_rope_table` refuse a wider one with `step5::Error` (kInvalidArgument) instead of
/// attempting the allocation. rot is at most the head_dim / proxy_dim it rotates, and the CPU
/// reference prepares heads of at most this many values (reference/prepare.hpp).
inline constexpr int kMaxRopeRot = 1024;

namespace detail {
/// `v` as "%.9g" (enough digits to tell fp32 values apart; 1e+39, 1.40129846e-45).
inline std::string rope_num_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
}  // namespace detail

/// Throws `step5::Error` (kInvalidArgument) "<where>: max_position = N, expected in [1,
/// kMaxRopePositions = 16777216]" unless 1 <= max_position <= kMaxRopePositions.
inline void check_rope_max_position(int max_position, const std::string& where) {
  require(max_position > 0 && max_position <= kMaxRopePositions, where,
          "max_position = " + std::to_string(max_position) + ", expected in [1, kMaxRopePositions = " +
              std::to_string(kMaxRopePositions) + "]");
}

/// llama3 `rope_scaling` parameters (config.json `rope_scaling` with `rope_type: "llama3"`).
struct Llama3Scaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

/// A cos/sin table pair `[max_position, rot/2]` bf16 (SPEC §4.2 / ARCHITECTURE.md conventions).
struct RopeTable {
  int max_position = 0;
  int rot = 0;                ///< rotated dims; the table row width is rot/2
  std::vector<bf16> cos;      ///< [max_position, rot/2]
  std::vector<bf16> sin;      ///< [max_position, rot/2]
  int half() const { return rot / 2; }
  const bf16* cos_row(int pos) const { return cos.data() + static_cast<std::size_t>(pos) * half(); }
  const bf16* sin_row(int pos) const { return sin.data() + static_cast<std::size_t>(pos) * half(); }
};

/// Throws `step5::Error` (kInvalidArgument) "<where>: <name>: cos/sin have C/S elements, expected
/// max_position N (>= 1) x rot/2 H = E" unless `t` holds the rows its (public, editable) fields
/// say: max_position >= 1, rot >= 0, and cos and sin of max_position x rot/2 values each. The one
/// rule of `model::validate_weights` and of the reference steps that read a table row per
/// position (`cos_row` / `sin_row` trust max_position and rot: a table whose max_position was
/// raised, or whose rot was widened, was read past its vectors).
inline void check_rope_table(const RopeTable& t, const std::string& where, const char* name) {
  const std::size_t rows = t.max_position >= 1 && t.rot >= 0
                               ? static_cast<std::size_t>(t.max_position) * static_cast<std::size_t>(t.half())
                               : 0;
  if (t.max_position >= 1 && t.rot >= 0 && t.cos.size() == rows && t.sin.size() == rows) return;
  throw Error(StatusCode::kInvalidArgument,
              where + ": " + name + ": cos/sin have " + std::to_string(t.cos.size()) + "/" + std::to_string(t.sin.size()) +
                  " elements, expected max_position " + std::to_string(t.max_position) + " (>= 1) x rot/2 " +
                  std::to_string(t.half()) + (t.rot < 0 ? " (rot " + std::to_string(t.rot) + ", expected >= 0)" : "") +
                  " = " + std::to_string(rows));
}

/// `inv_freq [rot/2]` fp32: `1 / theta^(arange(0, rot, 2) / rot)`, then llama3 scaling if given.
/// Throws `step5::Error` (kInvalidArgument) when rot is not positive and even or above
/// kMaxRopeRot, theta is not a
/// positive fp32 value (theta <= 0, NaN, above FLT_MAX — it would become inf — or so small it
/// rounds to 0), the llama3 scaling breaks the config's rule (a factor not finite or <= 0, not
/// 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings <= 0), or an inverse
/// frequency overflows to inf (a theta or llama3 factor so small that 1 / theta^(2i/rot) or
/// inv_freq / factor exceeds FLT_MAX).
inline std::vector<float> rope_inv_freq(double theta, int rot, const std::optional<Llama3Scaling>& scaling = std::nullopt) {
  require(rot > 0 && rot % 2 == 0 && rot <= kMaxRopeRot, "rope_inv_freq",
          "rot = " + std::to_string(rot) + ", expected positive, even and at most kMaxRopeRot = " +
              std::to_string(kMaxRopeRot));
  require(is_positive_fp32(theta), "rope_inv_freq",
          "theta = " + detail::rope_num_text(theta) + ", expected a positive fp32 value in [" +
              detail::rope_num_text(kMinPositiveFloat) + ", " + detail::rope_num_text(kMaxFloat) + "]");
  const int half = rot / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  const float theta_f = static_cast<float>(theta);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot);
    inv[i] = 1.0f / std::pow(theta_f, e);
  }
  if (scaling) {
    const Llama3Scaling& s = *scaling;
    // 0 < low_freq_factor < high_freq_factor: the config parser's rule (core/numeric.hpp)
    require(std::isfinite(s.factor) && std::isfinite(s.low_freq_factor) && std::isfinite(s.high_freq_factor) &&
                s.factor > 0 && llama3_freq_factors_ordered(s.low_freq_factor, s.high_freq_factor) &&
                s.original_max_position_embeddings > 0,
            "rope_inv_freq", "invalid llama3 scaling (factor " + detail::rope_num_text(s.factor) + ", low_freq_factor " +
                                 detail::rope_num_text(s.low_freq_factor) + ", high_freq_factor " +
                                 detail::rope_num_text(s.high_freq_factor) + ", original_max_position_embeddings " +
                                 std::to_string(s.original_max_position_embeddings) +
                                 "): expected a finite factor > 0, finite 0 < low_freq_factor < high_freq_factor and "
                                 "original_max_position_embeddings > 0");
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const float low_wavelen = old_len / s.low_freq_factor;
    const float high_wavelen = old_len / s.high_freq_factor;
    constexpr float kTwoPi = static_cast<float>(2.0 * 3.14159265358979323846);
    for (int i = 0; i < half; ++i) {
      const float f = inv[i];
      const float wavelen = kTwoPi / f;
      float llama = wavelen > low_wavelen ? f / s.factor : f;
      const float smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const float smoothed = (1.0f - smooth) * llama / s.factor + smooth * llama;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      inv[i] = medium ? smoothed : llama;
    }
  }
  // theta and the llama3 factor pass their checks one by one yet can still overflow fp32 here
  // (1 / theta^(2i/rot) for a theta below 1, f / factor for a tiny factor): an inf inverse
  // frequency would make row 0 of the tables NaN (0 * inf) and every other row meaningless
  for (int i = 0; i < half; ++i)
    require(std::isfinite(inv[i]), "rope_inv_freq",
            "theta = " + detail::rope_num_text(theta) + ", rot = " + std::to_string(rot) +
                (scaling ? ", llama3 factor = " + detail::rope_num_text(scaling->factor) : std::string()) +
                " give inv_freq[" + std::to_string(i) + "] = " + detail::rope_num_text(inv[i]) +
                ", expected finite inverse frequencies (theta or the llama3 factor is too small)");
  return inv;
}

/// The bf16 cos/sin tables for positions [0, max_position) (see the file comment). Throws
/// `step5::Error` (kInvalidArgument) when max_position is outside [1, kMaxRopePositions]
/// (`check_rope_max_position`) or as `rope_inv_freq`.
inline RopeTable make_rope_table(int max_position, int rot, double theta,
                                 const std::optional<Llama3Scaling>& scaling = std::nullopt) {
  check_rope_max_position(max_position, "make_rope_table");
  const std::vector<float> inv = rope_inv_freq(theta, rot, scaling);
  RopeTable t;
  t.max_position = max_position;
  t.rot = rot;
  const int half = rot / 2;
  t.cos.resize(static_cast<std::size_t>(max_position) * half);
  t.sin.resize(t.cos.size());
  for (int p = 0; p < max_position; ++p)
    for (int i = 0; i < half; ++i) {
      const float f = static_cast<float>(p) * inv[i];
      t.cos[static_cast<std::size_t>(p) * half + i] = to_bf16(static_cast<float>(std::cos(static_cast<double>(f))));
      t.sin[static_cast<std::size_t>(p) * half + i] = to_bf16(static_cast<float>(std::sin(static_cast<double>(f))));
    }
  return t;
}

}  // namespace step5::model
