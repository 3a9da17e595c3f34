#include "agent/engine/model.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "common/available_cpus.h"
#include "common/file_text.h"
#include "common/hex.h"
#include "common/json_parse.h"
#include "common/status.h"

namespace tandem::engine {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Finds tensors by Hugging Face name across the one file or the shards of an
// index, and checks each against what the config implies.
class TensorSource {
 public:
  TensorSource(const fs::path& dir, std::vector<std::unique_ptr<SafetensorsFile>>& files,
               const Fp8Quantization& quantization, std::vector<std::vector<float>>& scales,
               std::vector<std::vector<uint8_t>>& converted)
      : files_(files), quantization_(quantization), scales_(scales), converted_(converted) {
    const fs::path single = dir / kSingleFile;
    const fs::path index = dir / kIndexFile;
    // A link that leads nowhere is named as such, not as no file.
    std::error_code error;
    if (fs::exists(single) || fs::is_symlink(fs::symlink_status(single, error))) {
      files_.push_back(std::make_unique<SafetensorsFile>(single));
      return;
    }
    if (!fs::exists(index)) {
      throw Error("model directory " + dir.string() + " has neither " + kSingleFile + " nor " +
                  kIndexFile);
    }
    index_path_ = index;
    readIndex(dir);
  }

  // The dtype every matrix must share: set by the first matrix looked up.
  std::optional<DType> matrix_dtype;
  std::optional<std::string> first_matrix;
  size_t used_bytes = 0;

  // quantizable: whether an fp8 checkpoint may hold it as F8_E4M3 (every
  // matrix but the embedding table, which lookups read row by row).
  kernels::WeightView matrix(const std::string& name, int64_t rows, int64_t cols,
                             bool quantizable = true) {
    const TensorInfo& tensor = lookup(name, {rows, cols});
    if (tensor.dtype == DType::kF8E4M3) {
      if (!quantizable) {
        throw Error("tensor " + name + " in " + fileOf(name) +
                    " has dtype F8_E4M3, which it cannot have (accepted: F32, BF16, F16; fp8 "
                    "checkpoints quantize the projections only)");
      }
      return quantizedMatrix(name, tensor, rows, cols);
    }
    checkMatrixDtype(name, tensor);
    used_bytes += tensor.num_bytes;
    return kernels::WeightView{tensor.data, tensor.dtype, rows, cols};
  }

  // A [sum of `rows`, cols] matrix read as consecutive row ranges of those
  // sizes, each a view into it (Phi-3's qkv_proj and gate_up_proj). An fp8
  // matrix's scales are sliced along: a range must start on a scale block's
  // first row.
  std::vector<kernels::WeightView> rowRanges(const std::string& name,
                                             const std::vector<int64_t>& rows, int64_t cols) {
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    const kernels::WeightView whole = matrix(name, total, cols);
    std::vector<kernels::WeightView> views;
    int64_t begin = 0;
    for (int64_t r : rows) {
      kernels::WeightView view = whole;
      view.data = static_cast<const uint8_t*>(whole.data) +
                  static_cast<size_t>(begin * cols) * dtypeSize(whole.dtype);
      view.rows = r;
      if (whole.scales != nullptr) {
        if (whole.scale_rows >= total) {
          view.scale_rows = r;  // one scale for the whole tensor
        } else if (begin % whole.scale_rows != 0) {
          throw Error("tensor " + name + " in " + fileOf(name) + ": its rows " +
                      std::to_string(begin) + ".." + std::to_string(begin + r - 1) +
                      " (one of the matrices it holds) start inside a block of " +
                      std::to_string(whole.scale_rows) +
                      " rows sharing a scale (accepted: blocks that do not straddle them)");
        } else {
          view.scales = whole.scales + (begin / whole.scale_rows) * whole.scaleGridCols();
        }
      }
      views.push_back(view);
      begin += r;
    }
    return views;
  }

  // The `count` matrices of a [count, rows, cols] tensor, each a view into it.
  std::vector<kernels::WeightView> stackedMatrices(const std::string& name, int64_t count,
                                                   int64_t rows, int64_t cols) {
    const TensorInfo& tensor = lookup(name, {count, rows, cols});
    if (tensor.dtype == DType::kF8E4M3) {
      throw Error("tensor " + name + " in " + fileOf(name) +
                  " holds fp8 experts stacked, which are not supported (accepted: fp8 experts "
                  "as one tensor each, with their scales, as published checkpoints hold them)");
    }
    checkMatrixDtype(name, tensor);
    used_bytes += tensor.num_bytes;
    std::vector<kernels::WeightView> views;
    const size_t bytes = static_cast<size_t>(rows * cols) * dtypeSize(tensor.dtype);
    for (int64_t i = 0; i < count; ++i) {
      views.push_back({static_cast<const uint8_t*>(tensor.data) + static_cast<size_t>(i) * bytes,
                       tensor.dtype, rows, cols});
    }
    return views;
  }

