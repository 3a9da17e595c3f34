// The SLA planner of `tandem-operator controller` end to end: the real
// binary against the test API server, its pools' pods played by real
// simulated agents (`tandem-agent serve --simulate`), each on a loopback
// address of its own with the agent container's port 8000, so the pod IPs
// the API server gives out are where the planner finds each pod's /metrics.
// Requests are sent straight to the pods' agents.
//
// - Pods' /metrics: a TTFT target the prefill pool's agent cannot meet
//   grows the prefill pool one step at a time up to maxReplicas (through the
//   scale subresource, with ScaledUp Events and the planner's metrics on the
//   operator's /metrics), while the decode pool, inside its ITL target,
//   stays at one replica.
// - --prometheus-url: the same pool read through a real Prometheus
//   (file-based service discovery labels each agent's series with its pod
//   name, as kubernetes_sd relabelling does) grows the same way.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "common/prometheus_text.h"
#include "common/subprocess.h"
#include "tests/support/agent_server.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tandem::Subprocess;
using tandem::testing::ApiServer;
using tandem::testing::eventually;
using tandem::testing::TempDir;
using namespace std::chrono_literals;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kBinDir = TANDEM_BIN_DIR;
constexpr const char* kNs = "default";
// The agent container's port (operator/controller/desired_objects.cpp).
constexpr int kAgentPort = 8000;

// Steps of a few milliseconds: a TTFT of at least one step.
constexpr const char* kProfile = R"(name: planner-test
base_s: 0.002
prefill_token_s: 0.00001
decode_sequence_s: 0.0001
model:
  vocab_size: 512
  max_position_embeddings: 512
  kv_bytes_per_token: 131072
)";

// A simulated agent listening on HOST:8000, standing for one pod.
struct PodAgent {
  std::string host;
  std::unique_ptr<Subprocess> process;
};

json pool(const std::string& kind, const std::string& name, const json& autoscaling) {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", kind},
          {"metadata", {{"name", name}, {"namespace", kNs}}},
          {"spec",
           {{"replicas", 1},
            {"model", {{"path", "/models/tiny"}}},
            {"kvTransfer", {{"secretRef", {{"name", "kv"}, {"key", "secret"}}}}},
            {"autoscaling", autoscaling}}}};
}

