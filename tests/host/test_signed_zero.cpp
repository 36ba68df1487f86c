// Signed zero follows the public reference at every place of SPEC §4 ("Signed zero" paragraph):
// conversions, region summaries, the tail buffer, the q/k norms, the indexer k LayerNorm, RoPE and
// the scores; each with all-(−0) and mixed ±0 inputs, bit patterns compared (issue 12 §2).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cmath>
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "reference_test_util.hpp"
#include "step5/reference/prepare.hpp"
#include "step5/reference/scores.hpp"
#include "step5/reference/summaries.hpp"

using namespace reftest;
namespace ref = step5::reference;
using step5::to_bf16;
using step5::to_float;

namespace {
constexpr std::uint16_t kNegZero = 0x8000, kPosZero = 0x0000;
std::uint32_t fbits(float f) { return std::bit_cast<std::uint32_t>(f); }
}  // namespace

TEST_CASE("signed zero: bf16 and e4m3 conversions keep the sign (values that round to zero too)") {
  CHECK(step5::float_to_bf16_bits(-0.0f) == kNegZero);
  CHECK(step5::float_to_bf16_bits(0.0f) == kPosZero);
  CHECK(step5::float_to_bf16_bits(-1e-45f) == kNegZero);
  CHECK(fbits(step5::bf16_bits_to_float(kNegZero)) == 0x80000000u);
  CHECK(step5::float_to_e4m3_bits(-0.0f) == 0x80);
  CHECK(step5::float_to_e4m3_bits(0.0f) == 0x00);
  CHECK(step5::float_to_e4m3_bits(-1e-4f) == 0x80);  // rounds to zero, keeps the sign
  CHECK(step5::float_to_e4m3_bits(1e-4f) == 0x00);
  CHECK(fbits(step5::e4m3_bits_to_float(0x80)) == 0x80000000u);
  CHECK(fbits(step5::round_e4m3(step5::round_bf16(-0.0f))) == 0x80000000u);
}

TEST_CASE("signed zero: region summary of eight -0 k values is -0 (0x80), mixed or +0 gives +0") {
  constexpr int P = 16;
  const auto krand = random_bf16(8 * P, 1.0f, 41);
  const auto z = random_bf16(8 * P, 1.0f, 42);
  std::vector<bf16> k = krand;
  // dim 3: all -0; dim 7: mixed (+0 first, then -0); dim 8: mixed (-0 first, one +0 last);
  // dim 11: all +0; the other dims random nonzero.
  for (int t = 0; t < 8; ++t) {
    k[t * P + 3] = bf16{kNegZero};
    k[t * P + 7] = bf16{t == 0 ? kPosZero : kNegZero};
    k[t * P + 8] = bf16{t == 7 ? kPosZero : kNegZero};
    k[t * P + 11] = bf16{kPosZero};
  }
  const bf16* kr[8];
  const bf16* zr[8];
  for (int t = 0; t < 8; ++t) {
    kr[t] = k.data() + t * P;
    zr[t] = z.data() + t * P;
  }
  float s[P];
  std::uint8_t e[P];
  ref::region_summary(kr, zr, P, s, e);
  CHECK(fbits(s[3]) == 0x80000000u);
  CHECK(e[3] == 0x80);
  for (int d : {7, 8, 11}) {
    CAPTURE(d);
    CHECK(fbits(s[d]) == 0u);
    CHECK(e[d] == 0x00);
  }
  for (int d = 0; d < P; ++d)
    if (d != 3 && d != 7 && d != 8 && d != 11) CHECK(s[d] != 0.0f);  // random dims stay nonzero
}

