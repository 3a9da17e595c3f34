// The OpenAI protocol layer: every refused input gives the status, type,
// param and message expected; every accepted form parses to the expected
// engine::Request; response bodies, stream chunks and SSE framing have the
// expected shape, field by field.
#include "common/protocol/openai_protocol.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "common/jinja/template.h"
#include "common/structured/matcher.h"
#include "common/tokenizer.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using protocol::GenerationConfig;
using protocol::GenerationDefaults;
using protocol::SamplingParams;
using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;

constexpr int64_t kMaxModelLen = 64;
constexpr int64_t kVocabSize = 512;  // the tiny preset's

// The test model's ChatML template, parsed once (set up by ProtocolTest).
std::shared_ptr<const ChatTemplate> g_chat_template;

ServerLimits testLimits() {
  ServerLimits limits;
  limits.chat_template = g_chat_template;
  limits.served_model_name = "tiny-model";
  limits.max_model_len = kMaxModelLen;
  limits.vocab_size = kVocabSize;
  limits.max_logprobs = 5;
  return limits;
}

// A generated test model's tokenizer (byte-level BPE, ChatML template), and a
// copy of it whose tokenizer_config.json carries another chat template.
class ProtocolTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("openai-protocol-test");
    tools::writeTestModel(tools::TestModelOptions{}, dir_->path() / "chatml");
    tokenizer_ = Tokenizer::fromDirectory(dir_->path() / "chatml").release();
    auto chat_template = ChatTemplate::load(*tokenizer_);
    ASSERT_TRUE(chat_template.isOk()) << chat_template.status().toString();
    g_chat_template = *chat_template;

    const fs::path other = dir_->path() / "llama3-template";
    fs::create_directories(other);
    fs::copy_file(dir_->path() / "chatml" / "tokenizer.json", other / "tokenizer.json");
    json config = json::parse(readFile(dir_->path() / "chatml" / "tokenizer_config.json"));
    config["chat_template"] =
        "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}";
    std::ofstream(other / "tokenizer_config.json") << config.dump(2);
    other_template_tokenizer_ = Tokenizer::fromDirectory(other).release();
  }
  static void TearDownTestSuite() {
    g_chat_template.reset();
    delete tokenizer_;
    delete other_template_tokenizer_;
    delete dir_;
  }

  static const Tokenizer& tokenizer() { return *tokenizer_; }

  // The tool-call grammar a chat body is constrained to with `parser` as
  // the server's tool-call parser; nullopt (a failure reported) when it is
  // refused or not constrained to tool calls.
  static std::optional<structured::Grammar> toolCallGrammar(const std::string& body,
                                                            protocol::ToolCallParserKind parser) {
    ServerLimits limits = testLimits();
    limits.chat_output.tool_call_parser = parser;
    auto parsed = parseChatCompletionRequest(body, limits, tokenizer());
    if (!parsed.isOk()) {
      ADD_FAILURE() << parsed.error().message;
      return std::nullopt;
    }
    const auto& constraint = parsed.value().request.structured_output;
    if (!constraint || constraint->kind != structured::ConstraintKind::kToolCalls) {
      ADD_FAILURE() << "not constrained to tool calls: " << body;
      return std::nullopt;
    }
    StatusOr<structured::Grammar> grammar = structured::compileConstraint(*constraint);
    if (!grammar.isOk()) {
      ADD_FAILURE() << grammar.status().message();
      return std::nullopt;
    }
    return std::move(grammar).value();
  }

  static TempDir* dir_;
  static Tokenizer* tokenizer_;
  static Tokenizer* other_template_tokenizer_;
};

TempDir* ProtocolTest::dir_ = nullptr;
Tokenizer* ProtocolTest::tokenizer_ = nullptr;
Tokenizer* ProtocolTest::other_template_tokenizer_ = nullptr;

// One refused input and everything its error must say.
struct BadCase {
  std::string body;
  int status;
  std::string type;
  std::string param;
  std::string message;
};

void expectError(const ApiError& error, const BadCase& expected) {
  EXPECT_EQ(error.status, expected.status);
  EXPECT_EQ(error.type, expected.type);
  EXPECT_EQ(error.param, expected.param);
  EXPECT_EQ(error.message, expected.message);
  // The body carries the same, with empty param / code as null.
  const json body = errorBody(error);
  ASSERT_TRUE(body.contains("error"));
  EXPECT_EQ(body["error"]["message"], expected.message);
  EXPECT_EQ(body["error"]["type"], expected.type);
  if (expected.param.empty()) {
    EXPECT_TRUE(body["error"]["param"].is_null());
  } else {
    EXPECT_EQ(body["error"]["param"], expected.param);
  }
}

template <typename T>
void expectRefused(const Result<T>& result, const BadCase& expected) {
  SCOPED_TRACE(expected.body);
  ASSERT_FALSE(result.isOk()) << "accepted: " << expected.body;
  expectError(result.error(), expected);
}

BadCase bad(std::string body, std::string param, std::string message) {
  return BadCase{std::move(body), 400, "invalid_request_error", std::move(param),
                 std::move(message)};
}

// A completion body: model and prompt plus `extra` fields (a JSON fragment).
std::string completion(const std::string& extra) {
  return R"({"model": "tiny-model", "prompt": "Hello world")" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

// A completion whose seed, `written`, is past the seeds' range; it is read
// as the double `read`.
BadCase seedOutOfRange(const std::string& written, const std::string& read) {
  return bad(completion("\"seed\": " + written), "seed",
             "seed must be a 64-bit integer, signed or not (-9223372036854775808 to "
             "18446744073709551615), got " +
                 read + ", outside that range");
}

std::string chat(const std::string& extra) {
  return R"({"model": "tiny-model", "messages": [{"role": "user", "content": "Hi"}])" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

std::string chatWith(const std::string& messages) {
  return R"({"model": "tiny-model", "messages": )" + messages + "}";
}

// ---------------------------------------------------------------------------
// Errors

TEST(ApiErrors, BodyShape) {
  ApiError error{404, "model \"x\" does not exist", "not_found_error", "model", "model_not_found"};
  EXPECT_EQ(errorBody(error), json::parse(R"({"error": {"message": "model \"x\" does not exist",
      "type": "not_found_error", "param": "model", "code": "model_not_found"}})"));
  EXPECT_EQ(errorBody(invalidRequest("bad")),
            json::parse(R"({"error": {"message": "bad", "type": "invalid_request_error",
      "param": null, "code": null}})"));
}

TEST(ApiErrors, FromStatusMapsCodes) {
  struct Mapping {
    StatusCode code;
    int status;
    const char* type;
  };
  const Mapping mappings[] = {
      {StatusCode::kInvalidArgument, 400, "invalid_request_error"},
      {StatusCode::kOutOfRange, 400, "invalid_request_error"},
      {StatusCode::kFailedPrecondition, 400, "invalid_request_error"},
      {StatusCode::kNotFound, 404, "not_found_error"},
      {StatusCode::kResourceExhausted, 429, "rate_limit_exceeded"},
      {StatusCode::kUnimplemented, 501, "not_implemented_error"},
      {StatusCode::kUnavailable, 503, "service_unavailable"},
      {StatusCode::kAborted, 503, "service_unavailable"},
      {StatusCode::kDeadlineExceeded, 504, "timeout_error"},
      {StatusCode::kDataLoss, 500, "server_error"},
      {StatusCode::kInternal, 500, "server_error"},
  };
  for (const Mapping& mapping : mappings) {
    SCOPED_TRACE(statusCodeName(mapping.code));
    const ApiError error = fromStatus(Status(mapping.code, "what went wrong"), "field");
    EXPECT_EQ(error.status, mapping.status);
    EXPECT_EQ(error.type, mapping.type);
    EXPECT_EQ(error.message, "what went wrong");
    EXPECT_EQ(error.param, "field");
  }
  const ApiError ok = fromStatus(Status::ok());
  EXPECT_EQ(ok.status, 500);
  EXPECT_EQ(ok.type, "server_error");
  EXPECT_TRUE(ok.param.empty());
}

TEST(ApiErrors, ClientErrorsTakeTheirParamFromTheFieldTheMessageNames) {
  struct Case {
    Status status;
    std::string param;
  };
  for (const Case& c : std::vector<Case>{
           {invalidArgument("kv_transfer_params.remote_block_ids[3] = 9 is outside the other "
                            "agent's 8 blocks"),
            "kv_transfer_params.remote_block_ids[3]"},
           {invalidArgument("kv_transfer_params.remote_block_ids[1] must be an integer, got "
                            "\"x\""),
            "kv_transfer_params.remote_block_ids[1]"},
           {invalidArgument("kv_transfer_params must be an object"), "kv_transfer_params"},
           {invalidArgument("kv_transfer_params.remote_slab: not a slab descriptor"),
            "kv_transfer_params.remote_slab"},
           {invalidArgument("kv_transfer_params: this agent's kv_role is kv_producer; it reads "
                            "no KV"),
            "kv_transfer_params"},
           {permissionDenied("kv_transfer_params.signature does not match: the other agent uses "
                             "a different KV secret"),
            "kv_transfer_params.signature"},
           {failedPrecondition("kv_transfer_params.compatibility: the other agent's KV layout "
                               "differs"),
            "kv_transfer_params.compatibility"},
           {notFound("kv_transfer_params.remote_engine_id names another agent, not this one"),
            "kv_transfer_params.remote_engine_id"},
           {outOfRange("max_tokens must be between 1 and 100, got 0"), "max_tokens"},
           // Prose, not a field: no param.
           {invalidArgument("the prompt is too long"), ""},
           {invalidArgument("request abc is already running"), ""},
           {invalidArgument("Bad thing: x"), ""},
           // Server-side errors never blame a request field.
           {internalError("kv_transfer_params.remote_slab: read failed"), ""},
           {unavailable("kv_transfer_params.remote_slab: peer gone"), ""},
       }) {
    const ApiError error = fromStatus(c.status);
    EXPECT_EQ(error.param, c.param) << c.status.message();
    EXPECT_EQ(error.message, c.status.message());
    EXPECT_EQ(errorBody(error)["error"]["param"], c.param.empty() ? json(nullptr) : json(c.param));
  }
  // A param the caller gives wins.
  EXPECT_EQ(fromStatus(invalidArgument("kv_transfer_params.x must be y"), "messages").param,
            "messages");
}

TEST(ApiErrors, EngineError) {
  engine::RequestOutput output;
  output.finish_reason = engine::FinishReason::kError;
  output.error = "model runner failed: out of memory";
  const ApiError error = engineError(output);
  EXPECT_EQ(error.status, 500);
  EXPECT_EQ(error.type, "server_error");
  EXPECT_EQ(error.message, "model runner failed: out of memory");
  output.error.clear();
  EXPECT_EQ(engineError(output).message, "the engine failed while generating");
}

// ---------------------------------------------------------------------------
// /v1/completions: refused inputs

