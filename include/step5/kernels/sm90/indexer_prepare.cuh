#pragma once
/// \file step5/kernels/sm90/indexer_prepare.cuh
/// Post-projection preparation (SPEC.md §4.2–4.3), gridDim.y CTAs per packed token, one warp per
/// head (the token's heads dealt out over the CTAs' warps: `prepare_ctas_per_token`):
/// reads the token's row of the fused GEMM output C and writes
///  - main q: zero-centred RMSNorm x·rsqrt(mean(x²)+eps)·(1+w) → bf16 → NeoX RoPE (rot_main) → q_out
///  - main k: same with k_norm → k_cache; v copied → v_cache (paged, SPEC §5)
///  - indexer q: RMSNorm with (1 + bf16(w)) → bf16 → RoPE (rot_idx) → e4m3 (RNE, satfinite)
///  - indexer k: LayerNorm (var = E[x²] − E[x]²) with bf16 weight/bias → bf16 → RoPE → index_k
///  - weights: float(w) · hpg_i^-0.5
/// Rotation: a' = bf16(a·cos − b·sin), b' = bf16(fma(a, sin, b·cos)) on bf16 values (fp32 math).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/bounds_fault.cuh"
#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"

namespace step5::kernels::sm90 {

/// Per-launch arguments of `indexer_prepare_kernel` (resolved column offsets, sizes).
struct PrepareArgs {
  const __nv_bfloat16* c;
  std::int64_t ldc;
  int col_q, col_k, col_v, col_iq, col_ik, col_w;  // first column of each block in C
  int num_tokens, num_requests;
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* seq_lens;
  const std::int32_t* block_table;
  int max_blocks, block_size, num_blocks;
  int max_position;             // rows of the RoPE tables
  std::int32_t* bounds_fault;   // checked-mode record (bounds_fault.cuh) or null
  int local_heads, local_kv_heads, index_local_heads;
  float eps, weight_scale;
  const float* q_norm;
  const float* k_norm;
  const float* iq_norm;
  const float* ik_w;
  const float* ik_b;
  const __nv_bfloat16* cos_main;
  const __nv_bfloat16* sin_main;
  const __nv_bfloat16* cos_idx;
  const __nv_bfloat16* sin_idx;
  __nv_bfloat16* q_out;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
  std::uint8_t* index_q;
  float* weights;
  __nv_bfloat16* index_k;
};

/// Request of packed token t: the last b with cu[b] <= t (skips empty requests).
__device__ __forceinline__ int request_of_token(const std::int32_t* cu, int num_requests, int t) {
  int lo = 0, hi = num_requests - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(cu + mid) <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

namespace detail {

/// Loads one head of N bf16 values held as pairs: lane owns pairs j*32 + lane (j < N/64).
template <int N>
__device__ __forceinline__ void load_head(const __nv_bfloat16* src, float (&x)[N / 32], int lane) {
#pragma unroll
  for (int j = 0; j < N / 64; ++j) {
    const __nv_bfloat162 v = reinterpret_cast<const __nv_bfloat162*>(src)[j * 32 + lane];
    x[2 * j] = __bfloat162float(v.x);
    x[2 * j + 1] = __bfloat162float(v.y);
  }
}

/// NeoX RoPE on the first ROT dims of a head whose bf16-rounded values are in `x` (pairs layout)
/// using the per-warp scratch row `buf` [N] floats. Returns the rotated values in x.
template <int N, int ROT>
__device__ __forceinline__ void rope_head(float (&x)[N / 32], float* buf, const __nv_bfloat16* cos_row,
                                          const __nv_bfloat16* sin_row, int lane) {
  if constexpr (ROT > 0) {
#pragma unroll
    for (int j = 0; j < N / 64; ++j) {
      buf[2 * (j * 32 + lane)] = x[2 * j];
      buf[2 * (j * 32 + lane) + 1] = x[2 * j + 1];
    }
    __syncwarp();
    constexpr int H = ROT / 2;
#pragma unroll
    for (int j = 0; j < N / 64; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 2 * (j * 32 + lane) + e;
        if (d < ROT) {
          const int i = d < H ? d : d - H;
          const float a = buf[i], b = buf[i + H];
          const float cs = __bfloat162float(cos_row[i]), sn = __bfloat162float(sin_row[i]);
          float r;
          if (d < H) r = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
          else r = __fmaf_rn(a, sn, __fmul_rn(b, cs));
          x[2 * j + e] = __bfloat162float(__float2bfloat16_rn(r));
        }
      }
    }
    __syncwarp();
  }
}

template <int N>
__device__ __forceinline__ void store_head_bf16(__nv_bfloat16* dst, const float (&x)[N / 32], int lane) {
#pragma unroll
  for (int j = 0; j < N / 64; ++j)
    reinterpret_cast<__nv_bfloat162*>(dst)[j * 32 + lane] = __floats2bfloat162_rn(x[2 * j], x[2 * j + 1]);
}

/// Zero-centred RMSNorm of one head: bf16((x * rsqrt(mean(x²)+eps)) * (w + 1)); `round_w` rounds w
/// to bf16 first (indexer norms).
template <int N, bool kRoundW>
__device__ __forceinline__ void rms_norm_head(float (&x)[N / 32], const float* w, float eps, int lane) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < N / 32; ++i) ss = __fmaf_rn(x[i], x[i], ss);
  ss = warp_sum(ss);
  const float rinv = 1.0f / sqrtf(ss / static_cast<float>(N) + eps);
#pragma unroll
  for (int j = 0; j < N / 64; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int d = 2 * (j * 32 + lane) + e;
      float wd = __ldg(w + d);
      if (kRoundW) wd = __bfloat162float(__float2bfloat16_rn(wd));
      x[2 * j + e] = __bfloat162float(__float2bfloat16_rn(__fmul_rn(__fmul_rn(x[2 * j + e], rinv), wd + 1.0f)));
    }
}

}  // namespace detail

