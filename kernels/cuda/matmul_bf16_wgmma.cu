// The bf16 GEMM of matmul_bf16_mma.cu on Hopper's warpgroup MMA (wgmma,
// HGMMA in SASS): bf16 GEMM configuration 4 (CudaBackendOptions::
// bf16_gemm_config), the pipelined kernel's twin for m > 256 with k a
// multiple of 8 and 16-byte aligned operands, over x already rounded to
// bf16. Compiled for sm_90a alone (kernels/CMakeLists.txt); the backend
// refuses the configuration on other devices and in builds without sm_90.
//
// Order: the same as the pipelined kernel's. Each output's accumulator
// starts at +0 and takes one k16 multiply per 16-wide slice of k, in
// ascending order; slices past k are skipped (no instruction, whatever m
// is) and the padded positions of the last one are zero in both operands.
// A wgmma's result for output (i, j) is a function of row i of A, column j
// of B and accumulator (i, j), so a row's bits do not depend on m or on its
// place in the tile. Whether a Hopper HGMMA k16 step rounds exactly as an
// HMMA m16n8k16 does is the hardware's: `gpu_cuda_kernels_test` compares
// this configuration's rows with configuration 0's bit for bit, and
// `tandem-bench engine --bf16-gemm-configs` prints whether they agree.
// Until they have on a GPU it stays a configuration to measure, never the
// default (docs/cuda.md "Kernel states").
//
// Shape: 128 x 128 output tiles, two warpgroups of 64 rows, each issuing
// one m64n128k16 per slice; K steps of 64 through a three-stage cp.async
// pipeline (96 KB of shared memory, two blocks per SM). Operand tiles are
// stored as core matrices (wgmma.h): core matrix (row group g, k chunk c)
// at (16 c + g) · 128 bytes, so the stride between row groups is 128 bytes
// and the leading offset between k chunks 2,048; a quarter warp's cp.async
// fill one core matrix (128 contiguous bytes, no bank conflict). Each step:
// wait for the step's copies, fence them into the async proxy, barrier,
// issue the next step's copies (into the stage read one step ago, whose
// wgmma have been waited for), then four wgmma, commit, wait.
#include <cuda_runtime.h>

#include "common/check.h"
#include "kernels/cuda/epilogue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ptx.h"
#include "kernels/cuda/wgmma.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kTileK = 64;
constexpr int kStages = 3;
constexpr int kThreads = 256;  // two warpgroups
constexpr int kSliceK = 16;
constexpr int kRowGroups = kTileM / 8;                             // per operand tile
constexpr uint32_t kStrideBytes = kCoreMatrixBytes;                // row group to row group
constexpr uint32_t kLeadingBytes = kRowGroups * kCoreMatrixBytes;  // k chunk to k chunk
constexpr int kTileBytes = kTileM * kTileK * 2;
constexpr int kStageBytes = 2 * kTileBytes;  // A then B
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes;
constexpr int kVectorsPerThread = kTileM * kTileK / 8 / kThreads;  // 16-byte vectors
static_assert(kTileM == kTileN && kVectorsPerThread * kThreads * 8 == kTileM * kTileK,
              "copies cover a tile exactly");

// K step `step` of rows [row0, row0 + 128) of a (rows x k, bf16, row-major)
// into a stage's operand tile. Vector v is row 8 g + r of k chunk c with
// r = v % 8, c = v / 8 % 8, g = v / 64; zero past `rows` and k.
__device__ __forceinline__ void loadTile(const uint16_t* __restrict__ src, int64_t rows, int64_t k,
                                         int64_t row0, int64_t step, uint8_t* tile) {
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int v = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = v % 8;
    const int c = v / 8 % (kTileK / 8);
    const int g = v / (8 * (kTileK / 8));
    const int64_t row = row0 + 8 * g + r;
    const int64_t column = step * kTileK + 8 * c;
    const bool valid = row < rows && column < k;
    copyAsync16(tile + (c * kRowGroups + g) * kCoreMatrixBytes + r * 16,
                valid ? src + row * k + column : src, valid);
  }
}

// Step `step`'s start: its copies waited for and fenced into the async
// proxy, a barrier (so every thread's are in, and the stage refilled next
// was read a step ago, its wgmma waited for), then step + 2's copies.
__device__ __forceinline__ void beginStep(const uint16_t* __restrict__ xb, int64_t m, int64_t k,
                                          const uint16_t* __restrict__ w, int64_t n, int64_t m0,
                                          int64_t n0, int64_t step, int64_t steps,
                                          uint8_t* stages) {
  waitCopies<kStages - 2>();
  fenceSharedForAsyncProxy();
  __syncthreads();
  const int64_t next = step + kStages - 1;
  if (next < steps) {
    uint8_t* stage = stages + next % kStages * kStageBytes;
    loadTile(xb, m, k, m0, next, stage);
    loadTile(w, n, k, n0, next, stage + kTileBytes);
  }
  commitCopies();
}

