// Local mode with real agents: LocalMode in-process (a fake router records
// what it is told) starts a cluster file's pools, restarts a killed agent,
// follows edits of the file and leaves no process behind; tandem-operator
// itself serves through its router and stops everything on SIGTERM.
#include "operator/local/local_mode.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/prometheus_text.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "tests/support/agent_server.h"
#include "tests/support/drain_checks.h"
#include "tests/support/hub/hub_server.h"
#include "tools/model/test_model.h"

namespace tandem::local {
namespace {

namespace fs = std::filesystem;
using spec::AgentAddress;
using spec::RouterSpec;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;
using testing::TempDir;

// A cluster file for the tiny test model: light agents (one kernel thread,
// 128 KV blocks), short prompts disaggregated.
std::string clusterYaml(int prefill_replicas, int decode_replicas,
                        const std::string& prefill_model = testing::tinyModelDir().string()) {
  auto pool = [](const std::string& kind, const std::string& name, int replicas,
                 const std::string& model) {
    return "apiVersion: tandem.dev/v1alpha1\nkind: " + kind + "\nmetadata:\n  name: " + name +
           "\nspec:\n  replicas: " + std::to_string(replicas) + "\n  model:\n    path: " + model +
           "\n    name: tiny\n  engine:\n    numBlocks: 128\n    threads: 1\n"
           "    shutdownTimeoutSeconds: 5\n";
  };
  return pool("PrefillPool", "prefill", prefill_replicas, prefill_model) + "---\n" +
         pool("DecodePool", "decode", decode_replicas, testing::tinyModelDir().string()) +
         "---\napiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n"
         "  disaggThresholdTokens: 16\n";
}

// `yaml` with `lines` (fields of spec, two spaces deep) added to its
// DecodePool document's spec.
std::string withDecodeSpec(std::string yaml, const std::string& lines) {
  const size_t spec = yaml.find("\nspec:\n", yaml.find("kind: DecodePool"));
  yaml.insert(spec + 7, lines);
  return yaml;
}

// `yaml` with its agents' shutdown timeout (clusterYaml's 5 s) at
// `seconds`: every pool's, or (`decode_only`) the DecodePool's, which
// clusterYaml writes after the PrefillPool.
std::string withShutdownTimeout(std::string yaml, int seconds, bool decode_only) {
  const std::string five = "shutdownTimeoutSeconds: 5\n";
  const std::string set = "shutdownTimeoutSeconds: " + std::to_string(seconds) + "\n";
  size_t at = decode_only ? yaml.find("kind: DecodePool") : 0;
  while ((at = yaml.find(five, at)) != std::string::npos) yaml.replace(at, five.size(), set);
  return yaml;
}

// `yaml` with its decode agents' shutdown timeout at 30 s (their default),
// not the 5 s of clusterYaml: for tests whose streams are handed over to
// agents started at the drain, whose KV the drained agents hold that long;
// a loaded machine starts an agent more slowly than 5 s.
std::string withDecodeHoldingHandedOverKv(const std::string& yaml) {
  return withShutdownTimeout(yaml, 30, /*decode_only=*/true);
}

// An env entry of the DecodePool's spec: a change of spec that leaves the
// command line alone.
std::string decodeEnv(const std::string& value) {
  return "  env:\n    - name: TANDEM_ROLLOUT_TEST\n      value: \"" + value + "\"\n";
}

// clusterYaml for the small model, so that streams last seconds.
std::string smallClusterYaml(int prefill_replicas, int decode_replicas) {
  std::string yaml = clusterYaml(prefill_replicas, decode_replicas);
  const std::string tiny = testing::tinyModelDir().string();
  for (size_t at; (at = yaml.find(tiny)) != std::string::npos;) {
    yaml.replace(at, tiny.size(), testing::smallModelDir().string());
  }
  for (size_t at; (at = yaml.find("numBlocks: 128")) != std::string::npos;) {
    yaml.replace(at, 14, "numBlocks: 512");
  }
  return yaml;
}

// Replaces the file's content (a new inode, as editors save).
void rewrite(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".new";
  std::ofstream(temporary, std::ios::binary) << text;
  fs::rename(temporary, path);
}

// The whole of a /proc file; "" when it cannot be read. A process that exits
// between open and read makes the read fail (ESRCH), which iostreams report
// by throwing from the stream buffer: plain reads keep that a quiet "".
std::string readProcFile(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  return n < 0 ? "" : text;
}

// Live or unreaped children of `parent`.
std::vector<pid_t> childPids(pid_t parent) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const std::string text = readProcFile(entry.path() / "stat");
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(text.substr(paren + 1));
    char state = 0;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) pids.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return pids;
}

// A process that runs; a zombie (exited, not yet reaped: an orphan's reaper
// may take its time) counts as gone.
bool processExists(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t name_end = text.rfind(')');
  return name_end == std::string::npos || name_end + 2 >= text.size() || text[name_end + 2] != 'Z';
}

bool healthy(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1, 0);
  auto response = client.Get("/health");
  return response && response->status == 200;
}

// The router reports `agent` healthy (its /health needs only a decode agent;
// a request routed before it has seen the prefill agent is prefilled
// locally).
bool routerSeesHealthy(int port, const std::string& agent) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1, 0);
  auto response = client.Get("/metrics");
  return response && tandem::prometheusSample(response->body, "tandem_router_agent_healthy",
                                              "agent=\"" + agent + "\"")
                             .value_or(0) == 1;
}

// What local mode told the router.
struct RouterLog {
  std::mutex mutex;
  bool started = false;
  bool stopped = false;
  RouterSpec spec;
  // Each agent set the router had: the first one, then every setAgents().
  std::vector<std::pair<std::vector<AgentAddress>, std::vector<AgentAddress>>> history;

  bool isStarted() {
    std::lock_guard<std::mutex> lock(mutex);
    return started;
  }
  std::pair<std::vector<AgentAddress>, std::vector<AgentAddress>> current() {
    std::lock_guard<std::mutex> lock(mutex);
    return history.empty() ? decltype(history)::value_type{} : history.back();
  }
};

class FakeRouter final : public RouterHandle {
 public:
  FakeRouter(std::shared_ptr<RouterLog> log, int port) : log_(std::move(log)), port_(port) {}
  int port() const override { return port_; }
  void setAgents(std::vector<AgentAddress> prefill, std::vector<AgentAddress> decode) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->history.emplace_back(std::move(prefill), std::move(decode));
  }
  void stop(double) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->stopped = true;
  }

 private:
  std::shared_ptr<RouterLog> log_;
  int port_;
};

class LocalModeTest : public ::testing::Test {
 protected:
  LocalModeOptions options(const fs::path& file) {
    LocalModeOptions options;
    options.cluster_file = file;
    options.port = 18000;  // the fake router binds nothing
    options.reload_interval = milliseconds(100);
    options.supervisor.agent_binary = fs::path(TANDEM_BIN_DIR) / "tandem-agent";
    options.supervisor.initial_backoff = milliseconds(100);
    options.supervisor.startup_timeout = seconds(120);
    options.supervisor.stop_timeout = seconds(10);
    options.supervisor.output = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(lines_mutex_);
      lines_.push_back(line);
    };
    return options;
  }
  RouterFactory fakeRouter() {
    return [log = log_](const RouterSpec& spec, std::vector<AgentAddress> prefill,
                        std::vector<AgentAddress> decode) {
      std::lock_guard<std::mutex> lock(log->mutex);
      log->started = true;
      log->spec = spec;
      log->history.emplace_back(std::move(prefill), std::move(decode));
      return std::make_unique<FakeRouter>(log, spec.port.value_or(8000));
    };
  }
  bool printed(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(lines_mutex_);
    return std::any_of(lines_.begin(), lines_.end(),
                       [&](const std::string& line) { return line.starts_with(prefix); });
  }
  std::optional<AgentStatus> agent(const LocalMode& mode, const std::string& name) {
    for (const AgentStatus& status : mode.agents()) {
      if (status.name == name) return status;
    }
    return std::nullopt;
  }
  bool ready(const LocalMode& mode, const std::string& name) {
    auto status = agent(mode, name);
    return status && status->state == AgentState::kReady;
  }
  // The agent ready again in another process than `old_pid` within a minute.
  bool readyAgain(const LocalMode& mode, const std::string& name, pid_t old_pid) {
    return eventually(
        [&] {
          auto now = agent(mode, name);
          return now && now->state == AgentState::kReady && now->pid != old_pid;
        },
        seconds(60));
  }
  // Runs `mode` on a thread; the error it threw, if any, lands in run_error_.
  void start(LocalMode& mode) {
    runner_ = std::thread([this, &mode] {
      try {
        mode.run();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(lines_mutex_);
        run_error_ = e.what();
      }
    });
  }
  void TearDown() override {
    if (runner_.joinable()) runner_.join();
  }

  TempDir dir_{"tandem-local-mode-test"};
  std::shared_ptr<RouterLog> log_ = std::make_shared<RouterLog>();
  std::mutex lines_mutex_;
  std::vector<std::string> lines_;
  std::string run_error_;
  std::thread runner_;
};

