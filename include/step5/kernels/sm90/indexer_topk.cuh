#pragma once
/// \file step5/kernels/sm90/indexer_topk.cuh
/// Deterministic top-k selection of SPEC.md §4.6: one CTA per (token, group) row, or a thread-block
/// cluster of kTopkCluster CTAs per row (few long rows, as in decode, and rows too long for one
/// CTA's shared memory; see launch_topk). One CTA per row runs 512 threads on long rows and 128 or
/// 256 threads on short ones (more rows in flight per SM; the same selection and output, bit for
/// bit; topk_cta_threads); clusters run 512; the shortest rows (prefill strides up to
/// kTopkWarpMaxLd) take one warp per row instead (topk_warp_rows_kernel, the radix select without
/// CTA barriers).
///
/// Order: scores are mapped to order-preserving uint32 keys (NaN → 0xffffffff above +inf, −0 → +0);
/// the selection is the first k of (key descending, region id ascending), which is unique, so the
/// result never depends on thread timing. A 4-pass 8-bit radix select (shared-memory histograms; a
/// warp whose 32 keys share one digit adds once, so plateaus of equal scores do not serialise) finds
/// the k-th key K* and how many keys equal to K* are taken (`need`); a compaction pass in id order
/// (CTAs of 256 or 512 threads, clusters included: warp ballots, `compact_by_ballots`; 128-thread
/// CTAs: cub::BlockScan over tiles of kTopkItems keys per thread) then writes ids with key > K*,
/// and the first `need` ids with key == K*, ascending. (One 512-thread CTA per row with candidates
/// and a staged row of at most 16384 keys, where the launch has at most one row per SM: owner masks
/// instead, topk_owner_classify — one sweep for the candidates' gather and the compaction.)
/// In a cluster, CTA rank c owns an id-contiguous slice of the row: every rank pushes its histogram
/// of a pass into every rank's shared memory (st.async, TopkExchange) and sums the ranks' in rank
/// order (identical results everywhere), and the compaction offsets of a slice are the (gt, eq)
/// totals of the lower ranks, pushed the same way. (Candidate compaction on a cluster, not the
/// default there, still reads the ranks' first-digit histograms and stores its candidates through
/// distributed shared memory between cluster barriers.)
/// Rows whose history fits (k == n) skip the radix passes. Keys are staged in dynamic shared memory
/// when a CTA's slice fits (kSmem; loaded with several independent loads in flight per thread, and
/// the first radix digit counted in the same sweep), else re-read from global memory each pass.
/// Two ways to find K* and `need` (TopkAlgo; the same K*, `need` and output, bit for bit): the
/// radix select above over every key each pass (kRadix), or candidate compaction (kCandidates):
/// one histogram of the top kTopkFirstBits bits of every key, then the keys of the threshold bin
/// (usually a few hundred) are gathered in shared memory and the remaining digits run over them
/// alone, CTA-locally; too many candidates fall back to the full passes (topk_select_kernel).
#include <cuda_runtime.h>

#include <algorithm>  // std::find (launch_topk)
#include <atomic>
#include <cstdint>
#include <cstdlib>  // std::getenv (STEP5_TOPK)
#include <cstring>  // std::memcpy (score_key on the host)
#include <iterator>  // std::begin / std::end

#include "step5/kernels/sm90/arch.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/kernels/sm90/ptx.cuh"  // mbarriers, st.async pushes, the split and exit cluster barriers
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <string>
#include <type_traits>  // std::integral_constant

#include "step5/core/cuda_check.hpp"
#include "step5/layout/geometry.hpp"  // kRegionSize
#include "step5/ops/indexer.hpp"     // TopkAlgo, topk_algo_from_env
#include "step5/kernels/sm90/indexer_prepare.cuh"  // token_request

namespace step5::kernels::sm90 {

/// Order-preserving key of an fp32 score (SPEC §4.6): larger key = ranks higher. Host-callable
/// (tests derive the candidate count of a row from it).
__host__ __device__ __forceinline__ std::uint32_t score_key(float f) {
#ifdef __CUDA_ARCH__
  std::uint32_t u = __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
#endif
  const std::uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0xffffffffu;  // NaN ranks above every number
  if (mag == 0) u = 0;                        // -0 == +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Rows of a selection launch. Raw mode (history != nullptr): row r has n = history[r] and writes
/// output row r. Indexer mode: row r = (t - t0) * lg + g, n = position(t) / 8, output row g*T + t.
struct TopkArgs {
  const float* scores;
  std::int64_t ld;
  const std::int32_t* history;
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* seq_lens;
  int num_requests, num_tokens, t0, lg;
  int topk;
  std::int32_t* ids;
  std::int64_t ld_ids;
  std::int32_t* counts;
  int cand_cap;  ///< candidate compaction: keys of the threshold bin that fit the candidate buffer (launch_topk sets it)
  int owner_masks;  ///< one-CTA candidate rows of 512 threads, staged: 1 = the owner-mask gather and compaction
                    ///< (topk_owner_classify; launch_topk: topk_owner_masks_pay), 0 = the ballot ones
};

/// CTA size of the selection kernel for long rows (and every cluster launch). 1024 measured slower
/// for both variants.
inline constexpr int kTopkThreads = 512;
static_assert(kTopkThreads == ::step5::ops::kTopkNoPdlCtaThreads,
              "ops::topk_launch_uses_pdl names this CTA size");
/// The short-row CTA sizes (see topk_cta_threads), which put more rows in flight per SM when a
/// row's keys are few (prefill: n = position / 8 <= 2048 at 16K tokens).
inline constexpr int kTopkShortThreads = 128;
inline constexpr int kTopkMidThreads = 256;
/// Threads per row of the warp-row kernel (topk_warp_rows_kernel: one warp per row, kTopkWarpRows
/// rows per CTA), the launch's `threads` value that names it.
inline constexpr int kTopkWarpThreads = 32;
inline constexpr int kTopkWarpRows = 4;
/// The threads per row the selection is built for: the warp rows (topk_warp_rows_kernel, radix
/// only) and the CTA sizes of topk_select_kernel (template kThreads); the one list the launcher,
/// its tests and benchmarks use. The output is the same for every size (the same selection; the
/// compaction differs: see compact_by_ballots); the work per thread changes.
inline constexpr int kTopkCtaSizes[] = {kTopkWarpThreads, kTopkShortThreads, kTopkMidThreads, kTopkThreads};
template <int kThreads>
inline constexpr bool kTopkThreadsValid = kThreads == kTopkShortThreads || kThreads == kTopkMidThreads ||
                                          kThreads == kTopkThreads;
/// CTAs per SM the register allocation must allow (__launch_bounds__ minimum blocks), by CTA size
/// (ptxas -v, CUDA 13.0, sm_90a; no spills): 512: 0 = unspecified, as before (candidates 64
/// registers, so 2 CTAs per SM; radix 32-40 since the ballot compaction; clusters, with it too
/// since the fifteenth session, 63-64); 256: 5 (40-48
/// registers; 6 would be 40 and spilled before it); 128: 12 (40 registers).
template <int kThreads>
inline constexpr int kTopkMinCtas = kThreads == kTopkThreads ? 0 : kThreads == kTopkMidThreads ? 5 : 12;
inline constexpr int kTopkItems = 8;  // ids per thread per block-scan compaction tile (128-thread CTAs)
/// A CTA whose slice of a row has at most this many regions stages its keys in shared memory.
inline constexpr int kTopkSmemKeys = 49152;
/// Keys a shared-memory staging of `n` keys is allocated with: n rounded up to a multiple of
/// kTopkItems (8), so that the reads of its last keys stay inside it — the 16-byte loads of the
/// staged sweeps (four keys), and the 128-thread compaction's tiles of 8 keys per thread, whose
/// guarded word loads ptxas may merge as it merged three of the sweep's into one 12-byte read
/// past a staging (memcheck, forty-seventh session). Keys past a row's n are read, never counted.
__host__ __device__ constexpr std::int64_t topk_staged_keys(std::int64_t n) {
  return (n + kTopkItems - 1) / kTopkItems * kTopkItems;
}
/// Keys of the dynamic shared memory that stages one of kc CTAs' slice of a row of stride `ld`
/// (topk_select_kernel's kSmem; its candidates follow): topk_staged_keys(ceil(ld / kc)). At most
/// kTopkSmemKeys exactly when ceil(ld / kc) is (kTopkSmemKeys is a multiple of kTopkItems).
__host__ __device__ constexpr std::int64_t topk_slice_keys(std::int64_t ld, int kc) {
  return topk_staged_keys((ld + kc - 1) / kc);
}
static_assert(kTopkItems % 4 == 0 && kTopkSmemKeys % kTopkItems == 0,
              "topk_staged_keys: whole 16-byte groups, and a slice of kTopkSmemKeys keys stays staged");
static_assert(topk_slice_keys(12345, 1) == 12352 && topk_slice_keys(12344, 1) == 12344 &&
                  topk_slice_keys(kTopkSmemKeys, 1) == kTopkSmemKeys && topk_slice_keys(16385, 8) == 2056,
              "topk_slice_keys: ceil(ld / kc) rounded up to 8 keys");
/// Candidate compaction (TopkAlgo::kCandidates): width of the first digit, the top bits of the key,
/// whose threshold bin holds the candidates. 11 bits = sign, exponent and 2 mantissa bits: a bin is a
/// quarter of a binade, so about 1.6 % of 16384 N(0, 1) scores fall in the bin of the 512th (8 bits
/// would be 2 binades, ~16 %). Any value in [8, 12] compiles; 11 is a choice to be measured.
inline constexpr int kTopkFirstBits = 11;
inline constexpr int kTopkFirstBins = 1 << kTopkFirstBits;
static_assert(kTopkFirstBits >= 8 && kTopkFirstBits <= 12, "first digit: 8 to 12 bits");
/// Candidate compaction: the most candidates kept in shared memory (beyond it, or beyond what fits
/// next to the staged keys, the remaining digits run over every key). To be measured.
inline constexpr int kTopkCandKeys = 8192;
/// Candidate compaction on one CTA per row (kc == 1) of a short-row size (threads < kTopkThreads)
/// with at most kTopkFirstBins candidates kept (cap): the candidates overwrite the first-digit
/// histogram, dead once the threshold bin is picked, instead of taking cap keys of dynamic shared
/// memory (more CTAs per SM). 512-thread CTAs keep their candidates in dynamic shared memory, the
/// code their GPU tests ran. Host and device use this one rule (the launcher sizes the dynamic
/// shared memory with it).
__host__ __device__ __forceinline__ constexpr bool topk_cand_in_hist(int kc, int threads, int cap) {
  return kc == 1 && threads < kTopkThreads && cap <= kTopkFirstBins;
}
/// Upper bound of the static shared memory of the selection kernel of `cluster_size` CTAs per row
/// (checked in the kernel): launches of more than 48 KiB − this bound of dynamic shared memory opt
/// in to the larger limit (static and dynamic shared memory together may not pass 48 KiB without
/// it). The largest instances: candidates on one CTA about 15 KiB (the block scan's 4.3 KiB, the
/// first-digit histogram 8 KiB), candidates on a cluster about 31 KiB (with the pushes' receive
/// buffers, 16 KiB).
__host__ __device__ constexpr int topk_static_smem_max(int cluster_size) {
  return cluster_size > 1 ? 32 * 1024 : 16 * 1024;
}
static_assert(kTopkSmemKeys * 4 + topk_static_smem_max(2) <= 227 * 1024,
              "topk_allow_smem's dynamic limit and the static bound fit an sm_90 CTA's 227 KiB");
/// CTAs per row of the cluster variant (a thread-block cluster; histograms and compaction offsets
/// are pushed into each other's shared memory, TopkExchange).
inline constexpr int kTopkCluster = 8;

/// Regions `n` and output row of selection row `r` (see TopkArgs).
struct TopkRow {
  int n;
  std::int64_t orow;
};
/// Both modes cut n to the ld regions a score row holds: a device seq_len beyond the step's
/// max_seq_len (reported by the score kernel in checked mode), or a raw history above ld, would
/// otherwise read past the row and past the shared-memory key buffer; a negative position (a
/// device seq_len below q_len, a broken precondition that indexer_prepare reports in checked
/// mode) or a negative raw history becomes a huge unsigned value and is cut to ld as well, so
/// k >= 0 and nothing is written before the output row (its selection is meaningless). The
/// kernel runs this once per CTA (thread 0, through shared memory): evaluated by every thread,
/// the raw-mode cut spilled the 128-thread candidate instance at its 40-register budget (ptxas
/// 13.0).
__device__ __forceinline__ TopkRow topk_row(const TopkArgs& a, int r) {
  unsigned n = 0;  // the row's regions before the cut to ld (a negative value wraps above it)
  std::int64_t orow = r;
  if (a.history != nullptr) {
    n = static_cast<unsigned>(a.history[r]);
  } else {
    const int t = a.t0 + r / a.lg, g = r % a.lg;
    // decode: the request row loaded with the search (one round trip)
    const RequestRow req = token_request(a.cu_seqlens_q, a.seq_lens, a.num_requests, t).row;
    n = static_cast<unsigned>(req.position(t)) / layout::kRegionSize;
    orow = static_cast<std::int64_t>(g) * a.num_tokens + t;
  }
  return {static_cast<int>(min(n, static_cast<unsigned>(a.ld))), orow};
}

/// Barrier over the CTAs that share a row: the cluster (kC > 1) or the CTA.
template <int kC>
__device__ __forceinline__ void row_sync() {
  if constexpr (kC > 1) cooperative_groups::this_cluster().sync();
  else __syncthreads();
}

/// `p` (a shared-memory address of this CTA) in the shared memory of cluster rank `q`.
template <int kC, class T>
__device__ __forceinline__ T* rank_smem(T* p, int q) {
  if constexpr (kC > 1) return cooperative_groups::this_cluster().map_shared_rank(p, q);
  else return p;
}

/// Selection state shared by the threads of a CTA: the bin picked by the last digit pass.
struct TopkPick {
  unsigned digit, above, count;
};
/// The shared-memory slot of a TopkPick: one 16-byte aligned word, read whole (one 16-byte load
/// that stays inside the slot). Held as three separate words, the three reads were merged by ptxas into
/// one 16-byte load that also covered a neighbouring shared variable, which thread 0 then wrote
/// before the next barrier: the bytes read were unused, but compute-sanitizer racecheck reports
/// the overlap (`s_cand_pos`, candidate variants; eighth session).
struct TopkPickSlot {
  uint4 v;
  // three scalar stores (the fourth word is never read): a uint4 store inside the unrolled pick
  // loops added register spills to the 128/256-thread variants (ptxas -v)
  __device__ __forceinline__ void put(const TopkPick& p) {
    v.x = p.digit;
    v.y = p.above;
    v.z = p.count;
  }
  __device__ __forceinline__ TopkPick get() const {
    const uint4 x = v;
    return {x.x, x.y, x.z};
  }
};

/// How the CTAs of a cluster row (kC > 1) exchange their histograms and compaction totals: by
/// pushes, not by reading each other's shared memory after a cluster barrier. Each rank st.async's
/// its 256 bin counts of a radix pass into slot [crank] of every rank's `recv[pass & 1]` (itself
/// included), completing bytes on that rank's `bar[pass & 1]`; each rank waits for its own mbarrier
/// (kC · 1 KiB: every rank's histogram) and sums the slots in rank order. So a pass costs one
/// one-way push and no fence: the cluster barrier it replaces arrives with release semantics, a
/// GPU-scope MEMBAR on sm_90 (Nsight Compute: 10.6 % of the batch-1 top-k's stall samples on
/// "membar" in the radix passes, bench/RESULTS.md twenty-fifth session), and the remote loads after
/// it are a second round trip. The compaction's (eq, gt) totals travel the same way (`totals`,
/// `bar_total`).
/// Two buffers suffice: rank q pushes pass p + 2 into slot buffer p & 1 only after its wait for
/// pass p + 1 saw this rank's push of p + 1, which each thread of this rank issues after it read
/// its bin of pass p (program order, then the push's cluster-scope release and q's acquire).
/// The mbarriers are armed (arrive + expect_tx) once at the kernel start for their first phase,
/// and by thread 0 for the next one as soon as it has waited for a phase; a phase that never comes
/// (fewer passes) stays pending at exit, which is harmless. The other ranks may push only after
/// they know the mbarriers are initialised: a cluster barrier, split around the staging sweep.
template <int kC>
struct TopkExchange {
  static constexpr int kRanks = kC > 1 ? kC : 1;
  static constexpr unsigned kPassBytes = kRanks * 256 * 4;  ///< tx bytes of one pass: every rank's histogram
  static constexpr unsigned kTotalBytes = kRanks * 8;       ///< tx bytes of the totals
  std::uint64_t bar[2];
  std::uint64_t bar_total;
  unsigned long long totals[kRanks];  ///< (eq << 32) | gt of each rank's slice
  unsigned recv[2][kRanks][kC > 1 ? 256 : 1];

  /// Thread 0, at the kernel start: initialises and arms the mbarriers, and makes them visible to
  /// the cluster (the caller's cluster barrier follows).
  __device__ __forceinline__ void init() {
    ptx::mbar_init(&bar[0], 1);
    ptx::mbar_init(&bar[1], 1);
    ptx::mbar_init(&bar_total, 1);
    ptx::mbar_arrive_expect_tx(&bar[0], kPassBytes);
    ptx::mbar_arrive_expect_tx(&bar[1], kPassBytes);
    ptx::mbar_arrive_expect_tx(&bar_total, kTotalBytes);
    ptx::fence_mbarrier_init_cluster();
  }
  /// Thread `bin` (< 256) of rank `crank`: pushes count `v` of its bin for radix pass `pass` to every
  /// rank, waits until every rank's count of the pass has arrived here, and returns their sum in
  /// rank order (the same on every rank). Thread 0 re-arms the pass's mbarrier for pass + 2.
  __device__ __forceinline__ unsigned exchange_bin(int pass, int crank, int bin, unsigned v) {
    const int b = pass & 1;
    const std::uint32_t dst = ptx::smem_u32(&recv[b][crank][bin]), mb = ptx::smem_u32(&bar[b]);
#pragma unroll
    for (int q = 0; q < kRanks; ++q) ptx::st_async_b32(ptx::cluster_addr(dst, q), v, ptx::cluster_addr(mb, q));
    ptx::mbar_wait_cluster(&bar[b], static_cast<unsigned>(pass >> 1) & 1u);
    unsigned sum = 0;
#pragma unroll
    for (int q = 0; q < kRanks; ++q) sum += recv[b][q][bin];
    if (bin == 0) ptx::mbar_arrive_expect_tx(&bar[b], kPassBytes);
    return sum;
  }
  /// Every thread of rank `crank`: pushes this rank's slice totals (threads 0 .. kC − 1 one rank
  /// each), waits for every rank's, and returns the sum of the lower ranks' (rank order).
  __device__ __forceinline__ unsigned long long lower_totals(int crank, unsigned long long total) {
    const int tid = threadIdx.x;
    if (tid < kRanks)
      ptx::st_async_b64(ptx::cluster_addr(ptx::smem_u32(&totals[crank]), tid), total,
                        ptx::cluster_addr(ptx::smem_u32(&bar_total), tid));
    ptx::mbar_wait_cluster(&bar_total, 0);
    unsigned long long carry = 0;
#pragma unroll
    for (int q = 0; q < kRanks; ++q) carry += q < crank ? totals[q] : 0ull;
    return carry;
  }
};

/// Inclusive sum of `v` over lanes 0 .. `lane` of a full warp (Kogge-Stone, five shuffles); every
/// lane must call it. The radix pick, the ballot compaction and the owner masks' gather use it.
__device__ __forceinline__ unsigned warp_inclusive_sum(unsigned v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned u = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += u;
  }
  return v;
}

/// The threshold bin of a radix pass, found by one full warp: lane l holds the counts c[j] of bins
/// 255 − 8l − j (j < 8, the highest first); the bin is the one with above < krem <= above + count,
/// `above` counting the keys in higher bins (the bins partition the keys: exactly one lane and j
/// match). That lane calls `found(TopkPick{digit, above, count})` (where it finds it: radix_refine
/// stores it there, which kept its registers). Every lane must call it. radix_refine's warp 0 and
/// the warp rows (topk_warp_rows_kernel) pick with it.
template <class Found>
__device__ __forceinline__ void warp_threshold_bin(const unsigned (&c)[8], int lane, unsigned krem, Found&& found) {
  unsigned s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += c[j];
  unsigned above = warp_inclusive_sum(s, lane) - s;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (above < krem && above + c[j] >= krem)
      found(TopkPick{255u - 8u * static_cast<unsigned>(lane) - static_cast<unsigned>(j), above, c[j]});
    above += c[j];
  }
}

