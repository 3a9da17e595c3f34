// Patch formats of the test API server: RFC 7386 merge patch (the RFC's
// appendix examples), RFC 6902 JSON patch (every op, pointer escapes, the
// errors), strategic merge patch with the Kubernetes merge keys and
// directives, and server-side apply by one field manager.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/apiserver/json_patch.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

// The message of the PatchError `body` throws, or "" when it throws none.
template <typename Body>
std::string patchErrorOf(Body body) {
  try {
    body();
  } catch (const PatchError& error) {
    return error.what();
  }
  return "";
}

// --- RFC 7386 -------------------------------------------------------------

TEST(MergePatchTest, RfcAppendixExamples) {
  struct Case {
    const char* target;
    const char* patch;
    const char* result;
  };
  const Case cases[] = {
      {R"({"a":"b"})", R"({"a":"c"})", R"({"a":"c"})"},
      {R"({"a":"b"})", R"({"b":"c"})", R"({"a":"b","b":"c"})"},
      {R"({"a":"b"})", R"({"a":null})", R"({})"},
      {R"({"a":"b","b":"c"})", R"({"a":null})", R"({"b":"c"})"},
      {R"({"a":["b"]})", R"({"a":"c"})", R"({"a":"c"})"},
      {R"({"a":"c"})", R"({"a":["b"]})", R"({"a":["b"]})"},
      {R"({"a":{"b":"c"}})", R"({"a":{"b":"d","c":null}})", R"({"a":{"b":"d"}})"},
      {R"({"a":[{"b":"c"}]})", R"({"a":[1]})", R"({"a":[1]})"},
      {R"(["a","b"])", R"(["c","d"])", R"(["c","d"])"},
      {R"({"a":"b"})", R"(["c"])", R"(["c"])"},
      {R"({"a":"foo"})", "null", "null"},
      {R"({"a":"foo"})", R"("bar")", R"("bar")"},
      {R"({"e":null})", R"({"a":1})", R"({"e":null,"a":1})"},
      {R"([1,2])", R"({"a":"b","c":null})", R"({"a":"b"})"},
      {R"({})", R"({"a":{"bb":{"ccc":null}}})", R"({"a":{"bb":{}}})"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(jsonMergePatch(json::parse(c.target), json::parse(c.patch)), json::parse(c.result))
        << "target " << c.target << " patch " << c.patch;
  }
}

// --- RFC 6902 -------------------------------------------------------------

TEST(JsonPatchTest, AddReplaceRemove) {
  json doc = {{"foo", "bar"}, {"list", {1, 2}}};
  json ops = json::parse(R"([
    {"op":"add","path":"/baz","value":"qux"},
    {"op":"add","path":"/list/1","value":9},
    {"op":"add","path":"/list/-","value":7},
    {"op":"replace","path":"/foo","value":{"x":1}},
    {"op":"remove","path":"/list/0"}
  ])");
  EXPECT_EQ(jsonPatch(doc, ops), json::parse(R"({"foo":{"x":1},"baz":"qux","list":[9,2,7]})"));
}

TEST(JsonPatchTest, MoveCopyAndTest) {
  json doc = json::parse(R"({"a":{"b":1,"c":[1,2,3]},"d":{}})");
  json ops = json::parse(R"([
    {"op":"test","path":"/a/b","value":1},
    {"op":"move","from":"/a/b","path":"/d/b"},
    {"op":"copy","from":"/a/c","path":"/e"},
    {"op":"move","from":"/a/c/0","path":"/a/c/-"}
  ])");
  EXPECT_EQ(jsonPatch(doc, ops), json::parse(R"({"a":{"c":[2,3,1]},"d":{"b":1},"e":[1,2,3]})"));
}

TEST(JsonPatchTest, PointerEscapes) {
  json doc = json::parse(R"({"a/b":1,"m~n":2})");
  json ops = json::parse(R"([
    {"op":"replace","path":"/a~1b","value":10},
    {"op":"remove","path":"/m~0n"},
    {"op":"add","path":"/~01","value":3}
  ])");
  EXPECT_EQ(jsonPatch(doc, ops), json::parse(R"({"a/b":10,"~1":3})"));
}

TEST(JsonPatchTest, WholeDocumentReplacedByAddAtRoot) {
  EXPECT_EQ(
      jsonPatch(json::parse(R"({"a":1})"), json::parse(R"([{"op":"add","path":"","value":[1]}])")),
      json::parse("[1]"));
}

