#include "agent/engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "agent/engine/simulation/simulated_backend.h"
#include "agent/engine/simulation/simulated_step.h"
#include "agent/engine/stop_strings.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/structured/matcher.h"
#include "kernels/kernels.h"

namespace tandem::engine {

namespace {

constexpr std::string_view kTooAmbiguous =
    "the structured output is too ambiguous to follow: its nested repeats parse the same text in "
    "too many ways";

// The prompt tokens a sequence read from the prefix cache: a resumed
// stream's cached blocks may reach into its resumed output, which is not
// prompt (usage's cached_tokens is part of prompt_tokens).
int64_t cachedPromptTokens(const Sequence& sequence) {
  return std::min(sequence.num_cached_tokens, sequence.num_prompt_tokens);
}

}  // namespace

struct Engine::Live {
  Live(const Tokenizer& tokenizer, const Request& request)
      : detokenizer(tokenizer, request.sampling.skip_special_tokens),
        stop(request.sampling.stop, request.sampling.include_stop_str_in_output),
        rng(SamplerRng::forRequest(request.sampling)) {}

  OutputCallback callback;
  IncrementalDetokenizer detokenizer;
  StopStringMatcher stop;
  SamplerRng rng;
  RequestTimings timings;
  bool sent_first = false;
  std::string resumed_text;                      // handed out with the first output
  std::unique_ptr<structured::Matcher> matcher;  // a structured output's state
  SimulatedTokenState simulated;                 // simulated engines only
};

// The scheduler's view of the KV connector.
class Engine::ConnectorSource : public ExternalKvSource {
 public:
  // on_transfer(source, blocks loaded, seconds) is called for each finished
  // load. link_seconds(blocks), set on a simulated engine, is how long a
  // hand-off of that many blocks from another agent lasts on the profile's
  // link (0: not timed).
  ConnectorSource(kv::KvConnector& connector, const BlockHasher& hasher,
                  std::function<void(const std::string&, int64_t, double)> on_transfer,
                  std::function<double(int64_t)> link_seconds)
      : connector_(connector),
        hasher_(hasher),
        on_transfer_(std::move(on_transfer)),
        link_seconds_(std::move(link_seconds)) {}

  Lookup lookup(const Sequence& sequence, int64_t num_local_tokens) override {
    kv::LookupResult result = connector_.scheduler().lookup(request(sequence), num_local_tokens);
    Lookup lookup;
    lookup.pending = result.state == kv::LookupResult::State::kPending;
    if (result.state == kv::LookupResult::State::kAvailable) lookup.num_tokens = result.num_tokens;
    return lookup;
  }

  Load load(const Sequence& sequence, int64_t first_block, int64_t num_blocks) override {
    std::span<const BlockId> ids =
        std::span<const BlockId>(sequence.blocks.blocks).subspan(first_block, num_blocks);
    const auto start = Clock::now();
    kv::LoadResult result = connector_.worker().load(request(sequence), first_block, ids);
    if (result.done) {
      const int64_t loaded = num_blocks - static_cast<int64_t>(result.failed_block_indices.size());
      on_transfer_(result.source.empty() ? connector_.config().connector : result.source, loaded,
                   std::chrono::duration<double>(Clock::now() - start).count());
    } else if (link_seconds_) {
      load_starts_[sequence.request.id] = start;
    }
    return Load{result.done, std::move(result.failed_block_indices)};
  }

  // Hands finished asynchronous loads to the scheduler. On a simulated
  // engine a load from another agent is held back until its modelled link
  // time since load() has passed: the request keeps waiting for remote KV
  // as for a transfer still in flight; the engine thread does not wait.
  void pollLoads(Scheduler& scheduler) {
    for (auto& finished : connector_.worker().poll()) {
      const double modelled =
          link_seconds_ && finished.from_peer ? link_seconds_(loadedBlocks(finished)) : 0.0;
      auto started = load_starts_.extract(finished.request_id);
      if (modelled > 0) {
        const Clock::time_point start = started ? started.mapped() : Clock::now();
        // The metric shows the hand-off's duration on the simulated link.
        finished.seconds = std::max(finished.seconds, modelled);
        in_link_.push_back({start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(modelled)),
                            std::move(finished)});
        continue;
      }
      report(scheduler, std::move(finished));
    }
    if (in_link_.empty()) return;
    const auto now = Clock::now();
    for (auto it = in_link_.begin(); it != in_link_.end();) {
      if (now < it->done) {
        ++it;
        continue;
      }
      report(scheduler, std::move(it->load));
      it = in_link_.erase(it);
    }
  }

  bool failOnLoadError() const override {
    return connector_.config().load_failure_policy == kv::LoadFailurePolicy::kFail;
  }

  kv::FinishDecision finished(const Sequence& sequence) {
    return connector_.scheduler().requestFinished(request(sequence), sequence.blocks.blocks,
                                                  sequence.num_computed_tokens);
  }

  void abandoned(const Sequence& sequence) {
    connector_.scheduler().requestAbandoned(sequence.request.id);
  }

  std::vector<std::string> pollReleased() { return connector_.worker().pollReleased(); }
  void holdEnded(const std::string& id) { connector_.scheduler().holdEnded(id); }

  // Hands newly computed full blocks to the connector (producers save them).
  void save(Sequence& sequence) {
    const int64_t full = sequence.num_computed_tokens / hasher_.blockSize();
    if (full <= sequence.num_saved_blocks) return;
    std::span<const BlockId> ids =
        std::span<const BlockId>(sequence.blocks.blocks)
            .subspan(sequence.num_saved_blocks, full - sequence.num_saved_blocks);
    connector_.worker().save(request(sequence), sequence.num_saved_blocks, ids);
    sequence.num_saved_blocks = full;
  }

 private:
  static int64_t loadedBlocks(const kv::KvConnectorWorker::FinishedLoad& finished) {
    return std::max<int64_t>(
        0, finished.num_blocks - static_cast<int64_t>(finished.failed_block_indices.size()));
  }

  void report(Scheduler& scheduler, kv::KvConnectorWorker::FinishedLoad finished) {
    if (finished.num_blocks > 0) {
      on_transfer_(finished.source.empty() ? connector_.config().connector : finished.source,
                   loadedBlocks(finished), finished.seconds);
    }
    scheduler.loadFinished(finished.request_id, std::move(finished.failed_block_indices));
  }

  kv::ConnectorRequest request(const Sequence& sequence) {
    hashes_ = hasher_.hashFullBlocks(sequence.tokens, sequence.request.cache_salt,
                                     sequence.adapter_identity);
    kv::ConnectorRequest request;
    request.request_id = sequence.request.id;
    request.tokens = sequence.tokens;
    request.block_hashes = hashes_;
    if (!sequence.request.kv_transfer_params.is_null()) {
      request.kv_transfer_params = &sequence.request.kv_transfer_params;
    }
    request.remote_source_spent = sequence.num_preemptions > 0;
    return request;
  }

  kv::KvConnector& connector_;
  const BlockHasher& hasher_;
  std::function<void(const std::string&, int64_t, double)> on_transfer_;
  std::function<double(int64_t)> link_seconds_;  // empty: loads are not timed
  std::vector<BlockHash> hashes_;                // of the request last described
  // When each asynchronous load began, by request id (timed engines only).
  std::unordered_map<std::string, Clock::time_point> load_starts_;
  // Loads from other agents, held until their modelled link time has passed.
  struct InLink {
    Clock::time_point done;
    kv::KvConnectorWorker::FinishedLoad load;
  };
  std::vector<InLink> in_link_;
};

namespace {

// What KV bytes depend on: the weights' content (not the directory's name:
// a Hub snapshot's is its revision, "main" for every model), the config's
// arithmetic (rotary parameters, norm epsilon, head layout: one set of
// weights under two config.json files is two models), the shape and dtype,
// and the kernels' bits, which differ between devices and between the
// CPU's instruction sets (docs/engine.md: reproducible per ISA), named by
// `kernels` ("cuda", "cpu-avx512", ...).
std::string modelIdentityOf(const Model& model, const std::string& kernels) {
  const ModelConfig& c = model.config();
  return c.architecture + "/w" + model.weightsDigest() + "/c" + c.computeDigest() + "/h" +
         std::to_string(c.hidden_size) + "/l" + std::to_string(c.num_hidden_layers) + "/v" +
         std::to_string(c.vocab_size) + "/" + dtypeShortName(model.weightDType()) + "/" + kernels;
}

}  // namespace

