#pragma once
/// \file step5/ops/attention.hpp
/// DSA sparse GQA attention with the head-wise output gate (SPEC.md §4 steps 7–8), prefill and
/// decode in one launcher, paged KV cache (SPEC §5), sm_90a.
///
/// For packed query token t (request b, position p) and local q head h of local KV group
/// g = h / hpg_q, the keys/values are every token of the regions listed in the first
/// `counts[g, t]` entries of `topk_ids[g, t, :]` (selected history regions plus the current region
/// `p/8`, of which only tokens `8*(p/8) .. p` are used), taken from local KV head g:
///   `o = softmax(q·Kᵀ · scale) · V` (scale = D^-0.5), fp32 online softmax, probabilities rounded
///   to bf16 before P·V, row sums in fp32; `lse[t, h] = ln Σ exp(q·k · scale)` (natural log,
///   scaled-logit units; an empty row gives o = 0, lse = −inf);
///   with a gate: `out[t, h, :] = bf16(bf16(o) * bf16(sigmoid(gate[t, h])))`, else `out = bf16(o)`.
///
/// Kernel shape (see kernels/sm90/attention.cuh): one CTA per (query tile, KV group, split). A
/// query tile is up to `64 / hpg_q` consecutive queries of one request (all hpg_q heads of each,
/// so 64 rows of the mma M dimension); the CTA builds the union of the tile's selected regions
/// (bitmaps in shared memory), gathers the union 64 tokens at a time from the paged cache with
/// cp.async and masks per (query, token); a tile of one query (decode) takes its own selection row
/// directly (no bitmaps). With one split, a tile whose union is large against its queries' own
/// selections (little reuse: attention_per_query_pays) runs its queries one after the other on
/// their own rows instead (`tile_gather`). Decode rows (1–4 per request) form one small tile whose token range is
/// split over CTAs (split-KV); the splits are merged in split order (log-sum-exp merge) in the same
/// launch: by the split CTAs together as a thread-block cluster (num_splits <= 16 and at most one
/// split CTA per SM: attention_cluster_merge_pays), else by the last split CTA of a (tile, KV
/// group) to finish.
///
/// Declarations compile with g++; the launchers (kernels/sm90/attention_launch.cuh) are
/// instantiated per geometry row by step5/instantiate.cuh (library step5::kernels, or one .cu of
/// the engine). CUDA-graph safe: no allocation and no
/// host synchronisation inside `sparse_attention`; the workspace size is queryable up front.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "step5/core/cuda_check.hpp"
#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/ops/batch_check.hpp"
#include "step5/layout/parallel.hpp"

namespace step5::ops {

/// Arguments of `sparse_attention`. Device pointers; element strides. Conventions of
/// docs/ARCHITECTURE.md. Counts: T = num_tokens, B = num_requests, Hl = num_local_heads,
/// lg = num_kv_groups (local KV groups = local KV heads of the caches), D = head_dim.
struct SparseAttentionParams {
  int num_tokens = 0;        ///< T, packed query tokens of this step (0: nothing is launched)
  int num_requests = 0;      ///< B
  int num_local_heads = 0;   ///< Hl = lg * hpg_q (the local layout of one listed tp)
  int num_kv_groups = 0;     ///< lg; the caches hold exactly lg KV heads (KVl == lg, SPEC §2)
  int head_dim = 0;          ///< D (must be the geometry's head_dim)
  int topk = 0;              ///< regions selected per (token, group), 1..1024; rows are topk+1 wide

  const bf16* q = nullptr;         ///< `[T, Hl, D]` prepared q (SPEC §4.2), row stride `q_row_stride`, 4-byte aligned
  std::int64_t q_row_stride = 0;   ///< elements between tokens; 0 = Hl*D; a multiple of 2
  const bf16* k_cache = nullptr;   ///< `[num_blocks, block_size, lg, D]`, 16-byte aligned
  const bf16* v_cache = nullptr;   ///< same shape as k_cache
  /// blocks in the caches (a block id outside is never read); num_blocks * block_size * lg <=
  /// kAttentionMaxCacheRows
  int num_blocks = 0;
  int block_size = 0;              ///< tokens per block, a positive multiple of 8
  const std::int32_t* block_table = nullptr;  ///< `[B, max_blocks]`
  int max_blocks = 0;              ///< row stride of block_table; max_blocks*block_size bounds positions
  const std::int32_t* cu_seqlens_q = nullptr; ///< device `[B+1]`, cu[0] = 0, non-decreasing, cu[B] = T
  const std::int32_t* seq_lens = nullptr;     ///< device `[B]`, KV length after this step (>= q_len)
  /// HOST mirrors of cu_seqlens_q `[B+1]` and seq_lens `[B]` (same values), validated by
  /// `validate_step` (ops/batch_check.hpp); required when T > 0. See `sparse_attention` for
  /// CUDA-graph replay.
  const std::int32_t* cu_seqlens_q_host = nullptr;
  const std::int32_t* seq_lens_host = nullptr;
  /// Checked mode: device record of kBoundsFaultWords int32 (zero-filled before the step); the
  /// kernel records the first block-table fault there (ops/bounds_fault.hpp). nullptr = skipped silently.
  std::int32_t* bounds_fault = nullptr;
  /// `[lg, T, topk+1]` region ids; entries >= count are ignored, but a decode row may be loaded in
  /// full before its count arrives (all topk + 1 entries must be allocated; their values unused)
  const std::int32_t* topk_ids = nullptr;
  const std::int32_t* counts = nullptr;       ///< `[lg, T]` valid entries per row, in [0, topk+1]; with topk_ids 4-byte aligned
  /// Gate logits (SPEC §4.8): row t holds Hl bf16 values at `gate + t*gate_row_stride` (the
  /// index_g columns of the fused GEMM output, or a separate `[T, Hl]`), 2-byte aligned; nullptr =
  /// no gate.
  const bf16* gate = nullptr;
  std::int64_t gate_row_stride = 0;  ///< elements; 0 = Hl, else >= Hl
  bf16* out = nullptr;               ///< `[T, Hl, D]` bf16, row stride `out_row_stride`
  std::int64_t out_row_stride = 0;   ///< elements; 0 = Hl*D; a multiple of 4, pointer 8-byte aligned
  float* lse = nullptr;              ///< `[T, Hl]` fp32 natural-log LSE (scaled units), 4-byte aligned, or nullptr

