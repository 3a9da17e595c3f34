// The routing decision, apart from any I/O: given a prompt's block hashes,
// what each agent holds (OwnershipIndex) and each agent's load, which prefill
// and decode agent serve it. Pure functions; see docs/router.md for the
// rules and their weights.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "operator/router/router.h"

namespace tandem::router {

// What the router knows of one agent when it decides.
struct AgentView {
  std::string name;
  bool healthy = true;
  int64_t leading_blocks = 0;         // of this prompt, held (trusted index)
  int64_t running = 0;                // from its /metrics
  int64_t waiting = 0;                // from its /metrics
  double kv_usage = 0;                // from its /metrics
  int64_t inflight = 0;               // requests the router has in flight there
  int64_t queued_prefill_tokens = 0;  // uncached prompt tokens the router sent, not yet answered
};

struct DecisionInput {
  int64_t num_prompt_tokens = 0;
  int32_t block_size = 16;
  std::vector<AgentView> prefill;
  std::vector<AgentView> decode;
};

struct Decision {
  enum class Kind { kDisaggregated, kLocalPrefill, kNone };
  Kind kind = Kind::kNone;
  std::optional<size_t> prefill;  // index into DecisionInput::prefill (disaggregated)
  std::optional<size_t> decode;   // index into DecisionInput::decode
  // The decode agent holds a longer prefix than the prefill agent: lend it.
  bool pull_back = false;
  // Of the prompt's full blocks, the fraction the chosen agents already hold
  // (the larger of the two).
  double overlap_ratio = 0;
};

struct PolicyOptions {
  Policy policy = Policy::kKv;
  int64_t disagg_threshold_tokens = 256;
  bool pull_back = true;
  int64_t pull_back_min_blocks = 4;  // the agents' remote_pull_threshold
};

// Stateful only for round-robin cursors and the random generator.
class Chooser {
 public:
  explicit Chooser(PolicyOptions options, uint64_t seed = 1) : options_(options), random_(seed) {}
  Decision choose(const DecisionInput& input);
  const PolicyOptions& options() const { return options_; }

 private:
  std::optional<size_t> pick(const std::vector<AgentView>& agents, size_t& cursor);

  PolicyOptions options_;
  std::mt19937_64 random_;
  size_t prefill_cursor_ = 0;
  size_t decode_cursor_ = 0;
};

}  // namespace tandem::router
