// Number flags of tandem-operator's commands, checked as the files' number
// fields are and refused in the same words.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "operator/spec/cluster_spec.h"

namespace tandem {

// A number flag in (or from) min to max (CLI11's Range prints its bounds
// with six decimals, and PositiveNumber has no upper bound: a seconds flag of
// 1e300 overflowed the deadline it became).
inline CLI::Validator numberIn(double min, bool min_exclusive, double max) {
  const std::string accepted =
      "must be " + spec::numberRangeText(min, min_exclusive, max) + ", got ";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) ||
            !((min_exclusive ? value > min : value >= min) && value <= max)) {
          return accepted + text;
        }
        return {};
      },
      "");
}

// A seconds flag: positive and at most a day, as the files' seconds fields.
inline CLI::Validator positiveSeconds() { return numberIn(0, true, spec::kMaxSeconds); }

}  // namespace tandem
