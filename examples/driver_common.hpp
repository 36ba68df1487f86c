#pragma once
// Shared parts of the example driver (examples/step5_driver.cpp): the workload (requests,
// chunked prefill and decode steps, paged-cache block tables), the model (the DSA layers of a
// checkpoint, loaded per TP rank) and the backend interface with its CPU implementation (the
// CPU reference of include/step5/reference/, ranks run one after the other and summed as the
// TP all-reduce would, SPEC.md §4.8).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "step5/comm/rendezvous.hpp"
#include "step5/layout/parallel.hpp"
#include "step5/reference/layer.hpp"
#include "step5/weights/config.hpp"
#include "step5/weights/layer_loader.hpp"
#include "step5/weights/safetensors.hpp"

namespace step5::driver {

/// The most --requests: the GPU path takes at most step5::ops::kMaxIndexerRequests = 65535
/// requests per step (one summaries grid row per request; ops/indexer.hpp needs the CUDA headers,
/// so this header, built without CUDA too, repeats the number and driver_cuda.cu static_asserts
/// that the two agree). Refused up front for both backends, so a run valid on the CPU is valid on
/// the GPU.
inline constexpr int kMaxRequests = 65535;

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------
// Workload
// ---------------------------------------------------------------------------------------------

/// One step of the run: the batch metadata (SPEC §5) of the requests that have rows in it.
struct Step {
  bool prefill = true;
  reference::StepBatch batch;       // cu_seqlens_q, seq_lens, block_table, tail_slot
  std::vector<int> requests;        // request index of each batch row
  int num_tokens() const { return batch.cu_seqlens_q.empty() ? 0 : batch.cu_seqlens_q.back(); }
};

/// Requests, their prompt lengths, the block tables of the paged caches and the steps.
struct Workload {
  int block_size = 64;
  int num_blocks = 0;
  int max_blocks = 0;
  int max_position = 0;
  std::vector<int> prompt_lens;
  std::vector<std::vector<std::int32_t>> block_tables;  // per request
  std::vector<Step> steps;
  int prefill_tokens = 0, decode_tokens = 0;
};

/// `requests` requests with prompt lengths tokens, tokens*(R-1)/R, ... (at least 1), prefilled in
/// chunks of `chunk` tokens (all requests batched in each step), then `decode_steps` decode rows.
/// Blocks are dealt to requests in a shuffled order, so block tables are non-contiguous.
/// The prompt lengths of `requests` requests: tokens, tokens*(R-1)/R, ... (at least 1).
inline std::vector<int> prompt_lengths(int requests, int tokens) {
  std::vector<int> lens;
  for (int r = 0; r < requests; ++r)
    lens.push_back(std::max(1, tokens - static_cast<int>(static_cast<long>(tokens) * r / requests)));
  return lens;
}

/// The sizes of a workload, computed without building it (for the memory estimate).
struct WorkloadShape {
  double num_blocks = 0, max_position = 0, max_step_tokens = 0, total_tokens = 0, steps = 0, requests = 0, max_blocks = 0;
};
inline WorkloadShape workload_shape(int requests, int tokens, int chunk, int decode_steps, int block_size) {
  WorkloadShape s;
  s.requests = requests;
  for (int len : prompt_lengths(requests, tokens)) {
    const double blocks = std::ceil(static_cast<double>(len + decode_steps) / block_size);
    s.num_blocks += blocks;
    s.max_blocks = std::max(s.max_blocks, blocks);
    s.max_position = std::max(s.max_position, static_cast<double>(len + decode_steps));
    s.max_step_tokens += std::min(chunk, len);
    s.total_tokens += len + decode_steps;
  }
  s.steps = std::ceil(static_cast<double>(tokens) / chunk) + decode_steps;
  return s;
}

inline Workload make_workload(int requests, int tokens, int chunk, int decode_steps, int block_size, std::uint64_t seed) {
  Workload w;
  w.block_size = block_size;
  w.prompt_lens = prompt_lengths(requests, tokens);
  std::vector<int> blocks_needed;
  for (int r = 0; r < requests; ++r) {
    const int max_len = w.prompt_lens[r] + decode_steps;
    blocks_needed.push_back((max_len + block_size - 1) / block_size);
    w.max_blocks = std::max(w.max_blocks, blocks_needed.back());
    w.max_position = std::max(w.max_position, max_len);
  }
  w.num_blocks = std::accumulate(blocks_needed.begin(), blocks_needed.end(), 0);
  std::vector<std::int32_t> ids(w.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  int next = 0;
  for (int r = 0; r < requests; ++r) {
    std::vector<std::int32_t> t(w.max_blocks, 0);
    for (int i = 0; i < blocks_needed[r]; ++i) t[i] = ids[next++];
    w.block_tables.push_back(std::move(t));
  }
  std::vector<int> done(requests, 0);
  auto add_step = [&](bool prefill, const std::vector<std::pair<int, int>>& rows) {
    Step s;
    s.prefill = prefill;
    s.batch.cu_seqlens_q.push_back(0);
    s.batch.max_blocks = w.max_blocks;
    for (auto [r, n] : rows) {
      done[r] += n;
      s.batch.cu_seqlens_q.push_back(s.batch.cu_seqlens_q.back() + n);
      s.batch.seq_lens.push_back(done[r]);
      s.batch.tail_slot.push_back(r);
      s.batch.block_table.insert(s.batch.block_table.end(), w.block_tables[r].begin(), w.block_tables[r].end());
      s.requests.push_back(r);
      (prefill ? w.prefill_tokens : w.decode_tokens) += n;
    }
    w.steps.push_back(std::move(s));
  };
  for (;;) {
    std::vector<std::pair<int, int>> rows;
    for (int r = 0; r < requests; ++r)
      if (done[r] < w.prompt_lens[r]) rows.push_back({r, std::min(chunk, w.prompt_lens[r] - done[r])});
    if (rows.empty()) break;
    add_step(true, rows);
  }
  for (int d = 0; d < decode_steps; ++d) {
    std::vector<std::pair<int, int>> rows;
    for (int r = 0; r < requests; ++r) rows.push_back({r, 1});
    add_step(false, rows);
  }
  return w;
}

/// The fp32 input embedding of token `pos` of request `r` (deterministic, N(0, 1)-like). The
/// stream key r * 1000003 + pos + 1 is computed in uint64, not int: the same values as the int
/// form wherever that did not overflow (<= INT_MAX: every r <= 2146 at positions < 2^20, so the
/// same inputs and checksums), and no undefined behaviour for larger r (up to 65535 requests).
inline void token_embedding(std::uint64_t seed, int r, int pos, int hidden, float* out) {
  const std::uint64_t key = static_cast<std::uint64_t>(r) * 1000003u + static_cast<std::uint64_t>(pos) + 1u;
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * key));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int i = 0; i < hidden; ++i) out[i] = round_bf16(nd(rng));
}

