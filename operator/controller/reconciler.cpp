#include "operator/controller/reconciler.h"

#include <algorithm>
#include <map>

#include "common/logging.h"
#include "common/status.h"
#include "operator/controller/object_diff.h"
#include "operator/controller/workload_status.h"

namespace tandem::controller {

using nlohmann::json;

struct Reconciler::ChildOutcome {
  enum class State { kInSync, kConflict, kFailed } state = State::kInSync;
  std::optional<json> live;  // the child as it is now (kInSync)
  std::optional<k8s::ApiError> error;
  std::string problem;  // (kConflict, kFailed) for the Degraded message
};

namespace {

// How soon an owner whose child's name another object holds looks again.
constexpr std::chrono::seconds kNameConflictRecheck{30};

std::string describe(const Owner& owner) { return owner.kind + " " + owner.ns + "/" + owner.name; }

int64_t specReplicas(const json& object, int64_t fallback) {
  if (object.contains("spec") && object["spec"].is_object() &&
      object["spec"].contains("replicas") && object["spec"]["replicas"].is_number_integer()) {
    return object["spec"]["replicas"].get<int64_t>();
  }
  return fallback;
}

int64_t integerField(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number_integer()) return 0;
  return object[key].get<int64_t>();
}

// What tandem_operator_pool_replicas shows of a pool: its spec.replicas and
// the counts of the status just computed from its Deployment.
PoolReplicas poolReplicas(const WorkloadObservation& observation, const json& status) {
  PoolReplicas replicas;
  replicas.desired = observation.desired_replicas;
  replicas.updated = integerField(status, "updatedReplicas");
  replicas.ready = integerField(status, "readyReplicas");
  if (observation.deployment && observation.deployment->contains("status")) {
    replicas.available = integerField((*observation.deployment)["status"], "availableReplicas");
  }
  return replicas;
}

}  // namespace

const k8s::ResourceType& resourceOf(OwnerKind kind) {
  switch (kind) {
    case OwnerKind::kPrefillPool:
      return k8s::resources::kPrefillPools;
    case OwnerKind::kDecodePool:
      return k8s::resources::kDecodePools;
    case OwnerKind::kRouter:
      break;
  }
  return k8s::resources::kRouters;
}

const char* ownerKindName(OwnerKind kind) { return resourceOf(kind).kind.c_str(); }

std::optional<OwnerKind> ownerKindFromName(const std::string& kind) {
  for (OwnerKind candidate :
       {OwnerKind::kPrefillPool, OwnerKind::kDecodePool, OwnerKind::kRouter}) {
    if (resourceOf(candidate).kind == kind) return candidate;
  }
  return std::nullopt;
}

Reconciler::Reconciler(ApiWriter& writer, EventRecorder& events, ReconcilerOptions options,
                       ClusterReader reader)
    : writer_(writer), events_(events), options_(std::move(options)), reader_(std::move(reader)) {}

// The owner's child of `type` named as the owner, deleted when it exists and
// the owner controls it (a PodDisruptionBudget the spec turned off).
Reconciler::ChildOutcome Reconciler::removeChild(const k8s::ResourceType& type,
                                                 const Owner& owner) {
  ChildOutcome outcome;
  auto live = writer_.client().get(type, owner.ns, owner.name);
  if (!live.isOk()) {
    if (live.error().isNotFound()) return outcome;
    outcome.state = ChildOutcome::State::kFailed;
    outcome.error = live.error();
    outcome.problem = "reading " + type.kind + " " + owner.name + ": " + live.error().toString();
    return outcome;
  }
  if (!isControlledBy(*live, owner.uid)) return outcome;  // not ours: left alone
  auto removed = writer_.remove(type, owner.ns, owner.name);
  if (!removed.isOk() && !removed.error().isNotFound()) {
    outcome.state = ChildOutcome::State::kFailed;
    outcome.error = removed.error();
    outcome.problem =
        "deleting " + type.kind + " " + owner.name + ": " + removed.error().toString();
    return outcome;
  }
  TANDEM_LOG(kInfo) << "controller: " << describe(owner) << ": " << type.kind << " " << owner.name
                    << " deleted (spec.disruptionBudget.enabled is false)";
  return outcome;
}

