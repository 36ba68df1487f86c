#pragma once
/// \file step5/kernels/sm90/indexer_scores_wgmma.cuh
/// Indexer PREFILL scores (SPEC.md §4.5) on the warpgroup tensor cores (wgmma.mma_async, the
/// summaries as the register operand A, q from shared memory, fp32 accumulators), warp-specialised:
///   score[t, g, r] = Σ_{h<hpg_i} ReLU(<q_e4m3[t, g, h], S[r]>) · w[t, g, h]   (heads in order,
///   score = fma(relu_h, w_h, score) from +0.0, as step5/reference/scores.hpp)
/// for every history region r < p_t / 8; scores land in the same fp32 workspace rows as the
/// mma.sync kernel's (indexer_scores.cuh): row (t - t0)·lg + g, column r (row stride ld), so the
/// selection is unchanged. The automatic choice for prefill chunks (indexer_launch.cuh
/// `kScoreWgmmaMinMeanQ`; a path can be forced through ScorePlan's `want`); decode shapes and any shape `score_wgmma_static_fit` /
/// `score_wgmma_il_fits` refuse keep the mma.sync kernel; ScorePlan::path says which one ran.
///
/// Operand type (template `KIND`):
///  * ScoreMma::kF16 (the operand type when the wgmma path is chosen): e4m3 -> f16 (every e4m3
///    value, NaN included, is an f16 value, cvt.rn.f16x2.e4m3x2) once for q while staging B and for
///    the summaries while building the A fragments, wgmma m64n128k16 .f32.f16.f16: the products
///    are exact and the accumulation is the fp32 tensor-core accumulation of the mma.sync path.
///  * ScoreMma::kE4m3: e4m3 as it is, wgmma m64n128k32 .f32.e4m3.e4m3 (twice the
///    rate). Hopper adds an e4m3 instruction's 32 products and the accumulator with ~14 significant
///    bits, truncated (DeepSeek-V3 report §3.5.2; DeepGEMM issues 37/50), i.e. relative errors up to
///    ~1e-3 at P = 256 where the tests (and the selection's ties within rounding) expect ~1e-6:
///    NOT used by default; `ScorePath::kWgmmaE4m3` forces it (benchmark, measurements).
///
/// GEMM view, per CTA: M = history regions (A = summaries, gathered from the PAGED cache),
/// N = kWgScoreCols = 128 (token, head) columns of one tile of tokens of one request (B = q),
/// K = P (proxy_dim). B K-major (the only layout e4m3 has; for f16 the natural one: a q row is
/// K-contiguous). The wide tile, N = kWgScoreWideCols = 256 (f16 only, `ScorePath::kWgmmaF16N256`,
/// the automatic choice where a CTA's history is long: indexer_launch.cuh `score_wide_tiles_pay`),
/// reads each summary tile once for twice the columns: two m64n128k16 halves, 128 accumulators per consumer thread (setmaxnreg
/// moves registers from the producer warpgroup to the consumers), the chains' rows / histories
/// read from shared memory in the epilogue, a ring of 4 stages (B takes 128 KB at P = 256).
///
/// Column order (B rows): n = (tg·(Il/2) + h/2)·8 + 2·c + (h % 2) for token tl = 4·tg + c of the
/// tile (c < 4) and local index head h < Il (Il = lg·hpg_i, even). In the wgmma D fragment the
/// thread with lane%4 = c holds, for every n8 block j, columns 8j + 2c and 8j + 2c + 1 (two fp32
/// registers per row, rows lane/4 and lane/4 + 8 of its warp's 16) — with this order those are
/// heads 2(j % (Il/2)) and 2(j % (Il/2)) + 1 of token 4·(j / (Il/2)) + c. So ONE thread holds ALL
/// Il heads of its token of every token group tg (4 tokens per group), for both of its rows, and
/// the epilogue runs the SPEC's sequential head chain (fma per head, heads in order) in registers,
/// no shuffles: the (token, group) chain f = gg·4 + c, gg = tg·lg + g, uses the blocks
/// j = gg·hpg_i/2 + jj, jj < hpg_i/2 (= tg·Il/2 + (g·hpg_i + 2jj)/2), in each block first the even
/// head (register 4j + 2·row_half), then the odd one (+1): heads g·hpg_i, g·hpg_i + 1, ... in order.
/// Tokens per tile = N / Il (N = 128, Il = 4: 32, 8: 16, 16: 8, 32: 4); needs 4·Il | N.
///
/// K order: both operands hold the K elements of a row in the same permuted order (exact for a dot
/// product), chosen so that quad lane c (lane % 4) of every warp finds all of its A-fragment
/// values of four f16 instructions (two e4m3 ones) in the 16 bytes [64·m + 16·c, +16) of a raw
/// summary row: one 16-byte shared-memory load per row and m. Word u (bytes 4u..4u+3) of that
/// piece is, for f16, instruction s = 4m + u, its low two bytes the fragment's k 2c, 2c + 1 and its
/// high two bytes k 2c + 8, 2c + 9; for e4m3, instruction s = 2m + u/2, k 4c..4c + 3 (u even) or
/// 16 + 4c..16 + 4c + 3 (u odd). `score_wg_stage_b` writes q (B) in that order.
///
/// Shared memory: B, q of the tile's columns (converted once for f16), K-major in the 128B swizzle
/// (wgmma.cuh's contract: K-block kb of a tile of `rows` rows at byte kb·rows·128, 16-byte chunk
/// ch of row i at chunk position ch ^ (i % 8), `sw128_offset`); instruction s reads K-block s/4 at
/// byte offset 32·(s % 4) (descriptor start = B + (s/4)·N·128 + 32·(s%4), SBO 1024). A ring of
/// `kStages` raw stages, each the 64 e4m3 summary rows of one tile, dense (row i at byte P·i),
/// filled by the producer warps' bulk copies (one per run of consecutive regions in one page,
/// completion on the stage's `full` mbarrier) and released by every thread of the consuming
/// warpgroup on its `empty` mbarrier once that thread's rows are in registers. The weights of the
/// columns (column order), and the score row / history of each (token, group) chain.
///
/// Work split: grid (tiles, region chunks) as the mma.sync kernel (`score_tile`), the tiles of a
/// chunk taken from the last (ScorePlan::longest_first: a causal chunk's last tiles see the
/// longest histories, and CTAs are dispatched in grid order); 384 threads: two
/// consumer warpgroups (threads 0..255) and a producer warpgroup. Tile i of the CTA's region chunk
/// (regions rb = r_begin + 64·i) goes through ring stage i % kStages, is filled by producer warp
/// i % 4 and consumed by consumer warpgroup i % 2. The producer warpgroup runs ahead by up to
/// kStages tiles; a producer warp, per tile: load the block-table entries of its next tile, wait
/// `empty`, arm `full` with the tile's bytes, one bulk copy per page run (checked mode: an
/// out-of-row slot or an id outside [0, num_blocks) is reported and reads block 0, as the
/// mma.sync kernel). A consumer warpgroup, per tile (steps numbered as in the kernel):
///   1. wait `full`; load its rows' K pieces (16-byte shared loads; rows past r_end are zero) and
///      release the stage (each thread arrives on `empty` after its own loads: its release
///      orders them before the producer's next bulk copy into the stage; an arrival per warp
///      after __syncwarp was reported by racecheck as hazards);
///   2. build the A fragments in registers (f16: cvt.rn.f16x2.e4m3x2, exact; e4m3: as loaded);
///   3-7. the wgmmas over K (P·esize/32 m64n128 instructions per part, A from registers, B from
///      shared memory, the first with scale-d = 0) and the register epilogue (ReLU, head chain,
///      masked stores r < p_t/8, token in the tile). The wide tile (256 columns) runs in two
///      accumulator halves, each half's epilogue running while the other half's wgmmas do:
///        3. issue the lower half (columns [0, N/2));  4. epilogue of the PREVIOUS tile's upper half;
///        5. wait, issue the upper half;               6. epilogue of the lower half;
///        7. wait (the upper half's epilogue is step 4 of the next tile, or after the loop).
///      The 128-column tile is one part: 3. issue, 5. wait, 6. epilogue (`score_wg_parts`).
/// Two accumulator halves: the columns [0, N/2) and [N/2, N) are separate m64n128 chains (k16
/// f16) with separate accumulators (64 registers each); every epilogue chain lies in one half
/// (its hpg_i/2 consecutive n8 blocks; `score_wgmma_static_fit` requires (N/parts) % (4·hpg_i) ==
/// 0), and a column's k order is the same in either width, so the bits are those of one m64nN
/// chain.
/// So a warpgroup keeps the tensor pipe busy through most of its own epilogue, and the other
/// warpgroup's steps 1-2 and 3-7 interleave with it; the summary loads of the next tiles are in
/// flight all the time (the ring).
///
/// Arithmetic (P = 256, f16, per 64-region tile × 128 columns): 16 × m64n128k16 = 2.1 M MAC = 1024
/// tensor cycles at 2048 f16 MAC/clk/SM; 16 KB of e4m3 summaries from L2 -> 256 FLOP per L2 byte
/// (2.3 TB/s of L2 at 600 TFLOP/s). Shared-memory traffic per tile: B 64 KB read by the wgmmas,
/// the 16 KB stage written by the copies and read once (A from registers: no A reads by the
/// wgmmas), ~96 KB per 1024 tensor cycles against 128 B/clk. Shared memory: B 64 KB (f16; e4m3
/// half) + kStages × 16 KB -> 1 CTA per SM. Score stores: lg·4 bytes per (token, region), 8
/// consecutive regions (32 bytes) per quarter-warp row: full sectors. The wide tile doubles the
/// MACs per stage (2048 tensor cycles per 16 KB stage, 512 FLOP per L2 byte) with the same summary
/// loads and A-fragment conversions per thread; B is 128 KB, ~160 KB of shared-memory traffic per
/// 2048 tensor cycles.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>  // std::integral_constant

