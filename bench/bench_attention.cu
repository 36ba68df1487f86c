// Benchmark of the sparse GQA attention + gate (step5/ops/attention.hpp, SPEC §4 steps 7–8):
//   copy/d2d                                              shared copy ceiling (bench_common.hpp: 1 GiB D2D,
//                                                         median, read + write bytes / s)
//   attention/decode/<geometry>/tp:N/batch:B/ctx:C        1 query row per request, full selections (topk 512)
//   attention/prefill/<geometry>/tp:N/chunk:T/hist:H      one request, T new rows after H cached tokens
// Counters: gathered K/V bytes per second (decode: what the selection reads, (count-1)*8 + partial
// tokens × 2·D·2 bytes per (request, group)) and its ratio to the copy bandwidth; effective
// TFLOP/s = 4·hpg_q·D·(tokens attended) per (query, group) / time.
// Selections are generated on the device: (request, group, query) gets min(topk, p/8) history
// regions spread evenly over [0, p/8) with an offset that changes every 32 positions (so
// neighbouring queries of a prefill tile mostly share regions, as real selections do), plus the
// current region. The L2 is flushed (128 MiB memset) before every timed launch. UseManualTime with
// CUDA events. A table is printed last.
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/attention.hpp"

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

#define CK(call) STEP5_BENCH_CUDA(call)  // bench_common.hpp: prints the call and exits

cudaStream_t g_stream;
double g_copy_gbs = 0;
void* g_flush = nullptr;
constexpr std::size_t kFlush = 128u << 20;

