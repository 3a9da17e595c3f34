// A Kubernetes API client: REST calls on objects (nlohmann::json in and out)
// over HTTP/1.1 or HTTPS (Boost.Beast, Asio SSL), with the configuration of
// kube_config.h.
//
// Every call has a deadline (ClusterConfig::request_timeout_s; watches their
// own), never throws, and returns the API's error (code, reason, message) or
// ours (api_error.h). Transient failures (no answer, 429, 5xx) are retried
// with jittered exponential backoff up to `RetryPolicy::attempts` times;
// 4xx answers are returned at once. The bearer token file, when configured,
// is re-read when its modification time or size changes, and once more after
// a 401.
//
// Thread-safety: one ApiClient may be used from many threads at once; each
// call uses its own connection (connections are not pooled across threads).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "operator/k8s/api_error.h"
#include "operator/k8s/kube_config.h"
#include "operator/k8s/resource.h"

namespace tandem::k8s {

struct ListOptions {
  std::string label_selector;  // "app.kubernetes.io/managed-by=tandem-operator"
  std::string field_selector;
  int64_t limit = 0;             // page size; 0: no limit (list() still follows `continue`)
  std::string resource_version;  // "" (most recent) or "0" (any)
};

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  std::string resource_version;  // start after this version
  int timeout_seconds = 300;     // the server closes the watch after this
  bool allow_bookmarks = true;
};

// One event of a watch: type ADDED, MODIFIED, DELETED, BOOKMARK or ERROR
// (object is then a Status; a 410 there means relist).
struct WatchEvent {
  std::string type;
  nlohmann::json object;
};

// An open watch. next() blocks until an event, the end of the stream
// (std::nullopt: the server closed it, e.g. after timeoutSeconds) or an error
// (a 410 Gone answer or ERROR event with code 410 comes back as ApiError with
// isGone()). cancel() may be called from another thread and makes a blocked
// next() return std::nullopt promptly.
class WatchStream {
 public:
  virtual ~WatchStream() = default;
  virtual Result<std::optional<WatchEvent>> next() = 0;
  virtual void cancel() = 0;
};

struct RetryPolicy {
  int attempts = 5;  // tries of a transient failure, including the first
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{5000};
};

// While one lives, the calls its thread makes send no new try once
// `keep_trying()` is false: a retry (of a transient failure, or of a
// read-modify-write's conflict) returns the last try's error instead. The
// controller's write fence (ApiWriter) holds one during each write, so a
// replica that lost its Lease sends no write after it refused new ones.
class RetryGate {
 public:
  explicit RetryGate(std::function<bool()> keep_trying);
  ~RetryGate();
  RetryGate(const RetryGate&) = delete;
  RetryGate& operator=(const RetryGate&) = delete;
  // Whether this thread's calls may try again: every gate it holds says so.
  static bool open();

 private:
  std::function<bool()> keep_trying_;
  const RetryGate* outer_;
};

class ApiClient {
 public:
  explicit ApiClient(ClusterConfig config, RetryPolicy retry = {});
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  const ClusterConfig& config() const { return config_; }

  // GET one object (or its subresource, e.g. "scale" or "status").
  Result<nlohmann::json> get(const ResourceType& type, const std::string& ns,
                             const std::string& name, const std::string& subresource = "");
  // LIST, following `continue` until the last page: a "…List" object whose
  // items are every page's items and whose metadata.resourceVersion is the
  // first page's (the version to watch from). A 410 on a later page (the
  // continue token expired) restarts the list once from the beginning.
  Result<nlohmann::json> list(const ResourceType& type, const std::string& ns,
                              const ListOptions& options = {});
  // One page only: `continue_token` from the previous page's metadata.continue.
  Result<nlohmann::json> listPage(const ResourceType& type, const std::string& ns,
                                  const ListOptions& options, const std::string& continue_token);
  // POST. `object` carries apiVersion, kind and metadata.name.
  Result<nlohmann::json> create(const ResourceType& type, const std::string& ns,
                                const nlohmann::json& object);
  // PUT of the whole object (or its status/scale subresource); the object's
  // metadata.resourceVersion makes it conditional: 409 when stale.
  Result<nlohmann::json> update(const ResourceType& type, const std::string& ns,
                                const nlohmann::json& object, const std::string& subresource = "");
  // Read, change, write, and on 409 Conflict read again and re-apply `mutate`
  // (with backoff) up to RetryPolicy::attempts times. `mutate` returns false
  // when there is nothing to change: then nothing is written and the object
  // as read is returned.
  Result<nlohmann::json> readModifyWrite(const ResourceType& type, const std::string& ns,
                                         const std::string& name,
                                         const std::function<bool(nlohmann::json&)>& mutate,
                                         const std::string& subresource = "");
  // PATCH application/merge-patch+json (RFC 7386).
  Result<nlohmann::json> mergePatch(const ResourceType& type, const std::string& ns,
                                    const std::string& name, const nlohmann::json& patch,
                                    const std::string& subresource = "");
  // Server-side apply: PATCH application/apply-patch+yaml (JSON is YAML) with
  // fieldManager=tandem-operator (or `field_manager`) and force=true.
  Result<nlohmann::json> apply(const ResourceType& type, const std::string& ns,
                               const nlohmann::json& object, const std::string& subresource = "",
                               const std::string& field_manager = "tandem-operator");
  // DELETE with propagationPolicy=Background. NotFound counts as done.
  Result<Done> remove(const ResourceType& type, const std::string& ns, const std::string& name);
  // WATCH (?watch=1) from options.resource_version.
  Result<std::unique_ptr<WatchStream>> watch(const ResourceType& type, const std::string& ns,
                                             const WatchOptions& options);
  // GET of a raw path ("/version", "/apis"), for discovery and checks.
  Result<nlohmann::json> getPath(const std::string& path);

  // Calls that reached the server (each retry counts), for metrics.
  uint64_t requestCount() const { return request_count_.load(); }

 private:
  class Impl;
  ClusterConfig config_;
  RetryPolicy retry_;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> request_count_{0};
};

// Jittered exponential backoff: attempt 0 → [initial/2, initial], doubling,
// capped at `max`. Used by the client's retries and the work queue.
std::chrono::milliseconds backoffDelay(int attempt, std::chrono::milliseconds initial,
                                       std::chrono::milliseconds max);

}  // namespace tandem::k8s
