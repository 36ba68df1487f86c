#pragma once
/// \file step5/kernels/sm90/indexer_launch.cuh
/// Host launchers behind step5/ops/indexer.hpp, templated on the geometry row (instantiated in
/// src/instances/indexer.cu.in; the run-time dispatch and the geometry-independent `topk_select`
/// live in src/instances/indexer_common.cu). Every precondition visible on the host is checked
/// before anything is launched: the step's batch, table, limits, workspace and row widths by the
/// one shared `ops::validate_step` (ops/batch_check.hpp), pointers and the geometry here.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "step5/core/cuda_check.hpp"
#include "step5/kernels/sm90/indexer_args.cuh"
#include "step5/kernels/sm90/indexer_prepare.cuh"
#include "step5/kernels/sm90/indexer_scores.cuh"
#include "step5/kernels/sm90/indexer_scores_wgmma.cuh"
#include "step5/kernels/sm90/indexer_summaries.cuh"
#include "step5/kernels/sm90/indexer_topk.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/layout/geometry.hpp"
#include "step5/ops/indexer.hpp"

namespace step5::ops::detail {


inline std::string num(long long v) { return std::to_string(v); }

inline Status internal_mismatch(const char* op) {
  return Status(StatusCode::kInternal, std::string(op) + ": geometry dispatch mismatch");
}

inline Status check_geometry(const layout::RankLayout& r, const layout::Geometry& g, const char* op) {
  if (!(r.geometry == g)) return internal_mismatch(op);
  if (r.index_local_kv_heads != 1)
    return unsupported(std::string(op) + ": index_local_kv_heads = " + num(r.index_local_kv_heads) +
                       "; the indexer kernels support exactly 1 local indexer k head");
  return layout::check_rank_layout(r, op);
}

// score_ld / plan_bytes (the select workspace layout) live in step5/ops/indexer.hpp.

/// Which score kernel a plan launches: the mma.sync kernel (indexer_scores.cuh: decode, MTP and
/// every shape the wgmma kernel does not take) or the wgmma kernel (indexer_scores_wgmma.cuh) with
/// f16 operands (the automatic choice for prefill chunks) or e4m3 operands (only when asked for: its accumulation is
/// not fp32-accurate, see that file), in tiles of 128 columns, or f16 in wide tiles of 256
/// columns (kWgmmaF16N256: the automatic choice for prefill chunks with long histories,
/// `score_wide_tiles_pay`). kAuto: score_plan's choice.
enum class ScorePath { kAuto, kMma, kWgmmaF16, kWgmmaE4m3, kWgmmaF16N256 };
inline const char* score_path_name(ScorePath p) {
  switch (p) {
    case ScorePath::kMma: return "mma";
    case ScorePath::kWgmmaF16: return "wgmma_f16";
    case ScorePath::kWgmmaE4m3: return "wgmma_e4m3";
    case ScorePath::kWgmmaF16N256: return "wgmma_f16_n256";
    default: return "auto";
  }
}
/// The wgmma kernel instance of path `p` (operand type K, tile width N), the one map from a
/// ScorePath to a kernel: returns f.template operator()<K, N>(), or `otherwise` (f not called)
/// for kAuto and kMma.
template <class R, class F>
R visit_wgmma_path(ScorePath p, R otherwise, F&& f) {
  using kernels::sm90::ScoreMma;
  constexpr int kCols = kernels::sm90::kWgScoreCols, kWide = kernels::sm90::kWgScoreWideCols;
  switch (p) {
    case ScorePath::kWgmmaF16: return f.template operator()<ScoreMma::kF16, kCols>();
    case ScorePath::kWgmmaE4m3: return f.template operator()<ScoreMma::kE4m3, kCols>();
    case ScorePath::kWgmmaF16N256: return f.template operator()<ScoreMma::kF16, kWide>();
    default: return otherwise;
  }
}

/// The automatic choice takes the wgmma f16 kernel from this mean query length per request on (a
/// prefill chunk; decode and MTP rows keep the mma.sync kernel, whose tiles hold only their own
/// columns). Measured on the H200 (bench_indexer scores_prefill_path/, 16K chunk after 32K
/// history: 2088 µs against 3073 µs for mma.sync, 24.2 % of the cuBLASLt e4m3 rate against
/// 16.4 %, bench/RESULTS.md); test_indexer "prefill scores on the wgmma path" checks it.
inline constexpr int kScoreWgmmaMinMeanQ = 16;

/// The automatic choice takes the wide 256-column tile (kWgmmaF16N256) over the 128-column one
/// (kWgmmaF16) when a CTA's share of the history is long: the estimated mean number of regions a
/// token sees, ld - mean_q / 16 (the history of a request of ld regions ahead of a chunk of mean_q
/// tokens, whose own regions it sees half of on average; ld comes from the caller's max_seq_len,
/// so in a batch of shorter requests, or under a loose max_seq_len, it is an upper bound and the
/// choice may take the wide tile where it is slower: never a different score), capped by the
/// plan's region chunk (`regions_per_cta`), at least this many. The wide tile
/// reads each summary tile once for twice the columns and builds its A fragments once for them,
/// but stages twice the q columns per CTA and runs half the CTAs, so short histories leave its
/// ring unfilled. Measured on the H200 (bench_indexer, tp 1 step5_preview, one binary, µs, 128 ->
/// 256 columns; bench/RESULTS.md, 2026-12-05): 4K chunk without history (256 regions per CTA)
/// 36.6 -> 41.7 (slower); 16K chunk without history (1024) 322.6 -> 312.3; 4K chunk after 32K
/// (4096) 289.0 -> 274.9; 16K after 32K (4096) 1329.8 -> 1246.9. Both widths give the same bits
/// (the same k order per column; test_indexer asserts it), so the choice never changes a score.
inline constexpr int kScoreWideMinRegionsPerCta = 512;
inline bool score_wide_tiles_pay(std::int64_t ld, int mean_q, int regions_per_cta) {
  const std::int64_t mean_regions = std::max<std::int64_t>(1, ld - mean_q / (2 * layout::kRegionSize));
  return std::min<std::int64_t>(mean_regions, regions_per_cta) >= kScoreWideMinRegionsPerCta;
}

/// Launch shape of the score kernel for T tokens of B requests (shared with bench/bench_indexer.cu).
/// mma.sync path: tok_tile (tokens per tile, one pass over a request's summaries serves them all)
/// follows the mean query length, so decode tiles stage only their own columns; region chunks
/// (at most kScoreMaxRegionsPerCta regions) halve until the grid fills 90 % of the resident CTA
/// slots (CTAs per SM × `num_sms`, the device's SM count: `device_sm_count`), counting
/// max(B, ceil(T / tok_tile)) tiles (the fewest a batch without empty requests has); with one
/// token per request (decode), where that rule keeps the longest chunk,
/// kScoreDecodeLongRegionsPerCta instead (unless the rows need more than kMaxGridDimY chunks of
/// it). wgmma paths:
/// tok_tile = N / Il (a full tile of N = 128 columns, 256 for kWgmmaF16N256), region chunks of up
/// to 4096 regions (multiples of 128), halved until the grid covers 2 × `num_sms` CTAs (one CTA
/// per SM).
/// `want` forces a path (tests, benchmarks); a wgmma path the shape does not fit falls back to
/// the mma.sync kernel (`path` says which one the plan took). indexer_select plans through
/// `auto_score_plan` (the 128-column tile where the wide kernel cannot run).
struct ScorePlan {
  int tok_tile = 1, cols_cap = 8, regions_per_cta = 0, bt_cap = 0, smem_bytes = 0;
  std::int64_t tiles_upper = 0, region_chunks = 0;
  ScorePath path = ScorePath::kMma;
  /// wgmma paths: the CTAs of each region chunk run the tiles from the last to the first, so a
  /// request's tiles start longest history first (a causal chunk's work per tile grows with its
  /// position; CTAs are dispatched in grid order, and the longest ones last left the final wave
  /// to a few SMs). The same CTAs and stores in another order: the bits are the same.
  bool longest_first = false;
};
/// Sets an mma.sync plan's region chunk to `regions_per_cta` and the fields that follow from it
/// (region_chunks of rows of `ld` regions, the staged block-table entries at `block_size`, the
/// shared memory for proxy dim `proxy_dim`): score_plan's one rule, and tests that force a chunk.
inline void set_score_chunk(ScorePlan& s, int regions_per_cta, std::int64_t ld, int block_size, int proxy_dim) {
  s.regions_per_cta = regions_per_cta;
  s.region_chunks = (ld + regions_per_cta - 1) / regions_per_cta;
  s.bt_cap = kernels::sm90::score_bt_cap(regions_per_cta, block_size);
  s.smem_bytes = kernels::sm90::score_smem_bytes(proxy_dim, s.cols_cap, s.bt_cap);
}
template <layout::GeometryId Id>
ScorePlan score_plan(int index_local_heads, int T, int B, std::int64_t ld, int block_size, int num_sms,
                     ScorePath want = ScorePath::kAuto) {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr int kHpg = G.index_num_heads / G.num_kv_heads;
  using kernels::sm90::ScoreMma;
  ScorePlan s;
  const int Il = index_local_heads;
  const int mean_q = B > 0 ? static_cast<int>((static_cast<std::int64_t>(T) + B - 1) / B) : 1;
  const bool automatic = want == ScorePath::kAuto;
  if (automatic) want = mean_q >= kScoreWgmmaMinMeanQ ? ScorePath::kWgmmaF16N256 : ScorePath::kMma;
  // a wgmma path: its tile width and shared memory, when this geometry and Il have it
  struct WgmmaTile {
    int cols = 0, smem = 0;  // cols 0: the path is not a wgmma one, or this geometry / Il lacks it
  };
  const WgmmaTile wg = visit_wgmma_path(want, WgmmaTile{}, [&]<ScoreMma K, int N>() {
    if constexpr (kernels::sm90::score_wgmma_static_fit<G.proxy_dim, kHpg, K, N>()) {
      if (kernels::sm90::score_wgmma_il_fits(Il, kHpg, N))
        return WgmmaTile{N, kernels::sm90::WgScoreSmem<G.proxy_dim, K, N>::kBytes};
    }
    return WgmmaTile{};
  });
  // kAuto's wgmma choice is the wide tile where this geometry and Il have it and its CTAs get long
  // histories (score_wide_tiles_pay), else the 128-column tile (or mma.sync where Il lacks it too)
  const bool auto_wide = automatic && want == ScorePath::kWgmmaF16N256;
  const auto narrow = [&] { return score_plan<Id>(Il, T, B, ld, block_size, num_sms, ScorePath::kWgmmaF16); };
  if (auto_wide && wg.cols == 0) return narrow();
  if (wg.cols > 0) {
    s.path = want;
    s.tok_tile = wg.cols / Il;
    s.cols_cap = wg.cols;
    s.tiles_upper = (static_cast<std::int64_t>(T) + s.tok_tile - 1) / s.tok_tile + B;
    constexpr int kStep = 2 * kernels::sm90::kWgScoreRegions;
    int rpc = 32 * kStep;
    while (rpc > kStep && s.tiles_upper * ((ld + rpc - 1) / rpc) < 2ll * num_sms) rpc /= 2;
    s.regions_per_cta = rpc;
    s.region_chunks = (ld + rpc - 1) / rpc;
    s.bt_cap = 0;
    s.smem_bytes = wg.smem;
    s.longest_first = true;
    if (auto_wide && !score_wide_tiles_pay(ld, mean_q, s.regions_per_cta)) return narrow();
    return s;
  }
  s.path = ScorePath::kMma;
  s.tok_tile = std::max(1, std::min(kernels::sm90::kScoreCols / Il, mean_q));
  s.cols_cap = (s.tok_tile * Il + 7) / 8 * 8;
  // Σ_b ceil(q_len_b / tok_tile) <= T / tok_tile + B (the grid); >= max(B, ceil(T / tok_tile))
  // when no request is empty (the fill test below; an empty request only makes the chunks
  // longer than needed); exactly T with one token per tile
  s.tiles_upper = s.tok_tile == 1 ? T : (static_cast<std::int64_t>(T) + s.tok_tile - 1) / s.tok_tile + B;
  const std::int64_t tiles_lower =
      s.tok_tile == 1 ? T : std::max<std::int64_t>(B, (static_cast<std::int64_t>(T) + s.tok_tile - 1) / s.tok_tile);
  // region chunks: the longest (fewest CTAs, each walking its summaries in one stream) whose grid
  // still fills 90 % of the resident CTA slots (CTAs per SM from the register bound and shared
  // memory); halved down to one m-tile per warp. The seventh session measured 2048 regions per
  // CTA ahead of 512 at batch 64 (77.5 / 82.4 µs at tp 1, before the score kernel's later
  // changes). Decode plans (one token per request) that keep the longest chunk take
  // kScoreDecodeLongRegionsPerCta instead (its comment has the forty-first session's figures; MTP
  // steps of 2 tokens per request keep 2048: 256 read 113.9 → 116.7 µs at tp 1 batch 64 in that
  // session's sweep, run on the score-prologue candidate's tree).
  for (int rpc = kernels::sm90::kScoreMaxRegionsPerCta;; rpc /= 2) {
    set_score_chunk(s, rpc, ld, block_size, G.proxy_dim);
    const int per_sm = std::min(kernels::sm90::score_min_ctas(G.proxy_dim),
                                kSm90SmemPerSm / (s.smem_bytes + kSm90SmemReservedPerCta));
    if (rpc <= kernels::sm90::kScoreMinRegionsPerCta || tiles_lower * s.region_chunks * 10 >= 9ll * per_sm * num_sms)
      break;
  }
  // rows of more than kMaxGridDimY chunks of kScoreDecodeLongRegionsPerCta regions (up to
  // kMaxIndexerSeqLen) keep 2048
  if (mean_q == 1 && s.regions_per_cta == kernels::sm90::kScoreMaxRegionsPerCta &&
      ld <= static_cast<std::int64_t>(kMaxGridDimY) * kernels::sm90::kScoreDecodeLongRegionsPerCta)
    set_score_chunk(s, kernels::sm90::kScoreDecodeLongRegionsPerCta, ld, block_size, G.proxy_dim);
  return s;
}

// kMaxIndexerSeqLen's rows fit the score grid at each path's longest chunk, which score_plan keeps
// at such lengths (the halving stops once the grid fills the device).
static_assert(score_ld(kMaxIndexerSeqLen) <= 1ll * kMaxGridDimY * kernels::sm90::kScoreMaxRegionsPerCta &&
                  score_ld(kMaxIndexerSeqLen) <= 64ll * kMaxGridDimY * kernels::sm90::kWgScoreRegions,
              "kMaxIndexerSeqLen must fit 65535 score-grid rows of the longest region chunk");

/// The score tiles' starts of plan `sp` (tile_start[b], b in [0, B]): with one token per tile (decode)
/// they are cu_seqlens_q itself and nothing is launched; else indexer_plan_kernel writes them to
/// `plan` (plan_bytes(B) of the workspace). `*tile_start` receives the array the kernel reads.
inline Status score_tile_starts(const ScorePlan& sp, const std::int32_t* cu_seqlens_q, int B, std::int32_t* plan,
                                cudaStream_t stream, const std::int32_t** tile_start) {
  if (sp.tok_tile == 1) {
    *tile_start = cu_seqlens_q;
    return Status::Ok();
  }
  *tile_start = plan;
  return kernels::sm90::launch_kernel("indexer_plan_kernel launch", &kernels::sm90::indexer_plan_kernel<>,
                                      {dim3(1), dim3(kernels::sm90::kPlanThreads)}, stream, cu_seqlens_q, B,
                                      sp.tok_tile, plan);
}

/// The plan fields of the score kernels' arguments (tile width, regions per CTA, staged columns).
inline void apply_score_plan(const ScorePlan& sp, kernels::sm90::ScoreArgs& a) {
  a.tok_tile = sp.tok_tile;
  a.regions_per_cta = sp.regions_per_cta;
  a.cols_cap = sp.cols_cap;
  a.longest_first = sp.longest_first ? 1 : 0;
}

/// The registers per thread the wide wgmma score kernel of geometry Id was compiled for
/// (cudaFuncGetAttributes; a successful answer is cached for the process, a failed query is asked
/// again next time), and whether it can run: its setmaxnreg split holds for exactly
/// kWgScoreLaunchRegs at launch (fewer: the consumers would wait forever for registers; a build
/// with other code generation, e.g. nvcc -G, may give another count). regs 0: the geometry has no
/// wide tile, or the query failed (`error`, cleared from cudaGetLastError).
struct WideScoreKernel {
  bool launchable = false;
  int regs = 0;
  cudaError_t error = cudaSuccess;
};
template <layout::GeometryId Id>
WideScoreKernel score_wide_kernel() {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr int kHpg = G.index_num_heads / G.num_kv_heads;
  constexpr int kWide = kernels::sm90::kWgScoreWideCols;
  using kernels::sm90::ScoreMma;
  WideScoreKernel w;
  if constexpr (kernels::sm90::score_wgmma_static_fit<G.proxy_dim, kHpg, ScoreMma::kF16, kWide>()) {
    static std::atomic<int> cached_regs{0};  // 0: not asked yet, or the last query failed
    w.regs = cached_regs.load(std::memory_order_relaxed);
    if (w.regs == 0) {
      cudaFuncAttributes fa{};
      w.error = cudaFuncGetAttributes(&fa, kernels::sm90::indexer_scores_wgmma_kernel<G.proxy_dim, kHpg, ScoreMma::kF16, kWide>);
      if (w.error != cudaSuccess) {
        (void)cudaGetLastError();
        return w;
      }
      w.regs = fa.numRegs;
      cached_regs.store(w.regs, std::memory_order_relaxed);
    }
    w.launchable = w.regs == kernels::sm90::kWgScoreLaunchRegs;
  }
  return w;
}

/// kAuto's score plan as indexer_select makes it: score_plan, and where it took the wide tile but
/// `wide_launchable()` is false, the 128-column tile score_plan falls back to (kWgmmaF16 forced;
/// its default asks score_wide_kernel<Id>(): only when a plan takes the wide tile, so decode steps
/// never query).
template <layout::GeometryId Id, class WideLaunchable>
ScorePlan auto_score_plan(int index_local_heads, int T, int B, std::int64_t ld, int block_size, int num_sms,
                          WideLaunchable&& wide_launchable) {
  const ScorePlan sp = score_plan<Id>(index_local_heads, T, B, ld, block_size, num_sms);
  if (sp.path == ScorePath::kWgmmaF16N256 && !wide_launchable())
    return score_plan<Id>(index_local_heads, T, B, ld, block_size, num_sms, ScorePath::kWgmmaF16);
  return sp;
}
template <layout::GeometryId Id>
ScorePlan auto_score_plan(int index_local_heads, int T, int B, std::int64_t ld, int block_size, int num_sms) {
  return auto_score_plan<Id>(index_local_heads, T, B, ld, block_size, num_sms,
                             [] { return score_wide_kernel<Id>().launchable; });
}

/// Launches the wgmma score kernel of operand type K and N columns (plan `sp`, path kWgmmaF16 /
/// kWgmmaE4m3 / kWgmmaF16N256).
template <layout::GeometryId Id, kernels::sm90::ScoreMma K, int N>
Status launch_scores_wgmma(const ScorePlan& sp, kernels::sm90::ScoreArgs a, cudaStream_t stream) {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr int kHpg = G.index_num_heads / G.num_kv_heads;
  if constexpr (!kernels::sm90::score_wgmma_static_fit<G.proxy_dim, kHpg, K, N>()) {
    (void)sp, (void)a, (void)stream;
    return Status(StatusCode::kInternal, "launch_scores: the plan chose a wgmma path this geometry has not");
  } else {
    auto kern = kernels::sm90::indexer_scores_wgmma_kernel<G.proxy_dim, kHpg, K, N>;
    constexpr int kSmem = kernels::sm90::WgScoreSmem<G.proxy_dim, K, N>::kBytes;
    if (sp.smem_bytes != kSmem || sp.tok_tile * a.Il != N ||
        sp.regions_per_cta % (2 * kernels::sm90::kWgScoreRegions) != 0)
      return Status(StatusCode::kInternal, "launch_scores: inconsistent wgmma score plan");
    if constexpr (N == kernels::sm90::kWgScoreWideCols) {
      // setmaxnreg's raise takes only what the producers release (score_wide_kernel)
      const WideScoreKernel w = score_wide_kernel<Id>();
      if (w.error != cudaSuccess) return cuda_status(w.error, "launch_scores: cudaFuncGetAttributes of the wide kernel");
      if (!w.launchable)
        return Status(StatusCode::kInternal,
                      "launch_scores: the wide wgmma score kernel was compiled for " + num(w.regs) +
                          " registers per thread; its setmaxnreg split needs " +
                          num(kernels::sm90::kWgScoreLaunchRegs));
    }
    STEP5_CUDA_RETURN(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    apply_score_plan(sp, a);
    return kernels::sm90::launch_kernel(
        "indexer_scores_wgmma_kernel launch", kern,
        {dim3(static_cast<unsigned>(sp.tiles_upper), static_cast<unsigned>(sp.region_chunks)),
         dim3(kernels::sm90::kWgScoreThreads), static_cast<std::size_t>(kSmem)},
        stream, a);
  }
}

/// Launches the score kernel of plan `sp` (sp.path) for the token chunk [a.t0, a.t1) (the plan
/// fields of `a` are filled here).
template <layout::GeometryId Id>
Status launch_scores(const ScorePlan& sp, kernels::sm90::ScoreArgs a, cudaStream_t stream) {
  std::optional<Status> wgmma_status =
      visit_wgmma_path(sp.path, std::optional<Status>{}, [&]<kernels::sm90::ScoreMma K, int N>() {
        return std::optional<Status>(launch_scores_wgmma<Id, K, N>(sp, a, stream));
      });
  if (wgmma_status) return *std::move(wgmma_status);
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr int kHpg = G.index_num_heads / G.num_kv_heads;
  auto kern = kernels::sm90::indexer_scores_kernel<G.proxy_dim, kHpg>;
  // the largest plan (kScoreCols columns, kScoreMaxRegionsPerCta regions per CTA, the smallest
  // block_size): one fixed limit, so launches from several host threads never lower each other's
  constexpr int kMaxSmem = kernels::sm90::score_smem_bytes(
      G.proxy_dim, kernels::sm90::kScoreCols,
      kernels::sm90::score_bt_cap(kernels::sm90::kScoreMaxRegionsPerCta, layout::kRegionSize));
  if (sp.smem_bytes > kMaxSmem) return Status(StatusCode::kInternal, "launch_scores: plan exceeds the smem bound");
  if constexpr (kMaxSmem > 48 * 1024)
    STEP5_CUDA_RETURN(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
  apply_score_plan(sp, a);
  return kernels::sm90::launch_kernel(
      "indexer_scores_kernel launch", kern,
      {dim3(static_cast<unsigned>(sp.tiles_upper), static_cast<unsigned>(sp.region_chunks)),
       dim3(kernels::sm90::kScoreWarps * 32), static_cast<std::size_t>(sp.smem_bytes)},
      stream, a);
}

/// The preconditions of step 4 beyond `validate_step` (one rule for indexer_summaries and for
/// indexer_prepare doing step 4): pointers, their alignment (tail 16 bytes, summary_cache 2: the
/// fold's cp.async and paired stores; tail_slot 4 and index_k, C 2: the element loads of both
/// kernels), num_slots, and the summaries launch's grid limit (also where the prepare launch does
/// step 4, so that the step's errors do not depend on the path). `op` prefixes the messages.
inline Status check_summary_outputs(const char* op, const IndexerSummaryParams& p) {
  STEP5_RETURN_IF_ERROR(require_non_null(op, {{"index_k", p.index_k}, {"c", p.c}, {"summary_cache", p.summary_cache},
                                              {"tail", p.tail}, {"tail_slot", p.tail_slot}}));
  STEP5_RETURN_IF_ERROR(require_aligned(op, 16, {{"tail", p.tail}}));
  STEP5_RETURN_IF_ERROR(require_aligned(op, alignof(std::int32_t), {{"tail_slot", p.tail_slot}}));
  STEP5_RETURN_IF_ERROR(require_aligned(op, 2, {{"summary_cache", p.summary_cache}, {"index_k", p.index_k}, {"c", p.c}}));
  if (p.num_slots <= 0)
    return invalid_argument(std::string(op) + ": num_slots = " + num(p.num_slots) + ", expected > 0");
  if (p.batch.num_requests > ops::kMaxIndexerRequests)
    return invalid_argument(std::string(op) + ": num_requests = " + num(p.batch.num_requests) + ", expected <= " +
                            num(ops::kMaxIndexerRequests) + " (one summaries grid row per request)");
  return Status::Ok();
}

/// Launches the summaries kernel for `p` (checked by the caller).
template <layout::GeometryId Id>
Status launch_summaries(const IndexerSummaryParams& p, cudaStream_t stream) {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  const kernels::sm90::SummaryArgs a = summary_args(p);
  // regions completed by one request in this step <= q_len/R + 1 <= T/R + 1
  const int y = std::max(1, std::min(p.batch.num_tokens / layout::kRegionSize + 1, 2048));
  const dim3 grid(static_cast<unsigned>(y), static_cast<unsigned>(p.batch.num_requests));
  return kernels::sm90::launch_kernel("indexer_summaries_kernel launch",
                                      &kernels::sm90::indexer_summaries_kernel<G.proxy_dim>, {grid, dim3(G.proxy_dim)},
                                      stream, a);
}

template <layout::GeometryId Id>
Status indexer_summaries_for(const IndexerSummaryParams& p, cudaStream_t stream) {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr const char* op = "indexer_summaries";
  STEP5_RETURN_IF_ERROR(check_geometry(p.rank, G, op));
  StepCheck check = step_check(op, p.batch, p.table);
  check.widths[0] = {"ldc", p.ldc, p.rank.rows_with_w, "rows_with_w", 1};
  check.tail_slot_host = p.tail_slot_host, check.num_slots = p.num_slots;
  STEP5_RETURN_IF_ERROR(validate_step(check));
  if (p.batch.num_tokens == 0) return Status::Ok();
  STEP5_RETURN_IF_ERROR(check_summary_outputs(op, p));
  // the summary cache and the tail are written while other CTAs (other requests, other regions)
  // read index_k, C's index_z columns, the batch arrays and the block table
  const int T = p.batch.num_tokens, B = p.batch.num_requests;
  const auto step = step_array_ranges(p.batch.cu_seqlens_q, p.batch.seq_lens, p.table.block_table, B, p.table.max_blocks);
  STEP5_RETURN_IF_ERROR(require_disjoint(
      op, {{"summary_cache", p.summary_cache, summary_cache_bytes(p.table, G.proxy_dim)}, {"tail", p.tail, tail_bytes(p.num_slots, G.proxy_dim)}},
      {{"index_k", p.index_k, strided_rows_bytes(T, G.proxy_dim, G.proxy_dim, 2)}, {"c", p.c, strided_rows_bytes(T, p.ldc, p.rank.rows_with_w, 2)},
       {"tail_slot", p.tail_slot, int32s(B)}, step[0], step[1], step[2]}));
  return launch_summaries<Id>(p, stream);
}

template <layout::GeometryId Id>
Status indexer_prepare_for(const IndexerPrepareParams& p, cudaStream_t stream) {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr const char* op = "indexer_prepare";
  STEP5_RETURN_IF_ERROR(check_geometry(p.rank, G, op));
  StepCheck check = step_check(op, p.batch, p.table);
  check.max_position = p.max_position;
  check.widths[0] = {"ldc", p.ldc, p.rank.rows_with_w, "rows_with_w", 2};
  check.tail_slot_host = p.summaries.tail_slot_host, check.num_slots = p.summaries.num_slots;  // step 4's
  STEP5_RETURN_IF_ERROR(validate_step(check));
  if (p.batch.num_tokens == 0) return Status::Ok();
  STEP5_RETURN_IF_ERROR(require_non_null(
      "indexer_prepare", {{"c", p.c}, {"q_norm", p.q_norm}, {"k_norm", p.k_norm}, {"index_q_norm", p.index_q_norm},
                          {"index_k_norm_w", p.index_k_norm_w}, {"index_k_norm_b", p.index_k_norm_b},
                          {"cos_main", p.cos_main}, {"sin_main", p.sin_main}, {"cos_idx", p.cos_idx},
                          {"sin_idx", p.sin_idx}, {"q_out", p.q_out}, {"k_cache", p.k_cache}, {"v_cache", p.v_cache},
                          {"index_q", p.index_q}, {"weights", p.weights}, {"index_k", p.index_k}}));
  // the kernel's paired accesses: 32-bit loads of C (bf16 pairs; ldc is even), bf16x2 stores of
  // q, k and index_k, 32-bit copies of v, fp8x2 stores of index_q (a misaligned pointer would be
  // a sticky misaligned-address fault that ends the context)
  STEP5_RETURN_IF_ERROR(require_aligned(op, 4, {{"c", p.c}, {"q_out", p.q_out}, {"k_cache", p.k_cache},
                                                {"v_cache", p.v_cache}, {"index_k", p.index_k}, {"weights", p.weights}}));
  STEP5_RETURN_IF_ERROR(require_aligned(op, 2, {{"index_q", p.index_q}}));
  // its element loads of the norm weights (fp32) and the RoPE tables (bf16)
  STEP5_RETURN_IF_ERROR(require_aligned(op, alignof(float),
                                        {{"q_norm", p.q_norm}, {"k_norm", p.k_norm}, {"index_q_norm", p.index_q_norm},
                                         {"index_k_norm_w", p.index_k_norm_w}, {"index_k_norm_b", p.index_k_norm_b}}));
  STEP5_RETURN_IF_ERROR(require_aligned(op, alignof(bf16),
                                        {{"cos_main", p.cos_main}, {"sin_main", p.sin_main}, {"cos_idx", p.cos_idx},
                                         {"sin_idx", p.sin_idx}}));
  STEP5_RETURN_IF_ERROR(check_norm_eps(p.eps, "indexer_prepare: eps"));
  // step 4 too (p.summaries, any field set; a missing one is named): the indexer_summaries
  // arguments of this step
  const bool step4 = p.summaries.summary_cache != nullptr || p.summaries.tail != nullptr ||
                     p.summaries.tail_slot != nullptr || p.summaries.num_slots != 0;
  const IndexerSummaryParams sp = indexer_summary_params(p, p.summaries);
  if (step4) STEP5_RETURN_IF_ERROR(check_summary_outputs(op, sp));
  {
    // every output is written by one token's CTAs while other tokens' CTAs still read C (q_out
    // over C: token t's q rows land on C's row t * Hl * D / ldc, an earlier token's k, v and
    // indexer columns), the norm weights, the RoPE tables and the step's arrays; the outputs are
    // distinct tensors (step 4 reads index_k back)
    const int T = p.batch.num_tokens, B = p.batch.num_requests;
    const std::uint64_t t = static_cast<std::uint64_t>(T);
    const std::uint64_t cache = kv_cache_bytes(p.table.num_blocks, p.table.block_size, p.rank.local_kv_heads, G.head_dim);
    const std::uint64_t rope_main = static_cast<std::uint64_t>(p.max_position) * (G.rot_main / 2) * 2;
    const std::uint64_t rope_idx = static_cast<std::uint64_t>(p.max_position) * (G.rot_idx / 2) * 2;
    const auto step = step_array_ranges(p.batch.cu_seqlens_q, p.batch.seq_lens, p.table.block_table, B, p.table.max_blocks);
    STEP5_RETURN_IF_ERROR(require_disjoint(
        op,
        {{"q_out", p.q_out, t * static_cast<std::uint64_t>(p.rank.local_heads) * G.head_dim * 2},
         {"k_cache", p.k_cache, cache},
         {"v_cache", p.v_cache, cache},
         {"index_q", p.index_q, t * static_cast<std::uint64_t>(p.rank.index_local_heads) * G.proxy_dim},
         {"weights", p.weights, t * static_cast<std::uint64_t>(p.rank.index_local_heads) * 4},
         {"index_k", p.index_k, t * G.proxy_dim * 2},
         {"summaries.summary_cache", step4 ? p.summaries.summary_cache : nullptr, summary_cache_bytes(p.table, G.proxy_dim)},
         {"summaries.tail", step4 ? p.summaries.tail : nullptr, tail_bytes(p.summaries.num_slots, G.proxy_dim)}},
        {{"c", p.c, strided_rows_bytes(T, p.ldc, p.rank.rows_with_w, 2)},
         {"q_norm", p.q_norm, static_cast<std::uint64_t>(G.head_dim) * 4},
         {"k_norm", p.k_norm, static_cast<std::uint64_t>(G.head_dim) * 4},
         {"index_q_norm", p.index_q_norm, static_cast<std::uint64_t>(G.proxy_dim) * 4},
         {"index_k_norm_w", p.index_k_norm_w, static_cast<std::uint64_t>(G.proxy_dim) * 4},
         {"index_k_norm_b", p.index_k_norm_b, static_cast<std::uint64_t>(G.proxy_dim) * 4},
         {"cos_main", p.cos_main, rope_main},
         {"sin_main", p.sin_main, rope_main},
         {"cos_idx", p.cos_idx, rope_idx},
         {"sin_idx", p.sin_idx, rope_idx},
         step[0],
         step[1],
         step[2],
         {"summaries.tail_slot", step4 ? p.summaries.tail_slot : nullptr, int32s(B)}}));
  }
  kernels::sm90::PrepareArgs a{};
  a.c = reinterpret_cast<const __nv_bfloat16*>(p.c);
  a.ldc = p.ldc;
  a.col_q = p.rank.shard(layout::Shard::kQ).dst_row;
  a.col_k = p.rank.shard(layout::Shard::kK).dst_row;
  a.col_v = p.rank.shard(layout::Shard::kV).dst_row;
  a.col_iq = p.rank.shard(layout::Shard::kIndexQ).dst_row;
  a.col_ik = p.rank.shard(layout::Shard::kIndexK).dst_row;
  a.col_w = p.rank.indexer_w.dst_row;
  a.num_tokens = p.batch.num_tokens;
  a.num_requests = p.batch.num_requests;
  set_step_table(a, p.batch, p.table);
  a.max_position = p.max_position;
  a.local_heads = p.rank.local_heads;
  a.local_kv_heads = p.rank.local_kv_heads;
  a.index_local_heads = p.rank.index_local_heads;
  a.eps = p.eps;
  a.weight_scale = 1.0f / std::sqrt(static_cast<float>(p.rank.hpg_i));
  a.q_norm = p.q_norm;
  a.k_norm = p.k_norm;
  a.iq_norm = p.index_q_norm;
  a.ik_w = p.index_k_norm_w;
  a.ik_b = p.index_k_norm_b;
  a.cos_main = reinterpret_cast<const __nv_bfloat16*>(p.cos_main);
  a.sin_main = reinterpret_cast<const __nv_bfloat16*>(p.sin_main);
  a.cos_idx = reinterpret_cast<const __nv_bfloat16*>(p.cos_idx);
  a.sin_idx = reinterpret_cast<const __nv_bfloat16*>(p.sin_idx);
  a.q_out = reinterpret_cast<__nv_bfloat16*>(p.q_out);
  a.k_cache = reinterpret_cast<__nv_bfloat16*>(p.k_cache);
  a.v_cache = reinterpret_cast<__nv_bfloat16*>(p.v_cache);
  a.index_q = p.index_q;
  a.weights = p.weights;
  a.index_k = reinterpret_cast<__nv_bfloat16*>(p.index_k);
  int dev = 0, sms = 0;
  STEP5_CUDA_RETURN(cudaGetDevice(&dev));
  STEP5_RETURN_IF_ERROR(device_sm_count(dev, &sms));
  const bool fold = step4 && indexer_prepare_folds_summaries(p.batch, sms);
  if (fold) a.fold = summary_args(sp);
  const int items = kernels::sm90::prepare_items(a.local_heads, a.local_kv_heads, a.index_local_heads);
  const int per_token = kernels::sm90::prepare_ctas_per_token(p.batch.num_tokens, items, sms);
  using kernels::sm90::indexer_prepare_kernel;
  const auto kernel = kernels::sm90::prepare_min_ctas_per_sm(p.batch.num_tokens, sms) > 1
                          ? &kernels::sm90::indexer_prepare_wide_kernel<G.head_dim, G.proxy_dim, G.rot_main, G.rot_idx>
                      : fold ? &indexer_prepare_kernel<G.head_dim, G.proxy_dim, G.rot_main, G.rot_idx, true>
                             : &indexer_prepare_kernel<G.head_dim, G.proxy_dim, G.rot_main, G.rot_idx, false>;
  STEP5_RETURN_IF_ERROR(kernels::sm90::launch_kernel(
      "indexer_prepare_kernel launch", kernel,
      {dim3(static_cast<unsigned>(p.batch.num_tokens), static_cast<unsigned>(per_token)),
       dim3(kernels::sm90::kPrepareThreads)},
      stream, a));
  return step4 && !fold ? launch_summaries<Id>(sp, stream) : Status::Ok();
}

template <layout::GeometryId Id>
Status indexer_select_for(const IndexerSelectParams& p, cudaStream_t stream) {
  constexpr layout::Geometry G = layout::geometry_of(Id);
  constexpr int kHpg = G.index_num_heads / G.num_kv_heads;
  constexpr const char* op = "indexer_select";
  STEP5_RETURN_IF_ERROR(check_geometry(p.rank, G, op));
  if (p.rank.hpg_i != kHpg) return internal_mismatch(op);
  const int lg = p.rank.local_kv_groups, Il = p.rank.index_local_heads;
  const int B = p.batch.num_requests, T = p.batch.num_tokens;
  const std::int64_t ld = score_ld(p.max_seq_len);
  const std::size_t fixed = plan_bytes(B < 0 ? 0 : B);  // the plan, then the scores
  StepCheck check = step_check(op, p.batch, p.table);
  check.topk = p.topk;
  check.max_seq_len = p.max_seq_len;
  check.workspace_required = indexer_select_workspace_bytes(p.rank, 1, p.max_seq_len, B);
  check.workspace_bytes = p.workspace ? p.workspace_bytes : 0;
  check.workspace_hint = "indexer_select_workspace_bytes(rank, 1, max_seq_len, num_requests)";
  if (p.max_seq_len > kMaxIndexerSeqLen)  // before validate_step: its workspace rule would name the workspace
    return invalid_argument("indexer_select: max_seq_len = " + num(p.max_seq_len) + ", expected <= " +
                            num(kMaxIndexerSeqLen) + " (kMaxIndexerSeqLen: 65535 score-grid rows of 2048 regions)");
  STEP5_RETURN_IF_ERROR(validate_step(check));
  STEP5_RETURN_IF_ERROR(topk_env_status());  // before the first launch of the step
  if (T == 0) return Status::Ok();
  STEP5_RETURN_IF_ERROR(require_non_null("indexer_select", {{"index_q", p.index_q}, {"weights", p.weights},
                                                            {"summary_cache", p.summary_cache}, {"topk_ids", p.topk_ids},
                                                            {"counts", p.counts}, {"workspace", p.workspace}}));
  // the score kernels' 16-byte loads of q rows and summary rows (P a multiple of 64) and the
  // wgmma kernel's bulk copies of summary rows
  // and the workspace: the plan's int32 tile starts, then the fp32 score rows that the selection
  // reads in 16-byte vectors (plan_bytes keeps them 16-byte aligned from an aligned base)
  STEP5_RETURN_IF_ERROR(require_aligned(
      "indexer_select", 16,
      {{"index_q", p.index_q}, {"summary_cache", p.summary_cache}, {"workspace", p.workspace}}));
  // and the element accesses: the score weights (fp32), the selection's int32 stores of ids and counts
  STEP5_RETURN_IF_ERROR(
      require_aligned("indexer_select", alignof(std::int32_t), {{"weights", p.weights}, {"topk_ids", p.topk_ids}, {"counts", p.counts}}));
  if (Il > kernels::sm90::kScoreCols)
    return unsupported("indexer_select: index_local_heads = " + num(Il) + ", expected <= " + num(kernels::sm90::kScoreCols));
  const SelectChunks chunks = indexer_select_chunks(p.rank, T, p.max_seq_len, B, p.workspace_bytes);
  // the selection grid of the longest chunk: its rows are int (every chunk is within one token of it)
  if (static_cast<std::int64_t>(chunks.max_tokens()) * lg > std::numeric_limits<int>::max())
    return invalid_argument("indexer_select: a chunk of " + num(chunks.max_tokens()) + " tokens x " + num(lg) +
                            " local KV groups = " + num(static_cast<std::int64_t>(chunks.max_tokens()) * lg) +
                            " selection rows, expected < 2^31");
  {
    // the score launches write fp32 scores into the workspace while other CTAs read index_q, the
    // weights and the summary cache; each chunk's top-k writes ids and counts while later chunks'
    // score launches still read them, and reads the workspace's scores
    const std::uint64_t rows = static_cast<std::uint64_t>(lg) * static_cast<std::uint64_t>(T);
    // the bytes written: the plan, then the longest chunk's scores
    const std::uint64_t ws_used = fixed + static_cast<std::uint64_t>(chunks.max_tokens()) *
                                              indexer_select_token_bytes(p.rank, p.max_seq_len);
    const auto step = step_array_ranges(p.batch.cu_seqlens_q, p.batch.seq_lens, p.table.block_table, B, p.table.max_blocks);
    STEP5_RETURN_IF_ERROR(require_disjoint(
        op,
        {{"workspace", p.workspace, ws_used},
         {"topk_ids", p.topk_ids, rows * static_cast<std::uint64_t>(p.topk + 1) * 4},
         {"counts", p.counts, rows * 4}},
        {{"index_q", p.index_q, static_cast<std::uint64_t>(T) * static_cast<std::uint64_t>(Il) * G.proxy_dim},
         {"weights", p.weights, static_cast<std::uint64_t>(T) * static_cast<std::uint64_t>(Il) * 4},
         {"summary_cache", p.summary_cache, summary_cache_bytes(p.table, G.proxy_dim)},
         step[0],
         step[1],
         step[2]}));
  }
  float* scores = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + fixed);
  int dev = 0, sms = 0;
  STEP5_CUDA_RETURN(cudaGetDevice(&dev));
  STEP5_RETURN_IF_ERROR(device_sm_count(dev, &sms));
  const ScorePlan sp = auto_score_plan<Id>(Il, T, B, ld, p.table.block_size, sms);
  if (sp.region_chunks > kMaxGridDimY)  // not reached up to kMaxIndexerSeqLen (static_assert above)
    return invalid_argument("indexer_select: max_seq_len = " + num(p.max_seq_len) + " gives " + num(sp.region_chunks) +
                            " chunks of " + num(sp.regions_per_cta) + " regions, expected <= " + num(kMaxGridDimY) +
                            " (score grid rows)");
  if (sp.tiles_upper > kMaxGridDimX)
    return invalid_argument("indexer_select: num_tokens = " + num(T) + " and num_requests = " + num(B) + " give " +
                            num(sp.tiles_upper) + " score tiles, expected < 2^31 (score grid columns)");
  const std::int32_t* tile_start = nullptr;
  STEP5_RETURN_IF_ERROR(score_tile_starts(sp, p.batch.cu_seqlens_q, B, static_cast<std::int32_t*>(p.workspace), stream,
                                          &tile_start));

  for (int k = 0; k < chunks.count; ++k) {
    const int t0 = chunks.begin(k), t1 = chunks.begin(k + 1);
    STEP5_RETURN_IF_ERROR(launch_scores<Id>(sp, score_args(p, tile_start, scores, ld, t0, t1), stream));
    kernels::sm90::TopkArgs t{};
    t.scores = scores;
    t.ld = ld;
    t.history = nullptr;
    t.cu_seqlens_q = p.batch.cu_seqlens_q;
    t.seq_lens = p.batch.seq_lens;
    t.num_requests = B;
    t.num_tokens = T;
    t.t0 = t0;
    t.lg = lg;
    t.topk = p.topk;
    t.ids = p.topk_ids;
    t.ld_ids = p.topk + 1;
    t.counts = p.counts;
    STEP5_RETURN_IF_ERROR(kernels::sm90::launch_topk(t, (t1 - t0) * lg, stream));  // rows < 2^31 (above)
  }
  return Status::Ok();
}

}  // namespace step5::ops::detail
