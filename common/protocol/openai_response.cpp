// Building OpenAI responses, stream chunks and logprobs from engine outputs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/protocol/openai_protocol.h"
#include "common/tokenizer_utf8.h"

namespace tandem::server {
namespace {

using json = ResponseJson;

// vLLM reports -inf logprobs as this, since JSON has no infinity.
constexpr double kMinReportedLogprob = -9999.0;

// Length of the valid UTF-8 character at text[pos], or 0 when the bytes there
// do not form one (stray continuation byte, overlong form, surrogate,
// truncated sequence).
size_t validUtf8Length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) -> unsigned { return static_cast<unsigned char>(text[i]); };
  const unsigned lead = byte(pos);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned low = 0x80;
  unsigned high = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (pos + length > text.size()) return 0;
  if (byte(pos + 1) < low || byte(pos + 1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 0;
  }
  return length;
}

bool isContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

double reportedLogprob(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : kMinReportedLogprob;
}

json finishReasonJson(protocol::FinishReason reason) {
  if (reason == protocol::FinishReason::kNone) return nullptr;
  return protocol::finishReasonName(reason);
}

// vLLM's stop_reason: the stop string or stop_token_ids id that ended the
// answer, else null (an end-of-sequence token, a length limit).
json stopReasonJson(const protocol::RequestOutput& output) {
  if (output.stop_string) return *output.stop_string;
  if (output.stop_token) return *output.stop_token;
  return nullptr;
}

json byteList(const std::string& bytes) {
  json list = json::array();
  for (char c : bytes) list.push_back(static_cast<unsigned char>(c));
  return list;
}

// A token as logprobs name it: its text (logprobTokenText), or
// "token_id:<id>" under return_tokens_as_token_ids (vLLM's form).
std::string tokenName(const ResponseMeta& meta, const Tokenizer& tokenizer, TokenId id) {
  if (meta.return_tokens_as_token_ids) return "token_id:" + std::to_string(id);
  return logprobTokenText(tokenizer, id);
}

// Chat form: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json chatLogprobs(const ResponseMeta& meta, const std::vector<protocol::GeneratedToken>& tokens,
                  const Tokenizer& tokenizer) {
  json content = json::array();
  const auto num_top = static_cast<size_t>(meta.logprobs.value_or(0));
  for (const protocol::GeneratedToken& token : tokens) {
    json top = json::array();
    for (size_t i = 0; i < token.top.size() && i < num_top; ++i) {
      top.push_back({{"token", tokenName(meta, tokenizer, token.top[i].token)},
                     {"logprob", reportedLogprob(token.top[i].logprob)},
                     {"bytes", byteList(tokenizer.tokenBytes(token.top[i].token))}});
    }
    content.push_back({{"token", tokenName(meta, tokenizer, token.token)},
                       {"logprob", reportedLogprob(token.logprob)},
                       {"bytes", byteList(tokenizer.tokenBytes(token.token))},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

// The text offset of `token`, counted past it: its bytes (none for a
// special token under skip_special_tokens). One count for every stream: a
// resumed one counts its resumed tokens the same way.
int64_t advanceTextOffset(const ResponseMeta& meta, const Tokenizer& tokenizer, TokenId token,
                          TextOffsets& text_chars) {
  const std::string bytes = meta.skip_special_tokens && tokenizer.isSpecial(token)
                                ? std::string()
                                : tokenizer.tokenBytes(token);
  return text_chars.advance(bytes);
}

}  // namespace

int64_t TextOffsets::advance(std::string_view bytes) {
  int64_t offset = chars;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (need > 0) {
      if (b >= lower && b <= upper) {
        lower = 0x80;
        upper = 0xBF;
        if (--need == 0) ++chars;
        continue;
      }
      // The character broke off: one U+FFFD for it; b starts anew.
      ++chars;
      need = 0;
      lower = 0x80;
      upper = 0xBF;
      if (i == 0) offset = chars;
    }
    if (b < 0x80) {
      ++chars;
    } else if (const size_t length = tokenizer_internal::utf8LeadInfo(b, lower, upper)) {
      need = static_cast<int>(length) - 1;
    } else {
      ++chars;  // a byte no character starts with: U+FFFD
    }
  }
  return offset;
}

namespace {

// Completions form: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
// top_logprobs maps token text to logprob and, like vLLM, always holds the
// sampled token. text_offset counts characters of the generated text, a token
// that starts inside a character taking that character's offset; special
// tokens count as empty when skip_special_tokens. `text_chars` carries the
// count across stream chunks.
json completionLogprobs(const ResponseMeta& meta,
                        const std::vector<protocol::GeneratedToken>& tokens,
                        const Tokenizer& tokenizer, TextOffsets& text_chars) {
  json logprobs = {{"tokens", json::array()},
                   {"token_logprobs", json::array()},
                   {"top_logprobs", json::array()},
                   {"text_offset", json::array()}};
  const auto num_top = static_cast<size_t>(meta.logprobs.value_or(0));
  for (const protocol::GeneratedToken& token : tokens) {
    const std::string text = tokenName(meta, tokenizer, token.token);
    json top = json::object();
    for (size_t i = 0; i < token.top.size() && i < num_top; ++i) {
      const std::string key = tokenName(meta, tokenizer, token.top[i].token);
      if (!top.contains(key)) top[key] = reportedLogprob(token.top[i].logprob);
    }
    if (!top.contains(text)) top[text] = reportedLogprob(token.logprob);
    logprobs["tokens"].push_back(text);
    logprobs["token_logprobs"].push_back(reportedLogprob(token.logprob));
    logprobs["top_logprobs"].push_back(std::move(top));

    logprobs["text_offset"].push_back(advanceTextOffset(meta, tokenizer, token.token, text_chars));
  }
  return logprobs;
}

// Echo with logprobs: the completions form of the prompt's tokens, the
// first one's logprob and alternatives null (nothing predicts it). Offsets
// point into meta.echo_text: a token whose bytes are next in it there, any
// other (a special token the tokenizer added) at the current position;
// `text_chars` ends at the echo text's length, where the output's offsets
// go on.
json echoLogprobs(const ResponseMeta& meta, const std::vector<protocol::GeneratedToken>& prompt,
                  const Tokenizer& tokenizer, TextOffsets& text_chars) {
  TextOffsets unused;
  json logprobs = completionLogprobs(meta, prompt, tokenizer, unused);
  if (!prompt.empty()) {
    logprobs["token_logprobs"][0] = nullptr;
    logprobs["top_logprobs"][0] = nullptr;
  }
  const std::string& echo = meta.echo_text;
  size_t byte = 0;
  int64_t chars = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string bytes = tokenizer.tokenBytes(prompt[i].token);
    const bool starts_mid_character = !bytes.empty() && isContinuationByte(bytes[0]);
    logprobs["text_offset"][i] = starts_mid_character && chars > 0 ? chars - 1 : chars;
    if (!bytes.empty() && echo.compare(byte, bytes.size(), bytes) == 0) {
      for (char c : bytes) chars += isContinuationByte(c) ? 0 : 1;
      byte += bytes.size();
    }
  }
  for (; byte < echo.size(); ++byte) chars += isContinuationByte(echo[byte]) ? 0 : 1;
  text_chars = TextOffsets{};
  text_chars.chars = chars;
  return logprobs;
}

// `tail`'s lists appended to `head`'s (completions form).
void appendLogprobs(json& head, json tail) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (json& item : tail[key]) head[key].push_back(std::move(item));
  }
}

