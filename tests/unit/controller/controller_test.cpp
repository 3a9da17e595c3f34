// The controller against the in-process API server with the real CRDs:
// children appear with owner references, an unchanged world costs no
// writes, spec changes roll through to the Deployment and status, foreign
// objects are never touched, deleted children come back, routers find pools.
#include "operator/controller/controller.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "operator/controller/workload_status.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/test_helpers.h"
#include "tests/unit/controller/controller_test_support.h"

namespace tandem::controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kNamespace[] = "serving";
constexpr char kToken[] = "controller-token";

json decodePool(int64_t replicas, const std::string& name = "decode") {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", "DecodePool"},
          {"metadata", {{"name", name}, {"namespace", kNamespace}}},
          {"spec",
           {{"replicas", replicas},
            {"model", {{"path", "/models/small"}}},
            {"kvTransfer", {{"secretRef", {{"name", "kv"}, {"key", "secret"}}}}}}}};
}

json prefillPool(const std::string& name = "prefill") {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", "PrefillPool"},
          {"metadata", {{"name", name}, {"namespace", kNamespace}}},
          {"spec", {{"model", {{"path", "/models/small"}}}}}};
}

// Write requests (POST, PUT, PATCH, DELETE) in `log` from entry `from` on.
uint64_t writeRequests(const std::vector<std::string>& log, size_t from) {
  uint64_t count = 0;
  for (size_t i = from; i < log.size(); ++i) {
    for (const char* method : {"POST ", "PUT ", "PATCH ", "DELETE "}) {
      if (log[i].starts_with(method)) ++count;
    }
  }
  return count;
}

class ControllerTest : public ::testing::Test {
 protected:
  ControllerTest() {
    server_.registerCrds(std::filesystem::path(TANDEM_SOURCE_DIR) / "crds");
    client_ = std::make_unique<k8s::ApiClient>(testClusterConfig(server_, kNamespace));
  }

  ControllerOptions options() const { return testControllerOptions(kNamespace); }

  std::optional<json> get(const std::string& api_version, const std::string& kind,
                          const std::string& name) {
    return server_.get(api_version, kind, kNamespace, name);
  }
  std::optional<json> deployment(const std::string& name) {
    return get("apps/v1", "Deployment", name);
  }
  std::vector<json> eventsWithReason(const std::string& reason) {
    return controller::eventsWithReason(server_, kNamespace, reason);
  }

  testing::ApiServer server_;
  std::unique_ptr<k8s::ApiClient> client_;
};

