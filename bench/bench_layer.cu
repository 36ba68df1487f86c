// Benchmark of one DSA layer on one TP rank (step5/ops/layer.hpp `dsa_layer_plan` + `dsa_layer_run`, SPEC §4
// steps 1–8 up to the all-reduce), with a per-kernel breakdown against the SPEC §9 floors.
//
//   copy/d2d, cublas/bf16_gemm/8192              the two ceilings (bench_common.hpp)
//   layer/step5_preview/tp:N/tokens:T/ctx:C      rank 0 of step5_preview at tp N, hidden 4096, topk 512
//     prefill: ctx:0  — one request, one chunk of T new tokens (T = 8192, 32768), empty history
//                       (positions 0..T-1, every region completed in the step, chunk = all tokens)
//     decode:  ctx:C  — T requests (batch 1, 16, 64), one query row each at position C (C = 32768,
//                       131072) after C cached tokens: seq_lens = C + 1
//
// Data: random bf16 weights (fused [padded_rows, hidden], o_proj [hidden, Hl*D]), random fp32
// norms, bf16 RoPE tables from reference::make_rope_table (theta 5e6), random bf16 x. The caches
// hold random data for the whole context (k/v bf16, summaries finite e4m3 with |x| < 2, tail rows
// bf16), so selection and attention read real data; block tables are a random permutation of just
// enough blocks (block_size 64). Decode contexts are multiples of 8, so the decode row starts a new
// region: it is written to the tail slot and no summary is completed (the tail's random rows are
// not read). Every iteration rewrites the same cache rows with the same values (idempotent).
//
// Timing: per iteration, the L2 is flushed and a 1–3 ms GPU spin is queued (so the host enqueues
// the whole layer before the timed region starts: host launch overhead excluded), then CUDA events
// at the start and after every stage (DsaLayerHook). UseManualTime = layer time. Counters (medians
// over the iterations):
//   layer_us, floor_us (sum of the stage floors), x_floor = layer_us / floor_us,
//   <stage>_us, <stage>_floor_us, <stage>_x_floor, <stage>_bytes, <stage>_flops, <stage>_GBps, <stage>_TFLOPs
//   for stage in fused_gemm prepare summaries select attention o_proj_gemm, plus copy_GBps, gemm_TFLOPs,
//   tp, tokens, ctx, batch, nonfinite_out (non-finite values among the first output rows; must be 0).
// Floor of a stage (SPEC §9) = max(bytes / copy bandwidth, flops / bf16 GEMM rate), the bytes
// being the minimum traffic of the stage (see `layer_costs`). Note: the indexer's score GEMM runs
// on e4m3 tensor cores (2× the bf16 rate), its floor still uses the bf16 rate (it is
// bandwidth-bound at decode, where it matters).
// A table is printed last. Target (issue 7): decode batch 64 at 128K, tp 1: x_floor <= 1.4.
//
// Run: build-*/bench/bench_layer --benchmark_out=bench_layer.json --benchmark_out_format=json
// (about 30–60 s, < 35 GB of device memory). `bench_layer --floors_only` prints the cost model at
// the SPEC §9 H200 ceilings without a device.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "step5/core/numeric.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/layer.hpp"
#include "step5/reference/rope.hpp"

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

using step5::bf16;
namespace layout = step5::layout;
namespace ops = step5::ops;
namespace sb = step5::bench;

constexpr const char* kGeometryName = "step5_preview";
constexpr int kHidden = 4096;
constexpr int kTopk = 512;
constexpr int kBlockSize = 64;
constexpr double kTheta = 5e6;  // RoPE base of the tables (any valid value: only shapes the data)
constexpr int kMaxPosition = 131072 + 64;
constexpr int kStages = 6;
constexpr const char* kStageNames[kStages] = {"fused_gemm", "prepare", "summaries", "select", "attention", "o_proj_gemm"};

cudaStream_t g_stream;

