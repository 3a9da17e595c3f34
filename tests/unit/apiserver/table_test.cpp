// Server-side printing of the test API server: the JSONPath subset of
// printer columns, ages as kubectl shows them, a CRD's additionalPrinterColumns
// (read from crds/prefillpools.tandem.dev.yaml) and built-in kinds' rows.
#include "tests/support/apiserver/table.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/support/apiserver/yaml_json.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

KindInfo prefillPoolKind() {
  auto file = std::filesystem::path(TANDEM_SOURCE_DIR) / "crds" / "prefillpools.tandem.dev.yaml";
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json crd = yamlToJson(text);
  const json& spec = crd["spec"];
  const json& version = spec["versions"][0];
  KindInfo kind;
  kind.group = spec["group"];
  kind.version = version["name"];
  kind.kind = spec["names"]["kind"];
  kind.list_kind = spec["names"]["listKind"];
  kind.plural = spec["names"]["plural"];
  kind.printer_columns = version["additionalPrinterColumns"];
  return kind;
}

json pool() {
  return json::parse(R"({
    "apiVersion":"tandem.dev/v1alpha1","kind":"PrefillPool",
    "metadata":{"name":"p1","namespace":"default","resourceVersion":"7",
                "creationTimestamp":"2001-02-03T04:05:06Z"},
    "spec":{"replicas":3,"model":{"path":"/models/llama"},"kvTransfer":{"connector":"ucx"}},
    "status":{"replicas":3,"readyReplicas":2,"updatedReplicas":3,"conditions":[
      {"type":"Progressing","status":"False"},
      {"type":"Ready","status":"True"},
      {"type":"Available","status":"True"},
      {"type":"Degraded","status":"False"}]}})");
}

// --- humanDuration -----------------------------------------------------------

TEST(HumanDurationTest, MatchesKubectlAges) {
  const std::pair<int64_t, const char*> cases[] = {{-5, "<invalid>"},
                                                   {-1, "0s"},
                                                   {0, "0s"},
                                                   {119, "119s"},
                                                   {120, "2m"},
                                                   {150, "2m30s"},
                                                   {599, "9m59s"},
                                                   {600, "10m"},
                                                   {179 * 60, "179m"},
                                                   {3 * 3600, "3h"},
                                                   {3 * 3600 + 60, "3h1m"},
                                                   {8 * 3600, "8h"},
                                                   {47 * 3600, "47h"},
                                                   {48 * 3600, "2d"},
                                                   {50 * 3600, "2d2h"},
                                                   {8 * 86400, "8d"},
                                                   {729 * 86400, "729d"},
                                                   {730 * 86400, "2y"},
                                                   {731 * 86400, "2y1d"},
                                                   {9 * 365 * 86400, "9y"}};
  for (const auto& [seconds, expected] : cases) {
    EXPECT_EQ(humanDuration(seconds), expected) << seconds << " seconds";
  }
}

// --- evalJsonPath -----------------------------------------------------------

TEST(JsonPathTest, FieldsIndexesAndWildcards) {
  json object = pool();
  EXPECT_EQ(evalJsonPath(object, ".spec.replicas"), json(3));
  EXPECT_EQ(evalJsonPath(object, "{.spec.model.path}"), json("/models/llama"));
  EXPECT_EQ(evalJsonPath(object, "$.spec.replicas"), json(3));
  EXPECT_EQ(evalJsonPath(object, ".status.conditions[1].type"), json("Ready"));
  EXPECT_EQ(evalJsonPath(object, ".status.conditions[-1].type"), json("Degraded"));
  EXPECT_EQ(evalJsonPath(object, ".status.conditions[*].status"), json("False"));
  EXPECT_EQ(evalJsonPath(object, ".status.conditions[5].type"), std::nullopt);
  EXPECT_EQ(evalJsonPath(object, ".spec.missing"), std::nullopt);
  EXPECT_EQ(evalJsonPath(object, ".spec.replicas.deeper"), std::nullopt);
  EXPECT_EQ(evalJsonPath(object, ".status.conditions[x]"), std::nullopt);
}

TEST(JsonPathTest, Filters) {
  json object = pool();
  EXPECT_EQ(evalJsonPath(object, R"(.status.conditions[?(@.type=="Available")].status)"),
            json("True"));
  EXPECT_EQ(evalJsonPath(object, R"(.status.conditions[?(@.type=='Degraded')].status)"),
            json("False"));
  EXPECT_EQ(evalJsonPath(object, R"(.status.conditions[?(@.type==Ready)].status)"), json("True"));
  EXPECT_EQ(evalJsonPath(object, R"(.status.conditions[?(@.type!="Progressing")].type)"),
            json("Ready"));
  EXPECT_EQ(evalJsonPath(object, R"(.status.conditions[?(@.type=="Nope")].status)"), std::nullopt);
  json ports = json::parse(R"({"ports":[{"port":80,"name":"http"},{"port":443,"name":"https"}]})");
  EXPECT_EQ(evalJsonPath(ports, R"(.ports[?(@.port==443)].name)"), json("https"));
  EXPECT_EQ(evalJsonPath(ports, R"(.ports[?(@.port>100)].name)"), json("https"));
  EXPECT_EQ(evalJsonPath(ports, R"(.ports[?(@.name)].port)"), json(80));
}

