#include "operator/controller/controller_command.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "common/logging.h"
#include "common/status.h"
#include "operator/cli_number.h"
#include "operator/controller/controller.h"
#include "operator/controller/controller_metrics.h"
#include "operator/k8s/kube_config.h"

namespace tandem::controller {

CLI::App* addControllerCommand(CLI::App& app, ControllerFlags& flags) {
  CLI::App* command = app.add_subcommand(
      "controller",
      "reconcile PrefillPools, DecodePools and Routers into Deployments and Services");
  command->add_option("--kubeconfig", flags.kubeconfig,
                      "kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)");
  command->add_option("--context", flags.context, "kubeconfig context (default: current)");
  auto* ns = command->add_option("--namespace,-n", flags.ns,
                                 "namespace to watch (default: the kubeconfig's or the pod's)");
  command->add_flag("--all-namespaces,-A", flags.all_namespaces, "watch every namespace")
      ->excludes(ns);
  command->add_option("--workers", flags.workers, "reconcile worker threads")
      ->check(integerIn(1, 64))
      ->capture_default_str();
  command->add_flag("--leader-elect", flags.leader_elect,
                    "run only while holding a coordination.k8s.io Lease (for several replicas)");
  command->add_option("--leader-elect-resource-namespace", flags.leader_election_namespace,
                      "namespace of the Lease (default: the watched one, or the kubeconfig's)");
  command->add_option("--leader-elect-resource-name", flags.leader_election_id, "name of the Lease")
      ->capture_default_str();
  command
      ->add_option("--leader-elect-lease-duration", flags.lease_duration_s,
                   "seconds a candidate waits after the Lease last changed before taking it")
      ->check(positiveSeconds())
      ->capture_default_str();
  command
      ->add_option("--leader-elect-renew-deadline", flags.renew_deadline_s,
                   "seconds the leader may fail to renew before it stops leading")
      ->check(positiveSeconds())
      ->capture_default_str();
  command
      ->add_option("--leader-elect-retry-period", flags.retry_period_s,
                   "seconds between attempts to acquire or renew the Lease")
      ->check(positiveSeconds())
      ->capture_default_str();
  command
      ->add_option("--metrics-host", flags.metrics_host, "address of /metrics, /healthz, /readyz")
      ->capture_default_str();
  command->add_option("--metrics-port", flags.metrics_port, "port of /metrics (0: none)")
      ->check(integerIn(0, 65535))
      ->capture_default_str();
  command->add_option("--default-agent-image", flags.default_agent_image,
                      "agent image for pools without spec.image");
  command->add_option("--default-operator-image", flags.default_operator_image,
                      "tandem-operator image for Routers without spec.image");
  command
      ->add_option("--router-service-account", flags.router_service_account,
                   "ServiceAccount of router pods (it must read EndpointSlices)")
      ->capture_default_str();
  command
      ->add_option("--sync-timeout", flags.sync_timeout_s,
                   "seconds the first list of every watched resource may take")
      ->check(positiveSeconds())
      ->capture_default_str();
  command
      ->add_option("--planner-interval", flags.planner_interval_s,
                   "seconds between the SLA planner's rounds for pools with spec.autoscaling "
                   "(0: off)")
      ->check(numberIn(0, false, 3600))
      ->capture_default_str();
  command->add_option("--prometheus-url", flags.prometheus_url,
                      "the planner reads agents' metrics from this Prometheus (its /federate) "
                      "instead of the pods' /metrics");
  command
      ->add_option("--prometheus-pod-label", flags.prometheus_pod_label,
                   "label naming the pod on series from --prometheus-url")
      ->capture_default_str();
  return command;
}

int runController(const ControllerFlags& flags, const std::function<bool()>& stop_requested) {
  std::optional<std::filesystem::path> kubeconfig;
  if (!flags.kubeconfig.empty()) kubeconfig = flags.kubeconfig;
  std::optional<std::string> context;
  if (!flags.context.empty()) context = flags.context;
  k8s::ClusterConfig config = k8s::resolveClusterConfig(kubeconfig, context);
  TANDEM_LOG(kInfo) << "controller: API server " << config.server << " (" << config.source << ")";
  const std::string default_namespace = config.default_namespace;
  k8s::ApiClient client(std::move(config));

  ControllerOptions options;
  options.ns = flags.all_namespaces ? "" : (flags.ns.empty() ? default_namespace : flags.ns);
  options.workers = flags.workers;
  options.defaults.agent_image = flags.default_agent_image;
  options.defaults.operator_image = flags.default_operator_image;
  options.defaults.router_service_account = flags.router_service_account;
  options.leader_elect = flags.leader_elect;
  options.leader_election_namespace = !flags.leader_election_namespace.empty()
                                          ? flags.leader_election_namespace
                                      : !options.ns.empty() ? options.ns
                                                            : default_namespace;
  options.leader_election_id = flags.leader_election_id;
  if (!(flags.retry_period_s < flags.renew_deadline_s &&
        flags.renew_deadline_s < flags.lease_duration_s)) {
    throw Error(
        "--leader-elect-retry-period < --leader-elect-renew-deadline < "
        "--leader-elect-lease-duration is required, got " +
        std::to_string(flags.retry_period_s) + ", " + std::to_string(flags.renew_deadline_s) +
        ", " + std::to_string(flags.lease_duration_s));
  }
  const auto milliseconds = [](double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  };
  options.lease_duration = milliseconds(flags.lease_duration_s);
  options.renew_deadline = milliseconds(flags.renew_deadline_s);
  options.retry_period = milliseconds(flags.retry_period_s);
  options.planner_interval = milliseconds(flags.planner_interval_s);
  if (!flags.prometheus_url.empty()) {
    if (!flags.prometheus_url.starts_with("http://") &&
        !flags.prometheus_url.starts_with("https://")) {
      throw Error("--prometheus-url must start with http:// or https://, got " +
                  flags.prometheus_url);
    }
    options.planner_metrics =
        prometheusFederationSource(flags.prometheus_url, flags.prometheus_pod_label);
  }
  const std::string watched = options.ns.empty() ? "<all>" : options.ns;
  Controller controller(client, std::move(options));
  std::unique_ptr<MetricsServer> metrics;
  if (flags.metrics_port != 0) {
    metrics = std::make_unique<MetricsServer>(
        flags.metrics_host, flags.metrics_port,
        [&controller] { return controller.renderMetrics(); },
        [&controller] { return controller.synced(); });
    TANDEM_LOG(kInfo) << "controller: metrics on " << flags.metrics_host << ":" << metrics->port();
  }
  controller.start();
  const auto sync_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(flags.sync_timeout_s * 1000));
  while (!controller.waitForSync(std::chrono::milliseconds(100))) {
    if (stop_requested()) {
      controller.stop();
      return 0;
    }
    if (std::chrono::steady_clock::now() > sync_deadline) {
      controller.stop();
      throw Error("the controller's caches did not sync within --sync-timeout (" +
                  std::to_string(flags.sync_timeout_s) +
                  " s): are the CRDs installed (kubectl apply -f crds/) and may it list them?");
    }
  }
  std::printf("controller started (namespace %s)\n", watched.c_str());
  std::fflush(stdout);
  while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  TANDEM_LOG(kInfo) << "controller: stopping";
  controller.stop();
  metrics.reset();
  return 0;
}

}  // namespace tandem::controller
