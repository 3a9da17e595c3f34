// Model loading: config.json parsing, safetensors validation and Model::load,
// on tiny generated models and on copies corrupted one way at a time.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
#include "agent/engine/model_config.h"
#include "agent/engine/model_runner.h"
#include "agent/engine/safetensors.h"
#include "common/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory under the system temp dir, removed with everything in it.
using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;
using ::tandem::testing::writeFile;

fs::path writeTiny(const fs::path& dir, const std::string& architecture = "LlamaForCausalLM",
                   DType dtype = DType::kBF16) {
  tools::TestModelOptions options;
  options.preset = "tiny";
  options.architecture = architecture;
  options.dtype = dtype;
  options.seed = 7;
  tools::writeTestModel(options, dir);
  return dir;
}

// The message of the tandem::Error that loading `dir` throws ("" if none).
std::string loadError(const fs::path& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "Model::load(" << dir << ") did not throw";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

// A safetensors file split into its header JSON and data area, so tests can
// corrupt the header and write the file back.
struct RawSafetensors {
  json header;
  std::string data;

  static RawSafetensors read(const fs::path& path) {
    const std::string bytes = readFile(path);
    uint64_t length = 0;
    std::memcpy(&length, bytes.data(), sizeof length);
    return {json::parse(bytes.substr(8, length)), bytes.substr(8 + length)};
  }

  void write(const fs::path& path) const {
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t length = text.size();
    std::string bytes(reinterpret_cast<const char*>(&length), sizeof length);
    writeFile(path, bytes + text + data);
  }
};

void rewriteConfig(const fs::path& dir, const std::function<void(json&)>& edit) {
  json config = json::parse(readFile(dir / "config.json"));
  edit(config);
  writeFile(dir / "config.json", config.dump(2));
}

void rewriteHeader(const fs::path& dir, const std::function<void(json&)>& edit) {
  RawSafetensors raw = RawSafetensors::read(dir / "model.safetensors");
  edit(raw.header);
  raw.write(dir / "model.safetensors");
}

// Writes model.safetensors again without the tensor `missing`, as a
// checkpoint saved without it would be (its bytes gone too: a file with
// bytes no tensor names is refused).
void removeTensor(const fs::path& dir, const std::string& missing) {
  const fs::path path = dir / "model.safetensors";
  SafetensorsWriter writer;
  {
    SafetensorsFile file(path);
    ASSERT_NE(file.find(missing), nullptr) << missing;
    for (const auto& [name, tensor] : file.tensors()) {
      if (name == missing) continue;
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      writer.add(name, tensor.dtype, tensor.shape,
                 std::vector<uint8_t>(bytes, bytes + tensor.num_bytes));
    }
  }
  writer.write(path);
}

// Moves the tensors of model.safetensors into two shards plus an index: the
// embedding and layer 0 in the first, everything else in the second.
void shard(const fs::path& dir) {
  const fs::path single = dir / "model.safetensors";
  json weight_map = json::object();
  {
    SafetensorsFile file(single);
    SafetensorsWriter first;
    SafetensorsWriter second;
    for (const auto& [name, tensor] : file.tensors()) {
      const bool in_first =
          name.starts_with("model.embed_tokens.") || name.starts_with("model.layers.0.");
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      (in_first ? first : second)
          .add(name, tensor.dtype, tensor.shape,
               std::vector<uint8_t>(bytes, bytes + tensor.num_bytes));
      weight_map[name] =
          in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    first.write(dir / "model-00001-of-00002.safetensors");
    second.write(dir / "model-00002-of-00002.safetensors");
  }
  fs::remove(single);
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  writeFile(dir / "model.safetensors.index.json", index.dump(2));
}

size_t matrixBytes(const kernels::WeightView& view) {
  return static_cast<size_t>(view.rows * view.cols) * dtypeSize(view.dtype);
}

void expectSameMatrix(const kernels::WeightView& a, const kernels::WeightView& b) {
  ASSERT_EQ(a.rows, b.rows);
  ASSERT_EQ(a.cols, b.cols);
  ASSERT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(std::memcmp(a.data, b.data, matrixBytes(a)), 0);
}

void expectSameWeights(const ModelWeights& a, const ModelWeights& b) {
  expectSameMatrix(a.embed_tokens, b.embed_tokens);
  expectSameMatrix(a.lm_head, b.lm_head);
  EXPECT_EQ(a.norm, b.norm);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights& x = a.layers[i];
    const LayerWeights& y = b.layers[i];
    expectSameMatrix(x.q_proj, y.q_proj);
    expectSameMatrix(x.k_proj, y.k_proj);
    expectSameMatrix(x.v_proj, y.v_proj);
    expectSameMatrix(x.o_proj, y.o_proj);
    expectSameMatrix(x.gate_proj, y.gate_proj);
    expectSameMatrix(x.up_proj, y.up_proj);
    expectSameMatrix(x.down_proj, y.down_proj);
    EXPECT_EQ(x.input_layernorm, y.input_layernorm);
    EXPECT_EQ(x.post_attention_layernorm, y.post_attention_layernorm);
    EXPECT_EQ(x.q_bias, y.q_bias);
    EXPECT_EQ(x.k_bias, y.k_bias);
    EXPECT_EQ(x.v_bias, y.v_bias);
    EXPECT_EQ(x.q_norm, y.q_norm);
    EXPECT_EQ(x.k_norm, y.k_norm);
  }
}

// ---------------------------------------------------------------------------
// Good models

TEST(ModelLoading, LoadsTinyForEveryArchitectureAndDtype) {
  for (const char* architecture :
       {"LlamaForCausalLM", "MistralForCausalLM", "Ministral3ForCausalLM", "Qwen2ForCausalLM",
        "Qwen3ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM",
        "Olmo3ForCausalLM", "SmolLM3ForCausalLM", "GlmForCausalLM", "Glm4ForCausalLM",
        "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM",
        "GptOssForCausalLM", "GraniteMoeForCausalLM", "OlmoeForCausalLM"}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(architecture) + " " + dtypeShortName(dtype));
      TempDir dir;
      writeTiny(dir.path(), architecture, dtype);
      std::unique_ptr<Model> model = Model::load(dir.path());
      const ModelConfig& c = model->config();
      EXPECT_EQ(c.architecture, architecture);
      EXPECT_EQ(c.torch_dtype, dtype);
      EXPECT_EQ(model->weightDType(), dtype);
      EXPECT_EQ(model->directory(), dir.path());

      const ModelWeights& w = model->weights();
      EXPECT_EQ(w.embed_tokens.rows, c.vocab_size);
      EXPECT_EQ(w.embed_tokens.cols, c.hidden_size);
      EXPECT_EQ(w.lm_head.rows, c.vocab_size);
      // Granite's test model ties them, as Granite 3 does.
      EXPECT_EQ(w.lm_head.data == w.embed_tokens.data, c.tie_word_embeddings);
      ASSERT_EQ(w.layers.size(), static_cast<size_t>(c.num_hidden_layers));
      EXPECT_EQ(w.norm.size(), static_cast<size_t>(c.hidden_size));
      // GLM and GPT-OSS have q/k/v biases as Qwen2 does (GPT-OSS o_proj's
      // too).
      const bool qwen2 = std::string(architecture).starts_with("Qwen2") ||
                         std::string(architecture).starts_with("Glm") || c.gptOss();
      // GLM-4.5's test model has per-head q/k norms as Qwen3 (as GLM-4.5).
      const bool qwen3 = std::string(architecture).starts_with("Qwen3") || c.glm4Moe();
      int64_t index = 0;
      for (const LayerWeights& layer : w.layers) {
        EXPECT_EQ(layer.q_proj.rows, c.num_attention_heads * c.head_dim);
        EXPECT_EQ(layer.k_proj.rows, c.num_key_value_heads * c.head_dim);
        EXPECT_EQ(layer.o_proj.cols, c.num_attention_heads * c.head_dim);
        if (c.isMoeLayer(index++)) {
          EXPECT_EQ(layer.down_proj.data, nullptr);
          EXPECT_EQ(layer.router.rows, c.num_experts);
          EXPECT_EQ(layer.router.cols, c.hidden_size);
          ASSERT_EQ(std::ssize(layer.experts), c.num_experts);
          for (const ExpertWeights& expert : layer.experts) {
            EXPECT_EQ(expert.gate_proj.rows, c.moe_intermediate_size);
            EXPECT_EQ(expert.up_proj.rows, c.moe_intermediate_size);
            EXPECT_EQ(expert.down_proj.cols, c.moe_intermediate_size);
            EXPECT_EQ(expert.down_proj.rows, c.hidden_size);
            EXPECT_EQ(expert.gate_proj.dtype, dtype);
          }
          // GLM-4.5's router bias and shared expert.
          EXPECT_EQ(std::ssize(layer.router_bias), c.sigmoid_routing ? c.num_experts : 0);
          EXPECT_EQ(layer.shared_expert.gate_proj.rows, c.sharedExpertWidth());
          EXPECT_EQ(layer.shared_expert.down_proj.cols, c.sharedExpertWidth());
          EXPECT_EQ(layer.shared_expert.down_proj.rows,
                    c.sharedExpertWidth() > 0 ? c.hidden_size : 0);
          // Qwen2-MoE's shared expert gate.
          EXPECT_EQ(layer.shared_expert_gate.rows, c.qwen2Moe() ? 1 : 0);
          EXPECT_EQ(layer.shared_expert_gate.cols, c.qwen2Moe() ? c.hidden_size : 0);
        } else {
          EXPECT_EQ(layer.down_proj.cols, c.intermediate_size);
          EXPECT_TRUE(layer.experts.empty());
        }
        EXPECT_EQ(layer.q_bias.size(), qwen2 ? static_cast<size_t>(64) : 0u);
        EXPECT_EQ(layer.k_bias.size(), qwen2 ? static_cast<size_t>(32) : 0u);
        EXPECT_EQ(layer.v_bias.size(), qwen2 ? static_cast<size_t>(32) : 0u);
        EXPECT_EQ(layer.o_bias.size(), c.gptOss() ? static_cast<size_t>(c.hidden_size) : 0u);
        EXPECT_EQ(layer.sinks.size(), c.gptOss() ? static_cast<size_t>(4) : 0u);
        // OLMo 2's and OLMoE's q/k norms span the heads (4 x 16 and 2 x
        // 16); OLMo 2 has no input norm, and a norm after the MLP.
        const bool olmo2 = c.olmo2;
        // (OLMoE's 4 x 16 each: no grouped KV heads, as published.)
        EXPECT_EQ(layer.q_norm.size(), qwen3 ? 16u : c.fullQkNorm() ? 64u : 0u);
        EXPECT_EQ(layer.k_norm.size(), qwen3 ? 16u : c.olmoe() ? 64u : c.fullQkNorm() ? 32u : 0u);
        EXPECT_EQ(layer.input_layernorm.size(), olmo2 ? 0u : static_cast<size_t>(c.hidden_size));
        // GLM-4's sandwich: a norm before the MLP and one after it.
        EXPECT_EQ(layer.post_feedforward_layernorm.size(),
                  olmo2 || c.glm4 ? static_cast<size_t>(c.hidden_size) : 0u);
        EXPECT_EQ(layer.pre_feedforward_layernorm.size(),
                  c.glm4 ? static_cast<size_t>(c.hidden_size) : 0u);
        for (float weight : layer.input_layernorm) EXPECT_NEAR(weight, 1.0f, 0.11f);
      }

      // Every tensor in the file is used, so the model's bytes are the file's
      // data, and the matrices point into the mapping, not at copies.
      SafetensorsFile file(dir.path() / "model.safetensors");
      size_t file_bytes = 0;
      for (const auto& [name, tensor] : file.tensors()) file_bytes += tensor.num_bytes;
      EXPECT_EQ(model->weightBytes(), file_bytes);
      const TensorInfo* embed = file.find("model.embed_tokens.weight");
      ASSERT_NE(embed, nullptr);
      EXPECT_EQ(std::memcmp(w.embed_tokens.data, embed->data, embed->num_bytes), 0);

      // Vectors are converted to fp32 exactly.
      const TensorInfo* norm = file.find("model.norm.weight");
      ASSERT_NE(norm, nullptr);
      std::vector<float> expected(norm->num_bytes / dtypeSize(dtype));
      convertToF32(dtype, norm->data, expected.data(), expected.size());
      EXPECT_EQ(w.norm, expected);
    }
  }
}

TEST(ModelLoading, ShardedCheckpointLoadsTheSameWeights) {
  TempDir single;
  TempDir sharded;
  writeTiny(single.path(), "Qwen2ForCausalLM");
  writeTiny(sharded.path(), "Qwen2ForCausalLM");
  shard(sharded.path());
  ASSERT_FALSE(fs::exists(sharded.path() / "model.safetensors"));

  std::unique_ptr<Model> a = Model::load(single.path());
  std::unique_ptr<Model> b = Model::load(sharded.path());
  EXPECT_EQ(a->config(), b->config());
  EXPECT_EQ(a->weightBytes(), b->weightBytes());
  expectSameWeights(a->weights(), b->weights());
}

TEST(ModelLoading, TiedEmbeddingsShareTheEmbeddingMatrix) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteConfig(dir.path(), [](json& c) { c["tie_word_embeddings"] = true; });
  removeTensor(dir.path(), "lm_head.weight");
  std::unique_ptr<Model> model = Model::load(dir.path());
  EXPECT_EQ(model->weights().lm_head.data, model->weights().embed_tokens.data);
  EXPECT_EQ(model->weights().lm_head.rows, 512);
}

TEST(ModelLoading, ExtraTensorsAreIgnored) {
  TempDir dir;
  writeTiny(dir.path());
  RawSafetensors raw = RawSafetensors::read(dir.path() / "model.safetensors");
  const size_t end = raw.data.size();
  raw.data.append(64, '\0');
  raw.header["model.layers.0.self_attn.rotary_emb.inv_freq"] = {
      {"dtype", "F32"}, {"shape", {16}}, {"data_offsets", {end, end + 64}}};
  raw.write(dir.path() / "model.safetensors");
  EXPECT_NO_THROW(Model::load(dir.path()));
}

// ---------------------------------------------------------------------------
// Bad directories: each throws tandem::Error naming the problem.

TEST(ModelLoadingErrors, MissingDirectory) {
  TempDir dir;
  const std::string message = loadError(dir.path() / "nope");
  EXPECT_CONTAINS(message, "does not exist");
  EXPECT_CONTAINS(message, (dir.path() / "nope").string());
}

TEST(ModelLoadingErrors, PathIsAFile) {
  TempDir dir;
  writeFile(dir.path() / "file", "x");
  EXPECT_CONTAINS(loadError(dir.path() / "file"), "is not a directory");
}

TEST(ModelLoadingErrors, MissingConfig) {
  TempDir dir;
  writeTiny(dir.path());
  fs::remove(dir.path() / "config.json");
  EXPECT_CONTAINS(loadError(dir.path()), "has no config.json");
}

TEST(ModelLoadingErrors, ConfigIsNotJson) {
  TempDir dir;
  writeTiny(dir.path());
  writeFile(dir.path() / "config.json", "{\"hidden_size\": 64,");
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "config.json");
  EXPECT_CONTAINS(message, "not valid JSON");
}

TEST(ModelLoadingErrors, UnsupportedArchitecture) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteConfig(dir.path(), [](json& c) { c["architectures"] = {"GPT2LMHeadModel"}; });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "config.json");
  EXPECT_CONTAINS(message, "\"GPT2LMHeadModel\" is not supported");
  EXPECT_CONTAINS(message, "LlamaForCausalLM");
}

TEST(ModelLoadingErrors, MissingRequiredField) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteConfig(dir.path(), [](json& c) { c.erase("intermediate_size"); });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "config.json");
  EXPECT_CONTAINS(message, "\"intermediate_size\" is missing");
}

// A head_dim past what the attention kernels take is refused at load,
// naming the field: it loaded, and the first request failed a check.
TEST(ModelLoadingErrors, HeadDimPastTheAttentionKernels) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteConfig(dir.path(), [](json& c) { c["head_dim"] = 512; });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "config.json: head_dim 512 is more than the 256 the attention kernels");
}

TEST(ModelLoadingErrors, SafetensorsTruncatedInDataArea) {
  TempDir dir;
  writeTiny(dir.path());
  const fs::path file = dir.path() / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model.safetensors");
  // Tensors are laid out in name order; model.norm.weight comes last.
  EXPECT_CONTAINS(message, "tensor model.norm.weight");
  EXPECT_CONTAINS(message, "extend past end of file");
}

TEST(ModelLoadingErrors, SafetensorsTruncatedInHeader) {
  TempDir dir;
  writeTiny(dir.path());
  const fs::path file = dir.path() / "model.safetensors";
  fs::resize_file(file, 100);
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model.safetensors: truncated: header length");
  EXPECT_CONTAINS(message, "exceeds file size 100");
}

TEST(ModelLoadingErrors, SafetensorsShorterThanLengthField) {
  TempDir dir;
  writeTiny(dir.path());
  writeFile(dir.path() / "model.safetensors", "abc");
  EXPECT_CONTAINS(loadError(dir.path()), "truncated: file size 3");
}

TEST(ModelLoadingErrors, SafetensorsHeaderNotJson) {
  TempDir dir;
  writeTiny(dir.path());
  const fs::path file = dir.path() / "model.safetensors";
  std::string bytes = readFile(file);
  bytes.replace(8, 10, "not json!!");
  writeFile(file, bytes);
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model.safetensors: header is not valid JSON");
}

TEST(ModelLoadingErrors, SafetensorsHeaderNotAnObject) {
  TempDir dir;
  writeTiny(dir.path());
  RawSafetensors raw{json::array({1, 2}), ""};
  raw.write(dir.path() / "model.safetensors");
  EXPECT_CONTAINS(loadError(dir.path()), "header is not a JSON object");
}

TEST(ModelLoadingErrors, SafetensorsOffsetsOutOfRange) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteHeader(dir.path(), [](json& h) {
    json& offsets = h["model.layers.0.mlp.up_proj.weight"]["data_offsets"];
    const uint64_t size = offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>();
    offsets = {1000000, 1000000 + size};
  });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model.safetensors: tensor model.layers.0.mlp.up_proj.weight");
  EXPECT_CONTAINS(message, "data_offsets [1000000, 1022528] extend past end of file");
}

TEST(ModelLoadingErrors, SafetensorsOverlappingTensors) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteHeader(dir.path(), [](json& h) {
    h["model.layers.1.self_attn.q_proj.weight"]["data_offsets"] =
        h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"];
  });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_CONTAINS(message, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_CONTAINS(message, "overlap");
}

// Bytes no tensor names, a tail or a gap, are refused as Hugging Face's
// safetensors refuses them (MetadataIncompleteBuffer, InvalidOffset): they
// were mapped and digested at start for nothing, however large.
TEST(ModelLoadingErrors, SafetensorsBytesThatNoTensorNames) {
  TempDir dir;
  writeTiny(dir.path());
  const fs::path file = dir.path() / "model.safetensors";
  RawSafetensors raw = RawSafetensors::read(file);
  const size_t data_size = raw.data.size();
  raw.data.append(4096, '\0');
  raw.write(file);
  std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model.safetensors: the last 4096 bytes of the data area (from offset " +
                               std::to_string(data_size) + " of " +
                               std::to_string(data_size + 4096) + ") belong to no tensor");

  TempDir gap;
  writeTiny(gap.path());
  rewriteHeader(gap.path(), [](json& h) {
    json& offsets = h["model.norm.weight"]["data_offsets"];
    offsets = {offsets[0].get<uint64_t>() + 2, offsets[1].get<uint64_t>() + 2};
  });
  raw = RawSafetensors::read(gap.path() / "model.safetensors");
  raw.data.append(2, '\0');
  raw.write(gap.path() / "model.safetensors");
  message = loadError(gap.path());
  EXPECT_CONTAINS(message, "belong to no tensor (before model.norm.weight)");
}

// config.json, an index or the weights that are a FIFO or a device
// (a link to /dev/zero) is refused at once, not waited on or read forever.
TEST(ModelLoadingErrors, AModelJsonFileThatIsNotARegularFile) {
  TempDir dir;
  writeTiny(dir.path());
  fs::remove(dir.path() / "config.json");
  fs::create_symlink("/dev/zero", dir.path() / "config.json");
  EXPECT_CONTAINS(loadError(dir.path()), "config.json: not a regular file");

  TempDir sharded;
  writeTiny(sharded.path());
  shard(sharded.path());
  const fs::path index = sharded.path() / "model.safetensors.index.json";
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_CONTAINS(loadError(sharded.path()), "model.safetensors.index.json: not a regular file");

  TempDir dangling;
  writeTiny(dangling.path());
  fs::remove(dangling.path() / "model.safetensors");
  fs::create_symlink(dangling.path() / "elsewhere.safetensors",
                     dangling.path() / "model.safetensors");
  EXPECT_CONTAINS(loadError(dangling.path()), "model.safetensors: cannot open: No such file");

  TempDir weights;
  writeTiny(weights.path());
  fs::remove(weights.path() / "model.safetensors");
  ASSERT_EQ(::mkfifo((weights.path() / "model.safetensors").c_str(), 0600), 0);
  EXPECT_CONTAINS(loadError(weights.path()), "model.safetensors: not a regular file");
}

TEST(ModelLoadingErrors, SafetensorsByteSizeMismatch) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteHeader(dir.path(), [](json& h) { h["model.norm.weight"]["shape"] = {63}; });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "tensor model.norm.weight");
  EXPECT_CONTAINS(message, "hold 128 bytes, but BF16 x shape [63] needs 126");
}

