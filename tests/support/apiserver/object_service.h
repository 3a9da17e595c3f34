// The verbs of the test API server on objects, without HTTP: get, list,
// create, update (main resource and the status subresource), patch (merge,
// JSON, strategic, server-side apply), delete with ownerReference garbage
// collection, and the scale subresource. Each answers an ApiResult: the
// object (or list, or Scale) to send, or an ApiError worded like the real
// server's. Custom kinds get their CRD schema's defaults, pruning, field
// validation (Strict / Warn / Ignore) and validation.
//
// Thread-safe: writes are serialised (read, check, write as one step).
// Admin writes (put/removeAsAdmin) skip resourceVersion checks, injected
// conflicts and status stripping, but fire watch events like any write.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/api_status.h"
#include "tests/support/apiserver/kind_registry.h"
#include "tests/support/apiserver/selectors.h"
#include "tests/support/apiserver/store.h"

namespace tandem::testing {

struct ApiResult {
  int code = 200;
  nlohmann::json body;
  std::optional<ApiError> error;
  std::vector<std::string> warnings;  // Warning: 299 headers (fieldValidation=Warn)

  bool ok() const { return !error.has_value(); }
  static ApiResult failure(ApiError error) {
    ApiResult result;
    result.code = error.code;
    result.error = std::move(error);
    return result;
  }
};

struct WriteOptions {
  std::string field_validation = "Warn";  // Strict, Warn or Ignore
  std::string field_manager;
  bool dry_run = false;
  bool admin = false;
};

struct ListOptions {
  std::optional<Selector> labels;
  std::optional<Selector> fields;
  int64_t limit = 0;
  std::string continue_token;
};

class ObjectService {
 public:
  ObjectService(Store& store, KindRegistry& registry);

  ApiResult get(const KindInfo& kind, const std::string& ns, const std::string& name) const;
  ApiResult list(const KindInfo& kind, const std::string& ns, const ListOptions& options) const;
  ApiResult create(const KindInfo& kind, const std::string& ns, nlohmann::json body,
                   const WriteOptions& options);
  // `subresource`: "", "status" or "scale".
  ApiResult update(const KindInfo& kind, const std::string& ns, const std::string& name,
                   const std::string& subresource, nlohmann::json body,
                   const WriteOptions& options);
  ApiResult patch(const KindInfo& kind, const std::string& ns, const std::string& name,
                  const std::string& subresource, const std::string& content_type,
                  const std::string& body, const WriteOptions& options);
  // `delete_options` is a DeleteOptions object (propagationPolicy, preconditions) or null.
  ApiResult remove(const KindInfo& kind, const std::string& ns, const std::string& name,
                   const nlohmann::json& delete_options, bool dry_run);
  ApiResult getScale(const KindInfo& kind, const std::string& ns, const std::string& name) const;

  // Creates or replaces as an administrator would; throws std::invalid_argument
  // when the object's kind is unknown or it has no name.
  nlohmann::json put(const nlohmann::json& object);

  void injectConflicts(int count, const std::string& kind);
  // Called (inside the write) after a Deployment is created or its spec
  // (generation) changed, and after setDeploymentStatus-like admin writes are not.
  void setDeploymentHook(std::function<void(const nlohmann::json& deployment)> hook);

 private:
  ApiResult createLocked(const KindInfo& kind, const std::string& ns, nlohmann::json body,
                         const WriteOptions& options);
  ApiResult updateLocked(const KindInfo& kind, const nlohmann::json& old,
                         const std::string& subresource, nlohmann::json candidate,
                         const WriteOptions& options);
  ApiResult removeLocked(const KindInfo& kind, const std::string& ns, const std::string& name,
                         const std::string& propagation);
  // Defaults, pruning, strict field checks and schema validation of a custom
  // object; an error or nothing (warnings appended).
  std::optional<ApiError> checkCustomObject(const KindInfo& kind, nlohmann::json& object,
                                            const WriteOptions& options,
                                            std::vector<std::string>& warnings) const;
  void collectGarbage(const std::string& owner_uid, const std::string& propagation);
  std::optional<KindInfo> kindOfResource(const std::string& resource) const;
  bool takeInjectedConflict(const KindInfo& kind);

  Store& store_;
  KindRegistry& registry_;
  std::recursive_mutex write_mutex_;
  std::mutex conflicts_mutex_;
  int injected_conflicts_ = 0;
  std::string injected_conflict_kind_;
  std::function<void(const nlohmann::json&)> deployment_hook_;
  // Server-side apply: each field manager's last applied intent, per object.
  std::map<std::string, std::map<std::string, nlohmann::json>> applied_;
};

// Fresh metadata values.
std::string newUid();
std::string nowTimestamp();
// RFC 3339 in UTC to the second, as the API writes timestamps.
std::string timestampOf(std::chrono::system_clock::time_point when);
// `length` characters drawn uniformly from `alphabet`.
std::string randomText(const std::string& alphabet, size_t length);
// Scale (autoscaling/v1) of an object of a kind with a scale subresource.
nlohmann::json scaleOf(const KindInfo& kind, const nlohmann::json& object);

}  // namespace tandem::testing
