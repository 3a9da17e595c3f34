// Table-driven rendering checks for the Jinja engine: each case is a
// template, its variables and what Python jinja2 (with Hugging Face's
// settings) produced for it.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/jinja/template.h"

namespace tandem::jinja::testing {

struct RenderCase {
  const char* source;
  const char* variables;  // JSON object
  bool succeeds;
  bool raised_by_template;  // for failures: raise_exception was called
  const char* expected;     // output, or the raise_exception message
};

inline TemplateResult<std::string> renderSource(
    const std::string& source,
    const nlohmann::ordered_json& variables = nlohmann::ordered_json::object(),
    const RenderOptions& options = {}) {
  auto parsed = Template::parse(source, options.limits);
  if (auto* error = std::get_if<TemplateError>(&parsed)) return *error;
  return std::get<Template>(parsed).render(variables, options);
}

inline void expectCase(const RenderCase& c) {
  SCOPED_TRACE(std::string("template: ") + c.source);
  auto result = renderSource(c.source, nlohmann::ordered_json::parse(c.variables));
  if (c.succeeds) {
    if (auto* error = std::get_if<TemplateError>(&result)) {
      ADD_FAILURE() << "unexpected error: " << error->describe();
      return;
    }
    EXPECT_EQ(std::get<std::string>(result), c.expected);
    return;
  }
  auto* error = std::get_if<TemplateError>(&result);
  if (error == nullptr) {
    ADD_FAILURE() << "expected an error, got output: " << std::get<std::string>(result);
    return;
  }
  EXPECT_FALSE(error->message.empty());
  EXPECT_EQ(error->raised_by_template, c.raised_by_template) << error->describe();
  if (c.raised_by_template) {
    EXPECT_EQ(error->message, c.expected);
  }
}

}  // namespace tandem::jinja::testing
