#include "operator/controller/workload_status.h"

#include <algorithm>
#include <set>

namespace tandem::controller {
namespace {

using nlohmann::json;

int64_t integerAt(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number_integer()) return 0;
  return object[key].get<int64_t>();
}

std::string podName(const json& pod) {
  return pod.contains("metadata") ? pod["metadata"].value("name", "?") : "?";
}

// The last non-empty line of `text`, at most 300 bytes (its end).
std::string lastLine(const std::string& text) {
  size_t end = text.find_last_not_of(" \n\r\t");
  if (end == std::string::npos) return "";
  const size_t start = text.rfind('\n', end);
  std::string line = text.substr(start == std::string::npos ? 0 : start + 1,
                                 end + 1 - (start == std::string::npos ? 0 : start + 1));
  return line.size() > 300 ? line.substr(line.size() - 300) : line;
}

// Why a pod cannot run, as (reason, message), or nullopt.
std::optional<std::pair<std::string, std::string>> podProblem(const json& pod) {
  static const std::set<std::string> kWaitingReasons = {
      "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"};
  if (!pod.contains("status") || !pod["status"].is_object()) return std::nullopt;
  const json& status = pod["status"];
  for (const char* list : {"initContainerStatuses", "containerStatuses"}) {
    if (!status.contains(list) || !status[list].is_array()) continue;
    for (const json& container : status[list]) {
      if (!container.contains("state") || !container["state"].contains("waiting")) continue;
      const json& waiting = container["state"]["waiting"];
      const std::string reason = waiting.value("reason", "");
      if (kWaitingReasons.count(reason) == 0) continue;
      std::string message =
          "pod " + podName(pod) + ": container " + container.value("name", "?") + ": " + reason;
      const std::string detail = waiting.value("message", "");
      if (!detail.empty()) message += ": " + detail;
      // A crash loop's cause: the last exit, and its last words (the
      // container's termination message, or its log's end with
      // terminationMessagePolicy FallbackToLogsOnError).
      const json last = container.value("lastState", json::object()).value("terminated", json());
      if (reason == "CrashLoopBackOff" && last.is_object()) {
        message += "; last exit " + std::to_string(integerAt(last, "exitCode"));
        const std::string words = lastLine(last.value("message", ""));
        if (!words.empty()) message += ": " + words;
      }
      return std::make_pair(reason, message);
    }
  }
  if (status.contains("conditions") && status["conditions"].is_array()) {
    for (const json& condition : status["conditions"]) {
      if (condition.value("type", "") == "PodScheduled" &&
          condition.value("status", "") == "False" &&
          condition.value("reason", "") == "Unschedulable") {
        std::string message = "pod " + podName(pod) + " is unschedulable";
        const std::string detail = condition.value("message", "");
        if (!detail.empty()) message += ": " + detail;
        return std::make_pair(std::string("Unschedulable"), message);
      }
    }
  }
  return std::nullopt;
}

// The Deployment's own failure conditions, as (reason, message), or nullopt.
std::optional<std::pair<std::string, std::string>> deploymentProblem(const json& deployment) {
  if (!deployment.contains("status") || !deployment["status"].contains("conditions")) {
    return std::nullopt;
  }
  const std::string name =
      deployment.contains("metadata") ? deployment["metadata"].value("name", "?") : "?";
  for (const json& condition : deployment["status"]["conditions"]) {
    const std::string type = condition.value("type", "");
    const std::string status = condition.value("status", "");
    const std::string reason = condition.value("reason", "");
    const std::string detail = condition.value("message", "");
    if (type == "ReplicaFailure" && status == "True") {
      return std::make_pair(std::string("ReplicaFailure"),
                            "Deployment " + name + ": " + (detail.empty() ? reason : detail));
    }
    if (type == "Progressing" && status == "False" && reason == "ProgressDeadlineExceeded") {
      return std::make_pair(reason,
                            "Deployment " + name + ": " + (detail.empty() ? reason : detail));
    }
  }
  return std::nullopt;
}

json condition(const std::string& type, bool status, const std::string& reason,
               const std::string& message, int64_t observed_generation) {
  return {{"type", type},
          {"status", status ? "True" : "False"},
          {"observedGeneration", observed_generation},
          {"reason", reason},
          {"message", message}};
}

// `updated` with lastTransitionTime from `previous` when the status is unchanged.
json withTransitionTime(json updated, const json& previous, const std::string& now) {
  const json old = findCondition(previous, updated["type"].get<std::string>());
  if (old.is_object() && old.value("status", "") == updated["status"] &&
      old.contains("lastTransitionTime")) {
    updated["lastTransitionTime"] = old["lastTransitionTime"];
  } else {
    updated["lastTransitionTime"] = now;
  }
  return updated;
}

// The ModelReady condition from the pods' init container `model.init_container`.
json modelCondition(const ModelObservation& model, const std::vector<json>& pods,
                    int64_t generation) {
  if (model.init_container.empty()) {
    return condition("ModelReady", true, "Mounted",
                     model.source + " is mounted in the agents' pods: nothing to fetch",
                     generation);
  }
  std::optional<std::string> failed, fetched, fetching;
  for (const json& pod : pods) {  // sorted by name
    const json status = pod.value("status", json::object());
    const json statuses = status.value("initContainerStatuses", json::array());
    if (!statuses.is_array()) continue;
    for (const json& container : statuses) {
      if (container.value("name", "") != model.init_container) continue;
      const json state = container.value("state", json::object());
      json terminated = state.value("terminated", json());
      if (!terminated.is_object() && state.contains("waiting") &&
          state["waiting"].value("reason", "") == "CrashLoopBackOff") {
        terminated = container.value("lastState", json::object()).value("terminated", json());
      }
      if (terminated.is_object() && integerAt(terminated, "exitCode") != 0) {
        if (!failed) {
          std::string words = lastLine(terminated.value("message", ""));
          if (words.empty()) words = "exit " + std::to_string(integerAt(terminated, "exitCode"));
          failed = "pod " + podName(pod) + ": " + model.init_container + ": " + words;
        }
      } else if (terminated.is_object()) {
        if (!fetched) fetched = podName(pod);
      } else if (state.contains("running") && !fetching) {
        fetching = "pod " + podName(pod) + " is fetching " + model.source + " since " +
                   state["running"].value("startedAt", "?");
      }
    }
  }
  if (failed) return condition("ModelReady", false, "FetchFailed", *failed, generation);
  if (fetched) {
    return condition("ModelReady", true, "Fetched",
                     model.source + " is in place (pod " + *fetched + ")", generation);
  }
  if (fetching) return condition("ModelReady", false, "Fetching", *fetching, generation);
  return condition("ModelReady", false, "Pending",
                   "no pod has started fetching " + model.source + " yet", generation);
}

}  // namespace

