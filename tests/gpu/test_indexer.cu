// GPU test of the sparse indexer path (SPEC.md §4 steps 2–6, caches of SPEC §5): prepare →
// summaries → scores + selection against the CPU reference (step5/reference/*.hpp), for every
// geometry row and every tp value it lists, over several steps mixing prefill chunks, decode and
// MTP rows; and decode steps of 33, 257 and 1024 requests (past one warp's and one CTA's tile of
// requests) with mixed histories, some requests empty.
//
// How selections are judged: the GPU's scores (read from the select workspace, layout
// [(t - t0) * lg + g, ld]) are compared with the reference scores computed from the GPU's own
// inputs (its e4m3 q, weights and summary cache) within a relative tolerance; the reference
// selection of the GPU's *own* scores must equal the GPU selection exactly; and against the
// selection of the reference scores, a row may differ only in ids whose reference score lies within
// rounding (2e-4 relative) of the k-th selected score (a tie within rounding at the k-th place).
//
// Quick (sanitizer) mode, step5_test::quick(): the same cases with prefill chunks of at most 100
// tokens (max_seq_len 256 instead of 2048 / 1024, topk 4 / 8 instead of 16 / 64 in the first two
// steps so that rows still select among more regions than topk), 5 instead of 100 repeated
// selections, the long-context case at 131072 tokens (16384 regions) instead of 1M (131072), and
// the decode batches at 33 (tp 1) and 257 (tp 8) requests with histories up to 600 positions.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/kernels/sm90/indexer_launch.cuh"  // score_plan / launch_scores: the score paths alone
#include "step5/layout/parallel.hpp"
#include "step5/ops/indexer.hpp"
#include "step5/reference/prepare.hpp"
#include "step5/reference/rope.hpp"
#include "step5/reference/scores.hpp"
#include "step5/reference/select.hpp"
#include "step5/reference/summaries.hpp"

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)
using step5::bf16;
namespace ref = step5::reference;

constexpr std::uint16_t kPoisonBf16 = 0x7b7b;
constexpr std::uint8_t kPoisonU8 = 0x5a;

using step5_test::dalloc;
/// Short names of the harness copies (used throughout this file).
template <class T>
void up(T* d, const std::vector<T>& h) {
  step5_test::upload(d, h);
}
template <class T>
std::vector<T> down(const T* d, std::size_t n) {
  return step5_test::download(d, n);
}

using step5_test::judge_row;
using step5_test::same_bits;
using step5_test::sz;

/// Deterministic pseudo-random bf16 row of the fused GEMM output for (request, position).
void fill_c_row(bf16* row, int n, int request, int pos, std::uint32_t seed) {
  std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(request) * 104729u + static_cast<std::uint32_t>(pos));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int i = 0; i < n; ++i) row[i] = step5::to_bf16(nd(rng));
}

struct StepOut {
  std::vector<std::int32_t> ids, counts;  // [lg, T, topk+1], [lg, T]
  std::vector<std::int32_t> positions, requests;
};

/// One rank's world: weights, rope tables, caches (CPU reference copies and GPU copies).
struct World {
  step5::layout::RankLayout rank{};
  std::string name;
  int D = 0, P = 0, Hl = 0, KVl = 0, Il = 0, lg = 0, hpg = 0, ldc = 0;
  int NR = 0, block_size = 16, max_blocks = 0, num_blocks = 0, num_slots = 0, max_seq_len = 0;
  std::uint32_t seed = 1;
  float eps = 1e-5f;
  std::vector<float> q_norm, k_norm, iq_norm, ik_w, ik_b;
  ref::RopeTable rope_main, rope_idx;
  std::vector<std::int32_t> block_table, tail_slot, past;
  std::vector<bf16> k_cache, v_cache, tail;
  std::vector<std::uint8_t> summary;
  // device
  float *d_qn = nullptr, *d_kn = nullptr, *d_iqn = nullptr, *d_ikw = nullptr, *d_ikb = nullptr;
  bf16 *d_cm = nullptr, *d_sm = nullptr, *d_ci = nullptr, *d_si = nullptr;
  std::int32_t *d_bt = nullptr, *d_ts = nullptr;
  bf16 *d_kc = nullptr, *d_vc = nullptr, *d_tail = nullptr;
  std::uint8_t* d_sum = nullptr;

  /// `capacity` (optional, one value per request): positions each request may reach; the block
  /// pool then holds only the blocks they need (block-table entries beyond stay -1, never read),
  /// so that batches of many requests keep small caches. Without it every request gets max_seq.
  World(const step5::layout::GeometryEntry& e, int tp, int tp_rank, int nr, int max_seq, std::uint32_t s,
        int bs = 16, const std::vector<int>& capacity = {})
      : block_size(bs), seed(s) {
    const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), tp_rank);
    EXPECT(rl.ok(), "layout %s tp %d", std::string(e.name).c_str(), tp);
    rank = rl.layout;
    name = std::string(e.name) + " tp " + std::to_string(tp);
    D = rank.geometry.head_dim;
    P = rank.geometry.proxy_dim;
    Hl = rank.local_heads;
    KVl = rank.local_kv_heads;
    Il = rank.index_local_heads;
    lg = rank.local_kv_groups;
    hpg = rank.hpg_i;
    ldc = rank.padded_rows;
    NR = nr;
    max_seq_len = max_seq;
    max_blocks = (max_seq + block_size - 1) / block_size;
    std::vector<int> need(static_cast<std::size_t>(NR), max_blocks);
    if (!capacity.empty())
      for (int b = 0; b < NR; ++b) need[b] = std::min(max_blocks, (capacity[b] + block_size - 1) / block_size);
    num_blocks = std::accumulate(need.begin(), need.end(), 0) + 5;  // spare blocks must stay untouched
    num_slots = (NR + 3) | 1;  // odd, so that the slots (2b + 1) % num_slots below are distinct
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 0.2f);
    auto vec = [&](int n) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = nd(rng);
      return v;
    };
    q_norm = vec(D);
    k_norm = vec(D);
    iq_norm = vec(P);
    ik_w = vec(P);
    ik_b = vec(P);
    for (auto& x : ik_w) x += 1.0f;
    const int max_pos = max_seq + 8;
    rope_main = ref::make_rope_table(max_pos, rank.geometry.rot_main, 5e6);
    rope_idx = ref::make_rope_table(max_pos, rank.geometry.rot_idx, 5e6);
    std::vector<std::int32_t> pool(static_cast<std::size_t>(num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    block_table.assign(static_cast<std::size_t>(NR) * max_blocks, -1);
    for (int b = 0, next = 0; b < NR; ++b)
      for (int j = 0; j < need[b]; ++j) block_table[static_cast<std::size_t>(b) * max_blocks + j] = pool[next++];
    tail_slot.resize(static_cast<std::size_t>(NR));
    for (int b = 0; b < NR; ++b) tail_slot[b] = (b * 2 + 1) % num_slots;
    past.assign(static_cast<std::size_t>(NR), 0);
    const std::size_t kv = static_cast<std::size_t>(num_blocks) * block_size * KVl * D;
    k_cache.assign(kv, bf16{kPoisonBf16});
    v_cache.assign(kv, bf16{kPoisonBf16});
    tail.assign(static_cast<std::size_t>(num_slots) * 16 * P, bf16{kPoisonBf16});
    summary.assign(static_cast<std::size_t>(num_blocks) * (block_size / kR) * P, kPoisonU8);
    d_qn = dalloc<float>(D); up(d_qn, q_norm);
    d_kn = dalloc<float>(D); up(d_kn, k_norm);
    d_iqn = dalloc<float>(P); up(d_iqn, iq_norm);
    d_ikw = dalloc<float>(P); up(d_ikw, ik_w);
    d_ikb = dalloc<float>(P); up(d_ikb, ik_b);
    d_cm = dalloc<bf16>(rope_main.cos.size()); up(d_cm, rope_main.cos);
    d_sm = dalloc<bf16>(rope_main.sin.size()); up(d_sm, rope_main.sin);
    d_ci = dalloc<bf16>(rope_idx.cos.size()); up(d_ci, rope_idx.cos);
    d_si = dalloc<bf16>(rope_idx.sin.size()); up(d_si, rope_idx.sin);
    d_bt = dalloc<std::int32_t>(block_table.size()); up(d_bt, block_table);
    d_ts = dalloc<std::int32_t>(tail_slot.size()); up(d_ts, tail_slot);
    d_kc = dalloc<bf16>(kv); up(d_kc, k_cache);
    d_vc = dalloc<bf16>(kv); up(d_vc, v_cache);
    d_tail = dalloc<bf16>(tail.size()); up(d_tail, tail);
    d_sum = dalloc<std::uint8_t>(summary.size()); up(d_sum, summary);
  }
  ~World() {
    for (void* p : std::initializer_list<void*>{d_qn, d_kn, d_iqn, d_ikw, d_ikb, d_cm, d_sm, d_ci, d_si, d_bt, d_ts,
                                                 d_kc, d_vc, d_tail, d_sum})
      cudaFree(p);
  }
  ref::BlockTableView table() const { return {block_table.data(), max_blocks, block_size, num_blocks}; }
  step5::ops::PagedTable dtable() const { return {d_bt, max_blocks, block_size, num_blocks}; }

  /// Gives request b a history of `lengths[b]` positions without running the steps that wrote it:
  /// random e4m3 summaries of its complete regions and random pending tail rows (seq_len % 8 of
  /// them), identical in the CPU and GPU caches. (The indexer never reads k/v history.)
  void random_history(const std::vector<int>& lengths) {
    std::mt19937 rng(seed * 31u + 7u);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int rpb = block_size / kR;
    for (int b = 0; b < NR; ++b) {
      for (int r = 0; r < lengths[b] / kR; ++r) {
        const int blk = block_table[static_cast<std::size_t>(b) * max_blocks + r / rpb];
        std::uint8_t* dst = summary.data() + (static_cast<std::size_t>(blk) * rpb + r % rpb) * P;
        for (int d = 0; d < P; ++d) dst[d] = step5::float_to_e4m3_bits(nd(rng));
      }
      for (int i = 0; i < lengths[b] % kR; ++i)
        for (int which = 0; which < 2; ++which) {
          bf16* dst = tail.data() + ((static_cast<std::size_t>(tail_slot[b]) * kR + i) * 2 + which) * P;
          for (int d = 0; d < P; ++d) dst[d] = step5::to_bf16(nd(rng));
        }
      past[b] = lengths[b];
    }
    up(d_sum, summary);
    up(d_tail, tail);
  }
};

/// Compares bf16 arrays: elements the reference left at the poison value must be poison on the GPU
/// (untouched), the others within rel_tol (‖gpu − ref‖ / ‖ref‖).
void compare_cache_bf16(const std::vector<bf16>& gpu, const std::vector<bf16>& cpu, double rel_tol, const char* what,
                        const std::string& ctx) {
  std::vector<float> g, c;
  std::size_t touched_poison = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i].bits == kPoisonBf16) {
      touched_poison += gpu[i].bits != kPoisonBf16;
    } else {
      g.push_back(step5::to_float(gpu[i]));
      c.push_back(step5::to_float(cpu[i]));
    }
  }
  const double err = step5_test::rel_error(g, c);
  EXPECT(touched_poison == 0, "%s %s: %zu elements outside the written slots changed", ctx.c_str(), what, touched_poison);
  EXPECT(err <= rel_tol, "%s %s: rel error %.3g > %.3g over %zu written elements", ctx.c_str(), what, err, rel_tol,
         g.size());
}

void compare_cache_e4m3(const std::vector<std::uint8_t>& gpu, const std::vector<std::uint8_t>& cpu, double rel_tol,
                        const char* what, const std::string& ctx) {
  std::vector<float> g, c;
  std::size_t touched_poison = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] == kPoisonU8) {
      touched_poison += gpu[i] != kPoisonU8;
    } else {
      g.push_back(step5::e4m3_bits_to_float(gpu[i]));
      c.push_back(step5::e4m3_bits_to_float(cpu[i]));
    }
  }
  const double err = step5_test::rel_error(g, c);
  EXPECT(touched_poison == 0, "%s %s: %zu bytes outside the written slots changed", ctx.c_str(), what, touched_poison);
  EXPECT(err <= rel_tol, "%s %s: rel error %.3g > %.3g over %zu written bytes", ctx.c_str(), what, err, rel_tol, g.size());
}

struct StepOptions {
  int topk = 16;
  int ws_tokens = 0;     // tokens per score chunk (0 = all)
  int repeats = 1;       // > 1: indexer_select repeated, results must be bit-identical
  bool reference = true; // compare with the CPU reference
  /// Step 4 through indexer_prepare (IndexerPrepareParams::summaries: folded into its launch for a
  /// decode step, else its own summaries launch) instead of a separate indexer_summaries call.
  bool fold = false;
  /// When set: the kernel launches of this step's indexer_prepare call, counted in a CUDA graph
  /// captured before the step runs (1 when step 4 is folded into it, 2 with its summaries launch).
  int* prepare_launches = nullptr;
  /// Edits the raw fused-GEMM row of (request, position) after it is filled (signed-zero inputs).
  std::function<void(bf16* row, int request, int pos)> edit_row;
};

/// Signed-zero counters of one step (SPEC §4 "Signed zero"): elements where the CPU reference gives
/// an exact ±0 and the GPU was held to the same bits.
struct ZeroCounts {
  long index_k_neg = 0, index_k_pos = 0, q_neg = 0, iq_neg = 0, summary_neg = 0, summary_pos = 0, tail_neg = 0,
       scores_zero = 0, scores_zero_negw = 0;
};

