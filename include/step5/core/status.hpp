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
