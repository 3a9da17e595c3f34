// Lexer tests: whitespace control as Jinja does it with trim_blocks and lstrip_blocks, raw blocks,
// newline normalization, and token-level behaviour. Expected outputs were produced by Python
// jinja2 3.1.6 with the Hugging Face settings (sandboxed, trim_blocks, lstrip_blocks,
// loopcontrols).
#include "common/jinja/lexer.h"

#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

const RenderCase kWhitespace[] = {
    {R"J(a
{% if true %}
  b
{% endif %}
c
)J",
     R"J({})J", true, false,
     R"J(a
  b
c)J"},
    {R"J(  {% if true %}x{% endif %}  
)J",
     R"J({})J", true, false, R"J(x  )J"},
    {R"J(a  {%- if true -%}  b  {%- endif -%}  c)J", R"J({})J", true, false, R"J(abc)J"},
    {R"J(a
  {{ 1 }}
  {{- 2 -}}
  c)J",
     R"J({})J", true, false,
     R"J(a
  12c)J"},
    {R"J({% for i in [1,2] %}
  {{ i }}
{% endfor %}
)J",
     R"J({})J", true, false,
     R"J(  1
  2
)J"},
    {R"J(a {# comment #} b
  {# c2 #}
d)J",
     R"J({})J", true, false,
     R"J(a  b
d)J"},
    {R"J(x  {%+ if true %}y{% endif +%}
z)J",
     R"J({})J", true, false,
     R"J(x  y
z)J"},
    {R"J({% raw %}{{ not parsed }}{% endraw %}
after)J",
     R"J({})J", true, false, R"J({{ not parsed }}after)J"},
    {R"J(line1
line2
{% if true %}
x
{% endif %}
)J",
     R"J({})J", true, false,
     R"J(line1
line2
x
)J"},
    {R"J(keep

)J",
     R"J({})J", true, false,
     R"J(keep
)J"},
    {R"J({{ 'a' }}
{{ 'b' }}
)J",
     R"J({})J", true, false,
     R"J(a
b)J"},
    {R"J(	{% set x = 1 %}
{{ x }})J",
     R"J({})J", true, false, R"J(1)J"},
    {R"J({{- '  x  ' -}})J", R"J({})J", true, false, R"J(  x  )J"},
};

TEST(JinjaLexer, WhitespaceMatchesPythonJinja) {
  for (const auto& c : kWhitespace) expectCase(c);
}

TEST(JinjaLexer, TokenizesTagsAndLiterals) {
  auto tokens = tokenize("a{{ x.y[0] | f(1.5, 'q\\n') }}b{% if not z %}");
  std::vector<std::string> texts;
  for (const auto& t : tokens) texts.push_back(t.text);
  std::vector<std::string> want = {"a", "",  "x",  ".",   "y", "[",   "0", "]",
                                   "|", "f", "(",  "1.5", ",", "q\n", ")", "",
                                   "b", "",  "if", "not", "z", "",    ""};
  EXPECT_EQ(texts, want);
  EXPECT_EQ(tokens.front().type, TokenType::kText);
  EXPECT_EQ(tokens[6].type, TokenType::kInt);
  EXPECT_EQ(tokens[11].type, TokenType::kFloat);
  EXPECT_DOUBLE_EQ(tokens[11].float_value, 1.5);
  EXPECT_EQ(tokens[13].type, TokenType::kString);
  EXPECT_EQ(tokens.back().type, TokenType::kEnd);
}

TEST(JinjaLexer, BracesInsideAnExpressionDoNotEndIt) {
  auto result = renderSource("{{ {'a': {'b': 1}} }}");
  ASSERT_TRUE(std::holds_alternative<std::string>(result));
  EXPECT_EQ(std::get<std::string>(result), "{'a': {'b': 1}}");
}

TEST(JinjaLexer, TracksLineNumbers) {
  auto tokens = tokenize("a\nb\n{{ x }}\n\n{% if y %}");
  for (const auto& t : tokens) {
    if (t.type == TokenType::kName && t.text == "x") {
      EXPECT_EQ(t.line, 3);
    }
    if (t.type == TokenType::kName && t.text == "y") {
      EXPECT_EQ(t.line, 5);
    }
  }
}

TEST(JinjaLexer, UnterminatedTagsAreSyntaxErrors) {
  EXPECT_THROW(tokenize("{{ x "), SyntaxFailure);
  EXPECT_THROW(tokenize("{% if x"), SyntaxFailure);
  EXPECT_THROW(tokenize("{# never closed"), SyntaxFailure);
  EXPECT_THROW(tokenize("{{ 'open }}"), SyntaxFailure);
  EXPECT_THROW(tokenize("{% raw %}no end"), SyntaxFailure);
  EXPECT_THROW(tokenize("{{ x $ y }}"), SyntaxFailure);
}

}  // namespace
}  // namespace tandem::jinja::testing
