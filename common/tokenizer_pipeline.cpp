#include "common/tokenizer_pipeline.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "common/status.h"
#include "common/tokenizer_utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// The "type" of a component object, or an error naming where it sits.
std::string componentType(const nlohmann::json& config, std::string_view source,
                          std::string_view what) {
  if (!config.is_object()) {
    throw Error(std::string(source) + ": " + std::string(what) + " must be an object or null");
  }
  auto it = config.find("type");
  if (it == config.end() || !it->is_string()) {
    throw Error(std::string(source) + ": " + std::string(what) + " has no \"type\" string");
  }
  return it->get<std::string>();
}

[[noreturn]] void throwUnsupported(std::string_view source, std::string_view what,
                                   const std::string& type, std::string_view supported) {
  throw Error(std::string(source) + ": " + std::string(what) + " type '" + type +
              "' is not supported (supported: " + std::string(supported) + ")");
}

// The value of `key` in `object` when it has the type `ok` accepts, or
// nullptr when absent or null; throws naming the field otherwise.
template <typename Accepts>
const nlohmann::json* typedField(const nlohmann::json& object, const char* key,
                                 std::string_view source, std::string_view what,
                                 const char* expected, Accepts ok) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  if (!ok(*it)) {
    throw Error(std::string(source) + ": " + std::string(what) + "." + key + " must be " +
                expected + ", got " + it->dump());
  }
  return &*it;
}

}  // namespace

bool optionalBool(const nlohmann::json& object, const char* key, bool fallback,
                  std::string_view source, std::string_view what) {
  const nlohmann::json* value = typedField(object, key, source, what, "true or false",
                                           [](const nlohmann::json& v) { return v.is_boolean(); });
  return value != nullptr ? value->get<bool>() : fallback;
}

std::string optionalString(const nlohmann::json& object, const char* key, std::string fallback,
                           std::string_view source, std::string_view what) {
  const nlohmann::json* value = typedField(object, key, source, what, "a string",
                                           [](const nlohmann::json& v) { return v.is_string(); });
  return value != nullptr ? value->get<std::string>() : fallback;
}

namespace {

// The array of sub-components of a Sequence, which tokenizer.json names
// differently per stage.
const nlohmann::json& sequenceItems(const nlohmann::json& config, const char* key,
                                    std::string_view source, std::string_view what) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_array()) {
    throw Error(std::string(source) + ": " + std::string(what) + " Sequence needs a \"" + key +
                "\" array");
  }
  return *it;
}

bool isAscii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// GPT-2's pre-tokenization pattern, which ByteLevel applies when use_regex is
// set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::shared_ptr<const Regex> gpt2Regex() {
  static const std::shared_ptr<const Regex> kRegex =
      std::make_shared<const Regex>(kGpt2Pattern, /*literal=*/false, "built-in GPT-2 pattern");
  return kRegex;
}

// Metaspace's prepend_scheme ("always", "first", "never"); files older
// than it say add_prefix_space (true: always, false: never).
PreTokenizer::Prepend prependScheme(const nlohmann::json& config, std::string_view source,
                                    std::string_view what) {
  const std::string scheme = optionalString(config, "prepend_scheme", "", source, what);
  if (scheme.empty()) {
    return optionalBool(config, "add_prefix_space", true, source, what)
               ? PreTokenizer::Prepend::kAlways
               : PreTokenizer::Prepend::kNever;
  }
  if (scheme == "always") return PreTokenizer::Prepend::kAlways;
  if (scheme == "first") return PreTokenizer::Prepend::kFirst;
  if (scheme == "never") return PreTokenizer::Prepend::kNever;
  throw Error(std::string(source) + ": " + std::string(what) + ".prepend_scheme '" + scheme +
              "' is not one of always, first, never");
}

// `text`'s one character; throws naming `what`.`field` when it is empty or
// longer.
char32_t singleCharacter(const std::string& text, std::string_view source, std::string_view what,
                         const char* field) {
  size_t end = 0;
  const char32_t c = text.empty() ? 0 : nextCodepoint(text, end);
  if (text.empty() || end != text.size()) {
    throw Error(std::string(source) + ": " + std::string(what) + "." + field +
                " must be one character, got '" + text + "'");
  }
  return c;
}

