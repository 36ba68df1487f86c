// Hand-computed cases for each step of the CPU reference (SPEC §4.2–4.8) and the selection rules of
// SPEC §4.6 against an independent brute force (stable sort) for small topk.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "reference_test_util.hpp"

using namespace reftest;
namespace ref = step5::reference;
using step5::to_bf16;
using step5::to_float;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<std::int32_t> select(const std::vector<float>& s, int topk, int current, int* count = nullptr) {
  std::vector<std::int32_t> row(static_cast<std::size_t>(topk + 1), 12345);
  const int c = ref::select_row(s.data(), static_cast<int>(s.size()), topk, current, row.data());
  if (count) *count = c;
  return row;
}

// Independent brute force of SPEC §4.6: stable sort by score descending (NaN first, -0 == +0 via
// operator>), keep the first topk, sort ascending.
std::vector<std::int32_t> brute_select(const std::vector<float>& s, int topk, int current) {
  std::vector<int> ids(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) ids[i] = static_cast<int>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
    if (std::isnan(s[a]) || std::isnan(s[b])) return std::isnan(s[a]) && !std::isnan(s[b]);
    return s[a] > s[b];
  });
  const int n = std::min<int>(topk, static_cast<int>(s.size()));
  std::vector<std::int32_t> row(ids.begin(), ids.begin() + n);
  std::sort(row.begin(), row.end());
  row.push_back(current);
  while (static_cast<int>(row.size()) < topk + 1) row.push_back(-1);
  return row;
}
}  // namespace

TEST_CASE("selection: ties go to the lower id, ascending output, current region appended") {
  int count = 0;
  CHECK(select({1, 3, 3, 2, 3}, 2, 5, &count) == std::vector<std::int32_t>{1, 2, 5});
  CHECK(count == 3);
  // tie at the k-th place: ids 1, 2, 4 share 3; topk 2 keeps 1 and 2
  CHECK(select({3, 3, 3, 3}, 3, 4, &count) == std::vector<std::int32_t>{0, 1, 2, 4});
  CHECK(count == 4);
}

TEST_CASE("selection: a row shorter than topk gets -1 padding and count = history + 1") {
  int count = 0;
  CHECK(select({0.5f, -1.0f}, 4, 2, &count) == std::vector<std::int32_t>{0, 1, 2, -1, -1});
  CHECK(count == 3);
  CHECK(select({}, 3, 0, &count) == std::vector<std::int32_t>{0, -1, -1, -1});  // first region: only the current one
  CHECK(count == 1);
}

TEST_CASE("selection: NaN above +inf, -inf last, -0 equals +0") {
  int count = 0;
  // ids: 0:+0 1:-0 2:NaN 3:+inf 4:-inf 5:+0 -> NaN, +inf, then the lowest of the zero tie (id 0)
  CHECK(select({0.0f, -0.0f, kNaN, kInf, -kInf, 0.0f}, 3, 6, &count) == std::vector<std::int32_t>{0, 2, 3, 6});
  CHECK(select({-0.0f, 0.0f}, 1, 2) == std::vector<std::int32_t>{0, 2});
  CHECK(select({0.0f, -0.0f}, 1, 2) == std::vector<std::int32_t>{0, 2});
  CHECK(select({-kInf, -kInf, -5.0f}, 1, 3) == std::vector<std::int32_t>{2, 3});
  CHECK(select({kNaN, 1.0f, kNaN}, 2, 3) == std::vector<std::int32_t>{0, 2, 3});
}

TEST_CASE("selection: small topk (2, 4, 16) against a brute force, heavy ties and specials") {
  std::mt19937 rng(7);
  const float pool[] = {-1.0f, 0.0f, -0.0f, 0.5f, 0.5f, 2.0f, kNaN, kInf, -kInf, 0.25f};
  for (int topk : {2, 4, 16}) {
    for (int trial = 0; trial < 200; ++trial) {
      const int n = static_cast<int>(rng() % 40);
      std::vector<float> s(static_cast<std::size_t>(n));
      for (auto& x : s) x = pool[rng() % 10];
      CAPTURE(topk);
      CAPTURE(n);
      int count = 0;
      const auto row = select(s, topk, n, &count);
      CHECK(row == brute_select(s, topk, n));
      CHECK(count == std::min(topk, n) + 1);
    }
  }
}

TEST_CASE("selection: topk outside [1, 1024] is refused with the value in the message") {
  std::vector<float> s(4, 0.0f);
  std::vector<std::int32_t> row(2000);
  CHECK_THROWS_WITH_AS(ref::select_row(s.data(), 4, 0, 4, row.data()), doctest::Contains("topk = 0"), step5::Error);
  CHECK_THROWS_WITH_AS(ref::select_row(s.data(), 4, 1025, 4, row.data()), doctest::Contains("topk = 1025"), step5::Error);
}

