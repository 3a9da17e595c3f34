#include "tools/model/test_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>

#include "agent/engine/model.h"
#include "agent/engine/safetensors.h"
#include "common/status.h"
#include "tools/model/bpe_trainer.h"

namespace tandem::tools {

namespace {

namespace fs = std::filesystem;
using engine::ModelConfig;
using engine::RopeScaling;

// Original prose the tokenizer is trained on: a mix of narrative, dialogue
// with contractions, numbers, lists and code-like text, so the merges cover
// common English and the pre-tokenizer's digit and punctuation rules.
constexpr std::string_view kCorpus =
    R"corpus(The lighthouse at the end of the harbor had not been lit for eleven years. Every evening the keeper's daughter walked out along the stone pier anyway, carrying a lantern that she set on the lowest step of the tower. She said it was for the fishermen, though none of them needed it; the boats all had radios now, and the channel was marked with buoys that blinked green and red in the dark.

"Why do you still do it?" her brother asked one night in October. The wind was coming off the water hard enough to lift the spray over the wall.

"Because somebody should," she said. "And because I like the walk. It's the only time the town is quiet."

He didn't argue. He'd learned long ago that she wasn't going to change her mind about anything she'd already decided, and besides, he liked the walk too.

In the morning the market opened at six. The baker arrived first, then the woman who sold cheese from the hills, then the twins with their cart of apples, pears and plums. By seven there were forty stalls along the square, and by eight you couldn't cross it without stopping three times to talk to someone you knew.

A good recipe for bread needs only four things: flour, water, salt and time. Mix 500 grams of flour with 350 grams of warm water and let it rest for 30 minutes. Add 10 grams of salt and 5 grams of yeast, then fold the dough every half hour for two hours. Shape it, let it rise overnight in a cool place, and bake it at 230 degrees for about 45 minutes. The crust should be dark brown and the loaf should sound hollow when you tap the bottom.

Notes from the planning meeting (March 14, 2023):
1. The bridge repairs will start on Monday and finish by the end of June.
2. Traffic will be diverted through Mill Street; buses 12, 27 and 104 are affected.
3. The library's new reading room opens on April 2nd, from 9:00 to 17:30.
4. Questions should go to the council office, room 218, or to the website.

Rivers are patient engineers. Over thousands of years a river will carve a valley, move mountains of sand to the sea, and build new land at its mouth. When people straighten a river to make it more useful, it usually finds a way to bend again. The water doesn't care about maps; it only follows the slope of the ground and the weight of what it carries.

She opened the old notebook and found her grandfather's handwriting on the first page: "Things I have learned, in no particular order." The list went on for twenty pages. Some entries were practical ("Always keep a spare key outside the house, but never under the mat") and some were not ("The best conversations happen in kitchens"). Near the end, written in a shakier hand, was a single line: "Be kind to people who are learning something new. You were one of them once."

def count_words(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts

The function above counts how often each word appears. It lowercases the text first, so "The" and "the" are counted together, and it splits on whitespace, which means punctuation stays attached to words. A better version would strip punctuation, or use a proper tokenizer, but for a quick look at a document it's usually enough.

Weather report for the coast: clouds in the morning, clearing by noon. Winds from the west at 15 to 20 kilometers per hour, stronger near the headland. Temperatures between 12 and 19 degrees. Tomorrow will be warmer, with a chance of rain in the evening. The sea will be moderate, and small boats should take care near the rocks.

"I've never seen so many stars," said the boy, lying on his back in the field.
"That's because you've never been this far from a city," his aunt replied. "They're always there. We just can't see them through the light."
"Could we come back next week?"
"We'll see. If the sky is clear, and if you finish your homework, maybe."

The café on the corner served the strongest coffee in the district. Its owner, a retired sailor with a naïve love of poetry, wrote a new verse on the chalkboard every morning. Nobody knew where the verses came from, and when anyone asked, he only smiled and poured another cup.

A short history of the town: it was founded around 1650 as a fishing village, grew rapidly after the railway arrived in 1872, and reached a population of about 18,000 by 1950. Today it has roughly 24,500 residents, two schools, a hospital, a small university campus, and more bicycles than cars. The old railway station is now a museum, and the tracks have become a walking path that runs for 9 kilometers along the coast.

When you're learning to play an instrument, the hardest part isn't the first week or the first month. It's the long middle, when you're good enough to hear your mistakes but not yet good enough to avoid them. The only way through is to keep playing, a little every day, until one evening you notice that a piece which used to be difficult has become easy, and you can't remember when it changed.

Checklist before leaving the house: windows closed, stove off, lights off, back door locked, plants watered, cat fed, keys in pocket, phone charged. If all eight are done, you can go. If you're not sure about the stove, go back and check; it only takes a minute, and you'll stop worrying about it.

The last boat came in just after dark. Its crew tied up at the pier, unloaded the day's catch, and walked up the hill toward the lights of the town. Behind them, on the lowest step of the lighthouse, a small lantern was still burning.
)corpus";

constexpr const char* kEndOfText = "<|endoftext|>";
constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>";
constexpr int64_t kNumSpecialTokens = 3;

// ChatML, as Qwen's tokenizer_config.json writes it, with Qwen3's
// enable_thinking=false closing the reasoning in the prompt.
constexpr const char* kChatTemplate =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %})";

// splitmix64: a tiny PRNG whose output is fully specified, unlike the
// std:: distributions, so weights are identical on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// One tensor of the weights file: its values are uniform in
// [center - half_width, center + half_width), drawn row by row from a stream
// keyed by its name (so the order of generation is free); rows for which
// zero_row says so are written as zeros instead (the stream still advances).
struct TensorSpec {
  std::vector<int64_t> shape;  // {rows} or {rows, cols}
  float center = 0.0f;
  float half_width = 0.0f;
  std::function<bool(int64_t row)> zero_row;  // empty: no zero rows
  // Written as F8_E4M3 with its scales (a matrix of an fp8 model).
  bool quantize = false;
  // The shape in the file, when it has more than two dimensions (as many
  // elements as `shape`'s rows x cols, row-major alike); empty: `shape`.
  std::vector<int64_t> file_shape = {};
  // Set: written as U8, each byte drawn as byte(the next random 64 bits)
  // (MXFP4 blocks and scales); center and half_width are not used.
  std::function<uint8_t(uint64_t random)> byte = {};
};

int64_t rowsOf(const TensorSpec& spec) { return spec.shape[0]; }
int64_t colsOf(const TensorSpec& spec) { return spec.shape.size() > 1 ? spec.shape[1] : 1; }

