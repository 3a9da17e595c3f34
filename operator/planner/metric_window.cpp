#include "operator/planner/metric_window.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

#include "common/prometheus_text.h"

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The increase from `older` to `newer` of every bucket; a bucket that went
// down, or a changed set of buckets, means the pod's counters restarted
// between the two, so everything in `newer` is new.
std::map<double, double> bucketIncrease(const std::map<double, double>& older,
                                        const std::map<double, double>& newer) {
  bool reset = older.size() != newer.size();
  for (auto it = newer.begin(); !reset && it != newer.end(); ++it) {
    const auto before = older.find(it->first);
    reset = before == older.end() || it->second < before->second;
  }
  if (reset) return newer;
  std::map<double, double> increase;
  for (const auto& [bound, count] : newer) increase[bound] = count - older.at(bound);
  return increase;
}

}  // namespace

MetricNames agentMetricNames(PoolKind kind) {
  MetricNames names;
  names.latency_histogram = kind == PoolKind::kPrefill ? "tandem_time_to_first_token_seconds"
                                                       : "tandem_inter_token_latency_seconds";
  names.queued_prefill_tokens = "tandem_num_prefill_tokens_waiting";
  names.running_sequences = "tandem_num_requests_running";
  names.waiting_sequences = "tandem_num_requests_waiting";
  names.kv_cache_usage = "tandem_kv_cache_usage_ratio";
  return names;
}

namespace {

// Buckets sorted by upper bound with monotonic counts, and the index of the
// one holding `quantile`'s rank: what histogramQuantile interpolates in.
struct QuantileBucket {
  std::vector<HistogramBucket> buckets;
  size_t index = 0;
  double rank = 0;
};

std::optional<QuantileBucket> locateQuantile(double quantile,
                                             std::vector<HistogramBucket> buckets) {
  if (!(quantile >= 0 && quantile <= 1) || buckets.empty()) return std::nullopt;
  std::sort(buckets.begin(), buckets.end(), [](const HistogramBucket& a, const HistogramBucket& b) {
    return a.upper_bound < b.upper_bound;
  });
  if (buckets.back().upper_bound != kInf) return std::nullopt;
  // Buckets scraped at slightly different moments can be non-monotonic;
  // Prometheus evens them out the same way.
  for (size_t i = 1; i < buckets.size(); ++i) {
    buckets[i].cumulative_count =
        std::max(buckets[i].cumulative_count, buckets[i - 1].cumulative_count);
  }
  const double total = buckets.back().cumulative_count;
  if (!(total > 0)) return std::nullopt;
  const double rank = quantile * total;
  size_t index = 0;
  while (index < buckets.size() && buckets[index].cumulative_count < rank) ++index;
  if (index >= buckets.size()) index = buckets.size() - 1;
  return QuantileBucket{std::move(buckets), index, rank};
}

}  // namespace

std::optional<size_t> histogramQuantileBucket(double quantile,
                                              std::vector<HistogramBucket> buckets) {
  std::optional<QuantileBucket> located = locateQuantile(quantile, std::move(buckets));
  if (!located) return std::nullopt;
  return located->index;
}

std::optional<double> histogramQuantile(double quantile, std::vector<HistogramBucket> buckets) {
  std::optional<QuantileBucket> located = locateQuantile(quantile, std::move(buckets));
  if (!located) return std::nullopt;
  const std::vector<HistogramBucket>& sorted = located->buckets;
  const size_t index = located->index;
  const double rank = located->rank;
  if (index == sorted.size() - 1) {
    // In the +Inf bucket: nothing to interpolate towards.
    return sorted.size() >= 2 ? sorted[sorted.size() - 2].upper_bound : std::optional<double>();
  }
  const double upper = sorted[index].upper_bound;
  if (index == 0 && upper <= 0) return upper;
  const double lower = index == 0 ? 0 : sorted[index - 1].upper_bound;
  const double count_below = index == 0 ? 0 : sorted[index - 1].cumulative_count;
  const double in_bucket = sorted[index].cumulative_count - count_below;
  if (in_bucket <= 0) return upper;
  return lower + (upper - lower) * ((rank - count_below) / in_bucket);
}