#include "step5/core/cuda_check.hpp"  // kSm90MaxSmemPerCta
#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/bounds_fault.cuh"
#include "step5/kernels/sm90/indexer_scores.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/kernels/sm90/ptx.cuh"
#include "step5/kernels/sm90/wgmma.cuh"
#include "step5/layout/geometry.hpp"  // kRegionSize

namespace step5::kernels::sm90 {

/// Operand type of the wgmma score kernel (see the file comment).
enum class ScoreMma { kF16, kE4m3 };

inline constexpr int kWgScoreCols = 128;      ///< N: (token, head) columns per CTA (short histories: score_plan)
inline constexpr int kWgScoreWideCols = 256;  ///< N of the wide tile (ScorePath::kWgmmaF16N256, f16 only)
inline constexpr int kWgScoreRegions = 64;    ///< M: regions per tile (wgmma m64)
inline constexpr int kWgScoreConsumers = 256; ///< 2 consumer warpgroups
inline constexpr int kWgScoreProducerWarps = 4;  ///< one producer warpgroup
inline constexpr int kWgScoreThreads = kWgScoreConsumers + 32 * kWgScoreProducerWarps;
inline constexpr int kWgScoreMaxStages = 8;   ///< ring depth when shared memory allows
/// Wide tiles: the 128 accumulators, 64 A-fragment registers (f16, P = 256) and the epilogue of a
/// consumer thread exceed the kWgScoreLaunchRegs registers per thread that the launch allocates
/// (64K registers per SM over kWgScoreThreads threads, in units of 8; ptxas reports exactly this
/// count for a kernel that uses setmaxnreg), so the producer warpgroup lowers its limit to
/// kWgScoreWideProducerRegs and the consumers raise theirs to kWgScoreWideConsumerRegs
/// (setmaxnreg). A raise takes only registers that a lowering gave back to the CTA, so the
/// consumers' gain must not exceed the producers' release, or the consumers would wait forever.
inline constexpr int kWgScoreLaunchRegs = 65536 / kWgScoreThreads / 8 * 8;
inline constexpr int kWgScoreWideProducerRegs = 40;
inline constexpr int kWgScoreWideConsumerRegs = 232;
static_assert(kWgScoreConsumers * (kWgScoreWideConsumerRegs - kWgScoreLaunchRegs) <=
                  32 * kWgScoreProducerWarps * (kWgScoreLaunchRegs - kWgScoreWideProducerRegs),
              "wgmma scores: the consumers of a wide tile would raise their registers past what the producers release");

/// Bytes per staged B value of operand type K, and the wgmma instructions per tile (32 bytes of K
/// each) at proxy dim P.
template <ScoreMma K>
inline constexpr int kWgScoreElem = K == ScoreMma::kF16 ? 2 : 1;
template <int P, ScoreMma K>
inline constexpr int kWgScoreSteps = P * kWgScoreElem<K> / 32;

/// Shared-memory layout of the wgmma score kernel for proxy dim P, operand type K and N columns
/// (byte offsets from the 1024-aligned base; kBytes includes the 1024 bytes of alignment slack).
/// N has no default: every user names the tile width it lays out.
template <int P, ScoreMma K, int N>
struct WgScoreSmem {
  static constexpr int kRowBytes = P * kWgScoreElem<K>;      ///< bytes of K per B row
  static constexpr int kSteps = kWgScoreSteps<P, K>;         ///< wgmma instructions per tile
  static constexpr int kBBytes = N * kRowBytes;
  static constexpr int kStageBytes = kWgScoreRegions * P;    ///< one raw ring stage (e4m3 rows)
  static constexpr int kFixedBytes = kBBytes + 3 * N * 4 + 2 * kWgScoreMaxStages * 8 + 1024;
  /// even: stage s then always serves consumer warpgroup s % 2, which waits for the stage's
  /// phases in order (a waiter must never be two phases behind an mbarrier)
  static constexpr int kStages = std::min(kWgScoreMaxStages, (kSm90MaxSmemPerCta - kFixedBytes) / kStageBytes) & ~1;
  static constexpr int kRingOff = kBBytes;
  static constexpr int kWOff = kRingOff + kStages * kStageBytes;  ///< [N] fp32 weights
  static constexpr int kRowOff = kWOff + N * 4;
  static constexpr int kHistOff = kRowOff + N * 4;
  static constexpr int kBarOff = kHistOff + N * 4;                ///< full[kStages], empty[kStages]
  static constexpr int kBytes = kBarOff + 2 * kStages * 8 + 1024;
  static_assert(kRowBytes % 128 == 0, "wgmma scores: a B row of K must be whole 128-byte K-blocks");
  static_assert(kBBytes % 1024 == 0, "the B tile must stay 1024-byte aligned");
  static_assert(kStages >= 2 && kBytes <= kSm90MaxSmemPerCta, "wgmma scores: no room for a 2-stage ring");
  /// At least one stage per producer warp: a producer warp then waits on the `empty` phases of
  /// a stage in order. It reaches tile i (stage s = i % kStages, phase i / kStages - 1 of
  /// empty[s]) only after the release of its tile i - kWgScoreProducerWarps - kStages, by the same
  /// consumer warpgroup, which releases its tiles in order, so the release of tile i - 2·kStages
  /// (the phase before) is already complete; with fewer stages the parity wait could pass a phase
  /// early (e.g. 2 stages: tile 6's producer, waiting for the release of tile 4, would pass once
  /// tile 0 is released).
  static_assert(kStages >= kWgScoreProducerWarps && kWgScoreProducerWarps % 2 == 0,
                "wgmma scores: the ring needs a stage per producer warp");
};

/// The tiles the kernel has: kWgScoreCols columns of either operand type, kWgScoreWideCols of f16.
template <ScoreMma K, int N>
__host__ __device__ constexpr bool score_wgmma_has_tile() {
  return N == kWgScoreCols || (N == kWgScoreWideCols && K == ScoreMma::kF16);
}

/// The accumulator parts of an N-column tile (file comment, "Two accumulator halves"): the wide
/// tile runs as two m64n128 chains, each part's epilogue under the other's wgmmas; the 128-column
/// tile as one m64n128 chain, wait, epilogue (measured on an H100: its two m64n64 halves were 3 %
/// slower, bench/RESULTS.md twenty-second session; the wide tile's halves 7-9 % faster).
template <int N>
__host__ __device__ constexpr int score_wg_parts() {
  return N == kWgScoreWideCols ? 2 : 1;
}

/// Whether the wgmma score kernel supports proxy dim P, hpg_i and Il index-local heads at N
/// columns (compile-time part: P, hpg_i, operand type, `score_wgmma_has_tile`; run-time part: Il).
template <int P, int HPG, ScoreMma K, int N>
__host__ __device__ constexpr bool score_wgmma_static_fit() {
  return P % 64 == 0 && P <= 256 && (P * kWgScoreElem<K>) % 128 == 0 && HPG % 2 == 0 &&
         (N / score_wg_parts<N>()) % (4 * HPG) == 0 && score_wgmma_has_tile<K, N>();  // whole chains in each part
}
__host__ __device__ constexpr bool score_wgmma_il_fits(int Il, int hpg, int N) {
  return Il > 0 && hpg > 0 && Il % hpg == 0 && Il % 2 == 0 && N % (4 * Il) == 0;
}

/// (token in tile, local head) of B column n (the column order of the file comment); `half_il` = Il/2.
__host__ __device__ constexpr void score_wg_column(int n, int half_il, int& tl, int& h) {
  const int j = n >> 3, c = (n >> 1) & 3, e = n & 1;
  const int tg = j / half_il;
  tl = 4 * tg + c;
  h = 2 * (j - tg * half_il) + e;
}

/// The epilogue's reading of the accumulators against the column order, for N columns, hpg_i =
/// HPG and every Il that score_wgmma_il_fits takes (checked at compile time by the kernel). In the
/// m64nNk16 D fragment quad lane c holds columns 8j + 2c + e (e < 2) of every n8 block j (PTX ISA,
/// the wgmma D-fragment layout); the epilogue's chain gg of lane c reads blocks j = gg·HPG/2 + jj,
/// jj < HPG/2, and the weights of the same columns, and writes the score row of token
/// 4·(gg / lg) + c, group gg % lg (`srow`): each such column must be that token's head
/// (gg % lg)·HPG + 2jj + e, so the chain runs the group's heads in order. (The columns 8j + 2c + e
/// over all c, gg, jj, e are the N columns, each once.)
template <int N, int HPG>
constexpr bool score_wg_epilogue_matches_columns() {
  for (int Il = 2; Il <= N / 4; Il += 2) {
    if (!score_wgmma_il_fits(Il, HPG, N)) continue;
    const int lg = Il / HPG;
    for (int c = 0; c < 4; ++c)
      for (int gg = 0; gg < N / (4 * HPG); ++gg)
        for (int jj = 0; jj < HPG / 2; ++jj)
          for (int e = 0; e < 2; ++e) {
            int tl = 0, h = 0;
            score_wg_column(8 * (gg * (HPG / 2) + jj) + 2 * c + e, Il / 2, tl, h);
            if (tl != 4 * (gg / lg) + c || h != (gg % lg) * HPG + 2 * jj + e) return false;
          }
  }
  return true;
}

/// Stores the 64 e4m3 values v[c] (c < 4: pieces ci = 4m + c, K bytes [16·ci, +16), i.e. quad
/// lane c of the file comment's K order; together K bytes [64·m, +64)) of q column `row` into
/// the K-major 128B-swizzled B tile of ROWS rows at `tile`, each word where the A fragment's
/// matching word goes, one 16-byte store per chunk (word c of a chunk comes from piece c):
///   f16: instruction s = 4m + u (u < 4), chunk 0 the f16x2 of the low e4m3 pair of v[c]'s word
///        u (k 2c, 2c + 1), chunk 1 of its high pair (k 2c + 8, 2c + 9);
///   e4m3: instruction s = 2m + u/2, chunk u % 2 v[c]'s word u as it is (k 4c.. for u even,
///        16 + 4c.. for u odd).
template <ScoreMma K, int ROWS>
__device__ __forceinline__ void score_wg_stage_b(unsigned char* tile, int row, int m, const uint4 (&v)[4]) {
  auto word = [&](int c, int u) {
    return u == 0 ? v[c].x : u == 1 ? v[c].y : u == 2 ? v[c].z : v[c].w;
  };
  auto put = [&](int s, int chunk, const uint4& words) {  // chunk of instruction s's 32-byte window
    *reinterpret_cast<uint4*>(tile + (s >> 2) * (ROWS * 128) + wgmma::sw128_offset(row, 2 * (s & 3) + chunk)) = words;
  };
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    if constexpr (K == ScoreMma::kF16) {
#pragma unroll
      for (int e = 0; e < 2; ++e)
        put(4 * m + u, e,
            make_uint4(e4m3x2_to_f16x2(word(0, u), e), e4m3x2_to_f16x2(word(1, u), e),
                       e4m3x2_to_f16x2(word(2, u), e), e4m3x2_to_f16x2(word(3, u), e)));
    } else {
      put(2 * m + (u >> 1), u & 1, make_uint4(word(0, u), word(1, u), word(2, u), word(3, u)));
    }
  }
}

