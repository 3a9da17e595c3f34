// `tandem-operator local -f cluster.yaml`: the pools of a cluster file as
// local agent processes (AgentSupervisor) behind one router. Life cycle:
// parse the file (a bad file stops here, naming the field), start every
// agent and wait until all are ready (one that exits first stops everything
// with its reason), start the router with them, then keep the router's agent
// lists current as agents crash, restart and scale, re-read the file when it
// changes, and on requestStop() stop the router, then the agents (SIGTERM,
// SIGKILL after the stop timeout). See docs/local-mode.md.
//
// The router is reached through RouterHandle, so that this library does not
// depend on the router's; tandem-operator binds it to tandem::router::Router.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "operator/local/agent_supervisor.h"
#include "operator/local/cluster_spec.h"

namespace tandem::local {

// A running router as local mode uses it.
class RouterHandle {
 public:
  virtual ~RouterHandle() = default;
  virtual int port() const = 0;
  virtual void setAgents(std::vector<AgentAddress> prefill, std::vector<AgentAddress> decode) = 0;
  // Stops accepting and lets in-flight requests finish until the grace period.
  virtual void stop(double grace_seconds) = 0;
};

// Starts a router for `spec` with its first agents; throws tandem::Error
// when it cannot (e.g. the port is taken).
using RouterFactory = std::function<std::unique_ptr<RouterHandle>(
    const RouterSpec& spec, std::vector<AgentAddress> prefill, std::vector<AgentAddress> decode)>;

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

 private:
  void publish(const AgentSupervisor& supervisor);
  bool waitForStop(std::chrono::milliseconds timeout);
  void reloadIfChanged(AgentSupervisor& supervisor, const RouterSpec& running_router);
  RouterSpec routerSpecFor(const ClusterSpec& cluster) const;
  void shutdown(AgentSupervisor& supervisor, RouterHandle* router);

  LocalModeOptions options_;
  RouterFactory router_factory_;
  std::string file_text_;  // the last text read, applied or not

  mutable std::mutex mutex_;
  std::condition_variable stop_requested_cv_;
  bool stop_requested_ = false;
  std::vector<AgentStatus> agents_;
  std::string file_error_;
  std::atomic<int> router_port_{0};
  std::atomic<int> router_updates_{0};
};

}  // namespace tandem::local
