#pragma once
/// \file step5/ops/gemm.hpp
/// The projection GEMM of SPEC §3/§4.1 (fused QKV + indexer projection) and of o_proj:
///   `C[t, n] = bf16( sum_k X[t, k] * W[n, k] )`, fp32 accumulation, i.e. `C = X @ W^T`.
/// X `[T, K]` bf16 row-major (row stride `ldx` elements), W `[N, K]` bf16 row-major (row stride
/// `ldw`), C `[T, N]` bf16 row-major (row stride `ldc`). For the fused projection of one rank
/// N = `RankLayout::padded_rows`, K = hidden, and the columns of C follow the shard order of
/// docs/ARCHITECTURE.md; for o_proj X = attention output `[T, Hl*D]`, W = `o_proj_local
/// [hidden, Hl*D]`, N = hidden, K = Hl*D.
///
/// Paths (picked by `gemm_bf16`, see `gemm_plan`; kAuto: kGemv at T = 1 on weights of 4 MiB and
/// more with K 512 ... 12288, at T = 2 ... 8 on weights of 22 MiB and more with K 4096 outside 4096
/// < N < 8192 rows, and at T = 9 ... 16 on 128 MiB and more with K 4096 (`gemm_auto_takes_gemv`;
/// its kernel `gemm_auto_gemv_config`), else cuBLASLt where it has an algorithm and `allow_cublaslt`, else
/// unaligned shapes -> kGeneric, T <= 32 -> kSplitK, T > 32 -> kWgmma):
///  * `kGemv`   — weight-streaming kernels for decode-sized T (1 .. kGemmGemvMaxTokens), X in
///                shared memory, no workspace (gemm_gemv.cuh): T = 1 on the CUDA cores (one
///                CTA per SM streams its rows through a bulk-copy weight ring, a warp per row),
///                T = 2..16 on the tensor cores (the same ring, stages of 16 W rows, mma.sync with
///                the eight warps sharing each stage by k16 steps), X staged whole or in windows of
///                kGemmGemvXWindow values (config forces a kernel where it runs, the CUDA-core one up
///                to T = 4; config 0 of a forced kGemv: by T, X whole: gemm_gemv_pick). Needs the
///                fast-path alignment and X's shared memory within kGemmGemvMaxSmem
///                (`gemm_gemv_smem_bytes`, `gemm_gemv_eligible`). bench_gemm's `gemm_gemv/` rows measure it against
///                cuBLASLt; kAuto takes it only where it measured faster: `gemm_auto_takes_gemv`;
///  * `kCublasLt` — cuBLASLt (the peer bench_gemm measures this library's kernels against), kAuto's
///                choice whenever it has an algorithm: it measured faster at nearly every
///                fused-projection shape (two near-ties the other way, ≤ 1.05×; the evidence is in
///                gemm_launch.cuh `auto_takes_cublaslt`). Absent when built with STEP5_NO_CUBLASLT
///                (CMake STEP5_ENABLE_CUBLASLT=OFF; every translation unit of a program must agree);
///  * `kWgmma`  — sm_90a TMA + wgmma, warp-specialised, persistent (T > 32). Tiles of 128 (or, for
///                narrow shapes at T <= 256 — fewer 128×128 tiles than SMs, `wgmma_m64_eligible`
///                — 64) tokens × BN weight rows (`kGemmWgmmaTiles`); when those tiles leave SMs idle
///                (narrow N, e.g. tp 8 at T <= 256, or o_proj at T = 64) K is split too: the work
///                units are (token tile, weight tile, k split), each split's fp32 partial goes to
///                the workspace and the last split of a tile to arrive sums the partials in split
///                order (bit-reproducible) and stores bf16. BN and the split factor come from a
///                cost model (waves × k-tiles per unit, the weight bytes, the partial traffic);
///                K is split only while the unsplit tiles number fewer than the SMs;
///  * `kSplitK` — tensor-core (mma.sync) kernel with a cp.async pipeline and split-K that
///                streams W at memory speed for small T (decode); tiles: `kGemmSplitKTiles`;
///  * `kGeneric`— a simple tiled kernel for any shape/stride/alignment (slow, always correct).
/// The fast paths need 16-byte aligned X and W, 4-byte aligned C, K, ldx and ldw multiples of 8
/// and an even ldc.
///
/// Declarations (compiles with g++); the launcher is step5/kernels/sm90/gemm_launch.cuh and the
/// definitions are emitted by step5/instantiate.cuh (library step5::kernels, or one .cu of the
/// engine that includes it), for sm_90a.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "step5/core/cuda_check.hpp"  // kSm90MaxSmemPerCta
#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"

