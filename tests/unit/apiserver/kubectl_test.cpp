// The test API server driven by the real kubectl (the pinned one `make deps`
// fetches; tests/support/kubectl.h):
// discovery, CRDs, apply (client- and server-side), get as JSON and as a
// table, scale, patch, wait and delete, over HTTP and HTTPS.
#include "tests/support/kubectl.h"

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/subprocess.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/apiserver/yaml_json.h"
#include "tests/support/test_files.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

constexpr char kPool[] = R"(apiVersion: tandem.dev/v1alpha1
kind: PrefillPool
metadata:
  name: prefill
spec:
  model:
    path: /models/llama
)";

class KubectlTest : public ::testing::Test {
 protected:
  // kubectl sends credentials over HTTPS only: plain HTTP servers accept anyone.
  void start(ApiServerOptions options = {}) {
    if (options.tls) options.tokens = {"test-token"};
    server_ = std::make_unique<ApiServer>(options);
    kubeconfig_ = server_->writeKubeconfig(dir_.path() / "kubeconfig", "test-token", "default");
    kubectl_ = std::make_unique<Kubectl>(kubeconfig_, dir_.path());
  }

  KubectlResult kubectl(const std::vector<std::string>& args) { return kubectl_->run(args); }

  std::string crds() const { return std::string(TANDEM_SOURCE_DIR) + "/crds"; }

  TempDir dir_{"tandem-kubectl"};
  std::unique_ptr<ApiServer> server_;
  std::filesystem::path kubeconfig_;
  std::unique_ptr<Kubectl> kubectl_;
};