// A string field every such component has; throws naming it otherwise.
std::string requiredString(const nlohmann::json& object, const char* key, std::string_view source,
                           std::string_view what) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    throw Error(std::string(source) + ": " + std::string(what) + " needs a \"" + key + "\" string");
  }
  return it->get<std::string>();
}

// A Replace component's pattern: {"String": literal} (first) or {"Regex":
// pattern} (second).
std::pair<std::string, std::shared_ptr<const Regex>> replacePattern(const nlohmann::json& config,
                                                                    std::string_view source,
                                                                    std::string_view what) {
  auto pattern = config.find("pattern");
  if (pattern != config.end() && pattern->is_object()) {
    if (auto literal = pattern->find("String"); literal != pattern->end() && literal->is_string()) {
      if (literal->get_ref<const std::string&>().empty()) {
        throw Error(std::string(source) + ": " + std::string(what) +
                    " pattern must not be an empty string");
      }
      return {literal->get<std::string>(), nullptr};
    }
    if (auto regex = pattern->find("Regex"); regex != pattern->end() && regex->is_string()) {
      return {std::string(),
              std::make_shared<const Regex>(regex->get<std::string>(), false, source)};
    }
  }
  throw Error(std::string(source) + ": " + std::string(what) +
              " pattern must be {\"String\": ...} or {\"Regex\": ...}, got " +
              (pattern == config.end() ? std::string("nothing") : pattern->dump()));
}

// `text` with every occurrence of `from` (not empty) replaced by `to`, left
// to right, not overlapping.
std::string replaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  for (size_t found; (found = text.find(from, at)) != std::string_view::npos;
       at = found + from.size()) {
    out.append(text, at, found - at);
    out.append(to);
  }
  out.append(text, at);
  return out;
}

// `text` with every match of `regex` replaced by `to`.
std::string replaceMatches(std::string_view text, const Regex& regex, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  regex.forEachMatch(text, [&](size_t begin, size_t end) {
    out.append(text, at, begin - at);
    out.append(to);
    at = end;
  });
  out.append(text, at);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Normalizer

Normalizer::Normalizer(const nlohmann::json& config, std::string_view source) {
  if (!config.is_null()) addSteps(config, source);
}

void Normalizer::addSteps(const nlohmann::json& config, std::string_view source) {
  const std::string type = componentType(config, source, "normalizer");
  Step step;
  if (type == "Sequence") {
    for (const nlohmann::json& item : sequenceItems(config, "normalizers", source, "normalizer")) {
      addSteps(item, source);
    }
    return;
  } else if (type == "NFC") {
    step.form_options = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  } else if (type == "NFD") {
    step.form_options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
  } else if (type == "NFKC") {
    step.form_options = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  } else if (type == "NFKD") {
    step.form_options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  } else if (type == "Prepend") {
    step.kind = Step::Kind::kPrepend;
    step.text = requiredString(config, "prepend", source, "normalizer Prepend");
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    step.text = requiredString(config, "content", source, "normalizer Replace");
    auto [literal, regex] = replacePattern(config, source, "normalizer Replace");
    step.pattern = std::move(literal);
    step.regex = std::move(regex);
  } else {
    throwUnsupported(source, "normalizer", type,
                     "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
  }
  steps_.push_back(std::move(step));
}

std::string Normalizer::apply(std::string_view text) const {
  std::string result(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kForm: {
        // ASCII is unchanged by every normalization form.
        if (isAscii(result)) break;
        utf8proc_uint8_t* mapped = nullptr;
        const utf8proc_ssize_t length =
            utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(result.data()),
                         static_cast<utf8proc_ssize_t>(result.size()), &mapped,
                         static_cast<utf8proc_option_t>(step.form_options));
        // Input is valid UTF-8, so only allocation can fail; leave the text
        // as it is rather than fail a request.
        if (length < 0) break;
        result.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
        std::free(mapped);
        break;
      }
      case Step::Kind::kPrepend:
        // As Hugging Face's: empty text stays empty.
        if (!result.empty()) result.insert(0, step.text);
        break;
      case Step::Kind::kReplace:
        result = step.regex ? replaceMatches(result, *step.regex, step.text)
                            : replaceAll(result, step.pattern, step.text);
        break;
    }
  }
  return result;
}

