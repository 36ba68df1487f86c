// GPU test of the deterministic top-k selection (SPEC.md §4.6): step5::ops::topk_select fed the
// same fp32 scores as the CPU reference (step5/reference/select.hpp); rows and counts must be equal
// exactly, on hard patterns (plateaus, ±inf, NaN, −0, near-equal values, keys on both sides of the
// radix digit boundaries, a crowded threshold bin), every kernel variant (one warp per row, one CTA
// per row and a cluster of kTopkCluster CTAs per row, each with keys staged in shared memory or
// re-read from global memory; 131072-region rows) and both algorithms (TopkAlgo::kRadix and kCandidates, whose
// outputs must also be bit-identical to each other; candidate buffers exactly full and one key too
// small, which falls back to the full radix passes), at engine batch sizes (33, 257 and 1024 decode rows of mixed histories, some empty; 1, 16,
// 64 and 257 rows of 16384 regions; prefill-shaped rows n = position / 8 at ld 1023 (rows not
// 16-byte aligned), 2048, 4096 and 8192 on every threads-per-row size), and bit-identical over 100
// launches while a memory-streaming kernel is launched on another stream each time (no assertion
// depends on whether the two overlap; also the warp rows' and the 128- / 256-thread radix select
// on prefill rows up to ld kTopkWarpMaxLd / 4096 / 8192). STEP5_TOPK's parsing and
// refusal of a bad value are checked too.
// Quick (sanitizer) mode, step5_test::quick(): the edge cases unchanged; the shared-memory case
// with one 16384-region row plus every pattern at 9999 and 513; the long-row case on 50000-region
// rows instead of 131072 (above kTopkSmemKeys = 49152 of kernels/sm90/indexer_topk.cuh, so the
// forced one-CTA run still re-reads keys from global memory, and the launcher's own choice is a
// cluster); the batch case at 33 and 257 rows (not 1024); the 16384-region decode rows at 1 and 16
// rows; the prefill-shaped case at 160 rows per ld (not 1200); 5 repeated launches instead of 100.
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/kernels/sm90/indexer_args.cuh"
#include "step5/ops/indexer.hpp"
#include "step5/ops/pdl.hpp"
#include "step5/reference/select.hpp"

namespace {

enum class Pattern {
  kRandom, kAllEqual, kInf, kNaN, kZeroPlateau, kNearEqual, kFewDistinct, kNegative, kDigitEdges, kCrowdedBin
};
using step5::kernels::sm90::TopkAlgo;
using step5::kernels::sm90::kTopkCluster;
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
    case Pattern::kCrowdedBin: return "crowded-bin";
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
    case Pattern::kCrowdedBin:
      // about n/3 distinct-ish scores in one first-digit bin of the candidate compaction ([1.5, 1.75):
      // a quarter binade, kTopkFirstBits = 11) straddling the k-th place, topk/2 above it, the rest
      // below: many candidates (16384 regions: ~5500 <= kTopkCandKeys; 131072: more, the fallback)
      for (int i = 0; i < n; ++i) {
        const int u = ui(rng) % n;
        if (u < topk / 2) s[i] = 4.0f + std::abs(s[i]);
        else if (u < topk / 2 + n / 3) s[i] = 1.5f + 0.2499f * static_cast<float>(ui(rng)) / static_cast<float>(1 << 20);
        else s[i] = -std::abs(s[i]);
      }
      break;
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
  /// A row of n scores filled by the caller (the returned pointer; every slot starts at 0).
  float* add_row(int n, const std::string& name) {
    const std::size_t r = history.size();
    scores.resize((r + 1) * static_cast<std::size_t>(ld), 0.f);
    history.push_back(n);
    names.push_back(name + " n=" + std::to_string(n));
    return scores.data() + r * ld;
  }
  int rows() const { return static_cast<int>(history.size()); }
};

struct GpuResult {
  std::vector<std::int32_t> ids, counts;
};

/// How a selection is launched: the public entry point (step5::ops::topk_select: the launcher's choice
/// of kernel variant, STEP5_TOPK's algorithm), or kernels::sm90::launch_topk with `cluster` (0: its
/// choice; 1 or kTopkCluster forced), `algo`, `cand_cap` (-1: as many candidates as fit) and
/// `threads` per row (0: the launcher's choice; 32: one warp per row; 128 / 256: the short-row CTA
/// sizes, one CTA per row).
struct Variant {
  bool entry = false;
  int cluster = 0;
  TopkAlgo algo = TopkAlgo::kDefault;
  int cand_cap = -1;
  int threads = 0;
  std::string name() const {
    if (entry) return "topk_select";
    return std::string(algo == TopkAlgo::kRadix ? "radix" : algo == TopkAlgo::kCandidates ? "candidates" : "default") +
           " cluster " + std::to_string(cluster) + (cand_cap >= 0 ? " cap " + std::to_string(cand_cap) : "") +
           (threads != 0 ? " threads " + std::to_string(threads) : "");
  }
};
/// The threads per row forced on one-row launches besides the launcher's choice: every size the
/// selection is built for (kernels/sm90/indexer_topk.cuh, kTopkCtaSizes: one warp per row, and
/// one CTA per row of 128, 256 and 512 threads).
constexpr auto& kForcedThreads = step5::kernels::sm90::kTopkCtaSizes;
const Variant kEntry{true};

