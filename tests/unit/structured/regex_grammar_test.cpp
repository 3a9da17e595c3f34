// Regular expressions compiled to grammars: each pattern accepts exactly the
// texts it matches as a whole (checked with the reference recognizer),
// json_string_safe keeps quotes, backslashes and control characters out,
// every refused construct is named with its offset, and patterns that make
// backtracking engines explode compile to small grammars.
#include "common/structured/regex_grammar.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/structured/matcher.h"

namespace tandem::structured {
namespace {

using namespace std::string_literals;

Grammar compiled(std::string_view pattern, const RegexOptions& options = {}) {
  StatusOr<Grammar> grammar = compileRegex(pattern, options);
  EXPECT_TRUE(grammar.isOk()) << pattern << ": " << grammar.status().message();
  if (!grammar.isOk()) return Grammar{};
  return std::move(grammar).value();
}

struct Case {
  std::string pattern;
  std::vector<std::string> matches;
  std::vector<std::string> rejects;
};

void expectCases(const std::vector<Case>& cases, const RegexOptions& options = {}) {
  for (const Case& c : cases) {
    const Grammar grammar = compiled(c.pattern, options);
    if (grammar.rule_alternatives.empty()) continue;  // already reported
    for (const std::string& text : c.matches) {
      EXPECT_TRUE(grammarAccepts(grammar, text))
          << "/" << c.pattern << "/ should match \"" << text << "\"";
    }
    for (const std::string& text : c.rejects) {
      EXPECT_FALSE(grammarAccepts(grammar, text))
          << "/" << c.pattern << "/ should not match \"" << text << "\"";
    }
  }
}

TEST(RegexGrammar, LiteralsAlternationAndGroups) {
  expectCases({
      {"abc", {"abc"}, {"", "ab", "abcd", "abd", "ABC"}},
      {"cat|dog|", {"cat", "dog", ""}, {"catdog", "ca", "c"}},
      {"()", {""}, {"a"}},
      {"a()b", {"ab"}, {"a", "a b"}},
      {"(ab)+", {"ab", "abab", "ababab"}, {"", "a", "aba", "ba"}},
      {"(?:ab|cd)*e", {"e", "abe", "cdabe"}, {"", "ace", "abcd"}},
      {"(?<year>\\d{4})-(?P<month>\\d{2})", {"2024-05"}, {"2024-5", "24-05", "2024_05"}},
      {"gr(a|e)y", {"gray", "grey"}, {"griy", "gry", "graey"}},
      {"(a|b(c|d(e|f)))g", {"ag", "bcg", "bdeg", "bdfg"}, {"bdg", "g", "abg"}},
      {"{abc}", {"{abc}"}, {"abc"}},
      {"a}", {"a}"}, {"a"}},
  });
}

TEST(RegexGrammar, Utf8LiteralsAndDot) {
  expectCases({
      {"héllo wörld", {"héllo wörld"}, {"hello world", "héllo"}},
      {"日本語", {"日本語"}, {"日本", "日本語語"}},
      {"é{2}", {"éé"}, {"é", "ééé", "\xC3\xA9\xA9"}},
      {"😀+", {"😀", "😀😀😀"}, {"", "\xF0\x9F\x98"}},
      // . is one character of any length except \n.
      {"a.c", {"abc", "a c", "a\tc", "aéc", "a€c", "a😀c", "a\"c"}, {"ac", "abbc", "a\nc"}},
      {".*", {"", "anything at all", "ünï€ødé 😀"}, {"two\nlines"}},
      // Half a character is not a character.
      {"a.", {"aé"}, {"a\xC3", "a\xA9"}},
  });
}

TEST(RegexGrammar, CharacterClasses) {
  expectCases({
      {"[a-c]+x", {"ax", "abcabcx"}, {"x", "dx", "abcd"}},
      {"[abc]", {"a", "b", "c"}, {"d", "ab", ""}},
      {"[^a]", {"b", "\n", "\"", "é", "€", "😀"}, {"a", "", "bb"}},
      {"[^é]", {"e", "ë", "a", "😀"}, {"é"}},
      {"[^a-zé]+", {"ABC", "123", "È"}, {"b", "é", "Aé"}},
      {"[α-ω]+", {"αβγ", "ω"}, {"abc", "Α", ""}},
      {"[😀-😂]", {"😀", "😁", "😂"}, {"😃", "a"}},
      {"[a\\-z]", {"a", "-", "z"}, {"b", "y"}},
      {"[-a]", {"-", "a"}, {"b"}},
      {"[a-]", {"-", "a"}, {"b"}},
      {"[\\]\\[]", {"]", "["}, {"\\"}},
      {"[\\d\\s]+", {"1 2", "\t9"}, {"a", "1a"}},
      {"[\\w.]+", {"a.b_C9"}, {"a-b", "é"}},
      {"[\\b]", {"\b"}, {"b", "\\"}},
      {"[^]", {"a", "\n", "😀"}, {"", "ab"}},
      {"[.*+?]", {".", "*", "+", "?"}, {"a"}},
      {"[\\u0400-\\u04FF]+", {"Привет"}, {"Hello"}},
  });
}

TEST(RegexGrammar, ClassEscapesHaveTheirAsciiMeanings) {
  expectCases({
      {"\\d+\\.\\d{2}", {"3.14", "100.00"}, {"3,14", "3.1", ".14", "٣.14"}},
      {"\\w+@\\w+\\.com", {"me_1@ex.com"}, {"me-1@ex.com", "é@ex.com"}},
      {"\\s", {" ", "\t", "\n", "\r", "\f", "\v"}, {"a", "", "\u00a0"}},
      {"\\D\\W\\S", {"a-b", "é é", "x\n!"}, {"1-b", "a_b", "a- "}},
  });
}

TEST(RegexGrammar, BoundedRepeatsAtTheirEdges) {
  expectCases({
      {"a{2,4}", {"aa", "aaa", "aaaa"}, {"", "a", "aaaaa"}},
      {"(ab){2,4}", {"abab", "ababababab"s.substr(0, 8)}, {"ab", "ababababab"}},
      {"[xy]{2,4}", {"xy", "yxy", "xyyx"}, {"x", "xyxyx"}},
      {"a{3}", {"aaa"}, {"aa", "aaaa"}},
      {"a{2,}", {"aa", "aaaaaaaaa"}, {"a", ""}},
      {"a{,2}", {"", "a", "aa"}, {"aaa"}},
      {"a{0}b", {"b"}, {"ab"}},
      {"a{0,0}", {""}, {"a"}},
      {"x?y*z+", {"z", "xz", "yyzz", "xyzzz"}, {"", "xx z", "xy", "xxz"}},
  });
}

TEST(RegexGrammar, LazyAndPossessiveSuffixesMatchTheSameText) {
  expectCases({
      {"a+?b", {"ab", "aaab"}, {"b", "aa"}},
      {"a*?", {"", "aaa"}, {"b"}},
      {"a{2,3}?", {"aa", "aaa"}, {"a", "aaaa"}},
      {"a??b", {"b", "ab"}, {"aab"}},
      {"a++b", {"ab", "aab"}, {"b"}},
      {"(ab)*+c", {"c", "ababc"}, {"abc c"}},
  });
}

TEST(RegexGrammar, AnchorsAtTheEndsAreAccepted) {
  expectCases({
      {"^abc$", {"abc"}, {"^abc$", "abc\n", "xabc"}},
      {"^abc", {"abc"}, {"abcd"}},
      {"abc$", {"abc"}, {"abc$"}},
      {"^a|^b$|c$", {"a", "b", "c"}, {"ab", "bc", ""}},
      {"^$", {""}, {"a"}},
  });
}

TEST(RegexGrammar, Escapes) {
  expectCases({
      {"\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\\\\\/\\-", {".*+?()[]{}|^$\\/-"}, {"a"}},
      {"\\x41\\u00e9\\u{1F600}\\x{20AC}", {"Aé😀€"}, {"A\xE9"}},
      {"\\uD83D\\uDE00", {"😀"}, {"\xED\xA0\xBD\xED\xB8\x80"}},
      {"\\n\\t\\r\\f\\v\\0", {"\n\t\r\f\v\0"s}, {"\\n\\t\\r\\f\\v\\0"}},
      {"a\\ b\\#", {"a b#"}, {"ab#"}},
      {"\\é", {"é"}, {"e"}},
  });
}

TEST(RegexGrammar, JsonStringSafeKeepsQuotesBackslashesAndControlsOut) {
  RegexOptions safe;
  safe.json_string_safe = true;
  expectCases(
      {
          {"[^a]", {"b", "é", "😀", "'", "/"}, {"a", "\"", "\\", "\n", "\x01"s, "\x1F", "\0"s}},
          {".", {"b", "é", "\x7F"}, {"\"", "\\", "\t", "\n"}},
          {"\\D+", {"ab"}, {"a\"b", "a\\b", "a\rb"}},
          {"\\s", {" "}, {"\t", "\n"}},
          {"[^]", {"x"}, {"\"", "\\"}},
          {"\\w+", {"word_9"}, {"\""}},
      },
      safe);
  // The same classes keep those characters without the option.
  const Grammar plain = compiled("[^a]");
  EXPECT_TRUE(grammarAccepts(plain, "\""));
  EXPECT_TRUE(grammarAccepts(plain, "\\"));
  EXPECT_TRUE(grammarAccepts(compiled("."), "\""));

  struct Refused {
    std::string pattern;
    std::string named;
  };
  for (const Refused& r : std::vector<Refused>{{"a\"b", "the character '\"' at offset 1"},
                                               {"a\\\\b", "the character '\\' at offset 1"},
                                               {"line\\n", "U+000A at offset 4"},
                                               {"x\\x00", "U+0000 at offset 1"},
                                               {"[\"\\\\]", "class at offset 0"},
                                               {"\\x22", "'\"' at offset 0"}}) {
    StatusOr<Grammar> grammar = compileRegex(r.pattern, safe);
    ASSERT_FALSE(grammar.isOk()) << r.pattern;
    EXPECT_EQ(grammar.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(grammar.status().message().find(r.named), std::string::npos)
        << r.pattern << ": " << grammar.status().message();
  }
  // Without the option the same literals are fine.
  EXPECT_TRUE(grammarAccepts(compiled("a\"b"), "a\"b"));
}

TEST(RegexGrammar, RefusedConstructsAreNamedWithTheirOffset) {
  struct Refused {
    std::string pattern;
    std::string named;
  };
  const std::vector<Refused> refused = {
      {"(a)\\1", "regex: backreference \\1 at offset 3 is not supported"},
      {"(a)\\k<x>", "backreference \\k at offset 3"},
      {"a(?=b)", "lookahead (?= at offset 1"},
      {"a(?!b)", "negative lookahead (?! at offset 1"},
      {"(?<=a)b", "lookbehind (?<= at offset 0"},
      {"(?<!a)b", "negative lookbehind (?<! at offset 0"},
      {"(?>a)", "atomic group (?> at offset 0"},
      {"\\bfoo", "word boundary \\b at offset 0"},
      {"foo\\B", "word boundary \\B at offset 3"},
      {"a^b", "anchor ^ at offset 1"},
      {"a$b", "anchor $ at offset 1"},
      {"(^a)", "anchor ^ at offset 1"},
      {"(a$)", "anchor $ at offset 2"},
      {"\\Aabc", "anchor \\A at offset 0"},
      {"(?i)abc", "inline flags (?i at offset 0"},
      {"a(?i:b)", "inline flags (?i at offset 1"},
      {"\\p{L}+", "unicode property class \\p{L} at offset 0"},
      {"x\\P{Lu}", "unicode property class \\P{Lu} at offset 1"},
      {"[[:alpha:]]", "POSIX class [:alpha:] at offset 1"},
      {"(ab", "group opened at offset 0 is never closed"},
      {"a(b(c)", "group opened at offset 1 is never closed"},
      {"ab)", "unmatched ) at offset 2"},
      {"[ab", "character class opened at offset 0 is never closed"},
      {"a]", "unmatched ] at offset 1"},
      {"*a", "quantifier * at offset 0 has nothing before it"},
      {"a|+b", "quantifier + at offset 2 has nothing before it"},
      {"(?:{2})", "quantifier { at offset 3 has nothing before it"},
      {"^*", "quantifier * at offset 1 has nothing before it"},
      {"a**", "quantifier * at offset 2 follows another quantifier"},
      {"a{2}{3}", "quantifier { at offset 4 follows another quantifier"},
      {"[]", "empty character class [] at offset 0"},
      {"[z-a]", "range z-a at offset 1 has its start above its end"},
      {"[é-a]", "range é-a at offset 1 has its start above its end"},
      {"[\\d-z]", "starts with a class escape"},
      {"[a-\\w]", "ends with a class escape"},
      {"a{1001}", "repeat count 1001 in {1001} at offset 1 is above the limit of 1000"},
      {"a{1,5000}", "repeat count 5000"},
      {"a{99999999999999999999}", "is above the limit of 1000"},
      {"a{3,2}", "repeat {3,2} at offset 1 has its minimum above its maximum"},
      {"a{1,x}", "malformed repeat count at offset 1"},
      {"a{,}", "malformed repeat count at offset 1"},
      {"\\q", "unknown escape \\q at offset 0"},
      {"\\01", "octal escape \\01 at offset 0"},
      {"\\x4", "\\x at offset 0 must be followed by two hex digits"},
      {"\\u{}", "\\u at offset 0 must be followed"},
      {"\\uD800", "\\uD800 at offset 0 is a lone UTF-16 surrogate"},
      {"\\u{110000}", "\\u{110000} at offset 0 is past U+10FFFF"},
      {"abc\\", "ends inside an escape"},
      {"ok\xFF", "invalid UTF-8 at offset 2"},
      {"\xC3\xA9\xC3", "invalid UTF-8 at offset 2"},
      {"(?P=name)", "named backreference (?P= at offset 0"},
      {"(?<1a>x)", "malformed group name at offset 0"},
      {"(?R)", "recursion (?R at offset 0"},
  };
  for (const Refused& r : refused) {
    StatusOr<Grammar> grammar = compileRegex(r.pattern);
    ASSERT_FALSE(grammar.isOk()) << r.pattern;
    EXPECT_EQ(grammar.status().code(), StatusCode::kInvalidArgument) << r.pattern;
    EXPECT_NE(grammar.status().message().find(r.named), std::string::npos)
        << r.pattern << " gave: " << grammar.status().message();
    EXPECT_EQ(grammar.status().message().rfind("regex: ", 0), 0u) << grammar.status().message();
  }
}

TEST(RegexGrammar, PatternAndRepeatLimitsComeFromTheOptions) {
  const std::string long_pattern(4097, 'a');
  StatusOr<Grammar> too_long = compileRegex(long_pattern);
  ASSERT_FALSE(too_long.isOk());
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("4097 bytes; at most 4096"), std::string::npos)
      << too_long.status().message();
  EXPECT_TRUE(grammarAccepts(compiled(long_pattern.substr(1)), long_pattern.substr(1)));

  RegexOptions options;
  options.max_repeat = 5;
  options.max_pattern_bytes = 10'000;
  EXPECT_TRUE(compileRegex(long_pattern, options).isOk());
  EXPECT_TRUE(compileRegex("a{5}", options).isOk());
  StatusOr<Grammar> refused = compileRegex("a{2,6}", options);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("repeat count 6 in {2,6} at offset 1 is above the "
                                            "limit of 5"),
            std::string::npos)
      << refused.status().message();
}

TEST(RegexGrammar, NestingDepthIsBounded) {
  const std::string deep = std::string(200, '(') + "a" + std::string(200, ')');
  EXPECT_TRUE(grammarAccepts(compiled(deep), "a"));
  const std::string deeper = std::string(201, '(') + "a" + std::string(201, ')');
  StatusOr<Grammar> grammar = compileRegex(deeper);
  ASSERT_FALSE(grammar.isOk());
  EXPECT_EQ(grammar.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(grammar.status().message().find("nested deeper than 200 levels at offset 200"),
            std::string::npos)
      << grammar.status().message();
}

TEST(RegexGrammar, CatastrophicPatternsCompileWithoutBacktracking) {
  // Exponential for a backtracking matcher on "aaaa...b"; here linear.
  expectCases({
      {"(a+)+$", {"a", "aaaa", std::string(200, 'a')}, {"", "aaab", std::string(200, 'a') + "b"}},
      {"(a|a)*b", {"b", "aab"}, {"aa", "aac"}},
      {"(a|aa)+c", {"ac", "aaaac"}, {"c", "aaaa"}},
      // Loops over items that can match "" (the builder refuses such loops
      // as left recursion unless they are rewritten).
      {"(.*)*", {"", "abc", "😀 x"}, {"a\nb"}},
      {"(a*)*b", {"b", "aab"}, {"aa", "ba"}},
      {"(a*)+", {"", "aaa"}, {"b"}},
      {"(a?){3,}", {"", "a", "aaaaa"}, {"b"}},
      {"(a|)+", {"", "aaa"}, {"ab"}},
      {"((a*)(b*))*", {"", "abba", "bbaa"}, {"abc"}},
      {"(()|a)*x", {"x", "aax"}, {"a"}},
      {"((a?b?)*c?)*", {"", "abcabcc", "cba"}, {"d"}},
      {"(a{0}){2,}", {""}, {"a"}},
  });
  // Nested bounded repeats: each level is lowered once, not multiplied out.
  for (std::string_view pattern : {"((a{1,1000}){1,1000}){1,1000}", "((a{1000}){1000}){1000}"}) {
    StatusOr<Grammar> grammar = compileRegex(pattern);
    if (!grammar.isOk()) {
      EXPECT_EQ(grammar.status().code(), StatusCode::kResourceExhausted)
          << pattern << ": " << grammar.status().message();
      continue;
    }
    EXPECT_FALSE(grammarAccepts(*grammar, "b")) << pattern;
    EXPECT_FALSE(grammarAccepts(*grammar, "aab")) << pattern;
  }
  StatusOr<Grammar> nested = compileRegex("((a{1,1000}){1,1000}){1,1000}");
  ASSERT_TRUE(nested.isOk()) << nested.status().message();
  EXPECT_TRUE(grammarAccepts(*nested, "a"));
  EXPECT_TRUE(grammarAccepts(*nested, std::string(12, 'a')));
  EXPECT_FALSE(grammarAccepts(*nested, ""));
}

TEST(RegexGrammar, GrammarsPastTheBuilderLimitsAreResourceExhausted) {
  GrammarLimits limits;
  limits.max_elements = 50;
  StatusOr<Grammar> grammar = compileRegex("a{100}", {}, limits);
  ASSERT_FALSE(grammar.isOk());
  EXPECT_EQ(grammar.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(grammar.status().message().rfind("regex: ", 0), 0u) << grammar.status().message();
  EXPECT_TRUE(compileRegex("a{10}", {}, limits).isOk());
}

TEST(RegexGrammar, AddRegexRuleJoinsALargerGrammar) {
  GrammarBuilder builder;
  const int32_t root = builder.declare("root");
  StatusOr<int32_t> number = addRegexRule(builder, "-?(0|[1-9]\\d*)", "number");
  ASSERT_TRUE(number.isOk()) << number.status().message();
  EXPECT_EQ(builder.name(*number), "number");
  builder.define(root, seq({literal("n="), ref(*number), literal(";")}));

  const int32_t rules_before = builder.numRules();
  StatusOr<int32_t> refused = addRegexRule(builder, "(?=x)", "bad");
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(builder.numRules(), rules_before);  // nothing added on error

  StatusOr<Grammar> grammar = builder.build(root);
  ASSERT_TRUE(grammar.isOk()) << grammar.status().message();
  EXPECT_TRUE(grammarAccepts(*grammar, "n=0;"));
  EXPECT_TRUE(grammarAccepts(*grammar, "n=-120;"));
  EXPECT_FALSE(grammarAccepts(*grammar, "n=012;"));
  EXPECT_FALSE(grammarAccepts(*grammar, "n=;"));
  EXPECT_FALSE(grammarAccepts(*grammar, "-12"));
}

}  // namespace
}  // namespace tandem::structured

namespace tandem::structured {
namespace {

// JSON Schema patterns are ECMAScript's: \s takes JavaScript's white space
// (no-break space, line and paragraph separators, the BOM, ...) and `.`
// leaves out every line terminator; PCRE's ASCII meanings otherwise.
TEST(RegexGrammar, EcmascriptWhiteSpaceAndDot) {
  RegexOptions ecmascript;
  ecmascript.ecmascript = true;
  const std::string nbsp = "\xC2\xA0", line_separator = "\xE2\x80\xA8", bom = "\xEF\xBB\xBF";
  StatusOr<Grammar> not_space = compileRegex("\\S", ecmascript);
  StatusOr<Grammar> space = compileRegex("\\s", ecmascript);
  StatusOr<Grammar> dot = compileRegex(".", ecmascript);
  ASSERT_TRUE(not_space.isOk() && space.isOk() && dot.isOk());
  for (const std::string& blank : {nbsp, line_separator, bom, std::string("\t")}) {
    EXPECT_FALSE(grammarAccepts(*not_space, blank));
    EXPECT_TRUE(grammarAccepts(*space, blank));
  }
  EXPECT_TRUE(grammarAccepts(*not_space, "x"));
  for (const std::string& terminator : {std::string("\n"), std::string("\r"), line_separator}) {
    EXPECT_FALSE(grammarAccepts(*dot, terminator));
  }
  EXPECT_TRUE(grammarAccepts(*dot, nbsp));
  // PCRE's: a no-break space is not white space, \r is any character.
  StatusOr<Grammar> pcre_not_space = compileRegex("\\S");
  StatusOr<Grammar> pcre_dot = compileRegex(".");
  ASSERT_TRUE(pcre_not_space.isOk() && pcre_dot.isOk());
  EXPECT_TRUE(grammarAccepts(*pcre_not_space, nbsp));
  EXPECT_TRUE(grammarAccepts(*pcre_dot, "\r"));
}

}  // namespace
}  // namespace tandem::structured
