// The stages of tokenizer.json around the model: normalizer, pre-tokenizer
// and post-processor. Each is built from its JSON object (null meaning "none")
// and refuses, naming the file, any component type it does not implement.
//
// All of them are immutable after construction and safe to share between
// threads.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer.h"
#include "common/tokenizer_regex.h"

namespace tandem::tokenizer_internal {

// Unicode normalization forms (NFC, NFD, NFKC, NFKD), alone or in a Sequence.
class Normalizer {
 public:
  Normalizer(const nlohmann::json& config, std::string_view source);
  bool isIdentity() const { return forms_.empty(); }
  // `text` must be valid UTF-8.
  std::string apply(std::string_view text) const;

 private:
  std::vector<int> forms_;  // utf8proc option sets, applied in order.
};

// Takes one word of a pre-tokenizer's output, valid for the call only.
using WordSink = std::function<void(std::string_view word)>;

// Splits text into the words the model encodes one by one: Split (regex or
// literal, all five delimiter behaviours, invert), ByteLevel (prefix space,
// GPT-2 regex, byte-to-character mapping), and Sequence of them.
class PreTokenizer {
 public:
  PreTokenizer(const nlohmann::json& config, std::string_view source);
  // Passes the words of `text` (valid UTF-8) to `emit`, in order, as each is
  // cut (none is kept: tokenizing costs the ids, not a list of words).
  void apply(std::string_view text, const WordSink& emit) const;
  // Appends them to `words`.
  void apply(std::string_view text, std::vector<std::string>& words) const;
  // A Split step drops its delimiters (behavior "Removed"): text can vanish.
  bool mayRemoveText() const;

  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
    std::shared_ptr<const Regex> regex;  // Split's pattern, or ByteLevel's GPT-2 regex.
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
  };

 private:
  void addSteps(const nlohmann::json& config, std::string_view source);
  void applyFrom(size_t step_index, std::string_view word, const WordSink& emit) const;
  std::vector<Step> steps_;
};

// What add_special_tokens adds around one sequence: TemplateProcessing's
// "single" template, ByteLevel (nothing to ids), or a Sequence of them.
class PostProcessor {
 public:
  PostProcessor(const nlohmann::json& config, std::string_view source);
  void apply(std::vector<TokenId>& ids) const;
  // Throws tandem::Error naming the special token when one of the ids the
  // templates add is not below vocab_size.
  void checkIds(int64_t vocab_size, std::string_view source) const;

 private:
  void addSteps(const nlohmann::json& config, std::string_view source);
  struct Template {
    std::vector<TokenId> before;
    std::vector<TokenId> after;
  };
  std::vector<Template> templates_;
  // Every special token a template adds: its name and id.
  std::vector<std::pair<std::string, TokenId>> special_ids_;
};

// `key` of a tokenizer.json object: its value, or `fallback` when absent or
// null; a value of another type throws tandem::Error "<source>: <what>.<key>
// must be ..., got <value>".
bool optionalBool(const nlohmann::json& object, const char* key, bool fallback,
                  std::string_view source, std::string_view what);
std::string optionalString(const nlohmann::json& object, const char* key, std::string fallback,
                           std::string_view source, std::string_view what);

// Refuses any decoder other than ByteLevel (alone or in a Sequence), the one
// decode() implements.
void checkDecoder(const nlohmann::json& config, std::string_view source);

}  // namespace tandem::tokenizer_internal
