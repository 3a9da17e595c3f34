// The router's recent decisions, for GET /debug/decisions?n=N: per request
// the prompt and output sizes, the decision (kind, agents, pull-back,
// spill, predicted TTFT) and every candidate's cost terms. A fixed-size
// ring; thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>

#include "operator/router/policy.h"

namespace tandem::router {

class DecisionLog {
 public:
  explicit DecisionLog(size_t capacity) : capacity_(capacity) {}

  // Keeps the decision (the oldest is dropped past the capacity); returns
  // its sequence number (0 when the log is off).
  uint64_t record(const DecisionInput& input, const Decision& decision, const char* policy);
  // Adds what happened to a kept decision: `field` ("observed_ttft_s",
  // "observed_prefill_s") set to `seconds`.
  void observe(uint64_t sequence, const char* field, double seconds);
  // The last min(n, kept) decisions, oldest first.
  nlohmann::json recent(size_t n) const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<nlohmann::json> entries_;
  uint64_t sequence_ = 0;
};

}  // namespace tandem::router
