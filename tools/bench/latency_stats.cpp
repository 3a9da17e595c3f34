#include "tools/bench/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

namespace tandem::bench {

Distribution distributionOf(std::vector<double> values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  auto percentile = [&](double p) {
    const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
    const size_t below = static_cast<size_t>(std::floor(rank));
    const size_t above = std::min(below + 1, values.size() - 1);
    return values[below] + (values[above] - values[below]) * (rank - static_cast<double>(below));
  };
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.median = percentile(50);
  d.p90 = percentile(90);
  d.p99 = percentile(99);
  return d;
}

nlohmann::json distributionMsJson(const Distribution& d) {
  if (d.count == 0) return nullptr;
  return {{"count", d.count},
          {"mean", d.mean * 1e3},
          {"median", d.median * 1e3},
          {"p90", d.p90 * 1e3},
          {"p99", d.p99 * 1e3}};
}

void printDistribution(const char* name, const Distribution& d) {
  if (d.count == 0) {
    std::printf("%-12s %10s %10s %10s %10s\n", name, "-", "-", "-", "-");
    return;
  }
  std::printf("%-12s %10.2f %10.2f %10.2f %10.2f\n", name, d.mean * 1e3, d.median * 1e3,
              d.p90 * 1e3, d.p99 * 1e3);
}

}  // namespace tandem::bench