TEST_F(ProtocolTest, CompletionRefusesBadInput) {
  const int64_t hello_len = static_cast<int64_t>(tokenizer().encode("Hello world").size());
  std::string ids_64 = "[";
  for (int i = 0; i < 64; ++i) ids_64 += (i ? ",7" : "7");
  ids_64 += "]";

  const std::string stop_4097(4097, 'x');
  const std::string stop_4096(4096, 'x');

  const std::vector<BadCase> cases = {
      // Body and model.
      bad("{", "",
          "request body is not valid JSON: parse error at line 1, column 2: syntax error while "
          "parsing object key - unexpected end of input; expected string literal"),
      bad("", "",
          "request body is not valid JSON: parse error at line 1, column 1: syntax error while "
          "parsing value - unexpected end of input; expected '[', '{', or a literal"),
      bad("[1]", "", "request body must be a JSON object, got array"),
      bad(R"({"model": "tiny-model", "prompt": [1e400]})", "",
          "request body is not valid JSON: number overflow parsing '1e400'"),
      bad(R"({"prompt": "x"})", "model", "model is required (this server serves \"tiny-model\")"),
      bad(R"({"model": 5, "prompt": "x"})", "model", "model must be a string, got number"),
      BadCase{R"({"model": "gpt-4", "prompt": "x"})", 404, "not_found_error", "model",
              "model \"gpt-4\" does not exist; this server serves \"tiny-model\""},
      // Prompt forms.
      bad(R"({"model": "tiny-model"})", "prompt",
          "prompt is required (a string, an array of token ids, or an array of these)"),
      bad(R"({"model": "tiny-model", "prompt": ""})", "prompt", "prompt must not be empty"),
      bad(R"({"model": "tiny-model", "prompt": []})", "prompt", "prompt must not be empty"),
      bad(R"({"model": "tiny-model", "prompt": [""]})", "prompt[0]", "prompt[0] must not be empty"),
      bad(R"({"model": "tiny-model", "prompt": [[]]})", "prompt[0]", "prompt[0] must not be empty"),
      bad(R"({"model": "tiny-model", "prompt": ["a", ""]})", "prompt[1]",
          "prompt[1] must not be empty"),
      bad(R"({"model": "tiny-model", "prompt": [[1, 2], [3, 700]]})", "prompt[1][1]",
          "prompt[1][1] must be a token id between 0 and 511, got 700"),
      bad(R"({"model": "tiny-model", "prompt": [[1], ["a"]]})", "prompt[1][0]",
          "prompt[1][0] must be a token id (an integer), got string"),
      bad(R"({"model": "tiny-model", "prompt": ["a", "b"], "kv_transfer_params": {}})",
          "kv_transfer_params",
          "kv_transfer_params hands one request's KV over: prompt must be one prompt, got 2"),
      bad(R"({"model": "tiny-model", "prompt": [1, 512]})", "prompt[1]",
          "prompt[1] must be a token id between 0 and 511, got 512"),
      bad(R"({"model": "tiny-model", "prompt": [1, -1]})", "prompt[1]",
          "prompt[1] must be a token id between 0 and 511, got -1"),
      bad(R"({"model": "tiny-model", "prompt": [1.5]})", "prompt[0]",
          "prompt[0] must be a token id between 0 and 511, got 1.5"),
      bad(R"({"model": "tiny-model", "prompt": [1, "x"]})", "prompt[1]",
          "prompt[1] must be a token id (an integer), got string"),
      bad(R"({"model": "tiny-model", "prompt": [[1, 999]]})", "prompt[0][1]",
          "prompt[0][1] must be a token id between 0 and 511, got 999"),
      bad(R"({"model": "tiny-model", "prompt": 5})", "prompt",
          "prompt must be a string, an array of token ids, or an array of these, got number"),
      bad(R"({"model": "tiny-model", "prompt": [{"text": "x"}]})", "prompt[0]",
          "prompt[0] must be a string or an array of token ids, got object"),
      // Lengths.
      bad(R"({"model": "tiny-model", "prompt": )" + ids_64 + "}", "prompt",
          "prompt is 64 tokens, but max_model_len is 64; at most 63 prompt tokens leave room for "
          "one generated token"),
      bad(completion(R"("max_tokens": 100)"), "max_tokens",
          "prompt (" + std::to_string(hello_len) +
              " tokens) + max_tokens (100) exceeds max_model_len (64); max_tokens can be at most " +
              std::to_string(kMaxModelLen - hello_len) + " for this prompt"),
      bad(completion(R"("max_tokens": 0)"), "max_tokens", "max_tokens must be at least 1, got 0"),
      bad(completion(R"("max_tokens": "10")"), "max_tokens",
          "max_tokens must be an integer, got string"),
      bad(completion(R"("max_tokens": 2.5)"), "max_tokens",
          "max_tokens must be an integer, got 2.5"),
      bad(completion(R"("max_tokens": 1e30)"), "max_tokens",
          "max_tokens must be a 64-bit integer (-9223372036854775808 to 9223372036854775807), got "
          "1e+30, outside that range"),
      bad(completion(R"("max_tokens": 18446744073709551615)"), "max_tokens",
          "max_tokens must be a 64-bit integer (-9223372036854775808 to 9223372036854775807), got "
          "18446744073709551615, outside that range"),
      // A seed may be unsigned too: its range says so.
      seedOutOfRange("18446744073709551616", "1.8446744073709552e+19"),
      seedOutOfRange("-9223372036854777856", "-9.223372036854778e+18"),
      bad(completion(R"("min_tokens": -1)"), "min_tokens", "min_tokens must be at least 0, got -1"),
      bad(completion(R"("max_tokens": 5, "min_tokens": 10)"), "min_tokens",
          "min_tokens must be between 0 and max_tokens (5), got 10"),
      // Against a max_tokens left out, its default and where it comes from
      // are said (it was named as if the client had sent it).
      bad(completion(R"("min_tokens": 100)"), "min_tokens",
          "min_tokens (100) is more than max_tokens, which the request leaves out: its default "
          "here is " +
              std::to_string(kMaxModelLen - hello_len) +
              " (what max_model_len 64 leaves after the prompt)"),
      // Sampling types and ranges.
      bad(completion(R"("temperature": "hot")"), "temperature",
          "temperature must be a number, got string"),
      bad(completion(R"("temperature": 3.5)"), "temperature",
          "temperature must be between 0 and 2, got 3.5"),
      bad(completion(R"("temperature": -0.5)"), "temperature",
          "temperature must be between 0 and 2, got -0.5"),
      bad(completion(R"("top_p": 0)"), "top_p", "top_p must be in (0, 1], got 0"),
      bad(completion(R"("top_p": 1.5)"), "top_p", "top_p must be in (0, 1], got 1.5"),
      bad(completion(R"("top_p": true)"), "top_p", "top_p must be a number, got boolean"),
      bad(completion(R"("top_k": -2)"), "top_k", "top_k must be 0 (disabled) or positive, got -2"),
      bad(completion(R"("top_k": 1.5)"), "top_k", "top_k must be an integer, got 1.5"),
      bad(completion(R"("top_k": 4294967296)"), "top_k",
          "top_k must be between -2147483648 and 2147483647, got 4294967296"),
      bad(completion(R"("min_p": 1.5)"), "min_p", "min_p must be between 0 and 1, got 1.5"),
      bad(completion(R"("frequency_penalty": 2.5)"), "frequency_penalty",
          "frequency_penalty must be between -2 and 2, got 2.5"),
      bad(completion(R"("presence_penalty": -3)"), "presence_penalty",
          "presence_penalty must be between -2 and 2, got -3"),
      bad(completion(R"("repetition_penalty": 0)"), "repetition_penalty",
          "repetition_penalty must be greater than 0 and finite, got 0"),
      // Beyond a float: refused quoting the value sent; a nonzero value too
      // small for one keeps its sign (1e-50 is a valid top_p, below).
      bad(completion(R"("temperature": 3.5e38)"), "temperature",
          "temperature must be a number a float holds (magnitude at most 3.4028235e38), got "
          "3.5e+38"),
      bad(completion(R"("min_p": -1e300)"), "min_p",
          "min_p must be a number a float holds (magnitude at most 3.4028235e38), got -1e+300"),
      bad(completion(R"("min_p": -1e-50)"), "min_p", "min_p must be between 0 and 1, got -1e-45"),
      bad(completion(R"("repetition_penalty": "1")"), "repetition_penalty",
          "repetition_penalty must be a number, got string"),
      bad(completion(R"("seed": "x")"), "seed", "seed must be an integer, got string"),
      bad(completion(R"("seed": 1.5)"), "seed", "seed must be an integer, got 1.5"),
      bad(completion(R"("n": 17)"), "n", "n must be between 1 and 16, got 17"),
      bad(completion(R"("n": 0)"), "n", "n must be between 1 and 16, got 0"),
      bad(completion(R"("n": 2, "stream": true, "resume_token_ids": [5])"), "resume_token_ids",
          "resume_token_ids continues one choice: n must be 1"),
      bad(completion(R"("n": 2, "kv_transfer_params": {})"), "kv_transfer_params",
          "kv_transfer_params hands one request's KV over: n must be 1"),
      bad(completion(R"("n": "1")"), "n", "n must be an integer, got string"),
      bad(completion(R"("n": 3, "best_of": 2)"), "best_of",
          "best_of must be between 3 and 16, got 2"),
      bad(completion(R"("best_of": 17)"), "best_of", "best_of must be between 1 and 16, got 17"),
      bad(completion(R"("best_of": 3, "n": 2, "stream": true)"), "best_of",
          "best_of (3) more than n (2) ranks finished choices: it cannot be streamed; set stream "
          "to false"),
      bad(completion(R"("best_of": 2, "kv_transfer_params": {})"), "kv_transfer_params",
          "kv_transfer_params hands one request's KV over: best_of must be 1"),
      // Stops.
      bad(completion(R"("stop": 5)"), "stop",
          "stop must be a string or an array of strings, got number"),
      bad(completion(R"("stop": "")"), "stop", "stop must not be empty"),
      bad(completion(R"("stop": ["a", "b", "c", "d", "e"])"), "stop",
          "stop must have at most 4 strings, got 5"),
      bad(completion(R"("stop": ["a", 1])"), "stop[1]", "stop[1] must be a string, got number"),
      bad(completion(R"("stop": ["a", ""])"), "stop[1]", "stop[1] must not be empty"),
      // Each engine request holds its own matcher of them.
      bad(completion("\"stop\": \"" + stop_4097 + "\""), "stop",
          "stop must be at most 4096 bytes, got 4097"),
      bad(completion("\"stop\": [\"a\", \"" + stop_4097 + "\"]"), "stop[1]",
          "stop[1] must be at most 4096 bytes, got 4097"),
      bad(completion(R"("stop_token_ids": [3, 512])"), "stop_token_ids[1]",
          "stop_token_ids[1] must be a token id between 0 and 511, got 512"),
      bad(completion(R"("stop_token_ids": "x")"), "stop_token_ids",
          "stop_token_ids must be an array of token ids, got string"),
      bad(completion("\"stop_token_ids\": " + json(std::vector<int>(1025, 7)).dump()),
          "stop_token_ids", "stop_token_ids must have at most 1024 ids, got 1025"),
      bad(completion(R"("ignore_eos": "yes")"), "ignore_eos",
          "ignore_eos must be a boolean, got string"),
      bad(completion(R"("skip_special_tokens": 0)"), "skip_special_tokens",
          "skip_special_tokens must be a boolean, got number"),
      // Streaming.
      bad(completion(R"("stream": "true")"), "stream", "stream must be a boolean, got string"),
      bad(completion(R"("stream_options": {"include_usage": true})"), "stream_options",
          "stream_options is only allowed when stream is true"),
      bad(completion(R"("stream": true, "stream_options": {"include_usage": 1})"),
          "stream_options.include_usage",
          "stream_options.include_usage must be a boolean, got number"),
      bad(completion(R"("stream": true, "stream_options": "usage")"), "stream_options",
          "stream_options must be an object, got string"),
      // Logprobs.
      bad(completion(R"("logprobs": 6)"), "logprobs", "logprobs must be between 0 and 5, got 6"),
      bad(completion(R"("logprobs": -1)"), "logprobs", "logprobs must be between 0 and 5, got -1"),
      bad(completion(R"("logprobs": true)"), "logprobs",
          "logprobs must be an integer, got boolean"),
      // Pass-through fields.
      bad(completion(R"("cache_salt": "")"), "cache_salt",
          "cache_salt must not be empty when given"),
      bad(completion(R"("cache_salt": 5)"), "cache_salt",
          "cache_salt must be a string, got number"),
      bad(completion(R"("priority": "high")"), "priority",
          "priority must be an integer, got string"),
      bad(completion(R"("priority": 1.5)"), "priority", "priority must be an integer, got 1.5"),
      // Below int64: read as a double, which rounds it to -2^63.
      bad(completion(R"("priority": -9223372036854775809)"), "priority",
          "priority must be a 64-bit integer (-9223372036854775808 to 9223372036854775807), got "
          "-9.223372036854776e+18, outside that range"),
      bad(completion(R"("kv_transfer_params": "x")"), "kv_transfer_params",
          "kv_transfer_params must be an object, got string"),
      // Refused features.
      bad(completion(R"("echo": true, "logprobs": 2, "kv_transfer_params": {})"), "echo",
          "echo needs every prompt position computed by this agent: it cannot be combined with "
          "kv_transfer_params"),
      bad(completion(R"("echo": "no")"), "echo", "echo must be a boolean, got string"),
      bad(completion(R"("logit_bias": [1])"), "logit_bias",
          "logit_bias must be an object mapping token ids to biases, got array"),
      bad(completion(R"("logit_bias": {"x1": 5})"), "logit_bias",
          "logit_bias keys must be token ids in [0, 512) written as decimal strings, got \"x1\""),
      bad(completion(R"("logit_bias": {"512": 5})"), "logit_bias",
          "logit_bias keys must be token ids in [0, 512) written as decimal strings, got \"512\""),
      bad(completion(R"("logit_bias": {"-1": 5})"), "logit_bias",
          "logit_bias keys must be token ids in [0, 512) written as decimal strings, got \"-1\""),
      bad(completion(R"("logit_bias": {"7": 100.5})"), "logit_bias[\"7\"]",
          "logit_bias[\"7\"] must be a number between -100 and 100, got 100.5"),
      bad(completion(R"("logit_bias": {"97": 60, "097": 60})"), "logit_bias",
          "logit_bias names token 97 twice (keys must be distinct token ids)"),
      bad(completion(R"("logit_bias": {"7": "up"})"), "logit_bias[\"7\"]",
          "logit_bias[\"7\"] must be a number between -100 and 100, got \"up\""),
      // Structured outputs.
      bad(completion(R"("response_format": {"type": "yaml"})"), "response_format",
          "response_format.type \"yaml\" is not supported; use \"text\", \"json_object\" or "
          "\"json_schema\""),
      bad(completion(R"("response_format": {})"), "response_format",
          "response_format.type must be \"text\", \"json_object\" or \"json_schema\""),
      bad(completion(R"("response_format": "text")"), "response_format",
          "response_format must be an object, got string"),
      bad(completion(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})"),
          "response_format.json_schema.schema", "response_format.json_schema.schema is required"),
      bad(completion(R"("response_format": {"type": "json_schema", "json_schema": {"schema": 5}})"),
          "response_format.json_schema.schema",
          "response_format.json_schema.schema must be a JSON schema object, got number"),
      bad(completion(R"("structured_outputs": {"choice": []})"), "structured_outputs.choice",
          "structured_outputs.choice must be a non-empty array of non-empty strings"),
      bad(completion(R"("structured_outputs": {"whitespace_pattern": " "})"),
          "structured_outputs.whitespace_pattern",
          "structured_outputs.whitespace_pattern is not supported; structured_outputs takes one "
          "of json, regex, choice, grammar, json_object"),
      // A schema as text says why its text is not one.
      bad(completion(R"("guided_json": "[1")"), "guided_json",
          "guided_json must be a JSON schema (an object, or a string holding one); its text is "
          "not JSON that can be read: parse error at line 1, column 3: syntax error while "
          "parsing array - unexpected end of input; expected ']'"),
      bad(completion("\"guided_json\": " +
                     json(std::string(200, '[') + std::string(200, ']')).dump()),
          "guided_json",
          "guided_json must be a JSON schema (an object, or a string holding one); its text is "
          "not JSON that can be read: nesting deeper than 128 levels at "
          "[0][0][0][0][0][0]…"),
      bad(completion(R"("structured_outputs": {"json": "[1]"})"), "structured_outputs.json",
          "structured_outputs.json must be a JSON schema (an object, or a string holding one), "
          "got a string holding array"),
      bad(completion(R"("guided_json": {}, "guided_whitespace_pattern": " ")"),
          "guided_whitespace_pattern",
          "guided_whitespace_pattern is not supported; JSON outputs are written without white "
          "space between tokens"),
      bad(completion(R"("guided_regex": "a+", "guided_choice": ["a"])"), "guided_choice",
          "only one structured output constraint per request: both guided_regex and "
          "guided_choice are given"),

      bad(completion(R"("suffix": "end")"), "suffix",
          "suffix is not supported yet; leave it out or send null"),
      // Fields that would change the answer, not done here: refused.
      bad(completion(R"("use_beam_search": true)"), "use_beam_search",
          "use_beam_search is not supported; send false or leave it out (n and best_of sample "
          "several answers)"),
      bad(completion(R"("logits_processors": ["x"])"), "logits_processors",
          "logits_processors are not supported; leave it out"),
      bad(completion(R"("detokenize": false)"), "detokenize",
          "detokenize must be true: answers always carry text (return_token_ids adds the token "
          "ids)"),
      bad(completion(R"("prompt_logprobs": 6)"), "prompt_logprobs",
          "prompt_logprobs must be between 0 and 5, got 6"),
      bad(completion(R"("prompt_logprobs": "1")"), "prompt_logprobs",
          "prompt_logprobs must be an integer, got string"),
      bad(completion(R"("prompt_logprobs": 1, "stream": true)"), "prompt_logprobs",
          "prompt_logprobs are not available when stream is true; set stream to false"),
      bad(completion(R"("prompt_logprobs": 0, "kv_transfer_params": {})"), "prompt_logprobs",
          "prompt_logprobs needs every prompt position computed by this agent: it cannot be "
          "combined with kv_transfer_params"),
  };
  for (const BadCase& c : cases) {
    expectRefused(parseCompletionRequest(c.body, testLimits(), tokenizer()), c);
  }
  auto longest = parseCompletionRequest(completion("\"stop\": [\"" + stop_4096 + "\"]"),
                                        testLimits(), tokenizer());
  ASSERT_TRUE(longest.isOk()) << longest.error().message;
  EXPECT_EQ(longest.value().request.sampling.stop, std::vector<std::string>{stop_4096});
}

// A constraint the compilers refuse: a 400 naming the field, then the
// compiler's own words (what in the schema, regex or grammar, and where).
TEST_F(ProtocolTest, RefusedConstraintsNameTheFieldAndWhatIsRefused) {
  struct Case {
    std::string body;
    std::string param;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {completion(R"j("structured_outputs": {"regex": "a(?=b)"})j"),
       "structured_outputs.regex",
       {"structured_outputs.regex: ", "lookahead"}},
      {completion(R"("guided_grammar": "root ::= root \"a\" | \"b\"")"),
       "guided_grammar",
       {"guided_grammar: ", "\"root\" is left-recursive"}},
      {completion(
           R"("guided_json": {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}})"),
       "guided_json",
       {"guided_json: ", "multipleOf", "/properties/a"}},
      {chat(
           R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {"a": {"not": {}}}}}})"),
       "response_format.json_schema.schema",
       {"response_format.json_schema.schema: ", "\"not\"", "/properties/a"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto result = c.body.find("messages") != std::string::npos
                      ? parseChatCompletionRequest(c.body, testLimits(), tokenizer(), nullptr)
                      : parseCompletionRequest(c.body, testLimits(), tokenizer());
    ASSERT_FALSE(result.isOk());
    EXPECT_EQ(result.error().status, 400);
    EXPECT_EQ(result.error().param, c.param);
    for (const std::string& word : c.words) {
      EXPECT_NE(result.error().message.find(word), std::string::npos) << result.error().message;
    }
    EXPECT_EQ(result.error().message.find(c.param + ": "), 0u) << result.error().message;
  }
}

TEST_F(ProtocolTest, StructuredOutputFieldsGiveOneConstraint) {
  using structured::ConstraintKind;
  struct Case {
    std::string body;
    ConstraintKind kind;
    std::string spec;
  };
  const std::vector<Case> cases = {
      // Key order is the client's, not sorted: properties come out in it.
      {chat(
           R"("response_format": {"type": "json_schema", "json_schema": {"name": "w", "strict": true, "schema": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"]}}})"),
       ConstraintKind::kJsonSchema,
       R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}},"required":["zeta","alpha"]})"},
      {completion(R"("response_format": {"type": "json_object"})"), ConstraintKind::kJsonObject,
       ""},
      {completion(R"("structured_outputs": {"regex": "[a-z]+@x\\.com"})"), ConstraintKind::kRegex,
       "[a-z]+@x\\.com"},
      {completion(R"("structured_outputs": {"choice": ["yes", "no"], "disable_fallback": true})"),
       ConstraintKind::kChoice, R"(["yes","no"])"},
      {completion(R"("structured_outputs": {"json": "{\"type\": \"integer\"}"})"),
       ConstraintKind::kJsonSchema, R"({"type":"integer"})"},
      {completion(R"("guided_choice": ["a", "b"])"), ConstraintKind::kChoice, R"(["a","b"])"},
      {completion(R"("guided_grammar": "root ::= \"x\"+")"), ConstraintKind::kGrammar,
       "root ::= \"x\"+"},
      {completion(R"("guided_json": {"type": "boolean"})"), ConstraintKind::kJsonSchema,
       R"({"type":"boolean"})"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto result = c.body.find("messages") != std::string::npos
                      ? parseChatCompletionRequest(c.body, testLimits(), tokenizer(), nullptr)
                      : parseCompletionRequest(c.body, testLimits(), tokenizer());
    ASSERT_TRUE(result.isOk()) << result.error().message;
    const auto& constraint = result.value().request.structured_output;
    ASSERT_TRUE(constraint.has_value());
    EXPECT_EQ(constraint->kind, c.kind);
    EXPECT_EQ(constraint->spec, c.spec);
  }
  // Text, or nothing: unconstrained.
  for (const std::string& body :
       {completion(R"("response_format": {"type": "text"})"), completion("")}) {
    auto result = parseCompletionRequest(body, testLimits(), tokenizer());
    ASSERT_TRUE(result.isOk());
    EXPECT_FALSE(result.value().request.structured_output.has_value());
  }
}

