// Windowed pool metrics: histogram_quantile against hand-computed values
// (interpolation, +Inf bucket, empty window, counter reset, several pods) and
// gauges averaged over the window.
#include "operator/planner/metric_window.h"

#include <gtest/gtest.h>

#include <limits>

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A TTFT histogram with buckets 0.1, 0.5, 1, +Inf holding these cumulative
// counts, as an agent exposes it (HELP/TYPE lines, model and role labels).
std::string ttftScrape(double le_01, double le_05, double le_1, double le_inf,
                       const std::string& extra = "") {
  const auto bucket = [](const std::string& le, double count) {
    return "tandem_time_to_first_token_seconds_bucket{model=\"m\",role=\"prefill\",le=\"" + le +
           "\"} " + std::to_string(count) + "\n";
  };
  return "# HELP tandem_time_to_first_token_seconds Time to first token.\n"
         "# TYPE tandem_time_to_first_token_seconds histogram\n" +
         bucket("0.1", le_01) + bucket("0.5", le_05) + bucket("1", le_1) + bucket("+Inf", le_inf) +
         "tandem_time_to_first_token_seconds_sum{model=\"m\",role=\"prefill\"} 12.5\n"
         "tandem_time_to_first_token_seconds_count{model=\"m\",role=\"prefill\"} " +
         std::to_string(le_inf) + "\n" + extra;
}

MetricWindow prefillWindow(double seconds = 60) {
  return MetricWindow(agentMetricNames(PoolKind::kPrefill), seconds);
}

TEST(HistogramQuantileTest, InterpolatesInsideTheBucket) {
  const std::vector<HistogramBucket> buckets = {{0.1, 10}, {0.5, 30}, {1, 40}, {kInf, 40}};
  // rank 20 in (0.1, 0.5] holding 10..30: 0.1 + 0.4 * 10/20
  EXPECT_DOUBLE_EQ(*histogramQuantile(0.5, buckets), 0.3);
  // rank 36 in (0.5, 1] holding 30..40: 0.5 + 0.5 * 6/10
  EXPECT_DOUBLE_EQ(*histogramQuantile(0.9, buckets), 0.8);
  // rank 4 in the first bucket, from 0: 0.1 * 4/10
  EXPECT_DOUBLE_EQ(*histogramQuantile(0.1, buckets), 0.04);
}

TEST(HistogramQuantileTest, OrderOfBucketsDoesNotMatter) {
  const std::vector<HistogramBucket> buckets = {{kInf, 40}, {1, 40}, {0.1, 10}, {0.5, 30}};
  EXPECT_DOUBLE_EQ(*histogramQuantile(0.9, buckets), 0.8);
}

TEST(HistogramQuantileTest, RankInTheInfBucketGivesTheLargestFiniteBound) {
  const std::vector<HistogramBucket> buckets = {{0.1, 10}, {0.5, 30}, {kInf, 40}};
  // rank 36 lies above 30, in (0.5, +Inf]
  EXPECT_DOUBLE_EQ(*histogramQuantile(0.9, buckets), 0.5);
}

TEST(HistogramQuantileTest, NoInfBucketOrNoObservationsIsNoValue) {
  EXPECT_FALSE(histogramQuantile(0.9, {{0.1, 10}, {0.5, 30}}).has_value());
  EXPECT_FALSE(histogramQuantile(0.9, {{0.1, 0}, {0.5, 0}, {kInf, 0}}).has_value());
  EXPECT_FALSE(histogramQuantile(0.9, {}).has_value());
  EXPECT_FALSE(histogramQuantile(1.5, {{0.1, 1}, {kInf, 1}}).has_value());
}

