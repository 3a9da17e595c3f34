// The routing decision, apart from any I/O: given a prompt's block hashes,
// what each agent holds (OwnershipIndex) and each agent's load (the router's
// own ledger, corrected by polled metrics), which prefill and decode agent
// serve it. Pure functions and a seeded generator; see docs/router.md for the
// rules.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "agent/engine/simulation/step_profile.h"
#include "operator/router/router.h"

namespace tandem::router {

// What the router knows of one agent when it decides.
struct AgentView {
  std::string name;
  bool healthy = true;
  int64_t leading_blocks = 0;  // of this prompt, held (trusted index)
  // Polled from the agent's /metrics: up to a poll interval old, and the
  // only view of load this router did not send (other replicas, direct
  // clients).
  int64_t running = 0;
  int64_t waiting = 0;
  double kv_usage = 0;
  // Of running + waiting, what this router's ledger did not hold when it
  // was polled: load another router replica or a direct client sent.
  int64_t external_requests = 0;
  // The router's ledger, updated under the decision's lock (LoadLedger):
  // requests reserved on this agent and not yet ended (a prefill agent: sent
  // and not answered; a decode agent: from the decision to the end of the
  // stream, an abort or a retry elsewhere).
  int64_t reserved_requests = 0;
  // Uncached prompt tokens reserved and not yet computed (a prefill agent:
  // until it answers; a decode agent prefilling locally: until the first
  // token).
  int64_t reserved_prefill_tokens = 0;
  // A decode agent: the projected KV of its reserved requests, each prompt +
  // max_tokens (what Dynamo calls active blocks, in tokens).
  int64_t reserved_kv_tokens = 0;
};

struct DecisionInput {
  int64_t num_prompt_tokens = 0;
  int64_t max_tokens = 0;  // the request's output budget (projected KV)
  // The engine requests it is on its decode agent (server::engineRequestsOf:
  // n, best_of, several prompts), each a seat or a place in its queue.
  int64_t engine_requests = 1;
  int32_t block_size = 16;
  std::vector<AgentView> prefill;
  std::vector<AgentView> decode;
};

// One candidate's cost terms, for GET /debug/decisions.
struct CandidateCost {
  std::string agent;
  bool prefill = false;  // a prefill agent (else decode)
  double cost = 0;       // what the policy minimised (its own unit)
  // The kv policy's terms in seconds (0 for other policies).
  double queue_s = 0;     // predicted wait before this request's prefill starts
  double compute_s = 0;   // predicted prefill compute of the uncached part
  double transfer_s = 0;  // predicted KV hand-off
  double step_s = 0;      // a decode agent: predicted step (ITL) with this request
  int64_t leading_blocks = 0;
  int64_t reserved_requests = 0;  // the ledger's
  int64_t external_requests = 0;  // polled, not the ledger's
};

struct Decision {
  enum class Kind { kDisaggregated, kLocalPrefill, kNone };
  Kind kind = Kind::kNone;
  std::optional<size_t> prefill;  // index into DecisionInput::prefill (disaggregated)
  std::optional<size_t> decode;   // index into DecisionInput::decode
  // Another agent holds a longer prefix than the agent that prefills and
  // lends it (read instead of computed); exactly one of lending_prefill and
  // lending_decode names the lender. Disaggregated: the decode agent, or
  // the longest prefill holder when it holds more (a hot prefix whose
  // holder is busy is read by a less-loaded prefill agent). Local: the
  // longest holder among the prefill agents and the other decode agents (a
  // hot prefix is replicated by a read, not computed again).
  bool pull_back = false;
  std::optional<size_t> lending_prefill;  // index into DecisionInput::prefill
  std::optional<size_t> lending_decode;   // index into DecisionInput::decode
  // The chosen agents hold the longest prefix of the prompt any healthy
  // agent holds (and it is not empty).
  bool affinity = false;
  // Another agent held a longer prefix than the chosen ones: under the kv
  // policy, its holders' queues cost more than the compute it saves, and
  // the request went to a less-loaded agent (a hot prefix spreads).
  bool spilled = false;
  // Of the prompt's full blocks, the fraction the chosen agents already hold
  // (the larger of the two).
  double overlap_ratio = 0;
  // The kv policy's predicted time to first token (seconds; 0 otherwise),
  // of which, disaggregated, the part until the prefill agent answers (local
  // prefill: all of it), and the blocks the decode agent reads in the
  // hand-off.
  double predicted_ttft_s = 0;
  double predicted_prefill_s = 0;
  int64_t blocks_read = 0;
  std::vector<CandidateCost> candidates;  // filled when PolicyOptions::explain
};

// How a decided request reaches its first token: the kv policy learns what
// its model misses per path.
enum class Path { kDisaggregated, kPullBack, kLocalPrefill };
inline Path pathOf(const Decision& decision) {
  if (decision.kind == Decision::Kind::kLocalPrefill) return Path::kLocalPrefill;
  return decision.pull_back ? Path::kPullBack : Path::kDisaggregated;
}

struct PolicyOptions {
  Policy policy = Policy::kKv;
  // RouterConfig::disagg_threshold_tokens.
  std::optional<int64_t> disagg_threshold_tokens;
  bool pull_back = true;
  int64_t pull_back_min_blocks = 4;  // the agents' remote_pull_threshold
  // The agents' step-time model (simulation profile form), used by the kv
  // policy to turn work into seconds; absent: the built-in one
  // (defaultRoutingProfile()).
  std::optional<engine::StepProfile> profile;
  // Target inter-token latency: a decode agent prefills locally only while
  // its other requests' predicted step stays within it.
  double itl_target_s = 0.025;
  bool explain = false;  // fill Decision::candidates
  bool learn = true;     // RouterConfig::learn_costs
};

// The step-time model the kv policy uses without PolicyOptions::profile:
// Llama-3.1-8B on one H100 (profiles/llama3.1-8b-h100.yaml).
engine::StepProfile defaultRoutingProfile();

// Picks the healthy agent of least cost; equal costs are broken uniformly at
// random with `random` (so ties never all go to the first agent). nullopt
// when no agent is healthy.
std::optional<size_t> cheapestWithRandomTies(const std::vector<AgentView>& agents,
                                             const std::function<double(const AgentView&)>& cost,
                                             std::mt19937_64& random);

// Of the prompt, the tokens `agent` holds (its leading blocks, at most the
// prompt) and those it would compute itself.
int64_t heldTokens(const DecisionInput& input, const AgentView& agent);
// Blocks `tokens` tokens take (the last one partial).
int64_t blocksOf(int64_t tokens, int32_t block_size);
int64_t uncachedTokens(const DecisionInput& input, const AgentView& agent);

// overlap_ratio of a decision whose agents are chosen.
double overlapRatio(const DecisionInput& input, const Decision& decision);

// What the step-time model misses (HTTP hops, handshakes, a lend's hold
// call, per-block costs of a transfer, scheduling), learned from what
// clients saw: per path, the seconds to add before the hand-off (a local
// prefill: to the whole TTFT), as a running mean (the plain mean of the
// first 20 observations, then exponential with weight 0.05); and the
// seconds to add after it as intercept + slope x blocks the decode agent
// reads, fitted by least squares with exponential forgetting (0.98 per
// observation), both terms kept >= 0.
class LearnedCosts {
 public:
  double beforeHandoff(Path path) const { return stage_[static_cast<size_t>(path)]; }
  double afterHandoff(int64_t blocks_read) const {
    return intercept_ + slope_ * static_cast<double>(blocks_read);
  }
  // `residual_s`: observed minus predicted (the prediction already held the
  // learned terms).
  void observeBeforeHandoff(Path path, double residual_s);
  void observeAfterHandoff(int64_t blocks_read, double residual_s);

