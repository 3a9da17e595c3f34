#include "agent/engine/sampler.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "common/check.h"
#include "kernels/kernels.h"

namespace tandem::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// splitmix64's output function: a bijection on 64-bit values with good
// avalanche, which is all a counter-based generator needs.
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// NaN would poison sums and comparisons; a NaN logit is a model bug, and
// treating it as impossible keeps the rest of the row usable.
float sanitized(float x) { return std::isnan(x) ? kNegInf : x; }

// Index of the largest value above -inf, smallest index on ties; -1 if none.
TokenId argmaxFinite(std::span<const float> x) {
  float best = kNegInf;
  TokenId best_id = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > best) {
      best = x[i];
      best_id = static_cast<TokenId>(i);
    }
  }
  return best_id;
}
}  // namespace

SamplerRng SamplerRng::forRequest(const SamplingParams& params) {
  if (params.seed) return SamplerRng{*params.seed};
  // One random base per process plus a counter: unseeded requests never share
  // a stream, and mix64 being a bijection keeps distinct counters distinct.
  static const uint64_t base = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  static std::atomic<uint64_t> counter{0};
  return SamplerRng{mix64(base + counter.fetch_add(1, std::memory_order_relaxed))};
}

double SamplerRng::uniform(int64_t step) const {
  // Hashing seed and step separately before combining keeps nearby seeds from
  // producing shifted copies of one another's streams.
  const uint64_t bits = mix64(mix64(seed) ^ mix64(static_cast<uint64_t>(step)));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

void Sampler::process(const SamplerInput& input) {
  const SamplingParams& params = *input.params;
  const int64_t vocab_size = static_cast<int64_t>(input.logits.size());
  logits_.resize(input.logits.size());
  std::transform(input.logits.begin(), input.logits.end(), logits_.begin(), sanitized);

  // The bias comes first, as in vLLM: the penalties see biased logits.
  for (const auto& [id, bias] : params.logit_bias) {
    if (id < vocab_size) logits_[id] += bias;
  }

  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
  if (repetition || additive) {
    if (static_cast<int64_t>(output_counts_.size()) < vocab_size) {
      output_counts_.resize(vocab_size, 0);
      in_history_.resize(vocab_size, 0);
    }
    touched_.clear();
    // Ids outside the row (a tokenizer larger than the logits) cannot be
    // penalized and are skipped.
    auto touch = [&](TokenId id) {
      if (id < 0 || id >= vocab_size) return false;
      if (!in_history_[id]) {
        in_history_[id] = 1;
        touched_.push_back(id);
      }
      return true;
    };
    for (TokenId id : input.prompt) touch(id);
    for (TokenId id : input.output) {
      if (touch(id)) ++output_counts_[id];
    }
    for (TokenId id : touched_) {
      float& logit = logits_[id];
      if (repetition) {
        logit =
            logit > 0.0f ? logit / params.repetition_penalty : logit * params.repetition_penalty;
      }
      const int32_t count = output_counts_[id];
      if (count > 0) {
        logit -= params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
      }
      // Leave the scratch zeroed for the next call without an O(vocab) clear.
      in_history_[id] = 0;
      output_counts_[id] = 0;
    }
  }

  if (static_cast<int64_t>(input.output.size()) < params.min_tokens) {
    for (TokenId id : input.min_tokens_mask) {
      if (id >= 0 && id < vocab_size) logits_[id] = kNegInf;
    }
  }

  // vLLM's allowed_token_ids and bad_words: -inf, like the masks around
  // them, so their place among the steps changes nothing.
  if (!params.allowed_token_ids.empty()) {
    kept_.clear();
    for (TokenId id : params.allowed_token_ids) {
      if (id < vocab_size) kept_.push_back(logits_[id]);
    }
    std::fill(logits_.begin(), logits_.end(), kNegInf);
    // Sorted ids: those kept are the first kept_.size().
    for (size_t i = 0; i < kept_.size(); ++i) logits_[params.allowed_token_ids[i]] = kept_[i];
  }
  for (const std::vector<TokenId>& word : params.bad_words_ids) {
    const size_t prefix = word.size() - 1;
    if (prefix > input.output.size() || word.back() >= vocab_size) continue;
    if (std::equal(word.begin(), word.end() - 1,
                   input.output.end() - static_cast<ptrdiff_t>(prefix))) {
      logits_[word.back()] = kNegInf;
    }
  }

  if (!input.allowed.empty()) {
    for (int64_t word = 0; word * 64 < vocab_size; ++word) {
      const uint64_t bits =
          word < static_cast<int64_t>(input.allowed.size()) ? input.allowed[word] : 0;
      if (bits == ~uint64_t{0}) continue;
      const int64_t end = std::min<int64_t>(vocab_size, (word + 1) * 64);
      for (int64_t id = word * 64; id < end; ++id) {
        if (((bits >> (id & 63)) & 1u) == 0) logits_[id] = kNegInf;
      }
    }
  }
}

std::vector<float> Sampler::processedLogits(const SamplerInput& input) {
  TANDEM_CHECK(input.params != nullptr, "SamplerInput without params");
  process(input);
  return logits_;
}

TokenId Sampler::drawFiltered(const SamplingParams& params, double u) {
  const size_t vocab_size = logits_.size();
  float max_logit = kNegInf;
  for (float x : logits_) max_logit = std::max(max_logit, x);
  if (max_logit == kNegInf) return -1;
  if (std::isinf(max_logit)) return argmaxFinite(logits_);  // +inf: nothing to weigh

  // Shifting before scaling keeps tiny temperatures from overflowing; a
  // masked (-inf) logit gets weight exactly 0.
  const float inv_temperature = 1.0f / params.temperature;
  weights_.resize(vocab_size);
  auto weigh = [&](TokenId id) {
    weights_[id] = std::exp((logits_[id] - max_logit) * inv_temperature);
  };

  const size_t top_k = params.top_k > 0 ? static_cast<size_t>(params.top_k) : 0;
  const bool use_top_p = params.top_p < 1.0f;
  const bool use_min_p = params.min_p > 0.0f;
  // All exponentials at once through the vectorized softmax; its
  // normalization is harmless since every use below renormalizes. Its exp
  // clamps very negative inputs, so masked ids are zeroed again afterwards.
  auto weighAll = [&] {
    for (size_t i = 0; i < vocab_size; ++i) {
      weights_[i] = (logits_[i] - max_logit) * inv_temperature;
    }
    kernels::softmax(weights_.data(), static_cast<int64_t>(vocab_size));
    for (size_t i = 0; i < vocab_size; ++i) {
      if (logits_[i] == kNegInf) weights_[i] = 0.0f;
    }
  };

  if (top_k == 0 && !use_top_p && !use_min_p) {
    weighAll();
    double total = 0.0;
    for (size_t i = 0; i < vocab_size; ++i) total += weights_[i];
    const double target = u * total;
    double cumulative = 0.0;
    TokenId last_positive = -1;
    for (size_t i = 0; i < vocab_size; ++i) {
      if (weights_[i] <= 0.0f) continue;
      cumulative += weights_[i];
      last_positive = static_cast<TokenId>(i);
      if (target < cumulative) return last_positive;
    }
    return last_positive;  // rounding put u * total at or above the sum
  }

  candidates_.clear();
  for (size_t i = 0; i < vocab_size; ++i) {
    if (logits_[i] != kNegInf) candidates_.push_back(static_cast<TokenId>(i));
  }
  // Ordering by the logit (temperature is monotonic) rather than by weights
  // that may tie after rounding; ties go to the smaller id so results never
  // depend on the selection algorithm.
  auto better = [this](TokenId a, TokenId b) {
    return logits_[a] > logits_[b] || (logits_[a] == logits_[b] && a < b);
  };
  bool reordered = false;

  if (top_k > 0 && top_k < candidates_.size()) {
    // Heap selection touches each rejected id once: cheap for the usual
    // small k; introselect wins for large k.
    if (top_k <= 4096) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + top_k, candidates_.end(),
                        better);
    } else {
      std::nth_element(candidates_.begin(), candidates_.begin() + top_k, candidates_.end(), better);
    }
    candidates_.resize(top_k);
    reordered = true;
  }

  // min-p keeps tokens whose probability is at least min_p times the largest:
  // in logit units (logit - max) / T >= log(min_p). As in vLLM it comes
  // before top-p, whose mass is that of the survivors. (Before or after
  // top-k is the same set: both keep a prefix of the sorted tokens.)
  if (use_min_p) {
    const float log_min_p = std::log(params.min_p);
    std::erase_if(candidates_, [&](TokenId id) {
      return (logits_[id] - max_logit) * inv_temperature < log_min_p;
    });
  }
  if (candidates_.size() * 4 > vocab_size) {
    weighAll();
  } else {
    for (TokenId id : candidates_) weigh(id);
  }

  if (use_top_p) {
    double total = 0.0;
    for (TokenId id : candidates_) total += weights_[id];
    topPNucleus(candidates_, logits_, weights_, params.top_p * total);
    reordered = true;
  }

  // Walk in id order so the draw does not depend on how filtering permuted
  // the candidates (top_k = vocab_size and top_k = 0 then agree exactly): a
  // sort, or for a large share of the vocabulary a pass over it.
  if (reordered && candidates_.size() * 16 > vocab_size) {
    in_nucleus_.assign(vocab_size, 0);
    for (TokenId id : candidates_) in_nucleus_[static_cast<size_t>(id)] = 1;
    candidates_.clear();
    for (size_t i = 0; i < vocab_size; ++i) {
      if (in_nucleus_[i] != 0) candidates_.push_back(static_cast<TokenId>(i));
    }
  } else if (reordered) {
    std::sort(candidates_.begin(), candidates_.end());
  }
  double total = 0.0;
  for (TokenId id : candidates_) total += weights_[id];
  const double target = u * total;
  double cumulative = 0.0;
  TokenId last_positive = -1;
  for (TokenId id : candidates_) {
    if (weights_[id] <= 0.0f) continue;
    cumulative += weights_[id];
    last_positive = id;
    if (target < cumulative) return id;
  }
  return last_positive;  // rounding put u * total at or above the sum
}

