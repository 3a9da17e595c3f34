#include "common/protocol/openai_protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <span>
#include <variant>
#include <vector>

#include "common/jinja/unicode.h"
#include "common/json_parse.h"
#include "common/protocol/chat_request.h"
#include "common/protocol/structured_request.h"
#include "common/tokenizer_utf8.h"

namespace tandem::server {
namespace {

using nlohmann::json;
// A request body as parsed: object keys in the order the client wrote them
// (chat templates and JSON schemas see that order; a router forwards it).
using RequestJson = nlohmann::ordered_json;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr size_t kMaxStopStrings = 4;
// Each engine request holds its own matcher of the stop strings (the text
// and a table of 8 bytes per byte): a bound keeps a batch of 256 engine
// requests within a few MiB (vLLM sets none; stop strings in use are a few
// bytes to a few lines).
constexpr size_t kMaxStopStringBytes = 4096;
// Every sequence checks each sampled token against these: a bound keeps
// that work small (vLLM sets none; a few dozen is the most seen in use).
constexpr size_t kMaxStopTokenIds = 1024;
// bad_words: every sampled token checks the output's end against each
// word's tokens, so both are bounded.
constexpr size_t kMaxBadWords = 128;
constexpr size_t kMaxBadWordBytes = 1024;

std::string jsonQuoted(std::string_view text) { return compactDump(json(std::string(text))); }

// Runs a request-path function, turning an escaped exception (a bug here, or
// out of memory) into a 500 instead of letting it cross the boundary.
template <typename T, typename F>
Result<T> guarded(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return serverError(std::string("internal error while handling the request: ") + e.what());
  }
}

// ---------------------------------------------------------------------------
// Reading request fields

// Reads fields of one JSON object. The first error sticks: later reads do
// nothing, so a parser reads everything and checks ok() once. Absent fields
// and explicit nulls both mean "not given", as OpenAI's clients send either.
class FieldReader {
 public:
  explicit FieldReader(const RequestJson& object, std::string prefix = "")
      : object_(object), prefix_(std::move(prefix)) {}

  bool ok() const { return !error_.has_value(); }
  const ApiError& error() const { return *error_; }
  std::string param(std::string_view name) const { return prefix_ + std::string(name); }

  void fail(std::string message, std::string param) {
    if (!error_) error_ = invalidRequest(std::move(message), std::move(param));
  }
  void failType(std::string_view name, std::string_view expected, const RequestJson& value) {
    fail(param(name) + " must be " + std::string(expected) + ", got " + value.type_name(),
         param(name));
  }

  // The field's value when given (present, not null) and no error is pending.
  const RequestJson* find(std::string_view name) const {
    if (error_) return nullptr;
    const auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool readBool(std::string_view name, bool* out) {
    const RequestJson* value = find(name);
    if (value == nullptr) return false;
    if (!value->is_boolean()) {
      failType(name, "a boolean", *value);
      return false;
    }
    *out = value->get<bool>();
    return true;
  }

  // A number as a float. One beyond a float's range (that rounds to
  // infinity) is refused here, where its value can still be quoted (as a
  // float it reads "inf"); a nonzero
  // one too small for a float becomes the float of its sign nearest zero,
  // so that bounds such as top_p > 0 or min_p >= 0 judge it by its sign.
  bool readFloat(std::string_view name, float* out) {
    const RequestJson* value = find(name);
    if (value == nullptr) return false;
    if (!value->is_number()) {
      failType(name, "a number", *value);
      return false;
    }
    const double number = value->get<double>();
    if (std::isinf(static_cast<float>(number))) {
      fail(param(name) + " must be a number a float holds (magnitude at most 3.4028235e38), got " +
               compactDump(*value),
           param(name));
      return false;
    }
    *out = static_cast<float>(number);
    if (*out == 0.0f && number != 0.0) {
      *out = std::copysign(std::numeric_limits<float>::denorm_min(), static_cast<float>(number));
    }
    return true;
  }

  // An integer in [min, max]; integral floats (3.0) are accepted.
  bool readInt(std::string_view name, int64_t min, int64_t max, int64_t* out) {
    const RequestJson* value = find(name);
    if (value == nullptr) return false;
    const auto result = integerValue(name, *value, min, max);
    if (!result) return false;
    *out = *result;
    return true;
  }

  bool readString(std::string_view name, std::string* out) {
    const RequestJson* value = find(name);
    if (value == nullptr) return false;
    if (!value->is_string()) {
      failType(name, "a string", *value);
      return false;
    }
    *out = value->get<std::string>();
    return true;
  }

  const RequestJson* readObject(std::string_view name) {
    const RequestJson* value = find(name);
    if (value != nullptr && !value->is_object()) {
      failType(name, "an object", *value);
      return nullptr;
    }
    return value;
  }

  // Checks `value` (the field `name`, or an element of it) is an integer in
  // [min, max]; records the error otherwise.
  std::optional<int64_t> integerValue(std::string_view name, const RequestJson& value, int64_t min,
                                      int64_t max) {
    if (!value.is_number()) {
      failType(name, "an integer", value);
      return std::nullopt;
    }
    std::optional<int64_t> integer;
    if (value.is_number_unsigned()) {
      const auto u = value.get<uint64_t>();
      if (u <= static_cast<uint64_t>(kInt64Max)) integer = static_cast<int64_t>(u);
    } else if (value.is_number_integer()) {
      integer = value.get<int64_t>();
    } else {
      const double d = value.get<double>();
      if (std::trunc(d) != d) {
        fail(param(name) + " must be an integer, got " + compactDump(value), param(name));
        return std::nullopt;
      }
      // 2^63 is exactly representable; anything at or past it is out of
      // range. So is -2^63 itself as a double: an integer written in range
      // is read as an integer, and one written below it (-2^63 - 1, ...)
      // rounds to -2^63 as a double.
      if (d > -9223372036854775808.0 && d < 9223372036854775808.0) {
        integer = static_cast<int64_t>(d);
      }
    }
    if (!integer || *integer < min || *integer > max) {
      std::string range;
      if (max != kInt64Max) {
        range = "between " + std::to_string(min) + " and " + std::to_string(max);
      } else if (integer) {
        range = "at least " + std::to_string(min);
      } else {
        // Past what int64 holds, read as a double (so quoted rounded):
        // the range is named too.
        fail(param(name) +
                 " must be a 64-bit integer (-9223372036854775808 to 9223372036854775807), got " +
                 compactDump(value) + ", outside that range",
             param(name));
        return std::nullopt;
      }
      fail(param(name) + " must be " + range + ", got " + compactDump(value), param(name));
      return std::nullopt;
    }
    return integer;
  }

 private:
  const RequestJson& object_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

Result<RequestJson> parseJsonObject(std::string_view body, const ServerLimits& limits) {
  // JSON text is UTF-8 (RFC 8259). Checked first so that the error names the
  // byte rather than quoting it back.
  if (const size_t bad = tokenizer_internal::firstInvalidUtf8(body);
      bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(body[bad]));
    return invalidRequest("the request body is not valid UTF-8: invalid byte " + std::string(byte) +
                          " at offset " + std::to_string(bad));
  }
  JsonParseError parse_error;
  std::optional<RequestJson> parsed = parseOrderedJson(body, parse_error, limits.json_bounds);
  if (!parsed && (parse_error.tooDeep() || parse_error.tooManyValues())) {
    return boundsError(parse_error);
  }
  if (!parsed) return invalidRequest("request body is not valid JSON: " + parse_error.detail);
  RequestJson root = std::move(*parsed);
  if (!root.is_object()) {
    return invalidRequest(std::string("request body must be a JSON object, got ") +
                          root.type_name());
  }
  return root;
}

// The served model, or 404 naming both. `required` is false for /tokenize.
std::optional<ApiError> checkModel(const RequestJson& root, const ServerLimits& limits,
                                   bool required, std::string* model) {
  const auto it = root.find("model");
  if (it == root.end() || it->is_null()) {
    if (required) {
      return invalidRequest(
          "model is required (this server serves " + jsonQuoted(limits.served_model_name) + ")",
          "model");
    }
    *model = limits.served_model_name;
    return std::nullopt;
  }
  if (!it->is_string()) {
    return invalidRequest(std::string("model must be a string, got ") + it->type_name(), "model");
  }
  *model = it->get<std::string>();
  if (*model == limits.served_model_name) return std::nullopt;
  const std::vector<std::string> adapters =
      limits.lora_adapters ? limits.lora_adapters() : std::vector<std::string>();
  if (std::find(adapters.begin(), adapters.end(), *model) == adapters.end()) {
    std::string served = jsonQuoted(limits.served_model_name);
    for (size_t i = 0; i < adapters.size(); ++i) {
      served += (i == 0 ? " and its LoRA adapters " : ", ") + jsonQuoted(adapters[i]);
    }
    return ApiError{404,
                    "model " + jsonQuoted(*model) + " does not exist; this server serves " + served,
                    "not_found_error", "model", "model_not_found"};
  }
  return std::nullopt;
}

// The request's `model` (checkModel's) as Request::adapter: empty for the
// base model.
std::string adapterOf(const std::string& model, const ServerLimits& limits) {
  return model == limits.served_model_name ? std::string() : model;
}

// A token id, element `name` of the field `param`: an integer in
// [0, vocab_size).
std::optional<TokenId> readTokenId(FieldReader& fields, const std::string& name,
                                   const std::string& param, const RequestJson& value,
                                   int64_t vocab_size) {
  if (!value.is_number()) {
    fields.fail(name + " must be a token id (an integer), got " + value.type_name(), param);
    return std::nullopt;
  }
  std::optional<int64_t> id;
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() < static_cast<uint64_t>(vocab_size)) id = value.get<int64_t>();
  } else if (value.is_number_integer()) {
    if (value.get<int64_t>() >= 0 && value.get<int64_t>() < vocab_size) id = value.get<int64_t>();
  } else {
    const double d = value.get<double>();
    if (std::trunc(d) == d && d >= 0 && d < static_cast<double>(vocab_size)) {
      id = static_cast<int64_t>(d);
    }
  }
  if (!id) {
    fields.fail(name + " must be a token id between 0 and " + std::to_string(vocab_size - 1) +
                    ", got " + compactDump(value),
                param);
    return std::nullopt;
  }
  return static_cast<TokenId>(*id);
}

