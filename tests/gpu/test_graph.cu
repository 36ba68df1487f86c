// CUDA-graph capture and replay of one DSA layer step (step5/ops/layer.hpp `dsa_layer_plan` once, `dsa_layer_run`:
// fused GEMM, preparation + KV-cache write, region summaries, scores + selection, sparse
// attention, o_proj), the way an engine replays a captured decode step while the lengths change,
// with and without programmatic dependent launch (PDL, step5/kernels/sm90/pdl.cuh).
//
// One decode step of B requests (one row each) runs four ways on four identical copies of the
// caches: eagerly with PDL off (the baseline), eagerly with PDL on, and replayed from two CUDA
// graphs captured once each, one with PDL on (the capture must hold programmatic edges) and one
// with PDL off. Over S = 50 steps the device metadata (seq_lens: every request one token longer,
// so regions complete and summaries are written at different steps per request) and the input
// rows change between replays, while a memory-streaming kernel of varying grid size runs on
// another stream. After every step every output of the layer must equal the baseline's bit for
// bit: the caches (k, v, summaries, pending tail rows), the intermediates in the workspace (fused
// GEMM output, q, indexer q / weights / k, scores, selections and counts, attention output and
// LSE) and the o_proj partial (poisoned before each step). Every reduction of the layer (GEMM
// split-K, scores, selection) is bit-reproducible (at this test's topk 16 the attention runs one
// split; the fused split merge's graph replays are test_attention's "fused split merge" cases),
// and PDL only moves when a
// kernel is scheduled, never what it computes, so all four must agree exactly. The launch
// sequence of the layer depends only on host sizes (T, B, topk, the capacity), which stay fixed:
// that is what makes the step capturable (SPEC §5: "CUDA-graph safe").
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/layer.hpp"
#include "step5/ops/pdl.hpp"
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

/// Kernel nodes of `g`.
std::size_t kernel_nodes(cudaGraph_t g) {
  std::size_t n = 0;
  GPU_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) GPU_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::size_t k = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    GPU_CHECK(cudaGraphNodeGetType(node, &t));
    k += t == cudaGraphNodeTypeKernel;
  }
  return k;
}

/// Kernel nodes of `g` launched by this library (their function's name contains "step5"; the
/// GEMMs' cuBLASLt path adds kernels of its own, whose launch attributes cuBLASLt chooses) and how
/// many of them have an incoming programmatic (PDL) edge, or no incoming edge at all (a root).
/// `no_pdl_rule`: the selection launches that the library's rule keeps off PDL
/// (`ops::topk_launch_uses_pdl` on the node's cluster size, CTA size and rows, `num_sms`), and how
/// many of those have a programmatic edge anyway (`no_pdl_rule_with_edge`, expected 0).
struct OurNodes {
  std::size_t kernels = 0, with_programmatic_in = 0, roots = 0, no_pdl_rule = 0, no_pdl_rule_with_edge = 0;
};
OurNodes our_kernel_nodes(cudaGraph_t g, int num_sms) {
  std::size_t n = 0;
  GPU_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) GPU_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  const step5_test::GraphEdges e = step5_test::graph_edges(g);
  OurNodes o;
  for (cudaGraphNode_t node : nodes) {
    cudaKernelNodeParams kp{};
    // a kernel launched through the driver API (cuBLASLt) may have no runtime name: not ours
    const std::string name = step5_test::kernel_node_name(node, &kp);
    if (name.find("step5") == std::string::npos) continue;
    ++o.kernels;
    bool any_in = false, pe_in = false;
    for (std::size_t i = 0; i < e.to.size(); ++i)
      if (e.to[i] == node) {
        any_in = true;
        pe_in = pe_in || e.data[i].type == cudaGraphDependencyTypeProgrammatic;
      }
    bool rule_off = false;
    if (name.find("topk_select_kernel") != std::string::npos) {
      cudaLaunchAttributeValue v{};
      GPU_CHECK(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &v));
      const int kc = v.clusterDim.x > 1 ? static_cast<int>(v.clusterDim.x) : 1;
      rule_off = !step5::ops::topk_launch_uses_pdl(kc, static_cast<int>(kp.blockDim.x),
                                                   static_cast<long long>(kp.gridDim.x) / kc, num_sms);
    }
    o.no_pdl_rule += rule_off;
    o.no_pdl_rule_with_edge += rule_off && pe_in;
    o.with_programmatic_in += pe_in;
    o.roots += !any_in;
  }
  return o;
}

/// Restores the PDL switch on scope exit.
struct PdlRestore {
  bool was = step5::ops::pdl_enabled();
  ~PdlRestore() { step5::ops::set_pdl_enabled(was); }
};

