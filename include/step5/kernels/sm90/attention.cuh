#pragma once
/// \file step5/kernels/sm90/attention.cuh
/// Device code of the DSA sparse GQA attention + head-wise gate (SPEC.md §4 steps 7–8), sm_90a.
/// Host API: step5/ops/attention.hpp. Instantiated per geometry row by src/instances/attention.cu.in.
///
/// `sparse_attention_kernel<D, HPG, NS, WGT, ONE_Q>`: one CTA (4 warps) per (query tile, local KV
/// group, split). Plans of one-query tiles (decode, plan.query_tile == 1) launch the ONE_Q
/// instance, which holds only steps 1, 2', 4 (list loop) and 5.
/// The kernel body is the list of steps, each one `__device__ __forceinline__` function of
/// attn_detail:
///  1. `locate_tile`: tiles are `query_tile` consecutive queries of one request (a warp scan
///     over cu_seqlens_q); CTAs beyond the last tile exit.
///  2. `build_region_bitmaps`: one region bitmap per query of the tile from its first `count`
///     topk ids (ids outside [0, p/R] or the block table are ignored; entries after count are
///     never read); `build_union_prefix`: their union and its word prefix counts (shared memory).
///     U = union size.
///  2'. Tiles of one query (nq == 1: decode) skip the bitmaps: `build_region_list` takes the
///     split's share of the query's own selection row (`split_union` over its first `count`
///     entries) and resolves every entry's region id and cache row up front in one parallel pass
///     (invalid ids / blocks are masked, as on the bitmap path); `prepare_stage` then reads only
///     shared memory. The Q fragments and the rows' gate logits are loaded before step 2 so that
///     their loads overlap it; the one-query instance issues them and the selection row's loads
///     (`load_region_list_row`) for token `tile` even before step 1 (a one-query tile is that token
///     when cu_seqlens_q starts at 0; step 1 confirms it, else they are loaded again).
///  2''. A tile of several queries with one split whose union is large against its queries' own
///     selections (`uses_per_query_gathers`: ops::attention_per_query_pays on the union's stages
///     and the queries' region counts from step 2a, or forced by tile_gather) runs its queries
///     one after the other as tiles of one query (`attend_queries_in_turn`: steps 2', 4, 5) and
///     ends there: gathering the union for all rows would cost more than each query's own regions.
///  3. `split_union`: the union's stages are dealt out evenly over the splits; split s gathers
///     union ordinals [u0, u1) in stages of 8 regions
///     (R = layout::kRegionSize) = 64 tokens; the ordinals' region ids and cache rows are resolved
///     64 at a time, once per region (`prefetch_chunk` / `store_chunk`: the union search and the
///     block-table loads, into a ring of two chunks), `prepare_stage` writes the stage's token
///     cache rows and per-(query, region) masks from them, `gather_stage` issues its cp.async
///     copies of K and V (a ring of NS stages, NS =
///     plan.stages from `ops::sparse_attention_plan`; a stage is D/64 column blocks of 64 rows x
///     128 bytes in the 128B swizzle, `swz`); tokens past the tile's last position (not yet
///     written) are zero-filled, never read.
///  4. Rows = (query, head) pairs, 16 per warp (mma.sync m16n8k16 bf16, fp32 accumulation;
///     `load_q_fragments`). With 64 rows each warp owns 16 rows and all 64 tokens of a stage; with
///     fewer rows (decode) the warps split the stage's tokens and are merged in the epilogue.
///     `attend_stages` runs the ring loop; per stage `qk_mma`, `online_softmax` (mask:
///     the row's query selected the token's region and position <= the query's position; exp2
///     domain; a running max that moves only by more than kRescaleSlack; row sums of fp32 P) and
///     `pv_mma` (P rounded to bf16 before P·V). 64-row tiles of
///     the WGT = plan.wgmma_tiles instance (head_dim 128 / 192) run as one warpgroup on wgmma
///     instead: `qk_wgmma_issue` (A = the same Q fragments in registers, B = the K stage),
///     `pv_wgmma_issue` (A = bf16(P) in registers, B = the V stage, N-major); a due chunk's loads
///     are issued while Q·Kᵀ runs, and the stage NS ahead is prepared while P·V runs. One-query tiles
///     run their own instance of the loop (LIST: no union-path code).
///  5. Epilogue: `stash_warp_partials` + `merge_warps_and_store` merge the warps of a row through
///     shared memory; with one split they write bf16(o), the gate and the LSE
///     (`store_gated_output`); else the normalised fp32 partial and its log2-LSE go to the
///     workspace and `merge_if_last_split` elects, by an arrival counter per (tile, KV group), the
///     last split CTA to finish, which combines the splits in split order (`split_weights`,
///     `merge_splits`, `store_gated_output`) and resets the counter to 0 for the next launch.
///     With plan.cluster_merge (num_splits <= ops::kAttentionMaxClusterSplits) the split CTAs of a
///     (tile, KV group) are one thread-block cluster: the partials stay in shared memory and
///     `cluster_merge_splits` has every CTA merge a 1/S share through distributed shared memory
///     (same weights, same split order: the same bits as the last-arriver merge). The one-query
///     instance (every decode tile) pushes each element of its partial and each row's LSE into the
///     shared memory of the CTA that merges it (st.async, one mbarrier: `cluster_merge_pushed`)
///     instead of a release cluster barrier and remote loads; the same sums.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <type_traits>

#include "step5/kernels/sm90/bounds_fault.cuh"
#include "step5/kernels/sm90/pdl.cuh"
#include "step5/kernels/sm90/ptx.cuh"
#include "step5/kernels/sm90/wgmma.cuh"
#include "step5/layout/geometry.hpp"  // kRegionSize
#include "step5/ops/attention.hpp"      // kAttentionMaxSplits

namespace step5::kernels::sm90 {

/// Device-side arguments (POD), filled by the launcher from `ops::SparseAttentionParams`.
struct SparseAttentionArgs {
  const __nv_bfloat16* q;
  long long q_stride;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  int kv_heads;
  int num_blocks;
  int block_size;
  const int* block_table;
  int max_blocks;
  std::int32_t* bounds_fault;  ///< checked-mode record (bounds_fault.cuh) or null
  const int* cu_seqlens;
  const int* seq_lens;
  int num_requests;
  int num_tokens;
  const int* topk_ids;
  const int* counts;
  int topk;
  const __nv_bfloat16* gate;
  long long gate_stride;
  __nv_bfloat16* out;
  long long out_stride;
  float* lse;
  int num_local_heads;
  float scale_log2;  ///< softmax scale * log2(e)
  int query_tile;
  int num_splits;
  int cluster_merge;       ///< num_splits > 1: the split CTAs form a cluster (1, 1, num_splits) and merge in shared
                           ///< memory (DSMEM loads; the one-query instance: st.async pushes)
  int tile_gather;         ///< multi-query tiles, one split: 0 auto (attention_per_query_pays), 1 union, 2 per query
  int bitmap_words;
  float* ws_o;             ///< [max_tiles, lg, splits, 64, D] normalised partial outputs
  float* ws_lse;           ///< [max_tiles, lg, splits, 64] log2-domain LSE of the partials
  unsigned* ws_counters;   ///< [max_tiles, lg] split arrival counters, zero between launches
};

namespace attn_detail {

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kTileTok = 64;
constexpr int kMaxQ = 16;  // max queries per tile (64 rows / hpg 4)
/// Tokens per region (SPEC §1): a region's token mask is one byte, and its tokens are one n8
/// column block of the QK mma, so the kernel is written for R = 8.
constexpr int kRegion = ::step5::layout::kRegionSize;
constexpr int kRegionLog2 = ::step5::layout::kRegionLog2;
static_assert(kRegion == 8, "sparse_attention_kernel: one mask byte and one m16n8 column block per region");
constexpr int kStageRegions = kTileTok / kRegion;  // regions gathered per stage
constexpr int kStageRegionsLog2 = std::countr_zero(static_cast<unsigned>(kStageRegions));
constexpr int kMaxSplits = ::step5::ops::kAttentionMaxSplits;  // columns of the merge's weight table
constexpr int kChunkRegions = ::step5::ops::kAttentionChunkRegions;  // union regions resolved at a time
constexpr int kChunkStages = kChunkRegions / kStageRegions;            // the ring stages of one chunk
static_assert(kChunkRegions % kStageRegions == 0 && kChunkRegions <= kThreads, "one thread per region of a chunk");
static_assert(sizeof(int2) == ::step5::ops::kAttentionChunkEntryBytes, "a chunk entry is {region id, cache row}");
constexpr int kChunkSlots = ::step5::ops::kAttentionChunkSlots;
static_assert((kChunkSlots & (kChunkSlots - 1)) == 0, "chunk_slot: a power of two");
/// Chunk k lives in ring slot chunk_slot(k) = k % kChunkSlots (k >= 0), so entry e = kChunkRegions
/// * k + t of the split's share is at chunk_entry(e) = chunk_slot(k) * kChunkRegions + t.
__device__ __forceinline__ int chunk_slot(int k) { return k & (kChunkSlots - 1); }
__device__ __forceinline__ int chunk_entry(int e) { return e % (kChunkSlots * kChunkRegions); }

using namespace ::step5::kernels::sm90::ptx;  // cp.async, ldmatrix, mma.sync (ptx.cuh)

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
/// Element offset of (token row, 16-byte chunk) in a [64][D] stage (D a multiple of 64): D / 64
/// column blocks of 64 rows x 128 bytes, 8 KiB apart; inside a block, chunk c of row r sits at
/// chunk position c ^ (r % 8) (the 128B swizzle of wgmma.cuh, `sw128_offset`). A stage is thus a
/// wgmma operand as it stands (K-major for Q·Kᵀ, `make_desc_sw128`; N-major for P·V,
/// `make_desc_sw128_nmajor`), and an ldmatrix of 8 rows at one chunk reads 8 distinct bank groups.
constexpr int kBlockCols = 64;                        // bf16 columns of a stage's column block (128 bytes)
constexpr int kBlockElems = kTileTok * kBlockCols;     // elements of a column block
constexpr int kRowBytes = kBlockCols * 2;              // bytes of a row of a column block
constexpr int kBlockBytes = kTileTok * kRowBytes;      // bytes of a column block (8 KiB)
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return (chunk >> 3) * kBlockElems + row * kBlockCols + (((chunk & 7) ^ (row & 7)) << 3);
}
/// Whether the 64-row tiles (one warpgroup, TG == 1) can run Q·Kᵀ and P·V on wgmma: the head dims
/// with an m64nDk16 instruction here (wgmma.cuh).
template <int D>
inline constexpr bool kWgmmaTiles = ops::attention_wgmma_head_dim(D);

/// Shared state of one CTA (static part).
struct SmemStatic {
  int tile_b, tile_t0, tile_nq, tile_valid, tile_pos0;  // pos of query i = tile_pos0 + i
  int last_split;                          // this CTA arrived last of its (tile, group): it merges
  int qcount[kMaxQ];                       // distinct valid regions selected by each query of the tile (bitmap path)
  int scan[kWarps];
  float m[kWarps][16];
  float l[kWarps][16];
};

/// Shared state of the ring stages (static part; the K/V rows are dynamic, SmemPtrs): NS + 1
/// metadata slots for the NS K/V slots, so that a stage's metadata is prepared while two others
/// are still read (attend_stages: one barrier per stage).
template <int NS>
struct StageMeta {
  static constexpr int kSlots = ops::attention_meta_slots(NS);
  // cache row ((block * block_size + slot) * kv_heads + g) of a gathered token, -1 = zero-fill
  int tok_row[kSlots][kTileTok];
  // per (query, region of the stage): token bits; 8-byte aligned rows (load_mask_bits reads a row at once)
  alignas(8) unsigned char mask[kSlots][kMaxQ][kStageRegions];
};

/// The region id of union ordinal k (k < U).
__device__ __forceinline__ int select_region(const std::uint32_t* ubits, const int* prefix, int words, int k) {
  int lo = 0, hi = words - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= k) lo = mid;
    else hi = mid - 1;
  }
  std::uint32_t bits = ubits[lo];
  for (int r = k - prefix[lo]; r > 0; --r) bits &= bits - 1;
  return lo * 32 + __ffs(bits) - 1;
}

}  // namespace attn_detail

