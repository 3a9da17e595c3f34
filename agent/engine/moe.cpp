#include "agent/engine/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"

namespace tandem::engine {
namespace {

// Whether index a ranks before index b by `values`: the larger first, NaN
// below every number (-inf included), equal values by index.
bool ranksBefore(const float* values, int32_t a, int32_t b) {
  const float x = values[a], y = values[b];
  const bool x_nan = std::isnan(x), y_nan = std::isnan(y);
  if (x_nan != y_nan) return y_nan;
  if (!x_nan && x != y) return x > y;
  return a < b;
}

// The best `k` of the indices [0, n) that `allowed` admits, best first, into
// out (k of them: the caller guarantees that many are admitted). Insertion
// into the best k so far: k is small (2 to 16).
template <typename Allowed>
void bestK(const float* values, int64_t n, int64_t k, Allowed allowed, int32_t* out) {
  int64_t count = 0;
  for (int32_t e = 0; e < n; ++e) {
    if (!allowed(e)) continue;
    if (count == k && !ranksBefore(values, e, out[count - 1])) continue;
    int64_t at = count < k ? count++ : count - 1;
    while (at > 0 && ranksBefore(values, e, out[at - 1])) {
      out[at] = out[at - 1];
      --at;
    }
    out[at] = e;
  }
}

// Softmax routing (Mixtral, Qwen3-MoE): the best logits, weighted by the
// softmax over all of them.
void routeSoftmax(const float* logits, const Routing& routing, int32_t* experts, float* weights) {
  const int64_t n = routing.num_experts, k = routing.experts_per_token;
  bestK(
      logits, n, k, [](int32_t) { return true; }, experts);
  double max = -INFINITY;
  for (int64_t e = 0; e < n; ++e) {
    if (!std::isnan(logits[e])) max = std::max(max, static_cast<double>(logits[e]));
  }
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) {
    if (!std::isnan(logits[e])) sum += std::exp(static_cast<double>(logits[e]) - max);
  }
  auto probability = [&](int64_t j) {
    const float logit = logits[experts[j]];
    return std::isnan(logit) ? 0.0 : std::exp(static_cast<double>(logit) - max) / sum;
  };
  double chosen_sum = 0.0;
  for (int64_t j = 0; j < k; ++j) chosen_sum += probability(j);
  for (int64_t j = 0; j < k; ++j) {
    double weight =
        routing.normalize && chosen_sum > 0.0 ? probability(j) / chosen_sum : probability(j);
    weights[j] = static_cast<float>(weight * routing.scale);
  }
}

// Sigmoid routing (DeepSeek-V3, GLM-4.5): choice by biased score within the
// best groups, weights from the unbiased scores.
void routeSigmoid(const float* logits, const Routing& routing, int32_t* experts, float* weights) {
  const int64_t n = routing.num_experts, k = routing.experts_per_token;
  // One row's scores, then its biased ones; a group's rank; the groups
  // chosen.
  thread_local std::vector<float> scores, biased, group_scores;
  thread_local std::vector<int32_t> best_groups;
  thread_local std::vector<char> group_allowed;
  scores.resize(static_cast<size_t>(n));
  biased.resize(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    // transformers' float32 sigmoid, to within its rounding.
    scores[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[e]))));
    biased[e] =
        routing.correction_bias == nullptr ? scores[e] : scores[e] + routing.correction_bias[e];
  }
  const int64_t groups = routing.groups;
  if (groups <= 1) {
    bestK(
        biased.data(), n, k, [](int32_t) { return true; }, experts);
  } else {
    // A group ranks by the sum of its two best biased scores (in float, the
    // better one first), and only the best groups_chosen groups' experts
    // are candidates: the others are out of the choice altogether.
    const int64_t size = n / groups;
    group_scores.resize(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      int32_t two[2];
      bestK(
          biased.data() + g * size, size, 2, [](int32_t) { return true; }, two);
      group_scores[g] = biased[g * size + two[0]] + biased[g * size + two[1]];
    }
    best_groups.resize(static_cast<size_t>(routing.groups_chosen));
    bestK(
        group_scores.data(), groups, routing.groups_chosen, [](int32_t) { return true; },
        best_groups.data());
    group_allowed.assign(static_cast<size_t>(groups), 0);
    for (int32_t g : best_groups) group_allowed[static_cast<size_t>(g)] = 1;
    bestK(
        biased.data(), n, k,
        [&](int32_t e) { return group_allowed[static_cast<size_t>(e / size)] != 0; }, experts);
  }
  // The weights: the chosen ones' scores (NaN weighs nothing), normalized
  // by their sum + 1e-20, times the scale.
  auto score = [&](int64_t j) {
    const float s = scores[experts[j]];
    return std::isnan(s) ? 0.0 : static_cast<double>(s);
  };
  double chosen_sum = 0.0;
  for (int64_t j = 0; j < k; ++j) chosen_sum += score(j);
  for (int64_t j = 0; j < k; ++j) {
    const double weight = routing.normalize ? score(j) / (chosen_sum + 1e-20) : score(j);
    weights[j] = static_cast<float>(weight * routing.scale);
  }
}

}  // namespace

void routeRow(const float* logits, const Routing& routing, int32_t* experts, float* weights) {
  TANDEM_CHECK(routing.experts_per_token >= 1 && routing.experts_per_token <= routing.num_experts,
               "experts per token must be between 1 and the number of experts");
  if (!routing.sigmoid) {
    routeSoftmax(logits, routing, experts, weights);
    return;
  }
  TANDEM_CHECK(routing.groups >= 1 && routing.num_experts % routing.groups == 0 &&
                   (routing.groups == 1 || routing.num_experts / routing.groups >= 2) &&
                   routing.groups_chosen >= 1 && routing.groups_chosen <= routing.groups &&
                   routing.experts_per_token <=
                       routing.groups_chosen * (routing.num_experts / routing.groups),
               "expert groups must split the experts evenly, two or more to a group, and the "
               "chosen groups must hold the experts per token");
  routeSigmoid(logits, routing, experts, weights);
}

void ExpertAssignment::route(const float* logits, int64_t rows, const Routing& routing) {
  const int64_t num_experts = routing.num_experts;
  const auto k = static_cast<size_t>(routing.experts_per_token);
  chosen_.resize(static_cast<size_t>(rows) * k);
  chosen_weights_.resize(chosen_.size());
  for (int64_t r = 0; r < rows; ++r) {
    routeRow(logits + r * num_experts, routing, chosen_.data() + static_cast<size_t>(r) * k,
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
