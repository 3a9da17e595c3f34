// One reconcile of a PrefillPool, DecodePool or Router: read it, compute the
// objects it should own (desired_objects.h), make the live ones match, then
// compute its status (workload_status.h) and write it if it changed.
//
// Level-triggered and idempotent: a child that is absent is created
// (server-side apply; Event Created), one that already holds every desired
// field (object_diff.h) is left alone, any other is applied again with force
// (Event Updated) — so a child deleted or edited by someone else is put
// back. A child of the same name that this owner does not control is never
// touched: the owner is Degraded with reason NameConflict (and a Warning
// Event). A reconcile of an unchanged world writes nothing.
//
// Every PrefillPool/DecodePool reconcile records the pool's replica counts
// (desired, and its Deployment's updated, ready and available) in
// options.pool_replicas; a pool found deleted is removed from it.
//
// Thread-safe for different keys; the work queue never hands one key to two
// workers at once.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "operator/controller/api_writer.h"
#include "operator/controller/controller_metrics.h"
#include "operator/controller/desired_objects.h"
#include "operator/controller/event_recorder.h"
#include "operator/k8s/api_client.h"

namespace tandem::controller {

enum class OwnerKind { kPrefillPool, kDecodePool, kRouter };

const k8s::ResourceType& resourceOf(OwnerKind kind);
// "PrefillPool", "DecodePool" or "Router".
const char* ownerKindName(OwnerKind kind);
std::optional<OwnerKind> ownerKindFromName(const std::string& kind);

// Where a reconcile reads pods and pool names: the controller's informer
// caches; unset members read the API (list calls).
struct ClusterReader {
  std::function<std::vector<nlohmann::json>(const std::string& ns,
                                            const nlohmann::json& match_labels)>
      pods;
  // Names of the pools of `kind` (kPrefillPool or kDecodePool) in `ns`, sorted.
  std::function<std::vector<std::string>(const std::string& ns, OwnerKind kind)> pool_names;
};

struct ReconcilerOptions {
  WorkloadDefaults defaults;
  std::function<std::string()> now = nowRfc3339;
  // Where pool replica counts go (tandem_operator_pool_replicas); none when null.
  PoolReplicaTable* pool_replicas = nullptr;
  // The SLA planner's ScalingConflict / ScalingLimited conditions of a pool
  // (pool_autoscaler.h), put in its status; none when null.
  std::function<std::vector<nlohmann::json>(OwnerKind, const std::string& ns,
                                            const std::string& name)>
      planner_conditions;
};

class Reconciler {
 public:
  Reconciler(ApiWriter& writer, EventRecorder& events, ReconcilerOptions options,
             ClusterReader reader = {});

  // Reconciles `ns/name` of `kind`. An error (an API call that failed, a
  // write refused because leadership was lost) is returned after the status
  // has been brought as far up to date as possible; the caller retries the
  // key with backoff. An owner that no longer exists is done (Kubernetes
  // deletes its children through their ownerReferences).
  k8s::Result<k8s::Done> reconcile(OwnerKind kind, const std::string& ns, const std::string& name);

 private:
  struct ChildOutcome;
  // Writes `desired` where it differs from the child as `read`
  // (foreignChild's outcome for its name) found it.
  ChildOutcome syncChild(const k8s::ResourceType& type, const Owner& owner,
                         const nlohmann::json& desired, ChildOutcome read);
  ChildOutcome removeChild(const k8s::ResourceType& type, const Owner& owner);
  // kConflict when an object of `type` named `name` exists and another
  // owns it; kFailed when it cannot be read; else kInSync, with `live` the
  // owner's object when there is one. Writes nothing.
  ChildOutcome foreignChild(const k8s::ResourceType& type, const Owner& owner,
                            const std::string& name);
  std::vector<nlohmann::json> pods(const std::string& ns, const nlohmann::json& match_labels);
  std::vector<std::string> poolNames(const std::string& ns, OwnerKind kind);
  static std::vector<std::string> sharedNames(const std::vector<std::string>& a,
                                              const std::vector<std::string>& b);
  // Whether the pool's status says Degraded, NameConflict (its children's
  // names are taken).
  bool inNameConflict(OwnerKind kind, const std::string& ns, const std::string& name);
  k8s::Result<k8s::Done> writeStatus(OwnerKind kind, const nlohmann::json& object,
                                     const nlohmann::json& status);

  ApiWriter& writer_;
  EventRecorder& events_;
  ReconcilerOptions options_;
  ClusterReader reader_;
};

}  // namespace tandem::controller
