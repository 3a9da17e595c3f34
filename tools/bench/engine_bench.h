// `tandem-bench engine`: single-process engine throughput on one model.
//
// Measures, in one run so the figures are comparable: memcpy bandwidth (the
// machine's reference), GEMM GFLOP/s at the model's shapes, prefill tokens/s
// of one prompt, decode tokens/s, and the weight bytes streamed per second
// while decoding. Prints a table and optionally writes JSON. Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::bench {

struct EngineBenchOptions {
  std::string model_dir;
  int threads = 0;  // 0: all cores
  int64_t prompt_tokens = 512;
  int64_t decode_tokens = 128;
  int repeats = 3;
  std::string kv_dtype = "bf16";
  std::string device = "auto";  // cpu, cuda or auto
  std::string json_path;        // empty: no JSON file
};

int runEngineBench(const EngineBenchOptions& options);

}  // namespace tandem::bench
