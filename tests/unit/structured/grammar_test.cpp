#include "common/structured/grammar.h"

#include <gtest/gtest.h>

#include "common/structured/constraint.h"
#include "common/structured/matcher.h"
#include "common/structured/utf8.h"

namespace tandem::structured {
namespace {

std::string utf8(uint32_t cp) {
  std::string out;
  internal::appendUtf8(cp, out);
  return out;
}

Grammar single(Expr body) {
  GrammarBuilder builder;
  const int32_t root = builder.add("root", std::move(body));
  StatusOr<Grammar> grammar = builder.build(root);
  EXPECT_TRUE(grammar.isOk()) << grammar.status().message();
  return std::move(grammar).value();
}

TEST(StructuredGrammar, CodePointClassAcceptsExactlyItsCharacters) {
  // Ranges crossing every UTF-8 length boundary and the surrogates.
  const CodePointRanges ranges = {{0x41, 0x5A},     {0x7E, 0x81},      {0x7F0, 0x812},
                                  {0xD7F0, 0xE010}, {0xFFF0, 0x10010}, {0x10FFF0, 0x10FFFF}};
  const Grammar g = single(codePoints(ranges));
  const CodePointRanges normal = normalizeRanges(ranges);
  auto inside = [&](uint32_t cp) {
    for (auto [lo, hi] : normal) {
      if (cp >= lo && cp <= hi) return true;
    }
    return false;
  };
  for (uint32_t cp :
       {0x40u,   0x41u,    0x5Au,    0x5Bu,    0x7Du,     0x7Eu,     0x7Fu,    0x80u,
        0x81u,   0x82u,    0x7EFu,   0x7F0u,   0x7FFu,    0x800u,    0x812u,   0x813u,
        0xD7EFu, 0xD7F0u,  0xD7FFu,  0xE000u,  0xE010u,   0xE011u,   0xFFEFu,  0xFFF0u,
        0xFFFFu, 0x10000u, 0x10010u, 0x10011u, 0x10FFEFu, 0x10FFF0u, 0x10FFFFu}) {
    EXPECT_EQ(grammarAccepts(g, utf8(cp)), inside(cp)) << std::hex << cp;
  }
  // Surrogates are never encoded, even when a range spans them.
  EXPECT_FALSE(inside(0xD800));
  EXPECT_FALSE(grammarAccepts(g, "\xED\xA0\x80"));
  // Never half a character, never two.
  EXPECT_FALSE(grammarAccepts(g, "\xDF"));
  EXPECT_FALSE(grammarAccepts(g, "AA"));
}

TEST(StructuredGrammar, EveryTwoByteCharacterOfAComplementIsAccepted) {
  const Grammar g = single(codePoints(complementRanges({{0, 0x7F}, {0x100, 0x10FFFF}})));
  for (uint32_t cp = 0; cp < 0x800; ++cp) {
    EXPECT_EQ(grammarAccepts(g, utf8(cp)), cp >= 0x80 && cp < 0x100) << cp;
  }
}

TEST(StructuredGrammar, RepetitionBounds) {
  const Grammar g = single(repeat(literal("ab"), 2, 4));
  EXPECT_FALSE(grammarAccepts(g, "ab"));
  EXPECT_TRUE(grammarAccepts(g, "abab"));
  EXPECT_TRUE(grammarAccepts(g, "abababab"));
  EXPECT_FALSE(grammarAccepts(g, "ababababab"));
  EXPECT_FALSE(grammarAccepts(g, "aba"));
  const Grammar open = single(seq({literal("x"), star(bytes(ByteSet::range('0', '9')))}));
  EXPECT_TRUE(grammarAccepts(open, "x"));
  EXPECT_TRUE(grammarAccepts(open, "x" + std::string(5000, '7')));
  EXPECT_FALSE(grammarAccepts(open, "x7a"));
}

TEST(StructuredGrammar, AlternativesAndRecursion) {
  // list ::= "[" (item ("," item)*)? "]" ; item ::= [0-9] | list
  GrammarBuilder b;
  const int32_t list = b.declare("list");
  const int32_t item = b.add("item", alt({bytes(ByteSet::range('0', '9')), ref(list)}));
  b.define(list,
           seq({literal("["), optional(seq({ref(item), star(seq({literal(","), ref(item)}))})),
                literal("]")}));
  StatusOr<Grammar> g = b.build(list);
  ASSERT_TRUE(g.isOk()) << g.status().message();
  for (const char* ok : {"[]", "[1]", "[1,[2,[]],3]", "[[[[]]]]"})
    EXPECT_TRUE(grammarAccepts(*g, ok)) << ok;
  for (const char* bad : {"", "[", "[1,]", "[,1]", "[12]", "[1]]"}) {
    EXPECT_FALSE(grammarAccepts(*g, bad)) << bad;
  }
  EXPECT_NE(g->describe().find("list ::= [[]"), std::string::npos) << g->describe();
}

// A constraint after a reasoning model's "</think>": free text first (it
// may hold "<think>" and "<" but never "</think>"), then up to 4 bytes of
// white space, then the constraint, whole; the output may also end while
// still reasoning (as vLLM's, whose grammar starts when the reasoning ends).
TEST(StructuredGrammar, AConstraintAfterTheReasoningStartsAtItsEnd) {
  Constraint constraint{ConstraintKind::kJsonSchema,
                        R"({"type":"object","properties":{"a":{"type":"integer"}},)"
                        R"("required":["a"],"additionalProperties":false})",
                        "</think>"};
  StatusOr<Grammar> g = compileConstraint(constraint);
  ASSERT_TRUE(g.isOk()) << g.status().message();
  for (const char* ok : {"</think>{\"a\":1}", "<think>hmm < x </thin</think>\n\n{\"a\":12}",
                         "still thinking", "", "a</think>  \n\t{\"a\":3}"}) {
    EXPECT_TRUE(grammarAccepts(*g, ok)) << ok;
  }
  for (const char* bad : {"</think>{\"a\":\"x\"}", "</think>{\"a\":1}</think>", "</think>",
                          "</think>     {\"a\":1}", "x</think>text"}) {
    EXPECT_FALSE(grammarAccepts(*g, bad)) << bad;
  }
  // Without `after`, the schema from the first byte.
  constraint.after.clear();
  StatusOr<Grammar> plain = compileConstraint(constraint);
  ASSERT_TRUE(plain.isOk());
  EXPECT_TRUE(grammarAccepts(*plain, "{\"a\":1}"));
  EXPECT_FALSE(grammarAccepts(*plain, "</think>{\"a\":1}"));
}

TEST(StructuredGrammar, RefusesLeftRecursionNamingTheRule) {
  GrammarBuilder b;
  const int32_t expr = b.declare("expr");
  const int32_t empty = b.add("maybe", optional(literal("-")));
  b.define(expr, alt({seq({ref(empty), ref(expr), literal("+1")}), literal("1")}));
  StatusOr<Grammar> g = b.build(expr);
  ASSERT_FALSE(g.isOk());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("\"expr\" is left-recursive"), std::string::npos)
      << g.status().message();
}

TEST(StructuredGrammar, LoopsOverItemsThatMatchNothingAreNotLeftRecursion) {
  // ("a"?)* and a cycle of references in tail position end their expansion.
  const Grammar g = single(star(optional(literal("a"))));
  for (const char* ok : {"", "a", "aaaa"}) EXPECT_TRUE(grammarAccepts(g, ok)) << ok;
  EXPECT_FALSE(grammarAccepts(g, "ab"));
  GrammarBuilder b;
  const int32_t x = b.declare("x");
  const int32_t y = b.add("y", alt({ref(x), literal("y")}));
  b.define(x, alt({ref(y), seq({literal("x"), ref(x)})}));
  StatusOr<Grammar> cycle = b.build(x);
  ASSERT_TRUE(cycle.isOk()) << cycle.status().message();
  EXPECT_TRUE(grammarAccepts(*cycle, "xxy"));
  EXPECT_FALSE(grammarAccepts(*cycle, "xx"));
}

TEST(StructuredGrammar, RefusesARootThatNeverFinishes) {
  GrammarBuilder b;
  const int32_t a = b.declare("a");
  const int32_t c = b.add("c", seq({literal("x"), ref(a)}));
  b.define(a, ref(c));
  StatusOr<Grammar> g = b.build(a);
  ASSERT_FALSE(g.isOk());
  EXPECT_NE(g.status().message().find("rule \"a\" matches no finite text"), std::string::npos)
      << g.status().message();
}

TEST(StructuredGrammar, RefusesUndefinedRulesAndOversizedGrammars) {
  GrammarBuilder b;
  const int32_t missing = b.declare("term");
  const int32_t root = b.add("root", ref(missing));
  StatusOr<Grammar> g = b.build(root);
  ASSERT_FALSE(g.isOk());
  EXPECT_NE(g.status().message().find("rule \"term\" is used but never defined"),
            std::string::npos);

  GrammarBuilder big;
  const int32_t nested = big.add("root", repeat(literal("a"), 20'000));
  GrammarLimits limits;
  limits.max_elements = 10'000;
  StatusOr<Grammar> large = big.build(nested, limits);
  ASSERT_FALSE(large.isOk());
  EXPECT_EQ(large.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(large.status().message().find("10000"), std::string::npos) << large.status().message();
  // Bounded repeats of repeats stay linear: a chain of rules, no copies.
  GrammarBuilder chain;
  const int32_t r = chain.add("root", repeat(repeat(literal("a"), 1, 1000), 1, 1000));
  EXPECT_TRUE(chain.build(r).isOk());
}

}  // namespace
}  // namespace tandem::structured
