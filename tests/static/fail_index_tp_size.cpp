// EXPECT: provider_groups_must_equal_kv_heads<2, 4>.*static assertion failed: step5 layout \(SPEC .*2 rule 2\): DSA provider groups must align with attention KV groups
// index_tp_size (num_provider_groups) 2 != num_kv_heads 4 (SPEC §2 rule 2).
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;
using Bad = L::StaticLayout<L::geometry_of(L::GeometryId::step5_preview), L::ParallelLayout{4, 2}>;
int x = Bad::kFusedRows;
