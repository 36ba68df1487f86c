#pragma once
/// \file step5/kernels/sm90/gemm_gemv.cuh
/// Weight-streaming projection for decode-sized T (T <= ops::kGemmGemvMaxTokens; SPEC §3/§4.1):
/// `C[T, N] = bf16(X[T, K] @ W[N, K]^T)`, fp32 accumulation. At small T the product is a few FLOP
/// per weight byte: the time is the weight stream, which wants as many bytes in flight as the
/// memory system holds and little else per byte. Two kernels:
///
/// Which one runs: ops::gemm_gemv_pick (config 0: T = 1 the CUDA cores, T = 2..16 the tensor
/// cores with X whole; config 1 (T <= 4) / 2 forces one, 3 the tensor cores with X in windows).
///
/// **T <= 4, on the CUDA cores (`gemm_gemv_kernel<T>`).** One CTA per SM streams a contiguous,
/// balanced share of the W rows (to one row: a tp 8 weight of a few thousand rows fills the SMs
/// evenly) through a shared-memory ring (`ops::gemm_gemv_ring`: stages of 8 rows × a K tile of up
/// to 2048 values, at most 8 stages; 6 stages of 32 KiB, 192 KiB in flight per SM, at K = 4096)
/// filled by one producer lane with bulk copies (TMA engine, mbarrier transaction counts) — weights
/// only, so the ring fills before the wait on the previous kernel. Eight consumer warps each take one row of a stage: lane l multiplies its
/// 16-byte chunks l, l + 32, ... with the T rows of X (staged in shared memory once per CTA) into
/// one fp32 sum per token; after a row's last K tile the lanes are summed by a butterfly of
/// shuffles and lane t stores token t. Each lane sums its chunks in order, so the bits do not
/// depend on timing or on the partition of the rows over the CTAs.
///
/// **T <= 16, on the tensor cores (`gemm_gemv_mma_kernel<NT>`, NT = ceil(T / 8) n8 tiles).** The
/// CUDA-core form costs T FMAs and T shared-memory reads of X per weight element (its figures
/// against this kernel: ops::kGemmGemvCudaCoreAutoMaxTokens; against cuBLASLt: ops::gemm_auto_takes_gemv).
/// The same ring and producer, stages of 16 W rows (the mma's M side: swap-AB, tokens on N) × a K
/// tile, the rows `ops::gemm_gemv_x_row_bytes(tile_k)` apart (16 bytes mod 128: conflict-free
/// ldmatrix). Eight consumer warps share each stage by k16 steps: warp w takes steps w, w + 8, ...
/// of the tile (ldmatrix.x4 of the 16 × 16 A block, ldmatrix of X's n8 × 16 B blocks, mma.sync
/// m16n8k16 bf16 with fp32 accumulation into one m16 × 8·NT tile per warp), tiles in order; after a
/// row block's last tile the eight warps' tiles are summed in warp order through shared memory
/// (`ops::gemm_gemv_mma_part_bytes`, after X) and stored as bf16. X's T rows are staged once per
/// CTA by cp.async, `ops::gemm_gemv_x_row_bytes(K)` apart (zero past K); the ldmatrix rows of
/// tokens past T read kGemmGemvZeroRowsBytes of zeros after them. A last k16 step that ends past a
/// tile's K (K % 16 = 8) zeroes its A registers of the upper 8 values (the ring holds stale bytes
/// there). **X in windows** (config 3, ops::gemm_gemv_x_windows): X's rows of one window of
/// ops::kGemmGemvXWindow values at a time, in two buffers (window q + 1's cp.async copies land
/// while window q is read), so the ring keeps its room whatever T and K are; the CTA walks its row
/// blocks in groups (`ring_walk`), per group window by window, and a block's sum of the eight
/// warps' tiles per window is added to its window sum (ops::gemm_gemv_mma_window_sum_bytes, after
/// the partial tiles) in window order. The order of every sum is fixed by (T, K, config) alone,
/// so the bits do not depend on timing or on the partition of the rows over the CTAs.
///
/// Both load W before `pdl_wait` (weights are not written by the step's kernels).
///
/// Preconditions (the launcher, gemm_launch.cuh, checks them): the fast-path alignment (X, W 16-byte
/// aligned, K > 0, K, ldx, ldw multiples of 8, ldc even), 1 <= T <= kGemmGemvMaxTokens,
/// X's rows within `ops::kGemmGemvMaxSmem` (`ops::gemm_gemv_smem_bytes`, `ops::gemm_gemv_eligible`);
/// either kernel's whole dynamic shared memory is `ops::gemm_gemv_ring(T, K, config).smem` (<= 227
/// KiB), whose tile_k, stages, row_bytes and ring offset the launcher passes in GemvArgs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/kernels/sm90/ptx.cuh"  // bf16_lo / bf16_hi, mma.sync
#include "step5/ops/gemm.hpp"            // kGemmGemvTokenTile, gemm_gemv_x_row_bytes, gemm_gemv_smem_bytes