/// The gate value of SPEC §4 step 8 from the bf16 gate logit x: bf16(sigmoid(x)).
__device__ __forceinline__ float gate_value(__nv_bfloat16 x) {
  return __bfloat162float(__float2bfloat16_rn(1.f / (1.f + expf(-__bfloat162float(x)))));
}

/// See the file comment. Grid (max_tiles, lg, num_splits), 128 threads, dynamic smem from the plan.
/// Output of token t, local head h, columns [d4, d4 + 4) (SPEC §4 step 8, as the reference):
/// out = bf16(bf16(o) · gv) with gv = `gate_value(gate[t, h])` (1 without a gate tensor; read once
/// per row up front), and the
/// LSE in natural log from its log2-domain value `lse2` (column 0 writes it, when requested).
template <int D>
__device__ __forceinline__ void store_gated_output(const SparseAttentionArgs& a, int t, int h, int d4, float4 o,
                                                   float lse2, float gv) {
  __nv_bfloat16 ob[4];
  const float ov[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) ob[e] = __float2bfloat16_rn(__bfloat162float(__float2bfloat16_rn(ov[e])) * gv);
  *reinterpret_cast<uint2*>(a.out + t * a.out_stride + static_cast<long long>(h) * D + d4) =
      *reinterpret_cast<const uint2*>(ob);
  if (d4 == 0 && a.lse != nullptr)
    a.lse[static_cast<long long>(t) * a.num_local_heads + h] = lse2 * 0.69314718055994531f;
}

namespace attn_detail {

/// The tile of one CTA and its share of the union of selected regions (steps 1–3).
struct TileWork {
  int b, t0, nq, pos0, pos_last;  ///< request, first packed token, queries, positions of the first/last query
  int g;                          ///< local KV group (blockIdx.y)
  int words;                      ///< 32-bit words of one region bitmap
  int u0, u1, ntiles;             ///< union ordinals (list path: row entries) [u0, u1) of this split, stages
  bool list;                      ///< one query (nq == 1): the region-list path (step 2'), no bitmaps
};

/// Dynamic shared memory of one CTA (plan.smem_bytes).
struct SmemPtrs {
  __nv_bfloat16* sK;      ///< [NS][D/64][64][64] K stages (`swz`)
  __nv_bfloat16* sV;      ///< [NS][D/64][64][64] V stages
  std::uint32_t* qbits;   ///< [QT][words] region bitmap per query
  std::uint32_t* ubits;   ///< [words] their union
  int* prefix;            ///< [words + 1] set bits of ubits before each word
  int* reg_id;            ///< list path: [topk + 1] region id per entry of the split's share (-1: ignored); aliases qbits
  int* reg_row;           ///< list path: [topk + 1] the cache row of its first token (-1: not read)
  int2* chunk;            ///< union path: [slots][kChunkRegions] {region id, first token's cache row} (store_chunk)
  float* gate;            ///< [64] bf16(sigmoid(gate)) per tile row (1 without a gate), after the metadata
};

/// Online-softmax state of this thread's two rows (lo = lane/4, hi = lane/4 + 8 of the warp's 16):
/// running max (log2 domain) and row sum of fp32 P.
struct SoftmaxState {
  float m_lo, m_hi, l_lo, l_hi;
};

/// Step 1 (warp 0): finds tile `tile` — query_tile consecutive queries of one request — by a warp
/// scan over cu_seqlens_q; writes ss.tile_* (tile_valid stays 0 past the last tile). Each lane
/// loads its request's seq_lens next to its cu_seqlens_q entries (one round trip, not two).
__device__ __forceinline__ void locate_tile(const SparseAttentionArgs& a, SmemStatic& ss, int tile, int lane) {
  const int QT = a.query_tile;
  if (lane == 0) ss.tile_valid = 0;
  __syncwarp();
  int base = 0;
  for (int b0 = 0; b0 < a.num_requests; b0 += 32) {
    const int b = b0 + lane;
    int ql = 0, sl = 0;
    if (b < a.num_requests) {
      ql = max(0, a.cu_seqlens[b + 1] - a.cu_seqlens[b]);
      sl = a.seq_lens[b];
    }
    const int nt = (ql + QT - 1) / QT;
    int inc = nt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += v;
    }
    const int excl = inc - nt;
    const bool hit = b < a.num_requests && tile >= base + excl && tile < base + inc;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (hit) {
      const int j = tile - base - excl;
      const int c0 = a.cu_seqlens[b];
      ss.tile_b = b;
      ss.tile_t0 = c0 + j * QT;
      ss.tile_nq = min(QT, ql - j * QT);
      ss.tile_pos0 = sl - ql + j * QT;
      ss.tile_valid = 1;
    }
    if (ballot) break;
    base += __shfl_sync(0xffffffffu, inc, 31);
  }
}

/// Step 2a: one region bitmap per query of the tile from its first `count` topk ids (ids outside
/// [0, p/R], past the bitmap or after count are ignored), and ss.qcount[i], the number of distinct
/// regions in query i's bitmap (for the choice of step 2''). Ends with a barrier.
__device__ __forceinline__ void build_region_bitmaps(const SparseAttentionArgs& a, const SmemPtrs& sp, SmemStatic& ss,
                                                     const TileWork& w, int tid) {
  const int words = w.words, nq = w.nq;
  for (int i = tid; i < (nq + 1) * words; i += kThreads) sp.qbits[i] = 0u;  // qbits rows 0..nq-1 + ubits when nq == QT
  for (int i = tid; i < words; i += kThreads) sp.ubits[i] = 0u;
  if (tid < kMaxQ) ss.qcount[tid] = 0;
  __syncthreads();
  const int T = a.num_tokens;
  const int W = a.topk + 1;
  const int max_region = words * 32;
  for (int idx = tid; idx < nq * W; idx += kThreads) {
    const int i = idx / W, k = idx - i * W;
    const long long row = static_cast<long long>(w.g) * T + (w.t0 + i);
    const int cnt = min(max(a.counts[row], 0), W);
    if (k < cnt) {
      const int id = a.topk_ids[row * W + k];
      const int cur = (w.pos0 + i) >> kRegionLog2;
      if (id >= 0 && id <= cur && id < max_region) {
        const std::uint32_t bit = 1u << (id & 31);
        if ((atomicOr(&sp.qbits[i * words + (id >> 5)], bit) & bit) == 0u) atomicAdd(&ss.qcount[i], 1);
      }
    }
  }
  __syncthreads();
}

/// Step 2b: the union of the tile's bitmaps and its word prefix counts (prefix[words] = U, the
/// union size). Ends with a barrier.
__device__ __forceinline__ void build_union_prefix(const SmemPtrs& sp, SmemStatic& ss, const TileWork& w, int tid,
                                                   int lane, int warp) {
  const int words = w.words, nq = w.nq;
  const int per = (words + kThreads - 1) / kThreads;
  const int w0 = min(words, tid * per), w1 = min(words, w0 + per);
  int sum = 0;
  for (int x = w0; x < w1; ++x) {
    std::uint32_t u = 0;
    for (int i = 0; i < nq; ++i) u |= sp.qbits[i * words + x];
    sp.ubits[x] = u;
    sum += __popc(u);
  }
  int inc = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  if (lane == 31) ss.scan[warp] = inc;
  __syncthreads();
  int run = inc - sum;
  for (int x = 0; x < warp; ++x) run += ss.scan[x];
  for (int x = w0; x < w1; ++x) {
    sp.prefix[x] = run;
    run += __popc(sp.ubits[x]);
  }
  if (tid == kThreads - 1) sp.prefix[words] = run;
  __syncthreads();
}

/// Step 3a: the union's N = ceil(U / kStageRegions) stages are dealt out evenly: split `split`
/// of S = `num_splits` gathers stages [split * N / S, (split + 1) * N / S) (floor), i.e. union
/// ordinals [u0, u1); the splits' stage counts differ by at most one, and none is empty while
/// N >= S.
__device__ __forceinline__ void split_union(int U, int num_splits, int split, TileWork& w) {
  const int n = (U + kStageRegions - 1) >> kStageRegionsLog2;
  const int s0 = static_cast<int>(static_cast<long long>(split) * n / num_splits);
  const int s1 = static_cast<int>(static_cast<long long>(split + 1) * n / num_splits);
  w.u0 = min(U, s0 * kStageRegions);
  w.u1 = min(U, s1 * kStageRegions);
  w.ntiles = s1 - s0;
}

/// The cache row of the first token of region `id` in block `blk`, local KV group `g`:
/// (blk * block_size + (id * R) % block_size) * kv_heads + g (int32: sparse_attention_plan bounds
/// it). block_size is a multiple of R, so token t < R of the region is at that row + t * kv_heads.
__device__ __forceinline__ int region_cache_row(const SparseAttentionArgs& a, int blk, int id, int g) {
  return (blk * a.block_size + (id * kRegion) % a.block_size) * a.kv_heads + g;
}

