// Pod Security Admission in the test API server: each check's reason and
// detail, compared with the texts the real plugin's own tests expect
// (k8s.io/pod-security-admission, policy/check_*_test.go) where they have
// one; the namespace labels; pods refused over HTTP; and pods the
// Deployment stand-in is refused, surfaced as ReplicaFailure.
#include "tests/support/apiserver/pod_security.h"

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "tests/support/apiserver/api_server.h"
#include "tests/unit/apiserver/api_test_client.h"

namespace tandem::testing {

// Readable failures (found by argument-dependent lookup).
void PrintTo(const PodSecurityViolation& violation, std::ostream* out) {
  *out << "{" << violation.reason << " | " << violation.detail << "}";
}

namespace {

using Json = nlohmann::json;
using Violations = std::vector<PodSecurityViolation>;

// What the restricted level admits: the settings docs/kubernetes.md gives
// the operator's pods, an init container, a NET_BIND_SERVICE capability and
// the allowed volume types.
Json restrictedSpec() {
  return Json::parse(R"({
    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"}},
    "initContainers": [{"name": "fetch", "image": "fetch:1", "securityContext": {
        "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
    "containers": [{"name": "agent", "image": "agent:1",
        "ports": [{"containerPort": 8000}],
        "securityContext": {"allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                            "seccompProfile": {"type": "Localhost",
                                               "localhostProfile": "agent.json"}}}],
    "volumes": [{"name": "cache", "emptyDir": {}},
                {"name": "config", "configMap": {"name": "agent"}},
                {"name": "token", "projected": {"sources": []}},
                {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                {"name": "defaulted"}]
  })");
}

// One container "app" and nothing else set.
Json plainSpec() { return Json::parse(R"({"containers": [{"name": "app", "image": "app:1"}]})"); }

Violations baseline(const Json& spec, const Json& metadata = Json::object()) {
  return podSecurityViolations(spec, kPodSecurityBaseline, metadata);
}

Violations restricted(const Json& spec) {
  return podSecurityViolations(spec, kPodSecurityRestricted);
}

Json pod(const std::string& name, const Json& spec) {
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", name}}}, {"spec", spec}};
}

Json namespaceObject(const std::string& name, const Json& labels = Json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Namespace"},
          {"metadata", {{"name", name}, {"labels", labels}}}};
}

// Creates namespace `name` enforcing the restricted level: the HTTP status.
int createRestrictedNamespace(ApiTestClient& client, const std::string& name) {
  return client
      .post("/api/v1/namespaces", namespaceObject(name, {{kPodSecurityEnforceLabel, "restricted"}}))
      .status;
}

// The plain pod's violations at the restricted level, in the plugin's order.
const Violations kPlainRestricted = {
    {"allowPrivilegeEscalation != false",
     "container \"app\" must set securityContext.allowPrivilegeEscalation=false"},
    {"unrestricted capabilities",
     "container \"app\" must set securityContext.capabilities.drop=[\"ALL\"]"},
    {"runAsNonRoot != true", "pod or container \"app\" must set securityContext.runAsNonRoot=true"},
    {"seccompProfile",
     "pod or container \"app\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" "
     "or \"Localhost\""}};

const char kPlainRestrictedText[] =
    "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container "
    "\"app\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities "
    "(container \"app\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != "
    "true (pod or container \"app\" must set securityContext.runAsNonRoot=true), seccompProfile "
    "(pod or container \"app\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" "
    "or \"Localhost\")";

std::vector<std::string> warningsOf(const JsonAnswer& answer) {
  std::vector<std::string> warnings;
  auto [begin, end] = answer.headers.equal_range("Warning");
  for (auto it = begin; it != end; ++it) {
    // 299 - "<JSON string>"
    warnings.push_back(Json::parse(it->second.substr(6)).get<std::string>());
  }
  return warnings;
}

TEST(PodSecurityTest, RestrictedSpecPassesEveryLevel) {
  for (const char* level : {kPodSecurityPrivileged, kPodSecurityBaseline, kPodSecurityRestricted}) {
    EXPECT_EQ(podSecurityViolations(restrictedSpec(), level), Violations{}) << level;
  }
  EXPECT_EQ(baseline(plainSpec()), Violations{});
  Json host = plainSpec();
  host["hostNetwork"] = true;
  EXPECT_EQ(podSecurityViolations(host, kPodSecurityPrivileged), Violations{});
}

TEST(PodSecurityTest, PlainPodFailsRestrictedInThePluginsOrder) {
  EXPECT_EQ(restricted(plainSpec()), kPlainRestricted);
  EXPECT_EQ(podSecurityForbiddenMessage("web", kPodSecurityRestricted, kPlainRestricted),
            std::string("pods \"web\" is forbidden: ") + kPlainRestrictedText);
  // A level that is none of the three is evaluated as restricted.
  EXPECT_EQ(podSecurityViolations(plainSpec(), "strict"), kPlainRestricted);

  // Baseline checks come first (by ID), then restricted ones (by ID).
  Json spec = plainSpec();
  spec["hostPID"] = true;
  spec["containers"][0]["securityContext"] = {{"privileged", true},
                                              {"allowPrivilegeEscalation", false},
                                              {"capabilities", {{"drop", Json::array({"ALL"})}}},
                                              {"runAsUser", 0}};
  spec["securityContext"] = {{"runAsNonRoot", true}, {"seccompProfile", {{"type", "Unconfined"}}}};
  Violations expected = {
      {"host namespaces", "hostPID=true"},
      {"privileged", "container \"app\" must not set securityContext.privileged=true"},
      {"runAsUser=0", "container \"app\" must not set runAsUser=0"},
      {"seccompProfile", "pod must not set securityContext.seccompProfile.type to \"Unconfined\""}};
  EXPECT_EQ(restricted(spec), expected);
  EXPECT_EQ(podSecurityViolationText("restricted:v1.30", {expected[0], {"reason only", ""}}),
            "violates PodSecurity \"restricted:v1.30\": host namespaces (hostPID=true), "
            "reason only");
}

TEST(PodSecurityTest, HostNamespacesPrivilegedAndCapabilities) {
  Json spec = plainSpec();
  spec["hostNetwork"] = true;
  spec["hostPID"] = true;
  spec["hostIPC"] = true;
  EXPECT_EQ(baseline(spec),
            (Violations{{"host namespaces", "hostNetwork=true, hostPID=true, hostIPC=true"}}));

  spec = Json::parse(R"({
    "initContainers": [{"name": "init", "securityContext": {"privileged": true}}],
    "containers": [{"name": "a", "securityContext": {"privileged": true}},
                   {"name": "b", "securityContext": {"privileged": false}}]})");
  EXPECT_EQ(baseline(spec), (Violations{{"privileged",
                                         "containers \"init\", \"a\" must not set "
                                         "securityContext.privileged=true"}}));

  spec = Json::parse(R"({"containers": [
    {"name": "a", "securityContext": {"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}}},
    {"name": "b", "securityContext": {"capabilities": {"add": ["NET_RAW", "IPC_LOCK"]}}},
    {"name": "c", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}}]})");
  EXPECT_EQ(baseline(spec),
            (Violations{{"non-default capabilities",
                         "containers \"a\", \"b\" must not include \"IPC_LOCK\", \"NET_RAW\", "
                         "\"SYS_ADMIN\" in securityContext.capabilities.add"}}));
}

TEST(PodSecurityTest, HostPathVolumesAndHostPorts) {
  Json spec = plainSpec();
  spec["volumes"] = Json::parse(R"([{"name": "models", "hostPath": {"path": "/models"}},
                                    {"name": "cache", "emptyDir": {}}])");
  EXPECT_EQ(baseline(spec), (Violations{{"hostPath volumes", "volume \"models\""}}));
  // At restricted the volume-type check replaces the hostPath one.
  Json hardened = restrictedSpec();
  hardened["volumes"] = spec["volumes"];
  hardened["volumes"].push_back(Json::parse(R"({"name": "shared", "nfs": {"server": "nas"}})"));
  EXPECT_EQ(restricted(hardened),
            (Violations{{"restricted volume types",
                         "volumes \"models\", \"shared\" use restricted volume types "
                         "\"hostPath\", \"nfs\""}}));