// An array of token ids; `name` is its path in the request ("prompt[0]"),
// which a bad element's message and param extend ("prompt[0][3]").
std::optional<std::vector<TokenId>> readTokenIds(FieldReader& fields, const std::string& name,
                                                 const RequestJson& array, int64_t vocab_size) {
  std::vector<TokenId> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    // The element is the param, as for any other field's element.
    const std::string element = name + "[" + std::to_string(i) + "]";
    const auto id = readTokenId(fields, element, element, array[i], vocab_size);
    if (!id) return std::nullopt;
    ids.push_back(*id);
  }
  return ids;
}

// OpenAI's logit_bias object: keys are token ids written as decimal strings,
// values numbers in [-100, 100]; into `out`, sorted by id. A bad entry fails
// `fields` naming it (param "logit_bias").
void readLogitBias(FieldReader& fields, const RequestJson& object, int64_t vocab_size,
                   std::vector<std::pair<TokenId, float>>& out) {
  for (const auto& [key, value] : object.items()) {
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id >= vocab_size) {
      fields.fail("logit_bias keys must be token ids in [0, " + std::to_string(vocab_size) +
                      ") written as decimal strings, got " + compactDump(json(key)),
                  "logit_bias");
      return;
    }
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0)) {
      const std::string name = "logit_bias[\"" + key + "\"]";
      fields.fail(name + " must be a number between -100 and 100, got " + compactDump(value), name);
      return;
    }
    out.emplace_back(static_cast<TokenId>(id), value.get<float>());
  }
  std::sort(out.begin(), out.end());
  // "97" and "097" name one token: their biases would add up past the range.
  const auto twice = std::adjacent_find(
      out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first == b.first; });
  if (twice != out.end()) {
    fields.fail("logit_bias names token " + std::to_string(twice->first) +
                    " twice (keys must be distinct token ids)",
                "logit_bias");
  }
}

// The prompt's logprobs with `count` alternatives, asked for by `field`
// (prompt_logprobs, or completions' echo with logprobs).
void askPromptLogprobs(FieldReader& fields, ParsedRequest& parsed, int64_t count,
                       const char* field) {
  if (!parsed.kv_transfer_params.is_null()) {
    fields.fail(std::string(field) +
                    " needs every prompt position computed by this agent: it cannot be "
                    "combined with kv_transfer_params",
                field);
    return;
  }
  std::optional<int32_t>& asked = parsed.request.sampling.prompt_logprobs;
  asked = std::max<int32_t>(asked.value_or(0), static_cast<int32_t>(count));
}

// The prompt logprob entries an answer carries: every choice of every
// prompt holds its prompt's (vLLM's layout), each position with its
// `prompt_logprobs` alternatives and the prompt's own token. A bound keeps
// what a small body makes the server build and send small; over it, a 400
// naming the field that asked for them. `prompts`: one request's, not
// empty, sharing the first's fields.
std::optional<ApiError> checkPromptLogprobEntries(std::span<const ParsedRequest> prompts) {
  const ParsedRequest& first = prompts.front();
  const std::optional<int32_t> asked = first.request.sampling.prompt_logprobs;
  if (!asked) return std::nullopt;
  int64_t entries = 0;
  for (const ParsedRequest& one : prompts) {
    entries += static_cast<int64_t>(one.request.prompt.size()) * (*asked + 1) * one.n;
  }
  if (entries <= kMaxPromptLogprobEntries) return std::nullopt;
  const char* field = first.prompt_logprobs ? "prompt_logprobs" : "echo";
  return invalidRequest(
      std::string(field) + " asks for " + std::to_string(entries) +
          " prompt logprob entries (prompt tokens x " + std::to_string(*asked + 1) +
          " per position x n, summed over the prompts); at most " +
          std::to_string(kMaxPromptLogprobEntries) +
          " are answered in one request (ask for fewer alternatives, choices or prompts)",
      field);
}

// Python's str.lstrip(): the leading code points str.isspace() holds for
// (the request is valid UTF-8: parseJsonObject checked it).
std::string_view stripLeadingSpace(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!jinja::isPythonSpace(tokenizer_internal::nextCodepoint(text, next))) break;
    pos = next;
  }
  return text.substr(pos);
}

