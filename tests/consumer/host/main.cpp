// Consumer smoke test: a g++-only translation unit that includes the layout headers of the
// installed package and computes shard offsets at compile time (SPEC §2–3).
#include <cstdio>

#include "step5/step5.hpp"

namespace L = step5::layout;
using Tp8 = L::StaticLayout<L::geometry_of(L::GeometryId::step5_preview), L::ParallelLayout{8, 4}>;
static_assert(Tp8::kFusedRows == 3464, "SPEC §2 table: tp=8 total rows");
constexpr L::RankLayout kRank5 = Tp8::rank<5>();
static_assert(kRank5.shard(L::Shard::kK).src_row == 2 * 192, "rank 5 at tp=8 reads KV head 2");

int main() {
  std::printf("step5 consumer: tp=8 rank 5 index_q rows [%d, +%d) -> dst %d\n",
              kRank5.shard(L::Shard::kIndexQ).src_row, kRank5.shard(L::Shard::kIndexQ).rows,
              kRank5.shard(L::Shard::kIndexQ).dst_row);
  return 0;
}
