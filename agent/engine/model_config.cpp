#include "agent/engine/model_config.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "common/file_text.h"
#include "common/hex.h"
#include "common/json_parse.h"
#include "common/status.h"

namespace tandem::engine {

namespace {

using nlohmann::json;

// Context lengths past 2^24 tokens (16M) are a corrupt or hostile config: no
// supported model comes near, and positions must stay exact in float32.
constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 24;
// Token ids are int32.
constexpr int64_t kMaxVocabSize = int64_t{1} << 31;
// Widths, head counts and layer counts past 2^20 are a corrupt or hostile
// config (the largest models stay under 2^17), and the bound keeps every
// product of two of them, such as a projection's element count, far inside
// int64.
constexpr int64_t kMaxDimension = int64_t{1} << 20;

constexpr const char* kAcceptedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Ministral3ForCausalLM, "
    "Mistral3ForConditionalGeneration (text only), "
    "Qwen2ForCausalLM, Qwen3ForCausalLM, "
    "Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text only), "
    "Phi3ForCausalLM, GraniteForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, SmolLM3ForCausalLM, "
    "GlmForCausalLM, Glm4ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, "
    "Qwen3MoeForCausalLM, Glm4MoeForCausalLM, GptOssForCausalLM, GraniteMoeForCausalLM, "
    "OlmoeForCausalLM";
// More experts than this is a corrupt or hostile config (the largest
// published mixtures have 512, choosing at most 16 per token).
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxExpertsPerToken = 64;

// Reads typed fields of one JSON object; every error names the source file
// and the field, and says what would have been accepted.
class FieldReader {
 public:
  FieldReader(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // Present and not null (Hugging Face writes null for "use the default").
  bool has(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw Error(source_ + ": field \"" + prefix_ + key + "\" " + what);
  }

  const json& get(const char* key) const { return object_.at(key); }

  // A positive integer no larger than `max`.
  int64_t boundedInt(const char* key, int64_t default_value, int64_t max) const {
    if (!has(key)) return default_value;
    const json& value = object_.at(key);
    if (!value.is_number_integer() || value.get<int64_t>() <= 0 || value.get<int64_t>() > max) {
      fail(key,
           "must be a positive integer at most " + std::to_string(max) + ", got " + value.dump());
    }
    return value.get<int64_t>();
  }

  // An integer from 0 to `max`.
  int64_t countInt(const char* key, int64_t default_value, int64_t max) const {
    if (!has(key)) return default_value;
    const json& value = object_.at(key);
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > max) {
      fail(key, "must be an integer from 0 to " + std::to_string(max) + ", got " + value.dump());
    }
    return value.get<int64_t>();
  }

  int64_t requiredBoundedInt(const char* key, int64_t max) const {
    if (!has(key)) {
      fail(key, "is missing (required: a positive integer at most " + std::to_string(max) + ")");
    }
    return boundedInt(key, 0, max);
  }

  double requiredPositiveNumber(const char* key) const {
    if (!has(key)) fail(key, "is missing (required: a positive number)");
    return positiveNumber(key);
  }

  double positiveNumber(const char* key, double default_value) const {
    return has(key) ? positiveNumber(key) : default_value;
  }

  // A finite number of at least 0.
  double nonNegativeNumber(const char* key, double default_value) const {
    if (!has(key)) return default_value;
    const json& value = object_.at(key);
    if (!value.is_number() || !(value.get<double>() >= 0) || !std::isfinite(value.get<double>())) {
      fail(key, "must be a number of at least 0, got " + value.dump());
    }
    return value.get<double>();
  }

  // A non-empty list of positive finite numbers.
  std::vector<double> positiveNumbers(const char* key) const {
    if (!has(key)) fail(key, "is missing (required: a list of positive numbers)");
    const json& value = object_.at(key);
    std::vector<double> numbers;
    if (value.is_array()) {
      for (const json& number : value) {
        if (!number.is_number() || !(number.get<double>() > 0) ||
            !std::isfinite(number.get<double>())) {
          numbers.clear();
          break;
        }
        numbers.push_back(number.get<double>());
      }
    }
    if (numbers.empty()) fail(key, "must be a list of positive numbers, got " + value.dump());
    return numbers;
  }

  bool boolean(const char* key, bool default_value) const {
    if (!has(key)) return default_value;
    const json& value = object_.at(key);
    if (!value.is_boolean()) fail(key, "must be true or false, got " + value.dump());
    return value.get<bool>();
  }

  std::string string(const char* key, const std::string& default_value) const {
    if (!has(key)) return default_value;
    const json& value = object_.at(key);
    if (!value.is_string()) fail(key, "must be a string, got " + value.dump());
    return value.get<std::string>();
  }

  // A token id: a non-negative integer below vocab_size.
  int64_t tokenId(const char* key, const json& value, int64_t vocab_size) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= vocab_size) {
      fail(key, "must hold token ids between 0 and vocab_size - 1 (" +
                    std::to_string(vocab_size - 1) + "), got " + value.dump());
    }
    return value.get<int64_t>();
  }

  // The file errors name.
  const std::string& source() const { return source_; }

 private:
  double positiveNumber(const char* key) const {
    const json& value = object_.at(key);
    if (!value.is_number() || !(value.get<double>() > 0) || !std::isfinite(value.get<double>())) {
      fail(key, "must be a positive number, got " + value.dump());
    }
    return value.get<double>();
  }

  const json& object_;
  std::string source_;
  std::string prefix_;
};

// YaRN's attention factor for a context `factor` times the original:
// 0.1 x mscale x ln(factor) + 1, or 1 for factor at most 1 (transformers'
// get_mscale).
double yarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// Reads "rope_scaling" (or, in newer transformers, "rope_parameters", which
// also carries rope_theta). "default" is the same as no scaling.
RopeScaling parseRopeScaling(const json& object, const std::string& source,
                             const std::string& field) {
  FieldReader reader(object, source, field + ".");
  std::string type;
  if (reader.has("rope_type")) {
    type = reader.string("rope_type", "");
  } else {
    type = reader.string("type", "default");
  }
  RopeScaling scaling;
  if (type == "default") return scaling;
  if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    scaling.factor = reader.requiredPositiveNumber("factor");
    return scaling;
  }
  if (type == "longrope" || type == "su") {
    // transformers reads Phi-3's older "su" as "longrope". The factors'
    // count, original_max_position_embeddings and the attention factor are
    // settled by the caller, which knows the rotary dims and the context.
    scaling.type = RopeScaling::Type::kLongRope;
    scaling.short_factor = reader.positiveNumbers("short_factor");
    scaling.long_factor = reader.positiveNumbers("long_factor");
    scaling.factor = reader.positiveNumber("factor", 1.0);  // not read: the context decides
    scaling.original_max_position_embeddings =
        reader.boundedInt("original_max_position_embeddings", 0, kMaxPositionEmbeddings);
    const double attention_factor = reader.positiveNumber("attention_factor", 0.0);
    scaling.short_mscale = reader.positiveNumber("short_mscale", attention_factor);
    scaling.long_mscale = reader.positiveNumber("long_mscale", attention_factor);
    return scaling;
  }
  if (type == "yarn") {
    // As transformers' _compute_yarn_parameters reads it; the original
    // context (default max_position_embeddings) is settled by the caller.
    scaling.type = RopeScaling::Type::kYarn;
    scaling.factor = reader.requiredPositiveNumber("factor");
    scaling.original_max_position_embeddings =
        reader.boundedInt("original_max_position_embeddings", 0, kMaxPositionEmbeddings);
    scaling.beta_fast = reader.positiveNumber("beta_fast", 32.0);
    scaling.beta_slow = reader.positiveNumber("beta_slow", 1.0);
    if (scaling.beta_fast < scaling.beta_slow) {
      reader.fail("beta_fast", "must be at least beta_slow (" + json(scaling.beta_slow).dump() +
                                   "), got " + json(scaling.beta_fast).dump());
    }
    scaling.truncate = reader.boolean("truncate", true);
    // DeepSeek's pair: the ratio of the two, where both are given and not 0.
    const double mscale = reader.nonNegativeNumber("mscale", 0.0);
    const double mscale_all_dim = reader.nonNegativeNumber("mscale_all_dim", 0.0);
    scaling.attention_factor = reader.positiveNumber(
        "attention_factor",
        mscale > 0 && mscale_all_dim > 0
            ? yarnMscale(scaling.factor, mscale) / yarnMscale(scaling.factor, mscale_all_dim)
            : yarnDefaultAttentionFactor(scaling.factor));
    return scaling;
  }
  if (type != "llama3") {
    throw Error(source + ": field \"" + field + "\" has rope type \"" + type +
                "\", which is not supported (accepted: llama3, linear, longrope, yarn, or null "
                "for no scaling)");
  }
  scaling.type = RopeScaling::Type::kLlama3;
  scaling.factor = reader.requiredPositiveNumber("factor");
  scaling.low_freq_factor = reader.requiredPositiveNumber("low_freq_factor");
  scaling.high_freq_factor = reader.requiredPositiveNumber("high_freq_factor");
  scaling.original_max_position_embeddings =
      reader.requiredBoundedInt("original_max_position_embeddings", kMaxPositionEmbeddings);
  // The smooth interpolation divides by their difference.
  if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
    reader.fail("high_freq_factor", "must be greater than low_freq_factor (" +
                                        json(scaling.low_freq_factor).dump() + "), got " +
                                        json(scaling.high_freq_factor).dump());
  }
  return scaling;
}

