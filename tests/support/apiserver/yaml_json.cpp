#include "tests/support/apiserver/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <stdexcept>

namespace tandem::testing {
namespace {

nlohmann::json plainScalar(const std::string& text) {
  static const std::regex kInteger("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?([0-9]+\\.[0-9]*|\\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?");
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return nullptr;
  }
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (std::regex_match(text, kInteger)) {
    errno = 0;
    long long value = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == 0) return value;
  }
  if (std::regex_match(text, kFloat)) return std::strtod(text.c_str(), nullptr);
  return text;
}

nlohmann::json convert(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) object[entry.first.as<std::string>()] = convert(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node) array.push_back(convert(item));
      return array;
    }
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return node.Scalar();
      return plainScalar(node.Scalar());
    default:
      return nullptr;
  }
}

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

nlohmann::json yamlToJson(const std::string& text) {
  try {
    return convert(YAML::Load(text));
  } catch (const YAML::Exception& error) {
    throw std::runtime_error(error.what());
  }
}

std::vector<nlohmann::json> yamlDocumentsToJson(const std::string& text) {
  std::vector<nlohmann::json> documents;
  try {
    for (const YAML::Node& node : YAML::LoadAll(text)) {
      nlohmann::json document = convert(node);
      if (!document.is_null()) documents.push_back(std::move(document));
    }
  } catch (const YAML::Exception& error) {
    throw std::runtime_error(error.what());
  }
  return documents;
}

std::string base64Encode(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t word = (static_cast<uint8_t>(bytes[i]) << 16) |
                    (static_cast<uint8_t>(bytes[i + 1]) << 8) | static_cast<uint8_t>(bytes[i + 2]);
    for (int shift = 18; shift >= 0; shift -= 6) out.push_back(kAlphabet[(word >> shift) & 63]);
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t word = static_cast<uint8_t>(bytes[i]) << 16;
    if (rest == 2) word |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out.push_back(kAlphabet[(word >> 18) & 63]);
    out.push_back(kAlphabet[(word >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(word >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string base64Decode(const std::string& text, bool& ok) {
  ok = false;
  std::string out;
  uint32_t word = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const char* at = std::strchr(kAlphabet, c);
    if (at == nullptr || c == '\0') return "";
    word = (word << 6) | static_cast<uint32_t>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((word >> bits) & 0xff));
    }
  }
  ok = true;
  return out;
}

}  // namespace tandem::testing