namespace step5::kernels::sm90 {

struct GemvArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* c;
  int N, K;
  long long ldx, ldw, ldc;
  int T;  ///< tokens (the tensor-core kernel; the CUDA-core kernel's T is its template argument)
  /// the weight ring (ops::gemm_gemv_ring): K tile, stages, bytes between a stage's rows, and the
  /// first stage's offset in dynamic shared memory (ops::gemm_gemv_ring_offset)
  int tile_k = 0, stages = 0, row_bytes = 0, ring_offset = 0;
  /// X's windows (the tensor-core kernel; ops::gemm_gemv_x_windows / gemm_gemv_x_window_k): x_k
  /// values each, 1 window of K values where X is staged whole (the CUDA-core kernel: always)
  int x_k = 0, windows = 1;
};

inline constexpr int kGemvWarps = static_cast<int>(::step5::ops::kGemmGemvWarps);  ///< consumer warps per CTA
inline constexpr int kGemvThreads = kGemvWarps * 32;  ///< threads per CTA (the CUDA-core kernel: consumer threads)
/// Threads per CTA of the CUDA-core kernel: kGemvWarps consumer warps and one producer warp.
inline constexpr int kGemvRingThreads = kGemvThreads + 32;
static_assert(::step5::ops::kGemmGemvRingRows == kGemvWarps, "the CUDA-core kGemv kernel: one ring row per consumer warp");
static_assert(::step5::ops::kGemmGemvTokenTile == 8, "the tensor-core kGemv kernel's token tile is the mma's n8");
static_assert(::step5::ops::kGemmGemvMaxTokens <= 2 * ::step5::ops::kGemmGemvTokenTile,
              "the launcher instantiates the tensor-core kGemv kernel for one and two n8 tiles");
static_assert(::step5::ops::kGemmGemvMmaRingRows == 16, "the tensor-core kGemv kernel: a stage is one m16 row block");

