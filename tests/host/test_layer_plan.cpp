// Host tests of the layer plan (step5/ops/layer.hpp): the workspace map (sizes, 256-byte
// alignment, no overlap), refusal of steps beyond the plan's capacity naming the numbers, and
// reuse of one plan for many steps. `dsa_layer_plan_for` builds plans from given device facts,
// so no GPU is needed; the device path (`dsa_layer_plan`) runs in tests/gpu/test_graph.cu and
// examples/engine_minimal.cu.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#if __has_include(<cuda_runtime_api.h>)  // ops/ headers need the CUDA runtime API header

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "step5/ops/elementwise.hpp"
#include "step5/ops/layer.hpp"

namespace ops = step5::ops;
namespace layout = step5::layout;
using step5::StatusCode;

namespace {

layout::RankLayout rank_of(const char* geometry, int tp, int rank) {
  const layout::GeometryEntry* e = layout::find_geometry(geometry);
  REQUIRE(e != nullptr);
  const auto r = layout::make_rank_layout(e->geometry, layout::standard_layout(e->geometry, tp), rank);
  REQUIRE(r.ok());
  return r.layout;
}

// An engine-sized capacity: 256 tokens per step, 64 requests, 32K context, topk 512.
ops::DsaLayerCapacity engine_capacity() {
  ops::DsaLayerCapacity c;
  c.max_tokens = 256, c.max_requests = 64, c.max_seq_len = 32768, c.max_topk = 512;
  c.block_size = 64, c.max_blocks = 512, c.num_blocks = 64 * 512;
  return c;
}

ops::DsaLayerDeviceFacts h200_facts() {
  ops::DsaLayerDeviceFacts f;
  f.device = 0, f.num_sms = 132, f.gemm_workspace_bytes = 3 << 20;
  return f;
}

/// A host-valid decode step of `B` requests, one token each, at KV length `len` (host mirrors only:
/// the checks never read device memory).
struct Step {
  std::vector<std::int32_t> cu, lens;
  ops::DsaLayerStep s;
  Step(int B, int len, int topk, const ops::DsaLayerCapacity& cap) : cu(B + 1), lens(B, len) {
    for (int b = 0; b <= B; ++b) cu[b] = b;
    static const std::int32_t kDevice[1] = {0};  // stands for device pointers (never read)
    s.batch.num_tokens = B, s.batch.num_requests = B;
    s.batch.cu_seqlens_q = kDevice, s.batch.seq_lens = kDevice;
    s.batch.cu_seqlens_q_host = cu.data(), s.batch.seq_lens_host = lens.data();
    s.table.block_table = kDevice, s.table.block_size = cap.block_size, s.table.max_blocks = cap.max_blocks;
    s.table.num_blocks = cap.num_blocks;
    s.tail_slot = kDevice;
    s.max_seq_len = len, s.topk = topk;
  }
};

/// Host stand-ins for a layer's weights and caches (16-byte aligned, never read: the checks under
/// test refuse before any launch); `buf` doubles as x, partial and a workspace.
struct HostStandIns {
  alignas(64) static inline unsigned char buf[256];
  step5::bf16* b = reinterpret_cast<step5::bf16*>(buf);
  ops::DsaLayerWeights w;
  ops::DsaLayerCaches caches;
  explicit HostStandIns(int num_slots) {
    w.max_position = 32768, w.fused = b, w.o_proj = b;
    caches.k_cache = caches.v_cache = caches.tail = b, caches.summary_cache = buf, caches.num_slots = num_slots;
  }
};

}  // namespace

TEST_CASE("workspace map: every buffer 256-byte aligned, disjoint, at least its size, total = plan size") {
  for (const char* g : {"step5_preview", "dsa_h64_kv8_d128"}) {
    for (int tp : {1, 8}) {
      CAPTURE(g);
      CAPTURE(tp);
      const layout::RankLayout r = rank_of(g, tp, tp - 1);
      const ops::DsaLayerCapacity cap = engine_capacity();
      ops::DsaLayerPlan plan;
      REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
      const ops::detail::LayerWorkspaceMap& m = plan.map;
      const std::size_t T = cap.max_tokens, D = r.geometry.head_dim, P = r.geometry.proxy_dim;
      const std::size_t Hl = r.local_heads, Il = r.index_local_heads, lg = r.local_kv_groups;
      // (offset, bytes needed) in workspace order
      const std::vector<std::pair<std::size_t, std::size_t>> regions = {
          {m.c, T * r.padded_rows * 2},
          {m.q, T * Hl * D * 2},
          {m.index_q, T * Il * P},
          {m.weights, T * Il * 4},
          {m.index_k, T * P * 2},
          {m.ids, lg * T * (cap.max_topk + 1) * 4},
          {m.counts, lg * T * 4},
          {m.attn, T * Hl * D * 2},
          {m.lse, T * Hl * 4},
          {m.gemm, std::max<std::size_t>(3 << 20, ops::kGemmCounterBytes)},
          {m.select, ops::indexer_select_workspace_bytes(r, 1, cap.max_seq_len, cap.max_requests)},
          {m.attn_ws, m.attn_ws_bytes}};
      for (std::size_t i = 0; i < regions.size(); ++i) {
        CAPTURE(i);
        CHECK(regions[i].first % 256 == 0);
        const std::size_t end = i + 1 < regions.size() ? regions[i + 1].first : m.total;
        CHECK(end >= regions[i].first + regions[i].second);  // room for the buffer, no overlap
      }
      CHECK(m.gemm_bytes == std::size_t{3} << 20);
      CHECK(m.select_bytes >= ops::indexer_select_workspace_bytes(r, std::min<int>(64, cap.max_tokens),
                                                                  cap.max_seq_len, cap.max_requests));
      // the split-KV space: the largest the attention planner asks for a decode step of 1 or 4
      // rows per request, 1 .. max_requests requests
      std::size_t largest = 0;
      for (int b = 1; b <= cap.max_requests; ++b)
        for (const int rows : {1, 4}) {
          CAPTURE(b);
          CAPTURE(rows);
          ops::SparseAttentionPlan ap;
          const ops::SparseAttentionParams a = ops::detail::attention_sizes(
              r, std::min(cap.max_tokens, rows * b), b, cap.max_topk, cap.block_size, cap.max_blocks, cap.num_blocks);
          REQUIRE(ops::sparse_attention_plan(a, 132, &ap).ok());
          CHECK(ap.workspace_bytes <= m.attn_ws_bytes);
          largest = std::max(largest, ap.workspace_bytes);
          if (b == 1) CHECK(ap.num_splits > 1);  // batch 1 on 132 SMs splits the KV range
        }
      CHECK(m.attn_ws_bytes == largest);
      CHECK(m.attn_ws_bytes > 0);
      CHECK(plan.workspace_bytes == m.total);
      CHECK(m.total % 256 == 0);
    }
  }
}

TEST_CASE("selection chunks: the fewest chunks, sizes within one token of each other, the bench prefill plans") {
  // the rule itself, over a grid of token counts and workspace fits
  for (int T = 1; T <= 300; ++T)
    for (std::size_t fit = 1; fit <= 80; ++fit) {
      CAPTURE(T);
      CAPTURE(fit);
      const ops::SelectChunks c = ops::select_chunks(T, fit);
      const std::size_t f = std::min<std::size_t>(fit, T);
      REQUIRE(static_cast<std::size_t>(c.count) == (T + f - 1) / f);  // the fewest chunks that fit
      CHECK(c.begin(0) == 0);
      CHECK(c.begin(c.count) == T);
      int smallest = T, largest = 0;
      for (int k = 0; k < c.count; ++k) {
        const int n = c.begin(k + 1) - c.begin(k);
        smallest = std::min(smallest, n);
        largest = std::max(largest, n);
      }
      CHECK(smallest >= 1);
      CHECK(static_cast<std::size_t>(largest) <= fit);  // every chunk fits the workspace
      CHECK(largest - smallest <= 1);                  // no short tail
      CHECK(c.max_tokens() == largest);
    }
  // cases a rounded-up equal size got wrong (its last chunk: 1, 1 and 7 tokens)
  for (const auto& [T, fit] : {std::pair<int, int>{10, 3}, {4033, 64}, {32768, 181}}) {
    CAPTURE(T);
    const ops::SelectChunks c = ops::select_chunks(T, fit);
    CHECK(c.begin(c.count) - c.begin(c.count - 1) >= c.max_tokens() - 1);
  }
  CHECK(ops::select_chunks(0, 100).count == 0);
  CHECK(ops::select_chunks(5, 0).count == 5);  // a fit of 0 is taken as 1 (the launcher's minimum)
  CHECK(ops::select_chunks(32768, 16382).count == 3);  // max-size chunks were 16382 + 16382 + 4
  CHECK(ops::select_chunks(32768, 16382).begin(1) == 10923);
  CHECK(ops::select_chunks(32768, 16384).max_tokens() == 16384);

  // bench_layer's prefill plans (step5_preview, one request, max_seq_len = tokens): the launcher's
  // chunk from the plan's selection workspace. tp 8 (one KV group): 32K tokens in two chunks of
  // 16384 (it was 16382 + 16382 + 4: a 4-token chunk cost ~140 µs); tp 1 (4 groups) at 32K: chunks
  // of 4096 (4094 before: a 16-token ninth chunk); at 8K every step is one chunk.
  for (const auto& [tp, tokens, chunk] : {std::array<int, 3>{8, 32768, 16384}, std::array<int, 3>{1, 32768, 4096},
                                         std::array<int, 3>{8, 8192, 8192}, std::array<int, 3>{1, 8192, 8192}}) {
    CAPTURE(tp);
    CAPTURE(tokens);
    const layout::RankLayout r = rank_of("step5_preview", tp, 0);
    ops::DsaLayerCapacity cap;
    cap.max_tokens = tokens, cap.max_requests = 1, cap.max_seq_len = tokens, cap.max_topk = 512;
    cap.block_size = 64, cap.max_blocks = tokens / 64, cap.num_blocks = tokens / 64;
    ops::DsaLayerPlan plan;
    REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
    const ops::SelectChunks c = ops::indexer_select_chunks(r, tokens, tokens, 1, plan.map.select_bytes);
    CHECK(c.max_tokens() == chunk);
    CHECK(c.count * chunk == tokens);
  }
}

TEST_CASE("indexer_prepare does step 4 in its own launch exactly for decode steps of the few-token instance") {
  using step5::ops::IndexerBatch;
  using step5::ops::indexer_prepare_folds_summaries;
  using step5::ops::indexer_prepare_many_tokens;
  const int sms = 132;
  auto batch = [](const std::vector<std::int32_t>& cu) {
    return IndexerBatch{nullptr, nullptr, static_cast<int>(cu.size()) - 1, cu.back(), cu.data(), nullptr};
  };
  CHECK(indexer_prepare_folds_summaries(batch({0, 1, 2, 3}), sms));
  CHECK(indexer_prepare_folds_summaries(batch({0, 1, 1, 2}), sms));   // an idle request
  CHECK(!indexer_prepare_folds_summaries(batch({0, 2, 3}), sms));     // MTP: 2 tokens of request 0
  CHECK(!indexer_prepare_folds_summaries(batch({0, 0, 0}), sms));     // nothing to do
  IndexerBatch no_mirror = batch({0, 1, 2});
  no_mirror.cu_seqlens_q_host = nullptr;
  CHECK(!indexer_prepare_folds_summaries(no_mirror, sms));
  // the instance rule: 2 x num_sms tokens and more run the many-token instance, which has no fold
  std::vector<std::int32_t> cu(2 * sms + 1);
  for (std::size_t i = 0; i < cu.size(); ++i) cu[i] = static_cast<std::int32_t>(i);
  CHECK(indexer_prepare_many_tokens(2 * sms, sms));
  CHECK(!indexer_prepare_many_tokens(2 * sms - 1, sms));
  CHECK(!indexer_prepare_folds_summaries(batch(cu), sms));
  cu.pop_back();
  CHECK(indexer_prepare_folds_summaries(batch(cu), sms));
}