/// Step 2' (tiles of one query, nq == 1: decode; replaces steps 2a, 2b and 3a): the split's share
/// of the query's own selection row, resolved up front. The row's first cnt = clamp(counts, 0,
/// topk + 1) entries are dealt out over the splits like the union (`split_union` with U = cnt:
/// deterministic, the same share on every launch); entry u0 + e of the share becomes reg_id[e]
/// (its region id, or -1 when outside [0, p/R]: never gathered, masked) and reg_row[e] (the cache
/// row of its first token, `region_cache_row` of its `checked_block`, or -1: never read, masked),
/// all entries in one parallel pass: one topk-id
/// load and one block-table load per entry, instead of one dependent block-table round trip per ring
/// stage. The selection rows list distinct ids (SPEC §4 step 6) in ascending order, so the gathered
/// regions and their order are those of the union path (a repeated id would count twice here, once
/// there; the reference counts it twice). The id this thread loads in the common case cnt = topk + 1
/// and the row's count come from `load_region_list_row` (issued by the caller: the one-query
/// instance issues them before the tile is located), the id speculatively (checked here). Ends with
/// a barrier.
struct RegionListLoads {
  int spec;   ///< entry u0 + tid of the split's share of a full row (cnt = topk + 1), or -1
  int count;  ///< the row's count (unclamped)
};
/// The loads of step 2' that need only the selection row of token t0, KV group g (not the tile's
/// request): this thread's speculative id and the row's count.
__device__ __forceinline__ RegionListLoads load_region_list_row(const SparseAttentionArgs& a, int t0, int g, int split,
                                                               int tid) {
  const int W = a.topk + 1;
  const long long row = static_cast<long long>(g) * a.num_tokens + t0;
  TileWork full;
  split_union(W, a.num_splits, split, full);
  return {tid < full.u1 - full.u0 ? a.topk_ids[row * W + full.u0 + tid] : -1, a.counts[row]};
}
/// `pre`: load_region_list_row of w's token and group.
__device__ __forceinline__ void build_region_list(const SparseAttentionArgs& a, const SmemPtrs& sp, TileWork& w,
                                                  int split, int tid, const RegionListLoads& pre) {
  const int W = a.topk + 1;
  const long long row = static_cast<long long>(w.g) * a.num_tokens + w.t0;
  const int* ids = a.topk_ids + row * W;
  const int spec = pre.spec;
  const int cnt = min(max(pre.count, 0), W);
  split_union(cnt, a.num_splits, split, w);
  const bool spec_ok = cnt == W;
  const int cur = w.pos0 >> kRegionLog2;
  for (int e = tid; e < w.u1 - w.u0; e += kThreads) {
    const int id = spec_ok && e == tid ? spec : ids[w.u0 + e];
    const bool valid = id >= 0 && id <= cur;
    int blk = -1;
    if (valid)
      blk = static_cast<int>(checked_block(a.block_table, a.max_blocks, a.block_size, a.num_blocks, w.b,
                                           id * kRegion, a.bounds_fault));
    sp.reg_id[e] = valid ? id : -1;
    sp.reg_row[e] = blk >= 0 ? region_cache_row(a, blk, id, w.g) : -1;
  }
  __syncthreads();
}

/// Step 4a: the Q fragments (mma A operand) of the warp's 16 rows of row group `rg`; rows past the
/// tile are zero.
template <int D, int HPG>
__device__ __forceinline__ void load_q_fragments(const SparseAttentionArgs& a, const TileWork& w, int rg, int lane,
                                                 std::uint32_t (&qf)[D / 16][4]) {
  const int r_lo = rg * 16 + (lane >> 2), r_hi = r_lo + 8;
  const int i_lo = r_lo / HPG, i_hi = r_hi / HPG;
  const bool v_lo = i_lo < w.nq, v_hi = i_hi < w.nq;
  const __nv_bfloat16* q_lo =
      a.q + (v_lo ? (w.t0 + i_lo) * a.q_stride + static_cast<long long>(w.g * HPG + r_lo % HPG) * D : 0);
  const __nv_bfloat16* q_hi =
      a.q + (v_hi ? (w.t0 + i_hi) * a.q_stride + static_cast<long long>(w.g * HPG + r_hi % HPG) * D : 0);
  const int c = 2 * (lane & 3);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    qf[ks][0] = v_lo ? *reinterpret_cast<const std::uint32_t*>(q_lo + ks * 16 + c) : 0u;
    qf[ks][1] = v_hi ? *reinterpret_cast<const std::uint32_t*>(q_hi + ks * 16 + c) : 0u;
    qf[ks][2] = v_lo ? *reinterpret_cast<const std::uint32_t*>(q_lo + ks * 16 + c + 8) : 0u;
    qf[ks][3] = v_hi ? *reinterpret_cast<const std::uint32_t*>(q_hi + ks * 16 + c + 8) : 0u;
  }
}

/// Step 3b, first half (union path): the union ordinals of ring stages kChunkStages * k ..
/// kChunkStages * (k + 1) - 1, i.e. ordinals w.u0 + kChunkRegions * k + t (t < kChunkRegions, below
/// w.u1), are resolved once per region, by thread t: its region id (`select_region`) and the
/// block-table entry of the region's first token (block_size is a multiple of R: one entry per
/// region). Split in two so that the block-table load is in flight while the MMAs run:
/// `prefetch_chunk` issues it, `store_chunk` checks it (faults reported at the region's first
/// position, which is at most the tile's last: every union region was selected by a query at or
/// after it) and writes {id, the cache row of the region's first token (region_cache_row) or -1}
/// into its ring slot (`chunk_slot`), read by prepare_stage after the next barrier. The list path resolved its
/// row up front (build_region_list): no chunks.
struct RegionPrefetch {
  int id;
  BlockEntry blk;
};
/// Nothing prefetched (the list path, a thread past the chunk's regions, or no chunk due).
__device__ __forceinline__ constexpr RegionPrefetch no_prefetch() { return {-1, {-1, false}}; }
__device__ __forceinline__ RegionPrefetch prefetch_chunk(const SparseAttentionArgs& a, const SmemPtrs& sp,
                                                         const TileWork& w, int k, int tid) {
  RegionPrefetch pf = no_prefetch();
  const int ord = w.u0 + k * kChunkRegions + tid;
  if (tid < kChunkRegions && ord < w.u1) {
    pf.id = select_region(sp.ubits, sp.prefix, w.words, ord);
    pf.blk = load_block_entry(a.block_table, a.max_blocks, a.block_size, w.b, pf.id * kRegion);
  }
  return pf;
}
__device__ __forceinline__ void store_chunk(const SparseAttentionArgs& a, const SmemPtrs& sp, const TileWork& w,
                                            int k, const RegionPrefetch& pf, int tid) {
  if (tid >= kChunkRegions) return;
  const int blk = pf.id >= 0 ? static_cast<int>(check_block_entry(pf.blk, a.num_blocks, w.b, pf.id * kRegion,
                                                                  a.bounds_fault))
                             : -1;
  sp.chunk[chunk_slot(k) * kChunkRegions + tid] =
      make_int2(pf.id, blk >= 0 ? region_cache_row(a, blk, pf.id, w.g) : -1);
}
/// Whether chunk `k` (stages kChunkStages * k ..) is resolved at iteration `it` of the stage loop:
/// the iteration before the one that prepares its first stage (it + NS + 1 = kChunkStages * k),
/// so that the barrier at the top of that iteration publishes it. Chunk 0 is resolved up front.
template <int NS>
__device__ __forceinline__ int chunk_due(const TileWork& w, int it) {
  const int first = it + NS + 1;
  return first % kChunkStages == 0 && first < w.ntiles ? first / kChunkStages : -1;
}

/// The token bits of region `id` that a query at position `qpos` attends: its tokens at positions
/// <= qpos (SPEC §4 step 7: the current region up to the query, whole earlier regions).
__device__ __forceinline__ unsigned region_token_mask(int id, int qpos) {
  const int n = min(id * kRegion + kRegion - 1, qpos) - id * kRegion + 1;
  return n >= kRegion ? 0xffu : (n > 0 ? ((1u << n) - 1u) : 0u);
}

/// Region j of gathered tile `it` as {region id, cache row of its first token}: entry e =
/// kStageRegions * it + j of the split's share, {-1, -1} past it. List path: build_region_list's
/// arrays (id -1 or row -1: masked, never read); union path: the chunk ring (`store_chunk`; row
/// -1: masked, never read).
template <bool LIST>
__device__ __forceinline__ int2 stage_region(const SmemPtrs& sp, const TileWork& w, int it, int j) {
  const int e = it * kStageRegions + j;
  if (w.u0 + e >= w.u1) return make_int2(-1, -1);
  if constexpr (LIST) return make_int2(sp.reg_id[e], sp.reg_row[e]);
  else return sp.chunk[chunk_entry(e)];
}

/// Step 3b: prepares a ring stage for gathered tile `it` from shared memory only (its regions:
/// stage_region): threads 0..63 the cache row of one token each into tok_row[64] (the region's row
/// + its slot * kv_heads; -1 = zero-fill: past the share, past the tile's last position, or a
/// region whose block is unusable), the others the per-(query, region) token masks into
/// mask[kMaxQ][kStageRegions] (thread 64 + e those of region e % 8 for queries e / 8 and e / 8 + 8:
/// the query selected the region (list path: query 0, its own row; union path: its bitmap) and its
/// block is usable; else 0, or a zero-filled token would enter the softmax with logit 0).
/// LIST = w.list, a template argument so that the list (decode) loop holds no union-path code (its
/// time is mostly instruction fetch, bench/RESULTS.md).
template <bool LIST>
__device__ __forceinline__ void prepare_stage(const SparseAttentionArgs& a, const SmemPtrs& sp, const TileWork& w,
                                              int it, int* tok_row, unsigned char (*mask)[kStageRegions], int tid) {
  if (tid < kTileTok) {
    const int2 r = stage_region<LIST>(sp, w, it, tid >> kRegionLog2);
    const int pos = r.x * kRegion + (tid & (kRegion - 1));
    tok_row[tid] = r.y >= 0 && pos <= w.pos_last ? r.y + (tid & (kRegion - 1)) * a.kv_heads : -1;
    return;
  }
  static_assert(kMaxQ * kStageRegions == 2 * (kThreads - kTileTok), "two mask entries per mask thread");
  const int e = tid - kTileTok, j = e & (kStageRegions - 1);
  const int2 r = stage_region<LIST>(sp, w, it, j);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = (e >> kStageRegionsLog2) + h * (kMaxQ / 2);
    unsigned m = 0;
    if (r.y >= 0) {
      bool selected;
      if constexpr (LIST) selected = i == 0;
      else selected = i < w.nq && ((sp.qbits[i * w.words + (r.x >> 5)] >> (r.x & 31)) & 1u);
      if (selected) m = region_token_mask(r.x, w.pos0 + i);
    }
    mask[i][j] = static_cast<unsigned char>(m);
  }
}

