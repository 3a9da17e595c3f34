#include "operator/router/router.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "common/http/http_connection.h"
#include "common/json_parse.h"
#include "common/logging.h"
#include "operator/router/admission_gate.h"
#include "operator/router/agent_tracker.h"
#include "operator/router/completion_flow.h"
#include "operator/router/router_metrics.h"
#include "operator/router/served_model.h"
#include "operator/router/upstream_call.h"

namespace tandem::router {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::awaitable;
using server::HttpExchange;
using server::HttpRequest;
using server::HttpResponse;
using Clock = std::chrono::steady_clock;

namespace {

// How long the requests cut at the stop deadline get to write their end.
constexpr std::chrono::seconds kCutGrace{2};

// A config the router can run with; throws tandem::Error naming the field.
RouterConfig checked(RouterConfig config) {
  if (config.threads < 1) throw Error("router threads must be at least 1");
  if (config.worker_threads < 1) throw Error("router worker_threads must be at least 1");
  if (config.disagg_threshold_tokens && *config.disagg_threshold_tokens < 0) {
    throw Error("disagg_threshold_tokens must not be negative");
  }
  if (!(config.itl_target_s > 0) || !std::isfinite(config.itl_target_s)) {
    throw Error("itl_target must be a positive number of seconds");
  }
  if (config.debug_decisions < 0 || config.debug_decisions > 100000) {
    throw Error("debug_decisions must be between 0 and 100000, got " +
                std::to_string(config.debug_decisions));
  }
  const server::HttpLimits& http = config.http;
  if (http.max_header_bytes < 1 || http.max_header_bytes > UINT32_MAX) {
    throw Error("max_header_bytes must be between 1 and 4294967295, got " +
                std::to_string(http.max_header_bytes));
  }
  if (http.max_large_requests < 1) throw Error("max_large_requests must be at least 1");
  if (http.request_timeout.count() < 1 || http.idle_timeout.count() < 1 ||
      http.write_timeout.count() < 1) {
    throw Error("the request, idle and write timeouts must be at least 1 s");
  }
  return config;
}

// glibc raises its mmap threshold to the largest block freed (up to 32 MiB)
// and then keeps up to twice that on top of each thread's heap, which
// malloc_trim does not return: after a few large prompts the router held
// hundreds of MB it no longer used. A fixed threshold gives blocks over
// 1 MiB mappings of their own, unmapped when freed (the front trims the
// rest after each large request).
void returnLargeBlocksWhenFreed() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] { ::mallopt(M_MMAP_THRESHOLD, 1 << 20); });
#endif
}

// GET /debug/decisions?n=N: N (default 20) of the kept decisions; a
// missing or unreadable n gives the default, a large one all kept.
size_t decisionsWanted(const std::string& query) {
  size_t wanted = 20;
  size_t start = 0;
  while (start <= query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string_view pair(query.data() + start, end - start);
    if (pair.starts_with("n=")) {
      size_t value = 0;
      const auto digits = pair.substr(2);
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
      if (ptr == digits.data() + digits.size() && !digits.empty()) {
        if (ec == std::errc()) wanted = value;
        // Past size_t: all kept, as any count larger than what is kept.
        if (ec == std::errc::result_out_of_range) wanted = std::numeric_limits<size_t>::max();
      }
    }
    start = end + 1;
  }
  return wanted;
}

// Counts a completion request as active while it is handled (stop() waits
// for the count to reach zero, up to its grace period).
class ActiveRequest {
 public:
  explicit ActiveRequest(std::atomic<int64_t>& count) : count_(count) { count_ += 1; }
  ~ActiveRequest() { count_ -= 1; }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

 private:
  std::atomic<int64_t>& count_;
};

}  // namespace

StatusOr<Policy> parsePolicy(std::string_view text) {
  if (text == "kv") return Policy::kKv;
  if (text == "round_robin") return Policy::kRoundRobin;
  if (text == "random") return Policy::kRandom;
  if (text == "dynamo") return Policy::kDynamo;
  if (text == "llm_d") return Policy::kLlmD;
  if (text == "sglang") return Policy::kSglang;
  return invalidArgument("policy must be kv, round_robin, random, dynamo, llm_d or sglang, got \"" +
                         std::string(text) + "\"");
}

