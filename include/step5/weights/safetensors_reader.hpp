#pragma once
/// \file step5/weights/safetensors_reader.hpp
/// Memory-mapped safetensors reader (SPEC.md §7, HF checkpoint layout): header parsing and
/// validation, `SafetensorsFile` (over core/mapped_file.hpp's `MappedFile`), and conversions of the views it hands out.
/// Sharded checkpoints: safetensors_index.hpp; writing: safetensors_writer.hpp; all three:
/// safetensors.hpp.
///
/// Format: `[u64 little-endian header length N][N bytes of JSON header][data]`. The header is a
/// JSON object mapping tensor names to `{"dtype": "BF16", "shape": [..], "data_offsets":
/// [begin, end]}` (offsets relative to the start of the data section) plus an optional
/// `"__metadata__"` object of string values.
///
/// Reading is zero-copy: `SafetensorsFile` maps the file (POSIX mmap, read-only) and hands out
/// `step5::TensorView`s that point into the mapping; a view stays valid while the
/// `SafetensorsFile` (or the `Checkpoint` owning it) lives. Every header is validated before any
/// view is created; every problem throws `step5::Error` naming the file, the tensor and the
/// field, with what was expected and what was found:
///   - missing/unreadable file, not a regular file (a FIFO, a device), file shorter than 8
///     bytes, header length beyond the end of file (truncated file) or above 100 MB
///                                                                        (kNotFound / kIoError)
///   - malformed JSON, a key repeated within one object (a tensor listed twice), header not an
///     object, `__metadata__` not an object of strings,
///     an entry without `dtype`/`shape`/`data_offsets` or with the wrong JSON type,
///     an unknown dtype, negative/non-integer dims, offsets with begin > end, offsets beyond
///     the data section, `end - begin != numel * dtype_size`                    (kIoError)
///   - a tensor name that is not in the file/checkpoint (names the files searched)  (kNotFound)
/// Overlapping or out-of-order tensors are accepted (the format allows them); out-of-range
/// offsets never are. The parser never crashes on arbitrary bytes (fuzzed by
/// tests/fuzz/fuzz_safetensors.cpp).
///
/// Host only (g++); needs nlohmann-json.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "step5/core/mapped_file.hpp"
#include "step5/core/numeric.hpp"
#include "step5/core/status.hpp"
#include "step5/core/tensor.hpp"
#include "step5/weights/json_keys.hpp"

namespace step5 {

/// Largest JSON header accepted (the reference implementation's limit).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// One tensor entry of a safetensors header. Offsets are absolute byte offsets in the file.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  ///< first byte (absolute file offset)
  std::uint64_t end = 0;    ///< one past the last byte (absolute file offset)
};

/// A validated safetensors header.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;          ///< in header (JSON object) order
  std::map<std::string, std::string> metadata;    ///< `__metadata__` (may be empty)
  std::uint64_t data_start = 0;                   ///< absolute offset of the data section
};

namespace detail {

inline std::string json_type_name(const nlohmann::json& j) {
  if (j.is_number_float()) return "a floating-point number";
  if (j.is_number_unsigned() || j.is_number_integer()) return "an integer";
  return std::string("a JSON ") + j.type_name();
}

/// Reads a non-negative integer that fits in int64 from a JSON value, or returns false.
inline bool json_nonneg_int(const nlohmann::json& j, std::uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<std::uint64_t>();
    return *out <= static_cast<std::uint64_t>(INT64_MAX);
  }
  if (j.is_number_integer()) {
    const std::int64_t v = j.get<std::int64_t>();
    if (v < 0) return false;
    *out = static_cast<std::uint64_t>(v);
    return true;
  }
  return false;
}

/// Quotes a (possibly binary) name for an error message: printable ASCII kept, others as \xNN,
/// truncated to 200 characters.
inline std::string quote_name(std::string_view s) {
  std::string r = "'";
  std::size_t n = 0;
  for (unsigned char c : s) {
    if (++n > 200) {
      r += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      r += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    }
  }
  return r + "'";
}

[[noreturn]] inline void throw_io(const std::string& msg) { throw Error(StatusCode::kIoError, msg); }

/// The bytes of a tensor of dims `dims` (each non-negative) and `dtype` in *nbytes, where every
/// running product of the dims (TensorView::numel multiplies in that order) and the byte count
/// fit int64; false where a dim is negative or a size overflows (the one rule of the reader and
/// the writer).
template <class Dims>
inline bool tensor_bytes_fit(const Dims& dims, DType dtype, std::uint64_t* nbytes) {
  std::uint64_t numel = 1;
  for (const auto d : dims) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel) ||
        numel > static_cast<std::uint64_t>(INT64_MAX))
      return false;
  }
  return !__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dtype_size(dtype)), nbytes) &&
         *nbytes <= static_cast<std::uint64_t>(INT64_MAX);
}

}  // namespace detail