// tool_choice "auto" (or none given) with a strict function: the output
// may be text, but wherever the server's parser would find a call, the
// call follows its function's schema. Each accepted output parses back to
// the calls listed (or to content only); outputs whose calls break the
// schema are refused. Without a strict function, without a parser, or with
// another constraint, auto constrains nothing more.
TEST_F(ProtocolTest, AutoToolChoiceEnforcesStrictFunctionsWhereCallsAre) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters":
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": false}}},
      {"type": "function", "function": {"name": "now"}}])";
  struct Case {
    protocol::ToolCallParserKind parser;
    std::vector<std::pair<std::string, std::vector<std::string>>> accepted;  // text, call names
    std::vector<std::string> refused;
  };
  const std::string weather = "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}";
  const std::string llama_weather = "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}";
  const std::vector<Case> cases = {
      {protocol::ToolCallParserKind::kHermes,
       {{"", {}},
        {"It is sunny.", {}},
        {"a < b, <tool_ <tool_call", {}},
        {"<tool_call>\n" + weather + "\n</tool_call>", {"get_weather"}},
        {"Let me check. <tool_<tool_call>\n" + weather + "\n</tool_call>", {"get_weather"}},
        {"<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n" + weather +
             "\n</tool_call>",
         {"now", "get_weather"}}},
       {"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"town\":\"Oslo\"}}\n</tool_call>",
        "hi <tool_call>\n{\"name\":\"other\",\"arguments\":{}}\n</tool_call>", "<tool_call>oops"}},
      {protocol::ToolCallParserKind::kLlama3Json,
       {{"", {}},
        {"Sure, it is sunny.", {}},
        {"<b>bold</b>", {}},
        {"<|python_tag|> not a call", {}},
        {llama_weather, {"get_weather"}},
        {"  \n" + llama_weather, {"get_weather"}},
        {"<|python_tag|>" + llama_weather, {"get_weather"}},
        {"{\"name\":\"now\",\"parameters\":{}}; " + llama_weather, {"now", "get_weather"}}},
       {"{\"name\":\"get_weather\",\"parameters\":{\"city\":5}}", "  {oops",
        "<|python_tag|> {\"name\":\"x\",\"parameters\":{}}"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(protocol::toolCallParserName(c.parser));
    for (const std::string& choice : {std::string(), std::string(R"(, "tool_choice": "auto")")}) {
      const std::optional<structured::Grammar> grammar =
          toolCallGrammar(chat(tools + choice), c.parser);
      ASSERT_TRUE(grammar.has_value());
      for (const auto& [text, names] : c.accepted) {
        SCOPED_TRACE(text);
        EXPECT_TRUE(structured::grammarAccepts(*grammar, text));
        const protocol::ToolCallSplit split = protocol::parseToolCalls(c.parser, text);
        std::vector<std::string> called;
        for (const auto& call : split.tool_calls) called.push_back(call.name);
        EXPECT_EQ(called, names);
      }
      for (const std::string& text : c.refused) {
        EXPECT_FALSE(structured::grammarAccepts(*grammar, text)) << text;
      }
    }
  }
  ServerLimits limits = testLimits();
  limits.chat_output.tool_call_parser = protocol::ToolCallParserKind::kHermes;
  std::string loose = tools;
  loose.replace(loose.find(R"("strict": true)"), 14, R"("strict": false)");
  auto not_strict = parseChatCompletionRequest(chat(loose), limits, tokenizer());
  ASSERT_TRUE(not_strict.isOk()) << not_strict.error().message;
  EXPECT_FALSE(not_strict.value().request.structured_output.has_value());
  auto no_parser = parseChatCompletionRequest(chat(tools), testLimits(), tokenizer());
  ASSERT_TRUE(no_parser.isOk()) << no_parser.error().message;
  EXPECT_FALSE(no_parser.value().request.structured_output.has_value());
  auto with_format = parseChatCompletionRequest(
      chat(tools + R"(, "response_format": {"type": "json_object"})"), limits, tokenizer());
  ASSERT_TRUE(with_format.isOk()) << with_format.error().message;
  EXPECT_EQ(with_format.value().request.structured_output->kind,
            structured::ConstraintKind::kJsonObject);
  auto none =
      parseChatCompletionRequest(chat(tools + R"(, "tool_choice": "none")"), limits, tokenizer());
  ASSERT_TRUE(none.isOk()) << none.error().message;
  EXPECT_FALSE(none.value().request.structured_output.has_value());
}

// tool_choice "required" / named with the server's tool-call parser: the
// output is constrained to calls in the parser's format, and what the
// constraint accepts the parser reads back as those calls.
TEST_F(ProtocolTest, ForcedToolCallsAreConstrainedToTheParsersFormat) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
        "maximum": 7}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "now"}}])";
  struct Case {
    protocol::ToolCallParserKind parser;
    std::string extra;
    std::vector<std::string> accepted;  // each: the calls' names, in order
    std::vector<std::vector<std::string>> names;
    std::vector<std::string> refused;
  };
  const std::vector<Case> cases = {
      {protocol::ToolCallParserKind::kHermes,
       R"("tool_choice": "required")",
       {"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}\n</"
        "tool_call>",
        "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\":"
        "\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}\n</tool_call>"},
       {{"get_weather"}, {"now", "get_weather"}},
       {"Sure!", "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"days\":3}}\n</tool_call>",
        "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":9}}\n</"
        "tool_call>",
        "<tool_call>\n{\"name\":\"other\",\"arguments\":{}}\n</tool_call>"}},
      {protocol::ToolCallParserKind::kLlama3Json,
       R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})",
       {"{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}"},
       {{"get_weather"}},
       {"{\"name\":\"now\",\"parameters\":{}}",
        // Named: one call, never parallel.
        "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"A\"}}; {\"name\":"
        "\"get_weather\",\"parameters\":{\"city\":\"B\"}}"}},
      {protocol::ToolCallParserKind::kLlama3Json,
       R"("tool_choice": "required", "parallel_tool_calls": false)",
       {"{\"name\":\"now\",\"parameters\":{}}"},
       {{"now"}},
       {"{\"name\":\"now\",\"parameters\":{}}; {\"name\":\"now\",\"parameters\":{}}"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra);
    const std::optional<structured::Grammar> grammar =
        toolCallGrammar(chat(tools + ", " + c.extra), c.parser);
    ASSERT_TRUE(grammar.has_value());
    for (size_t i = 0; i < c.accepted.size(); ++i) {
      SCOPED_TRACE(c.accepted[i]);
      EXPECT_TRUE(structured::grammarAccepts(*grammar, c.accepted[i]));
      const protocol::ToolCallSplit split = protocol::parseToolCalls(c.parser, c.accepted[i]);
      std::vector<std::string> names;
      for (const auto& call : split.tool_calls) names.push_back(call.name);
      EXPECT_EQ(names, c.names[i]);
      EXPECT_FALSE(split.content.has_value());
    }
    for (const std::string& text : c.refused) {
      EXPECT_FALSE(structured::grammarAccepts(*grammar, text)) << text;
    }
  }
  // A parameters schema that says nothing of its type ({}, or properties
  // alone) still takes an object: arguments are never a string or number.
  for (const char* parameters : {"{}", R"({"properties": {"a": {"type": "integer"}}})"}) {
    SCOPED_TRACE(parameters);
    const std::optional<structured::Grammar> untyped =
        toolCallGrammar(chat(std::string(R"("tools": [{"type": "function", "function": {"name":
            "f", "parameters": )") +
                             parameters + R"(}}], "tool_choice": "required")"),
                        protocol::ToolCallParserKind::kHermes);
    ASSERT_TRUE(untyped.has_value());
    EXPECT_TRUE(structured::grammarAccepts(
        *untyped, "<tool_call>\n{\"name\":\"f\",\"arguments\":{}}\n</tool_call>"));
    for (const char* value : {"\"\"", "3", "[]", "null"}) {
      EXPECT_FALSE(structured::grammarAccepts(
          *untyped,
          std::string("<tool_call>\n{\"name\":\"f\",\"arguments\":") + value + "}\n</tool_call>"))
          << value;
    }
  }
  // A strict function whose schema cannot be enforced is refused, naming it
  // and its parameters, with tool_choice "required" or left to "auto".
  ServerLimits limits = testLimits();
  limits.chat_output.tool_call_parser = protocol::ToolCallParserKind::kHermes;
  for (const char* choice : {R"(, "tool_choice": "required")", ""}) {
    SCOPED_TRACE(choice);
    auto strict = parseChatCompletionRequest(
        chat(std::string(R"("tools": [{"type": "function", "function": {"name": "g"}},
             {"type": "function", "function": {"name": "f", "strict": true,
             "parameters": {"type": "object", "properties": {"n": {"type": "number",
             "multipleOf": 3}}}}}])") +
             choice),
        limits, tokenizer());
    ASSERT_FALSE(strict.isOk());
    EXPECT_EQ(strict.error().param, "tools[1].function.parameters");
    EXPECT_NE(
        strict.error().message.find("tools[1].function.parameters: function \"f\" (strict): "),
        std::string::npos)
        << strict.error().message;
  }
  // "required" over an empty tools list is "none", as vLLM and OpenAI read it.
  auto no_tools = parseChatCompletionRequest(chat(R"("tools": [], "tool_choice": "required")"),
                                             limits, tokenizer());
  ASSERT_TRUE(no_tools.isOk()) << no_tools.error().message;
  EXPECT_FALSE(no_tools.value().request.structured_output.has_value());
  // Not strict: any JSON object for its arguments.
  auto loose = parseChatCompletionRequest(
      chat(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type":
           "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}}}],
           "tool_choice": "required")"),
      limits, tokenizer());
  ASSERT_TRUE(loose.isOk()) << loose.error().message;
}

// echo: the answer starts with the prompt's text, whole or streamed (the
// first chunk), the token-id form decoded; a resumed stream does not repeat it.
// vLLM's allowed_token_ids (sorted, distinct), bad_words (each word's tokens
// alone, and after a space when that is another word of as many tokens) and
// truncate_prompt_tokens (the prompt's last tokens; -1: max_model_len).
TEST_F(ProtocolTest, AllowedTokenIdsBadWordsAndPromptTruncationAsVllmReadsThem) {
  auto allowed = parseCompletionRequest(completion(R"("allowed_token_ids": [9, 3, 9, 0])"),
                                        testLimits(), tokenizer());
  ASSERT_TRUE(allowed.isOk()) << allowed.error().message;
  EXPECT_EQ(allowed.value().request.sampling.allowed_token_ids, (std::vector<TokenId>{0, 3, 9}));

  auto words = parseChatCompletionRequest(chat(R"("bad_words": ["  world", "Hello"])"),
                                          testLimits(), tokenizer());
  ASSERT_TRUE(words.isOk()) << words.error().message;
  std::vector<std::vector<TokenId>> expected;
  for (const std::string word : {"world", "Hello"}) {
    const std::vector<TokenId> alone = tokenizer().encode(word);
    const std::vector<TokenId> spaced = tokenizer().encode(" " + word);
    expected.push_back(alone);
    if (spaced.size() == alone.size() && spaced[0] != alone[0]) expected.push_back(spaced);
  }
  EXPECT_EQ(words.value().request.sampling.bad_words_ids, expected);
  EXPECT_GT(expected.size(), 2u) << "no word of this tokenizer gets its spaced form";

  const std::vector<TokenId> prompt = tokenizer().encode("Hello world, and more words here");
  ASSERT_GT(prompt.size(), 4u);
  const std::string ids = json(prompt).dump();
  auto cut = parseCompletionRequest(
      R"({"model": "tiny-model", "truncate_prompt_tokens": 4, "echo": true, "prompt": )" + ids +
          "}",
      testLimits(), tokenizer());
  ASSERT_TRUE(cut.isOk()) << cut.error().message;
  const std::vector<TokenId> last4(prompt.end() - 4, prompt.end());
  EXPECT_EQ(cut.value().request.prompt, last4);
  EXPECT_EQ(cut.value().echo_text, tokenizer().decode(last4, /*skip_special_tokens=*/false));
  EXPECT_EQ(cut.value().request.sampling.max_tokens, kMaxModelLen - 4);
  auto text = parseCompletionRequest(completion(R"("truncate_prompt_tokens": 1)"), testLimits(),
                                     tokenizer());
  ASSERT_TRUE(text.isOk()) << text.error().message;
  EXPECT_EQ(text.value().request.prompt,
            std::vector<TokenId>{tokenizer().encode("Hello world", true).back()});
  // Shorter than the bound: whole; -1 is max_model_len, which leaves no room
  // for a prompt of that length (the usual 400).
  auto whole = parseChatCompletionRequest(chat(R"("truncate_prompt_tokens": 64)"), testLimits(),
                                          tokenizer());
  ASSERT_TRUE(whole.isOk()) << whole.error().message;
  auto plain = parseChatCompletionRequest(chat(""), testLimits(), tokenizer());
  EXPECT_EQ(whole.value().request.prompt, plain.value().request.prompt);
  const std::string long_prompt = json(std::vector<TokenId>(80, 5)).dump();
  auto full = parseCompletionRequest(
      R"({"model": "tiny-model", "truncate_prompt_tokens": -1, "prompt": )" + long_prompt + "}",
      testLimits(), tokenizer());
  expectRefused(full, bad("", "prompt",
                          "prompt is 64 tokens, but max_model_len is 64; at most 63 prompt tokens "
                          "leave room for one generated token"));
  auto fits = parseCompletionRequest(
      R"({"model": "tiny-model", "truncate_prompt_tokens": 63, "prompt": )" + long_prompt + "}",
      testLimits(), tokenizer());
  ASSERT_TRUE(fits.isOk()) << fits.error().message;
  EXPECT_EQ(fits.value().request.prompt, std::vector<TokenId>(63, 5));
}

// An array of prompts is a batch: the first prompt's request, and one
// complete request per other prompt (its own ids, echo text and default
// max_tokens); the body is forwarded as sent. At most kMaxBatchedPrompts.
// A model field naming a LoRA adapter runs the request with it (every
// prompt of a batch, chat too); the base model's name runs none; another
// name is a 404 listing what is served.
TEST_F(ProtocolTest, AModelNamingALoraAdapterRunsWithIt) {
  ServerLimits limits = testLimits();
  limits.lora_adapters = [] { return std::vector<std::string>{"sql", "chat-tuned"}; };
  auto adapted = parseCompletionRequest(R"({"model": "sql", "prompt": ["Hello", "world"]})", limits,
                                        tokenizer());
  ASSERT_TRUE(adapted.isOk()) << adapted.error().message;
  EXPECT_EQ(adapted.value().model, "sql");
  EXPECT_EQ(adapted.value().request.adapter, "sql");
  ASSERT_EQ(adapted.value().batch.size(), 1u);
  EXPECT_EQ(adapted.value().batch[0].request.adapter, "sql");
  auto chat = parseChatCompletionRequest(
      R"({"model": "chat-tuned", "messages": [{"role": "user", "content": "hi"}]})", limits,
      tokenizer(), nullptr);
  ASSERT_TRUE(chat.isOk()) << chat.error().message;
  EXPECT_EQ(chat.value().request.adapter, "chat-tuned");
  auto base =
      parseCompletionRequest(R"({"model": "tiny-model", "prompt": "Hello"})", limits, tokenizer());
  ASSERT_TRUE(base.isOk()) << base.error().message;
  EXPECT_EQ(base.value().request.adapter, "");
  auto unknown =
      parseCompletionRequest(R"({"model": "sq", "prompt": "Hello"})", limits, tokenizer());
  ASSERT_FALSE(unknown.isOk());
  EXPECT_EQ(unknown.error().status, 404);
  EXPECT_EQ(unknown.error().param, "model");
  EXPECT_EQ(unknown.error().message,
            "model \"sq\" does not exist; this server serves \"tiny-model\" and its LoRA adapters "
            "\"sql\", \"chat-tuned\"");
}