/// Step 3c: issues the cp.async copies of ring stage `st` (K and V rows of its 64 tokens at cache
/// rows `tok_row`, 16-byte chunks, `swz` layout; row -1 zero-fills). Eight lanes copy one 128-byte
/// chunk group of a row per instruction (thread t: chunks t % 8 + 8j of rows t / 8 + 16r, r < 4),
/// so a warp instruction moves whole sectors of four rows, and each thread resolves a row's offset
/// and swizzle once for its D / 64 chunk groups (chunk group j of a row is the same position in
/// column block j: swz(row, l + 8j) = swz(row, l) + kBlockElems * j) — a quarter of the issue slots of
/// one chunk per loop iteration, which the decode stages are bound by (bench/RESULTS.md). The rows of
/// a thread are 16 apart, so they share row % 8 and thus the swizzle: their destinations differ by a
/// constant (swz(row + 16r, l) = swz(row, l) + 16r * kBlockCols), and a row's two sources are one
/// 64-bit element offset from the K and V bases.
template <int D>
__device__ __forceinline__ void gather_stage(const SparseAttentionArgs& a, const int* tok_row, const SmemPtrs& sp,
                                             int st, int tid) {
  static_assert(D % 64 == 0, "whole 128-byte chunk groups per row");
  constexpr int kRowsPerPass = kThreads / 8;
  static_assert(kTileTok % kRowsPerPass == 0, "whole passes of 16 rows");
  __nv_bfloat16* dk = sp.sK + st * kTileTok * D;
  __nv_bfloat16* dv = sp.sV + st * kTileTok * D;
  const int lc = tid & 7;
  const std::uint32_t dk0 = smem_u32(dk + swz<D>(tid >> 3, lc)), dv0 = smem_u32(dv + swz<D>(tid >> 3, lc));
#pragma unroll
  for (int r = 0; r < kTileTok / kRowsPerPass; ++r) {
    const int row = tok_row[(tid >> 3) + r * kRowsPerPass];  // -1: zero-fill
    const int bytes = row >= 0 ? 16 : 0;
    const std::size_t off = static_cast<std::size_t>(max(row, 0)) * D + lc * 8;
    const __nv_bfloat16* ks = a.k_cache + off;
    const __nv_bfloat16* vs = a.v_cache + off;
    const std::uint32_t drow = r * kRowsPerPass * kRowBytes;
#pragma unroll
    for (int j = 0; j < D / 64; ++j) {
      cp_async16(dk0 + drow + kBlockBytes * j, ks + kBlockCols * j, bytes);
      cp_async16(dv0 + drow + kBlockBytes * j, vs + kBlockCols * j, bytes);
    }
  }
}

/// Step 4b: S = Q·Kᵀ of the warp's 16 rows and its NW tokens c0 .. c0 + NW of stage `k_st`.
template <int D, int NW>
__device__ __forceinline__ void qk_mma(const std::uint32_t (&qf)[D / 16][4], const __nv_bfloat16* k_st, int c0,
                                       int lane, float (&s)[NW / 8][4]) {
  constexpr int NB = NW / 8;
#pragma unroll
  for (int n = 0; n < NB; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  const int mi = lane >> 3;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < NB / 2; ++np) {
      const int tok = c0 + np * 16 + (mi >> 1) * 8 + (lane & 7);
      std::uint32_t b0, b1, b2, b3;
      ldmatrix_x4(smem_u32(k_st + swz<D>(tok, ks * 2 + (mi & 1))), b0, b1, b2, b3);
      mma_bf16_16816(s[2 * np], qf[ks], b0, b1);
      mma_bf16_16816(s[2 * np + 1], qf[ks], b2, b3);
    }
  }
}

/// The token bits of the NB regions j0 .. j0 + NB - 1 of one (query, stage) mask row (`mask`,
/// kStageRegions bytes per query), region j0 + n in bits 8n .. 8n + 7: one shared load (j0 is a
/// multiple of NB, so the load is aligned).
template <int NB>
__device__ __forceinline__ std::uint64_t load_mask_bits(const unsigned char* row, int j0) {
  static_assert(NB == 8 || NB == 4 || NB == 2, "NW of 64, 32 or 16 tokens");
  if constexpr (NB == 8) return *reinterpret_cast<const std::uint64_t*>(row + j0);
  else if constexpr (NB == 4) return *reinterpret_cast<const std::uint32_t*>(row + j0);
  else return *reinterpret_cast<const std::uint16_t*>(row + j0);
}

/// Slack of the running max (log2 units): a row's max moves only when a stage's max exceeds it by
/// more than this (online_softmax).
constexpr float kRescaleSlack = 8.f;

/// Step 4c: masks S (a token the row's query did not select, or past its position, is -inf),
/// updates the running max (log2 domain: max_raw · scale_log2) and row sums, turns S into
/// P = 2^(S · scale_log2 - max) (one FFMA and one MUFU ex2 per element, `ex2_approx_ftz`) and
/// rescales the accumulator. scale_log2 > 0, so the max of the raw scores gives the max of the
/// scaled ones. The running max moves only when the stage's exceeds it by more than
/// kRescaleSlack (FlashAttention-4's conditional rescaling): until then P may reach
/// 2^kRescaleSlack, which bf16 holds with the same relative precision and the fp32 sums far from
/// their range, and the result is the same in exact arithmetic, since the sums, the accumulator
/// and the LSE all refer to the same max. A max then rarely moves after the first stages, and
/// the warp skips the accumulator's rescale (D / 2 multiplies per thread) when no row moved.
template <int D, int NW>
__device__ __forceinline__ void online_softmax(const unsigned char* mk, int i_lo, int i_hi, int c0, int lane,
                                               float scale_log2, float (&s)[NW / 8][4], SoftmaxState& sm,
                                               float (&acc)[D / 8][4]) {
  constexpr int NB = NW / 8;
  const int j0 = c0 >> kRegionLog2;  // n8 block n = region j0 + n of the stage
  const int tt = 2 * (lane & 3);     // this thread's two columns of each n8 block
  const std::uint64_t mlo = i_lo < kMaxQ ? load_mask_bits<NB>(mk + i_lo * kStageRegions, j0) >> tt : 0u;
  const std::uint64_t mhi = i_hi < kMaxQ ? load_mask_bits<NB>(mk + i_hi * kStageRegions, j0) >> tt : 0u;
  float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    s[n][0] = ((mlo >> (8 * n)) & 1u) ? s[n][0] : -INFINITY;
    s[n][1] = ((mlo >> (8 * n + 1)) & 1u) ? s[n][1] : -INFINITY;
    s[n][2] = ((mhi >> (8 * n)) & 1u) ? s[n][2] : -INFINITY;
    s[n][3] = ((mhi >> (8 * n + 1)) & 1u) ? s[n][3] : -INFINITY;
    mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
  }
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  const float st_lo = mx_lo * scale_log2, st_hi = mx_hi * scale_log2;  // -inf + slack = -inf: the first max moves
  const float mn_lo = st_lo > sm.m_lo + kRescaleSlack ? st_lo : sm.m_lo;
  const float mn_hi = st_hi > sm.m_hi + kRescaleSlack ? st_hi : sm.m_hi;
  const float mu_lo = mn_lo == -INFINITY ? 0.f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
  const float al_lo = ex2_approx_ftz(sm.m_lo - mu_lo), al_hi = ex2_approx_ftz(sm.m_hi - mu_hi);
  // the accumulator's rescale is skipped when no row of the warp moved its max: then each alpha
  // is exactly 1 (finite max) or the row has seen no valid token yet (max -inf, alpha 0, the
  // accumulator ±0 or NaN, which x·0 keeps), so the skip leaves every bit as the multiply would
  // under IEEE float (a denormal accumulator under -ftz is the exception)
  const bool rescale = __any_sync(0xffffffffu, mn_lo != sm.m_lo || mn_hi != sm.m_hi);
  sm.m_lo = mn_lo;
  sm.m_hi = mn_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    s[n][0] = ex2_approx_ftz(fmaf(s[n][0], scale_log2, -mu_lo));
    s[n][1] = ex2_approx_ftz(fmaf(s[n][1], scale_log2, -mu_lo));
    s[n][2] = ex2_approx_ftz(fmaf(s[n][2], scale_log2, -mu_hi));
    s[n][3] = ex2_approx_ftz(fmaf(s[n][3], scale_log2, -mu_hi));
    sum_lo += s[n][0] + s[n][1];
    sum_hi += s[n][2] + s[n][3];
  }
  sm.l_lo = sm.l_lo * al_lo + sum_lo;
  sm.l_hi = sm.l_hi * al_hi + sum_hi;
  if (rescale) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      acc[i][0] *= al_lo;
      acc[i][1] *= al_lo;
      acc[i][2] *= al_hi;
      acc[i][3] *= al_hi;
    }
  }
}

/// Step 4d: O += bf16(P)·V over the warp's NW tokens of stage `v_st`.
template <int D, int NW>
__device__ __forceinline__ void pv_mma(const float (&s)[NW / 8][4], const __nv_bfloat16* v_st, int c0, int lane,
                                       float (&acc)[D / 8][4]) {
  const int mi = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < NW / 16; ++kk) {
    std::uint32_t pa[4];
    pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    const int tok = c0 + kk * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      std::uint32_t b0, b1, b2, b3;
      ldmatrix_x4_trans(smem_u32(v_st + swz<D>(tok, dp * 2 + (mi >> 1))), b0, b1, b2, b3);
      mma_bf16_16816(acc[2 * dp], pa, b0, b1);
      mma_bf16_16816(acc[2 * dp + 1], pa, b2, b3);
    }
  }
}

