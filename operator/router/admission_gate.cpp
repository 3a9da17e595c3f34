#include "operator/router/admission_gate.h"

#include <algorithm>

namespace tandem::router {

AdmissionGate::Entry AdmissionGate::enter(const WaiterPtr& waiter) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return Entry::kRefused;
  if (inflight_ < max_inflight_ && waiters_.empty()) {
    inflight_ += 1;
    return Entry::kAdmitted;
  }
  if (static_cast<int64_t>(waiters_.size()) >= max_queued_) return Entry::kRefused;
  waiters_.push_back(waiter);
  return Entry::kQueued;
}

bool AdmissionGate::granted(const WaiterPtr& waiter) {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiter->granted;
}

bool AdmissionGate::cancel(const WaiterPtr& waiter) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find(waiters_.begin(), waiters_.end(), waiter);
  if (it != waiters_.end()) waiters_.erase(it);
  return !waiter->granted;
}

void AdmissionGate::leave() {
  WaiterPtr next;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (waiters_.empty()) {
      inflight_ -= 1;
      return;
    }
    // The slot passes to the first waiter: inflight_ stays.
    next = std::move(waiters_.front());
    waiters_.pop_front();
    next->granted = true;
  }
  next->wake();
}

void AdmissionGate::close() {
  std::deque<WaiterPtr> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    dropped.swap(waiters_);
  }
  for (const WaiterPtr& waiter : dropped) waiter->wake();
}

int64_t AdmissionGate::inflight() {
  std::lock_guard<std::mutex> lock(mutex_);
  return inflight_;
}

int64_t AdmissionGate::queued() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(waiters_.size());
}

}  // namespace tandem::router
