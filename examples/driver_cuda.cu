// The driver's CUDA backend (examples/step5_driver.cpp): the whole layer of SPEC §4 on the GPU
// through `step5::ops::dsa_layer_plan` (once per rank) + `dsa_layer_run` (per step), the TP all-reduce over NCCL (--tp N on N GPUs, one
// thread per GPU, communicators from one unique id), over NCCL with one process per GPU
// (tools/launch_tp.sh: this process is one rank, the unique id comes through the rendezvous of
// step5/comm/rendezvous.hpp, every wait bounded), or simulated on one GPU (--simulate-tp: all
// ranks' shards on device 0, partials summed), and the fp32 residual add. Per-kernel times come
// from CUDA events recorded on rank 0 (this process's rank, one process per GPU) between the stages.
#include <cuda_runtime.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "driver_common.hpp"
#include "step5/core/cuda_check.hpp"
#include "step5/ops/elementwise.hpp"
#include "step5/ops/layer.hpp"
#if defined(STEP5_DRIVER_HAVE_NCCL)
#include "step5/comm/nccl.hpp"
#endif

static_assert(step5::driver::kMaxRequests == step5::ops::kMaxIndexerRequests,
              "driver_common.hpp's --requests limit is the GPU kernels' (ops/indexer.hpp)");

namespace step5::driver {
namespace {

void ok(const Status& s) { throw_if_error(s); }
void cu(cudaError_t e, const char* what) { throw_if_error(cuda_status(e, what)); }

template <class T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  cu(cudaMalloc(&p, std::max<std::size_t>(1, v.size()) * sizeof(T)), "cudaMalloc(weights)");
  if (!v.empty()) cu(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy(weights)");
  return p;
}
template <class T>
T* alloc(std::size_t n, const char* what) {
  T* p = nullptr;
  cu(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T)), what);
  return p;
}

// Records an event after each stage of rank 0's layers; times are summed per stage name.
struct EventHook : ops::DsaLayerHook {
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  std::vector<cudaEvent_t> pool;
  std::size_t used = 0;
  cudaEvent_t next() {
    if (used == pool.size()) {
      cudaEvent_t e;
      cu(cudaEventCreate(&e), "cudaEventCreate");
      pool.push_back(e);
    }
    return pool[used++];
  }
  void after(const char* stage, cudaStream_t s) override {
    cudaEvent_t e = next();
    cu(cudaEventRecord(e, s), "cudaEventRecord");
    marks.emplace_back(stage, e);
  }
  void collect(Timings& t) {  // after the stream is synchronised
    for (std::size_t i = 1; i < marks.size(); ++i) {
      float ms = 0;
      cu(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second), "cudaEventElapsedTime");
      t["gpu " + marks[i].first] += ms * 1e-3;
    }
    marks.clear();
    used = 0;
  }
  ~EventHook() override {
    for (auto e : pool) cudaEventDestroy(e);
  }
};

struct LayerDev {
  ops::DsaLayerWeights w;
  ops::DsaLayerCaches caches;
  layout::RankLayout rank;
  std::vector<void*> owned;
};

// One rank's device state (all ranks on device 0 when simulating TP).
struct RankDev {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::vector<LayerDev> layers;
  ops::DsaLayerPlan plan;  // planned once per rank (every layer of a rank has its layout)
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  bf16* x = nullptr;
  bf16* partial = nullptr;
  float* residual = nullptr;
  std::int32_t *cu = nullptr, *seq = nullptr, *table = nullptr, *slots = nullptr;
  const bf16* const* self_ptr = nullptr;  // device array {partial}: the NCCL-reduced partial
#if defined(STEP5_DRIVER_HAVE_NCCL)
  ncclComm_t comm = nullptr;
#endif
};