TEST(MetricWindowTest, QuantileOfTheIncreaseOverTheWindow) {
  MetricWindow window = prefillWindow();
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(100, 200, 300, 300)).isOk());
  ASSERT_TRUE(window.addScrape("a", 10, ttftScrape(110, 230, 340, 340)).isOk());
  const WindowedValues values = window.values(10, 0.9);
  EXPECT_EQ(values.pods, 1);
  // The increase is 10, 30, 40, 40 (the totals since start would give 0.675).
  ASSERT_EQ(values.latency_buckets.size(), 4u);
  EXPECT_DOUBLE_EQ(values.latency_buckets[0].cumulative_count, 10);
  EXPECT_DOUBLE_EQ(values.latency_buckets[3].cumulative_count, 40);
  EXPECT_EQ(values.latency_buckets[3].upper_bound, kInf);
  EXPECT_DOUBLE_EQ(values.latency_count, 40);
  ASSERT_TRUE(values.latency_quantile.has_value());
  EXPECT_DOUBLE_EQ(*values.latency_quantile, 0.8);
}

TEST(MetricWindowTest, SumsTheIncreaseOfSeveralPods) {
  MetricWindow window = prefillWindow();
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(0, 0, 0, 0)).isOk());
  ASSERT_TRUE(window.addScrape("b", 1, ttftScrape(5, 5, 5, 5)).isOk());
  ASSERT_TRUE(window.addScrape("a", 10, ttftScrape(10, 30, 40, 40)).isOk());
  ASSERT_TRUE(window.addScrape("b", 11, ttftScrape(5, 5, 25, 25)).isOk());
  const WindowedValues values = window.values(12, 0.9);
  EXPECT_EQ(values.pods, 2);
  // Summed increase 10, 30, 60, 60: rank 54 in (0.5, 1] holding 30..60.
  EXPECT_DOUBLE_EQ(values.latency_count, 60);
  EXPECT_DOUBLE_EQ(*values.latency_quantile, 0.5 + 0.5 * 24.0 / 30.0);
  EXPECT_DOUBLE_EQ(*window.values(12, 0.5).latency_quantile, 0.5);
}

TEST(MetricWindowTest, CounterResetCountsFromZero) {
  MetricWindow window = prefillWindow();
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(10, 20, 30, 30)).isOk());
  ASSERT_TRUE(window.addScrape("a", 10, ttftScrape(20, 40, 50, 50)).isOk());
  // The agent restarted: its counters begin again.
  ASSERT_TRUE(window.addScrape("a", 20, ttftScrape(2, 4, 6, 6)).isOk());
  ASSERT_TRUE(window.addScrape("a", 30, ttftScrape(4, 8, 10, 10)).isOk());
  const WindowedValues values = window.values(30, 0.9);
  // (10, 20, 20, 20) + (2, 4, 6, 6) + (2, 4, 4, 4)
  ASSERT_EQ(values.latency_buckets.size(), 4u);
  EXPECT_DOUBLE_EQ(values.latency_buckets[0].cumulative_count, 14);
  EXPECT_DOUBLE_EQ(values.latency_buckets[1].cumulative_count, 28);
  EXPECT_DOUBLE_EQ(values.latency_buckets[2].cumulative_count, 30);
  EXPECT_DOUBLE_EQ(values.latency_count, 30);
  // rank 27 in (0.1, 0.5] holding 14..28
  EXPECT_DOUBLE_EQ(*values.latency_quantile, 0.1 + 0.4 * 13.0 / 14.0);
}

TEST(MetricWindowTest, OnlyScrapesInsideTheWindowCount) {
  MetricWindow window = prefillWindow(60);
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(0, 0, 0, 0)).isOk());
  ASSERT_TRUE(window.addScrape("a", 50, ttftScrape(100, 100, 100, 100)).isOk());
  ASSERT_TRUE(window.addScrape("a", 100, ttftScrape(100, 110, 120, 120)).isOk());
  // [40, 100] holds the scrapes at 50 and 100: 0, 10, 20, 20.
  const WindowedValues values = window.values(100, 0.5);
  EXPECT_DOUBLE_EQ(values.latency_count, 20);
  EXPECT_DOUBLE_EQ(*values.latency_quantile, 0.5);
}

