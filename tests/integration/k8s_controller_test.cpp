// tandem-operator controller against the test API server, driven by the real
// kubectl: the pools and the router of examples/kubernetes/ become Deployments
// and Services with honest status; scaling, spec changes, crash loops, edits
// by others, conflicts, lost watches and leader election.
//
// The API server is in-process (tests/support/apiserver) with RBAC on; the
// chart's ServiceAccounts, Role and RoleBinding (rendered by the real helm,
// rbac.scope=namespace) are applied to it, and each controller is the real
// binary run with its own token from `kubectl create token` for the
// operator's ServiceAccount: every test passes only if the chart grants the
// controller enough, and the server counts each controller's writes by its
// token.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/loopback_socket.h"
#include "common/subprocess.h"
#include "operator/spec/agent_command.h"
#include "operator/spec/cluster_spec.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/apiserver/chart_install.h"
#include "tests/support/kubectl.h"
#include "tests/support/test_helpers.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tandem::Subprocess;
using tandem::testing::ApiServer;
using tandem::testing::ApiServerOptions;
using tandem::testing::eventually;
using tandem::testing::Kubectl;
using tandem::testing::KubectlResult;
using tandem::testing::RequestRecord;
using namespace std::chrono_literals;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kOperator = fs::path(TANDEM_BIN_DIR) / "tandem-operator";
constexpr const char* kNs = "default";

using tandem::freeLoopbackPort;

