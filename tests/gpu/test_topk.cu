// GPU test of the deterministic top-k selection (SPEC.md §4.6): step5::ops::topk_select fed the
// same fp32 scores as the CPU reference (step5/reference/select.hpp); rows and counts must be equal
// exactly, on hard patterns (plateaus, ±inf, NaN, −0, near-equal values, keys on both sides of the
// radix digit boundaries), every kernel variant (one CTA per row and a cluster of kTopkCluster CTAs
// per row, each with keys staged in shared memory or re-read from global memory; 131072-region
// rows), at engine batch sizes (33, 257 and 1024 decode rows of mixed histories, some empty; 1, 16,
// 64 and 257 rows of 16384 regions), and bit-identical over 100 launches while a
// memory-streaming kernel is launched on another stream each time (no assertion depends on
// whether the two overlap).
// Quick (sanitizer) mode, step5_test::quick(): the edge cases unchanged; the shared-memory case
// with one 16384-region row plus every pattern at 9999 and 513; the long-row case on 50000-region
// rows instead of 131072 (above kTopkSmemKeys = 49152 of kernels/sm90/indexer_topk.cuh, so the
// forced one-CTA run still re-reads keys from global memory, and the launcher's own choice is a
// cluster); the batch case at 33 and 257 rows (not 1024); the 16384-region decode rows at 1 and 16
// rows; 5 repeated launches instead of 100.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/kernels/sm90/indexer_args.cuh"
#include "step5/ops/indexer.hpp"
#include "step5/reference/select.hpp"

namespace {

enum class Pattern { kRandom, kAllEqual, kInf, kNaN, kZeroPlateau, kNearEqual, kFewDistinct, kNegative, kDigitEdges };
const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kRandom: return "random";
    case Pattern::kAllEqual: return "all-equal";
    case Pattern::kInf: return "inf";
    case Pattern::kNaN: return "nan";
    case Pattern::kZeroPlateau: return "zero-plateau";
    case Pattern::kNearEqual: return "near-equal";
    case Pattern::kFewDistinct: return "few-distinct";
    case Pattern::kNegative: return "negative";
    case Pattern::kDigitEdges: return "digit-edges";
  }
  return "?";
}

/// Fills the n scores of one row; `topk` places the zero plateau across the k-th rank.
void fill_row(float* s, int n, int topk, Pattern p, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ui(0, 1 << 20);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < n; ++i) s[i] = nd(rng);
  switch (p) {
    case Pattern::kRandom: break;
    case Pattern::kAllEqual:
      for (int i = 0; i < n; ++i) s[i] = 0.75f;
      break;
    case Pattern::kInf:
      for (int i = 0; i < n; ++i) {
        const int u = ui(rng) % 16;
        if (u == 0) s[i] = inf;
        else if (u == 1) s[i] = -inf;
      }
      break;
    case Pattern::kNaN:
      for (int i = 0; i < n; ++i) {
        const int u = ui(rng) % 16;
        if (u == 0) s[i] = nan;
        else if (u == 1) s[i] = -nan;
        else if (u == 2) s[i] = inf;
      }
      break;
    case Pattern::kZeroPlateau: {
      // about topk/2 positive scores, then a big plateau of +0 and -0 straddling the k-th place
      for (int i = 0; i < n; ++i) {
        const int u = ui(rng) % n;
        if (u < topk / 2) s[i] = std::abs(s[i]) + 0.01f;
        else if (u < 3 * n / 4) s[i] = (u & 1) ? 0.0f : -0.0f;
        else s[i] = -std::abs(s[i]) - 0.01f;
      }
      break;
    }
    case Pattern::kNearEqual:
      for (int i = 0; i < n; ++i) {
        std::uint32_t b;
        const float base = 1.2345f;
        std::memcpy(&b, &base, 4);
        b += static_cast<std::uint32_t>(ui(rng) % 8);  // differ in the lowest 3 mantissa bits
        std::memcpy(&s[i], &b, 4);
      }
      break;
    case Pattern::kFewDistinct:
      for (int i = 0; i < n; ++i) s[i] = static_cast<float>(ui(rng) % 5) - 2.0f;
      break;
    case Pattern::kNegative:
      for (int i = 0; i < n; ++i) s[i] = -std::abs(s[i]) * 1e-30f;  // tiny negatives, subnormal-ish
      break;
    case Pattern::kDigitEdges: {
      // keys on both sides of radix digit boundaries: the 8-bit digits of
      // kernels/sm90/indexer_topk.cuh (bits 8, 16, 24: 0x3f80ffff / 0x3f810000, 0x3fffffff /
      // 0x40000000, ...) and 10/11-bit ones (bits 10 and 21): values sharing the upper digits and
      // differing just below or across a boundary, many repeated, negatives too (keys inverted)
      static constexpr std::uint32_t kOffsets[] = {0u,       1u,        0xffu,     0x100u,    0x3ffu,    0x400u,
                                                   0x401u,   0x7ffu,    0x800u,    0xffffu,   0x10000u,  0x1fffffu,
                                                   0x200000u, 0x200001u, 0x3fffffu, 0x7fffffu, 0x800000u};
      for (int i = 0; i < n; ++i) {
        std::uint32_t b = 0x3f800000u + kOffsets[ui(rng) % std::size(kOffsets)] + static_cast<std::uint32_t>(ui(rng) % 3);
        if (ui(rng) % 4 == 0) b |= 0x80000000u;
        std::memcpy(&s[i], &b, 4);
      }
      break;
    }
  }
}

