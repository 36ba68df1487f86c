#pragma once
/// \file step5/ops/batch_check.hpp
/// The ONE validation of the host-visible preconditions of a step (SPEC.md §5 batch and cache
/// layout, §1 topk range), shared by every GPU launcher (ops/indexer.hpp, ops/attention.hpp,
/// ops/layer.hpp) and by the CPU reference (reference/common.hpp throws its message as
/// `step5::Error`), so the two can never disagree — with one addition on the reference's side: it
/// takes T from cu_seqlens_q[B], so at T = 0 it also requires every offset 0
/// (`reference::require_valid`), where a launcher, given num_tokens = 0, launches nothing. Also the host side of the kernels' checked
/// mode: the layout of the device fault record and its translation into a Status
/// (`bounds_fault_status`; reading it from the device: ops/bounds_fault.hpp).
///
/// Host-safe: g++-compilable, no CUDA headers.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"

namespace step5::ops {

/// A row width (leading dimension) to check: `value >= min` and `value % multiple == 0`.
struct RowWidthCheck {
  const char* name = nullptr;      ///< the field, e.g. "ldc"
  long long value = 0;
  long long min = 0;
  const char* min_name = "";       ///< what `min` is, e.g. "rows_with_w"
  long long multiple = 1;
  /// bytes per element of the rows (bf16 C: 2): with num_tokens > 0, the step's num_tokens rows of
  /// `min` elements, `value` apart, must end within 2^63 - 1 bytes (`require_strided_rows_fit`)
  std::uint64_t elem_bytes = 2;
};

/// Everything the host can see about one step (SPEC §5). Sizes are host values; the per-request
/// metadata are HOST arrays (the host mirrors of the device `cu_seqlens_q` / `seq_lens`).
/// Optional limits are checked only when set (an op that has no RoPE table sets no max_position).
struct StepCheck {
  const char* op = "step";                      ///< prefix of every message ("indexer_prepare", ...)
  int num_requests = 0;                         ///< B
  int num_tokens = 0;                           ///< T
  const std::int32_t* cu_seqlens_q = nullptr;   ///< host [B+1]
  const std::int32_t* seq_lens = nullptr;       ///< host [B]
  const char* cu_seqlens_q_name = "cu_seqlens_q_host";  ///< field named when cu_seqlens_q is null
  const char* seq_lens_name = "seq_lens_host";          ///< field named when seq_lens is null
  /// The DEVICE copies of cu_seqlens_q and seq_lens, which the kernels read: launchers set
  /// `device_arrays` and the two pointers (rule 2 then requires both non-null and, with the block
  /// table, 4-byte aligned); the CPU reference,
  /// whose arrays are the host ones above, leaves them unset.
  bool device_arrays = false;
  const void* cu_seqlens_q_device = nullptr;
  const void* seq_lens_device = nullptr;
  const char* cu_seqlens_q_device_name = "cu_seqlens_q";  ///< field named when cu_seqlens_q_device is null
  const char* seq_lens_device_name = "seq_lens";          ///< field named when seq_lens_device is null
  /// false: sizes only (workspace planning before a batch exists); the per-request rules are skipped.
  bool per_request = true;
  // the paged block table (SPEC §5)
  const std::int32_t* block_table = nullptr;  ///< [B, max_blocks] (device or host): must be non-null
  const char* block_table_name = "block_table";  ///< field named when block_table is null or misaligned
  int block_size = 0;  ///< tokens per block: a positive multiple of 8
  int max_blocks = 0;  ///< block-table row width: > 0; capacity = max_blocks * block_size positions
  int num_blocks = 0;  ///< blocks in the caches: > 0
  std::optional<int> topk;          ///< checked in [1, layout::kMaxTopk] when set
  std::optional<int> max_seq_len;   ///< when set: > 0 and every seq_len (of a request with rows) <= it
  std::optional<int> max_position;  ///< when set: > 0 and every position < it (RoPE table rows)
  /// When set: `workspace_bytes >= *workspace_required` (`workspace_hint` names the size query).
  std::optional<std::size_t> workspace_required;
  std::size_t workspace_bytes = 0;
  const char* workspace_hint = "";
  std::array<RowWidthCheck, 4> widths{};  ///< row widths; entries with name == nullptr are unused
  /// Optional HOST copies of device-resident state (rules 4 and 5; null: not checked on the host).
  /// The CPU reference always passes them (its tables are host arrays); a GPU caller passes them
  /// when it has them (PagedTable::block_table_host, the tail_slot_host of the summary outputs).
  const std::int32_t* block_table_host = nullptr;  ///< [B, max_blocks] host copy of block_table
  const std::int32_t* tail_slot_host = nullptr;    ///< [B] host copy of the tail slots
  int num_slots = 0;                               ///< tail slots (with tail_slot_host)
};

/// Bytes of one paged KV cache, [num_blocks, block_size, kv_heads, head_dim] bf16 (SPEC §5), the
/// extent `require_disjoint` tests for k_cache and v_cache; 0 for non-positive sizes.
inline std::uint64_t kv_cache_bytes(std::int64_t num_blocks, std::int64_t block_size, std::int64_t kv_heads,
                                    std::int64_t head_dim) {
  if (num_blocks <= 0 || block_size <= 0 || kv_heads <= 0 || head_dim <= 0) return 0;
  return static_cast<std::uint64_t>(num_blocks) * static_cast<std::uint64_t>(block_size) *
         static_cast<std::uint64_t>(kv_heads) * static_cast<std::uint64_t>(head_dim) * 2;
}

namespace detail {
/// Bytes of n int32 values, 0 for n <= 0: the extents of a step's int32 device arrays for
/// require_disjoint (step_array_ranges, tail_slot).
inline std::uint64_t int32s(std::int64_t n) { return n > 0 ? static_cast<std::uint64_t>(n) * 4 : 0; }
}  // namespace detail

/// The names `step_array_ranges` gives a step's device arrays in a refusal (as the caller's
/// parameters spell them).
struct StepArrayNames {
  const char* cu_seqlens_q = "batch.cu_seqlens_q";
  const char* seq_lens = "batch.seq_lens";
  const char* block_table = "table.block_table";
};
/// A step's device arrays as `require_disjoint` inputs (every launcher reads them while it
/// writes): cu_seqlens_q [B + 1], seq_lens [B] and block_table [B, max_blocks] int32 (SPEC §5); 0
/// bytes for a non-positive count.
inline std::array<NamedRange, 3> step_array_ranges(const std::int32_t* cu_seqlens_q, const std::int32_t* seq_lens,
                                                   const std::int32_t* block_table, std::int64_t num_requests,
                                                   std::int64_t max_blocks, StepArrayNames names = {}) {
  return {NamedRange{names.cu_seqlens_q, cu_seqlens_q, detail::int32s(num_requests + 1)},
          NamedRange{names.seq_lens, seq_lens, detail::int32s(num_requests)},
          NamedRange{names.block_table, block_table, detail::int32s(num_requests * max_blocks)}};
}

/// The largest block_size (tokens per KV-cache block) a step takes: the score kernels address
/// the pages of a region chunk with int32 region offsets (up to 64 pages of block_size / 8 regions
/// past a region id below 2^27), safe up to 2^27; 2^20 keeps a wide margin (engines use 16-256).
inline constexpr int kMaxBlockSize = 1 << 20;
/// Whether `block_size` is one a step takes: a positive multiple of kRegionSize (SPEC §5), at most
/// kMaxBlockSize (validate_step rule 1; the CPU model's LayerCache::create).
constexpr bool block_size_ok(int block_size) {
  return block_size > 0 && block_size % layout::kRegionSize == 0 && block_size <= kMaxBlockSize;
}

/// Checks `c` and returns Ok or kInvalidArgument with "<op>: <what> = <value>, expected <rule>".
/// Rules:
///  1. num_requests >= 0, num_tokens >= 0; topk in [1, kMaxTopk]; block_size a positive multiple
///     of 8, at most kMaxBlockSize; max_blocks > 0; num_blocks > 0; max_seq_len > 0; max_position > 0;
///     row widths (and, when num_tokens > 0, num_tokens rows of them within 2^63 - 1 bytes).
///  2. When num_tokens > 0 (and per_request): num_requests > 0; block_table and the host arrays
///     are non-null, and with `device_arrays` the device cu_seqlens_q and seq_lens too, and
///     those two and the (device) block_table 4-byte aligned (the kernels' int32 loads);
///     cu_seqlens_q[0] = 0, non-decreasing, cu_seqlens_q[B] = num_tokens; seq_lens[b] >= q_len_b;
///     for every request with rows (q_len_b > 0) its last position seq_lens[b] - 1 is
///     < capacity = max_blocks * block_size, seq_lens[b] <= max_seq_len and < max_position + 1.
///     (A request without rows this step touches no cache and is not held to the limits.)
///  3. When num_tokens > 0: workspace_bytes >= workspace_required.
///  4. When block_table_host is set (and per_request, num_tokens > 0): every block a request with
///     rows writes this step (the entries of its positions [seq_len - q_len, seq_len)) is in
///     [0, num_blocks), written by no other entry, and no other live entry of the table (entries
///     [0, ceil(seq_len / block_size)) of every request of the batch), except another request's
///     entry at the same block index whose positions in the block lie below the writer's seq_len
///     (a prefix block shared while it is filled, vLLM prefix caching: the step's writes land
///     before its reads). Blocks that no request writes may be shared freely.
///  5. When tail_slot_host is set (same conditions): every request with rows has a tail slot in
///     [0, num_slots) that no other request of the batch holds (with rows, or with pending rows:
///     seq_len % 8 != 0).
/// (Rules 4 and 5 run before rule 3.)
/// A step with num_tokens == 0 launches nothing: only rule 1 applies.
/// SPEC §1: 1 <= topk <= kMaxTopk. kInvalidArgument "<op>: topk = <v>, expected in [1, 1024] (SPEC §1)".
/// The one topk rule: validate_step, topk_select and the reference's selection call it.
inline Status check_topk(const char* op, int topk) {
  if (topk >= 1 && topk <= layout::kMaxTopk) return Status::Ok();
  return invalid_argument(std::string(op ? op : "step") + ": topk = " + std::to_string(topk) + ", expected in [1, " +
                          std::to_string(layout::kMaxTopk) + "] (SPEC §1)");
}

namespace detail {
/// Rules 4 and 5 of `validate_step` (after rules 1-2 passed: the host arrays are valid). Rule 4
/// sorts the step's written entries W (decode: about one per request) and looks every live entry
/// up among them: O(L log W) for L live entries, one allocation of W.
inline Status check_cross_request(const StepCheck& c) {
  auto s = [](long long v) { return std::to_string(v); };
  auto bad = [&](const std::string& m) { return invalid_argument(std::string(c.op ? c.op : "step") + ": " + m); };
  const int B = c.num_requests, bs = c.block_size;
  const std::int32_t* cu = c.cu_seqlens_q;
  auto q_len = [&](int b) { return cu[b + 1] - cu[b]; };
  if (c.block_table_host) {
    const std::int32_t* bt = c.block_table_host;
    auto entry = [&](int b, int j) { return bt[static_cast<std::size_t>(b) * c.max_blocks + j]; };
    auto live_blocks = [&](int b) {
      return static_cast<int>(std::min<long long>((static_cast<long long>(c.seq_lens[b]) + bs - 1) / bs, c.max_blocks));
    };
    auto first_written = [&](int b) { return q_len(b) > 0 ? (c.seq_lens[b] - q_len(b)) / bs : live_blocks(b); };
    struct Written {
      std::int32_t id;
      int b, j;
    };
    std::vector<Written> w;
    for (int b = 0; b < B; ++b)
      for (int j = first_written(b); j < live_blocks(b); ++j) {
        const std::int32_t id = entry(b, j);
        if (id < 0 || id >= c.num_blocks)
          return bad("request " + s(b) + ": block_table[" + s(b) + "][" + s(j) + "] = " + s(id) +
                     " receives positions this step, expected a block id in [0, num_blocks = " + s(c.num_blocks) + ")");
        w.push_back({id, b, j});
      }
    std::sort(w.begin(), w.end(), [](const Written& x, const Written& y) {
      return x.id != y.id ? x.id < y.id : (x.b != y.b ? x.b < y.b : x.j < y.j);
    });
    auto positions = [&](const Written& e) {  // the positions e receives this step
      const long long p0 = std::max<long long>(static_cast<long long>(e.j) * bs, c.seq_lens[e.b] - q_len(e.b));
      const long long p1 = std::min<long long>(static_cast<long long>(e.j + 1) * bs, c.seq_lens[e.b]) - 1;
      return s(p0) + ".." + s(p1);
    };
    auto conflict = [&](const Written& e, int b2, int j2) {
      return bad("request " + s(e.b) + ": block_table[" + s(e.b) + "][" + s(e.j) + "] = " + s(e.id) +
                 " receives positions " + positions(e) + " this step and is also block_table[" + s(b2) + "][" +
                 s(j2) + "] (" + (b2 == e.b ? std::string("the same request") : "request " + s(b2)) +
                 "), expected a block written by a step to be no other live entry of the table");
    };
    for (std::size_t i = 0; i + 1 < w.size(); ++i)  // two writers of one block
      if (w[i].id == w[i + 1].id) return conflict(w[i], w[i + 1].b, w[i + 1].j);
    // every other live entry: none may hold a written block, except a reader at the same block
    // index whose positions in it the writer computes this step (a prefix block shared while it
    // is being filled, as vLLM's prefix caching schedules: the step's writes land before its reads)
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < std::min(first_written(b), live_blocks(b)); ++j) {
        const std::int32_t id = entry(b, j);
        const auto it = std::lower_bound(w.begin(), w.end(), id, [](const Written& x, std::int32_t v) { return x.id < v; });
        if (it == w.end() || it->id != id) continue;
        const long long read_end = std::min<long long>(static_cast<long long>(j + 1) * bs, c.seq_lens[b]);
        if (it->b != b && it->j == j && read_end <= c.seq_lens[it->b]) continue;
        return conflict(*it, b, j);
      }
  }
  if (c.tail_slot_host) {
    // a slot is held by a request with rows (it writes the slot) and by one with pending rows
    // (seq_len % 8 != 0: they wait in the slot for the next step); a writer's slot is in range and
    // held by no other request
    std::vector<std::pair<std::int32_t, int>> held;  // (slot, request)
    for (int b = 0; b < B; ++b) {
      const bool writes = q_len(b) > 0;
      if (writes) {
        const std::int32_t slot = c.tail_slot_host[b];
        if (slot < 0 || slot >= c.num_slots)
          return bad("request " + s(b) + ": tail_slot[" + s(b) + "] = " + s(slot) + ", expected in [0, num_slots = " +
                     s(c.num_slots) + ")");
      }
      if (writes || c.seq_lens[b] % layout::kRegionSize != 0) held.emplace_back(c.tail_slot_host[b], b);
    }
    std::sort(held.begin(), held.end());
    for (std::size_t i = 0; i + 1 < held.size(); ++i) {
      if (held[i].first != held[i + 1].first) continue;
      const int x = held[i].second, y = held[i + 1].second;
      const int writer = q_len(y) > 0 ? y : x, other = writer == y ? x : y;
      if (q_len(writer) == 0) continue;  // two idle holders: nothing is written this step
      return bad("request " + s(writer) + ": tail_slot[" + s(writer) + "] = " + s(held[i].first) + " is also tail_slot[" +
                 s(other) + "] (request " + s(other) + (q_len(other) > 0 ? "" : ", whose pending rows wait there") +
                 "), expected a tail slot of its own for every request with rows this step");
    }
  }
  return Status::Ok();
}
}  // namespace detail

