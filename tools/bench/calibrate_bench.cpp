#include "tools/bench/calibrate_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "agent/engine/simulation/step_profile.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One step of the grid and the runner inputs that make it.
struct GridStep {
  std::string label;
  std::vector<engine::StepChunk> chunks;
  std::vector<std::vector<TokenId>> tokens;                // per chunk
  std::vector<std::vector<engine::BlockId>> block_tables;  // per chunk
  std::vector<engine::SequenceInput> batch;
  engine::StepShape shape;
  std::vector<double> runs_s;
  double observed_s = 0.0;
};

void addUnique(std::vector<int64_t>& values, int64_t value) {
  if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
}

// Shapes within a context of `context` positions: prefill chunks of three
// sizes after three cached lengths, decode batches of four sizes at three
// context lengths, and prefill chunks sharing a step with decode batches.
std::vector<GridStep> calibrationGrid(int64_t context) {
  std::vector<GridStep> grid;
  auto add = [&grid](std::string label, std::vector<engine::StepChunk> chunks) {
    GridStep step;
    step.label = std::move(label);
    step.chunks = std::move(chunks);
    grid.push_back(std::move(step));
  };
  std::vector<int64_t> prefill_starts, decode_contexts;
  for (int64_t start : {int64_t{0}, context / 4, context * 3 / 4}) addUnique(prefill_starts, start);
  for (int64_t past : {context / 16, context / 4, context * 3 / 4}) {
    if (past >= 1) addUnique(decode_contexts, past);
  }
  for (int64_t start : prefill_starts) {
    for (int64_t size : {16, 64, 256}) {
      if (start + size > context) continue;
      add("prefill " + std::to_string(size) + " after " + std::to_string(start),
          {{start, size, true}});
    }
  }
  for (int64_t past : decode_contexts) {
    if (past + 1 > context) continue;
    for (int64_t batch : {1, 4, 16, 32}) {
      add("decode " + std::to_string(batch) + " x " + std::to_string(past),
          std::vector<engine::StepChunk>(batch, {past, 1, false}));
    }
  }
  const int64_t mixed_past = context / 4;
  for (int64_t size : {64, 256}) {
    for (int64_t batch : {4, 16}) {
      if (size > context || mixed_past < 1) continue;
      std::vector<engine::StepChunk> chunks(batch, {mixed_past, 1, false});
      chunks.insert(chunks.begin(), {0, size, true});
      add("prefill " + std::to_string(size) + " + decode " + std::to_string(batch) + " x " +
              std::to_string(mixed_past),
          std::move(chunks));
    }
  }
  return grid;
}

int64_t blocksFor(int64_t positions, int64_t block_size) {
  return (positions + block_size - 1) / block_size;
}

