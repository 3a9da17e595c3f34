#include "tools/bench/planner_ramp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/status.h"
#include "tools/bench/bench_options.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

constexpr const char* kPhaseFormat =
    "DURATION:RATE:SHAPE, e.g. 60s:20:prefill (DURATION seconds above 0, RATE requests/s "
    "above 0, SHAPE prefill or decode)";

double parsePositive(const std::string& text, const std::string& phase, const char* what) {
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(value > 0.0) || !std::isfinite(value)) {
    throw Error("--phases: " + std::string(what) + " of phase '" + phase +
                "' must be a number above 0, got '" + text + "'; each phase is " + kPhaseFormat);
  }
  return value;
}

void updateRange(PoolRange& range, int value, bool& first) {
  if (first) {
    range.min = range.max = value;
    first = false;
    return;
  }
  range.min = std::min(range.min, value);
  range.max = std::max(range.max, value);
}

RampSummary summarize(const std::string& name, double start_s, double end_s, bool overall,
                      size_t phase, const std::vector<RampRequest>& requests,
                      const std::vector<ReplicaSample>& samples,
                      const std::vector<SecondFigures>& seconds, const RampTargets& targets) {
  RampSummary summary;
  summary.name = name;
  summary.start_s = start_s;
  summary.end_s = end_s;
  std::vector<double> ttfts, itls;
  for (const RampRequest& request : requests) {
    if (!overall && request.phase != phase) continue;
    ++summary.requests;
    if (!request.success) {
      ++summary.failed;
      continue;
    }
    ttfts.push_back(request.ttft_s);
    itls.insert(itls.end(), request.itl_s.begin(), request.itl_s.end());
    summary.good += meetsTargets(request, targets);
  }
  summary.ttft_q = quantileOf(std::move(ttfts), targets.quantile);
  summary.itl_q = quantileOf(std::move(itls), targets.quantile);
  const double duration = end_s - start_s;
  summary.goodput = duration > 0 ? static_cast<double>(summary.good) / duration : 0.0;
  bool first_prefill = true, first_decode = true;
  for (const ReplicaSample& sample : samples) {
    if (sample.time_s < start_s || sample.time_s > end_s) continue;
    updateRange(summary.prefill_replicas, sample.prefill, first_prefill);
    updateRange(summary.decode_replicas, sample.decode, first_decode);
  }
  for (const SecondFigures& second : seconds) {
    if (second.time_s <= start_s || second.time_s > end_s) continue;
    summary.prefill_missed_s += second.prefill_missed;
    summary.decode_missed_s += second.decode_missed;
  }
  return summary;
}

json optionalJson(const std::optional<double>& value) {
  return value ? json(*value) : json(nullptr);
}

}  // namespace

std::vector<RampPhase> parsePhases(const std::string& text) {
  std::vector<RampPhase> phases;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    RampPhase phase;
    phase.text = item;
    const size_t first = item.find(':');
    const size_t second = first == std::string::npos ? first : item.find(':', first + 1);
    if (second == std::string::npos || item.find(':', second + 1) != std::string::npos) {
      throw Error("--phases: phase '" + item + "' is not " + kPhaseFormat);
    }
    std::string duration = item.substr(0, first);
    if (!duration.empty() && duration.back() == 's') duration.pop_back();
    phase.duration_s = parsePositive(duration, item, "the duration");
    phase.rate = parsePositive(item.substr(first + 1, second - first - 1), item, "the rate");
    const std::string shape = item.substr(second + 1);
    if (shape == "prefill") {
      phase.shape = RampShape::kPrefill;
    } else if (shape == "decode") {
      phase.shape = RampShape::kDecode;
    } else {
      throw Error("--phases: the shape of phase '" + item + "' must be prefill or decode, got '" +
                  shape + "'");
    }
    phases.push_back(phase);
  }
  if (phases.empty())
    throw Error("--phases: give at least one phase, each " + std::string(kPhaseFormat));
  return phases;
}

std::vector<PlannedRequest> planArrivals(const std::vector<RampPhase>& phases, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<PlannedRequest> arrivals;
  double start = 0.0;
  for (size_t p = 0; p < phases.size(); ++p) {
    std::exponential_distribution<double> gap(phases[p].rate);
    const double end = start + phases[p].duration_s;
    for (double t = start + gap(rng); t < end; t += gap(rng)) {
      arrivals.push_back({t, p, phases[p].shape});
    }
    start = end;
  }
  return arrivals;
}

