// The real `helm install`, `status`, `list`, `upgrade` and `uninstall` of
// charts/tandem against the test API server over HTTPS. helm keeps each
// release revision in a Secret (sh.helm.release.v1.<release>.v<N>, type
// helm.sh/release.v1) written through client-go's typed clientset, which
// sends protobuf bodies (Secrets, DeleteOptions), as does `kubectl create
// namespace`; the stand-in decodes them (tests/support/apiserver/protobuf_body.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/api_server.h"
#include "tests/support/command.h"
#include "tests/support/helm.h"
#include "tests/support/kubectl.h"
#include "tests/support/test_files.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tandem::testing::ApiServer;
using tandem::testing::ApiServerOptions;
using tandem::testing::CommandResult;
using tandem::testing::Kubectl;
using tandem::testing::KubectlResult;
using namespace std::chrono_literals;

const fs::path kChart = fs::path(TANDEM_SOURCE_DIR) / "charts/tandem";
constexpr const char* kNs = "tandem";
constexpr const char* kRelease = "tandem";
constexpr const char* kReleaseType = "helm.sh/release.v1";

// The chart's objects (examples on) that the release must create and remove.
struct ChartObject {
  const char* api_version;
  const char* kind;
  const char* name;
};
const ChartObject kChartObjects[] = {
    {"apps/v1", "Deployment", "tandem-operator"},
    {"v1", "ServiceAccount", "tandem-operator"},
    {"v1", "ServiceAccount", "tandem-router"},
    {"rbac.authorization.k8s.io/v1", "Role", "tandem-operator"},
    {"v1", "Service", "tandem-operator-metrics"},
    {"v1", "ConfigMap", "tandem-dashboard"},
    {"tandem.dev/v1alpha1", "PrefillPool", "prefill"},
    {"tandem.dev/v1alpha1", "DecodePool", "decode"},
    {"tandem.dev/v1alpha1", "Router", "router"},
};

std::string label(const json& object, const std::string& key) {
  return object["metadata"].value("labels", json::object()).value(key, "");
}

class HelmReleaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem-helm-release-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "helm");
    // kubectl and helm send bearer tokens over TLS only.
    ApiServerOptions options;
    options.tls = true;
    server_ = std::make_unique<ApiServer>(options);
    kubeconfig_ = server_->writeKubeconfig(dir_ / "admin.kubeconfig", "admin");
    kubectl_ = std::make_unique<Kubectl>(kubeconfig_, dir_ / "kubectl");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // helm ARGS... with its home, cache, config and data under the test's directory.
  CommandResult helm(const std::vector<std::string>& args) {
    return tandem::testing::runHelm(args, dir_ / "helm",
                                    dir_ / ("helm-" + std::to_string(++helm_calls_) + ".err"), 120s,
                                    kubeconfig_);
  }

  // helm's release Secrets in the namespace, by name.
  std::vector<json> releaseSecrets() const {
    std::vector<json> found;
    for (const json& secret : server_->list("v1", "Secret", kNs)) {
      if (secret.value("type", "") == kReleaseType) found.push_back(secret);
    }
    return found;
  }

  std::optional<json> releaseSecret(int revision) const {
    return server_->get(
        "v1", "Secret", kNs,
        "sh.helm.release.v1." + std::string(kRelease) + ".v" + std::to_string(revision));
  }

  // `helm list -n tandem -o json`: the releases helm reads back from its Secrets.
  json helmList() {
    const CommandResult listed = helm({"list", "-n", kNs, "-o", "json"});
    EXPECT_EQ(listed.exit_status, 0) << listed.err;
    return json::parse(listed.out, nullptr, false);
  }

  fs::path dir_;
  std::unique_ptr<ApiServer> server_;
  fs::path kubeconfig_;
  std::unique_ptr<Kubectl> kubectl_;
  int helm_calls_ = 0;
};

