#include "agent/engine/lora.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "agent/engine/safetensors.h"
#include "common/dtype.h"
#include "common/file_text.h"
#include "common/hex.h"
#include "common/json_parse.h"
#include "common/status.h"

namespace tandem::engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
constexpr const char* kTensorPrefix = "base_model.model.model.layers.";

// Where an adapter's layers are: PEFT names them after the model class's
// modules, so an adapter of a checkpoint with a vision tower
// (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration) has
// its language model's layers under language_model.model. (transformers
// before 4.52) or model.language_model. (4.52 and later), as the
// checkpoint's tensors are.
std::vector<std::string> layerPrefixes(const ModelConfig& model) {
  if (model.conditionalGeneration()) {
    return {"base_model.model.language_model.model.layers.",
            "base_model.model.model.language_model.layers."};
  }
  return {kTensorPrefix};
}
// Ranks past this are not low-rank updates of any supported model.
constexpr int64_t kMaxRank = 4096;

// Fused projections (Phi3ForCausalLM has no q_proj or gate_proj, GLM no
// gate_proj): an adapter of one holds one A for its parts and a B whose rows
// are theirs, in the matrix's order. Their module numbers follow
// LoraModule's.
struct FusedLoraModule {
  const char* name;
  std::vector<int> parts;
  bool (ModelConfig::*fused_in)() const;  // whether the model's checkpoint fuses them
};
const std::array<FusedLoraModule, 2> kFusedLoraModules = {{
    {"self_attn.qkv_proj", {kLoraQ, kLoraK, kLoraV}, &ModelConfig::fusedQkv},
    {"mlp.gate_up_proj", {kLoraGate, kLoraUp}, &ModelConfig::fusedGateUp},
}};

// The module of the model's checkpoint that adapter module `module` adapts:
// the fused one holding it, else its own.
std::string checkpointModuleName(const ModelConfig& model, int module) {
  for (const FusedLoraModule& fused : kFusedLoraModules) {
    if ((model.*fused.fused_in)() &&
        std::find(fused.parts.begin(), fused.parts.end(), module) != fused.parts.end()) {
      return fused.name;
    }
  }
  return kLoraModuleNames[static_cast<size_t>(module)];
}

