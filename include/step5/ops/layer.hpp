#pragma once
/// \file step5/ops/layer.hpp
/// One DSA layer on one TP rank on the GPU (SPEC.md §4 steps 1–8 up to the TP all-reduce), the
/// way an engine strings the library's launchers together: fused projection GEMM → q/k/z
/// preparation + paged KV-cache write → region summaries → scores + top-k selection → sparse
/// attention with the head-wise gate → row-parallel o_proj GEMM (bf16 partial). The all-reduce of
/// the partials (NCCL: step5/comm/nccl.hpp) and the residual add (ops/elementwise.hpp) follow.
///
/// Lifecycle (the plan/run split engines use with CUDA graphs):
///  * `dsa_layer_plan(rank, hidden, capacity, &plan[, device, options])` once per capacity, outside
///    any capture: queries the device (SM count), lays out the workspace (`plan.workspace_bytes`),
///    picks the GEMM path (cuBLASLt where it has an algorithm, unless `DsaLayerOptions::
///    gemm_allow_cublaslt` is false) / tile configuration / split-K factor for every planned token
///    count, bounds the attention split-KV space, and sets the GEMM kernels' shared-memory
///    attributes (the attention, score and top-k launchers set their fixed per-kernel limits on
///    each launch: a host call, capture-safe);
///  * `dsa_layer_run(plan, weights, caches, step, x, partial, workspace, bytes, stream)` per step:
///    host-only validation of the step (`validate_step`, no device read, no synchronisation), then
///    the launches, on the plan's device (`plan.facts.device`, made current for the call and
///    restored after it, as the GEMM and attention launchers do; `stream` must belong to it). No
///    device allocation, no re-planning: safe inside `cudaStreamBeginCapture`
///    (the cuBLASLt path builds its descriptors and picks its algorithm on the first run of each
///    token count and workspace size: host work, cached for the process, capture-safe).
///  * `dsa_layer_forward(...)` = plan + run in one call (convenience for one-off calls and tests;
///    it plans on every call, engines keep a plan).
/// The library's kernels are launched with programmatic dependent launch while `ops::pdl_enabled()`
/// (step5/ops/pdl.hpp; a captured graph keeps the programmatic edges; cuBLASLt launches its own
/// kernels as it chooses); results are bit-identical either way.
/// Device pointers throughout; layouts of docs/ARCHITECTURE.md. The workspace (one allocation of
/// `plan.workspace_bytes`) is zero-filled once before its first use (the GEMM split-K counters
/// and the attention split-KV counters live in it; every launch leaves them zero). The sequence
/// of launches depends only on host sizes and on whether the step is a decode step by the host
/// mirror (every request with at most one token: the region summaries then run inside the
/// prepare launch, `indexer_prepare_folds_summaries`); a graph captured on a decode step is
/// replayed with decode steps (ops/indexer.hpp, "CUDA-graph safe"). Errors as Status (the first failing launcher's
/// message). Host code (g++-compilable); links step5::kernels (or one .cu of the engine includes
/// step5/instantiate.cuh).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "step5/core/cuda_check.hpp"
#include "step5/core/status.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/attention.hpp"
#include "step5/ops/gemm.hpp"
#include "step5/ops/indexer.hpp"
#include "step5/ops/pdl.hpp"