/// Runs one step on the GPU and the CPU reference and compares every output.
StepOut run_step(World& w, const std::vector<int>& q_lens, const StepOptions& opt, ZeroCounts* zc = nullptr) {
  ZeroCounts zdummy;
  ZeroCounts& z0 = zc ? *zc : zdummy;
  const int B = w.NR;
  std::vector<std::int32_t> cu(static_cast<std::size_t>(B) + 1, 0), seq(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    cu[b + 1] = cu[b] + q_lens[b];
    seq[b] = w.past[b] + q_lens[b];
  }
  const int T = cu[B];
  const std::string ctx = w.name + " step(T=" + std::to_string(T) + ", topk=" + std::to_string(opt.topk) + ")";
  std::vector<bf16> C(static_cast<std::size_t>(T) * w.ldc);
  StepOut out;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < q_lens[b]; ++i) {
      fill_c_row(C.data() + static_cast<std::size_t>(cu[b] + i) * w.ldc, w.rank.rows_with_w, b, w.past[b] + i, w.seed);
      if (opt.edit_row) opt.edit_row(C.data() + static_cast<std::size_t>(cu[b] + i) * w.ldc, b, w.past[b] + i);
      out.positions.push_back(w.past[b] + i);
      out.requests.push_back(b);
    }
  // ---- GPU
  auto* d_cu = dalloc<std::int32_t>(cu.size());
  auto* d_seq = dalloc<std::int32_t>(seq.size());
  auto* d_c = dalloc<bf16>(C.size());
  up(d_cu, cu);
  up(d_seq, seq);
  up(d_c, C);
  const std::size_t nq = static_cast<std::size_t>(T) * w.Hl * w.D, niq = static_cast<std::size_t>(T) * w.Il * w.P;
  auto* d_q = dalloc<bf16>(nq);
  auto* d_iq = dalloc<std::uint8_t>(niq);
  auto* d_w = dalloc<float>(static_cast<std::size_t>(T) * w.Il);
  auto* d_ik = dalloc<bf16>(static_cast<std::size_t>(T) * w.P);
  const std::size_t nids = static_cast<std::size_t>(w.lg) * T * (opt.topk + 1);
  auto* d_ids = dalloc<std::int32_t>(nids);
  auto* d_cnt = dalloc<std::int32_t>(static_cast<std::size_t>(w.lg) * T);
  GPU_CHECK(cudaMemset(d_q, 0x7b, nq * 2));
  GPU_CHECK(cudaMemset(d_iq, kPoisonU8, niq));
  GPU_CHECK(cudaMemset(d_w, 0x7b, static_cast<std::size_t>(T) * w.Il * 4));
  GPU_CHECK(cudaMemset(d_ik, 0x7b, static_cast<std::size_t>(T) * w.P * 2));
  const int ws_tokens = opt.ws_tokens > 0 ? opt.ws_tokens : std::max(T, 1);
  const std::size_t ws_bytes = step5::ops::indexer_select_workspace_bytes(w.rank, ws_tokens, w.max_seq_len, B);
  auto* d_ws = dalloc<char>(ws_bytes);
  const step5::ops::IndexerBatch batch{d_cu, d_seq, B, T, cu.data(), seq.data()};

  step5::ops::IndexerPrepareParams pp;
  pp.rank = w.rank;
  pp.eps = w.eps;
  pp.batch = batch;
  pp.table = w.dtable();
  pp.c = d_c;
  pp.ldc = w.ldc;
  pp.q_norm = w.d_qn;
  pp.k_norm = w.d_kn;
  pp.index_q_norm = w.d_iqn;
  pp.index_k_norm_w = w.d_ikw;
  pp.index_k_norm_b = w.d_ikb;
  pp.cos_main = w.d_cm;
  pp.sin_main = w.d_sm;
  pp.cos_idx = w.d_ci;
  pp.sin_idx = w.d_si;
  pp.max_position = w.rope_main.max_position;
  pp.q_out = d_q;
  pp.k_cache = w.d_kc;
  pp.v_cache = w.d_vc;
  pp.index_q = d_iq;
  pp.weights = d_w;
  pp.index_k = d_ik;
  if (opt.fold) pp.summaries = {w.d_sum, w.d_tail, w.d_ts, w.num_slots};
  if (opt.prepare_launches != nullptr) {  // captured, not run
    cudaStream_t cs = nullptr;
    GPU_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    GPU_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    const step5::Status cst = step5::ops::indexer_prepare(pp, cs);
    cudaGraph_t graph = nullptr;
    GPU_CHECK(cudaStreamEndCapture(cs, &graph));
    EXPECT(cst.ok(), "%s indexer_prepare (captured): %s", ctx.c_str(), cst.to_string().c_str());
    std::size_t nodes = 0;
    GPU_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    *opt.prepare_launches = static_cast<int>(nodes);
    GPU_CHECK(cudaGraphDestroy(graph));
    GPU_CHECK(cudaStreamDestroy(cs));
  }
  step5::Status st = step5::ops::indexer_prepare(pp, nullptr);
  EXPECT(st.ok(), "%s indexer_prepare: %s", ctx.c_str(), st.to_string().c_str());

  step5::ops::IndexerSummaryParams sp;
  sp.rank = w.rank;
  sp.batch = batch;
  sp.table = w.dtable();
  sp.index_k = d_ik;
  sp.c = d_c;
  sp.ldc = w.ldc;
  sp.summary_cache = w.d_sum;
  sp.tail = w.d_tail;
  sp.tail_slot = w.d_ts;
  sp.num_slots = w.num_slots;
  const step5::Status st2 = opt.fold ? step5::Status::Ok() : step5::ops::indexer_summaries(sp, nullptr);
  EXPECT(st2.ok(), "%s indexer_summaries: %s", ctx.c_str(), st2.to_string().c_str());

  step5::ops::IndexerSelectParams se;
  se.rank = w.rank;
  se.batch = batch;
  se.table = w.dtable();
  se.index_q = d_iq;
  se.weights = d_w;
  se.summary_cache = w.d_sum;
  se.topk = opt.topk;
  se.max_seq_len = w.max_seq_len;
  se.topk_ids = d_ids;
  se.counts = d_cnt;
  se.workspace = d_ws;
  se.workspace_bytes = ws_bytes;
  for (int rep = 0; rep < opt.repeats; ++rep) {
    GPU_CHECK(cudaMemset(d_ids, 0x7b, nids * 4));
    GPU_CHECK(cudaMemset(d_cnt, 0x7b, static_cast<std::size_t>(w.lg) * T * 4));
    const step5::Status st3 = step5::ops::indexer_select(se, nullptr);
    EXPECT(st3.ok(), "%s indexer_select: %s", ctx.c_str(), st3.to_string().c_str());
    GPU_CHECK(cudaDeviceSynchronize());
    auto ids = down(d_ids, nids);
    auto counts = down(d_cnt, static_cast<std::size_t>(w.lg) * T);
    if (rep == 0) {
      out.ids = ids;
      out.counts = counts;
    } else if (ids != out.ids || counts != out.counts) {
      EXPECT(false, "%s: selection differs at repeat %d", ctx.c_str(), rep);
      break;
    }
  }
  const auto g_q = down(d_q, nq);
  const auto g_iq = down(d_iq, niq);
  const auto g_w = down(d_w, static_cast<std::size_t>(T) * w.Il);
  const auto g_ik = down(d_ik, static_cast<std::size_t>(T) * w.P);
  const auto g_kc = down(w.d_kc, w.k_cache.size());
  const auto g_vc = down(w.d_vc, w.v_cache.size());
  const auto g_tail = down(w.d_tail, w.tail.size());
  const auto g_sum = down(w.d_sum, w.summary.size());
  // the launcher's workspace layout (step5/ops/indexer.hpp): plan, then scores of row stride ld
  const std::int64_t ld = step5::ops::detail::score_ld(w.max_seq_len);
  const std::size_t ws_fixed = step5::ops::detail::plan_bytes(B);
  std::vector<float> g_scores;
  const bool one_chunk = ws_tokens >= T;
  if (one_chunk && T > 0)
    g_scores = down(reinterpret_cast<const float*>(d_ws + ws_fixed), static_cast<std::size_t>(T) * w.lg * ld);

  if (opt.reference && T > 0) {
    // ---- CPU reference chain
    const ref::BatchView bv{B, cu.data(), seq.data()};
    const auto pos = ref::token_positions(bv);
    const auto& r = w.rank;
    std::vector<bf16> q_ref(nq), k_ref(static_cast<std::size_t>(T) * w.KVl * w.D);
    ref::prepare_main_qk(T, w.Hl, w.KVl, w.D, C.data() + r.shard(step5::layout::Shard::kQ).dst_row, w.ldc,
                         C.data() + r.shard(step5::layout::Shard::kK).dst_row, w.ldc, w.q_norm.data(), w.k_norm.data(),
                         w.eps, w.rope_main, pos.data(), q_ref.data(), k_ref.data());
    ref::write_kv_cache(bv, w.table(), w.KVl, w.D, k_ref.data(), w.KVl * w.D,
                        C.data() + r.shard(step5::layout::Shard::kV).dst_row, w.ldc, w.k_cache.data(), w.v_cache.data());
    std::vector<std::uint8_t> iq_ref(niq);
    std::vector<bf16> iq_bf16_ref(niq);
    std::vector<bf16> ik_ref(static_cast<std::size_t>(T) * w.P), iz_ref(ik_ref.size());
    std::vector<float> w_ref(static_cast<std::size_t>(T) * w.Il);
    ref::prepare_indexer(T, w.Il, w.hpg, w.P, C.data() + r.shard(step5::layout::Shard::kIndexQ).dst_row, w.ldc,
                         C.data() + r.shard(step5::layout::Shard::kIndexK).dst_row, w.ldc,
                         C.data() + r.shard(step5::layout::Shard::kIndexZ).dst_row, w.ldc,
                         C.data() + r.indexer_w.dst_row, w.ldc, w.iq_norm.data(), w.ik_w.data(), w.ik_b.data(), w.eps,
                         w.rope_idx, pos.data(), iq_bf16_ref.data(), iq_ref.data(), ik_ref.data(), iz_ref.data(), w_ref.data());
    std::vector<ref::CompletedRegion> completed;
    ref::update_summaries(bv, w.table(), w.P, ik_ref.data(), w.P, iz_ref.data(), w.P, w.tail.data(), w.num_slots,
                          w.tail_slot.data(), w.summary.data(), &completed);
    // ---- signed zero (SPEC §4 "Signed zero"): wherever the reference gives an exact ±0 (decided by
    // sign rules, not by rounding), the GPU gives the same bits
    {
      long bad = 0;
      auto is_zero16 = [](bf16 v) { return (v.bits & 0x7fffu) == 0; };
      for (std::size_t i = 0; i < ik_ref.size(); ++i)
        if (is_zero16(ik_ref[i])) {
          bad += g_ik[i].bits != ik_ref[i].bits;
          (ik_ref[i].bits ? z0.index_k_neg : z0.index_k_pos)++;
        }
      for (std::size_t i = 0; i < q_ref.size(); ++i)
        if (is_zero16(q_ref[i])) {
          bad += g_q[i].bits != q_ref[i].bits;
          z0.q_neg += q_ref[i].bits != 0;
        }
      for (std::size_t i = 0; i < niq; ++i)
        if (is_zero16(iq_bf16_ref[i])) {
          bad += g_iq[i] != iq_ref[i];
          z0.iq_neg += iq_ref[i] == 0x80;
        }
      for (std::size_t i = 0; i < w.tail.size(); ++i)
        if (is_zero16(w.tail[i])) {
          bad += g_tail[i].bits != w.tail[i].bits;
          z0.tail_neg += w.tail[i].bits != 0;
        }
      for (const auto& cr : completed) {
        const std::size_t off = ref::summary_offset(w.table(), cr.request, cr.region, w.P);
        for (int d = 0; d < w.P; ++d)
          if (cr.s_fp32[static_cast<std::size_t>(d)] == 0.0f) {
            bad += g_sum[off + d] != w.summary[off + d];
            (w.summary[off + d] == 0x80 ? z0.summary_neg : z0.summary_pos)++;
          }
      }
      EXPECT(bad == 0, "%s: %ld exact-zero elements (index_k, q, index_q, tail, summaries) differ in sign from the "
             "CPU reference", ctx.c_str(), bad);
    }
    // ---- compare preparation and caches
    auto as_float = [](const std::vector<bf16>& v) {
      std::vector<float> f(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) f[i] = step5::to_float(v[i]);
      return f;
    };
    const double eq = step5_test::rel_error(as_float(g_q), as_float(q_ref));
    EXPECT(eq <= 1e-2, "%s q_out rel error %.3g", ctx.c_str(), eq);
    std::vector<float> giq(niq), riq(niq);
    for (std::size_t i = 0; i < niq; ++i) {
      giq[i] = step5::e4m3_bits_to_float(g_iq[i]);
      riq[i] = step5::e4m3_bits_to_float(iq_ref[i]);
    }
    const double eiq = step5_test::rel_error(giq, riq);
    EXPECT(eiq <= 2e-2, "%s index_q (e4m3) rel error %.3g", ctx.c_str(), eiq);
    EXPECT(g_w == w_ref, "%s weights differ from float(w) * hpg_i^-0.5", ctx.c_str());
    const double eik = step5_test::rel_error(as_float(g_ik), as_float(ik_ref));
    EXPECT(eik <= 1e-2, "%s index_k rel error %.3g", ctx.c_str(), eik);
    compare_cache_bf16(g_kc, w.k_cache, 1e-2, "k_cache", ctx);
    compare_cache_bf16(g_vc, w.v_cache, 0.0, "v_cache", ctx);
    compare_cache_bf16(g_tail, w.tail, 1e-2, "tail", ctx);
    compare_cache_e4m3(g_sum, w.summary, 3e-2, "summary_cache", ctx);

    // ---- scores from the GPU's own inputs, selections
    std::vector<float> rs(static_cast<std::size_t>(w.lg) * T * ld);
    ref::compute_scores(bv, w.table(), w.lg, w.hpg, w.P, g_iq.data(), g_w.data(), g_sum.data(), rs.data(),
                        static_cast<int>(ld));
    int bad_rows = 0, tie_rows = 0, score_bad = 0;
    double num = 0, den = 0;
    for (int g = 0; g < w.lg; ++g)
      for (int t = 0; t < T; ++t) {
        const int n = pos[t] / kR;
        const float* rrow = rs.data() + (static_cast<std::size_t>(g) * T + t) * ld;
        const std::int32_t* grow = out.ids.data() + (static_cast<std::size_t>(g) * T + t) * (opt.topk + 1);
        const int gcount = out.counts[static_cast<std::size_t>(g) * T + t];
        if (!g_scores.empty()) {
          const float* gs = g_scores.data() + (static_cast<std::size_t>(t) * w.lg + g) * ld;
          float rmax = 0.f;
          for (int i = 0; i < n; ++i) rmax = std::max(rmax, std::abs(rrow[i]));
          for (int i = 0; i < n; ++i) {
            num += double(gs[i] - rrow[i]) * double(gs[i] - rrow[i]);
            den += double(rrow[i]) * rrow[i];
            if (!(std::abs(gs[i] - rrow[i]) <= 1e-3f * rmax + 1e-30f)) ++score_bad;
            if (gs[i] == 0.0f) {  // a zero score is +0 (SPEC §4 "Signed zero"), as the reference's
              ++z0.scores_zero;
              EXPECT(std::bit_cast<std::uint32_t>(gs[i]) == 0u && (rrow[i] != 0.0f || std::bit_cast<std::uint32_t>(rrow[i]) == 0u),
                     "%s score (g %d, t %d, r %d) is a zero of the wrong sign: gpu %08x, cpu %08x", ctx.c_str(), g, t,
                     i, std::bit_cast<std::uint32_t>(gs[i]), std::bit_cast<std::uint32_t>(rrow[i]));
              bool allneg = true;
              for (int h = 0; h < w.hpg; ++h) allneg = allneg && g_w[static_cast<std::size_t>(t) * w.Il + g * w.hpg + h] < 0.f;
              z0.scores_zero_negw += allneg;
            }
          }
          std::vector<std::int32_t> own(static_cast<std::size_t>(opt.topk + 1));
          const int oc = ref::select_row(gs, n, opt.topk, n, own.data());
          EXPECT(oc == gcount && std::equal(own.begin(), own.end(), grow),
                 "%s row (g %d, t %d, pos %d): GPU selection != reference selection of the GPU's own scores",
                 ctx.c_str(), g, t, pos[t]);
        }
        if (!judge_row(rrow, n, opt.topk, grow, gcount, &tie_rows)) ++bad_rows;
      }
    if (!g_scores.empty()) {
      const double es = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
      EXPECT(es <= 1e-4 && score_bad == 0, "%s scores: rel error %.3g, %d elements off by > 1e-3 of the row max",
             ctx.c_str(), es, score_bad);
    }
    EXPECT(bad_rows == 0, "%s: %d selection rows differ beyond ties within rounding", ctx.c_str(), bad_rows);
    std::printf("  %s: %d rows, %d tolerated ties at the k-th place\n", ctx.c_str(), w.lg * T, tie_rows);
  }
  for (void* p : std::initializer_list<void*>{d_cu, d_seq, d_c, d_q, d_iq, d_w, d_ik, d_ids, d_cnt, d_ws})
    GPU_CHECK(cudaFree(p));
  for (int b = 0; b < B; ++b) w.past[b] += q_lens[b];
  return out;
}

}  // namespace

