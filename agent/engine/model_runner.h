// The forward pass of a Llama-family decoder over a paged KV cache.
//
// forward() takes a batch of sequences, each with new tokens starting at any
// position after an already-cached range [0, start_position), and a block
// table covering every position up to start_position + num_tokens. It writes
// the new tokens' K/V into the cache and returns the logits of each sequence's
// last new token.
//
// Exactness: every kernel is batch-invariant, so a sequence's logits and KV
// bytes are bit-identical whether it runs alone or batched with others, in
// one chunk or many. A ModelRunner is used by one thread at a time (it owns
// scratch buffers); the Model it reads may be shared.
//
// Compute runs on a kernels::Backend: the constructor makes the weights
// resident there once, scratch lives in the backend's memory, and the KV
// cache's slab must be that backend's memory too. Logits come back to the
// host; on a host-accessible backend the last matmul writes them in place.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/lora.h"
#include "agent/engine/model.h"
#include "agent/engine/moe.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"

namespace tandem::engine {

struct SequenceInput {
  std::span<const TokenId> tokens;       // the new tokens (at least one)
  int64_t start_position = 0;            // position of tokens[0]
  std::span<const BlockId> block_table;  // blocks of positions 0, block_size, ...
  // How many of the new tokens, from the first, also want their logits
  // (prompt logprobs): forward() hands them to its RowLogitsSink.
  int64_t num_row_logits = 0;
  // The LoRA adapter the sequence runs with: an index ModelRunner::addAdapter
  // returned; -1: the base model alone.
  int32_t adapter = -1;
};

// Receives the logits of `count` consecutive new tokens of batch[sequence],
// from its new token `first`: count x vocab_size floats in host memory,
// valid for the call. Each row's bits are those the row would have as a
// sequence's last token (the same kernels, row by row).
using RowLogitsSink = std::function<void(size_t sequence, int64_t first, int64_t count,
                                         std::span<const float> logits)>;

// The longest sequence a runner on `backend` computes as the model does,
// and what sets it (for messages): the model's max_position_embeddings, or
// its sliding window on a backend without window kernels (one that is not
// host-accessible), whose full attention equals the window's only for
// sequences no longer than it (vLLM without sliding-window kernels caps
// max_model_len likewise), or there the positions Ministral 3's query scale
// leaves at 1.
struct ContextLimit {
  int64_t tokens = 0;
  std::string origin;
};
ContextLimit contextLimit(const ModelConfig& config, const kernels::Backend& backend);

// Floats in a backend's memory, owned; grown on demand (contents are not
// kept when it grows).
class BackendBuffer {
 public:
  explicit BackendBuffer(kernels::Backend& backend) : backend_(&backend) {}
  ~BackendBuffer();
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  // Makes room for at least `count` floats; throws tandem::Error when the
  // backend has no memory for them.
  void grow(size_t count);
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return count_; }

 private:
  kernels::Backend* backend_;
  float* data_ = nullptr;
  size_t count_ = 0;
};

// Host floats a device backend copies into every step (the logits),
// page-locked with it (Backend::pinHost), so the copy runs at the link's
// rate rather than through the driver's staging of pageable memory (on an
// H200, 32 rows of Llama 3's 128,256 logits took 1.7 ms a step that way).
// Plain memory on host backends or where pinning fails. Grows by at least
// doubling; the old storage is unpinned before it is freed.
class PinnedHostFloats {
 public:
  explicit PinnedHostFloats(kernels::Backend& backend) : backend_(&backend) {}
  ~PinnedHostFloats() { unpin(); }
  PinnedHostFloats(const PinnedHostFloats&) = delete;
  PinnedHostFloats& operator=(const PinnedHostFloats&) = delete;

  // `count` floats (their contents are not kept when the storage grows).
  std::span<float> take(size_t count);

 private:
  void unpin();
  kernels::Backend* backend_;
  std::unique_ptr<float[]> data_;
  size_t capacity_ = 0;
  bool pinned_ = false;
};

struct ModelRunnerOptions {
  // Q/K/V as one matrix and gate/up as one (stacked along their outputs, in
  // memory the runner owns): one matmul each, whose outputs are taken apart
  // (Backend::matmulSplit) or meet in SiLU·up (Backend::matmulSiluMul); and
  // the residual adds after the o and down projections as
  // Backend::matmulAdd. The same bits as separate matmuls — a matmul's
  // output column never depends on the other columns, and each fused op
  // gives the bits of the steps it replaces — with fewer, wider launches (a
  // backend may do those steps in the matmul's epilogue). Layers whose
  // matrices differ in dtype or layout stay separate.
  bool fuse_projections = false;
};