class K8sPlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.registerCrds(kSourceDir / "crds");
    server_.setDeploymentControllerAuto(true);
    // Each new pod gets the next agent's address.
    server_.setPodIps([this](const std::string&, const std::string& pod) {
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t index = next_agent_++;
      const std::string ip = index < agents_.size() ? agents_[index].host : "10.255.0.1";
      pod_ips_[pod] = ip;
      return ip;
    });
  }
  void TearDown() override {
    stop_load_ = true;
    for (std::thread& thread : load_) thread.join();
  }

  // Starts `count` simulated agents on 127.93.<run>.<i + 2>:8000 (a prefix
  // of this process' pid keeps concurrent runs apart).
  void startAgents(int count) {
    dir_.write("profile.yaml", kProfile);
    const int run = static_cast<int>(::getpid() % 200) + 20;
    for (int i = 0; i < count; ++i) {
      PodAgent agent;
      agent.host = "127.93." + std::to_string(run) + "." + std::to_string(i + 2);
      agent.process = std::make_unique<Subprocess>(
          std::vector<std::string>{(kBinDir / "tandem-agent").string(), "serve", "--model",
                                   tandem::testing::tinyModelDir().string(), "--served-model-name",
                                   "tiny", "--host", agent.host, "--port",
                                   std::to_string(kAgentPort), "--simulate",
                                   (dir_.path() / "profile.yaml").string()},
          dir_.path() / ("agent-" + std::to_string(i) + ".err"));
      ASSERT_FALSE(agent.process->waitForLine("listening on ", 60s).empty())
          << agent.process->stderrText();
      agents_.push_back(std::move(agent));
    }
  }

  std::unique_ptr<Subprocess> startOperator(const std::vector<std::string>& extra) {
    const fs::path kubeconfig = server_.writeKubeconfig(dir_.path() / "kubeconfig", "t", kNs);
    metrics_port_ = tandem::freeLoopbackPort();
    std::vector<std::string> argv = {(kBinDir / "tandem-operator").string(),
                                     "controller",
                                     "--kubeconfig",
                                     kubeconfig.string(),
                                     "--metrics-host",
                                     "127.0.0.1",
                                     "--metrics-port",
                                     std::to_string(metrics_port_),
                                     "--default-agent-image",
                                     "tandem-agent:test",
                                     "--planner-interval",
                                     "0.3"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto process = std::make_unique<Subprocess>(argv, dir_.path() / "operator.err");
    EXPECT_FALSE(process->waitForLine("controller started", 60s).empty()) << process->stderrText();
    return process;
  }

  // The address of the pod of `pool` (its first pod), once it has one.
  std::string podAddress(const std::string& pool_name) {
    std::string address;
    eventually(
        [&] {
          for (const json& pod : server_.list("v1", "Pod", kNs)) {
            if (pod["metadata"]["labels"].value("tandem.dev/pool", "") == pool_name &&
                pod["status"].contains("podIP")) {
              address = pod["status"]["podIP"];
              return true;
            }
          }
          return false;
        },
        30s, 20ms);
    return address;
  }

  // A client streaming short greedy completions to HOST:8000 until the test ends.
  void loadAgent(const std::string& host) {
    load_.emplace_back([this, host] {
      httplib::Client client(host, kAgentPort);
      client.set_read_timeout(30, 0);
      const json body = {{"model", "tiny"},    {"prompt", json::array({1, 2, 3, 4, 5, 6})},
                         {"max_tokens", 8},    {"temperature", 0},
                         {"ignore_eos", true}, {"stream", true}};
      while (!stop_load_) {
        auto response = client.Post("/v1/completions", body.dump(), "application/json");
        if (response && response->status == 200) ++completed_;
      }
    });
  }

  int64_t replicas(const std::string& kind, const std::string& name) {
    auto object = server_.get("tandem.dev/v1alpha1", kind, kNs, name);
    return object ? (*object)["spec"].value("replicas", int64_t{-1}) : -1;
  }
  std::vector<json> eventsFor(const std::string& name, const std::string& reason) {
    std::vector<json> found;
    for (const json& event : server_.list("v1", "Event", kNs)) {
      if (event.value("reason", "") == reason && event["involvedObject"]["name"] == name) {
        found.push_back(event);
      }
    }
    return found;
  }
  std::string operatorMetrics() {
    httplib::Client client("127.0.0.1", metrics_port_);
    auto response = client.Get("/metrics");
    return response && response->status == 200 ? response->body : "";
  }

  TempDir dir_{"tandem-k8s-planner-test"};
  ApiServer server_;
  std::vector<PodAgent> agents_;
  std::mutex mutex_;
  size_t next_agent_ = 0;
  std::map<std::string, std::string> pod_ips_;
  int metrics_port_ = 0;
  std::atomic<bool> stop_load_{false};
  std::atomic<int> completed_{0};
  std::vector<std::thread> load_;
};

TEST_F(K8sPlannerTest, ATtftMissGrowsPrefillFromThePodsMetricsAndDecodeStays) {
  ASSERT_NO_FATAL_FAILURE(startAgents(4));
  auto operator_process = startOperator({});
  // The decode pool first: its pod takes the first agent.
  server_.put(pool("DecodePool", "decode",
                   {{"minReplicas", 1},
                    {"maxReplicas", 3},
                    {"targetITLSeconds", 100},
                    {"windowSeconds", 5},
                    {"scaleDownStabilizationSeconds", 1}}));
  const std::string decode_host = podAddress("decode");
  ASSERT_EQ(decode_host, agents_[0].host)
      << operator_process->stderrText() << json(server_.list("v1", "Event", kNs)).dump();
  server_.put(pool("PrefillPool", "prefill",
                   {{"minReplicas", 1},
                    {"maxReplicas", 3},
                    {"targetTTFTSeconds", 0.0001},
                    {"windowSeconds", 5},
                    {"maxStep", 1}}));
  const std::string prefill_host = podAddress("prefill");
  ASSERT_EQ(prefill_host, agents_[1].host);
  loadAgent(prefill_host);
  loadAgent(decode_host);

  ASSERT_TRUE(eventually([&] { return replicas("PrefillPool", "prefill") == 3; }, 60s, 50ms))
      << operator_process->stderrText();
  // One replica per step: two ScaledUp Events, each naming the TTFT (the
  // controller records a step's Event after writing its replicas, so the
  // last one may follow the count the wait above saw).
  ASSERT_TRUE(eventually([&] { return eventsFor("prefill", "ScaledUp").size() >= 2; }, 30s, 50ms));
  const std::vector<json> scaled = eventsFor("prefill", "ScaledUp");
  ASSERT_EQ(scaled.size(), 2u);
  EXPECT_NE(scaled[0].value("message", "").find("TTFT p90"), std::string::npos) << scaled[0];
  // The decode pool was judged on observed ITLs, inside its target.
  ASSERT_TRUE(eventually(
      [&] {
        return tandem::prometheusSample(operatorMetrics(), "tandem_planner_observed_seconds",
                                        "pool=\"decode\"")
            .has_value();
      },
      30s, 50ms))
      << operatorMetrics();
  EXPECT_EQ(replicas("DecodePool", "decode"), 1);
  EXPECT_TRUE(eventsFor("decode", "ScaledUp").empty());
  const std::string metrics = operatorMetrics();
  EXPECT_EQ(
      tandem::prometheusSample(metrics, "tandem_planner_desired_replicas", "pool=\"prefill\""), 3.0)
      << metrics;
  EXPECT_EQ(tandem::prometheusSample(metrics, "tandem_planner_desired_replicas", "pool=\"decode\""),
            1.0);
  EXPECT_EQ(tandem::prometheusSample(metrics, "tandem_planner_target_seconds", "pool=\"decode\""),
            100.0);
  // The new prefill pods got the next agents' addresses, and the planner
  // scraped them (no warning about a pod without /metrics).
  EXPECT_EQ(operator_process->stderrText().find("no /metrics from pod"), std::string::npos)
      << operator_process->stderrText();
  EXPECT_GT(completed_.load(), 0);
}

