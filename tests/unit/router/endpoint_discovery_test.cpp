#include "operator/router/endpoint_discovery.h"

#include <gtest/gtest.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "operator/k8s/api_client.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/test_helpers.h"

namespace tandem::router {
namespace {

using nlohmann::json;

const DiscoveryPools kPools{{"prefill"}, {"decode"}};

json port(const std::string& name, int number) {
  json p = {{"port", number}, {"protocol", "TCP"}};
  if (!name.empty()) p["name"] = name;
  return p;
}

// One endpoint; `ready` / `terminating` are left out when null.
json endpoint(const std::string& address, const std::string& pod, json ready = true,
              json terminating = nullptr) {
  json e = {{"addresses", {address}}, {"conditions", json::object()}};
  if (!ready.is_null()) e["conditions"]["ready"] = ready;
  if (!terminating.is_null()) e["conditions"]["terminating"] = terminating;
  if (!pod.empty()) {
    e["targetRef"] = {{"kind", "Pod"}, {"name", pod}, {"namespace", "default"}};
  }
  return e;
}

json slice(const std::string& name, const std::string& service, json endpoints, json ports,
           const std::string& address_type = "IPv4") {
  return {{"apiVersion", "discovery.k8s.io/v1"},
          {"kind", "EndpointSlice"},
          {"metadata",
           {{"name", name},
            {"namespace", "default"},
            {"labels", {{"kubernetes.io/service-name", service}}}}},
          {"addressType", address_type},
          {"endpoints", std::move(endpoints)},
          {"ports", std::move(ports)}};
}

std::vector<AgentEndpoint> agents(std::initializer_list<AgentEndpoint> list) { return list; }

TEST(EndpointDiscoveryTest, UnionOfSlicesPerPoolSortedByName) {
  const std::vector<json> slices = {
      slice("decode-x1", "decode", {endpoint("10.0.0.2", "decode-b")}, {port("http", 8001)}),
      slice("decode-x2", "decode", {endpoint("10.0.0.1", "decode-a")}, {port("http", 8002)}),
      slice("prefill-x1", "prefill",
            {endpoint("10.0.1.1", "prefill-a"), endpoint("10.0.1.2", "prefill-b")},
            {port("http", 8000)}),
  };
  const DiscoveryResult result = agentsFromEndpointSlices(slices, kPools);
  EXPECT_TRUE(result.problems.empty());
  EXPECT_EQ(result.agents.prefill,
            agents({{"prefill-a", "10.0.1.1", 8000}, {"prefill-b", "10.0.1.2", 8000}}));
  EXPECT_EQ(result.agents.decode,
            agents({{"decode-a", "10.0.0.1", 8002}, {"decode-b", "10.0.0.2", 8001}}));
}

TEST(EndpointDiscoveryTest, ReadinessAbsentIsReadyFalseAndTerminatingAreSkipped) {
  const std::vector<json> slices = {slice(
      "decode-x", "decode",
      {endpoint("10.0.0.1", "ready", true), endpoint("10.0.0.2", "unknown", nullptr),
       endpoint("10.0.0.3", "not-ready", false), endpoint("10.0.0.4", "terminating", true, true),
       endpoint("10.0.0.5", "staying", true, false)},
      {port("http", 8000)})};
  const DiscoveryResult result = agentsFromEndpointSlices(slices, kPools);
  EXPECT_TRUE(result.problems.empty());
  EXPECT_EQ(result.agents.decode, agents({{"ready", "10.0.0.1", 8000},
                                          {"staying", "10.0.0.5", 8000},
                                          {"unknown", "10.0.0.2", 8000}}));
  EXPECT_TRUE(result.agents.prefill.empty());
}

TEST(EndpointDiscoveryTest, PortNamedHttpOrTheOnlyPort) {
  const std::vector<json> slices = {
      slice("named", "decode", {endpoint("10.0.0.1", "a")},
            {port("metrics", 9000), port("http", 8000), port("ucx", 7000)}),
      slice("only", "decode", {endpoint("10.0.0.2", "b")}, {port("", 8100)}),
      slice("ambiguous", "decode", {endpoint("10.0.0.3", "c")},
            {port("metrics", 9000), port("grpc", 8000)}),
      slice("none", "decode", {endpoint("10.0.0.4", "d")}, json::array()),
  };
  const DiscoveryResult result = agentsFromEndpointSlices(slices, kPools);
  EXPECT_EQ(result.agents.decode, agents({{"a", "10.0.0.1", 8000}, {"b", "10.0.0.2", 8100}}));
  ASSERT_EQ(result.problems.size(), 2u);
  EXPECT_EQ(result.problems[0],
            "EndpointSlice default/ambiguous (pool decode): no port named \"http\" among 2 ports");
  EXPECT_EQ(result.problems[1],
            "EndpointSlice default/none (pool decode): no ports (expected one named \"http\")");
}

TEST(EndpointDiscoveryTest, AddressFormsAndNamesWithoutTargetRef) {
  const std::vector<json> slices = {
      slice("v6", "decode", {endpoint("fd00::5", "")}, {port("http", 8000)}, "IPv6"),
      slice("v4", "prefill", {endpoint("10.0.0.7", "")}, {port("http", 8001)}),
      slice("fqdn", "prefill", {endpoint("agent.example.com", "x")}, {port("http", 8002)}, "FQDN"),
  };
  const DiscoveryResult result = agentsFromEndpointSlices(slices, kPools);
  // The host is what a resolver takes; the name shows IPv6 in brackets.
  EXPECT_EQ(result.agents.decode, agents({{"[fd00::5]:8000", "fd00::5", 8000}}));
  EXPECT_EQ(result.agents.prefill, agents({{"10.0.0.7:8001", "10.0.0.7", 8001}}));
  ASSERT_EQ(result.problems.size(), 1u);
  EXPECT_EQ(result.problems[0],
            "EndpointSlice default/fqdn (pool prefill): addressType FQDN is not supported (IPv4 "
            "or IPv6)");
}

TEST(EndpointDiscoveryTest, FirstAddressOfAnEndpoint) {
  json e = endpoint("10.0.0.1", "a");
  e["addresses"] = {"10.0.0.1", "10.0.0.9"};
  const DiscoveryResult result =
      agentsFromEndpointSlices({slice("s", "decode", {e}, {port("http", 8000)})}, kPools);
  EXPECT_EQ(result.agents.decode, agents({{"a", "10.0.0.1", 8000}}));
}

TEST(EndpointDiscoveryTest, OneAgentPerNameIpv4First) {
  // A dual-stack Service: the same pod in an IPv6 and an IPv4 slice; and a
  // pod listed twice while it moves between slices.
  const std::vector<json> slices = {
      slice("v6", "decode", {endpoint("fd00::1", "a")}, {port("http", 8000)}, "IPv6"),
      slice("v4", "decode", {endpoint("10.0.0.1", "a")}, {port("http", 8000)}),
      slice("old", "decode", {endpoint("10.0.0.2", "b")}, {port("http", 8000)}),
      slice("new", "decode", {endpoint("10.0.0.2", "b")}, {port("http", 8000)}),
  };
  const DiscoveryResult result = agentsFromEndpointSlices(slices, kPools);
  EXPECT_TRUE(result.problems.empty());
  EXPECT_EQ(result.agents.decode, agents({{"a", "10.0.0.1", 8000}, {"b", "10.0.0.2", 8000}}));
}

TEST(EndpointDiscoveryTest, OtherServicesAndEmptySlicesAreIgnored) {
  json empty = slice("empty", "decode", nullptr, json::array());
  const std::vector<json> slices = {
      slice("web", "web", {endpoint("10.0.0.1", "web-0")}, {port("http", 80)}),
      empty,
      slice("unlabelled", "", {endpoint("10.0.0.2", "x")}, {port("http", 80)}),
  };
  const DiscoveryResult result = agentsFromEndpointSlices(slices, kPools);
  EXPECT_TRUE(result.problems.empty());
  EXPECT_TRUE(result.agents.prefill.empty());
  EXPECT_TRUE(result.agents.decode.empty());
}

TEST(EndpointDiscoveryTest, MalformedSlicesAreReportedNotThrown) {
  json bad_addresses = endpoint("10.0.0.1", "a");
  bad_addresses["addresses"] = {42};
  json bad_port = slice("bad-port", "decode", {endpoint("10.0.0.2", "b")}, {port("http", 0)});
  bad_port["ports"][0]["port"] = "eighty";
  const std::vector<json> slices = {
      slice("bad-addresses", "decode", {bad_addresses}, {port("http", 8000)}),
      bad_port,
      slice("bad-endpoints", "decode", "nope", {port("http", 8000)}),
      json("not an object"),
      json::array(),
  };
  DiscoveryResult result;
  ASSERT_NO_THROW(result = agentsFromEndpointSlices(slices, kPools));
  EXPECT_TRUE(result.agents.decode.empty());
  ASSERT_EQ(result.problems.size(), 3u);
  EXPECT_EQ(result.problems[0],
            "EndpointSlice default/bad-addresses (pool decode): endpoints[0].addresses must hold "
            "at least one address");
  EXPECT_EQ(result.problems[1],
            "EndpointSlice default/bad-port (pool decode): port must be a number between 1 and "
            "65535, got \"eighty\"");
  EXPECT_EQ(result.problems[2],
            "EndpointSlice default/bad-endpoints (pool decode): endpoints must be a list");
}

TEST(EndpointDiscoveryTest, AnAgentInBothRolesIsAPrefillAgent) {
  const DiscoveryResult result = agentsFromEndpointSlices(
      {slice("p", "prefill", {endpoint("10.0.0.1", "both")}, {port("http", 8000)}),
       slice("d", "decode", {endpoint("10.0.0.1", "both")}, {port("http", 8000)})},
      kPools);
  EXPECT_EQ(result.agents.prefill, agents({{"both", "10.0.0.1", 8000}}));
  EXPECT_TRUE(result.agents.decode.empty());
  ASSERT_EQ(result.problems.size(), 1u);
  EXPECT_EQ(result.problems[0],
            "agent both is in both a prefill and a decode pool; used for prefill only");
}

TEST(EndpointDiscoveryTest, SelectorAndDescription) {
  EXPECT_EQ(endpointSliceSelector({{"prefill-b", "prefill-a"}, {"decode", "prefill-a"}}),
            "kubernetes.io/service-name in (decode,prefill-a,prefill-b)");
  DiscoveredAgents discovered;
  discovered.prefill = {{"p", "10.0.0.1", 8000}};
  discovered.decode = {{"d", "fd00::1", 8001}, {"e", "10.0.0.3", 8002}};
  EXPECT_EQ(describeAgents(discovered),
            "prefill [p=10.0.0.1:8000] decode [d=[fd00::1]:8001, e=10.0.0.3:8002]");
}

// ---------------------------------------------------------------------------
// Against the test API server: the informer, change detection, callbacks.

class EndpointDiscoveryServerTest : public ::testing::Test {
 protected:
  EndpointDiscoveryServerTest() : client_(clusterConfig(server_)) {
    server_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "default"}}}});
  }
  static k8s::ClusterConfig clusterConfig(const testing::ApiServer& server) {
    k8s::ClusterConfig config;
    config.server = server.url();
    config.source = "endpoint discovery test";
    return config;
  }
  void record(const DiscoveredAgents& agents) {
    std::lock_guard<std::mutex> lock(mutex_);
    reports_.push_back(agents);
  }
  std::vector<DiscoveredAgents> reports() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reports_;
  }
  bool lastReportIs(const DiscoveredAgents& expected) const {
    auto all = reports();
    return !all.empty() && all.back() == expected;
  }

  testing::ApiServer server_;
  k8s::ApiClient client_;
  mutable std::mutex mutex_;
  std::vector<DiscoveredAgents> reports_;
};