TEST_CASE("region summary: known z/k") {
  constexpr int P = 4;
  std::vector<bf16> k(8 * P), z(8 * P);
  const bf16* kr[8];
  const bf16* zr[8];
  for (int t = 0; t < 8; ++t) {
    kr[t] = k.data() + t * P;
    zr[t] = z.data() + t * P;
  }
  float s[P];
  std::uint8_t e[P];
  SUBCASE("equal z: the mean of k") {
    for (int t = 0; t < 8; ++t)
      for (int d = 0; d < P; ++d) {
        k[t * P + d] = to_bf16(static_cast<float>(t + 1) * (d + 1));
        z[t * P + d] = to_bf16(0.25f);
      }
    ref::region_summary(kr, zr, P, s, e);
    for (int d = 0; d < P; ++d) {
      CHECK(s[d] == doctest::Approx(4.5 * (d + 1)).epsilon(1e-6));
      CHECK(step5::e4m3_bits_to_float(e[d]) == step5::round_e4m3(step5::round_bf16(4.5f * (d + 1))));
    }
    CHECK(e[0] == step5::float_to_e4m3_bits(4.5f));  // 4.5 is exact in e4m3
  }
  SUBCASE("one row with z = 0, the others -inf: S = that row's k; saturation at 448") {
    for (int t = 0; t < 8; ++t)
      for (int d = 0; d < P; ++d) {
        k[t * P + d] = to_bf16(t == 3 ? (d == 0 ? 1000.0f : -0.75f * d) : 7.0f);
        z[t * P + d] = to_bf16(t == 3 ? 0.0f : -kInf);
      }
    ref::region_summary(kr, zr, P, s, e);
    CHECK(s[0] == 1000.0f);
    CHECK(e[0] == 0x7e);  // saturated to +448
    for (int d = 1; d < P; ++d) {
      CHECK(s[d] == -0.75f * d);
      CHECK(step5::e4m3_bits_to_float(e[d]) == -0.75f * d);
    }
  }
  SUBCASE("the max is taken over the whole block: two rows of z 1 and 0 weigh e : 1") {
    for (int t = 0; t < 8; ++t)
      for (int d = 0; d < P; ++d) {
        k[t * P + d] = to_bf16(t == 0 ? 1.0f : (t == 1 ? 0.0f : 5.0f));
        z[t * P + d] = to_bf16(t == 0 ? (d == 0 ? 1.0f : 0.0f) : (t == 1 ? 0.0f : -kInf));
      }
    ref::region_summary(kr, zr, P, s, e);
    CHECK(s[0] == doctest::Approx(std::exp(1.0) / (std::exp(1.0) + 1.0)).epsilon(1e-6));
    CHECK(s[1] == doctest::Approx(0.5).epsilon(1e-6));
  }
}

TEST_CASE("region summary: a step ending at position 2^31 - 2 completes no region (no signed overflow)") {
  // seq_len = INT_MAX within a block-table row of 2048 blocks of 2^20 tokens: the last region
  // (positions 2^31 - 8 .. 2^31 - 1) is incomplete. (r + 1) * 8 overflowed for it: the region counted
  // as complete, read index_k past its one row, and the loop ran on with negative positions.
  constexpr int P = 2, kBlockSize = 1 << 20, kMaxBlocks = 2048;
  std::vector<std::int32_t> cu = {0, 1}, seqs = {std::numeric_limits<int>::max()}, table(kMaxBlocks), slot = {0};
  for (int i = 0; i < kMaxBlocks; ++i) table[static_cast<std::size_t>(i)] = i;
  ref::BatchView batch{1, cu.data(), seqs.data()};
  ref::BlockTableView bt{table.data(), kMaxBlocks, kBlockSize, kMaxBlocks};
  std::vector<bf16> k = {to_bf16(1.0f), to_bf16(2.0f)}, z = {to_bf16(3.0f), to_bf16(4.0f)};
  std::vector<bf16> tail(8 * 2 * P, to_bf16(0.0f));
  std::vector<std::uint8_t> summary(16, 0xab);  // never written: no region completes
  std::vector<ref::CompletedRegion> done;
  ref::update_summaries(batch, bt, P, k.data(), P, z.data(), P, tail.data(), 1, slot.data(), summary.data(), &done);
  CHECK(done.empty());
  for (std::uint8_t b : summary) CHECK(b == 0xab);
  // the token (position 2^31 - 2) is row 6 of its region: (k, z) pairs in tail slot 0
  const std::size_t row = 6;
  CHECK(to_float(tail[(row * 2 + 0) * P + 1]) == 2.0f);
  CHECK(to_float(tail[(row * 2 + 1) * P + 0]) == 3.0f);
}

