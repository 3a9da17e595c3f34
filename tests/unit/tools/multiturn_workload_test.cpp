// The pure parts of `tandem-bench multiturn`: the Zipf draw of prefix
// groups, Poisson arrival times and the --arrival option, the rounds'
// policy order and their median/range summary, kv against the best other
// policy, request balance, and the host CPU figures read from /proc.
#include "tools/bench/multiturn_workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/bench/host_cpu.h"
#include "tools/bench/multiturn_summary.h"

namespace {

using tandem::Error;
using namespace tandem::bench;

std::vector<int> zipfCounts(int groups, double s, int draws, uint64_t seed) {
  const ZipfDistribution zipf(groups, s);
  std::mt19937_64 rng(seed);
  std::vector<int> counts(static_cast<size_t>(groups), 0);
  for (int i = 0; i < draws; ++i) {
    const int group = zipf(rng);
    EXPECT_GE(group, 0);
    EXPECT_LT(group, groups);
    if (group >= 0 && group < groups) ++counts[static_cast<size_t>(group)];
  }
  return counts;
}

TEST(ZipfDistributionTest, ExponentZeroIsUniformOverTheGroups) {
  constexpr int kGroups = 8, kDraws = 80'000;
  const std::vector<int> counts = zipfCounts(kGroups, 0.0, kDraws, 11);
  for (int group = 0; group < kGroups; ++group) {
    // Expected 10,000 each, standard deviation about 94: 5 % is over 5 sigma.
    EXPECT_NEAR(counts[static_cast<size_t>(group)], kDraws / kGroups, kDraws / kGroups * 0.05)
        << "group " << group;
  }
}

TEST(ZipfDistributionTest, PositiveExponentMakesGroupZeroTheMostFrequent) {
  constexpr int kGroups = 8, kDraws = 80'000;
  const double s = 1.2;
  const std::vector<int> counts = zipfCounts(kGroups, s, kDraws, 12);
  double harmonic = 0;
  for (int k = 1; k <= kGroups; ++k) harmonic += std::pow(k, -s);
  for (int group = 0; group < kGroups; ++group) {
    const double expected = kDraws * std::pow(group + 1, -s) / harmonic;
    EXPECT_NEAR(counts[static_cast<size_t>(group)], expected, expected * 0.1) << "group " << group;
    if (group > 0) {
      EXPECT_GT(counts[0], counts[static_cast<size_t>(group)]) << "group " << group;
    }
  }
  EXPECT_GT(counts[1], counts[7]);
}

TEST(ZipfDistributionTest, RefusesNoGroupsAndNegativeOrNonFiniteExponents) {
  EXPECT_THROW(ZipfDistribution(0, 1.0), Error);
  EXPECT_THROW(ZipfDistribution(4, -0.5), Error);
  EXPECT_THROW(ZipfDistribution(4, std::nan("")), Error);
  EXPECT_THROW(ZipfDistribution(4, INFINITY), Error);
  const ZipfDistribution one(1, 3.0);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one(rng), 0);
}

TEST(ConversationGroupsTest, TheSameSeedGivesTheSamePlanAndAnotherSeedAnother) {
  const std::vector<int> first = conversationGroups(500, 8, 1.2, 7);
  const std::vector<int> again = conversationGroups(500, 8, 1.2, 7);
  const std::vector<int> other = conversationGroups(500, 8, 1.2, 8);
  ASSERT_EQ(first.size(), 500u);
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  std::set<int> seen(first.begin(), first.end());
  EXPECT_GE(*seen.begin(), 0);
  EXPECT_LT(*seen.rbegin(), 8);
  EXPECT_GT(seen.size(), 4u) << "500 draws over 8 groups reach most of them";
  // One group: every conversation in it, whatever the exponent.
  for (int group : conversationGroups(50, 1, 2.0, 7)) EXPECT_EQ(group, 0);
  // The groups' draws are apart from the plan's main generator and from the
  // group prefixes' one.
  std::mt19937_64 main_rng(7);
  std::mt19937_64 prefix_rng = groupPrefixGenerator(7);
  EXPECT_NE(main_rng(), prefix_rng());
}

