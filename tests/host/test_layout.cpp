// Parallel layout (SPEC §2) and fused-weight shard map (SPEC §3) against an independent
// brute-force simulation (layout_brute_force.hpp), the SPEC §2 worked table, edge cases and the
// error messages of the run-time checks and dispatch.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "layout_brute_force.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/layout/static_layout.hpp"

namespace L = step5::layout;

namespace {
constexpr L::Geometry kPreview = L::geometry_of(L::GeometryId::step5_preview);
constexpr L::Geometry kKv8 = L::geometry_of(L::GeometryId::dsa_h64_kv8_d128);

// ---- compile-time shard offsets (g++ TU) -----------------------------------------------------
using PreviewTp8 = L::StaticLayout<kPreview, L::ParallelLayout{8, 4}>;
constexpr L::RankLayout kP8r5 = PreviewTp8::rank<5>();
static_assert(kP8r5.shard(L::Shard::kQ).src_row == 5 * 8 * 192 && kP8r5.shard(L::Shard::kQ).rows == 8 * 192);
static_assert(kP8r5.shard(L::Shard::kK).src_row == 2 * 192 && kP8r5.shard(L::Shard::kK).dst_row == 1536);
static_assert(kP8r5.shard(L::Shard::kV).dst_row == 1536 + 192);
static_assert(kP8r5.shard(L::Shard::kIndexQ).src_row == 2 * 4 * 256 && kP8r5.shard(L::Shard::kIndexQ).dst_row == 1920);
static_assert(kP8r5.shard(L::Shard::kIndexK).src_row == 0 && kP8r5.shard(L::Shard::kIndexK).dst_row == 2944);
static_assert(kP8r5.shard(L::Shard::kIndexG).src_row == 40 && kP8r5.shard(L::Shard::kIndexG).dst_row == 3456);
static_assert(kP8r5.indexer_w.src_row == 8 && kP8r5.indexer_w.rows == 4 && kP8r5.indexer_w.dst_row == 3464);
static_assert(PreviewTp8::kRowsWithW == 3468 && PreviewTp8::kPaddedRows == 3472);
using Kv8Tp16 = L::StaticLayout<kKv8, L::ParallelLayout{16, 8}>;
static_assert(Kv8Tp16::kHpgQ == 4 && Kv8Tp16::kKvHeadReplicas == 2 && Kv8Tp16::rank<7>().first_kv_head == 3);
static_assert(Kv8Tp16::rank<7>().shard(L::Shard::kIndexQ).src_row == 3 * 4 * 256);
static_assert(L::ValidLayout<kPreview, L::ParallelLayout{16, 4}> && !L::ValidLayout<kPreview, L::ParallelLayout{32, 4}>);

const L::GeometryEntry& entry(L::GeometryId id) { return L::entry_of(id); }

// Fused rows of a RankLayout as (tensor, row) pairs, read from its shard map.
std::vector<bf::RowRef> rows_from_layout(const L::RankLayout& l) {
  std::vector<bf::RowRef> out(static_cast<std::size_t>(l.padded_rows));
  for (int s = 0; s < 8; ++s) {
    const L::ShardSpec& sp = s == 7 ? l.indexer_w : l.shards[s];
    for (int r = 0; r < sp.rows; ++r) {
      REQUIRE(sp.dst_row + r < l.padded_rows);
      out[static_cast<std::size_t>(sp.dst_row + r)] = {s, sp.src_row + r};
    }
  }
  return out;
}
}  // namespace