TEST_CASE("scores: ReLU per head, negative weights, heads summed in order") {
  constexpr int P = 4;
  auto e = [](float v) { return step5::float_to_e4m3_bits(v); };
  // head 0 dot = 2*1 + 1*0.5 = 2.5; head 1 dot = -2 (ReLU -> 0); head 2 dot = 1
  const std::uint8_t q[3 * P] = {e(1), e(0.5f), 0, 0, e(-1), 0, 0, 0, 0, 0, e(0.25f), e(0.25f)};
  const std::uint8_t s[P] = {e(2), e(1), e(2), e(2)};
  const float w1[3] = {0.5f, 100.0f, -2.0f};  // 2.5*0.5 + 0 + 1*(-2) = -0.75
  CHECK(ref::region_score(q, w1, 3, P, s) == -0.75f);
  const float w2[3] = {1.0f, -100.0f, 1.0f};  // the ReLU'd head contributes nothing even with weight -100
  CHECK(ref::region_score(q, w2, 3, P, s) == 3.5f);
  const std::uint8_t zero[P] = {0, 0, 0, 0};
  CHECK(ref::region_score(q, w1, 3, P, zero) == 0.0f);
}

TEST_CASE("scores: summary cache addressed through the block table") {
  // 1 request, 3 history regions at position 27 (p/8 = 3), block_size 16 -> 2 regions per block.
  constexpr int P = 4, lg = 1, hpg = 1;
  const std::vector<std::int32_t> cu = {0, 1}, seq = {28}, table = {2, 0};  // blocks 2 then 0
  ref::BatchView batch{1, cu.data(), seq.data()};
  ref::BlockTableView bt{table.data(), 2, 16, 3};
  std::vector<std::uint8_t> cache(3 * 2 * P, 0);
  auto put = [&](int r, float v) {
    const std::size_t off = ref::summary_offset(bt, 0, r, P);
    for (int d = 0; d < P; ++d) cache[off + d] = step5::float_to_e4m3_bits(v);
  };
  put(0, 1.0f);
  put(1, 2.0f);
  put(2, 0.5f);
  CHECK(ref::summary_offset(bt, 0, 1, P) == (2 * 2 + 1) * P);  // block 2, slot 1
  CHECK(ref::summary_offset(bt, 0, 2, P) == 0);                // block 0, slot 0
  const std::uint8_t q[P] = {0x38, 0x38, 0x38, 0x38};         // 1.0
  const float w[1] = {0.5f};
  std::vector<float> scores(5, -7.0f);
  ref::compute_scores(batch, bt, lg, hpg, P, q, w, cache.data(), scores.data(), 5);
  CHECK(scores == std::vector<float>{2.0f, 4.0f, 1.0f, 0.0f, 0.0f});
}

TEST_CASE("attention: the current region stops at the query's position; no token after it") {
  // D = 8, q = 0 -> uniform softmax over the attended tokens; v = position -> out = mean position,
  // lse = ln(number of attended tokens).
  constexpr int D = 8, block = 16;
  const int seq = 40;
  std::vector<std::int32_t> cu = {0, seq}, seqs = {seq}, table = {0, 1, 2};
  ref::BatchView batch{1, cu.data(), seqs.data()};
  ref::BlockTableView bt{table.data(), 3, block, 3};
  std::vector<bf16> kc(3 * block * D), vc(3 * block * D);
  for (int p = 0; p < 48; ++p)
    for (int d = 0; d < D; ++d) {
      kc[static_cast<std::size_t>(p) * D + d] = to_bf16(0.01f * p);
      vc[static_cast<std::size_t>(p) * D + d] = to_bf16(p < seq ? static_cast<float>(p) : 1e6f);  // poison past seq
    }
  std::vector<bf16> q(static_cast<std::size_t>(seq) * 4 * D, to_bf16(0.0f));
  const int topk = 2, W = topk + 1;
  // every token selects history region 0 (when it exists) + its current region
  std::vector<std::int32_t> ids(static_cast<std::size_t>(seq) * W, -1), counts(seq);
  for (int t = 0; t < seq; ++t) {
    int n = 0;
    if (t / 8 > 0) ids[static_cast<std::size_t>(t) * W + n++] = 0;
    ids[static_cast<std::size_t>(t) * W + n++] = t / 8;
    counts[t] = n;
  }
  std::vector<bf16> out(q.size());
  std::vector<float> lse(static_cast<std::size_t>(seq) * 4);
  ref::sparse_attention(batch, bt, 1, 4, D, topk, q.data(), kc.data(), vc.data(), ids.data(), counts.data(), out.data(),
                        lse.data());
  for (int t = 0; t < seq; ++t) {
    const int cur0 = 8 * (t / 8);
    const int n_cur = t - cur0 + 1;  // tokens of the partial current region
    double sum = 0;
    for (int p = cur0; p <= t; ++p) sum += p;
    int n = n_cur;
    if (t / 8 > 0) {
      sum += 0 + 1 + 2 + 3 + 4 + 5 + 6 + 7;
      n += 8;
    }
    CAPTURE(t);
    for (int h = 0; h < 4; ++h) {
      CHECK(lse[static_cast<std::size_t>(t) * 4 + h] == doctest::Approx(std::log(static_cast<double>(n))).epsilon(1e-6));
      CHECK(to_float(out[(static_cast<std::size_t>(t) * 4 + h) * D]) == step5::round_bf16(static_cast<float>(sum / n)));
    }
  }
}

