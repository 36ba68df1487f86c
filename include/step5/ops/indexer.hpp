#pragma once
/// \file step5/ops/indexer.hpp
/// Host launchers of the sparse indexer (SPEC.md §4 steps 2–6, caches of SPEC §5), one TP rank:
///
///  1. `indexer_prepare`   — reads the fused GEMM output `C` once: main q/k zero-centred RMSNorm +
///     partial NeoX RoPE (q → `q_out`, k and v → paged KV cache), indexer q RMSNorm + RoPE → e4m3,
///     indexer k LayerNorm + RoPE → `index_k`, score weights × hpg_i^-0.5 (SPEC §4.2–4.3). One launch.
///  2. `indexer_summaries` — region summaries of the regions completed by this step (tail rows +
///     new rows) into the paged e4m3 summary cache; leftover rows go to the tail buffer (SPEC §4.4).
///     `indexer_prepare` can do this step too (`IndexerPrepareParams::summaries`): inside its own
///     launch for a decode step (`indexer_prepare_folds_summaries`), the same bits.
///  3. `indexer_select`    — scores (tensor cores; the e4m3 operands are exact in fp16, SPEC §4.5) +
///     deterministic top-k selection (SPEC §4.6) for every (token, local group); prefill chunks and
///     decode rows in one batch.
///  `topk_select` is step 6 alone on given fp32 scores (tests, benchmarks, other score producers).
///
/// Data layouts: docs/ARCHITECTURE.md "Shared data conventions". All pointers are device pointers;
/// bf16 is `step5::bf16` (bit pattern, layout-compatible with __nv_bfloat16); e4m3 data are uint8 bit
/// patterns. Launchers check every host-visible precondition first with the one shared
/// `ops::validate_step` (ops/batch_check.hpp; the CPU reference calls the same function) and
/// return a Status naming the offending value (nothing is launched then); they never allocate,
/// never synchronise, and are CUDA-graph safe: the number and shape of launches depend only on
/// host-side sizes, and for `indexer_prepare` with step 4 (`IndexerPrepareParams::summaries`) on
/// whether the host mirror shows a decode step (`indexer_prepare_folds_summaries`), so a graph
/// captured on a decode step must be replayed with one token per request (a request with more is
/// then left without its summary and tail row, reported in checked mode: kFoldedStepNotDecode).
///
/// Host mirrors and device values. The per-request metadata are validated on their HOST mirrors
/// (`IndexerBatch::cu_seqlens_q_host` / `seq_lens_host`, required whenever num_tokens > 0: a null
/// mirror is kInvalidArgument naming the field); the kernels read the DEVICE copies, which must
/// hold the same values. Under CUDA-graph capture the mirrors' values at capture are validated;
/// a replay uses whatever the device arrays then hold, unchecked by the host. Block ids live only
/// on the device. For both, the kernels never access memory outside the caches: a block-table
/// slot outside the request's row (position >= max_blocks * block_size, or < 0) or a block id
/// outside [0, num_blocks) skips that cache access (indexer_prepare: no KV write for the token;
/// indexer_summaries: the region's summary is not written; indexer_select: the region is scored
/// from block 0's summary instead, keeping the score loop free of bounds tests), and a position
/// outside [0, max_position) skips the token in indexer_prepare. The results of such a step are then meaningless; with
/// `PagedTable::bounds_fault` set (checked mode) the first fault is recorded on the device and
/// `ops::read_bounds_fault` (ops/bounds_fault.hpp) turns it into kInvalidArgument naming the
/// request, position and bound. The tail slots are bounds-checked likewise (an out-of-range slot
/// is neither read nor written).
///
/// Geometry: the launchers (kernels/sm90/indexer_launch.cuh) are instantiated per geometry row
/// by step5/instantiate.cuh (library step5::kernels, or one .cu of the engine); the run-time
/// launchers reach them through the one switch of ops/dispatch.hpp on `rank.geometry` and return
/// kUnsupported for a geometry that is not listed or not built. Declarations (g++-compilable).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "step5/core/cuda_check.hpp"
#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/ops/batch_check.hpp"

