// EXPECT: index_heads_must_divide_by_index_tp_size<6, 4>.*static assertion failed: step5 layout \(SPEC .*2 rule 3\): index_num_heads must be divisible by index_tp_size
// Ni = 6 indexer heads cannot be split into G = 4 provider groups (SPEC §2 rule 3).
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;
constexpr L::Geometry kGeo{.num_heads = 64, .num_kv_heads = 4, .head_dim = 192, .index_num_heads = 6,
                           .proxy_dim = 256, .index_num_kv_heads = 1, .gate_size = 64, .rot_main = 64,
                           .rot_idx = 32};
using Bad = L::StaticLayout<kGeo, L::ParallelLayout{4, 4}>;
int x = Bad::kFusedRows;
