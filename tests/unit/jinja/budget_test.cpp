// Budget tests: a hostile template's work, wall-clock time, memory and value
// nesting are bounded (Limits::max_steps, max_render_time, max_memory_bytes,
// max_value_depth), a render can be cancelled, and every such end is a
// TemplateError of kind kLimit (or kCancelled) naming the bound. Real
// templates stay far inside the default bounds.
#include <atomic>
#include <filesystem>
#include <thread>

#include "tests/unit/jinja/conformance_check.h"
#include "tests/unit/jinja/render_case.h"

namespace tandem::jinja::testing {
namespace {

using nlohmann::ordered_json;

TemplateError errorOf(const TemplateResult<std::string>& result) {
  if (auto* error = std::get_if<TemplateError>(&result)) return *error;
  ADD_FAILURE() << "expected an error, got output of " << std::get<std::string>(result).size()
                << " bytes";
  return {};
}

std::string outputOf(const TemplateResult<std::string>& result) {
  if (auto* error = std::get_if<TemplateError>(&result)) {
    ADD_FAILURE() << "unexpected error: " << error->describe();
    return {};
  }
  return std::get<std::string>(result);
}

bool mentions(const TemplateError& e, const std::string& what) {
  return e.message.find(what) != std::string::npos;
}

// Limits where only the bound under test can stop the render.
RenderOptions unbounded() {
  RenderOptions options;
  options.limits.max_steps = std::numeric_limits<size_t>::max();
  options.limits.max_render_time = std::chrono::hours(24);
  options.limits.max_memory_bytes = size_t{1} << 40;
  options.limits.max_output_bytes = size_t{1} << 40;
  options.limits.max_loop_iterations = std::numeric_limits<size_t>::max();
  return options;
}

// Two calls per level: 2^61 calls, each within max_call_depth.
const char kExponentialMacro[] =
    "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}";

TEST(JinjaBudget, ExponentialRecursionEndsAtTheWorkBudget) {
  auto result = renderSource(kExponentialMacro);
  TemplateError e = errorOf(result);
  EXPECT_EQ(e.kind, TemplateError::Kind::kLimit);
  EXPECT_EQ(e.message,
            "template rendering exceeded its work budget of 10000000 steps (limit max_steps)");

  RenderOptions options;
  options.limits.max_steps = 5000;
  e = errorOf(renderSource(kExponentialMacro, ordered_json::object(), options));
  EXPECT_EQ(e.kind, TemplateError::Kind::kLimit);
  EXPECT_TRUE(mentions(e, "work budget of 5000 steps (limit max_steps)")) << e.message;
}

TEST(JinjaBudget, EveryKindOfWorkIsCounted) {
  RenderOptions options;
  options.limits.max_steps = 100000;
  const char* const hostile[] = {
      // Loop iterations with nothing in the body.
      "{% for i in range(200000) %}{% endfor %}",
      // Quadratic work inside one filter call.
      "{{ range(2000) | unique | list | length }}",
      // Comparing two shared structures walks 2^40 pairs.
      ("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}"
       "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}"),
      // Membership tests over a long list, in a loop.
      "{% set l = range(1000) | list %}{% for i in range(1000) %}{{ -1 in l }}{% endfor %}",
      // Copying a long list again and again.
      "{% set l = range(50000) | list %}{% for i in range(50) %}{{ (l + l) | length }}{% endfor %}",
  };
  for (const char* source : hostile) {
    TemplateError e = errorOf(renderSource(source, ordered_json::object(), options));
    EXPECT_EQ(e.kind, TemplateError::Kind::kLimit) << source;
    EXPECT_TRUE(mentions(e, "limit max_steps")) << source << ": " << e.message;
  }
}

TEST(JinjaBudget, LongNeedlesAreSearchedInLinearTime) {
  // A naive search compares 10^5 bytes at each of 2 * 10^6 offsets.
  auto result = renderSource(
      "{% set hay = 'a' * 2000000 %}{% set needle = 'a' * 100000 + 'b' %}"
      "{{ needle in hay }} {{ hay.find(needle) }} {{ hay.count(needle) }} {{ hay.rfind(needle) }} "
      "{{ (hay ~ 'b').find(needle) }} {{ (hay ~ 'b').rfind(needle) }} "
      "{{ (hay ~ 'b').split(needle) | length }}");
  EXPECT_EQ(outputOf(result), "False -1 0 -1 1900000 1900000 2");
}

TEST(JinjaBudget, WallClockBound) {
  RenderOptions options = unbounded();
  options.limits.max_render_time = std::chrono::milliseconds(0);
  TemplateError e = errorOf(renderSource(kExponentialMacro, ordered_json::object(), options));
  EXPECT_EQ(e.kind, TemplateError::Kind::kLimit);
  EXPECT_EQ(e.message,
            "template rendering exceeded its time budget of 0 ms (limit max_render_time)");
}

TEST(JinjaBudget, CancelledBeforeTheRender) {
  std::atomic<bool> cancel{true};
  RenderOptions options = unbounded();
  options.cancel = &cancel;
  TemplateError e = errorOf(renderSource(kExponentialMacro, ordered_json::object(), options));
  EXPECT_EQ(e.kind, TemplateError::Kind::kCancelled);
  EXPECT_EQ(e.message, "template rendering was cancelled");
  // Checked before the render starts too.
  EXPECT_EQ(errorOf(renderSource("{{ 1 + 1 }}", ordered_json::object(), options)).kind,
            TemplateError::Kind::kCancelled);
}

TEST(JinjaBudget, CancelledFromAnotherThreadWhileRendering) {
  std::atomic<bool> cancel{false};
  RenderOptions options = unbounded();
  options.cancel = &cancel;
  auto parsed = Template::parse(kExponentialMacro);
  ASSERT_TRUE(std::holds_alternative<Template>(parsed));
  std::optional<TemplateResult<std::string>> result;
  // Only the flag can end this render.
  std::thread renderer([&] { result = std::get<Template>(parsed).render({}, options); });
  cancel.store(true);
  renderer.join();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(errorOf(*result).kind, TemplateError::Kind::kCancelled);
}

TEST(JinjaBudget, MemoryOfValuesTheTemplateBuilds) {
  // Doubling a list 30 times would hold 2^30 items (3.4 GB before).
  TemplateError e = errorOf(renderSource(
      "{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}"));
  EXPECT_EQ(e.kind, TemplateError::Kind::kLimit);
  EXPECT_EQ(e.message,
            "template rendering exceeded its memory budget of 67108864 bytes "
            "(limit max_memory_bytes)");

  // Each of these builds 2 MB or more in one operation: refused before it is
  // built under a 1 MiB budget (and a large output bound).
  RenderOptions options;
  options.limits.max_memory_bytes = 1 << 20;
  options.limits.max_output_bytes = size_t{1} << 30;
  const char* const builders[] = {
      "{{ ('ab' * 1000000) | length }}",
      "{% set s = 'x' * 600000 %}{{ (s + s) | length }}",
      "{% set s = 'x' * 600000 %}{{ (s ~ s) | length }}",
      "{{ ('x' * 1000) | replace('x', 'y' * 2000) | length }}",
      "{% set s = 'x' * 300000 %}{{ [s, s, s, s] | join(',') | length }}",
      "{% set s = 'x' * 300000 %}{{ [s, s, s, s] | string | length }}",
      "{% set s = 'x' * 300000 %}{{ [s, s, s, s] | tojson | length }}",
      "{{ ('x' * 30000) | list | length }}",
      "{{ range(100000) | length }}",
      "{% set l = range(1000) | list %}{{ (l * 100) | length }}",
      "{{ range(20000) | map('string') | list | length }}",
      "{{ ('a,' * 100000).split(',') | length }}",
      "{{ ('a\\n' * 100000) | indent(20) | length }}",
      "{{ range(300) | map('center', 4000) | join | length }}",
      "{{ ('<' * 300000) | escape | length }}",
  };
  for (const char* source : builders) {
    TemplateError error = errorOf(renderSource(source, ordered_json::object(), options));
    EXPECT_EQ(error.kind, TemplateError::Kind::kLimit) << source;
    EXPECT_TRUE(mentions(error, "limit max_memory_bytes")) << source << ": " << error.message;
    // The same within the default budget.
    RenderOptions roomy = options;
    roomy.limits.max_memory_bytes = Limits{}.max_memory_bytes;
    EXPECT_TRUE(
        std::holds_alternative<std::string>(renderSource(source, ordered_json::object(), roomy)))
        << source;
  }
}

TEST(JinjaBudget, FreedValuesNoLongerCount) {
  RenderOptions options;
  options.limits.max_memory_bytes = 1 << 20;
  // 200 KB built 100 bytes at a time: 20 MB allocated in all, at most about
  // 400 KB live at once.
  auto result = renderSource(
      "{% set ns = namespace(s='') %}{% for i in range(2000) %}{% set ns.s = ns.s + 'x' * 100 %}"
      "{% endfor %}{{ ns.s | length }}",
      ordered_json::object(), options);
  EXPECT_EQ(outputOf(result), "200000");
  // A loop body's values go with each iteration.
  result = renderSource(
      "{% for i in range(50) %}{% set x = 'x' * 500000 %}{% endfor %}"
      "{% for i in range(50) %}{% set ns = namespace(l=range(8000) | list) %}{% endfor %}done",
      ordered_json::object(), options);
  EXPECT_EQ(outputOf(result), "done");
}

TEST(JinjaBudget, ArgumentsThatSizeAnAllocationAreBounded) {
  struct Case {
    const char* source;
    const char* message;
  };
  const Case cases[] = {
      {"{{ 'x' | center(2000000000) }}",
       "filter center: width must be at most 4096, got 2000000000 (limit on filter widths)"},
      {"{{ ('a\\nb\\n' * 1000) | indent(100000) }}",
       "filter indent: width must be at most 4096, got 100000 (limit on filter widths)"},
      {"{{ [1, [2]] | tojson(indent=100000000) }}",
       "filter tojson: indent must be at most 4096, got 100000000 (limit on filter widths)"},
      {"{{ 'a\\nb' | indent(' ' * 5000) }}",
       "filter indent: width must be at most 4096, got 5000 (limit on filter widths)"},
  };
  for (const auto& c : cases) {
    TemplateError e = errorOf(renderSource(c.source));
    EXPECT_EQ(e.kind, TemplateError::Kind::kLimit) << c.source;
    EXPECT_EQ(e.message, c.message) << c.source;
  }
  EXPECT_EQ(outputOf(renderSource("[{{ 'ab' | center(6) }}]{{ [1] | tojson(indent=2) }}")),
            "[  ab  ][\n  1\n]");
}

TEST(JinjaBudget, EmptyRepetitionDoesNoWork) {
  EXPECT_EQ(outputOf(renderSource("[{{ '' * 100000000000 }}{{ ([] * 100000000000) | length }}]")),
            "[0]");
}

// Nesting: 100000 levels, built by a template or given as input, end in a
// clean error (or, through namespaces, in no error) and never overflow the
// stack when values are made, compared, printed or freed.

TEST(JinjaBudget, NestingBuiltByATemplateIsBounded) {
  const char* const builders[] = {
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
      "{% endfor %}{{ ns.l == ns.l }}",
      "{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = {'k': ns.d} %}"
      "{% endfor %}{{ ns.d | tojson }}",
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = (ns.l,) %}"
      "{% endfor %}{{ ns.l }}",
      // A bound method holds its object.
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l.count] %}"
      "{% endfor %}{{ ns.l }}",
  };
  for (const char* source : builders) {
    TemplateError e = errorOf(renderSource(source));
    EXPECT_EQ(e.kind, TemplateError::Kind::kLimit) << source;
    EXPECT_EQ(e.message, "a value is nested more than 512 levels deep (limit max_value_depth)")
        << source;
  }
}