/// Parses and validates the header of a safetensors image held in memory (`data`, `size`
/// bytes: the whole file). `label` names the file in error messages. Throws `step5::Error`
/// (kIoError) for every malformed input listed in the file comment; never reads outside
/// `[data, data + size)`.
inline SafetensorsHeader parse_safetensors_header(const std::uint8_t* data, std::uint64_t size,
                                                  const std::string& label) {
  using detail::throw_io;
  const std::string where = "safetensors file '" + label + "'";
  if (size < 8)
    throw_io(where + ": file is " + std::to_string(size) +
             " bytes, shorter than the 8-byte header length prefix (truncated file?)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kSafetensorsMaxHeaderBytes)
    throw_io(where + ": header length " + std::to_string(n) + " exceeds the limit of " +
             std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    throw_io(where + ": header length " + std::to_string(n) + " exceeds the file size (" +
             std::to_string(size) + " bytes, " + std::to_string(size - 8) +
             " after the length prefix): truncated file or corrupt length");
  SafetensorsHeader h;
  h.data_start = 8 + n;
  const std::uint64_t data_bytes = size - h.data_start;
  nlohmann::json j;
  std::optional<std::string> repeated;
  try {
    j = detail::parse_json_checking_keys(reinterpret_cast<const char*>(data) + 8,
                                 reinterpret_cast<const char*>(data) + 8 + n, &repeated);
  } catch (const nlohmann::json::exception& e) {
    throw_io(where + ": malformed JSON header (" + std::to_string(n) + " bytes): " + e.what());
  }
  if (repeated)
    throw_io(where + ": key " + detail::quote_name(*repeated) +
             " appears twice in one object of the header (a tensor listed twice?)");
  if (!j.is_object())
    throw_io(where + ": header must be a JSON object of tensor entries, got " + detail::json_type_name(j));
  h.entries.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object())
        throw_io(where + ": '__metadata__' must be an object of strings, got " + detail::json_type_name(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw_io(where + ": '__metadata__' entry " + detail::quote_name(m.key()) +
                   " must be a string, got " + detail::json_type_name(m.value()));
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tw = where + ": tensor " + detail::quote_name(key);
    if (!v.is_object()) throw_io(tw + ": entry must be an object, got " + detail::json_type_name(v));
    SafetensorsEntry e;
    e.name = key;
    // dtype
    auto d = v.find("dtype");
    if (d == v.end()) throw_io(tw + ": missing field 'dtype'");
    if (!d->is_string()) throw_io(tw + ": field 'dtype' must be a string, got " + detail::json_type_name(*d));
    const std::string& ds = d->get_ref<const std::string&>();
    if (!parse_dtype(ds, &e.dtype))
      throw_io(tw + ": unknown dtype " + detail::quote_name(ds) +
               " (expected one of BF16 F16 F32 F64 F8_E4M3 F8_E5M2 I8 U8 I16 I32 I64 BOOL)");
    // shape
    auto s = v.find("shape");
    if (s == v.end()) throw_io(tw + ": missing field 'shape'");
    if (!s->is_array()) throw_io(tw + ": field 'shape' must be an array, got " + detail::json_type_name(*s));
    for (std::size_t i = 0; i < s->size(); ++i) {
      std::uint64_t dim = 0;  // at most INT64_MAX
      if (!detail::json_nonneg_int((*s)[i], &dim))
        throw_io(tw + ": shape[" + std::to_string(i) + "] must be a non-negative integer, got " +
                 detail::json_type_name((*s)[i]));
      e.shape.push_back(static_cast<std::int64_t>(dim));
    }
    std::uint64_t nbytes = 0;
    if (!detail::tensor_bytes_fit(e.shape, e.dtype, &nbytes))
      throw_io(tw + ": shape " + shape_string(e.shape) + " of dtype " + ds + " overflows 64-bit sizes");
    // data_offsets
    auto o = v.find("data_offsets");
    if (o == v.end()) throw_io(tw + ": missing field 'data_offsets'");
    if (!o->is_array() || o->size() != 2)
      throw_io(tw + ": field 'data_offsets' must be an array [begin, end], got " +
               (o->is_array() ? "an array of " + std::to_string(o->size()) + " elements"
                              : detail::json_type_name(*o)));
    std::uint64_t b = 0, en = 0;
    // a number is printed, anything else by its JSON type: dump() recurses (a value nested
    // 100000 deep overflowed the stack) and would copy a value of any size into the message
    auto offset_text = [](const nlohmann::json& x) { return x.is_number() ? x.dump() : detail::json_type_name(x); };
    if (!detail::json_nonneg_int((*o)[0], &b) || !detail::json_nonneg_int((*o)[1], &en))
      throw_io(tw + ": data_offsets must be non-negative integers, got [" + offset_text((*o)[0]) + ", " +
               offset_text((*o)[1]) + "]");
    if (b > en)
      throw_io(tw + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
               "] has begin > end");
    if (en > data_bytes)
      throw_io(tw + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
               "] extend beyond the data section of " + std::to_string(data_bytes) +
               " bytes (truncated file or a header that lies about offsets)");
    if (en - b != nbytes)
      throw_io(tw + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] span " +
               std::to_string(en - b) + " bytes but shape " + shape_string(e.shape) + " x " + ds +
               " needs " + std::to_string(nbytes) + " bytes");
    e.begin = h.data_start + b;
    e.end = h.data_start + en;
    h.entries.push_back(std::move(e));
  }
  return h;
}

/// One memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  /// Maps and validates `path` (throws `Error`, see the file comment).
  explicit SafetensorsFile(const std::string& path) : map_(path) {
    header_ = parse_safetensors_header(map_.data(), map_.size(), path);
    for (std::size_t i = 0; i < header_.entries.size(); ++i) index_[header_.entries[i].name] = i;
  }
  const std::string& path() const { return map_.path(); }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// Tensor names in header order.
  std::vector<std::string> names() const {
    std::vector<std::string> r;
    for (const auto& e : header_.entries) r.push_back(e.name);
    return r;
  }
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  /// The entry of `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &header_.entries[it->second];
  }
  /// A zero-copy view of tensor `name`; throws `Error` (kNotFound) naming the tensor and file.
  TensorView view(const std::string& name) const {
    const SafetensorsEntry* e = find(name);
    if (!e)
      throw Error(StatusCode::kNotFound, "tensor " + detail::quote_name(name) + " not found in safetensors file '" +
                                             path() + "' (" + std::to_string(header_.entries.size()) + " tensors)");
    return view_of(*e);
  }
  TensorView view_of(const SafetensorsEntry& e) const {
    TensorView v;
    v.name = e.name;
    v.dtype = e.dtype;
    v.shape = e.shape;
    v.data = map_.data() ? map_.data() + e.begin : nullptr;
    return v;
  }

 private:
  MappedFile map_;
  SafetensorsHeader header_;
  std::map<std::string, std::size_t> index_;
};

