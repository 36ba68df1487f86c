#pragma once
/// \file step5/kernels/sm90/gemm_launch.cuh
/// Host launcher of the projection GEMM (step5/ops/gemm.hpp): precondition checks, path choice
/// (cuBLASLt / wgmma / split-K / generic), split-K planning, TMA descriptor encoding, launches. Inline
/// functions and templates only (any number of translation units may include it); the public
/// entry points `gemm_bf16`, `gemm_plan`, `gemm_workspace_bytes` are defined from these by
/// step5/instantiate.cuh (in step5::kernels, or in the one .cu of an engine that includes it).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>

#include "step5/core/cuda_check.hpp"
#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/gemm_cublaslt.cuh"
#include "step5/kernels/sm90/gemm_generic.cuh"
#include "step5/kernels/sm90/gemm_gemv.cuh"
#include "step5/kernels/sm90/gemm_stream.cuh"
#include "step5/kernels/sm90/gemm_wgmma.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/ops/gemm.hpp"

namespace step5::ops::gemm_detail {

namespace k90 = ::step5::kernels::sm90;

/// kAuto: T <= kWgmmaMinT runs the split-K stream path, larger T the wgmma path. Measured on
/// an H200 (K = 4096): the stream kernel's mma.sync main loop tops out near 170 TFLOP/s, so it
/// only wins while the GEMM is weight-bound (T <= 32); the wgmma path was faster from T = 64
/// (e.g. N = 3472, T = 256: 23.6 us wgmma vs 60 us stream).
inline constexpr std::int64_t kWgmmaMinT = 32;
/// Whether the wgmma kernel keeps one k-tile of wgmmas in flight (1) or drains each (0).
inline constexpr int kWgmmaInFlight = 1;
/// Minimum BK-tiles (64 K elements each) per split the planners choose (both split paths).
inline constexpr int kMinKTilesPerSplit = 4;
/// Most K splits the planners choose by themselves (a forced split_k may go up to k_tiles).
inline constexpr int kMaxAutoSplits = 16;

inline std::string s(std::int64_t v) { return std::to_string(v); }

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

struct DeviceInfo {
  int sms = 0;
};

inline Status device_info(int device, DeviceInfo* info) {
  STEP5_RETURN_IF_ERROR(k90::require_sm90a_build(device, "gemm_bf16"));
  STEP5_RETURN_IF_ERROR(device_sm_count(device, &info->sms));
  return Status::Ok();
}

// ---- split-K path configurations: the one table kGemmSplitKTiles (step5/ops/gemm.hpp) ------------
inline constexpr int kNumStreamKinds = static_cast<int>(sizeof(kGemmSplitKTiles) / sizeof(kGemmSplitKTiles[0]));

template <int BM, int BN, int ST>
inline constexpr int stream_smem() {
  return k90::StreamConfig<BM, BN>::kStageBytes * ST;
}

/// Marks `(instance, device)` prepared (dynamic smem attribute set) once; `fn` runs with `device`
/// current (cudaFuncSetAttribute and the occupancy queries apply to the current device: a plan for
/// another device used to set the current one's and mark `device` done).
template <class Fn>
inline Status prepare_once(std::atomic<std::uint64_t>& mask, int device, Fn&& fn) {
  const std::uint64_t bit = device < 64 ? (std::uint64_t{1} << device) : 0;
  if (bit && (mask.load(std::memory_order_acquire) & bit)) return Status::Ok();
  const DeviceScope scope(device);
  STEP5_RETURN_IF_ERROR(scope.status);
  STEP5_RETURN_IF_ERROR(fn());
  if (bit) mask.fetch_or(bit, std::memory_order_acq_rel);
  return Status::Ok();
}

template <int BM, int BN, int ST>
inline Status stream_blocks_per_sm(int device, int* bps) {
  static std::atomic<std::uint64_t> prepared{0};
  static std::atomic<int> cached{0};
  const auto kernel = &k90::gemm_stream_kernel<BM, BN, ST>;
  STEP5_RETURN_IF_ERROR(prepare_once(prepared, device, [&]() -> Status {
    STEP5_CUDA_RETURN(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, stream_smem<BM, BN, ST>()));
    int b = 0;
    STEP5_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, BM * 2, stream_smem<BM, BN, ST>()));
    cached.store(std::max(1, b));
    return Status::Ok();
  }));
  *bps = std::max(1, cached.load());
  return Status::Ok();
}

/// Calls `f(std::integral_constant<int, i>{})` for the run-time index `kind` of a table of `N`
/// compile-time tile kinds (one switch, instantiated once per entry); kInternal naming `what` for
/// an index outside [0, N).
template <int N, int I = 0, class F>
inline Status with_tile_kind(int kind, const char* what, F&& f) {
  if constexpr (I == N) {
    return Status(StatusCode::kInternal, std::string("gemm: bad ") + what + " " + std::to_string(kind));
  } else {
    if (kind == I) return f(std::integral_constant<int, I>{});
    return with_tile_kind<N, I + 1>(kind, what, f);
  }
}

/// with_tile_kind over the rows of kGemmSplitKTiles.
template <class F>
inline Status with_stream_kind(int kind, F&& f) {
  return with_tile_kind<kNumStreamKinds>(kind, "split-K tile kind", f);
}

inline Status stream_bps(int kind, int device, int* bps) {
  return with_stream_kind(kind, [&](auto i) {
    constexpr GemmTile t = kGemmSplitKTiles[decltype(i)::value];
    return stream_blocks_per_sm<t.w_rows, t.tokens, t.stages>(device, bps);
  });
}

// ---- split-K rules shared by both split paths ------------------------------------------------
/// Whether `counters` 4-byte arrival counters fit in the workspace's counter area.
inline bool counters_fit(std::int64_t counters) {
  return counters <= static_cast<std::int64_t>(kGemmCounterBytes / sizeof(unsigned));
}
/// Splits the planner may try for `k_tiles` BK-tiles: 1 .. this (>= kMinKTilesPerSplit each).
inline int max_auto_splits(int k_tiles) {
  return std::max(1, std::min(kMaxAutoSplits, k_tiles / kMinKTilesPerSplit));
}
/// A forced split factor as launched: at most one split per k-tile; 1 when the counters do not fit.
inline int forced_splits(int forced, int k_tiles, std::int64_t counters_per_split_launch) {
  if (!counters_fit(counters_per_split_launch)) return 1;
  return std::max(1, std::min(forced, k_tiles));
}
struct KSplit {
  int splits = 1, kt_per_split = 0;
};
/// `splits` normalised so that no split is empty: kt_per_split = ceil(k_tiles / splits), then
/// splits = ceil(k_tiles / kt_per_split) (e.g. 64 k-tiles at 5 splits -> 13 per split, 5 splits;
/// at 9 splits -> 8 per split, 8 splits).
inline KSplit normalise_split(int k_tiles, int splits) {
  KSplit r;
  r.kt_per_split = (k_tiles + splits - 1) / splits;
  r.splits = r.kt_per_split > 0 ? (k_tiles + r.kt_per_split - 1) / r.kt_per_split : 1;
  return r;
}
/// One rule for both split paths: kInvalidArgument naming the bytes when `p`'s workspace cannot
/// hold `needed` bytes (counters + partials) or is not 16-byte aligned.
inline Status check_workspace(const GemmParams& p, std::size_t needed, const char* path) {
  if (needed == 0) return Status::Ok();
  if (p.workspace == nullptr || p.workspace_bytes < needed || !aligned16(p.workspace))
    return invalid_argument(std::string("gemm_bf16: the ") + path + " path needs a zero-filled, 16-byte aligned workspace of " +
                            s(static_cast<std::int64_t>(needed)) + " bytes, got " +
                            s(static_cast<std::int64_t>(p.workspace_bytes)) + " bytes at " +
                            (p.workspace ? (aligned16(p.workspace) ? "a non-null pointer" : "a misaligned pointer")
                                         : "null") +
                            " (see gemm_workspace_bytes / gemm_plan)");
  return Status::Ok();
}

