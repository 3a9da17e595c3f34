#include "operator/k8s/kube_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace tandem::k8s {
namespace {

namespace fs = std::filesystem;

// Base64 of "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".
constexpr char kCaPem[] = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
constexpr char kCaBase64[] =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K";

class KubeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "kubeconfig-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    for (const char* name : {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}) {
      const char* value = std::getenv(name);
      saved_env_[name] = value ? std::optional<std::string>(value) : std::nullopt;
      unsetenv(name);
    }
  }

  void TearDown() override {
    for (const auto& [name, value] : saved_env_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  fs::path write(const fs::path& relative, const std::string& text) {
    const fs::path path = dir_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // The message of the tandem::Error that `load` throws; fails the test when none.
  template <typename F>
  std::string errorOf(F&& load) {
    try {
      load();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no tandem::Error thrown";
    return "";
  }

  fs::path dir_;
  std::map<std::string, std::optional<std::string>> saved_env_;
};

constexpr char kTwoContexts[] = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K
    tls-server-name: api.dev.example
- name: prod-cluster
  cluster:
    server: https://[fd00::1]:443
    insecure-skip-tls-verify: true
users:
- name: alice
  user:
    token: alice-token
- name: bob
  user:
    token: bob-token
contexts:
- name: dev
  context:
    cluster: dev-cluster
    user: alice
    namespace: inference
- name: prod
  context:
    cluster: prod-cluster
    user: bob
)";

TEST_F(KubeConfigTest, TokenCaDataAndNamespaceOfTheCurrentContext) {
  const fs::path path = write("config", kTwoContexts);
  const ClusterConfig config = loadKubeconfig(path);
  EXPECT_EQ(config.server, "https://10.0.0.1:6443");
  EXPECT_EQ(config.certificate_authority_pem, kCaPem);
  EXPECT_EQ(config.tls_server_name, "api.dev.example");
  EXPECT_FALSE(config.insecure_skip_tls_verify);
  EXPECT_EQ(config.token, "alice-token");
  EXPECT_TRUE(config.token_file.empty());
  EXPECT_EQ(config.default_namespace, "inference");
  EXPECT_NE(config.source.find(path.string()), std::string::npos) << config.source;
  EXPECT_NE(config.source.find("dev"), std::string::npos) << config.source;
}

TEST_F(KubeConfigTest, ContextOverridesCurrentContext) {
  const ClusterConfig config = loadKubeconfig(write("config", kTwoContexts), "prod");
  EXPECT_EQ(config.server, "https://[fd00::1]:443");
  EXPECT_TRUE(config.insecure_skip_tls_verify);
  EXPECT_EQ(config.token, "bob-token");
  EXPECT_EQ(config.default_namespace, "default");
  EXPECT_TRUE(config.certificate_authority_pem.empty());
}

TEST_F(KubeConfigTest, FilesAreTakenRelativeToTheKubeconfigsDirectory) {
  write("kube/pki/ca.pem", "CA PEM");
  write("kube/pki/client.pem", "CLIENT CERT");
  write("kube/pki/client.key", "CLIENT KEY");
  write("kube/token", "file-token\n");
  const fs::path path = write("kube/config", R"(
current-context: c
clusters:
- name: k
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: pki/ca.pem
users:
- name: u
  user:
    client-certificate: pki/client.pem
    client-key: pki/client.key
    tokenFile: token
contexts:
- name: c
  context: {cluster: k, user: u}
)");
  const ClusterConfig config = loadKubeconfig(path);
  EXPECT_EQ(config.certificate_authority_pem, "CA PEM");
  EXPECT_EQ(config.client_certificate_pem, "CLIENT CERT");
  EXPECT_EQ(config.client_key_pem, "CLIENT KEY");
  EXPECT_EQ(config.token_file, dir_ / "kube" / "token");
  EXPECT_TRUE(config.token.empty());
}

TEST_F(KubeConfigTest, ClientCertificateAndKeyData) {
  const ClusterConfig config = loadKubeconfig(write("config", std::string(R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1"}}
users:
- name: u
  user:
    client-certificate-data: )") + kCaBase64 + R"(
    client-key-data: S0VZ
contexts:
- {name: c, context: {cluster: k, user: u}}
)"));
  EXPECT_EQ(config.client_certificate_pem, kCaPem);
  EXPECT_EQ(config.client_key_pem, "KEY");
}

TEST_F(KubeConfigTest, MissingContextIsNamedWithTheFile) {
  const fs::path path = write("config", kTwoContexts);
  const std::string message = errorOf([&] { loadKubeconfig(path, "staging"); });
  EXPECT_NE(message.find("\"staging\""), std::string::npos) << message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("dev, prod"), std::string::npos) << message;
}

TEST_F(KubeConfigTest, MissingUserIsNamed) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1"}}
contexts:
- {name: c, context: {cluster: k, user: alice}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("user \"alice\""), std::string::npos) << message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, MissingClusterIsNamed) {
  const fs::path path = write("config", R"(
current-context: c
users:
- {name: u, user: {token: t}}
contexts:
- {name: c, context: {cluster: nowhere, user: u}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("cluster \"nowhere\""), std::string::npos) << message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, ClusterWithoutServerIsRefused) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {insecure-skip-tls-verify: true}}
contexts:
- {name: c, context: {cluster: k}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("cluster \"k\" has no server"), std::string::npos) << message;
}

TEST_F(KubeConfigTest, MissingCertificateFileIsNamed) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1", certificate-authority: missing-ca.pem}}
contexts:
- {name: c, context: {cluster: k}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find((dir_ / "missing-ca.pem").string()), std::string::npos) << message;
  EXPECT_NE(message.find("certificate-authority"), std::string::npos) << message;
}

