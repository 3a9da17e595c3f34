#include "tests/support/apiserver/store.h"

#include <algorithm>

namespace tandem::testing {
namespace {

// Bounds memory in long tests; older changes count as compacted.
constexpr size_t kMaxHistory = 100000;

std::string nameOf(const nlohmann::json& object) {
  return object.value("metadata", nlohmann::json::object()).value("name", "");
}

std::string namespaceOf(const nlohmann::json& object) {
  return object.value("metadata", nlohmann::json::object()).value("namespace", "");
}

}  // namespace

std::string objectKey(const nlohmann::json& object) {
  return namespaceOf(object) + "/" + nameOf(object);
}

uint64_t Store::resourceVersion() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return version_;
}

uint64_t Store::compactedVersion() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return compacted_;
}

std::optional<nlohmann::json> Store::get(const std::string& resource, const std::string& ns,
                                         const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto objects = objects_.find(resource);
  if (objects == objects_.end()) return std::nullopt;
  auto it = objects->second.find(ns + "/" + name);
  if (it == objects->second.end()) return std::nullopt;
  return it->second;
}

Store::Snapshot Store::list(const std::string& resource, const std::string& ns,
                            const std::string& after_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot snapshot;
  snapshot.resource_version = version_;
  auto objects = objects_.find(resource);
  if (objects == objects_.end()) return snapshot;
  auto it = after_key.empty() ? objects->second.begin() : objects->second.upper_bound(after_key);
  for (; it != objects->second.end(); ++it) {
    if (!ns.empty() && namespaceOf(it->second) != ns) continue;
    snapshot.items.push_back(it->second);
  }
  return snapshot;
}

std::vector<std::pair<std::string, nlohmann::json>> Store::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const auto& [resource, objects] : objects_) {
    for (const auto& [key, object] : objects) out.emplace_back(resource, object);
  }
  return out;
}

nlohmann::json Store::create(const std::string& resource, nlohmann::json object) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++version_;
  object["metadata"]["resourceVersion"] = std::to_string(version_);
  objects_[resource][objectKey(object)] = object;
  record({version_, resource, "ADDED", object, nullptr});
  return object;
}

nlohmann::json Store::update(const std::string& resource, nlohmann::json object) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++version_;
  object["metadata"]["resourceVersion"] = std::to_string(version_);
  nlohmann::json& slot = objects_[resource][objectKey(object)];
  nlohmann::json old = slot;
  slot = object;
  record({version_, resource, old.is_null() ? "ADDED" : "MODIFIED", object, old});
  return object;
}

std::optional<nlohmann::json> Store::remove(const std::string& resource, const std::string& ns,
                                            const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto objects = objects_.find(resource);
  if (objects == objects_.end()) return std::nullopt;
  auto it = objects->second.find(ns + "/" + name);
  if (it == objects->second.end()) return std::nullopt;
  nlohmann::json object = std::move(it->second);
  objects->second.erase(it);
  ++version_;
  object["metadata"]["resourceVersion"] = std::to_string(version_);
  record({version_, resource, "DELETED", object, object});
  return object;
}

void Store::record(Change change) {
  for (const auto& watcher : watchers_) {
    if (!watcher->closed_) deliver(*watcher, change);
  }
  history_.push_back(std::move(change));
  while (history_.size() > kMaxHistory) {
    compacted_ = history_.front().version;
    history_.pop_front();
  }
  changed_.notify_all();
}

// An object moving into the selection is ADDED, out of it DELETED (with its
// new state), as the API's watch cache reports.
void Store::deliver(Watcher& watcher, const Change& change) {
  if (change.resource != watcher.resource_) return;
  bool now = change.type != "DELETED" && watcher.matches_(change.object);
  bool before = !change.old_object.is_null() && watcher.matches_(change.old_object);
  std::string type;
  if (change.type == "DELETED") {
    if (before) type = "DELETED";
  } else if (now && before) {
    type = "MODIFIED";
  } else if (now) {
    type = "ADDED";
  } else if (before) {
    type = "DELETED";
  }
  if (type.empty()) return;
  watcher.events_.push_back({{"type", type}, {"object", change.object}});
}

std::shared_ptr<Watcher> Store::watch(const std::string& resource,
                                      std::function<bool(const nlohmann::json&)> matches,
                                      std::optional<uint64_t> from, bool initial_events_end) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto watcher = std::make_shared<Watcher>();
  watcher->resource_ = resource;
  watcher->matches_ = std::move(matches);
  if (from) {
    if (*from < compacted_) return nullptr;
    for (const Change& change : history_) {
      if (change.version > *from) deliver(*watcher, change);
    }
  } else {
    auto objects = objects_.find(resource);
    if (objects != objects_.end()) {
      for (const auto& [key, object] : objects->second) {
        if (watcher->matches_(object)) {
          watcher->events_.push_back({{"type", "ADDED"}, {"object", object}});
        }
      }
    }
    if (initial_events_end) {
      // The streaming list's end marker (sendInitialEvents): a bookmark at the
      // snapshot's version, annotated k8s.io/initial-events-end.
      nlohmann::json bookmark = {{"type", "BOOKMARK"}};
      bookmark["object"]["metadata"]["resourceVersion"] = std::to_string(version_);
      bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] = "true";
      watcher->events_.push_back(std::move(bookmark));
    }
  }
  watchers_.push_back(watcher);
  return watcher;
}

Watcher::Next Store::next(Watcher& watcher, std::chrono::steady_clock::time_point deadline,
                          nlohmann::json& event, uint64_t& version) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_until(lock, deadline, [&] { return !watcher.events_.empty() || watcher.closed_; });
  if (!watcher.events_.empty()) {
    event = std::move(watcher.events_.front());
    watcher.events_.pop_front();
    return Watcher::Next::kEvent;
  }
  if (watcher.closed_) return watcher.expired_ ? Watcher::Next::kExpired : Watcher::Next::kClosed;
  version = version_;
  return Watcher::Next::kIdle;
}

void Store::unwatch(const std::shared_ptr<Watcher>& watcher) {
  std::lock_guard<std::mutex> lock(mutex_);
  watchers_.erase(std::remove(watchers_.begin(), watchers_.end(), watcher), watchers_.end());
}

void Store::wakeAll() { changed_.notify_all(); }

void Store::endWatches(bool expired) {
  for (const auto& watcher : watchers_) {
    watcher->closed_ = true;
    watcher->expired_ = expired;
    watcher->events_.clear();
  }
  watchers_.clear();
  changed_.notify_all();
}

void Store::compact() {
  std::lock_guard<std::mutex> lock(mutex_);
  history_.clear();
  compacted_ = version_;
  endWatches(/*expired=*/true);
}

void Store::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_.clear();
  history_.clear();
  version_ = 1;
  compacted_ = 0;
  endWatches(/*expired=*/false);
}

void Store::closeWatches() {
  std::lock_guard<std::mutex> lock(mutex_);
  endWatches(/*expired=*/false);
}

}  // namespace tandem::testing
