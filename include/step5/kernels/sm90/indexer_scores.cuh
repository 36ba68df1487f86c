#pragma once
/// \file step5/kernels/sm90/indexer_scores.cuh
/// Indexer scores (SPEC.md §4.5) on e4m3 tensor cores (mma.sync m16n8k32, fp32 accumulation):
///   score[t, g, r] = Σ_{h<hpg_i} ReLU(<q_e4m3[t, g, h], S[r]>) · w[t, g, h]   (heads in order,
///   score = fma(relu_h, w_h, score) as the reference kernel and step5/reference/scores.hpp)
/// for every history region r < p_t / 8.
///
/// Work split: a *tile* is up to `tok_tile` consecutive tokens of one request (tok_tile · Il ≤ 128
/// mma columns, column = token · Il + head, so one pass over a request's summaries serves all its
/// local groups and all its MTP/prefill rows); grid (tiles, region chunks). A CTA stages its tile's
/// q (e4m3), weights and the block-table entries of its regions in shared memory (decode tiles stage
/// only their own columns); each warp streams 16-region m-tiles of summaries straight from the paged
/// cache into registers (A fragments) and multiplies them with every n-tile of q.
/// The K order inside a 256-byte row is permuted identically for A and B (thread quad lane c reads
/// bytes [64i + 16c, +16)), which keeps loads 16-byte vectors and is exact for a dot product.
/// Scores land in the fp32 workspace, row (t - t0)·lg + g, column r (row stride ld).
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include <cub/block/block_scan.cuh>

#include "step5/kernels/sm90/indexer_prepare.cuh"
#include "step5/layout/geometry.hpp"  // kRegionSize

