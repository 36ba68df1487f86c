// EXPECT: num_heads_must_divide_by_tp_size<12, 8>.*static assertion failed: step5 layout \(SPEC .*2 rule 5\): num_heads must be divisible by tp_size
// H = 12 q heads cannot be split over tp = 8 ranks (rules 1-4 hold: KV = G = 2, Ni = 4).
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;
constexpr L::Geometry kGeo{.num_heads = 12, .num_kv_heads = 2, .head_dim = 128, .index_num_heads = 4,
                           .proxy_dim = 256, .index_num_kv_heads = 1, .gate_size = 8, .rot_main = 64,
                           .rot_idx = 32};
using Bad = L::StaticLayout<kGeo, L::ParallelLayout{8, 2}>;
int x = Bad::kFusedRows;
