// EXPECT: fused_rows_must_fit_int<256, 16777216, 16, 16777216>.*static assertion failed: step5 layout: the fused projection's rows
// H = 256 heads of head_dim 2^24 (and proxy_dim 2^24): 2^32 q rows alone; every rule of SPEC §2 holds
// (KV = G = 16, Ni = 16, hpg_q = 16), the int row offsets would overflow.
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;
constexpr L::Geometry kGeo{.num_heads = 256, .num_kv_heads = 16, .head_dim = 1 << 24, .index_num_heads = 16,
                           .proxy_dim = 1 << 24, .index_num_kv_heads = 1, .gate_size = 256, .rot_main = 64,
                           .rot_idx = 32};
using Bad = L::StaticLayout<kGeo, L::ParallelLayout{1, 16}>;
int x = Bad::kFusedRows;
