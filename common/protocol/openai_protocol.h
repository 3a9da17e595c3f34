// The OpenAI-compatible protocol spoken by the agent's HTTP server and by the
// router, as pure functions: request bodies in, protocol::Request or an
// ApiError out; engine outputs in, response bodies and stream chunks out. No
// sockets, no engine: library tandem_protocol, below both the agent and the
// operator. (Its names keep the namespace tandem::server that the agent's
// server code has always used for them.)
//
// Requests follow OpenAI's /v1/completions and /v1/chat/completions with
// vLLM's extensions (top_k, min_p, repetition_penalty, min_tokens,
// stop_token_ids, ignore_eos, skip_special_tokens, cache_salt, priority,
// kv_transfer_params) and vLLM's /tokenize and /detokenize. Unknown fields
// are ignored; structured outputs (response_format, structured_outputs,
// guided_*) are read by structured_request.h; fields that would change the
// result but are not implemented (suffix, echo for chat) are refused with a
// message saying so. Every error names the field and what is accepted.
//
// Nothing here throws: failures come back as ApiError (a bug or out-of-memory
// inside becomes a 500). All functions are safe to call from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/check.h"
#include "common/json_parse.h"
#include "common/protocol/chat_output.h"
#include "common/protocol/chat_template.h"
#include "common/protocol/generation_config.h"
#include "common/protocol/request.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace tandem::server {

// ---------------------------------------------------------------------------
// Errors

// An error response. `type` and `code` follow OpenAI / vLLM:
//   400 invalid_request_error      404 not_found_error (code model_not_found)
//   429 rate_limit_exceeded        500 server_error
//   501 not_implemented_error      503 service_unavailable   504 timeout_error
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field ("messages[2].role"), or empty
  std::string code;   // e.g. "model_not_found", or empty
};

ApiError invalidRequest(std::string message, std::string param = "");
// The 400 for JSON outside its JsonBounds (tooDeep() or tooManyValues()):
// names the bound and, for nesting, where it was crossed, below `field`
// (empty: the request body itself).
ApiError boundsError(const JsonParseError& error, const std::string& field = "");
// A 500 "server_error" with the message.
ApiError serverError(std::string message);
// Response bodies keep their keys in the order they were written (a
// completion's top_logprobs are best first, as vLLM and OpenAI list them).
using ResponseJson = nlohmann::ordered_json;

// JSON text on one line; invalid UTF-8 in strings is replaced, never thrown on.
std::string compactDump(const nlohmann::json& value);
std::string compactDump(const ResponseJson& value);
// {"error": {"message", "type", "param", "code"}}; empty param / code are null.
nlohmann::json errorBody(const ApiError& error);
// HTTP status for a Status from the engine: InvalidArgument / OutOfRange /
// FailedPrecondition 400, NotFound 404, ResourceExhausted 429, Unimplemented
// 501, Unavailable / Aborted 503, DeadlineExceeded 504, others 500. An empty
// `param` is taken from the field path the message begins with, if any.
ApiError fromStatus(const Status& status, std::string param = "");

// A value or the ApiError that explains why there is none.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(ApiError error) : value_(std::move(error)) {}  // NOLINT: implicit by design

  bool isOk() const { return std::holds_alternative<T>(value_); }
  const ApiError& error() const {
    TANDEM_CHECK(!isOk(), "Result::error() on a value");
    return std::get<ApiError>(value_);
  }
  T& value() & {
    TANDEM_CHECK(isOk(), "Result::value() on an error");
    return std::get<T>(value_);
  }
  const T& value() const& {
    TANDEM_CHECK(isOk(), "Result::value() on an error");
    return std::get<T>(value_);
  }
  T&& value() && {
    TANDEM_CHECK(isOk(), "Result::value() on an error");
    return std::get<T>(std::move(value_));
  }

 private:
  std::variant<T, ApiError> value_;
};

// ---------------------------------------------------------------------------
// Requests

// Most choices one request may ask for (n).
inline constexpr int64_t kMaxChoices = 16;
// Prompts in one /v1/completions request (an array of prompts), counted
// with their candidates (prompts x best_of): each is an engine request.
inline constexpr int64_t kMaxBatchedPrompts = 256;
// The token-list entries (logit_bias, allowed_token_ids, stop_token_ids,
// bad_words' tokens) a batch's engine requests hold together: each holds
// its own copy (32 MiB of them at most).
inline constexpr int64_t kMaxBatchedTokenListEntries = int64_t{1} << 22;
// The prompt logprob entries one answer may carry (prompt tokens x
// (prompt_logprobs + 1) x n, summed over its prompts): about 60 MiB of JSON.
inline constexpr int64_t kMaxPromptLogprobEntries = int64_t{1} << 20;