TEST_F(LocalModeTest, StartsRestartsScalesAndStops) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  LocalMode mode(options(file), fakeRouter());
  start(mode);

  // Both agents ready, then the router started with them.
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  const AgentStatus prefill = *agent(mode, "prefill-0");
  const AgentStatus decode = *agent(mode, "decode-0");
  EXPECT_EQ(mode.agents().size(), 2u);
  EXPECT_EQ(prefill.state, AgentState::kReady);
  EXPECT_EQ(decode.state, AgentState::kReady);
  EXPECT_TRUE(healthy(prefill.port));
  EXPECT_TRUE(healthy(decode.port));
  EXPECT_EQ(log_->current().first,
            (std::vector<AgentAddress>{{"prefill-0", "127.0.0.1", prefill.port}}));
  EXPECT_EQ(log_->current().second,
            (std::vector<AgentAddress>{{"decode-0", "127.0.0.1", decode.port}}));
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    EXPECT_EQ(log_->spec.port, 18000);  // --port over the file
    EXPECT_EQ(log_->spec.disagg_threshold_tokens, 16);
    // None: the router reads the tokenizer where each agent's /v1/models
    // says, and follows a change of model.
    EXPECT_EQ(log_->spec.model_path, std::nullopt);
  }
  EXPECT_TRUE(printed("[prefill-0] listening on 127.0.0.1:" + std::to_string(prefill.port)));
  EXPECT_TRUE(printed("[decode-0] listening on 127.0.0.1:" + std::to_string(decode.port)));
  EXPECT_TRUE(printed("router listening on 127.0.0.1:18000"));

  // A killed agent is started again: a new process, healthy, given to the
  // router; meanwhile the router had no decode agent.
  ASSERT_EQ(::kill(decode.pid, SIGKILL), 0);
  ASSERT_TRUE(readyAgain(mode, "decode-0", decode.pid));
  const AgentStatus restarted = *agent(mode, "decode-0");
  EXPECT_EQ(restarted.restarts, 1);
  EXPECT_EQ(prometheusSample(mode.localModeMetrics(), "tandem_local_agent_restarts_total",
                             "pool=\"decode\",kind=\"DecodePool\""),
            1);
  EXPECT_EQ(prometheusSample(mode.localModeMetrics(), "tandem_local_agent_restarts_total",
                             "pool=\"prefill\",kind=\"PrefillPool\""),
            0);
  EXPECT_TRUE(healthy(restarted.port));
  EXPECT_FALSE(processExists(decode.pid));
  EXPECT_TRUE(eventually([&] {
    return log_->current().second ==
           std::vector<AgentAddress>{{"decode-0", "127.0.0.1", restarted.port}};
  }));
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    EXPECT_TRUE(std::any_of(log_->history.begin(), log_->history.end(),
                            [](const auto& agents) { return agents.second.empty(); }));
  }
  EXPECT_EQ(agent(mode, "prefill-0")->pid, prefill.pid);  // untouched

  // One drained from outside (SIGTERM), idle, exits at once, before a probe
  // sees it draining: it is replaced at once and not counted as a restart.
  // Before, its exit was a crash's: counted, and restarted after a backoff
  // that doubled with each such drain.
  ASSERT_EQ(::kill(restarted.pid, SIGTERM), 0);
  ASSERT_TRUE(readyAgain(mode, "decode-0", restarted.pid));
  EXPECT_EQ(agent(mode, "decode-0")->restarts, 1);
  EXPECT_EQ(prometheusSample(mode.localModeMetrics(), "tandem_local_agent_restarts_total",
                             "pool=\"decode\",kind=\"DecodePool\""),
            1);
  const AgentStatus replaced = *agent(mode, "decode-0");
  EXPECT_TRUE(eventually([&] {
    return log_->current().second ==
           std::vector<AgentAddress>{{"decode-0", "127.0.0.1", replaced.port}};
  }));

  // One more decode replica in the file: one more agent, given to the router.
  rewrite(file, clusterYaml(1, 2));
  ASSERT_TRUE(eventually([&] { return ready(mode, "decode-1"); }, seconds(60)));
  const AgentStatus added = *agent(mode, "decode-1");
  EXPECT_TRUE(healthy(added.port));
  EXPECT_TRUE(eventually([&] { return log_->current().second.size() == 2; }));
  EXPECT_EQ(agent(mode, "decode-0")->pid, replaced.pid);

  // An edit that does not parse changes nothing; the next good one applies.
  rewrite(file, clusterYaml(1, 1) + "  bogus: 1\n");
  ASSERT_TRUE(eventually([&] {
    return mode.fileError().find(": document 3 (Router): spec.bogus is not a field of spec") !=
           std::string::npos;
  }));
  EXPECT_EQ(mode.agents().size(), 3u);
  EXPECT_EQ(agent(mode, "decode-1")->pid, added.pid);
  rewrite(file, clusterYaml(1, 1));
  ASSERT_TRUE(eventually([&] { return !agent(mode, "decode-1"); }, seconds(30)));
  EXPECT_EQ(mode.fileError(), "");
  EXPECT_FALSE(processExists(added.pid));
  EXPECT_TRUE(eventually([&] { return log_->current().second.size() == 1; }));

  // Stop: the router, then every agent; nothing is left running.
  const std::vector<pid_t> agents = childPids(::getpid());
  EXPECT_EQ(agents.size(), 2u);
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
  EXPECT_TRUE(log_->stopped);
  EXPECT_EQ(childPids(::getpid()), std::vector<pid_t>{});
  for (pid_t pid : agents) EXPECT_FALSE(processExists(pid)) << pid;
}

// The environment of a running process, one "NAME=value" per entry.
std::vector<std::string> processEnvironment(pid_t pid) {
  const std::string text = readProcFile("/proc/" + std::to_string(pid) + "/environ");
  std::vector<std::string> entries;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\0', begin), text.size());
    entries.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return entries;
}

// The fewest and most decode agents the router had from history entry
// `from` on.
std::pair<size_t, size_t> decodeListBounds(RouterLog& log, size_t from) {
  std::lock_guard<std::mutex> lock(log.mutex);
  size_t low = SIZE_MAX, high = 0;
  for (size_t i = from; i < log.history.size(); ++i) {
    low = std::min(low, log.history[i].second.size());
    high = std::max(high, log.history[i].second.size());
  }
  return {low, high};
}

// An edited pool is rolled as a Deployment rolls it (spec.rollout). By
// default an extra agent with the new spec starts first and an old agent
// goes only once a new one is ready, so the router never has fewer decode
// agents than the pool's replicas; with maxSurge 0 and maxUnavailable 1,
// one agent at a time is replaced and there is no extra one. Either way
// every agent ends on the new spec, the extra agent is gone, no restart is
// counted, and the other pool is untouched. Before, every agent of the pool
// was restarted at once and the router had none meanwhile.
TEST_F(LocalModeTest, AnEditedPoolIsRolledAgentByAgentAsItsRolloutSays) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 2));
  LocalModeOptions rolled_options = options(file);
  rolled_options.supervisor.min_ready = milliseconds(300);
  LocalMode mode(rolled_options, fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  const pid_t prefill = agent(mode, "prefill-0")->pid;
  auto historySize = [&] {
    std::lock_guard<std::mutex> lock(log_->mutex);
    return log_->history.size();
  };
  auto updated = [&] {
    return prometheusSample(mode.localModeMetrics(), "tandem_local_pool_updated_agents",
                            "pool=\"decode\",kind=\"DecodePool\"")
        .value_or(-1);
  };
  // Both decode agents ready again, neither of them an `old` process, each
  // with `entry` in its environment, and no extra agent left.
  auto rolledTo = [&](const std::string& entry, const std::vector<pid_t>& old) {
    return eventually(
        [&] {
          if (agent(mode, "decode-2") || updated() != 2) return false;
          for (const std::string name : {"decode-0", "decode-1"}) {
            auto now = agent(mode, name);
            if (!now || now->state != AgentState::kReady ||
                std::find(old.begin(), old.end(), now->pid) != old.end()) {
              return false;
            }
            const std::vector<std::string> env = processEnvironment(now->pid);
            if (std::find(env.begin(), env.end(), entry) == env.end()) return false;
          }
          return true;
        },
        seconds(90));
  };
  EXPECT_EQ(updated(), 2);

  size_t from = historySize();
  std::vector<pid_t> old = {agent(mode, "decode-0")->pid, agent(mode, "decode-1")->pid};
  rewrite(file, withDecodeSpec(clusterYaml(1, 2), decodeEnv("1")));
  ASSERT_TRUE(rolledTo("TANDEM_ROLLOUT_TEST=1", old)) << run_error_;
  EXPECT_EQ(decodeListBounds(*log_, from), std::make_pair(size_t{2}, size_t{3}));

  from = historySize();
  old = {agent(mode, "decode-0")->pid, agent(mode, "decode-1")->pid};
  rewrite(file,
          withDecodeSpec(clusterYaml(1, 2),
                         "  rollout:\n    maxSurge: 0\n    maxUnavailable: 1\n" + decodeEnv("2")));
  ASSERT_TRUE(rolledTo("TANDEM_ROLLOUT_TEST=2", old)) << run_error_;
  EXPECT_EQ(decodeListBounds(*log_, from), std::make_pair(size_t{1}, size_t{2}));

  EXPECT_EQ(agent(mode, "prefill-0")->pid, prefill);
  EXPECT_EQ(prometheusSample(mode.localModeMetrics(), "tandem_local_agent_restarts_total",
                             "pool=\"decode\",kind=\"DecodePool\""),
            0);
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
  EXPECT_EQ(childPids(::getpid()), std::vector<pid_t>{});
}

