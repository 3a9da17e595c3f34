#include "tools/bench/local_cluster.h"

#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "common/kv_auth.h"
#include "common/prometheus_text.h"
#include "common/status.h"
#include "operator/spec/cluster_spec.h"
#include "tools/bench/openai_client.h"
#include "tools/model/test_model.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

constexpr size_t kOutputTailLines = 200;

fs::path besideThisProgram(const std::string& name) {
  return fs::read_symlink("/proc/self/exe").parent_path() / name;
}

std::string readFrom(const fs::path& path, size_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string clusterYaml(const LocalClusterOptions& o, const std::string& model_dir) {
  auto pool = [&](const char* kind, const char* name, int replicas) {
    std::ostringstream out;
    out << "apiVersion: tandem.dev/v1alpha1\nkind: " << kind << "\nmetadata:\n  name: " << name
        << "\nspec:\n  replicas: " << replicas << "\n  model:\n    path: " << model_dir
        << "\n  engine:\n    numBlocks: " << o.num_blocks << "\n    threads: " << o.agent_threads
        << "\n    shutdownTimeoutSeconds: 5\n  kvTransfer:\n    connector: ucx\n"
        << "    role: kv_both\n    extraConfig:\n      abort_timeout_s: " << o.abort_timeout_s
        << "\n";
    return out.str();
  };
  std::ostringstream out;
  out << pool("PrefillPool", "prefill", o.prefill_replicas) << "---\n"
      << pool("DecodePool", "decode", o.decode_replicas) << "---\n"
      << "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n  port: 0\n"
      << "  disaggThresholdTokens: 16\n  maxInflightRequests: " << o.max_inflight_requests
      << "\n  maxQueuedRequests: " << o.max_queued_requests << "\n";
  return out.str();
}

bool routerHealthy(const std::string& url) {
  try {
    httplib::Client client(url);
    client.set_connection_timeout(1, 0);
    client.set_read_timeout(2, 0);
    auto result = client.Get("/health");
    return result && result->status == 200;
  } catch (const std::exception&) {
    return false;
  }
}

std::string lastLines(const std::string& text, size_t count) {
  size_t start = text.size();
  for (size_t seen = 0; start > 0 && seen <= count;) {
    --start;
    if (text[start] == '\n') ++seen;
  }
  return text.substr(start);
}

}  // namespace

int64_t AgentKvState::leakedBlocks() const {
  int64_t leaked = static_cast<int64_t>(held_blocks);
  if (total_blocks)
    leaked += std::max<int64_t>(0, *total_blocks - static_cast<int64_t>(free_blocks));
  return leaked;
}

bool AgentKvState::settled() const {
  return answered && running == 0 && waiting == 0 && leakedBlocks() == 0;
}

int64_t SettleReport::leakedBlocks() const {
  int64_t leaked = 0;
  for (const AgentKvState& agent : agents) leaked += agent.leakedBlocks();
  return leaked;
}

bool SettleReport::routerIdle() const {
  return router.inflight.value_or(0) == 0 && router.queued.value_or(0) == 0;
}

bool SettleReport::fdsBack() const { return router.open_fds && *router.open_fds <= baseline_fds; }

json SettleReport::toJson() const {
  json agent_list = json::array();
  for (const AgentKvState& a : agents) {
    agent_list.push_back({{"name", a.name},
                          {"answered", a.answered},
                          {"total_blocks", a.total_blocks ? json(*a.total_blocks) : json(nullptr)},
                          {"free_blocks", a.free_blocks},
                          {"held_blocks", a.held_blocks},
                          {"running", a.running},
                          {"waiting", a.waiting},
                          {"leaked_blocks", a.leakedBlocks()}});
  }
  auto optional = [](const auto& value) { return value ? json(*value) : json(nullptr); };
  json pauses = json::object();
  for (const auto& [reason, pause] : router.migration_pause) {
    pauses[reason] = {{"count", pause.count}, {"mean", pause.meanMs()}};
  }
  return {{"settled", settled},
          {"waited_s", waited_s},
          {"leaked_blocks", leakedBlocks()},
          {"agents", std::move(agent_list)},
          {"router",
           {{"inflight_requests", optional(router.inflight)},
            {"queued_requests", optional(router.queued)},
            {"open_fds", optional(router.open_fds)},
            {"migrations_resumed", optional(router.migrations_resumed)},
            {"migrations_exhausted", optional(router.migrations_exhausted)},
            {"migration_pause_ms", pauses},
            {"inter_token_latency_ms",
             {{"count", router.inter_token.count}, {"mean", router.inter_token.meanMs()}}},
            {"baseline_fds", baseline_fds},
            {"idle", routerIdle()},
            {"fds_back", fdsBack()}}}};
}

