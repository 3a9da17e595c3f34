// tandem-model: writes a complete Hugging Face model directory with seeded
// random weights and a trained byte-level BPE tokenizer, for tests and demos.
//
//   tandem-model --preset tiny|small|llama3-8b --out DIR [--dtype bf16|f32|f16] [--seed N]
//                [--arch llama|mistral|qwen2|qwen3]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "common/dtype.h"
#include "common/status.h"
#include "tools/model/test_model.h"

int main(int argc, char** argv) {
  CLI::App app{"Writes a test model directory (config, safetensors weights, tokenizer)."};
  std::string preset;
  std::string out_dir;
  std::string dtype_name = "bf16";
  uint64_t seed = 0;
  std::string arch = "llama";
  app.add_option("--preset", preset, "model size")
      ->required()
      ->check(CLI::IsMember(tandem::tools::presetNames()));
  app.add_option("--out", out_dir, "output directory (created; files replaced)")->required();
  app.add_option("--dtype", dtype_name, "weight dtype")
      ->check(CLI::IsMember({"bf16", "f32", "f16"}));
  app.add_option("--seed", seed, "weight seed");
  app.add_option("--arch", arch, "architecture")
      ->check(CLI::IsMember({"llama", "mistral", "qwen2", "qwen3"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tandem-model: %s (see --help)\n", e.what());
    return 1;
  }

  const std::map<std::string, std::string> architectures = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},
  };
  tandem::tools::TestModelOptions options;
  options.preset = preset;
  options.architecture = architectures.at(arch);
  options.dtype = *tandem::dtypeFromShortName(dtype_name);
  options.seed = seed;

  try {
    const auto start = std::chrono::steady_clock::now();
    tandem::tools::writeTestModel(options, out_dir);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s %s model (%s, seed %llu) to %s in %.2f s:\n", preset.c_str(),
                options.architecture.c_str(), dtype_name.c_str(),
                static_cast<unsigned long long>(seed), out_dir.c_str(), seconds);
    for (const char* name : {"config.json", "generation_config.json", "model.safetensors",
                             "tokenizer.json", "tokenizer_config.json"}) {
      const std::filesystem::path path = std::filesystem::path(out_dir) / name;
      std::printf("  %-24s %12ju bytes\n", name,
                  static_cast<uintmax_t>(std::filesystem::file_size(path)));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-model: %s\n", e.what());
    return 1;
  }
  return 0;
}
