// The per-render budgets of the Jinja engine (template.h's Limits): work
// steps, wall-clock time, cancellation, live memory and value nesting.
//
// One RenderBudget serves one render on one thread. While it lives it is that
// thread's current budget, so value construction and the data primitives
// (comparison, printing, search, copying) charge it wherever they run without
// being handed it; outside a render (parsing, tests of internals) nothing is
// charged and nothing fails. Values made during a render must not outlive its
// budget: they release their bytes to it when freed.
//
// Counting a step is an increment and a compare; the clock and the cancel
// flag are read every kPollInterval steps. Exceeding a bound throws a
// RenderFailure of kind kLimit naming it; a set cancel flag, one of kind
// kCancelled.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>

#include "common/jinja/template.h"

namespace tandem::jinja {

class RenderBudget;

namespace detail {
inline thread_local RenderBudget* t_current_budget = nullptr;
}  // namespace detail

class RenderBudget {
 public:
  static constexpr uint64_t kPollInterval = 4096;

  // Becomes the calling thread's current budget until destroyed.
  explicit RenderBudget(const RenderOptions& options);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // The calling thread's budget; null outside a render.
  static RenderBudget* current() { return detail::t_current_budget; }

  // One unit of work.
  void step() {
    if (++steps_ >= next_poll_) poll();
  }
  // `n` units of work at once.
  void steps(uint64_t n) {
    steps_ += n;
    if (steps_ >= next_poll_) poll();
  }

  // Throws (limit max_memory_bytes) unless `bytes` more fit, once the
  // reclaim function has freed what it can; charges nothing.
  void reserve(size_t bytes) {
    if (bytes > limits_.max_memory_bytes - live_bytes_) reclaimOrFail(bytes);
  }
  // Called when memory runs short: frees what the render can no longer
  // reach (garbage the evaluator keeps for a while), then memory is
  // checked again.
  void setReclaim(std::function<void()> reclaim) { reclaim_ = std::move(reclaim); }
  // Reserves, then counts `bytes` as live until released.
  void charge(size_t bytes) {
    reserve(bytes);
    live_bytes_ += bytes;
  }
  void release(size_t bytes) noexcept { live_bytes_ -= bytes; }

  // Throws kCancelled when the cancel flag is set.
  void checkCancelled() const;

  const Limits& limits() const { return limits_; }
  uint64_t stepsTaken() const { return steps_; }
  size_t liveBytes() const { return live_bytes_; }

 private:
  void poll();
  void reclaimOrFail(size_t bytes);
  [[noreturn]] void failMemory() const;

  Limits limits_;
  const std::atomic<bool>* cancel_;
  std::chrono::steady_clock::time_point start_;
  uint64_t steps_ = 0;
  uint64_t next_poll_ = 0;
  size_t live_bytes_ = 0;
  std::function<void()> reclaim_;
  bool reclaiming_ = false;
  RenderBudget* previous_;
};

// Helpers acting on the current budget; no-ops outside a render.
inline void chargeSteps(uint64_t n) {
  if (RenderBudget* b = RenderBudget::current()) b->steps(n);
}
// Steps for handling `bytes` of text (one per 64 bytes, at least one).
inline void chargeTextWork(size_t bytes) { chargeSteps(1 + bytes / 64); }
inline void reserveBytes(size_t bytes) {
  if (RenderBudget* b = RenderBudget::current()) b->reserve(bytes);
}
// Before building a string of `bytes`: throws (limit max_output_bytes) when
// it is longer than any string may be, or (limit max_memory_bytes) when it
// does not fit.
void reserveString(size_t bytes);
// Throws (limit max_value_depth) when a value `depth` levels deep is not allowed.
void checkValueDepth(size_t depth);
// The nesting bound in force (Limits' default outside a render).
size_t maxValueDepth();

// a * b, or SIZE_MAX when that overflows (sizes computed before allocating).
inline size_t saturatingMul(size_t a, size_t b) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a) {
    return std::numeric_limits<size_t>::max();
  }
  return a * b;
}
inline size_t saturatingAdd(size_t a, size_t b) {
  return b > std::numeric_limits<size_t>::max() - a ? std::numeric_limits<size_t>::max() : a + b;
}

}  // namespace tandem::jinja
