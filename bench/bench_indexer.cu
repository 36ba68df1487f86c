// Benchmark of the sparse indexer (step5/ops/indexer.hpp, SPEC §4.5–4.6):
//   copy/d2d                                   shared copy ceiling (bench_common.hpp: 1 GiB D2D, median,
//                                              bytes read + written / s)
//   cublas/bf16_gemm/8192                      shared GEMM ceiling (bench_common.hpp: cuBLAS bf16 8192^3,
//                                              random data, median)
//   indexer_decode/<geo>/tp:N/batch:B/ctx:C    indexer_select (scores + selection), one decode row
//                                              per request; GB/s over summary bytes read
//   indexer_prefill/<geo>/tp:N/tokens:T/ctx:H  indexer_select of a prefill chunk of T tokens after
//                                              H tokens of history; TFLOP/s of the score GEMM
//   cublaslt/e4m3_gemm/8192                    the e4m3 tensor-core rate: cuBLASLt FP8 (e4m3 x e4m3,
//                                              fp32 accumulate, bf16 out) 8192^3, random data, median
//   scores_prefill/...                         the score kernel alone (same shapes; counter `path`:
//                                              the ScorePath the plan took, 1 mma, 2 wgmma_f16, 3 wgmma_e4m3,
//                                              4 wgmma_f16_n256)
//   scores_prefill_path/<p>/tokens:T/ctx:H     the same with the path forced: p = mma, wgmma_f16 or
//                                              wgmma_e4m3 (e4m3 operands: ~14-bit accumulation, never
//                                              the automatic choice; measured for reference) at
//                                              16384 tokens after 32768; wgmma_f16_n256 (the wide
//                                              256-column tiles, the automatic choice where a CTA
//                                              sees long histories: score_wide_tiles_pay) at every
//                                              scores_prefill shape
//   scores_decode/tp:N/batch:B/ctx:C           the score kernel alone on decode rows
//   {indexer,scores}_decode/tp:N/batch:B/ctx:C/mixed   the same, request b at C · (b + 1) / B
//                                              (an engine's batch at mixed depths; GB/s over the
//                                              batch's own summary bytes)
//   {indexer,scores}_decode/tp:N/batch:B/ctx:C/q:2     an MTP step: 2 query tokens per request
//                                              (GB/s over one row's summary bytes per request)
//   {indexer,scores}_prefill/tokens:T/ctx:H/requests:R  the prefill chunk as R requests of T / R
//                                              tokens each after H tokens of history (an engine's
//                                              batch of several prompts' chunks)
//   read/summaries/batch:B/ctx:C               read ceiling of that traffic: every byte of the same
//                                              summary cache read once by a plain streaming kernel
//                                              (16-byte loads, 8 in flight per thread); GB/s read
//   topk/<v>/rows:R/regions:N                  selection alone: v = ours (the launcher's choice),
//                                              ours_cta (one CTA per row), ours_cluster (a cluster of
//                                              kTopkCluster CTAs per row), cub_segmented_sort (CUB
//                                              segmented radix sort of (score, id) + take-k); these
//                                              follow STEP5_TOPK (radix / candidates / unset: the
//                                              built-in choice); radix_cta, radix_cluster, cand_cta,
//                                              cand_cluster force the algorithm (TopkAlgo of
//                                              kernels/sm90/indexer_topk.cuh; the table printed last
//                                              names them ours_<v>)
//   topk/<v>/rows:R/ld:L                       prefill-shaped selection: R rows of stride L, row r has
//                                              n = r * L / R regions (R = 65536, L = 2048: the 16384
//                                              tokens x 4 groups of indexer_prefill/tokens:16384/ctx:0,
//                                              n = position / 8); v = ours (the launcher's choice),
//                                              <radix|cand>_cta<T> (one CTA of T = 128, 256 or
//                                              512 threads per row forced); GB/s over R * L * 4 bytes
//   topk/<v>/rows:R/ld:L/from:F                the same after a history: row r has n = F + r * (L - F)
//                                              / R regions (16384 / 6144 / 4096: the rows of one index
//                                              group of scores_prefill/tokens:16384/ctx:32768)
// STEP5_BENCH_SCORE_TILES_FORWARD=1: the scores_prefill rows run the wgmma grid's tiles first to
// last (ScorePlan::longest_first off; an A/B of the grid order in one binary).
// Timing: CUDA events around `iters` back-to-back launches queued behind a GPU spin (no host
// launch overhead timed), median of 5 repetitions, after untimed launches for bench_common.hpp
// warm_up's STEP5_BENCH_WARMUP_MS (default 200 ms); UseManualTime.
// A table with the ratios (to the copy bandwidth, to the tensor-core rate, to CUB) is printed last.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <functional>
#include <map>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "step5/kernels/sm90/indexer_launch.cuh"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/indexer.hpp"

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