/// The A fragments (instruction s: registers a[s][0..3], the m16n8k16 / m16n8k32 A fragment of a
/// warp's rows g, g + 8) from this thread's pieces lo[m] (row g) and hi[m] (row g + 8) of the raw rows.
template <int P, ScoreMma K>
__device__ __forceinline__ void score_wg_a_fragments(const uint4 (&lo)[P / 64], const uint4 (&hi)[P / 64],
                                                     std::uint32_t (&a)[kWgScoreSteps<P, K>][4]) {
#pragma unroll
  for (int m = 0; m < P / 64; ++m) {
    const std::uint32_t wl[4] = {lo[m].x, lo[m].y, lo[m].z, lo[m].w};
    const std::uint32_t wh[4] = {hi[m].x, hi[m].y, hi[m].z, hi[m].w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if constexpr (K == ScoreMma::kF16) {
        a[4 * m + u][0] = e4m3x2_to_f16x2(wl[u], false);
        a[4 * m + u][1] = e4m3x2_to_f16x2(wh[u], false);
        a[4 * m + u][2] = e4m3x2_to_f16x2(wl[u], true);
        a[4 * m + u][3] = e4m3x2_to_f16x2(wh[u], true);
      } else {
        a[2 * m + (u >> 1)][2 * (u & 1)] = wl[u];
        a[2 * m + (u >> 1)][2 * (u & 1) + 1] = wh[u];
      }
    }
  }
}