TEST_F(ProtocolTest, AnArrayOfPromptsIsOneRequestPerPrompt) {
  const std::vector<TokenId> ids = {5, 6, 7};
  auto parsed = parseCompletionRequest(
      R"({"model": "tiny-model", "prompt": ["Hello world", [5, 6, 7]], "echo": true, "n": 2})",
      testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  const ParsedRequest& first = parsed.value();
  EXPECT_EQ(first.request.prompt, tokenizer().encode("Hello world", true));
  EXPECT_EQ(first.echo_text, "Hello world");
  EXPECT_EQ(first.n, 2);
  ASSERT_EQ(first.batch.size(), 1u);
  const ParsedRequest& second = first.batch[0];
  EXPECT_EQ(second.request.prompt, ids);
  EXPECT_EQ(second.echo_text, tokenizer().decode(ids, /*skip_special_tokens=*/false));
  EXPECT_EQ(second.n, 2);
  EXPECT_EQ(second.request.sampling.max_tokens, kMaxModelLen - 3);
  EXPECT_EQ(first.request.sampling.max_tokens,
            kMaxModelLen - static_cast<int64_t>(first.request.prompt.size()));
  EXPECT_TRUE(second.batch.empty());
  EXPECT_EQ(first.body["prompt"].size(), 2u);

  auto one = parseCompletionRequest(R"({"model": "tiny-model", "prompt": ["Hello world"]})",
                                    testLimits(), tokenizer());
  ASSERT_TRUE(one.isOk()) << one.error().message;
  EXPECT_TRUE(one.value().batch.empty());

  json many = json::parse(completion(""));
  many["prompt"] = std::vector<std::string>(kMaxBatchedPrompts + 1, "x");
  expectRefused(
      parseCompletionRequest(many.dump(), testLimits(), tokenizer()),
      bad("", "prompt", "prompt holds 257 prompts; at most 256 are accepted in one request"));
  many["prompt"] = std::vector<std::string>(20, "x");
  many["best_of"] = 16;
  expectRefused(parseCompletionRequest(many.dump(), testLimits(), tokenizer()),
                bad("", "prompt",
                    "prompt holds 20 prompts of 16 candidates each (best_of, or n): 320 engine "
                    "requests; at most 256 are accepted in one request"));
  many.erase("best_of");
  // 256 prompts with every id of the tiny vocabulary allowed: 131,072
  // entries, within the bound; with logit_bias over them too, past it.
  many["prompt"] = std::vector<std::string>(kMaxBatchedPrompts, "x");
  std::vector<TokenId> every(512);
  std::iota(every.begin(), every.end(), 0);
  many["allowed_token_ids"] = every;
  EXPECT_TRUE(parseCompletionRequest(many.dump(), testLimits(), tokenizer()).isOk());
  json bias = json::object();
  for (int id = 0; id < 512; ++id) bias[std::to_string(id)] = 1;
  many["logit_bias"] = bias;
  many["stop_token_ids"] = std::vector<TokenId>(400, 3);
  many["bad_words"] = std::vector<std::string>(128, std::string(1000, 'x'));
  auto lists = parseCompletionRequest(many.dump(), testLimits(), tokenizer());
  ASSERT_FALSE(lists.isOk());
  EXPECT_EQ(lists.error().param, "prompt");
  EXPECT_TRUE(lists.error().message.starts_with(
      "prompt holds 256 prompts: 256 engine requests, each with its own copy of "))
      << lists.error().message;
  EXPECT_TRUE(lists.error().message.ends_with(
      " in all; at most 4194304 are accepted in one request (send fewer prompts at once)"))
      << lists.error().message;
  many.erase("allowed_token_ids");
  many.erase("logit_bias");
  many.erase("stop_token_ids");
  many.erase("bad_words");
  many["prompt"] = {"x", "y"};
  many["stream"] = true;
  many["resume_token_ids"] = {5};
  expectRefused(parseCompletionRequest(many.dump(), testLimits(), tokenizer()),
                bad("", "resume_token_ids",
                    "resume_token_ids resumes one answer: prompt must be one prompt, got 2"));
}

TEST_F(ProtocolTest, EchoPutsThePromptBeforeTheOutput) {
  auto text = parseCompletionRequest(completion(R"("echo": true)"), testLimits(), tokenizer());
  ASSERT_TRUE(text.isOk()) << text.error().message;
  EXPECT_EQ(text.value().echo_text, "Hello world");
  const std::string ids = json(tokenizer().encode("Hello world")).dump();
  auto by_ids = parseCompletionRequest(
      R"({"model": "tiny-model", "echo": true, "prompt": )" + ids + "}", testLimits(), tokenizer());
  ASSERT_TRUE(by_ids.isOk());
  EXPECT_EQ(by_ids.value().echo_text, "Hello world");

  const ResponseMeta meta = makeResponseMeta(text.value(), "r1", 1);
  protocol::RequestOutput step;
  step.text = " there";
  step.tokens.push_back({42, 0.0f, {}});
  StreamState state;
  auto first = completionChunk(meta, step, tokenizer(), state);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ((*first)["choices"][0]["text"], "Hello world there");
  auto second = completionChunk(meta, step, tokenizer(), state);
  EXPECT_EQ((*second)["choices"][0]["text"], " there");
  step.finish_reason = protocol::FinishReason::kStop;
  EXPECT_EQ(completionResponse(meta, step, tokenizer())["choices"][0]["text"], "Hello world there");

  auto resumed = parseCompletionRequest(
      completion(R"("echo": true, "stream": true, "resume_token_ids": [42])"), testLimits(),
      tokenizer());
  ASSERT_TRUE(resumed.isOk()) << resumed.error().message;
  EXPECT_EQ(resumed.value().echo_text, "");
}

// The prompt's logprobs as the engine reports them for "Hello world":
// entry 0 only names its token, the others a logprob, a rank and the best
// alternatives (the second alternative is token 7).
std::vector<protocol::GeneratedToken> helloPromptLogprobs(const Tokenizer& tokenizer) {
  std::vector<protocol::GeneratedToken> entries;
  const std::vector<TokenId> ids = tokenizer.encode("Hello world");
  for (size_t i = 0; i < ids.size(); ++i) {
    protocol::GeneratedToken entry;
    entry.token = ids[i];
    if (i > 0) {
      entry.logprob = -0.5f * static_cast<float>(i);
      entry.rank = 2;
      entry.top = {{7, -0.1f}, {ids[i], entry.logprob}};
    }
    entries.push_back(entry);
  }
  return entries;
}

// echo with logprobs: the logprobs lead with the prompt's tokens (the
// first one's logprob and alternatives null), their offsets point into the
// echoed text and the output's offsets go on after it; whole and streamed
// agree, and a resumed stream asks for no prompt logprobs.
TEST_F(ProtocolTest, EchoWithLogprobsLeadsWithThePromptTokens) {
  auto parsed = parseCompletionRequest(completion(R"("echo": true, "logprobs": 2)"), testLimits(),
                                       tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_EQ(parsed.value().request.sampling.prompt_logprobs, 2);
  EXPECT_FALSE(parsed.value().prompt_logprobs.has_value());  // no vLLM-style field
  const ResponseMeta meta = makeResponseMeta(parsed.value(), "r1", 1);
  EXPECT_TRUE(meta.echo_logprobs);

  const std::vector<TokenId> ids = tokenizer().encode("Hello world");
  protocol::RequestOutput step;
  step.prompt_logprobs = helloPromptLogprobs(tokenizer());
  step.text = "!";
  const std::vector<TokenId> bang = tokenizer().encode("!");
  ASSERT_EQ(bang.size(), 1u);
  step.tokens.push_back({bang[0], -0.25f, {{bang[0], -0.25f}}});
  StreamState state;
  auto chunk = completionChunk(meta, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  const json& logprobs = (*chunk)["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), ids.size() + 1);
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    // Each prompt token's offset is where its text starts in the echo.
    EXPECT_EQ(logprobs["text_offset"][i], static_cast<int64_t>(joined.size())) << i;
    joined += tokenizer().tokenBytes(ids[i]);
    if (i > 0) {
      EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][i].get<double>(), -0.5 * static_cast<double>(i));
      EXPECT_EQ(logprobs["top_logprobs"][i].size(), 2u);
    }
  }
  EXPECT_EQ(joined, "Hello world");
  EXPECT_EQ(logprobs["text_offset"][ids.size()], 11);  // after the echo
  EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][ids.size()].get<double>(), -0.25);

  step.finish_reason = protocol::FinishReason::kStop;
  const json whole = completionResponse(meta, step, tokenizer());
  EXPECT_EQ(whole["choices"][0]["logprobs"], logprobs);
  EXPECT_EQ(whole["choices"][0]["text"], "Hello world!");
  EXPECT_FALSE(whole["choices"][0].contains("prompt_logprobs"));

  auto resumed = parseCompletionRequest(
      completion(R"("echo": true, "logprobs": 2, "stream": true, "resume_token_ids": [42])"),
      testLimits(), tokenizer());
  ASSERT_TRUE(resumed.isOk()) << resumed.error().message;
  EXPECT_FALSE(resumed.value().request.sampling.prompt_logprobs.has_value());
  EXPECT_FALSE(makeResponseMeta(resumed.value(), "r2", 1).echo_logprobs);
}

// vLLM's prompt_logprobs: per choice (completions) or per response (chat),
// null first, then each token's own entry (its rank) and the alternatives
// asked for (rank = place), keyed by token id.
TEST_F(ProtocolTest, PromptLogprobsInVllmsForm) {
  auto parsed = parseCompletionRequest(completion(R"("prompt_logprobs": 1, "logprobs": 3)"),
                                       testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_EQ(parsed.value().prompt_logprobs, 1);
  EXPECT_EQ(parsed.value().request.sampling.prompt_logprobs, 1);
  const ResponseMeta meta = makeResponseMeta(parsed.value(), "r1", 1);
  EXPECT_FALSE(meta.echo_logprobs);
  protocol::RequestOutput total;
  total.prompt_logprobs = helloPromptLogprobs(tokenizer());
  total.finish_reason = protocol::FinishReason::kLength;
  const json body = completionResponse(meta, total, tokenizer());
  const json& list = body["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(list.size(), total.prompt_logprobs.size());
  EXPECT_TRUE(list[0].is_null());
  for (size_t i = 1; i < list.size(); ++i) {
    const std::string own = std::to_string(total.prompt_logprobs[i].token);
    ASSERT_EQ(list[i].size(), 2u) << list[i].dump();  // the token, then token 7
    EXPECT_EQ(list[i][own]["rank"], 2);
    EXPECT_DOUBLE_EQ(list[i][own]["logprob"].get<double>(), -0.5 * static_cast<double>(i));
    EXPECT_EQ(list[i][own]["decoded_token"],
              logprobTokenText(tokenizer(), total.prompt_logprobs[i].token));
    EXPECT_EQ(list[i]["7"]["rank"], 1);
  }

  auto in_chat =
      parseChatCompletionRequest(chat(R"("prompt_logprobs": 0)"), testLimits(), tokenizer());
  ASSERT_TRUE(in_chat.isOk()) << in_chat.error().message;
  const json chat_body =
      chatCompletionResponse(makeResponseMeta(in_chat.value(), "r2", 1), total, tokenizer());
  ASSERT_EQ(chat_body["prompt_logprobs"].size(), total.prompt_logprobs.size());
  EXPECT_EQ(chat_body["prompt_logprobs"][1].size(), 1u);  // 0 alternatives: the token only
  EXPECT_FALSE(chat_body["choices"][0].contains("prompt_logprobs"));

  auto streamed = parseChatCompletionRequest(chat(R"("prompt_logprobs": 0, "stream": true)"),
                                             testLimits(), tokenizer());
  ASSERT_FALSE(streamed.isOk());
  EXPECT_EQ(streamed.error().param, "prompt_logprobs");
}

// best_of defaults to n and may rank more candidates when not streamed.
TEST_F(ProtocolTest, BestOfDefaultsToN) {
  auto plain = parseCompletionRequest(completion(R"("n": 3)"), testLimits(), tokenizer());
  ASSERT_TRUE(plain.isOk()) << plain.error().message;
  EXPECT_EQ(plain.value().best_of, 3);
  auto ranked =
      parseCompletionRequest(completion(R"("n": 2, "best_of": 5)"), testLimits(), tokenizer());
  ASSERT_TRUE(ranked.isOk()) << ranked.error().message;
  EXPECT_EQ(ranked.value().n, 2);
  EXPECT_EQ(ranked.value().best_of, 5);
  auto streamed = parseCompletionRequest(completion(R"("n": 2, "best_of": 2, "stream": true)"),
                                         testLimits(), tokenizer());
  ASSERT_TRUE(streamed.isOk()) << streamed.error().message;
}

// generation_config.json's sampling is where a request starts: the fields
// it gives win, those it leaves out take the model's values, and
// max_new_tokens caps the default max_tokens (not a given one), as in vLLM.
TEST_F(ProtocolTest, GenerationDefaultsFillWhatARequestLeavesOut) {
  ServerLimits limits = testLimits();
  limits.generation_defaults =
      GenerationConfig::fromJsonText(
          R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 7,
              "do_sample": true, "eos_token_id": [3, 4]})",
          "generation_config.json")
          .defaults;
  auto defaulted = parseCompletionRequest(completion(""), limits, tokenizer());
  ASSERT_TRUE(defaulted.isOk()) << defaulted.error().message;
  const SamplingParams& d = defaulted.value().request.sampling;
  EXPECT_FLOAT_EQ(d.temperature, 0.6f);
  EXPECT_FLOAT_EQ(d.top_p, 0.95f);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_FLOAT_EQ(d.min_p, 0.0f);
  EXPECT_EQ(d.max_tokens, 7);
  auto given = parseCompletionRequest(
      completion(R"("temperature": 0, "top_k": -1, "max_tokens": 30)"), limits, tokenizer());
  ASSERT_TRUE(given.isOk()) << given.error().message;
  const SamplingParams& g = given.value().request.sampling;
  EXPECT_EQ(g.temperature, 0.0f);
  EXPECT_EQ(g.top_k, 0);
  EXPECT_FLOAT_EQ(g.top_p, 0.95f);
  EXPECT_EQ(g.max_tokens, 30);
  // Without defaults: the built-in ones, and max_tokens up to max_model_len.
  auto plain = parseCompletionRequest(completion(""), testLimits(), tokenizer());
  ASSERT_TRUE(plain.isOk());
  EXPECT_EQ(plain.value().request.sampling.temperature, 1.0f);
  EXPECT_EQ(plain.value().request.sampling.max_tokens,
            kMaxModelLen - static_cast<int64_t>(plain.value().request.prompt.size()));
  // What an agent advertises, a router reads back.
  const GenerationDefaults& sent = limits.generation_defaults;
  const GenerationDefaults read = GenerationDefaults::fromJson(sent.toJson());
  EXPECT_EQ(read.temperature, sent.temperature);
  EXPECT_EQ(read.top_k, sent.top_k);
  EXPECT_EQ(read.max_new_tokens, sent.max_new_tokens);
  EXPECT_FALSE(read.min_p.has_value());
}

