#include "operator/spec/router_spec.h"

#include <string>
#include <vector>

namespace tandem::spec {
namespace {

std::vector<AgentAddress> readAgentList(const YAML::Node& node, const std::string& path,
                                        const DocumentContext& context) {
  requireList(node, path, context);
  std::vector<AgentAddress> agents;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    requireMapping(node[i], item_path, context);
    MapReader item(node[i], item_path, context);
    AgentAddress agent;
    agent.name = readString(item.require("name"), item.pathOf("name"), context);
    agent.host = readString(item.require("host"), item.pathOf("host"), context);
    agent.port =
        static_cast<int>(readInteger(item.require("port"), item.pathOf("port"), context, 1, 65535));
    item.rejectUnknown();
    agents.push_back(std::move(agent));
  }
  return agents;
}

// The router flags the controller writes from the Router's other fields or
// owns: given again in spec.extraArgs they would win (a flag's last value
// does) and break what the controller built around them.
const OwnedFlag kControllerOwnedRouterFlags[] = {
    {"--host", "the router listens on 0.0.0.0:8000, where the Service and the probes point"},
    {"--port", "the router listens on 0.0.0.0:8000, where the Service and the probes point"},
    {"--shutdown-timeout",
     "set spec.shutdownTimeoutSeconds (the pod's termination grace period follows it)"},
    {"--drain-delay", "the controller sets it and the pod's termination grace period with it"},
    {"--discover", "the controller runs the router with discovery"},
    {"--namespace", "the router routes to pools of its own namespace"},
    {"--kubeconfig", "the router uses its pod's service account"},
    {"--prefill-pool", "list the pools in spec.prefillPools"},
    {"--decode-pool", "list the pools in spec.decodePools"},
    {"--all-pools", "leave spec.prefillPools and spec.decodePools unset for every pool"},
    {"--model-dir", "set spec.modelPath"},
    {"--config", "the Router's own fields are its configuration"},
    {"--prefill", "the router finds its agents by discovery"},
    {"--decode", "the router finds its agents by discovery"},
    {"--api-key", "set spec.apiKeySecretRef (a key on the command line shows in ps)"},
    {"--agent-api-key", "set spec.apiKeySecretRef, which the router also sends to the agents"},
};

}  // namespace