void Sampler::fillLogprobs(std::span<const float> raw, int32_t num_top, GeneratedToken* out) {
  float max_logit = kNegInf;
  for (float x : raw) max_logit = std::max(max_logit, sanitized(x));
  double sum = 0.0;
  if (std::isfinite(max_logit)) {
    for (float x : raw) sum += std::exp(sanitized(x) - max_logit);
  }
  const double log_normalizer = static_cast<double>(max_logit) + std::log(sum);
  auto logprobOf = [&](TokenId id) {
    return static_cast<float>(static_cast<double>(sanitized(raw[id])) - log_normalizer);
  };
  out->logprob = logprobOf(out->token);

  out->top.clear();
  const size_t count = std::min(static_cast<size_t>(std::max(num_top, 0)), raw.size());
  if (count == 0) return;
  candidates_.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) candidates_[i] = static_cast<TokenId>(i);
  std::partial_sort(candidates_.begin(), candidates_.begin() + count, candidates_.end(),
                    [&](TokenId a, TokenId b) {
                      const float x = sanitized(raw[a]);
                      const float y = sanitized(raw[b]);
                      return x > y || (x == y && a < b);
                    });
  out->top.reserve(count);
  for (size_t i = 0; i < count; ++i)
    out->top.push_back({candidates_[i], logprobOf(candidates_[i])});
}