// Reads "quantization_config": fp8 weights as transformers' FP8 checkpoints
// (quant_method "fp8": one scale per tensor, or per weight_block_size block
// in weight_scale_inv) or compressed-tensors' float-quantized ones (8-bit
// float weights, strategy tensor, channel or block, in weight_scale) hold
// them. The activations' scheme is read past: activations stay fp32
// (docs/quantization.md). Everything else is refused naming the field.
Fp8Quantization parseQuantization(const json& object, const std::string& source) {
  constexpr const char* kField = "quantization_config";
  if (!object.is_object()) {
    throw Error(source + ": field \"" + kField + "\" must be an object, got " + object.dump());
  }
  FieldReader reader(object, source, std::string(kField) + ".");
  using Granularity = Fp8Quantization::Granularity;
  Fp8Quantization q;
  if (!reader.has("quant_method")) {
    reader.fail("quant_method", "is missing (accepted: fp8, compressed-tensors, mxfp4)");
  }
  q.method = reader.string("quant_method", "");
  // MXFP4 (GPT-OSS): the experts' blocks and scales, named by their
  // tensors; the rest (modules_to_not_convert) stays as it is. Whether the
  // architecture has such experts is decided by the caller.
  if (q.method == "mxfp4") return q;
  auto positivePair = [](const FieldReader& r, const char* key) {
    const json& value = r.get(key);
    if (!value.is_array() || value.size() != 2 || !value[0].is_number_integer() ||
        !value[1].is_number_integer() || value[0].get<int64_t>() <= 0 ||
        value[1].get<int64_t>() <= 0 || value[0].get<int64_t>() > kMaxDimension ||
        value[1].get<int64_t>() > kMaxDimension) {
      r.fail(key, "must be [rows, columns], two positive integers at most " +
                      std::to_string(kMaxDimension) + ", got " + value.dump());
    }
    return std::pair{value[0].get<int64_t>(), value[1].get<int64_t>()};
  };
  if (q.method == "fp8") {
    const std::string fmt = reader.string("fmt", "e4m3");
    if (fmt != "e4m3") {
      reader.fail("fmt", "is \"" + fmt + "\", which is not supported (accepted: e4m3)");
    }
    if (reader.has("weight_block_size")) {
      q.granularity = Granularity::kBlock;
      std::tie(q.block_rows, q.block_cols) = positivePair(reader, "weight_block_size");
    } else {
      q.granularity = Granularity::kTensor;
    }
    return q;
  }
  if (q.method != "compressed-tensors") {
    reader.fail("quant_method",
                "is \"" + q.method +
                    "\", which is not supported (accepted: fp8, compressed-tensors with 8-bit "
                    "float weights, mxfp4 for GptOssForCausalLM)");
  }
  if (reader.has("config_groups") && !object["config_groups"].is_object()) {
    reader.fail("config_groups",
                "must be an object of quantization groups, got " + object["config_groups"].dump());
  }
  // Groups that quantize no weights (activations or the KV cache only)
  // leave every matrix as it is: such a config is no quantization here.
  const json no_groups = json::object();
  const json& groups = reader.has("config_groups") ? object["config_groups"] : no_groups;
  const bool quantizes_weights = std::any_of(groups.begin(), groups.end(), [](const json& group) {
    return group.is_object() && group.contains("weights") && !group["weights"].is_null();
  });
  if (!quantizes_weights) return Fp8Quantization{};
  const std::string format = reader.string("format", "float-quantized");
  if (format != "float-quantized" && format != "naive-quantized") {
    reader.fail("format", "is \"" + format +
                              "\", which is not supported (accepted: float-quantized, "
                              "naive-quantized with 8-bit float weights)");
  }
  for (const auto& [group_name, group] : groups.items()) {
    const std::string prefix = std::string(kField) + ".config_groups." + group_name + ".";
    if (!group.is_object() || !group.contains("weights") || group["weights"].is_null()) continue;
    if (!group["weights"].is_object()) {
      throw Error(source + ": field \"" + prefix + "weights\" must be an object or null, got " +
                  group["weights"].dump());
    }
    FieldReader weights(group["weights"], source, prefix + "weights.");
    const json& bits = weights.has("num_bits") ? weights.get("num_bits") : json(nullptr);
    const std::string type = weights.string("type", "int");
    if (!bits.is_number_integer() || bits.get<int64_t>() != 8 || type != "float") {
      weights.fail("type", "with num_bits gives " + type + " " + bits.dump() +
                               "-bit weights, which are not supported (accepted: type float, "
                               "num_bits 8)");
    }
    if (weights.boolean("dynamic", false)) {
      weights.fail("dynamic", "is true (accepted: false, scales stored with the weights)");
    }
    if (!weights.boolean("symmetric", true)) {
      weights.fail("symmetric", "is false (accepted: true, no zero points)");
    }
    const std::string strategy = weights.string("strategy", "tensor");
    Fp8Quantization group_q = q;
    if (strategy == "tensor") {
      group_q.granularity = Granularity::kTensor;
    } else if (strategy == "channel") {
      group_q.granularity = Granularity::kChannel;
    } else if (strategy == "block") {
      group_q.granularity = Granularity::kBlock;
      if (!weights.has("block_structure")) {
        weights.fail("block_structure", "is missing (required with strategy block)");
      }
      std::tie(group_q.block_rows, group_q.block_cols) = positivePair(weights, "block_structure");
    } else {
      weights.fail("strategy", "is \"" + strategy +
                                   "\", which is not supported (accepted: tensor, channel, "
                                   "block)");
    }
    if (q.granularity != Granularity::kNone && !(group_q == q)) {
      throw Error(source + ": field \"" + prefix +
                  "weights\" quantizes weights differently from another group (accepted: one "
                  "weight scheme for all groups)");
    }
    q = group_q;
  }
  return q;
}

// The mixture-of-experts fields: Mixtral's num_local_experts (8 by
// default) choosing 2 with renormalized weights, every layer a mixture of
// intermediate_size experts; Qwen3-MoE's num_experts (128) choosing 8 of
// moe_intermediate_size (768), renormalized when norm_topk_prob (false),
// with decoder_sparse_step and mlp_only_layers naming the dense layers;
// Qwen2-MoE's (Qwen2MoeConfig's defaults) num_experts (60) choosing 4 of
// 1408 wide, norm_topk_prob (false), decoder_sparse_step and
// mlp_only_layers as Qwen3-MoE's, and a gated shared expert of
// shared_expert_intermediate_size (5632; 0: none); GLM-4.5's
// (Glm4MoeConfig's defaults) n_routed_experts (128) choosing 8 of 1408 wide
// by sigmoid routing, renormalized (norm_topk_prob true), in n_group groups
// (1) of which topk_group (1) are candidates, weights times
// routed_scaling_factor (1), n_shared_experts (1) shared, the first
// first_k_dense_replace (1) layers dense.
void readExperts(const FieldReader& reader, const json& root, ModelConfig& config) {
  const bool is_mixtral = config.architecture == "MixtralForCausalLM";
  const bool is_glm4_moe = config.glm4Moe();
  const bool is_qwen2_moe = config.qwen2Moe();
  const bool is_gpt_oss = config.gptOss();
  const bool is_granite_moe = config.graniteMoe();
  const bool is_olmoe = config.olmoe();
  // transformers 5 writes Qwen3-MoE's num_experts as num_local_experts
  // (its attribute_map), and GLM-4.5's n_routed_experts likewise: either
  // is read.
  const char* experts_key =
      is_glm4_moe ? (reader.has("num_local_experts") && !reader.has("n_routed_experts")
                         ? "num_local_experts"
                         : "n_routed_experts")
      : is_mixtral || is_gpt_oss || is_granite_moe || !reader.has("num_experts")
          ? "num_local_experts"
          : "num_experts";
  config.num_experts = reader.boundedInt(experts_key,
                                         is_mixtral || is_granite_moe ? 8
                                         : is_qwen2_moe               ? 60
                                         : is_olmoe                   ? 64
                                                                      : 128,
                                         kMaxExperts);
  config.num_experts_per_tok = reader.boundedInt("num_experts_per_tok",
                                                 is_mixtral || is_granite_moe ? 2
                                                 : is_qwen2_moe || is_gpt_oss ? 4
                                                                              : 8,
                                                 kMaxExpertsPerToken);
  if (config.num_experts_per_tok > config.num_experts) {
    reader.fail("num_experts_per_tok", "must be at most " + std::string(experts_key) + " (" +
                                           std::to_string(config.num_experts) + "), got " +
                                           std::to_string(config.num_experts_per_tok));
  }
  if (is_mixtral || is_gpt_oss || is_granite_moe) {
    // GPT-OSS's and Granite MoE's softmax over the chosen logits is the
    // renormalized softmax over all of them.
    config.moe_intermediate_size = config.intermediate_size;
    config.norm_topk_prob = true;
    if (is_gpt_oss) config.swiglu_limit = reader.positiveNumber("swiglu_limit", 7.0);
    return;
  }
  if (is_olmoe) {
    // Every layer a mixture of intermediate_size experts; OlmoeConfig's
    // norm_topk_prob is false.
    config.moe_intermediate_size = config.intermediate_size;
    config.norm_topk_prob = reader.boolean("norm_topk_prob", false);
    return;
  }
  config.moe_intermediate_size = reader.boundedInt(
      "moe_intermediate_size", is_glm4_moe || is_qwen2_moe ? 1408 : 768, kMaxDimension);
  config.norm_topk_prob = reader.boolean("norm_topk_prob", is_glm4_moe);
  if (is_glm4_moe) {
    config.sigmoid_routing = true;
    config.n_shared_experts = reader.countInt("n_shared_experts", 1, kMaxExpertsPerToken);
    config.routed_scaling_factor = reader.positiveNumber("routed_scaling_factor", 1.0);
    config.first_k_dense_replace =
        reader.countInt("first_k_dense_replace", 1, config.num_hidden_layers);
    config.n_group = reader.boundedInt("n_group", 1, config.num_experts);
    if (config.num_experts % config.n_group != 0 ||
        (config.n_group > 1 && config.num_experts / config.n_group < 2)) {
      reader.fail("n_group", "must divide " + std::string(experts_key) + " (" +
                                 std::to_string(config.num_experts) +
                                 ") into groups of two or more experts, or be 1, got " +
                                 std::to_string(config.n_group));
    }
    config.topk_group = reader.boundedInt("topk_group", 1, config.n_group);
    const int64_t candidates = config.topk_group * (config.num_experts / config.n_group);
    if (config.num_experts_per_tok > candidates) {
      reader.fail("num_experts_per_tok", "must be at most the experts of topk_group groups (" +
                                             std::to_string(candidates) + "), got " +
                                             std::to_string(config.num_experts_per_tok));
    }
    return;
  }
  if (is_qwen2_moe) {
    config.shared_expert_intermediate_size =
        reader.countInt("shared_expert_intermediate_size", 5632, kMaxDimension);
  }
  config.decoder_sparse_step =
      reader.boundedInt("decoder_sparse_step", 1, config.num_hidden_layers);
  if (reader.has("mlp_only_layers")) {
    const json& layers = root.at("mlp_only_layers");
    const std::string accepted =
        "must be a list of layer indices from 0 to num_hidden_layers - 1 (" +
        std::to_string(config.num_hidden_layers - 1) + "), got ";
    if (!layers.is_array()) reader.fail("mlp_only_layers", accepted + layers.dump());
    for (const json& layer : layers) {
      if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
          layer.get<int64_t>() >= config.num_hidden_layers) {
        reader.fail("mlp_only_layers", accepted + layer.dump());
      }
      config.mlp_only_layers.push_back(layer.get<int64_t>());
    }
    std::sort(config.mlp_only_layers.begin(), config.mlp_only_layers.end());
    config.mlp_only_layers.erase(
        std::unique(config.mlp_only_layers.begin(), config.mlp_only_layers.end()),
        config.mlp_only_layers.end());
  }
}

