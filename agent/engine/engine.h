// The engine: model, KV cache, block manager, scheduler, sampler and the loop
// that drives them on a thread of its own.
//
// Threads: addRequest() and abort() may be called from any thread; they only
// enqueue. Everything else (scheduling, the forward pass, sampling,
// detokenization, stop checks) runs on the engine thread, which delivers each
// request's outputs in order through the callback given with the request.
// Callbacks run on the engine thread and must not block; the final output of
// every accepted request is always delivered exactly once (finish_reason set),
// whether it finished, was aborted, failed, or the engine stopped.
//
// A simulated engine (EngineConfig::simulate, docs/simulation.md) runs the
// same loop without a forward pass: each step lasts what the step profile
// predicts and emits tokens from a deterministic function of the sequence.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "agent/engine/block_manager.h"
#include "agent/engine/kv_cache.h"
#include "agent/engine/kv_events.h"
#include "agent/engine/lora.h"
#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "agent/engine/sampler.h"
#include "agent/engine/scheduler.h"
#include "agent/engine/simulation/simulated_tokens.h"
#include "agent/engine/simulation/step_profile.h"
#include "agent/engine/speculative.h"
#include "agent/kv/connector.h"
#include "common/block_hash.h"
#include "common/kv_auth.h"
#include "common/protocol/generation_config.h"
#include "common/protocol/request.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"

namespace tandem::engine {

struct EngineConfig {
  std::filesystem::path model_dir;
  // --hf-overrides: config.json fields replaced before the model is read
  // (a JSON object's text, ModelConfig::fromFile's); empty: none.
  std::string hf_overrides;
  // Where the forward pass runs; the engine creates and owns the backend.
  kernels::DeviceKind device = kernels::DeviceKind::kCpu;
  // Run every decode step as issued, never recorded and replayed (CUDA
  // graphs); vLLM's --enforce-eager. No effect on the CPU backend.
  bool enforce_eager = false;
  // Q/K/V and gate/up as one matmul each (ModelRunnerOptions); the same bits.
  bool fuse_projections = false;
  // The CUDA backend's kernels (--cuda-kernels); kFast on another device is
  // a start-up error.
  kernels::CudaKernels cuda_kernels = kernels::CudaKernels::kReference;
  int32_t block_size = 16;
  // KV cache size: num_blocks when positive, else as many blocks as fit in
  // kv_cache_memory_bytes.
  int64_t num_blocks = 0;
  int64_t kv_cache_memory_bytes = int64_t{1} << 30;
  DType kv_dtype = DType::kBF16;
  // What the GEMMs multiply (Backend::setComputeDType): kF32, exact
  // products, or kBF16, bf16-rounded activations (CPU backend only; bf16
  // weights only). Part of the model identity, so KV made one way is never
  // reused or transferred as the other's.
  DType compute_dtype = DType::kF32;
  SchedulerConfig scheduler;
  // LoRA adapters served beside the model (--lora-modules, docs/lora.md):
  // loaded at start, in this order; CPU engines only.
  std::vector<LoraModuleSpec> lora_modules;
  // Speculative decoding by prompt lookup (--speculative-config,
  // docs/speculative-decoding.md); off unless num_speculative_tokens > 0.
  SpeculativeConfig speculative;
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  // Requests queued beyond the scheduler's max_num_seqs seats: a request
  // that would make the engine hold more than seats + this (running,
  // loading their KV, waiting) is refused (ResourceExhausted).
  int64_t max_waiting_requests = 1024;
  // Pull-back holds (holdPrefix): the most blocks one hold pins (a longer
  // cached prefix is lent up to this many leading blocks) and the most
  // distinct blocks all holds together pin; 0: a quarter and half of the KV
  // cache.
  int64_t max_hold_blocks = 0;
  int64_t max_total_hold_blocks = 0;
  // A finished request's blocks held this long for its remote reader give
  // way to a request that lacks blocks (a waiting one, or a running one
  // that would be preempted): the reader, if it comes, finds the hold ended
  // and computes the prompt. A hold whose reader reads a copy (staging)
  // gives its blocks at any age. 0: holds wait for the reader or
  // abort_timeout_s.
  double hold_yield_after_s = 10.0;
  HashAlgorithm hash_algorithm = HashAlgorithm::kXxh3_128;
  size_t kv_event_capacity = 65536;
  // Builds the KV connector over the engine's cache, given the model identity
  // the block hashes are made from (no connector when empty).
  std::function<std::unique_ptr<kv::KvConnector>(KvCache&, const std::string&)> connector_factory;
  // The time that held blocks' deadlines are measured in (tests inject a
  // fake one); empty: Clock::now.
  std::function<Clock::time_point()> clock;
  // A simulated engine (docs/simulation.md): no forward pass; each step lasts
  // what the profile predicts for it and emits tokens from TokenChooser. The
  // model directory still gives the tokenizer, vocabulary and KV block
  // geometry; the profile gives the context length (max_position_embeddings)
  // and, when num_blocks is 0, the block count: kv_cache_memory_bytes over
  // the profile's kv_bytes_per_token * block_size. With the profile's
  // kv_link_bytes_per_s > 0, a KV load from another agent completes no
  // earlier than simulatedTransferSeconds() after it began.
  std::optional<StepProfile> simulate;
};

// Upper bounds (seconds, inclusive) of the KV load-duration histogram's
// buckets (tandem_kv_transfer_duration_seconds); one more bucket takes the
// rest.
inline constexpr std::array<double, 15> kKvLoadSecondsBounds = {
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};

// Blocks and bytes loaded from one source of a KV connector, and its
// finished loads as a cumulative histogram: how many fell in each bucket
// (kKvLoadSecondsBounds, then the rest) and the sum of their durations.
struct KvSourceTotals {
  int64_t blocks_loaded = 0;
  int64_t bytes = 0;
  std::array<int64_t, kKvLoadSecondsBounds.size() + 1> load_seconds_buckets{};
  double load_seconds_sum = 0;

