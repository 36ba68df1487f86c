#pragma once
/// \file step5/kernels/sm90/ptx.cuh
/// PTX wrappers shared by the sm_90 kernels (projection GEMM, sparse attention, indexer prefill
/// scores): shared-memory addresses, 16-byte cp.async, ldmatrix, bf16 mma.sync, the MUFU exp2,
/// named barriers, setmaxnreg, mbarriers, pushes into other CTAs' shared memory (st.async), the 1-D
/// bulk (TMA) copy, the split and the exit cluster barriers; and
/// the unpacking of a packed bf16 pair.
/// Device code (nvcc).
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/arch.cuh"

namespace step5::kernels::sm90::ptx {

/// The low (first) and high (second) bf16 of a packed 32-bit pair as fp32 (exact).
__device__ __forceinline__ float bf16_lo(std::uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte cp.async (L2 only); `bytes` 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t addr, std::uint32_t& r0, std::uint32_t& r1,
                                            std::uint32_t& r2, std::uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(std::uint32_t addr, std::uint32_t& r0, std::uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t addr, std::uint32_t& r0, std::uint32_t& r1,
                                                  std::uint32_t& r2, std::uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// 2^x on the MUFU unit (ex2.approx.ftz.f32: relative error below 2^-22, a result below 2^-126
/// flushed to 0, 2^-inf = 0). exp2f without -ftz adds a range test and two multiplies around
/// the same instruction to keep denormal results.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) for `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// setmaxnreg (sm_90a): the executing warpgroup's per-thread register limit raised (`inc`) or
/// lowered (`dec`) to R (24..256, a multiple of 8); every warp of the warpgroup executes it. The
/// warp-specialised kernels give their producer warpgroup few registers and their consumers many.
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256 registers, a multiple of 8");
#if STEP5_SM90A_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256 registers, a multiple of 8");
#if STEP5_SM90A_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

/// D += A(16x16, row) * B(16x8, col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float* d, const std::uint32_t* a, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- mbarrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  const std::uint32_t addr = smem_u32(bar);
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

/// mbar_wait with cluster-scope acquire: for an mbarrier whose transactions are other CTAs' pushes
/// (st_async_b32 / st_async_b64, whose complete_tx releases at cluster scope), so that the pushed
/// words are visible to the waiting thread.
__device__ __forceinline__ void mbar_wait_cluster(std::uint64_t* bar, unsigned parity) {
#if STEP5_SM90A_DEVICE
  const std::uint32_t addr = smem_u32(bar);
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
#endif
}
/// Makes this thread's mbarrier initialisations visible to the other CTAs of the cluster (before
/// the cluster barrier that lets them push to those mbarriers).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
#if STEP5_SM90A_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
/// The shared::cluster address of the word at shared-memory address `addr` (smem_u32) of this
/// CTA in the CTA of cluster rank `rank`.
__device__ __forceinline__ std::uint32_t cluster_addr(std::uint32_t addr, unsigned rank) {
  std::uint32_t r = addr;
#if STEP5_SM90A_DEVICE
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));  // pure: may be hoisted
#endif
  return r;
}
/// A push into another CTA's shared memory: st.async of one 32-bit (64-bit; four 32-bit) word(s) to
/// the shared::cluster address `addr` (aligned to its size), completing 4 (8; 16) bytes of
/// transaction count on the mbarrier at
/// the shared::cluster address `bar` (in the same CTA as `addr`), with release semantics at cluster
/// scope; the receiver waits with mbar_wait_cluster. No fence, no barrier on the sender's side.
__device__ __forceinline__ void st_async_b32(std::uint32_t addr, std::uint32_t v, std::uint32_t bar) {
#if STEP5_SM90A_DEVICE
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v),
               "r"(bar)
               : "memory");
#endif
}
__device__ __forceinline__ void st_async_b64(std::uint32_t addr, std::uint64_t v, std::uint32_t bar) {
#if STEP5_SM90A_DEVICE
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(addr), "l"(v),
               "r"(bar)
               : "memory");
#endif
}
__device__ __forceinline__ void st_async_v4_b32(std::uint32_t addr, float4 v, std::uint32_t bar) {
#if STEP5_SM90A_DEVICE
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)), "r"(__float_as_uint(v.w)),
               "r"(bar)
               : "memory");
#endif
}
/// The split cluster barrier: every thread of every CTA of the cluster arrives (relaxed: it orders
/// no memory; a fence before it does, e.g. fence_mbarrier_init_cluster), does other work, then
/// waits (acquire) for all arrivals.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if STEP5_SM90A_DEVICE
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if STEP5_SM90A_DEVICE
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#endif
}

/// 1-D bulk copy (TMA engine, async proxy) of `bytes` (a multiple of 16; both addresses 16-byte
/// aligned) from global memory to shared memory at `dst`; completion is signalled to the mbarrier
/// at `mbar` as `bytes` of transaction count (arm it with mbar_arrive_expect_tx).
__device__ __forceinline__ void bulk_copy_g2s(std::uint32_t dst, const void* src, std::uint32_t bytes,
                                              std::uint64_t* mbar) {
#if STEP5_SM90A_DEVICE
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(smem_u32(mbar))
               : "memory");
#endif
}

/// The last cluster barrier of a kernel whose CTAs read each other's shared memory (distributed
/// shared memory) or push into it (st_async_*): no CTA exits while another may still read its
/// shared memory or a push it issued may be in flight (every push has completed before its
/// receiver's mbarrier wait returns, so no memory needs ordering here either). An execution
/// barrier only — `barrier.cluster.arrive.relaxed`, then `barrier.cluster.wait` — because what it
/// orders are reads whose values every thread has already used before it arrives (complete), not
/// writes another CTA must see. cooperative_groups' cluster.sync() arrives with release semantics,
/// which on sm_90 is a GPU-scope fence (MEMBAR.ALL.GPU) that waits for the CTA's outstanding global
/// stores — at the end of a kernel, its outputs (Nsight Compute, bench/RESULTS.md twenty-fifth
/// session). Every thread of every CTA of the cluster calls it (warps may diverge: not .aligned).
__device__ __forceinline__ void cluster_sync_before_exit() {
  cluster_arrive_relaxed();
  cluster_wait();
}

}  // namespace step5::kernels::sm90::ptx