TEST_CASE("attention: an empty row gives 0 and -inf; softmax weights follow the logits") {
  constexpr int D = 4;
  std::vector<std::int32_t> cu = {0, 1}, seqs = {2}, table = {0};
  ref::BatchView batch{1, cu.data(), seqs.data()};
  ref::BlockTableView bt{table.data(), 1, 8, 1};
  std::vector<bf16> kc(8 * D, to_bf16(0.0f)), vc(8 * D, to_bf16(0.0f));
  // token 0: k = (2,0,0,0), v = 1; token 1: k = 0, v = 0. q = (1,0,0,0): logits 2/sqrt(4) = 1 and 0.
  kc[0] = to_bf16(2.0f);
  for (int d = 0; d < D; ++d) vc[d] = to_bf16(1.0f);
  std::vector<bf16> q = {to_bf16(1.0f), to_bf16(0.0f), to_bf16(0.0f), to_bf16(0.0f)};
  std::vector<std::int32_t> ids = {0, -1}, counts = {1};
  std::vector<bf16> out(D);
  std::vector<float> lse(1);
  ref::sparse_attention(batch, bt, 1, 1, D, 1, q.data(), kc.data(), vc.data(), ids.data(), counts.data(), out.data(), lse.data());
  const double e = std::exp(1.0);
  CHECK(lse[0] == doctest::Approx(std::log(e + 1.0)).epsilon(1e-6));
  CHECK(to_float(out[0]) == step5::round_bf16(step5::round_bf16(1.0f) / static_cast<float>(1.0 + 1.0 / e)));
  counts[0] = 0;
  ref::sparse_attention(batch, bt, 1, 1, D, 1, q.data(), kc.data(), vc.data(), ids.data(), counts.data(), out.data(), lse.data());
  CHECK(lse[0] == -kInf);
  CHECK(to_float(out[0]) == 0.0f);
  ids[0] = 1;  // a region id after the current region is refused
  counts[0] = 1;
  CHECK_THROWS_WITH_AS(ref::sparse_attention(batch, bt, 1, 1, D, 1, q.data(), kc.data(), vc.data(), ids.data(),
                                             counts.data(), out.data(), lse.data()),
                       doctest::Contains("current region 0"), step5::Error);
}

TEST_CASE("attention and select_topk: topk outside [1, 1024] is refused naming it (a topk past 2^30 hung)") {
  // regions per tile: min(16, next_pow2(topk + 1)), bounded for every int
  CHECK(ref::default_regions_per_tile(1) == 2);
  CHECK(ref::default_regions_per_tile(7) == 8);
  CHECK(ref::default_regions_per_tile(8) == 16);
  CHECK(ref::default_regions_per_tile(1024) == 16);
  CHECK(ref::default_regions_per_tile(0) == 1);
  CHECK(ref::default_regions_per_tile(1500000000) == 16);  // looped for ever at p = 0
  CHECK(ref::default_regions_per_tile(std::numeric_limits<int>::max()) == 16);
  constexpr int D = 4;
  std::vector<std::int32_t> cu = {0, 1}, seqs = {2}, table = {0};
  ref::BatchView batch{1, cu.data(), seqs.data()};
  ref::BlockTableView bt{table.data(), 1, 8, 1};
  std::vector<bf16> kc(8 * D, to_bf16(0.0f)), vc(8 * D, to_bf16(0.0f)), q(D, to_bf16(0.0f)), out(D);
  std::vector<std::int32_t> ids(4, -1), counts = {0}, positions = {1};
  std::vector<float> lse(1), scores(4, 0.0f);
  for (const int topk : {0, -3, 1025, 1500000000, std::numeric_limits<int>::max()}) {
    INFO("topk " << topk);
    const std::string want = "topk = " + std::to_string(topk) + ", expected in [1, 1024]";
    CHECK_THROWS_WITH_AS(ref::sparse_attention(batch, bt, 1, 1, D, topk, q.data(), kc.data(), vc.data(), ids.data(),
                                               counts.data(), out.data(), lse.data()),
                         doctest::Contains(("sparse_attention: " + want).c_str()), step5::Error);
    CHECK_THROWS_WITH_AS(ref::select_topk(1, 1, scores.data(), 4, positions.data(), topk, ids.data(), counts.data()),
                         doctest::Contains(("select_topk: " + want).c_str()), step5::Error);
  }
}

