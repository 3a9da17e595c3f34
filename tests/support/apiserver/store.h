// The object store of the test API server: objects per resource
// ("<group>/<plural>") keyed "<namespace>/<name>", one global resourceVersion
// counter bumped by every write, the history of changes (for watches that
// start from a version) and the open watchers, which get each change that
// concerns them as it is made.
//
// Thread-safe. The store does no validation: callers decide what to write.
// Callers that read, then write (an update checking resourceVersion) must
// serialise those sequences themselves.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::testing {

class Store;

// One open watch: the events for it, in order, until closed.
class Watcher {
 public:
  enum class Next { kEvent, kIdle, kClosed, kExpired };

 private:
  friend class Store;
  std::string resource_;
  std::function<bool(const nlohmann::json&)> matches_;
  std::deque<nlohmann::json> events_;  // {"type", "object"}
  bool closed_ = false;
  bool expired_ = false;
};

class Store {
 public:
  struct Snapshot {
    std::vector<nlohmann::json> items;  // sorted by namespace/name
    uint64_t resource_version = 0;
  };

  uint64_t resourceVersion() const;
  // Oldest version a watch may start from (0 before any compaction).
  uint64_t compactedVersion() const;

  std::optional<nlohmann::json> get(const std::string& resource, const std::string& ns,
                                    const std::string& name) const;
  // `ns` empty: every namespace. Items after `after_key` ("ns/name") only.
  Snapshot list(const std::string& resource, const std::string& ns,
                const std::string& after_key = "") const;
  // Every object of every resource: (resource, object).
  std::vector<std::pair<std::string, nlohmann::json>> all() const;

  // Writes set metadata.resourceVersion and return the stored object.
  nlohmann::json create(const std::string& resource, nlohmann::json object);
  nlohmann::json update(const std::string& resource, nlohmann::json object);
  // The deleted object (with the deletion's resourceVersion), or nullopt.
  std::optional<nlohmann::json> remove(const std::string& resource, const std::string& ns,
                                       const std::string& name);

  // A watcher of `resource` for objects `matches` accepts, starting after
  // version `from` (replayed from history), or with ADDED events for all
  // current matching objects when `from` is nullopt. nullptr when `from` is
  // older than the compacted history. With `initial_events_end` (and `from`
  // nullopt) the ADDED events are followed by a BOOKMARK annotated
  // k8s.io/initial-events-end: "true" (a streaming list, sendInitialEvents).
  std::shared_ptr<Watcher> watch(const std::string& resource,
                                 std::function<bool(const nlohmann::json&)> matches,
                                 std::optional<uint64_t> from, bool initial_events_end = false);
  // Waits until the watcher has an event (moved into `event`), is closed, or
  // the deadline passes (kIdle; `version` is then the store's version, every
  // change up to which the watcher has been given).
  Watcher::Next next(Watcher& watcher, std::chrono::steady_clock::time_point deadline,
                     nlohmann::json& event, uint64_t& version);
  void unwatch(const std::shared_ptr<Watcher>& watcher);
  // Wakes waiters so they can notice outside conditions (a client gone, shutdown).
  void wakeAll();

  // Forgets history; open watchers end with kExpired.
  void compact();
  // Ends every open watcher (kClosed).
  void closeWatches();
  // Every object and all history gone, versions from 1 again; watches end.
  void clear();

 private:
  struct Change {
    uint64_t version;
    std::string resource;
    std::string type;  // ADDED, MODIFIED, DELETED
    nlohmann::json object;
    nlohmann::json old_object;  // null for ADDED
  };
  void record(Change change);  // with mutex_ held
  // Ends every open watcher (kExpired when `expired`, else kClosed); with
  // mutex_ held.
  void endWatches(bool expired);
  static void deliver(Watcher& watcher, const Change& change);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t version_ = 1;
  uint64_t compacted_ = 0;
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;
  std::deque<Change> history_;
  std::vector<std::shared_ptr<Watcher>> watchers_;
};

std::string objectKey(const nlohmann::json& object);

}  // namespace tandem::testing