GPU_CASE("indexer: full path vs reference, mixed prefill/decode/MTP steps, every geometry x every listed tp") {
  for (const auto& e : step5::layout::kGeometries) {
    for (int i = 0; i < e.num_tp_values; ++i) {  // the tp values of the row in geometries.def
      const int tp = e.tp_values[i];
      // every other tp uses block_size 24: pages of 3 regions, so score CTAs and chunks start mid-page
      World w(e, tp, tp - 1, 6, sz(2048, 256), 11, i % 2 == 1 ? 24 : 16);
      StepOptions o;
      o.topk = sz(16, 4);  // quick: smaller topk, so that the short histories still need a selection
      run_step(w, {sz(300, 100), 45, sz(1003, 97), sz(203, 23), 7, 0}, o);  // prefill (request 5 idle)
      o.topk = sz(64, 8);
      o.ws_tokens = 5;  // several score chunks
      run_step(w, {1, 77, 1, 3, 1, 64}, o);        // decode, chunk with pending tail, MTP, new prefill
      o.topk = 3;
      o.ws_tokens = 0;
      o.repeats = sz(100, 5);
      run_step(w, {4, 1, 0, 1, 9, 1}, o);          // repeated selections must be bit-identical
    }
  }
}

GPU_CASE("indexer: decode batches of 33, 257 (tp 1) and 1024 (tp 8) requests, mixed histories, some empty") {
  // Engine-sized decode steps: more requests than one warp (32: the attention planner's loop) and
  // than one CTA (256: the plan kernel's scan over requests; the score tiles' and the selection's
  // binary search over requests). Requests: q_len 0 (empty), 1 (decode) or 2-4 (MTP); history
  // none, short (< topk regions: everything selected), or long (> topk regions: a strict subset),
  // given as random summaries / pending tail rows (World::random_history). Two steps, so regions
  // complete from the tail at different steps per request.
  // Quick: 33 requests at tp 1 and 257 at tp 8, histories up to 600 instead of 3000 positions.
  struct Size {
    int requests, tp;
  };
  std::vector<Size> sizes = {{33, 1}, {257, 1}, {1024, 8}};
  if (step5_test::quick()) sizes = {{33, 1}, {257, 8}};
  for (const auto& e : step5::layout::kGeometries)
    for (const Size& z : sizes) {
      std::mt19937 rng(static_cast<std::uint32_t>(z.requests * 17 + z.tp));
      const int long_max = sz(3000, 600), topk = sz(64, 16);
      std::vector<int> hist(static_cast<std::size_t>(z.requests)), step1(hist.size()), step2(hist.size());
      for (int b = 0; b < z.requests; ++b) {
        const int kind = static_cast<int>(rng() % 4);
        hist[b] = kind == 0 ? 0 : kind == 1 ? static_cast<int>(rng() % 60) + 1
                : kind == 2 ? static_cast<int>(rng() % 300) + 100 : kR * topk + 1 + static_cast<int>(rng() % (long_max - kR * topk));
        const int q = static_cast<int>(rng() % 12);
        step1[b] = q == 0 ? 0 : q == 1 ? 2 + static_cast<int>(rng() % 3) : 1;  // empty / MTP / decode
        step2[b] = b % 9 == 4 ? 0 : 1;
      }
      std::vector<int> cap(hist.size());
      for (int b = 0; b < z.requests; ++b) cap[b] = hist[b] + step1[b] + step2[b];
      World w(e, z.tp, 0, z.requests, *std::max_element(cap.begin(), cap.end()), 23, 16, cap);
      w.random_history(hist);
      StepOptions o;
      o.topk = topk;
      run_step(w, step1, o);
      o.ws_tokens = 7;  // several score chunks in the second step
      run_step(w, step2, o);
    }
}

GPU_CASE("indexer: step 4 inside indexer_prepare (decode fold): caches bit-identical to indexer_summaries and vs reference over 12 decode steps, every geometry x tp, block sizes 16 and 24, idle requests, tail slots out of range; other steps take the summaries launch") {
  // Two worlds built alike; every step runs on both, world A with IndexerPrepareParams::summaries
  // (decode steps: the fold; mixed steps: indexer_prepare's own summaries launch), world B with
  // indexer_prepare + indexer_summaries. Both are compared with the CPU reference inside run_step,
  // then with each other bit for bit (summary cache, tail buffer, KV caches, selections). 12 decode
  // steps put every request's position through every residue mod 8 (regions completing from 7
  // tail rows, rows appended at every tail row); histories 0, 5, 7, 8, 63 and 200 positions; one
  // request idle in some steps. Then a mixed step (prefill + MTP + decode: not folded). Last, a
  // tail slot outside [0, num_slots) (no reference: it refuses one): the fold must skip the tail
  // write and the summary of a region that needs the slot's rows exactly as the summaries kernel
  // does (both leave the bytes alone).
  int dev = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  EXPECT(step5::device_sm_count(dev, &sms).ok() && sms > 0, "device_sm_count");
  for (const auto& e : step5::layout::kGeometries)
    for (int i = 0; i < e.num_tp_values; ++i) {
      const int tp = e.tp_values[i], bs = i % 2 == 1 ? 24 : 16;
      const std::vector<int> hist = {0, 5, 7, 8, 63, 200};
      // request 5: 200 + 12 decode steps + 9 (mixed step) + 8 decode steps
      const int nr = static_cast<int>(hist.size()), max_seq = 200 + 12 + 9 + 8;
      World wa(e, tp, tp - 1, nr, max_seq, 31, bs), wb(e, tp, tp - 1, nr, max_seq, 31, bs);
      wa.random_history(hist);
      wb.random_history(hist);
      const std::string base = wa.name + " block_size " + std::to_string(bs);
      auto same_state = [&](const std::string& what, const StepOut& oa, const StepOut& ob) {
        EXPECT(same_bits(down(wa.d_sum, wa.summary.size()), down(wb.d_sum, wb.summary.size())),
               "%s %s: summary cache differs between the fold and indexer_summaries", base.c_str(), what.c_str());
        EXPECT(same_bits(down(wa.d_tail, wa.tail.size()), down(wb.d_tail, wb.tail.size())),
               "%s %s: tail buffer differs between the fold and indexer_summaries", base.c_str(), what.c_str());
        EXPECT(same_bits(down(wa.d_kc, wa.k_cache.size()), down(wb.d_kc, wb.k_cache.size())) &&
                   same_bits(down(wa.d_vc, wa.v_cache.size()), down(wb.d_vc, wb.v_cache.size())),
               "%s %s: KV cache differs", base.c_str(), what.c_str());
        EXPECT(oa.ids == ob.ids && oa.counts == ob.counts, "%s %s: selections differ", base.c_str(), what.c_str());
      };
      StepOptions fa, fb;
      fa.topk = fb.topk = 4;
      fa.fold = true;
      for (int step = 0; step < 12; ++step) {
        std::vector<int> q(static_cast<std::size_t>(nr), 1);
        if (step % 3 == 1) q[static_cast<std::size_t>(step % nr)] = 0;  // an idle request
        std::vector<std::int32_t> cu(q.size() + 1, 0);
        for (int b = 0; b < nr; ++b) cu[b + 1] = cu[b] + q[b];
        const step5::ops::IndexerBatch hb{nullptr, nullptr, nr, cu[nr], cu.data(), nullptr};
        EXPECT(step5::ops::indexer_prepare_folds_summaries(hb, sms), "%s step %d: a decode step is not folded",
               base.c_str(), step);
        int launches = 0;
        fa.prepare_launches = &launches;
        const StepOut oa = run_step(wa, q, fa), ob = run_step(wb, q, fb);
        fa.prepare_launches = nullptr;
        EXPECT(launches == 1, "%s step %d: indexer_prepare with step 4 made %d launches, expected 1 (folded)",
               base.c_str(), step, launches);
        same_state("decode step " + std::to_string(step), oa, ob);
      }
      const std::vector<int> mixed = {3, 1, 0, 2, 1, 9};
      std::vector<std::int32_t> cu(mixed.size() + 1, 0);
      for (int b = 0; b < nr; ++b) cu[b + 1] = cu[b] + mixed[b];
      const step5::ops::IndexerBatch hb{nullptr, nullptr, nr, cu[nr], cu.data(), nullptr};
      EXPECT(!step5::ops::indexer_prepare_folds_summaries(hb, sms), "%s: a mixed step is folded", base.c_str());
      int launches = 0;
      fa.prepare_launches = &launches;
      const StepOut ma = run_step(wa, mixed, fa), mb = run_step(wb, mixed, fb);
      EXPECT(launches == 2, "%s mixed step: indexer_prepare with step 4 made %d launches, expected 2 (its "
             "summaries launch)", base.c_str(), launches);
      same_state("mixed step", ma, mb);
      // Inputs the reference refuses or cannot compare (not run; the two worlds must agree bit for
      // bit): request 2's tail slot outside [0, num_slots); request 0's block-table row outside
      // [0, num_blocks) (its KV rows and summaries are skipped, its tail rows still written); raw z
      // of NaN, +Inf, -Inf, -Inf on proxy dims 0..3 in every third position (the block max and the
      // e^(z - m) terms).
      for (World* w : {&wa, &wb}) {
        w->tail_slot[2] = w->num_slots + 3;
        up(w->d_ts, w->tail_slot);
        for (int j = 0; j < w->max_blocks; ++j) w->block_table[static_cast<std::size_t>(j)] = w->num_blocks + 7;
        up(w->d_bt, w->block_table);
      }
      const int col_z = wa.rank.shard(step5::layout::Shard::kIndexZ).dst_row;
      fa.edit_row = fb.edit_row = [col_z](bf16* row, int, int pos) {
        if (pos % 3 != 0) return;
        const float v[4] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
        for (int d = 0; d < 4; ++d) row[col_z + d] = step5::to_bf16(v[d]);
      };
      fa.reference = fb.reference = false;
      for (int step = 0; step < 8; ++step) {
        const std::vector<int> q(static_cast<std::size_t>(nr), 1);
        const StepOut oa = run_step(wa, q, fa), ob = run_step(wb, q, fb);
        EXPECT(launches == 1, "%s bad-input step %d: %d launches, expected 1", base.c_str(), step, launches);
        same_state("bad inputs, step " + std::to_string(step), oa, ob);
      }
    }
}