// Where `name` (a tensor of the adapter) belongs: layer, module (LoraModule,
// or kLoraModules + i for kFusedLoraModules[i]) and whether it is lora_A;
// false when it is not a projection's lora_A or lora_B.
bool parseTensorName(const std::string& name, const std::vector<std::string>& prefixes,
                     int64_t& layer, int& module, bool& is_a) {
  const auto prefix = std::find_if(prefixes.begin(), prefixes.end(), [&](const std::string& p) {
    return name.compare(0, p.size(), p) == 0;
  });
  if (prefix == prefixes.end()) return false;
  size_t pos = prefix->size();
  size_t end = name.find('.', pos);
  // Decimal without leading zeros: one tensor has one name.
  if (end == std::string::npos || end == pos || end - pos > 9 ||
      (name[pos] == '0' && end - pos > 1)) {
    return false;
  }
  layer = 0;
  for (size_t i = pos; i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    layer = layer * 10 + (name[i] - '0');
  }
  const std::string rest = name.substr(end + 1);
  for (int m = 0; m < kLoraModules + std::ssize(kFusedLoraModules); ++m) {
    const std::string module_name =
        m < kLoraModules ? kLoraModuleNames[static_cast<size_t>(m)]
                         : kFusedLoraModules[static_cast<size_t>(m - kLoraModules)].name;
    for (const bool a : {true, false}) {
      if (rest == module_name + (a ? ".lora_A.weight" : ".lora_B.weight")) {
        module = m;
        is_a = a;
        return true;
      }
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<LoraAdapter> LoraAdapter::load(const std::string& name, const fs::path& dir,
                                               const ModelConfig& model) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw Error("LoRA adapter " + name + ": " + dir.string() +
                " is not a directory (expected one holding " + kConfigFile + " and " +
                kWeightsFile + ")");
  }
  const fs::path config_path = dir / kConfigFile;
  const std::optional<std::string> config_file = readModelFile(config_path);
  if (!config_file) throw Error(config_path.string() + ": cannot read");
  const std::string& config_text = *config_file;
  JsonParseError parse_error;
  const auto parsed = parseJson(config_text, parse_error);
  if (!parsed || !parsed->is_object()) {
    throw Error(config_path.string() + ": not a JSON object" +
                (parsed ? std::string() : ": " + parse_error.detail));
  }
  const json& config = *parsed;
  auto fail = [&](const std::string& field, const std::string& what) {
    throw Error(config_path.string() + ": field \"" + field + "\" " + what);
  };
  // Set to anything but its "off" value (absent, null, false, empty).
  auto set = [&](const char* field) {
    const auto it = config.find(field);
    if (it == config.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_string()) return it->get<std::string>() != "none" && !it->get<std::string>().empty();
    return !it->empty();
  };

  if (const auto it = config.find("peft_type");
      it != config.end() && !(it->is_string() && it->get<std::string>() == "LORA")) {
    fail("peft_type", "must be \"LORA\", got " + it->dump());
  }
  const auto rank_it = config.find("r");
  if (rank_it == config.end() || !rank_it->is_number_integer() || rank_it->get<int64_t>() <= 0 ||
      rank_it->get<int64_t>() > kMaxRank) {
    fail("r", "must be a positive integer at most " + std::to_string(kMaxRank) + ", got " +
                  (rank_it == config.end() ? std::string("nothing") : rank_it->dump()));
  }
  const auto alpha_it = config.find("lora_alpha");
  if (alpha_it != config.end() &&
      (!alpha_it->is_number() || !std::isfinite(alpha_it->get<double>()) ||
       alpha_it->get<double>() <= 0)) {
    fail("lora_alpha", "must be a positive number, got " + alpha_it->dump());
  }
  const auto rslora_it = config.find("use_rslora");
  if (rslora_it != config.end() && !rslora_it->is_null() && !rslora_it->is_boolean()) {
    fail("use_rslora", "must be true or false, got " + rslora_it->dump());
  }
  // What this engine does not apply: refused rather than served wrong.
  // alora_invocation_tokens (Activated LoRA) adapts only the tokens after
  // an invocation sequence: applied to every token it would be another
  // model.
  for (const char* field : {"use_dora", "fan_in_fan_out", "modules_to_save", "rank_pattern",
                            "alpha_pattern", "layer_replication", "alora_invocation_tokens"}) {
    if (set(field)) {
      fail(field, std::string("is set (") + config[field].dump() +
                      "), which Tandem does not apply (accepted: absent, null, false or empty)");
    }
  }
  if (set("bias")) fail("bias", "is " + config["bias"].dump() + " (accepted: \"none\")");
  // PiSSA, OLoRA, CorDA and LoftQ change the base weights too: saved as
  // they are, the adapter needs that changed model (PEFT converts them to
  // plain LoRA, and writes init_lora_weights true, when saved with
  // path_initial_model_for_weight_conversion).
  if (const auto it = config.find("init_lora_weights"); it != config.end() && it->is_string()) {
    const std::string init = it->get<std::string>();
    for (const char* changes_base : {"pissa", "olora", "corda", "loftq"}) {
      if (init.rfind(changes_base, 0) == 0) {
        fail("init_lora_weights",
             "is " + it->dump() +
                 ", which changes the base model's weights as well: save the adapter converted "
                 "to plain LoRA (PEFT's path_initial_model_for_weight_conversion)");
      }
    }
  }

  std::unique_ptr<LoraAdapter> adapter(new LoraAdapter());
  adapter->name_ = name;
  adapter->directory_ = dir;
  adapter->rank_ = rank_it->get<int64_t>();
  // PEFT's default lora_alpha is 8.
  const double alpha = alpha_it == config.end() ? 8.0 : alpha_it->get<double>();
  const bool rslora =
      rslora_it != config.end() && rslora_it->is_boolean() && rslora_it->get<bool>();
  adapter->scale_ = alpha / (rslora ? std::sqrt(static_cast<double>(adapter->rank_))
                                    : static_cast<double>(adapter->rank_));

  const fs::path weights_path = dir / kWeightsFile;
  if (!fs::exists(weights_path, error)) {
    throw Error("LoRA adapter " + name + ": " + dir.string() + " has no " + kWeightsFile +
                " (adapter_model.bin is not read: convert it to safetensors)");
  }
  SafetensorsFile weights(weights_path);
  const int64_t q_size = model.num_attention_heads * model.head_dim;
  const int64_t kv_size = model.num_key_value_heads * model.head_dim;
  // [in, out] of each module, in LoraModule order.
  const std::array<std::pair<int64_t, int64_t>, kLoraModules> shapes = {{
      {model.hidden_size, q_size},
      {model.hidden_size, kv_size},
      {model.hidden_size, kv_size},
      {q_size, model.hidden_size},
      {model.hidden_size, model.intermediate_size},
      {model.hidden_size, model.intermediate_size},
      {model.intermediate_size, model.hidden_size},
  }};
  adapter->layers_.resize(static_cast<size_t>(model.num_hidden_layers));
  const std::string file = weights_path.string();
  const std::vector<std::string> prefixes = layerPrefixes(model);
  std::string accepted_prefixes;
  for (const std::string& prefix : prefixes) {
    accepted_prefixes += (accepted_prefixes.empty() ? "" : " or ") + prefix;
  }
  if (prefixes.size() > 1) accepted_prefixes += ", then ";
  // The checkpoint's own module names, each once, by block:
  // "self_attn.q_proj/k_proj/v_proj/o_proj, mlp.gate_up_proj/down_proj".
  std::vector<std::string> names;
  for (int m = 0; m < kLoraModules; ++m) {
    const std::string name = checkpointModuleName(model, m);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::string accepted_modules;
  std::string block;
  for (const std::string& name : names) {
    const size_t dot = name.find('.');
    const std::string name_block = name.substr(0, dot + 1);
    accepted_modules += name_block == block ? "/" + name.substr(dot + 1)
                                            : (accepted_modules.empty() ? "" : ", ") + name;
    block = name_block;
  }
  for (const auto& [tensor_name, tensor] : weights.tensors()) {
    int64_t layer = 0;
    int module = 0;
    bool is_a = false;
    const bool parsed = parseTensorName(tensor_name, prefixes, layer, module, is_a);
    const bool fused = parsed && module >= kLoraModules;
    // Adapters name the checkpoint's modules, fused or not.
    if (!parsed ||
        (fused ? !(model.*kFusedLoraModules[static_cast<size_t>(module - kLoraModules)].fused_in)()
               : checkpointModuleName(model, module) !=
                     kLoraModuleNames[static_cast<size_t>(module)])) {
      throw Error("tensor " + tensor_name + " in " + file +
                  " is not a LoRA matrix of a projection Tandem adapts in " + model.architecture +
                  " (accepted: " + accepted_prefixes +
                  "<layer>.<module>.lora_A.weight and lora_B.weight, module one of " +
                  accepted_modules +
                  (prefixes.size() > 1 ? "; the vision tower is not adapted" : "") + ")");
    }
    if (layer >= model.num_hidden_layers) {
      throw Error("tensor " + tensor_name + " in " + file + " names layer " +
                  std::to_string(layer) + ", but the model has " +
                  std::to_string(model.num_hidden_layers) + " layers");
    }
    if (module >= kLoraGate && model.isMoeLayer(layer)) {
      throw Error("tensor " + tensor_name + " in " + file + " adapts the MLP of layer " +
                  std::to_string(layer) +
                  ", a mixture of experts, whose experts adapters do not reach (accepted in "
                  "such a layer: self_attn.q_proj/k_proj/v_proj/o_proj)");
    }
    // A fused module's parts: one A for all, B's rows split among them.
    const std::vector<int> parts =
        fused ? kFusedLoraModules[static_cast<size_t>(module - kLoraModules)].parts
              : std::vector<int>{module};
    const int64_t in = shapes[static_cast<size_t>(parts[0])].first;
    int64_t out = 0;
    for (int part : parts) out += shapes[static_cast<size_t>(part)].second;
    const std::vector<int64_t> expected =
        is_a ? std::vector<int64_t>{adapter->rank_, in} : std::vector<int64_t>{out, adapter->rank_};
    if (tensor.shape != expected) {
      throw Error("tensor " + tensor_name + " in " + file + " has shape " +
                  shapeText(tensor.shape) + ", expected " + shapeText(expected) +
                  " (r = " + std::to_string(adapter->rank_) + " from " + kConfigFile +
                  ", the projection's sizes from the model)");
    }
    if (tensor.dtype != DType::kF32 && tensor.dtype != DType::kBF16 &&
        tensor.dtype != DType::kF16) {
      throw Error("tensor " + tensor_name + " in " + file + " has dtype " +
                  dtypeSafetensorsName(tensor.dtype) + " (accepted: F32, BF16, F16)");
    }
    if (const std::optional<NonFiniteElement> bad = firstNonFinite(tensor)) {
      throw Error("tensor " + tensor_name + " in " + file + " holds " + bad->kind + " at " +
                  elementPosition(tensor.shape, bad->index) + " (accepted: finite values)");
    }
    std::vector<float> values(static_cast<size_t>(expected[0] * expected[1]));
    convertToF32(tensor.dtype, tensor.data, values.data(), values.size());
    size_t b_row = 0;
    for (int part : parts) {
      LoraPair& pair = adapter->layers_[static_cast<size_t>(layer)][static_cast<size_t>(part)];
      pair.rank = adapter->rank_;
      pair.in = in;
      pair.out = shapes[static_cast<size_t>(part)].second;
      if (is_a) {
        pair.a = values;
      } else {
        const auto begin = values.begin() + static_cast<ptrdiff_t>(b_row * adapter->rank_);
        pair.b_scaled.assign(begin, begin + static_cast<ptrdiff_t>(pair.out * adapter->rank_));
        b_row += static_cast<size_t>(pair.out);
      }
    }
  }
  bool adapted = false;
  for (int64_t layer = 0; layer < model.num_hidden_layers; ++layer) {
    for (int module = 0; module < kLoraModules; ++module) {
      LoraPair& pair = adapter->layers_[static_cast<size_t>(layer)][static_cast<size_t>(module)];
      if (pair.rank == 0) continue;
      if (pair.a.empty() || pair.b_scaled.empty()) {
        throw Error("tensor " + prefixes.front() + std::to_string(layer) + "." +
                    checkpointModuleName(model, module) +
                    (pair.a.empty() ? ".lora_A.weight" : ".lora_B.weight") + " missing from " +
                    file + " (its pair is there)");
      }
      for (float& value : pair.b_scaled) {
        value = static_cast<float>(static_cast<double>(value) * adapter->scale_);
        // A large finite value times lora_alpha / r can pass float's range.
        if (!std::isfinite(value)) {
          throw Error("tensor " + prefixes.front() + std::to_string(layer) + "." +
                      checkpointModuleName(model, module) + ".lora_B.weight in " + file +
                      " holds a value that times the scaling (lora_alpha / r = " +
                      std::to_string(adapter->scale_) + ") is past float's range");
        }
      }
      adapted = true;
    }
  }
  if (!adapted) throw Error(file + " holds no LoRA matrices");

  const uint64_t parts[2] = {XXH3_64bits(config_text.data(), config_text.size()),
                             weights.contentDigest()};
  adapter->digest_ = hex64(XXH3_64bits(parts, sizeof parts));
  return adapter;
}

std::vector<LoraModuleSpec> parseLoraModuleSpecs(const std::string& text) {
  std::vector<LoraModuleSpec> specs;
  if (text.empty()) return specs;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t equals = entry.find('=');
    const bool spaced = entry.find_first_of(" \t\n\r") < equals;
    if (equals == std::string::npos || equals == 0 || equals + 1 == entry.size() || spaced) {
      throw Error("--lora-modules: \"" + entry +
                  "\" is not NAME=PATH (the name requests give as \"model\", then the PEFT "
                  "adapter directory; several comma-separated, no spaces)");
    }
    specs.push_back({entry.substr(0, equals), fs::path(entry.substr(equals + 1))});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return specs;
}

}  // namespace tandem::engine