/// Adds one key per thread of a warp to histogram `h` (bin `digit`, only where `match`): a warp
/// whose 32 keys share one bin adds once (plateaus of equal scores do not serialise), otherwise
/// one shared-memory atomic per key. Every lane of the warp must call it.
__device__ __forceinline__ void warp_hist_add(unsigned* h, unsigned digit, bool match, int lane) {
  const unsigned dg = match ? digit : 0xffffffffu;
  const unsigned d0 = __shfl_sync(0xffffffffu, dg, 0);
  if (__all_sync(0xffffffffu, dg == d0)) {
    if (lane == 0 && match) atomicAdd(&h[d0], 32u);
  } else if (match) {
    atomicAdd(&h[dg], 1u);
  }
}

/// Match bits of the four keys `q` (ids i .. i + 3): bit j is set where (q_j & mask) == prefix
/// and, when kTail, i + j < n (a step whose ids are all below n needs no id test).
template <bool kTail>
__device__ __forceinline__ unsigned topk_warp_match4(uint4 q, int i, int n, std::uint32_t mask, std::uint32_t prefix) {
  const std::uint32_t k[4] = {q.x, q.y, q.z, q.w};
  unsigned m = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) m |= static_cast<unsigned>((!kTail || i + j < n) && (k[j] & mask) == prefix) << j;
  return m;
}

/// Adds the keys of q[c] whose bit j of m[c] is set (key j of the four) to the warp's histogram
/// `h` at digit (key >> shift) & 0xff: 4·kN keys per lane. Where every counted key of the warp has
/// lane 0's first digit, one atomic adds their number (plateaus of equal scores do not serialise;
/// the count is a warp reduction); otherwise one shared-memory atomic per counted key. Every lane
/// of the warp must call it. (warp_hist_add for 4·kN keys per lane: one shuffle and one vote per
/// 4·kN keys instead of per key; the warp rows and radix_refine's sweeps over staged keys.)
template <int kN>
__device__ __forceinline__ void warp_hist_add_keys(unsigned* h, const uint4 (&q)[kN], const unsigned (&m)[kN],
                                                   int shift, int lane) {
  unsigned d[kN][4];
#pragma unroll
  for (int c = 0; c < kN; ++c) {
    d[c][0] = (q[c].x >> shift) & 0xffu;
    d[c][1] = (q[c].y >> shift) & 0xffu;
    d[c][2] = (q[c].z >> shift) & 0xffu;
    d[c][3] = (q[c].w >> shift) & 0xffu;
  }
  const unsigned d0 = __shfl_sync(0xffffffffu, d[0][0], 0);
  bool same = true;
  unsigned cnt = 0;
#pragma unroll
  for (int c = 0; c < kN; ++c) {
    cnt += static_cast<unsigned>(__popc(m[c]));
#pragma unroll
    for (int j = 0; j < 4; ++j) same = same && (((m[c] >> j) & 1u) == 0u || d[c][j] == d0);
  }
  if (__all_sync(0xffffffffu, same)) {
    cnt = __reduce_add_sync(0xffffffffu, cnt);
    if (lane == 0 && cnt != 0) atomicAdd(&h[d0], cnt);
  } else {
#pragma unroll
    for (int c = 0; c < kN; ++c) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if ((m[c] >> j) & 1u) atomicAdd(&h[d[c][j]], 1u);
    }
  }
}

/// The top bit + 1 of the plain radix select's first digit (its digits are key bits
/// [kTopkRadixHi − 8, kTopkRadixHi), then the 8 below, ...): the whole key.
inline constexpr int kTopkRadixHi = 32;

