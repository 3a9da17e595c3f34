#include "agent/engine/model_runner.h"

#include <cmath>
#include <string>

#include "common/check.h"
#include "common/status.h"

namespace tandem::engine {
namespace {

void grow(std::vector<float>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

void addBias(float* y, const std::vector<float>& bias, int64_t rows) {
  if (bias.empty()) return;
  const auto width = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < rows; ++r) kernels::addInPlace(y + r * width, bias.data(), width);
}

}  // namespace

ModelRunner::ModelRunner(const Model& model, KvCache& cache) : model_(model), cache_(cache) {
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
  inv_freq_ = ropeInverseFrequencies(config);
  attention_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)));
}

void ModelRunner::checkInput(const SequenceInput& sequence) const {
  const ModelConfig& config = model_.config();
  TANDEM_CHECK(!sequence.tokens.empty(), "a sequence in a forward batch has no new tokens");
  TANDEM_CHECK(sequence.start_position >= 0, "negative start position");
  const int64_t end = sequence.start_position + static_cast<int64_t>(sequence.tokens.size());
  TANDEM_CHECK(end <= config.max_position_embeddings, "position beyond max_position_embeddings");
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
}

void ModelRunner::forward(std::span<const SequenceInput> batch, std::vector<float>& logits) {
  const ModelConfig& config = model_.config();
  const ModelWeights& weights = model_.weights();
  const int64_t hidden = config.hidden_size;
  const int64_t head_dim = config.head_dim;
  const int64_t num_heads = config.num_attention_heads;
  const int64_t num_kv_heads = config.num_key_value_heads;
  const int64_t q_width = num_heads * head_dim;
  const int64_t kv_width = num_kv_heads * head_dim;
  const int64_t inter = config.intermediate_size;
  const auto eps = static_cast<float>(config.rms_norm_eps);
  const auto num_sequences = static_cast<int64_t>(batch.size());

  // Flatten the batch: rows are the new tokens of every sequence, in order.
  token_ids_.clear();
  positions_.clear();
  attention_sequences_.clear();
  for (const SequenceInput& sequence : batch) {
    checkInput(sequence);
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
  const auto rows = static_cast<int64_t>(token_ids_.size());
  if (rows == 0) {
    logits.clear();
    return;
  }

  grow(hidden_, rows * hidden);
  grow(normed_, rows * hidden);
  grow(q_, rows * q_width);
  grow(k_, rows * kv_width);
  grow(v_, rows * kv_width);
  grow(attn_, rows * q_width);
  grow(proj_, rows * hidden);
  grow(gate_, rows * inter);
  grow(up_, rows * inter);

  kernels::KvCacheLayout layout = cache_.layout();
  kernels::embedding(weights.embed_tokens, token_ids_.data(), rows, hidden_.data());

  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const LayerWeights& lw = weights.layers[layer];

    // Attention block.
    kernels::rmsNorm(hidden_.data(), lw.input_layernorm.data(), rows, hidden, eps, normed_.data());
    kernels::matmul(normed_.data(), rows, hidden, lw.q_proj, q_.data());
    kernels::matmul(normed_.data(), rows, hidden, lw.k_proj, k_.data());
    kernels::matmul(normed_.data(), rows, hidden, lw.v_proj, v_.data());
    addBias(q_.data(), lw.q_bias, rows);
    addBias(k_.data(), lw.k_bias, rows);
    addBias(v_.data(), lw.v_bias, rows);
    if (!lw.q_norm.empty()) {
      kernels::rmsNorm(q_.data(), lw.q_norm.data(), rows * num_heads, head_dim, eps, q_.data());
      kernels::rmsNorm(k_.data(), lw.k_norm.data(), rows * num_kv_heads, head_dim, eps, k_.data());
    }
    kernels::applyRope(q_.data(), rows, num_heads, head_dim, positions_.data(), inv_freq_.data());
    kernels::applyRope(k_.data(), rows, num_kv_heads, head_dim, positions_.data(),
                       inv_freq_.data());
    kernels::writeKv(layout, static_cast<int32_t>(layer), k_.data(), v_.data(),
                     attention_sequences_.data(), num_sequences);
    kernels::pagedAttention(layout, static_cast<int32_t>(layer), q_.data(), num_heads,
                            attention_scale_, attention_sequences_.data(), num_sequences,
                            attn_.data());
    kernels::matmul(attn_.data(), rows, q_width, lw.o_proj, proj_.data());
    kernels::addInPlace(hidden_.data(), proj_.data(), rows * hidden);

    // MLP block.
    kernels::rmsNorm(hidden_.data(), lw.post_attention_layernorm.data(), rows, hidden, eps,
                     normed_.data());
    kernels::matmul(normed_.data(), rows, hidden, lw.gate_proj, gate_.data());
    kernels::matmul(normed_.data(), rows, hidden, lw.up_proj, up_.data());
    kernels::siluMul(gate_.data(), up_.data(), gate_.data(), rows * inter);
    kernels::matmul(gate_.data(), rows, inter, lw.down_proj, proj_.data());
    kernels::addInPlace(hidden_.data(), proj_.data(), rows * hidden);
  }

  // Only each sequence's last new token needs logits.
  grow(last_, num_sequences * hidden);
  for (int64_t s = 0; s < num_sequences; ++s) {
    const kernels::AttentionSequence& entry = attention_sequences_[s];
    const float* row = hidden_.data() + (entry.first_row + entry.num_rows - 1) * hidden;
    std::copy(row, row + hidden, last_.begin() + s * hidden);
  }
  kernels::rmsNorm(last_.data(), weights.norm.data(), num_sequences, hidden, eps, last_.data());
  logits.resize(static_cast<size_t>(num_sequences * config.vocab_size));
  kernels::matmul(last_.data(), num_sequences, hidden, weights.lm_head, logits.data());
}

}  // namespace tandem::engine
