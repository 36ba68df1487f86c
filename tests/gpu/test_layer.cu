// GPU test of one whole DSA layer (SPEC.md §4 steps 1–8, caches of SPEC §5):
// step5::ops::dsa_layer_forward against the CPU reference (step5/reference/layer.hpp) at topk 512,
// over chunked prefill plus decode / MTP steps, every geometry row, tp 1 and tp 4 (every rank of
// tp 4 simulated on the one device, then the simulated all-reduce of the partials).
//
// The batch (block_size 64, five requests, random bf16 inputs and weights, never zero):
//   request 0 continues a 4300-position history (quick: 4200) given as random caches — k/v rows,
//     e4m3 summaries and pending tail rows, identical on both sides — so that its rows have more
//     than 512 regions and topk 512 selects a strict subset (512 regions = 4096 positions);
//   requests 1 and 4 are fresh prefills in chunks; request 3 continues a 200-position history;
//   request 2 has no rows in the prefill steps (q_len 0), then decodes; the last step verifies
//   MTP rows (2–3 query rows per request).
// How each step is judged (the GPU's outputs come from the layer's workspace, whose layout is
// the plan's workspace map, step5::ops::DsaLayerPlan::map):
//   1. fused GEMM: the GPU's C against reference::gemm_bf16 of the same x, per row (<= 1e-2).
//   2. steps 2–8 of the reference run from the GPU's C (reference::forward_from_projection), so
//      that the stages after the GEMM are judged on identical inputs; the CPU caches are updated
//      by the reference itself, and the GPU caches must match them (k, tail, summaries within
//      rounding; v bit-exact: a copy of C).
//   3. selections judged exactly, ties excused only within rounding (step5_test::judge_row)
//      against the reference scores of the GPU's own index_q / weights / summary cache; index_q and
//      weights are compared with the reference's.
//   4. the layer output: every token's row of the o_proj partial against the reference (the
//      reference's attention + gate + o_proj on the GPU's selection, which is the reference's own
//      wherever the two selections agree), max per-row relative error <= 1e-2, worst row printed;
//      at tp 4 the same for the simulated all-reduce of the four ranks.
// Quick (sanitizer) mode, step5_test::quick(): the same steps with shorter chunks and histories
// (request 0 still past 4096 positions) and tp 4 on rank 0 only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/ops/elementwise.hpp"
#include "step5/ops/layer.hpp"
#include "step5/reference/layer.hpp"

using step5::bf16;
namespace ref = step5::reference;
using step5_test::DevBuf;
using step5_test::same_bits;
using step5_test::sz;

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

constexpr int kTopk = 512;
constexpr int kHidden = 512;
constexpr int kBlockSize = 64;