std::optional<int64_t> Normalizer::maxShrink() const {
  int64_t factor = 1;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kForm:
        factor *= 4;
        break;
      case Step::Kind::kPrepend:
        break;
      case Step::Kind::kReplace:
        if (step.regex || step.text.empty()) return std::nullopt;
        factor *=
            static_cast<int64_t>((step.pattern.size() + step.text.size() - 1) / step.text.size());
        break;
    }
  }
  return factor;
}

// ---------------------------------------------------------------------------
// PreTokenizer

PreTokenizer::PreTokenizer(const nlohmann::json& config, std::string_view source) {
  if (!config.is_null()) addSteps(config, source);
}

void PreTokenizer::addSteps(const nlohmann::json& config, std::string_view source) {
  const std::string where(source);
  const std::string type = componentType(config, source, "pre_tokenizer");
  if (type == "Sequence") {
    for (const nlohmann::json& item :
         sequenceItems(config, "pretokenizers", source, "pre_tokenizer")) {
      addSteps(item, source);
    }
  } else if (type == "Split") {
    Step step;
    step.kind = Step::Kind::kSplit;
    auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object()) {
      throw Error(where + ": Split pre_tokenizer needs a \"pattern\" object");
    }
    if (auto regex = pattern->find("Regex"); regex != pattern->end() && regex->is_string()) {
      step.regex = std::make_shared<const Regex>(regex->get<std::string>(), false, source);
    } else if (auto literal = pattern->find("String");
               literal != pattern->end() && literal->is_string()) {
      step.regex = std::make_shared<const Regex>(literal->get<std::string>(), true, source);
    } else {
      throw Error(where + ": Split pattern must be {\"Regex\": ...} or {\"String\": ...}, got " +
                  pattern->dump());
    }
    const std::string behavior =
        optionalString(config, "behavior", "Isolated", source, "pre_tokenizer Split");
    if (behavior == "Removed") {
      step.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Behavior::kContiguous;
    } else {
      throw Error(where + ": Split behavior '" + behavior +
                  "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                  "Contiguous");
    }
    step.invert = optionalBool(config, "invert", false, source, "pre_tokenizer Split");
    steps_.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    Step step;
    step.kind = Step::Kind::kByteLevel;
    step.add_prefix_space =
        optionalBool(config, "add_prefix_space", true, source, "pre_tokenizer ByteLevel");
    if (optionalBool(config, "use_regex", true, source, "pre_tokenizer ByteLevel")) {
      step.regex = gpt2Regex();
    }
    steps_.push_back(std::move(step));
  } else if (type == "Metaspace") {
    Step step;
    step.kind = Step::Kind::kMetaspace;
    const char* what = "pre_tokenizer Metaspace";
    step.replacement = optionalString(config, "replacement", "\u2581", source, what);
    singleCharacter(step.replacement, source, what, "replacement");
    step.prepend = prependScheme(config, source, what);
    if (optionalBool(config, "split", true, source, what)) {
      step.regex = std::make_shared<const Regex>(step.replacement, /*literal=*/true, source);
    }
    steps_.push_back(std::move(step));
  } else {
    throwUnsupported(source, "pre_tokenizer", type, "Split, ByteLevel, Metaspace, Sequence");
  }
}