/// The selection of every row with variant `v`. With `noise`, every launch runs on a non-blocking
/// stream while noise_kernel (a different grid size each time) runs on another.
GpuResult run_gpu(const Rows& R, const Variant& v, int repeats = 1, bool* identical = nullptr, bool noise = false) {
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
      if (v.entry) return step5::ops::topk_select(p, s_sel);
      return step5::kernels::sm90::launch_topk(step5::ops::detail::topk_args(p), rows, s_sel, v.cluster, v.algo,
                                               v.cand_cap, v.threads);
    };
    const step5::Status st = launch();
    EXPECT(st.ok(), "topk_select (%s): %s", v.name().c_str(), st.to_string().c_str());
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

/// `b` (variant vb) equals `a` (variant va) bit for bit: every id and count.
void expect_identical(const Rows& R, const GpuResult& a, const GpuResult& b, const std::string& what) {
  const int w = R.topk + 1;
  int bad = 0;
  for (int r = 0; r < R.rows(); ++r) {
    const bool same = a.counts[r] == b.counts[r] &&
                      std::equal(a.ids.begin() + static_cast<std::ptrdiff_t>(r) * w,
                                 a.ids.begin() + static_cast<std::ptrdiff_t>(r + 1) * w,
                                 b.ids.begin() + static_cast<std::ptrdiff_t>(r) * w);
    if (!same && bad++ < 5) std::fprintf(stderr, "  %s row %d (%s) differs\n", what.c_str(), r, R.names[r].c_str());
    EXPECT(same, "%s: row %d (%s) not bit-identical", what.c_str(), r, R.names[r].c_str());
  }
}

/// Every variant (public entry point; one CTA per row, a cluster per row and the launcher's choice,
/// each with both algorithms; one row per warp or CTA also with every size forced) against the
/// reference, and every variant bit-identical to the radix select of the launcher's choice. With
/// `expected`, the selections of `R` must be those of the reference on `expected`'s rows (the same
/// scores; e.g. histories outside [0, ld] in `R`, cut to ld in `expected`).
void check_against_reference(const Rows& R, const char* what_base, const Rows* expected = nullptr) {
  const Rows& E = expected != nullptr ? *expected : R;
  expect_reference(E, run_gpu(R, kEntry), (std::string(what_base) + " [topk_select]").c_str());
  GpuResult base;
  bool have_base = false;
  std::vector<Variant> variants;
  for (int cluster : {0, 1, kTopkCluster}) {
    variants.push_back(Variant{false, cluster, TopkAlgo::kRadix});
    variants.push_back(Variant{false, cluster, TopkAlgo::kCandidates});
  }
  for (int threads : kForcedThreads) {
    variants.push_back(Variant{false, 1, TopkAlgo::kRadix, -1, threads});
    // the warp rows run the radix select only (launch_topk refuses candidates there: its own case)
    if (threads != step5::kernels::sm90::kTopkWarpThreads)
      variants.push_back(Variant{false, 1, TopkAlgo::kCandidates, -1, threads});
  }
  for (const Variant& v : variants) {
    const GpuResult g = run_gpu(R, v);
    expect_reference(E, g, (std::string(what_base) + " [" + v.name() + "]").c_str());
    if (!have_base) {
      base = g;  // radix, the launcher's choice
      have_base = true;
    } else {
      expect_identical(R, base, g, std::string(what_base) + " [" + v.name() + " vs " + variants[0].name() + "]");
    }
  }
}

const Pattern kAll[] = {Pattern::kRandom,      Pattern::kAllEqual,  Pattern::kInf,         Pattern::kNaN,
                        Pattern::kZeroPlateau, Pattern::kNearEqual, Pattern::kFewDistinct, Pattern::kNegative,
                        Pattern::kDigitEdges,  Pattern::kCrowdedBin};
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

