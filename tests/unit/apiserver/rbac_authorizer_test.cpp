// The test API server's RBAC: rule matching (verbs, groups, resources with
// subresources and wildcards, resourceNames), bindings and subjects, the
// 403 wording, the HTTP verb mapping, and service-account tokens.
#include "tests/support/apiserver/rbac_authorizer.h"

#include <gtest/gtest.h>

#include "tests/support/apiserver/service_account_tokens.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

UserInfo serviceAccount(const std::string& ns, const std::string& name) {
  return UserInfo{
      serviceAccountUserName(ns, name),
      {"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
      false,
      ""};
}

RequestAttributes request(const std::string& verb, const std::string& group,
                          const std::string& resource, const std::string& ns,
                          const std::string& name = "", const std::string& subresource = "") {
  return RequestAttributes{verb, group, resource, subresource, ns, name};
}

Json role(const std::string& kind, const std::string& name, const std::string& ns, Json rules) {
  Json object = {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                 {"kind", kind},
                 {"metadata", {{"name", name}}},
                 {"rules", std::move(rules)}};
  if (!ns.empty()) object["metadata"]["namespace"] = ns;
  return object;
}

Json binding(const std::string& kind, const std::string& ns, const std::string& role_kind,
             const std::string& role_name, Json subjects) {
  Json object = {
      {"apiVersion", "rbac.authorization.k8s.io/v1"},
      {"kind", kind},
      {"metadata", {{"name", "b"}}},
      {"roleRef",
       {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", role_kind}, {"name", role_name}}},
      {"subjects", std::move(subjects)}};
  if (!ns.empty()) object["metadata"]["namespace"] = ns;
  return object;
}

TEST(RequestVerbTest, MapsMethodsAsTheRealApi) {
  EXPECT_EQ(requestVerb("GET", true, false), "get");
  EXPECT_EQ(requestVerb("GET", false, false), "list");
  EXPECT_EQ(requestVerb("GET", false, true), "watch");
  EXPECT_EQ(requestVerb("GET", true, true), "watch");
  EXPECT_EQ(requestVerb("POST", false, false), "create");
  EXPECT_EQ(requestVerb("PUT", true, false), "update");
  EXPECT_EQ(requestVerb("PATCH", true, false), "patch");
  EXPECT_EQ(requestVerb("DELETE", true, false), "delete");
  EXPECT_EQ(requestVerb("DELETE", false, false), "deletecollection");
}

TEST(RuleAllowsTest, MatchesVerbsGroupsResourcesAndNames) {
  const Json rule = {{"apiGroups", {"apps"}},
                     {"resources", {"deployments", "deployments/status"}},
                     {"verbs", {"get", "patch"}}};
  EXPECT_TRUE(ruleAllows(rule, request("get", "apps", "deployments", "ns", "x")));
  EXPECT_TRUE(ruleAllows(rule, request("patch", "apps", "deployments", "ns", "x", "status")));
  EXPECT_FALSE(ruleAllows(rule, request("delete", "apps", "deployments", "ns", "x")));
  EXPECT_FALSE(ruleAllows(rule, request("get", "", "deployments", "ns", "x")));
  EXPECT_FALSE(ruleAllows(rule, request("get", "apps", "deployments", "ns", "x", "scale")));
  EXPECT_FALSE(ruleAllows(rule, request("get", "apps", "replicasets", "ns", "x")));

  const Json scale = {{"apiGroups", {"tandem.dev"}}, {"resources", {"*/scale"}}, {"verbs", {"*"}}};
  EXPECT_TRUE(
      ruleAllows(scale, request("update", "tandem.dev", "prefillpools", "ns", "p", "scale")));
  EXPECT_FALSE(ruleAllows(scale, request("update", "tandem.dev", "prefillpools", "ns", "p")));

  const Json everything = {{"apiGroups", {"*"}}, {"resources", {"*"}}, {"verbs", {"*"}}};
  EXPECT_TRUE(
      ruleAllows(everything, request("delete", "apps", "deployments", "ns", "x", "status")));

  const Json named = {{"apiGroups", {""}},
                      {"resources", {"configmaps"}},
                      {"resourceNames", {"mine"}},
                      {"verbs", {"get", "list", "create"}}};
  EXPECT_TRUE(ruleAllows(named, request("get", "", "configmaps", "ns", "mine")));
  EXPECT_FALSE(ruleAllows(named, request("get", "", "configmaps", "ns", "other")));
  // A create or an unnarrowed list names no object: resourceNames never match it.
  EXPECT_FALSE(ruleAllows(named, request("create", "", "configmaps", "ns")));
  EXPECT_FALSE(ruleAllows(named, request("list", "", "configmaps", "ns")));
}

TEST(SubjectMatchesTest, UsersGroupsAndServiceAccounts) {
  const UserInfo user = serviceAccount("tandem", "op");
  EXPECT_TRUE(subjectMatches({{"kind", "ServiceAccount"}, {"name", "op"}, {"namespace", "tandem"}},
                             user, "other"));
  // Without a namespace: the binding's own.
  EXPECT_TRUE(subjectMatches({{"kind", "ServiceAccount"}, {"name", "op"}}, user, "tandem"));
  EXPECT_FALSE(subjectMatches({{"kind", "ServiceAccount"}, {"name", "op"}}, user, "other"));
  EXPECT_FALSE(subjectMatches({{"kind", "ServiceAccount"}, {"name", "op"}}, user, ""));
  EXPECT_TRUE(
      subjectMatches({{"kind", "User"}, {"name", "system:serviceaccount:tandem:op"}}, user, ""));
  EXPECT_TRUE(
      subjectMatches({{"kind", "Group"}, {"name", "system:serviceaccounts:tandem"}}, user, ""));
  EXPECT_FALSE(subjectMatches({{"kind", "Group"}, {"name", "system:masters"}}, user, ""));
}

TEST(AuthorizeTest, RoleBindingsGrantInTheirNamespaceAndClusterBindingsEverywhere) {
  const UserInfo user = serviceAccount("tandem", "op");
  const Json pools_rule = Json::array(
      {{{"apiGroups", {"tandem.dev"}}, {"resources", {"prefillpools"}}, {"verbs", {"list"}}}});
  RbacPolicy policy;
  policy.roles = {role("Role", "reader", "tandem", pools_rule)};
  policy.role_bindings = {binding("RoleBinding", "tandem", "Role", "reader",
                                  Json::array({{{"kind", "ServiceAccount"}, {"name", "op"}}}))};
  EXPECT_TRUE(
      authorize(policy, user, request("list", "tandem.dev", "prefillpools", "tandem")).allowed);
  // At the cluster scope a RoleBinding grants nothing.
  EXPECT_FALSE(authorize(policy, user, request("list", "tandem.dev", "prefillpools", "")).allowed);
  EXPECT_FALSE(
      authorize(policy, user, request("watch", "tandem.dev", "prefillpools", "tandem")).allowed);
  // Someone else's binding.
  const UserInfo other = serviceAccount("tandem", "router");
  EXPECT_FALSE(
      authorize(policy, other, request("list", "tandem.dev", "prefillpools", "tandem")).allowed);
  // Superusers are never checked.
  UserInfo admin{"admin", {"system:masters"}, true, ""};
  EXPECT_TRUE(authorize(RbacPolicy{}, admin, request("delete", "", "secrets", "x", "y")).allowed);

  // A RoleBinding to a ClusterRole grants it in the binding's namespace.
  RbacPolicy cluster;
  cluster.cluster_roles = {role("ClusterRole", "pools", "", pools_rule)};
  cluster.role_bindings = {binding("RoleBinding", "tandem", "ClusterRole", "pools",
                                   Json::array({{{"kind", "ServiceAccount"}, {"name", "op"}}}))};
  EXPECT_TRUE(
      authorize(cluster, user, request("list", "tandem.dev", "prefillpools", "tandem")).allowed);
  EXPECT_FALSE(authorize(cluster, user, request("list", "tandem.dev", "prefillpools", "")).allowed);
  // A ClusterRoleBinding grants it everywhere, cluster scope included.
  cluster.role_bindings.clear();
  cluster.cluster_role_bindings = {binding(
      "ClusterRoleBinding", "", "ClusterRole", "pools",
      Json::array({{{"kind", "ServiceAccount"}, {"name", "op"}, {"namespace", "tandem"}}}))};
  EXPECT_TRUE(
      authorize(cluster, user, request("list", "tandem.dev", "prefillpools", "elsewhere")).allowed);
  EXPECT_TRUE(authorize(cluster, user, request("list", "tandem.dev", "prefillpools", "")).allowed);
}

TEST(AuthorizeTest, AMissingRoleIsTheReason) {
  const UserInfo user = serviceAccount("tandem", "op");
  RbacPolicy policy;
  policy.role_bindings = {binding("RoleBinding", "tandem", "Role", "gone",
                                  Json::array({{{"kind", "ServiceAccount"}, {"name", "op"}}}))};
  const RequestAttributes attributes = request("get", "", "pods", "tandem", "p");
  const RbacDecision decision = authorize(policy, user, attributes);
  EXPECT_FALSE(decision.allowed);
  EXPECT_EQ(decision.reason, "RBAC: role.rbac.authorization.k8s.io \"gone\" not found");
  EXPECT_EQ(forbidden(user, attributes, decision.reason).message,
            "pods \"p\" is forbidden: User \"system:serviceaccount:tandem:op\" cannot get "
            "resource \"pods\" in API group \"\" in the namespace \"tandem\": RBAC: "
            "role.rbac.authorization.k8s.io \"gone\" not found");
}

TEST(ForbiddenTest, WordedAsTheRealApiServer) {
  const UserInfo user = serviceAccount("tandem", "tandem-operator");
  const ApiError one = forbidden(user, request("delete", "apps", "deployments", "tandem", "x"), "");
  EXPECT_EQ(one.code, 403);
  EXPECT_EQ(one.reason, "Forbidden");
  EXPECT_EQ(one.message,
            "deployments.apps \"x\" is forbidden: User "
            "\"system:serviceaccount:tandem:tandem-operator\" cannot delete resource "
            "\"deployments\" in API group \"apps\" in the namespace \"tandem\"");
  EXPECT_EQ(one.details, (Json{{"kind", "deployments"}, {"name", "x"}, {"group", "apps"}}));

  EXPECT_EQ(forbidden(user, request("list", "", "secrets", "tandem"), "").message,
            "secrets is forbidden: User \"system:serviceaccount:tandem:tandem-operator\" cannot "
            "list resource \"secrets\" in API group \"\" in the namespace \"tandem\"");
  EXPECT_EQ(forbidden(user, request("watch", "tandem.dev", "prefillpools", ""), "").message,
            "prefillpools.tandem.dev is forbidden: User "
            "\"system:serviceaccount:tandem:tandem-operator\" cannot watch resource "
            "\"prefillpools\" in API group \"tandem.dev\" at the cluster scope");
  EXPECT_EQ(
      forbidden(user, request("update", "tandem.dev", "prefillpools", "tandem", "p", "status"), "")
          .message,
      "prefillpools.tandem.dev \"p\" is forbidden: User "
      "\"system:serviceaccount:tandem:tandem-operator\" cannot update resource "
      "\"prefillpools/status\" in API group \"tandem.dev\" in the namespace \"tandem\"");
}

TEST(ServiceAccountTokensTest, IssuedForExistingAccountsAndValidWhileTheyExist) {
  Store store;
  ServiceAccountTokens tokens(store);
  EXPECT_EQ(tokens.createToken("tandem", "op", "application/json", "").code, 404);
  store.create("/serviceaccounts",
               {{"apiVersion", "v1"},
                {"kind", "ServiceAccount"},
                {"metadata", {{"name", "op"}, {"namespace", "tandem"}, {"uid", "u1"}}}});
  const ApiResult issued = tokens.createToken("tandem", "op", "application/json", "");
  ASSERT_TRUE(issued.ok());
  EXPECT_EQ(issued.code, 201);
  EXPECT_EQ(issued.body["kind"], "TokenRequest");
  EXPECT_EQ(issued.body["spec"]["expirationSeconds"], 3600);
  const std::string token = issued.body["status"]["token"];
  const auto user = tokens.authenticate(token);
  ASSERT_TRUE(user.has_value());
  EXPECT_EQ(user->name, "system:serviceaccount:tandem:op");
  EXPECT_EQ(user->groups,
            (std::vector<std::string>{"system:serviceaccounts", "system:serviceaccounts:tandem",
                                      "system:authenticated"}));
  EXPECT_FALSE(user->superuser);
  EXPECT_NE(tokens.createToken("tandem", "op", "application/json", "").body["status"]["token"],
            token);
  EXPECT_FALSE(tokens.authenticate("not-issued").has_value());

  const ApiResult short_lived = tokens.createToken("tandem", "op", "application/json",
                                                   R"({"spec":{"expirationSeconds":60}})");
  EXPECT_EQ(short_lived.code, 422);
  EXPECT_NE(short_lived.error->message.find("may not specify a duration less than 10 minutes"),
            std::string::npos);

  // Deleted, then recreated with another uid: the old token stays invalid.
  store.remove("/serviceaccounts", "tandem", "op");
  EXPECT_FALSE(tokens.authenticate(token).has_value());
  store.create("/serviceaccounts",
               {{"apiVersion", "v1"},
                {"kind", "ServiceAccount"},
                {"metadata", {{"name", "op"}, {"namespace", "tandem"}, {"uid", "u2"}}}});
  EXPECT_FALSE(tokens.authenticate(token).has_value());
  EXPECT_TRUE(tokens.issued(token));
}

}  // namespace
}  // namespace tandem::testing
