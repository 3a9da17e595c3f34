// The wgmma probe's kernel (instruction_kernels.h warpgroupMma), in a file
// of its own: wgmma exists in sm_90a code only, so on a GPU build this file
// alone is compiled for sm_90a (tests/cuda_emu/CMakeLists.txt).
#include <cuda_runtime.h>

#include "kernels/cuda/wgmma.h"
#include "tests/cuda_emu/wgmma_probe.h"

namespace tandem::cuda_probe {
namespace {

using kernels::cuda::fenceSharedForAsyncProxy;
using kernels::cuda::kCoreMatrixBytes;
using kernels::cuda::wgmmaBf16M64N128;
using kernels::cuda::wgmmaCommit;
using kernels::cuda::wgmmaDescriptor;
using kernels::cuda::wgmmaFence;
using kernels::cuda::wgmmaFenceRegisters;
using kernels::cuda::wgmmaWait;

// A (64 x 16) stores core matrix (row group g, k chunk c) at (2g + c) · 128
// bytes: leading offset 128, stride 256. B (128 x 16, k-major) at
// (16c + g) · 128: leading offset 2,048, stride 128. Opposite orders, so a
// descriptor whose two offsets were swapped reads the wrong elements.
constexpr uint32_t kALeading = kCoreMatrixBytes;
constexpr uint32_t kAStride = 2 * kCoreMatrixBytes;
constexpr uint32_t kBLeading = 16 * kCoreMatrixBytes;
constexpr uint32_t kBStride = kCoreMatrixBytes;
constexpr int kABytes = 64 * 16 * 2;

__device__ int coreOffset(int row, int k, uint32_t leading, uint32_t stride) {
  return static_cast<int>(row / 8 * stride + k / 8 * leading) + row % 8 * 16 + k % 8 * 2;
}

__global__ void wgmmaProbeKernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  extern __shared__ __align__(128) uint8_t shared[];
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * 16; i += 128) {
    *reinterpret_cast<uint16_t*>(shared + coreOffset(i / 16, i % 16, kALeading, kAStride)) = a[i];
  }
  for (int i = t; i < 128 * 16; i += 128) {
    *reinterpret_cast<uint16_t*>(shared + kABytes +
                                 coreOffset(i / 16, i % 16, kBLeading, kBStride)) = b[i];
  }
  fenceSharedForAsyncProxy();
  __syncthreads();
  const int warp = t / 32, lane = t % 32;
  float acc[16][4];
  for (int j = 0; j < 16; ++j) {
    for (int e = 0; e < 4; ++e) {
      acc[j][e] = c[(16 * warp + lane / 4 + 8 * (e / 2)) * 128 + 8 * j + 2 * (lane % 4) + e % 2];
    }
  }
  wgmmaFence();
  wgmmaBf16M64N128(acc, wgmmaDescriptor(shared, kALeading, kAStride),
                   wgmmaDescriptor(shared + kABytes, kBLeading, kBStride));
  wgmmaCommit();
  wgmmaWait<0>();
  wgmmaFenceRegisters(acc);
  for (int j = 0; j < 16; ++j) {
    for (int e = 0; e < 4; ++e) {
      d[(16 * warp + lane / 4 + 8 * (e / 2)) * 128 + 8 * j + 2 * (lane % 4) + e % 2] = acc[j][e];
    }
  }
}

}  // namespace

void launchWgmmaProbe(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  wgmmaProbeKernel<<<1, 128, kABytes + 128 * 16 * 2>>>(a, b, c, d);
}

}  // namespace tandem::cuda_probe
