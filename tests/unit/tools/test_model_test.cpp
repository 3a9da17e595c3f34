// The test-model writer: determinism, weight statistics, and a tokenizer that
// the BPE trainer and the tokenizer library agree on.
#include "tools/model/test_model.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "agent/engine/model.h"
#include "agent/engine/safetensors.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "tests/support/test_files.h"
#include "tools/model/bpe_trainer.h"

namespace tandem::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;

std::set<std::string> fileNames(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

TestModelOptions tinyOptions(const std::string& architecture = "LlamaForCausalLM",
                             DType dtype = DType::kBF16, uint64_t seed = 0) {
  TestModelOptions options;
  options.preset = "tiny";
  options.architecture = architecture;
  options.dtype = dtype;
  options.seed = seed;
  return options;
}

const char* const kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                      "Qwen3ForCausalLM"};

// ---------------------------------------------------------------------------
// Determinism

TEST(TestModel, SameOptionsGiveByteIdenticalFiles) {
  for (const char* architecture : kArchitectures) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(std::string(architecture) + " " + dtypeShortName(dtype));
      TempDir a;
      TempDir b;
      writeTestModel(tinyOptions(architecture, dtype, 42), a.path());
      writeTestModel(tinyOptions(architecture, dtype, 42), b.path());
      const std::set<std::string> names = fileNames(a.path());
      EXPECT_EQ(names,
                (std::set<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"}));
      EXPECT_EQ(fileNames(b.path()), names);
      for (const std::string& name : names) {
        EXPECT_EQ(readFile(a.path() / name), readFile(b.path() / name)) << name;
      }
    }
  }
}

TEST(TestModel, RewritingADirectoryReplacesItsFiles) {
  TempDir a;
  TempDir b;
  writeTestModel(tinyOptions("LlamaForCausalLM", DType::kBF16, 1), a.path());
  writeTestModel(tinyOptions("Qwen3ForCausalLM", DType::kF32, 2), a.path());
  writeTestModel(tinyOptions("Qwen3ForCausalLM", DType::kF32, 2), b.path());
  for (const std::string& name : fileNames(b.path())) {
    EXPECT_EQ(readFile(a.path() / name), readFile(b.path() / name)) << name;
  }
  EXPECT_EQ(fileNames(a.path()), fileNames(b.path()));  // no temporary files left behind
}

TEST(TestModel, DifferentSeedsGiveDifferentWeightsAndTheSameTokenizer) {
  TempDir a;
  TempDir b;
  writeTestModel(tinyOptions("LlamaForCausalLM", DType::kBF16, 1), a.path());
  writeTestModel(tinyOptions("LlamaForCausalLM", DType::kBF16, 2), b.path());
  EXPECT_EQ(readFile(a.path() / "config.json"), readFile(b.path() / "config.json"));
  EXPECT_EQ(readFile(a.path() / "tokenizer.json"), readFile(b.path() / "tokenizer.json"));

  engine::SafetensorsFile file_a(a.path() / "model.safetensors");
  engine::SafetensorsFile file_b(b.path() / "model.safetensors");
  ASSERT_EQ(file_a.tensors().size(), file_b.tensors().size());
  for (const auto& [name, tensor] : file_a.tensors()) {
    const engine::TensorInfo* other = file_b.find(name);
    ASSERT_NE(other, nullptr) << name;
    ASSERT_EQ(tensor.num_bytes, other->num_bytes);
    EXPECT_NE(std::memcmp(tensor.data, other->data, tensor.num_bytes), 0) << name;
  }
}

