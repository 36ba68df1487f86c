#pragma once
/// \file step5/comm/nccl.hpp
/// Opt-in NCCL wrappers (link `step5::nccl`): the only place of the library that includes
/// nccl.h. The communicator and stream are owned by the engine; every function returns a
/// `step5::Status` (never exits) naming the NCCL call and its error string. SPEC.md §4.8: the
/// row-parallel o_proj partials (bf16) are summed over the TP group with one all-reduce.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "step5/core/status.hpp"

namespace step5::comm {

/// Converts an NCCL result into a Status naming the call.
inline Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Status(StatusCode::kNcclError, std::string(what) + " failed: " + ncclGetErrorString(r));
}

/// Sum all-reduce, in place, of `count` bf16 elements at `data` (device pointer) over `comm`,
/// ordered on `stream` (SPEC §4.8: sum of the ranks' bf16 o_proj partials).
/// A non-blocking communicator (created with ncclConfig_t::blocking = 0, e.g. for a bounded
/// initialisation) may answer ncclInProgress: the call was accepted; it is returned as Ok and the
/// caller polls ncclCommGetAsyncError(comm) until it leaves ncclInProgress before its next NCCL
/// call on `comm` (NCCL's non-blocking contract).
/// Errors: null data with count > 0 or null comm → kInvalidArgument; NCCL failures → kNcclError.
inline Status all_reduce_sum_bf16(void* data, std::size_t count, ncclComm_t comm, cudaStream_t stream) {
  if (count == 0) return Status::Ok();
  if (data == nullptr) return invalid_argument("all_reduce_sum_bf16: data is null with count " + std::to_string(count));
  if (comm == nullptr) return invalid_argument("all_reduce_sum_bf16: communicator is null");
  const ncclResult_t r = ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, comm, stream);
  return nccl_status(r == ncclInProgress ? ncclSuccess : r, "ncclAllReduce(bf16, sum)");
}

/// The rank and size of `comm`, checked against the expected tp layout.
/// Errors: null comm, or the communicator's size differs from `tp_size` or its rank from
/// `tp_rank` → kInvalidArgument; a failed ncclCommCount / ncclCommUserRank → kNcclError.
inline Status check_comm(ncclComm_t comm, int tp_size, int tp_rank) {
  if (comm == nullptr) return invalid_argument("check_comm: communicator is null");
  int n = 0, r = 0;
  STEP5_RETURN_IF_ERROR(nccl_status(ncclCommCount(comm, &n), "ncclCommCount"));
  STEP5_RETURN_IF_ERROR(nccl_status(ncclCommUserRank(comm, &r), "ncclCommUserRank"));
  if (n != tp_size || r != tp_rank)
    return invalid_argument("NCCL communicator has size " + std::to_string(n) + " and rank " + std::to_string(r) +
                            "; the layout expects tp_size " + std::to_string(tp_size) + " and tp_rank " +
                            std::to_string(tp_rank));
  return Status::Ok();
}

}  // namespace step5::comm
