// The test API server over HTTP: CRUD and conflicts, generation, the status
// and scale subresources, list paging and selectors, patches, garbage
// collection, authentication, TLS, hooks.
#include "tests/support/apiserver/api_server.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <thread>

#include "tests/support/test_files.h"
#include "tests/unit/apiserver/api_test_client.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

constexpr char kConfigMaps[] = "/api/v1/namespaces/default/configmaps";
constexpr char kPools[] = "/apis/tandem.dev/v1alpha1/namespaces/default/prefillpools";

std::string rvOf(const Json& object) { return object["metadata"]["resourceVersion"]; }

TEST(ApiServerTest, CreateGetUpdateAndStaleUpdateConflicts) {
  ApiServer server;
  ApiTestClient client(server);
  JsonAnswer created = client.post(kConfigMaps, configMap("settings"));
  ASSERT_EQ(created.status, 201) << created.text;
  EXPECT_FALSE(created.body["metadata"]["uid"].get<std::string>().empty());
  EXPECT_EQ(created.body["metadata"]["namespace"], "default");
  EXPECT_EQ(created.body["metadata"]["generation"], 1);

  JsonAnswer fetched = client.get(std::string(kConfigMaps) + "/settings");
  ASSERT_EQ(fetched.status, 200);
  EXPECT_EQ(fetched.body, created.body);

  Json changed = created.body;
  changed["data"]["key"] = "second";
  JsonAnswer updated = client.put(std::string(kConfigMaps) + "/settings", changed);
  ASSERT_EQ(updated.status, 200) << updated.text;
  EXPECT_GT(std::stoull(rvOf(updated.body)), std::stoull(rvOf(created.body)));

  // The first version again: its resourceVersion is stale now.
  changed["data"]["key"] = "third";
  JsonAnswer stale = client.put(std::string(kConfigMaps) + "/settings", changed);
  EXPECT_EQ(stale.status, 409);
  EXPECT_EQ(stale.body["kind"], "Status");
  EXPECT_EQ(stale.body["reason"], "Conflict");
  EXPECT_EQ(stale.body["message"],
            "Operation cannot be fulfilled on configmaps \"settings\": the object has been "
            "modified; please apply your changes to the latest version and try again");

  JsonAnswer again = client.post(kConfigMaps, configMap("settings"));
  EXPECT_EQ(again.status, 409);
  EXPECT_EQ(again.body["reason"], "AlreadyExists");
  EXPECT_EQ(again.body["message"], "configmaps \"settings\" already exists");

  JsonAnswer missing = client.get(std::string(kConfigMaps) + "/absent");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.body["reason"], "NotFound");
  EXPECT_EQ(missing.body["message"], "configmaps \"absent\" not found");
  EXPECT_EQ(missing.body["details"]["name"], "absent");

  JsonAnswer deleted = client.del(std::string(kConfigMaps) + "/settings");
  EXPECT_EQ(deleted.status, 200);
  EXPECT_EQ(client.get(std::string(kConfigMaps) + "/settings").status, 404);
  EXPECT_EQ(server.writesBy("anonymous"), 3u);  // create, update, delete
}

TEST(ApiServerTest, GenerateNameMakesAUniqueName) {
  ApiServer server;
  ApiTestClient client(server);
  Json object = configMap("");
  object["metadata"].erase("name");
  object["metadata"]["generateName"] = "job-";
  JsonAnswer first = client.post(kConfigMaps, object);
  JsonAnswer second = client.post(kConfigMaps, object);
  ASSERT_EQ(first.status, 201) << first.text;
  ASSERT_EQ(second.status, 201) << second.text;
  std::string name = first.body["metadata"]["name"];
  EXPECT_EQ(name.rfind("job-", 0), 0u);
  EXPECT_EQ(name.size(), 9u);
  EXPECT_NE(first.body["metadata"]["name"], second.body["metadata"]["name"]);
}

// Names are RFC 1123 subdomains, except a Service's: a DNS-1035 label, so a
// name that starts with a digit makes a ConfigMap and not a Service.
TEST(ApiServerTest, AServiceNameStartsWithALetter) {
  ApiServer server;
  ApiTestClient client(server);
  EXPECT_EQ(client.post(kConfigMaps, configMap("70b-decode")).status, 201);
  const Json service = {{"apiVersion", "v1"},
                        {"kind", "Service"},
                        {"metadata", {{"name", "70b-decode"}}},
                        {"spec", {{"ports", {{{"port", 80}}}}}}};
  JsonAnswer refused = client.post("/api/v1/namespaces/default/services", service);
  EXPECT_EQ(refused.status, 422) << refused.text;
  EXPECT_NE(refused.text.find("a DNS-1035 label must consist of"), std::string::npos)
      << refused.text;
  Json named = service;
  named["metadata"]["name"] = "decode-70b";
  EXPECT_EQ(client.post("/api/v1/namespaces/default/services", named).status, 201);
}

