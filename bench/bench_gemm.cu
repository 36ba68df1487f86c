// Benchmark of the fused projection GEMM (step5/ops/gemm.hpp, SPEC §3/§4.1):
//   gemm/<geometry>/tp:N/tokens:T      this library's kernels (kAuto with allow_cublaslt = false)
//   gemm_auto/<geometry>/tp:N/tokens:T what gemm_bf16's kAuto runs (its cuBLASLt path where it has
//                                      an algorithm: the library's workspace limit and alignments)
//   cublaslt/<geometry>/tp:N/tokens:T  cuBLASLt on the identical fused shape (64 MiB workspace)
//   unfused/<geometry>/tp:N/tokens:T   separate cuBLASLt GEMMs: qkv, indexer (q|k|z), gate, sparse_indexer_w
//   copy/d2d                           the shared copy ceiling of bench_common.hpp (1 GiB D2D, median,
//                                      bytes read + written / s)
//   gemm_stream/..., gemm_wgmma<kind>/... a path / wgmma tile kind forced (crossover checks; the
//                                      kinds at T >= 64, 128 also at T = 32; <kind> =
//                                      gemm_wgmma_tile_name: 128, 256, 152, m64n256, m64n128, ...);
//   gemm_wgmma_sk<S>/...               the wgmma path with S K splits forced (T = 64..256), to
//                                      re-fit the launcher's split cost model
//   gemm_gemv/...                      the forced kGemv path where it runs (gemm_gemv_eligible: T <=
//                                      kGemmGemvMaxTokens; config 0: T = 1 the CUDA-core kernel, T >= 2
//                                      the tensor-core one with X whole), which kAuto takes at T = 1
//                                      on weights of 4 MiB and more, K 512 ... 12288, at T = 2 ... 8
//                                      on weights of 22 MiB and more, K 4096, outside 4096 < N < 8192,
//                                      and at T = 9 ... 16 on 128 MiB and more, K 4096
//                                      (gemm_auto_takes_gemv); kAuto's kernel is gemm_auto_gemv_config's,
//                                      X whole (this row) or in windows (the gemm_gemv_win/ row: at
//                                      T = 9 ... 16 always); the config / split_k knobs skip it
//   gemm_gemv_mma/... (T <= 4)         the kGemv path's tensor-core kernel forced (config
//                                      kGemmGemvTensorCores): at T = 1 against gemm_gemv/'s CUDA-core
//                                      kernel (at T = 2..4 the same kernel as gemm_gemv/; kept: the
//                                      rows' names predate config 0's change)
//   gemm_gemv_cuda/... (T = 2..4)      the CUDA-core kernel forced (config kGemmGemvCudaCores),
//                                      against gemm_gemv/'s tensor-core kernel
//   gemm_gemv_win/... (T = 4..16)      the tensor-core kernel with X in windows of 1024 values forced
//                                      (config kGemmGemvTensorCoresWindowed), against gemm_gemv/'s X
//                                      whole (the same where K <= 1024)
//   <family>/o_proj/<geometry>/tp:N/tokens:T  the rank's o_proj (N = hidden, K = local heads x
//                                      head_dim) at decode T = 1, 4, 8, 16: cublaslt/, gemm/,
//                                      gemm_auto/, gemm_gemv/, gemm_gemv_mma/, gemm_gemv_cuda/,
//                                      gemm_gemv_win/ only
//   tp 2, 4, 16 (both geometries)      the fused and o_proj shapes at T = 1, 4, 8 only, the same
//                                      families (kAuto's kGemv rules cover them); tp 1 and 8 have every T
// The label and the table's path column: "wgmma <kind>[, split-K <S>]", "stream[, split-K <S>]",
// "gemv[ mma[ windows]]" or "cublaslt" (plan_label).
// Env knobs (A/B without a rebuild; names unchanged, the label shows the plan): STEP5_BENCH_GEMM_CONFIG,
// STEP5_BENCH_GEMM_SPLIT_K override a `gemm*` case's config / split_k where the case leaves it 0.
// Each cublaslt/ case prints once per shape a line "cublaslt_algo <shape>: algo_id ... tile_id ..."
// (the heuristic's algorithm configuration) to stdout; each gemm_auto/ case that runs cuBLASLt
// prints the library's plan the same way, "cublaslt_algo_auto <shape>: ..." (its preferences:
// alignments, workspace limit, reduction schemes).
// Timing: CUDA events around a CUDA graph of `batch` launches that rotate over several copies
// of W (together > 4× L2), so the weights come from HBM, after untimed replays for
// bench_common.hpp warm_up's STEP5_BENCH_WARMUP_MS (default 200 ms); UseManualTime. A table is printed last.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "step5/core/numeric.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/gemm.hpp"
#include "step5/kernels/sm90/gemm_cublaslt.cuh"  // gemm_detail::lt_entry: the cuBLASLt plan kAuto runs

