#include "operator/k8s/work_queue.h"

#include "operator/k8s/api_client.h"

namespace tandem::k8s {

WorkQueue::WorkQueue(std::chrono::milliseconds initial_backoff,
                     std::chrono::milliseconds max_backoff)
    : initial_backoff_(initial_backoff), max_backoff_(max_backoff) {}

void WorkQueue::addLocked(const std::string& key) {
  if (shut_down_ || queued_.count(key) > 0) return;
  queued_.insert(key);
  // A key a worker holds goes back to ready_ at done(), so no two workers share it.
  if (processing_.count(key) > 0) return;
  ready_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::promoteDueLocked(Clock::time_point now) {
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    delayed_due_.erase(key);
    addLocked(key);
  }
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  addLocked(key);
}

void WorkQueue::addAfter(const std::string& key, std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_) return;
  if (delay <= std::chrono::milliseconds::zero()) {
    addLocked(key);
    return;
  }
  Clock::time_point due = Clock::now() + delay;
  auto existing = delayed_due_.find(key);
  if (existing != delayed_due_.end()) {
    if (existing->second <= due) return;  // already due sooner
    auto range = delayed_.equal_range(existing->second);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == key) {
        delayed_.erase(it);
        break;
      }
    }
  }
  delayed_.emplace(due, key);
  delayed_due_[key] = due;
  // Waiting workers recompute how long to sleep.
  cv_.notify_all();
}

void WorkQueue::addRateLimited(const std::string& key) {
  std::chrono::milliseconds delay;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    int attempt = failures_[key]++;
    delay = backoffDelay(attempt, initial_backoff_, max_backoff_);
  }
  addAfter(key, delay);
}

void WorkQueue::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  failures_.erase(key);
}

int WorkQueue::retries(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

std::optional<std::string> WorkQueue::get() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (shut_down_) return std::nullopt;
    promoteDueLocked(Clock::now());
    if (!ready_.empty()) {
      std::string key = std::move(ready_.front());
      ready_.pop_front();
      queued_.erase(key);
      processing_.insert(key);
      return key;
    }
    if (delayed_.empty()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, delayed_.begin()->first);
    }
  }
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  processing_.erase(key);
  // Added again while it was being processed: process it once more.
  if (!shut_down_ && queued_.count(key) > 0) {
    ready_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::shutDown() {
  std::lock_guard<std::mutex> lock(mutex_);
  shut_down_ = true;
  cv_.notify_all();
}

bool WorkQueue::isShuttingDown() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shut_down_;
}

size_t WorkQueue::depth() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // queued_ holds the ready keys and those re-added while a worker holds them.
  return queued_.size() + delayed_.size();
}

}  // namespace tandem::k8s