Engine::Engine(const EngineConfig& config, std::unique_ptr<KvSlabAllocator> allocator)
    : config_(config),
      now_(config.clock ? config.clock : [] { return Clock::now(); }),
      events_(config.kv_event_capacity) {
  const StepProfile* simulated = simulatedProfile();
  // Adapters the engine cannot serve are refused before anything loads.
  for (size_t i = 0; i < config_.lora_modules.size(); ++i) {
    const LoraModuleSpec& spec = config_.lora_modules[i];
    if (simulated) {
      throw Error("LoRA adapter " + spec.name +
                  ": a simulated agent computes no forward pass to adapt (docs/lora.md)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (config_.lora_modules[j].name == spec.name) {
        throw Error("--lora-modules names " + spec.name + " twice");
      }
    }
  }
  if (simulated && config_.speculative.enabled()) {
    throw Error(
        "--speculative-config: a simulated agent computes no forward pass to verify drafts "
        "(docs/speculative-decoding.md)");
  }
  if (simulated) {
    // Host memory whatever --device says: no kernel runs.
    backend_ = std::make_unique<SimulatedBackend>(simulated->name);
  } else {
    backend_ = kernels::makeBackend(config_.device, {.cuda_kernels = config_.cuda_kernels,
                                                     .fused_launches = config_.fuse_projections});
    backend_->setComputeDType(config_.compute_dtype);
  }
  model_ = Model::load(config_.model_dir, config_.hf_overrides);
  {
    std::ostringstream checked;
    checked << std::fixed << std::setprecision(2) << model_->checkedBytes() / 1e9 << " GB in "
            << model_->checkSeconds() << " s";
    TANDEM_LOG(kInfo) << "model: no NaN or infinity in its weights (" << checked.str() << ")";
  }
  if (!simulated && config_.compute_dtype == DType::kBF16 &&
      model_->weightDType() != DType::kBF16) {
    TANDEM_LOG(kWarn) << "compute dtype bf16 applies to bf16 weights only; this model's are "
                      << dtypeShortName(model_->weightDType()) << " and compute in f32";
  }
  if (model_->fp8Matrices() > 0) {
    const Fp8Quantization& q = model_->config().quantization;
    TANDEM_LOG(kInfo) << "model: " << model_->fp8Matrices() << " fp8 matrices (" << q.method << ", "
                      << granularityName(q.granularity)
                      << " scales), multiplied by fp32 activations"
                      << (config_.compute_dtype == DType::kBF16 ? " whatever --compute-dtype says"
                                                                : "")
                      << " (docs/quantization.md)";
  }
  tokenizer_ = Tokenizer::fromDirectory(config_.model_dir);
  const ModelConfig& mc = model_->config();
  const ContextLimit limit =
      simulated ? ContextLimit{simulated->model.max_position_embeddings,
                               "profile " + simulated->name + "'s model.max_position_embeddings"}
                : contextLimit(mc, *backend_);
  if (!simulated && limit.tokens < mc.max_position_embeddings && config_.max_model_len == 0) {
    TANDEM_LOG(kInfo) << "max_model_len is the model's sliding_window, " << limit.tokens;
  }
  max_model_len_ = config_.max_model_len > 0 ? config_.max_model_len : limit.tokens;
  if (max_model_len_ > limit.tokens) {
    throw Error("max_model_len " + std::to_string(max_model_len_) + " exceeds " + limit.origin +
                " " + std::to_string(limit.tokens));
  }
  model_->fitContext(max_model_len_);

  KvCacheConfig kv = KvCacheConfig::forModel(*model_, config_.kv_dtype, config_.block_size);
  if (config_.num_blocks > 0) {
    kv.num_blocks = config_.num_blocks;
  } else if (simulated) {
    // Blocks as the simulated accelerator holds them; each is backed by a
    // block of the model directory's (small) geometry.
    const int64_t block_bytes = simulated->model.kv_bytes_per_token * kv.block_size;
    kv.num_blocks = block_bytes > 0 ? config_.kv_cache_memory_bytes / block_bytes : 0;
    if (kv.num_blocks <= 0) {
      throw Error("KV cache memory of " + std::to_string(config_.kv_cache_memory_bytes) +
                  " bytes holds no block of " + std::to_string(block_bytes) + " bytes (profile " +
                  simulated->name + "'s model.kv_bytes_per_token " +
                  std::to_string(simulated->model.kv_bytes_per_token) + " x block_size " +
                  std::to_string(kv.block_size) + ")");
    }
  } else {
    kv.num_blocks = kv.blocksForBytes(config_.kv_cache_memory_bytes);
  }
  if (kv.num_blocks <= 0) {
    throw Error("KV cache memory of " + std::to_string(config_.kv_cache_memory_bytes) +
                " bytes holds no block of " + std::to_string(kv.blockBytes()) + " bytes");
  }
  // vLLM refuses to start so; here the cache bounds each request instead
  // (the server's limits, docs/configuration.md).
  if (const int64_t cache_tokens = kv.num_blocks * kv.block_size; cache_tokens < max_model_len_) {
    TANDEM_LOG(kWarn) << "the KV cache holds " << cache_tokens << " tokens (" << kv.num_blocks
                      << " blocks of " << kv.block_size << "), fewer than max_model_len "
                      << max_model_len_ << ": a request's prompt plus max_tokens may not pass "
                      << cache_tokens
                      << ", and one without max_tokens generates at most that minus its prompt "
                         "(give the cache more memory, or lower --max-model-len)";
  }
  if (allocator) {
    allocator->bindBackend(*backend_);
  } else {
    allocator = slabAllocatorFor(*backend_);
  }
  cache_ = std::make_unique<KvCache>(kv, std::move(allocator));
  if (kv.dtype == DType::kF8E4M3) {
    if (kv.scales.empty()) {
      TANDEM_LOG(kWarn) << "KV cache fp8 (e4m3): the checkpoint has no K/V scales, so every "
                           "scale is 1 (K/V values beyond +-448 saturate; "
                           "docs/quantization.md#fp8-kv-cache)";
    } else {
      TANDEM_LOG(kInfo) << "KV cache fp8 (e4m3) with the checkpoint's K/V scales, layer 0: "
                        << kv.scales[0] << "/" << kv.scales[1];
    }
  }
  cache_->attachBackend(backend_.get());
  // A simulated agent's blocks hold no model's KV: never mistaken for a real
  // agent's (block hashes and connector handshakes compare identities).
  const auto digest_start = std::chrono::steady_clock::now();
  const std::string& digest = model_->weightsDigest();
  TANDEM_LOG(kInfo)
      << "model weights digest " << digest << ": "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - digest_start).count()
      << " s";
  model_identity_ = modelIdentityOf(*model_, simulated ? "simulated:" + simulated->name
                                             : config_.device == kernels::DeviceKind::kCuda
                                                 ? std::string("cuda")
                                                 : "cpu-" + kernels::isaName());
  // Nor KV computed from bf16-rounded activations for exact fp32 KV.
  if (!simulated && config_.compute_dtype != DType::kF32) {
    model_identity_ += std::string("/compute-") + dtypeShortName(config_.compute_dtype);
  }
  // Nor KV whose later layers followed the flash attention kernel's bits.
  if (!simulated && config_.device == kernels::DeviceKind::kCuda &&
      config_.cuda_kernels == kernels::CudaKernels::kFlash) {
    model_identity_ += "/attention-flash";
  }
  BlockManagerConfig block_config;
  block_config.num_blocks = kv.num_blocks;
  block_config.block_size = kv.block_size;
  block_config.hash_algorithm = config_.hash_algorithm;
  block_config.model_identity = model_identity_;
  block_manager_ = std::make_unique<BlockManager>(block_config, &events_);
  scheduler_ = std::make_unique<Scheduler>(config_.scheduler, *block_manager_);
  if (config_.speculative.enabled()) {
    scheduler_->setDrafter(
        [this](Sequence& sequence, int64_t max_drafts) {
          return proposeDrafts(sequence, max_drafts);
        },
        config_.speculative.disable_by_batch_size);
    spec_accepted_per_position_.assign(
        static_cast<size_t>(config_.speculative.num_speculative_tokens), 0);
    // Published at 0 before the first step: the metrics' series exist from
    // the first scrape.
    stats_.spec_decode_accepted_per_position = spec_accepted_per_position_;
  }
  if (!simulated) {
    ModelRunnerOptions runner_options;
    runner_options.fuse_projections = config_.fuse_projections;
    runner_ = std::make_unique<ModelRunner>(*model_, *cache_, *backend_, runner_options);
    runner_->setRecordDecode(!config_.enforce_eager);
  }
  for (const LoraModuleSpec& spec : config_.lora_modules) {
    auto adapter = LoraAdapter::load(spec.name, spec.path, model_->config());
    const int32_t index = runner_->addAdapter(*adapter);
    TANDEM_CHECK(index == std::ssize(adapters_), "adapter indices out of step");
    adapter_infos_.push_back(
        {spec.name, spec.path, model_identity_ + "/lora-" + adapter->digest(), adapter->rank()});
    TANDEM_LOG(kInfo) << "LoRA adapter " << spec.name << " from " << spec.path.string() << ": rank "
                      << adapter->rank() << ", scale " << adapter->scale() << ", digest "
                      << adapter->digest();
    adapters_.push_back(std::move(adapter));
  }
  if (config_.connector_factory) {
    connector_ = config_.connector_factory(*cache_, model_identity_);
    connector_source_ = std::make_unique<ConnectorSource>(
        *connector_, block_manager_->hasher(),
        [this](const std::string& source, int64_t blocks, double seconds) {
          KvSourceTotals& totals = kv_sources_[source];
          totals.blocks_loaded += blocks;
          totals.bytes += blocks * static_cast<int64_t>(cache_->blockBytes());
          totals.addLoad(seconds);
        },
        simulated && simulated->kv_link_bytes_per_s > 0
            ? std::function<double(int64_t)>(
                  [profile = *simulated, block_size = kv.block_size](int64_t blocks) {
                    return simulatedTransferSeconds(profile, blocks, block_size);
                  })
            : nullptr);
    scheduler_->setExternalKvSource(connector_source_.get());
    scheduler_->setHeldBlocksReclaimer(
        [this](int64_t blocks_short) { return yieldHeldBlocks(blocks_short); });
  }
  if (!connector_ || !connector_->verifiesRequests()) {
    const std::string secret =
        kv::kvSecret(connector_ ? connector_->config() : kv::KvTransferConfig{});
    if (!secret.empty())
      control_verifier_ = std::make_unique<kv_auth::RequestVerifier>(secret, kv_auth::instanceId());
  }

  // End-of-sequence ids: config.json's, the tokenizer's eos_token and
  // generation_config.json's (Qwen2.5/Qwen3 instruct list <|endoftext|>
  // only there), as transformers' generate and vLLM take them.
  auto addEos = [&](int64_t id, const char* checked_source) {
    if (checked_source != nullptr && id >= mc.vocab_size) {
      throw Error(std::string(checked_source) + ": eos_token_id " + std::to_string(id) +
                  " is not below the model's vocab_size " + std::to_string(mc.vocab_size));
    }
    const auto token = static_cast<TokenId>(id);
    if (std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) == eos_token_ids_.end()) {
      eos_token_ids_.push_back(token);
    }
  };
  for (int64_t id : mc.eos_token_ids) addEos(id, nullptr);  // checked with config.json
  if (auto eos = tokenizer_->eosTokenId()) addEos(*eos, nullptr);
  generation_ = protocol::GenerationConfig::fromDirectory(config_.model_dir);
  for (int64_t id : generation_.eos_token_ids) {
    addEos(id, (config_.model_dir / "generation_config.json").c_str());
  }
  if (tokenizer_->vocabSize() > mc.vocab_size) {
    // A tokenizer with ids the embedding has no row for (added tokens a
    // fine-tune never resized the model for): served, but a prompt
    // encoding to one is refused (checkVocabulary).
    TANDEM_LOG(kWarn) << "the tokenizer's ids run to " << tokenizer_->vocabSize() - 1
                      << ", past the model's vocab_size " << mc.vocab_size << " (config.json)"
                      << ": a prompt encoding to an id from " << mc.vocab_size
                      << " on is refused (400)";
  }
  if (simulated) {
    simulated_tokens_ = std::make_unique<TokenChooser>(*tokenizer_, mc.vocab_size, eos_token_ids_);
  }
  max_hold_blocks_ = config_.max_hold_blocks > 0 ? config_.max_hold_blocks
                                                 : std::max<int64_t>(1, kv.num_blocks / 4);
  max_total_hold_blocks_ = config_.max_total_hold_blocks > 0
                               ? config_.max_total_hold_blocks
                               : std::max<int64_t>(1, kv.num_blocks / 2);
  stats_.num_blocks = kv.num_blocks;
  stats_.num_free_blocks = kv.num_blocks;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  shutdown(Clock::now());
  if (thread_.joinable()) thread_.join();
}

