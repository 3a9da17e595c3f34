// The `move` scenario of `tandem-bench chaos`: what a client sees when the
// decode agent streaming its answer goes away, by how it goes. Each round
// sends a few long streams through the router, waits until a decode agent
// runs one, then either drains that agent (POST /admin/drain: its streams
// are handed over with their KV blocks) or kills it (SIGKILL: the router
// resumes its streams elsewhere, the prompt's KV lent by the prefill agent
// when it still holds it, the rest recomputed), alternately, and waits for
// local mode to start the agent again; or (action `rollout`) edits the
// cluster file's DecodePool so that local mode rolls it (docs/local-mode.md,
// Rollouts: every decode agent replaced, an extra one serving meanwhile),
// and waits until every decode agent runs again. Per round: the streams the router
// moved and their mean pause (tandem_router_migration_pause_seconds, the
// round's delta), the longest gap any client saw between two tokens, and
// the median gap of the round (the same run's inter-token reference).
// Every complete answer is kept for the exactness check.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench/cluster_load.h"
#include "tools/bench/local_cluster.h"

namespace tandem::bench {

struct MoveOptions {
  int rounds = 4;  // actions in turn: drain, kill, drain, kill, ...
  std::vector<std::string> actions = {"drain", "kill"};  // any of drain, kill, rollout
  int streams = 3;
  int64_t prompt_tokens = 1024;
  int64_t output_tokens = 300;
  double hang_timeout_s = 30;
  double restart_timeout_s = 90;
  uint64_t seed = 1;
  std::pair<int32_t, int32_t> vocab{3, 480};  // prompt ids in [first, second)
};

struct MoveRound {
  std::string action;            // "drain", "kill" or "rollout"
  std::string agent;             // the agent drained or killed; a rollout's pool
  double moved = 0;              // streams the router moved this round
  double router_pause_ms = 0;    // their mean pause (router)
  double client_max_gap_ms = 0;  // the longest gap between two tokens any client saw
  double median_gap_ms = 0;      // the median gap of the round's streams
  int complete = 0;              // streams that ended complete
  bool restarted = false;
};

struct MoveResult {
  std::vector<MoveRound> rounds;
  std::vector<AnsweredRequest> answered;
};

MoveResult runMoveRounds(LocalCluster& cluster, const std::string& url, const std::string& model,
                         const MoveOptions& options);

// Asks an agent to drain (as SIGTERM does), signed with `kv_secret` when
// there is one (LocalCluster::kvSecret); whether it accepted (202).
bool postDrain(const ClusterAgent& agent, const std::string& kv_secret);

}  // namespace tandem::bench
