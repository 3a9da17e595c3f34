#include "tools/bench/engine_bench.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/lora.h"
#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "agent/engine/sampler.h"
#include "common/hex.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels.h"
#include "kernels/profiling_backend.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double bestSeconds(int repeats, Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// The last step's rows sampled with temperature 0.6 and top-p 0.9 (a seed
// per row), on the kernels' threads and on one: each best of `repeats`.
struct SampledRows {
  double pool_s = 0.0;
  double one_thread_s = 0.0;
  bool identical = true;
};
SampledRows sampleLastStep(std::span<const float> logits, int64_t rows, int64_t vocab_size,
                           int repeats) {
  protocol::SamplingParams params;
  params.temperature = 0.6f;
  params.top_p = 0.9f;
  std::vector<engine::SamplerInput> inputs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    engine::SamplerInput& input = inputs[static_cast<size_t>(r)];
    input.logits =
        logits.subspan(static_cast<size_t>(r * vocab_size), static_cast<size_t>(vocab_size));
    input.params = &params;
    input.rng = engine::SamplerRng{static_cast<uint64_t>(r) + 1};
  }
  engine::SamplerPool pool;
  engine::Sampler one;
  std::vector<protocol::GeneratedToken> pooled, alone(inputs.size());
  SampledRows out;
  out.pool_s = bestSeconds(repeats, [&] { pooled = pool.sampleRows(inputs); });
  out.one_thread_s = bestSeconds(repeats, [&] {
    for (size_t r = 0; r < inputs.size(); ++r) alone[r] = one.sample(inputs[r]);
  });
  for (size_t r = 0; r < inputs.size(); ++r) out.identical &= pooled[r].token == alone[r].token;
  return out;
}

// XXH3-64 of logits' bits, 16 hex digits: two runs (kernel sets, the
// candidates for the next defaults) with equal digests gave equal logits
// bit for bit.
std::string logitsDigest(std::span<const float> logits) {
  return hex64(XXH3_64bits(logits.data(), logits.size_bytes()));
}

// `measure` summed over the matrices of one token's forward pass: every
// layer's projections (in a mixture layer, the router and
// num_experts_per_tok experts), and the LM head counted `lm_head_share`
// times.
template <typename Measure>
double sumOverMatmuls(const engine::Model& model, double lm_head_share, const Measure& measure) {
  double sum = lm_head_share * measure(model.weights().lm_head);
  for (const auto& layer : model.weights().layers) {
    for (const kernels::WeightView* view :
         layer.tokenMatrices(model.config().num_experts_per_tok)) {
      sum += measure(*view);
    }
  }
  return sum;
}

// Flops of the matmuls of a prompt of `prompt_tokens` tokens, per token:
// every layer's projections for each token, the LM head for the last one.
double prefillMatmulFlopsPerToken(const engine::Model& model, int64_t prompt_tokens) {
  return sumOverMatmuls(model, 1.0 / static_cast<double>(prompt_tokens),
                        [](const kernels::WeightView& w) {
                          return 2.0 * static_cast<double>(w.rows) * static_cast<double>(w.cols);
                        });
}

// Bytes of weights one decode step of `batch` sequences reads: every matrix
// once, plus lm_head. In a mixture layer, the router and the experts the
// batch's tokens choose, counted as E (1 - (1 - k / E)^batch) of the E
// experts: their expected number were each token's k choices uniform and
// the tokens independent (k at batch 1, all E as the batch grows).
double decodeWeightBytes(const engine::Model& model, int64_t batch) {
  const engine::ModelConfig& config = model.config();
  // An fp8 matrix reads its scales too.
  auto bytes = [](const kernels::WeightView& w) {
    return static_cast<double>(kernels::viewBytes(w)) +
           static_cast<double>(w.scaleCount()) * sizeof(float);
  };
  double sum = bytes(model.weights().lm_head);
  for (const auto& layer : model.weights().layers) {
    for (const kernels::WeightView* view : layer.matrices()) sum += bytes(*view);
    if (layer.experts.empty()) continue;
    const engine::ExpertWeights& expert = layer.experts.front();
    const double experts = static_cast<double>(config.num_experts);
    const double chosen =
        experts * (1.0 - std::pow(1.0 - static_cast<double>(config.num_experts_per_tok) / experts,
                                  static_cast<double>(batch)));
    sum += bytes(layer.router) +
           chosen * (bytes(expert.gate_proj) + bytes(expert.up_proj) + bytes(expert.down_proj));
  }
  return sum;
}

double memcpyGBps(int repeats) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double seconds = bestSeconds(repeats, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  // Keep the copy observable.
  if (dst[bytes / 2] != 1) std::fprintf(stderr, "memcpy check failed\n");
  return static_cast<double>(bytes) / seconds / 1e9;
}

// Read bandwidth with `threads` threads each summing its slice of a buffer
// larger than any cache: the ceiling for streaming weights in decode.
double readGBps(int threads, int repeats) {
  const size_t count = (size_t{512} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> data(count, 1);
  std::vector<uint64_t> sums(threads, 0);
  double seconds = bestSeconds(repeats, [&] {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        size_t begin = count * t / threads, end = count * (t + 1) / threads;
        uint64_t a = 0, b = 0, c = 0, d = 0;
        for (size_t i = begin; i + 3 < end; i += 4) {
          a += data[i];
          b += data[i + 1];
          c += data[i + 2];
          d += data[i + 3];
        }
        sums[t] = a + b + c + d;
      });
    }
    for (auto& worker : workers) worker.join();
  });
  uint64_t total = std::accumulate(sums.begin(), sums.end(), uint64_t{0});
  if (total != count) std::fprintf(stderr, "read check failed\n");
  return static_cast<double>(count * sizeof(uint64_t)) / seconds / 1e9;
}