TEST_CASE("selection launches take PDL except one 512-thread CTA per row on at most one row per SM") {
  using step5::ops::topk_launch_uses_pdl;
  CHECK_FALSE(topk_launch_uses_pdl(1, 512, 64, 132));   // tp 8 decode batch 64: measured faster without
  CHECK_FALSE(topk_launch_uses_pdl(1, 512, 132, 132));
  CHECK(topk_launch_uses_pdl(1, 512, 133, 132));
  CHECK(topk_launch_uses_pdl(1, 512, 256, 132));        // tp 1 batch 64
  CHECK(topk_launch_uses_pdl(1, 128, 64, 132));         // shorter rows' CTAs: not measured without PDL
  CHECK(topk_launch_uses_pdl(1, 256, 64, 132));
  CHECK(topk_launch_uses_pdl(8, 512, 1, 132));          // clusters (batch 1)
  CHECK(topk_launch_uses_pdl(8, 512, 64, 132));
}

TEST_CASE("plan: refused capacities and device facts name the values") {
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  ops::DsaLayerPlan plan;
  ops::DsaLayerCapacity cap = engine_capacity();
  cap.max_topk = 2048;
  step5::Status s = ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("max_topk = 2048") != std::string::npos);
  CHECK(s.message().find("1024") != std::string::npos);
  // more requests than the summaries launch takes: refused by the plan, not mid-step (and not
  // after planning attention for every batch size up to INT_MAX)
  cap = engine_capacity();
  cap.max_requests = ops::kMaxIndexerRequests + 1;
  s = ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("max_requests = 65536") != std::string::npos);
  CHECK(s.message().find("max_requests <= 65535") != std::string::npos);
  cap.max_requests = std::numeric_limits<int>::max();
  CHECK(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).code() == StatusCode::kInvalidArgument);
  // a max_seq_len whose score rows the score grid cannot cover (65535 rows of 2048 regions):
  // refused by the plan, naming the bound (it used to plan, then refuse every step)
  cap = engine_capacity();
  cap.max_seq_len = ops::kMaxIndexerSeqLen + 8;
  s = ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("max_seq_len = 1073725448") != std::string::npos, s.message());
  CHECK_MESSAGE(s.message().find("max_seq_len <= 1073725440 (kMaxIndexerSeqLen)") != std::string::npos, s.message());
  static_assert(ops::kMaxIndexerSeqLen == 1073725440);
  // a RankLayout that is not make_rank_layout's (an edited shard offset, a wrong rank index)
  for (int which = 0; which < 3; ++which) {
    layout::RankLayout bad = r;
    if (which == 0) bad.shards[static_cast<int>(layout::Shard::kIndexQ)].dst_row += 8;
    if (which == 1) bad.tp_rank = 1;  // the fields of rank 0 under rank 1's index
    if (which == 2) bad.padded_rows += 8;
    CAPTURE(which);
    s = ops::dsa_layer_plan_for(bad, 4096, engine_capacity(), h200_facts(), &plan);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("inconsistent RankLayout") != std::string::npos);
    CHECK(s.message().find("make_rank_layout") != std::string::npos);
    // the first field that differs, its value and make_rank_layout's
    // (which 1: rank 1's first differing field depends on tp; the message names one either way)
    const std::string want =
        which == 0 ? "shards[index_q].dst_row = " + std::to_string(r.shards[3].dst_row + 8) + ", expected " +
                         std::to_string(r.shards[3].dst_row)
        : which == 1 ? ", expected "
                     : "padded_rows = " + std::to_string(r.padded_rows + 8) + ", expected " + std::to_string(r.padded_rows);
    CHECK_MESSAGE(s.message().find(want) != std::string::npos, s.message());
  }
  CHECK(ops::dsa_layer_plan_for(r, 4096, engine_capacity(), h200_facts(), &plan).ok());
  ops::DsaLayerDeviceFacts f = h200_facts();
  f.num_sms = 0;
  s = ops::dsa_layer_plan_for(r, 4096, engine_capacity(), f, &plan);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("num_sms = 0") != std::string::npos);
  // a GEMM workspace share whose 256-byte rounding wraps: refused naming it (the plan was Ok with
  // a total of 28 MB, the selection's buffer at the GEMM's offset and gemm_bytes ~2^64 passed to
  // the GEMMs at run time)
  f = h200_facts();
  f.gemm_workspace_bytes = std::numeric_limits<std::size_t>::max() - 100;
  s = ops::dsa_layer_plan_for(r, 4096, engine_capacity(), f, &plan);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("dsa_layer_plan: facts.gemm_workspace_bytes = 18446744073709551515") != std::string::npos,
                s.message());
  CHECK_MESSAGE(s.message().find("expected facts.gemm_workspace_bytes <= 9223372036854775807") != std::string::npos,
                s.message());
  f.gemm_workspace_bytes = std::numeric_limits<std::int64_t>::max();  // the bound itself: a map without wrap
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, engine_capacity(), f, &plan).ok());
  CHECK(plan.map.select >= plan.map.gemm + plan.map.gemm_bytes);
  CHECK(plan.workspace_bytes > plan.map.gemm_bytes);
  f = h200_facts();
  f.device = -2;
  s = ops::dsa_layer_plan_for(r, 4096, engine_capacity(), f, &plan);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("dsa_layer_plan: facts.device = -2") != std::string::npos, s.message());
  CHECK(ops::dsa_layer_plan_for(r, 4096, engine_capacity(), h200_facts(), nullptr).code() ==
        StatusCode::kInvalidArgument);
  // an empty plan is refused by run's checks, not used
  const ops::DsaLayerPlan empty;
  Step st(1, 100, 64, engine_capacity());
  s = ops::dsa_layer_check_step(empty, st.s, 1 << 20);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("dsa_layer_plan") != std::string::npos);
}

TEST_CASE("device: -1 is the current device; any other negative device is refused naming it, before any CUDA call") {
  // (no GPU is needed: each refusal comes before the device is queried)
  int d = 12345;
  step5::Status s = step5::resolve_device(-7, "x: device", &d);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "x: device = -7, expected -1 (the current device) or a device ordinal >= 0");
  CHECK(d == 12345);
  CHECK(step5::resolve_device(3, "x", &d).ok());
  CHECK(d == 3);
  CHECK(step5::check_device_arg(-1, "x").ok());
  CHECK(step5::check_device_arg(std::numeric_limits<int>::min(), "x").code() == StatusCode::kInvalidArgument);
  {
    const step5::DeviceScope scope(-2);
    CHECK(scope.status.code() == StatusCode::kInvalidArgument);
    CHECK(scope.status.message().find("device = -2") != std::string::npos);
  }
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  ops::DsaLayerPlan plan;
  s = ops::dsa_layer_plan(r, 4096, engine_capacity(), &plan, -3);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("dsa_layer_plan: device = -3") != std::string::npos, s.message());
  ops::SparseAttentionParams ap;
  ap.device = -5;
  std::size_t bytes = 0;
  s = ops::sparse_attention_workspace_size(ap, &bytes);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("sparse_attention_workspace_size: device = -5") != std::string::npos, s.message());
  // the GEMM: also for an empty product (which plans without querying the device)
  alignas(16) static step5::bf16 buf[64 * 64];
  for (const std::int64_t tokens : {0, 4}) {
    ops::GemmParams gp;
    gp.tokens = tokens;
    gp.n = gp.k = gp.ldx = gp.ldw = gp.ldc = 64;
    gp.x = gp.w = buf;
    gp.c = buf;
    gp.device = -9;
    ops::GemmPlan gplan;
    s = ops::gemm_plan(gp, &gplan);
    CAPTURE(tokens);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find("gemm_bf16: device = -9") != std::string::npos, s.message());
  }
  CHECK(ops::gemm_workspace_bytes(16, 64, 64, -4) == 0);
  // the run-time attention entry point: refused before the current device is checked
  s = ops::sparse_attention(r, ap, nullptr, 0, nullptr);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("sparse_attention: device = -5") != std::string::npos, s.message());
}

/// One row of topk_select on host buffers of 64 bytes each (scores, history, ids, counts), topk 4,
/// ld 8: the arguments the refusal cases below vary one at a time (never launched: each refusal
/// comes before any CUDA call).
static ops::TopkSelectParams small_topk_params() {
  alignas(16) static unsigned char mem[4][64];
  ops::TopkSelectParams p;
  p.scores = reinterpret_cast<const float*>(mem[0]);
  p.history = reinterpret_cast<const std::int32_t*>(mem[1]);
  p.ids = reinterpret_cast<std::int32_t*>(mem[2]);
  p.counts = reinterpret_cast<std::int32_t*>(mem[3]);
  p.rows = 1;
  p.topk = 4;
  p.ld = 8;
  p.ld_ids = 5;
  return p;
}

TEST_CASE("topk_select: a pointer not 4-byte aligned is refused naming it, before any CUDA call") {
  const ops::TopkSelectParams p = small_topk_params();
  const char* names[] = {"scores", "history", "ids", "counts"};
  for (int which = 0; which < 4; ++which) {
    ops::TopkSelectParams q = p;
    const auto shifted = [](auto* ptr, int bytes) {  // ptr moved by `bytes` (same type)
      using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(ptr)>>, const char, char>;
      return reinterpret_cast<decltype(ptr)>(reinterpret_cast<Byte*>(ptr) + bytes);
    };
    if (which == 0) q.scores = shifted(p.scores, 2);
    if (which == 1) q.history = shifted(p.history, 1);
    if (which == 2) q.ids = shifted(p.ids, 3);
    if (which == 3) q.counts = shifted(p.counts, 2);
    const step5::Status s = ops::topk_select(q, nullptr);
    CAPTURE(which);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(std::string("topk_select: ") + names[which] + " is at an address") != std::string::npos,
                  s.message());
    CHECK_MESSAGE(s.message().find("expected 4-byte aligned") != std::string::npos, s.message());
  }
}

TEST_CASE("gemm: tokens, n or k above kGemmMaxDim are refused naming them, before any device query") {
  // The split-K and wgmma kernels hold the sizes rounded up to whole tiles in int32: k = 2^31 - 8
  // overflowed their k-tile count (no K tile ran: C = 0), and n = 2^31 - 1 the last 152-row weight
  // tile's column index (a negative index passed the n < N store test). Both were accepted (the
  // old rule was < 2^31); the pointers are never read (the refusal comes before the plan).
  CHECK(ops::kGemmMaxDim == (std::int64_t{1} << 31) - 256);
  alignas(16) static step5::bf16 buf[64];
  const std::int64_t big = std::int64_t{0x7fffffff};
  struct Case {
    std::int64_t tokens, n, k;
  };
  for (const Case c : {Case{1, big, 8}, Case{1, 8, big - 7}, Case{1, ops::kGemmMaxDim + 1, 8},
                       Case{1, 8, ops::kGemmMaxDim + 8}}) {
    for (const ops::GemmPath path : {ops::GemmPath::kAuto, ops::GemmPath::kWgmma, ops::GemmPath::kSplitK}) {
      ops::GemmParams gp;
      gp.tokens = c.tokens, gp.n = c.n, gp.k = c.k;
      gp.ldx = gp.ldw = c.k, gp.ldc = (c.n + 1) / 2 * 2;
      gp.x = gp.w = buf;
      gp.c = buf;
      gp.path = path;
      gp.config = path == ops::GemmPath::kWgmma ? 3 : 0;  // the 152-row tile kind
      ops::GemmPlan plan;
      const step5::Status s = ops::gemm_plan(gp, &plan);
      CAPTURE(c.n);
      CAPTURE(c.k);
      CAPTURE(static_cast<int>(path));
      CHECK(s.code() == StatusCode::kInvalidArgument);
      CHECK_MESSAGE(s.message().find("gemm_bf16: tokens, n, k must each be <= 2147483392 (kGemmMaxDim") !=
                        std::string::npos,
                    s.message());
      CHECK_MESSAGE(s.message().find("got 1, " + std::to_string(c.n) + ", " + std::to_string(c.k)) != std::string::npos,
                    s.message());
      CHECK(step5::ops::gemm_bf16(gp, nullptr).code() == StatusCode::kInvalidArgument);
    }
  }
  // the largest sizes pass this rule (whatever the device says next)
  ops::GemmParams gp;
  gp.tokens = 1, gp.n = ops::kGemmMaxDim, gp.k = ops::kGemmMaxDim;
  gp.allow_cublaslt = false;
  gp.ldx = gp.ldw = gp.k, gp.ldc = gp.n;
  gp.x = gp.w = buf;
  gp.c = buf;
  ops::GemmPlan plan;
  const step5::Status s = ops::gemm_plan(gp, &plan);
  CHECK_MESSAGE(s.message().find("kGemmMaxDim") == std::string::npos, s.message());
}

