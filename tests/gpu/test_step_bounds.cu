// Issue 12 §1 on the GPU: a step whose position runs past its block-table row must never touch
// another request's cache.
//  1. The host-visible case (the issue's example: step5_preview tp 1, block_size 64, max_blocks 2,
//     request 0 decoding at position 128, request 1 at position 10): every launcher
//     (indexer_prepare, indexer_summaries, indexer_select, sparse_attention, dsa_layer_forward)
//     returns kInvalidArgument naming request 0, position 128 and capacity 128 — the same message
//     as the CPU reference (both call ops::validate_step) — and the KV cache, the summary cache
//     and the tail buffer (random contents) are byte-identical afterwards.
//  2. Device-resident values (checked mode, `bounds_fault`): a block id outside [0, num_blocks) in
//     the block table, and device seq_lens past the row while the host mirror is valid (what a
//     CUDA-graph replay with new lengths does), are recorded and reported by read_bounds_fault,
//     nothing outside the caches is accessed (run under compute-sanitizer memcheck), and no cache
//     byte outside the step's legitimate writes changes — also without the record (unchecked mode).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/attention.hpp"
#include "step5/ops/bounds_fault.hpp"
#include "step5/ops/indexer.hpp"
#include "step5/ops/layer.hpp"
#include "step5/reference/prepare.hpp"
#include "step5/reference/rope.hpp"

using step5::bf16;
using step5::StatusCode;
using step5_test::DevBuf;
using step5_test::same_bits;
namespace ops = step5::ops;
namespace layout = step5::layout;
namespace ref = step5::reference;

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

using Tag = layout::LayoutTag<layout::GeometryId::step5_preview, 1>;

constexpr int kHidden = 256, kB = 2, kBlockSize = 64, kMaxBlocks = 2, kNumBlocks = 4, kTopk = 16;
constexpr int kMaxPosition = 1024, kMaxSeqLen = 256;

using step5_test::random_bf16;
using step5_test::random_f32;
std::vector<std::uint8_t> random_u8(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = static_cast<std::uint8_t>(rng() % 0x7e) | static_cast<std::uint8_t>((rng() & 1) << 7);
  return v;
}
std::string body(const std::string& m) {
  const auto i = m.find(": ");
  return i == std::string::npos ? m : m.substr(i + 2);
}

