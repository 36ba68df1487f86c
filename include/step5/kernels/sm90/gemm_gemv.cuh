#pragma once
/// \file step5/kernels/sm90/gemm_gemv.cuh
/// Weight-streaming projection for decode-sized T (T <= ops::kGemmGemvMaxTokens; SPEC §3/§4.1):
/// `C[T, N] = bf16(X[T, K] @ W[N, K]^T)`, fp32 accumulation. At small T the product is a few FLOP
/// per weight byte: the time is the weight stream, which wants as many bytes in flight as the
/// memory system holds and little else per byte. Two kernels:
///
/// Which one runs: ops::gemm_gemv_pick (config 0: T <= 4 the CUDA cores, T = 5..16 the tensor
/// cores; config 1 / 2 forces one).
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
/// against this kernel: ops::kGemmGemvCudaCoreMaxTokens; against cuBLASLt: ops::gemm_auto_takes_gemv).
/// Here a warp owns 16 W rows (the mma M side: swap-AB, tokens on N) and a K segment
/// (`gemv_mma_segments`, a power of two <= kGemvWarps, so the CTA's warps cover R = kGemvWarps / S
/// row groups); mma.sync m16n8k16 bf16 with fp32 accumulation. W's fragments come straight from
/// global memory: quad lane c of group g loads bytes [64i + 16c, +16) of rows g and g + 8 for
/// each 64-byte chunk i (`kGemvMmaBatch` chunks in flight: 16 loads of 16 bytes per lane, 8 KiB per
/// warp), and uses them as the A fragments of two k16 steps; X's B fragments are read from shared
/// memory at the same byte offsets of token rows g (+ 8j). The K order inside a chunk is thereby
/// permuted identically for A and B (logical k 2c + e and 2c + 8 + e of step s are elements 8c +
/// 4s + e and 8c + 4s + 2 + e), which is exact for a dot product. X's T rows are staged once per
/// CTA (values past K zero), `ops::gemm_gemv_x_row_bytes(K)` apart (64 mod 128 bytes:
/// conflict-free fragment loads); the fragments of tokens past T read as zero. The S segments'
/// fp32 tiles are summed in segment order through shared memory and stored as bf16. The mma's accumulation order is fixed,
/// so the bits do not depend on timing either.
///
/// Both load W before `pdl_wait` (weights are not written by the step's kernels).
///
/// Preconditions (the launcher, gemm_launch.cuh, checks them): the fast-path alignment (X, W 16-byte
/// aligned, K > 0, K, ldx, ldw multiples of 8, ldc even), 1 <= T <= kGemmGemvMaxTokens,
/// X's rows within `ops::kGemmGemvMaxSmem` (`ops::gemm_gemv_smem_bytes`, `ops::gemm_gemv_eligible`);
/// the CUDA-core kernel's whole dynamic shared memory is `ops::gemm_gemv_ring(T, K).smem` (<= 227
/// KiB), the tensor-core kernel's `gemm_gemv_smem_bytes(T, K, kGemmGemvTensorCores)`.
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
  int tile_k = 0, stages = 0;  ///< the CUDA-core kernel's ring (ops::gemm_gemv_ring)
};

inline constexpr int kGemvWarps = 8;                  ///< warps (W rows at a time) per CTA
inline constexpr int kGemvThreads = kGemvWarps * 32;  ///< threads per CTA (the CUDA-core kernel: consumer threads)
/// Threads per CTA of the CUDA-core kernel: kGemvWarps consumer warps and one producer warp.
inline constexpr int kGemvRingThreads = kGemvThreads + 32;
static_assert(::step5::ops::kGemmGemvRingRows == kGemvWarps, "the CUDA-core kGemv kernel: one ring row per consumer warp");
/// CTAs per SM the tensor-core kernel's launch plans for and its register allocation guarantees
/// (__launch_bounds__): two CTAs of 8 warps hold 2 · 8 · 8 KiB of W in flight per SM.
inline constexpr int kGemvCtasPerSm = 2;