TEST_CASE("every (geometry, tp in 1..64, rank) matches the brute-force simulation") {
  for (const auto& e : L::kGeometries) {
    CAPTURE(e.name);
    std::vector<int> accepted;
    for (int tp = 1; tp <= 64; ++tp) {
      CAPTURE(tp);
      const bf::Layout sim = bf::simulate(e.geometry, tp);
      const L::ParallelLayout par = L::standard_layout(e.geometry, tp);
      const bool ok = L::make_rank_layout(e.geometry, par, 0).ok();
      CHECK(ok == sim.ok);
      CHECK(L::validate(e.geometry, par).ok() == sim.ok);
      if (!ok || !sim.ok) continue;
      accepted.push_back(tp);
      for (int rank = 0; rank < tp; ++rank) {
        CAPTURE(rank);
        const auto res = L::make_rank_layout(e.geometry, par, rank);
        REQUIRE(res.ok());
        const L::RankLayout& l = res.layout;
        const bf::Rank& b = sim.ranks[rank];
        CHECK(l.tp_rank == rank);
        CHECK(l.local_heads == (int)b.q_heads.size());
        CHECK(l.local_kv_groups == (int)b.kv_heads.size());
        CHECK(l.local_kv_heads == (int)b.kv_heads.size());
        CHECK(l.first_kv_head == b.kv_heads.front());
        CHECK(l.kv_head_replicas == b.kv_replicas);
        CHECK(l.hpg_q == b.hpg_q);
        CHECK(l.index_local_heads == (int)b.index_heads.size());
        CHECK(l.index_group_start * l.hpg_i == b.index_heads.front());
        CHECK(l.index_local_kv_heads == (int)b.index_k_heads.size());
        CHECK(l.index_kv_head_replicas == b.index_k_replicas);
        CHECK(l.local_gate == (int)b.gate_rows.size());
        for (int s = 0; s < 8; ++s) {
          CAPTURE(s);
          const L::ShardSpec& sp = s == 7 ? l.indexer_w : l.shards[s];
          CHECK(sp.dst_row == b.shard_begin[s]);
          CHECK(sp.rows == b.shard_rows[s]);
        }
        CHECK(l.qkv_rows == b.shard_begin[3]);
        CHECK(l.fused_rows == b.shard_begin[7]);
        CHECK(l.rows_with_w == b.shard_begin[7] + b.shard_rows[7]);
        CHECK(l.padded_rows == (int)b.rows.size());
        CHECK(rows_from_layout(l) == b.rows);
      }
    }
    // The accepted tp values are exactly the ones listed for the row in geometries.def.
    std::vector<int> listed(e.tp_values.begin(), e.tp_values.begin() + e.num_tp_values);
    CHECK(accepted == listed);
  }
  // ... and explicitly (SPEC §2 table for step5_preview; rules 4–6 for dsa_h64_kv8_d128:
  // hpg_q = 64/tp/(8/tp) = 8 for tp <= 8, 4 at tp 16, 2 at tp 32 -> rejected).
  for (auto [id, expect] : {std::pair{L::GeometryId::step5_preview, std::vector<int>{1, 2, 4, 8, 16}},
                            std::pair{L::GeometryId::dsa_h64_kv8_d128, std::vector<int>{1, 2, 4, 8, 16}}}) {
    std::vector<int> got;
    for (int tp = 1; tp <= 64; ++tp)
      if (L::validate(L::geometry_of(id), L::standard_layout(L::geometry_of(id), tp)).ok()) got.push_back(tp);
    CHECK(got == expect);
  }
}

TEST_CASE("union over ranks covers every checkpoint row with the expected replication") {
  for (const auto& e : L::kGeometries) {
    const auto& g = e.geometry;
    const std::vector<int> n = bf::global_rows(g);
    for (int i = 0; i < e.num_tp_values; ++i) {
      const int tp = e.tp_values[i];
      CAPTURE(e.name);
      CAPTURE(tp);
      // expected copies of each row of each tensor: q, gate 1; k, v, index_q, index_w: shared by
      // the ranks of a KV group (tp/KV when tp > KV); indexer k/z (Nk = 1): every rank.
      const int kv_share = tp > g.num_kv_heads ? tp / g.num_kv_heads : 1;
      const int k_share = tp > g.index_num_kv_heads ? tp / g.index_num_kv_heads : 1;
      const int expect[8] = {1, kv_share, kv_share, kv_share, k_share, k_share, 1, kv_share};
      std::vector<std::vector<int>> count(8);
      for (int s = 0; s < 8; ++s) count[s].assign(n[s], 0);
      int zero_rows = 0;
      for (int r = 0; r < tp; ++r) {
        const auto res = L::make_rank_layout(g, L::standard_layout(g, tp), r);
        REQUIRE(res.ok());
        for (const auto& ref : rows_from_layout(res.layout)) {
          if (ref.tensor < 0) {
            ++zero_rows;
            continue;
          }
          REQUIRE(ref.row < n[ref.tensor]);
          ++count[ref.tensor][ref.row];
        }
      }
      for (int s = 0; s < 8; ++s) {
        CAPTURE(s);
        for (int row = 0; row < n[s]; ++row)
          if (count[s][row] != expect[s]) FAIL_CHECK("row " << row << " appears " << count[s][row] << " times");
      }
      CHECK(zero_rows < 8 * tp);
    }
  }
}