/// One rank of step5_preview tp 1 with random weights, random caches and every buffer a step needs.
struct World {
  layout::RankLayout rank = Tag::Layout::template rank<0>();
  int D = rank.geometry.head_dim, P = rank.geometry.proxy_dim, KVl = rank.local_kv_heads, Hl = rank.local_heads;
  int Il = rank.index_local_heads, lg = rank.local_kv_groups;
  std::mt19937 rng{20261201u};
  std::size_t kv_n = static_cast<std::size_t>(kNumBlocks) * kBlockSize * KVl * D;
  std::size_t sum_n = static_cast<std::size_t>(kNumBlocks) * (kBlockSize / kR) * P;
  std::size_t tail_n = static_cast<std::size_t>(kB) * kR * 2 * P;
  std::vector<bf16> k0 = random_bf16(kv_n, rng, 1.f), v0 = random_bf16(kv_n, rng, 1.f), tail0 = random_bf16(tail_n, rng, 1.f);
  std::vector<std::uint8_t> sum0 = random_u8(sum_n, rng);
  DevBuf<bf16> k{k0}, v{v0}, tail{tail0};
  DevBuf<std::uint8_t> summary{sum0};
  // weights
  DevBuf<bf16> fused{random_bf16(static_cast<std::size_t>(rank.padded_rows) * kHidden, rng, 0.05f)};
  DevBuf<bf16> o_proj{random_bf16(static_cast<std::size_t>(kHidden) * Hl * D, rng, 0.02f)};
  DevBuf<float> q_norm{random_f32(D, rng, 0.1f)}, k_norm{random_f32(D, rng, 0.1f)};
  DevBuf<float> iq_norm{random_f32(P, rng, 0.1f)}, ik_w{random_f32(P, rng, 0.1f)}, ik_b{random_f32(P, rng, 0.1f)};
  ref::RopeTable rm = ref::make_rope_table(kMaxPosition, rank.geometry.rot_main, 5e6);
  ref::RopeTable ri = ref::make_rope_table(kMaxPosition, rank.geometry.rot_idx, 5e6);
  DevBuf<bf16> cos_m{rm.cos}, sin_m{rm.sin}, cos_i{ri.cos}, sin_i{ri.sin};
  // per-step buffers (T = 2)
  DevBuf<bf16> x{random_bf16(static_cast<std::size_t>(kB) * kHidden, rng, 1.f)}, partial{static_cast<std::size_t>(kB) * kHidden};
  DevBuf<bf16> c{random_bf16(static_cast<std::size_t>(kB) * rank.padded_rows, rng, 1.f)};
  DevBuf<bf16> q{static_cast<std::size_t>(kB) * Hl * D}, index_k{static_cast<std::size_t>(kB) * P};
  DevBuf<bf16> out{static_cast<std::size_t>(kB) * Hl * D};
  DevBuf<std::uint8_t> index_q{static_cast<std::size_t>(kB) * Il * P};
  DevBuf<float> weights{static_cast<std::size_t>(kB) * Il};
  DevBuf<std::int32_t> ids{static_cast<std::size_t>(lg) * kB * (kTopk + 1)}, counts{static_cast<std::size_t>(lg) * kB};
  DevBuf<std::int32_t> d_cu{kB + 1}, d_seq{kB}, d_table{kB * kMaxBlocks}, d_slots{kB}, d_fault{ops::kBoundsFaultWords};
  std::size_t select_ws_bytes = ops::indexer_select_workspace_bytes(rank, kB, kMaxSeqLen, kB);
  DevBuf<unsigned char> select_ws{select_ws_bytes};
  // host mirrors
  std::vector<std::int32_t> cu = {0, 1, 2}, seq = {129, 11}, table = {0, 1, 2, 3}, slots = {0, 1};

  void upload_meta(const std::vector<std::int32_t>& device_seq) {
    d_cu.up(cu), d_seq.up(device_seq), d_table.up(table), d_slots.up(slots);
  }
  ops::IndexerBatch batch() const { return {d_cu.p, d_seq.p, kB, 2, cu.data(), seq.data()}; }
  ops::PagedTable paged(std::int32_t* fault) const { return {d_table.p, kMaxBlocks, kBlockSize, kNumBlocks, fault}; }
  ops::DsaLayerCapacity cap() const {
    ops::DsaLayerCapacity cp;
    cp.max_tokens = kB, cp.max_requests = kB, cp.max_seq_len = kMaxSeqLen, cp.max_topk = kTopk;
    cp.block_size = kBlockSize, cp.max_blocks = kMaxBlocks, cp.num_blocks = kNumBlocks;
    return cp;
  }
  ops::DsaLayerWeights layer_weights() const {
    ops::DsaLayerWeights w;
    w.fused = fused.p, w.o_proj = o_proj.p, w.q_norm = q_norm.p, w.k_norm = k_norm.p, w.index_q_norm = iq_norm.p;
    w.index_k_norm_w = ik_w.p, w.index_k_norm_b = ik_b.p, w.cos_main = cos_m.p, w.sin_main = sin_m.p;
    w.cos_idx = cos_i.p, w.sin_idx = sin_i.p, w.max_position = kMaxPosition, w.eps = 1e-5f;
    return w;
  }
  ops::DsaLayerCaches caches() const {
    ops::DsaLayerCaches cc;
    cc.k_cache = k.p, cc.v_cache = v.p, cc.summary_cache = summary.p, cc.tail = tail.p, cc.num_slots = kB;
    return cc;
  }
  ops::DsaLayerStep step(std::int32_t* fault) const {
    ops::DsaLayerStep s;
    s.batch = batch();
    s.table = paged(fault);
    s.tail_slot = d_slots.p, s.max_seq_len = kMaxSeqLen, s.topk = kTopk;
    return s;
  }
  /// Runs dsa_layer_forward (synchronised); returns its Status.
  step5::Status layer(std::int32_t* fault) {
    ops::DsaLayerCapacity cp = cap();
    std::size_t ws_bytes = 0;
    const step5::Status ws = ops::dsa_layer_workspace_bytes(rank, kHidden, cp, &ws_bytes);
    if (!ws.ok()) return ws;
    DevBuf<unsigned char> lws(ws_bytes);
    GPU_CHECK(cudaMemset(lws.p, 0, ws_bytes));
    const step5::Status s = ops::dsa_layer_forward(rank, kHidden, layer_weights(), caches(), step(fault), x.p, partial.p,
                                                   lws.p, ws_bytes, cp, nullptr);
    GPU_CHECK(cudaDeviceSynchronize());
    return s;
  }
};