TEST(GenerationConfigFile, ReadsEndOfSequenceIdsAndRefusesBadValuesNamingTheField) {
  GenerationConfig qwen = GenerationConfig::fromJsonText(
      R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
          "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05, "temperature": 0.7,
          "transformers_version": "4.37.0"})",
      "g.json");
  EXPECT_EQ(qwen.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(qwen.defaults.describe(), "temperature=0.7 top_p=0.8 top_k=20 repetition_penalty=1.05");
  EXPECT_EQ(GenerationConfig::fromJsonText(R"({"eos_token_id": 2, "temperature": null})", "g")
                .eos_token_ids,
            std::vector<int64_t>{2});
  EXPECT_TRUE(GenerationConfig::fromJsonText(R"({"top_k": -1})", "g").defaults.top_k == 0);
  TempDir dir("generation-config");
  EXPECT_TRUE(GenerationConfig::fromDirectory(dir.path()).defaults.empty()) << "no file";
  struct Bad {
    const char* text;
    const char* message;
  };
  for (const Bad& bad : {
           Bad{R"({"temperature": "hot"})", "g.json: temperature must be a number"},
           Bad{R"({"temperature": 3})", "g.json: temperature must be between 0 and 2"},
           Bad{R"({"eos_token_id": [2, -1]})", "g.json: eos_token_id[1] must be an integer"},
           Bad{R"({"max_new_tokens": 0})", "g.json: max_new_tokens must be an integer of at"},
           Bad{R"({"top_p": 0})", "g.json: top_p"},
           Bad{R"([1])", "g.json: must hold a JSON object"},
           Bad{R"({"top_k": )", "g.json: not JSON"},
       }) {
    try {
      GenerationConfig::fromJsonText(bad.text, "g.json");
      ADD_FAILURE() << "accepted " << bad.text;
    } catch (const Error& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with(bad.message)) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------
// /v1/completions: accepted forms

TEST_F(ProtocolTest, CompletionPromptFormsGiveTheSameIds) {
  const std::vector<TokenId> expected = tokenizer().encode("Hello world", true);
  ASSERT_FALSE(expected.empty());
  // The test tokenizer has no post-processor: special tokens add nothing.
  ASSERT_EQ(expected, tokenizer().encode("Hello world"));
  const std::string ids = json(expected).dump();
  for (const std::string& prompt :
       {std::string(R"("Hello world")"), std::string(R"(["Hello world"])"), ids, "[" + ids + "]"}) {
    SCOPED_TRACE(prompt);
    auto parsed = parseCompletionRequest(R"({"model": "tiny-model", "prompt": )" + prompt + "}",
                                         testLimits(), tokenizer());
    ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
    EXPECT_EQ(parsed.value().request.prompt, expected);
    EXPECT_EQ(parsed.value().request.sampling.max_tokens,
              kMaxModelLen - static_cast<int64_t>(expected.size()));
    EXPECT_EQ(parsed.value().prompt_text,
              prompt.starts_with("[[") || prompt == ids ? "" : "Hello world");
  }
}

TEST_F(ProtocolTest, CompletionDefaults) {
  auto parsed = parseCompletionRequest(completion(""), testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  const ParsedRequest& request = parsed.value();
  const engine::SamplingParams defaults;
  const engine::SamplingParams& sampling = request.request.sampling;
  EXPECT_EQ(request.model, "tiny-model");
  EXPECT_FALSE(request.chat);
  EXPECT_FALSE(request.stream);
  EXPECT_FALSE(request.include_usage);
  EXPECT_FALSE(request.echo);
  EXPECT_TRUE(request.kv_transfer_params.is_null());
  EXPECT_TRUE(request.request.id.empty());
  EXPECT_TRUE(request.request.cache_salt.empty());
  EXPECT_EQ(request.request.priority, 0);
  EXPECT_EQ(sampling.temperature, defaults.temperature);
  EXPECT_EQ(sampling.top_p, defaults.top_p);
  EXPECT_EQ(sampling.top_k, defaults.top_k);
  EXPECT_EQ(sampling.min_p, defaults.min_p);
  EXPECT_FALSE(sampling.seed.has_value());
  EXPECT_EQ(sampling.frequency_penalty, 0.0f);
  EXPECT_EQ(sampling.presence_penalty, 0.0f);
  EXPECT_EQ(sampling.repetition_penalty, 1.0f);
  EXPECT_FALSE(sampling.logprobs.has_value());
  EXPECT_EQ(sampling.max_tokens,
            kMaxModelLen - static_cast<int64_t>(tokenizer().encode("Hello world").size()));
  EXPECT_EQ(sampling.min_tokens, 0);
  EXPECT_TRUE(sampling.stop.empty());
  EXPECT_TRUE(sampling.stop_token_ids.empty());
  EXPECT_FALSE(sampling.ignore_eos);
  EXPECT_TRUE(sampling.skip_special_tokens);
}

// A number too small for a float is no reason to refuse it: top_p 1e-50 is
// in (0, 1] (the smallest positive float: only the likeliest token is
// kept), as is a repetition penalty of 1e-300; a negative one keeps its
// sign. 3.4028235e38, the largest float as printed (a double a little above
// it), still fits.
TEST_F(ProtocolTest, TinyNumbersKeepTheirSign) {
  auto parsed = parseCompletionRequest(
      completion(R"("top_p": 1e-50, "repetition_penalty": 1e-300, "min_p": 0.0,
          "temperature": 1e-320, "presence_penalty": -1e-50)"),
      testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  const engine::SamplingParams& sampling = parsed.value().request.sampling;
  EXPECT_EQ(sampling.top_p, std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(sampling.repetition_penalty, std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(sampling.temperature, std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(sampling.min_p, 0.0f);
  EXPECT_EQ(sampling.presence_penalty, -std::numeric_limits<float>::denorm_min());
  auto largest = parseCompletionRequest(completion(R"("repetition_penalty": 3.4028235e38)"),
                                        testLimits(), tokenizer());
  ASSERT_TRUE(largest.isOk()) << largest.error().message;
  EXPECT_EQ(largest.value().request.sampling.repetition_penalty, std::numeric_limits<float>::max());
}

TEST_F(ProtocolTest, CompletionEveryField) {
  auto parsed = parseCompletionRequest(
      completion(R"("max_tokens": 8, "min_tokens": 2, "temperature": 0.5, "top_p": 0.9,
          "top_k": 40, "min_p": 0.05, "seed": 1234, "stop": ["\n\n", "END"],
          "stop_token_ids": [509, 511], "ignore_eos": true, "frequency_penalty": 0.5,
          "presence_penalty": -0.5, "repetition_penalty": 1.1, "n": 1, "best_of": 1,
          "stream": true, "stream_options": {"include_usage": true}, "skip_special_tokens": false,
          "user": "someone", "logit_bias": {"300": -100, "12": 2.5}, "response_format": {"type": "text"},
          "logprobs": 3, "echo": false, "cache_salt": "tenant-7", "priority": -9000000000,
          "kv_transfer_params": {"do_remote_decode": true, "remote_port": 7000},
          "an_unknown_field": [1, 2, 3])"),
      testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  const ParsedRequest& request = parsed.value();
  const engine::SamplingParams& sampling = request.request.sampling;
  EXPECT_EQ(request.request.prompt, tokenizer().encode("Hello world"));
  EXPECT_EQ(sampling.max_tokens, 8);
  EXPECT_EQ(sampling.min_tokens, 2);
  EXPECT_EQ(sampling.temperature, 0.5f);
  EXPECT_EQ(sampling.top_p, 0.9f);
  EXPECT_EQ(sampling.top_k, 40);
  EXPECT_EQ(sampling.min_p, 0.05f);
  EXPECT_EQ(sampling.seed, 1234u);
  EXPECT_EQ(sampling.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(sampling.stop_token_ids, (std::vector<TokenId>{509, 511}));
  EXPECT_TRUE(sampling.ignore_eos);
  EXPECT_EQ(sampling.frequency_penalty, 0.5f);
  EXPECT_EQ(sampling.presence_penalty, -0.5f);
  EXPECT_EQ(sampling.repetition_penalty, 1.1f);
  EXPECT_FALSE(sampling.skip_special_tokens);
  EXPECT_EQ(sampling.logprobs, 3);
  EXPECT_EQ(sampling.logit_bias,
            (std::vector<std::pair<TokenId, float>>{{12, 2.5f}, {300, -100.0f}}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.request.cache_salt, "tenant-7");
  EXPECT_EQ(request.request.priority, -9000000000);
  EXPECT_EQ(request.kv_transfer_params, json::parse(R"({"do_remote_decode": true,
      "remote_port": 7000})"));
}

TEST_F(ProtocolTest, CompletionNullMeansAbsent) {
  auto parsed = parseCompletionRequest(
      completion(R"("max_tokens": null, "temperature": null, "top_p": null, "seed": null,
          "stop": null, "stop_token_ids": null, "stream": null, "stream_options": null,
          "logprobs": null, "echo": null, "logit_bias": null, "response_format": null,
          "suffix": null, "kv_transfer_params": null, "cache_salt": null, "n": null,
          "priority": null)"),
      testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  auto plain = parseCompletionRequest(completion(""), testLimits(), tokenizer());
  ASSERT_TRUE(plain.isOk());
  const engine::SamplingParams& a = parsed.value().request.sampling;
  const engine::SamplingParams& b = plain.value().request.sampling;
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_FALSE(parsed.value().stream);
  EXPECT_TRUE(parsed.value().kv_transfer_params.is_null());
}

TEST_F(ProtocolTest, CompletionValueSpellings) {
  struct Case {
    std::string extra;
    void (*check)(const ParsedRequest&);
  };
  const Case cases[] = {
      // vLLM's -1 for "top_k disabled" is the engine's 0.
      {R"("top_k": -1)", [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.top_k, 0); }},
      // Integral floats are integers.
      {R"("max_tokens": 5.0)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.max_tokens, 5); }},
      // Seeds span 64 bits, signed or not.
      {R"("seed": -1)",
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.request.sampling.seed, std::numeric_limits<uint64_t>::max());
       }},
      {R"("seed": 18446744073709551615)",
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.request.sampling.seed, std::numeric_limits<uint64_t>::max());
       }},
      // An integral float in that range, as an integer written so.
      {R"("seed": 1e19)",
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.request.sampling.seed, uint64_t{10000000000000000000u});
       }},
      // -2^63 written as a float is in range.
      {R"("seed": -9.223372036854775808e18)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.seed, uint64_t{1} << 63); }},
      {R"("seed": -2.0)",
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.request.sampling.seed, std::numeric_limits<uint64_t>::max() - 1);
       }},
      // A single stop string; temperature 0 (greedy); logprobs 0.
      {R"("stop": "\n", "temperature": 0, "logprobs": 0)",
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.request.sampling.stop, std::vector<std::string>{"\n"});
         EXPECT_EQ(r.request.sampling.temperature, 0.0f);
         EXPECT_EQ(r.request.sampling.logprobs, 0);
       }},
      // The largest max_tokens that fits.
      {R"("max_tokens": 62)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.max_tokens, 62); }},
      // include_usage defaults to false with stream_options present.
      {R"("stream": true, "stream_options": {})",
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.stream);
         EXPECT_FALSE(r.include_usage);
       }},
  };
  ASSERT_EQ(tokenizer().encode("Hi").size(), 2u) << "the max_tokens case assumes a 2-token prompt";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra);
    auto parsed = parseCompletionRequest(
        R"({"model": "tiny-model", "prompt": "Hi", )" + c.extra + "}", testLimits(), tokenizer());
    ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
    c.check(parsed.value());
  }
}

// ---------------------------------------------------------------------------
// /v1/chat/completions

TEST_F(ProtocolTest, ChatRefusesBadInput) {
  const std::string long_content(300, 'x');
  const int64_t long_len = static_cast<int64_t>(
      tokenizer()
          .encode("<|im_start|>user\n" + long_content + "<|im_end|>\n<|im_start|>assistant\n")
          .size());
  const int64_t hi_len = static_cast<int64_t>(
      tokenizer().encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").size());
  const std::vector<BadCase> cases = {
      bad(R"({"model": "tiny-model"})", "messages",
          "messages is required (a non-empty array of {role, content} objects)"),
      bad(R"({"model": "tiny-model", "messages": {}})", "messages",
          "messages must be an array, got object"),
      bad(chatWith("[]"), "messages", "messages must not be empty"),
      bad(chatWith(R"(["hi"])"), "messages[0]", "messages[0] must be an object, got string"),
      bad(chatWith(R"([{"content": "hi"}])"), "messages[0].role",
          "messages[0].role is required (a string such as system, user, assistant or tool)"),
      bad(chatWith(R"([{"role": 1, "content": "hi"}])"), "messages[0].role",
          "messages[0].role must be a string, got number"),
      bad(chatWith(R"([{"role": "user"}])"), "messages[0].content",
          "messages[0].content is required (a string or an array of text parts; null only in an "
          "assistant or tool message)"),
      bad(chatWith(R"([{"role": "system", "content": null}])"), "messages[0].content",
          "messages[0].content is required (a string or an array of text parts; null only in an "
          "assistant or tool message)"),
      bad(chatWith(R"([{"role": "user", "content": 5}])"), "messages[0].content",
          "messages[0].content must be a string or an array of text parts, got number"),
      bad(chatWith(R"([{"role": "user", "content": ["x"]}])"), "messages[0].content[0]",
          "messages[0].content[0] must be an object, got string"),
      bad(chatWith(R"([{"role": "user", "content": [{"text": "x"}]}])"),
          "messages[0].content[0].type", "messages[0].content[0].type must be \"text\""),
      bad(chatWith(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
          {"type": "image_url", "image_url": {"url": "http://x"}}]}])"),
          "messages[0].content[1].type",
          "messages[0].content[1] is of type \"image_url\"; only text parts ({\"type\": "
          "\"text\", \"text\": ...}) are accepted"),
      bad(chatWith(R"([{"role": "user", "content": [{"type": "text", "text": 5}]}])"),
          "messages[0].content[0].text",
          "messages[0].content[0].text must be a string, got number"),
      bad(chatWith(R"([{"role": "assistant", "content": "", "tool_calls": {}}])"),
          "messages[0].tool_calls", "messages[0].tool_calls must be an array, got object"),
      bad(chatWith(R"([{"role": "assistant", "content": "",
          "tool_calls": [{"id": "1", "type": "function"}]}])"),
          "messages[0].tool_calls[0].function",
          "messages[0].tool_calls[0].function is required ({name, arguments})"),
      bad(chatWith(R"([{"role": "assistant", "content": null,
          "tool_calls": [{"id": "1", "type": "function", "function": {"arguments": "{}"}}]}])"),
          "messages[0].tool_calls[0].function.name",
          "messages[0].tool_calls[0].function.name must be a string"),
      BadCase{R"({"model": "other", "messages": [{"role": "user", "content": "Hi"}]})", 404,
              "not_found_error", "model",
              "model \"other\" does not exist; this server serves \"tiny-model\""},
      bad(chat(R"("logprobs": 1)"), "logprobs", "logprobs must be a boolean, got number"),
      bad(chat(R"("functions": [{"name": "f"}])"), "functions",
          "functions is the deprecated form of tools; send tools and tool_choice instead"),
      bad(chat(R"("function_call": "auto")"), "function_call",
          "function_call is the deprecated form of tools; send tools and tool_choice instead"),
      bad(chat(R"("modalities": ["text", "audio"])"), "modalities",
          "modalities must be [\"text\"]: only text is generated"),
      bad(chat(R"("audio": {"voice": "alloy"})"), "audio",
          "audio is not supported; leave it out or send null"),
      bad(chat(R"("web_search_options": {})"), "web_search_options",
          "web_search_options is not supported; leave it out or send null"),
      bad(chat(R"("priority": [1])"), "priority", "priority must be an integer, got array"),
      bad(chat(R"("top_logprobs": 2)"), "top_logprobs",
          "top_logprobs requires logprobs to be true"),
      bad(chat(R"("allowed_token_ids": [])"), "allowed_token_ids",
          "allowed_token_ids must not be empty; leave it out or send null to allow every token"),
      bad(chat(R"("allowed_token_ids": 3)"), "allowed_token_ids",
          "allowed_token_ids must be an array of token ids, got number"),
      bad(chat(R"("allowed_token_ids": [1, 512])"), "allowed_token_ids[1]",
          "allowed_token_ids[1] must be a token id between 0 and 511, got 512"),
      bad(chat(R"("allowed_token_ids": [)" + std::to_string(tokenizer().encode("x").at(0)) +
               R"(], "bad_words": ["x"])"),
          "allowed_token_ids",
          "allowed_token_ids holds only tokens that bad_words bans (one-token words): nothing "
          "could be generated"),
      bad(chat(R"("bad_words": "x")"), "bad_words",
          "bad_words must be an array of strings, got string"),
      bad(chat(R"("bad_words": ["x", 5])"), "bad_words[1]",
          "bad_words[1] must be a string, got number"),
      bad(chat(R"("bad_words": [" \t\u3000"])"), "bad_words[0]",
          "bad_words[0] must hold a word, not only whitespace"),
      bad(chat(R"("bad_words": [")" + std::string(1025, 'a') + R"("])"), "bad_words[0]",
          "bad_words[0] must be at most 1024 bytes, got 1025"),
      bad(chat(R"("truncate_prompt_tokens": 0)"), "truncate_prompt_tokens",
          "truncate_prompt_tokens must be -1 (keep the last max_model_len tokens) or at least 1, "
          "got 0"),
      bad(chat(R"("truncate_prompt_tokens": -2)"), "truncate_prompt_tokens",
          "truncate_prompt_tokens must be at least -1, got -2"),
      bad(chat(R"("truncate_prompt_tokens": 65)"), "truncate_prompt_tokens",
          "truncate_prompt_tokens (65) is greater than max_model_len (64); give at most that, or "
          "-1 for that"),
      bad(chat(R"("logprobs": false, "top_logprobs": 1)"), "top_logprobs",
          "top_logprobs requires logprobs to be true"),
      bad(chat(R"("logprobs": true, "top_logprobs": 6)"), "top_logprobs",
          "top_logprobs must be between 0 and 5, got 6"),
      bad(chat(R"("max_completion_tokens": 0)"), "max_completion_tokens",
          "max_completion_tokens must be at least 1, got 0"),
      bad(chat(R"("max_completion_tokens": 100, "max_tokens": 5)"), "max_completion_tokens",
          "chat prompt (" + std::to_string(hi_len) +
              " tokens) + max_completion_tokens (100) exceeds max_model_len (64); "
              "max_completion_tokens can be at most " +
              std::to_string(kMaxModelLen - hi_len) + " for this prompt"),
      bad(chat(R"("max_tokens": 100)"), "max_tokens",
          "chat prompt (" + std::to_string(hi_len) +
              " tokens) + max_tokens (100) exceeds max_model_len (64); max_tokens can be at most " +
              std::to_string(kMaxModelLen - hi_len) + " for this prompt"),
      bad(chatWith(R"([{"role": "user", "content": ")" + long_content + R"("}])"), "messages",
          "chat prompt is " + std::to_string(long_len) +
              " tokens, but max_model_len is 64; at most 63 prompt tokens leave room for one "
              "generated token"),
      bad(chat(R"("tools": {"type": "function"})"), "tools",
          "tools must be an array of function tools, got object"),
      bad(chat(R"("tools": [{"function": {"name": "f"}}])"), "tools[0].type",
          "tools[0].type must be \"function\""),
      bad(chat(R"("tools": [{"type": "function"}])"), "tools[0].function",
          "tools[0].function is required ({name, description?, parameters?})"),
      bad(chat(R"("tools": [{"type": "function", "function": {"name": "f"}},
          {"type": "function", "function": {"name": ""}}])"),
          "tools[1].function.name", "tools[1].function.name must be a non-empty string"),
      bad(chat(R"("tools": [{"type": "function", "function": {"name": "f", "description": 1}}])"),
          "tools[0].function.description",
          "tools[0].function.description must be a string, got number"),
      bad(chat(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])"),
          "tools[0].function.parameters",
          "tools[0].function.parameters must be a JSON schema object, got array"),
      // The test server has no tool-call parser: it cannot know the format.
      bad(chat(R"("tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": "required")"),
          "tool_choice",
          "tool_choice \"required\" needs the server's tool-call parser (--tool-call-parser "
          "hermes|llama3_json): it gives the model's tool-call format"),
      bad(chat(R"("tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "f"}})"),
          "tool_choice",
          "tool_choice naming a function needs the server's tool-call parser (--tool-call-parser "
          "hermes|llama3_json): it gives the model's tool-call format"),
      bad(chat(R"("tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}})"),
          "tool_choice.function.name",
          "tool_choice.function.name \"g\" is not the name of a function in tools"),
      bad(chat(R"("tool_choice": "required")"), "tool_choice",
          "tool_choice \"required\" needs at least one tool in tools"),
      bad(chat(R"("tool_choice": {"type": "function"})"), "tool_choice",
          "tool_choice naming a function must be {\"type\": \"function\", \"function\": "
          "{\"name\": ...}}"),
      bad(chat(R"("tool_choice": "any")"), "tool_choice",
          "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
          "\"function\": {\"name\": ...}}, got \"any\""),
      bad(chat(R"("tool_choice": 1)"), "tool_choice",
          "tool_choice must be \"auto\", \"none\", \"required\" or a named function, got number"),
      bad(chat(R"("documents": {"a": 1})"), "documents",
          "documents must be an array of objects, got object"),
      bad(chat(R"("documents": ["x"])"), "documents[0]",
          "documents[0] must be an object, got string"),
      bad(chat(R"("chat_template_kwargs": [1])"), "chat_template_kwargs",
          "chat_template_kwargs must be an object, got array"),
      bad(chat(R"("chat_template": "{{ messages }}")"), "chat_template",
          "chat_template in the request is not supported; the model's own template is used"),
      bad(chat(R"("add_generation_prompt": "yes")"), "add_generation_prompt",
          "add_generation_prompt must be a boolean, got string"),
      bad(chat(R"("continue_final_message": true)"), "continue_final_message",
          "add_generation_prompt and continue_final_message cannot both be true; set "
          "add_generation_prompt to false to continue the final message"),
      bad(chat(R"("temperature": 3)"), "temperature", "temperature must be between 0 and 2, got 3"),
      bad(chat(R"("n": 20)"), "n", "n must be between 1 and 16, got 20"),
      bad(chat(R"("echo": true)"), "echo",
          "echo is not supported for chat completions; send false or leave it out"),
      bad(chat(R"("best_of": 3)"), "best_of",
          "best_of is not supported for chat completions; use n, or /v1/completions (1, the "
          "value of n, is accepted)"),
      bad(chat(R"("n": 2, "best_of": 3)"), "best_of",
          "best_of is not supported for chat completions; use n, or /v1/completions (2, the "
          "value of n, is accepted)"),
      bad(chat(R"("best_of": 1.0)"), "best_of",
          "best_of is not supported for chat completions; use n, or /v1/completions (1, the "
          "value of n, is accepted)"),
      bad(chat(R"("response_format": {"type": "json_schema", "json_schema": {}})"),
          "response_format.json_schema.schema", "response_format.json_schema.schema is required"),
      bad("not json", "",
          "request body is not valid JSON: parse error at line 1, column 2: syntax error while "
          "parsing value - invalid literal; last read: 'no'"),
  };
  ASSERT_GT(long_len, kMaxModelLen);
  for (const BadCase& c : cases) {
    expectRefused(parseChatCompletionRequest(c.body, testLimits(), tokenizer()), c);
  }
}

