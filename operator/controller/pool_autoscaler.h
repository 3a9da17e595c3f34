// The SLA planner in the Kubernetes controller: for every PrefillPool and
// DecodePool with spec.autoscaling, one planner::PoolPlanner and one
// planner::MetricWindow. Each round (the controller's planner thread, every
// --planner-interval while this replica leads):
//
//   1. reads the pool's ready pods' metrics (pod_metrics_source.h) into the
//      pool's window;
//   2. observes the pool: spec.replicas, ready pods, pods Pending because
//      they cannot be scheduled and for how long (their PodScheduled
//      condition's lastTransitionTime), and whether an autoscaling/v2
//      HorizontalPodAutoscaler's scaleTargetRef names the pool;
//   3. asks the planner for a Decision and applies it: before a scale-down,
//      each ready pod's load (running + waiting requests, from its newest
//      scrape) is written as its pod-deletion-cost annotation, so the
//      ReplicaSet removes the least busy agents; the replicas are
//      written through the pool's scale subresource (as an HPA writes them),
//      its Event is recorded on the pool, and its ScalingConflict and
//      ScalingLimited conditions are kept here for the pool's reconcile to
//      put in status (the reconciler is status' only writer; a change of
//      them enqueues the pool).
//
// A pool whose spec.autoscaling does not parse gets a Warning Event
// (InvalidAutoscaling) once per distinct error and is left alone. A pool that
// loses spec.autoscaling, or is deleted, is forgotten with its conditions.
//
// Time: `now_seconds` is monotonic (the planner's clock); Pending durations
// are measured on the wall clock (`wall_now`), as the API's timestamps are.
// Thread-safe: round() runs on one thread; conditionsFor() and
// metricsText() may be called from any.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "operator/controller/api_writer.h"
#include "operator/controller/event_recorder.h"
#include "operator/controller/pod_metrics_source.h"
#include "operator/controller/reconciler.h"
#include "operator/planner/metric_window.h"
#include "operator/planner/planner.h"
#include "operator/planner/planner_metrics.h"

namespace tandem::controller {

// One pool as the controller's caches show it at the time of a round.
struct AutoscaledPool {
  OwnerKind kind = OwnerKind::kPrefillPool;
  nlohmann::json object;             // the PrefillPool / DecodePool
  std::vector<nlohmann::json> pods;  // its pods (selected by its labels)
  bool hpa_present = false;          // an HPA's scaleTargetRef names it
};

// The names of the pools that HPAs in `hpas` (autoscaling/v2
// HorizontalPodAutoscaler objects) target, as "PrefillPool/NAME" or
// "DecodePool/NAME" (scaleTargetRef kind and name, apiVersion of group
// tandem.dev).
std::vector<std::string> hpaTargets(const std::vector<nlohmann::json>& hpas);

// Seconds each of `pods` has been Pending because it cannot be scheduled
// (phase Pending and condition PodScheduled False), at `now`.
std::vector<double> unschedulableSeconds(const std::vector<nlohmann::json>& pods,
                                         std::chrono::system_clock::time_point now);

// The annotation the ReplicaSet controller ranks a Deployment's ready pods
// by when it scales down: the lowest cost goes first (Kubernetes 1.22+,
// feature PodDeletionCost, on by default).
inline constexpr const char* kPodDeletionCost = "controller.kubernetes.io/pod-deletion-cost";
// The cost written for a pod with `requests` running and waiting: that
// count, rounded, within the annotation's int32.
std::string podDeletionCost(double requests);

class PoolAutoscaler {
 public:
  PoolAutoscaler(ApiWriter& writer, EventRecorder& events, std::unique_ptr<PodMetricsSource> source,
                 std::function<void(OwnerKind, const std::string& ns, const std::string& name)>
                     on_conditions_changed,
                 std::function<std::chrono::system_clock::time_point()> wall_now =
                     std::chrono::system_clock::now);

  // One round over every pool the caches hold (pools without
  // spec.autoscaling are skipped, and forgotten if they had it before).
  void round(double now_seconds, const std::vector<AutoscaledPool>& pools);

  // The pool's ScalingConflict and ScalingLimited conditions (metav1
  // Condition objects without lastTransitionTime); empty while it is not
  // planned.
  std::vector<nlohmann::json> conditionsFor(OwnerKind kind, const std::string& ns,
                                            const std::string& name) const;
  // tandem_planner_* (planner_metrics.h) for the planned pools.
  std::string metricsText() const;

 private:
  struct Pool {
    OwnerKind kind;
    std::string ns;
    std::string name;
    planner::PoolPlanner planner;
    planner::MetricWindow window;
  };

  void plan(double now_seconds, const AutoscaledPool& input, const std::string& key);
  void applyDecision(const Owner& owner, OwnerKind kind, const planner::Decision& decision);
  // Before a scale-down: each of `pods` that `window` has a scrape of gets
  // its running + waiting requests as its kPodDeletionCost (written only
  // where it differs), so that the ReplicaSet removes the least busy agents
  // and the fewest requests are handed over or lost.
  void setDeletionCosts(const std::string& ns, const std::vector<nlohmann::json>& pods,
                        const planner::MetricWindow& window, const planner::MetricNames& names);

  ApiWriter& writer_;
  EventRecorder& events_;
  std::unique_ptr<PodMetricsSource> source_;
  std::function<void(OwnerKind, const std::string&, const std::string&)> on_conditions_changed_;
  std::function<std::chrono::system_clock::time_point()> wall_now_;
  std::map<std::string, Pool> pools_;  // by "Kind/ns/name"; round()'s thread only

  mutable std::mutex mutex_;  // guards the two below
  std::map<std::string, std::vector<nlohmann::json>> conditions_;
  std::map<std::string, planner::PlannerMetricsSample> samples_;
};

}  // namespace tandem::controller