namespace step5::ops {

/// The device weights of one rank's layer (SPEC §3, §4; `model::LayerWeights` uploaded).
struct DsaLayerWeights {
  const bf16* fused = nullptr;        ///< [rank.padded_rows, hidden] (shards + sparse_indexer_w + zero rows)
  const bf16* o_proj = nullptr;       ///< [hidden, Hl*D] the rank's o_proj columns
  const float* q_norm = nullptr;      ///< [D] fp32
  const float* k_norm = nullptr;      ///< [D] fp32
  const float* index_q_norm = nullptr;    ///< [P] fp32 (rounded to bf16 in the kernel)
  const float* index_k_norm_w = nullptr;  ///< [P] fp32
  const float* index_k_norm_b = nullptr;  ///< [P] fp32
  const bf16* cos_main = nullptr;     ///< [max_position, rot_main/2]
  const bf16* sin_main = nullptr;
  const bf16* cos_idx = nullptr;      ///< [max_position, rot_idx/2]
  const bf16* sin_idx = nullptr;
  int max_position = 0;
  float eps = 1e-5f;                  ///< rms_norm_eps
};

/// The rank's caches of this layer (SPEC §5).
struct DsaLayerCaches {
  bf16* k_cache = nullptr;               ///< [num_blocks, block_size, KVl, D], 16-byte aligned
  bf16* v_cache = nullptr;               ///< as k_cache
  std::uint8_t* summary_cache = nullptr; ///< [num_blocks, block_size/8, P] e4m3, 16-byte aligned
  bf16* tail = nullptr;                  ///< [num_slots, 8, 2, P], 16-byte aligned
  int num_slots = 0;                     ///< > 0
};

/// One step's batch (SPEC §5): device metadata plus the host-side sizes that shape the launches.
struct DsaLayerStep {
  /// cu_seqlens_q, seq_lens (device), B, T, and the HOST mirrors cu_seqlens_q_host /
  /// seq_lens_host (required when T > 0; validated by `validate_step`, see ops/indexer.hpp for
  /// CUDA-graph replay).
  IndexerBatch batch{};
  /// block_table (device), sizes, and the optional checked-mode record `bounds_fault` (used by
  /// every kernel of the step that indexes a cache through the block table).
  PagedTable table{};
  const std::int32_t* tail_slot = nullptr;  ///< [B] device int32, each in [0, caches.num_slots), 4-byte aligned
  /// Optional host copy of tail_slot: when set, slots outside [0, caches.num_slots) or shared by
  /// two requests with rows are refused before anything is launched (validate_step's rule 5);
  /// without it a device slot out of range is skipped and, in checked mode, reported
  /// (BoundsFault::kTailSlotOutOfRange). The block table's host copy: table.block_table_host (rule 4).
  const std::int32_t* tail_slot_host = nullptr;
  /// Host upper bound of every seq_lens[b] of this step (> 0, <= capacity.max_seq_len): sizes the
  /// score rows; checked against the host mirror of seq_lens.
  int max_seq_len = 0;
  int topk = 0;                             ///< 1..1024 (<= capacity.max_topk)
};

/// Capacity a workspace is sized for. Every step must use the same block_size and at most
/// max_blocks / num_blocks (the attention plan and its split-KV space depend on them).
struct DsaLayerCapacity {
  int max_tokens = 0;    ///< T per step
  int max_requests = 0;  ///< B per step, <= kMaxIndexerRequests
  int max_seq_len = 0;   ///< KV length per request
  int max_topk = 0;      ///< topk
  int block_size = 0, max_blocks = 0, num_blocks = 0;
};

/// Choices of `dsa_layer_plan` beyond the capacity (defaults: the library's measured choices).
struct DsaLayerOptions {
  /// The two GEMMs may take cuBLASLt (GemmParams::allow_cublaslt: kAuto's choice; it measured
  /// faster at nearly every shape); false plans this library's GEMM kernels (A/B benchmarks,
  /// engines that want them). The workspace still reserves cuBLASLt's share either way.
  bool gemm_allow_cublaslt = true;
};

/// Optional hook called after each stage is enqueued (e.g. to record CUDA events per kernel).
struct DsaLayerHook {
  virtual ~DsaLayerHook() = default;
  virtual void after(const char* stage, cudaStream_t stream) = 0;
};

namespace detail {
inline std::size_t align256(std::size_t v) { return (v + 255) / 256 * 256; }

/// Offsets (bytes from the workspace base, each a multiple of 256) and sizes of the buffers inside
/// the layer workspace.
struct LayerWorkspaceMap {
  std::size_t c = 0, q = 0, index_q = 0, weights = 0, index_k = 0, ids = 0, counts = 0, attn = 0, lse = 0;
  std::size_t gemm = 0, gemm_bytes = 0, select = 0, select_bytes = 0, attn_ws = 0, attn_ws_bytes = 0, total = 0;
};

inline SparseAttentionParams attention_sizes(const layout::RankLayout& r, int tokens, int requests, int topk,
                                             int block_size, int max_blocks, int num_blocks) {
  SparseAttentionParams a;
  a.num_tokens = tokens;
  a.num_requests = requests;
  a.num_local_heads = r.local_heads;
  a.num_kv_groups = r.local_kv_groups;
  a.head_dim = r.geometry.head_dim;
  a.topk = topk;
  a.block_size = block_size;
  a.max_blocks = max_blocks;
  a.num_blocks = num_blocks;
  return a;
}

/// The workspace layout for capacity `cap` on a device with `num_sms` SMs, given the GEMM
/// workspace bytes `gemm_bytes` (the larger of the two GEMMs' `gemm_workspace_bytes`: split-K
/// counters and partials, cuBLASLt's workspace). Host-only.
inline Status layer_workspace_map(const layout::RankLayout& r, int hidden, const DsaLayerCapacity& cap, int num_sms,
                                  std::size_t gemm_bytes, LayerWorkspaceMap* m) {
  if (hidden <= 0 || cap.max_tokens <= 0 || cap.max_requests <= 0 || cap.max_seq_len <= 0 || cap.max_topk < 1 ||
      cap.max_topk > layout::kMaxTopk || cap.max_requests > kMaxIndexerRequests || cap.max_seq_len > kMaxIndexerSeqLen)
    return invalid_argument("dsa_layer: capacity hidden = " + std::to_string(hidden) + ", max_tokens = " +
                            std::to_string(cap.max_tokens) + ", max_requests = " + std::to_string(cap.max_requests) +
                            ", max_seq_len = " + std::to_string(cap.max_seq_len) + ", max_topk = " +
                            std::to_string(cap.max_topk) + "; expected positive values, max_topk <= " +
                            std::to_string(layout::kMaxTopk) + ", max_requests <= " +
                            std::to_string(kMaxIndexerRequests) + " (kMaxIndexerRequests) and max_seq_len <= " +
                            std::to_string(kMaxIndexerSeqLen) + " (kMaxIndexerSeqLen)");
  const std::size_t T = static_cast<std::size_t>(cap.max_tokens);
  const std::size_t D = r.geometry.head_dim, P = r.geometry.proxy_dim, Hl = r.local_heads, Il = r.index_local_heads,
                    lg = r.local_kv_groups;
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t o = off;
    off += align256(bytes);
    return o;
  };
  m->c = take(T * r.padded_rows * 2);
  m->q = take(T * Hl * D * 2);
  m->index_q = take(T * Il * P);
  m->weights = take(T * Il * 4);
  m->index_k = take(T * P * 2);
  m->ids = take(lg * T * (cap.max_topk + 1) * 4);
  m->counts = take(lg * T * 4);
  m->attn = take(T * Hl * D * 2);
  m->lse = take(T * Hl * 4);
  m->gemm_bytes = gemm_bytes;
  m->gemm = take(std::max<std::size_t>(m->gemm_bytes, kGemmCounterBytes));
  // Selection: tokens are scored in chunks that fit the workspace (any size works). Large chunks
  // keep prefill scoring on few, wide launches: up to kSelectWorkspaceTarget bytes of scores (a
  // power of two of tokens at power-of-two contexts: 16384 tokens of one group at 32K, so that a
  // 32K-token step is two equal chunks, `select_chunks`), at least 64 tokens per chunk
  // (measured on an H200: 64-token chunks made a 32K-token prefill's selection 170x its floor,
  // most of it per-chunk launches).
  constexpr std::size_t kSelectWorkspaceTarget = std::size_t{256} << 20;
  const std::size_t per_token = detail::select_token_bytes_divisor(r, cap.max_seq_len);
  const std::size_t fit = kSelectWorkspaceTarget / per_token;
  const int chunk = static_cast<int>(std::clamp<std::size_t>(fit, std::min<std::size_t>(64, T), T));
  m->select_bytes = indexer_select_workspace_bytes(r, chunk, cap.max_seq_len, cap.max_requests);
  m->select = take(m->select_bytes);
  // Split-KV merge space: the largest the attention planner asks for a decode-like step (1 or
  // kAttentionDecodeRowsPerRequest rows per request, 1 .. max_requests requests: small batches
  // split most); other steps lower their auto split factor to fit
  // (SparseAttentionParams::max_workspace_bytes).
  m->attn_ws_bytes = 0;
  for (int b = 1; b <= cap.max_requests; ++b)
    for (const int rows : {1, kAttentionDecodeRowsPerRequest}) {
      SparseAttentionPlan ap;
      const SparseAttentionParams a = attention_sizes(r, std::min(cap.max_tokens, rows * b), b, cap.max_topk,
                                                      cap.block_size, cap.max_blocks, cap.num_blocks);
      STEP5_RETURN_IF_ERROR(sparse_attention_plan(a, num_sms, &ap));
      m->attn_ws_bytes = std::max(m->attn_ws_bytes, ap.workspace_bytes);
    }
  m->attn_ws = take(m->attn_ws_bytes);
  m->total = off;
  return Status::Ok();
}

}  // namespace detail

