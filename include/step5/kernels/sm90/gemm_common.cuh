#pragma once
/// \file step5/kernels/sm90/gemm_common.cuh
/// PTX helpers of the projection GEMM kernels (SPEC §3/§4.1): the shared cp.async / ldmatrix /
/// mma.sync / mbarrier wrappers of ptx.cuh, brought into gemm_detail. Device code (nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step5/kernels/sm90/ptx.cuh"


namespace step5::kernels::sm90::gemm_detail {

using namespace ::step5::kernels::sm90::ptx;  // cp.async, ldmatrix, mma.sync, mbarrier (ptx.cuh)

}  // namespace step5::kernels::sm90::gemm_detail
