// EXPECT: hpg_q_must_be_4_8_or_16<2, 2, 1, 32>.*static assertion failed: step5 layout \(SPEC .*2 rule 6\): q heads per KV group \(hpg_q\) must be 4, 8 or 16
// step5_preview at tp=32: 2 local q heads in 1 local KV group -> hpg_q = 2 (SPEC §2 table: rejected).
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;
using Bad = L::StaticLayout<L::geometry_of(L::GeometryId::step5_preview), L::ParallelLayout{32, 4}>;
int x = Bad::kFusedRows;
