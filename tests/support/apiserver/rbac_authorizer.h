// Role-based access control of the test API server, as the real RBAC
// authorizer decides it: a request is allowed when a ClusterRoleBinding, or a
// RoleBinding in the request's namespace, names the user (a User, Group or
// ServiceAccount subject) and its Role or ClusterRole has a rule matching the
// request's verb, API group, resource (with "resource/subresource", "*" and
// "*/subresource") and, when the rule lists them, resourceNames. Denials are
// answered with the real server's 403 Status, wording included:
//   deployments.apps "x" is forbidden: User "U" cannot delete resource
//   "deployments" in API group "apps" in the namespace "ns"
// (collections without the name; "at the cluster scope" without a namespace).
//
// Not modelled: ClusterRole aggregation, nonResourceURLs (non-resource paths
// are open to every authenticated user), the escalate/bind checks on writes
// of Roles and bindings, and impersonation.
//
// The free functions are pure; RbacAuthorizer reads the policy objects from
// the store at each check and is thread-safe as the store is.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/api_status.h"
#include "tests/support/apiserver/store.h"
#include "tests/support/apiserver/user_info.h"

namespace tandem::testing {

// What is asked of the API, as the authorizer sees one resource request.
struct RequestAttributes {
  std::string verb;         // get, list, watch, create, update, patch, delete, deletecollection
  std::string api_group;    // "" for core
  std::string resource;     // plural: "deployments"
  std::string subresource;  // "", "status", "scale", "token"
  std::string ns;           // "" for cluster-scoped objects and all-namespace collections
  std::string name;         // "" for collections and creates
};

// The verb the real API maps an HTTP request to: GET of one object → get, of
// a collection → list, either with ?watch=true (or under /watch/) → watch;
// POST → create, PUT → update, PATCH (server-side apply too) → patch, DELETE
// of one object → delete, of a collection → deletecollection.
std::string requestVerb(const std::string& method, bool named, bool watch);

// The RBAC objects that can grant a request in one namespace (rbac/v1 JSON).
struct RbacPolicy {
  std::vector<nlohmann::json> roles;          // Roles of the request's namespace
  std::vector<nlohmann::json> role_bindings;  // RoleBindings of the request's namespace
  std::vector<nlohmann::json> cluster_roles;
  std::vector<nlohmann::json> cluster_role_bindings;
};

struct RbacDecision {
  bool allowed = false;
  // Why bindings that name the user granted nothing, as "RBAC: ..." (a
  // missing role), or "" (nothing to say: no binding names the user).
  std::string reason;
};

// One PolicyRule against a resource request.
bool ruleAllows(const nlohmann::json& rule, const RequestAttributes& attributes);
// Whether a binding's subject names the user; a ServiceAccount subject
// without a namespace means the binding's own.
bool subjectMatches(const nlohmann::json& subject, const UserInfo& user,
                    const std::string& binding_namespace);
RbacDecision authorize(const RbacPolicy& policy, const UserInfo& user,
                       const RequestAttributes& attributes);
// The 403 the real server answers for a denied resource request.
ApiError forbidden(const UserInfo& user, const RequestAttributes& attributes,
                   const std::string& reason);

class RbacAuthorizer {
 public:
  explicit RbacAuthorizer(const Store& store) : store_(store) {}
  // nullopt when allowed (superusers always are), else the 403 to answer.
  std::optional<ApiError> check(const UserInfo& user, const RequestAttributes& attributes) const;

 private:
  const Store& store_;
};

}  // namespace tandem::testing
