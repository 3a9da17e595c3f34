// Fuzzes tokenizer.json: Tokenizer::fromFile either loads it or throws
// tandem::Error. A loaded tokenizer encodes a few short texts; every id must
// be inside its vocabulary, decoding must give valid UTF-8, and streaming
// detokenization must give the same text as decode(); decodeAsTransformers
// must give valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer.h"
#include "tests/fuzz/fuzz_input_file.h"

namespace {

constexpr std::string_view kTexts[] = {
    "Hello, world! It's 2024: 12345 tokens.",
    "  leading spaces\n\ttabs\r\nand\u00a0nbsp",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \xf0\x9f\x98\x80 \u0928\u092e\u0938\u094d\u0924\u0947",
    "<|im_start|>user\nhi<|im_end|>\n<|begin_of_text|><s></s>",
    "bad \xff\xfe utf-8 \xc3",
};

bool isValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t length = 0;
    uint32_t code_point = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      length = 2;
      code_point = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      length = 3;
      code_point = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      length = 4;
      code_point = c & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3f);
    }
    const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code_point < smallest[length] || code_point > 0x10ffff ||
        (code_point >= 0xd800 && code_point <= 0xdfff)) {
      return false;
    }
    i += length;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::FuzzInputFile file("tokenizer.json");
  file.write(data, size);
  std::unique_ptr<tandem::Tokenizer> tokenizer;
  try {
    tokenizer = tandem::Tokenizer::fromFile(file.path());
  } catch (const tandem::Error&) {
    return 0;
  }
  const int64_t vocab_size = tokenizer->vocabSize();
  for (std::string_view text : kTexts) {
    for (bool add_special_tokens : {false, true}) {
      const std::vector<tandem::TokenId> ids = tokenizer->encode(text, add_special_tokens);
      for (tandem::TokenId id : ids) {
        if (id < 0 || id >= vocab_size) std::abort();
        tokenizer->idToToken(id);
        tokenizer->tokenBytes(id);
        tokenizer->isSpecial(id);
      }
      for (bool skip_special_tokens : {false, true}) {
        const std::string decoded = tokenizer->decode(ids, skip_special_tokens);
        if (!isValidUtf8(decoded)) std::abort();
        tandem::IncrementalDetokenizer stream(*tokenizer, skip_special_tokens);
        std::string streamed;
        for (tandem::TokenId id : ids) streamed += stream.push(id);
        streamed += stream.flush();
        if (streamed != decoded) std::abort();
        // What a decoder strips at the start (Strip, Metaspace) keeps the
        // text whole characters too.
        if (!isValidUtf8(tokenizer->decodeAsTransformers(ids, skip_special_tokens))) std::abort();
      }
    }
  }
  // Ids outside the vocabulary are skipped, never read.
  const tandem::TokenId outside[] = {-1, static_cast<tandem::TokenId>(vocab_size), 0x7fffffff};
  if (!isValidUtf8(tokenizer->decode(outside))) std::abort();
  return 0;
}
