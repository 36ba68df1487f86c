// GPU test of the projection GEMM (step5/ops/gemm.hpp, SPEC §3/§4.1) against the CPU reference
// `step5::reference::gemm_bf16_f32out`: every geometry × tp of geometries.def (N = padded_rows
// of rank 0, K = hidden), T in {1, 2, 3, 17, 64, 127, 128, 129, 256, 1000, 4096}, every path
// (auto, generic, stream, wgmma), padded row strides, poisoned outputs, plus precondition
// errors. The wgmma path's split-K: every tile kind of kGemmWgmmaTiles × every split 1..8 at odd
// shapes (T % 64 != 0, N % BN != 0, a partial last k-tile), the plan splitting the tp 8 fused
// shapes at T = 64/128/256, bit-identical output over 20 launches with other work running and
// equal to the in-split-order sum of the partials left in the workspace, and back-to-back
// launches reusing one workspace (counters reset). The 64-token kinds (two warpgroups on one
// 64-row token tile, each on half of the columns): T = 1, 17, 63, 64 at odd N and K (odd multiples
// of 8) with every split factor they can take, and bit-identical at T = 17, 64, 100.
// Quick (sanitizer) mode, step5_test::quick(): tp 1 and 8 of each geometry, T in {1, 17, 129} at
// K = 256 (every variant at T 17 and 129), plus T = 1 at K = hidden (4096, split-K decode) for
// tp 8; the odd shapes with T capped at 129; the wgmma split-K cases at their (small) full size,
// 5 instead of 20 repeats; the 64-token kinds at splits 1, 2, 3 and their maximum only. Same checks
// and tolerances.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/core/numeric.hpp"
#include "step5/kernels/sm90/gemm_cublaslt.cuh"
#include "step5/kernels/sm90/gemm_stream.cuh"
#include "step5/kernels/sm90/gemm_wgmma.cuh"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/gemm.hpp"
#include "step5/ops/pdl.hpp"
#include "step5/reference/gemm.hpp"

using step5::bf16;
using step5::ops::GemmParams;
using step5::ops::GemmPath;

namespace {

std::uint64_t g_seed = 0x9E3779B97F4A7C15ull;
/// Random bf16 in [-1, 1) (never all zeros), splitmix64.
void fill_random(std::vector<bf16>& v, float scale) {
  for (auto& e : v) {
    std::uint64_t z = (g_seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f;
    e = step5::to_bf16(u * scale);
  }
}

struct Variant {
  GemmPath path = GemmPath::kAuto;
  int config = 0;
  int split_k = 0;
  bool allow_cublaslt = true;  ///< GemmParams::allow_cublaslt (false: kAuto plans this library's kernels)
};

const char* path_name(GemmPath p) { return step5::ops::gemm_path_name(p); }

/// The layer's two GEMM shapes on rank 0 of every geometries.def row x listed tp:
/// f(label "<geometry>/tp<N>", tp, what "fused" / "o_proj", N, K) for the fused projection
/// (N rank.padded_rows, K hidden) and o_proj (N hidden, K local heads x head_dim).
template <class F>
void for_each_layer_gemm(F&& f) {
  step5::layout::for_each_layout([&](auto tag) {
    using Tag = decltype(tag);
    const step5::layout::RankLayout rl = Tag::Layout::kRank0;
    const int hidden = Tag::kEntry.hidden, tp = Tag::kParallel.tp_size;
    const std::string g = std::string(Tag::kEntry.name) + "/tp" + std::to_string(tp);
    f(g, tp, "fused", rl.padded_rows, hidden);
    f(g, tp, "o_proj", hidden, rl.local_heads * Tag::kEntry.geometry.head_dim);
  });
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t bytes) { GPU_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 256))); }
  ~DevBuf() { cudaFree(p); }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

/// Dense operands of one GEMM: random W [N, K] (±0.125) and X [T, K] (±1) on the host and the
/// device, and C [T, N] on the device; `params()` fills a GemmParams with them (ld = K, K, N).
struct DenseOperands {
  std::vector<bf16> hw, hx;
  DevBuf dw, dx, dc;
  int T, N, K;
  DenseOperands(int t, int n, int k)
      : hw(static_cast<std::size_t>(n) * k), hx(static_cast<std::size_t>(t) * k), dw(hw.size() * 2),
        dx(hx.size() * 2), dc(static_cast<std::size_t>(t) * n * 2), T(t), N(n), K(k) {
    fill_random(hw, 0.125f);
    fill_random(hx, 1.0f);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  }
  GemmParams params() const {
    GemmParams p;
    p.x = dx.as<bf16>(), p.w = dw.as<bf16>(), p.c = dc.as<bf16>();
    p.tokens = T, p.n = N, p.k = K, p.ldx = K, p.ldw = K, p.ldc = N;
    return p;
  }
};

/// The verdict on GPU output `hc` (`[T, ldc]` bf16) against the fp32 reference `ref` (`[rows.size(),
/// N]`, row i = output row rows[i]): each element within 1e-2 relative + 1e-3 of its row's RMS
/// (bf16 output rounding plus fp32 summation order), the padding columns [N, ldc) still poison
/// (0xFFFF). NaN is never within tolerance.
struct Judgement {
  long long bad = 0, checked = 0;
  double max_rel = 0;
  int first_t = -1, first_n = -1;
  float first_o = 0, first_r = 0;
};
Judgement judge_output(const std::vector<float>& ref, const std::vector<int>& rows, int N, int ldc,
                       const std::vector<bf16>& hc) {
  Judgement j;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const float* rr = &ref[i * static_cast<std::size_t>(N)];
    double ss = 0;
    for (int n = 0; n < N; ++n) ss += static_cast<double>(rr[n]) * rr[n];
    const double rms = std::sqrt(ss / N);
    const bf16* cr = &hc[static_cast<std::size_t>(rows[i]) * ldc];
    for (int n = 0; n < N; ++n) {
      const float o = step5::to_float(cr[n]);
      const double err = std::fabs(static_cast<double>(o) - rr[n]);
      const double tol = 1e-2 * std::fabs(rr[n]) + 1e-3 * rms;
      ++j.checked;
      if (!(err <= tol)) {
        if (j.bad++ == 0) { j.first_t = rows[i]; j.first_n = n; j.first_o = o; j.first_r = rr[n]; }
      } else if (std::fabs(rr[n]) > rms * 1e-2) {
        j.max_rel = std::max(j.max_rel, err / std::fabs(rr[n]));
      }
    }
    for (int n = N; n < ldc; ++n)  // padding columns stay untouched
      if (cr[n].bits != 0xFFFF) {
        if (j.bad++ == 0) { j.first_t = rows[i]; j.first_n = n; j.first_o = step5::to_float(cr[n]); j.first_r = NAN; }
      }
  }
  return j;
}

/// Launches `p` (workspace zero-filled) `repeats` times on a stream of its own while a
/// memory-streaming kernel of varying grid runs on a second stream, C [tokens, ldc] poisoned (NaN)
/// before each launch; `first` / `last` receive C (bf16 bits) of the first and the last launch. Returns
/// how many launches gave a C different from the first one's. With `counters_left`, adds the split-K
/// arrival counters (the workspace's first kGemmCounterBytes) found non-zero after each launch.
int repeat_with_noise(const GemmParams& p, int repeats, const std::string& what, std::vector<std::uint16_t>* first,
                      std::vector<std::uint16_t>* last, int* counters_left) {
  const std::size_t c_elems = static_cast<std::size_t>(p.tokens) * p.ldc;
  const std::size_t noise_n = std::size_t(1) << 26;
  DevBuf noise(noise_n * 4);
  GPU_CHECK(cudaMemset(noise.p, 0, noise_n * 4));
  cudaStream_t s_gemm, s_noise;
  GPU_CHECK(cudaStreamCreateWithFlags(&s_gemm, cudaStreamNonBlocking));
  GPU_CHECK(cudaStreamCreateWithFlags(&s_noise, cudaStreamNonBlocking));
  std::vector<unsigned> counters(step5::ops::kGemmCounterBytes / sizeof(unsigned));
  last->assign(c_elems, 0);
  int changed = 0;
  for (int it = 0; it < repeats; ++it) {
    GPU_CHECK(cudaMemset(p.c, 0xff, c_elems * 2));  // poison (NaN)
    GPU_CHECK(cudaDeviceSynchronize());
    step5_test::noise_kernel<<<33 + 17 * (it % 13), 256, 0, s_noise>>>(noise.as<float>(), noise_n, 1);
    GPU_CHECK(cudaGetLastError());
    const step5::Status st = step5::ops::gemm_bf16(p, s_gemm);
    EXPECT(st.ok(), "%s: %s", what.c_str(), st.to_string().c_str());
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(last->data(), p.c, c_elems * 2, cudaMemcpyDeviceToHost));
    if (counters_left != nullptr) {
      GPU_CHECK(cudaMemcpy(counters.data(), p.workspace, step5::ops::kGemmCounterBytes, cudaMemcpyDeviceToHost));
      for (unsigned v : counters) *counters_left += v != 0;
    }
    if (it == 0) *first = *last;
    else changed += *last != *first;
  }
  GPU_CHECK(cudaStreamDestroy(s_gemm));
  GPU_CHECK(cudaStreamDestroy(s_noise));
  return changed;
}

/// Outputs of `out` (bf16 bits, [T, N]) at every `t_step`-th row and every 97th column that are
/// not finite or differ from the fp64 product of hx [T, K] and hw [N, K]ᵀ by more than
/// 1e-2 · (1 + |ref|): a spot check that the split-K sum is the right product.
int fp64_spot_check_failures(const std::vector<bf16>& hx, const std::vector<bf16>& hw,
                             const std::vector<std::uint16_t>& out, int T, int N, int K, int t_step) {
  int bad = 0;
  for (int t = 0; t < T; t += t_step)
    for (int n = 0; n < N; n += 97) {
      double ref = 0;
      for (int k = 0; k < K; ++k)
        ref += static_cast<double>(step5::to_float(hx[static_cast<std::size_t>(t) * K + k])) *
               step5::to_float(hw[static_cast<std::size_t>(n) * K + k]);
      bf16 got;
      std::memcpy(&got, &out[static_cast<std::size_t>(t) * N + n], 2);
      const float v = step5::to_float(got);
      if (!std::isfinite(v) || !(std::abs(v - ref) <= 1e-2 * (1.0 + std::abs(ref)))) ++bad;
    }
  return bad;
}

/// Every row 0 .. T-1 and the reference `[T, N]` of X `[T, ldx]` @ W^T.
std::vector<float> reference_all_rows(int T, int N, int K, const std::vector<bf16>& hx, int ldx,
                                      const std::vector<bf16>& hw, int ldw, std::vector<int>* rows) {
  rows->resize(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) (*rows)[static_cast<std::size_t>(t)] = t;
  std::vector<float> ref(static_cast<std::size_t>(T) * N);
  step5::reference::gemm_bf16_f32out(T, N, K, hx.data(), ldx, hw.data(), ldw, ref.data(), N);
  return ref;
}

/// A kGemv kernel (config) forced on x / w (rows ld apart) into c (poisoned first, rows ldc
/// apart), synchronised.
step5::Status gemv_forced(const DevBuf& dx, const DevBuf& dw, DevBuf& dc, int T, int N, int K, int ld, int ldc,
                          int config) {
  GPU_CHECK(cudaMemset(dc.p, 0xff, static_cast<std::size_t>(T) * ldc * 2));
  GemmParams p;
  p.x = dx.as<bf16>(), p.w = dw.as<bf16>(), p.c = dc.as<bf16>();
  p.tokens = T, p.n = N, p.k = K, p.ldx = ld, p.ldw = ld, p.ldc = ldc;
  p.path = GemmPath::kGemv;
  p.config = config;
  const step5::Status st = step5::ops::gemm_bf16(p, nullptr);
  GPU_CHECK(cudaDeviceSynchronize());
  return st;
}

/// The k-tiles of K for a wgmma tile kind config (1-based; 0 = 64-wide k-tiles): 64 · k_boxes wide.
int wgmma_k_tiles(int K, int config) {
  const int bk = 64 * (config > 0 ? step5::ops::kGemmWgmmaTiles[config - 1].k_boxes : 1);
  return (K + bk - 1) / bk;
}

