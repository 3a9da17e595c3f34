#include "operator/controller/controller.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "common/hex.h"
#include "common/logging.h"
#include "operator/controller/desired_objects.h"
#include "operator/controller/object_meta.h"

namespace tandem::controller {
namespace {

using nlohmann::json;

constexpr OwnerKind kOwnerKinds[] = {OwnerKind::kPrefillPool, OwnerKind::kDecodePool,
                                     OwnerKind::kRouter};

std::string keyOf(OwnerKind kind, const std::string& ns, const std::string& name) {
  return std::string(ownerKindName(kind)) + "/" + ns + "/" + name;
}

struct ParsedKey {
  OwnerKind kind;
  std::string ns;
  std::string name;
};

std::optional<ParsedKey> parseKey(const std::string& key) {
  const size_t first = key.find('/');
  const size_t second = first == std::string::npos ? first : key.find('/', first + 1);
  if (second == std::string::npos) return std::nullopt;
  auto kind = ownerKindFromName(key.substr(0, first));
  if (!kind) return std::nullopt;
  return ParsedKey{*kind, key.substr(first + 1, second - first - 1), key.substr(second + 1)};
}

std::string metadataString(const json& object, const char* key) {
  if (!object.contains("metadata") || !object["metadata"].is_object()) return "";
  return object["metadata"].value(key, "");
}

std::string labelOf(const json& object, const char* label) {
  if (!object.contains("metadata") || !object["metadata"].contains("labels")) return "";
  return object["metadata"]["labels"].value(label, "");
}

}  // namespace

std::string defaultIdentity() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  std::mt19937_64 generator{std::random_device{}()};
  return std::string(host) + "_" + hex64(generator());
}

Controller::Controller(k8s::ApiClient& client, ControllerOptions options)
    : client_(client),
      options_([&] {
        if (options.identity.empty()) options.identity = defaultIdentity();
        return std::move(options);
      }()),
      metrics_(pool_replicas_),
      writer_(client, !options_.leader_elect, [this] { metrics_.apiWrite(); }),
      events_(writer_, options_.identity),
      reconciler_(writer_, events_, reconcilerOptions()),
      cache_reconciler_(
          writer_, events_, reconcilerOptions(),
          ClusterReader{
              [this](const std::string& ns, const json& labels) { return cachedPods(ns, labels); },
              [this](const std::string& ns, OwnerKind kind) { return cachedPoolNames(ns, kind); }}),
      queue_(options_.initial_backoff, options_.max_backoff) {
  autoscaler_ = std::make_unique<PoolAutoscaler>(
      writer_, events_,
      options_.planner_metrics ? std::move(options_.planner_metrics) : podScrapeSource(),
      [this](OwnerKind kind, const std::string& ns, const std::string& name) {
        enqueue(kind, ns, name);
      });
  // Without election this replica is the only writer.
  leading_ = !options_.leader_elect;
  reconciling_ = leading_.load();
  pool_replicas_.setOpen(leading_.load());
  metrics_.setLeader(leading_.load());
}

Controller::~Controller() { stop(); }

ReconcilerOptions Controller::reconcilerOptions() {
  ReconcilerOptions options;
  options.defaults = options_.defaults;
  options.pool_replicas = &pool_replicas_;
  options.planner_conditions = [this](OwnerKind kind, const std::string& ns,
                                      const std::string& name) {
    return autoscaler_ ? autoscaler_->conditionsFor(kind, ns, name) : std::vector<json>{};
  };
  return options;
}

