#include "tools/bench/multiturn_workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/status.h"

namespace tandem::bench {
namespace {

// Keep the groups' draws apart from the plan's main generator (seeded with
// the seed itself) and from each other.
constexpr uint64_t kGroupPrefixSalt = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kGroupChoiceSalt = 0xc2b2ae3d27d4eb4fULL;

// A uniform number in [0, 1) from the top 53 bits of one draw.
double unitInterval(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

ZipfDistribution::ZipfDistribution(int n, double s) {
  if (n < 1) throw Error("a Zipf distribution needs at least 1 group, got " + std::to_string(n));
  if (!std::isfinite(s) || s < 0.0) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", s);
    throw Error(std::string("a Zipf exponent must be a finite number >= 0, got ") + text);
  }
  cumulative_.resize(static_cast<size_t>(n));
  double sum = 0.0;
  for (int k = 0; k < n; ++k) {
    sum += std::pow(static_cast<double>(k + 1), -s);
    cumulative_[static_cast<size_t>(k)] = sum;
  }
  for (double& value : cumulative_) value /= sum;
  cumulative_.back() = 1.0;
}

int ZipfDistribution::operator()(std::mt19937_64& rng) const {
  const double u = unitInterval(rng);
  const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
  return static_cast<int>(std::min<ptrdiff_t>(it - cumulative_.begin(), size() - 1));
}

std::mt19937_64 groupPrefixGenerator(uint64_t seed) {
  return std::mt19937_64(seed ^ kGroupPrefixSalt);
}

std::vector<int> conversationGroups(int conversations, int groups, double s, uint64_t seed) {
  const ZipfDistribution zipf(groups, s);
  std::mt19937_64 rng(seed ^ kGroupChoiceSalt);
  std::vector<int> result(static_cast<size_t>(std::max(conversations, 0)));
  for (int& group : result) group = zipf(rng);
  return result;
}

std::vector<double> poissonArrivals(double rate, size_t count, std::mt19937_64& rng) {
  std::vector<double> arrivals(count, 0.0);
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < count; ++i) arrivals[i] = arrivals[i - 1] + gap(rng);
  return arrivals;
}

ArrivalSpec ArrivalSpec::parse(const std::string& text) {
  if (text == "closed") return {};
  const std::string prefix = "poisson:";
  if (text.rfind(prefix, 0) == 0) {
    const std::string number = text.substr(prefix.size());
    try {
      size_t used = 0;
      const double rate = std::stod(number, &used);
      if (used == number.size() && std::isfinite(rate) && rate > 0.0) return {true, rate};
    } catch (const std::exception&) {
    }
  }
  throw Error(
      "--arrival takes closed or poisson:RATE (RATE requests/s, a positive number), got \"" + text +
      "\"");
}

std::string ArrivalSpec::text() const {
  if (!open_loop) return "closed";
  char number[32];
  std::snprintf(number, sizeof(number), "%g", rate);
  return std::string("poisson:") + number;
}

}  // namespace tandem::bench
