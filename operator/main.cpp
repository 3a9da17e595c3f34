// tandem-operator. Subcommands:
//   local   — the pools of a cluster file as local agent processes behind one
//             router (docs/local-mode.md)
//   router  — the router alone, in front of agents given by address, or
//             (--discover) the ready agents of pools found in a Kubernetes
//             cluster through their Services' EndpointSlices
//   controller — the Kubernetes controller (docs/kubernetes.md)
// local and router print "router listening on HOST:PORT" on stdout once they
// serve; controller prints "controller started". All stop cleanly on SIGINT
// or SIGTERM.
#include <signal.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/command_line/command_line.h"
#include "common/crash_report.h"
#include "common/http/http_connection.h"
#include "common/http/http_limits.h"
#include "common/logging.h"
#include "common/protocol/chat_template.h"
#include "common/status.h"
#include "operator/cli_number.h"
#include "operator/controller/controller_command.h"
#include "operator/k8s/api_client.h"
#include "operator/k8s/kube_config.h"
#include "operator/local/local_mode.h"
#include "operator/router/endpoint_discovery.h"
#include "operator/router/router.h"
#include "operator/spec/cluster_spec.h"

namespace {

namespace fs = std::filesystem;
using tandem::Error;
using tandem::router::AgentEndpoint;
using tandem::router::RouterConfig;
using tandem::spec::AgentAddress;
using tandem::spec::RouterSpec;

// An HTTP limit's flag accepts what the agent's accepts (http_limits.h).
CLI::Validator httpRange(const tandem::server::HttpLimitRange& range) {
  return tandem::integerIn(range.min, range.max);
}

std::vector<AgentEndpoint> toEndpoints(const std::vector<AgentAddress>& agents) {
  std::vector<AgentEndpoint> endpoints;
  for (const AgentAddress& agent : agents)
    endpoints.push_back({agent.name, agent.host, agent.port});
  return endpoints;
}

tandem::router::Policy policyFrom(const std::string& text, const std::string& what) {
  auto policy = tandem::router::parsePolicy(text);
  if (!policy.isOk()) throw Error(what + ": " + policy.status().message());
  return *policy;
}

tandem::engine::StepProfile profileFrom(const std::string& path, const std::string& what) {
  auto profile = tandem::engine::StepProfile::fromFile(path);
  if (!profile.isOk()) throw Error(what + ": " + profile.status().message());
  return *profile;
}

// The fields a Router document sets, over RouterConfig's defaults.
void applyRouterSpec(const RouterSpec& spec, const std::string& source, RouterConfig& config) {
  if (spec.host) config.host = *spec.host;
  if (spec.port) config.port = *spec.port;
  if (spec.policy) config.policy = policyFrom(*spec.policy, source + ": spec.policy");
  if (spec.disagg_threshold_tokens) config.disagg_threshold_tokens = *spec.disagg_threshold_tokens;
  if (spec.pull_back) config.pull_back = *spec.pull_back;
  if (spec.max_queued_requests) config.max_queued_requests = *spec.max_queued_requests;
  if (spec.max_inflight_requests) config.max_inflight_requests = *spec.max_inflight_requests;
  if (spec.upstream_timeout_s) config.upstream_timeout_s = *spec.upstream_timeout_s;
  if (spec.max_migrations) config.max_migrations = *spec.max_migrations;
  if (spec.migration_timeout_s) config.migration_timeout_s = *spec.migration_timeout_s;
  if (spec.threads) config.threads = *spec.threads;
  if (spec.model_path) config.model_dir = *spec.model_path;
  if (spec.poll_interval_s) config.poll_interval_s = *spec.poll_interval_s;
  if (spec.profile) config.profile = profileFrom(*spec.profile, source + ": spec.profile");
  if (spec.itl_target_ms) config.itl_target_s = *spec.itl_target_ms / 1000.0;
  if (spec.seed) config.seed = static_cast<uint64_t>(*spec.seed);
  if (spec.debug_decisions) config.debug_decisions = *spec.debug_decisions;
  if (!spec.prefill.empty()) config.prefill = toEndpoints(spec.prefill);
  if (!spec.decode.empty()) config.decode = toEndpoints(spec.decode);
  if (!spec.kv_secret.empty()) config.kv_secret = spec.kv_secret;  // local mode's
}

// Local mode's view of an in-process tandem::router::Router.
class InProcessRouter final : public tandem::local::RouterHandle {
 public:
  explicit InProcessRouter(RouterConfig config) : router_(std::move(config)) { router_.start(); }
  int port() const override { return router_.port(); }
  void setAgents(std::vector<AgentAddress> prefill, std::vector<AgentAddress> decode) override {
    router_.setAgents(toEndpoints(prefill), toEndpoints(decode));
  }
  void stop(double grace_seconds) override { router_.stop(grace_seconds); }