MetricWindow::MetricWindow(MetricNames names, double window_seconds)
    : names_(std::move(names)), window_seconds_(window_seconds) {}

Status MetricWindow::addScrape(const std::string& pod, double time_seconds, std::string_view text) {
  std::vector<Snapshot>& scrapes = pods_[pod];
  if (!scrapes.empty() && time_seconds < scrapes.back().time) {
    return invalidArgument("scrape of pod " + pod + " at " + std::to_string(time_seconds) +
                           " s is older than its previous one at " +
                           std::to_string(scrapes.back().time) + " s; scrapes must come in order");
  }
  const std::string bucket_name = names_.latency_histogram + "_bucket";
  const std::vector<const std::string*> gauges = {
      &names_.queued_prefill_tokens, &names_.running_sequences, &names_.waiting_sequences,
      &names_.kv_cache_usage};
  Snapshot snapshot;
  snapshot.time = time_seconds;
  int line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with('#')) continue;
    const size_t name_end = line.find_first_of("{ ");
    const std::string_view name = line.substr(0, name_end);
    const bool is_bucket = !names_.latency_histogram.empty() && name == bucket_name;
    const std::string* gauge = nullptr;
    for (const std::string* candidate : gauges) {
      if (!candidate->empty() && name == *candidate) gauge = candidate;
    }
    if (!is_bucket && gauge == nullptr) continue;
    const std::optional<PrometheusSampleLine> sample = parsePrometheusSampleLine(line);
    std::optional<double> bound;
    if (sample && is_bucket) {
      if (std::optional<std::string> le = sample->label("le")) bound = prometheusValue(*le);
    }
    // A count or gauge that is no finite number of at least 0 (NaN, +Inf,
    // -3) reads as unreadable metrics, not as a value: a histogram of NaN
    // counts counted as no requests and shrank the pool to minReplicas.
    if (!sample || (is_bucket && (!bound || std::isnan(*bound))) || !std::isfinite(sample->value) ||
        sample->value < 0) {
      return invalidArgument("metrics of pod " + pod + ", line " + std::to_string(line_number) +
                             ": cannot read a sample from \"" + std::string(line.substr(0, 120)) +
                             "\" (expected name{labels} value" +
                             (is_bucket ? std::string(" with a numeric le label") : "") +
                             ", the value a finite number of at least 0)");
    }
    if (is_bucket) {
      snapshot.buckets[*bound] += sample->value;
    } else if (*gauge == names_.kv_cache_usage) {
      // One ratio per agent; several label sets would be several models.
      auto [it, inserted] = snapshot.gauges.emplace(*gauge, sample->value);
      if (!inserted) it->second = std::max(it->second, sample->value);
    } else {
      snapshot.gauges[*gauge] += sample->value;
    }
  }
  if (!snapshot.buckets.empty() && snapshot.buckets.rbegin()->first != kInf) {
    return invalidArgument("metrics of pod " + pod + ": " + bucket_name +
                           " has no le=\"+Inf\" bucket, which counts every observation");
  }
  scrapes.push_back(std::move(snapshot));
  newest_time_ = std::max(newest_time_, time_seconds);
  const double oldest_kept = newest_time_ - window_seconds_;
  for (auto it = pods_.begin(); it != pods_.end();) {
    std::vector<Snapshot>& kept = it->second;
    kept.erase(std::remove_if(kept.begin(), kept.end(),
                              [&](const Snapshot& s) { return s.time < oldest_kept; }),
               kept.end());
    it = kept.empty() ? pods_.erase(it) : std::next(it);
  }
  return Status::ok();
}