Status Engine::checkVocabulary(std::span<const TokenId> tokens, const char* field) const {
  const int64_t vocab_size = model_->config().vocab_size;
  for (TokenId token : tokens) {
    if (token < 0 || token >= vocab_size) {
      return invalidArgument(std::string(field) + " token id " + std::to_string(token) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  return Status::ok();
}

bool Engine::endsAsEos(TokenId token, const SamplingParams& params) const {
  return !params.ignore_eos &&
         std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

bool Engine::isStopToken(TokenId token, const SamplingParams& params) const {
  return endsAsEos(token, params) ||
         std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
             params.stop_token_ids.end();
}

StatusOr<std::unique_ptr<Engine::Live>> Engine::resumedLive(const Request& request) const {
  auto live = std::make_unique<Live>(*tokenizer_, request);
  const std::vector<TokenId>& resumed = request.resume_output;
  if (resumed.empty()) return live;
  const SamplingParams& params = request.sampling;
  // Messages name the field as clients send it (resume_token_ids, api.md).
  if (static_cast<int64_t>(resumed.size()) >= params.max_tokens) {
    return invalidArgument("resume_token_ids must leave a token to generate: it holds " +
                           std::to_string(resumed.size()) + " tokens and max_tokens is " +
                           std::to_string(params.max_tokens));
  }
  if (Status known = checkVocabulary(resumed, "resume_token_ids"); !known.isOk()) return known;
  for (size_t i = 0; i < resumed.size(); ++i) {
    const TokenId token = resumed[i];
    const bool may_stop = static_cast<int64_t>(i) + 1 > params.min_tokens;
    const StopStringMatcher::Update pushed =
        live->stop.push(live->detokenizer.push(token), may_stop);
    if (isStopToken(token, params) || pushed.stopped) {
      return invalidArgument("resume_token_ids must not hold a finished answer: token " +
                             std::to_string(i) +
                             " is an end-of-sequence or stop token, or ends a stop string");
    }
    live->resumed_text += pushed.text;
  }
  return live;
}

Status Engine::addRequest(Request request, OutputCallback callback) {
  if (request.prompt.empty()) return invalidArgument("prompt must not be empty");
  if (Status known = checkVocabulary(request.prompt, "prompt"); !known.isOk()) return known;
  Status valid =
      validateSamplingParams(request.sampling, model_->config().vocab_size, max_model_len_,
                             static_cast<int64_t>(request.prompt.size()));
  if (!valid.isOk()) return valid;
  if (request.priority != 0 && config_.scheduler.policy != SchedulingPolicy::kPriority) {
    return invalidArgument(
        "priority must be 0 on an agent that serves first come, first served, "
        "got " +
        std::to_string(request.priority) +
        " (start the agent with --scheduling-policy priority to serve "
        "requests by priority)");
  }
  const int64_t blocks_needed = (static_cast<int64_t>(request.prompt.size()) +
                                 request.sampling.max_tokens + config_.block_size - 1) /
                                config_.block_size;
  if (blocks_needed > cache_->numBlocks()) {
    return invalidArgument("prompt plus max_tokens needs " + std::to_string(blocks_needed) +
                           " KV blocks, more than the " + std::to_string(cache_->numBlocks()) +
                           " this agent has");
  }
  StatusOr<std::unique_ptr<Live>> resumed = resumedLive(request);
  if (!resumed.isOk()) return resumed.status();
  std::unique_ptr<Live> live = std::move(resumed).value();
  if (request.sampling.prompt_logprobs && simulated_tokens_) {
    return Status(StatusCode::kUnimplemented,
                  "prompt_logprobs are not simulated: a simulated agent computes no logits");
  }
  if (request.structured_output) {
    if (simulated_tokens_) {
      return Status(StatusCode::kUnimplemented,
                    "structured outputs are not simulated: a simulated agent's tokens follow its "
                    "profile, not a grammar");
    }
    auto compiled = compileConstraint(*request.structured_output);
    if (!compiled.isOk()) return compiled.status();
    live->matcher = std::make_unique<structured::Matcher>(std::move(compiled).value());
    // Named by its field, as when it overflows later (emitToken).
    if (live->matcher->overflowed()) {
      return invalidArgument(request.structured_output_field.empty()
                                 ? std::string(kTooAmbiguous)
                                 : request.structured_output_field + ": " +
                                       std::string(kTooAmbiguous));
    }
    // A resumed stream's tokens were chosen under the same constraint.
    for (size_t i = 0; i < request.resume_output.size(); ++i) {
      if (!live->matcher->accept(request.resume_output[i])) {
        return invalidArgument("resume_token_ids[" + std::to_string(i) +
                               "] is not allowed by the request's structured output");
      }
    }
  }
  if (connector_ && !request.kv_transfer_params.is_null()) {
    Status transfer = connector_->scheduler().validate(request.kv_transfer_params);
    if (!transfer.isOk()) return transfer;
  }
  const StatusOr<int32_t> adapter = adapterFor(request.adapter);
  if (!adapter.isOk()) return adapter.status();
  std::lock_guard<std::mutex> lock(mutex_);
  if (draining_ && request.joins.empty()) {
    return unavailable("the agent is draining: it takes no new requests");
  }
  // A later choice of an admitted request is served while the loop runs,
  // until the stop's deadline, as its first choice is.
  if (stopping_ && (request.joins.empty() || inbox_closed_)) {
    return unavailable("the engine is shutting down");
  }
  if (known_ids_.count(request.id) != 0) {
    return invalidArgument("request id " + request.id + " is already in use");
  }
  // Every seat taken and the queue full: the request (its places) would
  // wait beyond the bound. Held requests are counted, not free seats, so
  // that one whose seat its KV cache, not max_num_seqs, withholds counts
  // too, and a router can count what it sent the same way; so are the
  // places kept for later choices of admitted requests.
  if (request.joins.empty() &&
      stats_.num_running + waitingLocked() + placesKeptLocked() + request.admission_places >
          maxRequestsHeld()) {
    return resourceExhausted("too many waiting requests (" +
                             std::to_string(config_.max_waiting_requests) + "); retry later");
  }
  known_ids_.emplace(request.id, true);
  if (request.admission_places > 1 && request.joins.empty()) {
    joins_awaited_[request.id] = request.admission_places - 1;
  } else if (const auto first = joins_awaited_.find(request.joins);
             !request.joins.empty() && first != joins_awaited_.end() && first->second > 0) {
    --first->second;  // its place, kept since its first choice's admission
  }
  if (request.arrival == Clock::time_point{}) request.arrival = Clock::now();
  live->callback = std::move(callback);
  live->timings.arrival = request.arrival;
  Pending pending;
  pending.sequence = std::make_unique<Sequence>(std::move(request));
  if (*adapter >= 0) {
    pending.sequence->adapter = *adapter;
    pending.sequence->adapter_identity = adapter_infos_[*adapter].identity;
  }
  pending.live = std::move(live);
  inbox_.push_back(std::move(pending));
  wake_.notify_one();
  return Status::ok();
}

void Engine::joinsEnded(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Those never added give their places back.
  if (joins_awaited_.erase(request_id) != 0) wake_.notify_one();
}

Status Engine::releaseTransfer(const nlohmann::json& kv_transfer_params) {
  if (!connector_) return failedPrecondition("this agent has no KV connector");
  StatusOr<std::string> target = connector_->scheduler().releaseTarget(kv_transfer_params);
  if (!target.isOk()) return target.status();
  std::future<bool> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (loop_exited_) return unavailable("the engine has stopped");
    release_requests_.emplace_back(*target, std::promise<bool>());
    released = release_requests_.back().second.get_future();
    wake_.notify_one();
  }
  if (!released.get()) {
    return notFound("kv_transfer_params.transfer_id " + *target +
                    ": no blocks are held for it (already released, timed out, or never held)");
  }
  return Status::ok();
}

Status Engine::advertiseKvAddress(const std::string& listen_host, int port) {
  if (!connector_) return Status::ok();
  return connector_->advertiseAddress(listen_host, port);
}

StatusOr<nlohmann::json> Engine::kvHandshake(const nlohmann::json& request) const {
  if (!connector_) return notFound("this agent has no KV connector");
  return connector_->handshake(request);
}

Status Engine::authorizeKvRequest(std::string_view path, const nlohmann::json& body) const {
  if (connector_ && connector_->verifiesRequests()) return connector_->authorizeRequest(path, body);
  if (control_verifier_) return control_verifier_->verify(path, body);
  return Status::ok();
}

nlohmann::json Engine::kvConnectorInfo() const {
  return connector_ ? connector_->info() : nlohmann::json();
}

int32_t Engine::adapterIndex(std::string_view name) const {
  for (size_t i = 0; i < adapter_infos_.size(); ++i) {
    if (adapter_infos_[i].name == name) return static_cast<int32_t>(i);
  }
  return -1;
}

StatusOr<int32_t> Engine::adapterFor(const std::string& name) const {
  if (name.empty()) return -1;
  const int32_t index = adapterIndex(name);
  if (index < 0) return notFound("this agent serves no LoRA adapter named " + name);
  return index;
}

StatusOr<nlohmann::json> Engine::holdPrefix(std::vector<TokenId> tokens, std::string cache_salt,
                                            const std::string& adapter) {
  if (!connector_ || !connector_->config().produces()) {
    return failedPrecondition(
        "this agent lends no KV blocks: it needs a KV connector with kv_role kv_producer or "
        "kv_both");
  }
  const StatusOr<int32_t> adapter_index = adapterFor(adapter);
  if (!adapter_index.isOk()) return adapter_index.status();
  std::future<StatusOr<nlohmann::json>> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) return unavailable("the agent is draining: it lends no KV blocks");
    if (loop_exited_ || stopping_) return unavailable("the engine is shutting down");
    HoldRequest request;
    request.tokens = std::move(tokens);
    request.cache_salt = std::move(cache_salt);
    if (*adapter_index >= 0) request.model_identity = adapter_infos_[*adapter_index].identity;
    hold_requests_.push_back(std::move(request));
    held = hold_requests_.back().promise.get_future();
    wake_.notify_one();
  }
  return held.get();
}

// How long a hold waits for prefix blocks a live request is computing
// (a lend asked for while the lender is still computing the prefix, as
// during a burst for a hot system prompt): answering at once would lend
// less than is coming, and the reader would compute the rest again.
constexpr auto kHoldWaitForComingBlocks = std::chrono::seconds(5);

void Engine::holdPrefixes() {
  std::vector<HoldRequest> requests;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    requests.swap(hold_requests_);
  }
  const Clock::time_point now = now_();
  for (HoldRequest& request : requests) request.deadline = now + kHoldWaitForComingBlocks;
  for (HoldRequest& request : deferred_holds_) requests.push_back(std::move(request));
  deferred_holds_.clear();
  for (HoldRequest& request : requests) {
    if (now < request.deadline && prefixIsComing(request)) {
      deferred_holds_.push_back(std::move(request));
      continue;
    }
    request.promise.set_value(
        holdPrefixNow(request.tokens, request.cache_salt, request.model_identity));
  }
}

