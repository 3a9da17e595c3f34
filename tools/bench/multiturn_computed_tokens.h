// The prompt tokens a set of agents computed over a benchmark run, read from
// each agent's /metrics before and after it, for `tandem-bench multiturn`.
//
// An agent's tandem_computed_tokens_total counts every token its model
// computed: prompt (prefill) tokens and one token per decode step. A request
// that generated n ≥ 1 tokens took n − 1 decode steps (the first token is
// sampled from the prefill), so per agent
//   prompt tokens computed = Δtandem_computed_tokens_total
//                            − (Δtandem_generation_tokens_total
//                               − Δtandem_e2e_request_latency_seconds_count)
// where the histogram's _count is the number of finished requests. KV a
// decode agent loads from a prefill agent is not computed and not counted;
// recomputation after a preemption or a failed load is. Every agent of the
// cluster must be read: a prompt too short to disaggregate is computed on its
// decode agent.
//
// The same reads give the requests each agent finished (the histogram's
// _count), and its role (the `role` label of that series: prefill, decode or
// both), for how evenly a router spread requests.
//
// Thread-compatible free functions; they only read over HTTP.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

// One agent's counters at one moment.
struct AgentTokenCounters {
  double computed = 0;   // tandem_computed_tokens_total
  double generated = 0;  // tandem_generation_tokens_total
  double finished = 0;   // tandem_e2e_request_latency_seconds_count
  std::string role;      // that series' role label; empty when it has none
};

struct AgentSnapshot {
  std::string url;                             // the agent's base URL
  std::optional<AgentTokenCounters> counters;  // nullopt: no answer or a series missing
};

// One read of every agent's /metrics.
std::vector<AgentSnapshot> snapshotAgents(const std::vector<std::string>& urls, double timeout_s);

// Reads every agent until two reads in a row agree (an agent records a
// request as finished just after its last bytes are sent) or `settle_s`
// has passed; returns the last read.
std::vector<AgentSnapshot> settledSnapshot(const std::vector<std::string>& urls, double timeout_s,
                                           double settle_s);

// The prompt tokens computed between two snapshots of the same agents.
struct ComputedPromptTokens {
  struct Agent {
    std::string url;
    std::optional<AgentTokenCounters> before, after;
    std::optional<double> prompt_tokens;      // nullopt: a read failed
    std::optional<double> finished_requests;  // Δfinished; nullopt: a read failed
    std::string role;                         // as the agent's metrics label it
  };
  std::vector<Agent> agents;
  double total = 0;       // over the agents that answered both times
  bool complete = false;  // every agent answered both times
  nlohmann::json toJson() const;
};
ComputedPromptTokens computedPromptTokens(const std::vector<AgentSnapshot>& before,
                                          const std::vector<AgentSnapshot>& after);

}  // namespace tandem::bench
