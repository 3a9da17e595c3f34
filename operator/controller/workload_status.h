// The status of a PrefillPool, DecodePool or Router, computed from what it
// owns and never ahead of it: replica counts from its Deployment's status,
// and three metav1.Conditions:
//
//   Ready        True iff the Deployment has observed its generation, the
//                owner's spec is applied to it, and updated == ready ==
//                replicas == the desired replicas.
//   Progressing  True while any replica may run an older spec (fewer updated
//                than desired, more replicas than updated, the Deployment
//                controller has not observed its generation yet, or the
//                owner's spec is not applied yet); never with Ready True.
//   Degraded     True when something stops the rollout: the reconcile's own
//                failure (NameConflict, InvalidSpec, ...), a pod waiting in
//                CrashLoopBackOff / ImagePullBackOff / ErrImagePull /
//                CreateContainerConfigError, an unschedulable pod, or the
//                Deployment's ReplicaFailure / ProgressDeadlineExceeded; the
//                message names the pod and what it said. Else False, AsExpected.
//
// A pool also gets status.servedModel, status.modelSource and
//
//   ModelReady   True when nothing is fetched (a path or a claim, an image
//                volume: reason Mounted) or when a pod's fetch/copy init
//                container finished (Fetched); False while one runs
//                (Fetching, naming the pod), before any started (Pending), or
//                when one failed (FetchFailed, with the pod and the init
//                container's last words: `tandem-model fetch` writes its error
//                to the termination log).
//
// and, for a pool the SLA planner scales, its ScalingConflict and
// ScalingLimited conditions as the planner gave them (pool_autoscaler.h).
//
// lastTransitionTime is kept while a condition's status does not change.
// Pure functions; `now` is passed in.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::controller {

// What a pool's model is and how its pods get it.
struct ModelObservation {
  std::string served_name;
  std::string source;          // spec.model.source, or spec.model.path
  std::string init_container;  // the init container that fetches or copies it; "" when none
};

struct WorkloadObservation {
  int64_t generation = 0;        // the owner's metadata.generation
  int64_t desired_replicas = 0;  // its spec.replicas
  // True when this reconcile wrote (or found) a Deployment reflecting
  // `generation`; then status.observedGeneration becomes `generation`.
  bool spec_applied = false;
  std::optional<nlohmann::json> deployment;  // the owned Deployment, if any
  std::vector<nlohmann::json> pods;          // the owner's pods
  std::string selector;                      // status.selector
  // A failure of the reconcile itself (reason, message), reported as Degraded.
  std::optional<std::pair<std::string, std::string>> failure;
  // Conditions of the SLA planner, appended as they are (their
  // lastTransitionTime kept as the others' is).
  std::vector<nlohmann::json> planner_conditions;
  // Pools: the model (status.servedModel, modelSource, ModelReady); unset
  // for a Router and for a spec that cannot be parsed.
  std::optional<ModelObservation> model;
};

// The new status; `previous` is the owner's current status (or null), whose
// observedGeneration is kept when the spec is not applied, and whose
// conditions' lastTransitionTime are kept when their status is unchanged.
// Other fields of `previous` (e.g. a Router's pool lists) are kept.
nlohmann::json computeWorkloadStatus(const nlohmann::json& previous,
                                     const WorkloadObservation& observation,
                                     const std::string& now);

// The condition of `type` in status.conditions, or null.
nlohmann::json findCondition(const nlohmann::json& status, const std::string& type);

}  // namespace tandem::controller
