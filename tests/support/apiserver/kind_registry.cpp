#include "tests/support/apiserver/kind_registry.h"

#include <cctype>

namespace tandem::testing {
namespace {

KindInfo builtin(const std::string& group, const std::string& version, const std::string& kind,
                 const std::string& plural, std::vector<std::string> short_names, bool namespaced,
                 bool has_status, std::vector<std::string> categories = {}) {
  KindInfo info;
  info.group = group;
  info.version = version;
  info.kind = kind;
  info.list_kind = kind + "List";
  info.plural = plural;
  info.singular = kind;
  for (char& c : info.singular) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  info.short_names = std::move(short_names);
  info.categories = std::move(categories);
  info.namespaced = namespaced;
  info.builtin = true;
  info.has_status = has_status;
  return info;
}

std::vector<KindInfo> builtinKinds() {
  std::vector<KindInfo> kinds;
  kinds.push_back(builtin("", "v1", "Namespace", "namespaces", {"ns"}, false, true));
  kinds.push_back(builtin("", "v1", "Pod", "pods", {"po"}, true, true, {"all"}));
  kinds.push_back(builtin("", "v1", "Service", "services", {"svc"}, true, true, {"all"}));
  kinds.push_back(builtin("", "v1", "Event", "events", {"ev"}, true, false));
  kinds.push_back(builtin("", "v1", "Secret", "secrets", {}, true, false));
  kinds.push_back(builtin("", "v1", "ConfigMap", "configmaps", {"cm"}, true, false));
  KindInfo deployment =
      builtin("apps", "v1", "Deployment", "deployments", {"deploy"}, true, true, {"all"});
  deployment.scale = {{"specReplicasPath", ".spec.replicas"},
                      {"statusReplicasPath", ".status.replicas"},
                      {"labelSelectorPath", ".spec.selector"}};
  kinds.push_back(deployment);
  kinds.push_back(
      builtin("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", {}, true, false));
  kinds.push_back(builtin("coordination.k8s.io", "v1", "Lease", "leases", {}, true, false));
  kinds.push_back(
      builtin("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", {"pdb"}, true, true));
  kinds.push_back(builtin("autoscaling", "v2", "HorizontalPodAutoscaler",
                          "horizontalpodautoscalers", {"hpa"}, true, true, {"all"}));
  kinds.push_back(builtin("", "v1", "ServiceAccount", "serviceaccounts", {"sa"}, true, false));
  const std::string rbac = "rbac.authorization.k8s.io";
  kinds.push_back(builtin(rbac, "v1", "Role", "roles", {}, true, false));
  kinds.push_back(builtin(rbac, "v1", "RoleBinding", "rolebindings", {}, true, false));
  kinds.push_back(builtin(rbac, "v1", "ClusterRole", "clusterroles", {}, false, false));
  kinds.push_back(
      builtin(rbac, "v1", "ClusterRoleBinding", "clusterrolebindings", {}, false, false));
  kinds.push_back(builtin("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", {"netpol"},
                          true, false));
  kinds.push_back(builtin("apiextensions.k8s.io", "v1", "CustomResourceDefinition",
                          "customresourcedefinitions", {"crd", "crds"}, false, true));
  return kinds;
}

std::vector<std::string> stringList(const nlohmann::json& value) {
  std::vector<std::string> out;
  if (!value.is_array()) return out;
  for (const auto& item : value) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

}  // namespace

std::string resourceKey(const KindInfo& kind) { return kind.group + "/" + kind.plural; }

std::string qualifiedResource(const KindInfo& kind) {
  return kind.group.empty() ? kind.plural : kind.plural + "." + kind.group;
}

std::vector<KindInfo> kindsOfCrd(const nlohmann::json& crd) {
  std::vector<KindInfo> kinds;
  const nlohmann::json spec = crd.value("spec", nlohmann::json::object());
  const nlohmann::json names = spec.value("names", nlohmann::json::object());
  if (!spec.contains("versions") || !spec["versions"].is_array()) return kinds;
  for (const auto& version : spec["versions"]) {
    if (!version.is_object() || !version.value("served", true)) continue;
    KindInfo info;
    info.group = spec.value("group", "");
    info.version = version.value("name", "");
    info.kind = names.value("kind", "");
    info.list_kind = names.value("listKind", info.kind + "List");
    info.plural = names.value("plural", "");
    info.singular = names.value("singular", "");
    if (info.singular.empty()) {
      info.singular = info.kind;
      for (char& c : info.singular) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
    }
    info.short_names = stringList(names.value("shortNames", nlohmann::json::array()));
    info.categories = stringList(names.value("categories", nlohmann::json::array()));
    info.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
    const nlohmann::json subresources = version.value("subresources", nlohmann::json::object());
    info.has_status = subresources.is_object() && subresources.contains("status");
    if (subresources.is_object() && subresources.contains("scale")) {
      info.scale = subresources["scale"];
    }
    if (version.contains("schema") && version["schema"].is_object()) {
      info.schema = version["schema"].value("openAPIV3Schema", nlohmann::json(nullptr));
    }
    info.printer_columns = version.value("additionalPrinterColumns", nlohmann::json::array());
    kinds.push_back(std::move(info));
  }
  return kinds;
}

KindRegistry::KindRegistry() : builtin_(builtinKinds()) {}

std::vector<KindInfo> KindRegistry::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<KindInfo> kinds = builtin_;
  for (const auto& [crd, info] : custom_) kinds.push_back(info);
  return kinds;
}

std::optional<KindInfo> KindRegistry::byResource(const std::string& group,
                                                 const std::string& version,
                                                 const std::string& plural) const {
  for (const KindInfo& kind : all()) {
    if (kind.group == group && kind.version == version && kind.plural == plural) return kind;
  }
  return std::nullopt;
}

std::optional<KindInfo> KindRegistry::byKind(const std::string& api_version,
                                             const std::string& kind) const {
  for (const KindInfo& info : all()) {
    if (info.apiVersion() == api_version && info.kind == kind) return info;
  }
  return std::nullopt;
}

void KindRegistry::registerCrd(const nlohmann::json& crd) {
  std::string name = crd.value("metadata", nlohmann::json::object()).value("name", "");
  std::vector<KindInfo> kinds = kindsOfCrd(crd);
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(custom_, [&](const auto& entry) { return entry.first == name; });
  for (KindInfo& kind : kinds) custom_.emplace_back(name, std::move(kind));
}

void KindRegistry::unregisterCrd(const std::string& crd_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(custom_, [&](const auto& entry) { return entry.first == crd_name; });
}

}  // namespace tandem::testing