  // Ports are listed as sorted text, as the plugin's string set sorts them.
  spec = Json::parse(R"({"containers": [
    {"name": "a", "ports": [{"containerPort": 80, "hostPort": 0}]},
    {"name": "b", "ports": [{"containerPort": 80, "hostPort": 8080},
                            {"containerPort": 90, "hostPort": 10000}]},
    {"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]})");
  EXPECT_EQ(baseline(spec),
            (Violations{{"hostPort", "containers \"b\", \"c\" use hostPorts 10000, 8080"}}));
  spec["containers"].erase(2);
  spec["containers"][1]["ports"].erase(1);
  EXPECT_EQ(baseline(spec), (Violations{{"hostPort", "container \"b\" uses hostPort 8080"}}));
}

TEST(PodSecurityTest, AppArmorSeLinuxProcMountSysctlsHostProcessAndProbeHosts) {
  Json spec = plainSpec();
  spec["securityContext"]["appArmorProfile"] = {{"type", "Unconfined"}};
  EXPECT_EQ(baseline(spec), (Violations{{"forbidden AppArmor profile",
                                         "pod must not set AppArmor profile type to "
                                         "\"Unconfined\""}}));
  Json annotations = {{"container.apparmor.security.beta.kubernetes.io/app", "unconfined"},
                      {"container.apparmor.security.beta.kubernetes.io/b", "localhost/agent"}};
  EXPECT_EQ(
      baseline(plainSpec(), {{"annotations", annotations}}),
      (Violations{{"forbidden AppArmor profile",
                   "annotation must not set AppArmor profile type to "
                   "\"container.apparmor.security.beta.kubernetes.io/app=\"unconfined\"\""}}));

  // The plugin's own case "invalid pod and containers".
  spec = Json::parse(R"({
    "securityContext": {"seLinuxOptions": {"type": "foo", "user": "bar", "role": "baz"}},
    "containers": [
      {"name": "a", "securityContext": {"seLinuxOptions": {"type": "container_t"}}},
      {"name": "d", "securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}},
      {"name": "e", "securityContext": {"seLinuxOptions": {"type": "bar"}}},
      {"name": "f", "securityContext": {"seLinuxOptions": {"user": "bar"}}},
      {"name": "g", "securityContext": {"seLinuxOptions": {"role": "baz"}}}]})");
  EXPECT_EQ(baseline(spec),
            (Violations{{"seLinuxOptions",
                         "pod and containers \"e\", \"f\", \"g\" set forbidden "
                         "securityContext.seLinuxOptions: types \"bar\", \"foo\"; user may not be "
                         "set; role may not be set"}}));

  spec = plainSpec();
  spec["containers"][0]["securityContext"]["procMount"] = "Unmasked";
  const Violations proc_mount = {
      {"procMount", "container \"app\" must not set securityContext.procMount to \"Unmasked\""}};
  EXPECT_EQ(baseline(spec), proc_mount);

  spec = plainSpec();
  spec["securityContext"]["sysctls"] = Json::parse(R"([{"name": "net.ipv4.tcp_rmem", "value": "1"},
      {"name": "kernel.msgmax", "value": "1"}, {"name": "vm.swappiness", "value": "1"}])");
  EXPECT_EQ(baseline(spec), (Violations{{"forbidden sysctls", "kernel.msgmax, vm.swappiness"}}));

