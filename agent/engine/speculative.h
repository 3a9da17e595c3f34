// Speculative decoding by n-gram prompt lookup (docs/speculative-decoding.md).
//
// Each decode step, a sequence whose last tokens already occurred earlier
// in its prompt or output proposes the tokens that followed them there as
// drafts. The engine computes the last token and the drafts in one chunk and
// samples the rows in order, each exactly as a plain decode step would
// (the same logits bits: the kernels are batch- and chunk-invariant; the
// same sampler state: penalties, masks and structured outputs advance with
// each token emitted; the same draw: a pure function of seed and step). A
// draft is kept while the token sampled at its position equals it; the first
// token that differs is emitted in its place and ends the step. So the
// answer is the one decoding without speculation gives, token for token,
// greedy or sampled, and only the number of steps changes.
//
// SpeculativeConfig::parse reads vLLM's --speculative-config JSON for its
// ngram method.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/protocol/request.h"
#include "common/status.h"

namespace tandem::engine {

// Bounds of the configuration, for the docs and the tests.
inline constexpr int32_t kMaxSpeculativeTokens = 64;
inline constexpr int32_t kMaxPromptLookup = 64;

struct SpeculativeConfig {
  // Drafts proposed per sequence and step at most; 0: no speculation.
  int32_t num_speculative_tokens = 0;
  // The n-gram lengths looked up: the longest suffix of the sequence within
  // [min, max] that occurred before.
  int32_t prompt_lookup_min = 5;
  int32_t prompt_lookup_max = 5;
  // vLLM's: no drafts in a step while at least this many sequences run
  // (a large batch already keeps the machine busy); at least 2; 0: always.
  int64_t disable_by_batch_size = 0;

  bool enabled() const { return num_speculative_tokens > 0; }

  // vLLM's --speculative-config: {"method": "ngram", "num_speculative_tokens":
  // k, "prompt_lookup_max": n, "prompt_lookup_min": m,
  // "disable_by_batch_size": b} ("model": "[ngram]" names the method as
  // older vLLM did). Without either lookup bound both are 5; with one, the
  // other takes its value. Another method, an unknown field or a value out
  // of range is refused naming it; messages start "speculative-config".
  static StatusOr<SpeculativeConfig> parse(const std::string& json_text);
};

// Prompt lookup: finds the longest n-gram (prompt_lookup_min <= n <=
// prompt_lookup_max) ending `tokens` that also occurs earlier in `tokens`,
// at its latest such occurrence, and writes into `draft` the `max_tokens`
// tokens that followed it, as an overlapping copy: where `tokens` ends, the
// draft goes on copying itself (the match one period of a cycle back
// continues the cycle). `draft` is empty when nothing matches. O(tokens × prompt_lookup_max) at
// worst; a position whose token differs from the last costs one comparison.
void proposeNgramDraft(std::span<const TokenId> tokens, const SpeculativeConfig& config,
                       int64_t max_tokens, std::vector<TokenId>& draft);

}  // namespace tandem::engine
