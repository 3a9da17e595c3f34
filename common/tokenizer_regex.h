// A compiled PCRE2 pattern (UTF-8, Unicode properties, JIT when available)
// that lists its non-overlapping matches, as the pre-tokenizers need them.
//
// Immutable after construction and safe to share between threads: per-thread
// match state lives in thread-local storage.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::tokenizer_internal {

class Regex {
 public:
  // `literal` matches the pattern text as is. Throws tandem::Error naming
  // `source` (the file it came from) when the pattern does not compile.
  Regex(std::string_view pattern, bool literal, std::string_view source);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [first, second) of the matches in `subject`, left to right.
  // `subject` must be valid UTF-8 (it is not checked again, for speed). Empty
  // matches are reported too; the search then moves on by one character.
  void findMatches(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_;  // pcre2_code_8, kept opaque so the header needs no PCRE2.
};

}  // namespace tandem::tokenizer_internal