  spec = plainSpec();
  spec["securityContext"]["windowsOptions"] = {{"hostProcess", true}};
  spec["containers"][0]["securityContext"]["windowsOptions"] = {{"hostProcess", true}};
  EXPECT_EQ(baseline(spec), (Violations{{"hostProcess",
                                         "pod and container \"app\" must not set "
                                         "securityContext.windowsOptions.hostProcess=true"}}));

  spec = Json::parse(R"({"containers": [{"name": "a",
    "livenessProbe": {"httpGet": {"host": "127.0.0.1", "port": 80}},
    "readinessProbe": {"tcpSocket": {"host": "::1", "port": 80}},
    "startupProbe": {"httpGet": {"host": "localhost", "port": 80}},
    "lifecycle": {"preStop": {"httpGet": {"port": 80}}}}]})");
  EXPECT_EQ(baseline(spec), (Violations{{"probe or lifecycle host",
                                         "container \"a\" uses probe or lifecycle hosts "
                                         "\"127.0.0.1\", \"::1\", \"localhost\""}}));
}

TEST(PodSecurityTest, RestrictedChecks) {
  Json spec = restrictedSpec();
  spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true;
  spec["initContainers"][0]["securityContext"].erase("allowPrivilegeEscalation");
  EXPECT_EQ(restricted(spec), (Violations{{"allowPrivilegeEscalation != false",
                                           "containers \"fetch\", \"agent\" must set "
                                           "securityContext.allowPrivilegeEscalation=false"}}));

  // The plugin's own case "multiple containers".
  spec = restrictedSpec();
  spec["containers"] = Json::parse(R"([
    {"name": "a", "securityContext": {"allowPrivilegeEscalation": false,
                                      "capabilities": {"add": ["FOO", "BAR"]}}},
    {"name": "b", "securityContext": {"allowPrivilegeEscalation": false,
                                      "capabilities": {"add": ["BAR", "BAZ"]}}},
    {"name": "c", "securityContext": {"allowPrivilegeEscalation": false,
        "capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL", "FOO"]}}}])");
  EXPECT_EQ(restricted(spec),
            (Violations{{"unrestricted capabilities",
                         "containers \"a\", \"b\" must set securityContext.capabilities.drop=["
                         "\"ALL\"]; containers \"a\", \"b\", \"c\" must not include \"BAR\", "
                         "\"BAZ\", \"CHOWN\", \"FOO\" in securityContext.capabilities.add"}}));

  spec = restrictedSpec();
  spec["securityContext"]["runAsNonRoot"] = false;
  spec["containers"][0]["securityContext"]["runAsNonRoot"] = false;
  EXPECT_EQ(restricted(spec), (Violations{{"runAsNonRoot != true",
                                           "pod and container \"agent\" must not set "
                                           "securityContext.runAsNonRoot=false"}}));
  spec = restrictedSpec();
  spec["securityContext"].erase("runAsNonRoot");
  spec["containers"][0]["securityContext"]["runAsNonRoot"] = true;
  EXPECT_EQ(
      restricted(spec),
      (Violations{{"runAsNonRoot != true",
                   "pod or container \"fetch\" must set securityContext.runAsNonRoot=true"}}));

  spec = restrictedSpec();
  spec["securityContext"]["runAsUser"] = 0;
  spec["initContainers"][0]["securityContext"]["runAsUser"] = 0;
  spec["containers"][0]["securityContext"]["runAsUser"] = 1000;
  EXPECT_EQ(restricted(spec),
            (Violations{{"runAsUser=0", "pod and container \"fetch\" must not set runAsUser=0"}}));

  spec = restrictedSpec();
  spec["securityContext"].erase("seccompProfile");
  EXPECT_EQ(restricted(spec),
            (Violations{{"seccompProfile",
                         "pod or container \"fetch\" must set securityContext.seccompProfile.type "
                         "to \"RuntimeDefault\" or \"Localhost\""}}));
  spec["containers"][0]["securityContext"]["seccompProfile"] = {{"type", "Unconfined"}};
  EXPECT_EQ(restricted(spec),
            (Violations{{"seccompProfile",
                         "container \"agent\" must not set securityContext.seccompProfile.type "
                         "to \"Unconfined\""}}));
  // Baseline refuses an explicit Unconfined too, but not its absence.
  EXPECT_EQ(baseline(spec), restricted(spec));
}