TEST(JsonPathTest, QuotedKeys) {
  json object = json::parse(R"({"metadata":{"labels":{"app.kubernetes.io/name":"tandem"}}})");
  EXPECT_EQ(evalJsonPath(object, ".metadata.labels['app.kubernetes.io/name']"), json("tandem"));
  EXPECT_EQ(evalJsonPath(object, R"(.metadata.labels["app.kubernetes.io/name"])"), json("tandem"));
}

// --- toTable -----------------------------------------------------------------

TEST(TableTest, CrdColumnsFromAdditionalPrinterColumns) {
  KindInfo kind = prefillPoolKind();
  ASSERT_TRUE(kind.printer_columns.is_array());
  ASSERT_FALSE(kind.printer_columns.empty());
  json object = pool();
  object["status"]["servedModel"] = "llama";
  object["status"]["modelSource"] = "/models/llama";
  object["status"]["conditions"].push_back({{"type", "ModelReady"}, {"status", "True"}});
  json table = toTable(object, kind, "Metadata");

  EXPECT_EQ(table["kind"], "Table");
  EXPECT_EQ(table["apiVersion"], "meta.k8s.io/v1");
  EXPECT_EQ(table["metadata"]["resourceVersion"], "7");
  const json& columns = table["columnDefinitions"];
  ASSERT_EQ(columns.size(), kind.printer_columns.size() + 1);
  EXPECT_EQ(columns[0]["name"], "Name");
  EXPECT_EQ(columns[0]["format"], "name");
  ASSERT_EQ(table["rows"].size(), 1u);
  const json& cells = table["rows"][0]["cells"];
  ASSERT_EQ(cells.size(), columns.size());
  EXPECT_EQ(cells[0], "p1");

  bool saw_filter = false;
  for (size_t i = 0; i < kind.printer_columns.size(); ++i) {
    const json& declared = kind.printer_columns[i];
    const json& column = columns[i + 1];
    const json& cell = cells[i + 1];
    std::string type = declared.value("type", "string");
    std::string path = declared["jsonPath"];
    EXPECT_EQ(column["name"], declared["name"]);
    EXPECT_EQ(column["type"], type);
    EXPECT_EQ(column["priority"], declared.value("priority", 0));
    auto value = evalJsonPath(object, path);
    SCOPED_TRACE(path);
    if (type == "date") {
      EXPECT_TRUE(std::regex_match(cell.get<std::string>(), std::regex("[0-9]+y"))) << cell;
    } else if (!value) {
      EXPECT_TRUE(cell.is_null()) << cell;
    } else if (type == "integer") {
      EXPECT_EQ(cell, *value);
    } else if (type == "string") {
      EXPECT_EQ(cell, value->is_string() ? *value : json(value->dump()));
    }
    if (path.find("[?(") != std::string::npos) {
      saw_filter = true;
      EXPECT_TRUE(cell.is_string()) << "a condition column reads the condition's status";
    }
  }
  EXPECT_TRUE(saw_filter) << "the CRD declares a condition column";

  json row_object = table["rows"][0]["object"];
  EXPECT_EQ(row_object["kind"], "PartialObjectMetadata");
  EXPECT_EQ(row_object["apiVersion"], "meta.k8s.io/v1");
  EXPECT_EQ(row_object["metadata"], object["metadata"]);
  EXPECT_FALSE(row_object.contains("spec"));
}

TEST(TableTest, FixedColumnsAbsentValuesAndIncludeObject) {
  KindInfo kind;
  kind.group = "tandem.dev";
  kind.version = "v1alpha1";
  kind.kind = "PrefillPool";
  kind.printer_columns = json::parse(R"([
    {"name":"Desired","type":"integer","jsonPath":".spec.replicas"},
    {"name":"Ready","type":"integer","jsonPath":".status.readyReplicas","priority":1},
    {"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"},
    {"name":"Model","type":"string","jsonPath":".spec.model.path","description":"model dir"},
    {"name":"Replicas","type":"string","jsonPath":".spec.replicas"}])");
  json with_status = pool();
  json without_status = pool();
  without_status["metadata"]["name"] = "p2";
  without_status.erase("status");
  json list = {{"apiVersion", "tandem.dev/v1alpha1"},
               {"kind", "PrefillPoolList"},
               {"metadata", {{"resourceVersion", "42"}, {"continue", "token"}}},
               {"items", {with_status, without_status}}};

  json table = toTable(list, kind, "Object");
  EXPECT_EQ(table["metadata"], json::parse(R"({"resourceVersion":"42","continue":"token"})"));
  EXPECT_EQ(table["columnDefinitions"][2]["priority"], 1);
  EXPECT_EQ(table["columnDefinitions"][4]["description"], "model dir");
  ASSERT_EQ(table["rows"].size(), 2u);
  EXPECT_EQ(table["rows"][0]["cells"], json::parse(R"(["p1",3,2,"True","/models/llama","3"])"));
  EXPECT_EQ(table["rows"][1]["cells"], json::parse(R"(["p2",3,null,null,"/models/llama","3"])"));
  EXPECT_EQ(table["rows"][1]["object"], without_status);

  EXPECT_TRUE(toTable(with_status, kind, "None")["rows"][0]["object"].is_null());
}