void SettleReport::print() const {
  std::printf("end state (%s after %.1f s):\n", settled ? "settled" : "NOT settled", waited_s);
  std::printf("  %-12s %8s %8s %8s %8s %8s %8s\n", "agent", "total", "free", "held", "running",
              "waiting", "leaked");
  for (const AgentKvState& a : agents) {
    if (!a.answered) {
      std::printf("  %-12s %8s\n", a.name.c_str(), "(no /metrics)");
      continue;
    }
    std::printf("  %-12s %8s %8.0f %8.0f %8.0f %8.0f %8lld\n", a.name.c_str(),
                a.total_blocks ? std::to_string(*a.total_blocks).c_str() : "?", a.free_blocks,
                a.held_blocks, a.running, a.waiting, static_cast<long long>(a.leakedBlocks()));
  }
  auto gauge = [](const std::optional<double>& value) {
    return value ? std::to_string(static_cast<long long>(*value)) : std::string("n/a");
  };
  std::printf("  router: inflight %s, queued %s, open fds %s (baseline %d)\n",
              gauge(router.inflight).c_str(), gauge(router.queued).c_str(),
              router.open_fds ? std::to_string(*router.open_fds).c_str() : "?", baseline_fds);
  std::printf("  streams moved off a failed decode agent: %s resumed, %s with nowhere to go\n",
              gauge(router.migrations_resumed).c_str(), gauge(router.migrations_exhausted).c_str());
  for (const auto& [reason, pause] : router.migration_pause) {
    std::printf(
        "  pause of streams moved by %s: %.0f, mean %.1f ms (router inter-token latency "
        "mean %.2f ms)\n",
        reason.c_str(), pause.count, pause.meanMs(), router.inter_token.meanMs());
  }
  std::printf("  leaked blocks: %lld\n", static_cast<long long>(leakedBlocks()));
}

LocalCluster::LocalCluster(const LocalClusterOptions& options, std::chrono::seconds startup_timeout)
    : work_dir_(options.work_dir) {
  fs::create_directories(work_dir_);
  if (options.cluster_file.empty()) {
    model_dir_ = options.model_dir;
    if (model_dir_.empty()) {
      tools::TestModelOptions model_options;
      model_options.seed = 21;
      model_dir_ = (work_dir_ / "tiny").string();
      tools::writeTestModel(model_options, model_dir_);
    }
    cluster_file_ = work_dir_ / "cluster.yaml";
    std::ofstream(cluster_file_) << clusterYaml(options, model_dir_);
  } else {
    cluster_file_ = options.cluster_file;
  }
  const spec::ClusterSpec cluster = spec::loadClusterSpec(cluster_file_);
  for (const spec::PoolSpec& pool : cluster.pools) {
    pool_roles_[pool.name] = spec::poolRole(pool.kind);
    expected_agents_ += static_cast<size_t>(pool.replicas);
  }
  if (cluster.router.max_inflight_requests) max_inflight_ = *cluster.router.max_inflight_requests;
  if (cluster.router.max_queued_requests) max_queued_ = *cluster.router.max_queued_requests;
  // The reference computes with the decode pool's settings.
  for (const spec::PoolSpec& pool : cluster.pools) {
    if (pool.kind != spec::PoolKind::kDecode) continue;
    if (model_dir_.empty()) model_dir_ = pool.model_path;
    reference_flags_ = {"--model", pool.model_path, "--served-model-name", pool.served_model_name};
    const spec::EngineSpec& e = pool.engine;
    if (e.block_size) {
      reference_flags_.insert(reference_flags_.end(),
                              {"--block-size", std::to_string(*e.block_size)});
    }
    if (e.kv_dtype) reference_flags_.insert(reference_flags_.end(), {"--kv-dtype", *e.kv_dtype});
    if (e.max_model_len) {
      reference_flags_.insert(reference_flags_.end(),
                              {"--max-model-len", std::to_string(*e.max_model_len)});
    }
    if (e.prefix_caching_hash) {
      reference_flags_.insert(reference_flags_.end(),
                              {"--prefix-caching-hash", *e.prefix_caching_hash});
    }
    break;
  }

  const fs::path binary = options.operator_bin.empty() ? besideThisProgram("tandem-operator")
                                                       : fs::path(options.operator_bin);
  if (::access(binary.c_str(), X_OK) != 0) {
    throw Error(binary.string() + " is not an executable tandem-operator; pass --operator-bin");
  }
  std::vector<std::string> argv = {binary.string(),        "local",  "-f",
                                   cluster_file_.string(), "--port", "0"};
  argv.insert(argv.end(), options.operator_args.begin(), options.operator_args.end());
  const char* secret = std::getenv("TANDEM_KV_SECRET");
  kv_secret_ = secret != nullptr && *secret != '\0' ? std::string(secret) : kv_auth::randomSecret();
  operator_ = std::make_unique<Subprocess>(
      argv, work_dir_ / "operator.stderr",
      std::vector<std::pair<std::string, std::string>>{{"TANDEM_KV_SECRET", kv_secret_}});
  drain_thread_ = std::thread([this] { drainOutput(); });
  try {
    waitUntilServing(startup_timeout);
  } catch (...) {
    // Agents outlive a killed operator: let it stop them.
    operator_->signal(SIGTERM);
    operator_->wait(std::chrono::seconds(60));
    stopDraining();
    throw;
  }
}