bool Engine::prefixIsComing(HoldRequest& request) {
  if (!block_manager_->config().enable_prefix_caching) return false;
  const int64_t block_size = config_.block_size;
  const int64_t next = std::ssize(
      block_manager_->findCachedPrefix(request.tokens, request.cache_salt, request.model_identity)
          .blocks);
  if (next >= max_hold_blocks_ || (next + 1) * block_size >= std::ssize(request.tokens)) {
    return false;
  }
  if (request.hashes.empty()) {
    request.hashes = block_manager_->hasher().hashFullBlocks(request.tokens, request.cache_salt,
                                                             request.model_identity);
  }
  return scheduler_->prefixBlockComing(request.hashes, next, nullptr, /*waiting_to_run=*/true);
}

StatusOr<nlohmann::json> Engine::holdPrefixNow(const std::vector<TokenId>& tokens,
                                               const std::string& cache_salt,
                                               const std::string& model_identity, bool hand_over) {
  PrefixMatch match = block_manager_->findCachedPrefix(tokens, cache_salt, model_identity);
  if (match.blocks.empty()) {
    return notFound("no leading block of the prompt is cached on this agent");
  }
  // One hold lends at most max_hold_blocks_ leading blocks; the reader
  // computes the rest. A drain's hold takes every block: the agent admits
  // nothing more, and what it does not hand over is computed again.
  if (!hand_over && std::ssize(match.blocks) > max_hold_blocks_) {
    match.blocks.resize(static_cast<size_t>(max_hold_blocks_));
    match.block_hashes.resize(static_cast<size_t>(max_hold_blocks_));
  }
  // Bounds, checked before anything is pinned: the distinct blocks all
  // pull-back holds pin, and the free blocks the waiting requests need.
  std::unordered_set<BlockId> lent;
  for (const auto& [id, held] : held_) {
    if (held.lent) lent.insert(held.blocks.blocks.begin(), held.blocks.blocks.end());
  }
  int64_t newly_lent = 0;
  int64_t newly_taken = 0;  // free (cached, unreferenced) blocks the hold takes
  for (BlockId block : match.blocks) {
    if (lent.count(block) == 0) ++newly_lent;
    if (block_manager_->refCount(block) == 0) ++newly_taken;
  }
  const auto lent_now = std::ssize(lent);
  if (!hand_over && lent_now + newly_lent > max_total_hold_blocks_) {
    return unavailable("pull-back holds already pin " + std::to_string(lent_now) +
                       " KV blocks of this agent; this hold would pin " +
                       std::to_string(newly_lent) + " more, past --kv-hold-max-total-blocks " +
                       std::to_string(max_total_hold_blocks_) + "; retry later");
  }
  const int64_t free_after = block_manager_->numFreeBlocks() - newly_taken;
  const int64_t waiting_need = scheduler_->numBlocksNeededByWaiting();
  if (!hand_over && free_after < waiting_need) {
    return unavailable("this hold would leave " + std::to_string(free_after) +
                       " free KV blocks, fewer than the " + std::to_string(waiting_need) +
                       " the waiting requests need (holds never take blocks from admission); "
                       "retry later");
  }
  const int64_t num_tokens = match.numCachedTokens(config_.block_size);
  // Found and taken on the engine thread in one go: the match is still whole.
  SequenceBlocks blocks;
  if (!block_manager_->allocate(blocks, &match, num_tokens) ||
      blocks.num_cached_tokens != num_tokens) {
    block_manager_->free(blocks);
    return notFound("the prompt's cached blocks were evicted");
  }
  const int64_t held_tokens = num_tokens;
  const std::string id = (hand_over ? "handover-" : "hold-") + std::to_string(++num_holds_);
  const nlohmann::json params = {{"do_remote_decode", true}};
  const std::vector<BlockHash> hashes = block_manager_->hasher().hashFullBlocks(
      std::span<const TokenId>(tokens).first(static_cast<size_t>(held_tokens)), cache_salt,
      model_identity);
  kv::ConnectorRequest request;
  request.request_id = id;
  request.tokens = std::span<const TokenId>(tokens).first(static_cast<size_t>(held_tokens));
  request.block_hashes = hashes;
  request.kv_transfer_params = &params;
  kv::FinishDecision decision;
  try {
    decision = connector_->scheduler().requestFinished(request, blocks.blocks, held_tokens);
  } catch (const std::exception& error) {
    // A device copy into a staging area failing: the connector gave back
    // what it took for the hold; the blocks go back here. The engine thread
    // goes on (a drain's hand-over, other holds).
    block_manager_->free(blocks);
    TANDEM_LOG(kError) << "KV connector failed holding " << held_tokens
                       << " prompt tokens: " << error.what();
    return internalError(std::string("the KV connector failed to hold the blocks: ") +
                         error.what());
  }
  if (!decision.hold) {
    block_manager_->free(blocks);
    if (decision.kv_transfer_params.is_object()) {
      // A connector that lends, with no room for this hold now.
      return unavailable(
          "no KV hold ticket or staging slot is free on this agent "
          "(kv_connector_extra_config.hold_slots, staging_blocks); try again later");
    }
    return failedPrecondition("this agent's KV connector does not lend blocks to readers");
  }
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(connector_->config().abort_timeout_s));
  if (hand_over) num_handed_over_blocks_ += std::ssize(blocks.blocks);
  addHold(id, Held{std::move(blocks), now_() + timeout, /*lent=*/!hand_over, nullptr});
  publishStats();
  return decision.kv_transfer_params;
}

