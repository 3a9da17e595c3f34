#include "operator/controller/desired_objects.h"

#include <cmath>
#include <sstream>

#include "common/check.h"
#include "common/status.h"
#include "operator/spec/agent_command.h"
#include "operator/spec/pod_template.h"

namespace tandem::controller {
namespace {

using nlohmann::json;
using spec::mergePodTemplate;
using spec::ModelVolumeSpec;
using spec::PoolKind;
using spec::PoolSpec;
using spec::RouterSpec;
using spec::TemplateMergeResult;

// Kubernetes expands "$(VAR)" in a container's args from its environment
// ("$$" stands for "$"): arguments made from the spec's values (a model
// path, a served name, a JSON config) are escaped so that they reach the
// program as written, as local mode passes them. `first_extra` on are the
// spec's extraArgs, passed as written: there "$(POD_IP)" means what it
// means in any container's args.
void escapeExpansions(std::vector<std::string>& args, size_t first_extra) {
  for (size_t i = 0; i < first_extra && i < args.size(); ++i) {
    std::string escaped;
    for (char c : args[i]) {
      if (c == '$') escaped.push_back('$');
      escaped.push_back(c);
    }
    args[i] = std::move(escaped);
  }
}

constexpr const char* kModelVolumeName = "model";
constexpr const char* kModelCacheVolumeName = "model-cache";
// The user and group the agent, router and init containers run as (the
// agent images' user), which must be able to write a fetch's cache claim.
constexpr int64_t kAgentGroupId = 65532;

std::string numberText(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

json objectMeta(const Owner& owner, const std::string& name, const json& labels) {
  return {{"name", name},
          {"namespace", owner.ns},
          {"labels", labels},
          {"ownerReferences", ownerReferences(owner)}};
}

json httpProbe(const char* path, int period_seconds, int failure_threshold) {
  return {{"httpGet", {{"path", path}, {"port", "http"}}},
          {"periodSeconds", period_seconds},
          {"failureThreshold", failure_threshold}};
}

// The model volume, and its mount at `mount_path` (read-only), when one is set.
void addModelVolume(const std::optional<ModelVolumeSpec>& volume, const std::string& mount_path,
                    json& pod_spec, json& container) {
  if (!volume) return;
  json source;
  if (!volume->claim_name.empty()) {
    source = {{"name", kModelVolumeName},
              {"persistentVolumeClaim", {{"claimName", volume->claim_name}}}};
    // The API server drops a false readOnly: one desired would never match.
    if (volume->claim_read_only) source["persistentVolumeClaim"]["readOnly"] = true;
  } else {
    source = {{"name", kModelVolumeName}, {"hostPath", {{"path", volume->host_path}}}};
  }
  pod_spec["volumes"].push_back(source);
  json mount = {{"name", kModelVolumeName}, {"mountPath", mount_path}, {"readOnly", true}};
  if (!volume->sub_path.empty()) mount["subPath"] = volume->sub_path;
  container["volumeMounts"].push_back(mount);
}

// The volumes, mounts and init container that put a model source's files
// in a pod: the whole model for a pool's agents, or only what a tokenizer
// needs for a router (`tokenizer_only`: its own emptyDir, never a pool's
// cache claim).
void addModelSource(const spec::ModelSourceSpec& model, const std::string& fetch_image,
                    bool tokenizer_only, json& pod_spec, json& container) {
  using model_source::SourceKind;
  const model_source::ModelSource& source = model.source;
  switch (source.kind) {
    case SourceKind::kHuggingFace: {
      json cache = {{"name", kModelCacheVolumeName}};
      if (!model.cache_claim.empty() && !tokenizer_only) {
        cache["persistentVolumeClaim"] = {{"claimName", model.cache_claim}};
        // Claims are mounted root-owned; the group makes them the agents' too.
        // Only when the volume's root is not the group's already: a model
        // cache of hundreds of GB would otherwise be walked and chowned at
        // every pod start.
        pod_spec["securityContext"] = {{"fsGroup", kAgentGroupId},
                                       {"fsGroupChangePolicy", "OnRootMismatch"}};
      } else {
        cache["emptyDir"] = json::object();
        if (!model.cache_size_limit.empty() && !tokenizer_only) {
          cache["emptyDir"]["sizeLimit"] = model.cache_size_limit;
        }
      }
      pod_spec["volumes"].push_back(cache);
      json args = {"fetch", source.text, "--dir", modelPathInPod(model)};
      if (tokenizer_only) args.push_back("--tokenizer-only");
      json env = json::array();
      args.push_back("--token-source");
      if (model.token_secret_ref) {
        const spec::SecretKeyRef& ref = *model.token_secret_ref;
        env.push_back({{"name", "HF_TOKEN"},
                       {"valueFrom", {{"secretKeyRef", {{"name", ref.name}, {"key", ref.key}}}}}});
        args.push_back("the Secret " + ref.name + " (key " + ref.key +
                       ", spec.model.tokenSecretRef)");
      } else {
        args.push_back("spec.model.tokenSecretRef");
      }
      if (!model.endpoint.empty()) {
        env.push_back({{"name", "HF_ENDPOINT"}, {"value", model.endpoint}});
      }
      std::vector<std::string> fetch_args = args.get<std::vector<std::string>>();
      escapeExpansions(fetch_args, fetch_args.size());
      json fetch = {
          {"name", modelInitContainer(model)},
          {"image", fetch_image},
          {"command", json::array({"tandem-model"})},
          {"args", fetch_args},
          {"terminationMessagePolicy", "FallbackToLogsOnError"},
          {"volumeMounts",
           json::array({{{"name", kModelCacheVolumeName}, {"mountPath", kModelCacheMount}}})}};
      // None for a public model: the API server keeps no empty env list.
      if (!env.empty()) fetch["env"] = std::move(env);
      // The download lands on the node's disk (an emptyDir): with a size
      // limit, the scheduler places the pod only where that much ephemeral
      // storage is free.
      if (cache.contains("emptyDir") && cache["emptyDir"].contains("sizeLimit")) {
        fetch["resources"] = {
            {"requests", {{"ephemeral-storage", cache["emptyDir"]["sizeLimit"]}}}};
      }
      pod_spec["initContainers"] = json::array({std::move(fetch)});
      container["volumeMounts"].push_back(
          {{"name", kModelCacheVolumeName}, {"mountPath", kModelCacheMount}, {"readOnly", true}});
      return;
    }
    case SourceKind::kClaim: {
      pod_spec["volumes"].push_back(
          {{"name", kModelVolumeName},
           {"persistentVolumeClaim", {{"claimName", source.claim}, {"readOnly", true}}}});
      json mount = {{"name", kModelVolumeName}, {"mountPath", kModelMount}, {"readOnly", true}};
      if (!source.path.empty()) mount["subPath"] = source.path;
      container["volumeMounts"].push_back(mount);
      return;
    }
    case SourceKind::kImage: {
      json mount = {{"name", kModelVolumeName}, {"mountPath", kModelMount}, {"readOnly", true}};
      if (model.image_mount == "ImageVolume") {
        pod_spec["volumes"].push_back(
            {{"name", kModelVolumeName},
             {"image", {{"reference", source.image}, {"pullPolicy", "IfNotPresent"}}}});
        mount["subPath"] = "models";
      } else {
        // The image's /models into an emptyDir; a router's copy skips the weights.
        const std::string copy = tokenizer_only
                                     ? std::string(
                                           "for f in /models/*.json /models/*.jinja; do if [ -e "
                                           "\"$f\" ]; then cp \"$f\" ") +
                                           kModelMount + "/ || exit 1; fi; done"
                                     : std::string("cp -R /models/. ") + kModelMount;
        pod_spec["volumes"].push_back({{"name", kModelVolumeName}, {"emptyDir", json::object()}});
        pod_spec["initContainers"] = json::array(
            {{{"name", modelInitContainer(model)},
              {"image", source.image},
              {"command", json::array({"sh", "-c", copy})},
              {"terminationMessagePolicy", "FallbackToLogsOnError"},
              {"volumeMounts",
               json::array({{{"name", kModelVolumeName}, {"mountPath", kModelMount}}})}}});
      }
      container["volumeMounts"].push_back(mount);
      return;
    }
    case SourceKind::kPath:
      return;
  }
}

// What every generated pod runs with unless spec.template says otherwise
// (the fragment wins on each leaf): the Pod Security Standards' "restricted"
// profile, so a namespace enforcing it admits the pods. The agents' images
// run as 65532 already; it is set here so that a pod's user does not depend
// on which image a pool names (and matches the model cache's fsGroup).
void addRestrictedSecurityContext(json& pod_spec) {
  json& pod = pod_spec["securityContext"];
  if (!pod.is_object()) pod = json::object();
  pod["runAsNonRoot"] = true;
  pod["runAsUser"] = kAgentGroupId;
  pod["runAsGroup"] = kAgentGroupId;
  pod["seccompProfile"] = {{"type", "RuntimeDefault"}};
  for (const char* list : {"initContainers", "containers"}) {
    if (!pod_spec.contains(list)) continue;
    for (json& container : pod_spec[list]) {
      container["securityContext"] = {{"allowPrivilegeEscalation", false},
                                      {"capabilities", {{"drop", json::array({"ALL"})}}}};
    }
  }
}

// A container the fragment made privileged, or gave CAP_SYS_ADMIN, escalates
// privileges by definition: the API server refuses such a container with
// allowPrivilegeEscalation false ("cannot set `allowPrivilegeEscalation` to
// false and `privileged` to true"), so the default gives way unless the
// fragment itself set it.
void yieldEscalationDefault(json& pod_spec, const json& fragment) {
  const json fragment_spec =
      fragment.is_object() && fragment.contains("spec") ? fragment["spec"] : json::object();
  // What the template wrote is read as the API server would decode it: a
  // value of another type is the server's to refuse, never a reason to throw.
  auto listOf = [](const json& object, const char* key) {
    const auto it = object.is_object() ? object.find(key) : object.end();
    return object.is_object() && it != object.end() && it->is_array() ? *it : json::array();
  };
  for (const char* list : {"initContainers", "containers"}) {
    if (!pod_spec.contains(list) || !pod_spec[list].is_array()) continue;
    for (json& container : pod_spec[list]) {
      if (!container.is_object() || !container.contains("securityContext")) continue;
      json& context = container["securityContext"];
      if (!context.is_object()) continue;
      bool escalates = context.contains("privileged") && context["privileged"] == true;
      if (context.contains("capabilities")) {
        for (const json& cap : listOf(context["capabilities"], "add")) {
          escalates = escalates || cap == "SYS_ADMIN" || cap == "CAP_SYS_ADMIN";
        }
      }
      if (!escalates) continue;
      bool written = false;  // by the fragment, for this container (null: not written)
      for (const json& given : listOf(fragment_spec, list)) {
        if (!given.is_object() || !given.contains("name") || given["name"] != container["name"] ||
            !given.contains("securityContext") || !given["securityContext"].is_object()) {
          continue;
        }
        const json& given_context = given["securityContext"];
        written = written || (given_context.contains("allowPrivilegeEscalation") &&
                              !given_context["allowPrivilegeEscalation"].is_null());
      }
      if (!written) context.erase("allowPrivilegeEscalation");
    }
  }
}

// The user's spec.template, merged into the generated pod template.
struct TemplateOverlay {
  const json& fragment;
  const char* main_container;
  std::vector<std::string> owned_pod_fields;
  std::vector<std::string>* ignored;  // where the left-out fields go (may be null)
};

json deployment(const Owner& owner, const std::string& name, const json& labels,
                const json& selector, int64_t replicas, json pod_spec,
                const TemplateOverlay& overlay, const spec::RolloutSpec& rollout = {}) {
  addRestrictedSecurityContext(pod_spec);
  json object = {
      {"apiVersion", "apps/v1"},
      {"kind", "Deployment"},
      {"metadata", objectMeta(owner, name, labels)},
      {"spec",
       {{"replicas", replicas},
        {"selector", {{"matchLabels", selector}}},
        // A replica may take the startup probe's window to load its model,
        // after its image pull and model fetch (ten minutes more): only past
        // that is the rollout reported stuck (ProgressDeadlineExceeded).
        {"progressDeadlineSeconds", rollout.startup_timeout_s + 600},
        // By default a new replica is ready before an old one goes: capacity
        // never drops (a pool's spec.rollout may say otherwise).
        {"strategy",
         {{"type", "RollingUpdate"},
          {"rollingUpdate",
           {{"maxUnavailable", rollout.max_unavailable}, {"maxSurge", rollout.max_surge}}}}},
        {"template", {{"metadata", {{"labels", labels}}}, {"spec", std::move(pod_spec)}}}}}};
  TemplateMergeResult merged = mergePodTemplate(object["spec"]["template"], overlay.fragment,
                                                overlay.main_container, overlay.owned_pod_fields);
  object["spec"]["template"] = std::move(merged.pod_template);
  yieldEscalationDefault(object["spec"]["template"]["spec"], overlay.fragment);
  if (overlay.ignored != nullptr) *overlay.ignored = std::move(merged.ignored);
  stampDesiredHash(object);
  return object;
}

std::string imageOf(const std::string& spec_image, const std::string& default_image,
                    const Owner& owner, const char* flag) {
  if (!spec_image.empty()) return spec_image;
  if (!default_image.empty()) return default_image;
  throw Error(owner.kind + " " + owner.ns + "/" + owner.name +
              ": spec.image is not set and the controller has no " + flag + ": set one of them");
}

}  // namespace

json poolLabels(const std::string& pool, PoolKind kind) {
  const char* role = spec::poolRole(kind);
  return {{"app.kubernetes.io/name", "tandem-agent"},
          {"app.kubernetes.io/instance", pool},
          {"app.kubernetes.io/component", role},
          {kManagedByLabel, kManagedBy},
          {kPoolLabel, pool},
          {kRoleLabel, role}};
}

json poolSelector(const std::string& pool, PoolKind kind) {
  return {{kPoolLabel, pool}, {kRoleLabel, spec::poolRole(kind)}};
}

json routerLabels(const std::string& router) {
  return {{"app.kubernetes.io/name", "tandem-router"},
          {"app.kubernetes.io/instance", router},
          {"app.kubernetes.io/component", "router"},
          {kManagedByLabel, kManagedBy},
          {kRouterLabel, router}};
}

json routerSelector(const std::string& router) { return {{kRouterLabel, router}}; }

bool poolKvTransferIsInsecure(const PoolSpec& pool) {
  const spec::KvTransferSpec& transfer = pool.kv_transfer;
  return !transfer.secret_ref && !transfer.extra_config.contains("secret");
}

std::string modelPathInPod(const spec::ModelSourceSpec& model) {
  switch (model.source.kind) {
    case model_source::SourceKind::kHuggingFace:
      return model_source::hubCacheDirectory(kModelCacheMount, model.source);
    case model_source::SourceKind::kPath:
      return model.source.path;
    default:
      return kModelMount;
  }
}

std::string modelInitContainer(const spec::ModelSourceSpec& model) {
  switch (model.source.kind) {
    case model_source::SourceKind::kHuggingFace:
      return "model-fetch";
    case model_source::SourceKind::kImage:
      return model.image_mount == "Copy" ? "model-copy" : "";
    default:
      return "";
  }
}

std::string poolModelPath(const PoolSpec& pool) {
  return pool.model_source ? modelPathInPod(*pool.model_source) : pool.model_path;
}

std::string poolModelInitContainer(const PoolSpec& pool) {
  return pool.model_source ? modelInitContainer(*pool.model_source) : "";
}

std::vector<std::string> agentContainerArguments(const PoolSpec& pool) {
  // With a shared secret the agent may listen everywhere; without one it
  // listens on the pod's own address only (and must be told that this is
  // deliberate), so no other interface of the pod exposes its KV blocks.
  const bool insecure = poolKvTransferIsInsecure(pool);
  const std::string host = pool.kv_transfer.secret_ref ? "0.0.0.0" : "$(POD_IP)";
  PoolSpec in_pod = pool;
  in_pod.model_path = poolModelPath(pool);
  std::vector<std::string> argv =
      spec::agentArguments(in_pod, "tandem-agent", host, kContainerPort, insecure);
  argv.erase(argv.begin());
  // The value after --host is the one expansion meant ("$(POD_IP)").
  const size_t first_extra = argv.size() - pool.extra_args.size();
  const auto host_flag = std::find(argv.begin(), argv.begin() + first_extra, "--host");
  TANDEM_CHECK(host_flag + 1 < argv.begin() + first_extra, "agent arguments without --host");
  const size_t host_at = static_cast<size_t>(host_flag + 1 - argv.begin());
  escapeExpansions(argv, first_extra);
  argv[host_at] = host;
  return argv;
}

std::vector<std::string> routerContainerArguments(const RouterSpec& router, const std::string& ns,
                                                  const std::vector<std::string>& prefill_pools,
                                                  const std::vector<std::string>& decode_pools) {
  std::vector<std::string> args = {"router", "--discover", "--namespace", ns};
  if (!router.prefill_pools && !router.decode_pools) {
    // Every pool of the namespace, found by label at run time: a pool added
    // or deleted changes no argument, so the routers are not rolled.
    args.push_back("--all-pools");
  } else {
    for (const std::string& pool : prefill_pools) {
      args.insert(args.end(), {"--prefill-pool", pool});
    }
    for (const std::string& pool : decode_pools) args.insert(args.end(), {"--decode-pool", pool});
  }
  args.insert(args.end(), {"--host", "0.0.0.0", "--port", std::to_string(kContainerPort)});
  auto add = [&](const char* flag, const std::string& value) {
    args.push_back(flag);
    args.push_back(value);
  };
  if (router.policy) add("--policy", *router.policy);
  if (router.disagg_threshold_tokens) {
    add("--disagg-threshold-tokens", std::to_string(*router.disagg_threshold_tokens));
  }
  if (router.pull_back) add("--pull-back", *router.pull_back ? "true" : "false");
  if (router.max_queued_requests) {
    add("--max-queued-requests", std::to_string(*router.max_queued_requests));
  }
  if (router.max_inflight_requests) {
    add("--max-inflight-requests", std::to_string(*router.max_inflight_requests));
  }
  if (router.upstream_timeout_s) add("--upstream-timeout", numberText(*router.upstream_timeout_s));
  if (router.max_migrations) add("--max-migrations", std::to_string(*router.max_migrations));
  if (router.migration_timeout_s) {
    add("--migration-timeout", numberText(*router.migration_timeout_s));
  }
  if (router.threads) add("--threads", std::to_string(*router.threads));
  if (router.model_path) add("--model-dir", *router.model_path);
  if (router.poll_interval_s) add("--poll-interval", numberText(*router.poll_interval_s));
  if (router.profile) add("--profile", *router.profile);
  if (router.itl_target_ms) add("--itl-target-ms", numberText(*router.itl_target_ms));
  if (router.seed) add("--seed", std::to_string(*router.seed));
  if (router.debug_decisions) add("--debug-decisions", std::to_string(*router.debug_decisions));
  // On SIGTERM (a rollout, a scale-down) the router first stops being ready
  // while still serving, so the Service stops sending before the listener
  // closes, then gives in-flight streams the shutdown timeout.
  add("--drain-delay", numberText(kRouterDrainDelaySeconds));
  add("--shutdown-timeout",
      numberText(router.shutdown_timeout_s.value_or(kRouterShutdownTimeoutSeconds)));
  escapeExpansions(args, args.size());
  args.insert(args.end(), router.extra_args.begin(), router.extra_args.end());
  return args;
}

namespace {

// TANDEM_API_KEY from a Secret key: clients must send it (the agent's and
// the router's --api-key default).
json apiKeyEnv(const spec::SecretKeyRef& ref) {
  return {{"name", "TANDEM_API_KEY"},
          {"valueFrom", {{"secretKeyRef", {{"name", ref.name}, {"key", ref.key}}}}}};
}

}  // namespace

json desiredPoolDeployment(const Owner& owner, const PoolSpec& pool,
                           const WorkloadDefaults& defaults, std::vector<std::string>* ignored) {
  json env = json::array();
  // The agent advertises its pod IP to peers for KV transfer.
  env.push_back(
      {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}});
  if (pool.kv_transfer.secret_ref) {
    const json key_ref = {{"name", pool.kv_transfer.secret_ref->name},
                          {"key", pool.kv_transfer.secret_ref->key}};
    env.push_back({{"name", "TANDEM_KV_SECRET"}, {"valueFrom", {{"secretKeyRef", key_ref}}}});
  }
  if (pool.api_key_secret_ref) env.push_back(apiKeyEnv(*pool.api_key_secret_ref));
  // An inline kvTransfer.extraConfig.secret arrives as TANDEM_KV_SECRET, not
  // in the args (kvTransfer.secretRef keeps it out of the Deployment too).
  for (const auto& [name, value] :
       pool.kv_transfer.secret_ref ? pool.env : spec::agentEnvironment(pool)) {
    env.push_back({{"name", name}, {"value", value}});
  }

