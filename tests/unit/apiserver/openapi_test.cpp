// OpenAPI documents of the test API server, as kubectl 1.32 reads them: the
// v3 index of group-versions, one document per group-version with the kinds'
// schemas and the fieldValidation parameter kubectl looks for, and the v2
// answers.
#include "tests/support/apiserver/openapi.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::testing {
namespace {

using nlohmann::json;

std::vector<KindInfo> kinds() {
  KindInfo pool;
  pool.group = "tandem.dev";
  pool.version = "v1alpha1";
  pool.kind = "PrefillPool";
  pool.list_kind = "PrefillPoolList";
  pool.plural = "prefillpools";
  pool.has_status = true;
  pool.scale = {{"specReplicasPath", ".spec.replicas"}, {"statusReplicasPath", ".status.replicas"}};
  pool.schema = json::parse(R"({"type":"object","properties":{
      "metadata":{"type":"object"},
      "spec":{"type":"object","properties":{"replicas":{"type":"integer",
        "description":"Number of agents."}}}}})");
  KindInfo deployment;
  deployment.group = "apps";
  deployment.version = "v1";
  deployment.kind = "Deployment";
  deployment.list_kind = "DeploymentList";
  deployment.plural = "deployments";
  deployment.builtin = true;
  KindInfo ns;
  ns.version = "v1";
  ns.kind = "Namespace";
  ns.list_kind = "NamespaceList";
  ns.plural = "namespaces";
  ns.namespaced = false;
  ns.builtin = true;
  return {pool, deployment, ns};
}

json bodyOf(const std::optional<HttpAnswer>& answer) {
  EXPECT_TRUE(answer.has_value());
  if (!answer) return nullptr;
  EXPECT_EQ(answer->status, 200) << answer->body;
  EXPECT_EQ(answer->content_type, "application/json");
  return json::parse(answer->body);
}

bool hasQueryParameter(const json& operation, const std::string& name) {
  for (const auto& parameter : operation.value("parameters", json::array())) {
    if (parameter.value("name", "") == name && parameter.value("in", "") == "query") return true;
  }
  return false;
}

TEST(OpenApiTest, IndexListsEveryGroupVersionWithHashedUrl) {
  json index = bodyOf(openApiAnswer("/openapi/v3", "application/json", kinds()));
  const json& paths = index["paths"];
  ASSERT_EQ(paths.size(), 3u) << index;
  for (const char* group_version : {"api/v1", "apis/apps/v1", "apis/tandem.dev/v1alpha1"}) {
    ASSERT_TRUE(paths.contains(group_version)) << group_version;
    std::string url = paths[group_version]["serverRelativeURL"];
    EXPECT_EQ(url.rfind(std::string("/openapi/v3/") + group_version + "?hash=", 0), 0u) << url;
  }
  // The same kinds give the same hashes; a changed schema a different one.
  EXPECT_EQ(bodyOf(openApiAnswer("/openapi/v3/", "", kinds())), index);
  auto changed = kinds();
  changed[0].schema["properties"]["spec"]["properties"]["image"] = {{"type", "string"}};
  json changed_index = bodyOf(openApiAnswer("/openapi/v3", "", changed));
  EXPECT_NE(changed_index["paths"]["apis/tandem.dev/v1alpha1"],
            index["paths"]["apis/tandem.dev/v1alpha1"]);
  EXPECT_EQ(changed_index["paths"]["apis/apps/v1"], index["paths"]["apis/apps/v1"]);
}

