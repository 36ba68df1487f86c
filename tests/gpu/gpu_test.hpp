#pragma once
// Minimal harness of the GPU tests (no doctest in nvcc-compiled files, DESIGN.md):
//   STEP5_GPU_TEST_MAIN() — runs the cases (argv[1]: only the cases whose name contains it;
//                           `--list`: print the case names, one per line, and exit 0); without
//                           an sm_90 device it runs only the HOST_CASEs and exits 77 (skipped)
//                           when they pass, 1 when one fails.
//   GPU_CASE("name") { }  — a case that needs the device; HOST_CASE("name") { } one that does not
//                           (launch plans and other host logic of the GPU paths).
//   GPU_CHECK(cuda call)  — fails the test with the call and the CUDA error string.
//   EXPECT(cond, fmt...)  — records a failure with a message, keeps going.
//   rel_error(out, ref)   — ||out - ref|| / ||ref|| (fp64).
//   DevBuf<T>             — RAII device array of `n` T (cudaMalloc / cudaFree), up() / down()
//                           copies from / to a host vector; dalloc / upload / download are the
//                           same copies on raw device pointers.
//   sz(full, quick), same_bits(a, b), noise_kernel — quick-mode sizes, byte equality of two host
//                           vectors, a memory-streaming kernel to run concurrently with a test.
//   judge_row(...)        — the verdict on one GPU selection row against reference scores: equal
//                           to the reference selection, or different only by ids tied within
//                           rounding at the k-th place (see its comment).
//   graph_edges(g), programmatic_edges(g) — a CUDA graph's edges with their data, and how many
//                           are programmatic (the PDL edges a capture keeps).
//   quick()               — sanitizer mode: true when the environment variable
//                           STEP5_GPU_TEST_QUICK is set to a non-empty value other than "0". The
//                           tests then run the same cases (every kernel variant / path, the edge
//                           cases) on smaller sizes, fast enough for `compute-sanitizer --tool
//                           memcheck` / `--tool racecheck`; without it they run at full size. The
//                           checks and tolerances are the same in both modes.
// A test prints "N passed, N failed" last and exits 0 only when every check passed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <iterator>
#include <string>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/reference/select.hpp"

namespace step5_test {

inline int& failures() { static int f = 0; return f; }
inline int& passes() { static int p = 0; return p; }

#define GPU_CHECK(call)                                                                         \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: CUDA error %s in %s\n", __FILE__, __LINE__, cudaGetErrorString(e_), #call); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

#define EXPECT(cond, ...)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      ++::step5_test::failures();                                           \
      std::fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fprintf(stderr, "\n");                                           \
    } else {                                                                \
      ++::step5_test::passes();                                             \
    }                                                                       \
  } while (0)