TEST(ModelLoadingErrors, SafetensorsUnknownDtype) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteHeader(dir.path(), [](json& h) { h["model.norm.weight"]["dtype"] = "I64"; });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "tensor model.norm.weight");
  EXPECT_CONTAINS(message, "dtype \"I64\" is not supported (accepted: F32, BF16, F16, F8_E4M3)");
}

TEST(ModelLoadingErrors, MissingTensor) {
  TempDir dir;
  writeTiny(dir.path());
  removeTensor(dir.path(), "model.layers.1.mlp.up_proj.weight");
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "tensor model.layers.1.mlp.up_proj.weight missing from ");
  EXPECT_CONTAINS(message, "model.safetensors");
}

// Rewrites a mixture's model.safetensors with each layer's experts stacked
// as transformers 5 holds them: mlp.gate.weight, mlp.experts.gate_up_proj
// [experts, 2 x width, hidden] (an expert's gate rows, then its up rows) and
// mlp.experts.down_proj [experts, hidden, width]; other tensors as they are.
void stackExperts(const fs::path& dir) {
  const ModelConfig config = ModelConfig::fromFile(dir / "config.json");
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Tensor> tensors;
  {
    SafetensorsFile file(dir / "model.safetensors");
    std::set<std::string> moved;
    // Appends the bytes of tensor `name` to `out`, which replaces it.
    auto move = [&](const std::string& name, std::vector<uint8_t>& out) {
      const TensorInfo& t = *file.find(name);
      out.insert(out.end(), static_cast<const uint8_t*>(t.data),
                 static_cast<const uint8_t*>(t.data) + t.num_bytes);
      moved.insert(name);
      return t.dtype;
    };
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      if (!config.isMoeLayer(layer)) continue;
      const std::string prefix = "model.layers." + std::to_string(layer) + ".";
      const ExpertTensorNames names(config, layer);
      const int64_t inter = config.moe_intermediate_size;
      Tensor gate_up{DType::kF32, {config.num_experts, 2 * inter, config.hidden_size}, {}};
      Tensor down{DType::kF32, {config.num_experts, config.hidden_size, inter}, {}};
      for (int64_t e = 0; e < config.num_experts; ++e) {
        move(names.gate(e), gate_up.bytes);
        gate_up.dtype = move(names.up(e), gate_up.bytes);
        down.dtype = move(names.down(e), down.bytes);
      }
      Tensor router{DType::kF32, {config.num_experts, config.hidden_size}, {}};
      router.dtype = move(names.router(), router.bytes);
      tensors[prefix + "mlp.experts.gate_up_proj"] = std::move(gate_up);
      tensors[prefix + "mlp.experts.down_proj"] = std::move(down);
      tensors[prefix + "mlp.gate.weight"] = std::move(router);
    }
    for (const auto& [name, tensor] : file.tensors()) {
      if (moved.count(name) != 0) continue;
      Tensor& copy = tensors[name];
      copy.dtype = tensor.dtype;
      copy.shape = tensor.shape;
      copy.bytes.assign(static_cast<const uint8_t*>(tensor.data),
                        static_cast<const uint8_t*>(tensor.data) + tensor.num_bytes);
    }
  }
  SafetensorsWriter writer;
  for (auto& [name, tensor] : tensors) {
    writer.add(name, tensor.dtype, tensor.shape, std::move(tensor.bytes));
  }
  writer.write(dir / "model.safetensors");
}

// Experts stacked as transformers 5 holds them load as the same matrices,
// byte for byte, as the per-expert tensors of published checkpoints.
TEST(ModelLoading, StackedExpertsLoadAsThePerExpertOnes) {
  for (const char* architecture :
       {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM"}) {
    SCOPED_TRACE(architecture);
    TempDir per_expert, stacked;
    writeTiny(per_expert.path(), architecture);
    writeTiny(stacked.path(), architecture);
    stackExperts(stacked.path());
    ASSERT_TRUE(SafetensorsFile(stacked.path() / "model.safetensors")
                    .find("model.layers.1.mlp.experts.gate_up_proj") != nullptr);
    const std::unique_ptr<Model> a = Model::load(per_expert.path());
    const std::unique_ptr<Model> b = Model::load(stacked.path());
    EXPECT_EQ(a->weightBytes(), b->weightBytes());
    size_t experts = 0;
    for (size_t l = 0; l < a->weights().layers.size(); ++l) {
      const LayerWeights& x = a->weights().layers[l];
      const LayerWeights& y = b->weights().layers[l];
      ASSERT_EQ(x.experts.size(), y.experts.size());
      if (x.experts.empty()) continue;
      expectSameMatrix(x.router, y.router);
      EXPECT_EQ(x.router_bias, y.router_bias);
      if (x.shared_expert.gate_proj.data != nullptr) {
        expectSameMatrix(x.shared_expert.gate_proj, y.shared_expert.gate_proj);
        expectSameMatrix(x.shared_expert.down_proj, y.shared_expert.down_proj);
      }
      if (x.shared_expert_gate.data != nullptr) {
        expectSameMatrix(x.shared_expert_gate, y.shared_expert_gate);
      }
      for (size_t e = 0; e < x.experts.size(); ++e) {
        expectSameMatrix(x.experts[e].gate_proj, y.experts[e].gate_proj);
        expectSameMatrix(x.experts[e].up_proj, y.experts[e].up_proj);
        expectSameMatrix(x.experts[e].down_proj, y.experts[e].down_proj);
        ++experts;
      }
    }
    EXPECT_GT(experts, 0u);
  }
}

// A mixture layer's tensors are named by the architecture's own scheme;
// a missing or misshapen expert is refused naming the tensor.
TEST(ModelLoadingErrors, MixtureTensorsAreNamedWhenMissingMisshapenOrStacked) {
  {
    TempDir dir;
    writeTiny(dir.path(), "MixtralForCausalLM");
    removeTensor(dir.path(), "model.layers.1.block_sparse_moe.experts.3.w3.weight");
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.1.block_sparse_moe.experts.3.w3.weight missing from ");
  }
  {
    TempDir dir;
    writeTiny(dir.path(), "Qwen3MoeForCausalLM");
    rewriteHeader(dir.path(), [](json& h) {
      h["model.layers.1.mlp.gate.weight"]["shape"] = {64, 8};
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.1.mlp.gate.weight in " +
                        (dir.path() / "model.safetensors").string() +
                        " has shape [64, 8], expected [8, 64] (from config.json)");
  }
  {
    // Layer 0 of the tiny Qwen3-MoE is dense (mlp_only_layers): its MLP
    // is read as one, and a config that makes it a mixture asks for experts.
    TempDir dir;
    writeTiny(dir.path(), "Qwen3MoeForCausalLM");
    rewriteConfig(dir.path(), [](json& c) { c["mlp_only_layers"] = json::array(); });
    EXPECT_CONTAINS(loadError(dir.path()), "tensor model.layers.0.mlp.gate.weight missing from ");
  }
  {
    // Stacked experts (transformers 5's form) are checked as any tensor.
    TempDir dir;
    writeTiny(dir.path(), "Qwen3MoeForCausalLM");
    stackExperts(dir.path());
    rewriteHeader(dir.path(), [](json& h) {
      h["model.layers.1.mlp.experts.down_proj"]["shape"] = {8, 48, 64};
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.1.mlp.experts.down_proj in " +
                        (dir.path() / "model.safetensors").string() +
                        " has shape [8, 48, 64], expected [8, 64, 48] (from config.json)");
  }
}

// GLM-4.5's mixture tensors: the router's correction bias and the shared
// experts are read from their published names (a missing or misshapen one
// is refused naming it); the multi-token-prediction layer published after
// the last (model.layers.<num_hidden_layers>.*, num_nextn_predict_layers)
// is not read, as vLLM and transformers pass it by.
// Granite MoE's experts are stacked as published: each expert's gate is
// the first half of its input_linear rows, up the second, down its
// output_linear (the same bytes); a missing one is named.
TEST(ModelLoading, GraniteMoeStackedExpertsAreViewsOfItsTensors) {
  TempDir dir;
  writeTiny(dir.path(), "GraniteMoeForCausalLM", DType::kF32);
  const std::unique_ptr<Model> model = Model::load(dir.path());
  const ModelConfig& c = model->config();
  SafetensorsFile file(dir.path() / "model.safetensors");
  const TensorInfo* input = file.find("model.layers.1.block_sparse_moe.input_linear.weight");
  const TensorInfo* output = file.find("model.layers.1.block_sparse_moe.output_linear.weight");
  ASSERT_NE(input, nullptr);
  ASSERT_NE(output, nullptr);
  const int64_t width = c.moe_intermediate_size, hidden = c.hidden_size;
  const auto* in = static_cast<const char*>(input->data);
  const auto* out = static_cast<const char*>(output->data);
  const LayerWeights& layer = model->weights().layers[1];
  ASSERT_EQ(std::ssize(layer.experts), c.num_experts);
  const auto bytes = static_cast<size_t>(width * hidden * 4);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const ExpertWeights& x = layer.experts[static_cast<size_t>(e)];
    EXPECT_EQ(x.gate_proj.rows, width);
    EXPECT_EQ(x.down_proj.rows, hidden);
    EXPECT_EQ(std::memcmp(x.gate_proj.data, in + e * 2 * bytes, bytes), 0) << e;
    EXPECT_EQ(std::memcmp(x.up_proj.data, in + (e * 2 + 1) * bytes, bytes), 0) << e;
    EXPECT_EQ(std::memcmp(x.down_proj.data, out + e * bytes, bytes), 0) << e;
    EXPECT_NE(std::memcmp(x.gate_proj.data, x.up_proj.data, bytes), 0) << e;
  }
  const TensorInfo* router = file.find("model.layers.1.block_sparse_moe.router.layer.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(std::memcmp(layer.router.data, router->data, router->num_bytes), 0);
  removeTensor(dir.path(), "model.layers.0.block_sparse_moe.output_linear.weight");
  EXPECT_CONTAINS(loadError(dir.path()),
                  "tensor model.layers.0.block_sparse_moe.output_linear.weight missing from ");
}

// GPT-OSS's experts as published (MXFP4 blocks and scales) and as
// transformers holds them (input-major, gate and up interleaved): a
// checkpoint rewritten from the one into the other, the blocks decoded here
// from the format's definition, loads to the same values element for
// element — the published one as MXFP4 views of its bytes (gate and up every
// other row), the rewritten one as bf16 rows — both the gate, up and down
// every mixture has.
TEST(ModelLoading, GptOssMxfp4AndTransposedExpertsLoadToTheSameValues) {
  TempDir published, rewritten;
  tools::TestModelOptions options;
  options.architecture = "GptOssForCausalLM";
  options.seed = 7;
  options.quantization.method = "mxfp4";
  tools::writeTestModel(options, published.path());
  const std::unique_ptr<Model> mxfp4 = Model::load(published.path());
  const ModelConfig& c = mxfp4->config();
  ASSERT_TRUE(c.mxfp4());
  const int64_t experts = c.num_experts, hidden = c.hidden_size;
  const int64_t width = c.moe_intermediate_size;

  // The OCP Microscaling format: a byte holds two E2M1 values, the low
  // nibble first; a block's 32 values share the power of two 2^(scale - 127).
  auto decode = [](const uint8_t* blocks, const uint8_t* scales, int64_t row, int64_t cols,
                   int64_t col) {
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const uint8_t byte = blocks[row * (cols / 2) + col / 2];
    const uint8_t nibble = col % 2 == 0 ? byte & 15 : byte >> 4;
    const float magnitude =
        e2m1[nibble & 7] * std::exp2f(scales[row * (cols / 32) + col / 32] - 127.0f);
    return nibble & 8 ? -magnitude : magnitude;
  };
  {
    SafetensorsFile file(published.path() / "model.safetensors");
    SafetensorsWriter writer;
    for (const auto& [name, tensor] : file.tensors()) {
      if (name.ends_with("_blocks") || name.ends_with("_scales")) continue;
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      writer.add(name, tensor.dtype, tensor.shape,
                 std::vector<uint8_t>(bytes, bytes + tensor.num_bytes));
    }
    for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
      const std::string base = "model.layers." + std::to_string(layer) + ".mlp.experts.";
      for (const auto& [name, rows, cols] :
           {std::tuple{std::string("gate_up_proj"), 2 * width, hidden},
            std::tuple{std::string("down_proj"), hidden, width}}) {
        const auto* blocks = static_cast<const uint8_t*>(file.find(base + name + "_blocks")->data);
        const auto* scales = static_cast<const uint8_t*>(file.find(base + name + "_scales")->data);
        // [experts, cols, rows]: each expert's matrix transposed.
        std::vector<uint8_t> out(static_cast<size_t>(experts * rows * cols) * 2);
        for (int64_t e = 0; e < experts; ++e) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t col = 0; col < cols; ++col) {
              const float value = decode(blocks, scales, e * rows + r, cols, col);
              convertFromF32(DType::kBF16, &value, out.data() + ((e * cols + col) * rows + r) * 2,
                             1);
            }
          }
        }
        writer.add(base + name, DType::kBF16, {experts, cols, rows}, std::move(out));
      }
    }
    fs::copy(published.path(), rewritten.path(),
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    writer.write(rewritten.path() / "model.safetensors");
    rewriteConfig(rewritten.path(), [](json& config) { config.erase("quantization_config"); });
  }
  const std::unique_ptr<Model> transposed = Model::load(rewritten.path());
  EXPECT_FALSE(transposed->config().mxfp4());
  EXPECT_EQ(mxfp4->weightDType(), DType::kBF16);
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const LayerWeights& a = mxfp4->weights().layers[static_cast<size_t>(layer)];
    const LayerWeights& b = transposed->weights().layers[static_cast<size_t>(layer)];
    ASSERT_EQ(std::ssize(a.experts), experts);
    ASSERT_EQ(std::ssize(b.experts), experts);
    EXPECT_EQ(a.router_logit_bias.size(), static_cast<size_t>(experts));
    EXPECT_EQ(a.sinks.size(), static_cast<size_t>(c.num_attention_heads));
    EXPECT_EQ(a.o_bias.size(), static_cast<size_t>(hidden));
    for (int64_t e = 0; e < experts; ++e) {
      const ExpertWeights& x = a.experts[static_cast<size_t>(e)];
      const ExpertWeights& y = b.experts[static_cast<size_t>(e)];
      for (const auto& [p, q] :
           {std::pair{&x.gate_proj, &y.gate_proj}, std::pair{&x.up_proj, &y.up_proj},
            std::pair{&x.down_proj, &y.down_proj}}) {
        ASSERT_EQ(p->layout, kernels::WeightLayout::kMxfp4);
        ASSERT_EQ(q->layout, kernels::WeightLayout::kRows);
        ASSERT_EQ(q->dtype, DType::kBF16);
        ASSERT_EQ(p->rows, q->rows);
        ASSERT_EQ(p->cols, q->cols);
        const auto* bf16 = static_cast<const uint16_t*>(q->data);
        int64_t differing = 0;
        for (int64_t r = 0; r < p->rows; ++r) {
          for (int64_t col = 0; col < p->cols; ++col) {
            const float value = kernels::mxfp4Value(*p, r, col);
            const float expected = bf16ToF32(bf16[r * q->cols + col]);
            differing += std::memcmp(&value, &expected, sizeof value) != 0 ? 1 : 0;
          }
        }
        EXPECT_EQ(differing, 0) << "layer " << layer << " expert " << e;
      }
      EXPECT_EQ(x.gate_proj.row_step, 2);
      EXPECT_EQ(x.up_proj.row_step, 2);
      EXPECT_EQ(x.down_proj.row_step, 1);
      EXPECT_EQ(x.gate_proj.rows, width);
      EXPECT_EQ(x.down_proj.rows, hidden);
      EXPECT_EQ(x.gate_bias, y.gate_bias);
      EXPECT_EQ(x.up_bias, y.up_bias);
      EXPECT_EQ(x.down_bias, y.down_bias);
      EXPECT_EQ(x.gate_bias.size(), static_cast<size_t>(width));
      EXPECT_NE(x.gate_bias, x.up_bias) << "gate and up are apart";
    }
  }
  // Gate row 0 is the published gate_up row 0 (gate and up interleave by
  // rows), up row 0 its row 1.
  SafetensorsFile file(published.path() / "model.safetensors");
  const auto* blocks = static_cast<const uint8_t*>(
      file.find("model.layers.0.mlp.experts.gate_up_proj_blocks")->data);
  const auto* scales = static_cast<const uint8_t*>(
      file.find("model.layers.0.mlp.experts.gate_up_proj_scales")->data);
  const ExpertWeights& first = mxfp4->weights().layers[0].experts[0];
  // And run to the same logits, bit for bit (f32 compute: the MXFP4 matmul
  // widens each value as the bf16 one does, in the same order).
  auto logitsOf = [&](const Model& model) {
    KvCacheConfig cache_config = KvCacheConfig::forModel(model, DType::kF32, 16);
    cache_config.num_blocks = 4;
    KvCache cache(cache_config, std::make_unique<HostSlabAllocator>());
    kernels::cpu::CpuBackend backend;
    ModelRunner runner(model, cache, backend);
    std::vector<TokenId> prompt;
    for (TokenId t = 0; t < 37; ++t) prompt.push_back((t * 7919 + 3) % 256);
    const std::vector<BlockId> blocks = {0, 1, 2, 3};
    SequenceInput input;
    input.tokens = prompt;
    input.block_table = blocks;
    std::vector<float> logits;
    runner.forward({&input, 1}, logits);
    return logits;
  };
  const std::vector<float> published_logits = logitsOf(*mxfp4);
  const std::vector<float> rewritten_logits = logitsOf(*transposed);
  ASSERT_EQ(published_logits.size(), rewritten_logits.size());
  EXPECT_EQ(std::memcmp(published_logits.data(), rewritten_logits.data(),
                        published_logits.size() * sizeof(float)),
            0);

  for (int64_t col = 0; col < hidden; ++col) {
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(kernels::mxfp4Value(first.gate_proj, r, col),
                decode(blocks, scales, 2 * r, hidden, col))
          << r << " " << col;
      EXPECT_EQ(kernels::mxfp4Value(first.up_proj, r, col),
                decode(blocks, scales, 2 * r + 1, hidden, col))
          << r << " " << col;
    }
  }
}

// What GPT-OSS's loading refuses, naming the tensor: E8M0's NaN as a
// scale, a missing sink or router bias. MXFP4 experts beside f16 matrices
// load (the kernels widen MXFP4 to f32 whatever the other matrices are).
TEST(ModelLoading, GptOssRefusalsNameTheTensor) {
  const std::string file_name = "model.safetensors";
  auto write = [](const fs::path& dir, DType dtype) {
    tools::TestModelOptions options;
    options.architecture = "GptOssForCausalLM";
    options.seed = 7;
    options.dtype = dtype;
    options.quantization.method = "mxfp4";
    tools::writeTestModel(options, dir);
  };
  {
    TempDir dir;
    write(dir.path(), DType::kBF16);
    RawSafetensors raw = RawSafetensors::read(dir.path() / file_name);
    const std::string scales = "model.layers.1.mlp.experts.down_proj_scales";
    const int64_t begin = raw.header[scales]["data_offsets"][0].get<int64_t>();
    raw.data[static_cast<size_t>(begin + 5)] = static_cast<char>(0xff);
    raw.write(dir.path() / file_name);
    EXPECT_CONTAINS(loadError(dir.path()), "tensor " + scales + " in " +
                                               (dir.path() / file_name).string() +
                                               " holds 255 (E8M0's NaN) at element 5 "
                                               "(accepted: 0 to 254)");
  }
  {
    TempDir dir;
    write(dir.path(), DType::kF16);
    const std::unique_ptr<Model> model = Model::load(dir.path());
    EXPECT_EQ(model->weightDType(), DType::kF16);
    EXPECT_EQ(model->weights().layers[0].experts[0].down_proj.layout,
              kernels::WeightLayout::kMxfp4);
  }
  for (const std::string missing :
       {"model.layers.1.self_attn.sinks", "model.layers.0.mlp.router.bias",
        "model.layers.0.self_attn.o_proj.bias", "model.layers.1.mlp.experts.down_proj_bias"}) {
    TempDir dir;
    write(dir.path(), DType::kBF16);
    removeTensor(dir.path(), missing);
    EXPECT_CONTAINS(loadError(dir.path()), "tensor " + missing + " missing from ");
  }
}

