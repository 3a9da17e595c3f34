// A kubelet and an EndpointSlice controller for the test API server, for
// tests only: every Pod in the API stand-in runs as a real container
// (podman), with its own IP on a bridge network, the way a node would run
// it, and its status is written back as a kubelet writes it. With the
// Deployment stand-in in kubelet mode (ApiServer::setPodsRunByKubelet), a
// chart installed on the stand-in runs for real: the operator, the routers
// and the agents from the images, talking to each other by pod IP.
//
// What it does with a pod (from its spec, as the kubelet would):
//  - the init containers, one at a time to completion (a failed one run
//    again after the back-off, waiting CrashLoopBackOff, its exit in
//    lastState; initContainerStatuses and the Initialized condition as the
//    kubelet writes them), then the first container (sidecars are not run)
//    from
//    `image` with `imagePullPolicy` (IfNotPresent: pulled only when
//    missing; a failed pull is waiting ErrImagePull, then ImagePullBackOff),
//    `command`/`args` with $(VAR) expanded from its environment, `env` (value,
//    fieldRef metadata.name/namespace/uid, spec.nodeName,
//    spec.serviceAccountName, status.podIP, status.hostIP; secretKeyRef and
//    configMapKeyRef, a missing one being CreateContainerConfigError) and
//    envFrom, KUBERNETES_SERVICE_HOST/PORT, the security context
//    (runAsUser/runAsGroup, readOnlyRootFilesystem, capabilities,
//    allowPrivilegeEscalation, seccompProfile: RuntimeDefault is podman's
//    default filter, Unconfined none; runAsNonRoot with runAsUser 0 is
//    CreateContainerConfigError, as the kubelet says it);
//  - volumes: emptyDir (a tmpfs with medium Memory, else a fresh directory),
//    hostPath, persistentVolumeClaim (bound to a host directory the test
//    names: a PersistentVolume stand-in; an unknown claim leaves the pod
//    Pending and unschedulable, as the scheduler does), secret and
//    configMap (files), subPath and readOnly; the service-account token
//    volume at /var/run/secrets/kubernetes.io/serviceaccount (token, ca.crt,
//    namespace) unless automountServiceAccountToken is false;
//  - status: Pending until the container first starts, then Running; the
//    readiness probe (httpGet) decides Ready, checked every half second
//    until it first passes, then every periodSeconds, with its
//    failureThreshold; no probe: ready once running. A container that exits
//    is restarted with the kubelet's back-off (10 s doubling to 300 s),
//    waiting CrashLoopBackOff meanwhile, restartCount counted, and its exit in
//    lastState.terminated (the log's last 80 lines / 2048 bytes as message
//    with terminationMessagePolicy FallbackToLogsOnError);
//  - a deleted pod's container gets SIGTERM, then SIGKILL after
//    terminationGracePeriodSeconds, and is removed.
// Containers and NAT chains of runners whose process has died (a test
// killed at its timeout) are removed when a runner starts.
// The EndpointSlice controller keeps one slice per Service with a selector
// (kubernetes.io/service-name label, owned by the Service): an endpoint per
// selected pod with an IP, ready as the pod is, ports resolved by name
// against the pod's container ports. With proxy_services it also plays
// kube-proxy in iptables mode: a Service's cluster IP and port lead to one
// of its ready endpoints, chosen at random per connection, from the node
// and from the pods (DNAT rules in a nat chain of its own, jumped to from
// OUTPUT and PREROUTING, removed on destruction).
//
// Where it differs from a real node (docs/testing.md): one node, no
// scheduler (resources, GPUs, node selectors and affinity are not
// considered), no liveness or startup probes, no sidecar containers,
// no resource limits, no DNS, no Service virtual IPs (clients use pod IPs),
// NetworkPolicies not enforced.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/apiserver/api_server.h"
#include "tests/support/command.h"

namespace tandem::testing {

struct PodRunnerOptions {
  // Environment of every podman call (e.g. CONTAINERS_CONF).
  std::vector<std::pair<std::string, std::string>> engine_env;
  std::string network = "podman";  // a podman bridge network
  // Pods get the addresses ip_prefix + "2", "3", ... (inside the network's subnet).
  std::string ip_prefix;
  std::string host_ip;   // status.hostIP: the node's address on that network
  std::string api_host;  // KUBERNETES_SERVICE_HOST as the pods see the API server
  int api_port = 0;
  std::string ca_certificate;  // ca.crt of the service-account volume
  // PersistentVolumeClaim name → the host directory bound to it.
  std::map<std::string, std::filesystem::path> claims;
  std::filesystem::path work_dir;  // volumes' files (made world-readable)
  std::string node_name = "node-0";
  // Route Services' cluster IPs to their endpoints (iptables, as root).
  bool proxy_services = false;
};

class PodRunner {
 public:
  PodRunner(ApiServer& api, PodRunnerOptions options);
  ~PodRunner();  // stops watching, then removes every container it started
  PodRunner(const PodRunner&) = delete;
  PodRunner& operator=(const PodRunner&) = delete;

  // The container name of pod `name` in `ns` ("" when it runs none).
  std::string containerOf(const std::string& ns, const std::string& name) const;
  // The output of that pod's container (podman logs), for failure messages.
  std::string logs(const std::string& ns, const std::string& name) const;
  // Names of the containers this runner has on the engine now (any state).
  std::vector<std::string> containers() const;

  // Brings the EndpointSlices of every Service with a selector up to date
  // with the pods (called by the runner after each pass; public for tests).
  static void syncEndpointSlices(ApiServer& api);
  // The EndpointSlice those keep for `service`.
  static std::string endpointSliceName(const nlohmann::json& service);

  struct Pod;

 private:
  void loop();
  void pass();
  void admit(const nlohmann::json& pod);
  // Creates and starts `container` of the pod as podman container `name`;
  // false (the pod's waiting reason and back-off set) when it cannot.
  bool start(Pod& pod, const nlohmann::json& container, const std::string& name);
  void observeInit(Pod& pod, const nlohmann::json& init);
  void observe(Pod& pod, const nlohmann::json* container);
  void probe(Pod& pod);
  void writeStatus(Pod& pod);
  void stop(const Pod& pod);
  void syncServiceRules();
  void reapStale();
  CommandResult iptables(const std::vector<std::string>& args) const;
  CommandResult podman(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout = std::chrono::seconds(120)) const;

  ApiServer& api_;
  PodRunnerOptions options_;
  std::string label_;  // the label value that marks this runner's containers
  std::string chain_;  // its nat chain (proxy_services)
  std::string rules_;  // the chain's rules as last written
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Pod>> pods_;  // "ns/name" →
  int next_ip_ = 2;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::testing