// top_logprobs 0 asks for nothing: accepted without logprobs (clients send
// it by default), as vLLM does; it gives no logprobs.
TEST_F(ProtocolTest, TopLogprobsZeroWithoutLogprobsIsAccepted) {
  for (const char* extra : {R"("top_logprobs": 0)", R"("logprobs": false, "top_logprobs": 0)"}) {
    auto parsed = parseChatCompletionRequest(chat(extra), testLimits(), tokenizer());
    ASSERT_TRUE(parsed.isOk()) << extra << ": " << parsed.error().message;
    EXPECT_FALSE(parsed.value().request.sampling.logprobs.has_value()) << extra;
  }
}

TEST_F(ProtocolTest, ChatWithoutTemplateIs400) {
  ServerLimits limits = testLimits();
  limits.chat_template = nullptr;
  expectRefused(parseChatCompletionRequest(chat(""), limits, tokenizer()),
                bad(chat(""), "messages", ChatTemplate::noTemplateMessage()));
  auto empty = ChatTemplate::create({}, {});
  ASSERT_TRUE(empty.isOk());
  limits.chat_template = *empty;
  expectRefused(parseChatCompletionRequest(chat(""), limits, tokenizer()),
                bad(chat(""), "messages", ChatTemplate::noTemplateMessage()));
}

// A limits copy whose chat template is `text`.
ServerLimits limitsWithTemplate(const std::string& text, int64_t max_model_len = 4096) {
  ServerLimits limits = testLimits();
  limits.max_model_len = max_model_len;
  auto created = ChatTemplate::create({{"default", text, "test.jinja"}},
                                      nlohmann::ordered_json{{"eos_token", "<|im_end|>"}});
  EXPECT_TRUE(created.isOk()) << created.status().toString();
  if (created.isOk()) limits.chat_template = *created;
  return limits;
}

TEST_F(ProtocolTest, ChatTemplateErrorIs400NamingTheLine) {
  const ServerLimits limits = limitsWithTemplate(
      "{% for m in messages %}\n"
      "{% if m.role not in ['user', 'assistant'] %}\n"
      "{{ raise_exception('Only user and assistant roles are supported!') }}\n"
      "{% endif %}{{ m.content }}{% endfor %}");
  auto result = parseChatCompletionRequest(chatWith(R"([{"role": "robot", "content": "x"}])"),
                                           limits, tokenizer());
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().status, 400);
  EXPECT_EQ(result.error().type, "invalid_request_error");
  EXPECT_EQ(result.error().param, "messages");
  EXPECT_EQ(result.error().message,
            "the chat template failed: line 3: Only user and assistant roles are supported!");
  // The same template renders roles it accepts.
  EXPECT_TRUE(parseChatCompletionRequest(chatWith(R"([{"role": "user", "content": "x"}])"), limits,
                                         tokenizer())
                  .isOk());
}

// The template sees what vLLM gives it: key order kept, tool-call arguments
// decoded, tools (with tool_choice "none" too: vLLM's default keeps them, so
// a conversation that switches it keeps its cached prefix), documents,
// kwargs winning.
TEST_F(ProtocolTest, ChatTemplateVariables) {
  const ServerLimits limits = limitsWithTemplate(
      "{{ messages | tojson }}|{{ tools | tojson }}|{{ documents | tojson }}|"
      "{{ add_generation_prompt }}|{{ eos_token }}|{{ flavor | default('plain') }}");
  struct Case {
    std::string body;
    std::string text;
  };
  const std::string tool = R"({"type": "function", "function": {"name": "f"}})";
  const Case cases[] = {
      {chatWith(R"([{"role": "user", "z": 1, "content": "hi", "a": 2}])"),
       R"([{"role": "user", "z": 1, "content": "hi", "a": 2}]|null|null|True|<|im_end|>|plain)"},
      {chatWith(R"([{"role": "assistant", "content": null, "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}},
          {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
          {"id": "c3", "type": "function", "function": {"name": "h", "arguments": ""}},
          {"id": "c4", "type": "function", "function": {"name": "k", "arguments": {"x": 1}}}]}])"),
       R"([{"role": "assistant", "content": "", "tool_calls": [)"
       R"({"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [2]}}}, )"
       R"({"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}, )"
       R"({"id": "c3", "type": "function", "function": {"name": "h", "arguments": {}}}, )"
       R"({"id": "c4", "type": "function", "function": {"name": "k", "arguments": {"x": 1}}}]}])"
       R"(|null|null|True|<|im_end|>|plain)"},
      {chat(R"("tools": [)" + tool + "]"),
       R"([{"role": "user", "content": "Hi"}]|[{"type": "function", "function": {"name": "f"}}]|)"
       R"(null|True|<|im_end|>|plain)"},
      {chat(R"("tools": [)" + tool + R"(], "tool_choice": "auto")"),
       R"([{"role": "user", "content": "Hi"}]|[{"type": "function", "function": {"name": "f"}}]|)"
       R"(null|True|<|im_end|>|plain)"},
      {chat(R"("tools": [)" + tool + R"(], "tool_choice": "none")"),
       R"([{"role": "user", "content": "Hi"}]|[{"type": "function", "function": {"name": "f"}}]|)"
       R"(null|True|<|im_end|>|plain)"},
      {chat(R"("documents": [{"title": "t", "text": "x"}], "add_generation_prompt": false,
          "chat_template_kwargs": {"flavor": "spicy", "eos_token": "E"})"),
       R"([{"role": "user", "content": "Hi"}]|null|[{"title": "t", "text": "x"}]|False|E|spicy)"},
      {chatWith(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
          {"type": "text", "text": "b"}]}])"),
       R"([{"role": "user", "content": "a\nb"}]|null|null|True|<|im_end|>|plain)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto parsed = parseChatCompletionRequest(c.body, limits, tokenizer());
    ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
    EXPECT_EQ(parsed.value().prompt_text, c.text);
  }
}

// OpenAI's reasoning_effort reaches the template as the variable of that
// name (gpt-oss's template reads it); chat_template_kwargs win over it.
TEST_F(ProtocolTest, ReasoningEffortReachesTheTemplate) {
  const ServerLimits limits = limitsWithTemplate("{{ reasoning_effort | default('unset') }}");
  const std::pair<std::string, std::string> cases[] = {
      {chat(""), "unset"},
      {chat(R"("reasoning_effort": "high")"), "high"},
      {chat(R"("reasoning_effort": null)"), "unset"},
      {chat(R"("reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"})"),
       "low"}};
  for (const auto& [body, text] : cases) {
    auto parsed = parseChatCompletionRequest(body, limits, tokenizer());
    ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
    EXPECT_EQ(parsed.value().prompt_text, text) << body;
  }
  auto refused = parseChatCompletionRequest(chat(R"("reasoning_effort": 3)"), limits, tokenizer());
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "reasoning_effort");
}

// max_completion_tokens bounds a completion too (api.md lists it for both
// endpoints; it was ignored on /v1/completions), and the neutral values of
// the fields refused when set pass.
TEST_F(ProtocolTest, CompletionsTakeMaxCompletionTokensAndNeutralValues) {
  auto parsed = parseCompletionRequest(completion(R"("max_completion_tokens": 3)"), testLimits(),
                                       tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_EQ(parsed.value().request.sampling.max_tokens, 3);
  auto refused = parseCompletionRequest(completion(R"("max_completion_tokens": -1)"), testLimits(),
                                        tokenizer());
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "max_completion_tokens");
  auto neutral = parseChatCompletionRequest(
      chat(R"("use_beam_search": false, "logits_processors": [], "detokenize": true,
          "modalities": ["text"], "audio": null, "functions": [], "function_call": "none",
          "prediction": {"type": "content", "content": "x"})"),
      testLimits(), tokenizer());
  EXPECT_TRUE(neutral.isOk()) << neutral.error().message;
  // best_of equal to n asks for nothing more.
  for (const char* fields : {R"("best_of": 1)", R"("n": 2, "best_of": 2)", R"("best_of": null)"}) {
    SCOPED_TRACE(fields);
    auto parsed = parseChatCompletionRequest(chat(fields), testLimits(), tokenizer());
    ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
    EXPECT_EQ(parsed.value().best_of, parsed.value().n);
  }
}

// Every choice of every prompt carries its prompt's logprobs: what a small
// body asks for is bounded (prompt tokens x (prompt_logprobs + 1) x n,
// summed over the prompts), on both endpoints and for echo's too. Before, a
// 99 KB body made a 369 MB answer.
TEST_F(ProtocolTest, PromptLogprobEntriesAreBounded) {
  ServerLimits limits = testLimits();
  limits.max_model_len = 100000;
  limits.max_logprobs = 20;
  auto ids = [](int count) {
    std::string text = "[";
    for (int i = 0; i < count; ++i) text += (i ? ",7" : "7");
    return text + "]";
  };
  auto body = [&](int tokens, const std::string& fields) {
    return R"({"model": "tiny-model", "prompt": )" + ids(tokens) + ", " + fields + "}";
  };
  // 3,120 x 21 x 16 = 1,048,320 entries: the most, nearly.
  auto most =
      parseCompletionRequest(body(3120, R"("prompt_logprobs": 20, "n": 16)"), limits, tokenizer());
  EXPECT_TRUE(most.isOk()) << most.error().message;
  expectRefused(
      parseCompletionRequest(body(3121, R"("prompt_logprobs": 20, "n": 16)"), limits, tokenizer()),
      bad(body(3121, ""), "prompt_logprobs",
          "prompt_logprobs asks for 1048656 prompt logprob entries (prompt tokens x 21 per "
          "position x n, summed over the prompts); at most 1048576 are answered in one request "
          "(ask for fewer alternatives, choices or prompts)"));
  // Summed over a batch's prompts: 16 prompts of 700 tokens, n = 16.
  std::string batch = R"({"model": "tiny-model", "prompt": [)";
  for (int i = 0; i < 16; ++i) batch += (i ? "," : "") + ids(700);
  batch += R"(], "prompt_logprobs": 5, "n": 16})";
  auto refused = parseCompletionRequest(batch, limits, tokenizer());
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().param, "prompt_logprobs");
  // Completions' echo with logprobs asks for them too.
  auto echoed = parseCompletionRequest(body(50000, R"("echo": true, "logprobs": 20, "n": 2)"),
                                       limits, tokenizer());
  ASSERT_FALSE(echoed.isOk());
  EXPECT_EQ(echoed.error().param, "echo");
  // Chat.
  std::string long_text;
  for (int i = 0; i < 5000; ++i) long_text += "Hello world ";
  auto chatted = parseChatCompletionRequest(
      R"({"model": "tiny-model", "messages": [{"role": "user", "content": ")" + long_text +
          R"("}], "prompt_logprobs": 20, "n": 16})",
      limits, tokenizer());
  ASSERT_FALSE(chatted.isOk());
  EXPECT_EQ(chatted.error().param, "prompt_logprobs") << chatted.error().message;
}

// A template that loops over content gets the parts as a list (vLLM's
// "openai" content format).
TEST_F(ProtocolTest, ChatContentPartsForTemplatesThatIterate) {
  const ServerLimits limits = limitsWithTemplate(
      "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
      "{% for part in m['content'] %}<{{ part.text }}>{% endfor %}{% endif %}{% endfor %}");
  auto parsed = parseChatCompletionRequest(
      chatWith(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
          {"type": "text", "text": "b"}]}, {"role": "user", "content": "c"}])"),
      limits, tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_EQ(parsed.value().prompt_text, "<a><b>c");
}

