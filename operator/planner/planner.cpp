#include "operator/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

namespace tandem::planner {
namespace {

// As the HPA's default: a ratio within 10% of the target changes nothing,
// so that noise around the target does not move replicas back and forth.
constexpr double kTolerance = 0.1;
// The longest a capacity limit holds before the planner asks again.
constexpr double kMaxLimitSeconds = 3600;

std::string fixed(double value, int digits = 3) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*g", digits, value);
  return text;
}

std::string percentile(double quantile) {
  std::string text = "p";
  text += fixed(quantile * 100, 4);
  return text;
}

// ceil(x) as a replica count, saturated: a latency 1e10 times its target
// asks for as many replicas as there may be, where the int cast overflowed
// to a negative count that lost to every other signal. A tiny epsilon keeps
// 3 * (4/3) from rounding up to 5.
int ceilReplicas(double x) {
  constexpr double kMost = 1 << 30;  // far above any maxReplicas
  if (!(x < kMost)) return static_cast<int>(kMost);
  return static_cast<int>(std::ceil(x - 1e-9));
}

// ceil(current * ratio), or current when the ratio is within the tolerance.
int proportional(int current, double ratio) {
  if (std::abs(ratio - 1) <= kTolerance) return current;
  return ceilReplicas(std::max(current, 1) * ratio);
}

// The quantile of a window's latencies taken as the service time, the latency
// a request has without queueing (a prefill step's floor, one decode step).
constexpr double kServiceQuantile = 0.1;

// The fewest replicas, from `proportional_replicas` up to `current`, that a
// queueing estimate says keep the latency within `target`. With one queue
// per replica, latency = service / (1 - utilisation); the observed latency
// and service time give the utilisation at `current`, and m replicas would
// run at utilisation * current / m. nullopt when the estimate allows the
// proportional count (no queueing seen, or no service time).
std::optional<int> queueingFloor(int current, int proportional_replicas, double observed,
                                 double quantile, double target,
                                 const std::vector<HistogramBucket>& buckets, double* utilisation) {
  const std::optional<double> service = histogramQuantile(kServiceQuantile, buckets);
  if (!service || !(*service > 0) || !(observed > *service)) return std::nullopt;
  // Both quantiles in the first bucket, whose lower bound (0) is no
  // measurement: the spread between them is interpolation, not queueing.
  // (In any later bucket the service time is at least its lower bound, so
  // the utilisation is bounded by the bucket's width: a conservative guess.)
  if (histogramQuantileBucket(kServiceQuantile, buckets) == size_t{0} &&
      histogramQuantileBucket(quantile, buckets) == size_t{0}) {
    return std::nullopt;
  }
  const double load = 1.0 - *service / observed;  // utilisation at `current`
  *utilisation = load;
  int replicas = std::max(proportional_replicas, 1);
  for (; replicas < current; ++replicas) {
    const double next = load * current / replicas;
    if (next < 1.0 && *service / (1.0 - next) <= target) break;
  }
  if (replicas <= proportional_replicas) return std::nullopt;
  return replicas;
}

int perReplica(double total, double target_per_replica) {
  return ceilReplicas(total / target_per_replica);
}

}  // namespace

PoolPlanner::PoolPlanner(std::string pool_name, PoolKind kind, AutoscalingSpec spec)
    : pool_name_(std::move(pool_name)), kind_(kind), spec_(std::move(spec)) {}

double PoolPlanner::manualWindowSeconds() const {
  return std::max(spec_.scale_up_stabilization_seconds, spec_.scale_down_stabilization_seconds);
}