  // The first of `names` the checkpoint holds, read as one positive scale
  // ([] or [1], F32/BF16/F16); nullopt when it holds none of them.
  std::optional<float> scale(std::initializer_list<std::string> names) {
    for (const std::string& name : names) {
      if (!has(name)) continue;
      // Checked below, its refusal left to an fp8 cache (a bf16 or f32
      // cache does not read it): not in checkFinite's scan.
      const TensorInfo& tensor = lookupAny(name, /*scanned=*/false);
      if (tensor.shape != std::vector<int64_t>{} && tensor.shape != std::vector<int64_t>{1}) {
        throw Error("tensor " + name + " in " + fileOf(name) + " has shape " +
                    shapeText(tensor.shape) +
                    ", expected [] or [1] (one KV cache scale per layer; per-head scales are not "
                    "supported)");
      }
      if (tensor.dtype == DType::kF8E4M3) {
        throw Error("tensor " + name + " in " + fileOf(name) +
                    " has dtype F8_E4M3 (accepted for scales: F32, BF16, F16)");
      }
      float value = 0.0f;
      convertToF32(tensor.dtype, tensor.data, &value, 1);
      // NaN fails the comparisons.
      if (!(value >= kMinKvCacheScale && value <= kMaxKvCacheScale)) {
        throw Error("tensor " + name + " in " + fileOf(name) + " holds " + std::to_string(value) +
                    " (accepted: a KV cache scale from 1e-30 to 1e36)");
      }
      used_bytes += tensor.num_bytes;
      return value;
    }
    return std::nullopt;
  }

  // Whether the checkpoint holds a tensor of that name.
  bool has(const std::string& name) const {
    if (!index_path_.empty()) return weight_map_.count(name) > 0;
    return files_.front()->find(name) != nullptr;
  }

  std::vector<float> vector(const std::string& name, int64_t size) { return values(name, {size}); }

  // A tensor of that shape (norm weights, biases) as floats, row-major.
  std::vector<float> values(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo& tensor = lookup(name, shape);
    if (tensor.dtype == DType::kF8E4M3 || tensor.dtype == DType::kU8) {
      throw Error("tensor " + name + " in " + fileOf(name) + " has dtype " +
                  dtypeSafetensorsName(tensor.dtype) +
                  ", accepted for weight matrices only (accepted here: F32, BF16, F16)");
    }
    used_bytes += tensor.num_bytes;
    std::vector<float> result(tensor.num_bytes / dtypeSize(tensor.dtype));
    convertToF32(tensor.dtype, tensor.data, result.data(), result.size());
    return result;
  }

  // A tensor of that shape in the matrices' dtype, as it is (GPT-OSS's
  // experts as transformers holds them).
  const TensorInfo& matrixTensor(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo& tensor = lookup(name, shape);
    if (tensor.dtype == DType::kF8E4M3) {
      throw Error("tensor " + name + " in " + fileOf(name) +
                  " has dtype F8_E4M3, which it cannot have (accepted: F32, BF16, F16, or "
                  "MXFP4 blocks and scales)");
    }
    checkMatrixDtype(name, tensor);
    used_bytes += tensor.num_bytes;
    return tensor;
  }

  // The bytes of a U8 tensor of that shape (MXFP4 blocks and scales).
  const uint8_t* bytes(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo& tensor = lookup(name, shape);
    if (tensor.dtype != DType::kU8) {
      throw Error("tensor " + name + " in " + fileOf(name) + " has dtype " +
                  dtypeSafetensorsName(tensor.dtype) + " (accepted: U8, MXFP4 bytes)");
    }
    used_bytes += tensor.num_bytes;
    return static_cast<const uint8_t*>(tensor.data);
  }

  // Zeroed storage, kept by the model, for a matrix made at load.
  uint8_t* convertedStorage(size_t bytes) {
    converted_.emplace_back(bytes);
    return converted_.back().data();
  }

  // "tensor <name> in <file>", as errors name a tensor.
  std::string where(const std::string& name) const {
    return "tensor " + name + " in " + fileOf(name);
  }

  // Refuses a model whose tensors read so far hold a NaN or an infinity
  // (a damaged or badly converted checkpoint: every logit would come out
  // NaN, or some tokens' rows would), naming the first such tensor in the
  // order they were read, and the element. The tensors are scanned on
  // every available CPU. Returns the bytes scanned.
  size_t checkFinite() const {
    const size_t count = read_in_order_.size();
    std::vector<std::optional<NonFiniteElement>> found(count);
    std::atomic<size_t> next{0};
    auto scan = [&] {
      for (size_t i; (i = next.fetch_add(1)) < count;) {
        found[i] = firstNonFinite(*read_in_order_[i].first);
      }
    };
    const int threads =
        static_cast<int>(std::min<size_t>(static_cast<size_t>(availableCpus().cpus), count));
    std::vector<std::future<void>> strands;
    for (int t = 1; t < threads; ++t) strands.push_back(std::async(std::launch::async, scan));
    scan();
    for (auto& strand : strands) strand.get();
    size_t bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      const auto [tensor, file] = read_in_order_[i];
      if (found[i]) {
        throw Error("tensor " + tensor->name + " in " + file->path().string() + " holds " +
                    found[i]->kind + " at " + elementPosition(tensor->shape, found[i]->index) +
                    " (accepted: finite values; the checkpoint is damaged or was converted "
                    "badly)");
      }
      bytes += tensor->num_bytes;
    }
    return bytes;
  }

