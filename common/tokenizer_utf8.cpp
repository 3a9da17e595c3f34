#include "common/tokenizer_utf8.h"

#include <utf8proc.h>

namespace tandem::tokenizer_internal {

char32_t nextCodepoint(std::string_view text, size_t& pos) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  const size_t len = utf8SequenceLength(lead);
  if (len == 1 || pos + len > text.size()) {
    ++pos;
    return lead;
  }
  char32_t cp = lead & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  }
  pos += len;
  return cp;
}

size_t utf8SequenceLength(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

void appendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Well-formed UTF-8 (Unicode table 3-7): the lead byte fixes the length and
// the range allowed for the second byte; later bytes are always 80..BF.
// Returns 0 for bytes that cannot lead a sequence.
size_t utf8LeadInfo(unsigned char lead, unsigned char& second_lo, unsigned char& second_hi) {
  second_lo = 0x80;
  second_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead == 0xE0) {
    second_lo = 0xA0;
    return 3;
  }
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return 3;
  if (lead == 0xED) {
    second_hi = 0x9F;
    return 3;
  }
  if (lead == 0xF0) {
    second_lo = 0x90;
    return 4;
  }
  if (lead >= 0xF1 && lead <= 0xF3) return 4;
  if (lead == 0xF4) {
    second_hi = 0x8F;
    return 4;
  }
  return 0;
}

size_t appendLossyUtf8(std::string_view bytes, std::string& out, bool final) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      size_t j = i + 1;
      while (j < n && static_cast<unsigned char>(bytes[j]) < 0x80) ++j;
      out.append(bytes.substr(i, j - i));
      i = j;
      continue;
    }
    unsigned char lo;
    unsigned char hi;
    const size_t len = utf8LeadInfo(lead, lo, hi);
    if (len == 0) {
      out.append(kReplacementChar);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool broken = false;
    for (size_t k = 1; k < len; ++k, ++j) {
      if (j == n) {
        // A valid prefix cut short by the end of the input.
        if (!final) return i;
        out.append(kReplacementChar);
        return n;
      }
      const auto b = static_cast<unsigned char>(bytes[j]);
      if (b < lo || b > hi) {
        broken = true;
        break;
      }
      lo = 0x80;
      hi = 0xBF;
    }
    if (broken) {
      // The maximal valid prefix [i, j) becomes one replacement character;
      // the offending byte starts over.
      out.append(kReplacementChar);
      i = j;
    } else {
      out.append(bytes.substr(i, len));
      i += len;
    }
  }
  return n;
}

size_t firstInvalidUtf8(std::string_view bytes) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    unsigned char lo;
    unsigned char hi;
    const size_t len = utf8LeadInfo(lead, lo, hi);
    if (len == 0) return i;
    for (size_t k = 1; k < len; ++k) {
      if (i + k >= n) return i;  // cut short at the end
      const auto b = static_cast<unsigned char>(bytes[i + k]);
      if (b < lo || b > hi) return i + k;
      lo = 0x80;
      hi = 0xBF;
    }
    i += len;
  }
  return std::string_view::npos;
}

bool isValidUtf8(std::string_view bytes) {
  return firstInvalidUtf8(bytes) == std::string_view::npos;
}

std::string lossyUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  appendLossyUtf8(bytes, out, /*final=*/true);
  return out;
}

bool isUnicodeWhitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool isWordCodepoint(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D;  // Join_Control
  }
}

namespace {

ByteLevelAlphabet buildByteLevelAlphabet() {
  ByteLevelAlphabet alphabet;
  alphabet.codepoint_to_byte.fill(-1);
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    // Printable Latin-1 bytes stand for themselves; the rest are moved past
    // 255 in byte order, so that no token contains whitespace or controls.
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
    std::string utf8;
    appendUtf8(cp, utf8);
    alphabet.byte_to_utf8_len[b] = static_cast<uint8_t>(utf8.size());
    for (size_t i = 0; i < utf8.size(); ++i) alphabet.byte_to_utf8[b][i] = utf8[i];
    alphabet.codepoint_to_byte[cp] = static_cast<int16_t>(b);
  }
  return alphabet;
}

}  // namespace

const ByteLevelAlphabet& byteLevelAlphabet() {
  static const ByteLevelAlphabet kAlphabet = buildByteLevelAlphabet();
  return kAlphabet;
}

void appendByteLevel(std::string_view bytes, std::string& out) {
  const ByteLevelAlphabet& alphabet = byteLevelAlphabet();
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.append(alphabet.byte_to_utf8[b].data(), alphabet.byte_to_utf8_len[b]);
  }
}

bool appendFromByteLevel(std::string_view token, std::string& out) {
  const ByteLevelAlphabet& alphabet = byteLevelAlphabet();
  const size_t start_size = out.size();
  size_t pos = 0;
  while (pos < token.size()) {
    const char32_t cp = nextCodepoint(token, pos);
    if (cp >= ByteLevelAlphabet::kCodepointLimit || alphabet.codepoint_to_byte[cp] < 0) {
      out.resize(start_size);
      return false;
    }
    out.push_back(static_cast<char>(alphabet.codepoint_to_byte[cp]));
  }
  return true;
}

}  // namespace tandem::tokenizer_internal
