// Errors of Kubernetes API calls, and the result type every call returns.
//
// An ApiError carries what the API server said in its Status object (`code`,
// `reason`, `message`, e.g. 409 "Conflict" "Operation cannot be fulfilled on
// deployments.apps \"prefill\": the object has been modified"), or, for a call
// that got no answer, code 0 and a reason of our own: "Timeout" (connect or
// read deadline passed), "ConnectionFailed", "TLSError", "BadResponse" (the
// body was not the JSON we expected) or "ConfigError".
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace tandem::k8s {

struct ApiError {
  int code = 0;        // HTTP status; 0 when no answer came
  std::string reason;  // the Status object's reason (StatusReason), or ours (see above)
  std::string message;

  bool isNotFound() const { return code == 404; }
  bool isConflict() const { return code == 409 && reason != "AlreadyExists"; }
  bool isAlreadyExists() const { return code == 409 && reason == "AlreadyExists"; }
  // 410 Gone / reason "Expired" or "Gone": a watch or list resourceVersion too old.
  bool isGone() const { return code == 410 || reason == "Expired" || reason == "Gone"; }
  // "Too large resource version: N, current: M" (504 Timeout): a watch or
  // list from a version the server has not reached, as after it restarted
  // with a fresh history; client-go relists from the newest state, as a 410.
  bool isResourceVersionTooLarge() const {
    return message.find("Too large resource version") != std::string::npos;
  }
  // Worth retrying after a backoff: no answer, 429, 5xx.
  bool isTransient() const { return code == 0 || code == 429 || code >= 500; }
  // "409 Conflict: Operation cannot be fulfilled ..." (code omitted when 0).
  std::string toString() const;
};

// A value or the ApiError that explains why there is none.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(ApiError error) : value_(std::move(error)) {}  // NOLINT: implicit by design

  bool isOk() const { return std::holds_alternative<T>(value_); }
  const ApiError& error() const {
    TANDEM_CHECK(!isOk(), "Result::error() on a value");
    return std::get<ApiError>(value_);
  }
  T& value() & {
    TANDEM_CHECK(isOk(), "Result::value() on an error: " + std::get<ApiError>(value_).toString());
    return std::get<T>(value_);
  }
  const T& value() const& {
    TANDEM_CHECK(isOk(), "Result::value() on an error: " + std::get<ApiError>(value_).toString());
    return std::get<T>(value_);
  }
  T&& value() && {
    TANDEM_CHECK(isOk(), "Result::value() on an error: " + std::get<ApiError>(value_).toString());
    return std::get<T>(std::move(value_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, ApiError> value_;
};

// Calls that return nothing but can fail (delete). A reconcile may ask to
// be run again after `requeue_after` (zero: only when something changes).
struct Done {
  std::chrono::milliseconds requeue_after{0};
};

}  // namespace tandem::k8s