/// Token counts up to which `dsa_layer_plan` fixes each GEMM's path, tile configuration and
/// split-K factor per count (the decode range, where the stream path's choice varies with T);
/// larger steps run the wgmma path fixed by the plan (`DsaLayerPlan::fused_large`).
inline constexpr int kDsaLayerPlannedGemmTokens = 64;

/// What the plan depends on from the device. `dsa_layer_plan` queries it; host code (tests) may
/// build one by hand and call `dsa_layer_plan_for` (empty GEMM tables: the launcher chooses).
struct DsaLayerDeviceFacts {
  int device = -1;                       ///< CUDA device ordinal
  int num_sms = 0;                       ///< streaming multiprocessors (> 0)
  std::size_t gemm_workspace_bytes = 0;  ///< workspace bytes of the larger GEMM (gemm_workspace_bytes: split-K, cuBLASLt)
  /// GEMM choices per token count: index T-1 for T = 1 .. size() (fused projection / o_proj).
  std::vector<GemmPlan> fused_gemm, o_proj_gemm;
  /// GEMM choices for T > size() of the tables (path kAuto = the launcher chooses).
  GemmPlan fused_large{GemmPath::kAuto, 1, 0, 0}, o_proj_large{GemmPath::kAuto, 1, 0, 0};
};

/// One layer's plan for one rank, one hidden size and one capacity: built once by
/// `dsa_layer_plan` (outside capture), read-only afterwards; one plan serves every step within
/// its capacity, any number of streams (each with its own workspace).
struct DsaLayerPlan {
  layout::RankLayout rank{};
  int hidden = 0;
  DsaLayerCapacity capacity{};
  const layout::GeometryEntry* entry = nullptr;  ///< the rank's geometries.def row
  DsaLayerDeviceFacts facts{};
  detail::LayerWorkspaceMap map{};
  std::size_t workspace_bytes = 0;  ///< bytes of the workspace `dsa_layer_run` needs (== map.total)
  DsaLayerOptions options{};        ///< the choices it was planned with (`dsa_layer_run` applies them too)
};