/// Step 4b on wgmma (64-row tiles, TG == 1, kWgmmaTiles<D>), issue only: S = Q·Kᵀ of the warpgroup's 64 rows
/// and the stage's 64 tokens, one m64n64k16 per 16 columns of D. A = the Q fragments in registers
/// (wgmma's register A fragment of warp w is mma.sync's A fragment of rows 16w .. 16w + 15, so
/// `load_q_fragments` serves both), B = the K stage (K-major: column block ks / 4 at 8 KiB each,
/// 32 bytes per k16 step inside its 128-byte rows). The accumulator fragment is qk_mma<D, 64>'s:
/// n8 block n of warp w holds rows 16w + lane / 4 (+ 8), columns 8n + 2 (lane % 4) (+ 1).
template <int D>
__device__ __forceinline__ void qk_wgmma_issue(const std::uint32_t (&qf)[D / 16][4], const __nv_bfloat16* k_st,
                                               float (&s)[kTileTok / 8][4]) {
  namespace wg = ::step5::kernels::sm90::wgmma;
  const std::uint64_t desc = wg::make_desc_sw128(smem_u32(k_st));
  wg::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    wg::wgmma_m64n64k16_bf16_rs(&s[0][0], qf[ks], wg::desc_advance(desc, (ks >> 2) * kBlockBytes + (ks & 3) * 32),
                                ks > 0);
  wg::wgmma_commit();
}
/// Waits for `qk_wgmma_issue` (issue only: the caller prefetches the stage NS ahead meanwhile).
__device__ __forceinline__ void qk_wgmma_wait(float (&s)[kTileTok / 8][4]) {
  namespace wg = ::step5::kernels::sm90::wgmma;
  wg::wgmma_wait<0>();
  wg::fence_regs<kTileTok / 2>(&s[0][0]);
}

/// Step 4d on wgmma, issue only: O += bf16(P)·V over the stage's 64 tokens, one m64nDk16 per 16
/// tokens, committed as one group and NOT waited for (`pv_wgmma_wait`): the caller prepares the
/// stage NS ahead meanwhile. A = P packed to bf16 (`pa`, the fragments pv_mma builds; the caller keeps
/// them untouched until the wait), B = the V stage (N-major: 16 token rows of 128 bytes per k16
/// step, the D / 64 column blocks 8 KiB apart).
template <int D>
__device__ __forceinline__ void pv_wgmma_issue(const float (&s)[kTileTok / 8][4], const __nv_bfloat16* v_st,
                                               std::uint32_t (&pa)[kTileTok / 16][4], float (&acc)[D / 8][4]) {
  namespace wg = ::step5::kernels::sm90::wgmma;
  static_assert(kWgmmaTiles<D>, "an m64nDk16 instruction for this head_dim");
#pragma unroll
  for (int kk = 0; kk < kTileTok / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  const std::uint64_t desc0 = wg::make_desc_sw128_nmajor(smem_u32(v_st), kBlockBytes);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileTok / 16; ++kk) {
    const std::uint64_t desc = wg::desc_advance(desc0, kk * 16 * kRowBytes);
    if constexpr (D == 128) wg::wgmma_m64n128k16_bf16_rs_nmajor(&acc[0][0], pa[kk], desc, 1);
    else if constexpr (D == 192) wg::wgmma_m64n192k16_bf16_rs_nmajor(&acc[0][0], pa[kk], desc, 1);
    else static_assert(D != D, "an m64nDk16 N-major instruction for every ops::attention_wgmma_head_dim");
  }
  wg::wgmma_commit();
}
/// Waits for `pv_wgmma_issue`; the accumulators and P fragments are then the caller's again.
template <int D>
__device__ __forceinline__ void pv_wgmma_wait(std::uint32_t (&pa)[kTileTok / 16][4], float (&acc)[D / 8][4]) {
  namespace wg = ::step5::kernels::sm90::wgmma;
  wg::wgmma_wait<0>();
  wg::fence_regs<D / 2>(&acc[0][0]);
#pragma unroll
  for (int kk = 0; kk < kTileTok / 16; ++kk)
    asm volatile("" : "+r"(pa[kk][0]), "+r"(pa[kk][1]), "+r"(pa[kk][2]), "+r"(pa[kk][3])::"memory");
}

/// Step 4: the gathered stages through a ring of NS K/V slots (cp.async groups, one per stage),
/// one barrier per stage. The first NS stages are issued up front. At iteration `it` every thread
/// waits for its copies of stage `it` and meets the others: stage `it` is then visible, and every
/// thread has finished computing stage it - 1, so its K/V slot takes stage it + NS - 1 (issued
/// from iteration 1 on: while stage `it` is computed, the NS - 1 after it are in flight), whose
/// cache rows were prepared one iteration earlier. After computing stage `it`, the metadata of
/// stage it + NS is prepared into the slot of stage it - 1: NS + 1 metadata slots, since stage
/// `it`'s masks and stage it + NS - 1's rows are still being read. Each warp computes NW tokens
/// (column group tg) of its 16 rows. Union path: the stages' regions come from the chunk ring,
/// chunk 0 resolved before the first stage, chunk k at the iteration `chunk_due` names. WG (64-row
/// tiles, NW = 64): the warpgroup computes on wgmma; every thread fences its completed cp.async
/// writes to the async proxy before the barrier; a due chunk's block-table loads are issued while
/// Q·Kᵀ is in flight, and stage it + NS's prepare_stage and the chunk's store run while P·V is.
/// LIST = w.list (one query: no union-path code in the loop).
template <int D, int NW, int NS, bool WG = false, bool LIST = false>
__device__ __forceinline__ void attend_stages(const SparseAttentionArgs& a, StageMeta<NS>& sg, const SmemPtrs& sp,
                                              const TileWork& w, int tid, int lane, int tg, int i_lo, int i_hi,
                                              const std::uint32_t (&qf)[D / 16][4], SoftmaxState& sm,
                                              float (&acc)[D / 8][4]) {
  constexpr int kMeta = StageMeta<NS>::kSlots;
  static_assert(NS < kChunkStages, "chunk_due: chunk 1 is resolved inside the loop");
  if (w.ntiles <= 0) return;
  if constexpr (!LIST) {
    store_chunk(a, sp, w, 0, prefetch_chunk(a, sp, w, 0, tid), tid);
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < NS; ++j)
    if (j < w.ntiles) prepare_stage<LIST>(a, sp, w, j, sg.tok_row[j], sg.mask[j], tid);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    if (j < w.ntiles) gather_stage<D>(a, sg.tok_row[j], sp, j, tid);
    cp_async_commit();  // group j = stage j (empty past the last stage)
  }
  for (int it = 0; it < w.ntiles; ++it) {
    // committed: groups 0 .. NS - 1 + max(it - 1, 0), group g = stage g; stage `it` complete
    if (it == 0) cp_async_wait<NS - 1>();
    else cp_async_wait<NS - 2>();
    if constexpr (WG) ::step5::kernels::sm90::wgmma::fence_proxy_async_smem();  // cp.async data -> wgmma reads
    __syncthreads();
    if (it > 0) {
      const int nx = it + NS - 1;  // into the K/V slot of stage it - 1
      if (nx < w.ntiles) gather_stage<D>(a, sg.tok_row[nx % kMeta], sp, nx % NS, tid);
      cp_async_commit();
    }
    const int st = it % NS, c0 = tg * NW;
    const int pre = it + NS;  // prepared into the metadata slot of stage it - 1, after the compute
    float s[NW / 8][4];
    int chunk = -1;
    if constexpr (!LIST) chunk = chunk_due<NS>(w, it);
    if constexpr (WG) {
      // a due chunk's loads are issued while the tensor cores compute Q·Kᵀ; stage `pre` and the
      // chunk's store are written while they compute P·V
      qk_wgmma_issue<D>(qf, sp.sK + st * kTileTok * D, s);
      const RegionPrefetch pf = chunk >= 0 ? prefetch_chunk(a, sp, w, chunk, tid) : no_prefetch();
      qk_wgmma_wait(s);
      online_softmax<D, NW>(&sg.mask[it % kMeta][0][0], i_lo, i_hi, c0, lane, a.scale_log2, s, sm, acc);
      std::uint32_t pa[kTileTok / 16][4];
      pv_wgmma_issue<D>(s, sp.sV + st * kTileTok * D, pa, acc);
      if (pre < w.ntiles) prepare_stage<LIST>(a, sp, w, pre, sg.tok_row[pre % kMeta], sg.mask[pre % kMeta], tid);
      if (chunk >= 0) store_chunk(a, sp, w, chunk, pf, tid);
      pv_wgmma_wait<D>(pa, acc);
    } else {
      qk_mma<D, NW>(qf, sp.sK + st * kTileTok * D, c0, lane, s);
      online_softmax<D, NW>(&sg.mask[it % kMeta][0][0], i_lo, i_hi, c0, lane, a.scale_log2, s, sm, acc);
      pv_mma<D, NW>(s, sp.sV + st * kTileTok * D, c0, lane, acc);
      if (pre < w.ntiles) prepare_stage<LIST>(a, sp, w, pre, sg.tok_row[pre % kMeta], sg.mask[pre % kMeta], tid);
      if (chunk >= 0) store_chunk(a, sp, w, chunk, prefetch_chunk(a, sp, w, chunk, tid), tid);
    }
  }
}

/// Step 5a: completes the row sums over the quad and stashes the warp's fp32 accumulator, max and
/// sum in shared memory (`buf` [4][16][D + 4] reuses the stages).
template <int D>
__device__ __forceinline__ void stash_warp_partials(SmemStatic& ss, float* buf, int warp, int lane, SoftmaxState& sm,
                                                    const float (&acc)[D / 8][4]) {
  constexpr int kBufStride = D + 4;
  sm.l_lo += __shfl_xor_sync(0xffffffffu, sm.l_lo, 1);
  sm.l_lo += __shfl_xor_sync(0xffffffffu, sm.l_lo, 2);
  sm.l_hi += __shfl_xor_sync(0xffffffffu, sm.l_hi, 1);
  sm.l_hi += __shfl_xor_sync(0xffffffffu, sm.l_hi, 2);
  float* wb = buf + warp * 16 * kBufStride;
  const int r = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    *reinterpret_cast<float2*>(wb + r * kBufStride + n * 8 + c) = make_float2(acc[n][0], acc[n][1]);
    *reinterpret_cast<float2*>(wb + (r + 8) * kBufStride + n * 8 + c) = make_float2(acc[n][2], acc[n][3]);
  }
  if ((lane & 3) == 0) {
    ss.m[warp][r] = sm.m_lo;
    ss.m[warp][r + 8] = sm.m_hi;
    ss.l[warp][r] = sm.l_lo;
    ss.l[warp][r + 8] = sm.l_hi;
  }
}