void Engine::handOver() {
  handed_over_ = true;
  std::vector<Sequence*> handing;
  for (const auto& [sequence, live] : live_) {
    if (sequence->request.hand_over_on_drain) handing.push_back(sequence);
  }
  handOver(handing);
}

void Engine::handOver(const std::vector<Sequence*>& handing) {
  const bool lends = connector_ && connector_->config().produces() &&
                     block_manager_->config().enable_prefix_caching;
  for (Sequence* sequence : handing) {
    RequestOutput out = finalOutput(*sequence, FinishReason::kAbort);
    out.handed_over = true;
    // The blocks the model computed (their full ones are in the prefix
    // cache): the resuming agent reads them and computes only the rest.
    if (lends && sequence->status == SequenceStatus::kRunning &&
        sequence->num_computed_tokens >= config_.block_size) {
      const std::vector<TokenId> computed(sequence->tokens.begin(),
                                          sequence->tokens.begin() + sequence->num_computed_tokens);
      StatusOr<nlohmann::json> held =
          holdPrefixNow(computed, sequence->request.cache_salt, sequence->adapter_identity,
                        /*hand_over=*/true);
      if (held.isOk()) {
        out.kv_transfer_params = std::move(*held);
      } else {
        TANDEM_LOG(kWarn) << "drain: the blocks of request " << out.request_id
                          << " could not be held for its next agent: " << held.status().message();
      }
    }
    ++num_handed_over_;
    deliverFinal(sequence, std::move(out));
  }
  if (!handing.empty()) {
    TANDEM_LOG(kInfo) << "drain: handed over " << handing.size() << " requests ("
                      << num_handed_over_blocks_ << " KV blocks held for their next agents)";
  }
}

void Engine::abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  aborts_.push_back(request_id);
  wake_.notify_one();
}

void Engine::askHandOver(const std::string& request_id, bool hand_over) {
  std::lock_guard<std::mutex> lock(mutex_);
  hand_over_asks_.emplace_back(request_id, hand_over);
  wake_.notify_one();
}

void Engine::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  draining_ = true;
  wake_.notify_one();
}

bool Engine::draining() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return draining_;
}

void Engine::shutdown(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      deadline_ = deadline;
    }
    deadline_ = std::min(deadline_, deadline);
    wake_.notify_one();
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

KvSnapshot Engine::takeSnapshot() const {
  KvSnapshot snapshot;
  snapshot.sequence = events_.lastSequence();
  snapshot.block_hashes = block_manager_->cachedHashes();
  return snapshot;
}

KvSnapshot Engine::kvSnapshot() {
  std::future<KvSnapshot> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (loop_exited_) return takeSnapshot();  // nothing changes the cache any more
    snapshot_requests_.emplace_back();
    future = snapshot_requests_.back().get_future();
    wake_.notify_one();
  }
  return future.get();
}

EngineStats Engine::stats() const {
  EngineStats stats;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats = stats_;
    stats.num_waiting = waitingLocked();
  }
  // Counted as they happen, also for requests refused before they are queued.
  if (connector_) {
    stats.kv_connector = connector_->config().connector;
    stats.kv_transfer_failures = connector_->failureCounts();
  }
  return stats;
}

void Engine::publishStats() {
  EngineStats stats;
  stats.num_running = scheduler_->numRunning();
  stats.num_waiting = scheduler_->numWaiting();
  stats.num_prefill_tokens_waiting = scheduler_->numPrefillTokensWaiting();
  stats.num_free_blocks = block_manager_->numFreeBlocks();
  stats.num_blocks = cache_->numBlocks();
  stats.kv_cache_usage = block_manager_->usage();
  stats.num_preemptions = scheduler_->numPreemptions();
  stats.num_priority_preemptions = scheduler_->numPriorityPreemptions();
  stats.num_prefix_waits = scheduler_->numInFlightPrefixWaits();
  stats.prefix_cache_queries = block_manager_->prefixCacheQueryTokens();
  stats.prefix_cache_hits = block_manager_->prefixCacheHitTokens();
  stats.num_computed_tokens = num_computed_tokens_;
  stats.num_steps = num_steps_;
  stats.kv_blocks_loaded = scheduler_->numExternalBlocksLoaded();
  stats.kv_blocks_failed = scheduler_->numExternalBlocksFailed();
  stats.num_step_failures = num_step_failures_;
  stats.consecutive_step_failures = consecutive_step_failures_;
  stats.last_step_error = last_step_error_;
  if (connector_) stats.kv_sources = kv_sources_;
  // A block pinned by several holds (the same prefix lent twice, a lent
  // prefix of a finished request's blocks) counts once.
  stats.kv_held_blocks = std::ssize(held_block_refs_);
  if (structured::ConstraintCache* cache = constraints_made_.load(std::memory_order_acquire)) {
    stats.grammar_cache_grammars = static_cast<int64_t>(cache->size());
    stats.grammar_cache_bytes = cache->bytes();
  }
  stats.num_handed_over = num_handed_over_;
  stats.num_handed_over_blocks = num_handed_over_blocks_;
  stats.num_holds_yielded = num_holds_yielded_;
  stats.spec_decode_num_drafts = spec_num_drafts_;
  stats.spec_decode_num_draft_tokens = spec_num_draft_tokens_;
  stats.spec_decode_num_accepted_tokens = spec_num_accepted_;
  stats.spec_decode_accepted_per_position = spec_accepted_per_position_;
  std::lock_guard<std::mutex> lock(mutex_);
  stats.draining = draining_;
  stats_ = stats;
}

void Engine::drainInbox() {
  std::vector<Pending> inbox;
  std::vector<std::string> aborts;
  std::vector<std::pair<std::string, bool>> hand_over_asks;
  std::vector<std::promise<KvSnapshot>> snapshots;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox.swap(inbox_);
    // Counted as waiting until the step's schedule says where they went.
    stats_.num_waiting += std::ssize(inbox);
    aborts.swap(aborts_);
    hand_over_asks.swap(hand_over_asks_);
    snapshots.swap(snapshot_requests_);
  }
  for (auto& promise : snapshots) promise.set_value(takeSnapshot());
  for (Pending& pending : inbox) {
    live_.emplace(pending.sequence.get(), std::move(pending.live));
    scheduler_->add(std::move(pending.sequence));
  }
  for (const std::string& id : aborts) {
    if (Sequence* sequence = scheduler_->find(id)) {
      finishRequest(sequence, FinishReason::kAbort);
    } else if (auto held = held_.find(id); held != held_.end() && held->second.params.is_object()) {
      // Finished, but its answer (which says where these blocks are) never
      // reached its client, who left: no reader will come. The connector
      // lets go of its part (a staging area's slots) too.
      if (connector_) (void)connector_->scheduler().releaseTarget(held->second.params);
      dropHold(held);
    }
  }
  for (const auto& [id, hand_over] : hand_over_asks) {
    Sequence* sequence = scheduler_->find(id);
    if (sequence == nullptr || !sequence->request.can_hand_over ||
        sequence->request.hand_over_on_drain == hand_over) {
      continue;
    }
    sequence->request.hand_over_on_drain = hand_over;
    if (!hand_over) continue;  // withdrawn: it finishes here
    // Asked for after the drain's hand-over: handed over now.
    if (handed_over_) handOver({sequence});
  }
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Once seen, a stop is news only when nothing is held: while readers
      // of held blocks are awaited the loop waits as before (not spinning)
      // and looks at the deadline as it wakes.
      // Later choices awaited by a stop are looked for as held blocks are.
      const bool holding =
          !held_.empty() || !deferred_holds_.empty() || (stopping_ && !joins_awaited_.empty());
      auto has_news = [&] {
        return !inbox_.empty() || !aborts_.empty() || !hand_over_asks_.empty() ||
               !snapshot_requests_.empty() || !release_requests_.empty() ||
               !hold_requests_.empty() || (stopping_ && (!stop_noticed_ || !holding)) ||
               (draining_ && !handed_over_) || scheduler_->hasWork();
      };
      if (!holding) {
        wake_.wait(lock, has_news);
      } else {
        // Held blocks are released by messages from readers: look often.
        wake_.wait_for(lock, std::chrono::milliseconds(5), has_news);
      }
    }
    releaseHeldBlocks();
    // Holds come after new requests are queued, so they see what those need.
    drainInbox();
    holdPrefixes();
    bool draining = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      draining = draining_;
    }
    if (draining && !handed_over_) handOver();
    // A stopping agent stays until the readers it told of its blocks (the
    // decode agents of its prefills, the agents resuming what it handed
    // over) have read them, or the deadline. Pull-back lends are only
    // offers: they do not keep it.
    auto awaited = [](const auto& held) { return !held.second.lent; };
    const bool handing_over = std::any_of(held_.begin(), held_.end(), awaited);
    bool stop_now = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_noticed_ = stopping_;
      // A request queued just before the stop is served like the others,
      // and so are the later choices of one admitted.
      stop_now =
          stopping_ &&
          ((inbox_.empty() && !scheduler_->hasWork() && !handing_over && joins_awaited_.empty()) ||
           Clock::now() >= deadline_);
      inbox_closed_ = stop_now;
    }
    if (stop_now) {
      if (handing_over) {
        TANDEM_LOG(kWarn) << "shutdown: " << std::count_if(held_.begin(), held_.end(), awaited)
                          << " holds of KV blocks were not read before the deadline; their "
                             "readers compute those blocks themselves";
      }
      // Abort whatever is left, queued ones too (none is queued after the
      // stop), then leave. (Loads still in flight keep their blocks; the
      // connector is destroyed before the cache.)
      drainInbox();
      while (!live_.empty()) finishRequest(live_.begin()->first, FinishReason::kAbort);
      publishStats();
      std::lock_guard<std::mutex> lock(mutex_);
      loop_exited_ = true;
      for (auto& promise : snapshot_requests_) promise.set_value(takeSnapshot());
      snapshot_requests_.clear();
      for (auto& [id, promise] : release_requests_) promise.set_value(false);
      release_requests_.clear();
      for (HoldRequest& hold : hold_requests_) {
        hold.promise.set_value(unavailable("the engine has stopped"));
      }
      hold_requests_.clear();
      for (HoldRequest& hold : deferred_holds_) {
        hold.promise.set_value(unavailable("the engine has stopped"));
      }
      deferred_holds_.clear();
      return;
    }
    if (scheduler_->hasWork()) guardedStep();
    publishStats();
  }
}

