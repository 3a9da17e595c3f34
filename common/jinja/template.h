// A Jinja template engine for chat templates: the subset of Jinja2 that real
// models' chat templates use, rendered with the settings Hugging Face
// transformers uses (ImmutableSandboxedEnvironment, trim_blocks and
// lstrip_blocks on, keep_trailing_newline off, loop controls and the
// `generation` tag enabled, `tojson` as Python's json.dumps without ASCII
// escaping, the globals raise_exception and strftime_now).
//
// A template is untrusted input (it comes with a model directory): parsing
// and rendering never throw, never touch files or the environment, and are
// bounded (Limits) in work, wall-clock time, memory, loop iterations, call
// depth, value nesting and output size; a render can also be cancelled.
// Every failure names the template line and what failed; a bound's error
// names the bound and its value.
//
// A parsed Template is immutable; render() may be called from any number of
// threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace tandem::jinja {

struct Limits {
  size_t max_template_bytes = 1 << 20;     // source text
  size_t max_output_bytes = 4 << 20;       // rendered text; any one string built or printed
  size_t max_loop_iterations = 1'000'000;  // summed over every loop of one render
  size_t max_call_depth = 64;              // nested macro calls and expression depth
  // Units of work per render: each statement run, expression node evaluated,
  // loop iteration, macro, filter, test and function call, plus data work
  // (one step per item visited or compared and per 64 bytes of text built,
  // copied or searched). Real templates rendering 800 messages with tools
  // take at most a fifth of the default, most of them 2% (docs/chat.md).
  size_t max_steps = 10'000'000;
  // Wall-clock time per render, read every 4096 steps (with the cancel flag).
  std::chrono::milliseconds max_render_time{5000};
  // Live bytes of the values one render holds at once (its variables, the
  // strings, lists, dicts and namespaces it builds, its output), checked
  // before each allocation; memory a render freed no longer counts.
  size_t max_memory_bytes = 64 << 20;
  // Nesting of lists, dicts and tuples (the input's and those a template
  // builds): a request's JSON is at most 128 levels, and JSON in its strings
  // at most 128 more.
  size_t max_value_depth = 512;
};

// A naive time: a time point whose calendar fields, read as UTC, are the
// wall-clock time it stands for (what RenderOptions::now holds).
using NaiveTime = std::chrono::system_clock::time_point;

// "2025-03-07T09:05:03" (or a space for the T; seconds optional) as a naive
// time; nullopt when the text is not such a time or names no valid one.
std::optional<NaiveTime> parseNaiveTime(std::string_view text);
// `time` as "2025-03-07T09:05:03", the form parseNaiveTime reads.
std::string formatNaiveTime(NaiveTime time);
// The system clock's local wall-clock time, to the second: what
// strftime_now shows when RenderOptions::now is empty.
NaiveTime localNaiveNow();

struct RenderOptions {
  // What strftime_now sees (a naive time); empty: the system clock's local
  // time.
  std::optional<NaiveTime> now;
  Limits limits;
  // Set (by another thread) when the render's result is no longer wanted,
  // e.g. its client left: rendering then ends soon with a kCancelled error.
  // Null: never cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

// Why parsing or rendering failed.
struct TemplateError {
  enum class Kind {
    kEvaluation,  // the template failed (a type error, raise_exception, ...)
    kLimit,       // a bound of Limits was reached; `message` names it
    kCancelled,   // RenderOptions::cancel was set
  };
  std::string message;  // what failed, e.g. "'NoneType' object is not iterable"
  int line = 0;         // 1-based template line; 0 when unknown
  // True when the template called raise_exception(message): `message` is then
  // exactly the template's text.
  bool raised_by_template = false;
  Kind kind = Kind::kEvaluation;

  // "line 12: 'NoneType' object is not iterable" (or the message alone).
  std::string describe() const;
};

template <typename T>
using TemplateResult = std::variant<T, TemplateError>;

class Template {
 public:
  // Parses `source`; limits.max_template_bytes bounds its size.
  static TemplateResult<Template> parse(std::string_view source, const Limits& limits = {});

  // Renders with `variables` (a JSON object; key order is kept, as Python
  // dicts keep it, for tojson, items() and iteration) as the template's
  // variables. Values: null is None, booleans, integers and floats, strings,
  // arrays are lists, objects are dicts.
  TemplateResult<std::string> render(const nlohmann::ordered_json& variables,
                                     const RenderOptions& options = {}) const;

  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

 private:
  struct Impl;
  explicit Template(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tandem::jinja
