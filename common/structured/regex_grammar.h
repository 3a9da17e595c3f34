// Regular expressions compiled to grammar rules (grammar.h): the
// `pattern` of a JSON schema string and the regex constraint of a request.
//
// The syntax is the common ECMAScript/PCRE subset, read as Unicode code
// points of a UTF-8 pattern: literals, `.` (any character but \n),
// alternation, groups ((...), (?:...), (?<name>...), (?P<name>...), all
// plain groups), the quantifiers * + ? {n} {n,} {n,m} {,m} (a lazy `?` or
// possessive `+` suffix is read as the plain greedy quantifier), classes
// [...] with ranges and negation, the class escapes \d \D \w \W \s \S (ASCII
// meanings), escaped punctuation, \n \r \t \f \v \0 \xHH \x{H...} \uHHHH
// \u{H...}. A pattern always matches the whole text: a ^ at the start and a
// $ at the end (of the pattern or of a top-level alternative) are accepted
// and change nothing.
//
// Everything else (backreferences, lookaround, word boundaries, anchors
// elsewhere, inline flags, \p{...}, ...) is refused with InvalidArgument
// naming the construct and its byte offset. Compiling never backtracks and
// is linear in the pattern; how large the grammar may grow is
// GrammarBuilder::build's limit (ResourceExhausted). Pure functions,
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

struct RegexOptions {
  // The text will stand unescaped inside a JSON string: no class or literal
  // may produce '"', '\\' or U+0000-U+001F (they are removed from every
  // character class; a literal that needs one is an InvalidArgument naming
  // it).
  bool json_string_safe = false;
  // ECMAScript's meanings, as JSON Schema's `pattern` has them: \s and \S
  // take JavaScript's white space (U+00A0, U+1680, U+2000-U+200A, U+2028,
  // U+2029, U+202F, U+205F, U+3000, U+FEFF besides ASCII's), and `.` leaves
  // out \r, U+2028 and U+2029 too. Otherwise PCRE's ASCII meanings.
  bool ecmascript = false;
  int64_t max_pattern_bytes = 4096;
  int64_t max_repeat = 1000;  // a {m,n} bound above this is refused
};

// Adds a rule to `builder` (named `name`) matching exactly the strings the
// pattern matches as a whole. Returns its rule id, or InvalidArgument naming
// what is unsupported and where (byte offset). On error `builder` is left
// unchanged.
StatusOr<int32_t> addRegexRule(GrammarBuilder& builder, std::string_view pattern,
                               const std::string& name, const RegexOptions& options = {});

// A whole grammar whose root is the pattern.
StatusOr<Grammar> compileRegex(std::string_view pattern, const RegexOptions& options = {},
                               const GrammarLimits& limits = {});

}  // namespace tandem::structured
