#include "operator/router/router.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>

#include "common/logging.h"
#include "operator/router/admission_gate.h"
#include "operator/router/agent_tracker.h"
#include "operator/router/client_connection.h"
#include "operator/router/client_response.h"
#include "operator/router/completion_flow.h"
#include "operator/router/router_metrics.h"
#include "operator/router/served_model.h"
#include "operator/router/upstream_call.h"

namespace tandem::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
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

// The server: accepts clients, serves the small routes itself and hands
// completions to the CompletionFlow; the agents are the AgentTracker's.
class Router::Impl {
 public:
  explicit Impl(RouterConfig config)
      : config_(std::move(config)),
        work_(asio::make_work_guard(ioc_)),
        acceptor_(ioc_),
        gate_(config_.max_inflight_requests, config_.max_queued_requests),
        model_(config_.model_dir, config_.chat_template),
        agents_(ioc_, config_.poll_interval_s, stopping_, metrics_, model_),
        flow_(config_, agents_, model_, gate_, metrics_, stopping_) {
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
    agents_.setAgents(std::move(prefill), std::move(decode));
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

  void startWatchers() { agents_.startWatching(); }

 private:
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

  // Returns whether the connection can serve another request.
  awaitable<bool> handle(ClientConnection& client, const http::request<http::string_body>& req) {
    beast::tcp_stream& stream = client.stream;
    const std::string target(req.target());
    if (req.method() == http::verb::get && target == "/health") {
      const bool ready = model_.ready() && !stopping_ && agents_.anyHealthy(false);
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
        reusable = co_await flow_.complete(client, req.body(), target == "/v1/chat/completions");
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
    for (const AgentPtr& agent : agents_.agentsOf(false)) {
      if (!agent->healthy) continue;
      UpstreamResult result = co_await callAgent(agent->endpoint, http::verb::get,
                                                 std::string("/v1/models"), std::string(), 5.0);
      if (result.status == 200) {
        co_await respondJson(stream, 200, result.body);
        co_return;
      }
    }
    co_await respondError(stream, 503, std::string("no healthy agent"),
                          std::string("service_unavailable"));
  }

  RouterConfig config_;
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> active_{0};  // completion requests being handled
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

void Router::stop(double grace_seconds) { impl_->stop(grace_seconds); }

}  // namespace tandem::router