// vLLM's prompt_logprobs: null for the first prompt token, then for each
// token {"<id>": {"logprob", "rank", "decoded_token"}} holding the token
// itself and its `num_top` best alternatives.
json promptLogprobsJson(const std::vector<protocol::GeneratedToken>& prompt, int32_t num_top,
                        const Tokenizer& tokenizer) {
  json list = json::array();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i == 0) {
      list.push_back(nullptr);
      continue;
    }
    const protocol::GeneratedToken& token = prompt[i];
    json entry = json::object();
    auto add = [&](TokenId id, float logprob, int64_t rank) {
      const std::string key = std::to_string(id);
      if (entry.contains(key)) return;
      entry[key] = {{"logprob", reportedLogprob(logprob)},
                    {"rank", rank},
                    {"decoded_token", logprobTokenText(tokenizer, id)}};
    };
    add(token.token, token.logprob, token.rank);
    for (size_t k = 0; k < token.top.size() && k < static_cast<size_t>(num_top); ++k) {
      add(token.top[k].token, token.top[k].logprob, static_cast<int64_t>(k) + 1);
    }
    list.push_back(std::move(entry));
  }
  return list;
}

json responseHead(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

}  // namespace

ResponseMeta makeResponseMeta(const ParsedRequest& request, std::string_view request_id,
                              int64_t created) {
  ResponseMeta meta;
  meta.id = (request.chat ? "chatcmpl-" : "cmpl-") + std::string(request_id);
  meta.created = created;
  meta.model = request.model;
  meta.chat = request.chat;
  meta.logprobs = request.request.sampling.logprobs;
  meta.include_usage = request.include_usage;
  meta.continuous_usage = request.continuous_usage;
  meta.return_token_ids = request.return_token_ids;
  meta.return_tokens_as_token_ids = request.return_tokens_as_token_ids;
  meta.skip_special_tokens = request.request.sampling.skip_special_tokens;
  meta.kv_transfer_params = request.kv_transfer_params;
  meta.chat_output = request.chat_output;
  meta.echo_text = request.echo_text;
  meta.resumed_echo_chars = request.resumed_echo_chars;
  meta.echo_logprobs = request.echo && request.request.sampling.logprobs.has_value() &&
                       request.request.resume_output.empty();
  meta.prompt_logprobs = request.prompt_logprobs;
  meta.resumed_tokens = request.request.resume_output;
  return meta;
}