TEST_CASE("SPEC §2 worked table, step5_preview") {
  struct Row {
    int tp, hl, kvl, rep, lg, hpg, qkv, iq, kz, gate, total;
  };
  const Row table[] = {
      {1, 64, 4, 1, 4, 16, 13824, 4096, 256, 64, 18496}, {2, 32, 2, 1, 2, 16, 6912, 2048, 256, 32, 9504},
      {4, 16, 1, 1, 1, 16, 3456, 1024, 256, 16, 5008},   {8, 8, 1, 2, 1, 8, 1920, 1024, 256, 8, 3464},
      {16, 4, 1, 4, 1, 4, 1152, 1024, 256, 4, 2692},
  };
  for (const Row& t : table) {
    CAPTURE(t.tp);
    for (int rank = 0; rank < t.tp; ++rank) {
      const auto res = L::make_rank_layout(kPreview, {t.tp, 4}, rank);
      REQUIRE(res.ok());
      const auto& l = res.layout;
      CHECK(l.local_heads == t.hl);
      CHECK(l.local_kv_heads == t.kvl);
      CHECK(l.kv_head_replicas == t.rep);
      CHECK(l.local_kv_groups == t.lg);
      CHECK(l.hpg_q == t.hpg);
      CHECK(l.qkv_rows == t.qkv);
      CHECK(l.shard(L::Shard::kIndexQ).rows == t.iq);
      CHECK(l.shard(L::Shard::kIndexK).rows == t.kz);
      CHECK(l.shard(L::Shard::kIndexZ).rows == t.kz);
      CHECK(l.shard(L::Shard::kIndexG).rows == t.gate);
      CHECK(l.fused_rows == t.total);
    }
  }
  // tp=32 rejected with hpg_q = 2; at tp=8 ranks 2k and 2k+1 share KV head k and provider group k.
  const auto r32 = L::make_rank_layout(kPreview, {32, 4}, 0);
  CHECK(r32.error.rule == L::LayoutRule::kHeadsPerGroup);
  CHECK(r32.error.a == 2);
  // every SPEC §2 rule holds but the int row offsets would overflow (a config parsed with
  // require_listed_geometry = false allows such sizes): refused, naming the numbers (it used to
  // return Ok with 0 q rows, UBSan: signed overflow)
  {
    L::Geometry huge = kPreview;
    huge.num_heads = 256, huge.num_kv_heads = 16, huge.index_num_heads = 16;
    huge.head_dim = 1 << 24, huge.proxy_dim = 1 << 24;
    const auto rh = L::make_rank_layout(huge, {1, 16}, 0);
    CHECK(rh.error.rule == L::LayoutRule::kRowsFitInt);
    const std::string m = L::describe(rh.error);
    CHECK_MESSAGE(m.find("must be < 2^31; num_heads = 256, head_dim = 16777216") != std::string::npos, m);
    CHECK(L::fused_global_rows(huge) > 0x7fffffffll);
    CHECK(L::fused_global_rows(kPreview) < 1 << 20);
  }
  // sizes whose row terms each fit int64 but whose sum does not (Ni = P = Nk = 2^31 - 1: Ni·P +
  // 2·Nk·P is about 2^63.6): refused by the same rule (the sum wrapped negative, passed the
  // < 2^31 test, and rank_layout returned Ok with padded_rows -2147483632)
  {
    constexpr int kBig = std::numeric_limits<int>::max();
    const L::Geometry wrap{4, 1, 1, kBig, kBig, kBig, 0, 0, 0, L::kRegionSize};
    CHECK(L::fused_global_rows(wrap) == std::numeric_limits<long long>::max());
    const auto rw = L::make_rank_layout(wrap, {1, 1}, 0);
    CHECK(rw.error.rule == L::LayoutRule::kRowsFitInt);
    L::RankLayout out;
    const step5::Status s = L::rank_layout(wrap, {1, 1}, 0, &out);
    CHECK(s.code() == step5::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find("must be < 2^31; num_heads = 4, head_dim = 1, index_num_heads = 2147483647") !=
                      std::string::npos,
                  s.message());
  }
  for (int k = 0; k < 4; ++k)
    for (int rank : {2 * k, 2 * k + 1}) {
      const auto l = L::make_rank_layout(kPreview, {8, 4}, rank).layout;
      CHECK(l.first_kv_head == k);
      CHECK(l.index_group_start == k);
    }
}

