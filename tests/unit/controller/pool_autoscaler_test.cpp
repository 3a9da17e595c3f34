// The SLA planner in the Kubernetes controller, against the in-process API
// server with the real CRDs: pool metrics come from a fake source behind
// PodMetricsSource (synthetic histograms; the real sources are tested in
// tests/integration/k8s_planner_test.cpp). A TTFT miss grows the pool
// through its scale subresource with an Event and a metric; an HPA on the
// pool gives ScalingConflict and no write; pods kept Pending past the
// timeout are given back with ScalingLimited; a manual scale is respected
// for the stabilisation window, then overwritten. The pure helpers (HPA targets,
// Pending durations, pod addresses, federation) are checked on their own.
#include "operator/controller/pool_autoscaler.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "operator/controller/controller.h"
#include "operator/controller/workload_status.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/httplib_serving.h"
#include "tests/support/test_helpers.h"
#include "tests/unit/controller/controller_test_support.h"

namespace tandem::controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kNamespace[] = "serving";

// Every pod it is asked for answers with a TTFT histogram that gains
// `per_round` observations of `seconds` each round.
class SyntheticTtftSource : public PodMetricsSource {
 public:
  explicit SyntheticTtftSource(double seconds) : seconds_(seconds) {}

  // Each pod's requests also: tandem_num_requests_running and
  // tandem_num_requests_waiting as `load(pod name)` gives them.
  void setLoad(std::function<std::pair<double, double>(const std::string&)> load) {
    std::lock_guard<std::mutex> lock(mutex_);
    load_ = std::move(load);
  }

  std::map<std::string, std::string> scrape(const std::vector<json>& pods,
                                            const planner::MetricNames& names) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string, std::string> texts;
    for (const json& pod : pods) {
      const std::string name = pod["metadata"]["name"];
      double& count = counts_[name];
      count += 10;
      const std::string h = names.latency_histogram;
      const bool below = seconds_ <= 0.05;
      texts[name] = "# TYPE " + h + " histogram\n" + h + "_bucket{le=\"0.05\"} " +
                    std::to_string(below ? count : 0) + "\n" + h + "_bucket{le=\"5\"} " +
                    std::to_string(count) + "\n" + h + "_bucket{le=\"+Inf\"} " +
                    std::to_string(count) + "\n" + h + "_count " + std::to_string(count) + "\n";
      if (load_) {
        const auto [running, waiting] = load_(name);
        texts[name] += names.running_sequences + " " + std::to_string(running) + "\n" +
                       names.waiting_sequences + " " + std::to_string(waiting) + "\n";
      }
    }
    scraped_pods_ += static_cast<int>(texts.size());
    return texts;
  }
  std::string describe() const override { return "synthetic"; }
  int scrapedPods() const { return scraped_pods_.load(); }

 private:
  double seconds_;
  std::mutex mutex_;
  std::map<std::string, double> counts_;
  std::function<std::pair<double, double>(const std::string&)> load_;
  std::atomic<int> scraped_pods_{0};
};

json autoscaledPrefillPool(int replicas, const json& autoscaling) {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", "PrefillPool"},
          {"metadata", {{"name", "prefill"}, {"namespace", kNamespace}}},
          {"spec",
           {{"replicas", replicas},
            {"model", {{"path", "/models/small"}}},
            {"kvTransfer", {{"secretRef", {{"name", "kv"}, {"key", "secret"}}}}},
            {"autoscaling", autoscaling}}}};
}

json hpaFor(const std::string& kind, const std::string& name) {
  return {
      {"apiVersion", "autoscaling/v2"},
      {"kind", "HorizontalPodAutoscaler"},
      {"metadata", {{"name", name + "-hpa"}, {"namespace", kNamespace}}},
      {"spec",
       {{"scaleTargetRef", {{"apiVersion", "tandem.dev/v1alpha1"}, {"kind", kind}, {"name", name}}},
        {"minReplicas", 1},
        {"maxReplicas", 5}}}};
}

size_t scaleWrites(const std::vector<std::string>& log) {
  size_t count = 0;
  for (const std::string& line : log) {
    if ((line.starts_with("PUT ") || line.starts_with("PATCH ")) &&
        line.find("/prefillpools/prefill/scale") != std::string::npos) {
      ++count;
    }
  }
  return count;
}

