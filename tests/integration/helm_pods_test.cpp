// `helm install` of charts/tandem with every pod a real container: the
// images built from this checkout (scripts/images.sh, cached after
// integration_images_test), the real helm and kubectl against the API
// stand-in (TLS, RBAC), and a kubelet stand-in (tests/support/kubelet) that
// runs each pod with podman on a bridge network, one IP per pod, and writes
// its status back. So the operator runs from its image with its
// ServiceAccount's in-cluster token, creates the example pools' Deployments,
// whose agents and router run from their images, reading the model from a
// PersistentVolumeClaim; the router finds the agents through EndpointSlices;
// a streamed completion through the router Service's cluster IP (the
// kubelet stand-in plays kube-proxy) moves KV from the prefill
// container to a decode container over UCX and gives the host agent's
// greedy tokens. Then: `kubectl scale` grows the decode pool and the router
// uses the new agent; a pool whose image does not exist and one whose model
// path does not exist say so in their Degraded condition (ErrImagePull, and
// CrashLoopBackOff with the agent's own last words); a DecodePool whose
// source is hf:// (a Hub stand-in on the node's address, gated by a token in
// a Secret) fetches the model in its init container, from the agent image,
// and serves the host agent's tokens, while one with the wrong token reports
// the Hub's refusal in ModelReady; `helm uninstall` removes every container.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/prometheus_text.h"
#include "tests/support/agent_server.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/command.h"
#include "tests/support/helm.h"
#include "tests/support/hub/hub_server.h"
#include "tests/support/kubectl.h"
#include "tests/support/kubelet/pod_runner.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"

namespace {

namespace fs = std::filesystem;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary
using nlohmann::json;
using std::chrono::seconds;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kBinDir = TANDEM_BIN_DIR;
const fs::path kChart = kSourceDir / "charts/tandem";
constexpr const char* kNs = "tandem";

std::string describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_status) + "\nstdout:\n" + r.out.substr(0, 4000) +
         "\nstderr (last 4000 bytes):\n" +
         (r.err.size() > 4000 ? r.err.substr(r.err.size() - 4000) : r.err);
}

// The condition `type` of a pool ({} when it has none).
json conditionOf(const std::optional<json>& pool, const std::string& type) {
  if (!pool) return json::object();
  for (const json& condition :
       pool->value("status", json::object()).value("conditions", json::array())) {
    if (condition.value("type", "") == type) return condition;
  }
  return json::object();
}

class HelmPodsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v podman >/dev/null 2>&1") != 0) {
      GTEST_FAIL() << "podman is not installed: `make deps` installs it";
    }
    ::chmod(work_.path().c_str(), 0755);
  }

  CommandResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                    const std::vector<std::pair<std::string, std::string>>& env = {}) {
    static int calls = 0;
    return runToEnd(argv, work_.path() / ("command-" + std::to_string(++calls) + ".err"), timeout,
                    env);
  }

  // helm ARGS... with its home under the work directory and this kubeconfig.
  CommandResult helm(const std::vector<std::string>& args, const fs::path& kubeconfig) {
    static int calls = 0;
    return runHelm(args, work_.path() / "helm",
                   work_.path() / ("helm-" + std::to_string(++calls) + ".err"), seconds(120),
                   kubeconfig);
  }

  TempDir work_{"tandem-helm-pods-test"};
};

