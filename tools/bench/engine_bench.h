// `tandem-bench engine`: single-process engine throughput on one model.
//
// Measures, in one run and on one backend so the figures are comparable: the
// backend's own copy bandwidth (Backend::copy of a device buffer to another:
// memcpy on the CPU, device to device on CUDA), host memcpy and read
// bandwidth, host GEMM GFLOP/s at the model's shapes, prefill tokens/s of one
// prompt, decode tokens/s of `batch` sequences decoding together, and the
// weight bytes streamed per second while decoding (weight bytes read per
// decode step / step time) with its ratio to the copy bandwidth. Prints a
// table and optionally writes JSON. Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace tandem::bench {

struct EngineBenchOptions {
  std::string model_dir;
  int threads = 0;  // 0: every CPU it may use
  int64_t prompt_tokens = 512;
  int64_t decode_tokens = 128;  // decode steps (each step: one token per sequence)
  int64_t batch = 1;            // sequences decoding together, each with its own prompt
  int64_t copy_mib = 1024;      // buffer size of the backend copy bandwidth figure
  int repeats = 3;
  std::string kv_dtype = "bf16";
  std::string compute_dtype = "f32";  // what the GEMMs multiply: f32 or bf16
  std::string device = "auto";        // cpu, cuda or auto
  std::string cuda_kernels =
      "auto";                     // CUDA kernel set: auto (fast on CUDA), reference, fast, flash
  std::string json_path;          // empty: no JSON file
  bool profile_ops = false;       // also time each backend call of one prefill and one decode
  bool fuse_projections = false;  // ModelRunnerOptions::fuse_projections
  // CudaBackendOptions::unordered_decode: not batch-invariant, for measuring
  // what the fixed order costs.
  bool unordered_decode = false;
  // CudaBackendOptions::deep_skinny: the bf16 decode matmuls' weights
  // streamed through shared memory, several batches in flight, and past 16
  // rows x's fragments shared per block there (the same bits).
  bool deep_skinny = false;
  // CudaBackendOptions::compact_attention: the flash kernel launched with a
  // block per query tile of a prefill, each through a run of splits (the
  // same bits).
  bool compact_attention = false;
  // CudaBackendOptions::deep_attention: a decode step's flash kernel copies
  // a whole split's K and V at once, or three of its four tiles past a
  // block per SM (the same bits).
  bool deep_attention = false;
  // CUDA, bf16 compute: layer 0's matmuls at prompt_tokens rows timed with
  // each of the bf16 GEMM's configurations (CudaBackendOptions::
  // bf16_gemm_config), side by side, their outputs compared bit for bit.
  bool bf16_gemm_configs = false;
  // CUDA, bf16 compute: the whole run with this bf16 GEMM configuration
  // (CudaBackendOptions::bf16_gemm_config; the prefill's GEMMs above 256
  // rows), e.g. the fastest that --bf16-gemm-configs found with the same bits.
  int bf16_gemm_config = kernels::kBf16GemmServing;
  // A PEFT LoRA adapter directory: prefill and decode are measured again in
  // the same run with every sequence running it, and compared.
  std::string lora_dir;
};

int runEngineBench(const EngineBenchOptions& options);

}  // namespace tandem::bench