struct Case {
  int tp = 1;
  int batch = 1;   ///< requests
  int q_len = 1;   ///< new rows per request
  int ctx = 0;     ///< cached tokens before the step (0 = prefill from scratch)
  int tokens() const { return batch * q_len; }
  int seq_len() const { return ctx + q_len; }
};

/// Minimum traffic and FLOPs of one stage (SPEC §9).
struct StageCost {
  double bytes = 0, flops = 0;
};

/// SPEC §9 cost model of the six stages for rank `r` (see the file comment). Per request:
/// positions p = ctx .. ctx+q_len-1; history regions hist(p) = p/8; selected min(topk, p/8);
/// attended tokens = 8·selected + (p % 8 + 1).
std::array<StageCost, kStages> layer_costs(const layout::RankLayout& r, int hidden, const Case& c) {
  using layout::Shard;
  const double T = c.tokens(), B = c.batch, H = hidden;
  const double D = r.geometry.head_dim, P = r.geometry.proxy_dim, Hl = r.local_heads, KVl = r.local_kv_heads,
               lg = r.local_kv_groups, Il = r.index_local_heads, hpg = r.hpg_q, N1 = r.padded_rows;
  const double z_rows = r.shard(Shard::kIndexZ).rows, g_rows = r.shard(Shard::kIndexG).rows;
  std::array<StageCost, kStages> s{};
  // 1. fused GEMM: weights + x + C.
  s[0].bytes = N1 * H * 2 + T * H * 2 + T * N1 * 2;
  s[0].flops = 2 * T * N1 * H;
  // 2-3. prepare: reads the q/k/v/index_q/index_k/w columns of C; writes q, k/v cache rows,
  // index_q (e4m3), weights (fp32), index_k (bf16).
  s[1].bytes = T * (r.rows_with_w - z_rows - g_rows) * 2 + T * Hl * D * 2 + T * 2 * KVl * D * 2 + T * Il * P +
               T * Il * 4 + T * P * 2;
  // per-request sums over the new rows
  double hist_sum = 0, attended_sum = 0;
  for (int i = 0; i < c.q_len; ++i) {
    const long long p = static_cast<long long>(c.ctx) + i;
    hist_sum += static_cast<double>(step5::bench::history_regions(p));
    attended_sum += step5::bench::attended_tokens(p, kTopk);
  }
  const long long seq = c.seq_len(), prev = c.ctx;
  // 4. summaries: index_k + index_z of the new rows, completed regions (e4m3), tail rows
  // (pending rows of a completed region read; new pending rows written, 2·P bf16 each).
  const double completed = static_cast<double>(seq / kR - prev / kR);
  const double prev_pending_read = completed > 0 ? static_cast<double>(prev % kR) : 0.0;
  const double new_pending = static_cast<double>(std::min<long long>(c.q_len, seq % kR));
  s[2].bytes = T * P * 2 + T * z_rows * 2 + B * (completed * P + (prev_pending_read + new_pending) * 2 * P * 2);
  // 5-6. select: each request's history summaries once (shared by its local groups) + index_q,
  // weights, ids/counts out; score FLOPs 2·Il·P per (token, history region).
  s[3].bytes = B * static_cast<double>((seq - 1) / kR) * P + T * Il * (P + 4) + lg * T * (kTopk + 2) * 4;
  s[3].flops = B * 2 * Il * P * hist_sum;
  // 7-8. attention: per (request, KV group) the K/V of the attended tokens, each token at most once
  // (<= seq_len tokens), + q, gate, out, ids; FLOPs 4·hpg_q·D per (query head group, token).
  const double unique = std::min(attended_sum, static_cast<double>(seq));
  s[4].bytes = B * lg * unique * 2 * D * 2 + T * Hl * D * 2 * 2 + T * Hl * 2 + lg * T * (kTopk + 2) * 4;
  s[4].flops = B * lg * 4 * hpg * D * attended_sum;
  // 8. o_proj GEMM: weights + attn + partial.
  const double K2 = Hl * D;
  s[5].bytes = H * K2 * 2 + T * K2 * 2 + T * H * 2;
  s[5].flops = 2 * T * H * K2;
  return s;
}