TEST_F(ControllerTest, PoolGetsOwnedChildrenAndASecondPassWritesNothing) {
  const json pool = server_.put(decodePool(2));
  const std::string uid = pool["metadata"]["uid"];
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());

  auto created = deployment("decode");
  ASSERT_TRUE(created.has_value());
  EXPECT_EQ((*created)["metadata"]["ownerReferences"][0]["uid"], uid);
  EXPECT_EQ((*created)["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ((*created)["spec"]["replicas"], 2);
  auto service = get("v1", "Service", "decode");
  ASSERT_TRUE(service.has_value());
  EXPECT_EQ((*service)["metadata"]["ownerReferences"][0]["uid"], uid);
  EXPECT_EQ((*service)["spec"]["clusterIP"], "None");
  // A PodDisruptionBudget of maxUnavailable 1 over the pool's agents.
  auto budget = get("policy/v1", "PodDisruptionBudget", "decode");
  ASSERT_TRUE(budget.has_value());
  EXPECT_EQ((*budget)["metadata"]["ownerReferences"][0]["uid"], uid);
  EXPECT_EQ((*budget)["spec"]["maxUnavailable"], 1);
  EXPECT_EQ((*budget)["spec"]["selector"]["matchLabels"],
            (*created)["spec"]["selector"]["matchLabels"]);
  EXPECT_EQ(eventsWithReason("Created").size(), 3u);

  auto stored = get("tandem.dev/v1alpha1", "DecodePool", "decode");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ((*stored)["status"]["observedGeneration"], (*stored)["metadata"]["generation"]);
  EXPECT_EQ((*stored)["status"]["selector"], "tandem.dev/pool=decode,tandem.dev/role=decode");
  EXPECT_EQ(findCondition((*stored)["status"], "Ready")["status"], "False");

  // The server counts a write just after answering it: let the first pass's
  // count settle at the number of writes its log shows.
  const size_t requests = server_.requestLog().size();
  const uint64_t writes = writeRequests(server_.requestLog(), 0);
  ASSERT_GT(writes, 0u);
  ASSERT_TRUE(waitUntil([&] { return server_.writesBy(kToken) == writes; }));
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  EXPECT_EQ(writeRequests(server_.requestLog(), requests), 0u)
      << "an unchanged world was written to";
  EXPECT_EQ(server_.writesBy(kToken), writes);
}

TEST_F(ControllerTest, SpecChangeUpdatesTheDeploymentAndObservedGenerationFollows) {
  server_.put(decodePool(1));
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());

  json changed = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  changed["spec"]["replicas"] = 3;
  changed["spec"]["engine"] = {{"maxNumSeqs", 8}};
  const json stored = server_.put(changed);
  const int64_t generation = stored["metadata"]["generation"];
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());

  const json updated = *deployment("decode");
  EXPECT_EQ(updated["spec"]["replicas"], 3);
  const json args = updated["spec"]["template"]["spec"]["containers"][0]["args"];
  EXPECT_NE(std::find(args.begin(), args.end(), "--max-num-seqs"), args.end()) << args;
  const json pool = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  EXPECT_EQ(pool["status"]["observedGeneration"], generation);
  EXPECT_EQ(eventsWithReason("Updated").size(), 1u);

  // The Deployment controller finishes the rollout: Ready.
  server_.setDeploymentStatus(kNamespace, "decode", 3, 3, 3);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  const json ready = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  EXPECT_EQ(findCondition(ready["status"], "Ready")["status"], "True") << ready["status"];
  EXPECT_EQ(ready["status"]["readyReplicas"], 3);
}