struct StreamPlan {
  int kind = 0;
  int tiles_n = 0, tiles_t = 0, splits = 1, kt_per_split = 0;
  std::size_t workspace = 0;
};


/// Relative cost (in "bytes per SM" units) of a stream-path launch: the per-SM weight and
/// L2 X bytes (or the mma work when larger) of the busiest SM plus the split-K partial traffic.
inline double stream_cost(std::int64_t T, std::int64_t N, std::int64_t K, int sms, const GemmTile& sk, int splits) {
  const double tiles = static_cast<double>((N + sk.w_rows - 1) / sk.w_rows) * static_cast<double>((T + sk.tokens - 1) / sk.tokens);
  const double blocks = tiles * splits;
  const double per_sm_blocks = std::ceil(blocks / sms);
  const double kchunk = static_cast<double>(K) / splits;
  const double bn_eff = static_cast<double>(std::min<std::int64_t>(sk.tokens, T));
  const double mem = sk.w_rows * kchunk * 2.0 + 0.4 * bn_eff * kchunk * 2.0;  // W from HBM, X from L2
  const double mma = 2.0 * sk.w_rows * sk.tokens * kchunk * 0.006;               // ~600 TFLOP/s vs 3.6 TB/s
  const double partial = splits > 1 ? 0.5 * 2.0 * blocks * sk.w_rows * sk.tokens * 4.0 / sms : 0.0;
  return per_sm_blocks * std::max(mem, mma) + partial;
}

inline StreamPlan plan_stream_kind(std::int64_t T, std::int64_t N, std::int64_t K, int sms, int kind, int forced) {
  StreamPlan p;
  p.kind = kind;
  const GemmTile& sk = kGemmSplitKTiles[kind];
  p.tiles_n = static_cast<int>((N + sk.w_rows - 1) / sk.w_rows);
  p.tiles_t = static_cast<int>((T + sk.tokens - 1) / sk.tokens);
  const int k_tiles = static_cast<int>((K + 63) / 64);
  const std::int64_t tiles = static_cast<std::int64_t>(p.tiles_n) * p.tiles_t;
  const int max_splits = counters_fit(tiles) ? max_auto_splits(k_tiles) : 1;
  int splits = 1;
  if (forced > 0) {
    splits = forced_splits(forced, k_tiles, tiles);
  } else {
    double best = 0;
    for (int sp = 1; sp <= max_splits; ++sp) {
      const double c = stream_cost(T, N, K, sms, sk, sp);
      if (sp == 1 || c < best * 0.98) {
        best = c;
        splits = sp;
      }
    }
    // The model counts bytes per SM, but a single CTA streaming a long K range keeps too few
    // bytes in flight: when the choice leaves fewer than 2 CTAs per SM, take the fewest splits
    // that give 2 per SM at a modelled cost within 5% (measured on an H200: o_proj, N = 4096,
    // K = 12288, T = 1 at 2 splits = 128 CTAs moved 1.4 TB/s; shapes running several CTAs per
    // SM moved 2.6-3.2 TB/s).
    if (tiles * splits < 2ll * sms) {
      for (int sp = splits + 1; sp <= max_splits; ++sp) {
        if (stream_cost(T, N, K, sms, sk, sp) > best * 1.05) continue;
        splits = sp;
        if (tiles * sp >= 2ll * sms) break;
      }
    }
  }
  const KSplit ks = normalise_split(k_tiles, splits);
  p.kt_per_split = ks.kt_per_split;
  p.splits = ks.splits;
  if (p.splits > 1)
    p.workspace = kGemmCounterBytes + static_cast<std::size_t>(tiles) * p.splits * sk.w_rows * sk.tokens * 4;
  return p;
}

/// The cheapest stream configuration for T (config > 0 forces kind config-1).
inline StreamPlan plan_stream(std::int64_t T, std::int64_t N, std::int64_t K, int sms, int config, int forced) {
  if (config > 0) return plan_stream_kind(T, N, K, sms, config - 1, forced);
  StreamPlan best;
  double best_cost = 0;
  bool have = false;
  for (int kind = 0; kind < kNumStreamKinds; ++kind) {
    const GemmTile& sk = kGemmSplitKTiles[kind];
    const std::int64_t want = std::min<std::int64_t>(T, 128);
    if (sk.tokens < want && sk.tokens < 128) continue;        // too few tokens per tile
    if (sk.tokens > 16 && sk.tokens >= 2 * T) continue;        // mostly empty token tiles
    const StreamPlan p = plan_stream_kind(T, N, K, sms, kind, forced);
    const double c = stream_cost(T, N, K, sms, sk, p.splits);
    if (!have || c < best_cost) {
      best = p;
      best_cost = c;
      have = true;
    }
  }
  return best;
}

// ---- wgmma path ---------------------------------------------------------------------------------
inline constexpr int kNumWgmmaKinds = static_cast<int>(sizeof(kGemmWgmmaTiles) / sizeof(kGemmWgmmaTiles[0]));

/// The kernel configuration of tile kind `kind` (a row of kGemmWgmmaTiles).
template <int kind>
using WgmmaKindConfig = k90::WgmmaConfig<kGemmWgmmaTiles[kind].tokens, kGemmWgmmaTiles[kind].w_rows,
                                         kGemmWgmmaTiles[kind].k_boxes, kGemmWgmmaTiles[kind].stages>;

