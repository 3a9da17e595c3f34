#include "operator/router/anchor_policies.h"

#include <algorithm>
#include <functional>
#include <limits>

namespace tandem::router {
namespace {

using CostFn = std::function<double(const AgentView&)>;

// Dynamo KV router defaults (KvRouterConfig::default()): --router-kv-overlap-
// score-weight 1.0, --router-temperature 0 (argmin, random ties).
constexpr double kDynamoOverlapScoreWeight = 1.0;

// llm-d's default scheduling profile (the EPP Helm chart's
// default-plugins.yaml): queue-scorer 2, kv-cache-utilization-scorer 2,
// prefix-cache-scorer 3, max-score-picker.
constexpr double kLlmDQueueWeight = 2;
constexpr double kLlmDKvCacheWeight = 2;
constexpr double kLlmDPrefixWeight = 3;

// SGLang router CLI defaults for --policy cache_aware (router_args.py).
constexpr double kSglangCacheThreshold = 0.3;
constexpr int64_t kSglangBalanceAbsThreshold = 64;
constexpr double kSglangBalanceRelThreshold = 1.5;

bool anyHealthy(const std::vector<AgentView>& agents) {
  return std::any_of(agents.begin(), agents.end(), [](const AgentView& a) { return a.healthy; });
}

double blocks(int64_t tokens, int32_t block_size) {
  return static_cast<double>(tokens) / static_cast<double>(block_size);
}

// The flow every anchor shares, as llm-d's disagg profile handler runs it:
// the decode agent first; then prefill on a prefill agent only when the part
// of the prompt the decode agent lacks is at least disagg_threshold_tokens
// (Tandem's conditional disaggregation, applied to all policies alike).
Decision decide(const DecisionInput& input, const PolicyOptions& options, std::mt19937_64& random,
                const CostFn& decode_cost, const CostFn& prefill_cost) {
  Decision decision;
  decision.decode = cheapestWithRandomTies(input.decode, decode_cost, random);
  if (!decision.decode) return decision;
  const AgentView& decode = input.decode[*decision.decode];
  if (anyHealthy(input.prefill) &&
      uncachedTokens(input, decode) >=
          options.disagg_threshold_tokens.value_or(kDefaultDisaggThresholdTokens)) {
    decision.prefill = cheapestWithRandomTies(input.prefill, prefill_cost, random);
  }
  decision.kind = decision.prefill ? Decision::Kind::kDisaggregated : Decision::Kind::kLocalPrefill;
  decision.overlap_ratio = overlapRatio(input, decision);
  if (options.explain) {
    for (const AgentView& agent : input.prefill) {
      if (!agent.healthy) continue;
      CandidateCost c;
      c.agent = agent.name;
      c.prefill = true;
      c.cost = prefill_cost(agent);
      c.leading_blocks = agent.leading_blocks;
      decision.candidates.push_back(c);
    }
    for (const AgentView& agent : input.decode) {
      if (!agent.healthy) continue;
      CandidateCost c;
      c.agent = agent.name;
      c.cost = decode_cost(agent);
      c.leading_blocks = agent.leading_blocks;
      decision.candidates.push_back(c);
    }
  }
  return decision;
}

// llm-d's queue-scorer reads the polled waiting queue. Tandem polls every
// 0.5 s where llm-d scrapes every 50 ms, so requests this router reserved on
// the agent and the agent does not yet report as running count as waiting.
int64_t llmDWaiting(const AgentView& agent) {
  return std::max(agent.waiting, agent.reserved_requests - agent.running);
}

// Weighted sum of llm-d's three default scorers over one pool's healthy
// agents, negated: the least cost is llm-d's highest score.
CostFn llmDCost(const DecisionInput& input, const std::vector<AgentView>& agents) {
  int64_t min_waiting = std::numeric_limits<int64_t>::max();
  int64_t max_waiting = std::numeric_limits<int64_t>::min();
  for (const AgentView& agent : agents) {
    if (!agent.healthy) continue;
    min_waiting = std::min(min_waiting, llmDWaiting(agent));
    max_waiting = std::max(max_waiting, llmDWaiting(agent));
  }
  const int64_t full_blocks = input.num_prompt_tokens / input.block_size;
  return [=](const AgentView& agent) {
    // queue-scorer: min-max normalised, shortest queue 1; all equal: 1.
    const double queue = max_waiting == min_waiting
                             ? 1.0
                             : static_cast<double>(max_waiting - llmDWaiting(agent)) /
                                   static_cast<double>(max_waiting - min_waiting);
    // kv-cache-utilization-scorer: 1 - usage.
    const double kv_cache = std::clamp(1.0 - agent.kv_usage, 0.0, 1.0);
    // prefix-cache-scorer: matched blocks / prompt blocks.
    const double prefix = full_blocks > 0
                              ? static_cast<double>(std::min(agent.leading_blocks, full_blocks)) /
                                    static_cast<double>(full_blocks)
                              : 0.0;
    return -(kLlmDQueueWeight * queue + kLlmDKvCacheWeight * kv_cache + kLlmDPrefixWeight * prefix);
  };
}

// SGLang's cache_aware over one pool: shortest queue (the router's own
// in-flight count) when the pool is imbalanced, else the longest prefix match
// when it covers more than cache_threshold of the prompt, else the agent with
// the most free cache.
CostFn sglangCost(const DecisionInput& input, const std::vector<AgentView>& agents) {
  int64_t min_load = std::numeric_limits<int64_t>::max();
  int64_t max_load = 0;
  int64_t longest = 0;
  bool any = false;
  for (const AgentView& agent : agents) {
    if (!agent.healthy) continue;
    any = true;
    min_load = std::min(min_load, agent.reserved_requests);
    max_load = std::max(max_load, agent.reserved_requests);
    longest = std::max(longest, agent.leading_blocks);
  }
  if (!any) return [](const AgentView&) { return 0.0; };
  const bool imbalanced =
      max_load - min_load > kSglangBalanceAbsThreshold &&
      static_cast<double>(max_load) > static_cast<double>(min_load) * kSglangBalanceRelThreshold;
  if (imbalanced) {
    return [](const AgentView& agent) { return static_cast<double>(agent.reserved_requests); };
  }
  const double match_rate =
      input.num_prompt_tokens > 0
          ? static_cast<double>(std::min(longest * input.block_size, input.num_prompt_tokens)) /
                static_cast<double>(input.num_prompt_tokens)
          : 0.0;
  if (match_rate > kSglangCacheThreshold) {
    return [](const AgentView& agent) { return -static_cast<double>(agent.leading_blocks); };
  }
  return [](const AgentView& agent) { return agent.kv_usage; };
}

}  // namespace

// Dynamo's KV router: logit = overlap_score_weight x prefill blocks + decode
// blocks, the lowest wins. Prefill blocks are the worker's active prompt
// tokens plus the prompt tokens it does not hold, in blocks; decode blocks its
// active blocks plus the request's. Disaggregated, the prefill router tracks
// no active blocks and the decode router scores no overlap nor prefill
// tokens, so decode agents are chosen by active blocks alone; with no prefill
// agent, decode agents get the aggregated cost.
Decision chooseDynamo(const DecisionInput& input, const PolicyOptions& options,
                      std::mt19937_64& random) {
  const int32_t block_size = input.block_size;
  const double request_blocks =
      static_cast<double>((input.num_prompt_tokens + block_size - 1) / block_size);
  const auto prefill_blocks = [&](const AgentView& agent) {
    return blocks(agent.reserved_prefill_tokens + uncachedTokens(input, agent), block_size);
  };
  const auto active_blocks = [&](const AgentView& agent) {
    return blocks(agent.reserved_kv_tokens, block_size) + request_blocks;
  };
  const bool aggregated = !anyHealthy(input.prefill);
  const CostFn decode_cost = [&](const AgentView& agent) {
    return (aggregated ? kDynamoOverlapScoreWeight * prefill_blocks(agent) : 0.0) +
           active_blocks(agent);
  };
  const CostFn prefill_cost = [&](const AgentView& agent) {
    return kDynamoOverlapScoreWeight * prefill_blocks(agent);
  };
  return decide(input, options, random, decode_cost, prefill_cost);
}

// llm-d's inference scheduler: each pool's profile scores every candidate
// with the weighted scorers and the max-score picker takes the highest
// (random ties); the decode profile runs first and the prefix-based PD
// decider adds the prefill profile when the decode pod's uncached part is
// long enough.
Decision chooseLlmD(const DecisionInput& input, const PolicyOptions& options,
                    std::mt19937_64& random) {
  return decide(input, options, random, llmDCost(input, input.decode),
                llmDCost(input, input.prefill));
}

// SGLang's router in PD mode: --prefill-policy and --decode-policy default to
// --policy, so both pools are chosen by cache_aware, each on its own loads and
// prefix matches.
Decision chooseSglang(const DecisionInput& input, const PolicyOptions& options,
                      std::mt19937_64& random) {
  return decide(input, options, random, sglangCost(input, input.decode),
                sglangCost(input, input.prefill));
}

}  // namespace tandem::router