TEST_F(HelmReleaseTest, InstallStatusListUpgradeUninstall) {
  // A typed create: a protobuf Namespace body.
  const KubectlResult created = kubectl_->run({"create", "namespace", kNs});
  ASSERT_EQ(created.exit_status, 0) << created.err;
  EXPECT_EQ(created.out, "namespace/tandem created\n");

  const CommandResult installed =
      helm({"install", kRelease, kChart.string(), "-n", kNs, "--set", "examples.enabled=true"});
  ASSERT_EQ(installed.exit_status, 0) << installed.err << installed.out;
  EXPECT_NE(installed.out.find("STATUS: deployed"), std::string::npos) << installed.out;

  // The release Secret as helm writes it.
  std::optional<json> first = releaseSecret(1);
  ASSERT_TRUE(first.has_value()) << "no release Secret after helm install";
  EXPECT_EQ(first->value("type", ""), kReleaseType);
  EXPECT_EQ(label(*first, "owner"), "helm");
  EXPECT_EQ(label(*first, "name"), kRelease);
  EXPECT_EQ(label(*first, "status"), "deployed");
  EXPECT_EQ(label(*first, "version"), "1");
  EXPECT_FALSE((*first)["data"].value("release", "").empty()) << first->dump();

  // The chart's objects, marked as the release's.
  for (const ChartObject& object : kChartObjects) {
    std::optional<json> stored = server_->get(object.api_version, object.kind, kNs, object.name);
    ASSERT_TRUE(stored.has_value()) << object.kind << " " << object.name << " not installed";
    EXPECT_EQ(label(*stored, "app.kubernetes.io/managed-by"), "Helm") << object.name;
    EXPECT_EQ((*stored)["metadata"]
                  .value("annotations", json::object())
                  .value("meta.helm.sh/release-name", ""),
              kRelease)
        << object.kind << " " << object.name;
  }
  EXPECT_EQ(server_->get("apps/v1", "Deployment", kNs, "tandem-operator")
                ->at("spec")
                .value("replicas", int64_t{0}),
            2);

  const CommandResult status = helm({"status", kRelease, "-n", kNs, "-o", "json"});
  ASSERT_EQ(status.exit_status, 0) << status.err;
  const json status_json = json::parse(status.out, nullptr, false);
  EXPECT_EQ(status_json["info"].value("status", ""), "deployed") << status.out;
  EXPECT_EQ(status_json.value("version", 0), 1);

  json listed = helmList();
  ASSERT_TRUE(listed.is_array() && listed.size() == 1) << listed.dump();
  EXPECT_EQ(listed[0].value("name", ""), kRelease);
  EXPECT_EQ(listed[0].value("status", ""), "deployed");
  EXPECT_EQ(listed[0].value("revision", ""), "1");

  // An upgrade that changes the operator's replicas: revision 2 deployed,
  // revision 1 superseded (a protobuf update of its Secret).
  const CommandResult upgraded = helm({"upgrade", kRelease, kChart.string(), "-n", kNs, "--set",
                                       "examples.enabled=true", "--set", "operator.replicas=1"});
  ASSERT_EQ(upgraded.exit_status, 0) << upgraded.err << upgraded.out;
  EXPECT_NE(upgraded.out.find("REVISION: 2"), std::string::npos) << upgraded.out;
  std::optional<json> second = releaseSecret(2);
  ASSERT_TRUE(second.has_value()) << "no revision 2 Secret after helm upgrade";
  EXPECT_EQ(label(*second, "status"), "deployed");
  EXPECT_EQ(label(*second, "version"), "2");
  EXPECT_EQ(label(*releaseSecret(1), "status"), "superseded");
  EXPECT_EQ(server_->get("apps/v1", "Deployment", kNs, "tandem-operator")
                ->at("spec")
                .value("replicas", int64_t{0}),
            1);
  listed = helmList();
  ASSERT_TRUE(listed.is_array() && listed.size() == 1) << listed.dump();
  EXPECT_EQ(listed[0].value("revision", ""), "2");
  EXPECT_EQ(listed[0].value("status", ""), "deployed");

  // Uninstall deletes the chart's objects and every revision's Secret
  // (typed deletes with protobuf DeleteOptions).
  const CommandResult uninstalled = helm({"uninstall", kRelease, "-n", kNs});
  ASSERT_EQ(uninstalled.exit_status, 0) << uninstalled.err << uninstalled.out;
  for (const ChartObject& object : kChartObjects) {
    EXPECT_FALSE(server_->get(object.api_version, object.kind, kNs, object.name).has_value())
        << object.kind << " " << object.name << " left after helm uninstall";
  }
  EXPECT_TRUE(releaseSecrets().empty()) << releaseSecrets().size() << " release Secrets left";
  listed = helmList();
  EXPECT_TRUE(listed.is_array() && listed.empty()) << listed.dump();
  // helm never deletes the CRDs it installed from crds/.
  EXPECT_TRUE(server_
                  ->get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "",
                        "prefillpools.tandem.dev")
                  .has_value());
}

