// The one validation of a step's host-visible preconditions (ops::validate_step, issue 12 §1):
// each rule with its message, the example (a decode at position 128 with room for 128
// positions), and the CPU reference refusing with the same message (it calls the same function).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "reference_test_util.hpp"
#include "step5/ops/batch_check.hpp"
#if __has_include(<cuda_runtime_api.h>)  // the launchers' headers need the CUDA runtime API header
#include "step5/ops/attention.hpp"  // attention_step_check
#include "step5/ops/indexer.hpp"    // step_check (the indexer launchers and dsa_layer_run)
#endif

using namespace reftest;
namespace ref = step5::reference;
using step5::StatusCode;
using step5::ops::StepCheck;
using step5::ops::validate_step;

namespace {

// The message without its "<op>: " prefix (the part the reference and the launchers share).
std::string body(const std::string& m) {
  const auto i = m.find(": ");
  return i == std::string::npos ? m : m.substr(i + 2);
}

// The step: block_size 64, max_blocks 2 (capacity 128), request 0 decoding at position
// 128 (seq_len 129), request 1 at position 10.
struct Example {
  std::vector<std::int32_t> cu = {0, 1, 2}, seq = {129, 11}, table = {0, 1, 2, 3};
  StepCheck check() const {
    StepCheck c;
    c.op = "op";
    c.num_requests = 2;
    c.num_tokens = 2;  // the tests that change cu keep num_tokens at 2 unless they set it
    c.cu_seqlens_q = cu.data();
    c.seq_lens = seq.data();
    c.block_table = table.data();
    c.block_size = 64;
    c.max_blocks = 2;
    c.num_blocks = 4;
    return c;
  }
};

void expect_refused(const StepCheck& c, std::initializer_list<const char*> needles) {
  const step5::Status s = validate_step(c);
  REQUIRE_MESSAGE(!s.ok(), "expected a refusal");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().rfind(std::string(c.op) + ": ", 0) == 0);
  for (const char* n : needles) CHECK_MESSAGE(s.message().find(n) != std::string::npos, s.message(), " lacks '", n, "'");
}

}  // namespace

TEST_CASE("validate_step: the issue's example (position 128, capacity 128, request 0) is refused") {
  Example e;
  expect_refused(e.check(), {"request 0", "position 128", "capacity 128", "max_blocks 2", "block_size 64"});
  // one position less fits exactly
  e.seq[0] = 128;
  CHECK(validate_step(e.check()).ok());
  // request 1 past its row is named as request 1
  e.seq = {10, 129};
  expect_refused(e.check(), {"request 1", "position 128", "capacity 128"});
  // a request without rows this step touches no cache: not held to the capacity
  e.cu = {0, 0, 2};
  e.seq = {500, 11};
  CHECK(validate_step(e.check()).ok());
}

TEST_CASE("validate_step: cu_seqlens_q rules") {
  Example e;
  e.seq = {10, 11};
  e.cu = {1, 1, 2};
  expect_refused(e.check(), {"cu_seqlens_q[0] = 1", "expected 0"});
  e.cu = {0, 2, 1};
  expect_refused(e.check(), {"request 1", "cu_seqlens_q[2] = 1", "cu_seqlens_q[1] = 2", "non-decreasing"});
  e.cu = {0, 1, 3};
  expect_refused(e.check(), {"cu_seqlens_q[2] = 3", "expected num_tokens = 2"});
  e.cu = {0, 1, 1};
  expect_refused(e.check(), {"cu_seqlens_q[2] = 1", "expected num_tokens = 2"});
  StepCheck c = e.check();
  c.num_requests = 0;
  expect_refused(c, {"num_requests = 0"});
  c = e.check();
  c.num_tokens = -1;
  expect_refused(c, {"num_tokens = -1"});
}

