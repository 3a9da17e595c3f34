// A user's pod-template fragment merged into the generated one: what the
// user adds arrives exactly, what the controller owns stays the controller's
// and is listed, and nothing generated is lost.
#include "operator/spec/pod_template.h"

#include <gtest/gtest.h>

#include <map>

namespace tandem::spec {
namespace {

using nlohmann::json;

// Paths of `ignored`, in the order the merge lists them.
using Paths = std::vector<std::string>;

const std::vector<std::string> kPoolOwned = {"terminationGracePeriodSeconds"};

// The shape of a pool's generated template (desired_objects.cpp), with a KV secret.
const json kGenerated = json::parse(R"({
  "metadata": {"labels": {"app.kubernetes.io/name": "tandem-agent",
                          "tandem.dev/pool": "decode", "tandem.dev/role": "decode"}},
  "spec": {
    "terminationGracePeriodSeconds": 45,
    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                {"name": "model", "hostPath": {"path": "/models/tiny"}}],
    "containers": [{
      "name": "agent",
      "image": "ghcr.io/tandem/agent:1.0",
      "command": ["tandem-agent"],
      "args": ["--model-dir", "/models/tiny", "--host", "0.0.0.0", "--port", "8000"],
      "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
              {"name": "TANDEM_KV_SECRET",
               "valueFrom": {"secretKeyRef": {"name": "kv", "key": "secret"}}}],
      "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
      "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
      "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
      "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "failureThreshold": 60},
      "terminationMessagePolicy": "FallbackToLogsOnError",
      "resources": {"limits": {"nvidia.com/gpu": 1}},
      "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                       {"name": "model", "mountPath": "/models/tiny", "readOnly": true}]}]}})");

// Every field of `generated` is in `merged` with the same value; lists keep
// their generated entries first, in order.
void expectKeepsGenerated(const json& generated, const json& merged, const std::string& path) {
  SCOPED_TRACE(path);
  if (generated.is_object()) {
    ASSERT_TRUE(merged.is_object());
    for (const auto& [key, value] : generated.items()) {
      ASSERT_TRUE(merged.contains(key)) << key;
      expectKeepsGenerated(value, merged[key], path + "." + key);
    }
  } else if (generated.is_array()) {
    ASSERT_TRUE(merged.is_array());
    ASSERT_GE(merged.size(), generated.size());
    for (size_t index = 0; index < generated.size(); ++index) {
      expectKeepsGenerated(generated[index], merged[index],
                           path + "[" + std::to_string(index) + "]");
    }
  } else {
    EXPECT_EQ(merged, generated);
  }
}

const json& agentOf(const json& pod_template) { return pod_template["spec"]["containers"][0]; }

json withSpec(json spec) { return {{"spec", std::move(spec)}}; }

TEST(PodTemplateTest, EmptyOrNullFragmentReturnsGeneratedUnchanged) {
  for (const json& fragment :
       {json(), json::object(), json{{"metadata", json::object()}, {"spec", json::object()}},
        json{{"spec", {{"tolerations", nullptr}}}}}) {
    SCOPED_TRACE(fragment.dump());
    const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
    EXPECT_EQ(result.pod_template, kGenerated);
    EXPECT_TRUE(result.ignored.empty());
  }
}

TEST(PodTemplateTest, UserAdditionsArriveExactlyAndGeneratedFieldsStay) {
  const json fragment = json::parse(R"({
    "metadata": {"annotations": {"prometheus.io/scrape": "true"}},
    "spec": {
      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
      "nodeSelector": {"nvidia.com/gpu.product": "H100-SXM"},
      "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
          {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}]}}},
      "priorityClassName": "inference-high",
      "runtimeClassName": "nvidia",
      "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}}],
      "containers": [
        {"name": "agent",
         "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
         "envFrom": [{"secretRef": {"name": "hf-token"}}],
         "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        {"name": "log-shipper", "image": "fluent/fluent-bit:3.0",
         "args": ["-c", "/etc/fluent-bit.conf"]}]}})");
  const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(result.ignored.empty());
  const json& merged = result.pod_template;
  expectKeepsGenerated(kGenerated, merged, "template");

  const json& spec = fragment["spec"];
  EXPECT_EQ(merged["metadata"]["annotations"], fragment["metadata"]["annotations"]);
  EXPECT_EQ(merged["spec"]["tolerations"], spec["tolerations"]);
  EXPECT_EQ(merged["spec"]["nodeSelector"], spec["nodeSelector"]);
  EXPECT_EQ(merged["spec"]["affinity"], spec["affinity"]);
  EXPECT_EQ(merged["spec"]["priorityClassName"], "inference-high");
  EXPECT_EQ(merged["spec"]["runtimeClassName"], "nvidia");
  ASSERT_EQ(merged["spec"]["volumes"].size(), 3u);
  EXPECT_EQ(merged["spec"]["volumes"][2], spec["volumes"][0]);
  ASSERT_EQ(merged["spec"]["containers"].size(), 2u);
  EXPECT_EQ(merged["spec"]["containers"][1], spec["containers"][1]);

  const json& agent = agentOf(merged);
  EXPECT_EQ(agent["securityContext"], json::parse(R"({"capabilities": {"add": ["IPC_LOCK"]}})"));
  EXPECT_EQ(agent["envFrom"], json::parse(R"([{"secretRef": {"name": "hf-token"}}])"));
  ASSERT_EQ(agent["volumeMounts"].size(), 3u);
  EXPECT_EQ(agent["volumeMounts"][2], json::parse(R"({"name": "cache", "mountPath": "/cache"})"));

  // Nothing else appeared: the merged template is the generated one plus exactly these.
  json expected = kGenerated;
  expected["metadata"]["annotations"] = fragment["metadata"]["annotations"];
  for (const char* key :
       {"tolerations", "nodeSelector", "affinity", "priorityClassName", "runtimeClassName"}) {
    expected["spec"][key] = spec[key];
  }
  expected["spec"]["volumes"].push_back(spec["volumes"][0]);
  expected["spec"]["containers"].push_back(spec["containers"][1]);
  json& expected_agent = expected["spec"]["containers"][0];
  expected_agent["securityContext"] = spec["containers"][0]["securityContext"];
  expected_agent["envFrom"] = spec["containers"][0]["envFrom"];
  expected_agent["volumeMounts"].push_back(spec["containers"][0]["volumeMounts"][0]);
  EXPECT_EQ(merged, expected);
}