#define CK(call) STEP5_BENCH_CUDA(call)  // bench_common.hpp: prints the call and exits
#define CKS(expr)                                                                                   \
  do {                                                                                              \
    const step5::Status s_ = (expr);                                                                \
    if (!s_.ok()) {                                                                                 \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_.to_string().c_str());               \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

cudaStream_t g_stream;
double g_copy_gbs = 0, g_tc_tflops = 0, g_e4m3_tflops = 0;
std::map<std::string, double> g_result;  // name -> main figure
std::map<std::string, double> g_us;      // name -> microseconds
std::vector<std::string> g_order;

/// Seconds per call of `fn` (median over 5 repetitions of `iters` calls), after bench_common.hpp's
/// warm_up.
double time_it(const std::function<void()>& fn, int iters) {
  const auto begin = std::chrono::steady_clock::now();
  auto once = [&] {
    fn();
    CK(cudaStreamSynchronize(g_stream));
    return std::string();
  };
  once();
  if (const std::string e = step5::bench::warm_up(begin, once); !e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());  // a bad STEP5_BENCH_WARMUP_MS: exit as CK does
    std::exit(1);
  }
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 5; ++rep) {
    step5::bench::gpu_sleep(g_stream, 100.0 + 50.0 * iters);  // launches queue up: no host overhead timed
    CK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < iters; ++i) fn();
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[2] / 1e3 / iters;
}

void record(benchmark::State& st, const std::string& name, double sec, double figure, const char* unit) {
  for (auto _ : st) st.SetIterationTime(sec);
  st.counters["figure"] = figure;  // unit: see the table
  st.SetLabel(unit);
  if (!g_result.count(name)) g_order.push_back(name);
  g_result[name] = figure;
  g_us[name] = sec * 1e6;
}

void bm_copy(benchmark::State& st) {
  // The shared ceilings (bench_common.hpp): median of 1 GiB D2D copies, bytes read + written / s.
  const step5::bench::CopyCeiling& c = step5::bench::copy_ceiling(g_stream);
  g_copy_gbs = c.gbs;
  record(st, "copy/d2d", c.seconds, g_copy_gbs, "GB/s");
}

void bm_cublas(benchmark::State& st) {
  // cuBLAS bf16 GEMM 8192^3 on random data, median (bench_common.hpp).
  const step5::bench::GemmCeiling& c = step5::bench::gemm_ceiling(g_stream);
  g_tc_tflops = c.tflops;
  record(st, "cublas/bf16_gemm/8192", c.seconds, g_tc_tflops, "TFLOP/s");
}

/// cuBLASLt e4m3 GEMM (D[bf16] = A^T B, 8192^3, fp32 accumulation), median of 7: the FP8
/// tensor-core ceiling the prefill score figure is compared with.
void bm_cublaslt_e4m3(benchmark::State& st) {
  const int n = 8192;
  std::uint8_t *a, *b;
  void *d, *ws;
  const std::size_t ws_bytes = 64u << 20;
  CK(cudaMalloc(&a, std::size_t(n) * n));
  CK(cudaMalloc(&b, std::size_t(n) * n));
  CK(cudaMalloc(&d, std::size_t(n) * n * 2));
  CK(cudaMalloc(&ws, ws_bytes));
  step5::bench::fill_e4m3(a, std::size_t(n) * n, 11, g_stream);
  step5::bench::fill_e4m3(b, std::size_t(n) * n, 12, g_stream);
  cublasLtHandle_t lt;
  STEP5_BENCH_CUBLAS(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t desc;
  STEP5_BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // FP8 needs the "TN" layout
  STEP5_BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  STEP5_BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtMatrixLayout_t la, lb, ld;
  STEP5_BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n));
  STEP5_BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n));
  STEP5_BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  STEP5_BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  STEP5_BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  STEP5_BENCH_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found));
  if (found == 0) {
    std::fprintf(stderr, "cuBLASLt: no e4m3 algorithm\n");
    std::exit(1);
  }
  const float one = 1.f, zero = 0.f;
  std::vector<double> secs;
  for (int rep = 0; rep < 7; ++rep)
    secs.push_back(time_it(
        [&] { STEP5_BENCH_CUBLAS(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, &res.algo, ws, ws_bytes, g_stream)); },
        3));
  std::sort(secs.begin(), secs.end());
  const double sec = secs[3];
  g_e4m3_tflops = 2.0 * n * n * n / sec / 1e12;
  record(st, "cublaslt/e4m3_gemm/8192", sec, g_e4m3_tflops, "TFLOP/s");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(d));
  CK(cudaFree(ws));
}

