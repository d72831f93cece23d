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
//   kCancelled           the caller (or its client) gave the operation up.
//   kDeadlineExceeded    the deadline passed before the operation finished;
//                        one that changes state may still have taken effect
//                        (a late write landing), so retry only where that is
//                        safe.
//
// No exceptions cross module boundaries: functions that can fail return
// Status or Result<T>, both [[nodiscard]].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace headway {

// The numeric values travel between processes (StepResult.code and
// TransferResult.code in proto/control.proto): never renumber a code, add
// new ones at the end.
enum class StatusCode : uint32_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kOutOfRange = 3,
  kResourceExhausted = 4,
  kFailedPrecondition = 5,
  kUnavailable = 6,
  kAborted = 7,
  kDataLoss = 8,
  kUnimplemented = 9,
  kInternal = 10,
  kCancelled = 11,
  kDeadlineExceeded = 12,
};

// The largest StatusCode value, for code that checks a number off the wire.
inline constexpr StatusCode kMaxStatusCode = StatusCode::kDeadlineExceeded;

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
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) { return {StatusCode::kDeadlineExceeded, std::move(msg)}; }
  // The status of `code` with `msg`, for code that rebuilds a status from
  // its parts (a code off the wire). kOk gives OK and drops `msg`.
  static Status FromCode(StatusCode code, std::string msg) {
    if (code == StatusCode::kOk) return Ok();
    return {code, std::move(msg)};
  }

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

namespace internal {
// Aborts the process with "Result::value() on an error: <status>" on
// stderr. Called by Result<T> in every build type (not an assert: a
// release build must not read a value that is not there).
[[noreturn]] void ResultValueFailed(const Status& status);
// Aborts the process saying that a Result was built from an OK status.
[[noreturn]] void ResultFromOkStatus();
}  // namespace internal

// A value or an error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // REQUIRES: !status.ok() (checked: aborts, as there would be no value).
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) internal::ResultFromOkStatus();
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok(). On an error, aborts the process with a message naming
  // the status (any build type); a caller that may see an error checks ok()
  // first or uses HW_ASSIGN_OR_RETURN.
  T& value() & { CheckOk(); return *value_; }
  const T& value() const& { CheckOk(); return *value_; }
  T&& value() && { CheckOk(); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const {
    if (!ok()) [[unlikely]] internal::ResultValueFailed(status_);
  }

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
