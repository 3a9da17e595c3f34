#include "common/decimal_text.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace tandem {

size_t scanDecimal(std::string_view text, size_t at, DecimalForm form) {
  auto digits = [&](size_t i) {
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i;
  };
  size_t i = at;
  if (form.signed_ && i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  const size_t whole_end = digits(i);
  const bool whole = whole_end > i;
  i = whole_end;
  if (i < text.size() && text[i] == '.') {
    const size_t fraction_end = digits(i + 1);
    const bool fraction = fraction_end > i + 1;
    if (fraction || (whole && !form.fraction_digits)) {
      i = fraction_end;
    } else if (!whole) {
      return std::string_view::npos;
    }
  } else if (!whole) {
    return std::string_view::npos;
  }
  if (form.exponent && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    size_t j = i + 1;
    if (form.exponent_sign && j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
    const size_t exponent_end = digits(j);
    if (exponent_end > j) i = exponent_end;
  }
  return i;
}

bool isDecimalInteger(std::string_view text) {
  return scanDecimal(text, 0, DecimalForm{.exponent = false}) == text.size() &&
         text.find('.') == std::string_view::npos;
}

std::optional<int64_t> byteSizeOf(std::string_view text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;  // ".5" too
  const size_t end = scanDecimal(
      text, 0, DecimalForm{.signed_ = false, .fraction_digits = true, .exponent_sign = false});
  if (end == std::string_view::npos) return std::nullopt;
  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},         {"B", 1},        {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30},
      {"TiB", 0x1p40}, {"PiB", 0x1p50}, {"K", 0x1p10},   {"M", 0x1p20},   {"G", 0x1p30},
      {"T", 0x1p40},   {"P", 0x1p50},   {"Ki", 0x1p10},  {"Mi", 0x1p20},  {"Gi", 0x1p30},
      {"Ti", 0x1p40},  {"Pi", 0x1p50},  {"KB", 1e3},     {"MB", 1e6},     {"GB", 1e9},
      {"TB", 1e12},    {"PB", 1e15}};
  const std::string_view unit = text.substr(end);
  double scale = 0;
  for (const Unit& candidate : kUnits) {
    if (unit == candidate.name) scale = candidate.scale;
  }
  if (scale == 0) return std::nullopt;
  // strtod on what the scan took: a plain decimal, perhaps past a double's
  // range (1e400 is inf, refused below).
  const double value = std::strtod(std::string(text.substr(0, end)).c_str(), nullptr);
  const double bytes = value * scale;
  if (scale == 1 && value != std::floor(value)) return std::nullopt;  // a fraction of a byte
  if (!(bytes >= 1) || !(bytes <= static_cast<double>(kMaxByteSize))) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

}  // namespace tandem
