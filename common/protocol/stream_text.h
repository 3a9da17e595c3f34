// Byte-level helpers for parsers that see a model's output in arbitrary
// pieces (a tag or a UTF-8 character may be cut anywhere between two pieces).
// Pure functions and one small value type; no locking, no shared state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::protocol {

// Length of the longest proper prefix of `tag` that `text` ends with: the
// bytes a streaming parser must hold back because the next piece may
// complete the tag. 0 when `text` cannot be the start of `tag`.
size_t partialTagSuffix(std::string_view text, std::string_view tag);

// Number of trailing bytes of `text` that form the start of a UTF-8 sequence
// still missing continuation bytes (0 to 3). Bytes that are not valid UTF-8
// are not held: they could never be completed.
size_t incompleteUtf8Suffix(std::string_view text);

// Holds back the unfinished UTF-8 character at the end of a text channel so
// that no emitted piece ends in the middle of a character. The concatenation
// of everything take() and flush() return equals the concatenation of the
// input.
class Utf8Carry {
 public:
  // `more` appended to what was held; returns all of it but an unfinished
  // character at the end.
  std::string take(std::string_view more);
  // Everything still held (the stream has ended).
  std::string flush();

 private:
  std::string held_;
};

// True when `text` starts with `prefix`.
inline bool startsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// Index of the first byte of `text` at or after `from` that is not ASCII
// white space (space, tab, CR, LF); text.size() when there is none.
size_t skipWhitespace(std::string_view text, size_t from);

}  // namespace tandem::protocol
