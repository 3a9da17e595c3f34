// The Helm chart charts/tandem, rendered by the real helm: lint, the objects
// each values mode renders (kinds, operator flags, security context, RBAC
// rules), schema errors for bad values, the monitoring objects (Grafana
// dashboard ConfigMap, PodMonitor, PrometheusRule), and the chart's CRDs
// against the repository's crds/.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/apiserver/yaml_json.h"
#include "tests/support/command.h"
#include "tests/support/helm.h"

namespace tandem {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kChartDir = kSourceDir / "charts/tandem";
constexpr char kNamespace[] = "llm";

using HelmResult = testing::CommandResult;

class HelmChartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = fs::temp_directory_path() /
                ("tandem-helm-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(work_dir_);
    fs::create_directories(work_dir_);
  }
  void TearDown() override { fs::remove_all(work_dir_); }

  // helm ARGS..., with its own HOME and cache/config directories.
  HelmResult helm(const std::vector<std::string>& args) {
    return testing::runHelm(args, work_dir_,
                            work_dir_ / ("helm-" + std::to_string(++calls_) + ".err"),
                            std::chrono::seconds(60));
  }

  // `helm template` of the chart with `extra` arguments; fails the test when
  // helm does.
  std::vector<json> render(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"template", "tandem", kChartDir.string(), "--namespace",
                                     kNamespace};
    args.insert(args.end(), extra.begin(), extra.end());
    const HelmResult result = helm(args);
    EXPECT_EQ(result.exit_status, 0) << result.err;
    return testing::yamlDocumentsToJson(result.out);
  }

  fs::path writeFile(const std::string& name, const std::string& text) {
    const fs::path path = work_dir_ / name;
    std::ofstream(path) << text;
    return path;
  }

  fs::path work_dir_;
  int calls_ = 0;
};

std::multiset<std::string> kindsOf(const std::vector<json>& objects) {
  std::multiset<std::string> kinds;
  for (const json& object : objects) kinds.insert(object.value("kind", ""));
  return kinds;
}

// The objects of `kind`, in rendering order.
std::vector<json> objectsOf(const std::vector<json>& objects, const std::string& kind) {
  std::vector<json> found;
  for (const json& object : objects) {
    if (object.value("kind", "") == kind) found.push_back(object);
  }
  return found;
}

json operatorContainer(const std::vector<json>& objects) {
  const std::vector<json> deployments = objectsOf(objects, "Deployment");
  EXPECT_EQ(deployments.size(), 1u);
  if (deployments.empty()) return json::object();
  return deployments[0]["spec"]["template"]["spec"]["containers"][0];
}

std::vector<std::string> argsOf(const json& container) {
  return container.value("args", std::vector<std::string>{});
}

bool hasArg(const std::vector<std::string>& args, const std::string& arg) {
  return std::find(args.begin(), args.end(), arg) != args.end();
}

// The value after `flag`, or "" when the flag is absent or last.
std::string flagValue(const std::vector<std::string>& args, const std::string& flag) {
  auto it = std::find(args.begin(), args.end(), flag);
  if (it == args.end() || std::next(it) == args.end()) return "";
  return *std::next(it);
}

// A rule set as {apiGroup|resource -> verbs}, so order does not matter but
// every resource and verb does.
std::map<std::string, std::set<std::string>> rulesOf(const json& role) {
  std::map<std::string, std::set<std::string>> rules;
  for (const json& rule : role.at("rules")) {
    for (const json& group : rule.at("apiGroups")) {
      for (const json& resource : rule.at("resources")) {
        auto& verbs = rules[group.get<std::string>() + "|" + resource.get<std::string>()];
        for (const json& verb : rule.at("verbs")) verbs.insert(verb.get<std::string>());
      }
    }
  }
  return rules;
}

// docs/kubernetes.md, "RBAC".
std::map<std::string, std::set<std::string>> expectedOperatorRules() {
  const std::set<std::string> read = {"get", "list", "watch"};
  // Children are created, then changed by server-side apply; never deleted
  // (but a PodDisruptionBudget the pool's spec turns off).
  const std::set<std::string> write = {"get", "list", "watch", "create", "patch"};
  const std::set<std::string> status = {"get", "update"};
  return {{"tandem.dev|prefillpools", read},
          {"tandem.dev|decodepools", read},
          {"tandem.dev|routers", read},
          {"tandem.dev|prefillpools/status", status},
          {"tandem.dev|decodepools/status", status},
          {"tandem.dev|routers/status", status},
          // The SLA planner: replicas through the scale subresource, and
          // whether an HPA already targets a pool.
          {"tandem.dev|prefillpools/scale", status},
          {"tandem.dev|decodepools/scale", status},
          {"autoscaling|horizontalpodautoscalers", {"list"}},
          // blockOwnerDeletion in the children's ownerReferences needs it
          // where OwnerReferencesPermissionEnforcement is on (OpenShift).
          {"tandem.dev|prefillpools/finalizers", {"update"}},
          {"tandem.dev|decodepools/finalizers", {"update"}},
          {"tandem.dev|routers/finalizers", {"update"}},
          {"apps|deployments", write},
          {"|services", write},
          {"policy|poddisruptionbudgets", {"get", "list", "watch", "create", "patch", "delete"}},
          // patch: the planner's pod-deletion-cost before a scale-down.
          {"|pods", {"list", "watch", "patch"}},
          {"|events", {"create"}}};
}

json namedObject(const std::vector<json>& objects, const std::string& kind,
                 const std::string& name) {
  for (const json& object : objects) {
    if (object.value("kind", "") == kind && object["metadata"].value("name", "") == name) {
      return object;
    }
  }
  ADD_FAILURE() << "no " << kind << " " << name;
  return json::object();
}