/// Step 5b: merges the TG token-group warps of each row (log-sum-exp), normalises, and writes
/// the gated bf16 output and LSE (one split), or the fp32 partial and its log2-LSE: to this CTA's
/// shared memory for the cluster merge (`cpart` rows of stride D + 4, in place over the stash when
/// TG == 1, and `clse`), else to the split-KV workspace. First each row's factors, once per row:
/// the weight 2^(m_t - max) / L of each warp t (in place of ss.m) and the row's log2-LSE (in place
/// of ss.l[row group]); then every element is the weighted sum of the warps' stashed values.
/// Every thread of the CTA calls it (a barrier between the two).
/// `push` (the one-query instance's to_cluster, cluster_merge_pushed; TG = 4; mbarrier
/// `push_bar`): the partial and log2-LSE go straight into the merging CTAs' shared memory — each
/// element to the split whose share holds it, at `cpart` (its receive buffer) there, each row's
/// LSE to every split's LSE table `s_w` — after the
/// cluster barrier whose arrival the caller made when its ring was done (the pushes land in the
/// ring's region of the other CTAs).
template <int D, int HPG>
__device__ __forceinline__ void merge_warps_and_store(const SparseAttentionArgs& a, SmemStatic& ss,
                                                      const float* buf, const float* sp_gate, const TileWork& w,
                                                      int rows, int RG, int TG, int tile, int split, int tid,
                                                      bool to_cluster, float* cpart, float* clse, bool push = false,
                                                      float* s_w = nullptr, std::uint64_t* push_bar = nullptr) {
  constexpr int kBufStride = D + 4;
  const int S = a.num_splits;
  const long long part_base = ((static_cast<long long>(tile) * gridDim.y + w.g) * S + split) * 64;
  const int n = rows * (D / 4), cap = (n + S - 1) / S;  // push: elements, and the receive stride per split
  for (int r = tid; r < rows; r += kThreads) {
    const int rgr = r >> 4, rr = r & 15;
    float mt = -INFINITY;
    for (int t = 0; t < TG; ++t) mt = fmaxf(mt, ss.m[t * RG + rgr][rr]);
    const float mu = mt == -INFINITY ? 0.f : mt;
    float L = 0.f;
    for (int t = 0; t < TG; ++t) L += ss.l[t * RG + rgr][rr] * exp2f(ss.m[t * RG + rgr][rr] - mu);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    for (int t = 0; t < TG; ++t) ss.m[t * RG + rgr][rr] = exp2f(ss.m[t * RG + rgr][rr] - mu) * inv;
    ss.l[rgr][rr] = L > 0.f ? mu + log2f(L) : -INFINITY;
  }
  __syncthreads();
  if (push) ptx::cluster_wait();  // every split's ring is done: its receive buffers may be written
  for (int idx = tid; idx < rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), d4 = (idx - r * (D / 4)) * 4;
    const int rgr = r >> 4, rr = r & 15;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int t = 0; t < TG; ++t) {
      const int wi = t * RG + rgr;
      const float f = ss.m[wi][rr];
      const float4 v = *reinterpret_cast<const float4*>(buf + (wi * 16 + rr) * kBufStride + d4);
      o.x += v.x * f;
      o.y += v.y * f;
      o.z += v.z * f;
      o.w += v.w * f;
    }
    const float lse2 = ss.l[rgr][rr];
    const int i = r / HPG, h = w.g * HPG + r % HPG, t = w.t0 + i;
    if (S == 1) {
      store_gated_output<D>(a, t, h, d4, o, lse2, sp_gate[r]);
    } else if (push) {
      const int q = ((idx + 1) * S + n - 1) / n - 1;  // the split whose share [q·n/S, (q+1)·n/S) holds idx
      const std::uint32_t bar = ptx::smem_u32(push_bar);
      const std::uint32_t dst = ptx::smem_u32(cpart + 4 * (split * cap + idx - q * n / S));
      ptx::st_async_v4_b32(ptx::cluster_addr(dst, q), o, ptx::cluster_addr(bar, q));
      if (d4 == 0) {
        const std::uint32_t lse_dst = ptx::smem_u32(s_w + r * kMaxSplits + split);
        for (int s = 0; s < S; ++s)
          ptx::st_async_b32(ptx::cluster_addr(lse_dst, s), __float_as_uint(lse2), ptx::cluster_addr(bar, s));
      }
    } else if (to_cluster) {
      *reinterpret_cast<float4*>(cpart + r * kBufStride + d4) = o;  // TG == 1: the element this thread read
      if (d4 == 0) clse[r] = lse2;
    } else {
      *reinterpret_cast<float4*>(a.ws_o + (part_base + r) * D + d4) = o;
      if (d4 == 0) a.ws_lse[part_base + r] = lse2;
    }
  }
}

/// Split-KV merge, phase 1: for rows [0, rows) of the tile, the weight of each split
/// (2^(lse_s - max) / Σ) into s_w[r * kMaxSplits + s] and the merged log2-LSE into s_lse[r]
/// (shared memory). Reads the other CTAs' partials through L2 (__ldcg). All threads of the CTA
/// call it: the S × rows LSE values are first loaded in parallel (one load per thread, coalesced
/// over rows) — a per-row loop over the splits was a chain of S dependent L2 round trips (18.6 µs
/// for S = 32 in the former merge kernel, bench/RESULTS.md "Where decode time goes").
/// `split_weights_from_lse`: the second half, on the LSE table s_w[r * kMaxSplits + s] already
/// loaded (shared by the cluster merge, so both merges compute the same weights).
__device__ __forceinline__ void split_weights_from_lse(int rows, int S, int tid, float* s_w, float* s_lse) {
  for (int r = tid; r < rows; r += kThreads) {
    float* w = s_w + r * kMaxSplits;
    float mt = -INFINITY;
    for (int s = 0; s < S; ++s) mt = fmaxf(mt, w[s]);
    float L = 0.f;
    for (int s = 0; s < S; ++s) {
      const float e = mt == -INFINITY ? 0.f : exp2f(w[s] - mt);
      w[s] = e;
      L += e;
    }
    for (int s = 0; s < S; ++s) w[s] = L > 0.f ? w[s] / L : 0.f;
    s_lse[r] = L > 0.f ? mt + log2f(L) : -INFINITY;
  }
}
__device__ __forceinline__ void split_weights(const SparseAttentionArgs& a, long long base, int rows, int S, int tid,
                                              float* s_w, float* s_lse) {
  for (int i = tid; i < S * rows; i += kThreads) {
    const int s = i / rows, r = i - s * rows;
    s_w[r * kMaxSplits + s] = __ldcg(a.ws_lse + base + s * 64 + r);
  }
  __syncthreads();
  split_weights_from_lse(rows, S, tid, s_w, s_lse);
}

/// The split merge's sum of one element (four columns): Σ_s w[s] · part(s), in split order
/// s = 0 .. S-1, each product added as it comes — the one order of every split merge (the
/// last-arriver's, the cluster's, the pushed one), so all give the same bits. `part(s)`: split
/// s's float4 of the element, from wherever that merge holds it.
template <class Part>
__device__ __forceinline__ float4 weighted_split_sum(const float* w, int S, Part part) {
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int s = 0; s < S; ++s) {
    const float ws = w[s];
    const float4 v = part(s);
    o.x += v.x * ws;
    o.y += v.y * ws;
    o.z += v.z * ws;
    o.w += v.w * ws;
  }
  return o;
}

/// Split-KV merge, phase 2: the weighted sum, in split order, of the splits' partial outputs of
/// element (row r, columns d4 .. d4 + 3); `w` = the row's split weights.
template <int D>
__device__ __forceinline__ float4 merge_splits(const SparseAttentionArgs& a, long long base, int S, int r, int d4,
                                               const float* w) {
  return weighted_split_sum(w, S, [&](int s) {
    return __ldcg(reinterpret_cast<const float4*>(a.ws_o + (base + s * 64 + r) * D + d4));
  });
}

/// Step 5c (num_splits > 1, after `merge_warps_and_store` wrote this split's partial): arrival on
/// the (tile, KV group) counter — partial stores, __threadfence, barrier, one atomicAdd — elects
/// the last split CTA; it fences, merges every split's partial in split order 0 .. S-1 (so the
/// result does not depend on which CTA arrived last: bit-identical across launches), writes out /
/// gate / LSE and resets the counter to 0. `smem` (>= (64 * kMaxSplits + 64) floats) is the
/// dynamic shared memory, free again after the stash.
template <int D, int HPG>
__device__ __forceinline__ void merge_if_last_split(const SparseAttentionArgs& a, SmemStatic& ss, float* smem,
                                                    const float* sp_gate, const TileWork& w, int rows, int tile,
                                                    int tid) {
  const int S = a.num_splits;
  const long long pair = static_cast<long long>(tile) * gridDim.y + w.g;
  __threadfence();  // this thread's partial stores are visible device-wide before the arrival
  __syncthreads();
  if (tid == 0) ss.last_split = atomicAdd(a.ws_counters + pair, 1u) == static_cast<unsigned>(S - 1) ? 1 : 0;
  __syncthreads();
  if (!ss.last_split) return;
  __threadfence();  // order the reads of the other splits' partials after their arrivals
  const long long base = pair * S * 64;
  float* s_w = smem;
  float* s_lse = smem + kTileTok * kMaxSplits;
  split_weights(a, base, rows, S, tid, s_w, s_lse);
  __syncthreads();
  for (int idx = tid; idx < rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), d4 = (idx - r * (D / 4)) * 4;
    const float4 o = merge_splits<D>(a, base, S, r, d4, s_w + r * kMaxSplits);
    const int i = r / HPG, h = w.g * HPG + r % HPG, t = w.t0 + i;
    store_gated_output<D>(a, t, h, d4, o, s_lse[r], sp_gate[r]);
  }
  if (tid == 0) a.ws_counters[pair] = 0u;  // leave the workspace ready for the next launch
}

