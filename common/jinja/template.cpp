// Template: the parse and render entry points (see template.h). Internal
// failures travel as exceptions inside the engine and are turned into
// TemplateError here; nothing escapes parse() or render().
#include "common/jinja/template.h"

#include <ctime>
#include <new>
#include <regex>

#include "common/jinja/evaluator.h"
#include "common/jinja/lexer.h"
#include "common/jinja/parser.h"

namespace tandem::jinja {

struct Template::Impl {
  Body body;
};

std::optional<NaiveTime> parseNaiveTime(std::string_view text) {
  static const std::regex kIso(R"((\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2}))?)");
  std::match_results<std::string_view::const_iterator> match;
  if (!std::regex_match(text.begin(), text.end(), match, kIso)) return std::nullopt;
  auto field = [&](size_t i) { return std::stoi(match[i].str()); };
  std::tm fields{};
  fields.tm_year = field(1) - 1900;
  fields.tm_mon = field(2) - 1;
  fields.tm_mday = field(3);
  fields.tm_hour = field(4);
  fields.tm_min = field(5);
  fields.tm_sec = match[6].matched ? field(6) : 0;
  if (fields.tm_mon < 0 || fields.tm_mon > 11 || fields.tm_mday < 1 || fields.tm_mday > 31 ||
      fields.tm_hour > 23 || fields.tm_min > 59 || fields.tm_sec > 60) {
    return std::nullopt;
  }
  return std::chrono::system_clock::from_time_t(timegm(&fields));
}

std::string formatNaiveTime(NaiveTime time) {
  const std::time_t t = std::chrono::system_clock::to_time_t(time);
  std::tm fields{};
  gmtime_r(&t, &fields);
  char text[32];
  const size_t n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &fields);
  return std::string(text, n);
}

NaiveTime localNaiveNow() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm fields{};
  localtime_r(&t, &fields);
  return std::chrono::system_clock::from_time_t(timegm(&fields));
}

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