void appendOutput(protocol::RequestOutput& total, const protocol::RequestOutput& step) {
  if (total.request_id.empty()) total.request_id = step.request_id;
  total.tokens.insert(total.tokens.end(), step.tokens.begin(), step.tokens.end());
  if (total.prompt_logprobs.empty()) total.prompt_logprobs = step.prompt_logprobs;
  total.text += step.text;
  total.finish_reason = step.finish_reason;
  total.stop_string = step.stop_string;
  total.stop_token = step.stop_token;
  total.error = step.error;
  total.invalid_request = step.invalid_request;
  total.error_param = step.error_param;
  total.num_prompt_tokens = std::max(total.num_prompt_tokens, step.num_prompt_tokens);
  total.num_cached_tokens = std::max(total.num_cached_tokens, step.num_cached_tokens);
  total.num_generated_tokens = std::max(total.num_generated_tokens, step.num_generated_tokens);
  if (!step.kv_transfer_params.is_null()) total.kv_transfer_params = step.kv_transfer_params;
  total.timings = step.timings;
}

json usageJson(const protocol::RequestOutput& output) {
  return {{"prompt_tokens", output.num_prompt_tokens},
          {"completion_tokens", output.num_generated_tokens},
          {"total_tokens", output.num_prompt_tokens + output.num_generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", output.num_cached_tokens}}}};
}

namespace {

// The token ids of `tokens`, for return_token_ids.
json tokenIdsJson(const std::vector<protocol::GeneratedToken>& tokens) {
  json ids = json::array();
  for (const auto& token : tokens) ids.push_back(token.token);
  return ids;
}

}  // namespace

json completionResponse(const ResponseMeta& meta, const protocol::RequestOutput& total,
                        const Tokenizer& tokenizer) {
  json response = responseHead(meta, "text_completion");
  TextOffsets text_chars;
  json logprobs = nullptr;
  if (meta.logprobs) {
    logprobs = meta.echo_logprobs ? echoLogprobs(meta, total.prompt_logprobs, tokenizer, text_chars)
                                  : completionLogprobs(meta, {}, tokenizer, text_chars);
    appendLogprobs(logprobs, completionLogprobs(meta, total.tokens, tokenizer, text_chars));
  }
  json choice = {{"index", 0},
                 {"text", meta.echo_text + total.text},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finishReasonJson(total.finish_reason)},
                 {"stop_reason", stopReasonJson(total)}};
  if (meta.return_token_ids) choice["token_ids"] = tokenIdsJson(total.tokens);
  if (meta.prompt_logprobs) {
    choice["prompt_logprobs"] =
        promptLogprobsJson(total.prompt_logprobs, *meta.prompt_logprobs, tokenizer);
  }
  response["choices"] = json::array({std::move(choice)});
  response["usage"] = usageJson(total);
  if (!meta.kv_transfer_params.is_null()) response["kv_transfer_params"] = meta.kv_transfer_params;
  return response;
}

json chatCompletionResponse(const ResponseMeta& meta, const protocol::RequestOutput& total,
                            const Tokenizer& tokenizer) {
  json response = responseHead(meta, "chat.completion");
  json message = {{"role", "assistant"}, {"content", total.text}};
  json finish_reason = finishReasonJson(total.finish_reason);
  if (meta.chat_output) {
    const protocol::ChatOutput output = protocol::parseChatOutput(*meta.chat_output, total.text);
    message = protocol::chatOutputMessageJson(output);
    if (finish_reason.is_string()) {
      finish_reason =
          protocol::chatFinishReason(!output.tool_calls.empty(), finish_reason.get<std::string>());
    }
  }
  json choice = {
      {"index", 0},
      {"message", std::move(message)},
      {"logprobs", meta.logprobs ? chatLogprobs(meta, total.tokens, tokenizer) : json(nullptr)},
      {"finish_reason", std::move(finish_reason)},
      {"stop_reason", stopReasonJson(total)}};
  if (meta.return_token_ids) choice["token_ids"] = tokenIdsJson(total.tokens);
  response["choices"] = json::array({std::move(choice)});
  response["usage"] = usageJson(total);
  if (meta.prompt_logprobs) {
    response["prompt_logprobs"] =
        promptLogprobsJson(total.prompt_logprobs, *meta.prompt_logprobs, tokenizer);
  }
  if (!meta.kv_transfer_params.is_null()) response["kv_transfer_params"] = meta.kv_transfer_params;
  return response;
}

ApiError engineError(const protocol::RequestOutput& output) {
  if (output.invalid_request) {
    return invalidRequest(
        output.error_param.empty() ? output.error : output.error_param + ": " + output.error,
        output.error_param);
  }
  return serverError(output.error.empty() ? "the engine failed while generating" : output.error);
}

std::optional<json> completionChunk(const ResponseMeta& meta, const protocol::RequestOutput& step,
                                    const Tokenizer& tokenizer, StreamState& state) {
  const bool has_logprobs = meta.logprobs.has_value() && !step.tokens.empty();
  const bool has_ids = meta.return_token_ids && !step.tokens.empty();
  // A resumed stream's offsets continue after its resumed tokens, counted
  // as the uninterrupted stream counted them (not the text already sent,
  // which lacks what was held back: part of a character, a stop string's
  // start).
  if (!state.resumed_counted) {
    state.resumed_counted = true;
    state.text_chars.chars += meta.resumed_echo_chars;
    for (TokenId token : meta.resumed_tokens) {
      (void)advanceTextOffset(meta, tokenizer, token, state.text_chars);
    }
  }
  const bool echo = !state.echoed && !meta.echo_text.empty();
  if (step.text.empty() && !step.finished() && !has_logprobs && !has_ids && !echo) {
    return std::nullopt;
  }
  state.echoed = true;
  json logprobs = nullptr;
  if (has_logprobs || (echo && meta.echo_logprobs)) {
    logprobs = echo && meta.echo_logprobs
                   ? echoLogprobs(meta, step.prompt_logprobs, tokenizer, state.text_chars)
                   : completionLogprobs(meta, {}, tokenizer, state.text_chars);
    appendLogprobs(logprobs, completionLogprobs(meta, step.tokens, tokenizer, state.text_chars));
  }
  json chunk = responseHead(meta, "text_completion");
  json choice = {{"index", 0},
                 {"text", echo ? meta.echo_text + step.text : step.text},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finishReasonJson(step.finish_reason)},
                 {"stop_reason", stopReasonJson(step)}};
  if (meta.return_token_ids) choice["token_ids"] = tokenIdsJson(step.tokens);
  chunk["choices"] = json::array({std::move(choice)});
  if (meta.include_usage) chunk["usage"] = meta.continuous_usage ? usageJson(step) : json(nullptr);
  return chunk;
}

