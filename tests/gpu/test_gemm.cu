// GPU test of the projection GEMM (step5/ops/gemm.hpp, SPEC §3/§4.1) against the CPU reference
// `step5::reference::gemm_bf16_f32out`: every geometry × tp of geometries.def (N = padded_rows
// of rank 0, K = hidden), T in {1, 2, 3, 17, 64, 127, 129, 1000, 4096}, every path (auto,
// generic, stream, wgmma), padded row strides, poisoned outputs, plus precondition errors.
// Quick (sanitizer) mode, step5_test::quick(): tp 1 and 8 of each geometry, T in {1, 17, 129} at
// K = 256 (every variant at T 17 and 129), plus T = 1 at K = hidden (4096, split-K decode) for
// tp 8; the odd shapes with T capped at 129. Same checks and tolerances.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/core/numeric.hpp"
#include "step5/kernels/sm90/gemm_stream.cuh"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/gemm.hpp"
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
};

const char* path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kAuto: return "auto";
    case GemmPath::kGeneric: return "generic";
    case GemmPath::kSplitK: return "split_k";
    case GemmPath::kWgmma: return "wgmma";
  }
  return "?";
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t bytes) { GPU_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 256))); }
  ~DevBuf() { cudaFree(p); }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

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
    step5::ops::GemmPlan plan;
    const step5::Status ps = step5::ops::gemm_plan(p, &plan);
    const std::string pn = std::string(path_name(path)) + (v.config ? "/c" + std::to_string(v.config) : "") +
                           (v.split_k ? "/s" + std::to_string(v.split_k) : "");
    EXPECT(ps.ok(), "%s path %s: gemm_plan: %s", name.c_str(), pn.c_str(), ps.to_string().c_str());
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
    long long bad = 0, checked = 0;
    double max_rel = 0;
    int first_t = -1, first_n = -1;
    float first_o = 0, first_r = 0;
    for (int i = 0; i < R; ++i) {
      const float* rr = &ref[static_cast<std::size_t>(i) * N];
      double ss = 0;
      for (int n = 0; n < N; ++n) ss += static_cast<double>(rr[n]) * rr[n];
      const double rms = std::sqrt(ss / N);
      const bf16* cr = &hc[static_cast<std::size_t>(rows[i]) * ldc];
      for (int n = 0; n < N; ++n) {
        const float o = step5::to_float(cr[n]);
        const double err = std::fabs(static_cast<double>(o) - rr[n]);
        const double tol = 1e-2 * std::fabs(rr[n]) + 1e-3 * rms;
        ++checked;
        if (!(err <= tol)) {
          if (bad++ == 0) { first_t = rows[i]; first_n = n; first_o = o; first_r = rr[n]; }
        } else if (std::fabs(rr[n]) > rms * 1e-2) {
          max_rel = std::max(max_rel, err / std::fabs(rr[n]));
        }
      }
      for (int n = N; n < ldc; ++n)  // padding columns stay untouched
        if (cr[n].bits != 0xFFFF) {
          if (bad++ == 0) { first_t = rows[i]; first_n = n; first_o = step5::to_float(cr[n]); first_r = NAN; }
        }
    }
    EXPECT(bad == 0, "%s path %s (plan %s, split_k %d): %lld of %lld elements off; first at t=%d n=%d: got %g, want %g",
           name.c_str(), pn.c_str(), path_name(plan.path), plan.split_k, bad, checked, first_t, first_n,
           first_o, first_r);
    std::printf("  %-44s %-12s -> %-7s split_k %2d rows %4d: max rel err %.2e %s\n", name.c_str(), pn.c_str(),
                path_name(plan.path), plan.split_k, R, max_rel, bad ? "FAIL" : "ok");
  }
}

const std::vector<Variant> kAllPaths = {{GemmPath::kAuto}, {GemmPath::kGeneric}, {GemmPath::kSplitK}, {GemmPath::kWgmma}};

/// kAllPaths plus every stream tile configuration, forced split-K factors and both wgmma tiles.
std::vector<Variant> all_variants() {
  std::vector<Variant> v = kAllPaths;
  // every row of the one split-K tile table (config = row + 1)
  for (int c = 1; c <= static_cast<int>(std::size(step5::ops::kGemmSplitKTiles)); ++c) v.push_back({GemmPath::kSplitK, c, 0});
  v.push_back({GemmPath::kSplitK, 0, 1});
  v.push_back({GemmPath::kSplitK, 0, 3});
  v.push_back({GemmPath::kSplitK, 2, 16});
  v.push_back({GemmPath::kWgmma, 1, 0});
  v.push_back({GemmPath::kWgmma, 2, 0});
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
      runs.push_back({hidden, {1, 2, 3, 17, 64, 127, 129, 1000, 4096}});
    } else {
      runs.push_back({256, {1, 17, 129}});
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
        const bool many = T == 17 || T == 129 || (T == 1000 && tp == 8);
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
        fast ? all_variants() : std::vector<Variant>{{GemmPath::kAuto}, {GemmPath::kGeneric}};
    const std::string name = "T" + std::to_string(s.T) + "/N" + std::to_string(s.N) + "/K" + std::to_string(s.K) +
                             "/ld" + std::to_string(s.ldx) + "," + std::to_string(s.ldw) + "," + std::to_string(s.ldc);
    run_case(name, s.T, s.N, s.K, s.ldx, s.ldw, s.ldc, hw, dw.as<bf16>(), dws.p, ws, paths);
  }
}