/// Byte-identical except the (block, row) KV rows in `allowed`.
bool kv_same_except(const std::vector<bf16>& a, const std::vector<bf16>& b, std::size_t row_elems,
                    const std::vector<std::pair<int, int>>& allowed) {
  if (a.size() != b.size()) return false;
  const std::size_t rows = a.size() / row_elems;
  for (std::size_t r = 0; r < rows; ++r) {
    bool skip = false;
    for (auto [blk, row] : allowed) skip = skip || r == static_cast<std::size_t>(blk) * kBlockSize + row;
    if (!skip && std::memcmp(&a[r * row_elems], &b[r * row_elems], row_elems * sizeof(bf16)) != 0) return false;
  }
  return true;
}

void expect_names_example(const step5::Status& s, const std::string& ref_body, const char* who) {
  EXPECT(s.code() == StatusCode::kInvalidArgument, "%s: expected kInvalidArgument, got '%s'", who, s.to_string().c_str());
  for (const char* n : {"request 0", "position 128", "capacity 128"})
    EXPECT(s.message().find(n) != std::string::npos, "%s: '%s' lacks '%s'", who, s.message().c_str(), n);
  EXPECT(body(s.message()) == ref_body, "%s: message '%s' differs from the CPU reference's '%s'", who,
         body(s.message()).c_str(), ref_body.c_str());
}

}  // namespace