void LocalCluster::waitUntilServing(std::chrono::seconds startup_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + startup_timeout;
  auto timedOut = [&] {
    return std::chrono::steady_clock::now() > deadline || operatorExit().has_value();
  };
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (!router_url_.empty()) break;
    }
    if (timedOut()) {
      throw Error("tandem-operator local -f " + cluster_file_.string() +
                  " did not start its router; its log ends with:\n" + logTail());
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  while (!routerHealthy(routerUrl())) {
    if (timedOut()) {
      throw Error("the router at " + routerUrl() + " did not become healthy; the log ends with:\n" +
                  logTail());
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (!waitForAllAgents(std::chrono::duration_cast<milliseconds>(startup_timeout))) {
    throw Error("not every agent of " + cluster_file_.string() +
                " was reported ready; the log ends with:\n" + logTail());
  }
}

LocalCluster::~LocalCluster() {
  std::vector<pid_t> agent_pids;
  for (const ClusterAgent& agent : agents()) agent_pids.push_back(agent.pid);
  for (pid_t pid : agent_pids) ::kill(pid, SIGCONT);  // a stopped agent cannot drain
  operator_->signal(SIGTERM);
  // The drain thread polls the operator too and may be the one that reaps
  // it; a long wait() would not see that, so wait in short slices.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (operator_->wait(milliseconds(100)) < 0 && std::chrono::steady_clock::now() < deadline) {
  }
  stopDraining();
  scanLog();
  // Agents outlive a killed operator (docs/local-mode.md): stop any left.
  for (const ClusterAgent& agent : agents()) {
    if (std::find(agent_pids.begin(), agent_pids.end(), agent.pid) == agent_pids.end()) {
      agent_pids.push_back(agent.pid);
    }
  }
  for (pid_t pid : agent_pids) {
    if (fs::exists("/proc/" + std::to_string(pid))) ::kill(pid, SIGKILL);
  }
}

void LocalCluster::stopDraining() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  if (drain_thread_.joinable()) drain_thread_.join();
}

std::string LocalCluster::routerUrl() {
  std::lock_guard lock(mutex_);
  return router_url_;
}

void LocalCluster::drainOutput() {
  std::ofstream copy(work_dir_ / "operator.stdout", std::ios::app);
  std::string pending;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    const std::string text = operator_->readStdout(milliseconds(200));
    copy << text;
    copy.flush();
    pending += text;
    size_t start = 0;
    std::lock_guard lock(mutex_);
    for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      const std::string line = pending.substr(start, newline - start);
      output_tail_.push_back(line);
      if (router_url_.empty() && line.starts_with("router listening on ")) {
        router_url_ = "http://" + line.substr(std::string("router listening on ").size());
        while (std::isspace(static_cast<unsigned char>(router_url_.back()))) router_url_.pop_back();
      }
      if (output_tail_.size() > kOutputTailLines) output_tail_.erase(output_tail_.begin());
      // "[decode-0] I ... serving tiny on http://127.0.0.1:1234 (128 KV blocks of 16 tokens, ..."
      const size_t blocks = line.find(" KV blocks of ");
      if (line.starts_with("[") && line.find(" serving ") != std::string::npos &&
          blocks != std::string::npos) {
        const std::string name = line.substr(1, line.find(']') - 1);
        const size_t open = line.rfind('(', blocks);
        if (open != std::string::npos) {
          try {
            total_blocks_[name] = std::stoll(line.substr(open + 1, blocks - open - 1));
          } catch (const std::exception&) {
          }
        }
      }
    }
    pending.erase(0, start);
    if (text.empty() && operatorExit()) return;
  }
}

