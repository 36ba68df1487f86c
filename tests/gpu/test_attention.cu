// GPU test of the sparse GQA attention + gate (SPEC.md §4 steps 7–8): ops::sparse_attention
// against reference::sparse_attention + reference::apply_gate, every geometry × tp of the list.
// Inputs are random (bf16 q/k/v/gate, shuffled non-contiguous block tables, random valid
// selections built on the host, slots after count poisoned with out-of-range ids, cache rows past
// seq_len poisoned with NaN). Outputs are poisoned before the launch and every element is checked:
// rel error of out <= 1e-2 over all elements and in every (token, head) row (‖row − ref‖ / ‖ref‖,
// the worst row is reported), of the finite LSE values <= 1e-3, −inf exactly where the reference
// has it, padding columns and guard elements unchanged. Batches of 33, 257 and 1024 decode
// requests (mixed lengths, some without rows) cross the kernel's loop over requests in chunks of
// one warp (32) and the 256-thread tiles.
// The fused split merge (the last split CTA of a (tile, KV group) merges, elected by an arrival
// counter in the workspace): every forced num_splits 1..kAttentionMaxSplits for every hpg_q on
// decode batches of 1, 33 and 257 requests with mixed counts; the workspace's partial space is
// poisoned (NaN bytes) and only its counters zeroed once; the counters must be 0 after every
// launch; 50 launches with competing work and two CUDA-graph replays must equal the first launch
// bit for bit, while a second host thread launches another plan of the same kernel instance (its
// dynamic shared memory size differs) in a loop: no launch of either thread may fail. Every ring
// depth (pipeline_stages 2, 3, 4) on decode, MTP and prefill.
// The two selection paths of the kernel: tiles of one query (decode, and prefill at query tile 1
// or a request's last single query) take the region-list path, tiles of several queries (MTP,
// prefill) the region-bitmap path; the forced-split sweeps run both (decode batches and an MTP
// batch). Invalid selections (ids < 0, past the current region or huge inside count; counts 0,
// negative or > topk + 1; rows of only invalid ids) are compared with the reference on the cleaned
// rows, on both paths, with bit-identical repeats.
// Split merges: the cluster merge (num_splits <= kAttentionMaxClusterSplits, the default) and the
// last-arriver merge (split_merge = 1) give the same bits on every forced split factor.
// Quick (sanitizer) mode, step5_test::quick(): tp 1, 8 and 16 of each geometry (every head_dim ×
// hpg_q kernel instance), contexts of at most 300 tokens and topk <= 16; every case, split count,
// query tile, MTP, prefill, gate / no-gate and short-count scenario is kept; the decode batches
// run at 33 and 257 requests (1024 only in full mode, at tp >= 8 there) with contexts <= 600.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_test.hpp"
#include "step5/layout/static_layout.hpp"
#include "step5/ops/attention.hpp"
#include "step5/reference/attention.hpp"

using step5::bf16;
namespace ref = step5::reference;

namespace {
constexpr int kR = step5::layout::kRegionSize;  // R, tokens per region (SPEC §1)

constexpr std::uint16_t kPoison = 0x7fc1;  // a bf16 NaN

/// Launches compared, bit for bit, between the one-query instance and the general one
/// (run_scenario); the decode case checks that it compared some.
int g_instance_checks = 0;

/// The current device's SM count (the planner's num_sms), through the library's one cached query.
int current_sm_count() {
  int dev = 0, sms = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  EXPECT(step5::device_sm_count(dev, &sms).ok(), "device_sm_count(%d)", dev);
  return sms;
}

using step5_test::DevBuf;

/// A sparse-attention workspace as a launch expects it: the split partials poisoned (NaN bytes: a
/// merge of an unwritten partial shows), the split-KV arrival counters zeroed.
void poison_workspace(void* ws, std::size_t bytes) {
  GPU_CHECK(cudaMemset(ws, 0xff, bytes));
  if (bytes > 0) GPU_CHECK(cudaMemset(ws, 0, step5::ops::kAttentionCounterBytes));
}

struct Scenario {
  std::string name;
  std::vector<int> q_lens;   // per request (0 allowed)
  std::vector<int> seq_lens; // per request (KV length after the step)
  int block_size = 16;
  int topk = 32;
  bool gate = true;
  int num_splits = 0;   // 0 = auto
  int query_tile = 0;   // 0 = auto
  int pipeline_stages = 0;  // K/V ring depth, 0 = auto
  bool short_counts = false;  // some rows with count 1 / 0 / a random smaller count
  bool overlap = true;        // neighbouring queries mostly share their selection
  /// Selection rows the kernel must partly ignore (SPEC §4 step 7 / ops::sparse_attention): ids
  /// inside count that are negative, past the query's current region or huge; counts of 0,
  /// negative or > topk + 1 (clamped); rows of only invalid ids. The reference gets each row
  /// cleaned (its valid ids in row order, count clamped to [0, topk + 1]).
  bool invalid_ids = false;
  /// One history block of every request long enough gets a block-table entry outside
  /// [0, num_blocks) (after the caches are filled): the kernel must neither read it nor let its
  /// regions into the softmax (ops::sparse_attention: never read, masked). The reference gets
  /// the rows without those regions.
  bool bad_block = false;
  int pad = 0;                // extra columns in out / gate rows
  /// Forced split factors, each launched on a fresh workspace and checked against the same
  /// reference (empty: the one launch with num_splits).
  std::vector<int> split_list;
  /// Also 50 launches (5 in quick mode) with competing work on another stream and two CUDA-graph
  /// replays, each bit-identical to the first launch, on the same workspace (counters reset).
  bool repeat = false;
  /// Every launch with num_splits > 1 also with split_merge = 1 (the last-arriver merge through the
  /// workspace) next to the default (the cluster merge where num_splits <= 16): bit-identical.
  bool merge_ab = false;
  /// With one split (the plan's): also launches with tile_gather 1 (every multi-query tile on the
  /// union of its selections) and 2 (query by query), each checked against the reference, and
  /// checks that the default (tile_gather 0) equals, bit for bit, on each (query tile, KV group),
  /// the forced launch of the path that ops::attention_per_query_pays picks for that tile from
  /// its selections (computed here on the host); prints how many tiles took each path.
  bool gather_ab = false;
  /// With gather_ab, at full sizes: the rule must send at least one multi-query tile to the union
  /// (bit 1) / to per-query gathers (bit 2), so that the scenario exercises what it names (the
  /// full run at 891af0f: every (geometry, tp) did, e.g. tp 16 random 8 union / 3 per query).
  int gather_expect = 0;
  /// Block-table width in positions (max_blocks * block_size) of at least this many (0: one block
  /// past the longest request): the extra entries are -1 and never addressed. A decode step's
  /// plan must not grow with the width (ops::sparse_attention_plan: tiles of one query, no region
  /// bitmaps); the case checks the plan and the results.
  long long table_positions = 0;
};

/// The split-KV arrival counters (the first kAttentionCounterBytes of the workspace) are zero
/// after a launch: the last split CTA of every (tile, group) reset its counter.
void check_counters_zero(const std::string& lab, const void* ws, std::size_t ws_bytes) {
  if (ws_bytes == 0) return;
  const std::size_t n = step5::ops::kAttentionCounterBytes / 4;
  const std::vector<std::uint32_t> c = step5_test::download(static_cast<const std::uint32_t*>(ws), n);
  const auto nonzero = std::count_if(c.begin(), c.end(), [](std::uint32_t v) { return v != 0u; });
  EXPECT(nonzero == 0, "%s: %lld split-KV counters not reset to 0", lab.c_str(), static_cast<long long>(nonzero));
}

/// Launches `p` `repeats` times on the same workspace while noise_kernel (a different grid each
/// time) streams memory on another stream; outputs poisoned before each launch; every result
/// must equal the first launch's (`out0`, `lse0`) bit for bit.
/// Meanwhile a second host thread launches, in a loop on its own stream, buffers and workspace,
/// another plan of the same kernel instance (the same ring depth, query tile and wgmma path, with
/// a selection row of another width: another dynamic shared memory size): no launch of either
/// thread may fail (a per-plan cudaFuncAttributeMaxDynamicSharedMemorySize let one thread lower
/// the limit between the other's set and launch).
template <class Tag>
void repeat_launches(const std::string& lab, const step5::ops::SparseAttentionParams& p, void* ws,
                     std::size_t ws_bytes, DevBuf<bf16>& d_out, DevBuf<float>& d_lse,
                     const std::vector<bf16>& out_poison, const std::vector<float>& lse_poison,
                     const std::vector<bf16>& out0, const std::vector<float>& lse0) {
  const std::size_t noise_n = std::size_t{1} << 24;
  DevBuf<float> noise(noise_n);
  GPU_CHECK(cudaMemset(noise.p, 0, noise_n * 4));
  cudaStream_t s_attn, s_noise;
  GPU_CHECK(cudaStreamCreateWithFlags(&s_attn, cudaStreamNonBlocking));
  GPU_CHECK(cudaStreamCreateWithFlags(&s_noise, cudaStreamNonBlocking));
  // the competing plan: the plan's ring depth, query tile and wgmma path (so the same kernel
  // instance: plans of query tile 1 have their own, ops::sparse_attention_plan) and a topk whose
  // region list (2 x 4 x (topk + 1) bytes) sets another shared-memory size; it reads its own
  // selection rows, all empty (count 0: nothing gathered; its output is not checked)
  int dev = 0;  // the competitor's thread launches on this device
  GPU_CHECK(cudaGetDevice(&dev));
  const int sms = current_sm_count();
  step5::ops::SparseAttentionPlan plan{}, plan2{};
  EXPECT(step5::ops::sparse_attention_plan(p, sms, &plan).ok(), "%s: plan", lab.c_str());
  step5::ops::SparseAttentionParams p2 = p;
  p2.pipeline_stages = plan.stages;
  p2.query_tile = plan.query_tile;
  bool compete = false;
  const auto try_plan = [&] {
    compete = step5::ops::sparse_attention_plan(p2, sms, &plan2).ok() && plan2.stages == plan.stages &&
              (plan2.query_tile == 1) == (plan.query_tile == 1) && plan2.wgmma_tiles == plan.wgmma_tiles &&
              plan2.smem_bytes != plan.smem_bytes;
    return compete;
  };
  // a region list longer than the region bitmaps sets the size; else (bitmaps of a wide table in
  // a multi-query plan) another query tile of the same instance does
  for (const int topk2 : {400, 1000, 150})
    if (p2.topk = topk2; try_plan()) break;
  for (int qt = 2; !compete && plan.query_tile > 1 && qt <= step5::ops::kAttentionTileRows / plan.hpg_q; ++qt)
    if (qt != plan.query_tile) p2.query_tile = qt, p2.topk = p.topk, try_plan();
  EXPECT(compete, "%s: no competing plan of the same instance and another shared memory size (query tile %d, "
         "topk %d, %zu bytes)", lab.c_str(), plan.query_tile, p.topk, plan.smem_bytes);
  const std::size_t rows2 = static_cast<std::size_t>(std::max(p.num_tokens, 1)) * p.num_kv_groups;
  DevBuf<int> ids2(std::vector<int>(rows2 * (p2.topk + 1), -1));
  DevBuf<int> counts2(std::vector<int>(rows2, 0));
  p2.topk_ids = ids2.p;
  p2.counts = counts2.p;
  DevBuf<bf16> out2(out_poison);
  DevBuf<float> lse2(lse_poison);
  // its own workspace, of its own size (its own tiles and split partials)
  std::size_t ws2_bytes = 0;
  if (compete)
    EXPECT(step5::ops::sparse_attention_workspace_size(p2, &ws2_bytes).ok(), "%s: workspace size", lab.c_str());
  DevBuf<unsigned char> ws2(std::max<std::size_t>(ws2_bytes, 1));
  GPU_CHECK(cudaMemset(ws2.p, 0, ws2.n));
  p2.out = out2.p;
  p2.lse = p.lse ? lse2.p : nullptr;
  std::atomic<bool> stop{false};
  std::atomic<int> failed2{0}, launches2{0};
  std::string first_error2;  // written by the competitor before its first failure is counted
  std::thread competitor;
  if (compete)
    competitor = std::thread([&] {
      cudaStream_t s2;
      if (cudaSetDevice(dev) != cudaSuccess || cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) != cudaSuccess) {
        failed2 = -1;
        return;
      }
      while (!stop.load()) {
        const step5::Status st =
            step5::ops::sparse_attention<Tag::kId>(p2, ws2_bytes ? ws2.p : nullptr, ws2_bytes, s2);
        const cudaError_t sync = cudaStreamSynchronize(s2);
        if ((!st.ok() || sync != cudaSuccess) && failed2.load() == 0)
          first_error2 = st.ok() ? std::string(cudaGetErrorString(sync)) : st.to_string();
        failed2 += !st.ok() || sync != cudaSuccess;
        ++launches2;
      }
      cudaStreamDestroy(s2);
    });
  const int repeats = step5_test::quick() ? 5 : 50;
  int changed = 0, failed = 0;
  for (int it = 0; it < repeats; ++it) {
    d_out.up(out_poison);
    d_lse.up(lse_poison);
    GPU_CHECK(cudaStreamSynchronize(s_attn));
    GPU_CHECK(cudaStreamSynchronize(s_noise));
    step5_test::noise_kernel<<<33 + 17 * (it % 13), 256, 0, s_noise>>>(noise.p, noise_n, 1);
    GPU_CHECK(cudaGetLastError());
    failed += !step5::ops::sparse_attention<Tag::kId>(p, ws, ws_bytes, s_attn).ok();
    GPU_CHECK(cudaStreamSynchronize(s_attn));
    GPU_CHECK(cudaStreamSynchronize(s_noise));
    changed += !(step5_test::same_bits(d_out.down(), out0) && step5_test::same_bits(d_lse.down(), lse0));
  }
  stop = true;
  if (competitor.joinable()) competitor.join();
  EXPECT(failed == 0 && changed == 0, "%s: %d of %d repeated launches failed, %d differ from the first", lab.c_str(),
         failed, repeats, changed);
  EXPECT(failed2.load() == 0, "%s: %d of %d launches of the competing plan (query tile %d, %zu bytes of shared "
         "memory against %zu) on another host thread failed, the first: %s", lab.c_str(), failed2.load(),
         launches2.load(), plan2.query_tile, plan2.smem_bytes, plan.smem_bytes, first_error2.c_str());
  if (compete)
    std::printf("  %-58s %d launches of a competing plan (query tile %d, %zu B of smem against %zu) on another "
                "host thread\n", lab.c_str(), launches2.load(), plan2.query_tile, plan2.smem_bytes, plan.smem_bytes);
  check_counters_zero(lab + " (after repeats)", ws, ws_bytes);
  GPU_CHECK(cudaStreamDestroy(s_attn));
  GPU_CHECK(cudaStreamDestroy(s_noise));
}

