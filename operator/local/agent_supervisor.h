// Runs the agents of local mode: one `tandem-agent serve` process per replica
// of each pool, on a free port (read back from the agent's "listening on"
// line), ready once its /health answers 200. A crashed agent is started again
// after an exponential backoff; apply() starts and stops agents to match new
// replica counts and restarts those whose command line changed. Every line an
// agent writes (stdout and stderr) is handed to the output callback prefixed
// with its name: "[decode-0] ...".
//
// One owner thread: apply(), poll(), beginStop() and the accessors are not
// thread-safe. poll() never blocks for long (a few ms per agent, a health
// check at most ~1 s), so the owner calls it in a loop.
//
// A pool whose command line or environment changed is rolled as a
// Deployment would be (its spec.rollout): while any of its agents runs the
// old spec, up to maxSurge extra agents "<pool>-<replicas + i>" run the new
// one, and a ready old agent is stopped (to start again with the new spec)
// only while more than replicas - maxUnavailable agents of the pool are
// available (ready for min_ready); the extra agents stop once every agent
// runs the new spec and is available. An old agent that is not ready
// (starting, or waiting to be restarted after a crash) is replaced at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "operator/spec/cluster_spec.h"

namespace tandem::local {

struct SupervisorOptions {
  std::filesystem::path agent_binary;
  std::string host = "127.0.0.1";
  // Backoff before restarting a crashed agent: initial, doubling up to max;
  // an agent that was ready for backoff_reset starts over at initial.
  std::chrono::milliseconds initial_backoff{1000};
  std::chrono::milliseconds max_backoff{30000};
  std::chrono::milliseconds backoff_reset{60000};
  // An agent not ready this long after it started is killed (and restarted).
  std::chrono::milliseconds startup_timeout{300000};
  // SIGTERM, then SIGKILL after this long.
  std::chrono::milliseconds stop_timeout{10000};
  // Liveness, as a pod's livenessProbe: a ready agent's /health is asked
  // every liveness_period (1 s to answer); one that fails it
  // liveness_failures times in a row (no answer: hung, stopped; or a 503
  // other than a drain's: a failing engine) is killed and restarted with
  // the backoff. 0 failures: never.
  std::chrono::milliseconds liveness_period{10000};
  int liveness_failures = 3;
  // An agent counts as available to a rollout once ready this long: the
  // router (which polls every 0.5 s) has seen it before the next old agent
  // goes.
  std::chrono::milliseconds min_ready{2000};
  // Receives each line of the agents' output, prefixed; default: stdout.
  std::function<void(const std::string& line)> output;
};

enum class AgentState {
  kStarting,  // process running, /health not yet 200
  kReady,     // /health answered 200
  kBackoff,   // exited; waiting to be started again
  kStopping,  // SIGTERM sent (or no process left after beginStop())
};
const char* agentStateName(AgentState state);

struct AgentStatus {
  std::string name;  // "<pool>-<index>"
  std::string pool;
  spec::PoolKind kind = spec::PoolKind::kDecode;
  AgentState state = AgentState::kStarting;
  pid_t pid = 0;  // 0 when no process runs
  int port = 0;   // 0 until the agent printed it
  int restarts = 0;
  bool updated = true;  // runs (or will run) its pool's current spec
  bool surge = false;   // a rollout's extra agent
};

class AgentSupervisor {
 public:
  explicit AgentSupervisor(SupervisorOptions options);
  // Kills (SIGKILL) and reaps whatever still runs; beginStop() is the clean way.
  ~AgentSupervisor();
  AgentSupervisor(const AgentSupervisor&) = delete;
  AgentSupervisor& operator=(const AgentSupervisor&) = delete;

  // Makes the agents those of `pools`: starts the missing ones, stops those
  // beyond a pool's replicas (highest index first) or of a removed pool;
  // poll() rolls the pools whose command line or environment changed.
  void apply(const std::vector<spec::PoolSpec>& pools);
  // One round: forwards output, reaps exits, checks health, restarts after
  // backoff, escalates stops to SIGKILL, moves each rollout on.
  void poll();
  // SIGTERM to every agent; none is started again. stopped() tells when all exited.
  void beginStop();
  bool stopped() const;

  std::vector<AgentStatus> agents() const;
  // Restarts after a crash (or a kill for not answering) by pool, since the
  // supervisor began: counts that never go down, agents scaled away
  // included.
  const std::map<std::string, int64_t>& restartsByPool() const { return restarts_by_pool_; }
  // Crashed agents of these pools wait in their backoff, and their
  // rollouts start no agent, until the set no longer names them (their
  // model directory is being fetched again: an agent started meanwhile
  // could read half of one commit and half of the next).
  void holdRestarts(std::set<std::string> pools) { held_pools_ = std::move(pools); }
  // The ready agents of one kind, in pool then index order.
  std::vector<spec::AgentAddress> readyEndpoints(spec::PoolKind kind) const;
  // Every agent apply() asked for is ready.
  bool allReady() const;
  // Why the first agent that exited (or timed out) before ever being ready
  // did so, e.g. "prefill-0 exited with status 1 before it was ready",
  // during the cluster's first start; such an agent is not started again.
  const std::optional<std::string>& startFailure() const { return start_failure_; }
  // The cluster's first start is over: from now on an agent failing to
  // start is started again after its backoff, as a crashed one is.
  void endFirstStart() { first_start_ = false; }

 private:
  struct Agent;
  struct Pool;
  const Pool* findPool(const std::string& name) const;
  Agent* findAgent(const std::string& name);
  // The agent <pool>-<index>, wanted: created and started when missing, run
  // again once it exited when it was being stopped.
  Agent& want(const Pool& pool, int64_t index, bool surge);
  void sortAgents();  // pool (file order), then index
  void start(Agent& agent);
  void rollOut(Pool& pool);
  // Starts an agent waiting in its backoff, counting a crash's restart (not
  // a rollout's replacement held back by a fetch).
  // The agent drains, unlisted, while a replacement of its name and kind
  // (a surge agent's is one too) starts at once: a rollout's step, or a
  // drain someone else began. The caller sorts the agents.
  void retire(Agent& agent, const Pool& pool);
  void startFromBackoff(Agent& agent);
  void forwardOutput(Agent& agent, std::chrono::milliseconds wait);
  void emitLine(Agent& agent, const std::string& line);
  void onExit(Agent& agent, int status);
  void sendStop(Agent& agent);

  SupervisorOptions options_;
  std::vector<Pool> pools_;  // as apply() last gave them
  std::vector<std::unique_ptr<Agent>> agents_;
  bool stopping_all_ = false;
  std::optional<std::string> start_failure_;
  bool first_start_ = true;
  std::map<std::string, int64_t> restarts_by_pool_;
  std::set<std::string> held_pools_;
};

}  // namespace tandem::local
