// Status and StatusOr: the error model of request paths.
//
// Request paths (HTTP handlers, scheduler, connectors, transport) return a
// Status or StatusOr<T> whose message names what was wrong and what is
// accepted. Start-up code (loading a model, parsing flags) may throw
// tandem::Error instead; `main` catches it and prints one line.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace tandem {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kPermissionDenied,
  kOutOfRange,
  kFailedPrecondition,
  kResourceExhausted,
  kUnavailable,
  kDeadlineExceeded,
  kAborted,
  kDataLoss,
  kUnimplemented,
  kInternal,
};

const char* statusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: max_tokens must be ..." — for logs.
  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status notFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
inline Status permissionDenied(std::string msg) {
  return Status(StatusCode::kPermissionDenied, std::move(msg));
}
inline Status outOfRange(std::string msg) {
  return Status(StatusCode::kOutOfRange, std::move(msg));
}
inline Status failedPrecondition(std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg));
}
inline Status resourceExhausted(std::string msg) {
  return Status(StatusCode::kResourceExhausted, std::move(msg));
}
inline Status unavailable(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status dataLoss(std::string msg) { return Status(StatusCode::kDataLoss, std::move(msg)); }
inline Status internalError(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// A value or the Status that explains why there is none.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}        // NOLINT: implicit by design
  StatusOr(Status status) : value_(std::move(status)) {  // NOLINT: implicit by design
    TANDEM_CHECK(!std::get<Status>(value_).isOk(), "StatusOr built from an OK status");
  }

  bool isOk() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOkStatus;
    return isOk() ? kOkStatus : std::get<Status>(value_);
  }
  T& value() & {
    TANDEM_CHECK(isOk(), "StatusOr::value() on an error");
    return std::get<T>(value_);
  }
  const T& value() const& {
    TANDEM_CHECK(isOk(), "StatusOr::value() on an error");
    return std::get<T>(value_);
  }
  T&& value() && {
    TANDEM_CHECK(isOk(), "StatusOr::value() on an error");
    return std::get<T>(std::move(value_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> value_;
};

// Thrown by start-up code (model loading, configuration); the message is
// complete and user-facing.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tandem
