#include "agent/engine/model_runner.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/thread_scratch.h"

namespace tandem::engine {
BackendBuffer::~BackendBuffer() {
  if (data_ != nullptr) backend_->release(data_, count_ * sizeof(float));
}

std::span<float> PinnedHostFloats::take(size_t count) {
  if (count > capacity_) {
    unpin();
    capacity_ = std::max(count, 2 * capacity_);
    data_ = std::make_unique_for_overwrite<float[]>(capacity_);
    pinned_ = backend_->pinHost(data_.get(), capacity_ * sizeof(float));
  }
  return {data_.get(), count};
}

void PinnedHostFloats::unpin() {
  if (pinned_) backend_->unpinHost(data_.get());
  pinned_ = false;
}

void BackendBuffer::grow(size_t count) {
  if (count <= count_) return;
  void* fresh = backend_->allocate(count * sizeof(float));
  if (fresh == nullptr) {
    throw Error("the " + std::string(kernels::deviceKindName(backend_->kind())) +
                " backend has no memory for a scratch buffer of " +
                std::to_string(count * sizeof(float)) + " bytes");
  }
  if (data_ != nullptr) {
    backend_->release(data_, count_ * sizeof(float));
    // Recorded steps hold the old address.
    backend_->forgetRecordings();
  }
  data_ = static_cast<float*>(fresh);
  count_ = count;
}

namespace {

// x rounded to `dtype` and read back as fp32 (f32: x itself).
float roundToDType(float x, DType dtype) {
  if (dtype == DType::kF32) return x;
  uint8_t bytes[sizeof(float)];
  convertFromF32(dtype, &x, bytes, 1);
  float rounded = 0.0f;
  convertToF32(dtype, bytes, &rounded, 1);
  return rounded;
}

// A process-wide counter: every runner's recordings have their own owner.
uint64_t nextRecordingOwner() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace

ContextLimit contextLimit(const ModelConfig& config, const kernels::Backend& backend) {
  ContextLimit limit{config.max_position_embeddings, "the model's max_position_embeddings"};
  if (backend.hostAccessible()) return limit;
  if (config.sliding_window > 0 && config.sliding_window < limit.tokens) {
    limit = {config.sliding_window,
             "the model's sliding_window (attention on " + backend.description() +
                 " is full, the same as the window's only for sequences no longer than it)"};
  }
  if (config.llama4_scaling_beta > 0 && config.llama4_scaling_original < limit.tokens) {
    limit = {config.llama4_scaling_original,
             "the positions the model's query scale (llama_4_scaling_beta) leaves at 1 (" +
                 backend.description() + " does not apply it)"};
  }
  return limit;
}

ModelRunner::~ModelRunner() {
  backend_.forgetRecordings();
  // The backend frees a copy when its last runner lets go, so a model loaded
  // later at the same host addresses never meets this model's copies.
  for (const kernels::WeightView& host : backend_copies_) {
    try {
      backend_.releaseWeight(host);
    } catch (const std::exception& error) {
      TANDEM_LOG(kWarn) << "model runner: releasing a weight copy failed: " << error.what();
    }
  }
}

ModelRunner::ModelRunner(const Model& model, KvCache& cache, kernels::Backend& backend,
                         const ModelRunnerOptions& options)
    : model_(model),
      cache_(cache),
      backend_(backend),
      options_(options),
      inv_freq_(backend),
      local_inv_freq_(backend),
      recording_owner_(nextRecordingOwner()),
      hidden_(backend),
      normed_(backend),
      q_(backend),
      k_(backend),
      v_(backend),
      attn_(backend),
      proj_(backend),
      gate_(backend),
      up_(backend),
      last_(backend),
      logits_(backend),
      fused_(backend),
      row_logits_(backend),
      pinned_logits_(backend),
      lora_down_(backend),
      lora_delta_(backend),
      router_logits_(backend),
      expert_in_(backend),
      expert_out_(backend),
      expert_sum_(backend) {
  const ModelConfig& config = model_.config();
  const KvCacheConfig& kv = cache_.config();
  auto mismatch = [](const char* what, int64_t model_value, int64_t cache_value) {
    return Error(std::string("KV cache does not fit the model: ") + what + " is " +
                 std::to_string(cache_value) + " in the cache, " + std::to_string(model_value) +
                 " in the model");
  };
  if (kv.num_layers != config.num_hidden_layers) {
    throw mismatch("num_layers", config.num_hidden_layers, kv.num_layers);
  }
  if (kv.num_kv_heads != config.num_key_value_heads) {
    throw mismatch("num_kv_heads", config.num_key_value_heads, kv.num_kv_heads);
  }
  if (kv.head_dim != config.head_dim) throw mismatch("head_dim", config.head_dim, kv.head_dim);
  // What only a host-accessible backend (the CPU's) computes is refused on
  // the others, naming the model, the backend and what to start instead.
  const std::string model_name =
      "model " + model_.directory().string() + " (" + config.architecture + ")";
  auto requireHost = [&](bool needed, const std::string& what, const char* remedy,
                         const char* doc) {
    if (!needed || backend_.hostAccessible()) return;
    throw Error(what + " on the CPU backend only (" + backend_.description() +
                " is not one: start it with --device cpu" + remedy + "; " + doc + ")");
  };
  requireHost(config.num_experts > 0, model_name + " is a mixture of experts, which runs", "",
              "docs/engine.md#mixture-of-experts");
  requireHost(model_.fp8Matrices() > 0,
              "model " + model_.directory().string() + " has fp8 weights (" +
                  config.quantization.method + ", " +
                  granularityName(config.quantization.granularity) + " scales), which run",
              "", "docs/quantization.md");
  requireHost(kv.dtype == DType::kF8E4M3, "an fp8 KV cache (--kv-dtype fp8) runs",
              ", or give it --kv-dtype bf16", "docs/quantization.md#fp8-kv-cache");
  requireHost(config.granite,
              model_name + " scales its embedding, residual branches and logits, which runs", "",
              "docs/engine.md#granite");
  requireHost(config.gemma, model_name + " runs", "", "docs/engine.md#gemma-3");
  rope_variant_.rotary_dim = config.rotary_dim == config.head_dim ? 0 : config.rotary_dim;
  rope_variant_.attention_factor = static_cast<float>(config.ropeAttentionFactor());
  rope_variant_.interleaved = config.glm;
  local_rope_variant_.rotary_dim = rope_variant_.rotary_dim;
  local_rope_variant_.interleaved = rope_variant_.interleaved;
  const bool plain_rope = rope_variant_ == kernels::RopeVariant{};
  const bool yarn =
      rope_variant_.rotary_dim == 0 && config.rope_scaling.type == RopeScaling::Type::kYarn;
  requireHost(
      !plain_rope && !backend_.appliesRopeVariants(),
      model_name + " " +
          (rope_variant_.interleaved      ? "rotates neighbour pairs (GLM's rotary embedding)"
           : rope_variant_.rotary_dim > 0 ? "rotates part of each head (partial_rotary_factor)"
           : yarn ? "scales its rotary embedding's cos and sin (YaRN's attention factor)"
                  : "scales its rotary embedding (LongRoPE)") +
          ", which runs",
      "",
      rope_variant_.interleaved ? "docs/engine.md#glm-4"
      : yarn                    ? "docs/engine.md#yarn"
                                : "docs/engine.md#phi-3-and-phi-4");
  // A backend that cannot apply windows (not host-accessible) computes full
  // attention: the engine capped max_model_len at the window, within which
  // the two are one.
  attention_variant_ =
      backend_.hostAccessible() &&
      (!config.sliding_layers.empty() || config.attn_logit_softcapping > 0 || config.gptOss());
  const std::vector<float> inv_freq = ropeInverseFrequencies(config);
  inv_freq_.grow(inv_freq.size());
  backend_.copyFromHost(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(float));
  attention_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)));
  if (config.gemma || config.olmo3) {
    const std::vector<float> local = localRopeInverseFrequencies(config);
    local_inv_freq_.grow(local.size());
    backend_.copyFromHost(local_inv_freq_.data(), local.data(), local.size() * sizeof(float));
  }
  if (config.gemma) {
    attention_scale_ =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.query_pre_attn_scalar)));
    // transformers: torch.tensor(hidden_size ** 0.5) (fp32), then
    // .to(embed_tokens.weight.dtype).
    embedding_scale_ =
        roundToDType(static_cast<float>(std::sqrt(static_cast<double>(config.hidden_size))),
                     model_.weights().embed_tokens.dtype);
  }
  scale_queries_ = config.llama4_scaling_beta > 0 && backend_.hostAccessible();
  if (config.granite) {
    // transformers and vLLM: the table's rows times the Python float (fp32
    // arithmetic), the product in the table's dtype; the multiplier itself
    // is not rounded.
    attention_scale_ = static_cast<float>(config.attention_multiplier);
    embedding_scale_ = static_cast<float>(config.embedding_multiplier);
  }

  const ModelWeights& host = model_.weights();
  weights_.embed_tokens = hold(host.embed_tokens, backend_.residentWeight(host.embed_tokens));
  weights_.lm_head = matmulWeight(host.lm_head);
  weights_.norm = resident(host.norm);
  weights_.layers.reserve(host.layers.size());
  for (const LayerWeights& lw : host.layers) {
    ResidentLayer layer;
    layer.rope = !config.nopeLayer(static_cast<int64_t>(weights_.layers.size()));
    layer.fused = options_.fuse_projections && stackable({&lw.q_proj, &lw.k_proj, &lw.v_proj});
    if (layer.fused) {
      // Rows in the order the backend's matmulQkvRope reads them. With q/k
      // norm, RoPE follows the norm of the whole head: q/k/v are then
      // taken apart as they are.
      const bool pairs = backend_.stackedLayout() == kernels::Backend::StackedLayout::kPairs;
      layer.qkv_rope = pairs && lw.q_norm.empty() && plain_rope && layer.rope;
      layer.qkv_proj = stackedWeight(
          {&lw.q_proj, &lw.k_proj, &lw.v_proj},
          {layer.qkv_rope ? StackOrder::kRopePairs : StackOrder::kConcatenate, config.head_dim});
    } else {
      layer.q_proj = matmulWeight(lw.q_proj);
      layer.k_proj = matmulWeight(lw.k_proj);
      layer.v_proj = matmulWeight(lw.v_proj);
    }
    layer.o_proj = matmulWeight(lw.o_proj);
    if (lw.experts.empty()) {
      layer.mlp = residentMlp(lw.gate_proj, lw.up_proj, lw.down_proj);
    } else {
      layer.router = config.sigmoid_routing ? lw.router : matmulWeight(lw.router);
      for (const ExpertWeights& expert : lw.experts) {
        layer.experts.push_back(residentMlp(expert.gate_proj, expert.up_proj, expert.down_proj));
        if (expert.gate_up_interleaved.data != nullptr) {
          layer.experts.back().gate_up_interleaved = matmulWeight(expert.gate_up_interleaved);
          interleaved_experts_ = true;
        }
        layer.experts.back().gate_bias = resident(expert.gate_bias);
        layer.experts.back().up_bias = resident(expert.up_bias);
        layer.experts.back().down_bias = resident(expert.down_bias);
      }
      layer.router_bias = resident(lw.router_bias);
      layer.router_logit_bias = resident(lw.router_logit_bias);
      if (lw.shared_expert.gate_proj.data != nullptr) {
        const ExpertWeights& shared = lw.shared_expert;
        layer.shared_expert = residentMlp(shared.gate_proj, shared.up_proj, shared.down_proj);
      }
      if (lw.shared_expert_gate.data != nullptr) {
        layer.shared_expert_gate = matmulWeight(lw.shared_expert_gate);
      }
    }
    layer.input_layernorm = resident(lw.input_layernorm);
    layer.post_attention_layernorm = resident(lw.post_attention_layernorm);
    layer.pre_feedforward_layernorm = resident(lw.pre_feedforward_layernorm);
    layer.post_feedforward_layernorm = resident(lw.post_feedforward_layernorm);
    layer.sliding = config.slidingLayer(static_cast<int64_t>(weights_.layers.size()));
    layer.local_rope = config.localRopeLayer(static_cast<int64_t>(weights_.layers.size()));
    layer.q_bias = resident(lw.q_bias);
    layer.k_bias = resident(lw.k_bias);
    layer.v_bias = resident(lw.v_bias);
    layer.q_norm = resident(lw.q_norm);
    layer.k_norm = resident(lw.k_norm);
    layer.o_bias = resident(lw.o_bias);
    layer.sinks = resident(lw.sinks);
    weights_.layers.push_back(layer);
  }
  if (dropped_mapped_bytes_ > 0) {
    TANDEM_LOG(kInfo) << "model runner: " << dropped_mapped_bytes_ / 1000000.0
                      << " MB of mapped weight pages dropped: the backend holds its own copy";
  }
}