// Values a request body may hold by default: the token ids of a 1M-token
// prompt, or a conversation with tools far larger than any context window.
inline constexpr size_t kMaxRequestJsonValues = size_t{1} << 20;

struct ServerLimits {
  std::string served_model_name;
  // The LoRA adapters served now (docs/lora.md), asked for each request
  // naming another model than served_model_name: a request whose `model`
  // names one runs with it (Request::adapter). An agent's are fixed at
  // start, a router's its agents'. Unset: none.
  std::function<std::vector<std::string>()> lora_adapters;
  int64_t max_model_len = 0;
  // The tokens the agent's KV cache holds (its blocks times the block
  // size): a request's prompt plus max_tokens may not pass it, and a
  // request without max_tokens gets at most what is left of it. 0: not
  // known (the router's: its agents check).
  int64_t kv_cache_tokens = 0;
  // How messages name that cache.
  const char* kv_cache_name = "this agent's KV cache";
  int64_t vocab_size = 0;  // the model's; token ids must be below it
  int32_t max_logprobs = 20;
  // The model's chat template, parsed once at start-up and shared; null or
  // without a template: chat requests are refused with a 400 saying how to
  // give one.
  std::shared_ptr<const ChatTemplate> chat_template;
  // --reasoning-parser / --tool-call-parser: how chat output is split into
  // content, reasoning_content and tool_calls (chat_output.h); both off by
  // default.
  protocol::ChatOutputOptions chat_output;
  // The model's generation_config.json sampling (--generation-config auto):
  // the values a request starts from for the fields it leaves out; its
  // max_new_tokens caps the default max_tokens.
  protocol::GenerationDefaults generation_defaults;
  // What a request body may hold (common/json_parse.h), checked before it is
  // parsed: levels of nested arrays and objects (JSON in a string field the
  // server decodes, such as tool call arguments, gets the same bound), and
  // array elements plus object members.
  JsonBounds json_bounds{kMaxJsonDepth, kMaxRequestJsonValues};
  // The router's: a client's kv_transfer_params are not read (the router
  // sets its own and drops the client's, so they refuse nothing).
  bool ignore_kv_transfer_params = false;
  // vLLM's --return-tokens-as-token-ids: the default of the request field
  // return_tokens_as_token_ids.
  bool return_tokens_as_token_ids = false;
};

struct ParsedRequest {
  // id is left empty for the caller. max_tokens is the request's, or what is
  // left of max_model_len after the prompt. Logprobs were asked for when
  // sampling.logprobs is set; its value is the number of alternatives
  // (completions: `logprobs`; chat: `top_logprobs` with `logprobs: true`).
  protocol::Request request;
  std::string model;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // stream_options.continuous_usage_stats with include_usage (as vLLM: it
  // means nothing without): every chunk carries the usage so far.
  bool continuous_usage = false;
  // vLLM's truncate_prompt_tokens, resolved (-1 is max_model_len): the
  // prompt was cut to its last this-many tokens. Unset: not cut.
  std::optional<int64_t> truncate_prompt_tokens;
  // Choices to generate for the one prompt (OpenAI's n), each its own
  // engine request; with a seed, choice i samples with seed + i.
  int64_t n = 1;
  // Completions: the best_of candidates generated, of which the n with the
  // largest sum of token logprobs are returned (best_of >= n, not streamed).
  int64_t best_of = 1;
  // Completions: the answer starts with the prompt, as OpenAI's echo (not
  // for chat); with logprobs, the logprobs start with the prompt's tokens
  // (the first one's null). echo_text is the prompt's text (its token ids
  // decoded when it was given as ids), empty for a resumed stream (the agent
  // it came from sent it).
  bool echo = false;
  std::string echo_text;
  // A resumed stream with echo: the characters of the prompt's text its
  // first stream echoed, where the output's text offsets begin (as they
  // did there).
  int64_t resumed_echo_chars = 0;
  // vLLM's prompt_logprobs as asked (alternatives per prompt token), for
  // the response; request.sampling.prompt_logprobs is what the engine
  // computes (also set by echo with logprobs).
  std::optional<int32_t> prompt_logprobs;
  // Tandem extension (as vLLM's return_token_ids): each choice and stream
  // chunk also carries the generated token ids.
  bool return_token_ids = false;
  // vLLM's return_tokens_as_token_ids (request field, else the server's
  // default): logprobs name each token "token_id:<id>" instead of its text,
  // so a token that is not text on its own (part of a character) is known.
  bool return_tokens_as_token_ids = false;
  // The prompt as text: the string prompt or the rendered chat; empty when
  // the prompt was given as token ids.
  std::string prompt_text;
  nlohmann::json kv_transfer_params;  // passed through; null when absent
  // Chat: the server's parsers as they apply to this request (the tool-call
  // parser only when the request offers tools and tool_choice is not
  // "none"; reasoning_ended_in_prompt when chat_template_kwargs turned
  // thinking off). Unset when no parser applies.
  std::optional<protocol::ChatOutputOptions> chat_output;
  // Completions given several prompts (an array of them): this request is
  // the first prompt's and `batch` holds the others', each complete (same
  // fields, its own prompt, echo text and max_tokens; no body). Answered
  // as one: prompt i's choices are indexed from i * n.
  std::vector<ParsedRequest> batch;
  // The request body as parsed, object keys in the client's order, for a
  // caller that forwards it (the router) without parsing it again; a chat
  // request's also carries chat_template_time, the time its template was
  // shown, so that each server it is forwarded to renders the same prompt.
  nlohmann::ordered_json body;
};