TEST(PodSecurityTest, UserNamespacesAndWindowsRelaxTheirChecks) {
  Json spec = restrictedSpec();
  spec["securityContext"]["runAsNonRoot"] = false;
  spec["securityContext"]["runAsUser"] = 0;
  spec["containers"][0]["securityContext"]["procMount"] = "Unmasked";
  EXPECT_EQ(restricted(spec).size(), 3u);
  spec["hostUsers"] = false;
  // Restricted keeps its own procMount check; baseline relaxes it.
  EXPECT_EQ(restricted(spec),
            (Violations{{"procMount",
                         "container \"agent\" must not set securityContext.procMount "
                         "to \"Unmasked\""}}));
  EXPECT_EQ(baseline(spec), Violations{});

  spec = plainSpec();
  spec["os"] = {{"name", "windows"}};
  EXPECT_EQ(restricted(spec),
            (Violations{{"runAsNonRoot != true",
                         "pod or container \"app\" must set securityContext.runAsNonRoot=true"}}));
}

TEST(PodSecurityTest, NamespaceLabelsGiveThePolicy) {
  EXPECT_EQ(podSecurityEnforceLevel(std::nullopt), "privileged");
  EXPECT_EQ(podSecurityEnforceLevel(namespaceObject("open")), "privileged");
  EXPECT_EQ(podSecurityEnforceLevel(namespaceObject("a", {{kPodSecurityEnforceLabel, "baseline"}})),
            "baseline");
  // Enforce fails closed: a value that is no level enforces restricted.
  EXPECT_EQ(podSecurityEnforceLevel(namespaceObject("a", {{kPodSecurityEnforceLabel, "strict"}})),
            "restricted");

  PodSecurityPolicy policy = podSecurityPolicy(namespaceObject(
      "a", {{kPodSecurityEnforceLabel, "baseline"}, {kPodSecurityEnforceVersionLabel, "v1.30"}}));
  EXPECT_EQ(policy.enforce.text(), "baseline:v1.30");
  EXPECT_EQ(policy.warn.text(), "baseline:v1.30") << "warn follows a stricter enforce";
  policy = podSecurityPolicy(namespaceObject("a", {{kPodSecurityEnforceLabel, "baseline"},
                                                   {kPodSecurityEnforceVersionLabel, "1.30"},
                                                   {kPodSecurityWarnLabel, "restricted"}}));
  EXPECT_EQ(policy.enforce.text(), "baseline:latest");
  EXPECT_EQ(policy.warn.text(), "restricted:latest");
  // Warn fails open.
  policy = podSecurityPolicy(namespaceObject("a", {{kPodSecurityWarnLabel, "strict"}}));
  EXPECT_EQ(policy.warn.text(), "privileged:latest");

  EXPECT_TRUE(
      podSecurityLabelErrors(namespaceObject("a", {{kPodSecurityEnforceLabel, "baseline"},
                                                   {kPodSecurityEnforceVersionLabel, "v1.0"}}))
          .empty());
  auto errors = podSecurityLabelErrors(
      namespaceObject("a", {{kPodSecurityEnforceLabel, "strict"},
                            {"pod-security.kubernetes.io/audit-version", "v1.05"}}));
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].first, "metadata.labels[pod-security.kubernetes.io/enforce]");
  EXPECT_EQ(errors[0].second,
            "Invalid value: \"strict\": must be one of privileged, baseline, restricted");
  EXPECT_EQ(errors[1].first, "metadata.labels[pod-security.kubernetes.io/audit-version]");
  EXPECT_EQ(errors[1].second, "Invalid value: \"v1.05\": must be \"latest\" or \"v1.x\"");
}

