// The router: one OpenAI-compatible address in front of prefill and decode
// agents. For each request it tokenizes the prompt, computes its block hashes
// (common/block_hash.h, the agents' own scheme), looks up which agents hold
// those blocks in the ownership index fed by every agent's /v1/kv_events
// stream, chooses a prefill and a decode agent (or prefill on the decode
// agent), drives the P→D hand-off (docs/kv-transfer.md) and streams the
// decode agent's answer back token by token. See docs/router.md.
//
// Clients are served by the HTTP front the agents use (common/http): the
// same parser, limits, timeouts and error answers.
//
// Threads: an Asio io_context run by a few threads serves clients, agent
// calls and the agents' event streams; parsing, tokenizing and rendering
// requests run on a worker pool. Every public method is thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/engine/simulation/step_profile.h"
#include "common/http/http_limits.h"
#include "common/status.h"

namespace tandem::router {

// One agent the router may send work to.
struct AgentEndpoint {
  AgentEndpoint() = default;
  AgentEndpoint(std::string name, std::string host, int port)
      : name(std::move(name)), host(std::move(host)), port(port) {}

  std::string name;  // e.g. "prefill-0"; labels metrics and logs
  std::string host = "127.0.0.1";
  int port = 0;
  // Sent as Authorization: Bearer <api_key> on every call to the agent
  // (RouterConfig::agent_api_key, stamped by the router); empty: none.
  std::string api_key;
  bool operator==(const AgentEndpoint&) const = default;
};

// kv: Tandem's (predicted time, ledger, hot-prefix spreading); dynamo,
// llm_d, sglang: those projects' published policies in this router, for
// comparison (docs/router.md cites each); round_robin and random.
enum class Policy { kKv, kRoundRobin, kRandom, kDynamo, kLlmD, kSglang };
// "kv", "round_robin", "random", "dynamo", "llm_d", "sglang";
// InvalidArgument names what is accepted.
StatusOr<Policy> parsePolicy(std::string_view text);
const char* policyName(Policy policy);

// The conditional-disaggregation threshold of the policies that need one
// when none is configured (the kv policy has its ITL target instead).
inline constexpr int64_t kDefaultDisaggThresholdTokens = 256;

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see Router::port())
  Policy policy = Policy::kKv;
  // Prefill on the decode agent itself only when the prompt's uncached part
  // is shorter than this (conditional disaggregation). Unset: the kv policy
  // decides by its ITL target alone, the others use
  // kDefaultDisaggThresholdTokens.
  std::optional<int64_t> disagg_threshold_tokens;
  // Ask the decode agent holding a conversation to lend its prefix to the
  // prefill agent (decode → prefill pull-back).
  bool pull_back = true;
  // The kv policy's learned costs follow what clients saw (docs/router.md,
  // "Learned costs"); false: its model's predictions alone, decisions that
  // do not move with a machine's load (for tests that assert a decision).
  bool learn_costs = true;
  // The agents' step-time model (a simulation profile file's form), with
  // which the kv policy predicts times; absent: defaultRoutingProfile().
  std::optional<engine::StepProfile> profile;
  // The kv policy prefills on a decode agent only while its predicted step
  // (its requests' inter-token latency) stays within this.
  double itl_target_s = 0.025;
  // Seeds the policies' random tie-breaking (and the random policy).
  uint64_t seed = 1;
  // GET /debug/decisions keeps this many recent decisions; 0: off (404).
  int64_t debug_decisions = 256;
  // At most max_inflight_requests are sent to agents at once; up to
  // max_queued_requests more wait for a slot; beyond that: 503 + Retry-After.
  int64_t max_inflight_requests = 256;
  int64_t max_queued_requests = 1024;
  double upstream_timeout_s = 600;
  // A forwarded call (/v1/models, /tokenize, /detokenize: quick ones) that
  // gets no answer within this (or upstream_timeout_s, when shorter) goes
  // to the next agent: an agent that hangs is one that cannot be reached.
  double forward_timeout_s = 30;
  // A stream moves to another decode agent at most this many times, and
  // only until this many seconds after it first broke; then its client
  // gets an error event.
  int64_t max_migrations = 3;
  double migration_timeout_s = 60;
  // A request every decode agent's full waiting queue would refuse waits
  // this long for a place before its 503: about the Retry-After its
  // client would otherwise wait, and served sooner.
  double full_queues_wait_s = 1;
  int threads = 2;         // io threads: sockets, agent calls, event streams
  int worker_threads = 4;  // parsing, tokenizing and rendering requests
  // Per-connection limits, the agents' type and defaults
  // (server::ServerConfig::http).
  server::HttpLimits http;
  // The model directory for the tokenizer and chat template (prompts are
  // tokenized here to compute block hashes); empty: the "root" the first
  // agent reports at /v1/models (same machine, as in local mode).
  std::filesystem::path model_dir;
  // A Jinja chat template file replacing the model's (the agents' own
  // --chat-template), so chat prompts are rendered as the agents render them.
  std::filesystem::path chat_template;
  // Agents are polled (health, load) this often.
  double poll_interval_s = 0.5;
  // The agents' shared KV secret (TANDEM_KV_SECRET): the router signs its
  // /v1/kv_transfer/hold calls with it (common/kv_auth.h); empty: unsigned,
  // which agents with a secret refuse (the prompt is then recomputed).
  std::string kv_secret;
  // Clients must send Authorization: Bearer <api_key> except on the
  // api_key_exempt paths (common/http's requireApiKey); empty: no key.
  std::string api_key;
  std::vector<std::string> api_key_exempt;
  // The key the agents require, sent on every call to them; empty: none.
  std::string agent_api_key;
  std::vector<AgentEndpoint> prefill;
  std::vector<AgentEndpoint> decode;
};

class Router {
 public:
  // Validates the config; throws tandem::Error naming the problem.
  explicit Router(RouterConfig config);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds and starts serving; throws tandem::Error when it cannot bind.
  void start();
  // The bound port (after start()).
  int port() const;
  // Replaces the agent sets (local mode after a restart or a replica change;
  // the controller from Endpoints). Agents no longer listed get no new work.
  void setAgents(std::vector<AgentEndpoint> prefill, std::vector<AgentEndpoint> decode);
  // Keeps serving but answers /health 503 {"status": "draining"}, so a
  // Service stops sending new clients before stop() closes the listener.
  void beginDrain();
  // Stops accepting, lets in-flight requests finish until the deadline,
  // ends those left (a stream with an error event and [DONE], a whole
  // answer with 503), then stops. Idempotent.
  void stop(double grace_seconds = 10);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::router
