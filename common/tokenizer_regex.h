// A compiled PCRE2 pattern (UTF-8, Unicode properties, JIT when available)
// that lists its non-overlapping matches, as the pre-tokenizers need them.
//
// Immutable after construction and safe to share between threads: per-thread
// match state lives in thread-local storage.
#pragma once

#include <cstddef>
#include <functional>
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

  // Calls on_match(begin, end) with the byte range of each match in
  // `subject`, left to right, as it is found: a caller holds no list of
  // them. `subject` must be valid UTF-8 (it is not checked again, for
  // speed). Empty matches are reported too; the search then moves on by one
  // character. on_match may itself match (this or another Regex).
  void forEachMatch(std::string_view subject,
                    const std::function<void(size_t begin, size_t end)>& on_match) const;

 private:
  void* code_;  // pcre2_code_8, kept opaque so the header needs no PCRE2.
};

}  // namespace tandem::tokenizer_internal
