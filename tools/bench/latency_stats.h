// Summaries of latency samples for tandem-bench's load generators: mean and
// percentiles, as a table row in milliseconds and as JSON.
#pragma once

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <vector>

namespace tandem::bench {

// Seconds; all zero when count is 0.
struct Distribution {
  size_t count = 0;
  double mean = 0.0, median = 0.0, p90 = 0.0, p99 = 0.0;
};

// Percentiles interpolate linearly between the closest ranks (numpy's default).
Distribution distributionOf(std::vector<double> values);

// {count, mean, median, p90, p99} in milliseconds; null when nothing was measured.
nlohmann::json distributionMsJson(const Distribution& d);

// One row "name mean median p90 p99" in milliseconds on stdout; dashes when
// nothing was measured. Columns line up under a header printed with the
// same widths: "%-12s %10s %10s %10s %10s".
void printDistribution(const char* name, const Distribution& d);

}  // namespace tandem::bench