// The value of one sample of a metric in Prometheus text, or -1 when absent.
double metricValue(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

std::optional<json> condition(const json& object, const std::string& type) {
  if (!object.contains("status") || !object["status"].contains("conditions")) return std::nullopt;
  for (const json& c : object["status"]["conditions"]) {
    if (c.value("type", "") == type) return c;
  }
  return std::nullopt;
}

bool conditionIs(const std::optional<json>& object, const std::string& type,
                 const std::string& status) {
  if (!object) return false;
  const auto c = condition(*object, type);
  return c && c->value("status", "") == status;
}

// One controller process.
class Controller {
 public:
  // `token`: the bearer token it authenticates with.
  Controller(const ApiServer& server, const fs::path& dir, const std::string& identity,
             const std::string& token, const std::vector<std::string>& extra = {})
      : identity_(identity), token_(token), metrics_port_(freeLoopbackPort()) {
    kubeconfig_ = server.writeKubeconfig(dir / (identity + ".kubeconfig"), token, kNs);
    std::vector<std::string> argv = {
        kOperator.string(), "controller", "--kubeconfig",   kubeconfig_.string(),
        "--namespace",      kNs,          "--metrics-port", std::to_string(metrics_port_)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<Subprocess>(argv, dir / (identity + ".err"));
    started_ = !process_->waitForLine("controller started", 60s).empty();
  }
  bool started() const { return started_; }
  Subprocess& process() { return *process_; }
  const std::string& identity() const { return identity_; }
  const std::string& token() const { return token_; }
  std::string metrics() const {
    httplib::Client client("127.0.0.1", metrics_port_);
    client.set_read_timeout(5, 0);
    auto response = client.Get("/metrics");
    return response && response->status == 200 ? response->body : "";
  }
  double reconciles(const std::string& kind) const {
    return metricValue(
        metrics(), "tandem_operator_reconciles_total{kind=\"" + kind + "\",result=\"success\"}");
  }
  bool isLeader() const { return metricValue(metrics(), "tandem_operator_is_leader") == 1; }
  std::string stderrText() const { return process_->stderrText(); }

 private:
  std::string identity_;
  std::string token_;
  int metrics_port_;
  fs::path kubeconfig_;
  std::unique_ptr<Subprocess> process_;
  bool started_ = false;
};

class K8sControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem-k8s-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // kubectl sends bearer tokens over TLS only.
    ApiServerOptions options;
    options.tls = true;
    options.rbac = true;
    server_ = std::make_unique<ApiServer>(options);
    server_->setDeploymentControllerAuto(true);
    // "user" is a plain token: a superuser, like a cluster administrator.
    kubectl_ = std::make_unique<Kubectl>(server_->writeKubeconfig(dir_ / "user.kubeconfig", "user"),
                                         dir_ / "user");
    const KubectlResult crds = kubectl({"apply", "-f", (kSourceDir / "crds").string()});
    ASSERT_EQ(crds.exit_status, 0) << crds.err;
    installChartRbac();
  }

  // The chart's ServiceAccounts, Role and RoleBinding for release "tandem"
  // in the test namespace, applied with kubectl.
  void installChartRbac() {
    const tandem::testing::RenderedChart chart =
        tandem::testing::helmTemplate(dir_ / "helm", "tandem", kSourceDir / "charts/tandem", kNs,
                                      {"--set", "rbac.scope=namespace"});
    ASSERT_EQ(chart.exit_status, 0) << chart.err;
    const std::vector<json> rbac =
        tandem::testing::objectsOfKinds(chart.objects, {"ServiceAccount", "Role", "RoleBinding"});
    for (const json& object : rbac) {
      if (object["kind"] == "ServiceAccount" &&
          object["metadata"]["labels"].value("app.kubernetes.io/component", "") == "operator") {
        operator_service_account_ = object["metadata"]["name"];
      }
    }
    ASSERT_FALSE(operator_service_account_.empty()) << "no operator ServiceAccount rendered";
    const KubectlResult applied =
        kubectl({"apply", "-f", tandem::testing::writeObjects(dir_ / "rbac.json", rbac).string()});
    ASSERT_EQ(applied.exit_status, 0) << applied.err;
  }

  // A new token of the operator's ServiceAccount (kubectl create token).
  std::string operatorToken() {
    std::string error;
    const std::string token = tandem::testing::createServiceAccountToken(
        *kubectl_, kNs, operator_service_account_, error);
    EXPECT_FALSE(token.empty()) << error;
    return token;
  }

  // Requests answered 403 Forbidden.
  std::vector<std::string> forbiddenRequests() const {
    std::vector<std::string> forbidden;
    for (const RequestRecord& record : server_->answeredRequests()) {
      if (record.status == 403) {
        forbidden.push_back(record.method + " " + record.target + " " + record.user);
      }
    }
    return forbidden;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  KubectlResult kubectl(const std::vector<std::string>& args) { return kubectl_->run(args); }
  // `kubectl apply` of a YAML text (written to a file in the test's directory).
  KubectlResult applyText(const std::string& yaml) {
    const fs::path file = dir_ / "applied.yaml";
    std::ofstream(file) << yaml;
    return kubectl({"apply", "-f", file.string()});
  }

  void applyExamples() {
    for (const char* file : {"secret.yaml", "prefillpool.yaml", "decodepool.yaml", "router.yaml"}) {
      const KubectlResult applied =
          kubectl({"apply", "-f", (kSourceDir / "examples/kubernetes" / file).string()});
      ASSERT_EQ(applied.exit_status, 0) << file << ": " << applied.err;
    }
  }

  std::optional<json> get(const std::string& api_version, const std::string& kind,
                          const std::string& name) {
    return server_->get(api_version, kind, kNs, name);
  }
  std::optional<json> deployment(const std::string& name) {
    return get("apps/v1", "Deployment", name);
  }
  std::optional<json> prefillPool() { return get("tandem.dev/v1alpha1", "PrefillPool", "prefill"); }

  // The pool's Deployment exists and the pool says Ready=True for its generation.
  bool poolReady(const std::string& kind, const std::string& name) {
    const auto pool = get("tandem.dev/v1alpha1", kind, name);
    if (!pool || !conditionIs(pool, "Ready", "True")) return false;
    return pool->at("status").value("observedGeneration", int64_t{-1}) ==
           pool->at("metadata").value("generation", int64_t{0});
  }

  // Write requests made with `token` other than to Leases and Events.
  size_t objectWritesBy(const std::string& token) const {
    size_t writes = 0;
    for (const RequestRecord& record : server_->answeredRequests()) {
      if (record.token != token || record.method == "GET") continue;
      if (record.target.find("/leases") != std::string::npos ||
          record.target.find("/events") != std::string::npos)
        continue;
      ++writes;
    }
    return writes;
  }

  fs::path dir_;
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<Kubectl> kubectl_;
  std::string operator_service_account_;
};

// The container args of a pool's Deployment are what local mode runs for the
// same document, with the in-cluster host and port.
TEST_F(K8sControllerTest, ExamplePoolsBecomeDeploymentsAndServicesWithLocalModesArguments) {
  applyExamples();
  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();

  ASSERT_TRUE(eventually([&] { return poolReady("PrefillPool", "prefill"); }, 30s))
      << controller.stderrText();
  ASSERT_TRUE(eventually([&] { return poolReady("DecodePool", "decode"); }, 30s));

  for (const auto& [kind, name, role] : {std::tuple{"PrefillPool", "prefill", "prefill"},
                                         std::tuple{"DecodePool", "decode", "decode"}}) {
    SCOPED_TRACE(name);
    const json pool = *get("tandem.dev/v1alpha1", kind, name);
    const json deploy = *deployment(name);
    const json service = *get("v1", "Service", name);

    // Owner: the pool, as controller.
    for (const json& child : {deploy, service}) {
      ASSERT_EQ(child["metadata"]["ownerReferences"].size(), 1u);
      const json& owner = child["metadata"]["ownerReferences"][0];
      EXPECT_EQ(owner["kind"], kind);
      EXPECT_EQ(owner["name"], name);
      EXPECT_EQ(owner["uid"], pool["metadata"]["uid"]);
      EXPECT_EQ(owner["controller"], true);
      const json& labels = child["metadata"]["labels"];
      EXPECT_EQ(labels["app.kubernetes.io/managed-by"], "tandem-operator");
      EXPECT_EQ(labels["app.kubernetes.io/instance"], name);
      EXPECT_EQ(labels["app.kubernetes.io/component"], role);
      EXPECT_EQ(labels["tandem.dev/pool"], name);
      EXPECT_EQ(labels["tandem.dev/role"], role);
    }
    EXPECT_EQ(service["spec"]["clusterIP"], "None");

    // The arguments: local mode's mapping of the same document.
    const tandem::spec::PoolSpec spec = tandem::spec::parsePoolObject(
        pool,
        std::string(kind) == "PrefillPool" ? tandem::spec::PoolKind::kPrefill
                                           : tandem::spec::PoolKind::kDecode,
        name);
    std::vector<std::string> expected =
        tandem::spec::agentArguments(spec, "tandem-agent", "0.0.0.0", 8000);
    expected.erase(expected.begin());
    const json& container = deploy["spec"]["template"]["spec"]["containers"][0];
    EXPECT_EQ(container["args"].get<std::vector<std::string>>(), expected);
    EXPECT_EQ(deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    EXPECT_EQ(deploy["spec"]["replicas"], pool["spec"]["replicas"]);
    // The shared KV secret comes from the Secret the pool names.
    bool secret_env = false;
    for (const json& env : container["env"]) {
      if (env["name"] == "TANDEM_KV_SECRET") {
        secret_env = true;
        EXPECT_EQ(env["valueFrom"]["secretKeyRef"]["name"],
                  pool["spec"]["kvTransfer"]["secretRef"]["name"]);
      }
    }
    EXPECT_TRUE(secret_env);
    EXPECT_EQ(pool["status"]["selector"],
              "tandem.dev/pool=" + std::string(name) + ",tandem.dev/role=" + role);
  }
  ASSERT_TRUE(eventually(
      [&] {
        return deployment("router").has_value() && get("v1", "Service", "router").has_value() &&
               conditionIs(get("tandem.dev/v1alpha1", "Router", "router"), "Ready", "True");
      },
      30s))
      << ::testing::PrintToString(get("tandem.dev/v1alpha1", "Router", "router"));
  const json router_args =
      deployment("router")->at("spec")["template"]["spec"]["containers"][0]["args"];
  const std::vector<std::string> expected_router_args = {
      "router",         "--discover", "--namespace",   kNs,
      "--prefill-pool", "prefill",    "--decode-pool", "decode"};
  for (const std::string& arg : expected_router_args) {
    EXPECT_NE(std::find(router_args.begin(), router_args.end(), arg), router_args.end())
        << arg << " missing from " << router_args.dump();
  }

  // What it did is in the pool's events, as kubectl describe shows them.
  const KubectlResult described = kubectl({"describe", "prefillpool", "prefill"});
  ASSERT_EQ(described.exit_status, 0) << described.err;
  EXPECT_TRUE(std::regex_search(
      described.out,
      std::regex(R"(Normal\s+Created\s+.*tandem-operator\s+Created Deployment prefill)")))
      << described.out;

  // A second reconcile of an unchanged world writes nothing: an annotation
  // (not spec) makes the controller look again.
  const size_t writes = objectWritesBy(controller.token());
  const double reconciles = controller.reconciles("PrefillPool");
  ASSERT_EQ(kubectl({"annotate", "prefillpool", "prefill", "example.com/touched=1"}).exit_status,
            0);
  ASSERT_TRUE(eventually([&] { return controller.reconciles("PrefillPool") > reconciles; }, 20s));
  EXPECT_EQ(objectWritesBy(controller.token()), writes)
      << ::testing::PrintToString(server_->requestLog());

  // All of it within what the chart's Role grants.
  EXPECT_EQ(forbiddenRequests(), std::vector<std::string>{});
  EXPECT_GT(server_->writesBy("system:serviceaccount:default:" + operator_service_account_), 0u);
}

TEST_F(K8sControllerTest, ScaleFollowsAndStatusTellsTheTruth) {
  applyExamples();
  // /scale works right after creation (spec.replicas is defaulted).
  const KubectlResult scale = kubectl(
      {"get", "--raw", "/apis/tandem.dev/v1alpha1/namespaces/default/prefillpools/prefill/scale"});
  ASSERT_EQ(scale.exit_status, 0) << scale.err;
  EXPECT_EQ(json::parse(scale.out)["kind"], "Scale");
  EXPECT_EQ(json::parse(scale.out)["spec"]["replicas"], 1);

  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();
  ASSERT_TRUE(eventually([&] { return poolReady("PrefillPool", "prefill"); }, 30s));

  ASSERT_EQ(kubectl({"scale", "prefillpool/prefill", "--replicas=3"}).exit_status, 0);
  ASSERT_TRUE(eventually(
      [&] {
        const auto d = deployment("prefill");
        return d && d->at("spec").value("replicas", 0) == 3;
      },
      30s));
  ASSERT_TRUE(eventually(
      [&] {
        const auto pool = prefillPool();
        return pool && pool->at("status").value("replicas", 0) == 3 &&
               pool->at("status").value("readyReplicas", 0) == 3 &&
               poolReady("PrefillPool", "prefill");
      },
      30s));

  const KubectlResult table = kubectl({"get", "prefillpools"});
  ASSERT_EQ(table.exit_status, 0) << table.err;
  EXPECT_TRUE(std::regex_search(table.out, std::regex(R"(prefill\s+.*\b3\s+3\b)"))) << table.out;
  EXPECT_NE(table.out.find("DESIRED"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("READY"), std::string::npos) << table.out;
}

// Progressing while a replica runs the old template, Ready only after; a
// crash-looping pod makes the pool Degraded with its reason.
TEST_F(K8sControllerTest, RolloutIsProgressingUntilEveryReplicaIsUpdatedAndCrashLoopsDegrade) {
  applyExamples();
  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();
  ASSERT_TRUE(eventually([&] { return poolReady("PrefillPool", "prefill"); }, 30s));
  ASSERT_EQ(kubectl({"scale", "prefillpool/prefill", "--replicas=3"}).exit_status, 0);
  ASSERT_TRUE(
      eventually([&] { return prefillPool()->at("status").value("readyReplicas", 0) == 3; }, 30s));

  // The rollout: the Deployment controller is now played by hand.
  server_->setDeploymentControllerAuto(false);
  const std::string old_args = deployment("prefill")->at("spec")["template"].dump();
  ASSERT_EQ(kubectl({"patch", "prefillpool", "prefill", "--type=merge", "-p",
                     R"({"spec":{"engine":{"maxNumSeqs":17}}})"})
                .exit_status,
            0);
  const int64_t generation = prefillPool()->at("metadata").value("generation", int64_t{0});
  ASSERT_TRUE(eventually(
      [&] { return deployment("prefill")->at("spec")["template"].dump() != old_args; }, 30s));
  const json args = deployment("prefill")->at("spec")["template"]["spec"]["containers"][0]["args"];
  EXPECT_NE(args.dump().find("\"--max-num-seqs\",\"17\""), std::string::npos) << args.dump();

  server_->setDeploymentStatus(kNs, "prefill", 4, 1, 3);
  ASSERT_TRUE(eventually(
      [&] {
        const auto pool = prefillPool();
        return conditionIs(pool, "Progressing", "True") && conditionIs(pool, "Ready", "False") &&
               pool->at("status").value("observedGeneration", int64_t{0}) == generation &&
               pool->at("status").value("updatedReplicas", 0) == 1;
      },
      30s))
      << prefillPool()->dump();

  server_->setDeploymentStatus(kNs, "prefill", 3, 3, 3);
  ASSERT_TRUE(eventually(
      [&] {
        const auto pool = prefillPool();
        return conditionIs(pool, "Progressing", "False") && conditionIs(pool, "Ready", "True");
      },
      30s))
      << prefillPool()->dump();

  // A crash-looping agent.
  const json template_labels = deployment("prefill")->at("spec")["template"]["metadata"]["labels"];
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "prefill-crash-0"}, {"namespace", kNs}, {"labels", template_labels}}},
      {"spec", {{"containers", json::array({{{"name", "agent"}, {"image", "x"}}})}}},
      {"status",
       {{"phase", "Running"},
        {"containerStatuses",
         json::array({{{"name", "agent"},
                       {"ready", false},
                       {"restartCount", 5},
                       {"state",
                        {{"waiting",
                          {{"reason", "CrashLoopBackOff"},
                           {"message", "back-off 5m0s restarting failed container"}}}}}}})}}}};
  server_->put(pod);
  ASSERT_TRUE(eventually(
      [&] {
        const auto pool = prefillPool();
        const auto degraded = pool ? condition(*pool, "Degraded") : std::nullopt;
        return degraded && degraded->value("status", "") == "True" &&
               degraded->value("reason", "") == "CrashLoopBackOff" &&
               degraded->value("message", "").find("prefill-crash-0") != std::string::npos;
      },
      30s))
      << prefillPool()->dump();
}

