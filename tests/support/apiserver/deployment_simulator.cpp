#include "tests/support/apiserver/deployment_simulator.h"

#include <algorithm>
#include <functional>

#include "tests/support/apiserver/pod_security.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

std::string templateHash(const Json& pod_template) {
  static const char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  size_t value = std::hash<std::string>{}(pod_template.dump());
  std::string hash;
  for (int i = 0; i < 10; ++i) {
    hash.push_back(kAlphabet[value % 27]);
    value /= 27;
  }
  return hash;
}

bool podReady(const Json& pod) {
  for (const Json& condition :
       pod.value("status", Json::object()).value("conditions", Json::array())) {
    if (condition.value("type", "") == "Ready") return condition.value("status", "") == "True";
  }
  return false;
}

Json condition(const std::string& type, bool status, const std::string& reason,
               const std::string& message) {
  std::string now = nowTimestamp();
  return {{"type", type},          {"status", status ? "True" : "False"},
          {"reason", reason},      {"message", message},
          {"lastUpdateTime", now}, {"lastTransitionTime", now}};
}

}  // namespace

DeploymentSimulator::DeploymentSimulator(ObjectService& service, Store& store,
                                         KindRegistry& registry)
    : service_(service), store_(store), registry_(registry) {}

void DeploymentSimulator::setAuto(bool ready) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto_ = true;
    ready_ = ready;
    manual_.clear();
  }
  std::optional<KindInfo> kind = registry_.byKind("apps/v1", "Deployment");
  for (const Json& deployment : store_.list(resourceKey(*kind), "").items) {
    reconcile(deployment, ready);
  }
}

void DeploymentSimulator::onSpecChange(const Json& deployment) {
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Json& metadata = deployment["metadata"];
    std::string key = metadata.value("namespace", "") + "/" + metadata.value("name", "");
    if (!auto_ || manual_.count(key) > 0) return;
    ready = ready_;
  }
  reconcile(deployment, ready);
}

