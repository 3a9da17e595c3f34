#include "agent/server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "common/status.h"

namespace tandem::server {
namespace {

using engine::Clock;
using nlohmann::json;

// Outputs of one request, handed from the engine thread to its HTTP thread.
class OutputChannel {
 public:
  void push(const engine::RequestOutput& output) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(output);
      if (output.finished()) finished_ = true;
    }
    ready_.notify_one();
  }
  engine::RequestOutput pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty(); });
    engine::RequestOutput output = std::move(items_.front());
    items_.pop_front();
    return output;
  }
  bool finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<engine::RequestOutput> items_;
  bool finished_ = false;
};

// Client-side latency bookkeeping, touched only by the engine thread.
struct LatencyClock {
  Clock::time_point arrival;
  Clock::time_point last_token{};
};

void sendError(httplib::Response& res, const ApiError& error, int retry_after_seconds = 0) {
  res.status = error.status;
  if ((error.status == 503 || error.status == 429) && retry_after_seconds > 0) {
    res.set_header("Retry-After", std::to_string(retry_after_seconds));
  }
  res.set_content(errorBody(error).dump(), "application/json");
}

int64_t unixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string randomHex(uint64_t counter) {
  static const uint64_t process_salt = std::random_device{}();
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(process_salt),
                static_cast<unsigned long long>(counter));
  return text;
}

}  // namespace

