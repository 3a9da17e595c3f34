#include "tools/model/bpe_trainer.h"

#include <cctype>
#include <map>
#include <unordered_map>

#include "common/status.h"

namespace tandem::tools {

const char* const kLlama3PreTokenizerPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Character classes of the Llama 3 pattern over UTF-8 text.
enum class CharClass { kLetter, kDigit, kNewline, kSpace, kOther };

struct Char {
  CharClass char_class;
  size_t length;  // bytes
};

Char charAt(std::string_view text, size_t pos) {
  const auto byte = static_cast<unsigned char>(text[pos]);
  if (byte >= 0x80) {
    // A whole multi-byte sequence counts as one letter.
    size_t length = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    if (pos + length > text.size()) length = text.size() - pos;
    return {CharClass::kLetter, length};
  }
  if ((byte >= 'a' && byte <= 'z') || (byte >= 'A' && byte <= 'Z')) return {CharClass::kLetter, 1};
  if (byte >= '0' && byte <= '9') return {CharClass::kDigit, 1};
  if (byte == '\n' || byte == '\r') return {CharClass::kNewline, 1};
  if (byte == ' ' || byte == '\t' || byte == '\v' || byte == '\f') return {CharClass::kSpace, 1};
  return {CharClass::kOther, 1};
}

bool isWhitespace(CharClass c) { return c == CharClass::kSpace || c == CharClass::kNewline; }

// Length of the pre-token starting at `pos`: the alternatives of the pattern
// tried in order, each with the regex's greedy/backtracking outcome.
size_t matchLength(std::string_view text, size_t pos) {
  const size_t size = text.size();
  auto classAt = [&](size_t p) {
    return p < size ? charAt(text, p).char_class : CharClass::kOther;
  };
  auto lowerAt = [&](size_t p) {
    return p < size ? static_cast<char>(std::tolower(static_cast<unsigned char>(text[p]))) : '\0';
  };
  auto letterRunEnd = [&](size_t p) {
    while (p < size && charAt(text, p).char_class == CharClass::kLetter)
      p += charAt(text, p).length;
    return p;
  };
  const Char first = charAt(text, pos);

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (text[pos] == '\'') {
    const char a = lowerAt(pos + 1);
    const char b = lowerAt(pos + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (first.char_class == CharClass::kLetter) return letterRunEnd(pos) - pos;
  if (first.char_class != CharClass::kNewline && first.char_class != CharClass::kDigit &&
      pos + first.length < size && classAt(pos + first.length) == CharClass::kLetter) {
    return letterRunEnd(pos + first.length) - pos;
  }
  // \p{N}{1,3}
  if (first.char_class == CharClass::kDigit) {
    size_t end = pos;
    while (end < size && end - pos < 3 && classAt(end) == CharClass::kDigit) ++end;
    return end - pos;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    size_t p = pos;
    if (text[p] == ' ' && p + 1 < size && classAt(p + 1) == CharClass::kOther) ++p;
    if (p < size && classAt(p) == CharClass::kOther) {
      while (p < size && classAt(p) == CharClass::kOther) p += charAt(text, p).length;
      while (p < size && classAt(p) == CharClass::kNewline) ++p;
      return p - pos;
    }
  }
  if (isWhitespace(first.char_class)) {
    size_t run_end = pos;
    size_t last_newline_end = 0;
    while (run_end < size && isWhitespace(classAt(run_end))) {
      if (classAt(run_end) == CharClass::kNewline) last_newline_end = run_end + 1;
      ++run_end;
    }
    // \s*[\r\n]+ : greedy \s* backs off to the last newline of the run.
    if (last_newline_end != 0) return last_newline_end - pos;
    // \s+(?!\S) : the run, less its last character when a non-space follows.
    if (run_end == size) return run_end - pos;
    if (run_end - pos >= 2) return run_end - pos - 1;
    // \s+
    return run_end - pos;
  }
  // Unreachable for well-formed input; a lone byte keeps the split total.
  return first.length;
}

// The 188 printable bytes keep their own code point; the rest are shifted to
// 256 + n in byte order, as in GPT-2's bytes_to_unicode.
const std::vector<std::string>& byteLevelTable() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> result(256);
    int shifted = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) ||
                             (byte >= 0xae && byte <= 0xff);
      const int code_point = printable ? byte : 256 + shifted++;
      std::string utf8;
      if (code_point < 0x80) {
        utf8 += static_cast<char>(code_point);
      } else {
        utf8 += static_cast<char>(0xc0 | (code_point >> 6));
        utf8 += static_cast<char>(0x80 | (code_point & 0x3f));
      }
      result[static_cast<size_t>(byte)] = utf8;
    }
    return result;
  }();
  return table;
}