bool ModelRunner::stackable(std::initializer_list<const kernels::WeightView*> parts) {
  const kernels::WeightView& first = **parts.begin();
  for (const kernels::WeightView* part : parts) {
    // fp8 matrices are multiplied as they are, each with its scales
    // (unfused: a fused matmul gives the unfused bits, so nothing changes).
    if (part->layout != kernels::WeightLayout::kRows || part->dtype != first.dtype ||
        part->cols != first.cols || part->dtype == DType::kF8E4M3) {
      return false;
    }
  }
  return true;
}

ModelRunner::ResidentMlp ModelRunner::residentMlp(const kernels::WeightView& gate,
                                                  const kernels::WeightView& up,
                                                  const kernels::WeightView& down) {
  ResidentMlp mlp;
  // (Gemma's GELU and GPT-OSS's clamped activation with biases have no
  // fused matmul: their gate and up stay apart.)
  mlp.fused = options_.fuse_projections && !model_.config().gemma && !model_.config().gptOss() &&
              stackable({&gate, &up});
  if (mlp.fused) {
    // Rows in the order the backend's matmulSiluMul reads them.
    const bool pairs = backend_.stackedLayout() == kernels::Backend::StackedLayout::kPairs;
    mlp.gate_up_proj = stackedWeight(
        {&gate, &up}, {pairs ? StackOrder::kInterleave : StackOrder::kConcatenate, 0});
  } else {
    mlp.gate_proj = matmulWeight(gate);
    mlp.up_proj = matmulWeight(up);
  }
  mlp.down_proj = matmulWeight(down);
  return mlp;
}

