// Where the API server is and how to authenticate to it: from a kubeconfig
// file (as kubectl reads it) or from inside a pod (the service account).
//
// Loading throws tandem::Error naming the file and what is wrong ("kubeconfig
// /x: context \"dev\" names user \"alice\", which the file does not define").
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace tandem::k8s {

struct ClusterConfig {
  std::string server;  // "https://10.0.0.1:443" or "http://127.0.0.1:8080"
  // TLS: the CA bundle (PEM text); empty trusts the system store.
  std::string certificate_authority_pem;
  bool insecure_skip_tls_verify = false;
  std::string tls_server_name;  // SNI / name checked against the certificate; default the host
  // Authentication, any of: a bearer token, a token file (re-read when it
  // changes, as projected service-account tokens rotate), a client certificate.
  std::string token;
  std::filesystem::path token_file;
  std::string client_certificate_pem;
  std::string client_key_pem;
  // The namespace of the current context, or the pod's; "default" if neither says.
  std::string default_namespace = "default";
  // Where it came from, for messages: "kubeconfig /path (context dev)" or "in-cluster".
  std::string source;
  // Per-call deadlines.
  double connect_timeout_s = 10;
  double request_timeout_s = 30;
};

// A kubeconfig file: clusters, users and contexts; `context` overrides
// current-context. certificate-authority / client-certificate / client-key /
// tokenFile may be files (relative paths are taken from the kubeconfig's
// directory) or *-data (base64). insecure-skip-tls-verify and namespace are
// honoured. exec and auth-provider plugins are refused with a clear error.
ClusterConfig loadKubeconfig(const std::filesystem::path& path,
                             const std::optional<std::string>& context = std::nullopt);

// Inside a pod: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT, and
// token, ca.crt and namespace under `service_account_dir`.
ClusterConfig inClusterConfig(const std::filesystem::path& service_account_dir =
                                  "/var/run/secrets/kubernetes.io/serviceaccount");

// The configuration a command uses: --kubeconfig when given, else $KUBECONFIG
// (its first entry), else in-cluster when KUBERNETES_SERVICE_HOST is set,
// else ~/.kube/config.
ClusterConfig resolveClusterConfig(const std::optional<std::filesystem::path>& kubeconfig_flag,
                                   const std::optional<std::string>& context = std::nullopt);

}  // namespace tandem::k8s
