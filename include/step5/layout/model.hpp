#pragma once
/// \file step5/layout/model.hpp
/// Model-level helpers of SPEC.md §6: per-layer attention types (which layers run DSA), the MoE
/// reduce policy, and the MoE metadata of one pipeline stage. Host-safe (g++).
///
/// Errors: like the run-time layout checks, these return `step5::Status` (kInvalidArgument,
/// message naming the offending value and what was expected) and write results through an
/// out-pointer; they never throw.
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "step5/core/status.hpp"

namespace step5::layout {

/// SPEC §6: the per-layer attention types spanning the dense stack and the MTP layers:
/// `layer_types_with_mtp` when non-empty, else `layer_types`, else empty. An absent config
/// field is passed as an empty list.
inline std::vector<std::string> resolve_layer_types(const std::vector<std::string>& layer_types_with_mtp,
                                                    const std::vector<std::string>& layer_types) {
  if (!layer_types_with_mtp.empty()) return layer_types_with_mtp;
  return layer_types;
}

/// SPEC §6: true when a layer of type `type` runs DSA, i.e. `type` is one of
/// `sparse_config.apply_to_layer_types` (Step5: `["full_attention"]`). Exact, case-sensitive.
inline bool is_dsa_layer(std::string_view type, const std::vector<std::string>& apply_to_layer_types) {
  for (const auto& t : apply_to_layer_types)
    if (t == type) return true;
  return false;
}

/// Indices of the DSA layers among `layer_types` (as resolved by `resolve_layer_types`).
inline std::vector<int> dsa_layer_indices(const std::vector<std::string>& layer_types,
                                          const std::vector<std::string>& apply_to_layer_types) {
  std::vector<int> out;
  for (std::size_t i = 0; i < layer_types.size(); ++i)
    if (is_dsa_layer(layer_types[i], apply_to_layer_types)) out.push_back(static_cast<int>(i));
  return out;
}

/// SPEC §6 MoE reduce policy. When `fuse_all_reduce`, routed and shared expert partials are
/// added in fp32 and all-reduced once; otherwise each path is reduced separately.
struct MoeReducePolicy {
  bool fuse_all_reduce = false;  ///< tp > 1 && dp == 1
  bool per_path_reduce = true;   ///< !fuse_all_reduce
  friend constexpr bool operator==(const MoeReducePolicy&, const MoeReducePolicy&) = default;
};

/// The reduce policy for `tp_size` tensor-parallel and `dp_size` data-parallel ranks (both > 0;
/// otherwise kInvalidArgument naming the value).
inline Status moe_reduce_policy(int tp_size, int dp_size, MoeReducePolicy* out) {
  if (out == nullptr) return invalid_argument("moe_reduce_policy: out is null");
  if (tp_size <= 0) return invalid_argument("moe_reduce_policy: tp_size must be > 0, got " + std::to_string(tp_size));
  if (dp_size <= 0) return invalid_argument("moe_reduce_policy: dp_size must be > 0, got " + std::to_string(dp_size));
  out->fuse_all_reduce = tp_size > 1 && dp_size == 1;
  out->per_path_reduce = !out->fuse_all_reduce;
  return Status::Ok();
}

/// What an engine knows of one decoder layer of a pipeline stage, for `moe_stage_metadata`.
/// Fields other than `is_moe` are read only for MoE layers.
struct MoeLayerDesc {
  bool is_moe = false;            ///< the layer's MLP is a routed MoE (false: dense MLP)
  int num_experts = 0;            ///< logical routed experts (`moe_num_experts`), > 0
  int num_redundant_experts = 0;  ///< extra physical replicas for expert load balancing (EPLB), >= 0
  int ep_size = 1;                ///< expert-parallel ranks the physical experts are spread over, > 0;
                                  ///< must divide num_experts + num_redundant_experts
};

/// SPEC §6 MoE metadata of one pipeline stage (the MixtureOfExperts fields an engine exposes).
/// Counts come from one local MoE layer (all MoE layers of the stage must agree); all 0 when the
/// stage has only dense layers (`num_expert_groups` is 1 and `num_shared_experts` 0 always).
struct MoeStageMetadata {
  int num_moe_layers = 0;              ///< MoE layers in the stage
  int num_expert_groups = 1;           ///< always 1 (no grouped routing)
  int num_shared_experts = 0;          ///< always 0 (the shared expert is not counted)
  int num_logical_experts = 0;         ///< = num_experts
  int num_physical_experts = 0;        ///< = num_experts + num_redundant_experts
  int num_local_physical_experts = 0;  ///< = num_physical_experts / ep_size
  int num_routed_experts = 0;          ///< = num_experts
  int num_redundant_experts = 0;       ///< = num_redundant_experts
  friend constexpr bool operator==(const MoeStageMetadata&, const MoeStageMetadata&) = default;
};

/// Computes the metadata of the stage made of `layers` (in order). kInvalidArgument, naming the
/// stage-local layer index and the value, when a MoE layer has num_experts <= 0,
/// num_redundant_experts < 0, a physical expert count (num_experts + num_redundant_experts) past
/// int, ep_size <= 0, an ep_size that does not divide the physical expert count, or counts that
/// differ from the stage's first MoE layer.
inline Status moe_stage_metadata(std::span<const MoeLayerDesc> layers, MoeStageMetadata* out) {
  if (out == nullptr) return invalid_argument("moe_stage_metadata: out is null");
  MoeStageMetadata m;
  const MoeLayerDesc* first = nullptr;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const MoeLayerDesc& l = layers[i];
    if (!l.is_moe) continue;
    const std::string at = "moe_stage_metadata: layer " + std::to_string(i) + ": ";
    if (l.num_experts <= 0) return invalid_argument(at + "num_experts must be > 0, got " + std::to_string(l.num_experts));
    if (l.num_redundant_experts < 0)
      return invalid_argument(at + "num_redundant_experts must be >= 0, got " + std::to_string(l.num_redundant_experts));
    if (l.ep_size <= 0) return invalid_argument(at + "ep_size must be > 0, got " + std::to_string(l.ep_size));
    if (l.num_redundant_experts > std::numeric_limits<int>::max() - l.num_experts)
      return invalid_argument(at + "num_experts " + std::to_string(l.num_experts) + " + num_redundant_experts " +
                              std::to_string(l.num_redundant_experts) + " overflows int");
    const int physical = l.num_experts + l.num_redundant_experts;
    if (physical % l.ep_size != 0)
      return invalid_argument(at + "ep_size " + std::to_string(l.ep_size) + " must divide the physical expert count " +
                              std::to_string(physical) + " (num_experts " + std::to_string(l.num_experts) +
                              " + num_redundant_experts " + std::to_string(l.num_redundant_experts) + ")");
    if (first == nullptr) {
      first = &l;
    } else if (l.num_experts != first->num_experts || l.num_redundant_experts != first->num_redundant_experts ||
               l.ep_size != first->ep_size) {
      return invalid_argument(at + "MoE layers of one stage must agree: (num_experts, num_redundant_experts, "
                                   "ep_size) = (" + std::to_string(l.num_experts) + ", " +
                              std::to_string(l.num_redundant_experts) + ", " + std::to_string(l.ep_size) +
                              "), the stage's first MoE layer has (" + std::to_string(first->num_experts) + ", " +
                              std::to_string(first->num_redundant_experts) + ", " +
                              std::to_string(first->ep_size) + ")");
    }
    ++m.num_moe_layers;
  }
  if (first != nullptr) {
    m.num_logical_experts = first->num_experts;
    m.num_physical_experts = first->num_experts + first->num_redundant_experts;
    m.num_local_physical_experts = m.num_physical_experts / first->ep_size;
    m.num_routed_experts = first->num_experts;
    m.num_redundant_experts = first->num_redundant_experts;
  }
  *out = m;
  return Status::Ok();
}

}  // namespace step5::layout