TEST(ApiServerTest, GenerationChangesWithSpecOnlyAndStatusIsASubresource) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  Json pool = prefillPool("p");
  pool["status"] = {{"readyReplicas", 7}};
  JsonAnswer created = client.post(kPools, pool);
  ASSERT_EQ(created.status, 201) << created.text;
  EXPECT_EQ(created.body["metadata"]["generation"], 1);
  EXPECT_FALSE(created.body.contains("status")) << "status is ignored on create";
  EXPECT_EQ(created.body["spec"]["replicas"], 1) << "the schema's default";

  Json labelled = created.body;
  labelled["metadata"]["labels"] = {{"team", "a"}};
  JsonAnswer relabelled = client.put(std::string(kPools) + "/p", labelled);
  ASSERT_EQ(relabelled.status, 200) << relabelled.text;
  EXPECT_EQ(relabelled.body["metadata"]["generation"], 1);

  Json scaled = relabelled.body;
  scaled["spec"]["replicas"] = 4;
  scaled["status"] = {{"readyReplicas", 3}};
  JsonAnswer rescaled = client.put(std::string(kPools) + "/p", scaled);
  ASSERT_EQ(rescaled.status, 200) << rescaled.text;
  EXPECT_EQ(rescaled.body["metadata"]["generation"], 2);
  EXPECT_FALSE(rescaled.body.contains("status")) << "status is ignored on the main resource";

  Json status_update = rescaled.body;
  status_update["spec"]["replicas"] = 9;
  status_update["status"] = {{"readyReplicas", 4}};
  JsonAnswer status = client.put(std::string(kPools) + "/p/status", status_update);
  ASSERT_EQ(status.status, 200) << status.text;
  EXPECT_EQ(status.body["status"]["readyReplicas"], 4);
  EXPECT_EQ(status.body["spec"]["replicas"], 4) << "spec is ignored on /status";
  EXPECT_EQ(status.body["metadata"]["generation"], 2);

  // An update that changes nothing writes nothing.
  uint64_t version = server.resourceVersion();
  JsonAnswer same = client.put(std::string(kPools) + "/p", status.body);
  EXPECT_EQ(same.status, 200);
  EXPECT_EQ(server.resourceVersion(), version);
}

TEST(ApiServerTest, ScaleSubresourceRightAfterCreation) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  ASSERT_EQ(client.post(kPools, prefillPool("pool")).status, 201);
  JsonAnswer scale = client.get(std::string(kPools) + "/pool/scale");
  ASSERT_EQ(scale.status, 200) << scale.text;
  EXPECT_EQ(scale.body["kind"], "Scale");
  EXPECT_EQ(scale.body["apiVersion"], "autoscaling/v1");
  EXPECT_EQ(scale.body["spec"]["replicas"], 1);
  EXPECT_EQ(scale.body["status"]["replicas"], 0);

  Json wanted = scale.body;
  wanted["spec"]["replicas"] = 3;
  JsonAnswer put = client.put(std::string(kPools) + "/pool/scale", wanted);
  ASSERT_EQ(put.status, 200) << put.text;
  EXPECT_EQ(put.body["spec"]["replicas"], 3);
  EXPECT_EQ(server.get("tandem.dev/v1alpha1", "PrefillPool", "default", "pool")
                .value()["spec"]["replicas"],
            3);

  JsonAnswer patched = client.patch(std::string(kPools) + "/pool/scale",
                                    R"({"spec":{"replicas":5}})", "application/merge-patch+json");
  ASSERT_EQ(patched.status, 200) << patched.text;
  EXPECT_EQ(patched.body["spec"]["replicas"], 5);

  JsonAnswer negative = client.patch(std::string(kPools) + "/pool/scale",
                                     R"({"spec":{"replicas":-1}})", "application/merge-patch+json");
  EXPECT_EQ(negative.status, 422);

  // Deployments' scale reports the selector as text.
  Json deployment = {{"apiVersion", "apps/v1"},
                     {"kind", "Deployment"},
                     {"metadata", {{"name", "web"}}},
                     {"spec",
                      {{"selector", {{"matchLabels", {{"app", "web"}}}}},
                       {"template", {{"metadata", {{"labels", {{"app", "web"}}}}}}}}}};
  ASSERT_EQ(client.post("/apis/apps/v1/namespaces/default/deployments", deployment).status, 201);
  JsonAnswer deployment_scale =
      client.get("/apis/apps/v1/namespaces/default/deployments/web/scale");
  EXPECT_EQ(deployment_scale.body["spec"]["replicas"], 1);
  EXPECT_EQ(deployment_scale.body["status"]["selector"], "app=web");
}