// vLLM's bad_words: each word, leading whitespace stripped, as its tokens
// without special tokens; and as the tokens of " " + word when that makes
// as many tokens with another first one (the word met inside a text).
void readBadWords(FieldReader& fields, const RequestJson& words, const Tokenizer& tokenizer,
                  std::vector<std::vector<TokenId>>& out) {
  if (!words.is_array()) {
    fields.failType("bad_words", "an array of strings", words);
    return;
  }
  if (words.size() > kMaxBadWords) {
    fields.fail("bad_words must have at most " + std::to_string(kMaxBadWords) + " words, got " +
                    std::to_string(words.size()),
                "bad_words");
    return;
  }
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string name = "bad_words[" + std::to_string(i) + "]";
    if (!words[i].is_string()) {
      fields.failType(name, "a string", words[i]);
      return;
    }
    const std::string_view word = stripLeadingSpace(words[i].get_ref<const std::string&>());
    if (word.empty()) {
      fields.fail(name + " must hold a word, not only whitespace", name);
      return;
    }
    if (word.size() > kMaxBadWordBytes) {
      fields.fail(name + " must be at most " + std::to_string(kMaxBadWordBytes) + " bytes, got " +
                      std::to_string(word.size()),
                  name);
      return;
    }
    std::vector<TokenId> alone = tokenizer.encode(word, /*add_special_tokens=*/false);
    if (alone.empty()) {
      fields.fail(name + " makes no tokens", name);
      return;
    }
    std::string spaced_word(1, ' ');
    spaced_word.append(word);
    std::vector<TokenId> spaced = tokenizer.encode(spaced_word, /*add_special_tokens=*/false);
    const bool other_word =
        !spaced.empty() && spaced[0] != alone[0] && spaced.size() == alone.size();
    out.push_back(std::move(alone));
    if (other_word) out.push_back(std::move(spaced));
  }
}

// Fields of OpenAI's or vLLM's API that would change the answer and that
// this server does not do: refused naming the field, never ignored. Their
// neutral values (false, null, [], ["text"], true for detokenize, "none"
// for function_call) pass.
void refuseWhatIsNotDone(FieldReader& fields) {
  if (const RequestJson* beam = fields.find("use_beam_search");
      beam && *beam != RequestJson(false)) {
    fields.fail(
        "use_beam_search is not supported; send false or leave it out (n and best_of "
        "sample several answers)",
        "use_beam_search");
  }
  if (const RequestJson* processors = fields.find("logits_processors");
      processors && !(processors->is_array() && processors->empty())) {
    fields.fail("logits_processors are not supported; leave it out", "logits_processors");
  }
  if (const RequestJson* detokenize = fields.find("detokenize");
      detokenize && *detokenize != true) {
    fields.fail(
        "detokenize must be true: answers always carry text (return_token_ids adds the "
        "token ids)",
        "detokenize");
  }
  if (const RequestJson* modalities = fields.find("modalities");
      modalities && *modalities != RequestJson::array({"text"})) {
    fields.fail("modalities must be [\"text\"]: only text is generated", "modalities");
  }
  for (const char* name : {"audio", "web_search_options"}) {
    if (fields.find(name)) {
      fields.fail(std::string(name) + " is not supported; leave it out or send null", name);
    }
  }
  const RequestJson* functions = fields.find("functions");
  const RequestJson* function_call = fields.find("function_call");
  const bool asks_functions = functions && !(functions->is_array() && functions->empty());
  if (asks_functions || (function_call && *function_call != "none")) {
    const char* name = asks_functions ? "functions" : "function_call";
    fields.fail(
        std::string(name) + " is the deprecated form of tools; send tools and tool_choice instead",
        name);
  }
}