TEST(ModelLoading, Glm4MoeRoutingTensorsAreReadAndItsPredictionLayerPassedBy) {
  {
    TempDir dir;
    writeTiny(dir.path(), "Glm4MoeForCausalLM", DType::kF32);
    const std::unique_ptr<Model> model = Model::load(dir.path());
    const LayerWeights& mixture = model->weights().layers[1];
    SafetensorsFile file(dir.path() / "model.safetensors");
    const TensorInfo* bias = file.find("model.layers.1.mlp.gate.e_score_correction_bias");
    ASSERT_NE(bias, nullptr);
    ASSERT_EQ(mixture.router_bias.size(), 8u);
    EXPECT_EQ(std::memcmp(mixture.router_bias.data(), bias->data, bias->num_bytes), 0);
    const TensorInfo* shared_up = file.find("model.layers.1.mlp.shared_experts.up_proj.weight");
    ASSERT_NE(shared_up, nullptr);
    ASSERT_EQ(mixture.shared_expert.up_proj.rows * mixture.shared_expert.up_proj.cols * 4,
              static_cast<int64_t>(shared_up->num_bytes));
    EXPECT_EQ(
        std::memcmp(mixture.shared_expert.up_proj.data, shared_up->data, shared_up->num_bytes), 0);
    EXPECT_TRUE(model->weights().layers[0].router_bias.empty()) << "layer 0 is dense";
    EXPECT_EQ(model->weights().layers[0].down_proj.cols, model->config().intermediate_size);
  }
  {
    // A three-layer checkpoint served as two layers: the third is what
    // GLM-4.5's prediction layer is to the agent, tensors it does not read.
    TempDir two, three;
    writeTiny(two.path(), "Glm4MoeForCausalLM");
    tools::TestModelOptions options;
    options.architecture = "Glm4MoeForCausalLM";
    options.seed = 7;
    options.layers = 3;
    tools::writeTestModel(options, three.path());
    rewriteConfig(three.path(), [](json& c) {
      c["num_hidden_layers"] = 2;
      c["num_nextn_predict_layers"] = 1;
    });
    ASSERT_NE(SafetensorsFile(three.path() / "model.safetensors")
                  .find("model.layers.2.mlp.shared_experts.gate_proj.weight"),
              nullptr);
    const std::unique_ptr<Model> served = Model::load(three.path());
    EXPECT_EQ(served->weights().layers.size(), 2u);
    EXPECT_EQ(served->weightBytes(), Model::load(two.path())->weightBytes());
  }
  const std::string file_name = "model.safetensors";
  for (const std::string missing : {"model.layers.1.mlp.gate.e_score_correction_bias",
                                    "model.layers.1.mlp.shared_experts.down_proj.weight"}) {
    TempDir dir;
    writeTiny(dir.path(), "Glm4MoeForCausalLM");
    removeTensor(dir.path(), missing);
    EXPECT_CONTAINS(loadError(dir.path()), "tensor " + missing + " missing from ");
  }
  {
    TempDir dir;
    writeTiny(dir.path(), "Glm4MoeForCausalLM");
    rewriteHeader(dir.path(), [](json& h) {
      h["model.layers.1.mlp.shared_experts.gate_proj.weight"]["shape"] = {64, 48};
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.1.mlp.shared_experts.gate_proj.weight in " +
                        (dir.path() / file_name).string() +
                        " has shape [64, 48], expected [48, 64] (from config.json)");
  }
}

TEST(ModelLoadingErrors, MissingBiasForQwen2) {
  TempDir dir;
  writeTiny(dir.path(), "Qwen2ForCausalLM");
  removeTensor(dir.path(), "model.layers.0.self_attn.k_proj.bias");
  EXPECT_CONTAINS(loadError(dir.path()), "tensor model.layers.0.self_attn.k_proj.bias missing");
}

// attention_bias on Llama (and Qwen3) gives o_proj a bias in transformers,
// which the engine does not add: refused naming the tensor, never dropped.
TEST(ModelLoadingErrors, AttentionBiasOfLlamaNeedsAnOProjBias) {
  for (const char* architecture : {"LlamaForCausalLM", "Qwen3ForCausalLM"}) {
    TempDir dir;
    writeTiny(dir.path(), architecture);
    rewriteConfig(dir.path(), [](json& config) { config["attention_bias"] = true; });
    const std::string message = loadError(dir.path());
    EXPECT_CONTAINS(message, "tensor model.layers.0.self_attn.o_proj.bias");
    EXPECT_CONTAINS(message, "biases after o_proj are not supported");
  }
}

TEST(ModelLoadingErrors, WrongShape) {
  TempDir dir;
  writeTiny(dir.path());
  rewriteHeader(dir.path(), [](json& h) {
    h["model.layers.0.mlp.up_proj.weight"]["shape"] = {64, 176};
  });
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "tensor model.layers.0.mlp.up_proj.weight in ");
  EXPECT_CONTAINS(message, "has shape [64, 176], expected [176, 64] (from config.json)");
}

// A streamed tensor gives the bytes an in-memory one does; a source writing
// the wrong number of bytes fails naming the tensor and leaves no file.
TEST(SafetensorsWriterTest, StreamedTensorsEqualInMemoryOnesAndWrongSizesFail) {
  TempDir dir;
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5, 6, 7, 8};
  SafetensorsWriter in_memory;
  in_memory.add("t", DType::kBF16, {2, 2}, bytes);
  in_memory.write(dir.path() / "a.safetensors");
  SafetensorsWriter streamed;
  streamed.addStreamed("t", DType::kBF16, {2, 2}, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(bytes.data()), 3);
    out.write(reinterpret_cast<const char*>(bytes.data()) + 3, 5);
  });
  streamed.write(dir.path() / "b.safetensors");
  EXPECT_EQ(readFile(dir.path() / "a.safetensors"), readFile(dir.path() / "b.safetensors"));

  SafetensorsWriter short_source;
  short_source.addStreamed("t", DType::kBF16, {2, 2}, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(bytes.data()), 7);
  });
  try {
    short_source.write(dir.path() / "c.safetensors");
    FAIL() << "a source writing 7 of 8 bytes was accepted";
  } catch (const Error& error) {
    EXPECT_CONTAINS(std::string(error.what()), "tensor t: its source wrote 7 bytes, not 8");
  }
  EXPECT_FALSE(fs::exists(dir.path() / "c.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() / "c.safetensors.tmp"));
}

TEST(ModelLoadingErrors, MixedMatrixDtypes) {
  TempDir dir;
  writeTiny(dir.path());
  const fs::path path = dir.path() / "model.safetensors";
  SafetensorsWriter writer;
  {
    SafetensorsFile file(path);
    for (const auto& [name, tensor] : file.tensors()) {
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      if (name == "model.layers.1.mlp.down_proj.weight") {
        std::vector<uint8_t> f32(tensor.num_bytes * 2);
        convertToF32(tensor.dtype, tensor.data, reinterpret_cast<float*>(f32.data()),
                     tensor.num_bytes / 2);
        writer.add(name, DType::kF32, tensor.shape, std::move(f32));
      } else {
        writer.add(name, tensor.dtype, tensor.shape,
                   std::vector<uint8_t>(bytes, bytes + tensor.num_bytes));
      }
    }
  }
  writer.write(path);
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "tensor model.layers.1.mlp.down_proj.weight");
  EXPECT_CONTAINS(message, "has dtype F32");
  EXPECT_CONTAINS(message, "all matrices must share one dtype");
}

fs::path writeTinyFp8(const fs::path& dir, const std::string& spec,
                      const std::string& architecture = "LlamaForCausalLM") {
  tools::TestModelOptions options;
  options.preset = "tiny";
  options.architecture = architecture;
  options.seed = 7;
  options.quantization = tools::parseQuantizationSpec(spec);
  tools::writeTestModel(options, dir);
  return dir;
}

// Rewrites model.safetensors tensor by tensor: `edit` may rename, retype,
// reshape or refill a tensor, and drops it by returning false.
void rewriteTensors(const fs::path& dir,
                    const std::function<bool(std::string&, DType&, std::vector<int64_t>&,
                                             std::vector<uint8_t>&)>& edit) {
  const fs::path path = dir / "model.safetensors";
  SafetensorsWriter writer;
  {
    SafetensorsFile file(path);
    for (const auto& [original, tensor] : file.tensors()) {
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      std::vector<uint8_t> data(bytes, bytes + tensor.num_bytes);
      std::string name = original;
      DType dtype = tensor.dtype;
      std::vector<int64_t> shape = tensor.shape;
      if (edit(name, dtype, shape, data)) writer.add(name, dtype, shape, std::move(data));
    }
  }
  writer.write(path);
}

// Each fp8 checkpoint form loads its projections as F8_E4M3 views with the
// file's scales on the grid its granularity gives; the embedding, LM head
// and router stay bf16; the config names the quantization, and so does the
// model's digest.
TEST(ModelLoading, Fp8CheckpointsLoadTheirMatricesWithTheirScales) {
  struct Case {
    const char* spec;
    const char* architecture;
    const char* scale_name;
    int64_t scale_rows, scale_cols;  // 0: the whole dimension
  };
  for (const Case& c :
       {Case{"fp8:tensor", "LlamaForCausalLM", "weight_scale", 0, 0},
        Case{"fp8:block=16x32", "Qwen3MoeForCausalLM", "weight_scale_inv", 16, 32},
        Case{"fp8", "LlamaForCausalLM", "weight_scale_inv", 128, 128},
        Case{"compressed-tensors", "MixtralForCausalLM", "weight_scale", 1, 0},
        Case{"compressed-tensors:tensor", "Qwen3ForCausalLM", "weight_scale", 0, 0},
        Case{"compressed-tensors:block=8x16", "LlamaForCausalLM", "weight_scale", 8, 16}}) {
    SCOPED_TRACE(std::string(c.spec) + " " + c.architecture);
    TempDir dir;
    writeTinyFp8(dir.path(), c.spec, c.architecture);
    const std::unique_ptr<Model> model = Model::load(dir.path());
    ASSERT_TRUE(model->config().quantized());
    EXPECT_EQ(model->config().quantization, tools::parseQuantizationSpec(c.spec));
    EXPECT_EQ(model->weightDType(), DType::kBF16);
    const ModelWeights& w = model->weights();
    EXPECT_EQ(w.embed_tokens.dtype, DType::kBF16);
    EXPECT_EQ(w.lm_head.dtype, DType::kBF16);
    SafetensorsFile file(dir.path() / "model.safetensors");
    int64_t checked = 0;
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const LayerWeights& layer = w.layers[i];
      if (!layer.experts.empty()) {
        EXPECT_EQ(layer.router.dtype, DType::kBF16);
      }
      std::vector<std::pair<std::string, const kernels::WeightView*>> named = {
          {"self_attn.q_proj", &layer.q_proj}, {"self_attn.o_proj", &layer.o_proj}};
      if (layer.experts.empty()) {
        named.push_back({"mlp.down_proj", &layer.down_proj});
      } else {
        const ExpertTensorNames names(model->config(), static_cast<int64_t>(i));
        const std::string up = names.up(1);
        named.push_back(
            {up.substr(0, up.size() - 7).substr(("model.layers." + std::to_string(i) + ".").size()),
             &layer.experts[1].up_proj});
      }
      for (const auto& [module, view] : named) {
        SCOPED_TRACE(module);
        ASSERT_EQ(view->dtype, DType::kF8E4M3);
        ASSERT_NE(view->scales, nullptr);
        EXPECT_EQ(view->scale_rows, c.scale_rows ? c.scale_rows : view->rows);
        EXPECT_EQ(view->scale_cols, c.scale_cols ? c.scale_cols : view->cols);
        const std::string prefix = "model.layers." + std::to_string(i) + "." + module + ".";
        const TensorInfo* weight = file.find(prefix + "weight");
        const TensorInfo* scales = file.find(prefix + c.scale_name);
        ASSERT_NE(weight, nullptr);
        ASSERT_NE(scales, nullptr);
        EXPECT_EQ(weight->dtype, DType::kF8E4M3);
        ASSERT_EQ(scales->num_bytes, static_cast<uint64_t>(view->scaleCount()) * sizeof(float));
        EXPECT_EQ(std::memcmp(view->scales, scales->data, scales->num_bytes), 0);
        EXPECT_EQ(std::memcmp(view->data, weight->data, weight->num_bytes), 0);
        ++checked;
      }
    }
    EXPECT_EQ(checked, 3 * static_cast<int64_t>(w.layers.size()));
    // The same model unquantized has another digest.
    TempDir plain;
    writeTiny(plain.path(), c.architecture);
    const std::unique_ptr<Model> unquantized = Model::load(plain.path());
    EXPECT_NE(unquantized->config().computeDigest(), model->config().computeDigest());
    EXPECT_EQ(unquantized->fp8Matrices(), 0u);
    EXPECT_GE(model->fp8Matrices(), 7 * w.layers.size());
  }
}

// An fp8 KV cache's scales (docs/quantization.md#fp8-kv-cache) in each
// spelling checkpoints use, read per layer; a layer without them gets 1,
// a model without any none at all.
TEST(ModelLoading, KvCacheScalesAreReadInEachPublishedSpelling) {
  TempDir dir;
  tools::TestModelOptions options;
  options.seed = 7;
  options.kv_cache_scales = true;
  tools::writeTestModel(options, dir.path());
  const int64_t layers = Model::load(dir.path())->config().num_hidden_layers;
  ASSERT_GE(layers, 2);
  // What the file holds, layer by layer.
  std::vector<float> written;
  {
    SafetensorsFile file(dir.path() / "model.safetensors");
    for (int64_t l = 0; l < layers; ++l) {
      for (const char* kv : {"k_scale", "v_scale"}) {
        const std::string name = "model.layers." + std::to_string(l) + ".self_attn." + kv;
        const TensorInfo* tensor = file.find(name);
        ASSERT_NE(tensor, nullptr) << name;
        EXPECT_EQ(tensor->dtype, DType::kF32);
        EXPECT_EQ(tensor->shape, std::vector<int64_t>{});
        float value = 0.0f;
        std::memcpy(&value, tensor->data, sizeof value);
        EXPECT_GT(value, 6.0f / 448.0f * 0.999f);
        EXPECT_LT(value, 12.0f / 448.0f);
        written.push_back(value);
      }
    }
  }
  EXPECT_EQ(Model::load(dir.path())->kvCacheScales(), written);
  EXPECT_NE(written[0], written[1]);
  EXPECT_NE(written[0], written[2]);

  // Renamed to the older k_proj/v_proj.output_scale, shape [1].
  rewriteTensors(dir.path(),
                 [](std::string& name, DType&, std::vector<int64_t>& shape, std::vector<uint8_t>&) {
                   for (const char* kv : {"k", "v"}) {
                     const std::string suffix = std::string("self_attn.") + kv + "_scale";
                     if (name.ends_with(suffix)) {
                       name = name.substr(0, name.size() - suffix.size()) + "self_attn." + kv +
                              "_proj.output_scale";
                       shape = {1};
                     }
                   }
                   return true;
                 });
  EXPECT_EQ(Model::load(dir.path())->kvCacheScales(), written);

  // One deprecated kv_scale (bf16) for layer 0; layer 1 without any.
  rewriteTensors(dir.path(), [](std::string& name, DType& dtype, std::vector<int64_t>&,
                                std::vector<uint8_t>& data) {
    if (name == "model.layers.0.self_attn.k_proj.output_scale") {
      name = "model.layers.0.self_attn.kv_scale";
      dtype = DType::kBF16;
      const uint16_t half = f32ToBf16(0.375f);
      data.resize(sizeof half);
      std::memcpy(data.data(), &half, sizeof half);
      return true;
    }
    return !name.ends_with("output_scale");
  });
  std::vector<float> expected(2 * static_cast<size_t>(layers), 1.0f);
  expected[0] = expected[1] = 0.375f;
  EXPECT_EQ(Model::load(dir.path())->kvCacheScales(), expected);

  EXPECT_TRUE(Model::load(writeTiny(TempDir().path()))->kvCacheScales().empty());

  // Where a layer holds two spellings, k_scale/v_scale win over
  // output_scale, which wins over kv_scale.
  rewriteTensors(dir.path(),
                 [](std::string& name, DType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
                   return name != "model.layers.0.self_attn.kv_scale";
                 });
  {
    SafetensorsWriter writer;
    SafetensorsFile file(dir.path() / "model.safetensors");
    for (const auto& [name, tensor] : file.tensors()) {
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      writer.add(name, tensor.dtype, tensor.shape,
                 std::vector<uint8_t>(bytes, bytes + tensor.num_bytes));
    }
    auto scalar = [](float value) {
      std::vector<uint8_t> data(sizeof value);
      std::memcpy(data.data(), &value, sizeof value);
      return data;
    };
    const std::string attn = "model.layers.0.self_attn.";
    writer.add(attn + "k_scale", DType::kF32, {}, scalar(0.5f));
    writer.add(attn + "k_proj.output_scale", DType::kF32, {}, scalar(0.25f));
    writer.add(attn + "kv_scale", DType::kF32, {}, scalar(0.125f));
    writer.add(attn + "v_proj.output_scale", DType::kF32, {1}, scalar(0.0625f));
    writer.write(dir.path() / "model.safetensors.new");
  }
  fs::rename(dir.path() / "model.safetensors.new", dir.path() / "model.safetensors");
  expected[0] = 0.5f;
  expected[1] = 0.0625f;
  EXPECT_EQ(Model::load(dir.path())->kvCacheScales(), expected);
}

// Scales an fp8 cache cannot use are refused naming the tensor when that
// cache asks for them; the model still loads for a bf16 or f32 cache (a
// checkpoint with per-head scales served as before).
TEST(ModelLoadingErrors, KvCacheScalesAreNamed) {
  struct Case {
    std::function<void(DType&, std::vector<int64_t>&, std::vector<uint8_t>&)> edit;
    std::string message;
  };
  const std::string name = "model.layers.1.self_attn.v_scale";
  auto set = [](std::vector<uint8_t>& data, float value) {
    std::memcpy(data.data(), &value, sizeof value);
  };
  const Case cases[] = {
      {[](DType&, std::vector<int64_t>& shape, std::vector<uint8_t>& data) {
         shape = {2};
         data.resize(2 * sizeof(float));
       },
       " has shape [2], expected [] or [1] (one KV cache scale per layer; per-head scales are "
       "not supported)"},
      {[&](DType&, std::vector<int64_t>&, std::vector<uint8_t>& data) { set(data, 0.0f); },
       " holds 0.000000 (accepted: a KV cache scale from 1e-30 to 1e36)"},
      {[&](DType&, std::vector<int64_t>&, std::vector<uint8_t>& data) { set(data, 1e-31f); },
       " holds 0.000000 (accepted: a KV cache scale from 1e-30 to 1e36)"},
      {[&](DType&, std::vector<int64_t>&, std::vector<uint8_t>& data) {
         set(data, std::numeric_limits<float>::infinity());
       },
       " holds inf (accepted: a KV cache scale from 1e-30 to 1e36)"},
      {[](DType& dtype, std::vector<int64_t>&, std::vector<uint8_t>& data) {
         dtype = DType::kF8E4M3;
         data.resize(1);
       },
       " has dtype F8_E4M3 (accepted for scales: F32, BF16, F16)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    TempDir dir;
    tools::TestModelOptions options;
    options.kv_cache_scales = true;
    tools::writeTestModel(options, dir.path());
    rewriteTensors(dir.path(), [&](std::string& tensor, DType& dtype, std::vector<int64_t>& shape,
                                   std::vector<uint8_t>& data) {
      if (tensor == name) c.edit(dtype, shape, data);
      return true;
    });
    const std::unique_ptr<Model> model = Model::load(dir.path());
    try {
      model->kvCacheScales();
      ADD_FAILURE() << "scales accepted";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "tensor " + name + " in " +
                                    (dir.path() / "model.safetensors").string() + c.message +
                                    "; an fp8 KV cache needs usable K/V scales");
    }
  }
}

