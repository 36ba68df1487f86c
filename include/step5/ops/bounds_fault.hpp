#pragma once
/// \file step5/ops/bounds_fault.hpp
/// Host helpers of the kernels' checked mode (record layout and rules: ops/batch_check.hpp).
///
/// Usage (eager or graph replay):
///   std::int32_t* rec;  cudaMalloc(&rec, kBoundsFaultWords * 4);
///   reset_bounds_fault(rec, stream);                 // before the step (also a graph node)
///   table.bounds_fault = rec;  attention.bounds_fault = rec;   // or DsaLayerStep::table
///   ... launches ...
///   Status s = read_bounds_fault(rec, {block_size, max_blocks, num_blocks, max_position, num_slots}, stream);
/// `read_bounds_fault` synchronises `stream` (call it where the engine syncs anyway).
/// g++-compilable given the CUDA include path.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "step5/core/cuda_check.hpp"
#include "step5/core/status.hpp"
#include "step5/ops/batch_check.hpp"

namespace step5::ops {

/// Zero-fills the record `rec` (device, kBoundsFaultWords int32) on `stream` (asynchronous).
inline Status reset_bounds_fault(std::int32_t* rec, cudaStream_t stream) {
  if (rec == nullptr) return invalid_argument("reset_bounds_fault: rec is null");
  return cuda_status(cudaMemsetAsync(rec, 0, kBoundsFaultWords * sizeof(std::int32_t), stream),
                     "cudaMemsetAsync(bounds_fault)");
}

/// Copies the record to the host (synchronising `stream`) and returns `bounds_fault_status`:
/// Ok when no kernel recorded a fault, else kInvalidArgument naming the request, the position and
/// the bound it broke.
inline Status read_bounds_fault(const std::int32_t* rec, const BoundsFaultContext& ctx, cudaStream_t stream) {
  if (rec == nullptr) return invalid_argument("read_bounds_fault: rec is null");
  std::int32_t h[kBoundsFaultWords] = {};
  STEP5_CUDA_RETURN(cudaMemcpyAsync(h, rec, sizeof(h), cudaMemcpyDeviceToHost, stream));
  STEP5_CUDA_RETURN(cudaStreamSynchronize(stream));
  return bounds_fault_status(h, ctx);
}

}  // namespace step5::ops
