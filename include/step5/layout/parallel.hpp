#pragma once
/// \file step5/layout/parallel.hpp
/// Parallel layout of one TP rank (SPEC.md §2) and the shard map of the fused projection weight
/// (SPEC.md §3), as constexpr functions usable at compile time (`StaticLayout<G, L>`, checked by
/// `static_assert`s that name the offending numbers) and at run time (`make_rank_layout`, which
/// returns the first violated rule of SPEC §2 as a value). Host-safe (g++).
#include <array>
#include <limits>
#include <string>
#include <string_view>

#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"

namespace step5::layout {

/// The validation rules of SPEC §2, in the order they are checked (plus the dims, region-size and
/// row-count rules and the rank range, checked last, in that order).
enum class LayoutRule : int {
  kOk = 0,
  kHeadsPositive = 1,           ///< rule 1: H > 0 and KV > 0          (a = H, b = KV)
  kProviderGroups = 2,          ///< rule 2: G > 0 and G == KV         (a = G, b = KV)
  kIndexHeadsDivisible = 3,     ///< rule 3: Ni > 0 and Ni % G == 0    (a = Ni, b = G)
  kGroupsPerRank = 4,           ///< rule 4: groups_per_rank(G,tp) == groups_per_rank(KV,tp), defined
                                ///<         (a = G, b = KV, c = tp)
  kHeadsDivisibleByTp = 5,      ///< rule 5: H % tp == 0               (a = H, b = tp)
  kHeadsPerGroup = 6,           ///< rule 6: Hl % lg == 0, hpg_q in {4,8,16} (a = hpg_q, b = Hl, c = lg, d = tp)
  kIndexKvHeads = 7,            ///< rule 7: Nk > 0; Nk % tp or tp % Nk (a = Nk, b = tp)
  kShardMultiples = 8,          ///< rule 8: P > 0, gate % tp == 0     (a = P, b = gate, c = tp)
  kDims = 9,                    ///< D > 0, rot_main even <= D, rot_idx even <= P
                                ///< (a = D, b = rot_main, c = P, d = rot_idx)
  kRankRange = 10,              ///< 0 <= rank < tp                    (a = rank, b = tp)
  kRowsFitInt = 11,             ///< the fused weight's global rows H·D + 2·KV·D + Ni·(P + 1) + 2·Nk·P +
                                ///< gate + 8 (padding) < 2^31 (a = H, b = D, c = Ni, d = P)
  kRegionSize = 12,             ///< R > 0, checked after kDims (a = R)
};

/// A violated rule and the numbers that violate it (kOk when valid). Structural, constexpr.
struct LayoutError {
  LayoutRule rule = LayoutRule::kOk;
  int a = 0, b = 0, c = 0, d = 0;
  constexpr bool ok() const { return rule == LayoutRule::kOk; }
};

/// `groups_per_rank(n, tp)` of SPEC §2: n/tp if tp divides n, 1 if n divides tp; 0 when
/// undefined (n <= 0, tp <= 0, or neither divides the other).
constexpr int groups_per_rank(int n, int tp) {
  if (n <= 0 || tp <= 0) return 0;
  if (n % tp == 0) return n / tp;
  if (tp % n == 0) return 1;
  return 0;
}

/// `group_partition(n_groups, tp, rank)` of SPEC §2.
struct GroupPartition {
  int first_group = 0;
  int local_groups = 0;
  int replication = 0;
  bool ok = false;  ///< false when groups_per_rank is undefined or rank is outside [0, tp)
};
constexpr GroupPartition group_partition(int n_groups, int tp, int rank) {
  const int local = groups_per_rank(n_groups, tp);
  if (local == 0 || rank < 0 || rank >= tp) return {};
  if (tp <= n_groups) return {rank * local, local, 1, true};
  const int r = tp / n_groups;
  return {rank / r, 1, r, true};
}

/// Rows of the fused projection over all ranks at tp 1, in int64 (the per-rank shard offsets,
/// rows and padded_rows are int and never exceed it): q H·D, k and v KV·D each, index_q Ni·P,
/// index_k and index_z Nk·P each, the gate, sparse_indexer_w Ni, and up to 8 padding rows.
/// Saturated at the int64 range: each term (a product of two ints) fits, their sum may not
/// (Ni = P = Nk = 2^31 - 1: about 2^63.6 rows), and `validate` compares it with 2^31.
constexpr long long fused_global_rows(const Geometry& g) {
  using ll = long long;
  constexpr ll kMax = std::numeric_limits<ll>::max(), kMin = std::numeric_limits<ll>::min();
  const ll kv = ll{g.num_kv_heads} * g.head_dim, nk = ll{g.index_num_kv_heads} * g.proxy_dim;
  const ll terms[] = {ll{g.num_heads} * g.head_dim, kv, kv, ll{g.index_num_heads} * g.proxy_dim, nk, nk,
                      g.gate_size, g.index_num_heads, 8};
  ll rows = 0;
  for (const ll t : terms) rows = t > 0 && rows > kMax - t ? kMax : t < 0 && rows < kMin - t ? kMin : rows + t;
  return rows;
}

/// Checks the rules of SPEC §2 in order; returns the first violated one.
constexpr LayoutError validate(const Geometry& g, const ParallelLayout& p) {
  using R = LayoutRule;
  const int tp = p.tp_size, G = p.index_tp_size;
  if (g.num_heads <= 0 || g.num_kv_heads <= 0) return {R::kHeadsPositive, g.num_heads, g.num_kv_heads};
  if (G <= 0 || G != g.num_kv_heads) return {R::kProviderGroups, G, g.num_kv_heads};
  if (g.index_num_heads <= 0 || g.index_num_heads % G != 0)
    return {R::kIndexHeadsDivisible, g.index_num_heads, G};
  const int lg_i = groups_per_rank(G, tp), lg = groups_per_rank(g.num_kv_heads, tp);
  if (lg_i == 0 || lg == 0 || lg_i != lg) return {R::kGroupsPerRank, G, g.num_kv_heads, tp};
  if (g.num_heads % tp != 0) return {R::kHeadsDivisibleByTp, g.num_heads, tp};
  const int hl = g.num_heads / tp;
  const int hpg = hl % lg == 0 ? hl / lg : 0;
  if (hl % lg != 0 || !supported_hpg_q(hpg)) return {R::kHeadsPerGroup, hpg, hl, lg, tp};
  const int nk = g.index_num_kv_heads;
  if (nk <= 0 || (nk > tp ? nk % tp != 0 : tp % nk != 0)) return {R::kIndexKvHeads, nk, tp};
  if (g.proxy_dim <= 0 || g.gate_size < 0 || g.gate_size % tp != 0)
    return {R::kShardMultiples, g.proxy_dim, g.gate_size, tp};
  if (g.head_dim <= 0 || g.rot_main < 0 || g.rot_main % 2 != 0 || g.rot_main > g.head_dim ||
      g.rot_idx < 0 || g.rot_idx % 2 != 0 || g.rot_idx > g.proxy_dim)
    return {R::kDims, g.head_dim, g.rot_main, g.proxy_dim, g.rot_idx};
  if (g.region_size <= 0) return {R::kRegionSize, g.region_size};
  if (fused_global_rows(g) > 0x7fffffffll) return {R::kRowsFitInt, g.num_heads, g.head_dim, g.index_num_heads, g.proxy_dim};
  return {};
}

/// A readable message for a violated rule, naming the offending numbers (empty when ok).
inline std::string describe(const LayoutError& e) {
  auto s = [](int v) { return std::to_string(v); };
  switch (e.rule) {
    case LayoutRule::kOk: return {};
    case LayoutRule::kHeadsPositive:
      return "num_heads (" + s(e.a) + ") and num_kv_heads (" + s(e.b) + ") must both be > 0 (SPEC §2 rule 1)";
    case LayoutRule::kProviderGroups:
      return "DSA provider groups must align with attention KV groups: index_tp_size = " + s(e.a) +
             ", num_kv_heads = " + s(e.b) + " (SPEC §2 rule 2)";
    case LayoutRule::kIndexHeadsDivisible:
      return "index_num_heads (" + s(e.a) + ") must be > 0 and divisible by index_tp_size (" + s(e.b) +
             ") (SPEC §2 rule 3)";
    case LayoutRule::kGroupsPerRank:
      return "groups_per_rank(index_tp_size = " + s(e.a) + ", tp_size = " + s(e.c) +
             ") must equal groups_per_rank(num_kv_heads = " + s(e.b) + ", tp_size = " + s(e.c) +
             "), and for each one must divide the other (SPEC §2 rule 4)";
    case LayoutRule::kHeadsDivisibleByTp:
      return "num_heads (" + s(e.a) + ") must be divisible by tp_size (" + s(e.b) + ") (SPEC §2 rule 5)";
    case LayoutRule::kHeadsPerGroup:
      return "q heads per KV group hpg_q = " + s(e.b) + " local q heads / " + s(e.c) +
             " local KV groups at tp_size = " + s(e.d) + (e.a ? " is " + s(e.a) : std::string(" is not an integer")) +
             "; the DSA kernels support 4, 8 or 16 (SPEC §2 rule 6)";
    case LayoutRule::kIndexKvHeads:
      return "index_num_kv_heads (" + s(e.a) + ") must be > 0 and divide or be divisible by tp_size (" + s(e.b) +
             ") (SPEC §2 rule 7)";
    case LayoutRule::kShardMultiples:
      return "proxy_dim (" + s(e.a) + ") must be > 0 and gate_size (" + s(e.b) + ") divisible by tp_size (" +
             s(e.c) + ") (SPEC §2 rule 8)";
    case LayoutRule::kDims:
      return "head_dim (" + s(e.a) + ") must be > 0, rot_main (" + s(e.b) + ") even and <= head_dim, rot_idx (" +
             s(e.d) + ") even and <= proxy_dim (" + s(e.c) + ")";
    case LayoutRule::kRegionSize:
      return "region_size (" + s(e.a) + ") must be > 0 (tokens per CSA region summary)";
    case LayoutRule::kRankRange:
      return "tp_rank (" + s(e.a) + ") must lie in [0, tp_size = " + s(e.b) + ")";
    case LayoutRule::kRowsFitInt:
      return "the fused projection's rows (num_heads x head_dim + 2 num_kv_heads x head_dim + index_num_heads x "
             "(proxy_dim + 1) + 2 index_num_kv_heads x proxy_dim + gate_size, padded; layout::fused_global_rows) must "
             "be < 2^31; num_heads = " +
             s(e.a) + ", head_dim = " + s(e.b) + ", index_num_heads = " + s(e.c) + ", proxy_dim = " + s(e.d);
  }
  return "unknown layout rule";
}

/// The seven row blocks of the fused projection weight, in their row order (SPEC §3).
enum class Shard : int { kQ = 0, kK, kV, kIndexQ, kIndexK, kIndexZ, kIndexG };
inline constexpr int kNumShards = 7;
/// Shard ids of the loader contract (SPEC §3), indexed by `Shard`.
inline constexpr std::array<std::string_view, kNumShards> kShardIds = {
    "q", "k", "v", "index_q", "index_k", "index_z", "index_g"};

/// Rows taken from a checkpoint tensor `[rows_global, hidden]` for one rank, and where they go.
struct ShardSpec {
  int src_row = 0;  ///< first source row in the checkpoint tensor
  int rows = 0;     ///< number of rows
  int dst_row = 0;  ///< first destination row in the rank's fused matrix
  friend constexpr bool operator==(const ShardSpec&, const ShardSpec&) = default;
};

/// Rows of the fused matrix are padded to a multiple of this (cuBLAS and our GEMM tiles).
inline constexpr int kFusedRowAlignment = 8;

/// Everything one rank needs to know about its slice of the layer (SPEC §2–3).
struct RankLayout {
  Geometry geometry{};
  ParallelLayout parallel{};
  int tp_rank = 0;
  int local_heads = 0;             ///< Hl = H / tp
  int local_kv_groups = 0;         ///< lg = groups_per_rank(KV, tp) (= local provider groups)
  int hpg_q = 0;                   ///< q heads per KV group
  int local_kv_heads = 0;          ///< KVl
  int kv_head_replicas = 0;        ///< ranks sharing one KV head (tp / KV when tp > KV, else 1)
  int first_kv_head = 0;           ///< global id of the first local KV head (= first local group)
  int index_group_start = 0;       ///< first global provider group of this rank
  int hpg_i = 0;                   ///< indexer heads per provider group (Ni / G)
  int index_local_heads = 0;       ///< Il = hpg_i * lg
  int index_local_kv_heads = 0;    ///< local indexer k/z heads
  int index_kv_head_replicas = 0;  ///< ranks sharing one indexer k/z head
  int local_gate = 0;              ///< gl = gate / tp
  std::array<ShardSpec, kNumShards> shards{};  ///< indexed by Shard
  ShardSpec indexer_w{};           ///< rows of `sparse_indexer_w` (index-TP linear), appended after the shards
  int qkv_rows = 0;                ///< q + k + v rows (`qkv_size`)
  int fused_rows = 0;              ///< rows of the seven shards (SPEC §2 table "total rows")
  int rows_with_w = 0;             ///< fused_rows + index_local_heads (sparse_indexer_w appended)
  int padded_rows = 0;             ///< rows_with_w rounded up to kFusedRowAlignment (zero rows)