 private:
  // An F8_E4M3 matrix and its scales (docs/quantization.md).
  kernels::WeightView quantizedMatrix(const std::string& name, const TensorInfo& tensor,
                                      int64_t rows, int64_t cols) {
    using Granularity = Fp8Quantization::Granularity;
    if (quantization_.granularity == Granularity::kNone) {
      throw Error("tensor " + name + " in " + fileOf(name) + " has dtype F8_E4M3, but " +
                  kConfigFile +
                  " has no quantization_config to give its scales (accepted: quant_method fp8 "
                  "or compressed-tensors)");
    }
    const std::string scale_name = quantization_.scaleTensorOf(name);
    if (!has(scale_name)) {
      throw Error("tensor " + scale_name + ", the scales of fp8 tensor " + name +
                  ", is missing from " + fileOf(name));
    }
    const TensorInfo& scale = lookupAny(scale_name);
    kernels::WeightView view{tensor.data, tensor.dtype, rows, cols};
    std::tie(view.scale_rows, view.scale_cols) = quantization_.scaleBlock(rows, cols);
    // The grid's shape, and the forms checkpoints also write it in.
    std::vector<std::vector<int64_t>> accepted;
    switch (quantization_.granularity) {
      case Granularity::kTensor:
        accepted = {{}, {1}};
        break;
      case Granularity::kChannel:
        accepted = {{rows, 1}, {rows}};
        break;
      case Granularity::kBlock:
      case Granularity::kNone:
        accepted = {{view.scaleGridRows(), view.scaleGridCols()}};
        break;
    }
    if (std::find(accepted.begin(), accepted.end(), scale.shape) == accepted.end()) {
      std::string expected;
      for (const auto& shape : accepted) {
        expected += (expected.empty() ? "" : " or ") + shapeText(shape);
      }
      throw Error("tensor " + scale_name + " in " + fileOf(scale_name) + " has shape " +
                  shapeText(scale.shape) + ", expected " + expected + " (" +
                  granularityName(quantization_.granularity) + " scales of " + name + " " +
                  shapeText({rows, cols}) + ", from " + kConfigFile + ")");
    }
    if (scale.dtype == DType::kF8E4M3) {
      throw Error("tensor " + scale_name + " in " + fileOf(scale_name) +
                  " has dtype F8_E4M3 (accepted for scales: F32, BF16, F16)");
    }
    std::vector<float> values(static_cast<size_t>(view.scaleGridRows() * view.scaleGridCols()));
    convertToF32(scale.dtype, scale.data, values.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      // The kernels multiply by scale x 2^8 (kernels.h): that must stay
      // finite. NaN fails both comparisons.
      if (!(values[i] >= 0.0f && values[i] <= 1e36f)) {
        throw Error("tensor " + scale_name + " in " + fileOf(scale_name) + " holds " +
                    std::to_string(values[i]) + " at element " + std::to_string(i) +
                    " (accepted: scales from 0 to 1e36)");
      }
    }
    used_bytes += tensor.num_bytes + scale.num_bytes;
    scales_.push_back(std::move(values));
    view.scales = scales_.back().data();
    return view;
  }

  void checkMatrixDtype(const std::string& name, const TensorInfo& tensor) {
    if (tensor.dtype == DType::kU8) {
      throw Error("tensor " + name + " in " + fileOf(name) +
                  " has dtype U8, which a matrix cannot have (accepted: F32, BF16, F16; U8 "
                  "only for GPT-OSS's MXFP4 expert blocks and scales)");
    }
    if (!matrix_dtype) {
      matrix_dtype = tensor.dtype;
      first_matrix = name;
    } else if (tensor.dtype != *matrix_dtype) {
      throw Error("tensor " + name + " in " + fileOf(name) + " has dtype " +
                  dtypeSafetensorsName(tensor.dtype) + ", but " + *first_matrix + " has " +
                  dtypeSafetensorsName(*matrix_dtype) + "; all matrices must share one dtype");
    }
  }