RouterSpec readRouter(const std::optional<YAML::Node>& node, const DocumentContext& context) {
  RouterSpec router;
  router.name = context.name;
  if (!node) return router;
  requireMapping(*node, "spec", context);
  MapReader spec(*node, "spec", context);
  if (auto value = spec.get("host")) router.host = readString(*value, "spec.host", context);
  if (auto value = spec.get("port")) {
    router.port = static_cast<int>(readInteger(*value, "spec.port", context, 0, 65535));
  }
  if (auto value = spec.get("policy")) {
    router.policy = readEnum(*value, "spec.policy", context,
                             {"kv", "round_robin", "random", "dynamo", "llm_d", "sglang"});
  }
  if (auto value = spec.get("disaggThresholdTokens")) {
    router.disagg_threshold_tokens = readInteger(*value, "spec.disaggThresholdTokens", context, 0);
  }
  if (auto value = spec.get("pullBack"))
    router.pull_back = readBool(*value, "spec.pullBack", context);
  if (auto value = spec.get("maxQueuedRequests")) {
    router.max_queued_requests = readInteger(*value, "spec.maxQueuedRequests", context, 0);
  }
  if (auto value = spec.get("maxInflightRequests")) {
    router.max_inflight_requests = readInteger(*value, "spec.maxInflightRequests", context, 1);
  }
  if (auto value = spec.get("upstreamTimeoutSeconds")) {
    router.upstream_timeout_s =
        readNumber(*value, "spec.upstreamTimeoutSeconds", context, 0, true, kMaxSeconds);
  }
  if (auto value = spec.get("maxMigrations")) {
    router.max_migrations = readInteger(*value, "spec.maxMigrations", context, 0, 100);
  }
  if (auto value = spec.get("shutdownTimeoutSeconds")) {
    router.shutdown_timeout_s =
        readNumber(*value, "spec.shutdownTimeoutSeconds", context, 0, false, 3600);
  }
  if (auto value = spec.get("migrationTimeoutSeconds")) {
    router.migration_timeout_s =
        readNumber(*value, "spec.migrationTimeoutSeconds", context, 0, true, kMaxSeconds);
  }
  if (auto value = spec.get("threads")) {
    router.threads = static_cast<int>(readInteger(*value, "spec.threads", context, 1, 256));
  }
  if (auto value = spec.get("modelPath")) {
    router.model_path = readString(*value, "spec.modelPath", context);
  }
  if (auto value = spec.get("pollIntervalSeconds")) {
    router.poll_interval_s =
        readNumber(*value, "spec.pollIntervalSeconds", context, 0, true, kMaxSeconds);
  }
  if (auto value = spec.get("profile")) {
    router.profile = readString(*value, "spec.profile", context);
  }
  if (auto value = spec.get("itlTargetMs")) {
    router.itl_target_ms =
        readNumber(*value, "spec.itlTargetMs", context, 0, true, kMaxSeconds * 1000);
  }
  if (auto value = spec.get("seed")) router.seed = readInteger(*value, "spec.seed", context, 0);
  if (auto value = spec.get("debugDecisions")) {
    router.debug_decisions = readInteger(*value, "spec.debugDecisions", context, 0, 100000);
  }
  if (auto value = spec.get("prefill"))
    router.prefill = readAgentList(*value, "spec.prefill", context);
  if (auto value = spec.get("decode"))
    router.decode = readAgentList(*value, "spec.decode", context);
  if (auto value = spec.get("prefillPools")) {
    router.prefill_pools = readStringList(*value, "spec.prefillPools", context);
  }
  if (auto value = spec.get("decodePools")) {
    router.decode_pools = readStringList(*value, "spec.decodePools", context);
  }
  // Kubernetes only.
  if (auto value = spec.get("replicas")) {
    router.replicas = readInteger(*value, "spec.replicas", context, 0, 100);
  }
  if (auto value = spec.get("image")) router.image = readString(*value, "spec.image", context);
  if (auto value = spec.get("resources")) {
    checkResources(*value, "spec.resources", context);
    router.resources = toJson(*value, context, "spec.resources");
  }
  if (auto value = spec.get("template")) {
    router.pod_template = readPodTemplate(*value, "spec.template", context);
  }
  if (auto value = spec.get("modelVolume")) {
    router.model_volume = readModelVolume(*value, "spec.modelVolume", context);
    if (!router.model_path) {
      fail(context, "spec.modelVolume", "is mounted at spec.modelPath, which is not set", *value);
    }
  }
  if (auto value = spec.get("service")) {
    requireMapping(*value, "spec.service", context);
    MapReader service(*value, "spec.service", context);
    if (auto type = service.get("type")) {
      router.service_type =
          readEnum(*type, "spec.service.type", context, {"ClusterIP", "NodePort", "LoadBalancer"});
    }
    if (auto port = service.get("port")) {
      router.service_port =
          static_cast<int>(readInteger(*port, "spec.service.port", context, 1, 65535));
    }
    service.rejectUnknown();
  }
  if (auto value = spec.get("kvSecretRef")) {
    requireMapping(*value, "spec.kvSecretRef", context);
    MapReader secret(*value, "spec.kvSecretRef", context);
    SecretKeyRef ref;
    ref.name = readString(secret.require("name"), secret.pathOf("name"), context);
    ref.key = readString(secret.require("key"), secret.pathOf("key"), context);
    secret.rejectUnknown();
    router.kv_secret_ref = std::move(ref);
  }
  if (auto value = spec.get("apiKeySecretRef")) {
    router.api_key_secret_ref =
        readSecretKeyRef(*value, "spec.apiKeySecretRef", context, kApiKeySecretKey);
  }
  if (auto value = spec.get("extraArgs")) {
    router.extra_args = readStringList(*value, "spec.extraArgs", context, /*allow_empty=*/true);
    refuseOwnedFlags(router.extra_args, kControllerOwnedRouterFlags, *value, context);
  }
  if (auto value = spec.get("disruptionBudget")) {
    router.disruption_budget = readDisruptionBudget(*value, context);
  }
  spec.rejectUnknown();
  return router;
}

}  // namespace tandem::spec
