#include "common/tokenizer_added.h"

#include "common/tokenizer_utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// The code point that ends text[0, pos) (pos > 0, text valid UTF-8).
char32_t codepointBefore(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return nextCodepoint(text, start);
}

char32_t codepointAt(std::string_view text, size_t pos) { return nextCodepoint(text, pos); }

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens,
                                     const std::vector<std::string>& contents)
    : tokens_(tokens) {
  root_children_.fill(-1);
  nodes_.emplace_back();  // Root; its children live in root_children_.
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& content = contents[t];
    if (content.empty()) continue;
    int node = 0;
    for (size_t i = 0; i < content.size(); ++i) {
      const auto byte = static_cast<unsigned char>(content[i]);
      int child = -1;
      if (node == 0) {
        child = root_children_[byte];
      } else {
        for (const auto& [b, index] : nodes_[node].children) {
          if (b == byte) child = index;
        }
      }
      if (child < 0) {
        child = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
        if (node == 0) {
          root_children_[byte] = child;
        } else {
          nodes_[node].children.emplace_back(byte, child);
        }
      }
      node = child;
    }
    // The first of two tokens with the same content wins.
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int>(t);
  }
}

int AddedTokenMatcher::longestMatch(std::string_view text, size_t pos, size_t& length) const {
  int node = root_children_[static_cast<unsigned char>(text[pos])];
  int best = -1;
  size_t i = pos + 1;
  while (node >= 0) {
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      length = i - pos;
    }
    if (i == text.size()) break;
    const auto byte = static_cast<unsigned char>(text[i]);
    int child = -1;
    for (const auto& [b, index] : nodes_[node].children) {
      if (b == byte) {
        child = index;
        break;
      }
    }
    node = child;
    ++i;
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t text_start = 0;  // Start of the plain text not yet emitted.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const int index = root_children_[static_cast<unsigned char>(text[pos])] < 0
                          ? -1
                          : longestMatch(text, pos, length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = *tokens_[index];
    size_t begin = pos;
    size_t end = pos + length;
    // Like Hugging Face, a rejected match is skipped as a whole rather than
    // retried at the following bytes.
    pos = end;
    if (token.single_word) {
      const bool word_before = begin > 0 && isWordCodepoint(codepointBefore(text, begin));
      const bool word_after = end < text.size() && isWordCodepoint(codepointAt(text, end));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Whitespace already taken by the previous token stays with it.
      while (begin > text_start && isUnicodeWhitespace(codepointBefore(text, begin))) {
        size_t before = begin - 1;
        while (before > 0 && (static_cast<unsigned char>(text[before]) & 0xC0) == 0x80) --before;
        begin = before;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!isUnicodeWhitespace(nextCodepoint(text, next))) break;
        end = next;
      }
    }
    if (begin > text_start) out.push_back({text_start, begin, -1});
    out.push_back({begin, end, token.id});
    text_start = end;
    pos = end;
  }
  if (text_start < text.size()) out.push_back({text_start, text.size(), -1});
}

}  // namespace tandem::tokenizer_internal