namespace step5::ops {

/// Bytes of split-K arrival counters at the start of a GEMM workspace (zero-filled once). Both
/// split paths keep their per-tile counters there (4 bytes each; the wgmma path two per tile,
/// one per 64-token half) and split K only while the counters fit; the fp32 partials follow.
inline constexpr std::size_t kGemmCounterBytes = 16384;
/// Most workspace bytes the cuBLASLt path uses, after the counters (cuBLAS' recommended workspace
/// for Hopper); less given, its heuristic picks among the algorithms that fit (0: none needed).
inline constexpr std::size_t kGemmCublasLtWorkspaceBytes = std::size_t(32) << 20;

/// Which kernel runs a GEMM.
enum class GemmPath : int {
  kAuto = 0,     ///< let the launcher choose (the default)
  kGeneric = 1,  ///< simple tiled kernel, any shape and alignment
  kSplitK = 2,   ///< mma.sync + cp.async + split-K (needs the fast-path alignment)
  kWgmma = 3,    ///< TMA + wgmma (needs the fast-path alignment)
  kCublasLt = 4, ///< cuBLASLt (any shape and alignment it has an algorithm for, else kUnsupported; k == 0 runs
                 ///< kGeneric: C = 0; kUnsupported when built without it)
  kGemv = 5,     ///< weight-streaming kernels, 1 <= T <= kGemmGemvMaxTokens (needs the fast-path alignment;
                 ///< kAuto takes it only where `gemm_auto_takes_gemv`)
};

/// Most tokens the kGemv path runs: two n8 tiles of the tensor-core kernel.
inline constexpr std::int64_t kGemmGemvMaxTokens = 16;
/// Shared memory the kGemv path may use for X (`gemm_gemv_smem_bytes`): 200 KiB of the 227 KiB a
/// CTA may have on sm_90, the rest left to the kernels' weight ring (at least
/// kGemmGemvRingMinStages stages, `gemm_gemv_ring`).
inline constexpr std::int64_t kGemmGemvMaxSmem = 200 * 1024;
/// Most weight rows (N) the kGemv path runs (its row indices are int32).
inline constexpr std::int64_t kGemmGemvMaxRows = (std::int64_t{1} << 30);
/// Tokens per n8 tile of the tensor-core kGemv kernel.
inline constexpr std::int64_t kGemmGemvTokenTile = 8;
/// Bytes of one staged X row of the tensor-core kGemv kernel for reduction length K: 2K rounded up
/// to 128 bytes (zero-filled past K, so a k16 step that ends past K adds exact zeros), plus 16, so
/// that the 8 rows an ldmatrix reads at one K offset lie 16 bytes apart modulo 128 (eight
/// different bank groups: conflict-free).
constexpr std::int64_t gemm_gemv_x_row_bytes(std::int64_t k) { return (2 * k + 127) / 128 * 128 + 16; }
/// Bytes of zeros after X's rows in the tensor-core kGemv kernel: the ldmatrix rows of the tokens
/// of an n8 tile past T point there (one 16-byte piece per row of the 8).
inline constexpr std::int64_t kGemmGemvZeroRowsBytes = 128;
/// Consumer warps of a kGemv CTA (gemm_gemv.cuh; one more warp produces the weight ring).
inline constexpr std::int64_t kGemmGemvWarps = 8;
/// Bytes of the tensor-core kGemv kernel's partial tiles after the zeros: each consumer warp's
/// m16 × 8·NT fp32 accumulator tile (NT = ceil(T / 8) n8 tiles), summed in warp order at the end
/// of a row block.
constexpr std::int64_t gemm_gemv_mma_part_bytes(std::int64_t tokens) {
  return kGemmGemvWarps * ((tokens + kGemmGemvTokenTile - 1) / kGemmGemvTokenTile) * 16 * kGemmGemvTokenTile * 4;
}
/// Where the tensor-core kGemv kernel's partial tiles start, in bytes after X's first row, for X
/// staged in `windows` windows of x_k values: X's T rows of gemm_gemv_x_row_bytes(x_k), twice
/// where windows > 1 (two buffers: the next window streams in while one is read), then
/// kGemmGemvZeroRowsBytes of zeros (the one rule of gemm_gemv_smem_bytes and the kernel). After the
/// partial tiles: the row blocks' window sums (gemm_gemv_mma_window_sum_bytes).
constexpr std::int64_t gemm_gemv_mma_part_offset(std::int64_t tokens, std::int64_t x_k, std::int64_t windows = 1) {
  return (windows > 1 ? 2 : 1) * tokens * gemm_gemv_x_row_bytes(x_k) + kGemmGemvZeroRowsBytes;
}
/// The kGemv path's kernels, as `GemmParams::config` forces them and `GemmPlan::config` reports
/// them: the CUDA-core kernel (T <= kGemmGemvCudaCoreMaxTokens), the tensor-core kernel with X
/// staged whole (any T the path runs), and the same kernel with X staged in windows of
/// kGemmGemvXWindow values (gemm_gemv_x_windows; kAuto runs it where gemm_auto_gemv_config says).
inline constexpr int kGemmGemvCudaCores = 1;
inline constexpr int kGemmGemvTensorCores = 2;
inline constexpr int kGemmGemvTensorCoresWindowed = 3;
/// K values of X per window of the windowed tensor-core kernel (config kGemmGemvTensorCoresWindowed):
/// X's T rows of one window live in shared memory at a time, two buffers (the next window's
/// cp.async copies land while the current one is read), so the weight ring keeps its room
/// whatever K and T are. The CTA walks its rows in groups of kGemmGemvWindowGroupBlocks row blocks;
/// per group, window by window, every block of the group: a block's window sums (fp32, summed in
/// window order) wait in shared memory for the next window. A multiple of every K tile (1024).
inline constexpr std::int64_t kGemmGemvXWindow = 1024;
inline constexpr std::int64_t kGemmGemvWindowGroupBlocks = 16;
/// The windows X is staged in: ceil(K / kGemmGemvXWindow) for the windowed kernel where K is longer
/// than a window, else 1 (X whole).
constexpr std::int64_t gemm_gemv_x_windows(std::int64_t k, int config) {
  return config == kGemmGemvTensorCoresWindowed && k > kGemmGemvXWindow ? (k + kGemmGemvXWindow - 1) / kGemmGemvXWindow
                                                                         : 1;
}
/// K values of X per window: kGemmGemvXWindow where windowed, else K.
constexpr std::int64_t gemm_gemv_x_window_k(std::int64_t k, int config) {
  return gemm_gemv_x_windows(k, config) > 1 ? kGemmGemvXWindow : k;
}
/// Bytes of the windowed kernel's window sums after the partial tiles: kGemmGemvWindowGroupBlocks
/// row blocks of 16 rows × 8·NT tokens of fp32, one warp's partial tile each (0 where X is whole).
constexpr std::int64_t gemm_gemv_mma_window_sum_bytes(std::int64_t tokens, std::int64_t windows) {
  return windows > 1 ? kGemmGemvWindowGroupBlocks * gemm_gemv_mma_part_bytes(tokens) / kGemmGemvWarps : 0;
}
/// Where the window sums start, in bytes after X's first row: after the partial tiles (the one
/// rule of gemm_gemv_smem_bytes and the kernel).
constexpr std::int64_t gemm_gemv_mma_window_sum_offset(std::int64_t tokens, std::int64_t x_k, std::int64_t windows) {
  return gemm_gemv_mma_part_offset(tokens, x_k, windows) + gemm_gemv_mma_part_bytes(tokens);
}
/// Most tokens the CUDA-core kGemv kernel runs (one instance per T; config 1 forces it).
inline constexpr std::int64_t kGemmGemvCudaCoreMaxTokens = 4;
/// Most tokens config 0 runs on the CUDA-core kGemv kernel (T = 1; the tensor-core kernel above).
/// Both on the weight ring (H100, thirty-fourth session, bench_gemm call 2, µs CUDA cores / tensor
/// cores, fused projection step5_preview / dsa_h64_kv8_d128, o_proj step5_preview / dsa):
/// T = 1: tp 1 fused 51.2 / 51.3, 52.9 / 53.6; tp 8 fused 11.3 / 11.4, 9.38 / 10.17; o_proj tp 1
/// 34.5 / 35.6, 22.5 / 24.4; tp 8 6.00 / 6.19, 4.94 / 4.89 — the CUDA cores ahead on 7 of 8;
/// T = 4: tp 1 fused 55.2 / 52.7, 56.6 / 55.6; tp 8 fused 15.7 / 12.0, 13.3 / 11.2; o_proj tp 1
/// 38.9 / 46.8, 27.4 / 26.1; tp 8 8.21 / 7.01, 6.37 / 5.26 — the tensor cores ahead on 7 of 8 (the
/// CUDA-core kernel pays T FMAs and T shared-memory reads of X per weight element). T = 2, 3 were
/// not measured; they take the tensor cores as T = 4 does. (A forced kGemv with config 0 at T = 2
/// ... 4 is therefore refused where only the CUDA-core kernel's X fits, e.g. T = 4 at K 25600:
/// config 1 runs it.)
inline constexpr std::int64_t kGemmGemvCudaCoreAutoMaxTokens = 1;
/// The kGemv kernel that runs T tokens with `config` (0: by T, the CUDA cores up to
/// kGemmGemvCudaCoreAutoMaxTokens, else the tensor cores with X whole; 1, 2 or 3: that kernel).
constexpr int gemm_gemv_pick(std::int64_t tokens, int config = 0) {
  return config != 0 ? config : tokens <= kGemmGemvCudaCoreAutoMaxTokens ? kGemmGemvCudaCores : kGemmGemvTensorCores;
}
/// Shared memory X takes in the kGemv kernel for T tokens of reduction length K (`config` as in
/// gemm_gemv_pick; the rule of gemm_gemv_eligible): the CUDA-core kernel, X's rows (T · K · 2
/// bytes); the tensor-core kernel, T rows of gemm_gemv_x_row_bytes(K) (windowed: two buffers of T
/// rows of gemm_gemv_x_row_bytes(kGemmGemvXWindow)), kGemmGemvZeroRowsBytes of zeros (the n8
/// tile's rows past T are not staged: their ldmatrix rows read the zeros), the partial tiles
/// (gemm_gemv_mma_part_bytes) and, windowed, the window sums (gemm_gemv_mma_window_sum_bytes). Either kernel's whole dynamic shared memory, its
/// weight ring included, is gemm_gemv_ring(T, K, config).smem (the kernels have no static shared memory).
constexpr std::int64_t gemm_gemv_smem_bytes(std::int64_t tokens, std::int64_t k, int config = 0) {
  if (gemm_gemv_pick(tokens, config) == kGemmGemvCudaCores) return tokens * k * 2;
  const std::int64_t windows = gemm_gemv_x_windows(k, config);
  return gemm_gemv_mma_window_sum_offset(tokens, gemm_gemv_x_window_k(k, config), windows) +
         gemm_gemv_mma_window_sum_bytes(tokens, windows);
}
/// The kGemv kernels' weight ring (gemm_gemv.cuh): each stage holds one K tile of `rows`
/// consecutive W rows of the CTA, `tile_k` values wide, `row_bytes` apart; `stages` stages in
/// flight; `smem` the kernel's dynamic shared memory (the ring's mbarriers, X, the stages).
///  * the CUDA-core kernel: kGemmGemvRingRows (8) rows, one per consumer warp, packed (row_bytes =
///    2 · tile_k); tile_k is the widest of 2048, 1024, 512 for which at least
///    kGemmGemvRingMinStages stages fit beside X (512 always does where X fits in
///    kGemmGemvMaxSmem), or K itself where K is shorter than that tile (8 for K = 0, which the
///    kernel never sees: K = 0 is not a fast-path shape); 6 stages of 32 KiB at T = 1, K = 4096;
///  * the tensor-core kernel: kGemmGemvMmaRingRows (16, the mma's M) rows, gemm_gemv_x_row_bytes
///    (tile_k) apart (conflict-free ldmatrix); tile_k the widest of 1024, 512, 256 (or K, where
///    shorter) with at least kGemmGemvMmaRingPreferredStages stages, else 256 (at least
///    kGemmGemvRingMinStages fit wherever X fits in kGemmGemvMaxSmem); 4 stages of 1024 values at
///    T = 8, K = 4096, 5 of 512 at T = 16; windowed (X in windows of kGemmGemvXWindow values, which
///    every tile divides), 4 stages of 1024 at T = 16, K = 4096 and 5 at T = 8, K = 12288.
/// At most kGemmGemvRingMaxStages stages. {} where none fits (not gemm_gemv_eligible).
struct GemmGemvRing {
  std::int64_t tile_k = 0;
  std::int64_t stages = 0;
  std::int64_t smem = 0;
  std::int64_t rows = 0;
  std::int64_t row_bytes = 0;
};
inline constexpr std::int64_t kGemmGemvRingRows = kGemmGemvWarps;  // a row per consumer warp
inline constexpr std::int64_t kGemmGemvMmaRingRows = 16;
inline constexpr std::int64_t kGemmGemvRingMaxStages = 8;
inline constexpr std::int64_t kGemmGemvRingMinStages = 2;
inline constexpr std::int64_t kGemmGemvMmaRingPreferredStages = 4;
/// The tensor-core kernel's widest K tile (its others halve it, to 256): every one divides a window.
inline constexpr std::int64_t kGemmGemvMmaWidestTile = 1024;
static_assert(kGemmGemvXWindow % kGemmGemvMmaWidestTile == 0 && kGemmGemvMmaWidestTile % 256 == 0,
              "the tensor-core kernel's K tiles never straddle two X windows");
/// Dynamic shared memory a CTA may opt into on sm_90 (227 KiB, the one constant of core/cuda_check.hpp).
inline constexpr std::int64_t kGemmGemvCtaSmem = kSm90MaxSmemPerCta;
/// Bytes of the ring's mbarriers ahead of X (a full and an empty barrier per stage), 128-aligned.
inline constexpr std::int64_t kGemmGemvRingBarrierBytes = 128;
static_assert(2 * 8 * kGemmGemvRingMaxStages <= kGemmGemvRingBarrierBytes, "the ring's mbarriers fit their area");
/// The ring's layout in the kernel's dynamic shared memory (gemm_gemv.cuh, the one rule of host
/// and device): the mbarriers in the first kGemmGemvRingBarrierBytes, X (gemm_gemv_smem_bytes)
/// after them, the stages from gemm_gemv_ring_offset (X rounded up to 128 bytes), each
/// rows · row_bytes.
constexpr std::int64_t gemm_gemv_ring_offset(std::int64_t tokens, std::int64_t k, int config = 0) {
  return kGemmGemvRingBarrierBytes + (gemm_gemv_smem_bytes(tokens, k, config) + 127) / 128 * 128;
}
constexpr GemmGemvRing gemm_gemv_ring(std::int64_t tokens, std::int64_t k, int config = 0) {
  const bool mma = gemm_gemv_pick(tokens, config) != kGemmGemvCudaCores;
  const std::int64_t offset = gemm_gemv_ring_offset(tokens, k, config);
  const std::int64_t room = kGemmGemvCtaSmem - offset;
  const std::int64_t rows = mma ? kGemmGemvMmaRingRows : kGemmGemvRingRows;
  const std::int64_t widest = mma ? kGemmGemvMmaWidestTile : 2048, narrowest = mma ? 256 : 512;
  const std::int64_t wanted = mma ? kGemmGemvMmaRingPreferredStages : kGemmGemvRingMinStages;
  for (std::int64_t tile = widest; tile >= narrowest; tile /= 2) {
    const std::int64_t tk = k < tile ? (k < 8 ? 8 : k) : tile;
    const std::int64_t row_bytes = mma ? gemm_gemv_x_row_bytes(tk) : 2 * tk;
    const std::int64_t stage = rows * row_bytes;
    std::int64_t stages = room > 0 ? room / stage : 0;
    if (stages > kGemmGemvRingMaxStages) stages = kGemmGemvRingMaxStages;
    if (stages >= wanted || (tile == narrowest && stages >= kGemmGemvRingMinStages))
      return {tk, stages, offset + stages * stage, rows, row_bytes};
  }
  return {};
}
static_assert(gemm_gemv_ring(1, kGemmGemvMaxSmem / 2).stages >= kGemmGemvRingMinStages,
              "every X the CUDA-core kGemv kernel stages (at most kGemmGemvMaxSmem bytes) leaves room for the ring");
static_assert(kGemmGemvCtaSmem - kGemmGemvRingBarrierBytes - kGemmGemvMaxSmem >=
                  kGemmGemvRingMinStages * kGemmGemvMmaRingRows * gemm_gemv_x_row_bytes(256),
              "every X the tensor-core kGemv kernel stages (at most kGemmGemvMaxSmem bytes) leaves room for its ring");
/// Whether the kGemv path can run T tokens of reduction length K with `config` (alignment aside):
/// 1 <= T <= kGemmGemvMaxTokens, config 0, 1 (T <= kGemmGemvCudaCoreMaxTokens), 2 or 3, 0 <= K <=
/// kGemmGemvMaxK and X fits in kGemmGemvMaxSmem (gemm_gemv_smem_bytes; windowed: any such K).
/// The longest row (K values) the kGemv path runs: the CUDA-core kernel's X at T = 1 fills
/// kGemmGemvMaxSmem at K = 102400; twice that bounds every kernel's byte arithmetic well inside int32.
inline constexpr std::int64_t kGemmGemvMaxK = kGemmGemvMaxSmem;
constexpr bool gemm_gemv_eligible(std::int64_t tokens, std::int64_t k, int config = 0) {
  return tokens >= 1 && tokens <= kGemmGemvMaxTokens && config >= 0 && config <= kGemmGemvTensorCoresWindowed &&
         (gemm_gemv_pick(tokens, config) != kGemmGemvCudaCores || tokens <= kGemmGemvCudaCoreMaxTokens) && k >= 0 &&
         k <= kGemmGemvMaxK &&
         gemm_gemv_smem_bytes(tokens, k, config) <= kGemmGemvMaxSmem;
}

/// kAuto's kGemv shapes, with the fast-path alignment and no config / split_k override:
///  * one token (T = 1, the CUDA-core kernel), a weight of at least kGemmGemvAutoMinBytes (n · k ·
///    2) and K in [kGemmGemvAutoMinK, kGemmGemvAutoMaxK] (the K range measured: 512 ... 12288; a
///    much shorter row leaves most lanes idle and a much longer one shrinks the ring beside X) —
///    for the listed layouts at batch 1, both GEMMs at every tp (1, 2, 4, 8, 16); all but two of
///    those shapes measured faster than cuBLASLt (below; dsa_h64_kv8_d128's o_proj at tp 4 and
///    fused projection at tp 16 were not measured: they lie inside the measured K and weight ranges);
///  * T = 2 ... kGemmGemvAutoMaxTokens (the tensor-core kernel, one n8 tile), K =
///    kGemmGemvAutoMultiTokenK, a weight of at least kGemmGemvAutoMultiTokenMinBytes and N outside
///    (kGemmGemvAutoWholeMaxRows, kGemmGemvAutoWindowedMinRows) — for the listed layouts at decode
///    batches 2 ... 8: the fused projection at tp 1, 2 and 8 (K = hidden = 4096) and
///    dsa_h64_kv8_d128's o_proj at tp 2 (32 local heads × 128 = 4096; 32 MiB);
///  * T = 9 ... 16 (X in windows), K 4096 and a weight of at least kGemmGemvAutoWindowedMinBytes:
///    the fused projection at tp 1.
/// Measured on an H100 (bench/RESULTS.md; the weight ring of gemm_gemv.cuh), µs against cuBLASLt in
/// the same binary. T = 1 (thirty-second session call 1, thirty-third session calls 1-2): fused
/// step5_preview tp 1 51.0 / 58.4 (1.15×), tp 2 26.6 / 30.8, tp 4 14.7 / 16.7, tp 8 11.3 / 13.8
/// (1.22×), tp 16 9.2 / 11.9; dsa_h64_kv8_d128 tp 1 52.9 / 58.9, tp 2 27.9 / 31.3, tp 4 14.8 /
/// 16.2, tp 8 9.4 / 12.8 (1.36×); o_proj step5_preview tp 1 34.5 / 36.9, tp 2 17.7 / 20.6, tp 4
/// 9.9 / 10.9, tp 8 6.0 / 6.6, tp 16 3.9 / 5.0 (6 MiB); dsa_h64_kv8_d128 tp 1 22.5 / 26.0, tp 2
/// 12.3 / 15.4, tp 8 4.9 / 5.3, tp 16 3.85 / 4.04 (1.05×: 4 MiB, the smallest weight measured,
/// hence the bound; K 512, the shortest measured; kAuto's own cuBLASLt plan read 4.39 there).
/// T = 4 / 8 (thirty-fourth session call 2, the tensor-core kernel): fused step5_preview tp 1 52.7
/// / 57.6 (1.09×), 54.4 / 57.8 (1.06×); tp 8 12.0 / 14.1 (1.18×), 12.8 / 14.1 (1.10×);
/// dsa_h64_kv8_d128 tp 1 55.6 / 58.4 (1.05×), 57.3 / 59.4 (1.035×); tp 8 11.2 / 12.8 (1.14×),
/// 11.8 / 12.9 (1.095×: 22.1 MiB, the smallest weight measured, hence the bound); tp 2 and 4 and
/// X in windows: below (thirty-fifth session); dsa_h64_kv8_d128's o_proj at tp 2 (32 MiB, N 4096, X
/// whole; thirty-fifth session call 4) 13.9 / 15.1 (1.09×), 14.1 / 15.3 (1.08×). Taken but not
/// measured: T = 2, 3, 5, 6, 7 (the same kernel instances; X smaller than or between T = 4's and
/// 8's) — K 4096 gives them the same ring as the measured shapes (bench_gemm registers T = 1, 4, 8). kAuto
/// runs these with X whole or in windows (gemm_auto_gemv_config). Not taken: T = 9 ... 16 on weights below
/// kGemmGemvAutoWindowedMinBytes (X whole, T = 16: 0.77–0.84×, X's 140 KB leave the ring five
/// stages of 512-value tiles; in windows 0.90–0.95× at tp 8), and the o_proj shapes of other K (T
/// = 4 / 8, X whole: K 12288 0.79 / 0.38×, K 8192 0.997 / 0.76×, K 1536 0.92 / 0.94×, K 1024 1.006
/// / 1.05×, the last below the weight bound; in windows, thirty-fifth session: K 12288 0.97 / 0.98
/// / 0.90× at T = 4 / 8 / 16, K 8192 0.97 / 0.985 / 0.91×).
inline constexpr std::int64_t kGemmGemvAutoMinBytes = std::int64_t{4} << 20;
inline constexpr std::int64_t kGemmGemvAutoMinK = 512;
inline constexpr std::int64_t kGemmGemvAutoMaxK = 12288;
inline constexpr std::int64_t kGemmGemvAutoMaxTokens = 8;
inline constexpr std::int64_t kGemmGemvAutoMultiTokenK = 4096;
inline constexpr std::int64_t kGemmGemvAutoMultiTokenMinBytes = std::int64_t{22} << 20;
static_assert(gemm_gemv_eligible(1, kGemmGemvAutoMaxK, kGemmGemvCudaCores), "kAuto's kGemv K range runs on the CUDA cores");
static_assert(gemm_gemv_pick(1) == kGemmGemvCudaCores && gemm_gemv_pick(2) == kGemmGemvTensorCores &&
                  kGemmGemvAutoMaxTokens <= kGemmGemvTokenTile &&
                  gemm_gemv_eligible(kGemmGemvAutoMaxTokens, kGemmGemvAutoMultiTokenK),
              "kAuto's multi-token kGemv shapes run on the tensor-core kernel, one n8 tile");
/// T = 9 ... 16 (thirty-fifth session calls 2-3, H100, X in windows, config 3): the fused projection
/// at tp 1 only, K 4096 and a weight of at least kGemmGemvAutoWindowedMinBytes: step5_preview 56.2 /
/// 60.3 µs (1.07×) and 54.0 / 58.7 (1.09×), dsa_h64_kv8_d128 59.4 / 60.3 (1.01×) and 57.2 / 59.9
/// (1.05×); not at tp 8 (0.93–0.95×, 0.90–0.93×; 27 and 22 MiB: stall samples at tp 8 put 12.5 % on
/// the wait for the next X window's cp.async and 13 % at barriers, where 2 row blocks per CTA leave
/// a window too little work to hide its load; at tp 1, 24 % wait on the weight ring's full barrier).
inline constexpr std::int64_t kGemmGemvAutoWindowedMinBytes = std::int64_t{128} << 20;
/// T = 2 ... 8: X whole up to kGemmGemvAutoWholeMaxRows rows (tp 8), X in windows from
/// kGemmGemvAutoWindowedMinRows (tp 1, 2); the rows between (tp 4: 5016 / 5144 rows) lost to
/// cuBLASLt either way (thirty-fifth session call 3, X whole / in windows: step5_preview T = 4 0.964
/// / 1.008×, T = 8 0.916 / 0.935×; dsa_h64_kv8_d128 0.927 / 0.969×, 0.974 / 0.995×: 2-3 row blocks
/// per CTA, the last one mostly empty) and are not taken.
inline constexpr std::int64_t kGemmGemvAutoWholeMaxRows = 4096;
inline constexpr std::int64_t kGemmGemvAutoWindowedMinRows = 8192;
constexpr bool gemm_auto_takes_gemv(std::int64_t tokens, std::int64_t n, std::int64_t k) {
  if (n <= 0 || n > kGemmGemvMaxRows) return false;
  if (tokens == 1)
    return k >= kGemmGemvAutoMinK && k <= kGemmGemvAutoMaxK && n * k * 2 >= kGemmGemvAutoMinBytes;
  if (tokens >= 2 && tokens <= kGemmGemvAutoMaxTokens)
    return k == kGemmGemvAutoMultiTokenK && n * k * 2 >= kGemmGemvAutoMultiTokenMinBytes &&
           (n <= kGemmGemvAutoWholeMaxRows || n >= kGemmGemvAutoWindowedMinRows);
  return tokens > kGemmGemvAutoMaxTokens && tokens <= kGemmGemvMaxTokens && k == kGemmGemvAutoMultiTokenK &&
         n * k * 2 >= kGemmGemvAutoWindowedMinBytes;
}
/// The kGemv kernel kAuto runs where gemm_auto_takes_gemv (its plan's config): T = 1 the CUDA cores;
/// T = 9 ... 16 the tensor cores with X in windows (config 3); T = 2 ... 8 the tensor cores, with X
/// in windows on weights of at least kGemmGemvAutoWindowedMinRows rows where that gives the weight
/// ring more stages than X whole (gemm_gemv_ring; at K 4096: T = 4, 5 and 8), else X whole (config
/// 2). Measured (thirty-fifth session call 3, H100, µs X whole / X in windows / cuBLASLt, one
/// binary): fused step5_preview tp 1 (18512 rows) T = 4 53.1 / 51.8 / 58.3, T = 8 54.1 / 52.5 /
/// 58.4; tp 2 (9512) 29.2 / 28.0 / 30.7, 29.4 / 28.5 / 31.0; dsa_h64_kv8_d128 tp 1 T = 4 54.9 /
/// 53.4 / 59.0, T = 8 56.3 / 54.4 / 59.5; tp 2 29.9 / 28.75 / 29.1, 30.3 / 29.3 / 29.2 (0.997×;
/// call 4: 28.6 / 29.1 µs against cuBLASLt, 1.018× / 1.100×) — windows ahead by 2.6–4.2 % (6 / 5
/// stages of 1024 values where X whole leaves 5 / 4; call 2 read the same at tp 1); tp 8 (3472 /
/// 2832 rows, 2 row blocks per CTA) T = 4 12.5 / 13.0, 11.5 / 12.2, T = 8 12.9 / 13.5, 11.9 / 12.5
/// — X whole ahead (a window's switch and a block's window sum per unit weigh on few blocks). T =
/// 2, 3, 6, 7 (no stage gained at K 4096) were not measured either way: X whole, as before.
constexpr int gemm_auto_gemv_config(std::int64_t tokens, std::int64_t n, std::int64_t k) {
  if (tokens <= kGemmGemvCudaCoreAutoMaxTokens) return kGemmGemvCudaCores;
  if (tokens > kGemmGemvAutoMaxTokens) return kGemmGemvTensorCoresWindowed;
  return n >= kGemmGemvAutoWindowedMinRows && gemm_gemv_ring(tokens, k, kGemmGemvTensorCoresWindowed).stages >
                                                  gemm_gemv_ring(tokens, k, kGemmGemvTensorCores).stages
             ? kGemmGemvTensorCoresWindowed
             : kGemmGemvTensorCores;
}
static_assert(gemm_gemv_eligible(kGemmGemvMaxTokens, kGemmGemvAutoMultiTokenK, kGemmGemvTensorCoresWindowed),
              "kAuto's windowed kGemv shapes run");

/// The short name of a path, for labels and test output: "auto", "generic", "split_k", "wgmma",
/// "cublaslt", "gemv" ("?" for a value outside the enum).
inline const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kAuto: return "auto";
    case GemmPath::kGeneric: return "generic";
    case GemmPath::kSplitK: return "split_k";
    case GemmPath::kWgmma: return "wgmma";
    case GemmPath::kCublasLt: return "cublaslt";
    case GemmPath::kGemv: return "gemv";
  }
  return "?";
}