TEST_CASE("validate_step: seq_len against q_len, max_seq_len and max_position") {
  Example e;
  e.cu = {0, 1, 2};
  e.seq = {0, 11};
  expect_refused(e.check(), {"request 0", "seq_lens[0] = 0", "query length 1"});
  e.cu = {0, 3, 4};
  e.seq = {2, 11};
  StepCheck q = e.check();
  q.num_tokens = 4;
  expect_refused(q, {"request 0", "seq_lens[0] = 2", "query length 3"});
  e.cu = {0, 1, 2};
  e.seq = {20, 11};
  StepCheck c = e.check();
  c.max_seq_len = 16;
  expect_refused(c, {"request 0", "seq_lens[0] = 20", "max_seq_len = 16"});
  c.max_seq_len = 20;
  CHECK(validate_step(c).ok());
  c.max_position = 19;
  expect_refused(c, {"request 0", "position 19", "max_position = 19"});
  c.max_position = 20;
  CHECK(validate_step(c).ok());
  c.max_seq_len = 0;
  expect_refused(c, {"max_seq_len = 0"});
  c.max_seq_len.reset();
  c.max_position = 0;
  expect_refused(c, {"max_position = 0"});
}

TEST_CASE("validate_step: topk, workspace, table sizes, row widths, null arrays") {
  Example e;
  e.seq = {10, 11};
  StepCheck c = e.check();
  for (int bad : {0, 1025, -3}) {
    c.topk = bad;
    expect_refused(c, {("topk = " + std::to_string(bad)).c_str(), "[1, 1024]"});
  }
  c.topk = 1;
  CHECK(validate_step(c).ok());
  c.topk = step5::layout::kMaxTopk;
  CHECK(validate_step(c).ok());
  c.workspace_required = 4096;
  c.workspace_bytes = 4095;
  c.workspace_hint = "size_query()";
  expect_refused(c, {"workspace_bytes = 4095", ">= 4096", "size_query()"});
  c.workspace_bytes = 4096;
  CHECK(validate_step(c).ok());
  c.num_tokens = 0;  // nothing launched: the workspace is not needed
  c.cu_seqlens_q = nullptr;
  c.workspace_bytes = 0;
  CHECK(validate_step(c).ok());

  for (int bs : {0, 12, -8, step5::ops::kMaxBlockSize + 8, 1 << 29}) {
    c = e.check();
    c.block_size = bs;
    expect_refused(c, {("block_size = " + std::to_string(bs)).c_str(), "multiple of 8", "at most 1048576"});
  }
  c = e.check();
  c.max_blocks = 0;
  expect_refused(c, {"max_blocks = 0"});
  c = e.check();
  c.num_blocks = 0;
  expect_refused(c, {"num_blocks = 0"});
  c = e.check();
  c.widths[0] = {"ldc", 101, 100, "rows_with_w", 2};
  expect_refused(c, {"ldc = 101", "multiple of 2", "rows_with_w = 100"});
  c.widths[0].value = 98;
  expect_refused(c, {"ldc = 98", ">= rows_with_w = 100"});
  c.widths[0].value = 102;
  CHECK(validate_step(c).ok());
  c = e.check();
  c.cu_seqlens_q = nullptr;
  c.cu_seqlens_q_name = "batch.cu_seqlens_q_host";
  expect_refused(c, {"batch.cu_seqlens_q_host is null"});
  c = e.check();
  c.seq_lens = nullptr;
  expect_refused(c, {"seq_lens_host is null"});
  c = e.check();
  c.block_table = nullptr;
  expect_refused(c, {"block_table is null"});
  c.block_table_name = "table.block_table";  // named as the launcher's field (ops::step_check)
  expect_refused(c, {"table.block_table is null"});
  c.per_request = false;  // planning: sizes only
  CHECK(validate_step(c).ok());

  // the device arrays the kernels read (launchers: device_arrays); the CPU reference has none
  const std::int32_t device_stand_in[1] = {0};
  c = e.check();
  CHECK(validate_step(c).ok());  // device_arrays unset: not checked
  c.device_arrays = true;
  c.cu_seqlens_q_device = device_stand_in;
  c.seq_lens_device = nullptr;
  c.seq_lens_device_name = "batch.seq_lens";
  expect_refused(c, {"batch.seq_lens is null", "device copy of seq_lens"});
  c.seq_lens_device = device_stand_in;
  c.cu_seqlens_q_device = nullptr;
  expect_refused(c, {"cu_seqlens_q is null", "device copy of cu_seqlens_q"});
  c.cu_seqlens_q_device = device_stand_in;
  CHECK(validate_step(c).ok());
  c.cu_seqlens_q_device = c.seq_lens_device = nullptr;
  c.num_tokens = 0;  // nothing launched: not needed
  CHECK(validate_step(c).ok());
  c.num_tokens = 2;
  c.per_request = false;  // planning: sizes only
  CHECK(validate_step(c).ok());
}

