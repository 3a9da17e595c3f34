#include "common/prometheus_text.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace tandem {

std::optional<double> prometheusSample(std::string_view text, std::string_view name,
                                       std::string_view label_filter) {
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
    return prometheusValue(fields.substr(0, fields.find(' ')));
  }
  return std::nullopt;
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
