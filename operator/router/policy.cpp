#include "operator/router/policy.h"

#include <algorithm>

namespace tandem::router {
namespace {

// Weights of the kv policy, in tokens of prefill work: one request already
// running or queued on an agent costs as much as computing this many tokens.
constexpr double kRequestCostTokens = 256;
// Fully used KV makes an agent preempt; weigh usage like this many tokens.
constexpr double kKvUsageCostTokens = 512;

double prefillCost(const AgentView& agent, int64_t num_prompt_tokens, int32_t block_size) {
  const int64_t uncached = num_prompt_tokens - agent.leading_blocks * block_size;
  return static_cast<double>(uncached + agent.queued_prefill_tokens) +
         kRequestCostTokens * static_cast<double>(agent.waiting);
}

double decodeCost(const AgentView& agent, int32_t block_size) {
  const double load = static_cast<double>(std::max(agent.running + agent.waiting, agent.inflight));
  return kRequestCostTokens * load + kKvUsageCostTokens * agent.kv_usage -
         static_cast<double>(agent.leading_blocks * block_size);  // credit for what it holds
}

template <typename Cost>
std::optional<size_t> cheapest(const std::vector<AgentView>& agents, Cost cost) {
  std::optional<size_t> best;
  double best_cost = 0;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (!agents[i].healthy) continue;
    const double c = cost(agents[i]);
    if (!best || c < best_cost) {
      best = i;
      best_cost = c;
    }
  }
  return best;
}

}  // namespace

std::optional<size_t> Chooser::pick(const std::vector<AgentView>& agents, size_t& cursor) {
  std::vector<size_t> healthy;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].healthy) healthy.push_back(i);
  }
  if (healthy.empty()) return std::nullopt;
  if (options_.policy == Policy::kRandom) {
    return healthy[std::uniform_int_distribution<size_t>(0, healthy.size() - 1)(random_)];
  }
  return healthy[cursor++ % healthy.size()];
}

Decision Chooser::choose(const DecisionInput& input) {
  Decision decision;
  const int32_t block_size = input.block_size;
  const int64_t full_blocks = input.num_prompt_tokens / block_size;
  if (options_.policy != Policy::kKv) {
    decision.decode = pick(input.decode, decode_cursor_);
    if (!decision.decode) return decision;
    decision.prefill = pick(input.prefill, prefill_cursor_);
    decision.kind =
        decision.prefill ? Decision::Kind::kDisaggregated : Decision::Kind::kLocalPrefill;
  } else {
    decision.decode =
        cheapest(input.decode, [&](const AgentView& a) { return decodeCost(a, block_size); });
    if (!decision.decode) return decision;
    const AgentView& decode = input.decode[*decision.decode];
    decision.prefill = cheapest(input.prefill, [&](const AgentView& a) {
      return prefillCost(a, input.num_prompt_tokens, block_size);
    });
    const int64_t uncached_on_decode = input.num_prompt_tokens - decode.leading_blocks * block_size;
    // Conditional disaggregation: a short uncached part is cheaper to prefill
    // where it will be decoded than to move.
    if (!decision.prefill || uncached_on_decode < options_.disagg_threshold_tokens) {
      decision.prefill.reset();
      decision.kind = Decision::Kind::kLocalPrefill;
    } else {
      decision.kind = Decision::Kind::kDisaggregated;
      const AgentView& prefill = input.prefill[*decision.prefill];
      decision.pull_back = options_.pull_back && decode.leading_blocks - prefill.leading_blocks >=
                                                     options_.pull_back_min_blocks;
    }
  }
  if (full_blocks > 0) {
    int64_t held = input.decode[*decision.decode].leading_blocks;
    if (decision.prefill) held = std::max(held, input.prefill[*decision.prefill].leading_blocks);
    decision.overlap_ratio = static_cast<double>(held) / static_cast<double>(full_blocks);
  }
  return decision;
}

}  // namespace tandem::router
