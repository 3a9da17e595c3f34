#include "common/structured/matcher.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <fstream>
#include <random>
#include <string>

#include "common/structured/constraint.h"
#include "common/structured/json_schema.h"
#include "common/structured/regex_grammar.h"

namespace tandem::structured {
namespace {

// A small vocabulary with single bytes, JSON-ish pieces, multi-byte UTF-8
// characters and halves of them, so tokens cross rule boundaries.
std::vector<std::string> testTokens() {
  std::vector<std::string> tokens{""};  // id 0: a special token (no bytes)
  for (int c = 0x20; c < 0x7F; ++c) tokens.emplace_back(1, static_cast<char>(c));
  for (const char* piece :
       {"{\"",          "\":",      "\",",   "\"}",          "\"a",  "ab",       "abc",  "\"abc\"",
        "1,",           "12",       "]}",    "},",           "true", "null",     ",\"",  "[1",
        "a\"",          "b\":",     "\":\"", "\"}]",         "z\"}", "\xC3\xA9", "\xC3", "\xA9",
        "\xE2\x82\xAC", "\xE2\x82", "a\xC3", "\"\xC3\xA9\"", "[[",   "]]",       "\"]"}) {
    tokens.emplace_back(piece);
  }
  return tokens;
}

// obj ::= "{" (pair ("," pair)*)? "}" ; pair ::= str ":" val ;
// str ::= "\"" ([a-z] | "é" | "€")* "\"" ; val ::= str | [0-9]+ | obj | list ;
// list ::= "[" (val ("," val)*)? "]"
Grammar jsonish() {
  GrammarBuilder b;
  const int32_t obj = b.declare("obj");
  const int32_t list = b.declare("list");
  const int32_t str = b.add("str", seq({literal("\""),
                                        star(alt({bytes(ByteSet::range('a', 'z')),
                                                  codePoints({{0xE9, 0xE9}, {0x20AC, 0x20AC}})})),
                                        literal("\"")}));
  const int32_t val =
      b.add("val", alt({ref(str), plus(bytes(ByteSet::range('0', '9'))), ref(obj), ref(list)}));
  const int32_t pair = b.add("pair", seq({ref(str), literal(":"), ref(val)}));
  b.define(obj, seq({literal("{"), optional(seq({ref(pair), star(seq({literal(","), ref(pair)}))})),
                     literal("}")}));
  b.define(list, seq({literal("["), optional(seq({ref(val), star(seq({literal(","), ref(val)}))})),
                      literal("]")}));
  StatusOr<Grammar> g = b.build(obj);
  EXPECT_TRUE(g.isOk()) << g.status().message();
  return std::move(g).value();
}

bool bit(const std::vector<uint64_t>& mask, TokenId id) {
  return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u;
}

TEST(StructuredMatcher, MaskAgreesWithAcceptingEachTokenAlongRandomWalks) {
  auto vocab = std::make_shared<Vocabulary>(testTokens(), 200);
  auto compiled = std::make_shared<CompiledGrammar>(jsonish(), vocab);
  std::mt19937 rng(7);
  int64_t checked_states = 0;
  for (int walk = 0; walk < 40; ++walk) {
    Matcher matcher(compiled);
    std::string text;
    for (int step = 0; step < 60 && !matcher.finished(); ++step) {
      std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()));
      matcher.fillMask(mask);
      std::vector<TokenId> allowed;
      for (TokenId id = 0; id < vocab->size(); ++id) {
        Matcher probe = matcher;
        const bool accepts = probe.accept(id);
        ASSERT_EQ(bit(mask, id), accepts)
            << "token " << id << " '" << vocab->bytes(id) << "' after '" << text << "'";
        if (accepts) allowed.push_back(id);
      }
      ++checked_states;
      if (allowed.empty()) break;
      // Prefer closing tokens later in a walk so walks finish.
      const TokenId pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(matcher.accept(pick));
      text += vocab->bytes(pick);
      if (matcher.canEnd() && rng() % 4 == 0) break;
    }
    if (matcher.canEnd()) {
      EXPECT_TRUE(grammarAccepts(compiled->grammar(), text)) << text;
    }
  }
  EXPECT_GT(checked_states, 500);
  const CompiledGrammar::Stats stats = compiled->stats();
  EXPECT_GT(stats.mask_cache_hits, 0);
  EXPECT_GT(stats.classified, 5);
}