// The scales of a quantized matrix (docs/quantization.md), as a quantizer
// of its granularity lays them out: a grid of blocks, each scale between
// one and two times half_width / 448 (drawn from a stream keyed by the
// matrix's name), so no value saturates and neighbouring blocks differ.
struct QuantizedLayout {
  kernels::WeightView grid;  // the scales' grid only (no data)
  std::vector<int64_t> shape;
  std::vector<float> scales;

  QuantizedLayout(const engine::Fp8Quantization& q, const std::string& name, int64_t rows,
                  int64_t cols, float half_width, uint64_t seed) {
    using Granularity = engine::Fp8Quantization::Granularity;
    grid.rows = rows;
    grid.cols = cols;
    std::tie(grid.scale_rows, grid.scale_cols) = q.scaleBlock(rows, cols);
    shape = q.granularity == Granularity::kTensor ? std::vector<int64_t>{1}
            : q.granularity == Granularity::kChannel
                ? std::vector<int64_t>{rows, 1}
                : std::vector<int64_t>{grid.scaleGridRows(), grid.scaleGridCols()};
    SplitMix64 rng(fnv1a(name + "/scales") ^ (seed * 0x9e3779b97f4a7c15ull));
    scales.resize(static_cast<size_t>(grid.scaleGridRows() * grid.scaleGridCols()));
    for (float& scale : scales) {
      const float unit = static_cast<float>(rng.next() >> 40) * 0x1p-24f;
      scale = half_width / 448.0f * (1.0f + unit);
    }
    grid.scales = scales.data();
  }
};

// Writes model.safetensors with SafetensorsWriter, each tensor generated one
// bounded chunk at a time while the file is written, so a 16 GB model needs
// a few MB of memory. Tensors marked quantize are written as F8_E4M3, each
// generated value divided by its scale and rounded, with their scales.
void writeSafetensorsStreaming(const std::map<std::string, TensorSpec>& tensors, DType dtype,
                               uint64_t seed, const fs::path& path,
                               const engine::Fp8Quantization& quantization = {},
                               const std::map<std::string, float>& scalars = {}) {
  constexpr int64_t kChunkElements = int64_t{1} << 22;
  engine::SafetensorsWriter writer;
  for (const auto& [name, value] : scalars) {
    std::vector<uint8_t> bytes(sizeof(float));
    std::memcpy(bytes.data(), &value, sizeof value);
    writer.add(name, DType::kF32, {}, std::move(bytes));
  }
  for (const auto& [tensor_name, tensor_spec] : tensors) {
    std::shared_ptr<const QuantizedLayout> layout;
    if (tensor_spec.quantize) {
      layout = std::make_shared<QuantizedLayout>(quantization, tensor_name, rowsOf(tensor_spec),
                                                 colsOf(tensor_spec), tensor_spec.half_width, seed);
      std::vector<uint8_t> scale_bytes(layout->scales.size() * sizeof(float));
      std::memcpy(scale_bytes.data(), layout->scales.data(), scale_bytes.size());
      writer.add(quantization.scaleTensorOf(tensor_name), DType::kF32, layout->shape,
                 std::move(scale_bytes));
    }
    const DType tensor_dtype = layout ? DType::kF8E4M3 : tensor_spec.byte ? DType::kU8 : dtype;
    const size_t element_bytes = dtypeSize(tensor_dtype);
    writer.addStreamed(tensor_name, tensor_dtype,
                       tensor_spec.file_shape.empty() ? tensor_spec.shape : tensor_spec.file_shape,
                       [&, name = tensor_name, spec = tensor_spec, layout, tensor_dtype,
                        element_bytes](std::ostream& out) {
                         SplitMix64 rng(fnv1a(name) ^ (seed * 0x9e3779b97f4a7c15ull));
                         const int64_t rows = rowsOf(spec), cols = colsOf(spec);
                         const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / cols);
                         std::vector<float> values;
                         std::vector<uint8_t> bytes;
                         for (int64_t first = 0; first < rows; first += chunk_rows) {
                           const int64_t count_rows = std::min(chunk_rows, rows - first);
                           const auto count = static_cast<size_t>(count_rows * cols);
                           if (spec.byte) {
                             bytes.resize(count);
                             for (uint8_t& byte : bytes) byte = spec.byte(rng.next());
                             out.write(reinterpret_cast<const char*>(bytes.data()),
                                       static_cast<std::streamsize>(bytes.size()));
                             continue;
                           }
                           values.resize(count);
                           for (float& value : values) {
                             // The top 24 bits give a float in [0, 1) without rounding.
                             const float unit = static_cast<float>(rng.next() >> 40) * 0x1p-24f;
                             value = spec.center + (2.0f * unit - 1.0f) * spec.half_width;
                           }
                           if (layout) {
                             for (size_t i = 0; i < count; ++i) {
                               const auto r = first + static_cast<int64_t>(i) / cols;
                               const auto c = static_cast<int64_t>(i) % cols;
                               values[i] /= layout->grid.scaleAt(r, c);
                             }
                           }
                           bytes.resize(count * element_bytes);
                           convertFromF32(tensor_dtype, values.data(), bytes.data(), count);
                           if (spec.zero_row) {
                             const size_t row_bytes = static_cast<size_t>(cols) * element_bytes;
                             for (int64_t r = 0; r < count_rows; ++r) {
                               if (!spec.zero_row(first + r)) continue;
                               std::fill_n(
                                   bytes.begin() + static_cast<std::ptrdiff_t>(r * row_bytes),
                                   row_bytes, uint8_t{0});
                             }
                           }
                           out.write(reinterpret_cast<const char*>(bytes.data()),
                                     static_cast<std::streamsize>(bytes.size()));
                         }
                       });
  }
  writer.write(path);
}

struct TrainedTokenizer {
  BpeModel bpe;
  int64_t end_of_text_id = 0;
  int64_t im_start_id = 0;
  int64_t im_end_id = 0;
};

TrainedTokenizer trainTokenizer(int64_t vocab_size) {
  TrainedTokenizer result;
  result.bpe = trainByteLevelBpe(kCorpus, static_cast<size_t>(vocab_size - kNumSpecialTokens));
  // The special tokens follow the BPE vocabulary directly.
  const auto first_special = static_cast<int64_t>(result.bpe.tokens.size());
  result.end_of_text_id = first_special;
  result.im_start_id = first_special + 1;
  result.im_end_id = first_special + 2;
  return result;
}

// OLMo 3's sliding layers for a test model: all but every 4th, every 2nd
// at tiny (two layers: one of each).
std::vector<bool> olmo3SlidingLayers(int64_t layers, const std::string& preset) {
  const int64_t interval = preset == "tiny" ? 2 : 4;
  std::vector<bool> sliding(static_cast<size_t>(layers));
  for (size_t i = 0; i < sliding.size(); ++i) {
    sliding[i] = (static_cast<int64_t>(i) + 1) % interval != 0;
  }
  return sliding;
}