GPU_CASE("indexer: signed zero as the CPU reference (index_k LayerNorm, q norms, e4m3, tail, summaries also folded into indexer_prepare, scores)") {
  // SPEC §4 "Signed zero", issue 12 §2. Fresh random rows, plus: proxy dims 40..42 get LayerNorm
  // weight +0 and bias -0, so index_k there is -0 where x < mean and +0 where x > mean; raw x is
  // -6 on dim 40 (all -0: summary byte 0x80), ±6 on dim 41 (mixed: 0x00), +6 on dim 42 (all +0);
  // one token's raw index_k row is all -0 (LayerNorm mean -0); the last dim of every main q and
  // indexer q head is raw -0 (outside the rotated dims). Every exact zero is compared bit for bit
  // inside run_step; here we check that each kind actually occurred.
  for (const auto& e : step5::layout::kGeometries) {
    World w(e, 1, 0, 3, 256, 13);
    for (int d : {40, 41, 42}) {
      w.ik_w[static_cast<std::size_t>(d)] = 0.0f;
      w.ik_b[static_cast<std::size_t>(d)] = -0.0f;
    }
    up(w.d_ikw, w.ik_w);
    up(w.d_ikb, w.ik_b);
    const auto& r = w.rank;
    const int col_ik = r.shard(step5::layout::Shard::kIndexK).dst_row;
    const int col_iq = r.shard(step5::layout::Shard::kIndexQ).dst_row;
    const int col_q = r.shard(step5::layout::Shard::kQ).dst_row;
    StepOptions o;
    o.topk = 4;
    o.edit_row = [&](bf16* row, int request, int pos) {
      row[col_ik + 40] = step5::to_bf16(-6.0f);
      row[col_ik + 41] = step5::to_bf16(pos % 3 == 0 ? 6.0f : -6.0f);
      row[col_ik + 42] = step5::to_bf16(6.0f);
      if (request == 0 && pos == 13)
        for (int d = 0; d < w.P; ++d) row[col_ik + d] = bf16{0x8000};
      for (int h = 0; h < w.Hl; ++h) row[col_q + h * w.D + w.D - 1] = bf16{0x8000};
      for (int h = 0; h < w.Il; ++h) row[col_iq + h * w.P + w.P - 1] = bf16{0x8000};
    };
    ZeroCounts zc;
    run_step(w, {21, 16, 5}, o, &zc);  // request 2 leaves 5 rows in its tail
    run_step(w, {1, 1, 3}, o, &zc);    // request 2 completes region 0 from 5 tail rows + 3 new rows
    std::printf("  %s signed zero: index_k -0 %ld / +0 %ld, q -0 %ld, index_q 0x80 %ld, tail -0 %ld, summary 0x80 %ld / "
                "0x00 %ld, zero scores %ld (%ld with all weights negative)\n",
                w.name.c_str(), zc.index_k_neg, zc.index_k_pos, zc.q_neg, zc.iq_neg, zc.tail_neg, zc.summary_neg,
                zc.summary_pos, zc.scores_zero, zc.scores_zero_negw);
    EXPECT(zc.index_k_neg > 0 && zc.index_k_pos > 0 && zc.q_neg > 0 && zc.iq_neg > 0 && zc.tail_neg > 0,
           "%s: the signed-zero inputs did not reach every place", w.name.c_str());
    // 5 regions complete in the two steps. Dim 40 is -0 in every row but one: request 0's all-(-0)
    // row (position 13) gives LayerNorm (-0 - (-0)) * rstd * (+0) + (-0) = +0 there, so region 1
    // of request 0 is mixed (+0 summary): 4 summaries 0x80 at dim 40, and +0 at dims 41 and 42 of
    // all 5 regions plus dim 40 of that one (11; a random dim may add a 0x00).
    EXPECT(zc.summary_neg >= 4 && zc.summary_pos >= 2 * 5 + 1,
           "%s: expected -0 summaries at dim 40 of 4 regions, +0 at dims 41, 42 of every region (got %ld, %ld)",
           w.name.c_str(), zc.summary_neg, zc.summary_pos);
    EXPECT(zc.scores_zero > 0, "%s: no zero score occurred", w.name.c_str());
    // 10 decode steps (positions 22..31, 17..26, 8..17) with step 4 folded into indexer_prepare:
    // 4 more regions complete there (request 0 at positions 23 and 31, request 1 at 23, request 2
    // at 15), each -0 at dim 40
    const long neg_before = zc.summary_neg;
    o.fold = true;
    for (int s = 0; s < 10; ++s) run_step(w, {1, 1, 1}, o, &zc);
    EXPECT(zc.summary_neg >= neg_before + 4, "%s: folded summaries: expected 4 more -0 summaries at dim 40, got %ld",
           w.name.c_str(), zc.summary_neg - neg_before);
  }
}

GPU_CASE("indexer: chunked prefill equals one-shot (caches and selections bit-identical)") {
  const auto& e = step5::layout::kGeometries[0];
  World a(e, 1, 0, 2, sz(1024, 256), 5), b(e, 1, 0, 2, sz(1024, 256), 5);
  StepOptions o;
  o.topk = 8;
  o.reference = false;
  const StepOut one = run_step(a, {sz(200, 100), 61}, o);
  std::vector<StepOut> parts;
  // every part's mean query length (2 requests) stays >= kScoreWgmmaMinMeanQ, so the parts and the
  // one-shot step run the same score kernel (wgmma f16; mma.sync would differ in a few low bits)
  static_assert(step5::ops::detail::kScoreWgmmaMinMeanQ <= 16, "the chunk sizes below assume kScoreWgmmaMinMeanQ <= 16");
  parts.push_back(run_step(b, {37, 20}, o));
  parts.push_back(run_step(b, {sz(100, 32), 41}, o));  // quick: 37 + 32 + 31 = 100
  parts.push_back(run_step(b, {sz(63, 31), 0}, o));
  EXPECT(down(a.d_sum, a.summary.size()) == down(b.d_sum, b.summary.size()), "summary caches differ");
  {  // pending tail rows (rows < seq_len % 8 of each request's slot; rows beyond are stale by definition)
    const auto ta = down(a.d_tail, a.tail.size()), tb = down(b.d_tail, b.tail.size());
    for (int r = 0; r < a.NR; ++r) {
      const std::size_t o = static_cast<std::size_t>(a.tail_slot[r]) * 16 * a.P;
      const std::size_t len = static_cast<std::size_t>(a.past[r] % kR) * 2 * a.P;
      EXPECT(a.past[r] == b.past[r] && std::memcmp(ta.data() + o, tb.data() + o, len * sizeof(bf16)) == 0,
             "pending tail rows of request %d differ", r);
    }
  }
  EXPECT(same_bits(down(a.d_kc, a.k_cache.size()), down(b.d_kc, b.k_cache.size())), "k caches differ");
  // map (request, position) -> selection rows
  const int lg = a.lg, w = o.topk + 1;
  const int T1 = static_cast<int>(one.positions.size());
  int compared = 0;
  for (const auto& part : parts) {
    const int T2 = static_cast<int>(part.positions.size());
    for (int t2 = 0; t2 < T2; ++t2) {
      int t1 = 0;
      while (t1 < T1 && !(one.requests[t1] == part.requests[t2] && one.positions[t1] == part.positions[t2])) ++t1;
      EXPECT(t1 < T1, "token not found");
      if (t1 >= T1) continue;
      for (int g = 0; g < lg; ++g) {
        const bool same =
            std::equal(one.ids.begin() + (static_cast<std::ptrdiff_t>(g) * T1 + t1) * w,
                       one.ids.begin() + (static_cast<std::ptrdiff_t>(g) * T1 + t1 + 1) * w,
                       part.ids.begin() + (static_cast<std::ptrdiff_t>(g) * T2 + t2) * w) &&
            one.counts[static_cast<std::size_t>(g) * T1 + t1] == part.counts[static_cast<std::size_t>(g) * T2 + t2];
        EXPECT(same, "selection of request %d position %d group %d differs", part.requests[t2], part.positions[t2], g);
        ++compared;
      }
    }
  }
  EXPECT(compared == lg * T1, "compared %d rows, expected %d", compared, lg * T1);
}

GPU_CASE("indexer: scores + selection at 1M tokens of context (131072 regions; quick: 16384), decode + MTP") {
  const auto& e = step5::layout::kGeometries[0];
  const int tp = 4;  // lg = 1 keeps the CPU reference affordable
  const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
  const int P = rl.geometry.proxy_dim, Il = rl.index_local_heads, lg = rl.local_kv_groups, hpg = rl.hpg_i;
  const int max_seq = sz(1 << 20, 1 << 17), block_size = 256, max_blocks = max_seq / block_size;
  const int B = 2;
  std::vector<std::int32_t> cu = {0, 1, 3}, seq = {max_seq, sz(100001, 12501)};
  const int T = 3;
  const int num_blocks = B * max_blocks;
  std::vector<std::int32_t> bt(static_cast<std::size_t>(num_blocks));
  std::iota(bt.begin(), bt.end(), 0);
  std::mt19937 rng(9);
  std::shuffle(bt.begin(), bt.end(), rng);
  std::vector<std::uint8_t> sum(static_cast<std::size_t>(num_blocks) * (block_size / kR) * P), iq(static_cast<std::size_t>(T) * Il * P);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : sum) x = step5::float_to_e4m3_bits(nd(rng));
  for (auto& x : iq) x = step5::float_to_e4m3_bits(nd(rng));
  std::vector<float> wts(static_cast<std::size_t>(T) * Il);
  for (auto& x : wts) x = nd(rng) * 0.5f;
  const int topk = 1024;
  auto* d_cu = dalloc<std::int32_t>(3); up(d_cu, cu);
  auto* d_seq = dalloc<std::int32_t>(2); up(d_seq, seq);
  auto* d_bt = dalloc<std::int32_t>(bt.size()); up(d_bt, bt);
  auto* d_sum = dalloc<std::uint8_t>(sum.size()); up(d_sum, sum);
  auto* d_iq = dalloc<std::uint8_t>(iq.size()); up(d_iq, iq);
  auto* d_w = dalloc<float>(wts.size()); up(d_w, wts);
  const std::size_t nids = static_cast<std::size_t>(lg) * T * (topk + 1);
  auto* d_ids = dalloc<std::int32_t>(nids);
  auto* d_cnt = dalloc<std::int32_t>(static_cast<std::size_t>(lg) * T);
  GPU_CHECK(cudaMemset(d_ids, 0x7b, nids * 4));
  GPU_CHECK(cudaMemset(d_cnt, 0x7b, static_cast<std::size_t>(lg) * T * 4));
  const std::size_t ws_bytes = step5::ops::indexer_select_workspace_bytes(rl, T, max_seq, B);
  auto* d_ws = dalloc<char>(ws_bytes);
  step5::ops::IndexerSelectParams se;
  se.rank = rl;
  se.batch = {d_cu, d_seq, B, T, cu.data(), seq.data()};
  se.table = {d_bt, max_blocks, block_size, num_blocks};
  se.index_q = d_iq;
  se.weights = d_w;
  se.summary_cache = d_sum;
  se.topk = topk;
  se.max_seq_len = max_seq;
  se.topk_ids = d_ids;
  se.counts = d_cnt;
  se.workspace = d_ws;
  se.workspace_bytes = ws_bytes;
  const step5::Status st = step5::ops::indexer_select(se, nullptr);
  EXPECT(st.ok(), "indexer_select: %s", st.to_string().c_str());
  GPU_CHECK(cudaDeviceSynchronize());
  const auto ids = down(d_ids, nids);
  const auto counts = down(d_cnt, static_cast<std::size_t>(lg) * T);
  const ref::BatchView bv{B, cu.data(), seq.data()};
  const ref::BlockTableView tv{bt.data(), max_blocks, block_size, num_blocks};
  const int ld = max_seq / kR;
  std::vector<float> rs(static_cast<std::size_t>(lg) * T * ld);
  ref::compute_scores(bv, tv, lg, hpg, P, iq.data(), wts.data(), sum.data(), rs.data(), ld);
  const auto pos = ref::token_positions(bv);
  int ties = 0;
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < lg; ++g) {
      const std::size_t row = static_cast<std::size_t>(g) * T + t;
      EXPECT(judge_row(rs.data() + row * ld, pos[t] / kR, topk, ids.data() + row * (topk + 1), counts[row], &ties),
             "long-context row (t %d, g %d, pos %d) differs beyond ties within rounding", t, g, pos[t]);
    }
  std::printf("  %d-token context: %d rows, %d tolerated ties\n", max_seq, lg * T, ties);
  for (void* p : std::initializer_list<void*>{d_ids, d_cnt, d_ws}) GPU_CHECK(cudaFree(p));
}