TEST(JinjaBudget, ChainsThroughObjectsAreFreedWithoutRecursion) {
  // Each namespace holds a list holding the previous one: 100000 objects deep.
  const std::string chain =
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
      "{% set ns.l = [namespace(x=ns.l)] %}{% endfor %}";
  EXPECT_EQ(outputOf(renderSource(chain + "{{ ns.l | length }} {{ ns.l == ns.l }}")), "1 True");
  TemplateError e = errorOf(renderSource(chain + "{{ ns.l }}"));
  EXPECT_EQ(e.kind, TemplateError::Kind::kLimit);
  EXPECT_TRUE(mentions(e, "limit max_value_depth")) << e.message;

  // Loop objects chained through loop.previtem, kept by a namespace (about
  // 1 KB each: more than the default memory budget holds).
  RenderOptions options;
  options.limits.max_memory_bytes = size_t{1} << 30;
  EXPECT_EQ(outputOf(renderSource(
                "{% set ns = namespace(prev=none) %}{% for i in range(100000) %}"
                "{% for x in [ns.prev, 0] %}{% if loop.last %}{% set ns.prev = loop %}{% endif %}"
                "{% endfor %}{% endfor %}{{ ns.prev.index }}",
                ordered_json::object(), options)),
            "2");
}

ordered_json nestedArray(int levels) {
  ordered_json value = 1;
  for (int i = 0; i < levels; ++i) {
    ordered_json outer = ordered_json::array();
    outer.push_back(std::move(value));  // moved: no deep copy
    value = std::move(outer);
  }
  return value;
}

