// tandem-model: writes a complete Hugging Face model directory with seeded
// random weights and a trained byte-level BPE tokenizer, for tests and demos;
// and fetches a model from a Hugging Face Hub repository (a pool's hf://
// source; common/model_source/hub_fetch.h).
//
//   tandem-model --preset tiny|small|llama3-8b --out DIR [--dtype bf16|f32|f16] [--seed N]
//                [--layers N]
//                [--arch llama|mistral|ministral3|qwen2|qwen3|gemma2|gemma3|phi3|phi4|granite|
//                olmo2|olmo3|smollm3|glm|glm4|mixtral|qwen2_moe|qwen3_moe|glm4_moe|
//                gpt_oss|granitemoe|olmoe]
//                [--quantize fp8[:tensor|:block[=RxC]]|compressed-tensors[:...]]
//                [--kv-cache-scales] [--rope-scaling yarn]
//   tandem-model fetch hf://org/name[@revision] (--dir DIR | --cache-dir ROOT)
//                [--endpoint URL] [--parallel N] [--retries N] [--ca-file PEM]
//                [--token-source TEXT] [--termination-log PATH] [--tokenizer-only]
//   tandem-model lora --model DIR --out DIR [--rank N] [--alpha X] [--rslora] [--seed N]
//                [--dtype f32|bf16|f16] [--modules q_proj,...] [--strength X]
//   (a PEFT LoRA adapter with seeded random matrices for the model in DIR)
//   (the token: HF_TOKEN, else HUGGING_FACE_HUB_TOKEN; the endpoint's default:
//   HF_ENDPOINT, else https://huggingface.co)
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/command_line/command_line.h"
#include "common/dtype.h"
#include "common/model_source/hub_fetch.h"
#include "common/model_source/model_source.h"
#include "common/status.h"
#include "tools/model/test_model.h"

