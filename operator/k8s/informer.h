// An informer: a local cache of one resource type in one namespace (or all),
// kept current by list-then-watch, as client-go's reflector and informer do.
//
// start() lists (paged) and then watches from the list's resourceVersion with
// bookmarks; each event updates the cache and calls the handler. When the
// watch ends (server timeout, connection lost) it watches again from the
// last resourceVersion seen (a BOOKMARK advances it); when the server says
// 410 Gone (an answer or an ERROR event) it relists, and calls the handler
// for every object that was added, changed (resourceVersion differs) or
// deleted meanwhile, so no change is missed. Errors back off (jittered).
//
// The handler runs on the informer's thread, never with the cache locked (it
// may read the cache), and must not block for long: controllers only enqueue
// keys there. It must not call stop(). Cache reads are thread-safe. List
// items lacking apiVersion/kind get the type's. stop() cancels the open watch
// and joins the thread; start() after stop() is not supported.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "operator/k8s/api_client.h"

namespace tandem::k8s {

enum class EventType { kAdded, kModified, kDeleted };

// "NAMESPACE/NAME", or "NAME" for cluster-scoped objects.
std::string objectKey(const nlohmann::json& object);

struct InformerOptions {
  std::string ns;  // "" for all namespaces
  std::string label_selector;
  int watch_timeout_seconds = 300;
  int64_t list_page_size = 500;
};

class Informer {
 public:
  using Handler = std::function<void(EventType, const nlohmann::json& object)>;

  Informer(ApiClient& client, ResourceType type, InformerOptions options, Handler handler);
  ~Informer();  // stops
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void start();
  void stop();
  // True once the first list has been applied to the cache and the handler
  // called for each of its objects.
  bool hasSynced() const { return synced_.load(); }
  bool waitForSync(std::chrono::milliseconds timeout) const;

  std::optional<nlohmann::json> get(const std::string& key) const;
  std::vector<nlohmann::json> list() const;

  // Watches started again after they ended, and relists after 410 (for metrics and tests).
  uint64_t watchRestarts() const { return watch_restarts_.load(); }
  uint64_t relists() const { return relists_.load(); }
  const ResourceType& type() const { return type_; }

 private:
  class Loop;
  // Applies a (re)list's items to the cache; returns the handler calls to make.
  std::vector<std::pair<EventType, nlohmann::json>> replaceCache(std::vector<nlohmann::json> items);
  // Applies one watch event (ADDED, MODIFIED, DELETED) to the cache and calls the handler.
  void applyEvent(const std::string& type, nlohmann::json object);
  void callHandler(EventType type, const nlohmann::json& object);
  void markSynced();

  ApiClient& client_;
  ResourceType type_;
  InformerOptions options_;
  Handler handler_;
  std::atomic<bool> synced_{false};
  std::atomic<uint64_t> watch_restarts_{0};
  std::atomic<uint64_t> relists_{0};
  mutable std::mutex mutex_;  // guards cache_; sync_cv_ waits on it
  mutable std::condition_variable sync_cv_;
  std::map<std::string, nlohmann::json> cache_;
  std::unique_ptr<Loop> loop_;
};

}  // namespace tandem::k8s
