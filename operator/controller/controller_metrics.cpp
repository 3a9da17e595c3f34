#include "operator/controller/controller_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>

#include "common/http/http_connection.h"
#include "common/status.h"

namespace tandem::controller {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

namespace {

constexpr const char* kReplicaStates[] = {"desired", "updated", "ready", "available"};

prometheus::Labels poolLabels(const PoolKey& pool, const char* state) {
  return {{"namespace", std::get<0>(pool)},
          {"kind", std::get<1>(pool)},
          {"pool", std::get<2>(pool)},
          {"state", state}};
}

int64_t countOf(const PoolReplicas& replicas, const std::string& state) {
  if (state == "desired") return replicas.desired;
  if (state == "updated") return replicas.updated;
  if (state == "ready") return replicas.ready;
  return replicas.available;
}

}  // namespace

void PoolReplicaTable::set(const PoolKey& pool, const PoolReplicas& replicas) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_) pools_[pool] = replicas;
}

void PoolReplicaTable::remove(const PoolKey& pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  pools_.erase(pool);
}

void PoolReplicaTable::setOpen(bool open) {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = open;
  if (!open) pools_.clear();
}

std::map<PoolKey, PoolReplicas> PoolReplicaTable::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pools_;
}

ControllerMetrics::ControllerMetrics(PoolReplicaTable& pools)
    : pools_(pools), registry_(std::make_shared<prometheus::Registry>()) {
  reconciles_ = &BuildCounter()
                     .Name("tandem_operator_reconciles_total")
                     .Help("Reconciles by kind (PrefillPool, DecodePool, Router) and result.")
                     .Register(*registry_);
  reconcile_errors_ = &BuildCounter()
                           .Name("tandem_operator_reconcile_errors_total")
                           .Help("Reconciles that failed and were retried with backoff, by kind.")
                           .Register(*registry_);
  for (const char* kind : {"PrefillPool", "DecodePool", "Router"}) {
    reconciles_->Add({{"kind", kind}, {"result", "success"}});
    reconciles_->Add({{"kind", kind}, {"result", "error"}});
    reconcile_errors_->Add({{"kind", kind}});
  }
  watch_restarts_ = &BuildCounter()
                         .Name("tandem_operator_watch_restarts_total")
                         .Help("Watches started again after they ended, by resource.")
                         .Register(*registry_);
  relists_ = &BuildCounter()
                  .Name("tandem_operator_relists_total")
                  .Help("Full lists after a watch's resourceVersion expired (410), by resource.")
                  .Register(*registry_);
  queue_depth_ = &BuildGauge()
                      .Name("tandem_operator_workqueue_depth")
                      .Help("Keys waiting in the work queue (ready or delayed).")
                      .Register(*registry_)
                      .Add({});
  is_leader_ =
      &BuildGauge()
           .Name("tandem_operator_is_leader")
           .Help("1 while this replica holds the leader Lease (always 1 without election).")
           .Register(*registry_)
           .Add({});
  api_writes_ =
      &BuildCounter()
           .Name("tandem_operator_api_writes_total")
           .Help(
               "Writes the Kubernetes API server accepted (create, apply, patch, update, delete).")
           .Register(*registry_)
           .Add({});
  pool_replicas_ = &BuildGauge()
                        .Name("tandem_operator_pool_replicas")
                        .Help(
                            "Replicas of each PrefillPool and DecodePool: desired "
                            "(spec.replicas), updated, ready and available (its Deployment).")
                        .Register(*registry_);
}

ControllerMetrics::~ControllerMetrics() = default;

void ControllerMetrics::syncPoolReplicas() {
  const std::map<PoolKey, PoolReplicas> pools = pools_.snapshot();
  for (const PoolKey& gone : rendered_pools_) {
    if (pools.count(gone)) continue;
    for (const char* state : kReplicaStates) {
      const prometheus::Labels labels = poolLabels(gone, state);
      if (pool_replicas_->Has(labels)) pool_replicas_->Remove(&pool_replicas_->Add(labels));
    }
  }
  rendered_pools_.clear();
  for (const auto& [pool, replicas] : pools) {
    for (const char* state : kReplicaStates) {
      pool_replicas_->Add(poolLabels(pool, state))
          .Set(static_cast<double>(countOf(replicas, state)));
    }
    rendered_pools_.insert(pool);
  }
}

void ControllerMetrics::reconciled(const std::string& kind, bool success) {
  std::lock_guard<std::mutex> lock(mutex_);
  reconciles_->Add({{"kind", kind}, {"result", success ? "success" : "error"}}).Increment();
  if (!success) reconcile_errors_->Add({{"kind", kind}}).Increment();
}

void ControllerMetrics::apiWrite() {
  std::lock_guard<std::mutex> lock(mutex_);
  api_writes_->Increment();
}

void ControllerMetrics::setLeader(bool leader) {
  std::lock_guard<std::mutex> lock(mutex_);
  is_leader_->Set(leader ? 1 : 0);
}

void ControllerMetrics::setQueueDepth(size_t depth) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_depth_->Set(static_cast<double>(depth));
}

void ControllerMetrics::setWatchTotals(const std::string& resource, uint64_t watch_restarts,
                                       uint64_t relists) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& [seen_restarts, seen_relists] = watch_seen_[resource];
  prometheus::Counter& restarts = watch_restarts_->Add({{"resource", resource}});
  prometheus::Counter& lists = relists_->Add({{"resource", resource}});
  if (watch_restarts > seen_restarts)
    restarts.Increment(static_cast<double>(watch_restarts - seen_restarts));
  if (relists > seen_relists) lists.Increment(static_cast<double>(relists - seen_relists));
  seen_restarts = std::max(seen_restarts, watch_restarts);
  seen_relists = std::max(seen_relists, relists);
}

std::string ControllerMetrics::render() {
  std::lock_guard<std::mutex> lock(mutex_);
  syncPoolReplicas();
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

// The HTTP front the agents and the router serve with: a connection that
// sends nothing holds a coroutine, never a thread (a pool of threads, each
// held by an idle connection until its read timeout, kept the kubelet's
// probes waiting).
MetricsServer::MetricsServer(const std::string& host, int port, std::function<std::string()> render,
                             std::function<bool()> ready)
    : http_(std::make_unique<server::HttpService>(server::HttpLimits{}, /*io_threads=*/1,
                                                  /*worker_threads=*/1)) {
  http_->get("/metrics", [render](const server::HttpRequest&, server::HttpResponse& res) {
    res.set_content(render(), "text/plain; version=0.0.4");
  });
  http_->get("/healthz", [](const server::HttpRequest&, server::HttpResponse& res) {
    res.set_content("ok\n", "text/plain");
  });
  http_->get("/readyz", [ready](const server::HttpRequest&, server::HttpResponse& res) {
    const bool is_ready = ready();
    res.status = is_ready ? 200 : 503;
    res.set_content(is_ready ? "ok\n" : "caches not synced\n", "text/plain");
  });
  try {
    port_ = http_->bind(host, port, kMetricsBacklog);
  } catch (const Error& e) {
    throw Error(std::string("--metrics-port: ") + e.what());
  }
  http_->start();
}

MetricsServer::~MetricsServer() {
  http_->stop();
  http_->join();
}

}  // namespace tandem::controller