namespace {

// Cuts `text` into pieces around the regex matches, following Hugging Face's
// SplitDelimiterBehavior, and passes each non-empty piece to `emit` as soon
// as no later span can extend it: nothing is listed, so a 60 MB prompt costs
// no more than its ids. The spans are the matches and the text between them
// (the gaps; `invert` swaps which is which); a behaviour joins a span with
// at most its neighbour, so one pending piece is all there is to hold.
void splitWords(std::string_view text, const Regex& regex, PreTokenizer::Behavior behavior,
                bool invert, const WordSink& emit) {
  using Behavior = PreTokenizer::Behavior;
  struct Span {
    size_t begin;
    size_t end;
    bool is_match;
  };
  std::optional<Span> pending;  // the piece the next span may still extend
  bool last_match = false;      // whether the last span taken was a match
  auto emitSpan = [&](const Span& span) {
    if (span.end > span.begin) emit(text.substr(span.begin, span.end - span.begin));
  };
  auto flush = [&] {
    if (pending) emitSpan(*pending);
    pending.reset();
  };
  auto take = [&](Span span) {
    switch (behavior) {
      case Behavior::kRemoved:
        if (!span.is_match) emitSpan(span);
        break;
      case Behavior::kIsolated:
        emitSpan(span);
        break;
      case Behavior::kMergedWithPrevious:
        // A match joins the piece before it, unless that piece ends in one.
        if (span.is_match && !last_match && pending) {
          pending->end = span.end;
        } else {
          flush();
          pending = span;
        }
        break;
      case Behavior::kMergedWithNext:
        // A match joins the gap after it; a match after a match does not.
        if (!span.is_match && pending && last_match) {
          pending->end = span.end;
          flush();
        } else {
          flush();
          pending = span;
          if (!span.is_match) flush();
        }
        break;
      case Behavior::kContiguous:
        // Runs of matches, and runs of gaps, are one piece each.
        if (pending && span.is_match == last_match) {
          pending->end = span.end;
        } else {
          flush();
          pending = span;
        }
        break;
    }
    last_match = span.is_match;
  };
  size_t previous_end = 0;
  regex.forEachMatch(text, [&](size_t begin, size_t end) {
    if (begin > previous_end) take({previous_end, begin, invert});
    take({begin, end, !invert});
    previous_end = end;
  });
  if (previous_end < text.size()) take({previous_end, text.size(), invert});
  flush();
}

}  // namespace

bool PreTokenizer::mayRemoveText() const {
  return std::any_of(steps_.begin(), steps_.end(),
                     [](const Step& step) { return step.behavior == Behavior::kRemoved; });
}

void PreTokenizer::apply(std::string_view text, const WordSink& emit, bool at_start) const {
  if (text.empty()) return;
  applyFrom(0, text, at_start, emit);
}

void PreTokenizer::apply(std::string_view text, std::vector<std::string>& words,
                         bool at_start) const {
  apply(
      text, [&words](std::string_view word) { words.emplace_back(word); }, at_start);
}

// Each step cuts each word of the step before on its own, so taking a word
// through the remaining steps as soon as it is cut gives the words in the
// same order as running each step over the whole list. A piece is at the
// input's start when its word was and it begins that word (Hugging Face
// asks whether its offset in the original text is 0).
void PreTokenizer::applyFrom(size_t step_index, std::string_view word, bool at_start,
                             const WordSink& emit) const {
  if (step_index == steps_.size()) {
    emit(word);
    return;
  }
  const Step& step = steps_[step_index];
  if (step.kind == Step::Kind::kSplit) {
    splitWords(word, *step.regex, step.behavior, step.invert, [&](std::string_view piece) {
      applyFrom(step_index + 1, piece, at_start && piece.data() == word.data(), emit);
    });
    return;
  }
  if (step.kind == Step::Kind::kMetaspace) {
    std::string replaced = replaceAll(word, " ", step.replacement);
    const bool prepend =
        step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && at_start);
    if (prepend && replaced.compare(0, step.replacement.size(), step.replacement) != 0) {
      replaced.insert(0, step.replacement);
    }
    const std::string_view text = replaced;
    const WordSink next = [&](std::string_view piece) {
      applyFrom(step_index + 1, piece, at_start && piece.data() == text.data(), emit);
    };
    if (step.regex) {
      splitWords(text, *step.regex, Behavior::kMergedWithNext, false, next);
    } else {
      next(text);
    }
    return;
  }
  std::string prefixed;
  std::string_view input = word;
  if (step.add_prefix_space && (word.empty() || word[0] != ' ')) {
    prefixed = " " + std::string(word);
    input = prefixed;
  }
  const WordSink mapped = [&](std::string_view piece) {
    std::string bytes;
    bytes.reserve(piece.size() * 2);
    appendByteLevel(piece, bytes);
    applyFrom(step_index + 1, bytes, at_start && piece.data() == input.data(), emit);
  };
  if (step.regex) {
    splitWords(input, *step.regex, Behavior::kIsolated, false, mapped);
  } else {
    mapped(input);
  }
}