/// Plans with given device facts (host-only, no CUDA call). Errors: hidden or capacity values not
/// positive, max_topk > kMaxTopk, max_requests > kMaxIndexerRequests, max_seq_len >
/// kMaxIndexerSeqLen, num_sms <= 0, gemm_workspace_bytes above 2^63 - 1, facts.device below -1,
/// a RankLayout that is not make_rank_layout's (kInvalidArgument), a geometry not in
/// geometries.def (kUnsupported), and `sparse_attention_plan`'s refusals at the capacity (block_size
/// not a positive multiple of 8 up to kMaxBlockSize, max_blocks or num_blocks <= 0: kInvalidArgument;
/// a block table capacity whose region bitmaps do not fit in shared memory, caches of more than
/// ops::kAttentionMaxCacheRows rows (num_blocks * block_size * local KV groups): kUnsupported).
inline Status dsa_layer_plan_for(const layout::RankLayout& rank, int hidden, const DsaLayerCapacity& cap,
                                 DsaLayerDeviceFacts facts, DsaLayerPlan* plan) {
  if (plan == nullptr) return invalid_argument("dsa_layer_plan: plan is null");
  if (facts.num_sms <= 0)
    return invalid_argument("dsa_layer_plan: num_sms = " + std::to_string(facts.num_sms) + ", expected > 0");
  // the one unbounded share of the workspace map (the others follow from the listed geometry and
  // the capacity's bounds): within 2^63 - 1 bytes, its 256-byte rounding and the map's offsets
  // do not wrap (a wrapped offset laid the selection's buffer over the GEMM's)
  STEP5_RETURN_IF_ERROR(require_elements_fit("dsa_layer_plan", "facts.gemm_workspace_bytes", facts.gemm_workspace_bytes, 1));
  STEP5_RETURN_IF_ERROR(check_device_arg(facts.device, "dsa_layer_plan: facts.device"));
  const layout::GeometryEntry* entry = layout::find_geometry(rank.geometry);
  if (entry == nullptr)
    return unsupported("dsa_layer_plan: the rank's geometry " + layout::describe(rank.geometry) +
                       " is not in geometries.def; supported: " + layout::supported_layouts());
  STEP5_RETURN_IF_ERROR(layout::check_rank_layout(rank, "dsa_layer_plan"));
  DsaLayerPlan p;
  STEP5_RETURN_IF_ERROR(detail::layer_workspace_map(rank, hidden, cap, facts.num_sms, facts.gemm_workspace_bytes, &p.map));
  p.rank = rank;
  p.hidden = hidden;
  p.capacity = cap;
  p.entry = entry;
  p.facts = std::move(facts);
  p.workspace_bytes = p.map.total;
  *plan = std::move(p);
  return Status::Ok();
}

/// Plans one rank's layer for capacity `cap` on `device` (-1 = the current device): the step
/// that engines run once per capacity, outside CUDA-graph capture (it queries the device and sets
/// kernel attributes). Errors: kInvalidArgument for a device below -1, those of
/// `dsa_layer_plan_for`, kUnsupported for a device that is not sm_90, kCudaError for a failed
/// query, and the GEMM planner's errors (e.g. hidden).
/// `options`: DsaLayerOptions (whether the GEMMs may take cuBLASLt).
inline Status dsa_layer_plan(const layout::RankLayout& rank, int hidden, const DsaLayerCapacity& cap,
                             DsaLayerPlan* plan, int device = -1, const DsaLayerOptions& options = {}) {
  if (plan == nullptr) return invalid_argument("dsa_layer_plan: plan is null");
  DsaLayerDeviceFacts f;
  STEP5_RETURN_IF_ERROR(resolve_device(device, "dsa_layer_plan: device", &device));
  STEP5_RETURN_IF_ERROR(require_sm90(device));
  f.device = device;
  STEP5_RETURN_IF_ERROR(device_sm_count(device, &f.num_sms));
  if (hidden > 0 && cap.max_tokens > 0) {
    const std::int64_t k_o = static_cast<std::int64_t>(rank.local_heads) * rank.geometry.head_dim;
    f.gemm_workspace_bytes = std::max(gemm_workspace_bytes(cap.max_tokens, rank.padded_rows, hidden, device),
                                      gemm_workspace_bytes(cap.max_tokens, hidden, k_o, device));
    // The GEMM choices as the launcher makes them for 16-byte aligned operands (workspace
    // buffers, cudaMalloc'ed weights, x and partial; `dsa_layer_run` requires that alignment).
    // gemm_plan reads only the pointers' alignment, never their memory.
    alignas(16) static const bf16 kAligned[8] = {};
    GemmParams g1;
    g1.x = kAligned, g1.w = kAligned, g1.c = const_cast<bf16*>(kAligned), g1.n = rank.padded_rows, g1.k = hidden;
    g1.ldx = hidden, g1.ldw = hidden, g1.ldc = rank.padded_rows, g1.device = device;
    g1.allow_cublaslt = options.gemm_allow_cublaslt;
    GemmParams g2 = g1;
    g2.n = hidden, g2.k = k_o, g2.ldx = k_o, g2.ldw = k_o, g2.ldc = hidden;
    const int planned = std::min(cap.max_tokens, kDsaLayerPlannedGemmTokens);
    f.fused_gemm.resize(static_cast<std::size_t>(planned));
    f.o_proj_gemm.resize(static_cast<std::size_t>(planned));
    for (int t = 1; t <= planned; ++t) {
      g1.tokens = g2.tokens = t;
      STEP5_RETURN_IF_ERROR(gemm_plan(g1, &f.fused_gemm[t - 1]));  // also sets the kernels' smem limits
      STEP5_RETURN_IF_ERROR(gemm_plan(g2, &f.o_proj_gemm[t - 1]));
    }
    if (cap.max_tokens > planned) {
      g1.tokens = g2.tokens = cap.max_tokens;
      STEP5_RETURN_IF_ERROR(gemm_plan(g1, &f.fused_large));
      STEP5_RETURN_IF_ERROR(gemm_plan(g2, &f.o_proj_large));
      f.fused_large.config = f.o_proj_large.config = 0;  // wgmma tile width: the launcher's per-T choice
      f.fused_large.split_k = f.o_proj_large.split_k = 0;
    }
  }
  STEP5_RETURN_IF_ERROR(dsa_layer_plan_for(rank, hidden, cap, std::move(f), plan));
  plan->options = options;
  return Status::Ok();
}