template <class Tag>
void graph_replay_case(const char* label) {
  using L = typename Tag::Layout;
  const layout::RankLayout rank = L::template rank<0>();
  const auto& g = rank.geometry;
  const int hidden = 256, B = 4, S = step5_test::sz(50, 6), topk = 16, block_size = 64;
  const std::vector<int> start = {37, 200, 1001, 64};  // KV lengths before the first step
  const int max_seq_len = *std::max_element(start.begin(), start.end()) + S;
  const int max_blocks = (max_seq_len + block_size - 1) / block_size;
  const int num_blocks = B * max_blocks;
  std::mt19937 rng(20261130u);
  PdlRestore restore;

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
  // plan once (outside capture); the eager steps and the captured steps run the same plan
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

  // paths[0]: eager, PDL off (the baseline); [1]: eager, PDL on; [2]: graph captured with PDL on;
  // [3]: graph captured with PDL off.
  constexpr int kPaths = 4;
  const char* const path_name[kPaths] = {"eager (PDL off)", "eager (PDL on)", "graph replay (PDL on)",
                                         "graph replay (PDL off)"};
  const bool path_pdl[kPaths] = {false, true, true, false};
  std::vector<std::unique_ptr<Path>> paths;
  for (int i = 0; i < kPaths; ++i) {
    paths.push_back(std::make_unique<Path>(kv, tail_n, sum_n, B, table.size(), static_cast<std::size_t>(B) * hidden,
                                           ws_bytes));
    Path* p = paths.back().get();
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
  auto run = [&](Path& p, cudaStream_t s) {
    return step5::ops::dsa_layer_run(plan, w, caches_of(p), make_step(p), p.x.p, p.partial.p, p.ws.p, ws_bytes, s);
  };

  cudaStream_t stream, s_noise;
  GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  GPU_CHECK(cudaStreamCreateWithFlags(&s_noise, cudaStreamNonBlocking));
  const std::size_t noise_n = std::size_t(1) << 24;
  DevBuf<float> noise(noise_n);
  GPU_CHECK(cudaMemset(noise.p, 0, noise_n * sizeof(float)));

  // Capture each graph once (lengths of step 0 uploaded before each replay, so the captured values
  // do not matter).
  for (int b = 0; b < B; ++b) seq[b] = start[b] + 1;
  // this library's launches between the two GEMMs: prepare, [summaries], scores, selection, attention
  const std::size_t steps =
      step5::ops::indexer_prepare_folds_summaries(make_step(*paths[0]).batch, plan.facts.num_sms) ? 4 : 5;
  cudaGraphExec_t exec[kPaths] = {};
  cudaGraph_t graph[kPaths] = {};
  bool captured_all = true;
  for (int i = 2; i < kPaths; ++i) {
    paths[i]->seq.up(seq);
    step5::ops::set_pdl_enabled(path_pdl[i]);
    GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const step5::Status captured = run(*paths[i], stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph[i]);
    EXPECT(captured.ok(), "%s: %s: launch under capture: %s", label, path_name[i], captured.to_string().c_str());
    EXPECT(end == cudaSuccess, "%s: %s: cudaStreamEndCapture: %s", label, path_name[i], cudaGetErrorString(end));
    if (!captured.ok() || end != cudaSuccess) {
      cudaGetLastError();
      captured_all = false;
      break;
    }
    // the step is a chain of kernels: the fused GEMM, prepare (with step 4 inside for a decode
    // step, ops::indexer_prepare_folds_summaries; else a summaries launch after it), scores,
    // selection, attention with its fused split merge, o_proj (a decode step needs no score-tile
    // plan kernel). The PDL capture links each of this library's kernels to the previous kernel by a
    // programmatic edge (all but a first one, and the selection launches that
    // ops::topk_launch_uses_pdl keeps off PDL), the other capture none. The GEMMs may be cuBLASLt's
    // kernels (GemmPath::kCublasLt: one or more nodes each, PDL as cuBLASLt launches them), so the
    // edges are counted into this library's nodes: at least the `steps` between the GEMMs.
    const std::size_t kn = kernel_nodes(graph[i]);
    const OurNodes ours = our_kernel_nodes(graph[i], plan.facts.num_sms);
    EXPECT(kn >= steps + 2, "%s: %s: %zu kernel nodes in the captured step, expected >= %zu", label, path_name[i], kn,
           steps + 2);
    EXPECT(ours.kernels >= steps, "%s: %s: %zu of the %zu kernel nodes are this library's, expected >= %zu", label,
           path_name[i], ours.kernels, kn, steps);
    if (path_pdl[i])
      EXPECT(ours.with_programmatic_in + ours.roots + ours.no_pdl_rule == ours.kernels && ours.roots <= 1 &&
                 ours.no_pdl_rule_with_edge == 0,
             "%s: %s: of this library's %zu kernel nodes %zu have an incoming programmatic edge, %zu none at all and "
             "%zu are kept off PDL by topk_launch_uses_pdl (%zu of them with an edge); expected all but at most one "
             "first node and those, which have none",
             label, path_name[i], ours.kernels, ours.with_programmatic_in, ours.roots, ours.no_pdl_rule,
             ours.no_pdl_rule_with_edge);
    else
      EXPECT(ours.with_programmatic_in == 0, "%s: %s: %zu of this library's kernel nodes have a programmatic edge with PDL off",
             label, path_name[i], ours.with_programmatic_in);
    std::printf("  %s: %s: %zu kernel nodes (%zu of this library, %zu with a programmatic edge in), %zu programmatic edges\n",
                label, path_name[i], kn, ours.kernels, ours.with_programmatic_in,
                step5_test::programmatic_edges(graph[i]));
    GPU_CHECK(cudaGraphInstantiate(&exec[i], graph[i], 0));
  }

  // The same step planned on this library's GEMM kernels (DsaLayerOptions::gemm_allow_cublaslt =
  // false), captured with PDL on and not replayed: every kernel node is this library's and each
  // but the first has its programmatic edge, except the selection launches that
  // ops::topk_launch_uses_pdl keeps off PDL (kn - 1 - no_pdl_rule). This checks the launch
  // attributes (the o_proj GEMM's among them; the fused GEMM is the first node) — not pdl_wait
  // placement, and not results: the replays compared bit for bit above run the cuBLASLt plan.
  if (captured_all) {
    step5::ops::DsaLayerOptions own;
    own.gemm_allow_cublaslt = false;
    step5::ops::DsaLayerPlan plan_own;
    const step5::Status ps = step5::ops::dsa_layer_plan(rank, hidden, cap, &plan_own, -1, own);
    EXPECT(ps.ok() && plan_own.workspace_bytes <= ws_bytes, "%s: own-GEMM plan: %s, workspace %zu (have %zu)", label,
           ps.to_string().c_str(), plan_own.workspace_bytes, ws_bytes);
    if (ps.ok() && plan_own.workspace_bytes <= ws_bytes) {
      step5::ops::set_pdl_enabled(true);
      Path& p = *paths[2];
      cudaGraph_t g_own = nullptr;
      GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const step5::Status cs = step5::ops::dsa_layer_run(plan_own, w, caches_of(p), make_step(p), p.x.p, p.partial.p,
                                                         p.ws.p, ws_bytes, stream);
      const cudaError_t end = cudaStreamEndCapture(stream, &g_own);
      EXPECT(cs.ok() && end == cudaSuccess, "%s: own GEMMs: capture: %s, %s", label, cs.to_string().c_str(),
             cudaGetErrorString(end));
      if (cs.ok() && end == cudaSuccess) {
        const std::size_t kn = kernel_nodes(g_own), pe = step5_test::programmatic_edges(g_own);
        const OurNodes ours = our_kernel_nodes(g_own, plan.facts.num_sms);
        EXPECT(kn >= steps + 2 && ours.kernels == kn && pe == kn - 1 - ours.no_pdl_rule &&
                   ours.no_pdl_rule_with_edge == 0,
               "%s: own GEMMs, PDL on: %zu kernel nodes (%zu of this library), %zu programmatic edges; "
               "expected >= %zu, all, and kernel nodes - 1 - %zu (the selection launches topk_launch_uses_pdl "
               "keeps off PDL)",
               label, kn, ours.kernels, pe, steps + 2, ours.no_pdl_rule);
        std::printf("  %s: own GEMMs (PDL on): %zu kernel nodes, %zu programmatic edges\n", label, kn, pe);
      } else {
        cudaGetLastError();
      }
      if (g_own != nullptr) GPU_CHECK(cudaGraphDestroy(g_own));
    }
  }

  for (int s = 0; captured_all && s < S; ++s) {
    for (int b = 0; b < B; ++b) seq[b] = start[b] + s + 1;  // the row sits at position start + s
    const std::vector<bf16> x = random_bf16(static_cast<std::size_t>(B) * hidden, rng, 1.0f);
    for (auto& p : paths) {
      p->seq.up(seq), p->x.up(x);
      GPU_CHECK(cudaMemset(p->partial.p, 0xff, p->partial.n * sizeof(bf16)));  // poison
    }
    GPU_CHECK(cudaDeviceSynchronize());  // the copies and memsets (legacy stream) precede the step
    // competing work on another stream, a different grid each step
    step5_test::noise_kernel<<<33 + 17 * (s % 13), 256, 0, s_noise>>>(noise.p, noise_n, 2);
    GPU_CHECK(cudaGetLastError());
    for (int i = 0; i < 2; ++i) {
      step5::ops::set_pdl_enabled(path_pdl[i]);
      const step5::Status st = run(*paths[i], stream);
      EXPECT(st.ok(), "%s: %s: step %d: %s", label, path_name[i], s, st.to_string().c_str());
    }
    step5_test::noise_kernel<<<41 + 23 * (s % 7), 256, 0, s_noise>>>(noise.p, noise_n, 2);
    GPU_CHECK(cudaGetLastError());
    for (int i = 2; i < kPaths; ++i) GPU_CHECK(cudaGraphLaunch(exec[i], stream));
    GPU_CHECK(cudaStreamSynchronize(stream));
    GPU_CHECK(cudaStreamSynchronize(s_noise));

    const Path& base = *paths[0];
    const std::vector<bf16> out0 = base.partial.down();
    bool finite = true;
    for (bf16 v : out0) finite = finite && std::isfinite(step5::to_float(v));
    EXPECT(finite, "%s: step %d: baseline output has non-finite values (poison left?)", label, s);
    const auto ws0 = base.ws.down();
    // the split-K counters at the start of the GEMM workspace are left zero by every launch
    const std::size_t counters = step5::ops::kGemmCounterBytes;  // inside the region (layer_workspace_map)
    EXPECT(std::all_of(ws0.begin() + map.gemm, ws0.begin() + map.gemm + counters,
                       [](unsigned char c) { return c == 0; }),
           "%s: step %d: GEMM split-K counters not back to zero", label, s);
    const auto k_0 = base.k.down(), v_0 = base.v.down();
    const auto sum_0 = base.summary.down();
    for (int i = 1; i < kPaths; ++i) {
      const Path& p = *paths[i];
      EXPECT(same_bits(out0, p.partial.down()), "%s: step %d: o_proj partial of %s differs from %s", label, s,
             path_name[i], path_name[0]);
      // every intermediate output in the workspace, region by region
      const auto ws_i = p.ws.down();
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
                     {"GEMM split-K workspace", map.gemm, std::max(map.gemm_bytes, step5::ops::kGemmCounterBytes)},
                     {"select workspace (scores)", map.select, map.select_bytes}};
      for (const auto& r : regions)
        EXPECT(std::memcmp(ws0.data() + r.off, ws_i.data() + r.off, r.bytes) == 0,
               "%s: step %d: %s differs between %s and %s", label, s, r.name, path_name[i], path_name[0]);
      EXPECT(same_bits(k_0, p.k.down()) && same_bits(v_0, p.v.down()),
             "%s: step %d: k or v caches of %s differ from %s", label, s, path_name[i], path_name[0]);
      EXPECT(same_bits(sum_0, p.summary.down()), "%s: step %d: summary caches of %s differ from %s", label, s,
             path_name[i], path_name[0]);
    }
  }
  EXPECT(!same_bits(paths[0]->summary.down(), sum0), "%s: no summary was written (regions should complete)", label);
  // Pending tail rows: compare the rows that are pending after the last step.
  const std::vector<bf16> ta = paths[0]->tail.down();
  for (int i = 1; captured_all && i < kPaths; ++i) {
    const std::vector<bf16> tg = paths[i]->tail.down();
    bool tails = true;
    for (int b = 0; b < B; ++b) {
      const int pending = (start[b] + S) % kR;
      const std::size_t row = static_cast<std::size_t>(2) * g.proxy_dim;
      tails = tails && std::memcmp(&ta[b * kR * row], &tg[b * kR * row], pending * row * sizeof(bf16)) == 0;
    }
    EXPECT(tails, "%s: pending tail rows of %s differ from %s", label, path_name[i], path_name[0]);
  }
  for (int i = 2; i < kPaths; ++i) {
    if (exec[i] != nullptr) GPU_CHECK(cudaGraphExecDestroy(exec[i]));
    if (graph[i] != nullptr) GPU_CHECK(cudaGraphDestroy(graph[i]));
  }
  GPU_CHECK(cudaStreamDestroy(s_noise));
  GPU_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

GPU_CASE(
    "graph: one decode step, PDL off == PDL on == graph replays (PDL on and off), 50 steps with growing lengths "
    "and concurrent work, every geometry") {
  layout::for_each_layout([](auto tag) {
    using Tag = decltype(tag);
    if constexpr (Tag::kParallel.tp_size == 1 || Tag::kParallel.tp_size == 8) {
      const std::string label = std::string(Tag::kEntry.name) + " tp " + std::to_string(Tag::kParallel.tp_size);
      graph_replay_case<Tag>(label.c_str());
    }
  });
}

STEP5_GPU_TEST_MAIN()
