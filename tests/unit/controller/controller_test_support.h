// What the controller's tests against the in-process API server share:
// waiting for the controller's asynchronous writes, and reading the Events
// it recorded.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "operator/controller/controller.h"
#include "operator/k8s/api_client.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/test_helpers.h"

namespace tandem::controller {

// A client of `server` for namespace `ns` with the controller's token.
inline k8s::ClusterConfig testClusterConfig(const testing::ApiServer& server,
                                            const std::string& ns) {
  k8s::ClusterConfig config;
  config.server = server.url();
  config.token = "controller-token";
  config.default_namespace = ns;
  return config;
}

// A controller of namespace `ns` with test images and short backoffs.
inline ControllerOptions testControllerOptions(const std::string& ns) {
  ControllerOptions options;
  options.ns = ns;
  options.defaults.agent_image = "agent:test";
  options.defaults.operator_image = "operator:test";
  options.initial_backoff = std::chrono::milliseconds(10);
  options.max_backoff = std::chrono::milliseconds(200);
  return options;
}

// Polls until the condition holds, 30 s at most.
inline bool waitUntil(const std::function<bool()>& condition) {
  return ::tandem::testing::eventually(condition, std::chrono::seconds(30),
                                       std::chrono::milliseconds(10));
}

// The Events of namespace `ns` with `reason`, as stored.
inline std::vector<nlohmann::json> eventsWithReason(const testing::ApiServer& server,
                                                    const std::string& ns,
                                                    const std::string& reason) {
  std::vector<nlohmann::json> found;
  for (const nlohmann::json& event : server.list("v1", "Event", ns)) {
    if (event.value("reason", "") == reason) found.push_back(event);
  }
  return found;
}

}  // namespace tandem::controller