TEST(TestModel, Bf16WeightsAreTheF32WeightsRounded) {
  TempDir f32_dir;
  TempDir bf16_dir;
  writeTestModel(tinyOptions("Qwen2ForCausalLM", DType::kF32, 5), f32_dir.path());
  writeTestModel(tinyOptions("Qwen2ForCausalLM", DType::kBF16, 5), bf16_dir.path());
  engine::SafetensorsFile f32_file(f32_dir.path() / "model.safetensors");
  engine::SafetensorsFile bf16_file(bf16_dir.path() / "model.safetensors");
  for (const auto& [name, tensor] : f32_file.tensors()) {
    ASSERT_EQ(tensor.dtype, DType::kF32);
    const engine::TensorInfo* rounded = bf16_file.find(name);
    ASSERT_NE(rounded, nullptr);
    ASSERT_EQ(rounded->dtype, DType::kBF16);
    const size_t count = tensor.num_bytes / 4;
    std::vector<uint16_t> expected(count);
    convertFromF32(DType::kBF16, static_cast<const float*>(tensor.data), expected.data(), count);
    EXPECT_EQ(std::memcmp(expected.data(), rounded->data, count * 2), 0) << name;
  }
}

// An fp8 model's projections are the f32 model's values divided by their
// block's scale and rounded to f8e4m3; every other tensor is the f32 one
// rounded to bf16, as without quantization.
TEST(TestModel, Fp8WeightsAreTheF32WeightsOverTheirScalesRounded) {
  TempDir f32_dir;
  TempDir fp8_dir;
  writeTestModel(tinyOptions("LlamaForCausalLM", DType::kF32, 5), f32_dir.path());
  TestModelOptions options = tinyOptions("LlamaForCausalLM", DType::kBF16, 5);
  options.quantization = parseQuantizationSpec("fp8:block=16x48");
  writeTestModel(options, fp8_dir.path());
  engine::SafetensorsFile f32_file(f32_dir.path() / "model.safetensors");
  engine::SafetensorsFile fp8_file(fp8_dir.path() / "model.safetensors");
  int quantized = 0;
  for (const auto& [name, tensor] : f32_file.tensors()) {
    SCOPED_TRACE(name);
    const engine::TensorInfo* written = fp8_file.find(name);
    ASSERT_NE(written, nullptr);
    const auto* values = static_cast<const float*>(tensor.data);
    const size_t count = tensor.num_bytes / 4;
    if (written->dtype != DType::kF8E4M3) {
      ASSERT_EQ(written->dtype, DType::kBF16);
      EXPECT_EQ(name.find("_proj"), std::string::npos);
      continue;
    }
    ++quantized;
    const int64_t rows = tensor.shape[0], cols = tensor.shape[1];
    const engine::TensorInfo* scales =
        fp8_file.find(name.substr(0, name.size() - 6) + "weight_scale_inv");
    ASSERT_NE(scales, nullptr);
    const int64_t grid_cols = (cols + 47) / 48;
    ASSERT_EQ(scales->shape, (std::vector<int64_t>{(rows + 15) / 16, grid_cols}));
    const auto* scale = static_cast<const float*>(scales->data);
    const auto* bytes = static_cast<const uint8_t*>(written->data);
    const float half_width = std::sqrt(3.0f / static_cast<float>(cols));
    for (int64_t i = 0; i < (rows + 15) / 16 * grid_cols; ++i) {
      EXPECT_GE(scale[i], half_width / 448.0f);
      EXPECT_LE(scale[i], 2.0f * half_width / 448.0f);
    }
    size_t mismatches = 0;
    for (size_t i = 0; i < count; ++i) {
      const auto r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) % cols;
      const float s = scale[(r / 16) * grid_cols + c / 48];
      mismatches += bytes[i] != f32ToF8e4m3(values[i] / s);
    }
    EXPECT_EQ(mismatches, 0u);
  }
  EXPECT_EQ(quantized, 2 * 7);
  // Every tensor is aligned to its dtype in the file (the scales after
  // fp8 matrices of any size included): widest dtypes are written first.
  for (const auto& [name, tensor] : fp8_file.tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor.data) % dtypeSize(tensor.dtype), 0u) << name;
  }
  EXPECT_EQ(json::parse(readFile(fp8_dir.path() / "config.json"))["quantization_config"],
            json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [16, 48]})"));
}