TEST_CASE("validate_step: device batch arrays or a block table not 4-byte aligned are refused naming them") {
  // the kernels load cu_seqlens_q, seq_lens and the block table as int32 (__ldg): a pointer 2 bytes
  // off was a sticky misaligned-address fault; the launchers pass the device arrays (device_arrays)
  Example e;
  e.seq = {128, 11};  // within the capacity
  alignas(16) static unsigned char device_stand_in[64] = {};
  const auto at = [](int off) { return static_cast<const void*>(device_stand_in + off); };
  StepCheck c = e.check();
  c.device_arrays = true;
  c.cu_seqlens_q_device = at(0), c.seq_lens_device = at(16);
  c.cu_seqlens_q_device_name = "batch.cu_seqlens_q", c.seq_lens_device_name = "batch.seq_lens";
  c.block_table = reinterpret_cast<const std::int32_t*>(at(32));  // a device table: never read by the host
  CHECK(validate_step(c).ok());
  for (int off : {1, 2, 3}) {
    CAPTURE(off);
    StepCheck d = c;
    d.cu_seqlens_q_device = at(off);
    expect_refused(d, {"batch.cu_seqlens_q is at an address = ", "mod 4, expected 4-byte aligned"});
    d = c;
    d.seq_lens_device = at(16 + off);
    expect_refused(d, {"batch.seq_lens is at an address = ", "mod 4, expected 4-byte aligned"});
    d = c;
    d.block_table = reinterpret_cast<const std::int32_t*>(at(32 + off));
    expect_refused(d, {"block_table is at an address = ", "mod 4, expected 4-byte aligned"});
    d.block_table_name = "table.block_table";
    expect_refused(d, {"table.block_table is at an address = "});
    d.num_tokens = 0;  // nothing launched: sizes only
    CHECK(validate_step(d).ok());
  }
  // the CPU reference (no device arrays) reads its own host arrays: not checked
  StepCheck h = e.check();
  h.block_table = reinterpret_cast<const std::int32_t*>(at(34));
  h.block_table_host = nullptr;
  CHECK(validate_step(h).ok());
}

#if __has_include(<cuda_runtime_api.h>)
TEST_CASE("validate_step: a row width whose num_tokens rows end past 2^63 - 1 bytes is refused naming it") {
  // indexer_prepare / indexer_summaries read C's row t at c + t * ldc: ldc had a lower bound only
  // (>= rows_with_w), so T = 2 with ldc = 2^62 put row 1 at byte offset 2^63 (a load past the
  // address space), and their overlap checks' extent ((T - 1) * ldc + rows_with_w) * 2 wrapped
  // at ldc = 2^63 - 2 (an even value: prepare's multiple of 2).
  Example e;
  e.seq = {128, 11};  // the example's step within its capacity (128 positions)
  StepCheck c = e.check();
  const long long max = 0x7fffffffffffffffLL;
  const long long largest = max / 2 - 100;  // (2 - 1) * ldc + 100 <= max / 2 elements
  for (const long long ldc : {1LL << 62, largest + 1, max - 1}) {
    c.widths[0] = {"ldc", ldc, 100, "rows_with_w", 1};
    CAPTURE(ldc);
    expect_refused(c, {("ldc = " + std::to_string(ldc) + " with 2 rows of 100").c_str(),
                       ("expected ldc <= " + std::to_string(largest)).c_str()});
  }
  c.widths[0] = {"ldc", largest, 100, "rows_with_w", 1};
  CHECK_MESSAGE(validate_step(c).ok(), validate_step(c).message());
  c.num_tokens = 0, c.num_requests = 0;  // no rows: only the lower bound applies
  c.widths[0] = {"ldc", max, 100, "rows_with_w", 1};
  CHECK(validate_step(c).ok());
}