// Children deleted or edited by someone else are put back; injected 409s
// are retried; changes made while the controller's watches are down (and
// after the history was compacted) are not missed.
TEST_F(K8sControllerTest, ChildrenArePutBackAndNoChangeIsLost) {
  applyExamples();
  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();
  ASSERT_TRUE(eventually([&] { return poolReady("DecodePool", "decode"); }, 30s));

  const std::string old_uid = deployment("decode")->at("metadata")["uid"];
  ASSERT_EQ(kubectl({"delete", "deployment", "decode"}).exit_status, 0);
  ASSERT_TRUE(eventually(
      [&] {
        const auto d = deployment("decode");
        return d && d->at("metadata")["uid"] != old_uid;
      },
      30s));
  ASSERT_EQ(kubectl({"delete", "service", "decode"}).exit_status, 0);
  ASSERT_TRUE(eventually([&] { return get("v1", "Service", "decode").has_value(); }, 30s));

  ASSERT_EQ(
      kubectl(
          {"patch", "deployment", "decode", "--type=merge", "-p",
           R"({"spec":{"replicas":7,"template":{"spec":{"containers":[{"name":"agent","args":["oops"]}]}}}})"})
          .exit_status,
      0);
  const json pool = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  ASSERT_TRUE(eventually(
      [&] {
        const auto d = deployment("decode");
        return d && d->at("spec")["replicas"] == pool["spec"]["replicas"] &&
               d->at("spec")["template"]["spec"]["containers"][0]["args"].size() > 1;
      },
      30s))
      << deployment("decode")->dump();

  // Conflicts on the next writes: retried, nothing lost.
  server_->injectConflicts(3, "Deployment");
  ASSERT_EQ(kubectl({"scale", "decodepool/decode", "--replicas=2"}).exit_status, 0);
  ASSERT_TRUE(
      eventually([&] { return deployment("decode")->at("spec").value("replicas", 0) == 2; }, 30s));

  // Changes while the controller cannot see them, then history compacted:
  // its watches get 410 and it relists.
  controller.process().signal(SIGSTOP);
  ASSERT_EQ(kubectl({"scale", "decodepool/decode", "--replicas=4"}).exit_status, 0);
  ASSERT_EQ(kubectl({"delete", "service", "prefill"}).exit_status, 0);
  server_->compactHistory();
  controller.process().signal(SIGCONT);
  ASSERT_TRUE(
      eventually([&] { return deployment("decode")->at("spec").value("replicas", 0) == 4; }, 30s));
  ASSERT_TRUE(eventually([&] { return get("v1", "Service", "prefill").has_value(); }, 30s));
  EXPECT_GT(
      metricValue(controller.metrics(), "tandem_operator_relists_total{resource=\"decodepools\"}"),
      0);
}

