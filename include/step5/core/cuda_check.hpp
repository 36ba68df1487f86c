#pragma once
/// \file step5/core/cuda_check.hpp
/// CUDA status helpers that return `step5::Status` (never exit): `STEP5_CUDA_RETURN(call)` and
/// `cuda_status(err, what)`; `require_sm90(device)` refuses devices other than Hopper.
/// Compiles with g++ given the CUDA include path (cuda_runtime_api.h only).
#include <cuda_runtime_api.h>

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

}  // namespace step5

/// Returns a Status from the enclosing function when the CUDA call fails.
#define STEP5_CUDA_RETURN(call) STEP5_RETURN_IF_ERROR(::step5::cuda_status((call), #call))