  // One finished load of `seconds`: the first bucket whose bound is at
  // least that (a Prometheus bucket's `le`).
  void addLoad(double seconds) {
    const auto bucket =
        std::lower_bound(kKvLoadSecondsBounds.begin(), kKvLoadSecondsBounds.end(), seconds) -
        kKvLoadSecondsBounds.begin();
    ++load_seconds_buckets[static_cast<size_t>(bucket)];
    load_seconds_sum += seconds;
  }
};

// A consistent snapshot for metrics and health.
struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  // Uncomputed tokens of the waiting sequences (Scheduler::numPrefillTokensWaiting).
  int64_t num_prefill_tokens_waiting = 0;
  int64_t num_free_blocks = 0;
  int64_t num_blocks = 0;
  double kv_cache_usage = 0.0;
  int64_t num_preemptions = 0;
  // Of those, running sequences preempted to admit a request of a better
  // priority (--scheduling-policy priority).
  int64_t num_priority_preemptions = 0;
  // Sequences whose admission waited for blocks another was computing.
  int64_t num_prefix_waits = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of those, tokens found cached
  int64_t num_computed_tokens = 0;   // tokens the model has computed, in total
  int64_t num_steps = 0;
  int64_t kv_blocks_loaded = 0;  // blocks loaded through the KV connector
  int64_t kv_blocks_failed = 0;  // blocks that failed to load (recomputed or failed)
  int64_t kv_held_blocks = 0;    // distinct blocks held for remote readers
  // Compiled structured-output grammars cached, and their memory as last
  // counted (structured::ConstraintCache).
  int64_t grammar_cache_grammars = 0;
  int64_t grammar_cache_bytes = 0;
  bool draining = false;
  int64_t num_handed_over = 0;         // requests handed over on drain
  int64_t num_handed_over_blocks = 0;  // blocks held for their readers
  int64_t num_holds_yielded = 0;       // finished requests' holds ended for admission
  // Speculative decoding: sequence steps that computed drafts, the drafts
  // computed, and those accepted (the token sampled at their position was
  // the draft), in total and by position in their step's drafts (0: the
  // first; sized num_speculative_tokens, empty without speculation).
  int64_t spec_decode_num_drafts = 0;
  int64_t spec_decode_num_draft_tokens = 0;
  int64_t spec_decode_num_accepted_tokens = 0;
  std::vector<int64_t> spec_decode_accepted_per_position;
  std::string kv_connector;  // its name, empty without one
  // Loads by source (the connector's name, or a multi connector's member).
  std::map<std::string, KvSourceTotals> kv_sources;
  // Failed loads and refused transfers by reason (cumulative).
  std::map<std::string, int64_t> kv_transfer_failures;
  // Steps that threw (a backend's or KV connector's error): cumulative, and
  // how many in a row ended so since the last step that did not, with the
  // last one's message.
  int64_t num_step_failures = 0;
  int64_t consecutive_step_failures = 0;
  std::string last_step_error;
};