TEST(TestModel, QuantizationSpecsAndTheirErrors) {
  using Granularity = engine::Fp8Quantization::Granularity;
  EXPECT_EQ(parseQuantizationSpec("fp8").granularity, Granularity::kBlock);
  EXPECT_EQ(parseQuantizationSpec("fp8").block_rows, 128);
  EXPECT_STREQ(parseQuantizationSpec("fp8:tensor").scaleName(), "weight_scale");
  EXPECT_EQ(parseQuantizationSpec("compressed-tensors").granularity, Granularity::kChannel);
  const engine::Fp8Quantization block = parseQuantizationSpec("compressed-tensors:block=8x24");
  EXPECT_EQ(block.granularity, Granularity::kBlock);
  EXPECT_EQ(block.block_rows, 8);
  EXPECT_EQ(block.block_cols, 24);
  EXPECT_STREQ(block.scaleName(), "weight_scale");
  for (const char* bad : {"fp8:channel", "int8", "fp8:block=8", "fp8:block=0x4", "fp8:tensor=8x8",
                          "compressed-tensors:group"}) {
    SCOPED_TRACE(bad);
    try {
      parseQuantizationSpec(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("accepted: fp8, fp8:tensor"), std::string::npos)
          << e.what();
    }
  }
}

// ---------------------------------------------------------------------------
// What a tiny model holds

// Mean and standard deviation of a weight matrix, in fp32.
std::pair<double, double> moments(const kernels::WeightView& view, int64_t first_row,
                                  int64_t num_rows) {
  const size_t count = static_cast<size_t>(num_rows * view.cols);
  std::vector<float> values(count);
  const auto* bytes = static_cast<const uint8_t*>(view.data) +
                      static_cast<size_t>(first_row * view.cols) * dtypeSize(view.dtype);
  convertToF32(view.dtype, bytes, values.data(), count);
  double sum = 0, sum_squares = 0;
  for (float v : values) {
    sum += v;
    sum_squares += static_cast<double>(v) * v;
  }
  const double mean = sum / static_cast<double>(count);
  return {mean, std::sqrt(sum_squares / static_cast<double>(count) - mean * mean)};
}

TEST(TestModel, TinyModelLoadsWithTheIntendedStatistics) {
  TempDir dir;
  writeTestModel(tinyOptions("Qwen2ForCausalLM", DType::kF32, 3), dir.path());
  std::unique_ptr<engine::Model> model = engine::Model::load(dir.path());
  const engine::ModelConfig& c = model->config();
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.intermediate_size, 176);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.rope_scaling.type, engine::RopeScaling::Type::kLlama3);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);

  const engine::ModelWeights& w = model->weights();
  for (const engine::LayerWeights& layer : w.layers) {
    for (const kernels::WeightView* view : {&layer.q_proj, &layer.o_proj, &layer.down_proj}) {
      auto [mean, std_dev] = moments(*view, 0, view->rows);
      const double target = 1.0 / std::sqrt(static_cast<double>(view->cols));
      EXPECT_NEAR(mean, 0.0, 0.1 * target);
      EXPECT_NEAR(std_dev, target, 0.05 * target);
    }
    for (float v : layer.post_attention_layernorm) {
      EXPECT_GE(v, 0.9f);
      EXPECT_LE(v, 1.1f);
    }
    for (float v : layer.q_bias) EXPECT_LE(std::abs(v), 0.05f);
  }

  // lm_head rows of the special tokens are zero; the rows before them are not.
  json config = json::parse(readFile(dir.path() / "config.json"));
  const int64_t first_special = config["eos_token_id"][0].get<int64_t>();
  auto [mean, std_dev] = moments(w.lm_head, first_special, c.vocab_size - first_special);
  EXPECT_EQ(mean, 0.0);
  EXPECT_EQ(std_dev, 0.0);
  EXPECT_GT(moments(w.lm_head, 0, first_special).second, 0.05);
  // So are the rows of tokens that are not text on their own: a lone lead
  // byte of a two-byte character, a control character. Printable ones are not.
  EXPECT_EQ(moments(w.lm_head, 0xc3, 1).second, 0.0);
  EXPECT_EQ(moments(w.lm_head, 0x01, 1).second, 0.0);
  EXPECT_GT(moments(w.lm_head, 'a', 1).second, 0.05);
  EXPECT_GT(moments(w.lm_head, '\n', 1).second, 0.05);
}

