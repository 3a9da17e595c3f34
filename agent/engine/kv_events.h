// KV cache events: what an agent tells routers about the blocks it caches.
//
// The block manager appends one event whenever the set of block hashes an
// agent can serve from its prefix cache changes: BlockStored (hashes became
// matchable), BlockRemoved (hashes were evicted or invalidated), AllCleared
// (the whole cache was dropped). Replaying the events in order from an empty
// set gives exactly the manager's cachedHashes(). Each event gets a sequence
// number, starting at 1 and increasing by one per event.
//
// KvEventLog keeps the most recent `capacity` events in a ring buffer for
// readers that poll (eventsSince) and pushes each event to subscribers.
// Thread-safety: every method may be called from any thread; appends come
// from the engine thread and readers are HTTP threads. Subscriber callbacks
// run on the appending thread, in sequence order, one at a time; they must be
// quick and must not subscribe, unsubscribe or append (that deadlocks).
// Destroying a Subscription waits for a callback in flight to return, so the
// callback's captures may be destroyed right after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>
#include <vector>

#include "common/block_hash.h"

namespace tandem::engine {

// Full blocks became matchable. block_hashes is a chain: each block's parent
// is the one before it, the first one's is parent_block_hash (none for the
// first block of a sequence).
struct BlockStored {
  std::vector<BlockHash> block_hashes;
  std::optional<BlockHash> parent_block_hash;
  int64_t num_tokens = 0;  // block_hashes.size() * block_size
  int32_t block_size = 0;
};

// These hashes are no longer matchable on this agent.
struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
};

// Nothing is cached any more.
struct AllCleared {};

using KvEventData = std::variant<BlockStored, BlockRemoved, AllCleared>;

struct KvEvent {
  uint64_t sequence = 0;
  KvEventData data;
};

// {"sequence": 7, "type": "BlockStored", "block_hashes": ["<32 hex>", ...],
//  "parent_block_hash": "<32 hex>" | null, "num_tokens": 32, "block_size": 16}
// BlockRemoved has "sequence", "type", "block_hashes"; AllCleared "sequence"
// and "type".
nlohmann::json toJson(const KvEvent& event);
const char* kvEventTypeName(const KvEventData& data);

// One answer of eventsSince().
struct KvEventPage {
  // Events with sequence > `after`, ascending and consecutive, at most `max`.
  std::vector<KvEvent> events;
  // True when the reader cannot catch up from events: some events after
  // `after` were already dropped from the ring, or `after` is beyond the
  // newest event (the log was restarted). The reader takes a snapshot of the
  // cache and continues from the sequence number it was taken at.
  bool needs_snapshot = false;
  // The newest sequence number appended so far (0: none yet).
  uint64_t last_sequence = 0;
};

class KvEventLog {
 private:
  struct SubscriberRegistry;

 public:
  using Callback = std::function<void(const KvEvent&)>;

  // Unsubscribes when destroyed or reset. Move-only; may outlive the log.
  class Subscription {
   public:
    Subscription() = default;
    ~Subscription() { reset(); }
    Subscription(Subscription&& other) noexcept;
    Subscription& operator=(Subscription&& other) noexcept;
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

    void reset();
    bool active() const { return registry_ != nullptr; }
    // The newest sequence when subscribing: the callback sees exactly the
    // events after it, so a reader can fetch older ones with eventsSince.
    uint64_t startSequence() const { return start_sequence_; }

   private:
    friend class KvEventLog;
    Subscription(std::shared_ptr<SubscriberRegistry> registry, uint64_t id, uint64_t start)
        : registry_(std::move(registry)), id_(id), start_sequence_(start) {}

    std::shared_ptr<SubscriberRegistry> registry_;
    uint64_t id_ = 0;
    uint64_t start_sequence_ = 0;
  };

  static constexpr size_t kDefaultCapacity = 16384;

  // Throws tandem::Error when capacity is 0 (start-up code).
  explicit KvEventLog(size_t capacity = kDefaultCapacity);
  ~KvEventLog();
  KvEventLog(const KvEventLog&) = delete;
  KvEventLog& operator=(const KvEventLog&) = delete;

  // Numbers the event, retains it (dropping the oldest past capacity) and
  // delivers it to subscribers before returning. Returns its sequence.
  uint64_t append(KvEventData data);

  // Up to `max` events with sequence > after. after = 0 reads from the start.
  KvEventPage eventsSince(uint64_t after, size_t max) const;

  uint64_t lastSequence() const;
  size_t capacity() const { return capacity_; }

  // `callback` sees every event appended from now on (sequence > the
  // returned startSequence()).
  Subscription subscribe(Callback callback);

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;  // guards ring_ and last_sequence_
  std::deque<KvEvent> ring_;
  uint64_t last_sequence_ = 0;
  std::shared_ptr<SubscriberRegistry> subscribers_;
};

}  // namespace tandem::engine
