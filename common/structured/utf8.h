// UTF-8 reading and writing for the constraint compilers (regex, GBNF),
// which read their input as code points and name characters in messages.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "common/structured/grammar.h"

namespace tandem::structured::internal {

// Decodes the character at text[pos] into `code_point` and returns its
// length in bytes; 0 when the bytes there are not well-formed UTF-8 (RFC
// 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
inline size_t decodeUtf8(std::string_view text, size_t pos, uint32_t& code_point) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  size_t length = 0;
  uint32_t smallest = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code_point = lead & 0x1Fu;
    smallest = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code_point = lead & 0x0Fu;
    smallest = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code_point = lead & 0x07u;
    smallest = 0x10000;
  } else {
    return 0;
  }
  if (text.size() - pos < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    const auto byte = static_cast<uint8_t>(text[pos + i]);
    if ((byte & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte & 0x3Fu);
  }
  if (code_point < smallest || code_point > kMaxCodePoint ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return 0;
  }
  return length;
}

// `code_point` must be a scalar value.
inline void appendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// A character as messages show it: 'a' for printable ASCII, else U+000A.
inline std::string describeCodePoint(uint32_t code_point) {
  if (code_point > 0x20 && code_point < 0x7F) {
    return std::string("'") + static_cast<char>(code_point) + "'";
  }
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "U+%04X", static_cast<unsigned>(code_point));
  return buffer;
}

inline int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace tandem::structured::internal
