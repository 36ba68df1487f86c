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
/// Latency: each warp issues the loads of its next work item before computing the current one (its
/// first item's before the token's position is known, and the token's request row with the
/// request search: `request_guess`); the RoPE factors are loaded once per token;
/// the rotation partner comes by lane shuffle where the layout allows (RopeLane::kShuffle). Three
/// instances: `indexer_prepare_wide_kernel` (register-bound for 6 CTAs per SM) for many tokens,
/// `indexer_prepare_kernel` for decode and MTP (prepare_min_ctas_per_sm), and the same with step 4
/// folded in for a decode step (kFold: FoldedSummary, SPEC §4.4).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>  // std::conditional_t

#include "step5/kernels/sm90/bounds_fault.cuh"
#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/indexer_summaries.cuh"  // region_summary_e4m3 (the decode fold)
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/kernels/sm90/ptx.cuh"  // cp.async (the fold stages the tail rows), bf16 pairs
#include "step5/layout/geometry.hpp"  // kRegionSize
#include "step5/ops/indexer.hpp"      // indexer_prepare_many_tokens

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
  /// Step 4 folded into the launch (kFold instances only; indexer_prepare_folds_summaries): the
  /// summaries kernel's arguments of the step (ops::detail::summary_args), of which the fold reads
  /// col_z, summary_cache, tail, tail_slot and num_slots.
  SummaryArgs fold;
};