TEST_CASE("gemm_plan / gemm_bf16: a bad path, split_k or forced-path config is refused before the device query") {
  // These rules need no device; they ran after it, so a machine without a GPU answered kCudaError
  // (no device) where a GPU machine answered kInvalidArgument naming the value.
  // disjoint X [2 or 17, 8], W [8, 8] and C (gemm_bf16 refuses overlaps); the pointers are never read
  alignas(16) static step5::bf16 xs[17 * 8], ws[8 * 8], cs[17 * 8];
  const auto base = [] {
    ops::GemmParams gp;
    gp.tokens = 2, gp.n = 8, gp.k = 8;
    gp.ldx = gp.ldw = 8, gp.ldc = 8;
    gp.x = xs;
    gp.w = ws;
    gp.c = cs;
    return gp;
  };
  struct Case {
    const char* what;
    ops::GemmParams gp;
    std::string expect;
  };
  std::vector<Case> cases;
  ops::GemmParams gp = base();
  gp.split_k = -1;
  cases.push_back({"split_k -1", gp, "gemm_bf16: split_k = -1 must be >= 0"});
  gp = base();
  gp.path = static_cast<ops::GemmPath>(9);
  cases.push_back({"path 9", gp, "gemm_bf16: path = 9, expected 0..5 (GemmPath)"});
  gp = base();
  gp.path = ops::GemmPath::kWgmma;
  gp.x = xs + 1;  // 2 bytes off: the fast paths need 16-byte aligned x
  cases.push_back({"forced wgmma, x unaligned", gp, "the wgmma path needs 16-byte aligned x/w"});
  gp = base();
  gp.path = ops::GemmPath::kWgmma;
  gp.config = 99;
  cases.push_back({"wgmma config", gp, "gemm_bf16: config = 99 for the wgmma path; expected 0.."});
  gp = base();
  gp.path = ops::GemmPath::kSplitK;
  gp.config = -1;
  cases.push_back({"split-K config", gp, "gemm_bf16: config = -1 for the split-K path; expected 0.."});
  gp = base();
  gp.path = ops::GemmPath::kGemv;
  gp.config = ops::kGemmGemvTensorCoresWindowed + 1;
  cases.push_back({"gemv config", gp, "gemm_bf16: config = 4, split_k = 0 with path kGemv"});
  gp = base();
  gp.path = ops::GemmPath::kGemv;
  gp.tokens = ops::kGemmGemvMaxTokens + 1;
  cases.push_back({"gemv tokens", gp, "gemm_bf16: the gemv path runs 1..16 tokens"});
  for (const Case& c : cases) {
    CAPTURE(c.what);
    ops::GemmPlan plan;
    const step5::Status s = ops::gemm_plan(c.gp, &plan);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(c.expect) != std::string::npos, s.message());
    CHECK(ops::gemm_bf16(c.gp, nullptr).code() == StatusCode::kInvalidArgument);
  }
  // a forced kCublasLt with a config: kInvalidArgument, or kUnsupported in a build without cuBLASLt
  gp = base();
  gp.path = ops::GemmPath::kCublasLt;
  gp.config = 2;
  ops::GemmPlan plan;
  const step5::Status s = ops::gemm_plan(gp, &plan);
  const bool refused =
      (s.code() == StatusCode::kInvalidArgument &&
       s.message().find("gemm_bf16: config = 2, split_k = 0 with path kCublasLt") != std::string::npos) ||
      (s.code() == StatusCode::kUnsupported && s.message().find("built without cuBLASLt") != std::string::npos);
  CHECK_MESSAGE(refused, s.message());
}

TEST_CASE("topk_select: ld above kTopkMaxLd is refused naming it, before any CUDA call") {
  // The selection kernel's int32 key indices run past a row by up to a stride: ld = 2^31 - 1 (the
  // old bound, INT32_MAX) overflowed them. The pointers are never read (refused before a launch).
  ops::TopkSelectParams p = small_topk_params();
  CHECK(ops::kTopkMaxLd == std::int64_t{1} << 30);
  for (const std::int64_t ld : {ops::kTopkMaxLd + 1, std::int64_t{0x7fffffff} - 4095, std::int64_t{0x7fffffff}}) {
    p.ld = ld;
    const step5::Status s = ops::topk_select(p, nullptr);
    CAPTURE(ld);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find("topk_select: ld = " + std::to_string(ld) + ", expected 1 .. 1073741824 (kTopkMaxLd") !=
                      std::string::npos,
                  s.message());
  }
}

TEST_CASE("topk_select: an ld_ids whose rows overflow 2^63 bytes is refused naming it, before any CUDA call") {
  // ids row r starts at ids + r * ld_ids: with rows = 2 and ld_ids = 2^62 the second row's byte
  // offset is 2^64, i.e. the first row again (the two rows' selections raced in one row), and the
  // overlap check's extent ((rows - 1) * ld_ids + topk + 1) * 4 wrapped to 20 bytes; ld_ids had a
  // lower bound only. The pointers are never read (refused before a launch).
  ops::TopkSelectParams p = small_topk_params();
  p.rows = 2;
  const std::int64_t limit = (std::numeric_limits<std::int64_t>::max() / 4 - (p.topk + 1)) / (p.rows - 1);
  for (const std::int64_t ld_ids : {std::int64_t{1} << 62, limit + 1, std::numeric_limits<std::int64_t>::max()}) {
    p.ld_ids = ld_ids;
    const step5::Status s = ops::topk_select(p, nullptr);
    CAPTURE(ld_ids);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find("topk_select: ld_ids = " + std::to_string(ld_ids) + " with 2 rows of " +
                                   std::to_string(p.topk + 1)) != std::string::npos,
                  s.message());
  }
  // the largest ld_ids passes this rule (whatever the device says next)
  p.ld_ids = limit;
  CHECK_MESSAGE(ops::topk_select(p, nullptr).message().find("ld_ids") == std::string::npos,
                ops::topk_select(p, nullptr).message());
}

TEST_CASE("gemm: an ldx, ldw or ldc whose rows overflow 2^63 bytes is refused naming it, before any device query") {
  // Row t of C starts at c + t * ldc (bytes 2 * t * ldc): ldc = 2^62 put row 1 at byte 2^63, past
  // the address space (a faulting store), and 2^63 - 1 wrapped the overlap check's extent
  // ((T - 1) * ldc + n) * 2 to a few bytes; the lds had a lower bound only (>= k, >= n).
  alignas(16) static step5::bf16 buf[64];
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  for (int which = 0; which < 3; ++which) {
    const std::int64_t largest = max / 2 - (which == 2 ? 2 : 8);  // (rows - 1) * ld + width <= max / 2 elements
    for (const std::int64_t ld : {std::int64_t{1} << 62, largest + 1, max}) {
      ops::GemmParams gp;
      gp.tokens = 2, gp.n = 2, gp.k = 8;
      gp.ldx = gp.ldw = gp.ldc = 8;
      gp.x = gp.w = buf;
      gp.c = buf + 32;
      std::int64_t* field = which == 0 ? &gp.ldx : which == 1 ? &gp.ldw : &gp.ldc;
      *field = ld;
      const char* name = which == 0 ? "ldx" : which == 1 ? "ldw" : "ldc";
      ops::GemmPlan plan;
      const step5::Status s = ops::gemm_plan(gp, &plan);
      CAPTURE(which);
      CAPTURE(ld);
      CHECK(s.code() == StatusCode::kInvalidArgument);
      const char* width = which == 2 ? " with 2 rows of 2" : " with 2 rows of 8";  // C rows hold n, X and W rows k
      CHECK_MESSAGE(s.message().find(std::string("gemm_bf16: ") + name + " = " + std::to_string(ld) + width) !=
                        std::string::npos,
                    s.message());
      CHECK(step5::ops::gemm_bf16(gp, nullptr).code() == StatusCode::kInvalidArgument);
      CHECK_MESSAGE(s.message().find(" <= " + std::to_string(largest)) != std::string::npos, s.message());
    }
    // the largest ld passes this rule (whatever the device says next)
    ops::GemmParams gp;
    gp.tokens = 2, gp.n = 2, gp.k = 8;
    gp.ldx = gp.ldw = gp.ldc = 8;
    gp.x = gp.w = buf;
    gp.c = buf + 32;
    (which == 0 ? gp.ldx : which == 1 ? gp.ldw : gp.ldc) = largest;
    ops::GemmPlan plan;
    const step5::Status s = ops::gemm_plan(gp, &plan);
    CHECK_MESSAGE(s.message().find("2^63") == std::string::npos, s.message());
  }
}

TEST_CASE("run's checks: steps beyond the plan's capacity are refused naming the step's and the capacity's numbers") {
  const layout::RankLayout r = rank_of("dsa_h64_kv8_d128", 4, 1);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
  const int max_position = 32768;
  {  // within capacity
    Step st(64, 32768, 512, cap);
    CHECK(ops::dsa_layer_check_step(plan, st.s, max_position).ok());
  }
  {  // one request too many (T = B = 65 > 64 requests)
    Step st(65, 1000, 512, cap);
    const step5::Status s = ops::dsa_layer_check_step(plan, st.s, max_position);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("B = 65") != std::string::npos);
    CHECK(s.message().find("exceeds the workspace capacity (256, 64, 32768, 512)") != std::string::npos);
  }
  {  // topk beyond the capacity's
    Step st(8, 1000, 1024, cap);
    const step5::Status s = ops::dsa_layer_check_step(plan, st.s, max_position);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("topk = 1024") != std::string::npos);
  }
  {  // a block table larger than planned
    Step st(8, 1000, 64, cap);
    st.s.table.max_blocks = cap.max_blocks + 1;
    const step5::Status s = ops::dsa_layer_check_step(plan, st.s, max_position);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("max_blocks 513") != std::string::npos);
    CHECK(s.message().find("(64, 512, 32768)") != std::string::npos);
  }
  {  // the shared step validation runs first (a position beyond max_position)
    Step st(2, 5000, 64, cap);
    const step5::Status s = ops::dsa_layer_check_step(plan, st.s, 4096);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("dsa_layer_run") != std::string::npos);
    CHECK(s.message().find("4096") != std::string::npos);
  }
}

/// dsa_layer_run of a valid plan (`geometry` at tp 8 / rank 0 or tp 4 / rank 1) and step with null
/// weights, caches, x and workspace while the environment variable `name` holds `value`, read
/// afresh (the PDL switch is read on first use: its state is reset, then restored with the
/// variable): an environment refusal comes before any of those is touched.
static step5::Status run_with_env(const char* geometry, int tp, int rank, const char* name, const char* value) {
  const layout::RankLayout r = rank_of(geometry, tp, rank);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
  Step st(8, 1000, 64, cap);
  ops::DsaLayerWeights w;
  w.max_position = 32768;
  const ops::DsaLayerCaches caches;
  const char* env = std::getenv(name);
  const std::string saved = env != nullptr ? env : "";
  const int pdl_state = ops::detail::pdl_state().load();
  setenv(name, value, 1);
  ops::detail::pdl_state().store(-1);
  const step5::Status s = ops::dsa_layer_run(plan, w, caches, st.s, nullptr, nullptr, nullptr, 0, nullptr);
  if (env != nullptr) setenv(name, saved.c_str(), 1);
  else unsetenv(name);
  ops::detail::pdl_state().store(pdl_state);
  return s;
}