/// Captures `p` into a CUDA graph and replays it twice on the same workspace (outputs poisoned
/// before each replay): both replays must equal the eager launch bit for bit, which needs the
/// counters reset by the previous launch / replay.
template <class Tag>
void graph_replays(const std::string& lab, const step5::ops::SparseAttentionParams& p, void* ws,
                   std::size_t ws_bytes, DevBuf<bf16>& d_out, DevBuf<float>& d_lse,
                   const std::vector<bf16>& out_poison, const std::vector<float>& lse_poison,
                   const std::vector<bf16>& out0, const std::vector<float>& lse0) {
  cudaStream_t stream;
  GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t cg = nullptr;
  GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const step5::Status captured = step5::ops::sparse_attention<Tag::kId>(p, ws, ws_bytes, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &cg);
  EXPECT(captured.ok() && end == cudaSuccess, "%s: capture: %s / %s", lab.c_str(), captured.to_string().c_str(),
         cudaGetErrorString(end));
  if (captured.ok() && end == cudaSuccess) {
    cudaGraphExec_t exec = nullptr;
    GPU_CHECK(cudaGraphInstantiate(&exec, cg, 0));
    for (int replay = 0; replay < 2; ++replay) {
      d_out.up(out_poison);
      d_lse.up(lse_poison);
      GPU_CHECK(cudaDeviceSynchronize());  // the pageable uploads are done before the replay
      GPU_CHECK(cudaGraphLaunch(exec, stream));
      GPU_CHECK(cudaStreamSynchronize(stream));
      EXPECT(step5_test::same_bits(d_out.down(), out0) && step5_test::same_bits(d_lse.down(), lse0),
             "%s: graph replay %d differs from the eager launch", lab.c_str(), replay);
      check_counters_zero(lab + " (graph replay " + std::to_string(replay) + ")", ws, ws_bytes);
    }
    GPU_CHECK(cudaGraphExecDestroy(exec));
  }
  if (cg != nullptr) GPU_CHECK(cudaGraphDestroy(cg));
  GPU_CHECK(cudaStreamDestroy(stream));
}