TEST_CASE("launchers' step checks require the device batch arrays (indexer ops, dsa_layer_run, sparse_attention)") {
  // ops::step_check (every indexer launcher and dsa_layer_run) and attention_step_check set the
  // device pointers: a null one is refused before anything is launched, naming the field
  std::vector<std::int32_t> cu = {0, 1}, seq = {100}, table = {0, 1};
  const std::int32_t device_stand_in[1] = {0};
  step5::ops::IndexerBatch b{device_stand_in, device_stand_in, 1, 1, cu.data(), seq.data()};
  step5::ops::PagedTable t;
  t.block_table = table.data(), t.block_size = 64, t.max_blocks = 2, t.num_blocks = 2;
  CHECK(validate_step(step5::ops::step_check("indexer_select", b, t)).ok());
  b.cu_seqlens_q = nullptr;
  expect_refused(step5::ops::step_check("indexer_select", b, t), {"indexer_select: batch.cu_seqlens_q is null"});
  b.cu_seqlens_q = device_stand_in, b.seq_lens = nullptr;
  expect_refused(step5::ops::step_check("indexer_prepare", b, t), {"indexer_prepare: batch.seq_lens is null"});
  step5::ops::SparseAttentionParams a;
  a.num_requests = 1, a.num_tokens = 1, a.cu_seqlens_q_host = cu.data(), a.seq_lens_host = seq.data();
  a.cu_seqlens_q = device_stand_in, a.seq_lens = device_stand_in;
  a.block_table = table.data(), a.block_size = 64, a.max_blocks = 2, a.num_blocks = 2, a.topk = 8;
  CHECK(validate_step(step5::ops::attention_step_check(a, true)).ok());
  a.seq_lens = nullptr;
  expect_refused(step5::ops::attention_step_check(a, true), {"sparse_attention: seq_lens is null"});
  CHECK(validate_step(step5::ops::attention_step_check(a, false)).ok());  // planning: sizes only
}

TEST_CASE("indexer_select_chunks: a RankLayout of no KV groups gives one chunk, no division by zero") {
  // a default (not make_rank_layout) RankLayout has local_kv_groups = 0: 0 score bytes per token,
  // which divided the workspace (SIGFPE); the launchers refuse such a rank, the helper must not crash
  const step5::layout::RankLayout none{};
  const step5::ops::SelectChunks c = step5::ops::indexer_select_chunks(none, 10, 100, 1, std::size_t{1} << 20);
  CHECK(c.count == 1);
  CHECK(c.max_tokens() == 10);
}
#endif  // __has_include(<cuda_runtime_api.h>)