  const std::string image =
      imageOf(pool.image, defaults.agent_image, owner, "--default-agent-image");
  json container = {
      {"name", "agent"},
      {"image", image},
      {"command", json::array({"tandem-agent"})},
      {"args", agentContainerArguments(pool)},
      {"env", env},
      {"ports",
       json::array({{{"name", "http"}, {"containerPort", kContainerPort}, {"protocol", "TCP"}}})},
      {"readinessProbe", httpProbe("/health", 5, 3)},
      {"livenessProbe", httpProbe("/health", 10, 3)},
      // Loading a model takes a while: liveness counts only after the
      // startup timeout (default ten minutes), probed every 10 s.
      {"startupProbe",
       httpProbe("/health", 10, static_cast<int>((pool.rollout.startup_timeout_s + 9) / 10))},
      // A crash's cause (the log's end) reaches the pool's Degraded condition.
      {"terminationMessagePolicy", "FallbackToLogsOnError"},
      {"volumeMounts", json::array({{{"name", "dshm"}, {"mountPath", "/dev/shm"}}})}};
  if (!pool.resources.empty()) container["resources"] = pool.resources;

  json pod_spec = {
      // In-flight requests get the agent's shutdown timeout, plus time to exit.
      {"terminationGracePeriodSeconds", spec::agentStopGraceSeconds(pool)},
      // UCX's shared-memory transport needs more than the default 64 MiB.
      {"volumes", json::array({{{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}}}}})}};
  if (pool.model_source) {
    addModelSource(*pool.model_source, image, /*tokenizer_only=*/false, pod_spec, container);
  } else {
    addModelVolume(pool.model_volume, pool.model_path, pod_spec, container);
  }
  pod_spec["containers"] = json::array({container});
  return deployment(owner, pool.name, poolLabels(pool.name, pool.kind),
                    poolSelector(pool.name, pool.kind), pool.replicas, std::move(pod_spec),
                    {pool.pod_template, "agent", {"terminationGracePeriodSeconds"}, ignored},
                    pool.rollout);
}

