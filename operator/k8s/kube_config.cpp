#include "operator/k8s/kube_config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/file_text.h"
#include "common/status.h"

namespace tandem::k8s {
namespace {

namespace fs = std::filesystem;

// Reads a whole file, or throws naming what it was for.
std::string readFile(const fs::path& path, const std::string& what) {
  std::optional<std::string> text = readFileText(path);
  if (!text) throw Error(what + ": cannot read " + path.string());
  return std::move(*text);
}

int base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

// Standard base64 (padding optional, whitespace ignored); nullopt when malformed.
std::optional<std::string> decodeBase64(const std::string& text) {
  std::string out;
  uint32_t accumulator = 0;
  int bits = 0;
  bool padding_seen = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding_seen = true;
      continue;
    }
    int value = base64Value(c);
    if (value < 0 || padding_seen) return std::nullopt;
    accumulator = (accumulator << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((accumulator >> bits) & 0xff));
    }
  }
  if (bits >= 6) return std::nullopt;  // a lone trailing character carries no whole byte
  return out;
}

std::string inQuotes(const std::string& text) { return "\"" + text + "\""; }

// The entry named `name` in a kubeconfig list (clusters, users, contexts).
std::optional<YAML::Node> findNamed(const YAML::Node& list, const std::string& name) {
  if (!list || !list.IsSequence()) return std::nullopt;
  for (const auto& entry : list) {
    if (entry.IsMap() && entry["name"] && entry["name"].as<std::string>() == name) return entry;
  }
  return std::nullopt;
}

std::string namesOf(const YAML::Node& list) {
  std::string names;
  if (!list || !list.IsSequence()) return "none";
  for (const auto& entry : list) {
    if (!entry.IsMap() || !entry["name"]) continue;
    if (!names.empty()) names += ", ";
    names += entry["name"].as<std::string>();
  }
  return names.empty() ? "none" : names;
}

std::string scalar(const YAML::Node& map, const char* key) {
  const YAML::Node value = map ? map[key] : YAML::Node();
  if (!value || value.IsNull()) return "";
  if (!value.IsScalar()) throw YAML::Exception(value.Mark(), std::string(key) + " is not a string");
  return value.as<std::string>();
}

bool boolean(const YAML::Node& map, const char* key) {
  const YAML::Node value = map ? map[key] : YAML::Node();
  if (!value || value.IsNull()) return false;
  bool result = false;
  if (!value.IsScalar() || !YAML::convert<bool>::decode(value, result)) {
    throw YAML::Exception(value.Mark(), std::string(key) + " must be true or false");
  }
  return result;
}

// A PEM (or token) given either as a file (`file_key`, relative to the
// kubeconfig's directory) or inline as base64 (`data_key`); "" when neither.
std::string fileOrData(const YAML::Node& map, const char* file_key, const char* data_key,
                       const fs::path& base_dir, const std::string& where) {
  const std::string data = scalar(map, data_key);
  if (!data.empty()) {
    auto decoded = decodeBase64(data);
    if (!decoded) throw Error(where + ": " + data_key + " is not valid base64");
    return *decoded;
  }
  const std::string file = scalar(map, file_key);
  if (file.empty()) return "";
  fs::path path(file);
  if (path.is_relative()) path = base_dir / path;
  return readFile(path, where + ": " + file_key);
}

