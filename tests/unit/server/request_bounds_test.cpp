// What a request body may hold: nesting past the JSON bound (in the body or in
// JSON a string field carries) and more values than the bound are 400s naming
// the field and the bound; a text too long for max_model_len is refused
// before it is tokenized; /detokenize takes at most max_model_len ids.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/json_parse.h"
#include "common/protocol/openai_protocol.h"
#include "common/tokenizer.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::server {
namespace {

using nlohmann::json;
using ::tandem::testing::nestedJsonObject;
using ::tandem::testing::TempDir;

constexpr int64_t kMaxModelLen = 64;
constexpr int kCrashDepth = 15000;  // deep enough to overflow a recursive walk's stack

class RequestBoundsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("request-bounds-test");
    tools::writeTestModel(tools::TestModelOptions{}, dir_->path());
    tokenizer_ = Tokenizer::fromDirectory(dir_->path()).release();
    auto chat_template = ChatTemplate::load(*tokenizer_);
    ASSERT_TRUE(chat_template.isOk()) << chat_template.status().toString();
    limits_ = new ServerLimits;
    limits_->chat_template = *chat_template;
    limits_->served_model_name = "tiny-model";
    limits_->max_model_len = kMaxModelLen;
    limits_->vocab_size = tokenizer_->vocabSize();
  }
  static void TearDownTestSuite() {
    delete limits_;
    delete tokenizer_;
    delete dir_;
  }

  static const Tokenizer& tokenizer() { return *tokenizer_; }
  static const ServerLimits& limits() { return *limits_; }

  static TempDir* dir_;
  static Tokenizer* tokenizer_;
  static ServerLimits* limits_;
};

TempDir* RequestBoundsTest::dir_ = nullptr;
Tokenizer* RequestBoundsTest::tokenizer_ = nullptr;
ServerLimits* RequestBoundsTest::limits_ = nullptr;

