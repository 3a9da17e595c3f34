#include "operator/router/completion_flow.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "common/json_parse.h"
#include "common/kv_auth.h"
#include "common/logging.h"
#include "operator/router/upstream_call.h"

namespace tandem::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using nlohmann::json;
// A request body as the client wrote it (key order kept).
using Body = nlohmann::ordered_json;
using server::HttpExchange;
using server::HttpResponse;
using Clock = std::chrono::steady_clock;

namespace {

// How long blocks a decision expects an agent to store count as held
// without the agent's BlockStored (OwnershipIndex::expect).
constexpr std::chrono::seconds kExpectedBlocksTtl{30};
// How often a stream looks again for an agent that could resume it: on an
// unhealthy decode agent not yet asked to hand it over, and at a break
// with no agent fit.
constexpr std::chrono::milliseconds kRecheckInterval{100};
// How often a request every decode agent's full queue would refuse looks
// for a place (a request the router sent ending, a poll finding room)
// while it waits (RouterConfig::full_queues_wait_s).
constexpr std::chrono::milliseconds kQueueRecheckInterval{20};

// The most of a decode agent's refusal read to tell a drain's from others.
constexpr size_t kMaxRefusalBytes = 16384;
// A decode agent's 400 read to tell a refused transfer from the client's
// error, then passed on whole.
constexpr size_t kMaxTransferRefusalBytes = 1 << 20;

// A 503 in OpenAI's error shape, with Retry-After.
HttpResponse unavailable(const std::string& message) {
  return server::httpErrorResponse(503, message, "service_unavailable");
}

// A refusal in the agents' words and shape, with its status.
HttpResponse apiErrorResponse(const server::ApiError& error) {
  return server::httpJsonResponse(error.status, server::compactDump(server::errorBody(error)));
}

// Ends a stream whose answer is complete: its [DONE], unless the agent's
// went through already, then the end of the chunked body.
awaitable<void> endStream(HttpExchange& exchange, bool done_sent) {
  bool written = done_sent;
  if (!written) written = co_await exchange.writeChunk(std::string(server::kSseDone));
  if (written) co_await exchange.finishChunked();
}

// Ends a client's stream that cannot go on: an error event saying why (a
// 502 by default), then [DONE], if the client is still there.
awaitable<void> endStreamWithError(HttpExchange& exchange, const std::string& message,
                                   int status = 502, const char* type = "server_error") {
  server::ApiError error{status, message, type, "", ""};
  std::string event = "data: " + server::compactDump(server::errorBody(error)) + "\n\n" +
                      std::string(server::kSseDone);
  const bool written = co_await exchange.writeChunk(std::move(event));
  if (written) co_await exchange.finishChunked();
}

// A stream whose prefill agent refused the request once it had passed the
// checks (a structured output nothing can continue, ...): answered as the
// agent's own stream would carry that error, a 200 stream whose one event
// is the error, then [DONE] (docs/api.md, Errors). `error_body`: the
// agent's error answer; one not in OpenAI's error shape is named a 502.
awaitable<void> endStreamWithAgentError(HttpExchange& exchange, const std::string& error_body) {
  const json error = parseJsonOrDiscarded(error_body);
  std::string text = error_body;  // the agent's bytes, on one line
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  const bool shaped = error.is_object() && error.contains("error") && error["error"].is_object() &&
                      text.find('\n') == std::string::npos;
  // (Arguments are named: GCC 12 destroys some temporaries of a co_await
  // expression twice.)
  std::string content_type = "text/event-stream";
  std::vector<std::pair<std::string, std::string>> headers = {{"Cache-Control", "no-cache"}};
  const bool started =
      co_await exchange.startChunked(200, std::move(content_type), std::move(headers));
  if (!started) co_return;
  if (!shaped) {
    const std::string message = "the prefill agent answered: " + error_body;
    co_await endStreamWithError(exchange, message);
    co_return;
  }
  std::string event = "data: " + text + "\n\n" + std::string(server::kSseDone);
  const bool written = co_await exchange.writeChunk(std::move(event));
  if (written) co_await exchange.finishChunked();
}

// Whether a decode agent's whole (not streamed) answer was cut short by it
// (cutByItsAgent). Parsed only when the word is in it.
bool wholeAnswerCut(const std::string& body) {
  if (body.find("\"abort\"") == std::string::npos) return false;
  const json answer = parseJsonOrDiscarded(body);
  return answer.is_object() && answer.contains("choices") && cutByItsAgent(answer["choices"]);
}

std::string midStreamFailure(const std::string& agent, const std::string& what) {
  return "the decode agent " + agent + " failed mid-stream: " + what;
}

// Why a stream that cannot move on ends: the agent's own error, if it sent
// one, then what stops it moving.
enum class NoMove { kNoAgentLeft, kBudgetSpent, kTimedOut, kSeveralChoices };
std::string exhaustedMessage(const std::string& agent, const std::string& agent_error,
                             int migrations, NoMove why_not, double migration_timeout_s) {
  std::ostringstream why;
  if (!agent_error.empty()) why << agent_error << "; ";
  switch (why_not) {
    case NoMove::kNoAgentLeft:
      why << "no decode agent left to resume it on within --migration-timeout ("
          << migration_timeout_s << " s, " << migrations << " migrations)";
      break;
    case NoMove::kBudgetSpent:
      why << "it moved " << migrations << " times, the most --max-migrations allows";
      break;
    case NoMove::kTimedOut:
      why << "it was not resumed within --migration-timeout (" << migration_timeout_s << " s, "
          << migrations << " migrations)";
      break;
    case NoMove::kSeveralChoices:
      why << "a stream of several choices (n > 1, or several prompts) is not moved to another "
             "agent";
      break;
  }
  return midStreamFailure(agent, why.str());
}

// Parses and checks a request as an agent does: for chat, renders the
// template (ended early when `cancel` is set) and tokenizes.
// `decode_cache_tokens`: what the smallest KV cache among the healthy
// decode agents holds (0: none known): a request it cannot hold is refused
// here, in the agents' words, before a prefill agent computes its prompt.
server::Result<server::ParsedRequest> parseRequest(const std::string& body, bool chat,
                                                   const ModelView& model,
                                                   const std::atomic<bool>& cancel,
                                                   int64_t decode_cache_tokens) {
  server::ServerLimits limits = model.limits;
  limits.kv_cache_tokens = decode_cache_tokens;
  limits.kv_cache_name = "a decode agent's KV cache";
  return chat ? server::parseChatCompletionRequest(body, limits, *model.tokenizer, &cancel)
              : server::parseCompletionRequest(body, limits, *model.tokenizer);
}

// A decode agent whose waiting queue is full (AgentState::queueFull: by
// the load it had at its last poll and the requests the router sent it
// since) would refuse a request of `places` engine requests sent now,
// once a prefill agent had computed its prompt: while another healthy
// one's is not, those are passed over (their views made unhealthy for
// this decision). Returns whether every healthy one's was full (none
// passed over then: the request is refused before its prefill). A queue
// others fill between two polls still refuses after the prefill.
bool passOverFullQueues(std::vector<AgentView>& views, const std::vector<AgentPtr>& agents,
                        int64_t places) {
  size_t open = 0;
  size_t full = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    if (!views[i].healthy) continue;
    ++(agents[i]->queueFull(views[i], places) ? full : open);
  }
  if (open == 0) return full > 0;
  for (size_t i = 0; i < views.size(); ++i) {
    if (!views[i].healthy || !agents[i]->queueFull(views[i], places)) continue;
    views[i].healthy = false;
    views[i].leading_blocks = 0;
  }
  return false;
}

// The most engine requests any healthy decode agent holds at once
// (AgentState::maxRequestsHeld); 0 while one's is not known or none is
// healthy.
int64_t mostHeldByADecodeAgent(const std::vector<AgentPtr>& agents) {
  int64_t most = 0;
  for (const AgentPtr& agent : agents) {
    if (!agent->healthy) continue;
    const int64_t held = agent->maxRequestsHeld();
    if (held == 0) return 0;
    most = std::max(most, held);
  }
  return most;
}

// Without max_tokens an agent generates up to what max_model_len, or its
// own KV cache when smaller, leaves: decode agents whose caches differ
// would give one request answers of different lengths, by where it went
// (and a stream resumed on another agent a bound of the other's). When the
// smallest decode agent's cache is below max_model_len, the bound the
// request was parsed with (that cache's) is written into the body, so it
// is the same wherever the request runs. Not for a batch of prompts: each
// prompt has its own default, which one field cannot give.
void boundDefaultMaxTokens(Body& body, const server::ParsedRequest& parsed, int64_t max_model_len,
                           int64_t decode_cache_tokens) {
  if (decode_cache_tokens <= 0 || decode_cache_tokens >= max_model_len || !parsed.batch.empty()) {
    return;
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    const auto given = body.find(name);
    if (given != body.end() && !given->is_null()) return;
  }
  body.erase("max_completion_tokens");  // a null one would be read first
  body["max_tokens"] = parsed.request.sampling.max_tokens;
}