// SmolLM3's NoPE pattern for a test model: every 4th layer, every 2nd at
// tiny (two layers).
std::vector<bool> smolLm3NopeLayers(int64_t layers, const std::string& preset) {
  const int64_t interval = preset == "tiny" ? 2 : 4;
  std::vector<bool> nope(static_cast<size_t>(layers));
  for (size_t i = 0; i < nope.size(); ++i) nope[i] = (static_cast<int64_t>(i) + 1) % interval == 0;
  return nope;
}

// Gemma's and GPT-OSS's sliding layers: every other one from the first.
std::vector<bool> everyOtherLayer(int64_t layers) {
  std::vector<bool> sliding(static_cast<size_t>(layers));
  for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = i % 2 == 0;
  return sliding;
}

// YaRN by `factor` over a factor-th of the context, with the attention
// factor's default.
RopeScaling yarnOver(const ModelConfig& config, double factor) {
  RopeScaling scaling;
  scaling.type = RopeScaling::Type::kYarn;
  scaling.factor = factor;
  scaling.original_max_position_embeddings =
      config.max_position_embeddings / static_cast<int64_t>(factor);
  scaling.attention_factor = engine::yarnDefaultAttentionFactor(factor);
  return scaling;
}

ModelConfig baseConfig(const std::string& preset, const std::string& architecture) {
  ModelConfig config;
  config.model_type = engine::modelTypeOf(architecture, "test model");
  config.architecture = architecture;
  if (preset == "tiny") {
    config.vocab_size = 512;
    config.hidden_size = 64;
    config.num_hidden_layers = 2;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 16;
    config.intermediate_size = 176;
    config.max_position_embeddings = 512;
    // Exercises the llama3 frequency scaling in every test that runs tiny.
    config.rope_scaling.type = RopeScaling::Type::kLlama3;
    config.rope_scaling.factor = 8.0;
    config.rope_scaling.low_freq_factor = 1.0;
    config.rope_scaling.high_freq_factor = 4.0;
    config.rope_scaling.original_max_position_embeddings = 128;
  } else if (preset == "small") {
    config.vocab_size = 32000;
    config.hidden_size = 512;
    config.num_hidden_layers = 8;
    config.num_attention_heads = 8;
    config.num_key_value_heads = 4;
    config.head_dim = 64;
    config.intermediate_size = 1408;
    config.max_position_embeddings = 2048;
  } else if (preset == "llama3-8b") {
    // Llama-3.1-8B's shape (random weights): 16 GB in bf16.
    config.vocab_size = 128256;
    config.hidden_size = 4096;
    config.num_hidden_layers = 32;
    config.num_attention_heads = 32;
    config.num_key_value_heads = 8;
    config.head_dim = 128;
    config.intermediate_size = 14336;
    config.max_position_embeddings = 131072;
    config.rope_scaling.type = RopeScaling::Type::kLlama3;
    config.rope_scaling.factor = 8.0;
    config.rope_scaling.low_freq_factor = 1.0;
    config.rope_scaling.high_freq_factor = 4.0;
    config.rope_scaling.original_max_position_embeddings = 8192;
  } else {
    throw Error("test model: preset \"" + preset +
                "\" is not known (accepted: tiny, small, llama3-8b)");
  }
  config.rope_theta = preset == "llama3-8b" ? 500000.0 : 10000.0;
  config.rms_norm_eps = 1e-5;
  config.tie_word_embeddings = false;
  config.attention_bias =
      architecture == "Qwen2ForCausalLM" || architecture == "Qwen2MoeForCausalLM";
  config.qk_norm = architecture == "Qwen3ForCausalLM" || architecture == "Qwen3MoeForCausalLM";
  if (architecture == "MixtralForCausalLM") {
    // Mixtral's routing (2 of 8, renormalized); every layer a mixture of
    // intermediate_size experts.
    config.num_experts = preset == "tiny" ? 4 : 8;
    config.num_experts_per_tok = 2;
    config.moe_intermediate_size = config.intermediate_size;
    config.norm_topk_prob = true;
  } else if (architecture == "Qwen3MoeForCausalLM") {
    if (preset == "tiny") {
      // An odd number of experts per token, weights left as the softmax
      // gives them, and a dense first layer: what Mixtral's tiny does not
      // exercise.
      config.num_experts = 8;
      config.num_experts_per_tok = 3;
      config.moe_intermediate_size = 48;
      config.norm_topk_prob = false;
      config.mlp_only_layers = {0};
    } else {
      // Many narrow experts, as Qwen3-30B-A3B's 128 of 768 choosing 8.
      config.num_experts = preset == "small" ? 32 : 128;
      config.num_experts_per_tok = preset == "small" ? 4 : 8;
      config.moe_intermediate_size = config.intermediate_size / 4;
      config.norm_topk_prob = true;
    }
  }
  if (architecture == "Gemma3ForCausalLM" || architecture == "Gemma2ForCausalLM") {
    // What Gemma 2 and 3 share at this preset's size: tied embeddings, a
    // query scale other than head_dim's, and every other layer sliding from
    // the first (so tiny has one of each) with a window short prompts
    // already cross.
    const bool gemma3 = architecture == "Gemma3ForCausalLM";
    config.gemma = true;
    config.tie_word_embeddings = true;
    config.rms_norm_eps = 1e-6;
    config.rope_scaling = RopeScaling{};
    config.query_pre_attn_scalar = 2.0 * static_cast<double>(config.head_dim);
    config.sliding_window = preset == "tiny" ? 24 : 512;
    config.sliding_layers = everyOtherLayer(config.num_hidden_layers);
    config.qk_norm = gemma3;
    if (gemma3) {
      // q/k norms, two rotary bases, and linear scaling on the full layers
      // (as Gemma 3 4B and up).
      config.model_type = "gemma3_text";
      config.rope_theta = 1e6;
      config.rope_local_base_freq = 10000.0;
      config.rope_scaling.type = RopeScaling::Type::kLinear;
      config.rope_scaling.factor = 8.0;
    } else {
      // One rotary base, and soft-capping; at tiny, caps near the scores'
      // and logits' own size so that the tanh bends them.
      config.model_type = "gemma2";
      config.rope_theta = 10000.0;
      config.rope_local_base_freq = config.rope_theta;
      config.attn_logit_softcapping = preset == "tiny" ? 2.0 : 50.0;
      config.final_logit_softcapping = preset == "tiny" ? 4.0 : 30.0;
    }
  }
  if (architecture == "Phi3ForCausalLM") {
    // Phi-4-mini's rotary embedding: three quarters of each head rotate,
    // with LongRoPE (the long factors in use at the preset's full context,
    // with the attention factor's default); at tiny, also Phi-3-mini's
    // window on every layer, which short prompts already cross.
    config.phi3 = true;
    config.rotary_dim = config.head_dim * 3 / 4;
    const auto pairs = static_cast<size_t>(config.rotary_dim / 2);
    RopeScaling& scaling = config.rope_scaling;
    scaling = RopeScaling{};
    scaling.type = RopeScaling::Type::kLongRope;
    for (size_t i = 0; i < pairs; ++i) {
      const double x = static_cast<double>(i) / static_cast<double>(pairs - 1);
      scaling.short_factor.push_back(1.0 + 0.05 * static_cast<double>(i));
      scaling.long_factor.push_back(1.0 + 30.0 * x * x);
    }
    scaling.original_max_position_embeddings = config.max_position_embeddings / 4;
    const double ratio = 4.0;
    scaling.short_mscale = scaling.long_mscale = std::sqrt(
        1.0 +
        std::log(ratio) / std::log(static_cast<double>(scaling.original_max_position_embeddings)));
    scaling.use_long = true;
    if (preset == "tiny") {
      config.sliding_window = 32;
      config.sliding_layers.assign(static_cast<size_t>(config.num_hidden_layers), true);
    }
  } else {
    config.rotary_dim = config.head_dim;
  }
  if (architecture == "GlmForCausalLM" || architecture == "Glm4ForCausalLM") {
    // GLM's rotary embedding (half of each head, neighbour pairs), its q/k/v
    // biases and its norms' epsilon; GLM-4's sandwich norms.
    config.glm = true;
    config.glm4 = architecture == "Glm4ForCausalLM";
    config.model_type = config.glm4 ? "glm4" : "glm";
    config.rotary_dim = config.head_dim / 2;
    config.rope_scaling = RopeScaling{};  // as GLM-4's configs: none
    config.attention_bias = true;
    config.rms_norm_eps = 1.5625e-7;
  }
  if (architecture == "Qwen2MoeForCausalLM") {
    // Qwen2-MoE's softmax routing with the softmax's weights as they are,
    // and its shared expert with a sigmoid gate; at tiny, every second
    // layer a mixture (decoder_sparse_step 2: the first is dense).
    config.num_experts = preset == "tiny" ? 8 : 32;
    config.num_experts_per_tok = preset == "tiny" ? 2 : 4;
    config.moe_intermediate_size = preset == "tiny" ? 48 : config.intermediate_size / 4;
    config.shared_expert_intermediate_size = preset == "tiny" ? 96 : config.intermediate_size;
    config.norm_topk_prob = false;
    config.decoder_sparse_step = preset == "tiny" ? 2 : 1;
  }
  if (architecture == "Glm4MoeForCausalLM") {
    // GLM-4.5's attention (half of each head rotating as halves, q/k/v
    // biases), and its mixture: sigmoid routing with a correction bias, one
    // shared expert, the first layer dense. At tiny, also DeepSeek's groups
    // (one of two chosen, so a token's three experts come from one group),
    // q/k norms (GLM-4.5's; GLM-4.5-Air has none) and a routed scale above
    // 1 (GLM-4.5's 2.5); at small, GLM-4.5-Air's routing (no groups, scale
    // 1, no q/k norms).
    config.rotary_dim = config.head_dim / 2;
    config.rope_scaling = RopeScaling{};  // as GLM-4.5's configs: none
    config.attention_bias = true;
    config.rms_norm_eps = 1e-5;
    config.sigmoid_routing = true;
    config.norm_topk_prob = true;
    config.n_shared_experts = 1;
    config.first_k_dense_replace = 1;
    if (preset == "tiny") {
      config.num_experts = 8;
      config.num_experts_per_tok = 3;
      config.moe_intermediate_size = 48;
      config.n_group = 2;
      config.topk_group = 1;
      config.routed_scaling_factor = 2.5;
      config.qk_norm = true;
    } else {
      config.num_experts = preset == "small" ? 32 : 128;
      config.num_experts_per_tok = preset == "small" ? 4 : 8;
      config.moe_intermediate_size = config.intermediate_size / 4;
    }
  }
  if (architecture == "GptOssForCausalLM") {
    // GPT-OSS's attention (q/k/v and o_proj biases, one sink per head, every
    // other layer sliding from the first; at tiny a window short prompts
    // already cross) and YaRN as published (factor 32 over a thirty-second
    // of the context, bounds not rounded). Its mixture: the router's
    // softmax over its 4 best logits (with the router's bias), experts with
    // biases and the clamped activation, of a width MXFP4's 32-value blocks
    // divide; at tiny a limit of 0.75, which these activations cross, at
    // small the published 7.
    config.rope_theta = 150000.0;
    config.rope_scaling = yarnOver(config, 32.0);
    config.rope_scaling.truncate = false;
    config.attention_bias = true;
    config.sliding_window = preset == "tiny" ? 24 : 128;
    config.sliding_layers = everyOtherLayer(config.num_hidden_layers);
    if (preset == "tiny") config.intermediate_size = 96;
    config.num_experts = preset == "tiny" ? 8 : preset == "small" ? 32 : 128;
    config.num_experts_per_tok = 4;
    config.moe_intermediate_size = config.intermediate_size;
    config.norm_topk_prob = true;
    config.swiglu_limit = preset == "tiny" ? 0.75 : 7.0;
  }
  if (architecture == "OlmoeForCausalLM") {
    // OLMoE: pre-norm layers with q/k norms across the heads, every layer
    // a mixture of intermediate_size experts weighted by the softmax over
    // all router logits, not renormalized (OLMoE-1B-7B's 64 choosing 8,
    // narrower here, half the hidden size's width as OLMoE's 1,024 of 2,048
    // at small); no grouped KV heads, as published.
    config.qk_norm = true;
    config.num_key_value_heads = config.num_attention_heads;
    config.intermediate_size = preset == "tiny" ? 48 : config.intermediate_size / 4;
    config.num_experts = preset == "tiny" ? 8 : preset == "small" ? 32 : 64;
    config.num_experts_per_tok = preset == "tiny" ? 3 : 8;
    config.moe_intermediate_size = config.intermediate_size;
    config.norm_topk_prob = false;
  }
  if (architecture == "Olmo2ForCausalLM" || architecture == "Olmo3ForCausalLM") {
    // OLMo 2's norms after attention and the MLP, and q/k norms across the
    // heads.
    config.olmo2 = true;
    config.qk_norm = true;
  }
  if (architecture == "Olmo3ForCausalLM") {
    // OLMo 3's sliding layers (a window short prompts already cross at
    // tiny) rotating unscaled, and YaRN on the full ones as the published
    // configs set it: factor 8 over an eighth of the context, the
    // attention factor's default.
    config.olmo3 = true;
    config.sliding_window = preset == "tiny" ? 24 : 512;
    config.sliding_layers = olmo3SlidingLayers(config.num_hidden_layers, preset);
    config.rope_local_base_freq = config.rope_theta;
    config.rope_scaling = yarnOver(config, 8.0);
  }
  if (architecture == "Ministral3ForCausalLM") {
    // Ministral 3's rotary parameters as published: YaRN factor 16 over a
    // sixteenth of the context with DeepSeek's mscale pair at 1 (no
    // attention factor), and the query scale's beta 0.1 from that original
    // context on (at tiny, 32 positions: prompts cross it).
    config.rope_theta = 1e6;
    config.rope_scaling = yarnOver(config, 16.0);
    config.rope_scaling.attention_factor = 1.0;
    config.llama4_scaling_beta = 0.1;
    config.llama4_scaling_original = config.rope_scaling.original_max_position_embeddings;
  }
  if (architecture == "SmolLM3ForCausalLM") {
    // SmolLM3's NoPE layers (every 4th; at tiny, the second of its two)
    // and tied embeddings.
    config.tie_word_embeddings = true;
    config.nope_layers = smolLm3NopeLayers(config.num_hidden_layers, preset);
  }
  if (architecture == "GraniteForCausalLM" || architecture == "GraniteMoeForCausalLM") {
    // Granite 3's four scalars, of their published sizes (the 8B's
    // embedding 12, residual 0.22, scores by 1/head_dim), tied embeddings,
    // and at tiny a logit divisor near the logits' own size. Granite MoE's
    // mixture: at tiny 8 experts choosing 2, at small 32 choosing 8 (as
    // granite-3.1-1b-a400m), softmax over the chosen logits.
    config.granite = true;
    if (architecture == "GraniteMoeForCausalLM") {
      config.num_experts = preset == "tiny" ? 8 : 32;
      config.num_experts_per_tok = preset == "tiny" ? 2 : 8;
      config.moe_intermediate_size = config.intermediate_size;
      config.norm_topk_prob = true;
    }
    config.tie_word_embeddings = true;
    config.embedding_multiplier = 12.0;
    config.attention_multiplier = 1.0 / static_cast<double>(config.head_dim);
    config.residual_multiplier = 0.22;
    config.logits_scaling = preset == "tiny" ? 4.0 : 16.0;
  }
  config.torch_dtype = DType::kBF16;
  config.bos_token_id = -1;
  return config;
}

