#pragma once
/// \file step5/kernels/sm90/indexer_scores.cuh
/// Indexer scores (SPEC.md §4.5) on the fp16 tensor cores (mma.sync m16n8k16, fp32 accumulation):
///   score[t, g, r] = Σ_{h<hpg_i} ReLU(<q_e4m3[t, g, h], S[r]>) · w[t, g, h]   (heads in order,
///   score = fma(relu_h, w_h, score) as the reference kernel and step5/reference/scores.hpp)
/// for every history region r < p_t / 8.
///
/// Why fp16: Hopper has no e4m3 mma.sync (ptxas emulates m16n8k32 e4m3 by converting both operands
/// to fp16 for every instruction, NVIDIA/cutlass#1986). Every e4m3 value is exactly an fp16 value,
/// so the kernel converts once instead: q when it is staged in shared memory, a summary fragment
/// once per 16-region m-tile (cvt.rn.f16x2.e4m3x2), whatever the number of q column tiles.
///
/// Work split: a *tile* is up to `tok_tile` consecutive tokens of one request (tok_tile · Il ≤ 128
/// mma columns here, 128 or 256 on the wgmma kernel; column = token · Il + head, so one pass over
/// a request's summaries serves all its local groups and all its MTP/prefill rows); grid (tiles,
/// region chunks). A CTA stages its tile's
/// q (as fp16), weights, the score row and history of each (token, group) and the block-table
/// entries of its regions in shared memory (decode tiles stage only their own columns); each warp
/// streams 16-region m-tiles of summaries straight from the paged cache into registers (16-byte
/// loads) and multiplies them with two n-tiles of q at a time.
/// The K order inside a row is permuted identically for A and B (quad lane c owns bytes
/// [64i + 16c, +16) of a row), which keeps loads 16-byte vectors and is exact for a dot product.
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
  int regions_per_cta;  // kScoreMinRegionsPerCta << j, <= kScoreMaxRegionsPerCta
  int cols_cap;         // tok_tile * Il rounded up to 8 (<= kScoreCols): staged q columns (wgmma
                        // plans: their tile width, not read by that kernel); the
                        // block-table entries of a CTA's regions (at most score_bt_cap, sized by
                        // the launcher) follow the weights in shared memory
  int longest_first;    // wgmma kernel: 1 = CTA x runs tile gridDim.x - 1 - x (ScorePlan::longest_first)
};

inline constexpr int kScoreWarps = 8;
/// Regions a CTA of the mma.sync score kernel walks: from one m-tile of 16 regions per warp up to
/// 16 m-tiles per warp; the plan (indexer_launch.cuh `score_plan`) halves the longest until the
/// grid fills the GPU's resident CTA slots.
inline constexpr int kScoreMinRegionsPerCta = 16 * kScoreWarps;
inline constexpr int kScoreMaxRegionsPerCta = 16 * kScoreMinRegionsPerCta;
inline constexpr int kScoreChunkRatio = kScoreMaxRegionsPerCta / kScoreMinRegionsPerCta;
static_assert((kScoreChunkRatio & (kScoreChunkRatio - 1)) == 0,
              "the plan halves kScoreMaxRegionsPerCta down to kScoreMinRegionsPerCta: a power-of-two ratio");
/// The region chunk of a decode plan (one token per request) where the fill rule keeps the longest,
/// kScoreMaxRegionsPerCta (at 132 SMs and 4 CTAs per SM: from batch 60 at 128K, 119 at 64K, 238
/// at 32K, 476 at 16K or less; one wave of CTAs that each walk their 2048 regions, about 100 µs at
/// 128K batch 64): 8 × as many CTAs balance unequal rows (requests at mixed depths, whose CTAs past
/// a short row exit at once) over the SMs. Measured (bench_indexer, one binary, H100, medians of 3,
/// bench/RESULTS.md forty-first session), 2048 → 256 at 128K batch 64: indexer_decode tp 1 135.7 →
/// 134.5 µs, mixed depths 101.8 → 81.0; tp 8 124.6 → 115.0, mixed 88.5 → 71.1. Large batches at
/// short contexts (batch 256 at 32K and the like) take it unmeasured. Not where the fill rule stops
/// shorter: 256 for every decode plan lost 3.4 % at tp 8 batch 16 at 128K (512 → 256) and 4.6 % at
/// tp 1 batch 128 at 32K (1024 → 256), and gained 5–6 % on mixed depths at batch 16.
inline constexpr int kScoreDecodeLongRegionsPerCta = 2 * kScoreMinRegionsPerCta;
static_assert(kScoreDecodeLongRegionsPerCta >= kScoreMinRegionsPerCta &&
                  kScoreDecodeLongRegionsPerCta < kScoreMaxRegionsPerCta &&
                  kScoreMaxRegionsPerCta % kScoreDecodeLongRegionsPerCta == 0,
              "the decode chunk is one of the plan's halvings of kScoreMaxRegionsPerCta");
