// Expression tests: literals, arithmetic, comparisons, membership, boolean operators, Python
// printing of values, slicing, attribute and item access, the is-tests and str/dict methods.
// Expected outputs were produced by Python jinja2 3.1.6 with the Hugging
// Face settings (sandboxed, trim_blocks, lstrip_blocks, loopcontrols).
#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

const RenderCase kExpressions[] = {
    {R"J({{ '\101\x41\u00e9' }})J", R"J({})J", true, false, R"J(AAé)J"},
    {R"J({{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 6 / 3 }})J",
     R"J({})J", true, false, R"J(7 3 -4 1 2 1024 3.5 2.0)J"},
    {R"J({{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e20 }} {{ 1e16 }} {{ 123456789012345.0 }} {{ 3.0 }} {{ -0.0 }})J",
     R"J({})J", true, false,
     R"J(2.5 0.30000000000000004 1e-05 1e+20 1e+16 123456789012345.0 3.0 -0.0)J"},
    {R"J({{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }})J", R"J({})J", true, false,
     R"J(a1NoneTrue ababab [1, 2])J"},
    {R"J({{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 2 >= 2 }})J", R"J({})J",
     true, false, R"J(True False True True True)J"},
    {R"J({{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }} {{ 3 not in [1] }})J", R"J({})J",
     true, false, R"J(True True True True)J"},
    {R"J({{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ 0 or [] or 'z' }})J", R"J({})J",
     true, false, R"J(x y True z)J"},
    {R"J({{ [1, 'a', none, true, 1.5, "it's", 'say "hi"'] }})J", R"J({})J", true, false,
     R"J([1, 'a', None, True, 1.5, "it's", 'say "hi"'])J"},
    {R"J({{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }} {{ (1, 2) }} {{ (1,) }})J", R"J({})J", true,
     false, R"J({'a': 1, 'b': [1, 2], 'c': {'d': None}} (1, 2) (1,))J"},
    {R"J({{ s[1:3] }} {{ s[::-1] }} {{ s[-2:] }} {{ l[::2] }} {{ l[-1] }} {{ s[0] }} {{ l[1:] }})J",
     R"J({"s": "h\u00e9llo", "l": [1, 2, 3, 4, 5]})J", true, false,
     R"J(él olléh lo [1, 3, 5] 5 h [2, 3, 4, 5])J"},
    {R"J({{ d.a }} {{ d['b'] }} {{ d.c.d }} {{ l.0 }} {{ d.missing }}|)J",
     R"J({"d": {"a": 1, "b": 2, "c": {"d": 3}}, "l": [9]})J", true, false, R"J(1 2 3 9 |)J"},
    {R"J({{ x is defined }} {{ y is undefined }} {{ n is none }} {{ 's' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }})J",
     R"J({"x": 1, "n": null})J", true, false, R"J(True True True True True True True True)J"},
    {R"J({{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ 1 is ne 2 }})J",
     R"J({})J", true, false, R"J(True True True True True True True True)J"},
    {R"J({{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 1 is le 1 }} {{ 1 is ge 2 }} {{ 1 is in [1] }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ true is true }} {{ false is false }} {{ x is not none }})J",
     R"J({"x": 1})J", true, false, R"J(True True True False True True True True True True)J"},
    {R"J({{ true is number }} {{ true is integer }} {{ none is string }} {{ undefined_thing is iterable }})J",
     R"J({})J", true, false, R"J(True False False True)J"},
    {R"J({{ undefined_thing }}|{{ undefined_thing | length }}|{% for x in undefined_thing %}x{% endfor %}|{{ undefined_thing is defined }})J",
     R"J({})J", true, false, R"J(|0||False)J"},
    {R"J({{ 'Hello'.upper() }} {{ ' x '.strip() }} {{ 'xxhixx'.strip('x') }} {{ 'a,b,,c'.split(',') }} {{ 'a b  c'.split() }} {{ 'a,b,c'.split(',', 1) }})J",
     R"J({})J", true, false, R"J(HELLO x hi ['a', 'b', '', 'c'] ['a', 'b', 'c'] ['a', 'b,c'])J"},
    {R"J({{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }})J",
     R"J({})J", true, false, R"J(True True bba Hello World Hello)J"},
    {R"J({{ 'banana'.count('a') }} {{ 'banana'.find('n') }} {{ 'banana'.rfind('n') }} {{ 'x'.find('z') }} {{ '-'.join(['a', 'b']) }} {{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|)J",
     R"J({})J", true, false, R"J(3 2 4 -1 a-b x|x|)J"},
    {R"J({{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }})J",
     R"J({"d": {"a": 1, "b": 2}})J", true, false,
     R"J(1 None 5 ['a', 'b'] [1, 2] [('a', 1), ('b', 2)])J"},
    {R"J({{ true }} {{ True }} {{ none }} {{ None }} {{ false }})J", R"J({})J", true, false,
     R"J(True True None None False)J"},
    {R"J({{ 'a' 'b' }} {{ "q\"" }} {{ 'tab\there' }} {{ 'uni\u00e9' }})J", R"J({})J", true, false,
     R"J(ab q" tab	here unié)J"},
    {R"J({{ -x }} {{ +x }} {{ - 2 ** 2 }})J", R"J({"x": 3})J", true, false, R"J(-3 3 4)J"},
};

TEST(JinjaExpressions, MatchPythonJinja) {
  for (const auto& c : kExpressions) expectCase(c);
}

}  // namespace
}  // namespace tandem::jinja::testing