TEST(PodTemplateTest, OverridesOfOwnedFieldsAreListedAndGeneratedValuesStay) {
  const json fragment = json::parse(R"({
    "metadata": {"labels": {"tandem.dev/pool": "prefill"}},
    "spec": {
      "terminationGracePeriodSeconds": 5,
      "volumes": [{"name": "dshm", "emptyDir": {}}],
      "containers": [{
        "name": "agent",
        "image": "evil/agent:latest",
        "args": ["--host", "0.0.0.0"],
        "env": [{"name": "POD_IP", "value": "10.0.0.1"},
                {"name": "TANDEM_KV_SECRET", "value": "guessable"}],
        "volumeMounts": [{"name": "other", "mountPath": "/dev/shm"}]}]}})");
  const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(
      result.ignored,
      (Paths{"template.metadata.labels.tandem.dev/pool", "template.spec.containers[agent].args",
             "template.spec.containers[agent].env[POD_IP]",
             "template.spec.containers[agent].env[TANDEM_KV_SECRET]",
             "template.spec.containers[agent].image",
             "template.spec.containers[agent].volumeMounts[/dev/shm]",
             "template.spec.terminationGracePeriodSeconds", "template.spec.volumes[dshm]"}));
  EXPECT_EQ(result.pod_template, kGenerated);
}

TEST(PodTemplateTest, OwnedValuesEqualToGeneratedAreNotListed) {
  const json& agent = agentOf(kGenerated);
  const json fragment = {
      {"metadata", {{"labels", {{"tandem.dev/pool", "decode"}}}}},
      {"spec",
       {{"terminationGracePeriodSeconds", 45},
        {"volumes", json::array({kGenerated["spec"]["volumes"][0]})},
        {"containers",
         json::array({{{"name", "agent"},
                       {"image", agent["image"]},
                       {"args", agent["args"]},
                       {"env", json::array({agent["env"][0]})},
                       {"volumeMounts", json::array({agent["volumeMounts"][0]})}}})}}}};
  const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(result.ignored.empty());
  EXPECT_EQ(result.pod_template, kGenerated);
}

TEST(PodTemplateTest, MetadataAddsLabelsAndAnnotationsAndRefusesOtherKeys) {
  const json fragment = json::parse(R"({"metadata": {
    "labels": {"team": "search", "tandem.dev/role": "decode"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "name": "renamed", "finalizers": ["x"]}})");
  const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(result.ignored, (Paths{"template.metadata.finalizers", "template.metadata.name"}));
  json expected = kGenerated;
  expected["metadata"]["labels"]["team"] = "search";
  expected["metadata"]["annotations"] = {{"sidecar.istio.io/inject", "false"}};
  EXPECT_EQ(result.pod_template, expected);
}

