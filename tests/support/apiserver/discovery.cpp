#include "tests/support/apiserver/discovery.h"

#include <algorithm>

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

Json groupJson(const std::vector<KindInfo>& kinds, const std::string& group) {
  std::vector<std::string> versions;
  for (const KindInfo& kind : kinds) {
    if (kind.group == group &&
        std::find(versions.begin(), versions.end(), kind.version) == versions.end()) {
      versions.push_back(kind.version);
    }
  }
  Json list = Json::array();
  for (const std::string& version : versions) {
    list.push_back({{"groupVersion", group + "/" + version}, {"version", version}});
  }
  return {{"name", group}, {"versions", list}, {"preferredVersion", list.at(0)}};
}

}  // namespace

Json versionDocument() {
  return {{"major", "1"},
          {"minor", "32"},
          {"gitVersion", "v1.32.0"},
          {"gitCommit", "0000000000000000000000000000000000000000"},
          {"gitTreeState", "clean"},
          {"buildDate", "2024-12-11T00:00:00Z"},
          {"goVersion", "go1.23.3"},
          {"compiler", "gc"},
          {"platform", "linux/amd64"}};
}

Json coreApiVersions() {
  return {{"kind", "APIVersions"},
          {"versions", Json::array({"v1"})},
          {"serverAddressByClientCIDRs",
           Json::array({{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1"}}})}};
}

Json apiGroupList(const std::vector<KindInfo>& kinds) {
  std::vector<std::string> groups;
  for (const KindInfo& kind : kinds) {
    if (!kind.group.empty() &&
        std::find(groups.begin(), groups.end(), kind.group) == groups.end()) {
      groups.push_back(kind.group);
    }
  }
  Json list = Json::array();
  for (const std::string& group : groups) list.push_back(groupJson(kinds, group));
  return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", list}};
}

std::optional<Json> apiGroup(const std::vector<KindInfo>& kinds, const std::string& group) {
  if (std::none_of(kinds.begin(), kinds.end(),
                   [&](const KindInfo& kind) { return kind.group == group; })) {
    return std::nullopt;
  }
  Json document = groupJson(kinds, group);
  document["kind"] = "APIGroup";
  document["apiVersion"] = "v1";
  return document;
}

std::optional<Json> apiResourceList(const std::vector<KindInfo>& kinds, const std::string& group,
                                    const std::string& version) {
  Json resources = Json::array();
  for (const KindInfo& kind : kinds) {
    if (kind.group != group || kind.version != version) continue;
    Json resource = {{"name", kind.plural},
                     {"singularName", kind.singular},
                     {"namespaced", kind.namespaced},
                     {"kind", kind.kind},
                     {"verbs", Json::array({"create", "delete", "deletecollection", "get", "list",
                                            "patch", "update", "watch"})}};
    if (!kind.short_names.empty()) resource["shortNames"] = kind.short_names;
    if (!kind.categories.empty()) resource["categories"] = kind.categories;
    resources.push_back(resource);
    if (kind.has_status) {
      resources.push_back({{"name", kind.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", kind.namespaced},
                           {"kind", kind.kind},
                           {"verbs", Json::array({"get", "patch", "update"})}});
    }
    if (kind.builtin && kind.kind == "ServiceAccount") {
      resources.push_back({{"name", kind.plural + "/token"},
                           {"singularName", ""},
                           {"namespaced", true},
                           {"group", "authentication.k8s.io"},
                           {"version", "v1"},
                           {"kind", "TokenRequest"},
                           {"verbs", Json::array({"create"})}});
    }
    if (!kind.scale.is_null()) {
      resources.push_back({{"name", kind.plural + "/scale"},
                           {"singularName", ""},
                           {"namespaced", kind.namespaced},
                           {"group", "autoscaling"},
                           {"version", "v1"},
                           {"kind", "Scale"},
                           {"verbs", Json::array({"get", "patch", "update"})}});
    }
  }
  if (resources.empty()) return std::nullopt;
  return Json{{"kind", "APIResourceList"},
              {"apiVersion", "v1"},
              {"groupVersion", group.empty() ? version : group + "/" + version},
              {"resources", resources}};
}

}  // namespace tandem::testing
