// Status and Result<T>: Headway's error values.
//
// Codes follow abseil's meanings so that a caller knows what to do:
//   kInvalidArgument     the input is wrong; do not retry with the same input.
//   kNotFound            a named thing does not exist.
//   kOutOfRange          a value lies outside what is allowed (lengths, ids).
//   kResourceExhausted   no room right now (blocks, memory); retry later.
//   kFailedPrecondition  the system is not in a state for this call; fix first.
//   kUnavailable         transient failure (peer down, timeout); retry the call.
//   kAborted             the operation was cut short; retry higher up.
//   kDataLoss            a file or message is corrupt or truncated.
//   kUnimplemented       a feature that is not supported (yet).
//   kInternal            a broken invariant: a bug in Headway.
//
// No exceptions cross module boundaries: functions that can fail return
// Status or Result<T>, both [[nodiscard]].
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace headway {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kOutOfRange,
  kResourceExhausted,
  kFailedPrecondition,
  kUnavailable,
  kAborted,
  kDataLoss,
  kUnimplemented,
  kInternal,
};

// Returns the code's name, e.g. "InvalidArgument".
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status DataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status Unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "InvalidArgument: <message>", or "OK".
  std::string ToString() const;

  // Returns a status with the same code and "<context>: <message>".
  Status WithContext(const std::string& context) const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or an error. REQUIRES: status passed in is not OK.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result built from an OK status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace headway

// Returns early from the enclosing function if `expr` yields a non-OK Status.
#define HW_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::headway::Status hw_status_ = (expr);       \
    if (!hw_status_.ok()) return hw_status_;     \
  } while (0)

#define HW_CONCAT_INNER_(a, b) a##b
#define HW_CONCAT_(a, b) HW_CONCAT_INNER_(a, b)

// `HW_ASSIGN_OR_RETURN(auto x, ResultExpr());` assigns the value or returns
// the error status from the enclosing function.
#define HW_ASSIGN_OR_RETURN(lhs, expr) \
  HW_ASSIGN_OR_RETURN_IMPL_(HW_CONCAT_(hw_result_, __LINE__), lhs, expr)
#define HW_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// CHECK for programmer bugs only (never for input): aborts with a message.
#define HW_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) ::headway::internal::CheckFailed(#cond, __FILE__, __LINE__);      \
  } while (0)

namespace headway::internal {
[[noreturn]] void CheckFailed(const char* cond, const char* file, int line);
}  // namespace headway::internal
