#include "agent/serve_command.h"

#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "agent/engine/engine.h"
#include "agent/kv/connector.h"
#include "agent/kv/fault_injection.h"
#include "agent/kv/ucx/ucx_connector.h"
#include "agent/server/http_server.h"
#include "agent/transport/ucx_allocator.h"
#include "agent/transport/ucx_transport.h"
#include "common/logging.h"
#include "common/status.h"

namespace tandem::agent {
namespace {

// Sets the YAML value of `key` (snake_case or kebab-case) into `target` unless
// the flag was given on the command line.
template <typename T>
void fromYaml(const YAML::Node& root, CLI::App& command, const std::string& flag, T& target,
              const std::string& path) {
  std::string snake = flag;
  for (char& c : snake) c = c == '-' ? '_' : c;
  // Look up through a const node: yaml-cpp's non-const operator[] inserts.
  const std::string& key = root[snake] ? snake : flag;
  if (!root[key]) return;
  if (command.get_option("--" + flag)->count() > 0) return;
  try {
    target = root[key].as<T>();
  } catch (const YAML::Exception&) {
    throw Error(path + ": " + key + " has the wrong type");
  }
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

int waitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  sigwait(&set, &signal_number);
  return signal_number;
}

}  // namespace

int64_t parseByteSize(const std::string& text, const std::string& what) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  const std::string suffix = text.substr(end);
  double scale = 0;
  if (suffix.empty() || suffix == "B") scale = 1;
  if (suffix == "KiB" || suffix == "K") scale = 1024.0;
  if (suffix == "MiB" || suffix == "M") scale = 1024.0 * 1024;
  if (suffix == "GiB" || suffix == "G") scale = 1024.0 * 1024 * 1024;
  if (suffix == "KB") scale = 1e3;
  if (suffix == "MB") scale = 1e6;
  if (suffix == "GB") scale = 1e9;
  if (end == 0 || scale == 0 || !(value > 0) || !std::isfinite(value)) {
    throw Error(what + " must be a positive size such as 2GiB, 512MiB or 1073741824, got \"" +
                text + "\"");
  }
  return static_cast<int64_t>(value * scale);
}

CLI::App* addServeCommand(CLI::App& app, ServeOptions& o) {
  CLI::App* serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  serve->add_option("--model", o.model, "Hugging Face model directory");
  serve->add_option("--host", o.host, "address to listen on")->capture_default_str();
  serve->add_option("--port", o.port, "port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  serve->add_option("--block-size", o.block_size, "KV block size in tokens")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  serve->add_option("--kv-cache-memory", o.kv_cache_memory, "KV cache size, e.g. 2GiB")
      ->capture_default_str();
  serve->add_option("--num-blocks", o.num_blocks, "KV blocks (overrides --kv-cache-memory)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--kv-dtype", o.kv_dtype, "KV cache dtype: bf16 or f32")->capture_default_str();
  serve->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "tokens per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--max-num-seqs", o.max_num_seqs, "sequences per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--max-model-len", o.max_model_len, "context length (0: the model's)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--max-waiting-requests", o.max_waiting_requests, "queued requests before 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--served-model-name", o.served_model_name,
                    "model name in the API (default: the directory name)");
  serve->add_option("--role", o.role, "metrics role label: prefill, decode or both")
      ->capture_default_str();
  serve->add_option("--prefix-caching-hash", o.prefix_caching_hash, "xxhash or sha256")
      ->capture_default_str();
  serve
      ->add_option("--shutdown-timeout", o.shutdown_timeout_s,
                   "seconds to finish in-flight requests on SIGTERM")
      ->capture_default_str();
  serve->add_option("--kv-transfer-config", o.kv_transfer_config,
                    "KV connector, e.g. {\"kv_connector\":\"storage\",\"kv_role\":\"kv_both\","
                    "\"kv_connector_extra_config\":{\"shared_storage_path\":\"/tmp/kv\"}}");
  serve->add_flag("--insecure-kv", o.insecure_kv,
                  "let a KV producer listen on a non-loopback address without a shared secret");
  serve->add_flag("--enable-fault-injection", o.enable_fault_injection,
                  "accept kv_connector_extra_config.fault_injection (tests only)");
  serve->add_option("--config", o.config_path, "YAML file with the same keys");
  return serve;
}

