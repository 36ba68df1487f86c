#pragma once
/// \file step5/kernels/sm90/wgmma.cuh
/// Warpgroup MMA helpers shared by the sm_90a kernels that use `wgmma.mma_async` (the projection
/// GEMM, gemm_wgmma.cuh, the indexer prefill scores, indexer_scores_wgmma.cuh, and the sparse
/// attention's 64-row tiles, attention.cuh): the shared-memory matrix descriptors of K-major and
/// N-major 128B-swizzled tiles, the fence / commit / wait wrappers, a compiler fence on
/// accumulator registers, the register-A instructions the indexer scores use (m64n128 f16 k16 and
/// e4m3 k32; K-major B) and the register-A bf16 instructions of the attention (m64n64k16 K-major
/// B; m64n128k16 / m64n192k16 N-major B). Device code (nvcc).
///
/// Layout contract of `make_desc_sw128` (PTX ISA "Shared memory matrix layout", 128-byte swizzle,
/// K-major): the tile is a column of 8-row *atoms* of 1024 bytes (row i of an atom at byte 128·i),
/// atoms 1024 bytes apart (stride byte offset), the atom's base 1024-byte aligned; the 16-byte
/// chunk c of row i is stored at chunk position c ^ (i % 8) (what TMA's SWIZZLE_128B writes,
/// `sw128_offset` below). One row holds 128 bytes of K (64 bf16/f16 or 128 e4m3 values); an
/// instruction consumes 32 bytes of K per row (k16 for 16-bit types, k32 for e4m3), selected by
/// adding 32·j (j < 4) to the start address. Longer K is stored as further 128-byte K-blocks,
/// each a full tile of its own.
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/arch.cuh"

namespace step5::kernels::sm90::wgmma {

__device__ __forceinline__ void wgmma_fence() {
#if STEP5_SM90A_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if STEP5_SM90A_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if STEP5_SM90A_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// Makes this thread's generic-proxy shared-memory writes (st.shared, completed cp.async) visible
/// to the async proxy (wgmma operand reads, TMA); a barrier must follow before another thread's
/// wgmma reads them.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if STEP5_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/// Shared-memory matrix descriptor of a K-major tile with 128-byte rows in the 128B swizzle
/// (8-row atoms of 1024 bytes): start address, LBO 1 (unused for this layout), SBO 1024 B.
__device__ __forceinline__ std::uint64_t make_desc_sw128(std::uint32_t saddr) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>(1) << 16;
  d |= static_cast<std::uint64_t>(1024 >> 4) << 32;
  d |= static_cast<std::uint64_t>(1) << 62;
  return d;
}

/// Shared-memory matrix descriptor of an N-major (MN-major) B operand in the 128B swizzle, 16-bit
/// elements: each K row holds 64 N-values in 128 bytes (16-byte chunk c of K row i at chunk
/// position c ^ (i % 8), as `sw128_offset`), 8 K rows form a 1024-byte atom (the atom's base
/// 1024-byte aligned), K atoms 1024 bytes apart (stride byte offset), and the next 64 N-values
/// `lbo_bytes` further (leading byte offset; CUTLASS's canonical "MN-major SW128" layout,
/// ((8,8,n),(8,k)) : ((1,8,LBO),(64,SBO)) in elements). An instruction consumes 16 K rows: the
/// start address advances by 16 * 128 bytes per k16 step.
__device__ __forceinline__ std::uint64_t make_desc_sw128_nmajor(std::uint32_t saddr, std::uint32_t lbo_bytes) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= static_cast<std::uint64_t>(1024 >> 4) << 32;
  d |= static_cast<std::uint64_t>(1) << 62;
  return d;
}

/// The descriptor `d` (make_desc_sw128 / make_desc_sw128_nmajor) with its start address advanced
/// by `bytes` (a multiple of 16): one add to the 14-bit address field instead of a new descriptor.
/// Shared-memory addresses stay below 2^18 bytes (228 KiB per SM), so the field never carries
/// into the next one.
__device__ __forceinline__ std::uint64_t desc_advance(std::uint64_t d, std::uint32_t bytes) {
  return d + (bytes >> 4);
}