// A scale-down during a rollout keeps the rollout's extra agent running,
// whatever its index now (here decode-3 of a pool cut from 3 to 2), and
// starts none in its place: the agent scaled away just goes. (The rollout
// is held at its first step: no agent is available before 60 s.)
TEST_F(LocalModeTest, AScaleDownDuringARolloutKeepsItsExtraAgent) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 3));
  LocalModeOptions held_options = options(file);
  held_options.supervisor.min_ready = seconds(60);
  LocalMode mode(held_options, fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  rewrite(file, withDecodeSpec(clusterYaml(1, 3), decodeEnv("1")));
  ASSERT_TRUE(eventually([&] { return ready(mode, "decode-3"); }, seconds(60))) << run_error_;
  const AgentStatus extra = *agent(mode, "decode-3");
  EXPECT_TRUE(extra.surge);
  EXPECT_TRUE(extra.updated);
  const pid_t kept = agent(mode, "decode-1")->pid;

  rewrite(file, withDecodeSpec(clusterYaml(1, 2), decodeEnv("1")));
  ASSERT_TRUE(eventually([&] { return !agent(mode, "decode-2"); }, seconds(30))) << run_error_;
  // A few polls later: nothing else changed.
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(agent(mode, "decode-2"));
  ASSERT_TRUE(agent(mode, "decode-3"));
  EXPECT_EQ(agent(mode, "decode-3")->pid, extra.pid);
  EXPECT_EQ(agent(mode, "decode-3")->state, AgentState::kReady);
  EXPECT_EQ(agent(mode, "decode-1")->pid, kept);
  EXPECT_EQ(mode.agents().size(), 4u);  // prefill-0, decode-0, decode-1, decode-3
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

// A second edit during a rollout makes its extra agent outdated: it is
// replaced by an extra agent of the newest spec, and once the rollout is
// done only the pool's replicas run. Before, the extra agent's replacement
// came back as a regular agent that nothing stopped.
TEST_F(LocalModeTest, ASecondEditDuringARolloutLeavesNoExtraAgentBehind) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  LocalModeOptions options_now = options(file);
  options_now.supervisor.min_ready = milliseconds(300);
  LocalMode mode(options_now, fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  rewrite(file, withDecodeSpec(clusterYaml(1, 1), decodeEnv("1")));
  ASSERT_TRUE(eventually([&] { return ready(mode, "decode-1"); }, seconds(60))) << run_error_;
  EXPECT_TRUE(agent(mode, "decode-1")->surge);
  rewrite(file, withDecodeSpec(clusterYaml(1, 1), decodeEnv("2")));
  // The rollout ends with decode-0 alone, of the newest spec.
  ASSERT_TRUE(eventually(
      [&] {
        const std::vector<AgentStatus> agents = mode.agents();
        return agents.size() == 2 && std::all_of(agents.begin(), agents.end(), [](const auto& a) {
                 return a.state == AgentState::kReady && a.updated && !a.surge;
               });
      },
      seconds(60)))
      << run_error_;
  // A few polls later: nothing else started.
  std::this_thread::sleep_for(milliseconds(800));
  EXPECT_EQ(mode.agents().size(), 2u);  // prefill-0, decode-0
  EXPECT_FALSE(agent(mode, "decode-1"));
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

// A new spec whose agents cannot start (here: its model is not there)
// stalls the rollout, as a Deployment's does: the extra agent fails and is
// retried with its backoff while the old agent keeps serving, the same
// process, still the router's. Putting the old spec back ends the rollout:
// the extra agent stops, and the old one was never touched.
TEST_F(LocalModeTest, ARolloutWhoseNewAgentsCannotStartLeavesTheOldOnesServing) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  LocalMode mode(options(file), fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  const AgentStatus decode = *agent(mode, "decode-0");
  const std::vector<AgentAddress> serving = {{"decode-0", "127.0.0.1", decode.port}};
  ASSERT_EQ(log_->current().second, serving);

  std::string broken = clusterYaml(1, 1);
  const std::string model = testing::tinyModelDir().string();
  broken.replace(broken.find(model, broken.find("kind: DecodePool")), model.size(),
                 (dir_.path() / "no-model").string());
  rewrite(file, broken);
  ASSERT_TRUE(eventually(
      [&] {
        auto extra = agent(mode, "decode-1");
        return extra && extra->restarts >= 2;
      },
      seconds(60)))
      << run_error_;
  const AgentStatus still = *agent(mode, "decode-0");
  EXPECT_EQ(still.pid, decode.pid);
  EXPECT_EQ(still.state, AgentState::kReady);
  EXPECT_EQ(log_->current().second, serving);

  rewrite(file, clusterYaml(1, 1));
  ASSERT_TRUE(eventually([&] { return !agent(mode, "decode-1"); }, seconds(30)));
  EXPECT_EQ(agent(mode, "decode-0")->pid, decode.pid);
  EXPECT_EQ(log_->current().second, serving);
  EXPECT_EQ(prometheusSample(mode.localModeMetrics(), "tandem_local_pool_updated_agents",
                             "pool=\"decode\",kind=\"DecodePool\""),
            1);
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

// A ready agent that stops answering (hung; here SIGSTOPped) is killed and
// started again, as a pod's liveness probe would have it; the agent that
// answers is left alone.
TEST_F(LocalModeTest, AnAgentThatStopsAnsweringIsKilledAndStartedAgain) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  LocalModeOptions hung_options = options(file);
  hung_options.supervisor.liveness_period = milliseconds(200);
  LocalMode mode(std::move(hung_options), fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  const AgentStatus prefill = *agent(mode, "prefill-0");
  const AgentStatus decode = *agent(mode, "decode-0");
  ASSERT_EQ(::kill(decode.pid, SIGSTOP), 0);
  ASSERT_TRUE(readyAgain(mode, "decode-0", decode.pid));
  EXPECT_EQ(agent(mode, "decode-0")->restarts, 1);
  EXPECT_TRUE(eventually([&] { return !processExists(decode.pid); }));
  EXPECT_EQ(agent(mode, "prefill-0")->pid, prefill.pid);
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

TEST_F(LocalModeTest, ABadFileStartsNothing) {
  std::string text = clusterYaml(1, 1);
  text.replace(text.rfind("numBlocks: 128"), 14, "numBlocks: lots");
  const fs::path file = dir_.write("cluster.yaml", text);
  LocalMode mode(options(file), fakeRouter());
  try {
    mode.run();
    FAIL() << "a bad file was run";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              file.string() +
                  ": document 2 (DecodePool \"decode\"): spec.engine.numBlocks must be a "
                  "positive integer, got \"lots\" (line 25)");
  }
  EXPECT_FALSE(log_->isStarted());
  EXPECT_EQ(childPids(::getpid()), std::vector<pid_t>{});
}

TEST_F(LocalModeTest, AnAgentThatCannotStartStopsTheCluster) {
  const fs::path file =
      dir_.write("cluster.yaml", clusterYaml(1, 1, (dir_.path() / "no-model").string()));
  LocalMode mode(options(file), fakeRouter());
  try {
    mode.run();
    FAIL() << "a cluster whose prefill agent cannot start was run";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "prefill-0 exited with status 1 before it was ready (its output is above, "
              "prefixed with its name)");
  }
  EXPECT_TRUE(printed("[prefill-0] tandem-agent: "));  // the agent's own reason
  EXPECT_FALSE(log_->isStarted());
  EXPECT_EQ(childPids(::getpid()), std::vector<pid_t>{});
}

TEST_F(LocalModeTest, TheRouterSignsWithTheDecodePoolsKvSecret) {
  // Both pools' agents take the secret from their kv_connector_extra_config;
  // the in-process router must sign its pull-back holds with the same one.
  std::string text = clusterYaml(1, 1);
  for (size_t at = text.find("    shutdownTimeoutSeconds: 5\n"); at != std::string::npos;
       at = text.find("    shutdownTimeoutSeconds: 5\n", at + 1)) {
    text.insert(at + 30, "  kvTransfer:\n    extraConfig:\n      secret: alpha\n");
  }
  const fs::path file = dir_.write("cluster.yaml", text);
  LocalMode mode(options(file), fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    EXPECT_EQ(log_->spec.kv_secret, "alpha");
  }
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

// Local mode's agents listen on loopback, where anyone on the host reaches
// them: without a secret a decode agent would follow any descriptor a
// client hands it, reading whatever blocks it names into its prefix cache.
// With none given, the run makes its own, which every agent and the router
// share: descriptors the prefill agent signs are followed, a client's are
// refused.
TEST_F(LocalModeTest, WithoutAKvSecretTheRunMakesOneThatAgentsAndRouterShare) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  LocalMode mode(options(file), fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  std::string secret;
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    secret = log_->spec.kv_secret;
  }
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << secret;
  for (const char* name : {"prefill-0", "decode-0"}) {
    const auto status = agent(mode, name);
    ASSERT_TRUE(status.has_value()) << name;
    EXPECT_NE(readProcFile("/proc/" + std::to_string(status->pid) + "/environ")
                  .find(std::string("TANDEM_KV_SECRET=") + secret + '\0'),
              std::string::npos)
        << name;
  }

  httplib::Client prefill("127.0.0.1", agent(mode, "prefill-0")->port);
  httplib::Client decode("127.0.0.1", agent(mode, "decode-0")->port);
  prefill.set_read_timeout(60, 0);
  decode.set_read_timeout(60, 0);
  const std::vector<int> prompt = testing::randomPrompt(70, 31);
  nlohmann::json produce = testing::greedy(prompt, 1);
  produce["kv_transfer_params"] = {{"do_remote_decode", true}};
  auto produced = prefill.Post("/v1/completions", produce.dump(), "application/json");
  ASSERT_TRUE(produced && produced->status == 200) << (produced ? produced->body : "");
  nlohmann::json params = nlohmann::json::parse(produced->body)["kv_transfer_params"];
  ASSERT_TRUE(params.contains("signature")) << params.dump();
  params["do_remote_prefill"] = true;

  // A client's descriptor: the producer's with its signature gone.
  nlohmann::json forged = testing::greedy(prompt, 4);
  forged["kv_transfer_params"] = params;
  forged["kv_transfer_params"].erase("signature");
  auto refused = decode.Post("/v1/completions", forged.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 403) << refused->body;
  EXPECT_NE(refused->body.find("kv_transfer_params.signature"), std::string::npos) << refused->body;

  nlohmann::json signed_body = testing::greedy(prompt, 4);
  signed_body["kv_transfer_params"] = params;
  auto served = decode.Post("/v1/completions", signed_body.dump(), "application/json");
  ASSERT_TRUE(served && served->status == 200) << (served ? served->body : "");
  auto metrics = decode.Get("/metrics");
  ASSERT_TRUE(metrics && metrics->status == 200);
  EXPECT_EQ(prometheusSample(metrics->body, "tandem_kv_blocks_loaded_total", "source=\"ucx\"")
                .value_or(-1),
            4)
      << metrics->body;
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

// The agents of one cluster sign and check their KV requests with one
// secret: a pool with a secret of its own beside one without (which got the
// run's), or two pools with different ones, are refused at start naming
// them (each decode agent refused every prefill agent's descriptor: every
// request a 403), and no agent starts; a reload making them so is refused.
TEST_F(LocalModeTest, PoolsWhoseKvSecretsDifferAreRefusedAtStart) {
  const std::string base = clusterYaml(1, 1);
  const size_t prefill_end = base.find("    shutdownTimeoutSeconds: 5\n") + 30;
  const size_t decode_end = base.find("    shutdownTimeoutSeconds: 5\n", prefill_end) + 30;
  auto with = [&](const std::string& prefill, const std::string& decode) {
    std::string text = base;
    text.insert(decode_end, decode);  // the later place first
    text.insert(prefill_end, prefill);
    return text;
  };
  const std::string alpha = "  kvTransfer:\n    extraConfig:\n      secret: alpha\n";
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           // An empty TANDEM_KV_SECRET in its env is none.
           {with(alpha, "  env:\n    - name: TANDEM_KV_SECRET\n      value: \"\"\n"),
            "pool prefill has a KV secret and pool decode has none: the agents of one cluster "
            "sign and check their KV requests with one (set the same kvTransfer.extraConfig."
            "secret or TANDEM_KV_SECRET on every pool, or on none: local mode then makes one)"},
           {with(alpha, "  env:\n    - name: TANDEM_KV_SECRET\n      value: beta\n"),
            "pools prefill and decode have different KV secrets: the agents of one cluster sign "
            "and check their KV requests with one (set the same kvTransfer.extraConfig.secret or "
            "TANDEM_KV_SECRET on every pool, or on none: local mode then makes one)"},
       }) {
    const fs::path file = dir_.write("cluster.yaml", text);
    LocalMode mode(options(file), fakeRouter());
    start(mode);
    runner_.join();
    EXPECT_EQ(run_error_, message);
    EXPECT_TRUE(childPids(::getpid()).empty());
    run_error_.clear();
  }
  // A reload that would make them so is refused, the running cluster kept.
  const fs::path file = dir_.write("cluster.yaml", base);
  LocalMode mode(options(file), fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return log_->isStarted(); }, seconds(120))) << run_error_;
  const std::vector<pid_t> running = childPids(::getpid());
  rewrite(file, with(alpha, ""));
  ASSERT_TRUE(eventually([&] {
    return mode.fileError() ==
           "pool prefill has a KV secret and pool decode has none: the agents of one cluster "
           "sign and check their KV requests with one (set the same kvTransfer.extraConfig."
           "secret or TANDEM_KV_SECRET on every pool, or on none: local mode then makes one)";
  })) << mode.fileError();
  EXPECT_EQ(childPids(::getpid()), running);
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
}