std::string chatBody(const std::string& extra) {
  return R"({"model":"tiny-model","messages":[{"role":"user","content":"Hi"}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}

void expectNestingError(const ApiError& error, const std::string& param_prefix) {
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_TRUE(error.param.starts_with(param_prefix)) << error.param;
  EXPECT_NE(error.message.find("deeper than 128 levels"), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("at most 128 levels are accepted"), std::string::npos)
      << error.message;
}

TEST_F(RequestBoundsTest, DeepChatTemplateKwargsAreRefused) {
  const std::string body =
      chatBody(R"("chat_template_kwargs":{"x":)" + nestedJsonObject(kCrashDepth) + "}");
  auto parsed = parseChatCompletionRequest(body, limits(), tokenizer());
  ASSERT_FALSE(parsed.isOk());
  expectNestingError(parsed.error(), "chat_template_kwargs.x.a.a");
  EXPECT_NE(parsed.error().message.find("(at chat_template_kwargs.x.a.a.a.a…)"), std::string::npos)
      << parsed.error().message;
}

TEST_F(RequestBoundsTest, DeepToolParametersAreRefused) {
  const std::string body =
      chatBody(R"("tools":[{"type":"function","function":{"name":"f","parameters":)" +
               nestedJsonObject(kCrashDepth) + "}}]");
  auto parsed = parseChatCompletionRequest(body, limits(), tokenizer());
  ASSERT_FALSE(parsed.isOk());
  expectNestingError(parsed.error(), "tools[0].function");
}

TEST_F(RequestBoundsTest, DeepJsonInsideToolCallArgumentsIsRefused) {
  // Shallow as a body; deep once the arguments string is decoded.
  const json messages = json::array(
      {{{"role", "user"}, {"content", "Hi"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls",
         json::array(
             {{{"id", "c1"},
               {"type", "function"},
               {"function", {{"name", "f"}, {"arguments", nestedJsonObject(kCrashDepth)}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}});
  const std::string body = json{{"model", "tiny-model"}, {"messages", messages}}.dump();
  auto parsed = parseChatCompletionRequest(body, limits(), tokenizer());
  ASSERT_FALSE(parsed.isOk());
  expectNestingError(parsed.error(), "messages[1].tool_calls[0].function.arguments.a.a");
  EXPECT_NE(parsed.error().message.find("messages[1].tool_calls[0].function.arguments nests"),
            std::string::npos)
      << parsed.error().message;
}

TEST_F(RequestBoundsTest, DeepMessagesToTokenizeAreRefused) {
  const std::string body = R"({"messages":[{"role":"user","content":"Hi","extra":)" +
                           nestedJsonObject(kCrashDepth) + "}]}";
  auto result = tokenizeResponse(body, limits(), tokenizer());
  ASSERT_FALSE(result.isOk());
  expectNestingError(result.error(), "messages[0].extra.a");
}

TEST_F(RequestBoundsTest, NestingWithinTheBoundRendersAndIsPassedOn) {
  // 120 levels in chat_template_kwargs (plus the body's own two): accepted,
  // and the template sees them.
  const std::string body =
      chatBody(R"("chat_template_kwargs":{"x":)" + nestedJsonObject(120) + "}");
  auto parsed = parseChatCompletionRequest(body, limits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_FALSE(parsed.value().request.prompt.empty());
}

TEST_F(RequestBoundsTest, TooManyValuesAreRefusedBeforeParsing) {
  std::string ids = "[";
  const size_t count = kMaxRequestJsonValues + 2;
  ids.reserve(count * 2);
  for (size_t i = 0; i < count; ++i) ids += i + 1 < count ? "1," : "1]";
  auto parsed = parseCompletionRequest(R"({"model":"tiny-model","prompt":)" + ids + "}", limits(),
                                       tokenizer());
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.error().status, 400);
  EXPECT_EQ(parsed.error().message,
            "the request body holds more than 1048576 JSON values (array elements and object "
            "members); at most 1048576 are accepted");
}

TEST_F(RequestBoundsTest, APromptThatCannotFitIsRefusedWithoutTokenizing) {
  const std::optional<int64_t> per_token = tokenizer().maxTextBytesPerToken();
  ASSERT_TRUE(per_token.has_value());
  const std::string prompt(static_cast<size_t>(*per_token * kMaxModelLen), 'x');
  const std::string body = json{{"model", "tiny-model"}, {"prompt", prompt}}.dump();
  auto parsed = parseCompletionRequest(body, limits(), tokenizer());
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.error().param, "prompt");
  EXPECT_EQ(parsed.error().message,
            "prompt is " + std::to_string(prompt.size()) + " bytes, at least " +
                std::to_string(kMaxModelLen) + " tokens (a token of this model is " +
                std::to_string(*per_token) + " bytes of text at most), but max_model_len is " +
                std::to_string(kMaxModelLen) + "; it was refused without tokenizing it");

  // The same text through /tokenize and as a chat message.
  auto tokenized = tokenizeResponse(json{{"prompt", prompt}}.dump(), limits(), tokenizer());
  ASSERT_FALSE(tokenized.isOk());
  EXPECT_EQ(tokenized.error().param, "prompt");
  const std::string chat =
      json{{"model", "tiny-model"},
           {"messages", json::array({{{"role", "user"}, {"content", prompt}}})}}
          .dump();
  auto rendered = parseChatCompletionRequest(chat, limits(), tokenizer());
  ASSERT_FALSE(rendered.isOk());
  EXPECT_EQ(rendered.error().param, "messages");
  EXPECT_NE(rendered.error().message.find("the rendered chat is"), std::string::npos);
}

// With truncate_prompt_tokens the same text is tokenized and cut (vLLM's):
// the prompt is its last ids, not a 400, and the body passed on holds them.
// Up to 4 times what could fit: a text longer than that is refused before
// tokenizing, naming the bound.
TEST_F(RequestBoundsTest, APromptTooLongToFitIsCutWithTruncatePromptTokens) {
  const std::optional<int64_t> per_token = tokenizer().maxTextBytesPerToken();
  ASSERT_TRUE(per_token.has_value());
  const auto fits = static_cast<size_t>(*per_token * kMaxModelLen);
  std::string prompt;
  while (prompt.size() < 3 * fits) {
    prompt += "Hello world, and " + std::to_string(prompt.size()) + " more ";
  }
  prompt.resize(4 * fits);
  constexpr int64_t kKeep = 8;
  const std::vector<TokenId> expected = tokenizer().encodeLast(prompt, true, kKeep);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kKeep));
  auto parsed = parseCompletionRequest(
      json{{"model", "tiny-model"}, {"prompt", prompt}, {"truncate_prompt_tokens", kKeep}}.dump(),
      limits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_EQ(parsed.value().request.prompt, expected);
  // Forwarded (router to agents, prefill to decode) as the ids kept.
  EXPECT_EQ(parsed.value().body["prompt"], json(expected));
  EXPECT_FALSE(parsed.value().body.contains("truncate_prompt_tokens"));

  const std::string chat =
      json{{"model", "tiny-model"},
           {"truncate_prompt_tokens", kKeep},
           {"messages", json::array({{{"role", "user"}, {"content", prompt.substr(0, 3 * fits)}}})}}
          .dump();
  auto rendered = parseChatCompletionRequest(chat, limits(), tokenizer());
  ASSERT_TRUE(rendered.isOk()) << rendered.error().message;
  EXPECT_EQ(rendered.value().request.prompt.size(), static_cast<size_t>(kKeep));

  const std::string longer = prompt + "x";
  auto refused = parseCompletionRequest(
      json{{"model", "tiny-model"}, {"prompt", longer}, {"truncate_prompt_tokens", kKeep}}.dump(),
      limits(), tokenizer());
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "prompt");
  EXPECT_EQ(refused.error().message,
            "prompt is " + std::to_string(longer.size()) +
                " bytes; with truncate_prompt_tokens at most " + std::to_string(4 * fits) +
                " are tokenized (4 times max_model_len " + std::to_string(kMaxModelLen) +
                " tokens of " + std::to_string(*per_token) +
                " bytes, the most a token of this model stands for)");
}

TEST_F(RequestBoundsTest, DetokenizeTakesAtMostMaxModelLenIds) {
  json ids = json::array();
  for (int64_t i = 0; i < kMaxModelLen; ++i) ids.push_back(1);
  EXPECT_TRUE(detokenizeResponse(json{{"tokens", ids}}.dump(), limits(), tokenizer()).isOk());
  ids.push_back(1);
  auto refused = detokenizeResponse(json{{"tokens", ids}}.dump(), limits(), tokenizer());
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "tokens");
  EXPECT_EQ(refused.error().message, "tokens must hold at most 64 ids (max_model_len), got 65");
}

}  // namespace
}  // namespace tandem::server