// Whether `bytes` is complete UTF-8 without control characters other than
// newline and tab: text a detokenizer can show on its own.
bool isPlainText(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    size_t length = 1;
    uint32_t code_point = lead;
    if (lead >= 0x80) {
      if (lead >= 0xc2 && lead <= 0xdf) {
        length = 2;
      } else if (lead >= 0xe0 && lead <= 0xef) {
        length = 3;
      } else if (lead >= 0xf0 && lead <= 0xf4) {
        length = 4;
      } else {
        return false;
      }
      code_point = lead & (0x7fu >> length);
      if (i + length > bytes.size()) return false;
      for (size_t k = 1; k < length; ++k) {
        const auto continuation = static_cast<unsigned char>(bytes[i + k]);
        if ((continuation & 0xc0) != 0x80) return false;
        code_point = (code_point << 6) | (continuation & 0x3f);
      }
      // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
      const uint32_t minimum[] = {0, 0, 0x80, 0x800, 0x10000};
      if (code_point < minimum[length] || (code_point >= 0xd800 && code_point <= 0xdfff) ||
          code_point > 0x10ffff) {
        return false;
      }
    }
    if ((code_point < 0x20 && code_point != '\n' && code_point != '\t') ||
        (code_point >= 0x7f && code_point < 0xa0)) {
      return false;
    }
    i += length;
  }
  return true;
}

