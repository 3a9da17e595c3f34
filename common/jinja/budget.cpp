// The per-render budgets (see budget.h).
#include "common/jinja/budget.h"

#include <string>

#include "common/jinja/value.h"

namespace tandem::jinja {

RenderBudget::RenderBudget(const RenderOptions& options)
    : limits_(options.limits),
      cancel_(options.cancel),
      start_(std::chrono::steady_clock::now()),
      previous_(detail::t_current_budget) {
  next_poll_ = limits_.max_steps < kPollInterval ? limits_.max_steps + 1 : kPollInterval;
  detail::t_current_budget = this;
}

RenderBudget::~RenderBudget() { detail::t_current_budget = previous_; }

void RenderBudget::poll() {
  if (steps_ > limits_.max_steps) {
    failLimit("template rendering exceeded its work budget of " +
              std::to_string(limits_.max_steps) + " steps (limit max_steps)");
  }
  checkCancelled();
  if (std::chrono::steady_clock::now() - start_ > limits_.max_render_time) {
    failLimit("template rendering exceeded its time budget of " +
              std::to_string(limits_.max_render_time.count()) + " ms (limit max_render_time)");
  }
  // The next poll comes kPollInterval steps on, or just past max_steps.
  uint64_t room = limits_.max_steps - steps_;
  next_poll_ = steps_ + (room < kPollInterval ? room + 1 : kPollInterval);
}

void RenderBudget::checkCancelled() const {
  if (cancel_ != nullptr && cancel_->load(std::memory_order_acquire)) {
    throw RenderFailure("template rendering was cancelled", TemplateError::Kind::kCancelled);
  }
}

void RenderBudget::reclaimOrFail(size_t bytes) {
  if (reclaim_ && !reclaiming_) {
    reclaiming_ = true;
    try {
      reclaim_();
    } catch (...) {
      reclaiming_ = false;
      throw;
    }
    reclaiming_ = false;
    if (bytes <= limits_.max_memory_bytes - live_bytes_) return;
  }
  failMemory();
}

void RenderBudget::failMemory() const {
  failLimit("template rendering exceeded its memory budget of " +
            std::to_string(limits_.max_memory_bytes) + " bytes (limit max_memory_bytes)");
}

void reserveString(size_t bytes) {
  RenderBudget* b = RenderBudget::current();
  if (b == nullptr) return;
  if (bytes > b->limits().max_output_bytes) {
    failLimit("string exceeds " + std::to_string(b->limits().max_output_bytes) +
              " bytes (limit max_output_bytes)");
  }
  b->reserve(bytes);
  b->steps(bytes / 64);
}

size_t maxValueDepth() {
  if (RenderBudget* b = RenderBudget::current()) return b->limits().max_value_depth;
  return Limits{}.max_value_depth;
}

void checkValueDepth(size_t depth) {
  size_t max = maxValueDepth();
  if (depth > max) {
    failLimit("a value is nested more than " + std::to_string(max) +
              " levels deep (limit max_value_depth)");
  }
}

}  // namespace tandem::jinja