/// One wgmma of an accumulator part: N / score_wg_parts<N>() = 128 columns of the tile (file
/// comment, "Two accumulator halves").
template <ScoreMma K>
__device__ __forceinline__ void score_wg_mma(float* acc, const std::uint32_t (&a)[4], std::uint64_t db, int scale_d) {
  if constexpr (K == ScoreMma::kF16) {
    wgmma::wgmma_m64n128k16_f16_rs(acc, a, db, scale_d);
  } else {
    wgmma::wgmma_m64n128k32_e4m3_rs(acc, a, db, scale_d);
  }
}

/// The page runs of one tile seen by one producer lane: runs j = lane and lane + 32 of tile
/// [rb, rb + rows) (run j: the regions of page rb / spb + j inside the tile; at most 64 runs, one
/// per region when a page holds one region), each with its block-table entry loaded.
struct ScoreWgRuns {
  int r0[2], r1[2];  // r0 >= r1: no run
  BlockEntry e[2];
};
__device__ __forceinline__ ScoreWgRuns score_wg_runs(const ScoreArgs& a, const ScoreTile& st, int rb, int rows,
                                                     int spb, int lane) {
  ScoreWgRuns u;
  const int page0 = rb / spb;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int j = lane + 32 * k;
    u.r0[k] = j == 0 ? rb : (page0 + j) * spb;
    u.r1[k] = min((page0 + j + 1) * spb, rb + rows);
    u.e[k] = u.r0[k] < u.r1[k]
                 ? load_block_entry(a.block_table, a.max_blocks, a.block_size, st.b, u.r0[k] * layout::kRegionSize)
                 : BlockEntry{-1, false};
  }
  return u;
}

