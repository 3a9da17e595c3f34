// `tandem-agent serve`: flags, the optional YAML config (same keys as the
// flags; flags override it; both checked by agent/agent_config.h), and the
// serving process's life cycle: load, listen, drain on SIGTERM/SIGINT, exit.
#pragma once

#include <cstdint>
#include <string>

#include "common/http/http_limits.h"

namespace CLI {
class App;
}

namespace tandem::agent {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  int32_t block_size = 16;
  std::string kv_cache_memory = "1GiB";
  int64_t num_blocks = 0;
  std::string kv_dtype = "bf16";
  std::string compute_dtype = "auto";  // auto (bf16 on CUDA, f32 on the CPU), f32, bf16
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  // fcfs or priority (engine::SchedulingPolicy).
  std::string scheduling_policy = "fcfs";
  int64_t max_model_len = 0;
  int64_t max_waiting_requests = 1024;
  // HTTP limits (common/http/http_connection.h), as the router's flags of the
  // same names.
  int64_t max_header_bytes = 16 * 1024;
  int64_t max_body_bytes = 64ll * 1024 * 1024;
  int64_t request_timeout_s = 30;
  int64_t idle_timeout_s = 60;
  int64_t write_timeout_s = 30;
  int64_t large_body_bytes = 1024 * 1024;
  int64_t max_large_requests = 2;
  int64_t max_connections = 0;  // 0: half the descriptor limit, at most 65,536
  std::string served_model_name;
  // Clients send Authorization: Bearer <key> (common/http); empty: the
  // environment's TANDEM_API_KEY, or no key at all.
  std::string api_key;
  std::string api_key_exempt_paths = server::kDefaultApiKeyExemptPaths;
  // LoRA adapters served beside the model: NAME=PATH, comma-separated
  // (docs/lora.md).
  std::string lora_modules;
  std::string chat_template;     // a Jinja file replacing the model's chat template
  std::string tool_call_parser;  // empty: none; else a toolCallParserNames() entry
  std::string reasoning_parser;  // empty: none; else a reasoningParserNames() entry
  // auto: requests start from generation_config.json's sampling; vllm: from
  // the built-in defaults (end-of-sequence ids are read either way).
  std::string generation_config = "auto";
  std::string role = "both";
  std::string prefix_caching_hash = "xxhash";
  double shutdown_timeout_s = 30.0;
  std::string kv_transfer_config;  // JSON, vLLM's shape; empty: no connector
  // JSON, vLLM's --speculative-config (its ngram method); empty: none.
  std::string speculative_config;
  // JSON object, vLLM's --hf-overrides: config.json fields replaced before
  // the model is read; empty: none.
  std::string hf_overrides;
  // A ucx KV producer or consumer on a non-loopback address needs a shared
  // secret unless this is set.
  bool insecure_kv = false;
  // Pull-back holds: blocks one hold may pin, and all holds together (0: a
  // quarter and half of the KV cache).
  int64_t kv_hold_max_blocks = 0;
  int64_t kv_hold_max_total_blocks = 0;
  double kv_hold_yield_after_s = 10.0;
  // kv_connector_extra_config.fault_injection is refused unless this is set.
  bool enable_fault_injection = false;
  // vLLM's --return-tokens-as-token-ids: logprobs name tokens "token_id:<id>"
  // unless a request's return_tokens_as_token_ids says otherwise.
  bool return_tokens_as_token_ids = false;
  int threads = 0;              // kernel threads; 0: every CPU it may use
  std::string device = "auto";  // compute backend: cpu, cuda or auto (cuda when a GPU is visible)
  bool enforce_eager = false;   // never record decode steps (CUDA graphs)
  // ModelRunnerOptions::fuse_projections: auto (true on CUDA), true, false.
  std::string fuse_projections = "auto";
  std::string cuda_kernels =
      "auto";  // CUDA kernel set: auto (flash on CUDA), reference, fast, flash
  // A step profile YAML: serve as a simulated agent (docs/simulation.md).
  std::string simulate;
  std::string config_path;
};

// Registers the subcommand; `options` receives the flag values.
CLI::App* addServeCommand(CLI::App& app, ServeOptions& options);
// Applies the YAML config under flags not given, then serves until a signal.
int runServe(CLI::App& command, ServeOptions& options);

// "2GiB", "512MiB", "1e9", "1073741824" → bytes; throws tandem::Error.
int64_t parseByteSize(const std::string& text, const std::string& what);

}  // namespace tandem::agent