TEST(JsonPatchTest, FailedTestNamesPathAndValues) {
  std::string error = patchErrorOf([] {
    jsonPatch(json::parse(R"({"a":"x"})"),
              json::parse(R"([{"op":"test","path":"/a","value":"y"}])"));
  });
  EXPECT_NE(error.find("operation 0 (test) failed"), std::string::npos) << error;
  EXPECT_NE(error.find("/a is \"x\", not \"y\""), std::string::npos) << error;
}

TEST(JsonPatchTest, ErrorsNameTheOperationAndWhatIsAccepted) {
  struct Case {
    const char* ops;
    const char* message_part;
  };
  const Case cases[] = {
      {R"({"op":"add"})", "must be a list of operations"},
      {R"([{"path":"/a"}])", "operation 0 has no \"op\""},
      {R"([{"op":"frob","path":"/a"}])",
       "unknown op; accepted: add, remove, replace, move, copy, test"},
      {R"([{"op":"add","path":"a","value":1}])", "must be empty or start with '/'"},
      {R"([{"op":"add","path":"/a~2","value":1}])", "only escapes are ~0 and ~1"},
      {R"([{"op":"add","path":"/x/y","value":1}])", "/x does not exist"},
      {R"([{"op":"remove","path":"/missing"}])", "/missing does not exist"},
      {R"([{"op":"replace","path":"/missing","value":1}])", "/missing does not exist"},
      {R"([{"op":"add","path":"/l/5","value":1}])", "not a valid insertion index (0 to 2"},
      {R"([{"op":"add","path":"/l/01","value":1}])", "not a valid insertion index"},
      {R"([{"op":"remove","path":"/l/2"}])", "not an index of the 2-element array"},
      {R"([{"op":"add","path":"/a"}])", "has no \"value\""},
      {R"([{"op":"move","path":"/a/b"}])", "has no \"from\""},
      {R"([{"op":"move","from":"/a","path":"/a/b"}])", "into its own child"},
      {R"([{"op":"add","path":"/a/b","value":1}])", "/a is a number"},
      {R"([{"op":"replace","path":"/a","value":1},{"op":"remove","path":"/zz"}])",
       "operation 1 (remove)"},
  };
  for (const Case& c : cases) {
    json doc = json::parse(R"({"a":1,"l":[1,2]})");
    std::string error = patchErrorOf([&] { jsonPatch(doc, json::parse(c.ops)); });
    EXPECT_NE(error.find(c.message_part), std::string::npos)
        << "ops " << c.ops << " gave \"" << error << "\"";
  }
}

// --- Strategic merge patch -------------------------------------------------

json deployment() {
  return json::parse(R"({
    "apiVersion":"apps/v1","kind":"Deployment",
    "metadata":{"name":"web","labels":{"app":"web"},"finalizers":["a"]},
    "spec":{"replicas":1,"template":{"spec":{
      "containers":[
        {"name":"main","image":"img:1",
         "env":[{"name":"A","value":"1"},{"name":"B","value":"2"}],
         "ports":[{"containerPort":80,"name":"http"}],
         "volumeMounts":[{"mountPath":"/m","name":"models"}]},
        {"name":"side","image":"side:1"}],
      "tolerations":[{"key":"gpu","operator":"Exists"}],
      "volumes":[{"name":"models","emptyDir":{}}]}}}})");
}

TEST(StrategicMergePatchTest, ContainersAndEnvMergeByName) {
  json patch = json::parse(R"({"spec":{"template":{"spec":{"containers":[
      {"name":"main","image":"img:2","env":[{"name":"B","value":"20"},{"name":"C","value":"3"}]},
      {"name":"new","image":"new:1"}]}}}})");
  json result = strategicMergePatch(deployment(), patch);
  const json& containers = result["spec"]["template"]["spec"]["containers"];
  ASSERT_EQ(containers.size(), 3u);
  EXPECT_EQ(containers[0]["name"], "main");
  EXPECT_EQ(containers[0]["image"], "img:2");
  EXPECT_EQ(containers[0]["env"], json::parse(R"([{"name":"A","value":"1"},
      {"name":"B","value":"20"},{"name":"C","value":"3"}])"));
  EXPECT_EQ(containers[0]["ports"], json::parse(R"([{"containerPort":80,"name":"http"}])"));
  EXPECT_EQ(containers[1], json::parse(R"({"name":"side","image":"side:1"})"));
  EXPECT_EQ(containers[2], json::parse(R"({"name":"new","image":"new:1"})"));
}

