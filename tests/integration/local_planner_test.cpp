// The SLA planner in local mode, end to end with real agents: LocalMode runs a
// cluster file whose pools have spec.autoscaling (a fake router records what
// it is told; requests go to the agents directly). A TTFT target no request
// can meet grows the prefill pool while the decode pool, well inside its ITL
// target, stays at one agent; once the load is gone the prefill pool shrinks
// back to minReplicas after its scale-down window; a replica count edited in
// the file is respected for the stabilisation window and then overwritten.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/prometheus_text.h"
#include "common/status.h"
#include "operator/local/local_mode.h"
#include "tests/support/agent_server.h"

namespace tandem::local {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using testing::TempDir;

// Prefill scaled on a TTFT target of 0.1 ms (never met), decode on an ITL
// target of 100 s (always met); short windows so that the test moves fast.
std::string clusterYaml(int prefill_replicas) {
  auto pool = [](const std::string& kind, const std::string& name, int replicas,
                 const std::string& autoscaling) {
    return "apiVersion: tandem.dev/v1alpha1\nkind: " + kind + "\nmetadata:\n  name: " + name +
           "\nspec:\n  replicas: " + std::to_string(replicas) +
           "\n  model:\n    path: " + testing::tinyModelDir().string() +
           "\n    name: tiny\n  engine:\n    numBlocks: 128\n    threads: 1\n"
           "    shutdownTimeoutSeconds: 5\n  autoscaling:\n" +
           autoscaling;
  };
  const std::string pacing =
      "    windowSeconds: 3\n    scaleUpStabilizationSeconds: 0\n"
      "    scaleDownStabilizationSeconds: 2\n";
  return pool("PrefillPool", "prefill", prefill_replicas,
              "    minReplicas: 1\n    maxReplicas: 3\n    targetTTFTSeconds: 0.0001\n" + pacing) +
         "---\n" +
         pool("DecodePool", "decode", 1,
              "    minReplicas: 1\n    maxReplicas: 3\n    targetITLSeconds: 100\n" + pacing);
}

void rewrite(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".new";
  std::ofstream(temporary, std::ios::binary) << text;
  fs::rename(temporary, path);
}

class NullRouter final : public RouterHandle {
 public:
  int port() const override { return 18001; }
  void setAgents(std::vector<AgentAddress>, std::vector<AgentAddress>) override {}
  void stop(double) override {}
};

class LocalPlannerTest : public ::testing::Test {
 protected:
  LocalModeOptions options(const fs::path& file) {
    LocalModeOptions options;
    options.cluster_file = file;
    options.reload_interval = milliseconds(100);
    options.planner_interval = milliseconds(250);
    options.supervisor.agent_binary = fs::path(TANDEM_BIN_DIR) / "tandem-agent";
    options.supervisor.initial_backoff = milliseconds(100);
    options.supervisor.startup_timeout = seconds(60);
    options.supervisor.stop_timeout = seconds(10);
    options.supervisor.output = [](const std::string&) {};
    return options;
  }
  RouterFactory nullRouter() {
    return [this](const RouterSpec&, std::vector<AgentAddress>, std::vector<AgentAddress>) {
      router_started_ = true;
      return std::make_unique<NullRouter>();
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
  void TearDown() override {
    stopLoad();
    if (runner_.joinable()) runner_.join();
  }

  // Agents of `pool` that run or start (not those being stopped).
  static int poolSize(const LocalMode& mode, const std::string& pool) {
    const auto agents = mode.agents();
    return static_cast<int>(std::count_if(agents.begin(), agents.end(), [&](const AgentStatus& a) {
      return a.pool == pool && a.state != AgentState::kStopping;
    }));
  }
  static std::optional<AgentStatus> agent(const LocalMode& mode, const std::string& name) {
    for (const AgentStatus& status : mode.agents()) {
      if (status.name == name) return status;
    }
    return std::nullopt;
  }
  static bool hasEvent(const LocalMode& mode, const std::string& pool, const std::string& reason) {
    const auto events = mode.plannerEvents();
    return std::any_of(events.begin(), events.end(), [&](const PlannerEventRecord& record) {
      return record.pool == pool && record.event.reason == reason;
    });
  }
  static std::optional<planner::Decision> lastDecision(const LocalMode& mode,
                                                       const std::string& pool) {
    for (const PoolPlannerStatus& status : mode.plannerStatus()) {
      if (status.pool == pool) return status.decision;
    }
    return std::nullopt;
  }

  // Requests, one after the other, to each of `ports` in turn until stopLoad().
  void startLoad(std::vector<int> ports) {
    load_ = std::thread([this, ports] {
      uint32_t seed = 1;
      while (!stop_load_) {
        for (int port : ports) {
          httplib::Client client("127.0.0.1", port);
          client.set_read_timeout(30, 0);
          auto response = client.Post("/v1/completions",
                                      testing::greedy(testing::randomPrompt(24, seed++), 4).dump(),
                                      "application/json");
          if (response && response->status == 200) ++completed_;
        }
      }
    });
  }
  void stopLoad() {
    stop_load_ = true;
    if (load_.joinable()) load_.join();
  }

  TempDir dir_{"tandem-local-planner-test"};
  std::atomic<bool> router_started_{false};
  std::atomic<bool> stop_load_{false};
  std::atomic<int> completed_{0};
  std::mutex mutex_;
  std::string run_error_;
  std::thread runner_;
  std::thread load_;
};

TEST_F(LocalPlannerTest, ScalesPrefillOnTtftAndBackWhenTheLoadIsGone) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1));
  LocalMode mode(options(file), nullRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return router_started_.load(); }, seconds(60))) << run_error_;
  const AgentStatus prefill = *agent(mode, "prefill-0");
  const AgentStatus decode = *agent(mode, "decode-0");

  // The agents export the queued prefill backlog the planner reads.
  {
    httplib::Client client("127.0.0.1", prefill.port);
    auto response = client.Get("/metrics");
    ASSERT_TRUE(response);
    EXPECT_EQ(prometheusSample(response->body, "tandem_num_prefill_tokens_waiting"), 0.0);
  }

  // Load on both pools: the prefill pool misses its TTFT target and grows;
  // the decode pool meets its ITL target and stays at one agent.
  startLoad({prefill.port, decode.port});
  ASSERT_TRUE(eventually([&] { return poolSize(mode, "prefill") > 1; }, seconds(40)))
      << "completed " << completed_ << " requests; prefill decision: "
      << (lastDecision(mode, "prefill") ? lastDecision(mode, "prefill")->message : "none");
  EXPECT_TRUE(hasEvent(mode, "prefill", "ScaledUp"));
  // A planned replica is a real agent that becomes ready.
  EXPECT_TRUE(eventually(
      [&] {
        auto added = agent(mode, "prefill-1");
        return added && added->state == AgentState::kReady;
      },
      seconds(30)));
  // The decode pool was planned on its ITL all along and kept its one agent.
  ASSERT_TRUE(eventually([&] {
    auto decision = lastDecision(mode, "decode");
    return decision && decision->metrics.observed_seconds.has_value();
  }));
  EXPECT_EQ(lastDecision(mode, "decode")->desired_replicas, 1);
  EXPECT_EQ(poolSize(mode, "decode"), 1);
  EXPECT_FALSE(hasEvent(mode, "decode", "ScaledUp"));
  EXPECT_EQ(agent(mode, "decode-0")->pid, decode.pid);
  // The planner's metrics: the prefill pool's target and what it asked for.
  const std::string metrics = mode.plannerMetrics();
  EXPECT_EQ(prometheusSample(metrics, "tandem_planner_target_seconds", "pool=\"prefill\""), 0.0001);
  EXPECT_GT(
      prometheusSample(metrics, "tandem_planner_desired_replicas", "pool=\"prefill\"").value_or(0),
      1.0);
  EXPECT_EQ(prometheusSample(metrics, "tandem_planner_desired_replicas", "pool=\"decode\""), 1.0);

  // The load stops: no request in the window, so back to minReplicas once the
  // scale-down window has passed.
  stopLoad();
  ASSERT_TRUE(eventually([&] { return poolSize(mode, "prefill") == 1; }, seconds(30)))
      << (lastDecision(mode, "prefill") ? lastDecision(mode, "prefill")->message : "none");
  EXPECT_TRUE(hasEvent(mode, "prefill", "ScaledDown"));
  EXPECT_EQ(agent(mode, "prefill-0")->pid, prefill.pid);
  EXPECT_EQ(poolSize(mode, "decode"), 1);

  // Two prefill replicas written in the file: a manual change, applied and
  // respected for the stabilisation window, then overwritten (no load).
  rewrite(file, clusterYaml(2));
  ASSERT_TRUE(eventually([&] { return poolSize(mode, "prefill") == 2; }, seconds(10)));
  EXPECT_TRUE(eventually([&] { return hasEvent(mode, "prefill", "ManualScaleRespected"); }));
  ASSERT_TRUE(eventually([&] { return poolSize(mode, "prefill") == 1; }, seconds(30)));
  EXPECT_TRUE(hasEvent(mode, "prefill", "ManualScaleOverwritten"));
  EXPECT_EQ(mode.fileError(), "");

  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
  const std::vector<AgentStatus> left = mode.agents();
  EXPECT_TRUE(
      std::all_of(left.begin(), left.end(), [](const AgentStatus& a) { return a.pid == 0; }));
}

}  // namespace
}  // namespace tandem::local