std::vector<bf16> normal_bf16(std::size_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<bf16> v(n);
  for (auto& x : v) x = step5::to_bf16(d(rng));
  return v;
}
std::vector<float> normal_f32(std::size_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Random weights of one rank (rows past rows_with_w of the fused matrix stay zero, as loaded).
ref::LayerWeights random_weights(const step5::layout::RankLayout& r, int max_position, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const auto& g = r.geometry;
  ref::LayerWeights w;
  w.rank = r;
  w.hidden = kHidden;
  w.fused.assign(static_cast<std::size_t>(r.padded_rows) * kHidden, bf16{});
  const auto rows = normal_bf16(static_cast<std::size_t>(r.rows_with_w) * kHidden, 1.0f / std::sqrt(float(kHidden)), rng);
  std::copy(rows.begin(), rows.end(), w.fused.begin());
  w.o_proj = normal_bf16(static_cast<std::size_t>(kHidden) * r.local_heads * g.head_dim,
                         1.0f / std::sqrt(float(r.local_heads * g.head_dim)), rng);
  w.q_norm = normal_f32(g.head_dim, 0.1f, rng);
  w.k_norm = normal_f32(g.head_dim, 0.1f, rng);
  w.index_q_norm = normal_f32(g.proxy_dim, 0.1f, rng);
  w.index_k_norm_weight = normal_f32(g.proxy_dim, 0.1f, rng);
  for (auto& x : w.index_k_norm_weight) x += 1.0f;
  w.index_k_norm_bias = normal_f32(g.proxy_dim, 0.1f, rng);
  w.rope_main = ref::make_rope_table(max_position, g.rot_main, 5e6);
  w.rope_idx = ref::make_rope_table(max_position, g.rot_idx, 5e6);
  return w;
}

/// Max over rows of ‖gpu_row − ref_row‖ / ‖ref_row‖ (rows of `width` elements, row stride `ld`);
/// `*worst` receives the row.
double max_row_error(const bf16* gpu, const bf16* refv, int rows, int width, std::int64_t ld, int* worst) {
  double m = 0.0;
  *worst = -1;
  for (int t = 0; t < rows; ++t) {
    double num = 0.0, den = 0.0;
    for (int j = 0; j < width; ++j) {
      const double a = step5::to_float(gpu[t * ld + j]), r = step5::to_float(refv[t * ld + j]);
      num += (a - r) * (a - r);
      den += r * r;
    }
    const double e = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
    if (!(e <= m)) {
      m = std::isnan(e) ? INFINITY : e;
      *worst = t;
    }
  }
  return m;
}

double rel_bf16(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  std::vector<float> fa(a.size()), fb(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) fa[i] = step5::to_float(a[i]), fb[i] = step5::to_float(b[i]);
  return step5_test::rel_error(fa, fb);
}
double rel_e4m3(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  std::vector<float> fa(a.size()), fb(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) fa[i] = step5::e4m3_bits_to_float(a[i]), fb[i] = step5::e4m3_bits_to_float(b[i]);
  return step5_test::rel_error(fa, fb);
}

/// One simulated rank: reference weights and caches, their device copies, the layer workspace.
struct Rank {
  ref::LayerWeights w;
  ref::LayerCache cache;
  DevBuf<bf16> fused, o_proj, cos_m, sin_m, cos_i, sin_i;
  DevBuf<float> q_norm, k_norm, iq_norm, ik_w, ik_b;
  DevBuf<bf16> k, v, tail;
  DevBuf<std::uint8_t> summary;
  DevBuf<unsigned char> ws;
  step5::ops::DsaLayerWeights dw;
  Rank(ref::LayerWeights lw, ref::LayerCache c, std::size_t ws_bytes)
      : w(std::move(lw)), cache(std::move(c)), fused(w.fused), o_proj(w.o_proj), cos_m(w.rope_main.cos),
        sin_m(w.rope_main.sin), cos_i(w.rope_idx.cos), sin_i(w.rope_idx.sin), q_norm(w.q_norm), k_norm(w.k_norm),
        iq_norm(w.index_q_norm), ik_w(w.index_k_norm_weight), ik_b(w.index_k_norm_bias), k(cache.k_cache),
        v(cache.v_cache), tail(cache.tail), summary(cache.summary_cache), ws(ws_bytes) {
    GPU_CHECK(cudaMemset(ws.p, 0, ws_bytes));  // zero-filled once before first use (ops/layer.hpp)
    dw.fused = fused.p, dw.o_proj = o_proj.p, dw.q_norm = q_norm.p, dw.k_norm = k_norm.p;
    dw.index_q_norm = iq_norm.p, dw.index_k_norm_w = ik_w.p, dw.index_k_norm_b = ik_b.p;
    dw.cos_main = cos_m.p, dw.sin_main = sin_m.p, dw.cos_idx = cos_i.p, dw.sin_idx = sin_i.p;
    dw.max_position = w.rope_main.max_position, dw.eps = w.eps;
  }
  step5::ops::DsaLayerCaches dcaches() {
    step5::ops::DsaLayerCaches c;
    c.k_cache = k.p, c.v_cache = v.p, c.summary_cache = summary.p, c.tail = tail.p, c.num_slots = cache.num_slots;
    return c;
  }
};

/// Gives request b a history of hist[b] positions in `cache` (random k/v rows, summaries of its
/// complete regions, pending tail rows), without running the steps that wrote it.
void random_history(ref::LayerCache& c, const ref::StepBatch& layout_of, const std::vector<int>& hist, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int KVl = c.kv_heads, D = c.head_dim, P = c.proxy_dim, bs = c.block_size, rpb = bs / kR;
  for (int b = 0; b < static_cast<int>(hist.size()); ++b) {
    const std::int32_t* bt = layout_of.block_table.data() + static_cast<std::size_t>(b) * layout_of.max_blocks;
    for (int p = 0; p < hist[b]; ++p) {
      const std::size_t o = (static_cast<std::size_t>(bt[p / bs]) * bs + p % bs) * KVl * D;
      for (int i = 0; i < KVl * D; ++i) {
        c.k_cache[o + i] = step5::to_bf16(nd(rng));
        c.v_cache[o + i] = step5::to_bf16(nd(rng));
      }
    }
    for (int r = 0; r < hist[b] / kR; ++r) {
      std::uint8_t* dst = c.summary_cache.data() + (static_cast<std::size_t>(bt[kR * r / bs]) * rpb + r % rpb) * P;
      for (int d = 0; d < P; ++d) dst[d] = step5::float_to_e4m3_bits(nd(rng));
    }
    for (int i = 0; i < hist[b] % kR; ++i)
      for (int which = 0; which < 2; ++which) {
        bf16* dst = c.tail.data() + ((static_cast<std::size_t>(layout_of.tail_slot[b]) * kR + i) * 2 + which) * P;
        for (int d = 0; d < P; ++d) dst[d] = step5::to_bf16(nd(rng));
      }
  }
}

struct LayerCaseStats {
  int strict_rows = 0;  // selection rows with more than topk history regions
};

/// Runs one step on rank `R` (GPU and CPU reference), checks every output; returns the GPU's
/// partial and (through `ref_out`) the reference partial it was compared with.
std::vector<bf16> run_rank_step(Rank& R, const ref::StepBatch& step, const std::vector<bf16>& x, int max_seq_len,
                                const step5::ops::DsaLayerCapacity& cap, const std::string& ctx,
                                std::vector<bf16>* ref_out, LayerCaseStats* stats,
                                const step5::ops::DsaLayerOptions& options) {
  const auto& r = R.w.rank;
  const auto& g = r.geometry;
  const int B = step.num_requests(), T = step.view().num_tokens();
  const int ldc = r.padded_rows, D = g.head_dim, P = g.proxy_dim, Hl = r.local_heads, Il = r.index_local_heads;
  const int lg = r.local_kv_groups, W = kTopk + 1;
  // ---- GPU
  DevBuf<std::int32_t> d_cu(step.cu_seqlens_q), d_seq(step.seq_lens), d_bt(step.block_table), d_slot(step.tail_slot);
  DevBuf<bf16> d_x(x), d_partial(static_cast<std::size_t>(T) * kHidden);
  GPU_CHECK(cudaMemset(d_partial.p, 0xff, d_partial.n * sizeof(bf16)));  // poison (bf16 NaN)
  step5::ops::DsaLayerStep ls;
  ls.batch.cu_seqlens_q = d_cu.p, ls.batch.seq_lens = d_seq.p, ls.batch.num_requests = B, ls.batch.num_tokens = T;
  ls.batch.cu_seqlens_q_host = step.cu_seqlens_q.data(), ls.batch.seq_lens_host = step.seq_lens.data();
  ls.table.block_table = d_bt.p, ls.table.max_blocks = step.max_blocks, ls.table.block_size = R.cache.block_size;
  ls.table.num_blocks = R.cache.num_blocks;
  ls.tail_slot = d_slot.p, ls.max_seq_len = max_seq_len, ls.topk = kTopk;
  const step5::Status st = step5::ops::dsa_layer_forward(r, kHidden, R.dw, R.dcaches(), ls, d_x.p, d_partial.p, R.ws.p,
                                                         R.ws.n, cap, nullptr, nullptr, options);
  EXPECT(st.ok(), "%s: dsa_layer_forward: %s", ctx.c_str(), st.to_string().c_str());
  GPU_CHECK(cudaDeviceSynchronize());
  step5::ops::DsaLayerPlan plan;  // the plan dsa_layer_forward made: where the layer keeps its intermediates
  EXPECT(step5::ops::dsa_layer_plan(r, kHidden, cap, &plan, -1, options).ok(), "%s: plan", ctx.c_str());
  if (!options.gemm_allow_cublaslt) {
    // this library's kernels at every token count: no table entry is cuBLASLt or left to kAuto
    auto mine = [](const step5::ops::GemmPlan& g) {
      return g.path != step5::ops::GemmPath::kCublasLt && g.path != step5::ops::GemmPath::kAuto;
    };
    bool all_mine = plan.options.gemm_allow_cublaslt == false;
    for (const auto& g : plan.facts.fused_gemm) all_mine = all_mine && mine(g);
    for (const auto& g : plan.facts.o_proj_gemm) all_mine = all_mine && mine(g);
    if (cap.max_tokens > static_cast<int>(plan.facts.fused_gemm.size()))
      all_mine = all_mine && mine(plan.facts.fused_large) && mine(plan.facts.o_proj_large);
    EXPECT(all_mine, "%s: the plan on this library's GEMMs holds a cuBLASLt or kAuto choice", ctx.c_str());
  }
  const step5::ops::detail::LayerWorkspaceMap& m = plan.map;
  const unsigned char* ws = R.ws.p;
  const auto g_c = step5_test::download(reinterpret_cast<const bf16*>(ws + m.c), static_cast<std::size_t>(T) * ldc);
  const auto g_iq = step5_test::download(ws + m.index_q, static_cast<std::size_t>(T) * Il * P);
  const auto g_w = step5_test::download(reinterpret_cast<const float*>(ws + m.weights), static_cast<std::size_t>(T) * Il);
  const auto g_ids = step5_test::download(reinterpret_cast<const std::int32_t*>(ws + m.ids), static_cast<std::size_t>(lg) * T * W);
  const auto g_cnt = step5_test::download(reinterpret_cast<const std::int32_t*>(ws + m.counts), static_cast<std::size_t>(lg) * T);
  const auto g_partial = d_partial.down();

  // ---- 1. fused GEMM
  std::vector<bf16> c_ref(static_cast<std::size_t>(T) * ldc);
  ref::gemm_bf16(T, ldc, kHidden, x.data(), kHidden, R.w.fused.data(), kHidden, c_ref.data(), ldc);
  int worst = -1;
  const double e_c = max_row_error(g_c.data(), c_ref.data(), T, r.rows_with_w, ldc, &worst);
  EXPECT(e_c <= 1e-2, "%s: fused GEMM output, worst row %d: rel error %.3g", ctx.c_str(), worst, e_c);

  // ---- 2. reference steps 2-8 from the GPU's C (updates the CPU caches)
  ref::LayerIntermediates I;
  std::vector<bf16> expect = ref::forward_from_projection(R.w, R.cache, step, g_c.data(), ldc, kTopk, &I);
  EXPECT(same_bits(R.v.down(), R.cache.v_cache), "%s: v cache differs from the reference", ctx.c_str());
  const double e_k = rel_bf16(R.k.down(), R.cache.k_cache);
  EXPECT(e_k <= 1e-2, "%s: k cache rel error %.3g", ctx.c_str(), e_k);
  const double e_tail = rel_bf16(R.tail.down(), R.cache.tail);
  EXPECT(e_tail <= 1e-2, "%s: tail rel error %.3g", ctx.c_str(), e_tail);
  const auto g_sum = R.summary.down();
  const double e_sum = rel_e4m3(g_sum, R.cache.summary_cache);
  EXPECT(e_sum <= 3e-2, "%s: summary cache rel error %.3g", ctx.c_str(), e_sum);
  const double e_iq = rel_e4m3(g_iq, I.index_q_e4m3);
  EXPECT(e_iq <= 2e-2, "%s: index_q (e4m3) rel error %.3g", ctx.c_str(), e_iq);
  EXPECT(g_w == I.weights, "%s: score weights differ from the reference's float(w) * hpg_i^-0.5", ctx.c_str());

  // ---- 3. selections against the reference scores of the GPU's own indexer inputs
  const ref::BatchView bv = step.view();
  const ref::BlockTableView btv = step.blocks(R.cache);
  const int ld = std::max(1, I.ld_scores);
  std::vector<float> rs(static_cast<std::size_t>(lg) * T * ld);
  ref::compute_scores(bv, btv, lg, r.hpg_i, P, g_iq.data(), g_w.data(), g_sum.data(), rs.data(), ld);
  int bad = 0, ties = 0, differ = 0;
  for (int gi = 0; gi < lg; ++gi)
    for (int t = 0; t < T; ++t) {
      const std::size_t row = static_cast<std::size_t>(gi) * T + t;
      const int n = I.positions[t] / kR;
      stats->strict_rows += n > kTopk;
      if (!step5_test::judge_row(rs.data() + row * ld, n, kTopk, g_ids.data() + row * W, g_cnt[row], &ties)) {
        if (bad++ < 3)
          std::fprintf(stderr, "  %s: selection row (g %d, t %d, position %d) differs beyond ties\n", ctx.c_str(), gi, t,
                       I.positions[t]);
      }
      differ += g_cnt[row] != I.counts[row] ||
                !std::equal(g_ids.begin() + row * W, g_ids.begin() + (row + 1) * W, I.topk_ids.begin() + row * W);
    }
  EXPECT(bad == 0, "%s: %d of %d selection rows differ beyond ties within rounding", ctx.c_str(), bad, lg * T);

  // ---- 4. the layer output per row (reference attention + gate + o_proj on the GPU's selection
  //         where it differs from the reference's own by an excused tie)
  if (differ > 0 && bad == 0) {
    std::vector<bf16> attn(static_cast<std::size_t>(T) * Hl * D), gated(attn.size());
    ref::sparse_attention(bv, btv, lg, r.hpg_q, D, kTopk, I.q.data(), R.cache.k_cache.data(), R.cache.v_cache.data(),
                          g_ids.data(), g_cnt.data(), attn.data(), nullptr);
    gated = attn;
    if (r.local_gate > 0)
      ref::apply_gate(T, Hl, D, attn.data(), g_c.data() + r.shard(step5::layout::Shard::kIndexG).dst_row, ldc,
                      gated.data());
    ref::gemm_bf16(T, kHidden, Hl * D, gated.data(), Hl * D, R.w.o_proj.data(), Hl * D, expect.data(), kHidden);
  }
  const double e_out = max_row_error(g_partial.data(), expect.data(), T, kHidden, kHidden, &worst);
  EXPECT(e_out <= 1e-2, "%s: o_proj partial, worst row %d (position %d): rel error %.3g", ctx.c_str(), worst,
         worst >= 0 ? I.positions[worst] : -1, e_out);
  std::printf("  %s: T %d, GEMM worst row %.2e, partial worst row %.2e (token %d), %d/%d selection rows: %d ties, %d "
              "differ from the reference's own selection\n",
              ctx.c_str(), T, e_c, e_out, worst, lg * T, lg * T, ties, differ);
  *ref_out = std::move(expect);
  return g_partial;
}

/// `options`: the layer plan's choices (default: the GEMMs on cuBLASLt where it has an algorithm).
void layer_case(const step5::layout::GeometryEntry& e, int tp, const step5::ops::DsaLayerOptions& options = {}) {
  const int hist0 = sz(4300, 4200);  // > 4096 + 8 positions: more than 512 regions
  // per step: q_len of requests 0..4 (the last step verifies MTP rows)
  const std::vector<std::vector<int>> steps = {{sz(16, 9), sz(96, 40), 0, sz(64, 30), sz(100, 24)},
                                               {sz(12, 8), sz(96, 40), 0, sz(40, 17), 0},
                                               {1, 1, 1, 1, 1},
                                               {1, 1, 0, 1, 1},
                                               {2, 1, 1, 3, 1}};
  const std::vector<int> hist = {hist0, 0, 10, 200, 0};
  const int B = static_cast<int>(hist.size());
  std::vector<int> len = hist;
  int max_tokens = 0;
  for (const auto& q : steps) {
    max_tokens = std::max(max_tokens, std::accumulate(q.begin(), q.end(), 0));
    for (int b = 0; b < B; ++b) len[b] += q[b];
  }
  const int max_seq_len = *std::max_element(len.begin(), len.end());
  const int max_blocks = (max_seq_len + kBlockSize - 1) / kBlockSize;
  const int num_blocks = B * max_blocks + 3;
  // shuffled, non-contiguous block tables; tail slot b + 1 (slot 0 unused)
  std::mt19937 rng(static_cast<std::uint32_t>(tp * 1000 + static_cast<int>(e.geometry.head_dim)));
  std::vector<std::int32_t> pool(static_cast<std::size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  ref::StepBatch proto;
  proto.max_blocks = max_blocks;
  proto.block_table.assign(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(B) * max_blocks);
  for (int b = 0; b < B; ++b) proto.tail_slot.push_back(b + 1);

  step5::ops::DsaLayerCapacity cap;
  cap.max_tokens = max_tokens, cap.max_requests = B, cap.max_seq_len = max_seq_len, cap.max_topk = kTopk;
  cap.block_size = kBlockSize, cap.max_blocks = max_blocks, cap.num_blocks = num_blocks;

  const int ranks = tp == 1 || step5_test::quick() ? 1 : tp;
  std::vector<std::unique_ptr<Rank>> R;
  for (int k = 0; k < ranks; ++k) {
    const auto rl = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), k);
    EXPECT(rl.ok(), "%s tp %d rank %d: layout", std::string(e.name).c_str(), tp, k);
    if (!rl.ok()) return;
    std::size_t ws_bytes = 0;
    const step5::Status s = step5::ops::dsa_layer_workspace_bytes(rl.layout, kHidden, cap, &ws_bytes);
    EXPECT(s.ok(), "workspace: %s", s.to_string().c_str());
    ref::LayerCache cache = ref::LayerCache::create(rl.layout, num_blocks, kBlockSize, B + 2);
    std::mt19937 hrng(static_cast<std::uint32_t>(77 + k));
    random_history(cache, proto, hist, hrng);
    R.push_back(std::make_unique<Rank>(random_weights(rl.layout, max_seq_len + 8, 1234u + 17u * k), std::move(cache),
                                       ws_bytes));
  }
  LayerCaseStats stats;
  std::vector<int> seq = hist;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    ref::StepBatch step = proto;
    step.cu_seqlens_q.assign(1, 0);
    for (int b = 0; b < B; ++b) {
      seq[b] += steps[s][b];
      step.cu_seqlens_q.push_back(step.cu_seqlens_q.back() + steps[s][b]);
    }
    step.seq_lens.assign(seq.begin(), seq.end());
    const int T = step.cu_seqlens_q.back();
    std::mt19937 xrng(static_cast<std::uint32_t>(9000 + s));
    const std::vector<bf16> x = normal_bf16(static_cast<std::size_t>(T) * kHidden, 1.0f, xrng);
    std::vector<std::vector<bf16>> gpu_parts, ref_parts;
    for (int k = 0; k < ranks; ++k) {
      const std::string ctx = std::string(e.name) + " tp " + std::to_string(tp) + " rank " + std::to_string(k) +
                              " step " + std::to_string(s);
      std::vector<bf16> ref_part;
      gpu_parts.push_back(run_rank_step(*R[k], step, x, max_seq_len, cap, ctx, &ref_part, &stats, options));
      ref_parts.push_back(std::move(ref_part));
    }
    if (ranks > 1) {  // the simulated TP all-reduce of SPEC §4.8
      const auto g_sum = ref::simulated_all_reduce(gpu_parts), r_sum = ref::simulated_all_reduce(ref_parts);
      int worst = -1;
      const double e_ar = max_row_error(g_sum.data(), r_sum.data(), T, kHidden, kHidden, &worst);
      EXPECT(e_ar <= 1e-2, "%s tp %d step %zu: all-reduced output, worst row %d: rel error %.3g",
             std::string(e.name).c_str(), tp, s, worst, e_ar);
      std::printf("  %s tp %d step %zu: all-reduce of %d ranks, worst row %.2e\n", std::string(e.name).c_str(), tp, s,
                  ranks, e_ar);
    }
  }
  EXPECT(stats.strict_rows > 0, "%s tp %d: no row had more than topk = %d regions (nothing was a strict subset)",
         std::string(e.name).c_str(), tp, kTopk);
}

}  // namespace

