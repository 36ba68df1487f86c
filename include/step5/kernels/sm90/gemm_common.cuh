#pragma once
/// \file step5/kernels/sm90/gemm_common.cuh
/// PTX helpers of the projection GEMM kernels (SPEC §3/§4.1): mbarrier wrappers, plus the shared
/// cp.async / ldmatrix / mma.sync wrappers of ptx.cuh. Device code (nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/ptx.cuh"


namespace step5::kernels::sm90::gemm_detail {

using namespace ::step5::kernels::sm90::ptx;  // cp.async, ldmatrix, mma.sync (ptx.cuh)

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

}  // namespace step5::kernels::sm90::gemm_detail