GPU_CASE("issue 12 §1: decode at position 128 with capacity 128 is refused by every launcher; caches unchanged") {
  World w;
  w.upload_meta(w.seq);
  GPU_CHECK(cudaDeviceSynchronize());
  // the CPU reference's message for the same step (write_kv_cache is its first cache access)
  std::string ref_body;
  try {
    std::vector<bf16> kc(w.k0), vc(w.v0), kk(static_cast<std::size_t>(kB) * w.KVl * w.D);
    ref::write_kv_cache(ref::BatchView{kB, w.cu.data(), w.seq.data()},
                        ref::BlockTableView{w.table.data(), kMaxBlocks, kBlockSize, kNumBlocks}, w.KVl, w.D, kk.data(),
                        w.KVl * w.D, kk.data(), w.KVl * w.D, kc.data(), vc.data());
  } catch (const step5::Error& e) {
    ref_body = body(e.what());
  }
  EXPECT(!ref_body.empty(), "the CPU reference accepted the step");

  ops::IndexerPrepareParams pp;
  pp.rank = w.rank, pp.batch = w.batch(), pp.table = w.paged(nullptr), pp.c = w.c.p, pp.ldc = w.rank.padded_rows;
  pp.q_norm = w.q_norm.p, pp.k_norm = w.k_norm.p, pp.index_q_norm = w.iq_norm.p, pp.index_k_norm_w = w.ik_w.p;
  pp.index_k_norm_b = w.ik_b.p, pp.cos_main = w.cos_m.p, pp.sin_main = w.sin_m.p, pp.cos_idx = w.cos_i.p;
  pp.sin_idx = w.sin_i.p, pp.max_position = kMaxPosition, pp.q_out = w.q.p, pp.k_cache = w.k.p, pp.v_cache = w.v.p;
  pp.index_q = w.index_q.p, pp.weights = w.weights.p, pp.index_k = w.index_k.p;
  expect_names_example(ops::indexer_prepare(pp, nullptr), ref_body, "indexer_prepare");

  ops::IndexerSummaryParams sp;
  sp.rank = w.rank, sp.batch = w.batch(), sp.table = w.paged(nullptr), sp.index_k = w.index_k.p, sp.c = w.c.p;
  sp.ldc = w.rank.padded_rows, sp.summary_cache = w.summary.p, sp.tail = w.tail.p, sp.tail_slot = w.d_slots.p;
  sp.num_slots = kB;
  expect_names_example(ops::indexer_summaries(sp, nullptr), ref_body, "indexer_summaries");

  ops::IndexerSelectParams se;
  se.rank = w.rank, se.batch = w.batch(), se.table = w.paged(nullptr), se.index_q = w.index_q.p, se.weights = w.weights.p;
  se.summary_cache = w.summary.p, se.topk = kTopk, se.max_seq_len = kMaxSeqLen, se.topk_ids = w.ids.p;
  se.counts = w.counts.p, se.workspace = w.select_ws.p, se.workspace_bytes = w.select_ws_bytes;
  expect_names_example(ops::indexer_select(se, nullptr), ref_body, "indexer_select");

  ops::SparseAttentionParams a;
  a.num_tokens = kB, a.num_requests = kB, a.num_local_heads = w.Hl, a.num_kv_groups = w.lg, a.head_dim = w.D;
  a.topk = kTopk, a.q = w.q.p, a.k_cache = w.k.p, a.v_cache = w.v.p, a.num_blocks = kNumBlocks;
  a.block_size = kBlockSize, a.block_table = w.d_table.p, a.max_blocks = kMaxBlocks, a.cu_seqlens_q = w.d_cu.p;
  a.seq_lens = w.d_seq.p, a.cu_seqlens_q_host = w.cu.data(), a.seq_lens_host = w.seq.data(), a.topk_ids = w.ids.p;
  a.counts = w.counts.p, a.out = w.out.p, a.num_splits = 1;
  expect_names_example(ops::sparse_attention<Tag::kId>(a, nullptr, 0, nullptr), ref_body, "sparse_attention");

  expect_names_example(w.layer(nullptr), ref_body, "dsa_layer_forward");

  GPU_CHECK(cudaDeviceSynchronize());
  EXPECT(same_bits(w.k.down(), w.k0) && same_bits(w.v.down(), w.v0), "KV cache changed");
  EXPECT(same_bits(w.summary.down(), w.sum0), "summary cache changed");
  EXPECT(same_bits(w.tail.down(), w.tail0), "tail buffer changed");
}

/// After a host-valid step whose device values fault (request 0): in checked mode the fault is
/// reported as kInvalidArgument naming each of `names`; in both modes the only cache write is the
/// legitimate one, request 1's row at position 10 (block 2, row 10), and no region completes (the
/// summary cache is unchanged).
void expect_fault_contained(World& w, bool checked, std::initializer_list<const char*> names) {
  const char* mode = checked ? "checked" : "unchecked";
  if (checked) {
    const step5::Status f =
        ops::read_bounds_fault(w.d_fault.p, {kBlockSize, kMaxBlocks, kNumBlocks, kMaxPosition}, nullptr);
    EXPECT(f.code() == StatusCode::kInvalidArgument, "fault not reported: %s", f.to_string().c_str());
    for (const char* n : names)
      EXPECT(f.message().find(n) != std::string::npos, "'%s' lacks '%s'", f.message().c_str(), n);
  }
  const std::size_t row = static_cast<std::size_t>(w.KVl) * w.D;
  EXPECT(kv_same_except(w.k.down(), w.k0, row, {{2, 10}}) && kv_same_except(w.v.down(), w.v0, row, {{2, 10}}),
         "%s: KV cache bytes outside request 1's new row changed", mode);
  EXPECT(same_bits(w.summary.down(), w.sum0), "%s: summary cache changed (no region completes)", mode);
}

