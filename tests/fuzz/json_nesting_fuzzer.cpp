// Fuzzes how request bodies of deep and wide JSON are handled. Each input is a
// small program that builds a JSON value (opening objects and arrays one or
// hundreds at a time, closing them, adding scalars one or thousands at a
// time, strings full of brackets), placed in one of the fields a client
// controls (chat_template_kwargs, tools[].function.parameters, a tool call's
// arguments string, message content, kv_transfer_params, an unknown field,
// /tokenize messages). The body goes through the parsers the agent and the
// router use. Properties:
//  - nothing crashes (the value is as deep as 20,000 levels: a recursive walk
//    over it would overflow the stack);
//  - checkJsonBounds refuses the body exactly when it nests deeper than the
//    bound (or holds more values than the bound);
//  - a body past the bounds is refused by every parser with a 400 that names
//    the bound; anything else is accepted or refused with a 4xx.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <system_error>

#include "common/json_parse.h"
#include "common/protocol/openai_protocol.h"
#include "common/tokenizer.h"
#include "tests/fuzz/fuzz_test_model.h"

namespace {

using tandem::server::ApiError;
using tandem::server::Result;

const tandem::Tokenizer* g_tokenizer = nullptr;
tandem::server::ServerLimits g_limits;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n", what, detail.c_str());
  std::abort();
}

// Builds JSON text from the program bytes, tracking its depth.
class Builder {
 public:
  explicit Builder(std::string_view program) : program_(program) {}

  std::string build() {
    while (at_ < program_.size() && text_.size() < kMaxText) step(next());
    while (!open_.empty()) close();
    if (text_.empty()) text_ = "1";
    return text_;
  }
  int maxDepth() const { return max_depth_; }

 private:
  static constexpr size_t kMaxText = 1 << 20;

  uint8_t next() { return at_ < program_.size() ? static_cast<uint8_t>(program_[at_++]) : 0; }

  // Before a value: a separator, and a key inside an object.
  bool beginValue() {
    if (open_.empty()) {
      if (!text_.empty()) return false;  // one top-level value
    } else {
      if (!first_) text_ += ',';
      if (open_.back() == '}') text_ += "\"k" + std::to_string(keys_++ % 7) + "\":";
    }
    first_ = false;
    return true;
  }
  void open(char kind) {
    if (!beginValue()) return;
    text_ += kind == '}' ? '{' : '[';
    open_.push_back(kind);
    first_ = true;
    max_depth_ = std::max(max_depth_, static_cast<int>(open_.size()));
  }
  void close() {
    text_ += open_.back();
    open_.pop_back();
    first_ = false;
  }
  void scalar(uint8_t which) {
    if (!beginValue()) return;
    switch (which % 4) {
      case 0:
        text_ += std::to_string(which);
        break;
      case 1:
        text_ += R"("[{\"]}[")";
        break;
      case 2:
        text_ += "true";
        break;
      default:
        text_ += "null";
        break;
    }
  }
  void step(uint8_t op) {
    switch (op % 8) {
      case 0:
        open('}');
        break;
      case 1:
        open(']');
        break;
      case 2:
        if (!open_.empty()) close();
        break;
      case 3:
        scalar(next());
        break;
      case 4:
        for (int i = 0, n = 1 + next() % 80 * 64; i < n && open_.size() < 20000; ++i) open(']');
        break;
      case 5:
        for (int i = 0, n = 1 + next() % 80 * 64; i < n && open_.size() < 20000; ++i) open('}');
        break;
      case 6:
        for (int i = 0, n = 1 + next() * 16; i < n; ++i) scalar(static_cast<uint8_t>(i));
        break;
      default:
        for (int i = 0, n = next() % 8; i < n && !open_.empty(); ++i) close();
        break;
    }
  }

  std::string_view program_;
  size_t at_ = 0;
  std::string text_;
  std::string open_;  // closing brackets of the open containers
  bool first_ = true;
  int keys_ = 0;
  int max_depth_ = 0;
};

// Where the value goes, and how deep that place is in the body.
struct Placement {
  std::string prefix;
  std::string suffix;
  int depth;  // levels around the value
  bool as_string = false;
};

const Placement kPlacements[] = {
    {R"({"model":"tiny-model","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"x":)",
     "}}", 2},
    {R"({"model":"tiny-model","messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":)",
     "}}]}", 4},
    {R"({"model":"tiny-model","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":)",
     R"(}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]})", 6, true},
    {R"({"model":"tiny-model","messages":[{"role":"user","content":)", "}]}", 3},
    {R"({"model":"tiny-model","prompt":"Hi","kv_transfer_params":)", "}", 1},
    {R"({"model":"tiny-model","prompt":"Hi","unknown_field":)", "}", 1},
    {R"({"messages":[{"role":"user","content":"Hi","extra":)", "}]}", 3},
};

bool namesTheBound(const ApiError& error) {
  return error.status == 400 &&
         (error.message.find("deeper than 128 levels") != std::string::npos ||
          error.message.find("JSON values") != std::string::npos);
}

template <typename T>
void check(const Result<T>& result, bool past_bounds, const char* parser) {
  if (result.isOk()) {
    if (past_bounds) fail(parser, "accepted a body past the JSON bounds");
    return;
  }
  const ApiError& error = result.error();
  if (error.status < 400 || error.status == 500 || error.message.empty()) {
    fail(parser, std::to_string(error.status) + " " + error.message);
  }
  if (past_bounds && !namesTheBound(error)) fail(parser, "refused without naming the bound");
  tandem::server::compactDump(tandem::server::errorBody(error));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  g_tokenizer = tandem::fuzz::loadTinyModel(g_limits);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Placement& place = kPlacements[data[0] % std::size(kPlacements)];
  Builder builder(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  std::string value = builder.build();
  const int value_depth = builder.maxDepth();
  if (place.as_string) value = nlohmann::json(value).dump();
  const std::string body = place.prefix + value + place.suffix;

  // The bound check itself against the depth the builder made.
  const int body_depth = place.as_string ? place.depth : place.depth + value_depth;
  const auto outside = tandem::checkJsonBounds(body, g_limits.json_bounds);
  if (body_depth > tandem::kMaxJsonDepth) {
    if (!outside) fail("checkJsonBounds", "missed nesting of " + std::to_string(body_depth));
  } else if (outside && outside->tooDeep()) {
    fail("checkJsonBounds", "refused nesting of " + std::to_string(body_depth));
  }
  // JSON inside the arguments string is bounded on its own.
  const bool past_bounds =
      outside.has_value() || (place.as_string && value_depth > tandem::kMaxJsonDepth);

  // Completions never decode the arguments string; chat and /tokenize do.
  check(tandem::server::parseCompletionRequest(body, g_limits, *g_tokenizer), outside.has_value(),
        "completion");
  check(tandem::server::parseChatCompletionRequest(body, g_limits, *g_tokenizer), past_bounds,
        "chat");
  check(tandem::server::tokenizeResponse(body, g_limits, *g_tokenizer), past_bounds, "tokenize");
  return 0;
}