class ModelRunner::StackedMatrix {
 public:
  StackedMatrix(std::initializer_list<const kernels::WeightView*> parts, StackOrder order) {
    const kernels::WeightView& first = **parts.begin();
    view_ = {nullptr, first.dtype, 0, first.cols, kernels::WeightLayout::kRows};
    for (const kernels::WeightView* part : parts) {
      view_.rows += part->rows;
      bytes_ += kernels::viewBytes(*part);
    }
    void* data =
        ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      throw Error("no memory for a stacked projection matrix of " + std::to_string(bytes_) +
                  " bytes");
    }
    // Rows are outputs: each is copied whole, in the order asked for.
    const size_t row_bytes = kernels::viewBytes(first) / static_cast<size_t>(first.rows);
    auto* out = static_cast<uint8_t*>(data);
    auto copyRow = [&](const kernels::WeightView& part, int64_t row) {
      std::memcpy(out, static_cast<const uint8_t*>(part.data) + row * row_bytes, row_bytes);
      out += row_bytes;
    };
    switch (order.kind) {
      case StackOrder::kConcatenate:
        for (const kernels::WeightView* part : parts) {
          for (int64_t r = 0; r < part->rows; ++r) copyRow(*part, r);
        }
        break;
      case StackOrder::kInterleave:
        for (const kernels::WeightView* part : parts) {
          TANDEM_CHECK(part->rows == first.rows, "interleaved parts must have equal rows");
        }
        for (int64_t r = 0; r < first.rows; ++r) {
          for (const kernels::WeightView* part : parts) copyRow(*part, r);
        }
        break;
      case StackOrder::kRopePairs: {
        const int64_t dim = order.head_dim;
        TANDEM_CHECK(dim > 0 && dim % 2 == 0, "RoPE pairs need an even head_dim");
        int index = 0;
        for (const kernels::WeightView* part : parts) {
          if (index++ >= 2) {  // v: as it is
            for (int64_t r = 0; r < part->rows; ++r) copyRow(*part, r);
            continue;
          }
          TANDEM_CHECK(part->rows % dim == 0, "q/k rows must be whole heads");
          for (int64_t head = 0; head < part->rows; head += dim) {
            for (int64_t i = 0; i < dim / 2; ++i) {
              copyRow(*part, head + i);
              copyRow(*part, head + i + dim / 2);
            }
          }
        }
        break;
      }
    }
    view_.data = data;
  }
  ~StackedMatrix() { ::munmap(const_cast<void*>(view_.data), bytes_); }
  StackedMatrix(const StackedMatrix&) = delete;
  StackedMatrix& operator=(const StackedMatrix&) = delete;

  const kernels::WeightView& view() const { return view_; }
  // Gives the pages back while keeping the address, which names the
  // backend's copy until it is released: for a backend that made one.
  void dropPages() { ::madvise(const_cast<void*>(view_.data), bytes_, MADV_DONTNEED); }

 private:
  kernels::WeightView view_;
  size_t bytes_ = 0;
};

kernels::WeightView ModelRunner::stackedWeight(
    std::initializer_list<const kernels::WeightView*> parts, StackOrder order) {
  stacked_.push_back(std::make_unique<StackedMatrix>(parts, order));
  StackedMatrix& stacked = *stacked_.back();
  const kernels::WeightView used = hold(stacked.view(), backend_.matmulWeight(stacked.view()));
  if (used.data != stacked.view().data) stacked.dropPages();
  // This runner reads only the stacked copy (never the tied embedding: no
  // projection is it).
  for (const kernels::WeightView* part : parts) {
    dropped_mapped_bytes_ += model_.dropMappedPages(*part);
  }
  return used;
}

kernels::WeightView ModelRunner::hold(const kernels::WeightView& host,
                                      const kernels::WeightView& used) {
  if (used.data != host.data) backend_copies_.push_back(host);
  return used;
}

kernels::WeightView ModelRunner::matmulWeight(const kernels::WeightView& host) {
  const kernels::WeightView used = hold(host, backend_.matmulWeight(host));
  // A matrix the backend copied (packed for bf16 compute, or uploaded) is
  // never read from the file mapping again, unless it is also the embedding
  // table (tied LM head), which lookups read. Dropping it now, before the
  // next one is copied, keeps load from holding both in full.
  if (used.data != host.data && host.data != model_.weights().embed_tokens.data) {
    dropped_mapped_bytes_ += model_.dropMappedPages(host);
  }
  return used;
}

const float* ModelRunner::resident(const std::vector<float>& host) {
  if (host.empty()) return nullptr;
  const float* used = backend_.residentFloats(host.data(), host.size());
  hold({host.data(), DType::kF32, 1, static_cast<int64_t>(host.size())}, {used, DType::kF32, 1, 0});
  return used;
}