TEST(StrategicMergePatchTest, PatchDeleteRemovesListItemsAndMaps) {
  json patch = json::parse(R"({"metadata":{"labels":{"$patch":"delete"}},
      "spec":{"template":{"spec":{"containers":[
        {"name":"side","$patch":"delete"},
        {"name":"main","env":[{"name":"A","$patch":"delete"}]}]}}}})");
  json result = strategicMergePatch(deployment(), patch);
  EXPECT_FALSE(result["metadata"].contains("labels"));
  const json& containers = result["spec"]["template"]["spec"]["containers"];
  ASSERT_EQ(containers.size(), 1u);
  EXPECT_EQ(containers[0]["env"], json::parse(R"([{"name":"B","value":"2"}])"));
}

TEST(StrategicMergePatchTest, PatchReplaceReplacesListsAndMaps) {
  json patch = json::parse(R"({"metadata":{"labels":{"$patch":"replace","tier":"x"}},
      "spec":{"template":{"spec":{"containers":[{"$patch":"replace"},{"name":"only","image":"o"}]}}}})");
  json result = strategicMergePatch(deployment(), patch);
  EXPECT_EQ(result["metadata"]["labels"], json::parse(R"({"tier":"x"})"));
  EXPECT_EQ(result["spec"]["template"]["spec"]["containers"],
            json::parse(R"([{"name":"only","image":"o"}])"));
}

TEST(StrategicMergePatchTest, ListsWithoutMergeKeyAreReplacedAndNullDeletes) {
  json patch = json::parse(R"({"spec":{"replicas":null,"template":{"spec":{
      "tolerations":[{"key":"other","operator":"Exists"}]}}}})");
  json result = strategicMergePatch(deployment(), patch);
  EXPECT_FALSE(result["spec"].contains("replicas"));
  EXPECT_EQ(result["spec"]["template"]["spec"]["tolerations"],
            json::parse(R"([{"key":"other","operator":"Exists"}])"));
}

TEST(StrategicMergePatchTest, PortsKeyedByContainerPortInContainersAndPortInServices) {
  json container_patch = json::parse(R"({"spec":{"template":{"spec":{"containers":[
      {"name":"main","ports":[{"containerPort":80,"protocol":"TCP"},{"containerPort":9090}]}]}}}})");
  json result = strategicMergePatch(deployment(), container_patch);
  EXPECT_EQ(result["spec"]["template"]["spec"]["containers"][0]["ports"],
            json::parse(R"([{"containerPort":80,"name":"http","protocol":"TCP"},
                            {"containerPort":9090}])"));

  json service = json::parse(R"({"kind":"Service","spec":{"ports":[{"port":80,"name":"http"}]}})");
  json service_patch = json::parse(R"({"spec":{"ports":[{"port":80,"targetPort":8080},
      {"port":443}]}})");
  EXPECT_EQ(strategicMergePatch(service, service_patch)["spec"]["ports"],
            json::parse(R"([{"port":80,"name":"http","targetPort":8080},{"port":443}])"));
}

TEST(StrategicMergePatchTest, FinalizersMergeAsSetAndDeleteFromPrimitiveList) {
  json patch = json::parse(R"({"metadata":{"finalizers":["b","a"],
      "$deleteFromPrimitiveList/finalizers":["a"]}})");
  EXPECT_EQ(strategicMergePatch(deployment(), patch)["metadata"]["finalizers"],
            json::parse(R"(["b"])"));
}

TEST(StrategicMergePatchTest, SetElementOrderReordersMergedList) {
  json patch = json::parse(R"({"spec":{"template":{"spec":{
      "$setElementOrder/containers":[{"name":"side"},{"name":"main"}],
      "containers":[{"name":"main","image":"img:3"}]}}}})");
  json result = strategicMergePatch(deployment(), patch);
  const json& containers = result["spec"]["template"]["spec"]["containers"];
  ASSERT_EQ(containers.size(), 2u);
  EXPECT_EQ(containers[0]["name"], "side");
  EXPECT_EQ(containers[1]["name"], "main");
  EXPECT_EQ(containers[1]["image"], "img:3");
}

