// `tandem-bench speculative`: what speculative decoding by prompt lookup
// (docs/speculative-decoding.md) does on one machine, side by side.
//
// Two engines on one model, one without drafts and one with
// --speculative-config, run the same batches of greedy requests in
// alternating pairs (which engine goes first alternates too). Per run: the
// decode span (the last first token to the last finish), the steps, and the
// tokens; per pair, the ratio of decode tokens/s with drafts to without,
// and whether every token was the same (it must be). Prints the median of
// the pairs' ratios, the acceptance (drafts accepted ÷ computed), the
// tokens per step and the prompts' kind, and optionally writes JSON.
// Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::bench {

struct SpeculativeBenchOptions {
  std::string model_dir;
  int threads = 0;  // 0: every CPU it may use
  std::string speculative_config =
      R"({"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":4})";
  // "repeat": each prompt is a random 32-token part repeated; "random":
  // random tokens (drafts then come only from what the model repeats).
  std::string prompts = "repeat";
  int64_t prompt_tokens = 256;
  int64_t max_tokens = 128;
  int64_t batch = 1;  // requests run together
  int pairs = 3;
  std::string json_path;  // empty: no JSON file
};

int runSpeculativeBench(const SpeculativeBenchOptions& options);

}  // namespace tandem::bench