/// Cost model of a wgmma launch, in estimated ns (the planner compares candidates; re-fit the
/// constants from bench_gemm's forced rows when the kernel changes: gemm_wgmma_sk<S>/ and
/// gemm_wgmma<kind>/ rows, or any kind × split through STEP5_BENCH_GEMM_CONFIG / _SPLIT_K, e.g.
/// tools/ab_gemm_narrow.sh sweep). Measurements cited: H200, bench/results/2026-12-01/issue14/
/// (ab_gemm_wgmma_splits.txt, ncu_gemm_wgmma_tp8_t64.txt; gemm_narrow_sweep.txt: every kind ×
/// splits 1..16 at tp 8, T = 64 / 128, step5_preview N = 3472, dsa_h64_kv8_d128 N = 2832, K = 4096;
/// gemm_narrow_rows.txt: the forced-kind / forced-split rows, tp 1 and tp 8, T = 64..256).
///  * SM time: a unit is kt_per_split stages on one SM; a stage costs the larger of its wgmma time
///    and its bytes at the CTA's streaming rate. wgmma time: kWgmmaKTileNs per 128×128×64 of work
///    with both consumer warpgroups busy (step5_preview tp 8, T = 64, 28 tiles × 64 k-tiles, one
///    per SM: 22.6 us = 353 ns per k-tile); 128×256 tiles at 0.9 of that (equal to 128×128 on
///    full waves at T = 1024/4096, 10-20 % ahead at T = 16384); a BM = 128 warpgroup without a
///    token row skips its wgmmas (T <= 64: half the work); a BM = 64 tile is 64 rows of work.
///    Streaming rate: a CTA keeps at most its ring in flight, ring bytes per kWgmmaRingRoundTripNs,
///    at most kWgmmaSmBytesPerNs (128×128 at 1 split: 28 CTAs × 64 k-tiles of 32 KB in 19.0 us);
///  * waves: the busiest SM runs ceil(units / sms) units (a second wave measured 30-50 % slower
///    at 140-170 units than one at 112, e.g. 128×128: 14.9 us at 4 splits, 21.4 at 5);
///  * HBM time: W (read once: the units of one weight tile's token tiles are adjacent, so they run
///    together and share W in L2) at a rate set by the bytes of each W row in flight at once,
///    window = stages × k_boxes × 128 B (the W box is 64 columns = 128 B of each 8 KB row, so a
///    CTA reads each row in 128-byte pieces; rows with more consecutive pieces in flight keep
///    DRAM pages open): rate = kWgmmaHbmBaseBytesPerNs + kWgmmaHbmBytesPerNsPerKB × window / 1 KB,
///    at most kWgmmaHbmMaxBytesPerNs. Fitted on the best split of each kind at T = 64 (step5_preview,
///    28.4 MB of W): 64×256 (640 B) 15.8 us = 1.80 TB/s, 128×128 (768 B) 14.8 us = 1.92 TB/s,
///    64×128×2 boxes (1 KB) 13.8 us = 2.06 TB/s, 64×128 (1152 B) 12.7 us = 2.24 TB/s; cuBLASLt's
///    choice (64×32 tiles, 64-wide K stages, "64xAUTO" ≈ 18 stages ≈ 2.3 KB, 110 CTAs, no split)
///    10.4 us = 2.74 TB/s. The SM and HBM times combine as sqrt(sm^2 + hbm^2), not max;
///  * split-K: the partials' write + read, 4 B per valid output element and split each way,
///    through L2 (kWgmmaL2BytesPerNs), plus kWgmmaReduceNsPerSplit per split. Fitted: past 2 splits
///    more splits did not pay at T = 64 although the model's SM time halves (64×128: 2 splits 12.7
///    us, 3: 15.4, 4: 14.2; 128×128: 14.8 / 17.2 / 14.9), so a split costs ~0.7 us. Why 3 splits
///    is worse than 2 and 4 (84 CTAs on 132 SMs, 22/22/20 k-tiles: not the balance, and one wave)
///    is not explained: the sweep shows it for 128-wide kinds on both shapes (dsa: 69 CTAs).
/// The automatic plan considers the 64-token kinds only for narrow shapes: T <= kWgmmaM64MaxT and
/// fewer 128 × 128 tiles than SMs (then the tiles leave SMs idle and the weight stream, not the
/// SMs' fill bandwidth, is the limit). Measured on an H200: the tp 8 fused shapes at T = 64..256
/// (N = 3472 / 2832, 23-56 such tiles) ran 12-35 % faster on them; step5_preview tp 1 (N = 18512,
/// 145+ tiles) ran slower (T = 128: 64 × 64 at 1 split 72 us, 128 × 128 60.6 us, cuBLASLt 47.9):
/// at 4-5 waves of 64-token tiles every SM streams X and W at once and the L2 → SM fill rate, not
/// in the model, limits. A forced config runs any kind at any T.
inline constexpr std::int64_t kWgmmaM64MaxT = 256;
/// Output tiles of tile kind `t` for a T × N result (token tiles × weight tiles).
inline std::int64_t wgmma_tiles(std::int64_t T, std::int64_t N, const GemmWgmmaTile& t) {
  return ((T + t.tokens - 1) / t.tokens) * ((N + t.w_rows - 1) / t.w_rows);
}
/// Whether the automatic plan considers the 64-token kinds for this shape (see kWgmmaM64MaxT;
/// kGemmWgmmaTiles[0] is the 128 × 128 kind).
inline bool wgmma_m64_eligible(std::int64_t T, std::int64_t N, int sms) {
  static_assert(kGemmWgmmaTiles[0].tokens == 128 && kGemmWgmmaTiles[0].w_rows == 128, "kind 0 is 128 x 128");
  return T <= kWgmmaM64MaxT && wgmma_tiles(T, N, kGemmWgmmaTiles[0]) < sms;
}
inline constexpr double kWgmmaKTileNs = 353.0;
inline constexpr double kWgmmaSmBytesPerNs = 120.0;
inline constexpr double kWgmmaRingRoundTripNs = 1600.0;
inline constexpr double kWgmmaHbmBaseBytesPerNs = 1500.0;
inline constexpr double kWgmmaHbmBytesPerNsPerKB = 550.0;
inline constexpr double kWgmmaHbmMaxBytesPerNs = 3300.0;
inline constexpr double kWgmmaL2BytesPerNs = 8000.0;
inline constexpr double kWgmmaReduceNsPerSplit = 700.0;

struct WgmmaPlan {
  int kind = 0;  ///< index into kGemmWgmmaTiles
  GemmWgmmaTile tile{};
  std::int64_t tiles = 0;  ///< tile.tokens × tile.w_rows output tiles
  int splits = 1, kt_per_split = 0;  ///< k-tiles of 64 × tile.k_boxes K elements
  std::size_t workspace = 0;
};

/// The stage k-tiles of K for tile kind `t`.
inline int wgmma_k_tiles(std::int64_t K, const GemmWgmmaTile& t) {
  const std::int64_t bk = 64LL * t.k_boxes;
  return static_cast<int>((K + bk - 1) / bk);
}