json desiredPoolService(const Owner& owner, const PoolSpec& pool) {
  // Headless: the router reaches each agent by its own address (EndpointSlices).
  json object = {{"apiVersion", "v1"},
                 {"kind", "Service"},
                 {"metadata", objectMeta(owner, pool.name, poolLabels(pool.name, pool.kind))},
                 {"spec",
                  {{"clusterIP", "None"},
                   {"selector", poolSelector(pool.name, pool.kind)},
                   {"ports", json::array({{{"name", "http"},
                                           {"port", kContainerPort},
                                           {"targetPort", "http"},
                                           {"protocol", "TCP"}}})}}}};
  stampDesiredHash(object);
  return object;
}

namespace {

json disruptionBudget(const Owner& owner, const std::string& name, const json& labels,
                      const json& selector, const spec::DisruptionBudgetSpec& budget) {
  if (!budget.enabled) return nullptr;
  json spec = {{"selector", {{"matchLabels", selector}}},
               {"unhealthyPodEvictionPolicy", "AlwaysAllow"}};
  if (!budget.min_available.is_null()) {
    spec["minAvailable"] = budget.min_available;
  } else {
    spec["maxUnavailable"] = budget.max_unavailable.is_null() ? json(1) : budget.max_unavailable;
  }
  json object = {{"apiVersion", "policy/v1"},
                 {"kind", "PodDisruptionBudget"},
                 {"metadata", objectMeta(owner, name, labels)},
                 {"spec", spec}};
  stampDesiredHash(object);
  return object;
}

}  // namespace