TEST(PodSecurityTest, OnlyImageChangesAndNewContainersAreSignificantUpdates) {
  Json old_pod = pod("web", plainSpec());
  Json updated = old_pod;
  updated["metadata"]["labels"] = {{"tier", "web"}};
  updated["spec"]["activeDeadlineSeconds"] = 30;
  EXPECT_FALSE(isSignificantPodUpdate(updated, old_pod));
  updated["spec"]["containers"][0]["image"] = "app:2";
  EXPECT_TRUE(isSignificantPodUpdate(updated, old_pod));
  updated = old_pod;
  updated["spec"]["ephemeralContainers"] = Json::parse(R"([{"name": "debug", "image": "x"}])");
  EXPECT_TRUE(isSignificantPodUpdate(updated, old_pod));
}

// --- Through the API ---

TEST(PodSecurityAdmissionTest, PodRefusedWhereTheNamespaceEnforcesRestricted) {
  ApiServer server;
  ApiTestClient client(server);
  ASSERT_EQ(createRestrictedNamespace(client, "secure"), 201);
  ASSERT_EQ(client.post("/api/v1/namespaces", namespaceObject("open")).status, 201);

  JsonAnswer refused = client.post("/api/v1/namespaces/secure/pods", pod("web", plainSpec()));
  EXPECT_EQ(refused.status, 403) << refused.text;
  EXPECT_EQ(refused.body["kind"], "Status");
  EXPECT_EQ(refused.body["status"], "Failure");
  EXPECT_EQ(refused.body["reason"], "Forbidden");
  EXPECT_EQ(refused.body["code"], 403);
  EXPECT_EQ(refused.body["message"],
            std::string("pods \"web\" is forbidden: ") + kPlainRestrictedText);
  EXPECT_EQ(refused.body["details"], (Json{{"name", "web"}, {"kind", "pods"}}));
  EXPECT_FALSE(server.get("v1", "Pod", "secure", "web").has_value());

  // A generated name is in the message, as the real server's.
  Json generated = pod("", plainSpec());
  generated["metadata"] = {{"generateName", "job-"}};
  JsonAnswer refused_generated = client.post("/api/v1/namespaces/secure/pods", generated);
  EXPECT_EQ(refused_generated.status, 403);
  EXPECT_EQ(refused_generated.body["message"].get<std::string>().rfind("pods \"job-", 0), 0u)
      << refused_generated.text;

  EXPECT_EQ(client.post("/api/v1/namespaces/open/pods", pod("web", plainSpec())).status, 201);
  EXPECT_EQ(client.post("/api/v1/namespaces/secure/pods", pod("agent", restrictedSpec())).status,
            201);

  // A pod from before the label: updates that change no image pass, others are checked.
  server.put({{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "old"}, {"namespace", "secure"}}},
              {"spec", plainSpec()}});
  Json old_pod = server.get("v1", "Pod", "secure", "old").value();
  old_pod["metadata"]["labels"] = {{"kept", "yes"}};
  JsonAnswer relabelled = client.put("/api/v1/namespaces/secure/pods/old", old_pod);
  ASSERT_EQ(relabelled.status, 200) << relabelled.text;
  Json new_image = relabelled.body;
  new_image["spec"]["containers"][0]["image"] = "app:2";
  JsonAnswer changed = client.put("/api/v1/namespaces/secure/pods/old", new_image);
  EXPECT_EQ(changed.status, 403);
  EXPECT_EQ(changed.body["message"],
            std::string("pods \"old\" is forbidden: ") + kPlainRestrictedText);
}