TEST_F(HelmPodsTest, EveryPodARealContainerFromInstallToUninstall) {
  // ---- the images (built by integration_images_test; cached here) ----
  const fs::path images_out = kBinDir.parent_path() / "images-test";
  const CommandResult built =
      run({(kSourceDir / "scripts/images.sh").string(), "--out", images_out.string()},
          std::chrono::minutes(45));
  ASSERT_EQ(built.exit_status, 0) << describe(built);
  std::ifstream listing(images_out / "images.json");
  const json summary = json::parse(listing);
  std::vector<std::pair<std::string, std::string>> engine_env;
  if (!summary.value("containers_conf", "").empty()) {
    engine_env = {{"CONTAINERS_CONF", summary["containers_conf"].get<std::string>()}};
  }
  std::map<std::string, std::string> tags;
  for (const json& image : summary.at("images")) tags[image.at("name")] = image.at("tag");
  const std::string agent_tag = tags.at("agent-cpu").substr(tags.at("agent-cpu").rfind(':') + 1);

  // ---- the node's network: podman's bridge ----
  const CommandResult network =
      run({"podman", "network", "inspect", "podman"}, seconds(60), engine_env);
  ASSERT_EQ(network.exit_status, 0) << describe(network);
  const json bridge = json::parse(network.out).at(0);
  const std::string gateway = bridge.at("subnets").at(0).at("gateway");
  const std::string subnet = bridge.at("subnets").at(0).at("subnet");
  ASSERT_EQ(subnet.substr(subnet.size() - 3), "/16") << "pods take addresses in a /16: " << subnet;
  // A /24 of it for this run's pods, away from podman's own allocations.
  const std::string base = subnet.substr(0, subnet.find('.', subnet.find('.') + 1) + 1);
  const std::string ip_prefix = base + std::to_string(100 + ::getpid() % 150) + ".";

  // ---- the API server, reachable from the pods ----
  ApiServerOptions options;
  options.tls = true;
  options.rbac = true;
  options.listen_address = "0.0.0.0";
  options.certificate_ips = {gateway};
  ApiServer api(options);
  api.setPodsRunByKubelet();
  api.setDeploymentControllerAuto(true);
  const fs::path kubeconfig = api.writeKubeconfig(work_.path() / "admin.kubeconfig", "admin");
  Kubectl kubectl(kubeconfig, work_.path() / "kubectl");

  // ---- the model, on the claim the chart's examples name ----
  const fs::path models = work_.path() / "models";
  fs::create_directories(models);
  fs::copy(tinyModelDir(), models / "tiny", fs::copy_options::recursive);
  for (const fs::path& dir : {models, models / "tiny"}) ::chmod(dir.c_str(), 0755);
  for (const auto& entry : fs::directory_iterator(models / "tiny")) {
    ::chmod(entry.path().c_str(), 0644);
  }

  PodRunnerOptions kubelet;
  kubelet.engine_env = engine_env;
  kubelet.ip_prefix = ip_prefix;
  kubelet.host_ip = gateway;
  kubelet.api_host = gateway;
  kubelet.api_port = api.port();
  kubelet.ca_certificate = api.pki().ca_certificate;
  kubelet.claims = {{"models", models}};
  kubelet.work_dir = work_.path() / "kubelet";
  kubelet.proxy_services = true;  // Services' cluster IPs lead to their pods
  PodRunner pods(api, kubelet);

  // ---- helm install ----
  ASSERT_EQ(kubectl.run({"create", "namespace", kNs}).exit_status, 0);
  const CommandResult installed = helm({"install",
                                        "tandem",
                                        kChart.string(),
                                        "--namespace",
                                        kNs,
                                        "--set",
                                        "examples.enabled=true",
                                        "--set",
                                        "examples.modelPath=/models/tiny",
                                        "--set",
                                        "examples.modelName=tiny",
                                        "--set",
                                        "examples.pvcSubPath=tiny",
                                        "--set",
                                        "examples.gpus=0",
                                        "--set",
                                        "examples.decodeReplicas=1",
                                        "--set",
                                        "agentImage.tag=" + agent_tag,
                                        "--set",
                                        "operator.replicas=1"},
                                       kubeconfig);
  ASSERT_EQ(installed.exit_status, 0) << describe(installed);
  // Every prompt prefilled on a prefill agent, so that its KV crosses
  // containers (an idle decode agent would otherwise prefill short prompts itself).
  const KubectlResult patched =
      kubectl.run({"patch", "router", "router", "-n", kNs, "--type", "merge", "-p",
                   R"({"spec":{"disaggThresholdTokens":1}})"});
  ASSERT_EQ(patched.exit_status, 0) << patched.err;

  auto pool = [&](const std::string& kind, const std::string& name) {
    return api.get("tandem.dev/v1alpha1", kind, kNs, name);
  };
  auto podsOf = [&](const std::string& prefix) {
    std::vector<json> found;
    for (const json& pod : api.list("v1", "Pod", kNs)) {
      if (pod["metadata"].value("name", "").rfind(prefix + "-", 0) == 0) found.push_back(pod);
    }
    return found;
  };
  auto readyPods = [&](const std::string& prefix) {
    std::vector<json> ready;
    for (const json& pod : podsOf(prefix)) {
      for (const json& condition :
           pod.value("status", json::object()).value("conditions", json::array())) {
        if (condition.value("type", "") == "Ready" && condition.value("status", "") == "True") {
          ready.push_back(pod);
        }
      }
    }
    return ready;
  };
  auto podLogs = [&](const std::string& prefix) {
    std::string text;
    for (const json& pod : podsOf(prefix)) {
      const std::string name = pod["metadata"].value("name", "");
      text += "---- " + name + " status: " + pod.value("status", json::object()).dump() + "\n" +
              pods.logs(kNs, name) + "\n";
    }
    return text;
  };

  // ---- the operator runs from its image, with its own ServiceAccount ----
  ASSERT_TRUE(eventually([&] { return readyPods("tandem-operator").size() == 1; }, seconds(90)))
      << podLogs("tandem-operator");
  ASSERT_TRUE(eventually(
      [&] {
        return conditionOf(pool("PrefillPool", "prefill"), "Ready").value("status", "") == "True" &&
               conditionOf(pool("DecodePool", "decode"), "Ready").value("status", "") == "True";
      },
      seconds(120)))
      << "prefill: " << pool("PrefillPool", "prefill").value_or(json()).dump() << "\n"
      << podLogs("prefill") << podLogs("decode") << podLogs("tandem-operator");
  auto patchedRouters = [&] {
    std::vector<json> found;
    for (const json& pod : readyPods("router")) {
      if (pod["spec"]["containers"][0]["args"].dump().find("--disagg-threshold-tokens") !=
          std::string::npos) {
        found.push_back(pod);
      }
    }
    return found;
  };
  ASSERT_TRUE(eventually([&] { return patchedRouters().size() == 1; }, seconds(90)))
      << podLogs("router");
  const std::string operator_user = "system:serviceaccount:tandem:tandem-operator";
  EXPECT_GT(api.writesBy(operator_user), 0u)
      << "the operator writes with its in-cluster ServiceAccount token";
  for (const RequestRecord& request : api.answeredRequests()) {
    EXPECT_FALSE(request.user == operator_user && request.status == 403)
        << "the chart's Role refused the operator: " << request.method << " " << request.target;
  }
  for (const char* name : {"prefill", "decode"}) {
    const std::optional<json> budget = api.get("policy/v1", "PodDisruptionBudget", kNs, name);
    ASSERT_TRUE(budget.has_value()) << "no PodDisruptionBudget for pool " << name;
    EXPECT_EQ(budget->at("spec").value("maxUnavailable", 0), 1);
  }

  // ---- a streamed completion through the router: KV from prefill to decode ----
  // Clients reach the router by its Service's address, as in a cluster.
  const std::string router_ip =
      api.get("v1", "Service", kNs, "router")->at("spec").value("clusterIP", "");
  ASSERT_FALSE(router_ip.empty());
  httplib::Client router(router_ip, 8000);
  router.set_read_timeout(120, 0);
  auto routerKnows = [&](const std::string& role, int count) {
    auto metrics = router.Get("/metrics");
    return metrics &&
           tandem::prometheusSample(metrics->body, "tandem_router_agents", "role=\"" + role + "\"")
                   .value_or(-1) == count;
  };
  ASSERT_TRUE(eventually([&] { return routerKnows("prefill", 1) && routerKnows("decode", 1); },
                         seconds(60)))
      << podLogs("router");
  Agent host;
  const std::vector<int> prompt = randomPrompt(200, 31);
  json body = greedy(prompt, 12);
  body["stream"] = true;
  auto streamed = router.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed) << "no answer from the router Service at " << router_ip
                        << " (the kubelet stand-in routes it with iptables)\n"
                        << podLogs("router");
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::vector<int> ids;
  std::istringstream lines(streamed->body);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("data: {")) continue;
    const json chunk = json::parse(line.substr(6), nullptr, false);
    if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
    for (int id : chunk["choices"][0].value("token_ids", std::vector<int>{})) ids.push_back(id);
  }
  EXPECT_NE(streamed->body.find("data: [DONE]"), std::string::npos) << streamed->body;
  EXPECT_EQ(ids, tokenIds(host.post("/v1/completions", greedy(prompt, 12))))
      << "the containers' greedy tokens are the host agent's";
  EXPECT_EQ(streamed->get_header_value("x-tandem-decision"), "disaggregated");
  const std::string prefill_pod = streamed->get_header_value("x-tandem-prefill-agent");
  const std::string decode_pod = streamed->get_header_value("x-tandem-decode-agent");
  EXPECT_EQ(prefill_pod.rfind("prefill-", 0), 0u) << prefill_pod;
  EXPECT_EQ(decode_pod.rfind("decode-", 0), 0u) << decode_pod;
  const std::string moved = streamed->get_header_value("x-tandem-kv-blocks-moved");
  EXPECT_GT(moved.empty() ? 0 : std::stoi(moved), 0) << "KV blocks moved between containers";
  for (const json& pod : readyPods("decode")) {
    if (pod["metadata"].value("name", "") != decode_pod) continue;
    httplib::Client decode(pod["status"].value("podIP", ""), 8000);
    auto metrics = decode.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_GT(tandem::prometheusSample(metrics->body, "tandem_kv_transfer_bytes_total").value_or(0),
              0)
        << "the decode container loaded KV bytes through its connector";
  }

  // ---- kubectl scale: a second decode agent, found and used ----
  const KubectlResult scaled =
      kubectl.run({"scale", "decodepool", "decode", "--replicas", "2", "-n", kNs});
  ASSERT_EQ(scaled.exit_status, 0) << scaled.err;
  ASSERT_TRUE(eventually([&] { return readyPods("decode").size() == 2; }, seconds(90)))
      << podLogs("decode");
  ASSERT_TRUE(eventually([&] { return routerKnows("decode", 2); }, seconds(60)))
      << podLogs("router");
  std::set<std::string> decode_agents;
  for (uint32_t seed = 40; seed < 52 && decode_agents.size() < 2; ++seed) {
    auto answer = router.Post("/v1/completions", greedy(randomPrompt(120, seed), 4).dump(),
                              "application/json");
    ASSERT_TRUE(answer);
    ASSERT_EQ(answer->status, 200) << answer->body;
    decode_agents.insert(answer->get_header_value("x-tandem-decode-agent"));
  }
  EXPECT_EQ(decode_agents.size(), 2u) << "the router sends work to the new decode agent too";
  EXPECT_TRUE(eventually(
      [&] { return pool("DecodePool", "decode")->at("status").value("readyReplicas", 0) == 2; },
      seconds(30)))
      << pool("DecodePool", "decode")->dump();

  // ---- a missing image and a missing model, in the pools' conditions ----
  json broken_image = *pool("PrefillPool", "prefill");
  json broken_model = broken_image;
  for (json* broken : {&broken_image, &broken_model}) {
    json& metadata = (*broken)["metadata"];
    metadata = {{"name", metadata["name"]}, {"namespace", kNs}};
    broken->erase("status");
  }
  broken_image["metadata"]["name"] = "no-image";
  broken_image["spec"]["image"] = "ghcr.io/tandem/agent:0.0.0-absent";
  broken_model["metadata"]["name"] = "no-model";
  // A claim's missing subPath is created empty by the kubelet: no model there.
  broken_model["spec"]["model"]["path"] = "/models/absent";
  broken_model["spec"]["model"]["volume"]["subPath"] = "absent";
  std::ofstream(work_.path() / "broken.json") << broken_image.dump() << "\n"
                                              << broken_model.dump() << "\n";
  const KubectlResult applied =
      kubectl.run({"apply", "-f", (work_.path() / "broken.json").string()});
  ASSERT_EQ(applied.exit_status, 0) << applied.err;
  auto reasonOf = [&](const std::string& name) {
    return conditionOf(pool("PrefillPool", name), "Degraded").value("reason", "");
  };
  EXPECT_TRUE(eventually(
      [&] {
        const std::string reason = reasonOf("no-image");
        return reason == "ErrImagePull" || reason == "ImagePullBackOff";
      },
      seconds(90)))
      << pool("PrefillPool", "no-image").value_or(json()).dump();
  EXPECT_NE(conditionOf(pool("PrefillPool", "no-image"), "Degraded")
                .value("message", "")
                .find("ghcr.io/tandem/agent:0.0.0-absent"),
            std::string::npos)
      << pool("PrefillPool", "no-image").value_or(json()).dump();
  EXPECT_TRUE(eventually([&] { return reasonOf("no-model") == "CrashLoopBackOff"; }, seconds(90)))
      << pool("PrefillPool", "no-model").value_or(json()).dump() << podLogs("no-model");
  EXPECT_NE(conditionOf(pool("PrefillPool", "no-model"), "Degraded")
                .value("message", "")
                .find("/models/absent"),
            std::string::npos)
      << "the agent's own error names the path\n"
      << pool("PrefillPool", "no-model").value_or(json()).dump();

  for (const char* name : {"no-image", "no-model"}) {
    RecordProperty(std::string(name) + "_degraded",
                   conditionOf(pool("PrefillPool", name), "Degraded").value("message", ""));
  }

  // ---- a model from the Hub: the init container fetches it, the agent serves it ----
  HubServer hub(gateway);
  hub.publish("tandem/tiny", tinyModelDir(), {}, "main", "hf_pods");
  for (const auto& [secret, token] : {std::pair{"hf-token", "hf_pods"}, {"hf-wrong", "hf_nope"}}) {
    ASSERT_EQ(kubectl
                  .run({"create", "secret", "generic", secret, "-n", kNs,
                        std::string("--from-literal=HF_TOKEN=") + token})
                  .exit_status,
              0);
  }
  json from_hub = *pool("DecodePool", "decode");
  from_hub["metadata"] = {{"name", "from-hub"}, {"namespace", kNs}};
  from_hub.erase("status");
  from_hub["spec"]["replicas"] = 1;
  from_hub["spec"]["model"] = {{"source", "hf://tandem/tiny"},
                               {"name", "tiny"},
                               {"endpoint", hub.endpoint()},
                               {"tokenSecretRef", {{"name", "hf-token"}}}};
  json denied = from_hub;
  denied["metadata"]["name"] = "hub-denied";
  denied["spec"]["model"]["tokenSecretRef"]["name"] = "hf-wrong";
  std::ofstream(work_.path() / "hub.json") << from_hub.dump() << "\n" << denied.dump() << "\n";
  const KubectlResult hub_applied =
      kubectl.run({"apply", "-f", (work_.path() / "hub.json").string()});
  ASSERT_EQ(hub_applied.exit_status, 0) << hub_applied.err;
  auto modelReady = [&](const std::string& name) {
    return conditionOf(pool("DecodePool", name), "ModelReady");
  };
  ASSERT_TRUE(eventually([&] { return readyPods("from-hub").size() == 1; }, seconds(120)))
      << pool("DecodePool", "from-hub").value_or(json()).dump() << podLogs("from-hub");
  EXPECT_TRUE(
      eventually([&] { return modelReady("from-hub").value("status", "") == "True"; }, seconds(30)))
      << pool("DecodePool", "from-hub").value_or(json()).dump();
  EXPECT_EQ(modelReady("from-hub").value("reason", ""), "Fetched");
  const json hub_pod = readyPods("from-hub").at(0);
  httplib::Client from_hub_agent(hub_pod["status"].value("podIP", ""), 8000);
  from_hub_agent.set_read_timeout(60, 0);
  auto fetched_answer =
      from_hub_agent.Post("/v1/completions", greedy(prompt, 12).dump(), "application/json");
  ASSERT_TRUE(fetched_answer) << podLogs("from-hub");
  ASSERT_EQ(fetched_answer->status, 200) << fetched_answer->body;
  EXPECT_EQ(tokenIds(json::parse(fetched_answer->body)),
            tokenIds(host.post("/v1/completions", greedy(prompt, 12))))
      << "the fetched model's greedy tokens are the host agent's";
  int lfs_reads = 0;
  for (const HubServer::Request& request : hub.requests()) {
    if (request.server == "cdn") {
      ++lfs_reads;
      EXPECT_EQ(request.authorization, "") << "the token never reaches the CDN";
    }
  }
  EXPECT_GE(lfs_reads, 1);
  EXPECT_TRUE(eventually(
      [&] { return modelReady("hub-denied").value("reason", "") == "FetchFailed"; }, seconds(90)))
      << pool("DecodePool", "hub-denied").value_or(json()).dump() << podLogs("hub-denied");
  const std::string refusal = modelReady("hub-denied").value("message", "");
  EXPECT_NE(refusal.find("403 GatedRepo"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("the Secret hf-wrong (key HF_TOKEN"), std::string::npos) << refusal;
  RecordProperty("hub_denied_model_ready", refusal);

  // ---- helm uninstall: every container goes ----
  for (const char* name : {"no-image", "no-model"}) {
    EXPECT_EQ(kubectl.run({"delete", "prefillpool", name, "-n", kNs}).exit_status, 0);
  }
  for (const char* name : {"from-hub", "hub-denied"}) {
    EXPECT_EQ(kubectl.run({"delete", "decodepool", name, "-n", kNs}).exit_status, 0);
  }
  const CommandResult uninstalled = helm({"uninstall", "tandem", "--namespace", kNs}, kubeconfig);
  ASSERT_EQ(uninstalled.exit_status, 0) << describe(uninstalled);
  EXPECT_TRUE(eventually([&] { return pods.containers().empty(); }, seconds(120)))
      << "containers left after helm uninstall";
  // The Pod objects go a moment after their containers (the garbage
  // collector's pace under load).
  EXPECT_TRUE(eventually([&] { return api.list("v1", "Pod", kNs).empty(); }, seconds(60)));
  EXPECT_FALSE(pool("PrefillPool", "prefill").has_value());
}

}  // namespace