void Controller::start() {
  if (started_.exchange(true)) return;
  k8s::InformerOptions owner_options;
  owner_options.ns = options_.ns;
  owner_options.watch_timeout_seconds = options_.watch_timeout_seconds;
  for (OwnerKind kind : kOwnerKinds) {
    owner_informers_.push_back(
        std::make_unique<k8s::Informer>(client_, resourceOf(kind), owner_options,
                                        [this, kind](k8s::EventType type, const json& object) {
                                          onOwnerEvent(kind, type, object);
                                        }));
  }
  k8s::InformerOptions child_options = owner_options;
  child_options.label_selector = std::string(kManagedByLabel) + "=" + kManagedBy;
  for (const k8s::ResourceType* type :
       {&k8s::resources::kDeployments, &k8s::resources::kServices, &k8s::resources::kPods,
        &k8s::resources::kPodDisruptionBudgets}) {
    child_informers_.push_back(std::make_unique<k8s::Informer>(
        client_, *type, child_options,
        [this](k8s::EventType, const json& object) { onChildEvent(object); }));
  }
  for (auto& informer : owner_informers_) informer->start();
  for (auto& informer : child_informers_) informer->start();

  if (options_.leader_elect) {
    k8s::LeaderElectionConfig config;
    config.ns = options_.leader_election_namespace;
    config.name = options_.leader_election_id;
    config.identity = options_.identity;
    config.lease_duration = options_.lease_duration;
    config.renew_deadline = options_.renew_deadline;
    config.retry_period = options_.retry_period;
    k8s::ClusterConfig election_config = client_.config();
    const double call_deadline_s =
        std::chrono::duration<double>(options_.renew_deadline).count() / 2;
    election_config.connect_timeout_s =
        std::min(election_config.connect_timeout_s, call_deadline_s);
    election_config.request_timeout_s =
        std::min(election_config.request_timeout_s, call_deadline_s);
    // The election loop retries on its own schedule (retry_period).
    k8s::RetryPolicy no_retries;
    no_retries.attempts = 1;
    election_client_ = std::make_unique<k8s::ApiClient>(std::move(election_config), no_retries);
    elector_ = std::make_unique<k8s::LeaderElector>(
        *election_client_, config, [this] { setLeading(true); }, [this] { setLeading(false); });
    elector_->start();
  }
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { workerLoop(); });
  }
  if (options_.planner_interval.count() > 0)
    planner_thread_ = std::thread([this] { plannerLoop(); });
  if (reconciling_) enqueueAll();
}

void Controller::stop() {
  if (!started_.load() || stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(leading_mutex_);
    leading_changed_.notify_all();
  }
  queue_.shutDown();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
  if (planner_thread_.joinable()) planner_thread_.join();
  // After the workers: nothing writes once the Lease is released.
  if (elector_) elector_->stop();
  for (auto& informer : child_informers_) informer->stop();
  for (auto& informer : owner_informers_) informer->stop();
}

bool Controller::synced() const {
  if (!started_.load()) return false;
  for (const auto& informer : owner_informers_) {
    if (!informer->hasSynced()) return false;
  }
  for (const auto& informer : child_informers_) {
    if (!informer->hasSynced()) return false;
  }
  return true;
}

bool Controller::waitForSync(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto* informers : {&owner_informers_, &child_informers_}) {
    for (const auto& informer : *informers) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!informer->waitForSync(std::max(left, std::chrono::milliseconds(0)))) return false;
    }
  }
  return started_.load();
}

std::string Controller::renderMetrics() {
  // The leader gauge is set where leading_ changes (setLeading): set here
  // from a separate read, a scrape could put back the value just replaced.
  metrics_.setQueueDepth(queue_.depth());
  for (const auto* informers : {&owner_informers_, &child_informers_}) {
    for (const auto& informer : *informers) {
      metrics_.setWatchTotals(informer->type().plural, informer->watchRestarts(),
                              informer->relists());
    }
  }
  return metrics_.render() + autoscaler_->metricsText();
}

k8s::Result<k8s::Done> Controller::reconcileNow(OwnerKind kind, const std::string& ns,
                                                const std::string& name) {
  Reconciler& reconciler = synced() ? cache_reconciler_ : reconciler_;
  auto result = reconciler.reconcile(kind, ns, name);
  metrics_.reconciled(ownerKindName(kind), result.isOk());
  return result;
}

void Controller::enqueue(OwnerKind kind, const std::string& ns, const std::string& name) {
  if (name.empty()) return;
  queue_.add(keyOf(kind, ns, name));
}

void Controller::enqueueAll() {
  for (size_t i = 0; i < owner_informers_.size(); ++i) {
    for (const json& object : owner_informers_[i]->list()) {
      enqueue(kOwnerKinds[i], metadataString(object, "namespace"), metadataString(object, "name"));
    }
  }
}