namespace {

#define CK(call) STEP5_BENCH_CUDA(call)  // bench_common.hpp: prints the call and exits
#define CKB(call) STEP5_BENCH_CUBLAS(call)

cudaStream_t g_stream;
cublasLtHandle_t g_lt;
void* g_lt_ws = nullptr;
constexpr std::size_t kLtWs = 64 << 20;
double g_copy_gbs = 0;  // bytes read + written per second / 1e9

struct Row {
  double ours_us = 0, lt_us = 0, unf_us = 0;
  double weight_bytes = 0, flops = 0;
  std::string path;
};
std::map<std::string, Row> g_rows;
std::vector<std::string> g_order;

/// Times `batch` launches captured into a graph; returns seconds per launch for one replay.
struct GraphTimer {
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t e0, e1;
  int batch = 1;
  GraphTimer(int b, const std::function<void(int)>& launch) : batch(b) {
    const auto first_launch = std::chrono::steady_clock::now();
    launch(0);  // warm-up outside capture (lazy init, smem attributes, cuBLASLt heuristics)
    CK(cudaStreamSynchronize(g_stream));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < batch; ++i) launch(i);
    CK(cudaStreamEndCapture(g_stream, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    // replays as they are timed for bench_common.hpp warm_up's time
    const std::string warm = step5::bench::warm_up(first_launch, [&] {
      CK(cudaGraphLaunch(exec, g_stream));
      CK(cudaStreamSynchronize(g_stream));
      return std::string();
    });
    if (!warm.empty()) {
      std::fprintf(stderr, "%s\n", warm.c_str());  // a bad STEP5_BENCH_WARMUP_MS: exit as CK does
      std::exit(1);
    }
  }
  ~GraphTimer() {
    cudaGraphExecDestroy(exec);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  /// Runs every benchmark iteration (manual time = one launch) and returns the mean µs.
  double measure(benchmark::State& st) {
    double sum = 0;
    long n = 0;
    for (auto _ : st) {
      const double t = run();
      sum += t;
      ++n;
      st.SetIterationTime(t);
    }
    return n > 0 ? sum / n * 1e6 : 0.0;
  }
  double run() {
    CK(cudaEventRecord(e0, g_stream));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaEventRecord(e1, g_stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e-3 / batch;
  }
};

/// One stdout line "<tag> <what>: ..." with an algorithm's configuration
/// (cublasLtMatmulAlgoConfigGetAttribute): algo id, tile / stages / cluster shape ids
/// (cublasLtMatmulTile_t, cublasLtMatmulStages_t, cublasLtClusterShape_t values: e.g. `grep -E
/// 'TILE_[0-9x]+ = 19,' cublasLt.h` gives 64x256), split-K factor, reduction scheme
/// (cublasLtReductionScheme_t), CTA swizzling, plus the heuristic's workspace bytes and wave count
/// (waves -1: not known).
void print_lt_algo(const char* tag, const std::string& what, const cublasLtMatmulAlgo_t& algo, std::size_t ws,
                   float waves) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto zero) {
    decltype(zero) v = zero;
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
      return static_cast<long long>(-1);
    return static_cast<long long>(v);
  };
  std::printf("%s %s: algo_id %lld tile_id %lld stages_id %lld splitk_num %lld reduction_scheme %lld "
              "cta_swizzling %lld cluster_shape_id %lld inner_shape_id %lld custom_option %lld workspace %zu "
              "waves %.3f\n",
              tag, what.c_str(), get(CUBLASLT_ALGO_CONFIG_ID, std::int32_t{0}),
              get(CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t{0}), get(CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t{0}),
              get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{0}),
              get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, std::uint32_t{0}),
              get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, std::uint32_t{0}),
              get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t{0}),
              get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, std::uint16_t{0}),
              get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, std::uint32_t{0}), ws, waves);
  std::fflush(stdout);
}