json desiredPoolDisruptionBudget(const Owner& owner, const PoolSpec& pool) {
  return disruptionBudget(owner, pool.name, poolLabels(pool.name, pool.kind),
                          poolSelector(pool.name, pool.kind), pool.disruption_budget);
}

json desiredRouterDisruptionBudget(const Owner& owner, const RouterSpec& router) {
  return disruptionBudget(owner, router.name, routerLabels(router.name),
                          routerSelector(router.name), router.disruption_budget);
}

json desiredRouterDeployment(const Owner& owner, const RouterSpec& given,
                             const std::vector<std::string>& prefill_pools,
                             const std::vector<std::string>& decode_pools,
                             const WorkloadDefaults& defaults, std::vector<std::string>* ignored) {
  RouterSpec router = given;
  // Without a modelPath, the router reads the tokenizer from where its pools
  // get their model.
  const bool pools_source = !router.model_path && router.pools_model_source;
  if (pools_source) router.model_path = modelPathInPod(*router.pools_model_source);
  json container = {
      {"name", "router"},
      {"image", imageOf(router.image, defaults.operator_image, owner, "--default-operator-image")},
      {"command", json::array({"tandem-operator"})},
      {"args", routerContainerArguments(router, owner.ns, prefill_pools, decode_pools)},
      {"ports",
       json::array({{{"name", "http"}, {"containerPort", kContainerPort}, {"protocol", "TCP"}}})},
      // /health is 200 only with a model and a healthy decode agent: a
      // readiness matter. /metrics answers whenever the server runs.
      {"readinessProbe", httpProbe("/health", 5, 3)},
      {"livenessProbe", httpProbe("/metrics", 10, 3)},
      {"terminationMessagePolicy", "FallbackToLogsOnError"}};
  if (!router.resources.empty()) container["resources"] = router.resources;
  json router_env = json::array();
  if (router.kv_secret_ref) {
    // The agents' KV secret, which the router signs its pull-back holds with.
    const json key_ref = {{"name", router.kv_secret_ref->name}, {"key", router.kv_secret_ref->key}};
    router_env.push_back(
        {{"name", "TANDEM_KV_SECRET"}, {"valueFrom", {{"secretKeyRef", key_ref}}}});
  }
  if (router.api_key_secret_ref) router_env.push_back(apiKeyEnv(*router.api_key_secret_ref));
  if (!router_env.empty()) container["env"] = std::move(router_env);
  json pod_spec = {{"serviceAccountName", defaults.router_service_account},
                   // The drain delay and the shutdown timeout, plus time to exit.
                   {"terminationGracePeriodSeconds",
                    static_cast<int64_t>(std::ceil(
                        kRouterDrainDelaySeconds +
                        router.shutdown_timeout_s.value_or(kRouterShutdownTimeoutSeconds))) +
                        10}};
  if (pools_source) {
    const std::string fetch_image =
        router.pools_image.empty() ? defaults.agent_image : router.pools_image;
    addModelSource(*router.pools_model_source, fetch_image, /*tokenizer_only=*/true, pod_spec,
                   container);
  } else if (router.model_path) {
    addModelVolume(router.model_volume, *router.model_path, pod_spec, container);
  }
  pod_spec["containers"] = json::array({container});
  // The router reads EndpointSlices as the controller's router ServiceAccount.
  return deployment(owner, router.name, routerLabels(router.name), routerSelector(router.name),
                    router.replicas, std::move(pod_spec),
                    {router.pod_template,
                     "router",
                     {"serviceAccountName", "terminationGracePeriodSeconds"},
                     ignored});
}

json desiredRouterService(const Owner& owner, const RouterSpec& router) {
  json object = {{"apiVersion", "v1"},
                 {"kind", "Service"},
                 {"metadata", objectMeta(owner, router.name, routerLabels(router.name))},
                 {"spec",
                  {{"type", router.service_type},
                   {"selector", routerSelector(router.name)},
                   {"ports", json::array({{{"name", "http"},
                                           {"port", router.service_port},
                                           {"targetPort", "http"},
                                           {"protocol", "TCP"}}})}}}};
  stampDesiredHash(object);
  return object;
}

}  // namespace tandem::controller