void Engine::guardedStep() {
  step_batch_.clear();
  step_batch_known_ = false;
  try {
    step();
    consecutive_step_failures_ = 0;
  } catch (const std::exception& e) {
    failStep(e.what());
  }
}

void Engine::failStep(const std::string& what) {
  ++num_step_failures_;
  ++consecutive_step_failures_;
  last_step_error_ = what;
  std::vector<Sequence*> victims;
  if (step_batch_known_) {
    victims = step_batch_;
  } else if (Sequence* admitting = scheduler_->admitting()) {
    victims.push_back(admitting);
  } else {
    for (const auto& [sequence, live] : live_) victims.push_back(sequence);
  }
  // A request the step finished before it threw is gone already.
  std::erase_if(victims, [&](Sequence* sequence) { return !live_.contains(sequence); });
  TANDEM_LOG(kError) << "an engine step failed (" << what << "); failing the " << victims.size()
                     << " requests it was computing";
  for (Sequence* sequence : victims) {
    if (!live_.contains(sequence)) continue;  // listed twice
    finishRequest(sequence, FinishReason::kError,
                  "the engine failed computing this request: " + what);
  }
}

void Engine::step() {
  if (connector_source_) connector_source_->pollLoads(*scheduler_);
  SchedulerOutput output = scheduler_->schedule();
  {
    // The queues as this step leaves them, for its whole length (a long
    // prefill step's admissions and gauges count them, not the last step's).
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.num_running = scheduler_->numRunning();
    stats_.num_waiting = scheduler_->numWaiting();
    stats_.num_prefill_tokens_waiting = scheduler_->numPrefillTokensWaiting();
  }
  for (const ScheduledChunk& chunk : output.chunks) step_batch_.push_back(chunk.sequence);
  step_batch_known_ = true;
  for (Sequence* failed : output.failed_loads) {
    finishRequest(failed, FinishReason::kError,
                  "KV blocks of the prompt failed to load and kv_load_failure_policy is fail");
  }
  if (output.empty()) {
    // Only requests waiting on something outside the engine (remote KV) are
    // left: wait for news instead of spinning.
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, std::chrono::milliseconds(1), [&] {
      return !inbox_.empty() || !aborts_.empty() || (stopping_ && !stop_noticed_);
    });
    return;
  }
  if (simulated_tokens_) {
    simulateStep(output, Clock::now());
    return;
  }
  const int64_t vocab = model_->config().vocab_size;
  std::vector<SequenceInput> inputs;
  inputs.reserve(output.chunks.size());
  bool wants_row_logits = false;
  verify_tokens_.resize(output.chunks.size());
  draft_logits_.resize(output.chunks.size());
  for (size_t i = 0; i < output.chunks.size(); ++i) {
    const ScheduledChunk& chunk = output.chunks[i];
    SequenceInput input;
    input.tokens = std::span<const TokenId>(chunk.sequence->tokens)
                       .subspan(static_cast<size_t>(chunk.start),
                                static_cast<size_t>(chunk.num_tokens - chunk.num_draft_tokens));
    input.start_position = chunk.start;
    input.block_table = chunk.sequence->blocks.blocks;
    input.adapter = chunk.sequence->adapter;
    if (chunk.num_draft_tokens > 0) {
      // The last token, then its drafts; each draft row's logits are
      // sampled from if the row before it gave the draft.
      std::vector<TokenId>& verify = verify_tokens_[i];
      verify.assign(input.tokens.begin(), input.tokens.end());
      verify.insert(verify.end(), chunk.sequence->draft.begin(), chunk.sequence->draft.end());
      input.tokens = verify;
      input.num_row_logits = chunk.num_draft_tokens;
      draft_logits_[i].resize(static_cast<size_t>(chunk.num_draft_tokens * vocab));
      wants_row_logits = true;
    } else if (chunk.sequence->needsPromptLogits()) {
      // Prompt logprobs: position p's logits give prompt token p + 1's.
      input.num_row_logits = std::max<int64_t>(
          0, std::min(chunk.start + chunk.num_tokens, chunk.sequence->num_prompt_tokens - 1) -
                 chunk.start);
      wants_row_logits = wants_row_logits || input.num_row_logits > 0;
    }
    inputs.push_back(input);
  }
  // Where the logits live in device memory and every sampled row is a plain
  // argmax, the argmax runs there and only the ids come back; the tokens are
  // the ones sample() would pick from the copied logits.
  bool device_argmax = !backend_->hostAccessible() && !wants_row_logits;
  for (const ScheduledChunk& chunk : output.chunks) {
    if (!device_argmax) break;
    if (chunk.samples) {
      device_argmax = samplesRawArgmax(
          chunk.sequence->request.sampling,
          !minTokensMask(*chunk.sequence).empty() || live_.at(chunk.sequence)->matcher != nullptr);
    }
  }
  auto rowLogits = [&](size_t i, int64_t first, int64_t count, std::span<const float> logits) {
    const ScheduledChunk& chunk = output.chunks[i];
    const auto vocab_size = static_cast<size_t>(vocab);
    if (chunk.num_draft_tokens > 0) {
      std::copy_n(logits.begin(), static_cast<size_t>(count) * vocab_size,
                  draft_logits_[i].begin() + static_cast<std::ptrdiff_t>(first * vocab));
      return;
    }
    Sequence& sequence = *chunk.sequence;
    // Row r predicts token chunk.start + first + r + 1; rows of positions
    // already known (recomputed after a preemption) are skipped.
    const int64_t known = static_cast<int64_t>(sequence.prompt_logprobs.size());
    TANDEM_CHECK(known >= chunk.start + first + 1, "prompt logprobs: a position was skipped");
    const int64_t skip = std::clamp<int64_t>(known - (chunk.start + first + 1), 0, count);
    std::vector<GeneratedToken> rows(static_cast<size_t>(count - skip));
    // A vocabulary-wide pass per row: on the kernels' threads.
    sampler_pool_.forEach(count - skip, [&](int64_t task, Sampler& sampler) {
      const int64_t row = skip + task;
      rows[static_cast<size_t>(task)] =
          sampler.logprobsOf(logits.subspan(static_cast<size_t>(row) * vocab_size, vocab_size),
                             sequence.tokens[static_cast<size_t>(chunk.start + first + row + 1)],
                             *sequence.request.sampling.prompt_logprobs);
    });
    for (GeneratedToken& row : rows) sequence.prompt_logprobs.push_back(std::move(row));
  };
  if (device_argmax) {
    runner_->forwardArgmax(inputs, argmax_ids_);
  } else {
    logits_ = runner_->forward(inputs, wants_row_logits ? RowLogitsSink(rowLogits) : nullptr);
  }

  // Chunk i's row `row` as the sampler reads it; `mask` holds the
  // min_tokens mask it borrows.
  auto samplerInput = [&](size_t i, int64_t row, Sequence& sequence, Live& live,
                          std::vector<TokenId>& mask) {
    mask = minTokensMask(sequence);
    SamplerInput input;
    input.logits =
        row < output.chunks[i].num_draft_tokens
            ? std::span<const float>(draft_logits_[i])
                  .subspan(static_cast<size_t>(row * vocab), static_cast<size_t>(vocab))
            : logits_.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
    input.params = &sequence.request.sampling;
    input.prompt = std::span<const TokenId>(sequence.tokens)
                       .first(static_cast<size_t>(sequence.num_prompt_tokens));
    input.output = std::span<const TokenId>(sequence.tokens)
                       .subspan(static_cast<size_t>(sequence.num_prompt_tokens));
    input.min_tokens_mask = mask;
    if (live.matcher) input.allowed = allowedTokens(sequence.request.sampling, *live.matcher);
    input.rng = live.rng;
    return input;
  };
  // Every chunk's first row, sampled side by side on the kernels' threads
  // before the tokens are emitted: its inputs are the sequence as the step
  // left it, which emitting another sequence's token does not change.
  // Later rows (drafts accepted) read the tokens accepted before them, and
  // a structured output's mask comes from its matcher (one at a time), so
  // those are sampled in turn as they come. Chunk i's first row is
  // first_tokens[first_rows[i]] (-1: sampled in turn), its min_tokens mask
  // first_masks[i].
  std::vector<int64_t> first_rows(output.chunks.size(), -1);
  std::vector<std::vector<TokenId>> first_masks(output.chunks.size());
  std::vector<GeneratedToken> first_tokens;
  if (!device_argmax) {
    std::vector<SamplerInput> firsts;
    for (size_t i = 0; i < output.chunks.size(); ++i) {
      const ScheduledChunk& chunk = output.chunks[i];
      if (!chunk.samples) continue;
      Live& live = *live_.at(chunk.sequence);
      if (live.matcher) continue;
      first_rows[i] = static_cast<int64_t>(firsts.size());
      firsts.push_back(samplerInput(i, 0, *chunk.sequence, live, first_masks[i]));
    }
    first_tokens = sampler_pool_.sampleRows(firsts);
  }

  finishStep(output, [&](size_t i, int64_t row, Sequence& sequence, Live& live) {
    if (device_argmax) {
      GeneratedToken token;
      token.token = argmax_ids_[i];
      return token;
    }
    if (row == 0 && first_rows[i] >= 0) {
      return std::move(first_tokens[static_cast<size_t>(first_rows[i])]);
    }
    std::vector<TokenId> mask;
    return sampler_.sample(samplerInput(i, row, sequence, live, mask));
  });
}

