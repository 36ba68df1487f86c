// Benchmark of the sparse GQA attention + gate (step5/ops/attention.hpp, SPEC §4 steps 7–8):
//   copy/d2d                                              shared copy ceiling (bench_common.hpp: 1 GiB D2D,
//                                                         median, read + write bytes / s)
//   attention/decode/<geometry>/tp:N/batch:B/ctx:C        1 query row per request, full selections (topk 512)
//   attention/<family>/<geometry>/tp:N/chunk:T/hist:H     one request, T new rows after H cached tokens;
//     one family per selection pattern (issue 15 §3):
//     prefill               synthetic overlapping selections (below), the original cases
//     prefill_indexer       the layer's own selections: the project's indexer (ops::indexer_prepare,
//                           indexer_summaries, indexer_select) on a random fused-GEMM output, random
//                           norm weights, RoPE tables and random e4m3 history summaries; prepare also
//                           writes the chunk's K/V rows into the case's caches
//     prefill_sinks_local   "sinks + local + scattered" (bench/prefill_selections.hpp): per query the
//                           first 4 regions, the 128 history regions before the current one and the
//                           other 380 drawn uniformly from the rest of the history (seeded per
//                           (group, position)), plus the current region
// Counters: gathered K/V bytes per second (decode: what the selection reads, (count-1)*8 + partial
// tokens × 2·D·2 bytes per (request, group); prefill likewise per (query, group), so reuse across
// a tile's queries shows up as more than the memory delivers) and its ratio to the copy bandwidth;
// effective TFLOP/s = 4·hpg_q·D·(tokens attended) per (query, group) / time. Prefill cases add:
//   query_tile       queries per CTA tile (the attention plan's)
//   union_density    mean over (query tile, KV group) of |union of the tile's selected regions| /
//                    (tile queries × topk), from the selections the kernel gets (host, exact);
//                    1/tile_queries = every query selects the same regions, ~1 = no reuse
//   union_regions    mean |union| (regions gathered per (tile, group))
//   gather_GB/s      random-row gather ceiling of this case (bench_common.hpp `gather_ceiling`):
//                    2^22 rows of one token of one KV head, D·2 bytes each (the granule of the
//                    kernel's cp.async row copies: D/8 16-byte chunks per token row), ids drawn
//                    uniformly (seeded) from the case's whole K/V cache (its working set), the K
//                    row and the V row of each id read, L2 flushed, median of 5
//   x_gather         gathered_GB/s / gather_GB/s: > 1 = reuse across queries beats gathering every
//                    (query, region) from memory; < 1 = below the no-reuse floor
// Decode cases report gather_GB/s and x_gather too, the ids drawn as whole regions (8 token rows
// of one KV head, KVl rows apart: what a decode CTA gathers per selected region) uniformly and
// without replacement from the case's cache (each (region, head) at most once, up to 2^19 of
// them): the rate of this access pattern without the attention around it.
// Every selection row is checked against SPEC §4.6 (bench/prefill_selections.hpp) before timing.
// Synthetic selections are generated on the device: (request, group, query) gets min(topk, p/8)
// history regions spread evenly over [0, p/8) with an offset that changes every 32 positions (so
// neighbouring queries of a prefill tile mostly share regions), plus the current region.
// The KV cache holds exactly the case's blocks (B × max_blocks, block table a permutation); a case
// whose cache does not fit in the free device memory fails with SkipWithError naming the bytes.
// The L2 is flushed (bench_common.hpp L2Flusher: a read of 128 MiB, or the memset of earlier runs
// with STEP5_BENCH_L2_FLUSH=write) before every timed launch, and untimed flushed launches run
// first for bench_common.hpp warm_up's STEP5_BENCH_WARMUP_MS (default 200 ms). UseManualTime with
// CUDA events.
// A table is printed last.
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "prefill_selections.hpp"
#include "step5/core/cuda_check.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/model/rope.hpp"
#include "step5/ops/attention.hpp"
#include "step5/ops/indexer.hpp"

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

#define CK(call) STEP5_BENCH_CUDA(call)  // bench_common.hpp: prints the call and exits

cudaStream_t g_stream;
double g_copy_gbs = 0;
step5::bench::L2Flusher* g_flush = nullptr;  // bench_common.hpp (STEP5_BENCH_L2_FLUSH)

