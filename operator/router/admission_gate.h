// The router's admission gate: at most max_inflight requests hold a slot at
// once, up to max_queued more wait in arrival order, the rest are refused.
// A leaving request hands its slot straight to the first waiter and wakes
// it; a waiter whose client left is dropped from the queue. Plain C++, no
// I/O: the caller supplies how a waiter is woken.
//
// Thread-safe. wake() is called with no lock held, from the thread that
// granted the slot (leave()) or closed the gate (close()).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace tandem::router {

class AdmissionGate {
 public:
  // One request waiting for a slot.
  struct Waiter {
    std::function<void()> wake;  // called once: granted, or the gate closed
    bool granted = false;        // guarded by the gate; read after wake()
  };
  using WaiterPtr = std::shared_ptr<Waiter>;

  enum class Entry { kAdmitted, kQueued, kRefused };

  AdmissionGate(int64_t max_inflight, int64_t max_queued)
      : max_inflight_(max_inflight), max_queued_(max_queued) {}

  // kAdmitted: the caller holds a slot (give it back with leave()).
  // kQueued: `waiter` waits; once woken, granted() says whether it holds a
  // slot. kRefused: the queue is full or the gate is closed.
  Entry enter(const WaiterPtr& waiter);
  // Whether a woken (or cancelled) waiter holds a slot.
  bool granted(const WaiterPtr& waiter);
  // Drops a queued waiter. False when it was granted a slot meanwhile: the
  // caller then holds it and must leave().
  bool cancel(const WaiterPtr& waiter);
  // Gives a slot back: to the first waiter when one waits.
  void leave();
  // Refuses new requests and wakes every waiter ungranted.
  void close();

  int64_t inflight();
  int64_t queued();

 private:
  std::mutex mutex_;
  const int64_t max_inflight_;
  const int64_t max_queued_;
  int64_t inflight_ = 0;
  bool closed_ = false;
  std::deque<WaiterPtr> waiters_;
};

}  // namespace tandem::router