/// One tile configuration of the split-K path: W rows × tokens per CTA tile, cp.async stages.
struct GemmTile {
  int w_rows, tokens, stages;
};
/// THE table of split-K tile configurations: the launcher instantiates one kernel per row and
/// plans over them; `GemmParams::config` = i + 1 forces row i (tests, benchmarks).
inline constexpr GemmTile kGemmSplitKTiles[] = {{64, 16, 6},  {64, 32, 6},  {64, 64, 5},
                                                {128, 64, 4}, {64, 128, 4}, {128, 128, 4}};

/// One tile kind of the wgmma path: a CTA tile of `tokens` token rows × `w_rows` weight rows,
/// `k_boxes` 64-wide K boxes per pipeline stage (a stage covers 64 · k_boxes of K), `stages` ring
/// stages. tokens = 128: consumer warpgroup w computes token rows [64w, 64w + 64) × all w_rows;
/// tokens = 64 (planned for narrow shapes at T <= 256, gemm_launch.cuh `wgmma_m64_eligible`; a
/// forced config runs any T in tiles of 64 tokens): both consumer warpgroups compute the same 64
/// token rows, warpgroup
/// w the weight rows [w · w_rows/2, (w + 1) · w_rows/2), so every byte of W in shared memory feeds
/// an MMA and no stage carries zero-filled token rows.
struct GemmWgmmaTile {
  int tokens, w_rows, k_boxes, stages;
};
/// THE table of wgmma tile kinds: the launcher instantiates one kernel per entry and plans over
/// them; `GemmParams::config` = i + 1 forces entry i on the wgmma path (tests, benchmarks; 1 = 128,
/// 2 = 256, 3 = 152 wide as before). 152 fits the tp 1 fused projections in one wave of 132 SMs at
/// T <= 128 (N = 18512 / 19040: 122 / 126 tiles where 128-wide tiles make 145 / 149, a second wave
/// mostly empty). The 64-token kinds (issue 14, the narrow tp 8 decode shapes) hold 5 × 32 KB (64 × 256),
/// 9 × 16 KB (64 × 128) or 14 × 8 KB (64 × 64) of W in flight where 128 × 128 held 6 × 16 KB; with
/// 2 boxes a stage reads 256 contiguous bytes of each W row. Stages: as many as fit in 227 KB.
/// Measured (H200, tp 8 T = 64): the bytes of each W row in flight at once (stages × k_boxes ×
/// 128) set the weight stream's rate (see gemm_launch.cuh, kWgmmaHbm*).
inline constexpr GemmWgmmaTile kGemmWgmmaTiles[] = {
    {128, 128, 1, 6}, {128, 256, 1, 4}, {128, 152, 1, 6}, {64, 256, 1, 5},
    {64, 128, 1, 9},  {64, 128, 2, 4},  {64, 64, 1, 14},  {64, 64, 2, 7}};