  void readIndex(const fs::path& dir) {
    const std::string index_name = index_path_.string();
    const std::optional<std::string> text = readModelFile(index_path_);
    if (!text) throw Error(index_name + ": cannot read");
    JsonParseError parse_error;
    std::optional<json> parsed = parseJson(*text, parse_error);
    if (!parsed) throw Error(index_name + ": not valid JSON: " + parse_error.detail);
    json index = std::move(*parsed);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw Error(index_name +
                  ": \"weight_map\" is missing or not an object of tensor name to "
                  "shard file name");
    }
    if (index["weight_map"].empty()) {
      throw Error(index_name +
                  ": \"weight_map\" is empty; accepted: an object naming each tensor's shard "
                  "file");
    }
    std::map<std::string, size_t> shard_indices;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      const json& shard = it.value();
      // Shards must be plain names inside the directory, never paths out of it.
      if (!shard.is_string() || shard.get<std::string>().empty() ||
          fs::path(shard.get<std::string>()).filename() != fs::path(shard.get<std::string>()) ||
          shard.get<std::string>() == "..") {
        throw Error(index_name + ": weight_map entry for " + it.key() + " is " + shard.dump() +
                    "; accepted: the file name of a shard in the model directory");
      }
      const std::string shard_name = shard.get<std::string>();
      auto [found, inserted] = shard_indices.emplace(shard_name, files_.size());
      if (inserted) {
        const fs::path shard_path = dir / shard_name;
        if (!fs::exists(shard_path)) {
          throw Error("shard " + shard_path.string() + " named in " + index_name + " (for tensor " +
                      it.key() + ") does not exist");
        }
        files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
      }
      weight_map_.emplace(it.key(), found->second);
    }
  }

  std::string fileOf(const std::string& name) const {
    if (index_path_.empty()) return files_.front()->path().string();
    return files_[weight_map_.at(name)]->path().string();
  }

  const TensorInfo& lookup(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorInfo& tensor = lookupAny(name);
    if (tensor.shape != shape) {
      throw Error("tensor " + name + " in " + fileOf(name) + " has shape " +
                  shapeText(tensor.shape) + ", expected " + shapeText(shape) + " (from " +
                  kConfigFile + ")");
    }
    return tensor;
  }

  // `scanned`: whether checkFinite() scans the tensor.
  const TensorInfo& lookupAny(const std::string& name, bool scanned = true) const {
    const SafetensorsFile* file = files_.front().get();
    if (!index_path_.empty()) {
      auto it = weight_map_.find(name);
      if (it == weight_map_.end()) {
        throw Error("tensor " + name + " not in weight_map of " + index_path_.string());
      }
      file = files_[it->second].get();
    }
    const TensorInfo* tensor = file->find(name);
    if (tensor == nullptr) {
      throw Error("tensor " + name + " missing from " + file->path().string());
    }
    if (scanned && read_.insert(tensor).second) read_in_order_.push_back({tensor, file});
    return *tensor;
  }

  std::vector<std::unique_ptr<SafetensorsFile>>& files_;
  const Fp8Quantization& quantization_;
  std::vector<std::vector<float>>& scales_;
  std::vector<std::vector<uint8_t>>& converted_;
  fs::path index_path_;                       // empty for a single file
  std::map<std::string, size_t> weight_map_;  // tensor name -> index in files_
  // Every tensor looked up, once, in the order first looked up.
  mutable std::set<const TensorInfo*> read_;
  mutable std::vector<std::pair<const TensorInfo*, const SafetensorsFile*>> read_in_order_;
};

// Sigmoid routing's router bias and the shared experts (GLM-4.5's;
// Qwen2-MoE's with their gate), named alike in the per-expert and the
// stacked forms.
void readRoutingExtras(TensorSource& source, const ModelConfig& c, const ExpertTensorNames& names,
                       LayerWeights& layer) {
  if (c.sigmoid_routing) layer.router_bias = source.vector(names.correctionBias(), c.num_experts);
  if (c.sharedExpertWidth() > 0) {
    const int64_t hidden = c.hidden_size, width = c.sharedExpertWidth();
    layer.shared_expert.gate_proj = source.matrix(names.shared("gate_proj"), width, hidden);
    layer.shared_expert.up_proj = source.matrix(names.shared("up_proj"), width, hidden);
    layer.shared_expert.down_proj = source.matrix(names.shared("down_proj"), hidden, width);
    if (c.qwen2Moe()) layer.shared_expert_gate = source.matrix(names.sharedGate(), 1, hidden);
  }
}

// A mixture layer's router and experts. In the per-expert names of the
// checkpoints published for the architecture (ExpertTensorNames), or
// stacked as transformers 5 holds them (under mlp.; Granite MoE's as
// published: block_sparse_moe.input_linear.weight and output_linear.weight
// in these shapes, its router block_sparse_moe.router.layer.weight):
// mlp.experts.gate_up_proj [experts, 2 x width, hidden] (each expert's gate
// rows, then its up rows) and mlp.experts.down_proj [experts, hidden,
// width], each expert's matrices then views into them.
void loadExperts(TensorSource& source, const ModelConfig& c, int64_t index, LayerWeights& layer) {
  const std::string prefix = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.moe_intermediate_size;
  layer.experts.resize(static_cast<size_t>(c.num_experts));
  // Granite MoE's are stacked as published, under its own names.
  const std::string stacked = prefix + (c.graniteMoe() ? "block_sparse_moe." : "mlp.experts.");
  const std::string gate_up_name = c.graniteMoe() ? "input_linear.weight" : "gate_up_proj";
  const std::string down_name = c.graniteMoe() ? "output_linear.weight" : "down_proj";
  if (c.graniteMoe() || source.has(stacked + gate_up_name)) {
    readRoutingExtras(source, c, ExpertTensorNames(c, index), layer);
    layer.router = source.matrix(
        prefix + (c.graniteMoe() ? "block_sparse_moe.router.layer.weight" : "mlp.gate.weight"),
        c.num_experts, hidden);
    const std::vector<kernels::WeightView> gate_up =
        source.stackedMatrices(stacked + gate_up_name, c.num_experts, 2 * inter, hidden);
    const std::vector<kernels::WeightView> down =
        source.stackedMatrices(stacked + down_name, c.num_experts, hidden, inter);
    const size_t half = static_cast<size_t>(inter * hidden) * dtypeSize(gate_up.front().dtype);
    for (size_t e = 0; e < layer.experts.size(); ++e) {
      const auto* first = static_cast<const uint8_t*>(gate_up[e].data);
      ExpertWeights& w = layer.experts[e];
      w.gate_proj = {first, gate_up[e].dtype, inter, hidden};
      w.up_proj = {first + half, gate_up[e].dtype, inter, hidden};
      w.down_proj = down[e];
    }
    return;
  }
  const ExpertTensorNames names(c, index);
  readRoutingExtras(source, c, names, layer);
  layer.router = source.matrix(names.router(), c.num_experts, hidden);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    ExpertWeights& w = layer.experts[static_cast<size_t>(e)];
    w.gate_proj = source.matrix(names.gate(e), inter, hidden);
    w.up_proj = source.matrix(names.up(e), inter, hidden);
    w.down_proj = source.matrix(names.down(e), hidden, inter);
  }
}

