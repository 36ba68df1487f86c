// Invariants of the whole-layer CPU reference (SPEC §4–5): chunked prefill == one-shot prefill (every
// chunk size 1..20, chunks ending inside regions), prefill + decode (incl. MTP rows) == a longer
// prefill, mixed prefill/decode batches, request order, and every tp of the geometry list == tp=1.
//
// Exactness: given the same projection rows, every stage after the GEMM is per token, so
// chunking/ordering must not change a single bit of the selections, LSE and gated attention; the two
// GEMMs (fused projection, o_proj) go through OpenBLAS whose summation order may depend on the
// number of rows, so the chunking tests feed projections sliced from one GEMM and compare the o_proj
// partial within bf16 tolerance. The tp test runs the full forward (GEMM included) per rank.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "reference_test_util.hpp"
#include "step5/layout/static_layout.hpp"

using namespace reftest;
namespace ref = step5::reference;

namespace {
constexpr int kHidden = 128;
constexpr int kBlock = 16;
constexpr int kBlocksPerReq = 8;  // 128 tokens per request

struct Setup {
  GlobalWeights gw;
  ref::LayerWeights w;  // tp = 1
};

Setup make_setup(const step5::layout::Geometry& g, std::uint64_t seed) {
  Setup s;
  s.gw = random_global_weights(g, kHidden, seed);
  const auto rm = ref::make_rope_table(256, g.rot_main, 10000.0);
  const auto ri = ref::make_rope_table(256, g.rot_idx, 10000.0);
  s.w = rank_weights(s.gw, 1, 0, rm, ri);
  return s;
}

// Per-token results of a run, keyed by (request, position).
struct TokenOut {
  std::vector<bf16> gated, partial;
  std::vector<float> lse;
  std::vector<std::int32_t> ids;  // lg rows of topk+1
};
using Results = std::map<std::pair<int, int>, TokenOut>;

// Runs `schedule[step][req]` = q_len of request req in that step (0 = absent), with projections
// sliced from `C_of[req]` (one GEMM over the request's tokens). `order` permutes the requests
// inside each batch (and their block / tail slots).
Results run_schedule(const ref::LayerWeights& w, const std::vector<std::vector<bf16>>& C_of,
                     const std::vector<std::vector<int>>& schedule, int topk, const std::vector<int>& order) {
  const int R = static_cast<int>(C_of.size());
  const int ldc = w.rank.padded_rows, lg = w.rank.local_kv_groups, Hl = w.rank.local_heads, D = w.rank.geometry.head_dim;
  ref::LayerCache cache = ref::LayerCache::create(w.rank, R * kBlocksPerReq, kBlock, R);
  std::vector<int> done(R, 0);
  Results res;
  for (const auto& q_lens : schedule) {
    std::vector<int> ql, sl, slot;
    std::vector<int> reqs;
    for (int i = 0; i < R; ++i) {
      const int req = order[i];
      if (q_lens[req] == 0) continue;
      reqs.push_back(req);
      ql.push_back(q_lens[req]);
      sl.push_back(done[req] + q_lens[req]);
      slot.push_back(req);
    }
    if (reqs.empty()) continue;
    const ref::StepBatch step = make_step(ql, sl, kBlocksPerReq, slot);
    const int T = step.cu_seqlens_q.back();
    std::vector<bf16> C(static_cast<std::size_t>(T) * ldc);
    for (std::size_t i = 0; i < reqs.size(); ++i)
      std::copy_n(C_of[reqs[i]].data() + static_cast<std::size_t>(done[reqs[i]]) * ldc, static_cast<std::size_t>(ql[i]) * ldc,
                  C.data() + static_cast<std::size_t>(step.cu_seqlens_q[i]) * ldc);
    ref::LayerIntermediates I;
    const auto partial = ref::forward_from_projection(w, cache, step, C.data(), ldc, topk, &I);
    for (std::size_t i = 0; i < reqs.size(); ++i)
      for (int j = 0; j < ql[i]; ++j) {
        const int t = step.cu_seqlens_q[i] + j;
        TokenOut o;
        o.gated.assign(I.gated.begin() + static_cast<std::ptrdiff_t>(t) * Hl * D, I.gated.begin() + static_cast<std::ptrdiff_t>(t + 1) * Hl * D);
        o.partial.assign(partial.begin() + static_cast<std::ptrdiff_t>(t) * kHidden, partial.begin() + static_cast<std::ptrdiff_t>(t + 1) * kHidden);
        o.lse.assign(I.lse.begin() + static_cast<std::ptrdiff_t>(t) * Hl, I.lse.begin() + static_cast<std::ptrdiff_t>(t + 1) * Hl);
        for (int g = 0; g < lg; ++g)
          o.ids.insert(o.ids.end(), I.topk_ids.begin() + static_cast<std::ptrdiff_t>(g * T + t) * (topk + 1),
                       I.topk_ids.begin() + static_cast<std::ptrdiff_t>(g * T + t + 1) * (topk + 1));
        res[{reqs[i], done[reqs[i]] + j}] = std::move(o);
      }
    for (std::size_t i = 0; i < reqs.size(); ++i) done[reqs[i]] += ql[i];
  }
  return res;
}

void compare(const Results& a, const Results& b, double partial_tol) {
  REQUIRE(a.size() == b.size());
  std::vector<bf16> pa, pb;
  std::size_t diff_ids = 0, diff_gated = 0, diff_lse = 0;
  for (const auto& [key, x] : a) {
    const auto& y = b.at(key);
    diff_ids += x.ids != y.ids;
    diff_gated += count_bits_diff(x.gated, y.gated);
    diff_lse += x.lse != y.lse;
    pa.insert(pa.end(), x.partial.begin(), x.partial.end());
    pb.insert(pb.end(), y.partial.begin(), y.partial.end());
  }
  CHECK(diff_ids == 0);
  CHECK(diff_gated == 0);
  CHECK(diff_lse == 0);
  CHECK(rel_err(pa, pb) <= partial_tol);
}

std::vector<std::vector<bf16>> projections(const ref::LayerWeights& w, const std::vector<int>& lens, std::uint64_t seed) {
  std::vector<std::vector<bf16>> C_of;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    const auto X = random_bf16(static_cast<std::size_t>(lens[r]) * kHidden, 1.0f, seed + r);
    std::vector<bf16> C(static_cast<std::size_t>(lens[r]) * w.rank.padded_rows);
    ref::gemm_bf16(lens[r], w.rank.padded_rows, kHidden, X.data(), kHidden, w.fused.data(), kHidden, C.data(), w.rank.padded_rows);
    C_of.push_back(std::move(C));
  }
  return C_of;
}
}  // namespace