void setTokenIds(ModelConfig& config, const TrainedTokenizer& tokenizer) {
  config.eos_token_ids = {tokenizer.end_of_text_id, tokenizer.im_end_id};
}

// Replaces `path` atomically, so a reader never sees half a file.
void writeFile(const fs::path& path, const std::string& text) {
  fs::path temporary = path;
  temporary += ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) throw Error(temporary.string() + ": cannot write");
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) throw Error(path.string() + ": cannot replace: " + error.message());
}

std::string tokenizerJson(const TrainedTokenizer& tokenizer) {
  using ordered_json = nlohmann::ordered_json;
  // Key order follows what the Hugging Face tokenizers library writes.
  ordered_json added_tokens = ordered_json::array();
  const std::pair<const char*, int64_t> specials[] = {{kEndOfText, tokenizer.end_of_text_id},
                                                      {kImStart, tokenizer.im_start_id},
                                                      {kImEnd, tokenizer.im_end_id}};
  for (const auto& [content, id] : specials) {
    added_tokens.push_back({{"id", id},
                            {"content", content},
                            {"single_word", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"special", true}});
  }

  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < tokenizer.bpe.tokens.size(); ++id) {
    vocab[byteLevelEncode(tokenizer.bpe.tokens[id])] = id;
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : tokenizer.bpe.merges) {
    merges.push_back(byteLevelEncode(tokenizer.bpe.tokens[static_cast<size_t>(left)]) + " " +
                     byteLevelEncode(tokenizer.bpe.tokens[static_cast<size_t>(right)]));
  }

  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = added_tokens;
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       ordered_json::array({ordered_json{{"type", "Split"},
                                         {"pattern", {{"Regex", kLlama3PreTokenizerPattern}}},
                                         {"behavior", "Isolated"},
                                         {"invert", false}},
                            ordered_json{{"type", "ByteLevel"},
                                         {"add_prefix_space", false},
                                         {"trim_offsets", true},
                                         {"use_regex", false}}})}};
  root["post_processor"] = nullptr;
  root["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", false},
                   {"vocab", vocab},
                   {"merges", merges}};
  return root.dump(2) + "\n";
}

std::string tokenizerConfigJson(const TrainedTokenizer& tokenizer, const ModelConfig& config) {
  using nlohmann::json;
  json added = json::object();
  const std::pair<const char*, int64_t> specials[] = {{kEndOfText, tokenizer.end_of_text_id},
                                                      {kImStart, tokenizer.im_start_id},
                                                      {kImEnd, tokenizer.im_end_id}};
  for (const auto& [content, id] : specials) {
    added[std::to_string(id)] = {{"content", content},   {"lstrip", false},
                                 {"normalized", false},  {"rstrip", false},
                                 {"single_word", false}, {"special", true}};
  }
  json root;
  root["added_tokens_decoder"] = added;
  root["bos_token"] = nullptr;
  root["chat_template"] = kChatTemplate;
  root["clean_up_tokenization_spaces"] = false;
  root["eos_token"] = kImEnd;
  root["errors"] = "replace";
  root["model_max_length"] = config.max_position_embeddings;
  root["pad_token"] = kEndOfText;
  root["split_special_tokens"] = false;
  root["tokenizer_class"] = "PreTrainedTokenizerFast";
  root["unk_token"] = nullptr;
  return root.dump(2) + "\n";
}