// Ministral 3's query scale, from the rotary parameters' object
// (rope_parameters, else rope_scaling): llama_4_scaling_beta (at least 0;
// none: 0) and, with a beta above 0, the object's
// original_max_position_embeddings (required, as transformers reads it).
void readLlama4Scaling(const FieldReader& reader, const json& root, ModelConfig& config) {
  const char* key = reader.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!reader.has(key) || !root[key].is_object()) return;
  const FieldReader rope(root[key], reader.source(), std::string(key) + ".");
  config.llama4_scaling_beta = rope.nonNegativeNumber("llama_4_scaling_beta", 0.0);
  if (config.llama4_scaling_beta > 0) {
    config.llama4_scaling_original =
        rope.requiredBoundedInt("original_max_position_embeddings", kMaxPositionEmbeddings);
  }
}

// Sizes config.sliding_layers to the layers, all false, and reads
// layer_types into it where given ("sliding_attention" or
// "full_attention" for each layer); returns whether it was.
bool readLayerTypes(const FieldReader& reader, const json& root, ModelConfig& config) {
  const auto layers = static_cast<size_t>(config.num_hidden_layers);
  config.sliding_layers.assign(layers, false);
  if (!reader.has("layer_types")) return false;
  const json& types = root["layer_types"];
  if (!types.is_array() || types.size() != layers) {
    reader.fail("layer_types", "must list num_hidden_layers (" + std::to_string(layers) +
                                   ") of \"sliding_attention\" and \"full_attention\", got " +
                                   types.dump());
  }
  for (size_t i = 0; i < layers; ++i) {
    if (types[i] == "sliding_attention") {
      config.sliding_layers[i] = true;
    } else if (types[i] != "full_attention") {
      reader.fail("layer_types",
                  "must hold only \"sliding_attention\" and "
                  "\"full_attention\", got " +
                      types[i].dump());
    }
  }
  return true;
}

// Gemma's own fields (Gemma2Config's or Gemma3TextConfig's defaults): the
// sliding window and which layers use it (layer_types; else Gemma 2's every
// other layer from the first, Gemma 3's all but every
// sliding_window_pattern-th), the query scale, the activation (GELU, tanh
// approximation: transformers' gelu_pytorch_tanh) and soft-capping (Gemma
// 2: 50 for attention scores and 30 for logits unless given; Gemma 3:
// none unless given).
void readGemma(const FieldReader& reader, const json& root, bool gemma2, ModelConfig& config) {
  config.gemma = true;
  config.sliding_window = reader.boundedInt("sliding_window", 4096, kMaxPositionEmbeddings);
  config.query_pre_attn_scalar = reader.positiveNumber("query_pre_attn_scalar", 256.0);
  const char* activation_key = reader.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string activation = reader.string(activation_key, "gelu_pytorch_tanh");
  if (activation != "gelu_pytorch_tanh") {
    reader.fail(activation_key,
                "is \"" + activation + "\", which is not supported (accepted: gelu_pytorch_tanh)");
  }
  // (A key given as null means none, for Gemma 2 too.)
  config.attn_logit_softcapping = reader.positiveNumber(
      "attn_logit_softcapping", gemma2 && !root.contains("attn_logit_softcapping") ? 50.0 : 0.0);
  config.final_logit_softcapping = reader.positiveNumber(
      "final_logit_softcapping", gemma2 && !root.contains("final_logit_softcapping") ? 30.0 : 0.0);
  if (readLayerTypes(reader, root, config)) return;
  const auto layers = static_cast<size_t>(config.num_hidden_layers);
  if (gemma2) {
    for (size_t i = 0; i < layers; ++i) config.sliding_layers[i] = i % 2 == 0;
  } else {
    const int64_t pattern = reader.boundedInt("sliding_window_pattern", 6, kMaxDimension);
    for (size_t i = 0; i < layers; ++i) {
      config.sliding_layers[i] = (static_cast<int64_t>(i) + 1) % pattern != 0;
    }
  }
}

// A window of `default_window` unless sliding_window is given, on the
// layers layer_types marks, else on those `sliding(layer)` names; with no
// sliding layer, no window. OLMo 3's (Olmo3Config's: 4096, all but every
// 4th layer) and GPT-OSS's (GptOssConfig's: 128, every other layer from the
// first).
void readLayerWindows(const FieldReader& reader, const json& root, int64_t default_window,
                      bool (*sliding)(int64_t layer), ModelConfig& config) {
  config.sliding_window =
      reader.boundedInt("sliding_window", default_window, kMaxPositionEmbeddings);
  if (!readLayerTypes(reader, root, config)) {
    for (size_t i = 0; i < config.sliding_layers.size(); ++i) {
      config.sliding_layers[i] = sliding(static_cast<int64_t>(i));
    }
  }
  if (std::none_of(config.sliding_layers.begin(), config.sliding_layers.end(),
                   [](bool sliding_layer) { return sliding_layer; })) {
    config.sliding_layers.clear();
    config.sliding_window = 0;
  }
}

// SmolLM3Config's NoPE layers: no_rope_layers (1: the layer rotates, 0: it
// does not; at least one entry per layer, the first num_hidden_layers
// read), else every no_rope_layer_interval-th layer (default 4). Its
// sliding NoPE layers (layer_types; use_sliding_window is refused for
// every model) are refused.
void readNopeLayers(const FieldReader& reader, const json& root, ModelConfig& config) {
  const auto layers = static_cast<size_t>(config.num_hidden_layers);
  config.nope_layers.assign(layers, false);
  if (reader.has("no_rope_layers")) {
    const json& flags = root["no_rope_layers"];
    if (!flags.is_array() || flags.size() < layers ||
        !std::all_of(flags.begin(), flags.begin() + static_cast<std::ptrdiff_t>(layers),
                     [](const json& flag) { return flag == 0 || flag == 1; })) {
      reader.fail("no_rope_layers", "must list 1 (RoPE) or 0 (none) for each of the " +
                                        std::to_string(layers) + " layers, got " + flags.dump());
    }
    for (size_t i = 0; i < layers; ++i) config.nope_layers[i] = flags[i] == 0;
  } else {
    const int64_t interval = reader.boundedInt("no_rope_layer_interval", 4, kMaxDimension);
    for (size_t i = 0; i < layers; ++i) {
      config.nope_layers[i] = (static_cast<int64_t>(i) + 1) % interval == 0;
    }
  }
  if (std::none_of(config.nope_layers.begin(), config.nope_layers.end(),
                   [](bool nope) { return nope; })) {
    config.nope_layers.clear();
  }
  if (reader.has("layer_types")) {
    const json& types = root["layer_types"];
    if (!types.is_array() || !std::all_of(types.begin(), types.end(), [](const json& type) {
          return type == "full_attention";
        })) {
      reader.fail("layer_types",
                  "must hold only \"full_attention\" (sliding layers are not supported), got " +
                      types.dump());
    }
  }
}