TEST(StrategicMergePatchTest, RetainKeysDropsFieldsNotListed) {
  json target = json::parse(
      R"({"spec":{"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":1}}}})");
  json patch = json::parse(R"({"spec":{"strategy":{"$retainKeys":["type"],"type":"Recreate"}}})");
  EXPECT_EQ(strategicMergePatch(target, patch),
            json::parse(R"({"spec":{"strategy":{"type":"Recreate"}}})"));
}

TEST(StrategicMergePatchTest, Errors) {
  EXPECT_NE(patchErrorOf([] {
              strategicMergePatch(deployment(), json::array());
            }).find("must be an object"),
            std::string::npos);
  std::string missing_key = patchErrorOf([] {
    strategicMergePatch(deployment(), json::parse(R"({"spec":{"template":{"spec":{
        "containers":[{"image":"x"}]}}}})"));
  });
  EXPECT_NE(missing_key.find("an item of \"containers\" has no merge key \"name\""),
            std::string::npos)
      << missing_key;
  std::string bad_directive = patchErrorOf([] {
    strategicMergePatch(deployment(), json::parse(R"({"metadata":{"$patch":"explode"}})"));
  });
  EXPECT_NE(bad_directive.find("must be delete, replace or merge"), std::string::npos)
      << bad_directive;
}

// --- Server-side apply -----------------------------------------------------

TEST(ServerSideApplyTest, FieldsNoLongerAppliedAreRemovedOthersKept) {
  json previously_applied = nullptr;
  json first = json::parse(R"({"metadata":{"name":"p","labels":{"a":"1","b":"2"}},
      "spec":{"replicas":2,"image":"img:1","model":{"path":"/m"}}})");
  json live = serverSideApply(json::object(), first, previously_applied);
  EXPECT_EQ(live, first);
  EXPECT_EQ(previously_applied, first);

  // Another writer adds fields the applier never named.
  live["spec"]["extra"] = "kept";
  live["metadata"]["labels"]["other"] = "kept";
  live["status"] = {{"readyReplicas", 1}};

  json second = json::parse(R"({"metadata":{"name":"p","labels":{"a":"1"}},
      "spec":{"replicas":3,"model":{"path":"/m"}}})");
  live = serverSideApply(live, second, previously_applied);
  EXPECT_EQ(live, json::parse(R"({"metadata":{"name":"p","labels":{"a":"1","other":"kept"}},
      "spec":{"replicas":3,"model":{"path":"/m"},"extra":"kept"},
      "status":{"readyReplicas":1}})"));
  EXPECT_EQ(previously_applied, second);
}

TEST(ServerSideApplyTest, KeyedListItemsMergeAndUnappliedItemsGo) {
  json previously_applied = nullptr;
  json first = json::parse(R"({"spec":{"template":{"spec":{"containers":[
      {"name":"a","image":"a:1"},{"name":"b","image":"b:1"}]}}}})");
  json live = serverSideApply(json::object(), first, previously_applied);
  // A container another writer added, and a field another writer set on "a".
  live["spec"]["template"]["spec"]["containers"].push_back({{"name", "c"}, {"image", "c:1"}});
  live["spec"]["template"]["spec"]["containers"][0]["resources"] = json::object();

  json second = json::parse(R"({"spec":{"template":{"spec":{"containers":[
      {"name":"a","image":"a:2"}]}}}})");
  live = serverSideApply(live, second, previously_applied);
  EXPECT_EQ(live["spec"]["template"]["spec"]["containers"],
            json::parse(R"([{"name":"a","image":"a:2","resources":{}},
                            {"name":"c","image":"c:1"}])"));
}

TEST(ServerSideApplyTest, AtomicListsReplacedAndNonObjectRejected) {
  json previously_applied = nullptr;
  json live = json::parse(R"({"spec":{"extraArgs":["--a","--b"]}})");
  live =
      serverSideApply(live, json::parse(R"({"spec":{"extraArgs":["--c"]}})"), previously_applied);
  EXPECT_EQ(live["spec"]["extraArgs"], json::parse(R"(["--c"])"));
  EXPECT_NE(patchErrorOf([&] {
              serverSideApply(live, json::array(), previously_applied);
            }).find("an apply configuration must be an object"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::testing