/// Step 5c' (num_splits > 1 launched as clusters (1, 1, S): the S split CTAs of a (tile, KV group),
/// cluster rank = split): after `merge_warps_and_store` left each split's partial (`cpart`) and
/// log2-LSE (`clse`) in its own shared memory, a cluster barrier; every CTA reads the S x rows LSE
/// values through distributed shared memory, computes the split weights (`split_weights_from_lse`,
/// the same as the last-arriver merge) and merges its share — elements [split * n / S,
/// (split + 1) * n / S) of the n = rows x D / 4 four-column groups — in split order 0 .. S-1,
/// writing out / gate / LSE; a second cluster barrier keeps every CTA's partial readable until all
/// are done. No workspace, counter, fence or L2 round trip; the S CTAs merge in parallel.
/// `smem` past the partials (from `clse` + 64) holds the weight table.
template <int D, int HPG>
__device__ __forceinline__ void cluster_merge_splits(const SparseAttentionArgs& a, const float* cpart,
                                                     const float* clse, float* s_w, const float* sp_gate,
                                                     const TileWork& w, int rows, int split, int tid) {
  constexpr int kBufStride = D + 4;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int S = a.num_splits;
  float* s_lse = s_w + kTileTok * kMaxSplits;
  cluster.sync();  // every split's partial and LSE are in its shared memory
  for (int i = tid; i < S * rows; i += kThreads) {
    const int s = i / rows, r = i - s * rows;
    s_w[r * kMaxSplits + s] = *cluster.map_shared_rank(clse + r, s);
  }
  __syncthreads();
  split_weights_from_lse(rows, S, tid, s_w, s_lse);
  __syncthreads();
  const int n = rows * (D / 4);
  const int e1 = static_cast<int>(static_cast<long long>(split + 1) * n / S);
  for (int idx = static_cast<int>(static_cast<long long>(split) * n / S) + tid; idx < e1; idx += kThreads) {
    const int r = idx / (D / 4), d4 = (idx - r * (D / 4)) * 4;
    const float* wr = s_w + r * kMaxSplits;
    const float* src = cpart + r * kBufStride + d4;
    const float4 o = weighted_split_sum(
        wr, S, [&](int s) { return *reinterpret_cast<const float4*>(cluster.map_shared_rank(src, s)); });
    const int i = r / HPG, h = w.g * HPG + r % HPG, t = w.t0 + i;
    store_gated_output<D>(a, t, h, d4, o, s_lse[r], sp_gate[r]);
  }
  // the other CTAs' reads of this CTA's partial are done before it exits (an execution barrier:
  // no fence waits for the output stores above)
  ptx::cluster_sync_before_exit();
}

/// Whether the launch's split CTAs merge as a thread-block cluster (plan.cluster_merge, where the
/// merge buffers fit this instance's ring): the one condition of the epilogue and, in the one-query
/// instance, of the pushed merge's mbarrier and cluster barrier.
template <int D, int NS>
__device__ __forceinline__ bool merges_by_cluster(const SparseAttentionArgs& a) {
  return ops::attention_cluster_merge_fits(D, NS) && a.num_splits > 1 && a.cluster_merge != 0;
}

/// Step 5c'' (the cluster merge of the one-query instance: every decode tile, TG = 4): the same
/// merge as cluster_merge_splits — the same weights, each split's share summed in split order —
/// but the partials and LSEs were pushed here by merge_warps_and_store (st.async, completing
/// bytes on `bar`) instead of read from the other CTAs after a cluster barrier: no
/// release fence (cooperative_groups' cluster.sync arrives with a GPU-scope MEMBAR on sm_90) and
/// one one-way trip instead of two round trips (the LSEs, then the partials). `recv`: split s's
/// values of this CTA's share at recv[4 · (s · cap + e)], cap = ceil(n / S) (merge_warps_and_store's
/// layout; S · cap · 16 bytes <= 32 rows of stride D + 4, the region cluster_merge_splits' partial
/// takes); `s_w`: the LSE table, filled by the pushes, then the weights. The mbarrier `bar` was
/// initialised at the kernel start (one arrival: thread 0's expect_tx here) and made visible
/// before the cluster barrier that lets the other CTAs push.
template <int D, int HPG>
__device__ __forceinline__ void cluster_merge_pushed(const SparseAttentionArgs& a, std::uint64_t* bar, const float* recv,
                                                     float* s_w, const float* sp_gate, const TileWork& w, int rows,
                                                     int split, int tid) {
  const int S = a.num_splits;
  const int n = rows * (D / 4), cap = (n + S - 1) / S;
  const int e0 = static_cast<int>(static_cast<long long>(split) * n / S);
  const int e1 = static_cast<int>(static_cast<long long>(split + 1) * n / S);
  if (tid == 0) ptx::mbar_arrive_expect_tx(bar, static_cast<unsigned>(S * rows * 4 + S * (e1 - e0) * 16));
  ptx::mbar_wait_cluster(bar, 0);  // every split's share of this CTA and every LSE are here
  float* s_lse = s_w + kTileTok * kMaxSplits;
  split_weights_from_lse(rows, S, tid, s_w, s_lse);
  __syncthreads();
  for (int idx = e0 + tid; idx < e1; idx += kThreads) {
    const int r = idx / (D / 4), d4 = (idx - r * (D / 4)) * 4;
    const float* wr = s_w + r * kMaxSplits;
    const float4 o =
        weighted_split_sum(wr, S, [&](int s) { return *reinterpret_cast<const float4*>(recv + 4 * (s * cap + idx - e0)); });
    const int i = r / HPG, h = w.g * HPG + r % HPG, t = w.t0 + i;
    store_gated_output<D>(a, t, h, d4, o, s_lse[r], sp_gate[r]);
  }
  // no CTA exits while a push it issued may be in flight (an execution barrier: no fence waits for
  // the output stores above)
  ptx::cluster_sync_before_exit();
}

/// Step 2'' (a multi-query tile with one split whose union is large against its queries' own
/// selections: `uses_per_query_gathers`): the tile's queries one after the other, each as a tile
/// of one query — its own selection row (`build_region_list`), Q fragments, the ring over its
/// stages with the four warps on the stage's tokens (NW = 16), the warp merge and the gated store
/// (steps 2', 4 and 5 of decode). The rows' gate values are in sp.gate (tile row order). Every
/// thread calls it; the first barrier orders the bitmaps' last reads (and, from the second query,
/// the previous epilogue's reads of the stash and of ss.m / ss.l) before their space is rewritten.
template <int D, int HPG, int NS>
__device__ __forceinline__ void attend_queries_in_turn(const SparseAttentionArgs& a, SmemStatic& ss, StageMeta<NS>& sg,
                                                       const SmemPtrs& sp, const TileWork& w, int tile, int tid,
                                                       int lane, int warp, std::uint32_t (&qf)[D / 16][4]) {
  float* buf = reinterpret_cast<float*>(sp.sK);  // the warp stash reuses the ring (as in the kernel)
  for (int i = 0; i < w.nq; ++i) {
    TileWork q = w;
    q.t0 = w.t0 + i;
    q.nq = 1;
    q.pos0 = w.pos0 + i;
    q.pos_last = q.pos0;
    q.list = true;
    __syncthreads();
    build_region_list(a, sp, q, 0, tid, load_region_list_row(a, q.t0, q.g, 0, tid));
    load_q_fragments<D, HPG>(a, q, 0, lane, qf);
    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    SoftmaxState sm{-INFINITY, -INFINITY, 0.f, 0.f};
    const int i_lo = (lane >> 2) / HPG, i_hi = ((lane >> 2) + 8) / HPG;
    attend_stages<D, kTileTok / kWarps, NS, false, true>(a, sg, sp, q, tid, lane, warp, i_lo, i_hi, qf, sm, acc);
    cp_async_wait<0>();
    __syncthreads();
    stash_warp_partials<D>(ss, buf, warp, lane, sm, acc);
    __syncthreads();
    merge_warps_and_store<D, HPG>(a, ss, buf, sp.gate + i * HPG, q, HPG, 1, kWarps, tile, 0, tid, false, nullptr,
                                  nullptr);
  }
}

/// The choice of step 2'' for a tile on the bitmap path (after step 2b): forced by a.tile_gather,
/// else `ops::attention_per_query_pays` on the union's stages and the queries' own (ss.qcount).
/// Only with one split (the per-query path writes final outputs, never split partials).
__device__ __forceinline__ bool uses_per_query_gathers(const SparseAttentionArgs& a, const SmemStatic& ss,
                                                       const SmemPtrs& sp, const TileWork& w) {
  if (w.list || a.num_splits != 1 || a.tile_gather == 1) return false;
  if (a.tile_gather == 2) return true;
  long long query_stages = 0;
  for (int i = 0; i < w.nq; ++i) query_stages += (ss.qcount[i] + kStageRegions - 1) >> kStageRegionsLog2;
  const long long union_stages = (sp.prefix[w.words] + kStageRegions - 1) >> kStageRegionsLog2;
  return ops::attention_per_query_pays(union_stages, query_stages, w.nq);
}

}  // namespace attn_detail