TEST_CASE("validate_step: a block written by the step belongs to one request (rule 4, host copy of the table)") {
  // two requests decoding (positions 70 and 10), block_size 64, 2 blocks per row
  Example e;
  e.seq = {71, 11};
  StepCheck c = e.check();
  CHECK(validate_step(c).ok());  // no host copy: not checked
  c.block_table_host = e.table.data();
  CHECK(validate_step(c).ok());  // {0, 1}, {2, 3}: disjoint
  // request 1 writes position 10 into block 1, where request 0 writes position 70 (its second
  // block): both write it; the first writer by request is named, with the other entry
  e.table = {0, 1, 1, 3};
  c = e.check();
  c.block_table_host = e.table.data();
  expect_refused(c, {"request 0", "block_table[0][1] = 1", "positions 70..70", "block_table[1][0] (request 1)",
                     "expected a block written by a step to be no other live entry of the table"});
  // a shared prefix block that nobody writes is allowed: both rows start with block 0, request 0
  // writes position 70 (block 1), request 1 a new region of its own: seq 65 -> position 64 in block 3
  e.table = {0, 1, 0, 3};
  e.seq = {71, 65};
  c = e.check();
  c.block_table_host = e.table.data();
  CHECK(validate_step(c).ok());
  // ... but writing into it is refused (request 1 at position 10 of the shared block 0)
  e.seq = {71, 11};
  c = e.check();
  c.block_table_host = e.table.data();
  expect_refused(c, {"request 1", "block_table[1][0] = 0", "block_table[0][0] (request 0)"});
  // the same block twice in one row: the write to the second entry lands in the first
  e.table = {1, 1, 2, 3};
  c = e.check();
  c.block_table_host = e.table.data();
  expect_refused(c, {"request 0", "block_table[0][1] = 1", "block_table[0][0] (the same request)"});
  // vLLM prefix caching: request 1 hits request 0's block 5 while request 0 fills it in this same
  // step (its positions 0..63): allowed at the same block index when the reader's positions in it
  // lie below the writer's seq_len; not at another index, nor when it reads past what is written
  {
    const std::vector<std::int32_t> cu = {0, 64, 71}, seq = {64, 71}, prefix = {5, -1, 5, 7};
    StepCheck p = e.check();
    p.cu_seqlens_q = cu.data(), p.seq_lens = seq.data(), p.num_tokens = 71, p.num_blocks = 8;
    p.block_table_host = prefix.data();
    CHECK(validate_step(p).ok());
    const std::vector<std::int32_t> other_index = {5, -1, 7, 5};  // request 1's block 5 at index 1
    p.block_table_host = other_index.data();
    expect_refused(p, {"request 0", "block_table[0][0] = 5", "positions 0..63", "block_table[1][1] (request 1)"});
    const std::vector<std::int32_t> seq_short = {40, 71}, cu_short = {0, 40, 47};  // request 0 fills only 0..39
    p.cu_seqlens_q = cu_short.data(), p.seq_lens = seq_short.data(), p.num_tokens = 47;
    p.block_table_host = prefix.data();
    expect_refused(p, {"request 0", "block_table[0][0] = 5", "positions 0..39", "block_table[1][0] (request 1)"});
  }
  // a written entry outside [0, num_blocks)
  e.table = {0, 9, 2, 3};
  c = e.check();
  c.block_table_host = e.table.data();
  expect_refused(c, {"request 0", "block_table[0][1] = 9", "num_blocks = 4"});
  // ... while an unwritten entry past the request's length is not looked at
  e.table = {0, 1, 2, -5};
  c = e.check();
  c.block_table_host = e.table.data();
  CHECK(validate_step(c).ok());
}

TEST_CASE("validate_step: every request with rows has a tail slot of its own, below num_slots (rule 5)") {
  Example e;
  e.seq = {71, 11};
  StepCheck c = e.check();
  const std::vector<std::int32_t> ok = {1, 0}, same = {1, 1}, out = {0, 2}, neg = {-1, 0};
  c.num_slots = 2;
  c.tail_slot_host = ok.data();
  CHECK(validate_step(c).ok());
  c.tail_slot_host = same.data();
  expect_refused(c, {"request 1", "tail_slot[1] = 1 is also tail_slot[0] (request 0)"});
  c.tail_slot_host = out.data();
  expect_refused(c, {"request 1", "tail_slot[1] = 2", "num_slots = 2"});
  c.tail_slot_host = neg.data();
  expect_refused(c, {"request 0", "tail_slot[0] = -1"});
  // a request without rows this step writes no slot: with no pending rows (seq_len % 8 == 0) it
  // may share one; with pending rows waiting in its slot, a writer may not
  e.cu = {0, 1, 1};
  e.seq = {71, 16};
  c = e.check();
  c.num_tokens = 1;
  c.num_slots = 2;
  c.tail_slot_host = same.data();
  CHECK(validate_step(c).ok());
  e.seq = {71, 11};
  c = e.check();
  c.num_tokens = 1;
  c.num_slots = 2;
  c.tail_slot_host = same.data();
  expect_refused(c, {"request 0", "tail_slot[0] = 1 is also tail_slot[1]", "pending rows wait there"});
}

