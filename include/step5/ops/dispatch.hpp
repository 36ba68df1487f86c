#pragma once
/// \file step5/ops/dispatch.hpp
/// THE run-time dispatch of the ops onto their per-geometry instances: one switch over the rows
/// of step5/geometries.def (generated from it). Every run-time launcher that takes a rank's
/// layout (`indexer_prepare/summaries/select`, `sparse_attention(rank, ...)`) reaches its
/// instance `..._for<Id>` / `sparse_attention<Id>` through `dispatch_geometry`; within a row,
/// `dispatch_local_layout` maps a rank's local (Hl, lg) to the row's listed compile-time layout
/// (`layout::LayoutTag<Id, tp>`), from which the attention picks its (head_dim, hpg_q) kernel
/// instance at compile time. Host code (g++-compilable).
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/layout/static_layout.hpp"

namespace step5::ops {

/// The compile-time row id passed to `dispatch_geometry` callbacks.
template <layout::GeometryId Id>
using GeometryTag = std::integral_constant<layout::GeometryId, Id>;

/// Calls `f(GeometryTag<Id>{})` for the row of geometries.def whose geometry equals `g` and
/// returns its Status; a geometry that is not listed returns kUnsupported naming `op`, the
/// geometry and the supported rows.
template <class F>
Status dispatch_geometry(const layout::Geometry& g, const char* op, F&& f) {
  switch (layout::find_geometry(g) == nullptr ? -1 : static_cast<int>(layout::find_geometry(g) - layout::kGeometries)) {
#define STEP5_GEOMETRY(id, ...) \
  case static_cast<int>(layout::GeometryId::id): return f(GeometryTag<layout::GeometryId::id>{});
#include "step5/geometries.def"
#undef STEP5_GEOMETRY
    default: break;
  }
  return unsupported(std::string(op) + ": geometry (" + layout::describe(g) +
                     ") is not in step5/geometries.def; supported: " + layout::supported_layouts());
}

namespace detail {
template <layout::GeometryId Id, class F, std::size_t... I>
Status dispatch_local_layout(int local_heads, int local_kv_groups, const char* op, F& f, std::index_sequence<I...>) {
  std::optional<Status> result;
  auto one = [&]<class Tag>(Tag tag) {
    using L = typename Tag::Layout;
    if (!result && L::kLocalHeads == local_heads && L::kLocalKvGroups == local_kv_groups) (void)result.emplace(f(tag));
  };
  (one(layout::LayoutTag<Id, layout::entry_of(Id).tp_values[I]>{}), ...);
  if (result) return *result;
  std::string layouts;
  ((layouts += (I == 0 ? "" : ", ") + std::string("tp ") +
                std::to_string(layout::LayoutTag<Id, layout::entry_of(Id).tp_values[I]>::Layout::kTpSize) + ": Hl " +
                std::to_string(layout::LayoutTag<Id, layout::entry_of(Id).tp_values[I]>::Layout::kLocalHeads) + " lg " +
                std::to_string(layout::LayoutTag<Id, layout::entry_of(Id).tp_values[I]>::Layout::kLocalKvGroups)),
   ...);
  return unsupported(std::string(op) + ": num_local_heads = " + std::to_string(local_heads) + ", num_kv_groups = " +
                     std::to_string(local_kv_groups) + " is no listed layout of geometry " +
                     std::string(layout::entry_of(Id).name) + " (" + layouts + ")");
}
}  // namespace detail

/// Calls `f(layout::LayoutTag<Id, tp>{})` for the tp listed for row `Id` in geometries.def whose
/// local layout has `local_heads` q heads (Hl) in `local_kv_groups` KV groups (lg), and returns
/// its Status. A (Hl, lg) that is no listed layout of the row returns kUnsupported naming `op`,
/// the values, the row and its listed layouts ("tp 1: Hl 64 lg 4, ..."). The listed tp values
/// of a row give distinct (Hl, lg) (Hl = H / tp).
template <layout::GeometryId Id, class F>
Status dispatch_local_layout(int local_heads, int local_kv_groups, const char* op, F&& f) {
  return detail::dispatch_local_layout<Id>(
      local_heads, local_kv_groups, op, f,
      std::make_index_sequence<static_cast<std::size_t>(layout::entry_of(Id).num_tp_values)>{});
}

}  // namespace step5::ops