class ModelRunner {
 public:
  // The cache geometry must match the model (layers, KV heads, head size);
  // throws tandem::Error naming the mismatch, or when the backend cannot hold
  // the weights. The backend must outlive the runner.
  ModelRunner(const Model& model, KvCache& cache, kernels::Backend& backend,
              const ModelRunnerOptions& options = {});
  // Drops the backend's recordings: they refer to this runner's buffers.
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // logits receives num_sequences x vocab_size values. Inputs are checked
  // (token ids below vocab_size, block tables long enough, positions within
  // max_position_embeddings); a violation is a caller bug and aborts.
  // With `row_logits`, the rows SequenceInput::num_row_logits asks for go
  // to it, a few at a time, after the forward pass.
  void forward(std::span<const SequenceInput> batch, std::vector<float>& logits,
               const RowLogitsSink& row_logits = nullptr);
  // The same, the logits left in memory the runner keeps (page-locked on a
  // device backend: PinnedHostFloats), valid until its next forward pass:
  // the engine's steps, with no copy on the host.
  std::span<const float> forward(std::span<const SequenceInput> batch,
                                 const RowLogitsSink& row_logits = nullptr);
  // The same forward pass, returning only each sequence's greedy token
  // (argmax of its logits, the smallest id winning a tie), computed where
  // the logits are: on a GPU only the ids come back to the host.
  void forwardArgmax(std::span<const SequenceInput> batch, std::vector<TokenId>& tokens);

  // Decode steps are recorded and replayed when the backend can (CUDA
  // graphs); false runs every step as issued (vLLM's --enforce-eager).
  void setRecordDecode(bool record) { record_decode_ = record; }

  // Makes `adapter`'s matrices resident and returns the index sequences name
  // it by (SequenceInput::adapter). A sequence with an adapter adds, to each
  // projection the adapter adapts, B (A x) computed for its rows alone (two
  // matmuls of the rows of the sequences next to each other in the batch
  // that share the adapter, then addInPlace), before what follows the
  // projection (bias, RoPE, SiLU, the residual add); fused projections are
  // taken apart for such a batch (the same bits, ModelRunnerOptions). So a
  // row's bits still depend only on the row: a sequence gives the same
  // logits and KV alone or batched with others, whatever adapters they run
  // with, chunked or not. Throws tandem::Error when the adapter does not fit
  // the model, or the backend is not host memory (docs/lora.md: LoRA runs
  // on the CPU backend). The adapter must outlive the runner.
  int32_t addAdapter(const LoraAdapter& adapter);

  const Model& model() const { return model_; }
  // Bytes of the model's file mapping dropped from memory at construction:
  // the matrices the backend copied (bf16 compute's packing, a GPU upload).
  size_t droppedMappedBytes() const { return dropped_mapped_bytes_; }
  KvCache& cache() { return cache_; }
  kernels::Backend& backend() { return backend_; }

 private:
  // One layer's weights in the backend's memory; vectors that the model
  // leaves empty (no bias, no qk-norm) are nullptr.
  // An MLP (a dense layer's, or one expert of a mixture): with fused
  // projections, gate and up stacked in the backend's stackedLayout()
  // (gate_proj and up_proj then unset).
  struct ResidentMlp {
    kernels::WeightView gate_proj, up_proj, down_proj, gate_up_proj;
    bool fused = false;
    // GPT-OSS's MXFP4 experts' gate_up as published (ExpertWeights'),
    // multiplied whole and taken apart (the same bits as gate_proj and
    // up_proj, each byte read once).
    kernels::WeightView gate_up_interleaved;
    // GPT-OSS's experts' biases (null elsewhere).
    const float* gate_bias = nullptr;
    const float* up_bias = nullptr;
    const float* down_bias = nullptr;
  };
  struct ResidentLayer {
    kernels::WeightView q_proj, k_proj, v_proj, o_proj;
    // With fused projections (ModelRunnerOptions): [q; k; v] (q_proj ...
    // v_proj then unset), and o_proj's residual add as matmulAdd.
    bool fused = false;
    // q/k/v stacked in RoPE pairs, for Backend::matmulQkvRope (fused, a
    // kPairs backend, no q/k norm).
    bool qkv_rope = false;
    kernels::WeightView qkv_proj;
    ResidentMlp mlp;  // a dense layer's
    // A mixture layer's router and experts (Model's LayerWeights); with
    // sigmoid routing the router is the checkpoint's matrix as it is (f32
    // arithmetic in every compute dtype, as transformers' and vLLM's f32
    // gate), its correction bias, and the shared experts.
    kernels::WeightView router;
    std::vector<ResidentMlp> experts;
    const float* router_bias = nullptr;
    const float* router_logit_bias = nullptr;  // GPT-OSS's
    ResidentMlp shared_expert;                 // down_proj unset without shared experts
    // Qwen2-MoE's shared expert gate (1 x hidden); unset elsewhere.
    kernels::WeightView shared_expert_gate;
    const float* input_layernorm = nullptr;
    const float* post_attention_layernorm = nullptr;
    // Gemma 3's sandwich norms (model.h's LayerWeights); null elsewhere.
    const float* pre_feedforward_layernorm = nullptr;
    const float* post_feedforward_layernorm = nullptr;
    // The layer's attention is within the model's sliding_window.
    bool sliding = false;
    // Gemma's and OLMo 3's sliding layers (ModelConfig::localRopeLayer):
    // rotated by local_inv_freq_ and local_rope_variant_.
    bool local_rope = false;
    // False for SmolLM3's NoPE layers: q and k are not rotated.
    bool rope = true;
    const float* q_bias = nullptr;
    const float* k_bias = nullptr;
    const float* v_bias = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    // GPT-OSS's o_proj bias and attention sinks (null elsewhere).
    const float* o_bias = nullptr;
    const float* sinks = nullptr;
  };
  struct ResidentWeights {
    kernels::WeightView embed_tokens, lm_head;
    const float* norm = nullptr;
    std::vector<ResidentLayer> layers;
  };

