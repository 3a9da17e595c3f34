// The objects a pool or router should own: the agent's command line is local
// mode's, labels, selector, owner reference, probes, volumes and the KV
// secret decision.
#include "operator/controller/desired_objects.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "common/status.h"
#include "operator/controller/object_diff.h"
#include "operator/spec/agent_command.h"
#include "operator/spec/cluster_spec.h"

namespace tandem::controller {
namespace {

using nlohmann::json;
using spec::PoolKind;
using spec::PoolSpec;

Owner ownerFor(const PoolSpec& pool) {
  return Owner{"tandem.dev/v1alpha1",
               spec::poolKindName(pool.kind),
               "serving",
               pool.name,
               "uid-" + pool.name,
               3};
}

WorkloadDefaults defaults() {
  WorkloadDefaults value;
  value.agent_image = "ghcr.io/tandem/agent:test";
  value.operator_image = "ghcr.io/tandem/operator:test";
  return value;
}

spec::ClusterSpec exampleCluster() {
  return spec::loadClusterSpec(std::filesystem::path(TANDEM_SOURCE_DIR) / "examples" /
                               "cluster.yaml");
}

const json& agentContainer(const json& deployment) {
  return deployment["spec"]["template"]["spec"]["containers"][0];
}

json envNamed(const json& container, const std::string& name) {
  for (const json& item : container["env"]) {
    if (item["name"] == name) return item;
  }
  return nullptr;
}

TEST(DesiredObjectsTest, ExamplePoolsRunLocalModesCommandLine) {
  const spec::ClusterSpec cluster = exampleCluster();
  ASSERT_EQ(cluster.pools.size(), 2u);
  for (const PoolSpec& pool : cluster.pools) {
    SCOPED_TRACE(pool.name);
    const json deployment = desiredPoolDeployment(ownerFor(pool), pool, defaults());
    const json& container = agentContainer(deployment);
    EXPECT_EQ(container["name"], "agent");
    EXPECT_EQ(container["image"], "ghcr.io/tandem/agent:test");
    EXPECT_EQ(container["command"], json::array({"tandem-agent"}));
    // An agent that exits leaves its log's end as the reason the pool reports.
    EXPECT_EQ(container["terminationMessagePolicy"], "FallbackToLogsOnError");
    // No secret in the example: the pod IP and --insecure-kv.
    std::vector<std::string> expected =
        spec::agentArguments(pool, "tandem-agent", "$(POD_IP)", 8000, true);
    expected.erase(expected.begin());
    EXPECT_EQ(container["args"].get<std::vector<std::string>>(), expected);
    EXPECT_EQ(container["args"].back(), "--insecure-kv");
    EXPECT_EQ(envNamed(container, "POD_IP")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
    EXPECT_TRUE(envNamed(container, "TANDEM_KV_SECRET").is_null());

    const char* role = spec::poolRole(pool.kind);
    const json labels = {{"app.kubernetes.io/name", "tandem-agent"},
                         {"app.kubernetes.io/instance", pool.name},
                         {"app.kubernetes.io/component", role},
                         {"app.kubernetes.io/managed-by", "tandem-operator"},
                         {"tandem.dev/pool", pool.name},
                         {"tandem.dev/role", role}};
    EXPECT_EQ(deployment["metadata"]["name"], pool.name);
    EXPECT_EQ(deployment["metadata"]["namespace"], "serving");
    EXPECT_EQ(deployment["metadata"]["labels"], labels);
    EXPECT_EQ(deployment["spec"]["template"]["metadata"]["labels"], labels);
    const json selector = {{"tandem.dev/pool", pool.name}, {"tandem.dev/role", role}};
    EXPECT_EQ(deployment["spec"]["selector"]["matchLabels"], selector);
    EXPECT_EQ(selectorString(selector),
              "tandem.dev/pool=" + pool.name + ",tandem.dev/role=" + role);
    EXPECT_EQ(deployment["metadata"]["ownerReferences"],
              json::parse(R"([{"apiVersion":"tandem.dev/v1alpha1","kind":")" +
                          std::string(spec::poolKindName(pool.kind)) + R"(","name":")" + pool.name +
                          R"(","uid":"uid-)" + pool.name +
                          R"(","controller":true,"blockOwnerDeletion":true}])"));
    EXPECT_EQ(deployment["spec"]["replicas"], 1);
    EXPECT_EQ(deployment["spec"]["strategy"]["rollingUpdate"],
              json::parse(R"({"maxUnavailable":0,"maxSurge":1})"));
    EXPECT_EQ(container["readinessProbe"],
              json::parse(R"({"httpGet":{"path":"/health","port":"http"},"periodSeconds":5,
                              "failureThreshold":3})"));
    EXPECT_EQ(container["livenessProbe"]["periodSeconds"], 10);
    EXPECT_EQ(container["livenessProbe"]["failureThreshold"], 3);
    EXPECT_EQ(container["startupProbe"]["periodSeconds"], 10);
    EXPECT_EQ(container["startupProbe"]["failureThreshold"], 60);
    EXPECT_EQ(container["ports"][0]["containerPort"], 8000);
    EXPECT_EQ(container["ports"][0]["name"], "http");
    const json& pod = deployment["spec"]["template"]["spec"];
    EXPECT_EQ(pod["terminationGracePeriodSeconds"], 45);  // default 30 s + 15
    EXPECT_EQ(pod["volumes"][0], json::parse(R"({"name":"dshm","emptyDir":{"medium":"Memory"}})"));
    EXPECT_EQ(container["volumeMounts"][0],
              json::parse(R"({"name":"dshm","mountPath":"/dev/shm"})"));
    EXPECT_TRUE(deployment["metadata"]["annotations"].contains(kSpecHashAnnotation));

    const json service = desiredPoolService(ownerFor(pool), pool);
    EXPECT_EQ(service["spec"]["clusterIP"], "None");
    EXPECT_EQ(service["spec"]["selector"], selector);
    EXPECT_EQ(service["metadata"]["ownerReferences"], deployment["metadata"]["ownerReferences"]);
  }
}

const char* kSecretPool = R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: decode}
spec:
  replicas: 3
  model:
    path: /models/llama
    volume:
      persistentVolumeClaim: {claimName: models}
      subPath: llama
  resources:
    limits: {nvidia.com/gpu: 1}
  engine: {shutdownTimeoutSeconds: 12.5}
  kvTransfer:
    secretRef: {name: tandem-kv, key: secret}
  env: [{name: UCX_TLS, value: "rc,cuda_copy"}]
)";