TEST_F(EndpointDiscoveryServerTest, ReportsEachChangeOfTheReadySet) {
  server_.put(
      slice("decode-1", "decode", {endpoint("10.0.0.1", "decode-a")}, {port("http", 8000)}));
  server_.put(slice("web-1", "web", {endpoint("10.0.9.9", "web-0")}, {port("http", 80)}));
  EndpointDiscovery discovery(client_, "default", kPools,
                              [this](const DiscoveredAgents& agents) { record(agents); });
  discovery.start();
  ASSERT_TRUE(discovery.waitForSync(std::chrono::seconds(10)));

  DiscoveredAgents expected;
  expected.decode = {{"decode-a", "10.0.0.1", 8000}};
  ASSERT_TRUE(testing::eventually([&] { return lastReportIs(expected); }));
  EXPECT_EQ(discovery.current(), expected);

  // A second slice of the same Service adds its agent.
  server_.put(
      slice("decode-2", "decode", {endpoint("10.0.0.2", "decode-b")}, {port("http", 8001)}));
  expected.decode.push_back({"decode-b", "10.0.0.2", 8001});
  ASSERT_TRUE(testing::eventually([&] { return lastReportIs(expected); }));

  // A change that leaves the ready set as it was is not reported.
  const size_t before = reports().size();
  server_.put(slice("decode-1", "decode",
                    {endpoint("10.0.0.1", "decode-a"), endpoint("10.0.0.3", "decode-c", false)},
                    {port("http", 8000)}));
  // Not ready → ready is a change; it proves the previous event was seen.
  server_.put(slice("decode-1", "decode",
                    {endpoint("10.0.0.1", "decode-a"), endpoint("10.0.0.3", "decode-c", true)},
                    {port("http", 8000)}));
  expected.decode = {{"decode-a", "10.0.0.1", 8000},
                     {"decode-b", "10.0.0.2", 8001},
                     {"decode-c", "10.0.0.3", 8000}};
  ASSERT_TRUE(testing::eventually([&] { return lastReportIs(expected); }));
  EXPECT_EQ(reports().size(), before + 1);

  // The pod restarted under a new address: the same name, a new endpoint.
  server_.put(
      slice("decode-2", "decode", {endpoint("10.0.0.22", "decode-b")}, {port("http", 8001)}));
  expected.decode[1].host = "10.0.0.22";
  ASSERT_TRUE(testing::eventually([&] { return lastReportIs(expected); }));

  // A deleted slice takes its agents away; prefill agents appear.
  server_.remove("discovery.k8s.io/v1", "EndpointSlice", "default", "decode-1");
  server_.put(
      slice("prefill-1", "prefill", {endpoint("10.0.1.1", "prefill-a")}, {port("http", 8000)}));
  expected.decode = {{"decode-b", "10.0.0.22", 8001}};
  expected.prefill = {{"prefill-a", "10.0.1.1", 8000}};
  ASSERT_TRUE(testing::eventually([&] { return lastReportIs(expected); }));

  // The informer asked only for the pools' slices.
  bool selected = false;
  for (const std::string& line : server_.requestLog()) {
    if (line.find("/endpointslices?") != std::string::npos &&
        line.find("labelSelector=kubernetes.io") != std::string::npos &&
        line.find("service-name") != std::string::npos) {
      selected = true;
    }
  }
  EXPECT_TRUE(selected) << "no EndpointSlice request with the pools' label selector";
  discovery.stop();
}

TEST_F(EndpointDiscoveryServerTest, PoolsAreChecked) {
  auto ignore = [](const DiscoveredAgents&) {};
  try {
    EndpointDiscovery discovery(client_, "default", {{"prefill"}, {}}, ignore);
    FAIL() << "no decode pool was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "agent discovery needs at least one decode pool");
  }
  try {
    EndpointDiscovery discovery(client_, "default", {{"a", "b"}, {"b"}}, ignore);
    FAIL() << "a pool in both roles was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "pool b is named as both a prefill and a decode pool");
  }
}

}  // namespace
}  // namespace tandem::router