class PoolAutoscalerTest : public ::testing::Test {
 protected:
  PoolAutoscalerTest() {
    server_.registerCrds(std::filesystem::path(TANDEM_SOURCE_DIR) / "crds");
    server_.setDeploymentControllerAuto(true);
    k8s::ClusterConfig config;
    config.server = server_.url();
    config.token = "controller-token";
    config.default_namespace = kNamespace;
    client_ = std::make_unique<k8s::ApiClient>(config);
  }

  std::unique_ptr<Controller> startController(double ttft_seconds) {
    ControllerOptions options;
    options.ns = kNamespace;
    options.defaults.agent_image = "agent:test";
    options.initial_backoff = milliseconds(10);
    options.max_backoff = milliseconds(200);
    options.planner_interval = milliseconds(100);
    auto source = std::make_unique<SyntheticTtftSource>(ttft_seconds);
    source_ = source.get();
    options.planner_metrics = std::move(source);
    auto controller = std::make_unique<Controller>(*client_, std::move(options));
    controller->start();
    EXPECT_TRUE(controller->waitForSync(seconds(10)));
    return controller;
  }

  json pool() { return *server_.get("tandem.dev/v1alpha1", "PrefillPool", kNamespace, "prefill"); }
  int64_t replicas() { return pool()["spec"].value("replicas", int64_t{-1}); }
  json condition(const std::string& type) {
    return findCondition(pool().value("status", json::object()), type);
  }
  std::vector<json> eventsWithReason(const std::string& reason) {
    return controller::eventsWithReason(server_, kNamespace, reason);
  }

  testing::ApiServer server_;
  std::unique_ptr<k8s::ApiClient> client_;
  SyntheticTtftSource* source_ = nullptr;
};

TEST_F(PoolAutoscalerTest, ATtftMissGrowsThePoolThroughItsScaleSubresource) {
  server_.put(autoscaledPrefillPool(1, {{"minReplicas", 1},
                                        {"maxReplicas", 3},
                                        {"targetTTFTSeconds", 0.1},
                                        {"windowSeconds", 30},
                                        {"maxStep", 1}}));
  auto controller = startController(/*ttft_seconds=*/2.0);
  ASSERT_TRUE(waitUntil([&] { return replicas() == 3; })) << pool().dump();
  EXPECT_GE(scaleWrites(server_.requestLog()), 2u) << "one replica per step, through /scale";
  const std::vector<json> events = eventsWithReason("ScaledUp");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["involvedObject"]["kind"], "PrefillPool");
  EXPECT_EQ(events[0]["involvedObject"]["name"], "prefill");
  EXPECT_NE(events[0].value("message", "").find("TTFT"), std::string::npos) << events[0].dump();
  ASSERT_TRUE(waitUntil([&] { return condition(planner::kScalingConflict).is_object(); }));
  EXPECT_EQ(condition(planner::kScalingConflict)["status"], "False");
  EXPECT_EQ(condition(planner::kScalingLimited)["status"], "False");
  // The metrics follow the write within the same round.
  std::string metrics;
  EXPECT_TRUE(waitUntil([&] {
    metrics = controller->renderMetrics();
    return metrics.find(
               "tandem_planner_desired_replicas{namespace=\"serving\",pool=\"prefill\","
               "kind=\"PrefillPool\"} 3") != std::string::npos;
  })) << metrics;
  EXPECT_NE(metrics.find("tandem_planner_target_seconds{namespace=\"serving\",pool=\"prefill\","
                         "kind=\"PrefillPool\"} 0.1"),
            std::string::npos);
  EXPECT_NE(metrics.find("tandem_planner_observed_seconds{namespace=\"serving\",pool=\"prefill\","
                         "kind=\"PrefillPool\",target_quantile=\"0.9\"}"),
            std::string::npos);
}