TEST(ApiServerTest, ListPagesWithContinueTokens) {
  ApiServer server;
  ApiTestClient client(server);
  for (const char* name : {"e", "a", "d", "b", "c"}) {
    ASSERT_EQ(client.post(kConfigMaps, configMap(name)).status, 201);
  }
  std::vector<std::string> names;
  std::string token;
  int pages = 0;
  do {
    std::string path = std::string(kConfigMaps) + "?limit=2";
    if (!token.empty()) path += "&continue=" + token;
    JsonAnswer page = client.get(path);
    ASSERT_EQ(page.status, 200) << page.text;
    EXPECT_EQ(page.body["kind"], "ConfigMapList");
    EXPECT_LE(page.body["items"].size(), 2u);
    for (const Json& item : page.body["items"]) names.push_back(item["metadata"]["name"]);
    token = page.body["metadata"].value("continue", "");
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d", "e"}));

  JsonAnswer bad = client.get(std::string(kConfigMaps) + "?continue=%21%21");
  EXPECT_EQ(bad.status, 400);
}

TEST(ApiServerTest, LabelAndFieldSelectorsFilterLists) {
  ApiServer server;
  ApiTestClient client(server);
  client.post(kConfigMaps, configMap("a", {{"tier", "web"}, {"env", "prod"}}));
  client.post(kConfigMaps, configMap("b", {{"tier", "db"}, {"env", "prod"}}));
  client.post(kConfigMaps, configMap("c", {{"tier", "cache"}}));
  client.post("/api/v1/namespaces/other/configmaps", configMap("d", {{"tier", "web"}}));
  auto names = [&](const std::string& query) {
    JsonAnswer answer = client.get(std::string(kConfigMaps) + "?" + query);
    std::vector<std::string> out;
    for (const Json& item : answer.body["items"]) out.push_back(item["metadata"]["name"]);
    return out;
  };
  using Names = std::vector<std::string>;
  EXPECT_EQ(names("labelSelector=tier%3Dweb"), Names{"a"});
  EXPECT_EQ(names("labelSelector=tier%3D%3Dweb"), Names{"a"});
  EXPECT_EQ(names("labelSelector=tier%21%3Dweb"), (Names{"b", "c"}));
  EXPECT_EQ(names("labelSelector=tier%20in%20(web,db)"), (Names{"a", "b"}));
  EXPECT_EQ(names("labelSelector=tier%20notin%20(web,db)"), Names{"c"});
  EXPECT_EQ(names("labelSelector=env"), (Names{"a", "b"}));
  EXPECT_EQ(names("labelSelector=%21env"), Names{"c"});
  EXPECT_EQ(names("labelSelector=env%3Dprod,tier%3Ddb"), Names{"b"});
  EXPECT_EQ(names("fieldSelector=metadata.name%3Dc"), Names{"c"});

  JsonAnswer all = client.get("/api/v1/configmaps?labelSelector=tier%3Dweb");
  ASSERT_EQ(all.status, 200);
  EXPECT_EQ(all.body["items"].size(), 2u) << "a list across namespaces";
  JsonAnswer by_namespace =
      client.get("/api/v1/configmaps?fieldSelector=metadata.namespace%3Dother");
  ASSERT_EQ(by_namespace.body["items"].size(), 1u);
  EXPECT_EQ(by_namespace.body["items"][0]["metadata"]["name"], "d");

  JsonAnswer bad = client.get(std::string(kConfigMaps) + "?fieldSelector=spec.foo%3Dx");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body["message"].get<std::string>().find("spec.foo"), std::string::npos);
}

