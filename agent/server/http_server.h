// The agent's HTTP API (cpp-httplib): OpenAI-compatible completions and chat
// completions (streamed as Server-Sent Events or whole), models, health,
// metrics, tokenize/detokenize and the KV event stream for the router.
//
// HTTP threads only parse, enqueue into the engine and stream what the engine
// thread hands them; they never compute. Each connection is served on a pool
// thread, so the pool is sized for max_num_seqs streams plus headroom. A client
// that goes away mid-stream has its request aborted, which frees its blocks.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "agent/engine/engine.h"
#include "agent/server/metrics.h"
#include "agent/server/openai_protocol.h"

namespace httplib {
class Server;
}

namespace tandem::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (read it back from port())
  std::string served_model_name;
  std::string role = "both";  // metrics label: prefill, decode or both
  int http_threads = 0;       // 0: max_num_seqs + 16
  int retry_after_seconds = 1;
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

  engine::Engine& engine_;
  ServerConfig config_;
  ServerLimits limits_;
  AgentMetrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<bool> ready_{true};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_requests_{0};
};

}  // namespace tandem::server