struct Rows {
  int ld = 0;
  int topk = 0;
  std::vector<float> scores;
  std::vector<std::int32_t> history;
  std::vector<std::string> names;
  void add(int n, Pattern p, std::mt19937& rng) {
    const std::size_t r = history.size();
    scores.resize((r + 1) * static_cast<std::size_t>(ld), 0.f);
    fill_row(scores.data() + r * ld, n, topk, p, rng);
    history.push_back(n);
    names.push_back(std::string(pattern_name(p)) + " n=" + std::to_string(n));
  }
  int rows() const { return static_cast<int>(history.size()); }
};

struct GpuResult {
  std::vector<std::int32_t> ids, counts;
};

/// The selection of every row. cluster: 0 = the public entry point (step5::ops::topk_select, its own
/// choice of variant); 1 or kTopkCluster = that kernel variant forced. With `noise`, every launch
/// runs on a non-blocking stream while noise_kernel (a different grid size each time) runs on another.
GpuResult run_gpu(const Rows& R, int cluster = 0, int repeats = 1, bool* identical = nullptr, bool noise = false) {
  const int rows = R.rows(), w = R.topk + 1;
  float* d_s = nullptr;
  std::int32_t *d_h = nullptr, *d_ids = nullptr, *d_cnt = nullptr;
  GPU_CHECK(cudaMalloc(&d_s, R.scores.size() * 4));
  GPU_CHECK(cudaMalloc(&d_h, rows * 4));
  GPU_CHECK(cudaMalloc(&d_ids, static_cast<std::size_t>(rows) * w * 4));
  GPU_CHECK(cudaMalloc(&d_cnt, rows * 4));
  GPU_CHECK(cudaMemcpy(d_s, R.scores.data(), R.scores.size() * 4, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(d_h, R.history.data(), rows * 4, cudaMemcpyHostToDevice));
  step5::ops::TopkSelectParams p;
  p.scores = d_s;
  p.ld = R.ld;
  p.history = d_h;
  p.rows = rows;
  p.topk = R.topk;
  p.ids = d_ids;
  p.ld_ids = w;
  p.counts = d_cnt;
  cudaStream_t s_sel = nullptr, s_noise = nullptr;
  float* d_noise = nullptr;
  const std::size_t noise_n = std::size_t(1) << 26;  // 256 MiB
  if (noise) {
    GPU_CHECK(cudaStreamCreateWithFlags(&s_sel, cudaStreamNonBlocking));
    GPU_CHECK(cudaStreamCreateWithFlags(&s_noise, cudaStreamNonBlocking));
    GPU_CHECK(cudaMalloc(&d_noise, noise_n * 4));
    GPU_CHECK(cudaMemset(d_noise, 0, noise_n * 4));
  }
  GpuResult first;
  if (identical) *identical = true;
  for (int it = 0; it < repeats; ++it) {
    GPU_CHECK(cudaMemset(d_ids, 0x7b, static_cast<std::size_t>(rows) * w * 4));  // poison
    GPU_CHECK(cudaMemset(d_cnt, 0x7b, rows * 4));
    GPU_CHECK(cudaDeviceSynchronize());
    if (noise) step5_test::noise_kernel<<<33 + 17 * (it % 13), 256, 0, s_noise>>>(d_noise, noise_n, 2);
    const auto launch = [&]() -> step5::Status {
      if (cluster == 0) return step5::ops::topk_select(p, s_sel);
      return step5::kernels::sm90::launch_topk(step5::ops::detail::topk_args(p), rows, s_sel, cluster);
    };
    const step5::Status st = launch();
    EXPECT(st.ok(), "topk_select (cluster %d): %s", cluster, st.to_string().c_str());
    if (noise) GPU_CHECK(cudaGetLastError());  // the noise launch itself
    GPU_CHECK(cudaDeviceSynchronize());
    GpuResult r;
    r.ids.resize(static_cast<std::size_t>(rows) * w);
    r.counts.resize(rows);
    GPU_CHECK(cudaMemcpy(r.ids.data(), d_ids, r.ids.size() * 4, cudaMemcpyDeviceToHost));
    GPU_CHECK(cudaMemcpy(r.counts.data(), d_cnt, rows * 4, cudaMemcpyDeviceToHost));
    if (it == 0) first = r;
    else if (identical && (r.ids != first.ids || r.counts != first.counts)) *identical = false;
  }
  if (noise) {
    // the competing work ran (nothing here depends on how the two streams were scheduled: the
    // selection must be right and identical whether or not the kernels overlapped)
    float first_noise = 0.f;
    GPU_CHECK(cudaMemcpy(&first_noise, d_noise, sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(first_noise > 0.f, "the noise kernel did not run (buffer[0] = %g)", first_noise);
    GPU_CHECK(cudaStreamDestroy(s_sel));
    GPU_CHECK(cudaStreamDestroy(s_noise));
    GPU_CHECK(cudaFree(d_noise));
  }
  GPU_CHECK(cudaFree(d_s));
  GPU_CHECK(cudaFree(d_h));
  GPU_CHECK(cudaFree(d_ids));
  GPU_CHECK(cudaFree(d_cnt));
  return first;
}

/// Every row of `g` equals the CPU reference's selection of the same scores (ids and count).
void expect_reference(const Rows& R, const GpuResult& g, const char* what) {
  const int w = R.topk + 1;
  int bad = 0;
  for (int r = 0; r < R.rows(); ++r) {
    std::vector<std::int32_t> ref(static_cast<std::size_t>(w));
    const int cnt = step5::reference::select_row(R.scores.data() + static_cast<std::size_t>(r) * R.ld, R.history[r],
                                                 R.topk, R.history[r], ref.data());
    const bool same = g.counts[r] == cnt &&
                      std::equal(ref.begin(), ref.end(), g.ids.begin() + static_cast<std::ptrdiff_t>(r) * w);
    if (!same && bad++ < 5) {
      int first_diff = 0;
      while (first_diff < w && ref[first_diff] == g.ids[static_cast<std::size_t>(r) * w + first_diff]) ++first_diff;
      std::fprintf(stderr, "  %s row %d (%s, topk %d): count gpu %d ref %d; first diff at %d: gpu %d ref %d\n", what,
                   r, R.names[r].c_str(), R.topk, g.counts[r], cnt, first_diff,
                   first_diff < w ? g.ids[static_cast<std::size_t>(r) * w + first_diff] : 0,
                   first_diff < w ? ref[first_diff] : 0);
    }
    EXPECT(same, "%s row %d (%s) differs from the reference", what, r, R.names[r].c_str());
  }
}

/// Every variant (public entry point, one CTA per row, a cluster per row) against the reference.
void check_against_reference(const Rows& R, const char* what_base) {
  for (int cluster : {0, 1, step5::kernels::sm90::kTopkCluster}) {
    const std::string what = std::string(what_base) + " [cluster " + std::to_string(cluster) + "]";
    expect_reference(R, run_gpu(R, cluster), what.c_str());
  }
}

const Pattern kAll[] = {Pattern::kRandom,      Pattern::kAllEqual,  Pattern::kInf,         Pattern::kNaN,
                        Pattern::kZeroPlateau, Pattern::kNearEqual, Pattern::kFewDistinct, Pattern::kNegative,
                        Pattern::kDigitEdges};
constexpr int kNumPatterns = static_cast<int>(std::size(kAll));

}  // namespace

GPU_CASE("topk: edge histories (0 .. 7 positions, history == topk, topk +- 1), every pattern, several topk") {
  std::mt19937 rng(1);
  for (int topk : {1, 2, 7, 64, 512, 1024}) {
    Rows R;
    R.topk = topk;
    R.ld = 2048;
    for (Pattern p : kAll)
      for (int n : {0, 1, topk - 1, topk, topk + 1, 2 * topk + 3, 2000})
        if (n >= 0 && n <= R.ld) R.add(n, p, rng);
    check_against_reference(R, ("edges topk " + std::to_string(topk)).c_str());
  }
}

GPU_CASE("topk: 16384-region rows (shared-memory variant), every pattern") {
  std::mt19937 rng(2);
  Rows R;
  R.topk = 512;
  R.ld = 16384;
  if (step5_test::quick()) {
    R.add(16384, Pattern::kZeroPlateau, rng);
    for (Pattern p : kAll)
      for (int n : {9999, 513}) R.add(n, p, rng);
  } else {
    for (Pattern p : kAll)
      for (int n : {16384, 9999, 513}) R.add(n, p, rng);
  }
  check_against_reference(R, "16K rows");
}

GPU_CASE("topk: 131072-region rows (1M tokens; one CTA from global memory, or a cluster; quick: 50000) mixed with short rows") {
  std::mt19937 rng(3);
  Rows R;
  R.topk = 1024;
  // quick: 50000 > kTopkSmemKeys = 49152 regions keeps the global-memory variant
  R.ld = step5_test::quick() ? 50000 : 131072;
  for (Pattern p : kAll) R.add(R.ld, p, rng);
  R.add(0, Pattern::kRandom, rng);
  R.add(1025, Pattern::kZeroPlateau, rng);
  R.add(step5_test::quick() ? 33333 : 77777, Pattern::kNearEqual, rng);
  check_against_reference(R, step5_test::quick() ? "50000 rows" : "131072 rows");
}

GPU_CASE("topk: rows longer than kTopkCluster * kTopkSmemKeys (cluster variant from global memory)") {
  std::mt19937 rng(5);
  Rows R;
  R.topk = 1024;
  R.ld = step5::kernels::sm90::kTopkCluster * step5::kernels::sm90::kTopkSmemKeys + 1000;
  R.add(R.ld, Pattern::kZeroPlateau, rng);
  R.add(R.ld - 999, Pattern::kNearEqual, rng);
  if (!step5_test::quick()) {
    R.add(R.ld, Pattern::kRandom, rng);
    R.add(1025, Pattern::kNaN, rng);
  }
  check_against_reference(R, "global-memory cluster rows");
}

GPU_CASE("topk: batches of 33, 257 and 1024 decode rows (quick: 33, 257), mixed histories, some empty") {
  // one row per request as in a decode step: histories 0 (an empty request), short (<= topk, the
  // whole history selected), around topk and long (a strict subset); every pattern cycles through
  std::mt19937 rng(6);
  std::vector<int> batches = {33, 257};
  if (!step5_test::quick()) batches.push_back(1024);
  for (int rows : batches) {
    Rows R;
    R.topk = 512;
    R.ld = 8192;
    std::uniform_int_distribution<int> longer(R.topk + 1, R.ld), shorter(1, R.topk);
    for (int r = 0; r < rows; ++r) {
      const int kind = r % 5;
      const int n = kind == 0 ? 0 : kind == 1 ? shorter(rng) : kind == 2 ? R.topk + (r % 3) - 1 : longer(rng);
      R.add(n, kAll[(r / 5) % kNumPatterns], rng);
    }
    check_against_reference(R, ("batch of " + std::to_string(rows) + " rows").c_str());
  }
}

GPU_CASE("topk: decode-shaped rows of 16384 regions (128K tokens), 1, 16, 64 and 257 rows (quick: 1, 16), every variant") {
  // the row counts of decode batches 1-64 at tp 8 (one group) and 257: the launcher's choice moves
  // from a cluster per row (few rows) to one CTA per row; histories full, odd (16383, 12345), just
  // above and below topk, and 0; every pattern cycles through
  std::mt19937 rng(7);
  std::vector<int> counts = {1, 16};
  if (!step5_test::quick()) counts.insert(counts.end(), {64, 257});
  for (int rows : counts) {
    Rows R;
    R.topk = 512;
    R.ld = 16384;
    const int hist[] = {16384, 16383, 12345, 513, 511, 0};
    for (int r = 0; r < rows; ++r)
      R.add(rows == 1 ? 16384 : hist[r % 6], kAll[(r + rows) % kNumPatterns], rng);
    check_against_reference(R, ("decode rows x" + std::to_string(rows)).c_str());
  }
}

GPU_CASE("topk: bit-identical over 100 launches (quick: 5) with other kernels running, every variant") {
  std::mt19937 rng(4);
  Rows R;
  R.topk = 512;
  R.ld = 16384;
  for (Pattern p : kAll) R.add(16384, p, rng);
  for (int cluster : {0, 1, step5::kernels::sm90::kTopkCluster}) {
    bool identical = false;
    const GpuResult g = run_gpu(R, cluster, step5_test::quick() ? 5 : 100, &identical, true);
    EXPECT(identical, "selection (cluster %d) changed between repeated launches", cluster);
    // and the repeated result is the reference's
    expect_reference(R, g, ("repeat batch [cluster " + std::to_string(cluster) + "]").c_str());
  }
}

GPU_CASE("topk: invalid arguments are refused with a message") {
  step5::ops::TopkSelectParams p;
  p.topk = 0;
  p.rows = 1;
  step5::Status s = step5::ops::topk_select(p, nullptr);
  EXPECT(!s.ok() && s.message().find("topk = 0") != std::string::npos, "topk 0: %s", s.to_string().c_str());
  p.topk = 1025;
  const step5::Status s1025 = step5::ops::topk_select(p, nullptr);
  EXPECT(!s1025.ok() && s1025.message().find("1025") != std::string::npos, "topk 1025: %s", s1025.to_string().c_str());
}

STEP5_GPU_TEST_MAIN()