TEST(ApiServerTest, PatchFormats) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  ASSERT_EQ(client.post(kPools, prefillPool("p")).status, 201);
  const std::string path = std::string(kPools) + "/p";

  JsonAnswer merged =
      client.patch(path, R"({"metadata":{"labels":{"a":"1"}},"spec":{"replicas":2}})",
                   "application/merge-patch+json");
  ASSERT_EQ(merged.status, 200) << merged.text;
  EXPECT_EQ(merged.body["spec"]["replicas"], 2);
  EXPECT_EQ(merged.body["metadata"]["labels"]["a"], "1");

  JsonAnswer json_patch =
      client.patch(path, R"([{"op":"replace","path":"/spec/replicas","value":6}])",
                   "application/json-patch+json");
  ASSERT_EQ(json_patch.status, 200) << json_patch.text;
  EXPECT_EQ(json_patch.body["spec"]["replicas"], 6);

  JsonAnswer strategic =
      client.patch(path, R"({"spec":{"replicas":1}})", "application/strategic-merge-patch+json");
  EXPECT_EQ(strategic.status, 415) << "custom kinds take no strategic merge patch";
  EXPECT_EQ(strategic.body["reason"], "UnsupportedMediaType");

  JsonAnswer no_manager =
      client.patch(path, "spec:\n  replicas: 3\n", "application/apply-patch+yaml");
  EXPECT_EQ(no_manager.status, 422);

  std::string applied =
      "apiVersion: tandem.dev/v1alpha1\nkind: PrefillPool\nmetadata:\n  name: q\n"
      "spec:\n  replicas: 3\n  model:\n    path: /models/q\n";
  JsonAnswer apply_create = client.patch(std::string(kPools) + "/q?fieldManager=test", applied,
                                         "application/apply-patch+yaml");
  ASSERT_EQ(apply_create.status, 201) << apply_create.text;
  EXPECT_EQ(apply_create.body["spec"]["replicas"], 3);
  JsonAnswer apply_update = client.patch(std::string(kPools) + "/q?fieldManager=test",
                                         applied.substr(0, applied.find("replicas: 3")) +
                                             "replicas: 4\n  model:\n    path: /models/q\n",
                                         "application/apply-patch+yaml");
  ASSERT_EQ(apply_update.status, 200) << apply_update.text;
  EXPECT_EQ(apply_update.body["spec"]["replicas"], 4);
  EXPECT_EQ(apply_update.body["metadata"]["generation"], 2);

  JsonAnswer status_patch =
      client.patch(path + "/status", R"({"status":{"readyReplicas":2},"spec":{"replicas":50}})",
                   "application/merge-patch+json");
  ASSERT_EQ(status_patch.status, 200) << status_patch.text;
  EXPECT_EQ(status_patch.body["status"]["readyReplicas"], 2);
  EXPECT_EQ(status_patch.body["spec"]["replicas"], 6);

  // Built-in kinds take strategic merge patches.
  ASSERT_EQ(client.post(kConfigMaps, configMap("cm")).status, 201);
  JsonAnswer builtin = client.patch(std::string(kConfigMaps) + "/cm", R"({"data":{"other":"x"}})",
                                    "application/strategic-merge-patch+json");
  ASSERT_EQ(builtin.status, 200) << builtin.text;
  EXPECT_EQ(builtin.body["data"], (Json{{"key", "value"}, {"other", "x"}}));
}

TEST(ApiServerTest, FieldValidationAndSchemaValidation) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  Json pool = prefillPool("p");
  pool["spec"]["foo"] = 1;
  JsonAnswer strict = client.post(std::string(kPools) + "?fieldValidation=Strict", pool);
  EXPECT_EQ(strict.status, 400);
  EXPECT_EQ(strict.body["message"],
            "PrefillPool in version \"v1alpha1\" cannot be handled as a PrefillPool: strict "
            "decoding error: unknown field \"spec.foo\"");

  JsonAnswer warned = client.post(std::string(kPools) + "?fieldValidation=Warn", pool);
  ASSERT_EQ(warned.status, 201) << warned.text;
  EXPECT_FALSE(warned.body["spec"].contains("foo")) << "unknown fields are pruned";
  EXPECT_NE(warned.header("Warning").find("unknown field \\\"spec.foo\\\""), std::string::npos)
      << warned.header("Warning");

  Json negative = prefillPool("n");
  negative["spec"]["replicas"] = -1;
  JsonAnswer invalid = client.post(kPools, negative);
  EXPECT_EQ(invalid.status, 422);
  EXPECT_EQ(invalid.body["reason"], "Invalid");
  EXPECT_NE(invalid.body["message"].get<std::string>().find("spec.replicas"), std::string::npos);

  // Patterns: strings (an int-or-string's too) must match, unanchored as
  // the server's MatchString; the message quotes the pattern.
  Json sized = prefillPool("s");
  sized["spec"]["model"] = {{"source", "hf://o/m"},
                            {"cache", {{"sizeLimit", "40 GB"}}},
                            {"tokenSecretRef", {{"name", "HF_Token"}, {"key", "..data"}}}};
  sized["spec"]["engine"] = {{"kvCacheMemory", "lots"}};
  JsonAnswer unmatched = client.post(kPools, sized);
  EXPECT_EQ(unmatched.status, 422) << unmatched.text;
  const std::string message = unmatched.body.value("message", "");
  for (const std::string& expected :
       {std::string("spec.model.cache.sizeLimit: Invalid value: \"40 GB\": "
                    "spec.model.cache.sizeLimit in body should match '^\\+?"),
        std::string("spec.model.tokenSecretRef.name: Invalid value: \"HF_Token\": "
                    "spec.model.tokenSecretRef.name in body should match '^[a-z0-9]"),
        std::string("spec.model.tokenSecretRef.key: Invalid value: \"..data\": "
                    "spec.model.tokenSecretRef.key in body should match"),
        std::string("spec.engine.kvCacheMemory: Invalid value: \"lots\": "
                    "spec.engine.kvCacheMemory in body should match '^[0-9]+")}) {
    EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
  }
  sized["spec"]["model"]["cache"]["sizeLimit"] = "40Gi";
  sized["spec"]["model"]["tokenSecretRef"] = {{"name", "hf-token"}, {"key", ".data"}};
  sized["spec"]["engine"]["kvCacheMemory"] = 8589934592;  // an integer: no pattern
  JsonAnswer matched = client.post(kPools, sized);
  EXPECT_EQ(matched.status, 201) << matched.text;

  Json no_model = prefillPool("m");
  no_model["spec"].erase("model");
  JsonAnswer required = client.post(kPools, no_model);
  EXPECT_EQ(required.status, 422);
  EXPECT_NE(required.body["message"].get<std::string>().find("spec.model: Required value"),
            std::string::npos)
      << required.text;
}