TEST_CASE("chunked prefill (chunk sizes 1..20) equals one-shot prefill; request order changes nothing") {
  const Setup s = make_setup(step5::layout::kGeometries[0].geometry, 11);
  const std::vector<int> lens = {45, 29};
  const auto C_of = projections(s.w, lens, 100);
  for (int topk : {2, 4}) {
    CAPTURE(topk);
    const Results one = run_schedule(s.w, C_of, {{45, 29}}, topk, {0, 1});
    // the two requests attend over different histories: make sure the test data is not degenerate
    CHECK(one.at({0, 44}).ids != one.at({1, 28}).ids);
    const Results swapped = run_schedule(s.w, C_of, {{45, 29}}, topk, {1, 0});
    compare(one, swapped, 0.0);
    for (int chunk = 1; chunk <= 20; ++chunk) {
      CAPTURE(chunk);
      std::vector<std::vector<int>> sched;
      int a = 0, b = 0;
      while (a < 45 || b < 29) {  // request 1 uses chunk + 3 so the two end at different places
        const int qa = std::min(chunk, 45 - a), qb = std::min(chunk + 3, 29 - b);
        sched.push_back({qa, qb});
        a += qa;
        b += qb;
      }
      compare(run_schedule(s.w, C_of, sched, topk, chunk % 2 ? std::vector<int>{0, 1} : std::vector<int>{1, 0}), one, 1e-2);
    }
  }
}

TEST_CASE("prefill + decode (1 row and MTP 2..4 rows) equals a longer prefill; mixed batches") {
  const auto& g = step5::layout::kGeometries[step5::layout::kNumGeometries - 1].geometry;  // other head dim / hpg_q
  const Setup s = make_setup(g, 23);
  const std::vector<int> lens = {37, 50, 9};
  const auto C_of = projections(s.w, lens, 200);
  const int topk = 3;
  const Results one = run_schedule(s.w, C_of, {{37, 50, 9}}, topk, {0, 1, 2});
  // request 0: prefill 30 then decode rows 1,1,4,1 ; request 1: prefill chunks while 0 decodes; request 2: decode rows
  const std::vector<std::vector<int>> sched = {
      {30, 0, 5}, {1, 17, 1}, {1, 16, 1}, {4, 17, 2}, {1, 0, 0}, {0, 0, 0}};
  compare(run_schedule(s.w, C_of, sched, topk, {2, 0, 1}), one, 1e-2);
}

