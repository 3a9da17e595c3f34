// The SLA planner in local mode, end to end on simulated agents: LocalMode
// runs a cluster file of simulated prefill and decode pools with
// spec.autoscaling behind the real router (in process, as tandem-operator
// runs it), and the load is streaming completions sent to that router, so
// every request is prefilled on a prefill agent and decoded on a decode
// agent after a KV hand-off.
//
// Each pool's agents run a profile written by the test: the pool under test
// has a fixed step of kSlowStepSeconds, so every first token (prefill) or
// every token after it (decode) takes at least that long whatever the
// machine's speed, against a target five times lower; the other pool has
// short steps and a target no request misses.
//
// - A TTFT miss grows the prefill pool while the decode pool stays at one
//   agent (Steady); once the load is gone the prefill pool holds its replicas
//   for its scale-down window (Stabilizing) and then returns to minReplicas;
//   a replica count edited in the file is respected for the stabilisation
//   window and then overwritten.
// - An ITL miss grows the decode pool while the prefill pool stays at one.
// - GET /metrics on local mode's metrics port shows what the planner asked
//   for; a port in use stops local mode before any agent starts;
//   `tandem-operator local --metrics-port 0` prints the port it serves.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "common/prometheus_text.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "operator/local/local_mode.h"
#include "operator/router/router.h"
#include "tests/support/agent_server.h"

namespace tandem::local {
namespace {

namespace fs = std::filesystem;
using spec::AgentAddress;
using spec::RouterSpec;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using testing::TempDir;

// The slow pool's step and its target: every observation of the slow pool is
// at least a step, the target a fifth of it.
constexpr double kSlowStepSeconds = 0.05;
constexpr double kMissedTargetSeconds = 0.01;
constexpr double kFastStepSeconds = 0.001;
constexpr double kEasyTargetSeconds = 100;
constexpr double kWindowSeconds = 2;
constexpr double kScaleDownSeconds = 3;

// Both profiles simulate the same model (the profile's name is part of the
// model identity a KV hand-off checks), on accelerators of different speeds.
constexpr const char* kProfileName = "test-planner";

// A step profile whose every step lasts `step_seconds`.
std::string profileYaml(const std::string& name, double step_seconds) {
  std::ostringstream out;
  out << "name: " << name << "\nbase_s: " << step_seconds
      << "\nprefill_token_s: 0\ndecode_sequence_s: 0\n"
         "model:\n  max_position_embeddings: 512\n  kv_bytes_per_token: 131072\n";
  return out.str();
}

enum class SlowPool { kPrefill, kDecode };

struct ClusterFiles {
  fs::path slow_profile;
  fs::path fast_profile;
  SlowPool slow = SlowPool::kPrefill;
};

// Both pools autoscaled (1..2 replicas, short windows); the slow pool runs the
// slow profile against a target it misses, the other the fast one against a
// target it meets. Prompts of 16 tokens or more are disaggregated.
std::string clusterYaml(const ClusterFiles& files, int prefill_replicas) {
  auto pool = [](const std::string& kind, const std::string& name, int replicas,
                 const fs::path& profile, const std::string& target) {
    std::ostringstream out;
    out << "apiVersion: tandem.dev/v1alpha1\nkind: " << kind << "\nmetadata:\n  name: " << name
        << "\nspec:\n  replicas: " << replicas
        << "\n  model:\n    path: " << testing::tinyModelDir().string()
        << "\n    name: tiny\n  engine:\n    numBlocks: 128\n    simulate: " << profile.string()
        << "\n    shutdownTimeoutSeconds: 5\n  autoscaling:\n    minReplicas: 1\n"
        << "    maxReplicas: 2\n    " << target << "\n    windowSeconds: " << kWindowSeconds
        << "\n    scaleUpStabilizationSeconds: 0\n    scaleDownStabilizationSeconds: "
        << kScaleDownSeconds << "\n";
    return out.str();
  };
  auto target = [](const char* field, bool missed) {
    std::ostringstream out;
    out << field << ": " << (missed ? kMissedTargetSeconds : kEasyTargetSeconds);
    return out.str();
  };
  const bool prefill_slow = files.slow == SlowPool::kPrefill;
  return pool("PrefillPool", "prefill", prefill_replicas,
              prefill_slow ? files.slow_profile : files.fast_profile,
              target("targetTTFTSeconds", prefill_slow)) +
         "---\n" +
         pool("DecodePool", "decode", 1, prefill_slow ? files.fast_profile : files.slow_profile,
              target("targetITLSeconds", !prefill_slow)) +
         "---\napiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n"
         "  disaggThresholdTokens: 16\n";
}

void rewrite(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".new";
  std::ofstream(temporary, std::ios::binary) << text;
  fs::rename(temporary, path);
}

// The clock LocalMode stamps planner rounds and Events with.
double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<router::AgentEndpoint> endpoints(const std::vector<AgentAddress>& agents) {
  std::vector<router::AgentEndpoint> out;
  for (const AgentAddress& agent : agents) out.push_back({agent.name, agent.host, agent.port});
  return out;
}

// The router tandem-operator local runs, in process.
class InProcessRouter final : public RouterHandle {
 public:
  explicit InProcessRouter(router::RouterConfig config) : router_(std::move(config)) {
    router_.start();
  }
  int port() const override { return router_.port(); }
  void setAgents(std::vector<AgentAddress> prefill, std::vector<AgentAddress> decode) override {
    router_.setAgents(endpoints(prefill), endpoints(decode));
  }
  void stop(double grace_seconds) override { router_.stop(grace_seconds); }

