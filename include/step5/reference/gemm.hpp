#pragma once
/// \file step5/reference/gemm.hpp
/// CPU reference GEMMs of SPEC.md §3 / §4.1 / §4.8: `C = X @ W^T` with bf16 inputs, fp32
/// accumulation and (optionally) one bf16 rounding of each output. Uses OpenBLAS `cblas_sgemm` on
/// fp32 copies when `STEP5_HAVE_CBLAS` is defined (target step5::reference), else a plain loop.
/// Host-safe (g++).
///
/// Rounding: every output element is the fp32 sum over K of exact bf16×bf16 products (the
/// summation order is OpenBLAS's), rounded once to bf16 (RNE). A GPU GEMM may sum in another
/// order, so compare with a relative tolerance (ARCHITECTURE.md: ≤ 1e-2 for bf16 paths).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/reference/common.hpp"

#if defined(STEP5_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace step5::reference {

/// fp32 GEMM `C[T, N] = X[T, K] @ W[N, K]^T` (all row-major fp32, leading dims in elements).
inline void sgemm_nt(int T, int N, int K, const float* X, int ldx, const float* W, int ldw, float* C, int ldc) {
  if (T == 0 || N == 0) return;
#if defined(STEP5_HAVE_CBLAS)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, X, ldx, W, ldw, 0.0f, C, ldc);
#else
  parallel_for(T, [&](int t) {
    for (int n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += X[static_cast<std::size_t>(t) * ldx + k] * W[static_cast<std::size_t>(n) * ldw + k];
      C[static_cast<std::size_t>(t) * ldc + n] = acc;
    }
  });
#endif
}

namespace detail {
inline void check_gemm_args(const char* fn, int T, int N, int K, int ldx, int ldw, int ldc) {
  require(T >= 0 && N >= 0 && K > 0, fn,
          "T = " + std::to_string(T) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K) +
              "; expected T >= 0, N >= 0, K > 0");
  require(ldx >= K, fn, "ldx = " + std::to_string(ldx) + " < K = " + std::to_string(K));
  require(ldw >= K, fn, "ldw = " + std::to_string(ldw) + " < K = " + std::to_string(K));
  require(ldc >= N, fn, "ldc = " + std::to_string(ldc) + " < N = " + std::to_string(N));
}

/// Runs `C = X @ W^T` in fp32 over W row chunks (bounded temporary memory); `store(t, n, value)`.
template <class Store>
void gemm_bf16_chunks(int T, int N, int K, const bf16* X, int ldx, const bf16* W, int ldw, Store&& store) {
  std::vector<float> xf(static_cast<std::size_t>(T) * K);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) xf[static_cast<std::size_t>(t) * K + k] = to_float(X[static_cast<std::size_t>(t) * ldx + k]);
  const int chunk = std::max(1, std::min(N, (1 << 22) / K));  // ~16 MiB of fp32 weights per chunk
  std::vector<float> wf(static_cast<std::size_t>(chunk) * K), cf(static_cast<std::size_t>(T) * chunk);
  for (int n0 = 0; n0 < N; n0 += chunk) {
    const int nc = std::min(chunk, N - n0);
    for (int n = 0; n < nc; ++n)
      for (int k = 0; k < K; ++k)
        wf[static_cast<std::size_t>(n) * K + k] = to_float(W[static_cast<std::size_t>(n0 + n) * ldw + k]);
    sgemm_nt(T, nc, K, xf.data(), K, wf.data(), K, cf.data(), nc);
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < nc; ++n) store(t, n0 + n, cf[static_cast<std::size_t>(t) * nc + n]);
  }
}
}  // namespace detail

/// `C[T, N] = bf16(X[T, K] @ W[N, K]^T)` (SPEC §3 "Forward", §4.1, §4.8 o_proj).
/// X, W, C bf16 row-major with leading dims ldx >= K, ldw >= K, ldc >= N (elements). fp32
/// accumulation, one RNE rounding per output. Columns of C beyond N are not touched.
/// Throws `step5::Error` on bad sizes.
inline void gemm_bf16(int T, int N, int K, const bf16* X, int ldx, const bf16* W, int ldw, bf16* C, int ldc) {
  detail::check_gemm_args("gemm_bf16", T, N, K, ldx, ldw, ldc);
  detail::gemm_bf16_chunks(T, N, K, X, ldx, W, ldw, [&](int t, int n, float v) {
    C[static_cast<std::size_t>(t) * ldc + n] = to_bf16(v);
  });
}

/// `C[T, N] = X[T, K] @ W[N, K]^T` in fp32 (no output rounding): the unrounded accumulator, for
/// tests that want to bound a GPU GEMM's error against the exact-ish value.
inline void gemm_bf16_f32out(int T, int N, int K, const bf16* X, int ldx, const bf16* W, int ldw, float* C, int ldc) {
  detail::check_gemm_args("gemm_bf16_f32out", T, N, K, ldx, ldw, ldc);
  detail::gemm_bf16_chunks(T, N, K, X, ldx, W, ldw, [&](int t, int n, float v) {
    C[static_cast<std::size_t>(t) * ldc + n] = v;
  });
}

}  // namespace step5::reference
