// The agent's HTTP API: OpenAI-compatible completions and chat completions
// (streamed as Server-Sent Events or whole), models, health, metrics,
// tokenize/detokenize, the KV transfer calls and the KV event stream for the
// router, served by the Asio/Beast front of common/http/http_connection.h.
//
// A few io threads own every connection; a request waiting for the engine
// costs a coroutine, not a thread (the engine's output callback wakes it).
// Parsing and tokenizing run on a small worker pool, never on the engine
// thread. A client that goes away (mid-stream, or before a whole answer is
// ready) has its request aborted, which frees its blocks.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "agent/engine/engine.h"
#include "agent/server/metrics.h"
#include "common/http/http_limits.h"
#include "common/protocol/openai_protocol.h"

namespace tandem::server {

class HttpService;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (read it back from port())
  std::string served_model_name;
  std::string role = "both";  // metrics label: prefill, decode or both
  int retry_after_seconds = 1;
  int io_threads = 2;      // threads that own the sockets
  int worker_threads = 4;  // parsing, tokenizing, calls that wait on the engine
  // Per-connection limits (HTTP/1.1): a request's line and headers, its
  // body, the time to receive it, keep-alive idle time, one write (a client
  // that stops reading a stream that long is dropped and its request
  // aborted), and how many large bodies are read at once.
  HttpLimits http;
  // Clients must send Authorization: Bearer <api_key> except on the
  // api_key_exempt paths (HttpService::requireApiKey); empty: no key.
  std::string api_key;
  std::vector<std::string> api_key_exempt;
  // The chat template for /v1/chat/completions and /tokenize (load it with
  // ChatTemplate::load at start-up); null: the model has none.
  std::shared_ptr<const ChatTemplate> chat_template;
  // --tool-call-parser / --reasoning-parser for chat output.
  protocol::ChatOutputOptions chat_output;
  // What a request leaves out is taken from here (--generation-config).
  protocol::GenerationDefaults generation_defaults;
  // --return-tokens-as-token-ids (ServerLimits::return_tokens_as_token_ids).
  bool return_tokens_as_token_ids = false;
  // Begins the agent's drain (POST /admin/drain); null: the route answers
  // 400. Called on a worker thread; must return at once.
  std::function<void()> on_drain;
};

class HttpServer {
 public:
  HttpServer(engine::Engine& engine, const ServerConfig& config);
  ~HttpServer();

  // Binds the listening socket; throws tandem::Error when it cannot.
  void bind();
  int port() const { return port_; }
  // Serves until stop(); blocks.
  void serve();
  // Stops accepting; in-flight requests end as the engine finishes or aborts
  // them. Safe from any thread (not from a signal handler).
  void stop();
  void setReady(bool ready) { ready_ = ready; }
  // Waits until no completion request is being answered (streams fully
  // written), or the deadline passes. Call before stop() when draining:
  // stop() cuts streams that are still being written.
  void waitForIdle(std::chrono::steady_clock::time_point deadline);
  AgentMetrics& metrics() { return metrics_; }

 private:
  void routes();
  // A finished request (or a pull-back lend) whose answer never reached its
  // client: blocks held for a remote reader that will never learn where
  // they are (`kv_transfer_params`, the answer's descriptor) are freed now
  // rather than at the hold timeout. Blocks on the engine: worker pool only.
  bool releaseUndelivered(const nlohmann::json& kv_transfer_params);

  engine::Engine& engine_;
  ServerConfig config_;
  ServerLimits limits_;
  AgentMetrics metrics_;
  int port_ = 0;
  std::atomic<bool> ready_{true};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_requests_{0};
  // Last: route coroutines cut by stop() are destroyed with its io_context,
  // and touch the members above (active_requests_) as they go.
  std::unique_ptr<HttpService> http_;
};

}  // namespace tandem::server
