#pragma once
/// \file step5/kernels/sm90/indexer_summaries.cuh
/// CSA region summaries (SPEC.md §4.4) with the per-request tail buffer (SPEC §5).
/// Grid (Y, B): CTA (y, b) summarises the regions r = first + y, first + y + Y, ... of request b
/// that this step completes (rows from the tail for positions < past_len, else from the step's
/// index_k / raw index_z), P threads, thread d owns proxy dim d: m = max z over the 8×P block, then
/// `region_summary_e4m3` (the formula) for dim d.
/// (A decode step's step 4 can instead run inside indexer_prepare's launch: FoldedSummary in
/// indexer_prepare.cuh, the same reads, formula and writes for a request with one token.)
/// CTA y == 0 then writes the leftover rows (positions >= 8·(seq_len/8)) to the tail slot, after its
/// own summaries: it is the only CTA that reads the tail (the first region), so no other CTA races.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/bounds_fault.cuh"
#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/layout/geometry.hpp"  // kRegionSize

namespace step5::kernels::sm90 {

/// The tail buffer (SPEC §5: [num_slots, 8, 2, P] bf16; row j of a slot holds its index_k
/// (`which` = 0) and raw index_z (`which` = 1), P values each): slot `slot` of `tail`, and the
/// offset in a slot of row j's values in units of which a row holds kUnits (P bf16 values, or
/// P / 2 bf16 pairs as indexer_prepare's decode fold addresses them). The one layout of
/// indexer_summaries_kernel and of the fold.
template <int P, class T>
__device__ __forceinline__ T* tail_slot_ptr(T* tail, int slot) {
  return tail + static_cast<std::int64_t>(slot) * layout::kRegionSize * 2 * P;
}
template <int kUnits>
__device__ __forceinline__ constexpr int tail_row_offset(int j, int which) {
  return (j * 2 + which) * kUnits;
}

/// SPEC §4.4 for one proxy dim of one region: S = Σ_t e^(z_t − m)·k_t / Σ_t e^(z_t − m) over the
/// region's R rows in position order, m the max of z over the whole R × P block; both sums start
/// from their first term (peeled), not from +0.0, so eight −0.0 products give S = −0.0 (e4m3 byte
/// 0x80) as the reference does (SPEC §4 "Signed zero"); S = den > 0 ? num / max(den, 1e-20) : 0
/// (golden "semantics.summaries"). Returns the stored byte e4m3(bf16(S)). The one formula of
/// indexer_summaries_kernel and of indexer_prepare's decode fold (indexer_prepare.cuh).
__device__ __forceinline__ std::uint8_t region_summary_e4m3(const float (&k)[layout::kRegionSize],
                                                            const float (&z)[layout::kRegionSize], float m) {
  const float e0 = expf(z[0] - m);
  float num = __fmul_rn(e0, k[0]), den = e0;
#pragma unroll
  for (int j = 1; j < layout::kRegionSize; ++j) {
    const float e = expf(z[j] - m);
    num = __fadd_rn(num, __fmul_rn(e, k[j]));
    den = __fadd_rn(den, e);
  }
  const float s = den > 0.f ? num / fmaxf(den, 1e-20f) : 0.f;
  const float sb = __bfloat162float(__float2bfloat16_rn(s));
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(sb, __NV_SATFINITE, __NV_E4M3));
}

struct SummaryArgs {
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* seq_lens;
  const std::int32_t* block_table;
  int max_blocks, block_size, num_blocks;
  std::int32_t* bounds_fault;    // checked-mode record (bounds_fault.cuh) or null
  const __nv_bfloat16* index_k;  // [T, P]
  const __nv_bfloat16* c;        // raw z at column col_z
  std::int64_t ldc;
  int col_z;
  std::uint8_t* summary_cache;
  __nv_bfloat16* tail;           // [slots, 8, 2, P]
  const std::int32_t* tail_slot;
  int num_slots;
};

template <int P>
__global__ void __launch_bounds__(P) indexer_summaries_kernel(SummaryArgs a) {
  static_assert(P % 32 == 0 && P <= 1024, "indexer_summaries_kernel: proxy_dim must be a multiple of 32, <= 1024");
#if STEP5_SM90A_DEVICE
  constexpr int R = layout::kRegionSize;  // inside the guard: unused (warning #177-D) in another arch's pass
  __shared__ float red[P / 32];
  const int b = blockIdx.y;
  const int d = threadIdx.x;
  pdl_wait();  // index_k and c belong to the previous kernels of the step
  const int cu0 = __ldg(a.cu_seqlens_q + b), cu1 = __ldg(a.cu_seqlens_q + b + 1);
  const int q_len = cu1 - cu0;
  if (q_len <= 0) return;
  const int seq = __ldg(a.seq_lens + b);
  const int past = seq - q_len;
  const int slot = __ldg(a.tail_slot + b);
  const bool slot_ok = slot >= 0 && slot < a.num_slots;
  if (!slot_ok && blockIdx.x == 0 && d == 0)
    report_bounds_fault(a.bounds_fault, ops::BoundsFault::kTailSlotOutOfRange, b, seq - 1, slot);
  const __nv_bfloat16* tail = tail_slot_ptr<P>(a.tail, slot_ok ? slot : 0);
  const int first = past / R, end = seq / R;  // regions [first, end) complete in this step
  for (int r = first + blockIdx.x; r < end; r += gridDim.x) {
    float k[R], z[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int pos = R * r + j;
      if (pos < past) {  // pending row from the tail buffer
        k[j] = slot_ok ? __bfloat162float(tail[tail_row_offset<P>(j, 0) + d]) : 0.f;
        z[j] = slot_ok ? __bfloat162float(tail[tail_row_offset<P>(j, 1) + d]) : 0.f;
      } else {
        const std::int64_t t = cu0 + (pos - past);
        k[j] = __bfloat162float(a.index_k[t * P + d]);
        z[j] = __bfloat162float(a.c[t * a.ldc + a.col_z + d]);
      }
    }
    float m = z[0];
#pragma unroll
    for (int j = 1; j < R; ++j) m = fmaxf(m, z[j]);
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    if ((d & 31) == 0) red[d >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < P / 32; ++w) m = fmaxf(m, red[w]);
    __syncthreads();  // red reused by the next region
    const std::uint8_t byte = region_summary_e4m3(k, z, m);
    // a region outside the block-table row or in a block outside [0, num_blocks) is not written
    const std::int64_t blk = checked_block(a.block_table, a.max_blocks, a.block_size, a.num_blocks, b, R * r,
                                           d == 0 ? a.bounds_fault : nullptr);
    const int sl = (R * r % a.block_size) / R;
    if (blk >= 0 && (slot_ok || R * r >= past))  // a region with pending rows needs its tail slot
      a.summary_cache[(blk * (a.block_size / R) + sl) * P + d] = byte;
  }
  pdl_launch_dependents();
  if (blockIdx.x != 0 || !slot_ok) return;
  __syncthreads();  // every read of the tail by this CTA precedes the writes below
  __nv_bfloat16* tail_w = tail_slot_ptr<P>(a.tail, slot);
  const int lo = past > R * end ? past : R * end;
  for (int pos = lo; pos < seq; ++pos) {
    const std::int64_t t = cu0 + (pos - past);
    const int j = pos % R;
    tail_w[tail_row_offset<P>(j, 0) + d] = a.index_k[t * P + d];
    tail_w[tail_row_offset<P>(j, 1) + d] = a.c[t * a.ldc + a.col_z + d];
  }
#endif
}

}  // namespace step5::kernels::sm90
