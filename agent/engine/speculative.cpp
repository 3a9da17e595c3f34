#include "agent/engine/speculative.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>

#include "common/json_parse.h"

namespace tandem::engine {
namespace {

constexpr const char* kFields =
    "method, model, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, "
    "disable_by_batch_size";

// A field's integer in [min, max]; nullopt when it is absent or null.
std::optional<int64_t> integerField(const nlohmann::json& root, const char* field, int64_t min,
                                    int64_t max) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    throw Error(std::string("speculative-config: ") + field + " must be an integer from " +
                std::to_string(min) + " to " + std::to_string(max) + ", got " + it->dump());
  }
  return it->get<int64_t>();
}

bool namesNgram(const nlohmann::json& value) {
  return value.is_string() && (value == "ngram" || value == "[ngram]");
}

SpeculativeConfig parseObject(const nlohmann::json& root) {
  static constexpr std::array<std::string_view, 6> kNames = {"method",
                                                             "model",
                                                             "num_speculative_tokens",
                                                             "prompt_lookup_min",
                                                             "prompt_lookup_max",
                                                             "disable_by_batch_size"};
  for (const auto& [key, value] : root.items()) {
    if (std::find(kNames.begin(), kNames.end(), key) == kNames.end()) {
      throw Error("speculative-config: unknown field " + nlohmann::json(key).dump() +
                  "; accepted: " + kFields);
    }
  }
  const auto method = root.find("method");
  const auto model = root.find("model");
  const bool has_method = method != root.end() && !method->is_null();
  const bool has_model = model != root.end() && !model->is_null();
  if (has_method && !namesNgram(*method)) {
    throw Error("speculative-config: method " + method->dump() +
                " is not supported; accepted: ngram (prompt lookup, no draft model)");
  }
  if (has_model && !namesNgram(*model)) {
    throw Error("speculative-config: model " + model->dump() +
                ": draft models are not supported; accepted: method ngram (prompt lookup)");
  }
  if (!has_method && !has_model) {
    throw Error("speculative-config needs method; accepted: ngram (prompt lookup)");
  }
  SpeculativeConfig config;
  const auto tokens = integerField(root, "num_speculative_tokens", 1, kMaxSpeculativeTokens);
  if (!tokens) {
    throw Error("speculative-config needs num_speculative_tokens, the drafts per step (1 to " +
                std::to_string(kMaxSpeculativeTokens) + ")");
  }
  config.num_speculative_tokens = static_cast<int32_t>(*tokens);
  const auto min = integerField(root, "prompt_lookup_min", 1, kMaxPromptLookup);
  const auto max = integerField(root, "prompt_lookup_max", 1, kMaxPromptLookup);
  // As vLLM: neither given, both 5; one given, the other equals it.
  config.prompt_lookup_min = static_cast<int32_t>(min.value_or(max.value_or(5)));
  config.prompt_lookup_max = static_cast<int32_t>(max.value_or(min.value_or(5)));
  if (config.prompt_lookup_min > config.prompt_lookup_max) {
    throw Error("speculative-config: prompt_lookup_min " +
                std::to_string(config.prompt_lookup_min) + " must not exceed prompt_lookup_max " +
                std::to_string(config.prompt_lookup_max));
  }
  config.disable_by_batch_size =
      integerField(root, "disable_by_batch_size", 2, int64_t{1} << 30).value_or(0);
  return config;
}

}  // namespace

StatusOr<SpeculativeConfig> SpeculativeConfig::parse(const std::string& json_text) {
  StatusOr<nlohmann::json> root = parseJsonObject(json_text, "speculative-config");
  if (!root.isOk()) return root.status();
  try {
    return parseObject(*root);
  } catch (const Error& error) {
    return invalidArgument(error.what());
  }
}

void proposeNgramDraft(std::span<const TokenId> tokens, const SpeculativeConfig& config,
                       int64_t max_tokens, std::vector<TokenId>& draft) {
  draft.clear();
  const auto n = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || n < 2) return;
  const int64_t longest = std::min<int64_t>(config.prompt_lookup_max, n - 1);
  // An earlier occurrence ends at `end` (exclusive, end < n): tokens[end -
  // len, end) equals the last len tokens. Latest first, so among equally
  // long matches the latest wins; a longer one replaces it.
  int64_t best_len = 0;
  int64_t best_end = -1;
  for (int64_t end = n - 1; end >= 1; --end) {
    int64_t len = 0;
    while (len < longest && len < end && tokens[end - 1 - len] == tokens[n - 1 - len]) ++len;
    if (len >= config.prompt_lookup_min && len > best_len) {
      best_len = len;
      best_end = end;
      if (len == longest) break;
    }
  }
  if (best_end < 0) return;
  // What followed the match, as an overlapping copy: past the end of the
  // tokens it goes on with the draft itself, so a cycle (a match one period
  // back) is continued for its whole length.
  for (int64_t i = 0; i < max_tokens; ++i) {
    draft.push_back(best_end + i < n ? tokens[static_cast<size_t>(best_end + i)]
                                     : draft[static_cast<size_t>(best_end + i - n)]);
  }
}

}  // namespace tandem::engine