template <class Tag>
void run_scenario(const Scenario& sc, std::uint32_t seed) {
  using L = typename Tag::Layout;
  constexpr int D = Tag::kGeometry.head_dim;
  constexpr int Hl = L::kLocalHeads, lg = L::kLocalKvGroups, hpg = L::kHpgQ;
  const std::string label = std::string(Tag::kEntry.name) + " tp " + std::to_string(Tag::kParallel.tp_size) + " / " + sc.name;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int B = static_cast<int>(sc.q_lens.size());
  std::vector<std::int32_t> cu(B + 1, 0);
  for (int b = 0; b < B; ++b) cu[b + 1] = cu[b] + sc.q_lens[b];
  const int T = cu[B];
  const int bs = sc.block_size;
  // shuffled physical blocks
  int max_blocks = 1, total_blocks = 0;
  for (int b = 0; b < B; ++b) {
    const int nb = (sc.seq_lens[b] + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb + 1);
    total_blocks += nb;
  }
  max_blocks = static_cast<int>(std::max<long long>(max_blocks, (sc.table_positions + bs - 1) / bs));
  const int num_blocks = total_blocks + 3;
  std::vector<int> phys(num_blocks);
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng);
  std::vector<std::int32_t> table(static_cast<std::size_t>(B) * max_blocks, -1);
  std::vector<char> used(num_blocks, 0);
  int next = 0;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < (sc.seq_lens[b] + bs - 1) / bs; ++j) {
      table[static_cast<std::size_t>(b) * max_blocks + j] = phys[next];
      used[phys[next++]] = 1;
    }
  // caches: random where a token exists, NaN elsewhere (never read)
  const std::size_t cache_n = static_cast<std::size_t>(num_blocks) * bs * lg * D;
  std::vector<bf16> kc(cache_n, bf16{kPoison}), vc(cache_n, bf16{kPoison});
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < sc.seq_lens[b]; ++p) {
      const int blk = table[static_cast<std::size_t>(b) * max_blocks + p / bs];
      for (int g = 0; g < lg; ++g)
        for (int d = 0; d < D; ++d) {
          const std::size_t o = ((static_cast<std::size_t>(blk) * bs + p % bs) * lg + g) * D + d;
          kc[o] = step5::to_bf16(uni(rng));
          vc[o] = step5::to_bf16(uni(rng));
        }
    }
  // bad_block: the table slot whose regions all lie before the request's first query's current
  // region gets an id outside [0, num_blocks) (alternately num_blocks + 5 and -3)
  std::vector<int> bad_slot(B, -1);
  if (sc.bad_block)
    for (int b = 0; b < B; ++b) {
      const int first_pos = sc.seq_lens[b] - sc.q_lens[b];
      const int slot = (first_pos / kR * kR) / bs - 1;  // the last block wholly before that region
      if (slot < 0) continue;
      bad_slot[b] = slot;
      table[static_cast<std::size_t>(b) * max_blocks + slot] = b % 2 == 0 ? num_blocks + 5 : -3;
    }
  std::vector<bf16> q(static_cast<std::size_t>(T) * Hl * D);
  for (auto& x : q) x = step5::to_bf16(uni(rng) * 2.f);
  const int ldg = Hl + sc.pad + 3;
  std::vector<bf16> gate(static_cast<std::size_t>(std::max(T, 1)) * ldg, bf16{kPoison});
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hl; ++h) gate[static_cast<std::size_t>(t) * ldg + 3 + h] = step5::to_bf16(uni(rng) * 4.f);
  // selections
  const int W = sc.topk + 1;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(lg) * T * W), counts(static_cast<std::size_t>(lg) * T);
  const std::vector<std::int32_t> pos = ref::token_positions(ref::BatchView{B, cu.data(), sc.seq_lens.data()});
  for (int g = 0; g < lg; ++g)
    for (int b = 0; b < B; ++b) {
      std::vector<float> prio((sc.seq_lens[b] + kR - 1) / kR + 1);
      for (auto& x : prio) x = uni(rng);
      for (int t = cu[b]; t < cu[b + 1]; ++t) {
        const int p = pos[t], cur = p / kR, row = g * T + t;
        std::vector<int> cand(cur);
        std::iota(cand.begin(), cand.end(), 0);
        std::vector<float> pr(cur);
        for (int r = 0; r < cur; ++r) pr[r] = sc.overlap && (rng() % 8 != 0) ? prio[r] : uni(rng);
        int n_hist = std::min(sc.topk, cur);
        int count = n_hist + 1;
        if (sc.short_counts) {
          const int k = static_cast<int>(rng() % 5);
          if (k == 0) { n_hist = 0; count = 1; }
          else if (k == 1) { n_hist = 0; count = 0; }
          else if (k == 2 && n_hist > 1) { n_hist = 1 + static_cast<int>(rng() % n_hist); count = n_hist + 1; }
        }
        std::partial_sort(cand.begin(), cand.begin() + n_hist, cand.end(),
                          [&](int x, int y) { return pr[x] > pr[y] || (pr[x] == pr[y] && x < y); });
        std::sort(cand.begin(), cand.begin() + n_hist);
        std::int32_t* out = &ids[static_cast<std::size_t>(row) * W];
        for (int i = 0; i < W; ++i) {  // poison: out-of-range ids after count
          const int k = (i + t) % 3;
          out[i] = k == 0 ? -7 : (k == 1 ? (1 << 30) : cur + 1 + i);
        }
        for (int i = 0; i < n_hist; ++i) out[i] = cand[i];
        if (bad_slot[b] >= 0 && n_hist > 0) {  // every row selects the first region of the bad block
          const int bad = bad_slot[b] * bs / kR;
          if (std::find(out, out + n_hist, bad) == out + n_hist) out[0] = bad;
          std::sort(out, out + n_hist);
        }
        if (count > 0) out[count - 1] = cur;
        counts[row] = count;
        if (sc.invalid_ids) {
          auto bad_id = [&]() -> std::int32_t {
            switch (rng() % 5) {
              case 0: return -1;
              case 1: return -2 - static_cast<int>(rng() % 1000);
              case 2: return cur + 1;  // the next region (not yet attended)
              case 3: return cur + 2 + static_cast<int>(rng() % 64);
              default: return (1 << 30) + static_cast<int>(rng() % 1000);
            }
          };
          const int k = static_cast<int>(rng() % 6);
          if (k == 0 || k == 4) {  // invalid ids among the valid ones (k == 4: only invalid ones)
            std::vector<std::int32_t> l;
            for (int i = 0; i < count; ++i) {
              if (k == 4 || rng() % 3 == 0) l.push_back(bad_id());
              if (k != 4) l.push_back(out[i]);
            }
            if (k == 4 && l.empty()) l.push_back(bad_id());
            if (static_cast<int>(l.size()) > W) l.resize(W);
            std::copy(l.begin(), l.end(), out);
            counts[row] = static_cast<int>(l.size());
          } else if (k == 1) {
            counts[row] = W + 1 + static_cast<int>(rng() % 100);  // > topk + 1: the whole row (poison included)
          } else if (k == 2) {
            counts[row] = -1 - static_cast<int>(rng() % 5);
          } else if (k == 3) {
            counts[row] = 0;
          }
        }
      }
    }
  // the reference's rows: the valid ids of the first clamp(count, 0, topk + 1) entries, in order
  std::vector<std::int32_t> ids_ref = ids, counts_ref = counts;
  long long bad_selected = 0;  // valid selection entries inside a bad block: the kernel must report one
  if (sc.invalid_ids || sc.bad_block)
    for (int g = 0; g < lg; ++g)
      for (int t = 0; t < T; ++t) {
        const int row = g * T + t, cur = pos[t] / kR;
        const int b = static_cast<int>(std::upper_bound(cu.begin(), cu.end(), t) - cu.begin()) - 1;
        const int n = std::clamp(counts[row], 0, W);
        const std::int32_t* in = &ids[static_cast<std::size_t>(row) * W];
        std::int32_t* o = &ids_ref[static_cast<std::size_t>(row) * W];
        int c = 0;
        for (int i = 0; i < n; ++i) {
          if (in[i] < 0 || in[i] > cur) continue;
          if (bad_slot[b] >= 0 && in[i] * kR / bs == bad_slot[b]) ++bad_selected;
          else o[c++] = in[i];
        }
        for (int i = c; i < W; ++i) o[i] = -1;
        counts_ref[row] = c;
      }
  // reference
  ref::BatchView batch{B, cu.data(), sc.seq_lens.data()};
  ref::BlockTableView btv{table.data(), max_blocks, bs, num_blocks};
  std::vector<bf16> attn_ref(static_cast<std::size_t>(T) * Hl * D), out_ref(attn_ref.size());
  std::vector<float> lse_ref(static_cast<std::size_t>(T) * Hl);
  if (T > 0) {
    ref::sparse_attention(batch, btv, lg, hpg, D, sc.topk, q.data(), kc.data(), vc.data(), ids_ref.data(),
                          counts_ref.data(), attn_ref.data(), lse_ref.data());
    if (sc.gate) ref::apply_gate(T, Hl, D, attn_ref.data(), gate.data() + 3, ldg, out_ref.data());
    else out_ref = attn_ref;
  }
  const long long ldo = static_cast<long long>(Hl) * D + 4 * sc.pad;
  const std::size_t out_n = static_cast<std::size_t>(std::max(T, 1)) * ldo + 64;  // + guard
  // compare: every element, the aggregate error and the worst (token, head) row's error
  auto check_output = [&](const std::string& lab, const std::vector<bf16>& out, const std::vector<float>& lse) {
    std::vector<float> o_got, o_ref, l_got, l_ref;
    int nan_count = 0, pad_changed = 0, inf_mismatch = 0;
    double row_max = 0.0;
    int worst_t = -1, worst_h = -1;
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < Hl; ++h) {
        double num = 0.0, den = 0.0;
        for (int d = 0; d < D; ++d) {
          const std::size_t j = static_cast<std::size_t>(h) * D + d;
          const double a = step5::to_float(out[static_cast<std::size_t>(t) * ldo + j]);
          const double r = step5::to_float(out_ref[static_cast<std::size_t>(t) * Hl * D + j]);
          num += (a - r) * (a - r);
          den += r * r;
        }
        // relative to the row's norm; a row the reference leaves at zero (count 0) must be zero
        const double e = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
        if (!(e <= row_max)) {  // NaN counts as worst
          row_max = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
          worst_t = t;
          worst_h = h;
        }
      }
      for (int j = 0; j < ldo; ++j) {
        const bf16 v = out[static_cast<std::size_t>(t) * ldo + j];
        if (j >= Hl * D) {
          pad_changed += v.bits != kPoison;
          continue;
        }
        const float f = step5::to_float(v);
        if (std::isnan(f)) ++nan_count;
        o_got.push_back(f);
        o_ref.push_back(step5::to_float(out_ref[static_cast<std::size_t>(t) * Hl * D + j]));
      }
      for (int h = 0; h < Hl; ++h) {
        const float a = lse[static_cast<std::size_t>(t) * Hl + h], r = lse_ref[static_cast<std::size_t>(t) * Hl + h];
        if (std::isinf(r) || std::isinf(a) || std::isnan(a)) {
          inf_mismatch += !(std::isinf(r) && std::isinf(a) && r < 0 && a < 0);
        } else {
          l_got.push_back(a);
          l_ref.push_back(r);
        }
      }
    }
    int guard_changed = 0;
    for (std::size_t i = static_cast<std::size_t>(T) * ldo; i < out_n; ++i) guard_changed += out[i].bits != kPoison;
    for (std::size_t i = static_cast<std::size_t>(T) * Hl; i < lse.size(); ++i) guard_changed += !std::isnan(lse[i]);
    const double e_o = T > 0 ? step5_test::rel_error(o_got, o_ref) : 0.0;
    const double e_l = l_ref.empty() ? 0.0 : step5_test::rel_error(l_got, l_ref);
    EXPECT(nan_count == 0, "%s: %d NaN outputs", lab.c_str(), nan_count);
    EXPECT(e_o <= 1e-2, "%s: out rel error %.3g", lab.c_str(), e_o);
    EXPECT(row_max <= 1e-2, "%s: worst (token, head) row: token %d head %d, rel error %.3g", lab.c_str(), worst_t,
           worst_h, row_max);
    EXPECT(e_l <= 1e-3, "%s: lse rel error %.3g", lab.c_str(), e_l);
    EXPECT(inf_mismatch == 0, "%s: %d LSE values disagree on -inf / NaN", lab.c_str(), inf_mismatch);
    EXPECT(pad_changed == 0 && guard_changed == 0, "%s: %d padding / %d guard elements written", lab.c_str(),
           pad_changed, guard_changed);
    std::printf("  %-58s T=%4d out err %.2e (worst row %.2e: t %d h %d) lse err %.2e\n", lab.c_str(), T, e_o,
                row_max, worst_t, worst_h, e_l);
  };
  // device
  const std::vector<bf16> out_poison(out_n, bf16{kPoison});
  const std::vector<float> lse_poison(static_cast<std::size_t>(std::max(T, 1)) * Hl + 16, std::nanf(""));
  DevBuf<bf16> d_q(q), d_k(kc), d_v(vc), d_gate(gate), d_out(out_poison);
  DevBuf<std::int32_t> d_table(table), d_cu(cu), d_seq(sc.seq_lens), d_ids(ids), d_counts(counts);
  DevBuf<float> d_lse(lse_poison);
  // sc.gather_ab (see Scenario): the forced paths against the reference, the default against the
  // per-tile rule. Tiles as the kernel's locate_tile: plan.query_tile consecutive queries of one
  // request from its first; a region counts once per query when valid (0 <= id <= the query's
  // current region, below the bitmap) in the first clamp(count, 0, topk + 1) entries.
  const auto gather_ab_check = [&](const std::string& lab, step5::ops::SparseAttentionParams pg, void* ws,
                                   std::size_t ws_bytes, const std::vector<bf16>& out0, const std::vector<float>& lse0) {
    const int sms = current_sm_count();
    step5::ops::SparseAttentionPlan plan;
    const step5::Status pst = step5::ops::sparse_attention_plan(pg, sms, &plan);
    EXPECT(pst.ok(), "%s: plan: %s", lab.c_str(), pst.to_string().c_str());
    EXPECT(pst.ok() && plan.num_splits == 1, "%s: gather_ab needs a plan of one split (got %d)", lab.c_str(),
           plan.num_splits);
    if (!pst.ok() || plan.num_splits != 1) return;
    std::vector<bf16> outs[3];
    std::vector<float> lses[3];
    for (const int mode : {1, 2}) {
      pg.tile_gather = mode;
      d_out.up(out_poison);
      d_lse.up(lse_poison);
      const step5::Status st = step5::ops::sparse_attention<Tag::kId>(pg, ws, ws_bytes, nullptr);
      EXPECT(st.ok(), "%s: launch with tile_gather %d: %s", lab.c_str(), mode, st.to_string().c_str());
      GPU_CHECK(cudaDeviceSynchronize());
      outs[mode] = d_out.down();
      lses[mode] = d_lse.down();
      check_output(lab + ", tile_gather " + std::to_string(mode), outs[mode], lses[mode]);
    }
    const int max_region = plan.bitmap_words * 32;
    long long tiles_of[3] = {0, 0, 0}, rows_differ = 0, forced_differ = 0;
    for (int b = 0; b < B; ++b)
      for (int t0 = cu[b]; t0 < cu[b + 1]; t0 += plan.query_tile) {
        const int nq = std::min(plan.query_tile, cu[b + 1] - t0);
        for (int g = 0; g < lg; ++g) {
          std::vector<char> in_union(static_cast<std::size_t>(max_region), 0);
          long long union_regions = 0, query_stages = 0;
          for (int i = 0; i < nq; ++i) {
            const int t = t0 + i, row = g * T + t, cur = pos[t] / kR;
            std::vector<char> mine(static_cast<std::size_t>(max_region), 0);
            long long n = 0;
            for (int e = 0; e < std::clamp(counts[row], 0, W); ++e) {
              const int id = ids[static_cast<std::size_t>(row) * W + e];
              if (id < 0 || id > cur || id >= max_region || mine[id]) continue;
              mine[id] = 1;
              ++n;
              if (!in_union[id]) ++union_regions;
              in_union[id] = 1;
            }
            query_stages += (n + 7) / 8;
          }
          const bool per_query = step5::ops::attention_per_query_pays((union_regions + 7) / 8, query_stages, nq);
          const int mode = per_query ? 2 : 1;
          ++tiles_of[nq > 1 ? mode : 0];
          for (int t = t0; t < t0 + nq; ++t)
            for (int h = g * hpg; h < (g + 1) * hpg; ++h) {
              const std::size_t o = static_cast<std::size_t>(t) * ldo + static_cast<std::size_t>(h) * D;
              const std::size_t l = static_cast<std::size_t>(t) * Hl + h;
              const bool same = std::memcmp(&out0[o], &outs[mode][o], D * sizeof(bf16)) == 0 &&
                                std::memcmp(&lse0[l], &lses[mode][l], sizeof(float)) == 0;
              rows_differ += same ? 0 : 1;
              // the two forced paths sum in different orders: some rows of multi-query tiles differ
              // in their bits, which shows that tile_gather reached the kernel
              if (nq > 1 && (std::memcmp(&outs[1][o], &outs[2][o], D * sizeof(bf16)) != 0 ||
                             std::memcmp(&lses[1][l], &lses[2][l], sizeof(float)) != 0))
                ++forced_differ;
            }
        }
      }
    EXPECT(rows_differ == 0,
           "%s: %lld (token, head) rows of the default launch differ from the forced path the per-tile rule picks",
           lab.c_str(), rows_differ);
    EXPECT(tiles_of[1] + tiles_of[2] == 0 || forced_differ > 0,
           "%s: tile_gather 1 and 2 gave the same bits on every row of %lld multi-query tiles (is it ignored?)",
           lab.c_str(), tiles_of[1] + tiles_of[2]);
    // (full sizes only: quick mode's short histories and small topk can leave a scenario on one path)
    const int expect = step5_test::quick() ? 0 : sc.gather_expect;
    EXPECT(!(expect & 1) || tiles_of[1] > 0, "%s: no multi-query tile took the union", lab.c_str());
    EXPECT(!(expect & 2) || tiles_of[2] > 0, "%s: no multi-query tile took per-query gathers", lab.c_str());
    std::printf("  %-58s tiles: %lld union, %lld per query, %lld of one query\n", (lab + ", tile_gather 0").c_str(),
                tiles_of[1], tiles_of[2], tiles_of[0]);
  };
  step5::ops::SparseAttentionParams p;
  p.num_tokens = T;
  p.num_requests = B;
  p.num_local_heads = Hl;
  p.num_kv_groups = lg;
  p.head_dim = D;
  p.topk = sc.topk;
  p.q = d_q.p;
  p.k_cache = d_k.p;
  p.v_cache = d_v.p;
  p.num_blocks = num_blocks;
  p.block_size = bs;
  p.block_table = d_table.p;
  p.max_blocks = max_blocks;
  p.cu_seqlens_q = d_cu.p;
  p.seq_lens = d_seq.p;
  p.cu_seqlens_q_host = cu.data();
  p.seq_lens_host = sc.seq_lens.data();
  p.topk_ids = d_ids.p;
  p.counts = d_counts.p;
  p.gate = sc.gate ? d_gate.p + 3 : nullptr;
  p.gate_row_stride = ldg;
  p.out = d_out.p;
  p.out_row_stride = ldo;
  p.lse = d_lse.p;
  p.num_splits = sc.num_splits;
  p.query_tile = sc.query_tile;
  p.pipeline_stages = sc.pipeline_stages;
  const std::vector<int> split_list = sc.split_list.empty() ? std::vector<int>{sc.num_splits} : sc.split_list;
  const int sms = current_sm_count();  // the planner's num_sms, for the plan checks below
  for (const int splits : split_list) {
    p.num_splits = splits;
    const std::string lab = sc.split_list.empty() ? label : label + " splits " + std::to_string(splits);
    std::size_t ws_bytes = 0;
    step5::Status st = step5::ops::sparse_attention_workspace_size(p, &ws_bytes);
    EXPECT(st.ok(), "%s: workspace_size: %s", lab.c_str(), st.to_string().c_str());
    if (!st.ok()) continue;
    // partials poisoned, counters zeroed once
    DevBuf<unsigned char> ws(ws_bytes);
    EXPECT(ws_bytes == 0 || ws_bytes > step5::ops::kAttentionCounterBytes,
           "%s: workspace %zu bytes without room past the counters", lab.c_str(), ws_bytes);
    poison_workspace(ws.p, ws_bytes);
    d_out.up(out_poison);
    d_lse.up(lse_poison);
    const step5::Status launched = step5::ops::sparse_attention<Tag::kId>(p, ws.p, ws_bytes, nullptr);
    EXPECT(launched.ok(), "%s: launch: %s", lab.c_str(), launched.to_string().c_str());
    GPU_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> out = d_out.down();
    const std::vector<float> lse = d_lse.down();
    check_output(lab, out, lse);
    check_counters_zero(lab + " (first launch)", ws.p, ws_bytes);
    if (sc.table_positions > 0) {
      // the decode plan ignores the table's width: tiles of one query, no region bitmaps, and
      // (D 192 / 128 at their rings) two CTAs per SM
      step5::ops::SparseAttentionPlan plan;
      const step5::Status pst = step5::ops::sparse_attention_plan(p, sms, &plan);
      EXPECT(pst.ok() && plan.query_tile == 1 && plan.bitmap_words == 0 && plan.max_tiles == std::max(T, 1) &&
                 plan.smem_bytes <= step5::ops::attention_two_per_sm_smem(plan.stages),
             "%s: %lld-position table: plan %s, query_tile %d, bitmap_words %d, max_tiles %d (T %d), %zu bytes "
             "of shared memory (two per SM: <= %zu)",
             lab.c_str(), static_cast<long long>(max_blocks) * bs, pst.to_string().c_str(), plan.query_tile,
             plan.bitmap_words, plan.max_tiles, T, plan.smem_bytes,
             static_cast<std::size_t>(step5::ops::attention_two_per_sm_smem(plan.stages)));
    }
    if (sc.repeat && T > 0) {
      repeat_launches<Tag>(lab, p, ws.p, ws_bytes, d_out, d_lse, out_poison, lse_poison, out, lse);
      graph_replays<Tag>(lab, p, ws.p, ws_bytes, d_out, d_lse, out_poison, lse_poison, out, lse);
    }
    if (sc.gather_ab && T > 0) gather_ab_check(lab, p, ws.p, ws_bytes, out, lse);
    // a variant of the launch on the same workspace (or on `wsv` of `wsv_bytes`), over poisoned
    // outputs: it must succeed, give the first launch's bits and leave the split counters zero
    const auto relaunch_same_bits = [&](const step5::ops::SparseAttentionParams& pv, const std::string& what,
                                        void* wsv = nullptr, std::size_t wsv_bytes = 0) {
      if (wsv == nullptr) wsv = ws.p, wsv_bytes = ws_bytes;
      d_out.up(out_poison);
      d_lse.up(lse_poison);
      const step5::Status vst = step5::ops::sparse_attention<Tag::kId>(pv, wsv, wsv_bytes, nullptr);
      EXPECT(vst.ok(), "%s: launch with %s: %s", lab.c_str(), what.c_str(), vst.to_string().c_str());
      GPU_CHECK(cudaDeviceSynchronize());
      EXPECT(step5_test::same_bits(d_out.down(), out) && step5_test::same_bits(d_lse.down(), lse),
             "%s: %s differs from the default launch", lab.c_str(), what.c_str());
      check_counters_zero(lab + " (" + what + ")", wsv, wsv_bytes);
    };
    if (sc.bad_block && T > 0) {
      // checked mode (p.bounds_fault): the same output bits, and the first block-table fault
      // recorded — kBlockIdOutOfRange at a region's first position in a request's bad block,
      // with the entry — whenever some valid selection entry lies in a bad block, else none
      DevBuf<std::int32_t> fault(step5::ops::kBoundsFaultWords);
      GPU_CHECK(cudaMemset(fault.p, 0, step5::ops::kBoundsFaultWords * sizeof(std::int32_t)));
      auto pc = p;
      pc.bounds_fault = fault.p;
      relaunch_same_bits(pc, "checked mode");
      const std::vector<std::int32_t> rec = fault.down();
      if (bad_selected == 0) {
        EXPECT(rec[0] == 0, "%s: fault kind %d recorded without a selected bad block", lab.c_str(), rec[0]);
      } else {
        const int rb = rec[1];
        bool ok = rec[0] == static_cast<std::int32_t>(step5::ops::BoundsFault::kBlockIdOutOfRange) && rb >= 0 &&
                  rb < B && bad_slot[rb] >= 0;
        ok = ok && rec[2] >= 0 && rec[2] / bs == bad_slot[rb] && rec[2] % kR == 0 &&
             rec[3] == table[static_cast<std::size_t>(rb) * max_blocks + bad_slot[rb]];
        EXPECT(ok, "%s: %lld selected entries in bad blocks; recorded {kind %d, request %d, position %d, value %d}",
               lab.c_str(), bad_selected, rec[0], rec[1], rec[2], rec[3]);
      }
    }
    if (sc.merge_ab && ws_bytes > 0 && T > 0) {
      auto pg = p;
      pg.split_merge = 1;
      relaunch_same_bits(pg, "split_merge 1 (the last-arriver merge)");
    }
    // A plan of one-query tiles (decode) runs the kernel's one-query instance (ONE_Q,
    // attention.cuh); the general instance runs every tile of one query on the same device
    // functions in the same order. Forced to it (query tile 2 over requests of at most one token:
    // every tile is still one query), at the plan's split factor, on a workspace of its own size
    // (more tiles): the same bits.
    // Only the instance differs: the plan's ring depth, split factor and merge kind are forced.
    // (Where query tile 2's region bitmaps do not fit — tables wider than about 1.9M positions —
    // the planner takes query tile 1 again and there is nothing to compare.)
    bool one_token_requests = T > 0;
    for (const int ql : sc.q_lens) one_token_requests = one_token_requests && ql <= 1;
    step5::ops::SparseAttentionPlan plan1{}, plan2{};
    auto pg = p;
    pg.query_tile = 2;
    if (one_token_requests && step5::ops::sparse_attention_plan(p, sms, &plan1).ok() && plan1.query_tile == 1) {
      pg.num_splits = plan1.num_splits;
      pg.pipeline_stages = plan1.stages;
      if (!plan1.cluster_merge) pg.split_merge = 1;  // the last-arriver merge, as the plan's
      const std::string what = "the general instance (query tile 2, " + std::to_string(plan1.num_splits) +
                               " splits, " + std::to_string(plan1.stages) + " stages)";
      std::size_t wsg_bytes = 0;
      const step5::Status pst = step5::ops::sparse_attention_plan(pg, sms, &plan2);
      const step5::Status wst = step5::ops::sparse_attention_workspace_size(pg, &wsg_bytes);
      EXPECT(pst.ok() && wst.ok(), "%s: %s: plan %s, workspace %s", lab.c_str(), what.c_str(),
             pst.to_string().c_str(), wst.to_string().c_str());
      if (pst.ok() && wst.ok() && plan2.query_tile == 2) {
        ++g_instance_checks;
        DevBuf<unsigned char> wsg(std::max<std::size_t>(wsg_bytes, 1));
        poison_workspace(wsg.p, wsg_bytes);
        relaunch_same_bits(pg, what, wsg.p, wsg_bytes);
        if (B >= 2 && T >= 2) {
          // The one-query instance loads token `tile`'s selection row, Q and gate before step 1
          // has located the tile, and loads them again when the tile turns out to be another
          // token. On a device cu_seqlens_q shifted by one (cu'[b] = min(b + 1, T): a broken
          // device copy behind a valid host mirror, as after a graph's metadata was rewritten)
          // tile j is token j + 1 of request j (the last request has none): both instances must
          // compute the same tokens, bit for bit, and leave token 0's output poisoned.
          std::vector<std::int32_t> cu_shift(B + 1);
          for (int b = 0; b <= B; ++b) cu_shift[b] = std::min(b + 1, T);
          DevBuf<std::int32_t> d_cu_shift(cu_shift);
          auto run_shifted = [&](step5::ops::SparseAttentionParams pv, void* wsv, std::size_t wsv_bytes,
                                 std::vector<bf16>* o, std::vector<float>* l) {
            pv.cu_seqlens_q = d_cu_shift.p;
            d_out.up(out_poison);
            d_lse.up(lse_poison);
            const step5::Status vst = step5::ops::sparse_attention<Tag::kId>(pv, wsv, wsv_bytes, nullptr);
            EXPECT(vst.ok(), "%s: shifted device cu_seqlens_q: %s", lab.c_str(), vst.to_string().c_str());
            GPU_CHECK(cudaDeviceSynchronize());
            *o = d_out.down();
            *l = d_lse.down();
          };
          std::vector<bf16> o1, o2;
          std::vector<float> l1, l2;
          run_shifted(p, ws.p, ws_bytes, &o1, &l1);
          poison_workspace(wsg.p, wsg_bytes);
          run_shifted(pg, wsg.p, wsg_bytes, &o2, &l2);
          EXPECT(step5_test::same_bits(o1, o2) && step5_test::same_bits(l1, l2),
                 "%s: shifted device cu_seqlens_q: the one-query instance differs from %s", lab.c_str(), what.c_str());
          bool token0_poisoned = true, token1_written = false;  // tokens 0 and 1: out rows 0 and 1 (ldo apart)
          for (long long i = 0; i < static_cast<long long>(Hl) * D; ++i) {
            token0_poisoned = token0_poisoned && o1[i].bits == kPoison;
            token1_written = token1_written || o1[ldo + i].bits != kPoison;
          }
          EXPECT(token0_poisoned && token1_written,
                 "%s: shifted device cu_seqlens_q: token 0 %s, token 1 %s (expected token 0 untouched, token 1 written)",
                 lab.c_str(), token0_poisoned ? "untouched" : "written", token1_written ? "written" : "untouched");
          check_counters_zero(lab + " (shifted device cu_seqlens_q)", ws.p, ws_bytes);
          check_counters_zero(lab + " (shifted device cu_seqlens_q, " + what + ")", wsg.p, wsg_bytes);
        }
      }
    }
  }
}