inline double wgmma_cost(std::int64_t T, std::int64_t N, std::int64_t K, int sms, const GemmWgmmaTile& t,
                         const KSplit& ks) {
  const std::int64_t bn = t.w_rows, bm = t.tokens;
  const std::int64_t n_tiles = (N + bn - 1) / bn;  // weight tiles (the split partials' width)
  const std::int64_t units = wgmma_tiles(T, N, t) * ks.splits;
  const double waves = static_cast<double>((units + sms - 1) / sms);
  // rows of wgmma work per tile: BM = 64 -> 64; BM = 128 -> the warpgroups with a token row
  const double rows = bm == 64 ? 64.0 : (T >= 128 ? 128.0 : 64.0 * static_cast<double>((T + 63) / 64));
  const double mma_ns = kWgmmaKTileNs * (rows / 128.0) * (bn / 128.0) * t.k_boxes * (bn >= 256 && bm == 128 ? 0.9 : 1.0);
  const double stage_bytes = static_cast<double>(bm + bn) * 128.0 * t.k_boxes;
  const double rate = std::min(kWgmmaSmBytesPerNs, stage_bytes * t.stages / kWgmmaRingRoundTripNs);
  const double load_ns = stage_bytes / rate;
  const double sm_ns = waves * ks.kt_per_split * std::max(mma_ns, load_ns);
  const double window_kb = static_cast<double>(t.stages) * t.k_boxes * 128.0 / 1024.0;  // bytes of a W row in flight
  const double hbm_rate = std::min(kWgmmaHbmMaxBytesPerNs, kWgmmaHbmBaseBytesPerNs + kWgmmaHbmBytesPerNsPerKB * window_kb);
  const double hbm_ns = 2.0 * static_cast<double>(N) * static_cast<double>(K) / hbm_rate;
  double cost = std::sqrt(sm_ns * sm_ns + hbm_ns * hbm_ns);
  if (ks.splits > 1)
    cost += 2.0 * 4.0 * ks.splits * static_cast<double>(T) * static_cast<double>(n_tiles * bn) / kWgmmaL2BytesPerNs +
            kWgmmaReduceNsPerSplit * ks.splits;
  return cost;
}

/// The plan for tile kind kGemmWgmmaTiles[kind]: `forced` > 0 splits (forced_splits rules), else
/// the cheapest split factor by wgmma_cost. The planner splits K only while the unsplit tiles
/// leave SMs idle (tiles < sms) and the counters fit.
inline WgmmaPlan plan_wgmma_kind(std::int64_t T, std::int64_t N, std::int64_t K, int sms, int kind, int forced) {
  WgmmaPlan p;
  p.kind = kind;
  p.tile = kGemmWgmmaTiles[kind];
  const std::int64_t n_tiles = (N + p.tile.w_rows - 1) / p.tile.w_rows;
  p.tiles = wgmma_tiles(T, N, p.tile);
  const int k_tiles = wgmma_k_tiles(K, p.tile);
  const std::int64_t counters = p.tiles * k90::kWgmmaCountersPerTile;
  int splits = 1;
  if (forced > 0) {
    splits = forced_splits(forced, k_tiles, counters);
  } else if (p.tiles < sms && counters_fit(counters)) {
    double best = 0;
    for (int sp = 1; sp <= max_auto_splits(k_tiles); ++sp) {
      const double c = wgmma_cost(T, N, K, sms, p.tile, normalise_split(k_tiles, sp));
      if (sp == 1 || c < best * 0.95) {  // a split must win by 5 % (the model is coarse)
        best = c;
        splits = sp;
      }
    }
  }
  const KSplit ks = normalise_split(k_tiles, splits);
  p.splits = ks.splits;
  p.kt_per_split = ks.kt_per_split;
  if (p.splits > 1) {
    const int slabs = static_cast<int>((T + 15) / 16);
    p.workspace = kGemmCounterBytes + sizeof(float) * static_cast<std::size_t>(k90::wgmma_partial_offset(
                                                          p.splits, 0, 0, static_cast<int>(n_tiles), slabs,
                                                          p.tile.w_rows));
  }
  return p;
}

/// The cheapest (tile kind, splits) by wgmma_cost (config > 0 forces kGemmWgmmaTiles[config - 1];
/// the 64-token kinds only where wgmma_m64_eligible; kind 0 = 128 × 128 is always a candidate).
/// With one split on full waves this is the earlier wave-efficiency rule (128×256 tiles counted at
/// 1/0.9 the rate of 128×128); below one wave it weighs splitting against the partial traffic.
inline WgmmaPlan plan_wgmma(std::int64_t T, std::int64_t N, std::int64_t K, int sms, int config, int forced) {
  if (config > 0) return plan_wgmma_kind(T, N, K, sms, config - 1, forced);
  WgmmaPlan best;
  double best_cost = 0;
  for (int kind = 0; kind < kNumWgmmaKinds; ++kind) {
    if (kGemmWgmmaTiles[kind].tokens == 64 && !wgmma_m64_eligible(T, N, sms)) continue;
    const WgmmaPlan p = plan_wgmma_kind(T, N, K, sms, kind, forced);
    const double c = wgmma_cost(T, N, K, sms, p.tile, KSplit{p.splits, p.kt_per_split});
    if (kind == 0 || c < best_cost) {
      best = p;
      best_cost = c;
    }
  }
  return best;
}

/// The largest workspace a wgmma launch without overrides (config = split_k = 0) with T in
/// [1, max_tokens] needs (kAuto runs T > kWgmmaMinT there; from T = 1 a forced kWgmma is covered
/// too). Beyond the T where every kind's tiles fill the SMs no launch splits: the scan stops.
inline std::size_t wgmma_workspace_max(std::int64_t max_tokens, std::int64_t n, std::int64_t k, int sms) {
  std::size_t best = 0;
  for (std::int64_t t = 1; t <= max_tokens; ++t) {
    std::int64_t fewest = -1;  // the fewest tiles any kind makes at t (tiles only grow with t)
    for (const GemmWgmmaTile& w : kGemmWgmmaTiles) {
      const std::int64_t tiles = wgmma_tiles(t, n, w);
      fewest = fewest < 0 ? tiles : std::min(fewest, tiles);
    }
    if (fewest >= sms) break;
    best = std::max(best, plan_wgmma(t, n, k, sms, 0, 0).workspace);
  }
  return best;
}

inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn(cudaError_t* err_out) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (err == cudaSuccess && q == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  if (fn == nullptr) *err_out = err == cudaSuccess ? cudaErrorSymbolNotFound : err;
  return fn;
}

inline Status make_map(CUtensorMap* map, const void* ptr, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                int box_rows, const char* what) {
  cudaError_t err = cudaSuccess;
  auto fn = encode_fn(&err);
  if (!fn) return cuda_status(err, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box, estr,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status(StatusCode::kCudaError, std::string("cuTensorMapEncodeTiled(") + what + ") failed with CUresult " +
                                              std::to_string(static_cast<int>(r)) + " (rows " + s(rows) +
                                              ", cols " + s(cols) + ", ld " + s(ld) + ")");
  return Status::Ok();
}

template <class Cfg, int kInFlight>
inline Status launch_wgmma_cfg(const GemmParams& p, const WgmmaPlan& wp, int sms, int device, cudaStream_t stream) {
  static std::atomic<std::uint64_t> prepared{0};
  const auto kernel = &k90::gemm_wgmma_kernel<Cfg, kInFlight>;
  STEP5_RETURN_IF_ERROR(prepare_once(prepared, device, [&]() -> Status {
    STEP5_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    return Status::Ok();
  }));
  CUtensorMap mx, mw;
  STEP5_RETURN_IF_ERROR(make_map(&mx, p.x, p.tokens, p.k, p.ldx, Cfg::kBM, "X"));
  STEP5_RETURN_IF_ERROR(make_map(&mw, p.w, p.n, p.k, p.ldw, Cfg::kBN, "W"));
  const std::int64_t units = wp.tiles * wp.splits;
  const int grid = static_cast<int>(std::min<std::int64_t>(units, sms));
  k90::WgmmaArgs a{};
  a.c = reinterpret_cast<__nv_bfloat16*>(p.c);
  a.T = static_cast<int>(p.tokens);
  a.N = static_cast<int>(p.n);
  a.K = static_cast<int>(p.k);
  a.ldc = p.ldc;
  a.splits = wp.splits;
  a.k_tiles_per_split = wp.kt_per_split;
  a.counters = wp.splits > 1 ? static_cast<unsigned*>(p.workspace) : nullptr;
  a.partials = wp.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kGemmCounterBytes) : nullptr;
  return k90::launch_kernel("gemm_wgmma_kernel launch", kernel, {dim3(grid), dim3(Cfg::kThreads), Cfg::kSmemBytes},
                           stream, mx, mw, a);
}