inline Status validate_step(const StepCheck& c) {
  // messages are built only on failure: a step of B requests runs this per op and per layer, and
  // one std::string per request cost ~3 µs of host time at B = 64 (eighth session)
  auto s = [](long long v) { return std::to_string(v); };
  auto bad = [&](const std::string& m) { return invalid_argument(std::string(c.op ? c.op : "step") + ": " + m); };
  if (c.num_requests < 0) return bad("num_requests = " + s(c.num_requests) + ", expected >= 0");
  if (c.num_tokens < 0) return bad("num_tokens = " + s(c.num_tokens) + ", expected >= 0");
  if (c.topk) STEP5_RETURN_IF_ERROR(check_topk(c.op, *c.topk));
  if (!block_size_ok(c.block_size))
    return bad("block_size = " + s(c.block_size) + ", expected a positive multiple of " + s(layout::kRegionSize) +
               " (SPEC §5), at most " + s(kMaxBlockSize));
  if (c.max_blocks <= 0) return bad("max_blocks = " + s(c.max_blocks) + ", expected > 0 (block-table row width)");
  if (c.num_blocks <= 0) return bad("num_blocks = " + s(c.num_blocks) + ", expected > 0");
  if (c.max_seq_len && *c.max_seq_len <= 0) return bad("max_seq_len = " + s(*c.max_seq_len) + ", expected > 0");
  if (c.max_position && *c.max_position <= 0)
    return bad("max_position = " + s(*c.max_position) + ", expected > 0 (RoPE table rows)");
  for (const RowWidthCheck& w : c.widths) {
    if (w.name == nullptr) continue;
    if (w.value < w.min || (w.multiple > 1 && w.value % w.multiple != 0))
      return bad(std::string(w.name) + " = " + s(w.value) + ", expected " +
                 (w.multiple > 1 ? "a multiple of " + s(w.multiple) + " " : std::string()) + ">= " +
                 (*w.min_name ? std::string(w.min_name) + " = " : std::string()) + s(w.min));
    if (c.num_tokens > 0)
      STEP5_RETURN_IF_ERROR(
          require_strided_rows_fit(c.op ? c.op : "step", w.name, c.num_tokens, w.value, w.min, w.elem_bytes));
  }
  if (c.num_tokens > 0 && c.per_request) {
    const int B = c.num_requests, T = c.num_tokens;
    if (B == 0) return bad("num_tokens = " + s(T) + " with num_requests = 0, expected num_requests > 0");
    if (c.block_table == nullptr) return bad(std::string(c.block_table_name) + " is null");
    const auto null_array = [&](const char* name, const char* expected) {
      return bad(std::string(name) + " is null, expected the " + expected);
    };
    if (c.device_arrays && c.cu_seqlens_q_device == nullptr)
      return null_array(c.cu_seqlens_q_device_name, "device copy of cu_seqlens_q [B+1] (the kernels read it)");
    if (c.device_arrays && c.seq_lens_device == nullptr)
      return null_array(c.seq_lens_device_name, "device copy of seq_lens [B] (the kernels read it)");
    if (c.device_arrays)  // the kernels' int32 loads of the three (a misaligned one is a sticky device fault)
      STEP5_RETURN_IF_ERROR(require_aligned(c.op ? c.op : "step", alignof(std::int32_t),
                                            {{c.cu_seqlens_q_device_name, c.cu_seqlens_q_device},
                                             {c.seq_lens_device_name, c.seq_lens_device},
                                             {c.block_table_name, c.block_table}}));
    if (c.cu_seqlens_q == nullptr) return null_array(c.cu_seqlens_q_name, "host copy of cu_seqlens_q [B+1]");
    if (c.seq_lens == nullptr) return null_array(c.seq_lens_name, "host copy of seq_lens [B]");
    const std::int32_t* cu = c.cu_seqlens_q;
    if (cu[0] != 0) return bad("cu_seqlens_q[0] = " + s(cu[0]) + ", expected 0");
    const long long capacity = static_cast<long long>(c.max_blocks) * c.block_size;
    for (int b = 0; b < B; ++b) {
      const long long q_len = static_cast<long long>(cu[b + 1]) - cu[b];
      const auto req = [&] { return "request " + s(b) + ": "; };
      if (q_len < 0)
        return bad(req() + "cu_seqlens_q[" + s(b + 1) + "] = " + s(cu[b + 1]) + " < cu_seqlens_q[" + s(b) + "] = " +
                   s(cu[b]) + ", expected non-decreasing");
      const long long len = c.seq_lens[b];
      if (len < q_len)
        return bad(req() + "seq_lens[" + s(b) + "] = " + s(len) + ", expected >= its query length " + s(q_len) +
                   " (cu_seqlens_q[" + s(b + 1) + "] - cu_seqlens_q[" + s(b) + "])");
      if (q_len == 0) continue;
      if (len > capacity)
        return bad(req() + "position " + s(len - 1) + " (seq_lens[" + s(b) + "] = " + s(len) +
                   "), expected positions < capacity " + s(capacity) + " = max_blocks " + s(c.max_blocks) +
                   " x block_size " + s(c.block_size) + " (its block-table row)");
      if (c.max_seq_len && len > *c.max_seq_len)
        return bad(req() + "seq_lens[" + s(b) + "] = " + s(len) + ", expected <= max_seq_len = " + s(*c.max_seq_len));
      if (c.max_position && len > *c.max_position)
        return bad(req() + "position " + s(len - 1) + " (seq_lens[" + s(b) + "] = " + s(len) +
                   "), expected positions < max_position = " + s(*c.max_position) + " (RoPE table rows)");
    }
    if (cu[B] != T)
      return bad("cu_seqlens_q[" + s(B) + "] = " + s(cu[B]) + ", expected num_tokens = " + s(T));
  }
  if (c.num_tokens > 0 && c.per_request && (c.block_table_host || c.tail_slot_host))
    STEP5_RETURN_IF_ERROR(detail::check_cross_request(c));
  if (c.num_tokens > 0 && c.workspace_required && c.workspace_bytes < *c.workspace_required)
    return bad("workspace_bytes = " + s(static_cast<long long>(c.workspace_bytes)) + ", expected >= " +
               s(static_cast<long long>(*c.workspace_required)) +
               (*c.workspace_hint ? " (" + std::string(c.workspace_hint) + ")" : std::string()));
  return Status::Ok();
}