std::optional<double> MetricWindow::latestGauge(const std::string& pod,
                                                const std::string& series) const {
  auto scrapes = pods_.find(pod);
  if (scrapes == pods_.end() || scrapes->second.empty()) return std::nullopt;
  // Scrapes are kept in time order (addScrape refuses an older one).
  const std::map<std::string, double>& gauges = scrapes->second.back().gauges;
  auto it = gauges.find(series);
  if (it == gauges.end()) return std::nullopt;
  return it->second;
}

WindowedValues MetricWindow::values(double now_seconds, double quantile) const {
  WindowedValues values;
  const double start = now_seconds - window_seconds_;
  std::map<double, double> summed;
  bool any_increase = false;
  std::set<double> times;
  std::vector<std::vector<const Snapshot*>> pod_scrapes;  // each pod's, inside the window
  for (const auto& [pod, scrapes] : pods_) {
    std::vector<const Snapshot*> inside;
    for (const Snapshot& scrape : scrapes) {
      if (scrape.time >= start && scrape.time <= now_seconds) inside.push_back(&scrape);
    }
    if (inside.empty()) continue;
    ++values.pods;
    // Walk consecutive pairs so that a restart in the middle of the window
    // loses nothing counted after it.
    std::map<double, double> pod_increase;
    for (size_t i = 1; i < inside.size(); ++i) {
      if (inside[i]->buckets.empty()) continue;
      const std::map<double, double> step =
          bucketIncrease(inside[i - 1]->buckets, inside[i]->buckets);
      for (const auto& [bound, count] : step) pod_increase[bound] += count;
      any_increase = true;
    }
    for (const auto& [bound, count] : pod_increase) summed[bound] += count;
    for (const Snapshot* scrape : inside) times.insert(scrape->time);
    pod_scrapes.push_back(std::move(inside));
  }
  // Gauges: the pool's total (or mean over pods) at each scrape time, then
  // the mean over those times. A pod counts at a time from its first scrape
  // in the window to its last (its latest value before, across a missed
  // scrape), so that a pod that left mid-window, whose load moved to the
  // others, is not counted twice, and one that came counts from its start.
  std::map<std::string, double> gauge_sums;
  std::map<std::string, int> gauge_times;
  for (const double time : times) {
    std::map<std::string, std::pair<double, int>> at_time;  // total, pods
    for (const std::vector<const Snapshot*>& scrapes : pod_scrapes) {
      if (time < scrapes.front()->time || time > scrapes.back()->time) continue;
      const Snapshot* latest = scrapes.front();
      for (const Snapshot* scrape : scrapes) {
        if (scrape->time <= time) latest = scrape;
      }
      for (const auto& [name, value] : latest->gauges) {
        at_time[name].first += value;
        ++at_time[name].second;
      }
    }
    for (const auto& [name, total_and_pods] : at_time) {
      // KV cache usage is a mean over pods; the others add up.
      gauge_sums[name] += name == names_.kv_cache_usage
                              ? total_and_pods.first / total_and_pods.second
                              : total_and_pods.first;
      ++gauge_times[name];
    }
  }
  values.latency_measured = any_increase;
  if (any_increase) {
    for (const auto& [bound, count] : summed) values.latency_buckets.push_back({bound, count});
    if (!summed.empty() && summed.rbegin()->first == kInf) {
      values.latency_count = summed.rbegin()->second;
    }
    values.latency_quantile = histogramQuantile(quantile, values.latency_buckets);
  }
  const auto gauge = [&](const std::string& name) -> std::optional<double> {
    const auto it = gauge_sums.find(name);
    if (name.empty() || it == gauge_sums.end()) return std::nullopt;
    return it->second / gauge_times.at(name);
  };
  values.queued_prefill_tokens = gauge(names_.queued_prefill_tokens);
  values.running_sequences = gauge(names_.running_sequences);
  values.waiting_sequences = gauge(names_.waiting_sequences);
  values.kv_cache_usage = gauge(names_.kv_cache_usage);
  return values;
}

}  // namespace tandem::planner
