// Routing of mixture-of-experts layers: the experts a row is sent to, their
// weights, and the rows grouped by expert.
#include "agent/engine/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace tandem::engine {
namespace {

struct Route {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Route route(const std::vector<float>& logits, Routing routing) {
  routing.num_experts = static_cast<int64_t>(logits.size());
  Route r;
  r.experts.resize(static_cast<size_t>(routing.experts_per_token));
  r.weights.resize(static_cast<size_t>(routing.experts_per_token));
  routeRow(logits.data(), routing, r.experts.data(), r.weights.data());
  return r;
}

// Softmax routing (Mixtral, Qwen3-MoE).
Route route(const std::vector<float>& logits, int64_t k, bool normalize) {
  Routing routing;
  routing.experts_per_token = k;
  routing.normalize = normalize;
  return route(logits, routing);
}

Routing softmaxRouting(int64_t num_experts, int64_t k, bool normalize) {
  Routing routing;
  routing.num_experts = num_experts;
  routing.experts_per_token = k;
  routing.normalize = normalize;
  return routing;
}

float sigmoid(float x) { return static_cast<float>(1.0 / (1.0 + std::exp(-double{x}))); }

// The softmax of all logits, in double, of the chosen ones.
TEST(MoeRouting, ChoosesTheLargestLogitsWeightedByTheSoftmaxOfAll) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.25f, -3.0f};
  double total = 0.0;
  for (float l : logits) total += std::exp(static_cast<double>(l) - 2.0);
  Route r = route(logits, 2, false);
  EXPECT_EQ(r.experts, std::vector<int32_t>({2, 3}));
  EXPECT_EQ(r.weights[0], static_cast<float>(1.0 / total));
  EXPECT_EQ(r.weights[1], static_cast<float>(std::exp(1.25 - 2.0) / total));

  // Renormalized over the chosen: they sum to one.
  r = route(logits, 2, true);
  const double chosen = 1.0 / total + std::exp(1.25 - 2.0) / total;
  EXPECT_EQ(r.weights[0], static_cast<float>((1.0 / total) / chosen));
  EXPECT_EQ(r.weights[1], static_cast<float>((std::exp(1.25 - 2.0) / total) / chosen));
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-7f);

  // All experts: every one, best first, and the weights are the softmax.
  r = route(logits, 5, false);
  EXPECT_EQ(r.experts, std::vector<int32_t>({2, 3, 0, 1, 4}));
  double sum = 0.0;
  for (float w : r.weights) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

// Ties go to the smaller index; NaN ranks below every number, -inf too, and
// weighs nothing; large logits do not overflow.
TEST(MoeRouting, TiesNaNAndLargeLogitsAreDeterministic) {
  Route r = route({1.0f, 3.0f, 1.0f, 3.0f, 1.0f}, 3, true);
  EXPECT_EQ(r.experts, std::vector<int32_t>({1, 3, 0}));
  EXPECT_EQ(r.weights[0], r.weights[1]);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  r = route({nan, -inf, 0.0f, nan}, 3, false);
  EXPECT_EQ(r.experts, std::vector<int32_t>({2, 1, 0}));
  EXPECT_EQ(r.weights[0], 1.0f);
  EXPECT_EQ(r.weights[1], 0.0f);
  EXPECT_EQ(r.weights[2], 0.0f);

  r = route({1e30f, 3e38f, -3e38f}, 2, true);
  EXPECT_EQ(r.experts, std::vector<int32_t>({1, 0}));
  EXPECT_EQ(r.weights[0], 1.0f);
  EXPECT_EQ(r.weights[1], 0.0f);
}

// A row's choice does not depend on the other rows; grouped by expert in
// index order, rows in row order, each with its weight.
TEST(MoeRouting, AssignmentGroupsRowsByExpertInRowOrder) {
  // 4 rows x 4 experts.
  const std::vector<float> logits = {
      0.0f, 1.0f, 2.0f, 3.0f,  // experts 3, 2
      3.0f, 2.0f, 1.0f, 0.0f,  // experts 0, 1
      0.0f, 5.0f, 0.0f, 4.0f,  // experts 1, 3
      9.0f, 0.0f, 0.0f, 8.0f,  // experts 0, 3
  };
  ExpertAssignment assignment;
  assignment.route(logits.data(), 4, softmaxRouting(4, 2, true));
  ASSERT_EQ(assignment.numExperts(), 4);
  const std::vector<int64_t> offsets = {assignment.offset(0), assignment.offset(1),
                                        assignment.offset(2), assignment.offset(3),
                                        assignment.offset(4)};
  EXPECT_EQ(offsets, std::vector<int64_t>({0, 2, 4, 5, 8}));
  EXPECT_EQ(assignment.rows(), std::vector<int64_t>({1, 3, 1, 2, 0, 0, 2, 3}));
  for (int64_t r = 0; r < 4; ++r) {
    Route alone =
        route(std::vector<float>(logits.begin() + r * 4, logits.begin() + r * 4 + 4), 2, true);
    for (int j = 0; j < 2; ++j) {
      const int32_t e = alone.experts[static_cast<size_t>(j)];
      bool found = false;
      for (int64_t at = assignment.offset(e); at < assignment.offset(e + 1); ++at) {
        if (assignment.rows()[static_cast<size_t>(at)] != r) continue;
        found = true;
        EXPECT_EQ(assignment.weights()[static_cast<size_t>(at)],
                  alone.weights[static_cast<size_t>(j)]);
      }
      EXPECT_TRUE(found) << "row " << r << " expert " << e;
    }
  }
  // Routed again with fewer rows: the storage is reused, nothing stale.
  assignment.route(logits.data() + 8, 1, softmaxRouting(4, 2, true));
  EXPECT_EQ(assignment.rows(), std::vector<int64_t>({0, 0}));
  EXPECT_EQ(assignment.offset(1), 0);
  EXPECT_EQ(assignment.offset(2), 1);
  EXPECT_EQ(assignment.offset(4), 2);
}