// ---------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------

/// The DSA layers that run: weights[layer][i] of rank first_rank + i — every rank (one process,
/// the CPU backend and the threaded --tp N), or one rank (one process per GPU: first_rank = RANK).
struct Model {
  ModelConfig config;
  std::vector<int> layers;  // checkpoint layer indices
  int tp = 1;
  int first_rank = 0;
  std::vector<std::vector<reference::LayerWeights>> weights;
  std::vector<std::size_t> bytes_read_per_rank;  // [tp]; 0 for the ranks not loaded here
};

/// Loads the first `num_layers` DSA layers of `ckpt` for every rank of `tp`, or for rank
/// `only_rank` alone (>= 0: one process per GPU; only that rank's shards are read).
inline Model load_model(const Checkpoint& ckpt, const ModelConfig& cfg, int num_layers, int tp, int max_position,
                        int only_rank = -1) {
  Model m;
  m.config = cfg;
  m.tp = tp;
  m.first_rank = only_rank >= 0 ? only_rank : 0;
  const std::vector<int> dsa = cfg.dsa_layers();
  if (static_cast<int>(dsa.size()) < num_layers)
    throw Error(StatusCode::kInvalidArgument, "--layers " + std::to_string(num_layers) + ": the checkpoint (" +
                                                  cfg.source + ") has only " + std::to_string(dsa.size()) +
                                                  " DSA layers");
  m.layers.assign(dsa.begin(), dsa.begin() + num_layers);
  m.bytes_read_per_rank.assign(tp, 0);
  for (int layer : m.layers) {
    std::vector<reference::LayerWeights> ranks;
    for (int r = 0; r < tp; ++r) {
      if (only_rank >= 0 && r != only_rank) continue;
      layout::RankLayout rl;
      throw_if_error(layout::rank_layout(cfg.geometry, cfg.parallel_layout(tp), r, &rl));
      LayerLoadStats st;
      ranks.push_back(load_layer_weights(ckpt, cfg, layer, rl, max_position, &st));
      m.bytes_read_per_rank[r] += st.bytes_read;
    }
    m.weights.push_back(std::move(ranks));
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Memory estimates (checked before a run starts, so a run that cannot fit is refused up front)
// ---------------------------------------------------------------------------------------------

/// Elements of one rank's paged caches of one layer for workload `w` (SPEC §5): k and v
/// `[num_blocks, block_size, KVl, D]` bf16 each, region summaries `[num_blocks, block_size/8, P]`
/// e4m3, tails `[requests, 8, 2, P]` bf16. Used by the CUDA backend's allocations and the estimates.
struct CacheSizes {
  std::size_t kv = 0, summary = 0, tail = 0;
  std::size_t bytes() const { return 2 * kv * 2 + summary + tail * 2; }
};
inline CacheSizes cache_sizes(const layout::RankLayout& r, const Workload& w) {
  const auto& g = r.geometry;
  CacheSizes c;
  c.kv = static_cast<std::size_t>(w.num_blocks) * w.block_size * r.local_kv_heads * g.head_dim;
  c.summary = static_cast<std::size_t>(w.num_blocks) * (w.block_size / 8) * g.proxy_dim;
  c.tail = w.prompt_lens.size() * 8 * 2 * static_cast<std::size_t>(g.proxy_dim);
  return c;
}

/// Bytes of one rank's loaded layer weights (reference::LayerWeights: the fused projection, o_proj,
/// norms and the RoPE tables up to max_position).
inline std::size_t layer_weight_bytes(const layout::RankLayout& r, int hidden, int max_position) {
  const auto& g = r.geometry;
  return static_cast<std::size_t>(r.padded_rows) * hidden * 2 +
         static_cast<std::size_t>(hidden) * r.local_heads * g.head_dim * 2 + (2 * g.head_dim + 3 * g.proxy_dim) * 4 +
         static_cast<std::size_t>(max_position) * (g.rot_main + g.rot_idx) * 2;  // cos + sin, rot/2 bf16 each
}

/// Host bytes a run needs, about: per rank and layer the weights and caches (a second tp-1 copy
/// for --check), the largest step's intermediates of the CPU reference (scores over the whole
/// history, projections), the residuals kept per step (per layer with --check) and the steps'
/// batch metadata (block tables).
struct HostEstimate {
  double weights = 0, caches = 0, step = 0, residuals = 0, metadata = 0;
  double total() const { return weights + caches + step + residuals + metadata; }
};
/// `one_rank`: this process loads one rank of `tp` (one process per GPU; rank 0's sizes).
inline HostEstimate estimate_host_bytes(const ModelConfig& cfg, int layers, int tp, int topk, const WorkloadShape& w,
                                        int block_size, bool cpu_backend, bool check, bool one_rank = false) {
  HostEstimate e;
  const int hidden = cfg.hidden_size;
  const auto& g = cfg.geometry;
  auto add_model = [&](int t, bool with_caches) {
    for (int r = 0; r < (one_rank && t == tp ? 1 : t); ++r) {
      layout::RankLayout rl;
      throw_if_error(layout::rank_layout(g, cfg.parallel_layout(t), r, &rl));
      e.weights += static_cast<double>(layers) * layer_weight_bytes(rl, hidden, static_cast<int>(w.max_position));
      // cache_sizes per block: k + v bf16, summaries e4m3 (tails are negligible)
      if (with_caches)
        e.caches += static_cast<double>(layers) * w.num_blocks * block_size *
                    (4.0 * rl.local_kv_heads * g.head_dim + g.proxy_dim / 8.0);
    }
  };
  add_model(tp, cpu_backend);
  if (check && (!cpu_backend || tp > 1)) add_model(1, true);  // the tp-1 CPU reference of --check
  const double T = w.max_step_tokens, hist = w.max_position / 8.0 + 1;
  // scores [groups, T, history] + top-k ids fp32/int32; projections fp32; q, k, v, attention bf16
  e.step = T * g.num_kv_heads * (hist + topk + 1) * 4 + T * (g.num_heads * g.head_dim * 4.0 + hidden) * 4 +
           T * (g.index_num_heads + 2) * g.proxy_dim * 4.0 + 2 * T * hidden * 4.0 * (tp + 1);
  e.residuals = w.total_tokens * hidden * 4 * (check ? layers + 2 : 1);
  e.metadata = w.steps * w.requests * (w.max_blocks + 4) * 4 + w.requests * w.max_blocks * 4;
  return e;
}

/// MemAvailable of /proc/meminfo in bytes (else free + cached pages by sysconf; 0 if unknown).
inline double host_available_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      unsigned long long kb = 0;
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        std::fclose(f);
        return static_cast<double>(kb) * 1024.0;
      }
    }
    std::fclose(f);
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * page : 0.0;
}

