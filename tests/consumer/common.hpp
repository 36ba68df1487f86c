// Shared by the CUDA consumers (tests/consumer/cuda, tests/consumer/header_only): calls the GEMM
// launcher on a small random problem and compares it with a CPU sum, and calls dsa_layer_forward
// (linking every launcher it reaches). Without a GPU: exit 77 (skipped).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "step5/step5.hpp"
#include "step5/ops/elementwise.hpp"
#include "step5/ops/gemm.hpp"
#include "step5/ops/layer.hpp"

namespace consumer {

inline float bf16_to_float(step5::bf16 v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#define CONSUMER_CHECK(cond, ...)          \
  do {                                     \
    if (!(cond)) {                         \
      std::fprintf(stderr, __VA_ARGS__);   \
      std::fprintf(stderr, "\n");          \
      return 1;                            \
    }                                      \
  } while (0)

inline int run() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no GPU (the consumer compiled and linked)\n");
    return 77;
  }
  // dsa_layer_forward with no workspace: a clear kInvalidArgument, nothing launched.
  namespace L = step5::layout;
  using Tp8 = L::StaticLayout<L::geometry_of(L::GeometryId::step5_preview), L::ParallelLayout{8, 4}>;
  const L::RankLayout rank = Tp8::rank<0>();
  step5::ops::DsaLayerCapacity cap{16, 2, 256, 64, 64, 4, 8};
  std::size_t ws = 0;
  const step5::Status wq = step5::ops::dsa_layer_workspace_bytes(rank, 4096, cap, &ws);
  CONSUMER_CHECK(wq.ok() && ws > 0, "dsa_layer_workspace_bytes: %s", wq.to_string().c_str());
  // One decode row of one request (host mirrors valid), so the launcher reaches its workspace check.
  const std::int32_t cu_host[2] = {0, 1}, seq_host[1] = {9};
  step5::ops::DsaLayerStep step;
  step.batch.num_requests = 1;
  step.batch.num_tokens = 1;
  step.batch.cu_seqlens_q_host = cu_host;
  step.batch.seq_lens_host = seq_host;
  std::int32_t* d_table = nullptr;  // [1, max_blocks] block table (never read: refused before a launch)
  CONSUMER_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_table), 4 * sizeof(std::int32_t)) == cudaSuccess, "cudaMalloc failed");
  step.table.block_table = d_table;
  step.batch.cu_seqlens_q = d_table;  // stand-ins for the device arrays (never read either)
  step.batch.seq_lens = d_table;
  step.table.block_size = cap.block_size;
  step.table.max_blocks = cap.max_blocks;
  step.table.num_blocks = cap.num_blocks;
  step.max_seq_len = 9;
  step.topk = 16;
  step5::ops::DsaLayerWeights weights;
  weights.max_position = 4096;
  const step5::Status lf =
      step5::ops::dsa_layer_forward(rank, 4096, weights, step5::ops::DsaLayerCaches{}, step, nullptr, nullptr, nullptr,
                                    0, cap, nullptr);
  cudaFree(d_table);
  CONSUMER_CHECK(!lf.ok() && lf.message().find("workspace") != std::string::npos,
                 "dsa_layer_forward with a null workspace: expected a workspace error, got '%s'", lf.to_string().c_str());
  std::printf("dsa_layer_forward without workspace: %s\n", lf.to_string().c_str());

  // GEMM: C[T, N] = X[T, K] @ W[N, K]^T on fresh random bf16 inputs vs a CPU fp32 sum.
  const int T = 5, N = 96, K = 128;
  std::mt19937 rng(20240601u);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<step5::bf16> x(T * K), w(N * K), c(T * N);
  for (auto& v : x) v.bits = step5::float_to_bf16_bits(dist(rng));
  for (auto& v : w) v.bits = step5::float_to_bf16_bits(dist(rng));
  for (auto& v : c) v.bits = 0x7fc0;  // poison (NaN)
  void *dx = nullptr, *dw = nullptr, *dc = nullptr, *dws = nullptr;
  CONSUMER_CHECK(cudaMalloc(&dx, x.size() * 2) == cudaSuccess && cudaMalloc(&dw, w.size() * 2) == cudaSuccess &&
                     cudaMalloc(&dc, c.size() * 2) == cudaSuccess,
                 "cudaMalloc failed");
  const std::size_t wsb = std::max<std::size_t>(step5::ops::gemm_workspace_bytes(T, N, K), step5::ops::kGemmCounterBytes);
  CONSUMER_CHECK(cudaMalloc(&dws, wsb) == cudaSuccess && cudaMemset(dws, 0, wsb) == cudaSuccess, "workspace");
  CONSUMER_CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
                     cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
                     cudaMemcpy(dc, c.data(), c.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess,
                 "cudaMemcpy failed");
  step5::ops::GemmParams p;
  p.x = static_cast<const step5::bf16*>(dx), p.w = static_cast<const step5::bf16*>(dw);
  p.c = static_cast<step5::bf16*>(dc);
  p.tokens = T, p.n = N, p.k = K, p.ldx = K, p.ldw = K, p.ldc = N, p.workspace = dws, p.workspace_bytes = wsb;
  const step5::Status gs = step5::ops::gemm_bf16(p, nullptr);
  CONSUMER_CHECK(gs.ok(), "gemm_bf16: %s", gs.to_string().c_str());
  CONSUMER_CHECK(cudaDeviceSynchronize() == cudaSuccess, "gemm_bf16 kernel failed");
  CONSUMER_CHECK(cudaMemcpy(c.data(), dc, c.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "copy back");
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      float ref = 0.f;
      for (int k = 0; k < K; ++k) ref += bf16_to_float(x[t * K + k]) * bf16_to_float(w[n * K + k]);
      const float got = bf16_to_float(c[t * N + n]);
      CONSUMER_CHECK(std::fabs(got - ref) <= 0.02f * std::fabs(ref) + 0.05f, "C[%d, %d] = %g, CPU %g", t, n, got, ref);
    }
  cudaFree(dx), cudaFree(dw), cudaFree(dc), cudaFree(dws);
  std::printf("gemm_bf16 %dx%dx%d matches the CPU sum\n", T, N, K);
  return 0;
}

}  // namespace consumer