/// with_tile_kind over the rows of kGemmWgmmaTiles.
template <class F>
inline Status with_wgmma_kind(int kind, F&& f) {
  return with_tile_kind<kNumWgmmaKinds>(kind, "wgmma tile kind", f);
}

inline Status launch_wgmma(const GemmParams& p, const WgmmaPlan& wp, int device, int sms, cudaStream_t stream) {
  return with_wgmma_kind(wp.kind, [&](auto i) {
    // kWgmmaInFlight: 1 = one k-tile of wgmmas kept in flight (see gemm_wgmma.cuh).
    return launch_wgmma_cfg<WgmmaKindConfig<decltype(i)::value>, kWgmmaInFlight>(p, wp, sms, device, stream);
  });
}

template <int BM, int BN, int ST>
inline Status launch_stream_kind(const GemmParams& p, const StreamPlan& sp, cudaStream_t stream) {
  k90::StreamArgs a{};
  a.x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  a.w = reinterpret_cast<const __nv_bfloat16*>(p.w);
  a.c = reinterpret_cast<__nv_bfloat16*>(p.c);
  a.T = static_cast<int>(p.tokens);
  a.N = static_cast<int>(p.n);
  a.K = static_cast<int>(p.k);
  a.ldx = p.ldx;
  a.ldw = p.ldw;
  a.ldc = p.ldc;
  a.k_tiles_per_split = sp.kt_per_split;
  const std::size_t tiles = static_cast<std::size_t>(sp.tiles_n) * sp.tiles_t;
  a.counters = static_cast<unsigned*>(p.workspace);
  (void)tiles;
  a.partials = sp.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kGemmCounterBytes)
                             : nullptr;
  const dim3 grid(sp.tiles_n, sp.tiles_t, sp.splits);
  return k90::launch_kernel("gemm_stream_kernel launch", &k90::gemm_stream_kernel<BM, BN, ST>,
                           {grid, dim3(BM * 2), static_cast<std::size_t>(stream_smem<BM, BN, ST>())}, stream, a);
}

inline Status launch_stream(const GemmParams& p, const StreamPlan& sp, cudaStream_t stream) {
  return with_stream_kind(sp.kind, [&](auto i) {
    constexpr GemmTile t = kGemmSplitKTiles[decltype(i)::value];
    return launch_stream_kind<t.w_rows, t.tokens, t.stages>(p, sp, stream);
  });
}

/// The kGemv launch (gemm_gemv.cuh), the kernel of the plan's config (1: the CUDA cores, 2: the
/// tensor cores with X whole, 3: with X in windows; ops::gemm_gemv_pick, ops::gemm_auto_gemv_config): one CTA per SM (min(SMs, N) CTAs for the CUDA-core
/// kernel, min(SMs, ceil(N / 16)) for the tensor-core one; each a balanced share of the rows), a
/// weight ring of ops::gemm_gemv_ring(T, K, config) (its smem of dynamic shared memory).
template <typename Kernel>
inline Status launch_gemv_ring(Kernel kernel, const char* what, std::atomic<std::uint64_t>& prepared,
                               const GemmParams& p, int device, int sms, cudaStream_t stream) {
  STEP5_RETURN_IF_ERROR(prepare_once(prepared, device, [&]() -> Status {
    STEP5_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kGemmGemvCtaSmem)));
    return Status::Ok();
  }));
  const int config = gemm_gemv_pick(p.tokens, p.config);
  const GemmGemvRing ring = gemm_gemv_ring(p.tokens, p.k, config);
  if (ring.stages < kGemmGemvRingMinStages)  // gemm_gemv_eligible excludes this (make_plan)
    return Status(StatusCode::kInternal, "gemm_bf16: no gemv weight ring fits beside X for tokens = " + s(p.tokens) +
                                             ", k = " + s(p.k));
  k90::GemvArgs a{reinterpret_cast<const __nv_bfloat16*>(p.x), reinterpret_cast<const __nv_bfloat16*>(p.w),
                  reinterpret_cast<__nv_bfloat16*>(p.c), static_cast<int>(p.n), static_cast<int>(p.k), p.ldx, p.ldw,
                  p.ldc, static_cast<int>(p.tokens), static_cast<int>(ring.tile_k), static_cast<int>(ring.stages),
                  static_cast<int>(ring.row_bytes), static_cast<int>(gemm_gemv_ring_offset(p.tokens, p.k, config)),
                  static_cast<int>(gemm_gemv_x_window_k(p.k, config)), static_cast<int>(gemm_gemv_x_windows(p.k, config))};
  k90::LaunchShape shape;
  // the CUDA-core kernel balances the rows to one, the tensor-core one needs a row block (16) per CTA
  const std::int64_t units = config == kGemmGemvCudaCores ? p.n : (p.n + ring.rows - 1) / ring.rows;
  shape.grid = dim3(static_cast<unsigned>(std::min<std::int64_t>(sms, units)));
  shape.block = dim3(k90::kGemvRingThreads);
  shape.smem = static_cast<std::size_t>(ring.smem);
  return k90::launch_kernel(what, kernel, shape, stream, a);
}
template <int T>
inline Status launch_gemv_cuda_cores(const GemmParams& p, int device, int sms, cudaStream_t stream) {
  static std::atomic<std::uint64_t> prepared{0};
  return launch_gemv_ring(&k90::gemm_gemv_kernel<T>, "gemm_gemv_kernel launch", prepared, p, device, sms, stream);
}
template <int NT>
inline Status launch_gemv_mma(const GemmParams& p, int device, int sms, cudaStream_t stream) {
  static std::atomic<std::uint64_t> prepared{0};
  return launch_gemv_ring(&k90::gemm_gemv_mma_kernel<NT>, "gemm_gemv_mma_kernel launch", prepared, p, device, sms,
                          stream);
}
/// `config`: the plan's kGemv kernel (GemmPlan::config: the forced config's, or kAuto's gemm_auto_gemv_config).
inline Status launch_gemv(const GemmParams& params, int config, int device, int sms, cudaStream_t stream) {
  GemmParams p = params;
  p.config = config;
  static_assert(kGemmGemvMaxTokens == 2 * kGemmGemvTokenTile, "instances for T = 1 and one or two n8 tiles");
  if (gemm_gemv_pick(p.tokens, p.config) == kGemmGemvCudaCores) {  // T <= kGemmGemvCudaCoreMaxTokens (make_plan)
    static_assert(kGemmGemvCudaCoreMaxTokens == 4, "one CUDA-core instance per T up to kGemmGemvCudaCoreMaxTokens");
    switch (p.tokens) {
      case 1: return launch_gemv_cuda_cores<1>(p, device, sms, stream);
      case 2: return launch_gemv_cuda_cores<2>(p, device, sms, stream);
      case 3: return launch_gemv_cuda_cores<3>(p, device, sms, stream);
      case 4: return launch_gemv_cuda_cores<4>(p, device, sms, stream);
      default: break;
    }
    return Status(StatusCode::kInternal, "gemm_bf16: the CUDA-core gemv kernel with tokens = " + s(p.tokens));
  }
  if (p.tokens >= 1 && p.tokens <= kGemmGemvTokenTile) return launch_gemv_mma<1>(p, device, sms, stream);
  if (p.tokens > kGemmGemvTokenTile && p.tokens <= kGemmGemvMaxTokens) return launch_gemv_mma<2>(p, device, sms, stream);
  return Status(StatusCode::kInternal, "gemm_bf16: gemv path with tokens = " + s(p.tokens));
}

