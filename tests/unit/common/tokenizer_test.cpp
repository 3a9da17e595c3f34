#include "common/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_scratch.h"
#include "common/tokenizer_pipeline.h"
#include "tests/support/test_files.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const fs::path kDataDir = fs::path(TANDEM_TEST_DATA_DIR) / "tokenizers";

struct Example {
  std::string text;
  std::vector<TokenId> ids;
  std::optional<std::string> decoded;  // the reference's decode(ids), where recorded
};

std::vector<Example> readExamples(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::vector<Example> examples;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json entry = nlohmann::json::parse(line);
    Example example{entry["text"].get<std::string>(), entry["ids"].get<std::vector<TokenId>>(),
                    std::nullopt};
    if (entry.contains("decoded")) example.decoded = entry["decoded"].get<std::string>();
    examples.push_back(std::move(example));
  }
  return examples;
}

std::string idsToString(const std::vector<TokenId>& ids) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  out << ']';
  return out.str();
}

// Independent of the tokenizer's own UTF-8 code: well-formedness per Unicode
// table 3-7.
bool isWellFormedUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len;
    unsigned lo = 0x80;
    unsigned hi = 0xBF;
    if (b < 0x80) {
      len = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < lo || c > hi) return false;
      lo = 0x80;
      hi = 0xBF;
    }
    i += len;
  }
  return true;
}

// GPT-2's byte-to-character table, written out here independently of the
// tokenizer: the byte-level token that stands for one raw byte.
std::string byteLevelChar(unsigned char byte) {
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : 256 + extra++;
    if (b == byte) {
      std::string out;
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      return out;
    }
  }
  return {};
}

std::string nfc(const std::string& text) {
  static const tokenizer_internal::Normalizer kNfc(nlohmann::json{{"type", "NFC"}}, "test");
  return kNfc.apply(text);
}

using ::tandem::testing::TempDir;

// ---------------------------------------------------------------------------
// Conformance with Hugging Face on real tokenizers.

struct CorpusCase {
  const char* name;
  bool normalizes_nfc;
  // decode(ids) gives the text back. Not for SentencePiece-style files,
  // whose normalizer writes a "▁" in front (Llama 2, Mistral) that only
  // transformers' decode strips again: their references record decode(ids).
  bool round_trips = true;
};

class CorpusTest : public ::testing::TestWithParam<CorpusCase> {
 protected:
  static const Tokenizer& tokenizer(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto& slot = cache[name];
    if (!slot) slot = Tokenizer::fromDirectory(kDataDir / name);
    return *slot;
  }
  const Tokenizer& tok() { return tokenizer(GetParam().name); }
  std::vector<Example> examples() {
    return readExamples(kDataDir / GetParam().name / "expected.jsonl");
  }
};

