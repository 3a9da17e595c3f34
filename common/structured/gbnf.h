// GBNF grammars (the format llama.cpp documents) compiled to a Grammar
// (grammar.h).
//
//   root  ::= expr                 # `root` is the start rule
//   expr  ::= term ("+" term)*     # rules may span lines; a new rule
//   term  ::= [0-9]+ | "(" expr ")" # starts at `name ::=`
//
// Rule names are [a-zA-Z0-9_-]+. Expressions are sequences and `|`
// alternatives of string literals "..." (escapes \n \r \t \\ \" \xHH \uHHHH
// \UHHHHHHHH, naming code points), character classes [...] (ranges, ^
// negation, the same escapes plus \[ \] \- \^), `.` (any character), rule
// references and ( ) groups, each optionally followed by one of * + ?
// {m} {m,} {m,n}. `#` starts a comment that runs to the end of the line.
//
// Errors are InvalidArgument and name where (line and column, counted in
// characters from 1) and what was expected. Left-recursive rules are
// refused (by GrammarBuilder::build); a repetition of something that can
// match the empty string is accepted and means the same as repeating its
// non-empty matches. Pure function, thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

inline constexpr int64_t kMaxGbnfBytes = 64 * 1024;

// InvalidArgument naming line:column and what was expected; ResourceExhausted
// past `limits`.
StatusOr<Grammar> compileGbnf(std::string_view text, const GrammarLimits& limits = {});

}  // namespace tandem::structured
