// Exactness of the forward pass: chunked vs one-shot prefill, alone vs
// batched, contiguous vs scattered blocks are bit-identical in logits and KV
// bytes; and the logits match a plain dense forward pass written here.
#include "agent/engine/model_runner.h"

#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/lora.h"
#include "agent/engine/model.h"
#include "agent/engine/safetensors.h"
#include "common/dtype.h"
#include "common/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels.h"
#include "kernels/profiling_backend.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::engine {
namespace {

// The compute backend the runners here use, multiplying in `compute`.
kernels::Backend& cpuBackend(DType compute = DType::kF32) {
  static kernels::cpu::CpuBackend exact;
  static kernels::cpu::CpuBackend bf16 = [] {
    kernels::cpu::CpuBackend backend;
    backend.setComputeDType(DType::kBF16);
    return backend;
  }();
  return compute == DType::kBF16 ? bf16 : exact;
}

namespace fs = std::filesystem;

struct Variant {
  std::string architecture;
  DType weight_dtype;
  DType kv_dtype;
  DType compute_dtype = DType::kF32;
  // fp8 projections (tools::parseQuantizationSpec); "" for none.
  std::string quantization = "";
  // The checkpoint's fp8 KV cache scales (tools::TestModelOptions).
  bool kv_cache_scales = false;
};

std::string variantName(const Variant& v) {
  std::string arch = v.architecture.substr(0, v.architecture.find("For"));
  std::string quantization;
  for (char c : v.quantization)
    quantization += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return arch + "_w" + dtypeShortName(v.weight_dtype) + "_kv" + dtypeShortName(v.kv_dtype) +
         (v.compute_dtype == DType::kF32
              ? ""
              : std::string("_compute") + dtypeShortName(v.compute_dtype)) +
         (quantization.empty() ? "" : "_" + quantization) +
         (v.kv_cache_scales ? "_kv_cache_scales" : "");
}

// One generated tiny model per (architecture, weight dtype, quantization),
// shared by tests.
const Model& tinyModel(const std::string& architecture, DType weight_dtype,
                       const std::string& quantization = "", bool kv_cache_scales = false) {
  // Removed when the test process exits.
  static std::vector<std::unique_ptr<::tandem::testing::TempDir>> temp_dirs;
  static std::map<std::string, std::unique_ptr<Model>> models;
  std::string key = architecture + dtypeShortName(weight_dtype) + quantization +
                    (kv_cache_scales ? "+kv_cache_scales" : "");
  auto it = models.find(key);
  if (it != models.end()) return *it->second;
  temp_dirs.push_back(std::make_unique<::tandem::testing::TempDir>("tandem-runner-test"));
  const fs::path dir = temp_dirs.back()->path();
  tools::TestModelOptions options;
  options.preset = "tiny";
  options.architecture = architecture;
  options.dtype = weight_dtype;
  options.seed = 11;
  if (!quantization.empty()) options.quantization = tools::parseQuantizationSpec(quantization);
  options.kv_cache_scales = kv_cache_scales;
  tools::writeTestModel(options, dir);
  auto model = Model::load(dir);
  const Model& ref = *model;
  models.emplace(key, std::move(model));
  return ref;
}

KvCacheConfig cacheConfigFor(const Model& model, DType kv_dtype, int64_t num_blocks) {
  KvCacheConfig config = KvCacheConfig::forModel(model, kv_dtype, 16);
  config.num_blocks = num_blocks;
  return config;
}

std::vector<TokenId> randomTokens(size_t n, int64_t vocab, uint32_t seed) {
  return ::tandem::testing::randomTokenIds(n, seed, 0, static_cast<TokenId>(vocab - 1));
}

std::vector<BlockId> iotaBlocks(int64_t n, BlockId first = 0) {
  std::vector<BlockId> blocks(n);
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

// Runs `tokens` through the runner in chunks of `chunk` tokens (0: one shot)
// and returns the logits after the last chunk.
std::vector<float> prefillInChunks(ModelRunner& runner, const std::vector<TokenId>& tokens,
                                   const std::vector<BlockId>& blocks, int64_t chunk,
                                   int32_t adapter = -1) {
  std::vector<float> logits;
  const auto n = static_cast<int64_t>(tokens.size());
  if (chunk <= 0) chunk = n;
  for (int64_t start = 0; start < n; start += chunk) {
    SequenceInput input;
    input.tokens = std::span<const TokenId>(tokens).subspan(start, std::min(chunk, n - start));
    input.start_position = start;
    input.block_table = blocks;
    input.adapter = adapter;
    runner.forward({&input, 1}, logits);
  }
  return logits;
}

// Two LoRA adapters for a tiny model, written once per model: "all" adapts
// every projection (rank 8, lora_alpha 16: scale 2, f32 matrices); "qv" only
// q and v (rank 4, rslora, lora_alpha 6: scale 3, not a power of two, bf16
// matrices).
struct TinyAdapter {
  fs::path dir;
  double scale = 1.0;
  std::unique_ptr<LoraAdapter> adapter;
};
const TinyAdapter& tinyAdapter(const Model& model, const std::string& kind) {
  static std::vector<std::unique_ptr<::tandem::testing::TempDir>> temp_dirs;
  static std::map<std::pair<const Model*, std::string>, TinyAdapter> adapters;
  auto it = adapters.find({&model, kind});
  if (it != adapters.end()) return it->second;
  temp_dirs.push_back(std::make_unique<::tandem::testing::TempDir>("tandem-runner-lora"));
  tools::TestLoraOptions options;
  if (model.config().num_experts > 0) {
    // Adapters reach a mixture layer's attention only (docs/lora.md).
    options.modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  }
  if (kind == "qv") {
    options.rank = 4;
    options.alpha = 6.0;
    options.rslora = true;
    options.dtype = DType::kBF16;
    options.modules = {"q_proj", "v_proj"};
    options.seed = 7;
  }
  TinyAdapter entry;
  entry.dir = temp_dirs.back()->path();
  entry.scale = options.rslora ? options.alpha / std::sqrt(static_cast<double>(options.rank))
                               : options.alpha / static_cast<double>(options.rank);
  tools::writeTestLoraAdapter(options, model.config(), entry.dir);
  entry.adapter = LoraAdapter::load(kind, entry.dir, model.config());
  return adapters.emplace(std::make_pair(&model, kind), std::move(entry)).first->second;
}

// KV bytes of a sequence's logical blocks, gathered in table order.
std::vector<uint8_t> sequenceKvBytes(const KvCache& cache, const std::vector<BlockId>& blocks,
                                     int64_t num_blocks) {
  std::vector<uint8_t> bytes;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* data = cache.blockData(blocks[b]);
    bytes.insert(bytes.end(), data, data + cache.blockBytes());
  }
  return bytes;
}

bool bitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- Plain dense reference forward pass (double accumulation) ----------------

std::vector<float> toFloat(const kernels::WeightView& view) {
  std::vector<float> out(static_cast<size_t>(view.rows * view.cols));
  if (view.layout == kernels::WeightLayout::kMxfp4) {
    for (int64_t r = 0; r < view.rows; ++r) {
      for (int64_t c = 0; c < view.cols; ++c) {
        out[static_cast<size_t>(r * view.cols + c)] = kernels::mxfp4Value(view, r, c);
      }
    }
    return out;
  }
  convertToF32(view.dtype, view.data, out.data(), out.size());
  return out;
}

// The values a matrix stands for: an fp8 one's times their scales.
std::vector<double> matrixValues(const kernels::WeightView& view) {
  const std::vector<float> w = toFloat(view);
  std::vector<double> values(w.begin(), w.end());
  if (view.scales != nullptr) {
    for (int64_t r = 0; r < view.rows; ++r) {
      for (int64_t c = 0; c < view.cols; ++c) {
        values[static_cast<size_t>(r * view.cols + c)] *= view.scaleAt(r, c);
      }
    }
  }
  return values;
}

// y[n] = W[n, k] x[k]
std::vector<double> denseMatVec(const kernels::WeightView& view, const std::vector<double>& x) {
  const std::vector<double> w = matrixValues(view);
  std::vector<double> y(view.rows, 0.0);
  for (int64_t r = 0; r < view.rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < view.cols; ++c) sum += w[r * view.cols + c] * x[c];
    y[r] = sum;
  }
  return y;
}