// A DecodePool "decode" whose spec.model is `model` (YAML flow mapping).
PoolSpec decodePoolWithModel(const std::string& model) {
  const spec::ClusterSpec cluster = spec::parseClusterSpec(
      "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\nmetadata: {name: decode}\nspec:\n"
      "  model: " +
          model + "\n",
      "pool.yaml");
  return cluster.pools.at(0);
}

const json& podSpec(const json& deployment) { return deployment["spec"]["template"]["spec"]; }

std::string argAfter(const json& container, const std::string& flag) {
  const auto args = container["args"].get<std::vector<std::string>>();
  auto it = std::find(args.begin(), args.end(), flag);
  return it == args.end() || it + 1 == args.end() ? "" : *(it + 1);
}

// Kubernetes expands "$(VAR)" in args from the container's environment:
// what the controller makes from spec values reaches the agent as written
// ("$" doubled), the host stays the one meant expansion, and extraArgs are
// passed as written, where "$(POD_IP)" is the container's variable.
TEST(DesiredObjectsTest, ArgumentsFromSpecValuesAreNotExpandedByKubernetes) {
  PoolSpec pool = exampleCluster().pools.at(0);
  pool.model_path = "/models/$(POD_IP)/m$";
  pool.served_model_name = "cost-$(HOME)";
  pool.extra_args = {"--api-key-file", "/keys/$(POD_IP)"};
  const json container = agentContainer(desiredPoolDeployment(ownerFor(pool), pool, defaults()));
  const auto args = container["args"].get<std::vector<std::string>>();
  auto after = [&](const std::string& flag) {
    const auto it = std::find(args.begin(), args.end(), flag);
    return it == args.end() || it + 1 == args.end() ? std::string() : *(it + 1);
  };
  EXPECT_EQ(after("--model"), "/models/$$(POD_IP)/m$$");
  EXPECT_EQ(after("--served-model-name"), "cost-$$(HOME)");
  EXPECT_EQ(after("--host"), "$(POD_IP)");
  EXPECT_EQ(after("--api-key-file"), "/keys/$(POD_IP)");

  spec::RouterSpec router;
  router.model_path = "/models/$(X)";
  router.extra_args = {"--note", "$(Y)"};
  const auto router_args = routerContainerArguments(router, "serving", {"p"}, {"d"});
  EXPECT_NE(std::find(router_args.begin(), router_args.end(), "/models/$$(X)"), router_args.end());
  EXPECT_EQ(router_args.back(), "$(Y)");

  // The fetch's source: a revision is any text the Hub takes, and the
  // fetch's container has HF_TOKEN from the Secret.
  const PoolSpec fetched =
      decodePoolWithModel("{source: hf://org/m@$(HF_TOKEN), tokenSecretRef: {name: hf}}");
  const json fetch =
      podSpec(desiredPoolDeployment(ownerFor(fetched), fetched, defaults()))["initContainers"][0];
  EXPECT_EQ(fetch["args"][1], "hf://org/m@$$(HF_TOKEN)") << fetch.dump();
}

