// engine_minimal: how an engine uses step5 for one DSA layer on one TP rank (README "Engine API").
//   1. load the rank's weights of layer 0 from a checkpoint (a tiny one generated into a temp dir);
//   2. plan once for a capacity (outside any capture): workspace size, GEMM and attention choices;
//   3. run a prefill eagerly, then capture one decode step in a CUDA graph and replay it;
//   4. check: the replay equals an eager run of the same decode step bit for bit, and the decode
//      output equals the CPU reference (step5/reference/) within bf16 rounding.
// Prints PASS/FAIL; exit 0 = pass, 1 = fail, 77 = skipped (no sm_90 GPU).
#include <cuda_runtime.h>
#include <unistd.h>  // getpid

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "step5/ops/layer.hpp"            // dsa_layer_plan / dsa_layer_run
#include "step5/reference/layer.hpp"      // the CPU reference (the oracle)
#include "step5/weights/checkpoint_generator.hpp"
#include "step5/weights/layer_loader.hpp"  // model::LayerWeights from a checkpoint

namespace ops = step5::ops;
using step5::bf16;

// Errors become exceptions, so that main's cleanup (device memory, the temp checkpoint) always runs.
#define CK(expr)                                                                                                \
  do {                                                                                                          \
    const cudaError_t e_ = (expr);                                                                              \
    if (e_ != cudaSuccess)                                                                                      \
      throw step5::Error(step5::StatusCode::kCudaError, std::string(#expr) + ": " + cudaGetErrorString(e_) +    \
                                                            " (line " + std::to_string(__LINE__) + ")");        \
  } while (0)
#define OK(expr)                                                                                                \
  do {                                                                                                          \
    const step5::Status s_ = (expr);                                                                            \
    if (!s_.ok())                                                                                               \
      throw step5::Error(s_.code(), std::string(#expr) + ": " + s_.to_string() + " (line " +                    \
                                        std::to_string(__LINE__) + ")");                                        \
  } while (0)

template <class T>
T* upload(const std::vector<T>& h, std::vector<void*>& owned) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<std::size_t>(1, h.size()) * sizeof(T)) != cudaSuccess) return nullptr;
  owned.push_back(d);
  if (!h.empty() && cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
  return d;
}