TEST(ApiServerTest, DeletingAnOwnerCollectsItsDependentsInCascade) {
  ApiServer server;
  ApiTestClient client(server);
  JsonAnswer owner = client.post(kConfigMaps, configMap("owner"));
  auto owned_by = [](const std::string& name, const Json& parent, const std::string& kind) {
    Json object = configMap(name);
    object["metadata"]["ownerReferences"] = Json::array({{{"apiVersion", "v1"},
                                                          {"kind", kind},
                                                          {"name", parent["metadata"]["name"]},
                                                          {"uid", parent["metadata"]["uid"]}}});
    return object;
  };
  JsonAnswer child = client.post(kConfigMaps, owned_by("child", owner.body, "ConfigMap"));
  JsonAnswer grandchild = client.post(kConfigMaps, owned_by("grandchild", child.body, "ConfigMap"));
  ASSERT_EQ(grandchild.status, 201);
  ASSERT_EQ(client.post(kConfigMaps, configMap("unrelated")).status, 201);

  WatchReader watch(server, std::string(kConfigMaps) + "?watch=1&resourceVersion=" +
                                std::to_string(server.resourceVersion()));
  ASSERT_EQ(client.del(std::string(kConfigMaps) + "/owner").status, 200);
  std::vector<Json> events = watch.waitForEvents(3);
  ASSERT_EQ(events.size(), 3u);
  std::set<std::string> deleted;
  for (const Json& event : events) {
    EXPECT_EQ(event["type"], "DELETED");
    deleted.insert(event["object"]["metadata"]["name"]);
  }
  EXPECT_EQ(deleted, (std::set<std::string>{"owner", "child", "grandchild"}));
  EXPECT_EQ(client.get(std::string(kConfigMaps) + "/grandchild").status, 404);
  EXPECT_EQ(client.get(std::string(kConfigMaps) + "/unrelated").status, 200);
}

TEST(ApiServerTest, OrphanPropagationKeepsDependents) {
  ApiServer server;
  ApiTestClient client(server);
  JsonAnswer owner = client.post(kConfigMaps, configMap("owner"));
  Json child = configMap("child");
  child["metadata"]["ownerReferences"] = Json::array({{{"apiVersion", "v1"},
                                                       {"kind", "ConfigMap"},
                                                       {"name", "owner"},
                                                       {"uid", owner.body["metadata"]["uid"]}}});
  ASSERT_EQ(client.post(kConfigMaps, child).status, 201);
  EXPECT_EQ(client.del(std::string(kConfigMaps) + "/owner?propagationPolicy=Orphan").status, 200);
  JsonAnswer kept = client.get(std::string(kConfigMaps) + "/child");
  ASSERT_EQ(kept.status, 200);
  EXPECT_FALSE(kept.body["metadata"].contains("ownerReferences"));
}