// hf://: an init container of the agent's image fetches into the cache volume
// (an emptyDir, or the claim the pool's pods share) with the token from the
// Secret; the agent reads the fetched directory, read-only.
TEST(DesiredObjectsTest, AnHfSourceIsFetchedByAnInitContainerIntoTheCache) {
  const PoolSpec pool = decodePoolWithModel(
      "{source: hf://meta-llama/Llama-3.1-8B@v2, tokenSecretRef: {name: hf}, "
      "endpoint: https://mirror.example, cache: {sizeLimit: 40Gi}}");
  EXPECT_EQ(pool.served_model_name, "meta-llama/Llama-3.1-8B");
  const json deployment = desiredPoolDeployment(ownerFor(pool), pool, defaults());
  const json& pod = podSpec(deployment);
  const std::string directory = "/model-cache/hf/models--meta-llama--Llama-3.1-8B/v2";
  EXPECT_EQ(argAfter(agentContainer(deployment), "--model"), directory);
  EXPECT_EQ(argAfter(agentContainer(deployment), "--served-model-name"), "meta-llama/Llama-3.1-8B");
  const json expected_init = json::parse(R"json([{
      "name": "model-fetch", "image": "ghcr.io/tandem/agent:test", "command": ["tandem-model"],
      "args": ["fetch", "hf://meta-llama/Llama-3.1-8B@v2", "--dir",
               "/model-cache/hf/models--meta-llama--Llama-3.1-8B/v2", "--token-source",
               "the Secret hf (key HF_TOKEN, spec.model.tokenSecretRef)"],
      "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}},
              {"name": "HF_ENDPOINT", "value": "https://mirror.example"}],
      "terminationMessagePolicy": "FallbackToLogsOnError",
      "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
      "resources": {"requests": {"ephemeral-storage": "40Gi"}},
      "volumeMounts": [{"name": "model-cache", "mountPath": "/model-cache"}]}])json");
  EXPECT_EQ(pod["initContainers"], expected_init) << "the download's disk is requested";
  EXPECT_EQ(pod["volumes"][1], json::parse(R"({"name": "model-cache",
      "emptyDir": {"sizeLimit": "40Gi"}})"));
  EXPECT_EQ(
      agentContainer(deployment)["volumeMounts"][1],
      json::parse(R"({"name": "model-cache", "mountPath": "/model-cache", "readOnly": true})"));
  EXPECT_EQ(poolModelInitContainer(pool), "model-fetch");

  const PoolSpec shared = decodePoolWithModel("{source: hf://org/m, cache: {claimName: models}}");
  const json shared_deployment = desiredPoolDeployment(ownerFor(shared), shared, defaults());
  const json& shared_pod = podSpec(shared_deployment);
  EXPECT_EQ(shared_pod["volumes"][1], json::parse(R"({"name": "model-cache",
      "persistentVolumeClaim": {"claimName": "models"}})"));
  EXPECT_EQ(shared_pod["securityContext"], json::parse(R"({"fsGroup": 65532,
      "fsGroupChangePolicy": "OnRootMismatch", "runAsNonRoot": true, "runAsUser": 65532,
      "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}})"));
  EXPECT_FALSE(shared_pod["initContainers"][0].contains("resources"))
      << "a claim's disk is not the node's";
  // A public model: no token, no endpoint, and no empty env list, which the
  // API server would drop (the live init container would never match).
  EXPECT_FALSE(shared_pod["initContainers"][0].contains("env")) << shared_pod.dump();
}