uint64_t pairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Replaces every non-overlapping (left, right), scanning left to right.
void mergeInPlace(std::vector<int32_t>& symbols, int32_t left, int32_t right, int32_t merged) {
  size_t out = 0;
  for (size_t i = 0; i < symbols.size(); ++i) {
    if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
      symbols[out++] = merged;
      ++i;
    } else {
      symbols[out++] = symbols[i];
    }
  }
  symbols.resize(out);
}

}  // namespace

std::vector<std::string_view> splitLlama3PreTokens(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t length = matchLength(text, pos);
    pieces.push_back(text.substr(pos, length));
    pos += length;
  }
  return pieces;
}

std::string byteLevelEncode(std::string_view bytes) {
  const std::vector<std::string>& table = byteLevelTable();
  std::string result;
  for (char byte : bytes) result += table[static_cast<unsigned char>(byte)];
  return result;
}

BpeModel trainByteLevelBpe(std::string_view corpus, size_t max_vocab_size) {
  if (max_vocab_size < 256) {
    throw Error("BPE vocabulary size must be at least 256 (the byte tokens), got " +
                std::to_string(max_vocab_size));
  }
  BpeModel model;
  std::unordered_map<std::string, int32_t> ids;
  for (int byte = 0; byte < 256; ++byte) {
    model.tokens.emplace_back(1, static_cast<char>(byte));
    ids.emplace(model.tokens.back(), byte);
  }

  // Distinct pre-tokens with their counts; std::map fixes the order.
  std::map<std::string_view, int64_t> counts;
  for (std::string_view piece : splitLlama3PreTokens(corpus)) ++counts[piece];
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    Word word{{}, count};
    for (char byte : piece) word.symbols.push_back(static_cast<unsigned char>(byte));
    words.push_back(std::move(word));
  }

  while (model.tokens.size() < max_vocab_size) {
    std::unordered_map<uint64_t, int64_t> pair_counts;
    for (const Word& word : words) {
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        pair_counts[pairKey(word.symbols[i], word.symbols[i + 1])] += word.count;
      }
    }
    // A total order over pairs, so the hash map's iteration order never matters.
    int64_t best_count = 0;
    int32_t best_left = -1;
    int32_t best_right = -1;
    for (const auto& [key, count] : pair_counts) {
      const auto left = static_cast<int32_t>(key >> 32);
      const auto right = static_cast<int32_t>(key & 0xffffffffu);
      bool better = count > best_count;
      if (count == best_count) {
        const std::string& a = model.tokens[static_cast<size_t>(left)];
        const std::string& b = model.tokens[static_cast<size_t>(best_left)];
        better = a < b || (a == b && model.tokens[static_cast<size_t>(right)] <
                                         model.tokens[static_cast<size_t>(best_right)]);
      }
      if (better) {
        best_count = count;
        best_left = left;
        best_right = right;
      }
    }
    if (best_count < 2) break;

    std::string merged = model.tokens[static_cast<size_t>(best_left)] +
                         model.tokens[static_cast<size_t>(best_right)];
    // Different splits can build the same string; it keeps its first id.
    auto [it, inserted] = ids.emplace(merged, static_cast<int32_t>(model.tokens.size()));
    if (inserted) model.tokens.push_back(std::move(merged));
    model.merges.emplace_back(best_left, best_right);
    for (Word& word : words) mergeInPlace(word.symbols, best_left, best_right, it->second);
  }
  return model;
}

std::vector<int32_t> bpeEncodeWord(const BpeModel& model, std::string_view word) {
  std::vector<int32_t> symbols;
  for (char byte : word) symbols.push_back(static_cast<unsigned char>(byte));
  std::unordered_map<std::string, int32_t> ids;
  for (size_t id = 0; id < model.tokens.size(); ++id) {
    ids.emplace(model.tokens[id], static_cast<int32_t>(id));
  }
  for (const auto& [left, right] : model.merges) {
    const int32_t merged =
        ids.at(model.tokens[static_cast<size_t>(left)] + model.tokens[static_cast<size_t>(right)]);
    mergeInPlace(symbols, left, right, merged);
  }
  return symbols;
}

}  // namespace tandem::tools
