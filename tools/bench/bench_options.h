// Command-line values shared by tandem-bench's load generators: the range of
// prompt token ids, distributions of token counts, and number formatting for
// messages. Every parser throws tandem::Error naming the option and what it
// accepts.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>

namespace tandem::bench {

// Shortest exact form: "4" or "0.5" rather than std::to_string's "4.000000".
std::string numberText(double value);

// "LO:HI" with 0 <= LO < HI: prompt token ids are drawn from [LO, HI).
std::pair<int32_t, int32_t> parseVocabRange(const std::string& text);

// A distribution of token counts, one of
//   constant:N           always N (N >= 1)
//   uniform:A,B          an integer uniform in [A, B], both included (1 <= A <= B)
//   lognormal:MEAN,SIGMA round(X), at least 1, where X is log-normal with mean
//                        MEAN (> 0) and ln X has standard deviation SIGMA
//                        (>= 0), so ln X ~ Normal(ln MEAN - SIGMA²/2, SIGMA)
// Sampling is deterministic for a given generator state.
class TokenCountDistribution {
 public:
  // Parses `spec`; errors name `option` (e.g. "--input-tokens").
  static TokenCountDistribution parse(const std::string& spec, const std::string& option);

  int64_t sample(std::mt19937_64& rng) const;
  // The canonical spec, such as "uniform:64,128".
  std::string text() const;

 private:
  enum class Kind { kConstant, kUniform, kLognormal };
  Kind kind_ = Kind::kConstant;
  double first_ = 1.0;   // N, A or MEAN
  double second_ = 0.0;  // B or SIGMA
};

}  // namespace tandem::bench
