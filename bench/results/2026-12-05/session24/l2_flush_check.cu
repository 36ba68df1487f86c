// Session 24, not run: does a read of 2x the L2 evict a working set as well as the memset does,
// and what does the memset's write-back cost the next launch? For working sets W of 1..48 MB, each
// mode times a read of W (median of 21) after warming W in the L2 and then flushing:
//   none (W stays in the L2: the fastest possible), read 2x L2, memset 2x L2 (the old flush),
//   read 8x L2, memset 2x L2 then read 2x L2 of other memory.
// A read flush that evicts W reads as slowly as "read 8x"; one that fails reads like "none"; the
// memset's extra time over "read 2x" is its write-back.
//   nvcc -O3 -arch=sm_90a -o /tmp/l2_flush_check bench/results/2026-12-05/session24/l2_flush_check.cu && /tmp/l2_flush_check
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

__global__ void read_words(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 x = __ldg(p + i);
    acc += x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, acc);  // keeps the loads
}

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e = (x);                                                                   \
    if (e != cudaSuccess) {                                                                \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));       \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

int main() {
  int l2 = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t L2 = static_cast<size_t>(l2), flush_bytes = 8 * L2, work_bytes = 64ull << 20;
  char *flush = nullptr, *work = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMalloc(&work, work_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(flush, 1, flush_bytes));
  CK(cudaMemset(work, 2, work_bytes));
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto rd = [&](const void* p, size_t bytes) { read_words<<<sms * 4, 512>>>(static_cast<const uint4*>(p), bytes / 16, sink); };
  const char* names[] = {"none", "read 2x", "memset 2x", "read 8x", "memset 2x + read 2x"};
  std::printf("L2 %d bytes, %d SMs; median us of a read of W after each flush\n%-8s", l2, sms, "W");
  for (const char* n : names) std::printf(" %20s", n);
  std::printf("\n");
  for (size_t W : {1ull << 20, 4ull << 20, 16ull << 20, 32ull << 20, 48ull << 20}) {
    std::printf("%5zu MB", W >> 20);
    for (int m = 0; m < 5; ++m) {
      std::vector<float> t;
      for (int r = 0; r < 21; ++r) {
        for (int h = 0; h < 3; ++h) rd(work, W);  // W in the L2
        if (m == 1) rd(flush, 2 * L2);
        if (m == 2) CK(cudaMemsetAsync(flush, r, 2 * L2));
        if (m == 3) rd(flush, flush_bytes);
        if (m == 4) {
          CK(cudaMemsetAsync(flush, r, 2 * L2));
          rd(flush + 2 * L2, 2 * L2);
        }
        CK(cudaEventRecord(e0));
        rd(work, W);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1e3f);
      }
      std::sort(t.begin(), t.end());
      std::printf(" %20.2f", t[10]);
    }
    std::printf("\n");
  }
  CK(cudaGetLastError());
  return 0;
}