namespace step5::ops {

/// How the top-k selection (SPEC §4.6; kernels/sm90/indexer_topk.cuh) finds the k-th key — both
/// give bit-identical output: kRadix, the 4-pass 8-bit radix select over every key; kCandidates,
/// candidate compaction; kDefault, the environment variable STEP5_TOPK ("radix" or "candidates";
/// unset or empty: the built-in choice per variant and row length, kernels::sm90::topk_default_algo).
enum class TopkAlgo : int { kDefault = 0, kRadix = 1, kCandidates = 2 };

/// The algorithm STEP5_TOPK = `env` names: unset or "" → kDefault, "radix", "candidates";
/// anything else → kInvalidArgument naming the value.
inline Status topk_algo_from_env(const char* env, TopkAlgo* algo) {
  const std::string v = env != nullptr ? env : "";
  if (v.empty()) *algo = TopkAlgo::kDefault;
  else if (v == "radix") *algo = TopkAlgo::kRadix;
  else if (v == "candidates") *algo = TopkAlgo::kCandidates;
  else return invalid_argument("STEP5_TOPK = '" + v + "', expected radix, candidates or unset");
  return Status::Ok();
}
/// Ok when STEP5_TOPK is unset, empty, "radix" or "candidates"; else kInvalidArgument naming it.
/// indexer_select and dsa_layer_run check it before they launch anything.
inline Status topk_env_status() {
  TopkAlgo a = TopkAlgo::kDefault;
  return topk_algo_from_env(std::getenv("STEP5_TOPK"), &a);
}

/// CTA size of the selection launches that `topk_launch_uses_pdl` may keep off PDL: the 512-thread
/// CTAs of long rows (kernels::sm90::kTopkThreads, which static_asserts the match).
inline constexpr int kTopkNoPdlCtaThreads = 512;

/// Whether a selection launch of `rows` rows, `ctas_per_row` CTAs of `cta_threads` threads each
/// (1, or a cluster), is launched with programmatic dependent launch (when PDL is on at all,
/// ops/pdl.hpp): every launch but one kTopkNoPdlCtaThreads-thread CTA per row on at most `num_sms`
/// rows, the shape that was measured (those few latency-bound CTAs then start once the score
/// kernel has finished, instead of while its CTAs still hold the SMs). Measured on the H200,
/// step5_preview at 128K, same-binary A/B, two runs each (bench/RESULTS.md, sixteenth session),
/// at the two layer shapes it changes (64 rows of 16384 regions, one 512-thread CTA each), µs:
///   - tp 8 batch 64: graph replay 194.9 / 194.0 -> 189.4 / 189.5, eager 207.2 / 206.3 -> 203.1 / 203.5;
///   - tp 1 batch 16: graph replay 199.7 / 199.4 -> 197.4 / 196.9, eager 210.4 / 210.1 -> 211.3 / 211.9;
///   - bench_indexer's isolated indexer_decode (back-to-back launches, no layer around them) gets
///     slower: 100.2 / 100.4 -> 101.6 / 101.5 (tp 8 batch 64), 42.8 / 42.7 -> 44.4 / 44.5 (tp 1 batch 16).
/// Engines replay decode steps from CUDA graphs, where both shapes gain. Kept on PDL: 256 rows (tp
/// 1 batch 64, within +-1.3 µs either way), clusters (tp 1 batch 1 was 1.2 µs faster with PDL;
/// tp 8 batch 1 within 0.4 µs), and the 128- and 256-thread CTAs of shorter rows (not measured
/// without PDL). Why PDL costs on this launch in the layer (e.g. where its early CTAs are placed)
/// was not profiled.
inline bool topk_launch_uses_pdl(int ctas_per_row, int cta_threads, long long rows, int num_sms) {
  return ctas_per_row > 1 || cta_threads != kTopkNoPdlCtaThreads || rows > num_sms;
}

/// Packed batch of one step (SPEC §5): token i of request b sits at position
/// `seq_lens[b] - q_len_b + i`, q_len_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] (0 allowed).
/// Validated by `validate_step` (ops/batch_check.hpp) on the host mirrors.
struct IndexerBatch {
  const std::int32_t* cu_seqlens_q = nullptr;  ///< device [num_requests + 1] int32, cu[0] = 0, non-decreasing
  const std::int32_t* seq_lens = nullptr;      ///< device [num_requests] int32, KV length after this step
  int num_requests = 0;                        ///< B
  int num_tokens = 0;                          ///< T = cu_seqlens_q[B] (host copy; sizes the grids)
  /// HOST mirror of cu_seqlens_q [B+1] (same values; vLLM's query_start_loc_cpu). Required when T > 0.
  const std::int32_t* cu_seqlens_q_host = nullptr;
  /// HOST mirror of seq_lens [B] (same values; vLLM's seq_lens_cpu). Required when T > 0.
  const std::int32_t* seq_lens_host = nullptr;
};

/// The block table shared by the paged KV cache and the summary cache (SPEC §5).
struct PagedTable {
  const std::int32_t* block_table = nullptr;  ///< [num_requests, max_blocks] int32
  int max_blocks = 0;                         ///< row stride of block_table
  int block_size = 0;                         ///< tokens per block, a positive multiple of 8
  int num_blocks = 0;                         ///< blocks in the caches
  /// Checked mode: device record of kBoundsFaultWords int32 (zero-filled before the step) where the
  /// kernels record the first block-table fault (ops/batch_check.hpp, ops/bounds_fault.hpp);
  /// nullptr = faults are skipped silently.
  std::int32_t* bounds_fault = nullptr;
  /// Optional host copy of block_table [num_requests, max_blocks]: when set, every launcher refuses
  /// a step that writes a block which is another live entry of the table (another request's block
  /// or a second entry of the same row; a same-index prefix reader of what the step writes is
  /// allowed: validate_step's rule 4), before anything is launched. Costs a sort of the written
  /// entries and a lookup per live entry per call (dsa_layer_run: once per layer call); null: not
  /// checked (the kernels cannot see it).
  const std::int32_t* block_table_host = nullptr;
};

/// The `validate_step` arguments of a step's batch and block table (host mirrors included);
/// launchers add their own limits (topk, max_seq_len, max_position, workspace, row widths).
inline StepCheck step_check(const char* op, const IndexerBatch& b, const PagedTable& t) {
  StepCheck c;
  c.op = op;
  c.num_requests = b.num_requests;
  c.num_tokens = b.num_tokens;
  c.cu_seqlens_q = b.cu_seqlens_q_host;
  c.seq_lens = b.seq_lens_host;
  c.cu_seqlens_q_name = "batch.cu_seqlens_q_host";
  c.seq_lens_name = "batch.seq_lens_host";
  c.device_arrays = true;
  c.cu_seqlens_q_device = b.cu_seqlens_q, c.seq_lens_device = b.seq_lens;
  c.cu_seqlens_q_device_name = "batch.cu_seqlens_q", c.seq_lens_device_name = "batch.seq_lens";
  c.block_table = t.block_table;
  c.block_table_name = "table.block_table";
  c.block_table_host = t.block_table_host;
  c.block_size = t.block_size;
  c.max_blocks = t.max_blocks;
  c.num_blocks = t.num_blocks;
  return c;
}

/// The step-4 outputs (SPEC §4.4, tail buffer of SPEC §5) that `indexer_prepare` also writes when
/// asked to (`IndexerPrepareParams::summaries`); the fields of `IndexerSummaryParams` of that name.
struct IndexerSummaryOutputs {
  std::uint8_t* summary_cache = nullptr;    ///< [num_blocks, block_size/8, P] e4m3 bits, 2-byte aligned
  bf16* tail = nullptr;                     ///< [num_slots, 8, 2, P] bf16 (index_k, index_z), 16-byte aligned
  const std::int32_t* tail_slot = nullptr;  ///< [num_requests] int32 slot of each request, 4-byte aligned
  int num_slots = 0;
  /// Optional host copy of tail_slot: when set, a request with rows whose slot lies outside
  /// [0, num_slots) or is another's is refused before anything is launched (validate_step's rule
  /// 5). On the device an out-of-range slot is skipped: its tail rows are not written, no region
  /// that needs its pending rows is summarised, and checked mode reports
  /// BoundsFault::kTailSlotOutOfRange (PagedTable::bounds_fault).
  const std::int32_t* tail_slot_host = nullptr;
};

/// Arguments of `indexer_prepare` (SPEC §4.2–4.3, and §4.4 when `summaries` is set).
struct IndexerPrepareParams {
  layout::RankLayout rank{};  ///< this rank's layout (columns of C from rank.shards / rank.indexer_w)
  float eps = 1e-5f;          ///< rms_norm_eps (all three norms)
  IndexerBatch batch{};
  PagedTable table{};
  const bf16* c = nullptr;    ///< fused GEMM output [T, ldc] bf16 (sparse_indexer_w columns included), 4-byte aligned
  std::int64_t ldc = 0;       ///< >= rank.rows_with_w, even
  /// The norm weights 4-byte, the RoPE tables 2-byte aligned (the kernel's element loads).
  const float* q_norm = nullptr;        ///< [D] fp32 (`q_norm`, used as 1 + w)
  const float* k_norm = nullptr;        ///< [D] fp32 (`k_norm`)
  const float* index_q_norm = nullptr;  ///< [P] fp32 checkpoint value (rounded to bf16 in the kernel)
  const float* index_k_norm_w = nullptr;///< [P] fp32 LayerNorm weight (rounded to bf16)
  const float* index_k_norm_b = nullptr;///< [P] fp32 LayerNorm bias (rounded to bf16)
  const bf16* cos_main = nullptr;       ///< [max_position, rot_main/2] bf16
  const bf16* sin_main = nullptr;
  const bf16* cos_idx = nullptr;        ///< [max_position, rot_idx/2] bf16
  const bf16* sin_idx = nullptr;
  int max_position = 0;
  // outputs
  bf16* q_out = nullptr;          ///< [T, Hl, D] bf16 contiguous, 4-byte aligned (as k_cache, v_cache, index_k, weights)
  bf16* k_cache = nullptr;        ///< [num_blocks, block_size, KVl, D] bf16
  bf16* v_cache = nullptr;        ///< [num_blocks, block_size, KVl, D] bf16
  std::uint8_t* index_q = nullptr;///< [T, Il, P] e4m3 bits, 2-byte aligned
  float* weights = nullptr;       ///< [T, Il] fp32 = float(w) * hpg_i^-0.5
  bf16* index_k = nullptr;        ///< [T, P] bf16 (indexer k after LayerNorm + RoPE; read by summaries)
  /// Optional step 4 in the same call (any field of `summaries` set; then all are required, with
  /// the rules of `indexer_summaries`): the region summaries and tail rows `indexer_summaries`
  /// would write, bit for bit (it must then not run for the step).
  /// A decode step (`indexer_prepare_folds_summaries`) does it inside the prepare launch: the warp
  /// that computes a token's indexer k row completes the token's region from the tail slot (or
  /// appends the row to it), so the step has one launch fewer; any other step gets the summaries
  /// launch after the prepare launch.
  IndexerSummaryOutputs summaries{};
};

/// Whether `indexer_prepare` runs its many-token instance (one CTA per token, register-bound for
/// occupancy) for `num_tokens` tokens on `num_sms` SMs: from 2 × num_sms tokens (more than a wave).
/// Below it the few-token instance (decode, MTP), which can also do step 4.
inline bool indexer_prepare_many_tokens(int num_tokens, int num_sms) {
  return static_cast<long long>(num_tokens) >= 2LL * num_sms;
}

/// Whether `indexer_prepare` with `summaries` set does step 4 inside its own launch for batch `b`
/// on a device of `num_sms` SMs: 0 < num_tokens, the few-token instance, and every request with at
/// most one token in the step (read from the host mirror cu_seqlens_q_host; a request's region
/// then has no other row of this step, so one warp can complete it). A device cu_seqlens_q that
/// gives a request more tokens than its mirror is not folded: that request's summary and tail row
/// are skipped and, in checked mode, reported (BoundsFault::kFoldedStepNotDecode).
inline bool indexer_prepare_folds_summaries(const IndexerBatch& b, int num_sms) {
  if (b.num_tokens <= 0 || b.cu_seqlens_q_host == nullptr || indexer_prepare_many_tokens(b.num_tokens, num_sms))
    return false;
  for (int r = 0; r < b.num_requests; ++r)
    if (b.cu_seqlens_q_host[r + 1] - b.cu_seqlens_q_host[r] > 1) return false;
  return true;
}

/// The most requests one step of `indexer_summaries` (and of indexer_prepare's step 4, hence of
/// `dsa_layer_run` and a `DsaLayerCapacity`) takes: the summaries launch has one grid row per
/// request (gridDim.y <= 65535).
inline constexpr int kMaxIndexerRequests = kMaxGridDimY;

/// The largest max_seq_len of one `indexer_select` step (and of a `DsaLayerCapacity`): the score
/// grid has one row per chunk of a score row's regions, at most 65535 rows (gridDim.y), and a
/// chunk holds at most 2048 regions of 8 tokens (kernels/sm90/indexer_scores.cuh,
/// kScoreMaxRegionsPerCta; static_asserted in indexer_launch.cuh): 8 × 65535 × 2048 =
/// 1,073,725,440 tokens.
inline constexpr int kMaxIndexerSeqLen = layout::kRegionSize * kMaxGridDimY * 2048;

/// Arguments of `indexer_summaries` (SPEC §4.4, tail buffer of SPEC §5).
struct IndexerSummaryParams {
  layout::RankLayout rank{};
  IndexerBatch batch{};
  PagedTable table{};
  const bf16* index_k = nullptr;      ///< [T, P] bf16 from indexer_prepare, 2-byte aligned
  const bf16* c = nullptr;            ///< fused GEMM output (raw index_z columns) [T, ldc], 2-byte aligned
  std::int64_t ldc = 0;
  std::uint8_t* summary_cache = nullptr;  ///< [num_blocks, block_size/8, P] e4m3 bits, 2-byte aligned
  bf16* tail = nullptr;               ///< [num_slots, 8, 2, P] bf16 (index_k, index_z) pending rows, 16-byte aligned
  const std::int32_t* tail_slot = nullptr;  ///< [num_requests] int32 slot of each request, 4-byte aligned
  int num_slots = 0;
  const std::int32_t* tail_slot_host = nullptr;  ///< optional host copy (IndexerSummaryOutputs)
};

/// The `indexer_summaries` arguments of the step that `p` prepares, writing to `out`: its rank,
/// batch, table, index_k and C (raw index_z columns). indexer_prepare's step 4 and dsa_layer_run's
/// separate summaries launch build them here.
inline IndexerSummaryParams indexer_summary_params(const IndexerPrepareParams& p, const IndexerSummaryOutputs& out) {
  IndexerSummaryParams s;
  s.rank = p.rank, s.batch = p.batch, s.table = p.table, s.index_k = p.index_k, s.c = p.c, s.ldc = p.ldc;
  s.summary_cache = out.summary_cache, s.tail = out.tail, s.tail_slot = out.tail_slot, s.num_slots = out.num_slots;
  s.tail_slot_host = out.tail_slot_host;
  return s;
}

/// Arguments of `indexer_select` (SPEC §4.5–4.6).
struct IndexerSelectParams {
  layout::RankLayout rank{};
  IndexerBatch batch{};
  PagedTable table{};
  const std::uint8_t* index_q = nullptr;       ///< [T, Il, P] e4m3 bits, 16-byte aligned
  const float* weights = nullptr;              ///< [T, Il] fp32, 4-byte aligned
  const std::uint8_t* summary_cache = nullptr; ///< [num_blocks, block_size/8, P] e4m3 bits, 16-byte aligned
  int topk = 0;                                ///< 1..1024 (run-time `sparse_config.topk`)
  int max_seq_len = 0;  ///< upper bound of seq_lens (sizes the score workspace; in [1, kMaxIndexerSeqLen])
  std::int32_t* topk_ids = nullptr;  ///< [lg, T, topk+1] int32: ascending ids, current region, -1 pad; 4-byte aligned
  std::int32_t* counts = nullptr;    ///< [lg, T] int32 = min(topk, p/8) + 1; 4-byte aligned
  void* workspace = nullptr;         ///< >= indexer_select_workspace_bytes(...) for one token (see there), 16-byte aligned
  std::size_t workspace_bytes = 0;
};

namespace detail {
/// The per-geometry launchers behind the run-time ones (which dispatch on rank.geometry through
/// ops/dispatch.hpp); defined in kernels/sm90/indexer_launch.cuh.
template <layout::GeometryId Id>
Status indexer_prepare_for(const IndexerPrepareParams& p, cudaStream_t stream);
template <layout::GeometryId Id>
Status indexer_summaries_for(const IndexerSummaryParams& p, cudaStream_t stream);
template <layout::GeometryId Id>
Status indexer_select_for(const IndexerSelectParams& p, cudaStream_t stream);
}  // namespace detail

namespace detail {
/// Layout of the `indexer_select` workspace (one definition, used by the launcher and by
/// `indexer_select_workspace_bytes`): a 256-byte-aligned plan of [B+1] int32, then fp32 scores
/// `[tokens * lg, score_ld]`, score_ld = max(1, max_seq_len/8) rounded up to 4 regions.
constexpr std::int64_t score_ld(int max_seq_len) {
  const std::int64_t n = max_seq_len / layout::kRegionSize > 1 ? max_seq_len / layout::kRegionSize : 1;
  return (n + 3) / 4 * 4;
}
inline std::size_t plan_bytes(int num_requests) {
  return ((static_cast<std::size_t>(num_requests) + 1) * 4 + 255) / 256 * 256;
}
}  // namespace detail

/// The score chunks of an `indexer_select` call over `num_tokens` tokens whose workspace holds at
/// most `fit` tokens' scores (fit = floor((workspace_bytes - fixed) / per_token); a fit of 0 counts
/// as 1): the fewest chunks, count = ceil(num_tokens / fit), whose sizes differ by at most one
/// token — chunk k holds tokens [begin(k), begin(k + 1)), the first num_tokens % count chunks one
/// token longer. Each chunk is one score launch over the whole grid plus one top-k launch, so a
/// short last chunk cost as much as a long one (H200, bench_layer prefill 32K tp 8: max-size
/// chunks of 16382 + 16382 + 4 tokens, the 4-token chunk 128 µs of scores and 12 µs of top-k;
/// bench/RESULTS.md, twelfth session). The one rule of the launcher, its tests and bench_indexer.
struct SelectChunks {
  int num_tokens = 0;  ///< tokens of the call (count = 0 when <= 0)
  int count = 0;       ///< chunks
  /// First token of chunk k (0 <= k <= count; begin(count) = num_tokens).
  constexpr int begin(int k) const {
    if (count <= 0) return 0;
    const int q = num_tokens / count, r = num_tokens % count;
    return k * q + (k < r ? k : r);
  }
  /// Tokens of the longest chunk (the first one).
  constexpr int max_tokens() const { return count > 0 ? begin(1) : 0; }
};
constexpr SelectChunks select_chunks(int num_tokens, std::size_t fit) {
  SelectChunks c;
  if (num_tokens <= 0) return c;
  const std::size_t t = static_cast<std::size_t>(num_tokens);
  const std::size_t f = fit < 1 ? 1 : (fit > t ? t : fit);
  c.num_tokens = num_tokens;
  c.count = static_cast<int>((t + f - 1) / f);
  return c;
}

/// Bytes of one token's fp32 scores in the `indexer_select` workspace: lg * score_ld(max_seq_len) * 4,
/// score_ld = round_up(max(1, max_seq_len/8), 4) regions.
inline std::size_t indexer_select_token_bytes(const layout::RankLayout& rank, int max_seq_len) {
  return static_cast<std::size_t>(rank.local_kv_groups) * static_cast<std::size_t>(detail::score_ld(max_seq_len)) * 4;
}
namespace detail {
/// indexer_select_token_bytes, at least 1: the divisor of the chunk sizes (`indexer_select_chunks`,
/// dsa_layer's workspace map). A RankLayout of 0 KV groups (not one of make_rank_layout, which
/// the launchers refuse) gave 0 and a division by zero (SIGFPE).
inline std::size_t select_token_bytes_divisor(const layout::RankLayout& rank, int max_seq_len) {
  const std::size_t b = indexer_select_token_bytes(rank, max_seq_len);
  return b > 0 ? b : 1;
}
}  // namespace detail

/// Workspace bytes of `indexer_select` that process `max_tokens` tokens in one score chunk.
/// The launcher processes the tokens in chunks of at most `floor((workspace_bytes - fixed) /
/// per_token)` tokens, as equal as possible (`select_chunks`), so any size >=
/// `indexer_select_workspace_bytes(rank, 1, max_seq_len, max_requests)` works (bounded memory
/// whatever the context); more tokens per chunk means fewer launches.
/// per_token = `indexer_select_token_bytes` (fp32 scores).
inline std::size_t indexer_select_workspace_bytes(const layout::RankLayout& rank, int max_tokens, int max_seq_len,
                                                  int max_requests) {
  // The launcher's own layout (indexer_launch.cuh): plan [B+1] int32, then fp32 scores.
  const std::size_t tokens = static_cast<std::size_t>(max_tokens > 1 ? max_tokens : 1);
  return detail::plan_bytes(max_requests > 0 ? max_requests : 0) +
         tokens * indexer_select_token_bytes(rank, max_seq_len);
}

/// The score chunks `indexer_select` runs for `num_tokens` tokens of `num_requests` requests in a
/// workspace of `workspace_bytes` (at least indexer_select_workspace_bytes(rank, 1, max_seq_len,
/// num_requests)): `select_chunks` over the tokens whose scores the workspace holds after its plan
/// (the layout of indexer_select_workspace_bytes). The launcher's rule; tests and benches that need
/// to know which tokens' scores a workspace ends with call it too.
inline SelectChunks indexer_select_chunks(const layout::RankLayout& rank, int num_tokens, int max_seq_len,
                                          int num_requests, std::size_t workspace_bytes) {
  const std::size_t plan = detail::plan_bytes(num_requests > 0 ? num_requests : 0);
  const std::size_t per_token = detail::select_token_bytes_divisor(rank, max_seq_len);
  return select_chunks(num_tokens, workspace_bytes > plan ? (workspace_bytes - plan) / per_token : 0);
}

/// The longest score row `topk_select` takes (TopkSelectParams::ld): 2^30 regions. The selection
/// kernel walks a row's keys with int32 indices that run past the row's end by up to a CTA's
/// stride (4096 keys) and rounds the row up to whole strides and cluster slices; rows near
/// INT32_MAX overflowed them (ld = history = 2^31 - 1: (n + 7) / 8 and (len + 511) / 512 wrapped
/// negative, no key was counted and the ids written were not the row's top-k). indexer_select's
/// own rows are at most score_ld(kMaxIndexerSeqLen) (about 2^27) regions.
inline constexpr std::int64_t kTopkMaxLd = std::int64_t{1} << 30;

/// Step 6 alone on given fp32 scores (SPEC §4.6). Row r: `history[r]` = p/8 regions with scores at
/// `scores[r*ld + 0 .. history[r])`; writes `ids[r*ld_ids + 0 .. topk]` (the top min(topk, p/8)
/// ids ascending, then `history[r]` as the current region, then -1) and `counts[r]`.
/// Ties go to the lower id, NaN ranks above +inf, -0 == +0; bit-identical on every run.
struct TopkSelectParams {
  const float* scores = nullptr;
  std::int64_t ld = 0;               ///< row stride of scores (elements), >= max history; 1 .. kTopkMaxLd
  /// [rows] int32, the regions of each row, in [0, ld]; a value outside (a negative one read as
  /// unsigned) is cut to ld on the device (kernels::sm90::topk_row, as indexer_select's own
  /// rows): the selection then reads the row's ld scores and nothing past them
  const std::int32_t* history = nullptr;
  int rows = 0;
  int topk = 0;                      ///< 1..1024
  std::int32_t* ids = nullptr;       ///< [rows, ld_ids] int32
  std::int64_t ld_ids = 0;           ///< >= topk + 1
  std::int32_t* counts = nullptr;    ///< [rows] int32
};

/// Launches SPEC §4.2–4.3 for every packed token (asynchronous), and §4.4 when `p.summaries` is
/// set (see there). Errors: kInvalidArgument (every rule of `validate_step` with max_position and
/// ldc, e.g. a position >= max_blocks * block_size or >= max_position; a null pointer or host
/// mirror; a pointer not aligned as IndexerPrepareParams says: c, q_out, k_cache, v_cache,
/// index_k, weights and the norm weights 4-byte, index_q and the RoPE tables 2-byte; with
/// `summaries`: those of `indexer_summaries`; an output — q_out, k_cache, v_cache, index_q,
/// weights, index_k and step 4's summary_cache / tail — overlapping another output or an input:
/// C (rows [0, T) up to column rows_with_w), the norm weights, the RoPE tables, the batch arrays,
/// the block table, tail_slot — `require_disjoint`: each token's CTAs write while other tokens'
/// CTAs still read, e.g. q prepared over C puts token t's q on an earlier token's k, v and
/// indexer columns), eps negative or not finite (`check_norm_eps`), a RankLayout that is not
/// make_rank_layout's (`layout::check_rank_layout`), kUnsupported (geometry not built, > 1
/// local indexer k head), kCudaError (launch). Device values: see the file comment.
Status indexer_prepare(const IndexerPrepareParams& p, cudaStream_t stream);

/// Launches SPEC §4.4: summaries of every region completed by this step into the summary cache,
/// then the leftover rows of each request into its tail slot. Must run after `indexer_prepare`
/// of the same step and before `indexer_select` (stream order). Errors: `validate_step` (batch,
/// table, ldc), null pointers, tail not 16-byte, tail_slot not 4-byte, summary_cache, index_k or c
/// not 2-byte aligned, num_slots <= 0, num_requests > kMaxIndexerRequests, a RankLayout that is
/// not make_rank_layout's, summary_cache or tail overlapping each other,
/// index_k, C, tail_slot, the batch arrays or the block table (`require_disjoint`)
/// (kInvalidArgument); kUnsupported (geometry not built, > 1 local indexer k head); kCudaError (launch).
Status indexer_summaries(const IndexerSummaryParams& p, cudaStream_t stream);

/// Launches SPEC §4.5–4.6 for every (token, local group). Errors: `validate_step` (batch, table,
/// topk in [1, kMaxTopk], seq_lens <= max_seq_len <= kMaxIndexerSeqLen, workspace_bytes, the device
/// cu_seqlens_q / seq_lens non-null and, with the block table, 4-byte aligned), null pointers, index_q / summary_cache / workspace not
/// 16-byte or weights, topk_ids, counts not 4-byte aligned, a selection chunk of 2^31 rows or more, the workspace
/// bytes it writes (the plan and the longest chunk's scores), topk_ids or counts overlapping each
/// other, index_q, weights, the summary cache, the batch arrays or the block table
/// (`require_disjoint`), STEP5_TOPK
/// (`topk_env_status`), a RankLayout that is not make_rank_layout's (kInvalidArgument, nothing
/// launched); kUnsupported (geometry not built, > 1 local indexer k head, more local indexer heads
/// than the score kernel's kScoreCols); kCudaError (launch).
Status indexer_select(const IndexerSelectParams& p, cudaStream_t stream);

/// Launches step 6 alone (see TopkSelectParams). Errors: kInvalidArgument (topk outside 1..1024,
/// rows < 0, a null or not 4-byte aligned pointer, ld outside 1 .. kTopkMaxLd, ld_ids < topk + 1
/// or ids rows whose strided extent passes 2^63 - 1 bytes, STEP5_TOPK (`topk_env_status`),
/// ids (rows [0, rows) up to topk + 1) or counts overlapping each other, scores (rows * ld values:
/// the last row's length is a device value <= ld) or history — `require_disjoint`: a row's CTA
/// writes while other rows' CTAs still read; also ids over the same row's scores, not proven
/// unsafe for every kernel variant, is refused), kUnsupported (not
/// an sm_90 device), kCudaError (launch).
Status topk_select(const TopkSelectParams& p, cudaStream_t stream);

namespace detail {
/// Bytes of step 4's outputs (the summary cache [num_blocks, block_size/8, P] e4m3, the tail
/// [num_slots, 8, 2, P] bf16), for require_disjoint (the indexer launchers and dsa_layer_run).
inline std::uint64_t summary_cache_bytes(const PagedTable& t, int proxy_dim) {
  return static_cast<std::uint64_t>(t.num_blocks > 0 ? t.num_blocks : 0) *
         static_cast<std::uint64_t>(t.block_size > 0 ? t.block_size / layout::kRegionSize : 0) *
         static_cast<std::uint64_t>(proxy_dim);
}
inline std::uint64_t tail_bytes(int num_slots, int proxy_dim) {
  return static_cast<std::uint64_t>(num_slots > 0 ? num_slots : 0) * 8 * 2 * static_cast<std::uint64_t>(proxy_dim) * 2;
}
}  // namespace detail

}  // namespace step5::ops