HttpServer::HttpServer(engine::Engine& engine, const ServerConfig& config)
    : engine_(engine),
      config_(config),
      metrics_(config.served_model_name, config.role),
      http_(std::make_unique<httplib::Server>()) {
  limits_.served_model_name = config_.served_model_name;
  limits_.max_model_len = engine_.maxModelLen();
  limits_.vocab_size = engine_.model().config().vocab_size;
  const int threads = config_.http_threads > 0
                          ? config_.http_threads
                          : static_cast<int>(engine_.config().scheduler.max_num_seqs) + 16;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() {
  // cpp-httplib as packaged listens with a backlog of 5: a burst of clients
  // overflows it and the kernel resets connections. Learn the listening
  // socket as it is created and raise its backlog after bind (Linux applies a
  // second listen() to a listening socket).
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = sock;
  });
  if (config_.port == 0) {
    port_ = http_->bind_to_any_port(config_.host);
  } else {
    port_ = http_->bind_to_port(config_.host, config_.port) ? config_.port : -1;
  }
  if (port_ <= 0) {
    throw Error("cannot listen on " + config_.host + ":" + std::to_string(config_.port));
  }
  constexpr int kListenBacklog = 4096;  // the kernel caps it at net.core.somaxconn
  if (listen_fd >= 0 && ::listen(listen_fd, kListenBacklog) != 0) {
    TANDEM_LOG(kWarn) << "cannot raise the listen backlog: " << std::strerror(errno);
  }
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::waitForIdle(std::chrono::steady_clock::time_point deadline) {
  while (active_requests_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void HttpServer::stop() {
  if (http_) http_->stop();
}

void HttpServer::routes() {
  auto completions = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      const Tokenizer& tokenizer = engine_.tokenizer();
      Result<ParsedRequest> parsed = chat ? parseChatCompletionRequest(req.body, limits_, tokenizer)
                                          : parseCompletionRequest(req.body, limits_, tokenizer);
      if (!parsed.isOk()) {
        metrics_.observeRejected("invalid");
        return sendError(res, parsed.error());
      }
      // Counted until the last byte is written (streams: until the provider
      // is released), so a drain can wait for it.
      active_requests_.fetch_add(1);
      auto active =
          std::shared_ptr<void>(nullptr, [this](void*) { active_requests_.fetch_sub(1); });
      ParsedRequest request = std::move(parsed).value();
      const std::string id = randomHex(next_id_.fetch_add(1));
      request.request.id = id;
      request.request.arrival = Clock::now();
      request.request.kv_transfer_params = request.kv_transfer_params;
      ResponseMeta meta = makeResponseMeta(request, id, unixSeconds());
      // Responses carry the engine's transfer parameters, never an echo.
      meta.kv_transfer_params = nullptr;

      auto channel = std::make_shared<OutputChannel>();
      auto latency = std::make_shared<LatencyClock>();
      latency->arrival = request.request.arrival;
      auto callback = [this, channel, latency](const engine::RequestOutput& output) {
        const auto now = Clock::now();
        if (!output.tokens.empty()) {
          if (latency->last_token == Clock::time_point{}) {
            metrics_.observeTimeToFirstToken(
                std::chrono::duration<double>(now - latency->arrival).count());
          } else {
            metrics_.observeInterTokenLatency(
                std::chrono::duration<double>(now - latency->last_token).count());
          }
          latency->last_token = now;
        }
        if (output.finished()) {
          metrics_.observeFinished(output,
                                   std::chrono::duration<double>(now - latency->arrival).count());
        }
        channel->push(output);
      };
      Status status = engine_.addRequest(std::move(request.request), callback);
      if (!status.isOk()) {
        const bool overloaded = status.code() == StatusCode::kResourceExhausted ||
                                status.code() == StatusCode::kUnavailable;
        metrics_.observeRejected(overloaded ? "rejected" : "invalid");
        ApiError error = fromStatus(status);
        if (overloaded) {
          error.status = 503;
          error.type = "service_unavailable";
        }
        return sendError(res, error, config_.retry_after_seconds);
      }

      if (!request.stream) {
        engine::RequestOutput total;
        for (;;) {
          engine::RequestOutput output = channel->pop();
          appendOutput(total, output);
          if (output.finished()) break;
        }
        if (total.finish_reason == engine::FinishReason::kError) {
          return sendError(res, engineError(total));
        }
        meta.kv_transfer_params = total.kv_transfer_params;
        json body = chat ? chatCompletionResponse(meta, total, tokenizer)
                         : completionResponse(meta, total, tokenizer);
        res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace),
                        "application/json");
        return;
      }

      res.set_header("Cache-Control", "no-cache");
      auto stream_state = std::make_shared<StreamState>();
      auto total = std::make_shared<engine::RequestOutput>();
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, channel, meta, stream_state, total, id](size_t, httplib::DataSink& sink) {
            engine::RequestOutput output = channel->pop();
            appendOutput(*total, output);
            std::string data;
            if (output.finish_reason == engine::FinishReason::kError) {
              data += sseEvent(errorBody(engineError(output)));
            } else if (auto chunk = streamChunk(meta, output, engine_.tokenizer(), *stream_state)) {
              // The final chunk tells where the request's KV can be read.
              if (output.finished() && !output.kv_transfer_params.is_null()) {
                (*chunk)["kv_transfer_params"] = output.kv_transfer_params;
              }
              data += sseEvent(*chunk);
            }
            if (output.finished()) {
              if (meta.include_usage) data += sseEvent(usageChunk(meta, *total));
              data += kSseDone;
            }
            if (!data.empty() && !sink.write(data.data(), data.size())) {
              engine_.abort(id);  // the client went away: free its blocks now
              return false;
            }
            if (output.finished()) sink.done();
            return true;
          },
          [this, channel, id, active](bool /*success*/) {
            if (!channel->finished()) engine_.abort(id);
          });
    };
  };
  http_->Post("/v1/completions", completions(false));
  http_->Post("/v1/chat/completions", completions(true));

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", config_.served_model_name},
                  {"object", "model"},
                  {"created", unixSeconds()},
                  {"owned_by", "tandem"},
                  // What a router needs to compute this agent's block hashes.
                  {"tandem",
                   {{"model_identity", engine_.modelIdentity()},
                    {"block_size", engine_.config().block_size},
                    {"prefix_caching_hash", hashAlgorithmName(engine_.config().hash_algorithm)}}},
                  {"root", engine_.model().directory().string()},
                  {"max_model_len", engine_.maxModelLen()}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(),
                    "application/json");
  });

  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!ready_) {
      res.status = 503;
      res.set_content(R"({"status":"shutting_down"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });

  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(engine_.stats(), engine_.takeTransferDurations()),
                    "text/plain; version=0.0.4");
  });

  http_->Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto result = tokenizeResponse(req.body, limits_, engine_.tokenizer());
    if (!result.isOk()) return sendError(res, result.error());
    res.set_content(result.value().dump(), "application/json");
  });
  http_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto result = detokenizeResponse(req.body, limits_, engine_.tokenizer());
    if (!result.isOk()) return sendError(res, result.error());
    res.set_content(result.value().dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  });

  // The router's explicit release of blocks held for a transfer it abandons;
  // the body carries the kv_transfer_params this agent returned.
  http_->Post(
      "/v1/kv_transfer/release", [this](const httplib::Request& req, httplib::Response& res) {
        json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
        if (body.is_discarded() || !body.is_object() || !body.contains("kv_transfer_params") ||
            !body["kv_transfer_params"].is_object()) {
          return sendError(res, invalidRequest("the body must be a JSON object with the object "
                                               "kv_transfer_params returned by this agent",
                                               "kv_transfer_params"));
        }
        Status released = engine_.releaseTransfer(body["kv_transfer_params"]);
        if (!released.isOk()) return sendError(res, fromStatus(released, "kv_transfer_params"));
        res.set_content(json{{"released", true}}.dump(), "application/json");
      });

  // Pull-back: pins the cached leading blocks of a prompt for a prefill agent
  // to read (the router asks the decode agent that holds a conversation).
  http_->Post("/v1/kv_transfer/hold", [this](const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      return sendError(res, invalidRequest("the body must be a JSON object"));
    }
    const auto ids = body.find("token_ids");
    const int64_t vocab = engine_.model().config().vocab_size;
    std::vector<TokenId> tokens;
    bool valid = ids != body.end() && ids->is_array() && !ids->empty() &&
                 static_cast<int64_t>(ids->size()) <= engine_.maxModelLen();
    for (size_t i = 0; valid && i < ids->size(); ++i) {
      const json& id = (*ids)[i];
      valid = id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab;
      if (valid) tokens.push_back(id.get<TokenId>());
    }
    if (!valid) {
      return sendError(res, invalidRequest("token_ids must be a non-empty array of at most " +
                                               std::to_string(engine_.maxModelLen()) +
                                               " token ids in [0, " + std::to_string(vocab) + ")",
                                           "token_ids"));
    }
    std::string salt;
    if (auto it = body.find("cache_salt"); it != body.end()) {
      if (!it->is_string()) {
        return sendError(res, invalidRequest("cache_salt must be a string", "cache_salt"));
      }
      salt = it->get<std::string>();
    }
    auto held = engine_.holdPrefix(std::move(tokens), std::move(salt));
    if (!held.isOk()) return sendError(res, fromStatus(held.status(), "token_ids"));
    res.set_content(
        json{{"kv_transfer_params", *held}, {"num_tokens", (*held)["remote_num_tokens"]}}.dump(),
        "application/json");
  });

  http_->Get("/v1/kv_events", [this](const httplib::Request& req, httplib::Response& res) {
    uint64_t after = 0;
    if (req.has_param("since")) {
      try {
        after = std::stoull(req.get_param_value("since"));
      } catch (const std::exception&) {
        return sendError(res, invalidRequest("since must be a non-negative integer, got \"" +
                                                 req.get_param_value("since") + "\"",
                                             "since"));
      }
    }
    res.set_header("Cache-Control", "no-cache");
    auto cursor = std::make_shared<uint64_t>(after);
    auto idle_since = std::make_shared<Clock::time_point>(Clock::now());
    res.set_chunked_content_provider(
        "text/event-stream", [this, cursor, idle_since](size_t, httplib::DataSink& sink) {
          engine::KvEventPage page = engine_.kvEvents().eventsSince(*cursor, 512);
          std::string data;
          if (page.needs_snapshot) {
            // The reader fell behind what is retained: resynchronise it.
            engine::KvSnapshot snapshot = engine_.kvSnapshot();
            json hashes = json::array();
            for (const auto& hash : snapshot.block_hashes) hashes.push_back(hash.toHex());
            data += sseEvent(json{{"sequence", snapshot.sequence},
                                  {"type", "Snapshot"},
                                  {"block_hashes", std::move(hashes)}});
            *cursor = snapshot.sequence;
          } else {
            for (const auto& event : page.events) data += sseEvent(engine::toJson(event));
            if (!page.events.empty()) *cursor = page.events.back().sequence;
          }
          if (data.empty()) {
            if (Clock::now() - *idle_since < std::chrono::seconds(10)) {
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
              return sink.is_writable();
            }
            data = ": keep-alive\n\n";  // detects clients that went away
          }
          *idle_since = Clock::now();
          return sink.write(data.data(), data.size());
        });
  });
}

}  // namespace tandem::server