TEST_CASE("groups_per_rank and group_partition edge cases") {
  CHECK(L::groups_per_rank(4, 1) == 4);
  CHECK(L::groups_per_rank(4, 4) == 1);
  CHECK(L::groups_per_rank(8, 4) == 2);
  CHECK(L::groups_per_rank(4, 8) == 1);
  CHECK(L::groups_per_rank(1, 64) == 1);
  CHECK(L::groups_per_rank(4, 3) == 0);  // neither divides
  CHECK(L::groups_per_rank(6, 4) == 0);
  CHECK(L::groups_per_rank(0, 4) == 0);
  CHECK(L::groups_per_rank(4, 0) == 0);
  CHECK(L::groups_per_rank(-4, 2) == 0);
  CHECK(L::groups_per_rank(4, -2) == 0);

  auto gp = [](int n, int tp, int rank) { return L::group_partition(n, tp, rank); };
  auto same = [](L::GroupPartition p, int f, int l, int r) {
    return p.ok && p.first_group == f && p.local_groups == l && p.replication == r;
  };
  CHECK(same(gp(4, 1, 0), 0, 4, 1));
  CHECK(same(gp(4, 2, 1), 2, 2, 1));
  CHECK(same(gp(4, 4, 3), 3, 1, 1));
  CHECK(same(gp(4, 8, 5), 2, 1, 2));
  CHECK(same(gp(4, 16, 15), 3, 1, 4));
  CHECK(same(gp(8, 16, 0), 0, 1, 2));
  CHECK_FALSE(gp(4, 8, 8).ok);   // rank == tp
  CHECK_FALSE(gp(4, 8, -1).ok);  // negative rank
  CHECK_FALSE(gp(4, 3, 0).ok);   // undefined groups_per_rank
  CHECK_FALSE(gp(0, 1, 0).ok);
  // every group is covered exactly replication times
  for (int n : {1, 2, 4, 8})
    for (int tp : {1, 2, 4, 8, 16}) {
      std::vector<int> cover(n, 0);
      for (int r = 0; r < tp; ++r) {
        const auto p = gp(n, tp, r);
        REQUIRE(p.ok);
        for (int i = 0; i < p.local_groups; ++i) ++cover[p.first_group + i];
      }
      for (int c : cover) CHECK(c == (tp > n ? tp / n : 1));
    }
}

TEST_CASE("run-time layout errors name the rule and the numbers") {
  step5::layout::RankLayout out;
  auto msg = [&](L::Geometry g, L::ParallelLayout p, int rank) {
    const step5::Status s = L::rank_layout(g, p, rank, &out);
    CHECK_FALSE(s.ok());
    CHECK(s.code() == step5::StatusCode::kInvalidArgument);
    return s.message();
  };
  std::string m = msg(kPreview, {32, 4}, 0);
  CHECK(m.find("hpg_q") != std::string::npos);
  CHECK(m.find("is 2") != std::string::npos);
  CHECK(m.find("tp_size = 32") != std::string::npos);
  CHECK(m.find("rule 6") != std::string::npos);

  m = msg(kPreview, {4, 2}, 0);
  CHECK(m.find("index_tp_size = 2") != std::string::npos);
  CHECK(m.find("num_kv_heads = 4") != std::string::npos);
  CHECK(m.find("provider groups must align") != std::string::npos);

  m = msg(kPreview, {3, 4}, 0);
  CHECK(m.find("tp_size = 3") != std::string::npos);
  CHECK(m.find("rule 4") != std::string::npos);

  L::Geometry g = kPreview;
  g.num_heads = 12, g.num_kv_heads = 2, g.index_num_heads = 4;  // H=12 at tp=8: rule 5
  m = msg(g, {8, 2}, 0);
  CHECK(m.find("num_heads (12)") != std::string::npos);
  CHECK(m.find("tp_size (8)") != std::string::npos);

  g = kPreview;
  g.index_num_heads = 6;  // Ni=6, G=4: rule 3
  m = msg(g, {1, 4}, 0);
  CHECK(m.find("index_num_heads (6)") != std::string::npos);
  CHECK(m.find("index_tp_size (4)") != std::string::npos);

  g = kPreview;
  g.gate_size = 6;  // gate % tp at tp=4: rule 8
  m = msg(g, {4, 4}, 0);
  CHECK(m.find("gate_size (6)") != std::string::npos);

  g = kPreview;
  g.num_heads = 0;
  m = msg(g, {1, 4}, 0);
  CHECK(m.find("num_heads (0)") != std::string::npos);

  // no tokens per region (a hand-built Geometry; configs read R >= 1): named (the dims rule's
  // message named head_dim, rot_main, rot_idx and proxy_dim, all valid, and not region_size)
  for (int region : {0, -8}) {
    g = kPreview;
    g.region_size = region;
    m = msg(g, {1, 4}, 0);
    CHECK_MESSAGE(m.find("region_size (" + std::to_string(region) + ") must be > 0") != std::string::npos, m);
    CHECK(L::make_rank_layout(g, {1, 4}, 0).error.rule == L::LayoutRule::kRegionSize);
  }

  m = msg(kPreview, {8, 4}, 8);
  CHECK(m.find("tp_rank (8)") != std::string::npos);
  CHECK(m.find("tp_size = 8") != std::string::npos);
  m = msg(kPreview, {8, 4}, -1);
  CHECK(m.find("tp_rank (-1)") != std::string::npos);

  CHECK_FALSE(L::rank_layout(kPreview, {8, 4}, 0, nullptr).ok());
  CHECK(L::rank_layout(kPreview, {8, 4}, 7, &out).ok());
  CHECK(out.tp_rank == 7);
  CHECK(out.first_kv_head == 3);
}

