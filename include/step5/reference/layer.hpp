#pragma once
/// \file step5/reference/layer.hpp
/// CPU reference of one DSA layer per TP rank (SPEC.md §4, every step in order) and the simulated
/// TP all-reduce — the oracle of the GPU kernels and the CPU backend of the example driver.
/// Host-safe (g++; CBLAS when STEP5_HAVE_CBLAS).
///
/// Steps of `forward` (SPEC §4): 1 fused GEMM (`gemm_bf16`, incl. the sparse_indexer_w rows),
/// 2 main q/k norm + RoPE and the paged KV write, 3 indexer q/k/z/weights, 4 region summaries +
/// tail buffer (before scoring), 5 scores, 6 top-k selection, 7 sparse attention, 8 gate and the
/// local o_proj columns → bf16 partial. Any mix of prefill chunks and decode rows (1..4 query
/// rows per request for MTP verification) in one batch. Data layouts: docs/ARCHITECTURE.md.
#include <cstdint>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/model/layer.hpp"
#include "step5/reference/attention.hpp"
#include "step5/reference/common.hpp"
#include "step5/reference/gemm.hpp"
#include "step5/reference/prepare.hpp"
#include "step5/reference/rope.hpp"
#include "step5/reference/scores.hpp"
#include "step5/reference/select.hpp"
#include "step5/reference/summaries.hpp"

namespace step5::reference {

// The weights and caches are the library's model types (step5/model/layer.hpp); these aliases
// keep the reference's spelling (`reference::LayerWeights`, ...) for its callers.
using model::LayerCache;
using model::LayerWeights;
using model::validate_weights;

/// Metadata of one step (SPEC §5), owning: B requests.
struct StepBatch {
  std::vector<std::int32_t> cu_seqlens_q;  ///< [B+1]
  std::vector<std::int32_t> seq_lens;      ///< [B] KV length after this step
  std::vector<std::int32_t> block_table;   ///< [B, max_blocks]
  int max_blocks = 0;
  std::vector<std::int32_t> tail_slot;     ///< [B]

