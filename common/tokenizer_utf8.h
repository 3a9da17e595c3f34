// UTF-8 and byte-level helpers shared by the tokenizer's pieces.
//
// Lossy decoding follows Rust's String::from_utf8_lossy (each maximal invalid
// subpart becomes one U+FFFD), because Hugging Face's decoders do; matching it
// byte for byte keeps decode() and the incremental detokenizer in agreement
// with the reference. The byte-level tables are GPT-2's bytes_to_unicode().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

inline constexpr char32_t kInvalidCodepoint = 0xFFFFFFFF;
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Decodes the code point at text[pos] (text must be valid UTF-8) and advances
// pos past it.
char32_t nextCodepoint(std::string_view text, size_t& pos);
// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for bytes
// that cannot start one).
size_t utf8SequenceLength(unsigned char lead);
void appendUtf8(char32_t codepoint, std::string& out);

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629:
// no overlong forms, no surrogates, nothing past U+10FFFF; a sequence cut
// short at the end is reported at its lead byte), or npos.
size_t firstInvalidUtf8(std::string_view bytes);
// Well-formed UTF-8 (Unicode table 3-7): the length of the sequence `lead`
// starts (0 for a byte that cannot lead one) and the range its second byte
// must fall in; later bytes are always 80..BF.
size_t utf8LeadInfo(unsigned char lead, unsigned char& second_lo, unsigned char& second_hi);
bool isValidUtf8(std::string_view bytes);
// Appends the lossy decoding of `bytes` to `out` and returns how many bytes were
// consumed. When `final` is false, a trailing sequence that is incomplete but
// could still become valid is left unconsumed, so that feeding the rest later
// gives the same text as decoding everything at once.
size_t appendLossyUtf8(std::string_view bytes, std::string& out, bool final);
std::string lossyUtf8(std::string_view bytes);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s accept).
bool isUnicodeWhitespace(char32_t codepoint);
// Unicode \w as in Rust's regex: letters, marks, decimal digits, connector
// punctuation.
bool isWordCodepoint(char32_t codepoint);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
struct ByteLevelAlphabet {
  // UTF-8 spelling of the code point that stands for each byte.
  std::array<std::array<char, 2>, 256> byte_to_utf8{};
  std::array<uint8_t, 256> byte_to_utf8_len{};
  // Inverse, indexed by code point (all of them are below kCodepointLimit);
  // -1 where the code point does not stand for a byte.
  static constexpr char32_t kCodepointLimit = 324;
  std::array<int16_t, kCodepointLimit> codepoint_to_byte{};
};
const ByteLevelAlphabet& byteLevelAlphabet();

// Maps raw bytes to their byte-level spelling.
void appendByteLevel(std::string_view bytes, std::string& out);
// Maps a byte-level spelling back to bytes; false (out untouched) when some
// character is not part of the alphabet.
bool appendFromByteLevel(std::string_view token, std::string& out);

}  // namespace tandem::tokenizer_internal