void denseRmsNorm(std::vector<double>& x, size_t offset, size_t dim, const std::vector<float>& w,
                  double eps) {
  double sum = 0.0;
  for (size_t i = 0; i < dim; ++i) sum += x[offset + i] * x[offset + i];
  double scale = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
  for (size_t i = 0; i < dim; ++i) x[offset + i] = x[offset + i] * scale * w[i];
}

// Rotates the first rotary_dim values of each head (0: all of it), cos and
// sin times `factor` (Phi-3's partial rotary dims and LongRoPE).
// interleaved: GLM's pairs (2i, 2i + 1) instead of (i, i + half).
void denseRope(std::vector<double>& x, int64_t heads, int64_t head_dim, int64_t position,
               const std::vector<float>& inv_freq, int64_t rotary_dim = 0, double factor = 1.0,
               bool interleaved = false) {
  const int64_t half = (rotary_dim > 0 ? rotary_dim : head_dim) / 2;
  for (int64_t h = 0; h < heads; ++h) {
    double* v = x.data() + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      float angle = static_cast<float>(position) * inv_freq[i];
      double c = std::cos(static_cast<double>(angle)) * factor;
      double s = std::sin(static_cast<double>(angle)) * factor;
      double& first = v[interleaved ? 2 * i : i];
      double& second = v[interleaved ? 2 * i + 1 : i + half];
      const double a = first, b = second;
      first = a * c - b * s;
      second = b * c + a * s;
    }
  }
}

void addBias(std::vector<double>& y, const std::vector<float>& bias) {
  for (size_t i = 0; i < bias.size(); ++i) y[i] += bias[i];
}

// A LoRA adapter as the reference applies it, read here from the PEFT files
// themselves: [layer][module] A (rank x in) and B (out x rank) as written,
// and the scale from the adapter's r and lora_alpha.
struct DenseLora {
  struct Pair {
    std::vector<float> a, b;
    int64_t rank = 0, in = 0;
  };
  std::vector<std::array<Pair, kLoraModules>> layers;
  double scale = 1.0;
};

DenseLora readDenseLora(const fs::path& dir, const ModelConfig& config, double scale) {
  SafetensorsFile file(dir / "adapter_model.safetensors");
  DenseLora lora;
  lora.scale = scale;
  lora.layers.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string layer = "base_model.model.model.layers." + std::to_string(l) + ".";
    for (int m = 0; m < kLoraModules; ++m) {
      const std::string prefix = layer + kLoraModuleNames[static_cast<size_t>(m)];
      const TensorInfo* a = file.find(prefix + ".lora_A.weight");
      const TensorInfo* b = file.find(prefix + ".lora_B.weight");
      if (a == nullptr || b == nullptr) continue;
      DenseLora::Pair& pair = lora.layers[static_cast<size_t>(l)][static_cast<size_t>(m)];
      pair.rank = a->shape[0];
      pair.in = a->shape[1];
      pair.a = toFloat({a->data, a->dtype, a->shape[0], a->shape[1]});
      pair.b = toFloat({b->data, b->dtype, b->shape[0], b->shape[1]});
    }
    // Fused modules (Phi-3's q/k/v and gate/up, GLM's gate/up): one A, B's rows
    // q, k, v (gate, up) in turn.
    const int64_t q = config.num_attention_heads * config.head_dim;
    const int64_t kv = config.num_key_value_heads * config.head_dim;
    const int64_t inter = config.intermediate_size;
    const std::pair<const char*, std::vector<std::pair<int, int64_t>>> fused[] = {
        {"self_attn.qkv_proj", {{kLoraQ, q}, {kLoraK, kv}, {kLoraV, kv}}},
        {"mlp.gate_up_proj", {{kLoraGate, inter}, {kLoraUp, inter}}}};
    for (const auto& [name, parts] : fused) {
      const TensorInfo* a = file.find(layer + name + ".lora_A.weight");
      const TensorInfo* b = file.find(layer + name + ".lora_B.weight");
      if (a == nullptr || b == nullptr) continue;
      const std::vector<float> all_b = toFloat({b->data, b->dtype, b->shape[0], b->shape[1]});
      int64_t row = 0;
      for (const auto& [module, rows] : parts) {
        DenseLora::Pair& pair = lora.layers[static_cast<size_t>(l)][static_cast<size_t>(module)];
        pair.rank = a->shape[0];
        pair.in = a->shape[1];
        pair.a = toFloat({a->data, a->dtype, a->shape[0], a->shape[1]});
        pair.b.assign(all_b.begin() + row * pair.rank, all_b.begin() + (row + rows) * pair.rank);
        row += rows;
      }
    }
  }
  return lora;
}

// y += scale * B (A x) for module m of layer l, when the adapter adapts it.
void addDenseLora(const DenseLora* lora, int64_t l, int m, const std::vector<double>& x,
                  std::vector<double>& y) {
  if (lora == nullptr) return;
  const DenseLora::Pair& pair = lora->layers[static_cast<size_t>(l)][static_cast<size_t>(m)];
  if (pair.rank == 0) return;
  std::vector<double> down(static_cast<size_t>(pair.rank), 0.0);
  for (int64_t r = 0; r < pair.rank; ++r) {
    for (int64_t c = 0; c < pair.in; ++c)
      down[r] += static_cast<double>(pair.a[r * pair.in + c]) * x[c];
  }
  for (size_t o = 0; o < y.size(); ++o) {
    double sum = 0.0;
    for (int64_t r = 0; r < pair.rank; ++r)
      sum += static_cast<double>(pair.b[o * pair.rank + r]) * down[r];
    y[o] += lora->scale * sum;
  }
}

// What the reference's mixture layers chose: the narrowest gap between a
// token's last chosen and first unchosen router logit (a gap near the
// rounding of the engine's f32 logits could choose otherwise), and every
// expert chosen.
struct DenseRouting {
  double narrowest_gap = 1e300;
  std::set<int64_t> experts_used;
};

// K and V as an fp8 KV cache holds them: each value over its layer's scale
// (Model::kvCacheScales, 1 without), rounded to e4m3, times the scale.
void roundAsFp8Cache(std::vector<double>& values, float scale) {
  for (double& value : values) {
    value = double{f8e4m3ToF32(f32ToF8e4m3(static_cast<float>(value) / scale))} * scale;
  }
}