std::string generationConfigJson(const TrainedTokenizer& tokenizer, const ModelConfig& config) {
  nlohmann::json root;
  root["do_sample"] = false;
  root["eos_token_id"] = config.eos_token_ids;
  root["pad_token_id"] = tokenizer.end_of_text_id;
  return root.dump(2) + "\n";
}

// GPT-OSS's router (with a bias that moves some choices; its logits spread
// four times a matrix's usual range, as a trained router's do, so that
// 16-bit rounding of the activations flips no choice of the test prompts)
// and experts, as
// transformers holds them (gate_up_proj [experts, hidden, 2 x width], gate
// and up interleaved in its columns; down_proj [experts, width, hidden]) or,
// in an mxfp4 model, as the published checkpoints do: uniform random FP4
// nibbles, and per 32-value block a power of two putting the largest (6)
// near the matrix's range or half of it.
void gptOssExperts(const ModelConfig& config, const std::string& prefix,
                   std::map<std::string, TensorSpec>& tensors) {
  const int64_t experts = config.num_experts, hidden = config.hidden_size;
  const int64_t width = config.moe_intermediate_size;
  const std::string base = prefix + "mlp.experts.";
  auto range = [](int64_t fan_in) { return std::sqrt(3.0f / static_cast<float>(fan_in)); };
  tensors[prefix + "mlp.router.weight"] = {{experts, hidden}, 0.0f, 4.0f * range(hidden), {}};
  tensors[prefix + "mlp.router.bias"] = {{experts}, 0.0f, 0.25f, {}};
  tensors[base + "gate_up_proj_bias"] = {{experts, 2 * width}, 0.0f, 0.05f, {}};
  tensors[base + "down_proj_bias"] = {{experts, hidden}, 0.0f, 0.05f, {}};
  if (!config.mxfp4()) {
    TensorSpec gate_up{{experts * hidden, 2 * width}, 0.0f, range(hidden), {}};
    gate_up.file_shape = {experts, hidden, 2 * width};
    tensors[base + "gate_up_proj"] = gate_up;
    TensorSpec down{{experts * width, hidden}, 0.0f, range(width), {}};
    down.file_shape = {experts, width, hidden};
    tensors[base + "down_proj"] = down;
    return;
  }
  for (const auto& [name, rows, cols] : {std::tuple{std::string("gate_up_proj"), 2 * width, hidden},
                                         std::tuple{std::string("down_proj"), hidden, width}}) {
    TensorSpec blocks{{experts * rows * (cols / 32), 16}, 0.0f, 0.0f, {}};
    blocks.file_shape = {experts, rows, cols / 32, 16};
    blocks.byte = [](uint64_t random) { return static_cast<uint8_t>(random >> 56); };
    tensors[base + name + "_blocks"] = blocks;
    const auto top = static_cast<uint8_t>(127 + std::floor(std::log2(range(cols) / 6.0f)));
    TensorSpec scales{{experts * rows, cols / 32}, 0.0f, 0.0f, {}};
    scales.file_shape = {experts, rows, cols / 32};
    scales.byte = [top](uint64_t random) { return static_cast<uint8_t>(top - (random >> 63)); };
    tensors[base + name + "_scales"] = scales;
  }
}