/// The widest extent, in any dimension, of a tile of this library's GEMM kernels: the split-K
/// tiles' weight rows and tokens, the wgmma tiles' tokens, weight rows and K stages (64 ·
/// k_boxes), the generic kernel's 64 × 64 tiles (256: the 256-row wgmma kinds).
constexpr std::int64_t gemm_max_tile_extent() {
  std::int64_t e = 64;
  for (const GemmTile& t : kGemmSplitKTiles) {
    if (t.w_rows > e) e = t.w_rows;
    if (t.tokens > e) e = t.tokens;
  }
  for (const GemmWgmmaTile& t : kGemmWgmmaTiles) {
    if (t.tokens > e) e = t.tokens;
    if (t.w_rows > e) e = t.w_rows;
    if (64 * t.k_boxes > e) e = 64 * t.k_boxes;
  }
  return e;
}
/// The largest tokens, n and k `gemm_bf16` takes (each; tokens is further bounded by 65535 · 64 =
/// 4,194,240, the 64-token tiles of grid.y, which gemm_bf16 checks too): the split-K and wgmma kernels hold the
/// sizes, and the sizes rounded up to whole tiles (K + 64 · k_boxes - 1 for the K stages, the
/// column of a 152-row weight tile past N), in int32, so every size plus a tile extent less one
/// must stay within INT32_MAX: 2^31 - 256. (Larger n or k, e.g. a K of 2^31 - 8, overflowed the
/// kernels' k-tile count — no K tile ran and C came out 0 — or the last 152-row weight tile's
/// column index, whose wrapped negative value passed the `n < N` store test.)
inline constexpr std::int64_t kGemmMaxDim = std::int64_t{0x7fffffff} - (gemm_max_tile_extent() - 1);
static_assert(kGemmMaxDim == (std::int64_t{1} << 31) - 256, "the widest tile extent is 256");
/// The short name of a wgmma tile kind, for labels and benchmark names: "128", "256", "152" (the
/// 128-token kinds of one box per stage, named by their width as before), else "m64n256",
/// "m64n128", "m64n128k128" (token rows, weight rows, K per stage when not 64).
inline std::string gemm_wgmma_tile_name(const GemmWgmmaTile& t) {
  if (t.tokens == 128 && t.k_boxes == 1) return std::to_string(t.w_rows);
  std::string n = "m" + std::to_string(t.tokens) + "n" + std::to_string(t.w_rows);
  if (t.k_boxes != 1) n += "k" + std::to_string(64 * t.k_boxes);
  return n;
}