/// Producer warp `pw` of kWgScoreProducerWarps: fills ring stage i % kStages with the raw
/// summaries of its tiles i = pw, pw + kWgScoreProducerWarps, ... (regions [rb, rb + 64) ∩
/// [r_begin, r_end)), one bulk copy per page run; the block-table entries of its next tile are
/// loaded while it waits for this tile's stage. The ring is the one of the N-column kernel.
template <int P, ScoreMma KIND, int N>
__device__ __forceinline__ void score_wg_produce(const ScoreArgs& a, const ScoreTile& st, std::uint32_t ring,
                                                 std::uint64_t* full, std::uint64_t* empty, int pw, int lane) {
  using L = WgScoreSmem<P, KIND, N>;
  constexpr int M = kWgScoreRegions, R = layout::kRegionSize, S = L::kStages, NP = kWgScoreProducerWarps;
  const int spb = a.block_size / R;  // regions per page (block_size a multiple of kRegionSize)
  int rb = st.r_begin + pw * M;
  if (rb >= st.r_end) return;
  ScoreWgRuns cur = score_wg_runs(a, st, rb, min(M, st.r_end - rb), spb, lane);
#pragma unroll 1
  for (int i = pw; rb < st.r_end; i += NP, rb += NP * M) {
    const int rows = min(M, st.r_end - rb), rb_next = rb + NP * M;
    ScoreWgRuns next{};
    if (rb_next < st.r_end) next = score_wg_runs(a, st, rb_next, min(M, st.r_end - rb_next), spb, lane);
    const int s = i % S;
    if (i >= S) ptx::mbar_wait(&empty[s], ((i / S) - 1) & 1);
    if (lane == 0) ptx::mbar_arrive_expect_tx(&full[s], static_cast<unsigned>(rows * P));
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (cur.r0[k] >= cur.r1[k]) continue;
      std::int64_t blk = check_block_entry(cur.e[k], a.num_blocks, st.b, cur.r0[k] * R, a.bounds_fault);
      if (blk < 0) blk = 0;  // reported (checked mode); scores of a broken precondition are meaningless
      ptx::bulk_copy_g2s(ring + s * L::kStageBytes + (cur.r0[k] - rb) * P,
                         a.summary_cache + (blk * spb + cur.r0[k] % spb) * P,
                         static_cast<std::uint32_t>((cur.r1[k] - cur.r0[k]) * P), &full[s]);
    }
    cur = next;
  }
}

