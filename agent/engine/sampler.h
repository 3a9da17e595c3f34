// Picks the next token of one request from its logits row.
//
// Semantics follow vLLM (V1's sampler) / the OpenAI API. Per row, in this
// order:
//   1. logit_bias added;
//   2. repetition_penalty over every id in prompt + output (HF/vLLM: a
//      positive logit is divided by the penalty, any other multiplied);
//   3. frequency and presence penalties over output ids only:
//      logit -= frequency_penalty * count + presence_penalty * (count > 0);
//   4. while output.size() < min_tokens, the ids in `min_tokens_mask` (the
//      caller's choice: stop_token_ids and, unless ignore_eos, the EOS ids)
//      are set to -inf; so are the ids outside allowed_token_ids, the last
//      token of each of bad_words_ids whose other tokens end the output
//      (vLLM's bad_words: the output only, not the prompt), and the ids a
//      structured output does not allow (`allowed`);
//   5. temperature < kGreedyTemperature (0 in practice): argmax, ties to the
//      smallest id. Otherwise logits / temperature, then min-p (drop tokens
//      whose probability is below min_p times the largest), top-k (exactly k
//      tokens, ties broken by smaller id), top-p (the shortest prefix of the
//      probability-sorted survivors whose renormalized mass reaches top_p; at
//      least one token), and one draw from the renormalized remainder.
//
// Logprobs: as vLLM V1 by default ("raw_logprobs"), reported logprobs are the
// log-softmax of the raw model logits, before penalties, masking and
// temperature. They describe what the model predicted, not the distribution
// the token was drawn from, so a greedy token can have logprob < max and a
// masked token can still appear among the alternatives. `top` holds the
// params.logprobs best ids, best first, ties by smaller id; the chosen
// token's logprob is always set when logprobs were asked for (even with
// logprobs = 0, which yields an empty `top`).
//
// Reproducibility: the uniform draw for a request's step i (i =
// output.size()) is a pure function of (rng.seed, i), so a seeded request gets
// the same tokens whatever it was batched with, however often it was
// preempted and recomputed, and in whatever order rows are sampled. The
// exponentials go through kernels::softmax, whose ISA path is picked at run
// time, so bit-identical results are promised for one build on one kind of
// CPU; across CPUs a draw landing within rounding of a boundary may differ.
//
// A Sampler keeps scratch buffers between calls, so it is not thread-safe:
// use one per thread. It is cheap to build. Logits containing NaN are treated
// as -inf; if masking leaves no finite logit, the masks are ignored and the
// argmax of the raw logits is returned, among allowed_token_ids when given.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/protocol/request.h"
#include "common/status.h"

namespace tandem::engine {

// Below this temperature a request is sampled greedily (vLLM uses the same
// epsilon); dividing by a tinier temperature would overflow float logits.
inline constexpr float kGreedyTemperature = 1e-5f;

// Per-request random state. Counter-based: no state advances between steps,
// so a draw never depends on how many draws came before or from whom.
struct SamplerRng {
  uint64_t seed = 0;

  // params.seed when given; otherwise a fresh value from a process-wide
  // random source (thread-safe). Call once at request start and keep it.
  static SamplerRng forRequest(const SamplingParams& params);

  // Uniform in [0, 1), a pure function of (seed, step).
  double uniform(int64_t step) const;
};

// Everything the sampler reads for one row. Spans are borrowed for the call.
struct SamplerInput {
  std::span<const float> logits;  // vocab_size raw logits
  const SamplingParams* params = nullptr;
  std::span<const TokenId> prompt;
  std::span<const TokenId> output;  // generated so far; its size is the step
  std::span<const TokenId> min_tokens_mask;
  // A structured output's allowed tokens, one bit per id (bit i of word
  // i / 64); the others are set to -inf after step 3. Empty: all allowed.
  std::span<const uint64_t> allowed;
  SamplerRng rng;
};

// Top-p's survivors among `candidates` (ids of finite logits): leaves in
// `candidates` the `keep` best by logit (ties: smaller id first), in that
// order, and returns keep: the smallest k >= 1 whose weights, added up in
// that order in double, reach `target`, or all of them when none does. The
// same as sorting every candidate and walking them, without sorting the
// ones past the nucleus: a pass of
// weight-bucket masses bounds the nucleus from above by a logit, and only
// the candidates at or above that logit are sorted (again with a lower
// bound in the rare case their exact walk falls short of `target`).
size_t topPNucleus(std::vector<TokenId>& candidates, std::span<const float> logits,
                   std::span<const float> weights, double target);

// True when sample() would return exactly the argmax of the raw logits
// (smallest id on a tie; 0 when no logit beats -inf, as Backend::argmaxRows)
// and nothing else: greedy, no penalties, no logit_bias, allowed_token_ids
// or bad_words, no min_tokens mask
// (`masked`), no logprobs. Such rows may take the argmax where the logits are computed.
bool samplesRawArgmax(const SamplingParams& params, bool masked);

class Sampler {
 public:
  GeneratedToken sample(const SamplerInput& input);

  // The logprob of `token` in a raw logits row, its rank (1 + the ids with a
  // larger logit) and the `num_top` best alternatives, as sample() reports
  // them: a prompt token's logprobs (SamplingParams::prompt_logprobs).
  GeneratedToken logprobsOf(std::span<const float> logits, TokenId token, int32_t num_top);

  // Logits after steps 1-3 (penalties and min_tokens mask), before
  // temperature. Exposed so the formulas can be checked directly.
  std::vector<float> processedLogits(const SamplerInput& input);

 private:
  // Writes steps 1-3 into logits_ (sized to the row).
  void process(const SamplerInput& input);
  TokenId drawFiltered(const SamplingParams& params, double u);
  void fillLogprobs(std::span<const float> raw, int32_t num_top, GeneratedToken* out);

  std::vector<float> logits_;
  std::vector<int32_t> output_counts_;  // per id; all zero between calls
  std::vector<uint8_t> in_history_;     // per id; all zero between calls
  std::vector<TokenId> touched_;
  std::vector<TokenId> candidates_;
  std::vector<float> weights_;       // exp((logit - max) / temperature), up to a common factor
  std::vector<float> kept_;          // allowed_token_ids' logits while the row is masked
  std::vector<uint8_t> in_nucleus_;  // per id, for the draw's id order
};

// Rows side by side on the kernels' threads (kernels::parallelFor), a
// Sampler per thread: a step's sampled rows (or a prompt's logprob rows)
// take a vocabulary-wide pass each (with top-p, a sort of the nucleus),
// which one thread would pay once per row between two forward passes (the
// pool is idle then). A row's result does not
// depend on the thread that took it: rows are independent and a draw is a
// pure function of its request's seed and step.
class SamplerPool {
 public:
  // fn(task, sampler) for every task in [0, num_tasks), each task on some
  // thread's sampler; returns when all have run.
  void forEach(int64_t num_tasks, const std::function<void(int64_t, Sampler&)>& fn);
  // sample() of every row: results[i] is inputs[i]'s.
  std::vector<GeneratedToken> sampleRows(std::span<const SamplerInput> inputs);

 private:
  std::vector<Sampler> samplers_;
};

}  // namespace tandem::engine