json findCondition(const json& status, const std::string& type) {
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array()) {
    return nullptr;
  }
  for (const json& item : status["conditions"]) {
    if (item.value("type", "") == type) return item;
  }
  return nullptr;
}

json computeWorkloadStatus(const json& previous, const WorkloadObservation& observation,
                           const std::string& now) {
  json status = previous.is_object() ? previous : json::object();
  const int64_t desired = observation.desired_replicas;
  int64_t replicas = 0;
  int64_t updated = 0;
  int64_t ready = 0;
  bool deployment_observed = false;
  if (observation.deployment) {
    const json& deployment = *observation.deployment;
    const json deployment_status =
        deployment.contains("status") ? deployment["status"] : json::object();
    replicas = integerAt(deployment_status, "replicas");
    updated = integerAt(deployment_status, "updatedReplicas");
    ready = integerAt(deployment_status, "readyReplicas");
    const int64_t generation =
        deployment.contains("metadata") ? integerAt(deployment["metadata"], "generation") : 0;
    deployment_observed = integerAt(deployment_status, "observedGeneration") >= generation;
  }
  status["replicas"] = replicas;
  status["readyReplicas"] = ready;
  status["updatedReplicas"] = updated;
  status["selector"] = observation.selector;
  if (observation.spec_applied) status["observedGeneration"] = observation.generation;
  const int64_t observed_generation = status.value("observedGeneration", int64_t{0});
  const bool spec_current = observed_generation == observation.generation;

  // Progressing: some replica may still run an older spec.
  std::string progressing_reason;
  std::string progressing_message;
  // No Deployment of ours because the reconcile failed (an invalid spec, a
  // foreign Deployment holding the name): nothing is on its way.
  const bool blocked = !observation.deployment && observation.failure.has_value();
  if (blocked) {
  } else if (!observation.deployment) {
    progressing_reason = "DeploymentMissing";
    progressing_message = "the Deployment does not exist yet";
  } else if (!spec_current) {
    progressing_reason = "SpecNotApplied";
    progressing_message = "generation " + std::to_string(observation.generation) +
                          " is not applied to the Deployment yet";
  } else if (!deployment_observed) {
    progressing_reason = "RolloutPending";
    progressing_message = "the Deployment controller has not observed the new spec yet";
  } else if (updated < desired) {
    progressing_reason = "RollingOut";
    progressing_message = std::to_string(updated) + " of " + std::to_string(desired) +
                          " replicas run the current spec";
  } else if (replicas > updated) {
    progressing_reason = "RollingOut";
    progressing_message = std::to_string(replicas - updated) + " replicas of an older spec remain";
  }
  const bool progressing = !progressing_reason.empty();
  json conditions = json::array();
  conditions.push_back(
      condition("Progressing", progressing,
                progressing ? progressing_reason
                : blocked   ? "Blocked"
                            : "RolloutComplete",
                progressing ? progressing_message
                : blocked   ? "no Deployment is written while the failure in Degraded (" +
                                observation.failure->first + ") stands"
                          : "all " + std::to_string(desired) + " replicas run the current spec",
                observation.generation));

  const bool all_ready =
      !blocked && !progressing && updated == desired && ready == desired && replicas == desired;
  std::string ready_message =
      std::to_string(ready) + " of " + std::to_string(desired) + " replicas ready";
  conditions.insert(conditions.begin(), condition("Ready", all_ready,
                                                  all_ready     ? "AllReplicasReady"
                                                  : progressing ? "RolloutInProgress"
                                                                : "ReplicasNotReady",
                                                  ready_message, observation.generation));

  std::optional<std::pair<std::string, std::string>> problem = observation.failure;
  std::vector<json> pods = observation.pods;
  std::sort(pods.begin(), pods.end(),
            [](const json& a, const json& b) { return podName(a) < podName(b); });
  for (const json& pod : pods) {
    if (problem) break;
    problem = podProblem(pod);
  }
  if (!problem && observation.deployment) problem = deploymentProblem(*observation.deployment);
  conditions.push_back(
      condition("Degraded", problem.has_value(), problem ? problem->first : "AsExpected",
                problem ? problem->second : "no failure seen", observation.generation));
  if (observation.model) {
    status["servedModel"] = observation.model->served_name;
    status["modelSource"] = observation.model->source;
    conditions.push_back(modelCondition(*observation.model, pods, observation.generation));
  }
  for (const json& item : observation.planner_conditions) conditions.push_back(item);

  for (json& item : conditions) item = withTransitionTime(std::move(item), previous, now);
  status["conditions"] = std::move(conditions);
  return status;
}

}  // namespace tandem::controller