TEST_F(K8sPlannerTest, MetricsReadThroughPrometheusGrowThePoolToo) {
  const std::string prometheus = tandem::testing::findSystemTool("prometheus");
  if (prometheus.empty()) GTEST_SKIP() << "prometheus is not installed (make deps installs it)";
  ASSERT_NO_FATAL_FAILURE(startAgents(3));
  // Prometheus discovers the pods from a file the test rewrites as pods
  // appear, labelling each target with its pod's name.
  const fs::path targets = dir_.path() / "targets.json";
  auto writeTargets = [&] {
    json groups = json::array();
    for (const json& pod : server_.list("v1", "Pod", kNs)) {
      if (!pod["status"].contains("podIP")) continue;
      groups.push_back(
          {{"targets",
            {pod["status"]["podIP"].get<std::string>() + ":" + std::to_string(kAgentPort)}},
           {"labels", {{"pod", pod["metadata"]["name"]}, {"namespace", kNs}}}});
    }
    const fs::path temporary = dir_.path() / "targets.json.new";
    std::ofstream(temporary) << groups.dump(2);
    fs::rename(temporary, targets);
  };
  writeTargets();
  const json config = {
      {"global", {{"scrape_interval", "1s"}}},
      {"scrape_configs",
       {{{"job_name", "tandem-agents"},
         {"file_sd_configs", {{{"files", {targets.string()}}, {"refresh_interval", "1s"}}}}}}}};
  const fs::path config_path = dir_.write("prometheus.yml", config.dump(2));
  const int prometheus_port = tandem::freeLoopbackPort();
  Subprocess prometheus_process(
      {prometheus, "--config.file=" + config_path.string(),
       "--storage.tsdb.path=" + (dir_.path() / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port)},
      dir_.path() / "prometheus.err");

  auto operator_process =
      startOperator({"--prometheus-url", "http://127.0.0.1:" + std::to_string(prometheus_port)});
  server_.put(pool("PrefillPool", "prefill",
                   {{"minReplicas", 1},
                    {"maxReplicas", 3},
                    {"targetTTFTSeconds", 0.0001},
                    {"windowSeconds", 10},
                    {"maxStep", 1}}));
  const std::string prefill_host = podAddress("prefill");
  ASSERT_FALSE(prefill_host.empty());
  loadAgent(prefill_host);
  ASSERT_TRUE(eventually(
      [&] {
        writeTargets();
        return replicas("PrefillPool", "prefill") == 3;
      },
      90s, 200ms))
      << operator_process->stderrText() << prometheus_process.stderrText();
  // Each step's Event follows its replicas' write.
  ASSERT_TRUE(eventually([&] { return eventsFor("prefill", "ScaledUp").size() >= 2; }, 30s, 50ms));
  EXPECT_EQ(eventsFor("prefill", "ScaledUp").size(), 2u);
  EXPECT_NE(operator_process->stderrText().find("metrics from prometheus http://127.0.0.1:"),
            std::string::npos);
}

}  // namespace
