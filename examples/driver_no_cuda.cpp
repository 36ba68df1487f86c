// The driver's CUDA backend when the library is built without CUDA (STEP5_ENABLE_CUDA=OFF).
#include "driver_common.hpp"

namespace step5::driver {
std::unique_ptr<Backend> make_cuda_backend(const Model&, const Workload&, bool, std::string* why) {
  *why = "this build has no CUDA backend (configure with STEP5_ENABLE_CUDA=ON and nvcc 13)";
  return nullptr;
}
std::string cuda_rank_unavailable(const DistContext&) {
  return "this build has no CUDA backend (configure with STEP5_ENABLE_CUDA=ON and nvcc 13)";
}
std::unique_ptr<Backend> make_cuda_backend_multiprocess(const Model&, const Workload&, const DistContext&) {
  return nullptr;  // not reached: cuda_rank_unavailable refuses first
}
}  // namespace step5::driver
