#include "common/json_parse.h"

#include <algorithm>
#include <optional>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <utility>
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

// Builds an ordered_json from SAX events in time linear in the text.
// ordered_json's own parser inserts each member through ordered_map's
// operator[], a linear search of the members so far: an object of n
// members costs n^2 / 2 key comparisons (100,000 members, 1 MB of text,
// took 9 s). Here members are appended; an object past a few members gets
// an index of its keys, so a repeated key is found at once (it keeps its
// first position and takes the last value, as nlohmann's parser does).
class OrderedBuilder {
 public:
  using Json = nlohmann::ordered_json;

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool value) { return put(Json(value)); }
  bool number_integer(Json::number_integer_t value) { return put(Json(value)); }
  bool number_unsigned(Json::number_unsigned_t value) { return put(Json(value)); }
  bool number_float(Json::number_float_t value, const std::string& /*text*/) {
    return put(Json(value));
  }
  bool string(Json::string_t& value) { return put(Json(std::move(value))); }
  bool binary(Json::binary_t& value) { return put(Json::binary(std::move(value))); }
  bool start_object(std::size_t /*size*/) {
    Json* object = open(Json(Json::value_t::object));
    stack_.push_back({object, {}});
    return true;
  }
  bool key(Json::string_t& key) {
    Frame& frame = stack_.back();
    auto& members = static_cast<Members&>(frame.value->get_ref<Json::object_t&>());
    if (members.size() >= kIndexFrom && frame.index.empty()) {
      for (size_t i = 0; i < members.size(); ++i) frame.index.emplace(members[i].first, i);
    }
    std::optional<size_t> existing;
    if (!frame.index.empty()) {
      if (auto it = frame.index.find(key); it != frame.index.end()) existing = it->second;
    } else {
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].first == key) existing = i;
      }
    }
    if (existing) {
      members[*existing].second = nullptr;
      slot_ = &members[*existing].second;
      return true;
    }
    if (!frame.index.empty()) frame.index.emplace(key, members.size());
    members.emplace_back(std::move(key), nullptr);
    slot_ = &members.back().second;
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*size*/) {
    Json* array = open(Json(Json::value_t::array));
    stack_.push_back({array, {}});
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    error_ = JsonParseError{};
    const auto* parse = dynamic_cast<const nlohmann::detail::parse_error*>(&e);
    error_->byte = parse != nullptr ? parse->byte : position;
    error_->detail = withoutPrefix(e.what());
    return false;
  }

  Json take() { return std::move(root_); }
  // Set when the text was not JSON.
  const std::optional<JsonParseError>& error() const { return error_; }

 private:
  using Members = std::vector<std::pair<const std::string, Json>>;
  static constexpr size_t kIndexFrom = 16;  // members before an object gets an index
  struct Frame {
    Json* value;
    std::unordered_map<std::string, size_t> index;  // objects past kIndexFrom members
  };

  // Where the next value goes: the root, the next array element, or the
  // member whose key was just read.
  Json* open(Json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& container = *stack_.back().value;
    if (container.is_array()) {
      container.get_ref<Json::array_t&>().push_back(std::move(value));
      return &container.get_ref<Json::array_t&>().back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  bool put(Json value) {
    open(std::move(value));
    return true;
  }

  Json root_;
  std::vector<Frame> stack_;
  Json* slot_ = nullptr;
  std::optional<JsonParseError> error_;
};

template <typename Json>
std::optional<Json> parseAs(std::string_view text, JsonParseError& error, JsonBounds bounds) {
  if (auto outside = checkJsonBounds(text, bounds)) {
    error = std::move(*outside);
    return std::nullopt;
  }
  try {
    if constexpr (std::is_same_v<Json, nlohmann::ordered_json>) {
      OrderedBuilder builder;
      if (!Json::sax_parse(text, &builder)) {
        error = builder.error().value_or(JsonParseError{});
        return std::nullopt;
      }
      return builder.take();
    } else {
      return Json::parse(text);
    }
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

namespace {

// The path of the first key given twice in one object of `text` (already
// parsed once, so well-formed and within the nesting bound), or nullopt:
// "kv_connector_extra_config.connectors[0].kv_connector_extra_config.secret".
// nlohmann keeps the last of the two silently.
std::optional<std::string> firstRepeatedKey(std::string_view text) {
  struct Level {
    bool object = false;
    std::set<std::string> keys;
    std::string key;   // object: the current key
    size_t index = 0;  // array: elements before the current one
  };
  std::vector<Level> levels;
  std::optional<std::string> repeated;
  auto path = [&levels](const std::string& last) {
    std::string text;
    for (size_t i = 0; i + 1 < levels.size(); ++i) {
      const Level& level = levels[i];
      text += level.object ? (text.empty() ? "" : ".") + level.key
                           : "[" + std::to_string(level.index) + "]";
    }
    return text + (text.empty() ? "" : ".") + last;
  };
  auto element_done = [&levels] {
    if (!levels.empty() && !levels.back().object) ++levels.back().index;
  };
  using Event = nlohmann::json::parse_event_t;
  nlohmann::json::parser_callback_t callback = [&](int, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
        levels.push_back({true, {}, {}, 0});
        break;
      case Event::array_start:
        levels.push_back({false, {}, {}, 0});
        break;
      case Event::key: {
        Level& level = levels.back();
        std::string key = parsed.get<std::string>();
        if (!level.keys.insert(key).second && !repeated) repeated = path(key);
        level.key = std::move(key);
        break;
      }
      case Event::object_end:
      case Event::array_end:
        levels.pop_back();
        element_done();
        break;
      case Event::value:
        element_done();
        break;
    }
    return true;
  };
  try {
    nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // parsed once already: not reached
  }
  return repeated;
}

}  // namespace

StatusOr<nlohmann::json> parseJsonObject(std::string_view text, std::string_view what) {
  JsonParseError error;
  std::optional<nlohmann::json> parsed = parseJson(text, error);
  if (!parsed) {
    // nlohmann ends a syntax error with the token it last read, which may be
    // a secret's unterminated string: the position says where instead.
    std::string detail = error.detail;
    if (const size_t last_read = detail.find("; last read: "); last_read != detail.npos) {
      detail.erase(last_read);
    }
    if (detail.starts_with("number overflow parsing ")) detail = "a number is out of range";
    const std::string where = error.byte > 0 ? " (byte " + std::to_string(error.byte) + ")" : "";
    return invalidArgument(std::string(what) + " is not valid JSON" + where + ": " + detail);
  }
  if (!parsed->is_object()) {
    return invalidArgument(std::string(what) + " must be a JSON object, got " +
                           std::string(parsed->type_name()));
  }
  // A key given twice is refused, as the pool files refuse it: nlohmann
  // keeps the last silently (two secrets, two capacities).
  if (const std::optional<std::string> repeated = firstRepeatedKey(text)) {
    return invalidArgument(std::string(what) + ": " + *repeated + " is given twice");
  }
  return std::move(*parsed);
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