// Two controllers: exactly one writes. The leader stopped (SIGTERM releases
// the Lease; SIGKILL lets it expire) → the other takes over; a leader whose
// Lease is taken away stops writing.
TEST_F(K8sControllerTest, OnlyTheLeaderWritesAndAnotherTakesOver) {
  applyExamples();
  const std::vector<std::string> election = {"--leader-elect",
                                             "--leader-elect-lease-duration",
                                             "3",
                                             "--leader-elect-renew-deadline",
                                             "2",
                                             "--leader-elect-retry-period",
                                             "0.5"};
  // Leaders print "leading" before "controller started" (caches sync once
  // leading); a follower prints only the latter.
  auto a = std::make_unique<Controller>(*server_, dir_, "controller-a", operatorToken(), election);
  auto b = std::make_unique<Controller>(*server_, dir_, "controller-b", operatorToken(), election);
  ASSERT_TRUE(a->started() && b->started()) << a->stderrText() << b->stderrText();
  ASSERT_TRUE(eventually([&] { return poolReady("PrefillPool", "prefill"); }, 30s));
  ASSERT_TRUE(eventually([&] { return a->isLeader() != b->isLeader(); }, 30s));
  Controller* leader = a->isLeader() ? a.get() : b.get();
  Controller* follower = a->isLeader() ? b.get() : a.get();
  // A request is recorded once answered, just after the store changed: wait for it.
  EXPECT_TRUE(eventually([&] { return objectWritesBy(leader->token()) > 0; }, 10s));
  EXPECT_EQ(objectWritesBy(follower->token()), 0u);

  // SIGTERM: the Lease is released and the other leads, well within a lease.
  leader->process().signal(SIGTERM);
  ASSERT_EQ(leader->process().wait(20s), 0) << leader->stderrText();
  ASSERT_TRUE(eventually([&] { return follower->isLeader(); }, 10s));
  ASSERT_EQ(kubectl({"scale", "prefillpool/prefill", "--replicas=2"}).exit_status, 0);
  ASSERT_TRUE(
      eventually([&] { return deployment("prefill")->at("spec").value("replicas", 0) == 2; }, 30s));
  EXPECT_TRUE(eventually([&] { return objectWritesBy(follower->token()) > 0; }, 10s));

  // SIGKILL: nothing is released; a new candidate takes over once the lease
  // has expired on its own clock.
  auto c = std::make_unique<Controller>(*server_, dir_, "controller-c", operatorToken(), election);
  ASSERT_TRUE(c->started());
  follower->process().signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return c->isLeader(); }, 20s)) << c->stderrText();
  ASSERT_EQ(kubectl({"scale", "prefillpool/prefill", "--replicas=3"}).exit_status, 0);
  ASSERT_TRUE(
      eventually([&] { return deployment("prefill")->at("spec").value("replicas", 0) == 3; }, 30s));

  // The Lease taken away: c stops leading and stops writing.
  json lease = *get("coordination.k8s.io/v1", "Lease", "tandem-operator");
  lease["spec"]["holderIdentity"] = "someone-else";
  lease["spec"]["leaseDurationSeconds"] = 3600;
  server_->put(lease);
  ASSERT_TRUE(eventually([&] { return !c->isLeader(); }, 20s));
  const size_t writes = objectWritesBy(c->token());
  ASSERT_EQ(kubectl({"scale", "prefillpool/prefill", "--replicas=1"}).exit_status, 0);
  // Absence can only be observed over a window: several retry periods.
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(objectWritesBy(c->token()), writes);
  EXPECT_EQ(deployment("prefill")->at("spec").value("replicas", 0), 3);
}