class CudaBackend : public Backend {
 public:
  // dist == nullptr: every rank in this process (threads over NCCL, or simulated); else one
  // process per GPU: ranks_ holds this process's rank alone (model.weights[l][0]).
  CudaBackend(const Model& model, const Workload& w, bool simulate, const DistContext* dist = nullptr)
      : model_(model), w_(w), simulate_(simulate), dist_(dist) {
    const int tp = model.tp;
    const int nranks = dist ? 1 : tp;  // ranks held by this process
    const int hidden = model.config.hidden_size;
    cap_.max_requests = static_cast<int>(w.prompt_lens.size());
    cap_.max_seq_len = w.max_position;
    cap_.block_size = w.block_size;
    cap_.max_blocks = w.max_blocks;
    cap_.num_blocks = w.num_blocks;
    for (const auto& s : w.steps) cap_.max_tokens = std::max(cap_.max_tokens, s.num_tokens());
    check_device_memory(model, w);
    ranks_.resize(nranks);
    for (int r = 0; r < nranks; ++r) {
      RankDev& d = ranks_[r];
      d.device = dist ? dist->env.local_rank : simulate ? 0 : r;
      cu(cudaSetDevice(d.device), "cudaSetDevice");
      if (r == 0 || !simulate) cu(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      else d.stream = ranks_[0].stream;
      for (std::size_t l = 0; l < model.weights.size(); ++l) d.layers.push_back(upload_layer(model.weights[l][r], w));
      d.partial = alloc<bf16>(static_cast<std::size_t>(cap_.max_tokens) * hidden, "cudaMalloc(partial)");
      d.self_ptr = upload(std::vector<const bf16*>{d.partial});
      if (r == 0 || !simulate) {
        d.x = alloc<bf16>(static_cast<std::size_t>(cap_.max_tokens) * hidden, "cudaMalloc(x)");
        d.residual = alloc<float>(static_cast<std::size_t>(cap_.max_tokens) * hidden, "cudaMalloc(residual)");
        d.cu = alloc<std::int32_t>(cap_.max_requests + 1, "cudaMalloc(cu_seqlens_q)");
        d.seq = alloc<std::int32_t>(cap_.max_requests, "cudaMalloc(seq_lens)");
        d.table = alloc<std::int32_t>(static_cast<std::size_t>(cap_.max_requests) * cap_.max_blocks, "cudaMalloc(block_table)");
        d.slots = alloc<std::int32_t>(cap_.max_requests, "cudaMalloc(tail_slot)");
      } else {
        d.x = ranks_[0].x, d.residual = ranks_[0].residual, d.cu = ranks_[0].cu, d.seq = ranks_[0].seq;
        d.table = ranks_[0].table, d.slots = ranks_[0].slots;
      }
      const int topk_cap = step5::layout::kMaxTopk;
      cap_.max_topk = topk_cap;
      ok(ops::dsa_layer_plan(d.layers[0].rank, hidden, cap_, &d.plan, d.device));
      d.ws_bytes = d.plan.workspace_bytes;
      if (r == 0 || !simulate) {
        d.ws = alloc<unsigned char>(d.ws_bytes, "cudaMalloc(workspace)");
        cu(cudaMemset(d.ws, 0, d.ws_bytes), "cudaMemset(workspace)");
      } else {
        d.ws = ranks_[0].ws;
      }
    }
    if (simulate && tp > 1) {
      std::vector<const bf16*> ptrs;
      for (auto& d : ranks_) ptrs.push_back(d.partial);
      partial_ptrs_ = upload(ptrs);
    }
#if defined(STEP5_DRIVER_HAVE_NCCL)
    if (dist) {
      init_comm_multiprocess();
    } else if (!simulate && tp > 1) {
      ncclUniqueId id;
      ok(comm::nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
      std::vector<std::thread> th;
      std::vector<std::string> errors(tp);
      for (int r = 0; r < tp; ++r)
        th.emplace_back([&, r] {
          const Status dev = cuda_status(cudaSetDevice(ranks_[r].device), "cudaSetDevice");
          const Status init = dev.ok() ? comm::nccl_status(ncclCommInitRank(&ranks_[r].comm, tp, id, r), "ncclCommInitRank") : dev;
          const Status check = init.ok() ? comm::check_comm(ranks_[r].comm, tp, r) : init;
          if (!check.ok()) errors[r] = check.to_string();
        });
      for (auto& t : th) t.join();
      for (int r = 0; r < tp; ++r)
        if (!errors[r].empty()) throw Error(StatusCode::kNcclError, "rank " + std::to_string(r) + ": " + errors[r]);
    }
#endif
  }
  ~CudaBackend() override {
    for (auto& d : ranks_) {
      cudaSetDevice(d.device);
#if defined(STEP5_DRIVER_HAVE_NCCL)
      // One process per GPU: a communicator still here means the run failed part-way; abort (never
      // waits on the other ranks) rather than destroy. finish() destroys it after a good run.
      if (d.comm) dist_ ? ncclCommAbort(d.comm) : ncclCommDestroy(d.comm);
      d.comm = nullptr;
#endif
      for (auto& l : d.layers)
        for (void* p : l.owned) cudaFree(p);
    }
  }

  void finish() override {
#if defined(STEP5_DRIVER_HAVE_NCCL)
    if (!dist_) return;
    RankDev& d = ranks_[0];
    cu(cudaSetDevice(d.device), "cudaSetDevice");
    const auto deadline = Clock::now() + seconds(dist_->timeout_s);
    const ncclResult_t r = ncclCommFinalize(d.comm);  // non-blocking communicator: may be in progress
    if (r != ncclSuccess && r != ncclInProgress)
      abort_comm(d, StatusCode::kNcclError, std::string("ncclCommFinalize failed: ") + ncclGetErrorString(r));
    wait_comm(d, deadline, "ncclCommFinalize");
    ok(comm::nccl_status(ncclCommDestroy(d.comm), "ncclCommDestroy"));
    d.comm = nullptr;
#endif
  }
  std::string name() const override { return "cuda"; }

  /// Refuses (step5::Error naming the numbers) a run whose device allocations exceed a GPU's free
  /// memory (cudaMemGetInfo): per rank the layers' weights (the loaded sizes) and paged caches
  /// (cache_sizes), the layer workspace (dsa_layer_workspace_bytes) and the step buffers.
  void check_device_memory(const Model& model, const Workload& w) {
    const int tp = model.tp, hidden = model.config.hidden_size;
    const int nranks = dist_ ? 1 : tp;  // model.weights[l][r] of the ranks this process holds
    ops::DsaLayerCapacity cap = cap_;
    cap.max_topk = step5::layout::kMaxTopk;
    std::vector<double> need(simulate_ ? 1 : nranks, 0.0), weights(need.size(), 0.0), caches(need.size(), 0.0),
        ws(need.size(), 0.0);
    for (int r = 0; r < nranks; ++r) {
      const std::size_t d = simulate_ ? 0 : r;
      for (const auto& layer : model.weights) {
        const reference::LayerWeights& lw = layer[r];
        weights[d] += 2.0 * (lw.fused.size() + lw.o_proj.size() + lw.rope_main.cos.size() + lw.rope_main.sin.size() +
                             lw.rope_idx.cos.size() + lw.rope_idx.sin.size());
        caches[d] += cache_sizes(lw.rank, w).bytes();
      }
      std::size_t b = 0;
      ok(ops::dsa_layer_workspace_bytes(model.weights[0][r].rank, hidden, cap, &b));
      if (r == 0 || !simulate_) ws[d] += b + static_cast<double>(cap.max_tokens) * hidden * (2 + 4 + 2);
    }
    for (std::size_t i = 0; i < need.size(); ++i) {
      const std::size_t d = dist_ ? static_cast<std::size_t>(dist_->env.local_rank) : i;
      std::size_t free_b = 0, total_b = 0;
      cu(cudaSetDevice(static_cast<int>(d)), "cudaSetDevice");
      cu(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
      const double total = weights[i] + caches[i] + ws[i];
      if (total > 0.95 * static_cast<double>(free_b))
        throw Error(StatusCode::kInvalidArgument,
                    "the run needs about " + gb(total) + " on GPU " + std::to_string(d) + " (weights " + gb(weights[i]) +
                        ", paged caches " + gb(caches[i]) + ", workspace and buffers " + gb(ws[i]) + "), " +
                        gb(static_cast<double>(free_b)) + " of " + gb(static_cast<double>(total_b)) +
                        " are free: use fewer --tokens, --requests or --layers" +
                        (simulate_ && tp > 1 ? ", or --tp on several GPUs without --simulate-tp" : ""));
    }
  }

  void run_step(const Step& step, int topk, std::vector<float>& residual, Timings& timings,
                std::vector<std::vector<float>>* layer_residuals = nullptr) override {
    if (layer_residuals) layer_residuals->clear();
    // Copies the device residual of rank `d` to layer_residuals (synchronising its stream).
    auto record = [&](RankDev& d, std::size_t n) {
      if (!layer_residuals) return;
      std::vector<float> h(n);
      cu(cudaMemcpyAsync(h.data(), d.residual, n * 4, cudaMemcpyDeviceToHost, d.stream), "download residual");
      cu(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize");
      layer_residuals->push_back(std::move(h));
    };
    const int tp = model_.tp;
    const int hidden = model_.config.hidden_size;
    const int T = step.num_tokens();
    const std::size_t n = static_cast<std::size_t>(T) * hidden;
    ops::DsaLayerStep ls;
    ls.batch.num_requests = static_cast<int>(step.batch.seq_lens.size());
    ls.batch.num_tokens = T;
    ls.batch.cu_seqlens_q_host = step.batch.cu_seqlens_q.data();  // host mirrors (validated on the host)
    ls.batch.seq_lens_host = step.batch.seq_lens.data();
    ls.table.max_blocks = w_.max_blocks;
    ls.table.block_size = w_.block_size;
    ls.table.num_blocks = w_.num_blocks;
    ls.max_seq_len = *std::max_element(step.batch.seq_lens.begin(), step.batch.seq_lens.end());
    ls.topk = topk;
    const auto t0 = Clock::now();
    auto run_rank = [&](int r) {
      RankDev& d = ranks_[r];
      cu(cudaSetDevice(d.device), "cudaSetDevice");
      const bool owner = r == 0 || !simulate_;
      if (owner) {
        const int B = ls.batch.num_requests;
        cu(cudaMemcpyAsync(d.cu, step.batch.cu_seqlens_q.data(), (B + 1) * 4, cudaMemcpyHostToDevice, d.stream), "upload cu_seqlens_q");
        cu(cudaMemcpyAsync(d.seq, step.batch.seq_lens.data(), B * 4, cudaMemcpyHostToDevice, d.stream), "upload seq_lens");
        cu(cudaMemcpyAsync(d.table, step.batch.block_table.data(), step.batch.block_table.size() * 4,
                           cudaMemcpyHostToDevice, d.stream), "upload block_table");
        cu(cudaMemcpyAsync(d.slots, step.batch.tail_slot.data(), B * 4, cudaMemcpyHostToDevice, d.stream), "upload tail_slot");
        cu(cudaMemcpyAsync(d.residual, residual.data(), n * 4, cudaMemcpyHostToDevice, d.stream), "upload residual");
      }
    };
    std::vector<EventHook> hooks(1);
    auto layer_rank = [&](int r, std::size_t l, EventHook* hook) {
      RankDev& d = ranks_[r];
      ops::DsaLayerStep s = ls;
      s.batch.cu_seqlens_q = d.cu, s.batch.seq_lens = d.seq, s.table.block_table = d.table, s.tail_slot = d.slots;
      const LayerDev& L = d.layers[l];
      ok(ops::dsa_layer_run(d.plan, L.w, L.caches, s, d.x, d.partial, d.ws, d.ws_bytes, d.stream, hook));
    };
    if (dist_) {
#if defined(STEP5_DRIVER_HAVE_NCCL)
      // One process per GPU: this rank's layers, the all-reduce over NCCL, every wait bounded.
      RankDev& d = ranks_[0];
      const auto deadline = Clock::now() + seconds(dist_->timeout_s);
      auto record_bounded = [&] {
        if (!layer_residuals) return;
        std::vector<float> h(n);
        cu(cudaMemcpyAsync(h.data(), d.residual, n * 4, cudaMemcpyDeviceToHost, d.stream), "download residual");
        wait_stream(d, deadline, "a layer");
        layer_residuals->push_back(std::move(h));
      };
      run_rank(0);
      hooks[0].after("start", d.stream);
      for (std::size_t l = 0; l < model_.weights.size(); ++l) {
        record_bounded();
        ok(ops::residual_to_bf16(d.residual, d.x, n, d.stream));
        layer_rank(0, l, &hooks[0]);
        ok(comm::all_reduce_sum_bf16(d.partial, n, d.comm, d.stream));
        wait_comm(d, deadline, "ncclAllReduce (enqueue)");
        hooks[0].after("nccl all-reduce", d.stream);
        ok(ops::add_partials_to_residual(d.self_ptr, 1, d.residual, n, d.stream));
        hooks[0].after("residual", d.stream);
      }
      record_bounded();
      cu(cudaMemcpyAsync(residual.data(), d.residual, n * 4, cudaMemcpyDeviceToHost, d.stream), "download residual");
      wait_stream(d, deadline, "the step");
      hooks[0].collect(timings);
#endif
    } else if (simulate_ || tp == 1) {
      RankDev& d0 = ranks_[0];
      run_rank(0);
      hooks[0].after("start", d0.stream);
      for (std::size_t l = 0; l < model_.weights.size(); ++l) {
        record(d0, n);
        ok(ops::residual_to_bf16(d0.residual, d0.x, n, d0.stream));
        for (int r = 0; r < tp; ++r) layer_rank(r, l, r == 0 ? &hooks[0] : nullptr);
        if (tp > 1) {  // at tp 1 nothing is simulated: only the residual add follows the layer
          hooks[0].after("other ranks (simulated)", d0.stream);
          ok(ops::add_partials_to_residual(partial_ptrs_, tp, d0.residual, n, d0.stream));
          hooks[0].after("all-reduce (simulated) + residual", d0.stream);
        } else {
          ok(ops::add_partials_to_residual(d0.self_ptr, 1, d0.residual, n, d0.stream));
          hooks[0].after("residual", d0.stream);
        }
      }
      record(d0, n);
      cu(cudaMemcpyAsync(residual.data(), d0.residual, n * 4, cudaMemcpyDeviceToHost, d0.stream), "download residual");
      cu(cudaStreamSynchronize(d0.stream), "cudaStreamSynchronize");
      hooks[0].collect(timings);
    } else {
#if defined(STEP5_DRIVER_HAVE_NCCL)
      std::vector<std::thread> th;
      std::vector<std::string> errors(tp);
      for (int r = 0; r < tp; ++r)
        th.emplace_back([&, r] {
          try {
            RankDev& d = ranks_[r];
            run_rank(r);
            EventHook* hook = r == 0 ? &hooks[0] : nullptr;
            if (hook) hook->after("start", d.stream);
            for (std::size_t l = 0; l < model_.weights.size(); ++l) {
              if (r == 0) record(d, n);
              ok(ops::residual_to_bf16(d.residual, d.x, n, d.stream));
              layer_rank(r, l, hook);
              ok(comm::all_reduce_sum_bf16(d.partial, n, d.comm, d.stream));
              if (hook) hook->after("nccl all-reduce", d.stream);
              ok(ops::add_partials_to_residual(d.self_ptr, 1, d.residual, n, d.stream));
              if (hook) hook->after("residual", d.stream);
            }
            if (r == 0) {
              record(d, n);
              cu(cudaMemcpyAsync(residual.data(), d.residual, n * 4, cudaMemcpyDeviceToHost, d.stream), "download residual");
            }
            cu(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize");
          } catch (const std::exception& e) {
            errors[r] = e.what();
          }
        });
      for (auto& t : th) t.join();
      for (int r = 0; r < tp; ++r)
        if (!errors[r].empty()) throw Error(StatusCode::kInternal, "rank " + std::to_string(r) + ": " + errors[r]);
      hooks[0].collect(timings);
#else
      throw Error(StatusCode::kUnsupported, "--tp > 1 on several GPUs needs NCCL (build with STEP5_ENABLE_NCCL); use --simulate-tp");
#endif
    }
    timings["step wall"] += seconds_since(t0);
  }

 private:
#if defined(STEP5_DRIVER_HAVE_NCCL)
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  std::string who() const {
    return "rank " + std::to_string(dist_->env.rank) + " of " + std::to_string(dist_->env.world_size) + " (GPU " +
           std::to_string(dist_->env.local_rank) + ")";
  }
  // Aborts this rank's communicator (never waits on the other ranks) and throws `why`.
  [[noreturn]] void abort_comm(RankDev& d, StatusCode code, const std::string& why) {
    if (d.comm) ncclCommAbort(d.comm);
    d.comm = nullptr;
    throw Error(code, who() + ": " + why + "; NCCL communicator aborted");
  }
  // Between polls of a wait: a dead peer (its rendezvous connection closed) or the deadline ends
  // it (ncclCommAbort + Error); `what` names what was waited for.
  void check_wait(RankDev& d, Clock::time_point t0, Clock::time_point deadline, const std::string& what) {
    const Status alive = dist_->store->peers_alive();
    if (!alive.ok())
      abort_comm(d, StatusCode::kNcclError, "while waiting for " + what + ": " + alive.message());
    if (Clock::now() >= deadline)
      abort_comm(d, StatusCode::kNcclError,
                 what + " did not complete within " + std::to_string(seconds_since(t0)) + " s (--dist-timeout " +
                     std::to_string(dist_->timeout_s) + " s: another rank stuck, or slower than the timeout)");
    ncclResult_t async = ncclSuccess;
    if (d.comm && ncclCommGetAsyncError(d.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
      abort_comm(d, StatusCode::kNcclError, "while waiting for " + what + ": NCCL reported " + ncclGetErrorString(async));
  }
  static void backoff(Clock::time_point t0) {  // spin 2 ms (step latency), then sleep 200 µs per poll
    if (Clock::now() - t0 < std::chrono::milliseconds(2)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Polls the communicator until it leaves ncclInProgress (non-blocking init, enqueue, finalise).
  void wait_comm(RankDev& d, Clock::time_point deadline, const std::string& what) {
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t st = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(d.comm, &st);
      if (q != ncclSuccess) abort_comm(d, StatusCode::kNcclError, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(q));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) abort_comm(d, StatusCode::kNcclError, what + " failed: " + ncclGetErrorString(st));
      check_wait(d, t0, deadline, what);
      backoff(t0);
    }
  }
  // cudaStreamSynchronize, bounded: polls cudaStreamQuery, the communicator and the peers.
  void wait_stream(RankDev& d, Clock::time_point deadline, const std::string& what) {
    const auto t0 = Clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(d.stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) abort_comm(d, StatusCode::kCudaError, cuda_status(e, "cudaStreamQuery").message());
      check_wait(d, t0, deadline, what + " on the GPU (layers + NCCL all-reduce)");
      backoff(t0);
    }
  }
  // The communicator of this process's rank: rank 0 makes the unique id, the store broadcasts it,
  // ncclCommInitRankConfig (non-blocking) is polled until done, bounded by the timeout.
  void init_comm_multiprocess() {
    RankDev& d = ranks_[0];
    const comm::DistEnv& env = dist_->env;
    cu(cudaSetDevice(d.device), "cudaSetDevice");
    ncclUniqueId id{};
    if (env.rank == 0) ok(comm::nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    id = comm::from_blob<ncclUniqueId>(dist_->store->broadcast(comm::to_blob(id), dist_->timeout_s), "the NCCL unique id");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = Clock::now() + seconds(dist_->timeout_s);
    const ncclResult_t r = ncclCommInitRankConfig(&d.comm, env.world_size, id, env.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      abort_comm(d, StatusCode::kNcclError, std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(r));
    wait_comm(d, deadline, "ncclCommInitRankConfig (every rank must join)");
    const Status c = comm::check_comm(d.comm, env.world_size, env.rank);
    if (!c.ok()) abort_comm(d, c.code(), c.message());
  }
#endif

  LayerDev upload_layer(const reference::LayerWeights& lw, const Workload& w) {
    LayerDev L;
    L.rank = lw.rank;
    auto keep = [&](auto* p) {
      L.owned.push_back(static_cast<void*>(const_cast<std::remove_const_t<std::remove_pointer_t<decltype(p)>>*>(p)));
      return p;
    };
    L.w.fused = keep(upload(lw.fused));
    L.w.o_proj = keep(upload(lw.o_proj));
    L.w.q_norm = keep(upload(lw.q_norm));
    L.w.k_norm = keep(upload(lw.k_norm));
    L.w.index_q_norm = keep(upload(lw.index_q_norm));
    L.w.index_k_norm_w = keep(upload(lw.index_k_norm_weight));
    L.w.index_k_norm_b = keep(upload(lw.index_k_norm_bias));
    L.w.cos_main = keep(upload(lw.rope_main.cos));
    L.w.sin_main = keep(upload(lw.rope_main.sin));
    L.w.cos_idx = keep(upload(lw.rope_idx.cos));
    L.w.sin_idx = keep(upload(lw.rope_idx.sin));
    L.w.max_position = lw.rope_main.max_position;
    L.w.eps = lw.eps;
    const CacheSizes cs = cache_sizes(lw.rank, w);
    const std::size_t kv = cs.kv, sc = cs.summary;
    L.caches.k_cache = keep(alloc<bf16>(kv, "cudaMalloc(k_cache)"));
    L.caches.v_cache = keep(alloc<bf16>(kv, "cudaMalloc(v_cache)"));
    L.caches.summary_cache = keep(alloc<std::uint8_t>(sc, "cudaMalloc(summary_cache)"));
    L.caches.num_slots = static_cast<int>(w.prompt_lens.size());
    L.caches.tail = keep(alloc<bf16>(cs.tail, "cudaMalloc(tail)"));
    cu(cudaMemset(L.caches.k_cache, 0, kv * 2), "cudaMemset(k_cache)");
    cu(cudaMemset(L.caches.v_cache, 0, kv * 2), "cudaMemset(v_cache)");
    cu(cudaMemset(L.caches.summary_cache, 0, sc), "cudaMemset(summary_cache)");
    return L;
  }

  const Model& model_;
  const Workload& w_;
  bool simulate_;
  const DistContext* dist_ = nullptr;
  ops::DsaLayerCapacity cap_;
  std::vector<RankDev> ranks_;
  const bf16* const* partial_ptrs_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const Workload& w, bool simulate_tp, std::string* why) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    *why = "no CUDA device is present";
    return nullptr;
  }
  for (int d = 0; d < (simulate_tp ? 1 : std::min(n, model.tp)); ++d) {
    const Status s = require_sm90(d);
    if (!s.ok()) {
      *why = s.message();
      return nullptr;
    }
  }
  if (!simulate_tp && model.tp > n) {
    *why = "--tp " + std::to_string(model.tp) + " needs " + std::to_string(model.tp) + " GPUs, " + std::to_string(n) +
           " present (use --simulate-tp to run every rank on one GPU)";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(model, w, simulate_tp);
}

std::string cuda_rank_unavailable(const DistContext& dist) {
#if !defined(STEP5_DRIVER_HAVE_NCCL)
  (void)dist;
  return "one process per GPU needs NCCL (this build has none: configure with STEP5_ENABLE_NCCL and NCCL installed)";
#else
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no CUDA device is present";
  }
  if (dist.env.local_rank >= n)
    return "LOCAL_RANK " + std::to_string(dist.env.local_rank) + " needs GPU " + std::to_string(dist.env.local_rank) +
           ", this host has " + std::to_string(n);
  const Status s = require_sm90(dist.env.local_rank);
  return s.ok() ? std::string() : s.message();
#endif
}

std::unique_ptr<Backend> make_cuda_backend_multiprocess(const Model& model, const Workload& w, const DistContext& dist) {
  return std::make_unique<CudaBackend>(model, w, false, &dist);
}

}  // namespace step5::driver