// spec.rollout: the Deployment's rolling update and the startup probe's
// allowance (ceil(timeout / 10 s) probes 10 s apart).
TEST(DesiredObjectsTest, RolloutSetsTheStrategyAndTheStartupAllowance) {
  PoolSpec pool = decodePoolWithModel("{source: pvc://models/llama/8b}");
  json deployment = desiredPoolDeployment(ownerFor(pool), pool, defaults());
  EXPECT_EQ(deployment["spec"]["strategy"], json::parse(R"({"type": "RollingUpdate",
      "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})"));
  EXPECT_EQ(agentContainer(deployment)["startupProbe"]["failureThreshold"], 60);
  pool.rollout.max_surge = 0;
  pool.rollout.max_unavailable = "25%";
  pool.rollout.startup_timeout_s = 1805;
  deployment = desiredPoolDeployment(ownerFor(pool), pool, defaults());
  EXPECT_EQ(deployment["spec"]["strategy"]["rollingUpdate"],
            json::parse(R"({"maxUnavailable": "25%", "maxSurge": 0})"));
  EXPECT_EQ(agentContainer(deployment)["startupProbe"]["failureThreshold"], 181);
  EXPECT_EQ(agentContainer(deployment)["startupProbe"]["periodSeconds"], 10);
}

TEST(DesiredObjectsTest, PvcAndOciSourcesAreMountedOrCopiedAtModel) {
  const PoolSpec claim = decodePoolWithModel("{source: pvc://models/llama/8b}");
  EXPECT_EQ(claim.served_model_name, "8b");
  const json claim_deployment = desiredPoolDeployment(ownerFor(claim), claim, defaults());
  EXPECT_EQ(argAfter(agentContainer(claim_deployment), "--model"), "/model");
  EXPECT_EQ(podSpec(claim_deployment)["volumes"][1], json::parse(R"({"name": "model",
      "persistentVolumeClaim": {"claimName": "models", "readOnly": true}})"));
  EXPECT_EQ(agentContainer(claim_deployment)["volumeMounts"][1], json::parse(R"({"name": "model",
      "mountPath": "/model", "readOnly": true, "subPath": "llama/8b"})"));
  EXPECT_FALSE(podSpec(claim_deployment).contains("initContainers"));

  const PoolSpec copied = decodePoolWithModel("{source: oci://registry:5000/models/tiny:1}");
  EXPECT_EQ(copied.served_model_name, "tiny");
  const json copied_deployment = desiredPoolDeployment(ownerFor(copied), copied, defaults());
  const json& copied_pod = podSpec(copied_deployment);
  EXPECT_EQ(copied_pod["initContainers"][0]["name"], "model-copy");
  EXPECT_EQ(copied_pod["initContainers"][0]["image"], "registry:5000/models/tiny:1");
  EXPECT_EQ(copied_pod["initContainers"][0]["command"],
            json::parse(R"(["sh", "-c", "cp -R /models/. /model"])"));
  EXPECT_EQ(copied_pod["volumes"][1], json::parse(R"({"name": "model", "emptyDir": {}})"));

  const PoolSpec mounted =
      decodePoolWithModel("{source: oci://registry:5000/models/tiny:1, imageMount: ImageVolume}");
  const json mounted_deployment = desiredPoolDeployment(ownerFor(mounted), mounted, defaults());
  EXPECT_EQ(podSpec(mounted_deployment)["volumes"][1], json::parse(R"({"name": "model",
      "image": {"reference": "registry:5000/models/tiny:1", "pullPolicy": "IfNotPresent"}})"));
  EXPECT_EQ(agentContainer(mounted_deployment)["volumeMounts"][1]["subPath"], "models");
  EXPECT_EQ(poolModelInitContainer(mounted), "");
}