// GPT-OSS's router and experts (mlp.router, mlp.experts), the experts made
// the row-major gate, up and down matrices of every other mixture. As
// published (quant_method mxfp4): gate_up_proj_blocks [experts, 2 x width,
// hidden / 32, 16] and gate_up_proj_scales [experts, 2 x width, hidden / 32],
// output-major, gate and up rows interleaved (gate the even ones), and
// down_proj_blocks and down_proj_scales likewise: kept as they lie, MXFP4
// views into the file (gate and up every other row of gate_up). As
// transformers holds them: gate_up_proj [experts, hidden, 2 x width] and
// down_proj [experts, width, hidden], input-major (x @ W), gate and up
// interleaved in the columns (transformers' gate_up[..., ::2]): transposed
// into the file's dtype, exactly. Biases: gate_up_proj_bias [experts, 2 x
// width] (interleaved) and down_proj_bias [experts, hidden].
void loadGptOssExperts(TensorSource& source, const ModelConfig& c, const std::string& prefix,
                       LayerWeights& layer) {
  const int64_t experts = c.num_experts, hidden = c.hidden_size, width = c.moe_intermediate_size;
  const std::string base = prefix + "mlp.experts.";
  layer.router = source.matrix(prefix + "mlp.router.weight", experts, hidden);
  layer.router_logit_bias = source.vector(prefix + "mlp.router.bias", experts);
  const std::vector<float> gate_up_bias =
      source.values(base + "gate_up_proj_bias", {experts, 2 * width});
  const std::vector<float> down_bias = source.values(base + "down_proj_bias", {experts, hidden});

  layer.experts.resize(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    ExpertWeights& w = layer.experts[static_cast<size_t>(e)];
    const float* bias = gate_up_bias.data() + e * 2 * width;
    for (int64_t j = 0; j < width; ++j) {
      w.gate_bias.push_back(bias[2 * j]);
      w.up_bias.push_back(bias[2 * j + 1]);
    }
    w.down_bias.assign(down_bias.begin() + e * hidden, down_bias.begin() + (e + 1) * hidden);
  }

  if (source.has(base + "gate_up_proj_blocks")) {
    for (const auto& [name, cols] : {std::pair{base + "gate_up_proj_blocks", hidden},
                                     std::pair{base + "down_proj_blocks", width}}) {
      if (cols % 32 != 0) {
        throw Error(source.where(name) +
                    ": MXFP4 needs rows of whole 32-value blocks, but a row "
                    "has " +
                    std::to_string(cols) + " values (from " + kConfigFile + ")");
      }
    }
    const std::string gate_up_scales = base + "gate_up_proj_scales";
    const std::string down_scales = base + "down_proj_scales";
    const uint8_t* gate_up_blocks =
        source.bytes(base + "gate_up_proj_blocks", {experts, 2 * width, hidden / 32, 16});
    const uint8_t* gate_up_scale = source.bytes(gate_up_scales, {experts, 2 * width, hidden / 32});
    const uint8_t* down_blocks =
        source.bytes(base + "down_proj_blocks", {experts, hidden, width / 32, 16});
    const uint8_t* down_scale = source.bytes(down_scales, {experts, hidden, width / 32});
    for (const auto& [scales, count, name] :
         {std::tuple{gate_up_scale, experts * 2 * width * (hidden / 32), gate_up_scales},
          std::tuple{down_scale, experts * hidden * (width / 32), down_scales}}) {
      const uint8_t* nan = std::find(scales, scales + count, uint8_t{0xff});
      if (nan != scales + count) {
        throw Error(source.where(name) + " holds 255 (E8M0's NaN) at element " +
                    std::to_string(nan - scales) + " (accepted: 0 to 254)");
      }
    }
    auto mxfp4 = [](const uint8_t* values, const uint8_t* exponents, int64_t rows, int64_t cols,
                    int64_t row_step) {
      kernels::WeightView view{values, DType::kU8, rows, cols, kernels::WeightLayout::kMxfp4};
      view.exponents = exponents;
      view.row_step = row_step;
      return view;
    };
    for (int64_t e = 0; e < experts; ++e) {
      ExpertWeights& w = layer.experts[static_cast<size_t>(e)];
      const int64_t gate_row = e * 2 * width;
      w.gate_up_interleaved = mxfp4(gate_up_blocks + gate_row * (hidden / 2),
                                    gate_up_scale + gate_row * (hidden / 32), 2 * width, hidden, 1);
      w.gate_proj = mxfp4(gate_up_blocks + gate_row * (hidden / 2),
                          gate_up_scale + gate_row * (hidden / 32), width, hidden, 2);
      w.up_proj = mxfp4(gate_up_blocks + (gate_row + 1) * (hidden / 2),
                        gate_up_scale + (gate_row + 1) * (hidden / 32), width, hidden, 2);
      w.down_proj = mxfp4(down_blocks + e * hidden * (width / 2),
                          down_scale + e * hidden * (width / 32), hidden, width, 1);
    }
    return;
  }

  const auto* gate_up = static_cast<const uint8_t*>(
      source.matrixTensor(base + "gate_up_proj", {experts, hidden, 2 * width}).data);
  const auto* down_in = static_cast<const uint8_t*>(
      source.matrixTensor(base + "down_proj", {experts, width, hidden}).data);
  const DType dtype = *source.matrix_dtype;  // the embedding table's, read first
  const size_t element = dtypeSize(dtype);
  const auto matrix_bytes = static_cast<size_t>(width * hidden) * element;
  uint8_t* gate = source.convertedStorage(static_cast<size_t>(experts) * matrix_bytes);
  uint8_t* up = source.convertedStorage(static_cast<size_t>(experts) * matrix_bytes);
  uint8_t* down = source.convertedStorage(static_cast<size_t>(experts) * matrix_bytes);
  for (int64_t e = 0; e < experts; ++e) {
    uint8_t* gate_e = gate + static_cast<size_t>(e) * matrix_bytes;
    uint8_t* up_e = up + static_cast<size_t>(e) * matrix_bytes;
    uint8_t* down_e = down + static_cast<size_t>(e) * matrix_bytes;
    // Column j of gate_up (row h: x's element h) is row j / 2 of gate or up.
    for (int64_t h = 0; h < hidden; ++h) {
      const uint8_t* from = gate_up + static_cast<size_t>((e * hidden + h) * 2 * width) * element;
      for (int64_t j = 0; j < 2 * width; ++j) {
        std::memcpy(
            (j % 2 == 1 ? up_e : gate_e) + static_cast<size_t>(j / 2 * hidden + h) * element,
            from + static_cast<size_t>(j) * element, element);
      }
    }
    for (int64_t i = 0; i < width; ++i) {
      const uint8_t* from = down_in + static_cast<size_t>((e * width + i) * hidden) * element;
      for (int64_t h = 0; h < hidden; ++h) {
        std::memcpy(down_e + static_cast<size_t>(h * width + i) * element,
                    from + static_cast<size_t>(h) * element, element);
      }
    }
    ExpertWeights& w = layer.experts[static_cast<size_t>(e)];
    w.gate_proj = {gate_e, dtype, width, hidden};
    w.up_proj = {up_e, dtype, width, hidden};
    w.down_proj = {down_e, dtype, hidden, width};
  }
}

