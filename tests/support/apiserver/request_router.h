// The HTTP face of the test API server: authenticates each request, logs
// it, authorizes it (RBAC, when enabled), and answers discovery, OpenAPI and resource paths
// (/api/v1/..., /apis/<group>/<version>/...) with the object service's
// results; list, get (as JSON or as a server-side Table), watch streams
// (chunked JSON lines with bookmarks and timeouts), create, update, patch
// and delete, counting successful writes per user; TokenRequests.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/apiserver/api_server.h"
#include "tests/support/apiserver/deployment_simulator.h"
#include "tests/support/apiserver/http_server.h"
#include "tests/support/apiserver/kind_registry.h"
#include "tests/support/apiserver/object_service.h"
#include "tests/support/apiserver/rbac_authorizer.h"
#include "tests/support/apiserver/service_account_tokens.h"
#include "tests/support/apiserver/store.h"

namespace tandem::testing {

// Everything the server keeps; shared by the router and ApiServer's hooks.
struct ServerState {
  explicit ServerState(ApiServerOptions server_options)
      : options(std::move(server_options)), tokens(options.tokens) {}

  ApiServerOptions options;
  TestPki pki;
  Store store;
  KindRegistry registry;
  ObjectService service{store, registry};
  DeploymentSimulator deployments{service, store, registry};
  ServiceAccountTokens service_account_tokens{store};
  RbacAuthorizer authorizer{store};
  std::atomic<bool> stopping{false};
  // Watch requests still to answer with 410 Expired (injectWatchesGone).
  std::atomic<int> watches_gone{0};

  mutable std::mutex mutex;  // guards the members below
  std::vector<std::string> tokens;
  std::map<std::string, uint64_t> writes_by_user;
  std::vector<std::string> request_log;
  std::vector<RequestRecord> answered;
};

// Adds the request to the log ("METHOD TARGET user"); called as soon as it is read.
void logRequest(ServerState& state, const HttpRequest& request);

// Answers one request; runs on the connection's thread (a watch blocks it).
void handleRequest(ServerState& state, const HttpRequest& request, ResponseWriter& writer);

}  // namespace tandem::testing
