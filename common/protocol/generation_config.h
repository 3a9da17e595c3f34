// What a Hugging Face model's generation_config.json says about
// generating: end-of-sequence ids besides config.json's (Qwen2.5 and Qwen3
// instruct models list <|endoftext|> there next to <|im_end|>; Llama 3
// instruct lists <|eot_id|>), and the sampling its authors recommend,
// which vLLM applies to requests that leave those fields out
// (`--generation-config auto`, its default): temperature, top_p, top_k,
// min_p, repetition_penalty and max_new_tokens (the default max_tokens).
// `do_sample` is not read (as in vLLM): a request asks for greedy decoding
// with temperature 0.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol/request.h"

namespace tandem::protocol {

struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<int64_t> max_new_tokens;

  // Calls visit(name, field) for each field, in the order above: the one
  // list of the fields for what follows.
  template <typename Self, typename Visit>
  static void forEachField(Self& self, Visit&& visit) {
    visit("temperature", self.temperature);
    visit("top_p", self.top_p);
    visit("top_k", self.top_k);
    visit("min_p", self.min_p);
    visit("repetition_penalty", self.repetition_penalty);
    visit("max_new_tokens", self.max_new_tokens);
  }

  bool empty() const {
    bool none = true;
    forEachField(*this, [&](const char*, const auto& field) { none = none && !field; });
    return none;
  }
  // Sets the fields this holds (all but max_new_tokens) into `sampling`.
  void applyTo(SamplingParams& sampling) const;
  // "temperature=0.6 top_p=0.95", for logs.
  std::string describe() const;
  // {"temperature": 0.6, ...}: the fields held. fromJson reads that back,
  // skipping what is not of the right kind (a peer's answer).
  nlohmann::json toJson() const;
  static GenerationDefaults fromJson(const nlohmann::json& value);
};

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  GenerationDefaults defaults;

  // The directory's generation_config.json; empty when there is none.
  // Throws tandem::Error naming the file and the field.
  static GenerationConfig fromDirectory(const std::filesystem::path& dir);
  static GenerationConfig fromJsonText(const std::string& text, const std::string& source_name);
};

}  // namespace tandem::protocol