/// A batch of requests with random summary caches, ready for indexer_select.
struct SelectSetup {
  step5::layout::RankLayout rank{};
  step5::ops::IndexerSelectParams p{};
  std::vector<void*> allocs;
  std::vector<int> h_cu, h_seq;  // host mirrors of the batch metadata (validated by the launcher)
  double summary_bytes = 0, score_flops = 0;
  const std::uint8_t* summaries = nullptr;  ///< the whole summary cache (summaries_size bytes)
  std::size_t summaries_size = 0;
  template <class T>
  T* alloc(std::size_t n) {
    void* q;
    CK(cudaMalloc(&q, std::max<std::size_t>(n, 1) * sizeof(T)));
    allocs.push_back(q);
    return static_cast<T*>(q);
  }
  SelectSetup(int tp, std::vector<int> q_lens, std::vector<int> seq_lens, int topk, int max_seq) {
    const auto& e = step5::layout::kGeometries[0];
    rank = step5::layout::make_rank_layout(e.geometry, step5::layout::standard_layout(e.geometry, tp), 0).layout;
    const int B = static_cast<int>(q_lens.size()), P = rank.geometry.proxy_dim, Il = rank.index_local_heads;
    std::vector<int> cu(B + 1, 0);
    for (int b = 0; b < B; ++b) cu[b + 1] = cu[b] + q_lens[b];
    const int T = cu[B];
    const int bs = 64, max_blocks = (max_seq + bs - 1) / bs;
    std::vector<int> bt(static_cast<std::size_t>(B) * max_blocks);
    for (std::size_t i = 0; i < bt.size(); ++i) bt[i] = static_cast<int>(i);
    const std::size_t sum_bytes = bt.size() * (bs / kR) * P;
    auto* d_sum = alloc<std::uint8_t>(sum_bytes);
    summaries = d_sum;
    summaries_size = sum_bytes;
    auto* d_iq = alloc<std::uint8_t>(static_cast<std::size_t>(T) * Il * P);
    auto* d_w = alloc<float>(static_cast<std::size_t>(T) * Il);
    std::mt19937 rng(1);
    std::vector<std::uint8_t> h(std::min<std::size_t>(sum_bytes, 8u << 20));  // random pattern, tiled
    for (auto& x : h) x = static_cast<std::uint8_t>(rng() % 0x7e) | static_cast<std::uint8_t>((rng() & 1) << 7);
    for (std::size_t o = 0; o < sum_bytes; o += h.size())
      CK(cudaMemcpy(d_sum + o, h.data(), std::min(h.size(), sum_bytes - o), cudaMemcpyHostToDevice));
    h.resize(static_cast<std::size_t>(T) * Il * P);
    for (auto& x : h) x = static_cast<std::uint8_t>(rng() % 0x7e) | static_cast<std::uint8_t>((rng() & 1) << 7);
    CK(cudaMemcpy(d_iq, h.data(), h.size(), cudaMemcpyHostToDevice));
    std::vector<float> w(static_cast<std::size_t>(T) * Il);
    for (auto& x : w) x = static_cast<float>(rng() % 1000) / 1000.f - 0.3f;
    CK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    auto* d_cu = alloc<int>(B + 1);
    auto* d_seq = alloc<int>(B);
    auto* d_bt = alloc<int>(bt.size());
    CK(cudaMemcpy(d_cu, cu.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_seq, seq_lens.data(), B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    p.rank = rank;
    h_cu = cu;
    h_seq = seq_lens;
    p.batch = {d_cu, d_seq, B, T, h_cu.data(), h_seq.data()};
    p.table = {d_bt, max_blocks, bs, static_cast<int>(bt.size())};
    p.index_q = d_iq;
    p.weights = d_w;
    p.summary_cache = d_sum;
    p.topk = topk;
    p.max_seq_len = max_seq;
    p.topk_ids = alloc<int>(static_cast<std::size_t>(rank.local_kv_groups) * T * (topk + 1));
    p.counts = alloc<int>(static_cast<std::size_t>(rank.local_kv_groups) * T);
    // bounded score workspace: at most 1 GiB
    const std::size_t one = step5::ops::indexer_select_workspace_bytes(rank, 1, max_seq, B);
    const std::size_t per = one - step5::ops::indexer_select_workspace_bytes(rank, 1, 8, B) + 16;
    const int chunk = static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(T, (1ull << 30) / per)));
    p.workspace_bytes = step5::ops::indexer_select_workspace_bytes(rank, chunk, max_seq, B);
    p.workspace = alloc<char>(p.workspace_bytes);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < q_lens[b]; ++i) {
        const double n = static_cast<double>(step5::bench::history_regions(seq_lens[b] - q_lens[b] + i));
        score_flops += 2.0 * n * Il * P;
        if (i == q_lens[b] - 1) summary_bytes += n * P;
      }
  }
  ~SelectSetup() {
    for (void* q : allocs) cudaFree(q);
  }
};