/// See the file comment (steps 1–5). Grid (max_tiles, lg, num_splits), 128 threads, dynamic smem
/// from the plan (NS = plan.stages ring stages of K and V, then the bitmaps). WGT
/// (plan.wgmma_tiles): 64-row tiles on wgmma. ONE_Q (plans of one-query tiles, plan.query_tile ==
/// 1: decode): the instance holds only the one-query path (steps 1, 2', 4 on the list loop, 5) with
/// its row layout fixed at compile time (rows = hpg_q <= 16: one row group, the 4 warps split
/// the stage's tokens), so that the code a decode CTA fetches (cold in a layer step: the weights
/// streamed in between evict it) is the code it runs; the same device functions in the same order
/// as the general instance's one-query tiles, so the same bits.
template <int D, int HPG, int NS, bool WGT, bool ONE_Q = false>
__global__ void __launch_bounds__(128, 1) sparse_attention_kernel(const SparseAttentionArgs a) {
#if STEP5_SM90A_DEVICE
  using namespace attn_detail;
  static_assert(ops::attention_head_dim_ok(D), "head_dim must be a multiple of 64 (the stage layout's 128-byte "
                "column blocks, swz), at most 256");
  static_assert(HPG == 4 || HPG == 8 || HPG == 16, "hpg_q must be 4, 8 or 16 (SPEC §2 rule 6)");
  static_assert(!(WGT && ONE_Q), "the one-query instance has no 64-row tiles (no wgmma path)");
  static_assert(NS >= ops::kAttentionMinStages && NS <= ops::kAttentionMaxStages, "ring stages out of range");
  static_assert(NS * 2 * kTileTok * D * 2 >= (kTileTok * kMaxSplits + kTileTok) * 4,
                "the split merge's weight table must fit in the K/V stages");
  static_assert(NS * 2 * kTileTok * D * 2 >= kWarps * 16 * (D + 4) * 4, "the warp stash must fit in the K/V stages");
  extern __shared__ __align__(ops::kAttentionSmemAlign) unsigned char smem_raw[];
  __shared__ SmemStatic ss;
  // the one-query instance's cluster merge by pushes (cluster_merge_pushed): the partials' arrival
  // (outside SmemStatic, whose 4-byte alignment the general instances' code depends on: with an
  // 8-byte member ptxas spilled several of them; unused there)
  __shared__ std::uint64_t merge_bar;
  static_assert(sizeof(SmemStatic) + sizeof(StageMeta<NS>) + sizeof merge_bar <= ops::attention_static_smem(NS),
                "static shared memory above the planner's bound (ops::attention_static_smem)");
  __shared__ StageMeta<NS> sg;
  SmemPtrs sp;
  sp.sK = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  sp.sV = sp.sK + NS * kTileTok * D;
  const int words = a.bitmap_words;
  sp.qbits = reinterpret_cast<std::uint32_t*>(sp.sV + NS * kTileTok * D);
  sp.ubits = sp.qbits + a.query_tile * words;
  sp.prefix = reinterpret_cast<int*>(sp.ubits + words);
  sp.reg_id = reinterpret_cast<int*>(sp.qbits);
  sp.reg_row = sp.reg_id + (a.topk + 1);
  sp.chunk = reinterpret_cast<int2*>(reinterpret_cast<unsigned char*>(sp.qbits) +
                                     ops::attention_chunk_offset(a.query_tile, words));
  sp.gate = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(sp.qbits) +
                                     ops::attention_meta_bytes(a.query_tile, words, a.topk) - 4 * kTileTok);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tile = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  // the one-query instance's split merge by pushes (cluster_merge_pushed): one condition for the
  // mbarrier's initialisation here, the cluster barrier after the ring and the merge (constant false
  // in the general instance)
  const bool push = ONE_Q && merges_by_cluster<D, NS>(a);
  if (push && tid == 0) {  // visible to the cluster before the barrier that lets the others push
    ptx::mbar_init(&merge_bar, 1);
    ptx::fence_mbarrier_init_cluster();
  }
  pdl_wait();  // q, the selections and the caches belong to the previous kernels of the step

  // The one-query instance's tile is one token, and a tile of one query is token `tile` whenever
  // cu_seqlens_q starts at 0 (the tiles count the tokens in request order): the loads that need
  // only the token — its selection row's ids and count (step 2'), Q fragments and gate logits
  // (step 4a) — are issued before step 1 finds the tile's request, so that the two round trips
  // overlap instead of following each other; step 1 confirms the token, and any other tile (a
  // broken cu_seqlens_q) loads them again for its own token below.
  std::uint32_t qf[D / 16][4];
  // thread tid < rows reads the gate logit of tile row tid (query tid / HPG, head tid % HPG)
  const auto gate_logit = [&](int t0, int rows_) {
    return tid < rows_ && a.gate != nullptr ? a.gate[(t0 + tid / HPG) * a.gate_stride + g * HPG + tid % HPG]
                                            : __float2bfloat16_rn(0.f);
  };
  __nv_bfloat16 glogit = __float2bfloat16_rn(0.f);
  RegionListLoads row_loads{-1, 0};
  if constexpr (ONE_Q) {
    TileWork guess;
    guess.t0 = tile, guess.nq = 1, guess.g = g;
    row_loads = load_region_list_row(a, tile, g, split, tid);
    load_q_fragments<D, HPG>(a, guess, 0, lane, qf);
    glogit = gate_logit(tile, HPG);
  }

  // 1. locate the tile
  if (warp == 0) locate_tile(a, ss, tile, lane);
  __syncthreads();
  if (!ss.tile_valid) return;
  TileWork w;
  w.b = ss.tile_b, w.t0 = ss.tile_t0, w.nq = ss.tile_nq, w.pos0 = ss.tile_pos0;
  w.pos_last = w.pos0 + w.nq - 1;
  w.g = g;
  w.words = words;
  // positions outside the block-table row (device seq_lens past the host-checked capacity, e.g. on
  // graph replay): their regions never enter the bitmaps; checked mode reports the tile
  if (a.bounds_fault != nullptr && g == 0 && split == 0 && tid == 0 &&
      (w.pos0 < 0 || static_cast<long long>(w.pos_last) >= static_cast<long long>(a.max_blocks) * a.block_size))
    report_bounds_fault(a.bounds_fault, ops::BoundsFault::kPositionBeyondRow, w.b, w.pos0 < 0 ? w.pos0 : w.pos_last, -1);

  // warp roles: RG row groups of 16 rows, TG token groups per stage (one-query instance: one row
  // group of hpg_q rows, 4 token groups, known at compile time)
  const int rows = ONE_Q ? HPG : w.nq * HPG;
  const int RG = ONE_Q ? 1 : ops::attention_row_groups(rows);
  const int TG = kWarps / RG;
  const int rg = warp % RG, tg = warp / RG;
  // 4a. Q fragments and the rows' gate logits: independent of steps 2-3, issued first so that
  // their loads overlap them (the one-query instance's, for token `tile`, before step 1)
  const bool preloaded = ONE_Q && w.t0 == tile;  // uniform
  if (!preloaded) {
    load_q_fragments<D, HPG>(a, w, rg, lane, qf);
    glogit = gate_logit(w.t0, rows);
  }

  w.list = ONE_Q || w.nq == 1;  // ONE_Q: the plan's query_tile 1 makes every tile one query
  if (w.list) {
    // 2'. one query: the split's share of its selection row, resolved up front
    if (!preloaded) row_loads = load_region_list_row(a, w.t0, w.g, split, tid);
    build_region_list(a, sp, w, split, tid, row_loads);
  } else if constexpr (!ONE_Q) {
    // 2. region bitmaps, their union and its prefix counts
    build_region_bitmaps(a, sp, ss, w, tid);
    build_union_prefix(sp, ss, w, tid, lane, warp);
    // 3. this split's share of the union
    split_union(sp.prefix[words], a.num_splits, split, w);
  }
  if (tid < rows) sp.gate[tid] = a.gate != nullptr ? gate_value(glogit) : 1.f;  // read after the epilogue's barriers
  if constexpr (!ONE_Q) {
    if (uses_per_query_gathers(a, ss, sp, w)) {
      // 2''. little reuse in this tile: its queries one after the other on their own rows
      attend_queries_in_turn<D, HPG, NS>(a, ss, sg, sp, w, tile, tid, lane, warp, qf);
      pdl_launch_dependents();
      return;
    }
  }

  // 4. the stages: QK mma, online softmax, PV mma
  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  SoftmaxState sm{-INFINITY, -INFINITY, 0.f, 0.f};
  const int i_lo = (rg * 16 + (lane >> 2)) / HPG, i_hi = (rg * 16 + (lane >> 2) + 8) / HPG;
  // 64-row tiles on wgmma where the head dim has the instructions and the ring is aligned to the
  // 128B swizzle's 1 KiB atoms (`smem_raw` is declared so; the check is a guard: were the base ever
  // misaligned, these tiles would run the mma.sync loop, with the same results, more slowly)
  // (the one-query instance: its list loop only)
  if constexpr (ONE_Q) attend_stages<D, 16, NS, false, true>(a, sg, sp, w, tid, lane, tg, i_lo, i_hi, qf, sm, acc);
  else if (WGT && kWgmmaTiles<D> && TG == 1 && (smem_u32(smem_raw) % ops::kAttentionSmemAlign) == 0u)
    attend_stages<D, 64, NS, WGT && kWgmmaTiles<D>>(a, sg, sp, w, tid, lane, tg, i_lo, i_hi, qf, sm, acc);
  else if (TG == 1) attend_stages<D, 64, NS>(a, sg, sp, w, tid, lane, tg, i_lo, i_hi, qf, sm, acc);
  else if (TG == 2) attend_stages<D, 32, NS>(a, sg, sp, w, tid, lane, tg, i_lo, i_hi, qf, sm, acc);
  // (one-query tiles have hpg_q <= 16 rows: TG == 4; the list loop is its own instance)
  else if (w.list) attend_stages<D, 16, NS, false, true>(a, sg, sp, w, tid, lane, tg, i_lo, i_hi, qf, sm, acc);
  else attend_stages<D, 16, NS>(a, sg, sp, w, tid, lane, tg, i_lo, i_hi, qf, sm, acc);
  cp_async_wait<0>();
  __syncthreads();
  pdl_launch_dependents();
  // the one-query instance (decode; hpg_q <= 16 rows, TG = 4) merges its splits by pushes
  // (cluster_merge_pushed) into the region past the warp stash: this CTA's ring is done with it,
  // so the other splits may write it once all have arrived here (relaxed: every read of the ring
  // has completed, its values used — a property of this instance's ring, which has no asynchronous
  // reader such as wgmma or TMA: were one added, this arrival would need release semantics; the
  // mbarrier's initialisation was released by its fence). The general instance keeps
  // cluster_merge_splits (its register budget: ptxas spilled several of its instances with the push
  // code in them)
  if (push) ptx::cluster_arrive_relaxed();

  // 5. epilogue: merge the warps of each row, store (gate, LSE) or write the split partials
  float* buf = reinterpret_cast<float*>(smem_raw);
  stash_warp_partials<D>(ss, buf, warp, lane, sm, acc);
  __syncthreads();
  // cluster merge buffers (ops::attention_cluster_merge_layout): partial in place over the stash
  // when one warp holds a row (TG == 1), else after the stash's 64 rows; LSE, then the weight table
  constexpr ops::AttentionClusterMergeLayout kCm = ops::attention_cluster_merge_layout(D);
  static_assert(kCm.partial == kTileTok * (D + 4) && kCm.weights == kCm.lse + kTileTok &&
                    kCm.merged_lse == kCm.weights + kTileTok * kMaxSplits,
                "cluster_merge_splits takes the weight table at lse + 64 and the merged LSEs after it");
  float* cpart = buf + (TG == 1 ? 0 : kCm.partial);
  float* clse = buf + kCm.lse;
  const bool to_cluster = merges_by_cluster<D, NS>(a);
  static_assert(16 * (D / 4) * 16 + (ops::kAttentionMaxClusterSplits - 1) * 16 <= 32 * (D + 4) * 4,
                "cluster_merge_pushed's receive buffer (S * ceil(n / S) float4, n = 16 rows x D / 4) within the "
                "32 rows of stride D + 4 of cluster_merge_splits' partial");
  merge_warps_and_store<D, HPG>(a, ss, buf, sp.gate, w, rows, RG, TG, tile, split, tid, to_cluster, cpart, clse, push,
                                buf + kCm.weights, ONE_Q ? &merge_bar : nullptr);
  if (push) {
    if constexpr (ONE_Q) cluster_merge_pushed<D, HPG>(a, &merge_bar, cpart, buf + kCm.weights, sp.gate, w, rows, split, tid);
  } else if (to_cluster) {
    cluster_merge_splits<D, HPG>(a, cpart, clse, buf + kCm.weights, sp.gate, w, rows, split, tid);
  } else if (a.num_splits > 1) {
    merge_if_last_split<D, HPG>(a, ss, buf, sp.gate, w, rows, tile, tid);
  }
#endif
}

}  // namespace step5::kernels::sm90