// LongRoPE's attention factor when the config gives none, as transformers'
// _compute_longrope_parameters computes it: sqrt(1 + ln(s) / ln(original))
// for s = max_position_embeddings / original_max_position_embeddings above
// 1, else 1.
double longRopeDefaultMscale(const ModelConfig& config) {
  const auto original = static_cast<double>(config.rope_scaling.original_max_position_embeddings);
  const double ratio = static_cast<double>(config.max_position_embeddings) / original;
  return ratio <= 1.0 || original <= 1.0 ? 1.0
                                         : std::sqrt(1.0 + std::log(ratio) / std::log(original));
}

// LongRoPE's fields that depend on the rest of the config, as transformers'
// _compute_longrope_parameters settles them: one factor per rotary pair;
// original_max_position_embeddings from the top level (Phi-3 keeps it
// there), else rope_scaling's, else max_position_embeddings; the attention
// factor given, else longRopeDefaultMscale's.
void readLongRope(const FieldReader& reader, ModelConfig& config) {
  RopeScaling& scaling = config.rope_scaling;
  const auto pairs = static_cast<size_t>(config.rotary_dim / 2);
  for (const auto& [name, factors] : {std::pair<const char*, const std::vector<double>*>{
                                          "rope_scaling.short_factor", &scaling.short_factor},
                                      {"rope_scaling.long_factor", &scaling.long_factor}}) {
    if (factors->size() != pairs) {
      reader.fail(name, "must hold one factor per rotary pair (rotary dims / 2 = " +
                            std::to_string(pairs) + "), got " + std::to_string(factors->size()));
    }
  }
  const int64_t original = reader.boundedInt("original_max_position_embeddings",
                                             scaling.original_max_position_embeddings > 0
                                                 ? scaling.original_max_position_embeddings
                                                 : config.max_position_embeddings,
                                             kMaxPositionEmbeddings);
  scaling.original_max_position_embeddings = original;
  const double default_mscale = longRopeDefaultMscale(config);
  if (scaling.short_mscale == 0.0) scaling.short_mscale = default_mscale;
  if (scaling.long_mscale == 0.0) scaling.long_mscale = default_mscale;
  config.fitContext(config.max_position_embeddings);
}

// YaRN's original context (transformers' default: max_position_embeddings)
// and the context it serves: the original times `factor` where that is
// more than max_position_embeddings, as vLLM derives max_model_len (Qwen3
// configs say 40960 with factor 4 over 32768: 131072 is served).
void settleYarnContext(ModelConfig& config) {
  RopeScaling& scaling = config.rope_scaling;
  if (scaling.original_max_position_embeddings == 0) {
    scaling.original_max_position_embeddings = config.max_position_embeddings;
  }
  const double extended =
      static_cast<double>(scaling.original_max_position_embeddings) * scaling.factor;
  if (extended > static_cast<double>(config.max_position_embeddings)) {
    config.max_position_embeddings =
        static_cast<int64_t>(std::min(extended, static_cast<double>(kMaxPositionEmbeddings)));
  }
}

}  // namespace

void ModelConfig::fitContext(int64_t max_model_len) {
  if (rope_scaling.type == RopeScaling::Type::kLongRope) {
    rope_scaling.use_long = max_model_len > rope_scaling.original_max_position_embeddings;
  }
}

float ModelConfig::queryScale(int64_t position) const {
  if (llama4_scaling_beta <= 0 || position < llama4_scaling_original) return 1.0f;
  // In double, rounded once; floor(p / original) is the integer quotient.
  const auto periods = static_cast<double>(position / llama4_scaling_original);
  return static_cast<float>(1.0 + llama4_scaling_beta * std::log(1.0 + periods));
}

double ModelConfig::ropeAttentionFactor() const {
  if (rope_scaling.type == RopeScaling::Type::kYarn) return rope_scaling.attention_factor;
  if (rope_scaling.type != RopeScaling::Type::kLongRope) return 1.0;
  return rope_scaling.use_long ? rope_scaling.long_mscale : rope_scaling.short_mscale;
}

bool ModelConfig::isMoeLayer(int64_t layer) const {
  return num_experts > 0 && layer >= first_k_dense_replace &&
         (layer + 1) % decoder_sparse_step == 0 &&
         !std::binary_search(mlp_only_layers.begin(), mlp_only_layers.end(), layer);
}

ModelConfig ModelConfig::fromFile(const std::filesystem::path& path,
                                  const std::string& hf_overrides) {
  const std::optional<std::string> text = readModelFile(path);
  if (!text) throw Error(path.string() + ": cannot read the model configuration");
  return fromJsonText(*text, path.string(), hf_overrides);
}

const char* modelTypeOf(const std::string& architecture, const std::string& source_name) {
  static constexpr std::pair<const char*, const char*> kArchitectures[] = {
      {"LlamaForCausalLM", "llama"},
      {"MistralForCausalLM", "mistral"},
      {"Mistral3ForConditionalGeneration", "mistral"},
      {"Ministral3ForCausalLM", "ministral3"},
      {"Qwen2ForCausalLM", "qwen2"},
      {"Qwen3ForCausalLM", "qwen3"},
      {"MixtralForCausalLM", "mixtral"},
      {"Qwen3MoeForCausalLM", "qwen3_moe"},
      {"Qwen2MoeForCausalLM", "qwen2_moe"},
      {"Gemma3ForCausalLM", "gemma3_text"},
      {"Gemma3ForConditionalGeneration", "gemma3"},
      {"Gemma2ForCausalLM", "gemma2"},
      {"Phi3ForCausalLM", "phi3"},
      {"GraniteForCausalLM", "granite"},
      {"GraniteMoeForCausalLM", "granitemoe"},
      {"Olmo2ForCausalLM", "olmo2"},
      {"Olmo3ForCausalLM", "olmo3"},
      {"SmolLM3ForCausalLM", "smollm3"},
      {"GlmForCausalLM", "glm"},
      {"Glm4ForCausalLM", "glm4"},
      {"Glm4MoeForCausalLM", "glm4_moe"},
      {"GptOssForCausalLM", "gpt_oss"},
      {"OlmoeForCausalLM", "olmoe"},
  };
  for (const auto& [name, model_type] : kArchitectures) {
    if (architecture == name) return model_type;
  }
  throw Error(source_name + ": architecture \"" + architecture +
              "\" is not supported (accepted: " + kAcceptedArchitectures + ")");
}

