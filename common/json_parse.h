// Parsing JSON text without letting nlohmann's exceptions out: a syntax error
// and a number beyond the range of a double (1e400, which nlohmann reports as
// out_of_range rather than parse_error) both come back as a JsonParseError.
// Every caller that turns a user's JSON into a value goes through here, so no
// input can escape as an exception from a function that returns a Status.
//
// Nesting is bounded: text whose arrays and objects nest deeper than
// `max_depth` is refused before nlohmann sees it (one pass over the text, no
// allocation beyond the bound), with the path where the bound was crossed.
// Code that walks a parsed value recursively (conversion to template values,
// printing, schema walks) can then rely on the bound for its stack.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tandem {

// Levels of arrays and objects a JSON text may nest by default (a top-level
// object is level 1). serde_json's parser stops at 128 too; Python's json
// module, which vLLM parses request bodies with, fails near its recursion
// limit of 1,000.
constexpr int kMaxJsonDepth = 128;

struct JsonParseError {
  // Byte position nlohmann reports for a syntax error (1-based); 0 when the
  // error has no position (a number out of range). For nesting past the
  // bound: the offset of the bracket that crossed it.
  size_t byte = 0;
  // nlohmann's message without its "[json.exception.…] " prefix, e.g.
  // "parse error at line 1, column 2: syntax error while parsing value - …"
  // or "number overflow parsing '1e400'"; for nesting past the bound,
  // "nesting deeper than 128 levels at a.b[0].c…".
  std::string detail;
  // Nesting past the bound only: the bound, and the path of the value that
  // crossed it, starting from the top-level value: `tools[0].function…`
  // (object keys joined by '.', array indexes in brackets; the first few
  // steps, then "…"). `top_key` is the top-level object's key on that path
  // ("" when the top level is not an object).
  int depth_limit = 0;
  std::string path;
  std::string top_key;
  // More values than the bound: the bound (0 otherwise).
  size_t value_limit = 0;

  bool tooDeep() const { return depth_limit > 0; }
  bool tooManyValues() const { return value_limit > 0; }
};

// What a text may hold before nlohmann builds it. A parsed value takes 16
// bytes or more per element however short its text ("1," is two bytes), so
// bounding the count bounds the memory a body can make the parser allocate.
struct JsonBounds {
  int max_depth = kMaxJsonDepth;
  // Array elements plus object members (counted as separators and opened
  // containers); 0: no bound.
  size_t max_values = 0;
};

// The parsed value, or nullopt with `error` filled in.
std::optional<nlohmann::json> parseJson(std::string_view text, JsonParseError& error,
                                        JsonBounds bounds = {});
// The same, keeping object keys in the order the text gives them (for values
// handed on to code that shows them, such as chat templates).
std::optional<nlohmann::ordered_json> parseOrderedJson(std::string_view text, JsonParseError& error,
                                                       JsonBounds bounds = {});

// A configuration option's JSON object (--kv-transfer-config, ...), named
// `what` in the errors: InvalidArgument "<what> is not valid JSON (byte N):
// <detail>", "<what> must be a JSON object, got <type>" or "<what>: <path
// of a key> is given twice" (nlohmann would keep the last). No part of the
// text is shown (an option may carry a secret): `detail` leaves out the
// token nlohmann last read and the digits of a number out of range.
StatusOr<nlohmann::json> parseJsonObject(std::string_view text, std::string_view what);

// For answers of peers the caller only inspects: the value, or a discarded
// one (is_discarded()) when the text is not JSON or is outside `bounds`.
nlohmann::json parseJsonOrDiscarded(std::string_view text, JsonBounds bounds = {});

// The bounds check alone: nullopt when `text` keeps within `bounds` (whether
// or not it is valid JSON otherwise), else the error.
std::optional<JsonParseError> checkJsonBounds(std::string_view text, JsonBounds bounds);

}  // namespace tandem