/// Block-table entries a CTA of `regions_per_cta` regions stages (the pages its regions touch,
/// block_size a multiple of kRegionSize; +2: a chunk may start and end inside a page).
__host__ __device__ constexpr int score_bt_cap(int regions_per_cta, int block_size) {
  return regions_per_cta * layout::kRegionSize / block_size + 2;
}
inline constexpr int kScoreCols = 128;  // max mma columns (token x head) per CTA

/// Bytes of one staged q column in shared memory: P fp16 values and 16 bytes of padding (a row
/// stride of 16 mod 128 bytes: the quads' 32-byte fragment loads are bank-conflict free).
__host__ __device__ constexpr int score_q_row_bytes(int P) { return 2 * P + 16; }
/// Dynamic shared memory bytes of the score kernel for proxy dim P, `cols_cap` staged q columns
/// (an fp16 q row, a weight, and the score row and history of a column group) and `bt_cap` staged
/// block-table entries.
constexpr int score_smem_bytes(int P, int cols_cap, int bt_cap) {
  return cols_cap * (score_q_row_bytes(P) + 4 + 8) + bt_cap * 4;
}

__device__ __forceinline__ void mma_f16_16816(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                              std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// Two e4m3 values (bits [7:0] and [15:8] of `v`) as an fp16x2 word, exactly (every e4m3 value,
/// NaN included, is an fp16 value); `hi` selects the upper two bytes of `v`.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint32_t v, bool hi) {
  const unsigned short h = static_cast<unsigned short>(hi ? v >> 16 : v & 0xffffu);
  std::uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
  return r;
}

/// ReLU that keeps NaN (torch.relu): max.NaN(x, +0) — one instruction. A -0.0 input gives +0.0
/// where x < 0 ? 0 : x gives -0.0; the head sums it feeds start from +0.0 (SPEC §4 "Signed zero"),
/// and fma(±0, w, s) with s = +0.0 or s != 0 gives the same bits for either sign.
__device__ __forceinline__ float relu_keep_nan(float x) {
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
  return r;
}