TEST_F(LocalModeTest, StopWhileStartingStopsTheAgents) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  LocalMode mode(options(file), fakeRouter());
  start(mode);
  ASSERT_TRUE(eventually([&] { return childPids(::getpid()).size() == 2; }));
  mode.requestStop();
  runner_.join();
  EXPECT_EQ(run_error_, "");
  EXPECT_FALSE(log_->isStarted());
  EXPECT_EQ(childPids(::getpid()), std::vector<pid_t>{});
}

// tandem-operator itself, with its in-process router.
// A metric of the agent on `port`; 0 when absent or unanswered.
double agentMetric(int port, const std::string& name, const std::string& filter = "") {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  return res ? prometheusSample(res->body, name, filter).value_or(0) : 0.0;
}

// `count` greedy streamed completions of `tokens` for the small model,
// prompts of 40, 41, ... random tokens from seeds `seed`, `seed` + 1, ...
std::vector<nlohmann::json> smallStreamBodies(int count, uint32_t seed, int tokens) {
  std::vector<nlohmann::json> bodies;
  for (int i = 0; i < count; ++i) {
    nlohmann::json body =
        testing::greedy(testing::randomPrompt(40 + i, seed + static_cast<uint32_t>(i)), tokens);
    body["stream"] = true;
    bodies.push_back(body);
  }
  return bodies;
}

// The streams a colocated agent of the small model gives `bodies`, all at once.
std::vector<testing::StreamedCompletion> colocatedSmallStreams(
    const std::vector<nlohmann::json>& bodies) {
  std::vector<testing::StreamedCompletion> streams;
  testing::Agent colocated({}, testing::smallModelDir());
  for (auto& client : testing::streamConcurrently(colocated.port(), bodies, streams)) {
    client.join();
  }
  return streams;
}

// Each stream is the undisturbed one: no error event, one [DONE], `tokens`
// token ids, the same ids and text.
void expectUndisturbed(const std::vector<testing::StreamedCompletion>& streams,
                       const std::vector<testing::StreamedCompletion>& undisturbed, int tokens) {
  ASSERT_EQ(streams.size(), undisturbed.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    EXPECT_EQ(streams[i].errors, "");
    EXPECT_EQ(streams[i].done, 1);
    EXPECT_EQ(streams[i].ids.size(), static_cast<size_t>(tokens));
    EXPECT_EQ(streams[i].ids, undisturbed[i].ids);
    EXPECT_EQ(streams[i].text, undisturbed[i].text);
  }
}

// Reads tandem-operator's output up to "router listening on": the agents'
// ports (from their forwarded "listening on" lines) into `ports`; returns
// the router's, 0 when the output ended first.
int readPorts(Subprocess& op, std::map<std::string, int>& ports) {
  for (;;) {
    const std::string line = op.waitForLine("", seconds(120));
    if (line.empty()) return 0;
    const size_t colon = line.rfind(':');
    if (line.starts_with("router listening on ")) return std::stoi(line.substr(colon + 1));
    const size_t close = line.find("] listening on ");
    if (line.starts_with("[") && close != std::string::npos) {
      ports[line.substr(1, close - 1)] = std::stoi(line.substr(colon + 1));
    }
  }
}

class OperatorBinaryTest : public ::testing::Test {
 protected:
  // tandem-operator local on a cluster of one prefill and one decode agent,
  // once its router listens.
  std::unique_ptr<Subprocess> startOneByOne() {
    const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
    auto op = std::make_unique<Subprocess>(
        std::vector<std::string>{binary_.string(), "local", "-f", file.string(), "--port", "0"},
        dir_.path() / "stderr");
    EXPECT_FALSE(op->waitForLine("router listening on ", seconds(120)).empty()) << op->stderrText();
    return op;
  }

  void rollDecodePoolUnderStreams(int replicas);
  // Reads the agents' ports (readPorts) and waits until the router sees
  // `agent` healthy; the router's port, 0 on failure (the test then failed).
  int waitForRouterSeeing(Subprocess& op, std::map<std::string, int>& ports,
                          const std::string& agent);
  // The decode pool's rollout ends, and no agent was killed on the way.
  void expectDecodeRolledWithoutAKill(Subprocess& op);

  // Within 30 s, decode-0 and decode-1 (their ports in `ports`) each run
  // two streams at once.
  bool decodeAgentsRunTwoStreamsEach(std::map<std::string, int>& ports) {
    return eventually(
        [&] {
          return agentMetric(ports["decode-0"], "tandem_num_requests_running") >= 2 &&
                 agentMetric(ports["decode-1"], "tandem_num_requests_running") >= 2;
        },
        seconds(30));
  }
  // The ports of the next `count` decode agents to print "listening on"
  // (replacements), by name; fewer when none comes within 60 s.
  std::map<std::string, int> newDecodeAgentPorts(Subprocess& op, size_t count) {
    std::map<std::string, int> fresh;
    while (fresh.size() < count) {
      const std::string line = op.waitForLine("[decode-", seconds(60));
      if (line.empty()) break;
      const size_t close = line.find("] listening on ");
      if (close != std::string::npos) {
        fresh[line.substr(1, close - 1)] = std::stoi(line.substr(line.rfind(':') + 1));
      }
    }
    return fresh;
  }

  fs::path binary_ = fs::path(TANDEM_BIN_DIR) / "tandem-operator";
  TempDir dir_{"tandem-operator-test"};
};

// An agent that cannot start at the cluster's first start stops it, exit
// status 1 with the reason; nothing in the log promises a restart that
// never comes.
TEST_F(OperatorBinaryTest, AnAgentThatCannotStartIsNotSaidToStartAgain) {
  const fs::path file =
      dir_.write("cluster.yaml", clusterYaml(1, 1, (dir_.path() / "no-model").string()));
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  EXPECT_EQ(op.wait(seconds(120)), 1) << op.stderrText();
  const std::string log = op.stderrText();
  EXPECT_NE(log.find("exited with status 1 before it was ready"), std::string::npos) << log;
  EXPECT_EQ(log.find("starting it again"), std::string::npos) << log;
  op.readStdout(milliseconds(10));
}

