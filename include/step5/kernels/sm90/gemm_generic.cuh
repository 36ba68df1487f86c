#pragma once
/// \file step5/kernels/sm90/gemm_generic.cuh
/// Generic projection GEMM `C[T, N] = X[T, K] @ W[N, K]^T` (SPEC §3/§4.1) for any shape, stride
/// and alignment: 64×64 output tiles, 256 threads (4×4 outputs each), K in steps of 32 through
/// shared memory with scalar bounds-checked loads, fp32 accumulation. Slow but always correct;
/// the launcher uses it only when the fast paths' preconditions fail.
#include "step5/kernels/sm90/gemm_common.cuh"
#include "step5/kernels/sm90/pdl.cuh"

namespace step5::kernels::sm90 {

struct GenericArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* c;
  long long T, N, K;
  long long ldx, ldw, ldc;
};

/// A template (with one instance) so that every translation unit including this header may
/// define it (one-definition rule).
template <int = 0>
__global__ void __launch_bounds__(256) gemm_generic_kernel(GenericArgs a) {
#if STEP5_SM90A_DEVICE
  constexpr int TM = 64, TN = 64, TK = 32;
  __shared__ float sx[TK][TM + 1];
  __shared__ float sw[TK][TN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const long long t0 = static_cast<long long>(blockIdx.y) * TM, n0 = static_cast<long long>(blockIdx.x) * TN;
  float acc[4][4] = {};
  pdl_wait();
  for (long long k0 = 0; k0 < a.K; k0 += TK) {
    for (int i = threadIdx.x; i < TM * TK; i += 256) {
      const int r = i / TK, kk = i % TK;
      const long long t = t0 + r, n = n0 + r, k = k0 + kk;
      sx[kk][r] = (t < a.T && k < a.K) ? __bfloat162float(a.x[t * a.ldx + k]) : 0.f;
      sw[kk][r] = (n < a.N && k < a.K) ? __bfloat162float(a.w[n * a.ldw + k]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < TK; ++kk) {
      float xv[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xv[i] = sx[kk][ty + 16 * i];
        wv[i] = sw[kk][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
    }
    __syncthreads();
  }
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long t = t0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (t < a.T && n < a.N) a.c[t * a.ldc + n] = __float2bfloat16_rn(acc[i][j]);
    }
#endif
}

}  // namespace step5::kernels::sm90
