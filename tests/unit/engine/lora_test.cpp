// Loading PEFT LoRA adapters: the matrices, scale and digest of a good
// adapter; every refusal names the file, field or tensor; --lora-modules'
// NAME=PATH list.
#include "agent/engine/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/engine/safetensors.h"
#include "common/dtype.h"
#include "common/status.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::testing::TempDir;

const ModelConfig& tinyConfig() {
  static const ModelConfig config = tools::presetConfig("tiny", "LlamaForCausalLM");
  return config;
}

// A good adapter (tandem-model lora's) in a directory of its own.
struct AdapterDir {
  TempDir dir{"tandem-lora-test"};
  explicit AdapterDir(const tools::TestLoraOptions& options = {}) {
    tools::writeTestLoraAdapter(options, tinyConfig(), dir.path());
  }
  const fs::path& path() const { return dir.path(); }
  json config() const {
    return json::parse(::tandem::testing::readFile(path() / "adapter_config.json"));
  }
  void setConfig(const json& config) const {
    ::tandem::testing::writeFile(path() / "adapter_config.json", config.dump());
  }
  // Replaces the weights with `tensors` (name -> shape), each filled with
  // `value`.
  void setTensors(const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                  float value = 0.25f) const {
    SafetensorsWriter writer;
    for (const auto& [name, shape] : tensors) {
      int64_t count = 1;
      for (int64_t d : shape) count *= d;
      std::vector<float> values(static_cast<size_t>(count), value);
      std::vector<uint8_t> bytes(values.size() * sizeof(float));
      std::memcpy(bytes.data(), values.data(), bytes.size());
      writer.add(name, DType::kF32, shape, std::move(bytes));
    }
    writer.write(path() / "adapter_model.safetensors");
  }
};