std::string defaultName(const CalibrateBenchOptions& options) {
  std::filesystem::path dir = std::filesystem::path(options.model_dir).lexically_normal();
  std::string base = dir.filename().string();
  if (base.empty()) base = dir.parent_path().filename().string();
  return options.device + "-" + (base.empty() ? std::string("model") : base);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

int runCalibrateBench(const CalibrateBenchOptions& options) {
  if (options.samples < 1) {
    throw Error("--samples must be at least 1, got " + std::to_string(options.samples));
  }
  if (options.block_size < 1) {
    throw Error("--block-size must be at least 1, got " + std::to_string(options.block_size));
  }
  const DType kv_dtype = engine::kvDtypeFromName(options.kv_dtype);
  if (options.threads > 0) kernels::setNumThreads(options.threads);
  std::unique_ptr<kernels::Backend> backend =
      kernels::makeBackend(kernels::resolveDevice(options.device));
  auto model = engine::Model::load(options.model_dir);
  const auto& config = model->config();

  if (options.context < 0) {
    throw Error("--context must be 0 (the model's, at most 4096) or a position count, got " +
                std::to_string(options.context));
  }
  const int64_t context =
      std::min(config.max_position_embeddings, options.context > 0 ? options.context : 4096);
  std::vector<GridStep> grid = calibrationGrid(context);
  if (grid.empty()) {
    throw Error("a context of " + std::to_string(context) +
                " positions holds none of the calibration shapes (at least 16 are needed)");
  }
  // Every chunk of a step owns its blocks; steps reuse the same blocks (the
  // cache's contents do not change the work done).
  int64_t num_blocks = 1;
  for (const GridStep& step : grid) {
    int64_t blocks = 0;
    for (const auto& chunk : step.chunks) {
      blocks += blocksFor(chunk.start_position + chunk.num_tokens, options.block_size);
    }
    num_blocks = std::max(num_blocks, blocks);
  }
  engine::KvCacheConfig kv = engine::KvCacheConfig::forModel(*model, kv_dtype, options.block_size);
  kv.num_blocks = num_blocks;
  engine::KvCache cache(kv, engine::slabAllocatorFor(*backend));
  engine::ModelRunner runner(*model, cache, *backend);

  std::mt19937 rng(42);
  std::uniform_int_distribution<TokenId> token_dist(0, static_cast<TokenId>(config.vocab_size - 1));
  for (GridStep& step : grid) {
    engine::BlockId next_block = 0;
    step.tokens.resize(step.chunks.size());
    step.block_tables.resize(step.chunks.size());
    for (size_t c = 0; c < step.chunks.size(); ++c) {
      const auto& chunk = step.chunks[c];
      step.tokens[c].resize(chunk.num_tokens);
      for (TokenId& t : step.tokens[c]) t = token_dist(rng);
      step.block_tables[c].resize(
          blocksFor(chunk.start_position + chunk.num_tokens, options.block_size));
      std::iota(step.block_tables[c].begin(), step.block_tables[c].end(), next_block);
      next_block += static_cast<engine::BlockId>(step.block_tables[c].size());
    }
    for (size_t c = 0; c < step.chunks.size(); ++c) {
      step.batch.push_back({step.tokens[c], step.chunks[c].start_position, step.block_tables[c]});
    }
    step.shape = engine::stepShapeOf(step.chunks, options.block_size);
  }

  std::vector<float> logits;
  auto runStep = [&](GridStep& step) {
    const auto start = Clock::now();
    runner.forward(step.batch, logits);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  // A warm-up round (weights paged in, scratch grown to every shape), then
  // rounds over the whole grid.
  for (GridStep& step : grid) runStep(step);
  for (int round = 0; round < options.samples; ++round) {
    std::fprintf(stderr, "calibrate: round %d of %d over %zu shapes\n", round + 1, options.samples,
                 grid.size());
    for (GridStep& step : grid) step.runs_s.push_back(runStep(step));
  }
  std::vector<engine::StepSample> samples;
  for (GridStep& step : grid) {
    step.observed_s = median(step.runs_s);
    samples.push_back({step.shape, step.observed_s});
  }

  engine::StepProfile base;
  base.name = options.name.empty() ? defaultName(options) : options.name;
  base.model.vocab_size = config.vocab_size;
  base.model.max_position_embeddings = config.max_position_embeddings;
  base.model.kv_bytes_per_token = kv.blockBytes() / options.block_size;
  auto fitted = engine::fitStepProfile(samples, base);
  if (!fitted.isOk()) throw Error("calibrate: " + fitted.status().message());
  engine::StepFit& fit = *fitted;

  char description[1024];
  std::snprintf(
      description, sizeof(description),
      "Measured by tandem-bench calibrate on %s: model %s (%lld layers, "
      "hidden %lld, %s weights), KV %s, block %d; %zu step shapes, median of %d runs each. "
      "Fit: mean relative error %.1f%%, max %.1f%%, R^2 %.4f.",
      backend->description().c_str(), options.model_dir.c_str(),
      static_cast<long long>(config.num_hidden_layers), static_cast<long long>(config.hidden_size),
      dtypeShortName(model->weightDType()), options.kv_dtype.c_str(), options.block_size,
      grid.size(), options.samples, fit.mean_relative_error * 100.0, fit.max_relative_error * 100.0,
      fit.r_squared);
  fit.profile.description = description;

  std::printf("tandem-bench calibrate: %s on %s, %zu shapes x %d runs (median)\n",
              options.model_dir.c_str(), backend->description().c_str(), grid.size(),
              options.samples);
  std::printf("%-34s %8s %6s %9s %12s %12s %8s\n", "shape", "prefill", "decode", "context",
              "observed ms", "predicted ms", "error");
  for (size_t i = 0; i < grid.size(); ++i) {
    const GridStep& step = grid[i];
    const double error = (fit.predicted[i] - step.observed_s) / step.observed_s;
    std::printf("%-34s %8lld %6lld %9lld %12.3f %12.3f %7.1f%%\n", step.label.c_str(),
                static_cast<long long>(step.shape.prefill_tokens),
                static_cast<long long>(step.shape.decode_sequences),
                static_cast<long long>(step.shape.context_tokens), step.observed_s * 1e3,
                fit.predicted[i] * 1e3, error * 100.0);
  }
  std::printf("fit: mean relative error %.1f%%, max relative error %.1f%%, R^2 %.4f\n",
              fit.mean_relative_error * 100.0, fit.max_relative_error * 100.0, fit.r_squared);
  const std::string yaml = fit.profile.toYaml();
  std::printf("profile:\n%s", yaml.c_str());

  if (!options.out_path.empty()) {
    std::ofstream file(options.out_path);
    if (!file) throw Error("cannot write --out file " + options.out_path);
    file << "# Written by `tandem-bench calibrate`; see docs/profiles.md.\n" << yaml;
    if (!file) throw Error("cannot write --out file " + options.out_path);
  }
  if (!options.json_path.empty()) {
    nlohmann::json shapes = nlohmann::json::array();
    for (size_t i = 0; i < grid.size(); ++i) {
      const GridStep& step = grid[i];
      shapes.push_back({
          {"label", step.label},
          {"prefill_tokens", step.shape.prefill_tokens},
          {"decode_sequences", step.shape.decode_sequences},
          {"context_tokens", step.shape.context_tokens},
          {"prefill_context_products", step.shape.prefill_context_products},
          {"kv_blocks_read", step.shape.kv_blocks_read},
          {"observed_s", step.observed_s},
          {"predicted_s", fit.predicted[i]},
          {"relative_error", (fit.predicted[i] - step.observed_s) / step.observed_s},
          {"runs_s", step.runs_s},
      });
    }
    const engine::StepProfile& p = fit.profile;
    nlohmann::json out = {
        {"model", options.model_dir},
        {"device", kernels::deviceKindName(backend->kind())},
        {"device_description", backend->description()},
        {"isa", kernels::isaName()},
        {"threads", kernels::numThreads()},
        {"kv_dtype", options.kv_dtype},
        {"block_size", options.block_size},
        {"samples", options.samples},
        {"profile",
         {{"name", p.name},
          {"description", p.description},
          {"base_s", p.base_s},
          {"prefill_token_s", p.prefill_token_s},
          {"decode_sequence_s", p.decode_sequence_s},
          {"context_token_s", p.context_token_s},
          {"prefill_context_s", p.prefill_context_s},
          {"kv_block_s", p.kv_block_s},
          {"vocab_size", p.model.vocab_size},
          {"max_position_embeddings", p.model.max_position_embeddings},
          {"kv_bytes_per_token", p.model.kv_bytes_per_token}}},
        {"fit",
         {{"mean_relative_error", fit.mean_relative_error},
          {"max_relative_error", fit.max_relative_error},
          {"r_squared", fit.r_squared}}},
        {"shapes", shapes},
    };
    if (!options.out_path.empty()) out["profile_path"] = options.out_path;
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return 0;
}

}  // namespace tandem::bench
