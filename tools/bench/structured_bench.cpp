#include "tools/bench/structured_bench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>

#include "agent/engine/engine.h"
#include "common/status.h"
#include "common/structured/constraint.h"
#include "common/structured/json_schema.h"
#include "common/structured/matcher.h"
#include "common/structured/tool_calls.h"
#include "common/tokenizer.h"

namespace tandem::bench {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct Schema {
  const char* name;
  const char* text;  // empty: any JSON object
};

// Typical shapes: a function-calling tool, a nested record with bounded
// fields, a list of records, a recursive type, json_object.
const Schema kSchemas[] = {
    {"tool_call", R"({"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
      "required": ["location", "unit"], "additionalProperties": false})"},
    {"person", R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "[0-9]{5}"}},
          "required": ["city"]},
        "member": {"type": "boolean"}},
      "required": ["name", "age", "member"]})"},
    {"order_lines", R"({"type": "array", "minItems": 1, "maxItems": 20, "items": {
        "type": "object", "properties": {
          "sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{4}"},
          "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
          "price": {"type": "number"},
          "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["sku", "quantity", "price"]}})"},
    {"tree", R"({"$defs": {"node": {"type": "object", "properties": {
        "label": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 4}},
      "required": ["label"]}}, "$ref": "#/$defs/node"})"},
    {"json_object", ""},
    // tool_choice "auto" with the tool_call schema as a strict function
    // (hermes format): free text until a call begins.
    {"tool_auto", "tool_auto"},
};

// A schema's grammar: the JSON schema, any JSON object, or tool_auto's
// optional calls.
StatusOr<structured::Grammar> schemaGrammar(const Schema& schema) {
  if (*schema.text == '\0') return structured::anyJsonObjectGrammar();
  if (std::string_view(schema.text) == "tool_auto") {
    const ordered_json tools =
        ordered_json::array({{{"name", "get_weather"},
                              {"parameters", ordered_json::parse(kSchemas[0].text)},
                              {"strict", true}}});
    return structured::compileToolCalls(ordered_json::parse(structured::toolCallsSpec(
        structured::ToolCallFormat::kHermes, /*parallel=*/true, tools, /*optional=*/true)));
  }
  return structured::compileJsonSchema(ordered_json::parse(schema.text));
}

double microsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

json summary(const std::vector<double>& values) {
  return {{"count", values.size()},
          {"median_us", percentile(values, 0.5)},
          {"p99_us", percentile(values, 0.99)}};
}

std::unique_ptr<Tokenizer> loadTokenizer(const std::string& path) {
  return std::filesystem::is_directory(path) ? Tokenizer::fromDirectory(path)
                                             : Tokenizer::fromFile(path);
}

// Decode tokens/s of `batch` greedy requests run together on `engine`,
// constrained to `constraint` when given; adds the tokens generated to
// *tokens_out.
double decodeRate(engine::Engine& engine, const StructuredBenchOptions& options, int round,
                  const std::optional<structured::Constraint>& constraint,
                  int64_t* tokens_out = nullptr) {
  std::mutex mutex;
  std::condition_variable done;
  int finished = 0;
  int64_t tokens = 0;
  const auto start = Clock::now();
  for (int i = 0; i < options.batch; ++i) {
    engine::Request request;
    request.id =
        "bench-" + std::to_string(round) + "-" + std::to_string(i) + (constraint ? "-c" : "-u");
    std::mt19937 rng(static_cast<uint32_t>(1000 * round + i));
    for (int t = 0; t < 32; ++t) request.prompt.push_back(static_cast<TokenId>(10 + rng() % 400));
    request.sampling.temperature = 0;
    request.sampling.ignore_eos = true;
    request.sampling.max_tokens = options.decode_tokens;
    request.structured_output = constraint;
    const Status added =
        engine.addRequest(std::move(request), [&](const engine::RequestOutput& out) {
          std::lock_guard lock(mutex);
          tokens += static_cast<int64_t>(out.tokens.size());
          if (out.finished()) {
            ++finished;
            done.notify_all();
          }
        });
    if (!added.isOk()) throw std::runtime_error(added.message());
  }
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return finished == options.batch; });
  if (tokens_out != nullptr) *tokens_out += tokens;
  return static_cast<double>(tokens) / (microsSince(start) / 1e6);
}

}  // namespace