TEST_P(CorpusTest, EncodeMatchesReference) {
  const std::vector<Example> all = examples();
  ASSERT_GT(all.size(), 100u);
  size_t mismatches = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::vector<TokenId> actual = tok().encode(all[i].text);
    if (actual != all[i].ids) {
      if (mismatches == 0) {
        ADD_FAILURE() << "first mismatch at line " << i + 1
                      << "\n  text: " << nlohmann::json(all[i].text).dump()
                      << "\n  expected: " << idsToString(all[i].ids)
                      << "\n  actual:   " << idsToString(actual);
      }
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << all.size() << " lines";
}

TEST_P(CorpusTest, DecodeRoundTrips) {
  if (!GetParam().round_trips) GTEST_SKIP() << "decoding is checked against the reference's";
  for (const Example& example : examples()) {
    const std::string expected = GetParam().normalizes_nfc ? nfc(example.text) : example.text;
    ASSERT_EQ(tok().decode(example.ids), expected) << nlohmann::json(example.text).dump();
  }
}

// decodeAsTransformers (what /detokenize answers) equals the reference's
// decode wherever the case recorded it.
TEST_P(CorpusTest, DecodeAsTransformersMatchesReference) {
  size_t checked = 0;
  for (const Example& example : examples()) {
    if (!example.decoded) continue;
    ++checked;
    ASSERT_EQ(tok().decodeAsTransformers(example.ids), *example.decoded)
        << nlohmann::json(example.text).dump();
  }
  if (checked == 0 && GetParam().round_trips) GTEST_SKIP() << "checked by DecodeRoundTrips";
  if (checked == 0) GTEST_SKIP() << "no reference decode recorded (see tokenizer_reference.mjs)";
}

TEST_P(CorpusTest, IncrementalDetokenizerMatchesDecode) {
  for (const Example& example : examples()) {
    IncrementalDetokenizer detokenizer(tok());
    std::string streamed;
    for (TokenId id : example.ids) {
      const std::string piece = detokenizer.push(id);
      ASSERT_TRUE(isWellFormedUtf8(piece)) << nlohmann::json(example.text).dump();
      streamed += piece;
    }
    const std::string rest = detokenizer.flush();
    ASSERT_TRUE(isWellFormedUtf8(rest));
    streamed += rest;
    ASSERT_EQ(streamed, tok().decode(example.ids)) << nlohmann::json(example.text).dump();
  }
}

TEST_P(CorpusTest, ConcurrentEncodeMatchesSerial) {
  const std::vector<Example> all = examples();
  std::vector<std::vector<TokenId>> serial;
  for (const Example& example : all) serial.push_back(tok().encode(example.text));
  constexpr int kThreads = 4;
  std::vector<int> differing(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the corpus from a different place so that
      // different texts are in flight at once.
      for (size_t k = 0; k < all.size(); ++k) {
        const size_t i = (k + t * all.size() / kThreads) % all.size();
        if (tok().encode(all[i].text) != serial[i]) ++differing[t];
        if (tok().decode(serial[i]) != tok().decode(serial[i])) ++differing[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(differing[t], 0) << "thread " << t;
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, CorpusTest,
                         ::testing::Values(CorpusCase{"llama3", false}, CorpusCase{"qwen3", true},
                                           CorpusCase{"mistral", false, false},
                                           CorpusCase{"mistral-metaspace", false, false},
                                           CorpusCase{"gemma3", false, false}),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(TokenizerConfigTest, Llama3SpecialTokensAndTemplate) {
  auto tok = Tokenizer::fromDirectory(kDataDir / "llama3");
  EXPECT_EQ(tok->bosTokenId(), 128000);
  EXPECT_EQ(tok->eosTokenId(), 128001);
  EXPECT_NE(tok->chatTemplate().find("<|start_header_id|>"), std::string::npos);
  EXPECT_EQ(tok->vocabSize(), 128256);
  EXPECT_TRUE(tok->isSpecial(128009));
  EXPECT_FALSE(tok->isSpecial(15339));
  EXPECT_EQ(tok->idToToken(128009), "<|eot_id|>");
  EXPECT_EQ(tok->tokenToId("<|eot_id|>"), 128009);
  EXPECT_EQ(tok->tokenToId("Ġhello"), 24748);
  EXPECT_EQ(tok->tokenBytes(24748), " hello");
  EXPECT_EQ(tok->decode(std::vector<TokenId>{128000, 9906, 128009}, /*skip_special_tokens=*/true),
            "Hello");
  // This copy of the Llama 3 tokenizer.json has a ByteLevel post-processor,
  // not the TemplateProcessing that adds <|begin_of_text|>, so
  // add_special_tokens adds nothing here (as in Hugging Face).
  EXPECT_EQ(tok->encode("Hello", /*add_special_tokens=*/true), (std::vector<TokenId>{9906}));
}

// The size bound a server checks before tokenizing a prompt: every id of
// encode() stands for at most maxTextBytesPerToken() bytes of input, on texts
// that make tokens as long as they get (repeated runs, whitespace, CJK,
// emoji, decomposed Hangul that an NFC normalizer composes).
TEST(TokenizerBoundTest, NoTokenStandsForMoreTextThanTheBound) {
  for (const char* name : {"llama3", "qwen3", "mistral", "gemma3"}) {
    SCOPED_TRACE(name);
    auto tok = Tokenizer::fromDirectory(kDataDir / name);
    const std::optional<int64_t> bound = tok->maxTextBytesPerToken();
    ASSERT_TRUE(bound.has_value());
    EXPECT_GE(*bound, 4);
    const std::string texts[] = {
        std::string(5000, ' '),
        std::string(5000, '='),
        std::string(5000, '\n'),
        std::string(5000, 'a'),
        "--------------------------------------------------------------------------------",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c\xe4\xbd\xa0\xe5\xa5\xbd",
        "\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80 emoji",
        // Conjoining jamo (L V T, three bytes each): NFC makes one syllable.
        "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8",
        "<|im_start|><|im_start|><|endoftext|>",
    };
    for (const std::string& text : texts) {
      const auto ids = tok->encode(text);
      const auto min_ids = (static_cast<int64_t>(text.size()) + *bound - 1) / *bound;
      EXPECT_GE(static_cast<int64_t>(ids.size()), min_ids) << text.substr(0, 40);
    }
  }
}

TEST(TokenizerBoundTest, TokenizersThatCanSwallowTextHaveNoBound) {
  std::ifstream in(kDataDir / "llama3" / "tokenizer.json");
  nlohmann::json config = nlohmann::json::parse(in);
  TempDir dir;
  ASSERT_TRUE(Tokenizer::fromFile(dir.write("tokenizer.json", config.dump()))
                  ->maxTextBytesPerToken()
                  .has_value());
  // An added token with rstrip takes every space after it.
  config["added_tokens"][0]["rstrip"] = true;
  EXPECT_FALSE(Tokenizer::fromFile(dir.write("tokenizer.json", config.dump()))
                   ->maxTextBytesPerToken()
                   .has_value());
}

TEST(TokenizerEncodeTest, IgnoreMergesTakesWholeWordsFromVocabulary) {
  const fs::path source = kDataDir / "llama3" / "tokenizer.json";
  auto with_flag = Tokenizer::fromFile(source);
  // "Ġjeho" is in Llama 3's vocabulary, but its merges alone split " jeho"
  // into three tokens; ignore_merges takes the word whole.
  const auto whole = with_flag->tokenToId("\xC4\xA0jeho");
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(with_flag->encode(" jeho"), (std::vector<TokenId>{*whole}));

  std::ifstream in(source);
  nlohmann::json config = nlohmann::json::parse(in);
  ASSERT_TRUE(config["model"]["ignore_merges"].get<bool>());
  config["model"]["ignore_merges"] = false;
  TempDir dir;
  auto without_flag = Tokenizer::fromFile(dir.write("tokenizer.json", config.dump()));
  const std::vector<TokenId> merged = without_flag->encode(" jeho");
  EXPECT_EQ(merged.size(), 3u);
  EXPECT_EQ(without_flag->decode(merged), " jeho");
}

TEST(TokenizerConfigTest, Qwen3SpecialTokens) {
  auto tok = Tokenizer::fromDirectory(kDataDir / "qwen3");
  EXPECT_EQ(tok->bosTokenId(), std::nullopt);
  EXPECT_EQ(tok->eosTokenId(), 151645);
  EXPECT_FALSE(tok->chatTemplate().empty());
  // <think> is an added token but not a special one: matched in text, kept
  // when special tokens are skipped.
  const auto think = tok->tokenToId("<think>");
  ASSERT_TRUE(think.has_value());
  EXPECT_FALSE(tok->isSpecial(*think));
  const std::vector<TokenId> ids = tok->encode("<think>hi</think>");
  EXPECT_EQ(ids.front(), *think);
  EXPECT_EQ(tok->decode(ids, /*skip_special_tokens=*/true), "<think>hi</think>");
}

// transformers' decode cleans up spaces before punctuation when the config
// says so (Llama 3 does, Qwen3 does not); plain decode never does.
TEST(TokenizerDecodeTest, DecodeAsTransformersCleansUpSpacesWhenTheConfigSaysSo) {
  auto llama = Tokenizer::fromDirectory(kDataDir / "llama3");
  const std::vector<TokenId> ids = {9906, 662, 1917, 1174, 5509, 949};
  EXPECT_EQ(llama->decode(ids), "Hello . world , ok ?");
  EXPECT_EQ(llama->decodeAsTransformers(ids), "Hello. world, ok?");
  const std::vector<TokenId> contraction = llama->encode("I do n't know , it 's fine");
  EXPECT_EQ(llama->decodeAsTransformers(contraction), "I don't know, it's fine");
  auto qwen = Tokenizer::fromDirectory(kDataDir / "qwen3");
  const std::vector<TokenId> qwen_ids = qwen->encode("Hello . world");
  EXPECT_EQ(qwen->decodeAsTransformers(qwen_ids), "Hello . world");
}

// ---------------------------------------------------------------------------
// Lossy decoding and streaming of broken UTF-8.

TEST(TokenizerDecodeTest, InvalidUtf8BecomesReplacementCharacter) {
  auto tok = Tokenizer::fromDirectory(kDataDir / "llama3");
  auto byteId = [&](unsigned char b) {
    auto id = tok->tokenToId(byteLevelChar(b));
    EXPECT_TRUE(id.has_value()) << "byte " << int(b);
    return id.value_or(0);
  };
  const std::string kReplacement = "\xEF\xBF\xBD";
  // 你 is E4 BD A0; its first two bytes followed by 'a' are one maximal
  // invalid subpart, so one U+FFFD, as String::from_utf8_lossy gives.
  EXPECT_EQ(tok->decode(std::vector<TokenId>{byteId(0xE4), byteId(0xBD), byteId('a')}),
            kReplacement + "a");
  EXPECT_EQ(tok->decode(std::vector<TokenId>{byteId(0xFF), byteId(0xE4)}),
            kReplacement + kReplacement);
  EXPECT_EQ(tok->decode(std::vector<TokenId>{byteId(0xE4), byteId(0xBD), byteId(0xA0)}),
            "\xE4\xBD\xA0");

  IncrementalDetokenizer detokenizer(*tok);
  EXPECT_EQ(detokenizer.push(byteId(0xE4)), "");
  EXPECT_EQ(detokenizer.push(byteId(0xBD)), "");
  EXPECT_EQ(detokenizer.push(byteId(0xA0)), "\xE4\xBD\xA0");
  EXPECT_EQ(detokenizer.push(byteId(0xF0)), "");
  EXPECT_EQ(detokenizer.push(byteId('x')), kReplacement + "x");
  EXPECT_EQ(detokenizer.push(byteId(0xE4)), "");
  EXPECT_EQ(detokenizer.flush(), kReplacement);
}

TEST(TokenizerEncodeTest, InvalidUtf8InputIsEncodedAsReplacementCharacter) {
  auto tok = Tokenizer::fromDirectory(kDataDir / "llama3");
  EXPECT_EQ(tok->encode("a\xFF"
                        "b"),
            tok->encode("a\xEF\xBF\xBD"
                        "b"));
}

// ---------------------------------------------------------------------------
// A small hand-written tokenizer.json.

// Byte-level BPE over "hello world", with <s> and </s> as special tokens,
// <sep> as a plain added token that swallows the spaces around it, "ça" as an
// added token matched after NFC, and "ld" as one matched only as a whole word.
nlohmann::json smallTokenizer(bool merges_as_pairs) {
  const std::vector<std::string> tokens = {"<s>", "</s>", "h",    "e",     "l",     "o",    "Ġ",
                                           "w",   "r",    "d",    "he",    "ll",    "hell", "hello",
                                           "Ġw",  "or",   "Ġwor", "Ġworl", "Ġworld"};
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"h", "e"}, {"l", "l"},   {"he", "ll"},  {"hell", "o"}, {"Ġ", "w"},
      {"o", "r"}, {"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"}};
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : pairs) {
    if (merges_as_pairs) {
      merges.push_back({a, b});
    } else {
      merges.push_back(a + " " + b);
    }
  }
  auto added = [](int id, const char* content, bool special, bool strip, bool normalized = false,
                  bool single_word = false) {
    return nlohmann::json{{"id", id},          {"content", content}, {"single_word", single_word},
                          {"lstrip", strip},   {"rstrip", strip},    {"normalized", normalized},
                          {"special", special}};
  };
  return {{"version", "1.0"},
          {"added_tokens",
           {added(0, "<s>", true, false), added(1, "</s>", true, false),
            added(19, "<sep>", false, true),
            added(20,
                  "\xC3\xA7"
                  "a",
                  false, false, /*normalized=*/true),
            added(21, "ld", false, false, false, /*single_word=*/true)}},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}}},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
            {"pair", nlohmann::json::array()},
            {"special_tokens",
             {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}},
              {"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}}},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

class SmallTokenizerTest : public ::testing::TestWithParam<bool> {};

TEST_P(SmallTokenizerTest, MergesApplyInRankOrder) {
  TempDir dir;
  const fs::path path = dir.write("tokenizer.json", smallTokenizer(GetParam()).dump());
  auto tok = Tokenizer::fromFile(path);
  EXPECT_EQ(tok->vocabSize(), 22);
  EXPECT_EQ(tok->encode("hello world"), (std::vector<TokenId>{13, 18}));
  EXPECT_EQ(tok->encode("hell"), (std::vector<TokenId>{12}));
  // "ll" merges first (rank 1); nothing joins "e" with "ll".
  EXPECT_EQ(tok->encode("ello"), (std::vector<TokenId>{3, 11, 5}));
  // Without the leading space "world" cannot reach "Ġwor".
  EXPECT_EQ(tok->encode("world"), (std::vector<TokenId>{7, 15, 4, 9}));
  EXPECT_EQ(tok->decode(std::vector<TokenId>{13, 18}), "hello world");
}

// encodeLast cuts from the left as transformers' truncation with
// truncation_side "left" does: the template's <s> and </s> stay, the text's
// first ids go.
TEST_P(SmallTokenizerTest, EncodeLastKeepsTheSpecialTokensAndTheTextsLastIds) {
  TempDir dir;
  auto tok = Tokenizer::fromFile(dir.write("tokenizer.json", smallTokenizer(GetParam()).dump()));
  const std::string text = "hello world ello";
  const std::vector<TokenId> whole = tok->encode(text);
  ASSERT_EQ(whole, (std::vector<TokenId>{13, 18, 6, 3, 11, 5}));
  bool cut = true;
  EXPECT_EQ(tok->encodeLast(text, /*add_special_tokens=*/true, 10, &cut),
            tok->encode(text, /*add_special_tokens=*/true));
  EXPECT_FALSE(cut);
  EXPECT_EQ(tok->encodeLast(text, true, 5, &cut), (std::vector<TokenId>{0, 3, 11, 5, 1}));
  EXPECT_TRUE(cut);
  EXPECT_EQ(tok->encodeLast(text, false, 3, &cut), (std::vector<TokenId>{3, 11, 5}));
  EXPECT_TRUE(cut);
  // No room for the text: the special tokens alone.
  EXPECT_EQ(tok->encodeLast(text, true, 1), (std::vector<TokenId>{0, 1}));
}

TEST_P(SmallTokenizerTest, AddedTokensAreMatchedBeforePreTokenization) {
  TempDir dir;
  auto tok = Tokenizer::fromFile(dir.write("tokenizer.json", smallTokenizer(GetParam()).dump()));
  // The regex alone would cut "he<s>ll" into "he", "<", "s", ">ll".
  EXPECT_EQ(tok->encode("he<s>ll"), (std::vector<TokenId>{10, 0, 11}));
  EXPECT_EQ(tok->encode("<s>hello</s> world"), (std::vector<TokenId>{0, 13, 1, 18}));
  // <sep> strips the spaces on both sides, so "world" has no leading space.
  EXPECT_EQ(tok->encode("hello  <sep> world"), (std::vector<TokenId>{13, 19, 7, 15, 4, 9}));
  EXPECT_TRUE(tok->isSpecial(0));
  EXPECT_FALSE(tok->isSpecial(19));
  EXPECT_EQ(tok->decode(std::vector<TokenId>{0, 13, 19, 1}), "<s>hello<sep></s>");
  EXPECT_EQ(tok->decode(std::vector<TokenId>{0, 13, 19, 1}, /*skip_special_tokens=*/true),
            "hello<sep>");
}

// An added token that repeats its vocabulary entry in the byte-level
// spelling ("Ġworld", id 18) decodes as that entry (" world"), as Hugging
// Face's ByteLevel decoder gives it: decode(encode(x)) == x. One whose
// content is plain text keeps it.
TEST_P(SmallTokenizerTest, AnAddedTokenInTheByteLevelSpellingDecodesAsItsEntry) {
  nlohmann::json file = smallTokenizer(GetParam());
  file["added_tokens"].push_back({{"id", 18},
                                  {"content", "\u0120world"},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", false},
                                  {"special", false}});
  TempDir dir;
  auto tok = Tokenizer::fromFile(dir.write("tokenizer.json", file.dump()));
  EXPECT_EQ(tok->decode(std::vector<TokenId>{13, 18}), "hello world");
  EXPECT_EQ(tok->decode(std::vector<TokenId>{21}), "ld");
}

TEST_P(SmallTokenizerTest, AddedTokenFlags) {
  TempDir dir;
  auto tok = Tokenizer::fromFile(dir.write("tokenizer.json", smallTokenizer(GetParam()).dump()));
  // "c" + U+0327 COMBINING CEDILLA composes to "ç" before normalized added
  // tokens are looked for.
  EXPECT_EQ(tok->encode("c\xCC\xA7"
                        "a"),
            (std::vector<TokenId>{20}));
  EXPECT_EQ(tok->encode("he\xC3\xA7"
                        "a"),
            (std::vector<TokenId>{10, 20}));
  // single_word: "ld" alone is the added token, inside "world" it is not.
  EXPECT_EQ(tok->encode("ld"), (std::vector<TokenId>{21}));
  EXPECT_EQ(tok->encode("hello ld"), (std::vector<TokenId>{13, 6, 21}));
  EXPECT_EQ(tok->encode("world"), (std::vector<TokenId>{7, 15, 4, 9}));
}

TEST_P(SmallTokenizerTest, IncrementalDetokenizerSkipsSpecialTokens) {
  TempDir dir;
  auto tok = Tokenizer::fromFile(dir.write("tokenizer.json", smallTokenizer(GetParam()).dump()));
  const std::vector<TokenId> ids = {0, 13, 18, 19, 1};
  for (bool skip : {false, true}) {
    IncrementalDetokenizer detokenizer(*tok, skip);
    std::string streamed;
    for (TokenId id : ids) streamed += detokenizer.push(id);
    streamed += detokenizer.flush();
    EXPECT_EQ(streamed, tok->decode(ids, skip));
  }
  EXPECT_EQ(tok->decode(ids, true), "hello world<sep>");
}

TEST_P(SmallTokenizerTest, AddSpecialTokensAppliesTemplate) {
  TempDir dir;
  auto tok = Tokenizer::fromFile(dir.write("tokenizer.json", smallTokenizer(GetParam()).dump()));
  EXPECT_EQ(tok->encode("hello world", /*add_special_tokens=*/true),
            (std::vector<TokenId>{0, 13, 18, 1}));
  EXPECT_EQ(tok->encode("", /*add_special_tokens=*/true), (std::vector<TokenId>{0, 1}));
  EXPECT_EQ(tok->encode("hello world", /*add_special_tokens=*/false),
            (std::vector<TokenId>{13, 18}));
}

INSTANTIATE_TEST_SUITE_P(MergeForms, SmallTokenizerTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return std::string(info.param ? "Pairs" : "Strings");
                         });

// Characters outside the vocabulary: byte_fallback spells them as <0xNN>
// tokens, otherwise they become unk_token (one per run with fuse_unk).
TEST(BpeModelTest, UnknownCharacters) {
  auto make = [](bool byte_fallback, bool fuse_unk) {
    return nlohmann::json{
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", nullptr},
        {"pre_tokenizer", nullptr},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model",
         {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"fuse_unk", fuse_unk},
          {"byte_fallback", byte_fallback},
          {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"<0xC3>", 3}, {"<0xA9>", 4}, {"ab", 5}}},
          {"merges", {"a b"}}}}};
  };
  TempDir dir;
  auto fallback = Tokenizer::fromFile(dir.write("fallback.json", make(true, false).dump()));
  EXPECT_EQ(fallback->encode("ab\xC3\xA9"), (std::vector<TokenId>{5, 3, 4}));
  auto fused = Tokenizer::fromFile(dir.write("fused.json", make(false, true).dump()));
  EXPECT_EQ(fused->encode("ab\xC3\xA9\xC3\xA9"
                          "a"),
            (std::vector<TokenId>{5, 0, 1}));
  auto unfused = Tokenizer::fromFile(dir.write("unfused.json", make(false, false).dump()));
  EXPECT_EQ(unfused->encode("ab\xC3\xA9\xC3\xA9"
                            "a"),
            (std::vector<TokenId>{5, 0, 0, 1}));
}

