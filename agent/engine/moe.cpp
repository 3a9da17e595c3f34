#include "agent/engine/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"

namespace tandem::engine {

void routeRow(const float* logits, int64_t num_experts, int64_t experts_per_token, bool normalize,
              int32_t* experts, float* weights) {
  TANDEM_CHECK(experts_per_token >= 1 && experts_per_token <= num_experts,
               "experts per token must be between 1 and the number of experts");
  // NaN ranks below every number, -inf included; equal values by index.
  auto before = [&](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    const bool x_nan = std::isnan(x), y_nan = std::isnan(y);
    if (x_nan != y_nan) return y_nan;
    if (!x_nan && x != y) return x > y;
    return a < b;
  };
  // Insertion into the best experts_per_token so far: k is small (2 to 8).
  int64_t count = 0;
  for (int32_t e = 0; e < num_experts; ++e) {
    if (count == experts_per_token && !before(e, experts[count - 1])) continue;
    int64_t at = count < experts_per_token ? count++ : count - 1;
    while (at > 0 && before(e, experts[at - 1])) {
      experts[at] = experts[at - 1];
      --at;
    }
    experts[at] = e;
  }
  double max = -INFINITY;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (!std::isnan(logits[e])) max = std::max(max, static_cast<double>(logits[e]));
  }
  double sum = 0.0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (!std::isnan(logits[e])) sum += std::exp(static_cast<double>(logits[e]) - max);
  }
  auto probability = [&](int64_t j) {
    const float logit = logits[experts[j]];
    return std::isnan(logit) ? 0.0 : std::exp(static_cast<double>(logit) - max) / sum;
  };
  double chosen_sum = 0.0;
  for (int64_t j = 0; j < experts_per_token; ++j) chosen_sum += probability(j);
  for (int64_t j = 0; j < experts_per_token; ++j) {
    const double weight =
        normalize && chosen_sum > 0.0 ? probability(j) / chosen_sum : probability(j);
    weights[j] = static_cast<float>(weight);
  }
}

void ExpertAssignment::route(const float* logits, int64_t rows, int64_t num_experts,
                             int64_t experts_per_token, bool normalize) {
  const auto k = static_cast<size_t>(experts_per_token);
  chosen_.resize(static_cast<size_t>(rows) * k);
  chosen_weights_.resize(chosen_.size());
  for (int64_t r = 0; r < rows; ++r) {
    routeRow(logits + r * num_experts, num_experts, experts_per_token, normalize,
             chosen_.data() + static_cast<size_t>(r) * k,
             chosen_weights_.data() + static_cast<size_t>(r) * k);
  }
  // Counting sort by expert, stable in row order.
  offsets_.assign(static_cast<size_t>(num_experts) + 1, 0);
  for (int32_t e : chosen_) ++offsets_[static_cast<size_t>(e) + 1];
  std::partial_sum(offsets_.begin(), offsets_.end(), offsets_.begin());
  rows_.resize(chosen_.size());
  weights_.resize(chosen_.size());
  next_.assign(offsets_.begin(), offsets_.end() - 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < k; ++j) {
      const size_t slot = static_cast<size_t>(r) * k + j;
      const int64_t at = next_[static_cast<size_t>(chosen_[slot])]++;
      rows_[static_cast<size_t>(at)] = r;
      weights_[static_cast<size_t>(at)] = chosen_weights_[slot];
    }
  }
}

}  // namespace tandem::engine