/// "1.23 GB" (decimal units, as df -H).
inline std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, bytes >= 1e9 ? "%.2f GB" : "%.1f MB", bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6);
  return b;
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

/// Named wall-clock (or CUDA event) times, in seconds, accumulated per phase/kernel.
using Timings = std::map<std::string, double>;

/// Runs DSA layers over a workload's steps: `run_step` takes the fp32 residual `[T, hidden]` of
/// the step's tokens, adds every layer's attention output to it (SPEC §4.8). When
/// `layer_residuals` is given it receives the residual before each layer and after the last
/// (layers + 1 arrays), for the per-layer --check.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual void run_step(const Step& step, int topk, std::vector<float>& residual, Timings& timings,
                        std::vector<std::vector<float>>* layer_residuals = nullptr) = 0;
  /// After the last step: releases what other processes share (the multi-process backend
  /// finalises its NCCL communicator, bounded by the timeout). Errors: step5::Error.
  virtual void finish() {}
};

/// The CPU reference backend: per layer, every rank's partial, summed (simulated all-reduce).
class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, const Workload& w) : model_(model) {
    for (const auto& ranks : model.weights) {
      std::vector<reference::LayerCache> c;
      for (const auto& lw : ranks)
        c.push_back(reference::LayerCache::create(lw.rank, w.num_blocks, w.block_size,
                                                  static_cast<int>(w.prompt_lens.size())));
      caches_.push_back(std::move(c));
    }
  }
  std::string name() const override { return "cpu"; }
  void run_step(const Step& step, int topk, std::vector<float>& residual, Timings& timings,
                std::vector<std::vector<float>>* layer_residuals = nullptr) override {
    if (layer_residuals) layer_residuals->clear();
    for (std::size_t l = 0; l < model_.weights.size(); ++l) {
      if (layer_residuals) layer_residuals->push_back(residual);
      const auto t0 = Clock::now();
      const std::vector<bf16> reduced = layer(step, topk, l, residual);
      timings[model_.tp > 1 ? "layer (" + std::to_string(model_.tp) + " ranks + simulated all-reduce)" : "layer"] +=
          seconds_since(t0);
      reference::add_residual(residual.data(), reduced.data(), reduced.size());
    }
    if (layer_residuals) layer_residuals->push_back(residual);
  }
  /// Layer `l` of this step on the layer input bf16(residual): every rank's partial, summed
  /// (simulated all-reduce, SPEC §4.8). Updates layer l's caches. `inter` (optional) receives
  /// rank 0's intermediates (all of them at tp 1).
  std::vector<bf16> layer(const Step& step, int topk, std::size_t l, const std::vector<float>& residual,
                          reference::LayerIntermediates* inter = nullptr) {
    std::vector<bf16> x(residual.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = to_bf16(residual[i]);
    std::vector<std::vector<bf16>> partials;
    for (std::size_t r = 0; r < model_.weights[l].size(); ++r)
      partials.push_back(reference::forward(model_.weights[l][r], caches_[l][r], step.batch, x.data(), topk,
                                            r == 0 ? inter : nullptr));
    return reference::simulated_all_reduce(partials);
  }

 private:
  const Model& model_;
  std::vector<std::vector<reference::LayerCache>> caches_;  // [layer][rank]
};

