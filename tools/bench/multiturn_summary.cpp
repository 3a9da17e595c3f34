#include "tools/bench/multiturn_summary.h"

#include <algorithm>
#include <numeric>

namespace tandem::bench {

std::vector<std::string> roundOrder(const std::vector<std::string>& policies, size_t round) {
  std::vector<std::string> order = policies;
  if (!order.empty()) {
    std::rotate(order.begin(), order.begin() + static_cast<ptrdiff_t>(round % order.size()),
                order.end());
  }
  return order;
}

std::optional<Spread> spreadOf(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  Spread spread;
  spread.count = n;
  spread.min = values.front();
  spread.max = values.back();
  spread.median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
  return spread;
}

std::optional<VersusBest> versusBestOther(const std::map<std::string, double>& values,
                                          const std::string& policy, bool lower_is_better) {
  const auto mine = values.find(policy);
  if (mine == values.end()) return std::nullopt;
  std::optional<std::pair<std::string, double>> best;
  for (const auto& [name, value] : values) {
    if (name == policy) continue;
    const bool better = !best || (lower_is_better ? value < best->second : value > best->second);
    if (better) best = {name, value};
  }
  if (!best || best->second == 0.0) return std::nullopt;
  return VersusBest{best->first, mine->second / best->second};
}

std::optional<double> maxOverMean(const std::vector<double>& counts) {
  if (counts.empty()) return std::nullopt;
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  if (!(total > 0.0)) return std::nullopt;
  const double mean = total / static_cast<double>(counts.size());
  return *std::max_element(counts.begin(), counts.end()) / mean;
}

}  // namespace tandem::bench