// An fp8 checkpoint's problems are refused naming the tensor or the field.
TEST(ModelLoadingErrors, Fp8TensorsAndScalesAreNamed) {
  const std::string q_proj = "model.layers.1.self_attn.q_proj.weight";
  {
    TempDir dir;
    writeTinyFp8(dir.path(), "compressed-tensors");
    rewriteConfig(dir.path(), [](json& c) { c.erase("quantization_config"); });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.0.self_attn.q_proj.weight in " +
                        (dir.path() / "model.safetensors").string() +
                        " has dtype F8_E4M3, but config.json has no quantization_config");
  }
  {
    TempDir dir;
    writeTinyFp8(dir.path(), "compressed-tensors");
    removeTensor(dir.path(), "model.layers.1.mlp.up_proj.weight_scale");
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.1.mlp.up_proj.weight_scale, the scales of fp8 tensor "
                    "model.layers.1.mlp.up_proj.weight, is missing from ");
  }
  {
    // Per-channel scales read as per-tensor ones would be a wrong model.
    TempDir dir;
    writeTinyFp8(dir.path(), "compressed-tensors");
    rewriteConfig(dir.path(), [](json& c) {
      c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "tensor";
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.0.self_attn.q_proj.weight_scale in " +
                        (dir.path() / "model.safetensors").string() +
                        " has shape [64, 1], expected [] or [1] (tensor scales of "
                        "model.layers.0.self_attn.q_proj.weight [64, 64], from config.json)");
  }
  {
    TempDir dir;
    writeTinyFp8(dir.path(), "fp8:block=16x32");
    rewriteConfig(dir.path(), [](json& c) {
      c["quantization_config"]["weight_block_size"] = {32, 32};
    });
    EXPECT_CONTAINS(loadError(dir.path()), "has shape [4, 2], expected [2, 2] (block scales of ");
  }
  {
    TempDir dir;
    writeTinyFp8(dir.path(), "compressed-tensors");
    rewriteTensors(dir.path(), [&](std::string& name, DType&, std::vector<int64_t>&,
                                   std::vector<uint8_t>& data) {
      if (name == "model.layers.1.self_attn.q_proj.weight_scale") {
        const float negative = -0.5f;
        std::memcpy(data.data() + 3 * sizeof(float), &negative, sizeof negative);
      }
      return true;
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.1.self_attn.q_proj.weight_scale in " +
                        (dir.path() / "model.safetensors").string() +
                        " holds -0.500000 at element 3 (accepted: scales from 0 to 1e36)");
  }
  {
    // A scale the kernels' x 2^8 would make infinite.
    TempDir dir;
    writeTinyFp8(dir.path(), "fp8:block=16x32");
    rewriteTensors(dir.path(), [&](std::string& name, DType&, std::vector<int64_t>&,
                                   std::vector<uint8_t>& data) {
      if (name == "model.layers.0.mlp.gate_proj.weight_scale_inv") {
        const float huge = 1e37f;
        std::memcpy(data.data(), &huge, sizeof huge);
      }
      return true;
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.0.mlp.gate_proj.weight_scale_inv in " +
                        (dir.path() / "model.safetensors").string() + " holds 99999999");
  }
  {
    // The embedding table, and norm weights, never hold fp8.
    TempDir dir;
    writeTinyFp8(dir.path(), "compressed-tensors");
    rewriteTensors(dir.path(), [](std::string& name, DType& dtype, std::vector<int64_t>&,
                                  std::vector<uint8_t>& data) {
      if (name == "model.embed_tokens.weight" || name == "model.norm.weight") {
        std::vector<uint8_t> fp8(data.size() / 2);
        for (size_t i = 0; i < fp8.size(); ++i) {
          uint16_t h;
          std::memcpy(&h, data.data() + 2 * i, 2);
          fp8[i] = f32ToF8e4m3(bf16ToF32(h));
        }
        data = std::move(fp8);
        dtype = DType::kF8E4M3;
      }
      return true;
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.embed_tokens.weight in " +
                        (dir.path() / "model.safetensors").string() +
                        " has dtype F8_E4M3, which it cannot have (accepted: F32, BF16, F16");
  }
  {
    // Experts stacked in fp8 are not read.
    TempDir dir;
    writeTinyFp8(dir.path(), "compressed-tensors", "Qwen3MoeForCausalLM");
    rewriteTensors(dir.path(), [](std::string& name, DType& dtype, std::vector<int64_t>&,
                                  std::vector<uint8_t>& data) {
      if (name == "model.layers.0.self_attn.q_norm.weight") {
        std::vector<uint8_t> fp8(data.size() / 2, 0x38);
        data = std::move(fp8);
        dtype = DType::kF8E4M3;
      }
      return true;
    });
    EXPECT_CONTAINS(loadError(dir.path()),
                    "tensor model.layers.0.self_attn.q_norm.weight in " +
                        (dir.path() / "model.safetensors").string() +
                        " has dtype F8_E4M3, accepted for weight matrices only");
  }
}

// A damaged checkpoint (a NaN or an infinity in a tensor it uses) is
// refused naming the tensor and the element, where it served NaN logits,
// or garbage for the tokens whose rows held one; in every float dtype.
TEST(ModelLoadingErrors, NonFiniteWeightsAreNamedWithTheirElement) {
  struct Case {
    DType dtype;
    std::string tensor;
    size_t element;
    uint64_t bits;
    std::string expected;
  };
  for (const Case& c : {
           Case{DType::kBF16, "model.layers.1.mlp.down_proj.weight", 37, 0x7fc0, "NaN at [0, 37]"},
           Case{DType::kF32, "model.embed_tokens.weight", 64 * 3 + 5, 0xff800000, "-inf at [3, 5]"},
           Case{DType::kF16, "model.norm.weight", 2, 0x7c00, "+inf at [2]"},
       }) {
    SCOPED_TRACE(c.tensor);
    TempDir dir("model-loading-test");
    writeTiny(dir.path(), "LlamaForCausalLM", c.dtype);
    bool poisoned = false;
    rewriteTensors(dir.path(), [&](std::string& name, DType& dtype, std::vector<int64_t>& shape,
                                   std::vector<uint8_t>& data) {
      if (name == c.tensor) {
        EXPECT_EQ(dtype, c.dtype);
        // The tiny preset: hidden 64 (the embedding's row), intermediate 176.
        if (name.find("embed") != std::string::npos) EXPECT_EQ(shape[1], 64);
        std::memcpy(data.data() + c.element * dtypeSize(dtype), &c.bits, dtypeSize(dtype));
        poisoned = true;
      }
      return true;
    });
    ASSERT_TRUE(poisoned);
    EXPECT_EQ(loadError(dir.path()), "tensor " + c.tensor + " in " +
                                         (dir.path() / "model.safetensors").string() + " holds " +
                                         c.expected +
                                         " (accepted: finite values; the checkpoint is damaged "
                                         "or was converted badly)");
  }
  // Unpoisoned, it loads, having checked every tensor of the file (the
  // tiny Llama uses them all).
  TempDir dir("model-loading-test");
  writeTiny(dir.path());
  size_t file_bytes = 0;
  const SafetensorsFile file(dir.path() / "model.safetensors");
  for (const auto& [name, tensor] : file.tensors()) file_bytes += tensor.num_bytes;
  EXPECT_EQ(Model::load(dir.path())->checkedBytes(), file_bytes);
}

TEST(ModelLoadingErrors, IndexPointsToMissingShard) {
  TempDir dir;
  writeTiny(dir.path());
  shard(dir.path());
  fs::remove(dir.path() / "model-00002-of-00002.safetensors");
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "model-00002-of-00002.safetensors");
  EXPECT_CONTAINS(message, "model.safetensors.index.json");
  EXPECT_CONTAINS(message, "does not exist");
}

TEST(ModelLoadingErrors, TensorNotInWeightMap) {
  TempDir dir;
  writeTiny(dir.path());
  shard(dir.path());
  json index = json::parse(readFile(dir.path() / "model.safetensors.index.json"));
  index["weight_map"].erase("model.norm.weight");
  writeFile(dir.path() / "model.safetensors.index.json", index.dump());
  EXPECT_CONTAINS(loadError(dir.path()), "tensor model.norm.weight not in weight_map of ");
}

// An index naming no tensor names no shard: a clear error, where reading
// its first shard crashed.
TEST(ModelLoadingErrors, EmptyWeightMap) {
  TempDir dir;
  writeTiny(dir.path());
  shard(dir.path());
  json index = json::parse(readFile(dir.path() / "model.safetensors.index.json"));
  index["weight_map"] = json::object();
  writeFile(dir.path() / "model.safetensors.index.json", index.dump());
  EXPECT_CONTAINS(loadError(dir.path()), "model.safetensors.index.json: \"weight_map\" is empty");
}

TEST(ModelLoadingErrors, ShardPathOutsideTheDirectory) {
  TempDir dir;
  writeTiny(dir.path());
  shard(dir.path());
  json index = json::parse(readFile(dir.path() / "model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  writeFile(dir.path() / "model.safetensors.index.json", index.dump());
  EXPECT_CONTAINS(loadError(dir.path()), "the file name of a shard in the model directory");
}

TEST(ModelLoadingErrors, NoWeightFiles) {
  TempDir dir;
  writeTiny(dir.path());
  fs::remove(dir.path() / "model.safetensors");
  const std::string message = loadError(dir.path());
  EXPECT_CONTAINS(message, "has neither model.safetensors nor model.safetensors.index.json");
}

// ---------------------------------------------------------------------------
// config.json parsing

std::string minimalLlama(const std::string& extra = "") {
  return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000)" +
         extra + "}";
}

// A config.json of `architecture` in a small shape (hidden 256, 4 layers
// of 4 heads, 1000 ids) with `extra` fields (", \"key\": value" ...).
std::string smallConfig(const std::string& architecture, const std::string& extra = "") {
  return R"({"architectures": [")" + architecture +
         R"("], "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
               "num_attention_heads": 4, "vocab_size": 1000)" +
         extra + "}";
}

std::string parseError(const std::string& text) {
  try {
    ModelConfig::fromJsonText(text, "dir/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for " << text;
  return "";
}

// Every rotary scaling a config can give changes the model's arithmetic,
// so each enters the digest, on any architecture: two configs that differ
// only in it are two models to the router and to P->D hand-offs.
TEST(ModelConfigParsing, EveryRotaryScalingEntersTheDigest) {
  // LongRoPE's 16 factors (head_dim 32), from `first` by 0.25.
  const auto factors = [](double first) {
    std::string list;
    for (int i = 0; i < 16; ++i) list += (i ? ", " : "") + std::to_string(first + 0.25 * i);
    return "[" + list + "]";
  };
  const std::string longrope = R"(, "max_position_embeddings": 4096,
      "rope_scaling": {"type": "longrope", "original_max_position_embeddings": 1024,
      "short_factor": )" + factors(1.0) +
                               R"(, "long_factor": )";
  const std::vector<std::string> scalings = {
      "",
      R"(, "rope_scaling": {"rope_type": "linear", "factor": 2.0})",
      R"(, "rope_scaling": {"rope_type": "linear", "factor": 4.0})",
      R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})",
      R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})",
      longrope + factors(2.0) + "}",
      longrope + factors(3.0) + "}",
  };
  std::set<std::string> digests;
  for (const std::string& scaling : scalings) {
    SCOPED_TRACE(scaling);
    const ModelConfig c = ModelConfig::fromJsonText(minimalLlama(scaling), "c");
    EXPECT_EQ(c.rope_scaling.type == RopeScaling::Type::kNone, scaling.empty());
    EXPECT_TRUE(digests.insert(c.computeDigest()).second);
  }
  // LongRoPE's factors in use: the long ones at the whole context, the
  // short ones within the original.
  ModelConfig c = ModelConfig::fromJsonText(minimalLlama(scalings[5]), "c");
  c.fitContext(1024);
  EXPECT_TRUE(digests.insert(c.computeDigest()).second);
  c.fitContext(4096);
  EXPECT_FALSE(digests.insert(c.computeDigest()).second);
}

TEST(ModelConfigParsing, DefaultsFollowTransformers) {
  ModelConfig c = ModelConfig::fromJsonText(minimalLlama(), "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfigParsing, ReadsFieldsAndTokenIds) {
  ModelConfig c = ModelConfig::fromJsonText(
      minimalLlama(R"(, "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": true, "attention_bias": true,
        "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        "max_position_embeddings": 8192, "rope_scaling": null)"),
      "config.json");
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, DType::kF16);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({2}));
  EXPECT_EQ(c.max_position_embeddings, 8192);

  c = ModelConfig::fromJsonText(minimalLlama(R"(, "eos_token_id": [7, 9])"), "config.json");
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({7, 9}));
}

TEST(ModelConfigParsing, ArchitectureSpecifics) {
  const std::string body = R"(, "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000})";
  ModelConfig qwen2 = ModelConfig::fromJsonText(
      R"({"architectures": ["Qwen2ForCausalLM"], "attention_bias": false)" + body, "config.json");
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.qk_norm);
  EXPECT_EQ(qwen2.model_type, "qwen2");

  ModelConfig qwen3 = ModelConfig::fromJsonText(
      R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 128)" + body, "config.json");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_FALSE(qwen3.attention_bias);
  EXPECT_EQ(qwen3.head_dim, 128);

  ModelConfig mistral = ModelConfig::fromJsonText(
      R"({"architectures": ["MistralForCausalLM"], "sliding_window": null)" + body, "config.json");
  EXPECT_EQ(mistral.model_type, "mistral");
  EXPECT_EQ(mistral.head_dim, 32);
  EXPECT_EQ(mistral.sliding_window, 0);
  EXPECT_EQ(ModelConfig::fromJsonText(
                R"({"architectures": ["MistralForCausalLM"], "sliding_window": 4096)" + body,
                "config.json")
                .sliding_window,
            4096);
  // Only Mistral attends within it whenever it is set.
  EXPECT_EQ(
      ModelConfig::fromJsonText(
          R"({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096)" + body, "config.json")
          .sliding_window,
      0);
}

// The mixture fields as transformers' MixtralConfig and Qwen3MoeConfig
// read them, with their defaults; dense architectures have no experts.
TEST(ModelConfigParsing, MixtureOfExpertsFieldsAndDefaults) {
  const std::string body = R"(, "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1000)";
  ModelConfig mixtral = ModelConfig::fromJsonText(
      R"({"architectures": ["MixtralForCausalLM"])" + body + "}", "config.json");
  EXPECT_EQ(mixtral.model_type, "mixtral");
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.num_experts_per_tok, 2);
  EXPECT_EQ(mixtral.moe_intermediate_size, 512);
  EXPECT_TRUE(mixtral.norm_topk_prob);
  EXPECT_FALSE(mixtral.attention_bias);
  EXPECT_FALSE(mixtral.qk_norm);
  EXPECT_EQ(mixtral.head_dim, 32);
  EXPECT_EQ(mixtral.max_position_embeddings, 131072);
  // MixtralConfig's own defaults.
  EXPECT_EQ(mixtral.rope_theta, 1e6);
  EXPECT_EQ(mixtral.rms_norm_eps, 1e-5);
  for (int64_t layer = 0; layer < 4; ++layer) EXPECT_TRUE(mixtral.isMoeLayer(layer));
  mixtral = ModelConfig::fromJsonText(R"({"architectures": ["MixtralForCausalLM"],
      "num_local_experts": 16, "num_experts_per_tok": 4, "sliding_window": 4096,
      "norm_topk_prob": false)" + body + "}",
                                      "config.json");
  EXPECT_EQ(mixtral.num_experts, 16);
  EXPECT_EQ(mixtral.num_experts_per_tok, 4);
  EXPECT_EQ(mixtral.sliding_window, 4096);
  EXPECT_TRUE(mixtral.norm_topk_prob) << "Mixtral always renormalizes its top k";

  ModelConfig qwen = ModelConfig::fromJsonText(
      R"({"architectures": ["Qwen3MoeForCausalLM"])" + body + "}", "config.json");
  EXPECT_EQ(qwen.model_type, "qwen3_moe");
  EXPECT_EQ(qwen.num_experts, 128);
  EXPECT_EQ(qwen.num_experts_per_tok, 8);
  EXPECT_EQ(qwen.moe_intermediate_size, 768);
  EXPECT_FALSE(qwen.norm_topk_prob);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_EQ(qwen.head_dim, 32) << "Qwen3MoeConfig has no head_dim of its own";
  qwen = ModelConfig::fromJsonText(R"({"architectures": ["Qwen3MoeForCausalLM"],
      "num_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 96,
      "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [3, 1, 3])" +
                                       body + "}",
                                   "config.json");
  EXPECT_EQ(qwen.num_experts, 64);
  EXPECT_EQ(qwen.num_experts_per_tok, 6);
  EXPECT_EQ(qwen.moe_intermediate_size, 96);
  EXPECT_TRUE(qwen.norm_topk_prob);
  EXPECT_EQ(qwen.mlp_only_layers, std::vector<int64_t>({1, 3}));
  // Mixtures where (layer + 1) is a multiple of 2 and the layer is not
  // listed: layers 1 and 3 qualify by step, and both are listed.
  EXPECT_FALSE(qwen.isMoeLayer(0));
  EXPECT_FALSE(qwen.isMoeLayer(1));
  EXPECT_FALSE(qwen.isMoeLayer(2));
  EXPECT_FALSE(qwen.isMoeLayer(3));
  EXPECT_TRUE(ModelConfig::fromJsonText(R"({"architectures": ["Qwen3MoeForCausalLM"],
      "decoder_sparse_step": 2)" + body + "}",
                                        "config.json")
                  .isMoeLayer(3));

  // transformers 5 writes Qwen3-MoE's num_experts as num_local_experts.
  EXPECT_EQ(ModelConfig::fromJsonText(R"({"architectures": ["Qwen3MoeForCausalLM"],
      "num_local_experts": 16, "num_experts_per_tok": 2)" +
                                          body + "}",
                                      "config.json")
                .num_experts,
            16);

  ModelConfig llama = ModelConfig::fromJsonText(minimalLlama(R"(, "num_experts": 8)"), "c.json");
  EXPECT_EQ(llama.num_experts, 0);
  EXPECT_FALSE(llama.isMoeLayer(0));

  // The experts are part of what the KV and logits depend on; a dense
  // model's digest does not name them.
  ModelConfig fewer = qwen;
  fewer.num_experts_per_tok = 5;
  EXPECT_NE(fewer.computeDigest(), qwen.computeDigest());
  fewer = qwen;
  fewer.norm_topk_prob = false;
  EXPECT_NE(fewer.computeDigest(), qwen.computeDigest());
  fewer = qwen;
  fewer.mlp_only_layers = {1};
  EXPECT_NE(fewer.computeDigest(), qwen.computeDigest());

  std::string message = parseError(R"({"architectures": ["Qwen3MoeForCausalLM"],
      "num_experts": 4, "num_experts_per_tok": 5)" +
                                   body + "}");
  EXPECT_CONTAINS(message,
                  "dir/config.json: field \"num_experts_per_tok\" must be at most "
                  "num_experts (4), got 5");
  // More than 64 per token is refused at load, never met at the first step.
  message = parseError(R"({"architectures": ["MixtralForCausalLM"], "num_local_experts": 128,
      "num_experts_per_tok": 65)" +
                       body + "}");
  EXPECT_CONTAINS(message,
                  "field \"num_experts_per_tok\" must be a positive integer at most 64, "
                  "got 65");
  message = parseError(R"({"architectures": ["MixtralForCausalLM"], "num_local_experts": 0)" +
                       body + "}");
  EXPECT_CONTAINS(message, "field \"num_local_experts\" must be a positive integer at most 4096");
  message = parseError(R"({"architectures": ["Qwen3MoeForCausalLM"], "mlp_only_layers": [0, 4])" +
                       body + "}");
  EXPECT_CONTAINS(message,
                  "field \"mlp_only_layers\" must be a list of layer indices from 0 to "
                  "num_hidden_layers - 1 (3), got 4");
  message = parseError(R"({"architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 5)" +
                       body + "}");
  EXPECT_CONTAINS(message, "field \"decoder_sparse_step\" must be a positive integer at most 4");
}

TEST(ModelConfigParsing, RejectsBadValuesNamingTheField) {
  std::string message = parseError(minimalLlama(R"(, "num_key_value_heads": 3)"));
  EXPECT_CONTAINS(message, "dir/config.json: field \"num_key_value_heads\"");
  EXPECT_CONTAINS(message, "must divide num_attention_heads (8), got 3");

  message = parseError(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": -4})");
  EXPECT_CONTAINS(message,
                  "field \"hidden_size\" must be a positive integer at most 1048576, got -4");

  message = parseError(R"({"hidden_size": 4})");
  EXPECT_CONTAINS(message, "field \"architectures\"");
  EXPECT_CONTAINS(message, "Qwen3ForCausalLM");

  message = parseError(minimalLlama(R"(, "torch_dtype": "int8")"));
  EXPECT_CONTAINS(message, "\"torch_dtype\" is \"int8\"");
  EXPECT_CONTAINS(message, "bfloat16");

  message = parseError(minimalLlama(R"(, "eos_token_id": [5, 1000])"));
  EXPECT_CONTAINS(message, "\"eos_token_id\"");
  EXPECT_CONTAINS(message, "999");

  message = parseError(minimalLlama(R"(, "hidden_act": "gelu")"));
  EXPECT_CONTAINS(message, "\"hidden_act\" is \"gelu\"");

  message = parseError("[1, 2]");
  EXPECT_CONTAINS(message, "not a JSON object");
}

TEST(ModelConfigParsing, NumberBeyondADoubleIsInvalidJsonNotAnException) {
  EXPECT_EQ(parseError(minimalLlama(R"(, "rope_theta": 1e400)")),
            "dir/config.json: not valid JSON: number overflow parsing '1e400'");
}

TEST(ModelConfigParsing, RefusesAbsurdContextLengthsAndVocabularies) {
  for (const char* value : {"1000000000000000", "1e15", "16777217"}) {
    EXPECT_EQ(parseError(minimalLlama(std::string(R"(, "max_position_embeddings": )") + value)),
              std::string("dir/config.json: field \"max_position_embeddings\" must be a positive "
                          "integer at most 16777216, got ") +
                  (value == std::string("1e15") ? "1e+15" : value));
  }
  EXPECT_EQ(ModelConfig::fromJsonText(minimalLlama(R"(, "max_position_embeddings": 16777216)"),
                                      "config.json")
                .max_position_embeddings,
            16777216);
  EXPECT_CONTAINS(
      parseError(minimalLlama(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1000000000000})")),
      "field \"rope_scaling.original_max_position_embeddings\" must be a positive integer at most "
      "16777216, got 1000000000000");
  EXPECT_CONTAINS(
      parseError(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
          "vocab_size": 4294967296})"),
      "field \"vocab_size\" must be a positive integer at most 2147483647, got 4294967296");
  // A huge width would make the rotary table, or a projection's element
  // count, unallocatable before any weight is read.
  for (const char* field : {"head_dim", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads"}) {
    SCOPED_TRACE(field);
    std::string config = minimalLlama("");
    const std::string key = std::string("\"") + field + "\": ";
    const size_t at = config.find(key);
    if (at == std::string::npos) {
      config = minimalLlama(", " + key + "4611686018427387904");
    } else {
      const size_t end = config.find_first_of(",}", at);
      config.replace(at, end - at, key + "4611686018427387904");
    }
    EXPECT_CONTAINS(parseError(config), std::string("field \"") + field +
                                            "\" must be a positive integer at most 1048576, got "
                                            "4611686018427387904");
  }
  EXPECT_EQ(
      ModelConfig::fromJsonText(minimalLlama(R"(, "head_dim": 1048576)"), "config.json").head_dim,
      1048576);
}

