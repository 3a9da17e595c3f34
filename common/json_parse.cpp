#include "common/json_parse.h"

#include <algorithm>
#include <vector>

namespace tandem {
namespace {

std::string withoutPrefix(const char* what) {
  std::string detail = what;
  if (const size_t end = detail.find("] "); detail.starts_with("[json.") && end != detail.npos) {
    detail.erase(0, end + 2);
  }
  return detail;
}

// One open array or object while scanning.
struct Frame {
  bool object = false;
  bool expect_key = false;  // object: the next string is a key
  size_t index = 0;         // array: elements before the current one
  std::string key;          // object: the current key (its first bytes)
};

// Path steps shown before "…", and bytes of a key shown.
constexpr size_t kPathSteps = 6;
constexpr size_t kKeyBytes = 40;

std::string pathOf(const std::vector<Frame>& frames) {
  std::string path;
  const size_t steps = std::min(frames.size(), kPathSteps);
  for (size_t i = 0; i < steps; ++i) {
    const Frame& frame = frames[i];
    if (frame.object) {
      if (!path.empty()) path += '.';
      path += frame.key;
    } else {
      path += '[' + std::to_string(frame.index) + ']';
    }
  }
  if (frames.size() > steps) path += "…";
  return path;
}

template <typename Json>
std::optional<Json> parseAs(std::string_view text, JsonParseError& error, JsonBounds bounds) {
  if (auto outside = checkJsonBounds(text, bounds)) {
    error = std::move(*outside);
    return std::nullopt;
  }
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    error = JsonParseError{};
    error.byte = e.byte;
    error.detail = withoutPrefix(e.what());
  } catch (const nlohmann::json::exception& e) {
    error = JsonParseError{};
    error.detail = withoutPrefix(e.what());
  }
  return std::nullopt;
}

}  // namespace

std::optional<JsonParseError> checkJsonBounds(std::string_view text, JsonBounds bounds) {
  const int max_depth = bounds.max_depth;
  size_t values = 0;
  auto tooMany = [&](size_t at) {
    JsonParseError error;
    error.byte = at;
    error.value_limit = bounds.max_values;
    error.detail = "more than " + std::to_string(bounds.max_values) + " values";
    return error;
  };
  std::vector<Frame> frames;
  frames.reserve(16);
  for (size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    switch (c) {
      case '"': {
        // A string: skip to its closing quote; keep it when it is a key.
        const size_t start = at + 1;
        size_t end = start;
        while (end < text.size() && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
        if (!frames.empty() && frames.back().object && frames.back().expect_key) {
          frames.back().key.assign(
              text.substr(start, std::min(end, text.size()) - start).substr(0, kKeyBytes));
          frames.back().expect_key = false;
        }
        at = end;
        break;
      }
      case '{':
      case '[': {
        if (bounds.max_values > 0 && ++values > bounds.max_values) return tooMany(at);
        if (static_cast<int>(frames.size()) >= max_depth) {
          JsonParseError error;
          error.byte = at;
          error.depth_limit = max_depth;
          error.path = pathOf(frames);
          if (!frames.empty() && frames.front().object) error.top_key = frames.front().key;
          error.detail = "nesting deeper than " + std::to_string(max_depth) + " levels" +
                         (error.path.empty() ? "" : " at " + error.path);
          return error;
        }
        Frame frame;
        frame.object = c == '{';
        frame.expect_key = frame.object;
        frames.push_back(std::move(frame));
        break;
      }
      case '}':
      case ']':
        if (!frames.empty()) frames.pop_back();
        break;
      case ',':
        if (bounds.max_values > 0 && ++values > bounds.max_values) return tooMany(at);
        if (!frames.empty()) {
          Frame& frame = frames.back();
          if (frame.object) {
            frame.expect_key = true;
          } else {
            ++frame.index;
          }
        }
        break;
      default:
        break;
    }
  }
  return std::nullopt;
}

std::optional<nlohmann::json> parseJson(std::string_view text, JsonParseError& error,
                                        JsonBounds bounds) {
  return parseAs<nlohmann::json>(text, error, bounds);
}

std::optional<nlohmann::ordered_json> parseOrderedJson(std::string_view text, JsonParseError& error,
                                                       JsonBounds bounds) {
  return parseAs<nlohmann::ordered_json>(text, error, bounds);
}

nlohmann::json parseJsonOrDiscarded(std::string_view text, JsonBounds bounds) {
  JsonParseError error;
  std::optional<nlohmann::json> value = parseJson(text, error, bounds);
  if (!value) return nlohmann::json(nlohmann::json::value_t::discarded);
  return std::move(*value);
}

}  // namespace tandem