/// "/ctx:C", "/ctx:C/mixed" for bench_common.hpp decode_lengths' mixed batch, then "/q:N" for
/// N > 1 query tokens per request (an MTP step).
std::string ctx_tag(int ctx, bool mixed, int q = 1) {
  return "/ctx:" + std::to_string(ctx) + (mixed ? "/mixed" : "") + (q > 1 ? "/q:" + std::to_string(q) : "");
}

void bm_decode(benchmark::State& st, int tp, int batch, int ctx, bool mixed = false, int q = 1) {
  SelectSetup s(tp, std::vector<int>(batch, q), step5::bench::decode_lengths(batch, ctx, mixed), 512, ctx);
  const double sec = time_it([&] { CKS(step5::ops::indexer_select(s.p, g_stream)); }, 20);
  const std::string name =
      "indexer_decode/step5_preview/tp:" + std::to_string(tp) + "/batch:" + std::to_string(batch) + ctx_tag(ctx, mixed, q);
  record(st, name, sec, s.summary_bytes / sec / 1e9, "GB/s");
}

/// Times the score kernel alone (no selection) for the setup's batch, launched as indexer_select
/// launches it (kAuto: ops::detail::auto_score_plan, a forced path: score_plan; launch_scores).
double time_scores_only(SelectSetup& s, step5::ops::detail::ScorePath want = step5::ops::detail::ScorePath::kAuto,
                        step5::ops::detail::ScorePath* taken = nullptr) {
  using namespace step5;
  constexpr auto kId = layout::GeometryId::step5_preview;
  const auto& p = s.p;
  const int Il = p.rank.index_local_heads, T = p.batch.num_tokens, B = p.batch.num_requests;
  const std::int64_t ld = ops::detail::score_ld(p.max_seq_len);
  const std::size_t fixed = ops::detail::plan_bytes(B);
  const ops::SelectChunks chunks = ops::indexer_select_chunks(p.rank, T, p.max_seq_len, B, p.workspace_bytes);
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CKS(device_sm_count(dev, &sms));
  ops::detail::ScorePlan sp =
      want == ops::detail::ScorePath::kAuto
          ? ops::detail::auto_score_plan<kId>(Il, T, B, ld, p.table.block_size, sms)  // indexer_select's plan
          : ops::detail::score_plan<kId>(Il, T, B, ld, p.table.block_size, sms, want);
  // A/B of the wgmma grid order in one binary (ScorePlan::longest_first)
  if (const char* e = std::getenv("STEP5_BENCH_SCORE_TILES_FORWARD"); e != nullptr && std::string(e) == "1")
    sp.longest_first = false;
  if (taken) *taken = sp.path;
  const std::int32_t* tile_start = nullptr;
  CKS(ops::detail::score_tile_starts(sp, p.batch.cu_seqlens_q, B, static_cast<std::int32_t*>(p.workspace), g_stream,
                                     &tile_start));
  return time_it(
      [&] {
        for (int k = 0; k < chunks.count; ++k) {
          float* scores = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + fixed);
          CKS(ops::detail::launch_scores<kId>(
              sp, ops::detail::score_args(p, tile_start, scores, ld, chunks.begin(k), chunks.begin(k + 1)), g_stream));
        }
      },
      3);
}

void bm_scores_decode(benchmark::State& st, int tp, int batch, int ctx, bool mixed = false, int q = 1) {
  SelectSetup s(tp, std::vector<int>(batch, q), step5::bench::decode_lengths(batch, ctx, mixed), 512, ctx);
  const double sec = time_scores_only(s);
  record(st, "scores_decode/tp:" + std::to_string(tp) + "/batch:" + std::to_string(batch) + ctx_tag(ctx, mixed, q), sec,
         s.summary_bytes / sec / 1e9, "GB/s");
}

/// Read ceiling of the decode score kernel's traffic: every byte of the summary cache read once
/// with 16-byte loads (8 in flight per thread, 4 CTAs of 256 threads per SM), XOR-folded.
__global__ void __launch_bounds__(256) read_ceiling_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldg(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; practically never stores
}

void bm_read_ceiling(benchmark::State& st, int batch, int ctx) {
  SelectSetup s(1, std::vector<int>(batch, 1), std::vector<int>(batch, ctx), 512, ctx);
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CKS(step5::device_sm_count(dev, &sms));
  unsigned* sink = s.alloc<unsigned>(1);
  const std::size_t n = s.summaries_size / 16;
  const double sec = time_it(
      [&] {
        read_ceiling_kernel<<<4 * sms, 256, 0, g_stream>>>(reinterpret_cast<const uint4*>(s.summaries), n, sink);
      },
      3);
  CK(cudaGetLastError());
  record(st, "read/summaries/batch:" + std::to_string(batch) + "/ctx:" + std::to_string(ctx), sec,
         static_cast<double>(s.summaries_size) / sec / 1e9, "GB/s");
}