TEST(ModelConfigParsing, RopeScalingLlama3AndRefusals) {
  const std::string llama3 = R"(, "rope_scaling": {"type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})";
  ModelConfig c = ModelConfig::fromJsonText(minimalLlama(llama3), "config.json");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);

  std::string message =
      parseError(minimalLlama(R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0})"));
  EXPECT_CONTAINS(message, "\"dynamic\"");
  EXPECT_CONTAINS(message, "accepted: llama3, linear, longrope, yarn, or null for no scaling");

  message = parseError(minimalLlama(
      R"(, "rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  EXPECT_CONTAINS(message, "\"rope_scaling.factor\" is missing");
}

// YaRN as Qwen's model cards tell users to add it to Qwen3's config.json
// (transformers' _compute_yarn_parameters; the literals are its formula in
// Python floats).
TEST(ModelConfigParsing, RopeScalingYarnAsQwen3PublishesIt) {
  auto qwen3 = [](const std::string& extra, int positions = 40960) {
    return R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
               "intermediate_size": 12288, "num_hidden_layers": 2, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
               "rope_theta": 1000000, "max_position_embeddings": )" +
           std::to_string(positions) + extra + "}";
  };
  const std::string yarn =
      R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 32768})";
  ModelConfig c = ModelConfig::fromJsonText(qwen3(yarn), "config.json");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32768);
  // The context vLLM derives: the original times the factor.
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.ropeAttentionFactor(), 0.1 * std::log(4.0) + 1.0);
  std::vector<float> inv_freq = ropeInverseFrequencies(c);
  ASSERT_EQ(inv_freq.size(), 64u);
  // Pairs up to 23 kept, from 40 divided by 4, blended between.
  for (size_t i = 0; i < 64; ++i) {
    const double unscaled = 1.0 / std::pow(1e6, (2.0 * static_cast<double>(i)) / 128.0);
    if (i <= 23) {
      EXPECT_EQ(inv_freq[i], static_cast<float>(unscaled)) << i;
    }
    if (i >= 40) {
      EXPECT_EQ(inv_freq[i], static_cast<float>(unscaled / 4.0)) << i;
    }
  }
  EXPECT_FLOAT_EQ(inv_freq[20], 0.01333521432163324f);
  EXPECT_FLOAT_EQ(inv_freq[30], 0.0010643609812470017f);
  EXPECT_FLOAT_EQ(inv_freq[50], 5.133812566142866e-06f);
  const std::string digest = c.computeDigest();
  EXPECT_NE(digest, ModelConfig::fromJsonText(qwen3(""), "c").computeDigest());
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);

  // Its options: bounds not rounded, other rotation counts, DeepSeek's
  // mscale pair (a ratio), an attention factor given (taken as it is).
  c = ModelConfig::fromJsonText(
      qwen3(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16,
               "beta_slow": 2, "truncate": false, "original_max_position_embeddings": 32768})"),
      "config.json");
  EXPECT_FLOAT_EQ(ropeInverseFrequencies(c)[30], 0.001157093516936135f);
  EXPECT_NE(c.computeDigest(), digest);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);
  c = ModelConfig::fromJsonText(
      qwen3(R"(, "rope_scaling": {"type": "yarn", "factor": 8, "mscale": 2, "mscale_all_dim": 1})"),
      "config.json");
  EXPECT_DOUBLE_EQ(c.ropeAttentionFactor(), 1.1721471588322);
  // No original given: max_position_embeddings, and the context grows by
  // the factor.
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 40960);
  EXPECT_EQ(c.max_position_embeddings, 327680);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);
  c = ModelConfig::fromJsonText(qwen3(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4,
                                          "mscale": 0, "mscale_all_dim": 1,
                                          "attention_factor": 1.0})"),
                                "config.json");
  EXPECT_EQ(c.ropeAttentionFactor(), 1.0);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);
  // A context larger than the config's already: kept.
  c = ModelConfig::fromJsonText(qwen3(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 2,
                                          "original_max_position_embeddings": 32768})",
                                      262144),
                                "config.json");
  EXPECT_EQ(c.max_position_embeddings, 262144);

  EXPECT_CONTAINS(parseError(qwen3(R"(, "rope_scaling": {"rope_type": "yarn"})")),
                  "dir/config.json: field \"rope_scaling.factor\" is missing (required: a "
                  "positive number)");
  EXPECT_CONTAINS(
      parseError(qwen3(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": 1,
                          "beta_slow": 2})")),
      "field \"rope_scaling.beta_fast\" must be at least beta_slow (2.0), got 1.0");
  EXPECT_CONTAINS(
      parseError(qwen3(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4, "mscale": -1})")),
      "field \"rope_scaling.mscale\" must be a number of at least 0, got -1");
  EXPECT_CONTAINS(
      parseError(qwen3(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4, "truncate": 1})")),
      "field \"rope_scaling.truncate\" must be true or false, got 1");
  EXPECT_CONTAINS(parseError(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                 "intermediate_size": 512, "num_hidden_layers": 2,
                                 "num_attention_heads": 8, "vocab_size": 1000, "rope_theta": 1,
                                 "rope_scaling": {"rope_type": "yarn", "factor": 4}})"),
                  "field \"rope_theta\" must be greater than 1 with yarn scaling, got 1.0");
}

// Gemma 3 as transformers' Gemma3TextConfig reads it: its defaults, which
// layers slide (layer_types, or the older sliding_window_pattern), the
// per-layer-type rotary parameters transformers 5 writes; what it does not
// compute is refused naming the field.
TEST(ModelConfigParsing, Gemma3ReadsItsFieldsAndRefusesWhatItDoesNotCompute) {
  auto gemma = [](const std::string& extra) {
    return R"({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 6, "num_attention_heads": 4,
               "num_key_value_heads": 1, "vocab_size": 1000)" +
           extra + "}";
  };
  ModelConfig c = ModelConfig::fromJsonText(gemma(""), "config.json");
  EXPECT_TRUE(c.gemma);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_local_base_freq, 1e4);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c.sliding_window, 4096);
  // sliding_window_pattern 6: the sixth layer is full, the others slide.
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, true, true, true, true, false}));
  c = ModelConfig::fromJsonText(gemma(R"(, "sliding_window_pattern": 3, "sliding_window": 512)"),
                                "config.json");
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_EQ(c.sliding_window, 512);
  c = ModelConfig::fromJsonText(
      gemma(R"(, "layer_types": ["full_attention", "sliding_attention", "full_attention",
               "sliding_attention", "sliding_attention", "full_attention"],
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_theta": 1000000.0,
               "query_pre_attn_scalar": 168)"),
      "config.json");
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{false, true, false, true, true, false}));
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c.query_pre_attn_scalar, 168.0);
  // Full layers: theta's frequencies over the factor; sliding layers: the
  // local base, unscaled.
  EXPECT_FLOAT_EQ(ropeInverseFrequencies(c)[1],
                  static_cast<float>(std::pow(1e6, -2.0 / 256.0) / 8.0));
  EXPECT_FLOAT_EQ(localRopeInverseFrequencies(c)[1],
                  static_cast<float>(std::pow(1e4, -2.0 / 256.0)));
  c = ModelConfig::fromJsonText(gemma(R"(, "rope_parameters": {
          "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}})"),
                                "config.json");
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_local_base_freq, 20000.0);
  // The arithmetic's fields are in the digest (P and D must agree on them).
  EXPECT_NE(ModelConfig::fromJsonText(gemma(R"(, "sliding_window": 512)"), "c").computeDigest(),
            ModelConfig::fromJsonText(gemma(R"(, "sliding_window": 1024)"), "c").computeDigest());
  EXPECT_NE(
      ModelConfig::fromJsonText(gemma(R"(, "sliding_window_pattern": 2)"), "c").computeDigest(),
      ModelConfig::fromJsonText(gemma(""), "c").computeDigest());

  // Gemma 3 caps nothing unless told to.
  EXPECT_EQ(ModelConfig::fromJsonText(gemma(""), "c").attn_logit_softcapping, 0.0);
  EXPECT_EQ(ModelConfig::fromJsonText(gemma(R"(, "final_logit_softcapping": 30.0)"), "c")
                .final_logit_softcapping,
            30.0);
  EXPECT_CONTAINS(parseError(gemma(R"(, "attn_logit_softcapping": -50.0)")),
                  "\"attn_logit_softcapping\" must be a positive number");
  EXPECT_CONTAINS(parseError(gemma(R"(, "hidden_activation": "gelu")")),
                  "\"hidden_activation\" is \"gelu\", which is not supported (accepted: "
                  "gelu_pytorch_tanh)");
  EXPECT_CONTAINS(parseError(gemma(R"(, "layer_types": ["full_attention"])")),
                  "\"layer_types\" must list num_hidden_layers (6)");
  EXPECT_CONTAINS(parseError(gemma(R"(, "layer_types": ["full_attention", "chunked_attention",
                  "full_attention", "full_attention", "full_attention", "full_attention"])")),
                  "\"chunked_attention\"");
  EXPECT_CONTAINS(
      parseError(gemma(R"(, "rope_parameters": {"full_attention": {"rope_type": "default"},
          "sliding_attention": {"rope_type": "linear", "factor": 2.0}})")),
      "scales the sliding layers' rotary frequencies");
  // YaRN on the full layers (either spelling): its frequencies and
  // attention factor are theirs; the sliding layers rotate unscaled.
  for (const std::string& yarn :
       {std::string(R"(, "rope_parameters": {"full_attention": {"rope_type": "yarn",
          "factor": 4.0}, "sliding_attention": {"rope_type": "default"}})"),
        std::string(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
          "original_max_position_embeddings": 8192})")}) {
    SCOPED_TRACE(yarn);
    c = ModelConfig::fromJsonText(gemma(yarn), "config.json");
    EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
    EXPECT_EQ(c.ropeAttentionFactor(), yarnDefaultAttentionFactor(4.0));
    EXPECT_TRUE(c.localRopeLayer(0));
    EXPECT_FALSE(c.localRopeLayer(5));
    EXPECT_FLOAT_EQ(localRopeInverseFrequencies(c)[1],
                    static_cast<float>(std::pow(1e4, -2.0 / 256.0)));
    EXPECT_NE(ropeInverseFrequencies(c).back(), static_cast<float>(std::pow(1e6, -254.0 / 256.0)));
  }
}

// Gemma 2 as Gemma2Config reads it: every other layer sliding from the
// first, one rotary base, soft-capping 50 / 30 unless given (null: none),
// no q/k norms; rotary scaling refused.
TEST(ModelConfigParsing, Gemma2ReadsItsDefaults) {
  auto gemma2 = [](const std::string& extra) {
    return R"({"architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 4)" + extra + "}";
  };
  ModelConfig c = ModelConfig::fromJsonText(gemma2(""), "config.json");
  EXPECT_TRUE(c.gemma);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.model_type, "gemma2");
  EXPECT_EQ(c.vocab_size, 256000);
  EXPECT_EQ(c.hidden_size, 2304);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_local_base_freq, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, false, true, false}));
  c = ModelConfig::fromJsonText(
      gemma2(R"(, "attn_logit_softcapping": null, "final_logit_softcapping": 20.0,
                "rope_theta": 20000.0, "query_pre_attn_scalar": 144)"),
      "config.json");
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 20.0);
  EXPECT_EQ(c.rope_local_base_freq, 20000.0);
  EXPECT_EQ(c.query_pre_attn_scalar, 144.0);
  EXPECT_NE(c.computeDigest(), ModelConfig::fromJsonText(gemma2(""), "c").computeDigest());
  EXPECT_CONTAINS(parseError(gemma2(R"(, "rope_scaling": {"rope_type": "linear", "factor": 2.0})")),
                  "\"rope_scaling\" is set; Gemma2ForCausalLM's rotary scaling is not supported");
}

// Gemma 3 4B and up are published as Gemma3ForConditionalGeneration: the
// language model's fields are text_config's, with Gemma3TextConfig's
// defaults where it is silent (as published configs are) and the top
// level's dtype and token ids.
TEST(ModelConfigParsing, Gemma3WithAVisionTowerReadsItsTextConfig) {
  const ModelConfig c = ModelConfig::fromJsonText(
      R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "torch_dtype": "bfloat16", "eos_token_id": [1, 106], "mm_tokens_per_image": 256,
          "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
            "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
          "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})",
      "config.json");
  EXPECT_EQ(c.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_TRUE(c.gemma);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.num_hidden_layers, 34);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_EQ(std::count(c.sliding_layers.begin(), c.sliding_layers.end(), false), 5);
  // What it writes nests the language model in text_config again.
  const json written = json::parse(c.toJsonText());
  EXPECT_EQ(written["model_type"], "gemma3");
  EXPECT_EQ(written["text_config"]["model_type"], "gemma3_text");
  EXPECT_EQ(ModelConfig::fromJsonText(written.dump(), "config.json"), c);
  EXPECT_CONTAINS(parseError(R"({"architectures": ["Gemma3ForConditionalGeneration"]})"),
                  "\"text_config\" must be an object");
}

// Mistral Small 3.1 and 3.2 are published as
// Mistral3ForConditionalGeneration: the language model is text_config's
// MistralConfig (with its untied embeddings whatever the top level says,
// as vLLM reads it); another text model is refused naming the field.
TEST(ModelConfigParsing, Mistral3WithAVisionTowerReadsItsTextConfig) {
  const auto mistral3 = [](const std::string& text_model_type, const std::string& top) {
    return R"({"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
          "model_type": "mistral3", "multimodal_projector_bias": false,
          "projector_hidden_act": "gelu", "spatial_merge_size": 2,
          "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 32768,
            "max_position_embeddings": 131072, "model_type": )" +
           text_model_type + R"(, "num_attention_heads": 32,
            "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
            "rope_theta": 1000000000.0, "sliding_window": null, "use_cache": true,
            "vocab_size": 131072},
          "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1024,
            "model_type": "pixtral"}, "vision_feature_layer": -1)" +
           top + "}";
  };
  const ModelConfig c = ModelConfig::fromJsonText(
      mistral3("\"mistral\"", R"(, "tie_word_embeddings": true)"), "config.json");
  EXPECT_EQ(c.architecture, "Mistral3ForConditionalGeneration");
  EXPECT_TRUE(c.conditionalGeneration());
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.vocab_size, 131072);
  EXPECT_EQ(c.rope_theta, 1e9);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  const json written = json::parse(c.toJsonText());
  EXPECT_EQ(written["model_type"], "mistral3");
  EXPECT_EQ(written["text_config"]["model_type"], "mistral");
  EXPECT_FALSE(written.contains("hidden_size"));
  EXPECT_EQ(ModelConfig::fromJsonText(written.dump(), "config.json"), c);
  // The same language model as a MistralForCausalLM of these fields.
  ModelConfig causal = c;
  causal.architecture = "MistralForCausalLM";
  const json text = json::parse(mistral3("\"mistral\"", ""))["text_config"];
  json flat = text;
  flat["architectures"] = {"MistralForCausalLM"};
  flat["torch_dtype"] = "bfloat16";
  EXPECT_EQ(ModelConfig::fromJsonText(flat.dump(), "config.json"), causal);
  EXPECT_CONTAINS(parseError(mistral3("\"llama\"", "")),
                  "field \"text_config\" has model_type \"llama\", which is not supported with "
                  "Mistral3ForConditionalGeneration (accepted: \"mistral\", \"ministral3\")");
  EXPECT_CONTAINS(parseError(R"({"architectures": ["Mistral3ForConditionalGeneration"]})"),
                  "\"text_config\" must be an object");
}

// Ministral 3 as Ministral3Config reads it: Mistral with YaRN and the
// query scale in rope_parameters (Ministral3Config's own when absent),
// 1 + beta ln(1 + floor(p / original)); alone or as Mistral 3's
// text_config; in the digest; written back where it was read from.
TEST(ModelConfigParsing, Ministral3ReadsItsQueryScale) {
  const auto ministral = [](const std::string& extra) {
    return R"({"architectures": ["Ministral3ForCausalLM"], "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
               "num_key_value_heads": 2, "vocab_size": 1000)" +
           extra + "}";
  };
  // Ministral3Config's defaults.
  ModelConfig c = ModelConfig::fromJsonText(ministral(""), "config.json");
  EXPECT_EQ(c.model_type, "ministral3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.ropeAttentionFactor(), 1.0);  // mscale and mscale_all_dim both 1
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.llama4_scaling_beta, 0.1);
  EXPECT_EQ(c.llama4_scaling_original, 16384);
  EXPECT_EQ(c.queryScale(0), 1.0f);
  EXPECT_EQ(c.queryScale(16383), 1.0f);
  EXPECT_EQ(c.queryScale(16384), static_cast<float>(1.0 + 0.1 * std::log(2.0)));
  EXPECT_EQ(c.queryScale(32767), static_cast<float>(1.0 + 0.1 * std::log(2.0)));
  EXPECT_EQ(c.queryScale(131072), static_cast<float>(1.0 + 0.1 * std::log(9.0)));
  // As given, and as Mistral 3's language model.
  const std::string rope =
      R"(, "max_position_embeddings": 131072, "rope_parameters": {"type": "yarn",
          "rope_theta": 1000000.0, "factor": 8.0, "original_max_position_embeddings": 16384,
          "max_position_embeddings": 131072, "beta_fast": 32.0, "beta_slow": 1.0,
          "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.2})";
  c = ModelConfig::fromJsonText(ministral(rope), "config.json");
  EXPECT_EQ(c.llama4_scaling_beta, 0.2);
  EXPECT_EQ(c.queryScale(16384 * 3), static_cast<float>(1.0 + 0.2 * std::log(4.0)));
  json text = json::parse(ministral(rope));
  text.erase("architectures");
  text["model_type"] = "ministral3";
  const ModelConfig conditional =
      ModelConfig::fromJsonText(json({{"architectures", {"Mistral3ForConditionalGeneration"}},
                                      {"text_config", text},
                                      {"torch_dtype", "bfloat16"}})
                                    .dump(),
                                "config.json");
  EXPECT_EQ(conditional.llama4_scaling_beta, 0.2);
  EXPECT_EQ(conditional.rope_scaling, c.rope_scaling);
  EXPECT_EQ(ModelConfig::fromJsonText(conditional.toJsonText(), "config.json"), conditional);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);
  // Without a beta, no scale; the digest tells the two apart.
  ModelConfig unscaled = ModelConfig::fromJsonText(
      ministral(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})"),
      "config.json");
  EXPECT_EQ(unscaled.llama4_scaling_beta, 0.0);
  EXPECT_EQ(unscaled.queryScale(1 << 20), 1.0f);
  // Written with its plain rotary parameters, not read back as the defaults.
  EXPECT_EQ(ModelConfig::fromJsonText(unscaled.toJsonText(), "config.json"), unscaled);
  ModelConfig scaled = unscaled;
  scaled.llama4_scaling_beta = 0.1;
  scaled.llama4_scaling_original = 16384;
  EXPECT_NE(scaled.computeDigest(), unscaled.computeDigest());
  EXPECT_EQ(ModelConfig::fromJsonText(scaled.toJsonText(), "config.json"), scaled);
  EXPECT_EQ(json::parse(scaled.toJsonText())["rope_scaling"]["rope_type"], "default");
  EXPECT_CONTAINS(parseError(ministral(R"(, "rope_parameters": {"rope_type": "default",
          "llama_4_scaling_beta": -1})")),
                  "field \"rope_parameters.llama_4_scaling_beta\" must be a number of at least 0");
  EXPECT_CONTAINS(parseError(ministral(R"(, "rope_parameters": {"rope_type": "default",
          "llama_4_scaling_beta": 0.1})")),
                  "field \"rope_parameters.original_max_position_embeddings\" is missing");
}

// Its tensors as published (language_model.model.*, the LM head under
// language_model.) or as transformers 4.52 and later save them
// (model.language_model.*, lm_head.weight): the same weights as the
// MistralForCausalLM they were renamed from, vision tensors passed by.
TEST(ModelLoading, Mistral3CheckpointsLoadTheirLanguageModel) {
  TempDir causal_dir;
  writeTiny(causal_dir.path(), "MistralForCausalLM", DType::kBF16);
  const std::unique_ptr<Model> causal = Model::load(causal_dir.path());
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    TempDir dir;
    json text = json::parse(readFile(causal_dir.path() / "config.json"));
    json top = {{"architectures", {"Mistral3ForConditionalGeneration"}},
                {"model_type", "mistral3"},
                {"torch_dtype", text["torch_dtype"]},
                {"vision_config", {{"hidden_size", 4}}}};
    text.erase("architectures");
    top["text_config"] = text;
    writeFile(dir.path() / "config.json", top.dump());
    SafetensorsFile file(causal_dir.path() / "model.safetensors");
    SafetensorsWriter writer;
    for (const auto& [name, tensor] : file.tensors()) {
      std::string renamed = name;
      if (name.starts_with("model.")) {
        renamed = prefix + name.substr(6);
      } else if (name == "lm_head.weight" && prefix == "language_model.model.") {
        renamed = "language_model.lm_head.weight";
      }
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      writer.add(renamed, tensor.dtype, tensor.shape,
                 std::vector<uint8_t>(bytes, bytes + tensor.num_bytes));
    }
    writer.add("vision_tower.patch_conv.weight", DType::kF32, {4, 4},
               std::vector<uint8_t>(16 * sizeof(float)));
    writer.write(dir.path() / "model.safetensors");
    for (const fs::path& other : fs::directory_iterator(causal_dir.path())) {
      if (!fs::exists(dir.path() / other.filename())) {
        fs::copy_file(other, dir.path() / other.filename());
      }
    }
    const std::unique_ptr<Model> model = Model::load(dir.path());
    EXPECT_FALSE(model->config().tie_word_embeddings);
    expectSameWeights(model->weights(), causal->weights());
  }
}