/// Arguments of `gemm_bf16`. All pointers are device pointers to bf16 (`step5::bf16`, the
/// bit pattern, layout-compatible with __nv_bfloat16).
struct GemmParams {
  const bf16* x = nullptr;       ///< X `[tokens, k]`, row stride `ldx` (elements)
  const bf16* w = nullptr;       ///< W `[n, k]`, row stride `ldw` (elements)
  bf16* c = nullptr;                 ///< C `[tokens, n]`, row stride `ldc` (elements), written
  std::int64_t tokens = 0;           ///< T (rows of X and C); 0 is a no-op
  std::int64_t n = 0;                ///< N (rows of W, columns of C)
  std::int64_t k = 0;                ///< K (the reduction dimension, e.g. hidden)
  std::int64_t ldx = 0;              ///< >= k
  std::int64_t ldw = 0;              ///< >= k
  std::int64_t ldc = 0;              ///< >= n
  /// Workspace of at least `gemm_workspace_bytes(...)` bytes for split-K on either path, 16-byte
  /// aligned (may be null when that is 0; `gemm_plan` gives this launch's need). Its first
  /// `kGemmCounterBytes` bytes (arrival counters) must be zero-filled before
  /// its first use; every launch leaves them zero again, so one allocation serves every later
  /// call ordered after it (same stream). Two concurrent GEMMs must not share a workspace.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  GemmPath path = GemmPath::kAuto;  ///< force a path (tests/benchmarks); kAuto in production
  /// kAuto may take cuBLASLt (see kCublasLt). false: kAuto plans this library's kernels only
  /// (bench_gemm's `gemm/` rows, tests of those kernels). The cuBLASLt path's algorithm depends on
  /// the sizes, strides, the pointers' alignments (up to 256 bytes) and the workspace given (up to
  /// kGemmCublasLtWorkspaceBytes after the counters): the same inputs, strides, alignments,
  /// workspace size and device give the same bits.
  bool allow_cublaslt = true;
  /// Tuning overrides for tests/benchmarks (0 = the launcher's choice, use 0 in production).
  /// config: split-K path 1..size(kGemmSplitKTiles) = row config-1 of kGemmSplitKTiles;
  /// wgmma path 1..size(kGemmWgmmaTiles) = tile kind kGemmWgmmaTiles[config-1]; kGemv: its kernel,
  /// kGemmGemvCudaCores (T <= kGemmGemvCudaCoreMaxTokens), kGemmGemvTensorCores or kGemmGemvTensorCoresWindowed (gemm_gemv_pick;
  /// and split_k 0 or 1).
  /// split_k: the K splits of either path (1 = no split; capped at the number of k-tiles — 64
  /// wide, or 64 · k_boxes wide for a wgmma kind — and 1 when the tiles' arrival counters would not fit in kGemmCounterBytes).
  int config = 0;
  int split_k = 0;
  /// CUDA device of the pointers and the stream; -1 = the current device (any other negative
  /// value: kInvalidArgument). Another device is made current for the plan's per-device setup and
  /// the launch, then the caller's is restored.
  int device = -1;
};