TEST_F(OperatorBinaryTest, ServesThroughTheRouterAndStopsEverythingOnCtrlC) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  // In a group of its own, as a shell runs a foreground command.
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr", {}, /*own_process_group=*/true);
  const std::string line = op.waitForLine("router listening on ", seconds(120));
  ASSERT_FALSE(line.empty()) << op.stderrText();
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  ASSERT_TRUE(eventually([&] { return healthy(port) && routerSeesHealthy(port, "prefill-0"); }))
      << op.stderrText();

  // One request, prefilled on prefill-0 and decoded on decode-0.
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  auto response =
      client.Post("/v1/completions", testing::greedy(testing::randomPrompt(75, 7), 8).dump(),
                  "application/json");
  ASSERT_TRUE(response) << op.stderrText();
  EXPECT_EQ(response->status, 200) << response->body;
  EXPECT_EQ(response->get_header_value("x-tandem-prefill-agent"), "prefill-0");
  EXPECT_EQ(response->get_header_value("x-tandem-decode-agent"), "decode-0");
  EXPECT_EQ(response->get_header_value("x-tandem-kv-blocks-moved"), "4");
  EXPECT_EQ(testing::tokenIds(nlohmann::json::parse(response->body)).size(), 8u);

  const std::vector<pid_t> agents = childPids(op.pid());
  ASSERT_EQ(agents.size(), 2u);
  // Each agent leads a group of its own: Ctrl-C in a terminal (SIGINT to
  // the foreground group) reaches tandem-operator alone, which stops the
  // router first and then the agents; sent to the agents too, it drained
  // them all at once under the router's streams.
  for (pid_t pid : agents) EXPECT_EQ(::getpgid(pid), pid) << pid;
  op.readStdout(milliseconds(10));  // its pipe must not fill
  ASSERT_EQ(::kill(-op.pid(), SIGINT), 0);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
  for (pid_t pid : agents) EXPECT_FALSE(processExists(pid)) << pid;
  const std::string output = op.readStdout(seconds(1));
  EXPECT_NE(output.find("[decode-0] "), std::string::npos) << output;
  // Agents drain on SIGTERM: their signals are blocked before they start, so
  // sigwait() takes it whatever thread the agent had started.
  const std::string log = op.stderrText();
  for (const char* name : {"prefill-0", "decode-0"}) {
    EXPECT_NE(log.find(std::string("local: ") + name + " (pid "), std::string::npos) << log;
  }
  EXPECT_EQ(log.find("was killed by signal"), std::string::npos) << log;
  EXPECT_NE(log.find("local: stopped"), std::string::npos) << log;
}

// Killed with SIGKILL (or its terminal gone), tandem-operator leaves no
// agent behind: each gets SIGTERM when it dies (PR_SET_PDEATHSIG), drains
// and exits.
TEST_F(OperatorBinaryTest, AgentsEndWithAKilledOperator) {
  std::unique_ptr<Subprocess> started = startOneByOne();
  Subprocess& op = *started;
  const std::vector<pid_t> agents = childPids(op.pid());
  ASSERT_EQ(agents.size(), 2u) << op.stderrText();
  op.signal(SIGKILL);
  EXPECT_EQ(op.wait(seconds(10)), 128 + SIGKILL);
  for (pid_t pid : agents) {
    EXPECT_TRUE(eventually([&] { return !processExists(pid); }, seconds(40))) << pid;
  }
}

// A second SIGTERM (or Ctrl-C) while the first stop waits stops at once:
// every agent is killed and tandem-operator exits 130. Here one agent is
// stopped (SIGSTOP) and cannot drain, so the first stop alone would wait
// --stop-timeout (10 s) for it.
TEST_F(OperatorBinaryTest, ASecondSignalStopsAtOnceLeavingNoAgent) {
  std::unique_ptr<Subprocess> started = startOneByOne();
  Subprocess& op = *started;
  const std::vector<pid_t> agents = childPids(op.pid());
  ASSERT_EQ(agents.size(), 2u) << op.stderrText();
  ASSERT_EQ(::kill(agents[0], SIGSTOP), 0);
  op.signal(SIGTERM);
  ASSERT_TRUE(eventually([&] {
    return op.stderrText().find("local: stopping the agents") != std::string::npos;
  })) << op.stderrText();
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(5)), 130) << op.stderrText();
  for (pid_t pid : agents) {
    EXPECT_TRUE(eventually([&] { return !processExists(pid); })) << pid;
  }
  EXPECT_NE(op.stderrText().find("again: killing every agent and exiting now"), std::string::npos)
      << op.stderrText();
}

// A pool whose model comes from the Hub: local mode fetches it (with the
// token from its environment) into its model cache and serves it under the
// repository's name.
TEST_F(OperatorBinaryTest, AnHfSourceIsFetchedIntoTheCacheAndServed) {
  testing::HubServer hub;
  const std::string commit =
      hub.publish("tandem/tiny", testing::tinyModelDir(), {}, "main", "hf_local");
  std::string text = clusterYaml(1, 1);
  const std::string path_line =
      "    path: " + testing::tinyModelDir().string() + "\n    name: tiny\n";
  const std::string source_lines =
      "    source: hf://tandem/tiny\n    endpoint: " + hub.endpoint() + "\n";
  for (size_t at = text.find(path_line); at != std::string::npos; at = text.find(path_line)) {
    text.replace(at, path_line.size(), source_lines);
  }
  const fs::path file = dir_.write("cluster.yaml", text);
  const fs::path cache = dir_.path() / "cache";

  Subprocess refused(
      {binary_.string(), "local", "-f", file.string(), "--model-cache", cache.string()},
      dir_.path() / "refused.stderr", {{"HF_TOKEN", ""}});
  EXPECT_EQ(refused.wait(seconds(60)), 1);
  EXPECT_NE(refused.stderrText().find("spec.model.source: hf://tandem/tiny@main: the Hub "
                                      "refused the revision's metadata (401 GatedRepo"),
            std::string::npos)
      << refused.stderrText();
  EXPECT_NE(refused.stderrText().find("set HF_TOKEN in tandem-operator's environment"),
            std::string::npos)
      << refused.stderrText();

  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0", "--model-cache",
                 cache.string()},
                dir_.path() / "stderr", {{"HF_TOKEN", "hf_local"}});
  const std::string line = op.waitForLine("router listening on ", seconds(120));
  ASSERT_FALSE(line.empty()) << op.stderrText();
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  ASSERT_TRUE(eventually([&] { return healthy(port); })) << op.stderrText();
  const fs::path directory = cache / "hf" / "models--tandem--tiny" / "main";
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_EQ(testing::readFile(directory / name),
              testing::readFile(testing::tinyModelDir() / name))
        << name;
  }
  EXPECT_NE(op.stderrText().find("hf://tandem/tiny at commit " + commit), std::string::npos)
      << op.stderrText();
  for (pid_t pid : childPids(op.pid())) {
    EXPECT_NE(readProcFile("/proc/" + std::to_string(pid) + "/cmdline")
                  .find(std::string("--model") + '\0' + directory.string() + '\0'),
              std::string::npos);
  }
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  nlohmann::json request = testing::greedy(testing::randomPrompt(40, 3), 6);
  request["model"] = "tandem/tiny";
  auto response = client.Post("/v1/completions", request.dump(), "application/json");
  ASSERT_TRUE(response) << op.stderrText();
  EXPECT_EQ(response->status, 200) << response->body;
  EXPECT_EQ(testing::tokenIds(nlohmann::json::parse(response->body)).size(), 6u);
  op.readStdout(milliseconds(10));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

TEST_F(OperatorBinaryTest, ASourceThatNeedsKubernetesIsRefusedNamingIt) {
  std::string text = clusterYaml(1, 1);
  const std::string path_line = "    path: " + testing::tinyModelDir().string() + "\n";
  text.replace(text.find(path_line), path_line.size(), "    source: pvc://models/tiny\n");
  const fs::path file = dir_.write("cluster.yaml", text);
  Subprocess op({binary_.string(), "local", "-f", file.string()}, dir_.path() / "stderr");
  EXPECT_EQ(op.wait(seconds(30)), 1);
  EXPECT_EQ(op.stderrText(), "tandem-operator: " + file.string() +
                                 ": document 1 (PrefillPool \"prefill\"): spec.model.source: "
                                 "pvc://models/tiny needs Kubernetes (a claim or an image to "
                                 "mount); local mode takes hf:// sources and paths\n");
}

// The command line of a process, arguments joined by spaces.
std::string commandLine(pid_t pid) {
  std::string text = readProcFile("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

TEST_F(OperatorBinaryTest, TwoByTwoAnswersLikeAColocatedAgentAndRidesOutAKilledPrefillAgent) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(2, 2));
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  const std::string line = op.waitForLine("router listening on ", seconds(120));
  ASSERT_FALSE(line.empty()) << op.stderrText();
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  ASSERT_TRUE(eventually([&] { return healthy(port); })) << op.stderrText();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);

  // Greedy completions through the cluster equal a colocated agent's,
  // streamed and not.
  testing::Agent colocated;
  for (uint32_t seed : {11u, 12u, 13u}) {
    const std::vector<int> prompt = testing::randomPrompt(60 + seed, seed);
    const std::vector<int> expected =
        testing::tokenIds(colocated.post("/v1/completions", testing::greedy(prompt, 8)));
    auto plain =
        client.Post("/v1/completions", testing::greedy(prompt, 8).dump(), "application/json");
    ASSERT_TRUE(plain && plain->status == 200) << (plain ? plain->body : op.stderrText());
    EXPECT_EQ(testing::tokenIds(nlohmann::json::parse(plain->body)), expected);
    nlohmann::json streamed = testing::greedy(prompt, 8);
    streamed["stream"] = true;
    auto stream = client.Post("/v1/completions", streamed.dump(), "application/json");
    ASSERT_TRUE(stream && stream->status == 200);
    std::vector<int> ids;
    std::istringstream lines(stream->body);
    std::string event;
    while (std::getline(lines, event)) {
      if (!event.starts_with("data: {")) continue;
      auto chunk = nlohmann::json::parse(event.substr(6));
      if (chunk["choices"].empty()) continue;
      for (int id : chunk["choices"][0].value("token_ids", std::vector<int>{})) ids.push_back(id);
    }
    EXPECT_EQ(ids, expected);
  }

  // A prefill agent killed under load: every request still succeeds, and
  // local mode starts a new one.
  pid_t victim = 0;
  for (pid_t pid : childPids(op.pid())) {
    if (commandLine(pid).find("--role prefill") != std::string::npos) victim = pid;
  }
  ASSERT_NE(victim, 0);
  std::vector<int> statuses(8, 0), lengths(8, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client each("127.0.0.1", port);
      each.set_read_timeout(60, 0);
      auto res = each.Post("/v1/completions",
                           testing::greedy(testing::randomPrompt(70, 100 + i), 16).dump(),
                           "application/json");
      if (!res) return;
      statuses[i] = res->status;
      if (res->status == 200) {
        lengths[i] = static_cast<int>(testing::tokenIds(nlohmann::json::parse(res->body)).size());
      }
    });
    if (i == 2) ::kill(victim, SIGKILL);
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(statuses[i], 200) << "request " << i;
    EXPECT_EQ(lengths[i], 16) << "request " << i;
  }
  EXPECT_TRUE(eventually(
      [&] {
        int prefill_agents = 0;
        for (pid_t pid : childPids(op.pid())) {
          if (pid != victim && commandLine(pid).find("--role prefill") != std::string::npos) {
            ++prefill_agents;
          }
        }
        return prefill_agents == 2 && healthy(port);
      },
      seconds(60)))
      << op.stderrText();
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

