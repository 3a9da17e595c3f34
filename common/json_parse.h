// Parsing JSON text without letting nlohmann's exceptions out: a syntax error
// and a number beyond the range of a double (1e400, which nlohmann reports as
// out_of_range rather than parse_error) both come back as a JsonParseError.
// Every caller that turns a user's JSON into a value goes through here, so no
// input can escape as an exception from a function that returns a Status.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

struct JsonParseError {
  // Byte position nlohmann reports for a syntax error (1-based); 0 when the
  // error has no position (a number out of range).
  size_t byte = 0;
  // nlohmann's message without its "[json.exception.…] " prefix, e.g.
  // "parse error at line 1, column 2: syntax error while parsing value - …"
  // or "number overflow parsing '1e400'".
  std::string detail;
};

// The parsed value, or nullopt with `error` filled in.
std::optional<nlohmann::json> parseJson(std::string_view text, JsonParseError& error);
// The same, keeping object keys in the order the text gives them (for values
// handed on to code that shows them, such as chat templates).
std::optional<nlohmann::ordered_json> parseOrderedJson(std::string_view text,
                                                       JsonParseError& error);

}  // namespace tandem