TEST_F(PoolAutoscalerTest, AnHpaOnThePoolGivesScalingConflictAndNoWrite) {
  server_.put(hpaFor("PrefillPool", "prefill"));
  server_.put(autoscaledPrefillPool(
      1, {{"minReplicas", 1}, {"maxReplicas", 3}, {"targetTTFTSeconds", 0.1}}));
  auto controller = startController(/*ttft_seconds=*/2.0);
  ASSERT_TRUE(waitUntil([&] {
    const json conflict = condition(planner::kScalingConflict);
    return conflict.is_object() && conflict["status"] == "True";
  })) << pool().dump();
  EXPECT_EQ(condition(planner::kScalingConflict)["reason"], "HorizontalPodAutoscalerPresent");
  ASSERT_EQ(eventsWithReason(planner::kScalingConflict).size(), 1u);
  // Several more rounds, with metrics that would grow the pool: no write.
  const int scraped = source_->scrapedPods();
  ASSERT_TRUE(waitUntil([&] { return source_->scrapedPods() >= scraped + 5; }));
  EXPECT_EQ(replicas(), 1);
  EXPECT_EQ(scaleWrites(server_.requestLog()), 0u);
  EXPECT_EQ(eventsWithReason(planner::kScalingConflict).size(), 1u) << "one Event, not one a round";

  // The HPA gone: the planner acts again.
  server_.remove("autoscaling/v2", "HorizontalPodAutoscaler", kNamespace, "prefill-hpa");
  ASSERT_TRUE(waitUntil([&] { return replicas() > 1; }));
  EXPECT_TRUE(waitUntil([&] { return condition(planner::kScalingConflict)["status"] == "False"; }))
      << pool().dump();
}

TEST_F(PoolAutoscalerTest, PodsPendingPastTheTimeoutAreGivenBackWithScalingLimited) {
  server_.put(autoscaledPrefillPool(1, {{"minReplicas", 1},
                                        {"maxReplicas", 4},
                                        {"targetTTFTSeconds", 0.1},
                                        {"pendingTimeoutSeconds", 1}}));
  server_.setSchedulableReplicas(kNamespace, "prefill", 1);
  auto controller = startController(/*ttft_seconds=*/2.0);
  ASSERT_TRUE(waitUntil([&] {
    const json limited = condition(planner::kScalingLimited);
    return limited.is_object() && limited["status"] == "True";
  })) << pool().dump();
  EXPECT_EQ(condition(planner::kScalingLimited)["reason"], "Unschedulable");
  ASSERT_FALSE(eventsWithReason(planner::kScalingLimited).empty());
  EXPECT_EQ(eventsWithReason(planner::kScalingLimited)[0]["type"], "Warning");
  // Given back: the pool asks for the one replica that could be scheduled.
  ASSERT_TRUE(waitUntil([&] { return replicas() == 1; })) << pool().dump();
  for (const json& pod : server_.list("v1", "Pod", kNamespace)) {
    EXPECT_EQ(pod["status"]["phase"], "Running") << pod.dump();
  }
}

TEST_F(PoolAutoscalerTest, AManualScaleIsRespectedForTheWindowThenOverwrittenWithAnEvent) {
  server_.put(autoscaledPrefillPool(1, {{"minReplicas", 1},
                                        {"maxReplicas", 4},
                                        {"targetTTFTSeconds", 0.1},
                                        {"windowSeconds", 2},
                                        {"scaleDownStabilizationSeconds", 5}}));
  auto controller = startController(/*ttft_seconds=*/0.01);
  ASSERT_TRUE(waitUntil([&] { return source_->scrapedPods() >= 3; }));
  // `kubectl scale prefillpool prefill --replicas 3` from another client.
  k8s::ClusterConfig config;
  config.server = server_.url();
  config.token = "someone-else";
  k8s::ApiClient someone(config);
  ASSERT_TRUE(someone
                  .readModifyWrite(
                      k8s::resources::kPrefillPools, kNamespace, "prefill",
                      [](json& scale) {
                        scale["spec"]["replicas"] = 3;
                        return true;
                      },
                      "scale")
                  .isOk());
  ASSERT_TRUE(waitUntil([&] { return !eventsWithReason("ManualScaleRespected").empty(); }));
  EXPECT_EQ(replicas(), 3) << "respected while its window lasts";
  ASSERT_TRUE(waitUntil([&] { return replicas() == 1; })) << pool().dump();
  const std::vector<json> overwritten = eventsWithReason("ManualScaleOverwritten");
  ASSERT_EQ(overwritten.size(), 1u);
  EXPECT_NE(overwritten[0].value("message", "").find("3"), std::string::npos) << overwritten[0];
}

