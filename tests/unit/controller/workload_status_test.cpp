// Status that does not lie: Ready only when every replica runs the current
// spec and is ready, Progressing while any may not, Degraded naming the pod.
#include "operator/controller/workload_status.h"

#include <gtest/gtest.h>

namespace tandem::controller {
namespace {

using nlohmann::json;

json deploymentWith(int64_t generation, int64_t observed, int64_t replicas, int64_t updated,
                    int64_t ready) {
  return {{"metadata", {{"name", "decode"}, {"generation", generation}}},
          {"status",
           {{"observedGeneration", observed},
            {"replicas", replicas},
            {"updatedReplicas", updated},
            {"readyReplicas", ready}}}};
}

WorkloadObservation observation(json deployment, int64_t desired = 3) {
  WorkloadObservation value;
  value.generation = 4;
  value.desired_replicas = desired;
  value.spec_applied = true;
  value.deployment = std::move(deployment);
  value.selector = "tandem.dev/pool=decode,tandem.dev/role=decode";
  return value;
}

std::string conditionStatus(const json& status, const std::string& type) {
  return findCondition(status, type).value("status", "absent");
}

TEST(WorkloadStatusTest, MidRolloutIsProgressingAndNotReady) {
  // 4 pods: 2 of the new template, 2 old; 3 ready.
  const json status =
      computeWorkloadStatus(nullptr, observation(deploymentWith(2, 2, 4, 2, 3)), "T1");
  EXPECT_EQ(status["replicas"], 4);
  EXPECT_EQ(status["updatedReplicas"], 2);
  EXPECT_EQ(status["readyReplicas"], 3);
  EXPECT_EQ(status["observedGeneration"], 4);
  EXPECT_EQ(status["selector"], "tandem.dev/pool=decode,tandem.dev/role=decode");
  EXPECT_EQ(conditionStatus(status, "Progressing"), "True");
  EXPECT_EQ(findCondition(status, "Progressing")["reason"], "RollingOut");
  EXPECT_EQ(findCondition(status, "Progressing")["message"],
            "2 of 3 replicas run the current spec");
  EXPECT_EQ(conditionStatus(status, "Ready"), "False");
  EXPECT_EQ(conditionStatus(status, "Degraded"), "False");
  EXPECT_EQ(findCondition(status, "Degraded")["reason"], "AsExpected");
}

TEST(WorkloadStatusTest, OldReplicasLeftOverAreStillProgressing) {
  const json status =
      computeWorkloadStatus(nullptr, observation(deploymentWith(2, 2, 4, 3, 4)), "T1");
  EXPECT_EQ(conditionStatus(status, "Progressing"), "True");
  EXPECT_EQ(conditionStatus(status, "Ready"), "False");
}

TEST(WorkloadStatusTest, UnobservedDeploymentGenerationIsProgressing) {
  // Counts look complete, but the Deployment controller has not seen generation 3.
  const json status =
      computeWorkloadStatus(nullptr, observation(deploymentWith(3, 2, 3, 3, 3)), "T1");
  EXPECT_EQ(conditionStatus(status, "Progressing"), "True");
  EXPECT_EQ(findCondition(status, "Progressing")["reason"], "RolloutPending");
  EXPECT_EQ(conditionStatus(status, "Ready"), "False");
}

TEST(WorkloadStatusTest, SpecNotAppliedKeepsTheOldObservedGeneration) {
  WorkloadObservation seen = observation(deploymentWith(2, 2, 3, 3, 3));
  seen.spec_applied = false;
  const json previous = {{"observedGeneration", 3}};
  const json status = computeWorkloadStatus(previous, seen, "T1");
  EXPECT_EQ(status["observedGeneration"], 3);
  EXPECT_EQ(findCondition(status, "Progressing")["reason"], "SpecNotApplied");
  EXPECT_EQ(conditionStatus(status, "Ready"), "False");
}

TEST(WorkloadStatusTest, AllUpdatedAndReadyIsReady) {
  const json status =
      computeWorkloadStatus(nullptr, observation(deploymentWith(2, 2, 3, 3, 3)), "T1");
  EXPECT_EQ(conditionStatus(status, "Ready"), "True");
  EXPECT_EQ(findCondition(status, "Ready")["reason"], "AllReplicasReady");
  EXPECT_EQ(findCondition(status, "Ready")["observedGeneration"], 4);
  EXPECT_EQ(conditionStatus(status, "Progressing"), "False");
  EXPECT_EQ(findCondition(status, "Ready")["lastTransitionTime"], "T1");
}

TEST(WorkloadStatusTest, UpdatedButNotReadyIsNeitherReadyNorProgressing) {
  const json status =
      computeWorkloadStatus(nullptr, observation(deploymentWith(2, 2, 3, 3, 1)), "T1");
  EXPECT_EQ(conditionStatus(status, "Ready"), "False");
  EXPECT_EQ(findCondition(status, "Ready")["reason"], "ReplicasNotReady");
  EXPECT_EQ(conditionStatus(status, "Progressing"), "False");
}

TEST(WorkloadStatusTest, CrashLoopingPodIsDegradedNamingThePod) {
  WorkloadObservation seen = observation(deploymentWith(2, 2, 3, 3, 2));
  seen.pods.push_back(json::parse(R"({"metadata":{"name":"decode-7d9f-abcde"},
    "status":{"containerStatuses":[{"name":"agent","state":{"waiting":{
      "reason":"CrashLoopBackOff","message":"back-off 5m0s restarting failed container"}}}]}})"));
  seen.pods.push_back(json::parse(R"({"metadata":{"name":"decode-7d9f-zzzzz"},
    "status":{"containerStatuses":[{"name":"agent","state":{"running":{}}}]}})"));
  const json status = computeWorkloadStatus(nullptr, seen, "T1");
  const json degraded = findCondition(status, "Degraded");
  EXPECT_EQ(degraded["status"], "True");
  EXPECT_EQ(degraded["reason"], "CrashLoopBackOff");
  EXPECT_EQ(degraded["message"],
            "pod decode-7d9f-abcde: container agent: CrashLoopBackOff: back-off 5m0s restarting "
            "failed container");
}

// With terminationMessagePolicy FallbackToLogsOnError the kubelet keeps the
// end of the log as the last exit's message: its last line says why.
TEST(WorkloadStatusTest, CrashLoopingPodGivesItsLastExitAndLastWords) {
  WorkloadObservation seen = observation(deploymentWith(1, 1, 1, 1, 0));
  seen.pods.push_back(json::parse(R"({"metadata":{"name":"prefill-x"},
    "status":{"containerStatuses":[{"name":"agent",
      "state":{"waiting":{"reason":"CrashLoopBackOff","message":"back-off 10s restarting"}},
      "lastState":{"terminated":{"exitCode":1,"reason":"Error",
        "message":"I 10:00:00 loading\nE 10:00:01 model /models/x: no config.json\n\n"}}}]}})"));
  const json degraded = findCondition(computeWorkloadStatus(nullptr, seen, "T1"), "Degraded");
  EXPECT_EQ(degraded["message"],
            "pod prefill-x: container agent: CrashLoopBackOff: back-off 10s restarting; last exit "
            "1: E 10:00:01 model /models/x: no config.json");
}

TEST(WorkloadStatusTest, UnschedulablePodAndDeploymentFailuresAreDegraded) {
  WorkloadObservation seen = observation(deploymentWith(2, 2, 3, 3, 2));
  seen.pods.push_back(json::parse(R"({"metadata":{"name":"decode-x"},"status":{"conditions":[
    {"type":"PodScheduled","status":"False","reason":"Unschedulable",
     "message":"0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}})"));
  json degraded = findCondition(computeWorkloadStatus(nullptr, seen, "T1"), "Degraded");
  EXPECT_EQ(degraded["reason"], "Unschedulable");
  EXPECT_EQ(degraded["message"],
            "pod decode-x is unschedulable: 0/4 nodes are available: 4 Insufficient "
            "nvidia.com/gpu.");

  WorkloadObservation stuck = observation(deploymentWith(2, 2, 3, 3, 2));
  (*stuck.deployment)["status"]["conditions"] = json::parse(
      R"([{"type":"Progressing","status":"False","reason":"ProgressDeadlineExceeded",
           "message":"ReplicaSet \"decode-7d9f\" has timed out progressing."}])");
  degraded = findCondition(computeWorkloadStatus(nullptr, stuck, "T1"), "Degraded");
  EXPECT_EQ(degraded["reason"], "ProgressDeadlineExceeded");
  EXPECT_NE(degraded["message"].get<std::string>().find("timed out"), std::string::npos);