/// The split factor the launcher runs for a forced `forced` splits over K: at most one per k-tile
/// (64 · k_boxes wide for wgmma kind `config`), no empty split (kt_per = ceil(k_tiles / forced),
/// splits = ceil(k_tiles / kt_per)).
int expected_splits(int K, int forced, int config = 0) {
  const int k_tiles = wgmma_k_tiles(K, config);
  const int f = std::min(forced, k_tiles);
  const int per = (k_tiles + f - 1) / f;
  return (k_tiles + per - 1) / per;
}

/// The plan of a forced wgmma kind `config` and split factor `sp` runs them (split factor
/// normalised: no empty split) and sizes a workspace exactly when it splits. `any` is a device
/// pointer used as X, W and C (the plan reads only alignment).
void expect_forced_wgmma_plan(bf16* any, int T, int N, int K, int ldx, int ldw, int ldc, int config, int sp) {
  GemmParams p;
  p.x = any, p.w = any, p.c = any;
  p.tokens = T, p.n = N, p.k = K, p.ldx = ldx, p.ldw = ldw, p.ldc = ldc;
  p.path = GemmPath::kWgmma, p.config = config, p.split_k = sp;
  step5::ops::GemmPlan plan;
  const step5::Status st = step5::ops::gemm_plan(p, &plan);
  EXPECT(st.ok() && plan.path == GemmPath::kWgmma && plan.config == config &&
             plan.split_k == expected_splits(K, sp, config) && (plan.split_k > 1) == (plan.workspace_bytes > 0),
         "T=%d N=%d K=%d c%d s%d: plan %s path %d config %d split_k %d (want %d) workspace %zu", T, N, K, config, sp,
         st.to_string().c_str(), static_cast<int>(plan.path), plan.config, plan.split_k, expected_splits(K, sp, config),
         plan.workspace_bytes);
}

/// One problem: W [N, ldw], X [T, ldx]; checks C [T, ldc] of `paths` against the reference on
/// `check_rows` rows (all rows when T <= 160, else a spread sample incl. first and last).
void run_case(const std::string& name, int T, int N, int K, int ldx, int ldw, int ldc, const std::vector<bf16>& hw,
              const bf16* dw, void* workspace, std::size_t ws_bytes, const std::vector<Variant>& variants) {
  std::vector<bf16> hx(static_cast<std::size_t>(T) * ldx);
  fill_random(hx, 1.0f);
  DevBuf dx(hx.size() * 2), dc(static_cast<std::size_t>(T) * ldc * 2);
  GPU_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));

  std::vector<int> rows;
  if (T <= 160) {
    for (int t = 0; t < T; ++t) rows.push_back(t);
  } else {
    for (int i = 0; i < 48; ++i) rows.push_back(static_cast<int>((static_cast<long long>(i) * (T - 1)) / 47));
    rows.push_back(127); rows.push_back(128); rows.push_back(T / 2 + 1);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  }
  const int R = static_cast<int>(rows.size());
  std::vector<bf16> xs(static_cast<std::size_t>(R) * K);
  for (int i = 0; i < R; ++i)
    std::memcpy(&xs[static_cast<std::size_t>(i) * K], &hx[static_cast<std::size_t>(rows[i]) * ldx], K * 2);
  std::vector<float> ref(static_cast<std::size_t>(R) * N);
  step5::reference::gemm_bf16_f32out(R, N, K, xs.data(), K, hw.data(), ldw, ref.data(), N);

  std::vector<bf16> hc(static_cast<std::size_t>(T) * ldc);
  for (const Variant& v : variants) {
    const GemmPath path = v.path;
    GPU_CHECK(cudaMemset(dc.p, 0xFF, hc.size() * 2));  // poison: 0xFFFF is a bf16 NaN
    GemmParams p;
    p.x = dx.as<bf16>();
    p.w = dw;
    p.c = dc.as<bf16>();
    p.tokens = T; p.n = N; p.k = K; p.ldx = ldx; p.ldw = ldw; p.ldc = ldc;
    p.workspace = workspace;
    p.workspace_bytes = ws_bytes;
    p.path = path;
    p.config = v.config;
    p.split_k = v.split_k;
    p.allow_cublaslt = v.allow_cublaslt;
    step5::ops::GemmPlan plan;
    const step5::Status ps = step5::ops::gemm_plan(p, &plan);
    const std::string pn = std::string(path_name(path)) + (v.allow_cublaslt ? "" : "/own") +
                           (v.config ? "/c" + std::to_string(v.config) : "") +
                           (v.split_k ? "/s" + std::to_string(v.split_k) : "");
    // the gemv path refuses what it cannot run (T above kGemmGemvMaxTokens, X too large for shared
    // memory, its CUDA-core kernel forced at T > kGemmGemvCudaCoreMaxTokens, the fast-path alignment) with kInvalidArgument,
    // naming the value
    const bool fast = K % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && ldc % 2 == 0;
    if (path == GemmPath::kGemv && !(fast && step5::ops::gemm_gemv_eligible(T, K, v.config))) {
      EXPECT(ps.code() == step5::StatusCode::kInvalidArgument,
             "%s path gemv (T %d, K %d): expected kInvalidArgument, got %s", name.c_str(), T, K,
             ps.to_string().c_str());
      const std::string named = fast ? "tokens = " + std::to_string(T) : std::string("gemv path needs");
      EXPECT(ps.message().find(named) != std::string::npos, "%s path gemv: message '%s' lacks '%s'", name.c_str(),
             ps.message().c_str(), named.c_str());
      const step5::Status ls = step5::ops::gemm_bf16(p, nullptr);
      EXPECT(ls.code() == step5::StatusCode::kInvalidArgument, "%s path gemv: gemm_bf16 gave %s", name.c_str(),
             ls.to_string().c_str());
      continue;
    }
    EXPECT(ps.ok(), "%s path %s: gemm_plan: %s", name.c_str(), pn.c_str(), ps.to_string().c_str());
    EXPECT(path != GemmPath::kGemv || plan.path == GemmPath::kGemv, "%s: forced gemv planned %s", name.c_str(),
           path_name(plan.path));
    // a gemv plan names its kernel: the one forced, else (config 0) the CUDA cores at T = 1 and the
    // tensor cores above; kAuto's: gemm_auto_gemv_config
    EXPECT(plan.path != GemmPath::kGemv ||
               plan.config == (path != GemmPath::kGemv ? step5::ops::gemm_auto_gemv_config(T, N, K)
                               : v.config != 0         ? v.config
                               : T == 1                ? step5::ops::kGemmGemvCudaCores
                                                       : step5::ops::kGemmGemvTensorCores),
           "%s path %s: gemv plan config %d", name.c_str(), pn.c_str(), plan.config);
    // besides a forced kGemv, only kAuto without overrides plans gemv, exactly where gemm_auto_takes_gemv
    const bool auto_gemv = path == GemmPath::kAuto && v.config == 0 && v.split_k == 0 && fast &&
                           step5::ops::gemm_auto_takes_gemv(T, N, K);
    EXPECT(path == GemmPath::kGemv || (plan.path == GemmPath::kGemv) == auto_gemv,
           "%s path %s: planned %s, expected gemv exactly where gemm_auto_takes_gemv (%d)", name.c_str(), pn.c_str(),
           path_name(plan.path), auto_gemv ? 1 : 0);
    std::unique_ptr<DevBuf> own_ws;  // a forced configuration may need more than the shared one
    if (ps.ok() && plan.workspace_bytes > ws_bytes) {
      own_ws = std::make_unique<DevBuf>(plan.workspace_bytes);
      GPU_CHECK(cudaMemset(own_ws->p, 0, plan.workspace_bytes));
      p.workspace = own_ws->p;
      p.workspace_bytes = plan.workspace_bytes;
    }
    const step5::Status st = step5::ops::gemm_bf16(p, nullptr);
    EXPECT(st.ok(), "%s path %s: %s", name.c_str(), pn.c_str(), st.to_string().c_str());
    if (!st.ok()) continue;
    GPU_CHECK(cudaGetLastError());
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(hc.data(), dc.p, hc.size() * 2, cudaMemcpyDeviceToHost));
    const Judgement j = judge_output(ref, rows, N, ldc, hc);
    EXPECT(j.bad == 0, "%s path %s (plan %s, config %d, split_k %d): %lld of %lld elements off; first at t=%d n=%d: got %g, want %g",
           name.c_str(), pn.c_str(), path_name(plan.path), plan.config, plan.split_k, j.bad, j.checked, j.first_t,
           j.first_n, j.first_o, j.first_r);
    std::printf("  %-44s %-12s -> %-7s c%d split_k %2d rows %4d: max rel err %.2e %s\n", name.c_str(), pn.c_str(),
                path_name(plan.path), plan.config, plan.split_k, R, j.max_rel, j.bad ? "FAIL" : "ok");
  }
}

/// kAuto (cuBLASLt where built in), kAuto on this library's kernels, every forced path.
const std::vector<Variant> kAllPaths = {{GemmPath::kAuto},   {GemmPath::kAuto, 0, 0, false}, {GemmPath::kGeneric},
                                        {GemmPath::kSplitK}, {GemmPath::kWgmma},             {GemmPath::kCublasLt},
                                        {GemmPath::kGemv}};

/// kAllPaths plus every stream tile configuration, forced split-K factors and both wgmma tiles.
std::vector<Variant> all_variants() {
  std::vector<Variant> v = kAllPaths;
  // every row of the one split-K tile table (config = row + 1)
  for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmSplitKTiles)); ++c) v.push_back({GemmPath::kSplitK, c, 0});
  v.push_back({GemmPath::kSplitK, 0, 1});
  v.push_back({GemmPath::kSplitK, 0, 3});
  // both kGemv kernels forced (the CUDA-core one is refused above T = kGemmGemvCudaCoreMaxTokens)
  v.push_back({GemmPath::kGemv, step5::ops::kGemmGemvCudaCores, 0});
  v.push_back({GemmPath::kGemv, step5::ops::kGemmGemvTensorCores, 0});
  v.push_back({GemmPath::kGemv, step5::ops::kGemmGemvTensorCoresWindowed, 0});
  v.push_back({GemmPath::kSplitK, 2, 16});
  // every wgmma tile kind (config = entry + 1), unsplit, planned and split 3
  for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)); ++c) {
    v.push_back({GemmPath::kWgmma, c, 0});
    v.push_back({GemmPath::kWgmma, c, 1});
    v.push_back({GemmPath::kWgmma, c, 3});
  }
  return v;
}

}  // namespace

GPU_CASE("gemm: every geometry x tp, T list, every path, vs CPU reference") {
  const bool quick = step5_test::quick();
  step5::layout::for_each_layout([&](auto tag) {
    using Tag = decltype(tag);
    const int tp = Tag::kParallel.tp_size;
    if (quick && tp != 1 && tp != 8) return;
    const step5::layout::RankLayout rl = Tag::Layout::kRank0;
    const int N = rl.padded_rows, hidden = Tag::kEntry.hidden;
    // (K, T list): full size K = hidden; quick mode K = 256 and, at tp 8, one decode row at K = hidden
    std::vector<std::pair<int, std::vector<int>>> runs;
    if (!quick) {
      runs.push_back({hidden, {1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 127, 128, 129, 256, 1000, 4096}});
    } else {
      // T = 1: the CUDA-core kGemv kernel (kAuto); 4, 6 and 9: the tensor-core one by T with one
      // and two n8 tiles; 17: the refusal
      runs.push_back({256, {1, 4, 6, 9, 17, 129}});
      if (tp == 8) runs.push_back({hidden, {1}});
    }
    for (const auto& [K, Ts] : runs) {
      const int ldw = K;
      const int max_T = *std::max_element(Ts.begin(), Ts.end());
      std::vector<bf16> hw(static_cast<std::size_t>(N) * ldw);
      fill_random(hw, 0.125f);
      DevBuf dw(hw.size() * 2);
      GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
      const std::size_t ws = step5::ops::gemm_workspace_bytes(max_T, N, K);
      DevBuf dws(ws);
      GPU_CHECK(cudaMemset(dws.p, 0, std::max<std::size_t>(ws, 256)));
      for (int T : Ts) {
        // ldx > K and ldc > N: row strides larger than the rows.
        const int ldx = K + 64, ldc = N + 24;
        const std::string name = std::string(Tag::kEntry.name) + "/tp" + std::to_string(tp) + "/N" +
                                 std::to_string(N) + (K != hidden ? "/K" + std::to_string(K) : "") + "/T" +
                                 std::to_string(T);
        const bool many = T == 17 || T == 129 || (T == 1000 && tp == 8) || (T == 256 && tp == 8);
        run_case(name, T, N, K, ldx, ldw, ldc, hw, dw.as<bf16>(), dws.p, ws, many ? all_variants() : kAllPaths);
      }
    }
  });
}