std::optional<json> chatCompletionChunk(const ResponseMeta& meta,
                                        const protocol::RequestOutput& step,
                                        const Tokenizer& tokenizer, StreamState& state) {
  const bool has_logprobs = meta.logprobs.has_value() && !step.tokens.empty();
  const bool has_ids = meta.return_token_ids && !step.tokens.empty();
  json finish_reason = finishReasonJson(step.finish_reason);
  json delta = json::object();
  if (meta.chat_output) {
    // The parser holds back text that may still turn out to be a tag or a
    // tool call; what it releases becomes this chunk's delta.
    if (state.chat_output == nullptr) {
      state.chat_output = std::make_shared<protocol::ChatOutputStream>(*meta.chat_output);
    }
    // A resumed stream's parsers first take what was already sent.
    if (!step.resumed_text.empty()) state.chat_output->feed(step.resumed_text);
    protocol::ChatStreamDelta parsed = state.chat_output->feed(step.text);
    if (step.finished()) {
      protocol::ChatStreamDelta rest = state.chat_output->finish();
      parsed.reasoning_content += rest.reasoning_content;
      parsed.content += rest.content;
      for (protocol::ToolCallDelta& call : rest.tool_calls) {
        parsed.tool_calls.push_back(std::move(call));
      }
      if (finish_reason.is_string()) {
        finish_reason = protocol::chatFinishReason(state.chat_output->toolsCalled(),
                                                   finish_reason.get<std::string>());
      }
    }
    delta = protocol::chatStreamDeltaJson(parsed);
    if (state.role_sent && parsed.empty() && !step.finished() && !has_logprobs && !has_ids) {
      return std::nullopt;
    }
    if (!state.role_sent) {
      json first = {{"role", "assistant"}};
      if (!delta.contains("content")) first["content"] = "";
      first.update(delta);
      delta = std::move(first);
      state.role_sent = true;
    }
  } else {
    if (state.role_sent && step.text.empty() && !step.finished() && !has_logprobs && !has_ids) {
      return std::nullopt;
    }
    if (!state.role_sent) {
      delta["role"] = "assistant";
      delta["content"] = step.text;
      state.role_sent = true;
    } else if (!step.text.empty()) {
      delta["content"] = step.text;
    }
  }
  json chunk = responseHead(meta, "chat.completion.chunk");
  json choice = {
      {"index", 0},
      {"delta", std::move(delta)},
      {"logprobs", has_logprobs ? chatLogprobs(meta, step.tokens, tokenizer) : json(nullptr)},
      {"finish_reason", std::move(finish_reason)},
      {"stop_reason", stopReasonJson(step)}};
  if (meta.return_token_ids) choice["token_ids"] = tokenIdsJson(step.tokens);
  chunk["choices"] = json::array({std::move(choice)});
  if (meta.include_usage) chunk["usage"] = meta.continuous_usage ? usageJson(step) : json(nullptr);
  return chunk;
}

std::optional<json> streamChunk(const ResponseMeta& meta, const protocol::RequestOutput& step,
                                const Tokenizer& tokenizer, StreamState& state) {
  return meta.chat ? chatCompletionChunk(meta, step, tokenizer, state)
                   : completionChunk(meta, step, tokenizer, state);
}

json usageChunk(const ResponseMeta& meta, const protocol::RequestOutput& final_output) {
  json chunk = responseHead(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = usageJson(final_output);
  return chunk;
}

std::string sseEvent(const json& payload) { return "data: " + compactDump(payload) + "\n\n"; }

std::string logprobTokenText(const Tokenizer& tokenizer, TokenId id) {
  const std::string bytes = tokenizer.tokenBytes(id);
  std::string text;
  bool escaped = false;
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t length = validUtf8Length(bytes, pos);
    if (length > 0) {
      text.append(bytes, pos, length);
      pos += length;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(bytes[pos]));
    text += hex;
    escaped = true;
    ++pos;
  }
  return escaped ? "bytes:" + text : text;
}

}  // namespace tandem::server