GPU_CASE("gemm: split-K output bit-identical over 50 launches (quick: 5) with other kernels running") {
  // The last split to arrive sums every split's partial in split order, so the arrival order
  // (which other work on the device changes) must not change a bit of C. Checked two ways: C equals,
  // bit for bit, the fp32 sum of the partials left in the workspace taken in split order 0, 1, ...
  // (fails whenever a reduction depends on which split arrived last), and C is the same over
  // repeated launches while another kernel streams memory on a second stream.
  const int K = 4096, N = 4608;
  for (int T : {1, 8}) {
    std::vector<bf16> hw(static_cast<std::size_t>(N) * K), hx(static_cast<std::size_t>(T) * K);
    fill_random(hw, 0.125f);
    fill_random(hx, 1.0f);
    DevBuf dw(hw.size() * 2), dx(hx.size() * 2), dc(static_cast<std::size_t>(T) * N * 2);
    GPU_CHECK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    GemmParams p;
    p.x = dx.as<bf16>();
    p.w = dw.as<bf16>();
    p.c = dc.as<bf16>();
    p.tokens = T; p.n = N; p.k = K; p.ldx = K; p.ldw = K; p.ldc = N;
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
    const std::size_t noise_n = std::size_t(1) << 26;
    DevBuf noise(noise_n * 4);
    GPU_CHECK(cudaMemset(noise.p, 0, noise_n * 4));
    cudaStream_t s_gemm, s_noise;
    GPU_CHECK(cudaStreamCreateWithFlags(&s_gemm, cudaStreamNonBlocking));
    GPU_CHECK(cudaStreamCreateWithFlags(&s_noise, cudaStreamNonBlocking));
    std::vector<std::uint16_t> first, cur(static_cast<std::size_t>(T) * N);
    const int repeats = step5_test::quick() ? 5 : 50;
    int changed = 0;
    for (int it = 0; it < repeats; ++it) {
      GPU_CHECK(cudaMemset(dc.p, 0xff, static_cast<std::size_t>(T) * N * 2));  // poison (NaN)
      GPU_CHECK(cudaDeviceSynchronize());
      step5_test::noise_kernel<<<33 + 17 * (it % 13), 256, 0, s_noise>>>(noise.as<float>(), noise_n, 1);
      const step5::Status st = step5::ops::gemm_bf16(p, s_gemm);
      EXPECT(st.ok(), "T=%d split-K gemm: %s", T, st.to_string().c_str());
      GPU_CHECK(cudaDeviceSynchronize());
      GPU_CHECK(cudaMemcpy(cur.data(), dc.p, cur.size() * 2, cudaMemcpyDeviceToHost));
      if (it == 0) first = cur;
      else changed += cur != first;
    }
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
    int bad = 0;
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; n += 97) {
        double ref = 0;
        for (int k = 0; k < K; ++k)
          ref += static_cast<double>(step5::to_float(hx[static_cast<std::size_t>(t) * K + k])) *
                 step5::to_float(hw[static_cast<std::size_t>(n) * K + k]);
        bf16 got;
        std::memcpy(&got, &first[static_cast<std::size_t>(t) * N + n], 2);
        const float v = step5::to_float(got);
        if (!std::isfinite(v) || !(std::abs(v - ref) <= 1e-2 * (1.0 + std::abs(ref)))) ++bad;
      }
    EXPECT(bad == 0, "T=%d: %d spot-checked outputs off the fp64 product", T, bad);
    GPU_CHECK(cudaStreamDestroy(s_gemm));
    GPU_CHECK(cudaStreamDestroy(s_noise));
  }
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
  {
    GemmParams p = good; p.path = GemmPath::kSplitK; p.n = 4096; p.ldc = 4096; p.k = 4096; p.ldx = 4096; p.ldw = 4096;
    p.tokens = 1; p.c = good.c; p.w = good.w;  // sizes only matter for the plan (nothing launched)
    step5::ops::GemmPlan plan;
    const step5::Status s = step5::ops::gemm_plan(p, &plan);
    EXPECT(s.ok() && plan.split_k > 1 && plan.workspace_bytes > 0, "decode plan should split K: %s split %d",
           s.to_string().c_str(), plan.split_k);
    expect_err(p, step5::StatusCode::kInvalidArgument, "workspace", "missing workspace");
  }
  { GemmParams p = good; p.path = GemmPath::kSplitK; p.config = static_cast<int>(std::size(step5::ops::kGemmSplitKTiles)) + 1;
    const std::string needle = "config = " + std::to_string(p.config);
    expect_err(p, step5::StatusCode::kInvalidArgument, needle.c_str(), "bad config"); }
  { GemmParams p = good; p.split_k = -2; expect_err(p, step5::StatusCode::kInvalidArgument, "split_k = -2", "bad split_k"); }
  {  // T == 0 is a no-op even with null pointers
    GemmParams p = good; p.tokens = 0; p.x = nullptr; p.c = nullptr;
    const step5::Status s = step5::ops::gemm_bf16(p, nullptr);
    EXPECT(s.ok(), "T == 0 should be a no-op, got %s", s.to_string().c_str());
  }
  GPU_CHECK(cudaDeviceSynchronize());
}

STEP5_GPU_TEST_MAIN()