std::optional<double> quantileOf(std::vector<double> values, double q) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const double rank = q * static_cast<double>(values.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(values.size() - 1, low + 1);
  return values[low] + (values[high] - values[low]) * (rank - static_cast<double>(low));
}

bool meetsTargets(const RampRequest& request, const RampTargets& targets) {
  if (!request.success || request.ttft_s > targets.ttft_s) return false;
  const std::optional<double> itl = quantileOf(request.itl_s, targets.quantile);
  return !itl || *itl <= targets.itl_s;
}

RampFigures computeRampFigures(const std::vector<RampPhase>& phases,
                               const std::vector<RampRequest>& requests,
                               const std::vector<ReplicaSample>& samples,
                               const RampTargets& targets) {
  RampFigures figures;
  double ramp_end = 0.0;
  for (const RampPhase& phase : phases) ramp_end += phase.duration_s;
  double last = ramp_end;
  if (!samples.empty()) last = std::max(last, samples.back().time_s);

  // (time, value) of every first token and every ITL gap, time-sorted.
  std::vector<std::pair<double, double>> ttft_points, itl_points;
  for (const RampRequest& request : requests) {
    if (!request.success) continue;
    ttft_points.emplace_back(request.send_s + request.ttft_s, request.ttft_s);
    for (size_t i = 0; i < request.itl_s.size() && i < request.token_end_s.size(); ++i) {
      itl_points.emplace_back(request.token_end_s[i], request.itl_s[i]);
    }
  }
  std::sort(ttft_points.begin(), ttft_points.end());
  std::sort(itl_points.begin(), itl_points.end());
  auto valuesIn = [](const std::vector<std::pair<double, double>>& points, double from, double to) {
    std::vector<double> values;
    auto it = std::upper_bound(points.begin(), points.end(),
                               std::make_pair(from, std::numeric_limits<double>::infinity()));
    for (; it != points.end() && it->first <= to; ++it) values.push_back(it->second);
    return values;
  };

  size_t sample_index = 0;
  ReplicaSample current;
  const int total_seconds = static_cast<int>(std::ceil(last));
  for (int s = 1; s <= total_seconds; ++s) {
    SecondFigures second;
    second.time_s = s;
    while (sample_index < samples.size() && samples[sample_index].time_s <= s) {
      current = samples[sample_index++];
    }
    second.prefill_replicas = current.prefill;
    second.decode_replicas = current.decode;
    const double from = s - targets.window_s;
    second.ttft_window_q = quantileOf(valuesIn(ttft_points, from, s), targets.quantile);
    second.itl_window_q = quantileOf(valuesIn(itl_points, from, s), targets.quantile);
    second.ttft_bucket_q = quantileOf(valuesIn(ttft_points, s - 1, s), targets.quantile);
    second.itl_bucket_q = quantileOf(valuesIn(itl_points, s - 1, s), targets.quantile);
    second.prefill_missed = second.ttft_window_q && *second.ttft_window_q > targets.ttft_s;
    second.decode_missed = second.itl_window_q && *second.itl_window_q > targets.itl_s;
    figures.seconds.push_back(second);
  }

  double start = 0.0;
  for (size_t p = 0; p < phases.size(); ++p) {
    const double end = start + phases[p].duration_s;
    figures.phases.push_back(summarize(phases[p].text, start, end, false, p, requests, samples,
                                       figures.seconds, targets));
    start = end;
  }
  figures.overall =
      summarize("overall", 0.0, std::max(ramp_end, static_cast<double>(total_seconds)), true, 0,
                requests, samples, figures.seconds, targets);
  // Goodput is per second of offered load, not of the drain after it.
  figures.overall.goodput =
      ramp_end > 0 ? static_cast<double>(figures.overall.good) / ramp_end : 0.0;
  return figures;
}

json rampSummaryJson(const RampSummary& s) {
  return {{"name", s.name},
          {"start_s", s.start_s},
          {"end_s", s.end_s},
          {"requests", s.requests},
          {"failed", s.failed},
          {"good", s.good},
          {"goodput_rps", s.goodput},
          {"prefill_replicas", {{"min", s.prefill_replicas.min}, {"max", s.prefill_replicas.max}}},
          {"decode_replicas", {{"min", s.decode_replicas.min}, {"max", s.decode_replicas.max}}},
          {"ttft_quantile_s", optionalJson(s.ttft_q)},
          {"itl_quantile_s", optionalJson(s.itl_q)},
          {"prefill_missed_s", s.prefill_missed_s},
          {"decode_missed_s", s.decode_missed_s}};
}

}  // namespace tandem::bench
