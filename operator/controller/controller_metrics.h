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
//
// GET /metrics (text format 0.0.4), /healthz (200 while the process runs),
// /readyz (200 once the caches are synced, else 503). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
template <typename T>
class Family;
}  // namespace prometheus

namespace httplib {
class Server;
}

namespace tandem::controller {

class ControllerMetrics {
 public:
  ControllerMetrics();
  ~ControllerMetrics();

  void reconciled(const std::string& kind, bool success);
  void apiWrite();
  void setLeader(bool leader);
  void setQueueDepth(size_t depth);
  // Informer totals (monotonic); the counters follow them.
  void setWatchTotals(const std::string& resource, uint64_t watch_restarts, uint64_t relists);
  std::string render();

 private:
  std::mutex mutex_;
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
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace tandem::controller
