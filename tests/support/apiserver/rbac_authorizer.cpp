#include "tests/support/apiserver/rbac_authorizer.h"

#include <algorithm>

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

constexpr const char* kRbacGroup = "rbac.authorization.k8s.io";
constexpr const char* kServiceAccountPrefix = "system:serviceaccount:";

// The strings of a JSON array field, or none.
std::vector<std::string> strings(const Json& object, const char* field) {
  std::vector<std::string> out;
  auto it = object.find(field);
  if (it == object.end() || !it->is_array()) return out;
  for (const Json& item : *it) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

bool contains(const std::vector<std::string>& values, const std::string& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

std::string metaString(const Json& object, const char* field) {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  return metadata->value(field, "");
}

bool resourceMatches(const std::vector<std::string>& rule_resources,
                     const RequestAttributes& attributes) {
  const std::string combined = attributes.subresource.empty()
                                   ? attributes.resource
                                   : attributes.resource + "/" + attributes.subresource;
  for (const std::string& resource : rule_resources) {
    if (resource == "*" || resource == combined) return true;
    if (!attributes.subresource.empty() && resource == "*/" + attributes.subresource) return true;
  }
  return false;
}

const Json* findByName(const std::vector<Json>& objects, const std::string& name) {
  for (const Json& object : objects) {
    if (metaString(object, "name") == name) return &object;
  }
  return nullptr;
}

// The rules a binding's roleRef points at; an error text when it points at nothing.
const Json* referencedRole(const RbacPolicy& policy, const Json& binding, bool cluster_binding,
                           std::string& error) {
  const Json role_ref = binding.value("roleRef", Json::object());
  const std::string kind = role_ref.value("kind", "");
  const std::string name = role_ref.value("name", "");
  if (kind == "ClusterRole") {
    const Json* role = findByName(policy.cluster_roles, name);
    if (!role) error = std::string("clusterrole.") + kRbacGroup + " \"" + name + "\" not found";
    return role;
  }
  if (kind == "Role" && !cluster_binding) {
    const Json* role = findByName(policy.roles, name);
    if (!role) error = std::string("role.") + kRbacGroup + " \"" + name + "\" not found";
    return role;
  }
  error = "unsupported role reference kind: \"" + kind + "\"";
  return nullptr;
}

bool bindingAppliesTo(const Json& binding, const UserInfo& user) {
  auto subjects = binding.find("subjects");
  if (subjects == binding.end() || !subjects->is_array()) return false;
  const std::string ns = metaString(binding, "namespace");
  return std::any_of(subjects->begin(), subjects->end(),
                     [&](const Json& subject) { return subjectMatches(subject, user, ns); });
}

bool roleAllows(const Json& role, const RequestAttributes& attributes) {
  auto rules = role.find("rules");
  if (rules == role.end() || !rules->is_array()) return false;
  return std::any_of(rules->begin(), rules->end(),
                     [&](const Json& rule) { return ruleAllows(rule, attributes); });
}

}  // namespace

std::string requestVerb(const std::string& method, bool named, bool watch) {
  if (method == "GET" || method == "HEAD") {
    if (watch) return "watch";
    return named ? "get" : "list";
  }
  if (method == "POST") return "create";
  if (method == "PUT") return "update";
  if (method == "PATCH") return "patch";
  if (method == "DELETE") return named ? "delete" : "deletecollection";
  std::string verb = method;
  std::transform(verb.begin(), verb.end(), verb.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return verb;
}

bool ruleAllows(const Json& rule, const RequestAttributes& attributes) {
  if (!rule.is_object()) return false;
  const std::vector<std::string> verbs = strings(rule, "verbs");
  if (!contains(verbs, "*") && !contains(verbs, attributes.verb)) return false;
  const std::vector<std::string> groups = strings(rule, "apiGroups");
  if (!contains(groups, "*") && !contains(groups, attributes.api_group)) return false;
  if (!resourceMatches(strings(rule, "resources"), attributes)) return false;
  const std::vector<std::string> names = strings(rule, "resourceNames");
  return names.empty() || contains(names, attributes.name);
}

bool subjectMatches(const Json& subject, const UserInfo& user,
                    const std::string& binding_namespace) {
  if (!subject.is_object()) return false;
  const std::string kind = subject.value("kind", "");
  const std::string name = subject.value("name", "");
  if (kind == "User") return name == user.name;
  if (kind == "Group") return contains(user.groups, name);
  if (kind == "ServiceAccount") {
    std::string ns = subject.value("namespace", "");
    if (ns.empty()) ns = binding_namespace;
    if (ns.empty() || name.empty()) return false;
    return user.name == kServiceAccountPrefix + ns + ":" + name;
  }
  return false;
}

RbacDecision authorize(const RbacPolicy& policy, const UserInfo& user,
                       const RequestAttributes& attributes) {
  RbacDecision decision;
  if (user.superuser) {
    decision.allowed = true;
    return decision;
  }
  std::vector<std::string> errors;
  auto visit = [&](const std::vector<Json>& bindings, bool cluster_bindings) {
    for (const Json& binding : bindings) {
      if (!bindingAppliesTo(binding, user)) continue;
      std::string error;
      const Json* role = referencedRole(policy, binding, cluster_bindings, error);
      if (!role) {
        errors.push_back(error);
        continue;
      }
      if (roleAllows(*role, attributes)) return true;
    }
    return false;
  };
  // A RoleBinding grants only in its namespace; cluster-wide requests are
  // granted by ClusterRoleBindings alone.
  if (visit(policy.cluster_role_bindings, true) ||
      (!attributes.ns.empty() && visit(policy.role_bindings, false))) {
    decision.allowed = true;
    return decision;
  }
  if (errors.size() == 1) {
    decision.reason = "RBAC: " + errors[0];
  } else if (!errors.empty()) {
    std::string joined;
    for (const std::string& error : errors) joined += (joined.empty() ? "" : ", ") + error;
    decision.reason = "RBAC: [" + joined + "]";
  }
  return decision;
}

ApiError forbidden(const UserInfo& user, const RequestAttributes& attributes,
                   const std::string& reason) {
  const std::string resource = attributes.subresource.empty()
                                   ? attributes.resource
                                   : attributes.resource + "/" + attributes.subresource;
  std::string message = "User \"" + user.name + "\" cannot " + attributes.verb + " resource \"" +
                        resource + "\" in API group \"" + attributes.api_group + "\"";
  message += attributes.ns.empty() ? " at the cluster scope"
                                   : " in the namespace \"" + attributes.ns + "\"";
  if (!reason.empty()) message += ": " + reason;
  const std::string qualified = attributes.api_group.empty()
                                    ? attributes.resource
                                    : attributes.resource + "." + attributes.api_group;
  const std::string subject =
      attributes.name.empty() ? qualified : qualified + " \"" + attributes.name + "\"";
  Json details = {{"kind", attributes.resource}};
  if (!attributes.name.empty()) details["name"] = attributes.name;
  if (!attributes.api_group.empty()) details["group"] = attributes.api_group;
  return ApiError{403, "Forbidden", subject + " is forbidden: " + message, details};
}

std::optional<ApiError> RbacAuthorizer::check(const UserInfo& user,
                                              const RequestAttributes& attributes) const {
  if (user.superuser) return std::nullopt;
  const std::string rbac = kRbacGroup;
  RbacPolicy policy;
  policy.cluster_roles = store_.list(rbac + "/clusterroles", "").items;
  policy.cluster_role_bindings = store_.list(rbac + "/clusterrolebindings", "").items;
  if (!attributes.ns.empty()) {
    policy.roles = store_.list(rbac + "/roles", attributes.ns).items;
    policy.role_bindings = store_.list(rbac + "/rolebindings", attributes.ns).items;
  }
  const RbacDecision decision = authorize(policy, user, attributes);
  if (decision.allowed) return std::nullopt;
  return forbidden(user, attributes, decision.reason);
}

}  // namespace tandem::testing