 private:
  router::Router router_;
};

class LocalPlannerTest : public ::testing::Test {
 protected:
  ClusterFiles files(SlowPool slow) {
    ClusterFiles files;
    files.slow_profile = dir_.write("slow.yaml", profileYaml(kProfileName, kSlowStepSeconds));
    files.fast_profile = dir_.write("fast.yaml", profileYaml(kProfileName, kFastStepSeconds));
    files.slow = slow;
    return files;
  }
  LocalModeOptions options(const fs::path& file) {
    LocalModeOptions options;
    options.cluster_file = file;
    options.reload_interval = milliseconds(100);
    options.planner_interval = milliseconds(250);
    options.metrics_port = 0;
    options.supervisor.agent_binary = fs::path(TANDEM_BIN_DIR) / "tandem-agent";
    options.supervisor.initial_backoff = milliseconds(100);
    options.supervisor.startup_timeout = seconds(60);
    options.supervisor.stop_timeout = seconds(10);
    options.supervisor.output = [](const std::string&) {};
    return options;
  }
  static RouterFactory realRouter() {
    return [](const RouterSpec& spec, std::vector<AgentAddress> prefill,
              std::vector<AgentAddress> decode) -> std::unique_ptr<RouterHandle> {
      router::RouterConfig config;
      config.port = 0;
      config.poll_interval_s = 0.1;
      if (spec.disagg_threshold_tokens) {
        config.disagg_threshold_tokens = *spec.disagg_threshold_tokens;
      }
      if (spec.model_path) config.model_dir = *spec.model_path;
      config.prefill = endpoints(prefill);
      config.decode = endpoints(decode);
      return std::make_unique<InProcessRouter>(std::move(config));
    };
  }
  void start(LocalMode& mode) {
    runner_ = std::thread([this, &mode] {
      try {
        mode.run();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex_);
        run_error_ = e.what();
      }
    });
  }
  std::string lastFailure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_failure_;
  }
  std::string runError() {
    std::lock_guard<std::mutex> lock(mutex_);
    return run_error_;
  }
  void TearDown() override {
    stopLoad();
    if (mode_) mode_->requestStop();
    if (runner_.joinable()) runner_.join();
  }

  // Starts local mode on `file` and waits until its router has served one
  // disaggregated request.
  void startCluster(const fs::path& file) {
    mode_ = std::make_unique<LocalMode>(options(file), realRouter());
    start(*mode_);
    ASSERT_TRUE(eventually([&] { return mode_->routerPort() != 0; }, seconds(60))) << runError();
    // Prefilled on prefill-0 and decoded on decode-0 after a KV hand-off.
    // A fresh prompt each try: one the decode agent already holds would be
    // served without a prefill agent.
    uint32_t seed = 1000;
    ASSERT_TRUE(eventually(
        [&] {
          std::optional<std::string> prefill = sendOne(seed++);
          return prefill && *prefill == "prefill-0";
        },
        seconds(90)))
        << "the router served no disaggregated request: " << lastFailure();
  }

  // One streaming completion through the router; the prefill agent that
  // served it, nullopt when it failed.
  std::optional<std::string> sendOne(uint32_t seed) {
    httplib::Client client("127.0.0.1", mode_->routerPort());
    client.set_read_timeout(30, 0);
    nlohmann::json body = testing::greedy(testing::randomPrompt(24, seed), 6);
    body["stream"] = true;
    auto response = client.Post("/v1/completions", body.dump(), "application/json");
    if (!response || response->status != 200 ||
        response->body.find("data: [DONE]") == std::string::npos) {
      std::lock_guard<std::mutex> lock(mutex_);
      last_failure_ = response ? std::to_string(response->status) + " " + response->body
                               : "no response: " + httplib::to_string(response.error());
      return std::nullopt;
    }
    return response->get_header_value("x-tandem-prefill-agent");
  }