TEST(MetricWindowTest, EmptyWindowHasNoQuantile) {
  MetricWindow window = prefillWindow();
  EXPECT_EQ(window.values(0, 0.9).pods, 0);
  EXPECT_FALSE(window.values(0, 0.9).latency_quantile.has_value());
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(5, 5, 5, 5)).isOk());
  // One scrape: no increase yet.
  WindowedValues values = window.values(0, 0.9);
  EXPECT_EQ(values.pods, 1);
  EXPECT_TRUE(values.latency_buckets.empty());
  EXPECT_FALSE(values.latency_quantile.has_value());
  // Two scrapes, no request between them.
  ASSERT_TRUE(window.addScrape("a", 10, ttftScrape(5, 5, 5, 5)).isOk());
  values = window.values(10, 0.9);
  EXPECT_DOUBLE_EQ(values.latency_count, 0);
  EXPECT_FALSE(values.latency_quantile.has_value());
  // Long after the last scrape, nothing is left in the window.
  EXPECT_EQ(window.values(1000, 0.9).pods, 0);
}

// Gauges: the pool's total (KV usage: mean over pods) at each scrape time,
// averaged over the times; b counts from its first scrape on.
TEST(MetricWindowTest, GaugesSummedOverPodsAtEachTimeThenAveraged) {
  MetricWindow window(agentMetricNames(PoolKind::kDecode), 60);
  const auto gauges = [](double running, double waiting, double kv, double queued) {
    return "tandem_num_requests_running{model=\"m\",role=\"decode\"} " + std::to_string(running) +
           "\ntandem_num_requests_waiting{model=\"m\",role=\"decode\"} " + std::to_string(waiting) +
           "\ntandem_kv_cache_usage_ratio{model=\"m\",role=\"decode\"} " + std::to_string(kv) +
           "\ntandem_num_prefill_tokens_waiting{model=\"m\"} " + std::to_string(queued) + "\n";
  };
  ASSERT_TRUE(window.addScrape("a", 0, gauges(4, 1, 0.5, 100)).isOk());
  ASSERT_TRUE(window.addScrape("a", 10, gauges(6, 3, 0.7, 300)).isOk());
  ASSERT_TRUE(window.addScrape("b", 10, gauges(3, 0, 0.2, 50)).isOk());
  const WindowedValues values = window.values(10, 0.9);
  EXPECT_EQ(values.pods, 2);
  EXPECT_DOUBLE_EQ(*values.running_sequences, (4 + (6 + 3)) / 2.0);
  EXPECT_DOUBLE_EQ(*values.waiting_sequences, (1 + (3 + 0)) / 2.0);
  EXPECT_DOUBLE_EQ(*values.queued_prefill_tokens, (100 + (300 + 50)) / 2.0);
  EXPECT_DOUBLE_EQ(*values.kv_cache_usage, (0.5 + (0.7 + 0.2) / 2) / 2);
  EXPECT_FALSE(values.latency_quantile.has_value());
}

TEST(MetricWindowTest, MissingGaugeIsNoValue) {
  MetricWindow window = prefillWindow();
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(0, 0, 0, 0)).isOk());
  EXPECT_FALSE(window.values(0, 0.9).queued_prefill_tokens.has_value());
  EXPECT_FALSE(window.values(0, 0.9).kv_cache_usage.has_value());
}

TEST(MetricWindowTest, BadLinesOfReadSeriesAreErrorsAndOthersAreIgnored) {
  MetricWindow window = prefillWindow();
  // Lines of series the window does not read may be anything.
  ASSERT_TRUE(window.addScrape("a", 0, "some_other_metric{x=\"1\" garbage\n").isOk());
  const Status bad_le =
      window.addScrape("a", 1, "tandem_time_to_first_token_seconds_bucket{le=\"fast\"} 3\n");
  EXPECT_EQ(bad_le.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_le.message(),
            "metrics of pod a, line 1: cannot read a sample from "
            "\"tandem_time_to_first_token_seconds_bucket{le=\"fast\"} 3\" (expected name{labels} "
            "value with a numeric le label, the value a finite number of at least 0)");
  const Status bad_value =
      window.addScrape("a", 1, "# TYPE x gauge\ntandem_num_requests_running{model=\"m\"} many\n");
  EXPECT_EQ(bad_value.message(),
            "metrics of pod a, line 2: cannot read a sample from "
            "\"tandem_num_requests_running{model=\"m\"} many\" (expected name{labels} value, the "
            "value a finite number of at least 0)");
  EXPECT_EQ(window.values(1, 0.9).pods, 1);  // only the first, good scrape
}

