#include "common/protocol/request.h"

#include <charconv>
#include <cmath>
#include <span>
#include <string>

namespace tandem::protocol {
namespace {

std::string formatNumber(float x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(x);
}

// Every id of `ids` in [0, vocab_size), else "<what> token ids in [0, V), got ID".
Status checkIds(std::span<const TokenId> ids, int64_t vocab_size, const char* what) {
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size) {
      return invalidArgument(std::string(what) + " token ids in [0, " + std::to_string(vocab_size) +
                             "), got " + std::to_string(id));
    }
  }
  return Status::ok();
}

}  // namespace

const char* finishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

Status validateSamplingParams(const SamplingParams& params, int64_t vocab_size,
                              int64_t max_model_len, int64_t prompt_len) {
  // Comparisons are written so that NaN fails them.
  if (!(params.temperature >= 0.0f && params.temperature <= 2.0f)) {
    return invalidArgument("temperature must be between 0 and 2, got " +
                           formatNumber(params.temperature));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return invalidArgument("top_p must be in (0, 1], got " + formatNumber(params.top_p));
  }
  if (params.top_k < -1) {
    return invalidArgument("top_k must be 0 (disabled) or positive, got " +
                           std::to_string(params.top_k));
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return invalidArgument("min_p must be between 0 and 1, got " + formatNumber(params.min_p));
  }
  if (!(params.frequency_penalty >= -2.0f && params.frequency_penalty <= 2.0f)) {
    return invalidArgument("frequency_penalty must be between -2 and 2, got " +
                           formatNumber(params.frequency_penalty));
  }
  if (!(params.presence_penalty >= -2.0f && params.presence_penalty <= 2.0f)) {
    return invalidArgument("presence_penalty must be between -2 and 2, got " +
                           formatNumber(params.presence_penalty));
  }
  if (!(params.repetition_penalty > 0.0f) || std::isinf(params.repetition_penalty)) {
    return invalidArgument("repetition_penalty must be greater than 0 and finite, got " +
                           formatNumber(params.repetition_penalty));
  }
  if (params.logprobs && (*params.logprobs < 0 || *params.logprobs > kMaxLogprobs)) {
    return invalidArgument("logprobs must be between 0 and " + std::to_string(kMaxLogprobs) +
                           ", got " + std::to_string(*params.logprobs));
  }
  if (params.prompt_logprobs &&
      (*params.prompt_logprobs < 0 || *params.prompt_logprobs > kMaxLogprobs)) {
    return invalidArgument("prompt_logprobs must be between 0 and " + std::to_string(kMaxLogprobs) +
                           ", got " + std::to_string(*params.prompt_logprobs));
  }
  if (params.max_tokens < 1) {
    return invalidArgument("max_tokens must be at least 1, got " +
                           std::to_string(params.max_tokens));
  }
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens) {
    return invalidArgument("min_tokens must be between 0 and max_tokens (" +
                           std::to_string(params.max_tokens) + "), got " +
                           std::to_string(params.min_tokens));
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return invalidArgument("logit_bias keys must be token ids in [0, " +
                             std::to_string(vocab_size) + "), got " + std::to_string(id));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return invalidArgument("logit_bias values must be between -100 and 100, got " +
                             formatNumber(bias) + " for token " + std::to_string(id));
    }
  }
  if (Status status = checkIds(params.allowed_token_ids, vocab_size, "allowed_token_ids must be");
      !status.isOk()) {
    return status;
  }
  for (const std::vector<TokenId>& word : params.bad_words_ids) {
    if (word.empty()) return invalidArgument("bad_words must not hold an empty word");
    if (Status status = checkIds(word, vocab_size, "bad_words must be made of"); !status.isOk()) {
      return status;
    }
  }
  if (Status status = checkIds(params.stop_token_ids, vocab_size, "stop_token_ids must be");
      !status.isOk()) {
    return status;
  }
  // Written as a subtraction so a huge max_tokens cannot overflow the sum.
  if (prompt_len > max_model_len || params.max_tokens > max_model_len - prompt_len) {
    return invalidArgument("prompt (" + std::to_string(prompt_len) + " tokens) plus max_tokens (" +
                           std::to_string(params.max_tokens) +
                           ") exceeds the maximum context length of " +
                           std::to_string(max_model_len) + " tokens");
  }
  return Status::ok();
}

}  // namespace tandem::protocol
