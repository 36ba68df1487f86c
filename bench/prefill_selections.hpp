#pragma once
/// \file bench/prefill_selections.hpp
/// Host side of bench_attention's prefill selection patterns (issue 15 §3), g++-compilable
/// (tested by tests/host/test_prefill_selections.cpp):
///  - `selection_row_error` / `selections_error`: the SPEC §4.6 rules of a selection row, checked
///    on every row a benchmark hands to the attention kernel;
///  - `sinks_local_scattered`: the "local + sinks + scattered" pattern;
///  - `union_density`: the union of the selected regions per (query tile, KV group).
/// Layout of the selections: `topk_ids [lg, T, topk+1]` int32, `counts [lg, T]` int32
/// (docs/ARCHITECTURE.md "Shared data conventions"); positions [T] from `token_positions`.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "step5/layout/geometry.hpp"
#include "step5/reference/common.hpp"

namespace step5::bench {

/// Positions of the packed tokens (SPEC §5), as `reference::token_positions` computes them (token i
/// of request b at `seq_lens[b] - q_len_b + i`), widened to the 64-bit positions used here.
/// `cu_seqlens_q [B+1]`, `seq_lens [B]` (host arrays).
inline std::vector<long long> token_positions(int num_requests, const std::int32_t* cu_seqlens_q,
                                              const std::int32_t* seq_lens) {
  const std::vector<std::int32_t> pos = reference::token_positions({num_requests, cu_seqlens_q, seq_lens});
  return {pos.begin(), pos.end()};
}

/// SPEC §4.6 rules of one selection row of width topk + 1 for a token at position p (current
/// region c = p / R): count = min(topk, c) + 1; entries 0 .. count-2 are history region ids,
/// strictly ascending, in [0, c); entry count-1 is c; entries count .. topk are -1.
/// Returns "" when the row follows them, else the first violation (entry, value, expected).
inline std::string selection_row_error(const std::int32_t* row, int count, int topk, long long p) {
  const long long c = p / layout::kRegionSize;
  const long long want = std::min<long long>(topk, c) + 1;
  auto s = [](long long v) { return std::to_string(v); };
  if (topk < 1 || p < 0) return "topk = " + s(topk) + ", position = " + s(p) + ", expected topk >= 1 and position >= 0";
  if (count != want)
    return "count = " + s(count) + ", expected min(topk " + s(topk) + ", p/R " + s(c) + ") + 1 = " + s(want);
  for (int k = 0; k + 1 < count; ++k) {
    const long long lo = k == 0 ? 0 : static_cast<long long>(row[k - 1]) + 1;
    if (row[k] < lo || row[k] >= c)
      return "entry " + s(k) + " = " + s(row[k]) + ", expected a history region in [" + s(lo) + ", " + s(c) +
             ") (ascending, unique)";
  }
  if (row[count - 1] != c)
    return "entry " + s(count - 1) + " = " + s(row[count - 1]) + ", expected the current region p/R = " + s(c);
  for (int k = count; k <= topk; ++k)
    if (row[k] != -1) return "entry " + s(k) + " = " + s(row[k]) + ", expected -1 (padding after count)";
  return {};
}

/// `selection_row_error` over every (group, token) row; "" or "group g, token t (position p): ...".
inline std::string selections_error(int lg, const std::vector<long long>& positions, int topk,
                                    const std::int32_t* topk_ids, const std::int32_t* counts) {
  const long long T = static_cast<long long>(positions.size());
  const std::size_t W = static_cast<std::size_t>(topk) + 1;
  for (int g = 0; g < lg; ++g)
    for (long long t = 0; t < T; ++t) {
      const std::size_t r = static_cast<std::size_t>(g * T + t);
      const std::string e = selection_row_error(topk_ids + r * W, counts[r], topk, positions[static_cast<std::size_t>(t)]);
      if (!e.empty())
        return "group " + std::to_string(g) + ", token " + std::to_string(t) + " (position " +
               std::to_string(positions[static_cast<std::size_t>(t)]) + "): " + e;
    }
  return {};
}

/// The "local + sinks + scattered" pattern. A token at position p (current region c) with
/// n = min(topk, c) history regions selects: when n == c, every history region; otherwise the
/// `sinks` first regions 0 .. s-1 (s = min(sinks, n)), the `local` regions just before the
/// current one c-l .. c-1 (l = min(local, n - s)), and n - s - l regions drawn uniformly without
/// replacement from [s, c - l) (Floyd's algorithm, a splitmix64 stream of (seed, group, p): the
/// same inputs give the same rows). Rows follow SPEC §4.6 (`selection_row_error`).
struct SinksLocalScattered {
  int sinks = 4;
  int local = 128;
  std::uint64_t seed = 1;
};

namespace detail {
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/// Uniform in [0, n) (n > 0), Lemire's multiply-shift (bias < n / 2^64).
inline std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(splitmix64(state)) * n) >> 64);
}
}  // namespace detail

