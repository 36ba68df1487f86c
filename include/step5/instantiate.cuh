#pragma once
/// \file step5/instantiate.cuh
/// The kernels of step5 from the headers alone: include this header in exactly ONE `.cu` of your
/// engine (built for sm_90a, e.g. CUDA_ARCHITECTURES 90a) to define every launcher declared in
/// step5/ops/*.hpp — `gemm_bf16`, `gemm_plan`, `gemm_workspace_bytes`, `residual_to_bf16`,
/// `add_partials_to_residual`, `topk_select`, `indexer_prepare/summaries/select`,
/// `sparse_attention` (run-time and per row) — for the geometry rows you choose; then do not link
/// `step5::kernels` (which holds the same definitions, built for the rows of STEP5_GEOMETRIES):
///
///     // engine_step5.cu — the only translation unit that includes step5/instantiate.cuh
///     #define STEP5_INSTANTIATE_ROWS(X) X(step5_preview)   // rows of step5/geometries.def; default: all
///     #include "step5/instantiate.cuh"
///
/// The run-time launchers return kUnsupported for a row that is not in STEP5_INSTANTIATE_ROWS.
/// Every other translation unit includes the ops/*.hpp headers (g++ is enough). All kernels are
/// templates and every launcher helper is inline, so kernels/sm90/*.cuh may be included by any
/// number of translation units; only this header defines non-inline functions.
///
/// step5::kernels is built from this header too (src/instances/): one translation unit per
/// (op, row) explicitly instantiates the row (`STEP5_INSTANTIATE_ROW_ONLY` + the
/// `STEP5_INSTANTIATE_*_ROW(id)` macros below), and one defines the entry points with
/// `STEP5_INSTANTIATE_ROWS_ELSEWHERE` (rows declared `extern template`; rows left out get stubs
/// that return kUnsupported).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/attention_launch.cuh"
#include "step5/kernels/sm90/elementwise.cuh"
#include "step5/kernels/sm90/gemm_launch.cuh"
#include "step5/kernels/sm90/indexer_args.cuh"
#include "step5/kernels/sm90/indexer_launch.cuh"
#include "step5/layout/geometry.hpp"
#include "step5/ops/attention.hpp"
#include "step5/ops/dispatch.hpp"
#include "step5/ops/elementwise.hpp"
#include "step5/ops/gemm.hpp"
#include "step5/ops/indexer.hpp"

namespace step5::ops {

/// The per-row attention launcher (declared in ops/attention.hpp).
template <layout::GeometryId Id>
Status sparse_attention(const SparseAttentionParams& p, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream) {
  return kernels::sm90::sparse_attention_entry<Id>(p, workspace, workspace_bytes, stream);
}

}  // namespace step5::ops

/// Explicit instantiation of one row's launchers (used by src/instances/*.cu.in).
#define STEP5_INSTANTIATE_ATTENTION_ROW(id)                                                                \
  namespace step5::ops {                                                                                   \
  template Status sparse_attention<layout::GeometryId::id>(const SparseAttentionParams&, void*, std::size_t, \
                                                           cudaStream_t);                                  \
  }
#define STEP5_INSTANTIATE_INDEXER_ROW(id)                                                                  \
  namespace step5::ops::detail {                                                                           \
  template Status indexer_prepare_for<layout::GeometryId::id>(const IndexerPrepareParams&, cudaStream_t);  \
  template Status indexer_summaries_for<layout::GeometryId::id>(const IndexerSummaryParams&, cudaStream_t); \
  template Status indexer_select_for<layout::GeometryId::id>(const IndexerSelectParams&, cudaStream_t);    \
  }

#ifndef STEP5_INSTANTIATE_ROW_ONLY