int main() {
  int device = 0, major = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major != 9) {
    std::printf("SKIP: no sm_90 GPU\n");
    return 77;
  }
  // ---- 1. weights of layer 0, rank 1 of tp 4, from a checkpoint ----------------------------
  // a directory of this process's own (two runs at once never share a checkpoint)
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("step5_engine_minimal." + std::to_string(::getpid()))).string();
  step5::CheckpointOptions opt;
  opt.geometry = "step5_preview", opt.num_layers = 1, opt.hidden = 512;
  opt.layer_types = {"full_attention"};  // one DSA layer (the Preview pattern puts DSA on layers 4k+3)
  const int tp = 4, tp_rank = 1, max_position = 1024, topk = 16;
  std::vector<void*> owned;
  int rc = 1;
  try {
    step5::generate_checkpoint(dir, opt);
    const step5::ModelConfig cfg = step5::load_model_config(dir + "/config.json");
    const auto rl = step5::layout::make_rank_layout(cfg.geometry, step5::layout::standard_layout(cfg.geometry, tp), tp_rank);
    if (!rl.ok())
      throw step5::Error(step5::StatusCode::kInvalidArgument,
                         "tp " + std::to_string(tp) + " rank " + std::to_string(tp_rank) + ": " +
                             step5::layout::describe(rl.error));
    const step5::model::LayerWeights lw =
        step5::load_layer_weights(step5::Checkpoint(dir), cfg, 0, rl.layout, max_position);
    const auto& r = lw.rank;
    const int hidden = lw.hidden, D = r.geometry.head_dim, P = r.geometry.proxy_dim;

    // Device copies (the engine's own allocations; the library never allocates).
    ops::DsaLayerWeights w;
    w.fused = upload(lw.fused, owned), w.o_proj = upload(lw.o_proj, owned);
    w.q_norm = upload(lw.q_norm, owned), w.k_norm = upload(lw.k_norm, owned);
    w.index_q_norm = upload(lw.index_q_norm, owned), w.index_k_norm_w = upload(lw.index_k_norm_weight, owned);
    w.index_k_norm_b = upload(lw.index_k_norm_bias, owned);
    w.cos_main = upload(lw.rope_main.cos, owned), w.sin_main = upload(lw.rope_main.sin, owned);
    w.cos_idx = upload(lw.rope_idx.cos, owned), w.sin_idx = upload(lw.rope_idx.sin, owned);
    w.max_position = max_position, w.eps = lw.eps;

    // Paged caches: 2 requests, 16 blocks of 64 tokens each (request b owns blocks 16b..16b+15).
    const int B = 2, block_size = 64, max_blocks = max_position / block_size, num_blocks = B * max_blocks;
    step5::model::LayerCache ref_cache = step5::model::LayerCache::create(r, num_blocks, block_size, B);
    ops::DsaLayerCaches caches;
    caches.k_cache = upload(ref_cache.k_cache, owned), caches.v_cache = upload(ref_cache.v_cache, owned);
    caches.summary_cache = upload(ref_cache.summary_cache, owned), caches.tail = upload(ref_cache.tail, owned);
    caches.num_slots = B;

    // ---- 2. plan once per capacity (outside capture) ----------------------------------------
    const std::vector<int> prompt = {100, 37};
    ops::DsaLayerCapacity cap;
    cap.max_tokens = prompt[0] + prompt[1], cap.max_requests = B, cap.max_seq_len = max_position;
    cap.max_topk = topk, cap.block_size = block_size, cap.max_blocks = max_blocks, cap.num_blocks = num_blocks;
    ops::DsaLayerPlan plan;
    OK(ops::dsa_layer_plan(r, hidden, cap, &plan));
    void* ws = nullptr;
    CK(cudaMalloc(&ws, plan.workspace_bytes));
    owned.push_back(ws);
    CK(cudaMemset(ws, 0, plan.workspace_bytes));  // once, before first use

    // Step metadata: device arrays + host mirrors (+ the reference's owning copy).
    step5::reference::StepBatch sb;
    sb.max_blocks = max_blocks, sb.tail_slot = {0, 1};
    for (int i = 0; i < B * max_blocks; ++i) sb.block_table.push_back(i);
    std::int32_t *d_cu = nullptr, *d_seq = nullptr;
    CK(cudaMalloc(&d_cu, (B + 1) * 4));
    owned.push_back(d_cu);
    CK(cudaMalloc(&d_seq, B * 4));
    owned.push_back(d_seq);
    const std::int32_t* d_table = upload(sb.block_table, owned);
    const std::int32_t* d_slots = upload(sb.tail_slot, owned);
    bf16 *d_x = nullptr, *d_out = nullptr;
    CK(cudaMalloc(&d_x, static_cast<std::size_t>(cap.max_tokens) * hidden * 2));
    owned.push_back(d_x);
    CK(cudaMalloc(&d_out, static_cast<std::size_t>(cap.max_tokens) * hidden * 2));
    owned.push_back(d_out);
    auto set_step = [&](const std::vector<int>& q_len, const std::vector<int>& seq_len, ops::DsaLayerStep* st) {
      sb.cu_seqlens_q = {0, q_len[0], q_len[0] + q_len[1]}, sb.seq_lens = {seq_len[0], seq_len[1]};
      st->batch.cu_seqlens_q = d_cu, st->batch.seq_lens = d_seq, st->batch.num_requests = B;
      st->batch.num_tokens = sb.cu_seqlens_q[B];
      st->batch.cu_seqlens_q_host = sb.cu_seqlens_q.data(), st->batch.seq_lens_host = sb.seq_lens.data();
      st->table.block_table = d_table, st->table.max_blocks = max_blocks, st->table.block_size = block_size;
      st->table.num_blocks = num_blocks;
      st->tail_slot = d_slots, st->max_seq_len = std::max(seq_len[0], seq_len[1]), st->topk = topk;
      return cudaMemcpy(d_cu, sb.cu_seqlens_q.data(), (B + 1) * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(d_seq, sb.seq_lens.data(), B * 4, cudaMemcpyHostToDevice) == cudaSuccess;
    };
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto random_x = [&](int T) {
      std::vector<bf16> x(static_cast<std::size_t>(T) * hidden);
      for (auto& v : x) v = step5::to_bf16(u(rng));
      return x;
    };
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // ---- 3a. prefill (eager), GPU and CPU reference in lockstep ------------------------------
    ops::DsaLayerStep prefill;
    if (!set_step(prompt, prompt, &prefill)) throw step5::Error(step5::StatusCode::kCudaError, "metadata upload");
    const std::vector<bf16> x0 = random_x(prefill.batch.num_tokens);
    CK(cudaMemcpy(d_x, x0.data(), x0.size() * 2, cudaMemcpyHostToDevice));
    OK(ops::dsa_layer_run(plan, w, caches, prefill, d_x, d_out, ws, plan.workspace_bytes, stream));
    step5::reference::forward(lw, ref_cache, sb, x0.data(), topk);

    // ---- 3b. one decode step: capture once, replay ----------------------------------------------
    ops::DsaLayerStep decode;
    if (!set_step({1, 1}, {prompt[0] + 1, prompt[1] + 1}, &decode))
      throw step5::Error(step5::StatusCode::kCudaError, "metadata upload");
    const std::vector<bf16> x1 = random_x(B);
    CK(cudaMemcpy(d_x, x1.data(), x1.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaStreamSynchronize(stream));
    // Snapshot the caches: the decode step writes them; eager and replay start from the same state.
    const std::size_t kv_bytes = ref_cache.k_cache.size() * 2, sum_bytes = ref_cache.summary_cache.size(),
                      tail_bytes = ref_cache.tail.size() * 2;
    void *k0, *v0, *s0, *t0;
    CK(cudaMalloc(&k0, kv_bytes));
    owned.push_back(k0);
    CK(cudaMalloc(&v0, kv_bytes));
    owned.push_back(v0);
    CK(cudaMalloc(&s0, sum_bytes));
    owned.push_back(s0);
    CK(cudaMalloc(&t0, tail_bytes));
    owned.push_back(t0);
    auto copy_caches = [&](bool save) -> cudaError_t {  // save: live -> snapshot; else restore
      const struct {
        void* snapshot;
        void* live;
        std::size_t bytes;
      } bufs[] = {{k0, caches.k_cache, kv_bytes},
                  {v0, caches.v_cache, kv_bytes},
                  {s0, caches.summary_cache, sum_bytes},
                  {t0, caches.tail, tail_bytes}};
      for (const auto& b : bufs) {
        const cudaError_t e = save ? cudaMemcpy(b.snapshot, b.live, b.bytes, cudaMemcpyDeviceToDevice)
                                   : cudaMemcpy(b.live, b.snapshot, b.bytes, cudaMemcpyDeviceToDevice);
        if (e != cudaSuccess) return e;
      }
      return cudaSuccess;
    };
    CK(copy_caches(true));
    const std::size_t out_n = static_cast<std::size_t>(B) * hidden;
    // eager decode
    CK(cudaMemset(d_out, 0xff, out_n * 2));  // poison (bf16 NaN)
    OK(ops::dsa_layer_run(plan, w, caches, decode, d_x, d_out, ws, plan.workspace_bytes, stream));
    CK(cudaStreamSynchronize(stream));
    std::vector<bf16> eager(out_n), replay(out_n);
    CK(cudaMemcpy(eager.data(), d_out, out_n * 2, cudaMemcpyDeviceToHost));
    // capture the same step (run does not allocate, synchronise or re-plan), then replay it
    CK(copy_caches(false));
    CK(cudaMemset(d_out, 0xff, out_n * 2));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const step5::Status captured = ops::dsa_layer_run(plan, w, caches, decode, d_x, d_out, ws, plan.workspace_bytes, stream);
    CK(cudaStreamEndCapture(stream, &graph));
    OK(captured);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(replay.data(), d_out, out_n * 2, cudaMemcpyDeviceToHost));
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(stream);

    // ---- 4. checks ------------------------------------------------------------------------------
    const std::vector<bf16> ref = step5::reference::forward(lw, ref_cache, sb, x1.data(), topk);
    const bool same = std::memcmp(eager.data(), replay.data(), out_n * 2) == 0;
    double max_ref = 0, max_err = 0, sum_err = 0;
    bool finite = true;
    for (std::size_t i = 0; i < out_n; ++i) {
      const double g = step5::to_float(replay[i]), c = step5::to_float(ref[i]);
      finite = finite && std::isfinite(g);
      max_ref = std::max(max_ref, std::fabs(c));
      max_err = std::max(max_err, std::fabs(g - c));
      sum_err += std::fabs(g - c);
    }
    // bf16 output of a length-(Hl*D) dot product: allow a few bf16 ulps of the largest value
    // (the GPU's fp32 accumulation order differs from the reference's).
    const bool close = finite && max_ref > 0 && max_err <= 0.03 * max_ref && sum_err / out_n <= 0.005 * max_ref;
    std::printf("engine_minimal: %s tp %d rank %d hidden %d, workspace %zu bytes; decode step: graph replay %s "
                "eager launches; vs CPU reference: max |err| %.4g (max |ref| %.4g, mean |err| %.3g)\n",
                cfg.geometry.head_dim == D ? opt.geometry.c_str() : "?", tp, tp_rank, hidden, plan.workspace_bytes,
                same ? "==" : "!=", max_err, max_ref, sum_err / out_n);
    (void)P;
    rc = same && close ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    rc = 1;
  }
  for (void* p : owned) cudaFree(p);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("%s\n", rc == 0 ? "PASS" : "FAIL");
  return rc;
}
