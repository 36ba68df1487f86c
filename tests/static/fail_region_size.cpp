// EXPECT: region_size_must_be_positive<0>.*static assertion failed: step5 layout: region_size
// step5_preview with no tokens per region summary: every rule of SPEC §2 holds; the failing
// instantiation names region_size (not the dims rule, whose head_dim and rotary dims are valid).
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;
constexpr L::Geometry kGeo = [] {
  L::Geometry g = L::geometry_of(L::GeometryId::step5_preview);
  g.region_size = 0;
  return g;
}();
using Bad = L::StaticLayout<kGeo, L::ParallelLayout{1, 4}>;
int x = Bad::kFusedRows;
