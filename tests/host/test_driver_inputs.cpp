// Host tests of the example driver's input embeddings (examples/driver_common.hpp,
// token_embedding): the stream key r * 1000003 + pos + 1 is computed without int overflow
// (--requests up to 65535), and is unchanged where the old int form did not overflow (so the
// driver's default checksum is unchanged).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "../../examples/driver_common.hpp"

namespace {

/// The embedding of the key `key`, recomputed independently of token_embedding.
std::vector<float> embedding_of_key(std::uint64_t seed, std::uint64_t key, int hidden) {
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * key));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(hidden));
  for (float& x : v) x = step5::round_bf16(nd(rng));
  return v;
}

std::vector<float> embedding(std::uint64_t seed, int r, int pos, int hidden) {
  std::vector<float> v(static_cast<std::size_t>(hidden));
  step5::driver::token_embedding(seed, r, pos, hidden, v.data());
  return v;
}

}  // namespace

TEST_CASE("token_embedding: same inputs as the int key wherever it did not overflow") {
  constexpr int kHidden = 16;
  // r * 1000003 + pos + 1 <= INT_MAX: the int key's value, cast to uint64 as before
  for (int r : {0, 1, 2, 100, 2146})
    for (int pos : {0, 1, 511, (1 << 20) - 1}) {
      INFO("r " << r << ", pos " << pos);
      const long long k = static_cast<long long>(r) * 1000003 + pos + 1;
      REQUIRE(k <= INT_MAX);
      CHECK(embedding(1234, r, pos, kHidden) == embedding_of_key(1234, static_cast<std::uint64_t>(static_cast<int>(k)), kHidden));
    }
}

TEST_CASE("token_embedding: no int overflow for large request indices (up to 65535 requests)") {
  constexpr int kHidden = 16;
  // r = 2147 at pos 2^20 - 1 and every r >= 2148 overflowed int (undefined behaviour; in practice
  // a wrapped, negative key): the key is now the exact value
  for (int r : {2147, 2148, 40000, 65534})
    for (int pos : {0, (1 << 20) - 1}) {
      INFO("r " << r << ", pos " << pos);
      const std::uint64_t k = static_cast<std::uint64_t>(r) * 1000003u + static_cast<std::uint64_t>(pos) + 1u;
      if (r >= 2148 || pos > 0) REQUIRE(k > static_cast<std::uint64_t>(INT_MAX));
      CHECK(embedding(1234, r, pos, kHidden) == embedding_of_key(1234, k, kHidden));
    }
  // distinct requests get distinct inputs
  CHECK(embedding(1234, 65534, 0, kHidden) != embedding(1234, 65533, 0, kHidden));
}