/// One cuBLASLt GEMM C[T, N] = X[T, K] @ W[N, K]^T (column-major: C^T = W^T(op T) * X^T).
struct LtGemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
  LtGemm(int T, int N, int K, int ldx, int ldw, int ldc) {
    CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, ldw));
    CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, T, ldx));
    CKB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, T, ldc));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    std::size_t ws = kLtWs;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t res{};
    int n = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, lc, lc, pref, 1, &res, &n));
    if (n == 0) {
      std::fprintf(stderr, "cuBLASLt: no algorithm for T=%d N=%d K=%d\n", T, N, K);
      std::exit(1);
    }
    algo = res.algo;
    heuristic_ws = res.workspaceSize;
    heuristic_waves = res.wavesCount;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  /// The heuristic's choice as one stdout line (print_lt_algo, tag "cublaslt_algo").
  void print_config(const std::string& what) const {
    print_lt_algo("cublaslt_algo", what, algo, heuristic_ws, heuristic_waves);
  }
  std::size_t heuristic_ws = 0;
  float heuristic_waves = 0;
  void run(const void* x, const void* w, void* c) {
    const float alpha = 1.f, beta = 0.f;
    CKB(cublasLtMatmul(g_lt, desc, &alpha, w, la, x, lb, &beta, c, lc, c, lc, &algo, g_lt_ws, kLtWs, g_stream));
  }
};

struct Shape {
  std::string geo;
  int tp;
  step5::layout::RankLayout rl;
  int K;
  int N = 0;  ///< weight rows; 0: the fused projection's (rl.padded_rows)
};

/// Device buffers of one shape: `copies` rotating copies of the fused W, X and C for max T.
struct ShapeBuffers {
  int N = 0, K = 0, copies = 1;
  std::vector<void*> w;
  void* x = nullptr;
  void* c = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
};
std::map<std::string, ShapeBuffers> g_buf;

__global__ void fill_kernel(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x; i < n; i += (std::size_t)gridDim.x * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    const float u = (static_cast<float>(h & 0xFFFF) / 65536.f - 0.5f) * 0.25f;
    p[i] = step5::float_to_bf16_bits(u);
  }
}