  // Two clients sending streaming completions through the router until
  // stopLoad().
  void startLoad() {
    stop_load_ = false;
    for (uint32_t client = 0; client < 2; ++client) {
      load_.emplace_back([this, client] {
        for (uint32_t seed = 1; !stop_load_; ++seed) {
          std::optional<std::string> prefill = sendOne(client * 1000000 + seed);
          if (!prefill) continue;
          ++completed_;
          if (!prefill->empty()) ++disaggregated_;
        }
      });
    }
  }
  void stopLoad() {
    stop_load_ = true;
    for (std::thread& thread : load_) thread.join();
    load_.clear();
  }

  // Agents of `pool` that run or start (not those being stopped).
  int poolSize(const std::string& pool) const {
    const auto agents = mode_->agents();
    return static_cast<int>(std::count_if(agents.begin(), agents.end(), [&](const AgentStatus& a) {
      return a.pool == pool && a.state != AgentState::kStopping;
    }));
  }
  bool ready(const std::string& name) const {
    for (const AgentStatus& status : mode_->agents()) {
      if (status.name == name) return status.state == AgentState::kReady;
    }
    return false;
  }
  pid_t pidOf(const std::string& name) const {
    for (const AgentStatus& status : mode_->agents()) {
      if (status.name == name) return status.pid;
    }
    return 0;
  }
  std::vector<PlannerEventRecord> events(const std::string& pool, const std::string& reason) const {
    std::vector<PlannerEventRecord> found;
    for (const PlannerEventRecord& record : mode_->plannerEvents()) {
      if (record.pool == pool && record.event.reason == reason) found.push_back(record);
    }
    return found;
  }
  std::optional<PoolPlannerStatus> lastStatus(const std::string& pool) const {
    for (const PoolPlannerStatus& status : mode_->plannerStatus()) {
      if (status.pool == pool) return status;
    }
    return std::nullopt;
  }
  std::string lastMessage(const std::string& pool) const {
    auto status = lastStatus(pool);
    return status ? status->decision.reason + ": " + status->decision.message : "no decision";
  }
  // GET /metrics on local mode's metrics port; "" when it did not answer.
  std::string scrapeMetrics() const {
    httplib::Client client("127.0.0.1", mode_->metricsPort());
    auto response = client.Get("/metrics");
    return response && response->status == 200 ? response->body : "";
  }

  // The pool that is not slow: planned on its metrics all along and kept at
  // one agent.
  void expectSteadyAtOne(const std::string& pool, double target_seconds) {
    ASSERT_TRUE(eventually([&] {
      auto status = lastStatus(pool);
      return status && status->decision.metrics.observed_seconds.has_value();
    })) << lastMessage(pool);
    const planner::Decision decision = lastStatus(pool)->decision;
    EXPECT_EQ(decision.reason, "Steady") << decision.message;
    EXPECT_EQ(decision.desired_replicas, 1);
    EXPECT_EQ(decision.recommended_replicas, 1);
    EXPECT_FALSE(decision.write);
    EXPECT_LT(*decision.metrics.observed_seconds, target_seconds);
    EXPECT_EQ(poolSize(pool), 1);
    EXPECT_TRUE(events(pool, "ScaledUp").empty());
  }

  // The slow pool grew to its maxReplicas of 2, the new agent is ready, and
  // both the planner's status and GET /metrics on the metrics port say so.
  void expectGrownToTwo(const std::string& pool, const std::string& kind) {
    ASSERT_TRUE(eventually([&] { return poolSize(pool) > 1; }, seconds(30)))
        << "completed " << completed_ << " requests; " << lastMessage(pool);
    EXPECT_FALSE(events(pool, "ScaledUp").empty());
    // A planned replica is a real agent that becomes ready.
    ASSERT_TRUE(eventually([&] { return ready(pool + "-1"); }, seconds(30)));
    EXPECT_EQ(poolSize(pool), 2);
    const planner::Decision decision = lastStatus(pool)->decision;
    EXPECT_EQ(decision.desired_replicas, 2) << decision.message;
    EXPECT_GE(decision.metrics.observed_seconds.value_or(0), 0.04)
        << "no observation can be shorter than the bucket holding one step";
    const std::string metrics = scrapeMetrics();
    const std::string label = "pool=\"" + pool + "\"";
    EXPECT_EQ(prometheusSample(metrics, "tandem_planner_desired_replicas", label), 2.0) << metrics;
    EXPECT_EQ(prometheusSample(metrics, "tandem_planner_target_seconds", label),
              kMissedTargetSeconds);
    EXPECT_GE(prometheusSample(metrics, "tandem_planner_observed_seconds", label).value_or(0),
              0.04);
    EXPECT_EQ(prometheusSample(metrics, "tandem_local_pool_replicas", label), 2.0);
    EXPECT_EQ(prometheusSample(metrics, "tandem_local_agents",
                               label + ",kind=\"" + kind + "\",state=\"ready\""),
              2.0)
        << metrics;
  }