GPU_CASE("gemm: odd shapes (o_proj, ldw > K, K % 64 != 0, unaligned -> generic)") {
  struct Shape { int T, N, K, ldx, ldw, ldc; };
  const Shape shapes[] = {
      {64, 4096, 1536, 1536, 1536, 4096},    // o_proj at tp 8 (step5_preview: Hl*D = 8*192)
      {1000, 4096, 1024, 1024, 1024, 4096},  // o_proj (dsa tp 8: 8*128)
      {33, 1000, 4104, 4112, 4120, 1002},    // K not a multiple of 64, ldw > K
      {300, 517, 200, 208, 200, 520},        // odd N, small K
      {5, 37, 1003, 1005, 1003, 41},         // K, ld not multiples of 8 -> generic only
      {130, 301, 77, 77, 79, 301},           // odd everything -> generic only
      {3, 1000, 4104, 4112, 4120, 1002},     // decode rows (gemv; both kernels): odd N, K not a multiple of 256
      {1, 1000, 4104, 4112, 4120, 1002},     // gemv at T = 1: the CUDA-core kernel, and the tensor-core one forced
      {2, 4096, 12288, 12288, 12288, 4096},  // o_proj at tp 1 decode (64 * 192): 6 K tiles per row on the CUDA cores, 12 on the tensor cores
      {4, 517, 200, 208, 200, 520},          // gemv with fewer 16-byte chunks than lanes; tensor cores: 13 k16 steps, the last one 8 values in K
      {9, 517, 200, 208, 200, 520},          // gemv (tensor cores): two n8 tiles, the second one token
      {16, 1000, 4104, 4112, 4120, 1002},    // gemv (tensor cores): T = 16, 9 tiles of 512 values, the last one 8 (half a k16 step)
      {8, 100, 12288, 12288, 12288, 100},    // gemv (tensor cores): X 200960 bytes, 3 stages of 256-value tiles
      {12, 100, 12288, 12288, 12288, 100},   // gemv refused: X would need 303424 bytes
      {2, 70, 51136, 51136, 51136, 72},      // gemv near the limit (CUDA cores); the tensor cores (also by T) refused (208800 bytes)
      {2, 70, 50112, 50112, 50112, 72},      // gemv (tensor cores) at its limit (204704 bytes): 3 stages, 196 tiles of 256 values, the last 192
      {4, 100, 25600, 25600, 25600, 100},    // gemv (CUDA cores): X at the shared-memory limit, a ring of 3 stages of 512-value tiles; refused by T (tensor cores: 209088 bytes)
      {1, 333, 40960, 40960, 40960, 334},    // gemv (T = 1): 20 K tiles per row, fewer rows than SMs x 8
      {1, 129, 102400, 102400, 102400, 130}, // gemv (T = 1): X at the limit, 200 K tiles of 512 values, one row per CTA
      // the CUDA-core kernel's ring: two row blocks per CTA, 4 K tiles (the last one 8 values), more
      // units than stages (wraparound), ldw > K, at T = 4 (5 stages) and T = 2 (6 stages)
      {4, 2000, 6152, 6160, 6168, 2002},
      {2, 2000, 6152, 6160, 6168, 2002},
      {1, 300, 90112, 90112, 90120, 302},    // gemv (T = 1): 1024-value tiles (3 stages beside X)
  };
  for (Shape s : shapes) {
    if (step5_test::quick()) s.T = std::min(s.T, 129);
    std::vector<bf16> hw(static_cast<std::size_t>(s.N) * s.ldw);
    fill_random(hw, 0.125f);
    DevBuf dw(hw.size() * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    const std::size_t ws = step5::ops::gemm_workspace_bytes(s.T, s.N, s.K);
    DevBuf dws(ws);
    GPU_CHECK(cudaMemset(dws.p, 0, std::max<std::size_t>(ws, 256)));
    const bool fast = s.K % 8 == 0 && s.ldx % 8 == 0 && s.ldw % 8 == 0 && s.ldc % 2 == 0;
    const std::vector<Variant> paths =
        fast ? all_variants()
             : std::vector<Variant>{{GemmPath::kAuto}, {GemmPath::kAuto, 0, 0, false}, {GemmPath::kGeneric},
                                    {GemmPath::kCublasLt}, {GemmPath::kGemv}};
    const std::string name = "T" + std::to_string(s.T) + "/N" + std::to_string(s.N) + "/K" + std::to_string(s.K) +
                             "/ld" + std::to_string(s.ldx) + "," + std::to_string(s.ldw) + "," + std::to_string(s.ldc);
    run_case(name, s.T, s.N, s.K, s.ldx, s.ldw, s.ldc, hw, dw.as<bf16>(), dws.p, ws, paths);
  }
}

#if !defined(STEP5_NO_CUBLASLT)
GPU_CASE("gemm: every cuBLASLt algorithm the library plans reduces K splits in fp32 (SPEC §3), odd and layout shapes") {
  // Without the fp32-only mask the cuBLASLt rows of the narrow long-K odd shapes put 2-57 outputs
  // 5-8 % off (twenty-seventh session, H100); lt_build must re-query with only fp32 reductions where
  // the first answer reduces in the output type and refuse any answer that still does. The odd
  // shapes may find no algorithm; every layout shape must find one.
  const std::vector<std::tuple<int, int, int>> odd = {{8, 100, 12288}, {12, 100, 12288}, {2, 70, 51136},
                                                      {4, 100, 25600}, {1, 129, 102400}, {16, 1000, 4104}};
  std::vector<std::tuple<int, int, int>> shapes = odd;
  for_each_layer_gemm([&](const std::string&, int, const char*, int N, int K) {
    for (int T : {1, 2, 4, 8, 16, 64, 1000}) shapes.emplace_back(T, N, K);
  });
  int device = 0;
  GPU_CHECK(cudaGetDevice(&device));
  int found = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto [T, N, K] = shapes[i];
    const std::size_t ws = step5::ops::gemm_workspace_bytes(T, N, K);
    DevBuf dx(static_cast<std::size_t>(T) * K * 2), dw(static_cast<std::size_t>(N) * K * 2),
        dc(static_cast<std::size_t>(T) * N * 2), dws(ws);
    GemmParams p;
    p.x = dx.as<bf16>(), p.w = dw.as<bf16>(), p.c = dc.as<bf16>();
    p.tokens = T, p.n = N, p.k = K, p.ldx = K, p.ldw = K, p.ldc = N;
    p.workspace = dws.p, p.workspace_bytes = ws;
    const step5::ops::gemm_detail::LtEntry* e = nullptr;
    cublasLtHandle_t handle = nullptr;
    const step5::Status st = step5::ops::gemm_detail::lt_entry(p, device, &e, &handle);
    EXPECT(st.ok(), "T=%d N=%d K=%d: lt_entry: %s", T, N, K, st.to_string().c_str());
    EXPECT(!st.ok() || i < odd.size() || e->found, "T=%d N=%d K=%d (a layout shape): cuBLASLt has no algorithm", T, N,
           K);
    if (!st.ok() || !e->found) continue;
    ++found;
    EXPECT(!step5::ops::gemm_detail::lt_reduces_in_output_type(e->algo),
           "T=%d N=%d K=%d: the planned cuBLASLt algorithm reduces K splits in bf16", T, N, K);
  }
  std::printf("  cuBLASLt algorithms checked for %d of %zu shapes (%zu odd)\n", found, shapes.size(),
              odd.size());
}
#endif

GPU_CASE("gemm: split-K output bit-identical over 50 launches (quick: 5) with other kernels running") {
  // The last split to arrive sums every split's partial in split order, so the arrival order
  // (which other work on the device changes) must not change a bit of C. Checked two ways: C equals,
  // bit for bit, the fp32 sum of the partials left in the workspace taken in split order 0, 1, ...
  // (fails whenever a reduction depends on which split arrived last), and C is the same over
  // repeated launches while another kernel streams memory on a second stream.
  const int K = 4096, N = 4608;
  for (int T : {1, 8}) {
    const DenseOperands op(T, N, K);
    const std::vector<bf16>&hw = op.hw, &hx = op.hx;
    GemmParams p = op.params();
    p.path = GemmPath::kSplitK;
    p.split_k = 8;
    p.config = 1;  // row 0 of kGemmSplitKTiles: 64 W rows x 16 tokens per tile (the partials' layout below)
    static_assert(step5::ops::kGemmSplitKTiles[0].w_rows == 64 && step5::ops::kGemmSplitKTiles[0].tokens == 16);
    step5::ops::GemmPlan plan;
    const step5::Status planned = step5::ops::gemm_plan(p, &plan);
    EXPECT(planned.ok() && plan.split_k == 8 && plan.workspace_bytes > 0, "T=%d: plan %s, split_k %d", T,
           planned.to_string().c_str(), plan.split_k);
    const std::size_t ws = plan.workspace_bytes;
    DevBuf dws(ws);
    GPU_CHECK(cudaMemset(dws.p, 0, ws));
    p.workspace = dws.p;
    p.workspace_bytes = ws;
    std::vector<std::uint16_t> first, cur;
    const int repeats = step5_test::quick() ? 5 : 50;
    const int changed = repeat_with_noise(p, repeats, "T=" + std::to_string(T) + " split-K gemm", &first,
                                          &cur, nullptr);
    EXPECT(changed == 0, "T=%d: split-K output changed in %d of %d repeated launches", T, changed, repeats - 1);
    {  // C == bf16(fp32 sum of the 8 partials in split order), from the last launch's workspace
      constexpr int BM = 64, BN = 16, kSplits = 8;
      constexpr int kThreads = step5::kernels::sm90::StreamConfig<BM, BN>::kThreads;
      const int gx = (N + BM - 1) / BM, gy = (T + BN - 1) / BN;
      std::vector<float> part(static_cast<std::size_t>(gx) * gy * kSplits * BM * BN);
      EXPECT(step5::ops::kGemmCounterBytes + part.size() * 4 <= ws, "T=%d: workspace smaller than the partials", T);
      GPU_CHECK(cudaMemcpy(part.data(), static_cast<char*>(dws.p) + step5::ops::kGemmCounterBytes, part.size() * 4,
                           cudaMemcpyDeviceToHost));
      int mismatched = 0, checked = 0;
      for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx)
          for (int tid = 0; tid < kThreads; ++tid)
            for (int j = 0; j < BN / 8; ++j)
              for (int r = 0; r < 4; ++r) {
                const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
                const int n = bx * BM + warp * 16 + g + ((r >> 1) << 3), t = by * BN + j * 8 + 2 * q + (r & 1);
                if (n >= N || t >= T) continue;
                float sum = 0.f;
                for (int z = 0; z < kSplits; ++z)
                  sum += part[((static_cast<std::size_t>(by) * gx + bx) * kSplits + z) * (BM * BN) +
                              static_cast<std::size_t>(j * 4 + r) * kThreads + tid];
                mismatched += step5::float_to_bf16_bits(sum) != cur[static_cast<std::size_t>(t) * N + n];
                ++checked;
              }
      EXPECT(checked == T * N, "T=%d: reconstructed %d of %d outputs", T, checked, T * N);
      EXPECT(mismatched == 0, "T=%d: %d outputs differ from the in-order sum of the split-K partials", T, mismatched);
    }
    // and it is the right product: spot-check against fp64 on a few outputs (NaN counts as wrong)
    const int bad = fp64_spot_check_failures(hx, hw, first, T, N, K, 1);
    EXPECT(bad == 0, "T=%d: %d spot-checked outputs off the fp64 product", T, bad);
  }
}

