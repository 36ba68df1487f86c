#pragma once
/// \file step5/ops/elementwise.hpp
/// The small element-wise steps around a DSA layer (SPEC.md §4.8): the bf16 layer input from the
/// fp32 residual stream, and the residual add of the (all-reduced) bf16 o_proj partials. Device
/// pointers; asynchronous on `stream`; errors as Status (nothing launched). Declarations only
/// (g++-compilable); launchers in step5/kernels/sm90/elementwise.cuh, defined by
/// step5/instantiate.cuh (step5::kernels or one .cu of the engine).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"

namespace step5::ops {

/// `x[i] = bf16(residual[i])` (round-to-nearest-even) for i < n. Errors (kInvalidArgument, nothing
/// launched): a null pointer with n > 0, residual not 4-byte or x not 2-byte aligned, x's 2n bytes
/// overlapping residual's 4n (no in-place form: x[i] lands inside residual[i / 2], which another
/// thread may not have read yet), 4n bytes past 2^63 - 1 (`require_elements_fit`); kUnsupported
/// for a device that is not sm_90 (or kernels not built for it).
Status residual_to_bf16(const float* residual, bf16* x, std::size_t n, cudaStream_t stream);

/// The TP sum and residual add of SPEC §4.8 for `num_partials` bf16 arrays of n elements
/// (`partials`: a device array of device pointers): `residual[i] += float(bf16(Σ_r float(p_r[i])))`,
/// the sum in fp32 in rank order, rounded once to bf16 (as `reference::simulated_all_reduce`).
/// With one partial (already all-reduced by NCCL) this is `residual[i] += float(p[i])`.
/// Errors (kInvalidArgument, nothing launched): null pointers, num_partials < 1, `partials` not
/// 8-byte or residual not 4-byte aligned, a `partials` array the device cannot read (a plain host
/// array, unless the device reads pageable memory: cudaDevAttrPageableMemoryAccess;
/// cudaPointerGetAttributes), residual's 4n bytes overlapping the `partials` pointer array, 4n
/// bytes past 2^63 - 1; kUnsupported for a device that is not sm_90 (or kernels not built for it).
/// Not checked (the pointers live on the device): each partial array p_r must not overlap
/// residual (thread i writes residual[i] over p_r elements 2i, 2i + 1 that other threads read).
Status add_partials_to_residual(const bf16* const* partials, int num_partials, float* residual, std::size_t n,
                                cudaStream_t stream);

}  // namespace step5::ops