/// Creates the CUDA backend (examples/driver_cuda.cu), or returns nullptr and sets `why`.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const Workload& w, bool simulate_tp, std::string* why);

/// One process per GPU (tools/launch_tp.sh): this process is rank `env.rank` of `env.world_size`
/// (= model.tp) on GPU `env.local_rank`; `store` is the rendezvous all ranks met at.
struct DistContext {
  comm::DistEnv env;
  comm::TcpStore* store = nullptr;
  double timeout_s = 300;  ///< bound on NCCL init, each step's wait and the finalisation
};

/// Why this process cannot run its rank on the GPU (no device, GPU LOCAL_RANK missing, not
/// sm_90, no NCCL in the build), or "" when it can. Every rank asks before any NCCL call, so all
/// of them skip together.
std::string cuda_rank_unavailable(const DistContext& dist);

/// The multi-process CUDA backend: `model` holds this rank's weights only (load_model's
/// only_rank); the NCCL communicator is created from a unique id that rank 0 makes and the store
/// broadcasts (ncclCommInitRankConfig, non-blocking, polled until done, a dead peer (the store's
/// peers_alive) or the timeout: then ncclCommAbort and a step5::Error naming the rank and the
/// seconds). Each step's wait polls the same way. run_step returns the all-reduced residual on
/// every rank; layer_residuals are recorded where asked (rank 0 for --check).
std::unique_ptr<Backend> make_cuda_backend_multiprocess(const Model& model, const Workload& w, const DistContext& dist);

}  // namespace step5::driver
