// A local cluster for tandem-bench's chaos and soak programs: the real
// `tandem-operator local -f cluster.yaml` (docs/local-mode.md) started as a
// child process, its agents found from what it logs, and the figures the
// programs read from the outside: each agent's KV gauges (/metrics), the
// router's in-flight/queued gauges, open descriptors (/proc/PID/fd) and
// resident memory (/proc/PID/status VmRSS) of every process.
//
// Agents are learned from the operator's own log lines
//   local: NAME ready on HOST:PORT (pid PID)
// and their KV block totals from each agent's start-up line
//   [NAME] ... serving MODEL on URL (N KV blocks of B tokens, ...)
// so a restarted agent (new pid, new port) is followed as local mode follows it.
//
// Thread-safety: LocalCluster's methods may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/subprocess.h"

namespace tandem::bench {

struct LocalClusterOptions {
  // A cluster file to run as it is; empty: one is written (below) into work_dir.
  std::string cluster_file;
  std::string operator_bin;  // empty: tandem-operator next to tandem-bench
  std::string agent_bin;     // reference agent; empty: tandem-agent next to tandem-bench
  std::vector<std::string>
      operator_args;  // appended to `local -f FILE --port 0` (e.g. --policy kv)
  // For a written cluster file:
  std::string model_dir;  // empty: the tiny test model, written into work_dir
  int prefill_replicas = 2;
  int decode_replicas = 2;
  int64_t num_blocks = 256;  // per agent
  int agent_threads = 1;
  int64_t max_inflight_requests = 8;
  int64_t max_queued_requests = 8;
  // Held blocks no decode agent read are freed after this; above a reader's
  // read_timeout_s (10) + 5 s, the least left for a hold to be read.
  double abort_timeout_s = 30.0;
  std::filesystem::path work_dir;  // logs, the written model and cluster file
};

struct ClusterAgent {
  std::string name;  // "prefill-0", "decode-1", ...
  std::string role;  // "prefill" or "decode"
  std::string host;
  int port = 0;
  pid_t pid = 0;
  std::optional<int64_t> total_blocks;  // from its start-up line
  std::string url() const { return "http://" + host + ":" + std::to_string(port); }
};

// What one agent's /metrics says about its KV blocks and requests.
struct AgentKvState {
  std::string name;
  bool answered = false;
  double running = 0, waiting = 0, held_blocks = 0, free_blocks = 0;
  std::optional<int64_t> total_blocks;
  // Blocks neither free nor evictable, plus held ones; 0 when settled.
  int64_t leakedBlocks() const;
  bool settled() const;
};

// The router's own gauges (null when it does not export them) and descriptors.
struct RouterState {
  std::optional<double> inflight, queued;
  std::optional<int> open_fds;
  // Streams moved off a failed decode agent (resumed) and those with nowhere
  // to go (exhausted): tandem_router_migrations_total.
  std::optional<double> migrations_resumed, migrations_exhausted;
  // The pause moved streams' clients saw, by why they moved
  // (tandem_router_migration_pause_seconds{reason}), and the router's
  // client-side inter-token latency, the same run's reference.
  struct Mean {
    double count = 0;
    double sum_s = 0;
    double meanMs() const { return count > 0 ? 1000 * sum_s / count : 0; }
  };
  std::map<std::string, Mean> migration_pause;  // reasons with a moved stream
  Mean inter_token;
};

// What the cluster looks like once load has stopped: every agent's blocks
// free, nothing held or running, the router idle and its descriptors back.
struct SettleReport {
  bool settled = false;
  double waited_s = 0.0;
  std::vector<AgentKvState> agents;
  RouterState router;
  int baseline_fds = 0;
  int64_t leakedBlocks() const;
  bool routerIdle() const;
  bool fdsBack() const;
  nlohmann::json toJson() const;
  void print() const;
};

class LocalCluster;

// A started cluster and the model its router serves.
struct StartedCluster {
  LocalClusterOptions options;  // as started: work_dir filled in
  std::unique_ptr<LocalCluster> cluster;
  std::string url;    // the router's base URL
  std::string model;  // the first model of its /v1/models
  // tandem-agent for a colocated reference: options.agent_bin, else the one
  // next to this program.
  std::string agent_bin;
};
// Starts a cluster for the program `program` (logs under work_dir, or a
// fresh temporary directory named after the program when work_dir is
// empty), prints where its logs go and waits for its router to list a
// model. Throws tandem::Error naming what failed.
StartedCluster startBenchCluster(LocalClusterOptions options, const std::string& work_dir,
                                 const std::string& program);

class LocalCluster {
 public:
  // Writes the cluster file when none is given, starts tandem-operator and
  // waits (up to startup_timeout) for its router to answer /health. Throws
  // tandem::Error naming what failed, with the end of the operator's log.
  LocalCluster(const LocalClusterOptions& options, std::chrono::seconds startup_timeout);
  // SIGTERM, then SIGKILL of the operator and of any agent it left.
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  std::string routerUrl();
  pid_t operatorPid() const { return operator_->pid(); }
  // The operator's exit status (128 + signal when killed by one), or nullopt
  // while it runs.
  std::optional<int> operatorExit() {
    const int status = operator_->wait(std::chrono::milliseconds(0));
    return status >= 0 ? std::optional<int>(status) : std::nullopt;
  }
  const std::filesystem::path& clusterFile() const { return cluster_file_; }
  std::string modelDir() const { return model_dir_; }
  // Flags a colocated reference agent needs to compute what the pools compute.
  std::vector<std::string> referenceAgentFlags() const { return reference_flags_; }
  int64_t maxInflightRequests() const { return max_inflight_; }
  int64_t maxQueuedRequests() const { return max_queued_; }
  size_t expectedAgents() const { return expected_agents_; }
  // The KV secret the operator's pools take (TANDEM_KV_SECRET in its
  // environment): the bench's own TANDEM_KV_SECRET, else one made for the
  // run. Agents take their pool's own secret instead when the file gives
  // one. Control requests the bench sends to agents (POST /admin/drain) are
  // signed with it.
  const std::string& kvSecret() const { return kv_secret_; }