GPU_CASE("topk: raw-mode histories outside [0, ld] (negative, ld + 1, INT_MAX) are cut to ld: nothing read past a row") {
  // TopkSelectParams::history: a value outside [0, ld] selects from the row's ld scores (as an
  // unsigned value, so a negative one too). Uncut, ld + 1 would read the next row's first score
  // (rows are contiguous) and end the ids row with ld + 1 instead of ld (the reference's entry
  // after the k ids), a negative value would write before its ids row, and INT_MAX would run
  // past the staged keys and the scores; each row is compared with the reference on ld
  std::mt19937 rng(11);
  for (const int ld : {2048, 16384}) {
    Rows good;
    good.topk = 512;
    good.ld = ld;
    for (Pattern p : {Pattern::kRandom, Pattern::kNegative, Pattern::kCrowdedBin})
      for (int i = 0; i < 4; ++i) good.add(ld, p, rng);
    Rows bad = good;
    const std::int32_t outside[] = {-1, -100000, ld + 1, std::numeric_limits<std::int32_t>::max()};
    for (int r = 0; r < bad.rows(); ++r) bad.history[static_cast<std::size_t>(r)] = outside[r % 4];
    check_against_reference(bad, ("histories outside [0, ld], ld " + std::to_string(ld)).c_str(), &good);
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

GPU_CASE("topk: rows that end their shared-memory staging (n = ld, ld % 4 = 1, 2, 3), every variant, every pattern") {
  // the last partial four keys of such a row are the staging's last: a 16-byte load of them reads
  // past the row's n into the staging's padding (topk_slice_keys), never past it. Keys past n are
  // not counted, so a plain run cannot see a read past the staging; compute-sanitizer memcheck
  // can (tools/device_run.sh sanitize): radix_refine's staged sweep once read 8 bytes past a
  // 12345-key row's staging there, on 512 threads. ld 2001 also ends the 128-thread compaction's
  // last 8-key tile one key in (the staging is padded to 8 keys for it).
  std::mt19937 rng(21);
  for (int ld : {2001, 2002, 2003, 12345}) {
    Rows R;
    R.topk = 512;
    R.ld = ld;
    for (Pattern p : kAll) R.add(ld, p, rng);
    check_against_reference(R, ("n = ld = " + std::to_string(ld)).c_str());
  }
}

GPU_CASE("topk: staged rows past the owner masks' 16384 keys (ld 40000) next to rows within them, every pattern") {
  // One CTA per row of 512 threads with candidates stages rows of up to kTopkSmemKeys keys; in a
  // launch of at most one row per SM it takes the owner masks (topk_owner_masks_pay) on rows of at
  // most kTopkOwnerMaxWords * 32 * 512 = 16384 keys and the ballot gather / compaction on longer
  // ones (the same instance). ld 40000 leaves room for the candidate buffer (launch_topk).
  namespace k = step5::kernels::sm90;
  static_assert(k::kTopkOwnerMaxWords * 32 * k::kTopkThreads == 16384 && 40000 <= k::kTopkSmemKeys,
                "the rows below straddle the owner masks' reach and stay staged");
  std::mt19937 rng(12);
  Rows R;
  R.topk = 512;
  R.ld = 40000;
  const int lens[] = {40000, 20001, 16385, 16384, 12345};
  for (Pattern p : kAll)
    for (int n : lens)
      if (!step5_test::quick() || p == Pattern::kRandom || p == Pattern::kCrowdedBin || n == 20001 || n == 16384)
        R.add(n, p, rng);
  EXPECT(R.rows() <= 132, "at most one row per SM on an H100 / H200 (%d rows): the owner masks' launches", R.rows());
  check_against_reference(R, "ld 40000 rows");
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

GPU_CASE("topk: ties across cluster ranks and compaction rounds, lower ranks filling k, the last taken tie ending a rank (staged slices of 1-3 rounds, and from global memory)") {
  // A cluster rank's compaction starts from the lower ranks' counts (keys above K*, keys equal to
  // it) and runs rounds of 16384 keys (512 threads): rows built so that the taken ties straddle a
  // rank boundary (some of them in lower ranks, 0 < lower ties < need), straddle a round boundary
  // inside rank 3, end exactly at the last key of rank 1 (the lower ties == need), or lie in ranks
  // 0-1 only (the higher ranks place nothing); rank slices of 16384 / 8 keys (one round), 8 ·
  // kTopkSmemKeys / 8 (staged, three rounds) and longer (from global memory). Every variant against
  // the reference and bit-identical to each other (check_against_reference).
  namespace k = step5::kernels::sm90;
  std::mt19937 rng(11);
  std::vector<int> lds = {16384, 8 * k::kTopkSmemKeys};
  if (!step5_test::quick()) lds.push_back(8 * k::kTopkSmemKeys + 1000);
  for (int ld : lds)
    for (int topk : {512, 1024}) {
      Rows R;
      R.topk = topk;
      R.ld = ld;
      for (int n : {ld, ld - 5}) {
        const int S = (n + k::kTopkCluster - 1) / k::kTopkCluster;  // a rank's slice (launch_topk's split)
        std::uniform_int_distribution<int> anywhere(0, n - 1);
        // greater keys (distinct) at random places outside [lo, hi), ties 1.0 on [lo, hi), -1 elsewhere
        const auto plateau = [&](const std::string& name, int lo, int hi, int greater) {
          float* r = R.add_row(n, name);
          for (int i = 0; i < n; ++i) r[i] = i >= lo && i < hi ? 1.f : -1.f;
          for (int placed = 0; placed < greater;) {
            const int i = anywhere(rng);
            if (r[i] < 0.f) r[i] = 2.f + 1e-3f * static_cast<float>(placed++);
          }
        };
        // the first half of the need = topk - greater taken ties below the boundary, the rest above
        for (int c : {1, 5}) {
          const int need = topk - topk / 3;
          plateau("ties across rank " + std::to_string(c), c * S - need / 2, c * S - need / 2 + 2 * topk, topk / 3);
        }
        {
          const int need = topk - topk / 4;
          const int round = std::min(n - topk, 3 * S + 16384);  // a round boundary inside rank 3 (when S > 16384)
          plateau("ties across a round of rank 3", round - need / 2, round - need / 2 + 2 * topk, topk / 4);
        }
        {  // the taken ties are the last need keys below rank 2's first id; rank 2 has untaken ties
          const int need = topk - topk / 2;
          plateau("last taken tie ends rank 1", 2 * S - need, 2 * S + 50, topk / 2);
        }
        {  // k distinct keys in ranks 0-1, zeros elsewhere: the higher ranks start with k placed
          float* r = R.add_row(n, "lower ranks fill k");
          for (int j = 0; j < topk; ++j) r[static_cast<std::int64_t>(j) * 2 * S / topk] = 1.f + static_cast<float>(j);
        }
      }
      R.add(ld, Pattern::kAllEqual, rng);
      R.add(ld, Pattern::kFewDistinct, rng);
      R.add(ld, Pattern::kCrowdedBin, rng);
      const std::string what = "rank/round boundaries ld " + std::to_string(ld) + " topk " + std::to_string(topk);
      check_against_reference(R, what.c_str());
    }
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

GPU_CASE("topk: prefill-shaped rows (n = position / 8 up to ld 8192) on every threads-per-row size, every pattern") {
  // rows as indexer_select lays out a prefill chunk without history: token t's rows have
  // n = t / 8 regions, so a quarter of them (n <= topk) select everything; ld 1023 (odd: rows
  // that are not 16-byte aligned take the warp rows' scalar loads), 2048 (16K tokens), 4096 (the
  // short-row bounds kTopkWarpMaxLd and kTopkShortMaxLd when they are 4096) and 8192
  // (kTopkMidMaxLd, the longest rows of the 256-thread CTAs), every pattern cycling through
  std::mt19937 rng(10);
  for (int ld : {1023, 2048, 4096, 8192}) {
    Rows R;
    R.topk = 512;
    R.ld = ld;
    const int rows = step5_test::quick() ? 160 : 1200;
    for (int r = 0; r < rows; ++r) {
      const int n = static_cast<int>(static_cast<long long>(r) * (ld + 1) / rows);  // 0 .. ld
      R.add(n, kAll[r % kNumPatterns], rng);
    }
    check_against_reference(R, ("prefill rows ld " + std::to_string(ld)).c_str());
  }
}

GPU_CASE("topk: the launcher's own choice takes the warp rows from kTopkWarpMinRowsPerSm rows per SM (prefill-shaped rows of ld 1024 through topk_select)") {
  // the prefill-shaped case above has too few rows for the automatic warp rows (it forces them);
  // here the public entry point gets exactly the rule's bound of rows, so its own choice is one
  // warp per row (the kernel a captured launch names: the warp rows at the bound, the one-CTA
  // kernel one row below it), against the reference and bit-identical to the forced 128-thread CTAs
  namespace k = step5::kernels::sm90;
  int dev = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  constexpr int ld = 1024;
  const int rows = k::kTopkWarpMinRowsPerSm * sms;
  EXPECT(k::topk_cta_threads(1, ld, TopkAlgo::kRadix, rows, sms) == k::kTopkWarpThreads &&
             k::topk_cta_threads(1, ld, TopkAlgo::kRadix, rows - 1, sms) == k::kTopkShortThreads,
         "topk_cta_threads at %d / %d rows on %d SMs: %d / %d", rows, rows - 1, sms,
         k::topk_cta_threads(1, ld, TopkAlgo::kRadix, rows, sms), k::topk_cta_threads(1, ld, TopkAlgo::kRadix, rows - 1, sms));
  std::mt19937 rng(12);
  Rows R;
  R.topk = 512;
  R.ld = ld;
  for (int r = 0; r < rows; ++r) R.add(static_cast<int>(static_cast<long long>(r) * (ld + 1) / rows), kAll[r % kNumPatterns], rng);
  {
    // which kernel topk_select launches for `n` rows: the name of the one kernel node of a capture
    step5_test::DevBuf<float> d_s(R.scores);
    step5_test::DevBuf<std::int32_t> d_h(R.history);
    step5_test::DevBuf<std::int32_t> d_ids(static_cast<std::size_t>(rows) * (R.topk + 1));
    step5_test::DevBuf<std::int32_t> d_cnt(static_cast<std::size_t>(rows));
    cudaStream_t stream;
    GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const auto launched = [&](int n) -> std::string {
      step5::ops::TopkSelectParams p;
      p.scores = d_s.p, p.ld = ld, p.history = d_h.p, p.rows = n, p.topk = R.topk, p.ids = d_ids.p;
      p.ld_ids = R.topk + 1, p.counts = d_cnt.p;
      cudaGraph_t g = nullptr;
      GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const step5::Status st = step5::ops::topk_select(p, stream);
      GPU_CHECK(cudaStreamEndCapture(stream, &g));
      EXPECT(st.ok(), "topk_select of %d rows: %s", n, st.to_string().c_str());
      std::size_t nodes = 0;
      GPU_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
      std::vector<cudaGraphNode_t> node(nodes);
      if (nodes > 0) GPU_CHECK(cudaGraphGetNodes(g, node.data(), &nodes));
      std::string name = "(no kernel node)";
      for (cudaGraphNode_t nd : node)
        if (const std::string fn = step5_test::kernel_node_name(nd); !fn.empty()) name = fn;
      GPU_CHECK(cudaGraphDestroy(g));
      return name;
    };
    const std::string at = launched(rows), below = launched(rows - 1);
    EXPECT(at.find("topk_warp_rows_kernel") != std::string::npos && below.find("topk_select_kernel") != std::string::npos,
           "topk_select of %d rows launched %s, of %d rows %s (expected the warp rows, then the one-CTA kernel)", rows,
           at.c_str(), rows - 1, below.c_str());
    GPU_CHECK(cudaStreamDestroy(stream));
  }
  const GpuResult g = run_gpu(R, kEntry);
  expect_reference(R, g, "warp rows by the launcher's choice [topk_select]");
  expect_identical(R, g, run_gpu(R, Variant{false, 1, TopkAlgo::kRadix, -1, k::kTopkShortThreads}),
                   "warp rows by the launcher's choice vs 128-thread CTAs");
}

HOST_CASE("topk: the threads-per-row rule (warp rows, short-row CTA sizes, 512, clusters)") {
  // short rows on one CTA per row get the warp rows (radix, from kTopkWarpMinRowsPerSm rows per SM)
  // or the short-row CTA sizes, long rows and clusters 512; on 132 SMs with many rows (`many`)
  namespace k = step5::kernels::sm90;
  static_assert(k::kTopkWarpMaxLd <= k::kTopkShortMaxLd, "the cases below assume the warp rows' bound first");
  constexpr int sms = 132;
  constexpr long long many = 1LL << 20, bound = static_cast<long long>(sms) * k::kTopkWarpMinRowsPerSm;
  const auto t = [&](int cluster, std::int64_t ld, long long rows, TopkAlgo algo = TopkAlgo::kRadix) {
    return k::topk_cta_threads(cluster, ld, algo, rows, sms);
  };
  EXPECT(t(1, 2048, many) == k::kTopkWarpThreads && t(1, k::kTopkWarpMaxLd, many) == k::kTopkWarpThreads &&
             t(1, k::kTopkWarpMaxLd, many, TopkAlgo::kCandidates) == k::kTopkShortThreads &&
             t(1, 2048, bound) == k::kTopkWarpThreads && t(1, 2048, bound - 1) == k::kTopkShortThreads &&
             t(1, k::kTopkWarpMaxLd + 1, many) ==
                 (k::kTopkWarpMaxLd < k::kTopkShortMaxLd ? k::kTopkShortThreads : k::kTopkMidThreads) &&
             t(1, k::kTopkShortMaxLd + 1, many) == k::kTopkMidThreads && t(1, k::kTopkMidMaxLd, many) == k::kTopkMidThreads &&
             t(1, k::kTopkMidMaxLd + 1, many) == k::kTopkThreads && t(kTopkCluster, 2048, many) == k::kTopkThreads,
         "topk_cta_threads (132 SMs): ld 2048 %d, at the row bound %d, one row below %d, ld %lld %d, ld %lld %d, "
         "cluster %d",
         t(1, 2048, many), t(1, 2048, bound), t(1, 2048, bound - 1), static_cast<long long>(k::kTopkShortMaxLd + 1),
         t(1, k::kTopkShortMaxLd + 1, many), static_cast<long long>(k::kTopkMidMaxLd + 1), t(1, k::kTopkMidMaxLd + 1, many),
         t(kTopkCluster, 2048, many));
}

GPU_CASE("topk: bit-identical over 100 launches (quick: 5) with other kernels running, every variant") {
  std::mt19937 rng(4);
  Rows R;
  R.topk = 512;
  R.ld = 16384;
  for (Pattern p : kAll) R.add(16384, p, rng);
  for (const Variant& v : {kEntry, Variant{false, 1, TopkAlgo::kRadix}, Variant{false, kTopkCluster, TopkAlgo::kRadix},
                           Variant{false, 1, TopkAlgo::kCandidates}, Variant{false, kTopkCluster, TopkAlgo::kCandidates},
                           Variant{false, 1, TopkAlgo::kRadix, -1, 32},
                           Variant{false, 1, TopkAlgo::kRadix, -1, 128}, Variant{false, 1, TopkAlgo::kCandidates, -1, 128},
                           Variant{false, 1, TopkAlgo::kRadix, -1, 256}, Variant{false, 1, TopkAlgo::kCandidates, -1, 256}}) {
    bool identical = false;
    const GpuResult g = run_gpu(R, v, step5_test::quick() ? 5 : 100, &identical, true);
    EXPECT(identical, "selection (%s) changed between repeated launches", v.name().c_str());
    // and the repeated result is the reference's
    expect_reference(R, g, ("repeat batch [" + v.name() + "]").c_str());
  }
  // the short-row sizes' radix select on prefill-shaped rows up to their longest rows: the warp
  // rows up to kTopkWarpMaxLd, 128 threads up to ld 4096 (kTopkShortMaxLd), 256 threads up to ld
  // 8192 (kTopkMidMaxLd)
  namespace k = step5::kernels::sm90;
  for (const auto& [threads, ld] : {std::pair<int, std::int64_t>{k::kTopkWarpThreads, k::kTopkWarpMaxLd},
                                    std::pair<int, std::int64_t>{k::kTopkShortThreads, k::kTopkShortMaxLd},
                                    std::pair<int, std::int64_t>{k::kTopkMidThreads, k::kTopkMidMaxLd}}) {
    Rows P;
    P.topk = 512;
    P.ld = static_cast<int>(ld);
    for (int r = 0; r < 64; ++r) P.add(static_cast<int>(static_cast<long long>(r + 1) * P.ld / 64), kAll[r % kNumPatterns], rng);
    const Variant v{false, 1, TopkAlgo::kRadix, -1, threads};
    bool identical = false;
    const GpuResult g = run_gpu(P, v, step5_test::quick() ? 5 : 100, &identical, true);
    EXPECT(identical, "selection (%s, ld %d) changed between repeated launches", v.name().c_str(), P.ld);
    expect_reference(P, g, ("repeat prefill rows [" + v.name() + "]").c_str());
  }
}

/// Candidate compaction of a row (kernels/sm90/indexer_topk.cuh): the number of keys in the
/// threshold bin of the first digit (the top kTopkFirstBits bits of score_key), or -1 when that bin
/// needs no candidates (k == n, or every key of the bin is taken).
int candidate_count(const float* s, int n, int topk) {
  const int k = std::min(n, topk);
  if (k == n) return -1;
  constexpr int kShift = 32 - step5::kernels::sm90::kTopkFirstBits;
  std::vector<std::uint32_t> keys(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) keys[i] = step5::kernels::sm90::score_key(s[i]);
  std::vector<std::uint32_t> sorted(keys);
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
  const std::uint32_t bin = sorted[k - 1] >> kShift;
  int above = 0, cnt = 0;
  for (std::uint32_t key : keys) {
    above += (key >> kShift) > bin;
    cnt += (key >> kShift) == bin;
  }
  return cnt == k - above ? -1 : cnt;
}

GPU_CASE("topk: candidate compaction bit-identical to the radix select with the candidate buffer exactly full and one key short") {
  // one row per launch (the cap is per launch): cap = the row's candidate count takes the candidate
  // path with a full buffer; cap = count - 1 and cap = 0 fall back to the full radix passes; each
  // against the radix select (bit for bit) and the reference, one CTA per row and a cluster per row
  std::mt19937 rng(8);
  std::vector<int> sizes = {16384, 2000, 12345};
  if (step5_test::quick()) sizes = {2000, 12345};
  int candidate_rows = 0;
  for (Pattern p : kAll)
    for (int n : sizes) {
      Rows R;
      R.topk = 512;
      R.ld = n;
      R.add(n, p, rng);
      const int cnt = candidate_count(R.scores.data(), n, R.topk);
      if (cnt < 0) continue;  // the first digit settles the row: no candidates to gather
      ++candidate_rows;
      // (cluster, threads): one CTA per row (the launcher's CTA size, then 128 and 256 forced), a cluster
      const std::pair<int, int> shapes[] = {{1, 0}, {kTopkCluster, 0}, {1, 128}, {1, 256}};
      for (const auto& [cluster, threads] : shapes) {
        const GpuResult radix = run_gpu(R, Variant{false, cluster, TopkAlgo::kRadix, -1, threads});
        expect_reference(R, radix, ("cap test radix cluster " + std::to_string(cluster) + " threads " +
                                    std::to_string(threads)).c_str());
        for (int cap : {cnt, cnt - 1, 0}) {
          const Variant v{false, cluster, TopkAlgo::kCandidates, cap, threads};
          const std::string what = R.names[0] + " (" + std::to_string(cnt) + " candidates) [" + v.name() + "]";
          const GpuResult cand = run_gpu(R, v);
          expect_reference(R, cand, what.c_str());
          expect_identical(R, radix, cand, what + " vs radix");
        }
      }
    }
  // random, crowded-bin, all-equal, ... rows at these sizes do gather candidates
  EXPECT(candidate_rows >= 10, "only %d rows exercised the candidate path", candidate_rows);
}

GPU_CASE("topk: STEP5_TOPK selects the algorithm; a bad value is refused naming it") {
  using step5::kernels::sm90::topk_algo_from_env;
  TopkAlgo a = TopkAlgo::kDefault;
  EXPECT(topk_algo_from_env(nullptr, &a).ok() && a == TopkAlgo::kDefault, "unset");
  using step5::kernels::sm90::kTopkCandMinKeys;
  EXPECT(step5::kernels::sm90::topk_default_algo(1, kTopkCandMinKeys) == TopkAlgo::kCandidates &&
             step5::kernels::sm90::topk_default_algo(1, kTopkCandMinKeys - 1) == TopkAlgo::kRadix &&
             step5::kernels::sm90::topk_default_algo(step5::kernels::sm90::kTopkCluster, kTopkCandMinKeys) == TopkAlgo::kRadix,
         "the measured default per variant");
  // one-CTA candidate rows of 512 threads take the owner masks at most one row per SM (in
  // check_against_reference, the forced one-CTA candidate variant: e.g. the decode-shaped case's 1
  // and 16 rows, the 33-row batch, the ld 40000 case's rows of <= 16384 keys; the 257-row batch and
  // the prefill-shaped rows take the ballot path)
  EXPECT(step5::kernels::sm90::topk_owner_masks_pay(132, 132) && !step5::kernels::sm90::topk_owner_masks_pay(133, 132) &&
             step5::kernels::sm90::topk_owner_masks_pay(1, 132),
         "the owner-mask rule");
  EXPECT(topk_algo_from_env("", &a).ok() && a == TopkAlgo::kDefault, "empty");
  EXPECT(topk_algo_from_env("radix", &a).ok() && a == TopkAlgo::kRadix, "radix");
  EXPECT(topk_algo_from_env("candidates", &a).ok() && a == TopkAlgo::kCandidates, "candidates");
  const step5::Status bad = topk_algo_from_env("fast", &a);
  EXPECT(bad.code() == step5::StatusCode::kInvalidArgument && bad.message().find("'fast'") != std::string::npos,
         "STEP5_TOPK=fast: %s", bad.to_string().c_str());
  // through the public entry point: refused before anything is launched; then restored
  std::mt19937 rng(9);
  Rows R;
  R.topk = 64;
  R.ld = 1000;
  R.add(1000, Pattern::kRandom, rng);
  const char* old = std::getenv("STEP5_TOPK");
  const std::string saved = old != nullptr ? old : "";
  setenv("STEP5_TOPK", "fast", 1);
  step5::ops::TopkSelectParams p;
  p.scores = reinterpret_cast<const float*>(16);  // never read: the launch is refused first
  p.ld = R.ld;
  p.history = reinterpret_cast<const std::int32_t*>(16);
  p.rows = 1;
  p.topk = R.topk;
  p.ids = reinterpret_cast<std::int32_t*>(16);
  p.ld_ids = R.topk + 1;
  p.counts = reinterpret_cast<std::int32_t*>(16);
  const step5::Status s = step5::ops::topk_select(p, nullptr);
  EXPECT(!s.ok() && s.message().find("STEP5_TOPK = 'fast'") != std::string::npos, "topk_select with STEP5_TOPK=fast: %s",
         s.to_string().c_str());
  for (const char* v : {"radix", "candidates"}) {
    setenv("STEP5_TOPK", v, 1);
    expect_reference(R, run_gpu(R, kEntry), (std::string("STEP5_TOPK=") + v).c_str());
  }
  if (old != nullptr) setenv("STEP5_TOPK", saved.c_str(), 1);
  else unsetenv("STEP5_TOPK");
}

GPU_CASE("topk: PDL as ops::topk_launch_uses_pdl says, in a captured graph (few 512-thread one-CTA rows without)") {
  // Two selection launches captured back to back: the edge into the second is programmatic exactly
  // when that launch takes PDL. Each graph is also run once (zero scores: every key ties).
  int dev = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  constexpr int ld = 16384;
  static_assert(step5::kernels::sm90::topk_cta_threads(1, ld, TopkAlgo::kRadix, 1LL << 20, 132) ==
                    step5::kernels::sm90::kTopkThreads,
                "rows of 16384 keys run 512-thread CTAs (the cases below rely on it)");
  const int topk = 512, max_rows = sms + 1, few = std::min(64, sms);  // few: at most one row per SM
  step5_test::DevBuf<float> scores(static_cast<std::size_t>(max_rows) * ld);
  step5_test::DevBuf<std::int32_t> hist(std::vector<std::int32_t>(static_cast<std::size_t>(max_rows), ld));
  step5_test::DevBuf<std::int32_t> ids(static_cast<std::size_t>(max_rows) * (topk + 1));
  step5_test::DevBuf<std::int32_t> counts(static_cast<std::size_t>(max_rows));
  GPU_CHECK(cudaMemset(scores.p, 0, static_cast<std::size_t>(max_rows) * ld * sizeof(float)));
  step5::kernels::sm90::TopkArgs a{};
  a.scores = scores.p, a.ld = ld, a.history = hist.p, a.topk = topk, a.ids = ids.p, a.ld_ids = topk + 1;
  a.counts = counts.p;
  a.lg = 1;
  cudaStream_t stream;
  GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const bool was = step5::ops::pdl_enabled();
  bool clusters = false;
  const step5::Status avail = step5::kernels::sm90::topk_clusters_available(dev, &clusters);
  EXPECT(avail.ok(), "topk_clusters_available: %s", avail.to_string().c_str());
  struct Case {
    const char* what;
    int rows, cluster_size, threads;
    bool pdl;
  };
  std::vector<Case> cases = {{"64 rows (at most num_sms), one 512-thread CTA each", few, 1, 0, false},
                             {"num_sms rows, one 512-thread CTA each", sms, 1, 0, false},
                             {"num_sms + 1 rows, one 512-thread CTA each", sms + 1, 1, 0, true},
                             {"64 rows, one 128-thread CTA each", 64, 1, 128, true},
                             {"64 rows, one 256-thread CTA each", 64, 1, 256, true},
                             {"64 rows, one warp each (unstaged: ld 16384)", 64, 1, 32, true}};
  if (clusters) cases.push_back({"64 rows, a cluster each", 64, kTopkCluster, 0, true});
  for (const bool on : {true, false})
    for (const Case& c : cases) {
      step5::ops::set_pdl_enabled(on);
      cudaGraph_t g = nullptr;
      GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const step5::Status s1 =
          step5::kernels::sm90::launch_topk(a, c.rows, stream, c.cluster_size, TopkAlgo::kDefault, -1, c.threads);
      const step5::Status s2 =
          step5::kernels::sm90::launch_topk(a, c.rows, stream, c.cluster_size, TopkAlgo::kDefault, -1, c.threads);
      GPU_CHECK(cudaStreamEndCapture(stream, &g));
      EXPECT(s1.ok() && s2.ok(), "%s: launches: %s / %s", c.what, s1.to_string().c_str(), s2.to_string().c_str());
      const step5_test::GraphEdges e = step5_test::graph_edges(g);
      const std::size_t n = e.data.size(), programmatic = step5_test::programmatic_edges(g);
      const bool want = on && c.pdl;
      EXPECT(n == 1 && programmatic == (want ? 1u : 0u), "%s, PDL %s: %zu edges, %zu programmatic; expected 1, %d",
             c.what, on ? "on" : "off", n, programmatic, want ? 1 : 0);
      cudaGraphExec_t ge = nullptr;
      GPU_CHECK(cudaGraphInstantiate(&ge, g, 0));
      GPU_CHECK(cudaGraphLaunch(ge, stream));
      GPU_CHECK(cudaStreamSynchronize(stream));
      GPU_CHECK(cudaGraphExecDestroy(ge));
      GPU_CHECK(cudaGraphDestroy(g));
    }
  step5::ops::set_pdl_enabled(was);
  GPU_CHECK(cudaStreamDestroy(stream));
}

HOST_CASE("topk: invalid arguments are refused with a message (before any device call)") {
  step5::ops::TopkSelectParams p;
  p.topk = 0;
  p.rows = 1;
  step5::Status s = step5::ops::topk_select(p, nullptr);
  EXPECT(!s.ok() && s.message().find("topk = 0") != std::string::npos, "topk 0: %s", s.to_string().c_str());
  p.topk = 1025;
  const step5::Status s1025 = step5::ops::topk_select(p, nullptr);
  EXPECT(!s1025.ok() && s1025.message().find("1025") != std::string::npos, "topk 1025: %s", s1025.to_string().c_str());
  // rows, null pointers, ld (1 .. kTopkMaxLd = 2^30: the kernel's int32 key indices) and ld_ids, each named with its value
  // (pointers that are never dereferenced: every refusal comes before a launch)
  p.topk = 512;
  p.rows = -1;
  const step5::Status srows = step5::ops::topk_select(p, nullptr);
  EXPECT(srows.code() == step5::StatusCode::kInvalidArgument && srows.message().find("rows = -1") != std::string::npos,
         "rows -1: %s", srows.to_string().c_str());
  p.rows = 4;
  const step5::Status snull = step5::ops::topk_select(p, nullptr);
  EXPECT(snull.code() == step5::StatusCode::kInvalidArgument && snull.message().find("scores") != std::string::npos,
         "null scores: %s", snull.to_string().c_str());
  p.scores = reinterpret_cast<const float*>(16);
  p.history = reinterpret_cast<const std::int32_t*>(16);
  p.ids = reinterpret_cast<std::int32_t*>(16);
  p.counts = reinterpret_cast<std::int32_t*>(16);
  p.ld_ids = 513;
  for (const std::int64_t ld : {std::int64_t{0}, std::int64_t{-5}, step5::ops::kTopkMaxLd + 1, std::int64_t{0x7fffffff},
                                std::int64_t{1} << 31, std::int64_t{1} << 40}) {
    p.ld = ld;
    const step5::Status sld = step5::ops::topk_select(p, nullptr);
    EXPECT(sld.code() == step5::StatusCode::kInvalidArgument &&
               sld.message().find("ld = " + std::to_string(ld) + ", expected 1 .. 1073741824") != std::string::npos,
           "ld %lld: %s", static_cast<long long>(ld), sld.to_string().c_str());
  }
  p.ld = 2048;
  p.ld_ids = 512;
  const step5::Status sids = step5::ops::topk_select(p, nullptr);
  EXPECT(sids.code() == step5::StatusCode::kInvalidArgument && sids.message().find("ld_ids = 512") != std::string::npos,
         "ld_ids 512: %s", sids.to_string().c_str());
  // threads per row: only 32 (one warp), 128, 256 and 512; a cluster runs 512-thread CTAs; the warp
  // rows run the radix select only (each refused before any device call)
  step5::kernels::sm90::TopkArgs a{};
  a.ld = 2048;
  a.topk = 512;
  const step5::Status s64 = step5::kernels::sm90::launch_topk(a, 1, nullptr, 1, TopkAlgo::kRadix, -1, 64);
  EXPECT(s64.code() == step5::StatusCode::kInvalidArgument && s64.message().find("threads = 64") != std::string::npos,
         "threads 64: %s", s64.to_string().c_str());
  const step5::Status sc = step5::kernels::sm90::launch_topk(a, 1, nullptr, kTopkCluster, TopkAlgo::kRadix, -1, 128);
  EXPECT(sc.code() == step5::StatusCode::kInvalidArgument && sc.message().find("threads = 128") != std::string::npos,
         "threads 128 on a cluster: %s", sc.to_string().c_str());
  const step5::Status sw = step5::kernels::sm90::launch_topk(a, 1, nullptr, 1, TopkAlgo::kCandidates, -1, 32);
  EXPECT(sw.code() == step5::StatusCode::kInvalidArgument && sw.message().find("threads = 32") != std::string::npos &&
             sw.message().find("candidate") != std::string::npos,
         "threads 32 with candidates: %s", sw.to_string().c_str());
  const step5::Status swc = step5::kernels::sm90::launch_topk(a, 1, nullptr, kTopkCluster, TopkAlgo::kRadix, -1, 32);
  EXPECT(swc.code() == step5::StatusCode::kInvalidArgument && swc.message().find("threads = 32") != std::string::npos &&
             swc.message().find("clusters run") != std::string::npos,
         "threads 32 on a cluster: %s", swc.to_string().c_str());
  // the candidate algorithm with the warp rows, asked for explicitly on no rows, or through
  // STEP5_TOPK with the algorithm left to the launcher
  const step5::Status sw0 = step5::kernels::sm90::launch_topk(a, 0, nullptr, 1, TopkAlgo::kCandidates, -1, 32);
  EXPECT(sw0.code() == step5::StatusCode::kInvalidArgument && sw0.message().find("candidate") != std::string::npos,
         "threads 32 with candidates on 0 rows: %s", sw0.to_string().c_str());
  const char* old_env = std::getenv("STEP5_TOPK");
  const std::string saved_env = old_env != nullptr ? old_env : "";
  setenv("STEP5_TOPK", "candidates", 1);
  const step5::Status swe = step5::kernels::sm90::launch_topk(a, 1, nullptr, 1, TopkAlgo::kDefault, -1, 32);
  if (old_env != nullptr) setenv("STEP5_TOPK", saved_env.c_str(), 1);
  else unsetenv("STEP5_TOPK");
  EXPECT(swe.code() == step5::StatusCode::kInvalidArgument && swe.message().find("STEP5_TOPK") != std::string::npos &&
             swe.message().find("threads = 32") != std::string::npos,
         "threads 32 with STEP5_TOPK=candidates: %s", swe.to_string().c_str());
}

GPU_CASE("topk: rows whose CTAs would pass grid.x are refused, naming rows") {
  // rows of ld > kTopkSmemKeys run a cluster of kTopkCluster CTAs each where clusters can be
  // resident: 2^28 such rows are 2^31 CTAs (pointers never dereferenced: refused before a launch)
  bool clusters = false;
  int dev = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  EXPECT(step5::kernels::sm90::topk_clusters_available(dev, &clusters).ok(), "cluster query");
  step5::kernels::sm90::TopkArgs a{};
  a.ld = step5::kernels::sm90::kTopkSmemKeys + 1;
  a.topk = 512;
  a.ld_ids = 513;
  const int rows = 1 << 28;
  if (clusters) {  // (without clusters these rows would launch: one CTA each, within grid.x)
    const step5::Status s = step5::kernels::sm90::launch_topk(a, rows, nullptr, kTopkCluster);
    EXPECT(s.code() == step5::StatusCode::kInvalidArgument && s.message().find("rows = 268435456") != std::string::npos &&
               s.message().find("(grid.x)") != std::string::npos,
           "2^28 rows of %lld regions: %s", static_cast<long long>(a.ld), s.to_string().c_str());
  } else {
    std::printf("  clusters of %d CTAs cannot be resident here: not exercised\n", kTopkCluster);
  }
}

STEP5_GPU_TEST_MAIN()
