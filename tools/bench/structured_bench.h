// `tandem-bench structured`: what structured outputs cost per token. For
// each tokenizer given (a Hugging Face directory or tokenizer.json) and each
// of five JSON schemas (a tool call, a nested record, an array of objects, a
// recursive tree, any JSON object), the program compiles the schema, then
// walks seeded random outputs through the matcher: at each step it times the
// allowed-token mask (all steps, and the steps that missed the mask cache,
// i.e. computed the mask) and the advance over the chosen token. It prints
// the figures per schema (median and p99, microseconds) and the
// vocabulary's trie build and each compile time. With --model it also runs
// an engine on that model and measures decode tokens/s of a batch of
// requests unconstrained and constrained to the tool-call schema, in
// alternating rounds, and their ratio. --json writes the figures too.
// Figures only, never a verdict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct StructuredBenchOptions {
  std::vector<std::string> tokenizers;  // directories or tokenizer.json files
  int walks = 8;                        // random outputs per schema
  int max_steps = 256;                  // tokens per walk at most
  uint64_t seed = 1;
  // With a model: decode tokens/s of `batch` requests at once, unconstrained
  // and constrained to a JSON schema, in alternating rounds on one engine.
  std::string model_dir;
  int batch = 8;
  int decode_tokens = 64;
  int rounds = 3;
  std::string json_path;  // empty: no JSON file
};

int runStructuredBench(const StructuredBenchOptions& options);

}  // namespace tandem::bench
