// Status and Result<T>: recoverable errors as values.
//
// A Status is either OK or carries a code and a message that names what failed and where.
// Result<T> holds a T or a non-OK Status. Both are cheap to move and safe to copy.
// Thread-safety: values; no shared state.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace parasol {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kBadMessage = 3,
  kUnavailable = 4,
  kTimeout = 5,
  kInternal = 6,
  kFailedPrecondition = 7,
  kResourceExhausted = 8,
  kVersionMismatch = 9,
  kIoError = 10,
  kAborted = 11,  // the job rolled back: what was asked belongs to an undone history
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "BadMessage: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
inline Status BadMessage(std::string msg) {
  return Status(StatusCode::kBadMessage, std::move(msg));
}
inline Status Unavailable(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status Timeout(std::string msg) { return Status(StatusCode::kTimeout, std::move(msg)); }
inline Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
inline Status FailedPrecondition(std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg));
}
inline Status ResourceExhausted(std::string msg) {
  return Status(StatusCode::kResourceExhausted, std::move(msg));
}
inline Status IoError(std::string msg) { return Status(StatusCode::kIoError, std::move(msg)); }
inline Status Aborted(std::string msg) { return Status(StatusCode::kAborted, std::move(msg)); }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace parasol

#define PARASOL_CONCAT_INNER(a, b) a##b
#define PARASOL_CONCAT(a, b) PARASOL_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define PARASOL_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::parasol::Status _st = (expr);            \
    if (!_st.ok()) return _st;                 \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define PARASOL_ASSIGN_OR_RETURN(lhs, expr) \
  PARASOL_ASSIGN_OR_RETURN_IMPL(PARASOL_CONCAT(_result_, __LINE__), lhs, expr)
#define PARASOL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