TEST(JinjaBudget, NestingOfInputIsBounded) {
  ordered_json variables = ordered_json::object();
  variables["deep"] = nestedArray(100000);
  TemplateError e = errorOf(renderSource("{{ deep | length }}", variables));
  EXPECT_EQ(e.kind, TemplateError::Kind::kLimit);
  EXPECT_EQ(e.message, "a value is nested more than 512 levels deep (limit max_value_depth)");

  // 512 levels (the bound) render, compare and print.
  variables["deep"] = nestedArray(512);
  auto result = renderSource(
      "{{ deep == deep }} {{ deep | tojson | length }} {{ deep | string | length }}", variables);
  EXPECT_EQ(outputOf(result), "True 1025 1025");
  variables["deep"] = nestedArray(513);
  EXPECT_EQ(errorOf(renderSource("{{ 1 }}", variables)).kind, TemplateError::Kind::kLimit);
}

// A long conversation with tools: system prompt, then rounds of a user turn,
// an assistant tool call, the tool's reply and the assistant's answer.
ordered_json longConversation(int rounds, bool system, bool tools, const ordered_json& tool_list) {
  const std::string text =
      "Here is some text about the weather in Paris, France: partly cloudy, a light breeze, "
      "\"quotes\", unicode \u00e9\u00e8 \U0001F600 and a newline\nthat goes on for a while. ";
  ordered_json messages = ordered_json::array();
  if (system) messages.push_back({{"role", "system"}, {"content", "Be concise. " + text}});
  for (int i = 0; i < rounds; ++i) {
    messages.push_back(
        {{"role", "user"}, {"content", "Question " + std::to_string(i) + ": " + text}});
    if (tools) {
      const std::string id = "call" + std::to_string(100000000 + i);
      ordered_json call = {{"id", id},
                           {"type", "function"},
                           {"function",
                            {{"name", "get_current_weather"},
                             {"arguments", {{"location", "Paris, France"}, {"unit", "celsius"}}}}}};
      messages.push_back(
          {{"role", "assistant"}, {"content", ""}, {"tool_calls", ordered_json::array({call})}});
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", id},
                          {"name", "get_current_weather"},
                          {"content", R"({"temperature": 18, "conditions": "Partly cloudy"})"}});
    }
    messages.push_back({{"role", "assistant"},
                        {"content", "Answer " + std::to_string(i) + ": " + text},
                        {"reasoning_content", "Thinking: " + text}});
  }
  messages.push_back({{"role", "user"}, {"content", "Last question: " + text}});
  ordered_json variables = ordered_json::object();
  variables["messages"] = std::move(messages);
  variables["tools"] = tools ? tool_list : ordered_json();
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = true;
  variables["bos_token"] = "<s>";
  variables["eos_token"] = "</s>";
  return variables;
}

