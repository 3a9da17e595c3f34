// The tokens a simulated agent emits instead of sampling a model's logits.
//
// Each token is a pure function of the sequence's tokens so far (prompt and
// generated) and the request's seed (when given): a 64-bit hash of them picks
// one of the vocabulary's plain-text tokens (ids whose bytes are printable
// ASCII; never a special or end-of-sequence token). The same request
// therefore gives the same tokens on every simulated agent, alone or batched,
// preempted, or transferred from a prefill agent. A pick that the caller
// forbids (stop token ids while the output is shorter than min_tokens) moves
// on to the next candidate.
//
// The hash is extended incrementally: a SimulatedTokenState remembers how
// many tokens it has absorbed, so a step costs only the tokens added since
// the previous one. TokenChooser is immutable after construction and may be
// shared between threads; a state belongs to one sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/protocol/request.h"
#include "common/tokenizer.h"

namespace tandem::engine {

struct SimulatedTokenState {
  uint64_t hash = 0;
  size_t absorbed = 0;  // tokens of the sequence folded into hash
  bool started = false;
};

class TokenChooser {
 public:
  // Candidates: ids below vocab_size that the tokenizer knows, are not
  // special, are not in `end_ids`, and whose bytes are printable ASCII. When
  // no id qualifies, every non-special id not in end_ids below vocab_size.
  TokenChooser(const Tokenizer& tokenizer, int64_t vocab_size, const std::vector<TokenId>& end_ids);
  // Candidates given directly (tests); must not be empty.
  explicit TokenChooser(std::vector<TokenId> candidates);

  // The next token of a sequence whose tokens so far are `tokens`. `state`
  // must have absorbed only a prefix of these same tokens (or be fresh).
  TokenId next(SimulatedTokenState& state, std::span<const TokenId> tokens,
               std::optional<uint64_t> seed, std::span<const TokenId> forbidden) const;
  // The candidate `offset` places after `token` (wrapping), for reporting
  // alternatives (logprobs).
  TokenId alternative(TokenId token, size_t offset) const;

  const std::vector<TokenId>& candidates() const { return candidates_; }

 private:
  std::vector<TokenId> candidates_;
};

}  // namespace tandem::engine
