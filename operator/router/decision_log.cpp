#include "operator/router/decision_log.h"

namespace tandem::router {
namespace {

const char* kindName(Decision::Kind kind) {
  switch (kind) {
    case Decision::Kind::kDisaggregated:
      return "disaggregated";
    case Decision::Kind::kLocalPrefill:
      return "local_prefill";
    case Decision::Kind::kNone:
      return "none";
  }
  return "none";
}

nlohmann::json entryOf(const DecisionInput& input, const Decision& decision, const char* policy,
                       uint64_t sequence) {
  nlohmann::json entry = {{"sequence", sequence},
                          {"policy", policy},
                          {"prompt_tokens", input.num_prompt_tokens},
                          {"max_tokens", input.max_tokens},
                          {"kind", kindName(decision.kind)},
                          {"pull_back", decision.pull_back},
                          {"affinity", decision.affinity},
                          {"spilled", decision.spilled},
                          {"overlap_ratio", decision.overlap_ratio},
                          {"predicted_ttft_s", decision.predicted_ttft_s},
                          {"observed_prefill_s", nullptr},
                          {"observed_ttft_s", nullptr}};
  entry["prefill_agent"] =
      decision.prefill ? nlohmann::json(input.prefill[*decision.prefill].name) : nullptr;
  entry["decode_agent"] =
      decision.decode ? nlohmann::json(input.decode[*decision.decode].name) : nullptr;
  // Who lent the prefix the prefilling agent read (pull-back).
  entry["lender"] = nullptr;
  if (decision.lending_prefill) {
    entry["lender"] = input.prefill[*decision.lending_prefill].name;
  } else if (decision.lending_decode) {
    entry["lender"] = input.decode[*decision.lending_decode].name;
  }
  nlohmann::json candidates = nlohmann::json::array();
  for (const CandidateCost& c : decision.candidates) {
    candidates.push_back({{"agent", c.agent},
                          {"role", c.prefill ? "prefill" : "decode"},
                          {"cost", c.cost},
                          {"queue_s", c.queue_s},
                          {"compute_s", c.compute_s},
                          {"transfer_s", c.transfer_s},
                          {"step_s", c.step_s},
                          {"leading_blocks", c.leading_blocks},
                          {"reserved_requests", c.reserved_requests},
                          {"external_requests", c.external_requests}});
  }
  entry["candidates"] = std::move(candidates);
  return entry;
}

}  // namespace

uint64_t DecisionLog::record(const DecisionInput& input, const Decision& decision,
                             const char* policy) {
  if (capacity_ == 0) return 0;
  nlohmann::json entry = entryOf(input, decision, policy, 0);
  std::lock_guard<std::mutex> lock(mutex_);
  entry["sequence"] = ++sequence_;
  entries_.push_back(std::move(entry));
  while (entries_.size() > capacity_) entries_.pop_front();
  return sequence_;
}

void DecisionLog::observe(uint64_t sequence, const char* field, double seconds) {
  if (sequence == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Entries are in sequence order without gaps: the wanted one is found by
  // its distance from the newest.
  if (entries_.empty() || sequence > sequence_ || sequence_ - sequence >= entries_.size()) return;
  entries_[entries_.size() - 1 - (sequence_ - sequence)][field] = seconds;
}

nlohmann::json DecisionLog::recent(size_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json out = nlohmann::json::array();
  const size_t first = entries_.size() > n ? entries_.size() - n : 0;
  for (size_t i = first; i < entries_.size(); ++i) out.push_back(entries_[i]);
  return out;
}

}  // namespace tandem::router
