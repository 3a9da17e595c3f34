// Limits tests: hostile templates hit a bound and fail with an error naming
// it (template size, loop iterations, call depth, output size, parser
// nesting), never crash or run away; integer arithmetic never wraps. The
// work, time, memory and nesting budgets are in budget_test.cpp.
#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

TemplateError errorOf(const TemplateResult<std::string>& result) {
  if (auto* error = std::get_if<TemplateError>(&result)) return *error;
  ADD_FAILURE() << "expected an error, got output of " << std::get<std::string>(result).size()
                << " bytes";
  return {};
}

bool mentions(const TemplateError& e, const std::string& what) {
  return e.message.find(what) != std::string::npos;
}

TEST(JinjaLimits, TemplateSize) {
  Limits limits;
  limits.max_template_bytes = 100;
  auto parsed = Template::parse(std::string(101, 'x'), limits);
  ASSERT_TRUE(std::holds_alternative<TemplateError>(parsed));
  EXPECT_TRUE(mentions(std::get<TemplateError>(parsed), "max_template_bytes"));
  EXPECT_TRUE(std::holds_alternative<Template>(Template::parse(std::string(100, 'x'), limits)));
}

TEST(JinjaLimits, LoopIterationsAreSummedOverLoops) {
  RenderOptions options;
  options.limits.max_loop_iterations = 1000;
  // Each loop alone stays under the bound; together they pass it.
  auto result =
      renderSource("{% for i in range(600) %}{% endfor %}{% for i in range(600) %}{% endfor %}",
                   nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(mentions(errorOf(result), "max_loop_iterations"));
  result =
      renderSource("{% for i in range(300) %}{% endfor %}{% for i in range(300) %}{% endfor %}",
                   nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(std::holds_alternative<std::string>(result));

  result =
      renderSource("{% for a in range(100) %}{% for b in range(100) %}{% endfor %}{% endfor %}",
                   nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(mentions(errorOf(result), "max_loop_iterations"));
}

TEST(JinjaLimits, RecursionDepth) {
  auto result = renderSource("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_TRUE(mentions(errorOf(result), "max_call_depth"));
  RenderOptions options;
  options.limits.max_call_depth = 10;
  result = renderSource(
      "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
      nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(std::holds_alternative<std::string>(result));
}

TEST(JinjaLimits, DeepNestingInTheSourceIsRefusedWithoutCrashing) {
  std::string parens = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  auto parsed = Template::parse(parens);
  ASSERT_TRUE(std::holds_alternative<TemplateError>(parsed));
  EXPECT_TRUE(mentions(std::get<TemplateError>(parsed), "max_call_depth"));

  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  chain += " }}";
  parsed = Template::parse(chain);
  ASSERT_TRUE(std::holds_alternative<TemplateError>(parsed));
  EXPECT_TRUE(mentions(std::get<TemplateError>(parsed), "max_call_depth"));

  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if true %}";
  parsed = Template::parse(ifs);
  ASSERT_TRUE(std::holds_alternative<TemplateError>(parsed));
  EXPECT_TRUE(mentions(std::get<TemplateError>(parsed), "max_call_depth"));

  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  nots += "1 }}";
  parsed = Template::parse(nots);
  ASSERT_TRUE(std::holds_alternative<TemplateError>(parsed));
}

TEST(JinjaLimits, OutputSize) {
  RenderOptions options;
  options.limits.max_output_bytes = 10000;
  auto result = renderSource("{% for i in range(5000) %}abc{% endfor %}",
                             nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(mentions(errorOf(result), "max_output_bytes"));
  result = renderSource("{{ 'x' * 100000000000 }}", nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(mentions(errorOf(result), "max_output_bytes"));
  result = renderSource(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",
      nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(mentions(errorOf(result), "max_output_bytes"));
}

TEST(JinjaLimits, SharedAndCyclicValuesDoNotPrintForever) {
  RenderOptions options;
  options.limits.max_output_bytes = 100000;
  // Doubling a list 60 times shares its parts: printing it would take 2^60 items.
  const std::string doubling =
      "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
      "{% endfor %}";
  for (const char* use : {"{{ ns.l }}", "{{ ns.l | tojson }}", "{{ ns.l | string | length }}"}) {
    auto result = renderSource(doubling + use, nlohmann::ordered_json::object(), options);
    EXPECT_TRUE(mentions(errorOf(result), "max_output_bytes")) << use;
  }
  auto result = renderSource("{% set ns = namespace() %}{% set ns.self = [ns] %}{{ ns }}",
                             nlohmann::ordered_json::object(), options);
  ASSERT_TRUE(std::holds_alternative<TemplateError>(result));
}

TEST(JinjaLimits, HugeRangeIsRefused) {
  RenderOptions options;
  options.limits.max_loop_iterations = 1000;
  auto result =
      renderSource("{{ range(1000000000) | length }}", nlohmann::ordered_json::object(), options);
  EXPECT_TRUE(mentions(errorOf(result), "max_loop_iterations"));
}

TEST(JinjaLimits, LimitErrorsHaveKindLimit) {
  RenderOptions options;
  options.limits.max_loop_iterations = 10;
  options.limits.max_output_bytes = 100;
  for (const char* source : {"{% for i in range(20) %}{% endfor %}", "{{ 'x' * 1000 }}",
                             "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"}) {
    TemplateError e = errorOf(renderSource(source, nlohmann::ordered_json::object(), options));
    EXPECT_EQ(e.kind, TemplateError::Kind::kLimit) << source;
  }
  auto parsed =
      Template::parse("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}");
  ASSERT_TRUE(std::holds_alternative<TemplateError>(parsed));
  EXPECT_EQ(std::get<TemplateError>(parsed).kind, TemplateError::Kind::kLimit);
  EXPECT_EQ(errorOf(renderSource("{{ 1 / 0 }}")).kind, TemplateError::Kind::kEvaluation);
}

// Integers are 64-bit: a result past that range is an error, never a
// wrapped value.
TEST(JinjaLimits, IntegerOverflowIsAnError) {
  const char* const overflowing[] = {
      "{{ (-9223372036854775807 - 1) | abs }}",
      "{{ -(-9223372036854775807 - 1) }}",
      "{{ 9223372036854775807 + 1 }}",
      "{{ (-9223372036854775807 - 1) - 1 }}",
      "{{ 4611686018427387904 * 2 }}",
      "{{ (-9223372036854775807 - 1) // -1 }}",
      "{{ 2 ** 63 }}",
      "{{ 3 ** 100000000000000 }}",
      "{{ [1, 2] | sum(start=9223372036854775807) }}",
      "{{ 1e30 | int }}",
      "{{ '99999999999999999999' | int }}",
      "{{ 9223372036854775807 | round(-1) }}",
  };
  for (const char* source : overflowing) {
    TemplateError e = errorOf(renderSource(source));
    EXPECT_EQ(e.message, "integer result out of range") << source;
    EXPECT_EQ(e.kind, TemplateError::Kind::kEvaluation) << source;
  }
  EXPECT_EQ(errorOf(renderSource("{{ (1e308 * 10) | int }}")).message,
            "cannot convert float infinity to integer");
  EXPECT_EQ(errorOf(renderSource("{{ 0 ** -1 }}")).message,
            "0.0 cannot be raised to a negative power");
}

TEST(JinjaLimits, IntegerEdgesAsPython) {
  // What Python prints for each.
  auto result = renderSource(
      "{{ (-9223372036854775807 - 1) % -1 }} {{ (-9223372036854775807 - 1) is divisibleby(-1) }} "
      "{{ (-2) ** 63 }} {{ (-1) ** 3 }} {{ (-1) ** 1000000000001 }} {{ 2 ** 62 }} "
      "{{ 9223372036854775807 | abs }} {{ 5 | round }} {{ 15 | round(-1) }} {{ 25 | round(-1) }} "
      "{{ 2.5 | round }} {{ 1.5 | round(400) }} {{ 'nan' | float | int }} "
      "{{ range(9223372036854775806, 9223372036854775807, 5) | list }} "
      "{{ [1, 2, 3][1::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807] }} "
      "{{ 'abc'[-9223372036854775807:9223372036854775807] }}");
  ASSERT_TRUE(std::holds_alternative<std::string>(result)) << errorOf(result).describe();
  EXPECT_EQ(std::get<std::string>(result),
            "0 True -9223372036854775808 -1 -1 4611686018427387904 9223372036854775807 5 20 20 "
            "2.0 1.5 0 [9223372036854775806] [2] [3] abc");
}

}  // namespace
}  // namespace tandem::jinja::testing