// The fields shared by /v1/completions and /v1/chat/completions.
void readCommonFields(FieldReader& fields, const ServerLimits& limits, const Tokenizer& tokenizer,
                      ParsedRequest& parsed) {
  protocol::SamplingParams& sampling = parsed.request.sampling;
  limits.generation_defaults.applyTo(sampling);
  fields.readFloat("temperature", &sampling.temperature);
  fields.readFloat("top_p", &sampling.top_p);
  int64_t integer = 0;
  if (fields.readInt("top_k", kInt32Min, kInt32Max, &integer)) {
    // vLLM's older spelling of "disabled".
    sampling.top_k = integer == -1 ? 0 : static_cast<int32_t>(integer);
  }
  fields.readFloat("min_p", &sampling.min_p);
  fields.readFloat("frequency_penalty", &sampling.frequency_penalty);
  fields.readFloat("presence_penalty", &sampling.presence_penalty);
  fields.readFloat("repetition_penalty", &sampling.repetition_penalty);
  if (fields.readInt("min_tokens", 0, kInt64Max, &integer)) sampling.min_tokens = integer;
  fields.readBool("ignore_eos", &sampling.ignore_eos);
  fields.readBool("skip_special_tokens", &sampling.skip_special_tokens);
  fields.readBool("include_stop_str_in_output", &sampling.include_stop_str_in_output);
  if (const RequestJson* ids = fields.find("allowed_token_ids")) {
    if (!ids->is_array()) {
      fields.failType("allowed_token_ids", "an array of token ids", *ids);
    } else if (ids->empty()) {
      fields.fail(
          "allowed_token_ids must not be empty; leave it out or send null to allow every token",
          "allowed_token_ids");
    } else if (auto allowed = readTokenIds(fields, "allowed_token_ids", *ids, limits.vocab_size)) {
      std::sort(allowed->begin(), allowed->end());
      allowed->erase(std::unique(allowed->begin(), allowed->end()), allowed->end());
      sampling.allowed_token_ids = std::move(*allowed);
    }
  }
  if (const RequestJson* words = fields.find("bad_words")) {
    readBadWords(fields, *words, tokenizer, sampling.bad_words_ids);
  }
  // Every allowed id a one-token bad word: nothing could be generated.
  std::vector<TokenId> banned;
  for (const std::vector<TokenId>& word : sampling.bad_words_ids) {
    if (word.size() == 1) banned.push_back(word[0]);
  }
  std::sort(banned.begin(), banned.end());
  if (!sampling.allowed_token_ids.empty() && !banned.empty() &&
      std::includes(banned.begin(), banned.end(), sampling.allowed_token_ids.begin(),
                    sampling.allowed_token_ids.end())) {
    fields.fail(
        "allowed_token_ids holds only tokens that bad_words bans (one-token words): nothing "
        "could be generated",
        "allowed_token_ids");
  }
  if (fields.readInt("truncate_prompt_tokens", -1, kInt64Max, &integer)) {
    if (integer == 0) {
      fields.fail(
          "truncate_prompt_tokens must be -1 (keep the last max_model_len tokens) or at least 1, "
          "got 0",
          "truncate_prompt_tokens");
    } else if (integer > limits.max_model_len) {
      fields.fail("truncate_prompt_tokens (" + std::to_string(integer) +
                      ") is greater than max_model_len (" + std::to_string(limits.max_model_len) +
                      "); give at most that, or -1 for that",
                  "truncate_prompt_tokens");
    } else {
      parsed.truncate_prompt_tokens = integer == -1 ? limits.max_model_len : integer;
    }
  }

  if (const RequestJson* seed = fields.find("seed")) {
    // Any 64-bit integer, signed or not; negative seeds wrap like a C cast.
    const bool integral_float =
        seed->is_number_float() && std::trunc(seed->get<double>()) == seed->get<double>();
    if (seed->is_number_unsigned()) {
      sampling.seed = seed->get<uint64_t>();
    } else if (integral_float) {
      const double number = seed->get<double>();
      // An integral float: read in the same range, as the double it is
      // read as (a number written past 64 bits is rounded to one).
      if (number >= 0 && number < 18446744073709551616.0) {
        sampling.seed = static_cast<uint64_t>(number);
      } else if (number < 0 && number >= -9223372036854775808.0) {
        sampling.seed = static_cast<uint64_t>(static_cast<int64_t>(number));
      } else {
        fields.fail(
            "seed must be a 64-bit integer, signed or not (-9223372036854775808 to "
            "18446744073709551615), got " +
                compactDump(*seed) + ", outside that range",
            "seed");
      }
    } else if (auto value = fields.integerValue("seed", *seed, kInt64Min, kInt64Max)) {
      sampling.seed = static_cast<uint64_t>(*value);
    }
  }

  if (fields.readInt("n", 1, kMaxChoices, &integer)) parsed.n = integer;
  parsed.best_of = parsed.n;

  auto stopTooLong = [](const std::string& name, const std::string& text) {
    return name + " must be at most " + std::to_string(kMaxStopStringBytes) + " bytes, got " +
           std::to_string(text.size());
  };
  if (const RequestJson* stop = fields.find("stop")) {
    if (stop->is_string()) {
      if (stop->get<std::string>().empty()) {
        fields.fail("stop must not be empty", "stop");
      } else if (stop->get<std::string>().size() > kMaxStopStringBytes) {
        fields.fail(stopTooLong("stop", stop->get<std::string>()), "stop");
      } else {
        sampling.stop = {stop->get<std::string>()};
      }
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) {
        fields.fail("stop must have at most " + std::to_string(kMaxStopStrings) + " strings, got " +
                        std::to_string(stop->size()),
                    "stop");
      }
      for (size_t i = 0; i < stop->size() && fields.ok(); ++i) {
        const RequestJson& item = (*stop)[i];
        const std::string name = "stop[" + std::to_string(i) + "]";
        if (!item.is_string()) {
          fields.fail(name + " must be a string, got " + item.type_name(), name);
        } else if (item.get<std::string>().empty()) {
          fields.fail(name + " must not be empty", name);
        } else if (item.get<std::string>().size() > kMaxStopStringBytes) {
          fields.fail(stopTooLong(name, item.get<std::string>()), name);
        } else {
          sampling.stop.push_back(item.get<std::string>());
        }
      }
    } else {
      fields.failType("stop", "a string or an array of strings", *stop);
    }
  }

  if (const RequestJson* ids = fields.find("stop_token_ids")) {
    if (!ids->is_array()) {
      fields.failType("stop_token_ids", "an array of token ids", *ids);
    } else if (ids->size() > kMaxStopTokenIds) {
      fields.fail("stop_token_ids must have at most " + std::to_string(kMaxStopTokenIds) +
                      " ids, got " + std::to_string(ids->size()),
                  "stop_token_ids");
    } else if (auto parsed_ids = readTokenIds(fields, "stop_token_ids", *ids, limits.vocab_size)) {
      sampling.stop_token_ids = std::move(*parsed_ids);
    }
  }

  fields.readBool("stream", &parsed.stream);
  fields.readBool("return_token_ids", &parsed.return_token_ids);
  parsed.return_tokens_as_token_ids = limits.return_tokens_as_token_ids;
  fields.readBool("return_tokens_as_token_ids", &parsed.return_tokens_as_token_ids);
  if (const RequestJson* options = fields.readObject("stream_options")) {
    if (!parsed.stream) {
      fields.fail("stream_options is only allowed when stream is true", "stream_options");
    } else {
      FieldReader option_fields(*options, "stream_options.");
      option_fields.readBool("include_usage", &parsed.include_usage);
      bool continuous = false;
      option_fields.readBool("continuous_usage_stats", &continuous);
      parsed.continuous_usage = continuous && parsed.include_usage;
      if (!option_fields.ok()) {
        fields.fail(option_fields.error().message, option_fields.error().param);
      }
    }
  }

  // vLLM's: lower is served earlier; any 64-bit integer. Whether this agent
  // schedules by it is the engine's to say (Engine::addRequest).
  if (fields.readInt("priority", kInt64Min, kInt64Max, &integer)) {
    parsed.request.priority = integer;
  }
  if (fields.readString("cache_salt", &parsed.request.cache_salt) &&
      parsed.request.cache_salt.empty()) {
    fields.fail("cache_salt must not be empty when given", "cache_salt");
  }
  if (const RequestJson* params = fields.readObject("kv_transfer_params");
      params != nullptr && !limits.ignore_kv_transfer_params) {
    if (parsed.n > 1) {
      fields.fail("kv_transfer_params hands one request's KV over: n must be 1",
                  "kv_transfer_params");
    }
    parsed.kv_transfer_params = *params;
  }
  // A stream that another agent began: the tokens it already sent.
  if (const RequestJson* ids = fields.find("resume_token_ids")) {
    if (!ids->is_array() || ids->empty()) {
      fields.failType("resume_token_ids", "a non-empty array of token ids", *ids);
    } else if (!parsed.stream) {
      fields.fail("resume_token_ids continues a stream: set stream to true", "resume_token_ids");
    } else if (parsed.n > 1) {
      fields.fail("resume_token_ids continues one choice: n must be 1", "resume_token_ids");
    } else if (auto resumed = readTokenIds(fields, "resume_token_ids", *ids, limits.vocab_size)) {
      parsed.request.resume_output = std::move(*resumed);
    }
  }

  if (const RequestJson* bias = fields.find("logit_bias"); bias != nullptr && !bias->is_null()) {
    if (!bias->is_object()) {
      fields.failType("logit_bias", "an object mapping token ids to biases", *bias);
    } else {
      readLogitBias(fields, *bias, limits.vocab_size, parsed.request.sampling.logit_bias);
    }
  }
  if (bool echo = false; fields.readBool("echo", &echo) && echo) {
    if (parsed.chat) {
      fields.fail("echo is not supported for chat completions; send false or leave it out", "echo");
    } else {
      parsed.echo = true;
    }
  }
  // vLLM's prompt_logprobs (not streamed, as vLLM).
  if (fields.readInt("prompt_logprobs", 0, limits.max_logprobs, &integer)) {
    if (parsed.stream) {
      fields.fail("prompt_logprobs are not available when stream is true; set stream to false",
                  "prompt_logprobs");
    } else {
      parsed.prompt_logprobs = static_cast<int32_t>(integer);
      askPromptLogprobs(fields, parsed, integer, "prompt_logprobs");
    }
  }
  refuseWhatIsNotDone(fields);
}

// Which field bounds the output: max_completion_tokens, which replaced
// max_tokens in OpenAI's chat API, wins when both are given, as in vLLM
// (read on both endpoints).
const char* maxTokensName(const FieldReader& fields) {
  return fields.find("max_completion_tokens") != nullptr ? "max_completion_tokens" : "max_tokens";
}

// Reads max_tokens (or max_completion_tokens): at least 1; the upper
// bound depends on the prompt and is checked in finishRequest.
std::optional<int64_t> readMaxTokens(FieldReader& fields, const char* name) {
  int64_t max_tokens = 0;
  if (fields.readInt(name, 1, kInt64Max, &max_tokens)) return max_tokens;
  return std::nullopt;
}

// The request field a validation message begins with: "top_p must be in
// (0, 1], got 0" names top_p; "kv_transfer_params.remote_block_ids[3] = 9 is
// outside ..." names kv_transfer_params.remote_block_ids[3]. A path is taken
// when " must " follows it, or ':' follows it, or it has a '.' or '[' and a
// space or the end follows it; otherwise "".
std::string leadingField(const std::string& message) {
  auto isNameChar = [&](size_t i) {
    const auto c = static_cast<unsigned char>(message[i]);
    return std::islower(c) || std::isdigit(c) || c == '_';
  };
  size_t end = 0;
  bool nested = false;
  while (end < message.size() && isNameChar(end)) {
    while (end < message.size() && isNameChar(end)) ++end;
    if (end + 1 < message.size() && message[end] == '.' && isNameChar(end + 1)) {
      ++end;
      nested = true;
    }
    while (end < message.size() && message[end] == '[') {
      const size_t close = message.find(']', end);
      if (close == std::string::npos || close == end + 1 ||
          !std::all_of(message.begin() + static_cast<ptrdiff_t>(end) + 1,
                       message.begin() + static_cast<ptrdiff_t>(close),
                       [](unsigned char c) { return std::isdigit(c); })) {
        return "";
      }
      end = close + 1;
      nested = true;
      if (end + 1 < message.size() && message[end] == '.' && isNameChar(end + 1)) ++end;
    }
  }
  if (end == 0 || !std::islower(static_cast<unsigned char>(message[0]))) return "";
  const bool named = message.compare(end, 6, " must ") == 0 ||
                     (end < message.size() && message[end] == ':') ||
                     (nested && (end == message.size() || message[end] == ' '));
  return named ? message.substr(0, end) : std::string();
}