TEST(PodTemplateTest, NodeSelectorIsAUnionWhereGeneratedKeysWin) {
  json generated = kGenerated;
  generated["spec"]["nodeSelector"] = {{"kubernetes.io/os", "linux"}};
  const json fragment =
      withSpec({{"nodeSelector", {{"kubernetes.io/os", "windows"}, {"pool", "gpu"}}}});
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(result.ignored, (Paths{"template.spec.nodeSelector.kubernetes.io/os"}));
  EXPECT_EQ(result.pod_template["spec"]["nodeSelector"],
            (json{{"kubernetes.io/os", "linux"}, {"pool", "gpu"}}));
}

TEST(PodTemplateTest, AffinityAndPodSecurityContextAreDeepMerged) {
  json generated = kGenerated;
  generated["spec"]["securityContext"] = {{"runAsNonRoot", true}, {"fsGroup", 1000}};
  generated["spec"]["affinity"] = json::parse(R"({"podAntiAffinity": {
    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}})");
  const json fragment = json::parse(R"({"spec": {
    "securityContext": {"fsGroup": 2000, "runAsUser": 1001, "seccompProfile": {"type": "RuntimeDefault"}},
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5}]},
                 "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 9}]}}}})");
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(result.ignored.empty());
  EXPECT_EQ(result.pod_template["spec"]["securityContext"], json::parse(R"({
    "runAsNonRoot": true, "fsGroup": 2000, "runAsUser": 1001,
    "seccompProfile": {"type": "RuntimeDefault"}})"));
  EXPECT_EQ(result.pod_template["spec"]["affinity"], fragment["spec"]["affinity"]);
}

TEST(PodTemplateTest, AtomicListsAreReplacedByTheUsers) {
  json generated = kGenerated;
  generated["spec"]["tolerations"] = json::parse(R"([{"key": "a", "operator": "Exists"}])");
  const json fragment = json::parse(R"({"spec": {
    "tolerations": [{"key": "b", "operator": "Exists"}, {"key": "c", "operator": "Exists"}],
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                   "whenUnsatisfiable": "ScheduleAnyway"}]}})");
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(result.ignored.empty());
  EXPECT_EQ(result.pod_template["spec"]["tolerations"], fragment["spec"]["tolerations"]);
  EXPECT_EQ(result.pod_template["spec"]["topologySpreadConstraints"],
            fragment["spec"]["topologySpreadConstraints"]);
}

// An empty list or map in the user's template is what the API server stores
// as none: it is left out (a desired `tolerations: []` would never be found
// on the live object, and every reconcile would apply it again), and an
// empty list still replaces a generated one.
TEST(PodTemplateTest, EmptyListsAndMapsAreLeftOut) {
  json generated = kGenerated;
  generated["spec"]["tolerations"] = json::parse(R"([{"key": "a", "operator": "Exists"}])");
  const json fragment = json::parse(R"({"spec": {"tolerations": [],
      "topologySpreadConstraints": [], "nodeSelector": {}, "affinity": {}}})");
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(result.ignored.empty());
  for (const char* key : {"tolerations", "topologySpreadConstraints", "nodeSelector", "affinity"}) {
    EXPECT_FALSE(result.pod_template["spec"].contains(key)) << key << ": " << result.pod_template;
  }
}

TEST(PodTemplateTest, PodListsMergeByName) {
  json generated = kGenerated;
  generated["spec"]["imagePullSecrets"] = json::parse(R"([{"name": "registry"}])");
  generated["spec"]["initContainers"] =
      json::parse(R"([{"name": "warmup", "image": "busybox", "args": ["true"]}])");
  const json fragment = json::parse(R"({"spec": {
    "imagePullSecrets": [{"name": "registry"}, {"name": "mirror"}],
    "initContainers": [{"name": "warmup", "args": ["sleep", "1"]},
                       {"name": "fetch-model", "image": "curl"}],
    "volumes": [{"name": "model", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}],
    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}]}})");
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(result.ignored, (Paths{"template.spec.volumes[model]"}));
  const json& spec = result.pod_template["spec"];
  EXPECT_EQ(spec["imagePullSecrets"], json::parse(R"([{"name": "registry"}, {"name": "mirror"}])"));
  EXPECT_EQ(spec["initContainers"], json::parse(R"([
    {"name": "warmup", "image": "busybox", "args": ["sleep", "1"]},
    {"name": "fetch-model", "image": "curl"}])"));
  // Dynamic Resource Allocation: the claims a container's resources.claims names.
  EXPECT_EQ(spec["resourceClaims"],
            json::parse(R"([{"name": "gpu", "resourceClaimTemplateName": "one-h100"}])"));
  json volumes = kGenerated["spec"]["volumes"];
  volumes.push_back(fragment["spec"]["volumes"][1]);
  EXPECT_EQ(spec["volumes"], volumes);
}

