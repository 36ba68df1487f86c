#pragma once
/// \file step5/weights/safetensors_writer.hpp
/// Streaming safetensors writer (SPEC.md §7, the format of safetensors_reader.hpp): `TensorSpec`,
/// `SafetensorsWriter` (header first, then the tensors' bytes appended in order) and
/// `write_safetensors` for tensors held in memory. Errors throw `step5::Error` naming the file
/// (and tensor): kIoError on create/write/close failures, kInvalidArgument on misuse (invalid or
/// duplicate name, a name or metadata string not valid UTF-8, negative dim, a header above the
/// reader's kSafetensorsMaxHeaderBytes, more or fewer bytes than the header declares, a view
/// without data).
///
/// Host only (g++); needs nlohmann-json.
#include <algorithm>  // std::any_of
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "step5/core/status.hpp"
#include "step5/core/tensor.hpp"
#include "step5/weights/safetensors_reader.hpp"  // detail::quote_name (names in messages)

namespace step5 {

namespace detail {
/// True when `s` can be JSON text (valid UTF-8; nlohmann's dump throws type_error 316 otherwise,
/// and the reader refuses such a header as malformed JSON).
inline bool json_string_ok(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}
}  // namespace detail

/// Name, dtype and shape of a tensor to be written.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes() const {
    std::uint64_t n = dtype_size(dtype);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

/// Streaming safetensors writer: the header (all names, dtypes, shapes and offsets, in the
/// given order) is written on construction; the tensors' bytes are then appended in that order
/// with `append` (any number of calls per tensor); `finish` checks every byte was written and
/// closes the file. The header is padded with spaces to a multiple of 8 bytes. Throws `Error`
/// (kIoError on write failure naming the file; kInvalidArgument on misuse). Move-only.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {})
      : path_(path), specs_(std::move(specs)) {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata) {
        if (!detail::json_string_ok(k) || !detail::json_string_ok(v))
          throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': '__metadata__' entry " +
                                                        detail::quote_name(k) + ": key or value is not valid UTF-8");
        m[k] = v;
      }
      h["__metadata__"] = m;
    }
    std::uint64_t off = 0;
    std::map<std::string, int> seen;
    for (const auto& s : specs_) {
      if (s.name.empty() || s.name == "__metadata__" || seen[s.name]++)
        throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': invalid or duplicate tensor name " +
                                                      detail::quote_name(s.name));
      if (!detail::json_string_ok(s.name))
        throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': tensor name " +
                                                      detail::quote_name(s.name) + " is not valid UTF-8");
      for (auto d : s.shape)
        if (d < 0)
          throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': tensor " +
                                                        detail::quote_name(s.name) + " has a negative dim in " +
                                                        shape_string(s.shape));
      std::uint64_t nb = 0;
      if (!detail::tensor_bytes_fit(s.shape, s.dtype, &nb))
        throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': tensor " +
                                                      detail::quote_name(s.name) + ": shape " + shape_string(s.shape) +
                                                      " of dtype " + std::string(dtype_name(s.dtype)) +
                                                      " overflows 64-bit sizes");
      if (nb > static_cast<std::uint64_t>(INT64_MAX) - off)
        throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': the data bytes up to tensor " +
                                                      detail::quote_name(s.name) + " (" + std::to_string(off) + " + " +
                                                      std::to_string(nb) + ") overflow 64-bit sizes");
      h[s.name] = {{"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.shape}, {"data_offsets", {off, off + nb}}};
      off += nb;
    }
    total_ = off;
    std::string text = h.dump();
    while (text.size() % 8) text += ' ';
    if (text.size() > kSafetensorsMaxHeaderBytes)  // the reader would refuse the file
      throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path + "': header of " +
                                                    std::to_string(text.size()) + " bytes exceeds the reader's limit of " +
                                                    std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) throw Error(StatusCode::kIoError, "cannot create '" + path + "': " + std::strerror(errno));
    std::uint8_t len[8];
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
    try {
      put(len, 8);
      put(text.data(), text.size());
    } catch (...) {  // a constructor that throws runs no destructor: close the file here
      std::fclose(f_);
      f_ = nullptr;
      throw;
    }
  }
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter() {
    if (f_) std::fclose(f_);
  }

  /// Appends `n` bytes of data (continuing the current tensor, then the next ones).
  void append(const void* bytes, std::uint64_t n) {
    if (n > total_ - written_)  // (written_ + n could wrap past 2^64)
      throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path_ + "': " + std::to_string(written_) +
                                                    " data bytes written, " + std::to_string(n) +
                                                    " more appended, the header declares " + std::to_string(total_));
    put(bytes, n);
    written_ += n;
  }
  /// Total data bytes declared by the header.
  std::uint64_t data_bytes() const { return total_; }
  /// Checks that every declared byte was written, flushes and closes.
  void finish() {
    if (written_ != total_)
      throw Error(StatusCode::kInvalidArgument, "safetensors writer '" + path_ + "': only " +
                                                    std::to_string(written_) + " of " + std::to_string(total_) +
                                                    " data bytes were written");
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) throw Error(StatusCode::kIoError, "cannot close '" + path_ + "': " + std::strerror(errno));
  }

 private:
  void put(const void* p, std::uint64_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n)
      throw Error(StatusCode::kIoError, "write to '" + path_ + "' failed: " + std::strerror(errno));
  }
  std::string path_;
  std::vector<TensorSpec> specs_;
  std::FILE* f_ = nullptr;
  std::uint64_t total_ = 0;
  std::uint64_t written_ = 0;
};

/// Writes `tensors` (each view's `numel()*dtype_size` bytes from `data`) to one safetensors
/// file at `path`, in the given order, with optional string `metadata`. Throws `Error`.
inline void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  std::vector<TensorSpec> specs;
  std::vector<std::uint64_t> bytes;
  for (const auto& t : tensors) {
    std::uint64_t nb = 0;  // (TensorView::nbytes would overflow int64 before the writer's check)
    const bool negative = std::any_of(t.shape.begin(), t.shape.end(), [](std::int64_t d) { return d < 0; });
    if (!negative && !detail::tensor_bytes_fit(t.shape, t.dtype, &nb))  // a negative dim: the writer names it
      throw Error(StatusCode::kInvalidArgument, "write_safetensors '" + path + "': tensor " + detail::quote_name(t.name) +
                                                    ": shape " + shape_string(t.shape) + " of dtype " +
                                                    std::string(dtype_name(t.dtype)) + " overflows 64-bit sizes");
    if (!t.data && nb > 0)
      throw Error(StatusCode::kInvalidArgument, "write_safetensors '" + path + "': tensor " +
                                                    detail::quote_name(t.name) + " has no data");
    specs.push_back({t.name, t.dtype, t.shape});
    bytes.push_back(nb);
  }
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (std::size_t i = 0; i < tensors.size(); ++i) w.append(tensors[i].data, bytes[i]);
  w.finish();
}

}  // namespace step5