// spec.disruptionBudget changes the pool's PodDisruptionBudget, and
// enabled: false deletes it (and nothing else).
TEST_F(ControllerTest, DisruptionBudgetFollowsTheSpecAndIsDeletedWhenTurnedOff) {
  server_.put(decodePool(4));
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  ASSERT_EQ(get("policy/v1", "PodDisruptionBudget", "decode")->at("spec")["maxUnavailable"], 1);

  json changed = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  changed["spec"]["disruptionBudget"] = {{"minAvailable", "75%"}};
  server_.put(changed);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  const json budget = *get("policy/v1", "PodDisruptionBudget", "decode");
  EXPECT_EQ(budget["spec"]["minAvailable"], "75%");
  EXPECT_FALSE(budget["spec"].contains("maxUnavailable")) << budget["spec"];
  EXPECT_EQ(budget["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");

  changed = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  changed["spec"]["disruptionBudget"] = {{"enabled", false}};
  server_.put(changed);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  EXPECT_FALSE(get("policy/v1", "PodDisruptionBudget", "decode").has_value());
  EXPECT_TRUE(deployment("decode").has_value());
  const json pool = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  EXPECT_EQ(pool["status"]["observedGeneration"], pool["metadata"]["generation"]);
}

// A Router gets a PodDisruptionBudget over its pods as a pool does (a
// drain takes one router pod at a time), following its own spec.
TEST_F(ControllerTest, ARouterHasADisruptionBudgetOverItsPods) {
  server_.put(decodePool(1));
  json object = {{"apiVersion", "tandem.dev/v1alpha1"},
                 {"kind", "Router"},
                 {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
                 {"spec", {{"modelPath", "/models/small"}, {"replicas", 3}}}};
  const std::string uid = server_.put(object)["metadata"]["uid"];
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  const std::optional<json> budget = get("policy/v1", "PodDisruptionBudget", "front");
  ASSERT_TRUE(budget.has_value());
  EXPECT_EQ((*budget)["metadata"]["ownerReferences"][0]["uid"], uid);
  EXPECT_EQ((*budget)["spec"]["maxUnavailable"], 1);
  EXPECT_EQ((*budget)["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
  EXPECT_EQ((*budget)["spec"]["selector"]["matchLabels"],
            (*deployment("front"))["spec"]["selector"]["matchLabels"]);

  object = *get("tandem.dev/v1alpha1", "Router", "front");
  object["spec"]["disruptionBudget"] = {{"minAvailable", 2}};
  server_.put(object);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  EXPECT_EQ(get("policy/v1", "PodDisruptionBudget", "front")->at("spec")["minAvailable"], 2);

  object = *get("tandem.dev/v1alpha1", "Router", "front");
  object["spec"]["disruptionBudget"] = {{"enabled", false}};
  server_.put(object);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  EXPECT_FALSE(get("policy/v1", "PodDisruptionBudget", "front").has_value());
  EXPECT_TRUE(deployment("front").has_value());
  EXPECT_TRUE(get("policy/v1", "PodDisruptionBudget", "decode").has_value())
      << "the pool's is not the Router's";
}

TEST_F(ControllerTest, ForeignDeploymentOfTheSameNameIsLeftAlone) {
  const json foreign = server_.put(
      {{"apiVersion", "apps/v1"},
       {"kind", "Deployment"},
       {"metadata", {{"name", "decode"}, {"namespace", kNamespace}}},
       {"spec",
        {{"replicas", 1},
         {"selector", {{"matchLabels", {{"app", "other"}}}}},
         {"template",
          {{"metadata", {{"labels", {{"app", "other"}}}}},
           {"spec", {{"containers", json::array({{{"name", "x"}, {"image", "x"}}})}}}}}}}});
  server_.put(decodePool(1));
  Controller controller(*client_, options());
  const auto result = controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode");
  ASSERT_TRUE(result.isOk());
  // Nothing tells the controller when the foreign Deployment goes (it is
  // not labelled as the controller's): it asks to look again.
  EXPECT_EQ(result->requeue_after, std::chrono::seconds(30));
  EXPECT_EQ((*deployment("decode"))["metadata"]["resourceVersion"],
            foreign["metadata"]["resourceVersion"]);
  const json pool = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  const json degraded = findCondition(pool["status"], "Degraded");
  EXPECT_EQ(degraded["status"], "True");
  EXPECT_EQ(degraded["reason"], "NameConflict");
  EXPECT_NE(degraded["message"].get<std::string>().find("Deployment decode"), std::string::npos);
  ASSERT_EQ(eventsWithReason("NameConflict").size(), 1u);
  EXPECT_EQ(eventsWithReason("NameConflict")[0]["type"], "Warning");
  // Nothing of the pool is written beside it: no Service, no budget.
  EXPECT_FALSE(get("v1", "Service", "decode").has_value());
  EXPECT_FALSE(get("policy/v1", "PodDisruptionBudget", "decode").has_value());
}

// A foreign Service of the pool's name blocks the pool as a foreign
// Deployment does: no Deployment and no budget are written beside it (they
// were, and Progressing said Blocked while a Deployment of 4 replicas ran),
// and once the Service goes the pool is applied.
TEST_F(ControllerTest, AForeignServiceOfThePoolsNameBlocksThePoolWhole) {
  server_.put({{"apiVersion", "v1"},
               {"kind", "Service"},
               {"metadata", {{"name", "decode"}, {"namespace", kNamespace}}},
               {"spec", {{"ports", json::array({{{"name", "web"}, {"port", 80}}})}}}});
  server_.put(decodePool(4));
  Controller controller(*client_, options());
  const auto result = controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode");
  ASSERT_TRUE(result.isOk());
  EXPECT_EQ(result->requeue_after, std::chrono::seconds(30));
  EXPECT_FALSE(deployment("decode").has_value());
  EXPECT_FALSE(get("policy/v1", "PodDisruptionBudget", "decode").has_value());
  const json pool = *get("tandem.dev/v1alpha1", "DecodePool", "decode");
  const json degraded = findCondition(pool["status"], "Degraded");
  EXPECT_EQ(degraded["reason"], "NameConflict");
  EXPECT_NE(degraded["message"].get<std::string>().find("Service decode exists"),
            std::string::npos);
  EXPECT_EQ(findCondition(pool["status"], "Progressing")["reason"], "Blocked");

  server_.remove("v1", "Service", kNamespace, "decode");
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  EXPECT_TRUE(deployment("decode").has_value());
  EXPECT_TRUE(get("v1", "Service", "decode").has_value());
  EXPECT_TRUE(get("policy/v1", "PodDisruptionBudget", "decode").has_value());
}

// Once per pool, not per reconcile, and not per generation either: an
// autoscaler's every step writes spec.replicas (a new generation), which
// must not repeat the warning.
TEST_F(ControllerTest, InsecureKvTransferIsWarnedOncePerPool) {
  server_.put(prefillPool());
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill").isOk());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill").isOk());
  EXPECT_EQ(eventsWithReason("InsecureKvTransfer").size(), 1u);
  json scaled = *get("tandem.dev/v1alpha1", "PrefillPool", "prefill");
  scaled["spec"]["replicas"] = 3;
  server_.put(scaled);
  ASSERT_EQ((*get("tandem.dev/v1alpha1", "PrefillPool", "prefill"))["metadata"]["generation"], 2);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill").isOk());
  EXPECT_EQ(eventsWithReason("InsecureKvTransfer").size(), 1u);
  // A restarted controller (or the next leader) remembers nothing: it finds
  // the Event under the name its pool, reason and message give it, and
  // writes none again (each restart added one).
  for (int restart = 0; restart < 2; ++restart) {
    Controller restarted(*client_, options());
    ASSERT_TRUE(restarted.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill").isOk());
  }
  EXPECT_EQ(eventsWithReason("InsecureKvTransfer").size(), 1u);
  const json args = (*deployment("prefill"))["spec"]["template"]["spec"]["containers"][0]["args"];
  EXPECT_NE(std::find(args.begin(), args.end(), "--insecure-kv"), args.end());
  EXPECT_NE(std::find(args.begin(), args.end(), "$(POD_IP)"), args.end());
}

// A child the API server keeps refusing is retried, but the same refusal is
// one Event, not one per retry.
TEST_F(ControllerTest, ARepeatedRefusalOfAChildIsOneEvent) {
  server_.put(prefillPool());
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill").isOk());
  json scaled = *get("tandem.dev/v1alpha1", "PrefillPool", "prefill");
  scaled["spec"]["replicas"] = 3;
  server_.put(scaled);
  server_.injectConflicts(3, "Deployment");
  for (int i = 0; i < 3; ++i) {
    (void)controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill");
  }
  const std::vector<json> refused = eventsWithReason("FailedUpdate");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0]["message"].get<std::string>().find("Deployment"), std::string::npos)
      << refused[0].dump();
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill").isOk());
  EXPECT_EQ((*deployment("prefill"))["spec"]["replicas"], 3);
  // Once the child was written, the same refusal later is warned again.
  scaled["spec"]["replicas"] = 4;
  server_.put(scaled);
  server_.injectConflicts(1, "Deployment");
  (void)controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "prefill");
  EXPECT_EQ(eventsWithReason("FailedUpdate").size(), 2u);
}

