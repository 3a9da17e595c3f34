// tandem-bench: benchmark programs. They print figures and write JSON; they
// never pass or fail on speed.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "tools/bench/engine_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem-bench: Tandem benchmarks"};
  app.require_subcommand(1);

  auto* engine = app.add_subcommand("engine", "prefill/decode/GEMM throughput of one engine");
  tandem::bench::EngineBenchOptions options;
  engine->add_option("--model", options.model_dir, "Hugging Face model directory")->required();
  engine->add_option("--threads", options.threads, "kernel threads (0: all cores)")
      ->capture_default_str();
  engine->add_option("--prompt-tokens", options.prompt_tokens, "prefill prompt length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  engine->add_option("--decode-tokens", options.decode_tokens, "tokens decoded")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  engine->add_option("--repeats", options.repeats, "runs per figure (best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  engine->add_option("--kv-dtype", options.kv_dtype, "KV cache dtype: bf16 or f32")
      ->capture_default_str();
  engine->add_option("--json", options.json_path, "also write the figures as JSON here");

  CLI11_PARSE(app, argc, argv);
  try {
    if (engine->parsed()) return tandem::bench::runEngineBench(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