// `w` as the CPU backend gives it to matmul (packed for bf16 compute).
double gemmGflops(int64_t m, const kernels::WeightView& w, int repeats) {
  std::vector<float> x(static_cast<size_t>(m * w.cols)), y(static_cast<size_t>(m * w.rows));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  kernels::matmul(x.data(), m, w.cols, w, y.data());  // warm-up
  double seconds = bestSeconds(repeats, [&] { kernels::matmul(x.data(), m, w.cols, w, y.data()); });
  return 2.0 * static_cast<double>(m) * static_cast<double>(w.rows) * static_cast<double>(w.cols) /
         seconds / 1e9;
}

// --bf16-gemm-configs: the matrices of `layer` (a mixture's router and
// first expert) multiplied by m rows of
// random activations on a CUDA backend with the fast kernels and bf16
// compute, once per configuration of the bf16 GEMM (the same bits in each:
// checked here on the outputs), each configuration's layer timed over 10
// back-to-back calls per matrix (best of `repeats`) after a warm-up.
nlohmann::json bf16GemmConfigs(const engine::LayerWeights& layer, int64_t m, int repeats) {
  constexpr int kCalls = 10;
  const auto& shapes = kernels::kBf16GemmConfigShapes;
  double flops = 0.0;
  for (const kernels::WeightView* w : layer.tokenMatrices(1)) {
    flops += 2.0 * static_cast<double>(m) * static_cast<double>(w->rows * w->cols);
  }
  std::vector<std::vector<float>> first_outputs;
  nlohmann::json rows = nlohmann::json::array();
  double seconds0 = 0.0;
  std::printf("bf16 GEMM configurations (layer 0's matmuls, m = %lld, %d calls each, best of %d)\n",
              static_cast<long long>(m), kCalls, repeats);
  for (int config = 0; config < kernels::kBf16GemmConfigs; ++config) {
    std::unique_ptr<kernels::Backend> backend;
    try {
      backend = kernels::makeBackend(
          kernels::DeviceKind::kCuda,
          {.cuda_kernels = kernels::CudaKernels::kFast, .bf16_gemm_config = config});
    } catch (const Error& e) {
      // The wgmma configurations exist on compute capability 9.0 only.
      if (config == 0) throw;
      std::printf("  %d (%s): not run: %s\n", config, shapes[config], e.what());
      rows.push_back({{"config", config}, {"shape", shapes[config]}, {"not_run", e.what()}});
      continue;
    }
    backend->setComputeDType(DType::kBF16);
    struct Call {
      kernels::WeightView w;
      float* x = nullptr;
      float* y = nullptr;
      size_t x_bytes = 0;
      size_t y_bytes = 0;
    };
    std::vector<Call> calls;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (const kernels::WeightView* w : layer.tokenMatrices(1)) {
      Call call;
      call.w = backend->matmulWeight(*w);
      call.x_bytes = static_cast<size_t>(m * w->cols) * sizeof(float);
      call.y_bytes = static_cast<size_t>(m * w->rows) * sizeof(float);
      call.x = static_cast<float*>(backend->allocate(call.x_bytes));
      call.y = static_cast<float*>(backend->allocate(call.y_bytes));
      if (call.x == nullptr || call.y == nullptr) {
        throw Error("--bf16-gemm-configs: the device cannot hold the activations");
      }
      std::vector<float> x(static_cast<size_t>(m * w->cols));
      for (float& v : x) v = dist(rng);
      backend->copyFromHost(call.x, x.data(), call.x_bytes);
      calls.push_back(call);
    }
    auto layerCalls = [&](int times) {
      for (const Call& call : calls) {
        for (int i = 0; i < times; ++i) {
          backend->matmul(call.x, m, call.w.cols, call.w, call.y);
        }
      }
      backend->synchronize();
    };
    layerCalls(1);  // warm-up
    bool same_bits = true;
    for (size_t i = 0; i < calls.size(); ++i) {
      std::vector<float> y(calls[i].y_bytes / sizeof(float));
      backend->copyToHost(y.data(), calls[i].y, calls[i].y_bytes);
      if (config == 0) {
        first_outputs.push_back(std::move(y));
      } else if (std::memcmp(y.data(), first_outputs[i].data(), calls[i].y_bytes) != 0) {
        same_bits = false;
      }
    }
    const double seconds = bestSeconds(repeats, [&] { layerCalls(kCalls); }) / kCalls;
    if (config == 0) seconds0 = seconds;
    const double tflops = flops / seconds / 1e12;
    std::printf("  %d (%s): %9.3f ms per layer, %7.1f TFLOP/s, %5.2fx configuration 0%s\n", config,
                shapes[config], seconds * 1e3, tflops, seconds0 / seconds,
                same_bits ? ""
                : !kernels::bf16GemmIsWgmma(config)
                    ? ", OUTPUTS DIFFER"
                    : ", outputs differ (HGMMA rounds a k16 step otherwise than HMMA)");
    rows.push_back({{"config", config},
                    {"shape", shapes[config]},
                    {"layer_ms", seconds * 1e3},
                    {"tflops", tflops},
                    {"speed_over_config0", seconds0 / seconds},
                    {"same_bits_as_config0", same_bits}});
    for (const Call& call : calls) {
      backend->release(call.x, call.x_bytes);
      backend->release(call.y, call.y_bytes);
    }
    for (const kernels::WeightView* w : layer.tokenMatrices(1)) backend->releaseWeight(*w);
  }
  return rows;
}