// POST /v1/completions.
Result<ParsedRequest> parseCompletionRequest(std::string_view body, const ServerLimits& limits,
                                             const Tokenizer& tokenizer);
// POST /v1/chat/completions; the prompt is limits.chat_template applied to
// the request's messages, tools, documents and chat_template_kwargs (see
// chat_request.h), encoded without adding special tokens (the template
// writes them). `cancel`, set by another thread (the client left), ends
// template rendering early with an error; null: never.
Result<ParsedRequest> parseChatCompletionRequest(std::string_view body, const ServerLimits& limits,
                                                 const Tokenizer& tokenizer,
                                                 const std::atomic<bool>* cancel = nullptr);

// The engine requests a request becomes, all held by its agent at once:
// best_of (n unless given) per prompt.
int64_t engineRequestsOf(const ParsedRequest& request);
// The 400 for a request of more engine requests than `most` (an agent
// holds at most --max-num-seqs + --max-waiting-requests at once; a 503
// would be retried in vain), naming the field that made it so many;
// `holder` says whose bound it is ("this agent (--max-num-seqs 2 +
// --max-waiting-requests 1)").
ApiError tooManyEngineRequests(const ParsedRequest& request, int64_t most, std::string_view holder);

// ---------------------------------------------------------------------------
// Responses

// What every response body of one request repeats.
struct ResponseMeta {
  std::string id;       // "cmpl-<request id>" or "chatcmpl-<request id>"
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool chat = false;
  std::optional<int32_t> logprobs;
  bool include_usage = false;
  bool continuous_usage = false;  // ParsedRequest::continuous_usage
  bool return_token_ids = false;
  bool return_tokens_as_token_ids = false;  // ParsedRequest's
  bool skip_special_tokens = true;
  nlohmann::json kv_transfer_params;  // added to the final response when not null
  std::optional<protocol::ChatOutputOptions> chat_output;  // ParsedRequest::chat_output
  // Completions with echo: the prompt's text, put before the output (the
  // first stream chunk carries it). Empty for a resumed stream: the agent
  // it came from sent it.
  std::string echo_text;
  int64_t resumed_echo_chars = 0;  // ParsedRequest's
  // Completions with echo and logprobs: the logprobs start with the
  // prompt's tokens (RequestOutput::prompt_logprobs), offsets into echo_text.
  bool echo_logprobs = false;
  // vLLM's prompt_logprobs (ParsedRequest::prompt_logprobs): a choice's
  // (completions) or the response's (chat) "prompt_logprobs".
  std::optional<int32_t> prompt_logprobs;
  // A resumed stream's tokens (Request::resume_output), which its text
  // offsets continue after.
  std::vector<TokenId> resumed_tokens;
};

ResponseMeta makeResponseMeta(const ParsedRequest& request, std::string_view request_id,
                              int64_t created);

// Folds one step's output into the running total of a non-streamed request:
// tokens and text appended, finish reason and error taken from the step,
// token counts kept at their largest.
void appendOutput(protocol::RequestOutput& total, const protocol::RequestOutput& step);

// {"prompt_tokens", "completion_tokens", "total_tokens",
//  "prompt_tokens_details": {"cached_tokens"}}.
ResponseJson usageJson(const protocol::RequestOutput& output);

// Complete (non-streamed) bodies from the merged output of a finished
// request. A request that finished with FinishReason::kError should be
// answered with engineError() instead.
ResponseJson completionResponse(const ResponseMeta& meta, const protocol::RequestOutput& total,
                                const Tokenizer& tokenizer);
ResponseJson chatCompletionResponse(const ResponseMeta& meta, const protocol::RequestOutput& total,
                                    const Tokenizer& tokenizer);
// 500 server_error carrying output.error.
ApiError engineError(const protocol::RequestOutput& output);