// A tiny test model of `architecture` written in f32 and loaded, and its
// file open beside it to read tensors as stored.
struct LoadedF32TestModel {
  explicit LoadedF32TestModel(const std::string& architecture) {
    tools::TestModelOptions options;
    options.architecture = architecture;
    options.dtype = DType::kF32;
    tools::writeTestModel(options, dir.path());
    model = Model::load(dir.path());
    file = std::make_unique<SafetensorsFile>(dir.path() / "model.safetensors");
  }
  // A tensor's values as the file holds them (empty, and a failure, when
  // it is missing).
  std::vector<float> raw(const std::string& name) const {
    const TensorInfo* info = file->find(name);
    EXPECT_NE(info, nullptr) << name;
    if (info == nullptr) return {};
    std::vector<float> values(info->num_bytes / sizeof(float));
    std::memcpy(values.data(), info->data, info->num_bytes);
    return values;
  }
  TempDir dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<SafetensorsFile> file;
};

// Gemma's norm weights are offsets from 1: loaded as 1 + w, so the norm
// kernel is Llama's.
TEST(ModelLoading, Gemma3NormWeightsAreLoadedAsOnePlusTheirValues) {
  const LoadedF32TestModel loaded("Gemma3ForCausalLM");
  const std::unique_ptr<Model>& model = loaded.model;
  const LayerWeights& layer = model->weights().layers[0];
  const std::pair<const std::vector<float>*, const char*> norms[] = {
      {&layer.input_layernorm, "model.layers.0.input_layernorm.weight"},
      {&layer.post_attention_layernorm, "model.layers.0.post_attention_layernorm.weight"},
      {&layer.pre_feedforward_layernorm, "model.layers.0.pre_feedforward_layernorm.weight"},
      {&layer.post_feedforward_layernorm, "model.layers.0.post_feedforward_layernorm.weight"},
      {&layer.q_norm, "model.layers.0.self_attn.q_norm.weight"},
      {&model->weights().norm, "model.norm.weight"},
  };
  for (const auto& [weights, name] : norms) {
    SCOPED_TRACE(name);
    const std::vector<float> stored = loaded.raw(name);
    ASSERT_EQ(weights->size(), stored.size());
    for (size_t i = 0; i < stored.size(); ++i) EXPECT_EQ((*weights)[i], 1.0f + stored[i]);
  }
  EXPECT_EQ(model->weights().lm_head.data, model->weights().embed_tokens.data);
}

// GLM-4's four norms are read into the sandwich's places by their names
// (its post_attention_layernorm is the one before the MLP), as stored (no
// offset), and its gate_up_proj as gate's rows, then up's.
TEST(ModelLoading, Glm4SandwichNormsAndFusedGateUpAreReadIntoTheirPlaces) {
  const LoadedF32TestModel loaded("Glm4ForCausalLM");
  const std::unique_ptr<Model>& model = loaded.model;
  const LayerWeights& layer = model->weights().layers[1];
  const std::pair<const std::vector<float>*, const char*> norms[] = {
      {&layer.input_layernorm, "model.layers.1.input_layernorm.weight"},
      {&layer.post_attention_layernorm, "model.layers.1.post_self_attn_layernorm.weight"},
      {&layer.pre_feedforward_layernorm, "model.layers.1.post_attention_layernorm.weight"},
      {&layer.post_feedforward_layernorm, "model.layers.1.post_mlp_layernorm.weight"},
  };
  for (const auto& [weights, name] : norms) {
    SCOPED_TRACE(name);
    EXPECT_EQ(*weights, loaded.raw(name));
  }
  EXPECT_TRUE(layer.q_norm.empty());
  ASSERT_EQ(layer.q_bias.size(),
            static_cast<size_t>(model->config().num_attention_heads * model->config().head_dim));
  EXPECT_EQ(layer.q_bias, loaded.raw("model.layers.1.self_attn.q_proj.bias"));
  const TensorInfo* gate_up = loaded.file->find("model.layers.1.mlp.gate_up_proj.weight");
  ASSERT_NE(gate_up, nullptr);
  const int64_t inter = model->config().intermediate_size;
  const size_t half_bytes =
      static_cast<size_t>(inter * model->config().hidden_size) * sizeof(float);
  ASSERT_EQ(gate_up->num_bytes, 2 * half_bytes);
  const auto* base = static_cast<const uint8_t*>(gate_up->data);
  EXPECT_EQ(layer.gate_proj.rows, inter);
  EXPECT_EQ(layer.up_proj.rows, inter);
  EXPECT_EQ(std::memcmp(layer.gate_proj.data, base, half_bytes), 0);
  EXPECT_EQ(std::memcmp(layer.up_proj.data, base + half_bytes, half_bytes), 0);
  // Views of the one mapped tensor, not copies: up's rows follow gate's.
  EXPECT_EQ(static_cast<const uint8_t*>(layer.up_proj.data),
            static_cast<const uint8_t*>(layer.gate_proj.data) + half_bytes);
}

// Phi-3 holds q/k/v in one matrix and gate/up in another: the loaded
// projections are views of their rows, in that order, without copies; an
// fp8 one's scales are sliced with them.
TEST(ModelLoading, Phi3FusedMatricesAreReadAsTheirRowRanges) {
  for (const char* spec : {"", "compressed-tensors", "fp8:block=16x32", "fp8:tensor"}) {
    SCOPED_TRACE(spec);
    TempDir dir;
    if (*spec == 0) {
      writeTiny(dir.path(), "Phi3ForCausalLM", DType::kF32);
    } else {
      writeTinyFp8(dir.path(), spec, "Phi3ForCausalLM");
    }
    const std::unique_ptr<Model> model = Model::load(dir.path());
    const ModelConfig& c = model->config();
    SafetensorsFile file(dir.path() / "model.safetensors");
    const LayerWeights& layer = model->weights().layers[1];
    const TensorInfo* qkv = file.find("model.layers.1.self_attn.qkv_proj.weight");
    const TensorInfo* gate_up = file.find("model.layers.1.mlp.gate_up_proj.weight");
    ASSERT_NE(qkv, nullptr);
    ASSERT_NE(gate_up, nullptr);
    EXPECT_EQ(file.find("model.layers.1.self_attn.q_proj.weight"), nullptr);
    const size_t row = static_cast<size_t>(c.hidden_size) * dtypeSize(qkv->dtype);
    const auto* base = static_cast<const uint8_t*>(qkv->data);
    const int64_t q_rows = c.num_attention_heads * c.head_dim;
    const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
    // Views into the model's one mapping of each tensor, holding its rows.
    auto at = [](const kernels::WeightView& view) {
      return static_cast<const uint8_t*>(view.data);
    };
    EXPECT_EQ(at(layer.k_proj), at(layer.q_proj) + static_cast<size_t>(q_rows) * row);
    EXPECT_EQ(at(layer.v_proj), at(layer.k_proj) + static_cast<size_t>(kv_rows) * row);
    EXPECT_EQ(std::memcmp(at(layer.q_proj), base, qkv->num_bytes), 0);
    EXPECT_EQ(layer.q_proj.rows, q_rows);
    EXPECT_EQ(layer.k_proj.rows, kv_rows);
    EXPECT_EQ(layer.v_proj.rows, kv_rows);
    EXPECT_EQ(at(layer.up_proj),
              at(layer.gate_proj) + static_cast<size_t>(c.intermediate_size) * row);
    EXPECT_EQ(std::memcmp(at(layer.gate_proj), gate_up->data, gate_up->num_bytes), 0);
    EXPECT_EQ(layer.gate_proj.rows, c.intermediate_size);
    EXPECT_EQ(layer.up_proj.rows, c.intermediate_size);
    if (*spec == 0) {
      EXPECT_EQ(layer.q_proj.scales, nullptr);
      continue;
    }
    // Each slice's element (r, k) has the scale the whole matrix's row
    // (begin + r) has.
    const std::string scale_name = c.quantization.scaleTensorOf(qkv->name);
    const TensorInfo* scales = file.find(scale_name);
    ASSERT_NE(scales, nullptr) << scale_name;
    std::vector<float> grid(scales->num_bytes / dtypeSize(scales->dtype));
    convertToF32(scales->dtype, scales->data, grid.data(), grid.size());
    kernels::WeightView whole{qkv->data, qkv->dtype, q_rows + 2 * kv_rows, c.hidden_size};
    std::tie(whole.scale_rows, whole.scale_cols) =
        c.quantization.scaleBlock(whole.rows, whole.cols);
    whole.scales = grid.data();
    int64_t begin = 0;
    for (const kernels::WeightView* part : {&layer.q_proj, &layer.k_proj, &layer.v_proj}) {
      for (int64_t r = 0; r < part->rows; r += 7) {
        for (int64_t k = 0; k < part->cols; k += 13) {
          ASSERT_EQ(part->scaleAt(r, k), whole.scaleAt(begin + r, k)) << begin << " " << r;
        }
      }
      begin += part->rows;
    }
  }
  // Scale blocks straddling q, k and v cannot be sliced: named.
  TempDir dir;
  writeTinyFp8(dir.path(), "fp8:block=48x32", "Phi3ForCausalLM");
  EXPECT_CONTAINS(loadError(dir.path()),
                  "tensor model.layers.0.self_attn.qkv_proj.weight in " +
                      (dir.path() / "model.safetensors").string() +
                      ": its rows 64..95 (one of the matrices it holds) start inside a block of "
                      "48 rows sharing a scale");
}

// Phi3Config's fields as Phi-3-mini-4k, Phi-3.5-mini and Phi-4-mini publish
// them: partial rotary dims, LongRoPE (the long factors when the served
// context exceeds original_max_position_embeddings, the attention factor's
// default), a window on every layer; what cannot be computed is named.
TEST(ModelConfigParsing, Phi3ReadsPartialRotaryLongRopeAndItsWindow) {
  auto factors = [](int count, double step) {
    std::string text = "[";
    for (int i = 0; i < count; ++i) {
      text += (i ? ", " : "") + json(1.0 + step * i).dump();
    }
    return text + "]";
  };
  auto phi = [&](const std::string& extra) {
    return R"({"architectures": ["Phi3ForCausalLM"], "hidden_size": 3072,
               "intermediate_size": 8192, "num_hidden_layers": 3, "num_attention_heads": 24,
               "num_key_value_heads": 8, "vocab_size": 200064)" +
           extra + "}";
  };
  const std::string mini4 =
      R"(, "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
          "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
          "rope_scaling": {"type": "longrope", "short_factor": )" +
      factors(48, 0.01) + R"(, "long_factor": )" + factors(48, 0.5) + "}";
  ModelConfig c = ModelConfig::fromJsonText(phi(mini4), "config.json");
  EXPECT_TRUE(c.phi3);
  EXPECT_EQ(c.model_type, "phi3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 96);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_TRUE(c.rope_scaling.use_long);
  const double mscale = std::sqrt(1.0 + std::log(32.0) / std::log(4096.0));
  EXPECT_DOUBLE_EQ(c.ropeAttentionFactor(), mscale);
  std::vector<float> inv_freq = ropeInverseFrequencies(c);
  ASSERT_EQ(inv_freq.size(), 48u);
  EXPECT_FLOAT_EQ(inv_freq[5], static_cast<float>(1.0 / (3.5 * std::pow(1e4, 10.0 / 96.0))));
  const std::string long_digest = c.computeDigest();
  // Served within the original context: the short factors, another model.
  c.fitContext(4096);
  EXPECT_FALSE(c.rope_scaling.use_long);
  inv_freq = ropeInverseFrequencies(c);
  EXPECT_FLOAT_EQ(inv_freq[5], static_cast<float>(1.0 / (1.05 * std::pow(1e4, 10.0 / 96.0))));
  EXPECT_NE(c.computeDigest(), long_digest);
  c.fitContext(4097);
  EXPECT_EQ(c.computeDigest(), long_digest);
  EXPECT_TRUE(c.sliding_layers.empty());

  // An attention factor given is taken; "su" is LongRoPE's older name.
  c = ModelConfig::fromJsonText(
      phi(R"(, "max_position_embeddings": 8192, "rope_scaling": {"type": "su",
              "attention_factor": 1.5, "short_factor": )" +
          factors(64, 0.0) + R"(, "long_factor": )" + factors(64, 1.0) + "}"),
      "config.json");
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);  // none given: the context
  EXPECT_FALSE(c.rope_scaling.use_long);
  EXPECT_EQ(c.ropeAttentionFactor(), 1.5);
  // Written back as read: the attention factor given; 30 of 44 dims, whose
  // factor 30 / 44 int() would read back as 29 unless rounded up.
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);
  c = ModelConfig::fromJsonText(phi(R"(, "head_dim": 44, "partial_rotary_factor": 0.6818182)"),
                                "config.json");
  EXPECT_EQ(c.rotary_dim, 30);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);

  // Phi-3-mini-4k: a window on every layer; Phi-4: none of it.
  c = ModelConfig::fromJsonText(phi(R"(, "sliding_window": 2047)"), "config.json");
  EXPECT_EQ(c.sliding_window, 2047);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_NE(c.computeDigest(), ModelConfig::fromJsonText(phi(""), "c").computeDigest());
  c = ModelConfig::fromJsonText(phi(""), "config.json");
  EXPECT_EQ(c.rotary_dim, c.head_dim);
  EXPECT_EQ(c.ropeAttentionFactor(), 1.0);
  EXPECT_TRUE(c.sliding_layers.empty());

  EXPECT_CONTAINS(
      parseError(phi(R"(, "rope_scaling": {"type": "longrope", "short_factor": )" +
                     factors(47, 0.1) + R"(, "long_factor": )" + factors(64, 0.1) + "}")),
      "\"rope_scaling.short_factor\" must hold one factor per rotary pair (rotary "
      "dims / 2 = 64), got 47");
  EXPECT_CONTAINS(parseError(phi(R"(, "rope_scaling": {"type": "longrope", "short_factor": [1, -2],
                                    "long_factor": [1, 2]})")),
                  "\"rope_scaling.short_factor\" must be a list of positive numbers, got [1,-2]");
  EXPECT_CONTAINS(parseError(phi(R"(, "head_dim": 10, "partial_rotary_factor": 0.3)")),
                  "\"partial_rotary_factor\" must give an even number of rotary dims from 2 to "
                  "head_dim (10) as int(head_dim x factor), got 0.3 (3 dims)");
  EXPECT_CONTAINS(parseError(phi(R"(, "rope_scaling": {"type": "dynamic", "factor": 4.0})")),
                  "has rope type \"dynamic\", which is not supported (accepted: llama3, linear, "
                  "longrope, yarn, or null for no scaling)");
  EXPECT_CONTAINS(parseError(phi(R"(, "hidden_act": "gelu_new")")),
                  "\"hidden_act\" is \"gelu_new\", which is not supported (accepted: silu)");
}

// Granite 3's four scalars as GraniteConfig reads them (1.0 unless given),
// each part of the digest; a non-positive one is refused naming it.
TEST(ModelConfigParsing, GraniteReadsItsMultipliers) {
  auto granite = [](const std::string& extra) {
    return R"({"architectures": ["GraniteForCausalLM"], "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
               "vocab_size": 1000)" +
           extra + "}";
  };
  ModelConfig c = ModelConfig::fromJsonText(granite(""), "config.json");
  EXPECT_TRUE(c.granite);
  EXPECT_EQ(c.model_type, "granite");
  EXPECT_EQ(c.embedding_multiplier, 1.0);
  EXPECT_EQ(c.attention_multiplier, 1.0);
  EXPECT_EQ(c.residual_multiplier, 1.0);
  EXPECT_EQ(c.logits_scaling, 1.0);
  const std::string published =
      R"(, "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125,
          "residual_multiplier": 0.22, "logits_scaling": 16.0)";
  c = ModelConfig::fromJsonText(granite(published), "config.json");
  EXPECT_EQ(c.embedding_multiplier, 12.0);
  EXPECT_EQ(c.attention_multiplier, 0.0078125);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.logits_scaling, 16.0);
  for (const char* field :
       {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"}) {
    SCOPED_TRACE(field);
    ModelConfig changed = c;
    (std::string(field) == "embedding_multiplier"   ? changed.embedding_multiplier
     : std::string(field) == "attention_multiplier" ? changed.attention_multiplier
     : std::string(field) == "residual_multiplier"  ? changed.residual_multiplier
                                                    : changed.logits_scaling) = 3.0;
    EXPECT_NE(changed.computeDigest(), c.computeDigest());
    EXPECT_CONTAINS(parseError(granite(std::string(R"(, ")") + field + R"(": 0)")),
                    std::string("\"") + field + "\" must be a positive number, got 0");
  }
  // A Llama config's digest is what it was: the scalars are Granite's.
  EXPECT_EQ(ModelConfig::fromJsonText(minimalLlama(published), "c").computeDigest(),
            ModelConfig::fromJsonText(minimalLlama(), "c").computeDigest());
}

// OLMo 2 as Olmo2Config reads it: q/k norms (across heads, loaded as
// such), rms_norm_eps 1e-5 unless given, in the digest.
TEST(ModelConfigParsing, Olmo2ReadsItsDefaults) {
  const std::string olmo =
      R"({"architectures": ["Olmo2ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000})";
  const ModelConfig c = ModelConfig::fromJsonText(olmo, "config.json");
  EXPECT_TRUE(c.olmo2);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.model_type, "olmo2");
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  // The same numbers as a Llama-family model with q/k norms are another model.
  ModelConfig qwen3_like = c;
  qwen3_like.olmo2 = false;
  EXPECT_NE(qwen3_like.computeDigest(), c.computeDigest());
}

// OLMo 3 as Olmo3Config reads it: OLMo 2's arithmetic, a window of 4096
// on all but every 4th layer unless layer_types says which; its sliding
// layers rotate unscaled (rope_theta's frequencies, no attention factor),
// the full ones with the published YaRN; all in the digest.
TEST(ModelConfigParsing, Olmo3ReadsItsSlidingLayersAndRotatesThemUnscaled) {
  auto olmo = [](const std::string& extra) {
    return R"({"architectures": ["Olmo3ForCausalLM"], "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
               "vocab_size": 1000)" +
           extra + "}";
  };
  ModelConfig c = ModelConfig::fromJsonText(olmo(""), "config.json");
  EXPECT_TRUE(c.olmo3);
  EXPECT_TRUE(c.olmo2);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.model_type, "olmo3");
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.sliding_layers,
            (std::vector<bool>{true, true, true, false, true, true, true, false}));
  EXPECT_TRUE(c.localRopeLayer(0));
  EXPECT_FALSE(c.localRopeLayer(3));
  // As Olmo-3-7B-Instruct publishes it.
  const std::string published =
      R"(, "rope_theta": 500000, "max_position_embeddings": 65536, "sliding_window": 4096,
          "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32,
          "beta_slow": 1, "factor": 8.0, "original_max_position_embeddings": 8192,
          "rope_type": "yarn"})";
  c = ModelConfig::fromJsonText(olmo(published), "config.json");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.max_position_embeddings, 65536);
  EXPECT_EQ(c.rope_local_base_freq, 500000.0);
  EXPECT_DOUBLE_EQ(c.ropeAttentionFactor(), 1.2079441541679836);
  // Sliding layers: theta's own frequencies; full ones: YaRN's, the
  // lowest divided by the factor.
  const std::vector<float> local = localRopeInverseFrequencies(c);
  const std::vector<float> full = ropeInverseFrequencies(c);
  for (size_t i = 0; i < local.size(); ++i) {
    EXPECT_FLOAT_EQ(local[i], static_cast<float>(std::pow(500000.0, -2.0 * i / 32.0))) << i;
  }
  EXPECT_FLOAT_EQ(full[0], local[0]);
  EXPECT_FLOAT_EQ(full.back(), local.back() / 8.0f);
  c = ModelConfig::fromJsonText(
      olmo(R"(, "sliding_window": 512, "layer_types": ["full_attention", "sliding_attention",
          "sliding_attention", "sliding_attention", "full_attention", "full_attention",
          "sliding_attention", "full_attention"])"),
      "config.json");
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.sliding_layers,
            (std::vector<bool>{false, true, true, true, false, false, true, false}));
  // No sliding layer: no window.
  c = ModelConfig::fromJsonText(olmo(R"(, "layer_types": ["full_attention", "full_attention",
          "full_attention", "full_attention", "full_attention", "full_attention",
          "full_attention", "full_attention"])"),
                                "config.json");
  EXPECT_TRUE(c.sliding_layers.empty());
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);
  EXPECT_CONTAINS(parseError(olmo(R"(, "layer_types": ["sliding_attention"])")),
                  "field \"layer_types\" must list num_hidden_layers (8)");
  EXPECT_CONTAINS(parseError(olmo(R"(, "sliding_window": 0)")),
                  "field \"sliding_window\" must be a positive integer");
  // The window, which layers slide, and the architecture (whose sliding
  // layers rotate unscaled) are in the digest.
  const std::string digest = ModelConfig::fromJsonText(olmo(published), "c").computeDigest();
  EXPECT_NE(ModelConfig::fromJsonText(olmo(published + R"(, "sliding_window": 2048)"), "c")
                .computeDigest(),
            digest);
  EXPECT_NE(ModelConfig::fromJsonText(olmo(published + R"(, "layer_types": ["sliding_attention",
          "full_attention", "sliding_attention", "full_attention", "sliding_attention",
          "full_attention", "sliding_attention", "full_attention"])"),
                                      "c")
                .computeDigest(),
            digest);
  ModelConfig olmo2_like = ModelConfig::fromJsonText(olmo(published), "c");
  olmo2_like.architecture = "Olmo2ForCausalLM";
  EXPECT_NE(olmo2_like.computeDigest(), digest);
}