/// Grid: (T, CTAs per token), kPrepareThreads threads (8 warps).
inline constexpr int kPrepareThreads = 256;

/// Warp work items of one token: its q heads, k heads, v heads, indexer q heads and the indexer
/// k row (the kernel's item loop and the launcher's CTAs-per-token choice).
__host__ __device__ constexpr int prepare_items(int local_heads, int local_kv_heads, int index_local_heads) {
  return local_heads + 2 * local_kv_heads + index_local_heads + 1;
}

/// CTAs per packed token: enough that each warp of a small batch prepares one head item (the
/// token's `prepare_items`), as long as
/// the grid stays within two waves of `num_sms` (one CTA per token from 2 × num_sms tokens).
/// Measured with one CTA per token (H200, bench/RESULTS.md "Where decode time goes"): 16.5 µs for
/// one step5_preview token at tp 1 (89 items on 8 warps: 12 dependent rounds of load, norm, RoPE).
inline int prepare_ctas_per_token(int num_tokens, int items, int num_sms) {
  constexpr int kWarps = kPrepareThreads / 32;
  const int per_items = (items + kWarps - 1) / kWarps;
  const int per_grid = num_tokens > 0 ? (2 * num_sms + num_tokens - 1) / num_tokens : 1;
  const int y = per_items < per_grid ? per_items : per_grid;
  return y < 1 ? 1 : (y > 65535 ? 65535 : y);
}