// ---------------------------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------------------------

// f16_bits_to_float (IEEE fp16 bits -> fp32, exact) lives in step5/core/numeric.hpp.

/// Element `i` of a view as fp32 (any dtype; ints converted, BOOL as 0/1). No bounds check.
inline float element_as_float(const TensorView& v, std::int64_t i) {
  const auto* p = static_cast<const std::uint8_t*>(v.data) + static_cast<std::size_t>(i) * dtype_size(v.dtype);
  auto load = [p](auto tag) {
    decltype(tag) x;
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (v.dtype) {
    case DType::kBF16: return bf16_bits_to_float(load(std::uint16_t{}));
    case DType::kF16: return f16_bits_to_float(load(std::uint16_t{}));
    case DType::kF32: return load(float{});
    case DType::kF64: return static_cast<float>(load(double{}));
    case DType::kF8E4M3: return e4m3_bits_to_float(*p);
    case DType::kF8E5M2: return f16_bits_to_float(static_cast<std::uint16_t>(*p << 8));
    case DType::kI8: return static_cast<float>(static_cast<std::int8_t>(*p));
    case DType::kU8: return static_cast<float>(*p);
    case DType::kI16: return static_cast<float>(load(std::int16_t{}));
    case DType::kI32: return static_cast<float>(load(std::int32_t{}));
    case DType::kI64: return static_cast<float>(load(std::int64_t{}));
    case DType::kBool: return *p ? 1.0f : 0.0f;
  }
  return 0.0f;
}

/// Copies a view into fp32 values (exact for BF16/F16/F32/F8; rounded for F64/I32/I64).
inline std::vector<float> to_float_vector(const TensorView& v) {
  const std::int64_t n = v.numel();
  std::vector<float> out(static_cast<std::size_t>(n));
  if (v.dtype == DType::kF32) {
    if (n) std::memcpy(out.data(), v.data, static_cast<std::size_t>(n) * 4);
    return out;
  }
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = element_as_float(v, i);
  return out;
}

/// Copies a view into bf16 bit patterns: BF16 copied; other dtypes widened to fp32 and rounded
/// to nearest even by `float_to_bf16_bits` (the "used as bf16" rule of SPEC §3/§4).
inline std::vector<std::uint16_t> to_bf16_bits_vector(const TensorView& v) {
  const std::int64_t n = v.numel();
  std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
  if (v.dtype == DType::kBF16) {
    if (n) std::memcpy(out.data(), v.data, static_cast<std::size_t>(n) * 2);
    return out;
  }
  for (std::int64_t i = 0; i < n; ++i)
    out[static_cast<std::size_t>(i)] = float_to_bf16_bits(element_as_float(v, i));
  return out;
}

/// Throws `Error` (kInvalidArgument) unless `v` has `dtype` and `shape`; names the tensor,
/// expected and got.
inline void expect_tensor(const TensorView& v, DType dtype, const std::vector<std::int64_t>& shape) {
  if (v.dtype != dtype || v.shape != shape)
    throw Error(StatusCode::kInvalidArgument,
                "tensor " + detail::quote_name(v.name) + ": expected " + std::string(dtype_name(dtype)) + " " +
                    shape_string(shape) + ", got " + std::string(dtype_name(v.dtype)) + " " + shape_string(v.shape));
}

}  // namespace step5