  void checkInput(const SequenceInput& sequence) const;
  // The forward pass; returns where the sequences' logits are (rows of
  // vocab_size, padded sequences after the real ones): `host_logits` on a
  // host-accessible backend, else backend memory. nullptr for no rows.
  const float* compute(std::span<const SequenceInput> batch, std::vector<float>& host_logits);
  // Scratch for `rows` rows and `sequences` sequences (grown, never shrunk).
  void growScratch(int64_t rows, int64_t sequences);
  // Every kernel of one forward over the batch beginBatch() set up; the
  // sequences' logits go to `logits` (backend memory).
  void issueStep(int64_t rows, int64_t sequences, float* logits);
  // y[r, 0..out) += B (A x[r, 0..in)) for the rows of every LoRA run whose
  // adapter adapts `module` of `layer` (x and y row-major, row strides in
  // and out).
  void addLoraDeltas(int64_t layer, int module, const float* x, int64_t in, float* y, int64_t out);
  // The MLP block after the post-attention norm: out = down(silu(gate x)
  // * up x) for `rows` rows of x (hidden floats each), added to out when
  // `accumulate`; with LoRA deltas of `lora_layer` (-1: none).
  void mlp(const ResidentMlp& weights, const float* x, int64_t rows, int64_t inter, float* out,
           bool accumulate, int64_t lora_layer);
  // A mixture layer's MLP block on normed_, added to hidden_: the router's
  // logits, each row's experts (moe.h), each expert's MLP over the rows
  // routed to it, and each row's weighted sum of its experts' outputs
  // taken in expert order (as transformers adds them), then the shared
  // experts' output added to it, so a row's bits depend on the row alone.
  // One GPT-OSS expert on expert_in_'s first `rows` rows, into
  // expert_out_: gate and up with their biases, the clamped activation,
  // down with its bias.
  void gptOssExpert(const ResidentMlp& expert, int64_t rows);
  void mixture(const ResidentLayer& layer, int64_t rows);
  ResidentMlp residentMlp(const kernels::WeightView& gate, const kernels::WeightView& up,
                          const kernels::WeightView& down);
  // Whether `parts` can be stacked into one matrix: rows of one dtype and
  // width.
  static bool stackable(std::initializer_list<const kernels::WeightView*> parts);
  // After a forward pass: the logits of the rows the batch asked for
  // (SequenceInput::num_row_logits), from the final hidden states.
  void computeRowLogits(std::span<const SequenceInput> batch, const RowLogitsSink& sink);
  const float* resident(const std::vector<float>& host);
  // backend_.matmulWeight(host); when that is a copy, the host matrix's
  // pages of the file mapping are dropped (Model::dropMappedPages).
  kernels::WeightView matmulWeight(const kernels::WeightView& host);
  // `used`, noting a use of the backend's copy to release at destruction
  // when it is one (other data than host's).
  kernels::WeightView hold(const kernels::WeightView& host, const kernels::WeightView& used);
  // Matrices stacked along their outputs, in anonymous memory this runner
  // owns (fused projections).
  class StackedMatrix;
  // The order of a stacked matrix's rows (Backend::StackedLayout):
  // kConcatenate, the parts one after the other; kInterleave, row r of
  // each part in turn, for r = 0, 1, ... (parts of equal rows); kRopePairs,
  // the first two parts' heads (head_dim rows each) with rows i and i +
  // head_dim / 2 side by side, the other parts as they are.
  struct StackOrder {
    enum Kind { kConcatenate, kInterleave, kRopePairs };
    Kind kind = kConcatenate;
    int64_t head_dim = 0;
  };
  // The stacked matrix of `parts` made resident for matmul; the parts'
  // mapped pages, which this runner then never reads, are dropped.
  kernels::WeightView stackedWeight(std::initializer_list<const kernels::WeightView*> parts,
                                    StackOrder order);