TEST(TestModel, PresetsAndErrors) {
  EXPECT_EQ(presetNames(), (std::vector<std::string>{"tiny", "small", "llama3-8b"}));
  engine::ModelConfig small = presetConfig("small", "LlamaForCausalLM");
  EXPECT_EQ(small.num_hidden_layers, 8);
  EXPECT_EQ(small.hidden_size, 512);
  EXPECT_EQ(small.num_attention_heads, 8);
  EXPECT_EQ(small.num_key_value_heads, 4);
  EXPECT_EQ(small.head_dim, 64);
  EXPECT_EQ(small.intermediate_size, 1408);
  EXPECT_EQ(small.vocab_size, 32000);
  EXPECT_EQ(small.max_position_embeddings, 2048);
  EXPECT_EQ(small.rope_scaling.type, engine::RopeScaling::Type::kNone);
  EXPECT_TRUE(presetConfig("tiny", "Qwen3ForCausalLM").qk_norm);

  try {
    presetConfig("huge", "LlamaForCausalLM");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("\"huge\" is not known (accepted: tiny, small, llama3-8b)"),
        std::string::npos)
        << e.what();
  }
  try {
    presetConfig("tiny", "GPT2LMHeadModel");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LlamaForCausalLM"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------
// Tokenizer files

// Llama-3.1-8B's shape; only the configuration is checked (writing the
// weights takes 16 GB of disk).
TEST(TestModel, Llama3_8bPresetHasTheLlama31Shape) {
  const engine::ModelConfig c = presetConfig("llama3-8b", "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, engine::RopeScaling::Type::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.tie_word_embeddings);
  // 8.03e9 parameters: embed + lm_head + 32 x (attention + MLP) + norms.
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t per_layer = c.hidden_size * (2 * q + 2 * kv) +
                            3 * c.intermediate_size * c.hidden_size + 2 * c.hidden_size;
  const int64_t params =
      2 * c.vocab_size * c.hidden_size + c.num_hidden_layers * per_layer + c.hidden_size;
  EXPECT_EQ(params, 8030261248);
}

TEST(TestModelTokenizer, FilesAreConsistent) {
  TempDir dir;
  writeTestModel(tinyOptions(), dir.path());
  json tokenizer = json::parse(readFile(dir.path() / "tokenizer.json"));
  json tokenizer_config = json::parse(readFile(dir.path() / "tokenizer_config.json"));
  json config = json::parse(readFile(dir.path() / "config.json"));
  json generation = json::parse(readFile(dir.path() / "generation_config.json"));

  const json& vocab = tokenizer["model"]["vocab"];
  const json& merges = tokenizer["model"]["merges"];
  EXPECT_EQ(tokenizer["model"]["type"], "BPE");
  EXPECT_EQ(tokenizer["model"]["ignore_merges"], false);
  EXPECT_EQ(tokenizer["decoder"]["type"], "ByteLevel");
  const json& pre = tokenizer["pre_tokenizer"]["pretokenizers"];
  EXPECT_EQ(pre[0]["type"], "Split");
  EXPECT_EQ(pre[0]["pattern"]["Regex"], kLlama3PreTokenizerPattern);
  EXPECT_EQ(pre[0]["behavior"], "Isolated");
  EXPECT_EQ(pre[1]["type"], "ByteLevel");
  EXPECT_EQ(pre[1]["use_regex"], false);

  // Ids are 0..n-1 without gaps; the tiny vocabulary is filled exactly.
  const size_t n = vocab.size();
  std::set<int64_t> ids;
  for (const auto& [token, id] : vocab.items()) ids.insert(id.get<int64_t>());
  EXPECT_EQ(ids.size(), n);
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), static_cast<int64_t>(n) - 1);
  EXPECT_EQ(n, 509u);
  EXPECT_EQ(vocab["Ġ"], 32);  // the space byte, in GPT-2's byte-to-unicode form
  EXPECT_EQ(vocab["a"], 97);

  // Each merge joins two tokens into a third, all in the vocabulary.
  for (const json& merge : merges) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    ASSERT_NE(space, std::string::npos) << text;
    const std::string left = text.substr(0, space);
    const std::string right = text.substr(space + 1);
    EXPECT_TRUE(vocab.contains(left)) << text;
    EXPECT_TRUE(vocab.contains(right)) << text;
    EXPECT_TRUE(vocab.contains(left + right)) << text;
  }

  // Special tokens follow the BPE vocabulary and are all below vocab_size.
  const json& added = tokenizer["added_tokens"];
  ASSERT_EQ(added.size(), 3u);
  EXPECT_EQ(added[0]["content"], "<|endoftext|>");
  EXPECT_EQ(added[1]["content"], "<|im_start|>");
  EXPECT_EQ(added[2]["content"], "<|im_end|>");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(added[i]["id"], static_cast<int64_t>(n + i));
    EXPECT_LT(added[i]["id"].get<int64_t>(), config["vocab_size"].get<int64_t>());
    EXPECT_EQ(added[i]["special"], true);
  }
  EXPECT_EQ(config["eos_token_id"], json::array({n, n + 2}));
  EXPECT_EQ(generation["eos_token_id"], json::array({n, n + 2}));
  EXPECT_TRUE(config["bos_token_id"].is_null());
  EXPECT_TRUE(tokenizer_config["bos_token"].is_null());
  EXPECT_EQ(tokenizer_config["eos_token"], "<|im_end|>");
  EXPECT_EQ(tokenizer_config["pad_token"], "<|endoftext|>");
  EXPECT_EQ(tokenizer_config["model_max_length"], 512);
  EXPECT_NE(tokenizer_config["chat_template"].get<std::string>().find("<|im_start|>assistant\\n"),
            std::string::npos);
}