TEST_CASE("signed zero: the tail buffer keeps -0 rows, and a region completed from it summarises to 0x80") {
  constexpr int P = 8, bs = 16, max_blocks = 2, num_blocks = 3, num_slots = 2;
  std::vector<std::int32_t> bt = {2, 0};
  const ref::BlockTableView table{bt.data(), max_blocks, bs, num_blocks};
  std::vector<bf16> tail(static_cast<std::size_t>(num_slots) * 8 * 2 * P, bf16{0x7b7b});
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(num_blocks) * (bs / 8) * P, 0x5a);
  const std::int32_t slot[1] = {1};
  auto k = random_bf16(8 * P, 1.0f, 7);
  const auto z = random_bf16(8 * P, 1.0f, 8);
  for (int t = 0; t < 8; ++t) {
    k[t * P + 2] = bf16{kNegZero};                             // all -0
    k[t * P + 5] = bf16{t % 3 == 0 ? kPosZero : kNegZero};     // mixed
  }
  // step 1: 5 tokens (pending), step 2: 3 tokens complete region 0 from 5 tail rows + 3 new rows
  const std::int32_t cu1[2] = {0, 5}, seq1[1] = {5};
  ref::update_summaries({1, cu1, seq1}, table, P, k.data(), P, z.data(), P, tail.data(), num_slots, slot, cache.data());
  for (int j = 0; j < 5; ++j) {
    CHECK(tail[((1 * 8 + j) * 2 + 0) * P + 2].bits == kNegZero);
    CHECK(tail[((1 * 8 + j) * 2 + 0) * P + 5].bits == k[j * P + 5].bits);
  }
  const std::int32_t cu2[2] = {0, 3}, seq2[1] = {8};
  ref::update_summaries({1, cu2, seq2}, table, P, k.data() + 5 * P, P, z.data() + 5 * P, P, tail.data(), num_slots,
                        slot, cache.data());
  const std::uint8_t* s = cache.data() + ref::summary_offset(table, 0, 0, P);
  CHECK(s[2] == 0x80);
  CHECK(s[5] == 0x00);
  // the same region summarised in one step gives the same bytes
  const bf16* kr[8];
  const bf16* zr[8];
  for (int t = 0; t < 8; ++t) {
    kr[t] = k.data() + t * P;
    zr[t] = z.data() + t * P;
  }
  std::uint8_t one[P];
  ref::region_summary(kr, zr, P, nullptr, one);
  CHECK(std::vector<std::uint8_t>(s, s + P) == std::vector<std::uint8_t>(one, one + P));
}

TEST_CASE("signed zero: indexer k LayerNorm of a -0 row has mean -0 (x - mean = +0), mixed rows keep x's sign") {
  constexpr int P = 8;
  // w alternates sign, bias -0 on dims 0..3, nonzero on 4..7
  const std::vector<float> w = {1.0f, -1.0f, 0.5f, -0.5f, 1.0f, -1.0f, 2.0f, -2.0f};
  const std::vector<float> b = {-0.0f, -0.0f, -0.0f, -0.0f, 0.25f, -0.25f, 0.5f, -0.5f};
  std::vector<bf16> out(P);
  SUBCASE("all -0: (+0) * rinv * w + (-0) is -0 exactly where w < 0") {
    const std::vector<bf16> x(P, bf16{kNegZero});
    ref::index_k_head(x.data(), out.data(), P, w.data(), b.data(), 1e-5f, 0, nullptr, nullptr);
    for (int d = 0; d < 4; ++d) {
      CAPTURE(d);
      CHECK(out[d].bits == (w[d] < 0 ? kNegZero : kPosZero));
    }
    for (int d = 4; d < P; ++d) CHECK(out[d].bits == to_bf16(b[d]).bits);
  }
  SUBCASE("mixed ±0 (mean +0): x - mean keeps x's sign") {
    std::vector<bf16> x(P);
    for (int d = 0; d < P; ++d) x[d] = bf16{(d / 2) % 2 ? kPosZero : kNegZero};  // -0 -0 +0 +0 -0 -0 +0 +0
    ref::index_k_head(x.data(), out.data(), P, w.data(), b.data(), 1e-5f, 0, nullptr, nullptr);
    for (int d = 0; d < 4; ++d) {
      CAPTURE(d);
      const bool neg = (x[d].bits == kNegZero) != (w[d] < 0);  // sign of (x - mean) * w, then + (-0)
      CHECK(out[d].bits == (neg ? kNegZero : kPosZero));
    }
  }
}

TEST_CASE("signed zero: q RMSNorm (main and indexer) multiplies the sign of -0 by the sign of 1 + w") {
  constexpr int D = 64;
  std::vector<bf16> x = random_bf16(D, 1.0f, 5), out(D);
  std::vector<float> w(D, 0.1f);
  x[10] = bf16{kNegZero};  // 1 + w > 0: -0
  x[11] = bf16{kNegZero};
  w[11] = -1.5f;           // 1 + w < 0: +0
  x[12] = bf16{kPosZero};
  w[12] = -3.0f;           // +0 * negative: -0
  ref::main_qk_head(x.data(), out.data(), D, w.data(), 1e-5f, 0, nullptr, nullptr);
  CHECK(out[10].bits == kNegZero);
  CHECK(out[11].bits == kPosZero);
  CHECK(out[12].bits == kNegZero);
  // indexer q: same rule, then e4m3 keeps it (0x80 / 0x00)
  constexpr int Il = 2;
  std::vector<bf16> q_raw(static_cast<std::size_t>(Il) * D), k_raw = random_bf16(D, 1.0f, 6), z_raw(D), w_raw(Il);
  for (int h = 0; h < Il; ++h) std::copy(x.begin(), x.end(), q_raw.begin() + h * D);
  const std::vector<float> kw(D, 1.0f), kb(D, 0.5f);
  const auto rope = ref::make_rope_table(1, 2, 10000.0);
  const std::int32_t pos0 = 0;
  std::vector<bf16> q_out(q_raw.size()), k_out(D), z_out(D);
  std::vector<std::uint8_t> q8(q_raw.size());
  std::vector<float> weights(Il);
  ref::prepare_indexer(1, Il, 1, D, q_raw.data(), Il * D, k_raw.data(), D, z_raw.data(), D, w_raw.data(), Il, w.data(),
                       kw.data(), kb.data(), 1e-5f, rope, &pos0, q_out.data(), q8.data(), k_out.data(), z_out.data(),
                       weights.data());
  for (int h = 0; h < Il; ++h) {
    CHECK(q_out[h * D + 10].bits == kNegZero);
    CHECK(q8[h * D + 10] == 0x80);
    CHECK(q8[h * D + 11] == 0x00);
    CHECK(q8[h * D + 12] == 0x80);
  }
}