  const Model& model_;
  KvCache& cache_;
  kernels::Backend& backend_;
  ModelRunnerOptions options_;
  // Destroyed after the destructor's body has released the backend's
  // copies of them.
  std::vector<std::unique_ptr<StackedMatrix>> stacked_;
  // Some expert has gate_up_interleaved (which needs fused_).
  bool interleaved_experts_ = false;
  ResidentWeights weights_;
  BackendBuffer inv_freq_;
  // Gemma's and OLMo 3's sliding layers' rotary frequencies
  // (rope_local_base_freq, unscaled).
  BackendBuffer local_inv_freq_;
  float attention_scale_ = 1.0f;
  // Partial rotary dims and LongRoPE's or YaRN's attention factor (Phi-3,
  // Phi-4, YaRN); default: whole heads, factor 1 (Backend::applyRope).
  kernels::RopeVariant rope_variant_;
  // The local-rope layers': rope_variant_'s dims, factor 1.
  kernels::RopeVariant local_rope_variant_;
  // Whether attention takes a variant (a window, a soft-cap).
  bool attention_variant_ = false;
  // Gemma 3, Granite: hidden_ (rows x hidden_size) times embedding_scale_,
  // rounded to the embedding table's dtype.
  void scaleEmbeddings(int64_t rows);
  // Ministral 3: each row of q_ times ModelConfig::queryScale of its
  // position, on a host-accessible backend (contextLimit keeps the others'
  // sequences below the positions it scales; checkInput enforces it).
  bool scale_queries_ = false;
  void scaleQueries(int64_t rows);
  // What the model does to the n logits at `logits` after the LM head:
  // Granite's division by logits_scaling, Gemma 2's soft-cap by
  // final_logit_softcapping (nothing for other models).
  void finishLogits(float* logits, int64_t n) const;
  // Granite: a residual branch's output (proj_, rows x hidden_size) times
  // residual_multiplier, then added to hidden_.
  void addScaledResidual(int64_t rows);
  // Gemma 3: the embedding's multiplier, sqrt(hidden_size) rounded to the
  // table's dtype; Granite: embedding_multiplier (0: none).
  float embedding_scale_ = 0.0f;
  bool record_decode_ = true;
  size_t dropped_mapped_bytes_ = 0;
  // Host views whose backend copies this runner holds a use of
  // (Backend::releaseWeight at destruction).
  std::vector<kernels::WeightView> backend_copies_;
  // Names this runner's buffers and cache to the backend's recordings.
  const uint64_t recording_owner_;
  // Scratch in the backend's memory, grown on demand and reused across calls.
  BackendBuffer hidden_, normed_, q_, k_, v_, attn_, proj_, gate_, up_, last_, logits_;
  BackendBuffer fused_;                 // a fused matmul's outputs, before they are copied apart
  BackendBuffer row_logits_;            // computeRowLogits, off a host-accessible backend
  std::vector<float> host_row_logits_;  // computeRowLogits' rows on the host
  // The batch, flattened on the host.
  std::vector<int32_t> token_ids_, positions_;
  std::vector<float> host_logits_;  // the logits on a host backend
  PinnedHostFloats pinned_logits_;  // the logits copied back from a device backend
  std::vector<kernels::AttentionSequence> attention_sequences_;

  // LoRA adapters (addAdapter), each [layer][module]: A (rank x in) and B
  // times the scale (out x rank) in the backend's memory; unset views for
  // projections the adapter leaves as they are.
  struct ResidentLora {
    kernels::WeightView a, b;
  };
  std::vector<std::vector<std::array<ResidentLora, kLoraModules>>> adapters_;
  int64_t max_lora_rank_ = 0;
  // The batch's rows that run with an adapter: runs of consecutive rows
  // sharing one (compute() fills it).
  struct LoraRun {
    int64_t first_row = 0;
    int64_t rows = 0;
    int32_t adapter = -1;
  };
  std::vector<LoraRun> lora_runs_;
  BackendBuffer lora_down_;   // rows x rank: A x
  BackendBuffer lora_delta_;  // rows x out: B (A x)

  // Mixture layers: the router's logits (rows x num_experts), one expert's
  // rows gathered and its outputs, and the rows' weighted sums.
  BackendBuffer router_logits_, expert_in_, expert_out_, expert_sum_;
  ExpertAssignment assignment_;
};

}  // namespace tandem::engine
