#include "common/protocol/generation_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "common/file_text.h"
#include "common/json_parse.h"
#include "common/status.h"

namespace tandem::protocol {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& field,
                       const std::string& what) {
  throw Error(source + ": " + field + " " + what);
}

float number(const json& value, const std::string& source, const char* field) {
  if (!value.is_number()) fail(source, field, "must be a number, got " + value.dump());
  return value.get<float>();
}

int64_t integer(const json& value, const std::string& source, const std::string& field,
                int64_t min) {
  if (!value.is_number_integer() || value.get<int64_t>() < min) {
    fail(source, field,
         "must be an integer of at least " + std::to_string(min) + ", got " + value.dump());
  }
  return value.get<int64_t>();
}

}  // namespace

void GenerationDefaults::applyTo(SamplingParams& sampling) const {
  if (temperature) sampling.temperature = *temperature;
  if (top_p) sampling.top_p = *top_p;
  if (top_k) sampling.top_k = *top_k;
  if (min_p) sampling.min_p = *min_p;
  if (repetition_penalty) sampling.repetition_penalty = *repetition_penalty;
}

std::string GenerationDefaults::describe() const {
  std::ostringstream out;
  forEachField(*this, [&](const char* name, const auto& value) {
    if (value) out << (out.tellp() > 0 ? " " : "") << name << "=" << *value;
  });
  return out.str();
}

json GenerationDefaults::toJson() const {
  json out = json::object();
  forEachField(*this, [&](const char* name, const auto& value) {
    if (value) out[name] = *value;
  });
  return out;
}

GenerationDefaults GenerationDefaults::fromJson(const json& value) {
  GenerationDefaults d;
  if (!value.is_object()) return d;
  forEachField(d, [&value](const char* name, auto& into) {
    const auto it = value.find(name);
    if (it == value.end()) return;
    using T = typename std::decay_t<decltype(into)>::value_type;
    if constexpr (std::is_integral_v<T>) {
      if (it->is_number_integer()) into = it->template get<T>();
    } else {
      if (it->is_number()) into = it->template get<T>();
    }
  });
  return d;
}

GenerationConfig GenerationConfig::fromDirectory(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "generation_config.json";
  const std::optional<std::string> text = readModelFile(path);
  if (!text) return {};
  return fromJsonText(*text, path.string());
}

GenerationConfig GenerationConfig::fromJsonText(const std::string& text,
                                                const std::string& source_name) {
  JsonParseError error;
  std::optional<json> root = parseJson(text, error);
  if (!root) throw Error(source_name + ": not JSON: " + error.detail);
  if (!root->is_object()) throw Error(source_name + ": must hold a JSON object");
  GenerationConfig config;
  auto present = [&](const char* field) -> const json* {
    const auto it = root->find(field);
    return it == root->end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* eos = present("eos_token_id")) {
    if (eos->is_array()) {
      for (size_t i = 0; i < eos->size(); ++i) {
        config.eos_token_ids.push_back(
            integer((*eos)[i], source_name, "eos_token_id[" + std::to_string(i) + "]", 0));
      }
    } else {
      config.eos_token_ids.push_back(integer(*eos, source_name, "eos_token_id", 0));
    }
  }
  GenerationDefaults& d = config.defaults;
  if (const json* v = present("temperature"))
    d.temperature = number(*v, source_name, "temperature");
  if (const json* v = present("top_p")) d.top_p = number(*v, source_name, "top_p");
  if (const json* v = present("top_k")) {
    // 0 and -1 both mean "no top-k" (transformers 0, vLLM -1).
    const int64_t k = integer(*v, source_name, "top_k", -1);
    if (k > std::numeric_limits<int32_t>::max()) fail(source_name, "top_k", "is too large");
    d.top_k = k == -1 ? 0 : static_cast<int32_t>(k);
  }
  if (const json* v = present("min_p")) d.min_p = number(*v, source_name, "min_p");
  if (const json* v = present("repetition_penalty")) {
    d.repetition_penalty = number(*v, source_name, "repetition_penalty");
  }
  if (const json* v = present("max_new_tokens")) {
    d.max_new_tokens = integer(*v, source_name, "max_new_tokens", 1);
  }
  // The ranges a request's own values must be in.
  SamplingParams sampling;
  d.applyTo(sampling);
  const Status valid = validateSamplingParams(sampling, std::numeric_limits<int32_t>::max(),
                                              std::numeric_limits<int64_t>::max() / 2, 1);
  if (!valid.isOk()) throw Error(source_name + ": " + valid.message());
  return config;
}

}  // namespace tandem::protocol
