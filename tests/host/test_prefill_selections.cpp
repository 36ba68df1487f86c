// bench_attention's prefill selection patterns (bench/prefill_selections.hpp, issue 15 §3): the
// SPEC §4.6 row rules refuse each kind of bad row; the "local + sinks + scattered" generator gives
// rows that follow them (ids unique, ascending, in [0, p/R), then the current region p/R, count =
// min(topk, p/R) + 1, -1 padding), with its sinks, its local window and uniformly scattered rest,
// the same on every call; the union density per query tile counts what the kernel would gather.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "../../bench/prefill_selections.hpp"

namespace sb = step5::bench;
constexpr int R = step5::layout::kRegionSize;

namespace {
/// A valid row for position p: the first min(topk, c) history regions (SPEC §4.6 shape).
std::vector<std::int32_t> first_regions_row(int topk, long long p, int* count) {
  const long long c = p / R;
  std::vector<std::int32_t> row(static_cast<std::size_t>(topk) + 1, -1);
  const long long n = std::min<long long>(topk, c);
  for (long long k = 0; k < n; ++k) row[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(k);
  row[static_cast<std::size_t>(n)] = static_cast<std::int32_t>(c);
  *count = static_cast<int>(n + 1);
  return row;
}
}  // namespace

TEST_CASE("token_positions: token i of request b at seq_lens[b] - q_len_b + i (SPEC §5)") {
  const std::vector<std::int32_t> cu = {0, 3, 3, 5}, seq = {10, 7, 2};
  const std::vector<long long> pos = sb::token_positions(3, cu.data(), seq.data());
  CHECK(pos == std::vector<long long>{7, 8, 9, 0, 1});
}

TEST_CASE("selection_row_error: a valid row passes, each broken rule is named") {
  const int topk = 6;
  const long long p = 8 * 20 + 3;  // c = 20 > topk
  int count = 0;
  std::vector<std::int32_t> row = first_regions_row(topk, p, &count);
  REQUIRE(count == 7);
  CHECK(sb::selection_row_error(row.data(), count, topk, p).empty());
  auto err = [&](std::vector<std::int32_t> r, int cnt) { return sb::selection_row_error(r.data(), cnt, topk, p); };
  CHECK(err(row, 6).find("count = 6, expected min(topk 6, p/R 20) + 1 = 7") != std::string::npos);
  {
    auto r = row;
    r[2] = r[1];  // duplicate
    CHECK(err(r, count).find("entry 2 = 1, expected a history region in [2, 20)") != std::string::npos);
  }
  {
    auto r = row;
    r[3] = 1;  // descending
    CHECK(err(r, count).find("entry 3 = 1") != std::string::npos);
  }
  {
    auto r = row;
    r[5] = 20;  // the current region among the history ids
    CHECK(err(r, count).find("entry 5 = 20, expected a history region in [5, 20)") != std::string::npos);
  }
  {
    auto r = row;
    r[0] = -1;
    CHECK(err(r, count).find("entry 0 = -1") != std::string::npos);
  }
  {
    auto r = row;
    r[6] = 19;  // current region missing
    CHECK(err(r, count).find("entry 6 = 19, expected the current region p/R = 20") != std::string::npos);
  }
  {
    // short history: p/R = 2 < topk gives count 3 and -1 padding after it
    int c2 = 0;
    auto r = first_regions_row(topk, 8 * 2, &c2);
    REQUIRE(c2 == 3);
    CHECK(sb::selection_row_error(r.data(), c2, topk, 8 * 2).empty());
    r[4] = 0;
    CHECK(sb::selection_row_error(r.data(), c2, topk, 8 * 2).find("entry 4 = 0, expected -1") != std::string::npos);
  }
  CHECK(sb::selection_row_error(row.data(), count, 0, p).find("topk = 0") != std::string::npos);
  CHECK(sb::selection_row_error(row.data(), count, topk, -1).find("position = -1") != std::string::npos);
}

TEST_CASE("sinks_local_scattered: SPEC §4.6 rows with sinks, local window and scattered rest") {
  const sb::SinksLocalScattered cfg{4, 128, 7};
  std::vector<std::uint32_t> mark;
  std::uint32_t stamp = 0;
  for (int topk : {1, 3, 100, 132, 133, 512, 1024})
    for (long long c : {0LL, 1LL, 5LL, 131LL, 132LL, 133LL, 512LL, 513LL, 700LL, 1024LL, 1025LL, 4096LL, 16384LL}) {
      for (long long p : {c * R, c * R + R - 1}) {
        CAPTURE(topk);
        CAPTURE(p);
        std::vector<std::int32_t> row(static_cast<std::size_t>(topk) + 1, 12345);
        const int count = sb::sinks_local_scattered_row(cfg, topk, 0, p, mark, stamp, row.data());
        REQUIRE(sb::selection_row_error(row.data(), count, topk, p) == "");
        const long long n = std::min<long long>(topk, c);
        if (n == c) continue;  // the whole history: checked by the rule above
        const long long s = std::min<long long>(4, n), l = std::min<long long>(128, n - s);
        for (long long k = 0; k < s; ++k) CHECK(row[static_cast<std::size_t>(k)] == k);  // sinks
        for (long long k = 0; k < l; ++k)  // the local window ends at the current region
          CHECK(row[static_cast<std::size_t>(n - l + k)] == c - l + k);
        for (long long k = s; k < n - l; ++k) {  // scattered: strictly inside [s, c - l)
          CHECK(row[static_cast<std::size_t>(k)] >= s);
          CHECK(row[static_cast<std::size_t>(k)] < c - l);
        }
        // deterministic: the same call again gives the same row; another group another one
        std::vector<std::int32_t> again(row.size()), other(row.size());
        sb::sinks_local_scattered_row(cfg, topk, 0, p, mark, stamp, again.data());
        CHECK(again == row);
        if (n - s - l >= 8 && c - l - s >= 2 * (n - s - l)) {
          sb::sinks_local_scattered_row(cfg, topk, 1, p, mark, stamp, other.data());
          CHECK(other != row);
        }
      }
    }
}

TEST_CASE("sinks_local_scattered: the scattered regions are uniform over the middle of the history") {
  // topk 512 at c = 4096 + i (400 rows): 380 scattered regions per row from [4, c - 128); each of
  // 8 equal bins of that range holds 1/8 of the 152000 draws within 3 % (binomial sd ~ 0.25 %).
  const sb::SinksLocalScattered cfg{4, 128, 99};
  const int topk = 512;
  std::vector<long long> pos;
  for (int i = 0; i < 400; ++i) pos.push_back((4096LL + i) * R + i % R);
  const int lg = 1;
  std::vector<std::int32_t> ids(pos.size() * (topk + 1)), counts(pos.size());
  sb::sinks_local_scattered(cfg, lg, pos, topk, ids.data(), counts.data());
  CHECK(sb::selections_error(lg, pos, topk, ids.data(), counts.data()) == "");
  std::vector<long long> bins(8, 0);
  long long total = 0;
  for (std::size_t t = 0; t < pos.size(); ++t) {
    const std::int32_t* row = ids.data() + t * (topk + 1);
    const long long M = pos[t] / R - 128 - 4;  // size of [4, c - 128)
    for (int k = 4; k < 4 + 380; ++k) {
      const long long v = row[k] - 4;
      REQUIRE(v >= 0);
      REQUIRE(v < M);
      ++bins[static_cast<std::size_t>(v * 8 / M)];
      ++total;
    }
  }
  CHECK(total == 400 * 380);
  for (long long b : bins) CHECK(std::abs(static_cast<double>(b) / total - 0.125) < 0.125 * 0.03);
  // neighbouring queries draw independently: rows t and t + 1 share few scattered regions
  // (expected 380 * 380 / 3964 ~ 36)
  const std::int32_t* r0 = ids.data();
  const std::int32_t* r1 = ids.data() + (topk + 1);
  const std::set<std::int32_t> a(r0 + 4, r0 + 384);
  int shared = 0;
  for (int k = 4; k < 384; ++k) shared += static_cast<int>(a.count(r1[k]));
  CHECK(shared > 10);
  CHECK(shared < 80);
}

TEST_CASE("selections_error names the group and token of the first bad row") {
  const int topk = 4, lg = 2;
  const std::vector<long long> pos = {40, 41, 42};
  std::vector<std::int32_t> ids(lg * pos.size() * (topk + 1)), counts(lg * pos.size());
  sb::sinks_local_scattered(sb::SinksLocalScattered{1, 1, 3}, lg, pos, topk, ids.data(), counts.data());
  CHECK(sb::selections_error(lg, pos, topk, ids.data(), counts.data()) == "");
  ids[(1 * pos.size() + 2) * (topk + 1) + 4] = 4;  // group 1, token 2: current region 5 replaced
  CHECK(sb::selections_error(lg, pos, topk, ids.data(), counts.data()) ==
        "group 1, token 2 (position 42): entry 4 = 4, expected the current region p/R = 5");
}

TEST_CASE("union_density: distinct valid ids per (request-aligned query tile, group)") {
  // Two requests: request 0 has 3 tokens at positions 80..82 (c = 10), request 1 has 2 tokens at
  // 16, 17 (c = 2). topk 2, query_tile 2: tiles {0,1}, {2}, {3,4}; one group.
  const int topk = 2, W = topk + 1;
  const std::vector<std::int32_t> cu = {0, 3, 5}, seq = {83, 18};
  const std::vector<long long> pos = sb::token_positions(2, cu.data(), seq.data());
  REQUIRE(pos == std::vector<long long>{80, 81, 82, 16, 17});
  std::vector<std::int32_t> ids = {
      1, 5, 10,  // t0
      5, 7, 10,  // t1: union with t0 {1,5,7,10} = 4
      0, 9, 10,  // t2 alone: 3
      0, 1, 2,   // t3
      0, 1, 2,   // t4: union {0,1,2} = 3
  };
  std::vector<std::int32_t> counts = {3, 3, 3, 3, 3};
  REQUIRE(sb::selections_error(1, pos, topk, ids.data(), counts.data()) == "");
  sb::UnionDensity u = sb::union_density(1, 2, cu.data(), pos, 2, topk, ids.data(), counts.data());
  CHECK(u.tiles == 3);
  CHECK(u.mean_union == doctest::Approx((4.0 + 3.0 + 3.0) / 3));
  CHECK(u.density == doctest::Approx((4.0 / 4 + 3.0 / 2 + 3.0 / 4) / 3));
  // entries past count are not read; ids the kernel ignores (> p/R, < 0) are not counted
  counts[1] = 1;  // t1 keeps only id 5
  ids[static_cast<std::size_t>(2 * W + 1)] = 11;  // t2: 11 > c = 10
  u = sb::union_density(1, 2, cu.data(), pos, 2, topk, ids.data(), counts.data());
  CHECK(u.mean_union == doctest::Approx((3.0 + 2.0 + 3.0) / 3));
  // two groups average over (tile, group); a query_tile of 0 gives nothing
  CHECK(sb::union_density(1, 2, cu.data(), pos, 0, topk, ids.data(), counts.data()).tiles == 0);
}

TEST_CASE("union_density at bench size: sinks + local + scattered tiles share only sinks and local") {
  // 16 consecutive queries of one region-aligned stretch: each row 512 = 4 + 128 + 380 history
  // regions; the tile's union is sinks + local window (+ the regions the window slides over) +
  // ~16 x 380 scattered (a few collide): far above topk, far below 16 x topk.
  const int topk = 512, qt = 16;
  std::vector<std::int32_t> cu = {0, qt}, seq = {4096 * R + qt};
  const std::vector<long long> pos = sb::token_positions(1, cu.data(), seq.data());
  std::vector<std::int32_t> ids(static_cast<std::size_t>(qt) * (topk + 1)), counts(qt);
  sb::sinks_local_scattered(sb::SinksLocalScattered{4, 128, 5}, 1, pos, topk, ids.data(), counts.data());
  const sb::UnionDensity u = sb::union_density(1, 1, cu.data(), pos, qt, topk, ids.data(), counts.data());
  CHECK(u.tiles == 1);
  // 4 sinks + local windows of c-128..c-1 for c = 4096, 4097 (129 regions) + the 2 current
  // regions (4097's window covers 4096) + scattered: expected distinct of 6080 draws over ~3964
  // regions, each (query) draw distinct within itself.
  CHECK(u.mean_union > 4 + 129 + 2500);
  CHECK(u.mean_union < 4 + 129 + 2 + 3964);
  CHECK(u.density == doctest::Approx(u.mean_union / (qt * topk)));
}
