// The random parts of `tandem-bench multiturn`'s workload, as pure functions
// of a seed or a generator: which shared prefix each conversation starts with
// (a Zipf draw over prefix groups), Poisson arrival times, and the --arrival
// option. The same inputs give the same outputs on every run, so every
// routing policy compared sees the same plan.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tandem::bench {

// Zipf(s) over n groups: group k (0-based) is drawn with probability
// proportional to 1 / (k + 1)^s; s = 0 is uniform. Draws take one 64-bit
// number from the generator each, so they are the same on every platform.
class ZipfDistribution {
 public:
  // Throws tandem::Error unless n >= 1 and s is finite and >= 0.
  ZipfDistribution(int n, double s);
  int operator()(std::mt19937_64& rng) const;
  int size() const { return static_cast<int>(cumulative_.size()); }

 private:
  std::vector<double> cumulative_;  // P(group <= k), the last exactly 1
};

// The prefix group of each of `conversations` conversations, drawn from
// Zipf(s) over `groups` with a generator of its own seeded from `seed`, so
// adding groups changes no turn's tokens.
std::vector<int> conversationGroups(int conversations, int groups, double s, uint64_t seed);

// The generator the prefixes of groups 1.. are drawn from (group 0's is the
// plan's single shared prefix, drawn as without groups), apart from the
// plan's main one and from conversationGroups'.
std::mt19937_64 groupPrefixGenerator(uint64_t seed);

// `count` arrival times in seconds of a Poisson process of `rate` per second:
// exponential gaps with mean 1 / rate, the first at 0.
std::vector<double> poissonArrivals(double rate, size_t count, std::mt19937_64& rng);

// --arrival: "closed" (clients send as they become free) or "poisson:RATE"
// (open loop at RATE requests/s).
struct ArrivalSpec {
  bool open_loop = false;
  double rate = 0.0;  // requests/s; open loop only
  // Parses `text`; throws tandem::Error naming --arrival and what it accepts.
  static ArrivalSpec parse(const std::string& text);
  std::string text() const;
};

}  // namespace tandem::bench
