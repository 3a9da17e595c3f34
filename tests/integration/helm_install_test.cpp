// `helm install` of charts/tandem end to end, without a cluster: the chart
// rendered by the real helm (examples on), its CRDs and then every rendered
// object applied with the real kubectl to the test API server with RBAC on,
// and the real tandem-operator started with exactly the arguments of the
// rendered operator Deployment (plus --kubeconfig with a token of the
// operator's ServiceAccount, and another --metrics-port only when the
// rendered one is taken). For rbac.scope namespace and cluster: the example
// pools and router become Deployments and Services with the chart's images,
// the pools become Ready, the operator is never refused, and what its
// ServiceAccount (and the router's) may not do is refused with the real
// API's 403. A Role missing one verb the operator needs is reported as the
// 403 it causes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/loopback_socket.h"
#include "common/prometheus_text.h"
#include "common/subprocess.h"
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
const fs::path kChart = kSourceDir / "charts/tandem";
const fs::path kOperator = fs::path(TANDEM_BIN_DIR) / "tandem-operator";
constexpr const char* kNs = "tandem";

// Whether `port` can be bound on every address (as the operator binds it).
bool portFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return bound;
}

using tandem::freeLoopbackPort;

bool conditionTrue(const std::optional<json>& object, const std::string& type) {
  if (!object || !object->contains("status") || !(*object)["status"].contains("conditions"))
    return false;
  for (const json& condition : (*object)["status"]["conditions"]) {
    if (condition.value("type", "") == type) return condition.value("status", "") == "True";
  }
  return false;
}

// The value following `flag` in `args`, or "".
std::string flagValue(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) return args[i + 1];
  }
  return "";
}

class HelmInstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem-helm-install-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // kubectl sends bearer tokens over TLS only.
    ApiServerOptions options;
    options.tls = true;
    options.rbac = true;
    server_ = std::make_unique<ApiServer>(options);
    server_->setDeploymentControllerAuto(true);
    // A plain token: a superuser, as the one running helm install would be.
    admin_ = std::make_unique<Kubectl>(server_->writeKubeconfig(dir_ / "admin.kubeconfig", "admin"),
                                       dir_ / "admin");
  }
  void TearDown() override {
    if (operator_) {
      operator_->signal(SIGTERM);
      operator_->wait(20s);
    }
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // What helm install does here: the chart's CRDs first, then every
  // rendered object, in the release namespace (created beforehand).
  void install(const std::string& scope, const std::function<void(std::vector<json>&)>& edit = {}) {
    const tandem::testing::RenderedChart chart = tandem::testing::helmTemplate(
        dir_ / "helm", "tandem", kChart, kNs,
        {"--set", "examples.enabled=true", "--set", "rbac.scope=" + scope});
    ASSERT_EQ(chart.exit_status, 0) << chart.err;
    objects_ = chart.objects;
    if (edit) edit(objects_);
    const KubectlResult crds = admin_->run({"apply", "-f", (kChart / "crds").string()});
    ASSERT_EQ(crds.exit_status, 0) << crds.err;
    const json ns = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNs}}}};
    const KubectlResult applied = admin_->run(
        {"apply", "-f", tandem::testing::writeObjects(dir_ / "namespace.json", {ns}).string()});
    ASSERT_EQ(applied.exit_status, 0) << applied.err;
    const KubectlResult release = admin_->run(
        {"apply", "-f", tandem::testing::writeObjects(dir_ / "release.json", objects_).string()});
    ASSERT_EQ(release.exit_status, 0) << release.err;
    for (const json& object : objects_) {
      if (object.value("kind", "") != "ServiceAccount") continue;
      const std::string component =
          object["metadata"]["labels"].value("app.kubernetes.io/component", "");
      (component == "operator" ? operator_account_ : router_account_) =
          object["metadata"]["name"].get<std::string>();
    }
    ASSERT_FALSE(operator_account_.empty());
    ASSERT_FALSE(router_account_.empty());
  }

  std::string token(const std::string& account) {
    std::string error;
    const std::string minted =
        tandem::testing::createServiceAccountToken(*admin_, kNs, account, error);
    EXPECT_FALSE(minted.empty()) << error;
    return minted;
  }

  std::unique_ptr<Kubectl> kubectlAs(const std::string& name, const std::string& bearer) {
    return std::make_unique<Kubectl>(
        server_->writeKubeconfig(dir_ / (name + ".kubeconfig"), bearer, kNs), dir_ / name);
  }

  // The rendered operator Deployment's container.
  json operatorContainer() const {
    for (const json& object : objects_) {
      if (object.value("kind", "") == "Deployment") {
        return object["spec"]["template"]["spec"]["containers"][0];
      }
    }
    return json::object();
  }

  // Starts the operator with the rendered container's args and the
  // ServiceAccount's token; false when it did not start.
  bool startOperator() {
    args_ = operatorContainer().value("args", std::vector<std::string>{});
    EXPECT_FALSE(args_.empty()) << "no operator Deployment rendered";
    if (args_.empty()) return false;
    operator_token_ = token(operator_account_);
    std::vector<std::string> argv = {kOperator.string()};
    argv.insert(argv.end(), args_.begin(), args_.end());
    argv.push_back("--kubeconfig");
    argv.push_back(
        server_->writeKubeconfig(dir_ / "operator.kubeconfig", operator_token_, kNs).string());
    metrics_port_ = std::stoi(flagValue(args_, "--metrics-port"));
    if (!portFree(metrics_port_)) {
      metrics_port_ = freeLoopbackPort();
      auto flag = std::find(argv.begin(), argv.end(), "--metrics-port");
      *(flag + 1) = std::to_string(metrics_port_);
    }
    operator_ = std::make_unique<Subprocess>(argv, dir_ / "operator.err");
    return !operator_->waitForLine("controller started", 60s).empty();
  }

  std::string metrics() const {
    httplib::Client client("127.0.0.1", metrics_port_);
    client.set_read_timeout(5, 0);
    auto response = client.Get("/metrics");
    return response && response->status == 200 ? response->body : "";
  }

  std::optional<json> get(const std::string& api_version, const std::string& kind,
                          const std::string& name) {
    return server_->get(api_version, kind, kNs, name);
  }

  bool poolReady(const std::string& kind, const std::string& name) {
    const auto pool = get("tandem.dev/v1alpha1", kind, name);
    return conditionTrue(pool, "Ready") &&
           pool->at("status").value("observedGeneration", int64_t{-1}) ==
               pool->at("metadata").value("generation", int64_t{0});
  }

  // Requests made with `bearer` that were answered 403.
  std::vector<std::string> forbiddenFor(const std::string& bearer) const {
    std::vector<std::string> forbidden;
    for (const RequestRecord& record : server_->answeredRequests()) {
      if (record.token == bearer && record.status == 403) {
        forbidden.push_back(record.method + " " + record.target);
      }
    }
    return forbidden;
  }

  std::string operatorUser() const {
    return "system:serviceaccount:" + std::string(kNs) + ":" + operator_account_;
  }

  // The whole install for one scope, and what the ServiceAccounts may not do.
  void installAndCheck(const std::string& scope) {
    ASSERT_NO_FATAL_FAILURE(install(scope));
    ASSERT_TRUE(startOperator()) << operator_->stderrText();
    const std::string agent_image = flagValue(args_, "--default-agent-image");
    const std::string operator_image = operatorContainer().value("image", "");
    ASSERT_FALSE(agent_image.empty());

    ASSERT_TRUE(eventually([&] { return poolReady("PrefillPool", "prefill"); }, 30s))
        << operator_->stderrText();
    ASSERT_TRUE(eventually([&] { return poolReady("DecodePool", "decode"); }, 30s))
        << operator_->stderrText();
    ASSERT_TRUE(eventually(
        [&] {
          return get("apps/v1", "Deployment", "router").has_value() &&
                 get("v1", "Service", "router").has_value();
        },
        30s))
        << operator_->stderrText();
    for (const auto& [name, image] :
         {std::pair{"prefill", agent_image}, std::pair{"decode", agent_image},
          std::pair{"router", operator_image}}) {
      SCOPED_TRACE(name);
      const auto deployment = get("apps/v1", "Deployment", name);
      ASSERT_TRUE(deployment.has_value());
      EXPECT_EQ((*deployment)["spec"]["template"]["spec"]["containers"][0]["image"], image);
      EXPECT_TRUE(get("v1", "Service", name).has_value());
    }
    // The router pods run as the chart's router ServiceAccount.
    EXPECT_EQ(get("apps/v1", "Deployment", "router")
                  ->at("spec")["template"]["spec"]
                  .value("serviceAccountName", ""),
              router_account_);
    EXPECT_EQ(forbiddenFor(operator_token_), std::vector<std::string>{});
    EXPECT_GT(server_->writesBy(operatorUser()), 0u);

    // What the operator's ServiceAccount may not do.
    auto as_operator = kubectlAs("operator-kubectl", token(operator_account_));
    const KubectlResult secrets = as_operator->run({"get", "secrets", "-n", kNs});
    EXPECT_NE(secrets.exit_status, 0);
    EXPECT_NE(secrets.err.find("Error from server (Forbidden): secrets is forbidden: User \"" +
                               operatorUser() +
                               "\" cannot list resource \"secrets\" in API group \"\" in the "
                               "namespace \"tandem\""),
              std::string::npos)
        << secrets.err;
    const KubectlResult deleted = as_operator->run({"delete", "deployment", "prefill", "-n", kNs});
    EXPECT_NE(deleted.exit_status, 0);
    EXPECT_NE(
        deleted.err.find("deployments.apps \"prefill\" is forbidden: User \"" + operatorUser() +
                         "\" cannot delete resource \"deployments\" in API group \"apps\" "
                         "in the namespace \"tandem\""),
        std::string::npos)
        << deleted.err;
    EXPECT_TRUE(get("apps/v1", "Deployment", "prefill").has_value());
    const KubectlResult elsewhere = as_operator->run({"get", "prefillpools", "-n", "other"});
    if (scope == "namespace") {
      EXPECT_NE(elsewhere.exit_status, 0);
      EXPECT_NE(
          elsewhere.err.find("prefillpools.tandem.dev is forbidden: User \"" + operatorUser() +
                             "\" cannot list resource \"prefillpools\" in API group "
                             "\"tandem.dev\" in the namespace \"other\""),
          std::string::npos)
          << elsewhere.err;
      const KubectlResult everywhere = as_operator->run({"get", "prefillpools", "-A"});
      EXPECT_NE(everywhere.err.find("cannot list resource \"prefillpools\" in API group "
                                    "\"tandem.dev\" at the cluster scope"),
                std::string::npos)
          << everywhere.err;
    } else {
      EXPECT_EQ(elsewhere.exit_status, 0) << elsewhere.err;
    }

    // The router's ServiceAccount reads EndpointSlices and nothing of the pools.
    auto as_router = kubectlAs("router-kubectl", token(router_account_));
    const KubectlResult slices = as_router->run({"get", "endpointslices", "-n", kNs});
    EXPECT_EQ(slices.exit_status, 0) << slices.err;
    const KubectlResult pools = as_router->run({"get", "prefillpools", "-n", kNs});
    EXPECT_NE(pools.exit_status, 0);
    EXPECT_NE(pools.err.find("prefillpools.tandem.dev is forbidden: User "
                             "\"system:serviceaccount:tandem:" +
                             router_account_ + "\" cannot list resource \"prefillpools\""),
              std::string::npos)
        << pools.err;
  }

  fs::path dir_;
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<Kubectl> admin_;
  std::vector<json> objects_;
  std::string operator_account_;
  std::string router_account_;
  std::vector<std::string> args_;
  std::string operator_token_;
  int metrics_port_ = 0;
  std::unique_ptr<Subprocess> operator_;
};