Reconciler::ChildOutcome Reconciler::foreignChild(const k8s::ResourceType& type, const Owner& owner,
                                                  const std::string& name) {
  ChildOutcome outcome;
  const std::string what = type.kind + " " + name;
  auto live = writer_.client().get(type, owner.ns, name);
  if (!live.isOk()) {
    if (!live.error().isNotFound()) {
      outcome.state = ChildOutcome::State::kFailed;
      outcome.error = live.error();
      outcome.problem = "reading " + what + ": " + live.error().toString();
    }
    return outcome;
  }
  if (!isControlledBy(*live, owner.uid)) {
    outcome.state = ChildOutcome::State::kConflict;
    outcome.problem = what + " exists and is not controlled by " + describe(owner) +
                      ": rename the pool or delete that " + type.kind;
    return outcome;
  }
  outcome.live = std::move(*live);
  return outcome;
}

Reconciler::ChildOutcome Reconciler::syncChild(const k8s::ResourceType& type, const Owner& owner,
                                               const json& desired, ChildOutcome read) {
  const std::string name = desired["metadata"]["name"];
  const std::string what = type.kind + " " + name;
  ChildOutcome outcome = std::move(read);
  if (outcome.state != ChildOutcome::State::kInSync) return outcome;
  const bool exists = outcome.live.has_value();
  if (exists) {
    if (isSubset(desired, *outcome.live)) return outcome;
    TANDEM_LOG(kInfo) << "controller: " << describe(owner) << ": " << what << " differs at "
                      << firstDifference(desired, *outcome.live) << ": applying";
    outcome.live.reset();
  }
  // Server-side apply for creation too: the fields are then owned by the
  // apply manager from the start, so a field later dropped from the desired
  // object is removed from the live one.
  auto applied = writer_.apply(type, owner.ns, desired);
  if (!applied.isOk() && !exists && applied.error().isNotFound()) {
    applied = writer_.create(type, owner.ns, desired);
  }
  if (!applied.isOk()) {
    if (applied.error().reason == "NotLeader") {
      outcome.state = ChildOutcome::State::kFailed;
      outcome.error = applied.error();
      return outcome;
    }
    const char* reason = exists ? "FailedUpdate" : "FailedCreate";
    outcome.state = ChildOutcome::State::kFailed;
    outcome.error = applied.error();
    outcome.problem =
        (exists ? "updating " : "creating ") + what + ": " + applied.error().toString();
    // A child the API server keeps refusing is retried with backoff for
    // ever: one Event per distinct refusal (the Degraded condition carries
    // the latest), not one per retry.
    events_.recordOnce(owner, kWarning, reason, outcome.problem);
    return outcome;
  }
  events_.forget(owner, exists ? "FailedUpdate" : "FailedCreate");
  events_.record(owner, kNormal, exists ? "Updated" : "Created",
                 (exists ? "Updated " : "Created ") + what);
  outcome.live = std::move(*applied);
  return outcome;
}

std::vector<json> Reconciler::pods(const std::string& ns, const json& match_labels) {
  if (reader_.pods) return reader_.pods(ns, match_labels);
  k8s::ListOptions options;
  options.label_selector = selectorString(match_labels);
  auto list = writer_.client().list(k8s::resources::kPods, ns, options);
  if (!list.isOk() || !list->contains("items")) return {};
  return (*list)["items"].get<std::vector<json>>();
}

std::vector<std::string> Reconciler::sharedNames(const std::vector<std::string>& a,
                                                 const std::vector<std::string>& b) {
  std::vector<std::string> shared;
  for (const std::string& name : a) {
    if (std::find(b.begin(), b.end(), name) != b.end()) shared.push_back(name);
  }
  return shared;
}

