#pragma once
/// \file step5/core/status.hpp
/// Error handling of the library: `Status` (errors as values, used by every launcher, the
/// run-time layout checks and the NCCL wrappers) and `Error` (the exception thrown by host-side
/// I/O: checkpoint readers, config parsing, the fused-weight loader). Library code never calls
/// exit/abort. Host-safe (g++).
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <initializer_list>
#include <string>
#include <utility>

namespace step5 {

/// Category of a failure.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  ///< a value outside what the operation accepts (the message names it)
  kUnsupported,      ///< a geometry, tp, dtype or device the library does not support
  kNotFound,         ///< a missing file, tensor or config field
  kIoError,          ///< a read/write failure, a truncated or malformed file
  kCudaError,        ///< a CUDA runtime/driver error (the message names the call)
  kNcclError,        ///< an NCCL error
  kInternal,         ///< a broken invariant of the library itself
};

inline const char* status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kNcclError: return "NCCL error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

/// The result of an operation that returns no value: ok, or a code and a message that names the
/// offending value and what was expected.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "invalid argument: <message>" (or "ok").
  std::string to_string() const {
    return ok() ? std::string("ok") : std::string(status_code_name(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }

/// `v` as error messages print a floating-point argument (printf "%g": 1e+300, inf, nan, -1).
inline std::string float_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

/// A named pointer argument, for `require_non_null`.
struct NamedPointer {
  const char* name;
  const void* ptr;
};
/// kInvalidArgument "<op>: <name> is null" for the first null pointer of `ptrs`, else Ok.
inline Status require_non_null(const char* op, std::initializer_list<NamedPointer> ptrs) {
  for (const NamedPointer& p : ptrs)
    if (p.ptr == nullptr) return invalid_argument(std::string(op) + ": " + p.name + " is null");
  return Status::Ok();
}
/// kInvalidArgument "<op>: <name> is at an address = <off> mod <align>, expected <align>-byte
/// aligned" for the first pointer of `ptrs` that is not `align`-byte aligned (`align` > 0), else Ok.
inline Status require_aligned(const char* op, std::uintptr_t align, std::initializer_list<NamedPointer> ptrs) {
  for (const NamedPointer& p : ptrs) {
    const std::uintptr_t off = reinterpret_cast<std::uintptr_t>(p.ptr) % align;
    if (off != 0)
      return invalid_argument(std::string(op) + ": " + p.name + " is at an address = " + std::to_string(off) + " mod " +
                              std::to_string(align) + ", expected " + std::to_string(align) + "-byte aligned");
  }
  return Status::Ok();
}
/// A named device buffer for `require_disjoint`: the bytes [ptr, ptr + bytes) an operation
/// accesses (its first to its last byte, from the shapes and strides it validates).
struct NamedRange {
  const char* name;
  const void* ptr;
  std::uint64_t bytes;
};
/// The bytes `require_disjoint` tests for rows [0, rows) of `width` elements of `elem_bytes`
/// bytes, `stride` elements apart: from the first to the last element, (rows − 1) · stride +
/// width elements; 0 (an empty range) when rows or width is not positive. Unsigned: a huge
/// stride wraps instead of overflowing (the callers refuse such strides first:
/// `require_strided_rows_fit`).
inline std::uint64_t strided_rows_bytes(std::int64_t rows, std::int64_t stride, std::int64_t width,
                                        std::uint64_t elem_bytes) {
  if (rows <= 0 || width <= 0) return 0;
  return (static_cast<std::uint64_t>(rows - 1) * static_cast<std::uint64_t>(stride) + static_cast<std::uint64_t>(width)) *
         elem_bytes;
}
/// The most elements of `elem_bytes` (> 0) bytes that 2^63 − 1 bytes hold: the one bound of
/// `require_strided_rows_fit` and `require_elements_fit` (byte extents below it never wrap, and a
/// kernel's int64 element offsets stay in range).
inline std::uint64_t max_elements_in_bytes(std::uint64_t elem_bytes) {
  return static_cast<std::uint64_t>(INT64_MAX) / elem_bytes;
}
/// Ok when rows [0, rows) of `width` elements of `elem_bytes` bytes, `stride` (>= 0) elements
/// apart, end within 2^63 - 1 bytes of their start (so that `strided_rows_bytes` does not wrap
/// and a kernel's int64 offset row * stride stays in range); else kInvalidArgument "<op>:
/// <stride_name> = <v> with <rows> rows of <width>: ..., expected <stride_name> <= <largest>".
/// Ok for no rows or no width. A stride below the width is the caller's own check.
inline Status require_strided_rows_fit(const char* op, const char* stride_name, std::int64_t rows, std::int64_t stride,
                                       std::int64_t width, std::uint64_t elem_bytes) {
  if (rows <= 0 || width <= 0 || stride < 0 || elem_bytes == 0) return Status::Ok();
  const std::uint64_t max_elems = max_elements_in_bytes(elem_bytes), w = static_cast<std::uint64_t>(width);
  const std::uint64_t largest = w <= max_elems && rows > 1 ? (max_elems - w) / static_cast<std::uint64_t>(rows - 1) : 0;
  if (w <= max_elems && (rows == 1 || static_cast<std::uint64_t>(stride) <= largest)) return Status::Ok();
  return invalid_argument(std::string(op) + ": " + stride_name + " = " + std::to_string(stride) + " with " +
                          std::to_string(rows) + " rows of " + std::to_string(width) + ": the rows end past 2^63 - 1 " +
                          "bytes ((rows - 1) * " + stride_name + " + " + std::to_string(width) + " elements of " +
                          std::to_string(elem_bytes) + " bytes), expected " + stride_name + " <= " +
                          std::to_string(largest));
}
/// Ok when `count` elements of `elem_bytes` bytes span at most 2^63 - 1 bytes (so that a byte
/// extent count * elem_bytes, e.g. `require_disjoint`'s, does not wrap); else kInvalidArgument
/// "<op>: <name> = <count> elements of <elem_bytes> bytes pass 2^63 - 1 bytes, expected <name> <= <largest>".
inline Status require_elements_fit(const char* op, const char* name, std::uint64_t count, std::uint64_t elem_bytes) {
  if (elem_bytes == 0 || count <= max_elements_in_bytes(elem_bytes)) return Status::Ok();
  return invalid_argument(std::string(op) + ": " + name + " = " + std::to_string(count) + " elements of " +
                          std::to_string(elem_bytes) + " bytes pass 2^63 - 1 bytes, expected " + name + " <= " +
                          std::to_string(max_elements_in_bytes(elem_bytes)));
}
/// kInvalidArgument "<op>: <out> [0x.., +N bytes) overlaps <other> [0x.., +M bytes), expected
/// disjoint buffers" for the first output of `outputs` whose byte range overlaps an input of
/// `inputs` or a later output of `outputs`, else Ok. A null pointer or 0 bytes is an empty range
/// (the callers check null pointers themselves). For the outputs a kernel writes while other
/// threads or CTAs may still read the inputs (a partial or whole overlap gives silently wrong
/// results); an op whose kernel reads each element before it writes it in the same thread, and
/// thus supports an exact in-place call, does not list that pair. A range test: two strided
/// views interleaved in one buffer (different columns of the same rows) count as overlapping.
inline Status require_disjoint(const char* op, std::initializer_list<NamedRange> outputs,
                               std::initializer_list<NamedRange> inputs) {
  const auto begin = [](const NamedRange& r) { return reinterpret_cast<std::uintptr_t>(r.ptr); };
  const auto end = [&](const NamedRange& r) {  // saturating: a range past the address space ends there
    const std::uintptr_t b = begin(r);
    return r.bytes > UINTPTR_MAX - b ? UINTPTR_MAX : b + static_cast<std::uintptr_t>(r.bytes);
  };
  const auto text = [&](const NamedRange& r) {
    char b[64];
    std::snprintf(b, sizeof b, " [%p, +%llu bytes)", r.ptr, static_cast<unsigned long long>(r.bytes));
    return std::string(r.name) + b;
  };
  const auto overlap = [&](const NamedRange& a, const NamedRange& b) {
    return a.ptr != nullptr && b.ptr != nullptr && a.bytes > 0 && b.bytes > 0 && begin(a) < end(b) &&
           begin(b) < end(a);
  };
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (const NamedRange& i : inputs)
      if (overlap(*o, i))
        return invalid_argument(std::string(op) + ": " + text(*o) + " overlaps " + text(i) +
                                ", expected disjoint buffers (" + o->name + " is written while " + i.name +
                                " is read)");
    for (auto o2 = o + 1; o2 != outputs.end(); ++o2)
      if (overlap(*o, *o2))
        return invalid_argument(std::string(op) + ": " + text(*o) + " overlaps " + text(*o2) +
                                ", expected disjoint buffers (both are written)");
  }
  return Status::Ok();
}
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }

/// Exception thrown by host-side I/O and loading code (never by launchers).
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  explicit Error(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

/// Throws `Error` when `s` is not ok (for host code that prefers exceptions).
inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw Error(s);
}

/// Throws `Error(kInvalidArgument, "<where>: <what>")` when `cond` is false.
inline void require(bool cond, const std::string& where, const std::string& what) {
  if (!cond) throw Error(StatusCode::kInvalidArgument, where + ": " + what);
}

}  // namespace step5

/// Returns the Status from the enclosing function when `expr` is not ok.
#define STEP5_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::step5::Status step5_status_ = (expr);    \
    if (!step5_status_.ok()) return step5_status_; \
  } while (0)
