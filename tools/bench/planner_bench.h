// `tandem-bench planner`: the SLA planner (docs/planner.md) on a load ramp.
//
// Starts the real `tandem-operator local -f FILE --planner-interval S`
// (LocalCluster) on a cluster file — the one given, or a generated one: a
// PrefillPool and a DecodePool of simulated agents (engine.simulate: the
// profile) with spec.autoscaling (targetTTFTSeconds on prefill,
// targetITLSeconds on decode, short windows) — and drives the phases of
// --phases through its router: Poisson arrivals at each phase's rate, each
// request a streaming /v1/completions of random prompt token ids with
// ignore_eos and "return_token_ids", its lengths set by the phase's shape.
// Every second it samples each pool's ready agents (the operator's
// "NAME ready on" lines, an agent counted while its process lives) and picks
// up the planner's Events from the operator's log. At the end it prints and
// writes as JSON, per phase and overall: replicas min/max per pool, TTFT and
// ITL p90 against the targets, goodput, and the seconds during which the
// windowed p90 missed its target per pool; with --plot, a gnuplot PNG.
//
// Returns 0 when every request succeeded, 1 otherwise (figures printed either
// way). Throws tandem::Error for bad options or a cluster that cannot start.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::bench {

struct PlannerBenchOptions {
  std::string cluster_file;  // empty: a generated cluster (below)
  std::string operator_bin;  // empty: tandem-operator next to tandem-bench
  std::string phases = "40s:1:prefill,60s:20:prefill,60s:20:decode,60s:5:decode";
  double planner_interval_s = 1.0;
  // The generated cluster:
  std::string model_dir = "models/small";
  std::string profile = "profiles/llama3.1-8b-h100.yaml";
  int min_replicas = 1;
  int max_replicas = 6;
  double target_ttft_s = 0.5;
  double target_itl_s = 0.02;
  double window_s = 10;
  double scale_down_stabilization_s = 20;
  int max_step = 2;
  // Request shapes.
  int64_t prefill_prompt_tokens = 2048;
  int64_t prefill_output_tokens = 16;
  int64_t decode_prompt_tokens = 128;
  int64_t decode_output_tokens = 256;
  std::string vocab_range = "100:5000";
  uint64_t seed = 0;
  int max_concurrency = 512;  // requests in flight at most (arrivals wait beyond it)
  double read_timeout_s = 120.0;
  std::string work_dir;   // logs, the cluster file, the plot's data and script
  std::string json_path;  // empty: no JSON file
  std::string plot_path;  // empty: no PNG
};

int runPlannerBench(const PlannerBenchOptions& options);

}  // namespace tandem::bench