int PoolPlanner::recommend(int current, const WindowedValues& metrics, std::string& why) const {
  const bool prefill = kind_ == PoolKind::kPrefill;
  const char* signal = prefill ? "TTFT" : "ITL";
  const double target = spec_.targetSeconds(kind_);
  int best = 0;
  const auto consider = [&](int replicas, const std::string& text) {
    if (replicas > best || why.empty()) {
      best = std::max(best, replicas);
      why = text;
    }
  };
  if (metrics.latency_quantile && metrics.latency_count > 0) {
    const double observed = *metrics.latency_quantile;
    int replicas = proportional(current, observed / target);
    std::string text = std::string(signal) + " " + percentile(spec_.quantile) + " " +
                       fixed(observed) + " s against target " + fixed(target) + " s over " +
                       fixed(spec_.window_seconds) + " s (" + fixed(metrics.latency_count, 6) +
                       " observations)";
    // Fewer replicas queue more: a latency far under its target does not
    // mean that proportionally fewer replicas would meet it.
    double utilisation = 0;
    if (replicas < current) {
      if (std::optional<int> floor = queueingFloor(current, replicas, observed, spec_.quantile,
                                                   target, metrics.latency_buckets, &utilisation)) {
        replicas = *floor;
        text += "; at utilisation " + fixed(utilisation, 2) + " fewer than " +
                std::to_string(replicas) + " replicas would queue past the target";
      }
    }
    consider(replicas, text);
  } else if (metrics.latency_measured) {
    consider(spec_.min_replicas, "no requests in the last " + fixed(spec_.window_seconds) + " s");
  }
  if (prefill && spec_.target_queued_prefill_tokens_per_replica && metrics.queued_prefill_tokens) {
    const double target_tokens = *spec_.target_queued_prefill_tokens_per_replica;
    consider(perReplica(*metrics.queued_prefill_tokens, target_tokens),
             "queued prefill tokens " + fixed(*metrics.queued_prefill_tokens, 6) +
                 " against target " + fixed(target_tokens, 6) + " per replica");
  }
  if (!prefill && spec_.target_running_sequences_per_replica && metrics.running_sequences) {
    const double target_running = *spec_.target_running_sequences_per_replica;
    consider(perReplica(*metrics.running_sequences, target_running),
             "running sequences " + fixed(*metrics.running_sequences, 6) + " against target " +
                 fixed(target_running) + " per replica");
  }
  if (!prefill && spec_.target_kv_cache_usage && metrics.kv_cache_usage) {
    const double usage = *metrics.kv_cache_usage;
    consider(proportional(current, usage / *spec_.target_kv_cache_usage),
             "KV cache usage " + fixed(usage) + " against target " +
                 fixed(*spec_.target_kv_cache_usage));
  }
  return std::clamp(best, spec_.min_replicas, spec_.max_replicas);
}

int PoolPlanner::stabilize(int current, double now) const {
  // As the HPA: scaling up goes no higher than the lowest recommendation of
  // the scale-up window, scaling down no lower than the highest of the
  // scale-down window.
  int up = spec_.max_replicas;
  int down = 0;
  bool any_up = false;
  for (const Recommendation& r : history_) {
    if (r.time >= now - spec_.scale_up_stabilization_seconds) {
      up = any_up ? std::min(up, r.replicas) : r.replicas;
      any_up = true;
    }
    if (r.time >= now - spec_.scale_down_stabilization_seconds) down = std::max(down, r.replicas);
  }
  if (floor_ && floor_->time >= now - spec_.scale_down_stabilization_seconds) {
    down = std::max(down, floor_->replicas);
  }
  int desired = current;
  if (any_up && desired < up) desired = up;
  if (desired > down) desired = down;
  return desired;
}

Decision PoolPlanner::hold(const PoolObservation& pool, const WindowedValues& metrics,
                           std::string reason, std::string message) const {
  Decision decision;
  decision.desired_replicas = pool.spec_replicas;
  decision.recommended_replicas = pool.spec_replicas;
  decision.reason = std::move(reason);
  decision.message = std::move(message);
  decision.scaling_conflict = {kScalingConflict, false, "NoConflict",
                               "no HorizontalPodAutoscaler targets the pool"};
  decision.scaling_limited = {kScalingLimited, false, "Schedulable",
                              "no replica has stayed Pending past pendingTimeoutSeconds"};
  if (limit_ && pool.now_seconds < limit_->until) {
    decision.scaling_limited = {kScalingLimited, true, "Unschedulable", limit_->message};
  }
  decision.metrics.desired_replicas = decision.desired_replicas;
  decision.metrics.observed_seconds =
      metrics.latency_count > 0 ? metrics.latency_quantile : std::nullopt;
  decision.metrics.target_seconds = spec_.targetSeconds(kind_);
  decision.metrics.quantile = spec_.quantile;
  return decision;
}

