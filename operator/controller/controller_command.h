// `tandem-operator controller`: the Kubernetes controller as a process.
//
//   tandem-operator controller [--kubeconfig F] [--namespace NS | --all-namespaces]
//       [--leader-elect] [--metrics-port 8080] [--workers 2] ...
//
// It prints "controller started" on stdout once its caches are synced and,
// with --leader-elect, "leading" whenever it becomes the leader; it stops
// (releasing the Lease) when `stop_requested` turns true.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace tandem::controller {

struct ControllerFlags {
  std::string kubeconfig;  // empty: $KUBECONFIG, in-cluster, ~/.kube/config
  std::string context;
  std::string ns;  // empty: the kubeconfig's (or the pod's) namespace
  bool all_namespaces = false;
  int workers = 2;
  bool leader_elect = false;
  // The Lease (kube-controller-manager's flag names and client-go's defaults).
  std::string leader_election_namespace;  // empty: the namespace watched, else the config's
  std::string leader_election_id = "tandem-operator";
  double lease_duration_s = 15;
  double renew_deadline_s = 10;
  double retry_period_s = 2;
  std::string metrics_host = "0.0.0.0";
  int metrics_port = 8080;  // 0: no metrics server
  std::string default_agent_image;
  std::string default_operator_image;
  std::string router_service_account = "tandem-router";
  double sync_timeout_s = 120;
  double planner_interval_s = 15;  // 0: the SLA planner is off
  std::string prometheus_url;      // empty: the planner scrapes the pods
  std::string prometheus_pod_label = "pod";
};

CLI::App* addControllerCommand(CLI::App& app, ControllerFlags& flags);

// Runs until stop_requested() returns true (polled every 100 ms); returns the
// exit status. Throws tandem::Error on a start-up failure (configuration,
// metrics port, caches that never sync).
int runController(const ControllerFlags& flags, const std::function<bool()>& stop_requested);

}  // namespace tandem::controller