TEST_CASE("every tp of the geometry list gives the tp=1 layer output (simulated all-reduce)") {
  std::map<std::string, std::vector<bf16>> tp1_out;
  std::map<std::string, GlobalWeights> global;
  const std::vector<int> prefill = {19, 26}, decode = {1, 2};
  step5::layout::for_each_layout([&](auto tag) {
    using Tag = decltype(tag);
    const std::string name(Tag::kEntry.name);
    const int tp = Tag::kParallel.tp_size;
    CAPTURE(name);
    CAPTURE(tp);
    if (!global.count(name)) global[name] = random_global_weights(Tag::kGeometry, kHidden, 31);
    const GlobalWeights& gw = global[name];
    const auto rm = ref::make_rope_table(256, Tag::kGeometry.rot_main, 10000.0);
    const auto ri = ref::make_rope_table(256, Tag::kGeometry.rot_idx, 10000.0);
    const int T1 = prefill[0] + prefill[1], T2 = decode[0] + decode[1];
    const auto X1 = random_bf16(static_cast<std::size_t>(T1) * kHidden, 1.0f, 41);
    const auto X2 = random_bf16(static_cast<std::size_t>(T2) * kHidden, 1.0f, 43);
    std::vector<std::vector<bf16>> part1, part2;
    for (int rank = 0; rank < tp; ++rank) {
      const ref::LayerWeights w = rank_weights(gw, tp, rank, rm, ri);
      ref::LayerCache cache = ref::LayerCache::create(w.rank, 2 * kBlocksPerReq, kBlock, 2);
      part1.push_back(ref::forward(w, cache, make_step(prefill, prefill, kBlocksPerReq), X1.data(), 4));
      part2.push_back(ref::forward(w, cache, make_step(decode, {prefill[0] + decode[0], prefill[1] + decode[1]}, kBlocksPerReq),
                                   X2.data(), 4));
    }
    std::vector<bf16> out = ref::simulated_all_reduce(part1);
    const auto o2 = ref::simulated_all_reduce(part2);
    out.insert(out.end(), o2.begin(), o2.end());
    if (tp == 1) {
      tp1_out[name] = out;
      double n = 0;
      for (auto v : out) n += std::fabs(step5::to_float(v));
      CHECK(n > 0);
    } else {
      REQUIRE(tp1_out.count(name));
      const double e = rel_err(out, tp1_out[name]);
      MESSAGE(name << " tp " << tp << ": rel err vs tp=1 " << e);
      CHECK(e <= 1e-2);
    }
  });
}

TEST_CASE("forward refuses bad inputs with the value in the message") {
  const Setup s = make_setup(step5::layout::kGeometries[0].geometry, 5);
  ref::LayerCache cache = ref::LayerCache::create(s.w.rank, 4, kBlock, 1);
  const auto X = random_bf16(4 * kHidden, 1.0f, 1);
  CHECK_THROWS_WITH_AS(ref::forward(s.w, cache, make_step({4}, {4}, 4), X.data(), 0), doctest::Contains("topk = 0"), step5::Error);
  CHECK_THROWS_WITH_AS(ref::forward(s.w, cache, make_step({4}, {80}, 4), X.data(), 4),
                       doctest::Contains("request 0: position 79 (seq_lens[0] = 80), expected positions < capacity 64"),
                       step5::Error);
  ref::LayerWeights bad = s.w;
  bad.q_norm.pop_back();
  CHECK_THROWS_WITH_AS(ref::forward(bad, cache, make_step({4}, {4}, 4), X.data(), 4), doctest::Contains("q_norm"), step5::Error);
  // RoPE tables shorter than max_position rows (the reference read past them: a crash when empty)
  bad = s.w;
  bad.rope_main.cos.clear();
  bad.rope_main.sin.clear();
  CHECK_THROWS_WITH_AS(ref::forward(bad, cache, make_step({4}, {4}, 4), X.data(), 4),
                       doctest::Contains("rope_main: cos/sin have 0/0 elements, expected max_position"), step5::Error);
  bad = s.w;
  bad.rope_idx.max_position += 100;
  CHECK_THROWS_WITH_AS(ref::forward(bad, cache, make_step({4}, {4}, 4), X.data(), 4),
                       doctest::Contains("rope_idx: cos/sin have"), step5::Error);
  // a StepBatch whose vectors disagree, checked before num_tokens reads cu_seqlens_q (it read past
  // the vector, or sized a vector from cu_seqlens_q[B] = -1)
  ref::StepBatch st = make_step({4}, {4}, 4);
  st.seq_lens.push_back(4);
  CHECK_THROWS_WITH_AS(ref::forward(s.w, cache, st, X.data(), 4), doctest::Contains("StepBatch sizes: cu_seqlens_q 2"),
                       step5::Error);
  st = make_step({4}, {4}, 4);
  st.cu_seqlens_q.back() = -1;
  CHECK_THROWS_WITH_AS(ref::forward(s.w, cache, st, X.data(), 4), doctest::Contains("num_tokens = -1, expected >= 0"),
                       step5::Error);
  // a cache whose buffers disagree with its fields (the KV write went past k_cache)
  ref::LayerCache small = cache;
  small.k_cache.resize(10);
  CHECK_THROWS_WITH_AS(ref::forward(s.w, small, make_step({4}, {4}, 4), X.data(), 4),
                       doctest::Contains("cache k_cache has 10 elements, expected num_blocks x block_size x kv_heads x head_dim"),
                       step5::Error);
  small = cache;
  small.num_blocks = 100;
  CHECK_THROWS_WITH_AS(ref::forward(s.w, small, make_step({4}, {4}, 4), X.data(), 4), doctest::Contains("cache k_cache has"),
                       step5::Error);
}