// ---- checked mode: device-resident values (block ids, graph-replayed seq_lens) --------------------

/// Fault kinds of the checked-mode record.
enum class BoundsFault : std::int32_t {
  kNone = 0,
  kPositionBeyondRow = 1,   ///< a position outside [0, max_blocks * block_size): past the block-table row
  kBlockIdOutOfRange = 2,   ///< a block-table entry outside [0, num_blocks)
  kPositionBeyondRope = 3,  ///< a position outside [0, max_position) (indexer_prepare's RoPE tables)
  /// indexer_prepare doing step 4 in its own launch (a decode step by the host mirror) found a
  /// request with more than one token on the device; value = its q_len
  kFoldedStepNotDecode = 4,
  /// a token's history (position / 8 regions) past the `ld` regions of its score row: a device
  /// seq_len beyond the step's max_seq_len (by more than the rows' rounding: positions >=
  /// 8 * (ld + 1); the score and selection kernels cut the row there); position = the token's,
  /// value = ld
  kHistoryBeyondScoreRow = 5,
  /// a request with tokens in the step whose device tail_slot lies outside [0, num_slots)
  /// (indexer_summaries, indexer_prepare's folded step 4); value = the slot. Its tail rows are not
  /// written and no region that needs its pending rows is summarised (the summary keeps its bytes)
  kTailSlotOutOfRange = 6,
};

