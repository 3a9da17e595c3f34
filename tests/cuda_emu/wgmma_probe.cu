// The wgmma probe's kernel (instruction_kernels.h warpgroupMma) and the
// tensor copy probe's (tensorCopy), in a file of their own: wgmma exists in
// sm_90a code only and tensor copies in sm_90, so on a GPU build this file
// alone is compiled for sm_90a (tests/cuda_emu/CMakeLists.txt).
#include <cuda_runtime.h>

#include "kernels/cuda/tma.h"
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

constexpr int kBoxRows = 16;
constexpr int kBoxBytes = kBoxRows * 64 * 2;

// Two boxes, side by side in k, through one barrier's phases 0 and 1.
__global__ void tensorCopyProbeKernel(const __grid_constant__ CUtensorMap map, int32_t column,
                                      int32_t row, uint8_t* out) {
  using namespace kernels::cuda;
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* boxes = swizzleAligned(raw);
  auto* barrier = reinterpret_cast<uint64_t*>(boxes + 2 * kBoxBytes);
  if (threadIdx.x == 0) {
    initBarrier(barrier, 1);
    fenceBarrierInit();
  }
  __syncthreads();
  for (uint32_t phase = 0; phase < 2; ++phase) {
    if (threadIdx.x == 0) {
      arriveExpectingBytes(barrier, kBoxBytes);
      copyTileAsync(boxes + phase * kBoxBytes, &map, column + static_cast<int32_t>(phase) * 64, row,
                    barrier);
    }
    waitBarrier(barrier, phase);
    // Every thread past this phase before the next can complete (a wait
    // for parity 0 would otherwise take phase 2 for phase 0).
    __syncthreads();
  }
  for (int i = static_cast<int>(threadIdx.x); i < 2 * kBoxBytes; i += 128) out[i] = boxes[i];
}

}  // namespace

void launchTensorCopyProbe(const uint16_t* matrix, int64_t rows, int64_t k, int32_t column,
                           int32_t row, uint8_t* out) {
  const CUtensorMap map = kernels::cuda::bf16RowsTensorMap(matrix, rows, k, kBoxRows);
  tensorCopyProbeKernel<<<1, 128, 2 * kBoxBytes + kernels::cuda::kSwizzleAtomBytes + 8>>>(
      map, column, row, out);
}

void launchWgmmaProbe(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  wgmmaProbeKernel<<<1, 128, kABytes + 128 * 16 * 2>>>(a, b, c, d);
}

}  // namespace tandem::cuda_probe
