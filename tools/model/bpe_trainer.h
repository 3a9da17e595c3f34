// A small, deterministic byte-level BPE trainer for test-model tokenizers.
//
// Training splits the corpus into pre-tokens the way Llama 3's pre-tokenizer
// regex does, starts from the 256 single-byte tokens (id = byte value) and
// repeatedly merges the most frequent adjacent pair until the vocabulary is
// full or no pair occurs twice. Ties go to the pair whose (left, right) byte
// strings sort first, so the result depends only on the corpus and the size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::tools {

// Llama 3's pre-tokenizer Split regex, as written in its tokenizer.json.
extern const char* const kLlama3PreTokenizerPattern;

// Splits `text` where kLlama3PreTokenizerPattern would. Exact for ASCII; any
// non-ASCII code point is treated as a letter (the embedded corpus has no
// non-ASCII punctuation, digits or spaces).
std::vector<std::string_view> splitLlama3PreTokens(std::string_view text);

// The GPT-2 byte-to-unicode mapping: the UTF-8 text of the printable character
// that stands for each byte of `bytes` in a byte-level vocabulary.
std::string byteLevelEncode(std::string_view bytes);

struct BpeModel {
  // Raw bytes of each token; ids 0..255 are the single bytes.
  std::vector<std::string> tokens;
  // Merges in rank order, as (left id, right id); the result is the token
  // whose bytes are their concatenation.
  std::vector<std::pair<int32_t, int32_t>> merges;
};

// Trains on `corpus` until `max_vocab_size` tokens (>= 256) or no pair occurs
// at least twice.
BpeModel trainByteLevelBpe(std::string_view corpus, size_t max_vocab_size);

// Applies the merges in rank order to one pre-token (the way a BPE tokenizer
// encodes); returns token ids.
std::vector<int32_t> bpeEncodeWord(const BpeModel& model, std::string_view word);

}  // namespace tandem::tools