// ValidateSecurityContext's rule: no privileged container (nor one adding
// CAP_SYS_ADMIN) with allowPrivilegeEscalation false.
TEST(ApiServerTest, APrivilegedContainerCannotForbidEscalation) {
  ApiServer server;
  ApiTestClient client(server);
  auto deploymentWith = [](const Json& context) {
    return agentDeployment(
        {{"containers",
          Json::array({{{"name", "a"}, {"image", "x"}, {"securityContext", context}}})}});
  };
  const std::string path = "/apis/apps/v1/namespaces/default/deployments";
  JsonAnswer refused = client.post(
      path, deploymentWith({{"privileged", true}, {"allowPrivilegeEscalation", false}}));
  EXPECT_EQ(refused.status, 422) << refused.text;
  EXPECT_NE(refused.body.value("message", "")
                .find("spec.template.spec.containers[0].securityContext: Invalid value: "),
            std::string::npos)
      << refused.text;
  EXPECT_NE(refused.body.value("message", "")
                .find("cannot set `allowPrivilegeEscalation` to false and `privileged` to true"),
            std::string::npos)
      << refused.text;
  refused = client.post(path, deploymentWith({{"capabilities", {{"add", {"CAP_SYS_ADMIN"}}}},
                                              {"allowPrivilegeEscalation", false}}));
  EXPECT_EQ(refused.status, 422) << refused.text;
  EXPECT_NE(refused.body.value("message", "").find("`capabilities.Add` CAP_SYS_ADMIN"),
            std::string::npos)
      << refused.text;
  EXPECT_EQ(client.post(path, deploymentWith({{"privileged", true}})).status, 201);
}

TEST(ApiServerTest, DeploymentControllerMakesPodsAndStatus) {
  ApiServer server;
  server.setDeploymentControllerAuto(true);
  ApiTestClient client(server);
  Json deployment =
      agentDeployment({{"containers", Json::array({{{"name", "a"}, {"image", "x"}}})}});
  JsonAnswer created = client.post("/apis/apps/v1/namespaces/default/deployments", deployment);
  ASSERT_EQ(created.status, 201) << created.text;
  Json stored = server.get("apps/v1", "Deployment", "default", "agent").value();
  EXPECT_EQ(stored["status"]["readyReplicas"], 2);
  EXPECT_EQ(stored["status"]["observedGeneration"], 1);
  JsonAnswer pods = client.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dagent");
  ASSERT_EQ(pods.body["items"].size(), 2u);
  for (const Json& pod : pods.body["items"]) {
    EXPECT_EQ(pod["status"]["phase"], "Running");
    EXPECT_TRUE(pod["metadata"]["labels"].contains("pod-template-hash"));
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], stored["metadata"]["uid"]);
  }

  JsonAnswer scaled =
      client.patch("/apis/apps/v1/namespaces/default/deployments/agent",
                   R"({"spec":{"replicas":1}})", "application/strategic-merge-patch+json");
  ASSERT_EQ(scaled.status, 200) << scaled.text;
  EXPECT_EQ(server.list("v1", "Pod", "default").size(), 1u);
  EXPECT_EQ(server.get("apps/v1", "Deployment", "default", "agent")
                .value()["status"]["observedGeneration"],
            2);

  server.setDeploymentStatus("default", "agent", 1, 1, 0);
  Json manual = server.get("apps/v1", "Deployment", "default", "agent").value();
  EXPECT_EQ(manual["status"]["readyReplicas"], 0);

  ASSERT_EQ(client.del("/apis/apps/v1/namespaces/default/deployments/agent").status, 200);
  EXPECT_TRUE(server.list("v1", "Pod", "default").empty()) << "pods go with their Deployment";
}

TEST(ApiServerTest, BearerTokensAreCheckedAndCanBeRotated) {
  ApiServerOptions options;
  options.tokens = {"first"};
  ApiServer server(options);
  ApiTestClient anonymous(server);
  JsonAnswer denied = anonymous.get("/api/v1/namespaces/default/configmaps");
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(denied.body["reason"], "Unauthorized");
  ApiTestClient first(server, "first");
  EXPECT_EQ(first.post(kConfigMaps, configMap("a")).status, 201);
  EXPECT_EQ(server.writesBy("first"), 1u);

  server.setTokens({"second"});
  EXPECT_EQ(first.get(kConfigMaps).status, 401);
  ApiTestClient second(server, "second");
  EXPECT_EQ(second.get(kConfigMaps).status, 200);
  EXPECT_EQ(server.writesByUser(), (std::map<std::string, uint64_t>{{"first", 1}}));
  std::vector<std::string> log = server.requestLog();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "GET /api/v1/namespaces/default/configmaps second");
}