// Length checks, the default max_tokens and the sampler's own validation,
// once the prompt is known.
// `prompt_label` is how messages speak of the prompt; `prompt_param` the
// field to blame for its length.
std::optional<ApiError> finishRequest(ParsedRequest& parsed, const ServerLimits& limits,
                                      std::optional<int64_t> max_tokens,
                                      const char* max_tokens_name, const char* prompt_label,
                                      const char* prompt_param) {
  const auto prompt_len = static_cast<int64_t>(parsed.request.prompt.size());
  if (prompt_len == 0) {
    return invalidRequest(std::string(prompt_label) + " must not be empty", prompt_param);
  }
  // A bound of `bound` tokens on prompt + max_tokens, which `is_text`
  // ("max_model_len is 512") and `exceeds_text` ("max_model_len (512)")
  // name: the room it leaves for the completion, or the refusal.
  auto within = [&](int64_t bound, const std::string& is_text,
                    const std::string& exceeds_text) -> std::variant<int64_t, ApiError> {
    if (prompt_len >= bound) {
      return invalidRequest(std::string(prompt_label) + " is " + std::to_string(prompt_len) +
                                " tokens, but " + is_text + "; at most " +
                                std::to_string(bound - 1) +
                                " prompt tokens leave room for one generated token",
                            prompt_param);
    }
    const int64_t room = bound - prompt_len;
    if (max_tokens && *max_tokens > room) {
      return invalidRequest(std::string(prompt_label) + " (" + std::to_string(prompt_len) +
                                " tokens) + " + max_tokens_name + " (" +
                                std::to_string(*max_tokens) + ") exceeds " + exceeds_text + "; " +
                                max_tokens_name + " can be at most " + std::to_string(room) +
                                " for this prompt",
                            max_tokens_name);
    }
    return room;
  };
  const std::string model_len = std::to_string(limits.max_model_len);
  std::variant<int64_t, ApiError> room = within(
      limits.max_model_len, "max_model_len is " + model_len, "max_model_len (" + model_len + ")");
  std::string room_origin = "what max_model_len " + model_len + " leaves after the prompt";
  // A KV cache smaller than max_model_len (the agent warned of it at
  // start) bounds the request too, named as max_model_len is.
  if (const int64_t cache = limits.kv_cache_tokens;
      std::holds_alternative<int64_t>(room) && cache > 0 && cache < limits.max_model_len) {
    const std::string holds = std::to_string(cache) + " tokens";
    room = within(cache, std::string(limits.kv_cache_name) + " holds " + holds,
                  "what " + std::string(limits.kv_cache_name) + " holds (" + holds + ")");
    room_origin =
        "what " + std::string(limits.kv_cache_name) + " (" + holds + ") leaves after the prompt";
  }
  if (const ApiError* error = std::get_if<ApiError>(&room)) return *error;
  const int64_t default_room = std::get<int64_t>(room);
  const std::optional<int64_t> configured = limits.generation_defaults.max_new_tokens;
  parsed.request.sampling.max_tokens =
      max_tokens.value_or(std::min(default_room, configured.value_or(default_room)));
  // min_tokens against a max_tokens the client did not send: say where the
  // bound comes from (the generic message named max_tokens as if given).
  if (const int64_t least = parsed.request.sampling.min_tokens;
      !max_tokens && least > parsed.request.sampling.max_tokens) {
    if (configured && *configured < default_room) {
      room_origin = "the model's generation_config max_new_tokens";
    }
    return invalidRequest(
        "min_tokens (" + std::to_string(least) + ") is more than " + max_tokens_name +
            ", which the request leaves out: its default "
            "here is " +
            std::to_string(parsed.request.sampling.max_tokens) + " (" + room_origin + ")",
        "min_tokens");
  }
  const Status status = protocol::validateSamplingParams(parsed.request.sampling, limits.vocab_size,
                                                         limits.max_model_len, prompt_len);
  if (!status.isOk()) return fromStatus(status, leadingField(status.message()));
  return std::nullopt;
}

// With truncate_prompt_tokens a text is tokenized whole and cut (vLLM's),
// up to this many times what could fit max_model_len (below): still far
// more text than any model's context, while the memory tokenizing takes
// stays bounded (about 27 bytes per byte of the longest word the
// pre-tokenizer leaves whole: a run of one letter, of spaces).
constexpr int64_t kTruncatedTextFits = 4;

// Refuses, before tokenizing it, a text too long for max_model_len whatever
// its tokens: each token stands for at most maxTextBytesPerToken() bytes, so
// a text of N bytes has at least N / that many. This keeps a 60 MB prompt
// from costing the time and memory its tokens take. With `truncating`
// (truncate_prompt_tokens) a text kTruncatedTextFits times as long passes.
std::optional<ApiError> checkTextFits(std::string_view text, const ServerLimits& limits,
                                      const Tokenizer& tokenizer, bool truncating,
                                      const std::string& label, const std::string& param) {
  const std::optional<int64_t> per_token = tokenizer.maxTextBytesPerToken();
  if (!per_token || limits.max_model_len <= 0) return std::nullopt;
  const auto bytes = static_cast<int64_t>(text.size());
  if (truncating) {
    const int64_t most = kTruncatedTextFits * limits.max_model_len * *per_token;
    if (bytes <= most) return std::nullopt;
    return invalidRequest(
        label + " is " + std::to_string(bytes) + " bytes; with truncate_prompt_tokens at most " +
            std::to_string(most) + " are tokenized (" + std::to_string(kTruncatedTextFits) +
            " times max_model_len " + std::to_string(limits.max_model_len) + " tokens of " +
            std::to_string(*per_token) + " bytes, the most a token of this model stands for)",
        param);
  }
  const int64_t min_tokens = (bytes + *per_token - 1) / *per_token;
  if (min_tokens < limits.max_model_len) return std::nullopt;
  return invalidRequest(label + " is " + std::to_string(bytes) + " bytes, at least " +
                            std::to_string(min_tokens) + " tokens (a token of this model is " +
                            std::to_string(*per_token) + " bytes of text at most), but " +
                            "max_model_len is " + std::to_string(limits.max_model_len) +
                            "; it was refused without tokenizing it",
                        param);
}

// parsed.request.prompt: the ids of `text`, encoded whole or, with
// truncate_prompt_tokens, cut from the left as transformers cuts (the
// special tokens stay). Returns whether it cut: the text then no longer
// matches the prompt, and an echo decodes the ids kept (vLLM echoes the text
// given).
bool encodePrompt(std::string_view text, ParsedRequest& parsed, const Tokenizer& tokenizer,
                  bool add_special_tokens) {
  bool cut = false;
  parsed.request.prompt =
      parsed.truncate_prompt_tokens
          ? tokenizer.encodeLast(text, add_special_tokens, *parsed.truncate_prompt_tokens, &cut)
          : tokenizer.encode(text, add_special_tokens);
  return cut;
}

// What /v1/completions' prompt field may be.
constexpr const char* kPromptForms = "a string, an array of token ids, or an array of these";