inline Status launch_generic(const GemmParams& p, cudaStream_t stream) {
  k90::GenericArgs a{reinterpret_cast<const __nv_bfloat16*>(p.x), reinterpret_cast<const __nv_bfloat16*>(p.w),
                     reinterpret_cast<__nv_bfloat16*>(p.c), p.tokens, p.n, p.k, p.ldx, p.ldw, p.ldc};
  const dim3 grid(static_cast<unsigned>((p.n + 63) / 64), static_cast<unsigned>((p.tokens + 63) / 64));
  return k90::launch_kernel("gemm_generic_kernel launch", &k90::gemm_generic_kernel<>, {grid, dim3(256)}, stream, a);
}

/// Checks sizes and pointers (not the device). Sets *fast to whether the fast paths apply and
/// *why to the first fast-path rule that fails.
inline Status check_params(const GemmParams& p, bool* fast, std::string* why) {
  if (p.tokens < 0 || p.n < 0 || p.k < 0)
    return invalid_argument("gemm_bf16: sizes must be >= 0, got tokens = " + s(p.tokens) + ", n = " + s(p.n) +
                            ", k = " + s(p.k));
  if (p.ldx < p.k) return invalid_argument("gemm_bf16: ldx = " + s(p.ldx) + " must be >= k = " + s(p.k));
  if (p.ldw < p.k) return invalid_argument("gemm_bf16: ldw = " + s(p.ldw) + " must be >= k = " + s(p.k));
  if (p.ldc < p.n) return invalid_argument("gemm_bf16: ldc = " + s(p.ldc) + " must be >= n = " + s(p.n));
  if (p.tokens == 0 || p.n == 0) {
    *fast = false;
    return Status::Ok();
  }
  if (p.x == nullptr && p.k > 0) return invalid_argument("gemm_bf16: x is null (tokens = " + s(p.tokens) + ")");
  if (p.w == nullptr && p.k > 0) return invalid_argument("gemm_bf16: w is null (n = " + s(p.n) + ")");
  if (p.c == nullptr) return invalid_argument("gemm_bf16: c is null (tokens = " + s(p.tokens) + ")");
  if (p.tokens > kGemmMaxDim || p.n > kGemmMaxDim || p.k > kGemmMaxDim)
    return invalid_argument("gemm_bf16: tokens, n, k must each be <= " + s(kGemmMaxDim) +
                            " (kGemmMaxDim: the kernels round them up to whole tiles in int32), got " + s(p.tokens) +
                            ", " + s(p.n) + ", " + s(p.k));
  if ((p.tokens + 63) / 64 > 65535)
    return invalid_argument("gemm_bf16: tokens = " + s(p.tokens) + " exceeds the supported maximum " + s(65535 * 64));
  // row t of X / C and row j of W start at t * ldx, t * ldc, j * ldw (int64 element offsets)
  STEP5_RETURN_IF_ERROR(require_strided_rows_fit("gemm_bf16", "ldx", p.tokens, p.ldx, p.k, 2));
  STEP5_RETURN_IF_ERROR(require_strided_rows_fit("gemm_bf16", "ldw", p.n, p.ldw, p.k, 2));
  STEP5_RETURN_IF_ERROR(require_strided_rows_fit("gemm_bf16", "ldc", p.tokens, p.ldc, p.n, 2));
  *why = "";
  if (p.k == 0) *why = "k == 0";
  else if (p.k % 8 != 0) *why = "k = " + s(p.k) + " is not a multiple of 8";
  else if (p.ldx % 8 != 0) *why = "ldx = " + s(p.ldx) + " is not a multiple of 8";
  else if (p.ldw % 8 != 0) *why = "ldw = " + s(p.ldw) + " is not a multiple of 8";
  else if (p.ldc % 2 != 0) *why = "ldc = " + s(p.ldc) + " is not even";
  else if (!aligned16(p.x)) *why = "x is not 16-byte aligned";
  else if (!aligned16(p.w)) *why = "w is not 16-byte aligned";
  else if ((reinterpret_cast<std::uintptr_t>(p.c) & 3u) != 0) *why = "c is not 4-byte aligned";
  *fast = why->empty();
  return Status::Ok();
}

/// `config`'s range on the path that runs it: 0 .. kNumWgmmaKinds on kWgmma, 0 .. kNumStreamKinds
/// on kSplitK (0 = by shape); other paths check their own (check_path_params).
inline Status check_config_range(GemmPath path, int config) {
  if (path == GemmPath::kWgmma && (config < 0 || config > kNumWgmmaKinds))
    return invalid_argument("gemm_bf16: config = " + s(config) + " for the wgmma path; expected 0.." + s(kNumWgmmaKinds));
  if (path == GemmPath::kSplitK && (config < 0 || config > kNumStreamKinds))
    return invalid_argument("gemm_bf16: config = " + s(config) + " for the split-K path; expected 0.." +
                            s(kNumStreamKinds));
  return Status::Ok();
}