TEST(PodSecurityAdmissionTest, LabelsAreValidatedAndWarnLevelsWarn) {
  ApiServer server;
  ApiTestClient client(server);
  JsonAnswer invalid = client.post("/api/v1/namespaces",
                                   namespaceObject("bad", {{kPodSecurityEnforceLabel, "strict"}}));
  EXPECT_EQ(invalid.status, 422);
  EXPECT_EQ(invalid.body["reason"], "Invalid");
  EXPECT_EQ(invalid.body["message"],
            "Namespace \"bad\" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: "
            "Invalid value: \"strict\": must be one of privileged, baseline, restricted");

  // Enforce baseline, warn restricted: admitted with the warning.
  ASSERT_EQ(client
                .post("/api/v1/namespaces",
                      namespaceObject("team", {{kPodSecurityEnforceLabel, "baseline"},
                                               {kPodSecurityWarnLabel, "restricted"}}))
                .status,
            201);
  JsonAnswer warned = client.post("/api/v1/namespaces/team/pods", pod("web", plainSpec()));
  ASSERT_EQ(warned.status, 201) << warned.text;
  EXPECT_EQ(warningsOf(warned),
            std::vector<std::string>{std::string("would ") + kPlainRestrictedText});
  ASSERT_EQ(client.post("/api/v1/namespaces/team/pods", pod("worker", plainSpec())).status, 201);
  ASSERT_EQ(client.post("/api/v1/namespaces/team/pods", pod("agent", restrictedSpec())).status,
            201);

  // Tightening enforce warns about the pods already there (which stay).
  Json team = server.get("v1", "Namespace", "", "team").value();
  team["metadata"]["labels"][kPodSecurityEnforceLabel] = "restricted";
  JsonAnswer tightened = client.put("/api/v1/namespaces/team", team);
  ASSERT_EQ(tightened.status, 200) << tightened.text;
  EXPECT_EQ(warningsOf(tightened),
            (std::vector<std::string>{
                "existing pods in namespace \"team\" violate the new PodSecurity enforce level "
                "\"restricted:latest\"",
                "web (and 1 other pod): allowPrivilegeEscalation != false, unrestricted "
                "capabilities, runAsNonRoot != true, seccompProfile"}));
  EXPECT_EQ(server.list("v1", "Pod", "team").size(), 3u);
}