// Before each scale-down the planner writes every ready pod's running +
// waiting requests as its pod-deletion-cost (the ReplicaSet removes the
// lowest first), before the replicas, and only where the value changed.
// (The test API server's Deployment removes the highest-numbered pods
// whatever their cost: the ranking is the real ReplicaSet's.)
TEST_F(PoolAutoscalerTest, AScaleDownFirstWritesEachPodsLoadAsItsDeletionCost) {
  server_.put(autoscaledPrefillPool(3, {{"minReplicas", 1},
                                        {"maxReplicas", 3},
                                        {"targetTTFTSeconds", 0.1},
                                        {"windowSeconds", 1},
                                        {"scaleDownStabilizationSeconds", 0},
                                        {"maxStep", 1}}));
  // Pod i (the last character of its name) runs and queues these requests.
  const std::map<char, std::pair<double, double>> loads = {
      {'0', {4, 1}}, {'1', {0, 0}}, {'2', {7, 2}}};
  auto controller = startController(/*ttft_seconds=*/0.01);
  source_->setLoad([&](const std::string& pod) { return loads.at(pod.back()); });
  ASSERT_TRUE(waitUntil([&] { return replicas() == 1; })) << pool().dump();

  const std::vector<std::string> log = server_.requestLog();
  std::map<std::string, std::vector<size_t>> cost_writes;  // pod name → log lines
  size_t first_scale_write = log.size();
  for (size_t i = 0; i < log.size(); ++i) {
    const std::string& line = log[i];
    const size_t at = line.find("/api/v1/namespaces/serving/pods/");
    if (line.starts_with("PATCH ") && at != std::string::npos) {
      const std::string rest = line.substr(at + std::strlen("/api/v1/namespaces/serving/pods/"));
      cost_writes[rest.substr(0, rest.find_first_of("? "))].push_back(i);
    }
    if (scaleWrites({line}) == 1 && first_scale_write == log.size()) first_scale_write = i;
  }
  ASSERT_EQ(cost_writes.size(), 3u) << "every ready pod's cost";
  for (const auto& [pod, lines] : cost_writes) {
    EXPECT_LT(lines.front(), first_scale_write) << pod << ": its cost comes before the replicas";
    // 3 → 2 writes each; 2 → 1 finds the two left unchanged.
    EXPECT_EQ(lines.size(), 1u) << pod;
  }
  std::vector<json> left;
  ASSERT_TRUE(waitUntil([&] {
    left = server_.list("v1", "Pod", kNamespace);
    return left.size() == 1;
  })) << left.size()
      << " pods";
  const json& annotations = left[0]["metadata"]["annotations"];
  EXPECT_EQ(annotations.value(kPodDeletionCost, ""),
            left[0]["metadata"]["name"].get<std::string>().back() == '0' ? "5" : "0")
      << left[0].dump();
}

TEST(PoolAutoscalerHelpers, PodDeletionCostIsTheRoundedCountWithinInt32) {
  EXPECT_EQ(podDeletionCost(0), "0");
  EXPECT_EQ(podDeletionCost(6.6), "7");
  EXPECT_EQ(podDeletionCost(-3), "0");
  EXPECT_EQ(podDeletionCost(1e12), "2147483647");
  EXPECT_EQ(podDeletionCost(std::nan("")), "0");
}

TEST(PoolAutoscalerHelpers, HpaTargetsAreTandemPoolsOnly) {
  json deployment_hpa = hpaFor("PrefillPool", "c");
  deployment_hpa["spec"]["scaleTargetRef"] = {
      {"apiVersion", "apps/v1"}, {"kind", "Deployment"}, {"name", "c"}};
  const std::vector<json> hpas = {hpaFor("PrefillPool", "a"), hpaFor("DecodePool", "b"),
                                  deployment_hpa};
  EXPECT_EQ(hpaTargets(hpas), (std::vector<std::string>{"PrefillPool/a", "DecodePool/b"}));
}

