#pragma once
/// \file step5/kernels/sm90/gemm_stream.cuh
/// Streaming projection GEMM for small and medium T (decode; SPEC §3/§4.1):
/// `C[T, N] = X[T, K] @ W[N, K]^T`, bf16 in/out, fp32 accumulation.
///
/// The tile is BM rows of W (columns of C) × BN tokens; each warp owns 16 W rows × all BN tokens
/// and runs mma.sync m16n8k16 with W as the A operand and X as the B operand (both K-contiguous,
/// loaded with ldmatrix from XOR-swizzled shared memory). W and X tiles of BK = 64 stream through
/// a STAGES-deep cp.async pipeline (16-byte copies; out-of-range rows/chunks are zero-filled).
/// K is split over gridDim.z so that every SM is busy even when N/BM is small: each split
/// stores its fp32 partial tile in the workspace, and the last split to finish a tile (a
/// per-tile arrival counter, reset to 0 by that block) sums the partials and writes bf16.
///
/// Preconditions (checked by the host launcher, step5/ops/gemm.hpp): X, W, C 16-byte aligned,
/// ldx, ldw multiples of 8, K a multiple of 8, ldc even.
#include "step5/kernels/sm90/gemm_common.cuh"
#include "step5/kernels/sm90/pdl.cuh"

namespace step5::kernels::sm90 {

struct StreamArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* c;
  int T, N, K;
  long long ldx, ldw, ldc;
  int k_tiles_per_split;  ///< BK-tiles of K per split (gridDim.z splits)
  float* partials;        ///< [tiles][splits][BM*BN] fp32 (split-K only)
  unsigned* counters;     ///< [tiles] arrival counters, zero between launches (split-K only)
};

template <int BM, int BN>
struct StreamConfig {
  static constexpr int kBK = 64;
  static constexpr int kWarps = BM / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStageBytes = (BM + BN) * kBK * 2;
  static_assert(BM % 16 == 0 && BN % 16 == 0, "BM, BN must be multiples of 16");
};

template <int BM, int BN, int STAGES>
__global__ void __launch_bounds__(BM * 2) gemm_stream_kernel(StreamArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace gemm_detail;
  using Cfg = StreamConfig<BM, BN>;
  constexpr int BK = Cfg::kBK;
  constexpr int kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t smem_base = smem_u32(smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n0 = blockIdx.x * BM, t0 = blockIdx.y * BN;
  const int k_tiles = (a.K + BK - 1) / BK;
  const int kt_begin = blockIdx.z * a.k_tiles_per_split;
  const int kt_end = min(k_tiles, kt_begin + a.k_tiles_per_split);
  const int nkt = max(0, kt_end - kt_begin);
  pdl_wait();  // X, C and the split-K workspace belong to the previous kernels of the step

  // Producer part: every thread copies a few 16-byte chunks of the stage.
  auto load_stage = [&](int stage, int kt) {
    const std::uint32_t sW = smem_base + stage * Cfg::kStageBytes;
    const std::uint32_t sX = sW + BM * BK * 2;
    const int k0 = kt * BK;
#pragma unroll
    for (int i = tid; i < (BM + BN) * 8; i += kThreads) {
      const int row = i >> 3, ch = i & 7;
      const int k = k0 + ch * 8;
      if (row < BM) {
        const int n = n0 + row;
        const bool ok = n < a.N && k < a.K;
        const __nv_bfloat16* src = ok ? a.w + (long long)n * a.ldw + k : a.w;
        cp_async16(sW + row * 128 + ((ch ^ (row & 7)) << 4), src, ok ? 16 : 0);
      } else {
        const int r = row - BM;
        const int t = t0 + r;
        const bool ok = t < a.T && k < a.K;
        const __nv_bfloat16* src = ok ? a.x + (long long)t * a.ldx + k : a.x;
        cp_async16(sX + r * 128 + ((ch ^ (r & 7)) << 4), src, ok ? 16 : 0);
      }
    }
  };

  float acc[BN / 8][4];
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkt) load_stage(s, kt_begin + s);
    cp_async_commit();
  }

  for (int it = 0; it < nkt; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    // Prefetch the stage STAGES-1 ahead (its buffer was consumed in iteration it-1).
    {
      const int nxt = it + STAGES - 1;
      if (nxt < nkt) load_stage(nxt % STAGES, kt_begin + nxt);
      cp_async_commit();
    }
    const int stage = it % STAGES;
    const std::uint32_t sW = smem_base + stage * Cfg::kStageBytes;
    const std::uint32_t sX = sW + BM * BK * 2;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      std::uint32_t af[4];
      {
        const int row = warp * 16 + (lane & 15);
        const int ch = kk * 2 + (lane >> 4);
        ldmatrix_x4(sW + row * 128 + ((ch ^ (row & 7)) << 4), af[0], af[1], af[2], af[3]);
      }
#pragma unroll
      for (int j = 0; j < BN / 8; j += 2) {
        const int r = j * 8 + ((lane >> 4) << 3) + (lane & 7);
        const int ch = kk * 2 + ((lane >> 3) & 1);
        std::uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sX + r * 128 + ((ch ^ (r & 7)) << 4), b0, b1, b2, b3);
        mma_bf16_16816(acc[j], af, b0, b1);
        mma_bf16_16816(acc[j + 1], af, b2, b3);
      }
    }
  }
  cp_async_wait<0>();
  pdl_launch_dependents();

  const int splits = gridDim.z;
  if (splits > 1) {
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    float* my = a.partials + ((long long)tile * splits + blockIdx.z) * (BM * BN);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) __stcg(my + (j * 4 + r) * kThreads + tid, acc[j][r]);
    __threadfence();
    __syncthreads();
    __shared__ unsigned s_last;
    if (tid == 0) {
      const unsigned prev = atomicAdd(a.counters + tile, 1u);
      s_last = (prev == static_cast<unsigned>(splits - 1)) ? 1u : 0u;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // Sum every split's partial (this block's own included, re-read) in split order z = 0, 1, ...,
    // so the result does not depend on which block arrived last: bit-reproducible across launches.
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
    for (int z = 0; z < splits; ++z) {
      const float* part = a.partials + ((long long)tile * splits + z) * (BM * BN);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[j][r] += __ldcg(part + (j * 4 + r) * kThreads + tid);
    }
    if (tid == 0) a.counters[tile] = 0u;  // leave the workspace ready for the next launch
  }

  // acc[j][0..1]: W row g, tokens 2q, 2q+1; acc[j][2..3]: W row g+8.
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = n0 + warp * 16 + g + ((r >> 1) << 3);
      const int t = t0 + j * 8 + 2 * q + (r & 1);
      if (n < a.N && t < a.T) a.c[(long long)t * a.ldc + n] = __float2bfloat16_rn(acc[j][r]);
    }
#endif
}

}  // namespace step5::kernels::sm90
