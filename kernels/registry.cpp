// The one place that knows which backends this build has. The engine asks
// for a DeviceKind; only this file names the CUDA backend, and only when the
// build defines TANDEM_HAVE_CUDA.
#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

#ifdef TANDEM_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace tandem::kernels {

bool cudaBuilt() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cudaDeviceCount() {
#ifdef TANDEM_HAVE_CUDA
  return cuda::deviceCount();
#else
  return 0;
#endif
}

DeviceKind resolveDevice(const std::string& flag) {
  if (flag == "cpu") return DeviceKind::kCpu;
  if (flag == "auto") return cudaDeviceCount() > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (flag == "cuda") {
    if (!cudaBuilt()) {
      throw Error(
          "--device cuda: this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
    }
    if (cudaDeviceCount() <= 0) throw Error("--device cuda: no CUDA device is visible");
    return DeviceKind::kCuda;
  }
  throw Error("--device: expected cpu, cuda or auto, got '" + flag + "'");
}

std::unique_ptr<Backend> makeBackend(DeviceKind kind, const BackendOptions& backend_options) {
  const CudaKernels cuda_kernels = backend_options.cuda_kernels;
  const bool unordered_decode = backend_options.unordered_decode;
  if (unordered_decode && (kind != DeviceKind::kCuda || cuda_kernels == CudaKernels::kReference)) {
    throw Error(
        "--unordered-decode: only with --device cuda and the fast kernels (it replaces the fast "
        "decode matmul)");
  }
  switch (kind) {
    case DeviceKind::kCpu:
      if (cuda_kernels != CudaKernels::kReference) {
        throw Error(std::string("--cuda-kernels ") +
                    (cuda_kernels == CudaKernels::kFast ? "fast" : "flash") +
                    ": the cpu backend runs no CUDA kernels (use it with --device cuda, or leave "
                    "--cuda-kernels at auto)");
      }
      return std::make_unique<cpu::CpuBackend>();
    case DeviceKind::kCuda:
#ifdef TANDEM_HAVE_CUDA
    {
      cuda::CudaBackendOptions options;
      options.fast_kernels = cuda_kernels != CudaKernels::kReference;
      options.flash_attention = cuda_kernels == CudaKernels::kFlash;
      options.unordered_decode = unordered_decode;
      options.deep_skinny = backend_options.deep_skinny;
      options.compact_attention = backend_options.compact_attention;
      options.deep_attention = backend_options.deep_attention;
      options.fused_launches = backend_options.fused_launches;
      options.rope_variants = backend_options.rope_variants;
      options.bf16_gemm_config = backend_options.bf16_gemm_config;
      return cuda::makeCudaBackend(0, options);
    }
#else
      throw Error(
          "--device cuda: this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
#endif
  }
  throw Error("unknown device kind");
}

CudaKernels resolveCudaKernels(const std::string& text, const std::string& flag, DeviceKind kind) {
  if (text == "auto")
    return kind == DeviceKind::kCuda ? CudaKernels::kFlash : CudaKernels::kReference;
  if (text == "reference") return CudaKernels::kReference;
  if (text == "fast") return CudaKernels::kFast;
  if (text == "flash") return CudaKernels::kFlash;
  throw Error(flag + ": expected auto, reference, fast or flash, got '" + text + "'");
}

DType parseComputeDType(const std::string& text, const std::string& flag) {
  if (text == "f32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  throw Error(flag + ": expected f32 or bf16, got '" + text + "'");
}

DType resolveComputeDType(const std::string& text, const std::string& flag, DeviceKind kind,
                          CudaKernels cuda_kernels) {
  if (text == "auto") {
    return kind == DeviceKind::kCuda && cuda_kernels != CudaKernels::kReference ? DType::kBF16
                                                                                : DType::kF32;
  }
  if (text == "f32" || text == "bf16") return parseComputeDType(text, flag);
  throw Error(flag + ": expected auto, f32 or bf16, got '" + text + "'");
}

bool resolveFuseProjections(const std::string& text, const std::string& flag, DeviceKind kind) {
  if (text == "auto") return kind == DeviceKind::kCuda;
  if (text == "true" || text == "false") return text == "true";
  throw Error(flag + ": expected auto, true or false, got '" + text + "'");
}

}  // namespace tandem::kernels
