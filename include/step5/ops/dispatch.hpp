#pragma once
/// \file step5/ops/dispatch.hpp
/// THE run-time dispatch of the ops onto their per-geometry instances: one switch over the rows
/// of step5/geometries.def (generated from it). Every run-time launcher that takes a rank's
/// layout (`indexer_prepare/summaries/select`, `sparse_attention(rank, ...)`) reaches its
/// instance `..._for<Id>` / `sparse_attention<Id>` through `dispatch_geometry`. Host code
/// (g++-compilable).
#include <string>
#include <type_traits>

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

}  // namespace step5::ops
