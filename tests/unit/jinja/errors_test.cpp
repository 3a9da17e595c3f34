// Error tests: syntax errors with their line numbers, runtime type errors, undefined values used,
// the sandbox's refusal of mutating methods, raise_exception, and statements that would load other
// templates. Expected outputs were produced by Python jinja2 3.1.6 with the Hugging Face settings
// (sandboxed, trim_blocks, lstrip_blocks, loopcontrols).
#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

const RenderCase kErrors[] = {
    {R"J({% macro outer() %}({{ caller() }}){% endmacro %}{% macro inner() %}[{% call outer() %}{{ caller() }}{% endcall %}]{% endmacro %}{% call inner() %}deep{% endcall %})J",
     R"J({})J", false, false, R"J()J"},
    {R"J({% macro m() %}{{ caller() }}{% endmacro %}{{ m() }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ 'a' + [1] }})J", R"J({})J", false, false, R"J()J"},
    {R"J({% for x in none %}{% endfor %})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ 'a' in none }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ none | length }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ x.y.z }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ n.split(',') }})J", R"J({"n": null})J", false, false, R"J()J"},
    {R"J({{ [1].append(2) }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ raise_exception('custom message') }})J", R"J({})J", false, true, R"J(custom message)J"},
    {R"J({{ 1 / 0 }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ 1 - 'a' }})J", R"J({})J", false, false, R"J()J"},
    {R"J({{ undefined_fn() }})J", R"J({})J", false, false, R"J()J"},
};

TEST(JinjaErrors, RuntimeErrorsFailLikePythonJinja) {
  for (const auto& c : kErrors) expectCase(c);
}

TemplateError parseError(const std::string& source) {
  auto parsed = Template::parse(source);
  if (auto* error = std::get_if<TemplateError>(&parsed)) return *error;
  ADD_FAILURE() << "expected a parse error for: " << source;
  return {};
}

TemplateError renderError(const std::string& source,
                          const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  auto result = renderSource(source, vars);
  if (auto* error = std::get_if<TemplateError>(&result)) return *error;
  ADD_FAILURE() << "expected a render error for: " << source;
  return {};
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  TemplateError e = parseError("line one\n{% if x %}\nthree\n{% endfor %}");
  EXPECT_EQ(e.line, 4);
  EXPECT_NE(e.message.find("endfor"), std::string::npos) << e.message;

  e = parseError("a\nb\n{{ 1 + }}");
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ(e.describe().rfind("line 3: ", 0), 0u) << e.describe();

  e = parseError("{% if x %}never closed");
  EXPECT_NE(e.message.find("endif"), std::string::npos) << e.message;

  e = parseError("\n\n{% frobnicate %}");
  EXPECT_EQ(e.line, 3);
  EXPECT_NE(e.message.find("frobnicate"), std::string::npos) << e.message;

  e = parseError("{% break %}");
  EXPECT_NE(e.message.find("outside of a for loop"), std::string::npos) << e.message;
}

TEST(JinjaErrors, StatementsLoadingTemplatesAreRefused) {
  for (const char* tag : {"include", "import", "extends", "from", "block"}) {
    TemplateError e = parseError(std::string("{% ") + tag + " 'other.jinja' %}");
    EXPECT_NE(e.message.find(std::string("'") + tag + "'"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("not supported"), std::string::npos) << e.message;
  }
}

TEST(JinjaErrors, RuntimeErrorsNameTheLineAndCause) {
  TemplateError e =
      renderError("a\n{% for m in messages %}\n{{ m + [1] }}\n{% endfor %}", {{"messages", {"x"}}});
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ(e.message, "can only concatenate str (not \"list\") to str");
  EXPECT_FALSE(e.raised_by_template);

  e = renderError("{% for t in tools %}{% endfor %}", {{"tools", nullptr}});
  EXPECT_EQ(e.message, "'NoneType' object is not iterable");

  e = renderError("{{ messages[0].nope.x }}", {{"messages", {{{"role", "user"}}}}});
  EXPECT_EQ(e.message, "'dict object' has no attribute 'nope'");

  e = renderError("{{ missing.attr }}");
  EXPECT_EQ(e.message, "'missing' is undefined");
}

TEST(JinjaErrors, SandboxRefusesMutation) {
  TemplateError e = renderError("{% set l = [1] %}{{ l.append(2) }}");
  EXPECT_NE(e.message.find("unsafe"), std::string::npos) << e.message;
  e = renderError("{% set d = {} %}{{ d.update({'a': 1}) }}");
  EXPECT_NE(e.message.find("unsafe"), std::string::npos) << e.message;
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplatesMessage) {
  TemplateError e = renderError("{{ raise_exception('Roles must alternate: ' ~ 3) }}");
  EXPECT_TRUE(e.raised_by_template);
  EXPECT_EQ(e.message, "Roles must alternate: 3");
}

}  // namespace
}  // namespace tandem::jinja::testing