// The leader election's Role, in the release namespace whatever the scope:
// create any Lease (RBAC cannot limit create to a name), get and update only
// the operator's.
void expectLeaderElectionRole(const std::vector<json>& objects) {
  const json role = namedObject(objects, "Role", "tandem-operator-leader-election");
  EXPECT_EQ(role["metadata"]["namespace"], kNamespace);
  EXPECT_EQ(role["rules"], json::parse(R"([
      {"apiGroups":["coordination.k8s.io"],"resources":["leases"],"verbs":["create"]},
      {"apiGroups":["coordination.k8s.io"],"resources":["leases"],
       "resourceNames":["tandem-operator"],"verbs":["get","update"]}])"));
  const json binding = namedObject(objects, "RoleBinding", "tandem-operator-leader-election");
  EXPECT_EQ(binding["metadata"]["namespace"], kNamespace);
  EXPECT_EQ(binding["roleRef"]["name"], "tandem-operator-leader-election");
  EXPECT_EQ(
      binding["subjects"],
      json::parse(R"([{"kind":"ServiceAccount","name":"tandem-operator","namespace":"llm"}])"));
  // The Lease the operator is told to use is the one the Role names.
  EXPECT_EQ(flagValue(argsOf(operatorContainer(objects)), "--leader-elect-resource-name"),
            "tandem-operator");
}

TEST_F(HelmChartTest, LintStrictPasses) {
  const HelmResult result = helm({"lint", "--strict", kChartDir.string()});
  EXPECT_EQ(result.exit_status, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("0 chart(s) failed"), std::string::npos) << result.out;
}

// Two operator replicas by default: a PodDisruptionBudget keeps a drain from
// taking both; one replica (or the value off) renders none.
TEST_F(HelmChartTest, OperatorDisruptionBudgetWithMoreThanOneReplica) {
  const json budget = namedObject(render(), "PodDisruptionBudget", "tandem-operator");
  ASSERT_TRUE(budget.contains("spec")) << "no PodDisruptionBudget tandem-operator rendered";
  EXPECT_EQ(budget["spec"]["maxUnavailable"], 1);
  const json deployment = namedObject(render(), "Deployment", "tandem-operator");
  EXPECT_EQ(budget["spec"]["selector"]["matchLabels"],
            deployment["spec"]["selector"]["matchLabels"]);
  for (const std::vector<std::string>& values :
       {std::vector<std::string>{"--set", "operator.replicas=1"},
        std::vector<std::string>{"--set", "operator.podDisruptionBudget.enabled=false"}}) {
    EXPECT_EQ(kindsOf(render(values)).count("PodDisruptionBudget"), 0u) << values[1];
  }
}

