// How `tandem-bench multiturn --cluster-file` orders and summarises repeated
// runs of several routing policies: the policy order of each round, the
// median and range of a figure over rounds, a policy against the best of the
// others, and how evenly requests spread over agents. Pure functions.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

// The order the policies run in round `round` (0-based): `policies` rotated
// left by round mod size, so round 0 is a,b,c; round 1 b,c,a; round 2 c,a,b.
std::vector<std::string> roundOrder(const std::vector<std::string>& policies, size_t round);

// The median (the mean of the middle two for an even count), smallest and
// largest of a figure's values; nullopt for no values.
struct Spread {
  double median = 0.0, min = 0.0, max = 0.0;
  size_t count = 0;
};
std::optional<Spread> spreadOf(std::vector<double> values);

// One policy's figure against the best of the others' (the lowest when
// lower is better, else the highest): ratio = mine / best. nullopt when
// `policy` has no value, no other policy has one, or the best is 0.
struct VersusBest {
  std::string best_other;
  double ratio = 0.0;
};
std::optional<VersusBest> versusBestOther(const std::map<std::string, double>& values,
                                          const std::string& policy, bool lower_is_better);

// The largest count ÷ the mean count: 1 when perfectly even, n when one of
// n agents took everything. nullopt for no agents or no requests.
std::optional<double> maxOverMean(const std::vector<double>& counts);

}  // namespace tandem::bench