TEST_CASE("CPU reference: a step that writes another request's block, or shares a tail slot, is refused before any write") {
  Example e;
  e.seq = {71, 11};
  e.table = {0, 1, 1, 3};  // request 1's block 0 is request 0's block 1
  const ref::BatchView batch{2, e.cu.data(), e.seq.data()};
  const ref::BlockTableView bt{e.table.data(), 2, 64, 4};
  const int KVl = 1, D = 64, P = 64;
  const std::vector<bf16> k = random_bf16(2 * D, 1.f, 11);
  std::vector<bf16> kc = random_bf16(4 * 64 * D, 1.f, 12), vc = random_bf16(kc.size(), 1.f, 13);
  const std::vector<bf16> kc0 = kc;
  auto refused = [](auto&& fn, std::initializer_list<const char*> needles) {
    try {
      fn();
    } catch (const step5::Error& err) {
      CHECK(err.code() == StatusCode::kInvalidArgument);
      for (const char* n : needles) CHECK_MESSAGE(std::string(err.what()).find(n) != std::string::npos, err.what());
      return;
    }
    FAIL("no exception");
  };
  refused([&] { ref::write_kv_cache(batch, bt, KVl, D, k.data(), D, k.data(), D, kc.data(), vc.data()); },
          {"write_kv_cache", "request 0", "block_table[0][1] = 1", "block_table[1][0] (request 1)"});
  CHECK(std::memcmp(kc.data(), kc0.data(), kc.size() * sizeof(bf16)) == 0);
  // tail slots: a shared slot, then one out of range, refused before the first request's summary
  e.table = {0, 1, 2, 3};
  const ref::BlockTableView bt2{e.table.data(), 2, 64, 4};
  std::vector<bf16> tail = random_bf16(2 * 8 * 2 * P, 1.f, 14);
  const std::vector<bf16> ik = random_bf16(2 * P, 1.f, 15);
  const std::vector<bf16> tail0 = tail;
  std::vector<std::uint8_t> sum(4 * 8 * P);
  const std::vector<std::int32_t> shared = {0, 0}, out = {0, 5};
  refused([&] { ref::update_summaries(batch, bt2, P, ik.data(), P, ik.data(), P, tail.data(), 2, shared.data(), sum.data()); },
          {"update_summaries", "tail_slot[1] = 0 is also tail_slot[0]"});
  refused([&] { ref::update_summaries(batch, bt2, P, ik.data(), P, ik.data(), P, tail.data(), 2, out.data(), sum.data()); },
          {"update_summaries", "tail_slot[1] = 5", "num_slots = 2"});
  CHECK(std::memcmp(tail.data(), tail0.data(), tail.size() * sizeof(bf16)) == 0);
}

