// A loaded model: configuration, weights (memory-mapped, in their file dtype)
// and the tokenizer directory it came from.
//
// Model::load reads a Hugging Face model directory: config.json, then
// model.safetensors or the shards named by model.safetensors.index.json.
// Every expected tensor must be present with the dtype family F32/BF16/F16
// (or, in an fp8 checkpoint, F8_E4M3 projection matrices with their scales:
// docs/quantization.md; in GPT-OSS's, MXFP4 experts, read as they lie) and the shape the config
// implies; extra tensors (e.g. rotary_emb.inv_freq) are ignored. Problems throw tandem::Error
// naming the file and tensor, e.g. "tensor model.layers.3.mlp.up_proj.weight missing from
// model.safetensors". Small vectors (norm weights, biases) are converted to fp32 at load; matrices
// stay mapped. A Model is immutable after load and safe to share across threads.
#pragma once

#include <array>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "agent/engine/model_config.h"
#include "agent/engine/safetensors.h"
#include "kernels/kernels.h"

namespace tandem::engine {

// One expert of a mixture layer: an MLP as a dense layer's. GPT-OSS's
// experts also have biases after each projection (empty elsewhere).
struct ExpertWeights {
  kernels::WeightView gate_proj, up_proj, down_proj;
  // GPT-OSS's MXFP4 experts: gate_up as published, gate and up rows
  // interleaved (gate_proj and up_proj are every other row of it), for one
  // matmul that reads each byte once. Unset elsewhere.
  kernels::WeightView gate_up_interleaved;
  std::vector<float> gate_bias, up_bias, down_bias;
};

// The names of a mixture layer's tensors in the per-expert form published
// checkpoints hold: Mixtral's block_sparse_moe.{gate, experts.<e>.w1
// (gate), w3 (up), w2 (down)}, Qwen3-MoE's and GLM-4.5's mlp.{gate,
// experts.<e>.gate_proj/up_proj/down_proj}, under model.layers.<layer>;
// GLM-4.5's also mlp.gate.e_score_correction_bias and
// mlp.shared_experts.gate_proj/up_proj/down_proj; Qwen2-MoE's
// mlp.shared_expert.gate_proj/up_proj/down_proj and mlp.shared_expert_gate.
class ExpertTensorNames {
 public:
  ExpertTensorNames(const ModelConfig& config, int64_t layer);
  const std::string& router() const { return router_; }
  std::string correctionBias() const { return block_ + "gate.e_score_correction_bias"; }
  // "gate_proj", "up_proj" or "down_proj" of the shared experts.
  std::string shared(const char* matrix) const {
    return block_ + (qwen2_moe_ ? "shared_expert." : "shared_experts.") + matrix + ".weight";
  }
  std::string sharedGate() const { return block_ + "shared_expert_gate.weight"; }
  std::string gate(int64_t expert) const { return name(expert, mixtral_ ? "w1" : "gate_proj"); }
  std::string up(int64_t expert) const { return name(expert, mixtral_ ? "w3" : "up_proj"); }
  std::string down(int64_t expert) const { return name(expert, mixtral_ ? "w2" : "down_proj"); }

