#pragma once
/// \file step5/kernels/sm90/indexer_topk.cuh
/// Deterministic top-k selection of SPEC.md §4.6, one CTA per (token, group) row.
///
/// Order: scores are mapped to order-preserving uint32 keys (NaN → 0xffffffff above +inf, −0 → +0);
/// the selection is the first k of (key descending, region id ascending), which is unique, so the
/// result never depends on thread timing. A 4-pass 8-bit radix select (shared-memory histograms,
/// warp-aggregated with __match_any_sync so plateaus of equal scores do not serialise) finds the
/// k-th key K* and how many keys equal to K* are taken (`need`); a compaction pass in id order
/// (cub::BlockScan) then writes ids with key > K*, and the first `need` ids with key == K*, ascending.
/// Rows whose history fits (k == n) skip the radix passes. Keys are staged in dynamic shared memory
/// when the row fits (kSmem), else re-read from global memory each pass (rows up to 131072 regions
/// and beyond).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "step5/core/cuda_check.hpp"
#include "step5/kernels/sm90/indexer_prepare.cuh"  // request_of_token

namespace step5::kernels::sm90 {

/// Order-preserving key of an fp32 score (SPEC §4.6): larger key = ranks higher.
__device__ __forceinline__ std::uint32_t score_key(float f) {
  std::uint32_t u = __float_as_uint(f);
  const std::uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0xffffffffu;  // NaN ranks above every number
  if (mag == 0) u = 0;                        // -0 == +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Rows of a selection launch. Raw mode (history != nullptr): row r has n = history[r] and writes
/// output row r. Indexer mode: row r = (t - t0) * lg + g, n = position(t) / 8, output row g*T + t.
struct TopkArgs {
  const float* scores;
  std::int64_t ld;
  const std::int32_t* history;
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* seq_lens;
  int num_requests, num_tokens, t0, lg;
  int topk;
  std::int32_t* ids;
  std::int64_t ld_ids;
  std::int32_t* counts;
};

inline constexpr int kTopkThreads = 512;
inline constexpr int kTopkItems = 8;  // ids per thread per compaction tile
/// Rows with at most this many regions stage their keys in shared memory.
inline constexpr int kTopkSmemKeys = 49152;

template <bool kSmem>
__global__ void __launch_bounds__(kTopkThreads) topk_select_kernel(TopkArgs a) {
  using Scan = cub::BlockScan<unsigned long long, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned hist[256];
  __shared__ unsigned s_digit, s_above, s_count;
  extern __shared__ std::uint32_t skeys[];

  const int r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int n;
  std::int64_t orow;
  if (a.history != nullptr) {
    n = a.history[r];
    orow = r;
  } else {
    const int t = a.t0 + r / a.lg, g = r % a.lg;
    const int b = request_of_token(a.cu_seqlens_q, a.num_requests, t);
    const int cu0 = a.cu_seqlens_q[b], cu1 = a.cu_seqlens_q[b + 1];
    n = (a.seq_lens[b] - (cu1 - cu0) + (t - cu0)) / 8;
    orow = static_cast<std::int64_t>(g) * a.num_tokens + t;
  }
  const int k = n < a.topk ? n : a.topk;
  std::int32_t* out = a.ids + orow * a.ld_ids;
  const float* src = a.scores + static_cast<std::int64_t>(r) * a.ld;

  std::uint32_t prefix = 0, mask = 0;
  unsigned need = 0;  // keys equal to the final prefix that are taken (lowest ids first)
  if (k == n) {  // everything fits: select all (mask 0: every key "equals" the prefix)
    need = static_cast<unsigned>(n);
  } else {
    unsigned krem = static_cast<unsigned>(k);
    const int n_up = (n + kTopkThreads - 1) / kTopkThreads * kTopkThreads;
#pragma unroll 1
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kTopkThreads) hist[i] = 0;
      __syncthreads();
      for (int i = tid; i < n_up; i += kTopkThreads) {
        std::uint32_t key = 0;
        if (i < n) {
          if (kSmem && shift != 24) {
            key = skeys[i];
          } else {
            key = score_key(src[i]);
            if (kSmem) skeys[i] = key;
          }
        }
        const bool match = i < n && (key & mask) == prefix;
        const unsigned digit = match ? (key >> shift) & 0xffu : 256u;
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (match && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
      }
      __syncthreads();
      if (warp == 0) {
        unsigned c[8], s = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          c[j] = hist[255 - 8 * lane - j];
          s += c[j];
        }
        unsigned incl = s;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += v;
        }
        unsigned above = incl - s;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (above < krem && above + c[j] >= krem) {
            s_digit = 255 - 8 * lane - j;
            s_above = above;
            s_count = c[j];
          }
          above += c[j];
        }
      }
      __syncthreads();
      const unsigned d = s_digit, above = s_above, cnt = s_count;
      krem -= above;
      prefix |= d << shift;
      mask |= 0xffu << shift;
      __syncthreads();  // s_* and hist are rewritten by the next pass
      if (cnt == krem) break;  // every key with this prefix is taken
    }
    need = krem;
  }

  // compaction in id order: selected = (key & mask) > prefix, or == prefix among the first `need`
  unsigned long long carry = 0;  // (eq << 32) | gt over previous tiles
  constexpr int kTile = kTopkThreads * kTopkItems;
  for (int base = 0; base < n; base += kTile) {
    const int first = base + tid * kTopkItems;
    unsigned gt_bits = 0, eq_bits = 0;
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      const int i = first + j;
      if (i < n) {
        const std::uint32_t key = (kSmem && k != n) ? skeys[i] : score_key(src[i]);
        const std::uint32_t km = key & mask;
        if (km > prefix) gt_bits |= 1u << j;
        else if (km == prefix) eq_bits |= 1u << j;
      }
    }
    const unsigned long long mine =
        (static_cast<unsigned long long>(__popc(eq_bits)) << 32) | static_cast<unsigned long long>(__popc(gt_bits));
    unsigned long long before, total;
    Scan(scan_tmp).ExclusiveSum(mine, before, total);
    before += carry;
    unsigned gt_b = static_cast<unsigned>(before & 0xffffffffu), eq_b = static_cast<unsigned>(before >> 32);
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      if (gt_bits & (1u << j)) {
        out[gt_b + (eq_b < need ? eq_b : need)] = first + j;
        ++gt_b;
      } else if (eq_bits & (1u << j)) {
        if (eq_b < need) out[gt_b + eq_b] = first + j;
        ++eq_b;
      }
    }
    carry += total;
    __syncthreads();  // scan_tmp reuse
    const unsigned sel = static_cast<unsigned>(carry & 0xffffffffu) +
                         (static_cast<unsigned>(carry >> 32) < need ? static_cast<unsigned>(carry >> 32) : need);
    if (sel >= static_cast<unsigned>(k)) break;  // uniform: carry is the same in every thread
  }
  for (int j = k + tid; j <= a.topk; j += kTopkThreads) out[j] = j == k ? n : -1;
  if (tid == 0) a.counts[orow] = k + 1;
}


/// Launches the selection kernel over `rows` rows; the shared-memory variant when a row fits.
inline ::step5::Status launch_topk(const TopkArgs& a, int rows, cudaStream_t stream) {
  if (rows <= 0) return ::step5::Status::Ok();
  if (a.ld <= kTopkSmemKeys) {
    const int smem = static_cast<int>(a.ld) * 4;
    if (smem > 48 * 1024) {
      const ::step5::Status s = ::step5::cuda_status(
          cudaFuncSetAttribute(topk_select_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute(topk_select_kernel)");
      if (!s.ok()) return s;
    }
    topk_select_kernel<true><<<rows, kTopkThreads, smem, stream>>>(a);
  } else {
    topk_select_kernel<false><<<rows, kTopkThreads, 0, stream>>>(a);
  }
  return ::step5::cuda_status(cudaGetLastError(), "topk_select_kernel launch");
}

}  // namespace step5::kernels::sm90
