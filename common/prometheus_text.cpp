#include "common/prometheus_text.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace tandem {

namespace {

// Calls visit(value) with the value field of each sample line of `name`
// whose line contains label_filter, in order, until it returns false.
template <typename Visit>
void forEachSample(std::string_view text, std::string_view name, std::string_view label_filter,
                   Visit visit) {
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.starts_with(name) || line.size() == name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    if (!label_filter.empty() && line.find(label_filter) == std::string_view::npos) continue;
    // After the labels (whose values may hold spaces) come the value and an
    // optional timestamp.
    size_t rest = name.size();
    if (next == '{') {
      rest = line.rfind('}');
      if (rest == std::string_view::npos) continue;
      ++rest;
    }
    std::string_view fields = line.substr(rest);
    while (fields.starts_with(' ')) fields.remove_prefix(1);
    if (!visit(prometheusValue(fields.substr(0, fields.find(' '))))) return;
  }
}

}  // namespace

std::optional<double> prometheusSample(std::string_view text, std::string_view name,
                                       std::string_view label_filter) {
  std::optional<double> first;
  forEachSample(text, name, label_filter, [&](std::optional<double> value) {
    first = value;
    return false;
  });
  return first;
}

std::optional<double> prometheusSum(std::string_view text, std::string_view name,
                                    std::string_view label_filter) {
  std::optional<double> sum;
  forEachSample(text, name, label_filter, [&](std::optional<double> value) {
    if (value) sum = sum.value_or(0) + *value;
    return true;
  });
  return sum;
}

std::optional<std::string> PrometheusSampleLine::label(std::string_view key) const {
  for (const auto& [name, value] : labels) {
    if (name == key) return value;
  }
  return std::nullopt;
}

std::optional<PrometheusSampleLine> parsePrometheusSampleLine(std::string_view line) {
  PrometheusSampleLine sample;
  size_t pos = line.find_first_of("{ ");
  if (pos == std::string_view::npos || pos == 0) return std::nullopt;
  sample.name = line.substr(0, pos);
  if (line[pos] == '{') {
    ++pos;
    while (true) {
      while (pos < line.size() && (line[pos] == ' ' || line[pos] == ',')) ++pos;
      if (pos >= line.size()) return std::nullopt;
      if (line[pos] == '}') {
        ++pos;
        break;
      }
      const size_t equals = line.find('=', pos);
      if (equals == std::string_view::npos || equals + 1 >= line.size() || line[equals + 1] != '"')
        return std::nullopt;
      std::string key(line.substr(pos, equals - pos));
      std::string value;
      pos = equals + 2;
      bool closed = false;
      while (pos < line.size()) {
        const char c = line[pos++];
        if (c == '\\' && pos < line.size()) {
          const char escaped = line[pos++];
          value += escaped == 'n' ? '\n' : escaped;
        } else if (c == '"') {
          closed = true;
          break;
        } else {
          value += c;
        }
      }
      if (!closed) return std::nullopt;
      sample.labels.emplace_back(std::move(key), std::move(value));
    }
  }
  std::string_view rest = line.substr(pos);
  while (rest.starts_with(' ')) rest.remove_prefix(1);
  const std::optional<double> value = prometheusValue(rest.substr(0, rest.find(' ')));
  if (!value) return std::nullopt;
  sample.value = *value;
  return sample;
}

// "NaN", "+Inf" and "-Inf" are valid sample values; strtod reads them all.
std::optional<double> prometheusValue(std::string_view field) {
  const std::string text(field);
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) return std::nullopt;
  return value;
}

}  // namespace tandem
