// LoRA adapters (docs/lora.md): low-rank updates of a model's projection
// matrices, served beside the base model under names of their own.
//
// LoraAdapter::load reads a PEFT adapter directory, the format `peft`'s
// save_pretrained writes and vLLM's --lora-modules reads:
// adapter_config.json ("peft_type": "LORA", "r", "lora_alpha", optional
// "use_rslora") and adapter_model.safetensors with, for each adapted
// projection of each layer,
//   base_model.model.model.layers.<i>.self_attn.<q|k|v|o>_proj.lora_A.weight
//   base_model.model.model.layers.<i>.mlp.<gate|up|down>_proj.lora_A.weight
// ([r, in]) and the same with lora_B ([out, r]). A projection adapted there
// computes W x + scale * B (A x), scale = lora_alpha / r (lora_alpha /
// sqrt(r) with use_rslora). Projections and layers without tensors are left
// as they are. What the engine cannot apply is refused naming the field or
// tensor: DoRA, biases, modules_to_save, per-module rank or alpha patterns,
// adapted embeddings or lm_head, a tensor of another module, a lora_A
// without its lora_B, a shape that does not fit the model.
//
// The matrices are kept in fp32, B already multiplied by the scale (one
// rounding of each of B's entries when the scale is not a power of two).
// A LoraAdapter is immutable after load and safe to share across threads.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "agent/engine/model_config.h"

namespace tandem::engine {

// The projections of a layer, in LayerWeights::matrices() order.
inline constexpr int kLoraModules = 7;
inline constexpr std::array<const char*, kLoraModules> kLoraModuleNames = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
enum LoraModule { kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown };

// One adapted projection: delta = B_scaled (A x).
struct LoraPair {
  int64_t rank = 0;  // 0: this projection is not adapted
  int64_t in = 0, out = 0;
  std::vector<float> a;         // rank x in
  std::vector<float> b_scaled;  // out x rank, times the adapter's scale
};

class LoraAdapter {
 public:
  // `name`: what requests ask for (their `model` field). Throws
  // tandem::Error naming the file, field or tensor.
  static std::unique_ptr<LoraAdapter> load(const std::string& name,
                                           const std::filesystem::path& dir,
                                           const ModelConfig& model);

  const std::string& name() const { return name_; }
  const std::filesystem::path& directory() const { return directory_; }
  int64_t rank() const { return rank_; }
  double scale() const { return scale_; }
  // 16 hex digits of xxh3-64 over adapter_config.json's bytes and the
  // weights file's content digest: two adapters agree exactly when their
  // files do, whatever they are called.
  const std::string& digest() const { return digest_; }
  // [layer][module]
  const LoraPair& pair(int64_t layer, int module) const {
    return layers_[static_cast<size_t>(layer)][static_cast<size_t>(module)];
  }
  int64_t numLayers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  LoraAdapter() = default;
  std::string name_;
  std::filesystem::path directory_;
  int64_t rank_ = 0;
  double scale_ = 1.0;
  std::string digest_;
  std::vector<std::array<LoraPair, kLoraModules>> layers_;
};

// --lora-modules NAME=PATH[,NAME=PATH...]: each adapter's name and
// directory (empty text: none); throws tandem::Error naming the flag, the
// entry and the accepted form.
struct LoraModuleSpec {
  std::string name;
  std::filesystem::path path;
};
std::vector<LoraModuleSpec> parseLoraModuleSpecs(const std::string& text);

}  // namespace tandem::engine