TEST(PodTemplateTest, MainContainerMergesEnvMountsResourcesAndTakesOtherKeys) {
  const json fragment = json::parse(R"({"spec": {"containers": [{
    "name": "agent",
    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "UCX_TLS", "value": "rc,cuda_copy"}],
    "envFrom": [{"configMapRef": {"name": "tuning"}}],
    "volumeMounts": [{"name": "dshm", "mountPath": "/scratch"}],
    "resources": {"limits": {"rdma/hca_shared_devices_a": 1}, "requests": {"cpu": "8"}},
    "securityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_RESOURCE"]}},
    "imagePullPolicy": "Always",
    "workingDir": "/work",
    "terminationMessagePolicy": "File",
    "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}]}})");
  json generated = kGenerated;
  generated["spec"]["containers"][0]["envFrom"] =
      json::parse(R"([{"secretRef": {"name": "base"}}])");
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(result.ignored.empty());
  const json& user = fragment["spec"]["containers"][0];
  json expected = generated["spec"]["containers"][0];
  expected["env"].push_back(user["env"][0]);
  expected["env"].push_back(user["env"][1]);
  expected["envFrom"].push_back(user["envFrom"][0]);
  expected["volumeMounts"].push_back(user["volumeMounts"][0]);
  expected["resources"] = json::parse(R"({
    "limits": {"nvidia.com/gpu": 1, "rdma/hca_shared_devices_a": 1}, "requests": {"cpu": "8"}})");
  for (const char* key : {"securityContext", "imagePullPolicy", "workingDir",
                          "terminationMessagePolicy", "lifecycle"}) {
    expected[key] = user[key];
  }
  EXPECT_EQ(agentOf(result.pod_template), expected);
}

TEST(PodTemplateTest, ScalarPodKeysAreTheUsersUnlessOwned) {
  const json fragment = json::parse(R"({"spec": {
    "priorityClassName": "high", "runtimeClassName": "nvidia", "schedulerName": "volcano",
    "serviceAccountName": "custom", "hostNetwork": true, "hostIPC": true,
    "dnsPolicy": "ClusterFirstWithHostNet", "enableServiceLinks": false,
    "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]}}})");
  const TemplateMergeResult pool = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_TRUE(pool.ignored.empty());
  json expected = kGenerated;
  for (const auto& [key, value] : fragment["spec"].items()) expected["spec"][key] = value;
  EXPECT_EQ(pool.pod_template, expected);

  // A router's service account is the controller's; an owned field the
  // generated template lacks is refused without leaving anything behind.
  const json router_generated = json::parse(R"({
    "metadata": {"labels": {"tandem.dev/router": "front"}},
    "spec": {"serviceAccountName": "tandem-router",
             "containers": [{"name": "router", "image": "ghcr.io/tandem/operator:1.0"}]}})");
  const TemplateMergeResult router =
      mergePodTemplate(router_generated, fragment, "router",
                       {"serviceAccountName", "terminationGracePeriodSeconds", "hostNetwork"});
  EXPECT_EQ(router.ignored,
            (Paths{"template.spec.hostNetwork", "template.spec.serviceAccountName"}));
  EXPECT_EQ(router.pod_template["spec"]["serviceAccountName"], "tandem-router");
  EXPECT_FALSE(router.pod_template["spec"].contains("hostNetwork"));
  EXPECT_EQ(router.pod_template["spec"]["priorityClassName"], "high");
}

TEST(PodTemplateTest, RouterContainerOwnsItsFieldsAndGetsEnv) {
  // The router's generated container has no env and no startup probe: the
  // user's env arrives, a startup probe stays the controller's (none).
  const json generated = json::parse(R"({
    "metadata": {"labels": {"tandem.dev/router": "front"}},
    "spec": {"containers": [{"name": "router", "image": "op:1", "args": ["router"]}]}})");
  const json fragment = json::parse(R"({"spec": {"containers": [{"name": "router",
    "env": [{"name": "LOG_LEVEL", "value": "debug"}],
    "startupProbe": {"httpGet": {"path": "/metrics", "port": "http"}},
    "command": ["sh"]}]}})");
  const TemplateMergeResult result =
      mergePodTemplate(generated, fragment, "router", {"serviceAccountName"});
  EXPECT_EQ(result.ignored, (Paths{"template.spec.containers[router].command",
                                   "template.spec.containers[router].startupProbe"}));
  json expected = generated;
  expected["spec"]["containers"][0]["env"] = fragment["spec"]["containers"][0]["env"];
  EXPECT_EQ(result.pod_template, expected);
}