int32_t ModelRunner::addAdapter(const LoraAdapter& adapter) {
  const ModelConfig& config = model_.config();
  if (!backend_.hostAccessible() ||
      backend_.stackedLayout() != kernels::Backend::StackedLayout::kPlain) {
    throw Error("LoRA adapter " + adapter.name() + ": adapters run on the CPU backend only (" +
                backend_.description() + " is not one; docs/lora.md)");
  }
  if (adapter.numLayers() != config.num_hidden_layers) {
    throw Error("LoRA adapter " + adapter.name() + " has " + std::to_string(adapter.numLayers()) +
                " layers, the model " + std::to_string(config.num_hidden_layers));
  }
  std::vector<std::array<ResidentLora, kLoraModules>> layers(adapter.numLayers());
  for (int64_t layer = 0; layer < adapter.numLayers(); ++layer) {
    for (int module = 0; module < kLoraModules; ++module) {
      const LoraPair& pair = adapter.pair(layer, module);
      if (pair.rank == 0) continue;
      const kernels::WeightView a{pair.a.data(), DType::kF32, pair.rank, pair.in};
      const kernels::WeightView b{pair.b_scaled.data(), DType::kF32, pair.out, pair.rank};
      layers[layer][module] = {hold(a, backend_.residentWeight(a)),
                               hold(b, backend_.residentWeight(b))};
      max_lora_rank_ = std::max(max_lora_rank_, pair.rank);
    }
  }
  adapters_.push_back(std::move(layers));
  return static_cast<int32_t>(adapters_.size() - 1);
}

void ModelRunner::addLoraDeltas(int64_t layer, int module, const float* x, int64_t in, float* y,
                                int64_t out) {
  for (const LoraRun& run : lora_runs_) {
    const ResidentLora& lora = adapters_[run.adapter][layer][module];
    if (lora.a.data == nullptr) continue;
    backend_.matmul(x + run.first_row * in, run.rows, in, lora.a, lora_down_.data());
    backend_.matmul(lora_down_.data(), run.rows, lora.a.rows, lora.b, lora_delta_.data());
    backend_.addInPlace(y + run.first_row * out, lora_delta_.data(), run.rows * out);
  }
}

void ModelRunner::checkInput(const SequenceInput& sequence) const {
  const ModelConfig& config = model_.config();
  TANDEM_CHECK(!sequence.tokens.empty(), "a sequence in a forward batch has no new tokens");
  TANDEM_CHECK(sequence.start_position >= 0, "negative start position");
  const int64_t end = sequence.start_position + static_cast<int64_t>(sequence.tokens.size());
  TANDEM_CHECK(end <= config.max_position_embeddings, "position beyond max_position_embeddings");
  TANDEM_CHECK(
      scale_queries_ || config.llama4_scaling_beta <= 0 || end <= config.llama4_scaling_original,
      "position the query scale changes on a backend that does not apply it");
  const int64_t blocks_needed = (end + cache_.blockSize() - 1) / cache_.blockSize();
  TANDEM_CHECK(static_cast<int64_t>(sequence.block_table.size()) >= blocks_needed,
               "block table shorter than the sequence");
  for (int64_t b = 0; b < blocks_needed; ++b) {
    TANDEM_CHECK(sequence.block_table[b] >= 0 && sequence.block_table[b] < cache_.numBlocks(),
                 "block id out of range");
  }
  for (TokenId token : sequence.tokens) {
    TANDEM_CHECK(token >= 0 && token < config.vocab_size, "token id outside the vocabulary");
  }
  TANDEM_CHECK(sequence.adapter >= -1 && sequence.adapter < std::ssize(adapters_),
               "unknown LoRA adapter index");
}

void ModelRunner::forward(std::span<const SequenceInput> batch, std::vector<float>& logits,
                          const RowLogitsSink& row_logits) {
  const std::span<const float> computed = forward(batch, row_logits);
  logits.assign(computed.begin(), computed.end());
}

std::span<const float> ModelRunner::forward(std::span<const SequenceInput> batch,
                                            const RowLogitsSink& row_logits) {
  const float* computed = compute(batch, host_logits_);
  const auto count = batch.size() * static_cast<size_t>(model_.config().vocab_size);
  std::span<const float> logits;
  if (computed == nullptr || backend_.hostAccessible()) {
    host_logits_.resize(count);
    logits = host_logits_;
  } else {
    const std::span<float> pinned = pinned_logits_.take(count);
    backend_.copyToHost(pinned.data(), computed, count * sizeof(float));
    logits = pinned;
  }
  if (row_logits) computeRowLogits(batch, row_logits);
  return logits;
}

void ModelRunner::computeRowLogits(std::span<const SequenceInput> batch,
                                   const RowLogitsSink& sink) {
  const ModelConfig& config = model_.config();
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  const auto eps = static_cast<float>(config.rms_norm_eps);
  // Rows per pass: 16 MB of logits at most (at least one row).
  const int64_t per_pass = std::max<int64_t>(1, (int64_t{4} << 20) / vocab);
  kernels::Backend& b = backend_;
  // The rows asked for, as runs of one sequence's consecutive rows: a run's
  // sequence, its first row within the sequence and in the flattened
  // batch, and its length.
  struct Run {
    size_t sequence;
    int64_t first, row, count;
  };
  std::vector<Run> runs;
  int64_t first_row = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const auto num_new = static_cast<int64_t>(batch[s].tokens.size());
    const int64_t wanted = std::min(batch[s].num_row_logits, num_new);
    if (wanted > 0) runs.push_back({s, 0, first_row, wanted});
    first_row += num_new;
  }
  // Each pass takes up to per_pass rows of several sequences: the final
  // norm of each run into consecutive rows, then one LM-head matmul for all
  // (the weights read once per pass, not once per sequence), as issueStep
  // applies them to the last rows; normed_ is free once the pass has run.
  size_t next = 0;
  while (next < runs.size()) {
    std::vector<Run> pass;
    int64_t count = 0;
    while (next < runs.size() && count < per_pass) {
      Run& run = runs[next];
      const int64_t take = std::min(run.count, per_pass - count);
      pass.push_back({run.sequence, run.first, run.row, take});
      b.rmsNorm(hidden_.data() + run.row * hidden, weights_.norm, take, hidden, eps,
                normed_.data() + count * hidden);
      count += take;
      run.first += take;
      run.row += take;
      run.count -= take;
      if (run.count == 0) ++next;
    }
    float* out = nullptr;
    host_row_logits_.resize(static_cast<size_t>(count * vocab));
    if (b.hostAccessible()) {
      out = host_row_logits_.data();
    } else {
      row_logits_.grow(static_cast<size_t>(per_pass * vocab));
      out = row_logits_.data();
    }
    b.matmul(normed_.data(), count, hidden, weights_.lm_head, out);
    finishLogits(out, count * vocab);
    if (!b.hostAccessible()) {
      b.copyToHost(host_row_logits_.data(), out,
                   static_cast<size_t>(count * vocab) * sizeof(float));
    }
    int64_t offset = 0;
    for (const Run& run : pass) {
      sink(run.sequence, run.first, run.count,
           std::span<const float>(host_row_logits_)
               .subspan(static_cast<size_t>(offset * vocab),
                        static_cast<size_t>(run.count * vocab)));
      offset += run.count;
    }
  }
}