  float softmax_scale = 0.0f;  ///< 0 = D^-0.5 (SPEC §4.7), else a finite value > 0 (others refused)
  /// queries per CTA tile; 0 = auto (decode, T <= B: 1; else 64 / hpg_q, less when smem is short)
  int query_tile = 0;
  int num_splits = 0;          ///< split-KV factor; 0 = auto (sparse_attention_plan); at most kAttentionMaxSplits
  /// How the splits of a (query tile, KV group) are merged when num_splits > 1: 0 = auto (a thread-
  /// block cluster of the split CTAs merging through distributed shared memory when
  /// attention_cluster_merge_pays (num_splits <= kAttentionMaxClusterSplits, at most one split CTA
  /// per SM) and such clusters can be resident, else the last-arriver merge
  /// through the workspace), 1 = always the last-arriver merge (A/B and tests). Both compute the
  /// same split weights and sum the splits in split order: bit-identical results (test_attention
  /// checks it), each bit-identical across launches.
  int split_merge = 0;
  /// How a tile of several queries (prefill, MTP) launched with one split gathers its selected
  /// regions: 0 = auto, decided per tile from its selections (attention_per_query_pays); 1 =
  /// always the union of the tile's selections, once for all its queries (all the tile's rows,
  /// up to 64, per stage); 2 = always query by query, each on its own selection row (hpg_q rows
  /// per stage, as decode). Tiles of one query and launches with num_splits > 1 always take their
  /// own path. For selection rows of distinct ids (SPEC §4 step 6) both gather the same regions
  /// and agree with the reference within rounding (fp32 sums in another order; a repeated id
  /// counts twice per query, once in the union); each is deterministic. Tests and benchmarks
  /// force it; production uses 0.
  int tile_gather = 0;
  /// K/V stages of the cp.async ring, kAttentionMinStages .. kAttentionMaxStages; 0 = auto
  /// (sparse_attention_plan). Tests and benchmarks force it; production uses 0.
  int pipeline_stages = 0;
  /// With num_splits = 0: the auto split factor is lowered until the split-KV workspace fits in
  /// this many bytes (1 split needs none); 0 = no limit.
  std::size_t max_workspace_bytes = 0;
  /// CUDA device of the pointers and the stream; -1 = the current device (any other negative
  /// value: kInvalidArgument). Another device is made current for the launch's per-device setup
  /// and the launch, then the caller's is restored.
  int device = -1;
};

/// A batch is decode-like (bandwidth-bound: two CTAs per SM and the deepest ring that keeps two)
/// when it has at most this many query rows per request on average (decode, MTP).
inline constexpr int kAttentionDecodeRowsPerRequest = 4;
/// Upper bound of `num_splits`.
inline constexpr int kAttentionMaxSplits = 32;
/// Largest split factor merged by a thread-block cluster of the split CTAs (cluster dims (1, 1,
/// num_splits); above 8 a non-portable cluster size, which the launcher checks can be resident).
inline constexpr int kAttentionMaxClusterSplits = 16;
/// Rows of one CTA tile (queries × hpg_q heads) and gathered tokens per pipeline stage.
inline constexpr int kAttentionTileRows = 64;
inline constexpr int kAttentionTileTokens = 64;
/// K/V stages of the kernel's cp.async ring (a kernel instance per count): while one stage is
/// computed, the others are in flight. The planner picks the count (sparse_attention_plan).
inline constexpr int kAttentionMinStages = 2;
inline constexpr int kAttentionMaxStages = 4;
/// Metadata slots of the kernel's stage loop with `stages` K/V ring stages: one more than the
/// stages, since a stage's metadata is prepared while two others are still read (one barrier per
/// stage). The kernel's StageMeta and attention_static_smem both take it from here.
constexpr int attention_meta_slots(int stages) { return stages + 1; }
/// Alignment of the kernel's dynamic shared memory (the K/V ring: 128B-swizzle atoms of 1 KiB).
inline constexpr std::size_t kAttentionSmemAlign = 1024;
/// Upper bound of the kernel's static shared memory with `stages` ring stages: 768 bytes of tile
/// state and softmax statistics plus, per metadata slot (attention_meta_slots), 64 token cache
/// rows (int32) and the (query, region) masks (16 x 8 bytes), rounded up to 1 KiB (2, 3, 4
/// stages: 2048, 3072, 3072 bytes). The rounding is what the kernel occupies: its dynamic shared
/// memory is declared kAttentionSmemAlign-aligned (the wgmma operands' 128B-swizzle atoms), so
/// ptxas pads the static part to the next KiB (it reports 2048, 3072, 3072 bytes for
/// step5_preview). The kernel static_asserts its layout against it (with the one-query
/// instance's 8-byte merge mbarrier, within the 768 bytes' slack).
constexpr std::size_t attention_static_smem(int stages) {
  return (768u + static_cast<std::size_t>(attention_meta_slots(stages)) * (kAttentionTileTokens * 4u + 16u * 8u) +
          kAttentionSmemAlign - 1u) / kAttentionSmemAlign * kAttentionSmemAlign;
}
/// The kernel keeps a gathered token's cache row, (block * block_size + slot) * num_kv_groups + g,
/// in an int32: num_blocks * block_size * num_kv_groups must not exceed this (sparse_attention_plan
/// returns kUnsupported beyond it; 2^31 rows of 384 bytes at D 192 are 824 GB per K cache).
inline constexpr long long kAttentionMaxCacheRows = 0x7fffffffLL;
/// Union regions the multi-query path resolves at a time (region id and block-table entry, once
/// per region instead of once per thread that uses it): the regions of 8 consecutive ring stages
/// of kAttentionTileTokens / kRegionSize = 8 regions. The kernel keeps kAttentionChunkSlots = 2
/// such chunks (the one read and the next, resolved while it is read) of
/// kAttentionChunkEntryBytes per region (int32 {region id, cache row of its first token}): 1 KiB.
/// Chunks of 128 regions (2 KiB) measured 1.5x slower on bench_attention's prefill at 128K
/// history: the tile metadata then no longer let two CTAs share an SM (test_layer_plan pins that
/// bound).
inline constexpr int kAttentionChunkRegions = 64;
inline constexpr int kAttentionChunkSlots = 2;
inline constexpr int kAttentionChunkEntryBytes = 8;
/// Byte offset, from the start of the tile metadata, of the multi-query path's region chunks
/// (kAttentionChunkSlots x kAttentionChunkRegions entries): after the
/// `query_tile` per-query region bitmaps, their union and its word prefix counts (`bitmap_words`
/// 32-bit words each; words + 1 prefix counts), 8-byte aligned.
constexpr std::size_t attention_chunk_offset(int query_tile, long long bitmap_words) {
  const std::size_t bitmaps = (static_cast<std::size_t>(query_tile) + 1u) * static_cast<std::size_t>(bitmap_words) * 4u +
                              (static_cast<std::size_t>(bitmap_words) + 1u) * 4u;
  return (bitmaps + 7u) / 8u * 8u;
}
/// Bytes of the kernel's dynamic shared memory after the K/V ring stages (the tile metadata):
/// the larger of the multi-query path's region bitmaps and region chunks (attention_chunk_offset,
/// then the chunks) and the one-query (decode) path's region list (a region id and the cache row
/// of its first token, int32, per entry of a topk row: 2 x (topk + 1)), then the per-row
/// gate values (kAttentionTileRows fp32). The planner (smem_bytes) and the kernel (its pointers)
/// both read it from here.
constexpr std::size_t attention_meta_bytes(int query_tile, long long bitmap_words, int topk) {
  const std::size_t bitmaps = attention_chunk_offset(query_tile, bitmap_words) +
                              static_cast<std::size_t>(kAttentionChunkSlots) * kAttentionChunkRegions *
                                  kAttentionChunkEntryBytes;
  const std::size_t list = 2u * 4u * (static_cast<std::size_t>(topk) + 1u);
  return (bitmaps > list ? bitmaps : list) + 4u * kAttentionTileRows;
}
/// The cluster merge's buffers in the (then free) K/V ring, in fp32 floats from its start (rows of
/// stride head_dim + 4): the warps' stash [64 rows]; a normalised partial of up to 32 rows after
/// it (`partial`; in place over the stash, offset 0, when one warp holds a row); its 64 log2-LSE
/// values (`lse`); the merge's weight table [64][kAttentionMaxSplits] (`weights`) and 64 merged
/// LSE values (`merged_lse`); `total` floats. The kernel takes its pointers from here. The
/// one-query instance's merge by pushes (cluster_merge_pushed) receives at `partial` the splits'
/// values of its share (S · ceil(n / S) float4 slots, n = hpg_q · head_dim / 4, split s's at slot
/// s · ceil(n / S)) and writes the splits' LSEs straight into `weights` (row r, split s at
/// r · kAttentionMaxSplits + s); `lse` is unused there.
struct AttentionClusterMergeLayout {
  long long partial, lse, weights, merged_lse, total;
};
constexpr AttentionClusterMergeLayout attention_cluster_merge_layout(int head_dim) {
  const long long row = head_dim + 4;
  AttentionClusterMergeLayout l{};
  l.partial = static_cast<long long>(kAttentionTileTokens) * row;
  l.lse = l.partial + 32 * row;
  l.weights = l.lse + kAttentionTileTokens;
  l.merged_lse = l.weights + static_cast<long long>(kAttentionTileTokens) * kAttentionMaxSplits;
  l.total = l.merged_lse + kAttentionTileTokens;
  return l;
}
/// Whether the cluster merge's buffers (attention_cluster_merge_layout) fit in the K/V ring of a
/// kernel with head_dim D and `stages` stages.
constexpr bool attention_cluster_merge_fits(int head_dim, int stages) {
  return attention_cluster_merge_layout(head_dim).total * 4 <=
         static_cast<long long>(stages) * 2 * kAttentionTileTokens * head_dim * 2;
}

/// Whether the split CTAs of a launch are merged by a thread-block cluster (the default; else the
/// last-arriver merge): num_splits <= kAttentionMaxClusterSplits, the merge buffers fit the ring
/// (attention_cluster_merge_fits) and the launch has at most one split CTA per SM (`split_ctas` =
/// active (tile, KV group) pairs x num_splits <= num_sms), i.e. the latency-bound small-batch
/// regime where it was measured faster: H200, step5_preview 128K, batch 1, 13 splits, 26.6 µs
/// (tp 1) / 24.5 µs (tp 8) against 36.6 / 25.5 µs for 22 splits and the last-arriver merge
/// (same binary, bench/RESULTS.md 2026-12-01 third session). With more CTAs it was slower: tp 8
/// batch 64 (4 splits, 256 CTAs) 107.6 µs against 84.6 µs with the last-arriver merge in the
/// previous session's run (not a same-binary A/B; not profiled — a cluster's CTAs all stay
/// resident until its slowest one finishes, and clusters are placed per GPC).
constexpr bool attention_cluster_merge_pays(int head_dim, int stages, long long split_ctas, int num_sms,
                                            long long num_splits) {
  return num_splits > 1 && num_splits <= kAttentionMaxClusterSplits && attention_cluster_merge_fits(head_dim, stages) &&
         split_ctas <= num_sms;
}
/// Dynamic shared memory a CTA may use on sm_90.
inline constexpr std::size_t kAttentionMaxSmem = kSm90MaxSmemPerCta - 4096;  // 227 KiB less the static part
static_assert(attention_static_smem(kAttentionMaxStages) <= 4096, "kAttentionMaxSmem leaves 4 KiB of static smem");
/// Dynamic shared memory that still lets two CTAs share an SM (228 KiB per SM, 1 KiB reserved and
/// the static part per CTA).
constexpr std::size_t attention_two_per_sm_smem(int stages) {
  const std::size_t per_sm = static_cast<std::size_t>(kSm90SmemPerSm);
  return (per_sm - 2u * kSm90SmemReservedPerCta - 2u * attention_static_smem(stages)) / 2u;
}

/// Bytes of split-KV arrival counters at the start of a sparse-attention workspace: one uint32 per
/// (query tile, KV group) of a launch with num_splits > 1, at a fixed place so that launches of
/// any plan share them. Zero-filled once when the workspace is allocated; every completed launch
/// leaves them zero again (the last split CTA of a (tile, group) resets its counter).
inline constexpr std::size_t kAttentionCounterBytes = 65536;
inline constexpr long long kAttentionMaxSplitPairs = static_cast<long long>(kAttentionCounterBytes / 4);

/// Byte layout of the split-KV workspace, the one place the planner (its size) and the launcher
/// (its pointers) read it from: `[kAttentionCounterBytes]` arrival counters (uint32 per (tile,
/// group)), then the normalised fp32 partial outputs `[tiles, lg, splits, 64, D]`, then their
/// log2-domain LSE `[tiles, lg, splits, 64]`. No workspace (0 bytes) when splits == 1.
struct SparseAttentionWorkspaceLayout {
  std::size_t partials = 0;  ///< byte offset of the partial outputs
  std::size_t lse = 0;       ///< byte offset of the partial LSE
  std::size_t bytes = 0;     ///< total bytes
};
inline SparseAttentionWorkspaceLayout sparse_attention_workspace_layout(long long tiles, int num_kv_groups,
                                                                        int num_splits, int head_dim) {
  SparseAttentionWorkspaceLayout l;
  if (num_splits <= 1) return l;
  const std::size_t rows = static_cast<std::size_t>(tiles) * static_cast<std::size_t>(num_kv_groups) *
                           static_cast<std::size_t>(num_splits) * kAttentionTileRows;
  l.partials = kAttentionCounterBytes;
  l.lse = l.partials + rows * static_cast<std::size_t>(head_dim) * 4u;
  l.bytes = l.lse + rows * 4u;
  return l;
}

/// Row groups of 16 rows (one warp each) of a tile of `rows` = queries x hpg_q rows: 1, 2 or 4; the
/// kernel's 4 warps split each stage's tokens over 4 / groups of them. A tile of 4 groups (more
/// than 32 rows) is one warpgroup on all 64 tokens: the tile the wgmma path takes.
constexpr int attention_row_groups(int rows) { return rows <= 16 ? 1 : (rows <= 32 ? 2 : 4); }
/// Whether the kernels take head_dim D: a positive multiple of 64 (the K/V stages' 128-byte column
/// blocks), at most 256 (sparse_attention_kernel's static_assert; sparse_attention_plan's check).
constexpr bool attention_head_dim_ok(int head_dim) { return head_dim > 0 && head_dim % 64 == 0 && head_dim <= 256; }

/// Whether the kernel has the wgmma path for 64-row tiles at head_dim D (an m64nDk16 instruction
/// for P·V: D 128 or 192), and the one ring depth it is built for. The kernel, the planner and
/// the launcher read them from here.
constexpr bool attention_wgmma_head_dim(int head_dim) { return head_dim == 128 || head_dim == 192; }
inline constexpr int kAttentionWgmmaStages = 2;

/// How a launch is carried out (derived from the params and the SM count only).
struct SparseAttentionPlan {
  int hpg_q = 0;
  int query_tile = 0;          ///< queries per tile
  /// grid x: ceil(T / query_tile) + B tiles (unused ones exit); max(T, 1) when query_tile is 1
  int max_tiles = 0;
  int num_splits = 1;          ///< grid z
  /// num_splits > 1 merged by a cluster of the split CTAs (distributed shared memory); the launcher
  /// falls back to the last-arriver merge where such clusters cannot be resident. The workspace is
  /// sized for the last-arriver merge either way.
  bool cluster_merge = false;
  int stages = 2;              ///< K/V stages of the cp.async ring (picks the kernel instance)
  /// The kernel instance whose 64-row tiles (more than 32 rows, one warpgroup) run Q·Kᵀ and P·V on
  /// wgmma: attention_wgmma_head_dim, kAttentionWgmmaStages stages, query_tile x hpg_q > 32 and
  /// some request with more than one query row (a tile can then hold several queries); else the
  /// instance without that path, the smaller kernel (bench/RESULTS.md, tenth session; plans of
  /// query_tile 1 launch the one-query instance, twenty-fifth session). From sizes only: MTP
  /// batches whose requests have too few rows for such a tile (e.g. 3 rows at hpg_q 8) also take
  /// it, and run its mma.sync paths.
  bool wgmma_tiles = false;
  /// 32-bit words of one region bitmap (max_blocks*block_size/8 bits); 0 with query_tile 1 (no bitmaps)
  int bitmap_words = 0;
  std::size_t smem_bytes = 0;  ///< dynamic shared memory per CTA
  std::size_t workspace_bytes = 0;  ///< 0 when num_splits == 1 (sparse_attention_workspace_layout)
};

namespace detail {
inline std::string attn_msg(const char* what, long long v, const std::string& expected) {
  return std::string("sparse_attention: ") + what + " = " + std::to_string(v) + ", expected " + expected;
}
/// Launches (process-wide) whose split merge ran as a thread-block cluster: the launcher falls
/// back to the last-arriver merge where clusters cannot be resident, which gives the same bits, so
/// the tests read this count to know that the cluster merge actually ran.
inline std::atomic<long long>& attention_cluster_merge_launches() {
  static std::atomic<long long> n{0};
  return n;
}
}  // namespace detail

/// The `validate_step` arguments of `p` (batch with host mirrors, table, topk); the launcher adds
/// the workspace. `per_request = false` checks the sizes only (planning).
inline StepCheck attention_step_check(const SparseAttentionParams& p, bool per_request) {
  StepCheck c;
  c.op = "sparse_attention";
  c.num_requests = p.num_requests;
  c.num_tokens = p.num_tokens;
  c.cu_seqlens_q = p.cu_seqlens_q_host;
  c.seq_lens = p.seq_lens_host;
  c.device_arrays = true;
  c.cu_seqlens_q_device = p.cu_seqlens_q, c.seq_lens_device = p.seq_lens;
  c.per_request = per_request;
  c.block_table = p.block_table;
  c.block_size = p.block_size;
  c.max_blocks = p.max_blocks;
  c.num_blocks = p.num_blocks;
  c.topk = p.topk;
  return c;
}

/// Checks the size arguments (not the pointers, not the per-request metadata: `validate_step`
/// with per_request = false) and computes the plan for `num_sms` SMs.
/// Errors name the value and what was expected (kInvalidArgument / kUnsupported).
inline Status sparse_attention_plan(const SparseAttentionParams& p, int num_sms, SparseAttentionPlan* plan) {
  using detail::attn_msg;
  if (plan == nullptr) return invalid_argument("sparse_attention_plan: plan is null");
  STEP5_RETURN_IF_ERROR(validate_step(attention_step_check(p, false)));
  if (p.num_kv_groups <= 0) return invalid_argument(attn_msg("num_kv_groups", p.num_kv_groups, "> 0"));
  if (p.num_local_heads <= 0 || p.num_local_heads % p.num_kv_groups != 0)
    return invalid_argument(attn_msg("num_local_heads", p.num_local_heads,
                                     "a positive multiple of num_kv_groups = " + std::to_string(p.num_kv_groups)));
  if (!attention_head_dim_ok(p.head_dim))
    return invalid_argument(attn_msg("head_dim", p.head_dim, "a positive multiple of 64, at most 256"));
  const int hpg = p.num_local_heads / p.num_kv_groups;
  if (!layout::supported_hpg_q(hpg))
    return unsupported(attn_msg("hpg_q (num_local_heads / num_kv_groups)", hpg, "4, 8 or 16 (SPEC §2 rule 6)"));
  if (p.num_splits < 0 || p.num_splits > kAttentionMaxSplits)
    return invalid_argument(attn_msg("num_splits", p.num_splits, "0 (auto) .. " + std::to_string(kAttentionMaxSplits)));
  const int max_qt = kAttentionTileRows / hpg;
  if (p.query_tile < 0 || p.query_tile > max_qt)
    return invalid_argument(attn_msg("query_tile", p.query_tile, "0 (auto) .. 64 / hpg_q = " + std::to_string(max_qt)));
  if (p.pipeline_stages != 0 &&
      (p.pipeline_stages < kAttentionMinStages || p.pipeline_stages > kAttentionMaxStages))
    return invalid_argument(attn_msg("pipeline_stages", p.pipeline_stages,
                                     "0 (auto) or " + std::to_string(kAttentionMinStages) + " .. " +
                                         std::to_string(kAttentionMaxStages)));
  // num_blocks * block_size fits int64 (two ints); compared against the bound / num_kv_groups so
  // that no product overflows
  const long long cache_tokens = static_cast<long long>(p.num_blocks) * p.block_size;
  if (cache_tokens > kAttentionMaxCacheRows / p.num_kv_groups)
    return unsupported(attn_msg("num_blocks * block_size (cache tokens)", cache_tokens,
                                "at most " + std::to_string(kAttentionMaxCacheRows / p.num_kv_groups) + " with " +
                                    std::to_string(p.num_kv_groups) +
                                    " KV groups: the kernel indexes cache rows (tokens x groups) with int32"));
  const long long max_tokens = static_cast<long long>(p.max_blocks) * p.block_size;
  const long long regions = max_tokens / layout::kRegionSize;
  // Tiles of one query take the region-list path (the kernel's step 2') and never build region
  // bitmaps. A decode step (at most one token per request on average: T <= B) plans tiles of one
  // query and no bitmaps, so that its shared memory does not grow with the block-table width:
  // 12 bytes per 256 addressable positions at query_tile 1 (its bitmap, the union, the prefix
  // counts) left step5_preview's decode (D 192, 2 stages) one CTA per SM from about 384K
  // positions per row. A query_tile of 1, forced, is the same. A replay whose device
  // cu_seqlens_q give a request more tokens runs them as tiles of one query each (correct, no
  // reuse).
  const bool one_query_tiles = p.query_tile == 1 || (p.query_tile == 0 && p.num_tokens <= p.num_requests);
  const long long words = one_query_tiles ? 0 : (regions + 31) / 32;
  const std::size_t stage_bytes = 2ull * kAttentionTileTokens * static_cast<std::size_t>(p.head_dim) * 2ull;  // K + V
  auto smem_for = [&](int qt, int ns) {
    return static_cast<std::size_t>(ns) * stage_bytes + attention_meta_bytes(qt, words, p.topk);
  };
  int qt = one_query_tiles ? 1 : p.query_tile > 0 ? p.query_tile : max_qt;
  while (qt > 1 && smem_for(qt, kAttentionMinStages) > kAttentionMaxSmem) --qt;
  if (smem_for(qt, kAttentionMinStages) > kAttentionMaxSmem)
    return unsupported(attn_msg(
        "max_blocks * block_size (tokens addressable per request)", max_tokens,
        "at most about " + std::to_string((kAttentionMaxSmem - kAttentionMinStages * stage_bytes) / 12 * 256) +
            " tokens: the region bitmaps must fit in shared memory"));
  // Ring depth. Prefill keeps 2 stages and the widest tile (compute-bound; two stages hide the
  // gather). Decode-like batches (<= 4 rows per request on average; their tiles hold 1-4 queries
  // anyway) are bandwidth-bound: they keep two CTAs per SM whenever the shared memory allows,
  // with the deepest ring that still fits two; one CTA per SM only when two never fit. Measured
  // on the H200 (bench_attention decode at 128K, step5_preview D 192, 48 KiB per stage, the same
  // split model; bench/RESULTS.md): 2 stages x 2 CTAs 221.6 µs (tp 1, batch 64) and 84.6 µs (tp 8,
  // batch 64) against 351.4 and 110.6 µs for 4 stages x 1 CTA and 346.2 / 107.8 µs for 3 x 1: a
  // second CTA hides the other's serial per-stage work (block-table reads, masks, softmax), which
  // more bytes in flight in one CTA does not. D 128 (32 KiB): 3 stages x 2 CTAs. A forced
  // `pipeline_stages` is taken as given.
  int ns = kAttentionMinStages;
  const bool decode_like =
      static_cast<long long>(p.num_tokens) <= static_cast<long long>(kAttentionDecodeRowsPerRequest) * p.num_requests;
  if (decode_like || p.pipeline_stages != 0) {
    int best = -1, best_ns = ns, best_qt = qt;
    for (int n = kAttentionMinStages; n <= kAttentionMaxStages; ++n) {
      if (p.pipeline_stages != 0 && n != p.pipeline_stages) continue;
      for (const int per_sm : {2, 1}) {
        const std::size_t limit = per_sm == 2 ? attention_two_per_sm_smem(n) : kAttentionMaxSmem;
        int q = qt;
        if (p.query_tile == 0)
          while (q > 1 && smem_for(q, n) > limit) --q;
        if (smem_for(q, n) > limit || (per_sm == 2 && !decode_like)) continue;
        if (per_sm * 16 + n > best) {  // two CTAs per SM first, then the deepest ring
          best = per_sm * 16 + n;
          best_ns = n;
          best_qt = q;
        }
      }
    }
    if (best < 0)
      return unsupported(attn_msg("pipeline_stages", p.pipeline_stages,
                                  "a ring whose stages and region bitmaps fit in " + std::to_string(kAttentionMaxSmem) +
                                      " bytes of shared memory"));
    ns = best_ns;
    qt = best_qt;
  }
  plan->hpg_q = hpg;
  plan->query_tile = qt;
  plan->stages = ns;
  plan->wgmma_tiles = attention_wgmma_head_dim(p.head_dim) && ns == kAttentionWgmmaStages &&
                      attention_row_groups(qt * hpg) == kAttentionTileRows / 16 && p.num_tokens > p.num_requests;
  plan->bitmap_words = static_cast<int>(words);
  plan->smem_bytes = smem_for(qt, ns);
  // tiles of one query: exactly one per token (sum of ceil(q_len / 1)); else at most
  // sum ceil(q_len / qt) <= T / qt + B
  const long long tiles = qt == 1 ? std::max(1, p.num_tokens)
                                  : (static_cast<long long>(p.num_tokens) + qt - 1) / qt + p.num_requests;
  if (tiles > (1ll << 30))
    return invalid_argument(attn_msg("num_tokens", p.num_tokens,
                                     "at most 2^30 query tiles of " + std::to_string(qt) + " tokens (plus one per request)"));
  plan->max_tiles = static_cast<int>(tiles);
  // CTAs of one split: the active (query tile, KV group) pairs
  const long long tq = (static_cast<long long>(p.num_tokens) + qt - 1) / qt;
  const long long ctas =
      std::max<long long>(1, std::min<long long>(tiles, std::max<long long>(p.num_requests, tq))) * p.num_kv_groups;
  int splits = p.num_splits;
  if (splits == 0) {
    // Auto split factor (split-KV over the gathered stages of a tile's union). Per split CTA: a
    // fixed cost (tile metadata — decode: the region list, resolved up front; else bitmaps and
    // union prefix —, Q fragments, epilogue, partial) of about one 64-token stage, then its
    // stages, then the merge: none with one split or with the cluster merge (S <=
    // kAttentionMaxClusterSplits and its buffers fit: every split CTA merges 1/S in parallel
    // through DSMEM); about two stages with the last-arriver merge (S > 16: a fence and counter
    // round trip, then one CTA reads all S partials through L2 — at batch 1 that CTA is the
    // critical path: before the region-list path, forced S at tp 8 batch 1 measured ~2.5 µs per
    // stage and a ~16 µs fixed chain per CTA, bench/RESULTS.md). Stages of a tile:
    // ceil(min(topk + 1, addressable regions) / 8) (decode: one query's selection). Slots: 2 CTAs
    // per SM when the shared memory allows (plan.smem_bytes <= attention_two_per_sm_smem(plan.stages)),
    // else 1. The factor minimises the modelled time
    //   waves(S) * (ceil(stages / S) + 1 + merge(S)),  waves(S) = ceil(CTAs(1) * S / slots),
    // over S = 1 .. min(kAttentionMaxSplits, stages / 2): every split gathers >= 2 stages (never
    // more splits than stages), and a last partial wave is avoided (the factor of the old rule,
    // ceil(4 * SMs / CTAs), gave 2.1 waves at tp 8 batch 32 and 2.4 at tp 1 batch 32). Ties take
    // the smaller S (less merge work). H200 (132 SMs), topk 512 = 65 stages, CTAs(1) = batch x
    // KV groups; step5_preview D 192 decode runs 2 stages, 2 CTAs per SM = 264 slots
    // (`test_layer_plan` pins this table):
    //   tp 1 (4 groups)  batch 1-2: 13 splits (52 / 104 CTAs, 5 stages each, cluster merge), 4: 13,
    //                    8: 8, 16: 4 (256 CTAs), 32: 2, >= 64: 1 (256 / 512 CTAs, no merge);
    //   tp 8 (1 group)   batch 1-8: 13, 16: 13, 32: 8, 64: 4 (256 CTAs), 128: 2.
    // (Before the cluster merge and the region-list path: 22 splits at tp 1 batch 1-2 and tp 8
    // batch 1-8.) dsa_h64_kv8_d128 tp 1 (8 groups, D 128: 3 stages, 2 CTAs per SM = 264 slots):
    // batch 1: 13, 4: 8, 16: 2 (256 CTAs), >= 32: 1.
    const long long slots =
        static_cast<long long>(std::max(1, num_sms)) * (plan->smem_bytes <= attention_two_per_sm_smem(ns) ? 2 : 1);
    const long long tile_regions = std::min<long long>(p.topk + 1, std::max<long long>(1, regions));
    const long long stages = (tile_regions + kAttentionTileTokens / layout::kRegionSize - 1) /
                             (kAttentionTileTokens / layout::kRegionSize);
    const long long s_max = std::min<long long>(kAttentionMaxSplits, std::max<long long>(1, stages / 2));
    long long best_cost = -1;
    splits = 1;
    // (the model assumes the cluster merge whenever it fits, also with split_merge = 1, so that a
    // forced last-arriver merge keeps the split factor: a clean A/B of the two merges)
    for (long long s = 1; s <= s_max; ++s) {
      const long long merge = s == 1 || attention_cluster_merge_pays(p.head_dim, ns, ctas * s, num_sms, s) ? 0 : 2;
      const long long cost = (ctas * s + slots - 1) / slots * ((stages + s - 1) / s + 1 + merge);
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        splits = static_cast<int>(s);
      }
    }
  }
  // the split-KV arrival counters: one per (tile, KV group) in the fixed counter space
  const long long pairs = tiles * p.num_kv_groups;
  if (pairs > kAttentionMaxSplitPairs) {
    if (p.num_splits > 1)
      return invalid_argument(attn_msg("num_splits", p.num_splits,
                                       "1 (or 0) for more than " + std::to_string(kAttentionMaxSplitPairs) +
                                           " (query tile, KV group) pairs; this step has " + std::to_string(pairs)));
    splits = 1;
  }
  auto workspace_for = [&](int s) -> std::size_t {
    return sparse_attention_workspace_layout(tiles, p.num_kv_groups, s, p.head_dim).bytes;
  };
  if (p.num_splits == 0 && p.max_workspace_bytes > 0)
    while (splits > 1 && workspace_for(splits) > p.max_workspace_bytes) --splits;
  if (p.split_merge < 0 || p.split_merge > 1)
    return invalid_argument(attn_msg("split_merge", p.split_merge, "0 (auto) or 1 (last-arriver merge)"));
  if (p.tile_gather < 0 || p.tile_gather > 2)
    return invalid_argument(
        attn_msg("tile_gather", p.tile_gather, "0 (auto), 1 (the union of the tile) or 2 (query by query)"));
  if (!(p.softmax_scale == 0.0f || (std::isfinite(p.softmax_scale) && p.softmax_scale > 0.0f)))
    return invalid_argument("sparse_attention: softmax_scale = " + float_text(p.softmax_scale) +
                            ", expected 0 (D^-0.5) or a finite value > 0");
  plan->num_splits = splits;
  plan->cluster_merge =
      splits > 1 && p.split_merge == 0 && attention_cluster_merge_pays(p.head_dim, ns, ctas * splits, num_sms, splits);
  plan->workspace_bytes = workspace_for(splits);
  return Status::Ok();
}