// Tensors in Hugging Face names and shapes. Matrices have standard deviation
// 1/sqrt(fan_in) so activations keep their scale through the layers and the
// logits vary with the context; norm weights sit near 1.
//
// An fp8 model (config.quantization) quantizes the projections, the
// experts' included, as published fp8 checkpoints do; the embedding, the LM
// head and a mixture's router stay in `dtype`.
void writeWeights(const ModelConfig& config, DType dtype, uint64_t seed,
                  const std::vector<std::string>& tokens, bool kv_cache_scales,
                  const fs::path& path) {
  std::map<std::string, TensorSpec> tensors;
  std::map<std::string, float> scalars;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    tensors[name] = {{rows, cols}, 0.0f, std::sqrt(3.0f / static_cast<float>(cols)), {}};
  };
  auto projection = [&](const std::string& name, int64_t rows, int64_t cols) {
    matrix(name, rows, cols);
    tensors[name].quantize = config.quantized();
  };
  auto vector = [&](const std::string& name, int64_t size, float center, float half_width) {
    tensors[name] = {{size}, center, half_width, {}};
  };
  constexpr float kNormNoise = 0.1f;
  constexpr float kBiasNoise = 0.05f;
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.num_attention_heads * config.head_dim;
  const int64_t kv_size = config.num_key_value_heads * config.head_dim;
  const int64_t inter = config.intermediate_size;

  matrix("model.embed_tokens.weight", config.vocab_size, hidden);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    if (config.fusedQkv()) {
      projection(prefix + "self_attn.qkv_proj.weight", q_size + 2 * kv_size, hidden);
    } else {
      projection(prefix + "self_attn.q_proj.weight", q_size, hidden);
      projection(prefix + "self_attn.k_proj.weight", kv_size, hidden);
      projection(prefix + "self_attn.v_proj.weight", kv_size, hidden);
    }
    projection(prefix + "self_attn.o_proj.weight", hidden, q_size);
    if (config.attention_bias) {
      vector(prefix + "self_attn.q_proj.bias", q_size, 0.0f, kBiasNoise);
      vector(prefix + "self_attn.k_proj.bias", kv_size, 0.0f, kBiasNoise);
      vector(prefix + "self_attn.v_proj.bias", kv_size, 0.0f, kBiasNoise);
      if (config.gptOss()) vector(prefix + "self_attn.o_proj.bias", hidden, 0.0f, kBiasNoise);
    }
    // GPT-OSS's sinks, from below these scores to above them.
    if (config.gptOss()) {
      vector(prefix + "self_attn.sinks", config.num_attention_heads, 0.5f, 1.5f);
    }
    if (config.qk_norm) {
      // OLMo 2's span all heads.
      const float center = config.gemma ? 0.0f : 1.0f;
      vector(prefix + "self_attn.q_norm.weight", config.fullQkNorm() ? q_size : config.head_dim,
             center, kNormNoise);
      vector(prefix + "self_attn.k_norm.weight", config.fullQkNorm() ? kv_size : config.head_dim,
             center, kNormNoise);
    }
    if (config.gptOss()) {
      gptOssExperts(config, prefix, tensors);
    } else if (config.graniteMoe()) {
      // Granite MoE's experts stacked as published: input_linear's gate
      // rows then up rows, output_linear.
      const std::string block = prefix + "block_sparse_moe.";
      const int64_t experts = config.num_experts, width = config.moe_intermediate_size;
      matrix(block + "router.layer.weight", experts, hidden);
      matrix(block + "input_linear.weight", experts * 2 * width, hidden);
      tensors[block + "input_linear.weight"].file_shape = {experts, 2 * width, hidden};
      matrix(block + "output_linear.weight", experts * hidden, width);
      tensors[block + "output_linear.weight"].file_shape = {experts, hidden, width};
    } else if (config.isMoeLayer(i)) {
      // The per-expert names of published checkpoints.
      const engine::ExpertTensorNames names(config, i);
      const int64_t expert_inter = config.moe_intermediate_size;
      matrix(names.router(), config.num_experts, hidden);
      for (int64_t e = 0; e < config.num_experts; ++e) {
        projection(names.gate(e), expert_inter, hidden);
        projection(names.up(e), expert_inter, hidden);
        projection(names.down(e), hidden, expert_inter);
      }
      // Sigmoid routing's correction bias, of a size that moves some
      // choices (the scores of these routers spread over about 0.3 to
      // 0.7), and the shared experts.
      if (config.sigmoid_routing) vector(names.correctionBias(), config.num_experts, 0.0f, 0.25f);
      if (config.sharedExpertWidth() > 0) {
        const int64_t width = config.sharedExpertWidth();
        projection(names.shared("gate_proj"), width, hidden);
        projection(names.shared("up_proj"), width, hidden);
        projection(names.shared("down_proj"), hidden, width);
        if (config.qwen2Moe()) matrix(names.sharedGate(), 1, hidden);
      }
    } else if (config.fusedGateUp()) {
      projection(prefix + "mlp.gate_up_proj.weight", 2 * inter, hidden);
      projection(prefix + "mlp.down_proj.weight", hidden, inter);
    } else {
      projection(prefix + "mlp.gate_proj.weight", inter, hidden);
      projection(prefix + "mlp.up_proj.weight", inter, hidden);
      projection(prefix + "mlp.down_proj.weight", hidden, inter);
    }
    if (kv_cache_scales) {
      SplitMix64 rng(fnv1a(prefix + "kv_cache_scales") ^ (seed * 0x9e3779b97f4a7c15ull));
      for (const char* name : {"self_attn.k_scale", "self_attn.v_scale"}) {
        const float unit = static_cast<float>(rng.next() >> 40) * 0x1p-24f;
        scalars[prefix + name] = 6.0f / 448.0f * (1.0f + unit);
      }
    }
    // Gemma's norm weights are offsets from 1.
    const float norm_center = config.gemma ? 0.0f : 1.0f;
    if (!config.olmo2) vector(prefix + "input_layernorm.weight", hidden, norm_center, kNormNoise);
    vector(prefix + "post_attention_layernorm.weight", hidden, norm_center, kNormNoise);
    if (config.glm4) {
      vector(prefix + "post_self_attn_layernorm.weight", hidden, norm_center, kNormNoise);
      vector(prefix + "post_mlp_layernorm.weight", hidden, norm_center, kNormNoise);
    }
    if (config.olmo2) {
      vector(prefix + "post_feedforward_layernorm.weight", hidden, norm_center, kNormNoise);
    }
    if (config.gemma) {
      vector(prefix + "pre_feedforward_layernorm.weight", hidden, norm_center, kNormNoise);
      vector(prefix + "post_feedforward_layernorm.weight", hidden, norm_center, kNormNoise);
    }
  }
  vector("model.norm.weight", hidden, config.gemma ? 0.0f : 1.0f, kNormNoise);
  if (!config.tie_word_embeddings) {
    // Zero rows give a logit of 0, below the best of hundreds of random
    // logits. They go to the special tokens, to ids past the tokenizer's
    // vocabulary and to tokens that are not text on their own (a lone byte of
    // a multi-byte character, a control character), so greedy decoding emits
    // readable text and runs to max_tokens.
    matrix("lm_head.weight", config.vocab_size, hidden);
    tensors["lm_head.weight"].zero_row = [&tokens](int64_t id) {
      return static_cast<size_t>(id) >= tokens.size() ||
             !isPlainText(tokens[static_cast<size_t>(id)]);
    };
  }
  writeSafetensorsStreaming(tensors, dtype, seed, path, config.quantization, scalars);
}

}  // namespace

engine::Fp8Quantization parseQuantizationSpec(const std::string& spec) {
  using Granularity = engine::Fp8Quantization::Granularity;
  const std::string accepted =
      " (accepted: fp8, fp8:tensor, fp8:block[=RxC], compressed-tensors, "
      "compressed-tensors:tensor|channel|block[=RxC], mxfp4)";
  const size_t colon = spec.find(':');
  engine::Fp8Quantization q;
  if (spec == "mxfp4") {
    q.method = spec;
    return q;
  }
  q.method = spec.substr(0, colon);
  std::string granularity = colon == std::string::npos ? (q.method == "fp8" ? "block" : "channel")
                                                       : spec.substr(colon + 1);
  q.block_rows = 128;
  q.block_cols = 128;
  const size_t equals = granularity.find('=');
  if (equals != std::string::npos) {
    long long rows = 0, cols = 0;
    char tail = 0;
    if (std::sscanf(granularity.c_str() + equals + 1, "%lldx%lld%c", &rows, &cols, &tail) != 2 ||
        rows <= 0 || cols <= 0 || rows > (1 << 20) || cols > (1 << 20)) {
      throw Error("quantization \"" + spec + "\": block size must be RxC" + accepted);
    }
    q.block_rows = rows;
    q.block_cols = cols;
    granularity.resize(equals);
    if (granularity != "block") throw Error("quantization \"" + spec + "\"" + accepted);
  }
  if (granularity == "tensor") {
    q.granularity = Granularity::kTensor;
  } else if (granularity == "channel" && q.method == "compressed-tensors") {
    q.granularity = Granularity::kChannel;
  } else if (granularity == "block") {
    q.granularity = Granularity::kBlock;
  } else {
    throw Error("quantization \"" + spec + "\"" + accepted);
  }
  if (q.method != "fp8" && q.method != "compressed-tensors") {
    throw Error("quantization \"" + spec + "\"" + accepted);
  }
  if (q.granularity != Granularity::kBlock) q.block_rows = q.block_cols = 0;
  return q;
}

std::vector<std::string> presetNames() { return {"tiny", "small", "llama3-8b"}; }

engine::ModelConfig presetConfig(const std::string& preset, const std::string& architecture) {
  ModelConfig config = baseConfig(preset, architecture);
  setTokenIds(config, trainTokenizer(config.vocab_size));
  return config;
}

