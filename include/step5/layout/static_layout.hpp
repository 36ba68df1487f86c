#pragma once
/// \file step5/layout/static_layout.hpp
/// Compile-time parallel layouts: `StaticLayout<G, L>` checks every rule of SPEC.md §2 with a
/// `static_assert` whose failing instantiation names the offending numbers
/// (e.g. `hpg_q_must_be_4_8_or_16<hpg_q = 2, ...>`), and exposes every per-rank quantity and
/// shard offset as constexpr. `dispatch_layout` maps a run-time (geometry name, tp) to the
/// compile-time layout of a row of `geometries.def`. Host-safe (g++).
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "step5/layout/parallel.hpp"

namespace step5::layout {

namespace check {
// One template per rule of SPEC §2; the template arguments are the offending numbers, so the
// compiler's "in instantiation of" line names them next to the message.
template <int num_heads, int num_kv_heads>
struct heads_must_be_positive {
  static_assert(num_heads > 0 && num_kv_heads > 0,
                "step5 layout (SPEC §2 rule 1): num_heads and num_kv_heads must be > 0");
};
template <int index_tp_size, int num_kv_heads>
struct provider_groups_must_equal_kv_heads {
  static_assert(index_tp_size > 0 && index_tp_size == num_kv_heads,
                "step5 layout (SPEC §2 rule 2): DSA provider groups must align with attention KV groups "
                "(index_tp_size == num_kv_heads)");
};
template <int index_num_heads, int index_tp_size>
struct index_heads_must_divide_by_index_tp_size {
  static_assert(index_num_heads > 0 && index_tp_size > 0 && index_num_heads % index_tp_size == 0,
                "step5 layout (SPEC §2 rule 3): index_num_heads must be divisible by index_tp_size");
};
template <int index_tp_size, int num_kv_heads, int tp_size>
struct groups_per_rank_must_match {
  static_assert(groups_per_rank(index_tp_size, tp_size) != 0 && groups_per_rank(num_kv_heads, tp_size) != 0 &&
                    groups_per_rank(index_tp_size, tp_size) == groups_per_rank(num_kv_heads, tp_size),
                "step5 layout (SPEC §2 rule 4): groups_per_rank(index_tp_size, tp_size) must equal "
                "groups_per_rank(num_kv_heads, tp_size); one must divide the other");
};
template <int num_heads, int tp_size>
struct num_heads_must_divide_by_tp_size {
  static_assert(tp_size > 0 && num_heads % tp_size == 0,
                "step5 layout (SPEC §2 rule 5): num_heads must be divisible by tp_size");
};
template <int hpg_q, int local_heads, int local_kv_groups, int tp_size>
struct hpg_q_must_be_4_8_or_16 {
  static_assert(supported_hpg_q(hpg_q),
                "step5 layout (SPEC §2 rule 6): q heads per KV group (hpg_q) must be 4, 8 or 16, the DSA "
                "kernels' sizes");
};
template <int index_num_kv_heads, int tp_size>
struct index_kv_heads_must_divide_tp {
  static_assert(index_num_kv_heads > 0 && (index_num_kv_heads > tp_size ? index_num_kv_heads % tp_size == 0
                                                                        : tp_size % index_num_kv_heads == 0),
                "step5 layout (SPEC §2 rule 7): index_num_kv_heads must divide tp_size or be divisible by it");
};
template <int proxy_dim, int gate_size, int tp_size>
struct gate_must_divide_by_tp_size {
  static_assert(proxy_dim > 0 && gate_size % tp_size == 0,
                "step5 layout (SPEC §2 rule 8): proxy_dim must be > 0 and gate_size divisible by tp_size");
};
template <int head_dim, int rot_main, int proxy_dim, int rot_idx>
struct rotary_dims_must_fit {
  static_assert(head_dim != head_dim,  // only instantiated when the rule failed (any head_dim)
                "step5 layout: head_dim > 0, rot_main even and <= head_dim, rot_idx even and <= proxy_dim");
};

template <int region_size>
struct region_size_must_be_positive {
  static_assert(region_size > 0, "step5 layout: region_size (tokens per CSA region summary) must be > 0");
};

template <int num_heads, int head_dim, int index_num_heads, int proxy_dim>
struct fused_rows_must_fit_int {
  static_assert(head_dim != head_dim,  // only instantiated when the rule failed
                "step5 layout: the fused projection's rows (H*D + 2*KV*D + Ni*(P+1) + 2*Nk*P + gate, padded) "
                "must be < 2^31");
};

/// Instantiates the checker of the first violated rule (none when valid).
template <LayoutError E>
consteval bool report() {
  using R = LayoutRule;
  if constexpr (E.rule == R::kHeadsPositive) return sizeof(heads_must_be_positive<E.a, E.b>) == 0;
  else if constexpr (E.rule == R::kProviderGroups) return sizeof(provider_groups_must_equal_kv_heads<E.a, E.b>) == 0;
  else if constexpr (E.rule == R::kIndexHeadsDivisible) return sizeof(index_heads_must_divide_by_index_tp_size<E.a, E.b>) == 0;
  else if constexpr (E.rule == R::kGroupsPerRank) return sizeof(groups_per_rank_must_match<E.a, E.b, E.c>) == 0;
  else if constexpr (E.rule == R::kHeadsDivisibleByTp) return sizeof(num_heads_must_divide_by_tp_size<E.a, E.b>) == 0;
  else if constexpr (E.rule == R::kHeadsPerGroup) return sizeof(hpg_q_must_be_4_8_or_16<E.a, E.b, E.c, E.d>) == 0;
  else if constexpr (E.rule == R::kIndexKvHeads) return sizeof(index_kv_heads_must_divide_tp<E.a, E.b>) == 0;
  else if constexpr (E.rule == R::kShardMultiples) return sizeof(gate_must_divide_by_tp_size<E.a, E.b, E.c>) == 0;
  else if constexpr (E.rule == R::kDims) return sizeof(rotary_dims_must_fit<E.a, E.b, E.c, E.d>) == 0;
  else if constexpr (E.rule == R::kRegionSize) return sizeof(region_size_must_be_positive<E.a>) == 0;
  else if constexpr (E.rule == R::kRowsFitInt) return sizeof(fused_rows_must_fit_int<E.a, E.b, E.c, E.d>) == 0;
  else return true;
}
}  // namespace check

/// True when (G, L) satisfies every rule of SPEC §2.
template <Geometry G, ParallelLayout L>
concept ValidLayout = validate(G, L).ok();

/// The compile-time layout of geometry G at parallel layout L. Instantiating it with an invalid
/// layout fails to compile with the rule's message and its numbers.
template <Geometry G, ParallelLayout L>
struct StaticLayout {
  static constexpr LayoutError kError = validate(G, L);
  static_assert(check::report<kError>(), "step5: invalid compile-time parallel layout (see the rule above)");

