// What a client asks of the engine and what the engine reports back.
//
// Plain value types shared by the OpenAI protocol code (which builds them
// from request bodies, in the agent and in the router), the engine's
// scheduler, sampler and output path; plus the check of sampling parameters
// against a model's limits. No other behaviour; nothing here knows the engine.
//
// The engine names these types as its own (tandem::engine::Request, ...):
// the using-declarations at the end of this file.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/structured/constraint.h"
#include "common/tokenizer.h"

namespace tandem::protocol {

using Clock = std::chrono::steady_clock;

struct SamplingParams {
  // 0 means greedy (argmax; ties to the smallest id).
  float temperature = 1.0f;
  float top_p = 1.0f;  // (0, 1]
  int32_t top_k = 0;   // 0: disabled
  float min_p = 0.0f;  // [0, 1]
  // A fixed seed makes sampling reproducible: the same seed, prompt and
  // parameters give the same tokens however the request was batched.
  std::optional<uint64_t> seed;
  float frequency_penalty = 0.0f;   // [-2, 2], OpenAI semantics
  float presence_penalty = 0.0f;    // [-2, 2], OpenAI semantics
  float repetition_penalty = 1.0f;  // > 0, 1 disables (over prompt and output)
  // Number of top alternatives to report per token; nullopt: no logprobs.
  std::optional<int32_t> logprobs;
  // The prompt's logprobs (vLLM's prompt_logprobs; completions' echo with
  // logprobs): each prompt token's logprob under the positions before it and
  // this many top alternatives; nullopt: none. The whole prompt is then
  // computed by this request (no prefix-cache hit, no KV from another agent)
  // until its logprobs are complete.
  std::optional<int32_t> prompt_logprobs;

  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  std::vector<std::string> stop;
  // vLLM's: the output ends with the stop string that ended it.
  bool include_stop_str_in_output = false;
  std::vector<TokenId> stop_token_ids;
  // OpenAI's logit_bias: added to the token's logit before choosing (not to
  // the logits logprobs report); sorted by id, one entry per id.
  std::vector<std::pair<TokenId, float>> logit_bias;
  // vLLM's allowed_token_ids: only these ids may be sampled (every other
  // logit is -inf); sorted, distinct. Empty: all.
  std::vector<TokenId> allowed_token_ids;
  // vLLM's bad_words as token sequences: a sequence's last token is never
  // sampled right after the output ends with the rest of it (a one-token
  // sequence never). Each sequence has at least one id.
  std::vector<std::vector<TokenId>> bad_words_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
};

struct Request {
  std::string id;
  std::vector<TokenId> prompt;
  SamplingParams sampling;
  // Structured output (JSON schema, regex, choice, grammar): the engine
  // samples only tokens the constraint allows and ends the request when it
  // is complete. Null: unconstrained.
  std::optional<structured::Constraint> structured_output;
  // The request field it came from ("structured_outputs.regex",
  // "response_format.json_schema.schema", ...), named by errors about it.
  std::string structured_output_field;
  // vLLM's priority: under the priority scheduling policy a request of a
  // lower value is served first (Scheduler); under first come, first served
  // only 0 is accepted.
  int64_t priority = 0;
  // Mixed into block hashes: requests with different salts never share
  // cached blocks.
  std::string cache_salt;
  // The LoRA adapter it runs with, by its served name (the request's
  // `model` when that names one, docs/lora.md); empty: the base model.
  std::string adapter;
  // Prefill/decode hand-off parameters (the router sets them); null if none.
  nlohmann::json kv_transfer_params;
  // Tokens this request already generated elsewhere (a stream migrated from
  // another agent): they are its first output tokens — computed as context,
  // counted in max_tokens, min_tokens, the penalties and the sampler's step,
  // fed to the detokenizer and stop-string matcher — and only what follows
  // them is emitted. With greedy or seeded sampling the continuation is the
  // one the uninterrupted request would have produced.
  std::vector<TokenId> resume_output;
  // When the agent drains (Engine::drain), this request is not finished
  // there but handed over: it ends at once with RequestOutput::handed_over
  // and its KV blocks held for the agent that will resume it. Set by the
  // router for the streams it can move; others run to their end.
  bool hand_over_on_drain = false;
  // A single stream: the router may still ask for it to be handed over
  // after it began (Engine::askHandOver, once another agent could resume
  // it). Several streams in one (n > 1, a batch) are not.
  bool can_hand_over = false;
  // Completions' echo with max_tokens 0 (OpenAI's prompt scoring): one
  // token is computed (sampling.max_tokens 1) and none reported: the
  // outputs carry no tokens, no text, 0 generated tokens, and end with
  // length.
  bool report_no_output = false;
  // Places in the waiting queue (--max-waiting-requests) the request needs
  // to be admitted: the first choice of a request with n > 1 (best_of)
  // asks room for every choice, since the others follow it.
  int64_t admission_places = 1;
  // A later choice of a request already admitted (n > 1, best_of: added
  // once the first choice has computed the prompt): the id of that first
  // choice (empty: none). It joins its request, so neither the bound nor a
  // drain refuses it (either would fail a request that was accepted, its
  // first choice's work lost), and takes a place its first choice was
  // admitted with.
  std::string joins;
  Clock::time_point arrival = Clock::now();
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finishReasonName(FinishReason reason);  // "stop", "length", "abort", "error"

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
};

struct GeneratedToken {
  TokenId token = 0;
  float logprob = 0.0f;           // set when logprobs were asked for
  std::vector<TokenLogprob> top;  // the top-N alternatives, best first
  // Prompt logprobs only: 1 + the number of ids whose logit is larger.
  int64_t rank = 0;
};

// When a request went through the engine's stages (zero until reached).
struct RequestTimings {
  Clock::time_point arrival{};
  Clock::time_point first_scheduled{};
  Clock::time_point first_token{};
  Clock::time_point finished{};
};

// One step's news for one request, delivered in order.
struct RequestOutput {
  std::string request_id;
  std::vector<GeneratedToken> tokens;  // new tokens this step
  // On the first output of a request with SamplingParams::prompt_logprobs:
  // one entry per prompt token, in order. The first has no logprob (nothing
  // comes before it): only its token is set. The others' logprob, top and
  // rank are as GeneratedToken's, from the logits of the position before.
  std::vector<GeneratedToken> prompt_logprobs;
  std::string text;  // new text (valid UTF-8, stop strings cut)
  FinishReason finish_reason = FinishReason::kNone;
  // With kStop, vLLM's stop_reason: the stop string that ended the answer,
  // or else the stop_token_ids id sampled (an end-of-sequence token sets
  // neither).
  std::optional<std::string> stop_string;
  std::optional<TokenId> stop_token;
  std::string error;  // with kError
  // With kError: the request itself cannot be run (its constraint proved
  // too ambiguous, or nothing can continue it) rather than the server
  // failing, and the request field at fault ("" if none).
  bool invalid_request = false;
  std::string error_param;
  // Filled on the first output and kept on the last.
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t num_generated_tokens = 0;
  RequestTimings timings;  // complete on the final output
  // On the final output: what a KV connector hands the client (e.g. where a
  // decode agent can read this request's blocks); null if nothing.
  nlohmann::json kv_transfer_params;
  // On the first output of a resumed request (Request::resume_output): the
  // text its resumed tokens made, which the agent it came from emitted. Never
  // sent again; output parsers (chat's reasoning and tool calls, logprob
  // offsets) take it in first so they continue where that agent's were.
  std::string resumed_text;
  // On the final output (reason abort) of a request handed over on drain:
  // kv_transfer_params then describe its computed blocks (prompt and output
  // so far) held for the agent that resumes it (null: none could be held).
  bool handed_over = false;

  bool finished() const { return finish_reason != FinishReason::kNone; }
};

// Largest accepted SamplingParams::logprobs (OpenAI's limit).
inline constexpr int32_t kMaxLogprobs = 20;

// Checks a request's sampling parameters against the model. Returns
// InvalidArgument naming the field and the accepted range, e.g.
// "temperature must be between 0 and 2, got 3.5".
Status validateSamplingParams(const SamplingParams& params, int64_t vocab_size,
                              int64_t max_model_len, int64_t prompt_len);

}  // namespace tandem::protocol

namespace tandem::engine {

using protocol::Clock;
using protocol::FinishReason;
using protocol::finishReasonName;
using protocol::GeneratedToken;
using protocol::kMaxLogprobs;
using protocol::Request;
using protocol::RequestOutput;
using protocol::RequestTimings;
using protocol::SamplingParams;
using protocol::TokenLogprob;
using protocol::validateSamplingParams;

}  // namespace tandem::engine