// A Router without a model path and nothing to route to (its DecodePool
// deleted, or not made yet) is Degraded, NoDecodePool; it used to read the
// first of no pools, and the operator crashed on every reconcile.
TEST_F(ControllerTest, ARouterWithNoDecodePoolIsDegradedNamingWhy) {
  server_.put({{"apiVersion", "tandem.dev/v1alpha1"},
               {"kind", "Router"},
               {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
               {"spec", {{"service", {{"port", 80}}}}}});
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  auto router = get("tandem.dev/v1alpha1", "Router", "front");
  ASSERT_TRUE(router.has_value());
  const json degraded = findCondition((*router)["status"], "Degraded");
  EXPECT_EQ(degraded["status"], "True") << router->dump();
  EXPECT_EQ(degraded["reason"], "NoDecodePool") << router->dump();
}

// A PrefillPool and a DecodePool of one name share child names: the second
// is Degraded (NameConflict), and a Router listing every pool routes to the
// one that holds the name only (a router given it as both would not start).
TEST_F(ControllerTest, ARouterLeavesOutThePoolThatLostItsNameToAPoolOfTheOtherKind) {
  server_.put(prefillPool("shared"));
  server_.put(decodePool(1, "shared"));
  server_.put(decodePool(1, "decode"));
  server_.put({{"apiVersion", "tandem.dev/v1alpha1"},
               {"kind", "Router"},
               {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
               {"spec", {{"modelPath", "/models/small"}}}});
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kPrefillPool, kNamespace, "shared").isOk());
  (void)controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "shared");
  const json conflicted = *get("tandem.dev/v1alpha1", "DecodePool", "shared");
  ASSERT_EQ(findCondition(conflicted["status"], "Degraded")["reason"], "NameConflict")
      << conflicted.dump();
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  // Its router finds pools by their Services (one per name, the holder's);
  // the status names the pools it routes to.
  const json status = (*get("tandem.dev/v1alpha1", "Router", "front"))["status"];
  EXPECT_EQ(status["decodePools"], json::array({"decode"})) << status;
  EXPECT_EQ(status["prefillPools"], json::array({"shared"})) << status;
}