GPU_CASE("checked mode: a block id outside [0, num_blocks) is reported, not accessed; other cache bytes untouched") {
  for (const bool checked : {true, false}) {
    World w;
    w.seq = {100, 11};           // valid on the host: capacity 128
    w.table = {0, 99, 2, 3};     // request 0's second block (positions 64..127) is out of range
    w.upload_meta(w.seq);
    GPU_CHECK(cudaMemset(w.d_fault.p, 0xff, ops::kBoundsFaultWords * 4));  // poison, then reset
    const step5::Status reset = ops::reset_bounds_fault(w.d_fault.p, nullptr);
    EXPECT(reset.ok(), "reset_bounds_fault: %s", reset.to_string().c_str());
    const step5::Status s = w.layer(checked ? w.d_fault.p : nullptr);
    EXPECT(s.ok(), "dsa_layer_forward (host-valid step): %s", s.to_string().c_str());
    expect_fault_contained(w, checked, {"request 0", "= 99", "num_blocks = 4"});
  }
}

GPU_CASE("checked mode: device seq_lens past the row (graph replay) is reported; request 1's cache untouched") {
  for (const bool checked : {true, false}) {
    World w;
    w.seq = {100, 11};                 // the host mirror (validated) ...
    w.upload_meta({129, 11});          // ... the device values a replay runs with: position 128
    GPU_CHECK(cudaMemset(w.d_fault.p, 0, ops::kBoundsFaultWords * 4));
    const step5::Status s = w.layer(checked ? w.d_fault.p : nullptr);
    EXPECT(s.ok(), "dsa_layer_forward (host-valid step): %s", s.to_string().c_str());
    // (before the fix the KV row of position 128 went to block_table[0][2] = request 1's block 2, row 0)
    expect_fault_contained(w, checked, {"request 0", "position 128", "capacity 128"});
  }
}

GPU_CASE("checked mode: a decode step by the host mirror with 2 tokens of one request on the device: the folded summaries are skipped and reported") {
  // indexer_prepare does step 4 in its own launch when every request has one token by the host
  // mirror (ops::indexer_prepare_folds_summaries); a replay whose device cu_seqlens_q gives request
  // 0 both tokens must not complete a region or write a tail row from one warp's view of it.
  for (const bool checked : {true, false}) {
    World w;
    w.seq = {104, 11};  // host mirror: request 0 decodes position 103 (its region's last row)
    w.upload_meta(w.seq);
    w.d_cu.up(std::vector<std::int32_t>{0, 2, 2});  // device: request 0 has 2 tokens (102, 103)
    GPU_CHECK(cudaMemset(w.d_fault.p, 0, ops::kBoundsFaultWords * 4));
    int sms = 0;
    EXPECT(step5::device_sm_count(0, &sms).ok(), "device_sm_count");
    EXPECT(ops::indexer_prepare_folds_summaries(w.batch(), sms), "the host mirror's decode step is not folded");
    const step5::Status s = w.layer(checked ? w.d_fault.p : nullptr);
    EXPECT(s.ok(), "dsa_layer_forward (host-valid step): %s", s.to_string().c_str());
    if (checked) {
      const step5::Status f =
          ops::read_bounds_fault(w.d_fault.p, {kBlockSize, kMaxBlocks, kNumBlocks, kMaxPosition}, nullptr);
      EXPECT(f.code() == StatusCode::kInvalidArgument, "fault not reported: %s", f.to_string().c_str());
      for (const char* n : {"request 0", "q_len = 2", "expected 1"})
        EXPECT(f.message().find(n) != std::string::npos, "'%s' lacks '%s'", f.message().c_str(), n);
    }
    EXPECT(same_bits(w.summary.down(), w.sum0), "%s: summary cache changed", checked ? "checked" : "unchecked");
    EXPECT(same_bits(w.tail.down(), w.tail0), "%s: tail buffer changed", checked ? "checked" : "unchecked");
  }
}