// Gemma's RMSNorm scales by 1 + w, computed in fp32 as transformers does
// (x * (1.0 + w.float())): stored so, the norm kernel is Llama's.
void addOne(std::vector<float>& weights) {
  for (float& w : weights) w = 1.0f + w;
}

}  // namespace

ExpertTensorNames::ExpertTensorNames(const ModelConfig& config, int64_t layer)
    : mixtral_(config.architecture == "MixtralForCausalLM"),
      qwen2_moe_(config.qwen2Moe()),
      block_("model.layers." + std::to_string(layer) + "." +
             (mixtral_ ? "block_sparse_moe." : "mlp.")),
      router_(block_ + "gate.weight") {}

std::vector<const kernels::WeightView*> LayerWeights::tokenMatrices(
    int64_t experts_per_token) const {
  std::vector<const kernels::WeightView*> result;
  for (const kernels::WeightView* w : matrices()) {
    if (w->data != nullptr) result.push_back(w);
  }
  if (!experts.empty()) {
    result.push_back(&router);
    if (shared_expert.gate_proj.data != nullptr) {
      result.insert(result.end(),
                    {&shared_expert.gate_proj, &shared_expert.up_proj, &shared_expert.down_proj});
    }
    if (shared_expert_gate.data != nullptr) result.push_back(&shared_expert_gate);
    for (int64_t e = 0; e < experts_per_token && e < std::ssize(experts); ++e) {
      const ExpertWeights& expert = experts[static_cast<size_t>(e)];
      result.insert(result.end(), {&expert.gate_proj, &expert.up_proj, &expert.down_proj});
    }
  }
  return result;
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir,
                                   const std::string& hf_overrides) {
  std::error_code error;
  if (!fs::exists(dir, error)) {
    throw Error("model directory " + dir.string() + " does not exist");
  }
  if (!fs::is_directory(dir, error)) {
    throw Error("model path " + dir.string() +
                " is not a directory (expected a directory holding config.json and "
                "model.safetensors)");
  }
  const fs::path config_path = dir / kConfigFile;
  if (!fs::exists(config_path, error)) {
    throw Error("model directory " + dir.string() + " has no " + kConfigFile);
  }

  std::unique_ptr<Model> model(new Model());
  model->directory_ = dir;
  model->config_ = ModelConfig::fromFile(config_path, hf_overrides);
  const ModelConfig& c = model->config_;
  if (c.head_dim > kernels::kMaxAttentionHeadDim) {
    throw Error(config_path.string() + ": head_dim " + std::to_string(c.head_dim) +
                " is more than the " + std::to_string(kernels::kMaxAttentionHeadDim) +
                " the attention kernels take");
  }

  TensorSource source(dir, model->files_, c.quantization, model->scales_, model->converted_);
  const int64_t hidden = c.hidden_size;
  const int64_t q_size = c.num_attention_heads * c.head_dim;
  const int64_t kv_size = c.num_key_value_heads * c.head_dim;
  const int64_t inter = c.intermediate_size;

  // Where the language model's tensors are: model.*, or in a checkpoint
  // with a vision tower (Gemma 3, Mistral 3) language_model.model.* (as
  // published) or model.language_model.* (as transformers 4.52 and later
  // save it).
  std::string base = "model.";
  if (c.conditionalGeneration()) {
    base = source.has("language_model.model.embed_tokens.weight") ? "language_model.model."
                                                                  : "model.language_model.";
  }
  ModelWeights& w = model->weights_;
  w.embed_tokens =
      source.matrix(base + "embed_tokens.weight", c.vocab_size, hidden, /*quantizable=*/false);
  // Grown as layers are found: a config.json claiming a million layers
  // fails at the first missing one, not after reserving room for all.
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = base + "layers." + std::to_string(i) + ".";
    LayerWeights& layer = w.layers.emplace_back();
    if (c.fusedQkv()) {
      // Phi-3 holds q, k and v as one matrix, in that order.
      const std::vector<kernels::WeightView> qkv = source.rowRanges(
          prefix + "self_attn.qkv_proj.weight", {q_size, kv_size, kv_size}, hidden);
      layer.q_proj = qkv[0];
      layer.k_proj = qkv[1];
      layer.v_proj = qkv[2];
    } else {
      layer.q_proj = source.matrix(prefix + "self_attn.q_proj.weight", q_size, hidden);
      layer.k_proj = source.matrix(prefix + "self_attn.k_proj.weight", kv_size, hidden);
      layer.v_proj = source.matrix(prefix + "self_attn.v_proj.weight", kv_size, hidden);
    }
    layer.o_proj = source.matrix(prefix + "self_attn.o_proj.weight", hidden, q_size);
    if (c.attention_bias && c.architecture != "Qwen2ForCausalLM" && !c.qwen2Moe() && !c.glm &&
        !c.glm4Moe() && !c.gptOss()) {
      // transformers' Llama and Qwen3 give o_proj a bias too when
      // attention_bias is set (Qwen2's and GLM's q/k/v biases leave it
      // without one); that addition is not implemented, and leaving it out
      // would change every output.
      throw Error("tensor " + prefix + "self_attn.o_proj.bias: " + kConfigFile +
                  " sets attention_bias, which gives " + c.architecture +
                  "'s o_proj a bias; biases after o_proj are not supported (accepted: "
                  "attention_bias false, or the q/k/v biases of Qwen2ForCausalLM, "
                  "Qwen2MoeForCausalLM, GlmForCausalLM, Glm4ForCausalLM and "
                  "Glm4MoeForCausalLM, or GptOssForCausalLM's, with o_proj's)");
    }
    if (c.attention_bias) {
      layer.q_bias = source.vector(prefix + "self_attn.q_proj.bias", q_size);
      layer.k_bias = source.vector(prefix + "self_attn.k_proj.bias", kv_size);
      layer.v_bias = source.vector(prefix + "self_attn.v_proj.bias", kv_size);
      if (c.gptOss()) layer.o_bias = source.vector(prefix + "self_attn.o_proj.bias", hidden);
    }
    if (c.gptOss()) layer.sinks = source.vector(prefix + "self_attn.sinks", c.num_attention_heads);
    if (c.qk_norm) {
      // OLMo 2 and OLMoE normalize all heads of q (of k) as one vector.
      layer.q_norm =
          source.vector(prefix + "self_attn.q_norm.weight", c.fullQkNorm() ? q_size : c.head_dim);
      layer.k_norm =
          source.vector(prefix + "self_attn.k_norm.weight", c.fullQkNorm() ? kv_size : c.head_dim);
    }
    if (c.gptOss()) {
      loadGptOssExperts(source, c, prefix, layer);
    } else if (c.isMoeLayer(i)) {
      loadExperts(source, c, i, layer);
    } else if (c.fusedGateUp()) {
      // Phi-3 and GLM hold gate and up as one, gate first (transformers'
      // chunk(2)).
      const std::vector<kernels::WeightView> gate_up =
          source.rowRanges(prefix + "mlp.gate_up_proj.weight", {inter, inter}, hidden);
      layer.gate_proj = gate_up[0];
      layer.up_proj = gate_up[1];
      layer.down_proj = source.matrix(prefix + "mlp.down_proj.weight", hidden, inter);
    } else {
      layer.gate_proj = source.matrix(prefix + "mlp.gate_proj.weight", inter, hidden);
      layer.up_proj = source.matrix(prefix + "mlp.up_proj.weight", inter, hidden);
      layer.down_proj = source.matrix(prefix + "mlp.down_proj.weight", hidden, inter);
    }
    const std::string attn = prefix + "self_attn.";
    try {
      layer.k_cache_scale =
          source.scale({attn + "k_scale", attn + "k_proj.output_scale", attn + "kv_scale"});
      layer.v_cache_scale =
          source.scale({attn + "v_scale", attn + "v_proj.output_scale", attn + "kv_scale"});
    } catch (const Error& e) {
      // Only an fp8 KV cache uses them (kvCacheScales refuses then); the
      // model still serves a bf16 or f32 cache.
      if (model->kv_cache_scales_error_.empty()) model->kv_cache_scales_error_ = e.what();
    }
    if (!c.olmo2) {  // OLMo 2 normalizes the attention's output, not its input
      layer.input_layernorm = source.vector(prefix + "input_layernorm.weight", hidden);
    }
    if (c.glm4) {
      // GLM-4's names for the sandwich's places: post_self_attn_layernorm
      // after attention, post_attention_layernorm (Llama's name) before
      // the MLP, post_mlp_layernorm after it.
      layer.post_attention_layernorm =
          source.vector(prefix + "post_self_attn_layernorm.weight", hidden);
      layer.pre_feedforward_layernorm =
          source.vector(prefix + "post_attention_layernorm.weight", hidden);
      layer.post_feedforward_layernorm =
          source.vector(prefix + "post_mlp_layernorm.weight", hidden);
    } else {
      layer.post_attention_layernorm =
          source.vector(prefix + "post_attention_layernorm.weight", hidden);
    }
    if (c.olmo2) {
      layer.post_feedforward_layernorm =
          source.vector(prefix + "post_feedforward_layernorm.weight", hidden);
    }
    if (c.gemma) {
      layer.pre_feedforward_layernorm =
          source.vector(prefix + "pre_feedforward_layernorm.weight", hidden);
      layer.post_feedforward_layernorm =
          source.vector(prefix + "post_feedforward_layernorm.weight", hidden);
      for (std::vector<float>* norm :
           {&layer.input_layernorm, &layer.post_attention_layernorm,
            &layer.pre_feedforward_layernorm, &layer.post_feedforward_layernorm, &layer.q_norm,
            &layer.k_norm}) {
        addOne(*norm);
      }
    }
  }
  w.norm = source.vector(base + "norm.weight", hidden);
  if (c.gemma) addOne(w.norm);
  // A tied checkpoint may still carry lm_head.weight; the embedding wins, as
  // in transformers. A checkpoint with a vision tower saved before
  // transformers 4.52 has it under language_model.
  const std::string lm_head =
      base == "language_model.model." ? "language_model.lm_head.weight" : "lm_head.weight";
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : source.matrix(lm_head, c.vocab_size, hidden);

  model->weight_dtype_ = *source.matrix_dtype;
  model->weight_bytes_ = source.used_bytes;
  const auto check_start = std::chrono::steady_clock::now();
  model->checked_bytes_ = source.checkFinite();
  model->check_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - check_start).count();
  return model;
}