// A Router without modelPath reads the tokenizer from its decode pool's
// source: its own emptyDir, tokenizer files only, the pool's image.
TEST(DesiredObjectsTest, ARouterWithoutAModelPathFetchesItsPoolsTokenizer) {
  const PoolSpec pool = decodePoolWithModel("{source: hf://org/m, cache: {claimName: models}}");
  spec::RouterSpec router;
  router.name = "router";
  router.pools_model_source = pool.model_source;
  router.pools_image = "registry/agent:v2";
  const Owner owner{"tandem.dev/v1alpha1", "Router", "serving", "router", "uid-router", 1};
  const json deployment =
      desiredRouterDeployment(owner, router, {}, {"decode"}, defaults(), nullptr);
  const json& pod = podSpec(deployment);
  EXPECT_EQ(argAfter(pod["containers"][0], "--model-dir"), "/model-cache/hf/models--org--m/main");
  EXPECT_EQ(pod["initContainers"][0]["image"], "registry/agent:v2");
  const auto args = pod["initContainers"][0]["args"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(args.begin(), args.end(), "--tokenizer-only"), args.end());
  EXPECT_EQ(pod["volumes"][0], json::parse(R"({"name": "model-cache", "emptyDir": {}})"));
}

// Every generated pod meets the Pod Security Standards' restricted profile
// (a namespace enforcing it admits it): every container, init containers
// included, and the pod; a pool's spec.template wins on each leaf (an RDMA
// pool running as root with IPC_LOCK, in a namespace that allows it).
TEST(DesiredObjectsTest, GeneratedPodsAreRestrictedUnlessTheTemplateSaysOtherwise) {
  const json pod_context = json::parse(R"({"runAsNonRoot": true, "runAsUser": 65532,
      "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}})");
  const json container_context =
      json::parse(R"({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})");
  const PoolSpec fetched = decodePoolWithModel("{source: hf://org/m}");
  const PoolSpec copied = decodePoolWithModel("{source: oci://registry:5000/models/tiny:1}");
  spec::RouterSpec router;
  router.name = "router";
  router.pools_model_source = fetched.model_source;
  const Owner router_owner{"tandem.dev/v1alpha1", "Router", "serving", "router", "uid-r", 1};
  for (const json& deployment :
       {desiredPoolDeployment(ownerFor(fetched), fetched, defaults()),
        desiredPoolDeployment(ownerFor(copied), copied, defaults()),
        desiredRouterDeployment(router_owner, router, {}, {"decode"}, defaults(), nullptr)}) {
    const json& pod = podSpec(deployment);
    EXPECT_EQ(pod["securityContext"], pod_context) << pod.dump();
    ASSERT_EQ(pod["initContainers"].size(), 1u) << pod.dump();
    EXPECT_EQ(pod["initContainers"][0]["securityContext"], container_context) << pod.dump();
    ASSERT_EQ(pod["containers"].size(), 1u);
    EXPECT_EQ(pod["containers"][0]["securityContext"], container_context) << pod.dump();
  }

  const PoolSpec rdma = decodePoolWithModel(
      "{source: hf://org/m}\n  template:\n    spec:\n      securityContext: {runAsUser: 0, "
      "runAsNonRoot: false}\n      containers:\n      - name: agent\n        securityContext: "
      "{capabilities: {add: [IPC_LOCK]}}");
  const json rdma_deployment = desiredPoolDeployment(ownerFor(rdma), rdma, defaults());
  const json& pod = podSpec(rdma_deployment);
  EXPECT_EQ(pod["securityContext"], json::parse(R"({"runAsNonRoot": false, "runAsUser": 0,
      "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}})"));
  EXPECT_EQ(pod["containers"][0]["securityContext"], json::parse(R"({
      "allowPrivilegeEscalation": false,
      "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}})"));

  // A privileged agent (or one with SYS_ADMIN) escalates by definition: the
  // API server refuses it beside allowPrivilegeEscalation false, so the
  // default gives way; one the fragment writes itself stays.
  for (const std::string& context :
       {std::string("{privileged: true}"), std::string("{capabilities: {add: [SYS_ADMIN]}}"),
        std::string("{capabilities: {add: [CAP_SYS_ADMIN]}}")}) {
    const PoolSpec escalating = decodePoolWithModel(
        "{source: hf://org/m}\n  template:\n    spec:\n      containers:\n      - name: "
        "agent\n        securityContext: " +
        context);
    const json escalating_deployment =
        desiredPoolDeployment(ownerFor(escalating), escalating, defaults());
    const json& escalating_pod = podSpec(escalating_deployment);
    EXPECT_FALSE(
        escalating_pod["containers"][0]["securityContext"].contains("allowPrivilegeEscalation"))
        << context << ": " << escalating_pod["containers"][0].dump();
    EXPECT_EQ(escalating_pod["containers"][0]["securityContext"]["capabilities"]["drop"],
              json::array({"ALL"}));
    EXPECT_EQ(escalating_pod["initContainers"][0]["securityContext"], container_context)
        << "the fetch does not escalate";
  }
  const PoolSpec contradictory = decodePoolWithModel(
      "{source: hf://org/m}\n  template:\n    spec:\n      containers:\n      - name: agent\n"
      "        securityContext: {privileged: true, allowPrivilegeEscalation: false}");
  const json contradictory_deployment =
      desiredPoolDeployment(ownerFor(contradictory), contradictory, defaults());
  EXPECT_EQ(podSpec(contradictory_deployment)["containers"][0]["securityContext"].value(
                "allowPrivilegeEscalation", true),
            false)
      << "what the fragment writes is the API server's to judge";
  // Values of other types are the API server's to refuse: the controller
  // neither throws nor takes them for true; a null is "not written".
  for (const std::string& context :
       {std::string("{privileged: \"true\"}"), std::string("{privileged: 1}"),
        std::string("{capabilities: {add: SYS_ADMIN}}"), std::string("{capabilities: 3}")}) {
    const PoolSpec odd = decodePoolWithModel(
        "{source: hf://org/m}\n  template:\n    spec:\n      containers:\n      - name: "
        "agent\n        securityContext: " +
        context);
    json odd_deployment;
    ASSERT_NO_THROW(odd_deployment = desiredPoolDeployment(ownerFor(odd), odd, defaults()))
        << context;
    EXPECT_EQ(podSpec(odd_deployment)["containers"][0]["securityContext"].value(
                  "allowPrivilegeEscalation", true),
              false)
        << context;
  }
  const PoolSpec nulled = decodePoolWithModel(
      "{source: hf://org/m}\n  template:\n    spec:\n      containers:\n      - name: agent\n"
      "        securityContext: {privileged: true, allowPrivilegeEscalation: null}");
  const json nulled_deployment = desiredPoolDeployment(ownerFor(nulled), nulled, defaults());
  EXPECT_FALSE(podSpec(nulled_deployment)["containers"][0]["securityContext"].contains(
      "allowPrivilegeEscalation"));
}