TEST(PodTemplateTest, OtherGeneratedContainersStayTheControllers) {
  json generated = kGenerated;
  generated["spec"]["containers"].push_back({{"name", "exporter"}, {"image", "exp:1"}});
  const json fragment =
      withSpec({{"containers", json::array({{{"name", "exporter"}, {"image", "exp:2"}}})}});
  const TemplateMergeResult result = mergePodTemplate(generated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(result.ignored, Paths{"template.spec.containers[exporter]"});
  EXPECT_EQ(result.pod_template, generated);
}

TEST(PodTemplateTest, MalformedEntriesAreListedAndUnused) {
  const json fragment = json::parse(R"({
    "status": {"phase": "Running"},
    "metadata": {"labels": ["not", "a", "map"]},
    "spec": {"tolerations": {"key": "a"},
             "volumes": [{"emptyDir": {}}, {"name": "ok", "emptyDir": {}}],
             "containers": [{"name": "agent", "env": [{"value": "x"}, 7],
                             "resources": "lots"}]}})");
  const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(
      result.ignored,
      (Paths{"template.metadata.labels", "template.spec.containers[agent].env[0]",
             "template.spec.containers[agent].env[1]", "template.spec.containers[agent].resources",
             "template.spec.tolerations", "template.spec.volumes[0]", "template.status"}));
  json expected = kGenerated;
  expected["spec"]["volumes"].push_back(fragment["spec"]["volumes"][1]);
  EXPECT_EQ(result.pod_template, expected);

  const TemplateMergeResult not_an_object =
      mergePodTemplate(kGenerated, json("spec"), "agent", kPoolOwned);
  EXPECT_EQ(not_an_object.ignored, Paths{"template"});
  EXPECT_EQ(not_an_object.pod_template, kGenerated);
}

// Server-side apply refuses a keyed list with two entries of one key: the
// user's second entry of a name is listed and unused (the first stays).
TEST(PodTemplateTest, ASecondEntryOfOneKeyIsListedAndUnused) {
  const json fragment = json::parse(R"({"spec": {
    "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "cache", "hostPath": {"path": "/x"}},
                {"name": "model", "hostPath": {"path": "/a"}},
                {"name": "model", "hostPath": {"path": "/b"}}],
    "containers": [{"name": "agent",
                    "env": [{"name": "A", "value": "1"}, {"name": "POD_IP", "value": "x"},
                            {"name": "A", "value": "2"}]}]}})");
  const TemplateMergeResult result = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(result.ignored,
            (Paths{"template.spec.containers[agent].env[POD_IP]",  // the controller's
                   "template.spec.containers[agent].env[2]", "template.spec.volumes[1]",
                   "template.spec.volumes[model]",  // the controller's
                   "template.spec.volumes[3]"}))
      << "a second entry matching a generated one is reported too, not merged over the first";
  std::map<std::string, int> names;
  for (const json& variable : agentOf(result.pod_template)["env"]) ++names[variable["name"]];
  EXPECT_EQ(names, (std::map<std::string, int>{{"A", 1}, {"POD_IP", 1}, {"TANDEM_KV_SECRET", 1}}));
  EXPECT_EQ(agentOf(result.pod_template)["env"][2]["value"], "1") << "the first entry stays";
  int caches = 0;
  for (const json& volume : result.pod_template["spec"]["volumes"])
    caches += volume["name"] == "cache";
  EXPECT_EQ(caches, 1);
}

TEST(PodTemplateTest, SameInputsGiveTheSameJson) {
  const json fragment = json::parse(R"({
    "metadata": {"annotations": {"b": "2", "a": "1"}},
    "spec": {"containers": [{"name": "sidecar", "image": "s"},
                            {"name": "agent", "args": ["x"], "env": [{"name": "Z", "value": "1"}]}],
             "volumes": [{"name": "dshm", "emptyDir": {}}]}})");
  const TemplateMergeResult first = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  const TemplateMergeResult second = mergePodTemplate(kGenerated, fragment, "agent", kPoolOwned);
  EXPECT_EQ(first.pod_template.dump(), second.pod_template.dump());
  EXPECT_EQ(first.ignored, second.ignored);
  expectKeepsGenerated(kGenerated, first.pod_template, "template");
}

}  // namespace
}  // namespace tandem::spec
