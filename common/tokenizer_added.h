// Added tokens (tokenizer.json "added_tokens"): strings recognised as one
// token before pre-tokenization, so that e.g. "<|eot_id|>" in the text is
// never cut into pieces.
//
// Matching is leftmost-longest, like Hugging Face's Aho-Corasick automaton,
// and honours the tokens' single_word, lstrip and rstrip flags. Immutable
// after construction; safe to share between threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer.h"

namespace tandem::tokenizer_internal {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  // Matched against normalized text (true) or the raw input (false).
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  // `tokens` must outlive the matcher; `contents[i]` is the string matched for
  // tokens[i] (normalized already where that applies).
  AddedTokenMatcher(const std::vector<const AddedToken*>& tokens,
                    const std::vector<std::string>& contents);
  bool empty() const { return tokens_.empty(); }

  // A run of `text`: plain text (id < 0) or one added token, whose span may
  // include the whitespace that lstrip/rstrip swallow.
  struct Segment {
    size_t begin;
    size_t end;
    TokenId id;
  };
  // Appends segments covering all of `text` (valid UTF-8), in order.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;
    int token = -1;  // Index into tokens_ when a token ends here.
  };
  // Index of the longest token starting at text[pos] and its length, or -1.
  int longestMatch(std::string_view text, size_t pos, size_t& length) const;

  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;
  std::array<int, 256> root_children_{};
};

}  // namespace tandem::tokenizer_internal
