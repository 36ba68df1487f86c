// Geometry-independent parts of step5/ops/indexer.hpp: the run-time dispatch over the geometry rows
// of the list, `topk_select` and the workspace query.
#include <cstddef>
#include <string>
#include <type_traits>

#include "step5/kernels/sm90/indexer_args.cuh"
#include "step5/layout/geometry.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/indexer.hpp"

namespace step5::ops {
namespace detail {

template <std::size_t I = 0, class F>
Status dispatch(const layout::Geometry& g, const char* op, F&& f) {
  if constexpr (I == layout::kNumGeometries) {
    return unsupported(std::string(op) + ": geometry (" + layout::describe(g) +
                       ") is not in step5/geometries.def; supported: " + layout::supported_layouts());
  } else {
    // Rows left out by STEP5_GEOMETRIES have stub launchers that return kUnsupported
    // (src/instances/unbuilt_geometry.cu.stub).
    if (layout::kGeometries[I].geometry == g)
      return f(std::integral_constant<layout::GeometryId, static_cast<layout::GeometryId>(I)>{});
    return dispatch<I + 1>(g, op, f);
  }
}
}  // namespace detail

Status indexer_prepare(const IndexerPrepareParams& p, cudaStream_t stream) {
  return detail::dispatch(p.rank.geometry, "indexer_prepare",
                          [&](auto id) { return detail::indexer_prepare_for<decltype(id)::value>(p, stream); });
}
Status indexer_summaries(const IndexerSummaryParams& p, cudaStream_t stream) {
  return detail::dispatch(p.rank.geometry, "indexer_summaries",
                          [&](auto id) { return detail::indexer_summaries_for<decltype(id)::value>(p, stream); });
}
Status indexer_select(const IndexerSelectParams& p, cudaStream_t stream) {
  return detail::dispatch(p.rank.geometry, "indexer_select",
                          [&](auto id) { return detail::indexer_select_for<decltype(id)::value>(p, stream); });
}

std::size_t indexer_select_workspace_bytes(const layout::RankLayout& rank, int max_tokens, int max_seq_len,
                                           int max_requests) {
  // The launcher's own layout (indexer_launch.cuh): plan [B+1] int32, then fp32 scores.
  const std::size_t tokens = static_cast<std::size_t>(max_tokens > 1 ? max_tokens : 1);
  return detail::plan_bytes(max_requests > 0 ? max_requests : 0) +
         tokens * static_cast<std::size_t>(rank.local_kv_groups) * static_cast<std::size_t>(detail::score_ld(max_seq_len)) * 4;
}

Status topk_select(const TopkSelectParams& p, cudaStream_t stream) {
  if (p.topk < 1 || p.topk > layout::kMaxTopk)
    return invalid_argument("topk_select: topk = " + std::to_string(p.topk) + ", expected 1 <= topk <= " +
                            std::to_string(layout::kMaxTopk) + " (SPEC §1)");
  if (p.rows < 0) return invalid_argument("topk_select: rows = " + std::to_string(p.rows) + ", expected >= 0");
  if (p.rows == 0) return Status::Ok();
  if (!p.scores || !p.history || !p.ids || !p.counts)
    return invalid_argument("topk_select: scores, history, ids and counts must be non-null");
  if (p.ld < 1) return invalid_argument("topk_select: ld = " + std::to_string(p.ld) + ", expected >= 1");
  if (p.ld_ids < p.topk + 1)
    return invalid_argument("topk_select: ld_ids = " + std::to_string(p.ld_ids) + ", expected >= topk + 1 = " +
                            std::to_string(p.topk + 1));
  return kernels::sm90::launch_topk(detail::topk_args(p), p.rows, stream);
}

}  // namespace step5::ops