void ModelRunner::forwardArgmax(std::span<const SequenceInput> batch,
                                std::vector<TokenId>& tokens) {
  const float* computed = compute(batch, host_logits_);
  tokens.resize(batch.size());
  if (computed == nullptr) return;
  backend_.argmaxRows(computed, static_cast<int64_t>(batch.size()), model_.config().vocab_size,
                      tokens.data());
}

const float* ModelRunner::compute(std::span<const SequenceInput> batch,
                                  std::vector<float>& host_logits) {
  const auto num_sequences = static_cast<int64_t>(batch.size());

  // Flatten the batch: rows are the new tokens of every sequence, in order.
  token_ids_.clear();
  positions_.clear();
  attention_sequences_.clear();
  lora_runs_.clear();
  for (const SequenceInput& sequence : batch) {
    checkInput(sequence);
    if (sequence.adapter >= 0) {
      const auto first_row = static_cast<int64_t>(token_ids_.size());
      const auto rows = static_cast<int64_t>(sequence.tokens.size());
      if (!lora_runs_.empty() && lora_runs_.back().adapter == sequence.adapter &&
          lora_runs_.back().first_row + lora_runs_.back().rows == first_row) {
        lora_runs_.back().rows += rows;
      } else {
        lora_runs_.push_back({first_row, rows, sequence.adapter});
      }
    }
    kernels::AttentionSequence entry;
    entry.block_table = sequence.block_table.data();
    entry.num_blocks = static_cast<int32_t>(sequence.block_table.size());
    entry.first_row = static_cast<int64_t>(token_ids_.size());
    entry.num_rows = static_cast<int64_t>(sequence.tokens.size());
    entry.first_position = sequence.start_position;
    attention_sequences_.push_back(entry);
    for (size_t i = 0; i < sequence.tokens.size(); ++i) {
      token_ids_.push_back(sequence.tokens[i]);
      positions_.push_back(static_cast<int32_t>(sequence.start_position + static_cast<int64_t>(i)));
    }
  }
  const auto real_rows = static_cast<int64_t>(token_ids_.size());
  if (real_rows == 0) return nullptr;

  // A decode batch (one new token per sequence) is padded to the backend's
  // bucket so that one recorded step serves every batch of that size: padded
  // rows belong to no sequence (nothing is written to the cache for them and
  // attention skips them) and padded sequences have no rows. Kernels are
  // row-independent, so the real rows' results are unchanged by padding.
  const bool decode = real_rows == num_sequences;
  // A recording holds one batch's kernels: never one with LoRA runs.
  const int64_t bucket =
      decode && record_decode_ && lora_runs_.empty() ? backend_.decodeBucket(num_sequences) : 0;
  for (int64_t pad = num_sequences; pad < bucket; ++pad) {
    kernels::AttentionSequence empty;
    empty.first_row = pad + 1;  // its "last row" (first_row - 1) is a padded row
    attention_sequences_.push_back(empty);
    token_ids_.push_back(0);
    positions_.push_back(0);
  }
  const auto rows = static_cast<int64_t>(token_ids_.size());
  const auto padded_sequences = static_cast<int64_t>(attention_sequences_.size());

  kernels::BatchLayout layout_of_batch;
  layout_of_batch.token_ids = token_ids_.data();
  layout_of_batch.positions = positions_.data();
  layout_of_batch.rows = rows;
  layout_of_batch.sequences = attention_sequences_.data();
  layout_of_batch.num_sequences = padded_sequences;
  backend_.beginBatch(layout_of_batch);
  growScratch(rows, padded_sequences);

  // On a host-accessible backend the last matmul writes the logits in place.
  kernels::Backend& b = backend_;
  float* logits_out = logits_.data();
  if (b.hostAccessible()) {
    host_logits.resize(static_cast<size_t>(padded_sequences * model_.config().vocab_size));
    logits_out = host_logits.data();
  }
  if (bucket > 0) {
    bool completed = false;
    try {
      if (!b.replayStep(recording_owner_)) issueStep(rows, padded_sequences, logits_out);
      completed = true;
      b.endStep(true);
    } catch (...) {
      if (!completed) b.endStep(false);
      throw;
    }
  } else {
    issueStep(rows, padded_sequences, logits_out);
  }
  return logits_out;
}

void ModelRunner::growScratch(int64_t rows, int64_t sequences) {
  const ModelConfig& config = model_.config();
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = config.num_attention_heads * config.head_dim;
  const int64_t kv_width = config.num_key_value_heads * config.head_dim;
  const int64_t inter = std::max(
      {config.intermediate_size, config.moe_intermediate_size, config.sharedExpertWidth()});
  hidden_.grow(rows * hidden);
  normed_.grow(rows * hidden);
  q_.grow(rows * q_width);
  k_.grow(rows * kv_width);
  v_.grow(rows * kv_width);
  attn_.grow(rows * q_width);
  proj_.grow(rows * hidden);
  gate_.grow(rows * inter);
  up_.grow(rows * inter);
  last_.grow(sequences * hidden);
  if (!stacked_.empty() || interleaved_experts_) {
    fused_.grow(rows * std::max(q_width + 2 * kv_width, 2 * inter));
  }
  if (!backend_.hostAccessible()) logits_.grow(sequences * config.vocab_size);
  if (config.num_experts > 0) {
    router_logits_.grow(rows * config.num_experts);
    expert_in_.grow(rows * hidden);
    expert_out_.grow(rows * hidden);
    expert_sum_.grow(rows * hidden);
  }
  if (!adapters_.empty()) {
    lora_down_.grow(rows * max_lora_rank_);
    lora_delta_.grow(rows * std::max({q_width, hidden, inter}));
  }
}

