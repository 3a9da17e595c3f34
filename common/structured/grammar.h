// A context-free grammar over bytes: what every structured-output
// constraint (JSON schema, regular expression, choice list, GBNF grammar)
// is compiled to before the matcher (matcher.h) turns it into token masks.
//
// Rules are defined with expressions (Expr: byte sets, rule references,
// sequences, alternatives, bounded or unbounded repetition) and lowered by
// GrammarBuilder::build into flat alternatives of elements, each a byte set
// or a rule reference. Text is UTF-8: a class of code points becomes the
// byte sequences that encode it (codePoints()), so matching runs byte by
// byte and a token may end inside a character.
//
// build() refuses what the matcher cannot run: undefined rules, left
// recursion (a rule that can reach itself before consuming a byte, which
// also covers cycles of empty rules) and grammars past the size limits.
// Repetition is lowered to right recursion, so a loop never deepens the
// matcher's stack. Value types, no shared state; thread-compatible.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tandem::structured {

// A set of bytes, one bit each.
struct ByteSet {
  std::array<uint64_t, 4> words{};

  static ByteSet of(uint8_t byte) { return range(byte, byte); }
  static ByteSet range(uint8_t lo, uint8_t hi);
  void add(uint8_t lo, uint8_t hi);
  void addAll(const ByteSet& other);
  // Every byte not in this set.
  ByteSet complement() const;
  bool contains(uint8_t byte) const { return (words[byte >> 6] >> (byte & 63)) & 1u; }
  bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

// An expression defining a rule's body.
struct Expr {
  enum class Kind : uint8_t { kBytes, kRule, kSeq, kAlt, kRepeat };
  static constexpr int64_t kUnbounded = -1;

  Kind kind = Kind::kSeq;
  ByteSet bytes;               // kBytes
  int32_t rule = -1;           // kRule
  std::vector<Expr> children;  // kSeq, kAlt; kRepeat: exactly one
  int64_t min = 0;             // kRepeat
  int64_t max = kUnbounded;    // kRepeat
};

Expr bytes(const ByteSet& set);
Expr literal(std::string_view text);  // its bytes in order; "" is the empty sequence
Expr ref(int32_t rule);
Expr seq(std::vector<Expr> parts);    // the empty sequence matches ""
Expr alt(std::vector<Expr> options);  // no options matches nothing
Expr repeat(Expr item, int64_t min, int64_t max = Expr::kUnbounded);
inline Expr optional(Expr item) { return repeat(std::move(item), 0, 1); }
inline Expr star(Expr item) { return repeat(std::move(item), 0); }
inline Expr plus(Expr item) { return repeat(std::move(item), 1); }

// For the text compilers (regex, GBNF): groups nested deeper than this are
// refused (the parsers, the builder's lowering and Expr's destructor each
// recurse once per level), and repetition counts saturate at kCountCeiling
// while being read (the builder's limits refuse anything that large).
inline constexpr int kMaxGroupDepth = 200;
inline constexpr int64_t kCountCeiling = int64_t{1} << 40;

// The decimal digits of `text` from *pos, advancing *pos past them, into
// *value (saturating at kCountCeiling); false when there is no digit.
inline bool readCount(std::string_view text, size_t* pos, int64_t* value) {
  const size_t start = *pos;
  *value = 0;
  for (; *pos < text.size() && text[*pos] >= '0' && text[*pos] <= '9'; ++*pos) {
    *value = std::min(kCountCeiling, *value * 10 + (text[*pos] - '0'));
  }
  return *pos > start;
}

// For the text compilers: options separated by '|'. `parse_option()` reads
// one (StatusOr<Expr>); `next_bar()` consumes a '|' and says whether there
// was one. One option stands alone; several make an alternative.
template <class ParseOption, class NextBar>
StatusOr<Expr> alternativesOf(ParseOption parse_option, NextBar next_bar) {
  std::vector<Expr> options;
  do {
    StatusOr<Expr> option = parse_option();
    if (!option.isOk()) return option;
    options.push_back(std::move(option).value());
  } while (next_bar());
  return options.size() == 1 ? std::move(options[0]) : alt(std::move(options));
}

// Inclusive code point ranges; valid Unicode scalar values are
// [0, 0xD7FF] and [0xE000, 0x10FFFF] (surrogates are never encoded).
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, merged, surrogates removed.
CodePointRanges normalizeRanges(CodePointRanges ranges);
// Every scalar value not in `ranges`.
CodePointRanges complementRanges(const CodePointRanges& ranges);
// The UTF-8 encodings of the code points in `ranges`: an alternative of
// byte-set sequences, each character exactly one path.
Expr codePoints(const CodePointRanges& ranges);

// One element of a lowered alternative.
struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  int32_t value = 0;  // kBytes: index into Grammar::byte_sets; kRule: rule id
};

// A lowered grammar. Each alternative is a run of `elements` ending with a
// kEnd element; rule_alternatives[r] holds the start positions of rule r's.
struct Grammar {
  std::vector<Element> elements;
  std::vector<std::vector<int32_t>> rule_alternatives;
  std::vector<ByteSet> byte_sets;
  std::vector<std::string> rule_names;
  int32_t root = 0;

  // A GBNF-style listing, one rule per line (tests and debugging).
  std::string describe() const;
};

struct GrammarLimits {
  int64_t max_elements = 200'000;  // lowered elements, all rules together
  int64_t max_rules = 50'000;
  // Refuse a grammar where the root reaches a rule that matches no finite
  // text (an output entering it could never end). A compiler that names
  // such rules its own way turns this off and checks finishingRules().
  bool require_finite = true;
};

class GrammarBuilder;

// Free text that ends at the first `trigger` and goes on with `then`: the
// text before it never holds the trigger, and the text may also end
// anywhere before it. What follows the whole trigger is `then`. Rules are
// named `name`_0, `name`_1, ...
Expr textUntil(GrammarBuilder& builder, const std::string& name, const std::string& trigger,
               Expr then);

// Free text up to the first `trigger` (a reasoning model's "</think>"),
// then at most 4 bytes of white space, then `inner`: the constraint
// applies once the reasoning is over. The text may end before the trigger.
Grammar afterText(const Grammar& inner, const std::string& trigger);

// Per rule: whether it derives some finite text.
std::vector<bool> finishingRules(const Grammar& grammar);
// Per rule: whether the root reaches it.
std::vector<bool> reachableRules(const Grammar& grammar);

class GrammarBuilder {
 public:
  // A new rule, defined later (rules may refer to each other in any order).
  int32_t declare(std::string name);
  void define(int32_t rule, Expr body);
  // declare + define.
  int32_t add(std::string name, Expr body);
  int32_t numRules() const { return static_cast<int32_t>(bodies_.size()); }
  const std::string& name(int32_t rule) const { return names_[static_cast<size_t>(rule)]; }
  bool defined(int32_t rule) const { return defined_[static_cast<size_t>(rule)]; }

  // Lowers every rule. InvalidArgument naming the rule for an undefined
  // rule or left recursion; ResourceExhausted naming the bound when the
  // grammar is too large.
  StatusOr<Grammar> build(int32_t root, const GrammarLimits& limits = {}) const;

 private:
  std::vector<std::string> names_;
  std::vector<Expr> bodies_;
  std::vector<bool> defined_;
};

}  // namespace tandem::structured