TEST(StructuredMatcher, EndsOnlyInAcceptingStatesAndRefusesWhatTheGrammarDoesNot) {
  auto vocab = std::make_shared<Vocabulary>(testTokens(), 200);
  auto compiled = std::make_shared<CompiledGrammar>(jsonish(), vocab);
  Matcher matcher(compiled);
  EXPECT_FALSE(matcher.canEnd());
  auto id = [&](std::string_view piece) {
    for (TokenId t = 0; t < vocab->size(); ++t) {
      if (vocab->bytes(t) == piece) return t;
    }
    ADD_FAILURE() << "no token " << piece;
    return TokenId{0};
  };
  EXPECT_FALSE(matcher.accept(id("}")));
  EXPECT_FALSE(matcher.accept(0));  // no bytes: never allowed
  ASSERT_TRUE(matcher.accept(id("{\"")));
  ASSERT_TRUE(matcher.accept(id("\xC3")));  // half of é
  EXPECT_FALSE(matcher.accept(id("a")));    // not a continuation byte
  ASSERT_TRUE(matcher.accept(id("\xA9")));
  ASSERT_TRUE(matcher.accept(id("\":")));
  ASSERT_TRUE(matcher.accept(id("12")));
  EXPECT_FALSE(matcher.canEnd());
  ASSERT_TRUE(matcher.accept(id("}")));
  EXPECT_TRUE(matcher.canEnd());
  EXPECT_TRUE(matcher.finished());
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()));
  matcher.fillMask(mask);
  for (uint64_t word : mask) EXPECT_EQ(word, 0u);
}

// Nested repeats of the same text are ambiguous: the stacks multiply. The
// matcher's bounds stop the expansion (no deep recursion, no unbounded
// work) and say so instead of running on.
TEST(StructuredMatcher, AmbiguousNestedRepeatsAreBounded) {
  for (const char* pattern :
       {"((a?){300}){300}", "((.*){1000}){1000}", "((a{1,1000}){1,1000}){1,1000}", "(a|a)*b"}) {
    SCOPED_TRACE(pattern);
    StatusOr<Grammar> grammar = compileRegex(pattern);
    ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
    // Whatever the verdict, it comes back.
    (void)grammarAccepts(*grammar, std::string(100, 'a'));
    auto vocab = std::make_shared<Vocabulary>(testTokens(), 200);
    Matcher matcher(std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab));
    std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()));
    for (int step = 0; step < 20 && !matcher.overflowed(); ++step) {
      matcher.fillMask(mask);
      if (!matcher.accept(static_cast<TokenId>('a' - 0x20 + 1))) break;
    }
  }
  // An unambiguous nesting is followed to its end.
  StatusOr<Grammar> plain = compileRegex("(a{2}b){1,3}");
  ASSERT_TRUE(plain.isOk());
  EXPECT_TRUE(grammarAccepts(*plain, "aabaab"));
  EXPECT_FALSE(grammarAccepts(*plain, "aabaa"));
}

