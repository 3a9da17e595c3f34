#include "agent/server/http_server.h"

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/http/http_connection.h"
#include "common/kv_auth.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/backend.h"

namespace tandem::server {
namespace {

using engine::Clock;
using nlohmann::json;

// Outputs of one request, handed from the engine thread to its connection:
// push() queues and wakes the connection's coroutine, which drains the queue
// with tryPop() and otherwise awaits HttpExchange::wait().
class OutputChannel {
 public:
  explicit OutputChannel(std::shared_ptr<HttpWaker> waker) : waker_(std::move(waker)) {}
  void push(const engine::RequestOutput& output) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(output);
    }
    waker_->wake();
  }
  std::optional<engine::RequestOutput> tryPop() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (items_.empty()) return std::nullopt;
    engine::RequestOutput output = std::move(items_.front());
    items_.pop_front();
    return output;
  }

 private:
  std::shared_ptr<HttpWaker> waker_;
  std::mutex mutex_;
  std::deque<engine::RequestOutput> items_;
};

// Counts a completion request as active for its lifetime (a drain waits for
// the count to reach zero: until the last byte of a stream is written).
class ActiveRequest {
 public:
  explicit ActiveRequest(std::atomic<int>& count) : count_(count) { count_.fetch_add(1); }
  ~ActiveRequest() { count_.fetch_sub(1); }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

 private:
  std::atomic<int>& count_;
};

// Client-side latency bookkeeping, touched only by the engine thread.
struct LatencyClock {
  Clock::time_point arrival;
  Clock::time_point last_token{};
};

// The engine's output callback of one request: its latency metrics, then
// the output to the connection. `resumed_tokens`: the tokens of a resumed
// stream another agent generated (counted there).
engine::Engine::OutputCallback outputCallback(AgentMetrics& metrics,
                                              std::shared_ptr<OutputChannel> channel,
                                              Clock::time_point arrival,
                                              int64_t resumed_tokens = 0) {
  auto latency = std::make_shared<LatencyClock>();
  latency->arrival = arrival;
  return [&metrics, channel = std::move(channel), latency,
          resumed_tokens](const engine::RequestOutput& output) {
    const auto now = Clock::now();
    if (!output.tokens.empty()) {
      if (latency->last_token == Clock::time_point{}) {
        metrics.observeTimeToFirstToken(
            std::chrono::duration<double>(now - latency->arrival).count());
      } else {
        metrics.observeInterTokenLatency(
            std::chrono::duration<double>(now - latency->last_token).count());
      }
      latency->last_token = now;
    }
    if (output.finished()) {
      metrics.observeFinished(output, std::chrono::duration<double>(now - latency->arrival).count(),
                              resumed_tokens);
    }
    channel->push(output);
  };
}

// The answer to a request the engine did not take: 503 when it is full or
// draining, else the status's own.
ApiError refusedByEngine(AgentMetrics& metrics, const Status& status) {
  const bool overloaded =
      status.code() == StatusCode::kResourceExhausted || status.code() == StatusCode::kUnavailable;
  metrics.observeRejected(overloaded ? "rejected" : "invalid");
  ApiError error = fromStatus(status);
  if (overloaded) {
    error.status = 503;
    error.type = "service_unavailable";
  }
  return error;
}

void sendError(HttpResponse& res, const ApiError& error, int retry_after_seconds = 0) {
  res.status = error.status;
  if ((error.status == 503 || error.status == 429) && retry_after_seconds > 0) {
    res.set_header("Retry-After", std::to_string(retry_after_seconds));
  }
  // compactDump: a message may quote a client's bytes; never throw on them.
  res.set_content(compactDump(errorBody(error)), "application/json");
}

HttpResponse errorResponse(const ApiError& error, int retry_after_seconds = 0) {
  HttpResponse res;
  sendError(res, error, retry_after_seconds);
  return res;
}

// A constraint whose spec is this long compiles to a grammar whose first
// compile allocates much and frees it (CompiledGrammar's classification).
constexpr size_t kLargeConstraintBytes = 16 * 1024;

HttpResponse jsonResponse(const ResponseJson& body) {
  HttpResponse res;
  res.set_content(compactDump(body), "application/json");
  return res;
}

HttpHeaders noCache() { return {{"Cache-Control", "no-cache"}}; }

// The SSE text for one step's output of a stream (the final step adds the
// usage chunk and [DONE]); `total` accumulates the outputs.
std::string streamEvents(const ResponseMeta& meta, const engine::RequestOutput& output,
                         const Tokenizer& tokenizer, StreamState& state,
                         engine::RequestOutput& total) {
  appendOutput(total, output);
  std::string data;
  if (output.finish_reason == engine::FinishReason::kError) {
    data += sseEvent(errorBody(engineError(output)));
  } else if (auto chunk = streamChunk(meta, output, tokenizer, state)) {
    // The final chunk tells where the request's KV can be read.
    if (output.finished() && !output.kv_transfer_params.is_null()) {
      (*chunk)["kv_transfer_params"] = output.kv_transfer_params;
    }
    data += sseEvent(*chunk);
  }
  if (output.finished()) {
    if (meta.include_usage) data += sseEvent(usageChunk(meta, total));
    data += kSseDone;
  }
  return data;
}

// The last event of a stream handed over on drain (Engine::drain): where
// the agent resuming it reads the blocks held for it. No [DONE] follows:
// the answer goes on elsewhere (docs/operations.md, "Draining").
std::string handOverEvent(const engine::RequestOutput& output) {
  return sseEvent(json{{"tandem_handover", {{"kv_transfer_params", output.kv_transfer_params}}}});
}

