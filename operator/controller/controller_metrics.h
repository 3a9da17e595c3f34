// The controller's Prometheus metrics and the small HTTP server that serves
// them with its probes:
//
//   tandem_operator_reconciles_total{kind,result}   result: success | error
//   tandem_operator_reconcile_errors_total{kind}
//   tandem_operator_workqueue_depth
//   tandem_operator_watch_restarts_total{resource}
//   tandem_operator_relists_total{resource}
//   tandem_operator_is_leader
//   tandem_operator_api_writes_total
//   tandem_operator_pool_replicas{namespace,pool,kind,state}
//                                   state: desired | updated | ready | available
//
// Pool replica counts come from a PoolReplicaTable that reconciles fill in
// (reconciler.h): each PrefillPool/DecodePool reconcile records its
// spec.replicas and its Deployment's status counts, and a pool found deleted
// is forgotten, so its series go away at the next render.
//
// GET /metrics (text format 0.0.4), /healthz (200 while the process runs),
// /readyz (200 once the caches are synced, else 503). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
template <typename T>
class Family;
}  // namespace prometheus

namespace tandem::server {
class HttpService;
}

namespace tandem::controller {

// Replica counts of one pool as its last reconcile saw them.
struct PoolReplicas {
  int64_t desired = 0;    // spec.replicas
  int64_t updated = 0;    // Deployment status.updatedReplicas
  int64_t ready = 0;      // Deployment status.readyReplicas
  int64_t available = 0;  // Deployment status.availableReplicas
  bool operator==(const PoolReplicas&) const = default;
};

// (namespace, kind, pool name); kind is "PrefillPool" or "DecodePool".
using PoolKey = std::tuple<std::string, std::string, std::string>;

// The replica counts of every pool, written by reconciles and read when
// /metrics is rendered. Thread-safe. A controller owns one and shares it
// between its reconcilers and its metrics.
class PoolReplicaTable {
 public:
  // Ignored while the table is closed.
  void set(const PoolKey& pool, const PoolReplicas& replicas);
  void remove(const PoolKey& pool);
  // Closed: empty, and a set() of a reconcile still running (begun while
  // this replica led) no longer brings a pool back; open again: sets count.
  void setOpen(bool open);
  std::map<PoolKey, PoolReplicas> snapshot() const;

 private:
  mutable std::mutex mutex_;
  bool open_ = true;
  std::map<PoolKey, PoolReplicas> pools_;
};

class ControllerMetrics {
 public:
  explicit ControllerMetrics(PoolReplicaTable& pools);
  ~ControllerMetrics();

  void reconciled(const std::string& kind, bool success);
  void apiWrite();
  void setLeader(bool leader);
  void setQueueDepth(size_t depth);
  // Informer totals (monotonic); the counters follow them.
  void setWatchTotals(const std::string& resource, uint64_t watch_restarts, uint64_t relists);
  // The text format; pool replica series follow the table (series of pools
  // no longer in it are removed).
  std::string render();

 private:
  void syncPoolReplicas();

  std::mutex mutex_;
  PoolReplicaTable& pools_;
  prometheus::Family<prometheus::Gauge>* pool_replicas_;
  std::set<PoolKey> rendered_pools_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* reconciles_;
  prometheus::Family<prometheus::Counter>* reconcile_errors_;
  prometheus::Family<prometheus::Counter>* watch_restarts_;
  prometheus::Family<prometheus::Counter>* relists_;
  prometheus::Gauge* queue_depth_;
  prometheus::Gauge* is_leader_;
  prometheus::Counter* api_writes_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> watch_seen_;
};

// Serves /metrics, /healthz and /readyz on host:port (port 0: any free one).
class MetricsServer {
 public:
  // Binds at once; throws tandem::Error when the port cannot be bound.
  MetricsServer(const std::string& host, int port, std::function<std::string()> render,
                std::function<bool()> ready);
  ~MetricsServer();  // stops
  int port() const { return port_; }

 private:
  static constexpr int kMetricsBacklog = 128;
  std::unique_ptr<server::HttpService> http_;
  int port_ = 0;
};

}  // namespace tandem::controller