ShapeBuffers& buffers(const Shape& s, int max_t) {
  const std::string key = s.geo + "/" + std::to_string(s.tp);
  auto it = g_buf.find(key);
  if (it != g_buf.end()) return it->second;
  ShapeBuffers b;
  b.N = s.N > 0 ? s.N : s.rl.padded_rows;
  b.K = s.K;
  const std::size_t wbytes = static_cast<std::size_t>(b.N) * b.K * 2;
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  b.copies = static_cast<int>(std::max<std::size_t>(2, (4ull * l2 + wbytes - 1) / wbytes));
  for (int i = 0; i < b.copies; ++i) {
    void* p;
    CK(cudaMalloc(&p, wbytes));
    fill_kernel<<<1024, 256>>>(static_cast<std::uint16_t*>(p), wbytes / 2, 17u + i);
    b.w.push_back(p);
  }
  CK(cudaMalloc(&b.x, static_cast<std::size_t>(max_t) * b.K * 2));
  fill_kernel<<<1024, 256>>>(static_cast<std::uint16_t*>(b.x), static_cast<std::size_t>(max_t) * b.K, 99u);
  CK(cudaMalloc(&b.c, static_cast<std::size_t>(max_t) * b.N * 2));
  b.ws_bytes = step5::ops::gemm_workspace_bytes(max_t, b.N, b.K);
  CK(cudaMalloc(&b.ws, std::max<std::size_t>(b.ws_bytes, 256)));
  CK(cudaMemset(b.ws, 0, std::max<std::size_t>(b.ws_bytes, 256)));
  CK(cudaDeviceSynchronize());
  return g_buf.emplace(key, std::move(b)).first->second;
}

int batch_for(int T) { return T >= 4096 ? 3 : (T >= 1024 ? 8 : 20); }
constexpr int kMaxT = 16384;

std::string row_key(const Shape& s, int T) {
  return s.geo + "/tp:" + std::to_string(s.tp) + "/tokens:" + std::to_string(T);
}

void bm_copy(benchmark::State& st) {
  // The shared ceiling (bench_common.hpp): median of 1 GiB D2D copies, bytes read + written / s.
  const step5::bench::CopyCeiling& c = step5::bench::copy_ceiling(g_stream);
  for (auto _ : st) st.SetIterationTime(c.seconds);
  g_copy_gbs = c.gbs;
  st.counters["GB/s(rd+wr)"] = g_copy_gbs;
}

void bm_lt(benchmark::State& st, Shape s, int T) {
  ShapeBuffers& b = buffers(s, kMaxT);
  LtGemm g(T, b.N, b.K, b.K, b.K, b.N);
  static std::set<std::string> printed;  // once per shape (Google Benchmark may call a case repeatedly)
  if (printed.insert(row_key(s, T)).second) g.print_config(row_key(s, T));
  GraphTimer gt(batch_for(T), [&](int i) { g.run(b.x, b.w[i % b.copies], b.c); });
  Row& r = g_rows[row_key(s, T)];
  r.lt_us = gt.measure(st);
  r.weight_bytes = 2.0 * b.N * b.K;
  r.flops = 2.0 * T * b.N * b.K;
  st.counters["TFLOP/s"] = r.flops / (r.lt_us * 1e-6) / 1e12;
  st.counters["weight_GB/s"] = r.weight_bytes / (r.lt_us * 1e-6) / 1e9;
}

void bm_unfused(benchmark::State& st, Shape s, int T) {
  ShapeBuffers& b = buffers(s, kMaxT);
  using step5::layout::Shard;
  const auto& rl = s.rl;
  struct Part { int row0, rows; };
  const Part parts[4] = {
      {0, rl.qkv_rows},
      {rl.shard(Shard::kIndexQ).dst_row,
       rl.shard(Shard::kIndexQ).rows + rl.shard(Shard::kIndexK).rows + rl.shard(Shard::kIndexZ).rows},
      {rl.shard(Shard::kIndexG).dst_row, rl.shard(Shard::kIndexG).rows},
      {rl.indexer_w.dst_row, rl.indexer_w.rows}};
  std::vector<std::unique_ptr<LtGemm>> gs;
  std::size_t coff[4];
  std::size_t off = 0;
  for (int p = 0; p < 4; ++p) {
    gs.emplace_back(new LtGemm(T, parts[p].rows, b.K, b.K, b.K, parts[p].rows));
    coff[p] = off;
    off += static_cast<std::size_t>(T) * parts[p].rows;
  }
  GraphTimer gt(batch_for(T), [&](int i) {
    const auto* w = static_cast<const std::uint16_t*>(b.w[i % b.copies]);
    for (int p = 0; p < 4; ++p)
      gs[p]->run(b.x, w + static_cast<std::size_t>(parts[p].row0) * b.K, static_cast<std::uint16_t*>(b.c) + coff[p]);
  });
  Row& r = g_rows[row_key(s, T)];
  r.unf_us = gt.measure(st);
  st.counters["TFLOP/s"] = 2.0 * T * b.N * b.K / (r.unf_us * 1e-6) / 1e12;
}