/// Owning device allocation.
template <class T>
struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t count) : n(count) {
    STEP5_BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  std::size_t bytes() const { return n * sizeof(T); }
};

/// RoPE tables on the device, built once for kMaxPosition positions.
struct RopeTables {
  DevBuf<bf16>* cos_main = nullptr;
  DevBuf<bf16>* sin_main = nullptr;
  DevBuf<bf16>* cos_idx = nullptr;
  DevBuf<bf16>* sin_idx = nullptr;
};
RopeTables& rope_tables(const layout::Geometry& g) {
  static RopeTables t = [&] {
    RopeTables r;
    auto up = [](const std::vector<bf16>& h) {
      auto* d = new DevBuf<bf16>(h.size());
      STEP5_BENCH_CUDA(cudaMemcpy(d->p, h.data(), d->bytes(), cudaMemcpyHostToDevice));
      return d;
    };
    const auto m = step5::reference::make_rope_table(kMaxPosition, g.rot_main, kTheta);
    const auto x = step5::reference::make_rope_table(kMaxPosition, g.rot_idx, kTheta);
    r.cos_main = up(m.cos), r.sin_main = up(m.sin), r.cos_idx = up(x.cos), r.sin_idx = up(x.sin);
    STEP5_BENCH_CUDA(cudaDeviceSynchronize());
    return r;
  }();
  return t;
}

/// Records one CUDA event after each stage, by stage name.
struct EventHook final : ops::DsaLayerHook {
  std::array<cudaEvent_t, kStages + 1> ev{};  // ev[0]: start, ev[i+1]: after stage i
  std::array<bool, kStages> seen{};
  std::string error;
  EventHook() {
    for (auto& e : ev) STEP5_BENCH_CUDA(cudaEventCreate(&e));
  }
  ~EventHook() override {
    for (auto& e : ev) cudaEventDestroy(e);
  }
  void begin(cudaStream_t s) {
    seen.fill(false);
    STEP5_BENCH_CUDA(cudaEventRecord(ev[0], s));
  }
  void after(const char* stage, cudaStream_t s) override {
    for (int i = 0; i < kStages; ++i)
      if (std::strcmp(stage, kStageNames[i]) == 0) {
        if (seen[i] || (i > 0 && !seen[i - 1])) error = std::string("stage '") + stage + "' out of order";
        seen[i] = true;
        STEP5_BENCH_CUDA(cudaEventRecord(ev[i + 1], s));
        return;
      }
    error = std::string("unknown stage '") + stage + "' reported by dsa_layer_run";
  }
  /// Seconds of each stage and of the whole layer (synchronizes on the last event).
  bool read(std::array<double, kStages>* stage_s, double* layer_s) {
    for (int i = 0; i < kStages; ++i)
      if (!seen[i]) {
        error = std::string("stage '") + kStageNames[i] + "' was not reported by dsa_layer_run";
        return false;
      }
    STEP5_BENCH_CUDA(cudaEventSynchronize(ev[kStages]));
    for (int i = 0; i < kStages; ++i) {
      float ms = 0;
      STEP5_BENCH_CUDA(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
      (*stage_s)[i] = ms * 1e-3;
    }
    float ms = 0;
    STEP5_BENCH_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[kStages]));
    *layer_s = ms * 1e-3;
    return true;
  }
};

struct Row {
  std::string name;
  double layer_us = 0, floor_us = 0;
  std::array<double, kStages> us{}, floor{};
};
std::vector<Row> g_rows;

int bf16_nonfinite(const std::vector<std::uint16_t>& h) {
  int n = 0;
  for (std::uint16_t v : h) n += (v & 0x7f80u) == 0x7f80u;
  return n;
}