/// Per-query gathers in a multi-query tile (`tile_gather` 0): a tile of nq > 1 queries with one
/// split either gathers the union of its queries' selected regions once, ceil(U / 8) stages of 64
/// tokens for all nq·hpg_q rows, or runs its queries one after the other, each on its own selection
/// row (the decode path: ceil(n_i / 8) stages for hpg_q rows). A union stage costs
/// kAttentionUnionStageCostNum / kAttentionUnionStageCostDen = 3/2 per-query stages, and each query
/// adds one stage of fixed cost (its region list, ring prologue and epilogue; as the split
/// model's). Per-query gathers pay when
///   2 · (query_stages + nq) < 3 · union_stages,
/// with union_stages = ceil(U / 8) and query_stages = Σ ceil(n_i / 8) (n_i: distinct valid regions
/// of query i). The kernel applies it per tile (the same rule, host-callable for tests).
/// Measured on the H200 (bench/RESULTS.md, twelfth session), the factor swept at 1, 1.25, 1.5, 1.75
/// and 2 with the union-path tiles on wgmma (tenth and eleventh sessions): bench_layer prefill 32K
/// (no history) attention tp 8 7686 µs at 2 → 6703 / 6656 / 6705 / 7160 µs, tp 1 39160 µs at 2 →
/// 40409 / 39779 / 37235 / 38307 µs; 8K and bench_attention prefill_indexer (4K and 16K chunks after
/// 32K) equal or better at 1.5 than at 2 at both tps. (The factor 2 was measured in the fifth session,
/// when union tiles ran on mma.sync.)
/// Known limits of the model (to be measured, not yet done): the factor was measured on full
/// 64-row tiles only, so a partial tile near the break-even may take the slower path; and the
/// per-query path runs ceil(clamp(count) / 8) stages (invalid or repeated entries take ring slots),
/// more than n_i counts when a row carries such entries.
inline constexpr int kAttentionUnionStageCostNum = 3;
inline constexpr int kAttentionUnionStageCostDen = 2;
constexpr bool attention_per_query_pays(long long union_stages, long long query_stages, int nq) {
  return nq > 1 && kAttentionUnionStageCostDen * (query_stages + nq) < kAttentionUnionStageCostNum * union_stages;
}

