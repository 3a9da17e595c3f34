// Error answers of the test API server as the real one writes them: a
// meta/v1 Status object (status Failure, reason, code, message, details)
// with the HTTP code equal to `code`, and messages worded like the real
// server's so that clients and kubectl print what users would see.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/apiserver/crd_info.h"

namespace tandem::testing {

struct ApiError {
  int code = 500;
  std::string reason;
  std::string message;
  nlohmann::json details = nlohmann::json::object();
};

nlohmann::json statusObject(const ApiError& error);
// {"kind":"Status","status":"Success",...} for deletes answered without the object.
nlohmann::json successStatus(const KindInfo& kind, const std::string& name, const std::string& uid);

ApiError notFound(const KindInfo& kind, const std::string& name);
ApiError alreadyExists(const KindInfo& kind, const std::string& name);
// Stale resourceVersion (or an injected conflict).
ApiError conflict(const KindInfo& kind, const std::string& name);
ApiError conflictWithMessage(const KindInfo& kind, const std::string& name,
                             const std::string& detail);
// 422: `field` and `detail` as in "spec.replicas: Invalid value: -1: must be >= 0".
ApiError invalid(const KindInfo& kind, const std::string& name, const std::string& field,
                 const std::string& detail);
// 422 with several causes: (field, detail) pairs.
ApiError invalidFields(const KindInfo& kind, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& causes);
ApiError badRequest(const std::string& message);
ApiError methodNotAllowed(const std::string& message);
ApiError expired(const std::string& message);  // 410 reason Expired
ApiError gone(const std::string& message);     // 410 reason Gone
// 504 reason Timeout, "Timeout: Too large resource version: N, current: M",
// with the ResourceVersionTooLarge cause: a list or watch from a
// resourceVersion this server has not reached.
ApiError tooLargeResourceVersion(uint64_t asked, uint64_t current);
ApiError unauthorized();
ApiError unsupportedMediaType(const std::string& content_type);
ApiError notFoundPath(const std::string& path);

}  // namespace tandem::testing