/// One row (width topk + 1) of group `group` for the token at position p; returns its count.
/// `mark` is scratch reused across calls (it grows to p / R entries).
inline int sinks_local_scattered_row(const SinksLocalScattered& cfg, int topk, int group, long long p,
                                     std::vector<std::uint32_t>& mark, std::uint32_t& stamp, std::int32_t* row) {
  const long long c = p / layout::kRegionSize;
  const long long n = std::min<long long>(topk, c);
  int k = 0;
  if (n == c) {
    for (long long r = 0; r < c; ++r) row[k++] = static_cast<std::int32_t>(r);
  } else {
    const long long s = std::min<long long>(std::max(cfg.sinks, 0), n);
    const long long l = std::min<long long>(std::max(cfg.local, 0), n - s);
    const long long m = n - s - l;         // scattered regions
    const long long lo = s, hi = c - l;    // drawn from [lo, hi); hi - lo = c - n + m > m
    if (mark.size() < static_cast<std::size_t>(hi))  // grown entries are 0, never a live stamp
      mark.resize(std::max(static_cast<std::size_t>(hi), 2 * mark.size()), 0u);
    if (++stamp == 0) {  // wrapped: clear the marks once
      std::fill(mark.begin(), mark.end(), 0u);
      stamp = 1;
    }
    std::uint64_t state = cfg.seed ^ (0x632be59bd9b4e019ull * static_cast<std::uint64_t>(group + 1)) ^
                          (0x8cb92ba72f3d8dd7ull * static_cast<std::uint64_t>(p + 1));
    for (long long r = 0; r < s; ++r) row[k++] = static_cast<std::int32_t>(r);
    const int first_scattered = k;
    // Floyd: for j = M-m .. M-1 draw t in [0, j]; take t unless taken, else j (M = hi - lo).
    const long long M = hi - lo;
    for (long long j = M - m; j < M; ++j) {
      const long long t = static_cast<long long>(detail::uniform_below(state, static_cast<std::uint64_t>(j + 1)));
      const long long pick = mark[static_cast<std::size_t>(lo + t)] == stamp ? j : t;
      mark[static_cast<std::size_t>(lo + pick)] = stamp;
      row[k++] = static_cast<std::int32_t>(lo + pick);
    }
    std::sort(row + first_scattered, row + k);
    for (long long r = hi; r < c; ++r) row[k++] = static_cast<std::int32_t>(r);
  }
  row[k++] = static_cast<std::int32_t>(c);
  for (int e = k; e <= topk; ++e) row[e] = -1;
  return k;
}

/// Every (group, token) row: `topk_ids [lg, T, topk+1]`, `counts [lg, T]` (T = positions.size()).
inline void sinks_local_scattered(const SinksLocalScattered& cfg, int lg, const std::vector<long long>& positions,
                                  int topk, std::int32_t* topk_ids, std::int32_t* counts) {
  const long long T = static_cast<long long>(positions.size());
  const std::size_t W = static_cast<std::size_t>(topk) + 1;
  std::vector<std::uint32_t> mark;
  std::uint32_t stamp = 0;
  for (int g = 0; g < lg; ++g)
    for (long long t = 0; t < T; ++t) {
      const std::size_t r = static_cast<std::size_t>(g * T + t);
      counts[r] = sinks_local_scattered_row(cfg, topk, g, positions[static_cast<std::size_t>(t)], mark, stamp,
                                            topk_ids + r * W);
    }
}

/// Union of the selected regions per (query tile, KV group). Tiles are those of the attention
/// kernel: `query_tile` consecutive tokens of one request starting at its first token
/// (ops::SparseAttentionPlan::query_tile). For a tile of q tokens and group g, U = the number of
/// distinct region ids among the first counts[g, t] entries of its tokens' rows (ids outside
/// [0, p/R], which the kernel ignores, are not counted).
struct UnionDensity {
  double density = 0;     ///< mean over (tile, group) of U / (q * topk); at most (topk+1)/topk
  double mean_union = 0;  ///< mean over (tile, group) of U (regions)
  long long tiles = 0;    ///< (tile, group) pairs averaged
};
inline UnionDensity union_density(int lg, int num_requests, const std::int32_t* cu_seqlens_q,
                                  const std::vector<long long>& positions, int query_tile, int topk,
                                  const std::int32_t* topk_ids, const std::int32_t* counts) {
  UnionDensity u;
  if (query_tile <= 0 || topk <= 0) return u;
  const long long T = static_cast<long long>(positions.size());
  const std::size_t W = static_cast<std::size_t>(topk) + 1;
  long long max_region = 0;
  for (long long p : positions) max_region = std::max(max_region, p / layout::kRegionSize);
  std::vector<std::uint32_t> mark(static_cast<std::size_t>(max_region) + 1, 0u);
  std::uint32_t stamp = 0;
  double sum_density = 0, sum_union = 0;
  for (int g = 0; g < lg; ++g)
    for (int b = 0; b < num_requests; ++b)
      for (long long t0 = cu_seqlens_q[b]; t0 < cu_seqlens_q[b + 1]; t0 += query_tile) {
        const long long t1 = std::min<long long>(t0 + query_tile, cu_seqlens_q[b + 1]);
        if (++stamp == 0) {
          std::fill(mark.begin(), mark.end(), 0u);
          stamp = 1;
        }
        long long n = 0;
        for (long long t = t0; t < t1; ++t) {
          const std::size_t r = static_cast<std::size_t>(g * T + t);
          const long long c = positions[static_cast<std::size_t>(t)] / layout::kRegionSize;
          const std::int32_t* row = topk_ids + r * W;
          const int cnt = std::min<int>(counts[r], topk + 1);
          for (int k = 0; k < cnt; ++k) {
            const std::int32_t id = row[k];
            if (id < 0 || id > c || mark[static_cast<std::size_t>(id)] == stamp) continue;
            mark[static_cast<std::size_t>(id)] = stamp;
            ++n;
          }
        }
        sum_union += static_cast<double>(n);
        sum_density += static_cast<double>(n) / (static_cast<double>(t1 - t0) * topk);
        ++u.tiles;
      }
  if (u.tiles > 0) {
    u.density = sum_density / static_cast<double>(u.tiles);
    u.mean_union = sum_union / static_cast<double>(u.tiles);
  }
  return u;
}

}  // namespace step5::bench