namespace step5::instantiate_detail {

/// Whether row `id` is built into this program (STEP5_INSTANTIATE_ROWS; default: every row).
constexpr bool row_built(layout::GeometryId id) {
#ifdef STEP5_INSTANTIATE_ROWS
#define STEP5_INSTANTIATE_ROW_IS(id_) \
  if (id == layout::GeometryId::id_) return true;
  STEP5_INSTANTIATE_ROWS(STEP5_INSTANTIATE_ROW_IS)
#undef STEP5_INSTANTIATE_ROW_IS
  return false;
#else
  (void)id;
  return true;
#endif
}

inline Status not_built(const char* op, layout::GeometryId id) {
  return unsupported(std::string(op) + ": geometry " + std::string(layout::entry_of(id).name) +
                     " was not built (STEP5_GEOMETRIES of step5::kernels, or STEP5_INSTANTIATE_ROWS of the "
                     ".cu that includes step5/instantiate.cuh)");
}

/// The device a launcher runs on (`requested`: an op's `device` field, -1 = the current device;
/// `resolve_device`) is a Hopper this translation unit's kernels were built for.
inline Status check_device(int requested, const char* op) {
  int dev = 0;
  STEP5_RETURN_IF_ERROR(resolve_device(requested, op, &dev));
  return kernels::sm90::require_sm90a_build(dev, op);
}

}  // namespace step5::instantiate_detail

#ifdef STEP5_INSTANTIATE_ROWS_ELSEWHERE
// step5::kernels: the rows of STEP5_INSTANTIATE_ROWS are instantiated by their own translation
// units (extern here) ...
#define STEP5_INSTANTIATE_EXTERN_ROW(id)                                                                      \
  namespace step5::ops {                                                                                     \
  extern template Status sparse_attention<layout::GeometryId::id>(const SparseAttentionParams&, void*,       \
                                                                   std::size_t, cudaStream_t);               \
  namespace detail {                                                                                         \
  extern template Status indexer_prepare_for<layout::GeometryId::id>(const IndexerPrepareParams&, cudaStream_t);   \
  extern template Status indexer_summaries_for<layout::GeometryId::id>(const IndexerSummaryParams&, cudaStream_t); \
  extern template Status indexer_select_for<layout::GeometryId::id>(const IndexerSelectParams&, cudaStream_t);     \
  }                                                                                                          \
  }
STEP5_INSTANTIATE_ROWS(STEP5_INSTANTIATE_EXTERN_ROW)
#undef STEP5_INSTANTIATE_EXTERN_ROW
// ... and the rows of STEP5_INSTANTIATE_STUB_ROWS (left out by STEP5_GEOMETRIES) get stubs that
// return kUnsupported, so that direct callers of `sparse_attention<Id>` (tests, benchmarks) link.
#ifdef STEP5_INSTANTIATE_STUB_ROWS
#define STEP5_INSTANTIATE_STUB_ROW(id)                                                                       \
  namespace step5::ops {                                                                                    \
  template <>                                                                                               \
  Status sparse_attention<layout::GeometryId::id>(const SparseAttentionParams&, void*, std::size_t,         \
                                                  cudaStream_t) {                                           \
    return instantiate_detail::not_built("sparse_attention", layout::GeometryId::id);                       \
  }                                                                                                         \
  }
STEP5_INSTANTIATE_STUB_ROWS(STEP5_INSTANTIATE_STUB_ROW)
#undef STEP5_INSTANTIATE_STUB_ROW
#endif
#endif  // STEP5_INSTANTIATE_ROWS_ELSEWHERE

