// CUDA-graph capture and replay of one DSA layer step (step5/ops/layer.hpp `dsa_layer_plan` once, `dsa_layer_run`:
// fused GEMM, preparation + KV-cache write, region summaries, scores + selection, sparse
// attention, o_proj), the way an engine replays a captured decode step while the lengths change.
//
// One decode step of B requests (one row each) is captured once into a CUDA graph; it is then
// replayed for S steps while the device metadata (seq_lens: every request one token longer, so
// regions complete and summaries are written at different steps per request) and the input rows
// change between replays. Each replay is compared with the same step launched eagerly on an
// identical copy of the caches, bit for bit, after every step: every output of the layer — the
// caches (k, v, summaries, pending tail rows), the intermediates in the workspace (fused GEMM
// output, q, indexer q / weights / k, scores, selections and counts, attention output and LSE)
// and the o_proj partial. Every reduction of the layer (GEMM split-K, scores, selection,
// attention splits) is bit-reproducible, so the replay must equal the eager launch exactly. The
// launch sequence of the layer depends only on host sizes (T, B, topk, the capacity), which stay
// fixed: that is what makes the step capturable (SPEC §5: "CUDA-graph safe").
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/layer.hpp"
#include "step5/reference/rope.hpp"

using step5::bf16;
namespace layout = step5::layout;
using step5_test::DevBuf;

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

using step5_test::random_bf16;
using step5_test::random_f32;
using step5_test::same_bits;

// The caches and metadata one path (eager or graph) runs on.
struct Path {
  DevBuf<bf16> k, v, tail;
  DevBuf<std::uint8_t> summary;
  DevBuf<std::int32_t> cu, seq, table, slots;
  DevBuf<bf16> x, partial;
  DevBuf<unsigned char> ws;
  Path(std::size_t kv, std::size_t tail_n, std::size_t sum_n, int B, std::size_t table_n, std::size_t x_n,
       std::size_t ws_bytes)
      : k(kv), v(kv), tail(tail_n), summary(sum_n), cu(B + 1), seq(B), table(table_n), slots(B), x(x_n), partial(x_n),
        ws(ws_bytes) {}
};

