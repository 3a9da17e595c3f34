// `tandem-operator local -f cluster.yaml`: the pools of a cluster file as
// local agent processes (AgentSupervisor) behind one router. Life cycle:
// parse the file (a bad file stops here, naming the field), start every
// agent and wait until all are ready (one that exits first stops everything
// with its reason), start the router with them, then keep the router's agent
// lists current as agents crash, restart and scale, re-read the file when it
// changes, run the SLA planner for pools with spec.autoscaling (every
// planner_interval: scrape, decide, change replicas), and on requestStop()
// stop the router, then the agents (SIGTERM, SIGKILL after the stop timeout).
// With a metrics port, GET /metrics on it serves the planner's metrics and
// the pools' replicas and agent states as Prometheus text from before the
// agents start until run() returns. See docs/local-mode.md.
//
// Replicas change in one way only: the pools local mode runs (the file's,
// with the planner's replicas for autoscaled pools) are given to the
// supervisor again, whether the file or the planner changed them. A change of
// an autoscaled pool's replicas in the file is a manual change to the planner.
//
// The router is reached through RouterHandle, so that this library does not
// depend on the router's; tandem-operator binds it to tandem::router::Router.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "operator/local/agent_supervisor.h"
#include "operator/local/local_planner.h"
#include "operator/spec/cluster_spec.h"

namespace tandem::server {
class HttpService;
}

namespace tandem::local {

// A running router as local mode uses it.
class RouterHandle {
 public:
  virtual ~RouterHandle() = default;
  virtual int port() const = 0;
  virtual void setAgents(std::vector<spec::AgentAddress> prefill,
                         std::vector<spec::AgentAddress> decode) = 0;
  // Stops accepting and lets in-flight requests finish until the grace period.
  virtual void stop(double grace_seconds) = 0;
};

// Starts a router for `spec` with its first agents; throws tandem::Error
// when it cannot (e.g. the port is taken).
using RouterFactory = std::function<std::unique_ptr<RouterHandle>(
    const spec::RouterSpec& spec, std::vector<spec::AgentAddress> prefill,
    std::vector<spec::AgentAddress> decode)>;

struct LocalModeOptions {
  std::filesystem::path cluster_file;
  // Command-line overrides of the Router document.
  std::optional<int> port;
  std::optional<std::string> policy;
  // Agents: binary, backoff, timeouts; `output` also receives the
  // "router listening on HOST:PORT" line.
  SupervisorOptions supervisor;
  // How often the cluster file is checked for changes.
  std::chrono::milliseconds reload_interval{1000};
  // How often the planner scrapes and decides for pools with spec.autoscaling.
  std::chrono::milliseconds planner_interval{2000};
  // Serve GET /metrics (localModeMetrics()) on metrics_host:metrics_port;
  // 0 picks a free port (metricsPort() tells which). Not served when unset.
  std::optional<int> metrics_port;
  std::string metrics_host = "127.0.0.1";
  // Where hf:// model sources are fetched to (a directory per repository and
  // revision, model_source::hubCacheDirectory; empty: defaultModelCache()); the token is HF_TOKEN
  // from this process's environment, the endpoint spec.model.endpoint, else HF_ENDPOINT, else the
  // Hub.
  std::filesystem::path model_cache;
};

// The model cache local mode uses unless told: TANDEM_MODEL_CACHE, else
// $XDG_CACHE_HOME/tandem, else $HOME/.cache/tandem.
std::filesystem::path defaultModelCache();

// A planner Event (docs/planner.md#events) as local mode recorded it.
struct PlannerEventRecord {
  std::string pool;
  double time_seconds = 0;  // the round's time (steady clock seconds)
  planner::PlannerEvent event;
};

class LocalMode {
 public:
  LocalMode(LocalModeOptions options, RouterFactory router_factory);
  ~LocalMode();
  LocalMode(const LocalMode&) = delete;
  LocalMode& operator=(const LocalMode&) = delete;

  // Runs until requestStop() and returns once every agent has exited. Throws
  // tandem::Error for a bad cluster file, an agent that could not start or a
  // router that could not (having stopped the agents).
  void run();
  // Thread-safe; may come before run() or during it.
  void requestStop();