int runServe(CLI::App& command, ServeOptions& o) {
  // Signals are taken by a waiting thread, never by a handler: block them
  // before any thread is started (UCX starts its own when the KV connector
  // needs a UCX slab), so every thread inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  if (!o.config_path.empty()) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(o.config_path);
    } catch (const YAML::Exception& e) {
      throw Error(o.config_path + ": " + e.what());
    }
    if (!root.IsMap()) throw Error(o.config_path + ": must be a mapping of option names");
    fromYaml(root, command, "model", o.model, o.config_path);
    fromYaml(root, command, "host", o.host, o.config_path);
    fromYaml(root, command, "insecure-kv", o.insecure_kv, o.config_path);
    fromYaml(root, command, "enable-fault-injection", o.enable_fault_injection, o.config_path);
    fromYaml(root, command, "port", o.port, o.config_path);
    fromYaml(root, command, "block-size", o.block_size, o.config_path);
    fromYaml(root, command, "kv-cache-memory", o.kv_cache_memory, o.config_path);
    fromYaml(root, command, "num-blocks", o.num_blocks, o.config_path);
    fromYaml(root, command, "kv-dtype", o.kv_dtype, o.config_path);
    fromYaml(root, command, "max-num-batched-tokens", o.max_num_batched_tokens, o.config_path);
    fromYaml(root, command, "max-num-seqs", o.max_num_seqs, o.config_path);
    fromYaml(root, command, "max-model-len", o.max_model_len, o.config_path);
    fromYaml(root, command, "max-waiting-requests", o.max_waiting_requests, o.config_path);
    fromYaml(root, command, "served-model-name", o.served_model_name, o.config_path);
    fromYaml(root, command, "role", o.role, o.config_path);
    fromYaml(root, command, "prefix-caching-hash", o.prefix_caching_hash, o.config_path);
    fromYaml(root, command, "shutdown-timeout", o.shutdown_timeout_s, o.config_path);
    // In YAML the connector config may be a mapping rather than JSON text.
    const YAML::Node& const_root = root;
    if (const_root["kv_transfer_config"] &&
        command.get_option("--kv-transfer-config")->count() == 0) {
      const YAML::Node& node = const_root["kv_transfer_config"];
      if (node.IsScalar()) {
        o.kv_transfer_config = node.as<std::string>();
      } else {
        YAML::Emitter json_out;
        json_out << YAML::DoubleQuoted << YAML::Flow << node;
        o.kv_transfer_config = json_out.c_str();
      }
    }
  }
  if (o.model.empty()) throw Error("--model is required (or model: in --config)");
  if (o.role != "prefill" && o.role != "decode" && o.role != "both") {
    throw Error("--role must be prefill, decode or both, got " + o.role);
  }

  engine::EngineConfig config;
  config.model_dir = o.model;
  config.block_size = o.block_size;
  config.num_blocks = o.num_blocks;
  config.kv_cache_memory_bytes = parseByteSize(o.kv_cache_memory, "--kv-cache-memory");
  auto kv_dtype = dtypeFromShortName(o.kv_dtype);
  if (!kv_dtype || (*kv_dtype != DType::kF32 && *kv_dtype != DType::kBF16)) {
    throw Error("--kv-dtype must be f32 or bf16, got " + o.kv_dtype);
  }
  config.kv_dtype = *kv_dtype;
  config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  config.scheduler.max_num_seqs = o.max_num_seqs;
  config.max_model_len = o.max_model_len;
  config.max_waiting_requests = o.max_waiting_requests;
  auto hash = parseHashAlgorithm(o.prefix_caching_hash);
  if (!hash.isOk()) throw Error("--prefix-caching-hash: " + hash.status().message());
  config.hash_algorithm = *hash;
  std::unique_ptr<engine::KvSlabAllocator> slab_allocator;
  if (!o.kv_transfer_config.empty()) {
    auto transfer = kv::KvTransferConfig::parse(o.kv_transfer_config);
    if (!transfer.isOk()) throw Error("--" + transfer.status().message());
    if (kv::needsUcxSlab(*transfer) && transfer->produces() && !isLoopback(o.host) &&
        kv::kvSecret(*transfer).empty() && !o.insecure_kv) {
      throw Error("a KV producer listening on " + o.host +
                  " lets any peer read its KV blocks: set a shared secret "
                  "(kv_connector_extra_config.secret or TANDEM_KV_SECRET), or pass --insecure-kv");
    }
    config.connector_factory = [transfer = *transfer, faults = o.enable_fault_injection](
                                   engine::KvCache& cache, const std::string& model_identity) {
      return kv::withFaultInjection(kv::makeConnector(transfer, cache, model_identity), faults,
                                    cache.blockSize());
    };
    if (kv::needsUcxSlab(*transfer)) {
      // One UCX context per agent; the KV slab is memory UCX allocated, so
      // peers read it one-sidedly.
      slab_allocator =
          std::make_unique<transport::UcxSlabAllocator>(transport::UcxContext::create());
    }
  }

  engine::Engine engine(config, std::move(slab_allocator));
  server::ServerConfig server_config;
  server_config.host = o.host;
  server_config.port = o.port;
  server_config.served_model_name = o.served_model_name.empty()
                                        ? std::filesystem::path(o.model).filename().string()
                                        : o.served_model_name;
  server_config.role = o.role;
  server::HttpServer server(engine, server_config);
  server.bind();
  TANDEM_LOG(kInfo) << "serving " << server_config.served_model_name << " on http://" << o.host
                    << ":" << server.port() << " (" << engine.numBlocks() << " KV blocks of "
                    << o.block_size << " tokens, max_model_len " << engine.maxModelLen() << ")";
  // The bound port on stdout, for supervisors that asked for port 0.
  std::printf("listening on %s:%d\n", o.host.c_str(), server.port());
  std::fflush(stdout);

  std::thread signals([&] {
    int signal_number = waitForSignal();
    TANDEM_LOG(kInfo) << "signal " << signal_number << ": draining for up to "
                      << o.shutdown_timeout_s << " s";
    server.setReady(false);
    engine.shutdown(engine::Clock::now() +
                    std::chrono::duration_cast<engine::Clock::duration>(
                        std::chrono::duration<double>(o.shutdown_timeout_s)));
    // Let the handlers write what the engine finished, then stop listening.
    server.waitForIdle(engine::Clock::now() + std::chrono::seconds(5));
    server.stop();
  });
  server.serve();
  signals.join();
  TANDEM_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace tandem::agent