// GLM and GLM-4 as GlmConfig and Glm4Config read them: half of each head
// rotating (partial_rotary_factor, at the top level or in transformers 5's
// rope_parameters) as neighbour pairs, q/k/v biases, GlmConfig's own
// defaults; GLM-4's sandwich norms. Rotary dims, pairs and sandwich enter
// the digest.
TEST(ModelConfigParsing, GlmReadsItsPartialInterleavedRotaryAndDefaults) {
  // GLM-4-9B-0414's shape, as its config.json gives it.
  const std::string published =
      R"({"architectures": ["Glm4ForCausalLM"], "attention_bias": true,
          "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
          "hidden_size": 4096, "intermediate_size": 13696, "max_position_embeddings": 32768,
          "model_type": "glm4", "num_attention_heads": 32, "num_hidden_layers": 40,
          "num_key_value_heads": 2, "pad_token_id": 151329, "partial_rotary_factor": 0.5,
          "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
          "torch_dtype": "bfloat16", "vocab_size": 151552})";
  const ModelConfig c = ModelConfig::fromJsonText(published, "config.json");
  EXPECT_TRUE(c.glm);
  EXPECT_TRUE(c.glm4);
  EXPECT_TRUE(c.sandwichNorms());
  EXPECT_TRUE(c.preFeedforwardNorm());
  EXPECT_TRUE(c.fusedGateUp());
  EXPECT_FALSE(c.fusedQkv());
  EXPECT_EQ(c.model_type, "glm4");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151329, 151336, 151338}));
  // One frequency per rotating pair: theta^(-2i/64) over 32 pairs.
  const std::vector<float> frequencies = ropeInverseFrequencies(c);
  ASSERT_EQ(frequencies.size(), 32u);
  for (size_t i = 0; i < frequencies.size(); ++i) {
    EXPECT_FLOAT_EQ(frequencies[i], static_cast<float>(std::pow(10000.0, -2.0 * i / 64.0))) << i;
  }
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);

  // What GlmConfig gives where a config is silent.
  auto glm = [](const std::string& architecture, const std::string& extra) {
    return R"({"architectures": [")" + architecture +
           R"("], "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "vocab_size": 1000)" +
           extra + "}";
  };
  const ModelConfig defaults = ModelConfig::fromJsonText(glm("GlmForCausalLM", ""), "config.json");
  EXPECT_TRUE(defaults.glm);
  EXPECT_FALSE(defaults.glm4);
  EXPECT_FALSE(defaults.sandwichNorms());
  EXPECT_TRUE(defaults.fusedGateUp());
  EXPECT_EQ(defaults.model_type, "glm");
  EXPECT_EQ(defaults.head_dim, 128);
  EXPECT_EQ(defaults.rotary_dim, 64);
  EXPECT_EQ(defaults.num_key_value_heads, 2);
  EXPECT_EQ(defaults.rms_norm_eps, 1.5625e-7);
  EXPECT_TRUE(defaults.attention_bias);
  EXPECT_EQ(defaults.max_position_embeddings, 131072);
  EXPECT_EQ(ModelConfig::fromJsonText(defaults.toJsonText(), "config.json"), defaults);
  // transformers 5 writes the factor into rope_parameters; the top level's
  // wins where both are given.
  const ModelConfig three_quarters = ModelConfig::fromJsonText(
      glm("Glm4ForCausalLM", R"(, "rope_parameters": {"rope_type": "default",
          "rope_theta": 10000.0, "partial_rotary_factor": 0.75})"),
      "config.json");
  EXPECT_EQ(three_quarters.rotary_dim, 96);
  EXPECT_EQ(ModelConfig::fromJsonText(glm("Glm4ForCausalLM", R"(, "partial_rotary_factor": 0.25,
                    "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75})"),
                                      "config.json")
                .rotary_dim,
            32);
  EXPECT_EQ(ModelConfig::fromJsonText(three_quarters.toJsonText(), "config.json"), three_quarters);

  // GLM and GLM-4 of one shape, and other rotary dims, are other models.
  const ModelConfig glm4 = ModelConfig::fromJsonText(glm("Glm4ForCausalLM", ""), "config.json");
  EXPECT_NE(glm4.computeDigest(), defaults.computeDigest());
  EXPECT_NE(three_quarters.computeDigest(), glm4.computeDigest());
  ModelConfig halves = glm4;
  halves.glm = false;  // the same fields rotating halves
  EXPECT_NE(halves.computeDigest(), glm4.computeDigest());

  EXPECT_CONTAINS(parseError(glm("GlmForCausalLM", R"(, "partial_rotary_factor": 0.001)")),
                  "field \"partial_rotary_factor\" must give an even number of rotary dims from 2 "
                  "to head_dim (128)");
  EXPECT_CONTAINS(parseError(glm("Glm4ForCausalLM", R"(, "partial_rotary_factor": "half")")),
                  "partial_rotary_factor");
  // A factor past any integer's range is refused as any above 1 (a fuzz
  // finding: the product was once made an integer first).
  EXPECT_CONTAINS(parseError(glm("GlmForCausalLM", R"(, "partial_rotary_factor": 1.8e20)")),
                  "field \"partial_rotary_factor\" must give an even number of rotary dims from 2 "
                  "to head_dim (128) as int(head_dim x factor), got 1.8e+20");
}

// Qwen2-MoE (Qwen2MoeForCausalLM) as Qwen1.5-MoE-A2.7B's config and
// Qwen2MoeConfig give it: Qwen3-MoE's routing fields with their own
// defaults, q/k/v biases unless qkv_bias is false, a gated shared expert of
// shared_expert_intermediate_size (in the digest; 0: none).
// IBM's granite-3.1-1b-a400m-instruct config.json.
TEST(ModelConfigParsing, GraniteMoeReadsItsScalarsAndMixture) {
  const std::string published =
      R"({"architectures": ["GraniteMoeForCausalLM"], "attention_bias": false,
          "attention_dropout": 0.1, "attention_multiplier": 0.015625, "bos_token_id": 0,
          "embedding_multiplier": 12.0, "eos_token_id": 0, "hidden_act": "silu",
          "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 512,
          "logits_scaling": 6.0, "max_position_embeddings": 131072, "model_type": "granitemoe",
          "num_attention_heads": 16, "num_experts_per_tok": 8, "num_hidden_layers": 24,
          "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
          "pad_token_id": 0, "residual_multiplier": 0.22, "rms_norm_eps": 1e-06,
          "rope_scaling": null, "rope_theta": 10000000.0, "router_aux_loss_coef": 0.0,
          "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
          "vocab_size": 49155})";
  const ModelConfig c = ModelConfig::fromJsonText(published, "config.json");
  EXPECT_TRUE(c.graniteMoe());
  EXPECT_TRUE(c.granite) << "Granite's scalars";
  EXPECT_EQ(c.model_type, "granitemoe");
  EXPECT_EQ(c.embedding_multiplier, 12.0);
  EXPECT_EQ(c.attention_multiplier, 0.015625);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.logits_scaling, 6.0);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_TRUE(c.norm_topk_prob) << "the softmax over the chosen logits";
  EXPECT_FALSE(c.sigmoid_routing);
  for (int64_t layer = 0; layer < 24; ++layer) EXPECT_TRUE(c.isMoeLayer(layer)) << layer;
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);
  // GraniteMoeConfig's defaults: 8 experts choosing 2.
  const ModelConfig defaults =
      ModelConfig::fromJsonText(smallConfig("GraniteMoeForCausalLM"), "config.json");
  EXPECT_EQ(defaults.num_experts, 8);
  EXPECT_EQ(defaults.num_experts_per_tok, 2);
  EXPECT_EQ(defaults.moe_intermediate_size, 512);
  EXPECT_NE(
      defaults.computeDigest(),
      ModelConfig::fromJsonText(smallConfig("GraniteForCausalLM"), "config.json").computeDigest());
  EXPECT_CONTAINS(parseError(smallConfig("GraniteMoeForCausalLM", R"(, "num_experts_per_tok": 9)")),
                  "dir/config.json: field \"num_experts_per_tok\" must be at most "
                  "num_local_experts (8), got 9");
}

// AllenAI's OLMoE-1B-7B-0924 config.json: every layer a mixture of 64
// experts of intermediate_size choosing 8, not renormalized; q/k norms
// across the heads (fullQkNorm) with Llama's pre-norm layers (not OLMo 2's
// norm places). clip_qkv other than null is refused naming the field.
TEST(ModelConfigParsing, OlmoeReadsItsMixtureAndWholeQkNorms) {
  const std::string published =
      R"({"architectures": ["OlmoeForCausalLM"], "attention_bias": false,
          "attention_dropout": 0.0, "clip_qkv": null, "eos_token_id": 50279,
          "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
          "intermediate_size": 1024, "max_position_embeddings": 4096, "model_type": "olmoe",
          "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 64,
          "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
          "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05,
          "rope_scaling": null, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01,
          "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
          "vocab_size": 50304})";
  const ModelConfig c = ModelConfig::fromJsonText(published, "config.json");
  EXPECT_TRUE(c.olmoe());
  EXPECT_EQ(c.model_type, "olmoe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.fullQkNorm());
  EXPECT_FALSE(c.olmo2) << "Llama's norm places";
  EXPECT_FALSE(c.sandwichNorms());
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 1024);
  EXPECT_FALSE(c.norm_topk_prob);
  for (int64_t layer = 0; layer < 16; ++layer) EXPECT_TRUE(c.isMoeLayer(layer)) << layer;
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);
  // OlmoeConfig's defaults: 64 experts choosing 8.
  const ModelConfig defaults =
      ModelConfig::fromJsonText(smallConfig("OlmoeForCausalLM"), "config.json");
  EXPECT_EQ(defaults.num_experts, 64);
  EXPECT_EQ(defaults.num_experts_per_tok, 8);
  EXPECT_NE(
      defaults.computeDigest(),
      ModelConfig::fromJsonText(smallConfig("Qwen3MoeForCausalLM"), "config.json").computeDigest());
  EXPECT_CONTAINS(parseError(smallConfig("OlmoeForCausalLM", R"(, "clip_qkv": 8.0)")),
                  "dir/config.json: field \"clip_qkv\" is set; clipping q/k/v is not supported "
                  "(accepted: null)");
}

// gpt-oss-20b's config.json (gpt-oss-120b's differs in layers and experts).
std::string gptOss20b() {
  std::string layer_types;
  for (int i = 0; i < 24; ++i) {
    layer_types += std::string(i == 0 ? "" : ", ") +
                   (i % 2 == 0 ? R"("sliding_attention")" : R"("full_attention")");
  }
  return R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true,
             "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
             "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
             "initial_context_length": 4096, "initializer_range": 0.02,
             "intermediate_size": 2880, "layer_types": [)" +
         layer_types + R"(], "max_position_embeddings": 131072, "model_type": "gpt_oss",
             "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
             "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
             "pad_token_id": 199999,
             "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                 "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                 "quant_method": "mxfp4"},
             "rms_norm_eps": 1e-05,
             "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                 "original_max_position_embeddings": 4096, "rope_type": "yarn",
                 "truncate": false},
             "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
             "swiglu_limit": 7.0, "tie_word_embeddings": false,
             "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088})";
}

TEST(ModelConfigParsing, GptOssReadsItsMixtureSinksWindowsAndMxfp4) {
  const ModelConfig c = ModelConfig::fromJsonText(gptOss20b(), "config.json");
  EXPECT_TRUE(c.gptOss());
  EXPECT_EQ(c.model_type, "gpt_oss");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.moe_intermediate_size, 2880);
  EXPECT_TRUE(c.norm_topk_prob) << "the softmax over the chosen logits";
  EXPECT_FALSE(c.sigmoid_routing);
  EXPECT_EQ(c.sharedExpertWidth(), 0);
  EXPECT_EQ(c.swiglu_limit, 7.0);
  for (int64_t layer = 0; layer < 24; ++layer) {
    EXPECT_TRUE(c.isMoeLayer(layer)) << layer;
    EXPECT_EQ(c.slidingLayer(layer), layer % 2 == 0) << layer;
    EXPECT_FALSE(c.localRopeLayer(layer)) << "every layer rotates alike";
  }
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.ropeAttentionFactor(), 0.1 * std::log(32.0) + 1.0);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.mxfp4());
  EXPECT_FALSE(c.quantized()) << "MXFP4 experts are bf16 once loaded";
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200002}));
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);

  // The limit is in the digest; MXFP4 is not (the loaded weights are what
  // they are).
  std::string limit = gptOss20b();
  limit.replace(limit.find(R"("swiglu_limit": 7.0)"), 19, R"("swiglu_limit": 8.0)");
  const ModelConfig eight = ModelConfig::fromJsonText(limit, "config.json");
  EXPECT_EQ(eight.swiglu_limit, 8.0);
  EXPECT_NE(eight.computeDigest(), c.computeDigest());
  json bf16 = json::parse(gptOss20b());
  bf16.erase("quantization_config");
  const ModelConfig unquantized = ModelConfig::fromJsonText(bf16.dump(), "config.json");
  EXPECT_FALSE(unquantized.mxfp4());
  EXPECT_EQ(unquantized.computeDigest(), c.computeDigest());
  EXPECT_EQ(ModelConfig::fromJsonText(unquantized.toJsonText(), "config.json"), unquantized);

  // GptOssConfig's defaults where a config is silent: 128 experts choosing
  // 4, head_dim 64, YaRN over 4,096 positions unrounded, every other layer
  // sliding from the first within 128, biases, limit 7.
  const ModelConfig defaults =
      ModelConfig::fromJsonText(smallConfig("GptOssForCausalLM"), "config.json");
  EXPECT_EQ(defaults.num_experts, 128);
  EXPECT_EQ(defaults.num_experts_per_tok, 4);
  EXPECT_EQ(defaults.moe_intermediate_size, 512);
  EXPECT_EQ(defaults.head_dim, 64);
  EXPECT_TRUE(defaults.attention_bias);
  EXPECT_EQ(defaults.rms_norm_eps, 1e-5);
  EXPECT_EQ(defaults.rope_theta, 150000.0);
  EXPECT_EQ(defaults.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_FALSE(defaults.rope_scaling.truncate);
  EXPECT_EQ(defaults.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(defaults.max_position_embeddings, 131072);
  EXPECT_EQ(defaults.sliding_window, 128);
  EXPECT_EQ(defaults.sliding_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(defaults.swiglu_limit, 7.0);
  EXPECT_EQ(ModelConfig::fromJsonText(defaults.toJsonText(), "config.json"), defaults);
  // No sliding layer: no window.
  const ModelConfig full = ModelConfig::fromJsonText(
      smallConfig("GptOssForCausalLM", R"(, "layer_types": ["full_attention", "full_attention",
                                          "full_attention", "full_attention"])"),
      "config.json");
  EXPECT_TRUE(full.sliding_layers.empty());
  EXPECT_EQ(full.sliding_window, 0);
  EXPECT_EQ(ModelConfig::fromJsonText(full.toJsonText(), "config.json"), full);
  // Unscaled rotation stays unscaled through what tandem-model writes (a
  // missing rope_scaling reads as the YaRN defaults).
  for (const char* architecture : {"GptOssForCausalLM", "Ministral3ForCausalLM"}) {
    const ModelConfig unscaled = ModelConfig::fromJsonText(
        smallConfig(architecture, R"(, "rope_scaling": {"rope_type": "default"})"), "config.json");
    EXPECT_EQ(unscaled.rope_scaling.type, RopeScaling::Type::kNone) << architecture;
    EXPECT_EQ(ModelConfig::fromJsonText(unscaled.toJsonText(), "config.json"), unscaled)
        << architecture;
  }

  EXPECT_CONTAINS(parseError(smallConfig("GptOssForCausalLM", R"(, "swiglu_limit": 0)")),
                  "dir/config.json: field \"swiglu_limit\"");
  EXPECT_CONTAINS(
      parseError(
          smallConfig("LlamaForCausalLM", R"(, "quantization_config": {"quant_method": "mxfp4"})")),
      "dir/config.json: field \"quantization_config.quant_method\" is \"mxfp4\", which is "
      "supported for GptOssForCausalLM's experts only (accepted for LlamaForCausalLM: fp8, "
      "compressed-tensors)");
}

TEST(ModelConfigParsing, Qwen2MoeReadsItsSharedExpertAndBiases) {
  const std::string published =
      R"({"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
          "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
          "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
          "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
          "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16,
          "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
          "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
          "use_sliding_window": false, "vocab_size": 151936, "decoder_sparse_step": 1,
          "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
          "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false,
          "output_router_logits": false, "router_aux_loss_coef": 0.001})";
  const ModelConfig c = ModelConfig::fromJsonText(published, "config.json");
  EXPECT_TRUE(c.qwen2Moe());
  EXPECT_EQ(c.model_type, "qwen2_moe");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_EQ(c.sliding_window, 0) << "use_sliding_window is false";
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_FALSE(c.sigmoid_routing);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(c.sharedExpertWidth(), 5632);
  for (int64_t layer = 0; layer < 24; ++layer) EXPECT_TRUE(c.isMoeLayer(layer)) << layer;
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);

  auto moe = [](const std::string& extra) { return smallConfig("Qwen2MoeForCausalLM", extra); };
  // Qwen2MoeConfig's defaults.
  const ModelConfig defaults = ModelConfig::fromJsonText(moe(""), "config.json");
  EXPECT_EQ(defaults.num_experts, 60);
  EXPECT_EQ(defaults.num_experts_per_tok, 4);
  EXPECT_EQ(defaults.moe_intermediate_size, 1408);
  EXPECT_EQ(defaults.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(defaults.attention_bias);
  EXPECT_EQ(defaults.max_position_embeddings, 32768);
  EXPECT_EQ(defaults.rms_norm_eps, 1e-6);
  const ModelConfig sparse = ModelConfig::fromJsonText(
      moe(R"(, "qkv_bias": false, "decoder_sparse_step": 2, "mlp_only_layers": [3],
             "shared_expert_intermediate_size": 0)"),
      "c.json");
  EXPECT_FALSE(sparse.attention_bias);
  EXPECT_EQ(sparse.sharedExpertWidth(), 0);
  EXPECT_FALSE(sparse.isMoeLayer(0));
  EXPECT_TRUE(sparse.isMoeLayer(1));
  EXPECT_FALSE(sparse.isMoeLayer(3));
  EXPECT_EQ(ModelConfig::fromJsonText(sparse.toJsonText(), "config.json"), sparse);

  // The shared expert's width is the model's; Qwen3-MoE of the same fields
  // is another model.
  ModelConfig wider = defaults;
  wider.shared_expert_intermediate_size = 2816;
  EXPECT_NE(wider.computeDigest(), defaults.computeDigest());
  ModelConfig qwen3 = defaults;
  qwen3.architecture = "Qwen3MoeForCausalLM";
  EXPECT_NE(qwen3.computeDigest(), defaults.computeDigest());
  EXPECT_CONTAINS(parseError(moe(R"(, "shared_expert_intermediate_size": -4)")),
                  "field \"shared_expert_intermediate_size\" must be an integer from 0 to");
  EXPECT_CONTAINS(parseError(moe(R"(, "use_sliding_window": true)")),
                  "field \"use_sliding_window\" is true");
}