/// Radix passes of 8-bit digits below bit `hi` (shifts hi−8, hi−16, …, the last one clamped at 0)
/// over the keys key_at(i), i in [0, len), of the CTAs sharing a row (kC: see topk_select_kernel),
/// restricted to the keys with (key & mask) == prefix; `krem` (≥ 1) of those are still to be
/// taken. Refines prefix/mask until the keys with the prefix are exactly the remaining ones, or
/// every bit is fixed; returns `need`, the number of keys equal to the final prefix that are taken.
/// hist: both buffers zero on entry (left zero or dirty; the caller does not reuse them), except
/// hist[0] with `first_counted`; a cluster (kC > 1) counts in hist[0] only, cleared by each pass
/// once pushed.
/// A clamped last digit overlaps bits already in the mask: those bits equal the prefix's for
/// every counted key, so the digit is still exact.
/// kC > 1: the ranks' histograms are exchanged by pushes (TopkExchange `*xch`, this CTA's cluster
/// rank `crank`; kC = 1: unused, may be null). On a cluster it may run only once per kernel: its
/// passes number the exchange's mbarrier phases from 0 (topk_select_kernel's two calls of
/// radix_refine<kC> are on exclusive paths).
/// first_counted (callers with prefix = mask = 0 and hi = kTopkRadixHi only): the first pass's
/// histogram of digit key >> (kTopkRadixHi − 8) over the keys [0, len) is already in hist[0],
/// counted by the caller's staging sweep (topk_select_kernel's radix select on staged keys: one
/// sweep over the keys fewer); the first pass skips its sweep (and then pushes hist[0] on a
/// cluster, or picks from it on one CTA).
/// kStaged4 (one CTA, kC = 1): the keys are `staged[0, len)` in shared memory (16-byte aligned,
/// key_at(i) == staged[i], allocated to a multiple of 8 keys: topk_slice_keys); each sweep reads
/// four per thread per step (16-byte loads, the row's last partial four too: the keys past len
/// are not counted), skips the atomics of a warp's 128 keys where none has the prefix, and
/// counts with warp_hist_add_keys — the same histogram, fewer instructions per key.
template <int kC, int kThreads, bool kStaged4 = false, class KeyAt>
__device__ __forceinline__ unsigned radix_refine(KeyAt key_at, int len, int hi, std::uint32_t& prefix,
                                                 std::uint32_t& mask, unsigned krem, unsigned (&hist)[2][256],
                                                 unsigned* hsum, TopkPickSlot& pick, TopkExchange<kC>* xch,
                                                 int crank, bool first_counted = false,
                                                 const std::uint32_t* staged = nullptr) {
  static_assert(!kStaged4 || kC == 1, "the four-key sweep reads one CTA's staged keys");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  static_assert(kTopkThreadsValid<kThreads> && (kC == 1 || kThreads == kTopkThreads),
                "clusters run 512-thread CTAs (the launch shape and TopkExchange's 256 bin threads assume it)");
  const int len_up = (len + kThreads - 1) / kThreads * kThreads;
  int buf = 0;
#pragma unroll 1
  for (int shift = hi > 8 ? hi - 8 : 0, pass = 0;; shift = shift > 8 ? shift - 8 : 0, buf ^= 1, ++pass) {
    unsigned* h = hist[kC > 1 ? 0 : buf];  // a cluster's histogram is read locally only: one buffer
    if (pass > 0 || !first_counted) {
      if constexpr (kStaged4) {
        const int len4_up = ((len + 3) / 4 + kThreads - 1) / kThreads * kThreads;
        for (int i4 = tid; i4 < len4_up; i4 += kThreads) {
          const int i = 4 * i4;
          // the last partial four too, inside the slice's padding (three guarded word loads here
          // ran as one 12-byte read from the row's last key, 8 bytes past its staging: memcheck)
          uint4 q[1] = {make_uint4(0u, 0u, 0u, 0u)};
          if (i < len) q[0] = *reinterpret_cast<const uint4*>(staged + i);
          const unsigned m[1] = {topk_warp_match4<true>(q[0], i, len, mask, prefix)};
          if (__any_sync(0xffffffffu, m[0] != 0u)) warp_hist_add_keys<1>(h, q, m, shift, lane);
        }
      } else {
        for (int i = tid; i < len_up; i += kThreads) {
          const std::uint32_t key = i < len ? key_at(i) : 0u;
          const bool match = i < len && (key & mask) == prefix;
          warp_hist_add(h, (key >> shift) & 0xffu, match, lane);
        }
      }
    }
    __syncthreads();  // this CTA's histogram of the pass is complete
    const unsigned* hs = h;
    if constexpr (kC > 1) {
      // 256 threads each push one bin to every rank and sum it over the ranks, in rank order: every
      // rank gets identical sums; the bin is cleared for the next pass once pushed
      if (tid < 256) {
        const unsigned v = h[tid];
        h[tid] = 0;
        hsum[tid] = xch->exchange_bin(pass, crank, tid, v);
      }
      __syncthreads();
      hs = hsum;
    }
    if (warp == 0) {
      unsigned c[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) c[j] = hs[255 - 8 * lane - j];
      warp_threshold_bin(c, lane, krem, [&](const TopkPick& p) { pick.put(p); });
    } else if (kC == 1) {
      // warps 1.. clear the other buffer, last read in the previous pass (512 threads: threads
      // 256-511 one bin each, as before; fewer threads: a strided loop over the 256 bins)
      constexpr int kClear = kThreads - 256 >= 256 ? 256 : kThreads - 32;
      const int c0 = kThreads - 256 >= 256 ? tid - 256 : tid - 32;
      if (c0 >= 0)
        for (int i = c0; i < 256; i += kClear) hist[buf ^ 1][i] = 0;
    }
    __syncthreads();
    const TopkPick pk = pick.get();
    krem -= pk.above;
    prefix |= pk.digit << shift;
    mask |= 0xffu << shift;
    if (pk.count == krem || shift == 0) break;  // every key with this prefix is taken (uniform over the row)
  }
  return krem;
}

/// The compaction's placement rule (SPEC §4.6 order): a selected key of id `id` goes after the
/// selected keys of lower id — `gt_b` keys above K* and min(`eq_b`, `need`) of those equal to it —
/// if it is above K* (`greater`), or if it is one of the first `need` keys equal to K*; the count
/// of its class is advanced. Both compactions (ballots, block-scan tiles) place ids with it.
__device__ __forceinline__ void place_selected(std::int32_t* out, bool greater, std::int32_t id, unsigned& gt_b,
                                               unsigned& eq_b, unsigned need) {
  if (greater) {
    out[gt_b + (eq_b < need ? eq_b : need)] = id;
    ++gt_b;
  } else {
    if (eq_b < need) out[gt_b + eq_b] = id;
    ++eq_b;
  }
}

/// Compaction in id order of one CTA's row, or of one cluster rank's slice [lo, lo + len) of it
/// (starting from the lower ranks' carry_gt / carry_eq): writes the ids i of [0, len) (plus
/// `lo`) with (key & mask) > prefix, and the first `need` ids with (key & mask) == prefix, to
/// out[0, k) in ascending order, where position = (# such keys with a lower id, the equal ones
/// counted up to `need`). A round covers kThreads / 32 warp segments of S sub-blocks of 32
/// consecutive keys, S = min(32, ceil(len / kThreads)) (uniform: short rows walk short segments);
/// warp w takes segment w; for each sub-block it takes two ballots (greater, equal) and lane j
/// keeps sub-block j's masks, so one warp scan of their (packed) counts and one exchange of the
/// warps' totals in shared memory give every key its position: one barrier pair per round (16384
/// keys on 512 threads: one round) instead of a block scan per tile of 8 keys per thread.
/// Counts are packed (eq << 16) | gt: a round has at most 32768 keys (kThreads <= 1024).
/// carry_gt / carry_eq: the keys above / equal to K* with lower ids outside [lo, lo + len) (in a
/// cluster, the lower ranks' slices; 0 for a whole row).
template <int kThreads, class KeyAt>
__device__ __forceinline__ void compact_by_ballots(KeyAt key_at, int len, int lo, int k, std::uint32_t prefix,
                                                   std::uint32_t mask, unsigned need, std::int32_t* out,
                                                   unsigned carry_gt = 0, unsigned carry_eq = 0) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps * 32 * 32 < 65536, "compact_by_ballots: a round's counts must fit 16 bits");
  __shared__ unsigned s_warp_cnt[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = min(32, (len + kThreads - 1) / kThreads);  // sub-blocks per warp segment
  const int seg_keys = 32 * sub;
  // carry_gt / carry_eq: over the lower ranks and rounds (uniform)
  for (int base = 0; base < len; base += kWarps * seg_keys) {
    if (carry_gt + (carry_eq < need ? carry_eq : need) >= static_cast<unsigned>(k)) break;  // uniform
    const int seg = base + warp * seg_keys;
    unsigned my_gt = 0, my_eq = 0;  // lane j: the masks of keys seg + 32j .. seg + 32j + 31
#pragma unroll 8  // fully unrolled, the 32 loads of unstaged keys would outgrow the register bound
    for (int j = 0; j < sub; ++j) {
      const int i = seg + 32 * j + lane;
      const bool in = i < len;
      const std::uint32_t km = in ? key_at(i) & mask : 0u;
      const unsigned g = __ballot_sync(0xffffffffu, in && km > prefix);
      const unsigned e = __ballot_sync(0xffffffffu, in && km == prefix);
      if (lane == j) my_gt = g, my_eq = e;
    }
    const unsigned cnt = (static_cast<unsigned>(__popc(my_eq)) << 16) | static_cast<unsigned>(__popc(my_gt));
    const unsigned incl = warp_inclusive_sum(cnt, lane);
    if (lane == 31) s_warp_cnt[warp] = incl;
    __syncthreads();
    unsigned warp_before = 0, round_total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const unsigned v = s_warp_cnt[w];
      warp_before += w < warp ? v : 0u;
      round_total += v;
    }
    __syncthreads();  // s_warp_cnt is rewritten by the next round
    const unsigned before = warp_before + incl - cnt;
    unsigned gt_b = carry_gt + (before & 0xffffu), eq_b = carry_eq + (before >> 16);
    unsigned bits = my_gt | my_eq;
    while (bits != 0) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1;
      place_selected(out, (my_gt >> b) & 1u, lo + seg + 32 * lane + b, gt_b, eq_b, need);
    }
    carry_gt += round_total & 0xffffu;
    carry_eq += round_total >> 16;
  }
}

