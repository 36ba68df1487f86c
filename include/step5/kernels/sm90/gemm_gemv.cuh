#pragma once
/// \file step5/kernels/sm90/gemm_gemv.cuh
/// Weight-streaming projection for decode-sized T (T <= ops::kGemmGemvMaxTokens; SPEC §3/§4.1):
/// `C[T, N] = bf16(X[T, K] @ W[N, K]^T)`, fp32 accumulation, on the CUDA cores.
///
/// At T <= 4 the product is 2·T FLOP per weight byte pair: the time is the weight stream, which
/// wants as many bytes in flight as the memory system holds and nothing else. One warp per W row
/// (rows dealt out grid-stride, `kGemvWarps` warps per CTA), or up to kGemvWarps warps per row when
/// K is long (`gemv_segments`: a warp's share of a row is one batch up to K = 8 · 4096, several
/// batches beyond): lane l reads its 16-byte chunks
/// l, l + 32, ... as `kGemvBatch` independent non-caching loads in flight at once (a K = 4096 row is
/// one batch: 8 KiB of one row per warp), multiplies them with the T rows of X held in shared
/// memory (staged once per CTA), and keeps one fp32 sum per token; the warp's lanes are then summed
/// by a butterfly of shuffles, a row's segments in segment order, and one thread stores bf16. Each
/// lane sums its chunks in order, so the bits do not depend on timing. The first batch of W is loaded
/// before `pdl_wait` (weights are not written by the step's kernels).
///
/// Preconditions (the launcher, gemm_launch.cuh, checks them): the fast-path alignment (X, W 16-byte
/// aligned, K, ldx, ldw multiples of 8, ldc even), 1 <= T <= kGemmGemvMaxTokens, T · K · 2 bytes of
/// shared memory available (`gemv_smem_bytes`).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/kernels/sm90/ptx.cuh"  // bf16_lo / bf16_hi

namespace step5::kernels::sm90 {

struct GemvArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* c;
  int N, K;
  long long ldx, ldw, ldc;
};

inline constexpr int kGemvWarps = 8;                  ///< warps (W rows at a time) per CTA
inline constexpr int kGemvThreads = kGemvWarps * 32;  ///< threads per CTA
inline constexpr int kGemvBatch = 16;                 ///< 16-byte W loads in flight per lane
/// CTAs per SM the launch plans for and the register allocation guarantees (__launch_bounds__): two
/// CTAs of 8 warps hold 2 · 8 · 8 KiB of W in flight per SM, more than the memory system needs.
inline constexpr int kGemvCtasPerSm = 2;

/// Dynamic shared memory of the T-token instance: X's T rows of K bf16 values.
__host__ __device__ constexpr long long gemv_smem_bytes(int T, long long K) {
  return static_cast<long long>(T) * K * 2;
}
/// Warps (segments) per W row of reduction length K: one batch of kGemvBatch 16-byte loads per lane
/// each, at most kGemvWarps (longer segments loop over batches).
__host__ __device__ constexpr int gemv_segments(long long K) {
  const long long per_warp = 32LL * kGemvBatch * 8;  // elements of one batch of a warp
  const long long s = (K + per_warp - 1) / per_warp;
  return s < 1 ? 1 : (s > kGemvWarps ? kGemvWarps : static_cast<int>(s));
}

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

/// See the file comment. A row's 16-byte chunks are cut into S = `gemv_segments(K)` segments, one
/// warp each (one batch of 32 · kGemvBatch chunks in flight per warp; a segment is one batch up to
/// K = kGemvWarps · 4096 and several batches, loaded in turn, beyond):
/// warp w of a CTA takes segment w % S of row slot w / S (R = kGemvWarps / S slots; warps beyond
/// R · S idle), rows n = g · R + slot for the CTA's row groups g = blockIdx.x, + gridDim.x, ....
/// Each warp sums its lanes (butterfly) into shared memory, and the slot's segments are added in
/// segment order by one thread, which stores bf16: fixed orders throughout.
template <int T>
__global__ void __launch_bounds__(kGemvThreads, kGemvCtasPerSm) gemm_gemv_kernel(const GemvArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace gemv_detail;
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  uint4* xs = reinterpret_cast<uint4*>(gemv_smem);  // [T][K / 8] 16-byte chunks of X
  __shared__ float part[2][kGemvWarps][T];          // per warp and token, double-buffered by row group
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kc = a.K / 8;  // 16-byte chunks per row
  const int S = gemv_segments(a.K), R = kGemvWarps / S;
  const int seg_len = (kc + S - 1) / S;
  const int slot = warp / S, seg = warp - slot * S;
  const bool active = slot < R;
  const int c_begin = min(kc, seg * seg_len), c_end = min(kc, c_begin + seg_len);
  const int groups = (a.N + R - 1) / R;  // N <= kGemmGemvMaxRows (the launcher): no row index overflows
  int g = blockIdx.x;

  // the first batch of this warp's first row: weights, so before the wait on the previous kernel
  uint4 wv[kGemvBatch];
  auto load_batch = [&](int n, int c0) {
    const __nv_bfloat16* wrow = a.w + static_cast<long long>(n) * a.ldw;
#pragma unroll
    for (int i = 0; i < kGemvBatch; ++i) {
      const int c = c0 + lane + 32 * i;
      wv[i] = active && n < a.N && c < c_end ? load_w(wrow + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  load_batch(g * R + slot, c_begin);
  pdl_wait();  // X is the previous kernel's output
  for (int i = threadIdx.x; i < T * kc; i += kGemvThreads) {
    const int t = i / kc, c = i - t * kc;
    xs[i] = *reinterpret_cast<const uint4*>(a.x + static_cast<long long>(t) * a.ldx + 8 * c);
  }
  __syncthreads();

  for (int it = 0; g < groups; g += gridDim.x, ++it) {
    const int n = g * R + slot;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.f;
    for (int c0 = c_begin; c0 < c_end; c0 += 32 * kGemvBatch) {
      if (c0 > c_begin) load_batch(n, c0);  // a segment longer than one batch (K > kGemvWarps · 4096)
#pragma unroll
      for (int i = 0; i < kGemvBatch; ++i) {
        const int c = c0 + lane + 32 * i;
        if (c < c_end) {
#pragma unroll
          for (int t = 0; t < T; ++t) acc[t] = dot8(acc[t], wv[i], xs[t * kc + c]);
        }
      }
    }
    // the next row group's first batch, in flight while this one's sums are reduced and stored
    if (g + static_cast<int>(gridDim.x) < groups) load_batch((g + static_cast<int>(gridDim.x)) * R + slot, c_begin);
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], m);
    }
    float (*pp)[T] = part[it & 1];
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) pp[warp][t] = acc[t];
    }
    __syncthreads();  // (the other buffer's reads, one group earlier, precede this barrier too)
    if (active && seg == 0 && lane < T && n < a.N) {
      float sum = pp[warp][lane];
      for (int q = 1; q < S; ++q) sum += pp[warp + q][lane];
      a.c[static_cast<long long>(lane) * a.ldc + n] = __float2bfloat16_rn(sum);
    }
  }
  pdl_launch_dependents();
#endif
}

}  // namespace step5::kernels::sm90