const char* policyName(Policy policy) {
  switch (policy) {
    case Policy::kKv:
      return "kv";
    case Policy::kRoundRobin:
      return "round_robin";
    case Policy::kRandom:
      return "random";
    case Policy::kDynamo:
      return "dynamo";
    case Policy::kLlmD:
      return "llm_d";
    case Policy::kSglang:
      return "sglang";
  }
  return "kv";
}

// The server: the HTTP front (common/http) serves clients; the small routes
// are answered here, completions by the CompletionFlow; the agents are the
// AgentTracker's, polled on the front's io threads.
class Router::Impl {
 public:
  explicit Impl(RouterConfig config)
      : config_(checked(std::move(config))),
        http_(std::make_unique<server::HttpService>(config_.http, config_.threads,
                                                    config_.worker_threads)),
        gate_(config_.max_inflight_requests, config_.max_queued_requests),
        model_(config_.model_dir, config_.chat_template),
        agents_(http_->ioContext(), config_.poll_interval_s, stopping_, metrics_, model_),
        flow_(config_, agents_, model_, gate_, metrics_, stopping_) {
    returnLargeBlocksWhenFreed();
    model_.setAdapterSource([this] { return agents_.adapterNames(); });
    http_->requireApiKey(config_.api_key, config_.api_key_exempt);
    routes();
  }

  ~Impl() {
    stop(0);
    // Coroutines still suspended on the io_context go with it, while the
    // components their frames refer to are still alive.
    http_.reset();
  }

  void start() {
    // A burst of clients overflows a short accept queue (the kernel caps it
    // at net.core.somaxconn).
    constexpr int kListenBacklog = 4096;
    try {
      port_ = http_->bind(config_.host, config_.port, kListenBacklog);
    } catch (const Error& e) {
      throw Error(std::string("router ") + e.what());
    }
    setAgents(config_.prefill, config_.decode);
    http_->start();
  }

  int port() const { return port_; }

  void setAgents(std::vector<AgentEndpoint> prefill, std::vector<AgentEndpoint> decode) {
    for (auto* agents : {&prefill, &decode}) {
      for (AgentEndpoint& agent : *agents) agent.api_key = config_.agent_api_key;
    }
    agents_.setAgents(std::move(prefill), std::move(decode));
  }

  void beginDrain() { draining_ = true; }

  void stop(double grace_seconds) {
    if (stopped_.exchange(true)) return;
    stopping_ = true;
    gate_.close();  // queued requests are answered 503
    http_->stopAccepting();
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(grace_seconds));
    auto waitUntil = [this](Clock::time_point until) {
      while (active_.load() > 0 && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    };
    waitUntil(deadline);
    if (active_.load() > 0) {
      // Ended with a word rather than a closed socket: a stream gets an
      // error event and [DONE], a whole answer a 503. What cannot be
      // reached meanwhile (a hold under way) is closed with the rest.
      const size_t cut = flow_.cutAll();
      TANDEM_LOG(kWarn) << "router: " << cut
                        << " requests still in flight at the stop deadline: ending them";
      waitUntil(Clock::now() + kCutGrace);
    }
    http_->stop();
    http_->join();
  }

  void startWatchers() {
    agents_.setLedgerReader(
        [this](const AgentState& agent) { return flow_.ledgerCounts(agent).requests; });
    agents_.startWatching();
  }