TEST_CASE("gate: bf16(sigmoid(bf16 g)) then bf16(o * gate)") {
  CHECK(ref::gate_value(to_bf16(0.0f)) == 0.5f);
  CHECK(ref::gate_value(to_bf16(2.0f)) == 0.87890625f);  // sigmoid(2) = 0.880797 -> bf16 0.87890625
  CHECK(ref::gate_value(to_bf16(40.0f)) == 1.0f);
  CHECK(ref::gate_value(to_bf16(-200.0f)) == 0.0f);
  const std::vector<bf16> attn = {to_bf16(1.0f), to_bf16(3.0f), to_bf16(-3.0f), to_bf16(3.0f)};  // T=1, Hl=2, D=2
  const std::vector<bf16> g = {to_bf16(0.0f), to_bf16(2.0f)};
  std::vector<bf16> out(4), gate(2);
  ref::apply_gate(1, 2, 2, attn.data(), g.data(), 2, out.data(), gate.data());
  CHECK(to_float(out[0]) == 0.5f);
  CHECK(to_float(out[1]) == 1.5f);
  CHECK(to_float(out[2]) == -2.640625f);  // 3 * 0.87890625 = 2.63671875 -> bf16 2.640625
  CHECK(to_float(out[3]) == 2.640625f);
  CHECK(to_float(gate[1]) == 0.87890625f);
}

TEST_CASE("main q/k: zero-centred RMSNorm x (1 + w) and NeoX RoPE pairs (i, i + rot/2)") {
  constexpr int D = 64;
  std::vector<bf16> x(D, to_bf16(2.0f)), out(D);
  std::vector<float> w(D, 0.5f);
  ref::main_qk_head(x.data(), out.data(), D, w.data(), 1e-5f, 0, nullptr, nullptr);
  for (int d = 0; d < D; ++d) CHECK(to_float(out[d]) == 1.5f);  // 2 / rms(2) * 1.5
  float v[4] = {1, 2, 3, 4};
  const bf16 c[2] = {to_bf16(0.0f), to_bf16(1.0f)}, s[2] = {to_bf16(1.0f), to_bf16(0.0f)};
  ref::apply_neox_rope(v, 4, c, s);  // pair (0,2) rotated by 90 degrees, pair (1,3) by 0
  CHECK(v[0] == -3.0f);
  CHECK(v[2] == 1.0f);
  CHECK(v[1] == 2.0f);
  CHECK(v[3] == 4.0f);
  const auto t = ref::make_rope_table(4, 4, 10000.0);
  CHECK(to_float(t.cos_row(0)[0]) == 1.0f);
  CHECK(to_float(t.sin_row(0)[1]) == 0.0f);
  CHECK(to_float(t.cos_row(1)[0]) == step5::round_bf16(static_cast<float>(std::cos(1.0))));
  CHECK(to_float(t.sin_row(3)[1]) == step5::round_bf16(static_cast<float>(std::sin(0.03))));  // inv_freq[1] = 1e-2
}