bool Reconciler::inNameConflict(OwnerKind kind, const std::string& ns, const std::string& name) {
  auto object = writer_.client().get(resourceOf(kind), ns, name);
  if (!object.isOk() || !object->contains("status")) return false;
  const json& conditions = (*object)["status"].value("conditions", json::array());
  for (const json& condition : conditions) {
    if (condition.value("type", "") == "Degraded" && condition.value("status", "") == "True" &&
        condition.value("reason", "") == "NameConflict") {
      return true;
    }
  }
  return false;
}

std::vector<std::string> Reconciler::poolNames(const std::string& ns, OwnerKind kind) {
  if (reader_.pool_names) return reader_.pool_names(ns, kind);
  std::vector<std::string> names;
  auto list = writer_.client().list(resourceOf(kind), ns);
  if (!list.isOk() || !list->contains("items")) return names;
  for (const json& item : (*list)["items"]) names.push_back(item["metadata"].value("name", ""));
  std::sort(names.begin(), names.end());
  return names;
}

k8s::Result<k8s::Done> Reconciler::writeStatus(OwnerKind kind, const json& object,
                                               const json& status) {
  if (object.contains("status") && object["status"] == status) return k8s::Done{};
  const Owner owner = ownerOf(object);
  auto written = writer_.readModifyWrite(
      resourceOf(kind), owner.ns, owner.name,
      [&](json& current) {
        if (current.contains("status") && current["status"] == status) return false;
        current["status"] = status;
        return true;
      },
      "status");
  if (!written.isOk()) {
    if (written.error().isNotFound()) return k8s::Done{};
    return written.error();
  }
  return k8s::Done{};
}