/// Owner masks of the one-CTA candidate selection of 512-thread CTAs with staged keys
/// (topk_select_kernel, kOwner): thread t owns the id-contiguous keys [32·W·t, 32·W·(t + 1)) of the
/// row, W = topk_owner_words(len) words of 32 keys; bit 4c + e of word w stands for key
/// 32·W·t + 32w + 4c + e. One sweep over the staged keys, once the threshold bin b* of the first
/// digit is known, sets `gt` (first digit above b*: taken whatever the remaining digits) and `cand`
/// (first digit == b*: the candidates); the candidates' gather and the id-order compaction then
/// work from the masks, without another pass over the keys (a warp scan per thread's run instead of
/// two ballots per key and a barrier pair per round: compact_by_ballots). Rows of at most
/// kTopkOwnerMaxWords · 32 · kTopkThreads keys (16384: 128K tokens) take it; one word per thread.
/// Three words (rows up to kTopkSmemKeys) spilled the instance at its 64 registers (ptxas 13.0: 28 /
/// 36 bytes); two compile without spills (rows up to 32768 keys) but were not measured.
inline constexpr int kTopkOwnerMaxWords = 1;
static_assert(kTopkOwnerMaxWords * 32 * kTopkThreads <= kTopkSmemKeys, "the owner masks cover staged keys only");
/// Words of 32 keys each thread of a kTopkThreads-thread CTA owns for a slice of `len` keys.
__host__ __device__ __forceinline__ constexpr int topk_owner_words(int len) {
  return (len + 32 * kTopkThreads - 1) / (32 * kTopkThreads);
}
struct TopkOwnerMasks {
  unsigned gt[kTopkOwnerMaxWords], cand[kTopkOwnerMaxWords];
};
/// Slice index of this thread's first owned key (`words` words of 32 keys per thread): the one
/// place of the layout above; bit b of word w is key topk_owner_base(words) + 32w + b.
__device__ __forceinline__ int topk_owner_base(int words) { return 32 * words * static_cast<int>(threadIdx.x); }
/// Classifies this thread's owned keys (see kTopkOwnerMaxWords) against the first-digit threshold
/// bin `bstar` (digit = key >> `shift`). The eight 16-byte chunks of a word are read in the
/// rotated order c = (j + t) mod 8: the lanes of a quarter warp, 128 bytes apart, then read eight
/// different bank groups (in plain order they would all hit the same four banks).
__device__ __forceinline__ TopkOwnerMasks topk_owner_classify(const std::uint32_t* skeys, int len, int words,
                                                               unsigned bstar, int shift) {
  TopkOwnerMasks m;
  const int base = topk_owner_base(words);
  // key >= lo_key: first digit >= b*; key >= hi_key: first digit > b* (none when b* is the top bin)
  const std::uint32_t lo_key = bstar << shift;
  const bool top_bin = (bstar + 1u) << shift == 0u;
  const std::uint32_t hi_key = top_bin ? 0xffffffffu : (bstar + 1u) << shift;
#pragma unroll
  for (int w = 0; w < kTopkOwnerMaxWords; ++w) {
    m.gt[w] = 0;
    m.cand[w] = 0;
    if (w < words) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = (j + static_cast<int>(threadIdx.x)) & 7;
        const int i0 = base + 32 * w + 4 * c;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (i0 + 4 <= len) {
          v = *reinterpret_cast<const uint4*>(skeys + i0);
        } else if (i0 < len) {  // the slice's last keys (any merged read stays in its padding: topk_slice_keys)
          v.x = skeys[i0];
          if (i0 + 1 < len) v.y = skeys[i0 + 1];
          if (i0 + 2 < len) v.z = skeys[i0 + 2];
        }
        const std::uint32_t kv[4] = {v.x, v.y, v.z, v.w};
        unsigned g4 = 0, c4 = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool in = i0 + e < len;
          const bool above = in && !top_bin && kv[e] >= hi_key;
          const bool in_bin = in && kv[e] >= lo_key && !above;
          g4 |= static_cast<unsigned>(above) << e;
          c4 |= static_cast<unsigned>(in_bin) << e;
        }
        m.gt[w] |= g4 << (4 * c);
        m.cand[w] |= c4 << (4 * c);
      }
    }
  }
  return m;
}
/// Appends this thread's candidates (the keys of its `cand` bits) to `cand_buf`: one shared-memory
/// atomic per warp on `pos` (the candidates' order in the buffer does not matter: the remaining
/// digits are resolved by histograms over them).
__device__ __forceinline__ void topk_owner_gather(const std::uint32_t* skeys, int words, const TopkOwnerMasks& m,
                                                  std::uint32_t* cand_buf, unsigned* pos) {
  const int lane = threadIdx.x & 31;
  const int base = topk_owner_base(words);
  unsigned mine = 0;
#pragma unroll
  for (int w = 0; w < kTopkOwnerMaxWords; ++w) mine += static_cast<unsigned>(__popc(m.cand[w]));
  const unsigned incl = warp_inclusive_sum(mine, lane);
  unsigned wbase = 0;
  if (lane == 31 && incl != 0) wbase = atomicAdd(pos, incl);
  wbase = __shfl_sync(0xffffffffu, wbase, 31);
  unsigned at = wbase + incl - mine;
#pragma unroll
  for (int w = 0; w < kTopkOwnerMaxWords; ++w) {
    unsigned bits = m.cand[w];
    while (bits != 0) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1;
      cand_buf[at++] = skeys[base + 32 * w + b];
    }
  }
}
/// The id-order compaction (SPEC §4.6 order, place_selected) of a one-CTA row from its owner masks,
/// once K* = (prefix, mask) and `need` are final: a `gt` key is taken; a candidate is taken where
/// (key & mask) > prefix, or == prefix among the first `need`. One block scan of the threads'
/// (equal, greater) counts gives each thread's offsets (`scan_tmp`: free, its last use a barrier
/// or more before). `lo`: the slice's first id (0 for a whole row).
template <int kThreads, class Scan>
__device__ __forceinline__ void topk_owner_compact(const std::uint32_t* skeys, int words, const TopkOwnerMasks& m,
                                                   std::uint32_t prefix, std::uint32_t mask, unsigned need,
                                                   typename Scan::TempStorage& scan_tmp, std::int32_t* out, int lo) {
  const int base = topk_owner_base(words);
  unsigned gt = 0, eq = 0;
#pragma unroll
  for (int w = 0; w < kTopkOwnerMaxWords; ++w) {
    gt += static_cast<unsigned>(__popc(m.gt[w]));
    unsigned bits = m.cand[w];
    while (bits != 0) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1;
      const std::uint32_t km = skeys[base + 32 * w + b] & mask;
      gt += km > prefix;
      eq += km == prefix;
    }
  }
  unsigned long long before;
  Scan(scan_tmp).ExclusiveSum((static_cast<unsigned long long>(eq) << 32) | gt, before);
  unsigned gt_b = static_cast<unsigned>(before & 0xffffffffu), eq_b = static_cast<unsigned>(before >> 32);
#pragma unroll
  for (int w = 0; w < kTopkOwnerMaxWords; ++w) {
    unsigned bits = m.gt[w] | m.cand[w];
    while (bits != 0) {
      const int b = __ffs(bits) - 1;
      bits &= bits - 1;
      const int i = base + 32 * w + b;
      if ((m.gt[w] >> b) & 1u) {
        place_selected(out, true, lo + i, gt_b, eq_b, need);
      } else {
        const std::uint32_t km = skeys[i] & mask;
        if (km > prefix) place_selected(out, true, lo + i, gt_b, eq_b, need);
        else if (km == prefix) place_selected(out, false, lo + i, gt_b, eq_b, need);
      }
    }
  }
}