TEST(TestModelTokenizer, TokenizerLibraryAgreesWithTheTrainer) {
  TempDir dir;
  writeTestModel(tinyOptions(), dir.path());
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::fromDirectory(dir.path());
  EXPECT_EQ(tokenizer->vocabSize(), 512);
  EXPECT_EQ(tokenizer->eosTokenId(), std::optional<TokenId>(511));
  EXPECT_EQ(tokenizer->tokenToId("<|im_start|>"), std::optional<TokenId>(510));

  const std::string text =
      "The keeper's daughter walked 1234 steps, didn't she? \"Yes!\"\n\n  Naïve café: 3.14.";
  std::vector<TokenId> ids = tokenizer->encode(text);
  EXPECT_EQ(tokenizer->decode(ids), text);
  EXPECT_LT(ids.size(), text.size());  // merges actually apply

  // The library's encoding equals the trainer's own pre-tokenizer + merges,
  // rebuilt from tokenizer.json: both halves read the file the same way.
  json file = json::parse(readFile(dir.path() / "tokenizer.json"));
  std::map<std::string, std::string> byte_of_char;  // byte-level character -> raw byte
  for (int byte = 0; byte < 256; ++byte) {
    const std::string raw(1, static_cast<char>(byte));
    byte_of_char[byteLevelEncode(raw)] = raw;
  }
  auto rawBytes = [&](const std::string& token) {
    std::string raw;
    for (size_t i = 0; i < token.size();) {
      const size_t length = (static_cast<unsigned char>(token[i]) & 0x80) ? 2 : 1;
      raw += byte_of_char.at(token.substr(i, length));
      i += length;
    }
    return raw;
  };
  BpeModel model;
  model.tokens.resize(file["model"]["vocab"].size());
  for (const auto& [token, id] : file["model"]["vocab"].items()) {
    model.tokens[id.get<size_t>()] = rawBytes(token);
  }
  for (const json& merge : file["model"]["merges"]) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    model.merges.emplace_back(file["model"]["vocab"][text.substr(0, space)].get<int32_t>(),
                              file["model"]["vocab"][text.substr(space + 1)].get<int32_t>());
  }
  std::vector<TokenId> expected;
  for (std::string_view piece : splitLlama3PreTokens(text)) {
    for (int32_t id : bpeEncodeWord(model, piece)) expected.push_back(id);
  }
  EXPECT_EQ(ids, expected);

  const std::string chat = "<|im_start|>user\nhello<|im_end|>\n";
  std::vector<TokenId> chat_ids = tokenizer->encode(chat);
  ASSERT_FALSE(chat_ids.empty());
  EXPECT_EQ(chat_ids.front(), 510);
  EXPECT_EQ(tokenizer->decode(chat_ids), chat);
}