std::string loadError(const fs::path& dir) {
  try {
    LoraAdapter::load("sql", dir, tinyConfig());
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

const std::string kQ = "base_model.model.model.layers.0.self_attn.q_proj.";

TEST(LoraAdapter, LoadsEveryProjectionScaledAsPeftDoes) {
  const ModelConfig& config = tinyConfig();
  AdapterDir written;
  auto adapter = LoraAdapter::load("sql", written.path(), config);
  EXPECT_EQ(adapter->name(), "sql");
  EXPECT_EQ(adapter->rank(), 8);
  EXPECT_DOUBLE_EQ(adapter->scale(), 2.0);  // lora_alpha 16 / r 8
  ASSERT_EQ(adapter->numLayers(), config.num_hidden_layers);
  const int64_t q_size = config.num_attention_heads * config.head_dim;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (int module = 0; module < kLoraModules; ++module) {
      EXPECT_EQ(adapter->pair(layer, module).rank, 8) << layer << " " << module;
    }
  }
  const LoraPair& q = adapter->pair(0, kLoraQ);
  EXPECT_EQ(q.in, config.hidden_size);
  EXPECT_EQ(q.out, q_size);
  ASSERT_EQ(q.a.size(), static_cast<size_t>(8 * config.hidden_size));
  ASSERT_EQ(q.b_scaled.size(), static_cast<size_t>(q_size * 8));
  // B as written, times the scale.
  SafetensorsFile file(written.path() / "adapter_model.safetensors");
  const TensorInfo* b = file.find(kQ + "lora_B.weight");
  ASSERT_NE(b, nullptr);
  const float* raw = static_cast<const float*>(b->data);
  for (size_t i = 0; i < q.b_scaled.size(); ++i) ASSERT_EQ(q.b_scaled[i], raw[i] * 2.0f) << i;
  const TensorInfo* a = file.find(kQ + "lora_A.weight");
  EXPECT_EQ(std::memcmp(q.a.data(), a->data, a->num_bytes), 0);

  // The digest follows the files, not the name or directory.
  AdapterDir same;
  EXPECT_EQ(LoraAdapter::load("other", same.path(), config)->digest(), adapter->digest());
  tools::TestLoraOptions other_seed;
  other_seed.seed = 2;
  AdapterDir different(other_seed);
  EXPECT_NE(LoraAdapter::load("sql", different.path(), config)->digest(), adapter->digest());
}

TEST(LoraAdapter, RsLoraScalesByTheRootOfTheRankAndUnadaptedModulesStayUnset) {
  tools::TestLoraOptions options;
  options.rank = 4;
  options.alpha = 6.0;
  options.rslora = true;
  options.dtype = DType::kBF16;
  options.modules = {"q_proj", "v_proj"};
  AdapterDir written(options);
  auto adapter = LoraAdapter::load("qv", written.path(), tinyConfig());
  EXPECT_DOUBLE_EQ(adapter->scale(), 3.0);  // 6 / sqrt(4)
  EXPECT_EQ(adapter->pair(0, kLoraQ).rank, 4);
  EXPECT_EQ(adapter->pair(0, kLoraV).rank, 4);
  for (int module : {kLoraK, kLoraO, kLoraGate, kLoraUp, kLoraDown}) {
    EXPECT_EQ(adapter->pair(0, module).rank, 0) << module;
    EXPECT_TRUE(adapter->pair(0, module).a.empty());
  }
}

TEST(LoraAdapter, WhatCannotBeAppliedIsRefusedNamingTheField) {
  struct Case {
    const char* field;
    json value;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"use_dora", true, "field \"use_dora\" is set (true), which Tandem does not apply"},
      {"bias", "all", "field \"bias\" is \"all\" (accepted: \"none\")"},
      {"modules_to_save", json::array({"lm_head"}), "field \"modules_to_save\" is set"},
      {"rank_pattern", json{{"q_proj", 16}}, "field \"rank_pattern\" is set"},
      {"fan_in_fan_out", true, "field \"fan_in_fan_out\" is set"},
      {"peft_type", "IA3", "field \"peft_type\" must be \"LORA\", got \"IA3\""},
      {"r", 0, "field \"r\" must be a positive integer at most 4096, got 0"},
      {"r", "8", "field \"r\" must be a positive integer"},
      {"lora_alpha", -1, "field \"lora_alpha\" must be a positive number, got -1"},
      {"use_rslora", "yes", "field \"use_rslora\" must be true or false"},
      {"alora_invocation_tokens", json::array({5, 6}),
       "field \"alora_invocation_tokens\" is set ([5,6])"},
      {"init_lora_weights", "pissa_niter_4",
       "field \"init_lora_weights\" is \"pissa_niter_4\", which changes the base model's weights"},
      {"init_lora_weights", "loftq", "field \"init_lora_weights\" is \"loftq\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    AdapterDir written;
    json config = written.config();
    config[c.field] = c.value;
    written.setConfig(config);
    const std::string error = loadError(written.path());
    EXPECT_NE(error.find("adapter_config.json"), std::string::npos) << error;
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
  // Harmless settings load: bias "none", empty modules_to_save, no DoRA.
  AdapterDir plain;
  json config = plain.config();
  config["modules_to_save"] = json::array();
  config["use_dora"] = false;
  config["rank_pattern"] = json::object();
  config["alora_invocation_tokens"] = nullptr;
  config["init_lora_weights"] = "gaussian";  // how A was drawn: nothing to apply
  plain.setConfig(config);
  EXPECT_EQ(loadError(plain.path()), "(loaded)");
  config.erase("r");
  plain.setConfig(config);
  EXPECT_NE(loadError(plain.path())
                .find("field \"r\" must be a positive integer at most 4096, got "
                      "nothing"),
            std::string::npos);
}

TEST(LoraAdapter, BadTensorsAreRefusedNamingTheTensor) {
  const ModelConfig& c = tinyConfig();
  const int64_t q_size = c.num_attention_heads * c.head_dim;
  struct Case {
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{{kQ + "lora_A.weight", {8, c.hidden_size}}, {kQ + "lora_B.weight", {q_size, 4}}},
       "tensor " + kQ + "lora_B.weight in "},
      {{{kQ + "lora_A.weight", {8, c.hidden_size}}},
       "tensor " + kQ + "lora_B.weight missing from "},
      {{{"base_model.model.lm_head.lora_A.weight", {8, c.hidden_size}}},
       "tensor base_model.model.lm_head.lora_A.weight in "},
      {{{"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {q_size}}},
       "is not a LoRA matrix of a projection Tandem adapts"},
      {{{"base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight", {8, c.hidden_size}}},
       "names layer 99, but the model has " + std::to_string(c.num_hidden_layers) + " layers"},
      {{}, "holds no LoRA matrices"},
      // One tensor, one name: a layer with a leading zero is not one.
      {{{"base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight", {8, c.hidden_size}}},
       "tensor base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight in "},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.expected);
    AdapterDir written;
    written.setTensors(k.tensors);
    const std::string error = loadError(written.path());
    EXPECT_NE(error.find(k.expected), std::string::npos) << error;
  }
  // The shape mismatch says what was expected.
  AdapterDir shaped;
  shaped.setTensors(
      {{kQ + "lora_A.weight", {8, c.hidden_size}}, {kQ + "lora_B.weight", {q_size, 4}}});
  EXPECT_NE(loadError(shaped.path())
                .find("has shape [" + std::to_string(q_size) + ", 4], expected [" +
                      std::to_string(q_size) + ", 8]"),
            std::string::npos);
  AdapterDir poisoned;
  poisoned.setTensors(
      {{kQ + "lora_A.weight", {8, c.hidden_size}}, {kQ + "lora_B.weight", {q_size, 8}}},
      std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE(
      loadError(poisoned.path())
          .find("lora_A.weight in " + (poisoned.path() / "adapter_model.safetensors").string() +
                " holds NaN at [0, 0] (accepted: finite values)"),
      std::string::npos)
      << loadError(poisoned.path());
  // Finite, but past float's range once scaled (lora_alpha 16 / r 8 = 2):
  // it served garbage.
  AdapterDir overflowing;
  overflowing.setTensors(
      {{kQ + "lora_A.weight", {8, c.hidden_size}}, {kQ + "lora_B.weight", {q_size, 8}}}, 3e38f);
  EXPECT_NE(loadError(overflowing.path())
                .find("q_proj.lora_B.weight in " +
                      (overflowing.path() / "adapter_model.safetensors").string() +
                      " holds a value that times the scaling (lora_alpha / r = 2.000000) is past "
                      "float's range"),
            std::string::npos)
      << loadError(overflowing.path());
}

// Phi-3's adapters (PEFT on Phi3ForCausalLM) adapt its fused qkv_proj and
// gate_up_proj: one A for the parts, B's rows split among them in the
// matrix's order. Separate q_proj... names are refused for Phi-3, fused ones
// for other models, each naming the modules accepted.
TEST(LoraAdapter, Phi3FusedModulesAreSplitIntoTheirParts) {
  const ModelConfig phi3 = tools::presetConfig("tiny", "Phi3ForCausalLM");
  TempDir dir("tandem-lora-phi3");
  tools::writeTestLoraAdapter({}, phi3, dir.path());
  const std::unique_ptr<LoraAdapter> adapter = LoraAdapter::load("sql", dir.path(), phi3);
  SafetensorsFile file(dir.path() / "adapter_model.safetensors");
  const std::string layer = "base_model.model.model.layers.1.";
  EXPECT_EQ(file.find(layer + "self_attn.q_proj.lora_A.weight"), nullptr);
  auto values = [&](const std::string& name) {
    const TensorInfo* info = file.find(name);
    EXPECT_NE(info, nullptr) << name;
    std::vector<float> out(info ? info->num_bytes / dtypeSize(info->dtype) : 0);
    if (info) convertToF32(info->dtype, info->data, out.data(), out.size());
    return out;
  };
  const int64_t q = phi3.num_attention_heads * phi3.head_dim;
  const int64_t kv = phi3.num_key_value_heads * phi3.head_dim;
  const int64_t inter = phi3.intermediate_size;
  const std::pair<std::string, std::vector<std::pair<int, int64_t>>> fused[] = {
      {"self_attn.qkv_proj", {{kLoraQ, q}, {kLoraK, kv}, {kLoraV, kv}}},
      {"mlp.gate_up_proj", {{kLoraGate, inter}, {kLoraUp, inter}}}};
  for (const auto& [name, parts] : fused) {
    SCOPED_TRACE(name);
    const std::vector<float> a = values(layer + name + ".lora_A.weight");
    const std::vector<float> b = values(layer + name + ".lora_B.weight");
    int64_t row = 0;
    for (const auto& [module, rows] : parts) {
      const LoraPair& pair = adapter->pair(1, module);
      EXPECT_EQ(pair.a, a);
      ASSERT_EQ(pair.out, rows);
      ASSERT_EQ(pair.b_scaled.size(), static_cast<size_t>(rows * adapter->rank()));
      for (int64_t i = 0; i < rows * adapter->rank(); ++i) {
        ASSERT_EQ(pair.b_scaled[i],
                  static_cast<float>(double{b[row * adapter->rank() + i]} * adapter->scale()));
      }
      row += rows;
    }
    EXPECT_EQ(row * adapter->rank(), std::ssize(b));
  }
  EXPECT_EQ(adapter->pair(1, kLoraO).out, phi3.hidden_size);

  auto refusal = [](const ModelConfig& model, const std::string& tensor,
                    std::vector<int64_t> a_shape) {
    AdapterDir written;
    written.setTensors({{tensor, a_shape}});
    try {
      LoraAdapter::load("sql", written.path(), model);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_NE(refusal(phi3, kQ + "lora_A.weight", {8, phi3.hidden_size})
                .find("is not a LoRA matrix of a projection Tandem adapts in Phi3ForCausalLM "
                      "(accepted: base_model.model.model.layers.<layer>.<module>.lora_A.weight "
                      "and lora_B.weight, module one of self_attn.qkv_proj/o_proj, "
                      "mlp.gate_up_proj/down_proj)"),
            std::string::npos);
  EXPECT_NE(refusal(tinyConfig(), layer + "self_attn.qkv_proj.lora_A.weight",
                    {8, tinyConfig().hidden_size})
                .find("in LlamaForCausalLM (accepted: "),
            std::string::npos);
  EXPECT_NE(refusal(phi3, layer + "mlp.gate_up_proj.lora_A.weight", {8, phi3.hidden_size})
                .find("tensor " + layer + "mlp.gate_up_proj.lora_B.weight missing from "),
            std::string::npos);

  // GLM fuses gate and up only: its adapters name q_proj, k_proj, v_proj
  // and gate_up_proj (PEFT's target_modules for GLM-4).
  const ModelConfig glm4 = tools::presetConfig("tiny", "Glm4ForCausalLM");
  TempDir glm_dir("tandem-lora-glm4");
  tools::writeTestLoraAdapter({}, glm4, glm_dir.path());
  const std::unique_ptr<LoraAdapter> glm_adapter = LoraAdapter::load("sql", glm_dir.path(), glm4);
  SafetensorsFile glm_file(glm_dir.path() / "adapter_model.safetensors");
  EXPECT_NE(glm_file.find(layer + "self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_NE(glm_file.find(layer + "mlp.gate_up_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(glm_file.find(layer + "mlp.gate_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(glm_adapter->pair(1, kLoraQ).out, glm4.num_attention_heads * glm4.head_dim);
  EXPECT_EQ(glm_adapter->pair(1, kLoraGate).out, glm4.intermediate_size);
  EXPECT_EQ(glm_adapter->pair(1, kLoraUp).out, glm4.intermediate_size);
  EXPECT_EQ(glm_adapter->pair(1, kLoraGate).a, glm_adapter->pair(1, kLoraUp).a);
  EXPECT_NE(refusal(glm4, layer + "mlp.gate_proj.lora_A.weight", {8, glm4.hidden_size})
                .find("in Glm4ForCausalLM (accepted: "
                      "base_model.model.model.layers.<layer>.<module>.lora_A.weight and "
                      "lora_B.weight, module one of self_attn.q_proj/k_proj/v_proj/o_proj, "
                      "mlp.gate_up_proj/down_proj)"),
            std::string::npos);
  EXPECT_NE(refusal(glm4, layer + "self_attn.qkv_proj.lora_A.weight", {8, glm4.hidden_size})
                .find("in Glm4ForCausalLM (accepted: "),
            std::string::npos);
}

// Gemma 3 4B and up are published as Gemma3ForConditionalGeneration, Mistral
// Small 3.1 and 3.2 as Mistral3ForConditionalGeneration, and PEFT names
// their adapters' layers as the checkpoint's:
// language_model.model.layers (transformers before 4.52) or
// model.language_model.layers (4.52 and later). Either loads as the same
// adapter of the language model; the vision tower's modules, and the plain
// model.layers names, are refused naming what is accepted.
class ConditionalLoraTest : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(ConditionalLoraTest, AdaptersNameTheLanguageModel) {
  const auto& [causal_architecture, conditional_architecture] = GetParam();
  const ModelConfig causal = tools::presetConfig("tiny", causal_architecture);
  json text = json::parse(causal.toJsonText());
  json top = {{"architectures", {conditional_architecture}},
              {"vision_config", {{"hidden_size", 4}}}};
  text.erase("architectures");
  top["text_config"] = text;
  const ModelConfig conditional = ModelConfig::fromJsonText(top.dump(), "config.json");
  ASSERT_EQ(conditional.num_hidden_layers, causal.num_hidden_layers);

  TempDir plain("tandem-lora-causal");
  tools::writeTestLoraAdapter({}, causal, plain.path());
  const std::unique_ptr<LoraAdapter> expected = LoraAdapter::load("sql", plain.path(), causal);
  // The same tensors under `prefix` instead of base_model.model.model., and
  // `extra` tensors.
  auto renamed = [&](const TempDir& dir, const std::string& prefix,
                     const std::vector<std::string>& extra = {}) {
    fs::copy_file(plain.path() / "adapter_config.json", dir.path() / "adapter_config.json");
    SafetensorsFile file(plain.path() / "adapter_model.safetensors");
    SafetensorsWriter writer;
    const std::string from = "base_model.model.model.";
    for (const auto& [name, tensor] : file.tensors()) {
      const auto* data = static_cast<const uint8_t*>(tensor.data);
      writer.add(prefix + name.substr(from.size()), tensor.dtype, tensor.shape,
                 std::vector<uint8_t>(data, data + tensor.num_bytes));
    }
    for (const std::string& name : extra) {
      writer.add(name, DType::kF32, {8, 4}, std::vector<uint8_t>(8 * 4 * sizeof(float)));
    }
    writer.write(dir.path() / "adapter_model.safetensors");
  };
  for (const char* prefix :
       {"base_model.model.language_model.model.", "base_model.model.model.language_model."}) {
    SCOPED_TRACE(prefix);
    TempDir dir("tandem-lora-conditional");
    renamed(dir, prefix);
    const std::unique_ptr<LoraAdapter> adapter = LoraAdapter::load("sql", dir.path(), conditional);
    for (int64_t layer = 0; layer < causal.num_hidden_layers; ++layer) {
      for (int module = 0; module < kLoraModules; ++module) {
        EXPECT_EQ(adapter->pair(layer, module).a, expected->pair(layer, module).a);
        EXPECT_EQ(adapter->pair(layer, module).b_scaled, expected->pair(layer, module).b_scaled);
      }
    }
    EXPECT_EQ(adapter->pair(1, kLoraDown).out, causal.hidden_size);
  }
  auto refusal = [&](const std::string& prefix, const std::vector<std::string>& extra) {
    TempDir dir("tandem-lora-conditional-refused");
    renamed(dir, prefix, extra);
    try {
      LoraAdapter::load("sql", dir.path(), conditional);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  const std::string vision =
      "base_model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A.weight";
  EXPECT_NE(
      refusal("base_model.model.language_model.model.", {vision}).find("tensor " + vision + " in "),
      std::string::npos);
  EXPECT_NE(refusal("base_model.model.model.", {})
                .find("(accepted: base_model.model.language_model.model.layers. or "
                      "base_model.model.model.language_model.layers., then "
                      "<layer>.<module>.lora_A.weight and lora_B.weight, module one of "
                      "self_attn.q_proj/k_proj/v_proj/o_proj, mlp.gate_proj/up_proj/down_proj; "
                      "the vision tower is not adapted)"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    VisionCheckpoints, ConditionalLoraTest,
    ::testing::Values(std::pair{"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"},
                      std::pair{"MistralForCausalLM", "Mistral3ForConditionalGeneration"}),
    [](const ::testing::TestParamInfo<std::pair<const char*, const char*>>& info) {
      return std::string(info.param.second);
    });

TEST(LoraAdapter, MissingFilesAreNamed) {
  TempDir empty("tandem-lora-empty");
  EXPECT_NE(loadError(empty.path() / "absent").find("is not a directory"), std::string::npos);
  EXPECT_NE(loadError(empty.path()).find("adapter_config.json: cannot read"), std::string::npos);
  AdapterDir written;
  fs::rename(written.path() / "adapter_model.safetensors", written.path() / "adapter_model.bin");
  EXPECT_NE(loadError(written.path())
                .find("has no adapter_model.safetensors (adapter_model.bin is "
                      "not read: convert it to safetensors)"),
            std::string::npos);
}

// LoraAdapter.AMixtureLayersMlpIsRefusedNamingTheTensor for one mixture.
void expectMixtureMlpRefused(const ModelConfig& moe) {
  ASSERT_FALSE(moe.isMoeLayer(0));
  ASSERT_TRUE(moe.isMoeLayer(1));
  TempDir all("tandem-lora-moe");
  tools::TestLoraOptions named;  // the seven named: a mixture layer's MLP too
  named.modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  tools::writeTestLoraAdapter(named, moe, all.path());
  std::string error = "(loaded)";
  try {
    LoraAdapter::load("sql", all.path(), moe);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("tensor base_model.model.model.layers.1.mlp."), std::string::npos) << error;
  EXPECT_NE(error.find("adapts the MLP of layer 1, a mixture of experts, whose experts adapters "
                       "do not reach (accepted in such a layer: "
                       "self_attn.q_proj/k_proj/v_proj/o_proj)"),
            std::string::npos)
      << error;

  TempDir attention("tandem-lora-moe-attention");
  tools::TestLoraOptions options;
  options.modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  tools::writeTestLoraAdapter(options, moe, attention.path());
  std::unique_ptr<LoraAdapter> adapter = LoraAdapter::load("sql", attention.path(), moe);
  EXPECT_GT(adapter->pair(1, kLoraQ).rank, 0);
  EXPECT_EQ(adapter->pair(1, kLoraGate).rank, 0);

  // tandem-model lora's default set leaves a mixture layer's MLP out: the
  // agent loads it (before, it wrote one the agent refused).
  TempDir defaults("tandem-lora-moe-default");
  tools::writeTestLoraAdapter({}, moe, defaults.path());
  adapter = LoraAdapter::load("sql", defaults.path(), moe);
  EXPECT_GT(adapter->pair(0, kLoraGate).rank, 0) << "a dense layer's MLP is adapted";
  EXPECT_GT(adapter->pair(1, kLoraQ).rank, 0);
  EXPECT_EQ(adapter->pair(1, kLoraGate).rank, 0);
}

// A mixture layer's experts are not adapted: an mlp module there is
// refused naming the tensor; the attention of such a layer, and the MLP of
// a dense layer of the same model (the tiny Qwen3-MoE's, GLM-4.5's and
// Qwen2-MoE's layer 0), load.
TEST(LoraAdapter, AMixtureLayersMlpIsRefusedNamingTheTensor) {
  for (const char* architecture :
       {"Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "Qwen2MoeForCausalLM"}) {
    SCOPED_TRACE(architecture);
    expectMixtureMlpRefused(tools::presetConfig("tiny", architecture));
  }
}

TEST(LoraModuleSpecs, AreNamePathPairsSeparatedByCommas) {
  EXPECT_TRUE(parseLoraModuleSpecs("").empty());
  const auto specs = parseLoraModuleSpecs("sql=/adapters/sql,chat=rel/chat");
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "sql");
  EXPECT_EQ(specs[0].path, "/adapters/sql");
  EXPECT_EQ(specs[1].name, "chat");
  EXPECT_EQ(specs[1].path, "rel/chat");
  for (const char* bad : {"sql", "=/x", "sql=", "a=/x,", "a=/x,,b=/y", "a=/x, b=/y", "a =/x"}) {
    SCOPED_TRACE(bad);
    try {
      parseLoraModuleSpecs(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not NAME=PATH"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem::engine