/// Byte offset of 16-byte chunk `chunk` (< 8) of row `row` inside a 128B-swizzled K-block tile
/// whose base is 1024-byte aligned (the layout `make_desc_sw128` describes).
__host__ __device__ constexpr int sw128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// Operand lists of the wgmma wrappers: the fp32 accumulators (32, 64 or 96 per thread: n64,
// n128, n192) as asm outputs, and their register lists, built from blocks of 32.
#define STEP5_WGMMA_ACC32(d)                                                                                          \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]), "+f"((d)[6]), "+f"((d)[7]),     \
  "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]), "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]),              \
  "+f"((d)[15]), "+f"((d)[16]), "+f"((d)[17]), "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]),            \
  "+f"((d)[22]), "+f"((d)[23]), "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]),            \
  "+f"((d)[29]), "+f"((d)[30]), "+f"((d)[31])
#define STEP5_WGMMA_ACC64(d) STEP5_WGMMA_ACC32(d), STEP5_WGMMA_ACC32((d) + 32)
#define STEP5_WGMMA_ACC96(d) STEP5_WGMMA_ACC64(d), STEP5_WGMMA_ACC32((d) + 64)
#define STEP5_WGMMA_R0_31                                                                                             \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "              \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define STEP5_WGMMA_R32_63                                                                                            \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, "              \
  "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define STEP5_WGMMA_R64_95                                                                                            \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "              \
  "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define STEP5_WGMMA_REGS32 "{" STEP5_WGMMA_R0_31 "}"
#define STEP5_WGMMA_REGS64 "{" STEP5_WGMMA_R0_31 ", " STEP5_WGMMA_R32_63 "}"
#define STEP5_WGMMA_REGS96 "{" STEP5_WGMMA_R0_31 ", " STEP5_WGMMA_R32_63 ", " STEP5_WGMMA_R64_95 "}"

/// d = A·B + (scale_d ? d : 0), m64n128k16, f16 A from registers (the m16n8k16 A fragment of each
/// warp's 16 rows), f16 B from shared memory K-major (`make_desc_sw128`), fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k16_f16_rs(float* d, const std::uint32_t (&a)[4], std::uint64_t desc_b,
                                                        int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " STEP5_WGMMA_REGS64 ", "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : STEP5_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#endif
}

/// d = A·B + (scale_d ? d : 0), m64n128k32, e4m3 A from registers (the m16n8k32 A fragment of each
/// warp's 16 rows), e4m3 B from shared memory K-major (the only layout e4m3 has), fp32
/// accumulators. Hopper adds the products of one instruction and the accumulator with about 14
/// significant bits (truncated; DeepSeek-V3 report §3.5.2), so results are NOT fp32-accurate.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_rs(float* d, const std::uint32_t (&a)[4], std::uint64_t desc_b,
                                                         int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " STEP5_WGMMA_REGS64 ", "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n"
      "}\n"
      : STEP5_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#endif
}

/// d = A·B + (scale_d ? d : 0), m64n64k16, bf16 A from registers (the m16n8k16 A fragment of
/// each warp's 16 rows), bf16 B from shared memory K-major (`make_desc_sw128`), fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs(float* d, const std::uint32_t (&a)[4],
                                                        std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " STEP5_WGMMA_REGS32 ", "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : STEP5_WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#endif
}

/// d = A·B + (scale_d ? d : 0), m64n128k16, bf16 A from registers, bf16 B from shared memory
/// N-major (`make_desc_sw128_nmajor`), fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs_nmajor(float* d, const std::uint32_t (&a)[4],
                                                                std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " STEP5_WGMMA_REGS64 ", "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : STEP5_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#endif
}

/// d = A·B + (scale_d ? d : 0), m64n192k16, bf16 A from registers, bf16 B from shared memory
/// N-major (`make_desc_sw128_nmajor`), fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n192k16_bf16_rs_nmajor(float* d, const std::uint32_t (&a)[4],
                                                                std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %101, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 " STEP5_WGMMA_REGS96 ", "
      "{%96, %97, %98, %99}, %100, p, 1, 1, 1;\n"
      "}\n"
      : STEP5_WGMMA_ACC96(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#endif
}

#undef STEP5_WGMMA_ACC32
#undef STEP5_WGMMA_ACC64
#undef STEP5_WGMMA_ACC96
#undef STEP5_WGMMA_R0_31
#undef STEP5_WGMMA_R32_63
#undef STEP5_WGMMA_R64_95
#undef STEP5_WGMMA_REGS32
#undef STEP5_WGMMA_REGS64
#undef STEP5_WGMMA_REGS96

}  // namespace step5::kernels::sm90::wgmma
