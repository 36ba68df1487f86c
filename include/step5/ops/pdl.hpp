#pragma once
/// \file step5/ops/pdl.hpp
/// The switch of programmatic dependent launch (PDL, CUDA 12.3+ on compute capability 9.0) for
/// every step5 kernel launch: when on (the default), each launcher launches its kernels with
/// `cudaLaunchAttributeProgrammaticStreamSerialization`, so a kernel may be scheduled while its
/// predecessor on the stream finishes; the kernels wait (`griddepcontrol.wait`) before they touch
/// anything a predecessor wrote (step5/kernels/sm90/pdl.cuh, docs/ARCHITECTURE.md "Programmatic
/// dependent launch"). Results are bit-identical either way; the switch exists for comparisons
/// (tests, benchmarks) and debugging. Process-wide; read at each launch (a CUDA graph keeps the
/// edges it was captured with). The environment variable STEP5_PDL=0 turns it off (read once, on
/// first use); a value other than 0, 1 or empty is refused (`pdl_env_status`, kInvalidArgument
/// naming it, nothing launched) by every step5 kernel launch, by `gemm_bf16` first, whatever the
/// path (cuBLASLt included), and by `dsa_layer_run` before its first launch.
/// Host-only (g++-compilable).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "step5/core/status.hpp"

namespace step5::ops {

namespace detail {
/// -1: not yet read from the environment; 0: off; 1: on; 2: STEP5_PDL holds neither 0 nor 1
/// (launches are refused until set_pdl_enabled decides).
inline std::atomic<int>& pdl_state() {
  static std::atomic<int> state{-1};
  return state;
}
/// STEP5_PDL: unset, "" or "1" -> 1 (on), "0" -> 0 (off), anything else -> 2 (refused).
inline int pdl_env_state(const char* env) {
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "1") == 0) return 1;
  return std::strcmp(env, "0") == 0 ? 0 : 2;
}
inline int pdl_state_now() {
  int s = pdl_state().load(std::memory_order_acquire);
  if (s < 0) {
    int expected = -1;
    pdl_state().compare_exchange_strong(expected, pdl_env_state(std::getenv("STEP5_PDL")), std::memory_order_acq_rel);
    s = pdl_state().load(std::memory_order_acquire);
  }
  return s;
}
}  // namespace detail

/// Whether step5 launchers use programmatic dependent launch (default on; STEP5_PDL=0 turns the
/// default off).
inline bool pdl_enabled() { return detail::pdl_state_now() != 0; }

/// Ok, or kInvalidArgument naming STEP5_PDL's value when it is neither 0 nor 1 (and
/// set_pdl_enabled has not decided since): every step5 launch returns this error then.
inline Status pdl_env_status() {
  if (detail::pdl_state_now() != 2) return Status::Ok();
  const char* env = std::getenv("STEP5_PDL");
  return invalid_argument(std::string("STEP5_PDL = '") + (env != nullptr ? env : "") +
                          "', expected 0 (programmatic dependent launch off) or 1 / unset (on)");
}

inline void set_pdl_enabled(bool on) { detail::pdl_state().store(on ? 1 : 0, std::memory_order_release); }

}  // namespace step5::ops
