#include "operator/router/router.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/block_hash.h"
#include "common/logging.h"
#include "common/prometheus_text.h"
#include "common/protocol/openai_protocol.h"
#include "common/tokenizer.h"
#include "operator/router/admission_gate.h"
#include "operator/router/client_connection.h"
#include "operator/router/ownership_index.h"
#include "operator/router/policy.h"
#include "operator/router/router_metrics.h"

namespace tandem::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

StatusOr<Policy> parsePolicy(std::string_view text) {
  if (text == "kv") return Policy::kKv;
  if (text == "round_robin") return Policy::kRoundRobin;
  if (text == "random") return Policy::kRandom;
  return invalidArgument("policy must be kv, round_robin or random, got \"" + std::string(text) +
                         "\"");
}

const char* policyName(Policy policy) {
  switch (policy) {
    case Policy::kKv:
      return "kv";
    case Policy::kRoundRobin:
      return "round_robin";
    case Policy::kRandom:
      return "random";
  }
  return "kv";
}

namespace {

// Boost 1.74's parsers treat body_limit(boost::none) as "0 bytes" for bodies
// of known length; a huge limit means none.
constexpr uint64_t kNoBodyLimit = std::numeric_limits<uint64_t>::max();

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What the router learns of the model from an agent's /v1/models.
struct ModelInfo {
  std::string served_name;
  std::string identity;
  int32_t block_size = 16;
  HashAlgorithm hash = HashAlgorithm::kXxh3_128;
  std::filesystem::path root;
  int64_t max_model_len = 0;
};

// The Host header for an agent: an IPv6 literal goes in brackets.
std::string hostHeader(const AgentEndpoint& endpoint) {
  const bool ipv6 = endpoint.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
}

// One agent and what the router knows of it.
struct AgentState {
  AgentEndpoint endpoint;
  bool prefill = false;
  std::atomic<bool> listed{true};
  std::atomic<bool> healthy{false};
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> waiting{0};
  std::atomic<double> kv_usage{0};
  std::atomic<int64_t> inflight{0};
  std::atomic<int64_t> queued_prefill_tokens{0};
};
using AgentPtr = std::shared_ptr<AgentState>;

// An upstream call's outcome: status 0 when no HTTP answer came.
struct UpstreamResult {
  int status = 0;
  std::string body;
  std::string error;  // transport failure, when status is 0
};

// Holds an agent's in-flight counters for the duration of a call.
class InflightGuard {
 public:
  InflightGuard(const AgentPtr& agent, int64_t prefill_tokens)
      : agent_(agent), tokens_(prefill_tokens) {
    agent_->inflight += 1;
    agent_->queued_prefill_tokens += tokens_;
  }
  ~InflightGuard() {
    agent_->inflight -= 1;
    agent_->queued_prefill_tokens -= tokens_;
  }
  InflightGuard(const InflightGuard&) = delete;
  InflightGuard& operator=(const InflightGuard&) = delete;

 private:
  AgentPtr agent_;
  int64_t tokens_;
};

// Request bodies the router builds (kept out of coroutines: GCC 12 cannot
// put brace-initialized JSON with string literals in a coroutine frame).
std::string holdBody(const protocol::Request& request) {
  json hold = {{"token_ids", request.prompt}};
  if (!request.cache_salt.empty()) hold["cache_salt"] = request.cache_salt;
  return hold.dump();
}

std::string releaseBody(const json& params) { return json{{"kv_transfer_params", params}}.dump(); }

// The prefill half: one token, no stream, the KV kept for the decode agent
// (and read from `lent`, a decode agent's prefix, when given).
std::string prefillBody(json body, const json& lent) {
  body["max_tokens"] = 1;
  body.erase("max_completion_tokens");
  body.erase("min_tokens");
  body["stream"] = false;
  body.erase("stream_options");
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  if (!lent.is_null()) body["kv_transfer_params"]["remote_prefix"] = lent;
  return body.dump();
}

// The decode half: the client's request reading the prefill agent's KV.
std::string decodeBody(json body, const json& params) {
  if (!params.is_null()) {
    json read = params;
    read["do_remote_prefill"] = true;
    body["kv_transfer_params"] = std::move(read);
  }
  return body.dump();
}

size_t blocksOffered(const json& params) {
  if (!params.is_object()) return 0;
  auto it = params.find("remote_block_ids");
  return it != params.end() && it->is_array() ? it->size() : 0;
}

const char* targetOf(const json& body) {
  return body.contains("messages") ? "/v1/chat/completions" : "/v1/completions";
}

std::string errorJson(int status, const std::string& message, const std::string& type,
                      const std::string& param = "") {
  server::ApiError error{status, message, type, param, ""};
  return server::errorBody(error).dump();
}

// An admission slot, given back when the request ends.
class SlotLease {
 public:
  explicit SlotLease(AdmissionGate& gate) : gate_(gate) {}
  ~SlotLease() { gate_.leave(); }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;

 private:
  AdmissionGate& gate_;
};

}  // namespace

