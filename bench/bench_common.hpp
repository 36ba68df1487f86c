#pragma once
/// \file bench/bench_common.hpp
/// What every benchmark binary shares (SPEC.md §9 "Performance model"): the two device ceilings
/// that the floors are computed from, measured ONE way in every binary, plus an L2 flush, a
/// CUDA-event timer, a GPU "sleep" that hides host launch overhead, random fills, an owning
/// device buffer (`DevBuf`) and the random-row gather ceiling of bench_attention's cases.
///
///  - Copy bandwidth ceiling: `copy_ceiling(stream)` = (bytes read + bytes written) per second of
///    one `cudaMemcpyAsync` device-to-device of 1 GiB, median of kCopyReps copies (after one
///    warm-up). SPEC §9 quotes "copy 4.19 TB/s" on the H200 with this definition.
///  - GEMM rate ceiling: `gemm_ceiling(stream)` = FLOP/s (2·n³) of one cuBLAS bf16 GEMM
///    (`cublasGemmEx`, bf16 in/out, fp32 compute) at n = 8192 on uniform random data in [-1, 1),
///    median of kGemmReps GEMMs (after two warm-ups). SPEC §9: 779 TFLOP/s on the H200.
///  Both are measured on the first call and cached for the process.
///  - Random-row gather ceiling (issue 15 §3): `gather_ceiling(a, b, num_rows, row_bytes, ...)` =
///    bytes per second of `gather_rows_kernel` reading row r of both `a` and `b` (K and V) for
///    kGatherRows row ids r drawn uniformly from [0, num_rows) (or, without replacement, runs of
///    one region's rows of one KV head, the decode gather's granule: `run`, `lanes`) by a seeded
///    host generator, each
///    warp reading whole rows with 16-byte loads, median of kGatherReps launches each after an L2
///    flush. Measured per call: the working set (num_rows) is the caller's.
///
/// Benchmark code only (bench/*.cu includes it; it holds __global__ kernels, so nvcc only).
/// Errors: a failing CUDA or cuBLAS call prints file:line, the call and the error, and exits(1) —
/// acceptable in benchmark binaries, never in the library.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "step5/reference/summaries.hpp"

namespace step5::bench {

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s:%d %s failed: %s (%s)\n", file, line, what, cudaGetErrorString(e), cudaGetErrorName(e));
    std::exit(1);
  }
}
inline void check_cublas(cublasStatus_t e, const char* what, const char* file, int line) {
  if (e != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s:%d %s failed: cuBLAS status %d\n", file, line, what, static_cast<int>(e));
    std::exit(1);
  }
}
#define STEP5_BENCH_CUDA(call) ::step5::bench::check_cuda((call), #call, __FILE__, __LINE__)
#define STEP5_BENCH_CUBLAS(call) ::step5::bench::check_cublas((call), #call, __FILE__, __LINE__)

// ------------------------------------------------------------------------------------------------
// Kernels: random fills (hash of the index and a seed; deterministic) and a timed spin.

__device__ __forceinline__ std::uint32_t bench_hash32(std::uint64_t i, std::uint32_t seed) {
  std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(i >> 32) * 0x9e3779b9u ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
/// Uniform in [lo, hi) with 24 random bits.
__device__ __forceinline__ float bench_uniform(std::uint64_t i, std::uint32_t seed, float lo, float hi) {
  return lo + (hi - lo) * (static_cast<float>(bench_hash32(i, seed) >> 8) * (1.0f / 16777216.0f));
}
__global__ void fill_bf16_kernel(__nv_bfloat16* p, std::size_t n, std::uint32_t seed, float lo, float hi) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(bench_uniform(i, seed, lo, hi));
}
__global__ void fill_f32_kernel(float* p, std::size_t n, std::uint32_t seed, float lo, float hi) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = bench_uniform(i, seed, lo, hi);
}
/// Random finite e4m3fn bytes with |x| < 2: sign, exponent field 0..7 (bias 7), any mantissa.
__global__ void fill_e4m3_kernel(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = bench_hash32(i, seed);
    p[i] = static_cast<std::uint8_t>(((h >> 8) & 0x80u) | ((h & 7u) << 3) | ((h >> 4) & 7u));
  }
}
/// Busy-waits `ns` nanoseconds of the global timer (one thread).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(500);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

