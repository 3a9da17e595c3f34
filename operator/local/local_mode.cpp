#include "operator/local/local_mode.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "common/file_text.h"
#include "common/http/http_connection.h"
#include "common/kv_auth.h"
#include "common/logging.h"
#include "common/model_source/hub_fetch.h"
#include "common/status.h"
#include "operator/spec/agent_command.h"

namespace tandem::local {

using spec::AgentAddress;
using spec::ClusterSpec;
using spec::parseClusterSpec;
using spec::PoolKind;
using spec::poolKindName;
using spec::poolKvSecret;
using spec::PoolSpec;
using spec::RouterSpec;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The owner loop's pace when nothing else paces it.
constexpr milliseconds kLoopInterval{20};

double steadySeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace

LocalMode::LocalMode(LocalModeOptions options, RouterFactory router_factory)
    : options_(std::move(options)),
      router_factory_(std::move(router_factory)),
      generated_kv_secret_(kv_auth::randomSecret()) {
  if (!options_.supervisor.output) {
    options_.supervisor.output = [](const std::string& line) {
      std::string text = line + "\n";
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
  }
}

LocalMode::~LocalMode() { stopMetricsServer(); }

void LocalMode::requestStop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_requested_ = true;
  stop_requested_cv_.notify_all();
}

bool LocalMode::waitForStop(milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return stop_requested_cv_.wait_for(lock, timeout, [&] { return stop_requested_; });
}

std::vector<AgentStatus> LocalMode::agents() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return agents_;
}

std::string LocalMode::fileError() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_error_;
}

std::vector<PoolPlannerStatus> LocalMode::plannerStatus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planner_status_;
}

std::vector<PlannerEventRecord> LocalMode::plannerEvents() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {planner_events_.begin(), planner_events_.end()};
}

std::string LocalMode::plannerMetrics() const { return plannerMetricsText(plannerStatus()); }

std::string LocalMode::localModeMetrics() const {
  std::vector<PoolSpec> pools;
  std::vector<AgentStatus> agents;
  std::map<std::string, int64_t> restarts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pools = published_pools_;
    agents = agents_;
    restarts = restarts_by_pool_;
  }
  std::ostringstream out;
  out << plannerMetrics();
  auto labels = [](const std::string& pool, PoolKind kind) {
    return std::string("pool=\"") + pool + "\",kind=\"" + poolKindName(kind) + "\"";
  };
  out << "# HELP tandem_local_pool_replicas Replicas local mode runs the pool with (the "
         "planner's for pools with spec.autoscaling).\n# TYPE tandem_local_pool_replicas gauge\n";
  for (const PoolSpec& pool : pools) {
    out << "tandem_local_pool_replicas{" << labels(pool.name, pool.kind) << "} " << pool.replicas
        << "\n";
  }
  out << "# HELP tandem_local_agents Agent processes of the pool by state.\n"
         "# TYPE tandem_local_agents gauge\n";
  for (const PoolSpec& pool : pools) {
    for (AgentState state :
         {AgentState::kStarting, AgentState::kReady, AgentState::kBackoff, AgentState::kStopping}) {
      const auto count = std::count_if(agents.begin(), agents.end(), [&](const AgentStatus& a) {
        return a.pool == pool.name && a.kind == pool.kind && a.state == state;
      });
      out << "tandem_local_agents{" << labels(pool.name, pool.kind) << ",state=\""
          << agentStateName(state) << "\"} " << count << "\n";
    }
  }
  out << "# HELP tandem_local_pool_updated_agents Agents of the pool that run (or are starting "
         "with) its current spec, a rollout's extra agents included.\n"
         "# TYPE tandem_local_pool_updated_agents gauge\n";
  for (const PoolSpec& pool : pools) {
    const auto count = std::count_if(agents.begin(), agents.end(), [&](const AgentStatus& a) {
      return a.pool == pool.name && a.kind == pool.kind && a.updated &&
             a.state != AgentState::kStopping;
    });
    out << "tandem_local_pool_updated_agents{" << labels(pool.name, pool.kind) << "} " << count
        << "\n";
  }
  out << "# HELP tandem_local_agent_restarts_total Agents of the pool started again after a "
         "crash or a kill for not answering /health.\n"
         "# TYPE tandem_local_agent_restarts_total counter\n";
  for (const PoolSpec& pool : pools) {
    const auto found = restarts.find(pool.name);
    out << "tandem_local_agent_restarts_total{" << labels(pool.name, pool.kind) << "} "
        << (found == restarts.end() ? 0 : found->second) << "\n";
  }
  return out.str();
}