 private:
  std::array<double, 3> stage_{};      // by Path
  std::array<int64_t, 3> observed_{};  // by Path
  // Weighted sums of x = blocks read, y = unmodelled seconds after the
  // hand-off.
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;
  double intercept_ = 0, slope_ = 0;
};

// Stateful only for round-robin cursors, the seeded random generator and
// the kv policy's LearnedCosts.
class Chooser {
 public:
  explicit Chooser(PolicyOptions options, uint64_t seed = 1)
      : options_(std::move(options)), random_(seed) {}
  Decision choose(const DecisionInput& input);
  const PolicyOptions& options() const { return options_; }

  // What a client saw of a kv decision: when the prefill agent answered
  // (seconds from arrival; negative: not disaggregated) and its TTFT,
  // against `decision`'s predictions (LearnedCosts).
  void observe(const Decision& decision, double observed_prefill_s, double observed_ttft_s);
  const LearnedCosts& learned() const { return learned_; }

 private:
  std::optional<size_t> pick(const std::vector<AgentView>& agents, size_t& cursor);
  Decision chooseKv(const DecisionInput& input);

  PolicyOptions options_;
  std::mt19937_64 random_;
  size_t prefill_cursor_ = 0;
  size_t decode_cursor_ = 0;
  LearnedCosts learned_;
};

}  // namespace tandem::router