inline void fill_bf16(void* p, std::size_t n, std::uint32_t seed, float lo, float hi, cudaStream_t s) {
  if (n == 0) return;
  fill_bf16_kernel<<<2048, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed, lo, hi);
  STEP5_BENCH_CUDA(cudaGetLastError());
}
inline void fill_f32(float* p, std::size_t n, std::uint32_t seed, float lo, float hi, cudaStream_t s) {
  if (n == 0) return;
  fill_f32_kernel<<<256, 256, 0, s>>>(p, n, seed, lo, hi);
  STEP5_BENCH_CUDA(cudaGetLastError());
}
inline void fill_e4m3(std::uint8_t* p, std::size_t n, std::uint32_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_e4m3_kernel<<<2048, 256, 0, s>>>(p, n, seed);
  STEP5_BENCH_CUDA(cudaGetLastError());
}
/// Keeps the GPU busy for `us` microseconds so that the launches enqueued next are queued before
/// the timed region begins (the timing then excludes host launch overhead).
inline void gpu_sleep(cudaStream_t s, double us) {
  spin_kernel<<<1, 1, 0, s>>>(static_cast<unsigned long long>(us * 1e3));
  STEP5_BENCH_CUDA(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------------

/// Owning device allocation of `count` elements (at least one byte is allocated).
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

/// CUDA-event timer on one stream: start(); ...; stop() returns elapsed seconds (synchronizes).
class EventTimer {
 public:
  EventTimer() {
    STEP5_BENCH_CUDA(cudaEventCreate(&e0_));
    STEP5_BENCH_CUDA(cudaEventCreate(&e1_));
  }
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(cudaStream_t s) { STEP5_BENCH_CUDA(cudaEventRecord(e0_, s)); }
  double stop(cudaStream_t s) {
    STEP5_BENCH_CUDA(cudaEventRecord(e1_, s));
    STEP5_BENCH_CUDA(cudaEventSynchronize(e1_));
    float ms = 0;
    STEP5_BENCH_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

/// Reads n 16-byte words of p (grid-stride) and folds them into `sink`, one atomicAdd per warp,
/// so that no load can be dropped: L2Flusher's read mode.
__global__ void read_words_kernel(const uint4* __restrict__ p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 x = __ldg(p + i);
    acc += x.x ^ x.y ^ x.z ^ x.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31u) == 0) atomicAdd(sink, acc);
}

/// How L2Flusher evicts the L2, from STEP5_BENCH_L2_FLUSH (read on the first call):
///  * unset or "read": a read of the flush buffer (filled once, at construction). It evicts the
///    previous launches' lines, writing the dirty ones back during the flush, and leaves clean
///    lines: the timed launch starts with a cold L2 and writes back nothing it did not write;
///  * "write": a memset of the buffer, the method of every run in bench/RESULTS.md up to the
///    twenty-fourth session. It leaves the L2 full of the memset's dirty lines, which the timed
///    launch then writes back as it evicts them: on an H100 (50 MB L2) 0.3–11 µs more per
///    bench_attention decode launch (bench/RESULTS.md, twenty-fourth session). Compare runs
///    across the change only in one mode.
/// Any other value: prints it and exits (benchmark code).
inline const char* l2_flush_mode() {
  static const char* mode = [] {
    const char* e = std::getenv("STEP5_BENCH_L2_FLUSH");
    if (e == nullptr || std::string(e) == "read") return "read";
    if (std::string(e) == "write") return "write";
    std::fprintf(stderr, "STEP5_BENCH_L2_FLUSH = '%s', expected read (default) or write\n", e);
    std::exit(2);
  }();
  return mode;
}

/// Evicts the L2 before a timed launch through a buffer of twice the device's L2 size (at least
/// `min_bytes`: 64 MiB, bench_attention 128 MiB, the sizes of their memsets before the read mode),
/// as l2_flush_mode() says.
class L2Flusher {
 public:
  explicit L2Flusher(std::size_t min_bytes = 64ull << 20) {
    int dev = 0, l2 = 0;
    STEP5_BENCH_CUDA(cudaGetDevice(&dev));
    STEP5_BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    bytes_ = std::max<std::size_t>(2ull * static_cast<std::size_t>(l2), min_bytes);
    STEP5_BENCH_CUDA(cudaMalloc(&buf_, bytes_));
    STEP5_BENCH_CUDA(cudaMemset(buf_, 0x5a, bytes_));
    // cudaMemset runs on the legacy default stream, which does not order non-blocking streams
    // (bench_layer's): the fill completes before any flush reads the buffer
    STEP5_BENCH_CUDA(cudaDeviceSynchronize());
    STEP5_BENCH_CUDA(cudaMalloc(&sink_, sizeof(unsigned)));
    STEP5_BENCH_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
    read_ = std::string(l2_flush_mode()) == "read";
  }
  ~L2Flusher() {
    cudaFree(buf_);
    cudaFree(sink_);
  }
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush(cudaStream_t s) {
    if (read_) {
      read_words_kernel<<<sms_ * 4, 512, 0, s>>>(static_cast<const uint4*>(buf_), bytes_ / sizeof(uint4), sink_);
      STEP5_BENCH_CUDA(cudaGetLastError());
    } else {
      STEP5_BENCH_CUDA(cudaMemsetAsync(buf_, (++n_) & 0xff, bytes_, s));
    }
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* buf_ = nullptr;
  unsigned* sink_ = nullptr;
  std::size_t bytes_ = 0;
  int n_ = 0, sms_ = 1;
  bool read_ = false;
};

/// A tuning knob of a benchmark from the environment variable `var` (A/B without a rebuild):
/// unset → true, *v untouched; an integer in [0, 1024] → *v, true; anything else → false and
/// *error names the variable, its value and what 0 means (`zero_means`).
inline bool env_knob(const char* var, int* v, std::string* error, const char* zero_means = "the planner's") {
  const char* e = std::getenv(var);
  if (e == nullptr) return true;
  char* end = nullptr;
  const long x = std::strtol(e, &end, 10);
  if (end == e || *end != '\0' || x < 0 || x > 1024) {
    *error = std::string(var) + " = '" + e + "', expected an integer 0 .. 1024 (0 = " + zero_means + ")";
    return false;
  }
  *v = static_cast<int>(x);
  return true;
}

/// Untimed warm-up of a benchmark case before its timed launches: runs `step` (one untimed launch
/// as the case times it, synchronised; returns an error message, empty when fine) until
/// STEP5_BENCH_WARMUP_MS (default 200; 0 = none) ms have passed since `begin` (the case's first
/// launch). Why: for its first tens of ms after setup, a case's launches could read 10-20 % slow,
/// depending on the case run before it (bench/RESULTS.md, forty-second session, bench_layer: 20
/// timed steps after one warm-up step all slow, none after 41). Returns the first error, or the
/// knob's.
template <class Step>
std::string warm_up(std::chrono::steady_clock::time_point begin, Step&& step) {
  int ms = 200;
  if (std::string error; !env_knob("STEP5_BENCH_WARMUP_MS", &ms, &error, "none")) return error;
  while (std::chrono::steady_clock::now() - begin < std::chrono::milliseconds(ms))
    if (std::string e = step(); !e.empty()) return e;
  return {};
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The copy-bandwidth ceiling (see the file comment).
struct CopyCeiling {
  double seconds = 0;   ///< median seconds of one copy
  double bytes = 0;     ///< bytes read + bytes written by one copy (2 × size)
  double gbs = 0;       ///< bytes / seconds / 1e9 (GB/s, read + write)
  double bytes_per_s() const { return gbs * 1e9; }
};
/// The GEMM-rate ceiling (see the file comment).
struct GemmCeiling {
  double seconds = 0;   ///< median seconds of one 8192³ GEMM
  double flops = 0;     ///< 2·n³
  double tflops = 0;    ///< flops / seconds / 1e12
  double flops_per_s() const { return tflops * 1e12; }
};

inline constexpr std::size_t kCopyBytes = 1ull << 30;  ///< size of the measured copy (1 GiB)
inline constexpr int kCopyReps = 9;
inline constexpr int kGemmN = 8192;
inline constexpr int kGemmReps = 7;

/// Measures (first call) and returns the copy ceiling, on `stream`.
inline const CopyCeiling& copy_ceiling(cudaStream_t stream) {
  static const CopyCeiling c = [&] {
    void *a = nullptr, *b = nullptr;
    STEP5_BENCH_CUDA(cudaMalloc(&a, kCopyBytes));
    STEP5_BENCH_CUDA(cudaMalloc(&b, kCopyBytes));
    fill_bf16(a, kCopyBytes / 2, 11u, -1.f, 1.f, stream);
    STEP5_BENCH_CUDA(cudaMemcpyAsync(b, a, kCopyBytes, cudaMemcpyDeviceToDevice, stream));  // warm-up
    EventTimer t;
    std::vector<double> s;
    for (int r = 0; r < kCopyReps; ++r) {
      t.start(stream);
      STEP5_BENCH_CUDA(cudaMemcpyAsync(b, a, kCopyBytes, cudaMemcpyDeviceToDevice, stream));
      s.push_back(t.stop(stream));
    }
    STEP5_BENCH_CUDA(cudaFree(a));
    STEP5_BENCH_CUDA(cudaFree(b));
    CopyCeiling r;
    r.seconds = median(s);
    r.bytes = 2.0 * static_cast<double>(kCopyBytes);
    r.gbs = r.bytes / r.seconds / 1e9;
    return r;
  }();
  return c;
}

/// Measures (first call) and returns the bf16 GEMM ceiling, on `stream`.
inline const GemmCeiling& gemm_ceiling(cudaStream_t stream) {
  static const GemmCeiling c = [&] {
    const std::size_t n = kGemmN, elems = n * n;
    void *a = nullptr, *b = nullptr, *d = nullptr;
    STEP5_BENCH_CUDA(cudaMalloc(&a, elems * 2));
    STEP5_BENCH_CUDA(cudaMalloc(&b, elems * 2));
    STEP5_BENCH_CUDA(cudaMalloc(&d, elems * 2));
    fill_bf16(a, elems, 21u, -1.f, 1.f, stream);
    fill_bf16(b, elems, 22u, -1.f, 1.f, stream);
    cublasHandle_t h = nullptr;
    STEP5_BENCH_CUBLAS(cublasCreate(&h));
    STEP5_BENCH_CUBLAS(cublasSetStream(h, stream));
    const float one = 1.f, zero = 0.f;
    const int ni = kGemmN;
    auto gemm = [&] {
      STEP5_BENCH_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, ni, ni, ni, &one, a, CUDA_R_16BF, ni, b, CUDA_R_16BF,
                                      ni, &zero, d, CUDA_R_16BF, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    gemm();
    gemm();
    EventTimer t;
    std::vector<double> s;
    for (int r = 0; r < kGemmReps; ++r) {
      t.start(stream);
      gemm();
      s.push_back(t.stop(stream));
    }
    STEP5_BENCH_CUBLAS(cublasDestroy(h));
    STEP5_BENCH_CUDA(cudaFree(a));
    STEP5_BENCH_CUDA(cudaFree(b));
    STEP5_BENCH_CUDA(cudaFree(d));
    GemmCeiling r;
    r.seconds = median(s);
    r.flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    r.tflops = r.flops / r.seconds / 1e12;
    return r;
  }();
  return c;
}

/// The random-row gather ceiling (see the file comment).
struct GatherCeiling {
  double seconds = 0;   ///< median seconds of one launch
  double bytes = 0;     ///< bytes read by one launch: rows × 2 × row_bytes (row ids not counted)
  double gbs = 0;       ///< bytes / seconds / 1e9
};
inline constexpr long long kGatherRows = 1ll << 22;  ///< rows gathered per launch (× 2 arrays)
inline constexpr int kGatherReps = 5;

/// Reads row rows[i] (chunks 16-byte words) of `a` and of `b` for i < n: warp w takes rows
/// 4w .. 4w+3 (then strides by 4 × the warps), lane l reads chunks l, l+32, ...; every word is
/// folded into a sum, one atomicAdd per warp into `sink`, so no load can be dropped.
__global__ void gather_rows_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                   const std::uint32_t* __restrict__ rows, long long n, int chunks, unsigned* sink) {
  constexpr int kUnroll = 4;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const long long warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  unsigned acc = 0;
  for (long long r0 = warp * kUnroll; r0 < n; r0 += warps * kUnroll)
    for (int c0 = 0; c0 < chunks; c0 += 32) {
      const int c = c0 + lane;
      uint4 x[kUnroll], y[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        x[j] = y[j] = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + j < n && c < chunks) {
          const std::size_t off = static_cast<std::size_t>(rows[r0 + j]) * static_cast<std::size_t>(chunks) + c;
          x[j] = __ldg(a + off);
          y[j] = __ldg(b + off);
        }
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) acc += x[j].x ^ x[j].y ^ x[j].z ^ x[j].w ^ y[j].x ^ y[j].y ^ y[j].z ^ y[j].w;
    }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) atomicAdd(sink, acc);
}

/// Measures the gather ceiling over `num_rows` rows of `row_bytes` bytes (a multiple of 16) in
/// each of `a` and `b` (16-byte aligned, num_rows × row_bytes bytes each); row ids from
/// std::mt19937_64(seed). With `run` > 1 the ids come in runs of the paged cache's regions: rows
/// are numbered ((q · run) + j) · lanes + g (q a region, j < run its token, g < lanes its KV head,
/// SPEC §5's [block, block_size, KVl, D] with run = 8 and lanes = KVl), and each draw of (q, g)
/// reads the run's `run` rows j = 0 .. run − 1, as a decode CTA gathers a selected region of its KV
/// group. Runs are drawn without replacement (min(kGatherRows / run, num_rows / run) distinct (q,
/// g) in random order): a small cache read with replacement would hit the L2 and pass the copy
/// rate. run = lanes = 1 draws single rows with replacement (the prefill cases' ids, unchanged).
/// Returns seconds 0 when the arguments are out of range (nothing run).
inline GatherCeiling gather_ceiling(const void* a, const void* b, std::size_t num_rows, int row_bytes,
                                    std::uint64_t seed, cudaStream_t stream, int run = 1, int lanes = 1) {
  GatherCeiling r;
  if (num_rows == 0 || num_rows > 0xffffffffull || row_bytes <= 0 || row_bytes % 16 != 0 || run < 1 || lanes < 1 ||
      kGatherRows % run != 0 || num_rows % (static_cast<std::size_t>(run) * lanes) != 0)
    return r;
  std::vector<std::uint32_t> h_rows;
  std::mt19937_64 gen(seed);
  if (run == 1 && lanes == 1) {
    h_rows.resize(static_cast<std::size_t>(kGatherRows));
    std::uniform_int_distribution<std::uint64_t> pick(0, num_rows - 1);
    for (auto& x : h_rows) x = static_cast<std::uint32_t>(pick(gen));
  } else {
    // k distinct units u = q · lanes + g of the N = num_rows / run (Floyd's sampling), shuffled
    const std::uint64_t units = num_rows / run, k = std::min<std::uint64_t>(kGatherRows / run, units);
    std::vector<std::uint64_t> picked;
    picked.reserve(k);
    std::unordered_set<std::uint64_t> seen;
    seen.reserve(2 * k);
    for (std::uint64_t j = units - k; j < units; ++j) {
      const std::uint64_t t = std::uniform_int_distribution<std::uint64_t>(0, j)(gen);
      const std::uint64_t u = seen.insert(t).second ? t : j;
      if (u == j) seen.insert(j);
      picked.push_back(u);
    }
    std::shuffle(picked.begin(), picked.end(), gen);
    h_rows.resize(k * run);
    for (std::uint64_t i = 0; i < k; ++i) {
      const std::uint64_t q = picked[i] / lanes, g = picked[i] % lanes;
      for (int j = 0; j < run; ++j) h_rows[i * run + j] = static_cast<std::uint32_t>((q * run + j) * lanes + g);
    }
  }
  const long long n_rows = static_cast<long long>(h_rows.size());
  std::uint32_t* d_rows = nullptr;
  unsigned* sink = nullptr;
  STEP5_BENCH_CUDA(cudaMalloc(&d_rows, h_rows.size() * sizeof(std::uint32_t)));
  STEP5_BENCH_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  STEP5_BENCH_CUDA(cudaMemcpy(d_rows, h_rows.data(), h_rows.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice));
  STEP5_BENCH_CUDA(cudaMemsetAsync(sink, 0, sizeof(unsigned), stream));
  int dev = 0, sms = 0;
  STEP5_BENCH_CUDA(cudaGetDevice(&dev));
  STEP5_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int chunks = row_bytes / 16;
  auto launch = [&] {
    gather_rows_kernel<<<sms * 8, 256, 0, stream>>>(static_cast<const uint4*>(a), static_cast<const uint4*>(b), d_rows,
                                                    n_rows, chunks, sink);
    STEP5_BENCH_CUDA(cudaGetLastError());
  };
  launch();  // warm-up
  L2Flusher flush;
  EventTimer t;
  std::vector<double> s;
  for (int rep = 0; rep < kGatherReps; ++rep) {
    flush.flush(stream);
    t.start(stream);
    launch();
    s.push_back(t.stop(stream));
  }
  unsigned h_sink = 0;
  STEP5_BENCH_CUDA(cudaMemcpy(&h_sink, sink, sizeof(unsigned), cudaMemcpyDeviceToHost));
  STEP5_BENCH_CUDA(cudaFree(d_rows));
  STEP5_BENCH_CUDA(cudaFree(sink));
  r.seconds = median(s);
  r.bytes = static_cast<double>(n_rows) * 2.0 * row_bytes;
  r.gbs = r.bytes / r.seconds / 1e9;
  return r;
}

/// True when device 0 is an sm_90 GPU; otherwise prints why the benchmark is skipped (the
/// binaries then exit 0 without running anything).
inline bool sm90_device_present() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("no CUDA device: skipped\n");
    return false;
  }
  cudaDeviceProp prop{};
  STEP5_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("device %s is sm_%d%d, the kernels need sm_90: skipped\n", prop.name, prop.major, prop.minor);
    return false;
  }
  return true;
}

