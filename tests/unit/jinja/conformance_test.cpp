// Renders every chat template of tests/data/chat_templates against every
// conversation and compares with Python jinja2's output (expected.jsonl).
// Lines with continue_final_message are the chat layer's job and skipped.
#include <gtest/gtest.h>

#include <map>

#include "tests/unit/jinja/conformance_check.h"

namespace tandem::jinja::testing {
namespace {

const std::string kDataDir = TANDEM_SOURCE_DIR "/tests/data/chat_templates";

TEST(JinjaConformance, EveryTemplateMatchesPythonJinja) {
  auto cases_json = nlohmann::ordered_json::parse(readFile(kDataDir + "/cases.json"));
  std::map<std::string, nlohmann::ordered_json> cases;
  for (const auto& c : cases_json.at("cases")) cases[c.at("id").get<std::string>()] = c;

  std::map<std::string, std::pair<int, int>> counts;  // template -> passed, total
  std::map<std::string, std::optional<Template>> templates;
  std::string failures;
  int total = 0;
  int passed = 0;
  std::istringstream lines(readFile(kDataDir + "/expected.jsonl"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto expected = nlohmann::ordered_json::parse(line);
    if (expected.at("kwargs").contains("continue_final_message")) continue;
    const std::string name = expected.at("template").get<std::string>();
    const std::string case_id = expected.at("case").get<std::string>();
    auto& count = counts[name];
    ++count.second;
    ++total;
    if (!templates.count(name)) {
      auto parsed = Template::parse(readFile(kDataDir + "/templates/" + name));
      if (auto* error = std::get_if<TemplateError>(&parsed)) {
        failures += name + ": parse failed: " + error->describe() + "\n";
        templates[name] = std::nullopt;
      } else {
        templates[name] = std::move(std::get<Template>(parsed));
      }
    }
    if (!templates[name]) continue;
    auto problem = checkExpectedLine(*templates[name], expected, cases.at(case_id));
    if (problem) {
      failures += name + " / " + case_id + ": " + *problem + "\n";
    } else {
      ++count.first;
      ++passed;
    }
  }
  std::string summary;
  for (const auto& [name, c] : counts) {
    summary += "  " + name + ": " + std::to_string(c.first) + "/" + std::to_string(c.second) + "\n";
  }
  EXPECT_EQ(passed, total) << "per template:\n" << summary << "failures:\n" << failures;
  EXPECT_EQ(total, 630) << "expected 651 lines minus 21 continue_final_message lines";
}

// The comparison helper must notice a wrong expectation.
TEST(JinjaConformance, CheckerRejectsWrongExpectations) {
  auto parsed = Template::parse("Hello {{ messages[0].content }}!");
  ASSERT_TRUE(std::holds_alternative<Template>(parsed));
  const Template& tmpl = std::get<Template>(parsed);
  auto test_case =
      nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "x"}]})");
  auto right = nlohmann::ordered_json::parse(R"({"kwargs": {}, "output": "Hello x!"})");
  auto wrong = nlohmann::ordered_json::parse(R"({"kwargs": {}, "output": "Hello y!"})");
  auto wrong_error = nlohmann::ordered_json::parse(
      R"({"kwargs": {}, "error": "boom", "raised_by_template": true})");
  EXPECT_FALSE(checkExpectedLine(tmpl, right, test_case).has_value());
  EXPECT_TRUE(checkExpectedLine(tmpl, wrong, test_case).has_value());
  EXPECT_TRUE(checkExpectedLine(tmpl, wrong_error, test_case).has_value());

  auto raising = std::get<Template>(Template::parse("{{ raise_exception('boom') }}"));
  auto other_message = nlohmann::ordered_json::parse(
      R"({"kwargs": {}, "error": "bang", "raised_by_template": true})");
  EXPECT_FALSE(checkExpectedLine(raising, wrong_error, test_case).has_value());
  EXPECT_TRUE(checkExpectedLine(raising, other_message, test_case).has_value());
}

}  // namespace
}  // namespace tandem::jinja::testing