// GLM-4.5 (Glm4MoeForCausalLM) as its published configs and Glm4MoeConfig
// give it: GLM's partial rotary dims rotating as halves, DeepSeek-V3's
// sigmoid routing in groups with a routed scale, shared experts, dense
// first layers; every routing field in the digest, every bad one named.
TEST(ModelConfigParsing, Glm4MoeReadsItsRoutingSharedExpertsAndDenseLayers) {
  // GLM-4.5-Air's config.json.
  const std::string air =
      R"({"architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
          "attention_dropout": 0.0, "pad_token_id": 151329,
          "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
          "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02,
          "intermediate_size": 10944, "max_position_embeddings": 131072,
          "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": true,
          "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
          "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
          "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
          "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
          "num_nextn_predict_layers": 1, "tie_word_embeddings": false,
          "torch_dtype": "bfloat16", "use_cache": true, "use_qk_norm": false,
          "vocab_size": 151552})";
  const ModelConfig c = ModelConfig::fromJsonText(air, "config.json");
  EXPECT_TRUE(c.glm4Moe());
  EXPECT_FALSE(c.glm) << "GLM-4.5 rotates halves, not GLM's neighbour pairs";
  EXPECT_FALSE(c.fusedGateUp());
  EXPECT_FALSE(c.sandwichNorms());
  EXPECT_EQ(c.model_type, "glm4_moe");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.sigmoid_routing);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.sharedExpertWidth(), 1408);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_FALSE(c.isMoeLayer(0));
  for (int64_t layer = 1; layer < 46; ++layer) EXPECT_TRUE(c.isMoeLayer(layer)) << layer;
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151329, 151336, 151338}));
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);

  // GLM-4.5's: q/k norms, a routed scale of 2.5, three dense layers.
  std::string big = air;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("use_qk_norm": false)", R"("use_qk_norm": true)"},
           {R"("routed_scaling_factor": 1.0)", R"("routed_scaling_factor": 2.5)"},
           {R"("first_k_dense_replace": 1)", R"("first_k_dense_replace": 3)"},
           {R"("n_routed_experts": 128)", R"("n_routed_experts": 160)"}}) {
    ASSERT_NE(big.find(from), std::string::npos) << from;
    big.replace(big.find(from), from.size(), to);
  }
  const ModelConfig glm45 = ModelConfig::fromJsonText(big, "config.json");
  EXPECT_TRUE(glm45.qk_norm);
  EXPECT_EQ(glm45.routed_scaling_factor, 2.5);
  EXPECT_EQ(glm45.num_experts, 160);
  EXPECT_FALSE(glm45.isMoeLayer(2));
  EXPECT_TRUE(glm45.isMoeLayer(3));
  EXPECT_EQ(ModelConfig::fromJsonText(glm45.toJsonText(), "config.json"), glm45);

  // Glm4MoeConfig's defaults where a config is silent (no head_dim of its
  // own: hidden / heads), n_routed_experts also as transformers 5's
  // num_local_experts, the factor in rope_parameters.
  auto moe = [](const std::string& extra) { return smallConfig("Glm4MoeForCausalLM", extra); };
  const ModelConfig defaults = ModelConfig::fromJsonText(moe(""), "config.json");
  EXPECT_EQ(defaults.head_dim, 64);
  EXPECT_EQ(defaults.rotary_dim, 32);
  EXPECT_EQ(defaults.num_key_value_heads, 4);
  EXPECT_FALSE(defaults.attention_bias);
  EXPECT_FALSE(defaults.qk_norm);
  EXPECT_EQ(defaults.rms_norm_eps, 1e-5);
  EXPECT_EQ(defaults.rope_theta, 10000.0);
  EXPECT_EQ(defaults.max_position_embeddings, 131072);
  EXPECT_EQ(defaults.num_experts, 128);
  EXPECT_EQ(defaults.num_experts_per_tok, 8);
  EXPECT_EQ(defaults.moe_intermediate_size, 1408);
  EXPECT_TRUE(defaults.norm_topk_prob);
  EXPECT_EQ(defaults.n_shared_experts, 1);
  EXPECT_EQ(defaults.routed_scaling_factor, 1.0);
  EXPECT_EQ(defaults.n_group, 1);
  EXPECT_EQ(defaults.topk_group, 1);
  EXPECT_EQ(defaults.first_k_dense_replace, 1);
  EXPECT_EQ(ModelConfig::fromJsonText(defaults.toJsonText(), "config.json"), defaults);
  EXPECT_EQ(ModelConfig::fromJsonText(moe(R"(, "num_local_experts": 64)"), "c.json").num_experts,
            64);
  EXPECT_EQ(ModelConfig::fromJsonText(moe(R"(, "rope_parameters": {"rope_type": "default",
                "rope_theta": 1000000, "partial_rotary_factor": 0.25})"),
                                      "c.json")
                .rotary_dim,
            16);
  // No shared experts, and no dense layers, are configurations too.
  const ModelConfig bare = ModelConfig::fromJsonText(
      moe(R"(, "n_shared_experts": 0, "first_k_dense_replace": 0)"), "c.json");
  EXPECT_EQ(bare.sharedExpertWidth(), 0);
  EXPECT_TRUE(bare.isMoeLayer(0));
  EXPECT_EQ(ModelConfig::fromJsonText(bare.toJsonText(), "config.json"), bare);

  // Every routing field changes what the layers compute.
  const ModelConfig grouped = ModelConfig::fromJsonText(
      moe(R"(, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5)"), "c.json");
  EXPECT_EQ(ModelConfig::fromJsonText(grouped.toJsonText(), "config.json"), grouped);
  const std::string digest = grouped.computeDigest();
  for (const auto& change : std::vector<std::function<void(ModelConfig&)>>{
           [](ModelConfig& m) { m.n_group = 4; }, [](ModelConfig& m) { m.topk_group = 3; },
           [](ModelConfig& m) { m.routed_scaling_factor = 2.0; },
           [](ModelConfig& m) { m.n_shared_experts = 2; },
           [](ModelConfig& m) { m.first_k_dense_replace = 2; },
           [](ModelConfig& m) { m.sigmoid_routing = false; },
           [](ModelConfig& m) { m.rotary_dim = 64; }}) {
    ModelConfig other = grouped;
    change(other);
    EXPECT_NE(other.computeDigest(), digest);
  }

  EXPECT_CONTAINS(parseError(moe(R"(, "n_group": 3)")),
                  "field \"n_group\" must divide n_routed_experts (128) into groups of two or "
                  "more experts, or be 1, got 3");
  EXPECT_CONTAINS(parseError(moe(R"(, "n_routed_experts": 8, "n_group": 8)")),
                  "field \"n_group\" must divide n_routed_experts (8) into groups of two");
  EXPECT_CONTAINS(parseError(moe(R"(, "n_group": 4, "topk_group": 5)")),
                  "field \"topk_group\" must be a positive integer at most 4, got 5");
  EXPECT_CONTAINS(parseError(moe(R"(, "n_group": 32, "topk_group": 1)")),
                  "field \"num_experts_per_tok\" must be at most the experts of topk_group "
                  "groups (4), got 8");
  EXPECT_CONTAINS(parseError(moe(R"(, "routed_scaling_factor": 0)")),
                  "field \"routed_scaling_factor\" must be a positive number, got 0");
  EXPECT_CONTAINS(parseError(moe(R"(, "first_k_dense_replace": 5)")),
                  "field \"first_k_dense_replace\" must be an integer from 0 to 4, got 5");
  EXPECT_CONTAINS(parseError(moe(R"(, "n_shared_experts": -1)")),
                  "field \"n_shared_experts\" must be an integer from 0 to 64, got -1");
  EXPECT_CONTAINS(parseError(moe(R"(, "num_experts_per_tok": 129)")),
                  "field \"num_experts_per_tok\" must be a positive integer at most 64");
}

// SmolLM3 as SmolLM3Config reads it: every 4th layer without RoPE unless
// no_rope_layers says which (1 rotates; its first num_hidden_layers
// entries), tied embeddings, rope_theta 2e6; the NoPE layers in the digest.
TEST(ModelConfigParsing, SmolLM3ReadsItsNopeLayers) {
  auto smol = [](const std::string& extra) {
    return R"({"architectures": ["SmolLM3ForCausalLM"], "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
               "num_key_value_heads": 2, "vocab_size": 1000)" +
           extra + "}";
  };
  ModelConfig c = ModelConfig::fromJsonText(smol(""), "config.json");
  EXPECT_EQ(c.model_type, "smollm3");
  EXPECT_EQ(c.nope_layers,
            (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 2e6);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "again"), c);
  const std::string digest = c.computeDigest();

  // As SmolLM3-3B publishes it: a list, longer than the layers.
  c = ModelConfig::fromJsonText(
      smol(R"(, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0, 1, 1], "rope_theta": 5000000.0,
              "tie_word_embeddings": false)"),
      "config.json");
  EXPECT_EQ(c.nope_layers,
            (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_FALSE(c.tie_word_embeddings);
  c = ModelConfig::fromJsonText(smol(R"(, "no_rope_layer_interval": 2)"), "config.json");
  EXPECT_EQ(c.nope_layers, (std::vector<bool>{false, true, false, true, false, true, false, true}));
  EXPECT_NE(c.computeDigest(), digest);
  // Every layer rotating: Llama's arithmetic, nothing recorded.
  c = ModelConfig::fromJsonText(smol(R"(, "no_rope_layer_interval": 9)"), "config.json");
  EXPECT_TRUE(c.nope_layers.empty());
  EXPECT_NE(c.computeDigest(), digest);

  EXPECT_CONTAINS(parseError(smol(R"(, "no_rope_layers": [1, 1, 0])")),
                  "field \"no_rope_layers\" must list 1 (RoPE) or 0 (none) for each of the 8 "
                  "layers, got [1,1,0]");
  EXPECT_CONTAINS(parseError(smol(R"(, "no_rope_layers": [1, 1, 1, 2, 1, 1, 1, 0])")),
                  "field \"no_rope_layers\" must list 1 (RoPE) or 0 (none)");
  EXPECT_CONTAINS(parseError(smol(R"(, "no_rope_layer_interval": 0)")),
                  "field \"no_rope_layer_interval\" must be a positive integer");
  EXPECT_CONTAINS(parseError(smol(R"(, "use_sliding_window": true, "sliding_window": 4096)")),
                  "field \"use_sliding_window\" is true; sliding-window attention is not "
                  "supported (accepted: false)");
  EXPECT_CONTAINS(parseError(smol(R"(, "layer_types": ["full_attention", "sliding_attention"])")),
                  "field \"layer_types\" must hold only \"full_attention\"");
}

// --hf-overrides (vLLM's): keys replace config.json's before anything is
// read; text_config's merge into the file's text_config; errors say the
// field came with the overrides.
TEST(ModelConfigParsing, HfOverridesReplaceFieldsBeforeTheyAreRead) {
  const std::string qwen3 =
      R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
          "max_position_embeddings": 40960, "rope_theta": 1000000,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})";
  ModelConfig c = ModelConfig::fromJsonText(qwen3, "config.json",
                                            R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 32768}})");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  // A whole value replaced: rope_scaling null is none.
  c = ModelConfig::fromJsonText(qwen3, "config.json", R"({"rope_scaling": null})");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c.computeDigest(), ModelConfig::fromJsonText(
                                   R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 256,
                    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
                    "vocab_size": 1000, "rope_theta": 1000000})",
                                   "c")
                                   .computeDigest());
  EXPECT_EQ(ModelConfig::fromJsonText(qwen3, "config.json", "").rope_scaling.type,
            RopeScaling::Type::kLlama3);

  // Gemma 3 4B and up: text_config's fields merge.
  const std::string gemma =
      R"({"architectures": ["Gemma3ForConditionalGeneration"],
          "text_config": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
                          "num_attention_heads": 4, "num_key_value_heads": 1,
                          "vocab_size": 1000, "sliding_window": 1024}})";
  c = ModelConfig::fromJsonText(gemma, "config.json",
                                R"({"text_config": {"sliding_window": 512}})");
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.hidden_size, 256);

  EXPECT_CONTAINS(
      [&] {
        try {
          ModelConfig::fromJsonText(qwen3, "dir/config.json",
                                    R"({"rope_scaling": {"rope_type": "dynamic", "factor": 2}})");
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      }(),
      "dir/config.json with --hf-overrides: field \"rope_scaling\" has rope type \"dynamic\"");
  EXPECT_THROW(ModelConfig::fromJsonText(qwen3, "c", "[1]"), Error);
}

TEST(ModelConfigParsing, JsonTextRoundTrips) {
  for (const std::string& preset : tools::presetNames()) {
    for (const char* architecture :
         {"LlamaForCausalLM",    "MistralForCausalLM",    "Ministral3ForCausalLM",
          "Qwen2ForCausalLM",    "Qwen3ForCausalLM",      "Gemma2ForCausalLM",
          "Gemma3ForCausalLM",   "Phi3ForCausalLM",       "GraniteForCausalLM",
          "Olmo2ForCausalLM",    "Olmo3ForCausalLM",      "SmolLM3ForCausalLM",
          "GlmForCausalLM",      "Glm4ForCausalLM",       "MixtralForCausalLM",
          "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",   "Glm4MoeForCausalLM",
          "GptOssForCausalLM",   "GraniteMoeForCausalLM", "OlmoeForCausalLM"}) {
      SCOPED_TRACE(preset + " " + architecture);
      ModelConfig config = tools::presetConfig(preset, architecture);
      const std::string text = config.toJsonText();
      ModelConfig parsed = ModelConfig::fromJsonText(text, "config.json");
      EXPECT_EQ(parsed, config);
      EXPECT_EQ(parsed.toJsonText(), text);
    }
  }
  ModelConfig c = ModelConfig::fromJsonText(
      minimalLlama(R"(, "bos_token_id": 3, "eos_token_id": 4, "rms_norm_eps": 1e-5,
                       "rope_theta": 500000.0, "torch_dtype": "float32")"),
      "config.json");
  EXPECT_EQ(ModelConfig::fromJsonText(c.toJsonText(), "config.json"), c);

  // Mistral's attention window is part of what it writes.
  ModelConfig mistral = tools::presetConfig(tools::presetNames().front(), "MistralForCausalLM");
  mistral.sliding_window = 4096;
  mistral.sliding_layers.assign(static_cast<size_t>(mistral.num_hidden_layers), true);
  ModelConfig reread = ModelConfig::fromJsonText(mistral.toJsonText(), "config.json");
  EXPECT_EQ(reread.sliding_window, 4096);
  EXPECT_EQ(reread, mistral);

  // So is every quantization tandem-model writes.
  for (const char* spec : {"fp8", "fp8:tensor", "fp8:block=64x32", "compressed-tensors",
                           "compressed-tensors:tensor", "compressed-tensors:block=16x8"}) {
    SCOPED_TRACE(spec);
    ModelConfig quantized = tools::presetConfig("tiny", "LlamaForCausalLM");
    quantized.quantization = tools::parseQuantizationSpec(spec);
    const ModelConfig read = ModelConfig::fromJsonText(quantized.toJsonText(), "config.json");
    EXPECT_EQ(read.quantization, quantized.quantization);
    EXPECT_EQ(read, quantized);
  }
}

TEST(RopeFrequencies, AThetaWhoseFrequenciesOverflowIsRefusedNamingIt) {
  const std::string message = parseError(minimalLlama(R"(, "rope_theta": 1e-308)"));
  EXPECT_CONTAINS(message, "\"rope_theta\" is 1e-308");
  EXPECT_CONTAINS(message, "overflow");
  // A theta below 1 whose frequencies stay finite is the model's business.
  ModelConfig c = ModelConfig::fromJsonText(minimalLlama(R"(, "rope_theta": 0.5)"), "c");
  for (float frequency : ropeInverseFrequencies(c)) EXPECT_TRUE(std::isfinite(frequency));
}

TEST(RopeFrequencies, PlainRopeIsThetaPowers) {
  ModelConfig c = ModelConfig::fromJsonText(minimalLlama(R"(, "rope_theta": 500000.0)"), "c");
  std::vector<float> inv_freq = ropeInverseFrequencies(c);
  ASSERT_EQ(inv_freq.size(), 16u);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    EXPECT_EQ(inv_freq[i], static_cast<float>(1.0 / std::pow(500000.0, (2.0 * i) / 32.0)));
  }
}

// The llama3 rule written out directly: wavelengths longer than
// original/low_freq_factor are slowed by `factor`, shorter than
// original/high_freq_factor are kept, and in between the two are blended.
double llama3Reference(double inv_freq, const RopeScaling& s) {
  const double wavelen = 2 * std::numbers::pi / inv_freq;
  const double long_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double short_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  if (wavelen < short_wavelen) return inv_freq;
  if (wavelen > long_wavelen) return inv_freq / s.factor;
  const double t = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                   (s.high_freq_factor - s.low_freq_factor);
  return (1 - t) * (inv_freq / s.factor) + t * inv_freq;
}

TEST(RopeFrequencies, Llama3ScalingMatchesTheReference) {
  for (const char* scaling :
       {R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192})",
        R"({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"}) {
    ModelConfig c = ModelConfig::fromJsonText(
        minimalLlama(R"(, "num_attention_heads": 2, "rope_theta": 500000.0, "rope_scaling": )" +
                     std::string(scaling)),
        "c");
    ASSERT_EQ(c.head_dim, 128);
    std::vector<float> inv_freq = ropeInverseFrequencies(c);
    ASSERT_EQ(inv_freq.size(), 64u);
    int kept = 0, slowed = 0, blended = 0;
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      const double base = 1.0 / std::pow(500000.0, (2.0 * i) / 128.0);
      const double expected = llama3Reference(base, c.rope_scaling);
      EXPECT_FLOAT_EQ(inv_freq[i], static_cast<float>(expected)) << "i = " << i;
      if (expected == base)
        ++kept;
      else if (std::abs(expected - base / c.rope_scaling.factor) < 1e-18)
        ++slowed;
      else
        ++blended;
    }
    // All three regimes occur for Llama 3's settings.
    EXPECT_GT(kept, 0);
    EXPECT_GT(slowed, 0);
    EXPECT_GT(blended, 0);
  }
}

TEST(RopeFrequencies, TinyPresetHasAllThreeRegimes) {
  ModelConfig c = tools::presetConfig("tiny", "LlamaForCausalLM");
  std::vector<float> inv_freq = ropeInverseFrequencies(c);
  ASSERT_EQ(inv_freq.size(), 8u);
  // head_dim 16, theta 1e4: base inv_freq[i] = 10^(-i/2). Wavelengths 2*pi*10^(i/2):
  // i = 0, 1 are below 128/4 = 32 (kept), i = 2 (62.8) is blended, i >= 3 exceed 128 (slowed).
  EXPECT_EQ(inv_freq[0], 1.0f);
  EXPECT_FLOAT_EQ(inv_freq[1], static_cast<float>(std::pow(10.0, -0.5)));
  const double t = (128.0 / (2 * std::numbers::pi * 10.0) - 1.0) / 3.0;
  EXPECT_FLOAT_EQ(inv_freq[2], static_cast<float>((1 - t) * 0.1 / 8 + t * 0.1));
  for (size_t i = 3; i < 8; ++i) {
    EXPECT_FLOAT_EQ(inv_freq[i], static_cast<float>(std::pow(10.0, -0.5 * i) / 8));
  }
}

TEST(ModelConfigParsing, QuantizationConfigAcceptsFp8AndNamesWhatItRefuses) {
  using Granularity = Fp8Quantization::Granularity;
  ModelConfig config = ModelConfig::fromJsonText(
      minimalLlama(R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
          "activation_scheme": "dynamic", "weight_block_size": [128, 64]})"),
      "dir/config.json");
  EXPECT_EQ(config.quantization.granularity, Granularity::kBlock);
  EXPECT_EQ(config.quantization.block_rows, 128);
  EXPECT_EQ(config.quantization.block_cols, 64);
  EXPECT_STREQ(config.quantization.scaleName(), "weight_scale_inv");
  config =
      ModelConfig::fromJsonText(minimalLlama(R"(, "quantization_config": {"quant_method": "fp8",
          "activation_scheme": "static"})"),
                                "dir/config.json");
  EXPECT_EQ(config.quantization.granularity, Granularity::kTensor);
  EXPECT_STREQ(config.quantization.scaleName(), "weight_scale");
  // A compressed-tensors FP8-dynamic config as published.
  config = ModelConfig::fromJsonText(minimalLlama(R"(, "quantization_config": {
      "quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                    "dynamic": false, "observer": "minmax"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                              "dynamic": true}}},
      "ignore": ["lm_head"], "kv_cache_scheme": null, "quantization_status": "compressed"})"),
                                     "dir/config.json");
  EXPECT_EQ(config.quantization.granularity, Granularity::kChannel);
  EXPECT_EQ(config.quantization.method, "compressed-tensors");
  EXPECT_FALSE(ModelConfig::fromJsonText(minimalLlama(), "dir/config.json").quantized());
  // Groups quantizing activations or the KV cache only leave the weights as
  // they are: no quantization of the matrices.
  EXPECT_FALSE(ModelConfig::fromJsonText(minimalLlama(R"(, "quantization_config": {
      "quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"a": {"targets": ["Linear"], "weights": null,
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token"}}},
      "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}})"),
                                         "dir/config.json")
                   .quantized());
  // Nothing of it is kept: the configuration is the unquantized one, as
  // its config.json text says.
  const ModelConfig kv_only = ModelConfig::fromJsonText(
      minimalLlama(R"(, "quantization_config": {"quant_method": "compressed-tensors",
                      "config_groups": null, "kv_cache_scheme": {"num_bits": 8}})"),
      "dir/config.json");
  EXPECT_EQ(kv_only.quantization, Fp8Quantization{});
  EXPECT_EQ(ModelConfig::fromJsonText(kv_only.toJsonText(), "config.json"), kv_only);

  std::string message =
      parseError(minimalLlama(R"(, "quantization_config": {"quant_method": "awq", "bits": 4})"));
  EXPECT_CONTAINS(
      message,
      "field \"quantization_config.quant_method\" is \"awq\", which is not "
      "supported (accepted: fp8, compressed-tensors with 8-bit float weights, mxfp4 for "
      "GptOssForCausalLM)");
  message = parseError(
      minimalLlama(R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e5m2"})"));
  EXPECT_CONTAINS(message, "\"quantization_config.fmt\" is \"e5m2\"");
  message = parseError(minimalLlama(
      R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]})"));
  EXPECT_CONTAINS(message, "\"quantization_config.weight_block_size\" must be [rows, columns]");
  message = parseError(minimalLlama(R"(, "quantization_config": {
      "quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}})"));
  EXPECT_CONTAINS(message, "\"quantization_config.format\" is \"pack-quantized\"");
  message = parseError(minimalLlama(R"(, "quantization_config": {
      "quant_method": "compressed-tensors", "format": "naive-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}}}})"));
  EXPECT_CONTAINS(message,
                  "\"quantization_config.config_groups.g.weights.type\" with num_bits "
                  "gives int 8-bit weights");
  message = parseError(minimalLlama(R"(, "quantization_config": {
      "quant_method": "compressed-tensors",
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float",
                                          "strategy": "group", "group_size": 128}}}})"));
  EXPECT_CONTAINS(message,
                  "\"quantization_config.config_groups.g.weights.strategy\" is "
                  "\"group\", which is not supported (accepted: tensor, channel, block)");
  message = parseError(minimalLlama(R"(, "quantization_config": {
      "quant_method": "compressed-tensors",
      "config_groups": {"a": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}},
                        "b": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}})"));
  EXPECT_CONTAINS(message, "quantizes weights differently from another group");
  message = parseError(minimalLlama(R"(, "quantization_config": "fp8")"));
  EXPECT_CONTAINS(message, "field \"quantization_config\" must be an object");
}

}  // namespace
}  // namespace tandem::engine