TEST_CASE("run's checks: a STEP5_TOPK other than radix, candidates or empty is refused before anything is launched") {
  CHECK(ops::topk_env_status().ok() == (std::getenv("STEP5_TOPK") == nullptr || std::string(std::getenv("STEP5_TOPK")).empty() ||
                                        std::string(std::getenv("STEP5_TOPK")) == "radix" ||
                                        std::string(std::getenv("STEP5_TOPK")) == "candidates"));
  ops::TopkAlgo a = ops::TopkAlgo::kRadix;
  CHECK((ops::topk_algo_from_env(nullptr, &a).ok() && a == ops::TopkAlgo::kDefault));
  CHECK((ops::topk_algo_from_env("candidates", &a).ok() && a == ops::TopkAlgo::kCandidates));
  const step5::Status s = run_with_env("dsa_h64_kv8_d128", 4, 1, "STEP5_TOPK", "fast");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("STEP5_TOPK = 'fast'") != std::string::npos);
}

TEST_CASE("run's checks: a STEP5_PDL other than 0, 1 or empty is refused before anything is launched (the fused GEMM's cuBLASLt path does not look)") {
  const step5::Status s = run_with_env("step5_preview", 8, 0, "STEP5_PDL", "on");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("STEP5_PDL = 'on'") != std::string::npos);
}

TEST_CASE("run's checks: every stage's pointers are checked before the first launch (nothing is written by a refused step)") {
  // indexer_prepare writes the KV cache and the later stages check their own arguments: a null
  // o_proj, a k_cache that sparse_attention's 16-byte loads cannot read, a summary cache or tail
  // the selection / summaries cannot use, no tail slots, must be refused before the fused GEMM
  // runs. Host stand-ins for every pointer: the refusal comes first, nothing is launched.
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
  Step st(8, 1000, 64, cap);
  HostStandIns h(8);
  unsigned char* buf = HostStandIns::buf;
  step5::bf16* b = h.b;
  const ops::DsaLayerWeights& w = h.w;
  const ops::DsaLayerCaches& caches = h.caches;
  struct Case {
    const char* what;
    std::function<void(ops::DsaLayerWeights&, ops::DsaLayerCaches&)> set;
    const char* expect;
  };
  for (const Case& c :
       {Case{"o_proj null", [](auto& ww, auto&) { ww.o_proj = nullptr; }, "w.o_proj is null"},
        Case{"k_cache 8 mod 16", [&](auto&, auto& cc) { cc.k_cache = reinterpret_cast<step5::bf16*>(buf + 8); },
             "caches.k_cache is at an address = 8 mod 16"},
        Case{"v_cache 2 mod 16", [&](auto&, auto& cc) { cc.v_cache = reinterpret_cast<step5::bf16*>(buf + 2); },
             "caches.v_cache is at an address = 2 mod 16"},
        Case{"summary_cache 4 mod 16", [&](auto&, auto& cc) { cc.summary_cache = buf + 4; },
             "caches.summary_cache is at an address = 4 mod 16"},
        Case{"tail null", [](auto&, auto& cc) { cc.tail = nullptr; }, "caches.tail is null"},
        Case{"no tail slots", [](auto&, auto& cc) { cc.num_slots = 0; }, "caches.num_slots = 0, expected > 0"}}) {
    CAPTURE(c.what);
    ops::DsaLayerWeights ww = w;
    ops::DsaLayerCaches cc = caches;
    c.set(ww, cc);
    const step5::Status s = ops::dsa_layer_run(plan, ww, cc, st.s, b, b, buf, plan.map.total, nullptr);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(c.expect) != std::string::npos);
    CHECK(s.message().find("dsa_layer_run") != std::string::npos);
  }
}

TEST_CASE("run's checks: with host copies, a write into another request's block and a shared tail slot are refused before any launch") {
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
  Step st(2, 1000, 64, cap);  // two requests decoding position 999: block-table slot 15
  std::vector<std::int32_t> table(2 * static_cast<std::size_t>(cap.max_blocks));
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  st.s.table.block_table_host = table.data();
  CHECK(ops::dsa_layer_check_step(plan, st.s, 32768).ok());
  table[static_cast<std::size_t>(cap.max_blocks) + 15] = 3;  // request 1 writes into request 0's block 3
  step5::Status s = ops::dsa_layer_check_step(plan, st.s, 32768);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("request 1: block_table[1][15] = 3 receives positions 999..999") != std::string::npos);
  CHECK(s.message().find("block_table[0][3] (request 0)") != std::string::npos);
  table[static_cast<std::size_t>(cap.max_blocks) + 15] = cap.max_blocks + 15;
  // tail slots: checked by dsa_layer_run (it knows num_slots), before the fused GEMM
  HostStandIns h(4);
  unsigned char* buf = HostStandIns::buf;
  step5::bf16* b = h.b;
  const ops::DsaLayerWeights& w = h.w;
  const ops::DsaLayerCaches& caches = h.caches;
  const std::vector<std::int32_t> slots = {2, 2};
  st.s.tail_slot_host = slots.data();
  s = ops::dsa_layer_run(plan, w, caches, st.s, b, b, buf, plan.map.total, nullptr);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("dsa_layer_run: request 1: tail_slot[1] = 2 is also tail_slot[0] (request 0)") !=
        std::string::npos);
}

TEST_CASE("plan reuse: one plan serves steps of every size within capacity, unchanged by use") {
  const layout::RankLayout r = rank_of("step5_preview", 2, 1);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerDeviceFacts f = h200_facts();
  // GEMM choices as dsa_layer_plan records them (index T-1)
  f.fused_gemm.assign(ops::kDsaLayerPlannedGemmTokens, ops::GemmPlan{ops::GemmPath::kSplitK, 4, 0, 2});
  f.o_proj_gemm = f.fused_gemm;
  f.fused_large = f.o_proj_large = ops::GemmPlan{ops::GemmPath::kWgmma, 1, 0, 0};
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, f, &plan).ok());
  const ops::detail::LayerWorkspaceMap before = plan.map;
  for (int B : {1, 7, 64}) {
    for (int len : {1, 8, 4096, 32768}) {
      Step st(B, len, std::min(512, std::max(1, len / 8)), cap);
      CHECK(ops::dsa_layer_check_step(plan, st.s, len + 1).ok());
    }
  }
  CHECK(std::memcmp(&before, &plan.map, sizeof(before)) == 0);
  // the recorded GEMM choice per token count is what run forces (decode: table; prefill: large)
  ops::GemmParams g;
  ops::detail::apply_gemm_choice(plan.facts.fused_gemm, plan.facts.fused_large, 1, &g);
  CHECK(g.path == ops::GemmPath::kSplitK);
  CHECK(g.split_k == 4);
  CHECK(g.config == 2);
  ops::GemmParams g2;
  ops::detail::apply_gemm_choice(plan.facts.fused_gemm, plan.facts.fused_large, 200, &g2);
  CHECK(g2.path == ops::GemmPath::kWgmma);
  CHECK(g2.split_k == 0);
  // a planned cuBLASLt choice stays kAuto at run time (the launcher falls back when the run's key
  // has no cuBLASLt algorithm)
  ops::DsaLayerDeviceFacts f_lt = f;
  f_lt.fused_gemm.assign(ops::kDsaLayerPlannedGemmTokens, ops::GemmPlan{ops::GemmPath::kCublasLt, 1, 0, 0});
  f_lt.fused_large = ops::GemmPlan{ops::GemmPath::kCublasLt, 1, 0, 0};
  for (int t : {1, 64, 200}) {
    ops::GemmParams g3;
    ops::detail::apply_gemm_choice(f_lt.fused_gemm, f_lt.fused_large, t, &g3);
    CHECK(g3.path == ops::GemmPath::kAuto);
    CHECK(g3.allow_cublaslt);
    CHECK(g3.config == 0);
    CHECK(g3.split_k == 0);
  }
  // a smaller capacity gives a smaller workspace; the same capacity the same plan
  ops::DsaLayerCapacity small = cap;
  small.max_tokens = 16, small.max_requests = 16;
  ops::DsaLayerPlan p2, p3;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, small, h200_facts(), &p2).ok());
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &p3).ok());
  CHECK(p2.workspace_bytes < plan.workspace_bytes);
  CHECK(p3.workspace_bytes == plan.workspace_bytes);
}

TEST_CASE("attention: per-query gathers in multi-query tiles (attention_per_query_pays) and tile_gather's range") {
  // a union stage costs 3/2 per-query stages, one stage of fixed cost per query (ops/attention.hpp)
  // tp 1 prefill tile of 4 queries with 513 regions each (65 stages): the layer's random-weight
  // selections at 128K (union ~1710 regions = 214 stages) take per-query gathers; shared
  // selections (the union is one query's 513 regions) take the union
  CHECK(ops::attention_per_query_pays(214, 4 * 65, 4));
  CHECK(!ops::attention_per_query_pays(65, 4 * 65, 4));
  // the break-even: 2 * (query_stages + nq) < 3 * union_stages
  CHECK(!ops::attention_per_query_pays(176, 4 * 65, 4));  // 528 < 528 is false
  CHECK(ops::attention_per_query_pays(177, 4 * 65, 4));
  // tp 8 tile of 8 queries (hpg_q 8) of 513 regions each: bench_attention prefill_indexer after 32K,
  // union density 0.668 = 2741 regions = 343 stages: the union (measured 1392 against 1528 µs per
  // query, bench/RESULTS.md twelfth session; the factor 2 took per-query gathers); density 0.9 =
  // 3694 regions = 462 stages: per query
  CHECK(!ops::attention_per_query_pays(343, 8 * 65, 8));
  CHECK(ops::attention_per_query_pays(462, 8 * 65, 8));
  // one query is never split into "per query" (it is the decode path already)
  CHECK(!ops::attention_per_query_pays(1000, 1, 1));
  CHECK(!ops::attention_per_query_pays(0, 0, 4));
  // tile_gather: 0, 1, 2 accepted; anything else refused naming the value
  auto a = ops::detail::attention_sizes(rank_of("step5_preview", 1, 0), 4096, 1, 512, 64, 2048, 64 * 2048);
  ops::SparseAttentionPlan ap;
  for (const int g : {0, 1, 2}) {
    a.tile_gather = g;
    CHECK(ops::sparse_attention_plan(a, 132, &ap).ok());
  }
  for (const int g : {-1, 3}) {
    a.tile_gather = g;
    const step5::Status s = ops::sparse_attention_plan(a, 132, &ap);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("tile_gather = " + std::to_string(g)) != std::string::npos);
  }
  a.tile_gather = 0;
  // softmax_scale: 0 (the default D^-0.5) or a finite positive value; a negative, NaN or infinite
  // scale is refused, not replaced by the default or run into NaN outputs
  for (const float sc : {0.0f, 0.0625f, 3.0f}) {
    a.softmax_scale = sc;
    CHECK(ops::sparse_attention_plan(a, 132, &ap).ok());
  }
  for (const float sc : {-0.1f, -1e-30f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()}) {
    a.softmax_scale = sc;
    const step5::Status s = ops::sparse_attention_plan(a, 132, &ap);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("softmax_scale = ") != std::string::npos);
    if (sc == -1e-30f) CHECK(s.message().find("softmax_scale = -1e-30,") != std::string::npos);
    CHECK(s.message().find("finite value > 0") != std::string::npos);
  }
}