// Logits of the last token of `tokens`, computed densely over the whole
// prompt; with `lora`, each adapted projection adds its delta; with an fp8
// `kv_dtype`, K and V are rounded as the cache rounds them.
std::vector<double> denseLogits(const Model& model, const std::vector<TokenId>& tokens,
                                const DenseLora* lora = nullptr, DenseRouting* routing = nullptr,
                                DType kv_dtype = DType::kF32) {
  const std::vector<float> kv_scales = model.kvCacheScales();
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = c.hidden_size, hd = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t group = nh / nkv;
  const std::vector<float> global_inv_freq = ropeInverseFrequencies(c);
  const std::vector<float> local_inv_freq = localRopeInverseFrequencies(c);
  std::vector<float> embed = toFloat(w.embed_tokens);
  // Gemma 3 (transformers' Gemma3ForCausalLM): the embedding times
  // sqrt(hidden_size), both in the table's dtype; queries scaled by
  // query_pre_attn_scalar; sliding layers; sandwich norms (the loaded norm
  // weights are already 1 + w); GELU (tanh).
  auto inDType = [&](double value) {
    const auto f = static_cast<float>(value);
    if (w.embed_tokens.dtype == DType::kF32) return static_cast<double>(f);
    uint16_t bits = 0;
    convertFromF32(w.embed_tokens.dtype, &f, &bits, 1);
    float back = 0.0f;
    convertToF32(w.embed_tokens.dtype, &bits, &back, 1);
    return static_cast<double>(back);
  };
  // Granite: the embedding times its multiplier (the product in the
  // table's dtype), scores by attention_multiplier, residual branches times
  // residual_multiplier, logits over logits_scaling.
  const double embed_scale = c.gemma ? inDType(std::sqrt(static_cast<double>(c.hidden_size)))
                             : c.granite
                                 ? static_cast<double>(static_cast<float>(c.embedding_multiplier))
                                 : 1.0;
  const double score_scale =
      c.granite ? c.attention_multiplier
                : 1.0 / std::sqrt(c.gemma ? c.query_pre_attn_scalar : static_cast<double>(hd));
  const double residual = c.granite ? c.residual_multiplier : 1.0;

  std::vector<std::vector<double>> x(n, std::vector<double>(hidden));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < hidden; ++i) {
      x[t][i] = embed[tokens[t] * hidden + i];
      if (c.gemma || c.granite) x[t][i] = inDType(x[t][i] * embed_scale);
    }
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    // Gemma's and OLMo 3's sliding layers: their own frequencies, no
    // attention factor.
    const std::vector<float>& inv_freq = c.localRopeLayer(l) ? local_inv_freq : global_inv_freq;
    const double rope_factor = c.localRopeLayer(l) ? 1.0 : c.ropeAttentionFactor();
    const int64_t window = c.slidingLayer(l) ? c.sliding_window : 0;
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      // OLMo 2: no norm before attention; q and k normed across heads.
      std::vector<double> h = x[t];
      if (!c.olmo2) denseRmsNorm(h, 0, hidden, lw.input_layernorm, c.rms_norm_eps);
      q[t] = denseMatVec(lw.q_proj, h);
      k[t] = denseMatVec(lw.k_proj, h);
      v[t] = denseMatVec(lw.v_proj, h);
      addDenseLora(lora, l, kLoraQ, h, q[t]);
      addDenseLora(lora, l, kLoraK, h, k[t]);
      addDenseLora(lora, l, kLoraV, h, v[t]);
      addBias(q[t], lw.q_bias);
      addBias(k[t], lw.k_bias);
      addBias(v[t], lw.v_bias);
      if (c.fullQkNorm()) {
        denseRmsNorm(q[t], 0, nh * hd, lw.q_norm, c.rms_norm_eps);
        denseRmsNorm(k[t], 0, nkv * hd, lw.k_norm, c.rms_norm_eps);
      } else if (!lw.q_norm.empty()) {
        for (int64_t hh = 0; hh < nh; ++hh)
          denseRmsNorm(q[t], hh * hd, hd, lw.q_norm, c.rms_norm_eps);
        for (int64_t hh = 0; hh < nkv; ++hh)
          denseRmsNorm(k[t], hh * hd, hd, lw.k_norm, c.rms_norm_eps);
      }
      if (!c.nopeLayer(l)) {  // SmolLM3's NoPE layers leave q and k as they are
        denseRope(q[t], nh, hd, t, inv_freq, c.rotary_dim, rope_factor, c.glm);
        denseRope(k[t], nkv, hd, t, inv_freq, c.rotary_dim, rope_factor, c.glm);
      }
      // Ministral 3: the rotated queries times the position's scale.
      for (double& value : q[t]) value *= c.queryScale(t);
      if (kv_dtype == DType::kF8E4M3) {
        roundAsFp8Cache(k[t], kv_scales.empty() ? 1.0f : kv_scales[2 * l]);
        roundAsFp8Cache(v[t], kv_scales.empty() ? 1.0f : kv_scales[2 * l + 1]);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attn(nh * hd, 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t kvh = hh / group;
        const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        std::vector<double> scores(t + 1 - first);
        double max_score = -1e300;
        for (int64_t s = first; s <= t; ++s) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += q[t][hh * hd + d] * k[s][kvh * hd + d];
          scores[s - first] = dot * score_scale;
          if (c.attn_logit_softcapping > 0) {
            scores[s - first] =
                std::tanh(scores[s - first] / c.attn_logit_softcapping) * c.attn_logit_softcapping;
          }
          max_score = std::max(max_score, scores[s - first]);
        }
        // GPT-OSS's sink: one more softmax term that weighs no value.
        if (!lw.sinks.empty()) max_score = std::max(max_score, double{lw.sinks[hh]});
        double sum = 0.0;
        for (double& s : scores) sum += (s = std::exp(s - max_score));
        if (!lw.sinks.empty()) sum += std::exp(lw.sinks[hh] - max_score);
        for (int64_t s = first; s <= t; ++s) {
          for (int64_t d = 0; d < hd; ++d)
            attn[hh * hd + d] += scores[s - first] / sum * v[s][kvh * hd + d];
        }
      }
      std::vector<double> o = denseMatVec(lw.o_proj, attn);
      addDenseLora(lora, l, kLoraO, attn, o);
      addBias(o, lw.o_bias);
      if (c.sandwichNorms()) {
        denseRmsNorm(o, 0, hidden, lw.post_attention_layernorm, c.rms_norm_eps);
        for (int64_t i = 0; i < hidden; ++i) x[t][i] += o[i];
        std::vector<double> h = x[t];
        if (c.preFeedforwardNorm()) {
          denseRmsNorm(h, 0, hidden, lw.pre_feedforward_layernorm, c.rms_norm_eps);
        }
        std::vector<double> gate = denseMatVec(lw.gate_proj, h);
        std::vector<double> up = denseMatVec(lw.up_proj, h);
        addDenseLora(lora, l, kLoraGate, h, gate);
        addDenseLora(lora, l, kLoraUp, h, up);
        const double beta = std::sqrt(2.0 / std::acos(-1.0));
        for (size_t i = 0; i < gate.size(); ++i) {
          const double g = gate[i];
          gate[i] = c.gemma ? 0.5 * g * (1.0 + std::tanh(beta * (g + 0.044715 * g * g * g))) * up[i]
                            : g / (1.0 + std::exp(-g)) * up[i];  // OLMo 2, GLM-4: SiLU
        }
        std::vector<double> down = denseMatVec(lw.down_proj, gate);
        addDenseLora(lora, l, kLoraDown, gate, down);
        denseRmsNorm(down, 0, hidden, lw.post_feedforward_layernorm, c.rms_norm_eps);
        for (int64_t i = 0; i < hidden; ++i) x[t][i] += down[i];
        continue;
      }
      for (int64_t i = 0; i < hidden; ++i) x[t][i] += o[i] * residual;
      std::vector<double> h = x[t];
      denseRmsNorm(h, 0, hidden, lw.post_attention_layernorm, c.rms_norm_eps);
      if (!lw.experts.empty()) {
        // transformers' sparse MoE block: softmax over the router's
        // logits, the top num_experts_per_tok, renormalized when
        // norm_topk_prob, each expert's MLP weighted and summed. GLM-4.5
        // (Glm4MoeForCausalLM, DeepSeek-V3's routing): the router's
        // sigmoids plus the correction bias rank the experts within the
        // topk_group best of n_group groups (a group ranked by its two best
        // ranks summed), weighted by their sigmoids (renormalized with
        // norm_topk_prob, sum + 1e-20) times routed_scaling_factor; the
        // shared experts' MLP added.
        // GPT-OSS: the router's bias on its logits (the softmax over the
        // chosen ones is the renormalized one), experts with biases and
        // the clamped activation.
        std::vector<double> logits = denseMatVec(lw.router, h);
        addBias(logits, lw.router_logit_bias);
        const int64_t n_experts = c.num_experts;
        std::vector<double> rank = logits, probability(logits.size());
        if (c.sigmoid_routing) {
          for (int64_t e = 0; e < n_experts; ++e) {
            probability[e] = 1.0 / (1.0 + std::exp(-logits[e]));
            rank[e] = probability[e] + lw.router_bias[e];
          }
        } else {
          const double max = *std::max_element(logits.begin(), logits.end());
          double total = 0.0;
          for (double logit : logits) total += std::exp(logit - max);
          for (int64_t e = 0; e < n_experts; ++e)
            probability[e] = std::exp(logits[e] - max) / total;
        }
        auto descending = [](const std::vector<double>& values) {
          std::vector<int64_t> order(values.size());
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int64_t a, int64_t b) { return values[a] > values[b]; });
          return order;
        };
        double gap = 1e300;
        int64_t candidates = n_experts;
        if (c.n_group > 1) {
          const int64_t size = n_experts / c.n_group;
          std::vector<double> group_rank(c.n_group);
          for (int64_t g = 0; g < c.n_group; ++g) {
            std::vector<double> members(rank.begin() + g * size, rank.begin() + (g + 1) * size);
            std::sort(members.rbegin(), members.rend());
            group_rank[g] = members[0] + members[1];
          }
          const std::vector<int64_t> groups = descending(group_rank);
          if (c.topk_group < c.n_group) {
            gap = group_rank[groups[c.topk_group - 1]] - group_rank[groups[c.topk_group]];
          }
          for (int64_t g = c.topk_group; g < c.n_group; ++g) {
            for (int64_t e = groups[g] * size; e < (groups[g] + 1) * size; ++e) rank[e] = -1e300;
          }
          candidates = c.topk_group * size;
        }
        const std::vector<int64_t> order = descending(rank);
        const int64_t k = c.num_experts_per_tok;
        if (k < candidates) gap = std::min(gap, rank[order[k - 1]] - rank[order[k]]);
        if (routing != nullptr) {
          routing->narrowest_gap = std::min(routing->narrowest_gap, gap);
          for (int64_t j = 0; j < k; ++j) routing->experts_used.insert(order[j]);
        }
        double chosen = 0.0;
        for (int64_t j = 0; j < k; ++j) chosen += probability[order[j]];
        auto swiglu = [&](const ExpertWeights& expert) {
          std::vector<double> gate = denseMatVec(expert.gate_proj, h);
          std::vector<double> up = denseMatVec(expert.up_proj, h);
          addBias(gate, expert.gate_bias);
          addBias(up, expert.up_bias);
          const double limit = c.swiglu_limit;
          for (size_t i = 0; i < gate.size(); ++i) {
            if (c.gptOss()) {
              const double g = std::min(gate[i], limit);
              gate[i] = (std::clamp(up[i], -limit, limit) + 1.0) * g / (1.0 + std::exp(-1.702 * g));
            } else {
              gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
            }
          }
          std::vector<double> down = denseMatVec(expert.down_proj, gate);
          addBias(down, expert.down_bias);
          return down;
        };
        for (int64_t j = 0; j < k; ++j) {
          double weight = probability[order[j]];
          if (c.norm_topk_prob) weight /= chosen + (c.sigmoid_routing ? 1e-20 : 0.0);
          weight *= c.routed_scaling_factor;
          const std::vector<double> down = swiglu(lw.experts[order[j]]);
          // Granite MoE: the mixture's output times residual_multiplier.
          for (int64_t i = 0; i < hidden; ++i) x[t][i] += residual * weight * down[i];
        }
        if (lw.shared_expert.gate_proj.data != nullptr) {
          // Qwen2-MoE weighs its shared expert by sigmoid(shared_expert_gate h).
          const std::vector<double> down = swiglu(lw.shared_expert);
          const double weight =
              lw.shared_expert_gate.data == nullptr
                  ? 1.0
                  : 1.0 / (1.0 + std::exp(-denseMatVec(lw.shared_expert_gate, h)[0]));
          for (int64_t i = 0; i < hidden; ++i) x[t][i] += weight * down[i];
        }
        continue;
      }
      std::vector<double> gate = denseMatVec(lw.gate_proj, h);
      std::vector<double> up = denseMatVec(lw.up_proj, h);
      addDenseLora(lora, l, kLoraGate, h, gate);
      addDenseLora(lora, l, kLoraUp, h, up);
      for (size_t i = 0; i < gate.size(); ++i)
        gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      std::vector<double> down = denseMatVec(lw.down_proj, gate);
      addDenseLora(lora, l, kLoraDown, gate, down);
      for (int64_t i = 0; i < hidden; ++i) x[t][i] += down[i] * residual;
    }
  }
  std::vector<double> last = x[n - 1];
  denseRmsNorm(last, 0, hidden, w.norm, c.rms_norm_eps);
  std::vector<double> logits = denseMatVec(w.lm_head, last);
  if (c.granite) {
    for (double& logit : logits) logit /= c.logits_scaling;
  }
  if (c.final_logit_softcapping > 0) {
    for (double& logit : logits) {
      logit = std::tanh(logit / c.final_logit_softcapping) * c.final_logit_softcapping;
    }
  }
  return logits;
}