/// One selection row per kC CTAs (kC = 1: one CTA; kC = kTopkCluster: a cluster, CTA rank c owns the
/// id-contiguous slice [c·S, (c+1)·S) of the row, S = ceil(n / kC)). kSmem: the slice's keys are
/// staged in dynamic shared memory (topk_slice_keys(ld, kC) keys), else re-read from global memory.
/// kCand (candidate compaction; kCand = false is the plain 4-pass radix select):
///   1. one sweep over the slice stages the keys and builds the histogram of their top
///      kTopkFirstBits bits (the first digit); the row's histogram (summed over the ranks in a
///      cluster) gives the threshold bin b*, its count `cnt` and the keys still to take `krem`;
///   2. if cnt == krem every key of b* is taken; else if cnt <= a.cand_cap, every rank appends the
///      keys of its slice in b* (the candidates) to the candidate buffer of every rank of the row
///      (at the offset of its rank: the lower ranks' counts of b*), and the remaining digits run as
///      CTA-local 8-bit radix passes over the cnt candidates (no cluster barrier; every rank gets
///      the same result since histograms do not depend on the order of the candidates);
///   3. else (too many candidates: plateaus, near-equal scores) the remaining digits run as the
///      plain radix passes over every key of the row.
/// Then K* = (prefix, mask) and `need` are the same as kCand = false's (both define the unique
/// first k of (key descending, id ascending)), and the compaction pass is shared — except on the
/// owner-mask path (kOwner with a.owner_masks, rows of at most 16384 keys): its candidates' gather
/// and compaction work from masks set by one classifying sweep (topk_owner_classify).
/// Dynamic shared memory: [topk_slice_keys(ld, kC) keys if kSmem][a.cand_cap candidate keys if kCand, unless
/// topk_cand_in_hist: then the candidates overwrite hfirst].
template <int kC, bool kSmem, bool kCand, int kThreads = kTopkThreads>
__global__ void __launch_bounds__(kThreads, kTopkMinCtas<kThreads>) topk_select_kernel(TopkArgs a) {
#if STEP5_SM90A_DEVICE
  static_assert(kTopkThreadsValid<kThreads> && (kC == 1 || kThreads == kTopkThreads),
                "CTA size: 128, 256 or 512 threads; clusters run 512");
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned hist[2][256];  // one CTA per row: double-buffered (cleared a pass ahead)
  __shared__ unsigned hsum[kC > 1 ? 256 : 1];  // cluster: the row's histogram (sum over ranks)
  __shared__ __align__(16) unsigned hfirst[kCand ? kTopkFirstBins : 1];  // kCand: first-digit histogram of the slice
  __shared__ TopkPickSlot pick;
  __shared__ unsigned s_cand_off, s_cand_pos;  // kCand: this rank's candidates' offset, and count so far
  __shared__ TopkExchange<kC> xch;  // kC > 1: the pushes' receive buffers and mbarriers
  extern __shared__ __align__(16) std::uint32_t skeys[];  // 16: the float4 staging of kCand

  const int r = static_cast<int>(blockIdx.x) / kC;
  const int crank = static_cast<int>(blockIdx.x) % kC;
  const int tid = threadIdx.x, lane = tid & 31;
  if constexpr (kC > 1) {
    // the exchange's mbarriers, then the arrival half of the cluster barrier that lets the other
    // ranks push to them; its wait comes after the staging sweep (below), or at once for a row
    // that fits
    if (tid == 0) xch.init();
    ptx::cluster_arrive_relaxed();
  }
  pdl_wait();  // the scores belong to the previous kernel
  __shared__ TopkRow s_row;  // the row's n and output row, read where used (topk_row)
  static_assert(sizeof scan_tmp + sizeof hist + sizeof hsum + sizeof hfirst + sizeof pick + 2 * sizeof s_cand_off +
                        sizeof xch + sizeof s_row + 32 * sizeof(unsigned) /* compact_by_ballots */ + 256 /* alignment */ <=
                    topk_static_smem_max(kC),
                "the launcher opts in to more dynamic shared memory above 48 KiB - topk_static_smem_max");
  if (tid == 0) s_row = topk_row(a, r);
  __syncthreads();
  // one volatile load: with a plain one, ptxas 13.0 gave the 256-thread staged radix instance 48
  // registers instead of 40 (and so one CTA per SM fewer); with the row computed by every
  // thread, the 128-thread staged candidate instance spilled
  const int n = *static_cast<volatile int*>(&s_row.n);
  const int k = n < a.topk ? n : a.topk;
  const int S = (n + kC - 1) / kC;
  const int lo = min(n, crank * S), len = min(n, lo + S) - lo;
  // the output row, read from shared memory where it is written (not held in registers through
  // the passes)
  const auto out_row = [&] { return a.ids + s_row.orow * a.ld_ids; };
  const float* src = a.scores + static_cast<std::int64_t>(r) * a.ld + lo;
  const auto key_at = [&](int i) -> std::uint32_t { return kSmem ? skeys[i] : score_key(src[i]); };

  std::uint32_t prefix = 0, mask = 0;
  unsigned need = 0;  // keys equal to the final prefix that are taken (lowest ids first)
  // kOwner: one 512-thread CTA per row with staged keys, candidates: the owner masks
  // (topk_owner_classify) serve the candidates' gather and the compaction; `owner_ready` (uniform)
  // once they are set and K* is resolved from the candidates
  constexpr bool kOwner = kC == 1 && kSmem && kCand && kThreads == kTopkThreads;
  TopkOwnerMasks owner;
  bool owner_ready = false;
  if (k == n) {  // everything fits: select all (mask 0: every key "equals" the prefix)
    need = static_cast<unsigned>(n);
    if constexpr (kC > 1) ptx::cluster_wait();  // every rank's mbarriers are initialised
  } else {
    const unsigned krem = static_cast<unsigned>(k);
    for (int i = tid; i < 512; i += kThreads) hist[i >> 8][i & 255] = 0;  // both buffers
    constexpr int kFirstShift = 32 - kTopkFirstBits;
    if constexpr (kCand) {
      for (int i = tid; i < kTopkFirstBins; i += kThreads) hfirst[i] = 0;
    }
    // the staging sweep below counts a first digit (kCand: hfirst; the radix select on staged keys:
    // its first pass, into hist[0]) into the buffers just cleared
    if constexpr (kCand || kSmem) __syncthreads();
    // kCand, or the radix select on one CTA's staged keys (kRadix4), with a 16-byte aligned slice:
    // the sweep below with float4 loads (a 16384-key slice is one round of loads in flight instead
    // of four; the first 4·floor(len/4) keys, the rest scalar)
    constexpr bool kRadix4 = !kCand && kSmem && kC == 1;
    bool vec = false;
    if constexpr (kCand || kRadix4) vec = (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0;
    const int len4 = vec ? len / 4 : 0;
    if constexpr (kCand || kRadix4) {
      // kCand on 512 threads: a 16384-key slice in one round; short-row CTAs, and the radix select
      // on any CTA size: 2048 keys per round (fewer registers: more CTAs per SM; ptxas 13.0 keeps
      // every radix instance at its registers before this sweep: 32 / 40 / 40 on 512 / 256 / 128)
      constexpr int kStage4 = kCand && kThreads == kTopkThreads ? 8 : 2048 / (4 * kThreads);
      for (int base = 0; base < len4; base += kThreads * kStage4) {
        float4 v[kStage4];
#pragma unroll
        for (int j = 0; j < kStage4; ++j) {
          const int i4 = base + j * kThreads + tid;
          v[j] = i4 < len4 ? reinterpret_cast<const float4*>(src)[i4] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < kStage4; ++j) {
          const int i4 = base + j * kThreads + tid;
          const bool in = i4 < len4;
          const uint4 key = make_uint4(score_key(v[j].x), score_key(v[j].y), score_key(v[j].z), score_key(v[j].w));
          if (kSmem && in) reinterpret_cast<uint4*>(skeys)[i4] = key;
          if constexpr (kCand) {
            warp_hist_add(hfirst, key.x >> kFirstShift, in, lane);
            warp_hist_add(hfirst, key.y >> kFirstShift, in, lane);
            warp_hist_add(hfirst, key.z >> kFirstShift, in, lane);
            warp_hist_add(hfirst, key.w >> kFirstShift, in, lane);
          } else {  // radix_refine's first pass (first_counted)
            const uint4 qa[1] = {key};
            const unsigned m[1] = {in ? 0xfu : 0u};
            warp_hist_add_keys<1>(hist[0], qa, m, kTopkRadixHi - 8, lane);
          }
        }
      }
    }
    if constexpr (kSmem || kCand) {
      // one sweep over [4·len4, len): stage the slice's keys (kSmem) and count their first digits
      // (kCand: the top kTopkFirstBits bits; else the radix select's first 8-bit digit, which
      // radix_refine then does not count again); kStage independent loads in flight per thread
      constexpr int kStage = 8;
      const int rest = len - 4 * len4;
      const float* src_rest = src + 4 * len4;
      std::uint32_t* skeys_rest = skeys + 4 * len4;
      for (int base = 0; base < rest; base += kThreads * kStage) {
        float v[kStage];
#pragma unroll
        for (int j = 0; j < kStage; ++j) {
          const int i = base + j * kThreads + tid;
          v[j] = i < rest ? src_rest[i] : 0.f;
        }
#pragma unroll
        for (int j = 0; j < kStage; ++j) {
          const int i = base + j * kThreads + tid;
          const std::uint32_t key = score_key(v[j]);
          if (kSmem && i < rest) skeys_rest[i] = key;
          if constexpr (kCand) warp_hist_add(hfirst, key >> kFirstShift, i < rest, lane);
          else warp_hist_add(hist[0], key >> (kTopkRadixHi - 8), i < rest, lane);  // radix_refine's first pass (first_counted)
        }
      }
    }
    __syncthreads();
    if constexpr (kC > 1) ptx::cluster_wait();  // every rank's mbarriers are initialised
    if constexpr (!kCand) {
      need = radix_refine<kC, kThreads, kRadix4>(key_at, len, kTopkRadixHi, prefix, mask, krem, hist, hsum, pick,
                                                 &xch, crank, /*first_counted=*/kSmem, skeys);
    } else {
      row_sync<kC>();  // every rank's first-digit histogram is complete
      // threshold bin: thread t holds kPer bins, counted from the top (summed over the ranks in rank order)
      constexpr int kPer = kTopkFirstBins >= kThreads ? kTopkFirstBins / kThreads : 1;
      unsigned c[kPer], s = 0;
      if constexpr (kC == 1 && kPer % 4 == 0 && kThreads != kTopkThreads) {
        // short-row CTAs: this thread's kPer bins are the contiguous [lo_bin, lo_bin + kPer):
        // 16-byte loads (a stride of kPer words would put up to 16 lanes on one bank); 512 threads
        // keep the loop below, the code their GPU tests ran
        const int lo_bin = kTopkFirstBins - (tid + 1) * kPer;
#pragma unroll
        for (int v = 0; v < kPer / 4; ++v) {
          const uint4 q = reinterpret_cast<const uint4*>(hfirst + lo_bin)[v];
          c[kPer - 1 - 4 * v] = q.x;  // bin lo_bin + 4v
          c[kPer - 2 - 4 * v] = q.y;
          c[kPer - 3 - 4 * v] = q.z;
          c[kPer - 4 - 4 * v] = q.w;
        }
#pragma unroll
        for (int j = 0; j < kPer; ++j) s += c[j];
      } else {
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const int bin = kTopkFirstBins - 1 - (tid * kPer + j);
          c[j] = 0;
          if (bin >= 0) {
#pragma unroll
            for (int q = 0; q < kC; ++q) c[j] += rank_smem<kC>(hfirst, q)[bin];
          }
          s += c[j];
        }
      }
      unsigned long long before;
      Scan(scan_tmp).ExclusiveSum(static_cast<unsigned long long>(s), before);
      unsigned above = static_cast<unsigned>(before);
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (above < krem && above + c[j] >= krem)
          pick.put({static_cast<unsigned>(kTopkFirstBins - 1 - (tid * kPer + j)), above, c[j]});
        above += c[j];
      }
      __syncthreads();
      const TopkPick pk = pick.get();
      const unsigned krest = krem - pk.above, cnt = pk.count;
      prefix = pk.digit << kFirstShift;
      mask = ~0u << kFirstShift;
      if (cnt == krest) {
        need = krest;  // every key of the threshold bin is taken
      } else if (cnt <= static_cast<unsigned>(a.cand_cap)) {
        std::uint32_t* cand = topk_cand_in_hist(kC, kThreads, a.cand_cap) ? hfirst : skeys + (kSmem ? topk_slice_keys(a.ld, kC) : 0);
        if (kOwner && a.owner_masks != 0 && topk_owner_words(len) <= kTopkOwnerMaxWords) {  // uniform
          // owner masks: one classifying sweep; the gather and the compaction below work from them
          if (tid == 0) s_cand_pos = 0;
          owner = topk_owner_classify(skeys, len, topk_owner_words(len), pk.digit, kFirstShift);
          __syncthreads();  // s_cand_pos
          topk_owner_gather(skeys, topk_owner_words(len), owner, cand, &s_cand_pos);
          __syncthreads();  // the candidates
          need = radix_refine<1, kThreads>([&](int i) { return cand[i]; }, static_cast<int>(cnt), kFirstShift, prefix,
                                           mask, krest, hist, hsum, pick, static_cast<TopkExchange<1>*>(nullptr), 0);
          owner_ready = true;
        } else {
        if (tid == 0) {
          unsigned off = 0;
          for (int q = 0; q < crank; ++q) off += rank_smem<kC>(hfirst, q)[pk.digit];
          s_cand_off = off;
          s_cand_pos = 0;
        }
        __syncthreads();
        const int len_up = (len + kThreads - 1) / kThreads * kThreads;
        for (int i = tid; i < len_up; i += kThreads) {
          const std::uint32_t key = i < len ? key_at(i) : 0u;
          const bool match = i < len && (key & mask) == prefix;
          const unsigned ballot = __ballot_sync(0xffffffffu, match);
          if (ballot != 0) {
            unsigned wbase = 0;
            if (lane == 0) wbase = atomicAdd(&s_cand_pos, static_cast<unsigned>(__popc(ballot)));
            wbase = __shfl_sync(0xffffffffu, wbase, 0);
            if (match) {
              const unsigned pos = s_cand_off + wbase + __popc(ballot & ((1u << lane) - 1u));
#pragma unroll
              for (int q = 0; q < kC; ++q) rank_smem<kC>(cand, q)[pos] = key;
            }
          }
        }
        row_sync<kC>();  // every rank's candidate buffer holds the row's cnt candidates
        need = radix_refine<1, kThreads>([&](int i) { return cand[i]; }, static_cast<int>(cnt), kFirstShift, prefix, mask,
                               krest, hist, hsum, pick, static_cast<TopkExchange<1>*>(nullptr), 0);
        }
      } else {
        need = radix_refine<kC, kThreads>(key_at, len, kFirstShift, prefix, mask, krest, hist, hsum, pick, &xch, crank);
      }
    }
  }

  pdl_launch_dependents();
  // compaction in id order: selected = (key & mask) > prefix, or == prefix among the first `need`
  const bool staged = kSmem && k != n;
  if constexpr (kOwner) {
    if (owner_ready) {
      __syncthreads();  // as measured (scan_tmp's last use, the threshold scan, is several barriers back)
      topk_owner_compact<kThreads, Scan>(skeys, topk_owner_words(len), owner, prefix, mask, need, scan_tmp, out_row(), lo);
    }
  }
  unsigned long long carry = 0;  // (eq << 32) | gt over lower ids
  if constexpr (kC > 1) {
    unsigned gt = 0, eq = 0;
    for (int i = tid; i < len; i += kThreads) {
      const std::uint32_t km = (staged ? skeys[i] : score_key(src[i])) & mask;
      gt += km > prefix;
      eq += km == prefix;
    }
    unsigned long long before, total;
    Scan(scan_tmp).ExclusiveSum((static_cast<unsigned long long>(eq) << 32) | gt, before, total);
    carry = xch.lower_totals(crank, total);  // pushed to every rank; the lower ranks' summed
  }
  // CTAs of 256 or 512 threads: the ballot compaction, in a cluster from the lower ranks' totals
  // (measured on the H200, bench_indexer: one CTA per row, seventh session, 64 / 512 decode rows of
  // 16384 regions 17.0 / 43.5 -> 14.0 / 36.8 µs, 4096 rows of ld 8192 on 256 threads 159.6 ->
  // 116.9 µs; clusters, fifteenth session, 64 rows of 131072 regions 85.9 -> 78.5 µs (radix) and
  // 104.5 -> 97.5 (candidates), 64 rows of 16384 30.2 -> 29.2); 128-thread CTAs (short prefill
  // rows: 65536 rows of ld 2048 took 461 -> 581 µs with it) keep the block-scan tiles below
  if constexpr (kThreads != kTopkShortThreads) {
    if (!owner_ready)  // uniform
      compact_by_ballots<kThreads>([&](int i) { return staged ? skeys[i] : score_key(src[i]); }, len, lo, k, prefix,
                                   mask, need, out_row(), static_cast<unsigned>(carry & 0xffffffffu),
                                   static_cast<unsigned>(carry >> 32));
  } else {
    static_assert(kC == 1, "the block-scan compaction serves one 128-thread CTA per row (carry stays 0)");
    constexpr int kTile = kThreads * kTopkItems;
    for (int base = 0; base < len; base += kTile) {
      const unsigned sel_before = static_cast<unsigned>(carry & 0xffffffffu) +
                                  (static_cast<unsigned>(carry >> 32) < need ? static_cast<unsigned>(carry >> 32) : need);
      if (sel_before >= static_cast<unsigned>(k)) break;  // uniform: carry is the same in every thread
      const int first = base + tid * kTopkItems;
      unsigned gt_bits = 0, eq_bits = 0;
      static_assert(kTopkItems == 8, "a thread's staged keys of a tile are two 16-byte loads");
      if (kSmem && staged && first + kTopkItems <= len) {
        const uint4 u0 = *reinterpret_cast<const uint4*>(skeys + first);
        const uint4 u1 = *reinterpret_cast<const uint4*>(skeys + first + 4);
        const std::uint32_t km[kTopkItems] = {u0.x & mask, u0.y & mask, u0.z & mask, u0.w & mask,
                                              u1.x & mask, u1.y & mask, u1.z & mask, u1.w & mask};
#pragma unroll
        for (int j = 0; j < kTopkItems; ++j) {
          gt_bits |= static_cast<unsigned>(km[j] > prefix) << j;
          eq_bits |= static_cast<unsigned>(km[j] == prefix) << j;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kTopkItems; ++j) {
          const int i = first + j;
          if (i < len) {
            const std::uint32_t km = (staged ? skeys[i] : score_key(src[i])) & mask;
            if (km > prefix) gt_bits |= 1u << j;
            else if (km == prefix) eq_bits |= 1u << j;
          }
        }
      }
      const unsigned long long mine =
          (static_cast<unsigned long long>(__popc(eq_bits)) << 32) | static_cast<unsigned long long>(__popc(gt_bits));
      unsigned long long before, total;
      __syncthreads();  // scan_tmp reuse
      Scan(scan_tmp).ExclusiveSum(mine, before, total);
      before += carry;
      unsigned gt_b = static_cast<unsigned>(before & 0xffffffffu), eq_b = static_cast<unsigned>(before >> 32);
      std::int32_t* const out = out_row();
      if ((total >> 32) == 0) {
        // uniform: no key of the tile equals K* (the usual tile): each key above it goes after the
        // greater keys with lower ids and the equal ones taken before the tile (place_selected's
        // position with eq_b fixed)
        unsigned p = gt_b + (eq_b < need ? eq_b : need);
#pragma unroll
        for (int j = 0; j < kTopkItems; ++j)
          if ((gt_bits >> j) & 1u) out[p++] = lo + first + j;
      } else {
#pragma unroll
        for (int j = 0; j < kTopkItems; ++j) {
          if (gt_bits & (1u << j)) place_selected(out, true, lo + first + j, gt_b, eq_b, need);
          else if (eq_bits & (1u << j)) place_selected(out, false, lo + first + j, gt_b, eq_b, need);
        }
      }
      carry += total;
    }
  }
  if (crank == 0) {
    std::int32_t* const out = out_row();
    for (int j = k + tid; j <= a.topk; j += kThreads) out[j] = j == k ? n : -1;
    if (tid == 0) a.counts[s_row.orow] = k + 1;
  }
  // no CTA exits while another may still read its shared memory (the candidates' first-digit
  // histograms) or a push it issued may be in flight (an execution barrier: no fence waits for the
  // id stores above)
  if constexpr (kC > 1) ptx::cluster_sync_before_exit();