int runStructuredBench(const StructuredBenchOptions& options) {
  if (options.tokenizers.empty()) {
    std::fprintf(stderr, "tandem-bench structured: give at least one --tokenizer\n");
    return 2;
  }
  json report = json::array();
  std::printf("%-10s %-12s %9s %8s %11s %11s %11s %11s %11s %10s\n", "vocab", "schema", "compile",
              "steps", "mask p50", "mask p99", "miss p50", "miss p99", "accept p50", "cost max");
  std::printf("%-10s %-12s %9s %8s %11s %11s %11s %11s %11s %10s\n", "", "", "ms", "", "us", "us",
              "us", "us", "us", "k steps");
  for (const std::string& path : options.tokenizers) {
    const std::unique_ptr<Tokenizer> tokenizer = loadTokenizer(path);
    const std::string vocab_name = std::filesystem::path(path).filename().string();
    auto start = Clock::now();
    auto vocabulary = std::make_shared<structured::Vocabulary>(*tokenizer, tokenizer->vocabSize());
    const double trie_ms = microsSince(start) / 1000.0;
    std::printf("%s: %lld tokens, trie built in %.1f ms\n", vocab_name.c_str(),
                static_cast<long long>(vocabulary->size()), trie_ms);
    json per_vocab = {{"tokenizer", path},
                      {"vocab_size", vocabulary->size()},
                      {"trie_ms", trie_ms},
                      {"schemas", json::array()}};
    for (const Schema& schema : kSchemas) {
      start = Clock::now();
      StatusOr<structured::Grammar> grammar = schemaGrammar(schema);
      if (!grammar.isOk()) {
        std::fprintf(stderr, "schema %s: %s\n", schema.name, grammar.status().message().c_str());
        return 1;
      }
      auto compiled =
          std::make_shared<structured::CompiledGrammar>(std::move(grammar).value(), vocabulary);
      const double compile_ms = microsSince(start) / 1000.0;
      std::vector<double> mask_us, miss_us, accept_us;
      std::vector<uint64_t> mask(static_cast<size_t>(vocabulary->maskWords()));
      std::vector<TokenId> allowed;
      int64_t completed = 0;
      for (int walk = 0; walk < options.walks; ++walk) {
        std::mt19937_64 rng(options.seed * 1000003 + static_cast<uint64_t>(walk));
        structured::Matcher matcher(compiled);
        for (int step = 0; step < options.max_steps && !matcher.finished(); ++step) {
          const int64_t misses = compiled->stats().mask_cache_misses;
          start = Clock::now();
          matcher.fillMask(mask);
          const double us = microsSince(start);
          mask_us.push_back(us);
          if (compiled->stats().mask_cache_misses != misses) miss_us.push_back(us);
          allowed.clear();
          for (size_t w = 0; w < mask.size(); ++w) {
            for (uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
              allowed.push_back(static_cast<TokenId>(w * 64 + __builtin_ctzll(bits)));
            }
          }
          if (matcher.overflowed()) {
            // Typical schemas must never reach the ambiguity bound.
            std::fprintf(stderr, "schema %s: a mask passed its budget (too ambiguous)\n",
                         schema.name);
            return 1;
          }
          if (allowed.empty()) break;
          // Short tokens half the time, so walks also close structures.
          TokenId pick = allowed[rng() % allowed.size()];
          if (rng() % 2 == 0) {
            for (int tries = 0; tries < 8 && vocabulary->bytes(pick).size() > 1; ++tries) {
              pick = allowed[rng() % allowed.size()];
            }
          }
          start = Clock::now();
          const bool accepted = matcher.accept(pick);
          accept_us.push_back(microsSince(start));
          if (!accepted) {
            std::fprintf(stderr, "schema %s: a masked-in token was refused\n", schema.name);
            return 1;
          }
        }
        completed += matcher.canEnd() ? 1 : 0;
      }
      const auto stats = compiled->stats();
      std::printf("%-10s %-12s %9.2f %8zu %11.1f %11.1f %11.1f %11.1f %11.1f %10.1f\n",
                  vocab_name.c_str(), schema.name, compile_ms, mask_us.size(),
                  percentile(mask_us, 0.5), percentile(mask_us, 0.99), percentile(miss_us, 0.5),
                  percentile(miss_us, 0.99), percentile(accept_us, 0.5),
                  static_cast<double>(stats.max_mask_cost) / 1000.0);
      per_vocab["schemas"].push_back({{"schema", schema.name},
                                      {"compile_ms", compile_ms},
                                      {"mask", summary(mask_us)},
                                      {"mask_cache_miss", summary(miss_us)},
                                      {"accept", summary(accept_us)},
                                      {"walks_complete", completed},
                                      {"stack_nodes", stats.nodes},
                                      {"max_mask_cost", stats.max_mask_cost},
                                      {"elements_classified", stats.classified}});
    }
    report.push_back(std::move(per_vocab));
  }
  json output = {{"masks", report}};
  if (!options.model_dir.empty()) {
    engine::EngineConfig config;
    config.model_dir = options.model_dir;
    engine::Engine engine(config);
    const structured::Constraint constraint{structured::ConstraintKind::kJsonSchema,
                                            ordered_json::parse(kSchemas[0].text).dump()};
    std::vector<double> plain, constrained;
    int64_t plain_tokens = 0, constrained_tokens = 0;
    decodeRate(engine, options, -1, constraint);  // warm-up: the trie, the grammar, the caches
    for (int round = 0; round < options.rounds; ++round) {
      plain.push_back(decodeRate(engine, options, round, std::nullopt, &plain_tokens));
      constrained.push_back(decodeRate(engine, options, round, constraint, &constrained_tokens));
    }
    const double requests = static_cast<double>(options.batch) * options.rounds;
    const double ratio = percentile(constrained, 0.5) / percentile(plain, 0.5);
    std::printf("decode, %d requests at once, %d tokens each, %d rounds (median):\n", options.batch,
                options.decode_tokens, options.rounds);
    std::printf(
        "  unconstrained %.1f tok/s (%.1f tokens a request), constrained (tool_call schema; a "
        "request ends when its JSON closes) %.1f tok/s (%.1f tokens a request), ratio %.3f\n",
        percentile(plain, 0.5), static_cast<double>(plain_tokens) / requests,
        percentile(constrained, 0.5), static_cast<double>(constrained_tokens) / requests, ratio);
    output["decode"] = {
        {"model", options.model_dir},
        {"batch", options.batch},
        {"decode_tokens", options.decode_tokens},
        {"unconstrained_tok_s", plain},
        {"constrained_tok_s", constrained},
        {"unconstrained_tokens_per_request", static_cast<double>(plain_tokens) / requests},
        {"constrained_tokens_per_request", static_cast<double>(constrained_tokens) / requests},
        {"ratio_of_medians", ratio}};
  }
  if (!options.json_path.empty()) {
    std::ofstream(options.json_path) << output.dump(2) << "\n";
  }
  return 0;
}

}  // namespace tandem::bench