GPU_CASE("gemm: wgmma split-K, every tile width x split 1..8 at odd shapes, vs CPU reference") {
  // T % 64 != 0 (partial 16-row slabs, a token tile whose second half is empty or partly valid),
  // N % BN != 0 for every BN, K with a partial last k-tile; T = 64 (second half empty) with one
  // k-tile per split at 8 splits; an o_proj-like shape. Every forced split runs as planned.
  struct Shape { int T, N, K, ldx, ldw, ldc; };
  const Shape shapes[] = {
      {100, 1000, 1000, 1000, 1000, 1000},  // 16 k-tiles, the last 40 wide
      {200, 520, 2056, 2064, 2056, 522},    // two token tiles (the second 72 rows), 33 k-tiles
      {64, 768, 512, 512, 512, 776},        // 8 k-tiles: split 8 = one k-tile per unit
      {40, 4096, 1536, 1536, 1536, 4096},   // o_proj at tp 8 (Hl*D = 8*192), T = 40
  };
  for (const Shape& sh : shapes) {
    std::vector<bf16> hw(static_cast<std::size_t>(sh.N) * sh.ldw);
    fill_random(hw, 0.125f);
    DevBuf dw(hw.size() * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    std::vector<Variant> variants;
    for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)); ++c)
      for (int sp = 1; sp <= 8; ++sp) {
        variants.push_back({GemmPath::kWgmma, c, sp});
        // the plan runs the forced tile width and split factor (normalised: no empty split)
        expect_forced_wgmma_plan(dw.as<bf16>(), sh.T, sh.N, sh.K, sh.ldx, sh.ldw, sh.ldc, c, sp);
      }
    const std::string name = "wgmma-sk/T" + std::to_string(sh.T) + "/N" + std::to_string(sh.N) + "/K" +
                             std::to_string(sh.K);
    // run_case gives each variant a zero-filled workspace of the plan's size
    run_case(name, sh.T, sh.N, sh.K, sh.ldx, sh.ldw, sh.ldc, hw, dw.as<bf16>(), nullptr, 0, variants);
  }
}

GPU_CASE("gemm: wgmma 64-token kinds at T = 1, 17, 63, 64, every split factor, odd N and K, vs CPU reference") {
  // The kinds whose two consumer warpgroups share 64 token rows and split the tile's columns
  // (kGemmWgmmaTiles rows with tokens == 64): T in {1, 17, 63, 64} (one token tile, partial
  // 16-row slabs), N not a multiple of any tile width (a partial column half, and at N = 120 a
  // second half with no column at all for the 256-wide kind), K an odd multiple of 8 (a partial
  // last 64-wide box; K = 1032 and 136 give an odd box count, so a 2-box stage ends with one box;
  // K = 8 is a single partial box), padded row strides; every split factor the kind can take
  // (1 .. its k-tiles), each checked to run as planned.
  struct Shape { int T, N, K; };
  const Shape shapes[] = {{1, 1000, 1032}, {17, 1000, 1032}, {63, 520, 1000}, {64, 1000, 1032},
                          {64, 120, 136},  {17, 300, 8},     {63, 1000, 200}};
  for (const Shape& sh : shapes) {
    const int ldx = sh.K + 8, ldw = sh.K + 16, ldc = sh.N + 6;
    std::vector<bf16> hw(static_cast<std::size_t>(sh.N) * ldw);
    fill_random(hw, 0.125f);
    DevBuf dw(hw.size() * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    std::vector<Variant> variants;
    int kinds = 0;
    for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)); ++c) {
      if (step5::ops::kGemmWgmmaTiles[c - 1].tokens != 64) continue;
      ++kinds;
      variants.push_back({GemmPath::kWgmma, c, 0});  // the planned split
      const int max_sp = wgmma_k_tiles(sh.K, c);
      for (int sp = 1; sp <= max_sp; ++sp) {
        // quick (sanitizer) mode: splits 1, 2, 3 and the most the kind can take
        if (step5_test::quick() && sp > 3 && sp < max_sp) continue;
        variants.push_back({GemmPath::kWgmma, c, sp});
        expect_forced_wgmma_plan(dw.as<bf16>(), sh.T, sh.N, sh.K, ldx, ldw, ldc, c, sp);
      }
    }
    EXPECT(kinds > 0, "kGemmWgmmaTiles has no 64-token kind");
    const std::string name = "wgmma-m64/T" + std::to_string(sh.T) + "/N" + std::to_string(sh.N) + "/K" +
                             std::to_string(sh.K);
    run_case(name, sh.T, sh.N, sh.K, ldx, ldw, ldc, hw, dw.as<bf16>(), nullptr, 0, variants);
  }
}

GPU_CASE("gemm: the plan splits K on the wgmma path where tiles leave SMs idle; gemm_workspace_bytes covers it") {
  int device = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&device));
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  alignas(16) static const bf16 kAligned[8] = {};  // gemm_plan reads only the pointers' alignment
  auto plan_for = [&](int T, int N, int K) {
    GemmParams p;
    p.x = kAligned, p.w = kAligned, p.c = const_cast<bf16*>(kAligned);
    p.tokens = T, p.n = N, p.k = K, p.ldx = K, p.ldw = K, p.ldc = N;
    p.allow_cublaslt = false;  // this library's plan (the cuBLASLt choice: the next case)
    step5::ops::GemmPlan plan;
    const step5::Status st = step5::ops::gemm_plan(p, &plan);
    EXPECT(st.ok(), "plan T=%d N=%d K=%d: %s", T, N, K, st.to_string().c_str());
    return plan;
  };
  step5::layout::for_each_layout([&](auto tag) {
    using Tag = decltype(tag);
    const int tp = Tag::kParallel.tp_size;
    const int N = Tag::Layout::kRank0.padded_rows, K = Tag::kEntry.hidden;
    const std::string g = std::string(Tag::kEntry.name) + "/tp" + std::to_string(tp);
    if (tp == 8) {
      // the narrow tp 8 fused shapes: 128-wide tiles leave most SMs idle at T <= 256 (issue 14)
      for (int T : {64, 128, 256}) {
        // the plan's kind × splits give at least sms / 3 work units (a 128 × 128 tiling alone gives
        // 28 / 23 of them at T = 64), i.e. it splits K or picks a narrower tile kind
        const step5::ops::GemmPlan plan = plan_for(T, N, K);
        EXPECT(plan.path == GemmPath::kWgmma && plan.config >= 1 &&
                   plan.config <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)),
               "%s T=%d: plan path %d config %d", g.c_str(), T, static_cast<int>(plan.path), plan.config);
        if (plan.path != GemmPath::kWgmma || plan.config < 1 ||
            plan.config > static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)))
          continue;
        const step5::ops::GemmWgmmaTile& tile = step5::ops::kGemmWgmmaTiles[plan.config - 1];
        const int units = (T + tile.tokens - 1) / tile.tokens * ((N + tile.w_rows - 1) / tile.w_rows) * plan.split_k;
        EXPECT(3 * units >= sms, "%s T=%d: plan config %d (%s) split_k %d: %d work units on %d SMs", g.c_str(), T,
               plan.config, step5::ops::gemm_wgmma_tile_name(tile).c_str(), plan.split_k, units, sms);
      }
    }
    // one allocation of gemm_workspace_bytes(max_T) serves every T <= max_T of the auto plan
    constexpr int kMaxT = 1100;
    const std::size_t ws = step5::ops::gemm_workspace_bytes(kMaxT, N, K, device);
    int over = 0, first_over = -1;
    for (int T = 1; T <= kMaxT; T += (T < 300 ? 1 : 7)) {
      const step5::ops::GemmPlan plan = plan_for(T, N, K);
      if (plan.workspace_bytes > ws && over++ == 0) first_over = T;
    }
    EXPECT(over == 0, "%s: %d plans need more than gemm_workspace_bytes(%d) = %zu (first at T = %d)", g.c_str(), over,
           kMaxT, ws, first_over);
  });
  // o_proj at T = 64 (N = hidden 4096, K = Hl*D = 64*192): 32 tiles of 128 -> split
  const step5::ops::GemmPlan o = plan_for(64, 4096, 12288);
  EXPECT(o.path == GemmPath::kWgmma && o.split_k > 1, "o_proj T=64: path %d split_k %d", static_cast<int>(o.path),
         o.split_k);
}

GPU_CASE("gemm: kAuto takes cuBLASLt where built in (fused projection and o_proj shapes, T 1..16384; kGemv where gemm_auto_takes_gemv: T = 1 on weights >= 4 MiB, T = 2..8 at K 4096 on >= 22 MiB outside 4096 < N < 8192, T = 9..16 at K 4096 on >= 128 MiB, X in windows per gemm_auto_gemv_config); allow_cublaslt = false keeps this library's kernels; cuBLASLt bit-identical over 20 launches with other kernels running") {
  alignas(16) static const bf16 kAligned[8] = {};  // gemm_plan reads only the pointers' alignment
  auto plan_of = [&](int T, int N, int K, bool allow) {
    GemmParams p;
    p.x = kAligned, p.w = kAligned, p.c = const_cast<bf16*>(kAligned);
    p.tokens = T, p.n = N, p.k = K, p.ldx = K, p.ldw = K, p.ldc = N;
    p.allow_cublaslt = allow;
    step5::ops::GemmPlan plan;
    const step5::Status st = step5::ops::gemm_plan(p, &plan);
    EXPECT(st.ok(), "plan T=%d N=%d K=%d: %s", T, N, K, st.to_string().c_str());
    return plan;
  };
#if defined(STEP5_NO_CUBLASLT)
  constexpr bool kLt = false;  // built without cuBLASLt: kAuto plans this library's kernels
#else
  constexpr bool kLt = true;
#endif
  for_each_layer_gemm([&](const std::string& g, int tp, const char* what, int N, int K) {
    for (int T : {1, 4, 8, 9, 16, 64, 1000, 16384}) {
      const step5::ops::GemmPlan a = plan_of(T, N, K, true), own = plan_of(T, N, K, false);
      // kGemv at T = 1 on weights of 4 MiB and more (K >= 512), at T = 2..8 at K 4096 on 22 MiB and
      // more outside 4096 < N < 8192, at T = 9..16 at K 4096 on 128 MiB and more, whatever
      // allow_cublaslt says
      const bool gemv = step5::ops::gemm_auto_takes_gemv(T, N, K);
      // the shapes measured faster than cuBLASLt at T = 4 and 8 (ops/gemm.hpp, thirty-fourth and
      // thirty-fifth sessions): the fused projection at tp 1, 2 and 8, not at tp 4; o_proj only
      // dsa_h64_kv8_d128's at tp 2 (K 4096), never at tp 1 or 8
      const bool measured_tp = tp == 1 || tp == 8;
      const bool fused = std::string(what) == "fused";
      const bool dsa_oproj_tp2 = !fused && tp == 2 && K == 4096;
      EXPECT(!(T == 4 || T == 8) || !(fused ? tp <= 8 : measured_tp || dsa_oproj_tp2) ||
                 gemv == ((fused && tp != 4) || dsa_oproj_tp2),
             "%s %s tp %d T=%d: (N %d, K %d) kAuto's gemv rule %d, measured the other way", g.c_str(), what, tp, T, N,
             K, gemv ? 1 : 0);
      // T = 16 (thirty-fifth session, X in windows): the fused projection at tp 1 only; T = 9 was
      // not measured at all but lies between (taken on the same weights)
      EXPECT(!(T == 9 || T == 16) || !measured_tp || gemv == (tp == 1 && std::string(what) == "fused"),
             "%s %s tp %d T=%d: (N %d, K %d) kAuto's gemv rule %d, measured the other way", g.c_str(), what, tp, T, N,
             K, gemv ? 1 : 0);
      // the kernel kAuto's gemv plan runs: X in windows on the tp 1 and 2 fused weights at T = 4, 8
      // and 16, X whole at tp 8 (measured)
      EXPECT(!gemv || (a.config == step5::ops::gemm_auto_gemv_config(T, N, K) &&
                       (T == 1 ? a.config == step5::ops::kGemmGemvCudaCores
                               : (a.config == step5::ops::kGemmGemvTensorCoresWindowed) == (tp <= 2 || T > 8) ||
                                     !fused || tp > 8)),
             "%s %s tp %d T=%d: kAuto's gemv plan config %d", g.c_str(), what, tp, T, a.config);
      const GemmPath mine = gemv ? GemmPath::kGemv : T > 32 ? GemmPath::kWgmma : GemmPath::kSplitK;
      const GemmPath want = kLt && !gemv ? GemmPath::kCublasLt : mine;
      // the shapes measured faster than cuBLASLt (ops/gemm.hpp): both GEMMs at every tp, T = 1
      EXPECT(T != 1 || gemv,
             "%s %s tp %d T=1: (N %d, K %d) is not kAuto's gemv shape", g.c_str(), what, tp, N, K);
      EXPECT(a.path == want, "%s %s T=%d: kAuto planned %s, expected %s", g.c_str(), what, T, path_name(a.path),
             path_name(want));
      EXPECT(own.path == mine, "%s %s T=%d: allow_cublaslt = false planned %s",
             g.c_str(), what, T, path_name(own.path));
    }
  });
#if !defined(STEP5_NO_CUBLASLT)
  // a config or split_k override means this library's kernels even with allow_cublaslt
  {
    GemmParams p;
    p.x = kAligned, p.w = kAligned, p.c = const_cast<bf16*>(kAligned);
    p.tokens = 64, p.n = 3472, p.k = 4096, p.ldx = 4096, p.ldw = 4096, p.ldc = 3472;
    p.split_k = 2;
    step5::ops::GemmPlan plan;
    const step5::Status st = step5::ops::gemm_plan(p, &plan);
    EXPECT(st.ok() && plan.path == GemmPath::kWgmma && plan.split_k == 2, "kAuto + split_k 2: %s path %s split %d",
           st.to_string().c_str(), path_name(plan.path), plan.split_k);
  }
  // bit-identical over repeated launches with other kernels running, the right product, workspace
  // counters untouched: the step5_preview tp 8 and tp 1 decode shapes (T = 64) and a prefill one
  const int quick_reps = step5_test::quick() ? 5 : 20;
  for (const auto& [T, N, K] : {std::tuple{64, 3472, 4096}, std::tuple{64, 18512, 4096}, std::tuple{1000, 4096, 1536}}) {
    const DenseOperands op(T, N, K);
    const std::vector<bf16>&hw = op.hw, &hx = op.hx;
    const std::size_t ws = step5::ops::gemm_workspace_bytes(T, N, K);
    EXPECT(ws >= step5::ops::kGemmCounterBytes + step5::ops::kGemmCublasLtWorkspaceBytes,
           "gemm_workspace_bytes(%d, %d, %d) = %zu does not cover the cuBLASLt workspace", T, N, K, ws);
    DevBuf dws(ws);
    GPU_CHECK(cudaMemset(dws.p, 0, ws));
    GemmParams p = op.params();
    p.workspace = dws.p, p.workspace_bytes = ws;
    step5::ops::GemmPlan plan;
    const step5::Status st = step5::ops::gemm_plan(p, &plan);
    EXPECT(st.ok() && plan.path == GemmPath::kCublasLt, "T=%d N=%d: %s path %s", T, N, st.to_string().c_str(),
           path_name(plan.path));
    std::vector<std::uint16_t> first, last;
    int counters_left = 0;
    const std::string what = "cuBLASLt T=" + std::to_string(T) + " N=" + std::to_string(N);
    const int changed = repeat_with_noise(p, quick_reps, what, &first, &last, &counters_left);
    EXPECT(changed == 0, "%s: %d of %d launches differ from the first", what.c_str(), changed, quick_reps - 1);
    EXPECT(counters_left == 0, "%s: %d split-K counters written", what.c_str(), counters_left);
    const int bad = fp64_spot_check_failures(hx, hw, first, T, N, K, T > 100 ? 37 : 1);
    EXPECT(bad == 0, "%s: %d spot-checked outputs off the fp64 product", what.c_str(), bad);
    std::printf("  %-28s %d launches bit-identical: %s\n", what.c_str(), quick_reps, changed == 0 ? "ok" : "FAIL");
  }
#endif
}