TEST(PodSecurityAdmissionTest, RefusedDeploymentPodsSurfaceAsReplicaFailure) {
  ApiServer server;
  server.setDeploymentControllerAuto(true);
  ApiTestClient client(server);
  ASSERT_EQ(createRestrictedNamespace(client, "secure"), 201);
  Json deployment = agentDeployment(plainSpec());
  const std::string path = "/apis/apps/v1/namespaces/secure/deployments";
  JsonAnswer created = client.post(path, deployment);
  ASSERT_EQ(created.status, 201) << created.text;
  // The Deployment itself is admitted, with the warn level's warning.
  EXPECT_EQ(warningsOf(created),
            std::vector<std::string>{std::string("would ") + kPlainRestrictedText});
  EXPECT_TRUE(server.list("v1", "Pod", "secure").empty());

  Json status = server.get("apps/v1", "Deployment", "secure", "agent").value()["status"];
  EXPECT_FALSE(status.contains("readyReplicas"));
  EXPECT_FALSE(status.contains("replicas"));
  EXPECT_EQ(status["unavailableReplicas"], 2);
  std::map<std::string, Json> conditions;
  for (const Json& condition : status["conditions"]) {
    conditions[condition["type"].get<std::string>()] = condition;
  }
  EXPECT_EQ(conditions["Available"]["status"], "False");
  ASSERT_EQ(conditions.count("ReplicaFailure"), 1u) << status.dump();
  EXPECT_EQ(conditions["ReplicaFailure"]["status"], "True");
  EXPECT_EQ(conditions["ReplicaFailure"]["reason"], "FailedCreate");
  const std::string message = conditions["ReplicaFailure"]["message"].get<std::string>();
  EXPECT_EQ(message.rfind("pods \"agent-", 0), 0u) << message;
  const std::string tail = std::string("-0\" is forbidden: ") + kPlainRestrictedText;
  EXPECT_TRUE(message.ends_with(tail)) << message;

  // A compliant template: the pods come, and the failure goes.
  Json fixed = server.get("apps/v1", "Deployment", "secure", "agent").value();
  fixed["spec"]["template"]["spec"] = restrictedSpec();
  JsonAnswer updated = client.put(path + "/agent", fixed);
  ASSERT_EQ(updated.status, 200) << updated.text;
  EXPECT_TRUE(warningsOf(updated).empty());
  EXPECT_EQ(server.list("v1", "Pod", "secure").size(), 2u);
  status = server.get("apps/v1", "Deployment", "secure", "agent").value()["status"];
  EXPECT_EQ(status["readyReplicas"], 2);
  EXPECT_EQ(status["replicas"], 2);
  for (const Json& condition : status["conditions"]) {
    EXPECT_NE(condition["type"], "ReplicaFailure");
    if (condition["type"] == "Available") {
      EXPECT_EQ(condition["status"], "True");
    }
  }
}

}  // namespace
}  // namespace tandem::testing
