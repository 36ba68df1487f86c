#pragma once
/// \file step5/reference/common.hpp
/// Shared pieces of the CPU reference (SPEC.md §4–5): batch metadata helpers (positions, request
/// of each packed token, validation), views of the paged caches, and a tiny `parallel_for`.
/// Host-safe (g++). Errors: every reference function throws `step5::Error`
/// (`StatusCode::kInvalidArgument`) whose message names the offending value and what was expected.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/layout/geometry.hpp"
#include "step5/ops/batch_check.hpp"

namespace step5::reference {

/// Packed batch metadata of one step (SPEC §5), non-owning.
/// - `cu_seqlens_q [num_requests + 1]`: token range of request b is [cu[b], cu[b+1]), cu[0] = 0.
/// - `seq_lens [num_requests]`: KV length of request b after this step (>= its q_len).
/// Token i of request b sits at position `seq_lens[b] - q_len_b + i`. q_len may be 0 (a request
/// without rows this step), 1 (decode), up to 4 (MTP verification) or a prefill chunk.
struct BatchView {
  int num_requests = 0;
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* seq_lens = nullptr;

  int num_tokens() const { return num_requests > 0 ? cu_seqlens_q[num_requests] : 0; }
  int q_len(int b) const { return cu_seqlens_q[b + 1] - cu_seqlens_q[b]; }
  /// Tokens of request b already in the caches before this step.
  int past_len(int b) const { return seq_lens[b] - q_len(b); }
};

/// Position of every packed token `[T]` (SPEC §5).
inline std::vector<std::int32_t> token_positions(const BatchView& batch) {
  std::vector<std::int32_t> pos(static_cast<std::size_t>(batch.num_tokens()));
  for (int b = 0; b < batch.num_requests; ++b)
    for (int t = batch.cu_seqlens_q[b]; t < batch.cu_seqlens_q[b + 1]; ++t)
      pos[t] = batch.past_len(b) + (t - batch.cu_seqlens_q[b]);
  return pos;
}

/// Request index of every packed token `[T]`.
inline std::vector<std::int32_t> token_requests(const BatchView& batch) {
  std::vector<std::int32_t> req(static_cast<std::size_t>(batch.num_tokens()));
  for (int b = 0; b < batch.num_requests; ++b)
    for (int t = batch.cu_seqlens_q[b]; t < batch.cu_seqlens_q[b + 1]; ++t) req[t] = b;
  return req;
}

/// The paged block table shared by the KV cache and the summary cache (SPEC §5), non-owning.
/// `block_table [num_requests, max_blocks]` int32; the token at position p of request b lives in
/// block `block_table[b * max_blocks + p / block_size]`, row `p % block_size`; region r lives in
/// block `block_table[b * max_blocks + 8r / block_size]`, slot `(8r % block_size) / 8`.
struct BlockTableView {
  const std::int32_t* block_table = nullptr;
  int max_blocks = 0;   ///< row stride of block_table (blocks per request)
  int block_size = 0;   ///< tokens per block, a multiple of 8 (R)
  int num_blocks = 0;   ///< blocks in the cache (ids must lie in [0, num_blocks))