/// Every (geometry, tp) of the list; in quick mode only tp 1, 8 and 16 (each (head_dim, hpg_q)
/// kernel instance: hpg_q 16 with several KV groups, 8 and 4).
template <class F>
void each_layout(F&& f) {
  step5::layout::for_each_layout([&](auto tag) {
    const int tp = decltype(tag)::kParallel.tp_size;
    if (!step5_test::quick() || tp == 1 || tp == 8 || tp == 16) f(tag);
  });
}

using step5_test::sz;

std::uint32_t g_seed = 1234;

}  // namespace

GPU_CASE("decode: one row per request, lengths 1..3000, auto split") {
  each_layout([](auto tag) {
    Scenario sc{"decode", {1, 1, 1, 1, 1, 1}, {1, 9, 64, sz(333, 130), sz(1200, 257), sz(3001, 300)}, 16, sz(64, 16)};
    const int checks = g_instance_checks;
    run_scenario<decltype(tag)>(sc, ++g_seed);
    EXPECT(g_instance_checks > checks, "%s tp %d decode: the one-query instance was not compared with the general one",
           std::string(decltype(tag)::kEntry.name).c_str(), decltype(tag)::kParallel.tp_size);
  });
}

GPU_CASE("decode: block tables 1M positions wide (tiles of one query, no region bitmaps)") {
  each_layout([](auto tag) {
    // rows of a 1M-position table whose requests use its first 300..5000 positions; auto splits
    // and the forced split factors 1, 5 and 17 (the cluster and the last-arriver merges)
    Scenario sc{"decode 1M-wide table", {1, 1, 1, 1}, {300, 1201, sz(5000, 640), 77}, 16, sz(256, 32)};
    sc.table_positions = 1 << 20;
    sc.split_list = {0, 1, 5, 17};
    run_scenario<decltype(tag)>(sc, ++g_seed);
  });
}