// The prompts of /v1/completions' prompt field (kPromptForms; an array of
// prompts is a batch, as OpenAI's and vLLM's), each with its name for
// messages ("prompt", or "prompt[i]" in an array).
std::optional<ApiError> promptsOf(const RequestJson& root,
                                  std::vector<std::pair<const RequestJson*, std::string>>& out) {
  const auto it = root.find("prompt");
  if (it == root.end() || it->is_null()) {
    return invalidRequest(std::string("prompt is required (") + kPromptForms + ")", "prompt");
  }
  const RequestJson& prompt = *it;
  if (!prompt.is_array() || prompt.empty() || prompt[0].is_number()) {
    out.emplace_back(&prompt, "prompt");
    return std::nullopt;
  }
  if (prompt.size() > static_cast<size_t>(kMaxBatchedPrompts)) {
    return invalidRequest("prompt holds " + std::to_string(prompt.size()) + " prompts; at most " +
                              std::to_string(kMaxBatchedPrompts) + " are accepted in one request",
                          "prompt");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string name = "prompt[" + std::to_string(i) + "]";
    if (!prompt[i].is_string() && !prompt[i].is_array()) {
      return invalidRequest(
          name + " must be a string or an array of token ids, got " + prompt[i].type_name(), name);
    }
    out.emplace_back(&prompt[i], name);
  }
  return std::nullopt;
}

// One prompt (promptsOf), tokenized and, with truncate_prompt_tokens, cut.
std::optional<ApiError> readPrompt(FieldReader& fields, const RequestJson& prompt,
                                   const std::string& name, const ServerLimits& limits,
                                   const Tokenizer& tokenizer, bool add_special_tokens,
                                   ParsedRequest& parsed) {
  if (prompt.is_string()) {
    const auto& text = prompt.get_ref<const std::string&>();
    if (text.empty()) return invalidRequest(name + " must not be empty", name);
    if (auto error = checkTextFits(text, limits, tokenizer,
                                   parsed.truncate_prompt_tokens.has_value(), name, name)) {
      return error;
    }
    // Kept only when whole: a cut text may be 60 MB.
    if (!encodePrompt(text, parsed, tokenizer, add_special_tokens)) parsed.prompt_text = text;
    return std::nullopt;
  }
  if (!prompt.is_array()) {
    return invalidRequest(name + " must be " + kPromptForms + ", got " + prompt.type_name(), name);
  }
  if (prompt.empty()) return invalidRequest(name + " must not be empty", name);
  auto ids = readTokenIds(fields, name, prompt, limits.vocab_size);
  if (!ids) return fields.error();
  // Token ids are cut as given (vLLM's too).
  if (parsed.truncate_prompt_tokens &&
      static_cast<int64_t>(ids->size()) > *parsed.truncate_prompt_tokens) {
    ids->erase(ids->begin(), ids->end() - *parsed.truncate_prompt_tokens);
  }
  parsed.request.prompt = std::move(*ids);
  return std::nullopt;
}

// The chat prompt: the model's template applied to the request's chat fields
// (chat_request.h), object keys in the order sent, as templates see them.
Result<std::string> renderMessages(const RequestJson& root, const ServerLimits& limits,
                                   const std::atomic<bool>* cancel,
                                   std::string* template_time = nullptr) {
  return renderChatRequest(root, limits.chat_template.get(), cancel, template_time,
                           /*reasoning_as_thinking=*/limits.chat_output.harmony());
}

Result<ParsedRequest> parseCompletion(std::string_view body, const ServerLimits& limits,
                                      const Tokenizer& tokenizer) {
  auto root = parseJsonObject(body, limits);
  if (!root.isOk()) return root.error();
  ParsedRequest parsed;
  if (auto error = checkModel(root.value(), limits, /*required=*/true, &parsed.model)) {
    return *error;
  }
  parsed.request.adapter = adapterOf(parsed.model, limits);
  FieldReader fields(root.value());
  readCommonFields(fields, limits, tokenizer, parsed);
  // echo with max_tokens 0 scores the prompt (OpenAI's legacy completions,
  // which vLLM keeps): one token is computed and none reported.
  const char* max_tokens_name = maxTokensName(fields);
  const RequestJson* max_tokens_field = fields.find(max_tokens_name);
  const bool echo_only = parsed.echo && max_tokens_field != nullptr &&
                         max_tokens_field->is_number_integer() &&
                         max_tokens_field->get<int64_t>() == 0;
  const auto max_tokens =
      echo_only ? std::optional<int64_t>(1) : readMaxTokens(fields, max_tokens_name);
  parsed.request.report_no_output = echo_only;
  int64_t logprobs = 0;
  if (fields.readInt("logprobs", 0, limits.max_logprobs, &logprobs)) {
    parsed.request.sampling.logprobs = static_cast<int32_t>(logprobs);
    // The prompt's tokens lead the logprobs as they lead the text (not
    // again in a resumed stream: the agent it came from sent them).
    if (parsed.echo && parsed.request.resume_output.empty()) {
      askPromptLogprobs(fields, parsed, logprobs, "echo");
    }
  }
  if (fields.find("best_of") != nullptr) {
    int64_t best_of = parsed.n;
    if (fields.readInt("best_of", parsed.n, kMaxChoices, &best_of) && best_of > parsed.n &&
        parsed.stream) {
      fields.fail("best_of (" + std::to_string(best_of) + ") more than n (" +
                      std::to_string(parsed.n) +
                      ") ranks finished choices: it cannot be streamed; set stream to false",
                  "best_of");
    } else if (best_of > 1 && !parsed.kv_transfer_params.is_null()) {
      fields.fail("kv_transfer_params hands one request's KV over: best_of must be 1",
                  "kv_transfer_params");
    }
    parsed.best_of = best_of;
  }
  if (std::string suffix; fields.readString("suffix", &suffix) && !suffix.empty()) {
    fields.fail("suffix is not supported yet; leave it out or send null", "suffix");
  }
  bool add_special_tokens = true;
  fields.readBool("add_special_tokens", &add_special_tokens);
  if (!fields.ok()) return fields.error();
  if (auto error = readStructuredOutput(root.value(), /*chat=*/false, std::nullopt,
                                        &parsed.request.structured_output,
                                        &parsed.request.structured_output_field)) {
    return *error;
  }

  std::vector<std::pair<const RequestJson*, std::string>> prompts;
  if (auto error = promptsOf(root.value(), prompts)) return *error;
  if (prompts.size() > 1) {
    // A batch: each prompt is its own request (n choices each), answered
    // together by one agent.
    const auto candidates = static_cast<int64_t>(prompts.size()) * parsed.best_of;
    if (candidates > kMaxBatchedPrompts) {
      return invalidRequest("prompt holds " + std::to_string(prompts.size()) + " prompts of " +
                                std::to_string(parsed.best_of) +
                                " candidates each (best_of, or n): " + std::to_string(candidates) +
                                " engine requests; at most " + std::to_string(kMaxBatchedPrompts) +
                                " are accepted in one request",
                            "prompt");
    }
    // Each engine request holds its own copy of the token lists.
    const protocol::SamplingParams& sampling = parsed.request.sampling;
    auto entries =
        static_cast<int64_t>(sampling.logit_bias.size() + sampling.allowed_token_ids.size() +
                             sampling.stop_token_ids.size());
    for (const std::vector<TokenId>& word : sampling.bad_words_ids) {
      entries += static_cast<int64_t>(word.size());
    }
    if (candidates * entries > kMaxBatchedTokenListEntries) {
      return invalidRequest(
          "prompt holds " + std::to_string(prompts.size()) +
              " prompts: " + std::to_string(candidates) +
              " engine requests, each with its own copy of " + std::to_string(entries) +
              " entries of logit_bias, allowed_token_ids, stop_token_ids and bad_words, " +
              std::to_string(candidates * entries) + " in all; at most " +
              std::to_string(kMaxBatchedTokenListEntries) +
              " are accepted in one request (send fewer prompts at once)",
          "prompt");
    }
    if (!parsed.kv_transfer_params.is_null()) {
      return invalidRequest(
          "kv_transfer_params hands one request's KV over: prompt must be one "
          "prompt, got " +
              std::to_string(prompts.size()),
          "kv_transfer_params");
    }
    if (!parsed.request.resume_output.empty()) {
      return invalidRequest("resume_token_ids resumes one answer: prompt must be one prompt, got " +
                                std::to_string(prompts.size()),
                            "resume_token_ids");
    }
  }
  std::vector<ParsedRequest> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ParsedRequest one = i + 1 < prompts.size() ? parsed : std::move(parsed);
    const auto& [prompt, name] = prompts[i];
    if (auto error =
            readPrompt(fields, *prompt, name, limits, tokenizer, add_special_tokens, one)) {
      return *error;
    }
    if (one.echo) {
      std::string echo_text = one.prompt_text.empty()
                                  ? tokenizer.decode(one.request.prompt,
                                                     /*skip_special_tokens=*/false)
                                  : one.prompt_text;
      if (one.request.resume_output.empty()) {
        one.echo_text = std::move(echo_text);
      } else {
        // Not sent again; the output's offsets still begin after it.
        for (char c : echo_text) one.resumed_echo_chars += (c & 0xC0) != 0x80 ? 1 : 0;
      }
    }
    if (auto error =
            finishRequest(one, limits, max_tokens, max_tokens_name, name.c_str(), name.c_str())) {
      return *error;
    }
    batch.push_back(std::move(one));
  }
  if (auto error = checkPromptLogprobEntries(batch)) return *error;
  parsed = std::move(batch.front());
  for (size_t i = 1; i < batch.size(); ++i) parsed.batch.push_back(std::move(batch[i]));
  parsed.body = std::move(root).value();
  if (parsed.batch.empty() && parsed.truncate_prompt_tokens && parsed.prompt_text.empty()) {
    // Cut: whoever this body is forwarded to (the agents behind a router, a
    // decode agent) reads the ids kept, not the whole text again.
    parsed.body["prompt"] = parsed.request.prompt;
    parsed.body.erase("truncate_prompt_tokens");
  }
  return parsed;
}