TEST(PoissonArrivalsTest, MeanGapIsOneOverTheRate) {
  constexpr double kRate = 4.0;
  std::mt19937_64 rng(42);
  const std::vector<double> arrivals = poissonArrivals(kRate, 10'001, rng);
  ASSERT_EQ(arrivals.size(), 10'001u);
  EXPECT_EQ(arrivals.front(), 0.0) << "the first arrival is at once";
  for (size_t i = 1; i < arrivals.size(); ++i) ASSERT_GE(arrivals[i], arrivals[i - 1]);
  const double mean_gap = arrivals.back() / 10'000.0;
  EXPECT_NEAR(mean_gap, 1.0 / kRate, 0.1 / kRate);

  std::mt19937_64 same(42);
  EXPECT_EQ(poissonArrivals(kRate, 10'001, same), arrivals);
  std::mt19937_64 none(1);
  EXPECT_TRUE(poissonArrivals(kRate, 0, none).empty());
}

TEST(ArrivalSpecTest, ClosedOrPoissonWithAPositiveRate) {
  const ArrivalSpec closed = ArrivalSpec::parse("closed");
  EXPECT_FALSE(closed.open_loop);
  EXPECT_EQ(closed.text(), "closed");
  const ArrivalSpec poisson = ArrivalSpec::parse("poisson:2.5");
  EXPECT_TRUE(poisson.open_loop);
  EXPECT_EQ(poisson.rate, 2.5);
  EXPECT_EQ(poisson.text(), "poisson:2.5");
  for (const char* bad : {"", "open", "poisson:", "poisson:0", "poisson:-1", "poisson:inf",
                          "poisson:3x", "uniform:3"}) {
    try {
      ArrivalSpec::parse(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--arrival takes closed or poisson:RATE"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("got \"") + bad + "\""), std::string::npos)
          << e.what();
    }
  }
}

TEST(RoundOrderTest, EachRoundRotatesThePoliciesByOne) {
  const std::vector<std::string> policies = {"kv", "round_robin", "random"};
  EXPECT_EQ(roundOrder(policies, 0), policies);
  EXPECT_EQ(roundOrder(policies, 1), (std::vector<std::string>{"round_robin", "random", "kv"}));
  EXPECT_EQ(roundOrder(policies, 2), (std::vector<std::string>{"random", "kv", "round_robin"}));
  EXPECT_EQ(roundOrder(policies, 3), policies);
  // Over as many rounds as policies, each policy runs once in each position.
  std::map<std::string, std::set<size_t>> positions;
  for (size_t round = 0; round < policies.size(); ++round) {
    const std::vector<std::string> order = roundOrder(policies, round);
    for (size_t i = 0; i < order.size(); ++i) positions[order[i]].insert(i);
  }
  for (const std::string& policy : policies) EXPECT_EQ(positions[policy].size(), 3u) << policy;
  EXPECT_TRUE(roundOrder({}, 5).empty());
}

TEST(SpreadTest, MedianAndRangeOverRounds) {
  const auto odd = spreadOf({3.0, 1.0, 2.0});
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->median, 2.0);
  EXPECT_EQ(odd->min, 1.0);
  EXPECT_EQ(odd->max, 3.0);
  EXPECT_EQ(odd->count, 3u);
  const auto even = spreadOf({4.0, 1.0, 3.0, 2.0});
  ASSERT_TRUE(even);
  EXPECT_EQ(even->median, 2.5);
  EXPECT_EQ(even->min, 1.0);
  EXPECT_EQ(even->max, 4.0);
  const auto one = spreadOf({7.0});
  ASSERT_TRUE(one);
  EXPECT_EQ(one->median, 7.0);
  EXPECT_EQ(one->min, 7.0);
  EXPECT_EQ(one->max, 7.0);
  EXPECT_FALSE(spreadOf({}));
}

TEST(VersusBestOtherTest, ComparesWithTheLowestOrHighestOfTheOthers) {
  const std::map<std::string, double> ttft = {
      {"kv", 80.0}, {"round_robin", 100.0}, {"random", 90.0}};
  const auto lower = versusBestOther(ttft, "kv", true);
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->best_other, "random");
  EXPECT_DOUBLE_EQ(lower->ratio, 80.0 / 90.0);
  const auto higher = versusBestOther(ttft, "kv", false);
  ASSERT_TRUE(higher);
  EXPECT_EQ(higher->best_other, "round_robin");
  EXPECT_DOUBLE_EQ(higher->ratio, 0.8);
  EXPECT_FALSE(versusBestOther({{"round_robin", 1.0}}, "kv", true)) << "no kv figure";
  EXPECT_FALSE(versusBestOther({{"kv", 1.0}}, "kv", true)) << "no other policy";
  EXPECT_FALSE(versusBestOther({{"kv", 1.0}, {"random", 0.0}}, "kv", true)) << "best is 0";
}

TEST(MaxOverMeanTest, OneWhenEvenAndTheAgentCountWhenOneTookAll) {
  EXPECT_EQ(maxOverMean({10, 10, 10}), 1.0);
  EXPECT_EQ(maxOverMean({30, 10, 0, 0}), 3.0);
  EXPECT_EQ(maxOverMean({0, 0, 8, 0}), 4.0);
  EXPECT_FALSE(maxOverMean({}));
  EXPECT_FALSE(maxOverMean({0, 0}));
}

TEST(HostCpuTest, BusyFractionFromTwoReadsOfProcStat) {
  const char* before_text =
      "cpu  100 0 50 800 50 0 0 0 0 0\n"
      "cpu0 50 0 25 400 25 0 0 0 0 0\n"
      "intr 12345\n";
  const char* after_text = "cpu  400 0 150 1100 50 0 0 0 30 0\ncpu0 1 2 3 4\n";
  const auto before = parseProcStat(before_text);
  const auto after = parseProcStat(after_text);
  ASSERT_TRUE(before && after);
  EXPECT_EQ(before->idle, 850u);
  EXPECT_EQ(before->total, 1000u);
  EXPECT_EQ(after->idle, 1150u) << "guest time (already in user) is not added";
  EXPECT_EQ(after->total, 1700u);
  // 700 jiffies passed, 300 of them idle.
  const auto busy = busyFraction(*before, *after);
  ASSERT_TRUE(busy);
  EXPECT_DOUBLE_EQ(*busy, 4.0 / 7.0);
  EXPECT_FALSE(busyFraction(*after, *after)) << "no time passed";
  EXPECT_FALSE(parseProcStat("cpu0 1 2 3 4\n")) << "no aggregate line";
  EXPECT_FALSE(parseProcStat("cpu  1 2 x 4\n"));
  EXPECT_FALSE(parseProcStat("cpu  1 2\n"));

  EXPECT_EQ(parseLoadAverage("2.50 1.75 1.00 3/456 7890\n"), 2.5);
  EXPECT_FALSE(parseLoadAverage(""));
  EXPECT_FALSE(parseLoadAverage("busy 1 2"));

  HostCpuUse use;
  EXPECT_FALSE(use.overloaded()) << "unknown is not overloaded";
  use.busy_fraction = 0.95;
  EXPECT_TRUE(use.overloaded());
  use.busy_fraction = 0.9;
  EXPECT_FALSE(use.overloaded());
}

}  // namespace
