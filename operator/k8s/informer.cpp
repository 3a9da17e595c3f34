#include "operator/k8s/informer.h"

#include <condition_variable>
#include <exception>

#include "common/logging.h"

namespace tandem::k8s {
namespace {

// Backoff of failed lists and watches (client-go's reflector uses 800 ms to 30 s).
constexpr std::chrono::milliseconds kInitialBackoff(500);
constexpr std::chrono::milliseconds kMaxBackoff(30000);

std::string stringField(const nlohmann::json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const nlohmann::json& metadataOf(const nlohmann::json& object) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  if (!object.is_object()) return kEmpty;
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string resourceVersionOf(const nlohmann::json& object) {
  return stringField(metadataOf(object), "resourceVersion");
}

}  // namespace

std::string objectKey(const nlohmann::json& object) {
  const nlohmann::json& metadata = metadataOf(object);
  std::string ns = stringField(metadata, "namespace");
  std::string name = stringField(metadata, "name");
  return ns.empty() ? name : ns + "/" + name;
}

// The informer's thread: list, then watch until stopped, as described in informer.h.
class Informer::Loop {
 public:
  explicit Loop(Informer& informer) : informer_(informer) {}

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      if (stream_ != nullptr) stream_->cancel();
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  enum class WatchEnd { kClosed, kGone, kFailed };

  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  }

  // Sleeps the backoff of the `failures`th consecutive failure, or less when stopped.
  void backOff(int failures) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, backoffDelay(failures, kInitialBackoff, kMaxBackoff),
                 [this] { return stopping_; });
  }

  // Lists every page and applies the result to the cache; false on error.
  bool relist(std::string& resource_version) {
    ListOptions options;
    options.label_selector = informer_.options_.label_selector;
    options.limit = informer_.options_.list_page_size;
    Result<nlohmann::json> listed =
        informer_.client_.list(informer_.type_, informer_.options_.ns, options);
    if (!listed.isOk()) {
      TANDEM_LOG(kWarn) << "informer " << informer_.type_.plural
                        << ": list failed: " << listed.error().toString();
      return false;
    }
    std::vector<nlohmann::json> items;
    auto found = listed->find("items");
    if (found != listed->end() && found->is_array()) {
      items.reserve(found->size());
      for (auto& item : *found) items.push_back(std::move(item));
    }
    resource_version = resourceVersionOf(*listed);
    for (const auto& [type, object] : informer_.replaceCache(std::move(items))) {
      informer_.callHandler(type, object);
    }
    return true;
  }

  // Reads one watch stream to its end; `resource_version` follows the events.
  WatchEnd consume(WatchStream& stream, std::string& resource_version, bool& got_events) {
    while (true) {
      Result<std::optional<WatchEvent>> next = stream.next();
      if (!next.isOk()) {
        if (next.error().isGone() || next.error().isResourceVersionTooLarge()) {
          return WatchEnd::kGone;
        }
        if (!stopping()) {
          TANDEM_LOG(kWarn) << "informer " << informer_.type_.plural
                            << ": watch failed: " << next.error().toString();
        }
        return WatchEnd::kFailed;
      }
      if (!next->has_value()) return WatchEnd::kClosed;
      WatchEvent& event = **next;
      if (event.type == "ERROR") {
        ApiError error;
        if (event.object.is_object()) {
          error.code = event.object.value("code", 0);
          error.reason = stringField(event.object, "reason");
          error.message = stringField(event.object, "message");
        }
        if (error.isGone() || error.isResourceVersionTooLarge()) return WatchEnd::kGone;
        TANDEM_LOG(kWarn) << "informer " << informer_.type_.plural
                          << ": watch error event: " << error.toString();
        return WatchEnd::kFailed;
      }
      // Progress: an event other than an error (bookmarks included).
      got_events = true;
      std::string version = resourceVersionOf(event.object);
      if (!version.empty()) resource_version = version;
      if (event.type == "BOOKMARK") continue;
      if (event.type == "ADDED" || event.type == "MODIFIED" || event.type == "DELETED") {
        informer_.applyEvent(event.type, std::move(event.object));
      } else {
        TANDEM_LOG(kWarn) << "informer " << informer_.type_.plural
                          << ": ignoring watch event of unknown type " << event.type;
      }
    }
  }

  void run() {
    std::string resource_version;
    bool need_list = true;
    int failures = 0;
    // 410s in a row with no event between: the first relists at once (a
    // compacted history), the next ones back off as failures do, so a
    // server that keeps answering 410 is not listed in a loop.
    int gone_streak = 0;
    auto gone = [&] {
      need_list = true;
      informer_.relists_++;
      if (gone_streak > 0) backOff(gone_streak - 1);
      ++gone_streak;
    };
    while (!stopping()) {
      if (need_list) {
        if (!relist(resource_version)) {
          backOff(failures++);
          continue;
        }
        informer_.markSynced();
        need_list = false;
        failures = 0;
      }

      WatchOptions options;
      options.label_selector = informer_.options_.label_selector;
      options.resource_version = resource_version;
      options.timeout_seconds = informer_.options_.watch_timeout_seconds;
      options.allow_bookmarks = true;
      Result<std::unique_ptr<WatchStream>> opened =
          informer_.client_.watch(informer_.type_, informer_.options_.ns, options);
      if (!opened.isOk()) {
        if (opened.error().isGone() || opened.error().isResourceVersionTooLarge()) {
          gone();
          continue;
        }
        TANDEM_LOG(kWarn) << "informer " << informer_.type_.plural
                          << ": watch failed: " << opened.error().toString();
        backOff(failures++);
        continue;
      }
      std::unique_ptr<WatchStream> stream = std::move(opened).value();
      {
        // stop() cancels the stream registered here, from its own thread.
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) break;
        stream_ = stream.get();
      }
      bool got_events = false;
      WatchEnd end = consume(*stream, resource_version, got_events);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stream_ = nullptr;
      }
      if (stopping()) break;
      if (got_events) failures = gone_streak = 0;
      switch (end) {
        case WatchEnd::kClosed:
          informer_.watch_restarts_++;
          // A watch that ends before any event (not even a bookmark) is
          // treated as a failure, so a server that closes at once is not hammered.
          if (!got_events) backOff(failures++);
          break;
        case WatchEnd::kGone:
          gone();
          break;
        case WatchEnd::kFailed:
          backOff(failures++);
          break;
      }
    }
  }

  Informer& informer_;
  std::mutex mutex_;  // guards stopping_ and stream_
  std::condition_variable cv_;
  bool stopping_ = false;
  WatchStream* stream_ = nullptr;
  std::thread thread_;
};