#endif
}

/// One WARP per selection row (threads per row kTopkWarpThreads; kTopkWarpRows rows per CTA), for
/// short rows (issue 15's prefill: n = position / 8 regions; launch_topk's rule topk_cta_threads,
/// kTopkWarpMaxLd). The same selection as topk_select_kernel's radix select — the same K*
/// (prefix, mask), `need` and output, bit for bit (the first k of (key descending, id ascending)
/// is unique) — without a CTA barrier: on a short row the one-CTA kernel's barriers, block-wide
/// picks and scans per pass cost as much as its keys. Each warp, along the steps of the CTA kernel:
///   1. stages its row in its own slice of the dynamic shared memory (kSmem): one bulk copy of the
///      first 4·floor(n/4) scores when the row is 16-byte aligned (one memory round trip per row,
///      completion on the warp's mbarrier), converted to keys in place; the rest (the last n % 4,
///      or the whole row when it is not aligned, or every key when !kSmem) through registers; the
///      first 8-bit digit (key >> 24) of every key is counted into the warp's 256-bin histogram
///      in the same sweep (warp_hist_add_keys: one vote per 8 keys of a lane in the bulk-staged
///      sweep, 4 or 16 in the register one, then one atomic per key, or one per warp where every
///      key has one digit). !kSmem (rows too long for kTopkWarpRows slices, reached only when a
///      launch forces the warp rows) re-reads the keys from global memory in every later sweep;
///   2. picks the threshold bin with one warp scan (lane l holds bins 255 − 8l − j, j < 8, as
///      radix_refine's warp 0) and clears its bins; while the bin holds more keys than remain to
///      take, the next 8-bit digit is counted over the keys with the prefix (8 keys per lane per
///      step; a warp vote skips the step's atomics where no key has the prefix) and picked again;
///   3. compacts in id order, 256 keys per step (lane l: keys 4l .. 4l + 3 and 128 + 4l .. 131 + 4l
///      of the step: conflict-free 16-byte shared-memory loads), with one warp scan of the lanes'
///      packed (greater, equal) counts per step (place_selected: SPEC §4.6 order; a step with no
///      key equal to K*, the usual one, writes its greater keys' ids at consecutive positions);
///   Steps whose 256 ids are all below n skip the per-key id tests (only the row's last step tests).
///   4. writes the current region n after the k ids, −1 padding, and count k + 1.
/// Keys are accessed four at a time (`topk_warp_keys4`: i a multiple of 4; keys at i + j >= n
/// are undefined and masked by the caller). Dynamic shared memory: kTopkWarpRows ×
/// topk_warp_stage_keys(ld) keys when kSmem, so the slices bound the rows in flight per SM on
/// longer strides (ld 4096: 3 CTAs, 12 rows; see kTopkWarpMaxLd).
/// float4 loads in flight per lane where a whole row is swept through registers (!kSmem).
inline constexpr int kTopkWarpLoads = 4;
/// __launch_bounds__ minimum CTAs per SM (ptxas -v, CUDA 13.0: 39 registers staged, 48 not, no
/// spills; at 12 the unstaged instance spills 32 bytes, the staged one fits 40 registers — not
/// measured): 40 rows in flight where the slices allow (ld <= 1024).
inline constexpr int kTopkWarpMinCtas = 10;
/// Keys of one warp's shared-memory slice for rows of stride `ld` (topk_staged_keys(ld): every
/// slice is 16-byte aligned), or 0 when kTopkWarpRows slices would pass kTopkSmemKeys keys (the
/// launch then re-reads the keys from global memory: kSmem = false).
__host__ __device__ constexpr std::int64_t topk_warp_stage_keys(std::int64_t ld) {
  const std::int64_t s = topk_staged_keys(ld);
  return s * kTopkWarpRows <= kTopkSmemKeys ? s : 0;
}

/// The keys i .. i + 3 (i a multiple of 4) of a row of n scores at `src` (`vec`: src is 16-byte
/// aligned), from the staged slice `keys` (kSmem) or converted from global memory; keys at or past
/// n read as 0 (never loaded).
template <bool kSmem>
__device__ __forceinline__ uint4 topk_warp_keys4(const std::uint32_t* keys, const float* src, bool vec, int i, int n) {
  if constexpr (kSmem) {
    return i < n ? *reinterpret_cast<const uint4*>(keys + i) : make_uint4(0u, 0u, 0u, 0u);
  } else {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (vec && i + 4 <= n) {
      v = *reinterpret_cast<const float4*>(src + i);
    } else {
      if (i < n) v.x = src[i];
      if (i + 1 < n) v.y = src[i + 1];
      if (i + 2 < n) v.z = src[i + 2];
      if (i + 3 < n) v.w = src[i + 3];
    }
    return make_uint4(i < n ? score_key(v.x) : 0u, i + 1 < n ? score_key(v.y) : 0u, i + 2 < n ? score_key(v.z) : 0u,
                      i + 3 < n ? score_key(v.w) : 0u);
  }
}

/// Greater / equal bits (bit j: key i + j; when kTail, only ids < n) of four keys against
/// K* = (prefix, mask).
template <bool kTail>
__device__ __forceinline__ void topk_warp_classify4(uint4 q, int i, int n, std::uint32_t mask, std::uint32_t prefix,
                                                    unsigned& gt, unsigned& eq) {
  const std::uint32_t k4[4] = {q.x & mask, q.y & mask, q.z & mask, q.w & mask};
  gt = 0;
  eq = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool in = !kTail || i + j < n;
    gt |= static_cast<unsigned>(in && k4[j] > prefix) << j;
    eq |= static_cast<unsigned>(in && k4[j] == prefix) << j;
  }
}

template <bool kSmem>
__global__ void __launch_bounds__(kTopkWarpRows * kTopkWarpThreads, kTopkWarpMinCtas) topk_warp_rows_kernel(TopkArgs a, int rows,
                                                                                          int stage_keys) {
#if STEP5_SM90A_DEVICE
  __shared__ __align__(16) unsigned hist[kTopkWarpRows][256];
  __shared__ std::uint64_t wbar[kTopkWarpRows];  // kSmem: each warp's staging copy
  extern __shared__ __align__(16) std::uint32_t wkeys[];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int r = static_cast<int>(blockIdx.x) * kTopkWarpRows + warp;
  pdl_wait();  // the scores belong to the previous kernel
  if (r >= rows) return;  // the last CTA's spare warps (no CTA barrier follows)
  TopkRow row{0, 0};
  if (lane == 0) row = topk_row(a, r);
  const int n = __shfl_sync(0xffffffffu, row.n, 0);
  const std::int64_t orow = __shfl_sync(0xffffffffu, static_cast<long long>(row.orow), 0);
  const int k = n < a.topk ? n : a.topk;
  std::int32_t* const out = a.ids + orow * a.ld_ids;
  std::uint32_t prefix = 0, mask = 0;
  unsigned need = static_cast<unsigned>(n);  // k == n: every id (mask 0: every key equals the prefix)
  std::uint32_t* const keys = wkeys + static_cast<std::int64_t>(warp) * stage_keys;
  const float* const src = a.scores + static_cast<std::int64_t>(r) * a.ld;
  const bool vec = (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0;
  if (k != n) {
    unsigned* const h = hist[warp];
    // 1. clear the histogram (lane l: bins 8l .. 8l + 7), stage the keys, count the first digit
    reinterpret_cast<uint4*>(h)[2 * lane] = make_uint4(0u, 0u, 0u, 0u);
    reinterpret_cast<uint4*>(h)[2 * lane + 1] = make_uint4(0u, 0u, 0u, 0u);
    __syncwarp();
    int staged = 0;  // keys [0, staged) staged and counted by the bulk copy below
    if constexpr (kSmem) {
      // a 16-byte aligned row: one bulk copy of its first 4·floor(n/4) scores into the slice (one
      // memory round trip per row), then converted in place and counted; the last n % 4 below
      const int n4 = vec ? n / 4 : 0;
      if (n4 > 0) {
        if (lane == 0) {
          ptx::mbar_init(&wbar[warp], 1);
          ptx::fence_mbarrier_init_cluster();
          ptx::mbar_arrive_expect_tx(&wbar[warp], static_cast<unsigned>(n4) * 16u);
          ptx::bulk_copy_g2s(ptx::smem_u32(keys), src, static_cast<std::uint32_t>(n4) * 16u, &wbar[warp]);
        }
        __syncwarp();
        ptx::mbar_wait(&wbar[warp], 0);
        staged = 4 * n4;
        for (int base = 0; base < staged; base += 256) {
          uint4 q[2];
          unsigned m[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int i = base + 128 * c + 4 * lane;
            q[c] = make_uint4(0u, 0u, 0u, 0u);
            m[c] = 0u;
            if (i < staged) {  // staged is a multiple of 4: the four keys are all in the row
              const float4 v = *reinterpret_cast<const float4*>(keys + i);
              q[c] = make_uint4(score_key(v.x), score_key(v.y), score_key(v.z), score_key(v.w));
              *reinterpret_cast<uint4*>(keys + i) = q[c];
              m[c] = 0xfu;
            }
          }
          warp_hist_add_keys<2>(h, q, m, kTopkRadixHi - 8, lane);
        }
      }
    }
    // the keys not bulk-copied (all of them without kSmem, or in a row that is not 16-byte aligned;
    // else the last n % 4), through registers: kLoads float4 loads in flight per lane
    constexpr int kLoads = kSmem ? 1 : kTopkWarpLoads;
    constexpr int kStep = 4 * 32 * kLoads;
    for (int base = staged; base < n; base += kStep) {
      uint4 q[kLoads];
      unsigned m[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) q[j] = topk_warp_keys4<false>(nullptr, src, vec, base + 128 * j + 4 * lane, n);
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int i = base + 128 * j + 4 * lane;
        if (kSmem && i < n) *reinterpret_cast<uint4*>(keys + i) = q[j];
        m[j] = topk_warp_match4<true>(q[j], i, n, 0u, 0u);
      }
      warp_hist_add_keys<kLoads>(h, q, m, kTopkRadixHi - 8, lane);
    }
    __syncwarp();
    // 2. the digit passes: pick the threshold bin; while it holds more keys than remain to take,
    //    count the next digit over the keys with the prefix
    unsigned krem = static_cast<unsigned>(k);
#pragma unroll 1
    for (int shift = kTopkRadixHi - 8;; shift -= 8) {
      if (shift != kTopkRadixHi - 8) {
        for (int base = 0; base < n; base += 256) {
          const int i0 = base + 4 * lane, i1 = i0 + 128;
          const uint4 q[2] = {topk_warp_keys4<kSmem>(keys, src, vec, i0, n),
                              topk_warp_keys4<kSmem>(keys, src, vec, i1, n)};
          unsigned m[2];
          if (base + 256 <= n) {  // uniform: every id of the step is in the row
            m[0] = topk_warp_match4<false>(q[0], i0, n, mask, prefix);
            m[1] = topk_warp_match4<false>(q[1], i1, n, mask, prefix);
          } else {
            m[0] = topk_warp_match4<true>(q[0], i0, n, mask, prefix);
            m[1] = topk_warp_match4<true>(q[1], i1, n, mask, prefix);
          }
          if (__any_sync(0xffffffffu, (m[0] | m[1]) != 0u)) warp_hist_add_keys<2>(h, q, m, shift, lane);
        }
        __syncwarp();
      }
      // lane l: bins 255 - 8l - j (j < 8), the highest first; read, then cleared for the next pass
      uint4* const h4 = reinterpret_cast<uint4*>(h);
      const uint4 u1 = h4[63 - 2 * lane], u0 = h4[62 - 2 * lane];
      h4[63 - 2 * lane] = make_uint4(0u, 0u, 0u, 0u);
      h4[62 - 2 * lane] = make_uint4(0u, 0u, 0u, 0u);
      const unsigned c[8] = {u1.w, u1.z, u1.y, u1.x, u0.w, u0.z, u0.y, u0.x};
      TopkPick pk{0u, 0u, 0u};
      bool found = false;
      warp_threshold_bin(c, lane, krem, [&](const TopkPick& p) {
        found = true;
        pk = p;
      });
      const int from = __ffs(__ballot_sync(0xffffffffu, found)) - 1;
      const unsigned pd = __shfl_sync(0xffffffffu, pk.digit, from);
      const unsigned pa = __shfl_sync(0xffffffffu, pk.above, from);
      const unsigned pc = __shfl_sync(0xffffffffu, pk.count, from);
      krem -= pa;
      prefix |= pd << shift;
      mask |= 0xffu << shift;
      if (pc == krem || shift == 0) break;  // every key with this prefix is taken (uniform over the warp)
      __syncwarp();  // every lane's bins are cleared before the next pass adds to them
    }
    need = krem;
  }
  pdl_launch_dependents();
  if (k != n) {
    // 3. compaction in id order: selected = (key & mask) > prefix, or == prefix among the first `need`
    unsigned gt_c = 0, eq_c = 0;  // over the earlier steps
    for (int base = 0; base < n; base += 256) {
      if (gt_c + (eq_c < need ? eq_c : need) >= static_cast<unsigned>(k)) break;  // uniform
      const int i0 = base + 4 * lane, i1 = i0 + 128;
      unsigned g0, e0, g1, e1;
      const uint4 q0 = topk_warp_keys4<kSmem>(keys, src, vec, i0, n), q1 = topk_warp_keys4<kSmem>(keys, src, vec, i1, n);
      if (base + 256 <= n) {  // uniform: every id of the step is in the row
        topk_warp_classify4<false>(q0, i0, n, mask, prefix, g0, e0);
        topk_warp_classify4<false>(q1, i1, n, mask, prefix, g1, e1);
      } else {
        topk_warp_classify4<true>(q0, i0, n, mask, prefix, g0, e0);
        topk_warp_classify4<true>(q1, i1, n, mask, prefix, g1, e1);
      }
      // packed counts (8 bits each: a field sums at most 4 keys of 32 lanes): greater / equal of
      // the first 128 keys, then of the second 128
      const unsigned cnt = static_cast<unsigned>(__popc(g0)) | static_cast<unsigned>(__popc(e0)) << 8 |
                           static_cast<unsigned>(__popc(g1)) << 16 | static_cast<unsigned>(__popc(e1)) << 24;
      const unsigned incl = warp_inclusive_sum(cnt, lane);
      const unsigned total = __shfl_sync(0xffffffffu, incl, 31), before = incl - cnt;
      const unsigned tg0 = total & 0xffu, te0 = (total >> 8) & 0xffu;
      if (__any_sync(0xffffffffu, (e0 | e1) != 0u)) {  // uniform: a key of the step equals K*
        unsigned gt_b = gt_c + (before & 0xffu), eq_b = eq_c + ((before >> 8) & 0xffu);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if ((g0 >> j) & 1u) place_selected(out, true, i0 + j, gt_b, eq_b, need);
          else if ((e0 >> j) & 1u) place_selected(out, false, i0 + j, gt_b, eq_b, need);
        }
        gt_b = gt_c + tg0 + ((before >> 16) & 0xffu);
        eq_b = eq_c + te0 + (before >> 24);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if ((g1 >> j) & 1u) place_selected(out, true, i1 + j, gt_b, eq_b, need);
          else if ((e1 >> j) & 1u) place_selected(out, false, i1 + j, gt_b, eq_b, need);
        }
      } else {
        // only keys above K*: each goes after the greater keys with lower ids and the equal ones
        // taken before this step (place_selected's position with eq_b = eq_c throughout)
        const unsigned taken_eq = eq_c < need ? eq_c : need;
        unsigned p = gt_c + (before & 0xffu) + taken_eq;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if ((g0 >> j) & 1u) out[p++] = i0 + j;
        p = gt_c + tg0 + ((before >> 16) & 0xffu) + taken_eq;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if ((g1 >> j) & 1u) out[p++] = i1 + j;
      }
      gt_c += tg0 + ((total >> 16) & 0xffu);
      eq_c += te0 + (total >> 24);
    }
  }
  // 4. the current region after the k ids (k == n: the ids 0 .. n - 1 first), −1 padding, the count
  for (int j = (k == n ? 0 : k) + lane; j <= a.topk; j += 32) out[j] = j < k ? j : j == k ? n : -1;
  if (lane == 0) a.counts[orow] = k + 1;
