// Host tests of the GEMM's cuBLASLt path (step5/kernels/sm90/gemm_cublaslt.cuh) that need no GPU:
// the workspace cuBLASLt may use starts after the split-K counters (kGemmCounterBytes, which must
// stay zero for this library's kernels), only when that start is 256-byte aligned, and is capped at
// kGemmCublasLtWorkspaceBytes; pointer alignments as the heuristic's preferences see them. The
// launches themselves run in tests/gpu/test_gemm.cu.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#if __has_include(<cublasLt.h>) && !defined(STEP5_NO_CUBLASLT)

#include <cstddef>
#include <cstdint>

#include "step5/kernels/sm90/gemm_cublaslt.cuh"

namespace ops = step5::ops;
using ops::gemm_detail::lt_alignment;
using ops::gemm_detail::lt_workspace_limit;

namespace {
void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
}  // namespace

TEST_CASE("cuBLASLt: pointer alignment, the largest power of two up to 256 dividing the address") {
  CHECK(lt_alignment(nullptr) == 256);
  CHECK(lt_alignment(at(0x10000)) == 256);
  CHECK(lt_alignment(at(0x10100)) == 256);
  CHECK(lt_alignment(at(0x10080)) == 128);
  CHECK(lt_alignment(at(0x10010)) == 16);
  CHECK(lt_alignment(at(0x10002)) == 2);
  CHECK(lt_alignment(at(0x10001)) == 1);
}

TEST_CASE("cuBLASLt: its workspace is what follows the split-K counters, 256-byte aligned, capped") {
  ops::GemmParams p;
  CHECK(lt_workspace_limit(p) == 0);  // no workspace
  p.workspace = at(0x200000);
  p.workspace_bytes = ops::kGemmCounterBytes;  // the counters only
  CHECK(lt_workspace_limit(p) == 0);
  p.workspace_bytes = ops::kGemmCounterBytes + 4096;
  CHECK(lt_workspace_limit(p) == 4096);
  p.workspace_bytes = ops::kGemmCounterBytes + (std::size_t(64) << 20);
  CHECK(lt_workspace_limit(p) == ops::kGemmCublasLtWorkspaceBytes);  // capped
  CHECK(ops::kGemmCublasLtWorkspaceBytes + ops::kGemmCounterBytes <= p.workspace_bytes);
  p.workspace = at(0x200010);  // the region after the counters is not 256-byte aligned: none
  CHECK(lt_workspace_limit(p) == 0);
}

#else
TEST_CASE("cuBLASLt path not built (no cublasLt.h or STEP5_NO_CUBLASLT): nothing to test") {}
#endif