GPU_CASE("gemm: gemv bit-identical over 20 launches (quick: 5) with other kernels running, fp64 spot checks") {
  // The forced kGemv path: each lane sums its chunks in order and the warp's butterfly is fixed
  // (the tensor-core kernel's k16 steps and warp order too), so C must not change with what else
  // runs; the step5_preview fused projection (tp 8, tp 1) and o_proj (tp 1: 6 K tiles per row on
  // the CUDA cores, 24 of 512 values on the tensor cores at T = 4) shapes at T = 1, 4, 9 and 16
  const int reps = step5_test::quick() ? 5 : 20;
  // (config: the kernel forced, 0 = by T (the CUDA cores at T = 1, else the tensor cores); the
  // tensor-core one also at T = 1 on o_proj's long rows, the CUDA-core one at T = 4)
  for (const auto& [T, N, K, config] :
       {std::tuple{1, 3472, 4096, 0}, std::tuple{4, 3472, 4096, step5::ops::kGemmGemvCudaCores},
        std::tuple{1, 18512, 4096, 0},
        std::tuple{4, 3472, 4096, step5::ops::kGemmGemvTensorCores},
        std::tuple{16, 18512, 4096, 0}, std::tuple{9, 3472, 4096, 0}, std::tuple{1, 4096, 12288, 0},
        std::tuple{1, 4096, 12288, step5::ops::kGemmGemvTensorCores}, std::tuple{4, 4096, 12288, 0},
        std::tuple{16, 18512, 4096, step5::ops::kGemmGemvTensorCoresWindowed},
        std::tuple{8, 4096, 12288, step5::ops::kGemmGemvTensorCoresWindowed},
        std::tuple{16, 4096, 12288, step5::ops::kGemmGemvTensorCoresWindowed}}) {
    const DenseOperands op(T, N, K);
    GemmParams p = op.params();
    p.path = GemmPath::kGemv;
    p.config = config;
    step5::ops::GemmPlan plan;
    const step5::Status st = step5::ops::gemm_plan(p, &plan);
    EXPECT(st.ok() && plan.path == GemmPath::kGemv && plan.workspace_bytes == 0, "T=%d N=%d K=%d: %s path %s", T, N, K,
           st.to_string().c_str(), path_name(plan.path));
    std::vector<std::uint16_t> first, last;
    const std::string what = "gemv T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                             (config != 0 ? " config=" + std::to_string(config) : std::string());
    const int changed = repeat_with_noise(p, reps, what, &first, &last, nullptr);
    EXPECT(changed == 0, "%s: %d of %d launches differ from the first", what.c_str(), changed, reps - 1);
    const int bad = fp64_spot_check_failures(op.hx, op.hw, first, T, N, K, 1);
    EXPECT(bad == 0, "%s: %d spot-checked outputs off the fp64 product", what.c_str(), bad);
    std::printf("  %-32s %d launches bit-identical: %s\n", what.c_str(), reps, changed == 0 ? "ok" : "FAIL");
  }
}

GPU_CASE("gemm: kAuto's kGemv runs its plan's kernel (X whole or in windows): bits equal to that config forced, the fp64 product") {
  // kAuto takes kGemv on these shapes (gemm_auto_takes_gemv) and names its kernel in the plan
  // (gemm_auto_gemv_config): the launch must run that kernel. X whole and X in windows sum in
  // different orders, so their bits differ (checked where the shape has 4 windows of 16 x 18512
  // outputs), and kAuto's output must equal the planned config's, forced, bit for bit.
  constexpr int kTensor = step5::ops::kGemmGemvTensorCores, kWin = step5::ops::kGemmGemvTensorCoresWindowed;
  for (const auto& [T, N, want] : {std::tuple{16, 18512, kWin}, std::tuple{4, 18512, kWin}, std::tuple{8, 9512, kWin},
                                   std::tuple{6, 18512, kTensor}, std::tuple{4, 3472, kTensor}}) {
    const int K = 4096;
    const DenseOperands op(T, N, K);
    GemmParams p = op.params();
    step5::ops::GemmPlan plan;
    const step5::Status st = step5::ops::gemm_plan(p, &plan);
    EXPECT(st.ok() && plan.path == GemmPath::kGemv && plan.config == want,
           "kAuto T=%d N=%d: %s path %s config %d, expected gemv config %d", T, N, st.to_string().c_str(),
           path_name(plan.path), plan.config, want);
    const std::size_t elems = static_cast<std::size_t>(T) * N;
    std::vector<std::uint16_t> got[3];  // kAuto, the planned config forced, the other one forced
    for (int run = 0; run < 3; ++run) {
      GemmParams q = p;
      if (run > 0) {
        q.path = GemmPath::kGemv;
        q.config = run == 1 ? want : (want == kWin ? kTensor : kWin);
      }
      GPU_CHECK(cudaMemset(q.c, 0xff, elems * 2));  // poison (NaN)
      const step5::Status ls = step5::ops::gemm_bf16(q, nullptr);
      EXPECT(ls.ok(), "T=%d N=%d run %d: %s", T, N, run, ls.to_string().c_str());
      GPU_CHECK(cudaDeviceSynchronize());
      got[run].resize(elems);
      GPU_CHECK(cudaMemcpy(got[run].data(), q.c, elems * 2, cudaMemcpyDeviceToHost));
    }
    EXPECT(got[0] == got[1], "kAuto T=%d N=%d: output differs from config %d forced", T, N, want);
    if (T == 16) EXPECT(got[0] != got[2], "kAuto T=%d N=%d: X whole and X in windows gave the same bits", T, N);
    const int bad = fp64_spot_check_failures(op.hx, op.hw, got[0], T, N, K, 1);
    EXPECT(bad == 0, "kAuto T=%d N=%d: %d spot-checked outputs off the fp64 product", T, N, bad);
    std::printf("  kAuto gemv T=%-2d N=%-5d config %d: %s\n", T, N, plan.config,
                got[0] == got[1] && bad == 0 ? "ok" : "FAIL");
  }
}

