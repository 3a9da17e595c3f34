// The Kubernetes controller: informers on PrefillPools, DecodePools and
// Routers and on the Deployments, Services and Pods labelled
// app.kubernetes.io/managed-by=tandem-operator; a rate-limited work queue of
// owner keys; worker threads that run the Reconciler; optional Lease leader
// election.
//
// An owner's event enqueues its key; a child's event enqueues its owner's
// (from its controller ownerReference, or the tandem.dev/pool /
// tandem.dev/router labels for pods); a pool added or deleted enqueues the
// Routers of its namespace. A failed reconcile is retried with per-key
// exponential backoff; a successful one resets it.
//
// Pools with spec.autoscaling are scaled by the SLA planner, on a thread of
// its own that runs a round every planner_interval while this replica leads
// (HPAs are listed from the API each round).
//
// Only the leader reconciles: workers wait while this replica does not lead,
// every write is refused the moment leadership is lost (ApiWriter), and on
// becoming leader every known owner is enqueued. stop() releases the Lease.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/api_writer.h"
#include "operator/controller/controller_metrics.h"
#include "operator/controller/event_recorder.h"
#include "operator/controller/pool_autoscaler.h"
#include "operator/controller/reconciler.h"
#include "operator/k8s/api_client.h"
#include "operator/k8s/informer.h"
#include "operator/k8s/leader_election.h"
#include "operator/k8s/work_queue.h"

namespace tandem::controller {

struct ControllerOptions {
  std::string ns;  // the namespace watched; "" for all namespaces
  int workers = 2;
  WorkloadDefaults defaults;
  bool leader_elect = false;
  std::string leader_election_namespace = "default";
  std::string leader_election_id = "tandem-operator";
  std::string identity;  // "<hostname>_<random>"; generated when empty
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{60000};
  int watch_timeout_seconds = 300;
  // The SLA planner (pool_autoscaler.h) for pools with spec.autoscaling:
  // how often it decides (0: never), and where it reads metrics (null:
  // straight from the pods).
  std::chrono::milliseconds planner_interval{15000};
  std::unique_ptr<PodMetricsSource> planner_metrics;
};

// "<hostname>_<16 random hex digits>".
std::string defaultIdentity();

class Controller {
 public:
  Controller(k8s::ApiClient& client, ControllerOptions options);
  ~Controller();  // stop()
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Starts informers, the election (or leads at once without it) and workers.
  void start();
  // Stops workers, releases the Lease when leading, stops informers.
  void stop();

  bool waitForSync(std::chrono::milliseconds timeout) const;
  bool synced() const;
  bool isLeader() const { return leading_.load(); }
  size_t queueDepth() const { return queue_.depth(); }
  ControllerMetrics& metrics() { return metrics_; }
  // Refreshes the gauges and counters read from the queue and informers, and
  // renders the metrics text.
  std::string renderMetrics();

  // One reconcile of `ns/name`, on the caller's thread (tests, tools). Reads
  // pods and pools from the caches once started, from the API before.
  k8s::Result<k8s::Done> reconcileNow(OwnerKind kind, const std::string& ns,
                                      const std::string& name);

 private:
  void enqueue(OwnerKind kind, const std::string& ns, const std::string& name);
  void enqueueAll();
  void enqueueRouters(const std::string& ns);
  void onOwnerEvent(OwnerKind kind, k8s::EventType type, const nlohmann::json& object);
  void onChildEvent(const nlohmann::json& object);
  void setLeading(bool leading);
  void workerLoop();
  void plannerLoop();
  void plannerRound(double now_seconds);
  ReconcilerOptions reconcilerOptions();
  std::vector<nlohmann::json> cachedPods(const std::string& ns, const nlohmann::json& labels) const;
  std::vector<std::string> cachedPoolNames(const std::string& ns, OwnerKind kind) const;

  k8s::ApiClient& client_;
  ControllerOptions options_;
  PoolReplicaTable pool_replicas_;  // before metrics_, which reads it
  ControllerMetrics metrics_;
  // leading_: this replica holds the Lease or may still write (the leader
  // gauge); reconciling_: its workers and planner act. Both are set when it
  // leads; reconciling_ is cleared first when it stops, leading_ once its
  // writes in flight are answered.
  std::atomic<bool> leading_{false};
  std::atomic<bool> reconciling_{false};
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  ApiWriter writer_;
  EventRecorder events_;
  Reconciler reconciler_;
  Reconciler cache_reconciler_;
  k8s::WorkQueue queue_;
  std::vector<std::unique_ptr<k8s::Informer>> owner_informers_;  // by OwnerKind
  std::vector<std::unique_ptr<k8s::Informer>> child_informers_;  // deployments, services, pods
  // The election has a client of its own whose calls time out well within
  // the renew deadline: a leader whose renewal hangs must notice in time.
  std::unique_ptr<k8s::ApiClient> election_client_;
  std::unique_ptr<k8s::LeaderElector> elector_;
  std::vector<std::thread> workers_;
  std::unique_ptr<PoolAutoscaler> autoscaler_;
  std::thread planner_thread_;
  std::mutex leading_mutex_;
  std::condition_variable leading_changed_;
};

}  // namespace tandem::controller