  TempDir dir_{"tandem-local-planner-test"};
  std::unique_ptr<LocalMode> mode_;
  std::atomic<bool> stop_load_{false};
  std::atomic<int> completed_{0};
  std::atomic<int> disaggregated_{0};
  std::mutex mutex_;
  std::string run_error_;
  std::string last_failure_;  // the last request that failed: status and body
  std::thread runner_;
  std::vector<std::thread> load_;
};

TEST_F(LocalPlannerTest, TtftMissGrowsPrefillOnlyAndItShrinksAfterItsScaleDownWindow) {
  const ClusterFiles cluster = files(SlowPool::kPrefill);
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(cluster, 1));
  ASSERT_NO_FATAL_FAILURE(startCluster(file));
  LocalMode& mode = *mode_;
  ASSERT_NE(mode.metricsPort(), 0);
  const pid_t first_prefill = pidOf("prefill-0");

  startLoad();
  expectGrownToTwo("prefill", "PrefillPool");
  expectSteadyAtOne("decode", kEasyTargetSeconds);
  EXPECT_TRUE(eventually([&] { return disaggregated_ > 0; })) << lastFailure();

  // The load stops. The pool holds its two agents while its scale-down
  // window still holds the recommendation of two (Stabilizing)...
  stopLoad();
  const double load_stopped = steadySeconds();
  EXPECT_TRUE(eventually([&] {
    auto status = lastStatus("prefill");
    return status && status->time_seconds > load_stopped &&
           status->decision.reason == "Stabilizing" && status->decision.recommended_replicas == 1;
  })) << lastMessage("prefill");
  EXPECT_EQ(poolSize("prefill"), 2);
  EXPECT_TRUE(events("prefill", "ScaledDown").empty());
  // ...and returns to minReplicas only once the window has passed: the
  // recommendations stayed at two at least until the load stopped.
  ASSERT_TRUE(eventually([&] { return poolSize("prefill") == 1; }, seconds(30)))
      << lastMessage("prefill");
  const auto scaled_down = events("prefill", "ScaledDown");
  ASSERT_EQ(scaled_down.size(), 1u);
  EXPECT_GE(scaled_down[0].time_seconds, load_stopped + kScaleDownSeconds);
  const auto scaled_up = events("prefill", "ScaledUp");
  ASSERT_FALSE(scaled_up.empty());
  EXPECT_GT(scaled_down[0].time_seconds, scaled_up.back().time_seconds);
  EXPECT_EQ(pidOf("prefill-0"), first_prefill) << "the highest index is the one stopped";
  EXPECT_EQ(poolSize("decode"), 1);
  EXPECT_EQ(
      prometheusSample(scrapeMetrics(), "tandem_planner_desired_replicas", "pool=\"prefill\""),
      1.0);

  // Two prefill replicas written in the file: a manual change, applied and
  // respected for the stabilisation window, then overwritten (no load).
  rewrite(file, clusterYaml(cluster, 2));
  ASSERT_TRUE(eventually([&] { return poolSize("prefill") == 2; }, seconds(10)));
  ASSERT_TRUE(eventually([&] { return !events("prefill", "ManualScaleRespected").empty(); }));
  ASSERT_TRUE(eventually([&] { return poolSize("prefill") == 1; }, seconds(30)));
  const auto overwritten = events("prefill", "ManualScaleOverwritten");
  ASSERT_EQ(overwritten.size(), 1u);
  EXPECT_GE(overwritten[0].time_seconds,
            events("prefill", "ManualScaleRespected").back().time_seconds + kScaleDownSeconds);
  EXPECT_EQ(mode.fileError(), "");

  // Autoscaling taken out of the file: the planner's series go with it
  // (before, its last decision stayed on the metrics port, frozen).
  ASSERT_TRUE(
      prometheusSample(scrapeMetrics(), "tandem_planner_desired_replicas", "pool=\"prefill\"")
          .has_value());
  std::string unscaled = clusterYaml(cluster, 1);
  for (size_t at; (at = unscaled.find("  autoscaling:\n")) != std::string::npos;) {
    size_t end = at + std::string("  autoscaling:\n").size();
    while (unscaled.compare(end, 4, "    ") == 0) end = unscaled.find('\n', end) + 1;
    unscaled.erase(at, end - at);
  }
  rewrite(file, unscaled);
  EXPECT_TRUE(eventually([&] {
    return scrapeMetrics().find("tandem_planner_desired_replicas{") == std::string::npos;
  })) << scrapeMetrics();
  EXPECT_EQ(mode.fileError(), "");

  mode.requestStop();
  runner_.join();
  EXPECT_EQ(runError(), "");
  EXPECT_EQ(mode.metricsPort(), 0) << "the metrics port closes with local mode";
  const std::vector<AgentStatus> left = mode.agents();
  EXPECT_TRUE(
      std::all_of(left.begin(), left.end(), [](const AgentStatus& a) { return a.pid == 0; }));
}