 private:
  std::string name(int64_t expert, const char* matrix) const {
    return block_ + "experts." + std::to_string(expert) + "." + matrix + ".weight";
  }
  bool mixtral_;
  bool qwen2_moe_;
  std::string block_;
  std::string router_;
};

// The KV cache scales an fp8 cache accepts: the kernels multiply by 2^8 x a
// scale and divide by it, and both must stay finite and nonzero.
constexpr float kMinKvCacheScale = 1e-30f;
constexpr float kMaxKvCacheScale = 1e36f;

struct LayerWeights {
  kernels::WeightView q_proj, k_proj, v_proj, o_proj;
  // The dense MLP; unset (no data, no rows) in a mixture layer.
  kernels::WeightView gate_proj, up_proj, down_proj;
  // The seven projection matrices, in the order above.
  std::array<const kernels::WeightView*, 7> matrices() const {
    return {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj};
  }
  // A mixture layer's router (num_experts x hidden_size; Mixtral's
  // block_sparse_moe.gate, Qwen3-MoE's mlp.gate) and experts; unset and
  // empty in a dense layer.
  kernels::WeightView router;
  std::vector<ExpertWeights> experts;
  // Sigmoid routing (GLM-4.5): the router's e_score_correction_bias
  // (num_experts; empty: none), and the shared experts as one MLP
  // (ModelConfig::sharedExpertWidth() wide; unset without them).
  std::vector<float> router_bias;
  // GPT-OSS: the router's bias (mlp.router.bias, num_experts), added to its
  // logits; empty elsewhere.
  std::vector<float> router_logit_bias;
  ExpertWeights shared_expert;
  // Qwen2-MoE: the shared expert's gate (1 x hidden_size); unset elsewhere.
  kernels::WeightView shared_expert_gate;
  // The matrices one token's forward pass reads in this layer: the
  // projections, and in a mixture layer the router, the shared experts and
  // num_experts_per_tok experts' (taken as the first ones: experts are
  // equal in size).
  std::vector<const kernels::WeightView*> tokenMatrices(int64_t experts_per_token) const;
  // Llama's two norms: before attention, and (its name notwithstanding)
  // before the MLP. Gemma 3 (sandwich norms): post_attention_layernorm
  // normalizes the attention's output, pre_ and post_feedforward_layernorm
  // the MLP's input and output. Gemma's weights are stored here as 1 + w.
  // GLM-4's sandwich is loaded into the same places (model.cpp names its
  // tensors); OLMo 2 has no input_layernorm or pre_feedforward_layernorm.
  std::vector<float> input_layernorm, post_attention_layernorm;
  std::vector<float> pre_feedforward_layernorm, post_feedforward_layernorm;  // sandwiches only
  std::vector<float> q_bias, k_bias, v_bias;  // empty without attention bias
  // GPT-OSS: o_proj's bias (hidden_size) and the attention sinks
  // (self_attn.sinks, num_attention_heads logits); empty elsewhere.
  std::vector<float> o_bias, sinks;
  std::vector<float> q_norm, k_norm;  // head_dim each; empty without qk_norm
  // The K and V scales of an fp8 KV cache, when the checkpoint has them
  // (Model::kvCacheScales).
  std::optional<float> k_cache_scale, v_cache_scale;
};

struct ModelWeights {
  kernels::WeightView embed_tokens;  // vocab_size x hidden_size
  std::vector<LayerWeights> layers;
  std::vector<float> norm;
  kernels::WeightView lm_head;  // == embed_tokens when tie_word_embeddings
};

class Model {
 public:
  // hf_overrides: ModelConfig::fromFile's (vLLM's --hf-overrides).
  static std::unique_ptr<Model> load(const std::filesystem::path& dir,
                                     const std::string& hf_overrides = "");

  const std::filesystem::path& directory() const { return directory_; }
  const ModelConfig& config() const { return config_; }
  // ModelConfig::fitContext for the context the engine serves, before a
  // runner is built from this model.
  void fitContext(int64_t max_model_len) { config_.fitContext(max_model_len); }
  const ModelWeights& weights() const { return weights_; }
  // The dtype of the matrices (from the files; all matrices share it but
  // the F8_E4M3 ones of a quantized model, whose embedding table has it).
  DType weightDType() const { return weight_dtype_; }
  // How many matrices are F8_E4M3 (each with its scales).
  size_t fp8Matrices() const { return scales_.size(); }
  // The checkpoint's fp8 KV cache scales, as kernels::KvCacheLayout::scales
  // wants them (layer l's K scale at 2l, V at 2l + 1), 1 for a layer without
  // them; empty when no layer has any. Read, as vLLM does, from
  // model.layers.<l>.self_attn.{k_scale, v_scale}, else
  // self_attn.{k_proj, v_proj}.output_scale, else the one self_attn.kv_scale.
  // Throws tandem::Error naming the first tensor that cannot be used (shape,
  // dtype, a value outside kMinKvCacheScale..kMaxKvCacheScale); such a model
  // still loads, for a bf16 or f32 cache.
  std::vector<float> kvCacheScales() const;
  // Total bytes of all mapped tensors that the model uses.
  size_t weightBytes() const { return weight_bytes_; }
  // What load() checked for NaN and infinities (every float tensor it
  // read; a model holding one is refused, naming the tensor and the
  // element), and the seconds it took.
  size_t checkedBytes() const { return checked_bytes_; }
  double checkSeconds() const { return check_seconds_; }
  // The weights' content, 16 hex digits: xxh3-64 over each weight file's
  // xxh3-64 in load order (so two models differ whenever a byte of their
  // files does, whatever their directories are called). Computed at the
  // first call, the files in parallel; it reads every byte of them.
  const std::string& weightsDigest() const;
  // Drops the mapped pages of `w` from memory (SafetensorsFile::dropPages)
  // once a backend holds its own copy; reads stay correct. Returns the bytes
  // dropped (0 for weights that are not mapped from a file).
  size_t dropMappedPages(const kernels::WeightView& w) const;

 private:
  Model() = default;
  std::filesystem::path directory_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  ModelWeights weights_;
  DType weight_dtype_ = DType::kBF16;
  size_t weight_bytes_ = 0;
  size_t checked_bytes_ = 0;
  double check_seconds_ = 0;
  // Why the checkpoint's KV cache scales cannot be used ("" when they can).
  std::string kv_cache_scales_error_;
  // The scales of fp8 matrices (WeightView::scales point into them).
  std::vector<std::vector<float>> scales_;
  // Matrices made at load, in the layout the kernels read (GPT-OSS's
  // experts as transformers holds them: transposed, de-interleaved); views point
  // into them.
  std::vector<std::vector<uint8_t>> converted_;
  mutable std::once_flag digest_once_;
  mutable std::string weights_digest_;
};

}  // namespace tandem::engine
