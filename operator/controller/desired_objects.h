// The objects the controller wants to exist, as pure functions of a pool's
// or router's object and its parsed spec: a Deployment and a headless
// Service per PrefillPool/DecodePool, a Deployment and a Service per Router.
// The agent's command line is the one local mode runs (operator/spec/agent_command.h),
// so a pool runs the same agents on one machine and in a cluster.
//
// Every object carries the labels of object_meta.h, an ownerReference to its
// owner and the desired-hash annotation; nothing here talks to the API.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "operator/controller/object_meta.h"
#include "operator/spec/cluster_spec.h"

namespace tandem::controller {

// The port agents and the router listen on inside their pods.
inline constexpr int kContainerPort = 8000;
// A router pod's SIGTERM: seconds it still serves while not ready, then the
// seconds in-flight requests get by default (Router spec.shutdownTimeoutSeconds).
inline constexpr double kRouterDrainDelaySeconds = 5;
inline constexpr double kRouterShutdownTimeoutSeconds = 120;

struct WorkloadDefaults {
  std::string agent_image;                               // --default-agent-image
  std::string operator_image;                            // --default-operator-image
  std::string router_service_account = "tandem-router";  // --router-service-account
};

// The labels of a pool's pods and objects, and the subset its selector uses
// (tandem.dev/pool and tandem.dev/role).
nlohmann::json poolLabels(const std::string& pool, spec::PoolKind kind);
nlohmann::json poolSelector(const std::string& pool, spec::PoolKind kind);
nlohmann::json routerLabels(const std::string& router);
nlohmann::json routerSelector(const std::string& router);

// True when the pool's agents hand KV blocks out without a shared secret: no
// kvTransfer.secretRef and no extraConfig.secret. They then listen on the pod
// IP only, with --insecure-kv, and the controller warns (InsecureKvTransfer).
bool poolKvTransferIsInsecure(const spec::PoolSpec& pool);

// Where a pool's pods find its model (docs/kubernetes.md, "Model sources"):
// the agent's --model inside its container (spec.model.path; an hf://
// source's directory under /model-cache, the emptyDir or claim its
// model-fetch init container fills; /model for a pvc:// or oci:// source),
// and the init container that fetches or copies it ("model-fetch",
// "model-copy"; "" when the model is only mounted).
inline constexpr const char* kModelCacheMount = "/model-cache";
inline constexpr const char* kModelMount = "/model";
std::string poolModelPath(const spec::PoolSpec& pool);
std::string poolModelInitContainer(const spec::PoolSpec& pool);
std::string modelPathInPod(const spec::ModelSourceSpec& model);
std::string modelInitContainer(const spec::ModelSourceSpec& model);

// The agent container's arguments (after the command "tandem-agent"): local
// mode's mapping with --host 0.0.0.0 (secretRef) or $(POD_IP) plus
// --insecure-kv, and --port 8000.
std::vector<std::string> agentContainerArguments(const spec::PoolSpec& pool);

// The router container's arguments (after the command "tandem-operator"):
// the pools named, or --all-pools when the Router lists none (its router
// then finds every pool of the namespace by label, and pools added later).
std::vector<std::string> routerContainerArguments(const spec::RouterSpec& router,
                                                  const std::string& ns,
                                                  const std::vector<std::string>& prefill_pools,
                                                  const std::vector<std::string>& decode_pools);

// Throws tandem::Error when no image is known (neither spec.image nor the
// controller's default). The spec's template is merged into the pod template
// (pod_template.h); the fields it sets that the controller owns are left out
// and, when `ignored` is given, listed there.
nlohmann::json desiredPoolDeployment(const Owner& owner, const spec::PoolSpec& pool,
                                     const WorkloadDefaults& defaults,
                                     std::vector<std::string>* ignored = nullptr);
nlohmann::json desiredPoolService(const Owner& owner, const spec::PoolSpec& pool);
// The pool's PodDisruptionBudget (policy/v1, named as the pool, selecting its
// agents; maxUnavailable 1 unless spec.disruptionBudget says otherwise), or
// null when spec.disruptionBudget.enabled is false. Unhealthy agents may
// always be evicted (unhealthyPodEvictionPolicy AlwaysAllow), so a pool that
// never became ready cannot block a node drain.
nlohmann::json desiredPoolDisruptionBudget(const Owner& owner, const spec::PoolSpec& pool);
nlohmann::json desiredRouterDeployment(const Owner& owner, const spec::RouterSpec& router,
                                       const std::vector<std::string>& prefill_pools,
                                       const std::vector<std::string>& decode_pools,
                                       const WorkloadDefaults& defaults,
                                       std::vector<std::string>* ignored = nullptr);
nlohmann::json desiredRouterService(const Owner& owner, const spec::RouterSpec& router);
// The Router's PodDisruptionBudget, as a pool's (named as the Router,
// selecting its pods): a node drain takes one router pod at a time while the
// others serve; null when spec.disruptionBudget.enabled is false.
nlohmann::json desiredRouterDisruptionBudget(const Owner& owner, const spec::RouterSpec& router);

}  // namespace tandem::controller