TEST(OpenApiTest, CrdDocumentHasSchemaAndFieldValidation) {
  json doc =
      bodyOf(openApiAnswer("/openapi/v3/apis/tandem.dev/v1alpha1", "application/json", kinds()));
  EXPECT_EQ(doc["openapi"], "3.0.0");
  const json& schemas = doc["components"]["schemas"];
  ASSERT_TRUE(schemas.contains("dev.tandem.v1alpha1.PrefillPool")) << schemas.dump();
  const json& schema = schemas["dev.tandem.v1alpha1.PrefillPool"];
  EXPECT_EQ(schema["x-kubernetes-group-version-kind"],
            json::parse(R"([{"group":"tandem.dev","version":"v1alpha1","kind":"PrefillPool"}])"));
  EXPECT_EQ(schema["properties"]["spec"]["properties"]["replicas"]["description"],
            "Number of agents.");
  EXPECT_EQ(schema["properties"]["metadata"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta");
  EXPECT_TRUE(schemas.contains("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
  EXPECT_TRUE(schemas.contains("dev.tandem.v1alpha1.PrefillPoolList"));

  const json& paths = doc["paths"];
  const std::string item = "/apis/tandem.dev/v1alpha1/namespaces/{namespace}/prefillpools/{name}";
  const std::string collection = "/apis/tandem.dev/v1alpha1/namespaces/{namespace}/prefillpools";
  ASSERT_TRUE(paths.contains(item));
  ASSERT_TRUE(paths.contains(collection));
  ASSERT_TRUE(paths.contains(item + "/status"));
  ASSERT_TRUE(paths.contains(item + "/scale"));
  ASSERT_TRUE(paths.contains("/apis/tandem.dev/v1alpha1/prefillpools"));
  for (const char* method : {"get", "put", "patch", "delete"}) {
    EXPECT_TRUE(paths[item].contains(method)) << method;
  }
  const json& patch = paths[item]["patch"];
  EXPECT_TRUE(hasQueryParameter(patch, "fieldValidation"));
  EXPECT_TRUE(hasQueryParameter(paths[collection]["post"], "fieldValidation"));
  EXPECT_TRUE(hasQueryParameter(paths[item]["put"], "fieldValidation"));
  EXPECT_EQ(patch["x-kubernetes-group-version-kind"],
            json::parse(R"({"group":"tandem.dev","version":"v1alpha1","kind":"PrefillPool"})"));
  EXPECT_EQ(patch["x-kubernetes-action"], "patch");
  const json& content = patch["requestBody"]["content"];
  EXPECT_TRUE(content.contains("application/merge-patch+json"));
  EXPECT_TRUE(content.contains("application/json-patch+json"));
  EXPECT_TRUE(content.contains("application/apply-patch+yaml"));
  EXPECT_FALSE(content.contains("application/strategic-merge-patch+json"));
  EXPECT_EQ(paths[item + "/scale"]["patch"]["x-kubernetes-group-version-kind"]["kind"], "Scale");
}

TEST(OpenApiTest, BuiltinDocumentsArePermissive) {
  json apps = bodyOf(openApiAnswer("/openapi/v3/apis/apps/v1", "application/json", kinds()));
  const json& schema = apps["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
  EXPECT_EQ(schema["x-kubernetes-preserve-unknown-fields"], true);
  EXPECT_EQ(schema["x-kubernetes-group-version-kind"][0]["kind"], "Deployment");
  EXPECT_TRUE(hasQueryParameter(
      apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"],
      "fieldValidation"));

  json core = bodyOf(openApiAnswer("/openapi/v3/api/v1", "application/json", kinds()));
  EXPECT_TRUE(core["components"]["schemas"].contains("io.k8s.api.core.v1.Namespace"));
  // Cluster-scoped: no namespace in the path.
  EXPECT_TRUE(core["paths"].contains("/api/v1/namespaces/{name}"));
  EXPECT_FALSE(core["paths"]["/api/v1/namespaces/{name}"].contains("status"));
}

TEST(OpenApiTest, OtherPaths) {
  EXPECT_FALSE(openApiAnswer("/apis/apps/v1", "application/json", kinds()).has_value());
  EXPECT_FALSE(openApiAnswer("/openapi/v3x", "application/json", kinds()).has_value());

  auto missing = openApiAnswer("/openapi/v3/apis/nope/v1", "application/json", kinds());
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["reason"], "NotFound");

  // kubectl asks for protobuf only; the JSON document is for clients that accept it.
  auto protobuf = openApiAnswer(
      "/openapi/v2", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf", kinds());
  ASSERT_TRUE(protobuf.has_value());
  EXPECT_EQ(protobuf->status, 406);
  EXPECT_EQ(json::parse(protobuf->body)["reason"], "NotAcceptable");
  auto old_path = openApiAnswer("/swagger-2.0.0.pb-v1", "", kinds());
  ASSERT_TRUE(old_path.has_value());
  EXPECT_EQ(old_path->status, 404);

  json v2 = bodyOf(openApiAnswer("/openapi/v2", "application/json", kinds()));
  EXPECT_EQ(v2["swagger"], "2.0");
  EXPECT_TRUE(v2["definitions"].contains("dev.tandem.v1alpha1.PrefillPool"));
  EXPECT_TRUE(v2["definitions"].contains("io.k8s.api.apps.v1.Deployment"));
  EXPECT_EQ(v2["definitions"]["dev.tandem.v1alpha1.PrefillPool"]["properties"]["metadata"]["allOf"]
              [0]["$ref"],
            "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta");
  EXPECT_TRUE(hasQueryParameter(
      v2["paths"]["/apis/tandem.dev/v1alpha1/namespaces/{namespace}/prefillpools/{name}"]["patch"],
      "fieldValidation"));
}

}  // namespace
}  // namespace tandem::testing
