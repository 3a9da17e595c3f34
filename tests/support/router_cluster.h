// A test fixture base: real ucx agents (prefill and decode pools) behind an
// in-process router on loopback, with a client for the router and readers of
// its metrics. Tests derive from RouterCluster and call startCluster().
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "operator/router/router.h"
#include "tests/support/ucx_agents.h"

namespace tandem::testing {

struct RouterClusterOptions {
  int prefills = 1;
  int decodes = 1;
  router::Policy policy = router::Policy::kKv;
  int64_t disagg_threshold_tokens = 16;
  int64_t max_inflight = 256;
  int64_t max_queued = 1024;
  fs::path model = tinyModelDir();
  // Every agent's --kv-transfer-config, unless kv_config_of gives one.
  std::string kv_config = ucxConfig("kv_both");
  std::function<std::optional<std::string>(bool prefill, int index)> kv_config_of;
  // The router's RouterConfig::kv_secret (signs its pull-back holds).
  std::string kv_secret;
  // The router's RouterConfig::learn_costs: off for a test asserting a
  // decision that a loaded machine's observations must not move.
  bool learn_costs = true;
  // The router's RouterConfig::upstream_timeout_s (0: its default).
  double upstream_timeout_s = 0;
  // The router's RouterConfig::max_migrations (negative: its default).
  int64_t max_migrations = -1;
  // The router's RouterConfig::migration_timeout_s (0: its default).
  double migration_timeout_s = 0;
  // The router's RouterConfig::full_queues_wait_s (negative: its default).
  double full_queues_wait_s = -1;
  // The router's RouterConfig::poll_interval_s.
  double poll_interval_s = 0.1;
  int client_read_timeout_s = 60;
  // More arguments for one agent (e.g. --simulate PROFILE), by role and index.
  std::function<std::vector<std::string>(bool prefill, int index)> agent_args;
  // Environment variables for one agent (e.g. its TZ), by role and index.
  std::function<Agent::Environment(bool prefill, int index)> agent_env;
  // The router's kv policy step-time model (RouterConfig::profile).
  std::optional<engine::StepProfile> profile;
  // RouterConfig::api_key (clients) and agent_api_key (sent to the agents).
  std::string api_key;
  std::string agent_api_key;
  // The port the router is given for an agent that listens on `port` (e.g.
  // a proxy's in front of it); by default `port`.
  std::function<int(bool prefill, int index, int port)> router_port_of;
};

class RouterCluster : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->stop(5);
  }

  // Starts the agents and the router; returns once the router is healthy and
  // sees every agent healthy (a fatal failure otherwise).
  void startCluster(const RouterClusterOptions& options) {
    router::RouterConfig config;
    config.max_inflight_requests = options.max_inflight;
    config.max_queued_requests = options.max_queued;
    config.port = 0;
    config.policy = options.policy;
    config.disagg_threshold_tokens = options.disagg_threshold_tokens;
    config.poll_interval_s = options.poll_interval_s;
    config.kv_secret = options.kv_secret;
    config.learn_costs = options.learn_costs;
    if (options.upstream_timeout_s > 0) config.upstream_timeout_s = options.upstream_timeout_s;
    if (options.max_migrations >= 0) config.max_migrations = options.max_migrations;
    if (options.migration_timeout_s > 0) config.migration_timeout_s = options.migration_timeout_s;
    if (options.full_queues_wait_s >= 0) config.full_queues_wait_s = options.full_queues_wait_s;
    config.profile = options.profile;
    config.api_key = options.api_key;
    config.api_key_exempt = {"/health", "/metrics"};
    config.agent_api_key = options.agent_api_key;
    auto args = [&](bool prefill, int index) {
      std::optional<std::string> own;
      if (options.kv_config_of) own = options.kv_config_of(prefill, index);
      std::vector<std::string> all = {"--role", prefill ? "prefill" : "decode",
                                      "--kv-transfer-config", own.value_or(options.kv_config)};
      if (options.agent_args) {
        for (std::string& arg : options.agent_args(prefill, index)) all.push_back(std::move(arg));
      }
      return all;
    };
    auto env = [&](bool prefill, int index) {
      return options.agent_env ? options.agent_env(prefill, index) : Agent::Environment{};
    };
    for (int i = 0; i < options.prefills; ++i) {
      prefill_.push_back(std::make_unique<Agent>(args(true, i), options.model, env(true, i)));
      config.prefill.push_back({"prefill-" + std::to_string(i), "127.0.0.1",
                                routerPort(options, true, i, prefill_[i]->port())});
    }
    for (int i = 0; i < options.decodes; ++i) {
      decode_.push_back(std::make_unique<Agent>(args(false, i), options.model, env(false, i)));
      config.decode.push_back({"decode-" + std::to_string(i), "127.0.0.1",
                               routerPort(options, false, i, decode_[i]->port())});
    }
    router_ = std::make_unique<router::Router>(config);
    router_->start();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", router_->port());
    client_->set_read_timeout(options.client_read_timeout_s, 0);
    ASSERT_TRUE(eventually([&] {
      auto res = client_->Get("/health");
      return res && res->status == 200 && allHealthy();
    })) << "the router never became ready";
  }

  static int routerPort(const RouterClusterOptions& options, bool prefill, int index, int port) {
    return options.router_port_of ? options.router_port_of(prefill, index, port) : port;
  }

  // The router reports every agent healthy.
  bool allHealthy() {
    const std::string text = routerMetrics();
    if (text.empty()) return false;
    for (const auto& name : agentNames()) {
      if (prometheusSample(text, "tandem_router_agent_healthy", "agent=\"" + name + "\"")
              .value_or(0) != 1) {
        return false;
      }
    }
    return true;
  }
  std::vector<std::string> agentNames() const {
    std::vector<std::string> names;
    for (size_t i = 0; i < prefill_.size(); ++i) names.push_back("prefill-" + std::to_string(i));
    for (size_t i = 0; i < decode_.size(); ++i) names.push_back("decode-" + std::to_string(i));
    return names;
  }
  std::vector<Agent*> agents() const {
    std::vector<Agent*> all;
    for (const auto& agent : prefill_) all.push_back(agent.get());
    for (const auto& agent : decode_) all.push_back(agent.get());
    return all;
  }
  // The router's /metrics text ("" when it does not answer), on a client of
  // its own: callable while a request on client_ is in flight (a client
  // sends one request at a time).
  std::string routerMetrics() {
    httplib::Client metrics("127.0.0.1", router_->port());
    auto res = metrics.Get("/metrics");
    return res ? res->body : "";
  }

  std::vector<std::unique_ptr<Agent>> prefill_, decode_;
  std::unique_ptr<router::Router> router_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace tandem::testing
