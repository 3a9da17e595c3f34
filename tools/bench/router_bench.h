// `tandem-bench router`: what the router itself costs. Against one running
// agent, the same request is sent alternately straight to the agent and
// through a router started in this process (the agent as its only decode
// agent, so every request is prefilled there: the router adds only its own
// work); the latencies and their paired differences are printed, with the
// router's decision time from its own metrics. Figures only, never a verdict.
// With `--agents N` it runs the cluster-scale mode instead
// (router_scale_bench.h): N simulated agents behind the real router.
#pragma once

#include <cstdint>
#include <string>

#include "tools/bench/router_scale_bench.h"

namespace tandem::bench {

struct RouterBenchOptions {
  std::string agent_url = "http://127.0.0.1:8000";  // a running tandem-agent
  int requests = 200;                               // pairs (direct, routed)
  int prompt_tokens = 128;
  int max_tokens = 1;
  std::string json_path;  // empty: no JSON file
  // Cluster-scale mode when scale.agents > 0; requests, prompt_tokens,
  // max_tokens and json_path above are copied into it.
  RouterScaleOptions scale = singleAgent();

 private:
  static RouterScaleOptions singleAgent() {
    RouterScaleOptions options;
    options.agents = 0;
    return options;
  }
};

int runRouterBench(const RouterBenchOptions& options);

}  // namespace tandem::bench
