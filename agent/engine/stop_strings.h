// Streaming text with stop strings.
//
// Generated text arrives piece by piece (valid UTF-8 from the incremental
// detokenizer). A stop string may straddle pieces, so the tail that could
// still become the start of a stop string is held back; text handed out is
// never retracted. When a stop string appears, the text before it is released
// and the rest is dropped (the stop string itself is not part of the output,
// as with OpenAI and vLLM, unless `include_stop` — vLLM's
// include_stop_str_in_output — where the output ends with it).
#pragma once

#include <string>
#include <vector>

namespace tandem::engine {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop_strings, bool include_stop = false);

  struct Update {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was found; nothing more will be emitted
  };

  // Adds a piece of text; returns what may be emitted. As vLLM, only a stop
  // string ending in this piece can end the answer (one that straddles it
  // and the held-back tail does), and only with `may_stop` (the answer is
  // longer than min_tokens): a stop string completed while the answer could
  // not stop stays text, even when it is still held back as the start of a
  // longer stop string.
  Update push(const std::string& piece, bool may_stop = true);
  // End of generation: releases the held-back tail.
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that ended the answer (empty until one did).
  const std::string& matched() const { return matched_; }

 private:
  // One stop string and the longest prefix of it that ends the text so far
  // (Knuth-Morris-Pratt): each byte costs amortized O(1) per stop string,
  // however long they are.
  struct Stop {
    std::string text;
    std::vector<size_t> failure;  // failure[i]: longest proper border of text[0..i]
    size_t matched = 0;
  };
  std::vector<Stop> stops_;
  bool include_stop_ = false;
  std::string pending_;  // held back: may be the start of a stop string
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tandem::engine
