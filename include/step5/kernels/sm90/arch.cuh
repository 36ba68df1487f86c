#pragma once
/// \file step5/kernels/sm90/arch.cuh
/// The one arch guard of the step5 kernels (sm_90a: wgmma, TMA, mbarrier, setmaxnreg):
///  * `STEP5_SM90A_DEVICE` is 1 in the device pass for sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`) and 0
///    otherwise; every kernel body is wrapped in `#if STEP5_SM90A_DEVICE`, so a translation unit
///    built for another arch (e.g. CMAKE_CUDA_ARCHITECTURES "80;90a" or plain "90") still compiles;
///  * `require_sm90a_build(device, op)` is called by every launcher before it launches: it refuses
///    (kUnsupported) a device that is not compute capability 9.x and a device for which the
///    loaded image of the step5 kernels was not built for sm_90a (whose kernel bodies are empty).
///    The check reads the static shared memory of `sm90a_probe_kernel` (built by the same
///    translation unit as the launchers): its sm_90a body declares `kSm90aProbeSmem` bytes, the
///    fallback body none. No launch, no synchronisation: safe during CUDA-graph capture.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "step5/core/cuda_check.hpp"
#include "step5/core/status.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define STEP5_SM90A_DEVICE 1
#else
#define STEP5_SM90A_DEVICE 0
#endif

namespace step5::kernels::sm90 {

/// Static shared memory of the sm_90a body of `sm90a_probe_kernel` (the marker).
inline constexpr int kSm90aProbeSmem = 64;

/// Never launched: only its attributes are read (see require_sm90a_build).
template <int = 0>
__global__ void sm90a_probe_kernel(int* out) {
#if STEP5_SM90A_DEVICE
  __shared__ int marker[kSm90aProbeSmem / 4];
  marker[threadIdx.x % (kSm90aProbeSmem / 4)] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (out != nullptr) *out = marker[(threadIdx.x + 1) % (kSm90aProbeSmem / 4)];
#else
  (void)out;
#endif
}

/// Ok when `device` is compute capability 9.x and runs the sm_90a image of the step5 kernels.
/// The answer is cached per device (first 64 devices). `op` names the launcher in the message.
template <int = 0>
Status require_sm90a_build(int device, const char* op) {
  static std::atomic<std::uint64_t> ok_mask{0};
  const std::uint64_t bit = device >= 0 && device < 64 ? (std::uint64_t{1} << device) : 0;
  if (bit && (ok_mask.load(std::memory_order_acquire) & bit)) return Status::Ok();
  STEP5_RETURN_IF_ERROR(require_sm90(device));
  const DeviceScope scope(device);  // cudaFuncGetAttributes reads the current device's image
  STEP5_RETURN_IF_ERROR(scope.status);
  cudaFuncAttributes attr{};
  STEP5_RETURN_IF_ERROR(cuda_status(cudaFuncGetAttributes(&attr, sm90a_probe_kernel<0>), "cudaFuncGetAttributes(sm90a_probe_kernel)"));
  if (attr.sharedSizeBytes < static_cast<std::size_t>(kSm90aProbeSmem))
    return unsupported(std::string(op) + ": the step5 kernels loaded for device " + std::to_string(device) +
                       " were not built for sm_90a (binaryVersion " + std::to_string(attr.binaryVersion) +
                       ", ptxVersion " + std::to_string(attr.ptxVersion) +
                       "); build the translation unit that instantiates them with CUDA_ARCHITECTURES 90a");
  if (bit) ok_mask.fetch_or(bit, std::memory_order_acq_rel);
  return Status::Ok();
}

}  // namespace step5::kernels::sm90