/// The path's name in labels and the table: step5::ops::gemm_path_name, except "stream" for the
/// split-K path (the name the results tables have always used).
const char* path_name(step5::ops::GemmPath p) {
  return p == step5::ops::GemmPath::kSplitK ? "stream" : step5::ops::gemm_path_name(p);
}

/// "wgmma 128, split-K 4", "stream, split-K 7", "wgmma 256", "wgmma m64n256, split-K 8", "gemv",
/// "gemv mma", "gemv mma windows": the path, the wgmma tile kind (gemm_wgmma_tile_name), the kGemv
/// kernel (" mma": the tensor-core one, " windows": X in windows) and the K splits of either split path.
std::string plan_label(const step5::ops::GemmPlan& plan) {
  std::string l = path_name(plan.path);
  if (plan.path == step5::ops::GemmPath::kWgmma && plan.config >= 1 &&
      plan.config <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)))
    l += " " + step5::ops::gemm_wgmma_tile_name(step5::ops::kGemmWgmmaTiles[plan.config - 1]);
  if (plan.path == step5::ops::GemmPath::kGemv && plan.config == step5::ops::kGemmGemvTensorCores) l += " mma";
  if (plan.path == step5::ops::GemmPath::kGemv && plan.config == step5::ops::kGemmGemvTensorCoresWindowed) l += " mma windows";
  if (plan.split_k > 1) l += ", split-K " + std::to_string(plan.split_k);
  return l;
}

/// Tuning A/B without a rebuild: STEP5_BENCH_GEMM_CONFIG (a GemmParams::config) and
/// STEP5_BENCH_GEMM_SPLIT_K (a GemmParams::split_k) override those of every `gemm*` case whose
/// own value is 0 (= the planner's); the path stays the case's (kAuto picks by T). Unset or 0: the
/// case's own. The case name is unchanged (the label shows the plan run), so compare such runs
/// only with each other. Returns false (the case skipped, naming the value) on a malformed value.
bool env_override(benchmark::State& st, const char* var, int* field) {
  if (*field != 0) return true;  // the case forces it
  std::string error;
  if (!step5::bench::env_knob(var, field, &error)) {
    st.SkipWithError(error.c_str());
    return false;
  }
  return true;
}