TEST_CASE("checked mode: fault records become Status naming request, position and bound") {
  const step5::ops::BoundsFaultContext ctx{64, 2, 4, 4096};
  const std::int32_t none[4] = {0, 0, 0, 0};
  CHECK(step5::ops::bounds_fault_status(none, ctx).ok());
  const std::int32_t row[4] = {1, 0, 128, -1};
  const step5::Status s1 = step5::ops::bounds_fault_status(row, ctx);
  CHECK(s1.code() == StatusCode::kInvalidArgument);
  for (const char* n : {"request 0", "position 128", "capacity 128"}) CHECK(s1.message().find(n) != std::string::npos);
  const std::int32_t blk[4] = {2, 1, 70, 99};
  const step5::Status s2 = step5::ops::bounds_fault_status(blk, ctx);
  for (const char* n : {"request 1", "position 70", "entry 1 = 99", "num_blocks = 4"})
    CHECK_MESSAGE(s2.message().find(n) != std::string::npos, s2.message());
  const std::int32_t rope[4] = {3, 0, 5000, -1};
  CHECK(step5::ops::bounds_fault_status(rope, ctx).message().find("max_position = 4096") != std::string::npos);
  const std::int32_t hist[4] = {5, 1, 104, 12};  // max_seq_len 100: rows of 12 regions, position 104
  const step5::Status s5 = step5::ops::bounds_fault_status(hist, ctx);
  CHECK(s5.code() == StatusCode::kInvalidArgument);
  for (const char* n : {"request 1", "position 104", "history of 13 regions exceeds the 12 regions", "positions < 104"})
    CHECK_MESSAGE(s5.message().find(n) != std::string::npos, s5.message());
  const std::int32_t fold[4] = {4, 3, 103, 2};
  const step5::Status s4 = step5::ops::bounds_fault_status(fold, ctx);
  CHECK(s4.code() == StatusCode::kInvalidArgument);
  for (const char* n : {"request 3", "position 103", "q_len = 2", "expected 1", "host mirror"})
    CHECK_MESSAGE(s4.message().find(n) != std::string::npos, s4.message());
  const std::int32_t slot[4] = {6, 1, 15, 9};
  const step5::Status s6 = step5::ops::bounds_fault_status(slot, {64, 2, 4, 4096, 2});
  CHECK(s6.code() == StatusCode::kInvalidArgument);
  for (const char* n : {"request 1", "position 15", "tail_slot = 9", "[0, num_slots = 2)", "not written"})
    CHECK_MESSAGE(s6.message().find(n) != std::string::npos, s6.message());
  // num_slots unknown (0): the bound is named without a number
  CHECK(step5::ops::bounds_fault_status(slot, ctx).message().find("[0, num_slots)") != std::string::npos);
}

TEST_CASE("CPU reference step functions refuse the example with the validate_step message") {
  Example e;
  const StepCheck c = e.check();
  const std::string expected = body(validate_step(c).message());
  REQUIRE(!expected.empty());
  const ref::BatchView batch{2, e.cu.data(), e.seq.data()};
  const ref::BlockTableView bt{e.table.data(), 2, 64, 4};
  const int KVl = 1, D = 64, P = 64;
  std::vector<bf16> k(2 * D), kc(4 * 64 * D), vc(kc.size());
  auto msg_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const step5::Error& err) {
      CHECK(err.code() == StatusCode::kInvalidArgument);
      return err.what();
    }
    return "(no exception)";
  };
  CHECK(body(msg_of([&] { ref::write_kv_cache(batch, bt, KVl, D, k.data(), D, k.data(), D, kc.data(), vc.data()); })) ==
        expected);
  std::vector<bf16> tail(2 * 8 * 2 * P), ik(2 * P);
  std::vector<std::uint8_t> sum(4 * 8 * P);
  const std::vector<std::int32_t> slots = {0, 1};
  CHECK(body(msg_of([&] {
          ref::update_summaries(batch, bt, P, ik.data(), P, ik.data(), P, tail.data(), 2, slots.data(), sum.data());
        })) == expected);
  std::vector<std::uint8_t> iq(2 * 1 * P);
  std::vector<float> w(2), scores(2 * 64);
  CHECK(body(msg_of([&] {
          ref::compute_scores(batch, bt, 1, 1, P, iq.data(), w.data(), sum.data(), scores.data(), 64);
        })) == expected);
}

