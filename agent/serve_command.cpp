#include "agent/serve_command.h"

#include <signal.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "agent/agent_config.h"
#include "agent/engine/engine.h"
#include "agent/kv/connector.h"
#include "agent/kv/connector_registry.h"
#include "agent/kv/fault_injection.h"
#include "agent/kv/ucx/kv_buffer.h"
#include "agent/kv/ucx/ucx_connector.h"
#include "agent/server/http_server.h"
#include "agent/transport/ucx_allocator.h"
#include "agent/transport/ucx_transport.h"
#include "common/available_cpus.h"
#include "common/decimal_text.h"
#include "common/http/http_connection.h"
#include "common/logging.h"
#include "common/model_source/hub_fetch.h"
#include "common/protocol/chat_output.h"
#include "common/protocol/reasoning_parser.h"
#include "common/protocol/tool_call_parser.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

namespace tandem::agent {
namespace {

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

// Resolves every ucx connector's kv_buffer ("auto" included) to "slab" or
// "staging" in place, so the connectors obey the choice made here; throws
// naming the field when one cannot work. True when some connector uses the
// slab path (the slab must then be UCX memory).
// A simulated agent's "auto" is staging: UCX would commit the whole slab it
// allocates, while the slab of a simulated agent is mostly never touched.
bool resolveKvBuffers(kv::KvTransferConfig& config, bool slab_host_accessible,
                      bool ucx_supports_cuda, bool simulated) {
  bool slab = false;
  for (kv::KvTransferConfig& member : config.members) {
    slab = resolveKvBuffers(member, slab_host_accessible, ucx_supports_cuda, simulated) || slab;
  }
  if (config.connector != "ucx") return slab;
  auto options = kv::parseKvBufferOptions(config.extra);
  if (!options.isOk()) throw Error(options.status().message());
  if (simulated && options->requested == "auto") options->requested = "staging";
  auto path = kv::chooseKvBuffer(*options, slab_host_accessible, ucx_supports_cuda);
  if (!path.isOk()) throw Error(path.status().message());
  // A device slab on the slab path is registered in place by
  // UcxSlabAllocator (chooseKvBuffer allows it only when UCX moves CUDA memory).
  if (!config.extra.is_object()) config.extra = nlohmann::json::object();
  config.extra["kv_buffer"] = kv::kvBufferPathName(*path);
  return *path == kv::KvBufferPath::kSlab || slab;
}

}  // namespace

int64_t parseByteSize(const std::string& text, const std::string& what) {
  const std::optional<int64_t> bytes = byteSizeOf(text);
  if (!bytes) {
    throw Error(what +
                " must be a size from 1 byte to 1PiB such as 2GiB, 512MiB or 1073741824, got \"" +
                text + "\"");
  }
  return *bytes;
}

CLI::App* addServeCommand(CLI::App& app, ServeOptions& o) {
  CLI::App* serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  // Every option of the table in agent_config.cpp; runServe applies them.
  addServeFlags(*serve);
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
  YAML::Node file;
  if (!o.config_path.empty()) file = loadServeConfigFile(o.config_path);
  applyServeOptions(command, file, o.config_path, o);
  if (o.threads > 0) {
    kernels::setNumThreads(o.threads);
  } else if (const AvailableCpus cpus = availableCpus(); cpus.cgroup_limit) {
    TANDEM_LOG(kInfo) << "kernel threads: " << cpus.cpus << ", the CPUs it may use ("
                      << cpus.affinity << " in its affinity mask, a cgroup CPU limit of "
                      << *cpus.cgroup_limit << ")";
  }
  if (o.model.empty()) throw Error("--model is required (or model: in --config)");
  // A --host it cannot listen on, or exempt paths it cannot take, are
  // refused now, not after the model's load.
  (void)server::listenAddress(o.host, o.port);
  server::checkConnectionBound(o.max_connections);
  std::vector<std::string> api_key_exempt =
      server::parseApiKeyExemptPaths(o.api_key_exempt_paths, "--api-key-exempt-paths");
  // A directory that a fetch is still filling (or that one left half done)
  // is never loaded: its weights may be partly written.
  if (auto problem = model_source::modelDirectoryProblem(o.model)) throw Error(*problem);

  engine::EngineConfig config;
  config.model_dir = o.model;
  // A simulated agent computes nothing: its KV slab is host memory whatever
  // --device says.
  config.device = o.simulate.empty() ? kernels::resolveDevice(o.device) : kernels::DeviceKind::kCpu;
  config.enforce_eager = o.enforce_eager;
  config.fuse_projections =
      kernels::resolveFuseProjections(o.fuse_projections, "--fuse-projections", config.device);
  config.cuda_kernels =
      kernels::resolveCudaKernels(o.cuda_kernels, "--cuda-kernels", config.device);
  config.lora_modules = engine::parseLoraModuleSpecs(o.lora_modules);
  const std::string served_model_name = o.served_model_name.empty()
                                            ? std::filesystem::path(o.model).filename().string()
                                            : o.served_model_name;
  // (A name given twice the engine refuses before loading anything.)
  for (const engine::LoraModuleSpec& spec : config.lora_modules) {
    if (spec.name == served_model_name) {
      throw Error("--lora-modules names " + spec.name +
                  ", the served model's own name: give the adapter another");
    }
  }
  config.block_size = o.block_size;
  config.num_blocks = o.num_blocks;
  config.kv_cache_memory_bytes = parseByteSize(o.kv_cache_memory, "--kv-cache-memory");
  config.kv_dtype = engine::kvDtypeFromName(o.kv_dtype);
  config.compute_dtype = kernels::resolveComputeDType(o.compute_dtype, "--compute-dtype",
                                                      config.device, config.cuda_kernels);
  config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  config.scheduler.max_num_seqs = o.max_num_seqs;
  config.scheduler.policy = engine::schedulingPolicyFromName(o.scheduling_policy);
  config.max_model_len = o.max_model_len;
  config.hf_overrides = o.hf_overrides;
  if (!o.speculative_config.empty()) {
    auto speculative = engine::SpeculativeConfig::parse(o.speculative_config);
    if (!speculative.isOk()) throw Error("--" + speculative.status().message());
    config.speculative = *speculative;
  }
  config.max_waiting_requests = o.max_waiting_requests;
  config.max_hold_blocks = o.kv_hold_max_blocks;
  config.max_total_hold_blocks = o.kv_hold_max_total_blocks;
  config.hold_yield_after_s = o.kv_hold_yield_after_s;
  auto hash = parseHashAlgorithm(o.prefix_caching_hash);
  if (!hash.isOk()) throw Error("--prefix-caching-hash: " + hash.status().message());
  config.hash_algorithm = *hash;
  if (!o.simulate.empty()) {
    auto profile = engine::StepProfile::fromFile(o.simulate);
    if (!profile.isOk()) throw Error("--simulate: " + profile.status().message());
    config.simulate = std::move(*profile);
  }
  std::unique_ptr<engine::KvSlabAllocator> slab_allocator;
  bool kv_unsigned = false;  // a KV connector without a shared secret
  if (!o.kv_transfer_config.empty()) {
    auto transfer = kv::KvTransferConfig::parse(o.kv_transfer_config);
    if (!transfer.isOk()) throw Error("--" + transfer.status().message());
    // Refused before the KV slab is allocated and committed (a slab of
    // gigabytes takes a while).
    (void)kv::checkFaultInjection(transfer->extra, o.enable_fault_injection);
    kv_unsigned = kv::kvSecret(*transfer).empty();
    const bool unprotected =
        kv::needsUcxSlab(*transfer) && !isLoopback(o.host) && kv_unsigned && !o.insecure_kv;
    if (unprotected && transfer->produces()) {
      throw Error("a KV producer listening on " + o.host +
                  " lets any peer read its KV blocks: set a shared secret "
                  "(kv_connector_extra_config.secret or TANDEM_KV_SECRET), or pass --insecure-kv");
    }
    if (unprotected && transfer->consumes()) {
      throw Error("a KV consumer listening on " + o.host +
                  " lets any client make it connect to any host and port: set a shared secret "
                  "(kv_connector_extra_config.secret or TANDEM_KV_SECRET), or pass --insecure-kv");
    }
    // The KV buffer (kv_buffer.h): ask UCX which memory it can move, then
    // register the slab itself or only a host staging area.
    std::shared_ptr<transport::UcxContext> ucx_context;
    bool slab_in_ucx = false;
    if (kv::needsUcxSlab(*transfer)) {
      ucx_context = transport::UcxContext::create();
      const bool slab_host_accessible = config.device == kernels::DeviceKind::kCpu;
      slab_in_ucx = resolveKvBuffers(*transfer, slab_host_accessible,
                                     ucx_context->supportsCudaMemory(), !o.simulate.empty());
    }
    config.connector_factory = [transfer = *transfer, faults = o.enable_fault_injection](
                                   engine::KvCache& cache, const std::string& model_identity) {
      return kv::withFaultInjection(kv::makeConnector(transfer, cache, model_identity), faults,
                                    cache.blockSize());
    };
    if (slab_in_ucx) {
      // One UCX context per agent; the KV slab is memory UCX allocated, so
      // peers read it one-sidedly. On the staging path the slab is the
      // backend's and the connector registers only its staging area.
      slab_allocator = std::make_unique<transport::UcxSlabAllocator>(ucx_context);
    }
  }

  engine::Engine engine(config, std::move(slab_allocator));
  if (Status advertised = engine.advertiseKvAddress(o.host, o.port); !advertised.isOk()) {
    throw Error(advertised.message());
  }
  server::ServerConfig server_config;
  server_config.host = o.host;
  server_config.port = o.port;
  server_config.served_model_name = served_model_name;
  server_config.role = o.role;
  server_config.api_key = server::apiKeyFrom(o.api_key);
  server_config.api_key_exempt = std::move(api_key_exempt);
  // The KV routes skip the API key because the KV secret signs them: with a
  // key and no secret, whoever reaches the agent may pin its blocks, probe
  // which prompts it caches and read its KV.
  const bool kv_routes_exempt =
      std::any_of(server_config.api_key_exempt.begin(), server_config.api_key_exempt.end(),
                  [](const std::string& path) { return path.starts_with("/v1/kv_transfer"); });
  if (!server_config.api_key.empty() && kv_unsigned && kv_routes_exempt) {
    TANDEM_LOG(kWarn) << "the agent has an API key but its KV connector no shared secret: "
                         "/v1/kv_transfer/* (exempt from the key) are open to anyone who reaches "
                         "it; set kv_connector_extra_config.secret or TANDEM_KV_SECRET";
  }
  server::HttpLimits& http = server_config.http;
  http.max_header_bytes = static_cast<size_t>(o.max_header_bytes);
  http.max_body_bytes = static_cast<uint64_t>(o.max_body_bytes);
  http.request_timeout = std::chrono::seconds(o.request_timeout_s);
  http.idle_timeout = std::chrono::seconds(o.idle_timeout_s);
  http.write_timeout = std::chrono::seconds(o.write_timeout_s);
  http.large_body_bytes = static_cast<uint64_t>(o.large_body_bytes);
  http.max_large_requests = static_cast<int>(o.max_large_requests);
  http.max_connections = o.max_connections;
  // Parsed once here: a template that does not parse stops the agent before
  // it serves, naming the file and line.
  auto chat_template = server::ChatTemplate::load(engine.tokenizer(), o.chat_template);
  if (!chat_template.isOk()) throw Error(chat_template.status().message());
  server_config.chat_template = std::move(*chat_template);
  if (!o.tool_call_parser.empty()) {
    auto kind = protocol::toolCallParserFromName(o.tool_call_parser);
    if (!kind.isOk()) throw Error(kind.status().message());
    server_config.chat_output.tool_call_parser = *kind;
  }
  if (!o.reasoning_parser.empty()) {
    auto kind = protocol::reasoningParserFromName(o.reasoning_parser);
    if (!kind.isOk()) throw Error(kind.status().message());
    server_config.chat_output.reasoning_parser = *kind;
  }
  // gpt-oss writes the harmony format whatever the flags say: unparsed, its
  // channels' markers would be dropped and their texts run together. As
  // vLLM does for gpt-oss, its output is read by default (docs/chat.md).
  if (o.reasoning_parser.empty() && o.tool_call_parser.empty() &&
      engine.model().config().gptOss()) {
    server_config.chat_output.reasoning_parser = protocol::ReasoningParserKind::kOpenAiGptOss;
    server_config.chat_output.tool_call_parser = protocol::ToolCallParserKind::kOpenAi;
    TANDEM_LOG(kInfo) << "gpt-oss: chat output read as harmony (--reasoning-parser "
                         "openai_gptoss, --tool-call-parser openai)";
  }
  if (Status paired = protocol::pairChatOutputParsers(server_config.chat_output); !paired.isOk()) {
    throw Error(paired.message());
  }
  server_config.return_tokens_as_token_ids = o.return_tokens_as_token_ids;
  const protocol::GenerationDefaults& defaults = engine.generationConfig().defaults;
  if (o.generation_config == "auto" && !defaults.empty()) {
    server_config.generation_defaults = defaults;
    TANDEM_LOG(kInfo) << "requests that leave them out take the model's generation_config.json "
                         "values: "
                      << defaults.describe() << " (--generation-config vllm: the built-in ones)";
  }
  if (!server_config.chat_template->hasTemplate()) {
    TANDEM_LOG(kWarn) << "the model has no chat template: /v1/chat/completions answers 400 "
                         "(give one with --chat-template FILE)";
  }
  // POST /admin/drain drains as SIGTERM does: the signal thread below.
  server_config.on_drain = [] { ::kill(::getpid(), SIGTERM); };
  server::HttpServer server(engine, server_config);
  server.bind();
  // The bound port (the check above used the configured one).
  if (Status advertised = engine.advertiseKvAddress(o.host, server.port()); !advertised.isOk()) {
    throw Error(advertised.message());
  }
  TANDEM_LOG(kInfo) << "serving " << server_config.served_model_name << " on http://" << o.host
                    << ":" << server.port() << " (" << engine.numBlocks() << " KV blocks of "
                    << o.block_size << " tokens, max_model_len " << engine.maxModelLen() << ", on "
                    << engine.backend().description() << ")";
  // The bound port on stdout, for supervisors that asked for port 0.
  std::printf("listening on %s:%d\n", o.host.c_str(), server.port());
  std::fflush(stdout);

  std::thread signals([&] {
    int signal_number = waitForSignal();
    TANDEM_LOG(kInfo) << "signal " << signal_number << ": draining for up to "
                      << o.shutdown_timeout_s << " s";
    const auto drain_start = engine::Clock::now();
    server.setReady(false);
    // Streams a router can move are handed over with their KV; the others
    // finish here until the deadline.
    engine.drain();
    engine.shutdown(drain_start + std::chrono::duration_cast<engine::Clock::duration>(
                                      std::chrono::duration<double>(o.shutdown_timeout_s)));
    TANDEM_LOG(kInfo) << "drained in "
                      << std::chrono::duration<double>(engine::Clock::now() - drain_start).count()
                      << " s (" << engine.stats().num_handed_over << " requests handed over)";
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
