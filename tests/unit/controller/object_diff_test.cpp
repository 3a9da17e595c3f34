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

// The API server leaves out omitempty fields whose value is Go's zero value:
// a desired zero equals an absent field (else every reconcile would write
// again), but not a live field that differs.
TEST(ObjectDiffTest, ZeroValuesTheServerLeavesOutAreNotDifferences) {
  const json desired = json::parse(R"({"spec": {"hostNetwork": false, "dnsPolicy": "",
    "containers": [{"name": "agent", "env": [{"name": "X", "value": ""}],
                    "startupProbe": {"initialDelaySeconds": 0}, "args": []}]}})");
  const json stored = json::parse(R"({"spec": {"dnsPolicy": "ClusterFirst",
    "containers": [{"name": "agent", "env": [{"name": "X"}], "startupProbe": {}}]}})");
  EXPECT_FALSE(isSubset(desired, stored)) << "dnsPolicy differs";
  json same = stored;
  same["spec"]["dnsPolicy"] = "";
  same["spec"].erase("dnsPolicy");
  json desired_default = desired;
  desired_default["spec"].erase("dnsPolicy");
  EXPECT_TRUE(isSubset(desired_default, same)) << firstDifference(desired_default, same);
  json network = same;
  network["spec"]["hostNetwork"] = true;
  EXPECT_EQ(firstDifference(desired_default, network), "spec.hostNetwork");
  // A non-zero desired value the live object lacks is still a difference.
  EXPECT_EQ(firstDifference(json{{"spec", {{"hostIPC", true}}}}, same), "spec.hostIPC");
}

}  // namespace
}  // namespace tandem::controller

namespace tandem::controller {
namespace {

// Resource quantities come back from the API server in canonical form; equal
// values must not cause a write, different ones must, and only under
// resources are strings compared as quantities.
TEST(ObjectDiff, ResourceQuantitiesCompareByValue) {
  const json desired = json::parse(R"({"resources": {"limits": {"cpu": "0.5",
      "memory": "1024Mi", "nvidia.com/gpu": 1}, "requests": {"memory": "1e3"}}})");
  const json canonical = json::parse(R"({"resources": {"limits": {"cpu": "500m",
      "memory": "1Gi", "nvidia.com/gpu": "1"}, "requests": {"memory": "1k"}}})");
  EXPECT_TRUE(isSubset(desired, canonical)) << firstDifference(desired, canonical);

  json more = canonical;
  more["resources"]["limits"]["cpu"] = "600m";
  EXPECT_EQ(firstDifference(desired, more), "resources.limits.cpu");
  more = canonical;
  more["resources"]["limits"]["memory"] = "1G";  // 10^9, not 2^30
  EXPECT_EQ(firstDifference(desired, more), "resources.limits.memory");

  const json cache = json::parse(R"({"emptyDir": {"sizeLimit": "1024Mi"}})");
  EXPECT_TRUE(isSubset(cache, json::parse(R"({"emptyDir": {"sizeLimit": "1Gi"}})")));
  EXPECT_EQ(firstDifference(cache, json::parse(R"({"emptyDir": {"sizeLimit": "1G"}})")),
            "emptyDir.sizeLimit");

  const json args = json::parse(R"({"args": ["--threads", "0.5"]})");
  const json other = json::parse(R"({"args": ["--threads", "500m"]})");
  EXPECT_EQ(firstDifference(args, other), "args[1]");
}

}  // namespace
}  // namespace tandem::controller