  constexpr const ShardSpec& shard(Shard s) const { return shards[static_cast<int>(s)]; }
  friend constexpr bool operator==(const RankLayout&, const RankLayout&) = default;
};

/// The layout of rank `tp_rank`, or the first violated rule (then `layout` is unspecified).
struct RankLayoutResult {
  RankLayout layout{};
  LayoutError error{};
  constexpr bool ok() const { return error.ok(); }
};

/// The layout of rank `tp_rank` of geometry `g` at parallel layout `p` (SPEC §2 per-rank
/// quantities, SPEC §3 shard map). `error` holds the first violated rule of SPEC §2 (`validate`)
/// or kRankRange when tp_rank is outside [0, tp_size); `layout` is meaningful only when ok().
constexpr RankLayoutResult make_rank_layout(const Geometry& g, const ParallelLayout& p, int tp_rank) {
  RankLayoutResult r;
  r.error = validate(g, p);
  if (!r.error.ok()) return r;
  const int tp = p.tp_size;
  if (tp_rank < 0 || tp_rank >= tp) {
    r.error = {LayoutRule::kRankRange, tp_rank, tp};
    return r;
  }
  RankLayout& l = r.layout;
  l.geometry = g;
  l.parallel = p;
  l.tp_rank = tp_rank;
  const int KV = g.num_kv_heads, D = g.head_dim, P = g.proxy_dim;
  l.local_heads = g.num_heads / tp;
  l.local_kv_groups = groups_per_rank(KV, tp);
  l.hpg_q = l.local_heads / l.local_kv_groups;
  if (KV >= tp) {
    l.local_kv_heads = KV / tp;
    l.kv_head_replicas = 1;
    l.first_kv_head = tp_rank * l.local_kv_heads;
  } else {
    l.local_kv_heads = 1;
    l.kv_head_replicas = tp / KV;
    l.first_kv_head = tp_rank / l.kv_head_replicas;
  }
  const GroupPartition ip = group_partition(p.index_tp_size, tp, tp_rank);
  l.index_group_start = ip.first_group;
  l.hpg_i = g.index_num_heads / p.index_tp_size;
  l.index_local_heads = l.hpg_i * ip.local_groups;
  const int nk = g.index_num_kv_heads;
  if (tp >= nk) {
    l.index_local_kv_heads = 1;
    l.index_kv_head_replicas = tp / nk;
  } else {
    l.index_local_kv_heads = nk / tp;
    l.index_kv_head_replicas = 1;
  }
  l.local_gate = g.gate_size / tp;
  const int local_k_rows = l.index_local_kv_heads * P;
  const std::array<ShardSpec, kNumShards> src = {{
      {tp_rank * l.local_heads * D, l.local_heads * D, 0},
      {l.first_kv_head * D, l.local_kv_heads * D, 0},
      {l.first_kv_head * D, l.local_kv_heads * D, 0},
      {l.index_group_start * l.hpg_i * P, l.index_local_heads * P, 0},
      {(tp_rank / l.index_kv_head_replicas) * local_k_rows, local_k_rows, 0},
      {(tp_rank / l.index_kv_head_replicas) * local_k_rows, local_k_rows, 0},
      {tp_rank * l.local_gate, l.local_gate, 0},
  }};
  int dst = 0;
  for (int i = 0; i < kNumShards; ++i) {
    l.shards[i] = {src[i].src_row, src[i].rows, dst};
    dst += src[i].rows;
    if (i == 2) l.qkv_rows = dst;
  }
  l.fused_rows = dst;
  l.indexer_w = {l.index_group_start * l.hpg_i, l.index_local_heads, dst};
  l.rows_with_w = dst + l.index_local_heads;
  l.padded_rows = (l.rows_with_w + kFusedRowAlignment - 1) / kFusedRowAlignment * kFusedRowAlignment;
  return r;
}

/// Whether `r` is exactly what make_rank_layout(r.geometry, r.parallel, r.tp_rank) builds: the
/// launchers and dsa_layer_plan refuse any other RankLayout (a hand-built or edited one whose
/// shard offsets or head counts disagree with its geometry would make the kernels read the
/// wrong columns of C silently).
constexpr bool rank_layout_consistent(const RankLayout& r) {
  const RankLayoutResult want = make_rank_layout(r.geometry, r.parallel, r.tp_rank);
  return want.ok() && want.layout == r;
}
/// `rank_layout_consistent` as a Status: kInvalidArgument "<op>: inconsistent RankLayout: <the
/// first field that differs> = <value>, expected <make_rank_layout's> (...)", or naming the
/// violated layout rule when (geometry, parallel, tp_rank) has no layout at all.
inline Status check_rank_layout(const RankLayout& r, const char* op) {
  if (rank_layout_consistent(r)) return Status::Ok();
  const RankLayoutResult want = make_rank_layout(r.geometry, r.parallel, r.tp_rank);
  const std::string head = std::string(op) + ": inconsistent RankLayout: ";
  const std::string tail = " (layout::make_rank_layout(geometry, parallel, tp_rank = " + std::to_string(r.tp_rank) +
                           ") at tp_size " + std::to_string(r.parallel.tp_size) + "); build it with that";
  if (!want.ok()) return invalid_argument(head + "its geometry and parallel layout have none: " + describe(want.error) + tail);
  const RankLayout& w = want.layout;
  std::string field;
  int got = 0, exp = 0;
  auto cmp = [&](const std::string& name, int a, int b) {
    if (field.empty() && a != b) field = name, got = a, exp = b;
  };
#define STEP5_CMP_FIELD(f) cmp(#f, r.f, w.f)
  STEP5_CMP_FIELD(local_heads);
  STEP5_CMP_FIELD(local_kv_groups);
  STEP5_CMP_FIELD(hpg_q);
  STEP5_CMP_FIELD(local_kv_heads);
  STEP5_CMP_FIELD(kv_head_replicas);
  STEP5_CMP_FIELD(first_kv_head);
  STEP5_CMP_FIELD(index_group_start);
  STEP5_CMP_FIELD(hpg_i);
  STEP5_CMP_FIELD(index_local_heads);
  STEP5_CMP_FIELD(index_local_kv_heads);
  STEP5_CMP_FIELD(index_kv_head_replicas);
  STEP5_CMP_FIELD(local_gate);
  auto cmp_spec = [&](const std::string& name, const ShardSpec& a, const ShardSpec& b) {
    cmp(name + ".src_row", a.src_row, b.src_row);
    cmp(name + ".rows", a.rows, b.rows);
    cmp(name + ".dst_row", a.dst_row, b.dst_row);
  };
  for (int i = 0; i < kNumShards; ++i)
    cmp_spec("shards[" + std::string(kShardIds[static_cast<std::size_t>(i)]) + "]", r.shards[i], w.shards[i]);
  cmp_spec("indexer_w", r.indexer_w, w.indexer_w);
  STEP5_CMP_FIELD(qkv_rows);
  STEP5_CMP_FIELD(fused_rows);
  STEP5_CMP_FIELD(rows_with_w);
  STEP5_CMP_FIELD(padded_rows);
#undef STEP5_CMP_FIELD
  if (field.empty()) return invalid_argument(head + "a field differs" + tail);  // all compared fields equal
  return invalid_argument(head + field + " = " + std::to_string(got) + ", expected " + std::to_string(exp) + tail);
}

/// Run-time form: the layout, or a Status naming the violated rule and its numbers.
inline Status rank_layout(const Geometry& g, const ParallelLayout& p, int tp_rank, RankLayout* out) {
  if (out == nullptr) return invalid_argument("rank_layout: out is null");
  const RankLayoutResult r = make_rank_layout(g, p, tp_rank);
  if (!r.ok()) return invalid_argument("invalid parallel layout: " + describe(r.error));
  *out = r.layout;
  return Status::Ok();
}

}  // namespace step5::layout
