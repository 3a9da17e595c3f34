#include "tools/bench/engine_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/model.h"
#include "agent/engine/model_runner.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

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

size_t viewBytes(const kernels::WeightView& view) {
  return static_cast<size_t>(view.rows * view.cols) * dtypeSize(view.dtype);
}

// Bytes of weights one decode step reads: every matrix once, plus lm_head.
size_t decodeWeightBytes(const engine::Model& model) {
  size_t bytes = viewBytes(model.weights().lm_head);
  for (const auto& layer : model.weights().layers) {
    for (const auto* view : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                             &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      bytes += viewBytes(*view);
    }
  }
  return bytes;
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

}  // namespace

int runEngineBench(const EngineBenchOptions& options) {
  if (options.threads > 0) kernels::setNumThreads(options.threads);
  std::unique_ptr<kernels::Backend> backend =
      kernels::makeBackend(kernels::resolveDevice(options.device));
  auto model = engine::Model::load(options.model_dir);
  const auto& config = model->config();
  if (options.prompt_tokens + options.decode_tokens > config.max_position_embeddings) {
    throw Error("--prompt-tokens plus --decode-tokens must not exceed the model's context of " +
                std::to_string(config.max_position_embeddings));
  }
  auto kv_dtype = dtypeFromShortName(options.kv_dtype);
  if (!kv_dtype || (*kv_dtype != DType::kF32 && *kv_dtype != DType::kBF16)) {
    throw Error("--kv-dtype must be f32 or bf16, got " + options.kv_dtype);
  }

  engine::KvCacheConfig kv;
  kv.block_size = 16;
  kv.num_blocks = (options.prompt_tokens + options.decode_tokens + 15) / 16;
  kv.dtype = *kv_dtype;
  kv.num_layers = static_cast<int32_t>(config.num_hidden_layers);
  kv.num_kv_heads = static_cast<int32_t>(config.num_key_value_heads);
  kv.head_dim = static_cast<int32_t>(config.head_dim);
  std::unique_ptr<engine::KvSlabAllocator> allocator;
  if (backend->hostAccessible()) {
    allocator = std::make_unique<engine::HostSlabAllocator>();
  } else {
    allocator = std::make_unique<engine::BackendSlabAllocator>(*backend);
  }
  engine::KvCache cache(kv, std::move(allocator));
  engine::ModelRunner runner(*model, cache, *backend);
  std::vector<engine::BlockId> block_table(kv.num_blocks);
  std::iota(block_table.begin(), block_table.end(), 0);

  std::mt19937 rng(42);
  std::uniform_int_distribution<TokenId> token_dist(0, static_cast<TokenId>(config.vocab_size - 1));
  std::vector<TokenId> prompt(options.prompt_tokens);
  for (TokenId& t : prompt) t = token_dist(rng);

  const double memcpy_gbps = memcpyGBps(options.repeats);
  const double read_gbps = readGBps(kernels::numThreads(), options.repeats);
  const auto& layer0 = model->weights().layers.at(0);
  const int64_t gemm_m = options.prompt_tokens;
  const double gemm_up_gflops = gemmGflops(gemm_m, layer0.up_proj, options.repeats);
  const double gemm_down_gflops = gemmGflops(gemm_m, layer0.down_proj, options.repeats);

  std::vector<float> logits;
  engine::SequenceInput input;
  input.block_table = block_table;
  auto prefill = [&] {
    input.tokens = prompt;
    input.start_position = 0;
    runner.forward({&input, 1}, logits);
  };
  prefill();  // warm-up: page in weights, grow scratch buffers
  const double prefill_s = bestSeconds(options.repeats, prefill);

  auto decode = [&] {
    TokenId next = static_cast<TokenId>(kernels::argmax(logits.data(), config.vocab_size));
    for (int64_t i = 0; i < options.decode_tokens; ++i) {
      input.tokens = {&next, 1};
      input.start_position = options.prompt_tokens + i;
      runner.forward({&input, 1}, logits);
      next = static_cast<TokenId>(kernels::argmax(logits.data(), config.vocab_size));
    }
  };
  // Each decode run starts from a freshly prefilled prompt; only decode is timed.
  double decode_only_s = 1e30;
  for (int r = 0; r < options.repeats; ++r) {
    prefill();
    auto start = Clock::now();
    decode();
    decode_only_s =
        std::min(decode_only_s, std::chrono::duration<double>(Clock::now() - start).count());
  }

  const double prefill_tps = static_cast<double>(options.prompt_tokens) / prefill_s;
  const double decode_tps = static_cast<double>(options.decode_tokens) / decode_only_s;
  const double bytes_per_token = static_cast<double>(decodeWeightBytes(*model));
  const double stream_gbps = bytes_per_token * decode_tps / 1e9;
  const double bandwidth_limit_tps = read_gbps * 1e9 / bytes_per_token;

  std::printf("tandem-bench engine: %s (%s weights, KV %s), %s kernels, %d threads, on %s\n",
              options.model_dir.c_str(), dtypeShortName(model->weightDType()),
              options.kv_dtype.c_str(), kernels::isaName().c_str(), kernels::numThreads(),
              backend->description().c_str());
  std::printf("%-40s %12s\n", "figure", "value");
  std::printf("%-40s %12.2f\n", "memcpy GB/s (1 thread, bytes copied)", memcpy_gbps);
  std::printf("%-40s %12.2f\n", "memory read GB/s (kernel threads)", read_gbps);
  std::printf("%-40s %12.1f\n", "GEMM up_proj GFLOP/s", gemm_up_gflops);
  std::printf("%-40s %12.1f\n", "GEMM down_proj GFLOP/s", gemm_down_gflops);
  std::printf("%-40s %12.1f\n", "prefill tokens/s", prefill_tps);
  std::printf("%-40s %12.1f\n", "decode tokens/s", decode_tps);
  std::printf("%-40s %12.2f\n", "decode weight stream GB/s", stream_gbps);
  std::printf("%-40s %12.2f\n", "decode stream / memcpy", stream_gbps / memcpy_gbps);
  std::printf("%-40s %12.2f\n", "decode stream / memory read", stream_gbps / read_gbps);
  std::printf("%-40s %12.1f\n", "bandwidth-limit decode tokens/s", bandwidth_limit_tps);
  std::printf("%-40s %12.2f\n", "limit / achieved decode (goal <= 1.5)",
              bandwidth_limit_tps / decode_tps);
  std::printf("(GEMM m=%lld; prompt %lld tokens; decode %lld tokens; best of %d)\n",
              static_cast<long long>(gemm_m), static_cast<long long>(options.prompt_tokens),
              static_cast<long long>(options.decode_tokens), options.repeats);

  if (!options.json_path.empty()) {
    nlohmann::json out = {
        {"model", options.model_dir},
        {"weight_dtype", dtypeShortName(model->weightDType())},
        {"kv_dtype", options.kv_dtype},
        {"isa", kernels::isaName()},
        {"threads", kernels::numThreads()},
        {"device", kernels::deviceKindName(backend->kind())},
        {"device_description", backend->description()},
        {"prompt_tokens", options.prompt_tokens},
        {"decode_tokens", options.decode_tokens},
        {"memcpy_gbps", memcpy_gbps},
        {"read_gbps", read_gbps},
        {"gemm_up_gflops", gemm_up_gflops},
        {"gemm_down_gflops", gemm_down_gflops},
        {"prefill_tokens_per_s", prefill_tps},
        {"decode_tokens_per_s", decode_tps},
        {"decode_weight_bytes_per_token", bytes_per_token},
        {"decode_stream_gbps", stream_gbps},
        {"decode_stream_over_memcpy", stream_gbps / memcpy_gbps},
        {"decode_stream_over_read", stream_gbps / read_gbps},
        {"bandwidth_limit_decode_tokens_per_s", bandwidth_limit_tps},
    };
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return 0;
}

}  // namespace tandem::bench