namespace gemv_detail {

/// A CTA's share of the W rows, as both kernels deal them out: CTA b of G owns [N·b/G, N·(b+1)/G)
/// (balanced to one row), taken R rows at a time (a row block, a ring stage's rows); `ring_walk`
/// gives the order of its units (a block's K tile each).
struct RingShare {
  long long r0;  ///< the CTA's first row
  int rows;      ///< its rows
  int blocks;    ///< row blocks of R rows (the last one shorter)
};
__device__ __forceinline__ RingShare ring_share(const GemvArgs& a, int R) {
  RingShare sh;
  sh.r0 = static_cast<long long>(a.N) * blockIdx.x / gridDim.x;
  sh.rows = static_cast<int>(static_cast<long long>(a.N) * (blockIdx.x + 1) / gridDim.x - sh.r0);
  sh.blocks = (sh.rows + R - 1) / R;
  return sh;
}

/// The units of a CTA's share in ring order, for the producer and the consumers of both kernels
/// alike: the row blocks in groups (of ops::kGemmGemvWindowGroupBlocks where X is windowed, else
/// one group of all), per group X's windows in K order, per window the group's blocks in order,
/// per block the window's K tiles in order (with X whole: unit u = block · ktiles + kt). Calls
/// on_window(q, w, next) at the start of the q-th window visited (w: its index along K; next: the
/// index of the window visited after it, -1 for none), then per unit on_unit(u, b, bl, w, kx, kb,
/// last): block b (bl within its group), the tile's first value kx within the window and its
/// values kb, and whether it is the block's last tile of the window. K >= 8 (K = 0 is not a
/// fast-path shape: never launched).
template <class OnWindow, class OnUnit>
__device__ __forceinline__ void ring_walk(const GemvArgs& a, const RingShare& sh, OnWindow&& on_window,
                                          OnUnit&& on_unit) {
  const int G = a.windows > 1 ? static_cast<int>(::step5::ops::kGemmGemvWindowGroupBlocks) : sh.blocks;
  const int xk = a.windows > 1 ? a.x_k : a.K;  // X whole: one window of K values
  int u = 0, q = 0;
  for (int g0 = 0; g0 < sh.blocks; g0 += G) {
    const int gb = min(G, sh.blocks - g0);
    for (int w = 0; w < a.windows; ++w, ++q) {
      const int kw = min(xk, a.K - w * xk);  // the window's values
      const int tiles = (kw + a.tile_k - 1) / a.tile_k;
      on_window(q, w, w + 1 < a.windows ? w + 1 : g0 + G < sh.blocks ? 0 : -1);
      for (int bl = 0; bl < gb; ++bl)
        for (int kt = 0; kt < tiles; ++kt, ++u)
          on_unit(u, g0 + bl, bl, w, kt * a.tile_k, min(a.tile_k, kw - kt * a.tile_k), kt == tiles - 1);
    }
  }
}

/// The producer lane of both kernels (the ring of GemvArgs): unit u of the CTA's share (in
/// `ring_walk` order) goes to stage u % stages (mbarrier `full`, armed with the unit's bytes, one
/// bulk copy per row to ring + stage · R · row_bytes + row · row_bytes) once the `empty` barrier
/// says the consumers released the unit u − stages held there. Weights only: it runs before the
/// wait on the previous kernel.
__device__ __forceinline__ void ring_produce(const GemvArgs& a, unsigned char* ring, std::uint64_t* full,
                                             std::uint64_t* empty, const RingShare& sh, int R) {
  const int NS = a.stages;
  const long long stage_bytes = static_cast<long long>(R) * a.row_bytes;
  ring_walk(a, sh, [](int, int, int) {}, [&](int u, int b, int, int w, int kx, int kb, bool) {
    const int st = u % NS;
    if (u >= NS) ptx::mbar_wait(&empty[st], static_cast<unsigned>((u / NS - 1) & 1));
    const int nrows = min(R, sh.rows - b * R);
    ptx::mbar_arrive_expect_tx(&full[st], static_cast<unsigned>(nrows * kb * 2));
    const std::uint32_t dst = ptx::smem_u32(ring + st * stage_bytes);
    const __nv_bfloat16* src = a.w + (sh.r0 + static_cast<long long>(b) * R) * a.ldw +
                               static_cast<long long>(w) * a.x_k + kx;
    for (int j = 0; j < nrows; ++j)
      ptx::bulk_copy_g2s(dst + static_cast<std::uint32_t>(j * a.row_bytes), src + j * a.ldw,
                         static_cast<std::uint32_t>(kb * 2), &full[st]);
  });
}

/// Both kernels' start: the ring's mbarriers (thread 0, then a CTA barrier: a full barrier per
/// stage for the producer's arrival and the bulk copies' bytes, an empty one for every consumer
/// thread), then the producer warp (warp kGemvWarps) runs `ring_produce` on one lane and waits on
/// the previous kernel before it exits (the PDL rule: every thread waits). Returns true for the
/// producer warp, which then returns from the kernel.
__device__ __forceinline__ bool ring_start(const GemvArgs& a, unsigned char* ring, std::uint64_t* full,
                                           std::uint64_t* empty, const RingShare& sh, int R) {
  if (threadIdx.x == 0) {
    for (int st = 0; st < a.stages; ++st) {
      ptx::mbar_init(&full[st], 1);
      ptx::mbar_init(&empty[st], kGemvThreads);  // every consumer thread
    }
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  if ((threadIdx.x >> 5) != kGemvWarps) return false;
  if ((threadIdx.x & 31) == 0) ring_produce(a, ring, full, empty, sh, R);
  __syncwarp();
  pdl_wait();
  pdl_launch_dependents();
  return true;
}

/// Issues (does not wait for) the copies of X's values [k0, k0 + 8 · kp) of T rows into shared
/// memory at `dst`, rows `row_pieces` 16-byte pieces apart, the pieces past kp zero-filled: one
/// 16-byte cp.async per piece, every consumer thread's in flight, one commit group. Both kernels
/// stage X with it (the CUDA-core one whole and packed, row_pieces = kp = K / 8).
__device__ __forceinline__ void stage_x_rows(const GemvArgs& a, std::uint32_t dst, int T, int row_pieces, int k0,
                                             int kp) {
  for (int i = threadIdx.x; i < T * row_pieces; i += kGemvThreads) {
    const int t = i / row_pieces, p = i - t * row_pieces;
    const bool in = p < kp;
    ptx::cp_async16(dst + 16 * static_cast<std::uint32_t>(i),
                    in ? a.x + static_cast<long long>(t) * a.ldx + k0 + 8 * p : a.x, in ? 16 : 0);
  }
  ptx::cp_async_commit();
}

/// acc += the dot product of 8 W values (`w`) with 8 X values (`x`), in element order.
__device__ __forceinline__ float dot8(float acc, const uint4& w, const uint4& x) {
  acc = fmaf(ptx::bf16_lo(w.x), ptx::bf16_lo(x.x), acc);
  acc = fmaf(ptx::bf16_hi(w.x), ptx::bf16_hi(x.x), acc);
  acc = fmaf(ptx::bf16_lo(w.y), ptx::bf16_lo(x.y), acc);
  acc = fmaf(ptx::bf16_hi(w.y), ptx::bf16_hi(x.y), acc);
  acc = fmaf(ptx::bf16_lo(w.z), ptx::bf16_lo(x.z), acc);
  acc = fmaf(ptx::bf16_hi(w.z), ptx::bf16_hi(x.z), acc);
  acc = fmaf(ptx::bf16_lo(w.w), ptx::bf16_lo(x.w), acc);
  acc = fmaf(ptx::bf16_hi(w.w), ptx::bf16_hi(x.w), acc);
  return acc;
}

}  // namespace gemv_detail

/// See the file comment. CTA b of G owns the W rows [N·b/G, N·(b+1)/G) (balanced to one row),
/// taken kGemmGemvRingRows at a time (a row block; consumer warp w takes the block's row w) and
/// each block K tile by K tile (`tile_k` values; units u = block · ktiles + kt, in order). The
/// producer warp (warp kGemvWarps, one lane) bulk-copies unit u's rows into ring stage u % stages
/// (mbarrier `full`, armed with the unit's bytes) once the consumer threads have released the unit
/// u − stages held there (mbarrier `empty`, one arrival per consumer thread after its reads) —
/// weights only, so it starts before the wait on the previous kernel. A consumer lane adds its chunks l, l + 32, ... of
/// each K tile (tile_k / 8 chunks) to one fp32 sum per token, tiles in order; after the row's last
/// tile the warp's lanes are summed by a butterfly of shuffles and lane t stores token t's bf16.
/// With tile_k a multiple of 256 (or one tile per row) a lane's chunks are those of l, l + 32, ...
/// over the whole row, in order: fixed orders throughout, independent of the row partition.
template <int T>
__global__ void __launch_bounds__(kGemvRingThreads, 1) gemm_gemv_kernel(const GemvArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace gemv_detail;
  extern __shared__ __align__(128) unsigned char gemv_ring_smem[];
  namespace o = ::step5::ops;
  constexpr int R = static_cast<int>(o::kGemmGemvRingRows);
  const int NS = a.stages;
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(gemv_ring_smem);
  std::uint64_t* empty = full + o::kGemmGemvRingMaxStages;
  uint4* xs = reinterpret_cast<uint4*>(gemv_ring_smem + o::kGemmGemvRingBarrierBytes);  // [T][K / 8]
  unsigned char* ring = gemv_ring_smem + a.ring_offset;
  const int stage_bytes = R * a.row_bytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kc = a.K / 8;  // 16-byte chunks per row
  const RingShare sh = ring_share(a, R);
  const long long r0 = sh.r0;
  const int rows = sh.rows;
  if (ring_start(a, ring, full, empty, sh, R)) return;  // the producer warp

  pdl_wait();  // X is the previous kernel's output
  stage_x_rows(a, ptx::smem_u32(xs), T, kc, 0, kc);
  ptx::cp_async_wait<0>();
  ptx::named_barrier_sync(1, kGemvThreads);  // the consumer warps: X staged

  float acc[T];
  // X whole: one window, the units u = block · ktiles + kt (ring_walk)
  ring_walk(a, sh, [](int, int, int) {}, [&](int u, int b, int, int, int kx, int kb, bool last) {
    const int st = u % NS;
    const int row = b * R + warp;  // this warp's row of the block
    if (kx == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) acc[t] = 0.f;
    }
    ptx::mbar_wait(&full[st], static_cast<unsigned>((u / NS) & 1));
    if (row < rows) {
      const int chunks = kb / 8;
      const uint4* wr = reinterpret_cast<const uint4*>(ring + static_cast<long long>(st) * stage_bytes +
                                                       static_cast<long long>(warp) * a.row_bytes);
      const uint4* xr = xs + kx / 8;
#pragma unroll 4
      for (int c = lane; c < chunks; c += 32) {
        const uint4 wv = wr[c];
#pragma unroll
        for (int t = 0; t < T; ++t) acc[t] = dot8(acc[t], wv, xr[t * kc + c]);
      }
    }
    ptx::mbar_arrive(&empty[st]);  // each thread after its own reads (one arrival per warp after
                                   // __syncwarp was reported by racecheck as hazards)
    if (last && row < rows) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], m);
      }