void DeploymentSimulator::reconcile(const Json& deployment, bool ready) {
  const Json& metadata = deployment["metadata"];
  const std::string ns = metadata.value("namespace", "");
  const std::string name = metadata.value("name", "");
  const std::string uid = metadata.value("uid", "");
  const Json spec = deployment.value("spec", Json::object());
  const int64_t replicas = spec.value("replicas", int64_t{1});
  const Json pod_template = spec.value("template", Json::object());
  const std::string hash = templateHash(pod_template);

  std::optional<KindInfo> pod_kind = registry_.byKind("v1", "Pod");
  for (const Json& pod : store_.list(resourceKey(*pod_kind), ns).items) {
    const Json& pod_metadata = pod["metadata"];
    bool owned = false;
    for (const Json& ref : pod_metadata.value("ownerReferences", Json::array())) {
      owned = owned || ref.value("uid", "") == uid;
    }
    if (!owned) continue;
    std::string pod_name = pod_metadata.value("name", "");
    bool current = false;
    for (int64_t i = 0; i < replicas; ++i) {
      current = current || pod_name == name + "-" + hash + "-" + std::to_string(i);
    }
    if (!current) service_.remove(*pod_kind, ns, pod_name, nullptr, false);
  }
  Json labels = pod_template.value("metadata", Json::object()).value("labels", Json::object());
  labels["pod-template-hash"] = hash;
  int64_t schedulable = replicas;
  std::function<std::string(const std::string&, const std::string&)> pod_ips;
  bool kubelet = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto room = schedulable_.find(ns + "/" + name);
    if (room != schedulable_.end()) schedulable = std::min(replicas, room->second);
    pod_ips = pod_ips_;
    kubelet = kubelet_;
  }
  // New pods pass Pod Security Admission as the ReplicaSet controller's
  // creates would (with the template's annotations, which the plugin reads).
  std::optional<KindInfo> namespace_kind = registry_.byKind("v1", "Namespace");
  const std::optional<Json> namespace_object = store_.get(resourceKey(*namespace_kind), "", ns);
  const Json template_annotations =
      pod_template.value("metadata", Json::object()).value("annotations", Json::object());
  std::string create_failure;  // the first refusal's message
  int64_t created = 0;         // current pods that exist (were not refused)
  int64_t created_scheduled = 0;
  int64_t kubelet_ready = 0;  // pods the kubelet reports Ready
  for (int64_t i = 0; i < replicas; ++i) {
    const std::string pod_name = name + "-" + hash + "-" + std::to_string(i);
    std::optional<Json> existing = store_.get(resourceKey(*pod_kind), ns, pod_name);
    const bool scheduled = i < schedulable;
    if (!existing) {
      Json candidate = {{"metadata",
                         {{"name", pod_name},
                          {"namespace", ns},
                          {"labels", labels},
                          {"annotations", template_annotations}}},
                        {"spec", pod_template.value("spec", Json::object())}};
      PodSecurityDecision admission = admitPod(candidate, namespace_object);
      if (admission.error) {
        if (create_failure.empty()) create_failure = admission.error->message;
        continue;
      }
    }
    ++created;
    if (scheduled) ++created_scheduled;
    Json status;
    if (kubelet && existing) {
      // Its status is the kubelet's.
      if (podReady(*existing)) ++kubelet_ready;
      continue;
    }
    if (kubelet && scheduled) {
      status = {{"phase", "Pending"},
                {"conditions", Json::array({{{"type", "PodScheduled"},
                                             {"status", "True"},
                                             {"lastTransitionTime", nowTimestamp()}}})}};
    } else if (scheduled) {
      std::string ip = "10.244.0." + std::to_string(i % 250 + 2);
      if (existing && existing->value("status", Json::object()).contains("podIP")) {
        ip = (*existing)["status"]["podIP"];
      } else if (pod_ips) {
        ip = pod_ips(ns, pod_name);
      }
      status = {
          {"phase", "Running"},
          {"podIP", ip},
          {"conditions", Json::array({{{"type", "PodScheduled"}, {"status", "True"}},
                                      {{"type", "Ready"}, {"status", ready ? "True" : "False"}}})}};
    } else {
      // Pending since it was first found unschedulable: its time is kept.
      if (existing && existing->value("status", Json::object()).value("phase", "") == "Pending") {
        continue;
      }
      status = {{"phase", "Pending"},
                {"conditions", Json::array({{{"type", "PodScheduled"},
                                             {"status", "False"},
                                             {"reason", "Unschedulable"},
                                             {"lastTransitionTime", nowTimestamp()},
                                             {"message",
                                              "0/1 nodes are available: 1 Insufficient "
                                              "nvidia.com/gpu. preemption: 0/1 nodes are "
                                              "available: 1 No preemption victims found for "
                                              "incoming pod."}}})}};
    }
    Json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", pod_name},
                  {"namespace", ns},
                  {"labels", labels},
                  {"ownerReferences", Json::array({{{"apiVersion", "apps/v1"},
                                                    {"kind", "Deployment"},
                                                    {"name", name},
                                                    {"uid", uid},
                                                    {"controller", true},
                                                    {"blockOwnerDeletion", true}}})}}},
                {"spec", pod_template.value("spec", Json::object())},
                {"status", status}};
    if (existing && existing->value("status", Json::object()) == pod["status"]) continue;
    service_.put(pod);
  }
  // Refused pods are not there: they count neither as replicas nor as ready.
  Json status = {{"observedGeneration", metadata.value("generation", int64_t{1})}};
  if (replicas > 0) {
    if (created > 0) {
      status["replicas"] = created;
      status["updatedReplicas"] = created;
    }
    const int64_t running = kubelet ? kubelet_ready : ready ? created_scheduled : 0;
    if (running > 0) {
      status["readyReplicas"] = running;
      status["availableReplicas"] = running;
    }
    if (running < replicas) status["unavailableReplicas"] = replicas - running;
  }
  const bool refused = !create_failure.empty();
  bool available =
      !refused && ((kubelet ? kubelet_ready == replicas : ready && created_scheduled == replicas) ||
                   replicas == 0);
  const std::string replica_set = name + "-" + hash;
  status["conditions"] = Json::array(
      {condition("Available", available,
                 available ? "MinimumReplicasAvailable" : "MinimumReplicasUnavailable",
                 available ? "Deployment has minimum availability."
                           : "Deployment does not have minimum availability."),
       refused ? condition("Progressing", true, "NewReplicaSetCreated",
                           "Created new replica set \"" + replica_set + "\"")
               : condition("Progressing", true, "NewReplicaSetAvailable",
                           "ReplicaSet \"" + replica_set + "\" has successfully progressed.")});
  if (refused) {
    // The ReplicaSet controller's condition, which the Deployment controller copies.
    status["conditions"].push_back(
        condition("ReplicaFailure", true, "FailedCreate", create_failure));
  }
  std::optional<Json> latest =
      store_.get(resourceKey(*registry_.byKind("apps/v1", "Deployment")), ns, name);
  if (!latest) return;
  Json updated = *latest;
  updated["status"] = status;
  service_.put(updated);
}