ClusterConfig parseKubeconfig(const YAML::Node& root, const fs::path& path,
                              const std::optional<std::string>& context_override) {
  const std::string where = "kubeconfig " + path.string();
  if (!root.IsMap()) throw Error(where + ": not a kubeconfig (the top level is not a mapping)");
  const fs::path base_dir = path.has_parent_path() ? path.parent_path() : fs::path(".");

  std::string context_name = context_override.value_or(scalar(root, "current-context"));
  if (context_name.empty()) {
    throw Error(where + ": no current-context is set and no context was given; contexts: " +
                namesOf(root["contexts"]));
  }
  const auto context_entry = findNamed(root["contexts"], context_name);
  if (!context_entry) {
    throw Error(where + ": context " + inQuotes(context_name) +
                " is not defined; contexts: " + namesOf(root["contexts"]));
  }
  const YAML::Node context = (*context_entry)["context"];
  const std::string cluster_name = scalar(context, "cluster");
  const std::string user_name = scalar(context, "user");
  if (cluster_name.empty()) {
    throw Error(where + ": context " + inQuotes(context_name) + " names no cluster");
  }
  const auto cluster_entry = findNamed(root["clusters"], cluster_name);
  if (!cluster_entry) {
    throw Error(where + ": context " + inQuotes(context_name) + " names cluster " +
                inQuotes(cluster_name) +
                ", which the file does not define; clusters: " + namesOf(root["clusters"]));
  }
  std::optional<YAML::Node> user;
  if (!user_name.empty()) {
    const auto user_entry = findNamed(root["users"], user_name);
    if (!user_entry) {
      throw Error(where + ": context " + inQuotes(context_name) + " names user " +
                  inQuotes(user_name) +
                  ", which the file does not define; users: " + namesOf(root["users"]));
    }
    user = (*user_entry)["user"];
  }

  ClusterConfig config;
  config.source = where + " (context " + context_name + ")";
  const YAML::Node cluster = (*cluster_entry)["cluster"];
  const std::string cluster_where = where + ": cluster " + inQuotes(cluster_name);
  config.server = scalar(cluster, "server");
  if (config.server.empty()) throw Error(cluster_where + " has no server");
  if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0) {
    throw Error(cluster_where + ": server " + inQuotes(config.server) +
                " must start with https:// or http://");
  }
  config.certificate_authority_pem = fileOrData(
      cluster, "certificate-authority", "certificate-authority-data", base_dir, cluster_where);
  config.insecure_skip_tls_verify = boolean(cluster, "insecure-skip-tls-verify");
  config.tls_server_name = scalar(cluster, "tls-server-name");

  if (user) {
    const YAML::Node& user_node = *user;
    const std::string user_where = where + ": user " + inQuotes(user_name);
    if (user_node["exec"]) {
      throw Error(user_where +
                  " authenticates with an exec plugin, which tandem-operator does not run; "
                  "use a token, tokenFile or client certificate");
    }
    if (user_node["auth-provider"]) {
      throw Error(user_where +
                  " authenticates with an auth-provider, which tandem-operator does not "
                  "support; use a token, tokenFile or client certificate");
    }
    if (user_node["username"] || user_node["password"]) {
      throw Error(user_where +
                  " uses basic authentication (username/password), which Kubernetes no "
                  "longer supports; use a token, tokenFile or client certificate");
    }
    config.token = scalar(user_node, "token");
    const std::string token_file = scalar(user_node, "tokenFile");
    if (!token_file.empty()) {
      config.token_file =
          fs::path(token_file).is_relative() ? base_dir / token_file : fs::path(token_file);
      // Read once now so that a wrong path fails at start-up, not at the first call.
      readFile(config.token_file, user_where + ": tokenFile");
    }
    config.client_certificate_pem = fileOrData(user_node, "client-certificate",
                                               "client-certificate-data", base_dir, user_where);
    config.client_key_pem =
        fileOrData(user_node, "client-key", "client-key-data", base_dir, user_where);
    if (config.client_certificate_pem.empty() != config.client_key_pem.empty()) {
      throw Error(user_where +
                  " has a client certificate without its key, or a key without "
                  "its certificate; both are needed");
    }
  }
  const std::string ns = scalar(context, "namespace");
  if (!ns.empty()) config.default_namespace = ns;
  return config;
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

}  // namespace

ClusterConfig loadKubeconfig(const fs::path& path, const std::optional<std::string>& context) {
  const std::string text = readFile(path, "kubeconfig");
  try {
    return parseKubeconfig(YAML::Load(text), path, context);
  } catch (const YAML::Exception& e) {
    throw Error("kubeconfig " + path.string() + ": not a valid kubeconfig: " + e.what());
  }
}

ClusterConfig inClusterConfig(const fs::path& service_account_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    throw Error(
        "in-cluster configuration: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must "
        "both be set (they are inside a pod); outside a cluster pass --kubeconfig");
  }
  ClusterConfig config;
  const std::string host_text = host;
  const bool ipv6 = host_text.find(':') != std::string::npos;
  config.server = "https://" + (ipv6 ? "[" + host_text + "]" : host_text) + ":" + port;
  config.token_file = service_account_dir / "token";
  readFile(config.token_file, "in-cluster configuration: service account token");
  config.certificate_authority_pem =
      readFile(service_account_dir / "ca.crt", "in-cluster configuration: service account CA");
  std::error_code ec;
  if (fs::exists(service_account_dir / "namespace", ec)) {
    const std::string ns =
        trim(readFile(service_account_dir / "namespace", "in-cluster configuration: namespace"));
    if (!ns.empty()) config.default_namespace = ns;
  }
  config.source = "in-cluster";
  return config;
}

ClusterConfig resolveClusterConfig(const std::optional<fs::path>& kubeconfig_flag,
                                   const std::optional<std::string>& context) {
  if (kubeconfig_flag) return loadKubeconfig(*kubeconfig_flag, context);
  const char* env = std::getenv("KUBECONFIG");
  if (env != nullptr && *env != '\0') {
    std::vector<std::string> entries;
    std::stringstream stream(env);
    std::string entry;
    while (std::getline(stream, entry, ':')) {
      if (!entry.empty()) entries.push_back(entry);
    }
    for (const auto& candidate : entries) {
      std::error_code ec;
      if (fs::exists(candidate, ec)) return loadKubeconfig(candidate, context);
    }
    throw Error("KUBECONFIG=" + std::string(env) + ": none of its files exists");
  }
  const char* service_host = std::getenv("KUBERNETES_SERVICE_HOST");
  if (service_host != nullptr && *service_host != '\0') return inClusterConfig();
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    throw Error("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run inside a pod");
  }
  const fs::path default_path = fs::path(home) / ".kube" / "config";
  std::error_code ec;
  if (!fs::exists(default_path, ec)) {
    throw Error("no kubeconfig: " + default_path.string() +
                " does not exist; pass --kubeconfig, set KUBECONFIG, or run inside a pod");
  }
  return loadKubeconfig(default_path, context);
}

}  // namespace tandem::k8s