// Event names are "<object>.<16 hex>": an object of a long name (a CR name
// may have 253 characters) gets its Events under the name cut short, with
// no '-' or '.' before the dot.
TEST_F(ControllerTest, AnObjectOfALongNameGetsItsEvents) {
  EXPECT_EQ(eventName("decode", "0123456789abcdef"), "decode.0123456789abcdef");
  const std::string cut = eventName(std::string(235, 'a') + "-b", "0123456789abcdef");
  EXPECT_EQ(cut, std::string(235, 'a') + ".0123456789abcdef");
  const std::string name = "d" + std::string(252, 'a');
  server_.put(decodePool(1, name));
  Controller controller(*client_, options());
  (void)controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, name);
  const std::vector<json> events = eventsWithReason("InvalidSpec");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["involvedObject"]["name"], name);
  EXPECT_EQ(events[0]["metadata"]["name"].get<std::string>().size(), 253u);
}

// A name in both of a Router's lists, of a PrefillPool only: the decode
// list names a pool that does not exist (PoolNotFound naming the field),
// and the PrefillPool keeps its place in the prefill list.
TEST_F(ControllerTest, ANameInBothListsWithAPoolOfOneKindIsNotANameConflict) {
  server_.put(prefillPool("prefill"));
  server_.put(decodePool(1, "decode"));
  server_.put({{"apiVersion", "tandem.dev/v1alpha1"},
               {"kind", "Router"},
               {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
               {"spec",
                {{"modelPath", "/models/small"},
                 {"prefillPools", {"prefill"}},
                 {"decodePools", {"decode", "prefill"}}}}});
  Controller controller(*client_, options());
  (void)controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front");
  const json router = *get("tandem.dev/v1alpha1", "Router", "front");
  const json degraded = findCondition(router["status"], "Degraded");
  EXPECT_EQ(degraded["reason"], "PoolNotFound") << router.dump();
  EXPECT_NE(degraded["message"].get<std::string>().find(
                "spec.decodePools names \"prefill\", which is not a DecodePool"),
            std::string::npos)
      << degraded.dump();
  EXPECT_TRUE(eventsWithReason("NameConflict").empty());
  const auto deployment = this->deployment("front");
  ASSERT_TRUE(deployment.has_value());
  const std::string args =
      (*deployment)["spec"]["template"]["spec"]["containers"][0]["args"].dump();
  EXPECT_NE(args.find("\"--prefill-pool\",\"prefill\""), std::string::npos) << args;
  // A router given the name as both kinds would refuse to start.
  EXPECT_EQ(args.find("\"--decode-pool\",\"prefill\""), std::string::npos) << args;
  EXPECT_NE(args.find("\"--decode-pool\",\"decode\""), std::string::npos) << args;
}

// Pools with a KV secret refuse unsigned holds: a Router without the same
// secret is warned (once) that its prefix lending is off; with it, not.
TEST_F(ControllerTest, ARouterWithoutThePoolsKvSecretIsWarned) {
  server_.put(decodePool(1));  // kvTransfer.secretRef kv/secret
  json router = {{"apiVersion", "tandem.dev/v1alpha1"},
                 {"kind", "Router"},
                 {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
                 {"spec", {{"modelPath", "/models/small"}}}};
  server_.put(router);
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  const auto warned = eventsWithReason("UnsignedHolds");
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_NE(warned[0]["message"].get<std::string>().find("pool decode has kvTransfer.secretRef"),
            std::string::npos)
      << warned[0].dump();

  router["metadata"]["name"] = "signed";
  router["spec"]["kvSecretRef"] = {{"name", "kv"}, {"key", "secret"}};
  server_.put(router);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "signed").isOk());
  EXPECT_EQ(eventsWithReason("UnsignedHolds").size(), 1u);
}