TEST_CASE("indexer: q RMSNorm with bf16(w) + 1, k LayerNorm with E[x^2] - E[x]^2, weights x hpg_i^-0.5") {
  constexpr int P = 8;
  std::vector<bf16> x(P), out(P);
  for (int d = 0; d < P; ++d) x[d] = to_bf16(d % 2 ? 3.0f : 1.0f);  // mean 2, var 1
  std::vector<float> w(P, 1.0f), b(P, 0.5f);
  ref::index_k_head(x.data(), out.data(), P, w.data(), b.data(), 0.0f, 0, nullptr, nullptr);
  for (int d = 0; d < P; ++d) CHECK(to_float(out[d]) == (d % 2 ? 1.5f : -0.5f));
  // q: x = 2 everywhere -> x * rsqrt(mean(x^2)) = 1 exactly, so out = bf16(bf16(w) + 1). Near w = -1
  // the bf16 rounding of w dominates: bf16(-0.99) = -0.98828125 -> 0.01171875 (= 3/256), whereas
  // the unrounded w + 1 gives ~0.01 and w alone (no + 1) gives -0.99.
  const float wq_val = -0.99f;
  REQUIRE(step5::round_bf16(wq_val) == -0.98828125f);
  const float expected_q = 0.01171875f;
  REQUIRE(step5::round_bf16(1.0f * (wq_val + 1.0f)) != expected_q);  // the unrounded formula differs
  std::vector<float> wq(P, wq_val);
  for (int d = 0; d < P; ++d) x[d] = to_bf16(2.0f);
  ref::index_q_head(x.data(), out.data(), P, wq.data(), 0.0f, 0, nullptr, nullptr);
  for (int d = 0; d < P; ++d) CHECK(to_float(out[d]) == expected_q);

  // prepare_indexer: Il = 8 local heads, hpg_i = 2 (two groups), one token at position 0 (rope
  // identity). Score weights are fp32 float(w_raw) * hpg_i^-0.5, not bf16-rounded, not Il^-0.5.
  constexpr int Il = 8, hpg_i = 2;
  std::vector<bf16> q_raw(static_cast<std::size_t>(Il) * P, to_bf16(2.0f)), k_raw(P), z_raw(P), w_raw(Il);
  for (int d = 0; d < P; ++d) {
    k_raw[d] = to_bf16(d % 2 ? 3.0f : 1.0f);
    z_raw[d] = to_bf16(0.25f * static_cast<float>(d) - 1.0f);
  }
  for (int h = 0; h < Il; ++h) w_raw[h] = to_bf16(0.375f * static_cast<float>(h) - 1.3f);
  const auto rope = ref::make_rope_table(1, 2, 10000.0);
  const std::int32_t pos0 = 0;
  std::vector<bf16> q_out(q_raw.size()), k_out(P), z_out(P);
  std::vector<std::uint8_t> q_e4m3(q_raw.size());
  std::vector<float> weights(Il, -1.0f);
  ref::prepare_indexer(1, Il, hpg_i, P, q_raw.data(), Il * P, k_raw.data(), P, z_raw.data(), P, w_raw.data(), Il,
                       wq.data(), w.data(), b.data(), 0.0f, rope, &pos0, q_out.data(), q_e4m3.data(), k_out.data(),
                       z_out.data(), weights.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hpg_i));
  for (int h = 0; h < Il; ++h) {
    const float expected_w = to_float(w_raw[h]) * scale;
    CHECK(weights[h] == expected_w);
    CHECK(weights[h] != to_float(w_raw[h]) / std::sqrt(static_cast<float>(Il)));
  }
  CHECK(weights[0] != step5::round_bf16(weights[0]));  // fp32, not rounded to bf16
  for (std::size_t i = 0; i < q_out.size(); ++i) {
    CHECK(to_float(q_out[i]) == expected_q);
    CHECK(q_e4m3[i] == step5::float_to_e4m3_bits(expected_q));
  }
  for (int d = 0; d < P; ++d) {
    CHECK(to_float(k_out[d]) == (d % 2 ? 1.5f : -0.5f));
    CHECK(z_out[d].bits == z_raw[d].bits);
  }
}

TEST_CASE("indexer q/k heads: rot outside [0, proxy_dim] or odd is refused naming it (main_qk_head's rule)") {
  // rot 4000 rotated past the heads' 1024-float stack buffer (ASan/UBSan); rot 8 on P = 4 rotated
  // uninitialised values into the output; rot 3 paired dims (0, 1) silently
  constexpr int P = 4;
  std::vector<bf16> x(P, to_bf16(1.0f)), out(P), cs(2048, to_bf16(1.0f)), sn(2048, to_bf16(0.5f));
  std::vector<float> w(P, 0.0f), b(P, 0.0f);
  for (const int rot : {3, 8, 4000, -2}) {
    INFO("rot " << rot);
    const std::string want = "rot = " + std::to_string(rot) + ", expected even and in [0, proxy_dim 4]";
    CHECK_THROWS_WITH_AS(ref::index_q_head(x.data(), out.data(), P, w.data(), 1e-5f, rot, cs.data(), sn.data()),
                         doctest::Contains(("index_q_head: " + want).c_str()), step5::Error);
    CHECK_THROWS_WITH_AS(
        ref::index_k_head(x.data(), out.data(), P, w.data(), b.data(), 1e-5f, rot, cs.data(), sn.data()),
        doctest::Contains(("index_k_head: " + want).c_str()), step5::Error);
  }
  ref::index_q_head(x.data(), out.data(), P, w.data(), 1e-5f, P, cs.data(), sn.data());  // rot = P is fine
  ref::index_k_head(x.data(), out.data(), P, w.data(), b.data(), 1e-5f, 0, nullptr, nullptr);
}

