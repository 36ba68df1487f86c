#pragma once
/// \file step5/kernels/sm90/pdl.cuh
/// Programmatic dependent launch (PDL) between the kernels of a step: the one place of
///  * the device side: `pdl_wait()` (`griddepcontrol.wait`: blocks the calling thread until every
///    prerequisite grid has completed and its memory is visible; a no-op when the grid was not
///    launched with PDL) and `pdl_launch_dependents()` (`griddepcontrol.launch_dependents`: once
///    every CTA has issued it or exited, the next kernel on the stream may be scheduled);
///  * the host side: `launch_kernel`, the launch of every step5 kernel (cudaLaunchKernelEx with
///    `cudaLaunchAttributeProgrammaticStreamSerialization` while `ops::pdl_enabled()` and the
///    shape allows it (`LaunchShape::pdl`), plus an optional cluster dimension), returning Status.
/// The rule every kernel launched through `launch_kernel` follows: every thread calls `pdl_wait()`
/// before its first global-memory access other than reads of weights and constants, and before
/// any exit (so that a kernel's completion implies its predecessors' completion, transitively,
/// and no kernel writes memory a still-running predecessor reads); `pdl_launch_dependents()`
/// after the main loop. With PDL the dependent kernel only gains the launch latency and its
/// prologue: its results are bit-identical to a launch without PDL.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "step5/core/cuda_check.hpp"
#include "step5/core/status.hpp"
#include "step5/kernels/sm90/arch.cuh"
#include "step5/ops/pdl.hpp"

namespace step5::kernels::sm90 {

/// Waits until the grids this one depends on (PDL) have completed and their writes are visible.
/// Every thread that reads a predecessor's output or writes global memory calls it first.
__device__ __forceinline__ void pdl_wait() {
#if STEP5_SM90A_DEVICE
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// Lets the next kernel on the stream (launched with PDL) be scheduled once every CTA of this grid
/// has called it or exited. Not a memory fence: the dependent still waits (pdl_wait) for completion.
__device__ __forceinline__ void pdl_launch_dependents() {
#if STEP5_SM90A_DEVICE
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Grid, block, dynamic shared memory and (optionally) the cluster size along x or z of one launch.
struct LaunchShape {
  dim3 grid{1, 1, 1};
  dim3 block{1, 1, 1};
  std::size_t smem = 0;      ///< dynamic shared memory bytes
  unsigned cluster_x = 1;    ///< CTAs per cluster along x (1 and cluster_z 1: no cluster attribute)
  unsigned cluster_z = 1;    ///< CTAs per cluster along z
  /// false: no programmatic stream serialization even while ops::pdl_enabled() (a launcher's
  /// measured choice, e.g. ops::topk_launch_uses_pdl)
  bool pdl = true;
};

/// The cudaLaunchConfig_t of `shape` on `stream` (attributes in `attr`, which must outlive it):
/// the cluster dimension when `shape.cluster_x` or `shape.cluster_z` > 1, programmatic stream
/// serialization when `pdl`.
inline cudaLaunchConfig_t make_launch_config(const LaunchShape& shape, cudaStream_t stream, bool pdl,
                                             cudaLaunchAttribute (&attr)[2]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = shape.smem;
  cfg.stream = stream;
  unsigned n = 0;
  if (shape.cluster_x > 1 || shape.cluster_z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = shape.cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = shape.cluster_z;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cfg;
}

/// Launches `kernel(args...)` with `shape` on `stream`: cudaLaunchKernelEx with the programmatic
/// stream serialization attribute while `ops::pdl_enabled()` and `shape.pdl` (the kernel must
/// follow the rule of this file either way) and the cluster dimension when `shape.cluster_x` or
/// `shape.cluster_z` > 1. Errors: kInvalidArgument from
/// `ops::pdl_env_status` (STEP5_PDL neither 0 nor 1; nothing launched), kCudaError naming `what`
/// (the launch error is also cleared from cudaGetLastError).
template <class... KernelArgs, class... Args>
inline ::step5::Status launch_kernel(const char* what, void (*kernel)(KernelArgs...), const LaunchShape& shape,
                                     cudaStream_t stream, Args&&... args) {
  if (::step5::Status env = ::step5::ops::pdl_env_status(); !env.ok()) return env;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = make_launch_config(shape, stream, shape.pdl && ::step5::ops::pdl_enabled(), attr);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return ::step5::cuda_status(err, what);
}

}  // namespace step5::kernels::sm90