void ModelRunner::issueStep(int64_t rows, int64_t sequences, float* logits) {
  const ModelConfig& config = model_.config();
  const int64_t hidden = config.hidden_size;
  const int64_t head_dim = config.head_dim;
  const int64_t num_heads = config.num_attention_heads;
  const int64_t num_kv_heads = config.num_key_value_heads;
  const int64_t q_width = num_heads * head_dim;
  const int64_t kv_width = num_kv_heads * head_dim;
  const int64_t inter = config.intermediate_size;
  const auto eps = static_cast<float>(config.rms_norm_eps);

  kernels::Backend& b = backend_;
  const kernels::KvCacheLayout layout = cache_.layout();
  b.embedding(weights_.embed_tokens, hidden_.data());
  if (embedding_scale_ != 0.0f) scaleEmbeddings(rows);

  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const ResidentLayer& lw = weights_.layers[layer];
    const float* inv_freq = lw.local_rope ? local_inv_freq_.data() : inv_freq_.data();
    const kernels::RopeVariant& rope_variant = lw.local_rope ? local_rope_variant_ : rope_variant_;

    // Attention block (OLMo 2: on the residual stream as it is).
    const float* attention_in = hidden_.data();
    if (!config.olmo2) {
      b.rmsNorm(hidden_.data(), lw.input_layernorm, rows, hidden, eps, normed_.data());
      attention_in = normed_.data();
    }
    // With LoRA runs, fused steps are taken apart so the deltas go in
    // between (the same bits for the other rows).
    const bool lora = !lora_runs_.empty();
    if (lw.qkv_rope && !lora) {
      kernels::Backend::QkvRope qkv;
      qkv.q = q_.data();
      qkv.k = k_.data();
      qkv.v = v_.data();
      qkv.num_heads = num_heads;
      qkv.num_kv_heads = num_kv_heads;
      qkv.head_dim = head_dim;
      qkv.q_bias = lw.q_bias;
      qkv.k_bias = lw.k_bias;
      qkv.v_bias = lw.v_bias;
      qkv.inv_freq = inv_freq;
      qkv.layer = static_cast<int32_t>(layer);
      b.matmulQkvRope(attention_in, rows, hidden, lw.qkv_proj, qkv, layout, fused_.data());
    } else {
      if (lw.fused) {
        kernels::Backend::SplitOutputs qkv;
        qkv.parts[0] = q_.data();
        qkv.parts[1] = k_.data();
        qkv.parts[2] = v_.data();
        qkv.widths[0] = q_width;
        qkv.widths[1] = kv_width;
        qkv.widths[2] = kv_width;
        qkv.count = 3;
        b.matmulSplit(attention_in, rows, hidden, lw.qkv_proj, qkv, fused_.data());
      } else {
        b.matmul(attention_in, rows, hidden, lw.q_proj, q_.data());
        b.matmul(attention_in, rows, hidden, lw.k_proj, k_.data());
        b.matmul(attention_in, rows, hidden, lw.v_proj, v_.data());
      }
      if (lora) {
        addLoraDeltas(layer, kLoraQ, attention_in, hidden, q_.data(), q_width);
        addLoraDeltas(layer, kLoraK, attention_in, hidden, k_.data(), kv_width);
        addLoraDeltas(layer, kLoraV, attention_in, hidden, v_.data(), kv_width);
      }
      if (lw.q_bias != nullptr) b.addBias(q_.data(), lw.q_bias, rows, q_width);
      if (lw.k_bias != nullptr) b.addBias(k_.data(), lw.k_bias, rows, kv_width);
      if (lw.v_bias != nullptr) b.addBias(v_.data(), lw.v_bias, rows, kv_width);
      if (lw.q_norm != nullptr && config.fullQkNorm()) {
        // Across all heads of a row at once.
        b.rmsNorm(q_.data(), lw.q_norm, rows, q_width, eps, q_.data());
        b.rmsNorm(k_.data(), lw.k_norm, rows, kv_width, eps, k_.data());
      } else if (lw.q_norm != nullptr) {
        b.rmsNorm(q_.data(), lw.q_norm, rows * num_heads, head_dim, eps, q_.data());
        b.rmsNorm(k_.data(), lw.k_norm, rows * num_kv_heads, head_dim, eps, k_.data());
      }
      if (!lw.rope) {
        // SmolLM3's NoPE layers: q and k as projected.
      } else if (rope_variant == kernels::RopeVariant{}) {
        b.applyRope(q_.data(), num_heads, head_dim, inv_freq);
        b.applyRope(k_.data(), num_kv_heads, head_dim, inv_freq);
      } else {
        b.applyRopeWith(q_.data(), num_heads, head_dim, inv_freq, rope_variant);
        b.applyRopeWith(k_.data(), num_kv_heads, head_dim, inv_freq, rope_variant);
      }
      b.writeKv(layout, static_cast<int32_t>(layer), k_.data(), v_.data());
    }
    if (scale_queries_) scaleQueries(rows);
    if (attention_variant_) {
      kernels::Backend::AttentionVariant variant;
      variant.window = lw.sliding ? config.sliding_window : 0;
      variant.softcap = static_cast<float>(config.attn_logit_softcapping);
      variant.sinks = lw.sinks;
      b.pagedAttentionWith(layout, static_cast<int32_t>(layer), q_.data(), num_heads,
                           attention_scale_, variant, attn_.data());
    } else {
      b.pagedAttention(layout, static_cast<int32_t>(layer), q_.data(), num_heads, attention_scale_,
                       attn_.data());
    }
    if (config.sandwichNorms()) {
      // Sandwich norms: the attention's output is normalized, then added;
      // the MLP's input (Gemma's and GLM-4's; OLMo 2's is the residual
      // stream as it is) and output likewise.
      b.matmul(attn_.data(), rows, q_width, lw.o_proj, proj_.data());
      if (lora) addLoraDeltas(layer, kLoraO, attn_.data(), q_width, proj_.data(), hidden);
      b.rmsNorm(proj_.data(), lw.post_attention_layernorm, rows, hidden, eps, proj_.data());
      b.addInPlace(hidden_.data(), proj_.data(), rows * hidden);
      const float* mlp_in = hidden_.data();
      if (config.preFeedforwardNorm()) {
        b.rmsNorm(hidden_.data(), lw.pre_feedforward_layernorm, rows, hidden, eps, normed_.data());
        mlp_in = normed_.data();
      }
      mlp(lw.mlp, mlp_in, rows, inter, proj_.data(), false, lora ? layer : -1);
      b.rmsNorm(proj_.data(), lw.post_feedforward_layernorm, rows, hidden, eps, proj_.data());
      b.addInPlace(hidden_.data(), proj_.data(), rows * hidden);
      continue;
    }
    if (config.granite) {
      b.matmul(attn_.data(), rows, q_width, lw.o_proj, proj_.data());
      if (lora) addLoraDeltas(layer, kLoraO, attn_.data(), q_width, proj_.data(), hidden);
      addScaledResidual(rows);
    } else if (lw.o_bias != nullptr) {
      // GPT-OSS: o_proj's bias, then the residual add.
      b.matmul(attn_.data(), rows, q_width, lw.o_proj, proj_.data());
      if (lora) addLoraDeltas(layer, kLoraO, attn_.data(), q_width, proj_.data(), hidden);
      b.addBias(proj_.data(), lw.o_bias, rows, hidden);
      b.addInPlace(hidden_.data(), proj_.data(), rows * hidden);
    } else if (lw.fused && !lora) {
      b.matmulAdd(attn_.data(), rows, q_width, lw.o_proj, hidden_.data(), proj_.data());
    } else {
      b.matmul(attn_.data(), rows, q_width, lw.o_proj, proj_.data());
      if (lora) addLoraDeltas(layer, kLoraO, attn_.data(), q_width, proj_.data(), hidden);
      b.addInPlace(hidden_.data(), proj_.data(), rows * hidden);
    }

    // MLP block.
    b.rmsNorm(hidden_.data(), lw.post_attention_layernorm, rows, hidden, eps, normed_.data());
    if (!lw.experts.empty()) {
      mixture(lw, rows);  // Granite MoE's residual scale is applied there
    } else if (config.granite) {
      mlp(lw.mlp, normed_.data(), rows, inter, proj_.data(), false, lora ? layer : -1);
      addScaledResidual(rows);
    } else {
      mlp(lw.mlp, normed_.data(), rows, inter, hidden_.data(), true, lora ? layer : -1);
    }
  }

  // Only each sequence's last new token needs logits.
  b.gatherLastRows(hidden_.data(), hidden, last_.data());
  b.rmsNorm(last_.data(), weights_.norm, sequences, hidden, eps, last_.data());
  b.matmul(last_.data(), sequences, hidden, weights_.lm_head, logits);
  finishLogits(logits, sequences * config.vocab_size);
}