void Controller::enqueueRouters(const std::string& ns) {
  if (owner_informers_.size() < 3) return;
  for (const json& router : owner_informers_[2]->list()) {
    if (metadataString(router, "namespace") == ns) {
      enqueue(OwnerKind::kRouter, ns, metadataString(router, "name"));
    }
  }
}

void Controller::onOwnerEvent(OwnerKind kind, k8s::EventType type, const json& object) {
  const std::string ns = metadataString(object, "namespace");
  enqueue(kind, ns, metadataString(object, "name"));
  // A Router without pool lists routes to every pool of its namespace, and a
  // Router without a modelPath takes its tokenizer from a decode pool's
  // model source, which a modified pool may have changed.
  if (kind == OwnerKind::kPrefillPool && type != k8s::EventType::kModified) enqueueRouters(ns);
  if (kind == OwnerKind::kDecodePool) enqueueRouters(ns);
}

void Controller::onChildEvent(const json& object) {
  const std::string ns = metadataString(object, "namespace");
  if (object.contains("metadata") && object["metadata"].contains("ownerReferences")) {
    for (const json& ref : object["metadata"]["ownerReferences"]) {
      if (!ref.value("controller", false)) continue;
      auto kind = ownerKindFromName(ref.value("kind", ""));
      if (kind && ref.value("apiVersion", "").starts_with("tandem.dev/")) {
        enqueue(*kind, ns, ref.value("name", ""));
        return;
      }
    }
  }
  // Pods are owned by ReplicaSets: their labels name the pool or router.
  const std::string pool = labelOf(object, kPoolLabel);
  const std::string role = labelOf(object, kRoleLabel);
  if (!pool.empty() && role == "prefill") enqueue(OwnerKind::kPrefillPool, ns, pool);
  if (!pool.empty() && role == "decode") enqueue(OwnerKind::kDecodePool, ns, pool);
  const std::string router = labelOf(object, kRouterLabel);
  if (!router.empty()) enqueue(OwnerKind::kRouter, ns, router);
}

void Controller::setLeading(bool leading) {
  if (leading) {
    writer_.open();
    pool_replicas_.setOpen(true);
    {
      std::lock_guard<std::mutex> lock(leading_mutex_);
      leading_ = true;
      reconciling_ = true;
      leading_changed_.notify_all();
    }
    metrics_.setLeader(true);
    TANDEM_LOG(kInfo) << "controller: leading as " << options_.identity;
    std::printf("leading\n");
    std::fflush(stdout);
    enqueueAll();
    return;
  }
  // Workers stop at once, the planner at its next round (one begun runs
  // on, its writes refused); what this replica last saw of the pools is
  // not exported as if it were current (the leader's series are): the
  // table is emptied, and kept empty until it leads again, whatever a
  // reconcile begun before finishes. Then writes are fenced before it says
  // it stopped leading: once the gauge reads 0, every write it began has
  // been answered and none will try again.
  {
    std::lock_guard<std::mutex> lock(leading_mutex_);
    reconciling_ = false;
    leading_changed_.notify_all();
  }
  pool_replicas_.setOpen(false);
  const int in_flight = writer_.writesInFlight();
  if (in_flight > 0) {
    TANDEM_LOG(kWarn) << "controller: lost the Lease; waiting for " << in_flight
                      << " write(s) in flight to be answered";
  }
  writer_.close();
  {
    std::lock_guard<std::mutex> lock(leading_mutex_);
    leading_ = false;
    leading_changed_.notify_all();
  }
  metrics_.setLeader(false);
  TANDEM_LOG(kWarn) << "controller: stopped leading; writes stop until the Lease is won again";
}