/// Request of packed token t: the last b with cu[b] <= t (skips empty requests). The score kernel
/// finds the request of score tile t the same way, over its tile_start array (score_tile).
__device__ __forceinline__ int request_of_token(const std::int32_t* cu, int num_requests, int t) {
  int lo = 0, hi = num_requests - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(cu + mid) <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/// A request's cu_seqlens_q pair and seq_lens entry. Token t of the request (cu0 <= t < cu1) sits
/// at position past() + (t - cu0) (SPEC §5: seq_len - q_len + i).
struct RequestRow {
  int cu0, cu1, seq_len;
  __device__ __forceinline__ int past() const { return seq_len - (cu1 - cu0); }
  __device__ __forceinline__ int position(int t) const { return past() + (t - cu0); }
};
__device__ __forceinline__ RequestRow load_request_row(const std::int32_t* cu, const std::int32_t* seq_lens, int b) {
  return {__ldg(cu + b), __ldg(cu + b + 1), __ldg(seq_lens + b)};
}
/// The decode guess of the request of token (or score tile) t: in a decode step every request has
/// one token, so token t is request t. Its RequestRow is loaded before the search that finds the
/// request (`load_request_row` of the guess, then `confirmed_request_row` once the search is done), so that
/// the two round trips overlap instead of following each other; a miss (MTP, prefill, empty
/// requests) loads the found request's row after the search, as without the guess.
/// num_requests >= 1.
__device__ __forceinline__ int request_guess(int t, int num_requests) { return max(0, min(t, num_requests - 1)); }
__device__ __forceinline__ RequestRow confirmed_request_row(const RequestRow& guessed, int guess, const std::int32_t* cu,
                                                            const std::int32_t* seq_lens, int b) {
  return b == guess ? guessed : load_request_row(cu, seq_lens, b);
}
/// Request b of packed token t (request_of_token) and its RequestRow, the row of the decode guess
/// loaded together with the search.
struct TokenRequest {
  int b;
  RequestRow row;
};
__device__ __forceinline__ TokenRequest token_request(const std::int32_t* cu, const std::int32_t* seq_lens,
                                                      int num_requests, int t) {
  const int guess = request_guess(t, num_requests);
  const RequestRow guessed = load_request_row(cu, seq_lens, guess);
  const int b = request_of_token(cu, num_requests, t);
  return {b, confirmed_request_row(guessed, guess, cu, seq_lens, b)};
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

namespace detail {

/// Pair blocks per lane of a head of N bf16 values: lane owns the pairs j*32 + lane, j < N/64
/// (dims 2(j*32 + lane) and 2(j*32 + lane) + 1).
template <int N>
inline constexpr int kPairBlocks = N / 64;

/// The raw bf16 pairs of one head (N values) as loaded: raw[j] = pair j*32 + lane. 32-bit loads,
/// issued for the next work item of a warp before the current one is computed.
template <int N, int CAP>
__device__ __forceinline__ void load_pairs(const __nv_bfloat16* src, unsigned (&raw)[CAP], int lane) {
  static_assert(kPairBlocks<N> <= CAP, "load_pairs: the head does not fit the buffer");
#pragma unroll
  for (int j = 0; j < kPairBlocks<N>; ++j) raw[j] = reinterpret_cast<const unsigned*>(src)[j * 32 + lane];
}

/// bf16 pairs → fp32 values x[2j] (low half, .x) and x[2j + 1] (high half, .y); exact.
template <int N, int CAP>
__device__ __forceinline__ void unpack_pairs(const unsigned (&raw)[CAP], float (&x)[N / 32]) {
#pragma unroll
  for (int j = 0; j < kPairBlocks<N>; ++j) {
    x[2 * j] = ptx::bf16_lo(raw[j]);
    x[2 * j + 1] = ptx::bf16_hi(raw[j]);
  }
}

/// cos / sin of one lane's rotated dims of an N-wide head (NeoX RoPE on the first ROT dims, pairs
/// layout): for dim d = 2(j*32 + lane) + e < ROT, the table entry i = d < H ? d : d − H (H = ROT/2).
/// Loaded once per token (every head of the token has the same position), not once per head.
template <int N, int ROT>
struct RopeLane {
  static_assert(ROT % 2 == 0 && ROT <= N, "RopeLane: rotary dims must be even and fit the head");
  static constexpr int kH = ROT / 2;
  static constexpr int kJ = ROT > 0 ? (ROT + 63) / 64 : 1;  // pair blocks holding rotated dims (d >= 64 j)
  /// The rotation partner of dim d (d ± H) is in lane ^ (H/2), same half, when the rotated dims are
  /// the first pair block (ROT <= 64) and H/2 is a power of two: a shuffle instead of shared memory.
  static constexpr bool kShuffle = ROT > 0 && ROT <= 64 && ROT % 4 == 0 && ((kH / 2) & (kH / 2 - 1)) == 0;
  float cs[kJ][2], sn[kJ][2];
  __device__ __forceinline__ void load(const __nv_bfloat16* cos_row, const __nv_bfloat16* sin_row, int lane) {
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 2 * (j * 32 + lane) + e;
        const int i = d < kH ? d : d - kH;
        const bool rot = d < ROT;
        cs[j][e] = rot ? __bfloat162float(cos_row[i]) : 0.f;
        sn[j][e] = rot ? __bfloat162float(sin_row[i]) : 0.f;
      }
  }
};

/// NeoX RoPE on the first ROT dims of a head whose bf16-rounded values are in `x` (pairs layout),
/// with the lane's factors `f`: a' = bf16(a·cos − b·sin) (d < H, b = x[d + H]), b' = bf16(fma(a, sin,
/// b·cos)) (d >= H, a = x[d − H]). The partner value comes by shuffle (RopeLane::kShuffle) or
/// through the per-warp scratch row `buf` [N] floats. Returns the rotated values in x.
template <int N, int ROT>
__device__ __forceinline__ void rope_head(float (&x)[N / 32], float* buf, const RopeLane<N, ROT>& f, int lane) {
  if constexpr (ROT > 0) {
    constexpr int H = ROT / 2;
    if constexpr (RopeLane<N, ROT>::kShuffle) {
      const float p0 = __shfl_xor_sync(0xffffffffu, x[0], H / 2);
      const float p1 = __shfl_xor_sync(0xffffffffu, x[1], H / 2);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 2 * lane + e;
        const float own = x[e], partner = e == 0 ? p0 : p1;
        if (d < ROT) {
          float r;
          if (d < H) r = __fsub_rn(__fmul_rn(own, f.cs[0][e]), __fmul_rn(partner, f.sn[0][e]));
          else r = __fmaf_rn(partner, f.sn[0][e], __fmul_rn(own, f.cs[0][e]));
          x[e] = __bfloat162float(__float2bfloat16_rn(r));
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < N / 64; ++j) {
        buf[2 * (j * 32 + lane)] = x[2 * j];
        buf[2 * (j * 32 + lane) + 1] = x[2 * j + 1];
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < RopeLane<N, ROT>::kJ; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = 2 * (j * 32 + lane) + e;
          if (d < ROT) {
            const int i = d < H ? d : d - H;
            const float a = buf[i], b = buf[i + H];
            float r;
            if (d < H) r = __fsub_rn(__fmul_rn(a, f.cs[j][e]), __fmul_rn(b, f.sn[j][e]));
            else r = __fmaf_rn(a, f.sn[j][e], __fmul_rn(b, f.cs[j][e]));
            x[2 * j + e] = __bfloat162float(__float2bfloat16_rn(r));
          }
        }
      }
      __syncwarp();
    }
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
/// Resident CTAs per SM of the kernel instance for many tokens (__launch_bounds__): 6 x 8 warps at
/// <= 40 registers, each warp with two work items' loads in flight (the current and the next);
/// without the bound ptxas takes 64 registers, 4 CTAs per SM. Measured on the H200 (bench_layer,
/// bench/RESULTS.md twelfth session): the bound makes prefill prepare 10-17 % faster (tp 8 32K
/// 221 -> 183 µs) but decode 0.5-0.9 µs slower (tp 8 batch 1 6.3 -> 7.1 µs), hence two instances.
/// Both rows of geometries.def compile to 40 registers with no spills under it; wider heads may
/// spill (head_dim = proxy_dim = 256 with full rotary: 84 bytes, compiled in review, not listed).
inline constexpr int kPrepareMinCtasPerSm = 6;

/// The instance for a launch of `num_tokens` tokens on `num_sms` SMs: kPrepareMinCtasPerSm from
/// 2 x num_sms tokens (ops::indexer_prepare_many_tokens: one CTA per token and more than a wave,
/// occupancy is what hides the loads), else 1 (decode, MTP: a few CTAs per token, each
/// latency-bound; the unbounded registers are faster).
inline int prepare_min_ctas_per_sm(int num_tokens, int num_sms) {
  return ops::indexer_prepare_many_tokens(num_tokens, num_sms) ? kPrepareMinCtasPerSm : 1;
}

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
  const long long per_grid = num_tokens > 0 ? (2ll * num_sms + num_tokens - 1) / num_tokens : 1;
  const long long y = per_items < per_grid ? per_items : per_grid;
  return y < 1 ? 1 : (y > 65535 ? 65535 : static_cast<int>(y));
}

/// Work item `it` of a token (of `items`) as an index into the order q heads, k heads, v heads,
/// indexer q heads, the indexer k row: item 0 is the indexer k row (its warp starts first, which
/// matters when it also does step 4: FoldedSummary), items 1.. the rest in that order.
__device__ __forceinline__ int prepare_item_kind(int it, int items) { return it == 0 ? items - 1 : it - 1; }

/// Column in C of work item `it` of a token (`prepare_item_kind`) and whether it is P wide
/// (indexer) rather than D (main).
__device__ __forceinline__ int prepare_item_column(const PrepareArgs& a, int it, int items, int D, int P, bool* proxy) {
  const int Hl = a.local_heads, KVl = a.local_kv_heads;
  it = prepare_item_kind(it, items);
  *proxy = it >= Hl + 2 * KVl;
  if (it < Hl) return a.col_q + it * D;
  if (it < Hl + KVl) return a.col_k + (it - Hl) * D;
  if (it < Hl + 2 * KVl) return a.col_v + (it - Hl - KVl) * D;
  if (it < Hl + 2 * KVl + a.index_local_heads) return a.col_iq + (it - Hl - 2 * KVl) * P;
  return a.col_ik;
}

/// Issues the loads of work item `it` of the token whose C row is `row` (nothing past `items`).
template <int D, int P, int CAP>
__device__ __forceinline__ void prepare_load_item(const PrepareArgs& a, const __nv_bfloat16* row, int it, int items,
                                                  unsigned (&raw)[CAP], int lane) {
  if (it >= items) return;
  bool proxy = false;
  const int col = prepare_item_column(a, it, items, D, P, &proxy);
  if (proxy) detail::load_pairs<P>(row + col, raw, lane);
  else detail::load_pairs<D>(row + col, raw, lane);
}

/// Step 4 (SPEC §4.4) of one decode token folded into its indexer k work item (kFold instances):
/// the warp holding the token's indexer k row (pairs layout: lane owns dims 2(j·32 + lane) + e)
/// either completes the token's region — position p = seq_len − 1 with p % 8 == 7: the 7 earlier
/// rows from the request's tail slot, this row last, m = the max of z over the 8 × P block (lane
/// maxima, then a warp reduction), `region_summary_e4m3` per dim — or appends (index_k, raw z) to
/// row p % 8 of the tail slot. The same reads, formula and writes as indexer_summaries_kernel for
/// a request with one token in the step (a tail slot outside [0, num_slots) is reported, not read
/// or written, and the region it would complete is not summarised, as there); a request with more tokens on the device is reported and left alone, and a
/// token skipped for a position outside the RoPE tables (reported) writes neither (the summaries
/// kernel would summarise its unwritten index_k row: both are meaningless then). `load` stages
/// the 7 tail rows in shared memory (`kSmemWords`, cp.async: no registers held) and loads the
/// token's z before the LayerNorm, so both overlap it; `finish` runs after it. Alignment (checked
/// by the launcher, ops::detail::check_summary_outputs): tail 16 bytes, summary_cache 2 bytes.
template <int P>
struct FoldedSummary {
  static constexpr int kR = layout::kRegionSize, kJ = P / 64;
  /// The staged tail rows: [kR − 1][2][P] bf16 as 32-bit pairs.
  static constexpr int kSmemWords = (kR - 1) * 2 * (P / 2);
  unsigned* rows;  // kSmemWords of shared memory
  unsigned z[kJ];  // this token's raw index_z pairs
  int row_in_region, slot;
  bool active, slot_ok;

  __device__ __forceinline__ void load(const PrepareArgs& a, const __nv_bfloat16* crow, int b, int q_len, int pos,
                                       int lane) {
    active = q_len == 1;
    if (!active) {
      if (lane == 0) report_bounds_fault(a.bounds_fault, ops::BoundsFault::kFoldedStepNotDecode, b, pos, q_len);
      return;
    }
    row_in_region = pos % kR;
    slot = __ldg(a.fold.tail_slot + b);
    slot_ok = slot >= 0 && slot < a.fold.num_slots;
    if (!slot_ok && lane == 0) report_bounds_fault(a.bounds_fault, ops::BoundsFault::kTailSlotOutOfRange, b, pos, slot);
    detail::load_pairs<P>(crow + a.fold.col_z, z, lane);
    if (row_in_region == kR - 1) {  // the region completes: stage its rows 0..6 (zeros, unused, from a bad slot)
      const char* t = reinterpret_cast<const char*>(tail_slot_ptr<P>(a.fold.tail, slot_ok ? slot : 0));
      for (int i = lane; i < kSmemWords / 4; i += 32)
        ptx::cp_async16(ptx::smem_u32(rows + 4 * i), t + 16 * i, slot_ok ? 16 : 0);
      ptx::cp_async_commit();
    }
  }

  /// x: the token's indexer k row (bf16 values, pairs layout); blk: the block of `pos` (-1: not
  /// written, reported by the caller).
  __device__ __forceinline__ void finish(const PrepareArgs& a, const float (&x)[P / 32], int pos, std::int64_t blk,
                                         int lane) {
    if (!active) return;
    if (row_in_region != kR - 1) {  // the row waits in the tail slot for its region's last token
      if (!slot_ok) return;
      unsigned* t = reinterpret_cast<unsigned*>(tail_slot_ptr<P>(a.fold.tail, slot));
#pragma unroll
      for (int q = 0; q < kJ; ++q) {
        const __nv_bfloat162 kv = __floats2bfloat162_rn(x[2 * q], x[2 * q + 1]);
        t[tail_row_offset<P / 2>(row_in_region, 0) + q * 32 + lane] = *reinterpret_cast<const unsigned*>(&kv);
        t[tail_row_offset<P / 2>(row_in_region, 1) + q * 32 + lane] = z[q];
      }
      return;
    }
    ptx::cp_async_wait<0>();
    __syncwarp();
    using ptx::bf16_hi;
    using ptx::bf16_lo;
    auto tail_k = [&](int j, int q) { return rows[tail_row_offset<P / 2>(j, 0) + q * 32 + lane]; };
    auto tail_z = [&](int j, int q) { return rows[tail_row_offset<P / 2>(j, 1) + q * 32 + lane]; };
    float m = bf16_lo(z[0]);
#pragma unroll
    for (int q = 0; q < kJ; ++q) {
      m = fmaxf(m, fmaxf(bf16_lo(z[q]), bf16_hi(z[q])));
#pragma unroll
      for (int j = 0; j < kR - 1; ++j) m = fmaxf(m, fmaxf(bf16_lo(tail_z(j, q)), bf16_hi(tail_z(j, q))));
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    if (blk < 0 || !slot_ok) return;  // no block, or rows 0..6 unknown (a bad tail slot)
    const int sl = (pos % a.block_size) / kR;
    std::uint8_t* dst = a.fold.summary_cache + (blk * (a.block_size / kR) + sl) * P;
#pragma unroll
    for (int q = 0; q < kJ; ++q) {
      unsigned short two = 0;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float kk[kR], zz[kR];
#pragma unroll
        for (int j = 0; j < kR - 1; ++j) {
          kk[j] = e == 0 ? bf16_lo(tail_k(j, q)) : bf16_hi(tail_k(j, q));
          zz[j] = e == 0 ? bf16_lo(tail_z(j, q)) : bf16_hi(tail_z(j, q));
        }
        kk[kR - 1] = x[2 * q + e];
        zz[kR - 1] = e == 0 ? bf16_lo(z[q]) : bf16_hi(z[q]);
        two |= static_cast<unsigned short>(region_summary_e4m3(kk, zz, m)) << (8 * e);
      }
      reinterpret_cast<unsigned short*>(dst)[q * 32 + lane] = two;
    }
  }
};

/// Empty stand-in of FoldedSummary in the instances without the fold.
template <int P>
struct NoFold {
  static constexpr int kSmemWords = 1;
  unsigned* rows;
  __device__ __forceinline__ void load(const PrepareArgs&, const __nv_bfloat16*, int, int, int, int) {}
  __device__ __forceinline__ void finish(const PrepareArgs&, const float (&)[P / 32], int, std::int64_t, int) {}
};

/// The kernel body (the instances below): one token's work items, gridDim.y CTAs per token; kFold:
/// step 4 of a decode step too (FoldedSummary).
template <int D, int P, int ROT_MAIN, int ROT_IDX, bool kFold = false>
__device__ __forceinline__ void prepare_token(const PrepareArgs& a) {
  static_assert(D % 64 == 0 && P % 64 == 0, "indexer_prepare_kernel: head_dim and proxy_dim must be multiples of 64");
  static_assert(ROT_MAIN % 2 == 0 && ROT_MAIN <= D && ROT_IDX % 2 == 0 && ROT_IDX <= P,
                "indexer_prepare_kernel: rotary dims must be even and fit the head");
#if STEP5_SM90A_DEVICE
  constexpr int kWarps = kPrepareThreads / 32;
  constexpr int kBuf = D > P ? D : P;
  constexpr int kCap = kBuf / 64;  // pair blocks of the widest item
  __shared__ float sbuf[kWarps][kBuf];
  using Fold = std::conditional_t<kFold, FoldedSummary<P>, NoFold<P>>;
  // the tail rows a fold stages: item 0 (the indexer k row) is the only one that folds, and it is
  // warp 0's first item in CTA y == 0, so one buffer per CTA
  __shared__ __align__(16) unsigned fold_rows[Fold::kSmemWords];
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int Hl = a.local_heads, KVl = a.local_kv_heads, Il = a.index_local_heads;
  const int items = prepare_items(Hl, KVl, Il);
  const int stride = kWarps * static_cast<int>(gridDim.y);
  const __nv_bfloat16* row = a.c + static_cast<std::int64_t>(t) * a.ldc;
  pdl_wait();  // c is the fused GEMM's output; the caches may be read by the previous step
  // The warp's first item is loaded before the token's position is known (it needs only the row):
  // its latency overlaps the request search and the block-table lookup.
  int it = static_cast<int>(blockIdx.y) * kWarps + warp;
  unsigned cur[kCap] = {};
  prepare_load_item<D, P>(a, row, it, items, cur, lane);
  const TokenRequest tr = token_request(a.cu_seqlens_q, a.seq_lens, a.num_requests, t);
  const int b = tr.b;
  const RequestRow& req = tr.row;
  const int pos = req.position(t);
  // Device-resident values (graph replay, block ids): a position outside the RoPE tables skips
  // the token; one outside the block-table row or a block id outside [0, num_blocks) skips its
  // KV-cache write (reported in checked mode).
  if (pos < 0 || pos >= a.max_position) {
    if (threadIdx.x == 0 && blockIdx.y == 0)
      report_bounds_fault(a.bounds_fault, ops::BoundsFault::kPositionBeyondRope, b, pos, -1);
    return;
  }
  detail::RopeLane<D, ROT_MAIN> rope_main;
  detail::RopeLane<P, ROT_IDX> rope_idx;
  rope_main.load(a.cos_main + static_cast<std::int64_t>(pos) * (ROT_MAIN / 2),
                 a.sin_main + static_cast<std::int64_t>(pos) * (ROT_MAIN / 2), lane);
  rope_idx.load(a.cos_idx + static_cast<std::int64_t>(pos) * (ROT_IDX / 2),
                a.sin_idx + static_cast<std::int64_t>(pos) * (ROT_IDX / 2), lane);
  const std::int64_t blk = checked_block(a.block_table, a.max_blocks, a.block_size, a.num_blocks, b, pos,
                                         threadIdx.x == 0 && blockIdx.y == 0 ? a.bounds_fault : nullptr);
  const std::int64_t kv_row = (blk * a.block_size + pos % a.block_size) * KVl;

  // weights: the threads of the token's first CTA, before the per-head work
  if (blockIdx.y == 0)
    for (int i = threadIdx.x; i < Il; i += kPrepareThreads)
      a.weights[static_cast<std::int64_t>(t) * Il + i] = __bfloat162float(row[a.col_w + i]) * a.weight_scale;

  float* buf = sbuf[warp];
  for (; it < items; it += stride) {
    unsigned next[kCap] = {};
    prepare_load_item<D, P>(a, row, it + stride, items, next, lane);  // in flight while this item is computed
    const int kind = prepare_item_kind(it, items);
    if (kind < Hl + KVl) {  // main q or k head
      const bool is_q = kind < Hl;
      const int h = is_q ? kind : kind - Hl;
      float x[D / 32];
      detail::unpack_pairs<D>(cur, x);
      detail::rms_norm_head<D, false>(x, is_q ? a.q_norm : a.k_norm, a.eps, lane);
      detail::rope_head<D, ROT_MAIN>(x, buf, rope_main, lane);
      __nv_bfloat16* dst = is_q ? a.q_out + (static_cast<std::int64_t>(t) * Hl + h) * D
                                : a.k_cache + (kv_row + h) * D;
      if (is_q || blk >= 0) detail::store_head_bf16<D>(dst, x, lane);
    } else if (kind < Hl + 2 * KVl) {  // v head: copy
      if (blk >= 0) {
        const int h = kind - Hl - KVl;
        unsigned* dst = reinterpret_cast<unsigned*>(a.v_cache + (kv_row + h) * D);
#pragma unroll
        for (int j = 0; j < D / 64; ++j) dst[j * 32 + lane] = cur[j];
      }
    } else if (kind < Hl + 2 * KVl + Il) {  // indexer q head
      const int h = kind - Hl - 2 * KVl;
      float x[P / 32];
      detail::unpack_pairs<P>(cur, x);
      detail::rms_norm_head<P, true>(x, a.iq_norm, a.eps, lane);
      detail::rope_head<P, ROT_IDX>(x, buf, rope_idx, lane);
      std::uint8_t* dst = a.index_q + (static_cast<std::int64_t>(t) * Il + h) * P;
#pragma unroll
      for (int j = 0; j < P / 64; ++j) {
        const __nv_fp8x2_storage_t v =
            __nv_cvt_float2_to_fp8x2(make_float2(x[2 * j], x[2 * j + 1]), __NV_SATFINITE, __NV_E4M3);
        reinterpret_cast<__nv_fp8x2_storage_t*>(dst)[j * 32 + lane] = v;
      }
    } else {  // indexer k: LayerNorm
      Fold fold;
      fold.rows = fold_rows;
      fold.load(a, row, b, req.cu1 - req.cu0, pos, lane);  // in flight during the LayerNorm below
      float x[P / 32];
      detail::unpack_pairs<P>(cur, x);
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
      detail::rope_head<P, ROT_IDX>(x, buf, rope_idx, lane);
      detail::store_head_bf16<P>(a.index_k + static_cast<std::int64_t>(t) * P, x, lane);
      fold.finish(a, x, pos, blk, lane);
    }
#pragma unroll
    for (int j = 0; j < kCap; ++j) cur[j] = next[j];
  }
  pdl_launch_dependents();
#endif
}

/// CTAs per SM the fold instance's registers must allow (__launch_bounds__; 0 = unspecified for
/// the plain instance, 64 registers). This instance's grid, T · ceil(2 · num_sms / T) CTAs at most
/// (prepare_ctas_per_token) with T < 2 · num_sms, is below 4 · num_sms: one wave at 4 per SM. The
/// fold's tail rows go through shared memory: held in registers they took 126 registers (2 CTAs
/// per SM; a tp 1 batch-64 step's 320 CTAs ran in two waves, prepare +1.7 µs, bench/RESULTS.md
/// fourteenth session); staged, ptxas -v (CUDA 13.0, both geometries.def rows) gives 73 unbounded
/// and 64 with no spills under this bound.
inline constexpr int kPrepareFoldMinCtasPerSm = 4;

/// Few tokens (decode, MTP: prepare_min_ctas_per_sm(...) == 1): no register bound. kFold: step 4
/// too (a decode step: ops::indexer_prepare_folds_summaries), kPrepareFoldMinCtasPerSm per SM.
template <int D, int P, int ROT_MAIN, int ROT_IDX, bool kFold = false>
__global__ void __launch_bounds__(kPrepareThreads, kFold ? kPrepareFoldMinCtasPerSm : 0)
    indexer_prepare_kernel(PrepareArgs a) {
  prepare_token<D, P, ROT_MAIN, ROT_IDX, kFold>(a);
}

/// Many tokens (prefill): kPrepareMinCtasPerSm resident CTAs per SM.
template <int D, int P, int ROT_MAIN, int ROT_IDX>
__global__ void __launch_bounds__(kPrepareThreads, kPrepareMinCtasPerSm) indexer_prepare_wide_kernel(PrepareArgs a) {
  prepare_token<D, P, ROT_MAIN, ROT_IDX>(a);
}

}  // namespace step5::kernels::sm90