/// Launch: grid (tiles, region chunks) of `score_tile`, kWgScoreThreads threads,
/// WgScoreSmem<P, KIND, N>::kBytes of dynamic shared memory; a.tok_tile = N / Il,
/// a.summary_cache 16-byte aligned. N = kWgScoreCols or kWgScoreWideCols (score_plan chooses).
template <int P, int HPG, ScoreMma KIND, int N>
__global__ void __launch_bounds__(kWgScoreThreads, 1) indexer_scores_wgmma_kernel(ScoreArgs a) {
  static_assert(score_wgmma_static_fit<P, HPG, KIND, N>(),
                "indexer_scores_wgmma_kernel: unsupported proxy_dim / hpg_i / tile width");
  static_assert(score_wg_epilogue_matches_columns<N, HPG>(),
                "indexer_scores_wgmma_kernel: the epilogue's chains do not read the column order's heads in order");
#if STEP5_SM90A_DEVICE
  using L = WgScoreSmem<P, KIND, N>;
  constexpr int M = kWgScoreRegions, S = L::kStages;
  constexpr bool kWide = N == kWgScoreWideCols;
  extern __shared__ __align__(1024) unsigned char score_wg_smem[];
  const std::uint32_t raw = ptx::smem_u32(score_wg_smem);
  unsigned char* smem = score_wg_smem + (((raw + 1023u) & ~1023u) - raw);
  unsigned char* sB = smem;
  const unsigned char* ring = smem + L::kRingOff;
  float* sw = reinterpret_cast<float*>(smem + L::kWOff);                      // [N] weight of column n
  std::int32_t* srow = reinterpret_cast<std::int32_t*>(smem + L::kRowOff);    // [N / HPG] score row or -1
  std::int32_t* shist = reinterpret_cast<std::int32_t*>(smem + L::kHistOff);  // [N / HPG] history regions
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem + L::kBarOff);
  std::uint64_t* empty = full + S;

  pdl_wait();  // tile_start, index_q, weights and the summaries belong to the previous kernels
  ScoreTile st;
  const int tile = a.longest_first ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  if (!score_tile(a, tile, blockIdx.y, st)) return;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], kWgScoreConsumers / 2);  // every thread of the consuming warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
  }
  __syncthreads();
  if (threadIdx.x >= kWgScoreConsumers) {
    if constexpr (kWide) ptx::setmaxnreg_dec<kWgScoreWideProducerRegs>();
    score_wg_produce<P, KIND, N>(a, st, ptx::smem_u32(ring), full, empty, (threadIdx.x - kWgScoreConsumers) >> 5,
                              threadIdx.x & 31);
    pdl_launch_dependents();
    return;
  }
  if constexpr (kWide) ptx::setmaxnreg_inc<kWgScoreWideConsumerRegs>();

  const int ntok = st.te - st.tb, Il = a.Il, lg = a.lg, half_il = a.Il / 2;
  // B: q of the tile's tokens in column order and the K order of the file comment (zeros past
  // the tile), in items of 64 bytes [64·m, +64) of K of one column (four 16-byte loads, then
  // `score_wg_stage_b`'s 16-byte chunks): all of a thread's loads in flight before the first
  // store; then the weights in column order and the chains
  constexpr int kBItems = N * (P / 64), kBItemsPerThread = (kBItems + kWgScoreConsumers - 1) / kWgScoreConsumers;
  {
    uint4 q[kBItemsPerThread][4];
#pragma unroll
    for (int i = 0; i < kBItemsPerThread; ++i) {
      const int idx = threadIdx.x + i * kWgScoreConsumers;
      int tl, h;
      score_wg_column(idx / (P / 64), half_il, tl, h);
#pragma unroll
      for (int c = 0; c < 4; ++c) q[i][c] = make_uint4(0, 0, 0, 0);
      if (idx < kBItems && tl < ntok) {
        const uint4* src =
            reinterpret_cast<const uint4*>(a.index_q + (static_cast<std::int64_t>(st.tb + tl) * Il + h) * P) +
            4 * (idx % (P / 64));
#pragma unroll
        for (int c = 0; c < 4; ++c) q[i][c] = __ldg(src + c);
      }
    }
#pragma unroll
    for (int i = 0; i < kBItemsPerThread; ++i) {
      const int idx = threadIdx.x + i * kWgScoreConsumers;
      if (idx < kBItems) score_wg_stage_b<KIND, N>(sB, idx / (P / 64), idx % (P / 64), q[i]);
    }
  }
  for (int n = threadIdx.x; n < N; n += kWgScoreConsumers) {
    int tl, h;
    score_wg_column(n, half_il, tl, h);
    sw[n] = tl < ntok ? __ldg(a.weights + static_cast<std::int64_t>(st.tb + tl) * Il + h) : 0.f;
  }
  for (int f = threadIdx.x; f < N / HPG; f += kWgScoreConsumers) {
    const int gg = f >> 2, tl = 4 * (gg / lg) + (f & 3), g = gg % lg;
    const int t = st.tb + tl;
    srow[f] = tl < ntok ? (t - a.t0) * lg + g : -1;
    shist[f] = tl < ntok ? score_row_regions(a, st.past + (t - st.cu0)) : 0;
  }
  wgmma::fence_proxy_async_smem();
  ptx::named_barrier_sync(1, kWgScoreConsumers);

  const int wg = threadIdx.x >> 7, lt = threadIdx.x & 127;
  const int warp = lt >> 5, lane = lt & 31, c = lane & 3;
  const int row_lo = warp * 16 + (lane >> 2), row_hi = row_lo + 8;  // this thread's A rows in a tile
  const std::uint32_t sB_addr = ptx::smem_u32(sB);
  // this thread's epilogue constants: the score row / history of its chains f = gg·4 + c in
  // registers for the whole loop (128-column tiles; wide tiles, whose registers hold twice the
  // accumulators, read them from shared memory in the epilogue); the weights of its columns
  // 8j + 2c, 8j + 2c + 1 are read from shared memory in the epilogue
  constexpr int kChains = N / (4 * HPG);
  constexpr int kChainRegs = kWide ? 1 : kChains;
  const float2* wcol = reinterpret_cast<const float2*>(sw) + c;
  int row_of[kChainRegs], hist_of[kChainRegs];
  if constexpr (!kWide) {
#pragma unroll
    for (int gg = 0; gg < kChains; ++gg) {
      row_of[gg] = srow[gg * 4 + c];
      hist_of[gg] = shist[gg * 4 + c];
    }
  }
  // the accumulators of the tile's parts (file comment, "Two accumulator halves"): part H holds
  // columns [H·W, (H + 1)·W) in acc[H·W/2, (H + 1)·W/2), W = N / kParts = 128; its chains are
  // gg in [H·kChains/kParts, (H + 1)·kChains/kParts)
  constexpr int kParts = score_wg_parts<N>(), kW = N / kParts, kPartAcc = kW / 2;
  static_assert(kW == kWgScoreCols, "wgmma scores: parts of 128 columns (m64n128)");
  static_assert(kChains % kParts == 0 && kPartAcc == 4 * (kChains / kParts) * (HPG / 2),
                "wgmma scores: each accumulator part must hold whole epilogue chains");
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  std::uint32_t af[L::kSteps][4];  // the A fragments of the tile in flight

  // 3. the wgmmas of part H over K (A from registers, the first with scale-d = 0), one commit group
  auto mma_half = [&](auto half) {
    constexpr int H = decltype(half)::value;
    wgmma::fence_regs<kPartAcc>(acc + H * kPartAcc);
    wgmma::wgmma_fence();
#pragma unroll
    for (int k = 0; k < L::kSteps; ++k) {
      const std::uint64_t db =
          wgmma::make_desc_sw128(sB_addr + (k / 4) * (N * 128) + H * kW * 128 + (k % 4) * 32);
      score_wg_mma<KIND>(acc + H * kPartAcc, af[k], db, k > 0 ? 1 : 0);
    }
    wgmma::wgmma_commit();
  };
  // 4. the epilogue of part H of the tile at rb: rows rb + row_lo, + 8 of this warp; chains
  // f = gg·4 + c of the part (ReLU, the head chain in order, masked stores)
  auto epilogue_half = [&](auto half, int rb) {
    constexpr int H = decltype(half)::value;
    const int r0 = rb + row_lo, r1 = r0 + 8;
#pragma unroll
    for (int gg = H * (kChains / kParts); gg < (H + 1) * (kChains / kParts); ++gg) {
      int row, hist;
      if constexpr (kWide) {
        row = srow[gg * 4 + c];
        hist = shist[gg * 4 + c];
      } else {
        row = row_of[gg];
        hist = hist_of[gg];
      }
      // seeded with +0.0 as the reference: a zero score is +0.0 (SPEC §4 "Signed zero")
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int jj = 0; jj < HPG / 2; ++jj) {
        const int j = gg * (HPG / 2) + jj;
        const float2 w = wcol[4 * j];  // columns 8j + 2c (even head), 8j + 2c + 1 (odd head)
        s0 = __fmaf_rn(relu_keep_nan(acc[4 * j]), w.x, s0);
        s0 = __fmaf_rn(relu_keep_nan(acc[4 * j + 1]), w.y, s0);
        s1 = __fmaf_rn(relu_keep_nan(acc[4 * j + 2]), w.x, s1);
        s1 = __fmaf_rn(relu_keep_nan(acc[4 * j + 3]), w.y, s1);
      }
      if (row >= 0) {
        float* dst = a.scores + static_cast<std::int64_t>(row) * a.ld;
        if (r0 < hist) dst[r0] = s0;
        if (r1 < hist) dst[r1] = s1;
      }
    }
  };
  constexpr std::integral_constant<int, 0> kLo{};
  constexpr std::integral_constant<int, 1> kHi{};

  // the previous tile of this warpgroup, whose upper half awaits its epilogue; before the first,
  // a region past every history, so that the first tile's step 4 stores nothing (a branch around
  // it would be divergent to ptxas, which then serializes the wgmmas: C7518)
  constexpr int kNoTile = 1 << 30;
  [[maybe_unused]] int rb_prev = kNoTile;  // two parts only