namespace step5::ops {

Status gemm_plan(const GemmParams& p, GemmPlan* plan) { return gemm_detail::plan(p, plan); }

std::size_t gemm_workspace_bytes(std::int64_t max_tokens, std::int64_t n, std::int64_t k, int device) {
  return gemm_detail::workspace_bytes(max_tokens, n, k, device);
}

Status gemm_bf16(const GemmParams& p, cudaStream_t stream) { return gemm_detail::launch(p, stream); }

Status residual_to_bf16(const float* residual, bf16* x, std::size_t n, cudaStream_t stream) {
  return elementwise_detail::residual_to_bf16(residual, x, n, stream);
}

Status add_partials_to_residual(const bf16* const* partials, int num_partials, float* residual, std::size_t n,
                                cudaStream_t stream) {
  return elementwise_detail::add_partials_to_residual(partials, num_partials, residual, n, stream);
}

Status topk_select(const TopkSelectParams& p, cudaStream_t stream) {
  STEP5_RETURN_IF_ERROR(ops::check_topk("topk_select", p.topk));
  if (p.rows < 0) return invalid_argument("topk_select: rows = " + std::to_string(p.rows) + ", expected >= 0");
  if (p.rows == 0) return Status::Ok();
  STEP5_RETURN_IF_ERROR(require_non_null(
      "topk_select", {{"scores", p.scores}, {"history", p.history}, {"ids", p.ids}, {"counts", p.counts}}));
  // the kernel's 4-byte loads and stores (a misaligned one is a sticky device fault)
  STEP5_RETURN_IF_ERROR(require_aligned(
      "topk_select", 4, {{"scores", p.scores}, {"history", p.history}, {"ids", p.ids}, {"counts", p.counts}}));
  if (p.ld < 1 || p.ld > kTopkMaxLd)
    return invalid_argument("topk_select: ld = " + std::to_string(p.ld) + ", expected 1 .. " +
                            std::to_string(kTopkMaxLd) + " (kTopkMaxLd: the kernel's int32 key indices)");
  if (p.ld_ids < p.topk + 1)
    return invalid_argument("topk_select: ld_ids = " + std::to_string(p.ld_ids) + ", expected >= topk + 1 = " +
                            std::to_string(p.topk + 1));
  // ids row r starts at ids + r * ld_ids (no upper bound made row 1 of ld_ids 2^62 row 0 again)
  STEP5_RETURN_IF_ERROR(require_strided_rows_fit("topk_select", "ld_ids", p.rows, p.ld_ids, p.topk + 1, 4));
  STEP5_RETURN_IF_ERROR(topk_env_status());  // STEP5_TOPK (the launch's own check): named before the overlap
  {
    // each row's CTA (or cluster) writes its ids and count while other rows' CTAs still read their
    // scores and history (ids of row r over row r + 1's scores: that row selects from ids).
    // Scores: rows of ld, the last one read up to its device-held history <= ld.
    const std::uint64_t rows = static_cast<std::uint64_t>(p.rows);
    STEP5_RETURN_IF_ERROR(require_disjoint(
        "topk_select",
        {{"ids", p.ids, strided_rows_bytes(p.rows, p.ld_ids, p.topk + 1, 4)},
         {"counts", p.counts, rows * 4}},
        {{"scores", p.scores, rows * static_cast<std::uint64_t>(p.ld) * 4}, {"history", p.history, rows * 4}}));
  }
  STEP5_RETURN_IF_ERROR(instantiate_detail::check_device(-1, "topk_select"));
  return kernels::sm90::launch_topk(detail::topk_args(p), p.rows, stream);
}

/// The run-time launchers: one switch (dispatch_geometry) onto the row's instance, on `device`
/// (-1: the current device; sparse_attention's p.device, which its launch makes current).
#define STEP5_INSTANTIATE_DISPATCH(device, ret_call, op)                                             \
  STEP5_RETURN_IF_ERROR(instantiate_detail::check_device(device, op));                              \
  return dispatch_geometry(geometry, op, [&](auto tag) -> Status {                                  \
    constexpr layout::GeometryId Id = decltype(tag)::value;                                         \
    if constexpr (instantiate_detail::row_built(Id)) {                                              \
      return ret_call;                                                                              \
    } else {                                                                                        \
      return instantiate_detail::not_built(op, Id);                                                 \
    }                                                                                               \
  })

Status indexer_prepare(const IndexerPrepareParams& p, cudaStream_t stream) {
  const layout::Geometry& geometry = p.rank.geometry;
  STEP5_INSTANTIATE_DISPATCH(-1, (detail::indexer_prepare_for<Id>(p, stream)), "indexer_prepare");
}
Status indexer_summaries(const IndexerSummaryParams& p, cudaStream_t stream) {
  const layout::Geometry& geometry = p.rank.geometry;
  STEP5_INSTANTIATE_DISPATCH(-1, (detail::indexer_summaries_for<Id>(p, stream)), "indexer_summaries");
}
Status indexer_select(const IndexerSelectParams& p, cudaStream_t stream) {
  const layout::Geometry& geometry = p.rank.geometry;
  STEP5_INSTANTIATE_DISPATCH(-1, (detail::indexer_select_for<Id>(p, stream)), "indexer_select");
}
Status sparse_attention(const layout::RankLayout& rank, const SparseAttentionParams& p, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream) {
  const layout::Geometry& geometry = rank.geometry;
  STEP5_RETURN_IF_ERROR(check_device_arg(p.device, "sparse_attention: device"));  // named as its field
  STEP5_INSTANTIATE_DISPATCH(p.device, (sparse_attention<Id>(p, workspace, workspace_bytes, stream)), "sparse_attention");
}
#undef STEP5_INSTANTIATE_DISPATCH

}  // namespace step5::ops

#endif  // STEP5_INSTANTIATE_ROW_ONLY
