// libFuzzer target: the safetensors header parser and the dtype conversions on arbitrary bytes
// (SPEC §7). Any input must either parse or throw step5::Error; nothing else (no crash, no other
// exception, no out-of-bounds read, no leak, no UB) is acceptable.
#include <cstddef>
#include <cstdint>
#include <string>

#include "step5/weights/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const step5::SafetensorsHeader h = step5::parse_safetensors_header(data, size, "fuzz-input");
    for (const auto& e : h.entries) {
      // the validated range lies inside the input
      if (e.begin > e.end || e.end > size) __builtin_trap();
      step5::TensorView v;
      v.name = e.name;
      v.dtype = e.dtype;
      v.shape = e.shape;
      v.data = data + e.begin;
      if (v.nbytes() != e.end - e.begin) __builtin_trap();
      const auto f = step5::to_float_vector(v);
      const auto b = step5::to_bf16_bits_vector(v);
      if (f.size() != b.size()) __builtin_trap();
      try {
        step5::expect_tensor(v, step5::DType::kBF16, {1});
      } catch (const step5::Error&) {
      }
    }
  } catch (const step5::Error& e) {
    if (std::string(e.what()).empty()) __builtin_trap();  // every error has a message
  }
  return 0;
}