GPU_CASE("decode: full selection topk 512, forced splits") {
  each_layout([](auto tag) {
    // quick: topk 16; 130 tokens = 16 complete regions + 2 (all history selected), 300 partial
    Scenario sc{"decode topk" + std::to_string(sz(512, 16)) + " splits 7", {1, 1}, {sz(4100, 130), sz(5000, 300)}, 64,
                sz(512, 16)};
    sc.num_splits = 7;
    sc.overlap = false;
    run_scenario<decltype(tag)>(sc, ++g_seed);
  });
}

GPU_CASE("decode MTP: 2-4 query rows per request, partial regions of every length") {
  each_layout([](auto tag) {
    // positions end at every offset within a region (1..8 tokens of the current region)
    const int s0 = sz(800, 200);
    Scenario sc{"mtp", {2, 3, 4, 4, 1, 2, 3, 4}, {s0 + 1, s0 + 2, s0 + 3, s0 + 4, s0 + 5, s0 + 6, s0 + 7, s0 + 8}, 32,
                sz(48, 16)};
    run_scenario<decltype(tag)>(sc, ++g_seed);
  });
}

GPU_CASE("prefill: chunks with history, boundaries inside regions, empty requests, mixed batch") {
  each_layout([](auto tag) {
    Scenario sc{"prefill mixed", {37, 0, 70, 1, 19}, {87, 5, 70, sz(333, 233), 19 + sz(517, 217)}, 16, sz(24, 16)};
    sc.num_splits = 1;
    run_scenario<decltype(tag)>(sc, ++g_seed);
    Scenario sc2 = sc;
    sc2.name = "prefill mixed, 3 splits, padded out/gate rows";
    sc2.num_splits = 3;
    sc2.pad = 5;
    run_scenario<decltype(tag)>(sc2, ++g_seed);
  });
}