GPU_CASE("gemm: K = 0: forced gemv is refused naming k, kAuto writes zeros; both gemv kernels at N = 1 and 7, and a row's bits independent of how the rows are shared out") {
  // K = 0 is not a fast-path shape (the kGemv kernels never see it): the forced path is refused
  // with kInvalidArgument naming "k == 0", and kAuto writes C = 0 (poisoned first), T = 1..4
  for (int T = 1; T <= 4; ++T) {
    DevBuf dx(64), dw(64), dc(static_cast<std::size_t>(T) * 302 * 2);
    GemmParams p;
    p.x = dx.as<bf16>(), p.w = dw.as<bf16>(), p.c = dc.as<bf16>();
    p.tokens = T, p.n = 300, p.k = 0, p.ldx = 8, p.ldw = 8, p.ldc = 302;
    p.path = GemmPath::kGemv;
    p.config = step5::ops::kGemmGemvCudaCores;
    const step5::Status refused = step5::ops::gemm_bf16(p, nullptr);
    EXPECT(refused.code() == step5::StatusCode::kInvalidArgument && refused.message().find("k == 0") != std::string::npos,
           "gemv K = 0 T=%d: expected kInvalidArgument naming k == 0, got %s", T, refused.to_string().c_str());
    p.path = GemmPath::kAuto;
    p.config = 0;
    GPU_CHECK(cudaMemset(dc.p, 0xff, static_cast<std::size_t>(T) * 302 * 2));
    const step5::Status st = step5::ops::gemm_bf16(p, nullptr);
    EXPECT(st.ok(), "kAuto K = 0 T=%d: %s", T, st.to_string().c_str());
    GPU_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint16_t> hc(static_cast<std::size_t>(T) * 302);
    GPU_CHECK(cudaMemcpy(hc.data(), dc.p, hc.size() * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < 302; ++n) bad += hc[static_cast<std::size_t>(t) * 302 + n] != (n < 300 ? 0x0000 : 0xFFFF);
    EXPECT(bad == 0, "kAuto K = 0 T=%d: %d outputs not 0 (or padding not left poisoned)", T, bad);
  }
  constexpr int kCuda = step5::ops::kGemmGemvCudaCores, kTensor = step5::ops::kGemmGemvTensorCores,
                kWin = step5::ops::kGemmGemvTensorCoresWindowed;
  // Fewer rows than a ring stage holds: N = 7 (CUDA cores: one CTA per row, 7 of 8 consumer warps
  // idle; tensor cores: one CTA, 9 of the 16 rows of its stages stale) and N = 1 (one CTA; CUDA
  // cores: a 2048-value tile and an 8-value one; tensor cores: tiles of 1024 values, the last one
  // 8, i.e. half a k16 step), against the CPU reference
  for (const auto& [T, N, K, config] :
       {std::tuple{3, 7, 4096, kCuda}, std::tuple{1, 1, 2056, kCuda}, std::tuple{4, 1, 2056, kCuda},
        std::tuple{3, 7, 4096, kTensor}, std::tuple{1, 1, 2056, kTensor}, std::tuple{13, 7, 2056, kTensor},
        std::tuple{16, 1, 2056, kTensor}, std::tuple{3, 7, 4096, kWin}, std::tuple{1, 1, 2056, kWin},
        std::tuple{13, 7, 2056, kWin}, std::tuple{16, 1, 2056, kWin}}) {
    const int ldc = N + 1 + (N + 1) % 2;  // even, with a padding column left poisoned
    std::vector<bf16> hw(static_cast<std::size_t>(N) * K), hx(static_cast<std::size_t>(T) * K);
    fill_random(hw, 0.125f);
    fill_random(hx, 1.0f);
    DevBuf dw(hw.size() * 2), dx(hx.size() * 2), dc(static_cast<std::size_t>(T) * ldc * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    const step5::Status st = gemv_forced(dx, dw, dc, T, N, K, K, ldc, config);
    EXPECT(st.ok(), "gemv config %d T=%d N=%d K=%d: %s", config, T, N, K, st.to_string().c_str());
    std::vector<bf16> hc(static_cast<std::size_t>(T) * ldc);
    GPU_CHECK(cudaMemcpy(hc.data(), dc.p, hc.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<int> rows;
    const std::vector<float> ref = reference_all_rows(T, N, K, hx, K, hw, K, &rows);
    const Judgement j = judge_output(ref, rows, N, ldc, hc);
    EXPECT(j.bad == 0, "gemv config %d T=%d N=%d K=%d: %lld of %lld elements off; first at t=%d n=%d: got %g, want %g",
           config, T, N, K, j.bad, j.checked, j.first_t, j.first_n, j.first_o, j.first_r);
  }
  // The same W rows 0..Nsmall-1 as the whole weight and as the first rows of a taller one, bit for
  // bit the same outputs (each row's sums run in an order fixed by T and K): N = 131 (CUDA cores one
  // row per CTA on 132 SMs, tensor cores 9 CTAs of 14-15 rows) against N = 1061 (8-9 rows per CTA,
  // or 67 CTAs of 15-16 rows: the rows in other CTAs, ring stages and row slots); on the tensor
  // cores also N = 3000 (about 23 rows per CTA: two row blocks, the partial tiles' buffer reused)
  // against N = 8000 (about 61: four blocks); X in windows (config 3) also N = 3000 against N =
  // 36000 (272-273 rows per CTA: 17-18 row blocks, two groups of the window sums). C's rows N + 1
  // or N + 2 apart (an even ldc, the fast path's), the padding column left poisoned
  for (const auto& [T, config, Nsmall, Nbig] :
       {std::tuple{1, kCuda, 131, 1061}, std::tuple{3, kCuda, 131, 1061}, std::tuple{1, kTensor, 131, 1061},
        std::tuple{5, kTensor, 131, 1061}, std::tuple{16, kTensor, 131, 1061}, std::tuple{8, kTensor, 3000, 8000},
        std::tuple{13, kTensor, 3000, 8000}, std::tuple{16, kWin, 131, 1061}, std::tuple{5, kWin, 3000, 36000},
        std::tuple{16, kWin, 3000, 36000}}) {
    // C's rows N + 1 or N + 2 apart (ldc even: the fast path's), the columns past N left poisoned
    const int K = 4104, ld = 4112, ldb = Nbig + 1 + (Nbig + 1) % 2, lds = Nsmall + 1 + (Nsmall + 1) % 2;
    std::vector<bf16> hw(static_cast<std::size_t>(Nbig) * ld), hx(static_cast<std::size_t>(T) * ld);
    fill_random(hw, 0.125f);
    fill_random(hx, 1.0f);
    DevBuf dw(hw.size() * 2), dx(hx.size() * 2), dc1(static_cast<std::size_t>(T) * ldb * 2),
        dc2(static_cast<std::size_t>(T) * lds * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    std::vector<std::uint16_t> big(static_cast<std::size_t>(T) * ldb), small(static_cast<std::size_t>(T) * lds);
    for (int which = 0; which < 2; ++which) {
      const int N = which == 0 ? Nbig : Nsmall, ldc = which == 0 ? ldb : lds;
      DevBuf& dc = which == 0 ? dc1 : dc2;
      const step5::Status st = gemv_forced(dx, dw, dc, T, N, K, ld, ldc, config);
      EXPECT(st.ok(), "gemv partition config %d T=%d N=%d: %s", config, T, N, st.to_string().c_str());
      std::vector<std::uint16_t>& out = which == 0 ? big : small;
      GPU_CHECK(cudaMemcpy(out.data(), dc.p, out.size() * 2, cudaMemcpyDeviceToHost));
    }
    int differ = 0, poison = 0, padding = 0;
    for (int t = 0; t < T; ++t) {
      for (int n = 0; n < Nsmall; ++n) {
        const std::uint16_t a = big[static_cast<std::size_t>(t) * ldb + n], b = small[static_cast<std::size_t>(t) * lds + n];
        differ += a != b;
        poison += b == 0xFFFF;
      }
      padding += big[static_cast<std::size_t>(t) * ldb + Nbig] != 0xFFFF;
      padding += small[static_cast<std::size_t>(t) * lds + Nsmall] != 0xFFFF;
    }
    EXPECT(differ == 0 && poison == 0 && padding == 0,
           "gemv config %d T=%d: rows 0..%d differ in %d outputs between N = %d and N = %d (%d unwritten, %d padding "
           "written)",
           config, T, Nsmall - 1, differ, Nbig, Nsmall, poison, padding);
    if (Nsmall >= 3000) {  // several row blocks per CTA: against the CPU reference as well
      std::vector<bf16> hs(small.size());
      std::memcpy(hs.data(), small.data(), small.size() * 2);
      std::vector<int> rows;
      const std::vector<float> ref = reference_all_rows(T, Nsmall, K, hx, ld, hw, ld, &rows);
      const Judgement j = judge_output(ref, rows, Nsmall, lds, hs);
      EXPECT(j.bad == 0, "gemv config %d T=%d N=%d: %lld of %lld elements off; first at t=%d n=%d: got %g, want %g",
             config, T, Nsmall, j.bad, j.checked, j.first_t, j.first_n, j.first_o, j.first_r);
    }
  }
}

GPU_CASE("gemm: gemv tensor cores: a tile's last half k16 step reads no stale ring bytes (+Inf left in the stage by an earlier unit), X whole and in windows") {
  // K = 3080: K tiles of 1024, 1024, 1024 and 8 values. X whole (config 2): 4 units per 16-row
  // block; at T = 3 the ring has 6 stages, so a CTA's block 1 ends with unit 7 on stage 1, which
  // held block 0's second tile (unit 1): the planted row is block 0's row 5 (40 rows per CTA). X
  // in windows of 1024 (config 3): per window every block of the CTA (64 rows: 4 blocks), so the
  // last window's unit 12 (block 0, 8 values) lands on stage 0, which held unit 6 (window 1 of
  // block 2): the planted row is block 2's row 5, CTA row 37. That row carries +Inf at values 1032
  // ... 1039: the bytes the later unit leaves in place and that its half k16 step would read as A
  // values 8 ... 15 (X is zero there: Inf · 0 = NaN unless the kernel zeroes them). N = SMs · rows
  // per CTA.
  const int T = 3, K = 3080;
  int dev = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (const auto& [config, per, planted, windows] :
       {std::tuple{step5::ops::kGemmGemvTensorCores, 40, 5, 1}, std::tuple{step5::ops::kGemmGemvTensorCoresWindowed, 64, 37, 4}}) {
    const step5::ops::GemmGemvRing ring = step5::ops::gemm_gemv_ring(T, K, config);
    EXPECT(ring.tile_k == 1024 && ring.stages == 6 && step5::ops::gemm_gemv_x_windows(K, config) == windows,
           "config %d, the premise: tile_k %lld (want 1024), stages %lld (want 6), windows %lld (want %d)", config,
           static_cast<long long>(ring.tile_k), static_cast<long long>(ring.stages),
           static_cast<long long>(step5::ops::gemm_gemv_x_windows(K, config)), windows);
    const int N = sms * per, ldc = N + 2;
    std::vector<bf16> hw(static_cast<std::size_t>(N) * K), hx(static_cast<std::size_t>(T) * K);
    fill_random(hw, 0.125f);
    fill_random(hx, 1.0f);
    for (int n = planted; n < N; n += per)
      for (int k = 1032; k < 1040; ++k) hw[static_cast<std::size_t>(n) * K + k] = step5::to_bf16(INFINITY);
    DevBuf dw(hw.size() * 2), dx(hx.size() * 2), dc(static_cast<std::size_t>(T) * ldc * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    const step5::Status st = gemv_forced(dx, dw, dc, T, N, K, K, ldc, config);
    EXPECT(st.ok(), "gemv config %d T=%d N=%d K=%d: %s", config, T, N, K, st.to_string().c_str());
    std::vector<bf16> hc(static_cast<std::size_t>(T) * ldc);
    GPU_CHECK(cudaMemcpy(hc.data(), dc.p, hc.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<int> rows;
    std::vector<float> ref = reference_all_rows(T, N, K, hx, K, hw, K, &rows);
    // the rows with +Inf in their own weights are non-finite; set them aside (0 on both sides) and
    // judge every other output, the rows that read the planted stage among them
    int finite_inf_rows = 0;
    for (int t = 0; t < T; ++t)
      for (int n = planted; n < N; n += per) {
        finite_inf_rows += (hc[static_cast<std::size_t>(t) * ldc + n].bits & 0x7f80) != 0x7f80;
        hc[static_cast<std::size_t>(t) * ldc + n] = step5::to_bf16(0.f);
        ref[static_cast<std::size_t>(t) * N + n] = 0.f;
      }
    EXPECT(finite_inf_rows == 0, "config %d: %d outputs of rows with +Inf weights are finite", config, finite_inf_rows);
    const Judgement j = judge_output(ref, rows, N, ldc, hc);
    EXPECT(j.bad == 0, "gemv config %d T=%d N=%d K=%d: %lld of %lld elements off; first at t=%d n=%d: got %g, want %g",
           config, T, N, K, j.bad, j.checked, j.first_t, j.first_n, j.first_o, j.first_r);
  }
}

GPU_CASE("gemm: wgmma split-K bit-identical over 20 launches (quick: 5) with other kernels running") {
  // Like the stream path's check: C equals, bit for bit, the fp32 sum of the partials left in the
  // workspace taken in split order 0, 1, ... (fails whenever the reduction depends on which unit
  // arrived last), C is the same over repeated launches while another kernel streams memory on a
  // second stream, the counters are zero after every launch, and C is the right product.
  // step5_preview tp 8 fused rows; partial 16-row slab at T = 100; the 64-token kinds also at T = 64
  // and 17 (one token tile; at T = 17 a partial slab) where both warpgroups share the token rows.
  const int N = 3472, K = 4096;
  for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)); ++c)
  for (int T : step5::ops::kGemmWgmmaTiles[c - 1].tokens == 64 ? std::vector<int>{64, 17, 100} : std::vector<int>{100}) {
    const int BN = step5::ops::kGemmWgmmaTiles[c - 1].w_rows;
    const std::string kind = step5::ops::gemm_wgmma_tile_name(step5::ops::kGemmWgmmaTiles[c - 1]) + " T=" + std::to_string(T);
    constexpr int kSplits = 4;
    const DenseOperands op(T, N, K);
    const std::vector<bf16>&hw = op.hw, &hx = op.hx;
    GemmParams p = op.params();
    p.path = GemmPath::kWgmma;
    p.config = c;
    p.split_k = kSplits;
    step5::ops::GemmPlan plan;
    const step5::Status planned = step5::ops::gemm_plan(p, &plan);
    const int n_tiles = (N + BN - 1) / BN, slabs = (T + 15) / 16;
    const std::size_t part_floats =
        static_cast<std::size_t>(step5::kernels::sm90::wgmma_partial_offset(kSplits, 0, 0, n_tiles, slabs, BN));
    EXPECT(planned.ok() && plan.split_k == kSplits &&
               plan.workspace_bytes == step5::ops::kGemmCounterBytes + part_floats * sizeof(float),
           "%s: plan %s, split_k %d, workspace %zu (want %zu)", kind.c_str(), planned.to_string().c_str(), plan.split_k,
           plan.workspace_bytes, step5::ops::kGemmCounterBytes + part_floats * sizeof(float));
    if (!planned.ok() || plan.split_k != kSplits) continue;
    const std::size_t ws = plan.workspace_bytes;
    DevBuf dws(ws);
    GPU_CHECK(cudaMemset(dws.p, 0, ws));
    p.workspace = dws.p;
    p.workspace_bytes = ws;
    std::vector<std::uint16_t> first, cur;
    const int repeats = step5_test::quick() ? 5 : 20;
    int counters_left = 0;
    const int changed = repeat_with_noise(p, repeats, kind + " wgmma split-K gemm",
                                          &first, &cur, &counters_left);
    EXPECT(changed == 0, "%s: wgmma split-K output changed in %d of %d repeated launches", kind.c_str(), changed,
           repeats - 1);
    EXPECT(counters_left == 0, "%s: %d arrival counters left non-zero after the launches", kind.c_str(), counters_left);
    {  // C == bf16(fp32 sum of the partials in split order), from the last launch's workspace
      std::vector<float> part(part_floats);
      GPU_CHECK(cudaMemcpy(part.data(), static_cast<char*>(dws.p) + step5::ops::kGemmCounterBytes, part.size() * 4,
                           cudaMemcpyDeviceToHost));
      int mismatched = 0, checked = 0;
      for (int nt = 0; nt < n_tiles; ++nt)
        for (int slab = 0; slab < slabs; ++slab)
          for (int j = 0; j < BN / 8; ++j)
            for (int lane = 0; lane < 32; ++lane)
              for (int e = 0; e < 4; ++e) {  // fragment order: float4 j*32 + lane = acc[4j .. 4j+3]
                const int t = slab * 16 + lane / 4 + 8 * (e >> 1), n = nt * BN + j * 8 + 2 * (lane % 4) + (e & 1);
                if (t >= T || n >= N) continue;
                float sum = 0.f;
                for (int z = 0; z < kSplits; ++z)
                  sum += part[static_cast<std::size_t>(
                                  step5::kernels::sm90::wgmma_partial_offset(z, nt, slab, n_tiles, slabs, BN)) +
                              static_cast<std::size_t>(j * 32 + lane) * 4 + e];
                mismatched += step5::float_to_bf16_bits(sum) != cur[static_cast<std::size_t>(t) * N + n];
                ++checked;
              }
      EXPECT(checked == T * N, "%s: reconstructed %d of %d outputs", kind.c_str(), checked, T * N);
      EXPECT(mismatched == 0, "%s: %d outputs differ from the in-order sum of the split-K partials", kind.c_str(),
             mismatched);
    }
    // and it is the right product: spot-check against fp64 on a few outputs (NaN counts as wrong)
    const int bad = fp64_spot_check_failures(hx, hw, first, T, N, K, 3);
    EXPECT(bad == 0, "%s: %d spot-checked outputs off the fp64 product", kind.c_str(), bad);
  }
}

GPU_CASE("gemm: back-to-back wgmma split-K launches reuse one workspace (counters reset), vs CPU reference") {
  // Three launches enqueued without a host synchronisation between them, on one workspace: two of
  // the same shape (the same counters reused) and a smaller T (other slabs, fewer tiles). A counter
  // left non-zero would make the next launch finish a tile early (from missing partials) or never
  // (poison left): every output is checked against the reference.
  const int N = 1000, K = 1000, ldc = 1008;
  constexpr int kSplits = 5;
  for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)); ++c) {
    std::vector<bf16> hw(static_cast<std::size_t>(N) * K);
    fill_random(hw, 0.125f);
    DevBuf dw(hw.size() * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    const int Ts[3] = {100, 100, 37};
    std::vector<bf16> hx[3], hc[3];
    std::unique_ptr<DevBuf> dx[3], dc[3];
    GemmParams p[3];
    std::size_t ws = 0;
    for (int i = 0; i < 3; ++i) {
      hx[i].resize(static_cast<std::size_t>(Ts[i]) * K);
      fill_random(hx[i], 1.0f);
      dx[i] = std::make_unique<DevBuf>(hx[i].size() * 2);
      dc[i] = std::make_unique<DevBuf>(static_cast<std::size_t>(Ts[i]) * ldc * 2);
      GPU_CHECK(cudaMemcpy(dx[i]->p, hx[i].data(), hx[i].size() * 2, cudaMemcpyHostToDevice));
      GPU_CHECK(cudaMemset(dc[i]->p, 0xff, static_cast<std::size_t>(Ts[i]) * ldc * 2));  // poison (NaN)
      p[i].x = dx[i]->as<bf16>(), p[i].w = dw.as<bf16>(), p[i].c = dc[i]->as<bf16>();
      p[i].tokens = Ts[i], p[i].n = N, p[i].k = K, p[i].ldx = K, p[i].ldw = K, p[i].ldc = ldc;
      p[i].path = GemmPath::kWgmma, p[i].config = c, p[i].split_k = kSplits;
      step5::ops::GemmPlan plan;
      const step5::Status st = step5::ops::gemm_plan(p[i], &plan);
      EXPECT(st.ok() && plan.split_k == expected_splits(K, kSplits, c) && plan.split_k > 1, "c%d T=%d: plan %s split_k %d",
             c, Ts[i], st.to_string().c_str(), plan.split_k);
      ws = std::max(ws, plan.workspace_bytes);
    }
    DevBuf dws(ws);
    GPU_CHECK(cudaMemset(dws.p, 0, ws));
    GPU_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 3; ++i) {
      p[i].workspace = dws.p;
      p[i].workspace_bytes = ws;
      const step5::Status st = step5::ops::gemm_bf16(p[i], nullptr);
      EXPECT(st.ok(), "c%d launch %d: %s", c, i, st.to_string().c_str());
    }
    GPU_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 3; ++i) {
      hc[i].resize(static_cast<std::size_t>(Ts[i]) * ldc);
      GPU_CHECK(cudaMemcpy(hc[i].data(), dc[i]->p, hc[i].size() * 2, cudaMemcpyDeviceToHost));
      std::vector<int> rows;
      const std::vector<float> ref = reference_all_rows(Ts[i], N, K, hx[i], K, hw, K, &rows);
      const Judgement j = judge_output(ref, rows, N, ldc, hc[i]);
      EXPECT(j.bad == 0, "c%d launch %d (T=%d): %lld of %lld elements off; first at t=%d n=%d: got %g, want %g", c, i,
             Ts[i], j.bad, j.checked, j.first_t, j.first_n, j.first_o, j.first_r);
    }
    std::vector<unsigned> counters(step5::ops::kGemmCounterBytes / sizeof(unsigned));
    GPU_CHECK(cudaMemcpy(counters.data(), dws.p, step5::ops::kGemmCounterBytes, cudaMemcpyDeviceToHost));
    const long long left = std::count_if(counters.begin(), counters.end(), [](unsigned v) { return v != 0; });
    EXPECT(left == 0, "c%d: %lld arrival counters left non-zero", c, left);
  }
}

GPU_CASE("gemm: plans and launches for device 1 made while device 0 is current (per-device kernel setup, the launch under that device), vs CPU reference") {
  // cudaFuncSetAttribute and the occupancy queries apply to the current device: the library's
  // per-device caches used to set device 0's limit and mark device 1 done, and a launch for
  // p.device = 1 ran under device 0. Needs two GPUs (else a note and nothing else).
  int count = 0;
  GPU_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("  one GPU: the two-device case is not exercised\n");
    return;
  }
  GPU_CHECK(cudaSetDevice(1));
  {
    const int T = 256, N = 1024, K = 2048;
    DenseOperands ops(T, N, K);  // on device 1
    DevBuf ws(64 << 20);
    cudaStream_t s1 = nullptr;
    GPU_CHECK(cudaStreamCreate(&s1));
    std::vector<float> ref(static_cast<std::size_t>(T) * N);
    step5::reference::gemm_bf16_f32out(T, N, K, ops.hx.data(), K, ops.hw.data(), K, ref.data(), N);
    std::vector<int> rows(T);
    for (int t = 0; t < T; ++t) rows[t] = t;
    GPU_CHECK(cudaSetDevice(0));
    for (const Variant v : {Variant{GemmPath::kSplitK, 6, 0, false}, Variant{GemmPath::kWgmma, 0, 0, false},
                            Variant{GemmPath::kWgmma, 1, 2, false}}) {
      GemmParams p = ops.params();
      p.path = v.path, p.config = v.config, p.split_k = v.split_k, p.allow_cublaslt = v.allow_cublaslt;
      p.device = 1, p.workspace = ws.p, p.workspace_bytes = 64 << 20;
      step5::ops::GemmPlan plan;
      const step5::Status ps = step5::ops::gemm_plan(p, &plan);
      EXPECT(ps.ok(), "plan for device 1 (%s config %d): %s", path_name(v.path), v.config, ps.to_string().c_str());
      GPU_CHECK(cudaSetDevice(1));
      GPU_CHECK(cudaMemset(ops.dc.p, 0xff, static_cast<std::size_t>(T) * N * 2));  // poison
      GPU_CHECK(cudaDeviceSynchronize());
      GPU_CHECK(cudaSetDevice(0));
      const step5::Status ls = step5::ops::gemm_bf16(p, s1);
      EXPECT(ls.ok(), "launch for device 1 (%s config %d): %s", path_name(v.path), v.config, ls.to_string().c_str());
      int cur = -1;
      GPU_CHECK(cudaGetDevice(&cur));
      EXPECT(cur == 0, "the caller's device changed to %d", cur);
      GPU_CHECK(cudaStreamSynchronize(s1));
      std::vector<bf16> hc(static_cast<std::size_t>(T) * N);
      GPU_CHECK(cudaMemcpy(hc.data(), ops.dc.p, hc.size() * 2, cudaMemcpyDeviceToHost));
      const Judgement j = judge_output(ref, rows, N, N, hc);
      EXPECT(j.bad == 0, "device 1 (%s config %d): %lld of %lld outside tolerance", path_name(v.path), v.config,
             j.bad, j.checked);
    }
    GPU_CHECK(cudaSetDevice(1));
    GPU_CHECK(cudaStreamDestroy(s1));
  }
  GPU_CHECK(cudaSetDevice(0));
}