/// The rules of a forced path, split_k and config that need no device (so that a machine without
/// a GPU refuses them as a GPU machine does): split_k >= 0, a GemmPath value, the fast-path
/// preconditions of a forced kSplitK / kWgmma / kGemv (`fast`, `why`: check_params'), a forced
/// path's config (check_config_range; kGemv's config, split_k, token, k and row limits), kCublasLt's
/// build and its config / split_k. kAuto's config is checked on the path it takes (make_plan).
inline Status check_path_params(const GemmParams& p, bool fast, const std::string& why) {
  if (p.split_k < 0) return invalid_argument("gemm_bf16: split_k = " + s(p.split_k) + " must be >= 0");
  const GemmPath path = p.path;
  if (path != GemmPath::kAuto && path != GemmPath::kGeneric && path != GemmPath::kSplitK &&
      path != GemmPath::kWgmma && path != GemmPath::kCublasLt && path != GemmPath::kGemv)
    return invalid_argument("gemm_bf16: path = " + s(static_cast<int>(path)) + ", expected 0..5 (GemmPath)");
  if ((path == GemmPath::kSplitK || path == GemmPath::kWgmma || path == GemmPath::kGemv) && !fast)
    return invalid_argument(std::string("gemm_bf16: the ") +
                            (path == GemmPath::kSplitK ? "split-K" : path == GemmPath::kWgmma ? "wgmma" : "gemv") +
                            " path needs 16-byte aligned x/w, k, ldx, ldw multiples of 8, even ldc: " + why);
  STEP5_RETURN_IF_ERROR(check_config_range(path, p.config));
  if (path == GemmPath::kGemv) {
    if (p.config < 0 || p.config > kGemmGemvTensorCoresWindowed || p.split_k > 1)
      return invalid_argument("gemm_bf16: config = " + s(p.config) + ", split_k = " + s(p.split_k) +
                              " with path kGemv; expected config 0 (by T), " + s(kGemmGemvCudaCores) +
                              " (the CUDA-core kernel), " + s(kGemmGemvTensorCores) + " (the tensor-core kernel) or " +
                              s(kGemmGemvTensorCoresWindowed) + " (the tensor-core kernel, X in windows) and split_k 0 or 1");
    if (!gemm_gemv_eligible(p.tokens, p.k, p.config))
      return invalid_argument("gemm_bf16: the gemv path runs 1.." + s(kGemmGemvMaxTokens) +
                              " tokens (its CUDA-core kernel, config " + s(kGemmGemvCudaCores) + ", 1.." +
                              s(kGemmGemvCudaCoreMaxTokens) + ") with X staged in at most " + s(kGemmGemvMaxSmem) +
                              " bytes of shared memory (gemm_gemv_smem_bytes) and k <= " + s(kGemmGemvMaxK) +
                              "; got tokens = " + s(p.tokens) +
                              ", k = " + s(p.k) + ", config = " + s(p.config));
    if (p.n > kGemmGemvMaxRows)
      return invalid_argument("gemm_bf16: the gemv path runs at most " + s(kGemmGemvMaxRows) +
                              " rows; got n = " + s(p.n));
  }
  if (path == GemmPath::kCublasLt) {
    if (!kHaveCublasLt)
      return unsupported("gemm_bf16: path kCublasLt, but step5 was built without cuBLASLt (STEP5_NO_CUBLASLT)");
    if (p.config != 0 || p.split_k > 1)
      return invalid_argument("gemm_bf16: config = " + s(p.config) + ", split_k = " + s(p.split_k) +
                              " with path kCublasLt; expected config 0 and split_k 0 or 1 (cuBLASLt plans itself)");
  }
  return Status::Ok();
}

inline Status resolve_device(const GemmParams& p, int* device) {
  return ::step5::resolve_device(p.device, "gemm_bf16: device", device);
}

struct FullPlan {
  GemmPlan plan;
  StreamPlan stream;
  WgmmaPlan wgmma;
#if !defined(STEP5_NO_CUBLASLT)
  const LtEntry* lt = nullptr;
  cublasLtHandle_t lt_handle = nullptr;
#endif
  int device = 0, sms = 0;
};

/// kAuto with `allow_cublaslt` (and no config / split_k override, k > 0) takes cuBLASLt whenever it
/// has an algorithm for the shape — there is no per-shape table. The evidence (H200, bench/RESULTS.md):
/// bench_gemm `gemm/` (this library's kernels) against `cublaslt/` in the same binary, on the
/// fused-projection shapes of step5_preview (tp 1, 8) and dsa_h64_kv8_d128 (tp 8): this library's
/// kernels at 0.46–0.98× of cuBLASLt's speed over T = 1 … 16384 (2026-11-30), 0.75–0.95× at
/// T = 1 / 64 / 256 / 4096 (2026-12-01, sixth session), with two near-ties the other way (1.01–1.02×
/// at step5_preview tp 1 T = 128, third session; 1.05× at dsa_h64_kv8_d128 tp 8 T = 1, sixth
/// session). The o_proj shapes were measured only inside the layer (bench_layer, sixth session,
/// `STEP5_BENCH_LAYER_CUBLASLT=0` A/B): cuBLASLt faster in 4 of 5 cases, 33.0 → 33.6 µs at tp 1
/// batch 64. This library's kernels stay the path for kAuto without cuBLASLt (not built, no
/// algorithm, allow_cublaslt = false, or an override), and every forced path. A cuBLASLt error
/// (handle, descriptor, heuristic) is returned, not hidden by a fallback.
/// kAuto takes kGemv before cuBLASLt where `gemm_auto_takes_gemv` (ops/gemm.hpp: T = 1 on weights
/// of 4 MiB and more, K 512 ... 12288; T = 2 ... 8 on weights of 22 MiB and more, K 4096; T = 9 ...
/// 16 on 128 MiB and more, K 4096; its kernel gemm_auto_gemv_config; the measurements are there).
inline bool auto_takes_cublaslt(const GemmParams& p) {
  return kHaveCublasLt && p.allow_cublaslt && p.config == 0 && p.split_k == 0 && p.k > 0;
}

inline Status make_plan(const GemmParams& p, FullPlan* fp) {
  bool fast = false;
  std::string why;
  STEP5_RETURN_IF_ERROR(check_params(p, &fast, &why));
  STEP5_RETURN_IF_ERROR(::step5::check_device_arg(p.device, "gemm_bf16: device"));  // also for an empty product
  fp->plan = GemmPlan{};
  if (p.tokens == 0 || p.n == 0) return Status::Ok();
  STEP5_RETURN_IF_ERROR(check_path_params(p, fast, why));  // before the device query
  STEP5_RETURN_IF_ERROR(resolve_device(p, &fp->device));
  DeviceInfo info;
  STEP5_RETURN_IF_ERROR(device_info(fp->device, &info));
  fp->sms = info.sms;
  GemmPath path = p.path;
  if (path == GemmPath::kCublasLt && p.k == 0) path = GemmPath::kGeneric;  // C = 0, no product to run
  if (path == GemmPath::kAuto && fast && p.config == 0 && p.split_k == 0 && gemm_auto_takes_gemv(p.tokens, p.n, p.k))
    path = GemmPath::kGemv;
#if !defined(STEP5_NO_CUBLASLT)
  if (path == GemmPath::kCublasLt || (path == GemmPath::kAuto && auto_takes_cublaslt(p))) {
    STEP5_RETURN_IF_ERROR(lt_entry(p, fp->device, &fp->lt, &fp->lt_handle));
    if (fp->lt->found) {
      path = GemmPath::kCublasLt;
    } else if (path == GemmPath::kCublasLt) {
      return unsupported("gemm_bf16: cuBLASLt has no algorithm for tokens = " + s(p.tokens) + ", n = " + s(p.n) +
                         ", k = " + s(p.k) + " (ldx " + s(p.ldx) + ", ldw " + s(p.ldw) + ", ldc " + s(p.ldc) + ")");
    }
  }
#endif
  if (path == GemmPath::kAuto) {
    if (!fast) {
      path = GemmPath::kGeneric;
    } else {
      path = p.tokens > kWgmmaMinT ? GemmPath::kWgmma : GemmPath::kSplitK;
    }
  }
  STEP5_RETURN_IF_ERROR(check_config_range(path, p.config));  // kAuto's choice (a forced path: already checked)
  if (path == GemmPath::kWgmma) {
    fp->wgmma = plan_wgmma(p.tokens, p.n, p.k, info.sms, p.config, p.split_k);
    fp->plan.split_k = fp->wgmma.splits;
    fp->plan.config = fp->wgmma.kind + 1;
    fp->plan.workspace_bytes = fp->wgmma.workspace;
  }
  if (path == GemmPath::kSplitK) {
    fp->stream = plan_stream(p.tokens, p.n, p.k, info.sms, p.config, p.split_k);
    if (fp->stream.tiles_t > kMaxGridDimY)  // grid.y; only a forced small-token config reaches it
      return invalid_argument("gemm_bf16: tokens = " + s(p.tokens) + " in tiles of " +
                              s(kGemmSplitKTiles[fp->stream.kind].tokens) + " tokens (split-K config " +
                              s(fp->stream.kind + 1) + ") is " + s(fp->stream.tiles_t) +
                              " token tiles, expected <= " + s(kMaxGridDimY) + " (grid.y); use config 0");
    if (fp->stream.splits > kMaxGridDimZ)  // grid.z; only a forced split_k on a very deep k reaches it
      return invalid_argument("gemm_bf16: split_k = " + s(p.split_k) + " gives " + s(fp->stream.splits) +
                              " K splits (split-K config " + s(fp->stream.kind + 1) + "), expected <= " +
                              s(kMaxGridDimZ) + " (grid.z)");
    int bps = 1;
    STEP5_RETURN_IF_ERROR(stream_bps(fp->stream.kind, fp->device, &bps));  // sets the smem limit
    fp->plan.split_k = fp->stream.splits;
    fp->plan.config = fp->stream.kind + 1;
    fp->plan.workspace_bytes = fp->stream.workspace;
  }
  if (path == GemmPath::kGemv)  // forced: the config's kernel (0: by T); kAuto's: gemm_auto_gemv_config
    fp->plan.config = p.path == GemmPath::kGemv ? gemm_gemv_pick(p.tokens, p.config) : gemm_auto_gemv_config(p.tokens, p.n, p.k);
  fp->plan.path = path;
  return Status::Ok();
}