TEST_CASE("dispatch_layout: listed layouts reach their compile-time layout, others list the supported ones") {
  int calls = 0;
  for (const auto& e : L::kGeometries)
    for (int i = 0; i < e.num_tp_values; ++i) {
      const int tp = e.tp_values[i];
      int seen_tp = 0, fused = 0;
      std::string seen_name;
      const step5::Status s = L::dispatch_layout(e.name, tp, [&](auto tag) {
        using Tag = decltype(tag);
        seen_tp = Tag::kParallel.tp_size;
        seen_name = std::string(Tag::kEntry.name);
        fused = Tag::Layout::kFusedRows;
        ++calls;
        return step5::Status::Ok();
      });
      CHECK(s.ok());
      CHECK(seen_tp == tp);
      CHECK(seen_name == e.name);
      CHECK(fused == L::make_rank_layout(e.geometry, L::standard_layout(e.geometry, tp), 0).layout.fused_rows);
    }
  CHECK(calls == 10);

  auto never = [](auto) -> step5::Status {
    FAIL("dispatch must not call back");
    return step5::Status::Ok();
  };
  step5::Status s = L::dispatch_layout("step5_preview", 32, never);
  CHECK(s.code() == step5::StatusCode::kUnsupported);
  CHECK(s.message().find("tp_size 32") != std::string::npos);
  CHECK(s.message().find("step5_preview (tp 1 2 4 8 16)") != std::string::npos);
  CHECK(s.message().find("dsa_h64_kv8_d128 (tp 1 2 4 8 16)") != std::string::npos);
  s = L::dispatch_layout("step4_mini", 8, never);
  CHECK(s.code() == step5::StatusCode::kUnsupported);
  CHECK(s.message().find("unknown geometry 'step4_mini'") != std::string::npos);
  CHECK(s.message().find("step5_preview (tp 1 2 4 8 16), dsa_h64_kv8_d128 (tp 1 2 4 8 16)") != std::string::npos);

  // for_each_layout visits every listed (geometry, tp) once, in list order
  std::vector<std::pair<std::string, int>> visited;
  L::for_each_layout([&](auto tag) {
    using Tag = decltype(tag);
    visited.emplace_back(std::string(Tag::kEntry.name), Tag::kParallel.tp_size);
  });
  std::vector<std::pair<std::string, int>> expect;
  for (const auto& e : L::kGeometries)
    for (int i = 0; i < e.num_tp_values; ++i) expect.emplace_back(std::string(e.name), e.tp_values[i]);
  CHECK(visited == expect);
}

TEST_CASE("geometry list lookups") {
  REQUIRE(L::find_geometry("step5_preview") != nullptr);
  CHECK(L::find_geometry("step5_preview")->geometry == kPreview);
  CHECK(L::find_geometry("nope") == nullptr);
  CHECK(kPreview.num_heads == 64);
  CHECK(kPreview.num_kv_heads == 4);
  CHECK(kPreview.head_dim == 192);
  CHECK(kKv8.num_kv_heads == 8);
  CHECK(kKv8.head_dim == 128);
  CHECK(kKv8.index_num_heads == 32);
  CHECK(L::lists_tp(entry(L::GeometryId::step5_preview), 16));
  CHECK_FALSE(L::lists_tp(entry(L::GeometryId::step5_preview), 32));
}