// ---------------------------------------------------------------------------
// PostProcessor

PostProcessor::PostProcessor(const nlohmann::json& config, std::string_view source) {
  if (!config.is_null()) addSteps(config, source);
}

void PostProcessor::addSteps(const nlohmann::json& config, std::string_view source) {
  const std::string where(source);
  const std::string type = componentType(config, source, "post_processor");
  if (type == "Sequence") {
    for (const nlohmann::json& item :
         sequenceItems(config, "processors", source, "post_processor")) {
      addSteps(item, source);
    }
  } else if (type == "ByteLevel") {
    // Only adjusts offsets, which Tandem does not report.
  } else if (type == "TemplateProcessing") {
    auto single = config.find("single");
    if (single == config.end() || !single->is_array()) {
      throw Error(where + ": TemplateProcessing needs a \"single\" array");
    }
    const nlohmann::json* given_special =
        typedField(config, "special_tokens", source, "post_processor TemplateProcessing",
                   "an object", [](const nlohmann::json& v) { return v.is_object(); });
    const nlohmann::json special_tokens =
        given_special != nullptr ? *given_special : nlohmann::json::object();
    Template tmpl;
    bool seen_sequence = false;
    for (const nlohmann::json& piece : *single) {
      if (!piece.is_object()) {
        throw Error(where + ": TemplateProcessing piece " + piece.dump() +
                    " is neither SpecialToken nor Sequence");
      }
      if (auto special = piece.find("SpecialToken"); special != piece.end()) {
        if (!special->is_object()) {
          throw Error(where + ": TemplateProcessing SpecialToken must be an object, got " +
                      special->dump());
        }
        const std::string name =
            optionalString(*special, "id", "", source, "post_processor SpecialToken");
        auto entry = special_tokens.find(name);
        if (entry == special_tokens.end() || !entry->contains("ids") ||
            !(*entry)["ids"].is_array()) {
          throw Error(where + ": TemplateProcessing uses special token '" + name +
                      "', which its special_tokens map does not define");
        }
        std::vector<TokenId>& target = seen_sequence ? tmpl.after : tmpl.before;
        for (const nlohmann::json& id : (*entry)["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
              id.get<int64_t>() > std::numeric_limits<TokenId>::max()) {
            throw Error(where + ": TemplateProcessing special token '" + name + "' has id " +
                        id.dump() + " (accepted: a non-negative integer id)");
          }
          target.push_back(id.get<TokenId>());
          special_ids_.emplace_back(name, target.back());
        }
      } else if (auto sequence = piece.find("Sequence"); sequence != piece.end()) {
        if (!sequence->is_object()) {
          throw Error(where + ": TemplateProcessing Sequence must be an object, got " +
                      sequence->dump());
        }
        if (seen_sequence ||
            optionalString(*sequence, "id", "A", source, "post_processor Sequence") != "A") {
          throw Error(where + ": TemplateProcessing single template must contain $A once, got " +
                      single->dump());
        }
        seen_sequence = true;
      } else {
        throw Error(where + ": TemplateProcessing piece " + piece.dump() +
                    " is neither SpecialToken nor Sequence");
      }
    }
    if (!seen_sequence) {
      throw Error(where + ": TemplateProcessing single template has no $A: " + single->dump());
    }
    templates_.push_back(std::move(tmpl));
  } else {
    throwUnsupported(source, "post_processor", type, "TemplateProcessing, ByteLevel, Sequence");
  }
}