void PoolPlanner::describeScale(Decision& decision, const std::string& name, const std::string& why,
                                int current) const {
  const int desired = decision.desired_replicas;
  const int recommended = decision.recommended_replicas;
  std::string message = name + ": " + why + "; recommends " + std::to_string(recommended) +
                        "; replicas " + std::to_string(current) + " -> " + std::to_string(desired);
  if (std::abs(desired - recommended) > 0 && std::abs(desired - current) == spec_.max_step) {
    message += " (maxStep " + std::to_string(spec_.max_step) + ")";
  }
  decision.reason = desired > current ? "ScaledUp" : "ScaledDown";
  if (manual_) {
    decision.reason = "ManualScaleOverwritten";
    message += "; the manual change to " + std::to_string(manual_->replicas) +
               " was respected for the " + fixed(manualWindowSeconds()) +
               " s stabilisation window and is now overwritten";
  }
  decision.message = message;
  decision.event = PlannerEvent{"Normal", decision.reason, message};
}

Decision PoolPlanner::decide(const PoolObservation& pool, const WindowedValues& metrics) {
  const double now = pool.now_seconds;
  const int current = pool.spec_replicas;
  const std::string name = std::string(poolKindName(kind_)) + " pool " + pool_name_;
  const bool first = !started_;
  if (first) {
    started_ = true;
    floor_ = Recommendation{now, current};
  }
  const bool changed_by_others =
      pool.replicas_changed_externally || (!first && current != previous_spec_replicas_ &&
                                           (!last_written_ || current != *last_written_));
  if (!first && current != previous_spec_replicas_) resized_at_ = now;
  previous_spec_replicas_ = current;
  const auto wrote = [&](Decision& decision) {
    decision.write = decision.desired_replicas != current;
    if (decision.write) last_written_ = decision.desired_replicas;
    decision.metrics.desired_replicas = decision.desired_replicas;
    return decision;
  };

  // An HPA owns the pool: step aside entirely and start afresh once it goes.
  if (pool.hpa_present) {
    Decision decision = hold(pool, metrics, kScalingConflict,
                             "a HorizontalPodAutoscaler targets " + name +
                                 "; the planner does not change its replicas while it does");
    decision.scaling_conflict = {kScalingConflict, true, "HorizontalPodAutoscalerPresent",
                                 decision.message};
    if (!in_conflict_) decision.event = PlannerEvent{"Warning", kScalingConflict, decision.message};
    in_conflict_ = true;
    history_.clear();
    manual_.reset();
    last_written_.reset();
    floor_ = Recommendation{now, current};
    return decision;
  }
  in_conflict_ = false;

  // Capacity: replicas Pending past the timeout are given back at once (they
  // serve nothing, so this costs no capacity), and the pool is not asked to
  // grow past what was schedulable until the limit expires.
  const auto timed_out = static_cast<int>(
      std::count_if(pool.pending_seconds.begin(), pool.pending_seconds.end(),
                    [&](double seconds) { return seconds >= spec_.pending_timeout_seconds; }));
  if (limit_ && now >= limit_->until) limit_.reset();
  if (consecutive_limits_ > 0 && pool.pending_seconds.empty() && pool.ready_replicas >= current &&
      current > last_ceiling_) {
    consecutive_limits_ = 0;
  }
  // Ready replicas are never given back, so a Pending pod still listed after
  // an earlier give-back (a cache that lags) takes nothing more away.
  const int ceiling = std::max({spec_.min_replicas, current - timed_out, pool.ready_replicas});
  if (timed_out > 0 && ceiling < current) {
    ++consecutive_limits_;
    last_ceiling_ = ceiling;
    const double hold_seconds =
        std::min(kMaxLimitSeconds, spec_.pending_timeout_seconds *
                                       std::pow(2.0, std::min(consecutive_limits_ - 1, 20)));
    limit_ = CapacityLimit{ceiling, now + hold_seconds, ""};
    limit_->message = std::to_string(timed_out) + " replica(s) of " + name +
                      " stayed Pending (unschedulable) past " +
                      fixed(spec_.pending_timeout_seconds) + " s; given back: replicas " +
                      std::to_string(current) + " -> " + std::to_string(ceiling) +
                      "; the planner asks for no more than " + std::to_string(ceiling) +
                      " for the next " + fixed(hold_seconds) + " s";
    Decision decision = hold(pool, metrics, kScalingLimited, limit_->message);
    decision.desired_replicas = ceiling;
    decision.scaling_limited = {kScalingLimited, true, "Unschedulable", limit_->message};
    decision.event = PlannerEvent{"Warning", kScalingLimited, limit_->message};
    manual_.reset();
    return wrote(decision);
  }

  // A manual change is respected for the stabilisation window.
  if (changed_by_others) {
    manual_ = ManualChange{now, current};
    last_written_.reset();
  }
  std::string why;
  bool have_metrics = metrics.pods > 0;
  const int recommended = have_metrics ? recommend(current, metrics, why) : current;
  // Scraped, but no signal yet: no pod has two scrapes in the window, so no
  // latency could be measured, and no gauge target is set. That is not "no
  // requests" (a window no longer than the planner's interval never has two).
  const bool unmeasured = have_metrics && why.empty();
  if (unmeasured) have_metrics = false;
  if (have_metrics) {
    history_.push_back({now, recommended});
    const double keep = manualWindowSeconds();
    std::erase_if(history_, [&](const Recommendation& r) { return r.time < now - keep; });
  }
  if (manual_ && now - manual_->since < manualWindowSeconds()) {
    const std::string message = "replicas of " + name + " set to " +
                                std::to_string(manual_->replicas) +
                                " outside the planner; respected until the " +
                                fixed(manualWindowSeconds()) + " s stabilisation window has passed";
    Decision decision = hold(pool, metrics, "ManualScaleRespected", message);
    decision.recommended_replicas = recommended;
    if (changed_by_others) decision.event = PlannerEvent{"Normal", "ManualScaleRespected", message};
    return decision;
  }
  // Outside [minReplicas, maxReplicas] with no metrics to decide by: below
  // (replicas set to 0, or under the floor by hand) a pool without pods
  // would never have one; above (scaled past the cap by hand, or
  // maxReplicas lowered) the cost cap needs none. Brought to the bound by
  // maxStep a round.
  if (!have_metrics && (current < spec_.min_replicas || current > spec_.max_replicas)) {
    const bool below = current < spec_.min_replicas;
    const int bound = below ? spec_.min_replicas : spec_.max_replicas;
    Decision decision = hold(pool, metrics, "", "");
    decision.recommended_replicas = bound;
    decision.desired_replicas = below ? std::min(bound, current + spec_.max_step)
                                      : std::max(bound, current - spec_.max_step);
    describeScale(decision, name,
                  "replicas " + std::to_string(current) +
                      (below ? " are below minReplicas " : " are above maxReplicas ") +
                      std::to_string(bound),
                  current);
    manual_.reset();
    return wrote(decision);
  }
  if (unmeasured) {
    return hold(pool, metrics, "MetricsUnavailable",
                "no pod of " + name + " has two scrapes with a latency histogram in the last " +
                    fixed(spec_.window_seconds) +
                    " s to measure latency from, and no load target has a value (the pods' "
                    "/metrics lack the series, or windowSeconds is no longer than the planner's "
                    "interval); replicas left as they are");
  }
  if (!have_metrics) {
    return hold(pool, metrics, "MetricsUnavailable",
                "no metrics from any pod of " + name + " in the last " +
                    fixed(spec_.window_seconds) + " s; replicas left as they are");
  }

  int desired = stabilize(current, now);
  desired = std::clamp(desired, current - spec_.max_step, current + spec_.max_step);
  desired = std::clamp(desired, spec_.min_replicas, spec_.max_replicas);
  if (limit_ && desired > current) desired = std::min(desired, std::max(current, limit_->ceiling));
  // Shrinking is judged on a window observed at the current size only: the
  // latency seen with more replicas says little about fewer (a pool far
  // under its target would otherwise fall to minReplicas in a few rounds
  // and bounce back).
  const bool resize_settling =
      resized_at_ && now - *resized_at_ < spec_.window_seconds && desired < current;
  if (resize_settling) desired = current;

  Decision decision = hold(pool, metrics, "Steady",
                           name + ": " + why + "; replicas stay " + std::to_string(current));
  decision.desired_replicas = desired;
  decision.recommended_replicas = recommended;
  if (desired == current && recommended != current) {
    decision.reason = "Stabilizing";
    decision.message =
        name + ": " + why + "; recommends " + std::to_string(recommended) + ", replicas stay " +
        std::to_string(current) +
        (limit_ && recommended > current ? " (capacity limit)"
         : resize_settling ? " (a scale-down waits for a full " + fixed(spec_.window_seconds) +
                                 " s window observed at " + std::to_string(current) + " replicas)"
                           : " (stabilisation window)");
  }
  if (desired != current) describeScale(decision, name, why, current);
  manual_.reset();
  return wrote(decision);
}

}  // namespace tandem::planner
