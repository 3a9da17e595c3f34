// tandem-agent: the engine process. Subcommands:
//   tokenize  — JSON lines {"text": ...} on stdin → {"ids": [...]} on stdout
//   generate  — greedy completion of one prompt, streamed, with throughput
//   serve     — the OpenAI-compatible HTTP server
//   render-chat — JSON lines of conversations → the chat template's text
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "agent/render_chat_command.h"
#include "agent/serve_command.h"
#include "common/command_line/command_line.h"
#include "common/crash_report.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

namespace {

using tandem::TokenId;
namespace fs = std::filesystem;

std::unique_ptr<tandem::Tokenizer> loadTokenizer(const std::string& path) {
  if (fs::is_directory(path)) return tandem::Tokenizer::fromDirectory(path);
  return tandem::Tokenizer::fromFile(path);
}

// Reads JSON lines; a bad line gets {"error": ...} and the rest still run.
int runTokenize(const std::string& tokenizer_path, bool add_special_tokens) {
  auto tokenizer = loadTokenizer(tokenizer_path);
  std::string line;
  int64_t line_number = 0;
  int bad_lines = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json out;
    auto request = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (request.is_discarded() || !request.is_object()) {
      out["error"] = "line " + std::to_string(line_number) + ": not a JSON object";
    } else if (!request.contains("text") || !request["text"].is_string()) {
      out["error"] = "line " + std::to_string(line_number) + ": field \"text\" must be a string";
    } else {
      out["ids"] = tokenizer->encode(request["text"].get<std::string>(), add_special_tokens);
    }
    if (out.contains("error")) ++bad_lines;
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return bad_lines == 0 ? 0 : 1;
}

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  int64_t max_tokens = 64;
  std::string kv_dtype = "bf16";
  int32_t block_size = 16;
  std::string device = "auto";
  bool ignore_eos = false;
  std::string hf_overrides;  // serve's --hf-overrides
};