namespace {

/// How check_select_direct / check_scores_path fill the summaries and q: random e4m3 (N(0, 1)),
/// every summary equal (the scores of a row are all equal: the selection is decided by region id
/// alone), or small exact values ({0, ±0.5, ±1, ±1.5, ±2}: every dot is exact in any fp32
/// summation order and even in the ~14-bit e4m3 tensor-core accumulation, so the GPU scores must
/// equal the reference bit for bit).
enum class Inputs { kRandom, kAllEqual, kExact };

/// Directly given indexer_select inputs (host side) for q_lens / seq_lens per request.
struct DirectInputs {
  std::vector<std::int32_t> cu, seq, bt;
  std::vector<std::uint8_t> sum, iq;
  std::vector<float> wts;
  int B = 0, T = 0, max_seq = 1, block_size = 64, max_blocks = 1, num_blocks = 1;
};
DirectInputs make_direct_inputs(const step5::layout::RankLayout& rl, const std::vector<int>& q_lens,
                                const std::vector<int>& seq_lens, Inputs inputs, int block_size, std::mt19937& rng) {
  const int P = rl.geometry.proxy_dim, Il = rl.index_local_heads;
  DirectInputs d;
  d.B = static_cast<int>(q_lens.size());
  d.cu.assign(static_cast<std::size_t>(d.B) + 1, 0);
  d.seq.assign(seq_lens.begin(), seq_lens.end());
  for (int b = 0; b < d.B; ++b) d.cu[b + 1] = d.cu[b] + q_lens[b];
  d.T = d.cu[d.B];
  d.max_seq = std::max(1, *std::max_element(d.seq.begin(), d.seq.end()));
  d.block_size = block_size;
  d.max_blocks = (d.max_seq + block_size - 1) / block_size;
  d.num_blocks = d.B * d.max_blocks;
  d.bt.resize(static_cast<std::size_t>(d.num_blocks));
  std::iota(d.bt.begin(), d.bt.end(), 0);
  std::shuffle(d.bt.begin(), d.bt.end(), rng);
  d.sum.resize(static_cast<std::size_t>(d.num_blocks) * (block_size / kR) * P);
  d.iq.resize(static_cast<std::size_t>(std::max(d.T, 1)) * Il * P);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float small[9] = {0.f, 0.5f, -0.5f, 1.f, -1.f, 1.5f, -1.5f, 2.f, -2.f};
  auto value = [&]() { return inputs == Inputs::kExact ? small[rng() % 9] : nd(rng); };
  for (auto& x : d.iq) x = step5::float_to_e4m3_bits(value());
  if (inputs == Inputs::kAllEqual) {
    std::vector<std::uint8_t> one(static_cast<std::size_t>(P));
    for (auto& x : one) x = step5::float_to_e4m3_bits(std::abs(nd(rng)) + 0.25f);
    for (std::size_t i = 0; i < d.sum.size(); ++i) d.sum[i] = one[i % P];
  } else {
    for (auto& x : d.sum) x = step5::float_to_e4m3_bits(value());
  }
  d.wts.resize(static_cast<std::size_t>(std::max(d.T, 1)) * Il);
  for (auto& x : d.wts) x = nd(rng) * 0.5f;
  return d;
}

/// Device copies of directly given inputs `in` (freed on destruction) and the indexer_select
/// parameters over them (the caller sets topk, max_seq_len, outputs and workspace).
struct DirectDevice {
  const DirectInputs& in;
  std::int32_t* cu = dalloc<std::int32_t>(in.cu.size());
  std::int32_t* seq = dalloc<std::int32_t>(in.seq.size());
  std::int32_t* bt = dalloc<std::int32_t>(in.bt.size());
  std::uint8_t* sum = dalloc<std::uint8_t>(in.sum.size());
  std::uint8_t* iq = dalloc<std::uint8_t>(in.iq.size());
  float* w = dalloc<float>(in.wts.size());
  explicit DirectDevice(const DirectInputs& inputs) : in(inputs) {
    up(cu, in.cu), up(seq, in.seq), up(bt, in.bt), up(sum, in.sum), up(iq, in.iq), up(w, in.wts);
  }
  DirectDevice(const DirectDevice&) = delete;
  DirectDevice& operator=(const DirectDevice&) = delete;
  ~DirectDevice() {
    for (void* p : std::initializer_list<void*>{cu, seq, bt, sum, iq, w}) GPU_CHECK(cudaFree(p));
  }
  step5::ops::IndexerSelectParams select_params(const step5::layout::RankLayout& rl) const {
    step5::ops::IndexerSelectParams se;
    se.rank = rl;
    se.batch = {cu, seq, in.B, in.T, in.cu.data(), in.seq.data()};
    se.table = {bt, in.max_blocks, in.block_size, in.num_blocks};
    se.index_q = iq;
    se.weights = w;
    se.summary_cache = sum;
    return se;
  }
};

struct DirectOptions {
  Inputs inputs = Inputs::kRandom;
  int block_size = 64;
  int ws_tokens = 0;  ///< > 0: a workspace for this many tokens per score chunk (chunked scoring)
};

/// indexer_select on directly given inputs (make_direct_inputs) judged as run_step judges: the
/// GPU's scores (read from the workspace: the last score chunk's tokens) against the reference
/// scores of the same inputs within the same tolerance (bit for bit with Inputs::kExact), the GPU
/// selection equal to the reference selection of the GPU's own scores exactly (last chunk), and
/// every row against the reference scores up to ties within rounding at the k-th place
/// (judge_row). Outputs are poisoned first.
void check_select_direct(const step5::layout::GeometryEntry& e, int tp, const std::vector<int>& q_lens,
                         const std::vector<int>& seq_lens, int topk, DirectOptions opt, std::uint32_t seed,
                         const std::string& what) {
  const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
  const int P = rl.geometry.proxy_dim, lg = rl.local_kv_groups, hpg = rl.hpg_i;
  std::mt19937 rng(seed);
  const DirectInputs in = make_direct_inputs(rl, q_lens, seq_lens, opt.inputs, opt.block_size, rng);
  const int B = in.B, T = in.T, max_seq = in.max_seq;
  const DirectDevice dev_in(in);
  const std::size_t nids = static_cast<std::size_t>(lg) * T * (topk + 1);
  auto* d_ids = dalloc<std::int32_t>(std::max<std::size_t>(nids, 1));
  auto* d_cnt = dalloc<std::int32_t>(std::max<std::size_t>(static_cast<std::size_t>(lg) * T, 1));
  GPU_CHECK(cudaMemset(d_ids, 0x7b, std::max<std::size_t>(nids, 1) * 4));
  GPU_CHECK(cudaMemset(d_cnt, 0x7b, std::max<std::size_t>(static_cast<std::size_t>(lg) * T, 1) * 4));
  const int ws_tokens = opt.ws_tokens > 0 ? std::min(opt.ws_tokens, std::max(T, 1)) : T;
  const std::size_t ws_bytes = step5::ops::indexer_select_workspace_bytes(rl, ws_tokens, max_seq, B);
  auto* d_ws = dalloc<char>(ws_bytes);
  const std::int64_t ld = step5::ops::detail::score_ld(max_seq);
  const std::size_t ws_fixed = step5::ops::detail::plan_bytes(B);
  // the launcher's score chunks: the workspace holds the last one
  const step5::ops::SelectChunks chunks = step5::ops::indexer_select_chunks(rl, T, max_seq, B, ws_bytes);
  const int t_last = chunks.count > 0 ? chunks.begin(chunks.count - 1) : 0;
  const int chunk = std::max(1, T - t_last);  // tokens of the last chunk
  GPU_CHECK(cudaMemset(d_ws, 0x7f, ws_bytes));  // poison: unwritten scores read as NaN
  step5::ops::IndexerSelectParams se = dev_in.select_params(rl);
  se.topk = topk;
  se.max_seq_len = max_seq;
  se.topk_ids = d_ids;
  se.counts = d_cnt;
  se.workspace = d_ws;
  se.workspace_bytes = ws_bytes;
  const step5::Status st = step5::ops::indexer_select(se, nullptr);
  EXPECT(st.ok(), "%s: indexer_select: %s", what.c_str(), st.to_string().c_str());
  GPU_CHECK(cudaDeviceSynchronize());
  const auto ids = down(d_ids, nids);
  const auto counts = down(d_cnt, static_cast<std::size_t>(lg) * T);
  const auto gsc = down(reinterpret_cast<const float*>(d_ws + ws_fixed), static_cast<std::size_t>(chunk) * lg * ld);
  {
    // both selection algorithms (STEP5_TOPK: radix select, candidate compaction; kernels/sm90/
    // indexer_topk.cuh) give this run's ids and counts bit for bit (the scores are deterministic:
    // checked too, so that a difference is attributed to the right kernel)
    const char* env = std::getenv("STEP5_TOPK");
    const std::string saved = env != nullptr ? env : "";
    for (const char* algo : {"radix", "candidates"}) {
      setenv("STEP5_TOPK", algo, 1);
      GPU_CHECK(cudaMemset(d_ids, 0x7b, std::max<std::size_t>(nids, 1) * 4));
      GPU_CHECK(cudaMemset(d_cnt, 0x7b, std::max<std::size_t>(static_cast<std::size_t>(lg) * T, 1) * 4));
      const step5::Status st2 = step5::ops::indexer_select(se, nullptr);
      EXPECT(st2.ok(), "%s: indexer_select (STEP5_TOPK=%s): %s", what.c_str(), algo, st2.to_string().c_str());
      GPU_CHECK(cudaDeviceSynchronize());
      const auto gsc2 = down(reinterpret_cast<const float*>(d_ws + ws_fixed), gsc.size());
      EXPECT(std::memcmp(gsc.data(), gsc2.data(), gsc.size() * 4) == 0, "%s: scores changed between runs (STEP5_TOPK=%s)",
             what.c_str(), algo);
      EXPECT(down(d_ids, nids) == ids && down(d_cnt, static_cast<std::size_t>(lg) * T) == counts,
             "%s: STEP5_TOPK=%s selection differs from the default run's", what.c_str(), algo);
    }
    if (env != nullptr) setenv("STEP5_TOPK", saved.c_str(), 1);
    else unsetenv("STEP5_TOPK");
  }
  const ref::BatchView bv{B, in.cu.data(), in.seq.data()};
  const ref::BlockTableView tv{in.bt.data(), in.max_blocks, in.block_size, in.num_blocks};
  std::vector<float> rs(static_cast<std::size_t>(lg) * T * ld);
  ref::compute_scores(bv, tv, lg, hpg, P, in.iq.data(), in.wts.data(), in.sum.data(), rs.data(), static_cast<int>(ld));
  const auto pos = ref::token_positions(bv);
  int ties = 0, bad_rows = 0, own_bad = 0, score_bad = 0, exact_bad = 0, equal_rows = 0;
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < lg; ++g) {
      const int n = pos[t] / kR;
      const std::size_t row = static_cast<std::size_t>(g) * T + t;
      const float* rrow = rs.data() + row * ld;
      const std::int32_t* grow = ids.data() + row * (topk + 1);
      bad_rows += !judge_row(rrow, n, topk, grow, counts[row], &ties);
      if (t < t_last) continue;  // scores of earlier chunks are overwritten
      const float* gs = gsc.data() + (static_cast<std::size_t>(t - t_last) * lg + g) * ld;
      float rmax = 0.f;
      for (int i = 0; i < n; ++i) rmax = std::max(rmax, std::abs(rrow[i]));
      for (int i = 0; i < n; ++i) score_bad += !(std::abs(gs[i] - rrow[i]) <= 1e-3f * rmax + 1e-30f);
      if (opt.inputs == Inputs::kExact)
        for (int i = 0; i < n; ++i) exact_bad += std::bit_cast<std::uint32_t>(gs[i]) != std::bit_cast<std::uint32_t>(rrow[i]);
      std::vector<std::int32_t> own(static_cast<std::size_t>(topk + 1));
      const int oc = ref::select_row(gs, n, topk, n, own.data());
      own_bad += !(oc == counts[row] && std::equal(own.begin(), own.end(), grow));
      if (opt.inputs == Inputs::kAllEqual && n > 0) {
        // equal summaries: the GPU's scores of the row are bit-identical, and the lowest ids win
        bool same = true;
        for (int i = 1; i < n; ++i) same = same && std::bit_cast<std::uint32_t>(gs[i]) == std::bit_cast<std::uint32_t>(gs[0]);
        bool lowest = counts[row] == std::min(topk, n) + 1;
        for (int i = 0; lowest && i < std::min(topk, n); ++i) lowest = grow[i] == i;
        equal_rows += same && lowest;
        EXPECT(same && lowest, "%s row (t %d, g %d, n %d): equal summaries must give equal scores (%d) and ids 0.. (%d)",
               what.c_str(), t, g, n, int(same), int(lowest));
      }
    }
  EXPECT(score_bad == 0, "%s: %d scores off by > 1e-3 of the row max", what.c_str(), score_bad);
  EXPECT(exact_bad == 0, "%s: %d scores of exact inputs differ from the reference bit for bit", what.c_str(), exact_bad);
  EXPECT(own_bad == 0, "%s: %d rows where the GPU selection != reference selection of the GPU's own scores", what.c_str(),
         own_bad);
  EXPECT(bad_rows == 0, "%s: %d selection rows differ beyond ties within rounding", what.c_str(), bad_rows);
  std::printf("  %s: %d rows, %d tolerated ties%s\n", what.c_str(), lg * T, ties,
              opt.inputs == Inputs::kAllEqual ? (", " + std::to_string(equal_rows) + " all-equal rows by id").c_str() : "");
  for (void* p : std::initializer_list<void*>{d_ids, d_cnt, d_ws}) GPU_CHECK(cudaFree(p));
}

namespace detail_ns = step5::ops::detail;

