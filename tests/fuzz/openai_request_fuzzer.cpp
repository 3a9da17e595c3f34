// Fuzzes the OpenAI-compatible request bodies: each input is given to
// /v1/completions, /v1/chat/completions, /tokenize and /detokenize parsing,
// with the tokenizer and ChatML template of a generated test model. A body is
// either accepted or refused with a 4xx (or 501 for what is not implemented)
// naming the problem; a 500 means an exception escaped the parser (a bug). An accepted request has
// a prompt that leaves room for max_tokens within max_model_len and only token ids of the
// vocabulary, and every body built from it serializes without throwing.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string_view>
#include <system_error>

#include "common/protocol/openai_protocol.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "tests/fuzz/fuzz_test_model.h"

namespace {

using tandem::server::ApiError;
using tandem::server::ParsedRequest;
using tandem::server::Result;

const tandem::Tokenizer* g_tokenizer = nullptr;
tandem::server::ServerLimits g_limits;

void checkError(const ApiError& error) {
  if (error.status < 400 || error.status == 500 || error.message.empty()) {
    std::fprintf(stderr, "request refused with %d: %s\n", error.status, error.message.c_str());
    std::abort();
  }
  tandem::server::compactDump(tandem::server::errorBody(error));
}

void checkParsed(const Result<ParsedRequest>& result) {
  if (!result.isOk()) return checkError(result.error());
  const ParsedRequest& parsed = result.value();
  const auto& request = parsed.request;
  const auto prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len == 0 || request.sampling.max_tokens < 1 ||
      prompt_len + request.sampling.max_tokens > g_limits.max_model_len) {
    std::abort();
  }
  for (tandem::TokenId id : request.prompt) {
    if (id < 0 || id >= g_limits.vocab_size) std::abort();
  }
  const auto meta = tandem::server::makeResponseMeta(parsed, "fuzz", 0);
  tandem::server::sseEvent(meta.kv_transfer_params);
  tandem::server::compactDump(request.kv_transfer_params);
}

void checkJson(const Result<nlohmann::json>& result) {
  if (!result.isOk()) return checkError(result.error());
  tandem::server::compactDump(result.value());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  g_tokenizer = tandem::fuzz::loadTinyModel(g_limits);
  g_limits.max_logprobs = 5;
  g_limits.chat_output.reasoning_parser = tandem::protocol::ReasoningParserKind::kDeepSeekR1;
  g_limits.chat_output.tool_call_parser = tandem::protocol::ToolCallParserKind::kHermes;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  checkParsed(tandem::server::parseCompletionRequest(body, g_limits, *g_tokenizer));
  checkParsed(tandem::server::parseChatCompletionRequest(body, g_limits, *g_tokenizer));
  checkJson(tandem::server::tokenizeResponse(body, g_limits, *g_tokenizer));
  checkJson(tandem::server::detokenizeResponse(body, g_limits, *g_tokenizer));
  return 0;
}
