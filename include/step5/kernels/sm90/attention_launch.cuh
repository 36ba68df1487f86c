#pragma once
/// \file step5/kernels/sm90/attention_launch.cuh
/// Host launcher of the sparse attention kernels (SPEC.md §4 steps 7–8) for one geometry row:
/// checks every precondition of `ops::sparse_attention` (returning a Status that names the value),
/// plans the launch and starts `sparse_attention_kernel` (one launch; the split merge is fused into
/// the last split CTA of each tile). Instantiated by
/// step5/instantiate.cuh.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "step5/core/cuda_check.hpp"
#include "step5/kernels/sm90/attention.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/attention.hpp"
#include "step5/ops/dispatch.hpp"

namespace step5::kernels::sm90 {

/// Whether clusters of `splits` CTAs of `kernel` (128 threads, `smem` dynamic bytes; sizes above 8
/// need the non-portable attribute, set here) can be resident on the current device `dev`
/// (cudaOccupancyMaxActiveClusters > 0). Cached per (instance: stage count and kind; device;
/// splits) with the smem size it was checked for.
enum class AttentionInstance : int { kGeneral = 0, kWgmma = 1, kOneQuery = 2, kCount = 3 };
template <int D, int HPG>
Status attention_clusters_available(void (*kernel)(SparseAttentionArgs), int ns, AttentionInstance instance,
                                    int dev, int splits, std::size_t smem, bool* available) {
  static std::atomic<unsigned long long>
      cache[static_cast<int>(AttentionInstance::kCount)][64][ops::kAttentionMaxClusterSplits + 1]
           [ops::kAttentionMaxStages + 1];
  const int kind = static_cast<int>(instance);
  const bool cacheable = kind >= 0 && kind < static_cast<int>(AttentionInstance::kCount) && dev >= 0 && dev < 64 &&
                         splits <= ops::kAttentionMaxClusterSplits && ns <= ops::kAttentionMaxStages;
  const unsigned long long key = (static_cast<unsigned long long>(smem) + 1ull) << 2;
  if (cacheable) {
    const unsigned long long c = cache[kind][dev][splits][ns].load(std::memory_order_relaxed);
    if ((c & ~3ull) == key) {
      *available = (c & 3ull) == 1ull;
      return Status::Ok();
    }
  }
  cudaError_t err = cudaSuccess;
  if (splits > 8) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  LaunchShape shape;
  shape.grid = dim3(1, 1, static_cast<unsigned>(splits));
  shape.block = dim3(128);
  shape.smem = smem;
  shape.cluster_z = static_cast<unsigned>(splits);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = make_launch_config(shape, nullptr, false, attr);
  int clusters = 0;
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
  if (err == cudaErrorInvalidValue || err == cudaErrorNotSupported || err == cudaErrorInvalidClusterSize) {
    (void)cudaGetLastError();  // this call's own (non-sticky) error
    clusters = 0;  // a cluster size or attribute the device does not support: the last-arriver merge
  } else if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string("attention cluster occupancy query (") + std::to_string(splits) +
                                              " CTAs): " + cudaGetErrorString(err));
  }
  *available = clusters > 0;
  if (cacheable)
    cache[kind][dev][splits][ns].store(key | (clusters > 0 ? 1ull : 2ull), std::memory_order_relaxed);
  return Status::Ok();
}