void bm_ours(benchmark::State& st, Shape s, int T, step5::ops::GemmPath path, int config, int split_k,
             bool allow_cublaslt) {
  // the table's row: this library's kernels as kAuto plans them
  const bool auto_case = path == step5::ops::GemmPath::kAuto && config == 0 && split_k == 0 && !allow_cublaslt;
  // the overrides are for this library's kernels (a config or split_k would turn kAuto's cuBLASLt off)
  // (the gemv path has no tile or split to override: its rows ignore them)
  if (!allow_cublaslt && path != step5::ops::GemmPath::kGemv &&
      (!env_override(st, "STEP5_BENCH_GEMM_CONFIG", &config) || !env_override(st, "STEP5_BENCH_GEMM_SPLIT_K", &split_k)))
    return;
  ShapeBuffers& b = buffers(s, kMaxT);
  step5::ops::GemmParams p;
  p.x = static_cast<const step5::bf16*>(b.x);
  p.c = static_cast<step5::bf16*>(b.c);
  p.tokens = T; p.n = b.N; p.k = b.K; p.ldx = b.K; p.ldw = b.K; p.ldc = b.N;
  p.w = static_cast<const step5::bf16*>(b.w[0]);
  p.workspace = b.ws;
  p.workspace_bytes = b.ws_bytes;
  p.path = path;
  p.config = config;
  p.split_k = split_k;
  // `gemm/` and the forced rows: this library's kernels, measured against the `cublaslt/` row;
  // `gemm_auto/`: what gemm_bf16's kAuto runs (cuBLASLt through the library's cached plan, with
  // its workspace limit and alignment preferences, or the kernels where cuBLASLt has no algorithm)
  p.allow_cublaslt = allow_cublaslt;
  step5::ops::GemmPlan plan;
  step5::Status ps = step5::ops::gemm_plan(p, &plan);
  if (!ps.ok()) {
    st.SkipWithError(ps.to_string().c_str());
    return;
  }
  if (plan.workspace_bytes > b.ws_bytes) {  // a forced path may need more than the auto maximum
    CK(cudaFree(b.ws));
    b.ws_bytes = plan.workspace_bytes;
    CK(cudaMalloc(&b.ws, b.ws_bytes));
    // zeroed on g_stream (non-blocking: a legacy-stream memset would not be ordered before the launch)
    CK(cudaMemsetAsync(b.ws, 0, b.ws_bytes, g_stream));
    p.workspace = b.ws;
    p.workspace_bytes = b.ws_bytes;
  }
  bool failed = false;
  std::string err;
  GraphTimer gt(batch_for(T), [&](int i) {
    step5::ops::GemmParams q = p;
    q.w = static_cast<const step5::bf16*>(b.w[i % b.copies]);
    const step5::Status s2 = step5::ops::gemm_bf16(q, g_stream);
    if (!s2.ok()) { failed = true; err = s2.to_string(); }
  });
  if (failed) {
    st.SkipWithError(err.c_str());
    return;
  }
  const double us = gt.measure(st);
  const std::string key = row_key(s, T);
#ifndef STEP5_NO_CUBLASLT
  if (plan.path == step5::ops::GemmPath::kCublasLt) {  // the library's cached plan (lt_entry), once per shape
    static std::set<std::string> printed;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    const step5::ops::gemm_detail::LtEntry* e = nullptr;
    cublasLtHandle_t h = nullptr;
    const step5::Status es = step5::ops::gemm_detail::lt_entry(p, dev, &e, &h);
    if (es.ok() && e->found && printed.insert(key).second) print_lt_algo("cublaslt_algo_auto", key, e->algo, e->workspace, -1.f);
  }
#endif
  Row& r = g_rows[key];
  if (auto_case) {
    r.ours_us = us;
    r.path = plan_label(plan);
    // Google Benchmark calls a MinTime case more than once (to size its iterations): one table row each
    if (std::find(g_order.begin(), g_order.end(), key) == g_order.end()) g_order.push_back(key);
  }
  const double wgbs = 2.0 * b.N * b.K / (us * 1e-6) / 1e9;
  st.counters["TFLOP/s"] = 2.0 * T * b.N * b.K / (us * 1e-6) / 1e12;
  st.counters["weight_GB/s"] = wgbs;
  if (g_copy_gbs > 0) st.counters["x_copyBW"] = wgbs / g_copy_gbs;
  if (r.lt_us > 0) st.counters["x_cublasLt"] = r.lt_us / us;
  if (r.unf_us > 0) st.counters["x_unfused"] = r.unf_us / us;
  st.SetLabel(plan_label(plan));
}

}  // namespace