#endif
}

/// Launch shape of the selection kernel: `rows` rows of kc CTAs (a cluster when kc > 1) of
/// `threads` threads, `smem` dynamic bytes.
inline LaunchShape topk_launch_shape(int rows, int kc, int smem, int threads = kTopkThreads) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(rows) * static_cast<unsigned>(kc));
  s.block = dim3(static_cast<unsigned>(threads));
  s.smem = static_cast<std::size_t>(smem);
  s.cluster_x = static_cast<unsigned>(kc);
  return s;
}

/// Lets `kernel` use up to kTopkSmemKeys keys of dynamic shared memory. Always the same value, so
/// launches from several host threads never lower each other's limit.
template <class Kernel>
inline ::step5::Status topk_allow_smem(Kernel kernel) {
  return ::step5::cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTopkSmemKeys * 4),
      "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of a top-k kernel");
}

/// Whether clusters of kTopkCluster selection CTAs can be resident on device `dev`
/// (cudaOccupancyMaxActiveClusters > 0; partitions with fewer SMs per GPC, e.g. some MIG or green
/// contexts, cannot). Cached per device.
inline ::step5::Status topk_clusters_available(int dev, bool* available) {
  static std::atomic<int> cache[64];  // 0 unknown, 1 yes, 2 no
  if (dev >= 0 && dev < 64) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c != 0) {
      *available = c == 1;
      return ::step5::Status::Ok();
    }
  }
  auto kernel = topk_select_kernel<kTopkCluster, true, false>;
  STEP5_RETURN_IF_ERROR(topk_allow_smem(kernel));
  auto kernel_cand = topk_select_kernel<kTopkCluster, true, true>;
  STEP5_RETURN_IF_ERROR(topk_allow_smem(kernel_cand));
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = make_launch_config(topk_launch_shape(1, kTopkCluster, kTopkSmemKeys * 4), nullptr,
                                                    false, attr);
  int clusters = 0, clusters_cand = 0;
  STEP5_CUDA_RETURN(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  STEP5_CUDA_RETURN(cudaOccupancyMaxActiveClusters(&clusters_cand, kernel_cand, &cfg));
  clusters = clusters < clusters_cand ? clusters : clusters_cand;  // both algorithms, or neither
  *available = clusters > 0;
  if (dev >= 0 && dev < 64) cache[dev].store(clusters > 0 ? 1 : 2, std::memory_order_relaxed);
  return ::step5::Status::Ok();
}

// TopkAlgo and STEP5_TOPK's parse live in the host header step5/ops/indexer.hpp (the layer
// checks the variable before it launches anything).
using ::step5::ops::TopkAlgo;
using ::step5::ops::topk_algo_from_env;

/// Rows at least this long (the launch's ld, keys per row) take candidate compaction on one CTA
/// per row (topk_default_algo); shorter rows keep the radix passes.
inline constexpr std::int64_t kTopkCandMinKeys = 16384;
/// The built-in choice for a launch of `cluster_size` CTAs per row over rows of `ld` keys. Measured
/// on the H200 (bench_indexer, 2026-12-01, bench/RESULTS.md): one CTA per row of 16384 regions,
/// candidates 16.6 / 16.9 / 43.2 µs against radix 22.1 / 22.3 / 60.2 µs at 16 / 64 / 512 rows
/// (131072 regions: 148 against 341 µs); on a cluster of 8 per row radix wins (11.5 / 30.0 / 85.5
/// µs against 28.9 / 79.6 / 103 before the clusters' ballot compaction, 11.4 / 29.2 / 78.5 against
/// 28.6 / 79.5 / 97.5 with it, fifteenth session: the candidates are broadcast to every rank over DSMEM and each
/// rank re-runs the later digits). On short rows the candidates' 2048-bin first digit costs more
/// than it saves: with candidates everywhere, indexer_prefill 16384 tokens without history (rows
/// of <= 2048 regions) spent ~2020 µs outside its scores (2497 - 474) against ~1275 with radix
/// (1922 - 647, the previous run), and bench_layer's prefill selection took 929 / 6751 µs (tp 1,
/// 8K / 32K tokens) against 711 / 6057 with radix and slower scores. Hence candidates on one CTA per row
/// from kTopkCandMinKeys keys on (decode at >= 128K context), radix elsewhere (test_topk checks
/// the two bit-identical; STEP5_TOPK=radix|candidates forces one).
inline constexpr TopkAlgo topk_default_algo(int cluster_size, std::int64_t ld) {
  return cluster_size == 1 && ld >= kTopkCandMinKeys ? TopkAlgo::kCandidates : TopkAlgo::kRadix;
}

/// Short rows (issue 15, prefill: n = position / 8, so ld <= 2048 at 16K tokens; the shortest take
/// the warp rows first, kTopkWarpMaxLd): a 512-thread CTA
/// pays the same barriers and scans for 2048 keys as for 16384, and only 2 fit on an SM (60-64
/// registers); smaller CTAs put more rows in flight (ptxas -v, CUDA 13.0: 256 threads 48 registers,
/// 5 CTAs per SM; 128 threads 40 registers, 11-12 CTAs per SM at ld <= 4096). Measured on the H200
/// (bench_indexer topk/radix_cta<T>/rows:R/ld:L, 2026-12-01, bench/RESULTS.md), radix, µs for
/// 128 / 256 / 512 threads: ld 2048 × 65536 rows 461 / 631 / 1252; ld 4096 × 16384 rows 225 / 260
/// / 406; ld 8192 × 4096 rows 148 / 121 / 160 (candidates slower at every one of these sizes). The
/// measured rule: 128 threads up to kTopkShortMaxLd, 256 up to kTopkMidMaxLd, 512 beyond
/// (test_topk runs every pattern on each size against the reference, bit-identical to 512).
inline constexpr std::int64_t kTopkShortMaxLd = 4096;
inline constexpr std::int64_t kTopkMidMaxLd = 8192;

/// Whether the one-CTA candidate selection of 512 threads with staged keys takes the owner masks
/// (topk_owner_classify) for its candidates' gather and compaction: where the launch has at most
/// one row per SM. Measured on an H100 (bench/RESULTS.md, thirty-third session, bench_indexer A/B
/// in one call, µs): with the masks on every row count (call 4), 1 / 16 / 64 rows of 16384
/// regions 14.2 / 14.9 / 15.6 -> 11.3 / 11.8 / 12.0, but indexer_decode at 128K tp 1 batch 64 (256
/// rows, two CTAs per SM) 139.8 -> 147.7 (cause not isolated); with this rule (call 5), 1 / 64
/// rows 14.2 / 15.4 -> 11.1 / 11.8, indexer_decode tp 1 batch 16 (64 rows) 51.7 -> 48.0, tp 8 batch
/// 64 127.6 -> 124.4, tp 1 batch 64 138.8 -> 136.7, 512 rows unchanged.
inline constexpr bool topk_owner_masks_pay(int rows, int sms) { return rows <= sms; }