GPU_CASE("prefill: short counts (1, 0, random), poisoned slots, no gate, query tile 1") {
  each_layout([](auto tag) {
    Scenario sc{"short counts no gate", {29, 1, 3}, {300, 41, 203}, 8, 16};
    sc.short_counts = true;
    sc.gate = false;
    run_scenario<decltype(tag)>(sc, ++g_seed);
    Scenario sc2 = sc;
    sc2.name = "random selections, query tile 1, splits 2";
    sc2.query_tile = 1;
    sc2.num_splits = 2;
    sc2.overlap = false;
    sc2.short_counts = false;
    run_scenario<decltype(tag)>(sc2, ++g_seed);
  });
}

GPU_CASE("prefill: per-tile choice between the union and per-query gathers (tile_gather 0 / 1 / 2), every hpg_q") {
  each_layout([](auto tag) {
    // random selections (union-heavy tiles: per-query gathers) and shared ones (union-light: the
    // union), with history, partial regions, short counts, invalid ids and a bad block-table entry.
    // Per-query gathers pay only with little overlap (ops::attention_per_query_pays: a union stage
    // costs 3/2 per-query stages): in request 0, 65 regions per query (topk 64 + the current one,
    // 9 stages) out of ~4000 (a 32K history) keep the unions of 4-, 8- and 16-query tiles above the
    // break-even (16 queries: ~920 regions = 115 stages against 107); request 1's ~375 regions make
    // union tiles.
    const int h = sz(3000, 900), h_long = sz(32000, 900);
    Scenario heavy{"gather random", {37, 70, 19, 5, 1}, {h_long, h + 70, 19 + sz(1500, 400), 800, 300}, 16,
                   sz(64, 24)};
    heavy.overlap = false;
    heavy.num_splits = 1;
    heavy.gather_ab = true;
    heavy.gather_expect = 2;
    run_scenario<decltype(tag)>(heavy, ++g_seed);
    Scenario light = heavy;
    light.name = "gather shared";
    light.overlap = true;
    light.gather_expect = 1;
    run_scenario<decltype(tag)>(light, ++g_seed);
    Scenario odd = heavy;
    odd.name = "gather random, short counts, invalid ids, bad block";
    odd.short_counts = true;
    odd.invalid_ids = true;
    odd.bad_block = true;
    odd.gather_expect = 0;
    run_scenario<decltype(tag)>(odd, ++g_seed);
    // unions of several region chunks (ops::kAttentionChunkRegions, two in the kernel's ring):
    // 128 random regions per query out of ~1000, so a 4-query tile's union spans > 256 regions
    // (> 32 stages: the third chunk reuses the first's slot), on the union path and per query
    Scenario wide = heavy;
    wide.name = "gather random, unions of 3+ region chunks";
    wide.q_lens = {64, 29};
    wide.seq_lens = {sz(8000, 4000), sz(5000, 3000)};
    wide.topk = sz(127, 63);
    wide.gather_expect = 0;
    run_scenario<decltype(tag)>(wide, ++g_seed);
    Scenario wide_splits = wide;  // the union path with splits whose shares start inside a chunk
    wide_splits.name = "unions of 3+ region chunks, splits 2 and 3";
    wide_splits.gather_ab = false;
    wide_splits.split_list = {2, 3};
    run_scenario<decltype(tag)>(wide_splits, ++g_seed);
    // deeper rings (prefill plans 2 stages; decode-like batches 2-3): the per-query path over 3
    // and 4 ring slots
    for (const int ns : {3, 4}) {
      Scenario deep = heavy;
      deep.name = "gather random, stages " + std::to_string(ns);
      deep.pipeline_stages = ns;
      run_scenario<decltype(tag)>(deep, ++g_seed);
    }
    // MTP rows (2-4 per request, decode-like: 2-query tiles and partial tiles) with one split
    Scenario mtp{"gather mtp", {2, 3, 4, 4, 2, 1}, {h + 2, h + 3, h + 4, 700, h + 7, h + 1}, 16, sz(64, 24)};
    mtp.overlap = false;
    mtp.num_splits = 1;
    mtp.gather_ab = true;
    run_scenario<decltype(tag)>(mtp, ++g_seed);
  });
}