bool DeploymentSimulator::setStatus(const std::string& ns, const std::string& name,
                                    int64_t replicas, int64_t updated, int64_t ready) {
  std::optional<KindInfo> kind = registry_.byKind("apps/v1", "Deployment");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    manual_.insert(ns + "/" + name);
  }
  std::optional<Json> deployment = store_.get(resourceKey(*kind), ns, name);
  if (!deployment) return false;
  bool available = ready >= deployment->value("spec", Json::object()).value("replicas", int64_t{1});
  Json status = {{"observedGeneration", (*deployment)["metadata"].value("generation", int64_t{1})},
                 {"replicas", replicas},
                 {"updatedReplicas", updated},
                 {"readyReplicas", ready},
                 {"availableReplicas", ready}};
  status["conditions"] = Json::array({condition(
      "Available", available, available ? "MinimumReplicasAvailable" : "MinimumReplicasUnavailable",
      available ? "Deployment has minimum availability."
                : "Deployment does not have minimum availability.")});
  (*deployment)["status"] = status;
  service_.put(*deployment);
  return true;
}

void DeploymentSimulator::setSchedulableReplicas(const std::string& ns, const std::string& name,
                                                 std::optional<int64_t> pods) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pods) {
      schedulable_[ns + "/" + name] = *pods;
    } else {
      schedulable_.erase(ns + "/" + name);
    }
  }
  reconcileNamed(ns, name);
}

void DeploymentSimulator::setPodIps(
    std::function<std::string(const std::string& ns, const std::string& name)> ips) {
  std::lock_guard<std::mutex> lock(mutex_);
  pod_ips_ = std::move(ips);
}

void DeploymentSimulator::setPodsRunByKubelet() {
  std::lock_guard<std::mutex> lock(mutex_);
  kubelet_ = true;
}

void DeploymentSimulator::podStatusChanged(const Json& pod) {
  const Json& metadata = pod.at("metadata");
  for (const Json& ref : metadata.value("ownerReferences", Json::array())) {
    if (ref.value("kind", "") == "Deployment") {
      reconcileNamed(metadata.value("namespace", ""), ref.value("name", ""));
    }
  }
}

void DeploymentSimulator::reconcileNamed(const std::string& ns, const std::string& name) {
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!auto_ || manual_.count(ns + "/" + name) > 0) return;
    ready = ready_;
  }
  std::optional<KindInfo> kind = registry_.byKind("apps/v1", "Deployment");
  if (std::optional<Json> deployment = store_.get(resourceKey(*kind), ns, name)) {
    reconcile(*deployment, ready);
  }
}

}  // namespace tandem::testing
