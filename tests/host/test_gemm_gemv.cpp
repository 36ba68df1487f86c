// Host tests of the kGemv path's shape rules (step5/ops/gemm.hpp) that need no GPU: which (T, K)
// it runs, and the shared memory its two kernels stage X in (gemm_gemv.cuh). The launches run in
// tests/gpu/test_gemm.cu.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <utility>

#include "step5/ops/gemm.hpp"

namespace ops = step5::ops;

TEST_CASE("gemv: T <= 4 (CUDA cores) stages X's rows (T · K · 2 bytes), T = 1 up to K = 102400 in 200 KiB") {
  CHECK(ops::gemm_gemv_smem_bytes(1, 4096) == 8192);
  CHECK(ops::gemm_gemv_smem_bytes(1, 102400) == 204800);
  CHECK(ops::gemm_gemv_eligible(1, 102400));
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 102408));
  CHECK(ops::gemm_gemv_eligible(1, 0));
  constexpr int kCuda = ops::kGemmGemvCudaCores;  // forced: config 0 runs T >= 2 on the tensor cores
  CHECK(ops::gemm_gemv_smem_bytes(4, 25600, kCuda) == 204800);
  CHECK(ops::gemm_gemv_eligible(4, 25600, kCuda));
  CHECK(ops::gemm_gemv_eligible(2, 51200, kCuda));  // 204800 bytes
}

