#pragma once
/// \file step5/core/numeric.hpp
/// Bit-exact host conversions between fp32, bf16 and fp8 e4m3 (e4m3fn: no infinities, NaN =
/// S.1111.111, max finite 448), all round-to-nearest-even as SPEC.md §4 requires, and the exact
/// fp16 -> fp32 widening (checkpoint F16 tensors, SPEC §7). The device
/// kernels use the CUDA intrinsics with the same rounding (cvt.rn.bf16.f32,
/// cvt.rn.satfinite.e4m3x2.f32); tests hold them to these functions. Host-safe (g++).
/// Signed zero (SPEC §4 "Signed zero"): every conversion keeps the sign, as torch/Triton do:
/// −0.0 → bf16 0x8000 → −0.0, −0.0 → e4m3 0x80 → −0.0, and a negative value that rounds to zero
/// gives −0 (bf16 0x8000, e4m3 0x80); a positive one +0 (static_asserts at the end of this file).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "step5/core/status.hpp"

namespace step5 {

/// The doubles that convert to a positive, finite fp32 value: [kMinPositiveFloat, kMaxFloat] (a
/// larger one becomes inf, a smaller one 0; NaN is outside). The one rule for config numbers the
/// library uses as fp32 (weights/config.hpp, weights/layer_loader.hpp, model/rope.hpp).
inline constexpr double kMinPositiveFloat = std::numeric_limits<float>::denorm_min();
inline constexpr double kMaxFloat = std::numeric_limits<float>::max();
constexpr bool is_positive_fp32(double v) { return v >= kMinPositiveFloat && v <= kMaxFloat; }

/// llama3 RoPE scaling's frequency factors: 0 < low_freq_factor < high_freq_factor, compared as the
/// fp32 values the RoPE tables use (1 and 1.00000001 differ as doubles but are one float, and the
/// smoothing would divide by 0). The one rule for the config parser (weights/config.hpp) and
/// model::rope_inv_freq.
constexpr bool llama3_freq_factors_ordered(double low_freq_factor, double high_freq_factor) {
  const float low = static_cast<float>(low_freq_factor), high = static_cast<float>(high_freq_factor);
  return low > 0 && high > low;
}

/// The norms' eps (rms_norm_eps, SPEC §4.2–4.3) must be finite and >= 0: +inf would make every
/// normalised row 0, NaN would poison it. kInvalidArgument "<who> = <value>, expected a finite
/// value >= 0 (rms_norm_eps)" otherwise. The one rule for the kernels (indexer_prepare,
/// dsa_layer_run) and the CPU model (model::validate_weights).
inline Status check_norm_eps(double eps, const std::string& who) {
  if (eps >= 0 && eps <= kMaxFloat) return Status::Ok();
  return invalid_argument(who + " = " + float_text(eps) + ", expected a finite value >= 0 (rms_norm_eps)");
}

/// bf16 value as its bit pattern (host storage type; layout-compatible with __nv_bfloat16).
struct bf16 {
  std::uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2);

/// fp32 -> bf16 bits, round-to-nearest-even; NaN stays a (quiet) NaN.
constexpr std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// bf16 bits -> fp32 (exact).
constexpr float bf16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// IEEE binary16 (fp16) bits -> fp32 (exact: every fp16 value, subnormals, ±inf and NaN
/// payloads included, is representable in fp32). Used to widen F16 checkpoint tensors
/// (SPEC §7) before the bf16 rounding of SPEC §4.
constexpr float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return std::bit_cast<float>(sign);
    // subnormal: man * 2^-24 (exact: man < 2^10)
    const float v = static_cast<float>(man) * std::bit_cast<float>(static_cast<std::uint32_t>(127 - 24) << 23);
    return sign ? -v : v;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

constexpr bf16 to_bf16(float f) { return bf16{float_to_bf16_bits(f)}; }
constexpr float to_float(bf16 b) { return bf16_bits_to_float(b.bits); }
/// Rounds an fp32 value to the nearest bf16 and returns it as fp32 ("round" in SPEC §4).
constexpr float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

namespace detail {
/// Round-to-nearest-even of a non-negative float that is < 2^23 (exact integer result).
constexpr float rne_integer(float x) {
  float fl = static_cast<float>(static_cast<std::int64_t>(x));  // floor for x >= 0
  float diff = x - fl;
  if (diff > 0.5f) return fl + 1.0f;
  if (diff < 0.5f) return fl;
  return (static_cast<std::int64_t>(fl) % 2 == 0) ? fl : fl + 1.0f;
}
constexpr float exp2i(int e) {  // exact 2^e for -126 <= e <= 127
  return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
}
}  // namespace detail

/// Largest finite e4m3fn value.
inline constexpr float kE4m3Max = 448.0f;

/// fp32 -> e4m3fn bits, round-to-nearest-even, saturating to ±448 (±inf too); NaN -> 0x7f/0xff.
constexpr std::uint8_t float_to_e4m3_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7f);
  float a = std::bit_cast<float>(u & 0x7fffffffu);
  if (a >= kE4m3Max) return static_cast<std::uint8_t>(sign | 0x7e);
  if (a < detail::exp2i(-6)) {  // subnormal range, step 2^-9 (q == 8 is the smallest normal)
    float q = detail::rne_integer(a * detail::exp2i(9));
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(q));
  }
  int e = static_cast<int>((std::bit_cast<std::uint32_t>(a) >> 23) & 0xffu) - 127;  // floor(log2 a)
  float q = detail::rne_integer(a * detail::exp2i(3 - e));                         // in [8, 16]
  if (q >= 16.0f) {
    q = 8.0f;
    ++e;
  }
  std::uint32_t bits = (static_cast<std::uint32_t>(e + 7) << 3) | (static_cast<std::uint32_t>(q) - 8u);
  if (bits > 0x7eu) bits = 0x7eu;  // rounding up past 448 saturates
  return static_cast<std::uint8_t>(sign | bits);
}

