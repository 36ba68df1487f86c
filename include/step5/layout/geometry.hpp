#pragma once
/// \file step5/layout/geometry.hpp
/// Head geometry (SPEC.md §1) and parallel layout (SPEC.md §2) as structural types, usable as
/// template parameters, plus the list of supported geometries read from `step5/geometries.def`.
/// Host-safe (g++), constexpr throughout.
#include <array>
#include <bit>
#include <cstddef>
#include <string>
#include <string_view>

namespace step5::layout {

/// R, tokens per CSA region (SPEC §1): THE region size of the library (the reference, the
/// kernels, the benches and the tests use it); the checkpoint family fixes R = 8.
inline constexpr int kRegionSize = 8;
static_assert(std::has_single_bit(static_cast<unsigned>(kRegionSize)), "kRegionSize must be a power of two");
/// log2(kRegionSize): `p >> kRegionLog2` is the region of position p >= 0 (the kernels' shifts).
inline constexpr int kRegionLog2 = std::countr_zero(static_cast<unsigned>(kRegionSize));

/// Global (per model) head geometry, SPEC §1. All counts are heads or elements, not bytes.
struct Geometry {
  int num_heads = 0;           ///< H, total q heads (`num_attention_heads`)
  int num_kv_heads = 0;        ///< KV, total KV heads (`num_attention_groups`)
  int head_dim = 0;            ///< D, head dim of q, k and v
  int index_num_heads = 0;     ///< Ni, indexer q heads (`sparse_indexer_num_heads`)
  int proxy_dim = 0;           ///< P, indexer head dim
  int index_num_kv_heads = 1;  ///< Nk, indexer k (and z) heads
  int gate_size = 0;           ///< `gate_output_size` (head-wise gate rows; 0 = no gate)
  int rot_main = 0;            ///< rotated dims of main q/k (NeoX)
  int rot_idx = 0;             ///< rotated dims of indexer q/k (`sparse_indexer_rope_dim`)
  int region_size = kRegionSize;  ///< R, tokens per CSA region summary (kRegionSize)
  friend constexpr bool operator==(const Geometry&, const Geometry&) = default;
};

/// Parallel layout of one deployment, SPEC §2: `tp_size` ranks, and the indexer's
/// `index_tp_size` (= `num_provider_groups`, must equal `num_kv_heads`).
struct ParallelLayout {
  int tp_size = 1;
  int index_tp_size = 0;
  friend constexpr bool operator==(const ParallelLayout&, const ParallelLayout&) = default;
};

/// One row of the supported-geometry list.
struct GeometryEntry {
  std::string_view name;
  int hidden;  ///< default hidden size (the GEMM K is a run-time value, SPEC §8)
  Geometry geometry;
  std::array<int, 8> tp_values;  ///< supported tp_size values, padded with 0
  int num_tp_values;
};

namespace detail {
template <class... T>
constexpr std::array<int, 8> tp_array(T... tp) {
  static_assert(sizeof...(T) <= 8, "at most 8 tp values per geometry row");
  return std::array<int, 8>{tp...};
}
constexpr int count_nonzero(const std::array<int, 8>& a) {
  int n = 0;
  for (int v : a) n += (v != 0);
  return n;
}
}  // namespace detail

/// The supported geometries, in the order of `geometries.def` (SPEC §8).
inline constexpr GeometryEntry kGeometries[] = {
#define STEP5_GEOMETRY(id, hidden, H, KV, D, Ni, P, Nk, gate, rot_main, rot_idx, ...)            \
  GeometryEntry{#id, hidden, Geometry{H, KV, D, Ni, P, Nk, gate, rot_main, rot_idx, kRegionSize}, \
                detail::tp_array(__VA_ARGS__), detail::count_nonzero(detail::tp_array(__VA_ARGS__))},
#include "step5/geometries.def"
#undef STEP5_GEOMETRY
};
inline constexpr std::size_t kNumGeometries = sizeof(kGeometries) / sizeof(kGeometries[0]);

/// Compile-time ids of the list rows (`GeometryId::step5_preview`, ...).
enum class GeometryId : int {
#define STEP5_GEOMETRY(id, ...) id,
#include "step5/geometries.def"
#undef STEP5_GEOMETRY
};

/// The geometry of a list row, at compile time: `geometry_of(GeometryId::step5_preview)`.
constexpr const GeometryEntry& entry_of(GeometryId id) { return kGeometries[static_cast<int>(id)]; }
constexpr Geometry geometry_of(GeometryId id) { return entry_of(id).geometry; }

/// The list row named `name`, or nullptr.
constexpr const GeometryEntry* find_geometry(std::string_view name) {
  for (const auto& e : kGeometries)
    if (e.name == name) return &e;
  return nullptr;
}

/// The list row whose geometry equals `g`, or nullptr.
constexpr const GeometryEntry* find_geometry(const Geometry& g) {
  for (const auto& e : kGeometries)
    if (e.geometry == g) return &e;
  return nullptr;
}

/// SPEC §1: the run-time topk is in [1, kMaxTopk].
inline constexpr int kMaxTopk = 1024;

/// SPEC §2 rule 6: the DSA kernels support 4, 8 or 16 q heads per KV group (hpg_q).
constexpr bool supported_hpg_q(int hpg_q) { return hpg_q == 4 || hpg_q == 8 || hpg_q == 16; }

/// A geometry's values for messages: "H=64 KV=4 D=192 Ni=16 P=256 Nk=1 gate=64 rot_main=64
/// rot_idx=32 R=8", prefixed by its row name when it is listed in geometries.def.
inline std::string describe(const Geometry& g) {
  const std::string values =
      "H=" + std::to_string(g.num_heads) + " KV=" + std::to_string(g.num_kv_heads) + " D=" + std::to_string(g.head_dim) +
      " Ni=" + std::to_string(g.index_num_heads) + " P=" + std::to_string(g.proxy_dim) +
      " Nk=" + std::to_string(g.index_num_kv_heads) + " gate=" + std::to_string(g.gate_size) +
      " rot_main=" + std::to_string(g.rot_main) + " rot_idx=" + std::to_string(g.rot_idx) +
      " R=" + std::to_string(g.region_size);
  const GeometryEntry* e = find_geometry(g);
  return e ? std::string(e->name) + " (" + values + ")" : values;
}

/// True when `tp` is one of the tp values listed for `entry`.
constexpr bool lists_tp(const GeometryEntry& entry, int tp) {
  for (int i = 0; i < entry.num_tp_values; ++i)
    if (entry.tp_values[i] == tp) return true;
  return false;
}

/// The standard parallel layout of a geometry at `tp` (index_tp_size = num_kv_heads).
constexpr ParallelLayout standard_layout(const Geometry& g, int tp) { return {tp, g.num_kv_heads}; }

}  // namespace step5::layout
