// Python's printing of values, as templates show them: str() for `{{ x }}`
// and the `string` filter, repr() inside lists and dicts, and json.dumps for
// the `tojson` filter (with Hugging Face's ensure_ascii=False default).
#pragma once

#include <optional>
#include <string>

#include "common/jinja/value.h"

namespace tandem::jinja {

// Printing stops with a RenderFailure past `max_bytes` (values can share
// parts, so a small value can print as a huge text).
constexpr size_t kDefaultPrintLimit = 64u << 20;
std::string pyStr(const Value& v, size_t max_bytes = kDefaultPrintLimit);
std::string pyRepr(const Value& v, size_t max_bytes = kDefaultPrintLimit);
// Python's repr() of a float: shortest round-trip digits, "1.0", "1e-05".
std::string pyFloatRepr(double d);

struct JsonDumpOptions {
  std::optional<std::string> indent;  // nullopt: one line
  bool ensure_ascii = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  size_t max_bytes = kDefaultPrintLimit;
};

// json.dumps(v, ...); throws RenderFailure for values JSON cannot hold.
std::string jsonDumps(const Value& v, const JsonDumpOptions& options);

}  // namespace tandem::jinja