// ---- Tests --------------------------------------------------------------------

void PrintTo(const Variant& variant, std::ostream* os) { *os << variantName(variant); }

class ModelRunnerTest : public ::testing::TestWithParam<Variant> {
 protected:
  const Model& model() {
    return tinyModel(GetParam().architecture, GetParam().weight_dtype, GetParam().quantization,
                     GetParam().kv_cache_scales);
  }
  KvCacheConfig cacheConfig(int64_t num_blocks) {
    return cacheConfigFor(model(), GetParam().kv_dtype, num_blocks);
  }
  kernels::Backend& backend() { return cpuBackend(GetParam().compute_dtype); }
  // Largest |logit - dense reference| allowed, relative to the logit range.
  // fp32 kernels vs a double reference: observed errors are ~1e-6 of the
  // range, bound 1e-5. A bf16 KV cache rounds K and V to 8 mantissa bits:
  // observed ~4e-3, bound 1e-2. bf16 compute rounds every GEMM's
  // activations the same way: observed ~8e-3, bound 2e-2. An fp8 cache's
  // rounding the reference repeats; what is left is the fp32 error (~4e-7
  // of the range observed: no K or V value fell on the other side of a
  // rounding boundary from the reference's) plus any value that does, which
  // moves the logits by a fraction of fp8's 6% step: bound 1e-2, where the
  // unrounded reference is 5-20% of the range away.
  double relativeBound() const {
    if (GetParam().compute_dtype == DType::kBF16) return 2e-2;
    if (GetParam().kv_dtype == DType::kBF16 || GetParam().kv_dtype == DType::kF8E4M3) return 1e-2;
    return 1e-5;
  }
};

