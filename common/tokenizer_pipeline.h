// The stages of tokenizer.json around the model: normalizer, pre-tokenizer
// and post-processor. Each is built from its JSON object (null meaning "none")
// and refuses, naming the file, any component type it does not implement.
//
// All of them are immutable after construction and safe to share between
// threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer.h"
#include "common/tokenizer_regex.h"

namespace tandem::tokenizer_internal {

// Unicode normalization forms (NFC, NFD, NFKC, NFKD), Prepend (a string in
// front of non-empty text) and Replace (every occurrence of a literal string
// or a regex), alone or in a Sequence. SentencePiece-style tokenizers
// (Llama 2, Mistral, Gemma) write spaces as "▁" with Replace, and Llama 2's
// put one in front with Prepend.
class Normalizer {
 public:
  Normalizer(const nlohmann::json& config, std::string_view source);
  bool isIdentity() const { return steps_.empty(); }
  // `text` must be valid UTF-8.
  std::string apply(std::string_view text) const;
  // How many times shorter than its input the normalized text can be: 1
  // when no step shortens text (Prepend, a Replace by a string at least as
  // long), 4 per composing form (NFC/NFKC shrink text at most 3x); nullopt
  // when a step can remove text outright (a Replace by less, or by a regex).
  std::optional<int64_t> maxShrink() const;

 private:
  struct Step {
    enum class Kind { kForm, kPrepend, kReplace } kind = Kind::kForm;
    int form_options = 0;                // kForm: utf8proc options
    std::string text;                    // kPrepend: what goes in front; kReplace: the content
    std::string pattern;                 // kReplace with a literal pattern
    std::shared_ptr<const Regex> regex;  // kReplace with a regex pattern
  };
  void addSteps(const nlohmann::json& config, std::string_view source);
  std::vector<Step> steps_;  // applied in order
};

// Takes one word of a pre-tokenizer's output, valid for the call only.
using WordSink = std::function<void(std::string_view word)>;

// Splits text into the words the model encodes one by one: Split (regex or
// literal, all five delimiter behaviours, invert), ByteLevel (prefix space,
// GPT-2 regex, byte-to-character mapping), Metaspace (spaces written as a
// replacement character, one put in front by its prepend_scheme, split
// before each one or not), and Sequence of them.
class PreTokenizer {
 public:
  PreTokenizer(const nlohmann::json& config, std::string_view source);
  // Passes the words of `text` (valid UTF-8) to `emit`, in order, as each is
  // cut (none is kept: tokenizing costs the ids, not a list of words).
  // `at_start`: `text` begins the input (no added token or other text before
  // it), which Metaspace's prepend_scheme "first" asks.
  void apply(std::string_view text, const WordSink& emit, bool at_start = true) const;
  // Appends them to `words`.
  void apply(std::string_view text, std::vector<std::string>& words, bool at_start = true) const;
  // A Split step drops its delimiters (behavior "Removed"): text can vanish.
  bool mayRemoveText() const;

  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  // Metaspace's prepend_scheme: when the replacement goes in front of a
  // piece that does not start with one.
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    enum class Kind { kSplit, kByteLevel, kMetaspace } kind = Kind::kSplit;
    // Split's pattern, ByteLevel's GPT-2 regex, or Metaspace's replacement
    // when it splits.
    std::shared_ptr<const Regex> regex;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    std::string replacement;  // Metaspace
    Prepend prepend = Prepend::kAlways;
  };

 private:
  void addSteps(const nlohmann::json& config, std::string_view source);
  void applyFrom(size_t step_index, std::string_view word, bool at_start,
                 const WordSink& emit) const;
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

// The decoder: what bytes each token stands for. Decoding is the
// concatenation of those bytes (a stream's pieces add up to the whole), so
// a decoder is accepted when it works token by token: ByteLevel, Replace
// (a literal string), ByteFallback ("<0x0A>" is byte 0x0A), Metaspace (the
// replacement is a space), Fuse (nothing to do for bytes), in a Sequence
// or alone; and, once Fuse has made the tokens one text, Strip of leading
// characters, which only transformers' decode applies (decodeStart()).
// Anything else is refused at load naming it.
class Decoder {
 public:
  Decoder(const nlohmann::json& config, std::string_view source);
  // The bytes a vocabulary token (or an added token's content) stands for,
  // appended to `out`. `first`: the token begins the decoded text, where a
  // Metaspace decoder with a prepend_scheme drops its replacement
  // characters instead of turning them into spaces.
  void appendTokenBytes(std::string_view token, bool first, std::string& out) const;
  // Whether a token's bytes can differ when it comes first.
  bool dropsFirstReplacement() const { return drops_first_replacement_; }
  // Whether the decoder maps tokens out of the byte-level alphabet.
  bool byteLevel() const { return byte_level_; }
  // Strip's leading characters, removed from the decoded text's start by
  // transformers' decode (Llama 2 strips the space its normalizer put in
  // front): up to strip_count() of strip_char().
  char32_t stripChar() const { return strip_char_; }
  int64_t stripCount() const { return strip_count_; }

 private:
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kMetaspace } kind = Kind::kByteLevel;
    std::string pattern;       // kReplace: what is replaced; kMetaspace: the replacement
    std::string content;       // kReplace: what replaces it
    bool drops_first = false;  // kMetaspace with a prepend_scheme other than "never"
  };
  void addSteps(const nlohmann::json& config, std::string_view source);
  std::vector<Step> steps_;
  bool fused_ = false;
  bool byte_level_ = false;
  bool drops_first_replacement_ = false;
  char32_t strip_char_ = 0;
  int64_t strip_count_ = 0;
};

}  // namespace tandem::tokenizer_internal