GPU_CASE("layer: dsa_layer_forward == reference, topk 512, chunked prefill + decode + MTP, every geometry, tp 1") {
  for (const auto& e : step5::layout::kGeometries) layer_case(e, 1);
}

GPU_CASE("layer: the GEMMs on this library's kernels (DsaLayerOptions::gemm_allow_cublaslt = false), every geometry, tp 1") {
  step5::ops::DsaLayerOptions own;
  own.gemm_allow_cublaslt = false;
  for (const auto& e : step5::layout::kGeometries) layer_case(e, 1, own);
}

GPU_CASE("layer: tp 4, every rank simulated (quick: rank 0) + simulated all-reduce, every geometry") {
  for (const auto& e : step5::layout::kGeometries) layer_case(e, 4);
}

GPU_CASE("elementwise: add_partials_to_residual == simulated_all_reduce + add_residual for 1..8 partials, bit for bit; residual_to_bf16 rounds to nearest even; a host pointer array is refused") {
  std::mt19937 rng(20261205u);
  const std::size_t n = 4096 * 3 + 5;  // a hidden size times tokens, plus an odd tail
  for (int np = 1; np <= 8; ++np) {
    std::vector<std::vector<bf16>> parts;
    std::vector<std::unique_ptr<step5_test::DevBuf<bf16>>> dparts;
    std::vector<const bf16*> ptrs;
    for (int r = 0; r < np; ++r) {
      parts.push_back(step5_test::random_bf16(n, rng, 2.f));
      dparts.push_back(std::make_unique<step5_test::DevBuf<bf16>>(parts.back()));
      ptrs.push_back(dparts.back()->p);
    }
    const std::vector<float> res0 = step5_test::random_f32(n, rng, 4.f);
    step5_test::DevBuf<float> res(res0);
    step5_test::DevBuf<const bf16*> dptrs(ptrs);
    const step5::Status s = step5::ops::add_partials_to_residual(dptrs.p, np, res.p, n, nullptr);
    GPU_CHECK(cudaDeviceSynchronize());
    EXPECT(s.ok(), "add_partials_to_residual (%d partials): %s", np, s.to_string().c_str());
    std::vector<float> want = res0;
    ref::add_residual(want.data(), ref::simulated_all_reduce(parts).data(), n);
    EXPECT(step5_test::same_bits(res.down(), want), "%d partials: residual differs from the reference", np);
    // the same host array of device pointers: refused before any launch, the residual unchanged
    // (a device that reads pageable host memory, HMM / GH200, takes it: then the sum is added again)
    int dev = 0, pageable = 0;
    GPU_CHECK(cudaGetDevice(&dev));
    GPU_CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev));
    if (pageable) continue;
    const step5::Status h = step5::ops::add_partials_to_residual(ptrs.data(), np, res.p, n, nullptr);
    EXPECT(h.code() == step5::StatusCode::kInvalidArgument &&
               h.message().find("partials is not device-readable memory") != std::string::npos,
           "a host pointer array (%d partials): %s", np, h.to_string().c_str());
    GPU_CHECK(cudaDeviceSynchronize());
    EXPECT(step5_test::same_bits(res.down(), want), "%d partials: the refused call changed the residual", np);
  }
  const std::vector<float> r = step5_test::random_f32(n, rng, 100.f);
  step5_test::DevBuf<float> dr(r);
  step5_test::DevBuf<bf16> x(n);
  GPU_CHECK(cudaMemset(x.p, 0xff, n * sizeof(bf16)));  // poison
  const step5::Status s = step5::ops::residual_to_bf16(dr.p, x.p, n, nullptr);
  GPU_CHECK(cudaDeviceSynchronize());
  EXPECT(s.ok(), "residual_to_bf16: %s", s.to_string().c_str());
  std::vector<bf16> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = step5::to_bf16(r[i]);
  EXPECT(step5_test::same_bits(x.down(), want), "residual_to_bf16 differs from to_bf16");
}

STEP5_GPU_TEST_MAIN()