// Character offsets of a completion's tokens in its text, which shows
// their bytes decoded as UTF-8 with each maximal invalid run replaced by
// U+FFFD (as the text is written): a token's offset is the index of the
// character its first byte belongs to, so offsets never decrease, and a
// token that starts inside a character shares that character's offset.
struct TextOffsets {
  int64_t chars = 0;  // characters completed so far
  // Of a character being read: continuation bytes still needed, and the
  // range the next one must fall in.
  int need = 0;
  uint8_t lower = 0x80;
  uint8_t upper = 0xBF;

  // The offset of a token of these bytes; counts them.
  int64_t advance(std::string_view bytes);
};

// Per-stream state the chunk builders carry between calls.
struct StreamState {
  bool role_sent = false;        // chat: the first chunk carried role "assistant"
  TextOffsets text_chars;        // completions: the tokens' text offsets so far
  bool echoed = false;           // completions: meta.echo_text was sent
  bool resumed_counted = false;  // completions: meta.resumed_tokens' offsets counted
  // chat with meta.chat_output: the request's output parser, made on the
  // first chunk.
  std::shared_ptr<protocol::ChatOutputStream> chat_output;
};

// One streamed chunk for one step's output, or nullopt when the step carries
// nothing to send (no text, no logprobs, not finished, role already sent).
// Completions: {"object": "text_completion", "choices": [{"index", "text",
// "logprobs", "finish_reason"}]}. Chat: {"object": "chat.completion.chunk",
// "choices": [{"index", "delta": {"role"?, "content"?}, "logprobs",
// "finish_reason"}]}; the first chunk's delta has role "assistant". With
// include_usage every chunk has "usage": null, or with continuous_usage the
// usage so far (usageJson of the step).
std::optional<ResponseJson> completionChunk(const ResponseMeta& meta,
                                            const protocol::RequestOutput& step,
                                            const Tokenizer& tokenizer, StreamState& state);
std::optional<ResponseJson> chatCompletionChunk(const ResponseMeta& meta,
                                                const protocol::RequestOutput& step,
                                                const Tokenizer& tokenizer, StreamState& state);
// completionChunk or chatCompletionChunk, by meta.chat.
std::optional<ResponseJson> streamChunk(const ResponseMeta& meta,
                                        const protocol::RequestOutput& step,
                                        const Tokenizer& tokenizer, StreamState& state);
// The last chunk before [DONE] when include_usage: "choices": [] and usage
// from the final output.
ResponseJson usageChunk(const ResponseMeta& meta, const protocol::RequestOutput& final_output);

// Server-sent events framing: "data: <compact json>\n\n". Invalid UTF-8 in
// strings is replaced by U+FFFD rather than failing.
std::string sseEvent(const ResponseJson& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// The request header with which a router asks an agent to hand a stream
// over, not finish it, when the agent drains (value "drain";
// Request::hand_over_on_drain). The stream then ends with one event
// {"tandem_handover": {"kv_transfer_params": ...}} and no [DONE].
inline constexpr char kHandOverHeader[] = "x-tandem-handover";
// The request header with which a router asks an agent for an interim
// "102 Processing" every N milliseconds (the value) while a whole (not streamed)
// answer is being generated: the router's silence timeout then bounds a
// stall, not the answer's length.
inline constexpr char kProgressHeader[] = "x-tandem-progress";
// Carried by the interim 102 an agent asked for progress sends as soon as
// the answer's first token is generated (value "1"): the router's end of
// the prompt's prefill (its load ledger, its TTFT) for a whole answer.
inline constexpr char kFirstTokenHeader[] = "x-tandem-first-token";

// A token as logprobs show it: its bytes when they are valid UTF-8; otherwise
// "bytes:" followed by the bytes with each byte that is not part of a valid
// UTF-8 character written as \xNN (as OpenAI and vLLM do).
std::string logprobTokenText(const Tokenizer& tokenizer, TokenId id);

// ---------------------------------------------------------------------------
// vLLM's /tokenize and /detokenize

// {model?, prompt, add_special_tokens? (default true), return_token_strs?} or
// {model?, messages, add_generation_prompt?, continue_final_message?,
//  tools?, documents?, chat_template_kwargs?, add_special_tokens? (default
//  false), return_token_strs?}
//   -> {"count", "max_model_len", "tokens", "token_strs"? (vocabulary form)}.
Result<nlohmann::json> tokenizeResponse(std::string_view body, const ServerLimits& limits,
                                        const Tokenizer& tokenizer,
                                        const std::atomic<bool>* cancel = nullptr);
// {model?, tokens: [ids]} -> {"prompt": text} (special tokens kept).
Result<nlohmann::json> detokenizeResponse(std::string_view body, const ServerLimits& limits,
                                          const Tokenizer& tokenizer);

}  // namespace tandem::server
