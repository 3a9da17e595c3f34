// `tandem-bench router --agents N`: what the router costs at cluster scale.
// It writes a local cluster of N simulated agents (docs/simulation.md; half
// prefill, half decode), runs it through the real `tandem-operator local`
// (LocalCluster), and warms it by sending prompt i straight to decode agent i
// and prefill agent i, so the ownership index holds a different prompt for
// each agent (all prompts share a leading fraction, as a common system
// prompt would: every agent then matches part of every prompt). It then
// sends prompt i alternately straight to decode agent i and through the
// router, with token ids and with text that tokenizes to about as many
// tokens, and reports per prompt kind:
//   - the router's decision time (tandem_router_decision_seconds: hashing
//     the prompt's blocks, reading every agent's leading blocks and choosing)
//     as its exact mean (sum / count) and p50/p90/p99 interpolated within
//     the histogram's buckets, and the decisions per second one thread makes;
//   - the direct, routed and added (routed - direct, paired) latencies.
// Figures only, never a verdict. Throws tandem::Error when the cluster
// cannot be started or warmed; failed measured requests are counted.
#pragma once

#include <string>

namespace tandem::bench {

struct RouterScaleOptions {
  int agents = 32;    // prefill agents: agents / 2; decode agents: the rest
  int requests = 20;  // measured pairs (direct, routed) per prompt kind
  int prompt_tokens = 100000;
  int max_tokens = 1;
  std::string prompt_kinds = "both";  // "ids", "text" or "both"
  std::string policy = "kv";          // the router's policy: kv, round_robin, random
  double shared_prefix = 0.5;         // fraction of every prompt all prompts share
  std::string simulate = "profiles/llama3.1-8b-h100.yaml";
  std::string model_dir;                  // empty: the tiny test model, written into work_dir
  std::string kv_cache_memory = "60GiB";  // per agent, on the simulated accelerator
  std::string work_dir;                   // empty: a fresh temporary directory
  std::string operator_bin;               // empty: tandem-operator next to tandem-bench
  std::string json_path;                  // empty: no JSON file
};

int runRouterScaleBench(const RouterScaleOptions& options);

}  // namespace tandem::bench
