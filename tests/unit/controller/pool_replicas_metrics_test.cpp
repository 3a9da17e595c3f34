// tandem_operator_pool_replicas{namespace,pool,kind,state}: the table's counts
// rendered as gauges and removed with the pool, and a running controller
// reporting each pool's desired, updated, ready and available replicas from
// the Deployment status it reads, then dropping the series of a deleted pool.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/prometheus_text.h"
#include "operator/controller/controller.h"
#include "operator/controller/controller_metrics.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/test_helpers.h"
#include "tests/unit/controller/controller_test_support.h"

namespace tandem::controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kNamespace[] = "serving";

using tandem::testing::eventually;

std::string selector(const std::string& kind, const std::string& pool, const std::string& state) {
  return "kind=\"" + kind + "\",namespace=\"" + kNamespace + "\",pool=\"" + pool + "\",state=\"" +
         state + "\"";
}

// The gauge's value, or -1 when the series is absent.
double replicas(const std::string& text, const std::string& kind, const std::string& pool,
                const std::string& state) {
  return prometheusSample(text, "tandem_operator_pool_replicas", selector(kind, pool, state))
      .value_or(-1);
}

// A replica that stops leading closes its table: a reconcile begun while
// it led and finishing after cannot bring a pool's series back (they would
// stay, stale, until it led again); opened again, counts are written.
TEST(PoolReplicaMetricsTest, AClosedTableIgnoresLateCounts) {
  PoolReplicaTable table;
  ControllerMetrics metrics(table);
  table.set({kNamespace, "DecodePool", "decode"}, {3, 2, 1, 1});
  EXPECT_EQ(replicas(metrics.render(), "DecodePool", "decode", "desired"), 3);
  table.setOpen(false);
  EXPECT_EQ(metrics.render().find("tandem_operator_pool_replicas{"), std::string::npos);
  table.set({kNamespace, "DecodePool", "decode"}, {3, 3, 3, 3});
  EXPECT_EQ(metrics.render().find("tandem_operator_pool_replicas{"), std::string::npos);
  table.setOpen(true);
  table.set({kNamespace, "DecodePool", "decode"}, {3, 3, 3, 3});
  EXPECT_EQ(replicas(metrics.render(), "DecodePool", "decode", "ready"), 3);
}

TEST(PoolReplicaMetricsTest, TableCountsAreRenderedAndRemoved) {
  PoolReplicaTable table;
  ControllerMetrics metrics(table);
  EXPECT_EQ(metrics.render().find("tandem_operator_pool_replicas{"), std::string::npos);

  table.set({kNamespace, "DecodePool", "decode"}, {3, 2, 1, 1});
  table.set({kNamespace, "PrefillPool", "prefill"}, {1, 1, 1, 1});
  std::string text = metrics.render();
  EXPECT_EQ(replicas(text, "DecodePool", "decode", "desired"), 3);
  EXPECT_EQ(replicas(text, "DecodePool", "decode", "updated"), 2);
  EXPECT_EQ(replicas(text, "DecodePool", "decode", "ready"), 1);
  EXPECT_EQ(replicas(text, "DecodePool", "decode", "available"), 1);
  EXPECT_EQ(replicas(text, "PrefillPool", "prefill", "ready"), 1);

  table.remove({kNamespace, "DecodePool", "decode"});
  text = metrics.render();
  for (const char* state : {"desired", "updated", "ready", "available"}) {
    EXPECT_EQ(replicas(text, "DecodePool", "decode", state), -1) << state;
  }
  EXPECT_EQ(replicas(text, "PrefillPool", "prefill", "desired"), 1);
}

json decodePool(int64_t replicas) {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", "DecodePool"},
          {"metadata", {{"name", "decode"}, {"namespace", kNamespace}}},
          {"spec",
           {{"replicas", replicas},
            {"model", {{"path", "/models/small"}}},
            {"kvTransfer", {{"secretRef", {{"name", "kv"}, {"key", "secret"}}}}}}}};
}

TEST(PoolReplicaMetricsTest, ControllerReportsDeploymentCountsAndForgetsDeletedPools) {
  testing::ApiServer server;
  server.registerCrds(std::filesystem::path(TANDEM_SOURCE_DIR) / "crds");
  k8s::ApiClient client(testClusterConfig(server, kNamespace));
  ControllerOptions options = testControllerOptions(kNamespace);
  Controller controller(client, std::move(options));
  controller.start();
  ASSERT_TRUE(controller.waitForSync(seconds(30)));
  server.setDeploymentControllerAuto(true);
  server.put(decodePool(2));

  auto counts = [&](double desired, double updated, double ready, double available) {
    const std::string text = controller.renderMetrics();
    return replicas(text, "DecodePool", "decode", "desired") == desired &&
           replicas(text, "DecodePool", "decode", "updated") == updated &&
           replicas(text, "DecodePool", "decode", "ready") == ready &&
           replicas(text, "DecodePool", "decode", "available") == available;
  };
  ASSERT_TRUE(eventually([&] { return counts(2, 2, 2, 2); })) << controller.renderMetrics();

  // Two replicas running but none ready: desired stays, ready and available follow.
  server.setDeploymentStatus(kNamespace, "decode", 2, 2, 0);
  ASSERT_TRUE(eventually([&] { return counts(2, 2, 0, 0); })) << controller.renderMetrics();

  // Scaled up: desired follows the spec at once, the rest the Deployment.
  server.setDeploymentControllerAuto(true);
  server.put(decodePool(3));
  ASSERT_TRUE(eventually([&] { return counts(3, 3, 3, 3); })) << controller.renderMetrics();

  server.remove("tandem.dev/v1alpha1", "DecodePool", kNamespace, "decode");
  ASSERT_TRUE(eventually([&] {
    return controller.renderMetrics().find("pool=\"decode\"") == std::string::npos;
  })) << controller.renderMetrics();
  controller.stop();
}

// A replica that loses the Lease stops exporting the counts it last saw:
// the leader's are the current ones (an alert taking the max over the
// replicas would otherwise read a stale ready count).
TEST(PoolReplicaMetricsTest, AReplicaThatStopsLeadingForgetsItsPoolSeries) {
  testing::ApiServer server;
  server.registerCrds(std::filesystem::path(TANDEM_SOURCE_DIR) / "crds");
  k8s::ApiClient client(testClusterConfig(server, kNamespace));
  ControllerOptions options = testControllerOptions(kNamespace);
  options.leader_elect = true;
  options.lease_duration = milliseconds(3000);
  options.renew_deadline = milliseconds(1500);
  options.retry_period = milliseconds(200);
  Controller controller(client, std::move(options));
  controller.start();
  ASSERT_TRUE(controller.waitForSync(seconds(30)));
  server.setDeploymentControllerAuto(true);
  server.put(decodePool(2));
  const auto has_series = [&] {
    return controller.renderMetrics().find("pool=\"decode\"") != std::string::npos;
  };
  const auto leading = [&] {
    return controller.renderMetrics().find("\ntandem_operator_is_leader 1\n") != std::string::npos;
  };
  ASSERT_TRUE(eventually([&] { return leading() && has_series(); })) << controller.renderMetrics();

  server.injectConflicts(1000000, "Lease");  // every renewal fails
  ASSERT_TRUE(eventually([&] { return !leading(); })) << controller.renderMetrics();
  EXPECT_FALSE(has_series()) << controller.renderMetrics();

  server.injectConflicts(0, "Lease");
  ASSERT_TRUE(eventually([&] { return leading() && has_series(); })) << controller.renderMetrics();
  controller.stop();
}

}  // namespace
}  // namespace tandem::controller