GeneratedToken Sampler::logprobsOf(std::span<const float> logits, TokenId token, int32_t num_top) {
  TANDEM_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(),
               "logprobsOf: token outside the logits row");
  GeneratedToken result;
  result.token = token;
  fillLogprobs(logits, num_top, &result);
  const float own = sanitized(logits[token]);
  result.rank =
      1 + std::count_if(logits.begin(), logits.end(), [&](float x) { return sanitized(x) > own; });
  return result;
}

size_t topPNucleus(std::vector<TokenId>& candidates, std::span<const float> logits,
                   std::span<const float> weights, double target) {
  if (candidates.empty()) return 0;
  // A candidate's place in the order as one integer, larger first: the
  // logit's bits made monotone (logits here are finite; -0 as +0, which
  // compare equal), then the id reversed, so ties go to the smaller id.
  auto rank = [&](TokenId id) {
    uint32_t bits = std::bit_cast<uint32_t>(logits[static_cast<size_t>(id)] + 0.0f);
    bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
    return uint64_t{bits} << 32 | (0xffffffffu - static_cast<uint32_t>(id));
  };
  // Weight buckets by the float's exponent and top three mantissa bits (the
  // weights are finite and non-negative, so larger bits, larger weight):
  // their masses, largest bucket first, find the bucket where the nucleus
  // ends, to rounding.
  constexpr int kBuckets = 1 << 11;
  auto bucketOf = [&](TokenId id) {
    return static_cast<int>(std::bit_cast<uint32_t>(weights[static_cast<size_t>(id)]) >> 20);
  };
  std::vector<double> mass(kBuckets, 0.0);
  for (TokenId id : candidates) {
    mass[static_cast<size_t>(bucketOf(id))] += weights[static_cast<size_t>(id)];
  }
  int bucket = kBuckets - 1;
  double above = 0.0;
  while (bucket > 0 && (mass[static_cast<size_t>(bucket)] == 0.0 ||
                        above + mass[static_cast<size_t>(bucket)] < target)) {
    above += mass[static_cast<size_t>(bucket--)];
  }
  std::vector<uint64_t> ranks;
  while (true) {
    // Every candidate ranked at or above the lowest logit in buckets >=
    // `bucket`: a prefix of the order (weights need not grow with the logit
    // to the last bit; a logit bound does), sorted, then walked as the
    // whole order would be.
    uint64_t bound = ~uint64_t{0};
    for (TokenId id : candidates) {
      if (bucketOf(id) >= bucket) bound = std::min(bound, rank(id) | 0xffffffffu);
    }
    bound &= ~uint64_t{0xffffffffu};
    ranks.clear();
    for (TokenId id : candidates) {
      const uint64_t r = rank(id);
      if (r >= bound) ranks.push_back(r);
    }
    std::sort(ranks.begin(), ranks.end(), std::greater<>());
    double mass_before = 0.0;
    size_t keep = 0;
    while (keep < ranks.size() && (keep == 0 || mass_before < target)) {
      mass_before += weights[0xffffffffu - static_cast<uint32_t>(ranks[keep])];
      ++keep;
    }
    const bool reached = keep < ranks.size() || mass_before >= target;
    if (reached || ranks.size() == candidates.size() || bucket == 0) {
      candidates.resize(keep);
      for (size_t i = 0; i < keep; ++i) {
        candidates[i] = static_cast<TokenId>(0xffffffffu - static_cast<uint32_t>(ranks[i]));
      }
      return keep;
    }
    // The masses were added in another order: one bucket more, and again.
    --bucket;
    while (bucket > 0 && mass[static_cast<size_t>(bucket)] == 0.0) --bucket;
  }
}