/// Launches the (D, HPG) instance with a checked plan.
template <int D, int HPG>
Status launch_sparse_attention(const ops::SparseAttentionParams& p, const ops::SparseAttentionPlan& plan,
                               void* workspace, cudaStream_t stream) {
  SparseAttentionArgs a{};
  a.q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  a.q_stride = p.q_row_stride > 0 ? p.q_row_stride : static_cast<long long>(p.num_local_heads) * D;
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(p.k_cache);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(p.v_cache);
  a.kv_heads = p.num_kv_groups;
  a.num_blocks = p.num_blocks;
  a.block_size = p.block_size;
  a.block_table = p.block_table;
  a.max_blocks = p.max_blocks;
  a.bounds_fault = p.bounds_fault;
  a.cu_seqlens = p.cu_seqlens_q;
  a.seq_lens = p.seq_lens;
  a.num_requests = p.num_requests;
  a.num_tokens = p.num_tokens;
  a.topk_ids = p.topk_ids;
  a.counts = p.counts;
  a.topk = p.topk;
  a.gate = reinterpret_cast<const __nv_bfloat16*>(p.gate);
  a.gate_stride = p.gate_row_stride > 0 ? p.gate_row_stride : p.num_local_heads;
  a.out = reinterpret_cast<__nv_bfloat16*>(p.out);
  a.out_stride = p.out_row_stride > 0 ? p.out_row_stride : static_cast<long long>(p.num_local_heads) * D;
  a.lse = p.lse;
  a.num_local_heads = p.num_local_heads;
  const float scale = p.softmax_scale > 0.f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
  a.scale_log2 = scale * 1.4426950408889634f;
  a.query_tile = plan.query_tile;
  a.num_splits = plan.num_splits;
  a.cluster_merge = 0;
  a.tile_gather = p.tile_gather;
  a.bitmap_words = plan.bitmap_words;
  if (plan.num_splits > 1) {
    const ops::SparseAttentionWorkspaceLayout l =
        ops::sparse_attention_workspace_layout(plan.max_tiles, p.num_kv_groups, plan.num_splits, D);
    char* ws = static_cast<char*>(workspace);
    a.ws_counters = reinterpret_cast<unsigned*>(ws);
    a.ws_o = reinterpret_cast<float*>(ws + l.partials);
    a.ws_lse = reinterpret_cast<float*>(ws + l.lse);
  }
  // the instance: ring depth, wgmma path and one-query tiles from the plan (the wgmma instance
  // exists for the head dims and the ring depth of ops::attention_wgmma_head_dim /
  // kAttentionWgmmaStages only; the one-query instance for plans of query_tile 1, decode)
  const auto by_stages = [&](auto one_q) {
    constexpr bool kOneQ = decltype(one_q)::value;
    return plan.stages == 4   ? &sparse_attention_kernel<D, HPG, 4, false, kOneQ>
           : plan.stages == 3 ? &sparse_attention_kernel<D, HPG, 3, false, kOneQ>
                              : &sparse_attention_kernel<D, HPG, 2, false, kOneQ>;
  };
  // (plans of query tile 1 never have wgmma_tiles: those need query_tile x hpg_q > 32)
  const bool one_query = plan.query_tile == 1;
  auto kernel = one_query ? by_stages(std::true_type{}) : by_stages(std::false_type{});
  AttentionInstance instance = one_query ? AttentionInstance::kOneQuery : AttentionInstance::kGeneral;
  if constexpr (ops::attention_wgmma_head_dim(D)) {
    if (plan.wgmma_tiles) {
      kernel = &sparse_attention_kernel<D, HPG, ops::kAttentionWgmmaStages, true>;
      instance = AttentionInstance::kWgmma;
    }
  }
  // one fixed limit (every plan's smem_bytes <= ops::kAttentionMaxSmem), the same on every call: a
  // per-plan value let two host threads launching different plans of one instance lower each
  // other's limit between the set and the launch (the top-k and score launchers follow the same
  // rule)
  STEP5_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(ops::kAttentionMaxSmem)));
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(plan.max_tiles), static_cast<unsigned>(p.num_kv_groups),
                    static_cast<unsigned>(plan.num_splits));
  shape.block = dim3(128);
  shape.smem = plan.smem_bytes;
  if (plan.cluster_merge) {  // the split CTAs of a (tile, group) as one cluster, where it can be resident
    int dev = 0;
    STEP5_RETURN_IF_ERROR(resolve_device(p.device, "sparse_attention: device", &dev));
    bool available = false;
    const Status checked =
        attention_clusters_available<D, HPG>(kernel, plan.stages, instance, dev, plan.num_splits,
                                             plan.smem_bytes, &available);
    STEP5_RETURN_IF_ERROR(checked);
    if (available) {
      a.cluster_merge = 1;
      shape.cluster_z = static_cast<unsigned>(plan.num_splits);
    }
  }
  STEP5_RETURN_IF_ERROR(launch_kernel("sparse_attention_kernel launch", kernel, shape, stream, a));
  if (a.cluster_merge) ops::detail::attention_cluster_merge_launches().fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

