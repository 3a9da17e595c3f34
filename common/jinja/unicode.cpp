// UTF-8 helpers for the Jinja engine (see unicode.h).
#include "common/jinja/unicode.h"

#include <algorithm>

#include "common/jinja/budget.h"
#include "common/tokenizer_utf8.h"

namespace tandem::jinja {
namespace {

// Needles up to this long are searched with std::string_view::find, whose
// worst case is haystack size times needle size; longer ones with
// Knuth-Morris-Pratt, linear in both.
constexpr size_t kShortNeedle = 32;

// Start offsets of the matches of `needle` in `hay` from `pos`, in order,
// each passed to `found`, which returns false to stop.
template <typename Found>
void kmpSearch(std::string_view hay, std::string_view needle, size_t pos, Found found) {
  const size_t m = needle.size();
  reserveBytes(saturatingMul(m, sizeof(size_t)));
  std::vector<size_t> border(m, 0);
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k > 0 && needle[i] != needle[k]) k = border[k - 1];
    if (needle[i] == needle[k]) ++k;
    border[i] = k;
  }
  for (size_t i = pos, k = 0; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = border[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == m) {
      if (!found(i + 1 - m)) return;
      k = border[k - 1];
    }
  }
}

}  // namespace

size_t findText(std::string_view hay, std::string_view needle, size_t pos) {
  if (pos > hay.size()) return std::string_view::npos;
  size_t at = std::string_view::npos;
  if (needle.size() <= kShortNeedle) {
    at = hay.find(needle, pos);
  } else {
    kmpSearch(hay, needle, pos, [&](size_t match) {
      at = match;
      return false;
    });
  }
  // Charged for what was scanned, so that finding each match in turn costs
  // the text once.
  chargeTextWork((at == std::string_view::npos ? hay.size() : at) - pos + needle.size());
  return at;
}

size_t rfindText(std::string_view hay, std::string_view needle) {
  chargeTextWork(hay.size() + needle.size());
  if (needle.size() <= kShortNeedle) return hay.rfind(needle);
  size_t at = std::string_view::npos;
  kmpSearch(hay, needle, 0, [&](size_t match) {
    at = match;
    return true;
  });
  return at;
}

std::u32string decodeUtf8(std::string_view s) {
  reserveBytes(saturatingMul(s.size(), sizeof(char32_t)));
  chargeTextWork(s.size());
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    char32_t cp = c;
    if (c >= 0xF0 && c < 0xF8) {
      extra = 3;
      cp = c & 0x07;
    } else if (c >= 0xE0) {
      extra = c < 0xF0 ? 2 : 0;
      cp = c & 0x0F;
    } else if (c >= 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    }
    if (extra == 0 || i + extra >= s.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; k <= extra; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void appendUtf8(std::string& out, char32_t c) { tokenizer_internal::appendUtf8(c, out); }

std::string encodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) appendUtf8(out, c);
  return out;
}

size_t codePointCount(std::string_view s) {
  chargeTextWork(s.size());
  if (isAscii(s)) return s.size();
  return decodeUtf8(s).size();
}

bool isAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
}

bool isPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string pyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string text = decodeUtf8(s);
  std::u32string set;
  if (chars != nullptr) {
    // Sorted, so that each character is looked up in log time.
    set = decodeUtf8(*chars);
    std::sort(set.begin(), set.end());
  }
  auto strip_it = [&](char32_t c) {
    return chars == nullptr ? isPythonSpace(c) : std::binary_search(set.begin(), set.end(), c);
  };
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end && strip_it(text[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip_it(text[end - 1])) --end;
  }
  return encodeUtf8(std::u32string_view(text).substr(begin, end - begin));
}

namespace {

// What one piece of a split costs until it is a value: its std::string, its
// Value and the value's payload.
constexpr size_t kPieceBytes = 128;

// Checked every 1024 pieces, before the next 1024 are made: the pieces and
// a copy of the text they hold.
void reservePieces(size_t pieces, size_t text_bytes) {
  if (pieces % 1024 == 0) {
    reserveBytes(saturatingAdd(saturatingMul(pieces + 1024, kPieceBytes), text_bytes));
  }
}

}  // namespace

std::vector<std::string> pySplit(std::string_view s, const std::string* sep, long maxsplit) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
      size_t found = findText(s, *sep, pos);
      if (found == std::string_view::npos) break;
      reservePieces(out.size(), s.size());
      out.emplace_back(s.substr(pos, found - pos));
      pos = found + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string text = decodeUtf8(s);
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && isPythonSpace(text[i])) ++i;
    if (i >= text.size()) break;
    if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) {
      size_t end = text.size();
      while (end > i && isPythonSpace(text[end - 1])) --end;
      out.push_back(encodeUtf8(std::u32string_view(text).substr(i, end - i)));
      return out;
    }
    size_t start = i;
    while (i < text.size() && !isPythonSpace(text[i])) ++i;
    reservePieces(out.size(), s.size());
    out.push_back(encodeUtf8(std::u32string_view(text).substr(start, i - start)));
  }
  return out;
}

std::vector<std::string> pySplitLines(std::string_view s) {
  std::u32string text = decodeUtf8(s);
  std::vector<std::string> out;
  std::u32string line;
  for (size_t i = 0; i < text.size(); ++i) {
    char32_t c = text[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                    c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      line.push_back(c);
      continue;
    }
    if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
    reservePieces(out.size(), s.size());
    out.push_back(encodeUtf8(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(encodeUtf8(line));
  return out;
}

std::string asciiUpper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

std::string asciiLower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

}  // namespace tandem::jinja