void writeTestModel(const TestModelOptions& options, const std::filesystem::path& out_dir) {
  ModelConfig config = baseConfig(options.preset, options.architecture);
  config.torch_dtype = options.dtype;
  config.quantization = options.quantization;
  if (config.mxfp4() && !config.gptOss()) {
    throw Error("test model: mxfp4 weights are GptOssForCausalLM's experts only");
  }
  if (config.quantized() && config.gptOss()) {
    throw Error("test model: fp8 weights are not written for GptOssForCausalLM (accepted: mxfp4)");
  }
  if (options.phi4_rotary) {
    if (!config.phi3) throw Error("test model: Phi-4's rotary embedding is Phi3ForCausalLM's");
    config.rotary_dim = config.head_dim;
    config.rope_scaling = RopeScaling{};
    config.sliding_window = 0;
    config.sliding_layers.clear();
  }
  if (options.yarn) {
    config.rope_scaling = yarnOver(config, 4.0);
    // Ministral 3's query scale shares YaRN's original context.
    if (config.llama4_scaling_beta > 0) {
      config.llama4_scaling_original = config.rope_scaling.original_max_position_embeddings;
    }
  }
  if (options.layers < 0) throw Error("test model: layers must be positive (0: the preset's)");
  if (options.layers > 0) {
    config.num_hidden_layers = options.layers;
    if (config.gemma || config.gptOss()) {
      config.sliding_layers = everyOtherLayer(options.layers);
    } else if (config.olmo3) {
      config.sliding_layers = olmo3SlidingLayers(options.layers, options.preset);
    } else if (!config.sliding_layers.empty()) {
      config.sliding_layers.assign(static_cast<size_t>(options.layers), true);
    }
    if (!config.nope_layers.empty()) {
      config.nope_layers = smolLm3NopeLayers(options.layers, options.preset);
    }
  }
  const TrainedTokenizer tokenizer = trainTokenizer(config.vocab_size);
  setTokenIds(config, tokenizer);

  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error || !fs::is_directory(out_dir)) {
    throw Error(out_dir.string() + ": cannot create the model directory" +
                (error ? ": " + error.message() : std::string()));
  }
  writeFile(out_dir / "config.json", config.toJsonText());
  writeFile(out_dir / "generation_config.json", generationConfigJson(tokenizer, config));
  writeFile(out_dir / "tokenizer.json", tokenizerJson(tokenizer));
  writeFile(out_dir / "tokenizer_config.json", tokenizerConfigJson(tokenizer, config));
  writeWeights(config, options.dtype, options.seed, tokenizer.bpe.tokens, options.kv_cache_scales,
               out_dir / "model.safetensors");
}

void writeTestLoraAdapter(const TestLoraOptions& options, const engine::ModelConfig& base,
                          const std::filesystem::path& out_dir) {
  if (options.rank <= 0) throw Error("test LoRA adapter: rank must be positive");
  const std::vector<std::string> all = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
  std::vector<std::string> modules = options.modules.empty() ? all : options.modules;
  if (base.fusedQkv() || base.fusedGateUp()) {
    // Phi-3's checkpoints fuse q/k/v and gate/up, GLM's gate/up, and so do
    // PEFT's adapters of them: a module of a fused one adapts all of it.
    std::vector<std::string> fused;
    for (const std::string& module : modules) {
      const bool qkv = module == "q_proj" || module == "k_proj" || module == "v_proj";
      const bool gate_up = module == "gate_proj" || module == "up_proj";
      const std::string name = qkv && base.fusedQkv()          ? "qkv_proj"
                               : gate_up && base.fusedGateUp() ? "gate_up_proj"
                                                               : module;
      if (std::find(fused.begin(), fused.end(), name) == fused.end()) fused.push_back(name);
    }
    modules = fused;
  }
  const int64_t hidden = base.hidden_size;
  const int64_t q_size = base.num_attention_heads * base.head_dim;
  const int64_t kv_size = base.num_key_value_heads * base.head_dim;
  const int64_t inter = base.intermediate_size;
  // in, out and the PEFT path of each module.
  auto shape = [&](const std::string& module) -> std::tuple<int64_t, int64_t, std::string> {
    if (module == "q_proj") return {hidden, q_size, "self_attn."};
    if (module == "k_proj" || module == "v_proj") return {hidden, kv_size, "self_attn."};
    if (module == "o_proj") return {q_size, hidden, "self_attn."};
    if (module == "gate_proj" || module == "up_proj") return {hidden, inter, "mlp."};
    if (module == "down_proj") return {inter, hidden, "mlp."};
    if (module == "qkv_proj") return {hidden, q_size + 2 * kv_size, "self_attn."};
    if (module == "gate_up_proj") return {hidden, 2 * inter, "mlp."};
    throw Error("test LoRA adapter: unknown module " + module +
                " (accepted: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  };
  const double scale =
      options.alpha / (options.rslora ? std::sqrt(static_cast<double>(options.rank))
                                      : static_cast<double>(options.rank));
  std::map<std::string, TensorSpec> tensors;
  for (int64_t layer = 0; layer < base.num_hidden_layers; ++layer) {
    for (const std::string& module : modules) {
      const auto [in, out, path] = shape(module);
      // The default set skips a mixture layer's MLP, which the agent
      // refuses (its experts are not adapted); named, it is written.
      if (options.modules.empty() && path == "mlp." && base.isMoeLayer(layer)) continue;
      const std::string prefix =
          "base_model.model.model.layers." + std::to_string(layer) + "." + path + module + ".";
      // A x has the scale of one of x's entries (A's rows as a projection's);
      // B then gives each output `strength` times that, after the scale.
      tensors[prefix + "lora_A.weight"] = {
          {options.rank, in}, 0.0f, std::sqrt(3.0f / static_cast<float>(in)), {}};
      tensors[prefix + "lora_B.weight"] = {
          {out, options.rank},
          0.0f,
          static_cast<float>(options.strength * std::sqrt(3.0 / static_cast<double>(options.rank)) /
                             scale),
          {}};
    }
  }
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error || !fs::is_directory(out_dir)) {
    throw Error(out_dir.string() + ": cannot create the adapter directory" +
                (error ? ": " + error.message() : std::string()));
  }
  nlohmann::ordered_json config = {
      {"base_model_name_or_path", nullptr},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"lora_alpha", options.alpha},
      {"lora_dropout", 0.0},
      {"modules_to_save", nullptr},
      {"peft_type", "LORA"},
      {"r", options.rank},
      {"target_modules", modules},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", options.rslora},
  };
  writeFile(out_dir / "adapter_config.json", config.dump(2) + "\n");
  writeSafetensorsStreaming(tensors, options.dtype, options.seed,
                            out_dir / "adapter_model.safetensors");
}

}  // namespace tandem::tools