template <int D, int P, int ROT_MAIN, int ROT_IDX>
__global__ void __launch_bounds__(kPrepareThreads) indexer_prepare_kernel(PrepareArgs a) {
  static_assert(D % 64 == 0 && P % 64 == 0, "indexer_prepare_kernel: head_dim and proxy_dim must be multiples of 64");
  static_assert(ROT_MAIN % 2 == 0 && ROT_MAIN <= D && ROT_IDX % 2 == 0 && ROT_IDX <= P,
                "indexer_prepare_kernel: rotary dims must be even and fit the head");
#if STEP5_SM90A_DEVICE
  constexpr int kWarps = kPrepareThreads / 32;
  constexpr int kBuf = D > P ? D : P;
  __shared__ float sbuf[kWarps][kBuf];
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  pdl_wait();  // c is the fused GEMM's output; the caches may be read by the previous step
  const int b = request_of_token(a.cu_seqlens_q, a.num_requests, t);
  const int cu0 = __ldg(a.cu_seqlens_q + b), cu1 = __ldg(a.cu_seqlens_q + b + 1);
  const int pos = __ldg(a.seq_lens + b) - (cu1 - cu0) + (t - cu0);
  const __nv_bfloat16* row = a.c + static_cast<std::int64_t>(t) * a.ldc;
  // Device-resident values (graph replay, block ids): a position outside the RoPE tables skips
  // the token; one outside the block-table row or a block id outside [0, num_blocks) skips its
  // KV-cache write (reported in checked mode).
  if (pos < 0 || pos >= a.max_position) {
    if (threadIdx.x == 0 && blockIdx.y == 0)
      report_bounds_fault(a.bounds_fault, ops::BoundsFault::kPositionBeyondRope, b, pos, -1);
    return;
  }
  const std::int64_t blk = checked_block(a.block_table, a.max_blocks, a.block_size, a.num_blocks, b, pos,
                                         threadIdx.x == 0 && blockIdx.y == 0 ? a.bounds_fault : nullptr);
  const std::int64_t kv_row = (blk * a.block_size + pos % a.block_size) * a.local_kv_heads;
  const __nv_bfloat16* cm = a.cos_main + static_cast<std::int64_t>(pos) * (ROT_MAIN / 2);
  const __nv_bfloat16* sm = a.sin_main + static_cast<std::int64_t>(pos) * (ROT_MAIN / 2);
  const __nv_bfloat16* ci = a.cos_idx + static_cast<std::int64_t>(pos) * (ROT_IDX / 2);
  const __nv_bfloat16* si = a.sin_idx + static_cast<std::int64_t>(pos) * (ROT_IDX / 2);

  const int Hl = a.local_heads, KVl = a.local_kv_heads, Il = a.index_local_heads;
  // weights: the threads of the token's first CTA, before the per-head work
  if (blockIdx.y == 0)
    for (int i = threadIdx.x; i < Il; i += kPrepareThreads)
      a.weights[static_cast<std::int64_t>(t) * Il + i] = __bfloat162float(row[a.col_w + i]) * a.weight_scale;

  const int items = prepare_items(Hl, KVl, Il);
  for (int it = blockIdx.y * kWarps + warp; it < items; it += kWarps * gridDim.y) {
    float* buf = sbuf[warp];
    if (it < Hl + KVl) {  // main q or k head
      const bool is_q = it < Hl;
      const int h = is_q ? it : it - Hl;
      float x[D / 32];
      detail::load_head<D>(row + (is_q ? a.col_q + h * D : a.col_k + h * D), x, lane);
      detail::rms_norm_head<D, false>(x, is_q ? a.q_norm : a.k_norm, a.eps, lane);
      detail::rope_head<D, ROT_MAIN>(x, buf, cm, sm, lane);
      __nv_bfloat16* dst = is_q ? a.q_out + (static_cast<std::int64_t>(t) * Hl + h) * D
                                : a.k_cache + (kv_row + h) * D;
      if (is_q || blk >= 0) detail::store_head_bf16<D>(dst, x, lane);
    } else if (it < Hl + 2 * KVl) {  // v head: copy
      if (blk < 0) continue;
      const int h = it - Hl - KVl;
      const __nv_bfloat162* src = reinterpret_cast<const __nv_bfloat162*>(row + a.col_v + h * D);
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(a.v_cache + (kv_row + h) * D);
#pragma unroll
      for (int j = 0; j < D / 64; ++j) dst[j * 32 + lane] = src[j * 32 + lane];
    } else if (it < Hl + 2 * KVl + Il) {  // indexer q head
      const int h = it - Hl - 2 * KVl;
      float x[P / 32];
      detail::load_head<P>(row + a.col_iq + h * P, x, lane);
      detail::rms_norm_head<P, true>(x, a.iq_norm, a.eps, lane);
      detail::rope_head<P, ROT_IDX>(x, buf, ci, si, lane);
      std::uint8_t* dst = a.index_q + (static_cast<std::int64_t>(t) * Il + h) * P;
#pragma unroll
      for (int j = 0; j < P / 64; ++j) {
        const __nv_fp8x2_storage_t v =
            __nv_cvt_float2_to_fp8x2(make_float2(x[2 * j], x[2 * j + 1]), __NV_SATFINITE, __NV_E4M3);
        reinterpret_cast<__nv_fp8x2_storage_t*>(dst)[j * 32 + lane] = v;
      }
    } else {  // indexer k: LayerNorm
      float x[P / 32];
      detail::load_head<P>(row + a.col_ik, x, lane);
      // Signed zero (SPEC §4 "Signed zero"): Σx starts from its first term (peeled), so a row of
      // −0.0 has mean −0.0 as in the reference (Triton tl.sum); the shuffle tree only adds partials.
      float s = x[0], ss = __fmul_rn(x[0], x[0]);
#pragma unroll
      for (int i = 1; i < P / 32; ++i) {
        s += x[i];
        ss = __fmaf_rn(x[i], x[i], ss);
      }
      s = warp_sum(s);
      ss = warp_sum(ss);
      const float mean = s / static_cast<float>(P);
      const float var = __fsub_rn(ss / static_cast<float>(P), __fmul_rn(mean, mean));
      const float rinv = 1.0f / sqrtf(var + a.eps);
#pragma unroll
      for (int j = 0; j < P / 64; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = 2 * (j * 32 + lane) + e;
          const float w = __bfloat162float(__float2bfloat16_rn(__ldg(a.ik_w + d)));
          const float bb = __bfloat162float(__float2bfloat16_rn(__ldg(a.ik_b + d)));
          const float y = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[2 * j + e], mean), rinv), w), bb);
          x[2 * j + e] = __bfloat162float(__float2bfloat16_rn(y));
        }
      detail::rope_head<P, ROT_IDX>(x, buf, ci, si, lane);
      detail::store_head_bf16<P>(a.index_k + static_cast<std::int64_t>(t) * P, x, lane);
    }
  }
  pdl_launch_dependents();
#endif
}

}  // namespace step5::kernels::sm90