/// The score kernel of `want` (ops::detail::score_plan / score_tile_starts / launch_scores, as
/// indexer_select launches them) on directly given inputs, token chunks of `chunk` tokens (t0 > 0
/// cuts requests and tiles), each chunk's scores compared with the reference: every column
/// r < p/8 within `tol` of the row max and the rms error within `rms_tol` (bit for bit with
/// Inputs::kExact), every column >= p/8 still the poison (nothing written past the history).
/// Checks that the plan took the path asked for. Returns the scores of columns r < p/8, in
/// (token, group, column) order, for comparisons between paths. `num_sms` > 0 plans for a GPU of
/// that many SMs instead of this one (longer region chunks per CTA); `regions_per_cta` > 0 (an
/// mma.sync plan) replaces the plan's region chunk (ops::detail::set_score_chunk); `plan_out`
/// receives the plan.
template <step5::layout::GeometryId Id>
std::vector<float> check_scores_path(int tp, const std::vector<int>& q_lens, const std::vector<int>& seq_lens, int chunk,
                       Inputs inputs, detail_ns::ScorePath want, int block_size, float tol, double rms_tol,
                       std::uint32_t seed, const std::string& what, int num_sms = 0,
                       detail_ns::ScorePlan* plan_out = nullptr, int regions_per_cta = 0) {
  const auto& e = step5::layout::entry_of(Id);
  const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
  const int P = rl.geometry.proxy_dim, lg = rl.local_kv_groups, hpg = rl.hpg_i, Il = rl.index_local_heads;
  std::mt19937 rng(seed);
  const DirectInputs in = make_direct_inputs(rl, q_lens, seq_lens, inputs, block_size, rng);
  const int B = in.B, T = in.T;
  const DirectDevice dev_in(in);
  auto* d_plan = dalloc<std::int32_t>(detail_ns::plan_bytes(B) / 4);
  const std::int64_t ld = detail_ns::score_ld(in.max_seq);
  const std::size_t nsc = static_cast<std::size_t>(chunk) * lg * ld;
  const std::size_t guard = static_cast<std::size_t>(lg) * ld;  // one token's rows past the workspace
  auto* d_sc = dalloc<float>(nsc + guard);
  step5::ops::IndexerSelectParams se = dev_in.select_params(rl);
  int dev = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  EXPECT(step5::device_sm_count(dev, &sms).ok(), "device_sm_count");
  if (num_sms > 0) sms = num_sms;
  detail_ns::ScorePlan sp = detail_ns::score_plan<Id>(Il, T, B, ld, block_size, sms, want);
  if (regions_per_cta > 0) detail_ns::set_score_chunk(sp, regions_per_cta, ld, block_size, P);
  if (plan_out) *plan_out = sp;
  EXPECT(sp.path == want, "%s: the plan took path %s, asked for %s", what.c_str(), detail_ns::score_path_name(sp.path),
         detail_ns::score_path_name(want));
  const std::int32_t* tile_start = nullptr;
  EXPECT(detail_ns::score_tile_starts(sp, dev_in.cu, B, d_plan, nullptr, &tile_start).ok(), "%s: score_tile_starts", what.c_str());
  const ref::BatchView bv{B, in.cu.data(), in.seq.data()};
  const ref::BlockTableView tv{in.bt.data(), in.max_blocks, in.block_size, in.num_blocks};
  std::vector<float> rs(static_cast<std::size_t>(lg) * T * ld);
  ref::compute_scores(bv, tv, lg, hpg, P, in.iq.data(), in.wts.data(), in.sum.data(), rs.data(), static_cast<int>(ld));
  const auto pos = ref::token_positions(bv);
  int bad = 0, exact_bad = 0, written_past = 0;
  std::size_t written_outside = 0;
  double num = 0, den = 0, worst = 0;
  std::vector<float> valid;
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int t1 = std::min(T, t0 + chunk);
    GPU_CHECK(cudaMemset(d_sc, 0x7f, (nsc + guard) * 4));  // poison, the guard rows too
    const step5::Status st =
        detail_ns::launch_scores<Id>(sp, detail_ns::score_args(se, tile_start, d_sc, ld, t0, t1), nullptr);
    EXPECT(st.ok(), "%s: launch_scores: %s", what.c_str(), st.to_string().c_str());
    GPU_CHECK(cudaDeviceSynchronize());
    const auto gsc = down(d_sc, nsc + guard);
    // rows of tokens outside [t0, t1) (a partial last chunk, the guard past the workspace): untouched
    for (std::size_t i = static_cast<std::size_t>(t1 - t0) * lg * ld; i < nsc + guard; ++i)
      written_outside += std::bit_cast<std::uint32_t>(gsc[i]) != 0x7f7f7f7fu;
    for (int t = t0; t < t1; ++t)
      for (int g = 0; g < lg; ++g) {
        const int n = pos[t] / kR;
        const float* rrow = rs.data() + (static_cast<std::size_t>(g) * T + t) * ld;
        const float* gs = gsc.data() + (static_cast<std::size_t>(t - t0) * lg + g) * ld;
        float rmax = 0.f;
        for (int i = 0; i < n; ++i) rmax = std::max(rmax, std::abs(rrow[i]));
        valid.insert(valid.end(), gs, gs + n);
        for (int i = 0; i < n; ++i) {
          const double d = double(gs[i]) - double(rrow[i]);
          num += d * d;
          den += double(rrow[i]) * rrow[i];
          if (rmax > 0) worst = std::max(worst, std::abs(d) / rmax);
          bad += !(std::abs(gs[i] - rrow[i]) <= tol * rmax + 1e-30f);
          exact_bad += inputs == Inputs::kExact && std::bit_cast<std::uint32_t>(gs[i]) != std::bit_cast<std::uint32_t>(rrow[i]);
        }
        for (std::int64_t i = n; i < ld; ++i) written_past += std::bit_cast<std::uint32_t>(gs[i]) != 0x7f7f7f7fu;
      }
  }
  const double es = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT(bad == 0 && es <= rms_tol, "%s: %d scores off by > %.0e of the row max, rms rel error %.3g (limit %.1e)",
         what.c_str(), bad, double(tol), es, rms_tol);
  EXPECT(exact_bad == 0, "%s: %d scores of exact inputs differ from the reference bit for bit", what.c_str(), exact_bad);
  EXPECT(written_past == 0, "%s: %d score columns at or past p/8 were written", what.c_str(), written_past);
  EXPECT(written_outside == 0, "%s: %zu scores written in rows of tokens outside the chunk", what.c_str(),
         written_outside);
  std::printf("  %s: path %s, %d tokens in chunks of %d, rms rel error %.3g, worst %.3g of the row max\n", what.c_str(),
              detail_ns::score_path_name(sp.path), T, chunk, es, worst);
  for (void* p : std::initializer_list<void*>{d_plan, d_sc}) GPU_CHECK(cudaFree(p));
  return valid;
}

/// Calls f(std::integral_constant<int, i>) for geometry row i (run-time index -> compile-time id).
template <class F, std::size_t... I>
void with_geometry_id(int gi, F&& f, std::index_sequence<I...>) {
  ((gi == static_cast<int>(I) ? (f(std::integral_constant<int, static_cast<int>(I)>{}), 0) : 0), ...);
}
template <class F>
void with_geometry_id(int gi, F&& f) {
  with_geometry_id(gi, std::forward<F>(f), std::make_index_sequence<step5::layout::kNumGeometries>{});
}

}  // namespace

GPU_CASE("indexer: prefill scores on the wgmma path (odd chunks, history, chunk boundaries, p/8 cutting tiles, block sizes 8 / 16 / 24 / 64), every geometry x tp; e4m3, wide (256-column) and mma paths on the same inputs") {
  // Prefill batches (mean query length >= kScoreWgmmaMinMeanQ: the automatic plan takes the wgmma
  // f16 kernel; checked below): odd query lengths, a request without history (many tokens with 0..4
  // regions), a one-token request inside the batch, a request whose positions cross multiples of
  // 64 regions (p/8 cuts the 64-region tiles and the token tiles), and a long history (several
  // region chunks). Through indexer_select (its automatic score path: wgmma f16; selections judged, scores of the last chunk compared;
  // a workspace of 97 tokens cuts requests and tiles at chunk boundaries), and the score kernels
  // alone for every path (wgmma f16 and e4m3 forced, the wide 256-column f16 tiles forced,
  // mma.sync = the decode kernel) on the same shapes: exact inputs bit for bit on every path; random inputs within the
  // select tolerance on the fp32-accurate paths (f16 wgmma, mma.sync) and, on e4m3 wgmma (~14-bit
  // truncating tensor-core accumulation, its error is printed; a CPU model of that accumulation
  // gives ~3e-4 of the row max here), within 3e-2 of the row max and 1e-2 rms: a layout or
  // indexing bug is O(1) there, and the exact inputs check the e4m3 layout bit for bit.
  // Quick: the long history at 3001 positions, the smallest and the largest tp of each geometry.
  using detail_ns::ScorePath;
  const int long_hist = sz(12011, 3001);
  const std::vector<int> q = {37, 1, 130, 301};
  const std::vector<int> hist = {0, 1005, 8 * 64 * 3 + 3, long_hist};
  std::vector<int> seq(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) seq[i] = hist[i] + q[i];
  for (int gi = 0; gi < static_cast<int>(step5::layout::kNumGeometries); ++gi) {
    const auto& e = step5::layout::kGeometries[gi];
    for (int i = 0; i < e.num_tp_values; ++i) {
      if (step5_test::quick() && i != 0 && i != e.num_tp_values - 1) continue;  // quick: the smallest and largest tp
      const int tp = e.tp_values[i];
      const std::uint32_t seed = static_cast<std::uint32_t>(7000 + 100 * gi + tp);
      const std::string base = std::string(e.name) + " tp " + std::to_string(tp) + " prefill";
      with_geometry_id(gi, [&](auto id) {
        constexpr auto kId = static_cast<step5::layout::GeometryId>(decltype(id)::value);
        const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
        int T = 0;
        for (int x : q) T += x;
        const detail_ns::ScorePlan auto_plan = detail_ns::score_plan<kId>(
            rl.index_local_heads, T, static_cast<int>(q.size()), detail_ns::score_ld(*std::max_element(seq.begin(), seq.end())),
            64, 132);
        // the 128-column wgmma tile: at 132 SMs this batch's wide plan cuts the history into
        // chunks of 128 or 256 regions, fewer than its tokens see (score_wide_tiles_pay; the
        // rule: the HOST_CASE below; the wide tile through indexer_select: "indexer_select on the
        // automatic wide tile")
        const ScorePath expect_auto = ScorePath::kWgmmaF16;
        EXPECT(auto_plan.path == expect_auto, "%s: the automatic plan took %s, expected %s", base.c_str(),
               detail_ns::score_path_name(auto_plan.path), detail_ns::score_path_name(expect_auto));
        check_select_direct(e, tp, q, seq, 64, {Inputs::kRandom, 64, 0}, seed, base + " select");
        check_select_direct(e, tp, q, seq, 64, {Inputs::kRandom, 16, 97}, seed + 1, base + " select ws 97 tokens");
        check_select_direct(e, tp, q, seq, 64, {Inputs::kExact, 64, 0}, seed + 2, base + " select exact");
        check_select_direct(e, tp, q, seq, 64, {Inputs::kAllEqual, 64, 0}, seed + 3, base + " select all-equal");
        std::vector<float> f16_random, wide_random, mma_random, e4m3_random;
        for (ScorePath path :
             {ScorePath::kWgmmaF16, ScorePath::kWgmmaE4m3, ScorePath::kWgmmaF16N256, ScorePath::kMma}) {
          const std::string name = base + " scores " + detail_ns::score_path_name(path);
          const bool e4m3 = path == ScorePath::kWgmmaE4m3;
          detail_ns::ScorePlan sp;
          check_scores_path<kId>(tp, q, seq, 97, Inputs::kExact, path, 16, 0.f, 0.0, seed + 4, name + " exact", 0, &sp);
          auto v = check_scores_path<kId>(tp, q, seq, 97, Inputs::kRandom, path, 16, e4m3 ? 3e-2f : 1e-3f,
                                          e4m3 ? 1e-2 : 1e-4, seed + 5, name + " random");
          if (path == ScorePath::kWgmmaF16) f16_random = std::move(v);
          if (path == ScorePath::kWgmmaF16N256) wide_random = std::move(v);
          if (path == ScorePath::kMma) mma_random = std::move(v);
          if (path == ScorePath::kWgmmaE4m3) e4m3_random = std::move(v);
          if (path == ScorePath::kWgmmaF16 || path == ScorePath::kWgmmaF16N256) {
            const int cols = path == ScorePath::kWgmmaF16 ? step5::kernels::sm90::kWgScoreCols
                                                          : step5::kernels::sm90::kWgScoreWideCols;
            EXPECT(sp.cols_cap == cols && sp.tok_tile * rl.index_local_heads == cols,
                   "%s: the plan has %d columns of %d tokens, expected %d columns", name.c_str(), sp.cols_cap,
                   sp.tok_tile, cols);
          }
        }
        // the wgmma kernels' block-table lookups at other page sizes: one region per page (block
        // size 8, the most pages per CTA) and pages of 3 regions (chunks starting inside a page), on
        // this GPU's plan (several region chunks per row) and on a 1-SM plan (one chunk per row:
        // each CTA walks its tile's whole history, refilling the ring many times over: 8 stages
        // for 128 columns, 4 for the wide tile)
        for (ScorePath path : {ScorePath::kWgmmaF16, ScorePath::kWgmmaF16N256})
          for (int bs : {8, 24})
            for (int sms : {0, 1})
              check_scores_path<kId>(tp, q, seq, 97, Inputs::kRandom, path, bs, 1e-3f, 1e-4, seed + 6 + bs + sms,
                                     base + " scores " + detail_ns::score_path_name(path) + " block size " +
                                         std::to_string(bs) + (sms ? " (1-SM plan)" : ""),
                                     sms);
        // exact inputs bit for bit where the ring refills, quick mode too: on the 1-SM plan one CTA
        // walks 1092 regions = 18 tiles of the history below through its 8-stage (128 columns) or
        // 4-stage (wide) ring, over 2 or 4 rounds of every stage's mbarrier phases (a request of 33
        // tokens and one of 1 token)
        const std::vector<int> ring_q = {33, 1}, ring_seq = {8 * 64 * 17 + 5 + 33, 8 * 64 * 17 + 7};
        for (ScorePath path : {ScorePath::kWgmmaF16, ScorePath::kWgmmaF16N256})
          check_scores_path<kId>(tp, ring_q, ring_seq, 97, Inputs::kExact, path, 16, 0.f, 0.0, seed + 40,
                                 base + " scores " + detail_ns::score_path_name(path) + " exact (1-SM plan, 18 tiles)",
                                 1);
        // the decode (mma.sync) and prefill (wgmma f16) kernels on the same random inputs: how many
        // scores differ in their bits (a token's scores then depend on which kernel its batch took;
        // SPEC §4.6 asks identical rows only for identical inputs) — reported, not asserted
        std::size_t differ = 0;
        for (std::size_t i = 0; i < std::min(f16_random.size(), mma_random.size()); ++i)
          differ += std::bit_cast<std::uint32_t>(f16_random[i]) != std::bit_cast<std::uint32_t>(mma_random[i]);
        EXPECT(f16_random.size() == mma_random.size(), "%s: the two paths returned %zu and %zu scores", base.c_str(),
               f16_random.size(), mma_random.size());
        std::printf("  %s: wgmma_f16 vs mma.sync on random inputs: %zu of %zu scores differ in their bits\n", base.c_str(),
                    differ, f16_random.size());
        // the bits of each kernel's random scores in one number, so that a run before and after a
        // kernel change shows whether the change kept them (e4m3 included, which no tolerance
        // here pins to its bits) — reported, not asserted
        auto fingerprint = [](const std::vector<float>& v) {
          std::uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits, over the scores' bit patterns
          for (float x : v) h = (h ^ std::bit_cast<std::uint32_t>(x)) * 1099511628211ull;
          return static_cast<unsigned long long>(h);
        };
        std::printf("  %s: random scores fingerprint: wgmma_f16 %016llx, wgmma_e4m3 %016llx, mma.sync %016llx\n",
                    base.c_str(), fingerprint(f16_random), fingerprint(e4m3_random), fingerprint(mma_random));
        // the 128- and 256-column tiles run the same k order per column: the same bits, so the
        // automatic width (score_wide_tiles_pay) never changes a score
        std::size_t wide_differ = 0;
        for (std::size_t i = 0; i < std::min(f16_random.size(), wide_random.size()); ++i)
          wide_differ += std::bit_cast<std::uint32_t>(f16_random[i]) != std::bit_cast<std::uint32_t>(wide_random[i]);
        EXPECT(wide_differ == 0 && f16_random.size() == wide_random.size() && !f16_random.empty(),
               "%s: wgmma_f16 and wgmma_f16_n256 on the same random inputs: %zu of %zu scores differ in their bits "
               "(%zu scores from the wide tile)",
               base.c_str(), wide_differ, f16_random.size(), wide_random.size());
      });
    }
  }
}