GPU_CASE("checked mode: device seq_lens past the step's max_seq_len (inside the row): the score rows and the selection stay inside the workspace, reported") {
  // The host mirror is valid for max_seq_len 64 (score rows of score_ld(64) = 8 regions); a replay
  // runs with request 1 (the last token, so its rows end the score workspace) at position 119 (14
  // regions of history), still inside its block-table row (capacity 128), so no cache access faults. Before the cut (score_row_regions, topk_row) the
  // score kernels stored up to a region chunk past each 8-region row and the selection read 14
  // keys of each: past the workspace for the last rows. indexer_select alone, its workspace
  // exactly the size it asks for inside a poisoned guard allocation: the guard must be untouched
  // (and compute-sanitizer memcheck clean), checked mode reports the position, and every id is in
  // [-1, 8].
  constexpr int kStepMaxSeqLen = 64;
  for (const bool checked : {true, false}) {
    World w;
    w.seq = {11, 60};          // the host mirror: valid for max_seq_len 64
    w.upload_meta({11, 120});  // the device values: request 1 at position 119 > 64
    GPU_CHECK(cudaMemset(w.d_fault.p, 0, ops::kBoundsFaultWords * 4));
    // index_q / weights: random, as indexer_prepare would leave them
    std::mt19937 rng(7u);
    w.index_q.up(random_u8(static_cast<std::size_t>(kB) * w.Il * w.P, rng));
    w.weights.up(random_f32(static_cast<std::size_t>(kB) * w.Il, rng, 1.f));
    const std::size_t need = ops::indexer_select_workspace_bytes(w.rank, kB, kStepMaxSeqLen, kB);
    constexpr std::size_t kGuard = 1 << 16;
    DevBuf<unsigned char> ws{need + kGuard};
    GPU_CHECK(cudaMemset(ws.p, 0xa5, need + kGuard));
    ops::IndexerSelectParams se;
    se.rank = w.rank, se.batch = w.batch(), se.table = w.paged(checked ? w.d_fault.p : nullptr);
    se.index_q = w.index_q.p, se.weights = w.weights.p, se.summary_cache = w.summary.p, se.topk = kTopk;
    se.max_seq_len = kStepMaxSeqLen, se.topk_ids = w.ids.p, se.counts = w.counts.p;
    se.workspace = ws.p, se.workspace_bytes = need;
    GPU_CHECK(cudaMemset(w.ids.p, 0x7f, w.ids.n * sizeof(std::int32_t)));
    const step5::Status s = ops::indexer_select(se, nullptr);
    GPU_CHECK(cudaDeviceSynchronize());
    const char* mode = checked ? "checked" : "unchecked";
    EXPECT(s.ok(), "%s: indexer_select (host-valid step): %s", mode, s.to_string().c_str());
    const std::vector<unsigned char> all = ws.down();
    std::size_t touched = 0;
    for (std::size_t i = need; i < all.size(); ++i) touched += all[i] != 0xa5;
    EXPECT(touched == 0, "%s: %zu guard bytes past the %zu-byte workspace changed", mode, touched, need);
    const long long ld = ops::detail::score_ld(kStepMaxSeqLen);
    for (const std::int32_t id : w.ids.down())
      EXPECT(id >= -1 && id <= ld, "%s: selected id %d outside [-1, ld = %lld]", mode, id, ld);
    if (checked) {
      const step5::Status f =
          ops::read_bounds_fault(w.d_fault.p, {kBlockSize, kMaxBlocks, kNumBlocks, kMaxPosition}, nullptr);
      EXPECT(f.code() == StatusCode::kInvalidArgument, "fault not reported: %s", f.to_string().c_str());
      for (const char* n : {"request 1", "position 119", "exceeds the 8 regions of a score row"})
        EXPECT(f.message().find(n) != std::string::npos, "'%s' lacks '%s'", f.message().c_str(), n);
    }
  }
}