 private:
  tandem::router::Router router_;
};

// SIGINT and SIGTERM are taken by a watcher thread, never by a handler. The
// constructor blocks them in the calling thread, so it must run before any
// other thread starts (threads and child processes inherit the mask; agents
// wait for these signals themselves).
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int)> on_signal) {
    sigset_t set = signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      const sigset_t set = signals();
      const timespec poll_interval{0, 100'000'000};
      while (!done_) {
        const int signal_number = sigtimedwait(&set, nullptr, &poll_interval);
        if (signal_number > 0) on_signal(signal_number);
      }
    });
  }
  ~SignalWatcher() {
    done_ = true;
    thread_.join();
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  static sigset_t signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    // The terminal closed (or the ssh session dropped): a stop too, so that
    // local mode's agents, in groups of their own, are stopped with it.
    sigaddset(&set, SIGHUP);
    return set;
  }
  std::atomic<bool> done_{false};
  std::thread thread_;
};

std::chrono::milliseconds millisecondsOf(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

struct LocalFlags {
  std::string file;
  int port = 0;
  std::string policy;
  std::string agent_binary;
  double stop_timeout_s = 10;
  double startup_timeout_s = 300;
  double liveness_period_s = 10;
  int liveness_failures = 3;
  double restart_backoff_s = 1;
  double max_restart_backoff_s = 30;
  double planner_interval_s = 2;
  int metrics_port = 0;
  std::string model_cache;
};

CLI::App* addLocalCommand(CLI::App& app, LocalFlags& flags) {
  CLI::App* local = app.add_subcommand(
      "local", "run the pools of a cluster file as local agents behind one router");
  local->add_option("-f,--file", flags.file, "cluster file (PrefillPool, DecodePool, Router)")
      ->required();
  local->add_option("--port", flags.port, "router port (overrides the file; 0: a free one)")
      ->check(tandem::integerIn(0, 65535));
  local
      ->add_option("--policy", flags.policy,
                   "routing policy: kv, round_robin, random, dynamo, llm_d or sglang")
      ->check(CLI::IsMember({"kv", "round_robin", "random", "dynamo", "llm_d", "sglang"}));
  local->add_option("--agent-binary", flags.agent_binary,
                    "tandem-agent to run (default: the one next to tandem-operator)");
  local
      ->add_option("--stop-timeout", flags.stop_timeout_s,
                   "seconds the router's in-flight requests get on stop, then seconds "
                   "between an agent's SIGTERM and SIGKILL (an agent stopped alone, by a "
                   "rollout or a scale-down, gets its shutdownTimeoutSeconds + 15 s when longer)")
      ->check(tandem::positiveSeconds())
      ->capture_default_str();
  local
      ->add_option("--startup-timeout", flags.startup_timeout_s,
                   "seconds an agent may take to become healthy")
      ->check(tandem::positiveSeconds())
      ->capture_default_str();
  local
      ->add_option("--liveness-period", flags.liveness_period_s,
                   "seconds between the /health probes of a ready agent")
      ->check(tandem::positiveSeconds())
      ->capture_default_str();
  local
      ->add_option("--liveness-failures", flags.liveness_failures,
                   "failed /health probes in a row (no answer, or a 503 other than a drain's) "
                   "after which a ready agent is killed and restarted (0: never)")
      ->check(tandem::integerIn(0, 1000))
      ->capture_default_str();
  local
      ->add_option("--restart-backoff", flags.restart_backoff_s,
                   "first delay before restarting a crashed agent (doubles each crash)")
      ->check(tandem::positiveSeconds())
      ->capture_default_str();
  local
      ->add_option("--max-restart-backoff", flags.max_restart_backoff_s,
                   "longest delay before restarting a crashed agent")
      ->check(tandem::positiveSeconds())
      ->capture_default_str();
  local
      ->add_option("--planner-interval", flags.planner_interval_s,
                   "seconds between the SLA planner's rounds for pools with spec.autoscaling")
      ->check(tandem::numberIn(0.05, false, 3600))
      ->capture_default_str();
  local
      ->add_option("--metrics-port", flags.metrics_port,
                   "serve GET /metrics (the planner's metrics, replicas and agents per pool) on "
                   "127.0.0.1:PORT; 0: a free one (default: not served)")
      ->check(tandem::integerIn(0, 65535));
  local->add_option("--model-cache", flags.model_cache,
                    "where hf:// model sources are fetched to (default: TANDEM_MODEL_CACHE, "
                    "else $XDG_CACHE_HOME/tandem, else ~/.cache/tandem)");
  return local;
}

int runLocal(CLI::App& command, const LocalFlags& flags) {
  tandem::local::LocalModeOptions options;
  options.cluster_file = flags.file;
  options.model_cache = flags.model_cache;  // empty: LocalMode takes defaultModelCache()
  if (command.get_option("--port")->count() > 0) options.port = flags.port;
  if (!flags.policy.empty()) options.policy = flags.policy;
  fs::path agent_binary = flags.agent_binary;
  if (agent_binary.empty()) {
    agent_binary = fs::read_symlink("/proc/self/exe").parent_path() / "tandem-agent";
  }
  if (!fs::exists(agent_binary)) {
    throw Error("no tandem-agent at " + agent_binary.string() +
                ": build it, or pass --agent-binary");
  }
  options.supervisor.agent_binary = agent_binary;
  options.supervisor.stop_timeout = millisecondsOf(flags.stop_timeout_s);
  options.supervisor.startup_timeout = millisecondsOf(flags.startup_timeout_s);
  options.supervisor.liveness_period = millisecondsOf(flags.liveness_period_s);
  options.supervisor.liveness_failures = flags.liveness_failures;
  options.planner_interval = millisecondsOf(flags.planner_interval_s);
  if (command.get_option("--metrics-port")->count() > 0) options.metrics_port = flags.metrics_port;
  options.supervisor.initial_backoff = millisecondsOf(flags.restart_backoff_s);
  options.supervisor.max_backoff =
      millisecondsOf(std::max(flags.max_restart_backoff_s, flags.restart_backoff_s));

  const std::string source = flags.file;
  tandem::local::LocalMode mode(
      std::move(options),
      [&source](const RouterSpec& spec, std::vector<AgentAddress> prefill,
                std::vector<AgentAddress> decode) -> std::unique_ptr<tandem::local::RouterHandle> {
        RouterConfig config;
        applyRouterSpec(spec, source, config);
        // TANDEM_API_KEY in local mode's environment: the agents it starts
        // inherit it, and the router asks it of clients and sends it to them.
        config.api_key = tandem::server::apiKeyFrom("");
        config.api_key_exempt = tandem::server::parseApiKeyExemptPaths(
            tandem::server::kDefaultApiKeyExemptPaths, "TANDEM_API_KEY");
        config.agent_api_key = config.api_key;
        config.prefill = toEndpoints(prefill);
        config.decode = toEndpoints(decode);
        return std::make_unique<InProcessRouter>(std::move(config));
      });
  // The first SIGINT or SIGTERM stops in order (the router's grace, then
  // the agents' drain); a second one, as a second Ctrl-C, stops at once:
  // every agent is killed and tandem-operator exits 130, leaving nothing.
  std::atomic<int> signals_seen = 0;
  SignalWatcher signals([&mode, &signals_seen](int signal_number) {
    if (signals_seen.fetch_add(1) == 0) {
      TANDEM_LOG(kInfo) << "local: signal " << signal_number
                        << ": stopping (again to stop at once, killing the agents)";
      mode.requestStop();
      return;
    }
    TANDEM_LOG(kWarn) << "local: signal " << signal_number
                      << " again: killing every agent and exiting now";
    const std::vector<tandem::local::AgentStatus> agents = mode.agents();
    for (const tandem::local::AgentStatus& agent : agents) {
      if (agent.pid > 0) ::kill(agent.pid, SIGKILL);
    }
    // Reaped here (unless the supervisor already did), not left to become
    // zombies of whoever inherits them.
    for (const tandem::local::AgentStatus& agent : agents) {
      if (agent.pid > 0) ::waitpid(agent.pid, nullptr, 0);
    }
    std::_Exit(130);
  });
  mode.run();
  if (mode.fetchStillRunning()) {
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return 0;
}

struct RouterFlags {
  std::string config_path;
  std::string host;
  int port = 0;
  std::string policy;
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
  int64_t disagg_threshold_tokens = 0;
  bool pull_back = true;
  int64_t max_queued_requests = 0;
  int64_t max_inflight_requests = 0;
  double upstream_timeout_s = 0;
  int64_t max_migrations = 0;
  double migration_timeout_s = 0;
  int threads = 0;
  int worker_threads = 0;
  int64_t max_header_bytes = 0;
  int64_t max_body_bytes = 0;
  int request_timeout_s = 0;
  int idle_timeout_s = 0;
  int write_timeout_s = 0;
  int64_t large_body_bytes = 0;
  int max_large_requests = 0;
  int64_t max_connections = 0;
  std::string model_dir;
  std::string chat_template;
  std::string api_key;
  std::string api_key_exempt_paths = tandem::server::kDefaultApiKeyExemptPaths;
  std::string agent_api_key;
  double poll_interval_s = 0;
  double shutdown_timeout_s = 10;
  double drain_delay_s = 0;
  std::string profile;
  double itl_target_ms = 0;
  uint64_t seed = 1;
  int64_t debug_decisions = 0;
  // In-cluster discovery.
  bool discover = false;
  std::string ns;
  std::string kubeconfig;
  std::vector<std::string> prefill_pools;
  std::vector<std::string> decode_pools;
  bool all_pools = false;
};

CLI::App* addRouterCommand(CLI::App& app, RouterFlags& flags) {
  const RouterConfig defaults;
  CLI::App* command =
      app.add_subcommand("router", "the KV-aware router in front of agents given by address");
  command->add_option("--config", flags.config_path,
                      "YAML file with one Router document (flags override it)");
  command->add_option("--host", flags.host, "address to listen on (default " + defaults.host + ")");
  command->add_option("--port", flags.port, "port (0: any free port; default 8000)")
      ->check(tandem::integerIn(0, 65535));
  command
      ->add_option("--policy", flags.policy,
                   "kv, round_robin, random, dynamo, llm_d or sglang (default kv)")
      ->check(CLI::IsMember({"kv", "round_robin", "random", "dynamo", "llm_d", "sglang"}));
  command->add_option("--profile", flags.profile,
                      "the agents' step-time model (a simulation profile YAML) the kv policy "
                      "predicts with (default: built in, Llama-3.1-8B on H100)");
  command
      ->add_option("--itl-target-ms", flags.itl_target_ms,
                   "the kv policy prefills on a decode agent only while its predicted step stays "
                   "within this (default " +
                       std::to_string(static_cast<int>(defaults.itl_target_s * 1000)) + ")")
      ->check(tandem::numberIn(0, true, tandem::spec::kMaxSeconds * 1000));
  command->add_option("--seed", flags.seed, "seed of the policies' random tie-breaking (default 1)")
      ->check(tandem::integerIn(0));
  command
      ->add_option("--debug-decisions", flags.debug_decisions,
                   "recent decisions GET /debug/decisions keeps (0: off; default " +
                       std::to_string(defaults.debug_decisions) + ")")
      ->check(tandem::integerIn(0, 100000));
  command->add_option("--prefill", flags.prefill,
                      "a prefill agent, NAME=HOST:PORT or HOST:PORT (repeatable)");
  command->add_option("--decode", flags.decode,
                      "a decode agent, NAME=HOST:PORT or HOST:PORT (repeatable)");
  command
      ->add_option("--disagg-threshold-tokens", flags.disagg_threshold_tokens,
                   "prefill on the decode agent only when fewer uncached prompt tokens "
                   "(default: the kv policy by its ITL target alone, the others " +
                       std::to_string(tandem::router::kDefaultDisaggThresholdTokens) + ")")
      ->check(tandem::integerIn(0));
  command->add_option("--pull-back", flags.pull_back,
                      "let a decode agent lend its cached prefix to the prefill agent "
                      "(true/false, default true)");
  command
      ->add_option("--max-queued-requests", flags.max_queued_requests,
                   "requests waiting for an upstream slot before 503 (default " +
                       std::to_string(defaults.max_queued_requests) + ")")
      ->check(tandem::integerIn(0));
  command
      ->add_option("--max-inflight-requests", flags.max_inflight_requests,
                   "requests sent upstream at once (default " +
                       std::to_string(defaults.max_inflight_requests) + ")")
      ->check(tandem::integerIn(1));
  command
      ->add_option("--upstream-timeout", flags.upstream_timeout_s,
                   "seconds an upstream call may take (default 600)")
      ->check(tandem::positiveSeconds());
  command
      ->add_option("--max-migrations", flags.max_migrations,
                   "times one stream may move to another decode agent (default 3; 0: never)")
      ->check(tandem::integerIn(0, 100));
  command
      ->add_option("--migration-timeout", flags.migration_timeout_s,
                   "seconds after a stream first broke during which it may still move (default "
                   "60)")
      ->check(tandem::positiveSeconds());
  command->add_option("--threads", flags.threads, "I/O threads (default 2)")
      ->check(tandem::integerIn(1, 256));
  command
      ->add_option("--worker-threads", flags.worker_threads,
                   "threads that parse, tokenize and render requests (default " +
                       std::to_string(defaults.worker_threads) + ")")
      ->check(tandem::integerIn(1, 256));
  // The per-connection limits, named and defaulted as the agents' (HTTP
  // limits in docs/configuration.md).
  command
      ->add_option("--max-header-bytes", flags.max_header_bytes,
                   "bytes of a request line and headers before 431 (default " +
                       std::to_string(defaults.http.max_header_bytes) + ")")
      ->check(httpRange(tandem::server::kMaxHeaderBytesRange));
  command
      ->add_option("--max-body-bytes", flags.max_body_bytes,
                   "bytes of a request body before 413 (default " +
                       std::to_string(defaults.http.max_body_bytes) + ")")
      ->check(httpRange(tandem::server::kMaxBodyBytesRange));
  command
      ->add_option("--request-timeout", flags.request_timeout_s,
                   "seconds to receive a request, from its first byte (default " +
                       std::to_string(defaults.http.request_timeout.count()) + ")")
      ->check(httpRange(tandem::server::kRequestTimeoutRange));
  command
      ->add_option("--idle-timeout", flags.idle_timeout_s,
                   "seconds a keep-alive connection may wait for its next request (default " +
                       std::to_string(defaults.http.idle_timeout.count()) + ")")
      ->check(httpRange(tandem::server::kIdleTimeoutRange));
  command
      ->add_option("--write-timeout", flags.write_timeout_s,
                   "seconds one write to a client may take (default " +
                       std::to_string(defaults.http.write_timeout.count()) + ")")
      ->check(httpRange(tandem::server::kWriteTimeoutRange));
  command
      ->add_option("--large-body-bytes", flags.large_body_bytes,
                   "a body over this many bytes (or chunked) is large (default " +
                       std::to_string(defaults.http.large_body_bytes) + ")")
      ->check(httpRange(tandem::server::kLargeBodyBytesRange));
  command
      ->add_option("--max-large-requests", flags.max_large_requests,
                   "large requests read and handled at once; one more gets 503 (default " +
                       std::to_string(defaults.http.max_large_requests) + ")")
      ->check(httpRange(tandem::server::kMaxLargeRequestsRange));
  command
      ->add_option("--max-connections", flags.max_connections,
                   "client connections open at once; one more closes the one idle longest, or "
                   "gets 503 when none is idle (default 0: half the descriptor limit, at most " +
                       std::to_string(tandem::server::kAutoMaxConnections) + ")")
      ->check(httpRange(tandem::server::kMaxConnectionsRange));
  command->add_option("--api-key", flags.api_key,
                      "clients must send Authorization: Bearer <key> (default: the "
                      "TANDEM_API_KEY environment variable; prefer it, a flag shows in ps)");
  command
      ->add_option("--api-key-exempt-paths", flags.api_key_exempt_paths,
                   "paths served without the API key, comma-separated (ending in '/': a prefix)")
      ->capture_default_str();
  command->add_option("--agent-api-key", flags.agent_api_key,
                      "the key the agents require, sent on every call to them (default: "
                      "TANDEM_AGENT_API_KEY, else the router's own key)");
  command->add_option("--model-dir", flags.model_dir,
                      "model directory for the tokenizer (default: the one the agents report)");
  command->add_option("--chat-template", flags.chat_template,
                      "Jinja chat template file used instead of the model's (as the agents')");
  command
      ->add_option("--poll-interval", flags.poll_interval_s,
                   "seconds between agent health/load polls (default 0.5)")
      ->check(tandem::positiveSeconds());
  command
      ->add_option("--shutdown-timeout", flags.shutdown_timeout_s,
                   "seconds in-flight requests get after SIGTERM (after --drain-delay)")
      ->check(tandem::numberIn(0, false, 3600))
      ->capture_default_str();
  command
      ->add_option("--drain-delay", flags.drain_delay_s,
                   "seconds after SIGTERM during which the router still accepts requests while "
                   "/health answers 503 draining, so that load balancers stop sending first")
      ->check(tandem::numberIn(0, false, 600))
      ->capture_default_str();
  command->add_flag("--discover", flags.discover,
                    "find agents in a Kubernetes cluster: the ready endpoints of the "
                    "--prefill-pool and --decode-pool Services (their EndpointSlices)");
  command->add_option("--namespace", flags.ns,
                      "namespace of the pools (default: the kubeconfig context's, or the pod's)");
  command->add_option("--kubeconfig", flags.kubeconfig,
                      "kubeconfig file (default: $KUBECONFIG, in-cluster, then ~/.kube/config)");
  command->add_option("--prefill-pool", flags.prefill_pools,
                      "with --discover: a prefill pool (Service) name (repeatable)");
  command->add_option("--decode-pool", flags.decode_pools,
                      "with --discover: a decode pool (Service) name (repeatable)");
  command->add_flag("--all-pools", flags.all_pools,
                    "with --discover: every pool of the namespace, found by the tandem.dev/role "
                    "label of its Service's EndpointSlices (instead of --prefill-pool and "
                    "--decode-pool): pools added or deleted later are followed");
  // A flag given twice takes its last value, as the agent's: a Router's
  // spec.extraArgs come after the flags the controller writes and win.
  for (CLI::Option* option : command->get_options()) {
    if (option->get_items_expected_max() == 1) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  return command;
}

std::vector<AgentEndpoint> endpointsFromFlags(const std::vector<std::string>& texts,
                                              const std::string& role) {
  std::vector<AgentEndpoint> endpoints;
  for (size_t i = 0; i < texts.size(); ++i) {
    AgentAddress agent =
        tandem::spec::parseAgentAddress(texts[i], role + "-" + std::to_string(i), "--" + role);
    endpoints.push_back({agent.name, agent.host, agent.port});
  }
  return endpoints;
}

// The agents given by address (flags or the Router file): each with its
// own name, which labels its metrics and logs and keys the router's table
// of agents (a second of one name replaced the first), and each address
// once per role.
void checkAgentList(const RouterConfig& config) {
  std::map<std::string, std::string> roles;  // name -> "prefill" / "decode"
  for (const auto& [role, agents] :
       {std::pair<std::string, const std::vector<AgentEndpoint>*>{"prefill", &config.prefill},
        {"decode", &config.decode}}) {
    std::map<std::string, std::string> addresses;  // host:port -> name
    for (const AgentEndpoint& agent : *agents) {
      if (auto [it, inserted] = roles.emplace(agent.name, role); !inserted) {
        throw Error("agent name " + agent.name + " is given twice (" + it->second + " and " + role +
                    " agents): each agent needs its own name, which labels its metrics " +
                    "and logs");
      }
      const std::string address = agent.host + ":" + std::to_string(agent.port);
      if (auto [it, inserted] = addresses.emplace(address, agent.name); !inserted) {
        throw Error("the " + role + " agent " + address + " is given twice (as " + it->second +
                    " and " + agent.name + ")");
      }
    }
  }
}

// Discovery and agents given by address exclude each other; pools are
// named with discovery only, and it needs a decode pool (without prefill
// pools every prompt is prefilled on a decode agent).
void checkDiscoveryFlags(const RouterFlags& flags, const RouterConfig& config) {
  if (!flags.discover) {
    if (!flags.prefill_pools.empty() || !flags.decode_pools.empty() || !flags.ns.empty() ||
        !flags.kubeconfig.empty() || flags.all_pools) {
      throw Error(
          "--prefill-pool, --decode-pool, --all-pools, --namespace and --kubeconfig need "
          "--discover");
    }
    return;
  }
  if (flags.all_pools && (!flags.prefill_pools.empty() || !flags.decode_pools.empty())) {
    throw Error("--all-pools finds every pool itself: drop --prefill-pool and --decode-pool");
  }
  if (!flags.all_pools && flags.decode_pools.empty()) {
    throw Error("--discover needs at least one --decode-pool, or --all-pools");
  }
  if (!config.prefill.empty() || !config.decode.empty()) {
    throw Error(
        "--discover finds the agents itself: drop --prefill/--decode (and the Router "
        "document's agent lists)");
  }
}

int runRouter(CLI::App& command, const RouterFlags& flags) {
  RouterConfig config;
  // The agents' KV secret, from the environment as the agents take it.
  if (const char* secret = std::getenv("TANDEM_KV_SECRET")) config.kv_secret = secret;
  if (!flags.config_path.empty()) {
    applyRouterSpec(tandem::spec::loadRouterSpec(flags.config_path), flags.config_path, config);
  }
  auto given = [&](const char* name) { return command.get_option(name)->count() > 0; };
  // An empty key given is refused, as the agent refuses it: taken as none,
  // it left the router open (--api-key "$UNSET").
  for (const char* key_flag : {"--api-key", "--agent-api-key"}) {
    if (given(key_flag) && command.get_option(key_flag)->as<std::string>().empty()) {
      throw Error(std::string(key_flag) + " must be a non-empty string, got an empty string");
    }
  }
  config.api_key = tandem::server::apiKeyFrom(flags.api_key);
  config.api_key_exempt =
      tandem::server::parseApiKeyExemptPaths(flags.api_key_exempt_paths, "--api-key-exempt-paths");
  // In a cluster the agents and the router usually share one key.
  config.agent_api_key = flags.agent_api_key;
  if (config.agent_api_key.empty()) {
    const char* agent_key = std::getenv("TANDEM_AGENT_API_KEY");
    config.agent_api_key = agent_key != nullptr ? agent_key : config.api_key;
  }
  if (given("--host")) config.host = flags.host;
  if (given("--port")) config.port = flags.port;
  if (given("--policy")) config.policy = policyFrom(flags.policy, "--policy");
  if (given("--prefill")) config.prefill = endpointsFromFlags(flags.prefill, "prefill");
  if (given("--decode")) config.decode = endpointsFromFlags(flags.decode, "decode");
  if (given("--disagg-threshold-tokens")) {
    config.disagg_threshold_tokens = flags.disagg_threshold_tokens;
  }
  if (given("--pull-back")) config.pull_back = flags.pull_back;
  if (given("--profile")) config.profile = profileFrom(flags.profile, "--profile");
  if (given("--itl-target-ms")) config.itl_target_s = flags.itl_target_ms / 1000.0;
  if (given("--seed")) config.seed = flags.seed;
  if (given("--debug-decisions")) config.debug_decisions = flags.debug_decisions;
  if (given("--max-queued-requests")) config.max_queued_requests = flags.max_queued_requests;
  if (given("--max-inflight-requests")) config.max_inflight_requests = flags.max_inflight_requests;
  if (given("--upstream-timeout")) config.upstream_timeout_s = flags.upstream_timeout_s;
  if (given("--max-migrations")) config.max_migrations = flags.max_migrations;
  if (given("--migration-timeout")) config.migration_timeout_s = flags.migration_timeout_s;
  if (given("--threads")) config.threads = flags.threads;
  if (given("--worker-threads")) config.worker_threads = flags.worker_threads;
  if (given("--max-header-bytes"))
    config.http.max_header_bytes = static_cast<size_t>(flags.max_header_bytes);
  if (given("--max-body-bytes"))
    config.http.max_body_bytes = static_cast<uint64_t>(flags.max_body_bytes);
  if (given("--request-timeout"))
    config.http.request_timeout = std::chrono::seconds(flags.request_timeout_s);
  if (given("--idle-timeout"))
    config.http.idle_timeout = std::chrono::seconds(flags.idle_timeout_s);
  if (given("--write-timeout"))
    config.http.write_timeout = std::chrono::seconds(flags.write_timeout_s);
  if (given("--large-body-bytes"))
    config.http.large_body_bytes = static_cast<uint64_t>(flags.large_body_bytes);
  if (given("--max-large-requests")) config.http.max_large_requests = flags.max_large_requests;
  if (given("--max-connections")) config.http.max_connections = flags.max_connections;
  tandem::server::checkConnectionBound(config.http.max_connections);
  if (given("--model-dir")) config.model_dir = flags.model_dir;
  if (given("--chat-template")) config.chat_template = flags.chat_template;
  // Checked now, as an agent checks it at start: it is used only once an
  // agent names the model, and a missing or broken file then left the
  // router answering every request "no agent is ready yet".
  if (!config.chat_template.empty()) {
    if (tandem::Status checked = tandem::server::ChatTemplate::checkFile(config.chat_template);
        !checked.isOk()) {
      throw Error("--chat-template: " + checked.message());
    }
  }
  if (given("--poll-interval")) config.poll_interval_s = flags.poll_interval_s;
  checkDiscoveryFlags(flags, config);
  checkAgentList(config);

  std::mutex mutex;
  std::condition_variable signalled;
  bool stop = false;
  SignalWatcher signals([&](int signal_number) {
    TANDEM_LOG(kInfo) << "router: signal " << signal_number << ": stopping";
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
    signalled.notify_all();
  });
  const std::string host = config.host;
  tandem::router::Router router(std::move(config));
  // Discovery is set up (and its configuration checked) before the router
  // listens, and reports agents once it runs.
  std::unique_ptr<tandem::k8s::ApiClient> client;
  std::unique_ptr<tandem::router::EndpointDiscovery> discovery;
  if (flags.discover) {
    std::optional<fs::path> kubeconfig;
    if (!flags.kubeconfig.empty()) kubeconfig = flags.kubeconfig;
    client =
        std::make_unique<tandem::k8s::ApiClient>(tandem::k8s::resolveClusterConfig(kubeconfig));
    const std::string ns = flags.ns.empty() ? client->config().default_namespace : flags.ns;
    discovery = std::make_unique<tandem::router::EndpointDiscovery>(
        *client, ns,
        tandem::router::DiscoveryPools{flags.prefill_pools, flags.decode_pools, flags.all_pools},
        [&router](const tandem::router::DiscoveredAgents& agents) {
          router.setAgents(agents.prefill, agents.decode);
        });
  }
  router.start();
  if (discovery) discovery->start();
  std::printf("router listening on %s:%d\n", host.c_str(), router.port());
  std::fflush(stdout);
  {
    std::unique_lock<std::mutex> lock(mutex);
    signalled.wait(lock, [&] { return stop; });
  }
  if (flags.drain_delay_s > 0) {
    TANDEM_LOG(kInfo) << "router: draining: still serving for " << flags.drain_delay_s
                      << " s while /health answers 503";
    router.beginDrain();
    std::this_thread::sleep_for(std::chrono::duration<double>(flags.drain_delay_s));
  }
  if (discovery) discovery->stop();
  router.stop(flags.shutdown_timeout_s);
  return 0;
}

int runController(const tandem::controller::ControllerFlags& flags) {
  std::atomic<bool> stop{false};
  SignalWatcher signals([&stop](int signal_number) {
    TANDEM_LOG(kInfo) << "controller: signal " << signal_number << ": stopping";
    stop = true;
  });
  return tandem::controller::runController(flags, [&stop] { return stop.load(); });
}

}  // namespace

int main(int argc, char** argv) {
  tandem::installCrashReport("tandem-operator");
  CLI::App app{"tandem-operator: the KV-aware router, local mode and the Kubernetes controller"};
  app.require_subcommand(1);
  LocalFlags local_flags;
  CLI::App* local = addLocalCommand(app, local_flags);
  RouterFlags router_flags;
  CLI::App* router = addRouterCommand(app, router_flags);
  tandem::controller::ControllerFlags controller_flags;
  CLI::App* controller = tandem::controller::addControllerCommand(app, controller_flags);
  if (const std::optional<int> exit =
          tandem::parseCommandLine(app, argc, argv, "tandem-operator")) {
    return *exit;
  }
  try {
    if (local->parsed()) return runLocal(*local, local_flags);
    if (router->parsed()) return runRouter(*router, router_flags);
    if (controller->parsed()) return runController(controller_flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-operator: %s\n", e.what());
    return 1;
  }
  return 0;
}