GPU_CASE("decode batches: 33, 257 requests (every layout) and 1024 (tp >= 8), mixed lengths, some empty") {
  each_layout([](auto tag) {
    const int tp = decltype(tag)::kParallel.tp_size;
    std::vector<int> sizes = {33, 257};
    if (!step5_test::quick() && tp >= 8) sizes.push_back(1024);
    for (int B : sizes) {
      std::mt19937 rng(static_cast<std::uint32_t>(B * 131 + tp));
      const int topk = sz(64, 16), long_max = sz(2000, 600);
      Scenario sc{"decode batch " + std::to_string(B), {}, {}, 16, topk};
      for (int b = 0; b < B; ++b) {
        const int kind = static_cast<int>(rng() % 8);
        // q_len 0 (no row this step), 1 (decode), 2-4 (MTP); lengths short (all history selected)
        // to long (a strict subset: > kR * topk positions)
        const int q = kind == 0 ? 0 : (kind == 1 ? 2 + static_cast<int>(rng() % 3) : 1);
        const int len = kind < 4 ? 1 + static_cast<int>(rng() % 64)
                      : kind < 7 ? 65 + static_cast<int>(rng() % (kR * topk))
                                 : kR * topk + 1 + static_cast<int>(rng() % (long_max - kR * topk));
        sc.q_lens.push_back(q);
        sc.seq_lens.push_back(std::max(len, q));
      }
      run_scenario<decltype(tag)>(sc, ++g_seed);
    }
  });
}

/// Decode batch of B requests for the split tests: B == 1 one long request with a full selection
/// (topk 512: 65 stages, so every split up to 32 gathers >= 2 stages); else mixed lengths, some
/// requests without a row, and mixed counts (some rows with count 0, 1 or < topk).
Scenario split_decode_batch(int B) {
  if (B == 1) {
    Scenario sc{"split decode batch 1", {1}, {sz(5000, 300)}, 64, sz(512, 16)};
    sc.overlap = false;
    return sc;
  }
  std::mt19937 rng(static_cast<std::uint32_t>(B * 7919));
  Scenario sc{"split decode batch " + std::to_string(B) + ", mixed counts", {}, {}, 16, sz(128, 16)};
  sc.short_counts = true;
  for (int b = 0; b < B; ++b) {
    sc.q_lens.push_back(rng() % 9 == 0 ? 0 : 1);
    sc.seq_lens.push_back(1 + static_cast<int>(rng() % static_cast<unsigned>(sz(1500, 600))));
  }
  return sc;
}

GPU_CASE("fused split merge: every forced num_splits 1..kAttentionMaxSplits, every hpg_q, decode batches 1/33/257") {
  std::vector<int> splits;
  for (int s = 1; s <= step5::ops::kAttentionMaxSplits; ++s)
    if (!step5_test::quick() || s <= 3 || s == 7 || s == 16 || s == step5::ops::kAttentionMaxSplits)
      splits.push_back(s);
  each_layout([&](auto tag) {
    for (int B : {1, 33, 257}) {
      Scenario sc = split_decode_batch(B);
      sc.split_list = splits;
      sc.merge_ab = true;
      run_scenario<decltype(tag)>(sc, ++g_seed);
    }
  });
}

GPU_CASE("forced num_splits on multi-query tiles (MTP rows 2-4: the region-bitmap path) next to one-query tiles") {
  std::vector<int> splits;
  for (int s = 1; s <= step5::ops::kAttentionMaxSplits; ++s)
    if (!step5_test::quick() || s <= 2 || s == 7 || s == step5::ops::kAttentionMaxSplits) splits.push_back(s);
  each_layout([&](auto tag) {
    const int s0 = sz(3000, 200);
    Scenario sc{"split mtp", {4, 1, 3, 2, 1}, {s0 + 3, s0 + 17, s0 + 6, 40, s0 + 1}, 32, sz(256, 16)};
    sc.split_list = splits;
    sc.merge_ab = true;
    run_scenario<decltype(tag)>(sc, ++g_seed);
  });
}

GPU_CASE("invalid selections: ids < 0, > current region, huge; counts 0, < 0, > topk + 1; bad block-table entries; decode and MTP") {
  each_layout([](auto tag) {
    // decode: one-query tiles (the region-list path), at 1 split and several
    std::mt19937 rng(977);
    Scenario dec{"invalid ids decode", {}, {}, 16, sz(64, 16)};
    for (int b = 0; b < 24; ++b) {
      dec.q_lens.push_back(1);
      dec.seq_lens.push_back(1 + static_cast<int>(rng() % static_cast<unsigned>(sz(1500, 300))));
    }
    dec.invalid_ids = true;
    dec.split_list = {1, 3, 7};
    dec.merge_ab = true;
    run_scenario<decltype(tag)>(dec, ++g_seed);
    // one long request at every invalid-row kind, bit-identical repeats and graph replays
    Scenario one{"invalid ids decode batch 1, repeats", {1}, {sz(5000, 300)}, 64, sz(512, 16)};
    one.invalid_ids = true;
    one.overlap = false;
    one.split_list = {0, 5};
    one.repeat = true;
    const long long clustered = step5::ops::detail::attention_cluster_merge_launches().load();
    for (std::uint32_t s = 0; s < 3; ++s) run_scenario<decltype(tag)>(one, ++g_seed);
    // batch 1 with 5 splits (at most one split CTA per SM): the plan asks for the cluster merge,
    // and on sm_90 such clusters are resident, so it must have run (its fallback gives the same
    // bits and would otherwise go unnoticed)
    EXPECT(step5::ops::detail::attention_cluster_merge_launches().load() > clustered,
           "batch 1, 5 splits: the cluster merge never ran (the launcher fell back to the last-arriver merge)");
    // a block-table entry outside [0, num_blocks) under selected history regions: masked on the
    // one-query path and on the multi-query path (there it entered the softmax with logit 0)
    Scenario bdec{"bad block decode", {1, 1, 1, 1}, {sz(2000, 300), 77, sz(1200, 200), 500}, 16, sz(64, 16)};
    bdec.bad_block = true;
    bdec.split_list = {1, 4};
    run_scenario<decltype(tag)>(bdec, ++g_seed);
    Scenario bmtp{"bad block mtp/prefill", {4, 3, 37}, {sz(900, 200), 300, 37 + sz(600, 150)}, 16, sz(48, 16)};
    bmtp.bad_block = true;
    run_scenario<decltype(tag)>(bmtp, ++g_seed);
    // MTP / prefill: multi-query tiles (the region-bitmap path)
    Scenario mtp{"invalid ids mtp", {4, 3, 2, 4, 1}, {sz(900, 200), 61, sz(700, 150), 9, 33}, 16, sz(48, 16)};
    mtp.invalid_ids = true;
    mtp.split_list = {1, 3};
    run_scenario<decltype(tag)>(mtp, ++g_seed);
    Scenario pre{"invalid ids prefill", {37, 19}, {87, 19 + sz(517, 217)}, 16, sz(24, 16)};
    pre.invalid_ids = true;
    run_scenario<decltype(tag)>(pre, ++g_seed);
  });
}

GPU_CASE("fused split merge: 50 launches with competing work and 2 graph replays bit-identical, counters reset") {
  each_layout([](auto tag) {
    Scenario sc = split_decode_batch(33);
    sc.split_list = {0, 7, step5::ops::kAttentionMaxSplits};  // auto, and forced
    sc.repeat = true;
    run_scenario<decltype(tag)>(sc, ++g_seed);
  });
}