// A request's priority is read by its prefill and its decode agent: a
// Router whose pools schedule differently is warned (once); pools that
// agree are not.
TEST_F(ControllerTest, ARouterWhosePoolsScheduleDifferentlyIsWarned) {
  json prefill = prefillPool();
  prefill["spec"]["engine"] = {{"schedulingPolicy", "priority"}};
  server_.put(prefill);
  server_.put(decodePool(1));  // first come, first served (the default)
  json router = {
      {"apiVersion", "tandem.dev/v1alpha1"},
      {"kind", "Router"},
      {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
      {"spec",
       {{"modelPath", "/models/small"}, {"kvSecretRef", {{"name", "kv"}, {"key", "secret"}}}}}};
  server_.put(router);
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "front").isOk());
  const auto warned = eventsWithReason("MixedSchedulingPolicy");
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_EQ(warned[0]["message"],
            "pool prefill serves requests by priority (engine.schedulingPolicy) and pool decode "
            "first come, first served: a request with a priority other than 0 is refused by the "
            "latter; give every pool of this Router the same engine.schedulingPolicy");

  json decode = decodePool(1);
  decode["spec"]["engine"] = {{"schedulingPolicy", "priority"}};
  server_.put(decode);
  router["metadata"]["name"] = "agreeing";
  server_.put(router);
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kRouter, kNamespace, "agreeing").isOk());
  EXPECT_EQ(eventsWithReason("MixedSchedulingPolicy").size(), 1u);
}