inline Status plan(const GemmParams& p, GemmPlan* plan) {
  if (plan == nullptr) return invalid_argument("gemm_plan: plan is null");
  FullPlan fp;
  STEP5_RETURN_IF_ERROR(make_plan(p, &fp));
  *plan = fp.plan;
  return Status::Ok();
}

inline std::size_t workspace_bytes(std::int64_t max_tokens, std::int64_t n, std::int64_t k, int device) {
  if (max_tokens <= 0 || n <= 0 || k <= 0) return 0;
  if (!::step5::resolve_device(device, "gemm_workspace_bytes: device", &device).ok()) return 0;
  DeviceInfo info;
  if (!device_info(device, &info).ok()) return 0;
  std::size_t best = 0;
  const std::int64_t tmax = std::min(max_tokens, kWgmmaMinT);
  for (std::int64_t t = 1; t <= tmax; ++t) {
    best = std::max(best, plan_stream(t, n, k, info.sms, 0, 0).workspace);
  }
  // kAuto sends T > kWgmmaMinT to the wgmma path (a kSplitK forced at larger T is an override).
  best = std::max(best, wgmma_workspace_max(max_tokens, n, k, info.sms));
  // cuBLASLt (kAuto's choice when built in) uses up to kGemmCublasLtWorkspaceBytes after the counters
  if (kHaveCublasLt) best = std::max(best, kGemmCounterBytes + kGemmCublasLtWorkspaceBytes);
  return best;
}

/// C must not overlap X or W: every path writes C tile by tile while other CTAs (or cuBLASLt)
/// still read X and W (C == X at T = 2, N = K = 64: the CTA of one weight tile writes C's row 1,
/// X's row 1, before the CTA of another reads it). Nor may the workspace bytes the planned path
/// writes (split paths: counters and partials, [workspace, + plan bytes); cuBLASLt: its
/// algorithm's bytes after the counters) overlap X, W or C. Exact ranges, from the first to the
/// last byte of rows [0, T) of X and C and [0, N) of W. Checked after the plan and the workspace
/// checks (gemm_plan, which reads only the pointers' alignment, does not check it), before the
/// launch. kInvalidArgument naming both, nothing launched.
inline Status check_disjoint(const GemmParams& p, const FullPlan& fp) {
  const void* ws = nullptr;
  std::uint64_t ws_bytes = 0;
  if (fp.plan.path == GemmPath::kSplitK || fp.plan.path == GemmPath::kWgmma) ws = p.workspace, ws_bytes = fp.plan.workspace_bytes;
#if !defined(STEP5_NO_CUBLASLT)
  if (fp.plan.path == GemmPath::kCublasLt && fp.lt != nullptr && fp.lt->workspace > 0)
    ws = static_cast<const char*>(p.workspace) + kGemmCounterBytes, ws_bytes = fp.lt->workspace;
#endif
  return require_disjoint("gemm_bf16", {{"c", p.c, strided_rows_bytes(p.tokens, p.ldc, p.n, 2)}, {"workspace", ws, ws_bytes}},
                          {{"x", p.x, strided_rows_bytes(p.tokens, p.ldx, p.k, 2)},
                           {"w", p.w, strided_rows_bytes(p.n, p.ldw, p.k, 2)}});
}

inline Status launch(const GemmParams& p, cudaStream_t stream) {
  // a bad STEP5_PDL: refused first, whatever the path (the cuBLASLt launch does not pass through
  // the library's launch_kernel, which refuses it) and the sizes, as dsa_layer_run does
  STEP5_RETURN_IF_ERROR(pdl_env_status());
  FullPlan fp;
  STEP5_RETURN_IF_ERROR(make_plan(p, &fp));
  if (p.tokens == 0 || p.n == 0) return Status::Ok();
  const DeviceScope scope(fp.device);  // p.device when set (the stream's device), as cuBLASLt's path
  STEP5_RETURN_IF_ERROR(scope.status);
  if (fp.plan.path == GemmPath::kSplitK) STEP5_RETURN_IF_ERROR(check_workspace(p, fp.stream.workspace, "split-K"));
  if (fp.plan.path == GemmPath::kWgmma) STEP5_RETURN_IF_ERROR(check_workspace(p, fp.wgmma.workspace, "wgmma split-K"));
  STEP5_RETURN_IF_ERROR(check_disjoint(p, fp));
  switch (fp.plan.path) {
    case GemmPath::kGeneric: return launch_generic(p, stream);
    case GemmPath::kGemv: return launch_gemv(p, fp.plan.config, fp.device, fp.sms, stream);
    case GemmPath::kSplitK: return launch_stream(p, fp.stream, stream);
    case GemmPath::kWgmma: return launch_wgmma(p, fp.wgmma, fp.device, fp.sms, stream);
#if !defined(STEP5_NO_CUBLASLT)
    case GemmPath::kCublasLt: return launch_cublaslt(p, *fp.lt, fp.lt_handle, stream);
#endif
    default: break;
  }
  return Status(StatusCode::kInternal, "gemm_bf16: unknown path");
}

}  // namespace step5::ops::gemm_detail