  int num_requests() const { return static_cast<int>(seq_lens.size()); }
  BatchView view() const { return {num_requests(), cu_seqlens_q.data(), seq_lens.data()}; }
  BlockTableView blocks(const LayerCache& c) const { return {block_table.data(), max_blocks, c.block_size, c.num_blocks}; }
};

/// Every intermediate of `forward` (filled when a pointer is passed), for tests.
struct LayerIntermediates {
  std::vector<bf16> fused_out;        ///< [T, ldc] GEMM output (ldc = rank.padded_rows)
  int ldc = 0;
  std::vector<std::int32_t> positions;  ///< [T]
  std::vector<bf16> q, k;             ///< [T, Hl, D], [T, KVl, D] after norm + RoPE
  std::vector<bf16> index_q;          ///< [T, Il, P] bf16 after norm + RoPE
  std::vector<std::uint8_t> index_q_e4m3;  ///< [T, Il, P]
  std::vector<bf16> index_k, index_z; ///< [T, P]
  std::vector<float> weights;         ///< [T, Il]
  std::vector<CompletedRegion> completed;  ///< regions summarised by this step
  std::vector<float> scores;          ///< [lg, T, ld_scores]
  int ld_scores = 0;
  std::vector<std::int32_t> topk_ids, counts;  ///< [lg, T, topk+1], [lg, T]
  std::vector<bf16> attn;             ///< [T, Hl, D] before the gate
  std::vector<float> lse;             ///< [T, Hl]
  std::vector<bf16> gate;             ///< [T, Hl] bf16(sigmoid(g)) (empty without a gate)
  std::vector<bf16> gated;            ///< [T, Hl, D]
};

/// Every check of a layer step's inputs, before anything is read through them: the weights
/// (validate_weights), the StepBatch's vector sizes, the cache (its layout and its buffers'
/// sizes, LayerCache::validate), then the shared step validation (ops::validate_step, as the
/// GPU's launchers) with `topk`, the RoPE tables' max_position and the projection's `ldc`.
/// Throws `step5::Error` (kInvalidArgument) naming "forward" and the value.
inline void check_forward_inputs(const LayerWeights& w, const LayerCache& cache, const StepBatch& step, int ldc, int topk) {
  validate_weights(w);
  const auto& r = w.rank;
  const auto& g = r.geometry;
  const std::size_t B = step.seq_lens.size();
  require(step.cu_seqlens_q.size() == B + 1 && step.tail_slot.size() == B && step.max_blocks >= 0 &&
              step.block_table.size() == B * static_cast<std::size_t>(step.max_blocks),
          "forward", "StepBatch sizes: cu_seqlens_q " + std::to_string(step.cu_seqlens_q.size()) + ", tail_slot " +
                         std::to_string(step.tail_slot.size()) + ", block_table " + std::to_string(step.block_table.size()) +
                         " for " + std::to_string(B) + " requests (seq_lens) x max_blocks " + std::to_string(step.max_blocks));
  require(cache.kv_heads == r.local_kv_heads && cache.head_dim == g.head_dim && cache.proxy_dim == g.proxy_dim, "forward",
          "cache was created for kv_heads " + std::to_string(cache.kv_heads) + ", head_dim " +
              std::to_string(cache.head_dim) + ", proxy_dim " + std::to_string(cache.proxy_dim) + "; expected " +
              std::to_string(r.local_kv_heads) + ", " + std::to_string(g.head_dim) + ", " + std::to_string(g.proxy_dim));
  cache.validate("forward");
  const BatchView batch = step.view();
  const BlockTableView bt = step.blocks(cache);
  // the shared step validation (the GPU's dsa_layer_forward / launchers call the same function)
  ops::StepCheck check = step_check("forward", batch, bt);
  check.topk = topk;
  check.max_position = std::min(w.rope_main.max_position, w.rope_idx.max_position);
  check.widths[0] = {"ldc", ldc, r.rows_with_w, "rows_with_w", 1};
  require_valid(check);
}

namespace detail {
/// forward_from_projection after check_forward_inputs (forward checks once, before its GEMM).
inline std::vector<bf16> forward_from_projection_unchecked(const LayerWeights& w, LayerCache& cache,
                                                           const StepBatch& step, const bf16* C, int ldc, int topk,
                                                           LayerIntermediates* inter, int regions_per_tile) {
  const auto& r = w.rank;
  const auto& g = r.geometry;
  using layout::Shard;
  const BatchView batch = step.view();
  const BlockTableView bt = step.blocks(cache);
  const int T = batch.num_tokens(), D = g.head_dim, P = g.proxy_dim, Hl = r.local_heads, KVl = r.local_kv_heads;
  const int lg = r.local_kv_groups, Il = r.index_local_heads;
  LayerIntermediates local;
  LayerIntermediates& I = inter ? *inter : local;
  I.positions = token_positions(batch);
  auto col = [&](Shard s) { return C + r.shard(s).dst_row; };

  // 2. main q/k + paged KV write
  I.q.assign(static_cast<std::size_t>(T) * Hl * D, bf16{});
  I.k.assign(static_cast<std::size_t>(T) * KVl * D, bf16{});
  prepare_main_qk(T, Hl, KVl, D, col(Shard::kQ), ldc, col(Shard::kK), ldc, w.q_norm.data(), w.k_norm.data(), w.eps,
                  w.rope_main, I.positions.data(), I.q.data(), I.k.data());
  write_kv_cache(batch, bt, KVl, D, I.k.data(), KVl * D, col(Shard::kV), ldc, cache.k_cache.data(), cache.v_cache.data());

  // 3. indexer
  I.index_q.assign(static_cast<std::size_t>(T) * Il * P, bf16{});
  I.index_q_e4m3.assign(I.index_q.size(), 0);
  I.index_k.assign(static_cast<std::size_t>(T) * P, bf16{});
  I.index_z.assign(I.index_k.size(), bf16{});
  I.weights.assign(static_cast<std::size_t>(T) * Il, 0.0f);
  prepare_indexer(T, Il, r.hpg_i, P, col(Shard::kIndexQ), ldc, col(Shard::kIndexK), ldc, col(Shard::kIndexZ), ldc,
                  C + r.indexer_w.dst_row, ldc, w.index_q_norm.data(), w.index_k_norm_weight.data(),
                  w.index_k_norm_bias.data(), w.eps, w.rope_idx, I.positions.data(), I.index_q.data(),
                  I.index_q_e4m3.data(), I.index_k.data(), I.index_z.data(), I.weights.data());

  // 4. summaries (before scoring) + tails
  I.completed.clear();
  update_summaries(batch, bt, P, I.index_k.data(), P, I.index_z.data(), P, cache.tail.data(), cache.num_slots,
                   step.tail_slot.data(), cache.summary_cache.data(), &I.completed);

  // 5–6. scores and selection
  int max_hist = 1;
  for (int t = 0; t < T; ++t) max_hist = std::max(max_hist, I.positions[t] / layout::kRegionSize);
  I.ld_scores = max_hist;
  I.scores.assign(static_cast<std::size_t>(lg) * T * max_hist, 0.0f);
  compute_scores(batch, bt, lg, r.hpg_i, P, I.index_q_e4m3.data(), I.weights.data(), cache.summary_cache.data(),
                 I.scores.data(), I.ld_scores);
  I.topk_ids.assign(static_cast<std::size_t>(lg) * T * (topk + 1), -1);
  I.counts.assign(static_cast<std::size_t>(lg) * T, 0);
  select_topk(lg, T, I.scores.data(), I.ld_scores, I.positions.data(), topk, I.topk_ids.data(), I.counts.data());

  // 7. attention
  I.attn.assign(static_cast<std::size_t>(T) * Hl * D, bf16{});
  I.lse.assign(static_cast<std::size_t>(T) * Hl, 0.0f);
  sparse_attention(batch, bt, lg, r.hpg_q, D, topk, I.q.data(), cache.k_cache.data(), cache.v_cache.data(),
                   I.topk_ids.data(), I.counts.data(), I.attn.data(), I.lse.data(), regions_per_tile);

  // 8. gate + o_proj (local columns)
  I.gated = I.attn;
  I.gate.clear();
  if (r.local_gate > 0) {
    I.gate.assign(static_cast<std::size_t>(T) * Hl, bf16{});
    apply_gate(T, Hl, D, I.attn.data(), col(Shard::kIndexG), ldc, I.gated.data(), I.gate.data());
  }
  std::vector<bf16> partial(static_cast<std::size_t>(T) * w.hidden);
  gemm_bf16(T, w.hidden, Hl * D, I.gated.data(), Hl * D, w.o_proj.data(), Hl * D, partial.data(), w.hidden);
  return partial;
}
}  // namespace detail

/// Steps 2–8 of SPEC §4 from a given fused projection output `C [T, ldc]` (column blocks per
/// `rank.shards` and `rank.indexer_w`, ARCHITECTURE.md) — lets tests feed saved projections.
/// Updates `cache` (KV rows, summaries, tails) and returns the bf16 partial `[T, hidden]`.
inline std::vector<bf16> forward_from_projection(const LayerWeights& w, LayerCache& cache, const StepBatch& step,
                                                 const bf16* C, int ldc, int topk, LayerIntermediates* inter = nullptr,
                                                 int regions_per_tile = 0) {
  check_forward_inputs(w, cache, step, ldc, topk);
  return detail::forward_from_projection_unchecked(w, cache, step, C, ldc, topk, inter, regions_per_tile);
}

/// One DSA layer on one rank (SPEC §4): `X [T, hidden]` bf16 → bf16 partial `[T, hidden]`
/// (this rank's o_proj columns; sum the ranks with `simulated_all_reduce`). Updates `cache`.
/// `topk` is the run-time value (1..1024). `inter` (optional) receives every intermediate.
inline std::vector<bf16> forward(const LayerWeights& w, LayerCache& cache, const StepBatch& step, const bf16* X, int topk,
                                 LayerIntermediates* inter = nullptr, int regions_per_tile = 0) {
  const int ldc = w.rank.padded_rows;
  check_forward_inputs(w, cache, step, ldc, topk);  // before num_tokens reads cu_seqlens_q
  const int T = step.view().num_tokens();
  std::vector<bf16> C(static_cast<std::size_t>(T) * ldc);
  gemm_bf16(T, ldc, w.hidden, X, w.hidden, w.fused.data(), w.hidden, C.data(), ldc);
  std::vector<bf16> partial =
      detail::forward_from_projection_unchecked(w, cache, step, C.data(), ldc, topk, inter, regions_per_tile);
  if (inter) {
    inter->fused_out = std::move(C);
    inter->ldc = ldc;
  }
  return partial;
}

/// The TP all-reduce of SPEC §4.8 on the CPU: element-wise sum of every rank's bf16 partial
/// (widened to fp32, summed in rank order 0..tp−1 in fp32), rounded once to bf16. (NCCL's bf16
/// sum rounds after every addition in its own order; compare with a bf16 tolerance.)
inline std::vector<bf16> simulated_all_reduce(const std::vector<std::vector<bf16>>& partials) {
  require(!partials.empty(), "simulated_all_reduce", "no partials");
  const std::size_t n = partials[0].size();
  for (std::size_t i = 0; i < partials.size(); ++i)
    require(partials[i].size() == n, "simulated_all_reduce",
            "partial of rank " + std::to_string(i) + " has " + std::to_string(partials[i].size()) +
                " elements, rank 0 has " + std::to_string(n));
  std::vector<bf16> out(n);
  for (std::size_t j = 0; j < n; ++j) {
    float s = 0.0f;
    for (const auto& p : partials) s += to_float(p[j]);
    out[j] = to_bf16(s);
  }
  return out;
}

/// The residual add of SPEC §4.8: `residual[i] += float(reduced[i])` (fp32 residual stream).
inline void add_residual(float* residual, const bf16* reduced, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) residual[i] += to_float(reduced[i]);
}

}  // namespace step5::reference
