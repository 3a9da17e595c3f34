// PoolPlanner: the SLA planner's decisions for one PrefillPool or DecodePool.
// Each call to decide() takes what the caller observed (the pool's replicas,
// its Pending replicas, whether an HorizontalPodAutoscaler targets it,
// whether someone else changed its replicas) and the pool's windowed metrics
// (metric_window.h), and returns the replicas the pool should have, whether
// to write them through the scale subresource, the Event to record and the
// pool's ScalingConflict / ScalingLimited conditions. docs/planner.md has the
// formulas.
//
// The planner keeps state across calls (its recommendations over the
// stabilisation windows, a manual change it is respecting, a capacity limit
// it is honouring); time is whatever the caller passes in `now_seconds`
// (monotonic seconds), so tests run it without a clock. It never writes
// anything itself: the Kubernetes controller and local mode apply a Decision
// whose `write` is true and record its `event`. A write that fails needs no
// report: the next observation shows the old replicas, which the planner
// does not mistake for a manual change.
//
// Not thread-safe: one owner per pool.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "operator/planner/autoscaling_spec.h"
#include "operator/planner/metric_window.h"

namespace tandem::planner {

// Condition types and the reasons the planner gives them.
inline constexpr const char* kScalingConflict = "ScalingConflict";
inline constexpr const char* kScalingLimited = "ScalingLimited";

// What the caller saw of the pool at `now_seconds`.
struct PoolObservation {
  double now_seconds = 0;
  // The pool's spec.replicas (the scale subresource's replicas).
  int spec_replicas = 0;
  int ready_replicas = 0;
  // For each replica that is Pending because it cannot be scheduled: how
  // long it has been Pending, in seconds.
  std::vector<double> pending_seconds;
  // An HorizontalPodAutoscaler's scaleTargetRef names this pool.
  bool hpa_present = false;
  // Set when the caller knows that spec.replicas was changed by someone else
  // since the previous call (e.g. the last manager of spec.replicas is not
  // the planner). The planner also notices by itself a spec.replicas that
  // differs from both the previous observation and its own last write.
  bool replicas_changed_externally = false;
};

struct PlannerCondition {
  std::string type;  // kScalingConflict or kScalingLimited
  bool status = false;
  std::string reason;
  std::string message;
};

struct PlannerEvent {
  std::string type;  // "Normal" or "Warning"
  std::string reason;
  std::string message;
};

// The values a decision exports as metrics (docs/planner.md#metrics).
struct DecisionMetrics {
  int desired_replicas = 0;
  // The observed latency quantile (TTFT on prefill, ITL on decode); nullopt
  // without requests in the window.
  std::optional<double> observed_seconds;
  double target_seconds = 0;
  double quantile = 0;
};

struct Decision {
  // The replicas the pool should have now.
  int desired_replicas = 0;
  // Write desired_replicas through the scale subresource (false when it
  // equals the observed spec.replicas, and always false under a conflict).
  bool write = false;
  // What the metrics alone ask for, clamped to [minReplicas, maxReplicas],
  // before stabilisation, maxStep and a capacity limit.
  int recommended_replicas = 0;
  // One word for the outcome (ScaledUp, ScaledDown, ManualScaleOverwritten,
  // ManualScaleRespected, ScalingConflict, ScalingLimited, MetricsUnavailable,
  // Stabilizing, Steady) and a sentence on why, with the figures.
  std::string reason;
  std::string message;
  // The Event to record, when this decision is one (a write, a new conflict,
  // a manual change first seen); holds that change nothing have none.
  std::optional<PlannerEvent> event;
  PlannerCondition scaling_conflict;
  PlannerCondition scaling_limited;
  DecisionMetrics metrics;
};

class PoolPlanner {
 public:
  PoolPlanner(std::string pool_name, PoolKind kind, AutoscalingSpec spec);

  // A changed spec.autoscaling; the recommendations seen so far are kept.
  void setSpec(AutoscalingSpec spec) { spec_ = std::move(spec); }
  const AutoscalingSpec& spec() const { return spec_; }
  PoolKind kind() const { return kind_; }

  // One decision. Calls must come with non-decreasing now_seconds.
  Decision decide(const PoolObservation& pool, const WindowedValues& metrics);

 private:
  struct Recommendation {
    double time = 0;
    int replicas = 0;
  };
  struct CapacityLimit {
    int ceiling = 0;
    double until = 0;
    std::string message;
  };
  struct ManualChange {
    double since = 0;
    int replicas = 0;
  };

  int recommend(int current, const WindowedValues& metrics, std::string& why) const;
  int stabilize(int current, double now) const;
  double manualWindowSeconds() const;
  // Fills `decision` (its desired and recommended replicas set) as a change
  // from `current`: ScaledUp or ScaledDown, or ManualScaleOverwritten after
  // a manual change's window, its message (`why`, the maxStep that bounded
  // it) and its Event.
  void describeScale(Decision& decision, const std::string& name, const std::string& why,
                     int current) const;
  Decision hold(const PoolObservation& pool, const WindowedValues& metrics, std::string reason,
                std::string message) const;

  std::string pool_name_;
  PoolKind kind_;
  AutoscalingSpec spec_;

  bool started_ = false;
  int previous_spec_replicas_ = 0;
  std::optional<int> last_written_;
  // Counts as a recommendation for scale-down only: after start and after a
  // conflict ends, the pool is not shrunk before one scale-down window.
  std::optional<Recommendation> floor_;
  std::vector<Recommendation> history_;
  bool in_conflict_ = false;
  std::optional<CapacityLimit> limit_;
  // Limits in a row without the pool growing past the last ceiling; each
  // one holds twice as long as the one before.
  int consecutive_limits_ = 0;
  int last_ceiling_ = 0;
  std::optional<ManualChange> manual_;
  // When spec.replicas last changed (by the planner or anyone): scaling down
  // waits until a whole window has been observed at the new size.
  std::optional<double> resized_at_;
};

}  // namespace tandem::planner