TEST_CASE("batch metadata: positions, validation messages") {
  const std::vector<std::int32_t> cu = {0, 3, 4, 4}, seq = {3, 10, 5};
  ref::BatchView b{3, cu.data(), seq.data()};
  CHECK(ref::token_positions(b) == std::vector<std::int32_t>{0, 1, 2, 9});
  CHECK(ref::token_requests(b) == std::vector<std::int32_t>{0, 0, 0, 1});
  const std::vector<std::int32_t> bad = {2, 10, 5};
  ref::BatchView bb{3, cu.data(), bad.data()};
  const std::vector<std::int32_t> table = {0, 1, 2, 3, 4, 5};  // a block of its own per entry (validate_step rule 4)
  const ref::BlockTableView bt{table.data(), 2, 8, 6};
  CHECK_NOTHROW(ref::validate_step(b, bt, "steps"));
  // every request on block 0: request 0's writes (positions 0..2) would land in request 1's block
  const std::vector<std::int32_t> shared(3 * 2, 0);
  CHECK_THROWS_WITH_AS(ref::validate_step(b, ref::BlockTableView{shared.data(), 2, 8, 1}, "steps"),
                       doctest::Contains("block_table[0][0] = 0 receives positions 0..2"), step5::Error);
  CHECK_THROWS_WITH_AS(ref::validate_step(bb, bt, "steps"), doctest::Contains("seq_lens[0] = 2"), step5::Error);
}
TEST_CASE("batch metadata: a step of no tokens (cu_seqlens_q[B] = 0) with other offsets is refused naming them") {
  // The reference takes T = cu_seqlens_q[B] and loops over [cu[b], cu[b+1]); validate_step applies
  // rule 1 only to a step of no tokens, so [0, 5, 0] and [-3, 0] passed and the loops wrote
  // positions, k/v rows and tail slots of five (or -3..-1) tokens into buffers sized for none.
  const std::vector<std::int32_t> table = {0, 1};
  const ref::BlockTableView bt{table.data(), 1, 8, 2};
  const std::vector<std::int32_t> cu = {0, 5, 0}, seq = {5, 0};
  const ref::BatchView b{2, cu.data(), seq.data()};
  CHECK_THROWS_WITH_AS(ref::validate_step(b, bt, "steps"),
                       "steps: cu_seqlens_q[1] = 5 with cu_seqlens_q[2] = 0 (a step of no tokens), expected 0 "
                       "(cu_seqlens_q starts at 0, is non-decreasing and ends at num_tokens)",
                       step5::Error);
  const std::vector<std::int32_t> cu_neg = {-3, 0}, seq1 = {4};
  const ref::BatchView bn{1, cu_neg.data(), seq1.data()};
  CHECK_THROWS_WITH_AS(ref::validate_step(bn, bt, "steps"), doctest::Contains("cu_seqlens_q[0] = -3 with cu_seqlens_q[1] = 0"),
                       step5::Error);
  // the public steps refuse it before touching a buffer (k, v, index_k, index_z hold no rows)
  std::vector<bf16> kc(2 * 8 * 4), vc(kc.size());
  CHECK_THROWS_WITH_AS(ref::write_kv_cache(b, bt, 1, 4, nullptr, 4, nullptr, 4, kc.data(), vc.data()),
                       doctest::Contains("write_kv_cache: cu_seqlens_q[1] = 5"), step5::Error);
  std::vector<bf16> tail(8 * 2 * 4);
  std::vector<std::uint8_t> summaries(2 * 4);
  const std::vector<std::int32_t> slots = {0, 0};
  CHECK_THROWS_WITH_AS(ref::update_summaries(b, bt, 4, nullptr, 4, nullptr, 4, tail.data(), 1, slots.data(), summaries.data()),
                       doctest::Contains("update_summaries: cu_seqlens_q[1] = 5"), step5::Error);
  // a step of idle requests (all offsets 0) is still a valid step of no tokens
  const std::vector<std::int32_t> zeros = {0, 0, 0};
  CHECK_NOTHROW(ref::validate_step(ref::BatchView{2, zeros.data(), seq.data()}, bt, "steps"));
  CHECK_NOTHROW(ref::write_kv_cache(ref::BatchView{2, zeros.data(), seq.data()}, bt, 1, 4, nullptr, 4, nullptr, 4, kc.data(),
                                    vc.data()));
}
TEST_CASE("main q/k and indexer preparation: a RoPE table whose fields claim more rows than it holds is refused") {
  // prepare_main_qk / prepare_indexer checked positions against rope.max_position and read row
  // `position` through cos_row / sin_row, which trust max_position and rot: a table whose rot was
  // widened (rows read 2x too far apart) or whose max_position was raised was read past its
  // vectors. forward checked the tables (validate_weights); these public steps did not.
  constexpr int D = 16, P = 16;
  std::vector<bf16> x(static_cast<std::size_t>(D), to_bf16(1.0f)), q(x.size()), k(x.size());
  std::vector<float> w(static_cast<std::size_t>(D), 0.0f);
  std::vector<bf16> iq(static_cast<std::size_t>(P)), ik(iq.size()), iz(iq.size()), wr(1);
  std::vector<std::uint8_t> iq8(iq.size());
  std::vector<float> weights(1);
  auto main_qk = [&](const ref::RopeTable& rope, std::int32_t position) {
    ref::prepare_main_qk(1, 1, 1, D, x.data(), D, x.data(), D, w.data(), w.data(), 1e-5f, rope, &position, q.data(), k.data());
  };
  auto indexer = [&](const ref::RopeTable& rope, std::int32_t position) {
    ref::prepare_indexer(1, 1, 1, P, x.data(), P, x.data(), P, x.data(), P, wr.data(), 1, w.data(), w.data(), w.data(),
                         1e-5f, rope, &position, iq.data(), iq8.data(), ik.data(), iz.data(), weights.data());
  };
  const ref::RopeTable good = ref::make_rope_table(16, 8, 1e4);  // 16 rows of 4
  CHECK_NOTHROW(main_qk(good, 15));
  CHECK_NOTHROW(indexer(good, 15));
  ref::RopeTable wide = good;
  wide.rot = 16;  // rows of 8 claimed, 4 held
  CHECK_THROWS_WITH_AS(main_qk(wide, 15),
                       "prepare_main_qk: rope: cos/sin have 64/64 elements, expected max_position 16 (>= 1) x rot/2 8 = 128",
                       step5::Error);
  CHECK_THROWS_WITH_AS(indexer(wide, 15), doctest::Contains("prepare_indexer: rope: cos/sin have 64/64 elements"), step5::Error);
  ref::RopeTable longer = good;
  longer.max_position = 1 << 20;  // position 500000 would read row 500000 of 16
  CHECK_THROWS_WITH_AS(main_qk(longer, 500000),
                       doctest::Contains("prepare_main_qk: rope: cos/sin have 64/64 elements, expected max_position 1048576"),
                       step5::Error);
  CHECK_THROWS_WITH_AS(indexer(longer, 500000), doctest::Contains("prepare_indexer: rope: cos/sin have 64/64"), step5::Error);
}
TEST_CASE("region summary: a null tail_slot in a step with tokens is refused naming it") {
  // validate_step's rule 5 checks tail_slot only when the host array is given: a null one skipped
  // it and update_summaries then read tail_slot[0] (SIGSEGV).
  const std::vector<std::int32_t> cu = {0, 3}, seq = {3}, table = {0};
  const ref::BatchView b{1, cu.data(), seq.data()};
  const ref::BlockTableView bt{table.data(), 1, 8, 1};
  std::vector<bf16> k(3 * 4), z(3 * 4), tail(8 * 2 * 4);
  std::vector<std::uint8_t> summaries(4);
  CHECK_THROWS_WITH_AS(ref::update_summaries(b, bt, 4, k.data(), 4, z.data(), 4, tail.data(), 1, nullptr, summaries.data()),
                       "update_summaries: tail_slot is null, expected the tail slots [B] of a step of 3 tokens", step5::Error);
  const std::vector<std::int32_t> slots = {0};
  CHECK_NOTHROW(ref::update_summaries(b, bt, 4, k.data(), 4, z.data(), 4, tail.data(), 1, slots.data(), summaries.data()));
  // a step of no tokens reads no slot
  const std::vector<std::int32_t> cu0 = {0, 0};
  CHECK_NOTHROW(ref::update_summaries(ref::BatchView{1, cu0.data(), seq.data()}, bt, 4, nullptr, 4, nullptr, 4, tail.data(), 1,
                                      nullptr, summaries.data()));
}