  // Thread-safe snapshots for observers (tests, status lines).
  std::vector<AgentStatus> agents() const;
  int routerPort() const { return router_port_.load(); }
  // How many times the router's agent lists were replaced after it started.
  int routerUpdates() const { return router_updates_.load(); }
  // Why the last change of the cluster file was not applied; empty once a
  // change was.
  std::string fileError() const;
  // The planner's last decision for each autoscaled pool (empty before the
  // first round), its Events (the newest kPlannerEventsKept) and its metrics
  // in the Prometheus text format (plannerMetricsText).
  std::vector<PoolPlannerStatus> plannerStatus() const;
  std::vector<PlannerEventRecord> plannerEvents() const;
  std::string plannerMetrics() const;
  static constexpr size_t kPlannerEventsKept = 100;
  // What GET /metrics on the metrics port serves: plannerMetrics() followed
  // by tandem_local_pool_replicas{pool,kind} (the replicas local mode runs
  // each pool with, the planner's for autoscaled pools) and
  // tandem_local_agents{pool,kind,state} (agents per state).
  std::string localModeMetrics() const;
  // The bound metrics port once run() serves it, else 0.
  int metricsPort() const { return metrics_port_.load(); }
  // After run(): a fetch the stop cancelled is still running on its thread
  // (a call to the Hub ends at its answer or timeout). The process should
  // then end without running its exit handlers (std::_Exit), which would
  // tear down what that thread still uses (OpenSSL's state).
  bool fetchStillRunning() const {
    return std::any_of(cancelled_fetches_.begin(), cancelled_fetches_.end(),
                       [](const auto& fetch) { return !fetch->done; });
  }

 private:
  void publish(const AgentSupervisor& supervisor);
  bool waitForStop(std::chrono::milliseconds timeout);
  // A file's pools with their hf:// sources fetched, on a thread of its own
  // that shares only this: a download takes minutes, and the owner's loop
  // keeps supervising the agents, serving the router and hearing a stop
  // meanwhile. On a stop the fetch is cancelled and left to end by itself
  // (a call to the Hub ends at its answer or timeout).
  struct PendingFetch {
    std::atomic<bool> done{false};
    std::atomic<bool> cancel{false};
    spec::ClusterSpec cluster;  // its pools pointed at what was fetched, once done
    std::string error;          // why the fetch failed, once done
  };
  std::shared_ptr<PendingFetch> startFetch(spec::ClusterSpec cluster,
                                           const std::string& file) const;
  void reloadIfChanged(AgentSupervisor& supervisor, const spec::RouterSpec& running_router);
  void applyCluster(AgentSupervisor& supervisor, const spec::RouterSpec& running_router,
                    spec::ClusterSpec cluster);
  spec::RouterSpec routerSpecFor(const spec::ClusterSpec& cluster) const;
  // Stops the router (its grace for in-flight requests) and destroys it, so
  // that its connections to the agents close and they abort what nobody
  // reads any more, then stops the agents.
  void shutdown(AgentSupervisor& supervisor, std::unique_ptr<RouterHandle> router);
  // The file's pools as local mode runs them: autoscaled pools keep the
  // planner's replicas unless the file changed theirs.
  void adoptPools(const std::vector<spec::PoolSpec>& file_pools);
  // Gives every pool without a KV secret of its own
  // (kvTransfer.extraConfig.secret, a non-empty TANDEM_KV_SECRET in its env
  // or in this process's environment) this run's random one as
  // TANDEM_KV_SECRET in its env, so that agents follow only the descriptors
  // their peers and the router signed. The same secret for the whole run,
  // reloads included. Throws tandem::Error when the pools would not share
  // one secret (requireOneKvSecret, local_mode.cpp).
  void secureKvTransfer(std::vector<spec::PoolSpec>& pools) const;
  void runPlanner(AgentSupervisor& supervisor);
  // Binds the metrics port (throws tandem::Error when it cannot) and serves
  // it on a thread until stopMetricsServer().
  void startMetricsServer();
  void stopMetricsServer();

  LocalModeOptions options_;
  RouterFactory router_factory_;
  // The Router document's shutdownTimeoutSeconds: the router's grace when
  // local mode ends (else the supervisor's stop timeout).
  std::optional<double> router_shutdown_timeout_s_;
  std::string file_text_;                  // the last text read, applied or not
  const std::string generated_kv_secret_;  // see secureKvTransfer
  // Owner thread only: the pools given to the supervisor, each pool's
  // replicas as the file last said, and pools whose file replicas changed
  // since the planner's last round.
  std::vector<spec::PoolSpec> pools_;
  std::map<std::string, int64_t> file_replicas_;
  std::set<std::string> replicas_changed_in_file_;
  LocalPlanner planner_;

  mutable std::mutex mutex_;
  std::condition_variable stop_requested_cv_;
  bool stop_requested_ = false;
  std::vector<AgentStatus> agents_;
  std::map<std::string, int64_t> restarts_by_pool_;
  std::string file_error_;
  std::vector<PoolPlannerStatus> planner_status_;
  std::deque<PlannerEventRecord> planner_events_;
  std::vector<spec::PoolSpec> published_pools_;  // a copy of pools_ for observers
  std::unique_ptr<server::HttpService> metrics_server_;
  std::atomic<int> metrics_port_{0};
  std::atomic<int> router_port_{0};
  std::atomic<int> router_updates_{0};
  std::shared_ptr<PendingFetch> pending_fetch_;  // an edit's fetch; owner thread only
  // Fetches cancelled (by the stop, or by a newer edit) that may still be
  // running on their threads.
  std::vector<std::shared_ptr<PendingFetch>> cancelled_fetches_;
};

}  // namespace tandem::local