// A frontier of many stacks (nested optional repeats after a prefix): its
// mask follows the tokens that leave an element from the whole frontier at
// once, and still agrees with accepting each token, runs of 'a' of every
// length among them.
TEST(StructuredMatcher, MasksOfManyStacksAgreeWithAcceptingEachToken) {
  std::vector<std::string> tokens = testTokens();
  for (size_t n = 2; n <= 16; ++n) tokens.emplace_back(n, 'a');
  auto vocab = std::make_shared<Vocabulary>(tokens, static_cast<int64_t>(tokens.size()));
  StatusOr<Grammar> grammar = compileRegex("((a?){30}){((a?){30}){229}");
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  auto compiled = std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab);
  Matcher matcher(compiled);
  const std::string text = std::string(7, 'a') + "{" + std::string(40, 'a');
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()));
  for (size_t i = 0; i <= text.size(); ++i) {
    matcher.fillMask(mask);
    ASSERT_FALSE(matcher.overflowed()) << "after " << i << " bytes";
    int64_t allowed = 0;
    for (TokenId id = 0; id < vocab->size(); ++id) {
      Matcher probe = matcher;
      ASSERT_EQ(bit(mask, id), probe.accept(id))
          << "token '" << vocab->bytes(id) << "' after '" << text.substr(0, i) << "'";
      allowed += bit(mask, id);
    }
    EXPECT_GT(allowed, 0);
    if (i == text.size()) break;
    ASSERT_TRUE(matcher.accept(static_cast<TokenId>(text[i] - 0x20 + 1)));
  }
}

// Word-like tokens of 2 to 16 word characters, as a real vocabulary has.
std::shared_ptr<Vocabulary> wordVocabulary() {
  std::vector<std::string> tokens = testTokens();
  const std::string word_chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";
  std::mt19937 rng(11);
  for (int i = 0; i < 30000; ++i) {
    std::string word(2 + rng() % 15, 'a');
    for (char& c : word) c = word_chars[rng() % word_chars.size()];
    tokens.push_back(std::move(word));
  }
  return std::make_shared<Vocabulary>(tokens, static_cast<int64_t>(tokens.size()));
}

// A mask whose context checks would cost more than their budget is not
// computed: the matcher says it overflowed, allows nothing (an empty mask)
// and accepts nothing, so the request ends with an error rather than
// holding the engine's thread.
TEST(StructuredMatcher, AMaskPastItsBudgetOverflowsAndAllowsNothing) {
  const auto vocab = wordVocabulary();
  StatusOr<Grammar> grammar = compileRegex("((\\w?){20}){20}");
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  Matcher matcher(std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab));
  ASSERT_FALSE(matcher.overflowed()) << "the start fits its bounds";
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()), ~uint64_t{0});
  matcher.fillMask(mask);
  EXPECT_TRUE(matcher.overflowed());
  for (uint64_t word : mask) EXPECT_EQ(word, 0u);
  EXPECT_FALSE(matcher.accept(static_cast<TokenId>('a' - 0x20 + 1)));
}

// A request's masks along `text` (one byte a token), until one overflows.
std::vector<std::vector<uint64_t>> masksAlong(const std::shared_ptr<CompiledGrammar>& compiled,
                                              std::string_view text) {
  Matcher matcher(compiled);
  std::vector<std::vector<uint64_t>> masks;
  for (size_t i = 0; i <= text.size() && !matcher.overflowed(); ++i) {
    masks.emplace_back(static_cast<size_t>(compiled->vocabulary().maskWords()));
    matcher.fillMask(masks.back());
    if (i == text.size() || !matcher.accept(static_cast<TokenId>(text[i] - 0x20 + 1))) break;
  }
  return masks;
}

