// The architecture of a Llama-family decoder, read from a Hugging Face config.json.
//
// Accepted architectures: LlamaForCausalLM, MistralForCausalLM,
// Ministral3ForCausalLM and Mistral3ForConditionalGeneration (its language
// model: docs/engine.md#mistral-small-3-and-ministral-3), Qwen2ForCausalLM,
// Qwen3ForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM
// (docs/engine.md#gemma-3), Phi3ForCausalLM (docs/engine.md#phi-3-and-phi-4),
// GraniteForCausalLM (docs/engine.md#granite), Olmo2ForCausalLM
// (docs/engine.md#olmo-2), Olmo3ForCausalLM (docs/engine.md#olmo-3),
// SmolLM3ForCausalLM (docs/engine.md#smollm3), and the mixtures of experts
// MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
// Glm4MoeForCausalLM, GptOssForCausalLM, GraniteMoeForCausalLM and
// OlmoeForCausalLM (docs/engine.md#mixture-of-experts,
// docs/engine.md#gpt-oss, docs/engine.md#olmoe).
// Missing optional fields take the defaults of the Hugging Face
// transformers class of that architecture.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"

namespace tandem::engine {

struct RopeScaling {
  // kLinear: every frequency divided by `factor` (Gemma 3's full-attention
  // layers). kLongRope (Phi-3, Phi-4): each frequency divided by its own
  // factor, short_factor's or long_factor's, and cos/sin multiplied by an
  // attention factor (short_mscale or long_mscale). kYarn (Qwen2.5's and
  // Qwen3's long contexts): frequencies blended between kept and divided
  // by `factor` over the pairs that turn between beta_fast and beta_slow
  // times within original_max_position_embeddings, and cos/sin multiplied
  // by attention_factor.
  enum class Type { kNone, kLlama3, kLinear, kLongRope, kYarn };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  std::vector<double> short_factor;
  std::vector<double> long_factor;
  double short_mscale = 1.0;
  double long_mscale = 1.0;
  // Which LongRoPE factors the engine computes with: the long ones when the
  // served context (max_model_len) exceeds original_max_position_embeddings,
  // as vLLM decides once at start (transformers switches per forward pass
  // on the sequence's length). ModelConfig::fitContext sets it; parsing
  // assumes max_model_len = max_position_embeddings.
  bool use_long = false;
  // YaRN's: rotations per original context that bound the blend, whether
  // its bounds are rounded outward to whole pairs, and the factor on
  // cos/sin (given, else from mscale and mscale_all_dim, else
  // 0.1 ln(factor) + 1).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;

  bool operator==(const RopeScaling&) const = default;
};

// The quantization_config of an fp8 checkpoint (docs/quantization.md): its
// F8_E4M3 matrices each come with float scales of one granularity, in the
// tensor named as the matrix with "weight" replaced by scaleName().
struct Fp8Quantization {
  enum class Granularity { kNone, kTensor, kChannel, kBlock };
  Granularity granularity = Granularity::kNone;
  std::string method;  // quant_method: "fp8" or "compressed-tensors"
  // kBlock: each scale covers block_rows x block_cols weights.
  int64_t block_rows = 0;
  int64_t block_cols = 0;

  // "weight_scale_inv" (fp8 with weight_block_size), else "weight_scale".
  const char* scaleName() const;
  // The scales' tensor of the matrix tensor `weight` (named "...weight").
  std::string scaleTensorOf(const std::string& weight) const;
  // The rows and columns of a rows x cols matrix one scale covers: all of
  // them (tensor), one row (channel), or a block.
  std::pair<int64_t, int64_t> scaleBlock(int64_t rows, int64_t cols) const;