bool samplesRawArgmax(const SamplingParams& params, bool masked) {
  return params.temperature < kGreedyTemperature && !masked && !params.logprobs &&
         params.repetition_penalty == 1.0f && params.frequency_penalty == 0.0f &&
         params.presence_penalty == 0.0f && params.logit_bias.empty() &&
         params.allowed_token_ids.empty() && params.bad_words_ids.empty();
}

GeneratedToken Sampler::sample(const SamplerInput& input) {
  TANDEM_CHECK(input.params != nullptr, "SamplerInput without params");
  TANDEM_CHECK(!input.logits.empty(), "SamplerInput with an empty logits row");
  const SamplingParams& params = *input.params;
  process(input);

  TokenId token = -1;
  if (params.temperature < kGreedyTemperature) {
    token = argmaxFinite(logits_);
  } else {
    token = drawFiltered(params, input.rng.uniform(static_cast<int64_t>(input.output.size())));
  }
  if (token < 0) {
    // Masking or NaN left nothing to choose from: better the model's own
    // favourite than an arbitrary id, among allowed_token_ids when given
    // (a hard bound; the other masks give way).
    token = std::max<TokenId>(argmaxFinite(input.logits), 0);
    if (!params.allowed_token_ids.empty()) {
      token = params.allowed_token_ids.front();
      for (TokenId id : params.allowed_token_ids) {
        if (id < static_cast<TokenId>(input.logits.size()) &&
            sanitized(input.logits[id]) > sanitized(input.logits[token])) {
          token = id;
        }
      }
    }
  }

  GeneratedToken result;
  result.token = token;
  if (params.logprobs) fillLogprobs(input.logits, *params.logprobs, &result);
  return result;
}

void SamplerPool::forEach(int64_t num_tasks, const std::function<void(int64_t, Sampler&)>& fn) {
  samplers_.resize(static_cast<size_t>(kernels::numThreads()));
  kernels::parallelFor(num_tasks, [&](int64_t task, int worker) {
    fn(task, samplers_[static_cast<size_t>(worker)]);
  });
}

std::vector<GeneratedToken> SamplerPool::sampleRows(std::span<const SamplerInput> inputs) {
  std::vector<GeneratedToken> results(inputs.size());
  forEach(static_cast<int64_t>(inputs.size()), [&](int64_t i, Sampler& sampler) {
    results[static_cast<size_t>(i)] = sampler.sample(inputs[static_cast<size_t>(i)]);
  });
  return results;
}

}  // namespace tandem::engine