GPU_CASE("gemm: C over X or W, or the workspace over X, W or C, is refused naming both, nothing launched") {
  // Every path writes C tile by tile while other CTAs (or cuBLASLt) still read X and W: C == X at
  // T = 2, N = K = 64 lets one weight tile's CTA write C's row 1 (X's row 1) before another reads
  // it. Refused after the plan, before the launch: X stays as it was (no kernel ran).
  DevBuf buf(1 << 20);
  bf16* b = buf.as<bf16>();
  GPU_CHECK(cudaMemset(b, 0x3c, 1 << 20));
  GemmParams p;
  p.tokens = 2, p.n = 64, p.k = 64, p.ldx = 64, p.ldw = 64, p.ldc = 64;
  p.x = b, p.w = b + 16384;  // X: 256 bytes, W: 8 KiB at 32 KiB
  const auto refused = [&](const GemmParams& q, const char* a, const char* o, const char* what) {
    const step5::Status s = step5::ops::gemm_bf16(q, nullptr);
    const std::string m = s.message();
    EXPECT(s.code() == step5::StatusCode::kInvalidArgument && m.find(std::string("gemm_bf16: ") + a + " [") != std::string::npos &&
               m.find(std::string("overlaps ") + o + " [") != std::string::npos,
           "%s: %s", what, s.to_string().c_str());
  };
  for (const GemmPath path : {GemmPath::kAuto, GemmPath::kGeneric, GemmPath::kSplitK, GemmPath::kGemv}) {
    GemmParams q = p;
    q.path = path;
    q.split_k = path == GemmPath::kSplitK ? 1 : 0;  // no workspace needed
    q.c = b;  // in place over X
    refused(q, "c", "x", step5::ops::gemm_path_name(path));
    q.c = b + 126;  // over X's last two elements (C 4-byte aligned, as the fast paths need)
    refused(q, "c", "x", step5::ops::gemm_path_name(path));
    q.c = b + 16384 + 64 * 64 - 2;  // over W's last element
    refused(q, "c", "w", step5::ops::gemm_path_name(path));
  }
  // different columns of one strided buffer: the range test refuses them too (documented)
  GemmParams q = p;
  q.ldx = q.ldc = 128, q.c = b + 64;
  refused(q, "c", "x", "C beside X in one strided buffer");
  // the split-K workspace over W (its partials would be read back as weights)
  q = p;
  q.path = GemmPath::kSplitK, q.split_k = 2, q.c = b + 8192, q.k = q.ldx = q.ldw = 512;  // W: 64 KiB at 32 KiB
  step5::ops::GemmPlan plan;
  const step5::Status ps = step5::ops::gemm_plan(q, &plan);  // the plan does not look at the overlap
  EXPECT(ps.ok() && plan.workspace_bytes > 0, "split-K plan: %s (workspace %zu)", ps.to_string().c_str(),
         plan.workspace_bytes);
  q.workspace = b + 16384 + 8192, q.workspace_bytes = plan.workspace_bytes;  // 16-byte aligned, inside W
  refused(q, "workspace", "w", "split-K workspace over W");
  std::vector<bf16> h(128);
  GPU_CHECK(cudaMemcpy(h.data(), b, 256, cudaMemcpyDeviceToHost));
  bool untouched = true;
  for (const bf16& v : h) untouched = untouched && std::memcmp(&v, "\x3c\x3c", 2) == 0;
  EXPECT(untouched, "X changed by a refused call");
}