GPU_CASE("indexer: indexer_select on the automatic wide tile (a prefill batch whose tokens see >= 512 regions on average), both geometries at tp 1") {
  // The automatic plan on this GPU takes the 256-column wgmma tile for a 4K-token batch of three
  // requests after histories of 4143, 2999 and 2006 positions (ld 768, ~683 regions per token on
  // average); indexer_select runs it end to end (its plan written to the workspace, the score
  // chunks the workspace holds, the selection), judged against the reference as every other
  // select case: random inputs; full size also exact inputs and a workspace of 1000 tokens (score
  // chunks cutting requests and tiles).
  using detail_ns::ScorePath;
  const std::vector<int> q = {2001, 1, 2094}, seq = {6144, 3000, 4100};
  for (int gi = 0; gi < static_cast<int>(step5::layout::kNumGeometries); ++gi) {
    if (step5_test::quick() && gi != 0) continue;  // quick: the first geometry, random inputs
    const auto& e = step5::layout::kGeometries[gi];
    const int tp = 1;
    const std::string base = std::string(e.name) + " tp 1 prefill, automatic wide tile";
    with_geometry_id(gi, [&](auto id) {
      constexpr auto kId = static_cast<step5::layout::GeometryId>(decltype(id)::value);
      const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
      int dev = 0, sms = 0;
      GPU_CHECK(cudaGetDevice(&dev));
      EXPECT(step5::device_sm_count(dev, &sms).ok(), "device_sm_count");
      int T = 0;
      for (int x : q) T += x;
      // indexer_select's plan (auto_score_plan, with this build's wide kernel asked whether it can run)
      const detail_ns::ScorePlan sp = detail_ns::auto_score_plan<kId>(
          rl.index_local_heads, T, static_cast<int>(q.size()), detail_ns::score_ld(*std::max_element(seq.begin(), seq.end())),
          64, sms);
      EXPECT(sp.path == ScorePath::kWgmmaF16N256, "%s: the automatic plan on %d SMs took %s (%d regions per CTA), expected %s",
             base.c_str(), sms, detail_ns::score_path_name(sp.path), sp.regions_per_cta,
             detail_ns::score_path_name(ScorePath::kWgmmaF16N256));
      // this build's wide kernel: compiled for the registers its setmaxnreg split needs
      const detail_ns::WideScoreKernel wk = detail_ns::score_wide_kernel<kId>();
      EXPECT(wk.launchable && wk.error == cudaSuccess && wk.regs == step5::kernels::sm90::kWgScoreLaunchRegs,
             "%s: the wide kernel: %d registers per thread (%s), launchable %d; expected %d", base.c_str(), wk.regs,
             cudaGetErrorString(wk.error), int(wk.launchable), step5::kernels::sm90::kWgScoreLaunchRegs);
      const std::uint32_t seed = static_cast<std::uint32_t>(9100 + 10 * gi);
      check_select_direct(e, tp, q, seq, 64, {Inputs::kRandom, 64, 0}, seed, base + " select");
      if (!step5_test::quick()) {
        check_select_direct(e, tp, q, seq, 64, {Inputs::kExact, 64, 0}, seed + 1, base + " select exact");
        check_select_direct(e, tp, q, seq, 64, {Inputs::kRandom, 64, 1000}, seed + 2, base + " select ws 1000 tokens");
      }
    });
  }
}

HOST_CASE("indexer: the automatic score tile (mma.sync for decode, wgmma 256 columns where a CTA sees >= 512 regions on average, else 128) at the benchmark shapes") {
  // ops::detail::score_plan's automatic choice on the shapes bench_indexer measured it on (tp 1
  // step5_preview, 132 SMs; kScoreWideMinRegionsPerCta's comment has the figures), and around
  // them: a 4K chunk without history (256 regions per token on average) keeps 128 columns; a 16K
  // chunk without history, chunks after 32K of history, and decode-sized prefill batches on long
  // histories take 256; decode and MTP rows take the mma.sync kernel.
  using detail_ns::ScorePath;
  constexpr auto kId = step5::layout::GeometryId::step5_preview;
  const auto& e = step5::layout::entry_of(kId);
  const int Il = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, 1), 0)
                     .layout.index_local_heads;
  struct Shape {
    int T, B, max_seq;
    ScorePath expect;
  };
  const Shape shapes[] = {
      {4096, 1, 4096, ScorePath::kWgmmaF16},                 // ld 512: 256 regions per token on average
      {4096, 1, 6112, ScorePath::kWgmmaF16},                 // ld 764: 508 (chunks of 512 regions)
      {4096, 1, 6144, ScorePath::kWgmmaF16N256},             // ld 768: 512, the least that takes 256
      {16384, 1, 16384, ScorePath::kWgmmaF16N256},           // 1024
      {4096, 1, 32768 + 4096, ScorePath::kWgmmaF16N256},     // 4352, chunks of 4096 regions
      {16384, 1, 32768 + 16384, ScorePath::kWgmmaF16N256},   // 5120
      {64 * 16, 64, 32768 + 16, ScorePath::kWgmmaF16N256},   // 64 requests of 16 tokens after 32K
      {64 * 16, 64, 2048, ScorePath::kWgmmaF16},             // ... after 2K: 255, chunks of 128 regions
      {64 * 16, 64, 8192, ScorePath::kWgmmaF16},             // ... after 8K: 1023, but chunks of 256 (the cap)
      {64, 64, 131072, ScorePath::kMma},                     // decode
      {128, 64, 131072, ScorePath::kMma},                    // MTP (2 tokens per request)
  };
  for (const Shape& sh : shapes) {
    const std::int64_t ld = detail_ns::score_ld(sh.max_seq);
    // indexer_select's plan (auto_score_plan) with a launchable wide kernel, as score_plan's
    const detail_ns::ScorePlan sp = detail_ns::auto_score_plan<kId>(Il, sh.T, sh.B, ld, 64, 132, [] { return true; });
    EXPECT(sp.path == sh.expect, "T = %d, B = %d, max_seq_len = %d (ld %lld regions, %d regions per CTA): the automatic "
           "plan took %s, expected %s", sh.T, sh.B, sh.max_seq, static_cast<long long>(ld), sp.regions_per_cta,
           detail_ns::score_path_name(sp.path), detail_ns::score_path_name(sh.expect));
    const detail_ns::ScorePlan bare = detail_ns::score_plan<kId>(Il, sh.T, sh.B, ld, 64, 132);
    EXPECT(bare.path == sp.path, "T = %d, B = %d: score_plan took %s, auto_score_plan %s", sh.T, sh.B,
           detail_ns::score_path_name(bare.path), detail_ns::score_path_name(sp.path));
    // wgmma grids run a chunk's tiles from the last (longest histories first); mma.sync in order
    EXPECT(sp.longest_first == (sp.path != ScorePath::kMma), "T = %d, B = %d: %s plan with longest_first %d", sh.T,
           sh.B, detail_ns::score_path_name(sp.path), sp.longest_first ? 1 : 0);
    // a wide kernel that cannot run (compiled for other than kWgScoreLaunchRegs registers): 128
    // columns instead
    const ScorePath expect_narrow = sh.expect == ScorePath::kWgmmaF16N256 ? ScorePath::kWgmmaF16 : sh.expect;
    const detail_ns::ScorePlan np = detail_ns::auto_score_plan<kId>(Il, sh.T, sh.B, ld, 64, 132, [] { return false; });
    EXPECT(np.path == expect_narrow && (np.path != ScorePath::kWgmmaF16 || np.cols_cap == step5::kernels::sm90::kWgScoreCols),
           "T = %d, B = %d, max_seq_len = %d, the wide kernel not launchable: the automatic plan took %s (%d columns), "
           "expected %s", sh.T, sh.B, sh.max_seq, detail_ns::score_path_name(np.path), np.cols_cap,
           detail_ns::score_path_name(expect_narrow));
  }
}

HOST_CASE("indexer: decode score plans take kScoreDecodeLongRegionsPerCta where the fill rule keeps the longest chunk; MTP tiles and shorter chunks keep the fill rule (the bench_indexer shapes, 132 SMs)") {
  // score_plan's region chunks at the shapes bench_indexer measured the rule on, and around them
  // (kScoreDecodeLongRegionsPerCta's comment has the figures): decode batches of 64 (measured)
  // and 128 at 128K, where the fill rule keeps 2048, take 256; where it stops shorter (batch 16
  // at 128K: 512; batch 64 / 128 at 32K: 512 / 1024; batch 1: 128) and for MTP steps of 2 tokens
  // (2048) it stands. Rows longer than kMaxGridDimY chunks of 256 regions (up to
  // kMaxIndexerSeqLen) keep 2048.
  constexpr auto kId = step5::layout::GeometryId::step5_preview;
  const auto& e = step5::layout::entry_of(kId);
  struct Shape {
    int tp, T, B, max_seq, expect;
  };
  // the longest row that takes 256
  constexpr int kLongest = kR * step5::kMaxGridDimY * step5::kernels::sm90::kScoreDecodeLongRegionsPerCta;
  const Shape shapes[] = {
      {1, 16, 16, 131072, 512},   {1, 64, 64, 131072, 256},    {8, 16, 16, 131072, 512},
      {8, 64, 64, 131072, 256},   {1, 128, 128, 131072, 256},  {1, 64, 64, 32768, 512},
      {1, 128, 128, 32768, 1024}, {1, 1, 1, 131072, 128},      {8, 1, 1, 131072, 128},
      {1, 16, 16, 32768, 128},    {1, 128, 64, 131072, 2048},  {8, 128, 64, 131072, 2048},
      {1, 1, 1, kLongest, 256},   {1, 1, 1, kLongest + 8, 2048}, {1, 1, 1, step5::ops::kMaxIndexerSeqLen, 2048},
  };
  for (const Shape& sh : shapes) {
    const int Il = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, sh.tp), 0)
                       .layout.index_local_heads;
    const std::int64_t ld = detail_ns::score_ld(sh.max_seq);
    const detail_ns::ScorePlan sp = detail_ns::score_plan<kId>(Il, sh.T, sh.B, ld, 64, 132);
    EXPECT(sp.path == detail_ns::ScorePath::kMma && sp.regions_per_cta == sh.expect &&
               sp.region_chunks == (ld + sh.expect - 1) / sh.expect,
           "tp %d, T = %d, B = %d, max_seq_len = %d: %s plan of %d regions per CTA (%lld chunks), expected mma.sync, %d",
           sh.tp, sh.T, sh.B, sh.max_seq, detail_ns::score_path_name(sp.path), sp.regions_per_cta,
           static_cast<long long>(sp.region_chunks), sh.expect);
  }
}

