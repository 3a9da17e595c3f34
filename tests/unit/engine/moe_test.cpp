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

Route route(const std::vector<float>& logits, int64_t k, bool normalize) {
  Route r;
  r.experts.resize(static_cast<size_t>(k));
  r.weights.resize(static_cast<size_t>(k));
  routeRow(logits.data(), static_cast<int64_t>(logits.size()), k, normalize, r.experts.data(),
           r.weights.data());
  return r;
}

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
  assignment.route(logits.data(), 4, 4, 2, true);
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
  assignment.route(logits.data() + 8, 1, 4, 2, true);
  EXPECT_EQ(assignment.rows(), std::vector<int64_t>({0, 0}));
  EXPECT_EQ(assignment.offset(1), 0);
  EXPECT_EQ(assignment.offset(2), 1);
  EXPECT_EQ(assignment.offset(4), 2);
}

}  // namespace
}  // namespace tandem::engine