// The whole answer of a finished non-streamed request.
HttpResponse wholeResponse(ResponseMeta meta, const engine::RequestOutput& total, bool chat,
                           const Tokenizer& tokenizer) {
  if (total.finish_reason == engine::FinishReason::kError) {
    return errorResponse(engineError(total));
  }
  meta.kv_transfer_params = total.kv_transfer_params;
  return jsonResponse(chat ? chatCompletionResponse(meta, total, tokenizer)
                           : completionResponse(meta, total, tokenizer));
}

// A sequence number: decimal digits only, within 64 bits.
std::optional<uint64_t> parseSequence(const std::string& text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::string snapshotEvent(const engine::KvSnapshot& snapshot) {
  json hashes = json::array();
  for (const auto& hash : snapshot.block_hashes) hashes.push_back(hash.toHex());
  return sseEvent(json{
      {"sequence", snapshot.sequence}, {"type", "Snapshot"}, {"block_hashes", std::move(hashes)}});
}

std::string eventsText(const engine::KvEventPage& page) {
  std::string data;
  for (const auto& event : page.events) data += sseEvent(engine::toJson(event));
  return data;
}

int64_t unixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A router's request for signs of life while a whole answer is generated
// (kProgressHeader, milliseconds): nothing else is written until the
// answer is complete, so an interim 102 Processing now and then.
class SignsOfLife {
 public:
  explicit SignsOfLife(const HttpRequest& request) {
    const std::string every = request.header(kProgressHeader);
    const long millis = every.empty() ? 0 : std::strtol(every.c_str(), nullptr, 10);
    if (millis > 0) every_ = std::chrono::milliseconds(std::min(millis, 3'600'000L));
  }
  // How long a wait may last before the next sign is due (none: for ever).
  std::optional<std::chrono::steady_clock::duration> interval() const { return every_; }
  // Writes a sign when one is due, and one saying so (kFirstTokenHeader)
  // as soon as `generated` says the first token is there; false when the
  // client is gone.
  boost::asio::awaitable<bool> give(HttpExchange& exchange, bool generated) {
    if (!every_) co_return true;
    if (generated && !told_first_) {
      told_first_ = true;
      last_ = std::chrono::steady_clock::now();
      HttpHeaders first_token;
      first_token.emplace_back(kFirstTokenHeader, "1");
      co_return co_await exchange.writeProcessing(std::move(first_token));
    }
    if (std::chrono::steady_clock::now() - last_ < *every_) co_return true;
    last_ = std::chrono::steady_clock::now();
    co_return co_await exchange.writeProcessing();
  }

 private:
  std::optional<std::chrono::steady_clock::duration> every_;
  bool told_first_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// One prompt's request and response details, for answerChoices.
struct ChoiceGroup {
  ParsedRequest request;
  ResponseMeta meta;
};

// n > 1, best_of > n, or several prompts (a batch, one group each): one
// engine request per candidate ("<id>-<i>", or "<id>-<prompt>-<i>" in a
// batch; with a seed, candidate i samples with seed + i). A prompt's first
// candidate is sent alone; its others once it has its first token, so they
// find the prompt's blocks in the prefix cache and compute only its last
// partial block (and take its prompt logprobs, which are the same). Whole:
// one answer with a choice per request — with best_of > n, each prompt's n
// candidates with the largest sum of token logprobs, best first; prompt
// p's choices are indexed from p * n. Streamed (best_of = n): each step's
// chunk carries its choice's index, and the usage chunk and [DONE] follow
// the last choice's end. Usage: each prompt once, every candidate's tokens.
// An error in any candidate ends the answer with that error; the client
// leaving aborts all.
boost::asio::awaitable<void> answerChoices(HttpExchange& exchange, engine::Engine& engine,
                                           AgentMetrics& metrics, std::vector<ChoiceGroup> groups,
                                           bool chat, int retry_after_seconds) {
  const Tokenizer& tokenizer = engine.tokenizer();
  const ParsedRequest& head = groups.front().request;
  const auto n = static_cast<size_t>(head.best_of);  // candidates per prompt
  const auto returned = static_cast<size_t>(head.n);
  const bool ranked = n > returned;
  const bool stream = head.stream;
  const size_t total_candidates = groups.size() * n;
  const std::string id = head.request.id;
  auto channel = std::make_shared<OutputChannel>(exchange.waker());
  // Candidate c is prompt c / n's candidate c % n.
  std::vector<std::string> ids;
  std::map<std::string, size_t> index_of;
  for (size_t c = 0; c < total_candidates; ++c) {
    ids.push_back(groups.size() == 1
                      ? id + "-" + std::to_string(c)
                      : id + "-" + std::to_string(c / n) + "-" + std::to_string(c % n));
    index_of[ids.back()] = c;
  }
  // Candidates sent to the engine; the first refusal ends the answer.
  size_t added = 0;
  std::optional<ApiError> failed;
  // A stopping engine waits for a prompt's later candidates once its first
  // is admitted: told when they are added, and whenever this answer ends.
  struct AwaitedJoins {
    engine::Engine& engine;
    std::vector<std::string> first_ids;
    ~AwaitedJoins() {
      for (const std::string& first_id : first_ids) engine.joinsEnded(first_id);
    }
  } awaited{engine, {}};
  auto add = [&](size_t c) {
    engine::Request child = groups[c / n].request.request;
    const size_t i = c % n;
    child.id = ids[c];
    child.hand_over_on_drain = false;  // several streams in one: not movable
    child.can_hand_over = false;
    // The first asks room for all; the others, added once it has its first
    // token, are part of an admitted request.
    child.admission_places = i == 0 ? static_cast<int64_t>(n) : 1;
    if (i > 0) child.joins = ids[c - i];
    if (child.sampling.seed) child.sampling.seed = *child.sampling.seed + i;
    // The first computes the prompt's logprobs; the others read its blocks.
    if (i > 0) child.sampling.prompt_logprobs.reset();
    // Ranking needs each token's logprob (reported only if asked for).
    if (ranked && !child.sampling.logprobs) child.sampling.logprobs = 0;
    auto callback = outputCallback(metrics, channel, child.arrival);
    if (Status status = engine.addRequest(std::move(child), std::move(callback)); !status.isOk()) {
      failed = refusedByEngine(metrics, status);
    } else {
      ++added;
      if (i == 0 && n > 1) awaited.first_ids.push_back(ids[c]);
    }
  };
  auto abortAll = [&] {
    for (const std::string& child : ids) engine.abort(child);
  };
  for (size_t g = 0; g < groups.size() && !failed; ++g) add(g * n);
  std::vector<engine::RequestOutput> totals(total_candidates);
  std::vector<StreamState> states(total_candidates);
  std::deque<engine::RequestOutput> pending;  // outputs before the stream started
  std::vector<std::vector<engine::GeneratedToken>> prompt_logprobs(groups.size());
  std::vector<bool> seen(total_candidates, false);
  SignsOfLife signs(exchange.request());
  size_t finished = 0;
  bool started = false;
  while (finished < total_candidates && !failed) {
    while (auto output = channel->tryPop()) {
      const size_t c = index_of.at(output->request_id);
      const size_t g = c / n;
      if (!seen[c]) {
        seen[c] = true;
        if (c % n == 0) {
          prompt_logprobs[g] = output->prompt_logprobs;
          if (output->finish_reason == engine::FinishReason::kAbort) {
            // Aborted before it began (a stop's deadline): its other choices
            // end so too, as a request of one choice would, rather than be
            // refused by an engine that takes no more.
            for (size_t i = 1; i < n; ++i) {
              engine::RequestOutput aborted;
              aborted.request_id = ids[g * n + i];
              aborted.finish_reason = engine::FinishReason::kAbort;
              aborted.num_prompt_tokens = output->num_prompt_tokens;
              seen[g * n + i] = true;
              ++finished;
              ++added;
              pending.push_back(std::move(aborted));
            }
          } else {
            // The prompt is computed and cached: its other choices now.
            for (size_t i = 1; i < n && !failed; ++i) add(g * n + i);
          }
          engine.joinsEnded(ids[g * n]);
        } else {
          output->prompt_logprobs = prompt_logprobs[g];
        }
      }
      if (output->finished()) ++finished;
      if (output->finish_reason == engine::FinishReason::kError) failed = engineError(*output);
      pending.push_back(std::move(*output));
      if (failed) break;
    }
    if (failed) break;
    if (stream && added == total_candidates) {
      if (!started) {
        const bool headers_sent =
            co_await exchange.startChunked(200, "text/event-stream", noCache());
        if (!headers_sent) {
          abortAll();
          co_return;
        }
        started = true;
      }
      std::string data;
      for (; !pending.empty(); pending.pop_front()) {
        const engine::RequestOutput& output = pending.front();
        const size_t c = index_of.at(output.request_id);
        appendOutput(totals[c], output);
        if (auto chunk = streamChunk(groups[c / n].meta, output, tokenizer, states[c])) {
          (*chunk)["choices"][0]["index"] = c;
          data += sseEvent(*chunk);
        }
      }
      if (!data.empty()) {
        const bool written = co_await exchange.writeChunk(std::move(data));
        if (!written) {
          abortAll();
          co_return;
        }
      }
    }
    if (finished < total_candidates && !stream) {
      // The first token is there once every prompt has its first.
      bool first_tokens = true;
      for (size_t c = 0; c < total_candidates; c += n) first_tokens = first_tokens && seen[c];
      const bool there = co_await signs.give(exchange, first_tokens);
      if (!there) {
        abortAll();
        co_return;
      }
    }
    if (finished < total_candidates) {
      const bool there = co_await exchange.wait(stream ? std::nullopt : signs.interval());
      if (!there) {
        abortAll();
        co_return;
      }
    }
  }
  if (failed) {
    abortAll();
    if (started) {
      // As one answer's stream ends after an error: [DONE] follows.
      co_await exchange.writeChunk(sseEvent(errorBody(*failed)) + std::string(kSseDone));
      co_await exchange.finishChunked();
    } else {
      co_await exchange.respond(errorResponse(*failed, retry_after_seconds));
    }
    co_return;
  }
  for (; !pending.empty(); pending.pop_front()) {
    appendOutput(totals[index_of.at(pending.front().request_id)], pending.front());
  }
  // Usage: each prompt once (its first candidate's count), every
  // candidate's tokens.
  engine::RequestOutput usage = totals[0];
  usage.num_prompt_tokens = 0;
  usage.num_cached_tokens = 0;
  usage.num_generated_tokens = 0;
  for (size_t c = 0; c < total_candidates; ++c) {
    if (c % n == 0) {
      usage.num_prompt_tokens += totals[c].num_prompt_tokens;
      usage.num_cached_tokens += totals[c].num_cached_tokens;
    }
    usage.num_generated_tokens += totals[c].num_generated_tokens;
  }
  if (stream) {
    std::string data;
    if (head.include_usage) data += sseEvent(usageChunk(groups.front().meta, usage));
    data += kSseDone;
    const bool written = co_await exchange.writeChunk(std::move(data));
    if (written) co_await exchange.finishChunked();
    co_return;
  }
  // A prompt's candidates in the order they are returned: best_of > n
  // ranks them by the sum of their tokens' logprobs (raw, as reported),
  // ties to the smaller index.
  std::vector<double> score(total_candidates, 0.0);
  for (size_t c = 0; ranked && c < total_candidates; ++c) {
    for (const engine::GeneratedToken& token : totals[c].tokens) score[c] += token.logprob;
  }
  ResponseJson body;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = g * n + i;
    if (ranked) {
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return score[a] > score[b]; });
    }
    for (size_t i = 0; i < returned; ++i) {
      const ResponseMeta& meta = groups[g].meta;
      ResponseJson one = chat ? chatCompletionResponse(meta, totals[order[i]], tokenizer)
                              : completionResponse(meta, totals[order[i]], tokenizer);
      ResponseJson choice = std::move(one["choices"][0]);
      choice["index"] = g * returned + i;
      if (g == 0 && i == 0) {
        body = std::move(one);
        body["choices"] = ResponseJson::array();
      }
      body["choices"].push_back(std::move(choice));
    }
  }
  body["usage"] = usageJson(usage);
  co_await exchange.respond(jsonResponse(body));
}

}  // namespace