// Whether a failed upstream call timed out (the agent stayed silent).
bool timedOut(const std::exception& e) {
  const auto* system = dynamic_cast<const boost::system::system_error*>(&e);
  return system != nullptr && system->code() == beast::error::timeout;
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Request bodies the router builds (kept out of coroutines: GCC 12 cannot
// put brace-initialized JSON with string literals in a coroutine frame).
// A hold is signed with the agents' KV secret (common/kv_auth.h); a release
// needs no signature of ours: the descriptor it carries is the agent's own,
// signed by it.
// Each is signed for the agent it goes to (its instance id).
std::string holdBody(const protocol::Request& request, const std::string& kv_secret,
                     const AgentState& lender) {
  json hold = {{"token_ids", request.prompt}};
  if (!request.cache_salt.empty()) hold["cache_salt"] = request.cache_salt;
  if (!request.adapter.empty()) hold["model"] = request.adapter;
  if (!kv_secret.empty()) {
    kv_auth::signRequest(hold, lender.instanceId(), "/v1/kv_transfer/hold", kv_secret);
  }
  return hold.dump();
}

// A late ask that a stream be handed over (/admin/hand_over), or with
// `hand_over` false its withdrawal, signed as /admin/drain is.
std::string handOverBody(const std::string& agent_request_id, const std::string& kv_secret,
                         const AgentState& agent, bool hand_over = true) {
  json body = {{"request_id", agent_request_id}};
  if (!hand_over) body["hand_over"] = false;
  if (!kv_secret.empty()) {
    kv_auth::signRequest(body, agent.instanceId(), "/admin/hand_over", kv_secret);
  }
  return body.dump();
}

std::string releaseBody(const json& params) { return json{{"kv_transfer_params", params}}.dump(); }

// Sends a late hand-over ask (or its withdrawal: `asked` null); an ask that
// got no answer is cleared in `asked` (made again at the stream's next
// look), a refusal (403: the agent has another KV secret) is logged and
// stands.
awaitable<void> askForHandOver(AgentEndpoint agent, std::string body, std::string request_id,
                               std::shared_ptr<std::atomic<bool>> asked) {
  const UpstreamResult result =
      co_await callAgent(agent, http::verb::post, std::string("/admin/hand_over"), body, 5.0);
  if (result.status == 202) co_return;
  TANDEM_LOG(kWarn) << "router: request " << request_id << ": " << agent.name
                    << " did not take the ask to hand its stream over: "
                    << (result.status == 0 ? result.error
                                           : "status " + std::to_string(result.status) + " " +
                                                 result.body.substr(0, 200));
  if (result.status == 0 && asked) asked->store(false);
}

// The body's kv_transfer_params: read `lent` (a lender's descriptor) first.
void setRemotePrefix(Body& body, const json& lent) {
  body["kv_transfer_params"] = Body{{"remote_prefix", Body(lent)}};
}

// The prefill half: one token, no stream, the KV kept for the decode agent
// (and read from `lent`, a decode agent's prefix, when given).
std::string prefillBody(Body body, const json& lent) {
  body["max_tokens"] = 1;
  body.erase("max_completion_tokens");
  body.erase("min_tokens");
  body["stream"] = false;
  body.erase("stream_options");
  // The prompt's KV only: a resumed stream's output is recomputed where it
  // is decoded; the answer's text is not this call's (nor, without its
  // resumed tokens, would echo with logprobs take kv_transfer_params).
  body.erase("resume_token_ids");
  body.erase("echo");
  body["kv_transfer_params"] = Body{{"do_remote_decode", true}};
  if (!lent.is_null()) body["kv_transfer_params"]["remote_prefix"] = Body(lent);
  return body.dump();
}

// The decode half: the client's request reading the prefill agent's KV.
// `body` (an object without kv_transfer_params: the router removed the
// client's) is serialized as it is and the parameters are appended to the
// text, which spares copying a prompt of many token ids.
std::string decodeBody(const Body& body, const json& params) {
  std::string text = body.dump();
  if (params.is_null()) return text;
  json read = params;
  read["do_remote_prefill"] = true;
  const std::string field = "\"kv_transfer_params\":" + read.dump();
  text.pop_back();  // the object's closing brace
  if (!body.empty()) text += ',';
  text += field;
  text += '}';
  return text;
}

size_t blocksOffered(const json& params) {
  if (!params.is_object()) return 0;
  auto it = params.find("remote_block_ids");
  return it != params.end() && it->is_array() ? it->size() : 0;
}

// What a request reserves on its prefill agent: itself and the prompt
// tokens the agent does not hold.
LedgerCounts prefillCounts(const DecisionInput& input, const AgentView& prefill) {
  return {1, uncachedTokens(input, prefill), 0};
}

// What a request reserves on its decode agent: its engine requests, its projected KV
// and, prefilled there, the prompt tokens the agent does not hold.
LedgerCounts decodeCounts(const DecisionInput& input, const AgentView& decode, bool local) {
  return {input.engine_requests, local ? uncachedTokens(input, decode) : 0,
          input.num_prompt_tokens + input.max_tokens};
}

const char* targetOf(const Body& body) {
  return body.contains("messages") ? "/v1/chat/completions" : "/v1/completions";
}

PolicyOptions policyOptions(const RouterConfig& config) {
  PolicyOptions options;
  options.policy = config.policy;
  options.disagg_threshold_tokens = config.disagg_threshold_tokens;
  options.pull_back = config.pull_back;
  options.profile = config.profile;
  options.itl_target_s = config.itl_target_s;
  options.explain = config.debug_decisions > 0;
  options.learn = config.learn_costs;
  return options;
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

CompletionFlow::CompletionFlow(const RouterConfig& config, AgentTracker& agents, ServedModel& model,
                               AdmissionGate& gate, RouterMetrics& metrics,
                               const std::atomic<bool>& stopping)
    : upstream_timeout_s_(config.upstream_timeout_s),
      max_migrations_(config.max_migrations),
      migration_timeout_s_(config.migration_timeout_s),
      full_queues_wait_s_(config.full_queues_wait_s),
      kv_secret_(config.kv_secret),
      agents_(agents),
      model_(model),
      gate_(gate),
      metrics_(metrics),
      stopping_(stopping),
      chooser_(policyOptions(config), config.seed),
      decisions_(config.debug_decisions) {}

enum class Admission { kAdmitted, kRefused, kClientGone };

// What a request cut at the router's stop deadline is told.
constexpr const char* kCutAtStop =
    "the router is stopping: this request was still in flight at its shutdown deadline; retry it";

// What a request that was waiting (for a router slot, for room in a
// decode agent's queue) when the router began to stop is told: no agent
// has seen it.
constexpr const char* kRefusedAtStop =
    "the router is stopping and sent this request to no agent; retry it";

// Enrolls a request for cutAll() while it lives. Create and destroy it on
// the request's strand, where cutAll() fires its cut.
class CompletionFlow::StopCutEnrollment {
 public:
  StopCutEnrollment(CompletionFlow& flow, asio::any_io_executor executor)
      : flow_(flow), cut_(std::make_shared<StopCut>()) {
    std::lock_guard<std::mutex> lock(flow_.cuts_mutex_);
    cut_->fired = flow_.cutting_;
    entry_ = flow_.cuts_.insert(flow_.cuts_.end(), StopCutEntry{std::move(executor), cut_});
  }
  ~StopCutEnrollment() {
    std::lock_guard<std::mutex> lock(flow_.cuts_mutex_);
    flow_.cuts_.erase(entry_);
  }
  StopCutEnrollment(const StopCutEnrollment&) = delete;
  StopCutEnrollment& operator=(const StopCutEnrollment&) = delete;
  const std::shared_ptr<StopCut>& cut() const { return cut_; }

 private:
  CompletionFlow& flow_;
  std::shared_ptr<StopCut> cut_;
  std::list<StopCutEntry>::iterator entry_;
};

size_t CompletionFlow::cutAll() {
  std::lock_guard<std::mutex> lock(cuts_mutex_);
  cutting_ = true;
  for (const StopCutEntry& entry : cuts_) {
    // On the request's strand: its frame is alive while its cut is, and
    // close_upstream is set only while its decode call's connection is.
    asio::post(entry.executor, [weak = entry.cut] {
      if (const std::shared_ptr<StopCut> cut = weak.lock()) {
        cut->fired = true;
        if (cut->close_upstream) cut->close_upstream();
      }
    });
  }
  return cuts_.size();
}

// Admission: up to max_inflight_requests at once, then a queue of up to
// max_queued_requests (woken when a slot passes to it, or dropped when its
// client leaves), then refusal.
awaitable<CompletionFlow::Admission> CompletionFlow::admit(HttpExchange& exchange) {
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
    server::OnClientGone cancel(exchange,
                                [wakeup] { wakeup->expires_at(Clock::time_point::min()); });
    boost::system::error_code ec;
    while (!exchange.clientGone() && !stopping_ && !gate_.granted(waiter)) {
      co_await wakeup->async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }
  if (!gate_.cancel(waiter)) co_return Admission::kAdmitted;  // granted meanwhile
  co_return exchange.clientGone() ? Admission::kClientGone : Admission::kRefused;
}

// The completion flow: parse and check like an agent, decide, hand off.
awaitable<void> CompletionFlow::complete(HttpExchange& exchange, bool chat) {
  const auto arrival = Clock::now();
  // The model this request is checked and hashed with, to its end.
  const std::shared_ptr<const ModelView> model = model_.current();
  if (!model) {
    // Built before the co_await: GCC 12 frees a conditional's temporaries
    // inside one twice.
    std::string message = "no agent is ready yet";
    if (const std::string why = model_.lastError(); !why.empty()) message += ": " + why;
    metrics_.countDecision("rejected");
    co_await exchange.respond(unavailable(message));
    co_return;
  }
  // Admitted before it is parsed: past max_queued_requests the answer is a
  // 503 at once, and queued requests take no worker (parsing, rendering and
  // tokenizing each one first had queued unbounded work in front of the
  // gate). From here on, a client leaving cancels what its request waits for.
  exchange.watchClient();
  const Admission admission = co_await admit(exchange);
  if (admission == Admission::kClientGone) {
    metrics_.countClientAbort("queued");
    co_return;
  }
  if (admission == Admission::kRefused) {
    metrics_.countDecision("rejected");
    co_await exchange.respond(
        unavailable(stopping_ ? kRefusedAtStop : "the router is overloaded; retry later"));
    co_return;
  }
  SlotLease slot(gate_);
  StopCutEnrollment stop_cut(*this, co_await asio::this_coro::executor);
  if (exchange.clientGone()) {
    metrics_.countClientAbort("queued");
    co_return;
  }
  // The same checks, with the same messages, as an agent's, on the worker
  // pool: a long chat template render never holds an io thread, and a
  // client leaving cancels it.
  std::atomic<bool> cancel{false};
  const std::string* body_text = &exchange.request().body;
  const ModelView* model_view = model.get();
  const int64_t decode_cache_tokens = agents_.smallestDecodeCache();
  server::Result<server::ParsedRequest> parsed =
      co_await exchange.offload<server::Result<server::ParsedRequest>>(
          [body_text, chat, model_view, &cancel, decode_cache_tokens] {
            return parseRequest(*body_text, chat, *model_view, cancel, decode_cache_tokens);
          },
          cancel);
  if (exchange.clientGone()) {
    metrics_.countClientAbort("parse");
    co_return;
  }
  if (!parsed.isOk()) {
    metrics_.countDecision("invalid");
    const server::ApiError& error = parsed.error();
    co_await exchange.respond(apiErrorResponse(error));
    co_return;
  }
  // Forwarded as the client wrote it: a JSON schema's properties and a
  // tool's parameters come out in their order.
  Body body = std::move(parsed.value().body);
  body.erase("kv_transfer_params");  // only the router sets these
  const protocol::Request& request = parsed.value().request;
  boundDefaultMaxTokens(body, parsed.value(), model->limits.max_model_len, decode_cache_tokens);
  const bool streaming = parsed.value().stream;

  const auto decide_start = Clock::now();
  // A LoRA adapter's request goes only to the agents serving it under the
  // identity its prompt is hashed with (docs/lora.md).
  std::string adapter_identity;
  if (!request.adapter.empty()) {
    adapter_identity = agents_.adapterIdentity(request.adapter).value_or(std::string());
  }
  const std::vector<BlockHash> hashes =
      model->hasher->hashFullBlocks(request.prompt, request.cache_salt, adapter_identity);
  std::vector<AgentPtr> prefill_agents = agents_.agentsOf(true);
  std::vector<AgentPtr> decode_agents = agents_.agentsOf(false);
  if (!request.adapter.empty()) {
    keepAgentsServing(prefill_agents, request.adapter, adapter_identity);
    keepAgentsServing(decode_agents, request.adapter, adapter_identity);
  }
  DecisionInput input;
  input.num_prompt_tokens = static_cast<int64_t>(request.prompt.size());
  input.max_tokens = request.sampling.max_tokens;
  input.engine_requests = server::engineRequestsOf(parsed.value());
  if (!parsed.value().batch.empty()) {
    // A batch: every prompt's tokens, every candidate's output budget.
    input.max_tokens *= parsed.value().best_of;
    for (const server::ParsedRequest& other : parsed.value().batch) {
      input.num_prompt_tokens += static_cast<int64_t>(other.request.prompt.size());
      input.max_tokens += other.request.sampling.max_tokens * other.best_of;
    }
  }
  input.block_size = model->info.block_size;
  const std::unordered_map<std::string, int64_t> held = agents_.leadingBlocksForAll(hashes);
  auto view = [&](const AgentPtr& agent) {
    AgentView v;
    v.name = agent->endpoint.name;
    v.healthy = agent->healthy;
    const auto leading = held.find(v.name);
    v.leading_blocks = leading == held.end() ? 0 : leading->second;
    v.running = agent->running;
    v.waiting = agent->waiting;
    v.kv_usage = agent->kv_usage;
    v.external_requests = agent->external_requests;
    LoadLedger::fillView(*agent, v);
    return v;
  };
  // More engine requests than any decode agent holds: each would refuse it
  // with a 400 after its prefill, and a 503 would be retried in vain.
  if (const int64_t most = mostHeldByADecodeAgent(decode_agents);
      most > 0 && input.engine_requests > most) {
    metrics_.countDecision("invalid");
    const server::ApiError error = server::tooManyEngineRequests(
        parsed.value(), most, "any decode agent (--max-num-seqs + --max-waiting-requests)");
    co_await exchange.respond(apiErrorResponse(error));
    co_return;
  }
  // Every healthy decode agent's queue full: the request waits for a place
  // (full_queues_wait_s), its router slot held; then it is decided (and
  // refused, if they are still full).
  auto everyDecodeQueueFull = [&] {
    auto lock = ledger_.lock();
    std::vector<AgentView> views;
    for (const AgentPtr& agent : decode_agents) views.push_back(view(agent));
    return passOverFullQueues(views, decode_agents, input.engine_requests);
  };
  for (const auto wait_start = Clock::now(); everyDecodeQueueFull() &&
                                             secondsSince(wait_start) < full_queues_wait_s_ &&
                                             !exchange.clientGone() && !stopping_;) {
    co_await sleepFor(std::chrono::duration<double>(kQueueRecheckInterval).count());
  }
  if (exchange.clientGone()) {
    metrics_.countClientAbort("queued");
    co_return;
  }
  // Each agent's model identity: one request's agents must share it (a
  // decode agent refuses KV computed by another model; a stream resumed on
  // another model would change its answer), as they may not during a
  // rollout that changes the model.
  std::vector<std::string> prefill_models, decode_models;
  for (const AgentPtr& agent : prefill_agents) prefill_models.push_back(agent->modelIdentity());
  for (const AgentPtr& agent : decode_agents) decode_models.push_back(agent->modelIdentity());
  // The request's model: the chosen decode agent's (the chosen prefill
  // agent's when the decode agent's is not known yet).
  std::string request_model;
  // Decide and reserve under one lock: the next decision sees this one.
  Decision decision;
  LoadLedger::Reservation prefill_reservation;
  LoadLedger::Reservation decode_reservation;
  bool decode_queues_full = false;  // every healthy decode agent's was, at its last poll
  {
    auto lock = ledger_.lock();
    for (const AgentPtr& agent : prefill_agents) input.prefill.push_back(view(agent));
    for (const AgentPtr& agent : decode_agents) input.decode.push_back(view(agent));
    decode_queues_full = passOverFullQueues(input.decode, decode_agents, input.engine_requests);
    if (!decode_queues_full) decision = chooser_.choose(input);
    if (decision.decode) {
      // The agents of another model than the chosen decode agent's are out
      // of this request; chosen ones (a prefill agent, a lender) make it
      // decide again without them.
      request_model = !decode_models[*decision.decode].empty() || !decision.prefill
                          ? decode_models[*decision.decode]
                          : prefill_models[*decision.prefill];
      bool again = false;
      auto exclude = [&](std::vector<AgentView>& views, const std::vector<std::string>& models,
                         std::optional<size_t> chosen, std::optional<size_t> lender) {
        for (size_t i = 0; i < views.size(); ++i) {
          if (sameModel(models[i], request_model)) continue;
          views[i].healthy = false;
          views[i].leading_blocks = 0;
          again = again || chosen == i || lender == i;
        }
      };
      exclude(input.prefill, prefill_models, decision.prefill, decision.lending_prefill);
      exclude(input.decode, decode_models, std::nullopt, decision.lending_decode);
      if (again) decision = chooser_.choose(input);
    }
    // Several candidates share the prompt on one agent (it computes it once
    // and each reads it from its prefix cache), a batch of prompts is
    // answered as one by one agent (routed by its first prompt), and prompt
    // logprobs need
    // every prompt position computed where they are asked for: a hand-off
    // or a lent prefix moves one request's KV computed elsewhere.
    const bool prefill_here = parsed.value().best_of > 1 || !parsed.value().batch.empty() ||
                              parsed.value().request.sampling.prompt_logprobs.has_value();
    if (prefill_here && decision.decode) {
      // A batch's first token waits for all its prompts, prefilled side by
      // side: not the time the model predicts for one prompt of their sum.
      if (decision.kind != Decision::Kind::kLocalPrefill || !parsed.value().batch.empty()) {
        // The predictions were the chosen path's, not this one's: this
        // request teaches the learned costs nothing.
        decision.predicted_ttft_s = 0;
        decision.predicted_prefill_s = 0;
      }
      decision.kind = Decision::Kind::kLocalPrefill;
      decision.prefill.reset();
      decision.pull_back = false;
      decision.lending_prefill.reset();
      decision.lending_decode.reset();
    }
    if (decision.decode) {
      const AgentView& decode = input.decode[*decision.decode];
      const bool local = decision.kind == Decision::Kind::kLocalPrefill;
      decode_reservation = ledger_.reserveLocked(decode_agents[*decision.decode],
                                                 decodeCounts(input, decode, local));
      if (decision.prefill) {
        prefill_reservation =
            ledger_.reserveLocked(prefill_agents[*decision.prefill],
                                  prefillCounts(input, input.prefill[*decision.prefill]));
      }
    }
  }
  metrics_.observeDecision(secondsSince(decide_start), decision.overlap_ratio);
  const Policy policy = chooser_.options().policy;
  if (decision.decode && (policy == Policy::kKv || policy == Policy::kSglang)) {
    // The agent that computes the prompt will hold its blocks: the next
    // decisions see them there now, not when the prefill has finished
    // (SGLang's router inserts a routed prompt into its tree the same way).
    // Only that agent: a decode agent receiving a hand-off holds them only
    // once the prefill agent has computed and sent them, a wait no cost
    // term of its own covers (a local prefill sent there would sit behind
    // another agent's work); its BlockStored events report them then.
    auto expect = [&](const AgentView& agent) {
      const size_t from = std::min(hashes.size(), static_cast<size_t>(agent.leading_blocks));
      agents_.expectBlocks(agent.name, std::span(hashes).subspan(from), kExpectedBlocksTtl);
    };
    expect(decision.prefill ? input.prefill[*decision.prefill] : input.decode[*decision.decode]);
  }
  const uint64_t logged = decisions_.record(input, decision, policyName(chooser_.options().policy));
  if (!decision.decode && decode_queues_full) {
    // Load, as an agent's own refusal: the client retries later.
    metrics_.countDecision("rejected");
    // (unavailable() gives it its Retry-After.) Its wait for room ended by
    // the router's stop: it is told so.
    co_await exchange.respond(unavailable(
        stopping_ ? kRefusedAtStop
                  : "every decode agent's waiting queue is full (--max-waiting-requests); retry "
                    "later"));
    co_return;
  }
  if (!decision.decode) {
    metrics_.countDecision("rejected");
    // A request for an adapter says so: other decode agents may serve the
    // base model. (Built before the co_await: GCC 12.)
    const std::string message =
        request.adapter.empty()
            ? std::string("no healthy decode agent")
            : "no healthy decode agent serves the LoRA adapter \"" + request.adapter + "\"";
    co_await exchange.respond(unavailable(message));
    co_return;
  }

  // Try decode agents in the chosen order, then the others.
  std::vector<size_t> decode_order = {*decision.decode};
  for (size_t i = 0; i < decode_agents.size(); ++i) {
    if (i != *decision.decode && input.decode[i].healthy) decode_order.push_back(i);
  }
  bool retried = false;           // not run as decided: sent again, or moved mid-stream
  bool resent = false;            // sent again from its start (a failure before it began)
  bool left_first = false;        // an attempt after the first was made
  bool transfer_refused = false;  // a decode agent could not read the KV arranged for it
  bool cut_answer_lost = false;   // a whole answer cut short, and no agent to send it again to
  double prefill_answered_s = -1;
  decision.candidates.clear();  // logged; not needed below
  // A prefix the decision reads from a lender (pull-back): asked for once,
  // for the first attempt's prefilling agent only (the prefill agent, or a
  // local prefill's decode agent), and let go when that agent did not read
  // it (a reader releases what it read itself).
  json lent;
  AgentPtr lender;
  bool lend_missed = false;
  auto releaseLend = [&]() -> awaitable<void> {
    if (lent.is_null()) co_return;
    co_await callAgent(lender->endpoint, http::verb::post, std::string("/v1/kv_transfer/release"),
                       releaseBody(lent), 5.0);
    lent = nullptr;
  };
  if (decision.pull_back) {
    lender = decision.lending_prefill ? prefill_agents[*decision.lending_prefill]
                                      : decode_agents[*decision.lending_decode];
    const AgentView& view = decision.lending_prefill ? input.prefill[*decision.lending_prefill]
                                                     : input.decode[*decision.lending_decode];
    Lent lend = co_await lendFrom(lender, request, heldTokens(input, view));
    lent = std::move(lend.params);
    lend_missed = !lend.full;
    if (decision.kind == Decision::Kind::kLocalPrefill && !lent.is_null()) {
      setRemotePrefix(body, lent);
    }
  }
  // A stream is relayed through a splice, so that a decode agent failing
  // mid-answer is replaced by the next, resuming from the tokens sent.
  std::optional<StreamSplice> splice;
  if (streaming) {
    std::vector<int64_t> resumed;
    if (auto ids = body.find("resume_token_ids"); ids != body.end()) {
      resumed = ids->get<std::vector<int64_t>>();
    }
    splice.emplace(chat, parsed.value().return_token_ids, std::move(resumed));
    body["return_token_ids"] = true;
  }
  ClientStream client;
  client.stop = stop_cut.cut();
  // Cut at the router's stop deadline (cutAll): what is lent for it goes
  // back, and the client learns why its answer ends.
  auto endForStop = [&]() -> awaitable<void> {
    co_await releaseLend();
    if (client.started) {
      co_await endStreamWithError(exchange, kCutAtStop, 503, "service_unavailable");
    } else {
      co_await exchange.respond(unavailable(kCutAtStop));
    }
  };
  bool migrating = false;  // this attempt resumes a stream another agent began
  std::optional<Clock::time_point> first_break;  // when the stream first broke
  AgentPtr prompt_prefill;  // the prefill agent that computed the prompt, if one did
  // A decode agent this request may not go to: unhealthy (a draining agent
  // says it is), no longer listed (scaled away, restarted elsewhere), or not
  // serving the request's adapter.
  auto unfit = [&](const AgentPtr& agent) {
    return !agent->healthy || !agent->listed || !sameModel(agent->modelIdentity(), request_model) ||
           (!request.adapter.empty() && !agent->serves(request.adapter, adapter_identity));
  };
  // The process (its /health instance id) each decode agent tried had.
  std::map<const AgentState*, std::string> tried_process;
  // Decode agents not in decode_order, listed since the decision (a
  // rollout's new agents, a scale-up) or not healthy then (one just listed,
  // not yet polled), join its end: a stream whose agents all went away
  // meanwhile resumes on them (unfit() still judges each). So does one
  // tried already that has since restarted at the same address (a new
  // process: a lone agent's replacement keeps its name and address when
  // its pod or process is restarted in place).
  auto admitNewcomers = [&] {
    for (const AgentPtr& agent : agents_.agentsOf(false)) {
      const auto known = std::find(decode_agents.begin(), decode_agents.end(), agent);
      const size_t index = static_cast<size_t>(known - decode_agents.begin());
      if (known == decode_agents.end()) {
        decode_agents.push_back(agent);
        auto lock = ledger_.lock();
        input.decode.push_back(view(agent));
      }
      if (std::find(decode_order.begin(), decode_order.end(), index) == decode_order.end()) {
        decode_order.push_back(index);
        continue;
      }
      const auto tried = tried_process.find(agent.get());
      const std::string process = agent->instanceId();
      if (tried != tried_process.end() && !process.empty() && process != tried->second) {
        tried->second = process;  // joins once per new process
        decode_order.push_back(index);
      }
    }
  };
  // The first position from `from` in decode_order whose agent is fit (the
  // newcomers admitted when none of the others is), or decode_order.size().
  auto nextFit = [&](size_t from) {
    for (bool admitted = false;; admitted = true) {
      while (from < decode_order.size() && unfit(decode_agents[decode_order[from]])) ++from;
      if (from < decode_order.size() || admitted) return from;
      admitNewcomers();
    }
  };
  // No agent to resume a broken stream on now, but one may come (the
  // replacement of a lone agent, started once it stopped; agents that
  // drained all at once and their rollout's new ones): looked for every
  // 100 ms until the move's time is up or the client leaves. The first
  // position from `from` whose agent is fit, or decode_order.size().
  // `move_counted`: the move waiting is one already counted against
  // --max-migrations (its first agent refused it), so the budget allows it;
  // also a request not begun that every decode agent refused draining (no
  // move, no splice).
  auto waitForFit = [&](size_t from, bool move_counted) -> awaitable<size_t> {
    size_t next = nextFit(from);
    while (next >= decode_order.size() &&
           (move_counted || splice->continuations() < max_migrations_) && !exchange.clientGone() &&
           !client.stop->fired && secondsSince(*first_break) <= migration_timeout_s_) {
      co_await sleepFor(std::chrono::duration<double>(kRecheckInterval).count());
      next = nextFit(from);
    }
    co_return next;
  };
  for (size_t attempt = 0; attempt < decode_order.size(); ++attempt) {
    if (client.stop->fired) {
      co_await endForStop();
      co_return;
    }
    // A copy: admitting newcomers grows decode_agents.
    const AgentPtr decode = decode_agents[decode_order[attempt]];
    tried_process[decode.get()] = decode->instanceId();
    if (attempt > 0 && !left_first) {
      left_first = true;
      if (!migrating) {
        body.erase("kv_transfer_params");  // the lend was for the first decode agent
        co_await releaseLend();
      }
    }
    Handoff handoff;
    if (attempt == 0 && decision.kind == Decision::Kind::kDisaggregated && !transfer_refused) {
      handoff = co_await prefillOn(exchange, body, request, prefill_agents, input, decision, lent,
                                   std::move(prefill_reservation), hashes, *client.stop);
      if (handoff.params.is_null()) {
        co_await releaseLend();  // no prefill agent read it
      } else {
        lent = nullptr;  // the prefill agent read it and let it go
        prompt_prefill = handoff.prefill;
      }
      prefill_answered_s = secondsSince(arrival);
      decisions_.observe(logged, "observed_prefill_s", prefill_answered_s);
      if (exchange.clientGone()) {
        // Nobody waits for the answer: what the prefill agent holds for
        // it goes back now, and no decode agent sees the request.
        co_await release(handoff);
        metrics_.countClientAbort("prefill");
        co_return;
      }
      if (client.stop->fired) {
        co_await release(handoff);
        co_await endForStop();
        co_return;
      }
      if (handoff.client_error) {
        // A 400 is the request's (a refusal at its first token, which an
        // agent's own stream carries as its one event); other 4xx (a key
        // the agents refuse, ...) pass as they came.
        if (streaming && handoff.status == 400) {
          co_await endStreamWithAgentError(exchange, handoff.body);
        } else {
          co_await exchange.respond(
              server::httpJsonResponse(handoff.status, std::move(handoff.body)));
        }
        co_return;
      }
      if (handoff.retried) retried = resent = true;
    }
    const std::string label = !handoff.params.is_null()
                                  ? (handoff.pulled_back ? "pull_back" : "disaggregated")
                                  : "local_prefill";
    if (handoff.params.is_null() &&
        (attempt > 0 || decision.kind == Decision::Kind::kDisaggregated)) {
      // Retried here, or every prefill agent failed: this decode agent
      // prefills the prompt, and its reservation replaces the last one.
      decode_reservation =
          ledger_.reserve(decode, decodeCounts(input, input.decode[decode_order[attempt]], true));
    }
    Prediction prediction;
    // What a decision predicted is learned from only when it ran as decided:
    // not after a retry, nor when a lend it counted on did not pin the
    // prefix (the prefix was computed: a false premise, which would
    // otherwise teach the path's learned cost that it is slow).
    if (!retried && !(attempt == 0 && lend_missed)) {
      prediction.decision = decision;
      prediction.observed_prefill_s = prefill_answered_s;
    }
    prediction.logged = logged;
    // The stream is handed over when this agent drains only if another
    // agent could resume it: a lone decode agent (or the last one fit, or a
    // stream out of moves) finishes its streams as it drains instead, within
    // its --shutdown-timeout, rather than handing them to nobody.
    const std::function<bool()> movable = [&] {
      return splice && splice->continuations() < max_migrations_ &&
             nextFit(attempt + 1) < decode_order.size();
    };
    DecodeOutcome outcome = co_await decodeOn(exchange, body, streaming, decode, handoff, label,
                                              arrival, decode_reservation, prediction,
                                              splice ? &*splice : nullptr, movable, client);
    if (outcome == DecodeOutcome::kTransferRefused) {
      // The agent cannot read what was held for it: that goes back now,
      // and the same agent prefills the prompt itself (once: nothing is
      // transferred to it then).
      if (!handoff.params.is_null()) co_await release(handoff);
      co_await releaseLend();
      body.erase("kv_transfer_params");
      transfer_refused = true;
      retried = resent = true;
      metrics_.countTransferRefused();
      --attempt;  // the loop's increment makes it this agent again
      continue;
    }
    if (outcome == DecodeOutcome::kRefused) {
      // Its answer went to the client as it came; the agent read no KV, so
      // what was held for it is let go now, not at the holders' timeouts.
      if (!handoff.params.is_null()) co_await release(handoff);
      co_await releaseLend();
    }
    if (outcome == DecodeOutcome::kDone || outcome == DecodeOutcome::kRefused) {
      if (migrating) lent = nullptr;  // the resuming agent read the lend and let it go
      metrics_.countDecision(label);
      if (decision.affinity && !retried) metrics_.countDecision("affinity");
      if (decision.spilled && !retried) metrics_.countDecision("spill");
      // A stream moved mid-answer is counted by its migrations, not here.
      if (resent) metrics_.countDecision("retried");
      co_return;
    }
    if (outcome == DecodeOutcome::kStopped) {
      co_await release(handoff);
      co_await endForStop();
      co_return;
    }
    if (outcome == DecodeOutcome::kClientGone || outcome == DecodeOutcome::kClientGoneMidway) {
      // A cancel, not a failure: the upstream connection is closed (the
      // decode agent aborts the request); a transfer it has not read yet
      // is released now rather than at the prefill agent's timeout.
      co_await release(handoff);
      co_await releaseLend();
      metrics_.countClientAbort(outcome == DecodeOutcome::kClientGone ? "decode" : "response");
      co_return;
    }
    if (outcome == DecodeOutcome::kBrokenAfterStart || outcome == DecodeOutcome::kStalled ||
        outcome == DecodeOutcome::kHandedOver || outcome == DecodeOutcome::kUpstreamError) {
      const char* reason = outcome == DecodeOutcome::kHandedOver      ? "drain"
                           : outcome == DecodeOutcome::kStalled       ? "stall"
                           : outcome == DecodeOutcome::kUpstreamError ? "error"
                                                                      : "failure";
      // The next decode agent still fit for it.
      size_t next = nextFit(attempt + 1);
      if (!first_break) first_break = Clock::now();
      // What the last attempt was lent is done with; what a draining agent
      // holds for this stream is the lend now (read by the next agent, or
      // released below when there is none).
      co_await releaseLend();
      if (splice && splice->handedOver() && splice->handOverParams().is_object()) {
        lent = splice->handOverParams();
        lender = decode;
      }
      const bool one_choice = parsed.value().n == 1 && parsed.value().batch.empty();
      if (splice && one_choice && splice->finished()) {
        // The agent broke after the answer's last chunk: only its usage
        // chunk and [DONE], or only the body's end, are missing (an agent
        // asked to resume a finished answer would refuse it).
        co_await endStream(exchange, splice->done());
        metrics_.countDecision(label);
        co_return;
      }
      if (splice && one_choice) next = co_await waitForFit(attempt + 1, /*move_counted=*/false);
      if (client.stop->fired) {
        co_await endForStop();
        co_return;
      }
      const NoMove why_not =
          !one_choice                                            ? NoMove::kSeveralChoices
          : splice && splice->continuations() >= max_migrations_ ? NoMove::kBudgetSpent
          : next >= decode_order.size()                          ? NoMove::kNoAgentLeft
          : secondsSince(*first_break) > migration_timeout_s_    ? NoMove::kTimedOut
                                                                 : NoMove::kNoAgentLeft;
      if (!splice || why_not != NoMove::kNoAgentLeft || next >= decode_order.size()) {
        metrics_.countMigration(reason, "exhausted");
        if (splice) {
          co_await endStreamWithError(
              exchange, exhaustedMessage(decode->endpoint.name, splice->upstreamError(),
                                         splice->continuations(), why_not, migration_timeout_s_));
        }
        co_await releaseLend();
        co_return;
      }
      // The next decode agent resumes the answer from what it has so far.
      // A draining agent handed over the blocks of the prompt and the
      // output so far, held for the next agent. Otherwise the transfer, if
      // any, was for the failed agent; the prefill agent that computed the
      // prompt still caches it, so the prompt's blocks are lent from there
      // and only the rest is recomputed.
      if (!handoff.params.is_null() && handoff.prefill) {
        // Not awaited: the prefill agent answers between two of its steps
        // (a long prefill's step takes hundreds of milliseconds), and the
        // client's stream must not wait for one.
        auto executor = co_await asio::this_coro::executor;
        asio::co_spawn(
            executor,
            callAgent(handoff.prefill->endpoint, http::verb::post,
                      std::string("/v1/kv_transfer/release"), releaseBody(handoff.params), 5.0),
            asio::detached);
      }
      if (!splice->tokenIds().empty()) body["resume_token_ids"] = splice->tokenIds();
      body.erase("kv_transfer_params");
      const char* kv = "recomputed";
      int64_t transferred = 0;
      if (!lent.is_null()) {  // the draining agent's hand-over
        setRemotePrefix(body, lent);
        transferred = lent.value("remote_num_tokens", int64_t{0});
        kv = "handed_over";
      } else if (prompt_prefill && prompt_prefill->healthy) {
        Lent lend = co_await lendFrom(prompt_prefill, request, input.num_prompt_tokens);
        if (!lend.params.is_null()) {
          setRemotePrefix(body, lend.params);
          lent = std::move(lend.params);
          lender = prompt_prefill;
          transferred = lend.tokens;
          kv = "pulled";
        }
      }
      const auto total_tokens =
          static_cast<int64_t>(request.prompt.size() + splice->tokenIds().size());
      splice->beginContinuation();
      migrating = true;
      client.resuming = reason;
      metrics_.countMigration(reason, "resumed");
      metrics_.countMigrationPrefix(kv, transferred,
                                    std::max<int64_t>(0, total_tokens - transferred));
      TANDEM_LOG(kInfo) << "router: request " << exchange.request().id << ": resuming the stream "
                        << decode->endpoint.name << " "
                        << (reason == std::string("drain") ? "handed over" : "broke") << " after "
                        << splice->tokenIds().size() << " tokens (" << reason << ") on "
                        << decode_agents[decode_order[next]]->endpoint.name << ", KV " << kv << " ("
                        << transferred << " of " << total_tokens << " tokens transferred)";
      retried = true;
      attempt = next - 1;  // the loop's increment makes it `next`
      continue;
    }
    // This agent failed before it sent anything: give the transfer back
    // and try the next decode agent, which prefills itself — unless the
    // time to move a broken stream is up.
    if (!handoff.params.is_null()) co_await release(handoff);
    retried = true;
    if (!migrating) resent = true;
    // A resumed stream (one choice: no other moves) waits for an agent to
    // come, as at its break, unless its time to move is up: the agent it was
    // resumed on may have been draining too, not yet seen unhealthy (every
    // agent of a pool replaced at once).
    const bool timed_out = migrating && secondsSince(*first_break) > migration_timeout_s_;
    size_t next = decode_order.size();
    if (migrating && !timed_out) {
      next = co_await waitForFit(attempt + 1, /*move_counted=*/true);
      if (client.stop->fired) {
        co_await endForStop();
        co_return;
      }
    } else if (!migrating) {
      next = nextFit(attempt + 1);
      if (next >= decode_order.size() &&
          (outcome == DecodeOutcome::kRefusedDraining || client.cut_whole != nullptr)) {
        // Every decode agent drains (a pool replaced at once, a lone
        // agent's drain), or the one that cut this whole answer was the
        // last: the request waits for the agents that replace them, as a
        // broken or handed-over stream does, within --migration-timeout.
        if (!first_break) first_break = Clock::now();
        next = co_await waitForFit(attempt + 1, /*move_counted=*/true);
        if (client.stop->fired) {
          co_await endForStop();
          co_return;
        }
      }
    }
    // A whole answer cut short is counted once its fate is known: sent
    // again to the next agent, or lost for want of one.
    if (client.cut_whole != nullptr) {
      const bool lost = next >= decode_order.size();
      metrics_.countMigration(client.cut_whole, lost ? "exhausted" : "resent");
      if (lost) {
        TANDEM_LOG(kWarn) << "router: request " << exchange.request().id
                          << ": no decode agent to send its cut answer to again";
        cut_answer_lost = true;
      }
      client.cut_whole = nullptr;
    }
    if (migrating && next >= decode_order.size()) {
      metrics_.countMigration("failure", "exhausted");
      co_await releaseLend();
      co_await endStreamWithError(
          exchange,
          exhaustedMessage(decode->endpoint.name, "", splice->continuations(),
                           secondsSince(*first_break) > migration_timeout_s_ ? NoMove::kTimedOut
                                                                             : NoMove::kNoAgentLeft,
                           migration_timeout_s_));
      co_return;
    }
    attempt = next - 1;  // the loop's increment makes it the next fit one
  }
  co_await releaseLend();
  metrics_.countDecision("rejected");
  if (client.started) {
    // Headers are out: the stream ends with an error event instead.
    co_await endStreamWithError(exchange, "every decode agent failed this request");
    co_return;
  }
  if (cut_answer_lost) {
    // Built before the co_await (GCC 12).
    std::ostringstream why;
    why << "the decode agent stopped before this answer's end, and no other decode agent took "
           "it within --migration-timeout ("
        << migration_timeout_s_ << " s)";
    co_await exchange.respond(unavailable(why.str()));
    co_return;
  }
  if (!client.overload_refusal.empty()) {
    // The last decode agent tried was full: its refusal, to retry later.
    server::HttpResponse refusal = server::httpJsonResponse(503, client.overload_refusal);
    refusal.set_header("Retry-After", "1");
    co_await exchange.respond(std::move(refusal));
    co_return;
  }
  co_await exchange.respond(unavailable("every decode agent failed this request"));
}

// Prefills on the chosen prefill agent (others on failure), reading `lent`
// (a lender's kv_transfer_params; null: none) first when given, until one
// answers, the client leaves or `stop` fires (cutAll: its call is closed).
awaitable<CompletionFlow::Handoff> CompletionFlow::prefillOn(
    HttpExchange& exchange, const Body& body, const protocol::Request& request,
    const std::vector<AgentPtr>& prefill_agents, const DecisionInput& input,
    const Decision& decision, const json& lent, LoadLedger::Reservation reservation,
    std::span<const BlockHash> hashes, StopCut& stop) {
  Handoff handoff;
  const Policy policy = chooser_.options().policy;
  const bool expects_blocks = policy == Policy::kKv || policy == Policy::kSglang;
  std::vector<size_t> order = {*decision.prefill};
  for (size_t i = 0; i < prefill_agents.size(); ++i) {
    if (i != *decision.prefill && input.prefill[i].healthy) order.push_back(i);
  }
  const std::string prefill_body = prefillBody(body, lent);
  const std::string target = targetOf(body);
  for (size_t attempt = 0; attempt < order.size() && !exchange.clientGone() && !stop.fired;
       ++attempt) {
    const AgentPtr& prefill = prefill_agents[order[attempt]];
    if (attempt > 0) {
      reservation = ledger_.reserve(prefill, prefillCounts(input, input.prefill[order[attempt]]));
      // The prompt's blocks are now expected where they are computed.
      if (expects_blocks) agents_.expectBlocks(prefill->endpoint.name, hashes, kExpectedBlocksTtl);
    }
    // The client leaving, or the router's stop deadline (cutAll), ends the
    // call's request side: the agent aborts the prefill and frees its
    // blocks (an answer it had sent is read, and released below).
    UpstreamResult result = co_await callAgent(prefill->endpoint, http::verb::post, target,
                                               prefill_body, upstream_timeout_s_, &exchange,
                                               OnClientLeaving::kFinish, &stop.close_upstream);
    reservation.release();  // answered (or failed): its prefill is no longer queued there
    if (result.status >= 400 && !agentFailed(result.status)) {
      handoff.client_error = true;
      handoff.status = result.status;
      handoff.body = result.body;
      break;
    }
    if (result.status == 200) {
      json answer = parseJsonOrDiscarded(result.body);
      if (answer.is_object() && answer.contains("kv_transfer_params") &&
          answer["kv_transfer_params"].is_object()) {
        handoff.params = answer["kv_transfer_params"];
        handoff.prefill = prefill;
        handoff.pulled_back = !lent.is_null();
        break;
      }
    }
    // The blocks it was expected to compute are not there: no later request
    // may be sent to it for them.
    if (expects_blocks) agents_.unexpectBlocks(prefill->endpoint.name, hashes);
    // The call was cut short: not the agent's fault.
    if (exchange.clientGone() || stop.fired) break;
    metrics_.countUpstreamError(prefill->endpoint.name);
    TANDEM_LOG(kWarn) << "router: prefill on " << prefill->endpoint.name << " failed ("
                      << (result.status == 0 ? result.error : std::to_string(result.status)) << ")";
    handoff.retried = true;
  }
  co_return handoff;
}

void CompletionFlow::observeTtft(double ttft_s, const Prediction& prediction) {
  decisions_.observe(prediction.logged, "observed_ttft_s", ttft_s);
  if (prediction.decision.predicted_ttft_s <= 0) return;
  metrics_.observeTtftPrediction(ttft_s, prediction.decision.predicted_ttft_s);
  auto lock = ledger_.lock();  // the chooser's lock
  chooser_.observe(prediction.decision, prediction.observed_prefill_s, ttft_s);
}

awaitable<CompletionFlow::Lent> CompletionFlow::lendFrom(const AgentPtr& lender,
                                                         const protocol::Request& request,
                                                         int64_t expected_tokens) {
  UpstreamResult held =
      co_await callAgent(lender->endpoint, http::verb::post, std::string("/v1/kv_transfer/hold"),
                         holdBody(request, kv_secret_, *lender), 10.0);
  json lent;
  int64_t lent_tokens = 0;
  if (held.status == 200) {
    json answer = parseJsonOrDiscarded(held.body);
    if (answer.is_object() && answer.contains("kv_transfer_params")) {
      lent = answer["kv_transfer_params"];
      const auto num = answer.find("num_tokens");
      if (num != answer.end() && num->is_number_integer()) lent_tokens = num->get<int64_t>();
    }
  }
  const bool full = !lent.is_null() && lent_tokens >= expected_tokens;
  metrics_.countLend(lent.is_null() ? "refused" : full ? "full" : "short");
  if (lent.is_null()) lent_tokens = 0;
  co_return Lent{std::move(lent), full, lent_tokens};
}

awaitable<void> CompletionFlow::release(const Handoff& handoff) {
  if (!handoff.prefill) co_return;
  co_await callAgent(handoff.prefill->endpoint, http::verb::post,
                     std::string("/v1/kv_transfer/release"), releaseBody(handoff.params), 5.0);
}

// Sends the request to the decode agent and passes its answer through.
awaitable<CompletionFlow::DecodeOutcome> CompletionFlow::decodeOn(
    HttpExchange& exchange, Body body, bool streaming, const AgentPtr& decode,
    const Handoff& handoff, const std::string& label, Clock::time_point arrival,
    LoadLedger::Reservation& reservation, const Prediction& prediction, StreamSplice* splice,
    const std::function<bool()>& movable, ClientStream& client) {
  const std::string request_body = decodeBody(body, handoff.params);
  const std::string target = targetOf(body);
  std::vector<std::pair<std::string, std::string>> headers = {
      {"x-tandem-decision", label},
      {"x-tandem-decode-agent", decode->endpoint.name},
      {"x-tandem-prefill-agent",
       handoff.prefill ? handoff.prefill->endpoint.name : decode->endpoint.name},
      {"x-tandem-kv-blocks-moved", std::to_string(blocksOffered(handoff.params))}};
  if (exchange.clientGone()) co_return DecodeOutcome::kClientGone;
  beast::tcp_stream upstream(co_await asio::this_coro::executor);
  // Where the agent has said all it will (its answer complete, a refusal,
  // a hand-over, an error event), the connection is left for it to close
  // first (closeAfterAgent); elsewhere (a client gone, a broken stream) it
  // is closed here.
  struct LeaveToAgent {
    beast::tcp_stream& stream;
    bool answered = false;
    ~LeaveToAgent() {
      if (answered) closeAfterAgent(std::move(stream));
    }
  } leave_to_agent{upstream};
  // A client leaving before that closes the upstream connection: the decode
  // agent aborts the request and frees its blocks.
  server::OnClientGone cancel(exchange, [&upstream, &leave_to_agent] {
    if (!leave_to_agent.answered) upstream.close();
  });
  // The router's stop deadline (cutAll) closes it too.
  const auto stopped = [&client] { return client.stop && client.stop->fired; };
  struct CloseOnStop {
    ClientStream& client;
    ~CloseOnStop() {
      if (client.stop) client.stop->close_upstream = nullptr;
    }
  } close_on_stop{client};
  if (client.stop) {
    client.stop->close_upstream = [&upstream, &leave_to_agent] {
      if (!leave_to_agent.answered) upstream.close();
    };
  }
  if (stopped()) co_return DecodeOutcome::kStopped;
  beast::flat_buffer buffer;
  // One parser per message: interim 102 answers come before the real one.
  std::optional<http::response_parser<http::buffer_body>> parser_storage;
  auto fresh_parser = [&parser_storage]() -> http::response_parser<http::buffer_body>& {
    parser_storage.emplace();
    parser_storage->body_limit(kNoBodyLimit);
    return *parser_storage;
  };
  http::response_parser<http::buffer_body>* parser = &fresh_parser();
  const bool whole = !streaming;  // a whole answer: see below
  bool sent = false;              // the agent has the request
  // Whether the agent was asked to hand the stream over when it drains,
  // and when to look again whether it should be (it is unhealthy, and
  // another agent could resume the stream: one joined since it began).
  // (Shared with the ask's own task: an ask that got no answer is made again.)
  auto hand_over_asked = std::make_shared<std::atomic<bool>>(false);
  Clock::time_point next_hand_over_check{};
  try {
    tcp::resolver resolver(co_await asio::this_coro::executor);
    upstream.expires_after(std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(upstream_timeout_s_)));
    auto results = co_await resolver.async_resolve(
        decode->endpoint.host, std::to_string(decode->endpoint.port), use_awaitable);
    co_await upstream.async_connect(results, use_awaitable);
    http::request<http::string_body> request{http::verb::post, target, 11};
    setAgentHeaders(request, decode->endpoint);
    // The agent's id of the request (its X-Request-Id, the id inside
    // cmpl-…) starts with this router's.
    request.set(server::kRequestIdHeader, exchange.request().id);
    request.set(http::field::content_type, "application/json");
    // A stream this router can move is handed over, not finished, when the
    // agent drains.
    if (splice != nullptr && streaming && movable()) {
      request.set(server::kHandOverHeader, "drain");
      hand_over_asked->store(true);
    }
    // A whole answer is silent until complete: the agent says it is alive
    // (102 Processing) four times per silence timeout meanwhile.
    if (whole) {
      request.set(
          server::kProgressHeader,
          std::to_string(std::max<int64_t>(1, static_cast<int64_t>(upstream_timeout_s_ * 250))));
    }
    request.body() = request_body;
    request.prepare_payload();
    co_await http::async_write(upstream, request, use_awaitable);
    sent = true;
    co_await http::async_read_header(upstream, buffer, *parser, use_awaitable);
    while (parser->get().result_int() == 102) {
      // The agent has the answer's first token: its prompt is computed.
      if (parser->get()[server::kFirstTokenHeader] == "1") {
        if (!client.started && !client.first_token_seen) {
          client.first_token_seen = true;
          const double ttft = std::chrono::duration<double>(Clock::now() - arrival).count();
          metrics_.observeTtft(ttft);
          observeTtft(ttft, prediction);
        }
        reservation.prefillDone();
      }
      upstream.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(upstream_timeout_s_)));
      parser = &fresh_parser();
      co_await http::async_read_header(upstream, buffer, *parser, use_awaitable);
    }
  } catch (const std::exception& e) {
    if (exchange.clientGone()) co_return DecodeOutcome::kClientGone;
    if (stopped()) co_return DecodeOutcome::kStopped;
    metrics_.countUpstreamError(decode->endpoint.name);
    TANDEM_LOG(kWarn) << "router: decode on " << decode->endpoint.name << " failed: " << e.what();
    // An agent answers a whole request only at its end: one that failed
    // once it had the request cut the answer short.
    if (whole && sent) client.cut_whole = timedOut(e) ? "stall" : "failure";
    co_return DecodeOutcome::kFailedBeforeStart;
  }
  if (exchange.clientGone()) co_return DecodeOutcome::kClientGone;
  const int status = static_cast<int>(parser->get().result_int());
  // A refusal's body, read whole (up to `limit` bytes).
  auto readRefusal = [&](size_t limit) -> awaitable<std::string> {
    std::string refusal;
    char chunk[4096];
    while (!parser->is_done() && refusal.size() < limit) {
      parser->get().body().data = chunk;
      parser->get().body().size = sizeof chunk;
      boost::system::error_code ec;
      co_await http::async_read_some(upstream, buffer, *parser,
                                     asio::redirect_error(use_awaitable, ec));
      if (ec && ec != http::error::need_buffer) break;
      refusal.append(chunk, sizeof chunk - parser->get().body().size);
    }
    co_return refusal;
  };
  if (agentFailed(status)) {
    // A drain's refusal (503, "the agent is draining: ..."): the agents
    // that replace it may come, and the caller waits for them. A full
    // waiting queue's (503, "too many waiting requests"): load, not a
    // failure; another agent may take the request, else the client gets
    // this refusal, to retry.
    std::string refusal;
    if (status == 503) refusal = co_await readRefusal(kMaxRefusalBytes);
    leave_to_agent.answered = true;
    if (refusal.find("too many waiting requests") != std::string::npos) {
      client.overload_refusal = std::move(refusal);
      co_return DecodeOutcome::kRefusedOverloaded;
    }
    metrics_.countUpstreamError(decode->endpoint.name);
    co_return refusal.find("the agent is draining") != std::string::npos
        ? DecodeOutcome::kRefusedDraining
        : DecodeOutcome::kFailedBeforeStart;
  }
  // A transfer this router arranged that the agent cannot take (a 400
  // naming kv_transfer_params: pools that store KV differently, as while a
  // rollout changes one pool's kvDtype or block size) is not the client's
  // error: the caller prefills on this agent instead. Any other 400 is the
  // client's, passed on whole.
  if (status == 400 && !client.started &&
      request_body.find("\"kv_transfer_params\"") != std::string::npos) {
    const std::string refusal = co_await readRefusal(kMaxTransferRefusalBytes);
    leave_to_agent.answered = true;
    const json answer = parseJsonOrDiscarded(refusal);
    const json* param = nullptr;
    if (answer.is_object() && answer.contains("error") && answer["error"].is_object() &&
        answer["error"].contains("param")) {
      param = &answer["error"]["param"];
    }
    if (param != nullptr && param->is_string() &&
        param->get_ref<const std::string&>().starts_with("kv_transfer_params")) {
      TANDEM_LOG(kWarn) << "router: " << decode->endpoint.name
                        << " refused the KV transfer arranged for request " << exchange.request().id
                        << " (" << answer["error"].value("message", std::string())
                        << "): it prefills the prompt itself";
      co_return DecodeOutcome::kTransferRefused;
    }
    server::HttpResponse passed = server::httpJsonResponse(status, refusal);
    for (auto& [name, value] : headers) passed.set_header(name, value);
    co_await exchange.respond(std::move(passed));
    co_return DecodeOutcome::kRefused;
  }
  std::string content_type(parser->get()[http::field::content_type]);
  if (content_type.empty()) content_type = "application/json";
  // Pass the answer through as it comes: SSE events one by one.
  if (content_type.starts_with("text/event-stream")) {
    headers.emplace_back("Cache-Control", "no-cache");
  }
  // A failed write to the client is the client gone, never the agent.
  // (Arguments are named: GCC 12 destroys some temporaries of a co_await
  // expression twice.) A continuation's client has its headers already.
  // A whole (not streamed) answer is kept until complete: an agent failing
  // before its end is then a failure before start, retried elsewhere, and
  // the client gets one answer (the same one, with greedy or seeded
  // sampling).
  const bool continuation = client.started;
  std::string whole_body;
  if (!client.started && !whole) {
    const bool headers_sent =
        co_await exchange.startChunked(status, std::move(content_type), std::move(headers));
    if (!headers_sent) co_return DecodeOutcome::kClientGone;
    client.started = true;
    // The headers are the client's first piece: a stream moved before its
    // first event paused from here.
    client.last_write = Clock::now();
  }
  // A stream of events goes through the splice, whole events only; any
  // other answer as it comes.
  const bool spliced = splice != nullptr && streaming && status == 200;
  if (continuation && !spliced) co_return DecodeOutcome::kBrokenAfterStart;
  const std::string agent_request_id(parser->get()[server::kRequestIdHeader]);
  std::string broken;  // why the pass-through stopped early
  bool stalled = false;
  try {
    char chunk[16384];
    std::string events;  // for timing: complete SSE events seen so far
    Clock::time_point last_token{};
    while (!parser->is_done()) {
      parser->get().body().data = chunk;
      parser->get().body().size = sizeof chunk;
      boost::system::error_code ec;
      // The timeout bounds the silence between pieces, not the whole
      // answer: a stream may run as long as it produces, and one whose
      // agent stopped producing breaks (and moves) after the timeout.
      upstream.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(upstream_timeout_s_)));
      co_await http::async_read_some(upstream, buffer, *parser,
                                     asio::redirect_error(use_awaitable, ec));
      if (ec && ec != http::error::need_buffer) throw boost::system::system_error(ec);
      const size_t n = sizeof chunk - parser->get().body().size;
      if (n == 0) continue;
      if (spliced && hand_over_asked->load() && !agent_request_id.empty() &&
          Clock::now() >= next_hand_over_check) {
        // Asked to hand the stream over, but no agent could resume it now
        // (the others of its model are draining or gone, as when a
        // rollout replaces them with another model's): the ask is
        // withdrawn, so that this agent finishes the stream as it drains
        // instead of handing it to nobody. Asked again (below) should one
        // come while this one is unhealthy.
        next_hand_over_check = Clock::now() + kRecheckInterval;
        if (!movable()) {
          hand_over_asked->store(false);
          TANDEM_LOG(kInfo) << "router: request " << exchange.request().id << ": asking "
                            << decode->endpoint.name
                            << " to finish its stream rather than hand it over: no other decode "
                               "agent of its model can resume it now";
          asio::co_spawn(co_await asio::this_coro::executor,
                         askForHandOver(decode->endpoint,
                                        handOverBody(agent_request_id, kv_secret_, *decode,
                                                     /*hand_over=*/false),
                                        exchange.request().id, nullptr),
                         asio::detached);
        }
      } else if (spliced && !hand_over_asked->load() && !agent_request_id.empty() &&
                 (!decode->healthy || !decode->listed) && Clock::now() >= next_hand_over_check) {
        next_hand_over_check = Clock::now() + kRecheckInterval;
        if (movable()) {
          hand_over_asked->store(true);
          TANDEM_LOG(kInfo) << "router: request " << exchange.request().id << ": asking "
                            << decode->endpoint.name
                            << ", unhealthy (draining?), to hand its stream over: another decode "
                               "agent can resume it now";
          asio::co_spawn(
              co_await asio::this_coro::executor,
              askForHandOver(decode->endpoint, handOverBody(agent_request_id, kv_secret_, *decode),
                             exchange.request().id, hand_over_asked),
              asio::detached);
        }
      }
      std::string piece;
      if (streaming && status == 200) {
        events.append(chunk, n);
        size_t end;
        while ((end = events.find("\n\n")) != std::string::npos) {
          const std::string event = events.substr(0, end + 2);
          events.erase(0, end + 2);
          if (spliced) piece += splice->relay(event);
          if (!event.starts_with("data: {") ||
              (spliced && (splice->handedOver() || !splice->upstreamError().empty()))) {
            continue;
          }
          // The usage chunk ending a stream with include_usage (its
          // "choices" empty, as the agents write it) carries no token: its
          // gap is no inter-token latency.
          if (event.find("\"choices\":[]") != std::string::npos) continue;
          const auto now = Clock::now();
          if (last_token == Clock::time_point{}) {
            const double ttft = std::chrono::duration<double>(now - arrival).count();
            if (!continuation) {
              metrics_.observeTtft(ttft);
              observeTtft(ttft, prediction);
            }
            reservation.prefillDone();
          } else {
            metrics_.observeItl(std::chrono::duration<double>(now - last_token).count());
          }
          last_token = now;
        }
      }
      if (whole) {
        whole_body.append(chunk, n);
        continue;
      }
      if (!spliced) piece.assign(chunk, n);
      if (piece.empty()) continue;
      const auto now = Clock::now();
      if (client.resuming != nullptr) {
        metrics_.observeMigrationPause(
            client.resuming, std::chrono::duration<double>(now - client.last_write).count());
        client.resuming = nullptr;
      }
      client.last_write = now;
      const bool written = co_await exchange.writeChunk(std::move(piece));
      if (!written) {
        // The client left (or stopped reading for the write timeout):
        // closing the upstream connection makes the decode agent abort the
        // request and free its blocks.
        co_return DecodeOutcome::kClientGoneMidway;
      }
      // [DONE] is out: nothing the agent still sends (its body's end)
      // reaches the client, who may leave now, served.
      if (spliced && splice->done()) break;
    }
    // A draining agent ends its part with the hand-over event.
    if (spliced && splice->handedOver()) {
      leave_to_agent.answered = true;
      co_return DecodeOutcome::kHandedOver;
    }
    // The agent failed the request: another may not.
    if (spliced && !splice->upstreamError().empty()) {
      leave_to_agent.answered = true;
      metrics_.countUpstreamError(decode->endpoint.name);
      TANDEM_LOG(kWarn) << "router: stream from " << decode->endpoint.name
                        << " ended with an error: " << splice->upstreamError();
      co_return DecodeOutcome::kUpstreamError;
    }
    // An agent ends a whole answer with finish_reason abort, its client
    // still there, only when it stopped before the end (its shutdown
    // deadline, as it drains): the answer is cut short, and sent again
    // from its start to the next decode agent, as one whose connection
    // broke (the client has heard nothing of it).
    if (whole && status == 200 && wholeAnswerCut(whole_body)) {
      leave_to_agent.answered = true;
      metrics_.countUpstreamError(decode->endpoint.name);
      client.cut_whole = "error";
      TANDEM_LOG(kWarn) << "router: answer from " << decode->endpoint.name << " to request "
                        << exchange.request().id
                        << " was cut short (finish_reason abort): to be sent again to the next "
                           "decode agent";
      // The agent drains: with no other agent fit now, the request waits
      // for those replacing it, as one a draining agent refused.
      co_return DecodeOutcome::kRefusedDraining;
    }
    if (whole) {
      const bool headers_sent =
          co_await exchange.startChunked(status, std::move(content_type), std::move(headers));
      if (!headers_sent) co_return DecodeOutcome::kClientGone;
      client.started = true;
      const bool written = co_await exchange.writeChunk(std::move(whole_body));
      if (!written) co_return DecodeOutcome::kClientGoneMidway;
    }
    // An agent that dies between events may still end the body cleanly.
    if (spliced && !splice->done()) throw std::runtime_error("the stream ended before [DONE]");
    leave_to_agent.answered = true;  // the client may leave now, the agent has said it all
    // The client has every byte of the answer: one that closes without
    // waiting for the body's last (empty) chunk, as SSE clients do once
    // they read [DONE], was served, not a client that left midway.
    co_await exchange.finishChunked();
  } catch (const std::exception& e) {
    broken = e.what();
    stalled = timedOut(e);
  }
  if (!broken.empty()) {
    if (exchange.clientGone()) co_return DecodeOutcome::kClientGoneMidway;
    if (stopped()) co_return DecodeOutcome::kStopped;
    metrics_.countUpstreamError(decode->endpoint.name);
    TANDEM_LOG(kWarn) << "router: " << (whole ? "answer" : "stream") << " from "
                      << decode->endpoint.name << " broke: " << broken;
    // The client has heard nothing of a whole answer: sent again elsewhere.
    if (whole) {
      client.cut_whole = stalled ? "stall" : "failure";
      co_return DecodeOutcome::kFailedBeforeStart;
    }
    // A spliced stream is resumed elsewhere by the caller, or ended there.
    if (spliced) co_return stalled ? DecodeOutcome::kStalled : DecodeOutcome::kBrokenAfterStart;
    // Tell a streaming client why its stream ends, if it is still there.
    if (streaming)
      co_await endStreamWithError(exchange, midStreamFailure(decode->endpoint.name, broken));
    co_return DecodeOutcome::kBrokenAfterStart;
  }
  metrics_.observeE2e(secondsSince(arrival));
  co_return status >= 400 ? DecodeOutcome::kRefused : DecodeOutcome::kDone;
}

}  // namespace tandem::router