namespace attn_detail {
inline bool aligned(const void* p, std::size_t n) { return (reinterpret_cast<std::uintptr_t>(p) % n) == 0; }
/// The outputs (out, lse, the workspace's counters and partials) must not overlap any input nor
/// each other: each CTA writes its tile's rows while other CTAs still read q rows of other tiles,
/// the caches, the selection rows, the gate and the step's arrays. The one overlap the kernel
/// supports is out == q with the same row stride (in place): an element of q is read only by the
/// CTAs of its (token tile, KV group), and only the last of them to finish (the merging split)
/// writes it. Exact byte ranges from the first to the last byte of the rows [0, T).
inline Status check_disjoint(const ops::SparseAttentionParams& p, int D, const void* workspace,
                             std::size_t workspace_bytes) {
  using U = std::uint64_t;
  const U T = static_cast<U>(p.num_tokens), Hl = static_cast<U>(p.num_local_heads), row = Hl * static_cast<U>(D);
  const U lg = static_cast<U>(p.num_kv_groups);
  const U qs = p.q_row_stride != 0 ? static_cast<U>(p.q_row_stride) : row;
  const U os = p.out_row_stride != 0 ? static_cast<U>(p.out_row_stride) : row;
  const U gs = p.gate_row_stride != 0 ? static_cast<U>(p.gate_row_stride) : Hl;
  const U cache = ops::kv_cache_bytes(p.num_blocks, p.block_size, p.num_kv_groups, D);
  const NamedRange out{"out", p.out, strided_rows_bytes(p.num_tokens, os, row, 2)};
  const NamedRange q{"q", p.q, strided_rows_bytes(p.num_tokens, qs, row, 2)};
  const auto step = ops::step_array_ranges(p.cu_seqlens_q, p.seq_lens, p.block_table, p.num_requests, p.max_blocks,
                                           {"cu_seqlens_q", "seq_lens", "block_table"});
  STEP5_RETURN_IF_ERROR(require_disjoint(
      "sparse_attention", {out, {"lse", p.lse, T * Hl * 4}, {"workspace", workspace, workspace_bytes}},
      {{"k_cache", p.k_cache, cache},
       {"v_cache", p.v_cache, cache},
       {"topk_ids", p.topk_ids, lg * T * (static_cast<U>(p.topk) + 1) * 4},
       {"counts", p.counts, lg * T * 4},
       {"gate", p.gate, strided_rows_bytes(p.num_tokens, gs, Hl, 2)},
       step[2],
       step[0],
       step[1]}));
  STEP5_RETURN_IF_ERROR(
      require_disjoint("sparse_attention", {{"lse", p.lse, T * Hl * 4}, {"workspace", workspace, workspace_bytes}}, {q}));
  if (static_cast<const void*>(p.out) == static_cast<const void*>(p.q) && os == qs) return Status::Ok();  // in place
  return require_disjoint("sparse_attention", {out}, {q});
}
}  // namespace attn_detail

/// The checks of `ops::sparse_attention` that hold for every layout of a geometry of head
/// dimension D (head_dim, the device, the size arguments), and the launch plan.
template <int D>
Status sparse_attention_plan_for(const ops::SparseAttentionParams& p, std::string_view geometry_name,
                                 ops::SparseAttentionPlan* plan) {
  using ops::detail::attn_msg;
  if (p.head_dim != D)
    return unsupported(attn_msg("head_dim", p.head_dim, std::to_string(D) + " (geometry " + std::string(geometry_name) + ")"));
  int dev = 0;
  STEP5_RETURN_IF_ERROR(resolve_device(p.device, "sparse_attention: device", &dev));
  STEP5_RETURN_IF_ERROR(require_sm90a_build(dev, "sparse_attention"));
  int sms = 0;
  STEP5_RETURN_IF_ERROR(device_sm_count(dev, &sms));
  return ops::sparse_attention_plan(p, sms, plan);
}