  bool operator==(const Fp8Quantization&) const = default;
};

// "tensor", "channel" or "block".
const char* granularityName(Fp8Quantization::Granularity granularity);

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads when absent
  // The first rotary_dim of each head's values rotate, the rest pass as they
  // are: head_dim, or head_dim x partial_rotary_factor (Phi-3's field;
  // Phi-4-mini's 0.75).
  int64_t rotary_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  // The attention window (0: none), applied to the layers sliding_layers
  // marks (Gemma's every other or five in six, OLMo 3's three in four;
  // every layer of Mistral's, Mixtral's and Phi-3's when they set one). A backend that cannot apply
  // windows (CUDA) computes full attention instead, the same as the
  // window's only for sequences no longer than it: the engine caps
  // max_model_len at the window there, and refuses Gemma.
  int64_t sliding_window = 0;
  // Per layer, whether its attention is within sliding_window positions (a
  // query at p attends to p - sliding_window + 1 .. p); empty when no layer's
  // is.
  std::vector<bool> sliding_layers;
  // SmolLM3ForCausalLM: the layers that skip RoPE (NoPE: no_rope_layers'
  // zeros, else every no_rope_layer_interval-th); empty when every layer
  // rotates.
  std::vector<bool> nope_layers;
  bool nopeLayer(int64_t layer) const {
    return !nope_layers.empty() && nope_layers[static_cast<size_t>(layer)];
  }
  bool slidingLayer(int64_t layer) const {
    return !sliding_layers.empty() && sliding_layers[static_cast<size_t>(layer)];
  }
  // Whether the layer rotates with rope_local_base_freq, unscaled and
  // without an attention factor (localRopeInverseFrequencies): Gemma's and
  // OLMo 3's sliding layers. rope_scaling is the other layers' only.
  bool localRopeLayer(int64_t layer) const { return (gemma || olmo3) && slidingLayer(layer); }
  // Gemma 3's arithmetic, where it differs from Llama's: RMSNorm weights
  // are offsets from 1 (scale x * (1 + w)), the embedding is multiplied by
  // sqrt(hidden_size) (rounded to the table's dtype, the product too, as
  // transformers computes it), each attention and MLP output is normalized
  // again before its residual add (post_attention_layernorm, then
  // pre_feedforward_layernorm before the MLP and post_feedforward_layernorm
  // after it), the MLP's activation is GELU with the tanh approximation,
  // and sliding layers rotate with rope_local_base_freq, unscaled.
  // Gemma 2 also: no q/k norms, one rotary base for every layer, and
  // soft-capped attention scores and logits (tanh(x / cap) * cap; 0: none).
  bool gemma = false;
  double query_pre_attn_scalar = 0;  // scores scaled by its -1/2 power; 0: head_dim's
  double rope_local_base_freq = 10000.0;
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (always for Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen3)
  DType torch_dtype = DType::kBF16;
  // Mixture of experts (Mixtral, Qwen3-MoE); num_experts 0: a dense model.
  // A mixture layer's MLP is a router (num_experts x hidden_size) choosing
  // num_experts_per_tok of num_experts MLPs of moe_intermediate_size for
  // each token, weighted by the router's softmax over all experts,
  // renormalized over the chosen ones when norm_topk_prob. Layers in
  // mlp_only_layers, or whose index + 1 is not a multiple of
  // decoder_sparse_step, keep a dense MLP of intermediate_size (Qwen3-MoE).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6; DeepSeek-V3's routing):
  // the router's logits pass a sigmoid; the choice ranks sigmoid +
  // e_score_correction_bias (a per-layer vector of the checkpoint) within
  // the best topk_group of n_group expert groups; the weights are the
  // chosen sigmoids (renormalized when norm_topk_prob) times
  // routed_scaling_factor. n_shared_experts x moe_intermediate_size wide
  // shared experts (mlp.shared_experts, one MLP) see every token, their
  // output added to the routed ones'; the first first_k_dense_replace
  // layers are dense.
  bool sigmoid_routing = false;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  // Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen3-MoE's softmax
  // routing and dense layers, Qwen2's q/k/v biases (qkv_bias), and one
  // shared expert of shared_expert_intermediate_size (0: none) whose output
  // each token weighs by sigmoid(shared_expert_gate x) before it is added.
  bool qwen2Moe() const { return architecture == "Qwen2MoeForCausalLM"; }
  int64_t shared_expert_intermediate_size = 0;
  // The shared experts' MLP width (0: none): GLM-4.5's n_shared_experts x
  // moe_intermediate_size, Qwen2-MoE's shared_expert_intermediate_size.
  // GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b): every layer a mixture
  // of num_local_experts experts of intermediate_size, chosen by the
  // router's logits (a linear layer with a bias) and weighted by the
  // softmax over the chosen ones' logits (norm_topk_prob); an expert's
  // gate and up projections have biases, its activation is
  // (clamp(up, -swiglu_limit, swiglu_limit) + 1) x g x sigmoid(1.702 g) for
  // g = min(gate, swiglu_limit), and its down projection a bias too. The
  // attention has q/k/v and o_proj biases (attention_bias) and one sink
  // logit per head (self_attn.sinks: one more softmax term that weighs no
  // value); layer_types marks the sliding layers (every other one from the
  // first by default), all layers rotate alike (YaRN in the published
  // configs).
  bool gptOss() const { return architecture == "GptOssForCausalLM"; }
  // GraniteMoeForCausalLM (IBM Granite 3.0/3.1 MoE, 1B-A400M and 3B-A800M):
  // Granite's four scalars (granite is set too) with every layer a mixture
  // of num_local_experts experts of intermediate_size, weighted by the
  // softmax over the num_experts_per_tok largest router logits; its experts
  // are stacked (block_sparse_moe.input_linear: gate rows then up rows;
  // output_linear) and its router is block_sparse_moe.router.layer.
  bool graniteMoe() const { return architecture == "GraniteMoeForCausalLM"; }
  // OlmoeForCausalLM (AllenAI OLMoE-1B-7B): Llama's pre-norm layers with q
  // and k normalized across all their heads at once (as OLMo 2's,
  // fullQkNorm), every layer a mixture of num_experts experts of
  // intermediate_size weighted by the softmax over all router logits
  // (renormalized over the chosen ones only when norm_topk_prob, false by
  // default), Qwen3-MoE's tensor names.
  bool olmoe() const { return architecture == "OlmoeForCausalLM"; }
  double swiglu_limit = 7.0;
  int64_t sharedExpertWidth() const {
    return qwen2Moe() ? shared_expert_intermediate_size : n_shared_experts * moe_intermediate_size;
  }
  bool isMoeLayer(int64_t layer) const;
  std::vector<int64_t> eos_token_ids;  // from config.json "eos_token_id" (int or list)
  int64_t bos_token_id = -1;
  // No quantization (granularity kNone): every matrix is f32, bf16 or f16.
  // quant_method "mxfp4" (GPT-OSS's published checkpoints) is granularity
  // kNone too: its MXFP4 experts have no fp8 scales
  // (docs/quantization.md#mxfp4).
  Fp8Quantization quantization;
  bool mxfp4() const { return quantization.method == "mxfp4"; }
  bool quantized() const { return quantization.granularity != Fp8Quantization::Granularity::kNone; }

  // Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4): Llama's arithmetic with q/k/v
  // in one matrix (qkv_proj) and gate/up in one (gate_up_proj), partial
  // rotary dims and LongRoPE.
  bool phi3 = false;
  // GraniteForCausalLM (IBM Granite 3): Llama's arithmetic with four
  // scalars: the embedding times embedding_multiplier (the product in the
  // table's dtype), scores scaled by attention_multiplier instead of
  // head_dim^-1/2, each attention and MLP output times residual_multiplier
  // before its residual add, and the logits divided by logits_scaling.
  bool granite = false;
  double embedding_multiplier = 1.0;
  double attention_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double logits_scaling = 1.0;
  // Olmo2ForCausalLM (AllenAI OLMo 2): no norm before attention or the
  // MLP; their outputs are normalized (post_attention_layernorm,
  // post_feedforward_layernorm) before each residual add, and q and k are
  // normalized across all their heads at once (q_norm of num_heads x
  // head_dim weights) before RoPE.
  bool olmo2 = false;
  // q_norm and k_norm span all heads of q (of k) as one vector: OLMo 2's,
  // OLMo 3's and OLMoE's (qk_norm is set too).
  bool fullQkNorm() const { return olmo2 || olmoe(); }
  // Olmo3ForCausalLM (AllenAI OLMo 3): OLMo 2's arithmetic (olmo2 is set
  // too) with a window on the layers layer_types marks (Olmo3Config's
  // default: all but every 4th), which rotate unscaled (their
  // rope_local_base_freq is rope_theta): the published configs' YaRN
  // scales the full layers only, as OLMo-core trained them and vLLM runs
  // them.
  bool olmo3 = false;
  // GlmForCausalLM (GLM-4-9B-Chat) and Glm4ForCausalLM (GLM-4-0414,
  // GLM-Z1): Llama's arithmetic with q/k/v biases (no o_proj bias), gate
  // and up in one matrix (gate_up_proj), and the first rotary_dim values of
  // each head (partial_rotary_factor, GlmConfig's default 0.5) rotating as
  // neighbour pairs (2i, 2i + 1) instead of halves.
  bool glm = false;
  // Glm4MoeForCausalLM's attention is GLM's with halves instead of
  // neighbour pairs (partial_rotary_factor 0.5, rotate_half), q/k/v biases
  // when attention_bias, and per-head q/k norms when use_qk_norm; its MLPs
  // are separate gate/up/down, a mixture's as sigmoid_routing describes.
  bool glm4Moe() const { return architecture == "Glm4MoeForCausalLM"; }
  // Glm4ForCausalLM also normalizes the attention's and the MLP's outputs
  // before each residual add (post_self_attn_layernorm, post_mlp_layernorm),
  // besides the norms before them (input_layernorm, post_attention_layernorm):
  // Gemma 3's sandwich with Llama's RMSNorm.
  bool glm4 = false;
  // The checkpoint holds gate and up as one matrix (Phi-3's and GLM's
  // mlp.gate_up_proj); q/k/v as one (self_attn.qkv_proj) is Phi-3's alone.
  bool fusedGateUp() const { return phi3 || glm; }
  bool fusedQkv() const { return phi3; }
  // The attention's and the MLP's outputs are normalized before their
  // residual adds (Gemma, OLMo 2, GLM-4); the MLP's input is normalized too
  // in Gemma and GLM-4 (OLMo 2 takes the residual stream as it is).
  bool sandwichNorms() const { return gemma || olmo2 || glm4; }
  bool preFeedforwardNorm() const { return gemma || glm4; }
  // Ministral 3's query scale (rope_parameters' llama_4_scaling_beta; 0:
  // none): after RoPE, the queries of the token at position p are
  // multiplied by queryScale(p), 1 + beta ln(1 + floor(p /
  // llama4_scaling_original)), exactly 1 below llama4_scaling_original.
  double llama4_scaling_beta = 0;
  int64_t llama4_scaling_original = 0;
  float queryScale(int64_t position) const;