template <class Tag>
void graph_replay_case(const char* label) {
  using L = typename Tag::Layout;
  const layout::RankLayout rank = L::template rank<0>();
  const auto& g = rank.geometry;
  const int hidden = 256, B = 4, S = 12, topk = 16, block_size = 64;
  const std::vector<int> start = {37, 200, 1001, 64};  // KV lengths before the first replay
  const int max_seq_len = *std::max_element(start.begin(), start.end()) + S;
  const int max_blocks = (max_seq_len + block_size - 1) / block_size;
  const int num_blocks = B * max_blocks;
  std::mt19937 rng(20261130u);

  // Weights (random, never zero) and RoPE tables.
  DevBuf<bf16> fused(random_bf16(static_cast<std::size_t>(rank.padded_rows) * hidden, rng, 0.05f));
  DevBuf<bf16> o_proj(random_bf16(static_cast<std::size_t>(hidden) * rank.local_heads * g.head_dim, rng, 0.02f));
  DevBuf<float> q_norm(random_f32(g.head_dim, rng, 0.1f)), k_norm(random_f32(g.head_dim, rng, 0.1f));
  DevBuf<float> iq_norm(random_f32(g.proxy_dim, rng, 0.1f)), ik_w(random_f32(g.proxy_dim, rng, 0.1f)),
      ik_b(random_f32(g.proxy_dim, rng, 0.1f));
  const auto rope_main = step5::reference::make_rope_table(max_seq_len, g.rot_main, 5e6);
  const auto rope_idx = step5::reference::make_rope_table(max_seq_len, g.rot_idx, 5e6);
  DevBuf<bf16> cos_m(rope_main.cos), sin_m(rope_main.sin), cos_i(rope_idx.cos), sin_i(rope_idx.sin);
  step5::ops::DsaLayerWeights w;
  w.fused = fused.p, w.o_proj = o_proj.p, w.q_norm = q_norm.p, w.k_norm = k_norm.p, w.index_q_norm = iq_norm.p;
  w.index_k_norm_w = ik_w.p, w.index_k_norm_b = ik_b.p, w.cos_main = cos_m.p, w.sin_main = sin_m.p;
  w.cos_idx = cos_i.p, w.sin_idx = sin_i.p, w.max_position = max_seq_len, w.eps = 1e-5f;

  step5::ops::DsaLayerCapacity cap;
  cap.max_tokens = B, cap.max_requests = B, cap.max_seq_len = max_seq_len, cap.max_topk = topk;
  cap.block_size = block_size, cap.max_blocks = max_blocks, cap.num_blocks = num_blocks;
  // plan once (outside capture); the eager steps and the captured step run the same plan
  step5::ops::DsaLayerPlan plan;
  const step5::Status plan_status = step5::ops::dsa_layer_plan(rank, hidden, cap, &plan);
  EXPECT(plan_status.ok(), "%s: plan: %s", label, plan_status.to_string().c_str());
  if (!plan_status.ok()) return;
  const std::size_t ws_bytes = plan.workspace_bytes;
  const step5::ops::detail::LayerWorkspaceMap& map = plan.map;  // where the layer keeps its intermediates

  // Identical initial caches (random history: k/v, finite e4m3 summaries, pending tail rows).
  const std::size_t kv = static_cast<std::size_t>(num_blocks) * block_size * rank.local_kv_heads * g.head_dim;
  const std::size_t sum_n = static_cast<std::size_t>(num_blocks) * (block_size / kR) * g.proxy_dim;
  const std::size_t tail_n = static_cast<std::size_t>(B) * kR * 2 * g.proxy_dim;
  const std::vector<bf16> k0 = random_bf16(kv, rng, 1.0f), v0 = random_bf16(kv, rng, 1.0f);
  const std::vector<bf16> tail0 = random_bf16(tail_n, rng, 1.0f);
  std::vector<std::uint8_t> sum0(sum_n);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (auto& s : sum0) s = step5::float_to_e4m3_bits(u(rng));
  std::vector<std::int32_t> table(static_cast<std::size_t>(B) * max_blocks);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);  // non-contiguous block tables
  const std::vector<std::int32_t> cu = {0, 1, 2, 3, 4}, slots = {0, 1, 2, 3};

  Path eager(kv, tail_n, sum_n, B, table.size(), static_cast<std::size_t>(B) * hidden, ws_bytes);
  Path graph(kv, tail_n, sum_n, B, table.size(), static_cast<std::size_t>(B) * hidden, ws_bytes);
  for (Path* p : {&eager, &graph}) {
    p->k.up(k0), p->v.up(v0), p->tail.up(tail0), p->summary.up(sum0), p->cu.up(cu), p->table.up(table);
    p->slots.up(slots);
    GPU_CHECK(cudaMemset(p->ws.p, 0, ws_bytes));
  }

  // host mirrors of the metadata (validated at each eager launch and at capture; a replay reads
  // the device arrays, re-uploaded before each launch)
  std::vector<std::int32_t> seq(B);
  auto make_step = [&](Path& p) {
    step5::ops::DsaLayerStep st;
    st.batch.cu_seqlens_q = p.cu.p, st.batch.seq_lens = p.seq.p, st.batch.num_requests = B, st.batch.num_tokens = B;
    st.batch.cu_seqlens_q_host = cu.data(), st.batch.seq_lens_host = seq.data();
    st.table.block_table = p.table.p, st.table.max_blocks = max_blocks, st.table.block_size = block_size;
    st.table.num_blocks = num_blocks;
    st.tail_slot = p.slots.p, st.max_seq_len = max_seq_len, st.topk = topk;
    return st;
  };
  auto caches_of = [](Path& p) {
    step5::ops::DsaLayerCaches c;
    c.k_cache = p.k.p, c.v_cache = p.v.p, c.summary_cache = p.summary.p, c.tail = p.tail.p, c.num_slots = 4;
    return c;
  };

  cudaStream_t stream;
  GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Capture once (lengths of step 0 uploaded before each replay, so the captured values do not matter).
  for (int b = 0; b < B; ++b) seq[b] = start[b] + 1;
  graph.seq.up(seq);
  cudaGraph_t cg = nullptr;
  GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const step5::Status captured = step5::ops::dsa_layer_run(plan, w, caches_of(graph), make_step(graph), graph.x.p,
                                                           graph.partial.p, graph.ws.p, ws_bytes, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &cg);
  EXPECT(captured.ok(), "%s: launch under capture: %s", label, captured.to_string().c_str());
  EXPECT(end == cudaSuccess, "%s: cudaStreamEndCapture: %s", label, cudaGetErrorString(end));
  if (!captured.ok() || end != cudaSuccess) {
    cudaGetLastError();
    cudaStreamDestroy(stream);
    return;
  }
  cudaGraphExec_t exec = nullptr;
  GPU_CHECK(cudaGraphInstantiate(&exec, cg, 0));

  for (int s = 0; s < S; ++s) {
    for (int b = 0; b < B; ++b) seq[b] = start[b] + s + 1;  // the row sits at position start + s
    const std::vector<bf16> x = random_bf16(static_cast<std::size_t>(B) * hidden, rng, 1.0f);
    eager.seq.up(seq), eager.x.up(x), graph.seq.up(seq), graph.x.up(x);
    GPU_CHECK(cudaMemset(eager.partial.p, 0xff, eager.partial.n * sizeof(bf16)));  // poison
    GPU_CHECK(cudaMemset(graph.partial.p, 0xff, graph.partial.n * sizeof(bf16)));
    const step5::Status st = step5::ops::dsa_layer_run(plan, w, caches_of(eager), make_step(eager), eager.x.p,
                                                       eager.partial.p, eager.ws.p, ws_bytes, stream);
    EXPECT(st.ok(), "%s: eager step %d: %s", label, s, st.to_string().c_str());
    GPU_CHECK(cudaGraphLaunch(exec, stream));
    GPU_CHECK(cudaStreamSynchronize(stream));
    const std::vector<bf16> a = eager.partial.down(), c = graph.partial.down();
    bool finite = true;
    for (bf16 v : a) finite = finite && std::isfinite(step5::to_float(v));
    EXPECT(finite, "%s: step %d: eager output has non-finite values (poison left?)", label, s);
    EXPECT(same_bits(a, c), "%s: step %d: o_proj partial of the graph replay differs from the eager launch", label, s);
    // every intermediate output in the workspace, region by region
    const auto ws_a = eager.ws.down(), ws_g = graph.ws.down();
    const struct {
      const char* name;
      std::size_t off, bytes;
    } regions[] = {{"fused GEMM output", map.c, map.q - map.c},
                   {"q", map.q, map.index_q - map.q},
                   {"index_q", map.index_q, map.weights - map.index_q},
                   {"weights", map.weights, map.index_k - map.weights},
                   {"index_k", map.index_k, map.ids - map.index_k},
                   {"topk_ids", map.ids, map.counts - map.ids},
                   {"counts", map.counts, map.attn - map.counts},
                   {"attention output", map.attn, map.lse - map.attn},
                   {"lse", map.lse, map.gemm - map.lse},
                   {"select workspace (scores)", map.select, map.select_bytes}};
    for (const auto& r : regions)
      EXPECT(std::memcmp(ws_a.data() + r.off, ws_g.data() + r.off, r.bytes) == 0,
             "%s: step %d: %s differs between the replay and the eager launch", label, s, r.name);
    EXPECT(same_bits(eager.k.down(), graph.k.down()) && same_bits(eager.v.down(), graph.v.down()),
           "%s: step %d: k or v caches differ between the replay and the eager launch", label, s);
    EXPECT(same_bits(eager.summary.down(), graph.summary.down()),
           "%s: step %d: summary caches differ between the replay and the eager launch", label, s);
  }
  EXPECT(!same_bits(eager.summary.down(), sum0), "%s: no summary was written (regions should complete)", label);
  // Pending tail rows: compare the rows that are pending after the last step.
  const std::vector<bf16> ta = eager.tail.down(), tg = graph.tail.down();
  bool tails = true;
  for (int b = 0; b < B; ++b) {
    const int pending = (start[b] + S) % kR;
    const std::size_t row = static_cast<std::size_t>(2) * g.proxy_dim;
    tails = tails && std::memcmp(&ta[b * kR * row], &tg[b * kR * row], pending * row * sizeof(bf16)) == 0;
  }
  EXPECT(tails, "%s: pending tail rows differ", label);
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(cg));
  GPU_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

GPU_CASE("graph: one decode step captured once, replayed with growing lengths == eager, every geometry") {
  layout::for_each_layout([](auto tag) {
    using Tag = decltype(tag);
    if constexpr (Tag::kParallel.tp_size == 1 || Tag::kParallel.tp_size == 8) {
      const std::string label = std::string(Tag::kEntry.name) + " tp " + std::to_string(Tag::kParallel.tp_size);
      graph_replay_case<Tag>(label.c_str());
    }
  });
}

STEP5_GPU_TEST_MAIN()
