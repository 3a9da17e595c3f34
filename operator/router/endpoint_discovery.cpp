#include "operator/router/endpoint_discovery.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "common/logging.h"
#include "common/status.h"
#include "operator/k8s/api_client.h"
#include "operator/k8s/informer.h"
#include "operator/k8s/resource.h"

namespace tandem::router {
namespace {

using nlohmann::json;

constexpr const char* kServiceNameLabel = "kubernetes.io/service-name";

// `object[key]` when `object` is an object holding it, else null.
const json& member(const json& object, const char* key) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string stringMember(const json& object, const char* key) {
  const json& value = member(object, key);
  return value.is_string() ? value.get<std::string>() : std::string();
}

// "NS/NAME" of a slice, for messages.
std::string sliceName(const json& slice) {
  const json& metadata = member(slice, "metadata");
  std::string ns = stringMember(metadata, "namespace");
  std::string name = stringMember(metadata, "name");
  if (name.empty()) name = "(unnamed)";
  return "EndpointSlice " + (ns.empty() ? name : ns + "/" + name);
}

// The slice's port to reach an agent on: the one named "http", else the only
// one. nullopt (and a problem) when there is none to choose.
std::optional<int> agentPort(const json& slice, const std::string& where,
                             std::vector<std::string>& problems) {
  const json& ports = member(slice, "ports");
  if (!ports.is_array() || ports.empty()) {
    problems.push_back(where + ": no ports (expected one named \"http\")");
    return std::nullopt;
  }
  const json* chosen = nullptr;
  for (const json& port : ports) {
    if (stringMember(port, "name") == "http") chosen = &port;
  }
  if (chosen == nullptr && ports.size() == 1) chosen = &ports[0];
  if (chosen == nullptr) {
    problems.push_back(where + ": no port named \"http\" among " + std::to_string(ports.size()) +
                       " ports");
    return std::nullopt;
  }
  const std::string protocol = stringMember(*chosen, "protocol");
  if (!protocol.empty() && protocol != "TCP") {
    problems.push_back(where + ": port protocol is " + protocol + ", expected TCP");
    return std::nullopt;
  }
  const json& number = member(*chosen, "port");
  if (!number.is_number_integer() || number.get<int64_t>() < 1 || number.get<int64_t>() > 65535) {
    problems.push_back(where + ": port must be a number between 1 and 65535, got " + number.dump());
    return std::nullopt;
  }
  return number.get<int>();
}

// Ready per the EndpointSlice API: conditions.ready absent (unknown) counts
// as ready; terminating endpoints take no new work.
bool readyForWork(const json& endpoint) {
  const json& conditions = member(endpoint, "conditions");
  const json& ready = member(conditions, "ready");
  if (ready.is_boolean() && !ready.get<bool>()) return false;
  const json& terminating = member(conditions, "terminating");
  return !(terminating.is_boolean() && terminating.get<bool>());
}

std::string hostPort(const std::string& host, int port, bool ipv6) {
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

struct Candidate {
  AgentEndpoint endpoint;
  bool ipv6 = false;
};

// Whether `a` is the one to keep when two slices name the same agent.
bool preferred(const Candidate& a, const Candidate& b) {
  if (a.ipv6 != b.ipv6) return !a.ipv6;
  return std::tie(a.endpoint.host, a.endpoint.port) < std::tie(b.endpoint.host, b.endpoint.port);
}

void addCandidate(std::map<std::string, Candidate>& agents, Candidate candidate) {
  auto [it, inserted] = agents.emplace(candidate.endpoint.name, candidate);
  if (!inserted && preferred(candidate, it->second)) it->second = std::move(candidate);
}

std::vector<AgentEndpoint> sortedEndpoints(const std::map<std::string, Candidate>& agents) {
  std::vector<AgentEndpoint> endpoints;
  endpoints.reserve(agents.size());
  for (const auto& [name, candidate] : agents) endpoints.push_back(candidate.endpoint);
  return endpoints;
}

std::string describeList(const std::vector<AgentEndpoint>& endpoints) {
  std::string text = "[";
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const AgentEndpoint& endpoint = endpoints[i];
    if (i > 0) text += ", ";
    const bool ipv6 = endpoint.host.find(':') != std::string::npos;
    text += endpoint.name + "=" + hostPort(endpoint.host, endpoint.port, ipv6);
  }
  return text + "]";
}

}  // namespace

DiscoveryResult agentsFromEndpointSlices(const std::vector<json>& slices,
                                         const DiscoveryPools& pools) {
  const std::set<std::string> prefill_pools(pools.prefill.begin(), pools.prefill.end());
  const std::set<std::string> decode_pools(pools.decode.begin(), pools.decode.end());
  DiscoveryResult result;
  std::map<std::string, Candidate> prefill, decode;
  for (const json& slice : slices) {
    const json& labels = member(member(slice, "metadata"), "labels");
    const std::string service = stringMember(labels, kServiceNameLabel);
    bool is_prefill = false;
    if (pools.by_label) {
      const std::string role = stringMember(labels, kPoolRoleLabel);
      is_prefill = role == "prefill";
      if (!is_prefill && role != "decode") continue;  // not a pool's
    } else {
      is_prefill = prefill_pools.count(service) > 0;
      if (!is_prefill && decode_pools.count(service) == 0) continue;  // not one of ours
    }
    const std::string where = sliceName(slice) + " (pool " + service + ")";
    const std::string address_type = stringMember(slice, "addressType");
    if (address_type != "IPv4" && address_type != "IPv6") {
      result.problems.push_back(where + ": addressType " +
                                (address_type.empty() ? "missing" : address_type) +
                                " is not supported (IPv4 or IPv6)");
      continue;
    }
    const json& endpoints = member(slice, "endpoints");
    if (endpoints.is_null()) continue;  // a Service with no endpoints yet
    const std::optional<int> port = agentPort(slice, where, result.problems);
    if (!port) continue;
    if (!endpoints.is_array()) {
      result.problems.push_back(where + ": endpoints must be a list");
      continue;
    }
    const bool ipv6 = address_type == "IPv6";
    for (size_t i = 0; i < endpoints.size(); ++i) {
      const json& endpoint = endpoints[i];
      if (!readyForWork(endpoint)) continue;
      const json& addresses = member(endpoint, "addresses");
      if (!addresses.is_array() || addresses.empty() || !addresses[0].is_string() ||
          addresses[0].get<std::string>().empty()) {
        result.problems.push_back(where + ": endpoints[" + std::to_string(i) +
                                  "].addresses must hold at least one address");
        continue;
      }
      Candidate candidate;
      candidate.ipv6 = ipv6;
      candidate.endpoint.host = addresses[0].get<std::string>();
      candidate.endpoint.port = *port;
      candidate.endpoint.name = stringMember(member(endpoint, "targetRef"), "name");
      if (candidate.endpoint.name.empty()) {
        candidate.endpoint.name = hostPort(candidate.endpoint.host, *port, ipv6);
      }
      addCandidate(is_prefill ? prefill : decode, std::move(candidate));
    }
  }
  // The router knows an agent by its name: one serving both roles would be
  // ambiguous, so it stays a prefill agent.
  for (auto it = decode.begin(); it != decode.end();) {
    if (prefill.count(it->first) > 0) {
      result.problems.push_back("agent " + it->first +
                                " is in both a prefill and a decode pool; used for prefill only");
      it = decode.erase(it);
    } else {
      ++it;
    }
  }
  result.agents.prefill = sortedEndpoints(prefill);
  result.agents.decode = sortedEndpoints(decode);
  return result;
}

std::string endpointSliceSelector(const DiscoveryPools& pools) {
  if (pools.by_label) return std::string(kPoolRoleLabel) + " in (decode,prefill)";
  std::set<std::string> names(pools.prefill.begin(), pools.prefill.end());
  names.insert(pools.decode.begin(), pools.decode.end());
  std::string selector = std::string(kServiceNameLabel) + " in (";
  bool first = true;
  for (const std::string& name : names) {
    if (!first) selector += ",";
    selector += name;
    first = false;
  }
  return selector + ")";
}

std::string describeAgents(const DiscoveredAgents& agents) {
  return "prefill " + describeList(agents.prefill) + " decode " + describeList(agents.decode);
}

EndpointDiscovery::EndpointDiscovery(k8s::ApiClient& client, std::string ns, DiscoveryPools pools,
                                     OnChange on_change)
    : ns_(std::move(ns)), pools_(std::move(pools)), on_change_(std::move(on_change)) {
  // Without prefill pools every prompt is prefilled on a decode agent, as in local mode.
  if (!pools_.by_label && pools_.decode.empty()) {
    throw Error("agent discovery needs at least one decode pool");
  }
  for (const std::string& name : pools_.prefill) {
    if (std::find(pools_.decode.begin(), pools_.decode.end(), name) != pools_.decode.end()) {
      throw Error("pool " + name + " is named as both a prefill and a decode pool");
    }
  }
  k8s::InformerOptions options;
  options.ns = ns_;
  options.label_selector = endpointSliceSelector(pools_);
  informer_ =
      std::make_unique<k8s::Informer>(client, k8s::resources::kEndpointSlices, std::move(options),
                                      [this](k8s::EventType, const json&) { recompute(); });
}

EndpointDiscovery::~EndpointDiscovery() { stop(); }

void EndpointDiscovery::start() {
  TANDEM_LOG(kInfo) << "router: discovering agents from EndpointSlices in namespace " << ns_ << " ("
                    << endpointSliceSelector(pools_) << ")";
  informer_->start();
}

void EndpointDiscovery::stop() { informer_->stop(); }

bool EndpointDiscovery::waitForSync(std::chrono::milliseconds timeout) const {
  return informer_->waitForSync(timeout);
}

DiscoveredAgents EndpointDiscovery::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

void EndpointDiscovery::recompute() {
  DiscoveryResult result = agentsFromEndpointSlices(informer_->list(), pools_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (result.problems != last_problems_) {
      for (const std::string& problem : result.problems) {
        TANDEM_LOG(kWarn) << "router: discovery: " << problem;
      }
      last_problems_ = result.problems;
    }
    if (result.agents == last_) return;
    last_ = result.agents;
  }
  TANDEM_LOG(kInfo) << "router: agents now " << describeAgents(result.agents);
  on_change_(result.agents);
}

}  // namespace tandem::router