namespace sb = step5::bench;
namespace ops = step5::ops;

/// Selection pattern of a case (see the file comment).
enum class Pattern { kSynthetic, kIndexer, kSinksLocal };
const char* family(Pattern p) {
  switch (p) {
    case Pattern::kIndexer: return "prefill_indexer";
    case Pattern::kSinksLocal: return "prefill_sinks_local";
    default: return "prefill";
  }
}
constexpr double kTheta = 5e6;  // RoPE base of the indexer's tables (any valid value: only shapes the data)

struct Row {
  double us = 0, gbs = 0, tflops = 0, ratio = 0;
  double union_density = -1, x_gather = -1;  // union: prefill only (-1: not measured)
};
std::map<std::string, Row> g_rows;
std::vector<std::string> g_order;

__device__ __forceinline__ unsigned hash32(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
/// ids [lg, T, topk+1], counts [lg, T] for positions pos0 + (t - cu[b]) of B requests with q_len
/// rows each (uniform batches: request b owns rows b*q_len .. ).
__global__ void make_selection(int* ids, int* counts, int lg, int T, int topk, int q_len, int seq_len) {
  const int row = blockIdx.x;  // g * T + t
  const int g = row / T, t = row % T;
  const int b = t / q_len, i = t % q_len;
  const int p = seq_len - q_len + i, cur = p / kR;
  const int n = min(topk, cur);
  const int W = topk + 1;
  const int spacing = n > 0 ? cur / n : 1;
  const unsigned off = n > 0 ? hash32(static_cast<unsigned>(g * 7919 + b * 104729) ^ static_cast<unsigned>(p >> 5)) % spacing : 0;
  for (int k = threadIdx.x; k < W; k += blockDim.x) {
    int v = -1;
    if (k < n) v = static_cast<int>(static_cast<long long>(k) * cur / n) + static_cast<int>(off);
    else if (k == n) v = cur;
    ids[static_cast<std::size_t>(row) * W + k] = v;
  }
  if (threadIdx.x == 0) counts[row] = n + 1;
}
/// table[i] = (i·stride + 3) mod num_blocks for the B × max_blocks = num_blocks slots: a
/// non-contiguous permutation when gcd(stride, num_blocks) = 1 (`table_stride`).
__global__ void iota_table(int* table, int B, int max_blocks, int num_blocks, int stride) {
  const std::size_t n = static_cast<std::size_t>(B) * max_blocks;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    table[i] = static_cast<int>((i * static_cast<std::size_t>(stride) + 3) % static_cast<std::size_t>(num_blocks));
}
/// The smallest stride >= 7 coprime to num_blocks (7 for every case registered here).
int table_stride(int num_blocks) {
  int s = 7;
  while (std::gcd(s, num_blocks) != 1) ++s;
  return s;
}

void BM_copy(benchmark::State& state) {
  // The shared ceiling (bench_common.hpp): median of 1 GiB D2D copies, bytes read + written / s.
  const step5::bench::CopyCeiling& c = step5::bench::copy_ceiling(g_stream);
  for (auto _ : state) state.SetIterationTime(c.seconds);
  g_copy_gbs = c.gbs;
  state.counters["GB/s"] = g_copy_gbs;
}

/// Pattern kIndexer: the selections of the project's indexer for the step of `a` (SPEC §4 steps
/// 2–6) written to `topk_ids` / `counts` (`[lg, T, topk+1]`, `[lg, T]`). Inputs: a random fused-GEMM output C (what random
/// weights give; the GEMM itself is not run), random norm weights, the RoPE tables of
/// model::make_rope_table, random e4m3 summaries for the whole history and random tail rows;
/// indexer_prepare writes the chunk's K/V rows into `k_cache`/`v_cache`, indexer_summaries the
/// chunk's completed regions, indexer_select scores and selects. Returns "" or the failing
/// launcher's Status text.
std::string indexer_selections(const step5::layout::RankLayout& r, const ops::SparseAttentionParams& a, int seq_len,
                               __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, std::int32_t* topk_ids,
                               std::int32_t* counts, cudaStream_t s) {
  using step5::bf16;
  const step5::layout::Geometry& g = r.geometry;
  const int T = a.num_tokens, B = a.num_requests, D = g.head_dim, P = g.proxy_dim, Hl = r.local_heads;
  const int Il = r.index_local_heads;
  const std::int64_t ldc = r.padded_rows;
  sb::DevBuf<bf16> c(static_cast<std::size_t>(T) * ldc), q_out(static_cast<std::size_t>(T) * Hl * D);
  sb::DevBuf<bf16> index_k(static_cast<std::size_t>(T) * P), tail(static_cast<std::size_t>(B) * kR * 2 * P);
  sb::DevBuf<std::uint8_t> index_q(static_cast<std::size_t>(T) * Il * P);
  sb::DevBuf<std::uint8_t> summary(static_cast<std::size_t>(a.num_blocks) * (a.block_size / kR) * P);
  sb::DevBuf<float> weights(static_cast<std::size_t>(T) * Il), q_norm(D), k_norm(D), iq_norm(P), ik_w(P), ik_b(P);
  sb::DevBuf<std::int32_t> slot(B);
  sb::fill_bf16(c.p, c.n, 501u, -1.5f, 1.5f, s);
  sb::fill_f32(q_norm.p, D, 502u, -0.1f, 0.1f, s);
  sb::fill_f32(k_norm.p, D, 503u, -0.1f, 0.1f, s);
  sb::fill_f32(iq_norm.p, P, 504u, -0.1f, 0.1f, s);
  sb::fill_f32(ik_w.p, P, 505u, 0.9f, 1.1f, s);
  sb::fill_f32(ik_b.p, P, 506u, -0.1f, 0.1f, s);
  sb::fill_bf16(tail.p, tail.n, 507u, -1.f, 1.f, s);
  sb::fill_e4m3(summary.p, summary.n, 508u, s);
  const step5::model::RopeTable rm = step5::model::make_rope_table(seq_len, g.rot_main, kTheta);
  const step5::model::RopeTable ri = step5::model::make_rope_table(seq_len, g.rot_idx, kTheta);
  sb::DevBuf<bf16> cos_m(rm.cos.size()), sin_m(rm.sin.size()), cos_i(ri.cos.size()), sin_i(ri.sin.size());
  std::vector<std::int32_t> h_slot(static_cast<std::size_t>(B));
  std::iota(h_slot.begin(), h_slot.end(), 0);
  CK(cudaMemcpy(cos_m.p, rm.cos.data(), cos_m.bytes(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sin_m.p, rm.sin.data(), sin_m.bytes(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(cos_i.p, ri.cos.data(), cos_i.bytes(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sin_i.p, ri.sin.data(), sin_i.bytes(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(slot.p, h_slot.data(), slot.bytes(), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());  // s does not order after the legacy-stream copies

  ops::IndexerBatch batch;
  batch.cu_seqlens_q = a.cu_seqlens_q, batch.seq_lens = a.seq_lens, batch.num_requests = B, batch.num_tokens = T;
  batch.cu_seqlens_q_host = a.cu_seqlens_q_host, batch.seq_lens_host = a.seq_lens_host;
  ops::PagedTable table;
  table.block_table = a.block_table, table.max_blocks = a.max_blocks, table.block_size = a.block_size;
  table.num_blocks = a.num_blocks;

  ops::IndexerPrepareParams pp;
  pp.rank = r, pp.eps = 1e-5f, pp.batch = batch, pp.table = table, pp.c = c.p, pp.ldc = ldc;
  pp.q_norm = q_norm.p, pp.k_norm = k_norm.p, pp.index_q_norm = iq_norm.p;
  pp.index_k_norm_w = ik_w.p, pp.index_k_norm_b = ik_b.p;
  pp.cos_main = cos_m.p, pp.sin_main = sin_m.p, pp.cos_idx = cos_i.p, pp.sin_idx = sin_i.p;
  pp.max_position = seq_len;
  pp.q_out = q_out.p, pp.k_cache = reinterpret_cast<bf16*>(k_cache), pp.v_cache = reinterpret_cast<bf16*>(v_cache);
  pp.index_q = index_q.p, pp.weights = weights.p, pp.index_k = index_k.p;
  if (const step5::Status st = ops::indexer_prepare(pp, s); !st.ok()) return st.to_string();

  ops::IndexerSummaryParams sp;
  sp.rank = r, sp.batch = batch, sp.table = table, sp.index_k = index_k.p, sp.c = c.p, sp.ldc = ldc;
  sp.summary_cache = summary.p, sp.tail = tail.p, sp.tail_slot = slot.p, sp.num_slots = B;
  if (const step5::Status st = ops::indexer_summaries(sp, s); !st.ok()) return st.to_string();

  const std::size_t ws_bytes = ops::indexer_select_workspace_bytes(r, std::min(T, 2048), seq_len, B);
  sb::DevBuf<unsigned char> ws(ws_bytes);
  ops::IndexerSelectParams sel;
  sel.rank = r, sel.batch = batch, sel.table = table, sel.index_q = index_q.p, sel.weights = weights.p;
  sel.summary_cache = summary.p, sel.topk = a.topk, sel.max_seq_len = seq_len;
  sel.topk_ids = topk_ids, sel.counts = counts;
  sel.workspace = ws.p, sel.workspace_bytes = ws_bytes;
  if (const step5::Status st = ops::indexer_select(sel, s); !st.ok()) return st.to_string();
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  return {};
}

template <class Tag>
void run_attention(benchmark::State& state, const std::string& name, int B, int q_len, int seq_len, bool decode,
                   Pattern pattern) {
  using L = typename Tag::Layout;
  constexpr int D = Tag::kGeometry.head_dim, Hl = L::kLocalHeads, lg = L::kLocalKvGroups, hpg = L::kHpgQ;
  const int topk = 512, bs = 64;
  const int T = B * q_len;
  const int max_blocks = (seq_len + bs - 1) / bs;
  const std::size_t per_block = static_cast<std::size_t>(bs) * lg * D;
  // The cache holds exactly the case's blocks (no wrapping block table): fail the case, naming
  // the bytes, when it does not fit in the free device memory.
  const std::size_t want = static_cast<std::size_t>(B) * max_blocks;
  const std::size_t kv_bytes = per_block * want * 2 * 2;  // K + V, bf16
  {
    std::size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const std::size_t others = static_cast<std::size_t>(T) * Hl * (D * 2 * 2 + 2 + 4) +
                               static_cast<std::size_t>(lg) * T * (topk + 2) * 4 + (1ull << 30);  // + 1 GiB margin
    if (want > static_cast<std::size_t>(0x7fffffff) || kv_bytes + others > free_b) {
      const std::string msg = "KV cache of " + std::to_string(want) + " blocks needs " + std::to_string(kv_bytes) +
                              " bytes (K + V) + " + std::to_string(others) + " bytes of other buffers; " +
                              std::to_string(free_b) + " bytes free on the device";
      state.SkipWithError(msg.c_str());
      return;
    }
  }
  const int num_blocks = static_cast<int>(want);
  __nv_bfloat16 *k, *v, *q, *gate, *out;
  int *table, *cu, *seq, *ids, *counts;
  float* lse;
  CK(cudaMalloc(&k, per_block * num_blocks * 2));
  CK(cudaMalloc(&v, per_block * num_blocks * 2));
  CK(cudaMalloc(&q, static_cast<std::size_t>(T) * Hl * D * 2));
  CK(cudaMalloc(&gate, static_cast<std::size_t>(T) * Hl * 2));
  CK(cudaMalloc(&out, static_cast<std::size_t>(T) * Hl * D * 2));
  CK(cudaMalloc(&lse, static_cast<std::size_t>(T) * Hl * 4));
  CK(cudaMalloc(&table, static_cast<std::size_t>(B) * max_blocks * 4));
  CK(cudaMalloc(&cu, (B + 1) * 4));
  CK(cudaMalloc(&seq, B * 4));
  CK(cudaMalloc(&ids, static_cast<std::size_t>(lg) * T * (topk + 1) * 4));
  CK(cudaMalloc(&counts, static_cast<std::size_t>(lg) * T * 4));
  auto free_all = [&] {
    cudaFree(k);
    cudaFree(v);
    cudaFree(q);
    cudaFree(gate);
    cudaFree(out);
    cudaFree(lse);
    cudaFree(table);
    cudaFree(cu);
    cudaFree(seq);
    cudaFree(ids);
    cudaFree(counts);
  };
  step5::bench::fill_bf16(k, per_block * num_blocks, 1, -1.f, 1.f, g_stream);
  step5::bench::fill_bf16(v, per_block * num_blocks, 2, -1.f, 1.f, g_stream);
  step5::bench::fill_bf16(q, static_cast<std::size_t>(T) * Hl * D, 3, -2.f, 2.f, g_stream);
  step5::bench::fill_bf16(gate, static_cast<std::size_t>(T) * Hl, 4, -4.f, 4.f, g_stream);
  iota_table<<<256, 256, 0, g_stream>>>(table, B, max_blocks, num_blocks, table_stride(num_blocks));
  CK(cudaGetLastError());
  std::vector<int> h_cu(B + 1), h_seq(B, seq_len);
  for (int b = 0; b <= B; ++b) h_cu[b] = b * q_len;
  CK(cudaMemcpy(cu, h_cu.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(seq, h_seq.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
  // tokens attended
  double tokens = 0;
  for (int t = 0; t < T; ++t) tokens += step5::bench::attended_tokens(seq_len - q_len + t % q_len, topk);
  tokens *= lg;
  const double flops = 4.0 * hpg * D * tokens;
  const double bytes = tokens * D * 2 * 2;  // gathered K and V (each (query, group) its own)
  step5::ops::SparseAttentionParams p;
  p.num_tokens = T;
  p.num_requests = B;
  p.num_local_heads = Hl;
  p.num_kv_groups = lg;
  p.head_dim = D;
  p.topk = topk;
  p.q = reinterpret_cast<const step5::bf16*>(q);
  p.k_cache = reinterpret_cast<const step5::bf16*>(k);
  p.v_cache = reinterpret_cast<const step5::bf16*>(v);
  p.num_blocks = num_blocks;
  p.block_size = bs;
  p.block_table = table;
  p.max_blocks = max_blocks;
  p.cu_seqlens_q = cu;
  p.seq_lens = seq;
  p.cu_seqlens_q_host = h_cu.data();
  p.seq_lens_host = h_seq.data();
  p.topk_ids = ids;
  p.counts = counts;
  p.gate = reinterpret_cast<const step5::bf16*>(gate);
  p.out = reinterpret_cast<step5::bf16*>(out);
  p.lse = lse;

  // Selections of the case's pattern, then every row checked against SPEC §4.6 on the host.
  const std::size_t n_ids = static_cast<std::size_t>(lg) * T * (topk + 1), n_rows = static_cast<std::size_t>(lg) * T;
  std::vector<std::int32_t> h_ids(n_ids), h_counts(n_rows);
  const std::vector<long long> positions = sb::token_positions(B, h_cu.data(), h_seq.data());
  if (pattern == Pattern::kSinksLocal) {
    sb::sinks_local_scattered(sb::SinksLocalScattered{}, lg, positions, topk, h_ids.data(), h_counts.data());
    CK(cudaMemcpy(ids, h_ids.data(), n_ids * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(counts, h_counts.data(), n_rows * 4, cudaMemcpyHostToDevice));
  } else {
    if (pattern == Pattern::kIndexer) {
      const auto rl = step5::layout::make_rank_layout(Tag::kGeometry, Tag::kParallel, 0);
      if (!rl.ok()) {
        state.SkipWithError(("invalid layout: " + step5::layout::describe(rl.error)).c_str());
        free_all();
        return;
      }
      const std::string err = indexer_selections(rl.layout, p, seq_len, k, v, ids, counts, g_stream);
      if (!err.empty()) {
        state.SkipWithError(("indexer selections: " + err).c_str());
        free_all();
        return;
      }
    } else {
      make_selection<<<lg * T, 128, 0, g_stream>>>(ids, counts, lg, T, topk, q_len, seq_len);
      CK(cudaGetLastError());
    }
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(h_ids.data(), ids, n_ids * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h_counts.data(), counts, n_rows * 4, cudaMemcpyDeviceToHost));
  }
  if (const std::string e = sb::selections_error(lg, positions, topk, h_ids.data(), h_counts.data()); !e.empty()) {
    state.SkipWithError(("selections break SPEC §4.6: " + e).c_str());
    free_all();
    return;
  }

  // Tuning A/B without a rebuild: STEP5_BENCH_ATTN_SPLITS / STEP5_BENCH_ATTN_STAGES /
  // STEP5_BENCH_ATTN_MERGE / STEP5_BENCH_ATTN_QT / STEP5_BENCH_ATTN_GATHER force the plan's
  // num_splits / pipeline_stages / split_merge (1: the last-arriver merge instead of the cluster
  // merge) / query_tile / tile_gather (1: the union of every tile, 2: per-query gathers) (unset =
  // the planner's choice; the case name is unchanged, so compare such runs only with each other).
  for (const auto& [var, field] : {std::pair{"STEP5_BENCH_ATTN_SPLITS", &p.num_splits},
                                   std::pair{"STEP5_BENCH_ATTN_QT", &p.query_tile},
                                   std::pair{"STEP5_BENCH_ATTN_GATHER", &p.tile_gather},
                                   std::pair{"STEP5_BENCH_ATTN_STAGES", &p.pipeline_stages},
                                   std::pair{"STEP5_BENCH_ATTN_MERGE", &p.split_merge}}) {
    std::string error;
    if (!step5::bench::env_knob(var, field, &error)) {
      state.SkipWithError(error.c_str());
      free_all();
      return;
    }
  }
  std::size_t ws_bytes = 0;
  const step5::Status st = step5::ops::sparse_attention_workspace_size(p, &ws_bytes);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    free_all();
    return;
  }
  // Prefill: union density per (query tile, group) with the plan's query tile, and the gather
  // ceiling over this case's K/V cache.
  sb::UnionDensity ud;
  int query_tile = 0;
  sb::GatherCeiling gather;
  if (!decode) {
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    step5::ops::SparseAttentionPlan plan;
    const step5::Status counted = step5::device_sm_count(dev, &sms);
    const step5::Status planned = counted.ok() ? step5::ops::sparse_attention_plan(p, sms, &plan) : counted;
    if (!planned.ok()) {
      state.SkipWithError(planned.to_string().c_str());
      free_all();
      return;
    }
    query_tile = plan.query_tile;
    ud = sb::union_density(lg, B, h_cu.data(), positions, query_tile, topk, h_ids.data(), h_counts.data());
  }
  // prefill: single token rows (a tile's union or a query's regions, mixed); decode: whole
  // regions of one KV group, the decode CTA's granule
  gather = sb::gather_ceiling(k, v, want * bs * lg, D * 2, 1234u, g_stream, decode ? kR : 1, decode ? lg : 1);
  if (gather.seconds <= 0) {
    state.SkipWithError("gather ceiling: row count or row size out of range");
    free_all();
    return;
  }
  void* ws = nullptr;
  if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
  if (ws_bytes) CK(cudaMemset(ws, 0, ws_bytes));  // split-KV counters: zero once before first use
  const auto first_launch = std::chrono::steady_clock::now();
  const step5::Status launched = step5::ops::sparse_attention<Tag::kId>(p, ws, ws_bytes, g_stream);
  if (!launched.ok()) {
    state.SkipWithError(launched.to_string().c_str());
    cudaFree(ws);
    free_all();
    return;
  }
  CK(cudaStreamSynchronize(g_stream));
  // untimed launches as they are timed (L2 flushed) for bench_common.hpp warm_up's time
  const std::string warm = sb::warm_up(first_launch, [&]() -> std::string {
    g_flush->flush(g_stream);
    if (const step5::Status st = step5::ops::sparse_attention<Tag::kId>(p, ws, ws_bytes, g_stream); !st.ok())
      return st.to_string();
    CK(cudaStreamSynchronize(g_stream));
    return {};
  });
  if (!warm.empty()) {
    state.SkipWithError(warm.c_str());
    cudaFree(ws);
    free_all();
    return;
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double total = 0;
  int n = 0;
  for (auto _ : state) {
    g_flush->flush(g_stream);
    CK(cudaEventRecord(e0, g_stream));
    (void)step5::ops::sparse_attention<Tag::kId>(p, ws, ws_bytes, g_stream);
    CK(cudaEventRecord(e1, g_stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    state.SetIterationTime(ms / 1e3);
    total += ms;
    ++n;
  }
  CK(cudaGetLastError());
  const double sec = total / n / 1e3;
  Row r;
  r.us = sec * 1e6;
  r.gbs = bytes / sec / 1e9;
  r.tflops = flops / sec / 1e12;
  r.ratio = g_copy_gbs > 0 ? r.gbs / g_copy_gbs : 0;
  state.counters["us"] = r.us;
  state.counters["gathered_GB/s"] = r.gbs;
  state.counters["eff_TFLOP/s"] = r.tflops;
  state.counters["of_copy_bw"] = r.ratio;
  r.x_gather = r.gbs / gather.gbs;
  state.counters["gather_GB/s"] = gather.gbs;
  state.counters["x_gather"] = r.x_gather;
  if (!decode) {
    r.union_density = ud.density;
    state.counters["query_tile"] = query_tile;
    state.counters["union_density"] = ud.density;
    state.counters["union_regions"] = ud.mean_union;
  }
  if (!g_rows.count(name)) g_order.push_back(name);
  g_rows[name] = r;
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  cudaFree(ws);
  free_all();
}

/// Registers the benchmarks of one (list row, tp). The geometry comes from geometries.def via
/// its id; the tp must be one the row lists (checked at compile time).
template <step5::layout::GeometryId Id, int Tp>
void register_layout() {
  static_assert(step5::layout::lists_tp(step5::layout::entry_of(Id), Tp),
                "bench_attention: this tp is not listed for the geometry in geometries.def");
  using Tag = step5::layout::LayoutTag<Id, Tp>;
  const std::string geo = std::string(Tag::kEntry.name) + "/tp:" + std::to_string(Tp);
  // batch 16 at 1M positions per request: the decode plan's shared memory must not grow with the
  // block-table width (ops::sparse_attention_plan, tiles of one query; the cache is 48 GiB at
  // step5_preview tp 1, so a device with less free memory skips the row, naming the bytes)
  const std::pair<int, int> decode_cases[] = {{1, 131072},  {8, 131072},   {32, 131072},
                                              {64, 131072}, {128, 131072}, {16, 1048576}};
  for (const auto& [batch, ctx] : decode_cases) {
    const std::string name =
        "attention/decode/" + geo + "/batch:" + std::to_string(batch) + "/ctx:" + std::to_string(ctx);
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
      run_attention<Tag>(s, name, batch, 1, ctx, true, Pattern::kSynthetic);
    })->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
  }
  for (Pattern pattern : {Pattern::kSynthetic, Pattern::kIndexer, Pattern::kSinksLocal})
    for (int chunk : {4096, 16384})
      for (int hist : {32768, 131072}) {
        const std::string name = std::string("attention/") + family(pattern) + "/" + geo + "/chunk:" +
                                 std::to_string(chunk) + "/hist:" + std::to_string(hist);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
          run_attention<Tag>(s, name, 1, chunk, hist + chunk, false, pattern);
        })->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  if (!step5::bench::sm90_device_present()) return 0;
  CK(cudaStreamCreate(&g_stream));
  step5::bench::L2Flusher flusher(128ull << 20);  // the size of this bench's memset before the read mode
  g_flush = &flusher;
  benchmark::RegisterBenchmark("copy/d2d", BM_copy)->UseManualTime()->Iterations(10)->Unit(benchmark::kMicrosecond);
  // Benchmarked (list row, tp) pairs: the named Step-5 Preview row at tp 1/8/16 and the other
  // row at tp 1; each tp is checked against the row's list in register_layout.
  using step5::layout::GeometryId;
  register_layout<GeometryId::step5_preview, 1>();
  register_layout<GeometryId::step5_preview, 8>();
  register_layout<GeometryId::step5_preview, 16>();
  register_layout<GeometryId::dsa_h64_kv8_d128, 1>();
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("l2_flush", step5::bench::l2_flush_mode());  // bench_common.hpp L2Flusher
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\ncopy bandwidth %.0f GB/s, L2 flush: %s\n%-78s %10s %10s %8s %10s %8s %8s\n", g_copy_gbs,
              sb::l2_flush_mode(), "benchmark", "us", "GB/s", "of copy", "TFLOP/s", "union", "x_gather");
  for (const auto& name : g_order) {
    const Row& r = g_rows[name];
    std::printf("%-78s %10.1f %10.0f %8.2f %10.1f", name.c_str(), r.us, r.gbs, r.ratio, r.tflops);
    if (r.union_density >= 0) std::printf(" %8.3f", r.union_density);
    else std::printf(" %8s", "-");
    if (r.x_gather >= 0) std::printf(" %8.2f\n", r.x_gather);
    else std::printf(" %8s\n", "-");
  }
  return 0;
}