TEST_F(KubeConfigTest, InvalidBase64IsNamed) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1", certificate-authority-data: "not*base64"}}
contexts:
- {name: c, context: {cluster: k}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("certificate-authority-data is not valid base64"), std::string::npos)
      << message;
}

TEST_F(KubeConfigTest, NonBooleanInsecureSkipTlsVerifyIsNamed) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: maybe}}
contexts:
- {name: c, context: {cluster: k}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("insecure-skip-tls-verify must be true or false"), std::string::npos)
      << message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, ExecPluginIsRefusedNamingTheUser) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1"}}
users:
- name: eks-admin
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
contexts:
- {name: c, context: {cluster: k, user: eks-admin}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("user \"eks-admin\""), std::string::npos) << message;
  EXPECT_NE(message.find("exec plugin"), std::string::npos) << message;
}

TEST_F(KubeConfigTest, AuthProviderIsRefused) {
  const fs::path path = write("config", R"(
current-context: c
clusters:
- {name: k, cluster: {server: "https://127.0.0.1:1"}}
users:
- {name: gke, user: {auth-provider: {name: gcp}}}
contexts:
- {name: c, context: {cluster: k, user: gke}}
)");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find("user \"gke\""), std::string::npos) << message;
  EXPECT_NE(message.find("auth-provider"), std::string::npos) << message;
}

TEST_F(KubeConfigTest, BadYamlNamesTheFile) {
  const fs::path path = write("config", "clusters: [unclosed\n  - {name: :\n");
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, UnreadableKubeconfigNamesTheFile) {
  const fs::path path = dir_ / "does-not-exist";
  const std::string message = errorOf([&] { loadKubeconfig(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, InClusterConfigFromServiceAccountDirectory) {
  write("sa/token", "sa-token\n");
  write("sa/ca.crt", "SA CA");
  write("sa/namespace", "tandem-system\n");
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  const ClusterConfig config = inClusterConfig(dir_ / "sa");
  EXPECT_EQ(config.server, "https://10.96.0.1:443");
  EXPECT_EQ(config.token_file, dir_ / "sa" / "token");
  EXPECT_EQ(config.certificate_authority_pem, "SA CA");
  EXPECT_EQ(config.default_namespace, "tandem-system");
  EXPECT_EQ(config.source, "in-cluster");
}

TEST_F(KubeConfigTest, InClusterIpv6HostIsBracketed) {
  write("sa/token", "t");
  write("sa/ca.crt", "SA CA");
  setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
  const ClusterConfig config = inClusterConfig(dir_ / "sa");
  EXPECT_EQ(config.server, "https://[fd00:10:96::1]:6443");
  EXPECT_EQ(config.default_namespace, "default");
}

TEST_F(KubeConfigTest, InClusterWithoutEnvironmentOrTokenIsAnError) {
  write("sa/ca.crt", "SA CA");
  std::string message = errorOf([&] { inClusterConfig(dir_ / "sa"); });
  EXPECT_NE(message.find("KUBERNETES_SERVICE_HOST"), std::string::npos) << message;
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  message = errorOf([&] { inClusterConfig(dir_ / "sa"); });
  EXPECT_NE(message.find((dir_ / "sa" / "token").string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, KubeconfigEnvironmentUsesTheFirstFileThatExists) {
  const fs::path path = write("second", kTwoContexts);
  setenv("KUBECONFIG", ((dir_ / "first-missing").string() + ":" + path.string()).c_str(), 1);
  const ClusterConfig config = resolveClusterConfig(std::nullopt);
  EXPECT_EQ(config.server, "https://10.0.0.1:6443");
  EXPECT_NE(config.source.find(path.string()), std::string::npos) << config.source;
  EXPECT_EQ(resolveClusterConfig(std::nullopt, "prod").token, "bob-token");
}

TEST_F(KubeConfigTest, KubeconfigFlagWinsOverEnvironment) {
  const fs::path flag = write("flag", kTwoContexts);
  setenv("KUBECONFIG", (dir_ / "missing").c_str(), 1);
  EXPECT_EQ(resolveClusterConfig(flag, "prod").server, "https://[fd00::1]:443");
}

TEST_F(KubeConfigTest, KubeconfigEnvironmentWithNoExistingFileIsAnError) {
  setenv("KUBECONFIG", ((dir_ / "a").string() + ":" + (dir_ / "b").string()).c_str(), 1);
  const std::string message = errorOf([&] { resolveClusterConfig(std::nullopt); });
  EXPECT_NE(message.find((dir_ / "a").string()), std::string::npos) << message;
}

TEST_F(KubeConfigTest, InClusterWhenNoKubeconfigIsNamed) {
  // Without a flag or KUBECONFIG, KUBERNETES_SERVICE_HOST selects the in-cluster
  // configuration, whose default directory does not exist here: the error says so.
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  if (fs::exists("/var/run/secrets/kubernetes.io/serviceaccount/token")) {
    GTEST_SKIP() << "running inside a pod";
  }
  const std::string message = errorOf([&] { resolveClusterConfig(std::nullopt); });
  EXPECT_NE(message.find("in-cluster"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::k8s
