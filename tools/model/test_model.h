// Writes complete Hugging Face model directories with seeded random weights.
//
// A directory holds config.json, model.safetensors, tokenizer.json (byte-level
// BPE trained on an embedded corpus), tokenizer_config.json (ChatML chat
// template) and generation_config.json, so it loads like a downloaded model.
// Output is byte-deterministic: the same options give identical files.
//
// The tokenizer's vocabulary may be smaller than the config's vocab_size (a
// few KB of corpus supports only so many merges). lm_head rows are zero for
// the special tokens, for ids past the tokenizer's vocabulary and for tokens
// that are not text on their own (lone bytes of multi-byte characters,
// control characters), so greedy decoding emits readable text and never
// stops early on an eos token.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/engine/model_config.h"
#include "common/dtype.h"

namespace tandem::tools {

struct TestModelOptions {
  std::string preset = "tiny";  // "tiny", "small" or "llama3-8b"
  // Also Mistral/Qwen2/Qwen3/Mixtral/Qwen3Moe/Glm4Moe/GptOssForCausalLM and the others
  // tandem-model --arch names.
  std::string architecture = "LlamaForCausalLM";
  DType dtype = DType::kBF16;  // weight dtype: bf16, f16 or f32
  uint64_t seed = 0;
  int64_t layers = 0;  // num_hidden_layers; 0: the preset's
  // fp8 weights (docs/quantization.md): the projections as F8_E4M3 with
  // scales of this granularity, config.json's quantization_config as the
  // method writes it; method "mxfp4" (GptOssForCausalLM only): the experts
  // as MXFP4 blocks and scales, as published. Default: none.
  engine::Fp8Quantization quantization;
  // An fp8 KV cache's scales (docs/quantization.md#fp8-kv-cache), as
  // llm-compressor writes them: model.layers.<l>.self_attn.k_scale and
  // v_scale, F32 of shape [], drawn per layer between 6/448 and 12/448 (a
  // K/V value up to 6 to 12 stays below fp8's largest, 448).
  bool kv_cache_scales = false;
  // Phi3ForCausalLM only: Phi-4 (14B)'s rotary embedding (whole heads, no
  // LongRoPE) and no window, instead of Phi-4-mini's partial rotary dims and
  // LongRoPE (and, at tiny, Phi-3-mini's window): a Phi-3 every backend
  // runs.
  bool phi4_rotary = false;
  // YaRN in place of the preset's rotary scaling, as Qwen's model cards
  // set it: factor 4 over a quarter of the preset's context (at tiny, 128
  // of 512 positions; every pair's regime occurs), the attention factor's
  // default.
  bool yarn = false;
};

// The quantization a --quantize value names: METHOD:GRANULARITY[=RxC] with
// METHOD fp8 (transformers' fp8: tensor, or block, 128x128 unless given) or
// compressed-tensors (tensor, channel, or block); "fp8" alone is
// fp8:block=128x128, "compressed-tensors" alone compressed-tensors:channel.
// Throws tandem::Error naming what is accepted.
engine::Fp8Quantization parseQuantizationSpec(const std::string& spec);

// Preset names accepted by presetConfig.
std::vector<std::string> presetNames();
// The configuration of a preset for an architecture; throws tandem::Error
// naming the accepted values when either is unknown.
engine::ModelConfig presetConfig(const std::string& preset, const std::string& architecture);
// Writes the directory (created if absent; existing files are replaced).
// Weights are generated and written in bounded chunks, so memory stays small
// whatever the preset (llama3-8b writes 16 GB of bf16 weights).
void writeTestModel(const TestModelOptions& options, const std::filesystem::path& out_dir);

// A PEFT LoRA adapter for a model of `base`'s configuration
// (agent/engine/lora.h): adapter_config.json and adapter_model.safetensors
// with seeded random A and B for the chosen projections of every layer. B is
// not zero (PEFT starts it at zero; a test adapter must change the
// outputs): each delta is about `strength` times its projection's output.
struct TestLoraOptions {
  int64_t rank = 8;
  double alpha = 16.0;
  bool rslora = false;
  uint64_t seed = 1;
  DType dtype = DType::kF32;
  double strength = 0.5;
  // Module names as in PEFT's target_modules (q_proj ... down_proj); empty:
  // all seven, but for a mixture layer's MLP (which the agent refuses).
  std::vector<std::string> modules;
};
void writeTestLoraAdapter(const TestLoraOptions& options, const engine::ModelConfig& base,
                          const std::filesystem::path& out_dir);

}  // namespace tandem::tools