// Whether a mask fits its budget is the request's alone: the moves an
// earlier request with the same grammar memoized cost nothing to look up,
// but each is charged to a mask what computing it costs, so a request gets
// the same masks, and overflows at the same token, on a fresh grammar and
// after another request warmed it. (Charging only the work done, the
// second request of the 14- and 16-fold patterns got all its masks.)
TEST(StructuredMatcher, WhetherAMaskFitsItsBudgetIsTheRequestsAlone) {
  const auto vocab = wordVocabulary();
  const std::string text = "x" + std::string(12, 'a');
  for (int n : {12, 14, 16}) {
    const std::string pattern = "x((\\w?){" + std::to_string(n) + "}){" + std::to_string(n) + "}";
    SCOPED_TRACE(pattern);
    auto compile = [&] {
      StatusOr<Grammar> grammar = compileRegex(pattern);
      EXPECT_TRUE(grammar.isOk()) << grammar.status().message();
      return std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab);
    };
    const auto fresh = masksAlong(compile(), text);
    // 12-fold fits along the whole text; 14- and 16-fold pass the budget
    // at their second mask.
    ASSERT_EQ(fresh.size(), n == 12 ? text.size() + 1 : 2);
    const auto shared = compile();
    EXPECT_EQ(masksAlong(shared, text), fresh);
    EXPECT_EQ(masksAlong(shared, text), fresh) << "after a request warmed the grammar";
  }
}

// Stack nodes are interned for good within a generation, and requests of
// one grammar share it: distinct deep nestings (any JSON object, each
// request 20,000 arrays deep under its own prefix: ~480,000 nodes) would
// pass the 4,000,000-node bound after 8 requests, and from then on every
// request of that grammar would overflow at its first token. A request
// starts a new generation once the current one holds a million nodes, so
// every request follows its whole nesting.
TEST(StructuredMatcher, NoHistoryOfRequestsFillsTheStackBound) {
  auto vocab = std::make_shared<Vocabulary>(testTokens(), 200);
  StatusOr<Grammar> grammar = compileConstraint(Constraint{ConstraintKind::kJsonObject, ""});
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  auto compiled = std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab);
  const int64_t classified = compiled->stats().classified;
  auto token = [](char c) { return static_cast<TokenId>(c - 0x20 + 1); };
  for (int request = 0; request < 12; ++request) {
    SCOPED_TRACE(request);
    Matcher matcher(compiled);
    std::string text = "{\"a\":" + std::string(static_cast<size_t>(request), '[') + "{\"\":";
    text += std::string(20000, '[');
    for (char c : text) ASSERT_TRUE(matcher.accept(token(c))) << compiled->stats().nodes;
    std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()));
    matcher.fillMask(mask);
    EXPECT_FALSE(matcher.overflowed());
    EXPECT_TRUE(bit(mask, token(']')));
  }
  EXPECT_GT(compiled->stats().generations, 1);
  EXPECT_LE(compiled->stats().nodes, 2'000'000);
  // The counts add up over the generations (the classes are computed once).
  EXPECT_EQ(compiled->stats().classified, classified);
}

// The matcher's pass counters are 32 bits: across their wrap, a grammar
// gives the masks and moves of a fresh one (a stale stamp equal to the new
// pass would skip nodes and memoize wrong frontiers for every request).
TEST(StructuredMatcher, PassCountersWrapWithoutChangingAMask) {
  auto vocab = std::make_shared<Vocabulary>(testTokens(), 200);
  const std::string text = "{\"ab\":[1,{\"c\":\"z\"}],\"d\":12}";
  auto masksOf = [&](const std::shared_ptr<CompiledGrammar>& compiled) {
    Matcher matcher(compiled);
    std::vector<std::vector<uint64_t>> masks;
    for (size_t i = 0; i <= text.size(); ++i) {
      masks.emplace_back(static_cast<size_t>(vocab->maskWords()));
      matcher.fillMask(masks.back());
      if (i < text.size()) {
        EXPECT_TRUE(matcher.accept(static_cast<TokenId>(text[i] - 0x20 + 1)));
      }
    }
    return masks;
  };
  const auto fresh = masksOf(std::make_shared<CompiledGrammar>(jsonish(), vocab));
  auto wrapping = std::make_shared<CompiledGrammar>(jsonish(), vocab);
  wrapping->setEpochsForTest(0xFFFFFFFFu);  // the walk's first pass wraps
  EXPECT_EQ(masksOf(wrapping), fresh);
}