// After this many failed steps in a row, and none that completed since, the
// engine counts as failing (/health answers 503 so that a liveness probe
// restarts the process): the cause outlives the requests it failed.
inline constexpr int64_t kFailingAfterSteps = 3;

// The prefix cache's content at one KV event sequence number: what a reader
// that fell behind the event log needs to start over.
struct KvSnapshot {
  uint64_t sequence = 0;
  std::vector<BlockHash> block_hashes;
};

class Engine {
 public:
  using OutputCallback = std::function<void(const RequestOutput&)>;

  // Creates the compute backend, loads the model and tokenizer and allocates
  // the KV cache (in the backend's memory unless `allocator` is given, or
  // host memory on a host-accessible backend); throws tandem::Error naming
  // the problem. The loop starts right away.
  explicit Engine(const EngineConfig& config, std::unique_ptr<KvSlabAllocator> allocator = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and enqueues. Errors: InvalidArgument (names the field),
  // ResourceExhausted (queue full), Unavailable (stopping), AlreadyExists
  // reported as InvalidArgument for a duplicate id. On OK the callback will
  // receive the outputs.
  Status addRequest(Request request, OutputCallback callback);
  // Compiles a structured-output constraint for this model's vocabulary into
  // the engine's cache (the first call also builds the vocabulary's trie),
  // so that addRequest with it finds it compiled: call it where waiting is
  // allowed (a worker thread). Thread-safe; the compiler's errors.
  Status prepareStructuredOutput(const structured::Constraint& constraint);
  // The answer of a request admitted with later choices to come
  // (Request::admission_places > 1) has added them, or gave up: a stopping
  // engine keeps its inbox open for them until then (or its deadline), so
  // that a first choice ending before its answer's handler adds the others
  // does not leave them refused. Call it for each such first choice once
  // its answer is done adding; again, or for any other id, it does nothing.
  // Any thread.
  void joinsEnded(const std::string& request_id);
  // Aborts a queued or running request; its final output has reason "abort".
  // A finished request whose blocks are held for a remote reader (its
  // answer, which says where they are, did not reach its client) has them
  // released. Unknown ids are ignored.
  void abort(const std::string& request_id);
  // Frees the blocks held for the remote reader of a transfer that will not
  // happen, named by the kv_transfer_params this agent returned for it.
  // NotFound when none are held (released, timed out, never held); the
  // connector's errors (InvalidArgument, PermissionDenied) for parameters it
  // does not accept; FailedPrecondition without a connector.
  Status releaseTransfer(const nlohmann::json& kv_transfer_params);
  // Tells the KV connector where this agent's HTTP server answers (after
  // bind; listen_host may be a wildcard): its descriptors name that address.
  // The connector's FailedPrecondition when it cannot advertise a reachable
  // one. OK without a connector. Start-up only.
  Status advertiseKvAddress(const std::string& listen_host, int port);
  // A peer's KV handshake (POST /v1/kv_transfer/handshake), answered by the
  // connector from any thread: NotFound without a connector or when it serves
  // none; its InvalidArgument / PermissionDenied for a refused request.
  StatusOr<nlohmann::json> kvHandshake(const nlohmann::json& request) const;
  // The KV connector's info() for /health (null without a connector). Any
  // thread.
  nlohmann::json kvConnectorInfo() const;
  // Whether a control request to /v1/kv_transfer/<path> (or /admin/drain)
  // may be served: the connector's authorizeRequest (PermissionDenied naming
  // the kv_auth field when the agent has a KV secret and the body is not
  // signed with it); with a connector that has no secret, or none, the same
  // check against TANDEM_KV_SECRET when it is set. Any thread.
  Status authorizeKvRequest(std::string_view path, const nlohmann::json& body) const;
  // Pull-back (decode → prefill): pins the longest cached run of `tokens`'
  // leading full blocks, at most max_hold_blocks of them, for a remote
  // reader and returns the connector's descriptor of them (as a finished
  // request's kv_transfer_params), held until the reader's release, an
  // explicit release, or abort_timeout_s. NotFound when no block is cached;
  // FailedPrecondition without a producing connector; Unavailable (naming
  // the bound) when the blocks it would newly pin would take the holds past
  // max_total_hold_blocks, or leave fewer free blocks than the waiting
  // requests need.
  // `adapter`: the LoRA adapter whose blocks are meant (its served name;
  // empty: the base model's); an unknown one is NotFound.
  StatusOr<nlohmann::json> holdPrefix(std::vector<TokenId> tokens, std::string cache_salt,
                                      const std::string& adapter = {});
  // The resolved bounds of pull-back holds (config 0 replaced by its default).
  int64_t maxHoldBlocks() const { return max_hold_blocks_; }
  int64_t maxTotalHoldBlocks() const { return max_total_hold_blocks_; }
  // Stops accepting requests, lets in-flight ones finish until `deadline`,
  // aborts the rest, and stops the loop. Idempotent. After drain(), it also
  // waits (until `deadline`) for the readers of the handed-over blocks.
  void shutdown(Clock::time_point deadline);
  // Begins a drain: refuses new requests and holds (Unavailable "draining"),
  // and hands over every live request that allows it
  // (Request::hand_over_on_drain): its final output (reason abort,
  // handed_over) carries the descriptor of its computed blocks, held for the
  // agent that resumes it — every full block, past the bounds of pull-back
  // holds, until its reader releases it or abort_timeout_s. Others run on.
  // Returns at once; idempotent. Any thread.
  void drain();
  bool draining() const;
  // Asks for the live request `request_id` to be handed over as drain()
  // hands over (sets Request::hand_over_on_drain): at once when the engine
  // drains already, else when it does. Only a request that allows it
  // (Request::can_hand_over); an unknown id is ignored. With `hand_over`
  // false the ask is withdrawn (the request finishes here as the engine
  // drains: no agent is left to resume it); one handed over already stays
  // so. Any thread.
  void askHandOver(const std::string& request_id, bool hand_over = true);

  EngineStats stats() const;
  // Taken on the engine thread between steps, so it is consistent with the
  // event log; waits for the current step to end.
  KvSnapshot kvSnapshot();
  const Model& model() const { return *model_; }
  // The compute backend; kind() and description() may be read from any thread.
  const kernels::Backend& backend() const { return *backend_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const EngineConfig& config() const { return config_; }
  // The most engine requests it holds at once (running, loading their KV,
  // waiting, in its inbox): max_num_seqs + max_waiting_requests. A request
  // of more (n, best_of, several prompts) could never be admitted.
  int64_t maxRequestsHeld() const {
    return config_.scheduler.max_num_seqs + config_.max_waiting_requests;
  }
  int64_t maxModelLen() const { return max_model_len_; }
  int64_t numBlocks() const { return cache_->numBlocks(); }
  KvEventLog& kvEvents() { return events_; }
  // The model identity mixed into block hashes (also what the router uses).
  const std::string& modelIdentity() const { return model_identity_; }
  // The LoRA adapters served (EngineConfig::lora_modules, in order): what
  // /v1/models lists for each. `identity` is what its blocks are hashed
  // under: the model identity, then "/lora-" and the adapter's digest.
  struct AdapterInfo {
    std::string name;
    std::filesystem::path path;
    std::string identity;
    int64_t rank = 0;
  };
  const std::vector<AdapterInfo>& adapters() const { return adapter_infos_; }
  // The index of the adapter served as `name`; -1 when there is none.
  int32_t adapterIndex(std::string_view name) const;
  // A request's adapter (Request::adapter) as its index: -1 for none (""),
  // NotFound naming it when this engine does not serve it.
  StatusOr<int32_t> adapterFor(const std::string& name) const;
  // Token ids that end generation unless ignore_eos.
  const std::vector<TokenId>& eosTokenIds() const { return eos_token_ids_; }
  // The model directory's generation_config.json (empty without one).
  const protocol::GenerationConfig& generationConfig() const { return generation_; }
  // The step profile of a simulated engine; null for a real one.
  const StepProfile* simulatedProfile() const {
    return config_.simulate ? &*config_.simulate : nullptr;
  }

 private:
  struct Live;  // per-request output state, the engine thread's once queued
  // The output state of a new request: request.resume_output (streamed by
  // the agent it came from) replayed through the detokenizer and the stop
  // strings, so they stand where that agent left them, the replayed text
  // kept for the first output. InvalidArgument when it cannot be resumed (a
  // token outside the vocabulary, no room left in max_tokens, an ending
  // already in it).
  StatusOr<std::unique_ptr<Live>> resumedLive(const Request& request) const;
  // InvalidArgument "<field> token id N is outside the vocabulary [0, V)" for
  // the first such id of `tokens`, or OK.
  Status checkVocabulary(std::span<const TokenId> tokens, const char* field) const;
  // Whether `token` ends a request with `params`: an EOS id (unless
  // ignore_eos; endsAsEos) or one of its stop_token_ids.
  bool isStopToken(TokenId token, const SamplingParams& params) const;
  bool endsAsEos(TokenId token, const SamplingParams& params) const;

  struct Pending {
    std::unique_ptr<Sequence> sequence;
    std::unique_ptr<Live> live;  // with the callback and (structured) the matcher
  };
  class ConnectorSource;  // ExternalKvSource over the KV connector

  void loop();
  void drainInbox();
  // Runs step(); if it throws, fails the requests it was computing (failStep).
  void guardedStep();
  void step();
  // A step left by an exception with message `what`: fails the requests of
  // its batch, or when the batch was not yet known the one being admitted,
  // or else every live request (they are the only ones that could have
  // caused it, and failing them frees their blocks); the loop goes on.
  void failStep(const std::string& what);
  // The simulated counterpart of the forward pass and sampling for one
  // scheduled step that began (after scheduling) at `step_start`.
  void simulateStep(const SchedulerOutput& output, Clock::time_point step_start);
  // The min_tokens mask of a sampled row: stop ids and, unless ignore_eos,
  // the EOS ids, while the output is shorter than min_tokens.
  std::vector<TokenId> minTokensMask(const Sequence& sequence) const;
  // What every computed step (real or simulated) does after its forward
  // pass: counters, the scheduler's and prefix cache's bookkeeping, then one
  // token per sampling chunk, picked by `pick(chunk index, row, sequence,
  // live)` from the chunk's last row (row == its num_draft_tokens); in a
  // chunk with drafts, first from draft rows 0, 1, ... while each token
  // picked equals the draft at its row (docs/speculative-decoding.md).
  void finishStep(const SchedulerOutput& output,
                  const std::function<GeneratedToken(size_t, int64_t, Sequence&, Live&)>& pick);
  // Returns true when the token ended the request: its sequence and output
  // state are gone.
  bool emitToken(Sequence* sequence, Live& live, const GeneratedToken& token);
  // The scheduler's drafter (speculative decoding): proposes at most
  // `max_drafts` drafts for `sequence`, fewer where accepting them all
  // would pass its max_tokens or max_model_len.
  int64_t proposeDrafts(Sequence& sequence, int64_t max_drafts);
  // A request's final output with its counts (no tokens, no text).
  static RequestOutput finalOutput(const Sequence& sequence, FinishReason reason);
  void finishRequest(Sequence* sequence, FinishReason reason, const std::string& error = {});
  // Sends a request's final output and forgets it (blocks freed, id released).
  void deliverFinal(Sequence* sequence, RequestOutput out);
  void publishStats();
  void saveComputedBlocks(const SchedulerOutput& output);
  // Frees held blocks whose reader is done or whose hold timed out.
  void releaseHeldBlocks();
  // Serves holdPrefix() calls.
  void holdPrefixes();
  // `hand_over`: a drain's hold of a live request's blocks (every cached
  // one, no bound; awaited by shutdown like a finished request's blocks).
  StatusOr<nlohmann::json> holdPrefixNow(const std::vector<TokenId>& tokens,
                                         const std::string& cache_salt,
                                         const std::string& model_identity, bool hand_over = false);
  // Hands over the live requests that allow it (drain()).
  void handOver();
  void handOver(const std::vector<Sequence*>& sequences);
  KvSnapshot takeSnapshot() const;

  EngineConfig config_;
  std::function<Clock::time_point()> now_;
  // Declared before everything that holds its memory, so it is destroyed last.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvCache> cache_;
  KvEventLog events_;
  std::unique_ptr<BlockManager> block_manager_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;             // null when simulated
  std::unique_ptr<TokenChooser> simulated_tokens_;  // set when simulated
  std::unique_ptr<kv::KvConnector> connector_;
  // authorizeKvRequest's check when the connector makes none.
  std::unique_ptr<kv_auth::RequestVerifier> control_verifier_;
  std::unique_ptr<ConnectorSource> connector_source_;
  struct Held {
    SequenceBlocks blocks;
    Clock::time_point deadline;
    // A pull-back lend (holdPrefix): an offer, not a transfer a reader was
    // told of (a finished request's blocks, a drain's hand-over).
    bool lent = false;
    // A finished request's: the kv_transfer_params its answer carries,
    // with which an abort releases it (null for the others).
    nlohmann::json params;
    Clock::time_point since{};  // when the hold was taken
    // The reader reads the connector's copy (FinishDecision::copied): the
    // blocks may go back while the hold lasts.
    bool copied = false;
  };
  using HeldMap = std::unordered_map<std::string, Held>;
  // Adds a hold; takes one away, freeing its blocks (the next entry).
  // Both keep held_block_refs_ in step with held_.
  void addHold(const std::string& id, Held held);
  HeldMap::iterator dropHold(HeldMap::iterator it, bool tell_connector = true);
  // Gives a hold's blocks back to the pool (the hold itself stays).
  void freeHeldBlocks(Held& held);
  // The scheduler's reclaimer: frees `blocks_short` blocks held for remote
  // readers, or nothing when it cannot free that many. First holds whose
  // reader reads a copy (their transfer goes on), then finished requests'
  // holds held past hold_yield_after_s, oldest first (their readers will
  // compute the prompt). Only blocks no one else holds count.
  bool yieldHeldBlocks(int64_t blocks_short);
  HeldMap held_;  // request id → blocks for a remote reader
  // Held block → how many holds pin it: its size is the distinct held
  // blocks (tandem_kv_held_blocks), kept up to date rather than recounted
  // every step.
  std::unordered_map<BlockId, int> held_block_refs_;
  std::map<std::string, KvSourceTotals> kv_sources_;  // engine thread only
  Sampler sampler_;
  SamplerPool sampler_pool_;  // a step's first rows and prompt logprobs
  std::string model_identity_;
  std::vector<std::unique_ptr<LoraAdapter>> adapters_;
  std::vector<AdapterInfo> adapter_infos_;
  std::vector<TokenId> eos_token_ids_;
  protocol::GenerationConfig generation_;
  // Structured outputs: grammars compiled for this model's vocabulary, made
  // at the first constrained request (building the vocabulary's trie).
  StatusOr<std::shared_ptr<structured::CompiledGrammar>> compileConstraint(
      const structured::Constraint& constraint);
  // The tokens a structured output allows next (the end of sequence and
  // stop_token_ids only where the structure is complete); engine thread.
  std::span<const uint64_t> allowedTokens(const SamplingParams& params,
                                          structured::Matcher& matcher);
  std::once_flag constraints_once_;
  std::unique_ptr<structured::ConstraintCache> constraints_;
  // constraints_ once made, for stats() on other threads.
  std::atomic<structured::ConstraintCache*> constraints_made_{nullptr};
  std::vector<uint64_t> allowed_;  // engine thread: one row's mask
  int64_t max_model_len_ = 0;
  int64_t max_hold_blocks_ = 0;
  int64_t max_total_hold_blocks_ = 0;

  // Inbox, guarded by mutex_.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Pending> inbox_;
  std::vector<std::string> aborts_;
  std::vector<std::pair<std::string, bool>> hand_over_asks_;  // askHandOver(), for the loop
  std::vector<std::promise<KvSnapshot>> snapshot_requests_;
  std::vector<std::pair<std::string, std::promise<bool>>> release_requests_;
  struct HoldRequest {
    std::vector<TokenId> tokens;
    std::string cache_salt;
    std::string model_identity;  // a LoRA adapter's; empty: the base model's
    std::promise<StatusOr<nlohmann::json>> promise;
    // Engine thread: until when it may wait for blocks on their way into the
    // cache, and the prompt's block hashes (made once).
    Clock::time_point deadline{};
    std::vector<BlockHash> hashes;
  };
  std::vector<HoldRequest> hold_requests_;
  // Engine thread only: holds waiting for the prompt's next block, which a
  // live request is computing (or is queued to compute).
  std::vector<HoldRequest> deferred_holds_;
  // Whether the next block of `request`'s prompt past what is cached (and
  // below the block of its last token, which no reader takes) is on its way
  // into the cache: computed or to be computed by a live request.
  bool prefixIsComing(HoldRequest& request);
  uint64_t num_holds_ = 0;              // engine thread only
  int64_t num_handed_over_ = 0;         // engine thread only
  int64_t num_handed_over_blocks_ = 0;  // engine thread only
  int64_t num_holds_yielded_ = 0;       // engine thread only
  bool loop_exited_ = false;
  // Set with the decision to stop: nothing more enters the inbox (the loop
  // drains it once more, then exits).
  bool inbox_closed_ = false;
  // Requests waiting to run, those not yet taken from the inbox too: what
  // tandem_num_requests_waiting shows (with the running ones, what
  // --max-waiting-requests bounds). Under mutex_.
  int64_t waitingLocked() const { return std::ssize(inbox_) + stats_.num_waiting; }
  std::unordered_map<std::string, bool> known_ids_;  // accepted and not yet finished
  // First choices admitted with later choices to come whose answers have
  // not said joinsEnded, with the places kept for those not yet added: a
  // stop waits for them (until its deadline), and the bound counts the
  // places. Under mutex_.
  std::unordered_map<std::string, int64_t> joins_awaited_;
  int64_t placesKeptLocked() const {
    int64_t kept = 0;
    for (const auto& [first, places] : joins_awaited_) kept += places;
    return kept;
  }
  bool stopping_ = false;
  // The loop has seen stopping_ (engine thread writes, under mutex_).
  bool stop_noticed_ = false;
  bool draining_ = false;
  bool handed_over_ = false;  // engine thread: drain's hand-over done
  Clock::time_point deadline_{};
  EngineStats stats_;  // published by the engine thread

  // Engine thread only.
  std::unordered_map<Sequence*, std::unique_ptr<Live>> live_;
  // The step's logits, in the runner's memory (page-locked on a GPU) until
  // its next forward pass.
  std::span<const float> logits_;
  std::vector<TokenId> argmax_ids_;  // per sequence, when the argmax ran on the device
  int64_t num_computed_tokens_ = 0;
  int64_t num_steps_ = 0;
  // Speculative decoding (engine thread): EngineStats' spec_decode figures,
  // and per chunk of the step, its model input (the last token, then the
  // drafts) and its draft rows' logits.
  int64_t spec_num_drafts_ = 0;
  int64_t spec_num_draft_tokens_ = 0;
  int64_t spec_num_accepted_ = 0;
  std::vector<int64_t> spec_accepted_per_position_;
  std::vector<std::vector<TokenId>> verify_tokens_;
  std::vector<std::vector<float>> draft_logits_;
  // The sequences of the step under way, once scheduled (step_batch_known_).
  std::vector<Sequence*> step_batch_;
  bool step_batch_known_ = false;
  int64_t num_step_failures_ = 0;
  int64_t consecutive_step_failures_ = 0;
  std::string last_step_error_;

  std::thread thread_;
};

}  // namespace tandem::engine