k8s::Result<k8s::Done> Reconciler::reconcile(OwnerKind kind, const std::string& ns,
                                             const std::string& name) {
  const PoolKey pool_key{ns, ownerKindName(kind), name};
  auto read = writer_.client().get(resourceOf(kind), ns, name);
  if (!read.isOk()) {
    if (read.error().isNotFound()) {
      if (kind != OwnerKind::kRouter && options_.pool_replicas) {
        options_.pool_replicas->remove(pool_key);
      }
      return k8s::Done{};
    }
    return read.error();
  }
  const json& object = *read;
  // Being deleted (in the foreground, or held by someone's finalizer): its
  // children are the garbage collector's now, and re-creating one would
  // start pods the deletion then removes.
  if (object.contains("metadata") && object["metadata"].contains("deletionTimestamp")) {
    return k8s::Done{};
  }
  const Owner owner = ownerOf(object);
  const std::string source = describe(owner);

  WorkloadObservation observation;
  observation.generation = owner.generation;
  std::optional<k8s::ApiError> error;
  auto fail = [&](const std::string& reason, const std::string& message) {
    if (!observation.failure) observation.failure = std::make_pair(reason, message);
  };

  std::chrono::milliseconds requeue_after{0};
  // The desired children, or the reason there are none.
  json desired_deployment;
  json desired_service;
  json desired_budget;  // the owner's PodDisruptionBudget; null: none wanted
  std::vector<std::string> ignored_template_fields;  // spec.template's, the controller's own
  json match_labels;
  std::vector<std::string> prefill_pools;
  std::vector<std::string> decode_pools;
  try {
    if (kind == OwnerKind::kRouter) {
      spec::RouterSpec router = spec::parseRouterObject(object, source);
      match_labels = routerSelector(name);
      observation.desired_replicas = router.replicas;
      const std::vector<std::string> prefill_names = poolNames(ns, OwnerKind::kPrefillPool);
      const std::vector<std::string> decode_names = poolNames(ns, OwnerKind::kDecodePool);
      prefill_pools = router.prefill_pools.value_or(prefill_names);
      decode_pools = router.decode_pools.value_or(decode_names);
      auto exists = [](const std::vector<std::string>& names, const std::string& name) {
        return std::find(names.begin(), names.end(), name) != names.end();
      };
      auto notFound = [&](const char* field, const std::string& pool, OwnerKind pool_kind) {
        fail("PoolNotFound", std::string(field) + " names \"" + pool + "\", which is not a " +
                                 ownerKindName(pool_kind) + " of namespace " + ns);
      };
      // A PrefillPool and a DecodePool of one name would share children (the
      // second is Degraded, NameConflict), and a router given the name as
      // both refuses to start: the name goes to the pool that is not in
      // conflict, or (undecided, or both listed by the Router) to neither.
      // A name in both lists with a pool of one kind only is no conflict:
      // the list of the other kind names a pool that does not exist, and
      // loses the name.
      for (const std::string& shared : sharedNames(prefill_pools, decode_pools)) {
        if (!exists(prefill_names, shared)) {
          notFound("spec.prefillPools", shared, OwnerKind::kPrefillPool);
          std::erase(prefill_pools, shared);
          continue;
        }
        if (!exists(decode_names, shared)) {
          notFound("spec.decodePools", shared, OwnerKind::kDecodePool);
          std::erase(decode_pools, shared);
          continue;
        }
        const bool prefill_conflicted = inNameConflict(OwnerKind::kPrefillPool, ns, shared);
        const bool decode_conflicted = inNameConflict(OwnerKind::kDecodePool, ns, shared);
        const bool listed = router.prefill_pools && router.decode_pools;
        if (listed || prefill_conflicted == decode_conflicted) {
          fail("NameConflict", "a PrefillPool and a DecodePool are both named \"" + shared +
                                   "\": the router routes to neither; rename one");
        }
        if (listed || prefill_conflicted || !decode_conflicted) std::erase(prefill_pools, shared);
        if (listed || decode_conflicted || !prefill_conflicted) std::erase(decode_pools, shared);
      }
      for (const std::string& pool : prefill_pools) {
        if (!exists(prefill_names, pool))
          notFound("spec.prefillPools", pool, OwnerKind::kPrefillPool);
      }
      for (const std::string& pool : decode_pools) {
        if (!exists(decode_names, pool)) notFound("spec.decodePools", pool, OwnerKind::kDecodePool);
      }
      // The routed pools' specs (a pool that does not parse reports its own
      // InvalidSpec), for the warnings and the model directory below.
      std::vector<std::pair<std::string, spec::PoolSpec>> routed;
      for (auto [names, pool_kind] : {std::pair{&prefill_pools, spec::PoolKind::kPrefill},
                                      std::pair{&decode_pools, spec::PoolKind::kDecode}}) {
        for (const std::string& pool_name : *names) {
          auto pool_object = writer_.client().get(
              resourceOf(pool_kind == spec::PoolKind::kPrefill ? OwnerKind::kPrefillPool
                                                               : OwnerKind::kDecodePool),
              ns, pool_name);
          if (!pool_object.isOk()) continue;
          try {
            routed.emplace_back(pool_name, spec::parsePoolObject(*pool_object, pool_kind,
                                                                 describe(ownerOf(*pool_object))));
          } catch (const Error&) {
            continue;
          }
        }
      }
      if (!router.kv_secret_ref) {
        // Agents with a KV secret refuse unsigned holds: without the same
        // secret the router's prefix lending (pull-back) is always refused.
        for (const auto& [pool_name, pool] : routed) {
          if (!pool.kv_transfer.secret_ref) continue;
          events_.recordOnce(owner, kWarning, "UnsignedHolds",
                             "pool " + pool_name +
                                 " has kvTransfer.secretRef but this Router has no "
                                 "spec.kvSecretRef: its agents refuse the router's unsigned "
                                 "pull-back holds, so prefix lending is off; give the Router "
                                 "the same Secret key");
          break;
        }
      }
      // A request's priority is read by its prefill agent and its decode
      // agent: one that serves first come, first served refuses a priority
      // other than 0 (local mode refuses such a file; here each pool is its
      // own resource).
      std::map<std::string, std::string> policies;  // policy → the first pool with it
      for (const auto& [pool_name, pool] : routed) {
        policies.emplace(pool.engine.scheduling_policy.value_or("fcfs"), pool_name);
      }
      if (policies.size() > 1) {
        events_.recordOnce(owner, kWarning, "MixedSchedulingPolicy",
                           "pool " + policies["priority"] +
                               " serves requests by priority (engine.schedulingPolicy) and pool " +
                               policies["fcfs"] +
                               " first come, first served: a request with a priority other than "
                               "0 is refused by the latter; give every pool of this Router the "
                               "same engine.schedulingPolicy");
      }
      if (decode_pools.empty()) {
        fail("NoDecodePool", "namespace " + ns +
                                 " has no DecodePool to route to (spec.decodePools or every "
                                 "DecodePool of the namespace)");
      }
      if (!router.model_path && !decode_pools.empty()) {
        // The tokenizer from where the first decode pool gets its model (a
        // pool that does not parse keeps the router without a model
        // directory).
        for (const auto& [pool_name, pool] : routed) {
          if (pool.kind != spec::PoolKind::kDecode || pool_name != decode_pools.front()) continue;
          router.pools_model_source = pool.model_source;
          router.pools_image = pool.image;
          break;
        }
      }
      desired_deployment = desiredRouterDeployment(owner, router, prefill_pools, decode_pools,
                                                   options_.defaults, &ignored_template_fields);
      desired_service = desiredRouterService(owner, router);
      desired_budget = desiredRouterDisruptionBudget(owner, router);
    } else {
      const spec::PoolKind pool_kind =
          kind == OwnerKind::kPrefillPool ? spec::PoolKind::kPrefill : spec::PoolKind::kDecode;
      const spec::PoolSpec pool = spec::parsePoolObject(object, pool_kind, source);
      match_labels = poolSelector(name, pool_kind);
      observation.desired_replicas = pool.replicas;
      desired_deployment =
          desiredPoolDeployment(owner, pool, options_.defaults, &ignored_template_fields);
      desired_service = desiredPoolService(owner, pool);
      desired_budget = desiredPoolDisruptionBudget(owner, pool);
      observation.model =
          ModelObservation{pool.served_model_name,
                           pool.model_source ? pool.model_source->source.text : pool.model_path,
                           poolModelInitContainer(pool)};
      if (poolKvTransferIsInsecure(pool)) {
        events_.recordOnce(owner, kWarning, "InsecureKvTransfer",
                           "no kvTransfer.secretRef: agents serve KV blocks to any peer that "
                           "reaches the pod IP (--insecure-kv); set a Secret to require a "
                           "shared secret");
      }
    }
    if (!ignored_template_fields.empty()) {
      std::string fields;
      for (const std::string& field : ignored_template_fields) {
        fields += (fields.empty() ? "" : ", ") + field;
      }
      events_.recordOnce(owner, kWarning, "TemplateFieldIgnored",
                         "spec.template sets fields the controller owns; they keep the "
                         "controller's values: " +
                             fields);
    }
  } catch (const std::exception& e) {
    // tandem::Error from the spec readers; anything else (a JSON type a
    // template fragment carries where none was expected) is the spec's
    // fault too, and must not take the controller and every pool down.
    observation.desired_replicas = specReplicas(object, 1);
    fail("InvalidSpec", e.what());
    events_.recordOnce(owner, kWarning, "InvalidSpec", e.what());
    desired_deployment = nullptr;
  }
  if (match_labels.is_null()) {
    match_labels = kind == OwnerKind::kRouter ? routerSelector(name)
                                              : poolSelector(name, kind == OwnerKind::kPrefillPool
                                                                       ? spec::PoolKind::kPrefill
                                                                       : spec::PoolKind::kDecode);
  }
  observation.selector = selectorString(match_labels);

  if (!desired_deployment.is_null()) {
    // Each child read once. Someone else's object of one of their names:
    // none of them is written while it stands (the Deployment beside a
    // foreign Service, or the Service and budget beside a foreign
    // Deployment, was a half-applied pool that Progressing called Blocked).
    const auto nameOf = [](const json& desired) {
      return desired.at("metadata").at("name").get<std::string>();
    };
    ChildOutcome deployment =
        foreignChild(k8s::resources::kDeployments, owner, nameOf(desired_deployment));
    ChildOutcome service = foreignChild(k8s::resources::kServices, owner, nameOf(desired_service));
    ChildOutcome budget =
        desired_budget.is_null()
            ? ChildOutcome{}
            : foreignChild(k8s::resources::kPodDisruptionBudgets, owner, nameOf(desired_budget));
    const ChildOutcome* conflict = nullptr;
    for (const ChildOutcome* child : {&deployment, &service, &budget}) {
      if (child->state == ChildOutcome::State::kConflict) {
        conflict = child;
        break;
      }
    }
    if (conflict != nullptr) {
      // The other object is not one the controller watches (not labelled
      // as its own): nothing will say when it goes, so look again.
      requeue_after = kNameConflictRecheck;
      fail("NameConflict", conflict->problem);
      events_.recordOnce(owner, kWarning, "NameConflict", conflict->problem);
      // The status still tells how the pool's own Deployment is doing.
      observation.deployment = std::move(deployment.live);
    } else {
      deployment =
          syncChild(k8s::resources::kDeployments, owner, desired_deployment, std::move(deployment));
      service = syncChild(k8s::resources::kServices, owner, desired_service, std::move(service));
      budget = desired_budget.is_null() ? removeChild(k8s::resources::kPodDisruptionBudgets, owner)
                                        : syncChild(k8s::resources::kPodDisruptionBudgets, owner,
                                                    desired_budget, std::move(budget));
      for (const ChildOutcome* child : {&deployment, &service, &budget}) {
        if (child->state == ChildOutcome::State::kFailed) {
          if (!child->problem.empty()) fail("ApplyFailed", child->problem);
          if (!error) error = child->error;
        }
      }
      if (deployment.state == ChildOutcome::State::kInSync)
        observation.deployment = deployment.live;
      observation.spec_applied = deployment.state == ChildOutcome::State::kInSync &&
                                 service.state == ChildOutcome::State::kInSync &&
                                 budget.state == ChildOutcome::State::kInSync;
    }
  } else {
    // The spec cannot be applied; the status still tells how the Deployment
    // of the last good spec is doing.
    auto live = writer_.client().get(k8s::resources::kDeployments, ns, name);
    if (live.isOk() && isControlledBy(*live, owner.uid)) observation.deployment = std::move(*live);
  }
  observation.pods = pods(ns, match_labels);
  if (kind != OwnerKind::kRouter && options_.planner_conditions) {
    observation.planner_conditions = options_.planner_conditions(kind, ns, name);
  }

  json previous = object.contains("status") ? object["status"] : json(nullptr);
  json status = computeWorkloadStatus(previous, observation, options_.now());
  if (kind == OwnerKind::kRouter && observation.spec_applied) {
    status["prefillPools"] = prefill_pools;
    status["decodePools"] = decode_pools;
  }
  // Only the leader exports pool series: a reconcile that was running when
  // this replica lost the Lease must not put back what setLeading cleared.
  if (kind != OwnerKind::kRouter && options_.pool_replicas && writer_.mayWrite()) {
    options_.pool_replicas->set(pool_key, poolReplicas(observation, status));
  }
  auto written = writeStatus(kind, object, status);
  if (!written.isOk() && !error) error = written.error();
  if (error) return *error;
  return k8s::Done{requeue_after};
}

}  // namespace tandem::controller
