// In-cluster discovery of agents: the router's prefill and decode agents are
// the ready endpoints of the pools' Services, read from their
// discovery.k8s.io/v1 EndpointSlices.
//
// agentsFromEndpointSlices() is the pure part: slices in, agents out. A slice
// belongs to the pool named by its label kubernetes.io/service-name; each of
// its endpoints that is ready (conditions.ready absent or true, as the
// EndpointSlice API defines it) and not terminating gives one agent: its
// first address (the API calls a slice's addresses fungible; IPv4 and IPv6,
// FQDN slices are skipped), the slice's port named "http" or its only port,
// and the name of its targetRef (the pod), or "HOST:PORT" ("[HOST]:PORT" for
// IPv6) when it has none. Agents are the union over all slices of a pool, one
// per name (a pod in both an IPv4 and an IPv6 slice is taken once, IPv4
// first), sorted by name.
//
// EndpointDiscovery runs an Informer on the slices of the given pools in one
// namespace and calls `on_change` with the whole agent set whenever it
// differs from the last one reported (once after the first list when that
// finds agents). A restarted pod shows up as a new name or a new address,
// both of which Router::setAgents treats as a new agent. `on_change` runs on
// the informer's thread; it must not call stop().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "operator/router/router.h"

namespace tandem::k8s {
class ApiClient;
class Informer;
}  // namespace tandem::k8s

namespace tandem::router {

struct DiscoveredAgents {
  std::vector<AgentEndpoint> prefill;
  std::vector<AgentEndpoint> decode;
  bool operator==(const DiscoveredAgents&) const = default;
};

// What to discover: the Services (pools) whose endpoints are prefill agents
// and those whose endpoints are decode agents; or, `by_label`, every pool of
// the namespace: the slices labelled tandem.dev/role prefill or decode (the
// EndpointSlice controller copies a Service's labels to its slices, and the
// controller labels the pools' Services so), whatever their names, so that
// adding or deleting a pool needs no new router.
struct DiscoveryPools {
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
  bool by_label = false;
};

inline constexpr const char* kPoolRoleLabel = "tandem.dev/role";

struct DiscoveryResult {
  DiscoveredAgents agents;
  // Slices or endpoints that were skipped for a reason worth logging
  // ("EndpointSlice default/prefill-abc: no port named \"http\" among 2 ports").
  std::vector<std::string> problems;
};

DiscoveryResult agentsFromEndpointSlices(const std::vector<nlohmann::json>& slices,
                                         const DiscoveryPools& pools);

// "kubernetes.io/service-name in (a,b,c)": the label selector of the pools'
// slices (names sorted, each once); by label: "tandem.dev/role in
// (decode,prefill)".
std::string endpointSliceSelector(const DiscoveryPools& pools);

// "prefill [prefill-0=10.0.0.1:8000] decode [decode-0=10.0.0.2:8000]", for logs.
std::string describeAgents(const DiscoveredAgents& agents);

class EndpointDiscovery {
 public:
  using OnChange = std::function<void(const DiscoveredAgents&)>;

  // Throws tandem::Error when (not by label) the decode pool list is empty
  // or a pool is in both.
  EndpointDiscovery(k8s::ApiClient& client, std::string ns, DiscoveryPools pools,
                    OnChange on_change);
  ~EndpointDiscovery();  // stops
  EndpointDiscovery(const EndpointDiscovery&) = delete;
  EndpointDiscovery& operator=(const EndpointDiscovery&) = delete;

  // Starts listing and watching; returns at once.
  void start();
  void stop();
  // True once the first list has been applied.
  bool waitForSync(std::chrono::milliseconds timeout) const;
  // The agent set last reported (empty before the first report).
  DiscoveredAgents current() const;

 private:
  void recompute();

  std::string ns_;
  DiscoveryPools pools_;
  OnChange on_change_;
  mutable std::mutex mutex_;  // guards last_, last_problems_ and serializes recompute()
  DiscoveredAgents last_;
  std::vector<std::string> last_problems_;
  std::unique_ptr<k8s::Informer> informer_;
};

}  // namespace tandem::router
