// Template: the parse and render entry points (see template.h). Internal
// failures travel as exceptions inside the engine and are turned into
// TemplateError here; nothing escapes parse() or render().
#include "common/jinja/template.h"

#include <new>

#include "common/jinja/evaluator.h"
#include "common/jinja/lexer.h"
#include "common/jinja/parser.h"

namespace tandem::jinja {

struct Template::Impl {
  Body body;
};

std::string TemplateError::describe() const {
  if (line > 0) return "line " + std::to_string(line) + ": " + message;
  return message;
}

Template::Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

TemplateResult<Template> Template::parse(std::string_view source, const Limits& limits) {
  if (source.size() > limits.max_template_bytes) {
    return TemplateError{"template is " + std::to_string(source.size()) + " bytes, more than " +
                             std::to_string(limits.max_template_bytes) +
                             " (limit max_template_bytes)",
                         0, false, TemplateError::Kind::kLimit};
  }
  try {
    auto impl = std::make_shared<Impl>();
    impl->body = parseTemplate(tokenize(source), limits.max_call_depth);
    return Template(std::move(impl));
  } catch (const SyntaxFailure& e) {
    return TemplateError{e.what(), e.line, false,
                         e.limit ? TemplateError::Kind::kLimit : TemplateError::Kind::kEvaluation};
  } catch (const std::bad_alloc&) {
    return TemplateError{"out of memory while parsing the template", 0, false};
  } catch (const std::exception& e) {
    return TemplateError{std::string("internal error while parsing: ") + e.what(), 0, false};
  }
}

TemplateResult<std::string> Template::render(const nlohmann::ordered_json& variables,
                                             const RenderOptions& options) const {
  if (!impl_) return TemplateError{"template was moved from", 0, false};
  int line = 0;
  try {
    Evaluator evaluator(options, variables);
    try {
      return evaluator.render(impl_->body);
    } catch (...) {
      line = evaluator.currentLine();
      throw;
    }
  } catch (const RenderFailure& e) {
    return TemplateError{e.what(), line, e.raised_by_template, e.kind};
  } catch (const std::bad_alloc&) {
    return TemplateError{"out of memory while rendering the template", line, false};
  } catch (const std::exception& e) {
    return TemplateError{std::string("internal error while rendering: ") + e.what(), line, false};
  }
}

}  // namespace tandem::jinja