  WorkloadObservation conflict = observation(nullptr);
  conflict.deployment.reset();
  conflict.spec_applied = false;
  conflict.failure = std::make_pair("NameConflict", "Deployment decode exists");
  const json conflicted = computeWorkloadStatus(nullptr, conflict, "T1");
  degraded = findCondition(conflicted, "Degraded");
  EXPECT_EQ(degraded["reason"], "NameConflict");
  EXPECT_EQ(degraded["message"], "Deployment decode exists");
  // Nothing is on its way while the failure stands: not "does not exist yet".
  const json progressing = findCondition(conflicted, "Progressing");
  EXPECT_EQ(progressing["status"], "False");
  EXPECT_EQ(progressing["reason"], "Blocked");
  EXPECT_EQ(progressing["message"],
            "no Deployment is written while the failure in Degraded (NameConflict) stands");
  EXPECT_EQ(findCondition(conflicted, "Ready")["reason"], "ReplicasNotReady");
  // Not ready either with no replica wanted: there is no Deployment.
  conflict.desired_replicas = 0;
  const json scaled_to_zero = computeWorkloadStatus(nullptr, conflict, "T1");
  EXPECT_EQ(findCondition(scaled_to_zero, "Ready")["status"], "False");
  EXPECT_EQ(findCondition(scaled_to_zero, "Progressing")["reason"], "Blocked");
}

TEST(WorkloadStatusTest, LastTransitionTimeIsKeptUntilTheStatusChanges) {
  const json first =
      computeWorkloadStatus(nullptr, observation(deploymentWith(2, 2, 4, 2, 3)), "T1");
  // Still progressing, with other counts: the times stay.
  const json second =
      computeWorkloadStatus(first, observation(deploymentWith(2, 2, 4, 3, 3)), "T2");
  for (const char* type : {"Ready", "Progressing", "Degraded"}) {
    EXPECT_EQ(findCondition(second, type)["lastTransitionTime"], "T1") << type;
  }
  // Done: Ready and Progressing flip and take the new time; Degraded stays.
  const json third =
      computeWorkloadStatus(second, observation(deploymentWith(2, 2, 3, 3, 3)), "T3");
  EXPECT_EQ(findCondition(third, "Ready")["lastTransitionTime"], "T3");
  EXPECT_EQ(findCondition(third, "Progressing")["lastTransitionTime"], "T3");
  EXPECT_EQ(findCondition(third, "Degraded")["lastTransitionTime"], "T1");
  // The same observation again gives the very same status (no write needed).
  EXPECT_EQ(computeWorkloadStatus(third, observation(deploymentWith(2, 2, 3, 3, 3)), "T4"), third);
}

// ModelReady follows the pods' model-fetch init container: Pending before
// any runs, Fetching while one does, FetchFailed with the fetch's own message
// (its termination log), Fetched once one finished.
TEST(WorkloadStatusTest, ModelReadyFollowsTheFetchInitContainer) {
  WorkloadObservation seen = observation(deploymentWith(1, 1, 2, 2, 0), 2);
  seen.model = ModelObservation{"org/m", "hf://org/m@main", "model-fetch"};
  json status = computeWorkloadStatus(nullptr, seen, "T1");
  EXPECT_EQ(status["servedModel"], "org/m");
  EXPECT_EQ(status["modelSource"], "hf://org/m@main");
  json ready = findCondition(status, "ModelReady");
  EXPECT_EQ(ready["status"], "False");
  EXPECT_EQ(ready["reason"], "Pending");

  seen.pods = {json::parse(R"({"metadata":{"name":"decode-b"},"status":{"initContainerStatuses":[
      {"name":"model-fetch","state":{"running":{"startedAt":"2026-11-29T10:00:00Z"}}}]}})")};
  ready = findCondition(computeWorkloadStatus(nullptr, seen, "T2"), "ModelReady");
  EXPECT_EQ(ready["reason"], "Fetching");
  EXPECT_EQ(ready["message"],
            "pod decode-b is fetching hf://org/m@main since 2026-11-29T10:00:00Z");

  seen.pods.push_back(json::parse(R"({"metadata":{"name":"decode-a"},"status":{
      "initContainerStatuses":[{"name":"model-fetch",
        "state":{"waiting":{"reason":"CrashLoopBackOff"}},
        "lastState":{"terminated":{"exitCode":1,"message":
          "hf://org/m@main: model.safetensors: the SHA-256 of the downloaded bytes is 00, the Hub lists ff; the file was removed"}}}]}})"));
  ready = findCondition(computeWorkloadStatus(nullptr, seen, "T3"), "ModelReady");
  EXPECT_EQ(ready["status"], "False");
  EXPECT_EQ(ready["reason"], "FetchFailed");
  EXPECT_EQ(ready["message"],
            "pod decode-a: model-fetch: hf://org/m@main: model.safetensors: the SHA-256 of the "
            "downloaded bytes is 00, the Hub lists ff; the file was removed");

  seen.pods = {json::parse(R"({"metadata":{"name":"decode-a"},"status":{"initContainerStatuses":[
      {"name":"model-fetch","state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}})")};
  ready = findCondition(computeWorkloadStatus(nullptr, seen, "T4"), "ModelReady");
  EXPECT_EQ(ready["status"], "True");
  EXPECT_EQ(ready["reason"], "Fetched");
  EXPECT_EQ(ready["message"], "hf://org/m@main is in place (pod decode-a)");
}

TEST(WorkloadStatusTest, AMountedModelIsReadyAndARouterHasNoModelCondition) {
  WorkloadObservation seen = observation(deploymentWith(1, 1, 1, 1, 1), 1);
  seen.model = ModelObservation{"m", "pvc://models/m", ""};
  json ready = findCondition(computeWorkloadStatus(nullptr, seen, "T1"), "ModelReady");
  EXPECT_EQ(ready["status"], "True");
  EXPECT_EQ(ready["reason"], "Mounted");
  seen.model.reset();
  EXPECT_TRUE(findCondition(computeWorkloadStatus(nullptr, seen, "T1"), "ModelReady").is_null());
}

}  // namespace
}  // namespace tandem::controller