namespace step5::kernels::sm90 {

struct ScoreArgs {
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* seq_lens;
  const std::int32_t* tile_start;  // [B+1] prefix of ceil(q_len / tok_tile)
  int num_requests, tok_tile;
  const std::int32_t* block_table;
  int max_blocks, block_size, num_blocks;
  std::int32_t* bounds_fault;   // checked-mode record (bounds_fault.cuh) or null
  const std::uint8_t* index_q;  // [T, Il, P]
  const float* weights;         // [T, Il]
  const std::uint8_t* summary_cache;
  int lg, Il;
  int t0, t1;      // token chunk [t0, t1)
  float* scores;   // [(t1 - t0) * lg, ld]
  std::int64_t ld;
  int regions_per_cta;  // multiple of 16 * kScoreWarps
  int cols_cap;         // tok_tile * Il rounded up to 8 (<= kScoreCols): staged q columns; the
                        // block-table entries of a CTA's regions (<= regions_per_cta * 8 /
                        // block_size + 2, sized by the launcher) follow the weights in shared memory
};

inline constexpr int kScoreWarps = 8;
inline constexpr int kScoreCols = 128;  // max mma columns (token x head) per CTA

/// Dynamic shared memory bytes of the score kernel for proxy dim P, `cols_cap` staged q columns
/// and `bt_cap` staged block-table entries.
constexpr int score_smem_bytes(int P, int cols_cap, int bt_cap) { return cols_cap * (P + 64 + 4) + bt_cap * 4; }

__device__ __forceinline__ void mma_e4m3_16832(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                               std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float relu_keep_nan(float x) { return x < 0.f ? 0.f : x; }

template <int P, int HPG>
__global__ void __launch_bounds__(kScoreWarps * 32, 2) indexer_scores_kernel(ScoreArgs a) {
  static_assert(P % 64 == 0 && P <= 512, "indexer_scores_kernel: proxy_dim must be a multiple of 64 (<= 512)");
  static_assert(HPG >= 1 && 8 % HPG == 0, "indexer_scores_kernel: hpg_i must divide 8 (1, 2, 4 or 8)");  // mma n8
#if STEP5_SM90A_DEVICE
  constexpr int R = layout::kRegionSize;
  constexpr int kRow = P + 64;  // padded smem row (bank-conflict free fragment loads)
  constexpr int kChunks = P / 64;
  extern __shared__ __align__(16) std::uint8_t smem[];
  std::uint8_t* sq = smem;
  float* sw = reinterpret_cast<float*>(smem + a.cols_cap * kRow);
  std::int32_t* sbt = reinterpret_cast<std::int32_t*>(sw + a.cols_cap);

  const int tile = blockIdx.x;
  const int B = a.num_requests;
  pdl_wait();  // tile_start, index_q, weights and the summaries belong to the previous kernels
  if (tile >= __ldg(a.tile_start + B)) return;
  int lo = 0, hi = B - 1;  // last b with tile_start[b] <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(a.tile_start + mid) <= tile) lo = mid; else hi = mid - 1;
  }
  const int b = lo;
  const int cu0 = __ldg(a.cu_seqlens_q + b), cu1 = __ldg(a.cu_seqlens_q + b + 1);
  const int past = __ldg(a.seq_lens + b) - (cu1 - cu0);
  int tb = cu0 + (tile - __ldg(a.tile_start + b)) * a.tok_tile;
  int te = min(tb + a.tok_tile, cu1);
  tb = max(tb, a.t0);
  te = min(te, a.t1);
  if (tb >= te) return;
  const int ntok = te - tb;
  const int n_max = (past + (te - 1 - cu0)) / R;  // history of the tile's last token
  const int r_begin = blockIdx.y * a.regions_per_cta;
  if (r_begin >= n_max) return;
  const int r_end = min(r_begin + a.regions_per_cta, n_max);
  const int Il = a.Il;
  const int cols = ntok * Il;

  // stage q (e4m3) and weights of the tile, and the block-table entries of [r_begin, r_end)
  for (int idx = threadIdx.x; idx < a.cols_cap * (P / 16); idx += kScoreWarps * 32) {
    const int col = idx / (P / 16), ch = idx % (P / 16);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (col < cols)
      v = __ldg(reinterpret_cast<const uint4*>(a.index_q + (static_cast<std::int64_t>(tb) * Il + col) * P) + ch);
    *reinterpret_cast<uint4*>(sq + col * kRow + ch * 16) = v;
  }
  for (int col = threadIdx.x; col < a.cols_cap; col += kScoreWarps * 32)
    sw[col] = col < cols ? __ldg(a.weights + static_cast<std::int64_t>(tb) * Il + col) : 0.f;
  // block ids of the regions [r_begin, r_end); a slot outside the row or an id outside
  // [0, num_blocks) is reported (checked mode) and staged as block 0, so the main loop below
  // stays free of bounds tests and never reads out of bounds (the regions of such a slot score
  // block 0's summaries: a broken precondition, whose scores are meaningless either way)
  const int page0 = R * r_begin / a.block_size;
  const int pages = (R * r_end - 1) / a.block_size - page0 + 1;  // <= bt_cap (launcher)
  for (int i = threadIdx.x; i < pages; i += kScoreWarps * 32) {
    const std::int64_t blk = checked_block(a.block_table, a.max_blocks, a.block_size, a.num_blocks, b,
                                           (page0 + i) * a.block_size, a.bounds_fault);
    sbt[i] = blk < 0 ? 0 : static_cast<std::int32_t>(blk);
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int n_tiles = (cols + 7) / 8;
  const int slots = a.block_size / R;

  for (int rb = r_begin + warp * 16; rb < r_end; rb += kScoreWarps * 16) {
    uint4 ra[kChunks], rc[kChunks];  // rows rb + g and rb + g + 8
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = rb + g + 8 * half;
      uint4* dst = half ? rc : ra;
      if (r < r_end) {
        const std::int64_t blk = sbt[(R * r) / a.block_size - page0];
        const uint4* src = reinterpret_cast<const uint4*>(
            a.summary_cache + (blk * slots + (R * r % a.block_size) / R) * P + c * 16);
#pragma unroll
        for (int i = 0; i < kChunks; ++i) dst[i] = __ldg(src + i * 4);
      } else {
#pragma unroll
        for (int i = 0; i < kChunks; ++i) dst[i] = make_uint4(0, 0, 0, 0);
      }
    }
    for (int nt = 0; nt < n_tiles; ++nt) {
      const std::uint8_t* qb = sq + (nt * 8 + g) * kRow + c * 16;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const uint4 bq = *reinterpret_cast<const uint4*>(qb + i * 64);
        mma_e4m3_16832(acc, ra[i].x, rc[i].x, ra[i].y, rc[i].y, bq.x, bq.y);
        mma_e4m3_16832(acc, ra[i].z, rc[i].z, ra[i].w, rc[i].w, bq.z, bq.w);
      }
      // epilogue: ReLU of columns 2c, 2c+1 for rows g (acc0, acc1) and g + 8 (acc2, acc3); lane
      // c = 0 gathers row g, lane c = 1 row g + 8, then score = fma(relu_h, w_h, score) over h in order
      const float p0 = relu_keep_nan(acc[0]), p1 = relu_keep_nan(acc[1]);
      const float p2 = relu_keep_nan(acc[2]), p3 = relu_keep_nan(acc[3]);
      float v[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int srcl = (lane & ~3) + j;
        const float x0 = __shfl_sync(0xffffffffu, p0, srcl), x1 = __shfl_sync(0xffffffffu, p1, srcl);
        const float y0 = __shfl_sync(0xffffffffu, p2, srcl), y1 = __shfl_sync(0xffffffffu, p3, srcl);
        v[2 * j] = c == 0 ? x0 : y0;
        v[2 * j + 1] = c == 0 ? x1 : y1;
      }
      if (c < 2) {
        const int r = rb + g + 8 * c;
#pragma unroll
        for (int grp = 0; grp < 8 / HPG; ++grp) {
          float s = 0.f;  // seeded with +0.0 as the reference: a zero score is +0.0 (SPEC §4 "Signed zero")
#pragma unroll
          for (int h = 0; h < HPG; ++h) s = __fmaf_rn(v[grp * HPG + h], sw[nt * 8 + grp * HPG + h], s);
          const int col0 = nt * 8 + grp * HPG;
          const int tl = col0 / Il;
          if (tl < ntok) {
            const int t = tb + tl;
            const int hist = (past + (t - cu0)) / R;
            if (r < hist) {
              const int gi = (col0 % Il) / HPG;
              a.scores[(static_cast<std::int64_t>(t - a.t0) * a.lg + gi) * a.ld + r] = s;
            }
          }
        }
      }
    }
  }
  pdl_launch_dependents();
#endif
}

/// tile_start[b] = Σ_{b' < b} ceil(q_len_b' / tok_tile), b in [0, B]; one CTA.
inline constexpr int kPlanThreads = 256;
template <int kThreads = kPlanThreads>  // a template: defined in every instance TU without clashing
__global__ void __launch_bounds__(kThreads) indexer_plan_kernel(const std::int32_t* cu, int B, int tok_tile,
                                                                std::int32_t* tile_start) {
#if STEP5_SM90A_DEVICE
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  pdl_wait();  // tile_start may still be read by the previous chunk's or step's kernels
  int carry = 0;
  for (int base = 0; base < B; base += kThreads) {
    const int b = base + threadIdx.x;
    const int n = b < B ? (cu[b + 1] - cu[b] + tok_tile - 1) / tok_tile : 0;
    int ex, total;
    Scan(tmp).ExclusiveSum(n, ex, total);
    if (b < B) tile_start[b] = carry + ex;
    carry += total;
    __syncthreads();
  }
  pdl_launch_dependents();
  if (threadIdx.x == 0) tile_start[B] = carry;
#endif
}

}  // namespace step5::kernels::sm90
