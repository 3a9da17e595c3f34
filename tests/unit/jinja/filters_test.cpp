// Filter tests: every filter chat templates use, including tojson as json.dumps and jinja 3's
// indent. Expected outputs were produced by Python jinja2 3.1.6 with the Hugging Face settings
// (sandboxed, trim_blocks, lstrip_blocks, loopcontrols).
#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

const RenderCase kFilters[] = {
    {R"J({{ '  x  ' | trim }}|{{ 'xxyxx' | trim('x') }}|{{ 'abc' | upper }}{{ 'ABC' | lower }}|{{ 'hello world-x' | title }}|{{ 'hELLO' | capitalize }})J",
     R"J({})J", true, false, R"J(x|y|ABCabc|Hello World-X|Hello)J"},
    {R"J({{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(sort_keys=true) }})J",
     R"J({"d": {"b": [1, 2.5, null, true], "a": "\u00e9\"\n<>&"}})J", true, false,
     R"J({"b": [1, 2.5, null, true], "a": "é\"\n<>&"}|{
  "b": [
    1,
    2.5,
    null,
    true
  ],
  "a": "é\"\n<>&"
}|{"b":[1,2.5,null,true],"a":"é\"\n<>&"}|{"a": "é\"\n<>&", "b": [1, 2.5, null, true]})J"},
    {R"J({{ d | tojson(ensure_ascii=true) }} {{ [] | tojson(indent=2) }} {{ {} | tojson }} {{ 1.0 | tojson }} {{ 'x' | tojson }})J",
     R"J({"d": {"k": "\u00e9\ud83d\ude00"}})J", true, false,
     R"J({"k": "\u00e9\ud83d\ude00"} [] {} 1.0 "x")J"},
    {R"J({{ [1,2,3] | length }} {{ 'héllo' | length }} {{ {'a':1} | count }} {{ [3,1,2] | sort }} {{ ['b','A','c'] | sort }} {{ [3,1,2] | sort(reverse=true) }})J",
     R"J({})J", true, false, R"J(3 5 1 [1, 2, 3] ['A', 'b', 'c'] [3, 2, 1])J"},
    {R"J({{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }} {{ users | map(attribute='name') | join(',') }} {{ ['a','b'] | map('upper') | list }})J",
     R"J({"users": [{"name": "x"}, {"name": "y"}]})J", true, false, R"J(a, b 12 x,y ['A', 'B'])J"},
    {R"J({{ x | default('d') }} {{ '' | default('e', true) }} {{ '' | d('f') }} {{ none | default('g') }})J",
     R"J({})J", true, false, R"J(d e  None)J"},
    {R"J({{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ 'abc' | first }} {{ 'abc' | list }} {{ [1,2,1,3] | unique | list }} {{ [1,2] | reverse | list }} {{ 'abc' | reverse }})J",
     R"J({})J", true, false, R"J(1 3 a ['a', 'b', 'c'] [1, 2, 3] [2, 1] cba)J"},
    {R"J({{ [1,2,3,4] | select('odd') | list }} {{ [1,2,3,4] | reject('odd') | list }} {{ [0,1,'',2] | select | list }})J",
     R"J({})J", true, false, R"J([1, 3] [2, 4] [1, 2])J"},
    {R"J({{ tools | selectattr('type', 'equalto', 'function') | map(attribute='name') | list }} {{ tools | rejectattr('type', 'equalto', 'function') | list }} {{ tools | selectattr('x') | list }})J",
     R"J({"tools": [{"type": "function", "name": "f"}, {"type": "code", "name": "c", "x": 1}]})J",
     true, false,
     R"J(['f'] [{'type': 'code', 'name': 'c', 'x': 1}] [{'type': 'code', 'name': 'c', 'x': 1}])J"},
    {R"J({{ d | items | list }} {{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ d | dictsort(by='value') }})J",
     R"J({"d": {"b": 1, "a": 2}})J", true, false,
     R"J([('b', 1), ('a', 2)] [('a', 2), ('b', 1)] [('b', 1), ('a', 2)] [('b', 1), ('a', 2)])J"},
    {R"J({{ 3 | string }}{{ none | string }} {{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 2 | float }} {{ 'y' | float }})J",
     R"J({})J", true, false, R"J(3None 42 4 0 7 3 2.5 2.0 0.0)J"},
    {R"J({{ -3 | abs }} {{ -2.5 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 'a b c' | wordcount }} [{{ 'ab' | center(6) }}])J",
     R"J({})J", true, false, R"J(3 2.5 2.57 2.0 3.0 3 [  ab  ])J"},
    {R"J({{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'a\nb' | indent('> ') }})J",
     R"J({})J", true, false,
     R"J(a
    b

    c|  a
  b|a
  
  b|a
> b)J"},
    {R"J({{ [3,1,2] | min }} {{ [3,1,2] | max }} {{ [1,2,3] | sum }} {{ items | sum(attribute='v') }} {{ items | max(attribute='v') }})J",
     R"J({"items": [{"v": 1}, {"v": 5}]})J", true, false, R"J(1 3 6 6 {'v': 5})J"},
    {R"J({{ '<a href="x">&\'' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }} {{ 'aXbX' | replace('X', '-') }})J",
     R"J({})J", true, false, R"J(&lt;a href=&#34;x&#34;&gt;&amp;&#39; &lt;b&gt; <i> a-b-)J"},
    {R"J({{ 'a' | safe + '<b>' }} {{ ('<' | safe) ~ '<' }})J", R"J({})J", true, false,
     R"J(a&lt;b&gt; <<)J"},
    {R"J({{ items | sort(attribute='n') | map(attribute='n') | list }} {{ ['b','a','B'] | unique | list }})J",
     R"J({"items": [{"n": 3}, {"n": 1}]})J", true, false, R"J([1, 3] ['b', 'a'])J"},
};

TEST(JinjaFilters, MatchPythonJinja) {
  for (const auto& c : kFilters) expectCase(c);
}

TEST(JinjaFilters, UnknownFilterFails) {
  auto result = renderSource("{{ 1 | no_such_filter }}");
  ASSERT_TRUE(std::holds_alternative<TemplateError>(result));
  EXPECT_NE(std::get<TemplateError>(result).message.find("no_such_filter"), std::string::npos);
}

}  // namespace
}  // namespace tandem::jinja::testing