TEST_CASE("attention plan: cache rows (num_blocks * block_size * KV groups) within int32, the bound named") {
  // tp 1: 4 KV groups, block 64: (2^31 - 1) / 4 = 536870911 tokens = 8388607 whole blocks
  const layout::RankLayout r = rank_of("step5_preview", 1, 0);
  ops::SparseAttentionPlan ap;
  ops::SparseAttentionParams a = ops::detail::attention_sizes(r, 64, 64, 512, 64, 2048, 8388607);
  CHECK(ops::sparse_attention_plan(a, 132, &ap).ok());
  a.num_blocks = 8388608;  // 2^31 rows
  const step5::Status s = ops::sparse_attention_plan(a, 132, &ap);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(s.message().find("num_blocks * block_size (cache tokens) = 536870912") != std::string::npos);
  CHECK(s.message().find("at most 536870911 with 4 KV groups") != std::string::npos);
  a.num_blocks = 0x7fffffff;  // no product overflows
  a.block_size = 1 << 20;
  const step5::Status big = ops::sparse_attention_plan(a, 132, &ap);
  CHECK(big.code() == StatusCode::kUnsupported);
  CHECK(big.message().find("(cache tokens) = 2251799812636672") != std::string::npos);
}

TEST_CASE("attention plan: auto split factor for decode (>= 2 stages per split, whole waves) and its limits") {
  // decode at 128K context (block 64, 2048 blocks per row), topk 512 = 65 stages of 64 tokens
  auto decode = [](const layout::RankLayout& r, int batch, int topk) {
    return ops::detail::attention_sizes(r, batch, batch, topk, 64, 2048, 64 * 2048);
  };
  const int sms = 132;
  struct Case {
    int tp, batch, splits;
  };
  // H200 (132 SMs): step5_preview (D 192) decode keeps two CTAs per SM (264 slots) with a
  // 2-stage ring — measured faster than 4 stages x 1 CTA (ops/attention.hpp, bench/RESULTS.md)
  // (split factors <= kAttentionMaxClusterSplits are merged by a cluster of the split CTAs; the
  // model charges the last-arriver merge of more splits two stages, so batch 1 takes 13 splits of
  // 5 stages, not 22 of 3)
  for (const Case c : {Case{1, 1, 13}, Case{1, 2, 13}, Case{1, 4, 13}, Case{1, 8, 8}, Case{1, 16, 4}, Case{1, 32, 2},
                       Case{1, 64, 1}, Case{1, 128, 1}, Case{8, 1, 13}, Case{8, 8, 13}, Case{8, 16, 13},
                       Case{8, 32, 8}, Case{8, 64, 4}, Case{8, 128, 2}}) {
    CAPTURE(c.tp);
    CAPTURE(c.batch);
    ops::SparseAttentionPlan ap;
    REQUIRE(ops::sparse_attention_plan(decode(rank_of("step5_preview", c.tp, 0), c.batch, 512), sms, &ap).ok());
    CHECK(ap.stages == 2);
    CHECK(ap.smem_bytes <= ops::attention_two_per_sm_smem(2));  // two CTAs per SM
    CHECK(!ap.wgmma_tiles);  // one query per request: the instance without the 64-row wgmma path
    CHECK(ap.num_splits == c.splits);
    CHECK((ap.num_splits > 1) == (ap.workspace_bytes > 0));
    // the cluster merge only with at most one split CTA per SM (ops::attention_cluster_merge_pays)
    const int groups = c.tp == 1 ? 4 : 1;
    CHECK(ap.cluster_merge == (ap.num_splits > 1 && ap.num_splits <= ops::kAttentionMaxClusterSplits &&
                               c.batch * groups * ap.num_splits <= sms));
  }
  // D 128: a 3-stage ring with two CTAs per SM (4 stages in flight per SM against 3)
  for (const Case c : {Case{1, 1, 13}, Case{1, 4, 8}, Case{1, 16, 2}, Case{1, 32, 1}}) {
    CAPTURE(c.batch);
    ops::SparseAttentionPlan ap;
    REQUIRE(ops::sparse_attention_plan(decode(rank_of("dsa_h64_kv8_d128", 1, 0), c.batch, 512), sms, &ap).ok());
    CHECK(ap.stages == 3);
    CHECK(ap.smem_bytes <= ops::attention_two_per_sm_smem(3));
    CHECK(ap.num_splits == c.splits);
  }
  // decode (T <= B) plans tiles of one query and no region bitmaps: its shared memory does not grow
  // with the block-table width, so 1M positions per row keep two CTAs per SM (the bitmaps left one
  // from about 384K positions: 12 bytes per 256 positions); one tile per token; an MTP step (3
  // rows per request) keeps its bitmaps and wider tiles
  for (const int positions : {64 * 2048, 384 * 1024, 1024 * 1024}) {
    CAPTURE(positions);
    const auto r = rank_of("step5_preview", 1, 0);
    for (const int batch : {1, 64}) {
      CAPTURE(batch);
      auto d = ops::detail::attention_sizes(r, batch, batch, 512, 64, positions / 64, positions / 64);
      ops::SparseAttentionPlan ap;
      REQUIRE(ops::sparse_attention_plan(d, sms, &ap).ok());
      CHECK(ap.query_tile == 1);
      CHECK(ap.bitmap_words == 0);
      CHECK(ap.max_tiles == batch);
      CHECK(ap.stages == 2);
      CHECK(ap.smem_bytes <= ops::attention_two_per_sm_smem(2));
      CHECK(ap.smem_bytes == ops::attention_meta_bytes(1, 0, 512) + 2ull * 2 * 64 * 192 * 2);
      auto idle = d;  // idle requests: tiles for the tokens only
      idle.num_requests = batch + 7;
      REQUIRE(ops::sparse_attention_plan(idle, sms, &ap).ok());
      CHECK(ap.max_tiles == batch);
    }
    auto mtp = ops::detail::attention_sizes(r, 8 * 3, 8, 512, 64, positions / 64, positions / 64);
    ops::SparseAttentionPlan ap;
    REQUIRE(ops::sparse_attention_plan(mtp, sms, &ap).ok());
    CHECK(ap.query_tile > 1);
    CHECK(ap.bitmap_words == positions / 8 / 32);
  }
  // prefill keeps 2 stages and the widest query tile; a forced ring depth is taken
  {
    const auto r = rank_of("step5_preview", 1, 0);
    auto a = ops::detail::attention_sizes(r, 4096, 1, 512, 64, 2048, 64 * 2048);
    ops::SparseAttentionPlan ap;
    REQUIRE(ops::sparse_attention_plan(a, sms, &ap).ok());
    CHECK(ap.stages == 2);
    CHECK(ap.query_tile == 4);
    CHECK(ap.wgmma_tiles);  // 64-row tiles on wgmma (D 192, 2 stages, several rows per request)
    // two CTAs per SM up to bench_attention's prefill shape (16K chunk after 128K history: 147456
    // positions per row): the region bitmaps and chunks grow with the row; one more KiB of tile
    // metadata there left one CTA per SM and measured 1.5x slower (bench/RESULTS.md)
    for (const int positions : {64 * 2048, 147456}) {
      CAPTURE(positions);
      auto wide = ops::detail::attention_sizes(r, 16384, 1, 512, 64, positions / 64, positions / 64);
      REQUIRE(ops::sparse_attention_plan(wide, sms, &ap).ok());
      CHECK(ap.stages == 2);
      CHECK(ap.query_tile == 4);
      CHECK(ap.smem_bytes <= ops::attention_two_per_sm_smem(2));
    }
    for (const int qt : {1, 2, 3, 4}) {  // only a tile of more than 32 rows (hpg_q 16: 3 queries) has them
      CAPTURE(qt);
      auto f = a;
      f.query_tile = qt;
      REQUIRE(ops::sparse_attention_plan(f, sms, &ap).ok());
      CHECK(ap.wgmma_tiles == (qt * 16 > 32));
    }
    REQUIRE(ops::sparse_attention_plan(a, sms, &ap).ok());
    auto mtp = decode(r, 8, 512);
    mtp.num_tokens = 8 * 3;  // MTP verification: 3 rows per request, tiles of up to 3 queries
    REQUIRE(ops::sparse_attention_plan(mtp, sms, &ap).ok());
    CHECK(ap.wgmma_tiles == (ap.stages == 2));
    for (const int ns : {2, 3, 4}) {
      CAPTURE(ns);
      a.pipeline_stages = ns;
      REQUIRE(ops::sparse_attention_plan(a, sms, &ap).ok());
      CHECK(ap.stages == ns);
      CHECK(ap.wgmma_tiles == (ns == 2));  // the wgmma instance has a 2-stage ring only
      auto d = decode(r, 8, 512);
      d.pipeline_stages = ns;
      REQUIRE(ops::sparse_attention_plan(d, sms, &ap).ok());
      CHECK(ap.stages == ns);
    }
    a.pipeline_stages = 5;
    const step5::Status s = ops::sparse_attention_plan(a, sms, &ap);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("pipeline_stages = 5") != std::string::npos);
  }
  // every split gathers >= 2 stages, never more splits than stages, at most kAttentionMaxSplits
  for (const int tp : {1, 2, 4, 8, 16})
    for (const int topk : {1, 16, 100, 512, 1024})
      for (int batch = 1; batch <= 300; batch += (batch < 40 ? 1 : 13)) {
        CAPTURE(tp);
        CAPTURE(topk);
        CAPTURE(batch);
        ops::SparseAttentionPlan ap;
        REQUIRE(ops::sparse_attention_plan(decode(rank_of("step5_preview", tp, 0), batch, topk), sms, &ap).ok());
        const int stages = (topk + 1 + 7) / 8;
        CHECK(ap.num_splits >= 1);
        CHECK(ap.num_splits <= ops::kAttentionMaxSplits);
        CHECK((ap.num_splits == 1 || stages / ap.num_splits >= 2));
      }
  // a short context bounds the stages: 1024 positions = 128 regions = 16 stages -> <= 8 splits
  {
    ops::SparseAttentionPlan ap;
    const auto a = ops::detail::attention_sizes(rank_of("step5_preview", 8, 0), 1, 1, 512, 16, 64, 64);
    REQUIRE(ops::sparse_attention_plan(a, sms, &ap).ok());
    CHECK(ap.num_splits == 8);
  }
  // forced factors are kept; the split-KV counters bound the (tile, group) pairs of a split launch
  {
    auto a = decode(rank_of("step5_preview", 1, 0), 32, 512);
    a.num_splits = 5;
    ops::SparseAttentionPlan ap;
    REQUIRE(ops::sparse_attention_plan(a, sms, &ap).ok());
    CHECK(ap.num_splits == 5);
    CHECK(!ap.cluster_merge);  // 32 x 4 x 5 = 640 split CTAs > 132 SMs: the last-arriver merge
    CHECK(ap.workspace_bytes == ops::sparse_attention_workspace_layout(ap.max_tiles, 4, 5, 192).bytes);
    auto f = decode(rank_of("step5_preview", 1, 0), 4, 512);
    f.num_splits = 5;
    ops::SparseAttentionPlan small;  // 4 x 4 x 5 = 80 split CTAs: the cluster merge
    REQUIRE(ops::sparse_attention_plan(f, sms, &small).ok());
    CHECK(small.num_splits == 5);
    CHECK(small.cluster_merge);
    // split_merge = 1: the last-arriver merge, same factor and workspace; other values refused
    {
      auto m = f;
      m.split_merge = 1;
      ops::SparseAttentionPlan mp;
      REQUIRE(ops::sparse_attention_plan(m, sms, &mp).ok());
      CHECK(!mp.cluster_merge);
      CHECK(mp.num_splits == 5);
      CHECK(mp.workspace_bytes == small.workspace_bytes);
      m.split_merge = 2;
      const step5::Status bad = ops::sparse_attention_plan(m, sms, &mp);
      CHECK(bad.code() == StatusCode::kInvalidArgument);
      CHECK(bad.message().find("split_merge = 2") != std::string::npos);
      // more splits than a cluster holds: the last-arriver merge
      m.split_merge = 0;
      m.num_splits = ops::kAttentionMaxClusterSplits + 1;
      REQUIRE(ops::sparse_attention_plan(m, sms, &mp).ok());
      CHECK(!mp.cluster_merge);
    }
    CHECK(ap.workspace_bytes > ops::kAttentionCounterBytes);
    // 4200 decode requests: 4200 grid tiles (one query each) x 4 groups = 16800 pairs > 16384 counters
    auto big = decode(rank_of("step5_preview", 1, 0), 4200, 512);
    big.num_splits = 2;
    const step5::Status s = ops::sparse_attention_plan(big, sms, &ap);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("num_splits = 2") != std::string::npos);
    CHECK(s.message().find("16384") != std::string::npos);
    big.num_splits = 0;
    REQUIRE(ops::sparse_attention_plan(big, sms, &ap).ok());
    CHECK(ap.num_splits == 1);
    CHECK(ap.workspace_bytes == 0);
  }
}
TEST_CASE("run's checks: the device batch arrays, the workspace's alignment and a step of no tokens are checked before any launch") {
  // host stand-ins for every pointer: each refusal comes before the first launch (and before any
  // device query), so it is checked here without a GPU
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
  HostStandIns h(8);
  unsigned char* buf = HostStandIns::buf;
  step5::bf16* b = h.b;
  const ops::DsaLayerWeights& w = h.w;
  const ops::DsaLayerCaches& caches = h.caches;
  {  // the device cu_seqlens_q / seq_lens the kernels read
    Step st(8, 1000, 64, cap);
    st.s.batch.cu_seqlens_q = nullptr;
    step5::Status s = ops::dsa_layer_run(plan, w, caches, st.s, b, b, buf, plan.map.total, nullptr);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("dsa_layer_run: batch.cu_seqlens_q is null, expected the device copy") != std::string::npos);
    Step st2(8, 1000, 64, cap);
    st2.s.batch.seq_lens = nullptr;
    s = ops::dsa_layer_check_step(plan, st2.s, 32768);
    CHECK(s.message().find("dsa_layer_run: batch.seq_lens is null") != std::string::npos);
  }
  {  // a workspace the buffers' 16-byte vectors cannot use: refused before the fused GEMM
    Step st(8, 1000, 64, cap);
    for (int off : {1, 4, 8}) {
      CAPTURE(off);
      const step5::Status s = ops::dsa_layer_run(plan, w, caches, st.s, b, b, buf + off, plan.map.total, nullptr);
      CHECK(s.code() == StatusCode::kInvalidArgument);
      CHECK(s.message().find("dsa_layer_run: workspace is at an address = " + std::to_string(off) + " mod 16") !=
            std::string::npos);
    }
  }
  {  // a step of no tokens: its sizes as every launcher checks them (validate_step rule 1), then Ok
    Step st(8, 1000, 64, cap);
    st.s.batch.num_tokens = 0, st.s.batch.num_requests = 0;
    CHECK(ops::dsa_layer_check_step(plan, st.s, 32768).ok());
    CHECK(ops::dsa_layer_run(plan, w, caches, st.s, nullptr, nullptr, nullptr, 0, nullptr).ok());
    st.s.topk = -3;
    step5::Status s = ops::dsa_layer_check_step(plan, st.s, 32768);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("dsa_layer_run: topk = -3") != std::string::npos);
    st.s.topk = 64, st.s.table.block_size = 3;
    s = ops::dsa_layer_run(plan, w, caches, st.s, nullptr, nullptr, nullptr, 0, nullptr);
    CHECK(s.message().find("dsa_layer_run: block_size = 3") != std::string::npos);
    st.s.table.block_size = cap.block_size, st.s.batch.num_requests = -7;
    s = ops::dsa_layer_check_step(plan, st.s, 32768);
    CHECK(s.message().find("num_requests = -7") != std::string::npos);
  }
}

