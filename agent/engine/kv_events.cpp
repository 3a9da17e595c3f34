#include "agent/engine/kv_events.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace tandem::engine {

// Held by the log and by every Subscription, so either may go first. Its
// mutex is held while callbacks run, which both orders deliveries and lets
// unsubscribe wait for a callback in flight.
struct KvEventLog::SubscriberRegistry {
  std::mutex mutex;
  uint64_t next_id = 1;
  std::vector<std::pair<uint64_t, Callback>> callbacks;
};

namespace {

nlohmann::json hashesToJson(const std::vector<BlockHash>& hashes) {
  nlohmann::json out = nlohmann::json::array();
  for (const BlockHash& hash : hashes) out.push_back(hash.toHex());
  return out;
}

}  // namespace

const char* kvEventTypeName(const KvEventData& data) {
  if (std::holds_alternative<BlockStored>(data)) return "BlockStored";
  if (std::holds_alternative<BlockRemoved>(data)) return "BlockRemoved";
  return "AllCleared";
}

nlohmann::json toJson(const KvEvent& event) {
  nlohmann::json out;
  out["sequence"] = event.sequence;
  out["type"] = kvEventTypeName(event.data);
  if (const auto* stored = std::get_if<BlockStored>(&event.data)) {
    out["block_hashes"] = hashesToJson(stored->block_hashes);
    out["parent_block_hash"] = stored->parent_block_hash
                                   ? nlohmann::json(stored->parent_block_hash->toHex())
                                   : nlohmann::json(nullptr);
    out["num_tokens"] = stored->num_tokens;
    out["block_size"] = stored->block_size;
  } else if (const auto* removed = std::get_if<BlockRemoved>(&event.data)) {
    out["block_hashes"] = hashesToJson(removed->block_hashes);
  }
  return out;
}

KvEventLog::Subscription::Subscription(Subscription&& other) noexcept
    : registry_(std::move(other.registry_)),
      id_(other.id_),
      start_sequence_(other.start_sequence_) {
  other.id_ = 0;
}

KvEventLog::Subscription& KvEventLog::Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    reset();
    registry_ = std::move(other.registry_);
    id_ = other.id_;
    start_sequence_ = other.start_sequence_;
    other.id_ = 0;
  }
  return *this;
}

void KvEventLog::Subscription::reset() {
  if (registry_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    auto& callbacks = registry_->callbacks;
    for (auto it = callbacks.begin(); it != callbacks.end(); ++it) {
      if (it->first == id_) {
        callbacks.erase(it);
        break;
      }
    }
  }
  registry_.reset();
  id_ = 0;
}

KvEventLog::KvEventLog(size_t capacity)
    : capacity_(capacity), subscribers_(std::make_shared<SubscriberRegistry>()) {
  if (capacity_ == 0) throw Error("KV event log capacity must be at least 1, got 0");
}

KvEventLog::~KvEventLog() = default;

uint64_t KvEventLog::append(KvEventData data) {
  // Held across numbering and delivery so that subscribers see events in
  // sequence order even if two threads append.
  std::lock_guard<std::mutex> delivery(subscribers_->mutex);
  KvEvent event{0, std::move(data)};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    event.sequence = ++last_sequence_;
    ring_.push_back(event);
    if (ring_.size() > capacity_) ring_.pop_front();
  }
  for (const auto& [id, callback] : subscribers_->callbacks) callback(event);
  return event.sequence;
}

KvEventPage KvEventLog::eventsSince(uint64_t after, size_t max) const {
  KvEventPage page;
  std::lock_guard<std::mutex> lock(mutex_);
  page.last_sequence = last_sequence_;
  if (after > last_sequence_) {
    page.needs_snapshot = true;
    return page;
  }
  if (ring_.empty()) return page;
  const uint64_t oldest = ring_.front().sequence;
  if (after + 1 < oldest) {
    page.needs_snapshot = true;
    return page;
  }
  // The ring holds consecutive sequences oldest..last_sequence_.
  const size_t first = static_cast<size_t>(after + 1 - oldest);
  const size_t count = std::min(max, ring_.size() - first);
  page.events.reserve(count);
  for (size_t i = 0; i < count; ++i) page.events.push_back(ring_[first + i]);
  return page;
}

uint64_t KvEventLog::lastSequence() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_sequence_;
}

KvEventLog::Subscription KvEventLog::subscribe(Callback callback) {
  TANDEM_CHECK(callback != nullptr, "subscribe needs a callback");
  std::lock_guard<std::mutex> lock(subscribers_->mutex);
  const uint64_t id = subscribers_->next_id++;
  subscribers_->callbacks.emplace_back(id, std::move(callback));
  // Appends wait for the registry lock, so no event can slip between this
  // read and the registration.
  return Subscription(subscribers_, id, lastSequence());
}

}  // namespace tandem::engine