TEST(JinjaBudget, RealTemplatesStayFarInsideTheDefaults) {
  const std::string dir = TANDEM_SOURCE_DIR "/tests/data/chat_templates";
  ordered_json tools;
  const ordered_json cases = ordered_json::parse(readFile(dir + "/cases.json"));
  for (const auto& c : cases.at("cases")) {
    if (c.at("id") == "tools_available") tools = c.at("tools");
  }
  ASSERT_TRUE(tools.is_array());
  // A tenth of the work budget, a sixteenth of the memory budget.
  RenderOptions tight;
  tight.limits.max_steps = Limits{}.max_steps / 10;
  tight.limits.max_memory_bytes = Limits{}.max_memory_bytes / 16;
  int templates = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/templates")) {
    auto parsed = Template::parse(readFile(entry.path().string()));
    ASSERT_TRUE(std::holds_alternative<Template>(parsed)) << entry.path();
    const Template& tmpl = std::get<Template>(parsed);
    ++templates;
    int rendered = 0;
    // 100 rounds: 302 to 402 messages. Some templates refuse some shapes
    // (a system message, tool calls); each shape they accept must fit.
    for (bool system : {true, false}) {
      for (bool with_tools : {true, false}) {
        ordered_json variables = longConversation(100, system, with_tools, tools);
        if (std::holds_alternative<TemplateError>(tmpl.render(variables))) continue;
        ++rendered;
        auto result = tmpl.render(variables, tight);
        if (auto* error = std::get_if<TemplateError>(&result)) {
          ADD_FAILURE() << entry.path().filename() << " (system " << system << ", tools "
                        << with_tools << "): " << error->describe();
        }
      }
    }
    EXPECT_GT(rendered, 0) << entry.path().filename();
  }
  EXPECT_EQ(templates, 21);
}

}  // namespace
}  // namespace tandem::jinja::testing
