#pragma once
/// \file step5/core/cuda_check.hpp
/// CUDA status helpers that return `step5::Status` (never exit): `STEP5_CUDA_RETURN(call)` and
/// `cuda_status(err, what)`; `require_sm90(device)` refuses devices other than Hopper;
/// `device_sm_count(device, &sms)` is the one (cached) query of a device's SM count;
/// `resolve_device(requested, what, &device)` the one rule of an op's `device` (-1: the current one).
/// Compiles with g++ given the CUDA include path (cuda_runtime_api.h only).
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <string>

#include "step5/core/status.hpp"

namespace step5 {

/// Converts a CUDA error into a Status naming the failed call.
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
                                            cudaGetErrorString(err) + ")");
}

/// Ok when `device` is a compute-capability 9.x GPU (the kernels are built for sm_90a).
inline Status require_sm90(int device) {
  int major = 0, minor = 0;
  STEP5_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                                    "cudaDeviceGetAttribute(major)"));
  STEP5_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                                    "cudaDeviceGetAttribute(minor)"));
  if (major != 9)
    return unsupported("device " + std::to_string(device) + " has compute capability " + std::to_string(major) +
                       "." + std::to_string(minor) + "; the step5 kernels need sm_90 (Hopper: H100/H200)");
  return Status::Ok();
}

/// Shared memory of an sm_90 SM (228 KiB), the most one CTA may use (227 KiB), and what the
/// driver reserves per resident CTA (1 KiB) (CUDA C++ Programming Guide, compute capability 9.0):
/// launch plans that count CTAs per SM, and kernels that size their stages, use these.
inline constexpr int kSm90SmemPerSm = 233472;
inline constexpr int kSm90MaxSmemPerCta = 232448;
inline constexpr int kSm90SmemReservedPerCta = 1024;

/// CUDA's limits on gridDim.x (2^31 - 1) and on gridDim.y and gridDim.z (every compute capability
/// from 3.0).
inline constexpr int kMaxGridDimX = 0x7fffffff;
inline constexpr int kMaxGridDimY = 65535;
inline constexpr int kMaxGridDimZ = kMaxGridDimY;

/// The number of streaming multiprocessors of `device` (cudaDevAttrMultiProcessorCount), queried
/// once per device (devices 0..63 are cached; the value never changes for a device) and safe to
/// call from several host threads and during CUDA-graph capture. The launch plans that size their
/// grids by the GPU (attention split-KV, indexer score chunks, GEMM split-K, top-k clusters,
/// `dsa_layer_plan`) all take it from here. Errors: kCudaError for a failed query.
inline Status device_sm_count(int device, int* sms) {
  static std::array<std::atomic<int>, 64> cache{};
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    const int v = cache[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
    if (v > 0) {
      *sms = v;
      return Status::Ok();
    }
  }
  int v = 0;
  STEP5_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device),
                                    "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)"));
  if (cached) cache[static_cast<std::size_t>(device)].store(v, std::memory_order_relaxed);
  *sms = v;
  return Status::Ok();
}

}  // namespace step5

/// Returns a Status from the enclosing function when the CUDA call fails.
#define STEP5_CUDA_RETURN(call) STEP5_RETURN_IF_ERROR(::step5::cuda_status((call), #call))

namespace step5 {

/// Ok when `requested` is a value of an op's `device` field or argument: -1 (the current device)
/// or a device ordinal (>= 0); else kInvalidArgument naming `what` and the value.
inline Status check_device_arg(int requested, const char* what) {
  if (requested < -1)
    return Status(StatusCode::kInvalidArgument, std::string(what) + " = " + std::to_string(requested) +
                                                    ", expected -1 (the current device) or a device ordinal >= 0");
  return Status::Ok();
}
/// The device a call runs on (the one rule of every op's `device` field or argument): `requested`
/// when it is a device ordinal (>= 0), the current device (cudaGetDevice) for -1. Errors:
/// check_device_arg's; kCudaError for a failed query.
inline Status resolve_device(int requested, const char* what, int* device) {
  STEP5_RETURN_IF_ERROR(check_device_arg(requested, what));
  if (requested >= 0) {
    *device = requested;
    return Status::Ok();
  }
  STEP5_CUDA_RETURN(cudaGetDevice(device));
  return Status::Ok();
}

/// Makes `device` current for its scope when it is not (-1: the current device, nothing to do),
/// restoring the caller's device on exit:
/// what a per-device setting (cudaFuncSetAttribute, an occupancy query, a cuBLASLt handle) or a
/// launch for a device other than the current one needs. `status` says whether the switch worked.
struct DeviceScope {
  int previous = -1;
  bool switched = false;
  Status status;
  /// `what` names the device argument in the error of a device below -1 (check_device_arg).
  explicit DeviceScope(int device, const char* what = "device") : status(enter(device, what)) {}
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (switched) (void)cudaSetDevice(previous);
  }

 private:
  Status enter(int device, const char* what) {
    STEP5_RETURN_IF_ERROR(check_device_arg(device, what));
    if (device == -1) return Status::Ok();
    STEP5_CUDA_RETURN(cudaGetDevice(&previous));
    if (previous != device) {
      STEP5_CUDA_RETURN(cudaSetDevice(device));
      switched = true;
    }
    return Status::Ok();
  }
};

}  // namespace step5