TEST_CASE("indexer_select: a workspace not 16-byte aligned is refused naming it, before any launch") {
  // the plan's int32 tile starts and the fp32 score rows the selection reads in 16-byte vectors;
  // the geometry's launcher (the run-time indexer_select checks the current device first)
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  std::vector<std::int32_t> cu = {0, 1}, lens = {1000}, table(16, 0);
  static const std::int32_t kDevice[1] = {0};  // stands for device pointers (never read)
  alignas(64) static unsigned char buf[256];
  ops::IndexerSelectParams p;
  p.rank = r;
  p.batch = {kDevice, kDevice, 1, 1, cu.data(), lens.data()};
  p.table.block_table = table.data(), p.table.block_size = 64, p.table.max_blocks = 16, p.table.num_blocks = 16;
  p.index_q = buf, p.weights = reinterpret_cast<const float*>(buf), p.summary_cache = buf;
  p.topk = 64, p.max_seq_len = 1000;
  auto* ids = reinterpret_cast<std::int32_t*>(buf);
  p.topk_ids = ids, p.counts = ids;
  static std::vector<unsigned char> ws(ops::indexer_select_workspace_bytes(r, 1, 1000, 1) + 64);
  p.workspace_bytes = ws.size() - 64;
  for (int off : {2, 4, 12}) {
    CAPTURE(off);
    p.workspace = ws.data() + (64 - reinterpret_cast<std::uintptr_t>(ws.data()) % 64) % 64 + off;
    const step5::Status s = ops::detail::indexer_select_for<layout::GeometryId::step5_preview>(p, nullptr);
    if (s.code() == StatusCode::kUnsupported && s.message().find("was not built") != std::string::npos) {
      MESSAGE("step5_preview is not built (STEP5_GEOMETRIES): ", s.message());
      return;
    }
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("indexer_select: workspace is at an address = " + std::to_string(off) + " mod 16") !=
          std::string::npos);
  }
}

TEST_CASE("indexer_prepare: norm weights not 4-byte and RoPE tables not 2-byte aligned are refused naming them, before any launch") {
  // the kernel's element loads (a misaligned one is a sticky device fault); host stand-ins for
  // every pointer (never read: the refusal comes before the launch), the geometry's launcher
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  std::vector<std::int32_t> cu = {0, 1}, lens = {1000}, table(16, 0);
  static const std::int32_t kDevice[1] = {0};
  alignas(64) static unsigned char buf[4096];
  ops::IndexerPrepareParams p;
  p.rank = r;
  p.batch = {kDevice, kDevice, 1, 1, cu.data(), lens.data()};
  p.table.block_table = table.data(), p.table.block_size = 64, p.table.max_blocks = 16, p.table.num_blocks = 16;
  p.max_position = 32768;
  p.c = reinterpret_cast<const step5::bf16*>(buf), p.ldc = r.rows_with_w + r.rows_with_w % 2;
  auto* f = reinterpret_cast<float*>(buf + 1024);
  auto* h = reinterpret_cast<step5::bf16*>(buf + 2048);
  p.q_norm = p.k_norm = p.index_q_norm = p.index_k_norm_w = p.index_k_norm_b = f;
  p.cos_main = p.sin_main = p.cos_idx = p.sin_idx = h;
  p.q_out = p.k_cache = p.v_cache = p.index_k = h;
  p.index_q = buf + 3072, p.weights = reinterpret_cast<float*>(buf + 3072);
  struct Case {
    const char* name;
    int off, align;
    std::function<void(ops::IndexerPrepareParams&, int)> misalign;
  };
  const Case cases[] = {
      {"q_norm", 2, 4, [&](ops::IndexerPrepareParams& q, int o) { q.q_norm = reinterpret_cast<const float*>(buf + 1024 + o); }},
      {"k_norm", 1, 4, [&](ops::IndexerPrepareParams& q, int o) { q.k_norm = reinterpret_cast<const float*>(buf + 1024 + o); }},
      {"index_q_norm", 3, 4,
       [&](ops::IndexerPrepareParams& q, int o) { q.index_q_norm = reinterpret_cast<const float*>(buf + 1024 + o); }},
      {"index_k_norm_w", 2, 4,
       [&](ops::IndexerPrepareParams& q, int o) { q.index_k_norm_w = reinterpret_cast<const float*>(buf + 1024 + o); }},
      {"index_k_norm_b", 2, 4,
       [&](ops::IndexerPrepareParams& q, int o) { q.index_k_norm_b = reinterpret_cast<const float*>(buf + 1024 + o); }},
      {"cos_main", 1, 2, [&](ops::IndexerPrepareParams& q, int o) { q.cos_main = reinterpret_cast<const step5::bf16*>(buf + 2048 + o); }},
      {"sin_main", 1, 2, [&](ops::IndexerPrepareParams& q, int o) { q.sin_main = reinterpret_cast<const step5::bf16*>(buf + 2048 + o); }},
      {"cos_idx", 1, 2, [&](ops::IndexerPrepareParams& q, int o) { q.cos_idx = reinterpret_cast<const step5::bf16*>(buf + 2048 + o); }},
      {"sin_idx", 1, 2, [&](ops::IndexerPrepareParams& q, int o) { q.sin_idx = reinterpret_cast<const step5::bf16*>(buf + 2048 + o); }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    ops::IndexerPrepareParams q = p;
    c.misalign(q, c.off);
    const step5::Status s = ops::detail::indexer_prepare_for<layout::GeometryId::step5_preview>(q, nullptr);
    if (s.code() == StatusCode::kUnsupported && s.message().find("was not built") != std::string::npos) {
      MESSAGE("step5_preview not built: skipped");
      return;
    }
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(std::string("indexer_prepare: ") + c.name + " is at an address = " + std::to_string(c.off) +
                           " mod " + std::to_string(c.align)) != std::string::npos);
  }
}

TEST_CASE("attention plan: head_dim outside the kernels' range is refused naming it") {
  ops::SparseAttentionParams a;
  a.num_requests = 1, a.num_tokens = 1, a.num_kv_groups = 1, a.num_local_heads = 8, a.topk = 64;
  a.block_size = 64, a.max_blocks = 16, a.num_blocks = 16;
  ops::SparseAttentionPlan ap;
  for (int d : {128, 192}) {
    a.head_dim = d;
    CHECK(ops::sparse_attention_plan(a, 132, &ap).ok());
  }
  for (int d : {64, 256}) {  // the range's edges: not refused for head_dim (smem may still decide)
    a.head_dim = d;
    CHECK(ops::sparse_attention_plan(a, 132, &ap).message().find("head_dim") == std::string::npos);
  }
  for (int d : {-64, -1, 0, 96, 320, 1 << 30}) {
    CAPTURE(d);
    a.head_dim = d;
    const step5::Status s = ops::sparse_attention_plan(a, 132, &ap);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("head_dim = " + std::to_string(d) + ", expected a positive multiple of 64, at most 256") !=
          std::string::npos);
  }
}
TEST_CASE("elementwise: a residual, x or partials array the kernels cannot load element by element is refused naming it, before any CUDA call") {
  // host stand-ins (never read: every refusal comes before the device check and the launch)
  alignas(16) static unsigned char buf[256];
  auto* residual = reinterpret_cast<float*>(buf);
  auto* x = reinterpret_cast<step5::bf16*>(buf + 64);
  auto* partials = reinterpret_cast<const step5::bf16* const*>(buf + 128);
  for (int off : {1, 2, 3}) {
    CAPTURE(off);
    step5::Status s = ops::residual_to_bf16(reinterpret_cast<const float*>(buf + off), x, 16, nullptr);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("residual_to_bf16: residual is at an address = " + std::to_string(off) + " mod 4") !=
          std::string::npos);
    s = ops::add_partials_to_residual(partials, 2, reinterpret_cast<float*>(buf + off), 16, nullptr);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("add_partials_to_residual: residual is at an address = " + std::to_string(off) +
                           " mod 4") != std::string::npos);
  }
  {
    const step5::Status s = ops::residual_to_bf16(residual, reinterpret_cast<step5::bf16*>(buf + 65), 16, nullptr);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("residual_to_bf16: x is at an address = 1 mod 2") != std::string::npos);
  }
  for (int off : {1, 4}) {
    CAPTURE(off);
    const step5::Status s = ops::add_partials_to_residual(
        reinterpret_cast<const step5::bf16* const*>(buf + 128 + off), 2, residual, 16, nullptr);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("add_partials_to_residual: partials is at an address = " + std::to_string(off) +
                           " mod 8") != std::string::npos);
  }
}