void Engine::finishStep(
    const SchedulerOutput& output,
    const std::function<GeneratedToken(size_t, int64_t, Sequence&, Live&)>& pick) {
  num_computed_tokens_ += output.num_tokens;
  ++num_steps_;
  scheduler_->onStepComputed(output);
  saveComputedBlocks(output);
  for (size_t i = 0; i < output.chunks.size(); ++i) {
    const ScheduledChunk& chunk = output.chunks[i];
    if (!chunk.samples) continue;
    Sequence* sequence = chunk.sequence;
    Live& live = *live_.at(sequence);
    if (live.timings.first_scheduled == Clock::time_point{}) {
      live.timings.first_scheduled = sequence->first_scheduled;
    }
    const int64_t drafts = chunk.num_draft_tokens;
    if (drafts > 0) {
      ++spec_num_drafts_;
      spec_num_draft_tokens_ += drafts;
    }
    // Row r samples the token after the last one and r drafts: what a plain
    // decode step would sample there once those drafts are the tokens.
    for (int64_t row = 0;; ++row) {
      const GeneratedToken token = pick(i, row, *sequence, live);
      const bool accepted =
          row < drafts && token.token == sequence->draft[static_cast<size_t>(row)];
      if (accepted) {
        ++spec_num_accepted_;
        ++spec_accepted_per_position_[static_cast<size_t>(row)];
      }
      // Drafts the model does not follow cost rows for nothing: the next
      // step takes at most one more than this one accepted.
      if (drafts > 0 && !accepted) sequence->draft_limit = row + 1;
      if (emitToken(sequence, live, token)) break;  // finished: the sequence is gone
      if (!accepted) {
        if (drafts > 0) scheduler_->releaseDraftBlocks(*sequence);
        break;
      }
      // The draft is the token at its position: its KV, computed with it,
      // is that token's.
      scheduler_->acceptDraft(*sequence);
      if (connector_source_) connector_source_->save(*sequence);
    }
  }
}

int64_t Engine::proposeDrafts(Sequence& sequence, int64_t max_drafts) {
  const SpeculativeConfig& speculative = config_.speculative;
  // Every draft accepted emits one token more than the drafts.
  const int64_t room = std::min(sequence.request.sampling.max_tokens - sequence.numGenerated(),
                                max_model_len_ - static_cast<int64_t>(sequence.tokens.size())) -
                       1;
  const auto configured = static_cast<int64_t>(speculative.num_speculative_tokens);
  const int64_t most = std::min(
      {max_drafts, room,
       sequence.draft_limit > 0 ? std::min(sequence.draft_limit, configured) : configured});
  if (most <= 0) return 0;
  proposeNgramDraft(sequence.tokens, speculative, most, sequence.draft);
  return static_cast<int64_t>(sequence.draft.size());
}

std::span<const uint64_t> Engine::allowedTokens(const SamplingParams& params,
                                                structured::Matcher& matcher) {
  const auto& vocabulary = constraints_->vocabulary();
  allowed_.resize(static_cast<size_t>(vocabulary->maskWords()));
  matcher.fillMask(allowed_);
  // A token that ends the answer is allowed where the output is complete
  // and only there, even when the grammar allows its text (a stop_token_ids
  // entry that is an ordinary token, such as '"').
  const bool can_end = matcher.canEnd();
  auto set = [&](TokenId id) {
    if (id < 0 || id >= vocabulary->size()) return;
    const uint64_t bit = uint64_t{1} << (id & 63);
    allowed_[id >> 6] = can_end ? allowed_[id >> 6] | bit : allowed_[id >> 6] & ~bit;
  };
  if (!params.ignore_eos) std::for_each(eos_token_ids_.begin(), eos_token_ids_.end(), set);
  std::for_each(params.stop_token_ids.begin(), params.stop_token_ids.end(), set);
  return allowed_;
}

StatusOr<std::shared_ptr<structured::CompiledGrammar>> Engine::compileConstraint(
    const structured::Constraint& constraint) {
  std::call_once(constraints_once_, [&] {
    constraints_ = std::make_unique<structured::ConstraintCache>(
        std::make_shared<structured::Vocabulary>(*tokenizer_, model_->config().vocab_size));
    constraints_made_.store(constraints_.get(), std::memory_order_release);
  });
  return constraints_->get(constraint);
}

Status Engine::prepareStructuredOutput(const structured::Constraint& constraint) {
  if (simulated_tokens_) return Status::ok();  // refused by addRequest
  return compileConstraint(constraint).status();
}

std::vector<TokenId> Engine::minTokensMask(const Sequence& sequence) const {
  const SamplingParams& params = sequence.request.sampling;
  std::vector<TokenId> mask;
  if (sequence.numGenerated() < params.min_tokens) {
    if (!params.ignore_eos) mask = eos_token_ids_;
    mask.insert(mask.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  }
  return mask;
}

void Engine::simulateStep(const SchedulerOutput& output, Clock::time_point step_start) {
  const double predicted = config_.simulate->predict(stepShapeOf(output, config_.block_size));
  // Clock is steady; a step whose bookkeeping already took longer does not wait.
  std::this_thread::sleep_until(step_start + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(predicted)));
  finishStep(output, [&](size_t, int64_t, Sequence& sequence, Live& live) {
    const SamplingParams& params = sequence.request.sampling;
    GeneratedToken token;
    token.token = simulated_tokens_->next(live.simulated, sequence.tokens, params.seed,
                                          minTokensMask(sequence));
    if (params.logprobs) {
      // The simulated distribution: the emitted token is certain; the
      // alternatives reported after it are the next candidates, each far
      // less likely than the one before.
      token.logprob = 0.0f;
      for (int32_t k = 0; k < std::max<int32_t>(*params.logprobs, 0); ++k) {
        TokenLogprob alternative;
        alternative.token =
            k == 0 ? token.token
                   : simulated_tokens_->alternative(token.token, static_cast<size_t>(k));
        alternative.logprob = k == 0 ? 0.0f : -10.0f * static_cast<float>(k);
        token.top.push_back(alternative);
      }
    }
    return token;
  });
}

void Engine::releaseHeldBlocks() {
  std::vector<std::pair<std::string, std::promise<bool>>> explicit_releases;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    explicit_releases.swap(release_requests_);
  }
  auto release = [&](const std::string& id) {
    auto it = held_.find(id);
    if (it == held_.end()) return false;
    dropHold(it);
    return true;
  };
  for (auto& [id, promise] : explicit_releases) promise.set_value(release(id));
  if (!connector_source_) return;
  // Drained even with nothing held: releases of holds already gone (a
  // timeout came first) must not pile up in the connector.
  for (const std::string& id : connector_source_->pollReleased()) release(id);
  if (held_.empty()) return;
  const auto now = now_();
  for (auto it = held_.begin(); it != held_.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    TANDEM_LOG(kWarn) << "blocks held for request " << it->first
                      << " were never released by a reader; freeing them";
    it = dropHold(it);
  }
}

void Engine::addHold(const std::string& id, Held held) {
  // requestFinished() for the new hold already ended the old one there.
  if (auto it = held_.find(id); it != held_.end()) dropHold(it, /*tell_connector=*/false);
  held.since = now_();
  for (BlockId block : held.blocks.blocks) ++held_block_refs_[block];
  held_.emplace(id, std::move(held));
}

Engine::HeldMap::iterator Engine::dropHold(HeldMap::iterator it, bool tell_connector) {
  // The connector ends the hold before its blocks can be reused.
  if (tell_connector && connector_source_) connector_source_->holdEnded(it->first);
  freeHeldBlocks(it->second);
  return held_.erase(it);
}