/// 64-byte chunks of its 16 W rows a warp of the tensor-core kernel loads at once (two 16-byte
/// loads per chunk and lane: 16 loads in flight per lane, 8 KiB per warp).
inline constexpr int kGemvMmaBatch = 8;
/// K segments (warps) per 16-row group of the tensor-core kernel for reduction length K: enough
/// for one batch each (ceil(K / 32) chunks of 64 bytes, kGemvMmaBatch per batch), rounded up to a
/// power of two (so that S divides kGemvWarps and no warp idles) and at most kGemvWarps (longer
/// segments loop over batches).
__host__ __device__ constexpr int gemv_mma_segments(long long K) {
  const long long batches = ((K + 31) / 32 + kGemvMmaBatch - 1) / kGemvMmaBatch;
  int s = 1;
  while (s < kGemvWarps && s < batches) s *= 2;
  return s;
}
static_assert((kGemvWarps & (kGemvWarps - 1)) == 0, "gemv_mma_segments: S must divide kGemvWarps");
static_assert(::step5::ops::kGemmGemvTokenTile == 8, "the tensor-core kGemv kernel's token tile is the mma's n8");
static_assert(::step5::ops::kGemmGemvMaxTokens <= 2 * ::step5::ops::kGemmGemvTokenTile,
              "the launcher instantiates the tensor-core kGemv kernel for one and two n8 tiles");

namespace gemv_detail {

/// 16 bytes of W, not kept in L1 (each byte is read once).
__device__ __forceinline__ uint4 load_w(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
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
  const int NS = a.stages, TK = a.tile_k;
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(gemv_ring_smem);
  std::uint64_t* empty = full + o::kGemmGemvRingMaxStages;
  uint4* xs = reinterpret_cast<uint4*>(gemv_ring_smem + o::kGemmGemvRingBarrierBytes);  // [T][K / 8]
  unsigned char* ring = gemv_ring_smem + o::gemm_gemv_ring_offset(T, a.K);
  const int stage_bytes = static_cast<int>(o::gemm_gemv_ring_stage_bytes(TK));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kc = a.K / 8;  // 16-byte chunks per row
  const long long r0 = static_cast<long long>(a.N) * blockIdx.x / gridDim.x;
  const int rows = static_cast<int>(static_cast<long long>(a.N) * (blockIdx.x + 1) / gridDim.x - r0);
  const int blocks = (rows + static_cast<int>(o::kGemmGemvRingRows) - 1) / static_cast<int>(o::kGemmGemvRingRows);
  const int ktiles = (a.K + TK - 1) / TK;  // K >= 8 (K = 0 is not a fast-path shape: never launched)
  const int units = blocks * ktiles;

  if (threadIdx.x == 0) {
    for (int st = 0; st < NS; ++st) {
      ptx::mbar_init(&full[st], 1);
      ptx::mbar_init(&empty[st], kGemvThreads);  // every consumer thread
    }
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();

  if (warp == kGemvWarps) {  // the producer
    if (lane == 0) {
      for (int u = 0; u < units; ++u) {
        const int st = u % NS;
        if (u >= NS) ptx::mbar_wait(&empty[st], static_cast<unsigned>((u / NS - 1) & 1));
        const int b = u / ktiles, kt = u - b * ktiles;
        const int nrows = min(static_cast<int>(o::kGemmGemvRingRows), rows - b * static_cast<int>(o::kGemmGemvRingRows));
        const int kb = min(TK, a.K - kt * TK);  // values of this tile
        ptx::mbar_arrive_expect_tx(&full[st], static_cast<unsigned>(nrows * kb * 2));
        const std::uint32_t dst = ptx::smem_u32(ring + static_cast<long long>(st) * stage_bytes);
        const __nv_bfloat16* src =
            a.w + (r0 + static_cast<long long>(b) * o::kGemmGemvRingRows) * a.ldw + static_cast<long long>(kt) * TK;
        for (int j = 0; j < nrows; ++j)
          ptx::bulk_copy_g2s(dst + static_cast<std::uint32_t>(j * TK * 2), src + j * a.ldw,
                             static_cast<std::uint32_t>(kb * 2), &full[st]);
      }
    }
    __syncwarp();
    pdl_wait();  // (the rule: every thread waits before it exits)
    pdl_launch_dependents();
    return;
  }

  pdl_wait();  // X is the previous kernel's output
  for (int i = threadIdx.x; i < T * kc; i += kGemvThreads) {
    const int t = i / kc, c = i - t * kc;
    xs[i] = *reinterpret_cast<const uint4*>(a.x + static_cast<long long>(t) * a.ldx + 8 * c);
  }
  ptx::named_barrier_sync(1, kGemvThreads);  // the consumer warps: X staged

  float acc[T];
  for (int u = 0; u < units; ++u) {
    const int st = u % NS;
    const int b = u / ktiles, kt = u - b * ktiles;
    const int row = b * static_cast<int>(o::kGemmGemvRingRows) + warp;  // this warp's row of the block
    if (kt == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) acc[t] = 0.f;
    }
    ptx::mbar_wait(&full[st], static_cast<unsigned>((u / NS) & 1));
    if (row < rows) {
      const int chunks = min(TK, a.K - kt * TK) / 8;
      const uint4* wr = reinterpret_cast<const uint4*>(ring + static_cast<long long>(st) * stage_bytes +
                                                       static_cast<long long>(warp) * TK * 2);
      const uint4* xr = xs + kt * (TK / 8);
#pragma unroll 4
      for (int c = lane; c < chunks; c += 32) {
        const uint4 wv = wr[c];
#pragma unroll
        for (int t = 0; t < T; ++t) acc[t] = dot8(acc[t], wv, xr[t * kc + c]);
      }
    }
    ptx::mbar_arrive(&empty[st]);  // each thread after its own reads (one arrival per warp after
                                   // __syncwarp was reported by racecheck as hazards)
    if (kt == ktiles - 1 && row < rows) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], m);
      }