TEST_CASE("signed zero: NeoX RoPE on ±0 pairs follows IEEE (a·cos − b·sin, fma(a, sin, b·cos))") {
  const bf16 c[1] = {to_bf16(0.5f)}, s[1] = {to_bf16(0.75f)};
  float v[2] = {-0.0f, -0.0f};  // a' = (-0) - (-0) = +0, b' = (-0) + (-0) = -0
  ref::apply_neox_rope(v, 2, c, s);
  CHECK(fbits(v[0]) == 0u);
  CHECK(fbits(v[1]) == 0x80000000u);
  float m[2] = {-0.0f, 0.0f};  // a' = (-0) - (+0) = -0, b' = (-0) + (+0) = +0
  ref::apply_neox_rope(m, 2, c, s);
  CHECK(fbits(m[0]) == 0x80000000u);
  CHECK(fbits(m[1]) == 0u);
  const bf16 sn[1] = {to_bf16(-0.75f)};  // negative sin: a' = (-0) - (+0) = -0... with b = -0: (-0)-(+0) = -0
  float n[2] = {-0.0f, -0.0f};
  ref::apply_neox_rope(n, 2, c, sn);
  CHECK(fbits(n[0]) == 0x80000000u);
  CHECK(fbits(n[1]) == 0u);  // fma(-0, -0.75, -0 * 0.5) = (+0) + (-0) = +0
}

TEST_CASE("signed zero: a zero score is +0 (the reference seeds the head sum with +0), whatever the weights") {
  constexpr int P = 8, hpg = 4;
  std::vector<std::uint8_t> q(static_cast<std::size_t>(hpg) * P);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = step5::float_to_e4m3_bits(i % 2 ? 1.5f : -0.5f);
  std::vector<std::uint8_t> zero_mixed(P), zero_neg(P, 0x80);
  for (int d = 0; d < P; ++d) zero_mixed[d] = d % 3 ? 0x80 : 0x00;
  const float w_neg[hpg] = {-0.5f, -0.25f, -1.0f, -2.0f}, w_pos[hpg] = {0.5f, 0.25f, 1.0f, 2.0f};
  for (const auto* s : {&zero_mixed, &zero_neg}) {
    CHECK(fbits(ref::region_score(q.data(), w_neg, hpg, P, s->data())) == 0u);
    CHECK(fbits(ref::region_score(q.data(), w_pos, hpg, P, s->data())) == 0u);
  }
  // every dot negative (ReLU -> 0) and every weight negative: still +0
  std::vector<std::uint8_t> pos_s(P, step5::float_to_e4m3_bits(1.0f)), neg_q(q.size(), step5::float_to_e4m3_bits(-1.0f));
  CHECK(fbits(ref::region_score(neg_q.data(), w_neg, hpg, P, pos_s.data())) == 0u);
}

TEST_CASE("scores: ReLU keeps NaN (as torch.relu and the score kernel), so a NaN q gives a NaN score") {
  // Sibling of the signed-zero rules (issue 12 §2): the CPU reference once mapped NaN to 0 while the
  // kernel kept it; SPEC §4.5 now states that ReLU propagates NaN.
  const int P = 128, hpg = 2;
  std::vector<std::uint8_t> q(static_cast<std::size_t>(hpg) * P, 0x38), s(P, 0x38);  // 1.0 everywhere
  const float w[hpg] = {0.5f, 0.5f};
  CHECK(ref::region_score(q.data(), w, hpg, P, s.data()) == doctest::Approx(128.0));
  q[5] = 0x7f;  // e4m3 NaN in head 0
  CHECK(std::isnan(ref::region_score(q.data(), w, hpg, P, s.data())));
}
