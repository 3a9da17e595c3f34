// `tandem-bench multiturn`: multi-turn conversations against a running
// OpenAI-compatible server (one agent, or the router of local mode).
//
// --num-clients clients work through --num-conversations conversations, each
// client one conversation at a time, turn after turn (closed loop); or, with
// --arrival poisson:RATE, conversations start at Poisson arrival times
// whatever is running (open loop), each turn still sent when the previous
// one finished. Every conversation starts with one of --prefix-groups shared
// prefixes of --shared-prefix-tokens (a system prompt), drawn Zipf(S), and
// each turn appends new user tokens; turn k's prompt is turn k-1's prompt,
// its answer's token ids and the new tokens, sent as token ids to streaming
// /v1/completions with ignore_eos and temperature 0, so lengths are exact and
// the server's prefix cache sees the same prefixes on every run. In the
// closed loop requests start at Poisson arrival times (--request-rate) or as
// soon as a client is free. Measures per request TTFT, TPOT, ITL and
// end-to-end latency, and the host's CPU use over the run; reports
// them overall and per turn, with throughput, failures and the prefix-cache
// hit rate (the server's tandem_prefix_cache_* counters and the
// cached_tokens its usage reports), goodput under an optional SLO and, given
// the agents' URLs, the prompt tokens they computed against the minimum the
// plan allows (multiturn_computed_tokens.h) and how evenly the agents of each
// role finished requests. With --cluster-file it starts a fresh local-mode
// cluster per routing policy and round and compares them
// (multiturn_policies.h). Asserts nothing about speed; the exit code is 1
// when any request failed.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench/bench_options.h"

namespace tandem::bench {

struct MultiTurnBenchOptions {
  std::string base_url = "http://127.0.0.1:8000";  // scheme://host:port of the server
  std::string model;                               // empty: the first of GET /v1/models
  int num_clients = 4;
  int num_conversations = 16;
  int turns = 4;
  int64_t shared_prefix_tokens = 0;
  // Distinct shared prefixes, and the Zipf exponent of each conversation's
  // draw among them (0: uniform).
  int prefix_groups = 1;
  double prefix_zipf = 0.0;
  std::string input_tokens = "uniform:128,256";  // new user tokens per turn (bench_options.h)
  std::string output_tokens = "constant:128";    // answer tokens per turn
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf: no pacing
  std::string arrival = "closed";  // or "poisson:RATE": open loop (multiturn_workload.h)
  uint64_t seed = 0;
  std::string vocab_range = "100:5000";  // prompt token ids drawn from [LO, HI)
  std::string progress = "auto";         // auto (when stderr is a terminal), on, off
  double read_timeout_s = 600.0;         // longest wait for the next bytes of a response
  std::string json_path;                 // empty: no JSON file
  std::string plot_path;                 // empty: no TTFT CDF plot
  // Goodput: a completed request is good when its TTFT and its mean ITL are
  // within these (each only when set); no SLO at all: no goodput figure.
  std::optional<double> slo_ttft_ms, slo_itl_ms;
  // Agents' base URLs whose counters give the prompt tokens computed.
  std::vector<std::string> agent_metrics;
  // Non-empty: for each of `policies`, start `tandem-operator local -f
  // cluster_file --policy P`, run the same plan against its router, stop it.
  std::string cluster_file;
  std::vector<std::string> policies = {"kv", "round_robin"};
  int rounds = 1;            // interleaved rounds of every policy, each on fresh clusters
  std::string work_dir;      // cluster logs; empty: a fresh temporary directory
  std::string operator_bin;  // empty: tandem-operator next to tandem-bench
};

// One turn of a conversation, drawn before the run.
struct TurnPlan {
  std::vector<int32_t> user_tokens;  // appended after the history
  int64_t output_len = 0;            // max_tokens
};

// One conversation: its turns in order, after its group's shared prefix.
struct ConversationPlan {
  int prefix_group = 0;  // index into Plan::prefixes
  std::vector<TurnPlan> turns;
};

struct Plan {
  // One shared prefix per group (--prefix-groups), each of
  // --shared-prefix-tokens; group 0's is the plan's prefix without groups.
  std::vector<std::vector<int32_t>> prefixes;
  std::vector<ConversationPlan> conversations;
  // Closed loop: arrival times of the run's requests in order, since the
  // start; empty for an infinite rate. The n-th request any client sends
  // takes the n-th.
  std::vector<double> arrivals_s;
  // Open loop: when each conversation starts (its first turn is sent).
  std::vector<double> conversation_starts_s;

  const std::vector<int32_t>& prefixOf(const ConversationPlan& conversation) const {
    return prefixes[static_cast<size_t>(conversation.prefix_group)];
  }
};

// Draws the shared prefixes, every conversation's group and turns (user
// tokens from `vocab`, lengths from `input` and `output`) and the arrival
// times from options.seed: the same options give the same plan. With one
// prefix group and the closed loop the plan is what it was before groups
// and open loops existed. Also used by the chaos and soak programs' load.
Plan makePlan(const MultiTurnBenchOptions& options, const TokenCountDistribution& input,
              const TokenCountDistribution& output, std::pair<int32_t, int32_t> vocab);

// One run of the plan against `base_url`, its figures printed; `agent_urls`
// (may be empty) are read for the prompt tokens computed. `report` is what
// --json holds for a run against one server; exit_code as below.
struct MultiTurnOutcome {
  int exit_code = 0;
  nlohmann::json report;
};
MultiTurnOutcome runMultiTurnOnce(const MultiTurnBenchOptions& options, const std::string& base_url,
                                  const std::vector<std::string>& agent_urls);

// Runs the benchmark against options.base_url (or, with cluster_file, each
// policy's fresh cluster). Returns 0 when every request
// completed, 1 when any failed (the figures are printed either way). Throws
// tandem::Error for bad options or when the server cannot be asked for its
// model list.
int runMultiTurnBench(const MultiTurnBenchOptions& options);

}  // namespace tandem::bench