TEST_F(OperatorBinaryTest, ARestartedDecodeAgentGetsTrafficAndItsBlocksReindexed) {
  const fs::path file = dir_.write("cluster.yaml", clusterYaml(1, 1));
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  const std::string line = op.waitForLine("router listening on ", seconds(120));
  ASSERT_FALSE(line.empty()) << op.stderrText();
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  ASSERT_TRUE(eventually([&] { return healthy(port); })) << op.stderrText();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  auto indexed = [&] {
    auto metrics = client.Get("/metrics");
    return metrics
               ? prometheusSample(metrics->body, "tandem_router_index_blocks", "agent=\"decode-0\"")
                     .value_or(0)
               : 0.0;
  };

  pid_t old_decode = 0;
  for (pid_t pid : childPids(op.pid())) {
    if (commandLine(pid).find("--role decode") != std::string::npos) old_decode = pid;
  }
  ASSERT_NE(old_decode, 0);
  ::kill(old_decode, SIGKILL);
  // Local mode starts a new decode-0 (another port); the router follows.
  ASSERT_TRUE(eventually(
      [&] {
        for (pid_t pid : childPids(op.pid())) {
          if (pid != old_decode && commandLine(pid).find("--role decode") != std::string::npos) {
            return healthy(port);
          }
        }
        return false;
      },
      seconds(60)))
      << op.stderrText();
  EXPECT_EQ(indexed(), 0) << "the new agent starts with an empty cache";
  nlohmann::json body = testing::greedy(testing::randomPrompt(75, 21), 8);
  std::shared_ptr<httplib::Response> answer;
  ASSERT_TRUE(eventually(
      [&] {
        auto res = client.Post("/v1/completions", body.dump(), "application/json");
        if (!res || res->status != 200) return false;
        answer = std::make_shared<httplib::Response>(*res);
        return true;
      },
      seconds(30)))
      << op.stderrText();
  EXPECT_EQ(answer->get_header_value("x-tandem-decode-agent"), "decode-0");
  EXPECT_EQ(testing::tokenIds(nlohmann::json::parse(answer->body)).size(), 8u);
  // The router follows the new agent's KV events: the request's blocks are
  // in its index.
  EXPECT_TRUE(eventually([&] { return indexed() >= 4; })) << indexed();
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// `kubectl scale decodepool --replicas` down, in local mode a file edit,
// while 16 streams run: the agent scaled away drains, handing each of its
// streams over with its KV blocks; the router resumes them on the remaining
// decode agents, which read those blocks, and every client's stream equals
// an undisturbed one. The drained agent exits 0 once its blocks were read;
// no agent is left with a block referenced or held.
TEST_F(OperatorBinaryTest, ScalingADecodePoolDownWhileStreamsRunHandsThemOverWithTheirKv) {
  // The small model, so that streams last seconds: the edit lands mid-stream.
  const fs::path file = dir_.write("cluster.yaml", smallClusterYaml(1, 3));
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  // The agents' ports, from their forwarded "listening on" lines, then the router's.
  std::map<std::string, int> ports;
  const int port = readPorts(op, ports);
  ASSERT_NE(port, 0) << op.stderrText();
  ASSERT_EQ(ports.size(), 4u) << op.stderrText();
  ASSERT_TRUE(eventually([&] { return healthy(port); })) << op.stderrText();

  constexpr int kTokens = 400;
  const std::vector<nlohmann::json> bodies = smallStreamBodies(16, 500, kTokens);
  const std::vector<testing::StreamedCompletion> undisturbed = colocatedSmallStreams(bodies);

  std::vector<testing::StreamedCompletion> streams;
  const auto streams_start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients = testing::streamConcurrently(port, bodies, streams);
  // Scaled down once decode-2 runs streams.
  const bool busy =
      eventually([&] { return agentMetric(ports["decode-2"], "tandem_num_requests_running") >= 2; },
                 seconds(30));
  if (busy) rewrite(file, smallClusterYaml(1, 2));
  for (auto& client : clients) client.join();
  const double streams_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - streams_start).count();
  ASSERT_TRUE(busy) << "decode-2 never ran two streams at once";
  expectUndisturbed(streams, undisturbed, kTokens);
  {
    httplib::Client client("127.0.0.1", port);
    auto router_metrics = client.Get("/metrics");
    ASSERT_TRUE(router_metrics);
    testing::expectDrainMigrations(router_metrics->body, 2, streams_s);
  }
  // The drained agent's own lines (its stderr joins its stdout, which local
  // mode forwards): it handed streams over, every hold was read, and it
  // exited on its own.
  std::string drained_log;
  for (std::string line; !(line = op.waitForLine("[decode-2] ", seconds(30))).empty();) {
    drained_log += line + "\n";
    if (line.find("drained in") != std::string::npos) break;
  }
  EXPECT_NE(drained_log.find("drain: handed over"), std::string::npos) << drained_log;
  EXPECT_EQ(drained_log.find("were not read"), std::string::npos) << drained_log;
  EXPECT_TRUE(
      eventually([&] { return op.stderrText().find("local: decode-2 (pid") != std::string::npos; },
                 seconds(30)));
  EXPECT_NE(op.stderrText().find("stopped: exited with status 0"), std::string::npos)
      << op.stderrText();
  // Every remaining agent is idle, with no block referenced or held, and
  // the decode agents read the handed-over blocks.
  double loaded = 0;
  for (const std::string name : {"prefill-0", "decode-0", "decode-1"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(eventually([&] {
      return agentMetric(ports[name], "tandem_num_requests_running") == 0 &&
             agentMetric(ports[name], "tandem_kv_cache_usage_ratio") == 0 &&
             agentMetric(ports[name], "tandem_kv_held_blocks") == 0;
    }));
    if (name != "prefill-0") loaded += agentMetric(ports[name], "tandem_kv_transfer_bytes_total");
  }
  EXPECT_GT(loaded, 0);
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// A DecodePool of `replicas` edited while 16 streams run (here: its
// environment) is rolled: an extra agent with the new spec starts, then
// each old agent in turn drains, handing its streams over with their KV to
// the agents still serving, the new ones among them (listed after the
// streams began). Every client's stream equals an undisturbed one, and the
// pool ends on the new spec without its extra agent.
int OperatorBinaryTest::waitForRouterSeeing(Subprocess& op, std::map<std::string, int>& ports,
                                            const std::string& agent) {
  const int port = readPorts(op, ports);
  EXPECT_NE(port, 0) << op.stderrText();
  if (port == 0) return 0;
  const bool seen = eventually([&] { return healthy(port) && routerSeesHealthy(port, agent); });
  EXPECT_TRUE(seen) << op.stderrText();
  return seen ? port : 0;
}

void OperatorBinaryTest::expectDecodeRolledWithoutAKill(Subprocess& op) {
  ASSERT_TRUE(eventually(
      [&] { return op.stderrText().find("local: decode: rollout done") != std::string::npos; },
      seconds(90)))
      << op.stderrText();
  const std::string log = op.stderrText();
  EXPECT_EQ(log.find("did not stop within"), std::string::npos) << log;
  EXPECT_EQ(log.find("killed by signal"), std::string::npos) << log;
}

void OperatorBinaryTest::rollDecodePoolUnderStreams(int replicas) {
  const fs::path file = dir_.write("cluster.yaml", smallClusterYaml(1, replicas));
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  std::map<std::string, int> ports;
  const int port = readPorts(op, ports);
  ASSERT_NE(port, 0) << op.stderrText();
  ASSERT_EQ(ports.size(), 1u + replicas) << op.stderrText();
  const std::string last = "decode-" + std::to_string(replicas - 1);
  ASSERT_TRUE(eventually([&] { return healthy(port) && routerSeesHealthy(port, last); }))
      << op.stderrText();

  constexpr int kTokens = 600;
  const std::vector<nlohmann::json> bodies = smallStreamBodies(16, 700, kTokens);
  const std::vector<testing::StreamedCompletion> undisturbed = colocatedSmallStreams(bodies);

  std::vector<testing::StreamedCompletion> streams;
  const auto streams_start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients = testing::streamConcurrently(port, bodies, streams);
  const bool busy = eventually(
      [&] {
        for (int i = 0; i < replicas; ++i) {
          if (agentMetric(ports["decode-" + std::to_string(i)], "tandem_num_requests_running") <
              2) {
            return false;
          }
        }
        return true;
      },
      seconds(30));
  if (busy) rewrite(file, withDecodeSpec(smallClusterYaml(1, replicas), decodeEnv("1")));
  for (auto& client : clients) client.join();
  const double streams_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - streams_start).count();
  ASSERT_TRUE(busy) << "the decode agents never ran two streams each";
  expectUndisturbed(streams, undisturbed, kTokens);
  {
    httplib::Client client("127.0.0.1", port);
    auto router_metrics = client.Get("/metrics");
    ASSERT_TRUE(router_metrics);
    testing::expectDrainMigrations(router_metrics->body, 2, streams_s);
  }
  // The rollout ends: both agents replaced, the extra one stopped.
  ASSERT_TRUE(eventually(
      [&] { return op.stderrText().find("local: decode: rollout done") != std::string::npos; },
      seconds(90)))
      << op.stderrText();
  const std::string log = op.stderrText();
  for (int i = 0; i < replicas; ++i) {
    EXPECT_NE(log.find("local: replacing decode-" + std::to_string(i)), std::string::npos) << log;
  }
  const std::string extra = "decode-" + std::to_string(replicas);
  EXPECT_TRUE(eventually([&] {
    return op.stderrText().find("local: stopping " + extra + " (a rollout's extra agent)") !=
           std::string::npos;
  }));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// Two agents: a stream's first agents are all replaced while it runs; it
// moves to the agents that joined since. Before, both agents were restarted
// at once and every stream in flight got an error event.
TEST_F(OperatorBinaryTest, EditingADecodePoolWhileStreamsRunRollsItWithoutLosingAStream) {
  rollDecodePoolUnderStreams(2);
}

// One agent (make run's shape): its streams began with nobody to resume
// them; the router asks for their hand-over once the extra agent serves
// and the lone one drains. Before, they were finished on the draining
// agent within its shutdown timeout, or cut there.
TEST_F(OperatorBinaryTest, EditingALoneDecodeAgentWhileStreamsRunMovesThemToTheExtraAgent) {
  rollDecodePoolUnderStreams(1);
}

// An agent stopped on purpose (here a rollout's) gets its spec's shutdown
// timeout plus 15 s before SIGKILL, as a Deployment's pod gets its grace
// period, not --stop-timeout (which bounds the stop of everything): the
// whole answers it is computing, which are never handed over, finish on it.
// Before, it was killed at --stop-timeout (10 s by default) whatever its
// shutdownTimeoutSeconds, and its whole answers were sent again elsewhere.
TEST_F(OperatorBinaryTest, ARolledAgentDrainsWithinItsShutdownTimeoutNotTheStopTimeout) {
  const std::string rollout = "  rollout:\n    maxSurge: 0\n    maxUnavailable: 1\n";
  // A shutdown timeout no answer outlasts, however loaded the machine.
  auto yaml = [&rollout](const std::string& extra) {
    return withShutdownTimeout(
        withDecodeSpec(withDecodeSpec(smallClusterYaml(1, 1), rollout), extra), 120,
        /*decode_only=*/false);
  };
  const fs::path file = dir_.write("cluster.yaml", yaml(""));
  Subprocess op(
      {binary_.string(), "local", "-f", file.string(), "--port", "0", "--stop-timeout", "0.5"},
      dir_.path() / "stderr");
  std::map<std::string, int> ports;
  const int port = waitForRouterSeeing(op, ports, "decode-0");
  ASSERT_NE(port, 0);
  constexpr int kTokens = 1500;
  std::vector<nlohmann::json> bodies = smallStreamBodies(2, 900, kTokens);
  std::vector<nlohmann::json> answers(bodies.size());
  std::vector<int> statuses(bodies.size(), 0);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < bodies.size(); ++i) {
    bodies[i]["stream"] = false;
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(120, 0);
      auto res = client.Post("/v1/completions", bodies[i].dump(), "application/json");
      if (!res) return;
      statuses[i] = res->status;
      answers[i] = nlohmann::json::parse(res->body, nullptr, false);
    });
  }
  const bool busy =
      eventually([&] { return agentMetric(ports["decode-0"], "tandem_num_requests_running") >= 2; },
                 seconds(30));
  if (busy) {
    rewrite(file, yaml(decodeEnv("1")));
  }
  for (auto& client : clients) client.join();
  ASSERT_TRUE(busy) << "the decode agent never ran both requests";
  for (size_t i = 0; i < bodies.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(statuses[i], 200) << answers[i].dump();
    EXPECT_EQ(testing::tokenIds(answers[i]).size(), static_cast<size_t>(kTokens));
  }
  expectDecodeRolledWithoutAKill(op);
  EXPECT_NE(op.stderrText().find("local: replacing decode-0"), std::string::npos);
  httplib::Client client("127.0.0.1", port);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(prometheusSum(metrics->body, "tandem_router_migrations_total").value_or(0), 0)
      << "a whole answer was sent again";
  op.readStdout(milliseconds(10));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// maxUnavailable 100% (maxSurge 0) replaces every agent of a pool at once:
// each old agent drains while its replacement starts, as a Deployment's
// terminating pods count against neither bound, so the streams the old
// ones hand over resume on the new ones, which read their KV from the old.
// Before, a replacement started only once its old agent had exited: the
// handed-over streams paused until then and their KV was lost with it.
TEST_F(OperatorBinaryTest, ARolloutReplacingEveryAgentAtOnceResumesTheStreamsWithTheirKv) {
  const std::string rollout = "  rollout:\n    maxSurge: 0\n    maxUnavailable: \"100%\"\n";
  const std::string yaml =
      withDecodeSpec(withDecodeHoldingHandedOverKv(smallClusterYaml(1, 2)), rollout);
  const fs::path file = dir_.write("cluster.yaml", yaml);
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  std::map<std::string, int> ports;
  const int port = waitForRouterSeeing(op, ports, "decode-1");
  ASSERT_NE(port, 0);
  constexpr int kTokens = 600;
  const std::vector<nlohmann::json> bodies = smallStreamBodies(8, 1100, kTokens);
  const std::vector<testing::StreamedCompletion> undisturbed = colocatedSmallStreams(bodies);
  std::vector<testing::StreamedCompletion> streams;
  std::vector<std::thread> clients = testing::streamConcurrently(port, bodies, streams);
  const bool busy = decodeAgentsRunTwoStreamsEach(ports);
  std::map<std::string, int> fresh;  // the replacements' ports
  if (busy) {
    rewrite(file, withDecodeSpec(yaml, decodeEnv("1")));
    fresh = newDecodeAgentPorts(op, 2);
  }
  for (auto& client : clients) client.join();
  ASSERT_TRUE(busy) << "the decode agents never ran two streams each";
  ASSERT_EQ(fresh.size(), 2u) << op.stderrText();
  expectUndisturbed(streams, undisturbed, kTokens);
  expectDecodeRolledWithoutAKill(op);
  double loaded = 0;
  for (const auto& [name, fresh_port] : fresh) {
    loaded += agentMetric(fresh_port, "tandem_kv_blocks_loaded_total", "source=\"ucx\"");
  }
  EXPECT_GT(loaded, 0) << "the replacements read none of the handed-over KV";
  op.readStdout(milliseconds(10));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// Every decode agent drained from outside at once (SIGTERM to each, as
// POST /admin/drain does), while streams run: local mode sees them draining
// at its next probe and starts their replacements at once, as a Deployment
// replaces terminating pods, while they still hold the KV they handed
// over; the streams resume there, identical to undisturbed ones. Before, the
// replacements started only once the drained agents had exited (their
// shutdown timeout, with nothing reading their holds), and the streams
// paused that long and recomputed their KV.
TEST_F(OperatorBinaryTest, DecodeAgentsDrainedFromOutsideAreReplacedAtOnce) {
  const fs::path file =
      dir_.write("cluster.yaml", withDecodeHoldingHandedOverKv(smallClusterYaml(1, 2)));
  Subprocess op(
      {binary_.string(), "local", "-f", file.string(), "--port", "0", "--liveness-period", "0.2"},
      dir_.path() / "stderr");
  std::map<std::string, int> ports;
  const int port = waitForRouterSeeing(op, ports, "decode-1");
  ASSERT_NE(port, 0);
  constexpr int kTokens = 600;
  const std::vector<nlohmann::json> bodies = smallStreamBodies(8, 1100, kTokens);
  const std::vector<testing::StreamedCompletion> undisturbed = colocatedSmallStreams(bodies);
  std::vector<testing::StreamedCompletion> streams;
  std::vector<std::thread> clients = testing::streamConcurrently(port, bodies, streams);
  const bool busy = decodeAgentsRunTwoStreamsEach(ports);
  std::map<std::string, int> fresh;  // the replacements' ports
  std::vector<pid_t> drained;
  if (busy) {
    for (const pid_t pid : childPids(op.pid())) {
      if (commandLine(pid).find("--role decode") != std::string::npos) {
        ::kill(pid, SIGTERM);
        drained.push_back(pid);
      }
    }
    fresh = newDecodeAgentPorts(op, 2);
  }
  for (auto& client : clients) client.join();
  ASSERT_TRUE(busy) << "the decode agents never ran two streams each";
  ASSERT_EQ(drained.size(), 2u);
  ASSERT_EQ(fresh.size(), 2u) << op.stderrText();
  // Not each drained agent is seen draining: the signals reach the two one
  // after the other, and the second may still take the streams the first
  // handed over (reading its KV at once, which lets the first exit before
  // local mode's probe). The log line shows one replaced while it drained.
  expectUndisturbed(streams, undisturbed, kTokens);
  const std::string log = op.stderrText();
  EXPECT_NE(log.find("is draining, not asked to by local mode: it retires while its replacement "
                     "starts"),
            std::string::npos)
      << log;
  op.readStdout(milliseconds(10));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// A change of model rolls both pools, and the router follows it: it reads
// the new model's tokenizer from the directory the new agents name and
// hashes prompts under their identity, so the decode agent holding a
// prompt's blocks is seen holding them. The new model has other weights and
// a tokenizer without merges (a text prompt is other tokens). Before, the
// router tokenized with the first decode pool's model directory and hashed
// under the first model's identity until tandem-operator restarted (a
// warning said so): no agent held any prompt's blocks.
TEST_F(OperatorBinaryTest, AModelChangeRollsThePoolsAndTheRouterHashesAsTheNewModel) {
  const fs::path other = dir_.path() / "other";
  tandem::tools::TestModelOptions options;
  options.seed = 22;
  tandem::tools::writeTestModel(options, other);
  nlohmann::json tokenizer = nlohmann::json::parse(std::ifstream(other / "tokenizer.json"));
  ASSERT_FALSE(tokenizer["model"]["merges"].empty());
  tokenizer["model"]["merges"] = nlohmann::json::array();
  std::ofstream(other / "tokenizer.json") << tokenizer.dump();

  const std::string text = clusterYaml(1, 1);
  const fs::path file = dir_.write("cluster.yaml", text);
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0"},
                dir_.path() / "stderr");
  std::map<std::string, int> ports;
  const int port = readPorts(op, ports);
  ASSERT_NE(port, 0) << op.stderrText();
  ASSERT_TRUE(eventually([&] { return healthy(port) && routerSeesHealthy(port, "decode-0"); }))
      << op.stderrText();

  std::string moved = text;
  const std::string tiny = testing::tinyModelDir().string();
  for (size_t at; (at = moved.find(tiny)) != std::string::npos;) {
    moved.replace(at, tiny.size(), other.string());
  }
  rewrite(file, moved);
  ASSERT_TRUE(eventually(
      [&] {
        const std::string log = op.stderrText();
        return log.find("local: decode: rollout done") != std::string::npos &&
               log.find("local: prefill: rollout done") != std::string::npos &&
               log.find("router: the decode agents moved to another model") != std::string::npos;
      },
      seconds(120)))
      << op.stderrText();
  ASSERT_TRUE(eventually([&] {
    return routerSeesHealthy(port, "decode-0") && routerSeesHealthy(port, "prefill-0");
  })) << op.stderrText();

  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  std::string prompt;
  for (int i = 0; i < 3; ++i) prompt += "The Quick Brown Fox jumps over the lazy dog. ";
  const nlohmann::json body = {
      {"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
  auto first = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(first) << op.stderrText();
  ASSERT_EQ(first->status, 200) << first->body;
  const std::string decode = first->get_header_value("x-tandem-decode-agent");
  ASSERT_TRUE(eventually([&] {
    auto metrics = client.Get("/metrics");
    return metrics &&
           prometheusSample(metrics->body, "tandem_router_index_blocks", "agent=\"" + decode + "\"")
                   .value_or(0) >= 4;
  })) << op.stderrText();
  auto second = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(second) << op.stderrText();
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_EQ(nlohmann::json::parse(second->body)["choices"][0]["text"],
            nlohmann::json::parse(first->body)["choices"][0]["text"]);
  auto decisions = client.Get("/debug/decisions?n=1");
  ASSERT_TRUE(decisions && decisions->status == 200);
  const nlohmann::json last = nlohmann::json::parse(decisions->body).at(0);
  int64_t leading = -1;
  for (const nlohmann::json& candidate : last["candidates"]) {
    if (candidate["role"] == "decode" && candidate["agent"] == decode) {
      leading = candidate["leading_blocks"];
    }
  }
  EXPECT_GE(leading, 4) << last.dump();
  const std::string log = op.stderrText();
  EXPECT_EQ(log.find("restart tandem-operator"), std::string::npos) << log;
  op.readStdout(milliseconds(10));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(60)), 0) << op.stderrText();
}

// A Hub that takes connections and never answers (a proxy gone quiet): its
// fetch runs off local mode's loop, so a SIGTERM at start stops at once and,
// on an edit that points a pool at it, a killed agent is still started
// again. Before, local mode waited for the fetch's 60 s read timeout either
// way.
TEST_F(OperatorBinaryTest, AHubThatDoesNotAnswerHoldsNeitherTheStopNorTheAgents) {
  const int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(silent, 16), 0);  // never accepted: connections wait in the backlog
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  const std::string text = clusterYaml(1, 1);
  const std::string path_line =
      "    path: " + testing::tinyModelDir().string() + "\n    name: tiny\n";
  std::string hub_text = text;
  hub_text.replace(
      hub_text.rfind(path_line), path_line.size(),
      "    source: hf://tandem/tiny\n    endpoint: " + endpoint + "\n    name: tiny\n");
  const fs::path cache = dir_.path() / "cache";

  // At start.
  const fs::path at_start = dir_.write("at-start.yaml", hub_text);
  Subprocess starting({binary_.string(), "local", "-f", at_start.string(), "--port", "0",
                       "--model-cache", cache.string()},
                      dir_.path() / "starting.stderr");
  ASSERT_TRUE(eventually([&] {
    return starting.stderrText().find("local: fetching hf://tandem/tiny") != std::string::npos;
  })) << starting.stderrText();
  starting.signal(SIGTERM);
  EXPECT_EQ(starting.wait(seconds(10)), 0) << starting.stderrText();

  // On an edit.
  const fs::path file = dir_.write("cluster.yaml", text);
  Subprocess op({binary_.string(), "local", "-f", file.string(), "--port", "0", "--model-cache",
                 cache.string(), "--restart-backoff", "0.1"},
                dir_.path() / "stderr");
  ASSERT_FALSE(op.waitForLine("router listening on ", seconds(120)).empty()) << op.stderrText();
  auto decodePid = [&]() -> pid_t {
    for (pid_t pid : childPids(op.pid())) {
      if (commandLine(pid).find("--role decode") != std::string::npos) return pid;
    }
    return 0;
  };
  const pid_t decode = decodePid();
  ASSERT_NE(decode, 0);
  std::ofstream(file) << hub_text;
  ASSERT_TRUE(eventually([&] {
    return op.stderrText().find("fetching its pools' models before applying it") !=
           std::string::npos;
  })) << op.stderrText();
  ASSERT_EQ(::kill(decode, SIGKILL), 0);
  EXPECT_TRUE(eventually(
      [&] {
        const pid_t now = decodePid();
        return now != 0 && now != decode;
      },
      seconds(15)))
      << op.stderrText();
  op.readStdout(milliseconds(10));
  op.signal(SIGTERM);
  EXPECT_EQ(op.wait(seconds(15)), 0) << op.stderrText();
  ::close(silent);
}