TEST(ApiServerTest, TlsWithTheTestCaAndClientCertificates) {
  ApiServerOptions options;
  options.tls = true;
  options.tokens = {"secret"};
  ApiServer server(options);
  EXPECT_EQ(server.url().rfind("https://127.0.0.1:", 0), 0u);
  TempDir dir("tandem-apiserver-tls");
  std::filesystem::path ca = dir.write("ca.crt", server.pki().ca_certificate);
  std::filesystem::path cert = dir.write("client.crt", server.pki().client_certificate);
  std::filesystem::path key = dir.write("client.key", server.pki().client_key);

  httplib::SSLClient verified("127.0.0.1", server.port());
  verified.set_ca_cert_path(ca.c_str());
  verified.enable_server_certificate_verification(true);
  auto version = verified.Get("/version");
  ASSERT_TRUE(version) << httplib::to_string(version.error());
  EXPECT_EQ(version->status, 200);
  EXPECT_EQ(Json::parse(version->body)["gitVersion"], "v1.32.0");
  auto anonymous = verified.Get("/api/v1/namespaces/default/configmaps");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);

  httplib::SSLClient with_cert("127.0.0.1", server.port(), cert.string(), key.string());
  with_cert.set_ca_cert_path(ca.c_str());
  with_cert.enable_server_certificate_verification(true);
  auto created = with_cert.Post(kConfigMaps, configMap("by-cert").dump(), "application/json");
  ASSERT_TRUE(created) << httplib::to_string(created.error());
  EXPECT_EQ(created->status, 201) << created->body;
  EXPECT_EQ(server.writesBy("test-client"), 1u);

  // A client that trusts other CAs only refuses the server.
  httplib::SSLClient untrusting("127.0.0.1", server.port());
  untrusting.enable_server_certificate_verification(true);
  untrusting.set_ca_cert_path(dir.write("empty.crt", "").c_str());
  EXPECT_FALSE(untrusting.Get("/version"));
}

TEST(ApiServerTest, DiscoveryListsKindsAndSubresources) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  JsonAnswer core = client.get("/api/v1");
  std::set<std::string> names;
  for (const Json& resource : core.body["resources"]) names.insert(resource["name"]);
  for (const char* name :
       {"pods", "pods/status", "services", "events", "secrets", "configmaps", "namespaces"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  JsonAnswer groups = client.get("/apis");
  std::set<std::string> group_names;
  for (const Json& group : groups.body["groups"]) group_names.insert(group["name"]);
  for (const char* name :
       {"apps", "discovery.k8s.io", "coordination.k8s.io", "apiextensions.k8s.io", "tandem.dev"}) {
    EXPECT_EQ(group_names.count(name), 1u) << name;
  }
  JsonAnswer tandem = client.get("/apis/tandem.dev/v1alpha1");
  ASSERT_EQ(tandem.status, 200);
  bool scale_found = false;
  for (const Json& resource : tandem.body["resources"]) {
    if (resource["name"] == "prefillpools/scale") {
      scale_found = true;
      EXPECT_EQ(resource["kind"], "Scale");
      EXPECT_EQ(resource["group"], "autoscaling");
      EXPECT_EQ(resource["version"], "v1");
    }
    if (resource["name"] == "prefillpools") {
      EXPECT_EQ(resource["shortNames"], Json::array({"ppool"}));
      EXPECT_EQ(resource["categories"], Json::array({"tandem"}));
    }
  }
  EXPECT_TRUE(scale_found);
  JsonAnswer aggregated = client.get(
      "/apis",
      "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json");
  EXPECT_EQ(aggregated.header("Content-Type"), "application/json");
  EXPECT_EQ(aggregated.body["kind"], "APIGroupList");
  EXPECT_EQ(client.get("/apis/nothing.example/v1").status, 404);
}

TEST(ApiServerTest, CrdsPostedAtRunTimeAreServed) {
  ApiServer server;
  ApiTestClient client(server);
  Json crd = {
      {"apiVersion", "apiextensions.k8s.io/v1"},
      {"kind", "CustomResourceDefinition"},
      {"metadata", {{"name", "widgets.example.com"}}},
      {"spec",
       {{"group", "example.com"},
        {"scope", "Namespaced"},
        {"names", {{"kind", "Widget"}, {"plural", "widgets"}}},
        {"versions", Json::array({{{"name", "v1"},
                                   {"served", true},
                                   {"storage", true},
                                   {"schema",
                                    {{"openAPIV3Schema",
                                      {{"type", "object"},
                                       {"x-kubernetes-preserve-unknown-fields", true}}}}}}})}}}};
  JsonAnswer created = client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
  ASSERT_EQ(created.status, 201) << created.text;
  bool established = false;
  for (const Json& condition : created.body["status"]["conditions"]) {
    established =
        established || (condition["type"] == "Established" && condition["status"] == "True");
  }
  EXPECT_TRUE(established);
  Json widget = {{"apiVersion", "example.com/v1"},
                 {"kind", "Widget"},
                 {"metadata", {{"name", "w"}}},
                 {"anything", {{"goes", 1}}}};
  JsonAnswer made = client.post("/apis/example.com/v1/namespaces/default/widgets", widget);
  ASSERT_EQ(made.status, 201) << made.text;
  EXPECT_EQ(made.body["anything"]["goes"], 1);
  ASSERT_EQ(
      client.del("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
          .status,
      200);
  EXPECT_EQ(client.get("/apis/example.com/v1/namespaces/default/widgets/w").status, 404);
  EXPECT_TRUE(server.list("example.com/v1", "Widget", "default").empty());

  // A pattern that is not a regular expression refuses the CRD.
  crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
      {"type", "object"},
      {"properties", {{"size", {{"type", "string"}, {"pattern", "^([0-9]+$"}}}}}};
  JsonAnswer refused = client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
  EXPECT_EQ(refused.status, 422) << refused.text;
  EXPECT_NE(refused.body.value("message", "")
                .find("spec.versions[0].schema.openAPIV3Schema.properties[size].pattern: Invalid "
                      "value: \"^([0-9]+$\": must be a valid regular expression"),
            std::string::npos)
      << refused.text;
}

TEST(ApiServerTest, TablesForGetAndList) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  ASSERT_EQ(client.post(kPools, prefillPool("p")).status, 201);
  const std::string accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
  JsonAnswer list = client.get(kPools, accept);
  ASSERT_EQ(list.status, 200) << list.text;
  EXPECT_EQ(list.body["kind"], "Table");
  EXPECT_EQ(list.body["rows"].size(), 1u);
  EXPECT_FALSE(list.body["metadata"]["resourceVersion"].get<std::string>().empty());
  JsonAnswer one = client.get(std::string(kPools) + "/p", accept);
  EXPECT_EQ(one.body["kind"], "Table");
}

