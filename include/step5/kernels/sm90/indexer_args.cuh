#pragma once
/// \file step5/kernels/sm90/indexer_args.cuh
/// Kernel argument blocks built from the public parameter structs of step5/ops/indexer.hpp: the
/// score kernel's (from IndexerSelectParams), the raw-mode selection kernel's (from
/// TopkSelectParams) and the summaries kernel's (from IndexerSummaryParams; also the step-4 part
/// of the prepare kernel's arguments) — one place for the launchers (indexer_launch.cuh,
/// src/instances/indexer_common.cu), the benchmark and the tests that launch a kernel variant
/// directly. (The indexer-mode selection arguments, which take the batch metadata instead of a
/// history array, are built in indexer_select_for.) No launcher templates here, so including it
/// instantiates nothing per geometry.
#include <cstdint>

#include "step5/kernels/sm90/indexer_scores.cuh"
#include "step5/kernels/sm90/indexer_summaries.cuh"
#include "step5/kernels/sm90/indexer_topk.cuh"
#include "step5/ops/indexer.hpp"

namespace step5::ops::detail {

/// The batch and block-table fields that the indexer kernels' argument blocks share (ScoreArgs,
/// SummaryArgs, PrepareArgs: device cu_seqlens_q and seq_lens, the block table, its row stride,
/// block size and block count, the checked-mode fault record), copied from a step's IndexerBatch
/// and PagedTable: one place for the three argument builders.
template <class Args>
inline void set_step_table(Args& a, const IndexerBatch& batch, const PagedTable& table) {
  a.cu_seqlens_q = batch.cu_seqlens_q;
  a.seq_lens = batch.seq_lens;
  a.block_table = table.block_table;
  a.max_blocks = table.max_blocks;
  a.block_size = table.block_size;
  a.num_blocks = table.num_blocks;
  a.bounds_fault = table.bounds_fault;
}

/// Score-kernel arguments of `indexer_select` for the token chunk [t0, t1): scores land at `scores`
/// (row stride ld), tile starts at `tile_start`; the plan fields are filled by launch_scores.
inline kernels::sm90::ScoreArgs score_args(const IndexerSelectParams& p, const std::int32_t* tile_start, float* scores,
                                           std::int64_t ld, int t0, int t1) {
  kernels::sm90::ScoreArgs s{};
  set_step_table(s, p.batch, p.table);
  s.tile_start = tile_start;
  s.num_requests = p.batch.num_requests;
  s.index_q = p.index_q;
  s.weights = p.weights;
  s.summary_cache = p.summary_cache;
  s.lg = p.rank.local_kv_groups;
  s.Il = p.rank.index_local_heads;
  s.t0 = t0;
  s.t1 = t1;
  s.scores = scores;
  s.ld = ld;
  return s;
}

/// Summaries-kernel arguments of `p` (SPEC §4.4): the batch, the block table, the step's index_k and
/// raw index_z (column `col_z` of C, the rank's kIndexZ shard), the summary cache and tail buffer.
inline kernels::sm90::SummaryArgs summary_args(const IndexerSummaryParams& p) {
  kernels::sm90::SummaryArgs a{};
  set_step_table(a, p.batch, p.table);
  a.index_k = reinterpret_cast<const __nv_bfloat16*>(p.index_k);
  a.c = reinterpret_cast<const __nv_bfloat16*>(p.c);
  a.ldc = p.ldc;
  a.col_z = p.rank.shard(layout::Shard::kIndexZ).dst_row;
  a.summary_cache = p.summary_cache;
  a.tail = reinterpret_cast<__nv_bfloat16*>(p.tail);
  a.tail_slot = p.tail_slot;
  a.num_slots = p.num_slots;
  return a;
}

/// Selection-kernel arguments of `topk_select` (raw mode: row r has history[r] regions).
inline kernels::sm90::TopkArgs topk_args(const TopkSelectParams& p) {
  kernels::sm90::TopkArgs a{};
  a.scores = p.scores;
  a.ld = p.ld;
  a.history = p.history;
  a.topk = p.topk;
  a.ids = p.ids;
  a.ld_ids = p.ld_ids;
  a.counts = p.counts;
  a.lg = 1;
  return a;
}

}  // namespace step5::ops::detail