TEST(DesiredObjectsTest, SecretRefListensEverywhereWithTheSecretFromTheSecret) {
  const PoolSpec pool = spec::parseClusterSpec(kSecretPool, "c.yaml").pools.at(0);
  EXPECT_FALSE(poolKvTransferIsInsecure(pool));
  const json deployment = desiredPoolDeployment(ownerFor(pool), pool, defaults());
  const json& container = agentContainer(deployment);
  std::vector<std::string> expected = spec::agentArguments(pool, "tandem-agent", "0.0.0.0", 8000);
  expected.erase(expected.begin());
  EXPECT_EQ(container["args"].get<std::vector<std::string>>(), expected);
  for (const json& arg : container["args"]) EXPECT_NE(arg, "--insecure-kv");
  EXPECT_EQ(envNamed(container, "TANDEM_KV_SECRET")["valueFrom"],
            json::parse(R"({"secretKeyRef":{"name":"tandem-kv","key":"secret"}})"));
  EXPECT_EQ(envNamed(container, "UCX_TLS")["value"], "rc,cuda_copy");
  EXPECT_EQ(container["resources"], json::parse(R"({"limits":{"nvidia.com/gpu":1}})"));
  EXPECT_EQ(deployment["spec"]["replicas"], 3);
  const json& pod = deployment["spec"]["template"]["spec"];
  EXPECT_EQ(pod["terminationGracePeriodSeconds"], 28);  // ceil(12.5) + 15
  EXPECT_EQ(pod["volumes"][1],
            json::parse(R"({"name":"model","persistentVolumeClaim":{"claimName":"models",
                            "readOnly":true}})"));
  EXPECT_EQ(container["volumeMounts"][1],
            json::parse(R"({"name":"model","mountPath":"/models/llama","readOnly":true,
                            "subPath":"llama"})"));
}

