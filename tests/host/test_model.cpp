// Model-level helpers (SPEC §6): layer types, DSA layer selection, MoE reduce policy, MoE stage
// metadata, and their input validation.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "step5/layout/model.hpp"

namespace L = step5::layout;
using Types = std::vector<std::string>;

TEST_CASE("resolve_layer_types: layer_types_with_mtp first, else layer_types, else empty") {
  // Step-5 Preview-like: 8 dense layers (full attention on 4k+3) + 2 sliding MTP layers.
  Types dense;
  for (int i = 0; i < 8; ++i) dense.push_back(i % 4 == 3 ? "full_attention" : "sliding_attention");
  Types with_mtp = dense;
  with_mtp.push_back("sliding_attention");
  with_mtp.push_back("sliding_attention");

  CHECK(L::resolve_layer_types(with_mtp, dense) == with_mtp);
  CHECK(L::resolve_layer_types(with_mtp, dense).size() == 10);
  CHECK(L::resolve_layer_types({}, dense) == dense);  // empty list falls through
  CHECK(L::resolve_layer_types({}, {}).empty());
  CHECK(L::resolve_layer_types(with_mtp, {}) == with_mtp);

  const Types apply = {"full_attention"};
  const Types resolved = L::resolve_layer_types(with_mtp, dense);
  CHECK(L::dsa_layer_indices(resolved, apply) == std::vector<int>{3, 7});
  CHECK(L::is_dsa_layer("full_attention", apply));
  CHECK_FALSE(L::is_dsa_layer("sliding_attention", apply));
  CHECK_FALSE(L::is_dsa_layer("Full_Attention", apply));  // exact match
  CHECK_FALSE(L::is_dsa_layer("full_attention", {}));
  CHECK(L::is_dsa_layer("sliding_attention", {"full_attention", "sliding_attention"}));
  CHECK(L::dsa_layer_indices({}, apply).empty());
}

TEST_CASE("MoE reduce policy for tp, dp in {1, 2, 8}") {
  for (int tp : {1, 2, 8})
    for (int dp : {1, 2, 8}) {
      CAPTURE(tp);
      CAPTURE(dp);
      L::MoeReducePolicy p{true, true};
      REQUIRE(L::moe_reduce_policy(tp, dp, &p).ok());
      const bool fused = (tp == 2 || tp == 8) && dp == 1;  // the only fused cases: (2,1), (8,1)
      CHECK(p.fuse_all_reduce == fused);
      CHECK(p.per_path_reduce == !fused);
    }
  L::MoeReducePolicy p;
  REQUIRE(L::moe_reduce_policy(8, 1, &p).ok());
  CHECK(p == L::MoeReducePolicy{true, false});
  REQUIRE(L::moe_reduce_policy(1, 1, &p).ok());
  CHECK(p == L::MoeReducePolicy{false, true});

  step5::Status s = L::moe_reduce_policy(0, 1, &p);
  CHECK(s.code() == step5::StatusCode::kInvalidArgument);
  CHECK(s.message().find("tp_size must be > 0, got 0") != std::string::npos);
  s = L::moe_reduce_policy(2, -3, &p);
  CHECK(s.message().find("dp_size must be > 0, got -3") != std::string::npos);
  CHECK_FALSE(L::moe_reduce_policy(2, 1, nullptr).ok());
}

TEST_CASE("MoE stage metadata") {
  L::MoeStageMetadata m;
  m.num_moe_layers = 99;

  SUBCASE("dense-only stage: all zero") {
    const std::vector<L::MoeLayerDesc> dense(4);  // is_moe = false
    REQUIRE(L::moe_stage_metadata(dense, &m).ok());
    CHECK(m == L::MoeStageMetadata{0, 1, 0, 0, 0, 0, 0, 0});
    REQUIRE(L::moe_stage_metadata({}, &m).ok());
    CHECK(m.num_moe_layers == 0);
    CHECK(m.num_physical_experts == 0);
  }
  SUBCASE("mixed stage: counts from one MoE layer") {
    const L::MoeLayerDesc moe{true, 288, 32, 8};
    const L::MoeLayerDesc dense{};
    const std::vector<L::MoeLayerDesc> stage = {dense, dense, moe, moe, dense, moe};
    REQUIRE(L::moe_stage_metadata(stage, &m).ok());
    CHECK(m.num_moe_layers == 3);
    CHECK(m.num_expert_groups == 1);
    CHECK(m.num_shared_experts == 0);
    CHECK(m.num_logical_experts == 288);
    CHECK(m.num_physical_experts == 320);
    CHECK(m.num_local_physical_experts == 40);
    CHECK(m.num_routed_experts == 288);
    CHECK(m.num_redundant_experts == 32);
    // no redundancy, no EP
    const std::vector<L::MoeLayerDesc> one = {dense, L::MoeLayerDesc{true, 64, 0, 1}};
    REQUIRE(L::moe_stage_metadata(one, &m).ok());
    CHECK(m == L::MoeStageMetadata{1, 1, 0, 64, 64, 64, 64, 0});
    // fields of dense layers are ignored
    const std::vector<L::MoeLayerDesc> junk = {L::MoeLayerDesc{false, -1, -1, 0}, L::MoeLayerDesc{true, 8, 0, 2}};
    REQUIRE(L::moe_stage_metadata(junk, &m).ok());
    CHECK(m.num_local_physical_experts == 4);
  }
  SUBCASE("bad inputs name the layer and the value") {
    auto msg = [&](std::vector<L::MoeLayerDesc> v) {
      const step5::Status s = L::moe_stage_metadata(v, &m);
      CHECK(s.code() == step5::StatusCode::kInvalidArgument);
      return s.message();
    };
    const L::MoeLayerDesc dense{};
    std::string e = msg({dense, L::MoeLayerDesc{true, 0, 0, 1}});
    CHECK(e.find("layer 1") != std::string::npos);
    CHECK(e.find("num_experts must be > 0, got 0") != std::string::npos);
    e = msg({L::MoeLayerDesc{true, 8, -2, 1}});
    CHECK(e.find("num_redundant_experts must be >= 0, got -2") != std::string::npos);
    e = msg({L::MoeLayerDesc{true, 8, 0, 0}});
    CHECK(e.find("ep_size must be > 0, got 0") != std::string::npos);
    // INT_MAX + 1 physical experts: signed overflow (UB) that used to return ok() with a negative count
    e = msg({L::MoeLayerDesc{true, std::numeric_limits<int>::max(), 1, 1}});
    CHECK(e.find("num_experts 2147483647 + num_redundant_experts 1 overflows int") != std::string::npos);
    e = msg({L::MoeLayerDesc{true, 10, 0, 4}});
    CHECK(e.find("ep_size 4 must divide the physical expert count 10") != std::string::npos);
    e = msg({L::MoeLayerDesc{true, 8, 0, 2}, dense, L::MoeLayerDesc{true, 16, 0, 2}});
    CHECK(e.find("layer 2") != std::string::npos);
    CHECK(e.find("(16, 0, 2)") != std::string::npos);
    CHECK(e.find("(8, 0, 2)") != std::string::npos);
    CHECK(m.num_moe_layers == 99);  // untouched on error
    CHECK_FALSE(L::moe_stage_metadata({}, nullptr).ok());
  }
}