// spec.template puts a pool's pods where a GPU cluster needs them: each
// field applied with kubectl reaches the Deployment's pod template exactly,
// and what the controller owns (the agent's args, the selector labels, its
// env and volumes) stays its own, with a Warning event naming each ignored
// field.
TEST_F(K8sControllerTest, PodTemplateFieldsReachThePodsAndOwnedFieldsStayTheControllers) {
  const KubectlResult applied = applyText(R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: decode, namespace: default}
spec:
  image: ghcr.io/tandem/agent:0.1.0
  model: {path: /models/small}
  kvTransfer: {secretRef: {name: kv, key: secret}}
  template:
    metadata:
      annotations: {k8s.v1.cni.cncf.io/networks: rdma-net}
      labels: {team: serving, tandem.dev/pool: mine}
    spec:
      nodeSelector: {nvidia.com/gpu.product: H100}
      tolerations:
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [a]}]
      priorityClassName: serving-critical
      runtimeClassName: nvidia
      volumes:
        - {name: cache, emptyDir: {}}
        - {name: dshm, emptyDir: {}}
      containers:
        - name: agent
          args: [serve, --model, /elsewhere]
          securityContext: {capabilities: {add: [IPC_LOCK]}}
          envFrom: [{secretRef: {name: hf-token}}]
          env:
            - {name: NCCL_DEBUG, value: INFO}
            - {name: POD_IP, value: 1.2.3.4}
          volumeMounts: [{name: cache, mountPath: /cache}]
)");
  ASSERT_EQ(applied.exit_status, 0) << applied.err;
  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();
  ASSERT_TRUE(eventually([&] { return deployment("decode").has_value(); }, 30s))
      << controller.stderrText()
      << get("tandem.dev/v1alpha1", "DecodePool", "decode").value_or(json()).dump();

  const json pool = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  const json& written = pool["spec"]["template"]["spec"];
  const json pod_template = deployment("decode")->at("spec")["template"];
  const json& pod = pod_template["spec"];
  for (const char* field :
       {"nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName"}) {
    EXPECT_EQ(pod[field], written[field]) << field;
  }
  EXPECT_EQ(pod_template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"], "rdma-net");
  EXPECT_EQ(pod_template["metadata"]["labels"]["team"], "serving");
  EXPECT_EQ(pod_template["metadata"]["labels"]["tandem.dev/pool"], "decode")
      << "the selector label stays the controller's";
  const json& agent = pod["containers"][0];
  EXPECT_EQ(agent["name"], "agent");
  EXPECT_EQ(agent["securityContext"]["capabilities"]["add"], json::array({"IPC_LOCK"}));
  EXPECT_EQ(agent["envFrom"], json::array({{{"secretRef", {{"name", "hf-token"}}}}}));
  std::map<std::string, json> env;
  for (const json& variable : agent["env"]) env[variable["name"]] = variable;
  EXPECT_EQ(env["NCCL_DEBUG"]["value"], "INFO");
  EXPECT_EQ(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
      << "POD_IP stays the controller's";
  bool cache_volume = false;
  bool shm_is_memory = false;
  for (const json& volume : pod["volumes"]) {
    cache_volume = cache_volume || volume["name"] == "cache";
    if (volume["name"] == "dshm")
      shm_is_memory = volume["emptyDir"].value("medium", "") == "Memory";
  }
  EXPECT_TRUE(cache_volume);
  EXPECT_TRUE(shm_is_memory) << "the controller's dshm volume stays its own";
  bool cache_mount = false;
  for (const json& mount : agent["volumeMounts"])
    cache_mount = cache_mount || mount["mountPath"] == "/cache";
  EXPECT_TRUE(cache_mount);
  // The arguments are still local mode's mapping of the pool.
  std::vector<std::string> expected = tandem::spec::agentArguments(
      tandem::spec::parsePoolObject(pool, tandem::spec::PoolKind::kDecode, "decode"),
      "tandem-agent", "0.0.0.0", 8000);
  expected.erase(expected.begin());
  EXPECT_EQ(agent["args"].get<std::vector<std::string>>(), expected);

  // One Warning event names every field the controller kept.
  std::string ignored;
  ASSERT_TRUE(eventually(
      [&] {
        for (const json& event : server_->list("v1", "Event", kNs)) {
          if (event.value("reason", "") == "TemplateFieldIgnored")
            ignored = event.value("message", "");
        }
        return !ignored.empty();
      },
      30s))
      << controller.stderrText();
  for (const char* path :
       {"template.spec.containers[agent].args", "template.spec.containers[agent].env[POD_IP]",
        "template.spec.volumes[dshm]", "template.metadata.labels.tandem.dev/pool"}) {
    EXPECT_NE(ignored.find(path), std::string::npos) << path << " not in: " << ignored;
  }
}

// A pool whose model is fetched from the Hub: the init container of the
// agent's image, the served name in status and in kubectl's columns, and
// ModelReady following the init container's status as the kubelet writes it.
TEST_F(K8sControllerTest, AnHfPoolFetchesInAnInitContainerAndModelReadyFollowsIt) {
  ASSERT_EQ(applyText(R"(apiVersion: tandem.dev/v1alpha1
kind: DecodePool
metadata: {name: decode, namespace: default}
spec:
  image: ghcr.io/tandem/agent:0.1.0
  model:
    source: hf://org/m@v1
    tokenSecretRef: {name: hf-token}
  kvTransfer: {secretRef: {name: kv, key: secret}}
)")
                .exit_status,
            0);
  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();
  ASSERT_TRUE(eventually([&] { return deployment("decode").has_value(); }, 30s))
      << controller.stderrText();
  const json pod_spec = deployment("decode")->at("spec")["template"]["spec"];
  ASSERT_EQ(pod_spec["initContainers"].size(), 1u) << pod_spec.dump();
  EXPECT_EQ(pod_spec["initContainers"][0]["name"], "model-fetch");
  EXPECT_EQ(pod_spec["initContainers"][0]["image"], "ghcr.io/tandem/agent:0.1.0");

  auto decodePool = [&] { return get("tandem.dev/v1alpha1", "DecodePool", "decode"); };
  auto modelReady = [&]() -> json {
    const auto pool = decodePool();
    return pool ? condition(*pool, "ModelReady").value_or(json::object()) : json::object();
  };
  ASSERT_TRUE(eventually([&] { return modelReady().value("reason", "") == "Pending"; }, 30s))
      << decodePool().value_or(json()).dump();
  EXPECT_EQ(decodePool()->at("status")["servedModel"], "org/m");
  EXPECT_EQ(decodePool()->at("status")["modelSource"], "hf://org/m@v1");

  // The kubelet's view of a pod whose fetch failed, then of one that fetched.
  const json labels = deployment("decode")->at("spec")["template"]["metadata"]["labels"];
  auto podWith = [&](const json& init_status) {
    return json{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", "decode-0"}, {"namespace", kNs}, {"labels", labels}}},
        {"spec", {{"containers", json::array({{{"name", "agent"}, {"image", "x"}}})}}},
        {"status", {{"phase", "Pending"}, {"initContainerStatuses", json::array({init_status})}}}};
  };
  const std::string words =
      "hf://org/m@v1: the Hub refused the revision's metadata (401 GatedRepo: Access to model "
      "org/m is restricted.); the token from the Secret hf-token (key HF_TOKEN, "
      "spec.model.tokenSecretRef) has no access to it";
  server_->put(podWith({{"name", "model-fetch"},
                        {"ready", false},
                        {"restartCount", 2},
                        {"state", {{"waiting", {{"reason", "CrashLoopBackOff"}}}}},
                        {"lastState", {{"terminated", {{"exitCode", 1}, {"message", words}}}}}}));
  ASSERT_TRUE(eventually([&] { return modelReady().value("reason", "") == "FetchFailed"; }, 30s))
      << decodePool().value_or(json()).dump();
  EXPECT_EQ(modelReady()["status"], "False");
  EXPECT_EQ(modelReady()["message"], "pod decode-0: model-fetch: " + words);
  const KubectlResult listed = kubectl({"get", "decodepool", "decode", "-o", "wide"});
  ASSERT_EQ(listed.exit_status, 0) << listed.err;
  EXPECT_NE(listed.out.find("MODEL-READY"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("org/m"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("hf://org/m@v1"), std::string::npos) << listed.out;

  // The GPU-cluster quick start's file is accepted by the CRDs' schemas.
  const KubectlResult example = kubectl(
      {"apply", "--dry-run=server", "-f", (kSourceDir / "examples/kubernetes-gpu").string()});
  EXPECT_EQ(example.exit_status, 0) << example.err;

  server_->put(podWith({{"name", "model-fetch"},
                        {"ready", false},
                        {"restartCount", 3},
                        {"state", {{"terminated", {{"exitCode", 0}, {"reason", "Completed"}}}}}}));
  ASSERT_TRUE(eventually([&] { return modelReady().value("status", "") == "True"; }, 30s))
      << decodePool().value_or(json()).dump();
  EXPECT_EQ(modelReady()["reason"], "Fetched");
}

// A namespace enforcing the Pod Security Standards' restricted level (the
// API stand-in admits pods as Pod Security Admission does) runs the
// example pools and router: every generated pod meets it. A template that
// asks for what the level forbids (IPC_LOCK) gets no pods, and the pool
// says why in its Degraded condition.
TEST_F(K8sControllerTest, ARestrictedNamespaceRunsThePoolsAndAForbiddenTemplateSaysWhy) {
  const KubectlResult labelled = applyText(R"(apiVersion: v1
kind: Namespace
metadata:
  name: default
  labels: {pod-security.kubernetes.io/enforce: restricted}
)");
  ASSERT_EQ(labelled.exit_status, 0) << labelled.err;
  applyExamples();
  Controller controller(*server_, dir_, "controller-a", operatorToken());
  ASSERT_TRUE(controller.started()) << controller.stderrText();
  for (const auto& [kind, name] : std::vector<std::pair<std::string, std::string>>{
           {"PrefillPool", "prefill"}, {"DecodePool", "decode"}}) {
    EXPECT_TRUE(eventually([&] { return poolReady(kind, name); }, 30s))
        << get("tandem.dev/v1alpha1", kind, name)->dump();
  }
  const KubectlResult pods = kubectl({"get", "pods", "-o", "json"});
  ASSERT_EQ(pods.exit_status, 0) << pods.err;
  std::set<std::string> owners;
  const json listed = json::parse(pods.out);
  for (const json& pod : listed["items"]) {
    owners.insert(pod["metadata"]["ownerReferences"][0].value("name", ""));
  }
  EXPECT_EQ(owners, (std::set<std::string>{"prefill", "decode", "router"})) << pods.out;

  const KubectlResult patched =
      kubectl({"patch", "prefillpool/prefill", "--type", "merge", "-p",
               R"({"spec": {"template": {"spec": {"containers": [{"name": "agent",
                   "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}}}})"});
  ASSERT_EQ(patched.exit_status, 0) << patched.err;
  EXPECT_TRUE(eventually(
      [&] {
        const auto pool = prefillPool();
        const auto degraded = pool ? condition(*pool, "Degraded") : std::nullopt;
        const std::string message = degraded ? degraded->value("message", "") : "";
        return degraded && degraded->value("status", "") == "True" &&
               degraded->value("reason", "") == "ReplicaFailure" &&
               message.find(
                   "violates PodSecurity \"restricted:latest\": unrestricted "
                   "capabilities (container \"agent\" must not include \"IPC_LOCK\" "
                   "in securityContext.capabilities.add)") != std::string::npos;
      },
      30s))
      << prefillPool()->dump();
}

// The CRDs' patterns refuse at `kubectl apply` what the API server would
// not accept in the objects the controller makes (a Secret or claim name,
// a quantity): the user sees it at once, not later in a status condition.
TEST_F(K8sControllerTest, KubectlApplyRefusesNamesAndQuantitiesTheClusterWouldNot) {
  // A DecodePool "decode" whose hf:// model has this token Secret and cache.
  auto applyPool = [&](const std::string& token_secret, const std::string& cache) {
    return applyText(
        "apiVersion: tandem.dev/v1alpha1\nkind: DecodePool\n"
        "metadata: {name: decode, namespace: default}\nspec:\n  model:\n"
        "    source: hf://org/m\n    tokenSecretRef: " +
        token_secret + "\n    cache: " + cache + "\n");
  };
  const KubectlResult refused = applyPool("{name: HF_Token}", "{sizeLimit: 40 GB}");
  EXPECT_NE(refused.exit_status, 0);
  EXPECT_NE(refused.err.find("The DecodePool \"decode\" is invalid"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("spec.model.tokenSecretRef.name: Invalid value: \"HF_Token\": "
                             "spec.model.tokenSecretRef.name in body should match"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("spec.model.cache.sizeLimit: Invalid value: \"40 GB\": "
                             "spec.model.cache.sizeLimit in body should match"),
            std::string::npos)
      << refused.err;
  EXPECT_FALSE(get("tandem.dev/v1alpha1", "DecodePool", "decode").has_value());

  const KubectlResult accepted = applyPool("{name: hf-token, key: HF_TOKEN}", "{sizeLimit: 40Gi}");
  EXPECT_EQ(accepted.exit_status, 0) << accepted.err;
}

}  // namespace