Informer::Informer(ApiClient& client, ResourceType type, InformerOptions options, Handler handler)
    : client_(client),
      type_(std::move(type)),
      options_(std::move(options)),
      handler_(std::move(handler)) {}

Informer::~Informer() { stop(); }

void Informer::start() {
  if (loop_ != nullptr) return;
  loop_ = std::make_unique<Loop>(*this);
  loop_->start();
}

void Informer::stop() {
  if (loop_ != nullptr) loop_->stop();
}

bool Informer::waitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return sync_cv_.wait_for(lock, timeout, [this] { return synced_.load(); });
}

std::optional<nlohmann::json> Informer::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

std::vector<nlohmann::json> Informer::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<nlohmann::json> objects;
  objects.reserve(cache_.size());
  for (const auto& [key, object] : cache_) objects.push_back(object);
  return objects;
}

std::vector<std::pair<EventType, nlohmann::json>> Informer::replaceCache(
    std::vector<nlohmann::json> items) {
  std::map<std::string, nlohmann::json> fresh;
  for (auto& item : items) {
    if (!item.is_object()) continue;
    // List items of built-in kinds come without apiVersion and kind.
    if (!item.contains("apiVersion")) item["apiVersion"] = type_.apiVersion();
    if (!item.contains("kind")) item["kind"] = type_.kind;
    std::string key = objectKey(item);
    fresh[key] = std::move(item);
  }
  std::vector<std::pair<EventType, nlohmann::json>> events;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, object] : fresh) {
    auto old = cache_.find(key);
    if (old == cache_.end()) {
      events.emplace_back(EventType::kAdded, object);
    } else if (resourceVersionOf(old->second) != resourceVersionOf(object)) {
      events.emplace_back(EventType::kModified, object);
    }
  }
  for (auto& [key, object] : cache_) {
    // Deleted while no watch was open: the handler gets the last state we knew.
    if (fresh.count(key) == 0) events.emplace_back(EventType::kDeleted, std::move(object));
  }
  cache_.swap(fresh);
  return events;
}

void Informer::applyEvent(const std::string& type, nlohmann::json object) {
  if (!object.is_object()) return;
  if (!object.contains("apiVersion")) object["apiVersion"] = type_.apiVersion();
  if (!object.contains("kind")) object["kind"] = type_.kind;
  std::string key = objectKey(object);
  EventType event_type;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (type == "DELETED") {
      cache_.erase(key);
      event_type = EventType::kDeleted;
    } else {
      // Decided by the cache, as client-go's informer does: an ADDED for a key
      // we hold (a watch restarted from an old version) is a change.
      auto [it, inserted] = cache_.insert_or_assign(key, object);
      event_type = inserted ? EventType::kAdded : EventType::kModified;
    }
  }
  callHandler(event_type, object);
}

void Informer::callHandler(EventType type, const nlohmann::json& object) {
  if (!handler_) return;
  try {
    handler_(type, object);
  } catch (const std::exception& e) {
    TANDEM_LOG(kError) << "informer " << type_.plural << ": handler threw on " << objectKey(object)
                       << ": " << e.what();
  }
}

void Informer::markSynced() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    synced_ = true;
  }
  sync_cv_.notify_all();
}

}  // namespace tandem::k8s