GPU_CASE("indexer: decode scores in long region chunks (plans for 1, 4 and 16 SMs; kScoreMaxRegionsPerCta regions per CTA for MTP and forced for decode), block sizes 8, 16 and 64, MTP, every geometry at its smallest and largest tp") {
  // The mma.sync score kernel walks up to kScoreMaxRegionsPerCta regions per CTA (16 m-tiles per
  // warp) when the grid still fills the GPU; the engine-sized cases above plan for this GPU and
  // mostly get short chunks. Planning for fewer SMs gives longer ones on small batches: every
  // warp walks many m-tiles across pages, chunk ends cut m-tiles, and histories end mid-chunk.
  // Exact inputs bit for bit, random inputs within the select tolerance; a decode plan for 1 or 4
  // SMs, where the fill rule keeps the longest chunks, takes kScoreDecodeLongRegionsPerCta (256),
  // one for 16 SMs 512 regions (8 tiles x 8 chunks fill 90 % of 64 slots); decode CTAs of the
  // longest chunk (the plan of rows past 65535 chunks of 256 regions, too long to build here) are
  // forced at block sizes 8 and 16; MTP steps of 2 tokens and of 128 columns (tokens x local index
  // heads) per tile take the longest chunks (the latter at block_size 8: the largest staged block
  // table).
  using detail_ns::ScorePath;
  const std::vector<int> seq = {32768 + 3, 20001, 8 * 300 + 5, 4, 16384, 9, 32760, 1};
  const std::vector<int> q1(seq.size(), 1), q2(seq.size(), 2);
  std::vector<int> seq2(seq);  // MTP: 2 tokens per request
  for (int& x : seq2) x += 1;
  for (int gi = 0; gi < static_cast<int>(step5::layout::kNumGeometries); ++gi) {
    const auto& e = step5::layout::kGeometries[gi];
    for (int i : {0, e.num_tp_values - 1}) {
      const int tp = e.tp_values[i];
      with_geometry_id(gi, [&](auto id) {
        constexpr auto kId = static_cast<step5::layout::GeometryId>(decltype(id)::value);
        for (int sms : {1, 4, 16})
          for (int bs : {8, 16, 64}) {
            const std::uint32_t seed = static_cast<std::uint32_t>(9100 + 1000 * gi + 100 * tp + 10 * sms + bs);
            const std::string name = std::string(e.name) + " tp " + std::to_string(tp) + " plan for " +
                                     std::to_string(sms) + " SMs, block_size " + std::to_string(bs);
            detail_ns::ScorePlan sp;
            check_scores_path<kId>(tp, q1, seq, 8, Inputs::kExact, ScorePath::kMma, bs, 0.f, 0.0, seed,
                                   name + " exact", sms, &sp);
            check_scores_path<kId>(tp, q1, seq, 8, Inputs::kRandom, ScorePath::kMma, bs, 1e-3f, 1e-4, seed + 1,
                                   name + " random", sms);
            std::printf("  %s: %d regions per CTA, %lld region chunks\n", name.c_str(), sp.regions_per_cta,
                        static_cast<long long>(sp.region_chunks));
            const int expect = sms == 16 ? 512 : step5::kernels::sm90::kScoreDecodeLongRegionsPerCta;
            EXPECT(sp.regions_per_cta == expect, "%s: %d regions per CTA, expected %d", name.c_str(),
                   sp.regions_per_cta, expect);
            if (sms == 1 && bs <= 16) {
              constexpr int kLongest = step5::kernels::sm90::kScoreMaxRegionsPerCta;
              check_scores_path<kId>(tp, q1, seq, 8, Inputs::kExact, ScorePath::kMma, bs, 0.f, 0.0, seed + 2,
                                     name + ", decode CTAs of " + std::to_string(kLongest) + " regions (forced), exact",
                                     sms, &sp, kLongest);
              // rows of 4096 regions (the longest request, 32771 positions): 2 chunks of 2048
              EXPECT(sp.regions_per_cta == kLongest && sp.region_chunks == 2,
                     "%s: forced plan of %d regions per CTA, %lld chunks", name.c_str(), sp.regions_per_cta,
                     static_cast<long long>(sp.region_chunks));
            }
          }
        const std::string mtp = std::string(e.name) + " tp " + std::to_string(tp) + " MTP plan for 1 SM";
        detail_ns::ScorePlan sp;
        check_scores_path<kId>(tp, q2, seq2, 16, Inputs::kRandom, ScorePath::kMma, 16, 1e-3f, 1e-4, 9999u + gi,
                               mtp + ", 2 tokens per request", 1, &sp);
        EXPECT(sp.regions_per_cta == step5::kernels::sm90::kScoreMaxRegionsPerCta, "%s: %d regions per CTA",
               mtp.c_str(), sp.regions_per_cta);
        // tiles of 128 columns: kScoreCols / Il tokens per request (tp 1: 16 index heads -> 8 tokens)
        const auto rl =
            step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
        const int qw = step5::kernels::sm90::kScoreCols / rl.index_local_heads;
        if (qw <= 8 && i == 0) {
          std::vector<int> qn(seq.size(), qw), seqn(seq);
          for (int& x : seqn) x += qw;
          check_scores_path<kId>(tp, qn, seqn, 8 * qw, Inputs::kRandom, ScorePath::kMma, 8, 1e-3f, 1e-4, 8888u + gi,
                                 mtp + ", " + std::to_string(qw) + " tokens per request (128 columns)", 1, &sp);
          EXPECT(sp.cols_cap == step5::kernels::sm90::kScoreCols &&
                     sp.regions_per_cta == step5::kernels::sm90::kScoreMaxRegionsPerCta,
                 "%s: %d columns, %d regions per CTA", mtp.c_str(), sp.cols_cap, sp.regions_per_cta);
        }
      });
    }
  }
}

GPU_CASE("indexer: decode batches of 1, 16, 64, 257 at every geometry x tp (odd region counts, short rows, all-equal ties, MTP)") {
  // Decode steps as engines run them, for every row and tp of geometries.def: one token per request
  // (a tile per token: the tile starts are cu_seqlens_q, no plan kernel), histories with odd region
  // counts (positions 8m + 1 .. 8m + 7 too), shorter than topk (everything selected), 0, and long
  // (16384 regions = 128K tokens at batch 1; 32K tokens at batch 16, 16K at 64, 4K at 257); the same
  // batches with every summary equal (ties decided by id); and an MTP step at batch 16 (2 tokens per
  // request: tiles of 2 tokens, tile starts from the plan kernel).
  // Quick: batches 1 and 16, histories up to 8192 and 4096 positions.
  const int topk = 512;
  std::vector<int> batches = {1, 16, 64, 257};
  if (step5_test::quick()) batches = {1, 16};
  for (const auto& e : step5::layout::kGeometries)
    for (int i = 0; i < e.num_tp_values; ++i) {
      const int tp = e.tp_values[i];
      for (int batch : batches) {
        std::mt19937 rng(static_cast<std::uint32_t>(1000 * tp + batch));
        const int long_max = batch == 1 ? sz(131072, 8192) : batch == 16 ? sz(32768, 4096) : batch == 64 ? 16384 : 4096;
        std::vector<int> q(static_cast<std::size_t>(batch), 1), seq(static_cast<std::size_t>(batch));
        for (int b = 0; b < batch; ++b) {
          const int kind = b % 4;
          const int odd = 2 * static_cast<int>(rng() % (kind == 1 ? 32 : long_max / 16)) + 1;  // odd region count
          if (kind == 0) seq[b] = long_max;                                          // full length
          else if (kind == 3) seq[b] = static_cast<int>(rng() % 8) + 1;              // no history region
          else seq[b] = 8 * odd + 1 + static_cast<int>(rng() % 7);  // 1: < topk regions, 2: up to long_max
        }
        if (batch == 1) seq[0] = long_max + 7;  // long_max / 8 regions (16384 at full size)
        const std::string base = std::string(e.name) + " tp " + std::to_string(tp) + " batch " + std::to_string(batch);
        check_select_direct(e, tp, q, seq, topk, {}, rng(), base);
        check_select_direct(e, tp, q, seq, topk, {Inputs::kAllEqual, 64, 0}, rng(), base + " all-equal");
        if (batch == 16) {  // MTP: 2 tokens per request
          std::vector<int> q2(q.size(), 2), seq2(seq);
          for (auto& x : seq2) x += 1;
          check_select_direct(e, tp, q2, seq2, topk, {}, rng(), base + " MTP");
        }
      }
    }
}

GPU_CASE("indexer: bad arguments are refused with messages naming the values") {
  const auto& e = step5::layout::kGeometries[0];
  const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, 1), 0).layout;
  step5::ops::IndexerSelectParams se;
  se.rank = rl;
  se.topk = 2000;
  step5::Status s = step5::ops::indexer_select(se, nullptr);
  EXPECT(!s.ok() && s.message().find("2000") != std::string::npos, "topk 2000: %s", s.to_string().c_str());
  step5::ops::IndexerPrepareParams pp;
  pp.rank = rl;
  pp.batch.num_tokens = 4;
  pp.batch.num_requests = 1;
  int dummy = 0;
  pp.batch.cu_seqlens_q = &dummy;
  pp.batch.seq_lens = &dummy;
  pp.table = {&dummy, 1, 12, 1};
  const step5::Status s12 = step5::ops::indexer_prepare(pp, nullptr);
  EXPECT(!s12.ok() && s12.message().find("block_size = 12") != std::string::npos, "block_size 12: %s", s12.to_string().c_str());
  step5::layout::RankLayout other = rl;
  other.geometry.head_dim = 96;
  pp.rank = other;
  const step5::Status s96 = step5::ops::indexer_prepare(pp, nullptr);
  EXPECT(s96.code() == step5::StatusCode::kUnsupported, "unknown geometry: %s", s96.to_string().c_str());
  // step 4 through indexer_prepare (IndexerPrepareParams::summaries): a partly filled set of
  // outputs, and a tail that the fold's 16-byte copies cannot read, are refused before any launch
  // (every pointer below is a host stand-in: nothing is launched)
  {
    alignas(16) static unsigned char buf[64];
    static std::int32_t cu[2] = {0, 1}, seq[1] = {5}, table[1] = {0}, slot[1] = {0};
    auto* b = reinterpret_cast<bf16*>(buf);
    auto* f = reinterpret_cast<float*>(buf);
    step5::ops::IndexerPrepareParams q;
    q.rank = rl;
    q.batch = {cu, seq, 1, 1, cu, seq};
    q.table = {table, 1, 16, 1};
    q.c = b, q.ldc = rl.padded_rows, q.max_position = 8;
    q.q_norm = q.k_norm = q.index_q_norm = q.index_k_norm_w = q.index_k_norm_b = f;
    q.cos_main = q.sin_main = q.cos_idx = q.sin_idx = b;
    q.q_out = q.k_cache = q.v_cache = q.index_k = b, q.index_q = buf, q.weights = f;
    q.summaries = {nullptr, b, slot, 1};
    const step5::Status partial = step5::ops::indexer_prepare(q, nullptr);
    EXPECT(partial.code() == step5::StatusCode::kInvalidArgument &&
               partial.message().find("summary_cache") != std::string::npos,
           "summaries without summary_cache: %s", partial.to_string().c_str());
    q.summaries = {buf, reinterpret_cast<bf16*>(buf + 2), slot, 1};
    const step5::Status misaligned = step5::ops::indexer_prepare(q, nullptr);
    EXPECT(misaligned.code() == step5::StatusCode::kInvalidArgument &&
               misaligned.message().find("aligned") != std::string::npos,
           "tail at an address = 2 mod 16: %s", misaligned.to_string().c_str());
    // the paired accesses of the prepare kernel: C, q, k, v, index_k and weights 4-byte aligned,
    // index_q 2-byte: a misaligned one is refused, named with its offset, before any launch (it
    // would be a sticky misaligned-address fault)
    q.summaries = {};
    auto* b2 = reinterpret_cast<bf16*>(buf + 2);
    struct Mis {
      const char* name;
      std::function<void(step5::ops::IndexerPrepareParams&)> set;
      const char* offset;
    };
    for (const Mis& m : {Mis{"c", [&](auto& x) { x.c = b2; }, "2 mod 4"},
                         Mis{"q_out", [&](auto& x) { x.q_out = b2; }, "2 mod 4"},
                         Mis{"k_cache", [&](auto& x) { x.k_cache = b2; }, "2 mod 4"},
                         Mis{"v_cache", [&](auto& x) { x.v_cache = b2; }, "2 mod 4"},
                         Mis{"index_k", [&](auto& x) { x.index_k = b2; }, "2 mod 4"},
                         Mis{"weights", [&](auto& x) { x.weights = reinterpret_cast<float*>(buf + 2); }, "2 mod 4"},
                         Mis{"index_q", [&](auto& x) { x.index_q = buf + 1; }, "1 mod 2"}}) {
      step5::ops::IndexerPrepareParams r = q;
      m.set(r);
      const step5::Status st = step5::ops::indexer_prepare(r, nullptr);
      const std::string want = std::string(m.name) + " is at an address = " + m.offset;
      EXPECT(st.code() == step5::StatusCode::kInvalidArgument && st.message().find(want) != std::string::npos,
             "indexer_prepare with %s misaligned: %s", m.name, st.to_string().c_str());
    }
    // eps: +inf would zero every normalised row, NaN poison it; refused naming the value
    for (const float eps : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), -1.f}) {
      step5::ops::IndexerPrepareParams r = q;
      r.eps = eps;
      const step5::Status st = step5::ops::indexer_prepare(r, nullptr);
      EXPECT(st.code() == step5::StatusCode::kInvalidArgument &&
                 st.message().find("indexer_prepare: eps = ") != std::string::npos &&
                 st.message().find("expected a finite value >= 0") != std::string::npos,
             "indexer_prepare with eps %g: %s", static_cast<double>(eps), st.to_string().c_str());
    }
  }
  // indexer_select: q rows and summary rows read by 16-byte loads and bulk copies, weights by
  // 4-byte loads; a misaligned pointer is refused before any launch, naming it and its offset
  // (host stand-ins again: the refusal comes first)
  {
    alignas(16) static unsigned char buf[4096];
    static std::int32_t cu[2] = {0, 1}, seq[1] = {5}, table[1] = {0}, ids[2], counts[1];
    step5::ops::IndexerSelectParams q;
    q.rank = rl;
    q.batch = {cu, seq, 1, 1, cu, seq};
    q.table = {table, 1, 16, 1};
    q.topk = 4;
    q.max_seq_len = 8;
    q.topk_ids = ids, q.counts = counts;
    static std::vector<unsigned char> ws(step5::ops::indexer_select_workspace_bytes(rl, 1, 8, 1));
    q.workspace = ws.data(), q.workspace_bytes = ws.size();
    struct Case {
      const char* name;
      std::size_t q_off, s_off, w_off;
    };
    for (const Case& c : {Case{"index_q", 8, 0, 0}, Case{"summary_cache", 0, 4, 0}, Case{"weights", 0, 0, 2}}) {
      q.index_q = buf + c.q_off;
      q.summary_cache = buf + 1024 + c.s_off;
      q.weights = reinterpret_cast<const float*>(buf + 2048 + c.w_off);
      const step5::Status st = step5::ops::indexer_select(q, nullptr);
      const std::string want = std::string(c.name) + " is at an address = " +
                               std::to_string(c.q_off + c.s_off + c.w_off) + " mod ";
      EXPECT(st.code() == step5::StatusCode::kInvalidArgument && st.message().find(want) != std::string::npos,
             "indexer_select with %s misaligned: %s", c.name, st.to_string().c_str());
    }
  }
}

STEP5_GPU_TEST_MAIN()
