// GBNF grammars compiled to grammars: small real grammars (arithmetic, a
// SQL subset) accept and refuse what they should, every syntax element
// (comments, multi-line rules, escapes, classes, quantifiers) means what
// llama.cpp's format says, and every error names where and what.
#include "common/structured/gbnf.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/structured/matcher.h"

namespace tandem::structured {
namespace {

using namespace std::string_literals;

Grammar compiled(std::string_view text) {
  StatusOr<Grammar> grammar = compileGbnf(text);
  EXPECT_TRUE(grammar.isOk()) << grammar.status().message() << "\n" << text;
  if (!grammar.isOk()) return Grammar{};
  return std::move(grammar).value();
}

void expectLanguage(std::string_view text, const std::vector<std::string>& accepted,
                    const std::vector<std::string>& refused) {
  const Grammar grammar = compiled(text);
  if (grammar.rule_alternatives.empty()) return;  // already reported
  for (const std::string& s : accepted) {
    EXPECT_TRUE(grammarAccepts(grammar, s)) << "should accept \"" << s << "\"\n" << text;
  }
  for (const std::string& s : refused) {
    EXPECT_FALSE(grammarAccepts(grammar, s)) << "should refuse \"" << s << "\"\n" << text;
  }
}

// The message of the InvalidArgument that `text` is refused with.
std::string refusal(std::string_view text) {
  StatusOr<Grammar> grammar = compileGbnf(text);
  EXPECT_FALSE(grammar.isOk()) << text;
  if (grammar.isOk()) return "";
  EXPECT_EQ(grammar.status().code(), StatusCode::kInvalidArgument) << grammar.status().message();
  EXPECT_EQ(grammar.status().message().rfind("grammar: ", 0), 0u) << grammar.status().message();
  return grammar.status().message();
}

TEST(Gbnf, ArithmeticGrammarInRightRecursiveForm) {
  expectLanguage(R"gbnf(
root   ::= expr
expr   ::= term ("+" expr | "-" expr)?
term   ::= factor ("*" term | "/" term)?
factor ::= number | "(" expr ")"
number ::= [0-9]+
)gbnf",
                 {"1+2*(3-4)", "42", "(1)", "1*2*3", "((7))/8-9", "10-(2+3)*4"},
                 {"1+*2", "", "(1", "1+", "a", "1 + 2", "()", "1)"});
}

TEST(Gbnf, SqlSubset) {
  expectLanguage(R"gbnf(
root    ::= "SELECT " columns " FROM " ident where? ";"
columns ::= "*" | ident (", " ident)*
where   ::= " WHERE " ident " = " number
ident   ::= [a-z_] [a-z0-9_]*
number  ::= "-"? [0-9]+
)gbnf",
                 {"SELECT * FROM users;", "SELECT id, name FROM users WHERE id = 42;",
                  "SELECT a FROM t_1 WHERE b = -7;"},
                 {"SELECT FROM users;", "SELECT id FROM users WHERE id = abc;",
                  "SELECT id FROM users", "select id from users;", "SELECT *, id FROM t;",
                  "SELECT id FROM 1users;", "SELECT id FROM users WHERE id = ;"});
}

TEST(Gbnf, CommentsAndRulesSpanningLines) {
  expectLanguage(R"gbnf(# a greeting grammar
root ::= greeting   # the first word
  " " name          # rules continue until the next "name ::="
greeting ::= "hello"
  | "hi"
name ::=
  [A-Z]
  [a-z]*
)gbnf",
                 {"hello Bob", "hi X", "hello Alexandra"}, {"hey Bob", "hello bob", "hello", "hi"});
  // A # inside a string or class is a character, not a comment.
  expectLanguage("root ::= \"#\" [#] # comment \"x\"\n", {"##"}, {"##x", "#"});
  // Names may use letters, digits, - and _; the start rule can come last.
  expectLanguage("my-rule_2 ::= \"a\"\nroot ::= my-rule_2 my-rule_2", {"aa"}, {"a"});
}

TEST(Gbnf, StringEscapesNameCodePoints) {
  expectLanguage(R"gbnf(root ::= "\x41\u00e9\U0001F600\n\t\"\\" [\x30-\x39] "\r\[\]")gbnf",
                 {"Aé😀\n\t\"\\5\r[]"}, {"Aé😀\n\t\"\\a\r[]", "A"});
  // \xHH is a code point (as llama.cpp reads it), so \xFF is ÿ in UTF-8.
  expectLanguage(R"gbnf(root ::= "\xFF")gbnf", {"ÿ"}, {"\xFF"});
  expectLanguage("root ::= \"日本\" \"😀\"", {"日本😀"}, {"日本"});
}

TEST(Gbnf, CharacterClasses) {
  expectLanguage(R"gbnf(root ::= "\"" [^"\\\n]* "\"")gbnf", {"\"\"", "\"abc é 😀\""},
                 {"\"a\"b\"", "\"a\nb\"", "\"a\\b\"", "\"abc"});
  expectLanguage("root ::= [^é]", {"e", "ë", "😀", "\n"}, {"é", ""});
  expectLanguage("root ::= [α-ωA-Z_]+", {"αβ", "Q_ω"}, {"a", "Α"});
  expectLanguage("root ::= [-a] [a-] [\\]\\-]", {"--]", "aa-"}, {"bb]"});
  expectLanguage("root ::= [^]", {"a", "\n"}, {""});
  expectLanguage("root ::= \"<\" . \">\"", {"<a>", "<\n>", "<😀>"}, {"<>", "<ab>"});
}