GPU_CASE("gemm: preconditions return Status naming the values") {
  DevBuf buf(1 << 20);
  GemmParams good;
  good.x = buf.as<bf16>();
  good.w = buf.as<bf16>() + 4096;
  good.c = buf.as<bf16>() + 8192;
  good.tokens = 4; good.n = 16; good.k = 64; good.ldx = 64; good.ldw = 64; good.ldc = 16;
  auto expect_err = [&](GemmParams p, step5::StatusCode code, const char* needle, const char* what) {
    const step5::Status s = step5::ops::gemm_bf16(p, nullptr);
    EXPECT(!s.ok() && s.code() == code, "%s: expected an error, got %s", what, s.to_string().c_str());
    EXPECT(s.message().find(needle) != std::string::npos, "%s: message '%s' lacks '%s'", what, s.message().c_str(),
           needle);
  };
  { GemmParams p = good; p.x = nullptr; expect_err(p, step5::StatusCode::kInvalidArgument, "x is null", "null x"); }
  { GemmParams p = good; p.w = nullptr; expect_err(p, step5::StatusCode::kInvalidArgument, "w is null", "null w"); }
  { GemmParams p = good; p.c = nullptr; expect_err(p, step5::StatusCode::kInvalidArgument, "c is null", "null c"); }
  { GemmParams p = good; p.tokens = -3; expect_err(p, step5::StatusCode::kInvalidArgument, "tokens = -3", "neg T"); }
  { GemmParams p = good; p.ldx = 60; expect_err(p, step5::StatusCode::kInvalidArgument, "ldx = 60", "ldx < k"); }
  { GemmParams p = good; p.ldw = 63; expect_err(p, step5::StatusCode::kInvalidArgument, "ldw = 63", "ldw < k"); }
  { GemmParams p = good; p.ldc = 15; expect_err(p, step5::StatusCode::kInvalidArgument, "ldc = 15", "ldc < n"); }
  {
    GemmParams p = good; p.x = good.x + 1; p.path = GemmPath::kWgmma;
    expect_err(p, step5::StatusCode::kInvalidArgument, "x is not 16-byte aligned", "misaligned x forced wgmma");
  }
  {
    GemmParams p = good; p.k = 60; p.ldx = 60; p.ldw = 60; p.path = GemmPath::kSplitK;
    expect_err(p, step5::StatusCode::kInvalidArgument, "k = 60", "k % 8 forced stream");
  }
  {  // the gemv path: decode-sized T only, no tile or split override, the fast-path alignment
    GemmParams p = good; p.path = GemmPath::kGemv; p.tokens = 17;
    expect_err(p, step5::StatusCode::kInvalidArgument, "tokens = 17", "gemv T > kGemmGemvMaxTokens");
    p.tokens = 1; p.k = 120000; p.ldx = 120000; p.ldw = 120000;
    expect_err(p, step5::StatusCode::kInvalidArgument, "k = 120000", "gemv X beyond shared memory");
    p = good; p.path = GemmPath::kGemv; p.split_k = 2;
    expect_err(p, step5::StatusCode::kInvalidArgument, "split_k = 2", "gemv split_k");
    p = good; p.path = GemmPath::kGemv; p.config = step5::ops::kGemmGemvTensorCoresWindowed + 1;
    expect_err(p, step5::StatusCode::kInvalidArgument, "config = 4", "gemv config out of range");
    // X in windows runs any K up to kGemmGemvMaxK; one past it is refused, naming k
    p = good; p.path = GemmPath::kGemv; p.config = step5::ops::kGemmGemvTensorCoresWindowed;
    p.k = p.ldx = p.ldw = step5::ops::kGemmGemvMaxK + 8;
    const std::string k_named = "k = " + std::to_string(step5::ops::kGemmGemvMaxK + 8);
    expect_err(p, step5::StatusCode::kInvalidArgument, k_named.c_str(), "gemv windowed K beyond kGemmGemvMaxK");
    p = good; p.path = GemmPath::kGemv; p.config = step5::ops::kGemmGemvCudaCores; p.tokens = 5;
    expect_err(p, step5::StatusCode::kInvalidArgument, "tokens = 5", "gemv CUDA-core kernel at T = 5");
    p = good; p.path = GemmPath::kGemv; p.w = good.w + 1;
    expect_err(p, step5::StatusCode::kInvalidArgument, "w is not 16-byte aligned", "gemv misaligned w");
  }
  {
    GemmParams p = good; p.path = GemmPath::kSplitK; p.n = 4096; p.ldc = 4096; p.k = 4096; p.ldx = 4096; p.ldw = 4096;
    p.tokens = 1; p.c = good.c; p.w = good.w;  // sizes only matter for the plan (nothing launched)
    step5::ops::GemmPlan plan;
    const step5::Status s = step5::ops::gemm_plan(p, &plan);
    EXPECT(s.ok() && plan.split_k > 1 && plan.workspace_bytes > 0, "decode plan should split K: %s split %d",
           s.to_string().c_str(), plan.split_k);
    expect_err(p, step5::StatusCode::kInvalidArgument, "workspace", "missing workspace");
  }
  {  // a forced 16-token split-K config past 65535 token tiles (grid.y): refused by the plan, naming
     // T and the tile (it used to fail in cudaLaunchKernelEx with an unnamed launch error)
    GemmParams p = good; p.path = GemmPath::kSplitK; p.config = 1; p.tokens = 1100000;
    step5::ops::GemmPlan plan;
    const step5::Status s = step5::ops::gemm_plan(p, &plan);
    EXPECT(s.code() == step5::StatusCode::kInvalidArgument && s.message().find("tokens = 1100000") != std::string::npos &&
               s.message().find("expected <= 65535") != std::string::npos,
           "forced split-K config 1 at T = 1100000: %s", s.to_string().c_str());
  }
  {  // a forced split_k past 65535 K splits (grid.z) on a 4M-deep k (65536 k-tiles): refused by the
     // plan, naming split_k (it would fail in the launch with an unnamed configuration error)
    GemmParams p = good; p.path = GemmPath::kSplitK; p.tokens = 16; p.n = 64; p.ldc = 64;
    p.k = 4194304; p.ldx = 4194304; p.ldw = 4194304; p.split_k = 65536;  // sizes only: nothing launched
    step5::ops::GemmPlan plan;
    const step5::Status s = step5::ops::gemm_plan(p, &plan);
    EXPECT(s.code() == step5::StatusCode::kInvalidArgument && s.message().find("split_k = 65536") != std::string::npos &&
               s.message().find("(grid.z)") != std::string::npos,
           "forced split_k 65536 at k = 4194304: %s (split %d)", s.to_string().c_str(), plan.split_k);
  }
  {  // wgmma split-K: a missing, too small or misaligned workspace is an error naming the bytes
    GemmParams p = good; p.path = GemmPath::kWgmma; p.config = 1; p.split_k = 4;
    p.tokens = 64; p.n = 512; p.ldc = 512; p.k = 1024; p.ldx = 1024; p.ldw = 1024;  // fits in `buf`
    step5::ops::GemmPlan plan;
    const step5::Status s = step5::ops::gemm_plan(p, &plan);
    EXPECT(s.ok() && plan.split_k == 4 && plan.workspace_bytes > step5::ops::kGemmCounterBytes,
           "forced wgmma split-K plan: %s split %d workspace %zu", s.to_string().c_str(), plan.split_k,
           plan.workspace_bytes);
    const std::string bytes = std::to_string(plan.workspace_bytes) + " bytes";
    expect_err(p, step5::StatusCode::kInvalidArgument, bytes.c_str(), "wgmma split-K without workspace");
    DevBuf ws(plan.workspace_bytes + 16);
    p.workspace = ws.p;
    p.workspace_bytes = plan.workspace_bytes - 4;
    expect_err(p, step5::StatusCode::kInvalidArgument, bytes.c_str(), "wgmma split-K workspace too small");
    p.workspace = static_cast<char*>(ws.p) + 4;
    p.workspace_bytes = plan.workspace_bytes;
    expect_err(p, step5::StatusCode::kInvalidArgument, "misaligned", "wgmma split-K workspace misaligned");
  }
  { GemmParams p = good; p.path = GemmPath::kWgmma; p.config = static_cast<int>(std::size(step5::ops::kGemmWgmmaTiles)) + 1;
    const std::string needle = "config = " + std::to_string(p.config);
    expect_err(p, step5::StatusCode::kInvalidArgument, needle.c_str(), "bad wgmma config"); }
  { GemmParams p = good; p.path = GemmPath::kSplitK; p.config = static_cast<int>(std::size(step5::ops::kGemmSplitKTiles)) + 1;
    const std::string needle = "config = " + std::to_string(p.config);
    expect_err(p, step5::StatusCode::kInvalidArgument, needle.c_str(), "bad config"); }
  { GemmParams p = good; p.split_k = -2; expect_err(p, step5::StatusCode::kInvalidArgument, "split_k = -2", "bad split_k"); }
  { GemmParams p = good; p.path = static_cast<GemmPath>(7);
    expect_err(p, step5::StatusCode::kInvalidArgument, "path = 7", "path outside the enum"); }
#if !defined(STEP5_NO_CUBLASLT)
  { GemmParams p = good; p.path = GemmPath::kCublasLt; p.config = 2;
    expect_err(p, step5::StatusCode::kInvalidArgument, "config = 2", "config with kCublasLt"); }
  { GemmParams p = good; p.path = GemmPath::kCublasLt; p.split_k = 3;
    expect_err(p, step5::StatusCode::kInvalidArgument, "split_k = 3", "split_k with kCublasLt"); }
#else
  { GemmParams p = good; p.path = GemmPath::kCublasLt;
    expect_err(p, step5::StatusCode::kUnsupported, "without cuBLASLt", "kCublasLt not built"); }
#endif
  {  // T == 0 is a no-op even with null pointers
    GemmParams p = good; p.tokens = 0; p.x = nullptr; p.c = nullptr;
    const step5::Status s = step5::ops::gemm_bf16(p, nullptr);
    EXPECT(s.ok(), "T == 0 should be a no-op, got %s", s.to_string().c_str());
  }
  {  // a STEP5_PDL that is neither 0 nor 1: refused naming it on every path, cuBLASLt's included
     // (its launch does not pass through the library's launch_kernel, which refuses it), nothing
     // launched (c keeps its poison)
    const char* env = std::getenv("STEP5_PDL");
    const std::string saved = env != nullptr ? env : "";
    const int state = step5::ops::detail::pdl_state().load();
    setenv("STEP5_PDL", "on", 1);
    step5::ops::detail::pdl_state().store(-1);  // read the environment again, on first use
    GPU_CHECK(cudaMemset(good.c, 0x7f, 4 * 16 * sizeof(bf16)));
    std::vector<GemmPath> paths = {GemmPath::kAuto, GemmPath::kGeneric, GemmPath::kSplitK, GemmPath::kGemv};
#if !defined(STEP5_NO_CUBLASLT)
    paths.push_back(GemmPath::kCublasLt);
#endif
    for (GemmPath path : paths) {
      GemmParams p = good; p.path = path;
      const std::string what = "bad STEP5_PDL, path " + std::to_string(static_cast<int>(path));
      expect_err(p, step5::StatusCode::kInvalidArgument, "STEP5_PDL = 'on'", what.c_str());
    }
    if (env != nullptr) setenv("STEP5_PDL", saved.c_str(), 1);
    else unsetenv("STEP5_PDL");
    step5::ops::detail::pdl_state().store(state);
    GPU_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint16_t> h(4 * 16);
    GPU_CHECK(cudaMemcpy(h.data(), good.c, h.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT(std::all_of(h.begin(), h.end(), [](std::uint16_t v) { return v == 0x7f7f; }),
           "a refused GEMM wrote c");
  }
  GPU_CHECK(cudaDeviceSynchronize());
}

STEP5_GPU_TEST_MAIN()