void Engine::freeHeldBlocks(Held& held) {
  for (BlockId block : held.blocks.blocks) {
    if (auto ref = held_block_refs_.find(block); --ref->second == 0) held_block_refs_.erase(ref);
  }
  block_manager_->free(held.blocks);
  held.blocks = SequenceBlocks{};
}

bool Engine::yieldHeldBlocks(int64_t blocks_short) {
  if (config_.hold_yield_after_s <= 0 || blocks_short <= 0) return false;
  const auto now = now_();
  const auto after = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config_.hold_yield_after_s));
  struct Candidate {
    HeldMap::iterator it;
    int64_t frees;  // blocks only this hold references
  };
  std::vector<Candidate> candidates;
  int64_t can_free = 0;
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    // Only a finished request's: a lend never takes blocks from admission
    // (holdPrefixNow's bounds) and a drain admits nothing.
    const Held& held = it->second;
    if (held.lent || !held.params.is_object() || held.blocks.blocks.empty()) continue;
    if (!held.copied && now - held.since < after) continue;
    int64_t frees = 0;
    for (BlockId block : held.blocks.blocks) frees += block_manager_->refCount(block) == 1;
    if (frees == 0) continue;
    candidates.push_back({it, frees});
    can_free += frees;
  }
  if (can_free < blocks_short) return false;
  // Copies first (nothing is lost), then the oldest.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.it->second.copied != b.it->second.copied) return a.it->second.copied;
    return a.it->second.since < b.it->second.since;
  });
  int64_t freed = 0;
  for (const Candidate& candidate : candidates) {
    if (freed >= blocks_short) break;
    freed += candidate.frees;
    Held& held = candidate.it->second;
    if (held.copied) {
      // The reader reads the staging copy: the hold (ticket, slots) stays
      // with the connector until its release or timeout; only the blocks go.
      freeHeldBlocks(held);
      continue;
    }
    TANDEM_LOG(kWarn) << "KV blocks held " << std::ssize(held.blocks.blocks) << " for request "
                      << candidate.it->first << " for "
                      << std::chrono::duration<double>(now - held.since).count()
                      << " s without a reader are freed: waiting requests need them "
                         "(--kv-hold-yield-after); a reader that comes later computes the prompt";
    dropHold(candidate.it);
    ++num_holds_yielded_;
  }
  return true;
}

void Engine::saveComputedBlocks(const SchedulerOutput& output) {
  if (!connector_source_) return;
  for (const ScheduledChunk& chunk : output.chunks) connector_source_->save(*chunk.sequence);
}

bool Engine::emitToken(Sequence* sequence, Live& live, const GeneratedToken& token) {
  const SamplingParams& params = sequence->request.sampling;
  sequence->tokens.push_back(token.token);
  const int64_t generated = sequence->numGenerated();
  if (!live.sent_first) live.timings.first_token = Clock::now();

  FinishReason reason = FinishReason::kNone;
  RequestOutput out;
  out.request_id = sequence->request.id;
  out.tokens.push_back(token);
  if (live.matcher && live.matcher->overflowed()) {
    // Its mask cost more than its budget: nothing was allowed.
    reason = FinishReason::kError;
    out.error = std::string(kTooAmbiguous);
  } else if (isStopToken(token.token, params)) {
    // The stop token ends the text, without being part of it unless
    // include_stop_str_in_output (vLLM: its text, none for a special token
    // under skip_special_tokens).
    reason = FinishReason::kStop;
    if (!endsAsEos(token.token, params)) out.stop_token = token.token;  // vLLM's stop_reason
    if (params.include_stop_str_in_output) {
      out.text = live.stop.push(live.detokenizer.push(token.token), false).text;
    }
  } else if (live.matcher && !live.matcher->accept(token.token)) {
    // Only when no token of the vocabulary can continue the output (the
    // sampler then ignores the mask), or none of allowed_token_ids can (the
    // one hard mask wins: its best id was taken).
    reason = FinishReason::kError;
    if (live.matcher->overflowed()) {
      out.error = std::string(kTooAmbiguous);
    } else if (!params.allowed_token_ids.empty()) {
      out.error =
          "the structured output cannot be continued within allowed_token_ids: none of its ids "
          "is one the output allows next (or none of the vocabulary is)";
    } else {
      out.error =
          "the structured output cannot be continued: no token of the vocabulary is allowed";
    }
  } else {
    // As vLLM: stop strings end an answer only past min_tokens.
    auto update = live.stop.push(live.detokenizer.push(token.token), generated > params.min_tokens);
    out.text = std::move(update.text);
    if (update.stopped) reason = FinishReason::kStop;
    // A complete structure that nothing can extend ends the request, as an
    // end-of-sequence token would.
    if (live.matcher && live.matcher->finished()) reason = FinishReason::kStop;
  }
  // Both errors above are the constraint's: the request's fault, not the
  // server's.
  if (reason == FinishReason::kError) {
    out.invalid_request = true;
    out.error_param = sequence->request.structured_output_field;
  }
  if (reason == FinishReason::kNone &&
      (generated >= params.max_tokens ||
       static_cast<int64_t>(sequence->tokens.size()) >= max_model_len_)) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone && !live.stop.stopped()) {
    // The detokenizer's last bytes (an incomplete character) are new text:
    // a stop string ending in them ends the answer as any other.
    auto last = live.stop.push(live.detokenizer.flush(), generated > params.min_tokens);
    out.text += last.text;
    if (last.stopped && reason == FinishReason::kLength) reason = FinishReason::kStop;
    out.text += live.stop.finish();
  }
  if (reason == FinishReason::kStop && live.stop.stopped()) {
    out.stop_string = live.stop.matched();
    out.stop_token.reset();
  }
  out.num_prompt_tokens = sequence->num_prompt_tokens;
  out.num_cached_tokens = cachedPromptTokens(*sequence);
  out.num_generated_tokens = generated;
  if (!live.sent_first) {
    out.resumed_text = std::move(live.resumed_text);
    out.prompt_logprobs = sequence->prompt_logprobs;
  }
  live.sent_first = true;
  if (sequence->request.report_no_output) {
    out.tokens.clear();
    out.text.clear();
    out.num_generated_tokens = 0;
    out.stop_string.reset();
    out.stop_token.reset();
    if (reason == FinishReason::kStop) reason = FinishReason::kLength;
  }
  if (reason == FinishReason::kNone) {
    live.callback(out);
    return false;
  }
  out.finish_reason = reason;
  deliverFinal(sequence, std::move(out));
  return true;
}

RequestOutput Engine::finalOutput(const Sequence& sequence, FinishReason reason) {
  RequestOutput out;
  out.request_id = sequence.request.id;
  out.finish_reason = reason;
  out.num_prompt_tokens = sequence.num_prompt_tokens;
  out.num_cached_tokens = cachedPromptTokens(sequence);
  out.num_generated_tokens = sequence.numGenerated();
  return out;
}

void Engine::finishRequest(Sequence* sequence, FinishReason reason, const std::string& error) {
  RequestOutput out = finalOutput(*sequence, reason);
  out.error = error;
  deliverFinal(sequence, std::move(out));
}

void Engine::deliverFinal(Sequence* sequence, RequestOutput out) {
  // An answer ending inside its step's drafts: the blocks taken for the
  // drafts past it go back before anything holds them.
  if (sequence->status == SequenceStatus::kRunning && !sequence->draft.empty()) {
    scheduler_->releaseDraftBlocks(*sequence);
  }
  auto it = live_.find(sequence);
  TANDEM_CHECK(it != live_.end(), "finishing a request without output state");
  out.timings = it->second->timings;
  out.timings.finished = Clock::now();
  OutputCallback callback = std::move(it->second->callback);
  live_.erase(it);
  const std::string id = sequence->request.id;
  kv::FinishDecision decision;
  const bool normal =
      out.finish_reason == FinishReason::kStop || out.finish_reason == FinishReason::kLength;
  if (connector_source_) {
    // The request's output state is gone already: a connector that throws
    // here must not leave the sequence running without it. Its answer
    // stands, without a descriptor (a router retries the hand-off), and its
    // blocks go back.
    const bool finishing = normal && sequence->status == SequenceStatus::kRunning;
    try {
      if (finishing) {
        decision = connector_source_->finished(*sequence);
      } else {
        connector_source_->abandoned(*sequence);
      }
    } catch (const std::exception& error) {
      TANDEM_LOG(kError) << "KV connector failed at the end of request " << id << ": "
                         << error.what() << "; its blocks are not held";
      decision = {};
      if (finishing) {
        // Whatever the connector took for a hold (a ticket, staging slots)
        // goes back; then it forgets the request.
        try {
          connector_source_->holdEnded(id);
          connector_source_->abandoned(*sequence);
        } catch (const std::exception&) {
        }
      }
    }
  }
  // A hand-over's descriptor is its drain hold's (Engine::handOver).
  if (!out.handed_over) out.kv_transfer_params = decision.kv_transfer_params;
  std::unique_ptr<Sequence> owned = scheduler_->finish(sequence, /*free_blocks=*/!decision.hold);
  if (decision.hold) {
    // Kept for a remote reader until it releases them or the hold times out.
    const auto timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(connector_->config().abort_timeout_s));
    Held held{std::move(owned->blocks), now_() + timeout, false, decision.kv_transfer_params};
    held.copied = decision.copied;
    addHold(id, std::move(held));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    known_ids_.erase(id);
  }
  // Figures a client reads after its response must already count this step.
  publishStats();
  callback(out);
}

}  // namespace tandem::engine