struct Row {
  double us = 0, gbs = 0, tflops = 0, ratio = 0;
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
__global__ void iota_table(int* table, int B, int max_blocks, int num_blocks) {
  const std::size_t n = static_cast<std::size_t>(B) * max_blocks;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    table[i] = static_cast<int>((i * 7 + 3) % num_blocks);  // non-contiguous, wraps when memory is capped
}

void BM_copy(benchmark::State& state) {
  // The shared ceiling (bench_common.hpp): median of 1 GiB D2D copies, bytes read + written / s.
  const step5::bench::CopyCeiling& c = step5::bench::copy_ceiling(g_stream);
  for (auto _ : state) state.SetIterationTime(c.seconds);
  g_copy_gbs = c.gbs;
  state.counters["GB/s"] = g_copy_gbs;
}

template <class Tag>
void run_attention(benchmark::State& state, const std::string& name, int B, int q_len, int seq_len, bool decode) {
  using L = typename Tag::Layout;
  constexpr int D = Tag::kGeometry.head_dim, Hl = L::kLocalHeads, lg = L::kLocalKvGroups, hpg = L::kHpgQ;
  const int topk = 512, bs = 64;
  const int T = B * q_len;
  const int max_blocks = (seq_len + bs - 1) / bs;
  const std::size_t per_block = static_cast<std::size_t>(bs) * lg * D;
  std::size_t want = static_cast<std::size_t>(B) * max_blocks;
  const std::size_t cap = (8ull << 30) / (per_block * 2 * 2);  // K + V <= 16 GiB
  const int num_blocks = static_cast<int>(std::min(want, cap));
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
  step5::bench::fill_bf16(k, per_block * num_blocks, 1, -1.f, 1.f, g_stream);
  step5::bench::fill_bf16(v, per_block * num_blocks, 2, -1.f, 1.f, g_stream);
  step5::bench::fill_bf16(q, static_cast<std::size_t>(T) * Hl * D, 3, -2.f, 2.f, g_stream);
  step5::bench::fill_bf16(gate, static_cast<std::size_t>(T) * Hl, 4, -4.f, 4.f, g_stream);
  iota_table<<<256, 256, 0, g_stream>>>(table, B, max_blocks, num_blocks);
  make_selection<<<lg * T, 128, 0, g_stream>>>(ids, counts, lg, T, topk, q_len, seq_len);
  std::vector<int> h_cu(B + 1), h_seq(B, seq_len);
  for (int b = 0; b <= B; ++b) h_cu[b] = b * q_len;
  CK(cudaMemcpy(cu, h_cu.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(seq, h_seq.data(), B * 4, cudaMemcpyHostToDevice));
  // tokens attended
  double tokens = 0;
  for (int t = 0; t < T; ++t) tokens += step5::bench::attended_tokens(seq_len - q_len + t % q_len, topk);
  tokens *= lg;
  const double flops = 4.0 * hpg * D * tokens;
  const double bytes = tokens * D * 2 * 2;  // gathered K and V (decode: each (query, group) its own)
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
  std::size_t ws_bytes = 0;
  step5::Status st = step5::ops::sparse_attention_workspace_size(p, &ws_bytes);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  void* ws = nullptr;
  if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
  if (ws_bytes) CK(cudaMemset(ws, 0, ws_bytes));  // split-KV counters: zero once before first use
  const step5::Status launched = step5::ops::sparse_attention<Tag::kId>(p, ws, ws_bytes, g_stream);
  if (!launched.ok()) {
    state.SkipWithError(launched.to_string().c_str());
    return;
  }
  CK(cudaStreamSynchronize(g_stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double total = 0;
  int n = 0;
  for (auto _ : state) {
    CK(cudaMemsetAsync(g_flush, n & 0xff, kFlush, g_stream));
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
  if (!g_rows.count(name)) g_order.push_back(name);
  g_rows[name] = r;
  (void)decode;
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  cudaFree(ws);
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
}

/// Registers the benchmarks of one (list row, tp). The geometry comes from geometries.def via
/// its id; the tp must be one the row lists (checked at compile time).
template <step5::layout::GeometryId Id, int Tp>
void register_layout() {
  static_assert(step5::layout::lists_tp(step5::layout::entry_of(Id), Tp),
                "bench_attention: this tp is not listed for the geometry in geometries.def");
  using Tag = step5::layout::LayoutTag<Id, Tp>;
  const std::string geo = std::string(Tag::kEntry.name) + "/tp:" + std::to_string(Tp);
  for (int batch : {1, 8, 32, 64, 128}) {
    const std::string name = "attention/decode/" + geo + "/batch:" + std::to_string(batch) + "/ctx:131072";
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
      run_attention<Tag>(s, name, batch, 1, 131072, true);
    })->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
  }
  for (int chunk : {4096, 16384})
    for (int hist : {32768, 131072}) {
      const std::string name =
          "attention/prefill/" + geo + "/chunk:" + std::to_string(chunk) + "/hist:" + std::to_string(hist);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
        run_attention<Tag>(s, name, 1, chunk, hist + chunk, false);
      })->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  if (!step5::bench::sm90_device_present()) return 0;
  CK(cudaStreamCreate(&g_stream));
  CK(cudaMalloc(&g_flush, kFlush));
  benchmark::RegisterBenchmark("copy/d2d", BM_copy)->UseManualTime()->Iterations(10)->Unit(benchmark::kMicrosecond);
  // Benchmarked (list row, tp) pairs: the named Step-5 Preview row at tp 1/8/16 and the other
  // row at tp 1; each tp is checked against the row's list in register_layout.
  using step5::layout::GeometryId;
  register_layout<GeometryId::step5_preview, 1>();
  register_layout<GeometryId::step5_preview, 8>();
  register_layout<GeometryId::step5_preview, 16>();
  register_layout<GeometryId::dsa_h64_kv8_d128, 1>();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\ncopy bandwidth %.0f GB/s\n%-66s %10s %10s %8s %10s\n", g_copy_gbs, "benchmark", "us", "GB/s", "of copy",
              "TFLOP/s");
  for (const auto& name : g_order) {
    const Row& r = g_rows[name];
    std::printf("%-66s %10.1f %10.0f %8.2f %10.1f\n", name.c_str(), r.us, r.gbs, r.ratio, r.tflops);
  }
  return 0;
}