/// A prefill chunk of `tokens` query tokens after `hist` tokens of history, as one request or
/// (requests > 1, "/requests:R") as R requests of tokens / R each, as an engine batches several
/// prompts' chunks (score tiles of several requests: the decode guess of a tile's request misses).
void bm_prefill(benchmark::State& st, int tp, int tokens, int hist, bool scores_only, int requests = 1) {
  const int q = tokens / requests;
  SelectSetup s(tp, std::vector<int>(requests, q), std::vector<int>(requests, hist + q), 512, hist + q);
  step5::ops::detail::ScorePath taken = step5::ops::detail::ScorePath::kAuto;
  const double sec = scores_only ? time_scores_only(s, step5::ops::detail::ScorePath::kAuto, &taken)
                                 : time_it([&] { CKS(step5::ops::indexer_select(s.p, g_stream)); }, 3);
  const std::string name = std::string(scores_only ? "scores_prefill" : "indexer_prefill") +
                           "/step5_preview/tp:" + std::to_string(tp) + "/tokens:" + std::to_string(tokens) +
                           "/ctx:" + std::to_string(hist) + (requests > 1 ? "/requests:" + std::to_string(requests) : "");
  record(st, name, sec, s.score_flops / sec / 1e12, "TFLOP/s");
  if (scores_only) st.counters["path"] = static_cast<double>(static_cast<int>(taken));
}

/// The score kernel alone on a prefill chunk with the path forced (scores_prefill_path/...).
void bm_prefill_path(benchmark::State& st, int tp, int tokens, int hist, step5::ops::detail::ScorePath want) {
  SelectSetup s(tp, {tokens}, {hist + tokens}, 512, hist + tokens);
  step5::ops::detail::ScorePath taken = want;
  const double sec = time_scores_only(s, want, &taken);
  const std::string name = std::string("scores_prefill_path/") + step5::ops::detail::score_path_name(want) +
                           "/step5_preview/tp:" + std::to_string(tp) + "/tokens:" + std::to_string(tokens) +
                           "/ctx:" + std::to_string(hist);
  if (taken != want) std::printf("%s: the plan fell back to path %s\n", name.c_str(), step5::ops::detail::score_path_name(taken));
  record(st, name, sec, s.score_flops / sec / 1e12, "TFLOP/s");
  st.counters["path"] = static_cast<double>(static_cast<int>(taken));
}

