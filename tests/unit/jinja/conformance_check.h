// Shared by the conformance test and its self-check: renders one line of
// tests/data/chat_templates/expected.jsonl and compares it with the
// expectation, as the data's README describes.
#pragma once

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "common/jinja/template.h"

namespace tandem::jinja::testing {

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 2025-03-07 09:05:03, the clock the data was rendered with.
inline std::chrono::system_clock::time_point conformanceNow() {
  using namespace std::chrono;
  return sys_days{year{2025} / March / 7} + hours{9} + minutes{5} + seconds{3};
}

// The variables for one expected line: the case's messages, then kwargs.
inline nlohmann::ordered_json conformanceVariables(const nlohmann::ordered_json& expected_line,
                                                   const nlohmann::ordered_json& test_case) {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = test_case.at("messages");
  for (const auto& [k, v] : expected_line.at("kwargs").items()) vars[k] = v;
  return vars;
}

// Empty when `tmpl` renders `expected_line` as expected; else what differs.
inline std::optional<std::string> checkExpectedLine(const Template& tmpl,
                                                    const nlohmann::ordered_json& expected_line,
                                                    const nlohmann::ordered_json& test_case) {
  RenderOptions options;
  options.now = conformanceNow();
  auto result = tmpl.render(conformanceVariables(expected_line, test_case), options);
  if (expected_line.contains("output")) {
    const std::string want = expected_line.at("output").get<std::string>();
    if (const auto* error = std::get_if<TemplateError>(&result)) {
      return "expected output, got error: " + error->describe();
    }
    const std::string& got = std::get<std::string>(result);
    if (got == want) return std::nullopt;
    size_t at = 0;
    while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
    size_t from = at > 60 ? at - 60 : 0;
    return "output differs at byte " + std::to_string(at) +
           "\n  want: " + nlohmann::json(want.substr(from, 160)).dump() +
           "\n  got:  " + nlohmann::json(got.substr(from, 160)).dump();
  }
  const auto* error = std::get_if<TemplateError>(&result);
  if (error == nullptr) {
    return "expected error '" + expected_line.at("error").get<std::string>() +
           "', rendering succeeded";
  }
  if (expected_line.value("raised_by_template", false)) {
    if (!error->raised_by_template) {
      return "expected raise_exception, got engine error: " + error->describe();
    }
    if (error->message != expected_line.at("error").get<std::string>()) {
      return "raise_exception message differs: got '" + error->message + "'";
    }
  }
  return std::nullopt;
}

}  // namespace tandem::jinja::testing
