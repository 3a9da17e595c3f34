#include "agent/engine/simulation/simulated_tokens.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::engine {
namespace {

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool printableAscii(const std::string& bytes) {
  return !bytes.empty() &&
         std::all_of(bytes.begin(), bytes.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

}  // namespace

TokenChooser::TokenChooser(const Tokenizer& tokenizer, int64_t vocab_size,
                           const std::vector<TokenId>& end_ids) {
  const int64_t limit = std::min(vocab_size, tokenizer.vocabSize());
  std::vector<TokenId> plain;
  std::vector<TokenId> any;
  for (int64_t i = 0; i < limit; ++i) {
    const auto id = static_cast<TokenId>(i);
    if (tokenizer.isSpecial(id) || !tokenizer.idToToken(id)) continue;
    if (std::find(end_ids.begin(), end_ids.end(), id) != end_ids.end()) continue;
    any.push_back(id);
    if (printableAscii(tokenizer.tokenBytes(id))) plain.push_back(id);
  }
  candidates_ = plain.empty() ? std::move(any) : std::move(plain);
  TANDEM_CHECK(!candidates_.empty(), "the vocabulary has no token a simulated agent can emit");
}

TokenChooser::TokenChooser(std::vector<TokenId> candidates) : candidates_(std::move(candidates)) {
  std::sort(candidates_.begin(), candidates_.end());
  TANDEM_CHECK(!candidates_.empty(), "a token chooser needs candidates");
}

TokenId TokenChooser::next(SimulatedTokenState& state, std::span<const TokenId> tokens,
                           std::optional<uint64_t> seed, std::span<const TokenId> forbidden) const {
  if (!state.started || state.absorbed > tokens.size()) {
    state.hash = mix(seed ? *seed ^ 0x5eed5eed5eed5eedULL : 0);
    state.absorbed = 0;
    state.started = true;
  }
  for (; state.absorbed < tokens.size(); ++state.absorbed) {
    state.hash = mix(state.hash ^ static_cast<uint32_t>(tokens[state.absorbed]));
  }
  size_t index = static_cast<size_t>(mix(state.hash) % candidates_.size());
  // At most every candidate once: a request cannot forbid them all and still
  // be valid, but never loop forever.
  for (size_t tried = 0; tried < candidates_.size(); ++tried) {
    const TokenId token = candidates_[index];
    if (std::find(forbidden.begin(), forbidden.end(), token) == forbidden.end()) return token;
    index = (index + 1) % candidates_.size();
  }
  return candidates_[index];
}

TokenId TokenChooser::alternative(TokenId token, size_t offset) const {
  auto it = std::lower_bound(candidates_.begin(), candidates_.end(), token);
  const size_t at = it == candidates_.end() ? 0 : static_cast<size_t>(it - candidates_.begin());
  return candidates_[(at + offset) % candidates_.size()];
}

}  // namespace tandem::engine