 private:
  void routes() {
    http_->get("/health", [this](const HttpRequest&, HttpResponse& res) {
      const bool ready = model_.ready() && !stopping_ && !draining_ && agents_.anyHealthy(false);
      res.status = ready ? 200 : 503;
      if (draining_ || stopping_) {
        res.set_content(R"({"status":"draining"})", "application/json");
      } else if (ready) {
        res.set_content(R"({"status":"ok"})", "application/json");
      } else if (!model_.ready() && !model_.lastError().empty()) {
        res.set_content(
            nlohmann::json{{"status", "model not loaded"}, {"error", model_.lastError()}}.dump(),
            "application/json");
      } else {
        res.set_content(R"({"status":"no healthy decode agent"})", "application/json");
      }
    });
    http_->get("/metrics", [this](const HttpRequest&, HttpResponse& res) {
      metrics_.setAdmission(gate_.inflight(), gate_.queued());
      metrics_.observeHttpFront(http_->frontStats());
      agents_.publishLedger([this](const AgentState& agent) { return flow_.ledgerCounts(agent); });
      res.set_content(metrics_.render(), "text/plain; version=0.0.4");
    });
    if (config_.debug_decisions > 0) {
      http_->get("/debug/decisions", [this](const HttpRequest& req, HttpResponse& res) {
        res.set_content(flow_.recentDecisions(decisionsWanted(req.query)).dump(),
                        "application/json");
      });
    }
    http_->route("POST", "/v1/completions",
                 [this](HttpExchange& exchange) { return complete(exchange, false); });
    http_->route("POST", "/v1/chat/completions",
                 [this](HttpExchange& exchange) { return complete(exchange, true); });
    // An agent's own answer, as a client of the agents would get it
    // (docs/router.md); /v1/models as the router serves the model
    // (asTheRouterServes).
    http_->route("GET", "/v1/models",
                 [this](HttpExchange& exchange) { return forward(exchange, true); });
    for (const char* path : {"/tokenize", "/detokenize"}) {
      http_->route("POST", path, [this](HttpExchange& exchange) { return forward(exchange); });
    }
    // Anything else, /v1/kv_transfer/* included (the agents' calls among
    // themselves), is the front's 404 in OpenAI's error shape.
  }

  awaitable<void> complete(HttpExchange& exchange, bool chat) {
    ActiveRequest active(active_);
    co_await flow_.complete(exchange, chat);
  }

  // Sends the request as it came (method, path, query, body) to a healthy
  // agent, decode agents first, and answers with that agent's status and
  // body; an agent that cannot be reached, fails (agentFailed) or does not
  // answer within forward_timeout_s is skipped. A
  // client leaving ends the call.
  // An agent's /v1/models answer as the router serves the model: the LoRA
  // adapters each some healthy decode agent serves, under the identity the
  // router sends its requests by (AgentTracker::adapterIdentity: the
  // answering agent's own entry when it agrees, else id, parent and
  // tandem.model_identity), and none that no decode agent serves (a
  // prefill agent's own); the base model's tandem.kv_cache_tokens the
  // smallest healthy decode agent's (the bound the router checks a prompt
  // plus max_tokens against, and gives a request without max_tokens), and
  // no tandem.max_waiting_requests nor max_num_seqs (one agent's bounds:
  // the router's own are --max-inflight-requests, --max-queued-requests).
  // So a client of the router sees every model it accepts, each as it
  // will be served, whichever agent answered; an answer it cannot read
  // goes as it is.
  std::string asTheRouterServes(std::string answer) {
    nlohmann::json models = parseJsonOrDiscarded(answer);
    if (!models.is_object() || !models.contains("data") || !models["data"].is_array() ||
        models["data"].empty() || !models["data"][0].is_object()) {
      return answer;
    }
    if (const auto tandem = models["data"][0].find("tandem");
        tandem != models["data"][0].end() && tandem->is_object()) {
      tandem->erase("max_waiting_requests");
      tandem->erase("max_num_seqs");
      if (const int64_t cache = agents_.smallestDecodeCache(); cache > 0) {
        (*tandem)["kv_cache_tokens"] = cache;
      }
    }
    const nlohmann::json& data = models["data"];
    const std::string base = data[0].value("id", std::string());
    std::map<std::string, const nlohmann::json*> own;  // the agent's entries, by id
    for (size_t i = 1; i < data.size(); ++i) {
      if (data[i].is_object()) own.emplace(data[i].value("id", std::string()), &data[i]);
    }
    nlohmann::json listed = nlohmann::json::array({data[0]});
    for (const std::string& name : agents_.adapterNames()) {
      // None healthy serves it: a request for it gets 503 until one does.
      const std::optional<std::string> routed = agents_.adapterIdentity(name);
      if (!routed) continue;
      const std::string& identity = *routed;
      const auto mine = own.find(name);
      if (mine != own.end() && identityOf(*mine->second) == identity) {
        listed.push_back(*mine->second);
        continue;
      }
      nlohmann::json entry = nlohmann::json::object();
      entry["id"] = name;
      entry["object"] = "model";
      entry["owned_by"] = "tandem";
      entry["parent"] = base;
      entry["tandem"]["model_identity"] = identity;
      listed.push_back(std::move(entry));
    }
    models["data"] = std::move(listed);
    return models.dump();
  }
  static std::string identityOf(const nlohmann::json& entry) {
    const auto tandem = entry.find("tandem");
    if (tandem == entry.end() || !tandem->is_object()) return "";
    const auto identity = tandem->find("model_identity");
    return identity != tandem->end() && identity->is_string() ? identity->get<std::string>() : "";
  }

