// Statement tests: if/elif/else, for loops (loop object, else, filters, unpacking, break/continue),
// set and block set, namespaces and scoping, macros and call blocks, filter blocks. Expected
// outputs were produced by Python jinja2 3.1.6 with the Hugging Face settings (sandboxed,
// trim_blocks, lstrip_blocks, loopcontrols).
#include <thread>

#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

const RenderCase kStatements[] = {
    {R"J({% if x %}a{% elif y %}b{% else %}c{% endif %})J", R"J({"x": false, "y": true})J", true,
     false, R"J(b)J"},
    {R"J({% for i in items %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %})J",
     R"J({"items": ["a", "b", "c"]})J", true, false,
     R"J(0132TrueFalse3;1221FalseFalse3;2310FalseTrue3;)J"},
    {R"J({% for i in items %}{{ loop.previtem }}-{{ loop.nextitem }}|{% endfor %})J",
     R"J({"items": [1, 2, 3]})J", true, false, R"J(-2|1-3|2-|)J"},
    {R"J({% for i in items %}{{ loop.cycle('odd', 'even') }}{% endfor %})J",
     R"J({"items": [1, 2, 3]})J", true, false, R"J(oddevenodd)J"},
    {R"J({% for i in [] %}x{% else %}empty{% endfor %})J", R"J({})J", true, false, R"J(empty)J"},
    {R"J({% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %})J", R"J({"d": {"b": 1, "a": 2}})J",
     true, false, R"J(b=1,a=2,)J"},
    {R"J({% for i in range(10) if i is odd %}{{ i }}{% if i > 5 %}{% break %}{% endif %}{% endfor %})J",
     R"J({})J", true, false, R"J(1357)J"},
    {R"J({% for i in range(5) %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %})J",
     R"J({})J", true, false, R"J(0134)J"},
    {R"J({% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }})J", R"J({})J",
     true, false, R"J(21)J"},
    {R"J({% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }})J",
     R"J({})J", true, false, R"J(4)J"},
    {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }})J", R"J({})J", true, false, R"J(12)J"},
    {R"J({% set block %}hello {{ 1 + 1 }}{% endset %}[{{ block }}])J", R"J({})J", true, false,
     R"J([hello 2])J"},
    {R"J({% set up | upper %}shout{% endset %}{{ up }})J", R"J({})J", true, false, R"J(SHOUT)J"},
    {R"J({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }})J",
     R"J({})J", true, false, R"J(Hi Bob! Hi Al?)J"},
    {R"J({% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %})J",
     R"J({})J", true, false, R"J(<inner>)J"},
    {R"J({% macro row(x) %}[{{ caller(x) }}]{% endmacro %}{% call(v) row(3) %}v={{ v }}{% endcall %})J",
     R"J({})J", true, false, R"J([v=3])J"},
    {R"J({% filter upper %}abc {{ 'd' }}{% endfilter %})J", R"J({})J", true, false, R"J(ABC D)J"},
    {R"J({% for a in [[1,2],[3]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %};{% endfor %})J",
     R"J({})J", true, false, R"J(1122;13;)J"},
    {R"J({% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }})J",
     R"J({})J", true, false, R"J(321)J"},
    {R"J({% for c in 'héllo' %}{{ c }}.{% endfor %})J", R"J({})J", true, false, R"J(h.é.l.l.o.)J"},
    {R"J({% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %})J", R"J({})J", true, false, R"J(xy)J"},
    {R"J({{ x if x else 'none' }}|{{ 'yes' if true }}|{{ 'no' if false }}|)J", R"J({"x": 0})J",
     true, false, R"J(none|yes||)J"},
};

TEST(JinjaStatements, MatchPythonJinja) {
  for (const auto& c : kStatements) expectCase(c);
}

TEST(JinjaStatements, GenerationBlockRendersItsBody) {
  auto result = renderSource("a{% generation %}b{{ 1 }}{% endgeneration %}c");
  ASSERT_TRUE(std::holds_alternative<std::string>(result));
  EXPECT_EQ(std::get<std::string>(result), "ab1c");
}

TEST(JinjaStatements, TemplateIsReusableAcrossRendersAndThreads) {
  auto parsed = Template::parse("{% set x = n * 2 %}{{ x }}");
  ASSERT_TRUE(std::holds_alternative<Template>(parsed));
  const Template& t = std::get<Template>(parsed);
  std::vector<std::thread> threads;
  std::vector<std::string> outputs(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto r = t.render(nlohmann::ordered_json{{"n", i}});
      outputs[static_cast<size_t>(i)] = std::get<std::string>(r);
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(outputs[static_cast<size_t>(i)], std::to_string(i * 2));
}

TEST(JinjaStatements, StrftimeNowUsesTheGivenTime) {
  RenderOptions options;
  using namespace std::chrono;
  options.now = sys_days{year{2025} / March / 7} + hours{21} + minutes{5} + seconds{3};
  auto result = renderSource("{{ strftime_now('%Y-%m-%d %H:%M:%S %b %B %a %A %I%p %j %y %%') }}",
                             nlohmann::ordered_json::object(), options);
  ASSERT_TRUE(std::holds_alternative<std::string>(result));
  EXPECT_EQ(std::get<std::string>(result),
            "2025-03-07 21:05:03 Mar March Fri Friday 09PM 066 25 %");
}

}  // namespace
}  // namespace tandem::jinja::testing