void bm_layer(benchmark::State& state, Case c, std::string name) {
  const layout::GeometryEntry* entry = layout::find_geometry(kGeometryName);
  if (entry == nullptr) {
    state.SkipWithError("geometry step5_preview not in geometries.def");
    return;
  }
  const layout::RankLayoutResult rl = layout::make_rank_layout(entry->geometry, layout::standard_layout(entry->geometry, c.tp), 0);
  if (!rl.ok()) {
    state.SkipWithError(("invalid layout: " + layout::describe(rl.error)).c_str());
    return;
  }
  const layout::RankLayout& r = rl.layout;
  const layout::Geometry& g = r.geometry;
  const int T = c.tokens(), B = c.batch, seq = c.seq_len();
  const int D = g.head_dim, P = g.proxy_dim, Hl = r.local_heads, KVl = r.local_kv_heads;
  if (seq > kMaxPosition) {
    state.SkipWithError("context beyond the RoPE tables");
    return;
  }
  const sb::CopyCeiling& copy = sb::copy_ceiling(g_stream);
  const sb::GemmCeiling& gemm = sb::gemm_ceiling(g_stream);
  RopeTables& rope = rope_tables(g);

  const int max_blocks = (seq + kBlockSize - 1) / kBlockSize;
  const int num_blocks = B * max_blocks;
  const std::size_t kv_elems = static_cast<std::size_t>(num_blocks) * kBlockSize * KVl * D;
  const std::size_t sum_bytes = static_cast<std::size_t>(num_blocks) * (kBlockSize / kR) * P;
  ops::DsaLayerCapacity cap;
  cap.max_tokens = T, cap.max_requests = B, cap.max_seq_len = seq, cap.max_topk = kTopk;
  cap.block_size = kBlockSize, cap.max_blocks = max_blocks, cap.num_blocks = num_blocks;
  ops::DsaLayerPlan plan;  // planned once; every timed iteration runs it
  if (const step5::Status st = ops::dsa_layer_plan(r, kHidden, cap, &plan); !st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  const std::size_t ws_bytes = plan.workspace_bytes;
  {  // memory check before allocating (the caches dominate)
    std::size_t free_b = 0, total_b = 0;
    STEP5_BENCH_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const std::size_t need = 2 * kv_elems * 2 + sum_bytes + ws_bytes +
                             static_cast<std::size_t>(r.padded_rows + Hl * D) * kHidden * 2 +
                             2ull * T * kHidden * 2 + (256ull << 20);
    if (need > free_b) {
      state.SkipWithError(("needs " + std::to_string(need >> 20) + " MiB of device memory, " +
                           std::to_string(free_b >> 20) + " MiB free").c_str());
      return;
    }
  }
  cudaStream_t s = g_stream;
  // weights
  DevBuf<bf16> fused(static_cast<std::size_t>(r.padded_rows) * kHidden), o_proj(static_cast<std::size_t>(kHidden) * Hl * D);
  DevBuf<float> q_norm(D), k_norm(D), iq_norm(P), ik_w(P), ik_b(P);
  sb::fill_bf16(fused.p, fused.n, 101u, -0.05f, 0.05f, s);
  sb::fill_bf16(o_proj.p, o_proj.n, 102u, -0.02f, 0.02f, s);
  sb::fill_f32(q_norm.p, D, 103u, -0.1f, 0.1f, s);
  sb::fill_f32(k_norm.p, D, 104u, -0.1f, 0.1f, s);
  sb::fill_f32(iq_norm.p, P, 105u, -0.1f, 0.1f, s);
  sb::fill_f32(ik_w.p, P, 106u, 0.9f, 1.1f, s);
  sb::fill_f32(ik_b.p, P, 107u, -0.1f, 0.1f, s);
  ops::DsaLayerWeights w;
  w.fused = fused.p, w.o_proj = o_proj.p, w.q_norm = q_norm.p, w.k_norm = k_norm.p, w.index_q_norm = iq_norm.p;
  w.index_k_norm_w = ik_w.p, w.index_k_norm_b = ik_b.p;
  w.cos_main = rope.cos_main->p, w.sin_main = rope.sin_main->p, w.cos_idx = rope.cos_idx->p, w.sin_idx = rope.sin_idx->p;
  w.max_position = kMaxPosition, w.eps = 1e-5f;
  // caches: random data for the whole context
  DevBuf<bf16> k_cache(kv_elems), v_cache(kv_elems), tail(static_cast<std::size_t>(B) * kR * 2 * P);
  DevBuf<std::uint8_t> summary(sum_bytes);
  sb::fill_bf16(k_cache.p, kv_elems, 201u, -1.f, 1.f, s);
  sb::fill_bf16(v_cache.p, kv_elems, 202u, -1.f, 1.f, s);
  sb::fill_bf16(tail.p, tail.n, 203u, -1.f, 1.f, s);
  sb::fill_e4m3(summary.p, sum_bytes, 204u, s);
  ops::DsaLayerCaches caches;
  caches.k_cache = k_cache.p, caches.v_cache = v_cache.p, caches.summary_cache = summary.p, caches.tail = tail.p;
  caches.num_slots = B;
  // batch metadata
  std::vector<std::int32_t> h_cu(B + 1), h_seq(B, seq), h_slot(B), h_table(static_cast<std::size_t>(num_blocks));
  for (int b = 0; b <= B; ++b) h_cu[b] = b * c.q_len;
  std::iota(h_slot.begin(), h_slot.end(), 0);
  std::iota(h_table.begin(), h_table.end(), 0);
  std::shuffle(h_table.begin(), h_table.end(), std::mt19937(1234u));
  DevBuf<std::int32_t> d_cu(B + 1), d_seq(B), d_slot(B), d_table(h_table.size());
  STEP5_BENCH_CUDA(cudaMemcpy(d_cu.p, h_cu.data(), d_cu.bytes(), cudaMemcpyHostToDevice));
  STEP5_BENCH_CUDA(cudaMemcpy(d_seq.p, h_seq.data(), d_seq.bytes(), cudaMemcpyHostToDevice));
  STEP5_BENCH_CUDA(cudaMemcpy(d_slot.p, h_slot.data(), d_slot.bytes(), cudaMemcpyHostToDevice));
  STEP5_BENCH_CUDA(cudaMemcpy(d_table.p, h_table.data(), d_table.bytes(), cudaMemcpyHostToDevice));
  ops::DsaLayerStep step;
  step.batch.cu_seqlens_q = d_cu.p, step.batch.seq_lens = d_seq.p, step.batch.num_requests = B, step.batch.num_tokens = T;
  step.batch.cu_seqlens_q_host = h_cu.data(), step.batch.seq_lens_host = h_seq.data();
  step.table.block_table = d_table.p, step.table.max_blocks = max_blocks, step.table.block_size = kBlockSize;
  step.table.num_blocks = num_blocks;
  step.tail_slot = d_slot.p, step.max_seq_len = seq, step.topk = kTopk;
  // activations + workspace
  DevBuf<bf16> x(static_cast<std::size_t>(T) * kHidden), partial(static_cast<std::size_t>(T) * kHidden);
  DevBuf<unsigned char> ws(ws_bytes);
  sb::fill_bf16(x.p, x.n, 301u, -1.f, 1.f, s);
  STEP5_BENCH_CUDA(cudaMemsetAsync(ws.p, 0, ws_bytes, s));
  // g_stream does not synchronize with the legacy stream of the cudaMemcpy calls above.
  STEP5_BENCH_CUDA(cudaDeviceSynchronize());

  EventHook hook;
  auto forward = [&]() {
    return ops::dsa_layer_run(plan, w, caches, step, x.p, partial.p, ws.p, ws_bytes, s, &hook);
  };
  // warm-up (module loading, plans) + validity of the output
  hook.begin(s);
  if (const step5::Status st = forward(); !st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  STEP5_BENCH_CUDA(cudaStreamSynchronize(s));
  STEP5_BENCH_CUDA(cudaGetLastError());
  std::array<double, kStages> stage_s{};
  double layer_s = 0;
  if (!hook.read(&stage_s, &layer_s) || !hook.error.empty()) {
    state.SkipWithError(hook.error.c_str());
    return;
  }
  const int check_rows = std::min(T, 64);
  std::vector<std::uint16_t> h_out(static_cast<std::size_t>(check_rows) * kHidden);
  STEP5_BENCH_CUDA(cudaMemcpy(h_out.data(), partial.p, h_out.size() * 2, cudaMemcpyDeviceToHost));
  const int nonfinite = bf16_nonfinite(h_out);

  sb::L2Flusher flusher;
  const double spin_us = T >= 4096 ? 3000 : 1000;
  std::vector<double> layer_v;
  std::array<std::vector<double>, kStages> stage_v;
  for (auto _ : state) {
    flusher.flush(s);
    sb::gpu_sleep(s, spin_us);
    hook.begin(s);
    const step5::Status st = forward();
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
    if (!hook.read(&stage_s, &layer_s) || !hook.error.empty()) {
      state.SkipWithError(hook.error.c_str());
      break;
    }
    state.SetIterationTime(layer_s);
    layer_v.push_back(layer_s);
    for (int i = 0; i < kStages; ++i) stage_v[i].push_back(stage_s[i]);
  }
  STEP5_BENCH_CUDA(cudaStreamSynchronize(s));
  STEP5_BENCH_CUDA(cudaGetLastError());
  if (layer_v.empty()) return;

  const auto cost = layer_costs(r, kHidden, c);
  Row row;
  row.name = name;
  row.layer_us = sb::median(layer_v) * 1e6;
  auto& ctr = state.counters;
  for (int i = 0; i < kStages; ++i) {
    const std::string k = kStageNames[i];
    const double t = sb::median(stage_v[i]);
    const double f = sb::floor_seconds(cost[i].bytes, cost[i].flops, copy, gemm);
    row.us[i] = t * 1e6;
    row.floor[i] = f * 1e6;
    row.floor_us += f * 1e6;
    ctr[k + "_us"] = t * 1e6;
    ctr[k + "_floor_us"] = f * 1e6;
    ctr[k + "_x_floor"] = f > 0 ? t / f : 0;
    ctr[k + "_bytes"] = cost[i].bytes;
    ctr[k + "_flops"] = cost[i].flops;
    ctr[k + "_GBps"] = cost[i].bytes / t / 1e9;
    ctr[k + "_TFLOPs"] = cost[i].flops / t / 1e12;
  }
  ctr["layer_us"] = row.layer_us;
  ctr["floor_us"] = row.floor_us;
  ctr["x_floor"] = row.layer_us / row.floor_us;
  ctr["copy_GBps"] = copy.gbs;
  ctr["gemm_TFLOPs"] = gemm.tflops;
  ctr["tp"] = c.tp;
  ctr["tokens"] = T;
  ctr["ctx"] = c.ctx;
  ctr["batch"] = B;
  ctr["nonfinite_out"] = nonfinite;
  if (nonfinite > 0) std::fprintf(stderr, "WARNING %s: %d non-finite values in the first output rows\n", name.c_str(), nonfinite);
  g_rows.push_back(row);
}

void bm_copy(benchmark::State& st) {
  const sb::CopyCeiling& c = sb::copy_ceiling(g_stream);
  for (auto _ : st) st.SetIterationTime(c.seconds);
  st.counters["GBps"] = c.gbs;  // bytes read + written per second / 1e9
}
void bm_gemm(benchmark::State& st) {
  const sb::GemmCeiling& c = sb::gemm_ceiling(g_stream);
  for (auto _ : st) st.SetIterationTime(c.seconds);
  st.counters["TFLOPs"] = c.tflops;
}

/// `--floors_only`: prints the cost model of every case at the SPEC §9 H200 ceilings (4190 GB/s,
/// 779 TFLOP/s) without a device.
void print_floors(const std::vector<std::pair<std::string, Case>>& cases) {
  sb::CopyCeiling copy;
  copy.gbs = 4190;
  sb::GemmCeiling gemm;
  gemm.tflops = 779;
  std::printf("SPEC §9 floors at copy %.0f GB/s, GEMM %.0f TFLOP/s (us; bytes in MB, GFLOP)\n", copy.gbs, gemm.tflops);
  for (const auto& [name, c] : cases) {
    const layout::GeometryEntry* e = layout::find_geometry(kGeometryName);
    const auto rl = layout::make_rank_layout(e->geometry, layout::standard_layout(e->geometry, c.tp), 0);
    const auto cost = layer_costs(rl.layout, kHidden, c);
    double sum = 0;
    std::printf("%s\n", name.c_str());
    for (int i = 0; i < kStages; ++i) {
      const double f = sb::floor_seconds(cost[i].bytes, cost[i].flops, copy, gemm) * 1e6;
      sum += f;
      std::printf("  %-12s %10.1f MB %10.2f GFLOP  floor %9.1f us\n", kStageNames[i], cost[i].bytes / 1e6,
                  cost[i].flops / 1e9, f);
    }
    std::printf("  %-12s %49.1f us\n", "sum", sum);
  }
}

void print_table() {
  if (g_rows.empty()) return;
  std::printf("\nSPEC §9 floors: copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s\n",
              sb::copy_ceiling(g_stream).gbs, sb::gemm_ceiling(g_stream).tflops);
  std::printf("%-44s %10s %10s %6s |", "layer (us: achieved/floor)", "layer_us", "floor_us", "x");
  for (const char* n : kStageNames) std::printf(" %17s", n);
  std::printf("\n");
  for (const Row& r : g_rows) {
    std::printf("%-44s %10.1f %10.1f %6.2f |", r.name.c_str(), r.layer_us, r.floor_us, r.layer_us / r.floor_us);
    for (int i = 0; i < kStages; ++i) std::printf(" %8.1f/%-8.1f", r.us[i], r.floor[i]);
    std::printf("\n");
  }
  for (const Row& r : g_rows)
    if (r.name == std::string("layer/") + kGeometryName + "/tp:1/tokens:64/ctx:131072")
      std::printf("\ntarget (decode batch 64 at 128K, tp 1: layer <= 1.4x the sum of floors): %.2fx -> %s\n",
                  r.layer_us / r.floor_us, r.layer_us <= 1.4 * r.floor_us ? "MET" : "NOT MET");
}

}  // namespace

int main(int argc, char** argv) {
  bool list_only = false, floors_only = false;
  for (int i = 1; i < argc; ++i) {
    list_only |= std::strncmp(argv[i], "--benchmark_list_tests", 22) == 0;
    floors_only |= std::strcmp(argv[i], "--floors_only") == 0;
  }
  std::vector<std::pair<std::string, Case>> cases;
  benchmark::RegisterBenchmark("copy/d2d", bm_copy)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("cublas/bf16_gemm/8192", bm_gemm)
      ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  for (int tp : {1, 8}) {
    auto reg = [&](Case c, int iters) {
      const std::string name = std::string("layer/") + kGeometryName + "/tp:" + std::to_string(tp) +
                               "/tokens:" + std::to_string(c.tokens()) + "/ctx:" + std::to_string(c.ctx);
      cases.emplace_back(name, c);
      benchmark::RegisterBenchmark(name.c_str(), bm_layer, c, name)
          ->UseManualTime()->Iterations(iters)->Unit(benchmark::kMicrosecond);
    };
    for (int T : {8192, 32768}) reg(Case{tp, 1, T, 0}, T > 8192 ? 3 : 5);
    for (int ctx : {32768, 131072})
      for (int batch : {1, 16, 64}) reg(Case{tp, batch, 1, ctx}, 20);
  }
  if (floors_only) {
    print_floors(cases);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (!list_only) {
    if (!step5::bench::sm90_device_present()) return 0;
    STEP5_BENCH_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