void LocalMode::startMetricsServer() {
  if (!options_.metrics_port) return;
  const std::string& host = options_.metrics_host;
  const int wanted = *options_.metrics_port;
  // The agents' and the router's HTTP front: a connection that sends
  // nothing holds a coroutine, never one of a few threads. A port another
  // process serves is refused (SO_REUSEADDR only), not shared.
  auto server = std::make_unique<server::HttpService>(server::HttpLimits{}, /*io_threads=*/1,
                                                      /*worker_threads=*/1);
  server->get("/metrics", [this](const server::HttpRequest&, server::HttpResponse& response) {
    response.set_content(localModeMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  constexpr int kBacklog = 128;
  int port = 0;
  try {
    port = server->bind(host, wanted, kBacklog);
  } catch (const Error&) {
    throw Error("metrics port: cannot listen on " + host + ":" + std::to_string(wanted) +
                " (in use, or not an address of this machine); pass another --metrics-port, or "
                "0 for a free one");
  }
  server->start();
  metrics_server_ = std::move(server);
  metrics_port_ = port;
  options_.supervisor.output("metrics listening on " + host + ":" + std::to_string(port));
  TANDEM_LOG(kInfo) << "local: metrics on http://" << host << ":" << port << "/metrics";
}

void LocalMode::stopMetricsServer() {
  if (!metrics_server_) return;
  metrics_server_->stop();
  metrics_server_->join();
  metrics_server_.reset();
  metrics_port_ = 0;
}

std::filesystem::path defaultModelCache() {
  auto variable = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  if (std::string cache = variable("TANDEM_MODEL_CACHE"); !cache.empty()) return cache;
  if (std::string xdg = variable("XDG_CACHE_HOME"); !xdg.empty()) {
    return std::filesystem::path(xdg) / "tandem";
  }
  if (std::string home = variable("HOME"); !home.empty()) {
    return std::filesystem::path(home) / ".cache" / "tandem";
  }
  return std::filesystem::temp_directory_path() / "tandem-models";
}

namespace {

// Fetches each pool's hf:// source into `cache` (a call to the Hub even when
// the cache is complete: a branch may have moved) and points the pool at it;
// throws tandem::Error naming the pool and the reason (a pvc:// or oci://
// source, which needs Kubernetes; a failed or cancelled fetch).
void fetchModelSources(std::vector<PoolSpec>& pools, const std::string& file,
                       const std::filesystem::path& cache, const std::atomic<bool>& cancel) {
  using model_source::SourceKind;
  std::map<std::string, std::string> fetched;  // source text → directory
  for (PoolSpec& pool : pools) {
    if (!pool.model_source) continue;
    const model_source::ModelSource& source = pool.model_source->source;
    std::ostringstream label;
    label << file << ": document " << pool.document << " (" << poolKindName(pool.kind) << " \""
          << pool.name << "\"): spec.model.source: ";
    const std::string where = label.str();
    if (source.kind != SourceKind::kHuggingFace) {
      throw Error(where + source.text +
                  " needs Kubernetes (a claim or an image to mount); local mode takes hf:// "
                  "sources and paths");
    }
    if (auto done = fetched.find(source.text); done != fetched.end()) {
      pool.model_path = done->second;
      continue;
    }
    model_source::HubFetchOptions fetch;
    fetch.repo = source.repo;
    fetch.revision = source.revision;
    fetch.endpoint = pool.model_source->endpoint;
    if (const char* endpoint = std::getenv("HF_ENDPOINT"); fetch.endpoint.empty() && endpoint) {
      fetch.endpoint = endpoint;
    }
    if (fetch.endpoint.empty()) fetch.endpoint = "https://huggingface.co";
    if (const char* token = std::getenv("HF_TOKEN")) fetch.token = token;
    fetch.token_source = "HF_TOKEN in tandem-operator's environment";
    fetch.cancel = &cancel;
    fetch.directory = model_source::hubCacheDirectory(cache.string(), source);
    TANDEM_LOG(kInfo) << "local: fetching " << source.text << " from " << fetch.endpoint << " into "
                      << fetch.directory.string();
    StatusOr<model_source::HubFetchResult> result = model_source::fetchHubModel(fetch);
    if (!result.isOk()) throw Error(where + result.status().message());
    if (!result->offline.empty()) {
      TANDEM_LOG(kWarn) << "local: " << source.text << ": the Hub could not be asked ("
                        << result->offline << "); serving the complete download of commit "
                        << result->commit;
    } else {
      TANDEM_LOG(kInfo) << "local: " << source.text << " at commit " << result->commit << ": "
                        << result->files.size() << " files, " << result->bytes_downloaded
                        << " bytes downloaded";
    }
    pool.model_path = fetch.directory.string();
    fetched[source.text] = pool.model_path;
  }
}

// One KV secret for the cluster: a prefill agent's descriptors are checked
// by its decode agents with theirs (different ones refused every request
// with a 403). Throws tandem::Error naming two pools whose secrets differ,
// or one with a secret of its own and one without (which would get the
// run's); the secrets are never shown.
void requireOneKvSecret(const std::vector<PoolSpec>& pools) {
  const std::string why =
      ": the agents of one cluster sign and check their KV requests with one (set the same "
      "kvTransfer.extraConfig.secret or TANDEM_KV_SECRET on every pool, or on none: local mode "
      "then makes one)";
  const PoolSpec* keyed = nullptr;  // the first pool with a secret of its own
  std::string keyed_secret;
  const PoolSpec* unkeyed = nullptr;  // the first without
  for (const PoolSpec& pool : pools) {
    const std::string secret = poolKvSecret(pool);
    if (secret.empty()) {
      if (unkeyed == nullptr) unkeyed = &pool;
    } else if (keyed == nullptr) {
      keyed = &pool;
      keyed_secret = secret;
    } else if (secret != keyed_secret) {
      throw Error("pools " + keyed->name + " and " + pool.name + " have different KV secrets" +
                  why);
    }
  }
  if (keyed != nullptr && unkeyed != nullptr) {
    throw Error("pool " + keyed->name + " has a KV secret and pool " + unkeyed->name + " has none" +
                why);
  }
}

}  // namespace

void LocalMode::secureKvTransfer(std::vector<PoolSpec>& pools) const {
  requireOneKvSecret(pools);
  for (PoolSpec& pool : pools) {
    if (!poolKvSecret(pool).empty()) continue;
    // An empty TANDEM_KV_SECRET in spec.env is no secret: replaced.
    std::erase_if(pool.env, [](const auto& entry) { return entry.first == "TANDEM_KV_SECRET"; });
    pool.env.emplace_back("TANDEM_KV_SECRET", generated_kv_secret_);
  }
}

void LocalMode::adoptPools(const std::vector<PoolSpec>& file_pools) {
  std::vector<PoolSpec> pools = file_pools;
  for (PoolSpec& pool : pools) {
    auto running = std::find_if(pools_.begin(), pools_.end(), [&](const PoolSpec& other) {
      return other.name == pool.name && other.kind == pool.kind;
    });
    auto file_before = file_replicas_.find(pool.name);
    if (!pool.autoscaling || running == pools_.end() || !running->autoscaling ||
        file_before == file_replicas_.end()) {
      continue;  // the file's replicas, as without a planner
    }
    if (pool.replicas == file_before->second) {
      pool.replicas = running->replicas;  // the planner's replicas stand
    } else if (pool.replicas != running->replicas) {
      TANDEM_LOG(kInfo) << "local: " << poolKindName(pool.kind) << " " << pool.name
                        << ": replicas set to " << pool.replicas
                        << " in the file while the planner is on: a manual change";
      replicas_changed_in_file_.insert(pool.name);
    }
  }
  file_replicas_.clear();
  for (const PoolSpec& pool : file_pools) file_replicas_[pool.name] = pool.replicas;
  pools_ = std::move(pools);
  planner_.configure(pools_);
  // A pool no longer autoscaled leaves the planner's series (and status)
  // now: its last decision would otherwise stand there, frozen.
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(planner_status_, [&](const PoolPlannerStatus& status) {
    return std::none_of(pools_.begin(), pools_.end(), [&](const PoolSpec& pool) {
      return pool.name == status.pool && pool.kind == status.kind && pool.autoscaling;
    });
  });
}

void LocalMode::runPlanner(AgentSupervisor& supervisor) {
  const std::vector<AgentStatus> agents = supervisor.agents();
  std::vector<PlannedPool> view;
  for (const PoolSpec& pool : pools_) {
    if (!pool.autoscaling) continue;
    PlannedPool planned;
    planned.name = pool.name;
    planned.kind = pool.kind;
    planned.replicas = static_cast<int>(pool.replicas);
    planned.replicas_changed_externally = replicas_changed_in_file_.contains(pool.name);
    for (const AgentStatus& agent : agents) {
      if (agent.pool == pool.name && agent.state == AgentState::kReady) {
        planned.ready_agents.push_back({agent.name, options_.supervisor.host, agent.port});
      }
    }
    view.push_back(std::move(planned));
  }
  replicas_changed_in_file_.clear();
  const double now = steadySeconds();
  std::vector<PoolPlannerStatus> statuses = planner_.plan(now, view);

  bool scaled = false;
  std::vector<PlannerEventRecord> events;
  for (const PoolPlannerStatus& status : statuses) {
    const planner::Decision& decision = status.decision;
    if (decision.event) {
      const planner::PlannerEvent& event = *decision.event;
      if (event.type == "Warning") {
        TANDEM_LOG(kWarn) << "local: planner: " << event.reason << ": " << event.message;
      } else {
        TANDEM_LOG(kInfo) << "local: planner: " << event.reason << ": " << event.message;
      }
      events.push_back({status.pool, now, event});
    } else {
      TANDEM_LOG(kDebug) << "local: planner: " << decision.reason << ": " << decision.message;
    }
    if (!decision.write) continue;
    for (PoolSpec& pool : pools_) {
      if (pool.name == status.pool && pool.kind == status.kind) {
        pool.replicas = decision.desired_replicas;
        scaled = true;
      }
    }
  }
  {
    // The decisions and their events first: whoever sees a pool's new agent
    // finds the event that made it.
    std::lock_guard<std::mutex> lock(mutex_);
    planner_status_ = std::move(statuses);
    for (PlannerEventRecord& event : events) planner_events_.push_back(std::move(event));
    while (planner_events_.size() > kPlannerEventsKept) planner_events_.pop_front();
  }
  if (scaled) {
    supervisor.apply(pools_);
    publish(supervisor);
  }
}

void LocalMode::publish(const AgentSupervisor& supervisor) {
  std::vector<AgentStatus> agents = supervisor.agents();
  std::lock_guard<std::mutex> lock(mutex_);
  agents_ = std::move(agents);
  restarts_by_pool_ = supervisor.restartsByPool();
  published_pools_ = pools_;
}

RouterSpec LocalMode::routerSpecFor(const ClusterSpec& cluster) const {
  RouterSpec spec = cluster.router;
  if (options_.port) spec.port = options_.port;
  if (options_.policy) spec.policy = options_.policy;
  // Without a modelPath the router reads the tokenizer from the directory
  // each agent's /v1/models names (its "root", on this host), so it follows
  // a rollout that changes the model.
  // Its kv policy predicts with the agents' step-time model: the pools'
  // simulation profile when they all run the same one.
  if (!spec.profile) {
    std::optional<std::string> shared;
    bool same = true;
    for (const PoolSpec& pool : cluster.pools) {
      if (!pool.engine.simulate) {
        same = false;
      } else if (!shared) {
        shared = pool.engine.simulate;
      } else if (*shared != *pool.engine.simulate) {
        same = false;
      }
    }
    if (same && shared) spec.profile = shared;
  }
  // It signs its pull-back holds to decode agents with their KV secret.
  bool first = true;
  for (const PoolSpec& pool : cluster.pools) {
    if (pool.kind != PoolKind::kDecode) continue;
    const std::string secret = poolKvSecret(pool);
    if (first) {
      spec.kv_secret = secret;
      first = false;
    } else if (secret != spec.kv_secret) {
      TANDEM_LOG(kWarn) << "local: decode pool " << pool.name
                        << " has another KV secret than the first decode pool; the router signs "
                           "its pull-back holds with the first one's";
    }
  }
  return spec;
}

void LocalMode::run() {
  const std::string source = options_.cluster_file.string();
  std::optional<std::string> text = readFileText(options_.cluster_file);
  if (!text) throw Error(source + ": cannot be read");
  file_text_ = *text;
  ClusterSpec cluster = parseClusterSpec(file_text_, source);
  {
    std::shared_ptr<PendingFetch> fetch = startFetch(std::move(cluster), source);
    while (!fetch->done) {
      if (waitForStop(milliseconds(100))) {
        fetch->cancel = true;
        cancelled_fetches_.push_back(fetch);
        TANDEM_LOG(kInfo) << "local: stopped while fetching the pools' models";
        return;
      }
    }
    if (!fetch->error.empty()) throw Error(fetch->error);
    cluster = std::move(fetch->cluster);
  }
  secureKvTransfer(cluster.pools);
  const RouterSpec router_spec = routerSpecFor(cluster);

  // Bound before any agent starts, so that a taken port costs nothing; served
  // until run() returns, whichever way.
  startMetricsServer();
  struct MetricsServerStop {
    LocalMode* mode;
    ~MetricsServerStop() { mode->stopMetricsServer(); }
  } metrics_server_stop{this};

  AgentSupervisor supervisor(options_.supervisor);
  adoptPools(cluster.pools);
  supervisor.apply(pools_);
  publish(supervisor);
  TANDEM_LOG(kInfo) << "local: starting " << supervisor.agents().size() << " agents from "
                    << source;

  while (!supervisor.allReady()) {
    if (waitForStop(milliseconds(0))) {
      shutdown(supervisor, nullptr);
      return;
    }
    supervisor.poll();
    publish(supervisor);
    if (const auto& failure = supervisor.startFailure()) {
      shutdown(supervisor, nullptr);
      throw Error(*failure + " (its output is above, prefixed with its name)");
    }
    if (supervisor.agents().empty()) waitForStop(kLoopInterval);
  }
  supervisor.endFirstStart();

  std::vector<AgentAddress> prefill = supervisor.readyEndpoints(PoolKind::kPrefill);
  std::vector<AgentAddress> decode = supervisor.readyEndpoints(PoolKind::kDecode);
  std::unique_ptr<RouterHandle> router;
  router_shutdown_timeout_s_ = router_spec.shutdown_timeout_s;
  try {
    router = router_factory_(router_spec, prefill, decode);
  } catch (...) {
    shutdown(supervisor, nullptr);
    throw;
  }
  router_port_ = router->port();
  options_.supervisor.output("router listening on " + router_spec.host.value_or("127.0.0.1") + ":" +
                             std::to_string(router->port()));
  TANDEM_LOG(kInfo) << "local: router on " << router_spec.host.value_or("127.0.0.1") << ":"
                    << router->port() << " with " << prefill.size() << " prefill and "
                    << decode.size() << " decode agents";

  auto next_reload = Clock::now() + options_.reload_interval;
  auto next_plan = Clock::now() + options_.planner_interval;
  while (!waitForStop(supervisor.agents().empty() ? kLoopInterval : milliseconds(5))) {
    supervisor.poll();
    publish(supervisor);
    auto now_prefill = supervisor.readyEndpoints(PoolKind::kPrefill);
    auto now_decode = supervisor.readyEndpoints(PoolKind::kDecode);
    if (now_prefill != prefill || now_decode != decode) {
      prefill = std::move(now_prefill);
      decode = std::move(now_decode);
      TANDEM_LOG(kInfo) << "local: router agents now " << prefill.size() << " prefill and "
                        << decode.size() << " decode";
      router->setAgents(prefill, decode);
      ++router_updates_;
    }
    if (Clock::now() >= next_reload) {
      reloadIfChanged(supervisor, router_spec);
      next_reload = Clock::now() + options_.reload_interval;
    }
    if (planner_.active() && Clock::now() >= next_plan) {
      runPlanner(supervisor);
      next_plan = Clock::now() + options_.planner_interval;
    }
  }
  shutdown(supervisor, std::move(router));
}

std::shared_ptr<LocalMode::PendingFetch> LocalMode::startFetch(ClusterSpec cluster,
                                                               const std::string& file) const {
  auto fetch = std::make_shared<PendingFetch>();
  fetch->cluster = std::move(cluster);
  const std::filesystem::path cache =
      options_.model_cache.empty() ? defaultModelCache() : options_.model_cache;
  std::thread([fetch, file, cache] {
    try {
      fetchModelSources(fetch->cluster.pools, file, cache, fetch->cancel);
    } catch (const std::exception& e) {
      fetch->error = e.what();
    }
    fetch->done = true;
  }).detach();
  return fetch;
}

void LocalMode::reloadIfChanged(AgentSupervisor& supervisor, const RouterSpec& running_router) {
  const std::string source = options_.cluster_file.string();
  auto refuse = [&](const std::string& why) {
    TANDEM_LOG(kError) << "local: " << why << "; keeping the running cluster";
    std::lock_guard<std::mutex> lock(mutex_);
    file_error_ = why;
  };
  std::optional<std::string> text = readFileText(options_.cluster_file);
  const bool changed = text && *text != file_text_;
  if (pending_fetch_) {
    if (!changed && !pending_fetch_->done) return;
    // The fetch ends here, done or cancelled: restarts wait no longer.
    supervisor.holdRestarts({});
    std::shared_ptr<PendingFetch> fetch = std::move(pending_fetch_);
    if (!changed) {
      if (!fetch->error.empty()) return refuse(fetch->error);
      applyCluster(supervisor, running_router, std::move(fetch->cluster));
      return;
    }
    // Edited again while fetching: the newer text wins, whatever the older
    // one's fetch would have given (a wrong repository corrected).
    TANDEM_LOG(kInfo) << "local: " << source << " changed again: cancelling its last fetch";
    fetch->cancel = true;
    std::erase_if(cancelled_fetches_, [](const auto& old) { return old->done.load(); });
    cancelled_fetches_.push_back(std::move(fetch));
  }
  if (!changed) return;
  // An editor may be half-way through writing: a bad text is reported once,
  // and the next change is read again.
  file_text_ = *text;
  ClusterSpec cluster;
  try {
    cluster = parseClusterSpec(*text, source);
    requireOneKvSecret(cluster.pools);
  } catch (const Error& e) {
    return refuse(e.what());
  }
  const bool fetches = std::any_of(cluster.pools.begin(), cluster.pools.end(),
                                   [](const PoolSpec& pool) { return pool.model_source; });
  if (fetches) {
    TANDEM_LOG(kInfo) << "local: " << source
                      << " changed: fetching its pools' models before applying it";
    // The running pools fetched from the Hub restart no agent meanwhile:
    // their directory may be the one the fetch rewrites.
    std::set<std::string> fetched_pools;
    for (const PoolSpec& pool : pools_) {
      if (pool.model_source) fetched_pools.insert(pool.name);
    }
    supervisor.holdRestarts(std::move(fetched_pools));
    pending_fetch_ = startFetch(std::move(cluster), source);
    return;
  }
  applyCluster(supervisor, running_router, std::move(cluster));
}

void LocalMode::applyCluster(AgentSupervisor& supervisor, const RouterSpec& running_router,
                             ClusterSpec cluster) {
  const std::string source = options_.cluster_file.string();
  secureKvTransfer(cluster.pools);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    file_error_.clear();
  }
  TANDEM_LOG(kInfo) << "local: " << source << " changed: applying it";
  if (routerSpecFor(cluster) != running_router) {
    TANDEM_LOG(kWarn) << "local: what the router runs with changed (the Router document, or "
                         "the decode pools' KV secret it signs with); restart tandem-operator to "
                         "apply it (pools are applied now)";
  }
  adoptPools(cluster.pools);
  supervisor.apply(pools_);
  publish(supervisor);
}

void LocalMode::shutdown(AgentSupervisor& supervisor, std::unique_ptr<RouterHandle> router) {
  if (pending_fetch_) {
    pending_fetch_->cancel = true;
    cancelled_fetches_.push_back(std::move(pending_fetch_));
  }
  const double grace_s = router_shutdown_timeout_s_.value_or(
      std::chrono::duration<double>(options_.supervisor.stop_timeout).count());
  if (router != nullptr) {
    TANDEM_LOG(kInfo) << "local: stopping the router";
    router->stop(grace_s);
    router_port_ = 0;
    // Its calls to the agents close with it: they abort what they were
    // still computing for clients the stop cut, instead of draining it.
    router.reset();
  }
  TANDEM_LOG(kInfo) << "local: stopping the agents";
  supervisor.beginStop();
  while (!supervisor.stopped()) {
    supervisor.poll();
    publish(supervisor);
    if (supervisor.agents().empty()) break;
  }
  publish(supervisor);
  TANDEM_LOG(kInfo) << "local: stopped";
}

}  // namespace tandem::local