/// The path and split-K factor `gemm_bf16` uses for `p` (path kAuto resolved), without
/// launching. Returns an error Status for invalid parameters (same checks as `gemm_bf16`, except
/// the overlap of C, X, W and the workspace: the plan reads only the pointers' alignment).
struct GemmPlan {
  GemmPath path = GemmPath::kGeneric;
  int split_k = 1;                 ///< K splits (either path); >1: partials reduced through the workspace
  std::size_t workspace_bytes = 0; ///< bytes of workspace this launch needs
  /// The tile configuration chosen (the `GemmParams::config` value that forces the same choice):
  /// split-K path 1..size(kGemmSplitKTiles), wgmma path 1..size(kGemmWgmmaTiles), gemv its kernel
  /// (kGemmGemvCudaCores, kGemmGemvTensorCores or kGemmGemvTensorCoresWindowed), 0 for generic and cuBLASLt.
  int config = 0;
};
Status gemm_plan(const GemmParams& p, GemmPlan* plan);

/// Workspace bytes needed by any launch with at most `max_tokens` tokens and these n, k
/// (path kAuto, or kWgmma forced, without config/split_k overrides; both split paths counted, and
/// kGemmCounterBytes + kGemmCublasLtWorkspaceBytes when cuBLASLt is built in: the cuBLASLt path
/// needs none but uses that much; `gemm_plan` gives one launch's need, also with overrides).
/// Allocate once with this size and zero-fill it (256-byte aligned, e.g. cudaMalloc).
/// Returns 0 when no launch uses a workspace or the device cannot be queried.
std::size_t gemm_workspace_bytes(std::int64_t max_tokens, std::int64_t n, std::int64_t k, int device = -1);

