// A work queue of keys ("namespace/name"), as client-go's rate-limited
// workqueue: a key added many times before a worker takes it is processed
// once; a key being processed that is added again is processed once more
// after done(); a key is never processed by two workers at once.
// addAfter() makes a key ready once its delay has passed (a key delayed twice
// keeps the earlier time). addRateLimited() delays a key by a per-key
// exponential backoff (jittered, from `initial` doubling to `max`) until
// forget() resets it.
//
// Thread-safe. get() blocks until a key is ready or shutDown(); after
// shutDown() get() returns std::nullopt and add() does nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace tandem::k8s {

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkQueue(std::chrono::milliseconds initial_backoff = std::chrono::milliseconds(5),
                     std::chrono::milliseconds max_backoff = std::chrono::seconds(60));

  void add(const std::string& key);
  void addAfter(const std::string& key, std::chrono::milliseconds delay);
  void addRateLimited(const std::string& key);
  void forget(const std::string& key);
  // How many times addRateLimited() was called for `key` since the last forget().
  int retries(const std::string& key) const;

  // The next key to process, or std::nullopt once shut down. The caller must
  // call done(key) when it has finished with it.
  std::optional<std::string> get();
  void done(const std::string& key);
  void shutDown();
  bool isShuttingDown() const;

  // Keys waiting (ready now or delayed), for the queue-depth metric.
  size_t depth() const;

 private:
  // Requires mutex_. Marks `key` dirty and makes it ready unless a worker holds it.
  void addLocked(const std::string& key);
  // Requires mutex_. Moves every delayed key whose time has come to ready_.
  void promoteDueLocked(Clock::time_point now);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::chrono::milliseconds initial_backoff_;
  std::chrono::milliseconds max_backoff_;
  std::deque<std::string> ready_;
  std::set<std::string> queued_;      // waiting to be processed (dirty): in ready_ or held
  std::set<std::string> processing_;  // taken by a worker
  std::multimap<Clock::time_point, std::string> delayed_;
  std::map<std::string, Clock::time_point> delayed_due_;  // key -> its entry in delayed_
  std::map<std::string, int> failures_;
  bool shut_down_ = false;
};

}  // namespace tandem::k8s