/// variant: -1 = CUB segmented sort + take-k, 0 = step5::ops::topk_select (its own choice),
/// 1 = one CTA per row, kTopkCluster = a cluster per row (kernels::sm90::launch_topk forced);
/// algo: the selection algorithm (kDefault: STEP5_TOPK or the built-in choice).
/// threads: CTA size forced on one CTA per row (0: the launcher's choice). ramp: row r has
/// n = from + r * (regions - from) / rows (prefill shape; from > 0: a chunk after a history of
/// 8 * from tokens; the name then reads /ld:regions[/from:F]).
void bm_topk(benchmark::State& st, int rows, int regions, int variant,
             step5::kernels::sm90::TopkAlgo algo = step5::kernels::sm90::TopkAlgo::kDefault, int threads = 0,
             bool ramp = false, int from = 0) {
  const bool cub_baseline = variant < 0;
  const std::size_t n = static_cast<std::size_t>(rows) * regions;
  float* d_s;
  CK(cudaMalloc(&d_s, n * 4));
  // the same scores for the same size (seed 3), drawn once: the prefill-shaped cases run one size
  // several times and draw up to 134M normals
  static std::vector<float> h;
  if (h.size() != n) {
    h.assign(n, 0.f);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : h) x = nd(rng);
  }
  CK(cudaMemcpy(d_s, h.data(), n * 4, cudaMemcpyHostToDevice));
  const int topk = 512;
  int *d_ids, *d_cnt, *d_hist;
  CK(cudaMalloc(&d_ids, static_cast<std::size_t>(rows) * (topk + 1) * 4));
  CK(cudaMalloc(&d_cnt, rows * 4));
  CK(cudaMalloc(&d_hist, rows * 4));
  std::vector<int> hh(rows, regions);
  if (ramp)
    for (int r = 0; r < rows; ++r) hh[r] = from + static_cast<int>(static_cast<long long>(r) * (regions - from) / rows);
  CK(cudaMemcpy(d_hist, hh.data(), rows * 4, cudaMemcpyHostToDevice));
  double sec = 0;
  if (!cub_baseline) {
    step5::ops::TopkSelectParams p;
    p.scores = d_s;
    p.ld = regions;
    p.history = d_hist;
    p.rows = rows;
    p.topk = topk;
    p.ids = d_ids;
    p.ld_ids = topk + 1;
    p.counts = d_cnt;
    if (variant == 0) sec = time_it([&] { CKS(step5::ops::topk_select(p, g_stream)); }, 20);
    else
      sec = time_it(
          [&] {
            CKS(step5::kernels::sm90::launch_topk(step5::ops::detail::topk_args(p), rows, g_stream, variant, algo, -1,
                                                  threads));
          },
          20);
  } else {
    // CUB segmented radix sort (descending) of (score, id) pairs per row, then take the first k
    float* d_ks;
    int *d_v, *d_vs, *d_off;
    CK(cudaMalloc(&d_ks, n * 4));
    CK(cudaMalloc(&d_v, n * 4));
    CK(cudaMalloc(&d_vs, n * 4));
    CK(cudaMalloc(&d_off, (rows + 1) * 4));
    std::vector<int> ids(n), off(rows + 1);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<int>(i % regions);
    for (int r = 0; r <= rows; ++r) off[r] = r * regions;
    CK(cudaMemcpy(d_v, ids.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_off, off.data(), (rows + 1) * 4, cudaMemcpyHostToDevice));
    std::size_t tmp_bytes = 0;
    cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, tmp_bytes, d_s, d_ks, d_v, d_vs, static_cast<int>(n),
                                                       rows, d_off, d_off + 1, 0, 32, g_stream);
    void* d_tmp;
    CK(cudaMalloc(&d_tmp, tmp_bytes));
    sec = time_it(
        [&] {
          cub::DeviceSegmentedRadixSort::SortPairsDescending(d_tmp, tmp_bytes, d_s, d_ks, d_v, d_vs, static_cast<int>(n),
                                                             rows, d_off, d_off + 1, 0, 32, g_stream);
          CK(cudaMemcpy2DAsync(d_ids, (topk + 1) * 4, d_vs, static_cast<std::size_t>(regions) * 4, topk * 4, rows,
                               cudaMemcpyDeviceToDevice, g_stream));
        },
        20);
    CK(cudaFree(d_ks));
    CK(cudaFree(d_v));
    CK(cudaFree(d_vs));
    CK(cudaFree(d_off));
    CK(cudaFree(d_tmp));
  }
  using step5::kernels::sm90::TopkAlgo;
  const std::string forced = algo == TopkAlgo::kRadix ? "_radix" : algo == TopkAlgo::kCandidates ? "_cand" : "";
  const std::string cta = threads != 0 ? "_cta" + std::to_string(threads) : "_cta";
  const std::string name = std::string(cub_baseline ? "topk/cub_segmented_sort"
                                       : variant == 0 ? "topk/ours"
                                       : variant == 1 ? "topk/ours" + forced + cta
                                                      : "topk/ours" + forced + "_cluster") +
                           "/rows:" + std::to_string(rows) + (ramp ? "/ld:" : "/regions:") + std::to_string(regions) +
                           (from > 0 ? "/from:" + std::to_string(from) : "");
  record(st, name, sec, n * 4.0 / sec / 1e9, "GB/s");
  CK(cudaFree(d_s));
  CK(cudaFree(d_ids));
  CK(cudaFree(d_cnt));
  CK(cudaFree(d_hist));
}

/// "x% of <ceiling>", or "<ceiling> not measured in this run" where a --benchmark_filter left its
/// row out (no ratio to a ceiling of 0).
std::string share_of(double figure, double ceiling, const char* name) {
  char buf[128];
  if (ceiling > 0)
    std::snprintf(buf, sizeof buf, "%.1f%% of %s", 100.0 * figure / ceiling, name);
  else
    std::snprintf(buf, sizeof buf, "%s not measured in this run", name);
  return buf;
}

