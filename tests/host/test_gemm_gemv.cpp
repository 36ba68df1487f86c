// Host tests of the kGemv path's shape rules (step5/ops/gemm.hpp) that need no GPU: which (T, K)
// it runs, and the shared memory its two kernels stage X in (gemm_gemv.cuh). The launches run in
// tests/gpu/test_gemm.cu.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>

#include "step5/ops/gemm.hpp"

namespace ops = step5::ops;

TEST_CASE("gemv: T <= 4 (CUDA cores) stages X's rows (T · K · 2 bytes), T = 1 up to K = 102400 in 200 KiB") {
  CHECK(ops::gemm_gemv_smem_bytes(1, 4096) == 8192);
  CHECK(ops::gemm_gemv_smem_bytes(1, 102400) == 204800);
  CHECK(ops::gemm_gemv_eligible(1, 102400));
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 102408));
  CHECK(ops::gemm_gemv_eligible(1, 0));
  CHECK(ops::gemm_gemv_smem_bytes(4, 25600) == 204800);
  CHECK(ops::gemm_gemv_eligible(4, 25600));
  CHECK(ops::gemm_gemv_eligible(2, 51200));  // 204800 bytes
}

TEST_CASE("gemv: T >= 5 (tensor cores) stages X's T rows 64 bytes apart modulo 128 (conflict-free fragment loads)") {
  // a row: K rounded up to a 64-byte chunk, then to 128 bytes, + 64
  CHECK(ops::gemm_gemv_x_row_bytes(4096) == 8192 + 64);
  CHECK(ops::gemm_gemv_x_row_bytes(4104) == 8320 + 64);  // 129 chunks = 8256 bytes -> 8320
  CHECK(ops::gemm_gemv_x_row_bytes(200) == 512 + 64);    // 7 chunks = 448 bytes -> 512
  CHECK(ops::gemm_gemv_x_row_bytes(8) == 128 + 64);
  CHECK(ops::gemm_gemv_x_row_bytes(0) == 64);
  for (std::int64_t k = 0; k <= 20000; k += 8) {
    const std::int64_t row = ops::gemm_gemv_x_row_bytes(k);
    CHECK_MESSAGE(row % 128 == 64, "k = ", k);
    CHECK_MESSAGE(row >= 2 * k, "k = ", k);        // X's row fits
    CHECK_MESSAGE(row >= (k + 31) / 32 * 64, "k = ", k);  // and every chunk a warp reads
  }
  CHECK(ops::gemm_gemv_smem_bytes(2, 4096) == 2 * 4096 * 2);  // the CUDA cores
  CHECK(ops::gemm_gemv_smem_bytes(2, 4096, ops::kGemmGemvTensorCores) == 2 * 8256);
  CHECK(ops::gemm_gemv_smem_bytes(5, 4096) == 5 * 8256);
  CHECK(ops::gemm_gemv_smem_bytes(8, 4096) == 8 * 8256);
  CHECK(ops::gemm_gemv_smem_bytes(9, 4096) == 9 * 8256);
  CHECK(ops::gemm_gemv_smem_bytes(16, 4096) == 16 * 8256);
}

TEST_CASE("gemv: the decode shapes it runs (fused projection K 4096 to T = 16, o_proj at tp 1 K 12288 to T = 8)") {
  CHECK(ops::kGemmGemvMaxTokens == 16);
  for (int t = 1; t <= 16; ++t) CHECK_MESSAGE(ops::gemm_gemv_eligible(t, 4096), "T = ", t);
  CHECK_FALSE(ops::gemm_gemv_eligible(17, 4096));  // above kGemmGemvMaxTokens
  CHECK_FALSE(ops::gemm_gemv_eligible(0, 4096));
  for (int t = 1; t <= 8; ++t) CHECK_MESSAGE(ops::gemm_gemv_eligible(t, 12288), "T = ", t);  // 8 · 24640 = 197120 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(9, 12288));  // 9 rows: 221760 bytes
  CHECK(ops::gemm_gemv_eligible(2, 51136, ops::kGemmGemvTensorCores));        // 2 · 102336 = 204672 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(2, 51200, ops::kGemmGemvTensorCores));  // 2 · 102464 = 204928 bytes (the padding)
  CHECK(ops::gemm_gemv_eligible(16, 6336));        // 16 · 12736 = 203776 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(16, 6400));  // 16 · 12864 = 205824 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(2, -8));
  CHECK_FALSE(ops::gemm_gemv_eligible(2, std::int64_t{1} << 40));  // no overflow in the byte count
}

TEST_CASE("gemv: config picks the kernel (0 by T, 1 the CUDA cores at T <= 4 only, 2 the tensor cores)") {
  CHECK(ops::kGemmGemvCudaCoreMaxTokens == 4);
  CHECK(ops::gemm_gemv_pick(1) == ops::kGemmGemvCudaCores);
  CHECK(ops::gemm_gemv_pick(4) == ops::kGemmGemvCudaCores);
  CHECK(ops::gemm_gemv_pick(5) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_pick(16) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_pick(1, ops::kGemmGemvTensorCores) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_smem_bytes(1, 4096, ops::kGemmGemvTensorCores) == 8256);  // one staged row
  CHECK(ops::gemm_gemv_eligible(1, 4096, ops::kGemmGemvCudaCores));
  CHECK(ops::gemm_gemv_eligible(4, 4096, ops::kGemmGemvCudaCores));
  CHECK_FALSE(ops::gemm_gemv_eligible(5, 4096, ops::kGemmGemvCudaCores));
  CHECK(ops::gemm_gemv_eligible(1, 12288, ops::kGemmGemvTensorCores));         // 24640 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 102400, ops::kGemmGemvTensorCores));  // 204864 bytes (the CUDA-core kernel's 204800 fit)
  CHECK(ops::gemm_gemv_eligible(1, 102336, ops::kGemmGemvTensorCores));        // 204736 bytes
  CHECK(ops::gemm_gemv_eligible(1, 102400, 0));
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 4096, 3));
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 4096, -1));
}