// GLM-4.5's (DeepSeek-V3's) routing: the choice ranks sigmoid(logit) +
// correction bias, the weights are the sigmoids alone, normalized over the
// chosen (sum + 1e-20) and times routed_scaling_factor.
TEST(MoeRouting, SigmoidRoutingChoosesByBiasedScoreAndWeighsByTheScore) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.25f, -3.0f};
  Routing routing;
  routing.experts_per_token = 2;
  routing.sigmoid = true;
  Route r = route(logits, routing);
  EXPECT_EQ(r.experts, std::vector<int32_t>({2, 3}));
  EXPECT_EQ(r.weights[0], sigmoid(2.0f));
  EXPECT_EQ(r.weights[1], sigmoid(1.25f));

  // The bias moves the choice (experts 1 and 4 now rank first: 0.27 + 0.9
  // and 0.05 + 1.0), not the weights: they are the experts' own sigmoids.
  const std::vector<float> bias = {0.0f, 0.9f, 0.0f, 0.0f, 1.0f};
  routing.correction_bias = bias.data();
  r = route(logits, routing);
  EXPECT_EQ(r.experts, std::vector<int32_t>({1, 4}));
  EXPECT_EQ(r.weights[0], sigmoid(-1.0f));
  EXPECT_EQ(r.weights[1], sigmoid(-3.0f));

  // Normalized, then scaled, rounded once.
  routing.normalize = true;
  routing.scale = 2.5;
  r = route(logits, routing);
  const double sum = double{sigmoid(-1.0f)} + double{sigmoid(-3.0f)};
  EXPECT_EQ(r.weights[0], static_cast<float>(double{sigmoid(-1.0f)} / (sum + 1e-20) * 2.5));
  EXPECT_EQ(r.weights[1], static_cast<float>(double{sigmoid(-3.0f)} / (sum + 1e-20) * 2.5));
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5f, 1e-6f);

  // Softmax routing takes the scale too (1 unless a config gives one).
  Routing softmax = softmaxRouting(5, 2, true);
  const Route plain = route(logits, softmax);
  softmax.scale = 2.0;
  const Route scaled = route(logits, softmax);
  EXPECT_EQ(scaled.experts, plain.experts);
  EXPECT_EQ(scaled.weights[0], plain.weights[0] * 2.0f);
}

// With groups, only the best groups' experts are candidates: a group ranks
// by the sum of its two best biased scores, so one outstanding expert does
// not carry its group past a group of two good ones.
TEST(MoeRouting, GroupLimitedRoutingChoosesWithinTheBestGroups) {
  // Two groups of four: group 0 = {3.0, -4, -4, -4} (one outstanding),
  // group 1 = {1.5, 1.4, -4, -4}.
  const std::vector<float> logits = {3.0f, -4.0f, -4.0f, -4.0f, 1.5f, 1.4f, -4.0f, -4.0f};
  Routing routing;
  routing.experts_per_token = 3;
  routing.sigmoid = true;
  routing.normalize = true;
  // Ungrouped: the three best scores anywhere.
  EXPECT_EQ(route(logits, routing).experts, std::vector<int32_t>({0, 4, 5}));
  routing.groups = 2;
  routing.groups_chosen = 1;
  // sigmoid(3) + sigmoid(-4) = 0.97 < sigmoid(1.5) + sigmoid(1.4) = 1.62:
  // group 1 wins, and its third expert is chosen before group 0's best.
  Route r = route(logits, routing);
  EXPECT_EQ(r.experts, std::vector<int32_t>({4, 5, 6}));
  const double sum = double{sigmoid(1.5f)} + double{sigmoid(1.4f)} + double{sigmoid(-4.0f)};
  EXPECT_EQ(r.weights[0], static_cast<float>(double{sigmoid(1.5f)} / (sum + 1e-20)));
  // Both groups chosen: as ungrouped.
  routing.groups_chosen = 2;
  EXPECT_EQ(route(logits, routing).experts, std::vector<int32_t>({0, 4, 5}));
  // A bias that lifts group 0's second expert makes group 0 the best.
  const std::vector<float> bias = {0.0f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  routing.correction_bias = bias.data();
  routing.groups_chosen = 1;
  EXPECT_EQ(route(logits, routing).experts, std::vector<int32_t>({1, 0, 2}));

  // NaN logits rank last and weigh nothing; a tie goes to the smaller index.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  routing = Routing{};
  routing.experts_per_token = 2;
  routing.sigmoid = true;
  r = route({nan, 0.0f, 0.0f, nan}, routing);
  EXPECT_EQ(r.experts, std::vector<int32_t>({1, 2}));
  EXPECT_EQ(r.weights[0], 0.5f);
  r = route({nan, nan, 0.0f, nan}, routing);
  EXPECT_EQ(r.experts, std::vector<int32_t>({2, 0}));
  EXPECT_EQ(r.weights[1], 0.0f);
}

}  // namespace
}  // namespace tandem::engine