std::vector<float> Model::kvCacheScales() const {
  if (!kv_cache_scales_error_.empty()) {
    throw Error(kv_cache_scales_error_ +
                "; an fp8 KV cache needs usable K/V scales (--kv-dtype "
                "bf16 or f32 does not read them)");
  }
  std::vector<float> scales;
  bool any = false;
  for (const LayerWeights& layer : weights_.layers) {
    scales.push_back(layer.k_cache_scale.value_or(1.0f));
    scales.push_back(layer.v_cache_scale.value_or(1.0f));
    any = any || layer.k_cache_scale || layer.v_cache_scale;
  }
  if (!any) scales.clear();
  return scales;
}

const std::string& Model::weightsDigest() const {
  std::call_once(digest_once_, [this] {
    std::vector<std::future<uint64_t>> digests;
    for (const auto& file : files_) {
      digests.push_back(
          std::async(std::launch::async, [f = file.get()] { return f->contentDigest(); }));
    }
    std::vector<uint64_t> parts;
    for (auto& digest : digests) parts.push_back(digest.get());
    weights_digest_ = hex64(XXH3_64bits(parts.data(), parts.size() * sizeof(uint64_t)));
  });
  return weights_digest_;
}

size_t Model::dropMappedPages(const kernels::WeightView& w) const {
  // MXFP4 matrices are only ever read from the mapping (no backend copies
  // them; a view may be every other row).
  if (w.layout == kernels::WeightLayout::kMxfp4) return 0;
  size_t dropped = 0;
  for (const auto& file : files_) dropped += file->dropPages(w.data, kernels::viewBytes(w));
  return dropped;
}

}  // namespace tandem::engine