  // The agents the operator last reported ready, by name (an agent it
  // stopped, a rollout's extra one, leaves the list).
  std::vector<ClusterAgent> agents();
  // Edits the cluster file's first DecodePool so that local mode rolls it:
  // sets TANDEM_BENCH_ROLLOUT=`value` in its env (the one field of the
  // pool the bench writes that changes nothing the agents compute). Returns
  // the pool's name. Throws tandem::Error when the file has no DecodePool
  // or its env is not the bench's.
  std::string rollDecodePool(const std::string& value);
  // Waits until every agent of the file is ready again with a live pid.
  bool waitForAllAgents(std::chrono::milliseconds timeout);
  // Waits until `name` is ready with a pid other than `old_pid`.
  std::optional<ClusterAgent> waitForRestart(const std::string& name, pid_t old_pid,
                                             std::chrono::milliseconds timeout);
  // Waits until the router lists every agent of the file and reports each
  // healthy (tandem_router_agent_healthy 1): what it routes by, which lags
  // an agent's restart by up to one health poll.
  bool waitForRouterToSeeAllAgents(std::chrono::milliseconds timeout);

  std::vector<AgentKvState> kvStates();
  RouterState routerState();
  // Polls until settled (see SettleReport) or the timeout.
  SettleReport waitUntilSettled(int baseline_fds, std::chrono::milliseconds timeout);

  // The end of the operator's log (stderr) and output (stdout), for messages.
  std::string logTail(size_t lines = 20);

 private:
  void waitUntilServing(std::chrono::seconds startup_timeout);
  void drainOutput();
  void stopDraining();
  void scanLog();
  // The router's /metrics text; nullopt when it does not answer 200.
  std::optional<std::string> routerMetrics();

  std::filesystem::path work_dir_;
  std::filesystem::path cluster_file_;
  std::string model_dir_;
  std::vector<std::string> reference_flags_;
  std::map<std::string, std::string> pool_roles_;  // pool name → role
  size_t expected_agents_ = 0;
  int64_t max_inflight_ = 256;
  int64_t max_queued_ = 1024;
  std::string kv_secret_;
  std::unique_ptr<Subprocess> operator_;

  std::mutex mutex_;
  std::string router_url_;  // from "router listening on HOST:PORT"
  std::map<std::string, ClusterAgent> agents_;
  std::map<std::string, int64_t> total_blocks_;
  std::vector<std::string> output_tail_;
  size_t log_offset_ = 0;
  bool stopping_ = false;
  std::thread drain_thread_;
};

// /proc/PID/status VmRSS in KiB; nullopt when the process is gone.
std::optional<int64_t> processRssKib(pid_t pid);
// Entries of /proc/PID/fd; nullopt when it cannot be read.
std::optional<int> openFdCount(pid_t pid);

// A least-squares line through (x, y) points: its slope and r².
struct LineFit {
  double slope = 0.0;
  double r2 = 0.0;
  size_t points = 0;
};
LineFit fitLine(const std::vector<std::pair<double, double>>& points);

// Samples the RSS of the operator and of each agent every `interval` on its
// own thread; an agent that restarts starts a new series ("decode-0#2").
class RssSampler {
 public:
  struct Series {
    std::string process;
    pid_t pid = 0;
    std::vector<std::pair<double, double>> samples;  // (seconds since start, KiB)
  };
  RssSampler(LocalCluster& cluster, std::chrono::milliseconds interval);
  ~RssSampler();
  // Stops sampling; the series, in the order processes were first seen.
  std::vector<Series> stop();

 private:
  void run();
  LocalCluster& cluster_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  bool stopping_ = false;
  std::vector<Series> series_;
  std::thread thread_;
};

}  // namespace tandem::bench
