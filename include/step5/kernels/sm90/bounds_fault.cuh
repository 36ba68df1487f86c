#pragma once
/// \file step5/kernels/sm90/bounds_fault.cuh
/// Device side of the checked mode (rules and record layout: step5/ops/batch_check.hpp). Every
/// kernel that indexes a cache through the block table skips an access whose block-table slot
/// lies outside the request's row or whose block id lies outside [0, num_blocks) — always, with a
/// compare in the address computation — and, when the record pointer is non-null (checked mode),
/// records the first such fault here.
#include <cstdint>

#include "step5/ops/batch_check.hpp"

namespace step5::kernels::sm90 {

/// Records `{kind, request, position, value}` in `rec` unless a fault is already recorded
/// (first fault wins; no-op when rec is null).
__device__ __forceinline__ void report_bounds_fault(std::int32_t* rec, ops::BoundsFault kind, int request,
                                                    int position, int value) {
  if (rec == nullptr) return;
  if (atomicCAS(reinterpret_cast<int*>(rec), 0, static_cast<int>(kind)) == 0) {
    rec[1] = request;
    rec[2] = position;
    rec[3] = value;
  }
}

/// First half of `checked_block`: the raw block-table entry of position `pos` of request `b`
/// (`in_row` false, no load, when the position lies outside the row [0, max_blocks * block_size)).
/// Split from the check so that a kernel can issue the load early and use the value later.
struct BlockEntry {
  std::int32_t entry;
  bool in_row;
};
__device__ __forceinline__ BlockEntry load_block_entry(const std::int32_t* block_table, int max_blocks,
                                                       int block_size, int b, int pos) {
  const int slot = pos / block_size;
  if (pos < 0 || slot >= max_blocks) return {-1, false};
  return {__ldg(block_table + static_cast<std::int64_t>(b) * max_blocks + slot), true};
}
/// Second half of `checked_block`: the block id of `e` (load_block_entry for position `pos`), or -1
/// after reporting the fault: kPositionBeyondRow outside the row, kBlockIdOutOfRange for an entry
/// outside [0, num_blocks).
__device__ __forceinline__ std::int64_t check_block_entry(BlockEntry e, int num_blocks, int b, int pos,
                                                          std::int32_t* rec) {
  if (!e.in_row) {
    report_bounds_fault(rec, ops::BoundsFault::kPositionBeyondRow, b, pos, -1);
    return -1;
  }
  if (e.entry < 0 || e.entry >= num_blocks) {
    report_bounds_fault(rec, ops::BoundsFault::kBlockIdOutOfRange, b, pos, e.entry);
    return -1;
  }
  return e.entry;
}
/// The block id holding position `pos` of request `b`, or -1 (after reporting the fault) when
/// the position lies outside the row [0, max_blocks * block_size) or the entry outside
/// [0, num_blocks).
__device__ __forceinline__ std::int64_t checked_block(const std::int32_t* block_table, int max_blocks,
                                                      int block_size, int num_blocks, int b, int pos,
                                                      std::int32_t* rec) {
  return check_block_entry(load_block_entry(block_table, max_blocks, block_size, b, pos), num_blocks, b, pos, rec);
}

}  // namespace step5::kernels::sm90