/// Host-only checks of one step against `plan` (run by `dsa_layer_run` before any launch; no
/// device read): the rules of `validate_step` (ops/batch_check.hpp) — the sizes (rule 1, also for a
/// step of no tokens, as every launcher), host mirrors and device batch arrays, cu_seqlens_q,
/// seq_lens >= q_len, positions < max_blocks * block_size and < max_position, seq_lens <=
/// step.max_seq_len, topk, and with table.block_table_host rule 4 (written blocks) — then the
/// step's sizes against the plan's capacity (the message names the step's and the capacity's
/// numbers).
inline Status dsa_layer_check_step(const DsaLayerPlan& plan, const DsaLayerStep& step, int max_position) {
  const DsaLayerCapacity& cap = plan.capacity;
  if (plan.entry == nullptr) return invalid_argument("dsa_layer_run: the plan is empty (call dsa_layer_plan first)");
  StepCheck check = step_check("dsa_layer_run", step.batch, step.table);
  check.topk = step.topk;
  check.max_seq_len = step.max_seq_len;
  check.max_position = max_position;
  STEP5_RETURN_IF_ERROR(validate_step(check));  // a step of no tokens too: rule 1, as every launcher
  if (step.batch.num_tokens == 0) return Status::Ok();
  if (step.table.block_size != cap.block_size || step.table.max_blocks > cap.max_blocks ||
      step.table.num_blocks > cap.num_blocks)
    return invalid_argument("dsa_layer_run: step block table (block_size " + std::to_string(step.table.block_size) +
                            ", max_blocks " + std::to_string(step.table.max_blocks) + ", num_blocks " +
                            std::to_string(step.table.num_blocks) + ") differs from the capacity (" +
                            std::to_string(cap.block_size) + ", " + std::to_string(cap.max_blocks) + ", " +
                            std::to_string(cap.num_blocks) + ")");
  if (step.batch.num_tokens > cap.max_tokens || step.batch.num_requests > cap.max_requests ||
      step.max_seq_len > cap.max_seq_len || step.topk > cap.max_topk)
    return invalid_argument("dsa_layer_run: step (T = " + std::to_string(step.batch.num_tokens) + ", B = " +
                            std::to_string(step.batch.num_requests) + ", max_seq_len = " +
                            std::to_string(step.max_seq_len) + ", topk = " + std::to_string(step.topk) +
                            ") exceeds the workspace capacity (" + std::to_string(cap.max_tokens) + ", " +
                            std::to_string(cap.max_requests) + ", " + std::to_string(cap.max_seq_len) + ", " +
                            std::to_string(cap.max_topk) + ")");
  return Status::Ok();
}

/// Bytes of the workspace of `dsa_layer_run` for `rank` at `hidden` and capacity `cap` on the
/// current device (plans, then returns `plan.workspace_bytes`).
inline Status dsa_layer_workspace_bytes(const layout::RankLayout& rank, int hidden, const DsaLayerCapacity& cap,
                                        std::size_t* bytes) {
  if (bytes == nullptr) return invalid_argument("dsa_layer_workspace_bytes: bytes is null");
  DsaLayerPlan plan;
  STEP5_RETURN_IF_ERROR(dsa_layer_plan(rank, hidden, cap, &plan));
  *bytes = plan.workspace_bytes;
  return Status::Ok();
}

namespace detail {
/// The GEMM choice of `plan` for `tokens` (forced into `g`; kAuto leaves it to the launcher). A
/// planned kCublasLt is left to the launcher too (kAuto, allow_cublaslt): the run's operands and
/// workspace make a cuBLASLt key of their own, and where cuBLASLt had no algorithm for it kAuto
/// falls back to this library's kernels instead of failing.
inline void apply_gemm_choice(const std::vector<GemmPlan>& table, const GemmPlan& large, int tokens, GemmParams* g) {
  const bool per_t = tokens <= static_cast<int>(table.size());
  const GemmPlan& c = per_t ? table[static_cast<std::size_t>(tokens - 1)] : large;
  if (c.path == GemmPath::kAuto || c.path == GemmPath::kCublasLt) return;
  g->path = c.path;
  g->config = c.config;
  // A per-T plan fixes the K splits of either split path; for larger T the wgmma splits stay the
  // launcher's per-T choice (within gemm_workspace_bytes).
  g->split_k = per_t || c.path == GemmPath::kSplitK ? c.split_k : 0;
}
}  // namespace detail