void ModelRunner::finishLogits(float* logits, int64_t n) const {
  // Host memory: the constructor refuses other backends for Granite and
  // Gemma. Each step rounded to fp32, as transformers' logits / scaling,
  // and logits / cap, tanh, * cap.
  const ModelConfig& config = model_.config();
  if (config.granite) {
    const auto scaling = static_cast<float>(config.logits_scaling);
    for (int64_t i = 0; i < n; ++i) logits[i] /= scaling;
  }
  const auto cap = static_cast<float>(config.final_logit_softcapping);
  if (cap == 0.0f) return;
  for (int64_t i = 0; i < n; ++i) logits[i] = std::tanh(logits[i] / cap) * cap;
}

void ModelRunner::addScaledResidual(int64_t rows) {
  // Host memory (the constructor refuses other backends for Granite):
  // transformers' residual + h * residual_multiplier, in fp32.
  const int64_t n = rows * model_.config().hidden_size;
  const auto multiplier = static_cast<float>(model_.config().residual_multiplier);
  float* h = proj_.data();
  for (int64_t i = 0; i < n; ++i) h[i] *= multiplier;
  backend_.addInPlace(hidden_.data(), proj_.data(), n);
}

void ModelRunner::scaleQueries(int64_t rows) {
  // transformers: the rotated queries times the scale (in the queries'
  // dtype, f32 here); K is not scaled.
  const ModelConfig& config = model_.config();
  const int64_t width = config.num_attention_heads * config.head_dim;
  float* q = q_.data();
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = config.queryScale(positions_[static_cast<size_t>(r)]);
    if (scale == 1.0f) continue;
    for (int64_t i = 0; i < width; ++i) q[r * width + i] *= scale;
  }
}

void ModelRunner::scaleEmbeddings(int64_t rows) {
  // Host memory (the constructor refuses other backends for Gemma): the
  // product rounded to the table's dtype, as transformers' bf16 multiply.
  const int64_t n = rows * model_.config().hidden_size;
  float* x = hidden_.data();
  for (int64_t i = 0; i < n; ++i) x[i] *= embedding_scale_;
  const DType dtype = model_.weights().embed_tokens.dtype;
  if (dtype == DType::kF32) return;
  thread_local std::vector<uint16_t> rounded;
  const ScratchTrim trim(rounded);  // a long prompt's rows are not kept
  rounded.resize(static_cast<size_t>(n));
  convertFromF32(dtype, x, rounded.data(), static_cast<size_t>(n));
  convertToF32(dtype, rounded.data(), x, static_cast<size_t>(n));
}

void ModelRunner::mlp(const ResidentMlp& weights, const float* x, int64_t rows, int64_t inter,
                      float* out, bool accumulate, int64_t lora_layer) {
  const int64_t hidden = model_.config().hidden_size;
  const bool lora = lora_layer >= 0;
  kernels::Backend& b = backend_;
  if (weights.fused && !lora) {
    b.matmulSiluMul(x, rows, hidden, weights.gate_up_proj, gate_.data(), fused_.data(), up_.data());
    if (accumulate) {
      b.matmulAdd(gate_.data(), rows, inter, weights.down_proj, out, proj_.data());
    } else {
      b.matmul(gate_.data(), rows, inter, weights.down_proj, out);
    }
    return;
  }
  if (weights.fused) {
    // matmulSiluMul's steps, in the kPlain layout addAdapter asks for.
    b.matmul(x, rows, hidden, weights.gate_up_proj, fused_.data());
    b.copyColumns(fused_.data(), rows, 2 * inter, 0, inter, gate_.data());
    b.copyColumns(fused_.data(), rows, 2 * inter, inter, inter, up_.data());
  } else {
    b.matmul(x, rows, hidden, weights.gate_proj, gate_.data());
    b.matmul(x, rows, hidden, weights.up_proj, up_.data());
  }
  if (lora) {
    addLoraDeltas(lora_layer, kLoraGate, x, hidden, gate_.data(), inter);
    addLoraDeltas(lora_layer, kLoraUp, x, hidden, up_.data(), inter);
  }
  if (model_.config().gemma) {
    b.geluTanhMul(gate_.data(), up_.data(), gate_.data(), rows * inter);
  } else {
    b.siluMul(gate_.data(), up_.data(), gate_.data(), rows * inter);
  }
  float* down = accumulate ? proj_.data() : out;
  b.matmul(gate_.data(), rows, inter, weights.down_proj, down);
  if (lora) addLoraDeltas(lora_layer, kLoraDown, gate_.data(), inter, down, hidden);
  if (accumulate) b.addInPlace(out, proj_.data(), rows * hidden);
}