namespace {
/// A fake device address (never dereferenced: the overlap checks refuse before any device call).
template <class T>
T* fake(std::uintptr_t a) {
  return reinterpret_cast<T*>(a);
}
bool names_overlap(const step5::Status& s, const std::string& op, const std::string& a, const std::string& b) {
  return s.code() == StatusCode::kInvalidArgument && s.message().find(op + ": " + a + " [") != std::string::npos &&
         s.message().find("overlaps " + b + " [") != std::string::npos &&
         s.message().find("expected disjoint buffers") != std::string::npos;
}
bool no_overlap_error(const step5::Status& s) { return s.message().find("overlaps") == std::string::npos; }
/// `f()` with STEP5_PDL = "bad": where the overlap check lets fake addresses through, the library's
/// kernel launch refuses the variable (on a machine with a GPU), so nothing is launched on them.
template <class F>
step5::Status with_bad_pdl(F&& f) {
  const char* env = std::getenv("STEP5_PDL");
  const std::string saved = env != nullptr ? env : "";
  const int pdl_state = ops::detail::pdl_state().load();
  setenv("STEP5_PDL", "bad", 1);
  ops::detail::pdl_state().store(-1);
  const step5::Status s = f();
  if (env != nullptr) setenv("STEP5_PDL", saved.c_str(), 1);
  else unsetenv("STEP5_PDL");
  ops::detail::pdl_state().store(pdl_state);
  return s;
}
}  // namespace

TEST_CASE("indexer launchers and dsa_layer_run: tail slots, index_k, C, ids and counts the kernels cannot load element by element are refused naming them, before any launch") {
  // the summaries kernel's (and the decode fold's) int32 loads of tail_slot and bf16 loads of
  // index_k and C, the selection's int32 stores of ids and counts: a misaligned pointer was a
  // sticky misaligned-address fault. Host stand-ins (never read: the refusals come first); the
  // geometry's launchers (the run-time ones check the current device first)
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  std::vector<std::int32_t> cu = {0, 1}, lens = {1000}, table(16, 0);
  static const std::int32_t kDevice[1] = {0};
  alignas(64) static unsigned char buf[8192];
  const auto at = [](int off) { return static_cast<void*>(buf + off); };
  const auto not_built = [](const step5::Status& s) {
    return s.code() == StatusCode::kUnsupported && s.message().find("was not built") != std::string::npos;
  };
  const auto expect = [](const step5::Status& s, const std::string& needle) {
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(needle) != std::string::npos, s.message());
  };
  ops::IndexerSummaryParams sp;
  sp.rank = r;
  sp.batch = {kDevice, kDevice, 1, 1, cu.data(), lens.data()};
  sp.table.block_table = table.data(), sp.table.block_size = 64, sp.table.max_blocks = 16, sp.table.num_blocks = 16;
  sp.index_k = static_cast<const step5::bf16*>(at(0)), sp.c = static_cast<const step5::bf16*>(at(1024));
  sp.ldc = r.rows_with_w;
  sp.summary_cache = static_cast<std::uint8_t*>(at(2048)), sp.tail = static_cast<step5::bf16*>(at(4096));
  sp.tail_slot = static_cast<const std::int32_t*>(at(6144)), sp.num_slots = 4;
  const auto summaries = [](const ops::IndexerSummaryParams& q) {
    return ops::detail::indexer_summaries_for<layout::GeometryId::step5_preview>(q, nullptr);
  };
  {
    const step5::Status s = with_bad_pdl([&] { return summaries(sp); });
    if (not_built(s)) {
      MESSAGE("step5_preview not built: skipped");
      return;
    }
    CHECK_MESSAGE(s.message().find("is at an address") == std::string::npos, s.message());  // aligned: passes
  }
  for (int off : {1, 2, 3}) {
    CAPTURE(off);
    ops::IndexerSummaryParams q = sp;
    q.tail_slot = static_cast<const std::int32_t*>(at(6144 + off));
    expect(summaries(q), "indexer_summaries: tail_slot is at an address = " + std::to_string(off) + " mod 4");
  }
  {
    ops::IndexerSummaryParams q = sp;
    q.index_k = static_cast<const step5::bf16*>(at(1));
    expect(summaries(q), "indexer_summaries: index_k is at an address = 1 mod 2");
    q = sp;
    q.c = static_cast<const step5::bf16*>(at(1025));
    expect(summaries(q), "indexer_summaries: c is at an address = 1 mod 2");
  }
  {  // indexer_prepare doing step 4: the same rule for its tail slots
    ops::IndexerPrepareParams p;
    p.rank = r;
    p.batch = sp.batch, p.table = sp.table;
    p.max_position = 32768;
    p.c = static_cast<const step5::bf16*>(at(1024)), p.ldc = r.rows_with_w + r.rows_with_w % 2;
    auto* f = static_cast<float*>(at(7168));
    p.q_norm = p.k_norm = p.index_q_norm = p.index_k_norm_w = p.index_k_norm_b = f;
    p.cos_main = p.sin_main = p.cos_idx = p.sin_idx = static_cast<const step5::bf16*>(at(7680));
    p.q_out = p.k_cache = p.v_cache = p.index_k = static_cast<step5::bf16*>(at(0));
    p.index_q = static_cast<std::uint8_t*>(at(512)), p.weights = static_cast<float*>(at(512));
    p.summaries = {sp.summary_cache, sp.tail, static_cast<const std::int32_t*>(at(6146)), 4, nullptr};
    expect(ops::detail::indexer_prepare_for<layout::GeometryId::step5_preview>(p, nullptr),
           "indexer_prepare: tail_slot is at an address = 2 mod 4");
  }
  {  // indexer_select's ids and counts
    ops::IndexerSelectParams p;
    p.rank = r;
    p.batch = sp.batch, p.table = sp.table;
    p.index_q = static_cast<const std::uint8_t*>(at(0)), p.weights = static_cast<const float*>(at(0));
    p.summary_cache = static_cast<const std::uint8_t*>(at(0));
    p.topk = 64, p.max_seq_len = 1000;
    static std::vector<unsigned char> ws(ops::indexer_select_workspace_bytes(r, 1, 1000, 1) + 64);
    p.workspace = ws.data() + (64 - reinterpret_cast<std::uintptr_t>(ws.data()) % 64) % 64;
    p.workspace_bytes = ws.size() - 64;
    p.topk_ids = static_cast<std::int32_t*>(at(2050)), p.counts = static_cast<std::int32_t*>(at(4096));
    const auto select = [](const ops::IndexerSelectParams& q) {
      return ops::detail::indexer_select_for<layout::GeometryId::step5_preview>(q, nullptr);
    };
    expect(select(p), "indexer_select: topk_ids is at an address = 2 mod 4");
    p.topk_ids = static_cast<std::int32_t*>(at(2048)), p.counts = static_cast<std::int32_t*>(at(4097));
    expect(select(p), "indexer_select: counts is at an address = 1 mod 4");
  }
  {  // dsa_layer_run refuses the tail slots before its first launch (the summaries would refuse them
     // only after indexer_prepare wrote the caches)
    ops::DsaLayerPlan plan;
    REQUIRE(ops::dsa_layer_plan_for(r, 4096, engine_capacity(), h200_facts(), &plan).ok());
    Step st(8, 1000, 64, engine_capacity());
    HostStandIns h(8);
    st.s.tail_slot = static_cast<const std::int32_t*>(at(6146));
    expect(ops::dsa_layer_run(plan, h.w, h.caches, st.s, h.b, h.b, HostStandIns::buf, plan.map.total, nullptr),
           "dsa_layer_run: step.tail_slot is at an address = 2 mod 4");
  }
}

TEST_CASE("require_disjoint: byte ranges from ptr to ptr + bytes (end excluded), touching ranges, null and empty ranges pass") {
  using step5::require_disjoint;
  const void* a = fake<void>(0x10000);
  CHECK(require_disjoint("op", {{"o", a, 16}}, {{"i", fake<void>(0x10010), 16}}).ok());  // touching
  CHECK(require_disjoint("op", {{"o", a, 16}}, {{"i", fake<void>(0xfff0), 16}}).ok());
  CHECK(names_overlap(require_disjoint("op", {{"o", a, 17}}, {{"i", fake<void>(0x10010), 16}}), "op", "o", "i"));
  CHECK(names_overlap(require_disjoint("op", {{"o", a, 16}}, {{"i", fake<void>(0xfff0), 17}}), "op", "o", "i"));
  CHECK(require_disjoint("op", {{"o", a, 16}}, {{"i", nullptr, 16}, {"j", a, 0}}).ok());
  // two outputs
  const step5::Status s = require_disjoint("op", {{"o1", a, 8}, {"o2", fake<void>(0x10004), 8}}, {});
  CHECK(names_overlap(s, "op", "o1", "o2"));
  CHECK(s.message().find("both are written") != std::string::npos);
}

TEST_CASE("elementwise: x over residual and residual over the partials array are refused naming both, before any CUDA call") {
  // residual_to_bf16: x[i] (2 bytes) lands inside residual[i / 2], which another thread may not
  // have read yet; x == residual is no in-place form
  const float* r = fake<const float>(0x100000);
  CHECK(names_overlap(ops::residual_to_bf16(r, fake<step5::bf16>(0x100000), 16, nullptr), "residual_to_bf16", "x",
                      "residual"));
  CHECK(names_overlap(ops::residual_to_bf16(r, fake<step5::bf16>(0x100000 + 62), 16, nullptr), "residual_to_bf16",
                      "x", "residual"));
  CHECK(no_overlap_error(with_bad_pdl([&] { return ops::residual_to_bf16(r, fake<step5::bf16>(0x100000 + 64), 16, nullptr); })));
  // add_partials_to_residual: every thread reads the pointer array while others write residual
  const step5::bf16* const* parts = fake<const step5::bf16* const>(0x200000);
  CHECK(names_overlap(ops::add_partials_to_residual(parts, 2, fake<float>(0x200000 + 12), 16, nullptr),
                      "add_partials_to_residual", "residual", "partials"));
  CHECK(no_overlap_error(
      with_bad_pdl([&] { return ops::add_partials_to_residual(parts, 2, fake<float>(0x200000 + 16), 16, nullptr); })));
}

TEST_CASE("elementwise: an n whose residual bytes (n * 4) pass 2^63 - 1 is refused naming it, before any CUDA call") {
  // n * 4 wrapped require_disjoint's extents (n = 2^62: residual's 0 bytes, an empty range) and the
  // call went on to the device check
  const std::size_t huge = std::size_t{1} << 62;
  const float* r = fake<const float>(0x100000);
  step5::Status s = ops::residual_to_bf16(r, fake<step5::bf16>(0x900000), huge, nullptr);
  CHECK(s.code() == step5::StatusCode::kInvalidArgument);
  CHECK(s.message().find("residual_to_bf16: n = " + std::to_string(huge) + " elements of 4 bytes pass 2^63 - 1 bytes") !=
        std::string::npos);
  s = ops::add_partials_to_residual(fake<const step5::bf16* const>(0x200000), 2, fake<float>(0x900000), huge, nullptr);
  CHECK(s.code() == step5::StatusCode::kInvalidArgument);
  CHECK(s.message().find("add_partials_to_residual: n = " + std::to_string(huge)) != std::string::npos);
  // the largest n passes this rule (and fails later, on the device check or the overlap, not on n)
  const std::size_t largest = static_cast<std::size_t>(INT64_MAX) / 4;
  const step5::Status ok = ops::residual_to_bf16(r, fake<step5::bf16>(0x900000), largest, nullptr);
  CHECK(ok.message().find("elements of 4 bytes pass") == std::string::npos);
}