/// Register epilogue of one n-tile `nt` (q columns nt·8 .. nt·8 + 7) of the 16-region m-tile at `rb`.
/// The m16n8 accumulator gives lane (g, c) columns 2c, 2c + 1 of rows (regions) rb + g and rb + g + 8,
/// i.e. heads 2c, 2c + 1 of one (token, group) column group: a group's hpg_i heads sit in kChain =
/// hpg_i / 2 consecutive lanes of a quad. The SPEC's sequential head sum (§4.5: score = fma(relu_h,
/// w_h, score), h in order, from +0.0) runs down that chain: lane j adds its two heads to the partial
/// sum of lane j - 1 (one shuffle per row and link), and the chain's last lane stores. hpg_i = 1:
/// every column is its own group.
template <int HPG>
__device__ __forceinline__ void score_epilogue(const ScoreArgs& a, const float (&acc)[4], const float* sw,
                                               const std::int32_t* srow, const std::int32_t* shist, int nt, int rb,
                                               int g, int c) {
  const float p0 = relu_keep_nan(acc[0]), p1 = relu_keep_nan(acc[1]);  // row g, heads 2c, 2c + 1
  const float p2 = relu_keep_nan(acc[2]), p3 = relu_keep_nan(acc[3]);  // row g + 8
  const float2 w = *reinterpret_cast<const float2*>(sw + nt * 8 + 2 * c);
  const int r0 = rb + g, r1 = rb + g + 8;
  if constexpr (HPG == 1) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int gc = nt * 8 + 2 * c + e;
      const int row = srow[gc], hist = shist[gc];
      const float we = e ? w.y : w.x;
      if (row >= 0) {
        float* dst = a.scores + static_cast<std::int64_t>(row) * a.ld;
        if (r0 < hist) dst[r0] = __fmaf_rn(e ? p1 : p0, we, 0.f);
        if (r1 < hist) dst[r1] = __fmaf_rn(e ? p3 : p2, we, 0.f);
      }
    }
  } else {
    constexpr int kChain = HPG / 2;
    const int link = c % kChain;  // position of this lane in its chain
    // seeded with +0.0 as the reference: a zero score is +0.0 (SPEC §4 "Signed zero")
    float in0 = 0.f, in1 = 0.f, s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int step = 0; step < kChain; ++step) {
      s0 = __fmaf_rn(p1, w.y, __fmaf_rn(p0, w.x, in0));
      s1 = __fmaf_rn(p3, w.y, __fmaf_rn(p2, w.x, in1));
      if (step + 1 < kChain) {
        const float u0 = __shfl_up_sync(0xffffffffu, s0, 1), u1 = __shfl_up_sync(0xffffffffu, s1, 1);
        if (link == step + 1) {
          in0 = u0;
          in1 = u1;
        }
      }
    }
    if (link == kChain - 1) {
      const int gc = (nt * 8 + 2 * c) / HPG;
      const int row = srow[gc], hist = shist[gc];
      if (row >= 0) {
        float* dst = a.scores + static_cast<std::int64_t>(row) * a.ld;
        if (r0 < hist) dst[r0] = s0;
        if (r1 < hist) dst[r1] = s1;
      }
    }
  }
}

/// Regions of history of the token at `position` that its score row holds: position / 8 (SPEC
/// §4.5), cut at the row's `a.ld` regions. Only a device seq_len beyond the step's max_seq_len
/// (whose score_ld sized the rows) reaches the cut; score_tile reports it in checked mode
/// (BoundsFault::kHistoryBeyondScoreRow), and the cut keeps every store inside its row.
__device__ __forceinline__ int score_row_regions(const ScoreArgs& a, int position) {
  const int n = position / layout::kRegionSize;
  return n > a.ld ? static_cast<int>(a.ld) : n;
}

/// The work of score CTA (tile, chunk): request b (its first token cu0 and `past` = seq_len - q_len
/// positions before its first query), the tokens [tb, te) (tile `tile` of `a.tok_tile` tokens of b,
/// clipped to the chunk [a.t0, a.t1)) and the history regions [r_begin, r_end) (region chunk `chunk`
/// of `a.regions_per_cta`, clipped to the history of the tile's last token). Returns false when the
/// CTA has nothing to do (uniform over the CTA). Shared by the mma.sync and the wgmma score kernels.
struct ScoreTile {
  int b, cu0, past, tb, te, r_begin, r_end;
};
/// (A decode step's tiles are its tokens and requests: tile t's request row is loaded before the
/// search, `request_guess`.)
__device__ __forceinline__ bool score_tile(const ScoreArgs& a, int tile, int chunk, ScoreTile& s) {
  const int B = a.num_requests;
  const int guess = request_guess(tile, B);
  const RequestRow guessed = load_request_row(a.cu_seqlens_q, a.seq_lens, guess);
  if (tile >= __ldg(a.tile_start + B)) return false;
  s.b = request_of_token(a.tile_start, B, tile);  // the last b with tile_start[b] <= tile (the same search)
  const RequestRow req = confirmed_request_row(guessed, guess, a.cu_seqlens_q, a.seq_lens, s.b);
  s.cu0 = req.cu0;
  const int cu1 = req.cu1;
  s.past = req.past();
  const int tb = s.cu0 + (tile - __ldg(a.tile_start + s.b)) * a.tok_tile;
  s.tb = max(tb, a.t0);
  s.te = min(min(tb + a.tok_tile, cu1), a.t1);
  if (s.tb >= s.te) return false;
  const int last = s.past + (s.te - 1 - s.cu0);  // position of the tile's last token
  if (chunk == 0 && last / layout::kRegionSize > a.ld)
    report_bounds_fault(a.bounds_fault, ops::BoundsFault::kHistoryBeyondScoreRow, s.b, last, static_cast<int>(a.ld));
  const int n_max = score_row_regions(a, last);  // history of the tile's last token
  s.r_begin = chunk * a.regions_per_cta;
  if (s.r_begin >= n_max) return false;
  s.r_end = min(s.r_begin + a.regions_per_cta, n_max);
  return true;
}

