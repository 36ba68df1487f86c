#pragma once
// An independent brute-force model of SPEC §2–3 for tests: it deals every global q head, KV
// head, provider group, indexer head, indexer k head and gate row to ranks one by one and derives
// what a rank needs from what it owns. It does NOT use step5's layout functions or closed
// formulas; tests compare RankLayout against it.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "step5/layout/geometry.hpp"

namespace bf {

// One row of the fused matrix: which checkpoint tensor (loader shard 0..7) and which row of it;
// tensor -1 = zero padding.
struct RowRef {
  int tensor = -1;
  int row = 0;
  bool operator==(const RowRef&) const = default;
};

struct Rank {
  std::vector<int> q_heads;      // global q heads owned, ascending
  std::vector<int> kv_heads;     // global KV heads needed, ascending
  std::vector<int> index_heads;  // global indexer q heads owned, ascending
  std::vector<int> index_k_heads;  // global indexer k/z heads needed
  std::vector<int> gate_rows;    // global gate rows owned
  int hpg_q = 0;
  int kv_replicas = 0;        // ranks that need this rank's (first) KV head
  int index_k_replicas = 0;   // ranks that need this rank's (first) indexer k head
  std::vector<RowRef> rows;   // the fused matrix, row by row (incl. sparse_indexer_w, padding)
  int shard_begin[8] = {};    // first fused row of each loader shard
  int shard_rows[8] = {};
};

struct Layout {
  bool ok = false;
  std::string why;
  std::vector<Rank> ranks;
};

// Deals `n` items to `tp` ranks in contiguous equal blocks by walking them: item i goes to the
// rank whose block it falls into. Returns false when the blocks cannot be equal.
inline bool deal_blocks(int n, int tp, std::vector<std::vector<int>>* owned) {
  owned->assign(tp, {});
  if (n % tp != 0) return false;
  int rank = 0, in_block = 0;
  for (int i = 0; i < n; ++i) {
    (*owned)[rank].push_back(i);
    if (++in_block == n / tp) {
      in_block = 0;
      ++rank;
    }
  }
  return true;
}

inline Layout simulate(const step5::layout::Geometry& g, int tp) {
  Layout L;
  const int H = g.num_heads, KV = g.num_kv_heads, D = g.head_dim, Ni = g.index_num_heads, P = g.proxy_dim,
            Nk = g.index_num_kv_heads, gate = g.gate_size;
  std::vector<std::vector<int>> q_owned;
  if (!deal_blocks(H, tp, &q_owned)) {
    L.why = "q heads do not deal evenly";
    return L;
  }
  // KV group of each q head: consecutive blocks of H/KV q heads share one KV head.
  std::vector<int> kv_of(H);
  {
    int kv = 0, c = 0;
    for (int h = 0; h < H; ++h) {
      kv_of[h] = kv;
      if (++c == H / KV) c = 0, ++kv;
    }
  }
  // Provider group of each indexer head: consecutive blocks of Ni/KV heads (provider group p is
  // aligned with KV group p).
  std::vector<int> group_of(Ni);
  {
    int p = 0, c = 0;
    for (int j = 0; j < Ni; ++j) {
      group_of[j] = p;
      if (++c == Ni / KV) c = 0, ++p;
    }
  }
  std::map<int, std::set<int>> ranks_of_kv;
  L.ranks.resize(tp);
  for (int r = 0; r < tp; ++r) {
    Rank& R = L.ranks[r];
    R.q_heads = q_owned[r];
    std::map<int, int> per_kv;
    for (int h : R.q_heads) ++per_kv[kv_of[h]];
    for (auto [kv, n] : per_kv) {
      R.kv_heads.push_back(kv);
      ranks_of_kv[kv].insert(r);
    }
    // every KV group of the rank must hold the same number of its q heads
    std::set<int> counts;
    for (auto [kv, n] : per_kv) counts.insert(n);
    if (counts.size() != 1) {
      L.why = "uneven q heads per KV group";
      return L;
    }
    R.hpg_q = *counts.begin();
    if (R.hpg_q != 4 && R.hpg_q != 8 && R.hpg_q != 16) {
      L.why = "hpg_q " + std::to_string(R.hpg_q);
      return L;
    }
    for (int j = 0; j < Ni; ++j)
      if (per_kv.count(group_of[j])) R.index_heads.push_back(j);
  }
  // A KV head shared by several ranks must be those ranks' only KV head (otherwise a rank would
  // hold part of a group next to other groups: groups_per_rank undefined).
  for (auto& [kv, rs] : ranks_of_kv)
    for (int r : rs)
      if (rs.size() > 1 && L.ranks[r].kv_heads.size() != 1) {
        L.why = "KV head split across ranks that hold other KV heads";
        return L;
      }
  for (int r = 0; r < tp; ++r) L.ranks[r].kv_replicas = static_cast<int>(ranks_of_kv[L.ranks[r].kv_heads[0]].size());
  // Indexer k/z heads: rank r covers the fraction [r/tp, (r+1)/tp) of the Nk heads; it needs every
  // head overlapping that interval (in units of 1/(tp*Nk)): head i spans [i*tp, (i+1)*tp).
  if (Nk <= 0 || (Nk > tp ? Nk % tp != 0 : tp % Nk != 0)) {
    L.why = "indexer k heads";
    return L;
  }
  std::map<int, int> k_users;
  for (int r = 0; r < tp; ++r) {
    for (int i = 0; i < Nk; ++i) {
      const long lo = static_cast<long>(r) * Nk, hi = static_cast<long>(r + 1) * Nk;  // rank interval
      const long a = static_cast<long>(i) * tp, b = static_cast<long>(i + 1) * tp;   // head interval
      if (std::max(lo, a) < std::min(hi, b)) {
        L.ranks[r].index_k_heads.push_back(i);
        ++k_users[i];
      }
    }
  }
  for (int r = 0; r < tp; ++r) L.ranks[r].index_k_replicas = k_users[L.ranks[r].index_k_heads[0]];
  std::vector<std::vector<int>> gate_owned;
  if (gate > 0 && !deal_blocks(gate, tp, &gate_owned)) {
    L.why = "gate rows do not deal evenly";
    return L;
  }
  for (int r = 0; r < tp; ++r) {
    Rank& R = L.ranks[r];
    if (gate > 0) R.gate_rows = gate_owned[r];
    auto begin = [&](int s) { R.shard_begin[s] = static_cast<int>(R.rows.size()); };
    auto end = [&](int s) { R.shard_rows[s] = static_cast<int>(R.rows.size()) - R.shard_begin[s]; };
    begin(0);
    for (int h : R.q_heads)
      for (int d = 0; d < D; ++d) R.rows.push_back({0, h * D + d});
    end(0);
    for (int t : {1, 2}) {
      begin(t);
      for (int kv : R.kv_heads)
        for (int d = 0; d < D; ++d) R.rows.push_back({t, kv * D + d});
      end(t);
    }
    begin(3);
    for (int j : R.index_heads)
      for (int d = 0; d < P; ++d) R.rows.push_back({3, j * P + d});
    end(3);
    for (int t : {4, 5}) {
      begin(t);
      for (int i : R.index_k_heads)
        for (int d = 0; d < P; ++d) R.rows.push_back({t, i * P + d});
      end(t);
    }
    begin(6);
    for (int row : R.gate_rows) R.rows.push_back({6, row});
    end(6);
    begin(7);
    for (int j : R.index_heads) R.rows.push_back({7, j});
    end(7);
    while (R.rows.size() % 8 != 0) R.rows.push_back({-1, 0});
  }
  L.ok = true;
  return L;
}

// Global row count of each loader shard's checkpoint tensor, counted by walking the heads.
inline std::vector<int> global_rows(const step5::layout::Geometry& g) {
  std::vector<int> n(8, 0);
  for (int h = 0; h < g.num_heads; ++h) n[0] += g.head_dim;
  for (int k = 0; k < g.num_kv_heads; ++k) n[1] += g.head_dim, n[2] += g.head_dim;
  for (int j = 0; j < g.index_num_heads; ++j) n[3] += g.proxy_dim, n[7] += 1;
  for (int i = 0; i < g.index_num_kv_heads; ++i) n[4] += g.proxy_dim, n[5] += g.proxy_dim;
  n[6] = g.gate_size;
  return n;
}

}  // namespace bf