// Many optional repeats make a new frontier of up to a thousand tops at
// nearly every move (here 1.8 MB of frontiers over 120 tokens), and the
// memo was dropped only past a million frontiers, whatever their size. It
// is also dropped past its bound in bytes, between operations, and the
// masks are those of a memo never dropped.
TEST(StructuredMatcher, TheMemoStaysWithinItsBoundAndDroppingItChangesNoMask) {
  const auto vocab = std::make_shared<Vocabulary>(testTokens(), 200);
  const std::string text(120, 'a');
  auto masksOf = [&](const std::shared_ptr<CompiledGrammar>& compiled) {
    Matcher matcher(compiled);
    std::vector<std::vector<uint64_t>> masks;
    for (size_t i = 0; i <= text.size() && !matcher.overflowed(); ++i) {
      masks.emplace_back(static_cast<size_t>(vocab->maskWords()));
      matcher.fillMask(masks.back());
      if (i < text.size()) {
        EXPECT_TRUE(matcher.accept(static_cast<TokenId>(text[i] - 0x20 + 1)));
      }
    }
    return masks;
  };
  auto compile = [&] {
    StatusOr<Grammar> grammar = compileRegex("(\\w?){1000}");
    EXPECT_TRUE(grammar.isOk()) << grammar.status().message();
    return std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab);
  };
  const auto unbounded = compile();
  unbounded->setMemoBoundForTest(int64_t{1} << 40);
  const auto reference = masksOf(unbounded);
  ASSERT_EQ(reference.size(), text.size() + 1);
  const int64_t grown = unbounded->stats().memo_bytes;

  const auto bounded = compile();
  constexpr int64_t kBound = 200'000;
  bounded->setMemoBoundForTest(kBound);
  EXPECT_EQ(masksOf(bounded), reference);
  EXPECT_GT(grown, 2 * kBound) << "the walk must grow an unbounded memo past the bound";
  EXPECT_GT(bounded->stats().memo_trims, 0);
  // Checked between operations: at most one operation's growth past it.
  EXPECT_LT(bounded->stats().memo_bytes, grown);
}

TEST(StructuredMatcher, TrieHoldsEveryTokenWithBytesOnce) {
  const Vocabulary vocab(testTokens(), 130);
  std::vector<int> seen(static_cast<size_t>(vocab.size()), 0);
  for (const auto& node : vocab.trie()) {
    for (TokenId id : vocab.tokensAt(node)) ++seen[static_cast<size_t>(id)];
  }
  for (TokenId id = 0; id < vocab.size(); ++id) {
    EXPECT_EQ(seen[static_cast<size_t>(id)], vocab.inTrie(id) ? 1 : 0) << id;
  }
  EXPECT_FALSE(vocab.inTrie(0));
  EXPECT_EQ(vocab.maskWords(), 3);
}