TEST_P(ModelRunnerTest, ChunkedPrefillIsBitIdenticalToOneShot) {
  const int64_t vocab = model().config().vocab_size;
  const std::vector<TokenId> prompt = randomTokens(53, vocab, 1);
  const int64_t num_blocks = 4;
  const auto blocks = iotaBlocks(num_blocks);

  KvCache one_shot_cache(cacheConfig(num_blocks), std::make_unique<HostSlabAllocator>());
  ModelRunner one_shot(model(), one_shot_cache, backend());
  const std::vector<float> expected = prefillInChunks(one_shot, prompt, blocks, 0);
  const std::vector<uint8_t> expected_kv = sequenceKvBytes(one_shot_cache, blocks, num_blocks);

  for (int64_t chunk : {1, 7, 16}) {
    KvCache cache(cacheConfig(num_blocks), std::make_unique<HostSlabAllocator>());
    ModelRunner runner(model(), cache, backend());
    std::vector<float> logits = prefillInChunks(runner, prompt, blocks, chunk);
    EXPECT_TRUE(bitEqual(logits, expected)) << "chunk " << chunk << ": logits differ";
    EXPECT_EQ(sequenceKvBytes(cache, blocks, num_blocks), expected_kv)
        << "chunk " << chunk << ": KV bytes differ";
  }
}

TEST_P(ModelRunnerTest, SequenceIsBitIdenticalAloneAndBatched) {
  const int64_t vocab = model().config().vocab_size;
  const std::vector<TokenId> a = randomTokens(40, vocab, 2);
  const std::vector<TokenId> b = randomTokens(13, vocab, 3);
  const std::vector<TokenId> c = randomTokens(70, vocab, 4);
  const int64_t decode_steps = 5;

  // Alone: prefill then greedy decode, recording logits of every step.
  const auto a_alone_blocks = iotaBlocks(4);
  KvCache alone_cache(cacheConfig(4), std::make_unique<HostSlabAllocator>());
  ModelRunner alone(model(), alone_cache, backend());
  std::vector<std::vector<float>> alone_logits;
  std::vector<TokenId> a_generated;
  {
    std::vector<float> logits = prefillInChunks(alone, a, a_alone_blocks, 0);
    alone_logits.push_back(logits);
    for (int64_t step = 0; step < decode_steps; ++step) {
      TokenId next = static_cast<TokenId>(kernels::argmax(logits.data(), vocab));
      a_generated.push_back(next);
      SequenceInput input{
          {&a_generated.back(), 1}, static_cast<int64_t>(a.size()) + step, a_alone_blocks};
      alone.forward({&input, 1}, logits);
      alone_logits.push_back(logits);
    }
  }

  // Batched: B, A, C prefilled together (A in the middle, scattered blocks),
  // then decoded together.
  KvCache cache(cacheConfig(16), std::make_unique<HostSlabAllocator>());
  ModelRunner runner(model(), cache, backend());
  const std::vector<BlockId> b_blocks = {0, 1};
  const std::vector<BlockId> a_blocks = {9, 3, 12, 2};
  const std::vector<BlockId> c_blocks = {4, 5, 6, 7, 8, 10};
  std::vector<SequenceInput> batch = {{b, 0, b_blocks}, {a, 0, a_blocks}, {c, 0, c_blocks}};
  std::vector<float> logits;
  runner.forward(batch, logits);
  std::vector<float> a_logits(logits.begin() + vocab, logits.begin() + 2 * vocab);
  EXPECT_TRUE(bitEqual(a_logits, alone_logits[0])) << "prefill logits differ when batched";

  std::vector<TokenId> b_next(1), c_next(1);
  for (int64_t step = 0; step < decode_steps; ++step) {
    b_next[0] = static_cast<TokenId>(kernels::argmax(logits.data(), vocab));
    c_next[0] = static_cast<TokenId>(kernels::argmax(logits.data() + 2 * vocab, vocab));
    batch = {{b_next, static_cast<int64_t>(b.size()) + step, b_blocks},
             {{&a_generated[step], 1}, static_cast<int64_t>(a.size()) + step, a_blocks},
             {c_next, static_cast<int64_t>(c.size()) + step, c_blocks}};
    runner.forward(batch, logits);
    a_logits.assign(logits.begin() + vocab, logits.begin() + 2 * vocab);
    EXPECT_TRUE(bitEqual(a_logits, alone_logits[step + 1])) << "decode step " << step;
  }
  EXPECT_EQ(sequenceKvBytes(cache, a_blocks, 3), sequenceKvBytes(alone_cache, a_alone_blocks, 3))
      << "KV bytes of the batched sequence differ from the lone one";
}

TEST_P(ModelRunnerTest, PrefillChunkBatchedWithDecodesIsBitIdentical) {
  // Continuous batching mixes one sequence's prefill chunk with others' decodes.
  const int64_t vocab = model().config().vocab_size;
  const std::vector<TokenId> a = randomTokens(45, vocab, 5);
  const std::vector<TokenId> other = randomTokens(20, vocab, 6);

  KvCache alone_cache(cacheConfig(3), std::make_unique<HostSlabAllocator>());
  ModelRunner alone(model(), alone_cache, backend());
  const std::vector<float> expected = prefillInChunks(alone, a, iotaBlocks(3), 0);

  KvCache cache(cacheConfig(8), std::make_unique<HostSlabAllocator>());
  ModelRunner runner(model(), cache, backend());
  const std::vector<BlockId> a_blocks = {5, 6, 7};
  const std::vector<BlockId> other_blocks = {0, 1};
  std::vector<float> logits;
  prefillInChunks(runner, other, other_blocks, 0);
  // A in chunks of 16, each step batched with one decode token of `other`.
  int64_t other_position = static_cast<int64_t>(other.size());
  std::vector<TokenId> other_token = {other.back()};
  for (int64_t start = 0; start < 45; start += 16) {
    std::vector<SequenceInput> batch = {
        {other_token, other_position++, other_blocks},
        {std::span<const TokenId>(a).subspan(start, std::min<int64_t>(16, 45 - start)), start,
         a_blocks}};
    runner.forward(batch, logits);
  }
  std::vector<float> a_logits(logits.begin() + vocab, logits.end());
  EXPECT_TRUE(bitEqual(a_logits, expected));
  EXPECT_EQ(sequenceKvBytes(cache, a_blocks, 3), sequenceKvBytes(alone_cache, iotaBlocks(3), 3));
}