void print_table() {
  std::printf("\n%-62s %12s %12s %s\n", "benchmark", "us", "figure", "ratio");
  for (const auto& n : g_order) {
    std::string ratio;
    char buf[128];
    if (n.rfind("indexer_decode", 0) == 0 || n.rfind("scores_decode", 0) == 0) {
      ratio = share_of(g_result[n], g_copy_gbs, "copy BW");
      // scores_decode/tp:N/batch:B/ctx:C against read/summaries/batch:B/ctx:C (same bytes)
      const std::size_t bpos = n.find("/batch:");
      const std::string read = n.rfind("scores_decode", 0) == 0 && bpos != std::string::npos
                                   ? "read/summaries" + n.substr(bpos)
                                   : std::string();
      if (!read.empty() && g_result.count(read)) {
        std::snprintf(buf, sizeof buf, ", %.2f of the read ceiling", g_result[n] / g_result[read]);
        ratio += buf;
      }
    } else if (n.rfind("indexer_prefill", 0) == 0 || n.rfind("scores_prefill", 0) == 0) {
      ratio = share_of(g_result[n], g_e4m3_tflops, "cuBLASLt e4m3 rate") + ", " +
              share_of(g_result[n], g_tc_tflops, "cuBLAS bf16 rate");
    } else if (n.rfind("topk/ours", 0) == 0) {
      const std::string base = "topk/cub_segmented_sort" + n.substr(n.find("/rows:"));
      if (g_us.count(base)) {
        std::snprintf(buf, sizeof buf, "%.1fx faster than CUB sort", g_us[base] / g_us[n]);
        ratio = buf;
      }
    }
    std::printf("%-62s %12.2f %12.1f %s\n", n.c_str(), g_us[n], g_result[n], ratio.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!step5::bench::sm90_device_present()) return 0;
  CK(cudaStreamCreate(&g_stream));
  auto reg = [](const std::string& name, std::function<void(benchmark::State&)> f) {
    benchmark::RegisterBenchmark(name.c_str(), [f](benchmark::State& st) { f(st); })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  };
  reg("copy/d2d", bm_copy);
  reg("cublas/bf16_gemm/8192", bm_cublas);
  reg("cublaslt/e4m3_gemm/8192", bm_cublaslt_e4m3);
  for (int tp : {1, 8})
    for (int batch : {1, 16, 64, 128})
      for (int ctx : {8192, 32768, 131072, 1 << 20}) {
        if (static_cast<double>(batch) * ctx > 8.0 * (1 << 20)) continue;  // > 256 MiB of summaries
        reg("indexer_decode/tp:" + std::to_string(tp) + "/batch:" + std::to_string(batch) + "/ctx:" + std::to_string(ctx),
            [=](benchmark::State& st) { bm_decode(st, tp, batch, ctx); });
      }
  for (int tokens : {4096, 16384})
    for (int hist : {0, 32768}) {
      reg("indexer_prefill/tokens:" + std::to_string(tokens) + "/ctx:" + std::to_string(hist),
          [=](benchmark::State& st) { bm_prefill(st, 1, tokens, hist, false); });
      reg("scores_prefill/tokens:" + std::to_string(tokens) + "/ctx:" + std::to_string(hist),
          [=](benchmark::State& st) { bm_prefill(st, 1, tokens, hist, true); });
    }
  for (int requests : {4, 16}) {
    const std::string tail = "/tokens:4096/ctx:32768/requests:" + std::to_string(requests);
    reg("indexer_prefill" + tail, [=](benchmark::State& st) { bm_prefill(st, 1, 4096, 32768, false, requests); });
    reg("scores_prefill" + tail, [=](benchmark::State& st) { bm_prefill(st, 1, 4096, 32768, true, requests); });
  }
  for (auto path : {step5::ops::detail::ScorePath::kMma, step5::ops::detail::ScorePath::kWgmmaF16,
                    step5::ops::detail::ScorePath::kWgmmaE4m3})
    reg(std::string("scores_prefill_path/") + step5::ops::detail::score_path_name(path) + "/tokens:16384/ctx:32768",
        [=](benchmark::State& st) { bm_prefill_path(st, 1, 16384, 32768, path); });
  for (int tokens : {4096, 16384})
    for (int hist : {0, 32768})
      reg("scores_prefill_path/wgmma_f16_n256/tokens:" + std::to_string(tokens) + "/ctx:" + std::to_string(hist),
          [=](benchmark::State& st) {
            bm_prefill_path(st, 1, tokens, hist, step5::ops::detail::ScorePath::kWgmmaF16N256);
          });
  for (int tp : {1, 8})
    for (int batch : {16, 64})
      reg("scores_decode/tp:" + std::to_string(tp) + "/batch:" + std::to_string(batch) + "/ctx:131072",
          [=](benchmark::State& st) { bm_scores_decode(st, tp, batch, 131072); });
  // a batch at mixed depths (bench_common.hpp decode_lengths: the score grid is planned for the
  // longest request), and an MTP step of 2 query tokens per request (score tiles of 2 tokens)
  for (int tp : {1, 8})
    for (int batch : {16, 64})
      for (const std::pair<bool, int> shape : {std::pair{true, 1}, std::pair{false, 2}}) {
        const bool mixed = shape.first;
        const int q = shape.second;
        const std::string tail =
            "/tp:" + std::to_string(tp) + "/batch:" + std::to_string(batch) + ctx_tag(131072, mixed, q);
        reg("indexer_decode" + tail, [=](benchmark::State& st) { bm_decode(st, tp, batch, 131072, mixed, q); });
        reg("scores_decode" + tail, [=](benchmark::State& st) { bm_scores_decode(st, tp, batch, 131072, mixed, q); });
      }
  for (int batch : {16, 64})
    reg("read/summaries/batch:" + std::to_string(batch) + "/ctx:131072",
        [=](benchmark::State& st) { bm_read_ceiling(st, batch, 131072); });
  const int kC = step5::kernels::sm90::kTopkCluster;
  // 256 rows: decode batch 64 at tp 1 (two 512-thread CTAs per SM, one wave); 128: one CTA per SM
  for (int rows : {16, 64, 128, 256, 512}) {
    reg("topk/cub/rows:" + std::to_string(rows), [=](benchmark::State& st) { bm_topk(st, rows, 16384, -1); });
    for (int v : {0, 1, kC})
      reg("topk/" + std::to_string(v) + "/rows:" + std::to_string(rows),
          [=](benchmark::State& st) { bm_topk(st, rows, 16384, v); });
  }
  reg("topk/cub/rows:64/131072", [](benchmark::State& st) { bm_topk(st, 64, 131072, -1); });
  for (int v : {0, 1, kC})
    reg("topk/" + std::to_string(v) + "/rows:64/131072", [=](benchmark::State& st) { bm_topk(st, 64, 131072, v); });
  // the two algorithms forced, for A/B in one run: topk/<radix|cand>_<cta|cluster>/rows:R[/131072]
  using step5::kernels::sm90::TopkAlgo;
  for (TopkAlgo algo : {TopkAlgo::kRadix, TopkAlgo::kCandidates})
    for (int v : {1, kC}) {
      const std::string tag = std::string(algo == TopkAlgo::kRadix ? "radix" : "cand") + (v == 1 ? "_cta" : "_cluster");
      for (int rows : {1, 16, 64, 128, 256, 512})
        reg("topk/" + tag + "/rows:" + std::to_string(rows),
            [=](benchmark::State& st) { bm_topk(st, rows, 16384, v, algo); });
      reg("topk/" + tag + "/rows:64/131072", [=](benchmark::State& st) { bm_topk(st, 64, 131072, v, algo); });
    }
  // full 16384-key rows on one CTA of a forced smaller size (more CTAs per SM: registers and
  // shared memory allowing): topk/<radix|cand>_cta<T>/rows:R/full, against topk/<..>_cta/rows:R (512)
  for (TopkAlgo algo : {TopkAlgo::kRadix, TopkAlgo::kCandidates})
    for (int threads : {step5::kernels::sm90::kTopkShortThreads, step5::kernels::sm90::kTopkMidThreads})
      for (int rows : {64, 256})
        reg(std::string("topk/") + (algo == TopkAlgo::kRadix ? "radix" : "cand") + "_cta" + std::to_string(threads) +
                "/rows:" + std::to_string(rows) + "/full",
            [=](benchmark::State& st) { bm_topk(st, rows, 16384, 1, algo, threads); });
  // prefill-shaped rows (issue 15), the threads per row forced, for the short-row crossover in one
  // run: topk/ours/rows:R/ld:L (the launcher's choice) and topk/<radix|cand>_cta<T>/rows:R/ld:L
  // (T = 32: one warp per row, radix only). 32768 rows of ld 1024: bench_layer's tp 1 8K prefill
  // (8192 tokens, four index groups).
  // The last shape is the selection of scores_prefill/tokens:16384/ctx:32768 for one index group
  // (positions 32768 .. 49151: n = 4096 .. 6143 regions), so that the top-k share of
  // indexer_prefill after a history is measured apart from its scores.
  struct TopkShape {
    int rows, ld, from;
  };
  // Full rows of 2047-2048 keys on 16 to 8192 rows (a decode step at a 16K context, up to a short
  // prefill): where the warp rows start to pay (kTopkWarpMinRowsPerSm); and 16384 rows of 1024 to
  // 2048 keys (an 8K chunk after 8K of history, one index group: rows that all need a selection).
  for (const TopkShape& sh : {TopkShape{32768, 1024, 0}, {65536, 2048, 0}, {16384, 4096, 0}, {4096, 8192, 0}, {16384, 6144, 4096},
                              {16, 2048, 2047}, {128, 2048, 2047}, {512, 2048, 2047}, {1024, 2048, 2047}, {4096, 2048, 2047},
                              {8192, 2048, 2047}, {16384, 2048, 1024}}) {
    const int rows = sh.rows, ld = sh.ld, from = sh.from;
    const std::string shape = "/rows:" + std::to_string(rows) + "/ld:" + std::to_string(ld) +
                              (from > 0 ? "/from:" + std::to_string(from) : "");
    reg("topk/ours" + shape, [=](benchmark::State& st) { bm_topk(st, rows, ld, 0, TopkAlgo::kDefault, 0, true, from); });
    for (TopkAlgo algo : {TopkAlgo::kCandidates, TopkAlgo::kRadix})
      for (int threads : step5::kernels::sm90::kTopkCtaSizes) {
        if (algo == TopkAlgo::kCandidates && threads == step5::kernels::sm90::kTopkWarpThreads) continue;  // radix only
        reg(std::string("topk/") + (algo == TopkAlgo::kRadix ? "radix" : "cand") + "_cta" + std::to_string(threads) + shape,
            [=](benchmark::State& st) { bm_topk(st, rows, ld, 1, algo, threads, true, from); });
      }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