void LocalCluster::scanLog() {
  std::lock_guard lock(mutex_);
  const std::string text = readFrom(work_dir_ / "operator.stderr", log_offset_);
  const size_t end = text.rfind('\n');
  if (end == std::string::npos) return;
  log_offset_ += end + 1;
  std::istringstream lines(text.substr(0, end + 1));
  for (std::string line; std::getline(lines, line);) {
    // "... local: decode-2 (pid 13458) stopped: exited with status 0": an
    // agent local mode stopped (scaled away, replaced, a rollout's extra
    // one) is no longer one of the cluster's.
    if (const size_t stopped = line.find(") stopped: "); stopped != std::string::npos) {
      const size_t local = line.find("local: ");
      const size_t pid_at = line.find(" (pid ", local);
      if (local != std::string::npos && pid_at != std::string::npos && pid_at < stopped) {
        const std::string name = line.substr(local + 7, pid_at - local - 7);
        const auto known = agents_.find(name);
        if (known != agents_.end() &&
            std::to_string(known->second.pid) == line.substr(pid_at + 6, stopped - pid_at - 6)) {
          agents_.erase(known);
        }
      }
      continue;
    }
    // "... local: decode-1 ready on 127.0.0.1:41809 (pid 13458)"
    const size_t local = line.find("local: ");
    const size_t ready = line.find(" ready on ");
    const size_t pid_at = line.find(" (pid ");
    if (local == std::string::npos || ready == std::string::npos || pid_at == std::string::npos ||
        ready < local || pid_at < ready) {
      continue;
    }
    ClusterAgent agent;
    agent.name = line.substr(local + 7, ready - local - 7);
    const std::string address = line.substr(ready + 10, pid_at - ready - 10);
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) continue;
    try {
      agent.host = address.substr(0, colon);
      agent.port = std::stoi(address.substr(colon + 1));
      agent.pid = static_cast<pid_t>(std::stol(line.substr(pid_at + 6)));
    } catch (const std::exception&) {
      continue;
    }
    const size_t dash = agent.name.rfind('-');
    const auto role = pool_roles_.find(agent.name.substr(0, dash));
    agent.role = role != pool_roles_.end() ? role->second : "";
    agents_[agent.name] = agent;
  }
}

std::string LocalCluster::rollDecodePool(const std::string& value) {
  std::string text = readFrom(cluster_file_, 0);
  const size_t kind = text.find("kind: DecodePool");
  const size_t name_at = text.find("  name: ", kind);
  const size_t spec = text.find("\nspec:\n", kind);
  if (kind == std::string::npos || name_at == std::string::npos || spec == std::string::npos) {
    throw Error(cluster_file_.string() + " has no DecodePool to roll");
  }
  const std::string name = text.substr(name_at + 8, text.find('\n', name_at) - name_at - 8);
  const size_t next = text.find("\n---", spec);
  const std::string document = text.substr(spec, next == std::string::npos ? next : next - spec);
  const std::string key = "    - name: TANDEM_BENCH_ROLLOUT\n      value: ";
  const std::string entry = key + "\"" + value + "\"\n";
  if (const size_t at = text.find(key, spec); at != std::string::npos && at < next) {
    text.replace(at, text.find('\n', at + key.size()) + 1 - at, entry);
  } else if (document.find("\n  env:") == std::string::npos) {
    text.insert(spec + 7, "  env:\n" + entry);
  } else {
    throw Error(cluster_file_.string() + ": DecodePool " + name +
                " has an env of its own: the bench rolls only a pool it wrote");
  }
  const fs::path temporary = cluster_file_.string() + ".new";
  std::ofstream(temporary, std::ios::binary) << text;
  fs::rename(temporary, cluster_file_);
  return name;
}

std::vector<ClusterAgent> LocalCluster::agents() {
  scanLog();
  std::lock_guard lock(mutex_);
  std::vector<ClusterAgent> list;
  for (const auto& [name, agent] : agents_) {
    list.push_back(agent);
    const auto total = total_blocks_.find(name);
    if (total != total_blocks_.end()) list.back().total_blocks = total->second;
  }
  return list;
}