// Backend::copy of one buffer of `bytes` to another in the backend's own
// memory (device to device on CUDA, memcpy on the CPU): bytes copied per
// second. A copy reads and writes each byte, so memory traffic is twice this.
double backendCopyGBps(kernels::Backend& backend, size_t bytes, int repeats) {
  void* src = backend.allocate(bytes);
  void* dst = backend.allocate(bytes);
  if (src == nullptr || dst == nullptr) {
    if (src != nullptr) backend.release(src, bytes);
    if (dst != nullptr) backend.release(dst, bytes);
    throw Error("--copy-mib: the backend cannot allocate two buffers of " +
                std::to_string(bytes >> 20) + " MiB; pass a smaller --copy-mib");
  }
  // Non-zero contents, so no page is left untouched (allocate() zero-fills).
  std::vector<uint8_t> pattern(std::min<size_t>(bytes, size_t{64} << 20), 0x5a);
  for (size_t offset = 0; offset < bytes; offset += pattern.size()) {
    backend.copyFromHost(static_cast<uint8_t*>(src) + offset, pattern.data(),
                         std::min(pattern.size(), bytes - offset));
  }
  backend.copy(dst, src, bytes);  // warm-up
  backend.synchronize();
  const double seconds = bestSeconds(repeats, [&] {
    backend.copy(dst, src, bytes);
    backend.synchronize();
  });
  uint8_t probe = 0;
  backend.copyToHost(&probe, static_cast<uint8_t*>(dst) + bytes / 2, 1);
  if (probe != 0x5a) std::fprintf(stderr, "backend copy check failed\n");
  backend.release(src, bytes);
  backend.release(dst, bytes);
  return static_cast<double>(bytes) / seconds / 1e9;
}

// A step's logits (`floats` of them) copied back from a device backend, as a
// step sampled on the host takes them: into a pageable vector and into the
// page-locked buffer the model runner keeps (engine::PinnedHostFloats), ms
// each, best of `repeats`, one after the other.
struct LogitsCopyBack {
  double pageable_ms = 0.0;
  double page_locked_ms = 0.0;
};
LogitsCopyBack logitsCopyBack(kernels::Backend& backend, size_t floats, int repeats) {
  const size_t bytes = floats * sizeof(float);
  void* logits = backend.allocate(bytes);
  if (logits == nullptr) throw Error("the backend cannot hold " + std::to_string(bytes) + " bytes");
  std::vector<float> pageable(floats);
  engine::PinnedHostFloats page_locked(backend);
  float* locked = page_locked.take(floats).data();
  LogitsCopyBack result;
  for (auto [host, ms] : {std::pair{pageable.data(), &result.pageable_ms},
                          std::pair{locked, &result.page_locked_ms}}) {
    backend.copyToHost(host, logits, bytes);  // warm-up
    *ms = bestSeconds(repeats, [&] { backend.copyToHost(host, logits, bytes); }) * 1e3;
  }
  backend.release(logits, bytes);
  return result;
}

// One pass's calls, as `tandem-bench engine --profile-ops` prints them: per
// step (the pass's calls divided by `steps`), slowest first, with the bytes
// each must read as GB/s and as a share of the device's copy traffic.
nlohmann::json printOps(const char* title, const std::vector<kernels::OpProfile>& ops,
                        int64_t steps, double copy_traffic_gbps) {
  double total_s = 0.0;
  for (const auto& op : ops) total_s += op.seconds;
  const double per_step = 1.0 / static_cast<double>(steps);
  std::printf("\n%s: %.3f ms per step in %zu kinds of call (each timed alone)\n", title,
              total_s * per_step * 1e3, ops.size());
  std::printf("%-52s %9s %10s %7s %9s %8s %9s\n", "call", "per step", "ms/step", "share", "GB/s",
              "÷ copy", "GFLOP/s");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& op : ops) {
    const double gbps = op.bytes > 0.0 ? op.bytes / op.seconds / 1e9 : 0.0;
    std::printf("%-52s %9.1f %10.4f %7.3f ", op.op.c_str(),
                static_cast<double>(op.calls) * per_step, op.seconds * per_step * 1e3,
                op.seconds / total_s);
    if (gbps > 0.0) {
      std::printf("%9.1f %8.3f", gbps, gbps / copy_traffic_gbps);
    } else {
      std::printf("%9s %8s", "-", "-");
    }
    if (op.flops > 0.0) {
      std::printf(" %9.1f\n", op.flops / op.seconds / 1e9);
    } else {
      std::printf(" %9s\n", "-");
    }
    rows.push_back({{"call", op.op},
                    {"calls_per_step", static_cast<double>(op.calls) * per_step},
                    {"seconds_per_step", op.seconds * per_step},
                    {"bytes_per_step", op.bytes * per_step},
                    {"flops_per_step", op.flops * per_step}});
  }
  return {{"seconds_per_step", total_s * per_step}, {"calls", rows}};
}

}  // namespace