TEST_F(OperatorBinaryTest, ABadFileIsOneLineNamingTheField) {
  std::string text = clusterYaml(1, 1);
  text.replace(text.find("threads: 1"), 10, "threads: many");
  const fs::path file = dir_.write("cluster.yaml", text);
  Subprocess op({binary_.string(), "local", "-f", file.string()}, dir_.path() / "stderr");
  EXPECT_EQ(op.wait(seconds(30)), 1);
  EXPECT_EQ(op.stderrText(), "tandem-operator: " + file.string() +
                                 ": document 1 (PrefillPool \"prefill\"): spec.engine.threads "
                                 "must be an integer between 0 and 1024, got \"many\" (line 12)\n");

  // A directory given as the file is not read as an empty one.
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{binary_.string(), "local", "-f", dir_.path().string()},
        std::vector<std::string>{binary_.string(), "router", "--config", dir_.path().string()}}) {
    Subprocess refused(command, dir_.path() / "stderr-dir");
    EXPECT_EQ(refused.wait(seconds(30)), 1) << command[1];
    EXPECT_EQ(refused.stderrText(),
              "tandem-operator: " + dir_.path().string() + ": cannot be read\n")
        << command[1];
  }
}

TEST_F(OperatorBinaryTest, RouterCommandTakesAgentsFromItsFileOrItsFlags) {
  const fs::path file = dir_.write("router.yaml", R"(apiVersion: tandem.dev/v1alpha1
kind: Router
spec:
  port: 0
  decode:
    - {name: from-file, host: 127.0.0.1, port: 9}
)");
  auto agentsNamed = [&](const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {binary_.string(), "router", "--config", file.string()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Subprocess router(argv, dir_.path() / "stderr");
    const std::string line = router.waitForLine("router listening on ", seconds(30));
    if (line.empty()) return "did not start: " + router.stderrText();
    const int port = std::stoi(line.substr(line.rfind(':') + 1));
    httplib::Client client("127.0.0.1", port);
    auto health = client.Get("/health");
    EXPECT_TRUE(health && health->status == 503);  // nothing listens on port 9
    auto metrics = client.Get("/metrics");
    router.signal(SIGTERM);
    EXPECT_EQ(router.wait(seconds(30)), 0) << router.stderrText();
    std::string names;
    for (const char* name : {"from-file", "from-flag", "decode-0"}) {
      if (metrics &&
          metrics->body.find(std::string("agent=\"") + name + "\"") != std::string::npos) {
        names += std::string(names.empty() ? "" : " ") + name;
      }
    }
    return names;
  };
  EXPECT_EQ(agentsNamed({}), "from-file");
  EXPECT_EQ(agentsNamed({"--decode", "from-flag=127.0.0.1:9"}), "from-flag");
  EXPECT_EQ(agentsNamed({"--decode", "127.0.0.1:9", "--pull-back", "false"}), "decode-0");

  Subprocess bad({binary_.string(), "router", "--config", file.string(), "--decode", "nowhere"},
                 dir_.path() / "stderr");
  EXPECT_EQ(bad.wait(seconds(30)), 1);
  EXPECT_EQ(bad.stderrText(),
            "tandem-operator: --decode must be NAME=HOST:PORT or HOST:PORT with a port between 1 "
            "and 65535, got \"nowhere\"\n");
}

}  // namespace
}  // namespace tandem::local