bool LocalCluster::waitForAllAgents(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const std::vector<ClusterAgent> list = agents();
    size_t alive = 0;
    for (const ClusterAgent& agent : list) {
      alive += processRssKib(agent.pid).has_value() && agent.total_blocks.has_value();
    }
    if (alive >= expected_agents_) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(50));
  }
}

std::optional<ClusterAgent> LocalCluster::waitForRestart(const std::string& name, pid_t old_pid,
                                                         milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (const ClusterAgent& agent : agents()) {
      if (agent.name == name && agent.pid != old_pid) return agent;
    }
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

bool LocalCluster::waitForRouterToSeeAllAgents(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (const std::optional<std::string> metrics = routerMetrics()) {
      size_t healthy = 0, unhealthy = 0;
      std::istringstream lines(*metrics);
      for (std::string line; std::getline(lines, line);) {
        if (line.starts_with('#')) continue;
        const auto sample = parsePrometheusSampleLine(line);
        if (!sample || sample->name != "tandem_router_agent_healthy") continue;
        (sample->value == 1 ? healthy : unhealthy) += 1;
      }
      if (healthy >= expected_agents_ && unhealthy == 0) return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(50));
  }
}

std::vector<AgentKvState> LocalCluster::kvStates() {
  std::vector<AgentKvState> states;
  for (const ClusterAgent& agent : agents()) {
    AgentKvState state;
    state.name = agent.name;
    state.total_blocks = agent.total_blocks;
    try {
      httplib::Client client(agent.url());
      client.set_connection_timeout(2, 0);
      client.set_read_timeout(5, 0);
      auto result = client.Get("/metrics");
      if (result && result->status == 200) {
        const std::string& text = result->body;
        auto sample = [&](const char* metric) { return prometheusSample(text, metric); };
        const auto running = sample("tandem_num_requests_running");
        const auto waiting = sample("tandem_num_requests_waiting");
        const auto held = sample("tandem_kv_held_blocks");
        const auto free_blocks = sample("tandem_kv_cache_free_blocks");
        state.answered = running && waiting && held && free_blocks;
        state.running = running.value_or(0);
        state.waiting = waiting.value_or(0);
        state.held_blocks = held.value_or(0);
        state.free_blocks = free_blocks.value_or(0);
      }
    } catch (const std::exception&) {
    }
    states.push_back(std::move(state));
  }
  return states;
}

std::optional<std::string> LocalCluster::routerMetrics() {
  try {
    httplib::Client client(router_url_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    auto result = client.Get("/metrics");
    if (result && result->status == 200) return result->body;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

RouterState LocalCluster::routerState() {
  RouterState state;
  state.open_fds = openFdCount(operator_->pid());
  if (const std::optional<std::string> metrics = routerMetrics()) {
    const std::string& text = *metrics;
    state.inflight = prometheusSample(text, "tandem_router_inflight_requests");
    state.queued = prometheusSample(text, "tandem_router_queued_requests");
    // Over every reason (failure, stall, drain, error).
    state.migrations_resumed =
        prometheusSum(text, "tandem_router_migrations_total", "outcome=\"resumed\"");
    state.migrations_exhausted =
        prometheusSum(text, "tandem_router_migrations_total", "outcome=\"exhausted\"");
    // Every reason the router reports a pause for.
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with('#')) continue;
      const auto sample = parsePrometheusSampleLine(line);
      if (!sample) continue;
      const bool count = sample->name == "tandem_router_migration_pause_seconds_count";
      if (!count && sample->name != "tandem_router_migration_pause_seconds_sum") continue;
      const auto reason = sample->label("reason");
      if (!reason) continue;
      RouterState::Mean& pause = state.migration_pause[*reason];
      (count ? pause.count : pause.sum_s) = sample->value;
    }
    std::erase_if(state.migration_pause, [](const auto& entry) { return entry.second.count <= 0; });
    state.inter_token = {
        prometheusSample(text, "tandem_router_inter_token_latency_seconds_count").value_or(0),
        prometheusSample(text, "tandem_router_inter_token_latency_seconds_sum").value_or(0)};
  }
  // The metrics request itself holds a descriptor while it is served.
  state.open_fds = std::min(state.open_fds.value_or(0), openFdCount(operator_->pid()).value_or(0));
  return state;
}

SettleReport LocalCluster::waitUntilSettled(int baseline_fds, milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  SettleReport report;
  report.baseline_fds = baseline_fds;
  for (;;) {
    report.agents = kvStates();
    report.router = routerState();
    const bool agents_settled = report.agents.size() >= expected_agents_ &&
                                std::all_of(report.agents.begin(), report.agents.end(),
                                            [](const AgentKvState& a) { return a.settled(); });
    report.settled = agents_settled && report.routerIdle() && report.fdsBack();
    report.waited_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (report.settled || std::chrono::steady_clock::now() - start > timeout) return report;
    std::this_thread::sleep_for(milliseconds(200));
  }
}

std::string LocalCluster::logTail(size_t lines) {
  std::string text = lastLines(readFrom(work_dir_ / "operator.stderr", 0), lines);
  std::lock_guard lock(mutex_);
  const size_t from = output_tail_.size() > lines ? output_tail_.size() - lines : 0;
  for (size_t i = from; i < output_tail_.size(); ++i) text += output_tail_[i] + "\n";
  return text;
}

std::optional<int64_t> processRssKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("State:") && line.find("zombie") != std::string::npos) return std::nullopt;
    if (line.starts_with("VmRSS:")) {
      try {
        return std::stoll(line.substr(6));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

std::optional<int> openFdCount(pid_t pid) {
  std::error_code error;
  fs::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", error);
  if (error) return std::nullopt;
  int count = 0;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) return std::nullopt;
    ++count;
  }
  return count;
}