template <class A, class B>
double rel_error(const std::vector<A>& out, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = static_cast<double>(out[i]), r = static_cast<double>(ref[i]);
    num += (o - r) * (o - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Sanitizer mode (see the file comment): STEP5_GPU_TEST_QUICK set, non-empty and not "0".
inline bool quick() {
  static const bool q = [] {
    const char* v = std::getenv("STEP5_GPU_TEST_QUICK");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return q;
}

/// Full size, or the quick-mode (sanitizer) value.
inline int sz(int full, int quick_value) { return quick() ? quick_value : full; }

/// Fresh uniform random data in [-scale, scale] (bf16 rounded to nearest even / fp32).
inline std::vector<step5::bf16> random_bf16(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<step5::bf16> v(n);
  for (auto& x : v) x = step5::to_bf16(u(rng));
  return v;
}
inline std::vector<float> random_f32(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

/// Same size and the same bytes.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Competing work for the repeat-with-other-work tests: streams through `buf` (n floats) `passes`
/// times; launch it on another stream with varying grid sizes.
__global__ void noise_kernel(float* buf, std::size_t n, int passes) {
  for (int p = 0; p < passes; ++p)
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
      buf[i] = buf[i] * 0.999f + 1.0f;
}

/// cudaMalloc of `n` T (at least one element, so that n == 0 gives a valid pointer).
template <class T>
T* dalloc(std::size_t n) {
  T* p = nullptr;
  GPU_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return p;
}
/// Copies the host vector `h` to the device array `d` (h.size() elements).
template <class T>
void upload(T* d, const std::vector<T>& h) {
  GPU_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
/// Returns the first `n` elements of the device array `d`.
template <class T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> h(n);
  GPU_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/// RAII device array of `n` T (freed by the destructor; not copyable).
template <class T>
struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t count) : p(dalloc<T>(count)), n(count) {}
  /// A device copy of `h`.
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { up(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void up(const std::vector<T>& h) { upload(p, h); }
  std::vector<T> down() const { return download(p, n); }
};

/// Judges the GPU selection of one row (SPEC §4.6) against reference scores `ref_scores[0, n)` of
/// that row (n = p/8 history regions): the row `gpu_row[0 .. topk]` with `gpu_count` entries must
/// equal `reference::select_row` of those scores exactly, or differ only in ids whose reference
/// score lies within rounding (2e-4 relative to the k-th selected score, plus 2e-7 of the row's
/// largest magnitude) of the k-th selected score: a tie within rounding at the k-th place, which
/// scores computed in another summation order may break either way. Counts, the current-region
/// entry, the -1 padding and the ascending order are always exact. Returns true when the row is
/// accepted; `*tie_rows` counts the rows accepted only as such ties.
inline bool judge_row(const float* ref_scores, int n, int topk, const std::int32_t* gpu_row, int gpu_count,
                      int* tie_rows) {
  namespace ref = step5::reference;
  std::vector<std::int32_t> r(static_cast<std::size_t>(topk + 1));
  const int cnt = ref::select_row(ref_scores, n, topk, n, r.data());
  if (cnt == gpu_count && std::equal(r.begin(), r.end(), gpu_row)) return true;
  if (cnt != gpu_count) return false;
  const int k = cnt - 1;
  if (gpu_row[k] != n) return false;
  for (int i = k + 1; i <= topk; ++i)
    if (gpu_row[i] != -1) return false;
  for (int i = 1; i < k; ++i)
    if (!(gpu_row[i - 1] < gpu_row[i])) return false;  // ascending, no duplicates
  float kth = 0.f;
  bool first = true;
  float rowmax = 0.f;
  for (int i = 0; i < n; ++i) rowmax = std::max(rowmax, std::abs(ref_scores[i]));
  for (int i = 0; i < k; ++i) {
    const float s = ref_scores[r[i]];
    if (first || ref::ranks_above(kth, 0, s, 1)) kth = s;
    first = false;
  }
  const float tol = 2e-4f * (std::abs(kth) + 1e-3f * rowmax) + 1e-30f;
  std::vector<std::int32_t> a(r.begin(), r.begin() + k), b(gpu_row, gpu_row + k), diff;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  for (int id : diff)
    if (id < 0 || id >= n || !(std::abs(ref_scores[id] - kth) <= tol)) return false;
  ++*tie_rows;
  return true;
}

/// Returns true when an sm_90 device is present (prints why not otherwise).
inline bool have_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return false;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess || p.major != 9) {
    std::printf("device is not sm_90 (Hopper): skipped\n");
    return false;
  }
  return true;
}

struct Case {
  const char* name;
  std::function<void()> fn;
  bool host = false;  ///< HOST_CASE: needs no device (plans), also run where the GPU cases are skipped
};
inline std::vector<Case>& cases() { static std::vector<Case> c; return c; }
struct Register {
  Register(const char* n, std::function<void()> f, bool host = false) { cases().push_back({n, std::move(f), host}); }
};

inline int run_all(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--list") == 0) {  // the case names, one per line (no GPU needed)
    for (auto& c : cases()) std::printf("%s\n", c.name);
    return 0;
  }
  // without an sm_90 device only the HOST_CASEs run: exit 77 (skipped) when they pass
  const bool device = have_sm90();
  const char* filter = argc > 1 ? argv[1] : nullptr;
  for (auto& c : cases()) {
    if (filter && std::string(c.name).find(filter) == std::string::npos) continue;
    if (!device && !c.host) continue;
    const int before = failures();
    c.fn();
    std::printf("[%s] %s\n", failures() == before ? "ok" : "FAIL", c.name);
  }
  std::printf("%d passed, %d failed%s\n", passes(), failures(), device ? "" : " (host cases only)");
  if (failures() != 0) return 1;
  return device ? 0 : 77;
}

/// Every edge of `g`: from[i] -> to[i] with its data (type, ports).
struct GraphEdges {
  std::vector<cudaGraphNode_t> from, to;
  std::vector<cudaGraphEdgeData> data;
};
inline GraphEdges graph_edges(cudaGraph_t g) {
  std::size_t n = 0;
#if CUDART_VERSION >= 13000
  GPU_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
#else
  GPU_CHECK(cudaGraphGetEdges_v2(g, nullptr, nullptr, nullptr, &n));
#endif
  GraphEdges e;
  e.from.resize(n), e.to.resize(n), e.data.resize(n);
  if (n == 0) return e;
#if CUDART_VERSION >= 13000
  GPU_CHECK(cudaGraphGetEdges(g, e.from.data(), e.to.data(), e.data.data(), &n));
#else
  GPU_CHECK(cudaGraphGetEdges_v2(g, e.from.data(), e.to.data(), e.data.data(), &n));
#endif
  return e;
}

/// The runtime name of the kernel that graph node `node` launches (its parameters in `*kp` when
/// given), or "" when the node is not a kernel node or its kernel has no runtime name (a kernel
/// launched through the driver API, e.g. cuBLASLt's; the query's error is cleared).
inline std::string kernel_node_name(cudaGraphNode_t node, cudaKernelNodeParams* kp = nullptr) {
  cudaGraphNodeType t{};
  GPU_CHECK(cudaGraphNodeGetType(node, &t));
  if (t != cudaGraphNodeTypeKernel) return "";
  cudaKernelNodeParams p{};
  const char* name = nullptr;
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || p.func == nullptr ||
      cudaFuncGetName(&name, p.func) != cudaSuccess || name == nullptr) {
    cudaGetLastError();
    return "";
  }
  if (kp != nullptr) *kp = p;
  return name;
}

/// Edges of `g` of type cudaGraphDependencyTypeProgrammatic (the PDL edges a capture keeps).
inline std::size_t programmatic_edges(cudaGraph_t g) {
  std::size_t k = 0;
  for (const cudaGraphEdgeData& d : graph_edges(g).data) k += d.type == cudaGraphDependencyTypeProgrammatic;
  return k;
}

}  // namespace step5_test

#define STEP5_GPU_CASE_CAT2(a, b) a##b
#define STEP5_GPU_CASE_CAT(a, b) STEP5_GPU_CASE_CAT2(a, b)
#define STEP5_TEST_CASE(name, host)                                                       \
  static void STEP5_GPU_CASE_CAT(gpu_case_, __LINE__)();                                  \
  static ::step5_test::Register STEP5_GPU_CASE_CAT(gpu_reg_, __LINE__)(name, &STEP5_GPU_CASE_CAT(gpu_case_, __LINE__), host); \
  static void STEP5_GPU_CASE_CAT(gpu_case_, __LINE__)()
/// GPU_CASE("name") { body }
#define GPU_CASE(name) STEP5_TEST_CASE(name, false)
/// HOST_CASE("name") { body }: a case that needs no device (launch plans and other host logic of
/// the GPU paths); it runs with the GPU cases, and alone where they are skipped (CI without a GPU).
#define HOST_CASE(name) STEP5_TEST_CASE(name, true)
#define STEP5_GPU_TEST_MAIN() \
  int main(int argc, char** argv) { return ::step5_test::run_all(argc, argv); }