namespace {

struct FetchFlags {
  std::string source;
  std::string dir;
  std::string cache_dir;
  std::string endpoint;
  int parallel = 4;
  int retries = 5;
  std::string ca_file;
  std::string token_source = "HF_TOKEN";
  std::string termination_log = "/dev/termination-log";
  bool tokenizer_only = false;
};

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// A failure's message goes to stderr and, where Kubernetes made the file, to
// the container's termination log (what `kubectl describe` and the pool's
// ModelReady condition show).
int fail(const FetchFlags& flags, const std::string& message) {
  std::fprintf(stderr, "tandem-model fetch: %s\n", message.c_str());
  std::error_code error;
  if (!flags.termination_log.empty() && std::filesystem::exists(flags.termination_log, error)) {
    std::ofstream log(flags.termination_log, std::ios::trunc);
    log << message;
  }
  return 1;
}

int runFetch(const FetchFlags& flags) {
  using namespace tandem::model_source;
  tandem::StatusOr<ModelSource> source = parseModelSource(flags.source);
  if (!source.isOk()) return fail(flags, source.status().message());
  if (source->kind != SourceKind::kHuggingFace) {
    return fail(flags,
                "fetch takes an hf://org/name[@revision] source, got \"" + flags.source + "\"");
  }
  if (flags.dir.empty() == flags.cache_dir.empty()) {
    return fail(flags, "give exactly one of --dir and --cache-dir");
  }
  HubFetchOptions options;
  options.repo = source->repo;
  options.revision = source->revision;
  options.directory = flags.dir.empty() ? hubCacheDirectory(flags.cache_dir, *source) : flags.dir;
  options.endpoint = flags.endpoint;
  if (options.endpoint.empty()) options.endpoint = environment("HF_ENDPOINT");
  if (options.endpoint.empty()) options.endpoint = "https://huggingface.co";
  options.token = environment("HF_TOKEN");
  if (options.token.empty()) options.token = environment("HUGGING_FACE_HUB_TOKEN");
  options.token_source = flags.token_source;
  options.parallel = flags.parallel;
  options.retries = flags.retries;
  options.ca_file = flags.ca_file;
  options.tokenizer_only = flags.tokenizer_only;
  options.progress = [](const std::string& file, int64_t done, int64_t size) {
    if (done == size)
      std::printf("  %-36s %14lld bytes\n", file.c_str(), static_cast<long long>(size));
  };
  const auto start = std::chrono::steady_clock::now();
  std::printf("fetching %s from %s into %s\n", flags.source.c_str(), options.endpoint.c_str(),
              options.directory.c_str());
  std::fflush(stdout);
  tandem::StatusOr<HubFetchResult> result = fetchHubModel(options);
  if (!result.isOk()) return fail(flags, result.status().message());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result->offline.empty()) {
    std::printf("the Hub could not be asked (%s); kept the complete download of commit %s\n",
                result->offline.c_str(), result->commit.c_str());
  } else if (result->already_complete) {
    std::printf("already complete at commit %s (%zu files, %lld bytes)\n", result->commit.c_str(),
                result->files.size(), static_cast<long long>(result->bytes_total));
  } else {
    std::printf("fetched commit %s: %zu files, %lld bytes (%lld downloaded) in %.2f s\n",
                result->commit.c_str(), result->files.size(),
                static_cast<long long>(result->bytes_total),
                static_cast<long long>(result->bytes_downloaded), seconds);
  }
  std::printf("model directory: %s\n", options.directory.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Writes a test model directory (config, safetensors weights, tokenizer), or "
      "fetches a model from a Hugging Face Hub repository (fetch)."};
  FetchFlags fetch;
  CLI::App* fetch_command = app.add_subcommand(
      "fetch", "Downloads and verifies a Hub repository's model files into a directory.");
  fetch_command->add_option("source", fetch.source, "hf://org/name[@revision]")->required();
  fetch_command->add_option("--dir", fetch.dir, "the model directory to fill");
  fetch_command->add_option("--cache-dir", fetch.cache_dir,
                            "a cache root: the directory is ROOT/hf/models--org--name/REVISION");
  fetch_command->add_option("--endpoint", fetch.endpoint,
                            "the Hub's URL (default: HF_ENDPOINT, else https://huggingface.co)");
  fetch_command->add_option("--parallel", fetch.parallel, "files downloaded at once")
      ->check(CLI::Range(1, 64));
  fetch_command->add_option("--retries", fetch.retries, "retries per file, resuming")
      ->check(CLI::Range(0, 100));
  fetch_command->add_option("--ca-file", fetch.ca_file, "PEM bundle to verify https with");
  fetch_command->add_option("--token-source", fetch.token_source,
                            "where HF_TOKEN comes from, for messages");
  fetch_command->add_flag("--tokenizer-only", fetch.tokenizer_only,
                          "only config, tokenizer and chat template files (a router's copy)");
  fetch_command->add_option("--termination-log", fetch.termination_log,
                            "a failure's message is written here when the file exists");
  tandem::tools::TestLoraOptions lora;
  std::string lora_model;
  std::string lora_out;
  std::string lora_dtype = "f32";
  CLI::App* lora_command = app.add_subcommand(
      "lora", "Writes a PEFT LoRA adapter with seeded random matrices for a model directory.");
  lora_command->add_option("--model", lora_model, "the base model's directory")->required();
  lora_command->add_option("--out", lora_out, "the adapter directory (created; files replaced)")
      ->required();
  lora_command->add_option("--rank", lora.rank, "r")->check(CLI::Range(1, 4096));
  lora_command->add_option("--alpha", lora.alpha, "lora_alpha")->check(CLI::PositiveNumber);
  lora_command->add_flag("--rslora", lora.rslora, "use_rslora: scale alpha / sqrt(r)");
  lora_command->add_option("--seed", lora.seed, "matrix seed");
  lora_command->add_option("--dtype", lora_dtype, "matrix dtype")
      ->check(CLI::IsMember({"bf16", "f32", "f16"}));
  lora_command
      ->add_option("--modules", lora.modules,
                   "projections adapted (default: all seven, but a mixture layer's MLP)")
      ->delimiter(',');
  lora_command
      ->add_option("--strength", lora.strength,
                   "each delta's size relative to its projection's output")
      ->check(CLI::PositiveNumber);
  std::string preset;
  std::string out_dir;
  std::string dtype_name = "bf16";
  uint64_t seed = 0;
  std::string arch = "llama";
  app.add_option("--preset", preset, "model size (required unless fetch)")
      ->check(CLI::IsMember(tandem::tools::presetNames()));
  app.add_option("--out", out_dir, "output directory (created; files replaced)");
  app.add_option("--dtype", dtype_name, "weight dtype")
      ->check(CLI::IsMember({"bf16", "f32", "f16"}));
  app.add_option("--seed", seed, "weight seed");
  int64_t layers = 0;
  app.add_option("--layers", layers,
                 "decoder layers (num_hidden_layers) in place of the preset's, every other "
                 "shape kept (e.g. a few layers of the llama3-8b shape for a kernel profile)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  std::string quantize;
  bool kv_cache_scales = false;
  app.add_option("--quantize", quantize,
                 "fp8 weights: fp8[:tensor|:block[=RxC]] or "
                 "compressed-tensors[:tensor|:channel|:block[=RxC]], or mxfp4 (GPT-OSS's "
                 "experts) (docs/quantization.md)");
  app.add_flag("--kv-cache-scales", kv_cache_scales,
               "fp8 KV cache scales: self_attn.k_scale and v_scale per layer "
               "(docs/quantization.md#fp8-kv-cache)");
  std::string rope_scaling;
  app.add_option("--rope-scaling", rope_scaling,
                 "YaRN (factor 4 over a quarter of the preset's context) in place of the "
                 "preset's rotary scaling (docs/engine.md#yarn)")
      ->check(CLI::IsMember({"yarn"}));
  app.add_option("--arch", arch, "architecture")
      ->check(
          CLI::IsMember({"llama",    "mistral", "ministral3", "qwen2",   "qwen3",     "gemma2",
                         "gemma3",   "phi3",    "phi4",       "granite", "olmo2",     "olmo3",
                         "smollm3",  "glm",     "glm4",       "mixtral", "qwen2_moe", "qwen3_moe",
                         "glm4_moe", "gpt_oss", "granitemoe", "olmoe"}));
  if (const std::optional<int> exit = tandem::parseCommandLine(app, argc, argv, "tandem-model")) {
    return *exit;
  }
  if (fetch_command->parsed()) return runFetch(fetch);
  if (lora_command->parsed()) {
    try {
      lora.dtype = *tandem::dtypeFromShortName(lora_dtype);
      const tandem::engine::ModelConfig base =
          tandem::engine::ModelConfig::fromFile(std::filesystem::path(lora_model) / "config.json");
      tandem::tools::writeTestLoraAdapter(lora, base, lora_out);
      std::printf("wrote a rank-%lld LoRA adapter for %s (%s, seed %llu) to %s\n",
                  static_cast<long long>(lora.rank), lora_model.c_str(), lora_dtype.c_str(),
                  static_cast<unsigned long long>(lora.seed), lora_out.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem-model lora: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (preset.empty() || out_dir.empty()) {
    std::fprintf(stderr, "tandem-model: --preset and --out are required (see --help)\n");
    return 1;
  }

  const std::map<std::string, std::string> architectures = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"ministral3", "Ministral3ForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"},
      {"qwen2_moe", "Qwen2MoeForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"},
      {"glm4_moe", "Glm4MoeForCausalLM"},
      {"gpt_oss", "GptOssForCausalLM"},
      {"granitemoe", "GraniteMoeForCausalLM"},
      {"olmoe", "OlmoeForCausalLM"},
      {"gemma3", "Gemma3ForCausalLM"},
      {"gemma2", "Gemma2ForCausalLM"},
      {"phi3", "Phi3ForCausalLM"},
      {"phi4", "Phi3ForCausalLM"},
      {"granite", "GraniteForCausalLM"},
      {"olmo2", "Olmo2ForCausalLM"},
      {"olmo3", "Olmo3ForCausalLM"},
      {"smollm3", "SmolLM3ForCausalLM"},
      {"glm", "GlmForCausalLM"},
      {"glm4", "Glm4ForCausalLM"},
  };
  tandem::tools::TestModelOptions options;
  options.preset = preset;
  options.architecture = architectures.at(arch);
  options.phi4_rotary = arch == "phi4";
  options.yarn = rope_scaling == "yarn";
  options.dtype = *tandem::dtypeFromShortName(dtype_name);
  options.seed = seed;
  options.layers = layers;
  options.kv_cache_scales = kv_cache_scales;

  try {
    if (!quantize.empty()) options.quantization = tandem::tools::parseQuantizationSpec(quantize);
    const auto start = std::chrono::steady_clock::now();
    tandem::tools::writeTestModel(options, out_dir);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s %s model (%s%s%s, seed %llu) to %s in %.2f s:\n", preset.c_str(),
                options.architecture.c_str(), dtype_name.c_str(), quantize.empty() ? "" : ", ",
                quantize.c_str(), static_cast<unsigned long long>(seed), out_dir.c_str(), seconds);
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
