#include "common/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tandem {
namespace {

constexpr std::string_view kText =
    "# HELP tandem_kv_transfer_bytes_total KV bytes loaded.\n"
    "# TYPE tandem_kv_transfer_bytes_total counter\n"
    "tandem_kv_transfer_bytes_total{model=\"tiny\",role=\"decode\",source=\"storage\"} 4096\n"
    "tandem_kv_transfer_bytes_total{model=\"tiny\",role=\"decode\",source=\"ucx\"} 16384\n"
    "tandem_kv_transfer_duration_seconds_sum{source=\"ucx\"} 0.0125\n"
    "tandem_kv_transfer_duration_seconds_count{source=\"ucx\"} 2\n"
    "tandem_num_requests_running 3 1700000000000\r\n"
    "tandem_label_with_space{path=\"a } b\"} 7\n"
    "tandem_not_a_number{x=\"y\"} many\n"
    "tandem_nan NaN\n"
    "tandem_inf +Inf";

TEST(PrometheusSample, FirstLineOfTheNameAndLabels) {
  EXPECT_EQ(prometheusSample(kText, "tandem_kv_transfer_bytes_total"), 4096);
  EXPECT_EQ(prometheusSample(kText, "tandem_kv_transfer_bytes_total", "source=\"ucx\""), 16384);
  EXPECT_EQ(prometheusSample(kText, "tandem_kv_transfer_duration_seconds_sum"), 0.0125);
  EXPECT_EQ(prometheusSample(kText, "tandem_kv_transfer_duration_seconds_count"), 2);
}

TEST(PrometheusSum, EveryMatchingLineAddsUp) {
  EXPECT_EQ(prometheusSum(kText, "tandem_kv_transfer_bytes_total"), 4096 + 16384);
  EXPECT_EQ(prometheusSum(kText, "tandem_kv_transfer_bytes_total", "role=\"decode\""),
            4096 + 16384);
  EXPECT_EQ(prometheusSum(kText, "tandem_kv_transfer_bytes_total", "source=\"ucx\""), 16384);
  EXPECT_FALSE(prometheusSum(kText, "tandem_kv_transfer_bytes"));
  EXPECT_FALSE(prometheusSum(kText, "tandem_not_a_number")) << "no line with a number";
}

TEST(PrometheusSample, NamesMatchWhole) {
  // A prefix of a longer name is another metric.
  EXPECT_FALSE(prometheusSample(kText, "tandem_kv_transfer_duration_seconds"));
  EXPECT_FALSE(prometheusSample(kText, "tandem_kv_transfer_bytes"));
  EXPECT_FALSE(prometheusSample(kText, "tandem_kv_transfer_bytes_total", "source=\"offload\""));
  EXPECT_FALSE(prometheusSample("", "tandem_num_requests_running"));
}

TEST(PrometheusSample, TimestampsCarriageReturnsAndOddValues) {
  EXPECT_EQ(prometheusSample(kText, "tandem_num_requests_running"), 3);
  EXPECT_EQ(prometheusSample(kText, "tandem_label_with_space"), 7);
  EXPECT_FALSE(prometheusSample(kText, "tandem_not_a_number"));
  EXPECT_TRUE(std::isnan(*prometheusSample(kText, "tandem_nan")));
  EXPECT_EQ(prometheusSample(kText, "tandem_inf"), INFINITY);
}

}  // namespace
}  // namespace tandem