HttpServer::HttpServer(engine::Engine& engine, const ServerConfig& config)
    : engine_(engine), config_(config), metrics_(config.served_model_name, config.role) {
  http_ = std::make_unique<HttpService>(config_.http, config_.io_threads, config_.worker_threads);
  http_->requireApiKey(config_.api_key, config_.api_key_exempt);
  limits_.served_model_name = config_.served_model_name;
  std::vector<std::string> adapters;
  for (const auto& adapter : engine_.adapters()) adapters.push_back(adapter.name);
  metrics_.setLoraAdapters(adapters);
  if (!adapters.empty()) limits_.lora_adapters = [adapters] { return adapters; };
  limits_.max_model_len = engine_.maxModelLen();
  limits_.kv_cache_tokens = engine_.numBlocks() * engine_.config().block_size;
  limits_.vocab_size = engine_.model().config().vocab_size;
  limits_.chat_template = config_.chat_template;
  limits_.chat_output = config_.chat_output;
  limits_.generation_defaults = config_.generation_defaults;
  limits_.return_tokens_as_token_ids = config_.return_tokens_as_token_ids;
  metrics_.setDevice(kernels::deviceKindName(engine_.backend().kind()),
                     engine_.backend().description());
  if (const engine::StepProfile* profile = engine_.simulatedProfile()) {
    metrics_.setSimulated(profile->name);
  }
  metrics_.setKvBuffer(engine_.kvConnectorInfo());
  routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() {
  // A burst of clients overflows a short accept queue and the kernel resets
  // connections: listen with a deep one (the kernel caps it at
  // net.core.somaxconn).
  constexpr int kListenBacklog = 4096;
  port_ = http_->bind(config_.host, config_.port, kListenBacklog);
}

void HttpServer::serve() { http_->serve(); }

void HttpServer::waitForIdle(std::chrono::steady_clock::time_point deadline) {
  while (active_requests_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void HttpServer::stop() {
  if (http_) http_->stop();
}

bool HttpServer::releaseUndelivered(const nlohmann::json& kv_transfer_params) {
  if (!kv_transfer_params.is_object()) return false;
  Status released = engine_.releaseTransfer(kv_transfer_params);
  // Not found: the request's abort released them first.
  if (!released.isOk() && released.code() != StatusCode::kNotFound) {
    TANDEM_LOG(kWarn) << "releasing the KV of an undelivered answer: " << released.message();
  }
  return released.isOk();
}

void HttpServer::routes() {
  auto completions = [this](bool chat) {
    return [this, chat](HttpExchange& exchange) -> boost::asio::awaitable<void> {
      const Tokenizer& tokenizer = engine_.tokenizer();
      const std::string* body = &exchange.request().body;
      // Parsing tokenizes the prompt and renders a chat template: worker
      // pool, not an io thread; a client leaving cancels the rendering.
      std::atomic<bool> cancel{false};
      Result<ParsedRequest> parsed = co_await exchange.offload<Result<ParsedRequest>>(
          [this, chat, body, &tokenizer, &cancel] {
            Result<ParsedRequest> result =
                chat ? parseChatCompletionRequest(*body, limits_, tokenizer, &cancel)
                     : parseCompletionRequest(*body, limits_, tokenizer);
            // A constraint's first compile for the vocabulary (its element
            // classes walk the vocabulary) here, not on the connection's
            // thread in addRequest; its errors come back from addRequest.
            if (result.isOk() && result.value().request.structured_output) {
              const structured::Constraint& constraint = *result.value().request.structured_output;
              (void)engine_.prepareStructuredOutput(constraint);
              // Classifying a large grammar's elements allocates hundreds
              // of MB it frees again, in this worker's arena: give it back.
              if (constraint.spec.size() > kLargeConstraintBytes) http_->trimSoon();
            }
            return result;
          },
          cancel);
      if (exchange.clientGone()) co_return;  // nobody to answer; nothing started
      if (!parsed.isOk()) {
        metrics_.observeRejected("invalid");
        co_await exchange.respond(errorResponse(parsed.error()));
        co_return;
      }
      ActiveRequest active(active_requests_);
      ParsedRequest request = std::move(parsed).value();
      const std::string id = exchange.request().id;
      request.request.id = id;
      request.request.arrival = Clock::now();
      request.request.kv_transfer_params = request.kv_transfer_params;
      // A router that can move a stream asks for it to be handed over,
      // rather than finished here, when this agent drains.
      request.request.hand_over_on_drain =
          request.stream && exchange.request().header(kHandOverHeader) == "drain";
      request.request.can_hand_over = request.stream;
      ResponseMeta meta = makeResponseMeta(request, id, unixSeconds());
      // Responses carry the engine's transfer parameters, never an echo.
      meta.kv_transfer_params = nullptr;
      if (!request.request.adapter.empty()) metrics_.observeLoraRequest(request.request.adapter);

      if (request.best_of > 1 || !request.batch.empty()) {
        // Every candidate is held by the engine at once: more than it holds
        // could never be admitted.
        if (const int64_t most = engine_.maxRequestsHeld(); engineRequestsOf(request) > most) {
          metrics_.observeRejected("invalid");
          co_await exchange.respond(errorResponse(tooManyEngineRequests(
              request, most,
              "this agent (--max-num-seqs " +
                  std::to_string(engine_.config().scheduler.max_num_seqs) +
                  " + --max-waiting-requests " +
                  std::to_string(engine_.config().max_waiting_requests) + ")")));
          co_return;
        }
        std::vector<ChoiceGroup> groups;
        std::vector<ParsedRequest> batch = std::move(request.batch);
        request.batch.clear();
        groups.push_back({std::move(request), meta});
        for (ParsedRequest& other : batch) {
          other.request.id = id;
          other.request.arrival = groups.front().request.request.arrival;
          ResponseMeta other_meta = makeResponseMeta(other, id, meta.created);
          other_meta.kv_transfer_params = nullptr;
          groups.push_back({std::move(other), std::move(other_meta)});
        }
        co_await answerChoices(exchange, engine_, metrics_, std::move(groups), chat,
                               config_.retry_after_seconds);
        co_return;
      }
      auto channel = std::make_shared<OutputChannel>(exchange.waker());
      auto callback = outputCallback(metrics_, channel, request.request.arrival,
                                     static_cast<int64_t>(request.request.resume_output.size()));
      const bool stream = request.stream;
      Status status = engine_.addRequest(std::move(request.request), callback);
      if (!status.isOk()) {
        co_await exchange.respond(
            errorResponse(refusedByEngine(metrics_, status), config_.retry_after_seconds));
        co_return;
      }

      if (!stream) {
        SignsOfLife signs(exchange.request());
        engine::RequestOutput total;
        for (bool finished = false; !finished;) {
          while (auto output = channel->tryPop()) {
            appendOutput(total, *output);
            if ((finished = output->finished())) break;
          }
          if (finished) break;
          // The client left before the answer: free its blocks now.
          bool there = co_await signs.give(exchange, total.num_generated_tokens > 0);
          if (there) there = co_await exchange.wait(signs.interval());
          if (!there) {
            engine_.abort(id);
            co_return;
          }
        }
        const bool delivered =
            co_await exchange.respond(wholeResponse(meta, total, chat, tokenizer));
        if (!delivered) {
          co_await exchange.offloadWait<bool>(
              [this, &total] { return releaseUndelivered(total.kv_transfer_params); });
        }
        co_return;
      }

      const bool headers_sent = co_await exchange.startChunked(200, "text/event-stream", noCache());
      if (!headers_sent) {
        engine_.abort(id);
        co_return;
      }
      StreamState stream_state;
      engine::RequestOutput total;
      for (;;) {
        // One chunk per engine step, as it comes: a client times tokens by
        // their arrival, so outputs are not merged into one write.
        while (auto output = channel->tryPop()) {
          if (output->handed_over) {
            const bool written = co_await exchange.writeChunk(handOverEvent(*output));
            if (written) {
              co_await exchange.finishChunked();
            } else {
              // Nobody will read the blocks held for the next agent.
              const engine::RequestOutput* handed = &*output;
              co_await exchange.offloadWait<bool>(
                  [this, handed] { return releaseUndelivered(handed->kv_transfer_params); });
            }
            co_return;
          }
          std::string data = streamEvents(meta, *output, tokenizer, stream_state, total);
          const bool finished = output->finished();
          // A client that left, or stopped reading for the write timeout.
          bool written = true;
          if (!data.empty()) written = co_await exchange.writeChunk(std::move(data));
          if (!written) {
            engine_.abort(id);
            if (finished) {
              co_await exchange.offloadWait<bool>(
                  [this, &total] { return releaseUndelivered(total.kv_transfer_params); });
            }
            co_return;
          }
          if (finished) {
            co_await exchange.finishChunked();
            co_return;
          }
        }
        const bool there = co_await exchange.wait();
        if (!there) {
          engine_.abort(id);
          co_return;
        }
      }
    };
  };
  http_->route("POST", "/v1/completions", completions(false));
  http_->route("POST", "/v1/chat/completions", completions(true));

  http_->get("/v1/models", [this](const HttpRequest&, HttpResponse& res) {
    json model = {
        {"id", config_.served_model_name},
        {"object", "model"},
        {"created", unixSeconds()},
        {"owned_by", "tandem"},
        // What a router needs to compute this agent's block hashes.
        {"tandem",
         {{"model_identity", engine_.modelIdentity()},
          {"block_size", engine_.config().block_size},
          {"prefix_caching_hash", hashAlgorithmName(engine_.config().hash_algorithm)},
          // The tokens its KV cache holds: a router refuses a request no
          // decode agent could hold before a prefill agent computes it.
          {"kv_cache_tokens", limits_.kv_cache_tokens},
          // The requests it lets wait (--max-waiting-requests): a router
          // passes over a decode agent whose queue it saw full, rather
          // than prefill a request that agent would refuse.
          {"max_waiting_requests", engine_.config().max_waiting_requests},
          // The sequences it computes at once (--max-num-seqs): with the
          // waiting bound, how many requests it takes before refusing,
          // which a router counts its own against between two polls.
          {"max_num_seqs", engine_.config().scheduler.max_num_seqs},
          // What a request leaves out is taken from (--generation-config).
          {"generation_defaults", config_.generation_defaults.toJson()},
          // The output parsers, which a router checks requests with.
          {"tool_call_parser",
           config_.chat_output.tool_call_parser
               ? json(protocol::toolCallParserName(*config_.chat_output.tool_call_parser))
               : json(nullptr)},
          {"reasoning_parser",
           config_.chat_output.reasoning_parser
               ? json(protocol::reasoningParserName(*config_.chat_output.reasoning_parser))
               : json(nullptr)}}},
        // Absolute: a router on this host reads the tokenizer from it
        // whatever its own working directory.
        {"root",
         std::filesystem::absolute(engine_.model().directory()).lexically_normal().string()},
        {"max_model_len", engine_.maxModelLen()},
        {"device", kernels::deviceKindName(engine_.backend().kind())}};
    json data = json::array({model});
    // LoRA adapters as vLLM lists them: their own id, the base model as
    // parent, their directory as root; and what their blocks are hashed
    // under (docs/lora.md).
    for (const auto& adapter : engine_.adapters()) {
      data.push_back(
          {{"id", adapter.name},
           {"object", "model"},
           {"created", unixSeconds()},
           {"owned_by", "tandem"},
           {"parent", config_.served_model_name},
           {"root", std::filesystem::absolute(adapter.path).lexically_normal().string()},
           {"max_model_len", engine_.maxModelLen()},
           {"tandem", {{"model_identity", adapter.identity}, {"lora_rank", adapter.rank}}}});
    }
    res.set_content(json{{"object", "list"}, {"data", std::move(data)}}.dump(), "application/json");
  });

  http_->get("/health", [this](const HttpRequest&, HttpResponse& res) {
    const bool draining = engine_.draining();
    if (!ready_ || draining) {
      res.status = 503;
      res.set_content(draining ? R"({"status":"draining"})" : R"({"status":"shutting_down"})",
                      "application/json");
      return;
    }
    // Steps failing in a row with none completing since: the cause (a
    // device error, a KV connector's) outlives the requests it failed, so a
    // liveness probe should restart the process.
    const engine::EngineStats stats = engine_.stats();
    if (stats.consecutive_step_failures >= engine::kFailingAfterSteps) {
      res.status = 503;
      res.set_content(json{{"status", "engine_failing"},
                           {"failed_steps_in_a_row", stats.consecutive_step_failures},
                           {"error", stats.last_step_error}}
                          .dump(),
                      "application/json");
      return;
    }
    // instance_id: what a signed control request names to be accepted here
    // (common/kv_auth.h); a restarted agent has a new one.
    json health = {{"status", "ok"},
                   {"device", kernels::deviceKindName(engine_.backend().kind())},
                   {"device_description", engine_.backend().description()},
                   {"instance_id", kv_auth::instanceId()}};
    // The ucx connector's KV buffer ("kv_buffer": "slab"|"staging", UCX's
    // memory types, staging slots) at the top level.
    if (const engine::StepProfile* profile = engine_.simulatedProfile()) {
      health["simulated"] = profile->name;
    }
    json kv = engine_.kvConnectorInfo();
    if (kv.is_object()) health.update(kv);
    res.set_content(health.dump(), "application/json");
  });

  http_->get("/metrics", [this](const HttpRequest&, HttpResponse& res) {
    metrics_.setKvBuffer(engine_.kvConnectorInfo());
    metrics_.observeHttpFront(http_->frontStats());
    res.set_content(metrics_.render(engine_.stats()), "text/plain; version=0.0.4");
  });

  // Renders a chat template for `messages`: a client leaving cancels it.
  http_->route("POST", "/tokenize", [this](HttpExchange& exchange) -> boost::asio::awaitable<void> {
    const std::string* body = &exchange.request().body;
    std::atomic<bool> cancel{false};
    HttpResponse res = co_await exchange.offload<HttpResponse>(
        [this, body, &cancel] {
          HttpResponse out;
          auto result = tokenizeResponse(*body, limits_, engine_.tokenizer(), &cancel);
          if (!result.isOk()) {
            sendError(out, result.error());
          } else {
            out.set_content(compactDump(result.value()), "application/json");
          }
          return out;
        },
        cancel);
    if (exchange.clientGone()) co_return;
    co_await exchange.respond(std::move(res));
  });
  http_->post(
      "/detokenize",
      [this](const HttpRequest& req, HttpResponse& res) {
        auto result = detokenizeResponse(req.body, limits_, engine_.tokenizer());
        if (!result.isOk()) return sendError(res, result.error());
        res.set_content(compactDump(result.value()), "application/json");
      },
      RouteWork::kCompute);

  // Bodies of the /v1/kv_transfer/* routes: a JSON object within the
  // request bounds (common/json_parse.h), or the 400 saying what is wrong.
  // `accepted` says what the object must hold.
  auto kvTransferBody = [this](const std::string& text,
                               const std::string& accepted) -> Result<json> {
    JsonParseError parse_error;
    std::optional<json> body = parseJson(text, parse_error, limits_.json_bounds);
    if (!body && (parse_error.tooDeep() || parse_error.tooManyValues())) {
      return boundsError(parse_error);
    }
    if (!body) return invalidRequest("the body is not valid JSON (" + parse_error.detail + ")");
    if (!body->is_object()) return invalidRequest("the body must be a JSON object " + accepted);
    return std::move(*body);
  };

  // The router's explicit release of blocks held for a transfer it abandons;
  // the body carries the kv_transfer_params this agent returned (signed by
  // this agent when it has a KV secret: that signature authenticates it).
  http_->post(
      "/v1/kv_transfer/release",
      [this, kvTransferBody](const HttpRequest& req, HttpResponse& res) {
        auto body =
            kvTransferBody(req.body, "with the object kv_transfer_params returned by this agent");
        if (!body.isOk()) return sendError(res, body.error());
        const auto params = body.value().find("kv_transfer_params");
        if (params == body.value().end() || !params->is_object()) {
          return sendError(res, invalidRequest("kv_transfer_params must be the object this agent "
                                               "returned for the transfer",
                                               "kv_transfer_params"));
        }
        // Errors name the field they are about (kv_transfer_params.transfer_id, ...).
        Status released = engine_.releaseTransfer(*params);
        if (!released.isOk()) return sendError(res, fromStatus(released));
        res.set_content(json{{"released", true}}.dump(), "application/json");
      },
      RouteWork::kWait);

  // A peer's KV handshake: what a reader needs to read this agent's blocks
  // (the decode agent asks the prefill agent a descriptor names). Signed
  // over its nonce when the agent has a KV secret.
  http_->post(
      "/v1/kv_transfer/handshake",
      [this, kvTransferBody](const HttpRequest& req, HttpResponse& res) {
        auto body = kvTransferBody(req.body, "with a nonce");
        if (!body.isOk()) return sendError(res, body.error());
        auto answer = engine_.kvHandshake(body.value());
        if (!answer.isOk()) return sendError(res, fromStatus(answer.status()));
        res.set_content(compactDump(*answer), "application/json");
      },
      RouteWork::kCompute);

  // Pull-back: pins the cached leading blocks of a prompt for a prefill agent
  // to read (the router asks the decode agent that holds a conversation).
  // With a KV secret the body must be signed (kv_auth): nothing is looked at
  // or pinned for anyone else. A hold whose answer does not reach its caller
  // (it left, or reset, while the hold waited for blocks being computed) is
  // released at once: nobody knows where its blocks are.
  http_->route(
      "POST", "/v1/kv_transfer/hold",
      [this, kvTransferBody](HttpExchange& exchange) -> boost::asio::awaitable<void> {
        const std::string* text = &exchange.request().body;
        json lent;  // the descriptor handed out, when the hold was taken
        auto hold = [this, &kvTransferBody, text, &lent] {
          HttpResponse res;
          auto parsed = kvTransferBody(*text, "with token_ids");
          if (!parsed.isOk()) return errorResponse(parsed.error());
          const json& body = parsed.value();
          if (Status allowed = engine_.authorizeKvRequest("/v1/kv_transfer/hold", body);
              !allowed.isOk()) {
            return errorResponse(fromStatus(allowed));
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
            return errorResponse(invalidRequest("token_ids must be a non-empty array of at most " +
                                                    std::to_string(engine_.maxModelLen()) +
                                                    " token ids in [0, " + std::to_string(vocab) +
                                                    ")",
                                                "token_ids"));
          }
          std::string salt;
          if (auto it = body.find("cache_salt"); it != body.end()) {
            if (!it->is_string()) {
              return errorResponse(invalidRequest("cache_salt must be a string", "cache_salt"));
            }
            salt = it->get<std::string>();
          }
          // A LoRA adapter's blocks: the request's `model` (the router
          // sends it for an adapter only).
          std::string adapter;
          if (auto it = body.find("model"); it != body.end()) {
            if (!it->is_string()) {
              return errorResponse(invalidRequest("model must be a string", "model"));
            }
            adapter = it->get<std::string>();
            if (adapter == config_.served_model_name) adapter.clear();
            if (!adapter.empty() && engine_.adapterIndex(adapter) < 0) {
              return errorResponse(ApiError{404,
                                            "model \"" + adapter + "\"" +
                                                " is neither this agent's model nor one of its "
                                                "LoRA adapters",
                                            "not_found_error", "model", "model_not_found"});
            }
          }
          auto held = engine_.holdPrefix(std::move(tokens), std::move(salt), adapter);
          if (!held.isOk()) {
            // Nothing cached is about the prompt; a refusal by a bound is not.
            const bool about_prompt = held.status().code() == StatusCode::kNotFound;
            return errorResponse(fromStatus(held.status(), about_prompt ? "token_ids" : ""));
          }
          lent = *held;
          res.set_content(compactDump(json{{"kv_transfer_params", *held},
                                           {"num_tokens", (*held)["remote_num_tokens"]}}),
                          "application/json");
          return res;
        };
        // Watched while the hold waits: a caller that closes its end (its
        // call timed out) is gone even though a write to it could still
        // succeed into the socket's buffer.
        exchange.watchClient();
        HttpResponse res = co_await exchange.offloadWait<HttpResponse>(hold);
        bool delivered = false;
        if (!exchange.clientGone()) delivered = co_await exchange.respond(std::move(res));
        if (!delivered && lent.is_object()) {
          auto release = [this, &lent] { return releaseUndelivered(lent); };
          co_await exchange.offloadWait<bool>(release);
        }
      });

  // Drain (as on SIGTERM): admit nothing more, hand running streams over,
  // exit when they have moved or the shutdown timeout passes. Signed like
  // the KV control calls when the agent has a KV secret.
  http_->route("POST", "/admin/drain",
               [this, kvTransferBody](HttpExchange& exchange) -> boost::asio::awaitable<void> {
                 // In flight until its answer is written: the drain it begins lets
                 // the handlers finish (waitForIdle) before the server stops, so the
                 // 202 is never cut off by the stop it caused.
                 ActiveRequest active(active_requests_);
                 const std::string* body = &exchange.request().body;
                 auto drain = [this, body, &kvTransferBody] {
                   HttpResponse res;
                   auto parsed = kvTransferBody(body->empty() ? std::string("{}") : *body, "");
                   if (!parsed.isOk()) {
                     sendError(res, parsed.error());
                     return res;
                   }
                   if (Status allowed = engine_.authorizeKvRequest("/admin/drain", parsed.value());
                       !allowed.isOk()) {
                     sendError(res, fromStatus(allowed));
                     return res;
                   }
                   if (!config_.on_drain) {
                     sendError(res, fromStatus(failedPrecondition("this agent cannot be drained")));
                     return res;
                   }
                   TANDEM_LOG(kInfo) << "POST /admin/drain: draining as on SIGTERM";
                   config_.on_drain();
                   res.status = 202;
                   res.set_content(R"({"draining":true})", "application/json");
                   return res;
                 };
                 HttpResponse res = co_await exchange.offloadWait<HttpResponse>(drain);
                 co_await exchange.respond(std::move(res));
               });

  // A router's late ask that a stream begun without x-tandem-handover (no
  // other agent could resume it then) be handed over when this agent
  // drains: now when it drains already. Signed like /admin/drain.
  http_->post(
      "/admin/hand_over",
      [this, kvTransferBody](const HttpRequest& req, HttpResponse& res) {
        auto parsed = kvTransferBody(req.body, "with the request_id of a stream");
        if (!parsed.isOk()) return sendError(res, parsed.error());
        if (Status allowed = engine_.authorizeKvRequest("/admin/hand_over", parsed.value());
            !allowed.isOk()) {
          return sendError(res, fromStatus(allowed));
        }
        const auto id = parsed.value().find("request_id");
        if (id == parsed.value().end() || !id->is_string() || id->get<std::string>().empty() ||
            id->get<std::string>().size() > 512) {
          return sendError(res, invalidRequest("request_id must be the id of a stream this agent "
                                               "runs (its X-Request-Id), 1 to 512 characters",
                                               "request_id"));
        }
        // "hand_over": false withdraws the ask (or the request's header):
        // the router has no other agent to resume the stream on.
        const auto hand_over = parsed.value().find("hand_over");
        if (hand_over != parsed.value().end() && !hand_over->is_boolean()) {
          return sendError(res, invalidRequest("hand_over must be true (hand the stream over "
                                               "when draining, the default) or false (finish it "
                                               "here)",
                                               "hand_over"));
        }
        engine_.askHandOver(id->get<std::string>(),
                            hand_over == parsed.value().end() || hand_over->get<bool>());
        res.status = 202;
        res.set_content(R"({"asked":true})", "application/json");
      },
      RouteWork::kInline);

  // The KV event stream: events after `since`, a snapshot when the reader
  // fell behind what is retained, a comment line after 10 s of silence (so a
  // reader that went away is noticed).
  http_->route(
      "GET", "/v1/kv_events", [this](HttpExchange& exchange) -> boost::asio::awaitable<void> {
        uint64_t cursor = 0;
        if (auto since = exchange.request().param("since")) {
          auto parsed = parseSequence(*since);
          if (!parsed) {
            co_await exchange.respond(errorResponse(invalidRequest(
                "since must be a non-negative integer, got " + compactDump(json(*since)),
                "since")));
            co_return;
          }
          cursor = *parsed;
        }
        const bool headers_sent =
            co_await exchange.startChunked(200, "text/event-stream", noCache());
        if (!headers_sent) co_return;
        auto idle_since = Clock::now();
        for (;;) {
          engine::KvEventPage page = engine_.kvEvents().eventsSince(cursor, 512);
          std::string data;
          if (page.needs_snapshot) {
            // The reader fell behind what is retained: resynchronise it. The
            // snapshot waits for the engine's step, so it runs off the io threads.
            engine::KvSnapshot snapshot = co_await exchange.offloadWait<engine::KvSnapshot>(
                [this] { return engine_.kvSnapshot(); });
            data = snapshotEvent(snapshot);
            cursor = snapshot.sequence;
          } else {
            data = eventsText(page);
            if (!page.events.empty()) cursor = page.events.back().sequence;
          }
          if (data.empty()) {
            if (Clock::now() - idle_since < std::chrono::seconds(10)) {
              const bool there = co_await exchange.wait(std::chrono::milliseconds(20));
              if (!there) co_return;
              continue;
            }
            data = ": keep-alive\n\n";
          }
          idle_since = Clock::now();
          const bool written = co_await exchange.writeChunk(std::move(data));
          if (!written) co_return;
        }
      });
}

}  // namespace tandem::server