  // A checkpoint published with a vision tower (Gemma 3 4B and up,
  // Mistral 3): its language model's fields are config.json's text_config,
  // its tensors under language_model.model. or model.language_model.
  bool conditionalGeneration() const { return architecture.ends_with("ForConditionalGeneration"); }

  // Ministral 3, alone or as Mistral 3's language model: Ministral3Config's
  // defaults apply where the rotary parameters are left out.
  bool ministral3() const {
    return architecture == "Ministral3ForCausalLM" ||
           (architecture == "Mistral3ForConditionalGeneration" && model_type == "ministral3");
  }

  // What depends on the context length the engine serves: LongRoPE's
  // factors (RopeScaling::use_long). Changes computeDigest when it changes
  // them.
  void fitContext(int64_t max_model_len);
  // The factor RoPE multiplies cos and sin by (LongRoPE's mscale, YaRN's
  // attention factor, else 1).
  double ropeAttentionFactor() const;

  // Parses and validates; throws tandem::Error naming the file and field.
  // hf_overrides: a JSON object's text (vLLM's --hf-overrides; empty:
  // none) whose keys replace the file's before it is read (text_config's
  // keys merge into the file's text_config, a nested configuration); errors
  // then name the file "with --hf-overrides".
  static ModelConfig fromFile(const std::filesystem::path& path,
                              const std::string& hf_overrides = "");
  static ModelConfig fromJsonText(const std::string& text, const std::string& source_file,
                                  const std::string& hf_overrides = "");
  // The config.json text for this configuration (used by tandem-model).
  std::string toJsonText() const;
  // 16 hex digits (xxh3-64) of every field the forward pass's arithmetic
  // reads (head counts and sizes, norm epsilon, rotary parameters, biases,
  // tied embeddings), not of token ids or limits: two configs with one
  // digest give the same KV and logits for the same weights.
  std::string computeDigest() const;

  bool operator==(const ModelConfig&) const = default;
};

// The Hugging Face model_type of a supported architecture ("llama" for
// LlamaForCausalLM); throws tandem::Error, prefixed with source_name, naming
// the accepted architectures otherwise.
const char* modelTypeOf(const std::string& architecture, const std::string& source_name);

// YaRN's attention factor where the config gives neither attention_factor
// nor mscale and mscale_all_dim: 0.1 ln(factor) + 1, or 1 for a factor of
// at most 1.
double yarnDefaultAttentionFactor(double factor);

// Inverse frequencies of rotary embedding, rotary_dim / 2 values, with
// llama3, linear, LongRoPE or YaRN scaling applied when configured (same
// formula as Hugging Face).
std::vector<float> ropeInverseFrequencies(const ModelConfig& config);
// Those of a localRopeLayer (Gemma's and OLMo 3's sliding layers):
// rope_local_base_freq, no scaling.
std::vector<float> localRopeInverseFrequencies(const ModelConfig& config);

}  // namespace tandem::engine