TEST_P(ModelRunnerTest, MatchesDenseReferenceForwardPass) {
  const int64_t vocab = model().config().vocab_size;
  const std::vector<TokenId> prompt = randomTokens(37, vocab, 8);
  KvCache cache(cacheConfig(3), std::make_unique<HostSlabAllocator>());
  ModelRunner runner(model(), cache, backend());
  // Chunked on purpose: the reference sees the whole prompt at once.
  const std::vector<float> logits = prefillInChunks(runner, prompt, iotaBlocks(3), 10);
  DenseRouting routing;
  const std::vector<double> expected =
      denseLogits(model(), prompt, nullptr, &routing, GetParam().kv_dtype);
  ASSERT_EQ(logits.size(), expected.size());
  if (model().config().num_experts > 0) {
    // Every expert served some token, and no token's choice was a near tie
    // the engine's rounding could break otherwise.
    EXPECT_EQ(std::ssize(routing.experts_used), model().config().num_experts);
    EXPECT_GT(routing.narrowest_gap, 1e-4);
  }
  double scale = 0.0;
  for (double v : expected) scale = std::max(scale, std::abs(v));
  const bool bf16_compute = GetParam().compute_dtype == DType::kBF16;
  const double tolerance = relativeBound() * std::max(1.0, scale);
  auto worstError = [&](const std::vector<double>& reference) {
    double worst = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(logits[i]) - reference[i]));
    }
    return worst;
  };
  const double worst = worstError(expected);
  if (GetParam().kv_dtype == DType::kF8E4M3) {
    // The reference without fp8's rounding is much further: the cache
    // rounded as the reference does, with the scales it names.
    const double unrounded = worstError(denseLogits(model(), prompt));
    RecordProperty("max_abs_error_unrounded_kv", std::to_string(unrounded));
    EXPECT_GT(unrounded, 4 * worst) << "fp8 KV: the unrounded reference is as close";
  }
  RecordProperty("max_abs_error", std::to_string(worst));
  RecordProperty("logit_scale", std::to_string(scale));
  EXPECT_LE(worst, tolerance) << "max |logit - reference| over the vocabulary (scale " << scale
                              << ")";
  EXPECT_GT(scale, 0.0) << "reference logits are all zero: the test model is degenerate";
  if (bf16_compute) {
    EXPECT_GT(worst, 1e-5 * scale) << "bf16 compute gave the exact path's accuracy: not applied";
  }
}

TEST_P(ModelRunnerTest, LoraAdaptersMatchTheDenseReferenceWithTheirDeltas) {
  const int64_t vocab = model().config().vocab_size;
  const std::vector<TokenId> prompt = randomTokens(37, vocab, 9);
  const std::vector<double> base =
      denseLogits(model(), prompt, nullptr, nullptr, GetParam().kv_dtype);
  double scale = 0.0;
  for (double v : base) scale = std::max(scale, std::abs(v));
  const double tolerance = relativeBound() * std::max(1.0, scale);
  for (const char* kind : {"all", "qv"}) {
    SCOPED_TRACE(kind);
    const TinyAdapter& lora = tinyAdapter(model(), kind);
    KvCache cache(cacheConfig(3), std::make_unique<HostSlabAllocator>());
    ModelRunner runner(model(), cache, backend());
    const int32_t index = runner.addAdapter(*lora.adapter);
    const std::vector<float> logits = prefillInChunks(runner, prompt, iotaBlocks(3), 10, index);
    const DenseLora dense = readDenseLora(lora.dir, model().config(), lora.scale);
    const std::vector<double> expected =
        denseLogits(model(), prompt, &dense, nullptr, GetParam().kv_dtype);
    ASSERT_EQ(logits.size(), expected.size());
    double worst = 0.0, moved = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(logits[i]) - expected[i]));
      moved = std::max(moved, std::abs(expected[i] - base[i]));
    }
    EXPECT_LE(worst, tolerance) << "max |logit - reference with the adapter| (scale " << scale
                                << ")";
    // The adapter changes the answer far beyond the tolerance: a delta left
    // out could not pass.
    EXPECT_GT(moved, 20 * tolerance) << "the adapter hardly moves the reference logits";
  }
}

