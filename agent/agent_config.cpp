#include "agent/agent_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "agent/engine/speculative.h"
#include "agent/kv/connector.h"
#include "common/closest_match.h"
#include "common/decimal_text.h"
#include "common/file_text.h"
#include "common/http/http_limits.h"
#include "common/json_parse.h"
#include "common/protocol/reasoning_parser.h"
#include "common/protocol/tool_call_parser.h"
#include "common/status.h"

namespace tandem::agent {
namespace {

// The largest agent configuration file read (--config): real ones are a
// few KB.
constexpr uint64_t kMaxConfigFileBytes = 16ull << 20;

// A checked value, in the form its kind needs.
struct Value {
  std::string text;  // kString, kChoice, kBytes (the size as written), kJson (compact JSON)
  int64_t integer = 0;
  double number = 0;
  bool flag = false;
};

using Setter = std::function<void(ServeOptions&, const Value&)>;

struct Row {
  OptionSpec spec;
  Setter set;
};

Row text(std::string key, std::string help, std::string ServeOptions::*field) {
  return {{std::move(key), OptionKind::kString, 0, 0, {}, std::move(help)},
          [field](ServeOptions& o, const Value& v) { o.*field = v.text; }};
}

template <typename T>
Row integer(std::string key, int64_t min, int64_t max, std::string help, T ServeOptions::*field) {
  return {{std::move(key), OptionKind::kInteger, min, max, {}, std::move(help)},
          [field](ServeOptions& o, const Value& v) { o.*field = static_cast<T>(v.integer); }};
}

Row seconds(std::string key, std::string help, double ServeOptions::*field) {
  return {{std::move(key),
           OptionKind::kSeconds,
           0,
           static_cast<int64_t>(kMaxTimeoutSeconds),
           {},
           std::move(help)},
          [field](ServeOptions& o, const Value& v) { o.*field = v.number; }};
}

Row choice(std::string key, std::vector<std::string> choices, std::string help,
           std::string ServeOptions::*field) {
  return {{std::move(key), OptionKind::kChoice, 0, 0, std::move(choices), std::move(help)},
          [field](ServeOptions& o, const Value& v) { o.*field = v.text; }};
}

Row flag(std::string key, std::string help, bool ServeOptions::*field) {
  return {{std::move(key), OptionKind::kFlag, 0, 0, {}, std::move(help)},
          [field](ServeOptions& o, const Value& v) { o.*field = v.flag; }};
}

const std::vector<Row>& rows() {
  static const std::vector<Row> kRows = {
      text("model", "Hugging Face model directory", &ServeOptions::model),
      text("host", "address to listen on", &ServeOptions::host),
      integer("port", 0, 65535, "port (0: any free port)", &ServeOptions::port),
      text("served_model_name", "model name in the API (default: the directory name)",
           &ServeOptions::served_model_name),
      text("api_key",
           "clients must send Authorization: Bearer <key> (default: the TANDEM_API_KEY "
           "environment variable; prefer it, a flag shows in ps)",
           &ServeOptions::api_key),
      text("api_key_exempt_paths",
           "paths served without the API key, comma-separated (ending in '/': a prefix)",
           &ServeOptions::api_key_exempt_paths),
      text("lora_modules",
           "LoRA adapters served beside the model, NAME=PATH comma-separated: a request whose "
           "model is NAME runs with the PEFT adapter in PATH (docs/lora.md; CPU engines)",
           &ServeOptions::lora_modules),
      text("chat_template",
           "Jinja chat template file used instead of the model's (parsed at start-up)",
           &ServeOptions::chat_template),
      choice("tool_call_parser", protocol::toolCallParserNames(),
             "turn tool calls in chat output into tool_calls (needs tools in the request)",
             &ServeOptions::tool_call_parser),
      choice("reasoning_parser", protocol::reasoningParserNames(),
             "split chat output into reasoning_content and content: <think>...</think>, or "
             "gpt-oss's harmony channels (openai_gptoss; the default for gpt-oss)",
             &ServeOptions::reasoning_parser),
      choice("generation_config", {"auto", "vllm"},
             "request defaults: auto (the model's generation_config.json temperature, top_p, "
             "top_k, min_p, repetition_penalty, max_new_tokens) or vllm (built-in defaults)",
             &ServeOptions::generation_config),
      integer("block_size", 1, kMaxBlockSize, "KV block size in tokens", &ServeOptions::block_size),
      {{"kv_cache_memory",
        OptionKind::kBytes,
        1,
        kMaxKvCacheMemory,
        {},
        "KV cache size, e.g. 2GiB"},
       [](ServeOptions& o, const Value& v) { o.kv_cache_memory = v.text; }},
      integer("num_blocks", 0, kMaxNumBlocks, "KV blocks (0: as many as --kv-cache-memory holds)",
              &ServeOptions::num_blocks),
      choice("kv_dtype", {"bf16", "f32", "fp8"},
             "KV cache dtype (fp8: e4m3 with the checkpoint's K/V scales, CPU)",
             &ServeOptions::kv_dtype),
      choice("compute_dtype", {"auto", "f32", "bf16"},
             "what the GEMMs multiply: f32 (exact products) or bf16 (activations rounded to "
             "bf16, for bf16 weights); auto: bf16 on CUDA (its tensor-core kernels), f32 on the "
             "CPU",
             &ServeOptions::compute_dtype),
      integer("max_num_batched_tokens", 1, kMaxNumBatchedTokens, "tokens per step",
              &ServeOptions::max_num_batched_tokens),
      integer("max_num_seqs", 1, kMaxNumSeqs, "sequences per step", &ServeOptions::max_num_seqs),
      choice("scheduling_policy", {"fcfs", "priority"},
             "the order requests are served in: fcfs (first come, first served) or priority "
             "(by each request's priority, lower first; a better one may preempt a worse one)",
             &ServeOptions::scheduling_policy),
      integer("max_model_len", 0, kMaxModelLen, "context length (0: the model's)",
              &ServeOptions::max_model_len),
      integer("max_waiting_requests", 1, kMaxWaitingRequests, "queued requests before 503",
              &ServeOptions::max_waiting_requests),
      integer("max_header_bytes", server::kMaxHeaderBytesRange.min,
              server::kMaxHeaderBytesRange.max, "bytes of a request line and headers before 431",
              &ServeOptions::max_header_bytes),
      integer("max_body_bytes", server::kMaxBodyBytesRange.min, server::kMaxBodyBytesRange.max,
              "bytes of a request body before 413", &ServeOptions::max_body_bytes),
      integer("request_timeout", server::kRequestTimeoutRange.min, server::kRequestTimeoutRange.max,
              "seconds to receive a request, from its first byte",
              &ServeOptions::request_timeout_s),
      integer("idle_timeout", server::kIdleTimeoutRange.min, server::kIdleTimeoutRange.max,
              "seconds a keep-alive connection may wait for its next request",
              &ServeOptions::idle_timeout_s),
      integer("write_timeout", server::kWriteTimeoutRange.min, server::kWriteTimeoutRange.max,
              "seconds one write to a client may take", &ServeOptions::write_timeout_s),
      integer("large_body_bytes", server::kLargeBodyBytesRange.min,
              server::kLargeBodyBytesRange.max, "a body over this (or chunked) is large",
              &ServeOptions::large_body_bytes),
      integer("max_large_requests", server::kMaxLargeRequestsRange.min,
              server::kMaxLargeRequestsRange.max,
              "large requests read and handled at once; one more gets 503",
              &ServeOptions::max_large_requests),
      integer("max_connections", server::kMaxConnectionsRange.min, server::kMaxConnectionsRange.max,
              "client connections open at once; one more closes the one idle longest, or gets "
              "503 when none is idle (0: half the descriptor limit, at most 65536)",
              &ServeOptions::max_connections),
      choice("role", {"prefill", "decode", "both"}, "metrics role label", &ServeOptions::role),
      choice("prefix_caching_hash", {"xxhash", "sha256"}, "block hash",
             &ServeOptions::prefix_caching_hash),
      seconds("shutdown_timeout", "seconds to finish in-flight requests on SIGTERM",
              &ServeOptions::shutdown_timeout_s),
      {{"kv_transfer_config",
        OptionKind::kJson,
        0,
        0,
        {},
        "KV connector, e.g. {\"kv_connector\":\"storage\",\"kv_role\":\"kv_both\","
        "\"kv_connector_extra_config\":{\"shared_storage_path\":\"/tmp/kv\"}}",
        [](const std::string& text) { return kv::KvTransferConfig::parse(text).status(); }},
       [](ServeOptions& o, const Value& v) { o.kv_transfer_config = v.text; }},
      {{"speculative_config",
        OptionKind::kJson,
        0,
        0,
        {},
        "speculative decoding by prompt lookup (docs/speculative-decoding.md), e.g. "
        "{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_max\":4,"
        "\"prompt_lookup_min\":2}",
        [](const std::string& text) { return engine::SpeculativeConfig::parse(text).status(); }},
       [](ServeOptions& o, const Value& v) { o.speculative_config = v.text; }},
      {{"hf_overrides",
        OptionKind::kJson,
        0,
        0,
        {},
        "config.json fields replaced before the model is read (vLLM's --hf-overrides), e.g. "
        "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
        "\"original_max_position_embeddings\":32768}}",
        [](const std::string& text) { return parseJsonObject(text, "hf-overrides").status(); }},
       [](ServeOptions& o, const Value& v) { o.hf_overrides = v.text; }},
      flag("insecure_kv",
           "let a ucx KV producer or consumer listen on a non-loopback address without a shared "
           "secret",
           &ServeOptions::insecure_kv),
      integer("kv_hold_max_blocks", 0, kMaxNumBlocks,
              "KV blocks one pull-back hold may pin (0: a quarter of the KV cache)",
              &ServeOptions::kv_hold_max_blocks),
      integer("kv_hold_max_total_blocks", 0, kMaxNumBlocks,
              "KV blocks all pull-back holds together may pin (0: half of the KV cache)",
              &ServeOptions::kv_hold_max_total_blocks),
      seconds("kv_hold_yield_after",
              "seconds a finished prefill's KV blocks stay held for a reader that has not come "
              "before waiting requests that need them may take them (0: until the reader or the "
              "connector's abort_timeout_s)",
              &ServeOptions::kv_hold_yield_after_s),
      flag("return_tokens_as_token_ids",
           "logprobs name each token token_id:<id> rather than its text, unless the request's "
           "return_tokens_as_token_ids says otherwise",
           &ServeOptions::return_tokens_as_token_ids),
      flag("enable_fault_injection",
           "accept kv_connector_extra_config.fault_injection (tests only)",
           &ServeOptions::enable_fault_injection),
      integer("threads", 0, kMaxThreads, "kernel threads (0: every CPU it may use)",
              &ServeOptions::threads),
      choice("device", {"cpu", "cuda", "auto"},
             "compute backend (auto: cuda when this build has it and a GPU is visible, else cpu)",
             &ServeOptions::device),
      flag("enforce_eager", "run every decode step as issued (no CUDA graphs)",
           &ServeOptions::enforce_eager),
      choice("fuse_projections", {"auto", "true", "false"},
             "compute Q/K/V and gate/up as one matmul each, with the CUDA fast kernels each "
             "matmul's next step in its epilogue and its input made by the kernel before (the "
             "same bits, fewer and wider launches); auto: true on CUDA, false on the CPU",
             &ServeOptions::fuse_projections),
      choice("cuda_kernels", {"auto", "reference", "fast", "flash"},
             "CUDA kernels: auto (flash on CUDA), reference (the plain kernels the fast ones "
             "are checked against), fast (same bits; decode GEMV, grouped attention, and the "
             "bf16 tensor-core GEMMs --compute-dtype bf16 needs) or flash (fast, with "
             "tensor-core attention over bf16 KV caches: its own bits)",
             &ServeOptions::cuda_kernels),
      text("simulate",
           "step profile YAML: simulate the forward pass, each step lasting what the profile "
           "predicts (docs/simulation.md)",
           &ServeOptions::simulate),
  };
  return kRows;
}

std::string kebab(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

std::string snake(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// A value as the user wrote it, cut short and quoted when it is text.
std::string shown(const std::string& text, bool quote) {
  std::string out = text.size() > 80 ? text.substr(0, 80) + "..." : text;
  return quote ? "\"" + out + "\"" : out;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& word : words) out += (out.empty() ? "" : ", ") + word;
  return out;
}

// `name` is "--flag" or "file: key"; `got` the value as it is shown.
[[noreturn]] void refuse(const OptionSpec& spec, const std::string& name, const std::string& got) {
  throw Error(name + " must be " + spec.accepted() + ", got " + got);
}

// A JSON option's value, checked by its own parser (OptionSpec::
// check_json); the error names the flag or the file and key.
void checkJsonOption(const OptionSpec& spec, const std::string& name,
                     const std::string& json_text) {
  const Status status = spec.check_json(json_text);
  if (status.isOk()) return;
  const std::string prefix = spec.flag().substr(2);
  std::string message = status.message();
  if (message.starts_with(prefix)) message = message.substr(prefix.size());
  throw Error(name + message);
}

Value checkText(const OptionSpec& spec, const std::string& name, const std::string& text) {
  Value value;
  value.text = text;
  switch (spec.kind) {
    case OptionKind::kString:
      if (text.empty()) refuse(spec, name, "an empty string");
      return value;
    case OptionKind::kInteger: {
      std::string digits = text.starts_with('+') ? text.substr(1) : text;
      int64_t parsed = 0;
      const auto [end, error] =
          std::from_chars(digits.data(), digits.data() + digits.size(), parsed);
      if (!isDecimalInteger(text) || error != std::errc() || end != digits.data() + digits.size() ||
          parsed < spec.min || parsed > spec.max) {
        refuse(spec, name, shown(text, !isDecimalInteger(text)));
      }
      value.integer = parsed;
      return value;
    }
    case OptionKind::kSeconds: {
      char* end = nullptr;
      const double parsed = text.empty() ? NAN : std::strtod(text.c_str(), &end);
      // Decimal only: strtod also reads hex ("0x10"), "inf" and spaces.
      const bool decimal = scanDecimal(text, 0, DecimalForm{}) == text.size();
      if (!decimal || end != text.c_str() + text.size() || !std::isfinite(parsed) ||
          parsed < static_cast<double>(spec.min) || parsed > static_cast<double>(spec.max)) {
        refuse(spec, name, shown(text, end != text.c_str() + text.size()));
      }
      value.number = parsed;
      return value;
    }
    case OptionKind::kBytes: {
      int64_t bytes = 0;
      try {
        bytes = parseByteSize(text, name);
      } catch (const Error&) {
        refuse(spec, name, shown(text, true));
      }
      if (bytes < spec.min || bytes > spec.max) refuse(spec, name, shown(text, true));
      return value;
    }
    case OptionKind::kChoice:
      if (std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end()) {
        refuse(spec, name, shown(text, true));
      }
      return value;
    case OptionKind::kFlag:
      if (text != "true" && text != "false") refuse(spec, name, shown(text, true));
      value.flag = text == "true";
      return value;
    case OptionKind::kJson: {
      // Nesting bounded (kMaxJsonDepth), as the option's own parser bounds
      // it: a value 100,000 levels deep, which a YAML file can carry past
      // the command line's length limit, overflowed the stack in dump().
      // The option's own parser checks the text as written (where the JSON
      // breaks, a key given twice, which the value below has lost).
      checkJsonOption(spec, name, text);
      JsonParseError error;
      const std::optional<nlohmann::json> json = parseJson(text, error);
      if (!json) refuse(spec, name, "text that is not JSON");
      value.text = json->dump();
      return value;
    }
  }
  return value;
}

std::string nodeKind(const YAML::Node& node) {
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing (null)";
}

// A YAML value for one option of the table.
Value checkYaml(const OptionSpec& spec, const std::string& name, const YAML::Node& node) {
  if (spec.kind == OptionKind::kJson && node.IsMap()) {
    nlohmann::json json;
    try {
      json = yamlToJson(node);
    } catch (const Error& e) {
      throw Error(name + ": " + e.what());
    }
    return checkText(spec, name, json.dump());
  }
  if (!node.IsScalar()) refuse(spec, name, nodeKind(node));
  std::string text = node.Scalar();
  // YAML 1.2 spells booleans true/True/TRUE (a flag's values, and those of
  // a choice such as auto|true|false).
  const bool boolean_values =
      spec.kind == OptionKind::kFlag ||
      (spec.kind == OptionKind::kChoice &&
       std::find(spec.choices.begin(), spec.choices.end(), "true") != spec.choices.end());
  if (boolean_values && node.Tag() != "!") {
    std::string lower = text;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true" || lower == "false") text = lower;
  }
  return checkText(spec, name, text);
}

bool isNullScalar(const std::string& text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

// YAML 1.2 core schema: [-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+.
std::optional<nlohmann::json> yamlInteger(const std::string& text) {
  int base = 10;
  std::string digits = text;
  bool negative = false;
  if (digits.starts_with('-') || digits.starts_with('+')) {
    negative = digits[0] == '-';
    digits = digits.substr(1);
  } else if (digits.starts_with("0x")) {
    base = 16;
    digits = digits.substr(2);
  } else if (digits.starts_with("0o")) {
    base = 8;
    digits = digits.substr(2);
  }
  if (digits.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (end != digits.data() + digits.size()) return std::nullopt;
  if (error == std::errc::result_out_of_range) {
    // Too long for 64 bits: a number, as JSON would read it.
    if (base != 10) return std::nullopt;
    return nlohmann::json(std::strtod(text.c_str(), nullptr));
  }
  if (error != std::errc()) return std::nullopt;
  if (!negative) return nlohmann::json(magnitude);
  if (magnitude > uint64_t{1} << 63) return nlohmann::json(-static_cast<double>(magnitude));
  return nlohmann::json(static_cast<int64_t>(0 - magnitude));
}

// YAML 1.2 core schema floats: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
// and .inf/.nan spelled three ways.
std::optional<nlohmann::json> yamlFloat(const std::string& text) {
  std::string rest = text.starts_with('-') || text.starts_with('+') ? text.substr(1) : text;
  const bool negative = text.starts_with('-');
  if (rest == ".inf" || rest == ".Inf" || rest == ".INF") {
    return nlohmann::json(negative ? -INFINITY : INFINITY);
  }
  if (text == ".nan" || text == ".NaN" || text == ".NAN") return nlohmann::json(NAN);
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < rest.size() && rest[i] >= '0' && rest[i] <= '9') ++i;
    return i - start;
  };
  size_t mantissa = digits();
  if (i < rest.size() && rest[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < rest.size() && (rest[i] == 'e' || rest[i] == 'E')) {
    ++i;
    if (i < rest.size() && (rest[i] == '-' || rest[i] == '+')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != rest.size()) return std::nullopt;
  return nlohmann::json(std::strtod(text.c_str(), nullptr));
}

}  // namespace

std::string OptionSpec::flag() const { return "--" + kebab(key); }

std::string OptionSpec::accepted() const {
  switch (kind) {
    case OptionKind::kString:
      return "a non-empty string";
    case OptionKind::kInteger:
      return "an integer between " + std::to_string(min) + " and " + std::to_string(max);
    case OptionKind::kSeconds:
      return "a number of seconds between " + std::to_string(min) + " and " + std::to_string(max);
    case OptionKind::kBytes:
      return "a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824";
    case OptionKind::kChoice:
      return "one of " + joined(choices);
    case OptionKind::kFlag:
      return "true or false";
    case OptionKind::kJson:
      return "a JSON object, or in YAML a mapping";
  }
  return "";
}

const std::vector<OptionSpec>& serveOptionSpecs() {
  static const std::vector<OptionSpec> kSpecs = [] {
    std::vector<OptionSpec> specs;
    for (const Row& row : rows()) specs.push_back(row.spec);
    return specs;
  }();
  return kSpecs;
}

void addServeFlags(CLI::App& command) {
  const ServeOptions defaults;
  for (const Row& row : rows()) {
    const OptionSpec& spec = row.spec;
    std::string help = spec.help;
    if (spec.kind == OptionKind::kFlag) {
      // A const description: CLI11 takes a non-const string as the
      // variable the flag's value is written to.
      command.add_flag(spec.flag(), std::as_const(help));
      continue;
    }
    if (spec.kind != OptionKind::kString && spec.kind != OptionKind::kJson) {
      help += " (" + spec.accepted() + ")";
    }
    CLI::Option* option = command.add_option(spec.flag(), CLI::callback_t(), help);
    option->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    switch (spec.kind) {
      case OptionKind::kInteger:
        option->type_name("INT");
        break;
      case OptionKind::kSeconds:
        option->type_name("SECONDS");
        break;
      case OptionKind::kBytes:
        option->type_name("SIZE");
        break;
      case OptionKind::kJson:
        option->type_name("JSON");
        break;
      default:
        option->type_name("TEXT");
        break;
    }
  }
  // The defaults, shown by --help, are the ServeOptions' own.
  command.get_option("--host")->default_str(defaults.host);
  command.get_option("--port")->default_str(std::to_string(defaults.port));
  command.get_option("--block-size")->default_str(std::to_string(defaults.block_size));
  command.get_option("--kv-cache-memory")->default_str(defaults.kv_cache_memory);
  command.get_option("--kv-dtype")->default_str(defaults.kv_dtype);
  command.get_option("--compute-dtype")->default_str(defaults.compute_dtype);
  command.get_option("--device")->default_str(defaults.device);
  command.get_option("--cuda-kernels")->default_str(defaults.cuda_kernels);
  command.get_option("--max-num-batched-tokens")
      ->default_str(std::to_string(defaults.max_num_batched_tokens));
  command.get_option("--max-num-seqs")->default_str(std::to_string(defaults.max_num_seqs));
  command.get_option("--scheduling-policy")->default_str(defaults.scheduling_policy);
  command.get_option("--max-waiting-requests")
      ->default_str(std::to_string(defaults.max_waiting_requests));
  command.get_option("--role")->default_str(defaults.role);
  command.get_option("--prefix-caching-hash")->default_str(defaults.prefix_caching_hash);
  auto seconds_default = [&](const char* flag, double seconds) {
    std::ostringstream text;
    text << seconds;
    command.get_option(flag)->default_str(text.str());
  };
  seconds_default("--shutdown-timeout", defaults.shutdown_timeout_s);
  seconds_default("--kv-hold-yield-after", defaults.kv_hold_yield_after_s);
}

YAML::Node loadServeConfigFile(const std::string& path) {
  // A directory, a FIFO or a device in the file's place is refused naming
  // it (not read through, nor waited on); a configuration is a few KB.
  const std::optional<std::string> text = readModelFile(path, kMaxConfigFileBytes);
  if (!text) throw Error(path + ": cannot open: no such file");
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(*text);
  } catch (const YAML::Exception& e) {
    throw Error(path + ": " + e.what());
  }
  // A second document would be ignored, its options with it.
  if (documents.size() > 1) {
    throw Error(path + ": holds " + std::to_string(documents.size()) +
                " YAML documents, the second at line " +
                std::to_string(documents[1].Mark().line + 1) +
                " (accepted: one mapping of option names to values)");
  }
  YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
  // A file of comments only sets nothing.
  if (root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw Error(path + ": must be a mapping of option names to values");
  return root;
}

int64_t checkedIntegerOption(std::string_view key, const std::string& text) {
  for (const OptionSpec& spec : serveOptionSpecs()) {
    if (spec.key == key && spec.kind == OptionKind::kInteger) {
      return checkText(spec, spec.flag(), text).integer;
    }
  }
  throw Error("no integer option " + std::string(key));
}

void applyServeOptions(CLI::App& command, const YAML::Node& config, const std::string& config_path,
                       ServeOptions& options) {
  // The YAML entries by option key; snake_case and kebab-case name the same
  // option.
  std::map<std::string, std::pair<std::string, YAML::Node>> entries;
  std::vector<std::string> accepted;
  for (const Row& row : rows()) accepted.push_back(row.spec.key);
  // Options registered on the command outside the table.
  std::set<std::string> table_keys(accepted.begin(), accepted.end());
  std::map<std::string, CLI::Option*> other_options;
  for (CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      const std::string key = snake(name);
      if (table_keys.count(key) > 0 || key == "config" || key == "help") continue;
      other_options[key] = option;
      accepted.push_back(key);
    }
  }
  if (config && config.IsMap()) {
    for (const auto& entry : config) {
      if (!entry.first.IsScalar()) {
        throw Error(config_path + ": keys must be option names (accepted: " + joined(accepted) +
                    ")");
      }
      const std::string written = entry.first.Scalar();
      const std::string key = snake(written);
      if (std::find(accepted.begin(), accepted.end(), key) == accepted.end()) {
        std::string message = config_path + ": unknown key \"" + written + "\"";
        if (std::string near = closestMatch(key, accepted); !near.empty()) {
          message += " (did you mean " + near + "?)";
        }
        throw Error(message + "; accepted keys: " + joined(accepted));
      }
      if (auto [it, inserted] = entries.emplace(key, std::pair{written, entry.second}); !inserted) {
        throw Error(config_path + ": " + key + " is given twice (as " + it->second.first + " and " +
                    written + ")");
      }
    }
  }

  for (const Row& row : rows()) {
    const OptionSpec& spec = row.spec;
    const CLI::Option* option = command.get_option(spec.flag());
    // --threads also belongs to the program, before the subcommand.
    if (option->count() == 0 && spec.key == "threads" && command.get_parent() != nullptr) {
      if (const CLI::Option* outer = command.get_parent()->get_option_no_throw("--threads");
          outer != nullptr && outer->count() > 0) {
        option = outer;
      }
    }
    // The file's value is checked even when a flag replaces it: a file
    // that one command line happens to cover is still refused, as vLLM's
    // --config (read as arguments before the command line's) is.
    std::optional<Value> from_file;
    if (auto it = entries.find(spec.key); it != entries.end()) {
      from_file = checkYaml(spec, config_path + ": " + it->second.first, it->second.second);
    }
    if (option->count() > 0) {
      // A flag given bare reads "true"; --flag=false reads "false" (and
      // anything but those two is refused, as in the file).
      row.set(options, checkText(spec, spec.flag(), option->results().back()));
    } else if (from_file) {
      row.set(options, *from_file);
    }
  }

  for (const auto& [key, option] : other_options) {
    auto it = entries.find(key);
    if (it == entries.end() || option->count() > 0) continue;
    const std::string name = config_path + ": " + it->second.first;
    const YAML::Node& node = it->second.second;
    if (!node.IsScalar()) throw Error(name + " must be a single value, got " + nodeKind(node));
    try {
      option->add_result(node.Scalar());
      option->run_callback();
    } catch (const CLI::Error& e) {
      throw Error(name + ": " + e.what());
    }
  }
}

nlohmann::json yamlToJson(const YAML::Node& node, int depth) {
  if ((node.IsMap() || node.IsSequence()) && depth >= kMaxJsonDepth) {
    throw Error("a YAML value nests deeper than " + std::to_string(kMaxJsonDepth) +
                " levels (line " + std::to_string(node.Mark().line + 1) + ")");
  }
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) throw Error("a YAML mapping key must be a scalar");
        if (object.contains(entry.first.Scalar())) {
          throw Error("key " + entry.first.Scalar() + " is given twice (line " +
                      std::to_string(entry.first.Mark().line + 1) + ")");
        }
        object[entry.first.Scalar()] = yamlToJson(entry.second, depth + 1);
      }
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& element : node) array.push_back(yamlToJson(element, depth + 1));
      return array;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      // Quoted scalars ("8", '8') have the tag "!" and stay strings; plain
      // ones ("?") are typed as YAML 1.2's core schema says.
      if (node.Tag() != "?") return text;
      if (isNullScalar(text)) return nullptr;
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
      if (auto number = yamlInteger(text)) return *number;
      if (auto number = yamlFloat(text)) return *number;
      return text;
    }
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
  }
  return nullptr;
}

}  // namespace tandem::agent