TEST_F(LocalPlannerTest, ItlMissGrowsDecodeOnly) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(files(SlowPool::kDecode), 1));
  ASSERT_NO_FATAL_FAILURE(startCluster(file));

  startLoad();
  expectGrownToTwo("decode", "DecodePool");
  expectSteadyAtOne("prefill", kEasyTargetSeconds);
  EXPECT_TRUE(eventually([&] { return disaggregated_ > 0; })) << lastFailure();
  stopLoad();
}

TEST_F(LocalPlannerTest, ATakenMetricsPortStopsLocalModeBeforeAnyAgentStarts) {
  // A port another process listens on.
  int port = 0;
  const int holder = listenLoopback(&port);
  ASSERT_GE(holder, 0);

  const fs::path file = dir_.write("cluster.yaml", clusterYaml(files(SlowPool::kPrefill), 1));
  LocalModeOptions with_port = options(file);
  with_port.metrics_port = port;
  mode_ = std::make_unique<LocalMode>(with_port, realRouter());
  start(*mode_);
  ASSERT_TRUE(eventually([&] { return !runError().empty(); }, seconds(10)));
  runner_.join();
  ::close(holder);
  EXPECT_EQ(runError(),
            "metrics port: cannot listen on 127.0.0.1:" + std::to_string(port) +
                " (in use, or not an address of this machine); pass another --metrics-port, or 0 "
                "for a free one");
  EXPECT_TRUE(mode_->agents().empty());
  EXPECT_EQ(mode_->routerPort(), 0);
}

// `tandem-operator local --metrics-port 0` as a user runs it: the port is
// printed, GET /metrics on it shows the pools and the planner's decisions,
// and it closes when the operator stops.
TEST_F(LocalPlannerTest, TheOperatorServesTheMetricsPortItPrints) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(files(SlowPool::kPrefill), 1));
  Subprocess op({(fs::path(TANDEM_BIN_DIR) / "tandem-operator").string(), "local", "-f",
                 file.string(), "--port", "0", "--metrics-port", "0", "--planner-interval", "0.1"},
                dir_.path() / "operator.stderr");
  const std::string line = op.waitForLine("metrics listening on 127.0.0.1:", seconds(60));
  ASSERT_FALSE(line.empty()) << op.stderrText();
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  ASSERT_FALSE(op.waitForLine("router listening on ", seconds(60)).empty()) << op.stderrText();
  httplib::Client client("127.0.0.1", port);
  auto sample = [&](const std::string& name, const std::string& labels) {
    auto response = client.Get("/metrics");
    return response && response->status == 200 ? prometheusSample(response->body, name, labels)
                                               : std::nullopt;
  };
  EXPECT_TRUE(eventually([&] {
    return sample("tandem_planner_desired_replicas", "pool=\"prefill\"") == 1.0 &&
           sample("tandem_planner_desired_replicas", "pool=\"decode\"") == 1.0;
  })) << op.stderrText();
  EXPECT_EQ(sample("tandem_planner_target_seconds", "pool=\"prefill\",kind=\"PrefillPool\""),
            kMissedTargetSeconds);
  EXPECT_EQ(sample("tandem_planner_target_seconds", "pool=\"decode\",kind=\"DecodePool\""),
            kEasyTargetSeconds);
  EXPECT_EQ(sample("tandem_local_pool_replicas", "pool=\"decode\""), 1.0);
  EXPECT_EQ(sample("tandem_local_agents", "pool=\"prefill\",kind=\"PrefillPool\",state=\"ready\""),
            1.0);
  EXPECT_EQ(client.Get("/other")->status, 404);

  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
  EXPECT_FALSE(client.Get("/metrics")) << "the metrics port closed with the operator";
}

}  // namespace
}  // namespace tandem::local