/// Launches `C = X @ W^T` on `stream` (asynchronous). Errors (as Status, nothing launched):
/// kInvalidArgument for a STEP5_PDL other than 0, 1 or empty (`pdl_env_status`, checked first,
/// whatever the path and sizes), negative sizes, ld < row length, and when tokens, n > 0: a null
/// c, or a null x or w with k > 0; tokens, n or k above kGemmMaxDim; tokens above 65535 · 64 =
/// 4,194,240 (the kernels' 64-token tiles in grid.y); rows of X, W or C whose strided extent
/// passes 2^63 - 1 bytes (`require_strided_rows_fit`); split_k < 0, a path outside GemmPath,
/// a forced fast path whose alignment rules fail, a config out of range (a forced split-K config
/// whose token tiles or K splits pass grid.y / grid.z included), a forced kCublasLt with config
/// != 0 or split_k > 1, a null, misaligned (16 bytes) or too small workspace for the split paths
/// (the message names the bytes needed and given), a forced kGemv outside `gemm_gemv_eligible`
/// (T above kGemmGemvMaxTokens, K above kGemmGemvMaxK, X's gemm_gemv_smem_bytes beyond
/// kGemmGemvMaxSmem, config out of 0..3 or the CUDA-core kernel at T > kGemmGemvCudaCoreMaxTokens),
/// with more than kGemmGemvMaxRows rows or with split_k >
/// 1, and (after the plan and the workspace checks, before the launch; not checked by gemm_plan)
/// C overlapping X or W (`require_disjoint`: C is written while other CTAs still read X and W, so
/// no in-place GEMM; the byte ranges from the first to the last byte of rows [0, tokens) of X and
/// C and [0, n) of W, so X and C interleaved as different columns of one strided buffer are
/// refused too) or the workspace bytes the planned path writes overlapping X, W or C; kUnsupported for a
/// device that is not sm_90, or a forced kCublasLt when built without cuBLASLt or when it has no
/// algorithm for the shape; kCudaError for a failed launch, driver or cuBLASLt call (the message
/// names it). tokens == 0 (or n == 0) returns Ok without launching. When k == 0, C = 0.
Status gemm_bf16(const GemmParams& p, cudaStream_t stream);

}  // namespace step5::ops