// The cache is bounded by the grammars' memory as well as their count: a
// large enum's token classes take tens of MB, so a few distinct ones would
// fill the process. Past the bound the least recently used go; the newest
// stays whatever its size.
TEST(ConstraintCache, IsBoundedByTheGrammarsMemory) {
  auto vocab = wordVocabulary();
  auto enumOf = [](int seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    nlohmann::json values = nlohmann::json::array();
    for (int i = 0; i < 200; ++i) {
      std::string value(40, 'a');
      for (char& c : value) c = static_cast<char>('a' + rng() % 26);
      values.push_back(value);
    }
    return Constraint{ConstraintKind::kJsonSchema, nlohmann::json{{"enum", values}}.dump()};
  };
  ConstraintCache sizing(vocab);
  auto first = sizing.get(enumOf(0));
  ASSERT_TRUE(first.isOk()) << first.status().message();
  const int64_t one = sizing.bytes();
  EXPECT_EQ(one, (*first)->approxBytes());
  EXPECT_GT(one, 100'000) << "200 values of 40 bytes over 30,000 tokens";

  ConstraintCache cache(vocab, 64, one * 5 / 2);
  std::vector<std::shared_ptr<CompiledGrammar>> held;
  for (int seed = 0; seed < 5; ++seed) {
    auto grammar = cache.get(enumOf(seed));
    ASSERT_TRUE(grammar.isOk());
    held.push_back(*grammar);
    EXPECT_LE(cache.bytes(), one * 5 / 2);
    EXPECT_LE(cache.size(), 2u);
  }
  // The newest is there; the oldest was dropped (compiled anew, another object).
  EXPECT_EQ(*cache.get(enumOf(4)), held[4]);
  EXPECT_NE(*cache.get(enumOf(0)), held[0]);
  // A bound below one grammar keeps the newest alone.
  ConstraintCache tiny(vocab, 64, 1);
  ASSERT_TRUE(tiny.get(enumOf(1)).isOk());
  ASSERT_TRUE(tiny.get(enumOf(2)).isOk());
  EXPECT_EQ(tiny.size(), 1u);
}

// A grammar's requests grow what it holds (its memo of moves, its cached
// masks): the cache counts a grammar again when a request gets it, so its
// bound holds what the grammars hold now, not what they held compiled.
// Before, only the compiled size counted, and an agent's grammars outgrew
// the 512 MiB bound by their requests' memos.
TEST(ConstraintCache, CountsAGrammarAsItsRequestsGrewIt) {
  auto vocab = wordVocabulary();
  ConstraintCache cache(vocab);
  const Constraint constraint{ConstraintKind::kRegex, "[a-z]{1,12}( [a-z]{1,12}){0,30}"};
  auto grammar = cache.get(constraint);
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  const int64_t compiled = cache.bytes();
  EXPECT_EQ(compiled, (*grammar)->approxBytes());
  {
    Matcher matcher(*grammar);
    std::vector<uint64_t> mask(static_cast<size_t>(vocab->maskWords()));
    for (int step = 0; step < 40; ++step) {
      matcher.fillMask(mask);
      // The highest allowed token: a long word, then a space, and so on.
      TokenId pick = -1;
      for (size_t w = 0; w < mask.size(); ++w) {
        for (int b = 0; b < 64; ++b) {
          if ((mask[w] >> b) & 1) pick = static_cast<TokenId>(w * 64 + static_cast<size_t>(b));
        }
      }
      if (pick < 0) break;
      ASSERT_TRUE(matcher.accept(pick));
    }
  }
  const int64_t grown = (*grammar)->approxBytes();
  ASSERT_GT(grown, compiled) << "the request grew nothing: nothing was tested";
  ASSERT_TRUE(cache.get(constraint).isOk());
  EXPECT_EQ(cache.bytes(), grown);
}

// Classifying a large enum's elements builds a memo of hundreds of MB that
// the compiled grammar drops; what it keeps (its token classes, about
// approxBytes) must not pin the rest. Before, the classes were small
// vectors scattered over the memo's pages: after the memo was freed and the
// heap trimmed, a 1,000-value enum of 100-byte strings kept about 200 MB
// resident for its 9 MB of classes (the agent's RSS grew that much per
// schema).
#if defined(__GLIBC__)
int64_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

TEST(CompiledGrammar, ALargeEnumKeepsResidentNoMoreThanItsClasses) {
  auto vocab = wordVocabulary();
  nlohmann::json values = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i) values.push_back("v" + std::to_string(i) + std::string(96, 'z'));
  StatusOr<Grammar> grammar = compileJsonSchema(nlohmann::ordered_json{{"enum", values}});
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  ::malloc_trim(0);
  const int64_t before = residentBytes();
  auto compiled = std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocab);
  ::malloc_trim(0);
  const int64_t grown = residentBytes() - before;
  const int64_t kept = compiled->approxBytes();
  EXPECT_GT(compiled->stats().classified, 100'000);
  EXPECT_LT(grown, 2 * kept + (int64_t{16} << 20))
      << "resident grew " << grown << " bytes for " << kept << " bytes of classes";
}
#endif

}  // namespace
}  // namespace tandem::structured