// strftime_now shows chat_template_time when given; without it, the clock's
// local time, which the parsed body then carries so that every server the
// router forwards it to renders the same prompt. Anything but such a time is
// a 400 naming the field.
TEST_F(ProtocolTest, ChatTemplateTimeIsWhatStrftimeNowShowsAndTravelsWithTheBody) {
  const ServerLimits limits =
      limitsWithTemplate("{{ strftime_now('%d %b %Y %H:%M:%S') }}|{{ messages[0].content }}");
  auto pinned = parseChatCompletionRequest(chat(R"("chat_template_time": "2031-12-25T23:59:07")"),
                                           limits, tokenizer());
  ASSERT_TRUE(pinned.isOk()) << pinned.error().message;
  EXPECT_EQ(pinned.value().prompt_text, "25 Dec 2031 23:59:07|Hi");
  EXPECT_EQ(pinned.value().body["chat_template_time"], "2031-12-25T23:59:07");
  auto spaced = parseChatCompletionRequest(chat(R"("chat_template_time": "2024-02-29 00:01")"),
                                           limits, tokenizer());
  ASSERT_TRUE(spaced.isOk()) << spaced.error().message;
  EXPECT_EQ(spaced.value().prompt_text, "29 Feb 2024 00:01:00|Hi");
  EXPECT_EQ(spaced.value().body["chat_template_time"], "2024-02-29 00:01");

  // Unpinned: the body carries the time shown, and rendering that body
  // again gives the same prompt.
  auto clock = parseChatCompletionRequest(chat(""), limits, tokenizer());
  ASSERT_TRUE(clock.isOk()) << clock.error().message;
  const auto& shown = clock.value().body["chat_template_time"];
  ASSERT_TRUE(shown.is_string()) << clock.value().body.dump();
  const auto time = jinja::parseNaiveTime(shown.get<std::string>());
  ASSERT_TRUE(time.has_value()) << shown;
  const std::time_t seconds = std::chrono::system_clock::to_time_t(*time);
  std::tm fields{};
  gmtime_r(&seconds, &fields);
  char expected[32];
  std::strftime(expected, sizeof(expected), "%d %b %Y %H:%M:%S|Hi", &fields);
  EXPECT_EQ(clock.value().prompt_text, expected);
  auto again = parseChatCompletionRequest(clock.value().body.dump(), limits, tokenizer());
  ASSERT_TRUE(again.isOk()) << again.error().message;
  EXPECT_EQ(again.value().prompt_text, clock.value().prompt_text);
  EXPECT_EQ(again.value().body["chat_template_time"], shown);

  const std::string accepted = R"(chat_template_time must be a time such as "2025-03-07T09:05:03")";
  for (const auto& [value, got] : std::vector<std::pair<std::string, std::string>>{
           {R"("tomorrow")", R"(, got "tomorrow")"},
           {R"("2025-13-01T00:00:00")", R"(, got "2025-13-01T00:00:00")"},
           {R"("2025-03-07T09:05:03Z")", R"(, got "2025-03-07T09:05:03Z")"},
           {"1741338303", ", got number"}}) {
    SCOPED_TRACE(value);
    auto refused =
        parseChatCompletionRequest(chat(R"("chat_template_time": )" + value), limits, tokenizer());
    ASSERT_FALSE(refused.isOk());
    EXPECT_EQ(refused.error().status, 400);
    EXPECT_EQ(refused.error().param, "chat_template_time");
    EXPECT_EQ(refused.error().message, accepted + got);
  }
}

TEST_F(ProtocolTest, ChatRendersTemplateAndEncodes) {
  ServerLimits limits = testLimits();
  limits.max_model_len = 256;
  auto parsed = parseChatCompletionRequest(chatWith(R"([{"role": "system", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Line one"},
                                       {"type": "text", "text": "line two"}]},
          {"role": "assistant", "content": "Ok."},
          {"role": "user", "content": "And the café?", "name": "ignored"}])"),
                                           limits, tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  // Text parts are joined with "\n", as vLLM does for string-content templates.
  const std::string expected_text =
      "<|im_start|>system\nBe brief.<|im_end|>\n"
      "<|im_start|>user\nLine one\nline two<|im_end|>\n"
      "<|im_start|>assistant\nOk.<|im_end|>\n"
      "<|im_start|>user\nAnd the café?<|im_end|>\n"
      "<|im_start|>assistant\n";
  const ParsedRequest& request = parsed.value();
  EXPECT_TRUE(request.chat);
  EXPECT_EQ(request.prompt_text, expected_text);
  EXPECT_EQ(request.request.prompt, tokenizer().encode(expected_text));
  // ChatML markers are single special tokens.
  EXPECT_EQ(request.request.prompt.front(), *tokenizer().tokenToId("<|im_start|>"));
  EXPECT_EQ(request.request.sampling.max_tokens,
            256 - static_cast<int64_t>(request.request.prompt.size()));
  EXPECT_FALSE(request.request.sampling.logprobs.has_value());
}

TEST_F(ProtocolTest, ChatOptions) {
  struct Case {
    std::string extra;
    void (*check)(const ParsedRequest&);
  };
  const Case cases[] = {
      {R"("logprobs": true)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.logprobs, 0); }},
      {R"("logprobs": true, "top_logprobs": 5)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.logprobs, 5); }},
      {R"("logprobs": false)",
       [](const ParsedRequest& r) { EXPECT_FALSE(r.request.sampling.logprobs.has_value()); }},
      // max_completion_tokens wins over max_tokens.
      {R"("max_completion_tokens": 7, "max_tokens": 3)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.max_tokens, 7); }},
      {R"("max_tokens": 3)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.request.sampling.max_tokens, 3); }},
      {R"("add_generation_prompt": false)",
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.prompt_text, "<|im_start|>user\nHi<|im_end|>\n");
       }},
      {R"("add_generation_prompt": false, "continue_final_message": true)",
       [](const ParsedRequest& r) { EXPECT_EQ(r.prompt_text, "<|im_start|>user\nHi"); }},
      {R"("tools": [], "tool_choice": "none", "stream": true,
          "stream_options": {"include_usage": true}, "kv_transfer_params": {"a": 1})",
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.stream);
         EXPECT_TRUE(r.include_usage);
         EXPECT_EQ(r.kv_transfer_params, json({{"a", 1}}));
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra);
    auto parsed = parseChatCompletionRequest(chat(c.extra), testLimits(), tokenizer());
    ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
    EXPECT_EQ(parsed.value().request.prompt, tokenizer().encode(parsed.value().prompt_text));
    c.check(parsed.value());
  }
}

// ---------------------------------------------------------------------------
// Responses

class ResponseTest : public ProtocolTest {
 protected:
  static TokenId id(const std::string& byte_level_token) {
    const auto found = tokenizer().tokenToId(byte_level_token);
    EXPECT_TRUE(found.has_value()) << byte_level_token;
    return found.value_or(0);
  }

  static engine::GeneratedToken token(TokenId token_id, float logprob,
                                      std::vector<engine::TokenLogprob> top = {}) {
    engine::GeneratedToken generated;
    generated.token = token_id;
    generated.logprob = logprob;
    generated.top = std::move(top);
    return generated;
  }

  static ResponseMeta meta(bool chat, std::optional<int32_t> logprobs) {
    ResponseMeta m;
    m.id = chat ? "chatcmpl-req-1" : "cmpl-req-1";
    m.created = 1700000000;
    m.model = "tiny-model";
    m.chat = chat;
    m.logprobs = logprobs;
    return m;
  }
};

TEST_F(ResponseTest, MetaFromRequest) {
  auto parsed =
      parseChatCompletionRequest(chat(R"("logprobs": true, "top_logprobs": 2, "stream": true,
          "stream_options": {"include_usage": true}, "skip_special_tokens": false,
          "kv_transfer_params": {"x": 1})"),
                                 testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  const ResponseMeta m = makeResponseMeta(parsed.value(), "abc", 42);
  EXPECT_EQ(m.id, "chatcmpl-abc");
  EXPECT_EQ(m.created, 42);
  EXPECT_EQ(m.model, "tiny-model");
  EXPECT_TRUE(m.chat);
  EXPECT_EQ(m.logprobs, 2);
  EXPECT_TRUE(m.include_usage);
  EXPECT_FALSE(m.skip_special_tokens);
  EXPECT_EQ(m.kv_transfer_params, json({{"x", 1}}));

  auto completion_request = parseCompletionRequest(completion(""), testLimits(), tokenizer());
  ASSERT_TRUE(completion_request.isOk());
  EXPECT_EQ(makeResponseMeta(completion_request.value(), "abc", 42).id, "cmpl-abc");
}

TEST_F(ResponseTest, LogprobTokenText) {
  // "Ã" and "©" are the byte-level spellings of the bytes 0xC3 and 0xA9, the
  // two halves of "é".
  EXPECT_EQ(tokenizer().tokenBytes(id("Ã")), "\xc3");
  EXPECT_EQ(logprobTokenText(tokenizer(), id("Ã")), "bytes:\\xc3");
  EXPECT_EQ(logprobTokenText(tokenizer(), id("©")), "bytes:\\xa9");
  const TokenId hello = tokenizer().encode("Hello").front();
  EXPECT_EQ(logprobTokenText(tokenizer(), hello), tokenizer().tokenBytes(hello));
  EXPECT_EQ(logprobTokenText(tokenizer(), id("<|im_end|>")), "<|im_end|>");
}

TEST_F(ResponseTest, AppendOutputMergesSteps) {
  engine::RequestOutput first;
  first.request_id = "r";
  first.tokens = {token(1, -0.5f)};
  first.text = "He";
  first.num_prompt_tokens = 5;
  first.num_cached_tokens = 2;
  first.num_generated_tokens = 1;
  engine::RequestOutput last;
  last.request_id = "r";
  last.tokens = {token(2, -0.25f), token(3, -1.0f)};
  last.text = "llo";
  last.finish_reason = engine::FinishReason::kLength;
  last.num_prompt_tokens = 5;
  last.num_cached_tokens = 2;
  last.num_generated_tokens = 3;

  engine::RequestOutput total;
  appendOutput(total, first);
  appendOutput(total, last);
  EXPECT_EQ(total.request_id, "r");
  EXPECT_EQ(total.text, "Hello");
  ASSERT_EQ(total.tokens.size(), 3u);
  EXPECT_EQ(total.tokens[0].token, 1);
  EXPECT_EQ(total.tokens[2].token, 3);
  EXPECT_EQ(total.finish_reason, engine::FinishReason::kLength);
  EXPECT_EQ(total.num_prompt_tokens, 5);
  EXPECT_EQ(total.num_cached_tokens, 2);
  EXPECT_EQ(total.num_generated_tokens, 3);
}

// The output of "café" split as "caf" + 0xC3 + 0xA9, with logprobs.
engine::RequestOutput cafeOutput(const Tokenizer& tokenizer, TokenId c3, TokenId a9) {
  engine::RequestOutput output;
  for (TokenId t : tokenizer.encode("caf")) output.tokens.push_back({t, -0.5f, {}});
  output.tokens.push_back({c3, -0.25f, {{c3, -0.25f}, {a9, -2.0f}}});
  output.tokens.push_back({a9, -std::numeric_limits<float>::infinity(), {{c3, -0.125f}}});
  output.text = "café";
  output.finish_reason = engine::FinishReason::kStop;
  output.num_prompt_tokens = 7;
  output.num_cached_tokens = 4;
  output.num_generated_tokens = static_cast<int64_t>(output.tokens.size());
  return output;
}

TEST_F(ResponseTest, CompletionResponseShape) {
  engine::RequestOutput output = cafeOutput(tokenizer(), id("Ã"), id("©"));
  ResponseMeta m = meta(/*chat=*/false, /*logprobs=*/1);
  m.kv_transfer_params = {{"remote_block_ids", {1, 2}}};
  const json response = completionResponse(m, output, tokenizer());

  EXPECT_EQ(response["id"], "cmpl-req-1");
  EXPECT_EQ(response["object"], "text_completion");
  EXPECT_EQ(response["created"], 1700000000);
  EXPECT_EQ(response["model"], "tiny-model");
  ASSERT_EQ(response["choices"].size(), 1u);
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["text"], "café");
  EXPECT_EQ(choice["finish_reason"], "stop");

  const std::vector<TokenId> caf = tokenizer().encode("caf");
  const size_t n = caf.size() + 2;
  const json& logprobs = choice["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), n);
  ASSERT_EQ(logprobs["token_logprobs"].size(), n);
  ASSERT_EQ(logprobs["top_logprobs"].size(), n);
  ASSERT_EQ(logprobs["text_offset"].size(), n);
  int64_t offset = 0;
  for (size_t i = 0; i < caf.size(); ++i) {
    const std::string text = tokenizer().tokenBytes(caf[i]);
    EXPECT_EQ(logprobs["tokens"][i], text);
    EXPECT_EQ(logprobs["token_logprobs"][i], -0.5);
    // The sampled token is always among top_logprobs.
    EXPECT_EQ(logprobs["top_logprobs"][i], json({{text, -0.5}}));
    EXPECT_EQ(logprobs["text_offset"][i], offset);
    offset += static_cast<int64_t>(text.size());
  }
  EXPECT_EQ(offset, 3);
  // Both halves of "é" sit at the character's offset.
  EXPECT_EQ(logprobs["tokens"][n - 2], "bytes:\\xc3");
  EXPECT_EQ(logprobs["tokens"][n - 1], "bytes:\\xa9");
  EXPECT_EQ(logprobs["text_offset"][n - 2], 3);
  EXPECT_EQ(logprobs["text_offset"][n - 1], 3);
  EXPECT_EQ(logprobs["token_logprobs"][n - 2], -0.25);
  // -inf is reported as -9999 (JSON has no infinity).
  EXPECT_EQ(logprobs["token_logprobs"][n - 1], -9999.0);
  // logprobs=1: one alternative, plus the sampled token when it is not it.
  EXPECT_EQ(logprobs["top_logprobs"][n - 2], json({{"bytes:\\xc3", -0.25}}));
  EXPECT_EQ(logprobs["top_logprobs"][n - 1],
            json({{"bytes:\\xc3", -0.125}, {"bytes:\\xa9", -9999.0}}));

  EXPECT_EQ(response["usage"],
            json::parse(R"({"prompt_tokens": 7, "completion_tokens": )" + std::to_string(n) +
                        R"(, "total_tokens": )" + std::to_string(n + 7) +
                        R"(, "prompt_tokens_details": {"cached_tokens": 4}})"));
  EXPECT_EQ(response["kv_transfer_params"], json::parse(R"({"remote_block_ids": [1, 2]})"));
  EXPECT_EQ(response.size(), 7u);  // id object created model choices usage kv_transfer_params
}

TEST_F(ResponseTest, CompletionResponseWithoutLogprobs) {
  engine::RequestOutput output;
  output.text = "Hi";
  output.tokens = {token(1, 0.0f)};
  output.finish_reason = engine::FinishReason::kLength;
  output.num_prompt_tokens = 3;
  output.num_generated_tokens = 1;
  const json response = completionResponse(meta(false, std::nullopt), output, tokenizer());
  EXPECT_EQ(response["choices"], json::parse(R"([{"index": 0, "text": "Hi", "logprobs": null,
      "finish_reason": "length", "stop_reason": null}])"));
  EXPECT_FALSE(response.contains("kv_transfer_params"));
  EXPECT_EQ(response["usage"]["total_tokens"], 4);
}