#pragma unroll
      for (int t = 0; t < T; ++t)
        if (lane == t) a.c[static_cast<long long>(t) * a.ldc + r0 + row] = __float2bfloat16_rn(acc[t]);
    }
  });
  pdl_launch_dependents();
#endif
}

/// See the file comment (1 <= T <= 8 · NT). CTA b of G owns the W rows [N·b/G, N·(b+1)/G) (balanced
/// to one row), taken kGemmGemvMmaRingRows (16) at a time (a row block, the mma's M) and each block
/// K tile by K tile (in `ring_walk` order: u = block · ktiles + kt where X is whole; `ring_share`,
/// `ring_produce`). Consumer warp w runs k16 steps w, w + 8, ... of each tile of the block into its
/// m16 × 8·NT accumulator tile; after the block's last tile (of the window) the eight tiles go
/// through shared memory (gemm_gemv_mma_part_bytes, after X's zeros) and are summed in warp order,
/// one output per thread, then stored (or, windowed, added to the block's window sum).
template <int NT>
__global__ void __launch_bounds__(kGemvRingThreads, 1) gemm_gemv_mma_kernel(const GemvArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace gemv_detail;
  static_assert(NT == 1 || NT == 2, "one or two n8 token tiles");
  static_assert(NT * 4 * 32 <= kGemvThreads, "one output of a row block per consumer thread");
  namespace o = ::step5::ops;
  constexpr int R = static_cast<int>(o::kGemmGemvMmaRingRows);
  constexpr int kTile = NT * 4 * 32;  // fp32 outputs of a row block (16 rows × 8·NT tokens)
  extern __shared__ __align__(128) unsigned char gemv_ring_smem[];
  const int NS = a.stages, wrow = a.row_bytes;
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(gemv_ring_smem);
  std::uint64_t* empty = full + o::kGemmGemvRingMaxStages;
  // X's buffer(s) of T rows (one, or two where windowed), then the zeros, the partial tiles and
  // the window sums (ops::gemm_gemv_smem_bytes)
  unsigned char* xs = gemv_ring_smem + o::kGemmGemvRingBarrierBytes;
  unsigned char* ring = gemv_ring_smem + a.ring_offset;
  const int x_row = static_cast<int>(o::gemm_gemv_x_row_bytes(a.x_k));
  const int x_buf = a.T * x_row;  // bytes of one X buffer
  const int part_off = static_cast<int>(o::gemm_gemv_mma_part_offset(a.T, a.x_k, a.windows));
  const int zero_off = part_off - static_cast<int>(o::kGemmGemvZeroRowsBytes);
  // per warp, its accumulator tile (element j·4 + r of lane l), after the zeros
  static_assert(o::gemm_gemv_mma_part_bytes(8 * NT) == sizeof(float) * kGemvWarps * kTile, "the partial tiles' bytes");
  static_assert(o::gemm_gemv_mma_window_sum_bytes(8 * NT, 2) == sizeof(float) * o::kGemmGemvWindowGroupBlocks * kTile,
                "the window sums' bytes");
  float (*part)[NT * 4][32] = reinterpret_cast<float (*)[NT * 4][32]>(xs + part_off);
  float* wsum = reinterpret_cast<float*>(xs + o::gemm_gemv_mma_window_sum_offset(a.T, a.x_k, a.windows));  // [group block][kTile]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const RingShare sh = ring_share(a, R);
  const long long r0 = sh.r0;
  const int rows = sh.rows;
  if (ring_start(a, ring, full, empty, sh, R)) return;  // the producer warp

  // Window w of X into buffer bf: T rows of x_row bytes, the values [w · x_k, w · x_k + x_k) of
  // each, the 16-byte pieces past K zero (a k16 step that ends past K multiplies zeros there); one
  // 16-byte cp.async per piece (0 source bytes: zero-filled), all in flight, one commit group
  const std::uint32_t xs_u = ptx::smem_u32(xs);
  const auto stage_x = [&](int bf, int w) {
    const int k0 = w * a.x_k;
    stage_x_rows(a, xs_u + static_cast<std::uint32_t>(bf * x_buf), a.T, x_row / 16, k0, min(a.x_k, a.K - k0) / 8);
  };
  pdl_wait();  // X is the previous kernel's output
  if (threadIdx.x < static_cast<int>(o::kGemmGemvZeroRowsBytes / 16))
    reinterpret_cast<uint4*>(xs + zero_off)[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
  stage_x(0, 0);

  // ldmatrix row addresses. A (x4): lane l reads row l % 16 at values 8 · (l / 16) of a step.
  // B: matrix m = l / 8 (x4: (tile, half) = (m / 2, m % 2); x2: half m, lanes 16.. unused), row l % 8
  // = token 8 · tile + l % 8 at values 8 · half of the step (in the current X buffer), or the zeros past T.
  const std::uint32_t a_lane = static_cast<std::uint32_t>((lane & 15) * wrow + (lane >> 4) * 16);
  std::uint32_t b_lane;  // X's row of this lane at the window's first value (+ its half), or the zero piece
  bool b_zero;
  {
    const int m = (lane >> 3) & (2 * NT - 1), tok = 8 * (m >> 1) + (lane & 7), half = m & 1;
    b_zero = tok >= a.T;
    b_lane = xs_u + static_cast<std::uint32_t>(b_zero ? zero_off + 16 * (lane & 7) : tok * x_row + 16 * half);
  }

  std::uint32_t x_cur = 0;  // the current window's buffer offset
  int ends = 0;             // row-block ends so far (the partial tiles' buffer is reused)
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
  ring_walk(
      a, sh,
      [&](int q, int, int next) {
        // window q's X landed (this thread's copies, then everyone's), and window q - 1 is read by
        // every warp: its buffer takes window q + 1
        ptx::cp_async_wait<0>();
        ptx::named_barrier_sync(1, kGemvThreads);
        if (next >= 0) stage_x((q + 1) & 1, next);
        x_cur = static_cast<std::uint32_t>((q & 1) * x_buf);
      },
      [&](int u, int b, int bl, int w, int kx, int kb, bool last) {
        const int st = u % NS;
        const int steps = (kb + 15) / 16;  // kb: a multiple of 8
        ptx::mbar_wait(&full[st], static_cast<unsigned>((u / NS) & 1));
        const std::uint32_t w_st = ptx::smem_u32(ring) + static_cast<std::uint32_t>(st * R * wrow) + a_lane;
        const std::uint32_t x_kt = b_zero ? b_lane : b_lane + x_cur + static_cast<std::uint32_t>(kx * 2);
        for (int s = warp; s < steps; s += kGemvWarps) {
          std::uint32_t af[4];
          ptx::ldmatrix_x4(w_st + 32 * s, af[0], af[1], af[2], af[3]);
          if (16 * s + 16 > kb) af[2] = af[3] = 0u;  // values kb .. kb + 7: stale ring bytes
          const std::uint32_t xa = b_zero ? x_kt : x_kt + 32 * s;
          if constexpr (NT == 2) {
            std::uint32_t bf[4];
            ptx::ldmatrix_x4(xa, bf[0], bf[1], bf[2], bf[3]);
            ptx::mma_bf16_16816(acc[0], af, bf[0], bf[1]);
            ptx::mma_bf16_16816(acc[1], af, bf[2], bf[3]);
          } else {
            std::uint32_t bf[2];
            ptx::ldmatrix_x2(xa, bf[0], bf[1]);
            ptx::mma_bf16_16816(acc[0], af, bf[0], bf[1]);
          }
        }
        ptx::mbar_arrive(&empty[st]);  // each thread after its own reads
        if (!last) return;
        // the block's last tile of this window: the eight warps' tiles summed in warp order
        if (ends++ > 0) ptx::named_barrier_sync(1, kGemvThreads);  // the previous block's sums are read
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            part[warp][j * 4 + r][lane] = acc[j][r];
            acc[j][r] = 0.f;
          }
        ptx::named_barrier_sync(1, kGemvThreads);  // every warp's tile written
        // element (j·4 + r, lane l): W row 16 · b + l / 4 + 8 · (r / 2), token 8j + 2 · (l % 4) + r % 2
        // (the m16n8 accumulator layout)
        const int e = threadIdx.x;
        if (e < kTile) {
          const int jr = e / 32, l = e % 32;
          float sum = part[0][jr][l];
#pragma unroll
          for (int q = 1; q < kGemvWarps; ++q) sum += part[q][jr][l];
          if (a.windows > 1) {  // windowed: the block's window sums in window order, this thread's slot
            float& slot = wsum[bl * kTile + e];
            sum = w == 0 ? sum : slot + sum;
            if (w + 1 < a.windows) {
              slot = sum;
              return;
            }
          }
          const int n = b * R + l / 4 + 8 * ((jr & 3) >> 1);
          const int t = 8 * (jr >> 2) + 2 * (l % 4) + (jr & 1);
          if (n < rows && t < a.T) a.c[static_cast<long long>(t) * a.ldc + r0 + n] = __float2bfloat16_rn(sum);
        }
      });
  pdl_launch_dependents();
#endif
}

}  // namespace step5::kernels::sm90