/// The checked launch of the (D, HPG) kernels for `plan` (from `sparse_attention_plan_for<D>`;
/// plan.hpg_q == HPG): the step (`validate_step`), pointers, strides and alignment, then the launch.
template <int D, int HPG>
Status sparse_attention_checked_launch(const ops::SparseAttentionParams& p, const ops::SparseAttentionPlan& plan,
                                       void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  using ops::detail::attn_msg;
  if (plan.hpg_q != HPG) return Status(StatusCode::kInternal, "sparse_attention: hpg_q dispatch mismatch");
  {
    ops::StepCheck check = ops::attention_step_check(p, true);
    if (plan.workspace_bytes > 0) {
      check.workspace_required = plan.workspace_bytes;
      check.workspace_bytes = workspace == nullptr ? 0 : workspace_bytes;
      check.workspace_hint = "sparse_attention_workspace_size";
    }
    STEP5_RETURN_IF_ERROR(ops::validate_step(check));
  }
  if (p.num_tokens == 0 || p.num_requests == 0) return Status::Ok();
  const long long row = static_cast<long long>(p.num_local_heads) * D;
  if (p.q == nullptr) return invalid_argument("sparse_attention: q is null");
  if (p.k_cache == nullptr || p.v_cache == nullptr) return invalid_argument("sparse_attention: k_cache or v_cache is null");
  if (p.topk_ids == nullptr || p.counts == nullptr) return invalid_argument("sparse_attention: topk_ids or counts is null");
  if (p.out == nullptr) return invalid_argument("sparse_attention: out is null");
  if (p.q_row_stride != 0 && (p.q_row_stride < row || p.q_row_stride % 2 != 0))
    return invalid_argument(attn_msg("q_row_stride", p.q_row_stride, "0 or an even value >= Hl*D = " + std::to_string(row)));
  if (p.out_row_stride != 0 && (p.out_row_stride < row || p.out_row_stride % 4 != 0))
    return invalid_argument(
        attn_msg("out_row_stride", p.out_row_stride, "0 or a multiple of 4 >= Hl*D = " + std::to_string(row)));
  if (p.gate != nullptr && p.gate_row_stride != 0 && p.gate_row_stride < p.num_local_heads)
    return invalid_argument(attn_msg("gate_row_stride", p.gate_row_stride,
                                     "0 or >= num_local_heads = " + std::to_string(p.num_local_heads)));
  // row t of q / out / gate starts at t * stride (int64 element offsets; check_disjoint's extents)
  STEP5_RETURN_IF_ERROR(require_strided_rows_fit("sparse_attention", "q_row_stride", p.num_tokens, p.q_row_stride, row, 2));
  STEP5_RETURN_IF_ERROR(
      require_strided_rows_fit("sparse_attention", "out_row_stride", p.num_tokens, p.out_row_stride, row, 2));
  if (p.gate != nullptr)
    STEP5_RETURN_IF_ERROR(require_strided_rows_fit("sparse_attention", "gate_row_stride", p.num_tokens,
                                                   p.gate_row_stride, p.num_local_heads, 2));
  if (!attn_detail::aligned(p.q, 4)) return invalid_argument("sparse_attention: q must be 4-byte aligned");
  if (!attn_detail::aligned(p.out, 8)) return invalid_argument("sparse_attention: out must be 8-byte aligned");
  if (!attn_detail::aligned(p.k_cache, 16) || !attn_detail::aligned(p.v_cache, 16))
    return invalid_argument("sparse_attention: k_cache and v_cache must be 16-byte aligned (cp.async)");
  if (p.lse != nullptr && !attn_detail::aligned(p.lse, 4)) return invalid_argument("sparse_attention: lse must be 4-byte aligned");
  // the kernel's int32 loads of the selection rows and counts
  STEP5_RETURN_IF_ERROR(require_aligned("sparse_attention", alignof(std::int32_t),
                                        {{"topk_ids", p.topk_ids}, {"counts", p.counts}}));
  if (p.gate != nullptr) STEP5_RETURN_IF_ERROR(require_aligned("sparse_attention", alignof(bf16), {{"gate", p.gate}}));
  if (plan.workspace_bytes > 0 && !attn_detail::aligned(workspace, 16))
    return invalid_argument("sparse_attention: workspace must be 16-byte aligned");
  STEP5_RETURN_IF_ERROR(attn_detail::check_disjoint(p, D, plan.workspace_bytes > 0 ? workspace : nullptr,
                                                     plan.workspace_bytes));
  return launch_sparse_attention<D, HPG>(p, plan, workspace, stream);
}

/// The checked entry of geometry row `Id` (see ops::sparse_attention): the row-wide checks and
/// plan, then the one dispatch (`ops::dispatch_local_layout`, ops/dispatch.hpp) maps (Hl, lg) to
/// the listed compile-time layout, whose (head_dim, hpg_q) picks the kernel instance; one
/// instance per distinct (head_dim, hpg_q) of the row.
template <layout::GeometryId Id>
Status sparse_attention_entry(const ops::SparseAttentionParams& p, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream) {
  constexpr const layout::GeometryEntry& kEntry = layout::entry_of(Id);
  // p.device when set (the stream's device): the per-device setup (smem and cluster attributes,
  // occupancy queries) and the launch run with it current, then the caller's device is restored
  const DeviceScope scope(p.device, "sparse_attention: device");
  STEP5_RETURN_IF_ERROR(scope.status);
  ops::SparseAttentionPlan plan;
  STEP5_RETURN_IF_ERROR(sparse_attention_plan_for<kEntry.geometry.head_dim>(p, kEntry.name, &plan));
  return ops::dispatch_local_layout<Id>(p.num_local_heads, p.num_kv_groups, "sparse_attention", [&](auto tag) {
    using L = typename decltype(tag)::Layout;
    return sparse_attention_checked_launch<L::kGeometry.head_dim, L::kHpgQ>(p, plan, workspace, workspace_bytes,
                                                                            stream);
  });
}

}  // namespace step5::kernels::sm90