  /// Physical block holding position `pos` of request `b` (throws when out of range).
  int block_of(int b, int pos) const {
    const int j = pos / block_size;
    require(j < max_blocks, "block_table",
            "position " + std::to_string(pos) + " of request " + std::to_string(b) + " needs block slot " +
                std::to_string(j) + " but max_blocks = " + std::to_string(max_blocks));
    const int blk = block_table[static_cast<std::size_t>(b) * max_blocks + j];
    require(blk >= 0 && blk < num_blocks, "block_table",
            "block_table[" + std::to_string(b) + "][" + std::to_string(j) + "] = " + std::to_string(blk) +
                ", expected in [0, num_blocks = " + std::to_string(num_blocks) + ")");
    return blk;
  }
};

/// The shared step validation (ops::validate_step, ops/batch_check.hpp — the same function every
/// GPU launcher calls) for `batch` with block table `bt`: cu_seqlens_q starts at 0, is
/// non-decreasing and ends at T; seq_lens[b] >= q_len; every position of the step <
/// max_blocks * block_size; block_size a positive multiple of 8; max_blocks, num_blocks > 0; a
/// block written by the step is no other live entry of the table (validate_step's rule 4).
/// Callers add their limits (topk, max_position, row widths) and pass it to `require_valid`
/// (which adds the reference's one rule beyond validate_step: a step of no tokens has every
/// cu_seqlens_q[b] = 0).
inline ops::StepCheck step_check(const char* where, const BatchView& batch, const BlockTableView& bt) {
  ops::StepCheck c;
  c.op = where;
  c.num_requests = batch.num_requests;
  // T is cu_seqlens_q[B]; with a null array the per-request rules must still run (and name it)
  c.num_tokens = batch.num_requests <= 0 ? 0 : (batch.cu_seqlens_q ? batch.cu_seqlens_q[batch.num_requests] : 1);
  c.cu_seqlens_q = batch.cu_seqlens_q;
  c.seq_lens = batch.seq_lens;
  c.cu_seqlens_q_name = "cu_seqlens_q";
  c.seq_lens_name = "seq_lens";
  c.block_table = bt.block_table;
  c.block_table_host = bt.block_table;  // a host array: the cross-request rule applies (rule 4)
  c.block_size = bt.block_size;
  c.max_blocks = bt.max_blocks;
  c.num_blocks = bt.num_blocks;
  return c;
}

/// Throws `Error(kInvalidArgument, message)` with the message of `ops::validate_step(c)` when the
/// step is refused (the GPU launchers return the same message as a Status). The reference takes
/// T from cu_seqlens_q[B] (`step_check`) and loops over every request's [cu[b], cu[b+1]), so a
/// step of no tokens (cu_seqlens_q[B] = 0, where validate_step applies rule 1 only) must have
/// every cu_seqlens_q[b] = 0 too: [0, 5, 0] or [-3, 0] used to pass and the loops wrote and read
/// token rows of a step sized for none (positions, k/v rows, tail slots: out of bounds).
inline void require_valid(const ops::StepCheck& c) {
  const Status s = ops::validate_step(c);
  if (!s.ok()) throw Error(s);
  if (c.per_request && c.num_tokens == 0 && c.num_requests > 0 && c.cu_seqlens_q != nullptr)
    for (int b = 0; b < c.num_requests; ++b)
      if (c.cu_seqlens_q[b] != 0)
        throw Error(StatusCode::kInvalidArgument,
                    std::string(c.op ? c.op : "step") + ": cu_seqlens_q[" + std::to_string(b) + "] = " +
                        std::to_string(c.cu_seqlens_q[b]) + " with cu_seqlens_q[" + std::to_string(c.num_requests) +
                        "] = 0 (a step of no tokens), expected 0 (cu_seqlens_q starts at 0, is non-decreasing and "
                        "ends at num_tokens)");
}

/// `require_valid(step_check(where, batch, bt))`.
inline void validate_step(const BatchView& batch, const BlockTableView& bt, const char* where) {
  require_valid(step_check(where, batch, bt));
}

/// Runs `fn(i)` for i in [0, n) on up to min(8, hardware_concurrency) threads (static contiguous
/// chunks; results never depend on the thread count since each i is computed alone). An exception
/// thrown by `fn` is rethrown on the calling thread after all workers joined.
template <class F>
void parallel_for(int n, F&& fn) {
  if (n <= 0) return;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int nt = std::min(n, std::min(hw, 8));
  if (nt <= 1 || n < 2) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(nt));
  threads.reserve(static_cast<std::size_t>(nt));
  for (int w = 0; w < nt; ++w) {
    const int lo = static_cast<int>(static_cast<long long>(n) * w / nt);
    const int hi = static_cast<int>(static_cast<long long>(n) * (w + 1) / nt);
    threads.emplace_back([lo, hi, w, &fn, &errors] {
      try {
        for (int i = lo; i < hi; ++i) fn(i);
      } catch (...) {
        errors[static_cast<std::size_t>(w)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);  // the first failing chunk's exception
}

/// bf16 vector <-> fp32 helpers.
inline std::vector<float> to_float_vector(const bf16* x, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = to_float(x[i]);
  return out;
}
inline std::vector<bf16> to_bf16_vector(const float* x, std::size_t n) {
  std::vector<bf16> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = to_bf16(x[i]);
  return out;
}

}  // namespace step5::reference