// An owner being deleted (held by a finalizer, or in the foreground while
// its children go) gets no children back: re-creating its Deployment would
// start pods the deletion then removes.
TEST_F(ControllerTest, AnOwnerBeingDeletedGetsNoChildrenBack) {
  json pool = decodePool(1);
  pool["metadata"]["finalizers"] = json::array({"example.com/hold"});
  server_.put(pool);
  Controller controller(*client_, options());
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  ASSERT_TRUE(deployment("decode").has_value());
  ASSERT_TRUE(client_->remove(resourceOf(OwnerKind::kDecodePool), kNamespace, "decode").isOk());
  auto marked = get("tandem.dev/v1alpha1", "DecodePool", "decode");
  ASSERT_TRUE(marked.has_value());
  ASSERT_TRUE((*marked)["metadata"].contains("deletionTimestamp")) << marked->dump();
  // The garbage collector removes its children meanwhile.
  server_.remove("apps/v1", "Deployment", kNamespace, "decode");
  server_.remove("v1", "Service", kNamespace, "decode");
  ASSERT_TRUE(controller.reconcileNow(OwnerKind::kDecodePool, kNamespace, "decode").isOk());
  EXPECT_FALSE(deployment("decode").has_value());
  EXPECT_FALSE(get("v1", "Service", "decode").has_value());
}

TEST_F(ControllerTest, RunningControllerReconcilesPutsBackAndRoutes) {
  Controller controller(*client_, options());
  controller.start();
  ASSERT_TRUE(controller.waitForSync(seconds(30)));
  server_.setDeploymentControllerAuto(true);
  server_.put(prefillPool());
  server_.put(decodePool(2));
  server_.put({{"apiVersion", "tandem.dev/v1alpha1"},
               {"kind", "Router"},
               {"metadata", {{"name", "front"}, {"namespace", kNamespace}}},
               {"spec", {{"service", {{"port", 80}}}}}});

  ASSERT_TRUE(waitUntil([&] {
    auto pool = get("tandem.dev/v1alpha1", "DecodePool", "decode");
    if (!pool) return false;
    const json ready = findCondition((*pool)["status"], "Ready");
    return ready.is_object() && ready["status"] == "True";
  })) << get("tandem.dev/v1alpha1", "DecodePool", "decode")->dump();

  // The router routes to every pool of the namespace, which it finds by
  // label itself: its status names them.
  ASSERT_TRUE(waitUntil([&] {
    auto router = deployment("front");
    if (!router) return false;
    const json args = (*router)["spec"]["template"]["spec"]["containers"][0]["args"];
    return std::find(args.begin(), args.end(), "--all-pools") != args.end();
  }));
  ASSERT_TRUE(waitUntil([&] {
    auto router = get("tandem.dev/v1alpha1", "Router", "front");
    return router && (*router)["status"].is_object() &&
           (*router)["status"].value("decodePools", json()) == json::array({"decode"});
  }));
  // A pool added later changes no argument: the routers are not rolled.
  const json router_spec = (*deployment("front"))["spec"];
  server_.put(decodePool(1, "decode-b"));
  ASSERT_TRUE(waitUntil([&] {
    auto router = get("tandem.dev/v1alpha1", "Router", "front");
    return router &&
           (*router)["status"].value("decodePools", json()) == json::array({"decode", "decode-b"});
  }));
  EXPECT_EQ((*deployment("front"))["spec"]["template"], router_spec["template"]);

  // Someone deletes the pool's Deployment: it comes back.
  server_.remove("apps/v1", "Deployment", kNamespace, "decode");
  ASSERT_TRUE(waitUntil([&] { return deployment("decode").has_value(); }));

  // Quiet again: no more writes.
  ASSERT_TRUE(waitUntil([&] {
    const uint64_t before = server_.writesBy(kToken);
    std::this_thread::sleep_for(milliseconds(300));
    return controller.queueDepth() == 0 && server_.writesBy(kToken) == before;
  }));
  const std::string metrics = controller.renderMetrics();
  EXPECT_NE(metrics.find("tandem_operator_is_leader 1"), std::string::npos);
  EXPECT_NE(
      metrics.find("tandem_operator_reconciles_total{kind=\"DecodePool\",result=\"success\"}"),
      std::string::npos);
  controller.stop();
}

}  // namespace
}  // namespace tandem::controller