/// The checked-mode record: 4 int32 in device memory, zero-filled by the caller before the step.
/// The first fault of any kernel wins (atomic compare-and-swap on word 0):
/// `{kind (BoundsFault), request, position, value}` where value is the block id (kBlockIdOutOfRange),
/// the request's q_len (kFoldedStepNotDecode), the score row's ld (kHistoryBeyondScoreRow), the
/// tail slot (kTailSlotOutOfRange), else -1.
inline constexpr int kBoundsFaultWords = 4;

/// The geometry a fault record is interpreted against (the step's table and RoPE size).
struct BoundsFaultContext {
  int block_size = 0, max_blocks = 0, num_blocks = 0;
  int max_position = 0;  ///< 0: unknown
  int num_slots = 0;     ///< the tail buffer's slots; 0: unknown
};

/// Ok for an all-zero record, else kInvalidArgument naming the request, the position and the
/// bound (the record's host copy `rec[kBoundsFaultWords]`).
inline Status bounds_fault_status(const std::int32_t* rec, const BoundsFaultContext& t) {
  auto s = [](long long v) { return std::to_string(v); };
  const std::string where = "checked mode: request " + s(rec[1]) + ", position " + s(rec[2]) + ": ";
  switch (static_cast<BoundsFault>(rec[0])) {
    case BoundsFault::kNone: return Status::Ok();
    case BoundsFault::kPositionBeyondRow:
      return invalid_argument(where + "outside its block-table row, expected positions in [0, capacity " +
                              s(static_cast<long long>(t.max_blocks) * t.block_size) + " = max_blocks " +
                              s(t.max_blocks) + " x block_size " + s(t.block_size) +
                              ") (device seq_lens differ from the host mirror?)");
    case BoundsFault::kBlockIdOutOfRange:
      return invalid_argument(where + "block_table entry " + s(rec[2] >= 0 && t.block_size > 0 ? rec[2] / t.block_size : -1) +
                              " = " + s(rec[3]) + ", expected a block id in [0, num_blocks = " + s(t.num_blocks) + ")");
    case BoundsFault::kPositionBeyondRope:
      return invalid_argument(where + "outside the RoPE tables, expected positions in [0, max_position = " +
                              s(t.max_position) + ")");
    case BoundsFault::kFoldedStepNotDecode:
      return invalid_argument(where + "q_len = " + s(rec[3]) +
                              " in a step indexer_prepare summarised as decode, expected 1 (device cu_seqlens_q "
                              "differ from the host mirror?); the request's summary and tail row were not written");
    case BoundsFault::kHistoryBeyondScoreRow:
      return invalid_argument(where + "its history of " + s(rec[2] / layout::kRegionSize) + " regions exceeds the " +
                              s(rec[3]) + " regions of a score row, expected positions < " +
                              s(static_cast<long long>(layout::kRegionSize) * (rec[3] + 1LL)) +
                              " (the rows are sized for the step's max_seq_len; device seq_lens differ from the host "
                              "mirror?); its selection saw only the first " + s(rec[3]) + " regions");
    case BoundsFault::kTailSlotOutOfRange:
      return invalid_argument(where + "tail_slot = " + s(rec[3]) + ", expected a slot in [0, num_slots" +
                              (t.num_slots > 0 ? " = " + s(t.num_slots) : std::string()) +
                              ") (device tail_slot differ from the host copy?); its tail rows were not written and "
                              "no region that needs them was summarised");
  }
  return Status(StatusCode::kInternal, "checked mode: unknown fault kind " + s(rec[0]));
}

}  // namespace step5::ops