TEST_CASE("CPU reference layer: prefill 128 + 10, then the decode at position 128 is refused; caches unchanged") {
  const step5::layout::GeometryEntry* entry = nullptr;
  for (const auto& g : step5::layout::kGeometries)
    if (std::string(g.name) == "step5_preview") entry = &g;
  REQUIRE(entry != nullptr);
  const auto& g = entry->geometry;
  const GlobalWeights gw = random_global_weights(g, 64, 1201);
  const auto rm = ref::make_rope_table(1024, g.rot_main, 10000.0);
  const auto ri = ref::make_rope_table(1024, g.rot_idx, 10000.0);
  const ref::LayerWeights w = rank_weights(gw, 1, 0, rm, ri);
  ref::LayerCache cache = ref::LayerCache::create(w.rank, 4, 64, 2);
  // a cache no step would take (block_size past ops::kMaxBlockSize) is refused when it is made
  CHECK_THROWS_WITH_AS(ref::LayerCache::create(w.rank, 1, step5::ops::kMaxBlockSize + 8, 2),
                       doctest::Contains("block_size = 1048584"), step5::Error);
  // so is a rank of no KV heads (a default RankLayout, not make_rank_layout's): create returned
  // caches that validate, i.e. the first step, then refused
  CHECK_THROWS_WITH_AS(ref::LayerCache::create(step5::layout::RankLayout{}, 4, 64, 2),
                       doctest::Contains("LayerCache::create: cache num_blocks = 4, block_size = 64, num_slots = 2, "
                                         "kv_heads = 0, head_dim = 0, proxy_dim = 0; expected positive counts"),
                       step5::Error);
  // so is one whose buffer sizes pass 2^63 - 1 bytes: 4 blocks of 8 positions x 2^30 KV heads x
  // head_dim 2^29 is 2^64 values, a size_t product that wrapped to 0, so create returned empty K/V
  // caches that validate() then passed (every row read past them)
  step5::layout::RankLayout huge;
  huge.local_kv_heads = 1 << 30;
  huge.geometry.head_dim = 1 << 29;
  huge.geometry.proxy_dim = 8;
  CHECK_THROWS_WITH_AS(ref::LayerCache::create(huge, 4, 8, 1),
                       doctest::Contains("LayerCache::create: cache num_blocks = 4, block_size = 8, kv_heads = 1073741824, "
                                         "head_dim = 536870912, num_slots = 1, proxy_dim = 8: a buffer"),
                       step5::Error);
  const auto x = random_bf16(138 * 64, 1.0f, 1202);
  const ref::StepBatch prefill = make_step({128, 10}, {128, 10}, 2);
  (void)ref::forward(w, cache, prefill, x.data(), 64);

  const ref::StepBatch decode = make_step({1, 1}, {129, 11}, 2);
  const ref::LayerCache before = cache;
  std::string what;
  try {
    (void)ref::forward(w, cache, decode, x.data(), 64);
  } catch (const step5::Error& err) {
    CHECK(err.code() == StatusCode::kInvalidArgument);
    what = err.what();
  }
  // the same message the GPU launchers return (tests/gpu/test_step_bounds.cu compares them)
  StepCheck c;
  c.op = "dsa_layer_forward";
  c.num_requests = 2;
  c.num_tokens = 2;
  c.cu_seqlens_q = decode.cu_seqlens_q.data();
  c.seq_lens = decode.seq_lens.data();
  c.block_table = decode.block_table.data();
  c.block_size = 64;
  c.max_blocks = 2;
  c.num_blocks = 4;
  c.topk = 64;
  c.max_position = 1024;
  const step5::Status s = validate_step(c);
  REQUIRE(!s.ok());
  CHECK(what.rfind("forward: ", 0) == 0);
  CHECK(body(what) == body(s.message()));
  for (const char* n : {"request 0", "position 128", "capacity 128"}) CHECK(what.find(n) != std::string::npos);
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  CHECK(same(cache.k_cache, before.k_cache));
  CHECK(same(cache.v_cache, before.v_cache));
  CHECK(same(cache.summary_cache, before.summary_cache));
  CHECK(same(cache.tail, before.tail));
}

TEST_CASE("require_non_null names the first null pointer and its op") {
  int a = 0;
  CHECK(step5::require_non_null("op", {{"a", &a}}).ok());
  const step5::Status s = step5::require_non_null("indexer_select", {{"index_q", &a}, {"weights", nullptr}, {"counts", nullptr}});
  CHECK(s.code() == step5::StatusCode::kInvalidArgument);
  CHECK(s.message() == "indexer_select: weights is null");
}
