// Number flags of tandem-operator's commands, checked as the files' number
// fields are and refused in the same words.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/decimal_text.h"
#include "operator/spec/cluster_spec.h"
#include "operator/spec/spec_reader.h"

namespace tandem {

// A number as the files and the agent's flags write one: decimal, with an
// optional sign, digits [. digits] [e|E [sign] digits] (no spaces, hex,
// "nan" or "inf", which CLI11's own conversion, strtod's, reads).
inline bool isDecimalNumberText(const std::string& text) {
  return scanDecimal(text, 0, {}) == text.size();
}

// A number flag in (or from) min to max (CLI11's Range prints its bounds
// with six decimals, lets NaN through, and PositiveNumber has no upper
// bound: a seconds flag of 1e300 overflowed the deadline it became).
inline CLI::Validator numberIn(double min, bool min_exclusive, double max) {
  const std::string accepted =
      "must be " + spec::numberRangeText(min, min_exclusive, max) + ", got ";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!isDecimalNumberText(text) || !CLI::detail::lexical_cast(text, value) ||
            !((min_exclusive ? value > min : value >= min) && value <= max)) {
          return accepted + text;
        }
        return {};
      },
      "");
}

// An integer flag from min to max: decimal digits with an optional sign,
// refused in the agent's words (text that is no integer quoted; CLI11's
// Range printed the largest double in full, and its conversion read 0x10).
inline CLI::Validator integerIn(int64_t min, int64_t max = spec::kNoMax) {
  const std::string accepted = "must be " + spec::integerRangeText(min, max) + ", got ";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const bool integer = isDecimalInteger(text);
        // from_chars takes a '-' but no '+'.
        const std::string_view digits =
            text.starts_with('+') ? std::string_view(text).substr(1) : std::string_view(text);
        int64_t value = 0;
        const char* end = digits.data() + digits.size();
        const auto [at, error] = std::from_chars(digits.data(), end, value);
        if (!integer || error != std::errc() || at != end || value < min || value > max) {
          return accepted + (integer ? text : "\"" + text + "\"");
        }
        return {};
      },
      "");
}

// A seconds flag: positive and at most a day, as the files' seconds fields.
inline CLI::Validator positiveSeconds() { return numberIn(0, true, spec::kMaxSeconds); }

}  // namespace tandem