  awaitable<void> forward(HttpExchange& exchange, bool as_the_router_serves = false) {
    const HttpRequest& request = exchange.request();
    const std::string target =
        request.query.empty() ? request.path : request.path + "?" + request.query;
    const http::verb verb = request.method == "POST" ? http::verb::post : http::verb::get;
    std::vector<AgentPtr> candidates = agents_.agentsOf(false);
    for (const AgentPtr& agent : agents_.agentsOf(true)) candidates.push_back(agent);
    // A body naming a LoRA adapter (/tokenize's model) goes to an agent
    // serving it (read only where some agent serves one); none healthy: 503,
    // as a completion naming it gets, not another agent's 404.
    const std::vector<std::string> adapters = agents_.adapterNames();
    if (request.method == "POST" && !adapters.empty()) {
      const nlohmann::json body = parseJsonOrDiscarded(request.body);
      const auto model = body.is_object() ? body.find("model") : body.end();
      if (model != body.end() && model->is_string()) {
        const std::string name = model->get<std::string>();
        if (std::find(adapters.begin(), adapters.end(), name) != adapters.end()) {
          keepAgentsServing(candidates, name, agents_.adapterIdentity(name).value_or(""));
        }
      }
    }
    // Every agent busy (429): the client is told so, not that none is healthy.
    std::optional<UpstreamResult> busy;
    for (const AgentPtr& agent : candidates) {
      if (!agent->healthy) continue;
      UpstreamResult result =
          co_await callAgent(agent->endpoint, verb, target, request.body,
                             std::min(config_.forward_timeout_s, config_.upstream_timeout_s),
                             &exchange, OnClientLeaving::kCut);
      if (exchange.clientGone()) co_return;
      if (result.status != 0 && !agentFailed(result.status)) {
        if (as_the_router_serves && result.status == 200) {
          result.body = asTheRouterServes(std::move(result.body));
        }
        co_await exchange.respond(server::httpJsonResponse(result.status, std::move(result.body)));
        co_return;
      }
      if (result.status == 429) busy = std::move(result);
      metrics_.countUpstreamError(agent->endpoint.name);
    }
    if (busy) {
      co_await exchange.respond(server::httpJsonResponse(429, std::move(busy->body)));
      co_return;
    }
    co_await exchange.respond(
        server::httpErrorResponse(503, "no healthy agent", "service_unavailable"));
  }

  RouterConfig config_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};  // completion requests being handled
  // The io threads and the worker pool; reset first on destruction.
  std::unique_ptr<server::HttpService> http_;
  int port_ = 0;
  AdmissionGate gate_;
  RouterMetrics metrics_;
  ServedModel model_;
  AgentTracker agents_;
  CompletionFlow flow_;
};

Router::Router(RouterConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Router::~Router() = default;

void Router::start() {
  impl_->start();
  impl_->startWatchers();
}

int Router::port() const { return impl_->port(); }

void Router::setAgents(std::vector<AgentEndpoint> prefill, std::vector<AgentEndpoint> decode) {
  impl_->setAgents(std::move(prefill), std::move(decode));
}

void Router::beginDrain() { impl_->beginDrain(); }

void Router::stop(double grace_seconds) { impl_->stop(grace_seconds); }

}  // namespace tandem::router
