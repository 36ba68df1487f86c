#pragma once
/// \file step5/kernels/sm90/gemm_wgmma.cuh
/// Large-T projection GEMM for sm_90a (SPEC §3/§4.1): `C[T, N] = X[T, K] @ W[N, K]^T`, bf16
/// in/out, fp32 accumulation.
///
/// Structure: a persistent grid (one CTA per SM, at most one per work unit) walks the work
/// units (BM×BN output tile, k split): unit u is tile u / splits, K range [z * k_tiles_per_split,
/// (z + 1) * k_tiles_per_split) × BK with z = u % splits (splits = 1: whole K); BK = 64 × KBOX.
/// The tile kind (BM, BN, KBOX, STAGES) is one row of step5/ops/gemm.hpp's kGemmWgmmaTiles.
/// Each CTA has
///  * one producer warpgroup (setmaxnreg.dec to 40 registers) whose elected thread issues TMA
///    copies (cp.async.bulk.tensor.2d, 128-byte swizzle, tensor maps passed as __grid_constant__)
///    of KBOX boxes X[BM, 64] and W[BN, 64] per stage into a STAGES-deep ring guarded by
///    full/empty mbarriers (the ring's stage and phase run on across units);
///  * two consumer warpgroups (setmaxnreg.inc to 232) with `wgmma.mma_async m64nWNk16` (both
///    operands K-major from shared memory). BM = 128: each computes 64 token rows × BN columns
///    (WN = BN); a warpgroup whose 64 rows hold no token (e.g. T = 64) only waits for and
///    releases the stages. BM = 64 (narrow shapes, T <= 256): both compute the same 64 token rows, each on one
///    half of the BN columns (WN = BN / 2), so no stage carries zero-filled token rows.
///    The empty barrier of a stage counts both warpgroups; each arrives once the wgmmas that
///    read the stage have retired (wgmma.wait_group 1 after the next stage's wgmmas are issued).
///    splits = 1: they store bf16 straight from the accumulators. splits > 1 (split-K, for shapes
///    whose tiles leave SMs idle): each warpgroup with a valid token row stores its fp32 partial
///    (valid 16-row slabs only, `wgmma_partial_offset`) to the workspace, __threadfence, then one
///    thread adds 1 to its warpgroup's arrival counter of the tile; the warpgroup that brings it
///    to `splits` fences, sums the partials of splits 0, 1, ... in that order (its own re-read,
///    so the bits do not depend on arrival order), stores bf16 and resets the counter to 0 for
///    the next launch. Nothing waits on another CTA, so any residency works.
/// Out-of-range rows/columns of the tiles are zero-filled by TMA (also the last partial 64-wide
/// box); boxes wholly beyond K (KBOX > 1) are neither loaded nor multiplied;
/// stores are bounds-checked.
/// Preconditions (host launcher): X, W 16-byte aligned, ldx, ldw multiples of 8, K a multiple
/// of 8, ldc even, C 4-byte aligned; splits > 1: a workspace with kGemmCounterBytes of zeroed
/// counters (tiles × kWgmmaCountersPerTile of them fit) followed by the partials (16-byte aligned).
#include <cuda.h>  // CUtensorMap (types only; the driver entry point is fetched at run time)

#include "step5/core/cuda_check.hpp"  // kSm90MaxSmemPerCta
#include "step5/kernels/sm90/gemm_common.cuh"
#include "step5/kernels/sm90/wgmma.cuh"  // descriptors, fences, wait (shared with the indexer scores)
#include "step5/kernels/sm90/pdl.cuh"