#pragma unroll 1
  for (int i = wg, rb = st.r_begin + wg * M; rb < st.r_end; i += 2, rb += 2 * M) {
    // 1. this warp's rows of the stage, then the stage back to the producer
    const int s = i % S;
    ptx::mbar_wait(&full[s], (i / S) & 1);
    const unsigned char* stage = ring + s * L::kStageBytes;
    const int rows = st.r_end - rb;
    uint4 lo[P / 64], hi[P / 64];
#pragma unroll
    for (int m = 0; m < P / 64; ++m) {
      lo[m] = row_lo < rows ? *reinterpret_cast<const uint4*>(stage + row_lo * P + 64 * m + 16 * c) : make_uint4(0, 0, 0, 0);
      hi[m] = row_hi < rows ? *reinterpret_cast<const uint4*>(stage + row_hi * P + 64 * m + 16 * c) : make_uint4(0, 0, 0, 0);
    }
    ptx::mbar_arrive(&empty[s]);  // each thread after its own loads (release: they are complete)
    // 2. the A fragments (the previous tile's wgmmas, which read af, completed at its step 7).
    // ptxas does not follow that wait across the loop's back edge: without the (idle) wait here
    // it would serialize step 3 with step 4 (C7518).
    wgmma::wgmma_wait<0>();
    wgmma::fence_regs<kPartAcc>(acc + (kParts - 1) * kPartAcc);
    score_wg_a_fragments<P, KIND>(lo, hi, af);
    if constexpr (kParts == 2) {
      // 3. the lower half's wgmmas; 4. meanwhile the previous tile's upper-half epilogue
      mma_half(kLo);
      epilogue_half(kHi, rb_prev);
      // 5. the lower half complete, the upper half's wgmmas; 6. meanwhile the lower-half epilogue.
      // (Issuing the upper half before the lower one completes would put step 4's reads of the
      // upper accumulators inside the wgmmas' pipeline stage: ptxas serializes that too, C7515.)
      wgmma::wgmma_wait<0>();
      wgmma::fence_regs<kPartAcc>(acc);
      mma_half(kHi);
      epilogue_half(kLo, rb);
      // 7. the upper half complete before the loop's back edge (the accumulators it carries to
      // the next step 4 are then not in flight; else ptxas serializes, C7515)
      wgmma::wgmma_wait<0>();
      wgmma::fence_regs<kPartAcc>(acc + kPartAcc);
      rb_prev = rb;
    } else {
      // 3. the tile's wgmmas, 5. wait, 6. its epilogue (one part: nothing to overlap it with)
      mma_half(kLo);
      wgmma::wgmma_wait<0>();
      wgmma::fence_regs<kPartAcc>(acc);
      epilogue_half(kLo, rb);
    }
  }
  if constexpr (kParts == 2) epilogue_half(kHi, rb_prev);
  pdl_launch_dependents();
#endif
}

}  // namespace step5::kernels::sm90