// The other typed create commands kubectl sends as protobuf.
TEST_F(HelmReleaseTest, KubectlTypedCreateCommands) {
  ASSERT_EQ(kubectl_->run({"create", "namespace", kNs}).exit_status, 0);
  const KubectlResult secret = kubectl_->run(
      {"create", "secret", "generic", "credentials", "-n", kNs, "--from-literal=user=admin"});
  ASSERT_EQ(secret.exit_status, 0) << secret.err;
  const KubectlResult config_map =
      kubectl_->run({"create", "configmap", "settings", "-n", kNs, "--from-literal=mode=fast"});
  ASSERT_EQ(config_map.exit_status, 0) << config_map.err;
  const KubectlResult account = kubectl_->run({"create", "serviceaccount", "worker", "-n", kNs});
  ASSERT_EQ(account.exit_status, 0) << account.err;

  EXPECT_EQ(server_->get("v1", "Secret", kNs, "credentials")->at("data"),
            json({{"user", "YWRtaW4="}}));
  EXPECT_EQ(server_->get("v1", "ConfigMap", kNs, "settings")->at("data"), json({{"mode", "fast"}}));
  EXPECT_TRUE(server_->get("v1", "ServiceAccount", kNs, "worker").has_value());

  // Kinds not decoded from protobuf are still refused, naming the kind.
  const KubectlResult deployment =
      kubectl_->run({"create", "deployment", "web", "--image=web:1", "-n", kNs});
  EXPECT_NE(deployment.exit_status, 0);
  EXPECT_NE(deployment.err.find("not apps/v1 Deployment"), std::string::npos) << deployment.err;
}

