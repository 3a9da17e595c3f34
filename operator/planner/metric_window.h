// Per-pool metric values over a sliding window, from the Prometheus text
// scrapes (GET /metrics) of the pool's pods taken over time.
//
// A latency histogram's value over the window is what Prometheus computes as
// histogram_quantile(q, sum by (le) (increase(X_bucket[window]))): for each
// pod, the increase of its cumulative buckets from its oldest to its newest
// scrape inside the window (a counter that went down between two scrapes
// means the pod restarted: the later scrape counts from zero), summed over
// pods, then interpolated linearly inside the bucket that holds the rank.
// Gauges are summed over pods (queued prefill tokens, running and waiting
// sequences) or averaged over pods (KV cache usage) at each scrape time,
// then averaged over the times in the window; a pod counts at the times
// from its first scrape in the window to its last (with its latest value
// across a missed scrape), so a pod removed mid-window, whose load moved to
// the others, is not counted twice.
//
// Time is passed in by the caller (seconds on any monotonic scale), so tests
// drive the window without a clock. Not thread-safe: one owner per pool.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "operator/planner/autoscaling_spec.h"

namespace tandem::planner {

// The series a pool is judged by. An empty name is not read.
struct MetricNames {
  // Histogram base name (its _bucket and _count series are read).
  std::string latency_histogram;
  std::string queued_prefill_tokens;  // gauge
  std::string running_sequences;      // gauge
  std::string waiting_sequences;      // gauge
  std::string kv_cache_usage;         // gauge, a ratio
};

// The agents' series for a pool of `kind` (docs/metrics.md):
// tandem_time_to_first_token_seconds (prefill) or
// tandem_inter_token_latency_seconds (decode), tandem_num_prefill_tokens_waiting,
// tandem_num_requests_running, tandem_num_requests_waiting and
// tandem_kv_cache_usage_ratio.
MetricNames agentMetricNames(PoolKind kind);

struct HistogramBucket {
  double upper_bound = 0;  // `le`; +Inf for the last bucket
  double cumulative_count = 0;
};

// Prometheus' histogram_quantile: the buckets (in any order) are sorted by
// upper bound and made monotonic; the rank q·total falls in a bucket, and the
// value is interpolated linearly between that bucket's lower and upper bound
// (the lower bound of the first bucket is 0 when its upper bound is above 0).
// A rank in the +Inf bucket gives the largest finite upper bound. nullopt
// when there is no +Inf bucket, no observation, or q is outside [0, 1].
std::optional<double> histogramQuantile(double quantile, std::vector<HistogramBucket> buckets);
// The index, in upper-bound order, of the bucket histogramQuantile
// interpolates `quantile` in; nullopt where it has no answer.
std::optional<size_t> histogramQuantileBucket(double quantile,
                                              std::vector<HistogramBucket> buckets);

struct WindowedValues {
  // Pods with at least one scrape inside the window.
  int pods = 0;
  // The latency histogram's increase over the window, summed over pods,
  // sorted by upper bound (empty when no pod has two scrapes in the window).
  std::vector<HistogramBucket> latency_buckets;
  // Observations in the window (the +Inf bucket's increase).
  double latency_count = 0;
  // Some pod has two scrapes in the window: an increase (maybe 0) was
  // measured. False: the window cannot tell "no requests" from "not seen".
  bool latency_measured = false;
  // histogramQuantile(quantile, latency_buckets); nullopt without
  // observations.
  std::optional<double> latency_quantile;
  // Gauges; nullopt when no pod in the window exposes the series.
  std::optional<double> queued_prefill_tokens;  // sum over pods
  std::optional<double> running_sequences;      // sum over pods
  std::optional<double> waiting_sequences;      // sum over pods
  std::optional<double> kv_cache_usage;         // mean over pods
};

class MetricWindow {
 public:
  MetricWindow(MetricNames names, double window_seconds);

  // Records `pod`'s scrape taken at `time_seconds`. InvalidArgument (naming
  // the line) when a sample line of a series this window reads cannot be
  // parsed, or when the time is before the pod's previous scrape; the window
  // is unchanged then. Scrapes older than the window (relative to the newest
  // time seen) are dropped.
  Status addScrape(const std::string& pod, double time_seconds, std::string_view text);

  // The values over [now - window, now] with the latency quantile `quantile`.
  WindowedValues values(double now_seconds, double quantile) const;

  // Gauge `series` (one of the names' gauges) in `pod`'s newest scrape;
  // nullopt when the pod has none or its scrape lacks the series.
  std::optional<double> latestGauge(const std::string& pod, const std::string& series) const;

  double windowSeconds() const { return window_seconds_; }

 private:
  struct Snapshot {
    double time = 0;
    // upper bound → cumulative count, summed over label sets
    std::map<double, double> buckets;
    std::map<std::string, double> gauges;  // by series name
  };

  MetricNames names_;
  double window_seconds_;
  double newest_time_ = 0;
  std::map<std::string, std::vector<Snapshot>> pods_;
};

}  // namespace tandem::planner
