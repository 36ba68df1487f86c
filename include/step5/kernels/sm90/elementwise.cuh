#pragma once
/// \file step5/kernels/sm90/elementwise.cuh
/// Element-wise steps around a DSA layer (step5/ops/elementwise.hpp, SPEC §4.8): the kernels
/// (templates, so any number of translation units may include this header) and their checked
/// launchers (inline). The public `residual_to_bf16` / `add_partials_to_residual` are defined from
/// these by step5/instantiate.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "step5/core/cuda_check.hpp"
#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/ops/elementwise.hpp"

namespace step5::kernels::sm90 {

inline constexpr int kElementwiseThreads = 256;

template <int = 0>
__global__ void residual_to_bf16_kernel(const float* __restrict__ r, __nv_bfloat16* __restrict__ x, std::size_t n) {
#if STEP5_SM90A_DEVICE
  pdl_wait();
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(r[i]);
  pdl_launch_dependents();
#endif
}

template <int = 0>
__global__ void add_partials_kernel(const __nv_bfloat16* const* __restrict__ parts, int np, float* __restrict__ r,
                                    std::size_t n) {
#if STEP5_SM90A_DEVICE
  pdl_wait();
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int p = 0; p < np; ++p) s += __bfloat162float(parts[p][i]);
    r[i] += __bfloat162float(__float2bfloat16_rn(s));
  }
  pdl_launch_dependents();
#endif
}

}  // namespace step5::kernels::sm90

namespace step5::ops::elementwise_detail {

inline int grid_for(std::size_t n) {
  const std::size_t blocks = (n + kernels::sm90::kElementwiseThreads - 1) / kernels::sm90::kElementwiseThreads;
  return static_cast<int>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

inline Status check_device(const char* op) {
  int dev = 0;
  STEP5_CUDA_RETURN(cudaGetDevice(&dev));
  return kernels::sm90::require_sm90a_build(dev, op);
}

inline Status residual_to_bf16(const float* residual, bf16* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  if (residual == nullptr || x == nullptr)
    return invalid_argument("residual_to_bf16: null pointer with n = " + std::to_string(n));
  STEP5_RETURN_IF_ERROR(require_elements_fit("residual_to_bf16", "n", n, 4));  // residual's n * 4 bytes
  // the kernel's element loads and stores (a misaligned one is a sticky device fault)
  STEP5_RETURN_IF_ERROR(require_aligned("residual_to_bf16", alignof(float), {{"residual", residual}}));
  STEP5_RETURN_IF_ERROR(require_aligned("residual_to_bf16", alignof(bf16), {{"x", x}}));
  // x[i] (2 bytes) lands inside residual[i / 2] when they overlap: thread i may overwrite a value
  // another thread has not read yet (x == residual: thread 2j writes over residual[j]), no exact
  // in-place form exists (the element sizes differ)
  STEP5_RETURN_IF_ERROR(require_disjoint("residual_to_bf16", {{"x", x, static_cast<std::uint64_t>(n) * 2}},
                                         {{"residual", residual, static_cast<std::uint64_t>(n) * 4}}));
  STEP5_RETURN_IF_ERROR(check_device("residual_to_bf16"));
  return kernels::sm90::launch_kernel("residual_to_bf16 launch", &kernels::sm90::residual_to_bf16_kernel<>,
                                      {dim3(grid_for(n)), dim3(kernels::sm90::kElementwiseThreads)}, stream, residual,
                                      reinterpret_cast<__nv_bfloat16*>(x), n);
}

inline Status add_partials_to_residual(const bf16* const* partials, int num_partials, float* residual, std::size_t n,
                                       cudaStream_t stream) {
  if (n == 0) return Status::Ok();
  if (num_partials < 1)
    return invalid_argument("add_partials_to_residual: num_partials = " + std::to_string(num_partials) +
                            ", expected >= 1");
  if (partials == nullptr || residual == nullptr)
    return invalid_argument("add_partials_to_residual: null pointer with n = " + std::to_string(n));
  STEP5_RETURN_IF_ERROR(require_elements_fit("add_partials_to_residual", "n", n, 4));  // residual's n * 4 bytes
  // the kernel's loads of the pointer array and of residual (a misaligned one is a sticky device fault)
  STEP5_RETURN_IF_ERROR(require_aligned("add_partials_to_residual", alignof(const bf16*), {{"partials", partials}}));
  STEP5_RETURN_IF_ERROR(require_aligned("add_partials_to_residual", alignof(float), {{"residual", residual}}));
  // every thread reads the whole pointer array while others write residual: residual over it would
  // turn later threads' partial pointers into fp32 sums (the partial arrays themselves live on the
  // device and cannot be checked here; see ops/elementwise.hpp)
  STEP5_RETURN_IF_ERROR(require_disjoint(
      "add_partials_to_residual", {{"residual", residual, static_cast<std::uint64_t>(n) * 4}},
      {{"partials", partials, static_cast<std::uint64_t>(num_partials) * sizeof(const bf16*)}}));
  STEP5_RETURN_IF_ERROR(check_device("add_partials_to_residual"));
  // the kernel reads the pointer array itself: a host array (the easy mistake, NCCL and most APIs
  // take host arrays of device pointers) would be a sticky illegal-address fault
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, partials) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    attr.type = cudaMemoryTypeUnregistered;
  }
  int dev = 0, pageable = 0;  // HMM / GH200: the device reads pageable host memory too
  if (attr.type == cudaMemoryTypeUnregistered && cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev) != cudaSuccess)
    pageable = 0;
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged &&
      !(attr.type == cudaMemoryTypeHost && attr.devicePointer == partials) &&
      !(attr.type == cudaMemoryTypeUnregistered && pageable))
    return invalid_argument("add_partials_to_residual: partials is not device-readable memory (cudaPointerGetAttributes "
                            "type " + std::to_string(static_cast<int>(attr.type)) +
                            "), expected a device array of num_partials = " + std::to_string(num_partials) +
                            " device pointers");
  return kernels::sm90::launch_kernel("add_partials_to_residual launch", &kernels::sm90::add_partials_kernel<>,
                                      {dim3(grid_for(n)), dim3(kernels::sm90::kElementwiseThreads)}, stream,
                                      reinterpret_cast<const __nv_bfloat16* const*>(partials), num_partials, residual,
                                      n);
}

}  // namespace step5::ops::elementwise_detail