/// CTAs per SM the score kernel is compiled for (__launch_bounds__): 4 at proxy_dim <= 256 (<= 64
/// registers, no spills: 32 warps per SM to hide the summary loads; prefill tiles of 128 columns
/// are held to 3 by their shared memory), else 2 (a lane holds P/8 summary words).
__host__ __device__ constexpr int score_min_ctas(int P) { return P <= 256 ? 4 : 2; }

template <int P, int HPG>
__global__ void __launch_bounds__(kScoreWarps * 32, score_min_ctas(P)) indexer_scores_kernel(ScoreArgs a) {
  static_assert(P % 64 == 0 && P <= 512, "indexer_scores_kernel: proxy_dim must be a multiple of 64 (<= 512)");
  static_assert(HPG >= 1 && 8 % HPG == 0, "indexer_scores_kernel: hpg_i must divide 8 (1, 2, 4 or 8)");  // mma n8
#if STEP5_SM90A_DEVICE
  constexpr int R = layout::kRegionSize;
  constexpr int kRow = score_q_row_bytes(P);
  constexpr int kChunks = P / 64;
  // a name of its own: `extern __shared__` arrays of one name in one namespace are one entity, and
  // gemm_stream.cuh's `smem` is declared 128-byte aligned (nvcc warning #1886-D in a translation
  // unit that instantiates both, e.g. an engine's one .cu including step5/instantiate.cuh)
  extern __shared__ __align__(16) std::uint8_t score_smem[];
  std::uint8_t* sq = score_smem;
  float* sw = reinterpret_cast<float*>(score_smem + a.cols_cap * kRow);
  std::int32_t* srow = reinterpret_cast<std::int32_t*>(sw + a.cols_cap);  // [cols_cap / HPG] score row or -1
  std::int32_t* shist = srow + a.cols_cap;                                // [cols_cap / HPG] history regions
  std::int32_t* sbt = shist + a.cols_cap;

  pdl_wait();  // tile_start, index_q, weights and the summaries belong to the previous kernels
  ScoreTile st;
  if (!score_tile(a, blockIdx.x, blockIdx.y, st)) return;
  const int b = st.b, cu0 = st.cu0, past = st.past, tb = st.tb, te = st.te;
  const int ntok = te - tb;
  const int r_begin = st.r_begin, r_end = st.r_end;
  const int Il = a.Il;
  const int cols = ntok * Il;

  // stage q (converted to fp16) and weights of the tile, the score row and history of each (token, group) column
  // group, and the block-table entries of [r_begin, r_end)
  for (int idx = threadIdx.x; idx < a.cols_cap * (P / 16); idx += kScoreWarps * 32) {
    const int col = idx / (P / 16), ch = idx % (P / 16);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (col < cols)
      v = __ldg(reinterpret_cast<const uint4*>(a.index_q + (static_cast<std::int64_t>(tb) * Il + col) * P) + ch);
    // 16 e4m3 values -> 16 fp16 values, in order
    uint4* dst = reinterpret_cast<uint4*>(sq + col * kRow + ch * 32);
    dst[0] = make_uint4(e4m3x2_to_f16x2(v.x, false), e4m3x2_to_f16x2(v.x, true), e4m3x2_to_f16x2(v.y, false),
                        e4m3x2_to_f16x2(v.y, true));
    dst[1] = make_uint4(e4m3x2_to_f16x2(v.z, false), e4m3x2_to_f16x2(v.z, true), e4m3x2_to_f16x2(v.w, false),
                        e4m3x2_to_f16x2(v.w, true));
  }
  for (int col = threadIdx.x; col < a.cols_cap; col += kScoreWarps * 32)
    sw[col] = col < cols ? __ldg(a.weights + static_cast<std::int64_t>(tb) * Il + col) : 0.f;
  for (int gc = threadIdx.x; gc < a.cols_cap / HPG; gc += kScoreWarps * 32) {
    const int col0 = gc * HPG, tl = col0 / Il;
    const int t = tb + tl;
    srow[gc] = tl < ntok ? (t - a.t0) * a.lg + (col0 % Il) / HPG : -1;
    shist[gc] = tl < ntok ? score_row_regions(a, past + (t - cu0)) : 0;
  }
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

#pragma unroll 1
  for (int rb = r_begin + warp * 16; rb < r_end; rb += kScoreWarps * 16) {
    uint4 ra[kChunks], rc[kChunks];  // rows rb + g and rb + g + 8
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = rb + g + 8 * half;
      uint4* dst = half ? rc : ra;
      if (r < r_end) {
        const int page = r / slots;
        const std::int64_t blk = sbt[page - page0];
        const uint4* src = reinterpret_cast<const uint4*>(
            a.summary_cache + (blk * slots + (r - page * slots)) * P + c * 16);
#pragma unroll
        for (int i = 0; i < kChunks; ++i) dst[i] = __ldg(src + i * 4);
      } else {
#pragma unroll
        for (int i = 0; i < kChunks; ++i) dst[i] = make_uint4(0, 0, 0, 0);
      }
    }
    // two n-tiles (16 q columns) per pass: a summary fragment is converted once per pass, so a
    // decode tile of <= 16 columns (hpg_i * local groups <= 16) converts it exactly once
#pragma unroll 1
    for (int nt = 0; nt < n_tiles; nt += 2) {
      const bool two = nt + 1 < n_tiles;  // uniform over the CTA
      const std::uint8_t* qb0 = sq + (nt * 8 + g) * kRow + c * 32;
      const std::uint8_t* qb1 = qb0 + 8 * kRow;
      float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        // this lane's 16 e4m3 values of chunk i (rows g, g + 8) and the matching 16 fp16 q values
        const std::uint32_t wa[4] = {ra[i].x, ra[i].y, ra[i].z, ra[i].w};
        const std::uint32_t wc[4] = {rc[i].x, rc[i].y, rc[i].z, rc[i].w};
        const uint4 q0a = *reinterpret_cast<const uint4*>(qb0 + i * 128);
        const uint4 q0b = *reinterpret_cast<const uint4*>(qb0 + i * 128 + 16);
        const std::uint32_t b0[8] = {q0a.x, q0a.y, q0a.z, q0a.w, q0b.x, q0b.y, q0b.z, q0b.w};
        std::uint32_t b1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (two) {
          const uint4 q1a = *reinterpret_cast<const uint4*>(qb1 + i * 128);
          const uint4 q1b = *reinterpret_cast<const uint4*>(qb1 + i * 128 + 16);
          b1[0] = q1a.x, b1[1] = q1a.y, b1[2] = q1a.z, b1[3] = q1a.w;
          b1[4] = q1b.x, b1[5] = q1b.y, b1[6] = q1b.z, b1[7] = q1b.w;
        }
#pragma unroll
        for (int st = 0; st < 4; ++st) {  // k16 step: bytes 4st .. 4st + 3 of the lane's 16
          const std::uint32_t a0 = e4m3x2_to_f16x2(wa[st], false), a1 = e4m3x2_to_f16x2(wc[st], false);
          const std::uint32_t a2 = e4m3x2_to_f16x2(wa[st], true), a3 = e4m3x2_to_f16x2(wc[st], true);
          mma_f16_16816(acc0, a0, a1, a2, a3, b0[2 * st], b0[2 * st + 1]);
          if (two) mma_f16_16816(acc1, a0, a1, a2, a3, b1[2 * st], b1[2 * st + 1]);
        }
      }
      score_epilogue<HPG>(a, acc0, sw, srow, shist, nt, rb, g, c);
      if (two) score_epilogue<HPG>(a, acc1, sw, srow, shist, nt + 1, rb, g, c);
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
