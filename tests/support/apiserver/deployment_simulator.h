// Plays the Deployment controller and the kubelet for tests: when automatic
// mode is on, every Deployment whose spec changes gets the status a finished
// rollout has (all replicas updated; ready and available when `ready`) and
// Pods named <deployment>-<template hash>-<i> with the template's labels, a
// pod-template-hash label, an ownerReference to the Deployment, phase
// Running and a Ready condition. Pods of older templates or beyond
// spec.replicas are deleted. ReplicaSets are not simulated: Pods are owned
// by the Deployment directly.
//
// Deployments given a status with setStatus() are left alone by automatic
// mode until setAuto() is called again.
//
// Scheduling: setSchedulableReplicas() gives a Deployment room for only so
// many pods (as a node pool without capacity left): its pods from that index
// on are Pending with condition PodScheduled False, reason Unschedulable
// (the scheduler's wording), no IP and not ready, and the Deployment counts
// only the others as ready. Pod IPs are 10.244.0.<i + 2> unless an IP
// function is set (e.g. loopback addresses where a test runs the pods'
// processes).
//
// With a kubelet stand-in (setPodsRunByKubelet), this plays the Deployment
// controller only: new pods are created Pending (PodScheduled True, no IP),
// the kubelet writes their status from then on, and a Deployment's ready
// replicas are its current pods whose Ready condition is True.
//
// Pod Security Admission (pod_security.h): each new pod is checked against
// its namespace's enforce level before it is created, as the ReplicaSet
// controller's create would be. A refused pod is not created (it is tried
// again at the next reconcile) and counts neither in status.replicas nor as
// ready; the Deployment is then not Available, Progressing says
// NewReplicaSetCreated, and a condition ReplicaFailure True, reason
// FailedCreate, carries the API server's message
// (pods "<pod>" is forbidden: violates PodSecurity "restricted:latest": ...).
// Pods of an older template are still deleted at once (no rolling update).
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "tests/support/apiserver/object_service.h"

namespace tandem::testing {

class DeploymentSimulator {
 public:
  DeploymentSimulator(ObjectService& service, Store& store, KindRegistry& registry);

  // Turns automatic mode on (ready or not), forgets manual statuses and
  // brings every Deployment to that state now.
  void setAuto(bool ready);
  // Called by the object service after a Deployment's creation or spec change.
  void onSpecChange(const nlohmann::json& deployment);
  // Sets one Deployment's status fields; false when it does not exist.
  bool setStatus(const std::string& ns, const std::string& name, int64_t replicas, int64_t updated,
                 int64_t ready);
  // At most `pods` of the Deployment's pods are scheduled (nullopt: all);
  // applied at once.
  void setSchedulableReplicas(const std::string& ns, const std::string& name,
                              std::optional<int64_t> pods);
  // The IP of pod `name` in `ns` (called when the pod is created).
  void setPodIps(std::function<std::string(const std::string& ns, const std::string& name)> ips);
  // Pods' status comes from a kubelet stand-in from now on (see above).
  void setPodsRunByKubelet();
  // Called after the kubelet wrote `pod`'s status: its Deployment's status follows.
  void podStatusChanged(const nlohmann::json& pod);

 private:
  void reconcile(const nlohmann::json& deployment, bool ready);
  void reconcileNamed(const std::string& ns, const std::string& name);

  ObjectService& service_;
  Store& store_;
  KindRegistry& registry_;
  std::mutex mutex_;
  bool auto_ = false;
  bool ready_ = false;
  bool kubelet_ = false;
  std::set<std::string> manual_;                // "ns/name"
  std::map<std::string, int64_t> schedulable_;  // "ns/name" → pods with room
  std::function<std::string(const std::string&, const std::string&)> pod_ips_;
};

}  // namespace tandem::testing