int runGenerate(const GenerateOptions& options) {
  using Clock = std::chrono::steady_clock;
  auto model = tandem::engine::Model::load(options.model_dir, options.hf_overrides);
  auto tokenizer = tandem::Tokenizer::fromDirectory(options.model_dir);
  const auto& config = model->config();

  if (options.prompt.empty()) throw tandem::Error("--prompt must not be empty");
  std::vector<TokenId> prompt = tokenizer->encode(options.prompt, /*add_special_tokens=*/true);
  if (prompt.empty()) throw tandem::Error("--prompt encodes to no tokens");
  for (TokenId id : prompt) {
    if (id < 0 || id >= config.vocab_size) {
      throw tandem::Error("--prompt encodes to token id " + std::to_string(id) + ", outside the " +
                          "model's vocabulary [0, " + std::to_string(config.vocab_size) +
                          ") (config.json vocab_size): the tokenizer does not match the model");
    }
  }
  std::unique_ptr<tandem::kernels::Backend> backend =
      tandem::kernels::makeBackend(tandem::kernels::resolveDevice(options.device));
  // The context serve's default max_model_len would be on this backend.
  const tandem::engine::ContextLimit limit = tandem::engine::contextLimit(config, *backend);
  model->fitContext(limit.tokens);
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  if (static_cast<int64_t>(prompt.size()) >= limit.tokens) {
    throw tandem::Error("--prompt is " + std::to_string(prompt.size()) +
                        " tokens, but the context is " + std::to_string(limit.tokens) + " (" +
                        limit.origin + "); at most " + std::to_string(limit.tokens - 1) +
                        " prompt tokens leave room for one generated token");
  }
  if (options.max_tokens < 1 || total > limit.tokens) {
    throw tandem::Error("--max-tokens must be between 1 and " +
                        std::to_string(limit.tokens - static_cast<int64_t>(prompt.size())) +
                        " for this prompt of " + std::to_string(prompt.size()) +
                        " tokens (context " + std::to_string(limit.tokens) + ", " + limit.origin +
                        "), got " + std::to_string(options.max_tokens));
  }
  const tandem::DType kv_dtype = tandem::engine::kvDtypeFromName(options.kv_dtype);

  tandem::engine::KvCacheConfig kv_config =
      tandem::engine::KvCacheConfig::forModel(*model, kv_dtype, options.block_size);
  kv_config.num_blocks = (total + options.block_size - 1) / options.block_size;
  tandem::engine::KvCache cache(kv_config, tandem::engine::slabAllocatorFor(*backend));
  tandem::engine::ModelRunner runner(*model, cache, *backend);
  std::vector<tandem::engine::BlockId> block_table(kv_config.num_blocks);
  std::iota(block_table.begin(), block_table.end(), 0);

  std::vector<TokenId> stop_ids;
  for (int64_t id : config.eos_token_ids) stop_ids.push_back(static_cast<TokenId>(id));
  if (auto eos = tokenizer->eosTokenId()) stop_ids.push_back(*eos);

  tandem::IncrementalDetokenizer detokenizer(*tokenizer, /*skip_special_tokens=*/true);
  std::fputs(options.prompt.c_str(), stdout);
  std::fflush(stdout);

  std::vector<float> logits;
  tandem::engine::SequenceInput input;
  input.block_table = block_table;
  input.tokens = prompt;
  input.start_position = 0;
  auto prefill_start = Clock::now();
  runner.forward({&input, 1}, logits);
  auto prefill_end = Clock::now();

  int64_t generated = 0;
  std::string finish_reason = "length";
  TokenId next = static_cast<TokenId>(tandem::kernels::argmax(logits.data(), config.vocab_size));
  int64_t position = static_cast<int64_t>(prompt.size());
  auto decode_start = Clock::now();
  while (true) {
    ++generated;
    bool is_stop = std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end();
    if (is_stop && !options.ignore_eos) {
      finish_reason = "stop";
      break;
    }
    std::string piece = detokenizer.push(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (generated >= options.max_tokens) break;
    input.tokens = {&next, 1};
    input.start_position = position++;
    runner.forward({&input, 1}, logits);
    next = static_cast<TokenId>(tandem::kernels::argmax(logits.data(), config.vocab_size));
  }
  auto decode_end = Clock::now();
  std::string tail = detokenizer.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);

  const double prefill_s = std::chrono::duration<double>(prefill_end - prefill_start).count();
  const double decode_s = std::chrono::duration<double>(decode_end - decode_start).count();
  // The first generated token comes from the prefill; decode steps are generated - 1.
  const int64_t decode_steps = generated - 1;
  std::fprintf(stderr,
               "prompt: %zu tokens, prefill %.1f ms (%.1f tokens/s)\n"
               "generated: %lld tokens (finish_reason=%s), decode %.1f tokens/s\n"
               "kernels: %s, %d threads; weights %s; KV cache %s\n",
               prompt.size(), prefill_s * 1e3, static_cast<double>(prompt.size()) / prefill_s,
               static_cast<long long>(generated), finish_reason.c_str(),
               decode_steps > 0 ? static_cast<double>(decode_steps) / decode_s : 0.0,
               tandem::kernels::isaName().c_str(), tandem::kernels::numThreads(),
               tandem::dtypeShortName(model->weightDType()), options.kv_dtype.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::installCrashReport("tandem-agent");
  CLI::App app{"tandem-agent: LLM engine with paged KV cache"};
  app.require_subcommand(1);
  app.fallthrough();
  // Checked as serve checks it (agent_config), so that its error reads the
  // same before and after the subcommand.
  std::string threads;
  app.add_option("--threads", threads, "kernel threads (default: every CPU it may use)");

  auto* tokenize = app.add_subcommand("tokenize", "JSON lines {\"text\"} on stdin to {\"ids\"}");
  std::string tokenizer_path;
  bool add_special_tokens = false;
  tokenize->add_option("--tokenizer", tokenizer_path, "model directory or tokenizer.json")
      ->required();
  tokenize->add_flag("--add-special-tokens", add_special_tokens,
                     "apply the post-processor (e.g. BOS)");

  auto* generate = app.add_subcommand("generate", "greedy completion of one prompt");
  GenerateOptions gen;
  generate->add_option("--model", gen.model_dir, "Hugging Face model directory")->required();
  generate->add_option("--prompt", gen.prompt, "prompt text")->required();
  generate->add_option("--max-tokens", gen.max_tokens, "tokens to generate")->capture_default_str();
  generate->add_option("--kv-dtype", gen.kv_dtype, "KV cache dtype: bf16, f32 or fp8")
      ->capture_default_str();
  generate->add_option("--block-size", gen.block_size, "KV block size in tokens")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  generate->add_option("--device", gen.device, "compute backend: cpu, cuda or auto")
      ->capture_default_str();
  generate->add_flag("--ignore-eos", gen.ignore_eos, "keep generating past end-of-sequence");
  generate->add_option("--hf-overrides", gen.hf_overrides,
                       "config.json fields replaced before the model is read (a JSON object, as "
                       "serve's)");

  tandem::agent::ServeOptions serve_options;
  CLI::App* serve = tandem::agent::addServeCommand(app, serve_options);

  tandem::agent::RenderChatOptions render_chat_options;
  CLI::App* render_chat = tandem::agent::addRenderChatCommand(app, render_chat_options);

  if (const std::optional<int> exit = tandem::parseCommandLine(app, argc, argv, "tandem-agent")) {
    return *exit;
  }
  try {
    // serve reads --threads itself (before or after `serve`) and starts the
    // kernel threads after blocking the termination signals, so that every
    // thread inherits the mask and SIGTERM reaches the drain.
    if (serve->parsed()) return tandem::agent::runServe(*serve, serve_options);
    if (!threads.empty()) {
      if (const int64_t n = tandem::agent::checkedIntegerOption("threads", threads); n > 0) {
        tandem::kernels::setNumThreads(static_cast<int>(n));
      }
    }
    if (tokenize->parsed()) return runTokenize(tokenizer_path, add_special_tokens);
    if (generate->parsed()) return runGenerate(gen);
    if (render_chat->parsed()) {
      return tandem::agent::runRenderChat(render_chat_options, std::cin, std::cout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-agent: %s\n", e.what());
    return 1;
  }
  return 0;
}