ModelConfig ModelConfig::fromJsonText(const std::string& text, const std::string& source_file,
                                      const std::string& hf_overrides) {
  JsonParseError parse_error;
  std::optional<json> parsed = parseJson(text, parse_error);
  if (!parsed) throw Error(source_file + ": not valid JSON: " + parse_error.detail);
  json root = std::move(*parsed);
  if (!root.is_object()) throw Error(source_file + ": not a JSON object");
  std::string source_name = source_file;
  if (!hf_overrides.empty()) {
    StatusOr<json> overrides = parseJsonObject(hf_overrides, "--hf-overrides");
    if (!overrides.isOk()) throw Error(overrides.status().message());
    for (const auto& [key, value] : overrides->items()) {
      if (key == "text_config" && value.is_object() && root.contains(key) &&
          root[key].is_object()) {
        for (const auto& [field, field_value] : value.items()) root[key][field] = field_value;
      } else {
        root[key] = value;
      }
    }
    source_name += " with --hf-overrides";
  }
  FieldReader reader(root, source_name, "");

  ModelConfig config;
  if (!reader.has("architectures") || !root["architectures"].is_array() ||
      root["architectures"].empty() || !root["architectures"][0].is_string()) {
    reader.fail("architectures", std::string("must be a list naming the architecture (accepted: ") +
                                     kAcceptedArchitectures + ")");
  }
  config.architecture = root["architectures"][0].get<std::string>();
  const char* default_model_type = modelTypeOf(config.architecture, source_name);
  if (config.conditionalGeneration()) {
    // The language model of a checkpoint published with a vision tower
    // (Gemma 3 4B and up, Mistral Small 3.1 and 3.2): its fields are
    // text_config's (the top level's dtype and token ids where text_config
    // leaves them out; Gemma's tied embeddings too, while Mistral 3's are
    // its text_config's, as vLLM reads them); images are not read.
    const bool gemma3 = config.architecture == "Gemma3ForConditionalGeneration";
    if (!reader.has("text_config") || !root["text_config"].is_object()) {
      reader.fail("text_config", "must be an object (the language model's configuration)");
    }
    json text = root["text_config"];
    if (!gemma3 && text.contains("model_type") && text["model_type"] != "mistral" &&
        text["model_type"] != "ministral3") {
      reader.fail("text_config", "has model_type " + text["model_type"].dump() +
                                     ", which is not supported with " + config.architecture +
                                     " (accepted: \"mistral\", \"ministral3\")");
    }
    for (const char* key : {"torch_dtype", "dtype", "bos_token_id", "eos_token_id",
                            "quantization_config", "tie_word_embeddings"}) {
      if (!gemma3 && std::string(key) == "tie_word_embeddings") continue;
      if (root.contains(key) && !text.contains(key)) text[key] = root[key];
    }
    text["architectures"] = root["architectures"];
    root = std::move(text);
  }
  const bool is_qwen2 = config.architecture == "Qwen2ForCausalLM";
  const bool is_qwen3 = config.architecture == "Qwen3ForCausalLM";
  const bool is_mistral = config.architecture == "MistralForCausalLM" ||
                          config.architecture == "Ministral3ForCausalLM" ||
                          config.architecture == "Mistral3ForConditionalGeneration";
  const bool is_mixtral = config.architecture == "MixtralForCausalLM";
  const bool is_qwen3_moe = config.architecture == "Qwen3MoeForCausalLM";
  const bool is_glm4_moe = config.glm4Moe();
  const bool is_qwen2_moe = config.qwen2Moe();
  const bool is_gpt_oss = config.gptOss();
  const bool is_olmoe = config.olmoe();
  const bool is_gemma2 = config.architecture == "Gemma2ForCausalLM";
  const bool is_gemma3 = config.architecture == "Gemma3ForCausalLM" ||
                         config.architecture == "Gemma3ForConditionalGeneration";
  const bool is_gemma = is_gemma2 || is_gemma3;
  const bool is_phi3 = config.architecture == "Phi3ForCausalLM";
  config.phi3 = is_phi3;
  config.granite = config.architecture == "GraniteForCausalLM" || config.graniteMoe();
  config.olmo3 = config.architecture == "Olmo3ForCausalLM";
  config.olmo2 = config.architecture == "Olmo2ForCausalLM" || config.olmo3;
  const bool is_smollm3 = config.architecture == "SmolLM3ForCausalLM";
  config.glm4 = config.architecture == "Glm4ForCausalLM";
  config.glm = config.architecture == "GlmForCausalLM" || config.glm4;
  config.model_type = reader.string("model_type", default_model_type);
  // Ministral 3: Mistral's computation with its query scale; without
  // rotary parameters, Ministral3Config's (YaRN over 16,384 positions,
  // 262,144 served, the query scale's beta 0.1).
  const bool is_ministral3 = config.ministral3();
  if (is_ministral3 && !reader.has("rope_parameters") && !reader.has("rope_scaling")) {
    root["rope_parameters"] = {{"rope_type", "yarn"},
                               {"rope_theta", 1e6},
                               {"factor", 16.0},
                               {"original_max_position_embeddings", 16384},
                               {"beta_fast", 32.0},
                               {"beta_slow", 1.0},
                               {"mscale", 1.0},
                               {"mscale_all_dim", 1.0},
                               {"llama_4_scaling_beta", 0.1}};
  }
  // GPT-OSS without rotary parameters: GptOssConfig's (YaRN, 32 times
  // 4,096 positions, bounds not rounded).
  if (is_gpt_oss && !reader.has("rope_parameters") && !reader.has("rope_scaling")) {
    root["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 32.0},
                            {"beta_fast", 32.0},   {"beta_slow", 1.0},
                            {"truncate", false},   {"original_max_position_embeddings", 4096}};
  }

  if (is_gemma) {
    // Gemma2Config's and Gemma3TextConfig's defaults: published configs
    // leave some out.
    config.hidden_size = reader.boundedInt("hidden_size", 2304, kMaxDimension);
    config.intermediate_size = reader.boundedInt("intermediate_size", 9216, kMaxDimension);
    config.num_hidden_layers = reader.boundedInt("num_hidden_layers", 26, kMaxDimension);
    config.num_attention_heads = reader.boundedInt("num_attention_heads", 8, kMaxDimension);
    config.num_key_value_heads = reader.boundedInt("num_key_value_heads", 4, kMaxDimension);
    config.vocab_size =
        reader.boundedInt("vocab_size", is_gemma2 ? 256000 : 262208, kMaxVocabSize - 1);
  } else {
    config.hidden_size = reader.requiredBoundedInt("hidden_size", kMaxDimension);
    config.intermediate_size = reader.requiredBoundedInt("intermediate_size", kMaxDimension);
    config.num_hidden_layers = reader.requiredBoundedInt("num_hidden_layers", kMaxDimension);
    config.num_attention_heads = reader.requiredBoundedInt("num_attention_heads", kMaxDimension);
    // GlmConfig's default is its own (GLM-4-9B's 2).
    config.num_key_value_heads = reader.boundedInt(
        "num_key_value_heads", config.glm ? 2 : config.num_attention_heads, kMaxDimension);
    config.vocab_size = reader.requiredBoundedInt("vocab_size", kMaxVocabSize - 1);
  }

  if (reader.has("head_dim")) {
    config.head_dim = reader.requiredBoundedInt("head_dim", kMaxDimension);
  } else if (is_qwen3 || is_ministral3 || config.glm) {
    // Qwen3Config's, Ministral3Config's and GlmConfig's own default,
    // decoupled from hidden_size.
    config.head_dim = 128;
  } else if (is_gemma) {
    config.head_dim = 256;  // Gemma3TextConfig's default
  } else if (is_gpt_oss) {
    config.head_dim = 64;  // GptOssConfig's default
  } else {
    if (config.hidden_size % config.num_attention_heads != 0) {
      reader.fail("head_dim", "is missing and hidden_size (" + std::to_string(config.hidden_size) +
                                  ") is not divisible by num_attention_heads (" +
                                  std::to_string(config.num_attention_heads) + ")");
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.head_dim % 2 != 0) {
    reader.fail("head_dim",
                "must be even for rotary embeddings, got " + std::to_string(config.head_dim));
  }
  if (config.num_key_value_heads > config.num_attention_heads ||
      config.num_attention_heads % config.num_key_value_heads != 0) {
    reader.fail("num_key_value_heads", "must divide num_attention_heads (" +
                                           std::to_string(config.num_attention_heads) + "), got " +
                                           std::to_string(config.num_key_value_heads));
  }

  config.rotary_dim = config.head_dim;
  if (is_phi3 || config.glm || is_glm4_moe) {
    // transformers: int(head_dim * partial_rotary_factor), at the top level
    // or (as transformers 5 writes it) in rope_parameters; GlmConfig's and
    // Glm4MoeConfig's default is 0.5.
    const double default_partial = config.glm || is_glm4_moe ? 0.5 : 1.0;
    double partial = 0;
    if (!reader.has("partial_rotary_factor") && reader.has("rope_parameters") &&
        root["rope_parameters"].is_object() &&
        root["rope_parameters"].contains("partial_rotary_factor")) {
      partial = FieldReader(root["rope_parameters"], source_name, "rope_parameters.")
                    .positiveNumber("partial_rotary_factor", default_partial);
    } else {
      partial = reader.positiveNumber("partial_rotary_factor", default_partial);
    }
    // A factor above 1 is refused before the product is made an integer
    // (a huge one does not fit in one).
    const int64_t rotary_dim =
        partial <= 1.0 ? static_cast<int64_t>(static_cast<double>(config.head_dim) * partial) : 0;
    if (!(partial <= 1.0) || rotary_dim < 2 || rotary_dim % 2 != 0) {
      reader.fail("partial_rotary_factor",
                  "must give an even number of rotary dims from 2 to head_dim (" +
                      std::to_string(config.head_dim) + ") as int(head_dim x factor), got " +
                      json(partial).dump() +
                      (partial <= 1.0 ? " (" + std::to_string(rotary_dim) + " dims)" : ""));
    }
    config.rotary_dim = rotary_dim;
  }

  // GlmConfig's, MixtralConfig's, Phi3Config's, Olmo2Config's and
  // Glm4MoeConfig's own defaults differ from the others'.
  config.rms_norm_eps = reader.positiveNumber(
      "rms_norm_eps", config.glm ? 1.5625e-7
                      : is_mixtral || is_phi3 || config.olmo2 || is_ministral3 || is_glm4_moe ||
                              is_gpt_oss || is_olmoe
                          ? 1e-5
                          : 1e-6);
  config.rope_theta = reader.positiveNumber("rope_theta", is_mixtral || is_gemma3 ? 1e6
                                                          : is_smollm3            ? 2e6
                                                          : is_gpt_oss            ? 150000.0
                                                                                  : 10000.0);
  if (is_gemma3) config.rope_local_base_freq = reader.positiveNumber("rope_local_base_freq", 1e4);
  if (is_gemma3 && reader.has("rope_parameters") && root["rope_parameters"].is_object() &&
      root["rope_parameters"].contains("full_attention")) {
    // transformers 5 writes Gemma 3's rotary parameters per layer type.
    const json& parameters = root["rope_parameters"];
    for (const char* kind : {"full_attention", "sliding_attention"}) {
      const std::string field = std::string("rope_parameters.") + kind;
      if (!parameters.contains(kind) || !parameters[kind].is_object()) {
        reader.fail("rope_parameters",
                    std::string("must give an object for ") + kind + ", got " + parameters.dump());
      }
      const RopeScaling scaling = parseRopeScaling(parameters[kind], source_name, field);
      const double theta = FieldReader(parameters[kind], source_name, field + ".")
                               .positiveNumber("rope_theta", std::string(kind) == "full_attention"
                                                                 ? config.rope_theta
                                                                 : config.rope_local_base_freq);
      if (std::string(kind) == "full_attention") {
        config.rope_scaling = scaling;
        config.rope_theta = theta;
      } else {
        if (scaling.type != RopeScaling::Type::kNone) {
          throw Error(source_name + ": field \"" + field +
                      "\" scales the sliding layers' rotary frequencies, which is not "
                      "supported (accepted: rope_type default)");
        }
        config.rope_local_base_freq = theta;
      }
    }
  } else if (reader.has("rope_scaling")) {
    const json& scaling = root["rope_scaling"];
    if (!scaling.is_object()) {
      reader.fail("rope_scaling", "must be null or an object with \"rope_type\": \"llama3\", got " +
                                      scaling.dump());
    }
    config.rope_scaling = parseRopeScaling(scaling, source_name, "rope_scaling");
  } else if (reader.has("rope_parameters")) {
    const json& parameters = root["rope_parameters"];
    if (!parameters.is_object()) {
      reader.fail("rope_parameters", "must be an object, got " + parameters.dump());
    }
    config.rope_scaling = parseRopeScaling(parameters, source_name, "rope_parameters");
    config.rope_theta = FieldReader(parameters, source_name, "rope_parameters.")
                            .positiveNumber("rope_theta", config.rope_theta);
  }

  if (is_gemma2) {
    // Gemma 2 rotates every layer alike (the sliding layers' frequencies
    // are the full ones).
    if (config.rope_scaling.type != RopeScaling::Type::kNone) {
      reader.fail("rope_scaling",
                  "is set; Gemma2ForCausalLM's rotary scaling is not supported "
                  "(accepted: null)");
    }
    config.rope_local_base_freq = config.rope_theta;
  }
  // OLMo 3's sliding layers rotate as its full ones would unscaled.
  if (config.olmo3) config.rope_local_base_freq = config.rope_theta;
  if (is_ministral3) readLlama4Scaling(reader, root, config);
  const int64_t default_max_positions =
      is_ministral3                                                                      ? 262144
      : is_qwen2 || is_qwen3 || is_qwen3_moe || is_smollm3 || is_qwen2_moe               ? 32768
      : is_mistral || is_mixtral || is_gemma3 || config.glm || is_glm4_moe || is_gpt_oss ? 131072
      : is_gemma2                                                                        ? 8192
      : is_phi3 || is_olmoe                                                              ? 4096
                                                                                         : 2048;
  config.max_position_embeddings =
      reader.boundedInt("max_position_embeddings", default_max_positions, kMaxPositionEmbeddings);
  if (config.rope_scaling.type == RopeScaling::Type::kLongRope) {
    readLongRope(reader, config);
  }
  if (config.rope_scaling.type == RopeScaling::Type::kYarn) {
    // Its blend divides by ln(rope_theta).
    if (!(config.rope_theta > 1.0)) {
      reader.fail("rope_theta", "must be greater than 1 with yarn scaling, got " +
                                    json(config.rope_theta).dump());
    }
    settleYarnContext(config);
  }
  // Gemma and SmolLM3 tie their embeddings unless told otherwise.
  config.tie_word_embeddings = reader.boolean("tie_word_embeddings", is_gemma || is_smollm3);
  if (is_smollm3) readNopeLayers(reader, root, config);
  // Qwen2's attention always has q/k/v biases whatever the config says;
  // Qwen2-MoE's unless qkv_bias says otherwise (transformers 5's field;
  // earlier configs have none and always biases); Mistral's and Phi-3's
  // never have them; GLM's by default.
  config.attention_bias = is_qwen2       ? true
                          : is_qwen2_moe ? reader.boolean("qkv_bias", true)
                          : is_mistral || is_mixtral || is_phi3
                              ? false
                              : reader.boolean("attention_bias", config.glm || is_gpt_oss);
  // GLM-4.5's per-head q/k norms are optional (GLM-4.5 and 4.6 have them,
  // GLM-4.5-Air not).
  config.qk_norm = is_qwen3 || is_qwen3_moe || is_gemma3 || config.fullQkNorm() ||
                   (is_glm4_moe && reader.boolean("use_qk_norm", false));
  if (is_gemma) readGemma(reader, root, is_gemma2, config);
  if (config.olmo3) {
    readLayerWindows(
        reader, root, 4096, [](int64_t layer) { return (layer + 1) % 4 != 0; }, config);
  }
  if (config.granite) {
    // GraniteConfig's defaults: 1.0 each.
    config.embedding_multiplier = reader.positiveNumber("embedding_multiplier", 1.0);
    config.attention_multiplier = reader.positiveNumber("attention_multiplier", 1.0);
    config.residual_multiplier = reader.positiveNumber("residual_multiplier", 1.0);
    config.logits_scaling = reader.positiveNumber("logits_scaling", 1.0);
  }
  if (is_mixtral || is_qwen3_moe || is_glm4_moe || is_qwen2_moe || is_gpt_oss ||
      config.graniteMoe() || is_olmoe) {
    readExperts(reader, root, config);
  }
  // OLMoE's (and OLMo's) clip_qkv clamps q, k and v; the published OLMoE
  // configs leave it null.
  if (is_olmoe && reader.has("clip_qkv") && !root["clip_qkv"].is_null()) {
    reader.fail("clip_qkv", "is set; clipping q/k/v is not supported (accepted: null)");
  }
  if (is_gpt_oss) {
    readLayerWindows(
        reader, root, 128, [](int64_t layer) { return layer % 2 == 0; }, config);
  }

  if (reader.boolean("mlp_bias", false)) {
    reader.fail("mlp_bias", "is true; MLP biases are not supported (accepted: false)");
  }
  // transformers' Mistral and Mixtral attend within sliding_window
  // positions whenever it is set (Qwen2 and Qwen3-MoE only with
  // use_sliding_window, refused below).
  if (is_mistral || is_mixtral || is_phi3) {
    config.sliding_window = reader.boundedInt("sliding_window", 0, kMaxPositionEmbeddings);
    if (config.sliding_window > 0) {
      config.sliding_layers.assign(static_cast<size_t>(config.num_hidden_layers), true);
    }
  }
  if (reader.boolean("use_sliding_window", false)) {
    reader.fail("use_sliding_window",
                "is true; sliding-window attention is not supported (accepted: false)");
  }
  if (!is_gemma) {
    const std::string hidden_act = reader.string("hidden_act", "silu");
    if (hidden_act != "silu") {
      reader.fail("hidden_act",
                  "is \"" + hidden_act + "\", which is not supported (accepted: silu)");
    }
  }

  // transformers renamed torch_dtype to dtype; accept either.
  const char* dtype_key = reader.has("torch_dtype") ? "torch_dtype" : "dtype";
  if (reader.has(dtype_key)) {
    const std::string name = reader.string(dtype_key, "");
    std::optional<DType> dtype = dtypeFromTorchName(name);
    if (!dtype) {
      reader.fail(
          dtype_key,
          "is \"" + name + "\", which is not supported (accepted: bfloat16, float16, float32)");
    }
    config.torch_dtype = *dtype;
  }

  if (reader.has("quantization_config")) {
    config.quantization = parseQuantization(root["quantization_config"], source_name);
    if (config.mxfp4() && !is_gpt_oss) {
      throw Error(source_name +
                  ": field \"quantization_config.quant_method\" is \"mxfp4\", which is "
                  "supported for GptOssForCausalLM's experts only (accepted for " +
                  config.architecture + ": fp8, compressed-tensors)");
    }
  }

  if (reader.has("bos_token_id")) {
    config.bos_token_id = reader.tokenId("bos_token_id", root["bos_token_id"], config.vocab_size);
  }
  if (reader.has("eos_token_id")) {
    const json& eos = root["eos_token_id"];
    if (eos.is_array()) {
      for (const json& id : eos) {
        config.eos_token_ids.push_back(reader.tokenId("eos_token_id", id, config.vocab_size));
      }
    } else {
      config.eos_token_ids.push_back(reader.tokenId("eos_token_id", eos, config.vocab_size));
    }
  }
  // A theta far below 1 (or a tiny llama3 factor) overflows the float
  // frequencies the attention rotates by.
  for (float frequency : ropeInverseFrequencies(config)) {
    if (!std::isfinite(frequency)) {
      std::ostringstream theta;
      theta << config.rope_theta;
      reader.fail("rope_theta", "is " + theta.str() +
                                    ", whose rotary frequencies (with rope_scaling) overflow a "
                                    "float (accepted: values giving finite frequencies, such as "
                                    "10000 or 500000)");
    }
  }
  return config;
}

const char* Fp8Quantization::scaleName() const {
  return method == "fp8" && granularity == Granularity::kBlock ? "weight_scale_inv"
                                                               : "weight_scale";
}

std::string Fp8Quantization::scaleTensorOf(const std::string& weight) const {
  constexpr std::string_view kWeight = "weight";
  const std::string_view stem =
      std::string_view(weight).ends_with(kWeight)
          ? std::string_view(weight).substr(0, weight.size() - kWeight.size())
          : std::string_view(weight);
  return std::string(stem) + scaleName();
}

std::pair<int64_t, int64_t> Fp8Quantization::scaleBlock(int64_t rows, int64_t cols) const {
  switch (granularity) {
    case Granularity::kChannel:
      return {1, cols};
    case Granularity::kBlock:
      return {block_rows, block_cols};
    case Granularity::kNone:
    case Granularity::kTensor:
      break;
  }
  return {rows, cols};
}

const char* granularityName(Fp8Quantization::Granularity granularity) {
  switch (granularity) {
    case Fp8Quantization::Granularity::kNone:
      return "none";
    case Fp8Quantization::Granularity::kTensor:
      return "tensor";
    case Fp8Quantization::Granularity::kChannel:
      return "channel";
    case Fp8Quantization::Granularity::kBlock:
      return "block";
  }
  return "?";
}

std::string ModelConfig::toJsonText() const {
  // nlohmann::json keeps object keys sorted, which makes the text deterministic.
  json root;
  root["architectures"] = json::array({architecture});
  root["model_type"] = model_type;
  root["hidden_size"] = hidden_size;
  root["intermediate_size"] = intermediate_size;
  root["num_hidden_layers"] = num_hidden_layers;
  root["num_attention_heads"] = num_attention_heads;
  root["num_key_value_heads"] = num_key_value_heads;
  root["head_dim"] = head_dim;
  root["hidden_act"] = "silu";
  root["rms_norm_eps"] = rms_norm_eps;
  root["rope_theta"] = rope_theta;
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    root["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings},
    };
  } else if (gptOss() || ministral3()) {
    // Their readers give a missing (or null) rope_scaling their own YaRN
    // defaults, so unscaled rotation is written as the explicit "default".
    root["rope_scaling"] = {{"rope_type", "default"}};
  } else {
    root["rope_scaling"] = nullptr;
  }
  if (rope_scaling.type == RopeScaling::Type::kLinear) {
    root["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  }
  if (rope_scaling.type == RopeScaling::Type::kLongRope) {
    // As Phi-3.5 and Phi-4-mini publish it: original_max_position_embeddings
    // at the top level.
    root["rope_scaling"] = {{"type", "longrope"},
                            {"short_factor", rope_scaling.short_factor},
                            {"long_factor", rope_scaling.long_factor}};
    root["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    // What a published config leaves to its default is left out; the rest
    // is written as vLLM reads it.
    if (rope_scaling.factor != 1.0) root["rope_scaling"]["factor"] = rope_scaling.factor;
    const double mscale = longRopeDefaultMscale(*this);
    if (rope_scaling.short_mscale != mscale || rope_scaling.long_mscale != mscale) {
      root["rope_scaling"]["short_mscale"] = rope_scaling.short_mscale;
      root["rope_scaling"]["long_mscale"] = rope_scaling.long_mscale;
    }
  }
  if (rope_scaling.type == RopeScaling::Type::kYarn) {
    // As Qwen's model cards give it; what is left to its default is left
    // out.
    root["rope_scaling"] = {
        {"rope_type", "yarn"},
        {"factor", rope_scaling.factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
    if (rope_scaling.beta_fast != 32.0) root["rope_scaling"]["beta_fast"] = rope_scaling.beta_fast;
    if (rope_scaling.beta_slow != 1.0) root["rope_scaling"]["beta_slow"] = rope_scaling.beta_slow;
    if (!rope_scaling.truncate) root["rope_scaling"]["truncate"] = false;
    if (rope_scaling.attention_factor != yarnDefaultAttentionFactor(rope_scaling.factor)) {
      root["rope_scaling"]["attention_factor"] = rope_scaling.attention_factor;
    }
  }
  // Ministral 3 without rotary parameters would read as Ministral3Config's
  // defaults, so they are written even when plain.
  if ((ministral3() || llama4_scaling_beta > 0) && root["rope_scaling"].is_null()) {
    root["rope_scaling"] = {{"rope_type", "default"}};
  }
  if (llama4_scaling_beta > 0) {
    // In the rotary parameters' object, whose original context it shares
    // with YaRN's.
    root["rope_scaling"]["llama_4_scaling_beta"] = llama4_scaling_beta;
    root["rope_scaling"]["original_max_position_embeddings"] = llama4_scaling_original;
  }
  if (architecture == "SmolLM3ForCausalLM") {
    json flags = json::array();
    for (int64_t i = 0; i < num_hidden_layers; ++i) flags.push_back(nopeLayer(i) ? 0 : 1);
    root["no_rope_layers"] = flags;
  }
  if (granite) {
    root["embedding_multiplier"] = embedding_multiplier;
    root["attention_multiplier"] = attention_multiplier;
    root["residual_multiplier"] = residual_multiplier;
    root["logits_scaling"] = logits_scaling;
  }
  if ((phi3 && rotary_dim != head_dim) || glm || glm4Moe()) {
    // The factor that int(head_dim x factor) reads back as rotary_dim.
    double factor = static_cast<double>(rotary_dim) / static_cast<double>(head_dim);
    while (static_cast<int64_t>(static_cast<double>(head_dim) * factor) < rotary_dim) {
      factor = std::nextafter(factor, 2.0);
    }
    root["partial_rotary_factor"] = factor;
  }
  root["max_position_embeddings"] = max_position_embeddings;
  if (sliding_window > 0) root["sliding_window"] = sliding_window;
  if (gemma || ((olmo3 || gptOss()) && !sliding_layers.empty())) {
    json types = json::array();
    for (bool sliding : sliding_layers)
      types.push_back(sliding ? "sliding_attention" : "full_attention");
    root["layer_types"] = types;
  } else if (olmo3 || gptOss()) {
    root["layer_types"] = json::array();
    for (int64_t i = 0; i < num_hidden_layers; ++i) root["layer_types"].push_back("full_attention");
  }
  if (gemma) {
    root["model_type"] = model_type;
    root.erase("hidden_act");
    root["hidden_activation"] = "gelu_pytorch_tanh";
    root["query_pre_attn_scalar"] = query_pre_attn_scalar;
    root["rope_local_base_freq"] = rope_local_base_freq;
    root["attn_logit_softcapping"] =
        attn_logit_softcapping > 0 ? json(attn_logit_softcapping) : json(nullptr);
    root["final_logit_softcapping"] =
        final_logit_softcapping > 0 ? json(final_logit_softcapping) : json(nullptr);
    if (architecture == "Gemma2ForCausalLM") root.erase("rope_local_base_freq");
  }
  root["vocab_size"] = vocab_size;
  root["tie_word_embeddings"] = tie_word_embeddings;
  root["attention_bias"] = attention_bias;
  root["torch_dtype"] = dtypeTorchName(torch_dtype);
  if (architecture == "MixtralForCausalLM" || gptOss() || graniteMoe()) {
    root["num_local_experts"] = num_experts;
    root["num_experts_per_tok"] = num_experts_per_tok;
    if (gptOss()) root["swiglu_limit"] = swiglu_limit;
  } else if (architecture == "Qwen3MoeForCausalLM" || qwen2Moe()) {
    if (qwen2Moe()) {
      root["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
      root["qkv_bias"] = attention_bias;
    }
    root["num_experts"] = num_experts;
    root["num_experts_per_tok"] = num_experts_per_tok;
    root["moe_intermediate_size"] = moe_intermediate_size;
    root["norm_topk_prob"] = norm_topk_prob;
    root["decoder_sparse_step"] = decoder_sparse_step;
    root["mlp_only_layers"] = mlp_only_layers;
  } else if (glm4Moe()) {
    root["n_routed_experts"] = num_experts;
    root["num_experts_per_tok"] = num_experts_per_tok;
    root["moe_intermediate_size"] = moe_intermediate_size;
    root["norm_topk_prob"] = norm_topk_prob;
    root["n_shared_experts"] = n_shared_experts;
    root["routed_scaling_factor"] = routed_scaling_factor;
    root["n_group"] = n_group;
    root["topk_group"] = topk_group;
    root["first_k_dense_replace"] = first_k_dense_replace;
    root["use_qk_norm"] = qk_norm;
  } else if (olmoe()) {
    // Experts of intermediate_size on every layer, as OlmoeConfig holds them.
    root["num_experts"] = num_experts;
    root["num_experts_per_tok"] = num_experts_per_tok;
    root["norm_topk_prob"] = norm_topk_prob;
    root["clip_qkv"] = nullptr;
  }
  if (mxfp4()) {
    // As the published checkpoints give it.
    root["quantization_config"] = {{"quant_method", "mxfp4"},
                                   {"modules_to_not_convert",
                                    {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                     "model.embed_tokens", "lm_head"}}};
  }
  if (quantized()) {
    const bool block = quantization.granularity == Fp8Quantization::Granularity::kBlock;
    if (quantization.method == "fp8") {
      root["quantization_config"] = {
          {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}};
      if (block) {
        root["quantization_config"]["weight_block_size"] = {quantization.block_rows,
                                                            quantization.block_cols};
      }
    } else {
      json weights = {{"num_bits", 8},
                      {"type", "float"},
                      {"symmetric", true},
                      {"dynamic", false},
                      {"strategy", granularityName(quantization.granularity)}};
      if (block) weights["block_structure"] = {quantization.block_rows, quantization.block_cols};
      root["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                     {"format", "float-quantized"},
                                     {"ignore", {"lm_head"}},
                                     {"config_groups",
                                      {{"group_0",
                                        {{"targets", {"Linear"}},
                                         {"weights", weights},
                                         {"input_activations",
                                          {{"num_bits", 8},
                                           {"type", "float"},
                                           {"strategy", "token"},
                                           {"dynamic", true},
                                           {"symmetric", true}}}}}}}};
    }
  }
  root["bos_token_id"] = bos_token_id >= 0 ? json(bos_token_id) : json(nullptr);
  if (eos_token_ids.empty()) {
    root["eos_token_id"] = nullptr;
  } else if (eos_token_ids.size() == 1) {
    root["eos_token_id"] = eos_token_ids[0];
  } else {
    root["eos_token_id"] = eos_token_ids;
  }
  if (conditionalGeneration()) {
    // As the checkpoints publish it: the language model's fields in
    // text_config, the architecture and the outer model type above it.
    json text = std::move(root);
    text.erase("architectures");
    root = {
        {"architectures", json::array({architecture})},
        {"model_type", architecture == "Gemma3ForConditionalGeneration" ? "gemma3" : "mistral3"},
        {"text_config", std::move(text)}};
  }
  return root.dump(2) + "\n";
}

std::string ModelConfig::computeDigest() const {
  // nlohmann::json keeps object keys sorted and prints doubles so that they
  // read back exactly: one text per configuration.
  json math = {
      {"architecture", architecture},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"rope_scaling", rope_scaling.type == RopeScaling::Type::kLlama3
                           ? json{{"factor", rope_scaling.factor},
                                  {"low_freq_factor", rope_scaling.low_freq_factor},
                                  {"high_freq_factor", rope_scaling.high_freq_factor},
                                  {"original_max_position_embeddings",
                                   rope_scaling.original_max_position_embeddings}}
                           : json(nullptr)},
      {"vocab_size", vocab_size},
      {"tie_word_embeddings", tie_word_embeddings},
      {"attention_bias", attention_bias},
      {"qk_norm", qk_norm},
  };
  if (rope_scaling.type == RopeScaling::Type::kYarn) {
    math["rope_scaling"] = {
        {"yarn",
         {{"factor", rope_scaling.factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings},
          {"beta_fast", rope_scaling.beta_fast},
          {"beta_slow", rope_scaling.beta_slow},
          {"truncate", rope_scaling.truncate},
          {"attention_factor", rope_scaling.attention_factor}}}};
  }
  // Linear scaling's factor, and LongRoPE's factors in use with their
  // attention factor, on any architecture (Phi-3's LongRoPE is in its own
  // entry below).
  if (rope_scaling.type == RopeScaling::Type::kLinear) {
    math["rope_scaling"] = {{"linear", rope_scaling.factor}};
  }
  if (rope_scaling.type == RopeScaling::Type::kLongRope && !phi3) {
    math["rope_scaling"] = {
        {"longrope",
         {{"factors", rope_scaling.use_long ? rope_scaling.long_factor : rope_scaling.short_factor},
          {"attention_factor", ropeAttentionFactor()}}}};
  }
  // Only mixtures name their experts: a dense model's digest is what it
  // was before mixtures were read.
  if (num_experts > 0) {
    math["experts"] = {{"num_experts", num_experts},
                       {"num_experts_per_tok", num_experts_per_tok},
                       {"moe_intermediate_size", moe_intermediate_size},
                       {"norm_topk_prob", norm_topk_prob},
                       {"decoder_sparse_step", decoder_sparse_step},
                       {"mlp_only_layers", mlp_only_layers}};
    // And only Qwen2-MoE its gated shared expert.
    if (qwen2Moe()) math["experts"]["gated_shared_expert"] = shared_expert_intermediate_size;
    // And only sigmoid routing its groups, scale, shared experts and dense
    // layers (the softmax mixtures' digests are unchanged by it).
    if (sigmoid_routing) {
      math["experts"]["sigmoid_routing"] = {{"n_group", n_group},
                                            {"topk_group", topk_group},
                                            {"routed_scaling_factor", routed_scaling_factor},
                                            {"n_shared_experts", n_shared_experts},
                                            {"first_k_dense_replace", first_k_dense_replace}};
    }
  }
  // And only GPT-OSS its activation's limit (its sinks and biases come with
  // the architecture's name).
  if (gptOss()) math["gpt_oss"] = {{"swiglu_limit", swiglu_limit}};
  // And GLM-4.5 its rotary dims (its pairs are the halves).
  if (glm4Moe()) math["glm4_moe"] = {{"rotary_dim", rotary_dim}};
  // And only Gemma 3 its own arithmetic.
  if (gemma) {
    math["gemma"] = {{"query_pre_attn_scalar", query_pre_attn_scalar},
                     {"rope_local_base_freq", rope_local_base_freq},
                     {"sliding_window", sliding_window},
                     {"sliding_layers", sliding_layers}};
    if (attn_logit_softcapping > 0 || final_logit_softcapping > 0) {
      math["gemma"]["softcapping"] = {attn_logit_softcapping, final_logit_softcapping};
    }
  }
  // And only Phi-3 its rotary dims and the LongRoPE factors in use.
  if (phi3) {
    json rope = nullptr;
    if (rope_scaling.type == RopeScaling::Type::kLongRope) {
      rope = {
          {"factors", rope_scaling.use_long ? rope_scaling.long_factor : rope_scaling.short_factor},
          {"attention_factor", ropeAttentionFactor()}};
    }
    math["phi3"] = {{"rotary_dim", rotary_dim}, {"longrope", rope}};
  }
  // And only OLMo 2 its norms' places (its q/k norm is qk_norm's, across
  // the heads).
  if (olmo2) math["olmo2"] = true;
  // And only GLM its rotary dims and pairs, and GLM-4 its sandwich norms.
  if (glm) math["glm"] = {{"rotary_dim", rotary_dim}, {"interleaved", true}, {"sandwich", glm4}};
  // And only Ministral 3 its query scale.
  if (llama4_scaling_beta > 0) {
    math["llama4_scaling"] = {llama4_scaling_beta, llama4_scaling_original};
  }
  // And only SmolLM3 the layers it does not rotate.
  if (!nope_layers.empty()) math["nope_layers"] = nope_layers;
  // And only Granite its four scalars.
  if (granite) {
    math["granite"] = {embedding_multiplier, attention_multiplier, residual_multiplier,
                       logits_scaling};
  }
  // A window on every layer (Mistral v0.1, Phi-3-mini-4k) changes what
  // sequences longer than it compute; on some layers (OLMo 3), which ones
  // too.
  if (!gemma && !sliding_layers.empty()) {
    math["sliding_window"] = sliding_window;
    if (std::find(sliding_layers.begin(), sliding_layers.end(), false) != sliding_layers.end()) {
      math["sliding_layers"] = sliding_layers;
    }
  }
  // Likewise only quantized models name how (the scales' granularity
  // decides the order of the matmul's roundings).
  if (quantized()) {
    math["quantization"] = {{"granularity", granularityName(quantization.granularity)},
                            {"block_rows", quantization.block_rows},
                            {"block_cols", quantization.block_cols}};
  }
  const std::string text = math.dump();
  return hex64(XXH3_64bits(text.data(), text.size()));
}

double yarnDefaultAttentionFactor(double factor) { return yarnMscale(factor, 1.0); }

std::vector<float> ropeInverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.rotary_dim > 0 ? config.rotary_dim : config.head_dim;
  const int64_t half = dim / 2;
  std::vector<float> result(static_cast<size_t>(half));
  const RopeScaling& scaling = config.rope_scaling;
  const double pi = std::acos(-1.0);
  // YaRN's blend runs over the pairs from `low` to `high`: those that turn
  // beta_fast and beta_slow times within the original context.
  double low = 0.0;
  double high = 0.0;
  if (scaling.type == RopeScaling::Type::kYarn) {
    const auto pairAt = [&](double rotations) {
      return static_cast<double>(dim) *
             std::log(static_cast<double>(scaling.original_max_position_embeddings) /
                      (rotations * 2.0 * pi)) /
             (2.0 * std::log(config.rope_theta));
    };
    low = pairAt(scaling.beta_fast);
    high = pairAt(scaling.beta_slow);
    if (scaling.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    const double power =
        std::pow(config.rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim));
    double inv_freq = 1.0 / power;
    if (scaling.type == RopeScaling::Type::kLlama3) {
      // Hugging Face's _compute_llama3_parameters: long wavelengths are slowed
      // by `factor`, short ones kept, and the band between interpolated.
      const double old_context = static_cast<double>(scaling.original_max_position_embeddings);
      const double low_freq_wavelen = old_context / scaling.low_freq_factor;
      const double high_freq_wavelen = old_context / scaling.high_freq_factor;
      const double wavelen = 2.0 * pi / inv_freq;
      if (wavelen > low_freq_wavelen) {
        inv_freq = inv_freq / scaling.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (old_context / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        inv_freq = (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq;
      }
    } else if (scaling.type == RopeScaling::Type::kLinear) {
      inv_freq = inv_freq / scaling.factor;
    } else if (scaling.type == RopeScaling::Type::kLongRope) {
      const std::vector<double>& factors =
          scaling.use_long ? scaling.long_factor : scaling.short_factor;
      inv_freq = 1.0 / (factors[static_cast<size_t>(i)] * power);
    } else if (scaling.type == RopeScaling::Type::kYarn) {
      // Hugging Face's _compute_yarn_parameters: kept below `low`, divided
      // by `factor` above `high`, linear between.
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      inv_freq = inv_freq / scaling.factor * ramp + inv_freq * (1.0 - ramp);
    }
    result[static_cast<size_t>(i)] = static_cast<float>(inv_freq);
  }
  return result;
}

std::vector<float> localRopeInverseFrequencies(const ModelConfig& config) {
  ModelConfig local = config;
  local.rope_theta = config.rope_local_base_freq;
  local.rope_scaling = RopeScaling{};
  return ropeInverseFrequencies(local);
}

}  // namespace tandem::engine