TEST(SmallTokenizerConfigTest, ConfigTokensAsObjectsAndNamedTemplates) {
  TempDir dir;
  dir.write("tokenizer.json", smallTokenizer(false).dump());
  dir.write("tokenizer_config.json",
            nlohmann::json{{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                           {"eos_token", "</s>"},
                           {"chat_template",
                            {{{"name", "tool_use"}, {"template", "tools"}},
                             {{"name", "default"}, {"template", "plain"}}}}}
                .dump());
  auto tok = Tokenizer::fromDirectory(dir.path());
  EXPECT_EQ(tok->bosTokenId(), 0);
  EXPECT_EQ(tok->eosTokenId(), 1);
  EXPECT_EQ(tok->chatTemplate(), "plain");
}

// ---------------------------------------------------------------------------
// Load errors name the file and the problem.

std::string loadError(const fs::path& path) {
  try {
    Tokenizer::fromFile(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerLoadErrorTest, MissingFile) {
  TempDir dir;
  const fs::path path = dir.path() / "absent.json";
  const std::string message = loadError(path);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("not found"), std::string::npos) << message;
}

TEST(TokenizerLoadErrorTest, MissingDirectoryFile) {
  TempDir dir;
  try {
    Tokenizer::fromDirectory(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: file not found"), std::string::npos)
        << e.what();
  }
}

// A tokenizer file past its bound (a sparse 300 MiB tokenizer.json, a
// 65 MiB tokenizer_config.json) is refused naming its size, before it is
// read (before, it was read whole and parsed), and a FIFO in place of one
// is named as such.
TEST(TokenizerLoadErrorTest, AFileTooLargeOrNotRegularIsRefusedUnread) {
  TempDir dir;
  const fs::path huge = dir.path() / "tokenizer.json";
  fs::resize_file(dir.write("tokenizer.json", ""), 300ull << 20);
  std::string message = loadError(huge);
  EXPECT_NE(message.find(huge.string() + ": 314572800 bytes, more than the 268435456"),
            std::string::npos)
      << message;
  TempDir model;
  model.write("tokenizer.json", smallTokenizer(false).dump());
  fs::resize_file(model.write("tokenizer_config.json", ""), 65ull << 20);
  auto directoryError = [&] {
    try {
      Tokenizer::fromDirectory(model.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  message = directoryError();
  EXPECT_NE(message.find("tokenizer_config.json: 68157440 bytes, more than the 67108864"),
            std::string::npos)
      << message;
  fs::remove(model.path() / "tokenizer_config.json");
  ASSERT_EQ(::mkfifo((model.path() / "tokenizer_config.json").c_str(), 0600), 0);
  message = directoryError();
  EXPECT_NE(message.find("tokenizer_config.json: not a regular file"), std::string::npos)
      << message;
}

TEST(TokenizerLoadErrorTest, BadJson) {
  TempDir dir;
  const fs::path path = dir.write("tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
  const std::string message = loadError(path);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("invalid JSON"), std::string::npos) << message;
}

TEST(TokenizerLoadErrorTest, NumberBeyondADoubleIsInvalidJson) {
  TempDir dir;
  const fs::path path = dir.write("tokenizer.json", "{\"version\": 1e400}");
  EXPECT_EQ(loadError(path), path.string() + ": invalid JSON: number overflow parsing '1e400'");
}

TEST(TokenizerLoadErrorTest, IdsBeyondTheLimitAreRefusedBeforeAnyTableIsSized) {
  TempDir dir;
  nlohmann::json config = smallTokenizer(false);
  config["added_tokens"].push_back({{"id", 2147483647}, {"content", "<x>"}, {"special", true}});
  fs::path path = dir.write("tokenizer.json", config.dump());
  EXPECT_NE(loadError(path).find("must have an id in [0, 4194304)"), std::string::npos)
      << loadError(path);

  config = smallTokenizer(false);
  config["model"]["vocab"]["far"] = 4194304;
  path = dir.write("tokenizer.json", config.dump());
  EXPECT_NE(loadError(path).find("model.vocab entry 'far' must have an integer id in [0, 4194304), "
                                 "got 4194304"),
            std::string::npos)
      << loadError(path);
}

// The ids add_special_tokens puts around a prompt reach the model: one past
// the vocabulary (22 ids here) or not an integer is refused at load.
TEST(TokenizerLoadErrorTest, TemplateIdsOutsideTheVocabularyAreRefused) {
  TempDir dir;
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {22, "TemplateProcessing special token '</s>' has id 22, outside the vocabulary (ids 0..21)"},
      {-1,
       "TemplateProcessing special token '</s>' has id -1 (accepted: a non-negative integer id)"},
      {"1",
       "TemplateProcessing special token '</s>' has id \"1\" (accepted: a non-negative "
       "integer id)"},
  };
  for (const auto& [id, expected] : cases) {
    SCOPED_TRACE(id.dump());
    nlohmann::json config = smallTokenizer(false);
    config["post_processor"]["special_tokens"]["</s>"]["ids"] = {id};
    const fs::path path = dir.write("tokenizer.json", config.dump());
    const std::string message = loadError(path);
    EXPECT_NE(message.find(path.string() + ": " + expected), std::string::npos) << message;
  }
  nlohmann::json config = smallTokenizer(false);
  config["post_processor"]["special_tokens"]["</s>"]["ids"] = {21};
  const std::unique_ptr<Tokenizer> tok =
      Tokenizer::fromFile(dir.write("tokenizer.json", config.dump()));
  EXPECT_EQ(tok->encode("", /*add_special_tokens=*/true), (std::vector<TokenId>{0, 21}));
}

TEST(TokenizerLoadErrorTest, UnsupportedModelType) {
  TempDir dir;
  nlohmann::json config = smallTokenizer(false);
  config["model"] = {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}, {"unk_token", "[UNK]"}};
  const fs::path path = dir.write("tokenizer.json", config.dump());
  const std::string message = loadError(path);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("model type 'WordPiece' is not supported"), std::string::npos) << message;
}

TEST(TokenizerLoadErrorTest, UnsupportedComponents) {
  TempDir dir;
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"pre_tokenizer",
       {{"type", "Whitespace"}},
       "pre_tokenizer type 'Whitespace' is not supported"},
      {"normalizer", {{"type", "Lowercase"}}, "normalizer type 'Lowercase' is not supported"},
      {"decoder",
       {{"type", "WordPiece"}, {"prefix", "##"}},
       "decoder type 'WordPiece' is not supported"},
      {"post_processor",
       {{"type", "BertProcessing"}},
       "post_processor type 'BertProcessing' is not supported"},
  };
  for (const Case& c : cases) {
    nlohmann::json config = smallTokenizer(false);
    config[c.field] = c.value;
    const fs::path path = dir.write("tokenizer.json", config.dump());
    const std::string message = loadError(path);
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

// ---------------------------------------------------------------------------
// SentencePiece-style pieces: the behaviour the Rust tokenizers document.

TEST(NormalizerTest, PrependAndReplaceAsHuggingFaceApplyThem) {
  using tokenizer_internal::Normalizer;
  const Normalizer llama2(
      {{"type", "Sequence"},
       {"normalizers",
        {{{"type", "Prepend"}, {"prepend", "\u2581"}},
         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}},
      "t.json");
  EXPECT_EQ(llama2.apply("Hey  friend"), "\u2581Hey\u2581\u2581friend");
  EXPECT_EQ(llama2.apply(" x"), "\u2581\u2581x");
  // Empty text stays empty: nothing to put a prefix on.
  EXPECT_EQ(llama2.apply(""), "");
  EXPECT_EQ(llama2.maxShrink(), 1);

  const Normalizer regex({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}},
                         "t.json");
  EXPECT_EQ(regex.apply("a  b    c d"), "a b c d");
  // A regex can shorten text without bound.
  EXPECT_EQ(regex.maxShrink(), std::nullopt);
  const Normalizer shorter(
      {{"type", "Replace"}, {"pattern", {{"String", "abc"}}}, {"content", "x"}}, "t.json");
  EXPECT_EQ(shorter.apply("abcabcab"), "xxab");
  EXPECT_EQ(shorter.maxShrink(), 3);
  const Normalizer removing({{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", ""}},
                            "t.json");
  EXPECT_EQ(removing.apply("banana"), "bnn");
  EXPECT_EQ(removing.maxShrink(), std::nullopt);
  EXPECT_EQ(Normalizer(nlohmann::json{{"type", "NFC"}}, "t.json").maxShrink(), 4);
  EXPECT_THROW(
      Normalizer({{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}}, "t.json"),
      Error);
}

// Metaspace: spaces become the replacement, which goes in front as the
// prepend_scheme says (never twice), and splits before each one when
// `split` (Hugging Face's own examples).
TEST(PreTokenizerTest, MetaspacePrependsAndSplitsAsHuggingFaceDocumentsIt) {
  auto words = [](nlohmann::json config, std::string_view text, bool at_start = true) {
    config["type"] = "Metaspace";
    config["replacement"] = "\u2581";
    const tokenizer_internal::PreTokenizer metaspace(config, "t.json");
    std::vector<std::string> out;
    metaspace.apply(text, out, at_start);
    return out;
  };
  using Words = std::vector<std::string>;
  const std::string m = "\u2581";
  EXPECT_EQ(words({{"prepend_scheme", "always"}}, "Hey friend!"),
            (Words{m + "Hey", m + "friend!"}));
  EXPECT_EQ(words({{"prepend_scheme", "always"}}, "Hey   friend!"),
            (Words{m + "Hey", m, m, m + "friend!"}));
  // A text that starts with a space already has its replacement.
  EXPECT_EQ(words({{"prepend_scheme", "always"}}, " Hey"), (Words{m + "Hey"}));
  EXPECT_EQ(words({{"prepend_scheme", "always"}}, "Hey", false), (Words{m + "Hey"}));
  EXPECT_EQ(words({{"prepend_scheme", "first"}}, "Hey", true), (Words{m + "Hey"}));
  EXPECT_EQ(words({{"prepend_scheme", "first"}}, "Hey", false), (Words{"Hey"}));
  EXPECT_EQ(words({{"prepend_scheme", "never"}}, "Hey you"), (Words{"Hey", m + "you"}));
  EXPECT_EQ(words({{"prepend_scheme", "first"}, {"split", false}}, "Hey  you"),
            (Words{m + "Hey" + m + m + "you"}));
  // Files older than prepend_scheme say add_prefix_space.
  EXPECT_EQ(words({{"add_prefix_space", false}}, "Hey"), (Words{"Hey"}));
  EXPECT_EQ(words({{"add_prefix_space", true}}, "Hey", false), (Words{m + "Hey"}));
  EXPECT_THROW(words({{"prepend_scheme", "sometimes"}}, "Hey"), Error);
}

// A tokenizer of the SentencePiece kind over "▁▁", "▁a", "a", "b" and the
// bytes of "é", whose normalizer, pre-tokenizer and decoder are given.
nlohmann::json metaspaceTokenizer(const nlohmann::json& normalizer,
                                  const nlohmann::json& pre_tokenizer,
                                  const nlohmann::json& decoder) {
  nlohmann::json vocab = {{"<unk>", 0},  {"<s>", 1},     {"\u2581", 2},
                          {"a", 3},      {"b", 4},       {"<0xC3>", 5},
                          {"<0xA9>", 6}, {"\u2581a", 7}, {"\u2581\u2581", 8}};
  // The other bytes' tokens, as every such vocabulary has them.
  int next_id = 9;
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", byte);
    if (!vocab.contains(name)) vocab[name] = next_id++;
  }
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}}}},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", decoder},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", {"\u2581 a", "\u2581 \u2581"}}}}};
}

