// Included by both generated translation units of step5_two_tu after every .cuh: takes the
// address of inline launchers and kernel templates, so each unit emits them (a non-inline
// definition in a header would then be defined twice and fail to link).
#pragma once
#include "step5/kernels/sm90/elementwise.cuh"
#include "step5/kernels/sm90/gemm_launch.cuh"
#include "step5/kernels/sm90/indexer_topk.cuh"

inline void* odr_use() {
  static void* const uses[] = {
      reinterpret_cast<void*>(&step5::ops::gemm_detail::launch_generic),
      reinterpret_cast<void*>(&step5::ops::gemm_detail::check_params),
      reinterpret_cast<void*>(&step5::ops::elementwise_detail::residual_to_bf16),
      reinterpret_cast<void*>(&step5::ops::elementwise_detail::add_partials_to_residual),
      reinterpret_cast<void*>(&step5::kernels::sm90::launch_topk),
      reinterpret_cast<void*>(&step5::kernels::sm90::topk_algo_from_env),
      reinterpret_cast<void*>(&step5::kernels::sm90::require_sm90a_build<0>),
  };
  return uses[0];
}