namespace step5::kernels::sm90 {

namespace gemm_detail {
using namespace ::step5::kernels::sm90::wgmma;  // make_desc_sw128, wgmma_fence/commit/wait, fence_regs

/// wgmma m64n128k16, bf16 A/B from shared memory (K-major, descriptors), fp32 accumulators (d = A*B + (scale_d ? d : 0)).
__device__ __forceinline__ void wgmma_m64n128k16(float* d, std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

/// wgmma m64n32k16, bf16 A/B from shared memory (K-major, descriptors), fp32 accumulators (d = A*B + (scale_d ? d : 0)).
__device__ __forceinline__ void wgmma_m64n32k16(float* d, std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

/// wgmma m64n64k16, bf16 A/B from shared memory (K-major, descriptors), fp32 accumulators (d = A*B + (scale_d ? d : 0)).
__device__ __forceinline__ void wgmma_m64n64k16(float* d, std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

/// wgmma m64n152k16, bf16 A/B from shared memory (K-major, descriptors), fp32 accumulators (d = A*B + (scale_d ? d : 0)).
__device__ __forceinline__ void wgmma_m64n152k16(float* d, std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %78, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n152k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75}, "
      "%76, %77, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

/// wgmma m64n256k16, bf16 A/B from shared memory (K-major, descriptors), fp32 accumulators (d = A*B + (scale_d ? d : 0)).
__device__ __forceinline__ void wgmma_m64n256k16(float* d, std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

/// wgmma m64nWNk16 accumulate (d += A*B) for the widths that have a wrapper.
template <int WN>
__device__ __forceinline__ void wgmma_m64nBNk16(float* d, std::uint64_t desc_a, std::uint64_t desc_b) {
  static_assert(WN == 32 || WN == 64 || WN == 128 || WN == 152 || WN == 256,
                "wgmma wrappers exist for N = 32, 64, 128, 152 and 256");
  if constexpr (WN == 256)
    wgmma_m64n256k16(d, desc_a, desc_b, 1);
  else if constexpr (WN == 152)
    wgmma_m64n152k16(d, desc_a, desc_b, 1);
  else if constexpr (WN == 128)
    wgmma_m64n128k16(d, desc_a, desc_b, 1);
  else if constexpr (WN == 64)
    wgmma_m64n64k16(d, desc_a, desc_b, 1);
  else
    wgmma_m64n32k16(d, desc_a, desc_b, 1);
}

__device__ __forceinline__ void tma_load_2d(std::uint32_t dst, const CUtensorMap* map, std::uint64_t* bar, int c0,
                                            int c1) {
#if STEP5_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
#endif
}

}  // namespace gemm_detail

/// Compile-time shape of one tile kind (step5/ops/gemm.hpp, GemmWgmmaTile): BM token rows (128 or
/// 64) × BN weight rows per CTA tile, KBOX 64-wide K boxes per stage, STAGES ring stages.
template <int BM, int BN, int KBOX, int STAGES>
struct WgmmaConfig {
  static constexpr int kBM = BM, kBN = BN, kKBoxes = KBOX, kStages = STAGES;
  static constexpr int kBK = 64 * KBOX;  ///< K elements per stage (one "k-tile" of the planner)
  /// BM = 64: both consumer warpgroups share the 64 token rows and split the BN columns in two.
  static constexpr bool kSplitN = BM == 64;
  static constexpr int kWN = kSplitN ? BN / 2 : BN;  ///< columns (weight rows) of one consumer warpgroup
  static constexpr int kABoxBytes = BM * 128;        ///< one [BM, 64] bf16 box of X (128-byte rows)
  static constexpr int kBBoxBytes = BN * 128;        ///< one [BN, 64] bf16 box of W
  static constexpr int kABytes = KBOX * kABoxBytes;
  static constexpr int kBBytes = KBOX * kBBoxBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;  ///< [X boxes 0..KBOX)[W boxes 0..KBOX)
  static constexpr int kThreads = 384;
  /// dynamic shared memory: 1 KB alignment slack + stages + 2*stages mbarriers + 2 split-K flags
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8 + 16;
  static_assert(BM == 64 || BM == 128, "token rows per tile: 64 or 128");
  static_assert(kWN % 8 == 0 && kWN >= 8 && kWN <= 256, "wgmma N must be a multiple of 8 in [8, 256]");
  static_assert(kABoxBytes % 1024 == 0 && kBBoxBytes % 1024 == 0 && (kSplitN ? (kWN * 128) % 1024 == 0 : true),
                "boxes and warpgroup halves must stay 1024-byte aligned (128B swizzle atoms)");
  static_assert(KBOX >= 1 && STAGES >= 2, "at least one K box per stage and two stages");
  static_assert(kSmemBytes <= kSm90MaxSmemPerCta, "stages exceed the 227 KB of shared memory of an sm_90 CTA");
};

/// Split-K partials of the wgmma path: 16-token slabs (one consumer warp's rows) of BN fp32
/// columns, stored in the accumulator fragment order (float4 index j*32 + lane of the warp holds
/// acc[4j .. 4j+3], n8 block j of the slab's BN columns; at BM = 64 warpgroup w's blocks are
/// j = w*BN/16 ...); only slabs with a valid token row exist (ceil(T/16) per weight tile).
/// Float offset of slab `slab` of weight tile `nt`, split `z`; with z = splits (and nt = slab = 0)
/// it is the partial area's size in floats — the one formula of the kernel and the workspace size.
__host__ __device__ constexpr long long wgmma_partial_offset(int z, int nt, int slab, int n_tiles, int slabs,
                                                             int bn) {
  return ((static_cast<long long>(z) * n_tiles + nt) * slabs + slab) * (16LL * bn);
}
/// Arrival counters of the wgmma split-K path per BM × BN tile (one per consumer warpgroup: its
/// 64-token half at BM = 128, its column half at BM = 64).
inline constexpr int kWgmmaCountersPerTile = 2;

struct WgmmaArgs {
  __nv_bfloat16* c;
  int T, N, K;
  long long ldc;
  int splits;             ///< K splits per tile (1 = none): work units = tiles × splits
  int k_tiles_per_split;  ///< BK-tiles of K per split (the last split may have fewer, never 0)
  float* partials;        ///< splits > 1: wgmma_partial_offset(splits, 0, 0, ...) floats
  unsigned* counters;     ///< splits > 1: [tiles][kWgmmaCountersPerTile], zero between launches
};

/// Boxes of the stage that starts at K element k0 that hold any of K (the last stage may be
/// partial: boxes wholly beyond K are neither loaded nor multiplied). Uniform over the CTA.
template <int KBOX>
__device__ __forceinline__ int stage_boxes(int k0, int K) {
  if constexpr (KBOX == 1) {
    return 1;
  } else {
    return min(KBOX, (K - k0 + 63) / 64);
  }
}

/// Cfg: WgmmaConfig<BM, BN, KBOX, STAGES>. kInFlight: 0 = wait for each k-tile's wgmmas before
/// releasing its stage; 1 = keep one k-tile of wgmmas in flight and release the previous stage.
template <class Cfg, int kInFlight>
__global__ void __launch_bounds__(384, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                      WgmmaArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace gemm_detail;
  constexpr int STAGES = Cfg::kStages, BN = Cfg::kBN, WN = Cfg::kWN, KBOX = Cfg::kKBoxes;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const std::uint32_t raw = smem_u32(smem_raw);
  const std::uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem + STAGES * Cfg::kStageBytes);
  std::uint64_t* empty = full + STAGES;
  volatile unsigned* last_flag = reinterpret_cast<volatile unsigned*>(empty + STAGES);  // [2], per consumer

  const int m_tiles = (a.T + Cfg::kBM - 1) / Cfg::kBM;
  const int n_tiles = (a.N + BN - 1) / BN;
  const int num_tiles = m_tiles * n_tiles;
  const int k_tiles = (a.K + Cfg::kBK - 1) / Cfg::kBK;
  const int splits = a.splits;
  const int num_units = num_tiles * splits;  // unit u: tile u / splits, k split u % splits
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&tm_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&tm_w)) : "memory");
  }
  __syncthreads();
  pdl_wait();  // X (and C) belong to the previous kernels of the step

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      int stage = 0;
      unsigned phase = 0;  // the ring's stage/phase continue across units
      for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
        const int tile = u / splits, z = u - tile * splits;
        const int m0 = (tile % m_tiles) * Cfg::kBM;
        const int n0 = (tile / m_tiles) * BN;
        const int kt_end = min(k_tiles, (z + 1) * a.k_tiles_per_split);
        for (int kt = z * a.k_tiles_per_split; kt < kt_end; ++kt) {
          const int k0 = kt * Cfg::kBK, nb = stage_boxes<KBOX>(k0, a.K);
          mbar_wait(&empty[stage], phase ^ 1u);
          mbar_arrive_expect_tx(&full[stage], nb * (Cfg::kABoxBytes + Cfg::kBBoxBytes));
          const std::uint32_t sa = base + stage * Cfg::kStageBytes;
          for (int b = 0; b < nb; ++b) {
            tma_load_2d(sa + b * Cfg::kABoxBytes, &tm_x, &full[stage], k0 + 64 * b, m0);
            tma_load_2d(sa + Cfg::kABytes + b * Cfg::kBBoxBytes, &tm_w, &full[stage], k0 + 64 * b, n0);
          }
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
    pdl_launch_dependents();
  } else {
    setmaxnreg_inc<232>();
    // Consumer cw = 0/1. BM = 128: token rows [64*cw, 64*cw + 64) × all BN columns; BM = 64: the
    // 64 token rows × columns [cw*WN, cw*WN + WN) (WN = BN/2).
    const int cw = wg - 1;
    const int row_off = Cfg::kSplitN ? 0 : 64 * cw;
    const int col_off = Cfg::kSplitN ? WN * cw : 0;
    const int lt = threadIdx.x % 128, warp = lt / 32, lane = lt % 32;
    const int slabs = (a.T + 15) / 16;  // split-K partial slabs per weight tile
    int stage = 0, prev_stage = 0;
    unsigned phase = 0;
    float acc[WN / 2];
    for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
      const int tile = u / splits, z = u - tile * splits;
      const int m0 = (tile % m_tiles) * Cfg::kBM;
      const int nt = tile / m_tiles;
      const int n0 = nt * BN;
      const int kt_begin = z * a.k_tiles_per_split;
      const int kt_end = min(k_tiles, kt_begin + a.k_tiles_per_split);
#pragma unroll
      for (int i = 0; i < WN / 2; ++i) acc[i] = 0.f;
      // A warpgroup whose 64 rows hold no token (BM = 128: the last token tile at T % 128 in
      // (0, 64], e.g. T = 64) skips its wgmmas but still consumes and releases every stage.
      // Uniform per warpgroup; at BM = 64 both are always active.
      const bool active = m0 + row_off < a.T;
      // Two separate loops (not a branch inside one) so that no wgmma is in flight where the
      // paths merge (ptxas would otherwise serialise the wgmmas, C7518).
      if (active) {
        for (int kt = kt_begin; kt < kt_end; ++kt) {
          const int nb = stage_boxes<KBOX>(kt * Cfg::kBK, a.K);
          mbar_wait(&full[stage], phase);
          const std::uint32_t sa = base + stage * Cfg::kStageBytes + row_off * 128;
          const std::uint32_t sb = base + stage * Cfg::kStageBytes + Cfg::kABytes + col_off * 128;
          fence_regs<WN / 2>(acc);
          wgmma_fence();
#pragma unroll
          for (int b = 0; b < KBOX; ++b) {
            if (b == 0 || b < nb) {
#pragma unroll
              for (int kk = 0; kk < 4; ++kk) {
                const std::uint64_t da = make_desc_sw128(sa + b * Cfg::kABoxBytes + kk * 32);
                const std::uint64_t db = make_desc_sw128(sb + b * Cfg::kBBoxBytes + kk * 32);
                wgmma_m64nBNk16<WN>(acc, da, db);
              }
            }
          }
          wgmma_commit();
          if constexpr (kInFlight == 0) {
            wgmma_wait<0>();
            fence_regs<WN / 2>(acc);
            if (lt == 0) mbar_arrive(&empty[stage]);
          } else {
            wgmma_wait<1>();
            fence_regs<WN / 2>(acc);
            if (kt > kt_begin && lt == 0) mbar_arrive(&empty[prev_stage]);
            prev_stage = stage;
          }
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1u;
          }
        }
        if constexpr (kInFlight != 0) {
          wgmma_wait<0>();
          fence_regs<WN / 2>(acc);
          if (kt_end > kt_begin && lt == 0) mbar_arrive(&empty[prev_stage]);
        }
      } else {
        for (int kt = kt_begin; kt < kt_end; ++kt) {
          mbar_wait(&full[stage], phase);
          if (lt == 0) mbar_arrive(&empty[stage]);
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
      if (splits > 1) {
        // This warpgroup's 64 rows: no valid token row -> no partial and no arrival (the
        // counter of this half is never used). Uniform over the warpgroup.
        if (!active) continue;
        const int slab = (m0 + row_off) / 16 + warp;  // this warp's 16 rows
        const bool slab_valid = slab < slabs;
        // this warpgroup's columns of the slab: n8 blocks col_off/8 .. (col_off + WN)/8 - 1
        const long long my_off = wgmma_partial_offset(z, nt, slab, n_tiles, slabs, BN) + 16LL * col_off;
        if (slab_valid) {
          float4* my = reinterpret_cast<float4*>(a.partials + my_off);
#pragma unroll
          for (int j = 0; j < WN / 8; ++j)
            __stcg(my + j * 32 + lane, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
        }
        __threadfence();  // partial stores, then the arrival
        named_barrier_sync(1 + cw, 128);
        unsigned* counter = a.counters + tile * kWgmmaCountersPerTile + cw;
        if (lt == 0) last_flag[cw] = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1) ? 1u : 0u;
        named_barrier_sync(1 + cw, 128);
        if (last_flag[cw] == 0u) continue;  // another split of this tile finishes it
        __threadfence();  // the other splits' partials are visible after their arrivals
        // Sum every split's partial (this unit's own re-read) in split order z = 0, 1, ...: the
        // result does not depend on which unit arrived last (bit-reproducible across launches).
        if (slab_valid) {
#pragma unroll
          for (int i = 0; i < WN / 2; ++i) acc[i] = 0.f;
          for (int zz = 0; zz < splits; ++zz) {
            const float4* part = reinterpret_cast<const float4*>(
                a.partials + wgmma_partial_offset(zz, nt, slab, n_tiles, slabs, BN) + 16LL * col_off);
#pragma unroll
            for (int j = 0; j < WN / 8; ++j) {
              const float4 v = __ldcg(part + j * 32 + lane);
              acc[4 * j] += v.x;
              acc[4 * j + 1] += v.y;
              acc[4 * j + 2] += v.z;
              acc[4 * j + 3] += v.w;
            }
          }
        }
        if (lt == 0) *counter = 0u;  // leave the workspace ready for the next launch
      }
      pdl_launch_dependents();
      // Accumulator layout (per n8 block j): acc[4j+0..1] row lane/4, cols 2*(lane%4)+{0,1};
      // acc[4j+2..3] row lane/4 + 8.
      const int row0 = m0 + row_off + warp * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < WN / 8; ++j) {
        const int n = n0 + col_off + j * 8 + 2 * (lane % 4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int t = row0 + 8 * h;
          if (t < a.T) {
            __nv_bfloat16* dst = a.c + (long long)t * a.ldc + n;
            if (n + 1 < a.N) {
              *reinterpret_cast<__nv_bfloat162*>(dst) =
                  __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            } else if (n < a.N) {
              *dst = __float2bfloat16_rn(acc[4 * j + 2 * h]);
            }
          }
        }
      }
    }
  }
#endif
}

}  // namespace step5::kernels::sm90