TEST_CASE("topk_select: ids or counts over scores, history or each other are refused naming both, before any CUDA call") {
  // a row's CTA writes its ids while other rows' CTAs still select from their scores: ids of row 0
  // over row 1's scores changes what row 1 selects
  ops::TopkSelectParams p;
  p.rows = 2, p.topk = 4, p.ld = 8, p.ld_ids = 5;
  p.scores = fake<const float>(0x100000);        // 2 rows x 8: 64 bytes
  p.history = fake<const std::int32_t>(0x200000);  // 8 bytes
  p.ids = fake<std::int32_t>(0x300000);            // (1 * 5 + 5) * 4 = 40 bytes
  p.counts = fake<std::int32_t>(0x400000);         // 8 bytes
  CHECK(no_overlap_error(with_bad_pdl([&] { return ops::topk_select(p, nullptr); })));
  ops::TopkSelectParams q = p;
  q.ids = fake<std::int32_t>(0x100000 + 32);  // row 0's ids over row 1's scores
  CHECK(names_overlap(ops::topk_select(q, nullptr), "topk_select", "ids", "scores"));
  q = p;
  q.counts = fake<std::int32_t>(0x200000 + 4);
  CHECK(names_overlap(ops::topk_select(q, nullptr), "topk_select", "counts", "history"));
  q = p;
  q.counts = fake<std::int32_t>(0x300000 + 36);  // the last id of row 1
  CHECK(names_overlap(ops::topk_select(q, nullptr), "topk_select", "ids", "counts"));
  q = p;
  q.ids = fake<std::int32_t>(0x100000 + 64);  // right after the scores
  CHECK(no_overlap_error(with_bad_pdl([&] { return ops::topk_select(q, nullptr); })));
}

TEST_CASE("indexer launchers: outputs over C, index_q, the caches or each other are refused naming both, before any launch") {
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  std::vector<std::int32_t> cu = {0, 1, 2}, lens = {1000, 1000}, table(32, 0);
  const std::uintptr_t kC = 0x10000000;
  const std::int64_t ldc = r.rows_with_w + r.rows_with_w % 2;
  const std::uintptr_t c_bytes = static_cast<std::uintptr_t>(ldc + r.rows_with_w) * 2;  // two tokens
  ops::IndexerPrepareParams p;
  p.rank = r;
  p.batch = {fake<const std::int32_t>(0x1000), fake<const std::int32_t>(0x2000), 2, 2, cu.data(), lens.data()};
  p.table.block_table = fake<const std::int32_t>(0x3000), p.table.block_size = 64, p.table.max_blocks = 16;
  p.table.num_blocks = 16;
  p.max_position = 32768;
  p.c = fake<const step5::bf16>(kC), p.ldc = ldc;
  p.q_norm = fake<const float>(0x20000000), p.k_norm = fake<const float>(0x20010000);
  p.index_q_norm = fake<const float>(0x20020000), p.index_k_norm_w = fake<const float>(0x20030000);
  p.index_k_norm_b = fake<const float>(0x20040000);
  p.cos_main = fake<const step5::bf16>(0x21000000), p.sin_main = fake<const step5::bf16>(0x22000000);
  p.cos_idx = fake<const step5::bf16>(0x23000000), p.sin_idx = fake<const step5::bf16>(0x24000000);
  p.q_out = fake<step5::bf16>(0x30000000), p.k_cache = fake<step5::bf16>(0x31000000);
  p.v_cache = fake<step5::bf16>(0x32000000), p.index_q = fake<std::uint8_t>(0x33000000);
  p.weights = fake<float>(0x34000000), p.index_k = fake<step5::bf16>(0x35000000);
  const auto prepare = [](const ops::IndexerPrepareParams& q) {
    return ops::detail::indexer_prepare_for<layout::GeometryId::step5_preview>(q, nullptr);
  };
  {
    const step5::Status s = with_bad_pdl([&] { return prepare(p); });
    if (s.code() == StatusCode::kUnsupported && s.message().find("was not built") != std::string::npos) {
      MESSAGE("step5_preview not built: skipped");
      return;
    }
    CHECK_MESSAGE(no_overlap_error(s), s.message());  // disjoint: refused later (no device) or launched
  }
  // q prepared in place over C: token 1's q rows land on token 0's k, v and indexer columns
  ops::IndexerPrepareParams q = p;
  q.q_out = fake<step5::bf16>(kC);
  CHECK(names_overlap(prepare(q), "indexer_prepare", "q_out", "c"));
  q = p;
  q.index_k = fake<step5::bf16>((kC + c_bytes - 1) & ~std::uintptr_t{3});  // over C's last byte read (4-byte aligned)
  CHECK(names_overlap(prepare(q), "indexer_prepare", "index_k", "c"));
  q = p;
  q.index_k = fake<step5::bf16>((kC + c_bytes + 3) & ~std::uintptr_t{3});  // after it
  CHECK(no_overlap_error(with_bad_pdl([&] { return prepare(q); })));
  q = p;
  q.v_cache = q.k_cache;
  CHECK(names_overlap(prepare(q), "indexer_prepare", "k_cache", "v_cache"));
  q = p;
  q.weights = fake<float>(0x20000000);
  CHECK(names_overlap(prepare(q), "indexer_prepare", "weights", "q_norm"));
  q = p;
  q.index_q = fake<std::uint8_t>(0x3000);  // over the block table
  CHECK(names_overlap(prepare(q), "indexer_prepare", "index_q", "table.block_table"));

  // indexer_summaries: the tail over C's rows
  ops::IndexerSummaryParams s = ops::indexer_summary_params(p, {});
  s.summary_cache = fake<std::uint8_t>(0x40000000), s.tail = fake<step5::bf16>(0x41000000);
  s.tail_slot = fake<const std::int32_t>(0x4000), s.num_slots = 4;
  const auto summaries = [](const ops::IndexerSummaryParams& x) {
    return ops::detail::indexer_summaries_for<layout::GeometryId::step5_preview>(x, nullptr);
  };
  CHECK(no_overlap_error(with_bad_pdl([&] { return summaries(s); })));
  ops::IndexerSummaryParams s2 = s;
  s2.tail = fake<step5::bf16>(kC + 16);
  CHECK(names_overlap(summaries(s2), "indexer_summaries", "tail", "c"));
  s2 = s;
  s2.summary_cache = fake<std::uint8_t>(0x35000000);  // over index_k
  CHECK(names_overlap(summaries(s2), "indexer_summaries", "summary_cache", "index_k"));

  // indexer_select: ids over index_q, the workspace over the weights
  ops::IndexerSelectParams sel;
  sel.rank = r, sel.batch = p.batch, sel.table = p.table;
  sel.index_q = fake<const std::uint8_t>(0x33000000), sel.weights = fake<const float>(0x34000000);
  sel.summary_cache = fake<const std::uint8_t>(0x40000000);
  sel.topk = 64, sel.max_seq_len = 1000;
  sel.topk_ids = fake<std::int32_t>(0x50000000), sel.counts = fake<std::int32_t>(0x51000000);
  sel.workspace = fake<void>(0x52000000);
  sel.workspace_bytes = ops::indexer_select_workspace_bytes(r, 2, 1000, 2);
  const auto select = [](const ops::IndexerSelectParams& x) {
    return ops::detail::indexer_select_for<layout::GeometryId::step5_preview>(x, nullptr);
  };
  ops::IndexerSelectParams sel2 = sel;
  sel2.topk_ids = fake<std::int32_t>(0x33000000);
  CHECK(names_overlap(select(sel2), "indexer_select", "topk_ids", "index_q"));
  sel2 = sel;
  sel2.workspace = fake<void>(0x34000000 - 256);  // its scores over the weights
  CHECK(names_overlap(select(sel2), "indexer_select", "workspace", "weights"));
  sel2 = sel;
  sel2.counts = fake<std::int32_t>(0x50000000 + 4);
  CHECK(names_overlap(select(sel2), "indexer_select", "topk_ids", "counts"));
}

TEST_CASE("run's checks: the workspace, the partial and the caches over each other, the weights or x are refused before any launch") {
  // o_proj would refuse its C (the partial) over its X (the attention output in the workspace)
  // only after indexer_prepare had written the caches: refused up front instead
  const layout::RankLayout r = rank_of("step5_preview", 8, 0);
  const ops::DsaLayerCapacity cap = engine_capacity();
  ops::DsaLayerPlan plan;
  REQUIRE(ops::dsa_layer_plan_for(r, 4096, cap, h200_facts(), &plan).ok());
  Step st(8, 1000, 64, cap);
  st.s.batch.cu_seqlens_q = fake<const std::int32_t>(0x1000), st.s.batch.seq_lens = fake<const std::int32_t>(0x2000);
  st.s.table.block_table = fake<const std::int32_t>(0x3000), st.s.tail_slot = fake<const std::int32_t>(0x4000);
  // the disjoint cases below pass every check and would launch on the fake addresses: run only
  // where there is no device (then the plan's device scope fails, nothing is launched)
  int devices = 0;
  const bool no_device = cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0;
  (void)cudaGetLastError();
  const std::uintptr_t kWs = 0x100000000;
  ops::DsaLayerWeights w;
  w.max_position = 32768;
  w.fused = fake<const step5::bf16>(0x200000000), w.o_proj = fake<const step5::bf16>(0x300000000);
  ops::DsaLayerCaches caches;
  caches.k_cache = fake<step5::bf16>(0x400000000), caches.v_cache = fake<step5::bf16>(0x500000000);
  caches.summary_cache = fake<std::uint8_t>(0x600000000), caches.tail = fake<step5::bf16>(0x700000000);
  caches.num_slots = 8;
  const step5::bf16* x = fake<const step5::bf16>(0x800000000);
  step5::bf16* partial = fake<step5::bf16>(0x900000000);
  const auto run = [&](const ops::DsaLayerWeights& ww, const ops::DsaLayerCaches& cc, const step5::bf16* xx,
                       step5::bf16* pp, std::uintptr_t ws) {
    return ops::dsa_layer_run(plan, ww, cc, st.s, xx, pp, fake<void>(ws), plan.map.total, nullptr);
  };
  if (no_device) {
    const step5::Status s = run(w, caches, x, partial, kWs);
    CHECK_MESSAGE((!s.ok() && no_overlap_error(s)), s.message());
  }
  // the partial over the attention output (o_proj's X) in the workspace
  CHECK(names_overlap(run(w, caches, x, fake<step5::bf16>(kWs + plan.map.attn), kWs), "dsa_layer_run", "workspace",
                      "partial"));
  ops::DsaLayerCaches cc = caches;
  cc.k_cache = fake<step5::bf16>(kWs + plan.map.total - 16);
  CHECK(names_overlap(run(w, cc, x, partial, kWs), "dsa_layer_run", "workspace", "caches.k_cache"));
  cc = caches;
  cc.tail = fake<step5::bf16>(0x300000000);
  CHECK(names_overlap(run(w, cc, x, partial, kWs), "dsa_layer_run", "caches.tail", "w.o_proj"));
  CHECK(names_overlap(run(w, caches, fake<const step5::bf16>(kWs + 256), partial, kWs), "dsa_layer_run", "workspace",
                      "x"));
  // the partial over x is allowed: x is read by the first GEMM only
  if (no_device) {
    const step5::Status s = run(w, caches, x, const_cast<step5::bf16*>(x), kWs);
    CHECK_MESSAGE((!s.ok() && no_overlap_error(s)), s.message());
  }
}
#endif  // __has_include(<cuda_runtime_api.h>)
