#include "common/protocol/stream_text.h"

#include <algorithm>

namespace tandem::protocol {

size_t partialTagSuffix(std::string_view text, std::string_view tag) {
  if (tag.empty()) return 0;
  const size_t longest = std::min(text.size(), tag.size() - 1);
  for (size_t length = longest; length > 0; --length) {
    if (text.substr(text.size() - length) == tag.substr(0, length)) return length;
  }
  return 0;
}

size_t incompleteUtf8Suffix(std::string_view text) {
  const size_t look_back = std::min<size_t>(text.size(), 3);
  for (size_t back = 1; back <= look_back; ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    size_t needed = 1;
    if ((byte & 0xE0) == 0xC0) {
      needed = 2;
    } else if ((byte & 0xF0) == 0xE0) {
      needed = 3;
    } else if ((byte & 0xF8) == 0xF0) {
      needed = 4;
    }
    return needed > back ? back : 0;
  }
  return 0;
}

std::string Utf8Carry::take(std::string_view more) {
  held_.append(more);
  const size_t keep = incompleteUtf8Suffix(held_);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string Utf8Carry::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

size_t skipWhitespace(std::string_view text, size_t from) {
  while (from < text.size() &&
         (text[from] == ' ' || text[from] == '\t' || text[from] == '\n' || text[from] == '\r')) {
    ++from;
  }
  return from;
}

}  // namespace tandem::protocol