/// Workspace bytes `sparse_attention` needs for `p` on `p.device` (0 when no split-KV merge is
/// needed). The same params on the same device give the same size; allocate once, zero-fill the
/// first kAttentionCounterBytes once (see `sparse_attention`), reuse.
inline Status sparse_attention_workspace_size(const SparseAttentionParams& p, std::size_t* bytes) {
  if (bytes == nullptr) return invalid_argument("sparse_attention_workspace_size: bytes is null");
  int dev = 0;
  STEP5_RETURN_IF_ERROR(resolve_device(p.device, "sparse_attention_workspace_size: device", &dev));
  int sms = 0;
  STEP5_RETURN_IF_ERROR(device_sm_count(dev, &sms));
  SparseAttentionPlan plan;
  STEP5_RETURN_IF_ERROR(sparse_attention_plan(p, sms, &plan));
  *bytes = plan.workspace_bytes;
  return Status::Ok();
}

/// Launches the sparse attention (+ gate) of geometry row `Id` on `stream` (asynchronous).
/// `p.num_local_heads` / `p.num_kv_groups` / `p.head_dim` must be the local layout of one tp
/// value listed for `Id` in geometries.def. `workspace` holds at least
/// `sparse_attention_workspace_size(p)` bytes (may be null when that is 0). Its first
/// `kAttentionCounterBytes` bytes (split-KV arrival counters) must be zero-filled once before its
/// first use (e.g. cudaMemset after cudaMalloc); every launch leaves them zero, so one allocation
/// serves every later call of any plan ordered after it (same stream, or CUDA-graph replays).
/// Two concurrent calls must not share a workspace. Calls from several host threads (each with its
/// own workspace and stream) may run any plans of one kernel instance at once: the launcher sets one
/// fixed dynamic shared-memory limit per kernel, never a per-plan one (test_attention's competing
/// launches).
/// Errors (nothing launched): kInvalidArgument for every rule of `validate_step` (ops/batch_check.hpp:
/// cu_seqlens_q / seq_lens host mirrors or device arrays null, the device arrays and block_table not 4-byte aligned, mirrors inconsistent, a position >= max_blocks *
/// block_size, topk, a too small workspace), num_kv_groups <= 0, num_local_heads not a positive
/// multiple of it, an override out of range (num_splits,
/// query_tile, pipeline_stages, split_merge, tile_gather), softmax_scale neither 0 nor finite > 0,
/// more than 2^30 query tiles, num_splits > 1 with more than kAttentionMaxSplitPairs (query tile,
/// KV group) pairs, null pointers (when T > 0), bad strides or
/// alignment, out, lse or the workspace bytes of the plan overlapping each other or an input (q,
/// the caches, topk_ids, counts, gate, block_table, cu_seqlens_q, seq_lens; rows [0, T) from the
/// first to the last byte, `require_disjoint`) — except out == q with the same row stride, the
/// supported in-place call (each q element is read only by the CTAs of its token tile and KV
/// group, and written by the last of them); kUnsupported for a layout not listed for `Id` (a
/// head_dim other than the row's, hpg_q outside {4, 8, 16}),
/// a device that is not sm_90, a context too long for the shared-memory bitmaps or caches of more
/// than kAttentionMaxCacheRows rows (num_blocks * block_size * num_kv_groups); kCudaError
/// for a failed launch. T == 0 returns Ok without launching (after the size checks). Defined for every built
/// geometry (step5/instantiate.cuh; kernels/sm90/attention_launch.cuh); run-time selection by the
/// rank's layout goes through `sparse_attention(rank, ...)` (ops/dispatch.hpp).
///
/// Device values: the kernels read the device cu_seqlens_q / seq_lens / block_table / topk_ids.
/// Under CUDA-graph capture the host mirrors' values at capture are validated; a replay uses the
/// device values unchecked by the host. A gathered token whose block-table slot lies outside
/// the request's row or whose block id lies outside [0, num_blocks) is never read (it counts as
/// masked); query positions outside the row contribute no current region. With `bounds_fault`
/// set (checked mode) the first such fault is recorded (`read_bounds_fault`, ops/bounds_fault.hpp).
template <layout::GeometryId Id>
Status sparse_attention(const SparseAttentionParams& p, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream);

/// The run-time entry: `sparse_attention<Id>` of the row of geometries.def whose geometry is
/// `rank.geometry` (ops/dispatch.hpp); kUnsupported for a geometry that is not listed or not built,
/// or when `p.device` (-1: the current device) is not a Hopper its kernels were built for. Same
/// arguments, preconditions and errors as `sparse_attention<Id>`.
Status sparse_attention(const layout::RankLayout& rank, const SparseAttentionParams& p, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace step5::ops