// The server's output parsers as they apply to one chat request (checked
// fields: renderMessages has validated tools, tool_choice and
// chat_template_kwargs). As vLLM: tool calls are parsed only when the request
// offers tools and tool_choice is not "none"; the reasoning is over before
// the output when the rendered `prompt` closed it (reasoningEndedIn).
std::optional<protocol::ChatOutputOptions> chatOutputFor(const RequestJson& root,
                                                         const protocol::ChatOutputOptions& server,
                                                         std::string_view prompt) {
  protocol::ChatOutputOptions options = server;
  const auto tools = root.find("tools");
  const bool offers_tools = tools != root.end() && tools->is_array() && !tools->empty();
  const auto choice = root.find("tool_choice");
  const bool none = choice != root.end() && choice->is_string() && *choice == "none";
  if (!offers_tools || none) options.tool_call_parser.reset();
  // What the template rendered decides, not the kwargs: a template that
  // ignores enable_thinking still opens the reasoning.
  options.reasoning_ended_in_prompt = protocol::reasoningEndedIn(prompt);
  if (!options.reasoning_parser && !options.tool_call_parser) return std::nullopt;
  return options;
}

Result<ParsedRequest> parseChatCompletion(std::string_view body, const ServerLimits& limits,
                                          const Tokenizer& tokenizer,
                                          const std::atomic<bool>* cancel) {
  auto root = parseJsonObject(body, limits);
  if (!root.isOk()) return root.error();
  ParsedRequest parsed;
  parsed.chat = true;
  if (auto error = checkModel(root.value(), limits, /*required=*/true, &parsed.model)) {
    return *error;
  }
  parsed.request.adapter = adapterOf(parsed.model, limits);
  FieldReader fields(root.value());
  readCommonFields(fields, limits, tokenizer, parsed);
  const char* max_tokens_name = maxTokensName(fields);
  const auto max_tokens = readMaxTokens(fields, max_tokens_name);

  // Completions' best_of has no chat counterpart (OpenAI's chat API has
  // none; vLLM's V1 engine dropped it): refused, not ignored, unless it asks
  // for nothing more than n (its neutral value, which vLLM's chat request
  // accepts).
  if (const RequestJson* best_of = fields.find("best_of");
      best_of != nullptr && !best_of->is_null() &&
      !(best_of->is_number_integer() && best_of->get<int64_t>() == parsed.n)) {
    fields.fail("best_of is not supported for chat completions; use n, or /v1/completions (" +
                    std::to_string(parsed.n) + ", the value of n, is accepted)",
                "best_of");
  }

  bool logprobs = false;
  fields.readBool("logprobs", &logprobs);
  int64_t top_logprobs = 0;
  const bool has_top = fields.readInt("top_logprobs", 0, limits.max_logprobs, &top_logprobs);
  // 0 without logprobs asks for nothing (clients send it by default), as
  // vLLM accepts it.
  if (has_top && top_logprobs > 0 && !logprobs) {
    fields.fail("top_logprobs requires logprobs to be true", "top_logprobs");
  }
  if (logprobs) parsed.request.sampling.logprobs = static_cast<int32_t>(top_logprobs);

  bool add_special_tokens = false;
  fields.readBool("add_special_tokens", &add_special_tokens);
  bool include_reasoning = true;  // vLLM's
  fields.readBool("include_reasoning", &include_reasoning);
  if (!fields.ok()) return fields.error();

  std::string template_time;
  auto text = renderMessages(root.value(), limits, cancel, &template_time);
  if (!text.isOk()) return text.error();
  // After the messages: tools and tool_choice are checked there.
  if (auto error = readStructuredOutput(
          root.value(), /*chat=*/true, limits.chat_output.tool_call_parser,
          &parsed.request.structured_output, &parsed.request.structured_output_field)) {
    return *error;
  }
  parsed.prompt_text = std::move(text).value();
  if (auto error = checkTextFits(parsed.prompt_text, limits, tokenizer,
                                 parsed.truncate_prompt_tokens.has_value(), "the rendered chat",
                                 "messages")) {
    return *error;
  }
  parsed.chat_output = chatOutputFor(root.value(), limits.chat_output, parsed.prompt_text);
  if (parsed.chat_output) parsed.chat_output->include_reasoning = include_reasoning;
  // The harmony parser reads the markers, which are special tokens: they
  // stay in the text (the parser takes them out of what the client sees).
  const bool harmony = parsed.chat_output && parsed.chat_output->harmony();
  if (harmony) parsed.request.sampling.skip_special_tokens = false;
  // A reasoning model thinks first: the constraint (a schema, a forced tool
  // call) starts where its reasoning ends, as vLLM's, so the reasoning
  // parser finds the structure in the content. Harmony's reasoning ends
  // with special tokens no grammar writes: there the constraint holds from
  // the first token, and the output, without a header, is content.
  if (parsed.request.structured_output && parsed.chat_output && !harmony &&
      parsed.chat_output->reasoning_parser && !parsed.chat_output->reasoning_ended_in_prompt) {
    parsed.request.structured_output->after = "</think>";
  }
  if (encodePrompt(parsed.prompt_text, parsed, tokenizer, add_special_tokens)) {
    std::string().swap(parsed.prompt_text);  // its memory too
  }
  if (auto error =
          finishRequest(parsed, limits, max_tokens, max_tokens_name, "chat prompt", "messages")) {
    return *error;
  }
  if (auto error = checkPromptLogprobEntries(std::span(&parsed, 1))) return *error;
  parsed.body = std::move(root).value();
  // Whoever renders the forwarded body (a prefill and a decode agent, a
  // resuming one) shows the time this render showed.
  if (const auto it = parsed.body.find("chat_template_time");
      it == parsed.body.end() || it->is_null()) {
    parsed.body["chat_template_time"] = template_time;
  }
  return parsed;
}