void Controller::workerLoop() {
  // Not from caches still filling: a pool or pod not listed yet would be
  // taken for absent (client-go's WaitForCacheSync before the workers).
  while (!stopping_.load() && !waitForSync(std::chrono::seconds(1))) {
  }
  while (!stopping_.load()) {
    {
      std::unique_lock<std::mutex> lock(leading_mutex_);
      leading_changed_.wait(lock, [this] { return reconciling_.load() || stopping_.load(); });
    }
    std::optional<std::string> key = queue_.get();
    if (!key) return;
    if (!reconciling_.load()) {
      // Dropped: becoming leader again enqueues every owner.
      queue_.done(*key);
      continue;
    }
    auto parsed = parseKey(*key);
    if (!parsed) {
      queue_.forget(*key);
      queue_.done(*key);
      continue;
    }
    auto result = cache_reconciler_.reconcile(parsed->kind, parsed->ns, parsed->name);
    metrics_.reconciled(ownerKindName(parsed->kind), result.isOk());
    if (result.isOk()) {
      queue_.forget(*key);
      if (result->requeue_after.count() > 0) queue_.addAfter(*key, result->requeue_after);
    } else {
      if (result.error().reason != "NotLeader") {
        TANDEM_LOG(kWarn) << "controller: " << *key << ": " << result.error().toString()
                          << " (retrying)";
        queue_.addRateLimited(*key);
      }
    }
    queue_.done(*key);
  }
}

std::vector<json> Controller::cachedPods(const std::string& ns, const json& labels) const {
  std::vector<json> pods;
  if (child_informers_.size() < 3) return pods;
  for (json& pod : child_informers_[2]->list()) {
    if (metadataString(pod, "namespace") == ns && matchesLabels(pod, labels)) {
      pods.push_back(std::move(pod));
    }
  }
  return pods;
}

std::vector<std::string> Controller::cachedPoolNames(const std::string& ns, OwnerKind kind) const {
  std::vector<std::string> names;
  const size_t index = kind == OwnerKind::kPrefillPool ? 0 : 1;
  if (owner_informers_.size() <= index) return names;
  for (const json& pool : owner_informers_[index]->list()) {
    if (metadataString(pool, "namespace") == ns) names.push_back(metadataString(pool, "name"));
  }
  std::sort(names.begin(), names.end());
  return names;
}

void Controller::plannerLoop() {
  const auto start = std::chrono::steady_clock::now();
  while (!stopping_.load()) {
    {
      std::unique_lock<std::mutex> lock(leading_mutex_);
      leading_changed_.wait_for(lock, options_.planner_interval,
                                [this] { return stopping_.load(); });
    }
    // A replica that does not lead decides nothing (its view of who wrote
    // what would be stale) and writes nothing; it forgets its pools' planner
    // state and series, and plans afresh if it leads again (the other
    // leader's writes are not a manual change).
    if (!stopping_.load() && !reconciling_.load()) autoscaler_->round(0, {});
    if (stopping_.load() || !reconciling_.load() || !synced()) continue;
    plannerRound(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

void Controller::plannerRound(double now_seconds) {
  std::vector<AutoscaledPool> pools;
  std::map<std::string, std::vector<std::string>> hpa_targets;  // by namespace
  for (OwnerKind kind : {OwnerKind::kPrefillPool, OwnerKind::kDecodePool}) {
    const size_t index = kind == OwnerKind::kPrefillPool ? 0 : 1;
    for (json& object : owner_informers_[index]->list()) {
      if (!object.contains("spec") || !object["spec"].contains("autoscaling")) continue;
      const std::string ns = metadataString(object, "namespace");
      const std::string name = metadataString(object, "name");
      if (hpa_targets.count(ns) == 0) {
        std::vector<std::string>& targets = hpa_targets[ns];
        auto listed = client_.list(k8s::resources::kHorizontalPodAutoscalers, ns);
        if (listed.isOk()) {
          targets = hpaTargets(listed->value("items", std::vector<json>{}));
        } else {
          TANDEM_LOG(kWarn) << "controller: planner: cannot list HorizontalPodAutoscalers in " << ns
                            << ": " << listed.error().toString()
                            << " (an HPA there would not be noticed)";
        }
      }
      const std::vector<std::string>& targets = hpa_targets[ns];
      AutoscaledPool pool;
      pool.kind = kind;
      pool.hpa_present = std::find(targets.begin(), targets.end(),
                                   std::string(ownerKindName(kind)) + "/" + name) != targets.end();
      pool.pods = cachedPods(
          ns, poolSelector(name, kind == OwnerKind::kPrefillPool ? spec::PoolKind::kPrefill
                                                                 : spec::PoolKind::kDecode));
      pool.object = std::move(object);
      pools.push_back(std::move(pool));
    }
  }
  autoscaler_->round(now_seconds, pools);
}

}  // namespace tandem::controller
