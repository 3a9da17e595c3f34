// Subset comparison: what the API server adds never causes a write; a
// changed or missing desired field does.
#include "operator/controller/object_diff.h"

#include <gtest/gtest.h>

namespace tandem::controller {
namespace {

using nlohmann::json;

const json kDesired = json::parse(R"({
  "metadata": {"name": "decode", "labels": {"tandem.dev/pool": "decode"}},
  "spec": {"replicas": 2,
           "template": {"spec": {"containers": [{
             "name": "agent", "args": ["serve", "--port", "8000"],
             "resources": {"limits": {"nvidia.com/gpu": 1}},
             "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}]}}}})");

// kDesired as a real API server returns it: defaults and metadata added,
// the quantity written as a string.
json live() {
  json object = kDesired;
  object["metadata"]["uid"] = "1234";
  object["metadata"]["resourceVersion"] = "77";
  object["metadata"]["labels"]["pod-template-hash"] = "abc";
  object["spec"]["revisionHistoryLimit"] = 10;
  json& container = object["spec"]["template"]["spec"]["containers"][0];
  container["terminationMessagePath"] = "/dev/termination-log";
  container["imagePullPolicy"] = "IfNotPresent";
  container["resources"]["limits"]["nvidia.com/gpu"] = "1";
  container["readinessProbe"]["timeoutSeconds"] = 1;
  container["readinessProbe"]["httpGet"]["scheme"] = "HTTP";
  object["status"] = {{"replicas", 2}};
  return object;
}

TEST(ObjectDiffTest, ServerDefaultsAreNotDifferences) {
  EXPECT_TRUE(isSubset(kDesired, live()));
  EXPECT_EQ(firstDifference(kDesired, live()), "");
}

TEST(ObjectDiffTest, AChangedArgumentIsADifference) {
  json changed = live();
  changed["spec"]["template"]["spec"]["containers"][0]["args"][2] = "9000";
  EXPECT_FALSE(isSubset(kDesired, changed));
  EXPECT_EQ(firstDifference(kDesired, changed), "spec.template.spec.containers[0].args[2]");
}

TEST(ObjectDiffTest, MissingFieldsExtraListItemsAndTypesAreDifferences) {
  json missing = live();
  missing["metadata"]["labels"].erase("tandem.dev/pool");
  EXPECT_EQ(firstDifference(kDesired, missing), "metadata.labels.tandem.dev/pool");
  json longer = live();
  longer["spec"]["template"]["spec"]["containers"][0]["args"].push_back("--extra");
  EXPECT_EQ(firstDifference(kDesired, longer), "spec.template.spec.containers[0].args");
  json replicas = live();
  replicas["spec"]["replicas"] = 3;
  EXPECT_EQ(firstDifference(kDesired, replicas), "spec.replicas");
  // A string where a number is wanted is only equal when it spells that number.
  replicas["spec"]["replicas"] = "two";
  EXPECT_FALSE(isSubset(kDesired, replicas));
  // The other way round (desired string, live number) is a difference.
  EXPECT_FALSE(isSubset(json{{"a", "1"}}, json{{"a", 1}}));
}

}  // namespace
}  // namespace tandem::controller