TEST(DesiredObjectsTest, NoImageAnywhereIsAnErrorNamingBoth) {
  const PoolSpec pool = exampleCluster().pools.at(0);
  try {
    desiredPoolDeployment(ownerFor(pool), pool, WorkloadDefaults{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("spec.image"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--default-agent-image"), std::string::npos) << e.what();
  }
}

TEST(DesiredObjectsTest, RouterRunsDiscoveryWithItsSpecsFlags) {
  const spec::RouterSpec router = spec::parseRouterSpec(R"(apiVersion: tandem.dev/v1alpha1
kind: Router
metadata: {name: front}
spec:
  replicas: 2
  policy: round_robin
  pullBack: false
  upstreamTimeoutSeconds: 30
  maxMigrations: 1
  migrationTimeoutSeconds: 12.5
  modelPath: /models/llama
  modelVolume: {hostPath: {path: /srv/models/llama}}
  service: {type: LoadBalancer, port: 80}
)",
                                                        "r.yaml");
  const Owner owner{"tandem.dev/v1alpha1", "Router", "serving", "front", "uid-r", 1};
  const json deployment =
      desiredRouterDeployment(owner, router, {"prefill"}, {"decode-a", "decode-b"}, defaults());
  {
    // Pools the Router lists are named; without lists the router finds
    // every pool itself (above), so a pool added later rolls no router.
    spec::RouterSpec listed = router;
    listed.prefill_pools = std::vector<std::string>{"prefill"};
    listed.decode_pools = std::vector<std::string>{"decode-a", "decode-b"};
    const json args = agentContainer(desiredRouterDeployment(
        owner, listed, {"prefill"}, {"decode-a", "decode-b"}, defaults()))["args"];
    const json expected = json::parse(R"(["router", "--discover", "--namespace", "serving",
        "--prefill-pool", "prefill", "--decode-pool", "decode-a", "--decode-pool", "decode-b"])");
    EXPECT_EQ(json(std::vector<json>(args.begin(), args.begin() + 10)), expected) << args;
  }
  {
    // spec.extraArgs come last: the router takes a flag's last value, so
    // they win over the controller's.
    spec::RouterSpec extra = router;
    extra.extra_args = {"--policy", "kv", "--max-connections", "4096"};
    const json args = agentContainer(
        desiredRouterDeployment(owner, extra, {"prefill"}, {"decode-a"}, defaults()))["args"];
    ASSERT_GE(args.size(), 6u);
    EXPECT_EQ(json(std::vector<json>(args.end() - 6, args.end())),
              json::parse(R"(["--shutdown-timeout", "120", "--policy", "kv",
                  "--max-connections", "4096"])"))
        << args;
  }
  {
    spec::RouterSpec patient = router;
    patient.shutdown_timeout_s = 600;
    const json longer =
        desiredRouterDeployment(owner, patient, {"prefill"}, {"decode-a"}, defaults());
    const json args = agentContainer(longer)["args"];
    EXPECT_EQ(args[args.size() - 1], "600") << args;
    EXPECT_EQ(longer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 615);
  }
  const json& container = agentContainer(deployment);
  EXPECT_EQ(container["image"], "ghcr.io/tandem/operator:test");
  EXPECT_EQ(container["command"], json::array({"tandem-operator"}));
  EXPECT_EQ(container["args"].get<std::vector<std::string>>(),
            (std::vector<std::string>{"router",
                                      "--discover",
                                      "--namespace",
                                      "serving",
                                      "--all-pools",
                                      "--host",
                                      "0.0.0.0",
                                      "--port",
                                      "8000",
                                      "--policy",
                                      "round_robin",
                                      "--pull-back",
                                      "false",
                                      "--upstream-timeout",
                                      "30",
                                      "--max-migrations",
                                      "1",
                                      "--migration-timeout",
                                      "12.5",
                                      "--model-dir",
                                      "/models/llama",
                                      "--drain-delay",
                                      "5",
                                      "--shutdown-timeout",
                                      "120"}));
  EXPECT_EQ(container["readinessProbe"]["httpGet"]["path"], "/health");
  // The drain delay and the shutdown timeout, plus time to exit.
  EXPECT_EQ(deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 135);
  EXPECT_EQ(deployment["spec"]["replicas"], 2);
  EXPECT_EQ(deployment["spec"]["template"]["spec"]["serviceAccountName"], "tandem-router");
  EXPECT_EQ(deployment["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"],
            "/srv/models/llama");
  EXPECT_EQ(container["volumeMounts"][0]["mountPath"], "/models/llama");
  const json service = desiredRouterService(owner, router);
  EXPECT_EQ(service["spec"]["type"], "LoadBalancer");
  EXPECT_EQ(service["spec"]["ports"][0]["port"], 80);
  EXPECT_EQ(service["spec"]["ports"][0]["targetPort"], "http");
  EXPECT_EQ(service["spec"]["selector"], json::parse(R"({"tandem.dev/router":"front"})"));
}

TEST(DesiredObjectsTest, RouterGetsTheAgentsKvSecretFromItsKvSecretRef) {
  const char* document = R"(apiVersion: tandem.dev/v1alpha1
kind: Router
metadata: {name: front}
spec:
  kvSecretRef: {name: tandem-kv, key: secret}
)";
  const Owner owner{"tandem.dev/v1alpha1", "Router", "serving", "front", "uid-r", 1};
  const json container = agentContainer(desiredRouterDeployment(
      owner, spec::parseRouterSpec(document, "r.yaml"), {"prefill"}, {"decode"}, defaults()));
  EXPECT_EQ(container["env"], json::parse(R"([{"name": "TANDEM_KV_SECRET", "valueFrom":
      {"secretKeyRef": {"name": "tandem-kv", "key": "secret"}}}])"));
  const json plain = agentContainer(
      desiredRouterDeployment(owner, spec::RouterSpec{}, {"prefill"}, {"decode"}, defaults()));
  EXPECT_FALSE(plain.contains("env"));
}