TEST_F(HelmChartTest, DefaultValuesRenderNamespacedOperator) {
  const std::vector<json> objects = render();
  const std::multiset<std::string> kinds = kindsOf(objects);
  EXPECT_EQ(kinds.count("Deployment"), 1u);
  EXPECT_EQ(kinds.count("ServiceAccount"), 2u);
  EXPECT_EQ(kinds.count("Role"), 3u);
  EXPECT_EQ(kinds.count("RoleBinding"), 3u);
  EXPECT_EQ(kinds.count("ClusterRole"), 0u);
  EXPECT_EQ(kinds.count("ClusterRoleBinding"), 0u);
  EXPECT_EQ(kinds.count("Service"), 1u);
  EXPECT_EQ(kinds.count("NetworkPolicy"), 1u);
  EXPECT_EQ(kinds.count("ServiceMonitor"), 0u);  // auto, and the API is not served
  EXPECT_EQ(kinds.count("PrefillPool"), 0u);
  EXPECT_EQ(kinds.count("Router"), 0u);
  for (const json& object : objects) {
    EXPECT_EQ(object["metadata"].value("namespace", kNamespace), kNamespace);
    const json& labels = object["metadata"]["labels"];
    EXPECT_EQ(labels.value("app.kubernetes.io/name", ""), "tandem") << object.dump();
    EXPECT_EQ(labels.value("app.kubernetes.io/instance", ""), "tandem");
    EXPECT_EQ(labels.value("app.kubernetes.io/version", ""), "0.1.0");
    EXPECT_EQ(labels.value("app.kubernetes.io/managed-by", ""), "Helm");
    EXPECT_EQ(labels.value("helm.sh/chart", ""), "tandem-0.1.0");
  }

  const json deployment = objectsOf(objects, "Deployment").at(0);
  EXPECT_EQ(deployment["spec"]["replicas"], 2);
  const json& pod = deployment["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"], "tandem-operator");
  const json container = operatorContainer(objects);
  EXPECT_EQ(container["image"], "ghcr.io/tandem/operator:0.1.0");
  const std::vector<std::string> args = argsOf(container);
  ASSERT_FALSE(args.empty());
  EXPECT_EQ(args[0], "controller");
  EXPECT_TRUE(hasArg(args, "--leader-elect"));
  EXPECT_EQ(flagValue(args, "--metrics-port"), "8080");
  EXPECT_EQ(flagValue(args, "--namespace"), kNamespace);
  EXPECT_FALSE(hasArg(args, "--all-namespaces"));
  EXPECT_EQ(flagValue(args, "--default-agent-image"), "ghcr.io/tandem/agent:0.1.0");
  EXPECT_EQ(flagValue(args, "--default-operator-image"), "ghcr.io/tandem/operator:0.1.0");
  EXPECT_EQ(flagValue(args, "--router-service-account"), "tandem-router");

  const json& security = container["securityContext"];
  EXPECT_EQ(security["runAsNonRoot"], true);
  EXPECT_EQ(security["runAsUser"], 65532);
  EXPECT_EQ(security["readOnlyRootFilesystem"], true);
  EXPECT_EQ(security["allowPrivilegeEscalation"], false);
  EXPECT_EQ(security["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(security["seccompProfile"]["type"], "RuntimeDefault");
  EXPECT_EQ(container["livenessProbe"]["httpGet"]["path"], "/healthz");
  EXPECT_EQ(container["livenessProbe"]["httpGet"]["port"], "metrics");
  EXPECT_EQ(container["readinessProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(container["ports"][0]["name"], "metrics");
  EXPECT_EQ(container["ports"][0]["containerPort"], 8080);
  EXPECT_TRUE(container["resources"].contains("requests"));

  // The router ServiceAccount the operator is told about exists.
  EXPECT_EQ(namedObject(objects, "ServiceAccount", "tandem-router")["metadata"]["namespace"],
            kNamespace);

  // RBAC: exactly the documented table, bound to the right accounts.
  EXPECT_EQ(rulesOf(namedObject(objects, "Role", "tandem-operator")), expectedOperatorRules());
  const std::map<std::string, std::set<std::string>> router_rules = {
      {"discovery.k8s.io|endpointslices", {"get", "list", "watch"}}};
  EXPECT_EQ(rulesOf(namedObject(objects, "Role", "tandem-router")), router_rules);
  const json operator_binding = namedObject(objects, "RoleBinding", "tandem-operator");
  EXPECT_EQ(operator_binding["roleRef"]["kind"], "Role");
  EXPECT_EQ(operator_binding["roleRef"]["name"], "tandem-operator");
  EXPECT_EQ(
      operator_binding["subjects"],
      json::parse(R"([{"kind":"ServiceAccount","name":"tandem-operator","namespace":"llm"}])"));
  expectLeaderElectionRole(objects);
  const json router_binding = namedObject(objects, "RoleBinding", "tandem-router");
  EXPECT_EQ(router_binding["subjects"][0]["name"], "tandem-router");

  // The metrics Service selects the operator pods.
  const json service = objectsOf(objects, "Service").at(0);
  for (const auto& [key, value] : service["spec"]["selector"].items()) {
    EXPECT_EQ(deployment["spec"]["template"]["metadata"]["labels"].value(key, ""), value) << key;
  }
  EXPECT_EQ(service["spec"]["ports"][0]["targetPort"], "metrics");
}

TEST_F(HelmChartTest, ClusterScopeUsesClusterRolesAndAllNamespaces) {
  const std::vector<json> objects = render({"--set", "rbac.scope=cluster"});
  const std::multiset<std::string> kinds = kindsOf(objects);
  EXPECT_EQ(kinds.count("ClusterRole"), 2u);
  EXPECT_EQ(kinds.count("ClusterRoleBinding"), 2u);
  EXPECT_EQ(kinds.count("Role"), 1u);
  EXPECT_EQ(kinds.count("RoleBinding"), 1u);
  expectLeaderElectionRole(objects);
  const json role = namedObject(objects, "ClusterRole", "tandem-operator");
  EXPECT_FALSE(role["metadata"].contains("namespace"));
  EXPECT_EQ(rulesOf(role), expectedOperatorRules());
  const json binding = namedObject(objects, "ClusterRoleBinding", "tandem-operator");
  EXPECT_EQ(binding["roleRef"]["kind"], "ClusterRole");
  EXPECT_EQ(binding["subjects"][0]["namespace"], kNamespace);

  const std::vector<std::string> args = argsOf(operatorContainer(objects));
  EXPECT_TRUE(hasArg(args, "--leader-elect"));
  EXPECT_TRUE(hasArg(args, "--all-namespaces"));
  EXPECT_FALSE(hasArg(args, "--namespace"));
}

TEST_F(HelmChartTest, ExamplesRenderPoolsAndRouter) {
  const std::vector<json> objects =
      render({"--set", "examples.enabled=true", "--set", "examples.gpus=2", "--set",
              "examples.pvcClaimName=weights", "--set", "examples.kvSecretName=tandem-kv", "--set",
              "examples.apiKeySecretName=tandem-api"});
  const json prefill = namedObject(objects, "PrefillPool", "prefill");
  const json decode = namedObject(objects, "DecodePool", "decode");
  const json router = namedObject(objects, "Router", "router");
  EXPECT_EQ(prefill["apiVersion"], "tandem.dev/v1alpha1");
  EXPECT_EQ(prefill["spec"]["replicas"], 1);
  EXPECT_EQ(decode["spec"]["replicas"], 2);
  for (const json& pool : {prefill, decode}) {
    EXPECT_EQ(pool["spec"]["image"], "ghcr.io/tandem/agent:0.1.0");
    EXPECT_EQ(pool["spec"]["model"]["path"], "/models/llama-3.1-8b-instruct");
    EXPECT_EQ(pool["spec"]["model"]["volume"]["persistentVolumeClaim"]["claimName"], "weights");
    EXPECT_EQ(pool["spec"]["resources"]["limits"]["nvidia.com/gpu"], 2);
    EXPECT_EQ(pool["spec"]["kvTransfer"]["secretRef"]["name"], "tandem-kv");
    EXPECT_EQ(pool["spec"]["apiKeySecretRef"], json({{"name", "tandem-api"}}));
  }
  EXPECT_EQ(router["spec"]["modelPath"], "/models/llama-3.1-8b-instruct");
  EXPECT_EQ(router["spec"]["modelVolume"]["persistentVolumeClaim"]["claimName"], "weights");
  EXPECT_EQ(router["spec"]["prefillPools"], json::array({"prefill"}));
  EXPECT_EQ(router["spec"]["decodePools"], json::array({"decode"}));
  // The router signs its pull-back holds with the pools' secret.
  EXPECT_EQ(router["spec"]["kvSecretRef"], json({{"name", "tandem-kv"}, {"key", "secret"}}));
  const json without = namedObject(render({"--set", "examples.enabled=true"}), "Router", "router");
  EXPECT_FALSE(without["spec"].contains("kvSecretRef"));
  // The API key's Secret: the router asks it of clients and sends it on.
  EXPECT_EQ(router["spec"]["apiKeySecretRef"], json({{"name", "tandem-api"}}));
  EXPECT_FALSE(without["spec"].contains("apiKeySecretRef"));
}

// examples.modelSource: the pools name the source (with the token's Secret
// and the shared cache), and the router, without a modelPath, takes its
// tokenizer from the pools' source.
TEST_F(HelmChartTest, ExamplesTakeAModelSource) {
  const std::vector<json> objects = render(
      {"--set", "examples.enabled=true", "--set", "examples.modelSource=hf://org/m@v1", "--set",
       "examples.hfTokenSecretName=hf-token", "--set", "examples.modelCacheClaimName=hf-cache"});
  for (const char* kind : {"PrefillPool", "DecodePool"}) {
    const json pool =
        namedObject(objects, kind, kind == std::string("PrefillPool") ? "prefill" : "decode");
    EXPECT_EQ(pool["spec"]["model"],
              json::parse(R"({"name": "llama-3.1-8b-instruct", "source": "hf://org/m@v1",
                  "tokenSecretRef": {"name": "hf-token"}, "cache": {"claimName": "hf-cache"}})"))
        << kind;
  }
  const json router = namedObject(objects, "Router", "router");
  EXPECT_FALSE(router["spec"].contains("modelPath"));
  EXPECT_FALSE(router["spec"].contains("modelVolume"));
  const HelmResult refused =
      helm({"template", "tandem", kChartDir.string(), "--set", "examples.enabled=true", "--set",
            "examples.modelSource=s3://bucket/m"});
  EXPECT_NE(refused.exit_status, 0);
  EXPECT_NE(refused.err.find("/examples/modelSource"), std::string::npos) << refused.err;
}

// image.registry moves every Tandem image to one registry (what `make push
// REGISTRY=...` fills), keeping each repository's path and tag; a
// repository without a registry part gets it prepended; a value that is not
// host[:port] is refused by the schema.
TEST_F(HelmChartTest, ImageRegistryReplacesTheRegistryOfEveryImage) {
  const std::vector<json> objects =
      render({"--set", "image.registry=127.0.0.1:5000", "--set", "examples.enabled=true"});
  const json container = operatorContainer(objects);
  EXPECT_EQ(container["image"], "127.0.0.1:5000/tandem/operator:0.1.0");
  const std::vector<std::string> args = argsOf(container);
  EXPECT_EQ(flagValue(args, "--default-agent-image"), "127.0.0.1:5000/tandem/agent:0.1.0");
  EXPECT_EQ(flagValue(args, "--default-operator-image"), "127.0.0.1:5000/tandem/operator:0.1.0");
  EXPECT_EQ(namedObject(objects, "PrefillPool", "prefill")["spec"]["image"],
            "127.0.0.1:5000/tandem/agent:0.1.0");
  EXPECT_EQ(namedObject(objects, "Router", "router")["spec"]["image"],
            "127.0.0.1:5000/tandem/operator:0.1.0");

  const std::vector<json> cpu =
      render({"--set", "image.registry=registry.local", "--set",
              "agentImage.repository=tandem/agent", "--set", "agentImage.tag=0.1.0-cpu"});
  EXPECT_EQ(flagValue(argsOf(operatorContainer(cpu)), "--default-agent-image"),
            "registry.local/tandem/agent:0.1.0-cpu");

  const HelmResult bad =
      helm({"template", "tandem", kChartDir.string(), "--set", "image.registry=a/b"});
  EXPECT_NE(bad.exit_status, 0);
  EXPECT_NE(bad.err.find("/image/registry"), std::string::npos) << bad.err;
}

TEST_F(HelmChartTest, NetworkPolicyAdmitsPoolsRoutersAndMonitoring) {
  const std::vector<json> objects = render();
  const std::vector<json> policies = objectsOf(objects, "NetworkPolicy");
  ASSERT_EQ(policies.size(), 1u);
  const json& spec = policies[0]["spec"];
  const json agent_labels = {{"app.kubernetes.io/managed-by", "tandem-operator"},
                             {"app.kubernetes.io/name", "tandem-agent"}};
  // The router pods' labels, as operator/controller/desired_objects.cpp sets them.
  const json router_labels = {{"app.kubernetes.io/managed-by", "tandem-operator"},
                              {"app.kubernetes.io/name", "tandem-router"}};
  EXPECT_EQ(spec["podSelector"]["matchLabels"], agent_labels);
  EXPECT_EQ(spec["policyTypes"], json::array({"Ingress"}));
  ASSERT_EQ(spec["ingress"].size(), 4u);
  const json& from_agents = spec["ingress"][0];
  EXPECT_EQ(from_agents["from"][0]["podSelector"]["matchLabels"], agent_labels);
  EXPECT_EQ(from_agents["ports"][0], json::parse(R"({"protocol":"TCP","port":1,"endPort":65535})"));
  const json& from_routers = spec["ingress"][1];
  EXPECT_EQ(from_routers["from"][0]["podSelector"]["matchLabels"], router_labels);
  EXPECT_EQ(from_routers["ports"], json::parse(R"([{"protocol":"TCP","port":8000}])"));
  // The operator's pods, as the chart's Deployment labels them.
  const json& from_operator = spec["ingress"][2];
  EXPECT_EQ(from_operator["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            "operator");
  const json operator_pod_labels = namedObject(
      objects, "Deployment", "tandem-operator")["spec"]["template"]["metadata"]["labels"];
  for (const auto& [key, value] : from_operator["from"][0]["podSelector"]["matchLabels"].items()) {
    EXPECT_EQ(operator_pod_labels.value(key, ""), value) << key;
  }
  EXPECT_EQ(from_operator["ports"], json::parse(R"([{"protocol":"TCP","port":8000}])"));
  const json& from_monitoring = spec["ingress"][3];
  EXPECT_EQ(from_monitoring["from"][0]["namespaceSelector"]["matchLabels"],
            json::parse(R"({"kubernetes.io/metadata.name":"monitoring"})"));
  EXPECT_EQ(from_monitoring["ports"], json::parse(R"([{"protocol":"TCP","port":8000}])"));

  EXPECT_EQ(kindsOf(render({"--set", "networkPolicy.enabled=false"})).count("NetworkPolicy"), 0u);
}

TEST_F(HelmChartTest, ServiceMonitorWhenEnabledOrServed) {
  const std::vector<json> forced = render({"--set", "monitoring.serviceMonitor.enabled=true"});
  const std::vector<json> monitors = objectsOf(forced, "ServiceMonitor");
  ASSERT_EQ(monitors.size(), 1u);
  EXPECT_EQ(monitors[0]["apiVersion"], "monitoring.coreos.com/v1");
  EXPECT_EQ(monitors[0]["spec"]["endpoints"][0]["port"], "metrics");
  // tandem_operator_pool_replicas carries the pool's namespace: kept as is.
  EXPECT_EQ(monitors[0]["spec"]["endpoints"][0]["honorLabels"], true);
  const json service = objectsOf(forced, "Service").at(0);
  for (const auto& [key, value] : monitors[0]["spec"]["selector"]["matchLabels"].items()) {
    EXPECT_EQ(service["metadata"]["labels"].value(key, ""), value) << key;
  }

  EXPECT_EQ(kindsOf(render({"--api-versions", "monitoring.coreos.com/v1"})).count("ServiceMonitor"),
            1u);
  EXPECT_EQ(kindsOf(render({"--api-versions", "monitoring.coreos.com/v1", "--set",
                            "monitoring.serviceMonitor.enabled=false"}))
                .count("ServiceMonitor"),
            0u);
}

TEST_F(HelmChartTest, SchemaRejectsBadValuesNamingTheField) {
  const fs::path bad_type = writeFile("bad-type.yaml", "operator:\n  replicas: \"two\"\n");
  HelmResult result = helm({"template", "tandem", kChartDir.string(), "-f", bad_type.string()});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("values don't meet the specifications of the schema"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("/operator/replicas"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("want integer"), std::string::npos) << result.err;

  result = helm({"template", "tandem", kChartDir.string(), "--set", "rbac.scope=everywhere"});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("/rbac/scope"), std::string::npos) << result.err;

  const fs::path unknown = writeFile("unknown.yaml", "replicaCount: 3\n");
  result = helm({"template", "tandem", kChartDir.string(), "-f", unknown.string()});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("replicaCount"), std::string::npos) << result.err;
}

// Every release name Helm allows (up to 53 characters, dots included) gives
// Services Kubernetes accepts: DNS-1035 labels of at most 63 characters. A
// 40-character name made a 77-character metrics Service, and `my.rel` one
// with dots. A name that cannot start one is refused naming the cause.
TEST_F(HelmChartTest, EveryReleaseNameGivesValidServiceNames) {
  const std::regex dns1035("[a-z]([-a-z0-9]*[a-z0-9])?");
  for (const std::string release :
       {"abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi", "my.rel", "t"}) {
    const HelmResult result =
        helm({"template", release, kChartDir.string(), "--namespace", kNamespace, "--set",
              "monitoring.serviceMonitor.enabled=true", "--set", "examples.enabled=true"});
    ASSERT_EQ(result.exit_status, 0) << result.err;
    const std::vector<json> objects = testing::yamlDocumentsToJson(result.out);
    int services = 0;
    for (const json& service : objectsOf(objects, "Service")) {
      const std::string name = service["metadata"]["name"];
      EXPECT_LE(name.size(), 63u) << name;
      EXPECT_TRUE(std::regex_match(name, dns1035)) << name;
      ++services;
    }
    EXPECT_GE(services, 1) << release;
  }
  const HelmResult digit = helm({"template", "1rel", kChartDir.string()});
  EXPECT_NE(digit.exit_status, 0);
  EXPECT_NE(digit.err.find("\"1rel-tandem\" must start with a lowercase letter"), std::string::npos)
      << digit.err;
}

// A repository pinned by digest is used as it is, not given a tag after it.
TEST_F(HelmChartTest, AnImagePinnedByDigestHasNoTagAppended) {
  const std::string pinned = "ghcr.io/t/operator@sha256:" + std::string(64, 'a');
  const std::vector<json> objects = render({"--set", "operator.image.repository=" + pinned});
  EXPECT_EQ(operatorContainer(objects)["image"], pinned);
  EXPECT_EQ(flagValue(argsOf(operatorContainer(objects)), "--default-operator-image"), pinned);
}

// Names, label keys and selectors that Kubernetes would refuse are refused
// by the schema, naming the value, rather than rendered.
TEST_F(HelmChartTest, SchemaRefusesNamesAndSelectorsKubernetesWould) {
  for (const auto& [value, path] : std::vector<std::pair<std::string, std::string>>{
           {"nameOverride=Foo_Bar", "/nameOverride"},
           {"fullnameOverride=MyTandem", "/fullnameOverride"},
           {"operator.serviceAccount.name=Bad Name", "/operator/serviceAccount/name"},
           {"router.serviceAccount.name=a:b", "/router/serviceAccount/name"},
           {"operator.workers=65", "/operator/workers"},
           {"monitoring.namespaceSelector.foo=bar", "/monitoring/namespaceSelector"},
           {"monitoring.dashboard.labelKey=a: b", "/monitoring/dashboard/labelKey"}}) {
    const HelmResult result = helm({"template", "tandem", kChartDir.string(), "--set", value});
    EXPECT_NE(result.exit_status, 0) << value;
    EXPECT_NE(result.err.find(path), std::string::npos) << value << ": " << result.err;
  }
}

// A value set to null (`--set router=null`, or `router: null` in a values
// file) takes its key out of the values: for every key of values.yaml, the
// chart then renders or the schema refuses it naming the key, never a
// template failing on a nil pointer.
TEST_F(HelmChartTest, EveryValueSetToNullRendersOrIsRefusedNamingIt) {
  std::ifstream in(kChartDir / "values.yaml");
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<json> documents = testing::yamlDocumentsToJson(text.str());
  ASSERT_EQ(documents.size(), 1u);
  std::vector<std::pair<std::string, std::string>> keys;  // --set path, schema location
  auto walk = [&](auto&& self, const json& node, const std::string& path,
                  const std::string& location) -> void {
    for (const auto& [key, value] : node.items()) {
      // --set cannot name a key with a dot (label keys such as
      // kubernetes.io/metadata.name).
      if (key.find('.') != std::string::npos) continue;
      keys.emplace_back(path + key, location);
      if (value.is_object()) self(self, value, path + key + ".", location + "/" + key);
    }
  };
  walk(walk, documents[0], "", "");
  ASSERT_GT(keys.size(), 50u);
  int refused = 0;
  for (const auto& [path, location] : keys) {
    const std::string leaf = path.substr(path.rfind('.') + 1);
    const HelmResult result = helm({"template", "tandem", kChartDir.string(), "--set",
                                    "examples.enabled=true", "--set", path + "=null"});
    if (result.exit_status == 0) continue;
    ++refused;
    EXPECT_NE(result.err.find("don't meet the specifications of the schema"), std::string::npos)
        << path << ": " << result.err;
    EXPECT_NE(result.err.find("at '" + location + "': missing property '" + leaf + "'"),
              std::string::npos)
        << path << ": " << result.err;
  }
  // The sections themselves are among them.
  EXPECT_GE(refused, 9);
}

// --- Monitoring: the Grafana dashboard, the PodMonitor and the PrometheusRule ---

TEST_F(HelmChartTest, DashboardConfigMapCarriesTheSidecarLabelAndThePanels) {
  const json config_map = namedObject(render(), "ConfigMap", "tandem-dashboard");
  EXPECT_EQ(config_map["metadata"]["labels"].value("grafana_dashboard", ""), "1");
  EXPECT_EQ(config_map["metadata"]["annotations"].value("grafana_folder", ""), "Tandem");
  const json dashboard =
      json::parse(config_map["data"].value("tandem.json", ""), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(dashboard.is_object()) << "the dashboard is not valid JSON";
  EXPECT_EQ(dashboard["uid"], "tandem-overview");

  std::set<std::string> variables;
  for (const json& variable : dashboard["templating"]["list"]) variables.insert(variable["name"]);
  EXPECT_EQ(variables, (std::set<std::string>{"datasource", "namespace", "pool"}));

  std::set<std::string> titles;
  for (const json& panel : dashboard["panels"]) {
    titles.insert(panel["title"]);
    EXPECT_EQ(panel["datasource"]["uid"], "${datasource}") << panel["title"];
    ASSERT_FALSE(panel["targets"].empty()) << panel["title"];
    for (const json& target : panel["targets"]) {
      const std::string expr = target["expr"];
      // Every rate follows the scrape interval Grafana knows of.
      for (size_t at = expr.find("rate("); at != std::string::npos;
           at = expr.find("rate(", at + 1)) {
        const size_t window = expr.find('[', at);
        ASSERT_NE(window, std::string::npos) << expr;
        EXPECT_EQ(expr.substr(window, 18), "[$__rate_interval]") << expr;
      }
      EXPECT_NE(expr.find("namespace=~\"$namespace\""), std::string::npos) << expr;
    }
  }
  const std::set<std::string> expected = {"Time to first token by pool (agents)",
                                          "Inter-token latency by pool (agents)",
                                          "Requests by finish reason",
                                          "Token throughput",
                                          "Queue depth",
                                          "KV cache usage",
                                          "Prefix cache hit rate",
                                          "KV transfer bytes/s",
                                          "KV transfer failures by reason",
                                          "Router decisions",
                                          "Router prefix overlap",
                                          "Router time to first token (client side)",
                                          "Router inter-token latency (client side)",
                                          "Replicas desired vs ready",
                                          "Client connections"};
  EXPECT_EQ(titles, expected);

  // The label, its value and the folder annotation are the user's.
  const json custom =
      namedObject(render({"--set", "monitoring.dashboard.labelKey=dashboards", "--set",
                          "monitoring.dashboard.labelValue=tandem", "--set",
                          "monitoring.dashboard.folderAnnotation=k8s-sidecar-target-directory",
                          "--set", "monitoring.dashboard.folder=/tmp/dashboards/llm"}),
                  "ConfigMap", "tandem-dashboard");
  EXPECT_EQ(custom["metadata"]["labels"].value("dashboards", ""), "tandem");
  EXPECT_FALSE(custom["metadata"]["labels"].contains("grafana_dashboard"));
  EXPECT_EQ(custom["metadata"]["annotations"],
            json::parse(R"({"k8s-sidecar-target-directory":"/tmp/dashboards/llm"})"));
  EXPECT_EQ(kindsOf(render({"--set", "monitoring.dashboard.enabled=false"})).count("ConfigMap"),
            0u);
}

TEST_F(HelmChartTest, PodMonitorScrapesManagedPodsWithPoolAndComponentLabels) {
  EXPECT_EQ(kindsOf(render()).count("PodMonitor"), 0u);  // auto, and the API is not served
  EXPECT_EQ(kindsOf(render({"--api-versions", "monitoring.coreos.com/v1", "--set",
                            "monitoring.podMonitor.enabled=false"}))
                .count("PodMonitor"),
            0u);
  const json monitor = namedObject(render({"--api-versions", "monitoring.coreos.com/v1", "--set",
                                           "monitoring.podMonitor.labels.release=prometheus"}),
                                   "PodMonitor", "tandem-workloads");
  EXPECT_EQ(monitor["apiVersion"], "monitoring.coreos.com/v1");
  EXPECT_EQ(monitor["metadata"]["labels"].value("release", ""), "prometheus");
  const json& spec = monitor["spec"];
  // Agents and routers alike: operator/controller/desired_objects.cpp labels
  // both managed-by tandem-operator and names their port "http".
  EXPECT_EQ(spec["selector"]["matchLabels"],
            json::parse(R"({"app.kubernetes.io/managed-by":"tandem-operator"})"));
  EXPECT_EQ(spec["namespaceSelector"], json::parse(R"({"matchNames":["llm"]})"));
  ASSERT_EQ(spec["podMetricsEndpoints"].size(), 1u);
  const json& endpoint = spec["podMetricsEndpoints"][0];
  EXPECT_EQ(endpoint["port"], "http");
  EXPECT_EQ(endpoint["path"], "/metrics");
  EXPECT_EQ(endpoint["interval"], "15s");
  std::map<std::string, std::string> relabelled;
  for (const json& relabel : endpoint["relabelings"]) {
    ASSERT_EQ(relabel["sourceLabels"].size(), 1u) << relabel.dump();
    relabelled[relabel["targetLabel"]] = relabel["sourceLabels"][0];
  }
  EXPECT_EQ(relabelled,
            (std::map<std::string, std::string>{
                {"pool", "__meta_kubernetes_pod_label_tandem_dev_pool"},
                {"component", "__meta_kubernetes_pod_label_app_kubernetes_io_component"},
                {"namespace", "__meta_kubernetes_namespace"},
                {"pod", "__meta_kubernetes_pod_name"}}));

  const json everywhere = namedObject(
      render({"--set", "monitoring.podMonitor.enabled=true", "--set", "rbac.scope=cluster"}),
      "PodMonitor", "tandem-workloads");
  EXPECT_EQ(everywhere["spec"]["namespaceSelector"], json::parse(R"({"any":true})"));
}

// The rules of the rendered PrometheusRule, by alert name (each once).
std::map<std::string, json> alertRules(const std::vector<json>& objects) {
  std::map<std::string, json> rules;
  for (const json& object : objectsOf(objects, "PrometheusRule")) {
    for (const json& group : object["spec"]["groups"]) {
      for (const json& rule : group["rules"]) {
        EXPECT_FALSE(rules.count(rule["alert"])) << rule["alert"] << " twice";
        rules[rule["alert"]] = rule;
      }
    }
  }
  return rules;
}

TEST_F(HelmChartTest, PrometheusRuleOnlyWhenSwitchedOnWithTargetsFromValues) {
  EXPECT_EQ(kindsOf(render()).count("PrometheusRule"), 0u);
  EXPECT_EQ(kindsOf(render({"--api-versions", "monitoring.coreos.com/v1", "--set",
                            "monitoring.prometheusRule.enabled=false"}))
                .count("PrometheusRule"),
            0u);
  EXPECT_EQ(
      kindsOf(render({"--set", "monitoring.prometheusRule.enabled=true"})).count("PrometheusRule"),
      1u);

  std::map<std::string, json> rules =
      alertRules(render({"--api-versions", "monitoring.coreos.com/v1"}));
  std::set<std::string> names;
  for (const auto& [name, rule] : rules) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"TandemTTFTHigh", "TandemITLHigh",
                                          "TandemKVTransferFailures", "TandemConnectionsRefused",
                                          "TandemPoolNoReadyAgent", "TandemOperatorNotLeading"}));
  EXPECT_EQ(rules["TandemTTFTHigh"]["expr"],
            "histogram_quantile(0.95, sum by (namespace, pool, le) "
            "(rate(tandem_time_to_first_token_seconds_bucket{namespace=\"llm\", pool!=\"\"}[5m]))) "
            "> 2");
  EXPECT_EQ(rules["TandemTTFTHigh"]["for"], "10m");
  EXPECT_EQ(rules["TandemTTFTHigh"]["labels"], json::parse(R"({"severity":"warning"})"));
  EXPECT_NE(rules["TandemITLHigh"]["expr"].get<std::string>().find("> 0.2"), std::string::npos);
  EXPECT_NE(rules["TandemPoolNoReadyAgent"]["expr"].get<std::string>().find(
                "tandem_operator_pool_replicas{namespace=\"llm\", state=\"ready\"}"),
            std::string::npos);
  EXPECT_EQ(rules["TandemConnectionsRefused"]["expr"],
            "sum by (namespace, pod) (increase(tandem_http_connections_over_limit_total"
            "{namespace=\"llm\", action=\"refused\"}[5m])) > 0");
  EXPECT_EQ(rules["TandemConnectionsRefused"]["labels"]["severity"], "warning");
  EXPECT_EQ(rules["TandemPoolNoReadyAgent"]["labels"]["severity"], "critical");
  EXPECT_NE(rules["TandemOperatorNotLeading"]["expr"].get<std::string>().find(
                "absent(tandem_operator_is_leader{namespace=\"llm\"})"),
            std::string::npos);

  // Per-pool targets, durations, severities and extra labels from values.
  const fs::path values = writeFile("alerts.yaml", R"(monitoring:
  prometheusRule:
    enabled: true
    rateWindow: 2m
    ruleLabels: {team: serving}
    ttftP95Seconds: 3
    poolTargets:
      - {pool: fast, ttftP95Seconds: 0.5}
      - {pool: chat, ttftP95Seconds: 1, itlP95Seconds: 0.05}
    alerts:
      ttftHigh: {for: 1m, severity: page}
      kvTransferFailures: {for: 0s, severity: info, threshold: 10}
      connectionsRefused: {for: 1m, severity: page, threshold: 3}
)");
  rules = alertRules(render({"-f", values.string(), "--set", "rbac.scope=cluster"}));
  const std::string quantile =
      "histogram_quantile(0.95, sum by (namespace, pool, le) "
      "(rate(tandem_time_to_first_token_seconds_bucket{";
  EXPECT_EQ(rules["TandemTTFTHigh"]["expr"],
            quantile + "pool!=\"\", pool!~\"fast|chat\"}[2m]))) > 3\nor " + quantile +
                "pool=\"fast\"}[2m]))) > 0.5\nor " + quantile + "pool=\"chat\"}[2m]))) > 1");
  EXPECT_EQ(rules["TandemTTFTHigh"]["for"], "1m");
  EXPECT_EQ(rules["TandemTTFTHigh"]["labels"],
            json::parse(R"({"severity":"page","team":"serving"})"));
  const std::string itl = rules["TandemITLHigh"]["expr"];
  EXPECT_NE(itl.find("pool!~\"chat\"}[2m]))) > 0.2"), std::string::npos) << itl;
  EXPECT_NE(itl.find("pool=\"chat\"}[2m]))) > 0.05"), std::string::npos) << itl;
  EXPECT_EQ(itl.find("fast"), std::string::npos) << itl;
  EXPECT_EQ(rules["TandemKVTransferFailures"]["expr"],
            "sum by (namespace, pool, reason) "
            "(increase(tandem_kv_transfer_failures_total{}[2m])) > 10");
  EXPECT_EQ(rules["TandemKVTransferFailures"]["for"], "0s");
  EXPECT_EQ(rules["TandemKVTransferFailures"]["labels"]["severity"], "info");
  EXPECT_EQ(rules["TandemConnectionsRefused"]["expr"],
            "sum by (namespace, pod) (increase(tandem_http_connections_over_limit_total"
            "{action=\"refused\"}[2m])) > 3");
  EXPECT_EQ(rules["TandemConnectionsRefused"]["for"], "1m");
  EXPECT_EQ(rules["TandemConnectionsRefused"]["labels"]["severity"], "page");
  EXPECT_EQ(rules["TandemPoolNoReadyAgent"]["labels"]["team"], "serving");
}

TEST_F(HelmChartTest, SchemaRejectsBadAlertValuesNamingTheField) {
  const fs::path zero =
      writeFile("zero.yaml", "monitoring:\n  prometheusRule:\n    ttftP95Seconds: 0\n");
  HelmResult result = helm({"template", "tandem", kChartDir.string(), "-f", zero.string()});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("at '/monitoring/prometheusRule/ttftP95Seconds': exclusiveMinimum"),
            std::string::npos)
      << result.err;

  const fs::path duration = writeFile(
      "duration.yaml",
      "monitoring:\n  prometheusRule:\n    alerts:\n      itlHigh: {for: soon, severity: page}\n");
  result = helm({"template", "tandem", kChartDir.string(), "-f", duration.string()});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("at '/monitoring/prometheusRule/alerts/itlHigh/for': 'soon' does not "
                            "match pattern"),
            std::string::npos)
      << result.err;

  const fs::path pool = writeFile("pool.yaml",
                                  "monitoring:\n  prometheusRule:\n    poolTargets:\n      - "
                                  "{pool: Fast_Pool, ttftP95Seconds: 1}\n");
  result = helm({"template", "tandem", kChartDir.string(), "-f", pool.string()});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("/monitoring/prometheusRule/poolTargets/0/pool"), std::string::npos)
      << result.err;

  result = helm({"template", "tandem", kChartDir.string(), "--set",
                 "monitoring.podMonitor.enabled=sometimes"});
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.err.find("/monitoring/podMonitor/enabled"), std::string::npos) << result.err;
}