TEST(MetricWindowTest, CountsAndGaugesThatAreNoFiniteCountAreUnreadable) {
  // A histogram of NaN (or negative) counts, or one without its +Inf
  // bucket, read as no requests and shrank the pool to minReplicas; a NaN
  // or infinite gauge dropped its signal. Each is now an unreadable scrape,
  // which leaves the pod out as garbage does.
  MetricWindow window = prefillWindow();
  ASSERT_TRUE(window.addScrape("a", 0, ttftScrape(1, 2, 3, 4)).isOk());
  const std::string bucket = "tandem_time_to_first_token_seconds_bucket{le=";
  for (const std::string& text : {bucket + "\"1\"} NaN\n" + bucket + "\"+Inf\"} 5\n",
                                  bucket + "\"1\"} -3\n" + bucket + "\"+Inf\"} 5\n",
                                  bucket + "\"NaN\"} 3\n" + bucket + "\"+Inf\"} 5\n",
                                  bucket + "\"1\"} +Inf\n" + bucket + "\"+Inf\"} 5\n",
                                  std::string("tandem_num_requests_running NaN\n"),
                                  std::string("tandem_num_prefill_tokens_waiting +Inf\n"),
                                  std::string("tandem_kv_cache_usage_ratio -0.5\n")}) {
    EXPECT_EQ(window.addScrape("a", 1, text).code(), StatusCode::kInvalidArgument) << text;
  }
  const Status no_inf = window.addScrape("a", 1, bucket + "\"1\"} 3\n" + bucket + "\"2\"} 5\n");
  EXPECT_EQ(no_inf.message(),
            "metrics of pod a: tandem_time_to_first_token_seconds_bucket has no le=\"+Inf\" "
            "bucket, which counts every observation");
  // Only the first scrape was taken: nothing is measured, nothing is zero.
  const WindowedValues values = window.values(1, 0.9);
  EXPECT_FALSE(values.latency_measured);
  EXPECT_FALSE(values.running_sequences.has_value());
  // Large finite values are values.
  EXPECT_TRUE(window.addScrape("a", 2, "tandem_num_requests_running 1e300\n").isOk());
}

TEST(MetricWindowTest, ScrapesOfAPodMustComeInOrder) {
  MetricWindow window = prefillWindow();
  ASSERT_TRUE(window.addScrape("a", 10, ttftScrape(0, 0, 0, 0)).isOk());
  const Status status = window.addScrape("a", 5, ttftScrape(1, 1, 1, 1));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("scrapes must come in order"), std::string::npos);
}

// A steady load of 11 sequences over 4 pods, then over 3 after one left
// (its streams moved to the others): the window sees 11 throughout, not the
// leaver's past load on top of the survivors' present one (which made a
// planner flap between 3 and 4 replicas); a pod that misses a scrape counts
// with its latest value.
TEST(MetricWindowTest, APodThatLeftIsNotCountedTwice) {
  MetricWindow window(agentMetricNames(PoolKind::kDecode), 60);
  const auto running = [](double n) {
    return "tandem_num_requests_running{model=\"m\",role=\"decode\"} " + std::to_string(n) + "\n";
  };
  for (double t : {0.0, 10.0, 20.0, 30.0}) {
    for (const char* pod : {"a", "b", "c", "d"}) {
      ASSERT_TRUE(window.addScrape(pod, t, running(11.0 / 4)).isOk());
    }
  }
  for (double t : {40.0, 50.0}) {
    for (const char* pod : {"a", "b", "c"}) {
      if (t == 40.0 && std::string(pod) == "b") continue;  // a missed scrape
      ASSERT_TRUE(window.addScrape(pod, t, running(11.0 / 3)).isOk());
    }
  }
  const WindowedValues values = window.values(50, 0.9);
  EXPECT_EQ(values.pods, 4);
  const double b_at_40 = 11.0 / 4;  // its latest value then
  // (to_string writes 6 decimals)
  EXPECT_NEAR(*values.running_sequences, (4 * 11.0 + (2 * 11.0 / 3 + b_at_40) + 11.0) / 6, 1e-5);
}

}  // namespace
}  // namespace tandem::planner
