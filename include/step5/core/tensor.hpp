#pragma once
/// \file step5/core/tensor.hpp
/// Element types and a non-owning host tensor view, shared by the checkpoint readers, the
/// fused-weight loader and the CPU reference. Host-safe (g++).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace step5 {

/// Element types of checkpoint tensors (safetensors dtype strings in `dtype_name`).
enum class DType : int { kBF16, kF16, kF32, kF64, kF8E4M3, kF8E5M2, kI8, kU8, kI16, kI32, kI64, kBool };

/// Bytes per element.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: case DType::kI16: return 2;
    default: return 1;
  }
}

/// The safetensors name of a dtype ("BF16", "F32", "F8_E4M3", ...).
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

/// Parses a safetensors dtype string; returns false when unknown.
inline bool parse_dtype(std::string_view s, DType* out) {
  for (int i = 0; i <= static_cast<int>(DType::kBool); ++i) {
    if (dtype_name(static_cast<DType>(i)) == s) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

/// "[18496, 4096]".
inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// A non-owning view of a contiguous row-major host tensor (e.g. memory-mapped from a
/// safetensors file). `data` holds `numel() * dtype_size(dtype)` bytes.
struct TensorView {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
};

}  // namespace step5