LineFit fitLine(const std::vector<std::pair<double, double>>& points) {
  LineFit fit;
  fit.points = points.size();
  if (points.size() < 2) return fit;
  const double n = static_cast<double>(points.size());
  double mean_x = 0, mean_y = 0;
  for (const auto& [x, y] : points) {
    mean_x += x / n;
    mean_y += y / n;
  }
  double sxx = 0, sxy = 0, syy = 0;
  for (const auto& [x, y] : points) {
    sxx += (x - mean_x) * (x - mean_x);
    sxy += (x - mean_x) * (y - mean_y);
    syy += (y - mean_y) * (y - mean_y);
  }
  if (sxx == 0) return fit;
  fit.slope = sxy / sxx;
  // A flat series is fitted perfectly.
  fit.r2 = syy == 0 ? 1.0 : (sxy * sxy) / (sxx * syy);
  return fit;
}

RssSampler::RssSampler(LocalCluster& cluster, milliseconds interval)
    : cluster_(cluster), interval_(interval), thread_([this] { run(); }) {}

RssSampler::~RssSampler() { stop(); }

std::vector<RssSampler::Series> RssSampler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  return series_;
}

void RssSampler::run() {
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, size_t> current;  // process name → index in series_
  std::map<std::string, int> generations;
  for (auto next = start;; next += interval_) {
    std::vector<std::pair<std::string, pid_t>> processes = {{"operator", cluster_.operatorPid()}};
    for (const ClusterAgent& agent : cluster_.agents())
      processes.emplace_back(agent.name, agent.pid);
    const double at_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      for (const auto& [name, pid] : processes) {
        const std::optional<int64_t> rss = processRssKib(pid);
        if (!rss) continue;
        auto it = current.find(name);
        if (it == current.end() || series_[it->second].pid != pid) {
          const int generation = ++generations[name];
          series_.push_back(
              {generation == 1 ? name : name + "#" + std::to_string(generation), pid, {}});
          current[name] = series_.size() - 1;
          it = current.find(name);
        }
        series_[it->second].samples.emplace_back(at_s, static_cast<double>(*rss));
      }
    }
    std::this_thread::sleep_until(next + interval_);
  }
}

StartedCluster startBenchCluster(LocalClusterOptions options, const std::string& work_dir,
                                 const std::string& program) {
  options.work_dir = work_dir.empty()
                         ? std::filesystem::temp_directory_path() /
                               ("tandem-bench-" + program + "-" + std::to_string(::getpid()))
                         : std::filesystem::path(work_dir);
  std::printf("tandem-bench %s: starting the cluster (logs in %s)\n", program.c_str(),
              options.work_dir.c_str());
  std::fflush(stdout);
  StartedCluster started;
  started.options = options;
  started.cluster = std::make_unique<LocalCluster>(options, std::chrono::seconds(300));
  started.url = started.cluster->routerUrl();
  const std::vector<ServedModel> models = listModels(started.url, 30);
  if (models.empty()) throw Error(started.url + "/v1/models lists no model");
  started.model = models.front().id;
  started.agent_bin =
      options.agent_bin.empty()
          ? (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tandem-agent")
                .string()
          : options.agent_bin;
  return started;
}

}  // namespace tandem::bench