class Router::Impl {
 public:
  explicit Impl(RouterConfig config)
      : config_(std::move(config)),
        chooser_({config_.policy, config_.disagg_threshold_tokens, config_.pull_back, 4}),
        work_(asio::make_work_guard(ioc_)),
        acceptor_(ioc_),
        gate_(config_.max_inflight_requests, config_.max_queued_requests) {
    if (config_.threads < 1) throw Error("router threads must be at least 1");
    if (config_.disagg_threshold_tokens < 0) {
      throw Error("disagg_threshold_tokens must not be negative");
    }
  }

  ~Impl() { stop(0); }

  void start() {
    tcp::endpoint endpoint(asio::ip::make_address(config_.host),
                           static_cast<unsigned short>(config_.port));
    boost::system::error_code ec;
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw Error("router cannot listen on " + config_.host + ":" + std::to_string(config_.port) +
                  ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    setAgents(config_.prefill, config_.decode);
    asio::co_spawn(ioc_, acceptLoop(), asio::detached);
    for (int i = 0; i < config_.threads; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }

  int port() const { return port_; }

  void setAgents(std::vector<AgentEndpoint> prefill, std::vector<AgentEndpoint> decode) {
    std::vector<AgentPtr> added;
    int64_t num_prefill = 0, num_decode = 0;
    {
      std::lock_guard<std::mutex> lock(agents_mutex_);
      std::map<std::string, AgentPtr> next;
      auto keep = [&](const AgentEndpoint& endpoint, bool is_prefill) {
        auto it = agents_.find(endpoint.name);
        if (it != agents_.end() && it->second->endpoint == endpoint &&
            it->second->prefill == is_prefill) {
          next[endpoint.name] = it->second;
          return;
        }
        auto agent = std::make_shared<AgentState>();
        agent->endpoint = endpoint;
        agent->prefill = is_prefill;
        next[endpoint.name] = agent;
        added.push_back(agent);
      };
      for (const auto& endpoint : prefill) keep(endpoint, true);
      for (const auto& endpoint : decode) keep(endpoint, false);
      for (auto& [name, agent] : agents_) {
        auto it = next.find(name);
        if (it == next.end() || it->second != agent) {
          // A changed address or role is a new agent (a restarted pod): the
          // blocks the old one held are not the new one's.
          agent->listed = false;
          index_.remove(name);
          if (it == next.end()) metrics_.removeAgent(name);
        }
      }
      agents_ = std::move(next);
      for (const auto& [name, agent] : agents_) ++(agent->prefill ? num_prefill : num_decode);
      metrics_.setAgentCount("prefill", num_prefill);
      metrics_.setAgentCount("decode", num_decode);
      // Every listed agent has its series from the start (unhealthy until its
      // first successful poll).
      for (const AgentPtr& agent : added) {
        metrics_.setAgentHealthy(agent->endpoint.name, false);
        metrics_.setIndexBlocks(agent->endpoint.name, 0);
      }
    }
    if (!started_) return;  // start() spawns the watchers
    for (const AgentPtr& agent : added) watch(agent);
  }

  void stop(double grace_seconds) {
    if (stopped_.exchange(true)) return;
    stopping_ = true;
    gate_.close();  // queued requests are answered 503
    asio::post(ioc_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(grace_seconds));
    while (active_.load() > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    work_.reset();
    ioc_.stop();
    for (auto& thread : threads_) thread.join();
    threads_.clear();
  }

  void startWatchers() {
    started_ = true;
    std::lock_guard<std::mutex> lock(agents_mutex_);
    for (auto& [name, agent] : agents_) watch(agent);
  }

 private:
  // ---- agents: health, load, KV events --------------------------------

  void watch(const AgentPtr& agent) {
    asio::co_spawn(ioc_, pollLoop(agent), asio::detached);
    asio::co_spawn(ioc_, eventLoop(agent), asio::detached);
  }

  awaitable<void> sleep(double seconds) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
  }

  // An agent's series change only while it is listed: setAgents unlists
  // agents and removes their series under the same lock, so a loop of an
  // agent just removed or replaced never brings them back.
  void setHealthyIfListed(const AgentState& agent, bool healthy) {
    std::lock_guard<std::mutex> lock(agents_mutex_);
    if (agent.listed) metrics_.setAgentHealthy(agent.endpoint.name, healthy);
  }
  void setIndexBlocksIfListed(const AgentState& agent) {
    std::lock_guard<std::mutex> lock(agents_mutex_);
    if (agent.listed) {
      metrics_.setIndexBlocks(agent.endpoint.name, index_.numBlocks(agent.endpoint.name));
    }
  }

  awaitable<void> pollLoop(AgentPtr agent) {
    while (!stopping_ && agent->listed) {
      UpstreamResult health = co_await call(agent->endpoint, http::verb::get,
                                            std::string("/health"), std::string(), 5.0);
      bool healthy = health.status == 200;
      if (healthy) {
        UpstreamResult metrics = co_await call(agent->endpoint, http::verb::get,
                                               std::string("/metrics"), std::string(), 5.0);
        if (metrics.status == 200) {
          agent->running = static_cast<int64_t>(
              prometheusSample(metrics.body, "tandem_num_requests_running").value_or(0));
          agent->waiting = static_cast<int64_t>(
              prometheusSample(metrics.body, "tandem_num_requests_waiting").value_or(0));
          agent->kv_usage =
              prometheusSample(metrics.body, "tandem_kv_cache_usage_ratio").value_or(0);
        }
        if (!model_ready_) co_await learnModel(agent);
      }
      if (agent->healthy.exchange(healthy) != healthy) {
        TANDEM_LOG(kInfo) << "router: agent " << agent->endpoint.name << " is "
                          << (healthy ? "healthy" : "unhealthy");
      }
      setHealthyIfListed(*agent, healthy);
      co_await sleep(config_.poll_interval_s);
    }
    setHealthyIfListed(*agent, false);
  }

  awaitable<void> learnModel(const AgentPtr& agent) {
    UpstreamResult models = co_await call(agent->endpoint, http::verb::get,
                                          std::string("/v1/models"), std::string(), 5.0);
    if (models.status != 200) co_return;
    json body = json::parse(models.body, nullptr, false);
    if (!body.is_object() || !body.contains("data") || body["data"].empty()) co_return;
    const json& model = body["data"][0];
    ModelInfo info;
    info.served_name = model.value("id", std::string());
    info.max_model_len = model.value("max_model_len", int64_t{0});
    info.root = model.value("root", std::string());
    const json tandem = model.value("tandem", json::object());
    info.identity = tandem.value("model_identity", std::string());
    info.block_size = tandem.value("block_size", 16);
    auto hash = parseHashAlgorithm(tandem.value("prefix_caching_hash", std::string("xxhash")));
    if (hash.isOk()) info.hash = *hash;
    const std::filesystem::path dir = config_.model_dir.empty() ? info.root : config_.model_dir;
    try {
      auto tokenizer = Tokenizer::fromDirectory(dir);
      int64_t vocab = tokenizer->vocabSize();
      std::ifstream config_file(dir / "config.json");
      json model_config = json::parse(config_file, nullptr, false);
      if (model_config.is_object()) vocab = model_config.value("vocab_size", vocab);
      std::lock_guard<std::mutex> lock(model_mutex_);
      if (model_ready_) co_return;
      tokenizer_ = std::move(tokenizer);
      hasher_ = std::make_unique<BlockHasher>(info.hash, info.identity, info.block_size);
      limits_.served_model_name = info.served_name;
      limits_.max_model_len = info.max_model_len;
      limits_.vocab_size = vocab;
      model_ = info;
      model_ready_ = true;
      TANDEM_LOG(kInfo) << "router: serving " << info.served_name << " (" << info.identity
                        << ", block size " << info.block_size << ", tokenizer from " << dir.string()
                        << ")";
    } catch (const std::exception& e) {
      TANDEM_LOG(kWarn) << "router: cannot load the tokenizer from " << dir.string() << ": "
                        << e.what();
    }
  }

  // Follows the agent's /v1/kv_events stream into the ownership index;
  // reconnects from scratch after a drop or a gap.
  awaitable<void> eventLoop(AgentPtr agent) {
    const std::string& name = agent->endpoint.name;
    while (!stopping_ && agent->listed) {
      try {
        beast::tcp_stream stream(co_await asio::this_coro::executor);
        tcp::resolver resolver(co_await asio::this_coro::executor);
        stream.expires_after(std::chrono::seconds(5));
        auto results = co_await resolver.async_resolve(
            agent->endpoint.host, std::to_string(agent->endpoint.port), use_awaitable);
        co_await stream.async_connect(results, use_awaitable);
        http::request<http::empty_body> request{http::verb::get, "/v1/kv_events?since=0", 11};
        request.set(http::field::host, hostHeader(agent->endpoint));
        co_await http::async_write(stream, request, use_awaitable);
        beast::flat_buffer buffer;
        http::response_parser<http::buffer_body> parser;
        parser.body_limit(kNoBodyLimit);
        co_await http::async_read_header(stream, buffer, parser, use_awaitable);
        if (parser.get().result() != http::status::ok) throw std::runtime_error("status");
        std::string pending;
        char chunk[16384];
        bool gap = false;
        while (!stopping_ && agent->listed && !gap && !parser.is_done()) {
          // Keep-alive comments arrive every 10 s; silence beyond 30 s is a drop.
          stream.expires_after(std::chrono::seconds(30));
          parser.get().body().data = chunk;
          parser.get().body().size = sizeof chunk;
          boost::system::error_code ec;
          co_await http::async_read_some(stream, buffer, parser,
                                         asio::redirect_error(use_awaitable, ec));
          if (ec && ec != http::error::need_buffer) break;
          pending.append(chunk, sizeof chunk - parser.get().body().size);
          size_t end;
          while (!gap && (end = pending.find("\n\n")) != std::string::npos) {
            std::string event = pending.substr(0, end);
            pending.erase(0, end + 2);
            if (!event.starts_with("data: ")) continue;  // comments
            json parsed = json::parse(event.substr(6), nullptr, false);
            // Once replaced under the same name (a restart), the index entry
            // belongs to the new agent: this stream's events stay out.
            std::lock_guard<std::mutex> lock(agents_mutex_);
            if (!agent->listed) break;
            if (!index_.apply(name, parsed)) gap = true;
          }
          setIndexBlocksIfListed(*agent);
        }
      } catch (const std::exception&) {
      }
      {
        std::lock_guard<std::mutex> lock(agents_mutex_);
        if (!agent->listed) break;  // replaced or removed: the index is not ours
        index_.untrust(name);
        metrics_.setIndexBlocks(name, 0);
      }
      if (!stopping_ && agent->listed) co_await sleep(0.5);
    }
  }

  // ---- upstream calls --------------------------------------------------

  // An HTTP call to an agent; not sent when `client` has already left.
  // One under way is read to its end even when the client leaves: a
  // prefill's answer names the blocks it holds, which the caller releases
  // (an agent that loses its connection may drop the answer and keep them).
  awaitable<UpstreamResult> call(AgentEndpoint endpoint, http::verb verb, std::string target,
                                 std::string body, double timeout_s,
                                 ClientConnection* client = nullptr) {
    UpstreamResult result;
    if (client != nullptr && client->gone) {
      result.error = "the client left";
      co_return result;
    }
    try {
      beast::tcp_stream stream(co_await asio::this_coro::executor);
      tcp::resolver resolver(co_await asio::this_coro::executor);
      stream.expires_after(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
      auto results = co_await resolver.async_resolve(endpoint.host, std::to_string(endpoint.port),
                                                     use_awaitable);
      co_await stream.async_connect(results, use_awaitable);
      http::request<http::string_body> request{verb, target, 11};
      request.set(http::field::host, hostHeader(endpoint));
      if (!body.empty()) {
        request.set(http::field::content_type, "application/json");
        request.body() = body;
        request.prepare_payload();
      }
      co_await http::async_write(stream, request, use_awaitable);
      beast::flat_buffer buffer;
      http::response_parser<http::string_body> parser;
      parser.body_limit(kNoBodyLimit);
      co_await http::async_read(stream, buffer, parser, use_awaitable);
      result.status = static_cast<int>(parser.get().result_int());
      result.body = std::move(parser.get().body());
      boost::system::error_code ec;
      stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    } catch (const std::exception& e) {
      result.status = 0;
      result.error = e.what();
    }
    co_return result;
  }

  // ---- client side -----------------------------------------------------

  awaitable<void> acceptLoop() {
    while (!stopping_) {
      boost::system::error_code ec;
      // Each connection on its own strand: its session, upstream calls and
      // watcher never run at once.
      auto strand = asio::make_strand(ioc_);
      tcp::socket socket =
          co_await acceptor_.async_accept(strand, asio::redirect_error(use_awaitable, ec));
      if (ec) {
        if (stopping_ || ec == asio::error::operation_aborted) co_return;
        continue;
      }
      asio::co_spawn(strand, session(std::move(socket)), asio::detached);
    }
  }

  // Serves one connection until the client leaves, asks to close, or a
  // response cannot be reused. Failures are error codes, never exceptions
  // through the request path; whatever happens the socket is closed here.
  awaitable<void> session(tcp::socket socket) {
    auto client = std::make_shared<ClientConnection>(std::move(socket));
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(64 * 1024 * 1024);
      client->stream.expires_after(std::chrono::seconds(300));
      boost::system::error_code ec;
      co_await http::async_read(client->stream, client->buffer, parser,
                                asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      http::request<http::string_body> request = parser.release();
      client->stream.expires_never();
      const bool keep_alive = request.keep_alive();
      bool reusable = false;
      try {
        reusable = co_await handle(*client, request);
      } catch (const std::exception& e) {
        TANDEM_LOG(kWarn) << "router: request failed: " << e.what();
      }
      co_await client->stopWatch();
      if (!keep_alive || !reusable || client->gone) break;
    }
    boost::system::error_code ec;
    client->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    client->stream.socket().close(ec);
  }

  using Headers = std::vector<std::pair<std::string, std::string>>;

  // Whether the response was written (false: the client is gone).
  awaitable<bool> respond(beast::tcp_stream& stream, int status, std::string body,
                          std::string content_type, Headers extra) {
    http::response<http::string_body> response{static_cast<http::status>(status), 11};
    response.set(http::field::content_type, content_type);
    for (const auto& [name, value] : extra) response.set(name, value);
    response.keep_alive(true);
    response.body() = std::move(body);
    response.prepare_payload();
    boost::system::error_code ec;
    co_await http::async_write(stream, response, asio::redirect_error(use_awaitable, ec));
    co_return !ec;
  }

  awaitable<bool> respondJson(beast::tcp_stream& stream, int status, std::string body) {
    co_return co_await respond(stream, status, std::move(body), std::string("application/json"),
                               Headers{});
  }

  // An error in OpenAI's shape; 503s say when to retry.
  awaitable<bool> respondError(beast::tcp_stream& stream, int status, std::string message,
                               std::string type) {
    Headers headers;
    if (status == 503) headers.emplace_back("Retry-After", "1");
    co_return co_await respond(stream, status, errorJson(status, message, type),
                               std::string("application/json"), std::move(headers));
  }

  // Returns whether the connection can serve another request.
  awaitable<bool> handle(ClientConnection& client, const http::request<http::string_body>& req) {
    beast::tcp_stream& stream = client.stream;
    const std::string target(req.target());
    if (req.method() == http::verb::get && target == "/health") {
      const bool ready = model_ready_ && !stopping_ && anyHealthy(false);
      co_await respondJson(
          stream, ready ? 200 : 503,
          std::string(ready ? R"({"status":"ok"})" : R"({"status":"no healthy decode agent"})"));
      co_return true;
    }
    if (req.method() == http::verb::get && target == "/metrics") {
      metrics_.setAdmission(gate_.inflight(), gate_.queued());
      co_return co_await respond(stream, 200, metrics_.render(),
                                 std::string("text/plain; version=0.0.4"), Headers{});
    }
    if (req.method() == http::verb::get && target == "/v1/models") {
      co_await forwardModels(stream);
      co_return true;
    }
    if (req.method() == http::verb::post &&
        (target == "/v1/completions" || target == "/v1/chat/completions")) {
      active_ += 1;
      bool reusable = false;
      try {
        reusable = co_await complete(client, req.body(), target == "/v1/chat/completions");
      } catch (const std::exception& e) {
        TANDEM_LOG(kWarn) << "router: completion failed: " << e.what();
      }
      active_ -= 1;
      co_return reusable;
    }
    co_await respondError(stream, 404,
                          "no route for " + std::string(req.method_string()) + " " + target,
                          std::string("not_found_error"));
    co_return true;
  }

  awaitable<void> forwardModels(beast::tcp_stream& stream) {
    for (const AgentPtr& agent : agentsOf(false)) {
      if (!agent->healthy) continue;
      UpstreamResult result = co_await call(agent->endpoint, http::verb::get,
                                            std::string("/v1/models"), std::string(), 5.0);
      if (result.status == 200) {
        co_await respondJson(stream, 200, result.body);
        co_return;
      }
    }
    co_await respondError(stream, 503, std::string("no healthy agent"),
                          std::string("service_unavailable"));
  }

  bool anyHealthy(bool prefill) {
    for (const AgentPtr& agent : agentsOf(prefill)) {
      if (agent->healthy) return true;
    }
    return false;
  }

  std::vector<AgentPtr> agentsOf(bool prefill) {
    std::lock_guard<std::mutex> lock(agents_mutex_);
    std::vector<AgentPtr> out;
    for (const auto& [name, agent] : agents_) {
      if (agent->prefill == prefill) out.push_back(agent);
    }
    return out;
  }

  enum class Admission { kAdmitted, kRefused, kClientGone };

  // Admission: up to max_inflight_requests at once, then a queue of up to
  // max_queued_requests (woken when a slot passes to it, or dropped when its
  // client leaves), then refusal.
  awaitable<Admission> admit(ClientConnection& client) {
    auto waiter = std::make_shared<AdmissionGate::Waiter>();
    auto executor = co_await asio::this_coro::executor;
    auto wakeup = std::make_shared<asio::steady_timer>(executor, Clock::time_point::max());
    // An expiry in the past also ends a wait that has not begun yet.
    waiter->wake = [executor, wakeup] {
      asio::post(executor, [wakeup] { wakeup->expires_at(Clock::time_point::min()); });
    };
    switch (gate_.enter(waiter)) {
      case AdmissionGate::Entry::kAdmitted:
        co_return Admission::kAdmitted;
      case AdmissionGate::Entry::kRefused:
        co_return Admission::kRefused;
      case AdmissionGate::Entry::kQueued:
        break;
    }
    {
      OnClientGone cancel(&client, [wakeup] { wakeup->expires_at(Clock::time_point::min()); });
      boost::system::error_code ec;
      while (!client.gone && !stopping_ && !gate_.granted(waiter)) {
        co_await wakeup->async_wait(asio::redirect_error(use_awaitable, ec));
      }
    }
    if (!gate_.cancel(waiter)) co_return Admission::kAdmitted;  // granted meanwhile
    co_return client.gone ? Admission::kClientGone : Admission::kRefused;
  }

  // The completion flow: parse and check like an agent, decide, hand off.
  awaitable<bool> complete(ClientConnection& client, const std::string& body_text, bool chat) {
    beast::tcp_stream& stream = client.stream;
    const auto arrival = Clock::now();
    if (!model_ready_) {
      co_await respondError(stream, 503, std::string("no agent is ready yet"),
                            std::string("service_unavailable"));
      co_return true;
    }
    // The same checks, with the same messages, as an agent's.
    auto parsed = chat ? server::parseChatCompletionRequest(body_text, limits_, *tokenizer_)
                       : server::parseCompletionRequest(body_text, limits_, *tokenizer_);
    if (!parsed.isOk()) {
      const server::ApiError& error = parsed.error();
      co_await respondJson(stream, error.status, server::errorBody(error).dump());
      co_return true;
    }
    // From here on, a client leaving cancels what its request is waiting for.
    client.startWatch();
    const Admission admission = co_await admit(client);
    if (admission == Admission::kClientGone) {
      metrics_.countClientAbort("queued");
      co_return false;
    }
    if (admission == Admission::kRefused) {
      metrics_.countDecision("rejected");
      co_return co_await respondError(stream, 503,
                                      std::string("the router is overloaded; retry later"),
                                      std::string("service_unavailable"));
    }
    SlotLease slot(gate_);
    if (client.gone) {
      metrics_.countClientAbort("queued");
      co_return false;
    }
    json body = json::parse(body_text);
    body.erase("kv_transfer_params");  // only the router sets these
    const protocol::Request& request = parsed.value().request;
    const bool streaming = parsed.value().stream;

    const auto decide_start = Clock::now();
    const std::vector<BlockHash> hashes =
        hasher_->hashFullBlocks(request.prompt, request.cache_salt);
    std::vector<AgentPtr> prefill_agents = agentsOf(true);
    std::vector<AgentPtr> decode_agents = agentsOf(false);
    DecisionInput input;
    input.num_prompt_tokens = static_cast<int64_t>(request.prompt.size());
    input.block_size = model_.block_size;
    auto view = [&](const AgentPtr& agent) {
      AgentView v;
      v.name = agent->endpoint.name;
      v.healthy = agent->healthy;
      v.leading_blocks = index_.leadingBlocks(v.name, hashes);
      v.running = agent->running;
      v.waiting = agent->waiting;
      v.kv_usage = agent->kv_usage;
      v.inflight = agent->inflight;
      v.queued_prefill_tokens = agent->queued_prefill_tokens;
      return v;
    };
    for (const AgentPtr& agent : prefill_agents) input.prefill.push_back(view(agent));
    for (const AgentPtr& agent : decode_agents) input.decode.push_back(view(agent));
    Decision decision;
    {
      std::lock_guard<std::mutex> lock(chooser_mutex_);
      decision = chooser_.choose(input);
    }
    metrics_.observeDecision(secondsSince(decide_start), decision.overlap_ratio);
    if (!decision.decode) {
      metrics_.countDecision("rejected");
      co_await respondError(stream, 503, std::string("no healthy decode agent"),
                            std::string("service_unavailable"));
      co_return true;
    }

    // Try decode agents in the chosen order, then the others.
    std::vector<size_t> decode_order = {*decision.decode};
    for (size_t i = 0; i < decode_agents.size(); ++i) {
      if (i != *decision.decode && input.decode[i].healthy) decode_order.push_back(i);
    }
    bool retried = false;
    for (size_t attempt = 0; attempt < decode_order.size(); ++attempt) {
      const AgentPtr& decode = decode_agents[decode_order[attempt]];
      Handoff handoff;
      if (attempt == 0 && decision.kind == Decision::Kind::kDisaggregated) {
        handoff = co_await prefillOn(client, body, request, hashes, prefill_agents, input, decision,
                                     decode);
        if (client.gone) {
          // Nobody waits for the answer: what the prefill agent holds for
          // it goes back now, and no decode agent sees the request.
          co_await release(handoff);
          metrics_.countClientAbort("prefill");
          co_return false;
        }
        if (handoff.client_error) {
          co_return co_await respondJson(stream, handoff.status, handoff.body);
        }
        if (handoff.retried) retried = true;
      }
      const std::string label = !handoff.params.is_null()
                                    ? (handoff.pulled_back ? "pull_back" : "disaggregated")
                                    : "local_prefill";
      DecodeOutcome outcome =
          co_await decodeOn(client, body, streaming, decode, handoff, label, arrival,
                            static_cast<int64_t>(request.prompt.size()));
      if (outcome == DecodeOutcome::kDone) {
        metrics_.countDecision(label);
        if (retried) metrics_.countDecision("retried");
        co_return true;
      }
      if (outcome == DecodeOutcome::kClientGone || outcome == DecodeOutcome::kClientGoneMidway) {
        // A cancel, not a failure: the upstream connection is closed (the
        // decode agent aborts the request); a transfer it has not read yet
        // is released now rather than at the prefill agent's timeout.
        co_await release(handoff);
        metrics_.countClientAbort(outcome == DecodeOutcome::kClientGone ? "decode" : "response");
        co_return false;
      }
      if (outcome == DecodeOutcome::kBrokenAfterStart) co_return false;
      // Failed before anything reached the client: give the transfer back
      // and try the next decode agent, which prefills itself.
      if (!handoff.params.is_null()) co_await release(handoff);
      retried = true;
    }
    metrics_.countDecision("rejected");
    co_return co_await respondError(stream, 503,
                                    std::string("every decode agent failed this request"),
                                    std::string("service_unavailable"));
  }

  struct Handoff {
    json params;  // the prefill agent's kv_transfer_params; null: none
    AgentPtr prefill;
    bool pulled_back = false;
    bool retried = false;
    bool client_error = false;  // the request itself is bad: answer status/body
    int status = 0;
    std::string body;
  };

  // Prefills on the chosen prefill agent (others on failure); with pull-back
  // the decode agent first lends the prefix it holds.
  awaitable<Handoff> prefillOn(ClientConnection& client, const json& body,
                               const protocol::Request& request,
                               const std::vector<BlockHash>& hashes,
                               const std::vector<AgentPtr>& prefill_agents,
                               const DecisionInput& input, const Decision& decision,
                               const AgentPtr& decode) {
    Handoff handoff;
    json lent;
    if (decision.pull_back) {
      UpstreamResult held =
          co_await call(decode->endpoint, http::verb::post, std::string("/v1/kv_transfer/hold"),
                        holdBody(request), 10.0);
      if (held.status == 200) {
        json answer = json::parse(held.body, nullptr, false);
        if (answer.is_object() && answer.contains("kv_transfer_params")) {
          lent = answer["kv_transfer_params"];
        }
      }
    }
    std::vector<size_t> order = {*decision.prefill};
    for (size_t i = 0; i < prefill_agents.size(); ++i) {
      if (i != *decision.prefill && input.prefill[i].healthy) order.push_back(i);
    }
    const std::string prefill_body = prefillBody(body, lent);
    const std::string target = targetOf(body);
    for (size_t attempt = 0; attempt < order.size() && !client.gone; ++attempt) {
      const AgentPtr& prefill = prefill_agents[order[attempt]];
      const int64_t uncached =
          input.num_prompt_tokens - input.prefill[order[attempt]].leading_blocks * input.block_size;
      UpstreamResult result;
      {
        InflightGuard guard(prefill, uncached);
        result = co_await call(prefill->endpoint, http::verb::post, target, prefill_body,
                               config_.upstream_timeout_s, &client);
      }
      if (result.status >= 400 && result.status < 500 && result.status != 429) {
        handoff.client_error = true;
        handoff.status = result.status;
        handoff.body = result.body;
        break;
      }
      if (result.status == 200) {
        json answer = json::parse(result.body, nullptr, false);
        if (answer.is_object() && answer.contains("kv_transfer_params") &&
            answer["kv_transfer_params"].is_object()) {
          handoff.params = answer["kv_transfer_params"];
          handoff.prefill = prefill;
          handoff.pulled_back = !lent.is_null();
          break;
        }
      }
      if (client.gone) break;  // the call was cut short: not the agent's fault
      metrics_.countUpstreamError(prefill->endpoint.name);
      TANDEM_LOG(kWarn) << "router: prefill on " << prefill->endpoint.name << " failed ("
                        << (result.status == 0 ? result.error : std::to_string(result.status))
                        << ")";
      handoff.retried = true;
    }
    if (handoff.params.is_null() && !lent.is_null()) {
      // Nobody read the lent prefix: let the decode agent go now.
      co_await call(decode->endpoint, http::verb::post, std::string("/v1/kv_transfer/release"),
                    releaseBody(lent), 5.0);
    }
    co_return handoff;
  }

  awaitable<void> release(const Handoff& handoff) {
    if (!handoff.prefill) co_return;
    co_await call(handoff.prefill->endpoint, http::verb::post,
                  std::string("/v1/kv_transfer/release"), releaseBody(handoff.params), 5.0);
  }

  enum class DecodeOutcome {
    kDone,
    kFailedBeforeStart,  // the decode agent failed; the client heard nothing
    kBrokenAfterStart,   // the decode agent failed mid-answer
    kClientGone,         // the client left before the response headers
    kClientGoneMidway,   // the client left after them
  };

  // Sends the request to the decode agent and passes its answer through.
  awaitable<DecodeOutcome> decodeOn(ClientConnection& connection, json body, bool streaming,
                                    const AgentPtr& decode, const Handoff& handoff,
                                    const std::string& label, Clock::time_point arrival,
                                    int64_t prompt_tokens) {
    const std::string request_body = decodeBody(body, handoff.params);
    const std::string target = targetOf(body);
    std::vector<std::pair<std::string, std::string>> headers = {
        {"x-tandem-decision", label},
        {"x-tandem-decode-agent", decode->endpoint.name},
        {"x-tandem-prefill-agent",
         handoff.prefill ? handoff.prefill->endpoint.name : decode->endpoint.name},
        {"x-tandem-kv-blocks-moved", std::to_string(blocksOffered(handoff.params))}};
    if (connection.gone) co_return DecodeOutcome::kClientGone;
    beast::tcp_stream& client = connection.stream;
    InflightGuard guard(decode, handoff.params.is_null() ? prompt_tokens : 0);
    beast::tcp_stream upstream(co_await asio::this_coro::executor);
    // A client leaving closes the upstream connection: the decode agent
    // aborts the request and frees its blocks.
    OnClientGone cancel(&connection, [&upstream] { upstream.close(); });
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(kNoBodyLimit);
    try {
      tcp::resolver resolver(co_await asio::this_coro::executor);
      upstream.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(config_.upstream_timeout_s)));
      auto results = co_await resolver.async_resolve(
          decode->endpoint.host, std::to_string(decode->endpoint.port), use_awaitable);
      co_await upstream.async_connect(results, use_awaitable);
      http::request<http::string_body> request{http::verb::post, target, 11};
      request.set(http::field::host, hostHeader(decode->endpoint));
      request.set(http::field::content_type, "application/json");
      request.body() = request_body;
      request.prepare_payload();
      co_await http::async_write(upstream, request, use_awaitable);
      co_await http::async_read_header(upstream, buffer, parser, use_awaitable);
    } catch (const std::exception& e) {
      if (connection.gone) co_return DecodeOutcome::kClientGone;
      metrics_.countUpstreamError(decode->endpoint.name);
      TANDEM_LOG(kWarn) << "router: decode on " << decode->endpoint.name << " failed: " << e.what();
      co_return DecodeOutcome::kFailedBeforeStart;
    }
    if (connection.gone) co_return DecodeOutcome::kClientGone;
    const int status = static_cast<int>(parser.get().result_int());
    if (status >= 500 || status == 429) {
      metrics_.countUpstreamError(decode->endpoint.name);
      co_return DecodeOutcome::kFailedBeforeStart;
    }
    const std::string content_type(parser.get()[http::field::content_type]);
    // Pass the answer through as it comes: SSE events one by one.
    http::response<http::empty_body> head{static_cast<http::status>(status), 11};
    head.set(http::field::content_type, content_type.empty() ? "application/json" : content_type);
    if (content_type.starts_with("text/event-stream")) {
      head.set(http::field::cache_control, "no-cache");
    }
    for (const auto& [name, value] : headers) head.set(name, value);
    head.chunked(true);
    head.keep_alive(true);
    http::response_serializer<http::empty_body> serializer(head);
    {
      boost::system::error_code ec;
      co_await http::async_write_header(client, serializer,
                                        asio::redirect_error(use_awaitable, ec));
      // A failed write to the client is the client gone, never the agent.
      if (ec) co_return DecodeOutcome::kClientGone;
    }
    std::string broken;  // why the pass-through stopped early
    try {
      char chunk[16384];
      std::string events;  // for timing: complete SSE events seen so far
      Clock::time_point last_token{};
      while (!parser.is_done()) {
        parser.get().body().data = chunk;
        parser.get().body().size = sizeof chunk;
        boost::system::error_code ec;
        co_await http::async_read_some(upstream, buffer, parser,
                                       asio::redirect_error(use_awaitable, ec));
        if (ec && ec != http::error::need_buffer) throw boost::system::system_error(ec);
        const size_t n = sizeof chunk - parser.get().body().size;
        if (n == 0) continue;
        if (streaming && status == 200) {
          events.append(chunk, n);
          size_t end;
          while ((end = events.find("\n\n")) != std::string::npos) {
            const bool token = events.starts_with("data: {");
            events.erase(0, end + 2);
            if (!token) continue;
            const auto now = Clock::now();
            if (last_token == Clock::time_point{}) {
              metrics_.observeTtft(std::chrono::duration<double>(now - arrival).count());
            } else {
              metrics_.observeItl(std::chrono::duration<double>(now - last_token).count());
            }
            last_token = now;
          }
        }
        boost::system::error_code client_error;
        co_await asio::async_write(client, http::make_chunk(asio::buffer(chunk, n)),
                                   asio::redirect_error(use_awaitable, client_error));
        if (client_error) {
          // The client left: closing the upstream connection makes the decode
          // agent abort the request and free its blocks.
          co_return DecodeOutcome::kClientGoneMidway;
        }
      }
      boost::system::error_code ec;
      co_await asio::async_write(client, http::make_chunk_last(),
                                 asio::redirect_error(use_awaitable, ec));
      if (ec) co_return DecodeOutcome::kClientGoneMidway;
    } catch (const std::exception& e) {
      broken = e.what();
    }
    if (!broken.empty()) {
      if (connection.gone) co_return DecodeOutcome::kClientGoneMidway;
      metrics_.countUpstreamError(decode->endpoint.name);
      TANDEM_LOG(kWarn) << "router: stream from " << decode->endpoint.name << " broke: " << broken;
      // Tell a streaming client why its stream ends, if it is still there.
      if (streaming) {
        const std::string event =
            "data: " +
            errorJson(502,
                      "the decode agent " + decode->endpoint.name + " failed mid-stream: " + broken,
                      "server_error") +
            "\n\n" + std::string(server::kSseDone);
        boost::system::error_code ec;
        co_await asio::async_write(client, http::make_chunk(asio::buffer(event)),
                                   asio::redirect_error(use_awaitable, ec));
        if (!ec) {
          co_await asio::async_write(client, http::make_chunk_last(),
                                     asio::redirect_error(use_awaitable, ec));
        }
      }
      co_return DecodeOutcome::kBrokenAfterStart;
    }
    metrics_.observeE2e(secondsSince(arrival));
    co_return DecodeOutcome::kDone;
  }

  RouterConfig config_;
  Chooser chooser_;
  std::mutex chooser_mutex_;
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> started_{false};
  std::atomic<int64_t> active_{0};  // completion requests being handled
  AdmissionGate gate_;

  std::mutex agents_mutex_;
  std::map<std::string, AgentPtr> agents_;
  OwnershipIndex index_;
  RouterMetrics metrics_;

  std::mutex model_mutex_;
  std::atomic<bool> model_ready_{false};
  ModelInfo model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<BlockHasher> hasher_;
  server::ServerLimits limits_;
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

void Router::stop(double grace_seconds) { impl_->stop(grace_seconds); }

}  // namespace tandem::router