// The previous release of charts/tandem-crds: the same chart, version
// 0.0.9, without spec.disruptionBudget (the field this release adds).
fs::path previousCrdChart(const fs::path& dir) {
  const fs::path chart = dir / "tandem-crds-0.0.9";
  fs::create_directories(chart);
  fs::copy(fs::path(TANDEM_SOURCE_DIR) / "charts/tandem-crds", chart,
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  std::string meta = tandem::testing::readFile(chart / "Chart.yaml");
  meta.replace(meta.find("version: 0.1.0"), 14, "version: 0.0.9");
  std::ofstream(chart / "Chart.yaml") << meta;
  for (const char* file : {"prefillpools.tandem.dev.yaml", "decodepools.tandem.dev.yaml"}) {
    std::string crd = tandem::testing::readFile(chart / "templates" / file);
    const size_t start = crd.find("                disruptionBudget:\n");
    const size_t end = crd.find("                autoscaling:\n");
    if (start != std::string::npos && end != std::string::npos && start < end) {
      crd.erase(start, end - start);
    }
    std::ofstream(chart / "templates" / file) << crd;
  }
  return chart;
}

// CRDs that the tandem chart's crds/ installed carry no Helm ownership:
// tandem-crds refuses them as docs/helm.md says, and adopts them once they
// are labelled and annotated as that page shows.
TEST_F(HelmReleaseTest, CrdsOfTheTandemChartAreAdoptedByTandemCrdsOnceLabelled) {
  ASSERT_EQ(kubectl_->run({"create", "namespace", kNs}).exit_status, 0);
  ASSERT_EQ(helm({"install", kRelease, kChart.string(), "-n", kNs}).exit_status, 0);
  const std::string crd_chart = (fs::path(TANDEM_SOURCE_DIR) / "charts/tandem-crds").string();
  const CommandResult refused = helm({"install", "tandem-crds", crd_chart, "-n", kNs});
  EXPECT_NE(refused.exit_status, 0);
  EXPECT_NE(refused.err.find("invalid ownership metadata"), std::string::npos) << refused.err;
  for (const char* crd : {"prefillpools", "decodepools", "routers"}) {
    const std::string name = std::string(crd) + ".tandem.dev";
    ASSERT_EQ(
        kubectl_->run({"label", "crd", name, "app.kubernetes.io/managed-by=Helm"}).exit_status, 0);
    ASSERT_EQ(kubectl_
                  ->run({"annotate", "crd", name, "meta.helm.sh/release-name=tandem-crds",
                         std::string("meta.helm.sh/release-namespace=") + kNs})
                  .exit_status,
              0);
  }
  const CommandResult adopted = helm({"install", "tandem-crds", crd_chart, "-n", kNs});
  EXPECT_EQ(adopted.exit_status, 0) << adopted.err;
}

// charts/tandem-crds upgrades the CRDs in place (Helm's crds/ folder is
// installed once and never upgraded): from the previous release, with a
// pool in the cluster, `helm upgrade` keeps the pool (same uid) and the new
// field is accepted after it, refused before; `helm uninstall` keeps the
// CRDs and the pool (helm.sh/resource-policy: keep).
TEST_F(HelmReleaseTest, CrdChartUpgradeKeepsPoolsAndAcceptsTheNewField) {
  ASSERT_EQ(kubectl_->run({"create", "namespace", kNs}).exit_status, 0);
  const fs::path previous = previousCrdChart(dir_);
  const CommandResult installed = helm({"install", "tandem-crds", previous.string(), "-n", kNs});
  ASSERT_EQ(installed.exit_status, 0) << installed.err;

  const std::string pool = R"({"apiVersion": "tandem.dev/v1alpha1", "kind": "DecodePool",
    "metadata": {"name": "decode", "namespace": "tandem"},
    "spec": {"model": {"path": "/models/m"}SPEC}})";
  auto applyPool = [&](const std::string& extra) {
    std::string text = pool;
    text.replace(text.find("SPEC"), 4, extra);
    std::ofstream(dir_ / "pool.json") << text;
    return kubectl_->run({"apply", "-f", (dir_ / "pool.json").string()});
  };
  const std::string budget = R"(, "disruptionBudget": {"maxUnavailable": 2})";
  ASSERT_EQ(applyPool("").exit_status, 0);
  const std::string uid =
      server_->get("tandem.dev/v1alpha1", "DecodePool", kNs, "decode")->at("metadata")["uid"];
  const KubectlResult refused = applyPool(budget);
  EXPECT_NE(refused.exit_status, 0) << "the previous CRDs have no spec.disruptionBudget";
  EXPECT_NE(refused.err.find("disruptionBudget"), std::string::npos) << refused.err;

  const CommandResult upgraded =
      helm({"upgrade", "tandem-crds", (fs::path(TANDEM_SOURCE_DIR) / "charts/tandem-crds").string(),
            "-n", kNs});
  ASSERT_EQ(upgraded.exit_status, 0) << upgraded.err;
  const std::optional<json> kept = server_->get("tandem.dev/v1alpha1", "DecodePool", kNs, "decode");
  ASSERT_TRUE(kept.has_value()) << "the upgrade deleted the pool";
  EXPECT_EQ(kept->at("metadata")["uid"], uid);
  const KubectlResult accepted = applyPool(budget);
  ASSERT_EQ(accepted.exit_status, 0) << accepted.err;
  EXPECT_EQ(server_->get("tandem.dev/v1alpha1", "DecodePool", kNs, "decode")
                ->at("spec")["disruptionBudget"]["maxUnavailable"],
            2);

  ASSERT_EQ(helm({"uninstall", "tandem-crds", "-n", kNs}).exit_status, 0);
  EXPECT_TRUE(
      server_
          ->get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "decodepools.tandem.dev")
          .has_value())
      << "helm uninstall deleted a kept CRD";
  EXPECT_TRUE(server_->get("tandem.dev/v1alpha1", "DecodePool", kNs, "decode").has_value());
}

}  // namespace