TEST(ApiServerTest, StalledServerAnswersOnlyAfterResuming) {
  ApiServer server;
  ApiTestClient client(server);
  server.setStalled(true);
  httplib::Client impatient("127.0.0.1", server.port());
  impatient.set_read_timeout(std::chrono::milliseconds(300));
  EXPECT_FALSE(impatient.Get("/version")) << "no answer while stalled";
  EXPECT_EQ(server.requestLog(), std::vector<std::string>{"GET /version anonymous"})
      << "a stalled request is still seen";
  server.setStalled(false);
  EXPECT_EQ(client.get("/version").status, 200);
}

TEST(ApiServerTest, PutFiresEventsWithoutCountingAsAWrite) {
  ApiServer server;
  WatchReader watch(server, std::string(kConfigMaps) + "?watch=true");
  Json stored = server.put(Json{{"apiVersion", "v1"},
                                {"kind", "ConfigMap"},
                                {"metadata", {{"name", "direct"}, {"namespace", "default"}}}});
  EXPECT_EQ(rvOf(stored), std::to_string(server.resourceVersion()));
  std::vector<Json> events = watch.waitForEvents(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "ADDED");
  EXPECT_EQ(events[0]["object"]["metadata"]["name"], "direct");
  EXPECT_TRUE(server.writesByUser().empty());
  server.remove("v1", "ConfigMap", "default", "direct");
  EXPECT_FALSE(server.get("v1", "ConfigMap", "default", "direct").has_value());
  events = watch.waitForEvents(2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["type"], "DELETED");
}

TEST(ApiServerTest, InjectedConflictsHitTheNamedKindOnly) {
  ApiServer server;
  server.registerCrds(crdDirectory());
  ApiTestClient client(server);
  ASSERT_EQ(client.post(kPools, prefillPool("p")).status, 201);
  ASSERT_EQ(client.post(kConfigMaps, configMap("c")).status, 201);
  server.injectConflicts(1, "PrefillPool");
  EXPECT_EQ(client
                .patch(std::string(kConfigMaps) + "/c", R"({"data":{"k":"v"}})",
                       "application/merge-patch+json")
                .status,
            200);
  EXPECT_EQ(client
                .patch(std::string(kPools) + "/p", R"({"spec":{"replicas":2}})",
                       "application/merge-patch+json")
                .status,
            409);
  EXPECT_EQ(client
                .patch(std::string(kPools) + "/p", R"({"spec":{"replicas":2}})",
                       "application/merge-patch+json")
                .status,
            200);
}

}  // namespace
}  // namespace tandem::testing