// ---------------------------------------------------------------------------
// BPE trainer and pre-tokenizer

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> pieces;
  for (std::string_view piece : splitLlama3PreTokens(text)) pieces.emplace_back(piece);
  return pieces;
}

TEST(Llama3PreTokenizer, SplitsLikeTheRegex) {
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split("it's THEY'RE we'll"), (Pieces{"it", "'s", " THEY", "'RE", " we", "'ll"}));
  EXPECT_EQ(split("'sun"), (Pieces{"'s", "un"}));
  EXPECT_EQ(split("12345 apples"), (Pieces{"123", "45", " apples"}));
  EXPECT_EQ(split("wait... what?!\n\nok"), (Pieces{"wait", "...", " what", "?!\n\n", "ok"}));
  EXPECT_EQ(split("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(split("a \n\n b"), (Pieces{"a", " \n\n", " b"}));
  EXPECT_EQ(split("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(split("\"quoted\" (x)"), (Pieces{"\"quoted", "\"", " (", "x", ")"}));
  EXPECT_EQ(split("x\tif"), (Pieces{"x", "\tif"}));
  EXPECT_EQ(split("café"), (Pieces{"café"}));
  EXPECT_EQ(split(""), Pieces{});
}

TEST(BpeTrainer, MergesTheMostFrequentPairFirstAndStopsBelowTwo) {
  // Pre-tokens "abab", " abab", " abc". "ab" occurs 5 times and is merged
  // first; then (" ", "ab") and ("ab", "ab") both occur twice and the tie goes
  // to the pair whose bytes sort first; after that no pair occurs twice.
  const BpeModel model = trainByteLevelBpe("abab abab abc", 1000);
  ASSERT_EQ(model.merges.size(), 2u);
  ASSERT_EQ(model.tokens.size(), 258u);
  EXPECT_EQ(model.tokens[256], "ab");
  EXPECT_EQ(model.tokens[257], " ab");
  EXPECT_EQ(model.merges[0], std::make_pair(int32_t{'a'}, int32_t{'b'}));
  EXPECT_EQ(model.merges[1], std::make_pair(int32_t{' '}, int32_t{256}));
  EXPECT_EQ(bpeEncodeWord(model, "abab"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(bpeEncodeWord(model, " abc"), (std::vector<int32_t>{257, 'c'}));
}

TEST(BpeTrainer, RespectsTheVocabularyLimitAndIsDeterministic) {
  const std::string corpus = "the cat sat on the mat with the other cat and the hat";
  const BpeModel a = trainByteLevelBpe(corpus, 260);
  EXPECT_EQ(a.tokens.size(), 260u);
  const BpeModel b = trainByteLevelBpe(corpus, 260);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_THROW(trainByteLevelBpe(corpus, 100), Error);
}

TEST(BpeTrainer, ByteLevelEncodingIsGpt2s) {
  EXPECT_EQ(byteLevelEncode("a b"), "aĠb");
  EXPECT_EQ(byteLevelEncode("\n"), "Ċ");
  EXPECT_EQ(byteLevelEncode(std::string(1, '\0')), "Ā");
  EXPECT_EQ(byteLevelEncode("é"), "Ã©");
}

}  // namespace
}  // namespace tandem::tools