int runEngineBench(const EngineBenchOptions& options) {
  if (options.threads > 0) kernels::setNumThreads(options.threads);
  const kernels::DeviceKind device = kernels::resolveDevice(options.device);
  const DType compute = kernels::parseComputeDType(options.compute_dtype, "--compute-dtype");
  // The bf16 GEMM configurations and the deep decode loads are the CUDA
  // backend's bf16 kernels.
  for (const auto& [used, flag] :
       {std::pair{options.bf16_gemm_config != kernels::kBf16GemmServing, "--bf16-gemm-config"},
        std::pair{options.bf16_gemm_configs, "--bf16-gemm-configs"},
        std::pair{options.deep_skinny, "--deep-skinny"}}) {
    if (used && (device != kernels::DeviceKind::kCuda || compute != DType::kBF16)) {
      throw Error(std::string(flag) + ": only with --device cuda and --compute-dtype bf16");
    }
  }
  const kernels::CudaKernels cuda_kernels =
      kernels::resolveCudaKernels(options.cuda_kernels, "--cuda-kernels", device);
  for (const auto& [asked, flag] : {std::pair{options.compact_attention, "--compact-attention"},
                                    std::pair{options.deep_attention, "--deep-attention"}}) {
    if (asked &&
        (device != kernels::DeviceKind::kCuda || cuda_kernels != kernels::CudaKernels::kFlash)) {
      throw Error(std::string(flag) + ": only with --device cuda and --cuda-kernels flash");
    }
  }
  std::unique_ptr<kernels::Backend> backend =
      kernels::makeBackend(device, {.cuda_kernels = cuda_kernels,
                                    .unordered_decode = options.unordered_decode,
                                    .deep_skinny = options.deep_skinny,
                                    .compact_attention = options.compact_attention,
                                    .deep_attention = options.deep_attention,
                                    .fused_launches = options.fuse_projections,
                                    .bf16_gemm_config = options.bf16_gemm_config});
  if (options.unordered_decode && compute != DType::kBF16) {
    throw Error(
        "--unordered-decode: only with --compute-dtype bf16 (it replaces the bf16 decode matmul)");
  }
  backend->setComputeDType(compute);
  auto model = engine::Model::load(options.model_dir);
  const auto& config = model->config();
  if (options.prompt_tokens + options.decode_tokens > config.max_position_embeddings) {
    throw Error("--prompt-tokens plus --decode-tokens must not exceed the model's context of " +
                std::to_string(config.max_position_embeddings));
  }
  const DType kv_dtype = engine::kvDtypeFromName(options.kv_dtype);

  if (options.batch < 1)
    throw Error("--batch must be at least 1, got " + std::to_string(options.batch));
  if (options.copy_mib < 1) {
    throw Error("--copy-mib must be at least 1, got " + std::to_string(options.copy_mib));
  }
  const int64_t blocks_per_sequence = (options.prompt_tokens + options.decode_tokens + 15) / 16;
  engine::KvCacheConfig kv = engine::KvCacheConfig::forModel(*model, kv_dtype, 16);
  kv.num_blocks = blocks_per_sequence * options.batch;
  engine::KvCache cache(kv, engine::slabAllocatorFor(*backend));
  // --profile-ops: the runner talks to the backend through a profiler, idle
  // (one forwarding call per op) until the figures below are measured.
  std::unique_ptr<kernels::ProfilingBackend> profiler;
  if (options.profile_ops) profiler = std::make_unique<kernels::ProfilingBackend>(*backend);
  engine::ModelRunnerOptions runner_options;
  runner_options.fuse_projections = options.fuse_projections;
  engine::ModelRunner runner(*model, cache,
                             profiler ? static_cast<kernels::Backend&>(*profiler) : *backend,
                             runner_options);
  // Sequence s owns blocks [s * blocks_per_sequence, (s + 1) * blocks_per_sequence).
  std::vector<std::vector<engine::BlockId>> block_tables(options.batch);
  std::vector<std::vector<TokenId>> prompts(options.batch);
  std::mt19937 rng(42);
  std::uniform_int_distribution<TokenId> token_dist(0, static_cast<TokenId>(config.vocab_size - 1));
  for (int64_t s = 0; s < options.batch; ++s) {
    block_tables[s].resize(blocks_per_sequence);
    std::iota(block_tables[s].begin(), block_tables[s].end(),
              static_cast<engine::BlockId>(s * blocks_per_sequence));
    prompts[s].resize(options.prompt_tokens);
    for (TokenId& t : prompts[s]) t = token_dist(rng);
  }
  const std::vector<engine::BlockId>& block_table = block_tables[0];
  const std::vector<TokenId>& prompt = prompts[0];

  const double copy_gbps =
      backendCopyGBps(*backend, static_cast<size_t>(options.copy_mib) << 20, options.repeats);

  // Where the logits live on the device: what a step sampled on the host
  // pays to bring them back.
  std::optional<LogitsCopyBack> copy_back;
  if (!backend->hostAccessible()) {
    copy_back = logitsCopyBack(*backend, static_cast<size_t>(options.batch * config.vocab_size),
                               options.repeats);
  }
  const double memcpy_gbps = memcpyGBps(options.repeats);
  const double read_gbps = readGBps(kernels::numThreads(), options.repeats);
  const auto& layer0 = model->weights().layers.at(0);
  // Layer 0's MLP: in a mixture layer, its first expert's.
  engine::ExpertWeights mlp0;
  if (layer0.experts.empty()) {
    mlp0.gate_proj = layer0.gate_proj;
    mlp0.up_proj = layer0.up_proj;
    mlp0.down_proj = layer0.down_proj;
  } else {
    mlp0 = layer0.experts.front();
  }
  const int64_t gemm_m = options.prompt_tokens;
  // The host GEMM figures run the CPU kernels on the weights the way the CPU
  // backend hands them to matmul (bf16 compute can only be on the CPU).
  kernels::cpu::CpuBackend host_kernels;
  host_kernels.setComputeDType(compute);
  const kernels::WeightView up_proj = host_kernels.matmulWeight(mlp0.up_proj);
  const double gemm_up_gflops = gemmGflops(gemm_m, up_proj, options.repeats);
  const double gemm_down_gflops =
      gemmGflops(gemm_m, host_kernels.matmulWeight(mlp0.down_proj), options.repeats);
  // The compute ceiling of the CPU kernels: fp32 FMAs, or bf16 dot products
  // where bf16 compute applies.
  const bool on_cpu = backend->kind() == kernels::DeviceKind::kCpu;
  const double fma_peak = on_cpu ? kernels::peakGflops(DType::kF32, options.repeats) : 0.0;
  const double bf16_peak = on_cpu ? kernels::peakGflops(DType::kBF16, options.repeats) : 0.0;
  const bool packed = up_proj.layout == kernels::WeightLayout::kBf16Pairs;
  const double compute_peak = packed && bf16_peak > 0.0 ? bf16_peak : fma_peak;

  std::vector<float> logits;
  engine::SequenceInput input;
  input.block_table = block_table;
  // The LoRA adapter every sequence runs with in the second pass (--lora):
  // loaded now, so a refusal comes before anything is measured.
  std::unique_ptr<engine::LoraAdapter> lora;
  int32_t lora_index = -1;
  if (!options.lora_dir.empty()) {
    lora = engine::LoraAdapter::load("bench", options.lora_dir, config);
    lora_index = runner.addAdapter(*lora);
  }
  int32_t adapter = -1;
  // The prompt's logits, left where the runner keeps them (as the engine
  // reads them), until its next forward pass.
  std::span<const float> prompt_logits;
  auto prefill = [&] {
    input.tokens = prompt;
    input.start_position = 0;
    input.adapter = adapter;
    prompt_logits = runner.forward({&input, 1});
  };
  prefill();  // warm-up: page in weights, grow scratch buffers
  const double prefill_s = bestSeconds(options.repeats, prefill);

  // Every sequence prefilled (untimed, one at a time), then `batch`
  // sequences decode together; each repeat decodes the same positions again
  // (the KV written there is overwritten in order), so only decode is timed.
  for (int64_t s = 1; s < options.batch; ++s) {
    engine::SequenceInput other{prompts[s], 0, block_tables[s]};
    runner.forward({&other, 1});
  }
  prefill();
  const std::vector<float> first_logits(prompt_logits.begin(), prompt_logits.end());
  std::vector<TokenId> first_tokens(options.batch);
  for (int64_t s = 0; s < options.batch; ++s) {
    // Sequence 0's first token comes from its logits; the others' from their
    // prompts' last token (their values do not change the work done).
    first_tokens[s] =
        s == 0 ? static_cast<TokenId>(kernels::argmax(first_logits.data(), config.vocab_size))
               : prompts[s].back();
  }
  std::vector<TokenId> next(options.batch);
  std::vector<engine::SequenceInput> batch(options.batch);
  // Greedy decode as the engine serves it (Engine::step's device argmax):
  // each step's next tokens picked where the logits are, only the ids
  // copied back. With `on_host` the steps bring every row's logits back,
  // as a step with a request sampled on the host does (into the runner's
  // page-locked buffer on a device), and pick the same tokens there; the
  // last step's logits are kept in `logits` for the replay check below.
  auto decodeSteps = [&](bool on_host) {
    next = first_tokens;
    std::span<const float> step_logits;
    for (int64_t i = 0; i < options.decode_tokens; ++i) {
      for (int64_t s = 0; s < options.batch; ++s) {
        batch[s] = {{&next[s], 1}, options.prompt_tokens + i, block_tables[s]};
        batch[s].adapter = adapter;
      }
      if (!on_host) {
        runner.forwardArgmax(batch, next);
        continue;
      }
      step_logits = runner.forward(batch);
      for (int64_t s = 0; s < options.batch; ++s) {
        next[s] = static_cast<TokenId>(
            kernels::argmax(step_logits.data() + s * config.vocab_size, config.vocab_size));
      }
    }
    if (on_host) logits.assign(step_logits.begin(), step_logits.end());
  };
  auto decode = [&] { decodeSteps(false); };
  decode();  // warm-up: scratch buffers at the batch's size, steps recorded
  const double decode_only_s = bestSeconds(options.repeats, decode);
  const std::vector<TokenId> decoded = next;
  // The same steps with the logits brought back and the tokens picked on
  // the host: what a step of sampled requests pays over a greedy one (the
  // copy, and the host's pass over the vocabulary), and the same tokens.
  decodeSteps(true);  // warm-up: the host buffer at the batch's size
  const double host_logits_s = bestSeconds(options.repeats, [&] { decodeSteps(true); });
  const bool host_tokens_equal = next == decoded;
  // The prompt's last logits and every row's at the last decode step (which
  // depend on every KV byte the prefills and steps wrote).
  const std::string prompt_digest = logitsDigest(first_logits);
  const std::string decode_digest = logitsDigest(logits);
  // A step's rows sampled on the host as the engine samples requests with
  // temperature and top-p (Llama 3.1's generation_config: 0.6 and 0.9), on
  // the kernels' threads (engine::SamplerPool, what the engine runs) and on
  // one, from the last step's logits: what a sampled batch adds to a step
  // between two forward passes. The same tokens either way, or the bench
  // fails.
  const SampledRows sampled =
      sampleLastStep(logits, options.batch, config.vocab_size, options.repeats);
  // Where the backend records decode steps (CUDA graphs), the same decode
  // run eagerly, in the same run: the figure for what recording saves, and a
  // check that replayed steps give the same logits bit for bit.
  const bool records = backend->decodeBucket(options.batch) > 0;
  double eager_s = 0.0;
  bool replay_exact = true;
  if (records) {
    decodeSteps(true);
    const std::vector<float> recorded_logits = logits;
    runner.setRecordDecode(false);
    decodeSteps(true);
    replay_exact = logits == recorded_logits && next == decoded;
    eager_s = bestSeconds(options.repeats, decode);
    runner.setRecordDecode(true);
  }

  // Each call timed alone (eager, synchronized around every call): one
  // prefill, then one decode of every step.
  std::vector<kernels::OpProfile> prefill_ops, decode_ops;
  if (profiler) {
    runner.setRecordDecode(false);
    profiler->setEnabled(true);
    prefill();
    prefill_ops = profiler->take();
    decode();
    decode_ops = profiler->take();
    profiler->setEnabled(false);
    runner.setRecordDecode(true);
  }

  const double prefill_tps = static_cast<double>(options.prompt_tokens) / prefill_s;
  const double prefill_flops_per_token = prefillMatmulFlopsPerToken(*model, options.prompt_tokens);
  const double prefill_matmul_gflops = prefill_tps * prefill_flops_per_token / 1e9;
  const double step_s = decode_only_s / static_cast<double>(options.decode_tokens);
  const double decode_tps = static_cast<double>(options.batch) / step_s;
  // Weight bytes one decode step reads: each matrix once (a mixture's
  // experts as decodeWeightBytes counts them).
  const double bytes_per_step = decodeWeightBytes(*model, options.batch);
  const double stream_gbps = bytes_per_step / step_s / 1e9;
  // KV bytes one decode step reads on average: every sequence's K and V rows
  // of every layer up to its position, positions prompt .. prompt+steps-1.
  const double kv_bytes_per_token = static_cast<double>(kv.blockBytes()) / kv.block_size;
  const double mean_context = static_cast<double>(options.prompt_tokens) +
                              static_cast<double>(options.decode_tokens + 1) / 2.0;
  const double kv_bytes_per_step =
      static_cast<double>(options.batch) * mean_context * kv_bytes_per_token;
  const double total_stream_gbps = (bytes_per_step + kv_bytes_per_step) / step_s / 1e9;
  // A copy moves each byte twice (read + write): the traffic a pure read
  // stream can at most reach.
  const double copy_traffic_gbps = 2.0 * copy_gbps;
  const double bandwidth_limit_tps =
      static_cast<double>(options.batch) * copy_traffic_gbps * 1e9 / bytes_per_step;

  const engine::Fp8Quantization& quantization = model->config().quantization;
  // "bf16", or "fp8 (channel scales) and bf16" for a quantized model.
  const std::string weights_text = model->config().quantized()
                                       ? std::string("fp8 (") +
                                             granularityName(quantization.granularity) +
                                             " scales) and " + dtypeShortName(model->weightDType())
                                       : std::string(dtypeShortName(model->weightDType()));
  std::printf("tandem-bench engine: %s (%s weights, KV %s), %s kernels, %d threads, on %s\n",
              options.model_dir.c_str(), weights_text.c_str(), options.kv_dtype.c_str(),
              kernels::isaName().c_str(), kernels::numThreads(), backend->description().c_str());
  std::printf("%-46s %12s\n", "figure", "value");
  std::printf("%-46s %12.2f\n", "backend copy GB/s (bytes copied)", copy_gbps);
  std::printf("%-46s %12.2f\n", "backend copy traffic GB/s (read + write)", copy_traffic_gbps);
  std::printf("%-46s %12.2f\n", "host memcpy GB/s (1 thread, bytes copied)", memcpy_gbps);
  std::printf("%-46s %12.2f\n", "host memory read GB/s (kernel threads)", read_gbps);
  std::printf("%-46s %12.1f\n", "host GEMM up_proj GFLOP/s", gemm_up_gflops);
  std::printf("%-46s %12.1f\n", "host GEMM down_proj GFLOP/s", gemm_down_gflops);
  if (on_cpu) {
    std::printf("%-46s %12.1f\n", "host fp32 FMA peak GFLOP/s (kernel threads)", fma_peak);
    std::printf("%-46s %12.1f\n", "host bf16 dot peak GFLOP/s (kernel threads)", bf16_peak);
  }
  std::printf("%-46s %12.1f\n", "prefill tokens/s", prefill_tps);
  std::printf("%-46s %12.1f\n", "prefill GFLOP/s (matmul flops / prefill time)",
              prefill_matmul_gflops);
  if (on_cpu) {
    std::printf("%-46s %12.2f\n", "prefill matmul / compute peak",
                prefill_matmul_gflops / compute_peak);
  }
  std::printf("%-46s %12.1f\n", "decode tokens/s (all sequences)", decode_tps);
  std::printf("%-46s %12.3f\n", "decode step ms", step_s * 1e3);
  if (records) {
    std::printf("%-46s %12.1f\n", "decode tokens/s, eager (steps not recorded)",
                static_cast<double>(options.batch * options.decode_tokens) / eager_s);
    std::printf("%-46s %12.2f\n", "recorded / eager decode speed", eager_s / decode_only_s);
    std::printf("%-46s %12s\n", "recorded vs eager logits",
                replay_exact               ? "identical"
                : options.unordered_decode ? "differ (unordered)"
                                           : "DIFFER");
  }
  std::printf("%-46s %12.3f\n", "decode step ms, logits to the host",
              host_logits_s / static_cast<double>(options.decode_tokens) * 1e3);
  std::printf("%-46s %12.3f\n", "  over the greedy step", host_logits_s / decode_only_s);
  std::printf("%-46s %12s\n", "  tokens picked on the host",
              host_tokens_equal          ? "identical"
              : options.unordered_decode ? "differ (unordered)"
                                         : "DIFFER");
  std::printf("%-46s %12.3f\n", "sampling ms a step (T 0.6, top-p 0.9)", sampled.pool_s * 1e3);
  std::printf("%-46s %12.3f\n", "  on one thread", sampled.one_thread_s * 1e3);
  std::printf("%-46s %12.3f\n", "  over the greedy step", sampled.pool_s / step_s);
  std::printf("%-46s %12s\n", "  tokens, pool vs one thread",
              sampled.identical ? "identical" : "DIFFER");
  std::printf("%-46s %16s\n", "prompt logits XXH3-64", prompt_digest.c_str());
  std::printf("%-46s %16s\n", "last decode step's logits XXH3-64", decode_digest.c_str());
  if (copy_back) {
    std::printf("%-46s %12.3f\n", "logits copy back ms, into pageable memory",
                copy_back->pageable_ms);
    std::printf("%-46s %12.3f\n", "logits copy back ms, into page-locked memory",
                copy_back->page_locked_ms);
  }
  std::printf("%-46s %12.2f\n", "decode weight stream GB/s", stream_gbps);
  std::printf("%-46s %12.2f\n", "decode stream / backend copy", stream_gbps / copy_gbps);
  std::printf("%-46s %12.2f\n", "decode stream / backend copy traffic",
              stream_gbps / copy_traffic_gbps);
  std::printf("%-46s %12.2f\n", "decode stream / host memory read", stream_gbps / read_gbps);
  std::printf("%-46s %12.2f\n", "decode weights + KV stream / host memory read",
              total_stream_gbps / read_gbps);
  // The memory-bound decode's own ceiling on a device: what the backend's
  // copy moves (read + write).
  std::printf("%-46s %12.2f\n", "decode weights + KV / backend copy traffic",
              total_stream_gbps / copy_traffic_gbps);
  std::printf("%-46s %12.1f\n", "bandwidth-limit decode tokens/s", bandwidth_limit_tps);
  std::printf("%-46s %12.2f\n", "limit / achieved decode", bandwidth_limit_tps / decode_tps);
  std::printf(
      "(batch %lld; prompt %lld tokens per sequence; %lld decode steps; %.1f MB of weights and "
      "%.1f MB of KV read per step; copy buffer %lld MiB; GEMM m=%lld; best of %d)\n",
      static_cast<long long>(options.batch), static_cast<long long>(options.prompt_tokens),
      static_cast<long long>(options.decode_tokens), bytes_per_step / 1e6, kv_bytes_per_step / 1e6,
      static_cast<long long>(options.copy_mib), static_cast<long long>(gemm_m), options.repeats);

  // The same prefill and decode with every sequence running the adapter,
  // measured after the figures above in pairs (without, with; the order
  // alternating from pair to pair, so that a machine growing busier or
  // quieter weighs on both alike): the ratio printed is the median of the
  // pairs' ratios.
  nlohmann::json lora_json;
  if (lora) {
    const int pairs = std::max(options.repeats, 5);
    std::vector<double> prefill_ratios, decode_ratios;
    double lora_prefill_s = 1e30, lora_decode_s = 1e30;
    auto timed = [](auto&& fn) {
      const auto start = Clock::now();
      fn();
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    for (int pair = 0; pair < pairs; ++pair) {
      double seconds[2][2] = {};  // [with][prefill, decode]
      for (int k = 0; k < 2; ++k) {
        const bool with = (k == 0) == (pair % 2 == 1);
        adapter = with ? lora_index : -1;
        seconds[with][0] = timed(prefill);
        seconds[with][1] = timed(decode);
      }
      prefill_ratios.push_back(seconds[0][0] / seconds[1][0]);
      decode_ratios.push_back(seconds[0][1] / seconds[1][1]);
      lora_prefill_s = std::min(lora_prefill_s, seconds[1][0]);
      lora_decode_s = std::min(lora_decode_s, seconds[1][1]);
    }
    adapter = -1;
    auto median = [](std::vector<double> values) {
      std::sort(values.begin(), values.end());
      const size_t n = values.size();
      return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
    };
    const double lora_prefill_tps = static_cast<double>(options.prompt_tokens) / lora_prefill_s;
    const double lora_decode_tps =
        static_cast<double>(options.batch * options.decode_tokens) / lora_decode_s;
    std::printf("\nLoRA adapter %s (rank %lld, every sequence runs it; %d pairs):\n",
                options.lora_dir.c_str(), static_cast<long long>(lora->rank()), pairs);
    std::printf("%-46s %12.1f\n", "prefill tokens/s with the adapter (best)", lora_prefill_tps);
    std::printf("%-46s %12.3f\n", "  with / without (median of pairs)", median(prefill_ratios));
    std::printf("%-46s %12.1f\n", "decode tokens/s with the adapter (best)", lora_decode_tps);
    std::printf("%-46s %12.3f\n", "  with / without (median of pairs)", median(decode_ratios));
    lora_json = {{"dir", options.lora_dir},
                 {"rank", lora->rank()},
                 {"pairs", pairs},
                 {"prefill_tokens_per_s", lora_prefill_tps},
                 {"prefill_over_base_median", median(prefill_ratios)},
                 {"prefill_over_base_pairs", prefill_ratios},
                 {"decode_tokens_per_s", lora_decode_tps},
                 {"decode_over_base_median", median(decode_ratios)},
                 {"decode_over_base_pairs", decode_ratios}};
  }

  nlohmann::json ops_json;
  if (profiler) {
    ops_json["prefill"] = printOps("prefill calls (batch 1)", prefill_ops, 1, copy_traffic_gbps);
    ops_json["decode"] =
        printOps(("decode calls (batch " + std::to_string(options.batch) + ")").c_str(), decode_ops,
                 options.decode_tokens, copy_traffic_gbps);
  }
  nlohmann::json gemm_configs_json;
  if (options.bf16_gemm_configs) {
    gemm_configs_json = bf16GemmConfigs(layer0, gemm_m, options.repeats);
  }

  if (!options.json_path.empty()) {
    nlohmann::json out = {
        {"model", options.model_dir},
        {"weight_dtype", dtypeShortName(model->weightDType())},
        {"fp8_scales", granularityName(quantization.granularity)},
        {"kv_dtype", options.kv_dtype},
        {"compute_dtype", options.compute_dtype},
        {"cuda_kernels", options.cuda_kernels},
        {"fuse_projections", options.fuse_projections},
        {"unordered_decode", options.unordered_decode},
        {"deep_skinny", options.deep_skinny},
        {"compact_attention", options.compact_attention},
        {"deep_attention", options.deep_attention},
        {"bf16_gemm_config", options.bf16_gemm_config},
        {"isa", kernels::isaName()},
        {"threads", kernels::numThreads()},
        {"device", kernels::deviceKindName(backend->kind())},
        {"device_description", backend->description()},
        {"prompt_tokens", options.prompt_tokens},
        {"decode_tokens", options.decode_tokens},
        {"batch", options.batch},
        {"copy_mib", options.copy_mib},
        {"backend_copy_gbps", copy_gbps},
        {"backend_copy_traffic_gbps", copy_traffic_gbps},
        {"memcpy_gbps", memcpy_gbps},
        {"read_gbps", read_gbps},
        {"gemm_up_gflops", gemm_up_gflops},
        {"gemm_down_gflops", gemm_down_gflops},
        {"prefill_tokens_per_s", prefill_tps},
        {"prefill_matmul_flops_per_token", prefill_flops_per_token},
        {"prefill_matmul_gflops", prefill_matmul_gflops},
        {"fma_peak_gflops", fma_peak},
        {"bf16_dot_peak_gflops", bf16_peak},
        {"compute_peak_gflops", compute_peak},
        {"decode_tokens_per_s", decode_tps},
        {"decode_step_s", step_s},
        {"decode_weight_bytes_per_step", bytes_per_step},
        {"decode_stream_gbps", stream_gbps},
        {"decode_stream_over_backend_copy", stream_gbps / copy_gbps},
        {"decode_stream_over_backend_copy_traffic", stream_gbps / copy_traffic_gbps},
        {"decode_stream_over_memcpy", stream_gbps / memcpy_gbps},
        {"decode_stream_over_read", stream_gbps / read_gbps},
        {"decode_kv_bytes_per_step", kv_bytes_per_step},
        {"decode_total_stream_over_read", total_stream_gbps / read_gbps},
        {"decode_total_stream_over_backend_copy_traffic", total_stream_gbps / copy_traffic_gbps},
        {"bandwidth_limit_decode_tokens_per_s", bandwidth_limit_tps},
        {"decode_steps_recorded", records},
        {"decode_step_host_logits_s", host_logits_s / static_cast<double>(options.decode_tokens)},
        {"decode_host_tokens_identical", host_tokens_equal},
        {"sampling_step_s", sampled.pool_s},
        {"sampling_step_one_thread_s", sampled.one_thread_s},
        {"sampling_tokens_identical", sampled.identical},
        {"prompt_logits_xxh3", prompt_digest},
        {"decode_logits_xxh3", decode_digest},
    };
    if (records) {
      out["decode_eager_tokens_per_s"] =
          static_cast<double>(options.batch * options.decode_tokens) / eager_s;
      out["decode_recorded_over_eager"] = eager_s / decode_only_s;
      out["decode_recorded_logits_identical"] = replay_exact;
    }
    if (profiler) out["ops"] = ops_json;
    if (!lora_json.is_null()) out["lora"] = lora_json;
    if (options.bf16_gemm_configs) out["bf16_gemm_configs"] = gemm_configs_json;
    if (copy_back) {
      out["logits_copy_pageable_ms"] = copy_back->pageable_ms;
      out["logits_copy_page_locked_ms"] = copy_back->page_locked_ms;
    }
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  // A bf16 GEMM configuration whose outputs differ from configuration 0's
  // breaks the promise they all keep.
  for (const auto& row : gemm_configs_json) {
    // A row not run compares nothing; the wgmma twins (4 to 7) may round a
    // k16 step otherwise than HMMA: what they print is the finding.
    if (!kernels::bf16GemmIsWgmma(row.at("config").get<int>()) &&
        !row.value("same_bits_as_config0", true)) {
      return 1;
    }
  }
  // Unordered decode matmuls make no promise of the same bits twice.
  if (!sampled.identical) return 1;
  return (replay_exact && host_tokens_equal) || options.unordered_decode ? 0 : 1;
}

}  // namespace tandem::bench
