// `tandem-operator router --discover` against the test API server: the router
// finds real agents through their pools' EndpointSlices, sends work to every
// ready one, stops sending to an endpoint that turns not ready, and takes up
// an agent whose slice appears later. Its agent list is read from /metrics.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/prometheus_text.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/ucx_agents.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary
using std::chrono::seconds;
using tandem::prometheusSample;

// A slice of Service `service` holding one agent on 127.0.0.1, its port
// named "http"; `role`: the tandem.dev/role label the EndpointSlice
// controller copies from a pool's Service.
json sliceFor(const std::string& name, const std::string& service, const std::string& pod, int port,
              bool ready = true, const std::string& role = "") {
  json labels = {{"kubernetes.io/service-name", service}};
  if (!role.empty()) labels["tandem.dev/role"] = role;
  return {{"apiVersion", "discovery.k8s.io/v1"},
          {"kind", "EndpointSlice"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
          {"addressType", "IPv4"},
          {"endpoints",
           {{{"addresses", {"127.0.0.1"}},
             {"conditions", {{"ready", ready}, {"serving", ready}, {"terminating", false}}},
             {"targetRef", {{"kind", "Pod"}, {"namespace", "default"}, {"name", pod}}}}}},
          {"ports", {{{"name", "http"}, {"port", port}, {"protocol", "TCP"}}}}};
}

class RouterDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "default"}}}});
    kubeconfig_ = server_.writeKubeconfig(dir_.path() / "kubeconfig");
  }
  void TearDown() override {
    if (router_) {
      router_->signal(SIGTERM);
      EXPECT_EQ(router_->wait(seconds(30)), 0) << router_->stderrText();
    }
  }

  static std::unique_ptr<Agent> startAgent(const std::string& role) {
    return std::make_unique<Agent>(
        std::vector<std::string>{"--role", role, "--kv-transfer-config", ucxConfig("kv_both")});
  }

  // The pools named, or (`all_pools`) every pool found by label.
  void startRouter(bool all_pools = false) {
    std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-operator",
                                     "router",
                                     "--discover",
                                     "--kubeconfig",
                                     kubeconfig_.string(),
                                     "--namespace",
                                     "default",
                                     "--port",
                                     "0",
                                     "--policy",
                                     "round_robin",
                                     "--poll-interval",
                                     "0.1"};
    if (all_pools) {
      argv.push_back("--all-pools");
    } else {
      argv.insert(argv.end(), {"--prefill-pool", "prefill", "--decode-pool", "decode"});
    }
    router_ = std::make_unique<ChildProcess>(argv, dir_.path() / "router.stderr");
    const std::string line = router_->waitForLine("router listening on ", seconds(60));
    ASSERT_FALSE(line.empty()) << "the router did not start: " << router_->stderrText();
    client_ =
        std::make_unique<httplib::Client>("127.0.0.1", std::stoi(line.substr(line.rfind(':') + 1)));
    client_->set_read_timeout(60, 0);
  }

  std::string routerMetrics() {
    auto res = client_->Get("/metrics");
    return res && res->status == 200 ? res->body : "";
  }
  double metric(const std::string& text, const std::string& name, const std::string& labels) {
    return prometheusSample(text, name, labels).value_or(-1);
  }
  // The router lists exactly these agents per role, each healthy.
  bool routerHas(const std::vector<std::string>& prefill, const std::vector<std::string>& decode) {
    const std::string text = routerMetrics();
    if (metric(text, "tandem_router_agents", "role=\"prefill\"") != double(prefill.size()) ||
        metric(text, "tandem_router_agents", "role=\"decode\"") != double(decode.size())) {
      return false;
    }
    for (const auto* names : {&prefill, &decode}) {
      for (const std::string& name : *names) {
        if (metric(text, "tandem_router_agent_healthy", "agent=\"" + name + "\"") != 1) {
          return false;
        }
      }
    }
    return true;
  }

  // Requests the agent finished (each is given max_tokens and ignores EOS).
  static double finished(const Agent& agent) {
    return agent.metric("tandem_requests_total", "finish_reason=\"length\"");
  }
  static bool finishedAre(const Agent& agent, double expected) {
    return eventually([&] { return finished(agent) == expected; }, seconds(10));
  }

  struct Served {
    std::string prefill_agent, decode_agent, decision;
  };
  // One greedy completion through the router; fails the test unless it is served.
  Served complete(uint32_t seed) {
    Served served;
    auto res = client_->Post("/v1/completions", greedy(randomPrompt(40, seed), 4).dump(),
                             "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer") << "\n"
                                           << router_->stderrText();
    if (!res || res->status != 200) return served;
    EXPECT_EQ(tokenIds(json::parse(res->body)).size(), 4u);
    served.prefill_agent = res->get_header_value("x-tandem-prefill-agent");
    served.decode_agent = res->get_header_value("x-tandem-decode-agent");
    served.decision = res->get_header_value("x-tandem-decision");
    return served;
  }

  ApiServer server_;
  TempDir dir_{"tandem-router-discovery-test"};
  fs::path kubeconfig_;
  std::unique_ptr<ChildProcess> router_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(RouterDiscoveryTest, FollowsTheReadyEndpointsOfThePools) {
  auto decode_a = startAgent("decode");
  auto decode_b = startAgent("decode");
  // Two agents of one Service on different ports: two slices.
  server_.put(sliceFor("decode-s1", "decode", "decode-a", decode_a->port()));
  server_.put(sliceFor("decode-s2", "decode", "decode-b", decode_b->port()));
  ASSERT_NO_FATAL_FAILURE(startRouter());
  ASSERT_TRUE(eventually(
      [&] {
        return routerHas({}, {"decode-a", "decode-b"});
      },
      seconds(60)))
      << routerMetrics() << router_->stderrText();

  // Both are used (round robin), and each agent really served requests.
  std::multiset<std::string> decoded;
  for (uint32_t seed = 1; seed <= 4; ++seed) decoded.insert(complete(seed).decode_agent);
  EXPECT_EQ(decoded.count("decode-a"), 2u);
  EXPECT_EQ(decoded.count("decode-b"), 2u);
  EXPECT_TRUE(finishedAre(*decode_a, 2)) << finished(*decode_a);
  EXPECT_TRUE(finishedAre(*decode_b, 2)) << finished(*decode_b);

  // decode-b's endpoint turns not ready: it gets no more work.
  server_.put(sliceFor("decode-s2", "decode", "decode-b", decode_b->port(), false));
  ASSERT_TRUE(eventually([&] { return routerHas({}, {"decode-a"}); }, seconds(30)))
      << routerMetrics();
  EXPECT_EQ(metric(routerMetrics(), "tandem_router_agent_healthy", "agent=\"decode-b\""), -1)
      << "a removed agent keeps its series";
  for (uint32_t seed = 11; seed <= 14; ++seed) EXPECT_EQ(complete(seed).decode_agent, "decode-a");
  EXPECT_TRUE(finishedAre(*decode_a, 6)) << finished(*decode_a);
  EXPECT_EQ(finished(*decode_b), 2);

  // A prefill agent's slice appears: requests are split across it and decode-a.
  auto prefill_c = startAgent("prefill");
  server_.put(sliceFor("prefill-s1", "prefill", "prefill-c", prefill_c->port()));
  ASSERT_TRUE(eventually([&] { return routerHas({"prefill-c"}, {"decode-a"}); }, seconds(60)))
      << routerMetrics();
  for (uint32_t seed = 21; seed <= 22; ++seed) {
    const Served served = complete(seed);
    EXPECT_EQ(served.decision, "disaggregated");
    EXPECT_EQ(served.prefill_agent, "prefill-c");
    EXPECT_EQ(served.decode_agent, "decode-a");
  }
  EXPECT_TRUE(finishedAre(*decode_a, 8)) << finished(*decode_a);
  EXPECT_TRUE(finishedAre(*prefill_c, 2)) << finished(*prefill_c);
  EXPECT_EQ(finished(*decode_b), 2);

  // Each change of the agent set was logged.
  const std::string log = router_->stderrText();
  const std::string a = "decode-a=127.0.0.1:" + std::to_string(decode_a->port());
  const std::string b = "decode-b=127.0.0.1:" + std::to_string(decode_b->port());
  const std::string c = "prefill-c=127.0.0.1:" + std::to_string(prefill_c->port());
  EXPECT_NE(log.find("router: agents now prefill [] decode [" + a + ", " + b + "]"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("router: agents now prefill [] decode [" + a + "]"), std::string::npos) << log;
  EXPECT_NE(log.find("router: agents now prefill [" + c + "] decode [" + a + "]"),
            std::string::npos)
      << log;
}

// --all-pools: every Service labelled as a pool's, whatever its name, and
// pools that appear later; other Services' slices are not agents.
TEST_F(RouterDiscoveryTest, AllPoolsFindsEveryPoolByItsRoleLabel) {
  auto decode_a = startAgent("decode");
  auto prefill_b = startAgent("prefill");
  server_.put(sliceFor("decode-x-s1", "decode-x", "decode-a", decode_a->port(), true, "decode"));
  // A Service that is no pool's (a router's, say): never an agent.
  server_.put(sliceFor("front-s1", "front", "front-0", decode_a->port(), true));
  ASSERT_NO_FATAL_FAILURE(startRouter(/*all_pools=*/true));
  ASSERT_TRUE(eventually([&] { return routerHas({}, {"decode-a"}); }, seconds(60)))
      << routerMetrics() << router_->stderrText();
  // A prefill pool created after the router started.
  server_.put(
      sliceFor("prefill-y-s1", "prefill-y", "prefill-b", prefill_b->port(), true, "prefill"));
  ASSERT_TRUE(eventually([&] { return routerHas({"prefill-b"}, {"decode-a"}); }, seconds(60)))
      << routerMetrics();
  const Served served = complete(31);
  EXPECT_EQ(served.decision, "disaggregated");
  EXPECT_EQ(served.prefill_agent, "prefill-b");
  EXPECT_EQ(served.decode_agent, "decode-a");
}

TEST_F(RouterDiscoveryTest, DiscoveryFlagsAreChecked) {
  const std::string binary = std::string(TANDEM_BIN_DIR) + "/tandem-operator";
  auto refused = [&](std::vector<std::string> flags) {
    flags.insert(flags.begin(), {binary, "router", "--port", "0"});
    ChildProcess op(flags, dir_.path() / "bad.stderr");
    EXPECT_EQ(op.wait(seconds(30)), 1);
    return op.stderrText();
  };
  EXPECT_EQ(refused({"--discover", "--kubeconfig", kubeconfig_.string(), "--prefill-pool", "p"}),
            "tandem-operator: --discover needs at least one --decode-pool, or --all-pools\n");
  EXPECT_EQ(refused({"--discover", "--kubeconfig", kubeconfig_.string(), "--all-pools",
                     "--decode-pool", "d"}),
            "tandem-operator: --all-pools finds every pool itself: drop --prefill-pool and "
            "--decode-pool\n");
  EXPECT_EQ(refused({"--discover", "--kubeconfig", kubeconfig_.string(), "--prefill-pool", "p",
                     "--decode-pool", "d", "--decode", "127.0.0.1:9"}),
            "tandem-operator: --discover finds the agents itself: drop --prefill/--decode (and "
            "the Router document's agent lists)\n");
  EXPECT_EQ(refused({"--prefill-pool", "p", "--decode", "127.0.0.1:9"}),
            "tandem-operator: --prefill-pool, --decode-pool, --all-pools, --namespace and "
            "--kubeconfig need --discover\n");
  EXPECT_EQ(refused({"--discover", "--kubeconfig", kubeconfig_.string(), "--prefill-pool", "x",
                     "--decode-pool", "x"}),
            "tandem-operator: pool x is named as both a prefill and a decode pool\n");
}

}  // namespace
