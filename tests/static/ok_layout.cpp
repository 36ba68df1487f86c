// Must compile: every listed (geometry, tp) is a valid compile-time layout, and shard offsets are
// usable in constant expressions from g++ alone (SPEC §2–3).
#include "step5/layout/model.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/weights/fused_weight.hpp"

namespace L = step5::layout;

template <L::GeometryId Id, std::size_t... I>
constexpr bool all_listed_valid(std::index_sequence<I...>) {
  return (L::ValidLayout<L::geometry_of(Id), L::standard_layout(L::geometry_of(Id), L::entry_of(Id).tp_values[I])> &&
          ...);
}
#define STEP5_GEOMETRY(id, ...)                                        \
  static_assert(all_listed_valid<L::GeometryId::id>(                   \
      std::make_index_sequence<static_cast<std::size_t>(L::entry_of(L::GeometryId::id).num_tp_values)>{}));
#include "step5/geometries.def"
#undef STEP5_GEOMETRY

using Tp1 = L::StaticLayout<L::geometry_of(L::GeometryId::step5_preview), L::ParallelLayout{1, 4}>;
static_assert(Tp1::kFusedRows == 18496 && Tp1::kRowsWithW == 18512 && Tp1::kPaddedRows == 18512);
static_assert(Tp1::rank<0>().shard(L::Shard::kIndexG).dst_row == 18432);
using Kv8Tp4 = L::StaticLayout<L::geometry_of(L::GeometryId::dsa_h64_kv8_d128), L::ParallelLayout{4, 8}>;
static_assert(Kv8Tp4::kHpgQ == 8 && Kv8Tp4::rank<3>().shard(L::Shard::kK).src_row == 6 * 128);
static_assert(step5::checkpoint_shard_id("model.layers.3.self_attn.g_proj.weight") == "index_g");
static_assert(!step5::checkpoint_shard_id("model.layers.3.self_attn.sparse_indexer_q_norm.weight"));