  static constexpr Geometry kGeometry = G;
  static constexpr ParallelLayout kParallel = L;
  static constexpr int kTpSize = L.tp_size;
  static constexpr RankLayout kRank0 = make_rank_layout(G, L, 0).layout;
  static constexpr int kLocalHeads = kRank0.local_heads;
  static constexpr int kLocalKvGroups = kRank0.local_kv_groups;
  static constexpr int kHpgQ = kRank0.hpg_q;
  static constexpr int kLocalKvHeads = kRank0.local_kv_heads;
  static constexpr int kKvHeadReplicas = kRank0.kv_head_replicas;
  static constexpr int kHpgI = kRank0.hpg_i;
  static constexpr int kIndexLocalHeads = kRank0.index_local_heads;
  static constexpr int kIndexKvHeadReplicas = kRank0.index_kv_head_replicas;
  static constexpr int kLocalGate = kRank0.local_gate;
  static constexpr int kQkvRows = kRank0.qkv_rows;
  static constexpr int kFusedRows = kRank0.fused_rows;
  static constexpr int kRowsWithW = kRank0.rows_with_w;
  static constexpr int kPaddedRows = kRank0.padded_rows;

  /// The layout of rank `tp_rank` (constexpr; a rank outside [0, tp) fails to compile).
  template <int tp_rank>
  static constexpr RankLayout rank() {
    static_assert(tp_rank >= 0 && tp_rank < L.tp_size, "step5: tp_rank must lie in [0, tp_size)");
    return make_rank_layout(G, L, tp_rank).layout;
  }
  /// The layout of rank `tp_rank` given at run time: `make_rank_layout(G, L, tp_rank)`, whose
  /// error is kRankRange (and `layout` unspecified) when tp_rank is outside [0, tp_size).
  static constexpr RankLayoutResult rank(int tp_rank) { return make_rank_layout(G, L, tp_rank); }
};

/// A (geometry row, tp) pair fixed at compile time, as passed to `dispatch_layout` callbacks.
template <GeometryId Id, int Tp>
struct LayoutTag {
  static constexpr GeometryId kId = Id;
  static constexpr const GeometryEntry& kEntry = entry_of(Id);
  static constexpr Geometry kGeometry = entry_of(Id).geometry;
  static constexpr ParallelLayout kParallel = standard_layout(entry_of(Id).geometry, Tp);
  using Layout = StaticLayout<kGeometry, kParallel>;
};

/// "step5_preview (tp 1 2 4 8 16), dsa_h64_kv8_d128 (tp 1 2 4 8 16)".
inline std::string supported_layouts() {
  std::string s;
  for (const auto& e : kGeometries) {
    if (!s.empty()) s += ", ";
    s += std::string(e.name) + " (tp";
    for (int i = 0; i < e.num_tp_values; ++i) {
      s += ' ';  // (not `" " + to_string`: g++ 12 -Wrestrict false positive, GCC PR105329)
      s += std::to_string(e.tp_values[i]);
    }
    s += ")";
  }
  return s;
}

namespace detail {
template <GeometryId Id, class F, std::size_t... I>
Status dispatch_tp(int tp, F& f, std::index_sequence<I...>) {
  std::optional<Status> result;
  ((!result && entry_of(Id).tp_values[I] == tp ? (void)result.emplace(f(LayoutTag<Id, entry_of(Id).tp_values[I]>{}))
                                               : (void)0),
   ...);
  if (!result)
    return unsupported("tp_size " + std::to_string(tp) + " is not supported for geometry " +
                       std::string(entry_of(Id).name) + "; supported: " + supported_layouts());
  return *result;
}
}  // namespace detail

/// Calls `f(LayoutTag<Id, tp>{})` for the list row named `geometry` and its listed `tp`
/// (f returns Status). An unknown geometry or tp returns kUnsupported listing the supported ones.
template <class F>
Status dispatch_layout(std::string_view geometry, int tp, F&& f) {
#define STEP5_GEOMETRY(id, ...)                                                                  \
  if (geometry == #id)                                                                           \
    return detail::dispatch_tp<GeometryId::id>(                                                  \
        tp, f, std::make_index_sequence<static_cast<std::size_t>(entry_of(GeometryId::id).num_tp_values)>{});
#include "step5/geometries.def"
#undef STEP5_GEOMETRY
  return unsupported("unknown geometry '" + std::string(geometry) + "'; supported: " + supported_layouts());
}

/// Calls `f(LayoutTag<Id, tp>{})` for every (geometry, tp) of the list, in list order.
template <class F>
void for_each_layout(F&& f) {
  auto one = [&]<GeometryId Id, std::size_t... I>(std::index_sequence<I...>) {
    (f(LayoutTag<Id, entry_of(Id).tp_values[I]>{}), ...);
  };
#define STEP5_GEOMETRY(id, ...) \
  one.template operator()<GeometryId::id>(std::make_index_sequence<static_cast<std::size_t>(entry_of(GeometryId::id).num_tp_values)>{});
#include "step5/geometries.def"
#undef STEP5_GEOMETRY
}

}  // namespace step5::layout