int main(int argc, char** argv) {
  if (!step5::bench::sm90_device_present()) return 0;
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CKB(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_lt_ws, kLtWs));
  // Benchmarked (list row, tp) pairs: rows named by their geometries.def id; each tp is checked
  // at compile time against the row's tp list.
  std::vector<Shape> shapes, oproj;
  using step5::layout::GeometryId;
  auto add = [&]<GeometryId Id, int Tp>() {
    static_assert(step5::layout::lists_tp(step5::layout::entry_of(Id), Tp),
                  "bench_gemm: this tp is not listed for the geometry in geometries.def");
    using Tag = step5::layout::LayoutTag<Id, Tp>;
    shapes.push_back({std::string(Tag::kEntry.name), Tp, Tag::Layout::kRank0, Tag::kEntry.hidden});
    // the rank's o_proj at decode T (N = hidden, K = local heads x head_dim): cuBLASLt, kAuto and
    // the kGemv kernels only (rows o_proj/<geometry>/...)
    oproj.push_back({"o_proj/" + std::string(Tag::kEntry.name), Tp, Tag::Layout::kRank0,
                     Tag::Layout::kRank0.local_heads * Tag::kGeometry.head_dim, Tag::kEntry.hidden});
  };
  add.template operator()<GeometryId::step5_preview, 1>();
  add.template operator()<GeometryId::step5_preview, 8>();
  add.template operator()<GeometryId::dsa_h64_kv8_d128, 1>();  // the second geometry of kAuto's kGemv measurements
  add.template operator()<GeometryId::dsa_h64_kv8_d128, 8>();
  // the other listed tp at T = 1, 4, 8 only (fused and o_proj: kAuto's kGemv rules, gemm_auto_takes_gemv)
  std::vector<Shape> t1_only;
  auto add_t1 = [&]<GeometryId Id, int Tp>() {
    const std::size_t n = shapes.size();
    add.template operator()<Id, Tp>();
    t1_only.push_back(shapes[n]);
    t1_only.push_back(oproj[n]);
    shapes.pop_back();
    oproj.pop_back();
  };
  add_t1.template operator()<GeometryId::step5_preview, 2>();
  add_t1.template operator()<GeometryId::step5_preview, 4>();
  add_t1.template operator()<GeometryId::step5_preview, 16>();
  add_t1.template operator()<GeometryId::dsa_h64_kv8_d128, 2>();
  add_t1.template operator()<GeometryId::dsa_h64_kv8_d128, 4>();
  add_t1.template operator()<GeometryId::dsa_h64_kv8_d128, 16>();
  const int tokens[] = {1, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384};  // 16: MTP decode, the last kGemv T
  const double kMin = 0.02;  // keeps the whole run near one minute
  benchmark::RegisterBenchmark("copy/d2d", bm_copy)->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
  // every shape's rows at T: cuBLASLt first (the others' x_cublasLt reads its time), then this
  // library's kAuto without and with cuBLASLt and the kGemv kernels where they run (at T <= 4 both
  // forced: gemm_gemv_mma/ the tensor-core one, gemm_gemv_cuda/ the CUDA-core one where gemm_gemv/
  // runs the other)
  const auto reg_lt = [&](const Shape& s, int T) {
    benchmark::RegisterBenchmark(("cublaslt/" + row_key(s, T)).c_str(), bm_lt, s, T)
        ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
  };
  const auto reg_ours = [&](const Shape& s, int T) {
    const std::string k = row_key(s, T);
    benchmark::RegisterBenchmark(("gemm/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kAuto, 0, 0, false)
        ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("gemm_auto/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kAuto, 0, 0, true)
        ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
    if (step5::ops::gemm_gemv_eligible(T, s.K))
      benchmark::RegisterBenchmark(("gemm_gemv/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kGemv, 0, 0, false)
          ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
    if (T <= step5::ops::kGemmGemvCudaCoreMaxTokens &&
        step5::ops::gemm_gemv_eligible(T, s.K, step5::ops::kGemmGemvTensorCores))
      benchmark::RegisterBenchmark(("gemm_gemv_mma/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kGemv,
                                   step5::ops::kGemmGemvTensorCores, 0, false)
          ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
    if (T <= step5::ops::kGemmGemvCudaCoreMaxTokens &&
        step5::ops::gemm_gemv_pick(T) != step5::ops::kGemmGemvCudaCores &&
        step5::ops::gemm_gemv_eligible(T, s.K, step5::ops::kGemmGemvCudaCores))
      benchmark::RegisterBenchmark(("gemm_gemv_cuda/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kGemv,
                                   step5::ops::kGemmGemvCudaCores, 0, false)
          ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
    if (T >= 4 && s.K > step5::ops::kGemmGemvXWindow &&
        step5::ops::gemm_gemv_eligible(T, s.K, step5::ops::kGemmGemvTensorCoresWindowed))
      benchmark::RegisterBenchmark(("gemm_gemv_win/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kGemv,
                                   step5::ops::kGemmGemvTensorCoresWindowed, 0, false)
          ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
  };
  for (const Shape& s : shapes)
    for (int T : tokens) {
      const std::string k = row_key(s, T);
      reg_lt(s, T);
      benchmark::RegisterBenchmark(("unfused/" + k).c_str(), bm_unfused, s, T)
          ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
      reg_ours(s, T);
      // the other path / tile choices around the launcher's crossovers
      if (T >= 32 && T <= 128)
        benchmark::RegisterBenchmark(("gemm_stream/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kSplitK, 0, 0, false)
            ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
      if (T == 32)
        benchmark::RegisterBenchmark(("gemm_wgmma128/" + k).c_str(), bm_ours, s, T, step5::ops::GemmPath::kWgmma, 1, 0, false)
            ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
      // the wgmma path's K splits forced (its tile width planned), to re-fit the split cost model
      if (T >= 64 && T <= 256)
        for (int sk : {1, 2, 3, 4, 6, 8})
          benchmark::RegisterBenchmark(("gemm_wgmma_sk" + std::to_string(sk) + "/" + k).c_str(), bm_ours, s, T,
                                       step5::ops::GemmPath::kWgmma, 0, sk, false)
              ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
      // every wgmma tile kind of kGemmWgmmaTiles forced (names gemm_wgmma<gemm_wgmma_tile_name>/...,
      // e.g. gemm_wgmma128/, gemm_wgmmam64n256/; K splits planned)
      if (T >= 64)
        for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)); ++c)
          benchmark::RegisterBenchmark(
              ("gemm_wgmma" + step5::ops::gemm_wgmma_tile_name(step5::ops::kGemmWgmmaTiles[c - 1]) + "/" + k).c_str(),
              bm_ours, s, T, step5::ops::GemmPath::kWgmma, c, 0, false)
              ->UseManualTime()->MinTime(kMin)->Unit(benchmark::kMicrosecond);
    }
  for (const Shape& s : oproj)
    for (int T : {1, 4, 8, 16}) {
      reg_lt(s, T);
      reg_ours(s, T);
    }
  for (const Shape& s : t1_only)
    for (int T : {1, 4, 8}) {  // kAuto's kGemv rules: T = 1, and T = 2 ... 8 at K 4096 (tp 2 taken, tp 4 not)
      reg_lt(s, T);
      reg_ours(s, T);
    }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::printf("\ncopy D2D bandwidth (read+write): %.0f GB/s\n", g_copy_gbs);
  std::printf("%-40s %-22s %9s %9s %9s %8s %7s %7s %7s %7s\n", "shape", "path", "ours_us", "lt_us", "unf_us",
              "wGB/s", "xcopy", "xLt", "xUnf", "TFLOP/s");
  for (const std::string& k : g_order) {
    const Row& r = g_rows[k];
    const double wgbs = r.weight_bytes / (r.ours_us * 1e-6) / 1e9;
    std::printf("%-40s %-22s %9.1f %9.1f %9.1f %8.0f %7.2f %7.2f %7.2f %7.1f\n", k.c_str(), r.path.c_str(),
                r.ours_us, r.lt_us, r.unf_us, wgbs, g_copy_gbs > 0 ? wgbs / g_copy_gbs : 0.0, r.lt_us / r.ours_us,
                r.unf_us / r.ours_us, r.flops / (r.ours_us * 1e-6) / 1e12);
  }
  return 0;
}