GPU_CASE("ring depth: forced pipeline_stages 2, 3, 4 on decode (1 and 7 splits), MTP and prefill") {
  each_layout([](auto tag) {
    for (int ns = step5::ops::kAttentionMinStages; ns <= step5::ops::kAttentionMaxStages; ++ns) {
      const std::string tail = ", stages " + std::to_string(ns);
      // decode: stage counts below, equal to and above the ring depth per split
      Scenario dec{"decode" + tail, {1, 1, 1, 1}, {9, sz(200, 100), sz(1500, 250), sz(4000, 300)}, 64, sz(256, 16)};
      dec.pipeline_stages = ns;
      dec.split_list = {1, 7};
      run_scenario<decltype(tag)>(dec, ++g_seed);
      Scenario mtp{"mtp short counts" + tail, {4, 2, 3}, {sz(900, 200), 60, sz(700, 150)}, 16, sz(48, 16)};
      mtp.pipeline_stages = ns;
      mtp.short_counts = true;
      run_scenario<decltype(tag)>(mtp, ++g_seed);
      Scenario pre{"prefill" + tail, {37, 70, 19}, {87, 70, 19 + sz(517, 217)}, 16, sz(24, 16)};
      pre.pipeline_stages = ns;
      pre.split_list = {1, 3};
      run_scenario<decltype(tag)>(pre, ++g_seed);
    }
  });
}

GPU_CASE("T = 0 and requests without rows: ok, nothing written") {
  each_layout([](auto tag) {
    Scenario sc{"no rows", {0, 0}, {10, 20}, 16, 8};
    run_scenario<decltype(tag)>(sc, ++g_seed);
  });
}

GPU_CASE("launcher preconditions return Status with the value") {
  using Tag = step5::layout::LayoutTag<step5::layout::GeometryId::step5_preview, 1>;
  step5::ops::SparseAttentionParams p;
  p.num_tokens = 4;
  p.num_requests = 1;
  p.num_local_heads = 64;
  p.num_kv_groups = 4;
  p.head_dim = 192;
  p.topk = 512;
  p.block_size = 16;
  p.max_blocks = 64;  // 1024 positions = 16 stages: the auto split factor for one decode tile is > 1
  p.num_blocks = 64;
  const std::int32_t h_cu[2] = {0, 4}, h_seq[1] = {4}, h_table[64] = {};
  p.block_table = h_table;  // never read: every case below is refused before a launch
  p.cu_seqlens_q_host = h_cu;
  p.seq_lens_host = h_seq;
  p.cu_seqlens_q = h_cu;  // stand-ins for the device arrays (never read either)
  p.seq_lens = h_seq;
  p.num_splits = 1;  // no split-KV workspace, so the pointer checks below are reached
  auto expect_err = [&](step5::ops::SparseAttentionParams q, const char* needle, const char* what) {
    const step5::Status s = step5::ops::sparse_attention<Tag::kId>(q, nullptr, 0, nullptr);
    EXPECT(!s.ok() && s.message().find(needle) != std::string::npos, "%s: got '%s'", what, s.to_string().c_str());
  };
  auto q = p;
  q.block_size = 12;
  expect_err(q, "block_size = 12", "block size not a multiple of 8");
  q = p;
  q.topk = 0;
  expect_err(q, "topk = 0", "topk 0");
  q = p;
  q.topk = 1025;
  expect_err(q, "topk = 1025", "topk 1025");
  q = p;
  q.num_local_heads = 32;
  q.num_kv_groups = 4;
  expect_err(q, "no listed layout", "Hl 32 with lg 4 is no layout of step5_preview");
  q = p;
  q.num_local_heads = 8;
  q.num_kv_groups = 4;
  expect_err(q, "hpg_q", "hpg 2");
  q = p;
  q.head_dim = 128;
  expect_err(q, "head_dim = 128", "wrong head_dim");
  expect_err(p, "q is null", "null q");
  q = p;
  q.num_splits = 0;  // auto split for 4 decode rows: a split-KV workspace is needed and none is given
  expect_err(q, "workspace_bytes = 0", "missing split-KV workspace");
  q = p;
  q.split_merge = 2;
  expect_err(q, "split_merge = 2", "split_merge neither 0 nor 1");
  q = p;
  q.pipeline_stages = 1;
  expect_err(q, "pipeline_stages = 1", "ring depth below 2");
  q = p;
  q.cu_seqlens_q_host = nullptr;
  expect_err(q, "cu_seqlens_q_host is null", "no host mirror of cu_seqlens_q");
  q = p;
  q.seq_lens_host = nullptr;
  expect_err(q, "seq_lens_host is null", "no host mirror of seq_lens");
  q = p;
  q.cu_seqlens_q = nullptr;
  expect_err(q, "cu_seqlens_q is null, expected the device copy", "no device cu_seqlens_q");
  q = p;
  q.seq_lens = nullptr;
  expect_err(q, "seq_lens is null, expected the device copy", "no device seq_lens");
  q = p;
  q.num_blocks = 1 << 28;  // 2^28 blocks x 16 x 4 groups: cache rows past int32
  expect_err(q, "num_blocks * block_size (cache tokens) = 4294967296", "cache rows past int32");
  q = p;
  const std::int32_t long_seq[1] = {1025};  // capacity 64 x 16 = 1024 positions
  q.seq_lens_host = long_seq;
  expect_err(q, "request 0: position 1024", "position past the block-table row");
  {  // the pointers' alignment (the kernels' loads: a misaligned one is a sticky device fault);
     // device stand-ins, never read
    DevBuf<unsigned char> buf(1 << 20);
    unsigned char* b = buf.p;
    q = p;
    q.q = reinterpret_cast<const step5::bf16*>(b);
    q.k_cache = reinterpret_cast<const step5::bf16*>(b + 4096);
    q.v_cache = reinterpret_cast<const step5::bf16*>(b + 8192);
    q.topk_ids = reinterpret_cast<const std::int32_t*>(b + 12288);
    q.counts = reinterpret_cast<const std::int32_t*>(b + 16384);
    q.out = reinterpret_cast<step5::bf16*>(b + 20480);
    q.gate = reinterpret_cast<const step5::bf16*>(b + 24577);
    expect_err(q, "sparse_attention: gate is at an address = 1 mod 2, expected 2-byte aligned", "gate at an odd address");
    q.q = reinterpret_cast<const step5::bf16*>(b + 2);
    expect_err(q, "q must be 4-byte aligned", "q at 2 mod 4");
    q.q = reinterpret_cast<const step5::bf16*>(b);
    q.gate = nullptr;
    q.topk_ids = reinterpret_cast<const std::int32_t*>(b + 12290);  // the kernel's int32 loads of the rows
    expect_err(q, "sparse_attention: topk_ids is at an address = 2 mod 4, expected 4-byte aligned", "topk_ids at 2 mod 4");
    q.topk_ids = reinterpret_cast<const std::int32_t*>(b + 12288);
    q.counts = reinterpret_cast<const std::int32_t*>(b + 16385);
    expect_err(q, "sparse_attention: counts is at an address = 1 mod 4, expected 4-byte aligned", "counts at 1 mod 4");
  }
  {  // outputs over inputs or each other (require_disjoint; fake addresses, never read: every case
     // is refused before the launch). Each CTA writes its tile's out rows while other CTAs still
     // read the q rows of other tiles, the caches, the selection rows; out == q with the same
     // stride is the supported in-place call (not launched here)
    const auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
    const std::uintptr_t kQ = 0x10000000, kRow = 64 * 192 * 2;  // one token's q row: 24576 bytes
    q = p;
    q.q = static_cast<const step5::bf16*>(at(kQ));
    q.k_cache = static_cast<const step5::bf16*>(at(0x20000000));
    q.v_cache = static_cast<const step5::bf16*>(at(0x30000000));
    q.topk_ids = static_cast<const std::int32_t*>(at(0x40000000));
    q.counts = static_cast<const std::int32_t*>(at(0x50000000));
    q.out = static_cast<step5::bf16*>(at(kQ + kRow));  // token t's output over token t + 1's q
    expect_err(q, "sparse_attention: out [", "out shifted one token over q");
    expect_err(q, "overlaps q [", "out shifted one token over q");
    auto r = q;
    r.out = static_cast<step5::bf16*>(at(kQ));
    r.out_row_stride = 2 * 64 * 192;  // same start, another stride: not the in-place call
    expect_err(r, "overlaps q [", "out over q with another row stride");
    r = q;
    r.out = static_cast<step5::bf16*>(at(0x20000000 + 4096));
    expect_err(r, "overlaps k_cache [", "out over the K cache");
    r = q;
    r.out = static_cast<step5::bf16*>(at(0x60000000));
    r.lse = static_cast<float*>(at(0x50000000));
    expect_err(r, "sparse_attention: lse [", "lse over counts");
    expect_err(r, "overlaps counts [", "lse over counts");
    r = q;
    r.out = static_cast<step5::bf16*>(at(0x40000000 + 64));
    expect_err(r, "overlaps topk_ids [", "out over the selection rows");
  }
}

STEP5_GPU_TEST_MAIN()