#pragma unroll
      for (int t = 0; t < T; ++t)
        if (lane == t) a.c[static_cast<long long>(t) * a.ldc + r0 + row] = __float2bfloat16_rn(acc[t]);
    }
  }
  pdl_launch_dependents();
#endif
}

/// See the file comment (1 <= T <= 8 · NT). Warp w of a CTA takes K segment w % S of row slot
/// w / S (S = gemv_mma_segments(K), R = kGemvWarps / S slots): the 16 W rows 16 · (set · R + slot)
/// + [0, 16) for the CTA's row-group sets set = blockIdx.x, + gridDim.x, .... A segment is
/// ceil(chunks / S) consecutive 64-byte chunks of the rows, loaded kGemvMmaBatch chunks at a time.
template <int NT>
__global__ void __launch_bounds__(kGemvThreads, kGemvCtasPerSm) gemm_gemv_mma_kernel(const GemvArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace gemv_detail;
  static_assert(NT == 1 || NT == 2, "one or two n8 token tiles");
  extern __shared__ __align__(16) unsigned char gemv_smem[];  // X: [T][x_row bytes]
  // per warp, its accumulator tile (element j·4 + r of lane l), double-buffered by row-group set
  __shared__ float part[2][kGemvWarps][NT * 4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;  // mma groupID, thread in group
  const int kc = (a.K + 31) / 32;          // 64-byte chunks per row (the last one may end past K)
  const int S = gemv_mma_segments(a.K), R = kGemvWarps / S;
  const int seg_len = (kc + S - 1) / S;
  const int slot = warp / S, seg = warp - slot * S;
  const int c_begin = min(kc, seg * seg_len), c_end = min(kc, c_begin + seg_len);
  const int sets = ((a.N + 15) / 16 + R - 1) / R;  // N <= kGemmGemvMaxRows: no row index overflows
  const int x_row = static_cast<int>(::step5::ops::gemm_gemv_x_row_bytes(a.K));
  int set = blockIdx.x;

  // the A fragments of kGemvMmaBatch chunks: w[i][h] = 16 bytes of row g + 8h at chunk c0 + i
  uint4 wv[kGemvMmaBatch][2];
  auto load_batch = [&](int set_, int c0) {
    const int n0 = (set_ * R + slot) * 16 + g;
#pragma unroll
    for (int i = 0; i < kGemvMmaBatch; ++i) {
      const int ci = c0 + i, e = 32 * ci + 8 * c;  // this lane's first element of chunk ci
      const bool in = ci < c_end && e < a.K;      // K % 8 == 0: the 16 bytes are all in or all out
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + 8 * h;
        wv[i][h] = in && n < a.N ? load_w(a.w + static_cast<long long>(n) * a.ldw + e) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  load_batch(set, c_begin);  // weights: before the wait on the previous kernel
  pdl_wait();                // X is the previous kernel's output
  {
    // X as T rows of x_row bytes, the 16-byte pieces past K zero (so the mma of a chunk that ends
    // past K adds exact zeros: W is zero there too)
    const int pieces = x_row / 16, kp = a.K / 8;
    for (int i = threadIdx.x; i < a.T * pieces; i += kGemvThreads) {
      const int t = i / pieces, p = i - t * pieces;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (p < kp) v = *reinterpret_cast<const uint4*>(a.x + static_cast<long long>(t) * a.ldx + 8 * p);
      *reinterpret_cast<uint4*>(gemv_smem + t * x_row + 16 * p) = v;
    }
  }
  __syncthreads();
  const unsigned char* xq = gemv_smem + g * x_row + 16 * c;  // this lane's B fragments: token g (+ 8j)
  bool x_in[NT];  // token g + 8j is one of the T staged rows (else its fragments are zero)
#pragma unroll
  for (int j = 0; j < NT; ++j) x_in[j] = g + 8 * j < a.T;

  for (int it = 0; set < sets; set += gridDim.x, ++it) {
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
    for (int c0 = c_begin; c0 < c_end; c0 += kGemvMmaBatch) {
      if (c0 > c_begin) load_batch(set, c0);  // a segment longer than one batch
#pragma unroll
      for (int i = 0; i < kGemvMmaBatch; ++i) {
        const int ci = c0 + i;
        if (ci < c_end) {  // uniform over the warp
          // k16 step 0: elements 8c + {0,1} (a0 / a1: rows g / g + 8) and 8c + {2,3} (a2 / a3);
          // step 1: 8c + {4,5} and 8c + {6,7}; B: the same elements of token g's row
          const std::uint32_t s0[4] = {wv[i][0].x, wv[i][1].x, wv[i][0].y, wv[i][1].y};
          const std::uint32_t s1[4] = {wv[i][0].z, wv[i][1].z, wv[i][0].w, wv[i][1].w};
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint4 xv =
                x_in[j] ? *reinterpret_cast<const uint4*>(xq + 8 * j * x_row + 64 * ci) : make_uint4(0u, 0u, 0u, 0u);
            ptx::mma_bf16_16816(acc[j], s0, xv.x, xv.y);
            ptx::mma_bf16_16816(acc[j], s1, xv.z, xv.w);
          }
        }
      }
    }
    // the next set's first batch, in flight while this one's tiles are summed and stored
    if (set + static_cast<int>(gridDim.x) < sets) load_batch(set + static_cast<int>(gridDim.x), c_begin);
    float (*pp)[NT * 4][32] = part[it & 1];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) pp[warp][j * 4 + r][lane] = acc[j][r];
    __syncthreads();  // (the other buffer's reads, one set earlier, precede this barrier too)
    // element (slot, j·4 + r, lane l): W row 16 · (set · R + slot) + l / 4 + 8 · (r / 2), token
    // 8j + 2 · (l % 4) + r % 2 (the m16n8 accumulator layout); the slot's S segments in order
    for (int e = threadIdx.x; e < R * NT * 128; e += kGemvThreads) {
      const int sl = e / (NT * 128), jr = (e / 32) % (NT * 4), l = e % 32;
      float sum = pp[sl * S][jr][l];
      for (int q = 1; q < S; ++q) sum += pp[sl * S + q][jr][l];
      const int n = (set * R + sl) * 16 + l / 4 + 8 * ((jr & 3) >> 1);
      const int t = 8 * (jr >> 2) + 2 * (l % 4) + (jr & 1);
      if (n < a.N && t < a.T) a.c[static_cast<long long>(t) * a.ldc + n] = __float2bfloat16_rn(sum);
    }
  }
  pdl_launch_dependents();
#endif
}

}  // namespace step5::kernels::sm90
