#pragma once
/// \file step5/ops/pdl.hpp
/// The switch of programmatic dependent launch (PDL, CUDA 12.3+ on compute capability 9.0) for
/// every step5 kernel launch: when on (the default), each launcher launches its kernels with
/// `cudaLaunchAttributeProgrammaticStreamSerialization`, so a kernel may be scheduled while its
/// predecessor on the stream finishes; the kernels wait (`griddepcontrol.wait`) before they touch
/// anything a predecessor wrote (step5/kernels/sm90/pdl.cuh, docs/ARCHITECTURE.md "Programmatic
/// dependent launch"). Results are bit-identical either way; the switch exists for comparisons
/// (tests, benchmarks) and debugging. Process-wide; read at each launch (a CUDA graph keeps the
/// edges it was captured with). The environment variable STEP5_PDL=0 turns it off at start-up.
/// Host-only (g++-compilable).
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace step5::ops {

namespace detail {
/// -1: not yet read from the environment; 0: off; 1: on.
inline std::atomic<int>& pdl_state() {
  static std::atomic<int> state{-1};
  return state;
}
}  // namespace detail

/// Whether step5 launchers use programmatic dependent launch (default on; STEP5_PDL=0 turns the
/// default off).
inline bool pdl_enabled() {
  int s = detail::pdl_state().load(std::memory_order_acquire);
  if (s < 0) {
    const char* env = std::getenv("STEP5_PDL");
    int expected = -1;
    detail::pdl_state().compare_exchange_strong(expected, env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1,
                                                std::memory_order_acq_rel);
    s = detail::pdl_state().load(std::memory_order_acquire);
  }
  return s == 1;
}

/// Turns programmatic dependent launch on or off for every later step5 launch of this process.
inline void set_pdl_enabled(bool on) { detail::pdl_state().store(on ? 1 : 0, std::memory_order_release); }

}  // namespace step5::ops
