// "Did you mean" for a misspelt name: a configuration key, an option.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// The closest of `candidates` to `word` by edit distance, or "" when none
// is close enough to be a typo of it (a few edits, fewer than half the word).
std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace tandem