/// Rows of at most this stride take one warp per row (topk_warp_rows_kernel) with the radix select.
/// Measured on an H100 (bench/RESULTS.md, forty-fourth session, bench_indexer prefill-shaped rows
/// whose n ramps from 0 to ld, µs, warp rows with the bulk staging against 128-thread CTAs in one
/// binary): 32768 rows of ld 1024 89.4 against 150.8 (0.59), 65536 of ld 2048 388.7 against
/// 469.2 (0.83), 16384 of ld 4096 311.5 against 223.6 (1.39: the slices leave 12 rows in flight
/// per SM), 4096 of ld 8192 395.3 against 147.8. bench_layer's prefill selection stage (scores +
/// top-k, µs): tp 1 8K 247.1 -> 193.4, tp 8 8K 78.5 -> 73.9; the 32K rows (ld 4096) unchanged.
inline constexpr std::int64_t kTopkWarpMaxLd = 2048;
/// ... and only where the launch has at least this many rows per SM: a warp takes a row longer than
/// a 128-thread CTA does, which pays where many waves of rows queue for the SMs, not where a few
/// rows (a decode step at a short context) or about one wave are the whole launch. Measured on an
/// H100 (forty-fourth session, call 3, full rows of 2047-2048 keys, µs, warp rows against
/// 128-thread CTAs): 16 rows 24.7 / 10.8, 128 rows 25.7 / 10.8, 512 rows 27.3 / 14.3, 1024 rows
/// 29.5 / 18.0, 4096 rows (31 per SM) 65.7 / 52.9; the warp rows win from 62 rows per SM on
/// (bench_layer tp 8 8K prefill, 8192 rows of ld 1024: selection 78.5 -> 73.9 µs) and on the
/// prefill-shaped launches above (248 and 496 rows per SM). 48 lies between 31 and 62. Every
/// measured win has ramped rows (a chunk without history: a quarter to a half of the rows need no
/// selection); launches whose rows all need one at more than 31 rows per SM (a chunk after a
/// history at ld <= 2048, e.g. 8K tokens after 8K) take the warp rows unmeasured
/// (bench_indexer's topk/…/rows:8192/ld:2048/from:2047 and rows:16384/ld:2048/from:1024 are
/// there to measure them).
inline constexpr int kTopkWarpMinRowsPerSm = 48;

/// Threads per row of a launch of `rows` rows on `sms` SMs with `cluster_size` CTAs per row (1 or
/// kTopkCluster), row stride (longest row) `ld` and algorithm `algo` (resolved; the arguments of
/// topk_default_algo): the one place the short-row rule lives. Host-callable (tests).
inline constexpr int topk_cta_threads(int cluster_size, std::int64_t ld, TopkAlgo algo, long long rows, int sms) {
  if (cluster_size != 1) return kTopkThreads;
  if (ld <= kTopkWarpMaxLd && algo == TopkAlgo::kRadix && rows >= static_cast<long long>(kTopkWarpMinRowsPerSm) * sms)
    return kTopkWarpThreads;
  return ld <= kTopkShortMaxLd ? kTopkShortThreads : ld <= kTopkMidMaxLd ? kTopkMidThreads : kTopkThreads;
}

/// Launches the selection kernel over `rows` rows. cluster_size: 1 (one CTA per row),
/// kTopkCluster (a cluster per row), or 0 to choose: a cluster when the row's keys do not fit one
/// CTA's shared memory (ld > kTopkSmemKeys), or when the rows are few and long (ld >= 4096 and
/// rows · kTopkCluster <= 2 · SMs, e.g. decode); else one CTA per row. Measured on the H200 with
/// kRadix (bench_indexer, 16384-region rows): 16 rows, cluster 12.2 µs against 22.5 µs for one CTA
/// per row; 64 rows, 30.2 µs against 22.8 µs; 131072-region rows (64), cluster 84 µs against 335 µs
/// (fifteenth session, clusters with the ballot compaction: 16 rows 11.4 µs, 64 rows 29.2 µs,
/// 131072-region rows 78.5 µs; one CTA per row with candidates 13.4 / 13.9 µs at 16 / 64 rows).
/// The same rule serves both algorithms (kCandidates on one CTA per row is faster than radix on
/// a cluster at 64 rows, but slower at 16: 16.6 against 11.5 µs).
/// Where clusters cannot be resident (topk_clusters_available) the choice is one CTA per row, and a
/// forced cluster_size = kTopkCluster returns kUnsupported.
/// algo: TopkAlgo (kDefault reads STEP5_TOPK). cand_cap (kCandidates; tests): the most candidates
/// kept, clamped to [0, kTopkCandKeys], to ld (a row never has more candidates than regions) and to
/// the shared memory left next to the staged keys; −1 = as many as fit; 0 = always the full passes.
/// threads (tests, benchmarks): threads per row, 0 = topk_cta_threads(cluster size, a.ld, algorithm,
/// rows, SMs); 32 forces one warp per row (topk_warp_rows_kernel, radix only: with the candidate
/// algorithm, asked for or from STEP5_TOPK, kInvalidArgument), 128 or 256 one CTA per row
/// (cluster_size 0 or 1); 512 is the only size of a cluster launch.
/// With PDL on (ops/pdl.hpp) the launch takes it as `ops::topk_launch_uses_pdl` says (not for one
/// 512-thread CTA per row on at most one row per SM: measured faster in the layer's graph replays).
/// Errors: kInvalidArgument (cluster_size, threads, STEP5_TOPK, rows x CTAs per row past grid.x),
/// kCudaError (a failed query or launch).
inline ::step5::Status launch_topk(const TopkArgs& a, int rows, cudaStream_t stream, int cluster_size = 0,
                                   TopkAlgo algo = TopkAlgo::kDefault, int cand_cap = -1, int threads = 0) {
  if (cluster_size != 0 && cluster_size != 1 && cluster_size != kTopkCluster)
    return ::step5::invalid_argument("launch_topk: cluster_size = " + std::to_string(cluster_size) +
                                     ", expected 0, 1 or " + std::to_string(kTopkCluster));
  if (threads != 0 && std::find(std::begin(kTopkCtaSizes), std::end(kTopkCtaSizes), threads) == std::end(kTopkCtaSizes))
    return ::step5::invalid_argument("launch_topk: threads = " + std::to_string(threads) + ", expected 0, " +
                                     std::to_string(kTopkWarpThreads) + ", " + std::to_string(kTopkShortThreads) +
                                     ", " + std::to_string(kTopkMidThreads) + " or " + std::to_string(kTopkThreads));
  if (threads != 0 && threads != kTopkThreads) {
    if (cluster_size == kTopkCluster)
      return ::step5::invalid_argument("launch_topk: threads = " + std::to_string(threads) + " with cluster_size = " +
                                       std::to_string(kTopkCluster) + " (clusters run " +
                                       std::to_string(kTopkThreads) + "-thread CTAs)");
    cluster_size = 1;
  }
  if (threads == kTopkWarpThreads) {  // the warp rows run the radix select only (even for no rows)
    const bool from_env = algo == TopkAlgo::kDefault;
    if (from_env) STEP5_RETURN_IF_ERROR(topk_algo_from_env(std::getenv("STEP5_TOPK"), &algo));
    if (algo == TopkAlgo::kCandidates)
      return ::step5::invalid_argument("launch_topk: threads = " + std::to_string(kTopkWarpThreads) +
                                       " (one warp per row) with " +
                                       (from_env ? "STEP5_TOPK = candidates" : "the candidate algorithm") +
                                       "; the warp rows run the radix select only");
    algo = TopkAlgo::kRadix;
  }
  if (rows <= 0) return ::step5::Status::Ok();
  if (algo == TopkAlgo::kDefault) STEP5_RETURN_IF_ERROR(topk_algo_from_env(std::getenv("STEP5_TOPK"), &algo));
  int dev = 0, sms = 0;  // (both cached by the runtime / device_sm_count: no device round trip)
  STEP5_CUDA_RETURN(cudaGetDevice(&dev));
  STEP5_RETURN_IF_ERROR(::step5::device_sm_count(dev, &sms));
  if (cluster_size != 1) {
    bool clusters = false;
    STEP5_RETURN_IF_ERROR(topk_clusters_available(dev, &clusters));
    if (!clusters && cluster_size == kTopkCluster)
      return ::step5::unsupported("launch_topk: cluster_size = " + std::to_string(kTopkCluster) +
                                  " requested, but clusters of " + std::to_string(kTopkCluster) +
                                  " CTAs cannot be resident on device " + std::to_string(dev));
    if (cluster_size == 0) {
      const bool few_long_rows = a.ld >= 4096 && static_cast<long long>(rows) * kTopkCluster <= 2LL * sms;
      cluster_size = clusters && (a.ld > kTopkSmemKeys || few_long_rows) ? kTopkCluster : 1;
    }
  }
  if (static_cast<long long>(rows) * cluster_size > kMaxGridDimX)  // grid.x = rows x cluster_size
    return ::step5::invalid_argument("topk_select: rows = " + std::to_string(rows) + " with " +
                                     std::to_string(cluster_size) + " CTAs per row, expected <= " +
                                     std::to_string(kMaxGridDimX / cluster_size) + " (grid.x)");
  if (algo == TopkAlgo::kDefault) algo = topk_default_algo(cluster_size, a.ld);
  if (threads == 0) threads = topk_cta_threads(cluster_size, a.ld, algo, rows, sms);
  if (threads == kTopkWarpThreads) {  // one warp per row (radix: checked above)
    const std::int64_t stage = topk_warp_stage_keys(a.ld);
    const int wsmem = static_cast<int>(stage * kTopkWarpRows * 4);
    auto kernel = stage > 0 ? topk_warp_rows_kernel<true> : topk_warp_rows_kernel<false>;
    if (wsmem > 48 * 1024 - topk_static_smem_max(1)) STEP5_RETURN_IF_ERROR(topk_allow_smem(kernel));
    LaunchShape shape;
    shape.grid = dim3(static_cast<unsigned>((rows - 1) / kTopkWarpRows + 1));  // rows > 0 (no int overflow near INT_MAX)
    shape.block = dim3(static_cast<unsigned>(kTopkWarpRows * kTopkWarpThreads));
    shape.smem = static_cast<std::size_t>(wsmem);
    shape.pdl = ::step5::ops::topk_launch_uses_pdl(1, kTopkWarpRows * kTopkWarpThreads, rows, sms);
    return launch_kernel("topk_warp_rows_kernel launch", kernel, shape, stream, a, rows, static_cast<int>(stage));
  }
  const std::int64_t slice = topk_slice_keys(a.ld, cluster_size);
  const bool smem_keys = slice <= kTopkSmemKeys;
  const bool cand = algo == TopkAlgo::kCandidates;
  TopkArgs args = a;
  args.cand_cap = 0;
  args.owner_masks = topk_owner_masks_pay(rows, sms) ? 1 : 0;
  if (cand) {
    // the candidates share the dynamic shared memory limit (kTopkSmemKeys keys) with the staged keys;
    // a row has at most ld candidates (n <= ld), so a cap above ld would only cost shared memory
    const int room = kTopkSmemKeys - (smem_keys ? static_cast<int>(slice) : 0);
    int cap = cand_cap < 0 ? kTopkCandKeys : cand_cap;
    cap = cap < kTopkCandKeys ? cap : kTopkCandKeys;
    cap = static_cast<std::int64_t>(cap) < a.ld ? cap : static_cast<int>(a.ld);
    args.cand_cap = cap < room ? cap : room;
  }
  const int cand_keys = topk_cand_in_hist(cluster_size, threads, args.cand_cap) ? 0 : args.cand_cap;
  const int smem = ((smem_keys ? static_cast<int>(slice) : 0) + cand_keys) * 4;
  auto launch = [&](auto kernel, int kc) -> ::step5::Status {
    if (smem > 48 * 1024 - topk_static_smem_max(kc)) STEP5_RETURN_IF_ERROR(topk_allow_smem(kernel));  // static counts too
    LaunchShape shape = topk_launch_shape(rows, kc, smem, threads);
    shape.pdl = ::step5::ops::topk_launch_uses_pdl(kc, threads, rows, sms);  // few 512-thread rows: no PDL
    return launch_kernel("topk_select_kernel launch", kernel, shape, stream, args);
  };
  // one CTA of kT threads per row
  auto launch_cta = [&](auto kt) -> ::step5::Status {
    constexpr int kT = decltype(kt)::value;
    if (cand)
      return smem_keys ? launch(topk_select_kernel<1, true, true, kT>, 1) : launch(topk_select_kernel<1, false, true, kT>, 1);
    return smem_keys ? launch(topk_select_kernel<1, true, false, kT>, 1) : launch(topk_select_kernel<1, false, false, kT>, 1);
  };
  constexpr int kC = kTopkCluster;
  if (cluster_size == kC) {  // 512 threads (checked above)
    if (cand)
      return smem_keys ? launch(topk_select_kernel<kC, true, true>, kC) : launch(topk_select_kernel<kC, false, true>, kC);
    return smem_keys ? launch(topk_select_kernel<kC, true, false>, kC) : launch(topk_select_kernel<kC, false, false>, kC);
  }
  if (threads == kTopkShortThreads) return launch_cta(std::integral_constant<int, kTopkShortThreads>{});
  if (threads == kTopkMidThreads) return launch_cta(std::integral_constant<int, kTopkMidThreads>{});
  return launch_cta(std::integral_constant<int, kTopkThreads>{});
}

}  // namespace step5::kernels::sm90