// This warpgroup's 64 rows of step's A tile (row groups 8 · warpgroup on),
// and step's B tile.
__device__ __forceinline__ const uint8_t* aOperand(const uint8_t* stages, int64_t step,
                                                   int warpgroup) {
  return stages + step % kStages * kStageBytes + warpgroup * (kRowGroups / 2) * kCoreMatrixBytes;
}
__device__ __forceinline__ const uint8_t* bOperand(const uint8_t* stages, int64_t step) {
  return stages + step % kStages * kStageBytes + kTileBytes;
}

// acc += slice `slice` (k chunks 2 slice and 2 slice + 1) of a · b.
__device__ __forceinline__ void multiply(float (&acc)[16][4], const uint8_t* a, const uint8_t* b,
                                         int slice) {
  const uint32_t chunk = 2 * slice * kLeadingBytes;
  wgmmaBf16M64N128(acc, wgmmaDescriptor(a + chunk, kLeadingBytes, kStrideBytes),
                   wgmmaDescriptor(b + chunk, kLeadingBytes, kStrideBytes));
}

__global__ void __launch_bounds__(kThreads)
    bf16WgmmaKernel(const uint16_t* __restrict__ xb, int64_t m, int64_t k,
                    const uint16_t* __restrict__ w, int64_t n, MatmulEpilogue out) {
  extern __shared__ __align__(128) uint8_t stages[];
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int warp = static_cast<int>(threadIdx.x) / 32 % 4;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;

  float acc[1][16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
  }

  const int64_t steps = (k + kTileK - 1) / kTileK;
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < steps) {
      loadTile(xb, m, k, m0, stage, stages + stage * kStageBytes);
      loadTile(w, n, k, n0, stage, stages + stage * kStageBytes + kTileBytes);
    }
    commitCopies();
  }

  // Whole K steps, then the partial one if k is not a multiple of 64: two
  // loops, so that the four multiplies of a whole step have no branch
  // between them (a branch makes the compiler fence the accumulators).
  const int64_t whole = k / kTileK;
  for (int64_t step = 0; step < whole; ++step) {
    beginStep(xb, m, k, w, n, m0, n0, step, steps, stages);
    const uint8_t* a = aOperand(stages, step, warpgroup);
    const uint8_t* b = bOperand(stages, step);
    wgmmaFence();
#pragma unroll
    for (int slice = 0; slice < kTileK / kSliceK; ++slice) multiply(acc[0], a, b, slice);
    wgmmaCommit();
    wgmmaWait<0>();
    wgmmaFenceRegisters(acc[0]);
  }
  if (whole < steps) {
    const int64_t step = whole;
    beginStep(xb, m, k, w, n, m0, n0, step, steps, stages);
    const uint8_t* a = aOperand(stages, step, warpgroup);
    const uint8_t* b = bOperand(stages, step);
    wgmmaFence();
    // Slices past k issue no instruction, whatever m is.
    for (int slice = 0; step * kTileK + slice * kSliceK < k; ++slice) multiply(acc[0], a, b, slice);
    wgmmaCommit();
    wgmmaWait<0>();
    wgmmaFenceRegisters(acc[0]);
  }
  waitCopies<0>();

  storeTiles(acc, m0 + warpgroup * 64 + warp * 16 + lane / 4, n0 + lane % 4 * 2, m, n, out);
}

}  // namespace

void launchBf16Wgmma(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
                     const uint16_t* weights, int64_t n, const MatmulEpilogue& out) {
  TANDEM_CHECK(k % 8 == 0 && reinterpret_cast<uintptr_t>(x_bf16) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(weights) % 16 == 0,
               "bf16 wgmma matmul: k must be a multiple of 8 and the operands 16-byte aligned");
  static const cudaError_t opted_in = cudaFuncSetAttribute(
      bf16WgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  TANDEM_CHECK(opted_in == cudaSuccess,
               "bf16 wgmma matmul: cudaFuncSetAttribute refused the kernel's shared memory");
  TANDEM_CHECK(ceilDiv(m, kTileM) <= 65535, "bf16 wgmma matmul: too many rows for one launch");
  const dim3 tiles(static_cast<unsigned int>(ceilDiv(n, kTileN)),
                   static_cast<unsigned int>(ceilDiv(m, kTileM)));
  bf16WgmmaKernel<<<tiles, kThreads, kSmemBytes, stream>>>(x_bf16, m, k, weights, n, out);
}

}  // namespace tandem::kernels::cuda
