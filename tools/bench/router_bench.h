// `tandem-bench router`: what the router itself costs. Against one running
// agent, the same request is sent alternately straight to the agent and
// through a router started in this process (the agent as its only decode
// agent, so every request is prefilled there: the router adds only its own
// work); the latencies and their paired differences are printed, with the
// router's decision time from its own metrics. Figures only, never a verdict.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::bench {

struct RouterBenchOptions {
  std::string agent_url = "http://127.0.0.1:8000";  // a running tandem-agent
  int requests = 200;                               // pairs (direct, routed)
  int prompt_tokens = 128;
  int max_tokens = 1;
  std::string json_path;  // empty: no JSON file
};

int runRouterBench(const RouterBenchOptions& options);

}  // namespace tandem::bench