GPU_CASE("checked mode: a device tail slot outside [0, num_slots): not read or written, its region not summarised, reported") {
  // The host mirror is valid and no host copy of tail_slot is passed (a replayed graph's slots):
  // request 1 gets slot 9 with num_slots 2, at position 15 (the last row of region 1, whose rows
  // 8..14 wait in its tail slot: the region would be summarised) and at position 12 (row 4: the
  // row would be appended to the tail slot). Both places that do step 4 must leave the tail
  // buffer and the summary cache alone (before: region 1 was summarised from zeros, silently) and
  // checked mode must name the slot: indexer_summaries, and dsa_layer_forward (whose
  // indexer_prepare folds step 4 into its own launch for this decode step). Request 0 (position
  // 99, row 3 of its region) appends to its own slot 0: the one legitimate tail write, rows
  // [6P, 8P) of slot 0 (a bad slot clamped to 0 would show elsewhere in slot 0).
  const auto expect_contained = [](World& w, bool checked, int pos1, const char* who) {
    const char* mode = checked ? "checked" : "unchecked";
    if (checked) {
      const step5::Status f = ops::read_bounds_fault(
          w.d_fault.p, {kBlockSize, kMaxBlocks, kNumBlocks, kMaxPosition, /*num_slots=*/kB}, nullptr);
      EXPECT(f.code() == StatusCode::kInvalidArgument, "%s: fault not reported: %s", who, f.to_string().c_str());
      const std::string at = "position " + std::to_string(pos1);
      for (const std::string& n : {std::string("request 1"), at, std::string("tail_slot = 9"), std::string("num_slots = 2")})
        EXPECT(f.message().find(n) != std::string::npos, "%s: '%s' lacks '%s'", who, f.message().c_str(), n.c_str());
    }
    EXPECT(same_bits(w.summary.down(), w.sum0), "%s %s (position %d): summary cache changed", who, mode, pos1);
    const std::vector<bf16> tail = w.tail.down();
    const std::size_t slot_elems = static_cast<std::size_t>(kR) * 2 * w.P, row = 2 * static_cast<std::size_t>(w.P);
    EXPECT(std::memcmp(tail.data() + slot_elems, w.tail0.data() + slot_elems, slot_elems * sizeof(bf16)) == 0,
           "%s %s (position %d): slot 1 (nobody's this step) changed", who, mode, pos1);
    EXPECT(std::memcmp(tail.data(), w.tail0.data(), 3 * row * sizeof(bf16)) == 0 &&
               std::memcmp(tail.data() + 4 * row, w.tail0.data() + 4 * row, 4 * row * sizeof(bf16)) == 0,
           "%s %s (position %d): slot 0 changed outside request 0's row 3", who, mode, pos1);
  };
  for (const int seq1 : {16, 13}) {
    for (const bool checked : {true, false}) {
      {
        World w;
        w.seq = {100, seq1};
        w.upload_meta(w.seq);
        w.d_slots.up(std::vector<std::int32_t>{0, 9});
        GPU_CHECK(cudaMemset(w.d_fault.p, 0, ops::kBoundsFaultWords * 4));
        ops::IndexerSummaryParams sp;
        sp.rank = w.rank, sp.batch = w.batch(), sp.table = w.paged(checked ? w.d_fault.p : nullptr);
        sp.index_k = w.index_k.p, sp.c = w.c.p, sp.ldc = w.rank.padded_rows, sp.summary_cache = w.summary.p;
        sp.tail = w.tail.p, sp.tail_slot = w.d_slots.p, sp.num_slots = kB;
        std::mt19937 rng(11u);
        w.index_k.up(random_bf16(w.index_k.n, rng, 1.f));  // as indexer_prepare would leave it
        const step5::Status s = ops::indexer_summaries(sp, nullptr);
        GPU_CHECK(cudaDeviceSynchronize());
        EXPECT(s.ok(), "indexer_summaries (host-valid step): %s", s.to_string().c_str());
        expect_contained(w, checked, seq1 - 1, "indexer_summaries");
      }
      {
        World w;
        w.seq = {100, seq1};
        w.upload_meta(w.seq);
        w.d_slots.up(std::vector<std::int32_t>{0, 9});
        GPU_CHECK(cudaMemset(w.d_fault.p, 0, ops::kBoundsFaultWords * 4));
        int sms = 0;
        EXPECT(step5::device_sm_count(0, &sms).ok(), "device_sm_count");
        EXPECT(ops::indexer_prepare_folds_summaries(w.batch(), sms), "the decode step is not folded");
        const step5::Status s = w.layer(checked ? w.d_fault.p : nullptr);
        EXPECT(s.ok(), "dsa_layer_forward (host-valid step): %s", s.to_string().c_str());
        expect_contained(w, checked, seq1 - 1, "dsa_layer_forward");
      }
    }
  }
}

STEP5_GPU_TEST_MAIN()