TEST(TableTest, CrdWithoutPrinterColumnsGetsAge) {
  KindInfo kind;
  kind.kind = "Thing";
  json table = toTable(pool(), kind, "Metadata");
  ASSERT_EQ(table["columnDefinitions"].size(), 2u);
  EXPECT_EQ(table["columnDefinitions"][1]["name"], "Age");
  EXPECT_TRUE(
      std::regex_match(table["rows"][0]["cells"][1].get<std::string>(), std::regex("[0-9]+y")));
}

TEST(TableTest, BuiltinDeploymentRow) {
  KindInfo kind;
  kind.group = "apps";
  kind.version = "v1";
  kind.kind = "Deployment";
  kind.builtin = true;
  json deployment = json::parse(R"({"apiVersion":"apps/v1","kind":"Deployment",
    "metadata":{"name":"web","namespace":"default","creationTimestamp":"2001-01-01T00:00:00Z"},
    "spec":{"replicas":3,"selector":{"matchLabels":{"app":"web"}},
            "template":{"spec":{"containers":[{"name":"a","image":"a:1"},{"name":"b","image":"b:2"}]}}},
    "status":{"replicas":3,"readyReplicas":2,"updatedReplicas":3,"availableReplicas":1}})");
  json table = toTable(deployment, kind, "Metadata");
  std::vector<std::string> names;
  for (const auto& column : table["columnDefinitions"]) names.push_back(column["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"Name", "Ready", "Up-to-date", "Available", "Age",
                                             "Containers", "Images", "Selector"}));
  json cells = table["rows"][0]["cells"];
  ASSERT_EQ(cells.size(), 8u);
  EXPECT_EQ(cells[0], "web");
  EXPECT_EQ(cells[1], "2/3");
  EXPECT_EQ(cells[2], 3);
  EXPECT_EQ(cells[3], 1);
  EXPECT_TRUE(std::regex_match(cells[4].get<std::string>(), std::regex("[0-9]+y")));
  EXPECT_EQ(cells[5], "a,b");
  EXPECT_EQ(cells[6], "a:1,b:2");
  EXPECT_EQ(cells[7], "app=web");
  for (size_t i = 5; i < 8; ++i) EXPECT_EQ(table["columnDefinitions"][i]["priority"], 1);

  // No status yet: nothing ready.
  deployment.erase("status");
  cells = toTable(deployment, kind, "Metadata")["rows"][0]["cells"];
  EXPECT_EQ(cells[1], "0/3");
  EXPECT_EQ(cells[2], 0);
}

TEST(TableTest, BuiltinServiceAndEndpointSliceRows) {
  KindInfo service_kind;
  service_kind.version = "v1";
  service_kind.kind = "Service";
  service_kind.builtin = true;
  json service = json::parse(R"({"metadata":{"name":"svc"},"spec":{"type":"ClusterIP",
      "clusterIP":"10.0.0.1","ports":[{"port":80},{"port":443,"protocol":"UDP"}]}})");
  json cells = toTable(service, service_kind, "Metadata")["rows"][0]["cells"];
  EXPECT_EQ(cells[0], "svc");
  EXPECT_EQ(cells[1], "ClusterIP");
  EXPECT_EQ(cells[2], "10.0.0.1");
  EXPECT_EQ(cells[3], "<none>");
  EXPECT_EQ(cells[4], "80/TCP,443/UDP");

  KindInfo slice_kind;
  slice_kind.group = "discovery.k8s.io";
  slice_kind.version = "v1";
  slice_kind.kind = "EndpointSlice";
  slice_kind.builtin = true;
  json slice = json::parse(R"({"metadata":{"name":"s"},"addressType":"IPv4",
      "ports":[{"port":8000}],"endpoints":[{"addresses":["10.0.0.1"]},{"addresses":["10.0.0.2"]},
      {"addresses":["10.0.0.3"]},{"addresses":["10.0.0.4"]}]})");
  cells = toTable(slice, slice_kind, "Metadata")["rows"][0]["cells"];
  EXPECT_EQ(cells[1], "IPv4");
  EXPECT_EQ(cells[2], "8000");
  EXPECT_EQ(cells[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...");
}

}  // namespace
}  // namespace tandem::testing