TEST_CASE("gemv: the CUDA-core kernel's weight ring (8 rows a stage, K tiles of 2048, 1024 or 512 values or K, 2..8 stages beside X)") {
  // T = 1, K = 4096 (the fused projection): 6 stages of 8 rows x 2048 values = 192 KiB in flight
  constexpr ops::GemmGemvRing a = ops::gemm_gemv_ring(1, 4096);
  CHECK(a.tile_k == 2048);
  CHECK(a.stages == 6);
  CHECK(a.smem == 128 + 8192 + 6 * 32768);
  CHECK(a.rows == 8);
  CHECK(a.row_bytes == 4096);  // packed
  // o_proj at tp 8 (K 1536): one tile per row, the stage cap
  constexpr ops::GemmGemvRing b = ops::gemm_gemv_ring(1, 1536);
  CHECK(b.tile_k == 1536);
  CHECK(b.stages == 8);
  CHECK(b.smem == 128 + 3072 + 8 * 24576);
  // X at the limit (204800 bytes): 27520 bytes left, three stages of 512-value tiles
  for (auto [t, k] : {std::pair<std::int64_t, std::int64_t>{1, 102400}, {4, 25600}, {2, 51200}}) {
    const ops::GemmGemvRing r = ops::gemm_gemv_ring(t, k, ops::kGemmGemvCudaCores);
    CHECK_MESSAGE(r.tile_k == 512, "T = ", t, ", K = ", k);
    CHECK_MESSAGE(r.stages == 3, "T = ", t, ", K = ", k);
    CHECK_MESSAGE(r.smem == 128 + 204800 + 3 * 8192, "T = ", t, ", K = ", k);
  }
  // K = 0: one empty 8-value tile (the kernel arms it with 0 bytes)
  CHECK(ops::gemm_gemv_ring(1, 0).tile_k == 8);
  // every (T, K) the CUDA-core kernel runs has a ring that fits, with tiles of whole 16-byte chunks
  // and, where a row has several tiles, tiles of a multiple of 256 values (32 lanes x 8: a lane's
  // chunks are those of the whole row, in order)
  for (std::int64_t t = 1; t <= ops::kGemmGemvCudaCoreMaxTokens; ++t)
    for (std::int64_t k = 0; k <= 110000; k += 8) {
      if (!ops::gemm_gemv_eligible(t, k, ops::kGemmGemvCudaCores)) continue;
      const ops::GemmGemvRing r = ops::gemm_gemv_ring(t, k, ops::kGemmGemvCudaCores);
      REQUIRE_MESSAGE(r.stages >= ops::kGemmGemvRingMinStages, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.stages <= ops::kGemmGemvRingMaxStages, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.smem <= ops::kGemmGemvCtaSmem, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.tile_k % 8 == 0, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE((r.tile_k >= k || r.tile_k % 256 == 0), "T = ", t, ", K = ", k);
    }
}

TEST_CASE("gemv: the tensor cores (by T from T = 2) stage X's T rows 16 bytes apart modulo 128 (conflict-free ldmatrix), 128 bytes of zeros, 4 KiB of partial tiles per n8 tile") {
  // a row: 2K rounded up to 128 bytes, + 16
  CHECK(ops::gemm_gemv_x_row_bytes(4096) == 8192 + 16);
  CHECK(ops::gemm_gemv_x_row_bytes(4104) == 8320 + 16);  // 8208 bytes -> 8320
  CHECK(ops::gemm_gemv_x_row_bytes(200) == 512 + 16);    // 400 bytes -> 512
  CHECK(ops::gemm_gemv_x_row_bytes(8) == 128 + 16);
  CHECK(ops::gemm_gemv_x_row_bytes(0) == 16);
  for (std::int64_t k = 0; k <= 20000; k += 8) {
    const std::int64_t row = ops::gemm_gemv_x_row_bytes(k);
    CHECK_MESSAGE(row % 128 == 16, "k = ", k);
    CHECK_MESSAGE(row >= 2 * ((k + 15) / 16 * 16), "k = ", k);  // every k16 step of X's row (zeros past K)
  }
  CHECK(ops::gemm_gemv_smem_bytes(2, 4096, ops::kGemmGemvCudaCores) == 2 * 4096 * 2);  // the CUDA cores
  CHECK(ops::gemm_gemv_smem_bytes(2, 4096) == 2 * 8208 + 128 + 4096);                     // by T: the tensor cores
  CHECK(ops::gemm_gemv_mma_part_bytes(1) == 4096);
  CHECK(ops::gemm_gemv_mma_part_bytes(8) == 4096);
  CHECK(ops::gemm_gemv_mma_part_bytes(9) == 8192);
  CHECK(ops::gemm_gemv_mma_part_bytes(16) == 8192);
  CHECK(ops::gemm_gemv_smem_bytes(2, 4096, ops::kGemmGemvTensorCores) == 2 * 8208 + 128 + 4096);
  CHECK(ops::gemm_gemv_smem_bytes(5, 4096) == 5 * 8208 + 128 + 4096);
  CHECK(ops::gemm_gemv_smem_bytes(8, 4096) == 8 * 8208 + 128 + 4096);
  CHECK(ops::gemm_gemv_smem_bytes(9, 4096) == 9 * 8208 + 128 + 8192);
  CHECK(ops::gemm_gemv_smem_bytes(16, 4096) == 16 * 8208 + 128 + 8192);
  CHECK(ops::gemm_gemv_eligible(8, 12288));        // 200960 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(9, 12288));  // 229648
}

TEST_CASE("gemv: the tensor-core kernel's weight ring (16 rows a stage, 16 bytes apart mod 128; tiles of 1024, 512 or 256 values or K; 4..8 stages where they fit, else 2..3 of 256)") {
  // T = 8, K = 4096 (the fused projection): 4 stages of 16 rows x 1024 values
  constexpr ops::GemmGemvRing a = ops::gemm_gemv_ring(8, 4096);
  CHECK(a.tile_k == 1024);
  CHECK(a.stages == 4);
  CHECK(a.rows == 16);
  CHECK(a.row_bytes == 2048 + 16);
  CHECK(a.smem == 128 + (8 * 8208 + 128 + 4096) + 4 * 16 * 2064);
  // T = 16: X and its areas take 139648 bytes, two 1024-value stages would fit, five of 512 are taken
  constexpr ops::GemmGemvRing b = ops::gemm_gemv_ring(16, 4096);
  CHECK(b.tile_k == 512);
  CHECK(b.stages == 5);
  CHECK(b.row_bytes == 1024 + 16);
  // o_proj at tp 1 (K 12288, T = 8): X and its areas take 200960 bytes, three stages of 256 values
  constexpr ops::GemmGemvRing c = ops::gemm_gemv_ring(8, 12288);
  CHECK(c.tile_k == 256);
  CHECK(c.stages == 3);
  // forced at T = 1 (config 2): the tensor-core layout
  CHECK(ops::gemm_gemv_ring(1, 4096, ops::kGemmGemvTensorCores).rows == 16);
  CHECK(ops::gemm_gemv_ring(1, 4096).rows == 8);
  // every (T, K) the tensor-core kernel runs has a ring that fits, tiles of whole 16-byte pieces
  // and rows 16 bytes apart modulo 128
  for (std::int64_t t = 1; t <= ops::kGemmGemvMaxTokens; ++t)
    for (std::int64_t k = 0; k <= 110000; k += 8) {
      if (!ops::gemm_gemv_eligible(t, k, ops::kGemmGemvTensorCores)) continue;
      const ops::GemmGemvRing r = ops::gemm_gemv_ring(t, k, ops::kGemmGemvTensorCores);
      REQUIRE_MESSAGE(r.stages >= ops::kGemmGemvRingMinStages, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.stages <= ops::kGemmGemvRingMaxStages, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.smem <= ops::kGemmGemvCtaSmem, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.tile_k % 8 == 0, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE((r.tile_k >= k || r.tile_k % 256 == 0), "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.row_bytes % 128 == 16, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.row_bytes >= 2 * ((r.tile_k + 15) / 16 * 16), "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(ops::gemm_gemv_ring_offset(t, k, ops::kGemmGemvTensorCores) % 128 == 0, "T = ", t, ", K = ", k);
    }
}

TEST_CASE("gemv: the decode shapes it runs (fused projection K 4096 to T = 16, o_proj at tp 1 K 12288 to T = 8)") {
  CHECK(ops::kGemmGemvMaxTokens == 16);
  for (int t = 1; t <= 16; ++t) CHECK_MESSAGE(ops::gemm_gemv_eligible(t, 4096), "T = ", t);
  CHECK_FALSE(ops::gemm_gemv_eligible(17, 4096));  // above kGemmGemvMaxTokens
  CHECK_FALSE(ops::gemm_gemv_eligible(0, 4096));
  for (int t = 1; t <= 8; ++t) CHECK_MESSAGE(ops::gemm_gemv_eligible(t, 12288), "T = ", t);  // 8 · 24592 + 128 + 4096 = 200960 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(9, 12288));  // 9 rows: 229648 bytes
  CHECK(ops::gemm_gemv_eligible(2, 50112, ops::kGemmGemvTensorCores));        // 2 · 100240 + 128 + 4096 = 204704 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(2, 50176, ops::kGemmGemvTensorCores));  // 2 · 100368 + 4224 = 204960 bytes (the padding)
  CHECK(ops::gemm_gemv_eligible(16, 6080));        // 16 · 12176 + 128 + 8192 = 203136 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(16, 6144));  // 16 · 12304 + 8320 = 205184 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(2, -8));
  CHECK_FALSE(ops::gemm_gemv_eligible(2, std::int64_t{1} << 40));  // no overflow in the byte count
}

TEST_CASE("gemv: config picks the kernel (0 by T: the CUDA cores at T = 1, the tensor cores above; 1 the CUDA cores at T <= 4 only, 2 the tensor cores)") {
  CHECK(ops::kGemmGemvCudaCoreMaxTokens == 4);
  CHECK(ops::kGemmGemvCudaCoreAutoMaxTokens == 1);
  CHECK(ops::gemm_gemv_pick(1) == ops::kGemmGemvCudaCores);
  CHECK(ops::gemm_gemv_pick(2) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_pick(4) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_pick(4, ops::kGemmGemvCudaCores) == ops::kGemmGemvCudaCores);
  CHECK(ops::gemm_gemv_pick(5) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_pick(16) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_pick(1, ops::kGemmGemvTensorCores) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_gemv_smem_bytes(1, 4096, ops::kGemmGemvTensorCores) == 8208 + 128 + 4096);  // one staged row, the zeros, the tiles
  CHECK(ops::gemm_gemv_eligible(1, 4096, ops::kGemmGemvCudaCores));
  CHECK(ops::gemm_gemv_eligible(4, 4096, ops::kGemmGemvCudaCores));
  CHECK_FALSE(ops::gemm_gemv_eligible(5, 4096, ops::kGemmGemvCudaCores));
  CHECK(ops::gemm_gemv_eligible(1, 12288, ops::kGemmGemvTensorCores));         // 28816 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 102400, ops::kGemmGemvTensorCores));  // 209040 bytes (the CUDA-core kernel's 204800 fit)
  CHECK(ops::gemm_gemv_eligible(1, 100224, ops::kGemmGemvTensorCores));        // 204688 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 100288, ops::kGemmGemvTensorCores));  // 204816 bytes
  CHECK(ops::gemm_gemv_eligible(1, 102400, 0));
  CHECK(ops::gemm_gemv_eligible(4, 25600, ops::kGemmGemvCudaCores));  // 204800 bytes
  CHECK_FALSE(ops::gemm_gemv_eligible(4, 25600));                     // config 0: the tensor cores, 209088 bytes
  CHECK(ops::gemm_gemv_eligible(1, 4096, ops::kGemmGemvTensorCoresWindowed));
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 4096, 4));
  CHECK_FALSE(ops::gemm_gemv_eligible(1, 4096, -1));
  CHECK(ops::gemm_gemv_pick(1, ops::kGemmGemvTensorCoresWindowed) == ops::kGemmGemvTensorCoresWindowed);
  CHECK(ops::gemm_gemv_pick(16, ops::kGemmGemvTensorCoresWindowed) == ops::kGemmGemvTensorCoresWindowed);
}

TEST_CASE("gemv: the windowed tensor-core kernel (config 3): X in windows of 1024 values, two buffers, the window sums of 16 row blocks; the ring keeps 4-5 stages of 1024 whatever T and K") {
  constexpr int kWin = ops::kGemmGemvTensorCoresWindowed;
  CHECK(ops::kGemmGemvXWindow == 1024);
  CHECK(ops::kGemmGemvWindowGroupBlocks == 16);
  // windows: K / 1024 rounded up where K is longer than a window, else X whole; configs 0 / 2 never window
  CHECK(ops::gemm_gemv_x_windows(4096, kWin) == 4);
  CHECK(ops::gemm_gemv_x_windows(4104, kWin) == 5);
  CHECK(ops::gemm_gemv_x_windows(12288, kWin) == 12);
  CHECK(ops::gemm_gemv_x_windows(1024, kWin) == 1);
  CHECK(ops::gemm_gemv_x_windows(1032, kWin) == 2);
  CHECK(ops::gemm_gemv_x_windows(8, kWin) == 1);
  CHECK(ops::gemm_gemv_x_windows(12288, ops::kGemmGemvTensorCores) == 1);
  CHECK(ops::gemm_gemv_x_windows(12288, 0) == 1);
  CHECK(ops::gemm_gemv_x_window_k(4096, kWin) == 1024);
  CHECK(ops::gemm_gemv_x_window_k(1000, kWin) == 1000);
  CHECK(ops::gemm_gemv_x_window_k(4096, ops::kGemmGemvTensorCores) == 4096);
  // T = 16, K = 4096: two buffers of 16 rows of 2064 bytes, the zeros, the partial tiles (8192) and
  // the window sums (16 blocks x 16 rows x 16 tokens x 4 bytes); the ring 4 stages of 1024 values
  CHECK(ops::gemm_gemv_mma_window_sum_bytes(16, 4) == 16384);
  CHECK(ops::gemm_gemv_mma_window_sum_bytes(8, 4) == 8192);
  CHECK(ops::gemm_gemv_mma_window_sum_bytes(16, 1) == 0);
  CHECK(ops::gemm_gemv_mma_part_offset(16, 1024, 4) == 2 * 16 * 2064 + 128);
  CHECK(ops::gemm_gemv_mma_part_offset(16, 4096) == 16 * 8208 + 128);  // X whole: one buffer
  CHECK(ops::gemm_gemv_smem_bytes(16, 4096, kWin) == 2 * 16 * 2064 + 128 + 8192 + 16384);
  constexpr ops::GemmGemvRing a = ops::gemm_gemv_ring(16, 4096, kWin);
  CHECK(a.tile_k == 1024);
  CHECK(a.stages == 4);
  CHECK(a.smem == 128 + 90752 + 4 * 16 * 2064);
  // o_proj at tp 1 (K 12288): T = 8 has 5 stages of 1024 where X whole left 3 of 256; T = 16 runs
  constexpr ops::GemmGemvRing b = ops::gemm_gemv_ring(8, 12288, kWin);
  CHECK(b.tile_k == 1024);
  CHECK(b.stages == 5);
  CHECK(ops::gemm_gemv_eligible(16, 12288, kWin));
  CHECK_FALSE(ops::gemm_gemv_eligible(16, 12288, ops::kGemmGemvTensorCores));
  CHECK(ops::gemm_gemv_eligible(16, ops::kGemmGemvMaxSmem, kWin));
  CHECK_FALSE(ops::gemm_gemv_eligible(16, ops::kGemmGemvMaxSmem + 8, kWin));
  // every (T, K): a ring that fits, a tile that divides the window (tiles never straddle two)
  for (std::int64_t t = 1; t <= ops::kGemmGemvMaxTokens; ++t)
    for (std::int64_t k = 8; k <= 70000; k += 8) {
      REQUIRE_MESSAGE(ops::gemm_gemv_eligible(t, k, kWin), "T = ", t, ", K = ", k);
      const ops::GemmGemvRing r = ops::gemm_gemv_ring(t, k, kWin);
      const std::int64_t xk = ops::gemm_gemv_x_window_k(k, kWin);
      REQUIRE_MESSAGE(r.stages >= ops::kGemmGemvMmaRingPreferredStages, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.smem <= ops::kGemmGemvCtaSmem, "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE((xk == k || xk % r.tile_k == 0), "T = ", t, ", K = ", k);
      REQUIRE_MESSAGE(r.row_bytes % 128 == 16, "T = ", t, ", K = ", k);
    }
}

TEST_CASE("gemv: kAuto takes it at T = 1 on weights of 4 MiB and more with K 512 ... 12288, at T = 2 ... 8 on weights of 22 MiB and more with K 4096, at T = 9 ... 16 on 128 MiB and more with K 4096 (the measured ranges); its kernel by T and rows") {
  CHECK(ops::kGemmGemvAutoMinBytes == 4 << 20);
  CHECK(ops::kGemmGemvAutoMinK == 512);
  CHECK(ops::gemm_auto_takes_gemv(1, 4096, 1024));        // 8 MiB: o_proj of dsa_h64_kv8_d128 at tp 8
  CHECK(ops::gemm_auto_takes_gemv(1, 4096, 512));         // 4 MiB: o_proj of dsa_h64_kv8_d128 at tp 16
  CHECK(ops::gemm_auto_takes_gemv(1, 4096, 768));         // 6 MiB: o_proj of step5_preview at tp 16
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 4095, 512));   // just below 4 MiB
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 8192, 504));   // K just below the shortest measured
  CHECK(ops::gemm_auto_takes_gemv(1, 4096, 12288));       // o_proj at tp 1 (K 12288)
  CHECK(ops::gemm_auto_takes_gemv(1, 18512, 4096));       // the tp 1 fused projection
  CHECK_FALSE(ops::gemm_auto_takes_gemv(0, 18512, 4096));
  // T = 2 ... 8: the fused projection at tp 1, 2 and 8 (K 4096, 22 MiB and more; tp 4 below), on the tensor cores
  CHECK(ops::kGemmGemvAutoMaxTokens == 8);
  CHECK(ops::kGemmGemvAutoMultiTokenMinBytes == 22 << 20);
  for (int t = 2; t <= 8; ++t) {
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 18512, 4096), "T = ", t);  // the tp 1 fused projection
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 3472, 4096), "T = ", t);   // step5_preview at tp 8 (27.1 MiB)
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 2832, 4096), "T = ", t);   // dsa_h64_kv8_d128 at tp 8 (22.1 MiB)
    CHECK_MESSAGE(ops::gemm_auto_gemv_config(t, 3472, 4096) == ops::kGemmGemvTensorCores, "T = ", t);
    CHECK_MESSAGE(ops::gemm_auto_gemv_config(t, 2832, 4096) == ops::kGemmGemvTensorCores, "T = ", t);
  }
  CHECK_FALSE(ops::gemm_auto_takes_gemv(4, 2815, 4096));    // just below 22 MiB (e.g. tp 16's fused projection)
  // the rows between X whole (<= 4096) and X in windows (>= 8192): tp 4 lost either way
  CHECK(ops::kGemmGemvAutoWholeMaxRows == 4096);
  CHECK(ops::kGemmGemvAutoWindowedMinRows == 8192);
  for (int t = 2; t <= 8; ++t) {
    CHECK_MESSAGE(!ops::gemm_auto_takes_gemv(t, 5016, 4096), "T = ", t);  // step5_preview at tp 4
    CHECK_MESSAGE(!ops::gemm_auto_takes_gemv(t, 5144, 4096), "T = ", t);  // dsa_h64_kv8_d128 at tp 4
    CHECK_MESSAGE(!ops::gemm_auto_takes_gemv(t, 8191, 4096), "T = ", t);
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 4096, 4096), "T = ", t);   // dsa_h64_kv8_d128's o_proj at tp 2 (32 MiB)
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 9512, 4096), "T = ", t);   // step5_preview at tp 2
  }
  // T = 9 ... 16: X in windows, K 4096 on 128 MiB and more (the tp 1 fused projection, 1.07x at
  // T = 16; tp 8 lost, 0.90-0.95x)
  CHECK(ops::kGemmGemvAutoWindowedMinBytes == std::int64_t{128} << 20);
  for (int t = 9; t <= 16; ++t) {
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 18512, 4096), "T = ", t);
    CHECK_MESSAGE(ops::gemm_auto_takes_gemv(t, 16384, 4096), "T = ", t);        // 128 MiB
    CHECK_MESSAGE(!ops::gemm_auto_takes_gemv(t, 16383, 4096), "T = ", t);       // just below
    CHECK_MESSAGE(!ops::gemm_auto_takes_gemv(t, 3472, 4096), "T = ", t);        // tp 8
    CHECK_MESSAGE(!ops::gemm_auto_takes_gemv(t, 18512, 4104), "T = ", t);       // only K 4096 measured
    CHECK_MESSAGE(ops::gemm_auto_gemv_config(t, 18512, 4096) == ops::kGemmGemvTensorCoresWindowed, "T = ", t);
    CHECK_MESSAGE(ops::gemm_auto_gemv_config(t, 3472, 4096) == ops::kGemmGemvTensorCoresWindowed, "T = ", t);
  }
  CHECK_FALSE(ops::gemm_auto_takes_gemv(17, 18512, 4096));  // above kGemmGemvMaxTokens
  // kAuto's kernel: the CUDA cores at T = 1; at T = 2 ... 8 X in windows from 8192 rows (tp 1, 2)
  // where the ring gains stages (K 4096: T = 4, 5 and 8: 6 / 6 / 5 stages against 5 / 5 / 4), else whole
  CHECK(ops::gemm_auto_gemv_config(1, 18512, 4096) == ops::kGemmGemvCudaCores);
  CHECK(ops::gemm_auto_gemv_config(4, 18512, 4096) == ops::kGemmGemvTensorCoresWindowed);
  CHECK(ops::gemm_auto_gemv_config(5, 18512, 4096) == ops::kGemmGemvTensorCoresWindowed);
  CHECK(ops::gemm_auto_gemv_config(8, 8192, 4096) == ops::kGemmGemvTensorCoresWindowed);
  CHECK(ops::gemm_auto_gemv_config(8, 8191, 4096) == ops::kGemmGemvTensorCores);
  for (int t : {2, 3, 6, 7})
    CHECK_MESSAGE(ops::gemm_auto_gemv_config(t, 18512, 4096) == ops::kGemmGemvTensorCores, "T = ", t);
  CHECK(ops::gemm_gemv_ring(4, 4096, ops::kGemmGemvTensorCores).stages == 5);
  CHECK(ops::gemm_gemv_ring(4, 4096, ops::kGemmGemvTensorCoresWindowed).stages == 6);
  CHECK(ops::gemm_gemv_ring(8, 4096, ops::kGemmGemvTensorCoresWindowed).stages == 5);
  CHECK(ops::gemm_auto_gemv_config(4, 3472, 4096) == ops::kGemmGemvTensorCores);
  CHECK(ops::gemm_auto_gemv_config(2, 2832, 4096) == ops::kGemmGemvTensorCores);
  CHECK_FALSE(ops::gemm_auto_takes_gemv(4, 4096, 12288));   // o_proj at tp 1 (0.79x at T = 4)
  CHECK_FALSE(ops::gemm_auto_takes_gemv(4, 4096, 8192));    // o_proj of dsa_h64_kv8_d128 at tp 1 (0.997x)
  CHECK_FALSE(ops::gemm_auto_takes_gemv(8, 4096, 1536));    // o_proj at tp 8 (0.94x at T = 8)
  CHECK_FALSE(ops::gemm_auto_takes_gemv(4, 18512, 4104));   // only K 4096 measured
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 65536, 64));    // short rows: most lanes idle, not measured
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 1000, 12296));  // past the longest K measured
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 100, 102400));  // X's limit: a small ring beside it
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 0, 4096));
  CHECK_FALSE(ops::gemm_auto_takes_gemv(1, 4096, 0));
}
