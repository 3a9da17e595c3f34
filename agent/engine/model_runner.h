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
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
#include "common/tokenizer.h"

namespace tandem::engine {

struct SequenceInput {
  std::span<const TokenId> tokens;       // the new tokens (at least one)
  int64_t start_position = 0;            // position of tokens[0]
  std::span<const BlockId> block_table;  // blocks of positions 0, block_size, ...
};

class ModelRunner {
 public:
  // The cache geometry must match the model (layers, KV heads, head size);
  // throws tandem::Error naming the mismatch.
  ModelRunner(const Model& model, KvCache& cache);

  // logits receives num_sequences x vocab_size values. Inputs are checked
  // (token ids below vocab_size, block tables long enough, positions within
  // max_position_embeddings); a violation is a caller bug and aborts.
  void forward(std::span<const SequenceInput> batch, std::vector<float>& logits);

  const Model& model() const { return model_; }
  KvCache& cache() { return cache_; }

 private:
  void checkInput(const SequenceInput& sequence) const;

  const Model& model_;
  KvCache& cache_;
  std::vector<float> inv_freq_;
  float attention_scale_ = 1.0f;
  // Scratch, grown on demand and reused across calls.
  std::vector<float> hidden_, normed_, q_, k_, v_, attn_, proj_, gate_, up_, last_;
  std::vector<int32_t> token_ids_, positions_;
  std::vector<kernels::AttentionSequence> attention_sequences_;
};

}  // namespace tandem::engine