/// Enqueues SPEC §4 steps 1–8 of one rank for `x [T, hidden]` bf16 (row stride hidden) and writes
/// the rank's bf16 o_proj partial `[T, hidden]` (before the TP all-reduce), with the choices of
/// `plan` (no allocation, no host synchronisation, no re-planning: capturable in a CUDA graph).
/// `workspace` holds `plan.workspace_bytes` bytes, zero-filled once before first use, 16-byte
/// aligned (256 lets the GEMMs' cuBLASLt plans use their share); x, partial and the weights are
/// 16-byte aligned (cudaMalloc). Errors: `dsa_layer_check_step` (step vs
/// capacity, validate_step with w.max_position; a step of no tokens still needs valid sizes and
/// topk, as every launcher), STEP5_TOPK (`topk_env_status`), STEP5_PDL (`pdl_env_status`), a too
/// small or misaligned workspace, every stage's pointers (x, partial, w.fused, w.o_proj 16-byte aligned; the caches
/// as DsaLayerCaches says; step.tail_slot non-null, 4-byte aligned), w.eps negative or not finite
/// (`check_norm_eps`) and, with step.tail_slot_host, validate_step's rule 5
/// (all before the first launch), the workspace's plan.workspace_bytes, partial, the caches
/// overlapping each other, the weights w.fused / w.o_proj or the step's device arrays, and the
/// workspace overlapping x (`require_disjoint`; partial over x is allowed: x is read by the first
/// GEMM only), and every launcher's own checks (kInvalidArgument/kUnsupported). Device values and the checked mode: ops/indexer.hpp.
inline Status dsa_layer_run(const DsaLayerPlan& plan, const DsaLayerWeights& w, const DsaLayerCaches& caches,
                            const DsaLayerStep& step, const bf16* x, bf16* partial, void* workspace,
                            std::size_t workspace_bytes, cudaStream_t stream, DsaLayerHook* hook = nullptr) {
  STEP5_RETURN_IF_ERROR(dsa_layer_check_step(plan, step, w.max_position));
  STEP5_RETURN_IF_ERROR(topk_env_status());  // STEP5_TOPK: refused before anything is launched
  // STEP5_PDL, as STEP5_TOPK: refused whatever the step (gemm_bf16 refuses it too, but a step of
  // no tokens returns below before any launcher, and the pointer checks would name a pointer first)
  STEP5_RETURN_IF_ERROR(pdl_env_status());
  const int T = step.batch.num_tokens;
  if (T == 0) return Status::Ok();
  const detail::LayerWorkspaceMap& m = plan.map;
  if (workspace == nullptr || workspace_bytes < m.total)
    return invalid_argument("dsa_layer_run: workspace of " + std::to_string(workspace_bytes) + " bytes, expected >= " +
                            std::to_string(m.total));
  // The pointers of every stage, before the first launch: indexer_prepare writes the KV cache
  // (and, for prefill, the tail) before the later stages check their own arguments, so a refusal
  // there would leave the step half applied (a retried step then rebuilds a region from
  // overwritten tail rows). The rules are the launchers' own (indexer_summaries: summary_cache,
  // tail, tail_slot (4-byte aligned), num_slots; indexer_select: summary_cache 16-byte aligned; sparse_attention:
  // k_cache, v_cache 16-byte aligned; the GEMMs: x, fused, o_proj, partial, 16-byte aligned as
  // this function's contract says, which the planned fast GEMM paths need; the workspace, whose
  // buffers lie at 256-byte multiples from it and take 16-byte vectors: index_q, the selection's
  // scores, the attention's split partials); the launchers check them again.
  STEP5_RETURN_IF_ERROR(require_non_null(
      "dsa_layer_run", {{"x", x}, {"partial", partial}, {"w.fused", w.fused}, {"w.o_proj", w.o_proj},
                        {"caches.k_cache", caches.k_cache}, {"caches.v_cache", caches.v_cache},
                        {"caches.summary_cache", caches.summary_cache}, {"caches.tail", caches.tail},
                        {"step.tail_slot", step.tail_slot}}));
  STEP5_RETURN_IF_ERROR(require_aligned("dsa_layer_run", 16,
                                        {{"workspace", workspace}, {"x", x}, {"partial", partial},
                                         {"w.fused", w.fused}, {"w.o_proj", w.o_proj},
                                         {"caches.k_cache", caches.k_cache}, {"caches.v_cache", caches.v_cache},
                                         {"caches.summary_cache", caches.summary_cache}, {"caches.tail", caches.tail}}));
  STEP5_RETURN_IF_ERROR(require_aligned("dsa_layer_run", alignof(std::int32_t), {{"step.tail_slot", step.tail_slot}}));
  if (caches.num_slots <= 0)
    return invalid_argument("dsa_layer_run: caches.num_slots = " + std::to_string(caches.num_slots) + ", expected > 0");
  STEP5_RETURN_IF_ERROR(check_norm_eps(w.eps, "dsa_layer_run: w.eps"));  // indexer_prepare's rule
  if (step.tail_slot_host != nullptr) {  // rule 5 needs num_slots, which dsa_layer_check_step does not see
    // rules 1-2 and 4 ran in dsa_layer_check_step: only rule 5 here
    StepCheck tails = step_check("dsa_layer_run", step.batch, step.table);
    tails.block_table_host = nullptr;
    tails.tail_slot_host = step.tail_slot_host, tails.num_slots = caches.num_slots;
    STEP5_RETURN_IF_ERROR(detail::check_cross_request(tails));
  }
  {
    // The buffers the step writes (the workspace's map, the partial, the caches) must not overlap
    // each other or what the stages read (the weights, the step's arrays): the launchers refuse
    // such overlaps themselves, but o_proj's (partial over the attention output in the workspace)
    // or the attention's would only do so after indexer_prepare wrote the caches. x is read by the
    // first GEMM only: the workspace must not overlap it; the partial may (x is read before it is
    // written, in stream order).
    using U = std::uint64_t;
    const int P = plan.rank.geometry.proxy_dim;
    const U cache = kv_cache_bytes(step.table.num_blocks, step.table.block_size, plan.rank.local_kv_heads,
                                   plan.rank.geometry.head_dim);
    const std::int64_t B = step.batch.num_requests;
    const auto arrays = step_array_ranges(step.batch.cu_seqlens_q, step.batch.seq_lens, step.table.block_table, B,
                                          step.table.max_blocks,
                                          {"step.batch.cu_seqlens_q", "step.batch.seq_lens", "step.table.block_table"});
    const NamedRange ws{"workspace", workspace, m.total};
    STEP5_RETURN_IF_ERROR(require_disjoint(
        "dsa_layer_run",
        {ws, {"partial", partial, static_cast<U>(T) * static_cast<U>(plan.hidden) * 2},
         {"caches.k_cache", caches.k_cache, cache}, {"caches.v_cache", caches.v_cache, cache},
         {"caches.summary_cache", caches.summary_cache, detail::summary_cache_bytes(step.table, P)},
         {"caches.tail", caches.tail, detail::tail_bytes(caches.num_slots, P)}},
        {{"w.fused", w.fused, static_cast<U>(plan.rank.padded_rows) * static_cast<U>(plan.hidden) * 2},
         {"w.o_proj", w.o_proj,
          static_cast<U>(plan.hidden) * static_cast<U>(plan.rank.local_heads) * static_cast<U>(plan.rank.geometry.head_dim) * 2},
         {"step.tail_slot", step.tail_slot, detail::int32s(B)},
         arrays[0],
         arrays[1],
         arrays[2]}));
    STEP5_RETURN_IF_ERROR(
        require_disjoint("dsa_layer_run", {ws}, {{"x", x, static_cast<U>(T) * static_cast<U>(plan.hidden) * 2}}));
  }
  // the launchers below check the step again; the host copies' rules 4 and 5 ran once above
  PagedTable table = step.table;
  table.block_table_host = nullptr;
  const layout::RankLayout& rank = plan.rank;
  const int hidden = plan.hidden;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* c = reinterpret_cast<bf16*>(base + m.c);
  auto* q = reinterpret_cast<bf16*>(base + m.q);
  auto* index_q = reinterpret_cast<std::uint8_t*>(base + m.index_q);
  auto* weights = reinterpret_cast<float*>(base + m.weights);
  auto* index_k = reinterpret_cast<bf16*>(base + m.index_k);
  auto* ids = reinterpret_cast<std::int32_t*>(base + m.ids);
  auto* counts = reinterpret_cast<std::int32_t*>(base + m.counts);
  auto* attn = reinterpret_cast<bf16*>(base + m.attn);
  auto* lse = reinterpret_cast<float*>(base + m.lse);
  const std::int64_t ldc = rank.padded_rows;
  const int D = rank.geometry.head_dim, Hl = rank.local_heads;
  auto mark = [&](const char* s) {
    if (hook) hook->after(s, stream);
  };

  // Every launch on the plan's device: the indexer launchers launch on the current one (the GEMM
  // and attention launchers switch to their `device` themselves).
  const DeviceScope on_device(plan.facts.device, "dsa_layer_run: plan.facts.device");
  STEP5_RETURN_IF_ERROR(on_device.status);

  // 1. Fused projection (SPEC §3 "Forward"), sparse_indexer_w rows included.
  GemmParams g1;
  g1.x = x, g1.w = w.fused, g1.c = c, g1.tokens = T, g1.n = rank.padded_rows, g1.k = hidden;
  g1.ldx = hidden, g1.ldw = hidden, g1.ldc = ldc, g1.workspace = base + m.gemm, g1.workspace_bytes = m.gemm_bytes;
  g1.device = plan.facts.device;
  g1.allow_cublaslt = plan.options.gemm_allow_cublaslt;  // also where a table leaves the path to kAuto
  detail::apply_gemm_choice(plan.facts.fused_gemm, plan.facts.fused_large, T, &g1);
  STEP5_RETURN_IF_ERROR(gemm_bf16(g1, stream));
  mark("fused_gemm");

  // 2–3. Preparation + KV-cache write.
  IndexerPrepareParams pp;
  pp.rank = rank, pp.eps = w.eps, pp.batch = step.batch, pp.table = table, pp.c = c, pp.ldc = ldc;
  pp.q_norm = w.q_norm, pp.k_norm = w.k_norm, pp.index_q_norm = w.index_q_norm;
  pp.index_k_norm_w = w.index_k_norm_w, pp.index_k_norm_b = w.index_k_norm_b;
  pp.cos_main = w.cos_main, pp.sin_main = w.sin_main, pp.cos_idx = w.cos_idx, pp.sin_idx = w.sin_idx;
  pp.max_position = w.max_position;
  pp.q_out = q, pp.k_cache = caches.k_cache, pp.v_cache = caches.v_cache, pp.index_q = index_q;
  pp.weights = weights, pp.index_k = index_k;
  // 4. Region summaries (before scoring): in the prepare launch for a decode step (one launch
  // fewer; the "summaries" stage is then empty), else their own launch.
  const IndexerSummaryOutputs summaries{caches.summary_cache, caches.tail, step.tail_slot, caches.num_slots};
  const bool fold = indexer_prepare_folds_summaries(step.batch, plan.facts.num_sms);
  if (fold) pp.summaries = summaries;
  STEP5_RETURN_IF_ERROR(indexer_prepare(pp, stream));
  mark("prepare");
  if (!fold) STEP5_RETURN_IF_ERROR(indexer_summaries(indexer_summary_params(pp, summaries), stream));
  mark("summaries");

  // 5–6. Scores + selection.
  IndexerSelectParams sel;
  sel.rank = rank, sel.batch = step.batch, sel.table = table, sel.index_q = index_q, sel.weights = weights;
  sel.summary_cache = caches.summary_cache, sel.topk = step.topk, sel.max_seq_len = step.max_seq_len;
  sel.topk_ids = ids, sel.counts = counts, sel.workspace = base + m.select, sel.workspace_bytes = m.select_bytes;
  STEP5_RETURN_IF_ERROR(indexer_select(sel, stream));
  mark("select");

  // 7–8. Sparse attention + gate (split-KV reduced until its merge space fits the workspace).
  SparseAttentionParams a = detail::attention_sizes(rank, T, step.batch.num_requests, step.topk, step.table.block_size,
                                                    step.table.max_blocks, step.table.num_blocks);
  a.q = q, a.k_cache = caches.k_cache, a.v_cache = caches.v_cache, a.block_table = step.table.block_table;
  a.cu_seqlens_q = step.batch.cu_seqlens_q, a.seq_lens = step.batch.seq_lens, a.topk_ids = ids, a.counts = counts;
  a.cu_seqlens_q_host = step.batch.cu_seqlens_q_host, a.seq_lens_host = step.batch.seq_lens_host;
  a.bounds_fault = step.table.bounds_fault;
  if (rank.local_gate > 0) {
    a.gate = c + rank.shard(layout::Shard::kIndexG).dst_row;
    a.gate_row_stride = ldc;
  }
  a.out = attn, a.lse = lse;
  a.device = plan.facts.device;
  a.max_workspace_bytes = m.attn_ws_bytes;  // the planner lowers the auto split factor to fit
  if (m.attn_ws_bytes == 0) a.num_splits = 1;  // no split-KV space (max_workspace_bytes 0 = no limit)
  STEP5_RETURN_IF_ERROR(sparse_attention(rank, a, base + m.attn_ws, m.attn_ws_bytes, stream));
  mark("attention");

  // 8. Row-parallel o_proj: partial [T, hidden] = gated [T, Hl*D] @ o_proj_local[hidden, Hl*D]^T.
  GemmParams g2;
  g2.x = attn, g2.w = w.o_proj, g2.c = partial, g2.tokens = T, g2.n = hidden, g2.k = static_cast<std::int64_t>(Hl) * D;
  g2.ldx = g2.k, g2.ldw = g2.k, g2.ldc = hidden, g2.workspace = base + m.gemm, g2.workspace_bytes = m.gemm_bytes;
  g2.device = plan.facts.device;
  g2.allow_cublaslt = plan.options.gemm_allow_cublaslt;
  detail::apply_gemm_choice(plan.facts.o_proj_gemm, plan.facts.o_proj_large, T, &g2);
  STEP5_RETURN_IF_ERROR(gemm_bf16(g2, stream));
  mark("o_proj_gemm");
  return Status::Ok();
}

/// Convenience for one-off calls and tests: `dsa_layer_plan(rank, hidden, cap)` then
/// `dsa_layer_run` (plans on every call — engines plan once and call `dsa_layer_run`; do not
/// capture this one in a graph: planning queries the device). `workspace` holds
/// `dsa_layer_workspace_bytes(rank, hidden, cap)` bytes; `options` as for `dsa_layer_plan`.
/// Errors: those of both.
inline Status dsa_layer_forward(const layout::RankLayout& rank, int hidden, const DsaLayerWeights& w,
                                const DsaLayerCaches& caches, const DsaLayerStep& step, const bf16* x, bf16* partial,
                                void* workspace, std::size_t workspace_bytes, const DsaLayerCapacity& cap,
                                cudaStream_t stream, DsaLayerHook* hook = nullptr,
                                const DsaLayerOptions& options = {}) {
  DsaLayerPlan plan;
  STEP5_RETURN_IF_ERROR(dsa_layer_plan(rank, hidden, cap, &plan, -1, options));
  return dsa_layer_run(plan, w, caches, step, x, partial, workspace, workspace_bytes, stream, hook);
}

}  // namespace step5::ops