TEST_F(KubectlTest, Version) {
  start();
  KubectlResult run = kubectl({"version", "-o", "json"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  Json version = Json::parse(run.out);
  EXPECT_EQ(version["serverVersion"]["gitVersion"], "v1.32.0");
}

TEST_F(KubectlTest, ApplyGetScalePatchDeleteACustomResource) {
  start();
  KubectlResult applied_crds = kubectl({"apply", "-f", crds()});
  ASSERT_EQ(applied_crds.exit_status, 0) << applied_crds.err;
  EXPECT_NE(applied_crds.out.find("customresourcedefinition.apiextensions.k8s.io/"
                                  "prefillpools.tandem.dev created"),
            std::string::npos)
      << applied_crds.out;
  KubectlResult established = kubectl(
      {"wait", "--for", "condition=established", "--timeout=30s", "crd/prefillpools.tandem.dev"});
  ASSERT_EQ(established.exit_status, 0) << established.err;

  std::filesystem::path pool = dir_.write("pool.yaml", kPool);
  KubectlResult applied = kubectl({"apply", "-f", pool.string()});
  ASSERT_EQ(applied.exit_status, 0) << applied.err;
  EXPECT_NE(applied.out.find("prefillpool.tandem.dev/prefill created"), std::string::npos)
      << applied.out;

  KubectlResult listed = kubectl({"get", "prefillpools", "-o", "json"});
  ASSERT_EQ(listed.exit_status, 0) << listed.err;
  Json list = Json::parse(listed.out);
  ASSERT_EQ(list["items"].size(), 1u);
  EXPECT_EQ(list["items"][0]["spec"]["replicas"], 1);

  KubectlResult scaled = kubectl({"scale", "prefillpool/prefill", "--replicas=3"});
  ASSERT_EQ(scaled.exit_status, 0) << scaled.err;
  EXPECT_EQ(server_->get("tandem.dev/v1alpha1", "PrefillPool", "default", "prefill")
                .value()["spec"]["replicas"],
            3);

  KubectlResult table = kubectl({"get", "prefillpools"});
  ASSERT_EQ(table.exit_status, 0) << table.err;
  // The header is NAME and the CRD's printer columns, upper-cased; -o wide
  // adds those of priority 1.
  Json crd = yamlDocumentsToJson(readFile(crds() + "/prefillpools.tandem.dev.yaml")).at(0);
  auto headerOf = [&](bool wide) {
    std::string header = "NAME";
    for (const Json& column : crd["spec"]["versions"][0]["additionalPrinterColumns"]) {
      if (!wide && column.value("priority", 0) > 0) continue;
      std::string name = column["name"];
      for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      header += " " + name;
    }
    return header;
  };
  auto firstLine = [](const std::string& out) {
    std::string squeezed;
    for (char c : out.substr(0, out.find('\n'))) {
      if (c != ' ' || (!squeezed.empty() && squeezed.back() != ' ')) squeezed.push_back(c);
    }
    return squeezed;
  };
  EXPECT_EQ(firstLine(table.out), headerOf(false)) << table.out;
  EXPECT_NE(table.out.find("prefill"), std::string::npos);
  KubectlResult wide = kubectl({"get", "prefillpools", "-o", "wide"});
  ASSERT_EQ(wide.exit_status, 0) << wide.err;
  EXPECT_EQ(firstLine(wide.out), headerOf(true)) << wide.out;
  EXPECT_NE(headerOf(true).find("SOURCE"), std::string::npos);

  KubectlResult patched = kubectl({"patch", "prefillpool", "prefill", "--type=merge", "-p",
                                   R"({"metadata":{"labels":{"stage":"test"}}})"});
  ASSERT_EQ(patched.exit_status, 0) << patched.err;
  Json stored = server_->get("tandem.dev/v1alpha1", "PrefillPool", "default", "prefill").value();
  EXPECT_EQ(stored["metadata"]["labels"]["stage"], "test");

  // Applying the file again leaves kubectl's changes to other fields alone.
  KubectlResult reapplied = kubectl({"apply", "-f", pool.string()});
  ASSERT_EQ(reapplied.exit_status, 0) << reapplied.err;

  KubectlResult deleted = kubectl({"delete", "prefillpool", "prefill"});
  ASSERT_EQ(deleted.exit_status, 0) << deleted.err;
  EXPECT_NE(deleted.out.find("prefillpool.tandem.dev \"prefill\" deleted"), std::string::npos)
      << deleted.out;
  EXPECT_FALSE(server_->get("tandem.dev/v1alpha1", "PrefillPool", "default", "prefill"));
  EXPECT_GE(server_->writesBy("anonymous"), 5u);
}

TEST_F(KubectlTest, ServerSideApply) {
  start();
  server_->registerCrds(crds());
  std::filesystem::path pool = dir_.write("pool.yaml", kPool);
  KubectlResult first = kubectl({"apply", "--server-side", "-f", pool.string()});
  ASSERT_EQ(first.exit_status, 0) << first.err;
  EXPECT_NE(first.out.find("serverside-applied"), std::string::npos) << first.out;
  std::string changed = std::string(kPool) + "  replicas: 2\n";
  dir_.write("pool.yaml", changed);
  KubectlResult second = kubectl({"apply", "--server-side", "-f", pool.string()});
  ASSERT_EQ(second.exit_status, 0) << second.err;
  Json stored = server_->get("tandem.dev/v1alpha1", "PrefillPool", "default", "prefill").value();
  EXPECT_EQ(stored["spec"]["replicas"], 2);
  EXPECT_EQ(stored["metadata"]["generation"], 2);
}

TEST_F(KubectlTest, GetWatchPrintsRowsForLaterChanges) {
  start();
  server_->registerCrds(crds());
  Subprocess watch({kubectlPath(), "--kubeconfig", kubeconfig_.string(), "--cache-dir",
                    (dir_.path() / "cache").string(), "get", "prefillpools", "--watch"},
                   dir_.path() / "watch-stderr.txt", {{"HOME", dir_.path().string()}});
  // kubectl prints the (empty) list first: wait for the server to see the watch.
  auto watching = [&] {
    for (const std::string& line : server_->requestLog()) {
      if (line.find("prefillpools?") != std::string::npos &&
          line.find("watch=true") != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!watching() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the log
  }
  ASSERT_TRUE(watching()) << watch.stderrText();
  Json pool = yamlToJson(kPool);
  pool["status"] = {{"servedModel", "llama-3"},
                    {"conditions", Json::array({{{"type", "ModelReady"}, {"status", "True"}}})}};
  server_->put(pool);
  std::string row = watch.waitForLine("prefill ", std::chrono::seconds(30));
  EXPECT_NE(row.find("llama-3"), std::string::npos) << row << watch.stderrText();
  EXPECT_NE(row.find("True"), std::string::npos) << row << watch.stderrText();
}

TEST_F(KubectlTest, StrictValidationNamesTheUnknownField) {
  start();
  server_->registerCrds(crds());
  std::filesystem::path pool = dir_.write("pool.yaml", std::string(kPool) + "  unknownField: 1\n");
  KubectlResult run = kubectl({"apply", "-f", pool.string()});
  EXPECT_NE(run.exit_status, 0);
  EXPECT_NE(run.err.find("unknownField"), std::string::npos) << run.err;
}

TEST_F(KubectlTest, BuiltInKindsOverTls) {
  ApiServerOptions options;
  options.tls = true;
  start(options);
  // `kubectl create configmap` would send protobuf; a manifest goes as JSON.
  std::filesystem::path manifest = dir_.write(
      "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n");
  KubectlResult created = kubectl({"create", "-f", manifest.string()});
  ASSERT_EQ(created.exit_status, 0) << created.err;
  EXPECT_EQ(server_->writesBy("test-token"), 1u);
  KubectlResult got = kubectl({"get", "configmap", "settings", "-o", "jsonpath={.data.a}"});
  ASSERT_EQ(got.exit_status, 0) << got.err;
  EXPECT_EQ(got.out, "b");
  KubectlResult labelled = kubectl({"label", "configmap", "settings", "tier=web"});
  ASSERT_EQ(labelled.exit_status, 0) << labelled.err;
  KubectlResult selected = kubectl({"get", "configmaps", "-l", "tier=web", "-o", "name"});
  ASSERT_EQ(selected.exit_status, 0) << selected.err;
  EXPECT_EQ(selected.out, "configmap/settings\n");
  KubectlResult table = kubectl({"get", "namespaces"});
  ASSERT_EQ(table.exit_status, 0) << table.err;
  EXPECT_NE(table.out.find("default"), std::string::npos);
}

}  // namespace
}  // namespace tandem::testing