std::string readBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The CRD files (*.yaml) of a directory, by file name.
std::set<std::string> crdFiles(const fs::path& dir) {
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") names.insert(entry.path().filename().string());
  }
  return names;
}

// charts/tandem/crds/ (first installs) and charts/tandem-crds/templates/
// (upgrades) are both copies of crds/.
TEST_F(HelmChartTest, ChartCrdsAreTheRepositoryCrds) {
  const fs::path repository_crds = kSourceDir / "crds";
  const std::set<std::string> names = crdFiles(repository_crds);
  ASSERT_FALSE(names.empty());
  for (const fs::path& chart_crds :
       {kChartDir / "crds", kSourceDir / "charts/tandem-crds/templates"}) {
    // Only CRD files: anything else there would be applied too.
    std::set<std::string> chart_files;
    for (const fs::directory_entry& entry : fs::directory_iterator(chart_crds)) {
      chart_files.insert(entry.path().filename().string());
    }
    EXPECT_EQ(chart_files, names) << "copy crds/*.yaml to " << chart_crds;
    for (const std::string& name : names) {
      EXPECT_EQ(readBytes(chart_crds / name), readBytes(repository_crds / name))
          << name << " differs from crds/" << name << "; copy it to " << chart_crds;
    }
  }
  const HelmResult lint = helm({"lint", "--strict", (kSourceDir / "charts/tandem-crds").string()});
  EXPECT_EQ(lint.exit_status, 0) << lint.out << lint.err;
}

}  // namespace
}  // namespace tandem