Result<json> tokenize(std::string_view body, const ServerLimits& limits, const Tokenizer& tokenizer,
                      const std::atomic<bool>* cancel) {
  auto root = parseJsonObject(body, limits);
  if (!root.isOk()) return root.error();
  std::string model;
  if (auto error = checkModel(root.value(), limits, /*required=*/false, &model)) return *error;
  FieldReader fields(root.value());
  const bool has_prompt = fields.find("prompt") != nullptr;
  const bool has_messages = fields.find("messages") != nullptr;
  if (has_prompt == has_messages) {
    return invalidRequest(has_prompt ? "prompt and messages cannot both be given; send one"
                                     : "prompt or messages is required",
                          has_prompt ? "messages" : "prompt");
  }
  bool add_special_tokens = has_prompt;  // vLLM's defaults
  fields.readBool("add_special_tokens", &add_special_tokens);
  bool return_token_strs = false;
  fields.readBool("return_token_strs", &return_token_strs);
  std::string text;
  if (has_prompt) {
    fields.readString("prompt", &text);
    if (!fields.ok()) return fields.error();
  } else {
    if (!fields.ok()) return fields.error();
    auto rendered = renderMessages(root.value(), limits, cancel);
    if (!rendered.isOk()) return rendered.error();
    text = std::move(rendered).value();
  }
  if (auto error = checkTextFits(text, limits, tokenizer, /*truncating=*/false,
                                 has_prompt ? "prompt" : "the rendered chat",
                                 has_prompt ? "prompt" : "messages")) {
    return *error;
  }
  const std::vector<TokenId> ids = tokenizer.encode(text, add_special_tokens);
  json response = {{"count", ids.size()}, {"max_model_len", limits.max_model_len}, {"tokens", ids}};
  if (return_token_strs) {
    json strs = json::array();
    for (TokenId id : ids) strs.push_back(tokenizer.idToToken(id).value_or(""));
    response["token_strs"] = std::move(strs);
  }
  return response;
}

Result<json> detokenize(std::string_view body, const ServerLimits& limits,
                        const Tokenizer& tokenizer) {
  auto root = parseJsonObject(body, limits);
  if (!root.isOk()) return root.error();
  std::string model;
  if (auto error = checkModel(root.value(), limits, /*required=*/false, &model)) return *error;
  FieldReader fields(root.value());
  const RequestJson* tokens = fields.find("tokens");
  if (tokens == nullptr)
    return invalidRequest("tokens is required (an array of token ids)", "tokens");
  if (!tokens->is_array()) {
    return invalidRequest(
        std::string("tokens must be an array of token ids, got ") + tokens->type_name(), "tokens");
  }
  // Text for more ids than a sequence can hold is not a detokenization any
  // request needs, and its answer could be hundreds of times the body.
  if (limits.max_model_len > 0 && static_cast<int64_t>(tokens->size()) > limits.max_model_len) {
    return invalidRequest("tokens must hold at most " + std::to_string(limits.max_model_len) +
                              " ids (max_model_len), got " + std::to_string(tokens->size()),
                          "tokens");
  }
  auto ids = readTokenIds(fields, "tokens", *tokens, limits.vocab_size);
  if (!ids) return fields.error();
  return json{{"prompt", tokenizer.decodeAsTransformers(*ids)}};
}

}  // namespace

// ---------------------------------------------------------------------------
// Errors

std::string compactDump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string compactDump(const ResponseJson& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError serverError(std::string message) {
  return ApiError{500, std::move(message), "server_error", "", ""};
}

ApiError boundsError(const JsonParseError& error, const std::string& field) {
  if (error.tooManyValues()) {
    const std::string limit = std::to_string(error.value_limit);
    return invalidRequest(
        (field.empty() ? std::string("the request body") : field) + " holds more than " + limit +
            " JSON values (array elements and object members); at most " + limit + " are accepted",
        field);
  }
  // The path without its trailing ellipsis is the param: the deepest field
  // the message can name.
  std::string path = error.path;
  if (const size_t cut = path.find("…"); cut != std::string::npos) path.erase(cut);
  std::string param = field;
  if (!path.empty()) param += (param.empty() || path.front() == '[' ? "" : ".") + path;
  const std::string where = field.empty() ? "the request body" : field;
  const std::string limit = std::to_string(error.depth_limit);
  return invalidRequest(where + " nests arrays and objects deeper than " + limit + " levels" +
                            (error.path.empty() ? "" : " (at " + error.path + ")") + "; at most " +
                            limit + " levels are accepted",
                        param);
}

int64_t engineRequestsOf(const ParsedRequest& request) {
  return request.best_of * (1 + std::ssize(request.batch));
}

ApiError tooManyEngineRequests(const ParsedRequest& request, int64_t most,
                               std::string_view holder) {
  // The field that made it so many (best_of is n unless given).
  const std::string field = !request.batch.empty()        ? "prompt"
                            : request.best_of > request.n ? "best_of"
                                                          : "n";
  const char* why = !request.batch.empty() ? "prompts x best_of"
                    : field == "n"         ? "one per choice"
                                           : "one per best_of candidate";
  return invalidRequest("this request is " + std::to_string(engineRequestsOf(request)) +
                            " engine requests (" + why + "), more than " + std::string(holder) +
                            " holds at once (" + std::to_string(most) + ")",
                        field);
}

ApiError invalidRequest(std::string message, std::string param) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

json errorBody(const ApiError& error) {
  return {{"error",
           {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

ApiError fromStatus(const Status& status, std::string param) {
  ApiError error{500, status.message(), "server_error", std::move(param), ""};
  // A client's error names the field first (connectors' descriptor checks,
  // the engine's own): that is its param unless the caller knows better.
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied:
      if (error.param.empty()) error.param = leadingField(status.message());
      break;
    default:
      break;
  }
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      error.status = 400;
      error.type = "invalid_request_error";
      break;
    case StatusCode::kNotFound:
      error.status = 404;
      error.type = "not_found_error";
      break;
    case StatusCode::kPermissionDenied:
      error.status = 403;
      error.type = "permission_error";
      break;
    case StatusCode::kResourceExhausted:
      error.status = 429;
      error.type = "rate_limit_exceeded";
      break;
    case StatusCode::kUnimplemented:
      error.status = 501;
      error.type = "not_implemented_error";
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kAborted:
      error.status = 503;
      error.type = "service_unavailable";
      break;
    case StatusCode::kDeadlineExceeded:
      error.status = 504;
      error.type = "timeout_error";
      break;
    case StatusCode::kOk:
      // Only a caller's bug turns an OK status into an error response.
      error.message = "internal error: an OK status was reported as an error";
      break;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
      break;
  }
  return error;
}

// ---------------------------------------------------------------------------
// Requests

Result<ParsedRequest> parseCompletionRequest(std::string_view body, const ServerLimits& limits,
                                             const Tokenizer& tokenizer) {
  return guarded<ParsedRequest>([&] { return parseCompletion(body, limits, tokenizer); });
}

Result<ParsedRequest> parseChatCompletionRequest(std::string_view body, const ServerLimits& limits,
                                                 const Tokenizer& tokenizer,
                                                 const std::atomic<bool>* cancel) {
  return guarded<ParsedRequest>(
      [&] { return parseChatCompletion(body, limits, tokenizer, cancel); });
}

Result<json> tokenizeResponse(std::string_view body, const ServerLimits& limits,
                              const Tokenizer& tokenizer, const std::atomic<bool>* cancel) {
  return guarded<json>([&] { return tokenize(body, limits, tokenizer, cancel); });
}

Result<json> detokenizeResponse(std::string_view body, const ServerLimits& limits,
                                const Tokenizer& tokenizer) {
  return guarded<json>([&] { return detokenize(body, limits, tokenizer); });
}

}  // namespace tandem::server