void ModelRunner::gptOssExpert(const ResidentMlp& expert, int64_t rows) {
  const ModelConfig& config = model_.config();
  const int64_t hidden = config.hidden_size;
  const int64_t width = config.moe_intermediate_size;
  kernels::Backend& b = backend_;
  if (expert.gate_up_interleaved.data != nullptr) {
    // Gate the even outputs, up the odd ones (host memory: mixtures run on
    // host-accessible backends only).
    b.matmul(expert_in_.data(), rows, hidden, expert.gate_up_interleaved, fused_.data());
    b.synchronize();
    const float* both = fused_.data();
    float* gate = gate_.data();
    float* up = up_.data();
    for (int64_t i = 0; i < rows * width; ++i) {
      gate[i] = both[2 * i];
      up[i] = both[2 * i + 1];
    }
  } else {
    b.matmul(expert_in_.data(), rows, hidden, expert.gate_proj, gate_.data());
    b.matmul(expert_in_.data(), rows, hidden, expert.up_proj, up_.data());
  }
  b.addBias(gate_.data(), expert.gate_bias, rows, width);
  b.addBias(up_.data(), expert.up_bias, rows, width);
  // transformers' GptOssExperts: g = min(gate, limit), u = clamp(up,
  // -limit, limit), (u + 1) * g * sigmoid(1.702 g).
  constexpr float kAlpha = 1.702f;
  b.clampedSwiglu(gate_.data(), up_.data(), gate_.data(), rows * width, kAlpha,
                  static_cast<float>(config.swiglu_limit));
  b.matmul(gate_.data(), rows, width, expert.down_proj, expert_out_.data());
  b.addBias(expert_out_.data(), expert.down_bias, rows, hidden);
}

void ModelRunner::mixture(const ResidentLayer& layer, int64_t rows) {
  const ModelConfig& config = model_.config();
  const int64_t hidden = config.hidden_size;
  kernels::Backend& b = backend_;
  // Host-accessible memory (the constructor refuses other backends): the
  // routing, gathering and weighted sums run here, between kernels.
  b.matmul(normed_.data(), rows, hidden, layer.router, router_logits_.data());
  if (layer.router_logit_bias != nullptr) {
    b.addBias(router_logits_.data(), layer.router_logit_bias, rows, config.num_experts);
  }
  b.synchronize();
  Routing routing;
  routing.num_experts = config.num_experts;
  routing.experts_per_token = config.num_experts_per_tok;
  routing.normalize = config.norm_topk_prob;
  routing.sigmoid = config.sigmoid_routing;
  routing.correction_bias = layer.router_bias;
  routing.groups = config.n_group;
  routing.groups_chosen = config.topk_group;
  routing.scale = config.routed_scaling_factor;
  assignment_.route(router_logits_.data(), rows, routing);
  float* sum = expert_sum_.data();
  std::fill_n(sum, rows * hidden, 0.0f);
  const std::vector<int64_t>& routed_rows = assignment_.rows();
  const std::vector<float>& weights = assignment_.weights();
  const auto row_bytes = static_cast<size_t>(hidden) * sizeof(float);
  for (int64_t e = 0; e < config.num_experts; ++e) {
    const int64_t first = assignment_.offset(e);
    const int64_t count = assignment_.offset(e + 1) - first;
    if (count == 0) continue;
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(expert_in_.data() + i * hidden,
                  normed_.data() + routed_rows[static_cast<size_t>(first + i)] * hidden, row_bytes);
    }
    if (config.gptOss()) {
      gptOssExpert(layer.experts[static_cast<size_t>(e)], count);
    } else {
      mlp(layer.experts[static_cast<size_t>(e)], expert_in_.data(), count,
          config.moe_intermediate_size, expert_out_.data(), false, -1);
    }
    b.synchronize();
    // A product then a sum, each rounded (this library is built with
    // -ffp-contract=off: never one fused multiply-add).
    for (int64_t i = 0; i < count; ++i) {
      const float weight = weights[static_cast<size_t>(first + i)];
      float* to = sum + routed_rows[static_cast<size_t>(first + i)] * hidden;
      const float* from = expert_out_.data() + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) to[c] += weight * from[c];
    }
  }
  if (layer.shared_expert.down_proj.data != nullptr) {
    // transformers: the routed experts' sum + the shared experts' output
    // (Qwen2-MoE's times sigmoid(shared_expert_gate x), the product rounded
    // to f32), then the residual add.
    mlp(layer.shared_expert, normed_.data(), rows, config.sharedExpertWidth(), expert_out_.data(),
        false, -1);
    float* gate = nullptr;
    if (layer.shared_expert_gate.data != nullptr) {
      gate = router_logits_.data();  // the routing is done with the router's logits
      b.matmul(normed_.data(), rows, hidden, layer.shared_expert_gate, gate);
    }
    b.synchronize();
    const float* from = expert_out_.data();
    for (int64_t r = 0; r < rows; ++r) {
      float* to = sum + r * hidden;
      const float* row = from + r * hidden;
      if (gate == nullptr) {
        for (int64_t c = 0; c < hidden; ++c) to[c] += row[c];
        continue;
      }
      const auto weight = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(gate[r]))));
      for (int64_t c = 0; c < hidden; ++c) to[c] += weight * row[c];
    }
  }
  if (config.granite) {
    // Granite MoE: residual + moe(x) * residual_multiplier, in fp32.
    const auto multiplier = static_cast<float>(config.residual_multiplier);
    for (int64_t i = 0; i < rows * hidden; ++i) sum[i] *= multiplier;
  }
  b.addInPlace(hidden_.data(), sum, rows * hidden);
}

}  // namespace tandem::engine