TEST_F(HelmInstallTest, NamespaceScopeInstallReconcilesTheExamplesWithinItsRole) {
  installAndCheck("namespace");
}

TEST_F(HelmInstallTest, ClusterScopeInstallReconcilesTheExamplesWithinItsClusterRole) {
  installAndCheck("cluster");
}

// The operator creates its children with server-side apply (the patch verb):
// a Role without patch on Deployments leaves the pools without Deployments,
// and the 403 shows in a Warning event and the reconcile error metric.
TEST_F(HelmInstallTest, RoleWithoutAVerbTheOperatorNeedsIsReportedAsForbidden) {
  ASSERT_NO_FATAL_FAILURE(install("namespace", [](std::vector<json>& objects) {
    for (json& object : objects) {
      if (object.value("kind", "") != "Role") continue;
      for (json& rule : object["rules"]) {
        if (rule["resources"] != json::array({"deployments"})) continue;
        json verbs = json::array();
        for (const json& verb : rule["verbs"]) {
          if (verb != "patch") verbs.push_back(verb);
        }
        rule["verbs"] = verbs;
      }
    }
  }));
  ASSERT_TRUE(startOperator()) << operator_->stderrText();
  const std::string denied = "deployments.apps \"prefill\" is forbidden: User \"" + operatorUser() +
                             "\" cannot patch resource \"deployments\" in API group \"apps\" in "
                             "the namespace \"tandem\"";
  auto warned = [&] {
    for (const json& event : server_->list("v1", "Event", kNs)) {
      if (event.value("type", "") == "Warning" &&
          event["involvedObject"].value("name", "") == "prefill" &&
          event.value("message", "").find(denied) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(eventually(warned, 30s)) << operator_->stderrText();
  ASSERT_TRUE(eventually(
      [&] {
        return tandem::prometheusSample(metrics(), "tandem_operator_reconciles_total",
                                        "kind=\"PrefillPool\",result=\"error\"")
                   .value_or(0) > 0;
      },
      30s))
      << metrics();
  EXPECT_FALSE(get("apps/v1", "Deployment", "prefill").has_value());
  EXPECT_FALSE(poolReady("PrefillPool", "prefill"));
  EXPECT_FALSE(forbiddenFor(operator_token_).empty());
}

}  // namespace