TEST_P(ModelRunnerTest, LoraSequencesAreBitIdenticalAloneBatchedChunkedAndFused) {
  const int64_t vocab = model().config().vocab_size;
  // Sequences with adapter "all" twice (one run of rows), "qv" right after
  // them, the base model, "all" again; each alone, then all five batched.
  const std::vector<std::vector<TokenId>> prompts = {
      randomTokens(21, vocab, 31), randomTokens(35, vocab, 32), randomTokens(40, vocab, 34),
      randomTokens(18, vocab, 33), randomTokens(9, vocab, 35)};
  const std::vector<std::string> kinds = {"all", "all", "qv", "", "all"};
  const int64_t decode_steps = 3;
  auto addAdapters = [&](ModelRunner& runner) {
    EXPECT_EQ(runner.addAdapter(*tinyAdapter(model(), "all").adapter), 0);
    EXPECT_EQ(runner.addAdapter(*tinyAdapter(model(), "qv").adapter), 1);
  };
  auto indexOf = [](const std::string& kind) { return kind.empty() ? -1 : kind == "all" ? 0 : 1; };

  struct Lone {
    std::vector<std::vector<float>> logits;  // prefill, then each decode step
    std::vector<TokenId> generated;
    std::vector<uint8_t> kv;
  };
  std::vector<Lone> lone(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    KvCache cache(cacheConfig(4), std::make_unique<HostSlabAllocator>());
    ModelRunner runner(model(), cache, backend());
    addAdapters(runner);
    const std::vector<BlockId> blocks = iotaBlocks(4);
    std::vector<float> logits = prefillInChunks(runner, prompts[s], blocks, 0, indexOf(kinds[s]));
    lone[s].logits.push_back(logits);
    for (int64_t step = 0; step < decode_steps; ++step) {
      lone[s].generated.push_back(static_cast<TokenId>(kernels::argmax(logits.data(), vocab)));
      SequenceInput input{
          {&lone[s].generated.back(), 1}, static_cast<int64_t>(prompts[s].size()) + step, blocks};
      input.adapter = indexOf(kinds[s]);
      runner.forward({&input, 1}, logits);
      lone[s].logits.push_back(logits);
    }
    lone[s].kv = sequenceKvBytes(cache, blocks, 3);
    if (s == 0) {
      // In chunks of 7: the same logits and KV.
      KvCache chunked_cache(cacheConfig(4), std::make_unique<HostSlabAllocator>());
      ModelRunner chunked(model(), chunked_cache, backend());
      addAdapters(chunked);
      EXPECT_TRUE(bitEqual(prefillInChunks(chunked, prompts[s], blocks, 7, 0), lone[s].logits[0]))
          << "chunked prefill with an adapter";
      EXPECT_EQ(sequenceKvBytes(chunked_cache, blocks, 1), sequenceKvBytes(cache, blocks, 1));
    }
  }
  EXPECT_FALSE(bitEqual(lone[0].logits[0],
                        [&] {
                          KvCache cache(cacheConfig(4), std::make_unique<HostSlabAllocator>());
                          ModelRunner runner(model(), cache, backend());
                          return prefillInChunks(runner, prompts[0], iotaBlocks(4), 0);
                        }()))
      << "the adapter changed nothing";

  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused projections" : "separate projections");
    KvCache cache(cacheConfig(16), std::make_unique<HostSlabAllocator>());
    ModelRunnerOptions options;
    options.fuse_projections = fused;
    ModelRunner runner(model(), cache, backend(), options);
    addAdapters(runner);
    const std::vector<std::vector<BlockId>> blocks = {{9, 3}, {12, 2, 0}, {6, 7, 8}, {4, 5}, {13}};
    std::vector<SequenceInput> batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      SequenceInput input{prompts[s], 0, blocks[s]};
      input.adapter = indexOf(kinds[s]);
      batch.push_back(input);
    }
    std::vector<float> logits;
    for (int64_t step = 0; step <= decode_steps; ++step) {
      if (step > 0) {
        for (size_t s = 0; s < prompts.size(); ++s) {
          batch[s].tokens = {&lone[s].generated[step - 1], 1};
          batch[s].start_position = static_cast<int64_t>(prompts[s].size()) + step - 1;
        }
      }
      runner.forward(batch, logits);
      for (size_t s = 0; s < prompts.size(); ++s) {
        const std::vector<float> row(logits.begin() + static_cast<ptrdiff_t>(s * vocab),
                                     logits.begin() + static_cast<ptrdiff_t>((s + 1) * vocab));
        EXPECT_TRUE(bitEqual(row, lone[s].logits[step]))
            << "sequence " << s << " (adapter \"" << kinds[s] << "\"), step " << step;
      }
    }
    for (size_t s = 0; s < prompts.size(); ++s) {
      std::vector<uint8_t> kv;
      for (int64_t b = 0; b < 3 && b < std::ssize(blocks[s]); ++b) {
        const uint8_t* data = cache.blockData(blocks[s][b]);
        kv.insert(kv.end(), data, data + cache.blockBytes());
      }
      const std::vector<uint8_t> expected(lone[s].kv.begin(),
                                          lone[s].kv.begin() + static_cast<ptrdiff_t>(kv.size()));
      EXPECT_EQ(kv, expected) << "KV bytes of sequence " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelRunnerTest,
    ::testing::Values(
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kF32},
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kBF16},
        Variant{"LlamaForCausalLM", DType::kF32, DType::kF32},
        Variant{"LlamaForCausalLM", DType::kF16, DType::kF32},
        Variant{"Qwen2ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Qwen3ForCausalLM", DType::kBF16, DType::kBF16},
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kF32, DType::kBF16},
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        Variant{"Qwen3ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // Gemma 2 and 3: sliding layers whose window (24) the prompts
        // cross; Gemma 2's soft-capped scores and logits.
        Variant{"Gemma2ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Gemma3ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Gemma3ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // Phi-3: q/k/v and gate/up read from one matrix each, three quarters
        // of each head rotating with LongRoPE, a window (32) on every layer.
        Variant{"Phi3ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Phi3ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // Granite: its four scalars.
        Variant{"GraniteForCausalLM", DType::kBF16, DType::kF32},
        // OLMo 2: norms after attention and the MLP, q/k norms across heads.
        Variant{"Olmo2ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Olmo2ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // Ministral 3: YaRN, and queries scaled from position 32 on.
        Variant{"Ministral3ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Ministral3ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // OLMo 3: a sliding layer rotating unscaled, a full one with YaRN.
        Variant{"Olmo3ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Olmo3ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // GLM: half of each head rotating as neighbour pairs, q/k/v biases,
        // gate/up fused in the checkpoint; GLM-4 with its sandwich norms.
        Variant{"GlmForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Glm4ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Glm4ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // SmolLM3: its second layer without RoPE, tied embeddings.
        Variant{"SmolLM3ForCausalLM", DType::kBF16, DType::kF32},
        Variant{"SmolLM3ForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        Variant{"MixtralForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Qwen3MoeForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Qwen3MoeForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // Qwen2-MoE: q/k/v biases, a shared expert weighed by its sigmoid
        // gate, every second layer a mixture.
        Variant{"Qwen2MoeForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Qwen2MoeForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // GLM-4.5: sigmoid routing with a correction bias in two groups (one
        // chosen), a routed scale, a shared expert, a dense first layer,
        // q/k norms, half of each head rotating as halves.
        Variant{"Glm4MoeForCausalLM", DType::kBF16, DType::kF32},
        Variant{"Glm4MoeForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        Variant{"Glm4MoeForCausalLM", DType::kBF16, DType::kF32, DType::kF32, "fp8:block=16x32"},
        // GPT-OSS: sinks, a window on every other layer, YaRN unrounded,
        // o_proj and router biases, experts with biases and the clamped
        // activation; as transformers holds the experts and as published
        // (MXFP4).
        Variant{"GptOssForCausalLM", DType::kBF16, DType::kF32},
        Variant{"GptOssForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        Variant{"GptOssForCausalLM", DType::kBF16, DType::kF32, DType::kF32, "mxfp4"},
        // Granite MoE: Granite's scalars around a mixture of stacked experts.
        // (As Granite's, f32 only: its scalars shrink an adapter's effect
        // below bf16's tolerance.)
        Variant{"GraniteMoeForCausalLM", DType::kBF16, DType::kF32},
        // OLMoE: q/k norms across the heads before a mixture on every
        // layer, weights not renormalized.
        Variant{"OlmoeForCausalLM", DType::kBF16, DType::kF32},
        Variant{"OlmoeForCausalLM", DType::kBF16, DType::kBF16, DType::kBF16},
        // fp8 checkpoints (docs/quantization.md): per-channel
        // scales, blocks splitting rows and columns, and one
        // scale per tensor under bf16 compute (fp8 matrices
        // multiply fp32 activations whatever the compute
        // dtype; the LM head follows it).
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kF32, DType::kF32,
                "compressed-tensors:channel"},
        Variant{"Qwen3ForCausalLM", DType::kBF16, DType::kBF16, DType::kF32, "fp8:block=16x32"},
        Variant{"Qwen3MoeForCausalLM", DType::kBF16, DType::kF32, DType::kF32, "fp8:block=16x32"},
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kF32, DType::kBF16, "fp8:tensor"},
        // fp8 KV caches: with the checkpoint's per-layer scales; with none
        // (every scale 1) under Qwen3's k_norm; with fp8 weights and experts.
        Variant{"LlamaForCausalLM", DType::kBF16, DType::kF8E4M3, DType::kF32, "", true},
        Variant{"Qwen3ForCausalLM", DType::kBF16, DType::kF8E4M3},
        Variant{"Qwen3MoeForCausalLM", DType::kBF16, DType::kF8E4M3, DType::kF32, "fp8:block=16x32",
                true}),
    [](const ::testing::TestParamInfo<Variant>& info) { return variantName(info.param); });

// Resident bytes of this process's mappings of `file` (/proc/self/smaps).
size_t mappedRssBytes(const fs::path& file) {
  std::ifstream smaps("/proc/self/smaps");
  const std::string name = fs::canonical(file).string();
  size_t kib = 0;
  bool in_file = false;
  for (std::string line; std::getline(smaps, line);) {
    // Mapping headers start "address-address perms ..."; field lines "Name:".
    const size_t colon = line.find(':');
    const size_t space = line.find(' ');
    if (colon == std::string::npos || space < colon) {
      in_file = line.size() >= name.size() &&
                line.compare(line.size() - name.size(), name.size(), name) == 0;
    } else if (in_file && line.rfind("Rss:", 0) == 0) {
      kib += std::stoull(line.substr(4));
    }
  }
  return kib * 1024;
}

// With bf16 compute the runner multiplies packed copies: the matrices' pages
// of the file mapping leave memory, and reading them again (another runner,
// computing in f32) gives the same bytes: logits bit-identical to before.
TEST(ModelRunner, PackedWeightsLeaveTheFileMappingAndLoseNothing) {
  ::tandem::testing::TempDir dir("tandem-runner-drop");
  tools::TestModelOptions options;
  options.preset = "tiny";
  options.dtype = DType::kBF16;
  options.seed = 12;
  tools::writeTestModel(options, dir.path());
  const std::unique_ptr<Model> model = Model::load(dir.path());
  const fs::path file = dir.path() / "model.safetensors";

  KvCache cache(cacheConfigFor(*model, DType::kBF16, 4), std::make_unique<HostSlabAllocator>());
  const std::vector<TokenId> prompt = randomTokens(40, model->config().vocab_size, 5);
  ModelRunner exact(*model, cache, cpuBackend(DType::kF32));
  EXPECT_EQ(exact.droppedMappedBytes(), 0u);
  // Every matrix is read: all its pages are resident.
  const std::vector<float> before = prefillInChunks(exact, prompt, iotaBlocks(4), 0);
  const size_t resident_before = mappedRssBytes(file);

  ModelRunner packed(*model, cache, cpuBackend(DType::kBF16));
  size_t matrix_bytes = 0;
  for (const LayerWeights& layer : model->weights().layers) {
    for (const kernels::WeightView* w : layer.matrices()) matrix_bytes += kernels::viewBytes(*w);
  }
  // Whole pages only: a small matrix's partial first and last pages stay.
  EXPECT_GT(packed.droppedMappedBytes(), matrix_bytes / 2);
  EXPECT_LE(packed.droppedMappedBytes(),
            matrix_bytes + kernels::viewBytes(model->weights().lm_head));
  ASSERT_GE(resident_before, packed.droppedMappedBytes());
  const size_t resident_after = mappedRssBytes(file);
  EXPECT_LE(resident_after, resident_before - packed.droppedMappedBytes())
      << "resident before " << resident_before << ", after " << resident_after;

  EXPECT_TRUE(bitEqual(prefillInChunks(exact, prompt, iotaBlocks(4), 0), before));
  EXPECT_GT(mappedRssBytes(file), resident_before - packed.droppedMappedBytes());
}

TEST(ModelRunner, RefusesCacheOfAnotherGeometry) {
  const Model& model = tinyModel("LlamaForCausalLM", DType::kBF16);
  KvCacheConfig config = cacheConfigFor(model, DType::kBF16, 2);
  config.head_dim *= 2;
  KvCache cache(config, std::make_unique<HostSlabAllocator>());
  try {
    ModelRunner runner(model, cache, cpuBackend());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

// A runner behind a ProfilingBackend computes exactly what it computes on the
// backend itself, and the profile counts every call of the step: each
// projection, norm and attention once per layer, with the bytes and flops
// their shapes imply.
TEST(ModelRunner, ProfiledStepGivesTheSameLogitsAndCountsEveryCall) {
  const Model& model = tinyModel("LlamaForCausalLM", DType::kBF16);
  const ModelConfig& config = model.config();
  const std::vector<TokenId> prompt = randomTokens(40, config.vocab_size, 8);
  KvCache plain_cache(cacheConfigFor(model, DType::kBF16, 4),
                      std::make_unique<HostSlabAllocator>());
  ModelRunner plain(model, plain_cache, cpuBackend());
  const std::vector<float> expected = prefillInChunks(plain, prompt, iotaBlocks(4), 0);

  kernels::cpu::CpuBackend inner;
  kernels::ProfilingBackend profiler(inner);
  KvCache cache(cacheConfigFor(model, DType::kBF16, 4), std::make_unique<HostSlabAllocator>());
  ModelRunner runner(model, cache, profiler);
  // Disabled, nothing is gathered.
  prefillInChunks(runner, prompt, iotaBlocks(4), 0);
  EXPECT_TRUE(profiler.take().empty());

  profiler.setEnabled(true);
  EXPECT_TRUE(bitEqual(prefillInChunks(runner, prompt, iotaBlocks(4), 0), expected));
  const std::vector<kernels::OpProfile> ops = profiler.take();
  EXPECT_TRUE(profiler.take().empty()) << "take() forgets what it returned";

  std::map<std::string, int64_t> calls;  // by op, shapes summed
  double matmul_bytes = 0.0, matmul_flops = 0.0, attention_bytes = 0.0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const kernels::OpProfile& op = ops[i];
    EXPECT_GT(op.seconds, 0.0) << op.op;
    if (i > 0) {
      EXPECT_GE(ops[i - 1].seconds, op.seconds) << "slowest first";
    }
    calls[op.op.substr(0, op.op.find(' '))] += op.calls;
    if (op.op.starts_with("matmul")) {
      matmul_bytes += op.bytes;
      matmul_flops += op.flops;
    }
    if (op.op.starts_with("pagedAttention")) attention_bytes += op.bytes;
  }
  const int64_t layers = config.num_hidden_layers;
  EXPECT_EQ(calls["matmul"], 7 * layers + 1);
  EXPECT_EQ(calls["rmsNorm"], 2 * layers + 1);
  EXPECT_EQ(calls["pagedAttention"], layers);
  EXPECT_EQ(calls["writeKv"], layers);
  EXPECT_EQ(calls["applyRope"], 2 * layers);
  EXPECT_EQ(calls["embedding"], 1);
  EXPECT_EQ(calls["beginBatch"], 1);

  double weight_bytes = static_cast<double>(kernels::viewBytes(model.weights().lm_head));
  double flops = 2.0 * static_cast<double>(config.hidden_size * config.vocab_size);  // one row
  for (const LayerWeights& layer : model.weights().layers) {
    for (const kernels::WeightView* w : layer.matrices()) {
      weight_bytes += static_cast<double>(kernels::viewBytes(*w));
      flops += 2.0 * static_cast<double>(prompt.size()) * static_cast<double>(w->rows * w->cols);
    }
  }
  EXPECT_EQ(matmul_bytes, weight_bytes);
  EXPECT_EQ(matmul_flops, flops);
  // Each layer reads the K and V rows of all 40 positions once.
  EXPECT_EQ(attention_bytes, static_cast<double>(layers * 40 * 2 * config.num_key_value_heads *
                                                 config.head_dim * 2));
}

}  // namespace
}  // namespace tandem::engine
