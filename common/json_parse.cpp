#include "common/json_parse.h"

namespace tandem {
namespace {

std::string withoutPrefix(const char* what) {
  std::string detail = what;
  if (const size_t end = detail.find("] "); detail.starts_with("[json.") && end != detail.npos) {
    detail.erase(0, end + 2);
  }
  return detail;
}

}  // namespace

namespace {

template <typename Json>
std::optional<Json> parseAs(std::string_view text, JsonParseError& error) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    error = {e.byte, withoutPrefix(e.what())};
  } catch (const nlohmann::json::exception& e) {
    error = {0, withoutPrefix(e.what())};
  }
  return std::nullopt;
}

}  // namespace

std::optional<nlohmann::json> parseJson(std::string_view text, JsonParseError& error) {
  return parseAs<nlohmann::json>(text, error);
}

std::optional<nlohmann::ordered_json> parseOrderedJson(std::string_view text,
                                                       JsonParseError& error) {
  return parseAs<nlohmann::ordered_json>(text, error);
}

}  // namespace tandem