TEST(PoolAutoscalerHelpers, UnschedulableSecondsCountOnlyUnscheduledPendingPods) {
  const auto now = std::chrono::system_clock::from_time_t(1700000100);
  auto pod = [](const std::string& phase, const std::string& scheduled) {
    return json{{"status",
                 {{"phase", phase},
                  {"conditions",
                   {{{"type", "PodScheduled"},
                     {"status", scheduled},
                     {"lastTransitionTime", "2023-11-14T22:13:20Z"}}}}}}};  // 1700000000
  };
  const std::vector<double> seconds = unschedulableSeconds(
      {pod("Pending", "False"), pod("Pending", "True"), pod("Running", "True")}, now);
  ASSERT_EQ(seconds.size(), 1u);
  EXPECT_DOUBLE_EQ(seconds[0], 100.0);
}

TEST(PoolAutoscalerHelpers, PodMetricsAddressIsThePodIpAndItsHttpPort) {
  json pod = {{"status", {{"podIP", "10.1.2.3"}}},
              {"spec",
               {{"containers",
                 {{{"name", "agent"},
                   {"ports",
                    {{{"name", "kv"}, {"containerPort", 9000}},
                     {{"name", "http"}, {"containerPort", 8000}}}}}}}}}};
  EXPECT_EQ(podMetricsAddress(pod), std::make_pair(std::string("10.1.2.3"), 8000));
  pod["status"].erase("podIP");
  EXPECT_EQ(podMetricsAddress(pod), std::nullopt) << "a Pending pod has no address";
}

// Pods of an IPv6 cluster have IPv6 addresses: the scrape reaches them.
TEST(PoolAutoscalerHelpers, PodsAreScrapedAtIpv4AndIpv6Addresses) {
  for (const std::string ip : {"127.0.0.1", "::1"}) {
    httplib::Server agent;
    agent.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content("tandem_num_requests_running 3\n", "text/plain");
    });
    const int port = agent.bind_to_any_port(ip);
    if (port <= 0 && ip == "::1") GTEST_SKIP() << "no IPv6 loopback on this machine";
    ASSERT_GT(port, 0) << ip;
    std::thread serving = tandem::testing::serveOnThread(agent);
    const json pod = {
        {"metadata", {{"name", "decode-0"}}},
        {"status", {{"podIP", ip}}},
        {"spec",
         {{"containers",
           {{{"name", "agent"}, {"ports", {{{"name", "http"}, {"containerPort", port}}}}}}}}}};
    const auto texts =
        podScrapeSource()->scrape({pod}, planner::agentMetricNames(planner::PoolKind::kDecode));
    EXPECT_EQ(texts,
              (std::map<std::string, std::string>{{"decode-0", "tandem_num_requests_running 3\n"}}))
        << ip;
    agent.stop();
    serving.join();
  }
}

TEST(PoolAutoscalerHelpers, FederationIsAskedForTheSeriesReadAndSplitByPod) {
  const planner::MetricNames names = planner::agentMetricNames(planner::PoolKind::kPrefill);
  EXPECT_EQ(federationSelector(names),
            "{__name__=~\"tandem_time_to_first_token_seconds_bucket|"
            "tandem_num_prefill_tokens_waiting|tandem_num_requests_running|"
            "tandem_num_requests_waiting|tandem_kv_cache_usage_ratio\"}");
  const std::string text =
      "# TYPE tandem_num_requests_running untyped\n"
      "tandem_num_requests_running{instance=\"a:8000\",pod=\"p-0\"} 3 1700000000000\n"
      "tandem_num_requests_running{instance=\"b:8000\",pod=\"p-1\"} 4 1700000000000\n"
      "tandem_num_requests_running{instance=\"c:8000\",pod=\"other\"} 5 1700000000000\n"
      "tandem_num_requests_running{instance=\"d:8000\"} 6 1700000000000\n";
  const auto split = splitByPod(text, "pod", {"p-0", "p-1"});
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split.at("p-0"),
            "tandem_num_requests_running{instance=\"a:8000\",pod=\"p-0\"} 3 1700000000000\n");
  planner::MetricWindow window(names, 60);
  ASSERT_TRUE(window.addScrape("p-1", 1, split.at("p-1")).isOk());
  EXPECT_EQ(window.values(1, 0.9).running_sequences, 4.0);
}

}  // namespace
}  // namespace tandem::controller