// Each token decodes to its bytes ("▁" a space, "<0xC3>" one byte), so a
// stream's pieces add up to decode(); transformers' decode also drops what
// the decoder drops at the start: Strip's leading space after Fuse, or,
// with a Metaspace decoder, every "▁" of the first token, as the Rust
// tokenizers do.
TEST(TokenizerDecodeTest, SentencePieceTokensAndWhatTransformersDropsAtTheStart) {
  TempDir dir;
  const nlohmann::json replace = {
      {"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}};
  const nlohmann::json legacy_decoder = {
      {"type", "Sequence"},
      {"decoders",
       {replace,
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  const nlohmann::json legacy_normalizer = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\u2581"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  auto legacy = Tokenizer::fromFile(dir.write(
      "legacy.json", metaspaceTokenizer(legacy_normalizer, nullptr, legacy_decoder).dump()));
  // "a é" → "▁a▁é": é is not a piece, so its two bytes.
  const std::vector<TokenId> ids = legacy->encode("a \xC3\xA9");
  EXPECT_EQ(ids, (std::vector<TokenId>{7, 2, 5, 6}));
  EXPECT_EQ(legacy->decode(ids), " a \xC3\xA9");
  EXPECT_EQ(legacy->decodeAsTransformers(ids), "a \xC3\xA9");
  EXPECT_EQ(legacy->tokenBytes(5), "\xC3");
  // The stream holds the first byte back until the character is whole.
  IncrementalDetokenizer stream(*legacy);
  EXPECT_EQ(stream.push(7), " a");
  EXPECT_EQ(stream.push(2), " ");
  EXPECT_EQ(stream.push(5), "");
  EXPECT_EQ(stream.push(6), "\xC3\xA9");
  // Only one leading space is stripped: " b" is "▁▁b".
  EXPECT_EQ(legacy->encode(" b"), (std::vector<TokenId>{8, 4}));
  EXPECT_EQ(legacy->decodeAsTransformers(legacy->encode(" b")), " b");
  // With every byte a token, nothing is unknown: the text bound holds even
  // though fuse_unk is set; one byte short (Gemma 2 lacks one), a run of
  // unknown characters can be one id, and there is none.
  EXPECT_TRUE(legacy->maxTextBytesPerToken().has_value());
  nlohmann::json short_of_a_byte = metaspaceTokenizer(legacy_normalizer, nullptr, legacy_decoder);
  short_of_a_byte["model"]["vocab"].erase("<0x00>");
  EXPECT_FALSE(Tokenizer::fromFile(dir.write("short.json", short_of_a_byte.dump()))
                   ->maxTextBytesPerToken()
                   .has_value());

  auto metaspace = [&](const char* scheme) {
    const nlohmann::json config = {
        {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}};
    return Tokenizer::fromFile(dir.write(std::string(scheme) + ".json",
                                         metaspaceTokenizer(nullptr, config, config).dump()));
  };
  auto first = metaspace("first");
  // "first": the replacement goes in front of the text's first piece only.
  EXPECT_EQ(first->encode("a"), (std::vector<TokenId>{7}));
  EXPECT_EQ(first->encode("<s>a"), (std::vector<TokenId>{1, 3}));
  // The first token's "▁"s are all dropped; later ones are spaces.
  EXPECT_EQ(first->decodeAsTransformers(std::vector<TokenId>{8, 4, 8, 7}), "b   a");
  EXPECT_EQ(first->decode(std::vector<TokenId>{8, 4, 8, 7}), "  b   a");
  // A skipped special token does not count as the first.
  EXPECT_EQ(first->decodeAsTransformers(std::vector<TokenId>{1, 7}, true), "a");
  EXPECT_EQ(first->decodeAsTransformers(std::vector<TokenId>{1, 7}), "<s> a");
  auto never = metaspace("never");
  EXPECT_EQ(never->encode("a"), (std::vector<TokenId>{3}));
  EXPECT_EQ(never->decodeAsTransformers(std::vector<TokenId>{8, 4}), "  b");
}

TEST(TokenizerLoadErrorTest, DecodersThatDoNotWorkTokenByTokenAreRefused) {
  TempDir dir;
  const nlohmann::json fuse = {{"type", "Fuse"}};
  auto strip = [](int start, int stop) {
    return nlohmann::json{{"type", "Strip"}, {"content", " "}, {"start", start}, {"stop", stop}};
  };
  auto sequence = [](std::vector<nlohmann::json> steps) {
    return nlohmann::json{{"type", "Sequence"}, {"decoders", steps}};
  };
  struct Case {
    nlohmann::json decoder;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {strip(1, 0), "decoder Strip is supported once, after Fuse"},
      {sequence({fuse, strip(0, 1)}), "stripping the start only (stop 0)"},
      {sequence({fuse, {{"type", "ByteFallback"}}}), "decoder ByteFallback after Fuse"},
      {{{"type", "Replace"}, {"pattern", {{"Regex", "a+"}}}, {"content", "b"}},
       "decoder Replace with a Regex pattern is not supported"},
      {{{"type", "CTC"}},
       "decoder type 'CTC' is not supported (supported: ByteLevel, ByteFallback"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.decoder.dump());
    const fs::path path =
        dir.write("tokenizer.json", metaspaceTokenizer(nullptr, nullptr, c.decoder).dump());
    const std::string message = loadError(path);
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

// A Split whose pattern is {"String": ...} splits on that text literally
// (a '.' is a dot, not any character), with each behavior.
TEST(PreTokenizerTest, ASplitOnAStringIsLiteral) {
  auto words = [](const char* behavior, std::string_view text) {
    const tokenizer_internal::PreTokenizer split(
        {{"type", "Split"}, {"pattern", {{"String", "."}}}, {"behavior", behavior}}, "t.json");
    std::vector<std::string> out;
    split.apply(text, out);
    return out;
  };
  using Words = std::vector<std::string>;
  EXPECT_EQ(words("Isolated", "a.b..c"), (Words{"a", ".", "b", ".", ".", "c"}));
  EXPECT_EQ(words("Removed", "a.b..c"), (Words{"a", "b", "c"}));
  EXPECT_EQ(words("Contiguous", "a.b..c"), (Words{"a", ".", "b", "..", "c"}));
  EXPECT_EQ(words("Isolated", "abc"), (Words{"abc"}));
}

// Each SplitDelimiterBehavior cuts Hugging Face's documented example as its
// documentation says; invert makes the matches the pieces kept and the text
// between them the delimiters.
TEST(PreTokenizerTest, EachSplitBehaviorCutsAsHuggingFaceDocumentsIt) {
  auto words = [](const char* pattern, const char* behavior, bool invert) {
    const tokenizer_internal::PreTokenizer split({{"type", "Split"},
                                                  {"pattern", {{"Regex", pattern}}},
                                                  {"behavior", behavior},
                                                  {"invert", invert}},
                                                 "t.json");
    std::vector<std::string> out;
    split.apply("the-final--countdown", out);
    return out;
  };
  using Words = std::vector<std::string>;
  EXPECT_EQ(words("-", "Removed", false), (Words{"the", "final", "countdown"}));
  EXPECT_EQ(words("-", "Isolated", false), (Words{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(words("-", "MergedWithPrevious", false), (Words{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(words("-", "MergedWithNext", false), (Words{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(words("-", "Contiguous", false), (Words{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(words("[a-z]+", "Removed", true), (Words{"the", "final", "countdown"}));
  EXPECT_EQ(words("[a-z]+", "MergedWithNext", true), (Words{"the", "-final", "--countdown"}));
  EXPECT_EQ(words("[a-z]+", "MergedWithPrevious", true), (Words{"the-", "final--", "countdown"}));
}

// A field of the wrong type is refused naming the file, the field and what
// it must be, never a bare JSON library message nor a silent default.
TEST(TokenizerLoadErrorTest, WrongFieldTypeNamesTheField) {
  TempDir dir;
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const Case cases[] = {
      {[](nlohmann::json& c) { c["added_tokens"][0]["special"] = "yes"; },
       R"(added_tokens[0].special must be true or false, got "yes")"},
      {[](nlohmann::json& c) { c["added_tokens"][0]["lstrip"] = 1; },
       "added_tokens[0].lstrip must be true or false, got 1"},
      {[](nlohmann::json& c) {
         c["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", "no"}};
       },
       R"(pre_tokenizer ByteLevel.add_prefix_space must be true or false, got "no")"},
      {[](nlohmann::json& c) {
         c["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", 3}};
       },
       "pre_tokenizer Split.behavior must be a string, got 3"},
      {[](nlohmann::json& c) {
         c["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", 5}}, {{"Sequence", {{"id", "A"}}}}}},
                                {"special_tokens", nlohmann::json::object()}};
       },
       "TemplateProcessing SpecialToken must be an object, got 5"},
  };
  for (const Case& c : cases) {
    nlohmann::json config = smallTokenizer(false);
    c.edit(config);
    const fs::path path = dir.write("tokenizer.json", config.dump());
    const std::string message = loadError(path);
    EXPECT_NE(message.find(path.string() + ": "), std::string::npos) << message;
    EXPECT_NE(message.find(c.message), std::string::npos) << message;
  }
}

TEST(TokenizerLoadErrorTest, ConfigTokenNotInVocabulary) {
  TempDir dir;
  dir.write("tokenizer.json", smallTokenizer(false).dump());
  dir.write("tokenizer_config.json", R"({"bos_token": "<bos>"})");
  try {
    Tokenizer::fromDirectory(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: bos_token '<bos>' is not a token"),
              std::string::npos)
        << e.what();
  }
}

TEST(TokenizerLoadErrorTest, TwoVocabularyTokensWithOneId) {
  TempDir dir;
  nlohmann::json config = smallTokenizer(false);
  config["model"]["vocab"]["zz"] = 5;  // "o" has id 5
  const fs::path path = dir.write("tokenizer.json", config.dump());
  EXPECT_EQ(loadError(path), path.string() + ": model.vocab gives id 5 to both 'o' and 'zz'");
}

TEST(TokenizerLoadErrorTest, AddedTokenIdsMustNotMeanTwoTokens) {
  TempDir dir;
  auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id}, {"content", content}, {"special", true}};
  };
  nlohmann::json config = smallTokenizer(false);
  config["added_tokens"].push_back(added(5, "<x>"));  // "o" has id 5 in the vocabulary
  fs::path path = dir.write("tokenizer.json", config.dump());
  EXPECT_EQ(loadError(path),
            path.string() + ": added token '<x>' has id 5, which model.vocab gives to 'o'");

  config = smallTokenizer(false);
  config["added_tokens"].push_back(added(19, "<cls>"));  // "<sep>" has id 19
  path = dir.write("tokenizer.json", config.dump());
  EXPECT_EQ(loadError(path), path.string() + ": added tokens '<cls>' and '<sep>' both have id 19");

  // The same token twice is no conflict: repeated added entries, an added
  // token that is also in the vocabulary (<s>, id 0), or in its byte-level
  // spelling ("Ġw" is " w").
  config = smallTokenizer(false);
  config["added_tokens"].push_back(added(19, "<sep>"));
  config["added_tokens"].push_back(added(14, " w"));
  path = dir.write("tokenizer.json", config.dump());
  auto tokenizer = Tokenizer::fromFile(path);
  EXPECT_EQ(tokenizer->tokenToId("<s>"), 0);
  EXPECT_EQ(tokenizer->tokenToId("<sep>"), 19);
  EXPECT_EQ(tokenizer->decode(std::vector<TokenId>{14}), " w");
}

TEST(TokenizerLoadErrorTest, MergeOutsideVocabulary) {
  TempDir dir;
  nlohmann::json config = smallTokenizer(false);
  config["model"]["merges"].push_back("x y");
  const std::string message = loadError(dir.write("tokenizer.json", config.dump()));
  EXPECT_NE(message.find("merge 9 ('x', 'y') uses a token that is not in model.vocab"),
            std::string::npos)
      << message;
}

// The tokenizer's per-thread scratch keeps what a common call needs and
// gives back what a huge input made it grow to (1 MiB and more), so a
// worker thread does not hold its largest prompt's peak for good.
TEST(ThreadScratch, KeepsSmallScratchAndReleasesLargeScratch) {
  std::vector<int> small(1000);
  std::vector<uint64_t> large((kScratchKeepBytes / sizeof(uint64_t)) + 1);
  {
    const ScratchTrim trim(small, large);
    small.clear();
    large.clear();
  }
  EXPECT_GE(small.capacity(), 1000u);
  EXPECT_EQ(large.capacity(), 0u);
}

}  // namespace
}  // namespace tandem
