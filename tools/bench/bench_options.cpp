#include "tools/bench/bench_options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

#include "common/status.h"

namespace tandem::bench {
namespace {

// The whole of `text` as an integer, or nothing.
std::optional<long long> wholeInteger(const std::string& text) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The whole of `text` as a finite number, or nothing.
std::optional<double> wholeNumber(const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size() && std::isfinite(value)) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1) {
    parts.push_back(text.substr(start, comma - start));
  }
  parts.push_back(text.substr(start));
  return parts;
}

}  // namespace

std::string numberText(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

std::pair<int32_t, int32_t> parseVocabRange(const std::string& text) {
  const size_t colon = text.find(':');
  long long low = -1, high = -1;
  if (colon != std::string::npos) {
    try {
      size_t used_low = 0, used_high = 0;
      low = std::stoll(text.substr(0, colon), &used_low);
      high = std::stoll(text.substr(colon + 1), &used_high);
      if (used_low != colon || used_high != text.size() - colon - 1) low = high = -1;
    } catch (const std::exception&) {
      low = high = -1;
    }
  }
  if (low < 0 || high <= low || high > std::numeric_limits<int32_t>::max()) {
    throw Error("--vocab-range must be LO:HI with 0 <= LO < HI (token ids drawn from [LO, HI)), " +
                std::string("got \"") + text + "\"");
  }
  return {static_cast<int32_t>(low), static_cast<int32_t>(high)};
}

TokenCountDistribution TokenCountDistribution::parse(const std::string& spec,
                                                     const std::string& option) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::vector<std::string> args =
      colon == std::string::npos ? std::vector<std::string>{} : splitCommas(spec.substr(colon + 1));
  constexpr long long kMaxCount = 1 << 24;
  TokenCountDistribution d;
  bool valid = false;
  if (kind == "constant" && args.size() == 1) {
    const auto n = wholeInteger(args[0]);
    valid = n && *n >= 1 && *n <= kMaxCount;
    d.kind_ = Kind::kConstant;
    d.first_ = valid ? static_cast<double>(*n) : 0.0;
  } else if (kind == "uniform" && args.size() == 2) {
    const auto low = wholeInteger(args[0]), high = wholeInteger(args[1]);
    valid = low && high && *low >= 1 && *low <= *high && *high <= kMaxCount;
    d.kind_ = Kind::kUniform;
    if (valid) {
      d.first_ = static_cast<double>(*low);
      d.second_ = static_cast<double>(*high);
    }
  } else if (kind == "lognormal" && args.size() == 2) {
    const auto mean = wholeNumber(args[0]), sigma = wholeNumber(args[1]);
    valid = mean && sigma && *mean > 0.0 && *mean <= kMaxCount && *sigma >= 0.0 && *sigma <= 10.0;
    d.kind_ = Kind::kLognormal;
    if (valid) {
      d.first_ = *mean;
      d.second_ = *sigma;
    }
  }
  if (!valid) {
    throw Error(option +
                " takes constant:N, uniform:A,B or lognormal:MEAN,SIGMA with whole token counts "
                "1 <= N, 1 <= A <= B, MEAN > 0 and 0 <= SIGMA <= 10, got \"" +
                spec + "\"");
  }
  return d;
}

int64_t TokenCountDistribution::sample(std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kConstant:
      return static_cast<int64_t>(first_);
    case Kind::kUniform:
      return std::uniform_int_distribution<int64_t>(static_cast<int64_t>(first_),
                                                    static_cast<int64_t>(second_))(rng);
    case Kind::kLognormal: {
      // E[X] = exp(mu + sigma²/2), so this mu makes MEAN the mean of X.
      const double mu = std::log(first_) - second_ * second_ / 2.0;
      const double x = std::lognormal_distribution<double>(mu, second_)(rng);
      return std::max<int64_t>(1, std::llround(std::min(x, 1e15)));
    }
  }
  return 1;
}

std::string TokenCountDistribution::text() const {
  switch (kind_) {
    case Kind::kConstant:
      return "constant:" + std::to_string(static_cast<long long>(first_));
    case Kind::kUniform:
      return "uniform:" + std::to_string(static_cast<long long>(first_)) + "," +
             std::to_string(static_cast<long long>(second_));
    case Kind::kLognormal: {
      char text[64];
      std::snprintf(text, sizeof(text), "lognormal:%.10g,%.10g", first_, second_);
      return text;
    }
  }
  return "";
}

}  // namespace tandem::bench
