// `tandem-bench chaos`: faults under multi-turn load against a local cluster
// started through the real `tandem-operator local` (local_cluster.h), with
// outcomes judged from the client side (cluster_load.h).
//
// Scenarios, in order, while the multi-turn load runs through the router:
//   kill     --kills random agents get SIGKILL, --stops random agents
//            SIGSTOP, then SIGCONT after a random pause, and --drains random
//            decode agents POST /admin/drain (they hand their streams over and
//            exit); after each, the time until a request through the router
//            succeeds again (recovery) and, for a kill or a drain, until local
//            mode has the agent ready again (restart).
//   abort    --aborts clients that leave at a random moment: part of the
//            headers sent, part of the body, right after the request, after a
//            random delay, or after the first bytes of the answer; closing
//            with FIN or resetting (SO_LINGER {1, 0}); streamed or not. Then
//            a few normal requests must succeed.
//   move     --moves rounds of long streams whose decode agent is drained or
//            killed, or whose decode pool is rolled (--move-actions, in
//            turn; move_scenario.h): the pause their clients saw, by how the
//            agents went.
//   overload --overload-factor × (router max_inflight + max_queued) clients at
//            once; each gets an answer or a clean 503 with Retry-After.
// Then: every agent's KV blocks must return (free = total, held = 0, nothing
// running), the router's in-flight/queued gauges to 0 and its open
// descriptors to the baseline; every ok answer must equal a colocated
// reference agent's. Prints a table per scenario and, with --json, the same
// figures as JSON. Exit code 1 when any property failed.
#pragma once

#include <cstdint>
#include <string>

#include "tools/bench/cluster_load.h"
#include "tools/bench/local_cluster.h"
#include "tools/bench/move_scenario.h"

namespace tandem::bench {

struct ChaosBenchOptions {
  LocalClusterOptions cluster;
  LoadOptions load;
  std::string scenarios = "kill,abort,overload";
  int kills = 2;
  int stops = 2;
  int drains = 2;    // decode agents drained (POST /admin/drain); local mode starts them again
  MoveOptions move;  // the move scenario (move_scenario.h)
  double event_gap_s = 8.0;  // events come after a random gap in [1, this] seconds
  double stop_max_s = 8.0;   // an agent stays stopped a random [1, this] seconds
  double recovery_timeout_s = 90.0;
  int aborts = 1000;
  int abort_clients = 16;
  double overload_factor = 10.0;
  int overload_clients = 0;  // 0: overload_factor × (max_inflight + max_queued)
  double settle_timeout_s = 60.0;
  int64_t exactness_checks = 0;  // 0: every ok answer
  std::string work_dir;          // empty: a new directory under the system's temp dir
  std::string json_path;
};

// Runs the scenarios; returns 0 when every property held, 1 otherwise.
// Throws tandem::Error for bad options or a cluster that does not start.
int runChaosBench(const ChaosBenchOptions& options);

}  // namespace tandem::bench