// spec.apiKeySecretRef: TANDEM_API_KEY from the Secret, for agents and
// router alike; the key defaults to "api-key".
TEST(DesiredObjectsTest, ApiKeySecretRefBecomesTandemApiKey) {
  const char* router_document = R"(apiVersion: tandem.dev/v1alpha1
kind: Router
metadata: {name: front}
spec:
  kvSecretRef: {name: tandem-kv, key: secret}
  apiKeySecretRef: {name: tandem-api}
)";
  const Owner owner{"tandem.dev/v1alpha1", "Router", "serving", "front", "uid-r", 1};
  const json router = agentContainer(
      desiredRouterDeployment(owner, spec::parseRouterSpec(router_document, "r.yaml"), {"prefill"},
                              {"decode"}, defaults()));
  EXPECT_EQ(router["env"], json::parse(R"([
      {"name": "TANDEM_KV_SECRET", "valueFrom": {"secretKeyRef": {"name": "tandem-kv", "key": "secret"}}},
      {"name": "TANDEM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "tandem-api", "key": "api-key"}}}])"));

  PoolSpec pool = exampleCluster().pools.at(0);
  EXPECT_TRUE(envNamed(agentContainer(desiredPoolDeployment(ownerFor(pool), pool, defaults())),
                       "TANDEM_API_KEY")
                  .is_null());
  pool.api_key_secret_ref = spec::SecretKeyRef{"tandem-api", "token"};
  const json agent = agentContainer(desiredPoolDeployment(ownerFor(pool), pool, defaults()));
  EXPECT_EQ(envNamed(agent, "TANDEM_API_KEY")["valueFrom"],
            json::parse(R"({"secretKeyRef": {"name": "tandem-api", "key": "token"}})"));
}

TEST(DesiredObjectsTest, DesiredHashFollowsTheSpec) {
  PoolSpec pool = exampleCluster().pools.at(0);
  const json before = desiredPoolDeployment(ownerFor(pool), pool, defaults());
  EXPECT_EQ(desiredPoolDeployment(ownerFor(pool), pool, defaults()), before);
  pool.env.clear();
  pool.env.emplace_back("A", "1");
  const json after = desiredPoolDeployment(ownerFor(pool), pool, defaults());
  EXPECT_NE(after["metadata"]["annotations"][kSpecHashAnnotation],
            before["metadata"]["annotations"][kSpecHashAnnotation]);
}

}  // namespace
}  // namespace tandem::controller