/// e4m3fn bits -> fp32 (exact).
constexpr float e4m3_bits_to_float(std::uint8_t b) {
  const bool neg = (b & 0x80) != 0;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  float v = 0.0f;
  if (exp == 0xf && man == 0x7) {
    v = std::bit_cast<float>(0x7fc00000u);
  } else if (exp == 0) {
    v = static_cast<float>(man) * detail::exp2i(-9);
  } else {
    v = (1.0f + static_cast<float>(man) / 8.0f) * detail::exp2i(exp - 7);
  }
  return neg ? -v : v;
}

/// Rounds an fp32 value to e4m3 (saturating) and returns it as fp32.
constexpr float round_e4m3(float f) { return e4m3_bits_to_float(float_to_e4m3_bits(f)); }

static_assert(float_to_bf16_bits(1.0f) == 0x3f80);
static_assert(float_to_e4m3_bits(448.0f) == 0x7e && float_to_e4m3_bits(1e9f) == 0x7e);
static_assert(float_to_e4m3_bits(1.0f) == 0x38 && e4m3_bits_to_float(0x38) == 1.0f);
static_assert(e4m3_bits_to_float(0x01) == 1.0f / 512.0f);
static_assert(f16_bits_to_float(0x3c00) == 1.0f && f16_bits_to_float(0xc000) == -2.0f);
static_assert(f16_bits_to_float(0x0001) == 1.0f / 16777216.0f && f16_bits_to_float(0x7bff) == 65504.0f);
static_assert(f16_bits_to_float(0x83ff) == -1023.0f / 16777216.0f && f16_bits_to_float(0x0400) == 1.0f / 16384.0f);
static_assert(std::bit_cast<std::uint32_t>(f16_bits_to_float(0xfc00)) == 0xff800000u);
static_assert(std::bit_cast<std::uint32_t>(f16_bits_to_float(0x8000)) == 0x80000000u);
// Signed zero (SPEC §4 "Signed zero"): conversions keep the sign of zero, and of values rounding to 0.
static_assert(float_to_bf16_bits(-0.0f) == 0x8000 && float_to_bf16_bits(0.0f) == 0x0000);
static_assert(float_to_bf16_bits(-1e-45f) == 0x8000 && float_to_bf16_bits(1e-45f) == 0x0000);
static_assert(std::bit_cast<std::uint32_t>(bf16_bits_to_float(0x8000)) == 0x80000000u);
static_assert(float_to_e4m3_bits(-0.0f) == 0x80 && float_to_e4m3_bits(0.0f) == 0x00);
static_assert(float_to_e4m3_bits(-1e-4f) == 0x80 && float_to_e4m3_bits(1e-4f) == 0x00);  // below 2^-10
static_assert(std::bit_cast<std::uint32_t>(e4m3_bits_to_float(0x80)) == 0x80000000u);

}  // namespace step5
