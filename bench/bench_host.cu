// Host-side cost of the per-step checks (no GPU needed: plain host code, built like the other
// benches). `validate_step` (step5/ops/batch_check.hpp) runs on the host mirrors of a step's
// cu_seqlens_q / seq_lens once per op and once in dsa_layer_run, i.e. several times per layer and
// step; an engine that launches eagerly pays it on its critical path (bench_layer's host_us).
// Cases: decode steps of B = 1, 64 and 1024 requests at 128K context, every rule passing (the
// common case), and one failing request at the end (the message is built).
//   build/bench/bench_host [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "step5/ops/batch_check.hpp"

namespace {

struct DecodeStep {
  std::vector<std::int32_t> cu, seq_lens;
  std::int32_t block_table[1] = {0};
  step5::ops::StepCheck check;
  explicit DecodeStep(int B) : cu(static_cast<std::size_t>(B) + 1), seq_lens(static_cast<std::size_t>(B), 131072) {
    for (int b = 0; b <= B; ++b) cu[static_cast<std::size_t>(b)] = b;
    check.op = "indexer_select";
    check.num_requests = B;
    check.num_tokens = B;
    check.cu_seqlens_q = cu.data();
    check.seq_lens = seq_lens.data();
    check.block_table = block_table;
    check.block_size = 64;
    check.max_blocks = 2048;
    check.num_blocks = 1 << 20;
    check.topk = 512;
    check.max_seq_len = 131072;
    check.workspace_required = 1;
    check.workspace_bytes = 1;
  }
};

void BM_validate_step(benchmark::State& state) {
  DecodeStep s(static_cast<int>(state.range(0)));
  if (state.range(1) != 0) s.seq_lens.back() = 131073;  // past max_seq_len: refused, the message is built
  for (auto _ : state) {
    const step5::Status st = step5::ops::validate_step(s.check);
    benchmark::DoNotOptimize(st.ok());
  }
  state.counters["requests"] = static_cast<double>(state.range(0));
}

}  // namespace

BENCHMARK(BM_validate_step)->ArgNames({"batch", "fails"})->ArgsProduct({{1, 64, 1024}, {0, 1}});
BENCHMARK_MAIN();