void PostProcessor::checkIds(int64_t vocab_size, std::string_view source) const {
  for (const auto& [name, id] : special_ids_) {
    if (id >= vocab_size) {
      throw Error(std::string(source) + ": TemplateProcessing special token '" + name +
                  "' has id " + std::to_string(id) + ", outside the vocabulary (ids 0.." +
                  std::to_string(vocab_size - 1) + ")");
    }
  }
}

void PostProcessor::apply(std::vector<TokenId>& ids) const {
  for (const Template& tmpl : templates_) {
    ids.insert(ids.begin(), tmpl.before.begin(), tmpl.before.end());
    ids.insert(ids.end(), tmpl.after.begin(), tmpl.after.end());
  }
}

// ---------------------------------------------------------------------------
// Decoder

Decoder::Decoder(const nlohmann::json& config, std::string_view source) {
  if (config.is_null()) {
    throw Error(std::string(source) +
                ": decoder is missing; Tandem decodes with the decoder the file declares");
  }
  addSteps(config, source);
}

void Decoder::addSteps(const nlohmann::json& config, std::string_view source) {
  const std::string where(source);
  const std::string type = componentType(config, source, "decoder");
  if (type == "Sequence") {
    for (const nlohmann::json& item : sequenceItems(config, "decoders", source, "decoder")) {
      addSteps(item, source);
    }
    return;
  }
  if (type == "Fuse") {
    fused_ = true;
    return;
  }
  if (type == "Strip") {
    // After Fuse the tokens are one text, whose start it strips; before, it
    // would strip every token, and a strip of the end would change text a
    // stream has already sent.
    const char* what = "decoder Strip";
    const int64_t stop = config.value("stop", int64_t{0});
    if (!fused_ || stop != 0 || strip_count_ != 0) {
      throw Error(where + ": " + what +
                  " is supported once, after Fuse, stripping the start only (stop 0), got " +
                  config.dump());
    }
    strip_char_ =
        singleCharacter(requiredString(config, "content", source, what), source, what, "content");
    strip_count_ = config.value("start", int64_t{0});
    return;
  }
  if (fused_) {
    throw Error(where + ": decoder " + type +
                " after Fuse is not supported (only Strip may follow Fuse)");
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    byte_level_ = true;
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    auto [literal, regex] = replacePattern(config, source, "decoder Replace");
    if (regex) throw Error(where + ": decoder Replace with a Regex pattern is not supported");
    step.pattern = std::move(literal);
    step.content = requiredString(config, "content", source, "decoder Replace");
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    step.pattern = optionalString(config, "replacement", "\u2581", source, "decoder Metaspace");
    step.drops_first =
        prependScheme(config, source, "decoder Metaspace") != PreTokenizer::Prepend::kNever;
    drops_first_replacement_ = drops_first_replacement_ || step.drops_first;
  } else {
    throwUnsupported(source, "decoder", type,
                     "ByteLevel, ByteFallback, Replace, Metaspace, Fuse, Strip after Fuse, "
                     "Sequence");
  }
  steps_.push_back(std::move(step));
}

namespace {

// ByteFallback's token for one byte: exactly "<0x" two hex digits ">".
std::optional<char> fallbackByte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int high = digit(token[3]);
  const int low = digit(token[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<char>(high * 16 + low);
}

}  // namespace

void Decoder::appendTokenBytes(std::string_view token, bool first, std::string& out) const {
  std::string text(token);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kByteLevel: {
        // A token outside the byte-level alphabet is taken as is, as
        // Hugging Face's ByteLevel decoder does.
        std::string bytes;
        if (appendFromByteLevel(text, bytes)) text = std::move(bytes);
        break;
      }
      case Step::Kind::kByteFallback:
        if (const std::optional<char> byte = fallbackByte(text)) text.assign(1, *byte);
        break;
      case Step::Kind::kReplace:
        text = replaceAll(text, step.pattern, step.content);
        break;
      case Step::Kind::kMetaspace:
        text = replaceAll(text, step.pattern, first && step.drops_first ? "" : " ");
        break;
    }
  }
  out += text;
}

}  // namespace tandem::tokenizer_internal