TEST_F(ResponseTest, ChatCompletionResponseShape) {
  engine::RequestOutput output = cafeOutput(tokenizer(), id("Ã"), id("©"));
  const json response =
      chatCompletionResponse(meta(/*chat=*/true, /*logprobs=*/2), output, tokenizer());
  EXPECT_EQ(response["id"], "chatcmpl-req-1");
  EXPECT_EQ(response["object"], "chat.completion");
  EXPECT_EQ(response["created"], 1700000000);
  EXPECT_EQ(response["model"], "tiny-model");
  ASSERT_EQ(response["choices"].size(), 1u);
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"], json::parse(R"({"role": "assistant", "content": "café"})"));
  EXPECT_EQ(choice["finish_reason"], "stop");
  const json& content = choice["logprobs"]["content"];
  const size_t n = output.tokens.size();
  ASSERT_EQ(content.size(), n);
  const std::string first = tokenizer().tokenBytes(output.tokens[0].token);
  json first_bytes = json::array();
  for (char c : first) first_bytes.push_back(static_cast<unsigned char>(c));
  EXPECT_EQ(content[0], json({{"token", first},
                              {"logprob", -0.5},
                              {"bytes", first_bytes},
                              {"top_logprobs", json::array()}}));
  EXPECT_EQ(content[n - 2], json::parse(R"({"token": "bytes:\\xc3", "logprob": -0.25,
      "bytes": [195], "top_logprobs": [
        {"token": "bytes:\\xc3", "logprob": -0.25, "bytes": [195]},
        {"token": "bytes:\\xa9", "logprob": -2.0, "bytes": [169]}]})"));
  EXPECT_EQ(content[n - 1], json::parse(R"({"token": "bytes:\\xa9", "logprob": -9999.0,
      "bytes": [169], "top_logprobs": [
        {"token": "bytes:\\xc3", "logprob": -0.125, "bytes": [195]}]})"));
  EXPECT_EQ(response["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(response["usage"]["completion_tokens"], n);
  EXPECT_EQ(response["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_FALSE(response.contains("kv_transfer_params"));
}

TEST_F(ResponseTest, ChatCompletionResponseWithoutLogprobs) {
  engine::RequestOutput output;
  output.text = "Sure.";
  output.finish_reason = engine::FinishReason::kAbort;
  const json response = chatCompletionResponse(meta(true, std::nullopt), output, tokenizer());
  EXPECT_EQ(response["choices"], json::parse(R"([{"index": 0,
      "message": {"role": "assistant", "content": "Sure."}, "logprobs": null,
      "finish_reason": "abort", "stop_reason": null}])"));
}

TEST_F(ResponseTest, CompletionChunks) {
  ResponseMeta m = meta(false, 0);
  m.include_usage = true;
  StreamState state;
  const TokenId c3 = id("Ã");
  const TokenId a9 = id("©");
  const std::vector<TokenId> caf = tokenizer().encode("caf");

  engine::RequestOutput step;
  for (TokenId t : caf) step.tokens.push_back(token(t, -0.5f));
  step.text = "caf";
  auto chunk = completionChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ((*chunk)["id"], "cmpl-req-1");
  EXPECT_EQ((*chunk)["object"], "text_completion");
  EXPECT_EQ((*chunk)["created"], 1700000000);
  EXPECT_EQ((*chunk)["model"], "tiny-model");
  EXPECT_TRUE((*chunk)["usage"].is_null());
  ASSERT_EQ((*chunk)["choices"].size(), 1u);
  const json& choice = (*chunk)["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["text"], "caf");
  EXPECT_TRUE(choice["finish_reason"].is_null());
  EXPECT_EQ(choice["logprobs"]["text_offset"].front(), 0);
  EXPECT_EQ(state.text_chars.chars, 3);

  // The first half of "é": no text yet (the detokenizer holds it back) but
  // logprobs were asked for, so a chunk goes out; offsets continue.
  step = {};
  step.tokens = {token(c3, -0.25f)};
  chunk = completionChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ((*chunk)["choices"][0]["text"], "");
  EXPECT_EQ((*chunk)["choices"][0]["logprobs"]["text_offset"], json({3}));
  EXPECT_EQ((*chunk)["choices"][0]["logprobs"]["tokens"], json({"bytes:\\xc3"}));

  step = {};
  step.tokens = {token(a9, -0.75f)};
  step.text = "é";
  step.finish_reason = engine::FinishReason::kLength;
  chunk = completionChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ((*chunk)["choices"][0], nlohmann::ordered_json::parse(R"({"index": 0, "text": "é",
      "logprobs": {"tokens": ["bytes:\\xa9"], "token_logprobs": [-0.75],
                   "top_logprobs": [{"bytes:\\xa9": -0.75}], "text_offset": [3]},
      "finish_reason": "length", "stop_reason": null})"));
}

TEST_F(ResponseTest, CompletionChunkSkipsEmptySteps) {
  StreamState state;
  engine::RequestOutput step;
  step.tokens = {token(5, -1.0f)};  // text held back, no logprobs asked for
  EXPECT_FALSE(completionChunk(meta(false, std::nullopt), step, tokenizer(), state).has_value());
  // A finish with no new text still goes out, without "usage" when not asked.
  step.finish_reason = engine::FinishReason::kStop;
  auto chunk = completionChunk(meta(false, std::nullopt), step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_FALSE(chunk->contains("usage"));
  EXPECT_EQ((*chunk)["choices"],
            nlohmann::ordered_json::parse(R"([{"index": 0, "text": "", "logprobs": null,
      "finish_reason": "stop", "stop_reason": null}])"));
}

TEST_F(ResponseTest, ChatChunks) {
  const ResponseMeta m = meta(true, std::nullopt);
  StreamState state;
  engine::RequestOutput step;

  // First chunk: the role, even with no text yet.
  auto chunk = chatCompletionChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ((*chunk)["id"], "chatcmpl-req-1");
  EXPECT_EQ((*chunk)["object"], "chat.completion.chunk");
  EXPECT_EQ((*chunk)["created"], 1700000000);
  EXPECT_EQ((*chunk)["model"], "tiny-model");
  EXPECT_FALSE(chunk->contains("usage"));
  EXPECT_EQ((*chunk)["choices"], nlohmann::ordered_json::parse(R"([{"index": 0,
      "delta": {"role": "assistant", "content": ""}, "logprobs": null,
      "finish_reason": null, "stop_reason": null}])"));
  EXPECT_TRUE(state.role_sent);

  // Nothing new: no chunk.
  EXPECT_FALSE(chatCompletionChunk(m, step, tokenizer(), state).has_value());

  step.text = "Hello";
  chunk = chatCompletionChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ((*chunk)["choices"],
            nlohmann::ordered_json::parse(R"([{"index": 0, "delta": {"content": "Hello"},
      "logprobs": null, "finish_reason": null, "stop_reason": null}])"));

  step.text = "";
  step.finish_reason = engine::FinishReason::kStop;
  chunk = chatCompletionChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ((*chunk)["choices"], nlohmann::ordered_json::parse(R"([{"index": 0, "delta": {},
      "logprobs": null, "finish_reason": "stop", "stop_reason": null}])"));
}

TEST_F(ResponseTest, ChatChunkFirstWithTextAndLogprobs) {
  ResponseMeta m = meta(true, 1);
  m.include_usage = true;
  StreamState state;
  engine::RequestOutput step;
  const TokenId c3 = id("Ã");
  step.tokens = {token(c3, -0.25f, {{c3, -0.25f}})};
  step.text = "x";
  auto chunk = streamChunk(m, step, tokenizer(), state);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_TRUE((*chunk)["usage"].is_null());
  EXPECT_EQ((*chunk)["choices"], nlohmann::ordered_json::parse(R"([{"index": 0,
      "delta": {"role": "assistant", "content": "x"},
      "logprobs": {"content": [{"token": "bytes:\\xc3", "logprob": -0.25, "bytes": [195],
          "top_logprobs": [{"token": "bytes:\\xc3", "logprob": -0.25, "bytes": [195]}]}]},
      "finish_reason": null, "stop_reason": null}])"));
}

TEST_F(ResponseTest, FinishReasonNames) {
  const std::pair<engine::FinishReason, const char*> reasons[] = {
      {engine::FinishReason::kStop, "stop"},
      {engine::FinishReason::kLength, "length"},
      {engine::FinishReason::kAbort, "abort"},
      {engine::FinishReason::kError, "error"},
  };
  for (const auto& [reason, name] : reasons) {
    StreamState state;
    engine::RequestOutput step;
    step.finish_reason = reason;
    auto chunk = streamChunk(meta(false, std::nullopt), step, tokenizer(), state);
    ASSERT_TRUE(chunk.has_value());
    EXPECT_EQ((*chunk)["choices"][0]["finish_reason"], name);
  }
}

TEST_F(ResponseTest, UsageChunk) {
  engine::RequestOutput last;
  last.num_prompt_tokens = 10;
  last.num_cached_tokens = 8;
  last.num_generated_tokens = 4;
  EXPECT_EQ(usageChunk(meta(true, std::nullopt), last),
            nlohmann::ordered_json::parse(R"({"id": "chatcmpl-req-1",
      "object": "chat.completion.chunk", "created": 1700000000, "model": "tiny-model",
      "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
      "prompt_tokens_details": {"cached_tokens": 8}}})"));
  EXPECT_EQ(usageChunk(meta(false, std::nullopt), last)["object"], "text_completion");
}

// stream_options.continuous_usage_stats (with include_usage, as vLLM reads
// it): every chunk carries the usage so far, in both APIs.
TEST_F(ResponseTest, ContinuousUsageStatsPutTheUsageSoFarInEveryChunk) {
  const std::string options = R"("stream": true, "stream_options": {"include_usage": true,
      "continuous_usage_stats": true})";
  auto parsed = parseChatCompletionRequest(
      R"({"model": "tiny-model", "messages": [{"role": "user", "content": "Hi"}], )" + options +
          "}",
      testLimits(), tokenizer());
  ASSERT_TRUE(parsed.isOk()) << parsed.error().message;
  EXPECT_TRUE(parsed.value().continuous_usage);
  auto without_usage = parseCompletionRequest(
      R"({"model": "tiny-model", "prompt": "Hi", "stream": true,
          "stream_options": {"continuous_usage_stats": true}})",
      testLimits(), tokenizer());
  ASSERT_TRUE(without_usage.isOk()) << without_usage.error().message;
  EXPECT_FALSE(without_usage.value().continuous_usage);
  EXPECT_FALSE(without_usage.value().include_usage);

  engine::RequestOutput step;
  step.num_prompt_tokens = 10;
  step.num_cached_tokens = 8;
  step.num_generated_tokens = 3;
  step.tokens = {token(tokenizer().encode("caf")[0], 0.0f)};
  step.text = "c";
  const json usage = json::parse(R"({"prompt_tokens": 10, "completion_tokens": 3,
      "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 8}})");
  for (const bool chat : {true, false}) {
    ResponseMeta m = makeResponseMeta(parsed.value(), "req-1", 1);
    m.chat = chat;
    StreamState state;
    auto chunk = streamChunk(m, step, tokenizer(), state);
    ASSERT_TRUE(chunk.has_value());
    EXPECT_EQ(json::parse(chunk->dump())["usage"], usage) << chat;
    m.continuous_usage = false;
    chunk = streamChunk(m, step, tokenizer(), state);
    ASSERT_TRUE(chunk.has_value());
    EXPECT_TRUE((*chunk)["usage"].is_null()) << chat;
  }
}

TEST(Sse, FramingBytes) {
  EXPECT_EQ(sseEvent(json::parse(R"({"b": "x y", "a": [1, 2.5, null]})")),
            "data: {\"a\":[1,2.5,null],\"b\":\"x y\"}\n\n");
  // Newlines inside strings are escaped, so an event is always one line.
  EXPECT_EQ(sseEvent(json{{"text", "a\nb"}}), "data: {\"text\":\"a\\nb\"}\n\n");
  // Invalid UTF-8 becomes U+FFFD instead of failing.
  EXPECT_EQ(sseEvent(json{{"text", std::string("a\xff")}}),
            "data: {\"text\":\"a\xef\xbf\xbd\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

// ---------------------------------------------------------------------------
// /tokenize and /detokenize

TEST_F(ProtocolTest, TokenizePrompt) {
  auto result = tokenizeResponse(R"({"model": "tiny-model", "prompt": "Hello world"})",
                                 testLimits(), tokenizer());
  ASSERT_TRUE(result.isOk()) << result.error().message;
  const std::vector<TokenId> ids = tokenizer().encode("Hello world", true);
  EXPECT_EQ(result.value(), json({{"count", ids.size()}, {"max_model_len", 64}, {"tokens", ids}}));

  // model is optional; token_strs are vocabulary spellings.
  result = tokenizeResponse(R"({"prompt": "Hello world", "return_token_strs": true,
      "add_special_tokens": false})",
                            testLimits(), tokenizer());
  ASSERT_TRUE(result.isOk()) << result.error().message;
  json strs = json::array();
  for (TokenId t : ids) strs.push_back(*tokenizer().idToToken(t));
  EXPECT_EQ(result.value()["token_strs"], strs);
  EXPECT_EQ(result.value()["tokens"], ids);
}

TEST_F(ProtocolTest, TokenizeMessages) {
  auto result = tokenizeResponse(R"({"messages": [{"role": "user", "content": "Hi"}]})",
                                 testLimits(), tokenizer());
  ASSERT_TRUE(result.isOk()) << result.error().message;
  const auto ids = tokenizer().encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(result.value()["tokens"], ids);
  EXPECT_EQ(result.value()["count"], ids.size());

  result = tokenizeResponse(
      R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false})",
      testLimits(), tokenizer());
  ASSERT_TRUE(result.isOk()) << result.error().message;
  EXPECT_EQ(result.value()["tokens"], tokenizer().encode("<|im_start|>user\nHi<|im_end|>\n"));
}

TEST_F(ProtocolTest, TokenizeRefusesBadInput) {
  const std::vector<BadCase> cases = {
      bad("{x", "",
          "request body is not valid JSON: parse error at line 1, column 2: syntax error while "
          "parsing object key - invalid literal; last read: '{x'; expected string literal"),
      bad("{}", "prompt", "prompt or messages is required"),
      bad(R"({"prompt": "a", "messages": []})", "messages",
          "prompt and messages cannot both be given; send one"),
      bad(R"({"prompt": 5})", "prompt", "prompt must be a string, got number"),
      bad(R"({"prompt": "a", "add_special_tokens": 1})", "add_special_tokens",
          "add_special_tokens must be a boolean, got number"),
      bad(R"({"prompt": "a", "return_token_strs": "yes"})", "return_token_strs",
          "return_token_strs must be a boolean, got string"),
      bad(R"({"messages": [{"role": "user"}]})", "messages[0].content",
          "messages[0].content is required (a string or an array of text parts; null only in an "
          "assistant or tool message)"),
      bad(R"({"messages": "hi"})", "messages", "messages must be an array, got string"),
      BadCase{R"({"model": "x", "prompt": "a"})", 404, "not_found_error", "model",
              "model \"x\" does not exist; this server serves \"tiny-model\""},
  };
  for (const BadCase& c : cases)
    expectRefused(tokenizeResponse(c.body, testLimits(), tokenizer()), c);
}

TEST_F(ProtocolTest, Detokenize) {
  const auto ids = tokenizer().encode("Hello <|im_end|> world");
  auto result = detokenizeResponse(R"({"model": "tiny-model", "tokens": )" + json(ids).dump() + "}",
                                   testLimits(), tokenizer());
  ASSERT_TRUE(result.isOk()) << result.error().message;
  // Special tokens are kept.
  EXPECT_EQ(result.value(), json({{"prompt", "Hello <|im_end|> world"}}));

  result = detokenizeResponse(R"({"tokens": []})", testLimits(), tokenizer());
  ASSERT_TRUE(result.isOk());
  EXPECT_EQ(result.value(), json({{"prompt", ""}}));
}

TEST_F(ProtocolTest, DetokenizeRefusesBadInput) {
  const std::vector<BadCase> cases = {
      bad("{}", "tokens", "tokens is required (an array of token ids)"),
      bad(R"({"tokens": "abc"})", "tokens", "tokens must be an array of token ids, got string"),
      bad(R"({"tokens": [1, 512]})", "tokens[1]",
          "tokens[1] must be a token id between 0 and 511, got 512"),
      bad(R"({"tokens": [null]})", "tokens[0]",
          "tokens[0] must be a token id (an integer), got null"),
      BadCase{R"({"model": "x", "tokens": [1]})", 404, "not_found_error", "model",
              "model \"x\" does not exist; this server serves \"tiny-model\""},
  };
  for (const BadCase& c : cases) {
    expectRefused(detokenizeResponse(c.body, testLimits(), tokenizer()), c);
  }
}

// Text offsets index the characters of the text as written: valid
// characters, and one U+FFFD per maximal invalid run (as the lossy decode
// writes them). They never go back, whatever the bytes.
TEST(TextOffsetsTest, CountTheCharactersTheTextShows) {
  auto offsets = [](const std::vector<std::string>& tokens) {
    TextOffsets counter;
    std::vector<int64_t> out;
    for (const std::string& token : tokens) out.push_back(counter.advance(token));
    out.push_back(counter.chars);
    return out;
  };
  // "é" split across two tokens: the second starts inside it.
  EXPECT_EQ(offsets({"ab", "\xC3", "\xA9", "c"}), (std::vector<int64_t>{0, 2, 2, 3, 4}));
  // Lone continuation bytes: each one U+FFFD.
  EXPECT_EQ(offsets({"\x80", "\x80", "\x80"}), (std::vector<int64_t>{0, 1, 2, 3}));
  // "Hello" then E6 97 (a character cut short) then "x": the two bytes are
  // one U+FFFD, and "x" comes after it.
  EXPECT_EQ(offsets({"Hello", "\xE6", "\x97", "x"}), (std::vector<int64_t>{0, 5, 5, 6, 7}));
  // E0 80 is invalid from its second byte (E0 needs A0..BF next): U+FFFD
  // for E0, another for 80.
  EXPECT_EQ(offsets({"\xE0", "\x80"}), (std::vector<int64_t>{0, 1, 2}));
  // Four-byte characters.
  EXPECT_EQ(offsets({"\xF0\x9F", "\x99\x82", "!"}), (std::vector<int64_t>{0, 0, 1, 2}));
}

}  // namespace
}  // namespace tandem::server