/// SPEC §4.6: complete history regions before a token at position p (what its selection ranks).
inline long long history_regions(long long p) { return p / ::step5::reference::kRegionSize; }

/// Context lengths (cached tokens before the step) of a decode batch of `batch` requests: every
/// request at `ctx`, or (`mixed`) request b at ctx · (b + 1) / batch, as an engine's batch of
/// requests at different depths (bench_indexer's and bench_layer's `/mixed` rows).
inline std::vector<int> decode_lengths(int batch, int ctx, bool mixed) {
  std::vector<int> lens(batch, ctx);
  if (mixed)
    for (int b = 0; b < batch; ++b) lens[b] = static_cast<int>(static_cast<std::int64_t>(ctx) * (b + 1) / batch);
  return lens;
}

/// Tokens a query at position p attends: min(topk, p / R) selected regions of R tokens plus the
/// current region's p % R + 1 tokens (SPEC §4.6–4.7).
inline double attended_tokens(long long p, int topk) {
  const long long R = ::step5::reference::kRegionSize;
  return static_cast<double>(R * std::min<long long>(topk, p / R) + (p % R + 1));
}

/// The SPEC §9 floor of a kernel: max(bytes / copy bandwidth, flops / GEMM rate), seconds.
inline double floor_seconds(double bytes, double flops, const CopyCeiling& copy, const GemmCeiling& gemm) {
  return std::max(bytes / copy.bytes_per_s(), flops / gemm.flops_per_s());
}

}  // namespace step5::bench