TEST(Gbnf, Quantifiers) {
  expectLanguage("root ::= \"a\"{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa", ""});
  expectLanguage("root ::= \"a\"{3} \"b\"{2,} \"c\"{0,1}", {"aaabb", "aaabbbbc"},
                 {"aabb", "aaab", "aaabbcc"});
  expectLanguage("root ::= \"x\"? \"y\"+ \"z\"*", {"y", "xyy", "yzzz"}, {"", "x", "xxy", "z"});
  expectLanguage("root ::= (\"ab\" | \"c\")* \"d\"", {"d", "abcabd"}, {"abab", "ad"});
  expectLanguage("root ::= \"a\" { 1 , 2 }", {"a", "aa"}, {"aaa"});
  expectLanguage("root ::= [0-9] *", {"", "123"}, {"a"});
}

TEST(Gbnf, RepeatingWhatCanBeEmptyIsAccepted) {
  // Loops whose item can match "" would be left-recursive once lowered.
  expectLanguage("root ::= (\"a\"?)*", {"", "a", "aaa"}, {"b"});
  expectLanguage("root ::= item* \"!\"\nitem ::= \"a\"? \"b\"?", {"!", "abba!", "ba!"},
                 {"c!", "ab"});
  expectLanguage(R"gbnf(
root ::= (ws value)+ ws
ws ::= [ ]*
value ::= opt | "x"
opt ::= "y"?
)gbnf",
                 {"", " x y ", "xyyx"}, {"z"});
}

TEST(Gbnf, SyntaxErrorsNameLineColumnAndWhatWasExpected) {
  struct Refused {
    std::string text;
    std::string message;
  };
  const std::vector<Refused> refused = {
      {"root ::= expr\n\nexpr = \"a\"",
       "grammar: line 3, column 6: expected ::= after rule name \"expr\""},
      {"root = \"a\"", "grammar: line 1, column 6: expected ::= after rule name \"root\""},
      {"root ::= \"abc\n", "grammar: line 1, column 10: unterminated string"},
      {"root ::= \"abc", "line 1, column 10: unterminated string"},
      {"root ::= [abc\n", "line 1, column 10: unterminated character class"},
      {"root ::= ( \"a\" ",
       "line 1, column 16: expected ) to close the group opened at line 1, "
       "column 10"},
      {"root ::= \"a\" )", "line 1, column 14: unmatched )"},
      {"root ::= * \"a\"", "line 1, column 10: quantifier * has nothing before it"},
      {"root ::= \"a\"**", "line 1, column 14: quantifier * follows another quantifier"},
      {"root ::= \"a\"{2", "line 1, column 13: malformed repetition"},
      {"root ::= \"a\"{3,2}", "line 1, column 13: repetition {3,2} has its minimum above"},
      {"root ::= []", "line 1, column 10: empty character class"},
      {"root ::= [z-a]", "line 1, column 11: range z-a has its start above its end"},
      {"root ::= \"\\q\"", "line 1, column 11: unknown escape \\q; the accepted escapes are"},
      {"root ::= \"\\x4\"", "line 1, column 11: \\x must be followed by 2 hex digits"},
      {"root ::= \"\\uD800\"", "\\uD800 is not a Unicode character"},
      {"root ::= \"\\U00110000\"", "\\U00110000 is not a Unicode character"},
      {"root ::= \"é\" @", "line 1, column 14: expected a rule name, a string"},
      {"::= \"a\"", "line 1, column 1: expected a rule name"},
      {"root ::= \"a\"\n  \xFF", "line 2, column 3: invalid UTF-8"},
      {"root ::= \"é\"\n x ::= \"b\" \nroot ::= \"c\"",
       "grammar: line 3, column 1: rule \"root\" is defined twice (first at line 1, column 1)"},
      {"root ::= term",
       "grammar: rule \"term\" is used but never defined (first used at line 1, "
       "column 10)"},
      {"expr ::= \"a\"", "grammar: no rule named root"},
      {"", "grammar: no rule named root"},
  };
  for (const Refused& r : refused) {
    const std::string message = refusal(r.text);
    EXPECT_NE(message.find(r.message), std::string::npos)
        << "for:\n"
        << r.text << "\nexpected: " << r.message << "\ngot: " << message;
  }
}

TEST(Gbnf, LeftRecursionIsRefusedNamingTheRule) {
  const std::string message = refusal(R"gbnf(
root ::= expr
expr ::= expr "+" term | term
term ::= [0-9]
)gbnf");
  EXPECT_NE(message.find("\"expr\""), std::string::npos) << message;
  EXPECT_NE(message.find("left-recursive"), std::string::npos) << message;
  // Through another rule and through a rule that can be empty.
  const std::string indirect = refusal("root ::= a\na ::= b \"x\"\nb ::= \"y\"? a");
  EXPECT_NE(indirect.find("left-recursive"), std::string::npos) << indirect;
  EXPECT_TRUE(indirect.find("\"a\"") != std::string::npos ||
              indirect.find("\"b\"") != std::string::npos)
      << indirect;
}

TEST(Gbnf, SizeLimits) {
  std::string large = "root ::= \"";
  large += std::string(kMaxGbnfBytes, 'a');
  large += "\"";
  const std::string message = refusal(large);
  EXPECT_NE(message.find("at most 65536"), std::string::npos) << message;

  GrammarLimits limits;
  limits.max_elements = 100;
  StatusOr<Grammar> grammar = compileGbnf("root ::= \"a\"{500}", limits);
  ASSERT_FALSE(grammar.isOk());
  EXPECT_EQ(grammar.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(grammar.status().message().rfind("grammar: ", 0), 0u) << grammar.status().message();

  const std::string deep = "root ::= " + std::string(201, '(') + "\"a\"" + std::string(201, ')');
  EXPECT_NE(refusal(deep).find("nested deeper than 200"), std::string::npos);
}

}  // namespace
}  // namespace tandem::structured
