// The bf16 GEMM of matmul_bf16_mma.cu on Hopper's warpgroup MMA (wgmma,
// HGMMA in SASS): bf16 GEMM configurations 4 to 7 (CudaBackendOptions::
// bf16_gemm_config), twins of the pipelined kernel for m > 256 with k a
// multiple of 8 and 16-byte aligned operands, over x already rounded to
// bf16. Compiled for sm_90a alone (kernels/CMakeLists.txt); the backend
// refuses them on other devices and in builds without sm_90.
//
// Order: the same as the pipelined kernel's. Each output's accumulator
// starts at +0 and takes one k16 multiply per 16-wide slice of k, in
// ascending order; slices past k are skipped (no instruction, whatever m
// is) and the padded positions of the last one are zero in both operands.
// A wgmma's result for output (i, j) is a function of row i of A, column j
// of B and accumulator (i, j), so a row's bits do not depend on m or on its
// place in the tile. Whether a Hopper HGMMA k16 step rounds exactly as an
// HMMA m16n8k16 does is the hardware's: `gpu_cuda_kernels_test` compares
// these configurations' rows with configuration 0's bit for bit, and
// `tandem-bench engine --bf16-gemm-configs` prints whether they agree.
// Until they have on a GPU they stay configurations to measure, never the
// default (docs/cuda.md "The wgmma configurations").
//
// Shapes: 128-row tiles, two warpgroups of 64 rows, each issuing one
// m64nNk16 per slice; K steps of 64 through a three-stage cp.async
// pipeline. Configuration 4: 128 columns (96 KB of shared memory, two
// blocks per SM), each step's multiplies waited for before the next
// step's copies are issued. Configuration 5: 256 columns (144 KB, one block
// per SM, half the operand traffic per output), a step's multiplies left
// in flight while the previous step's are waited for, then a barrier, then
// the copies into the stage those read. Operand tiles are stored as core
// matrices (wgmma.h): core matrix (row group g, k chunk c) of an R-row tile
// at (R / 8 · c + g) · 128 bytes, so the stride between row groups is 128
// bytes and the leading offset between k chunks R · 16; a quarter warp's
// cp.async fill one core matrix (128 contiguous bytes, no bank conflict).
// Each step waits for its copies, fences them into the async proxy (wgmma
// reads through it) and meets the block at a barrier before multiplying.
//
// Configuration 6: the same 128 x 256 tiles and the same multiplies in the
// same order, fed by the tensor copy engine (tma.h) through four stages of
// 48 KB, each a barrier pair: `full` (the producer's arrival announcing the
// stage's bytes, completed when both boxes have landed) and `empty` (one
// arrival per consumer thread once its multiplies of the stage are done:
// wgmma.wait_group speaks for the groups of the threads that execute it,
// so no thread answers for another's). Three warpgroups: the first produces (one thread issues two
// box copies per K step; its registers lowered to 40), the other two multiply (raised to 232), 64
// rows each. A consumer waits for a stage's `full`, issues its four slices, commits, waits until
// only this group is in flight and releases the stage before (so the multiplies of one step overlap
// the wait for the next). Operands stored with the 128-byte swizzle (rows of 128 bytes, no bank
// conflicts for the copy engine or wgmma); rows and k past the matrix land as zeros, and slices
// wholly past k are not issued, as in configurations 4 and 5. Configuration 7: the same kernel on a
// persistent grid, one block per SM walking the output tiles, the barriers' phases running on from
// tile to tile, so the next tile's copies land while this one's outputs are stored.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/epilogue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ptx.h"
#include "kernels/cuda/tma.h"
#include "kernels/cuda/wgmma.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kTileM = 128;
constexpr int kTileK = 64;
constexpr int kStages = 3;
constexpr int kThreads = 256;  // two warpgroups
constexpr int kSliceK = 16;
constexpr int kARowGroups = kTileM / 8;
constexpr int kATileBytes = kTileM * kTileK * 2;
constexpr uint32_t kStrideBytes = kCoreMatrixBytes;  // row group to row group

// A configuration: kTileN output columns per block (each warpgroup's wgmma
// is m64 n kTileN k16), and whether a step's multiplies stay in flight
// while the next step's copies are issued (kOverlap: wait for the group
// before, then a barrier, then refill the stage it read) or are waited for
// before them.
template <int kTileNValue, bool kOverlapValue>
struct Shape {
  static constexpr int kTileN = kTileNValue;
  static constexpr bool kOverlap = kOverlapValue;
  // Blocks per SM the registers must leave room for (shared memory allows
  // two of 96 KB, one of 144 KB).
  static constexpr int kMinBlocks = kTileN == 128 ? 2 : 1;
  static constexpr int kBRowGroups = kTileN / 8;
  static constexpr int kBTileBytes = kTileN * kTileK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes;
};
using Shape4 = Shape<128, false>;  // configuration 4
using Shape5 = Shape<256, true>;   // configuration 5

// K step `step` of rows [row0, row0 + kRows) of a (rows x k, bf16,
// row-major) into a stage's operand tile, core matrix (row group g, k chunk
// c) at (kRows / 8 · c + g) · 128 bytes: vector v is row 8 g + r of chunk c
// with r = v % 8, c = v / 8 % 8, g = v / 64 (a quarter warp fills one core
// matrix); zero past `rows` and k.
template <int kRows>
__device__ __forceinline__ void loadTile(const uint16_t* __restrict__ src, int64_t rows, int64_t k,
                                         int64_t row0, int64_t step, uint8_t* tile) {
  constexpr int kVectorsPerThread = kRows * kTileK / 8 / kThreads;
  static_assert(kVectorsPerThread * kThreads * 8 == kRows * kTileK, "copies cover a tile");
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int v = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = v % 8;
    const int c = v / 8 % (kTileK / 8);
    const int g = v / (8 * (kTileK / 8));
    const int64_t row = row0 + 8 * g + r;
    const int64_t column = step * kTileK + 8 * c;
    const bool valid = row < rows && column < k;
    copyAsync16(tile + (c * (kRows / 8) + g) * kCoreMatrixBytes + r * 16,
                valid ? src + row * k + column : src, valid);
  }
}

// The copies of K step `step` (none past the last), committed as one group
// either way.
template <typename S>
__device__ __forceinline__ void loadStep(const uint16_t* __restrict__ xb, int64_t m, int64_t k,
                                         const uint16_t* __restrict__ w, int64_t n, int64_t m0,
                                         int64_t n0, int64_t step, int64_t steps, uint8_t* stages) {
  if (step < steps) {
    uint8_t* stage = stages + step % kStages * S::kStageBytes;
    loadTile<kTileM>(xb, m, k, m0, step, stage);
    loadTile<S::kTileN>(w, n, k, n0, step, stage + kATileBytes);
  }
  commitCopies();
}

// Step `step`'s tiles in every thread's view: its copies waited for and
// fenced into the async proxy, then a barrier.
__device__ __forceinline__ void awaitStep() {
  waitCopies<kStages - 2>();
  fenceSharedForAsyncProxy();
  __syncthreads();
}

// acc += slice `slice` (k chunks 2 slice and 2 slice + 1) of step's tiles,
// this warpgroup's 64 rows (row groups 8 · warpgroup on).
template <typename S>
__device__ __forceinline__ void multiply(float (&acc)[S::kTileN / 8][4], const uint8_t* stages,
                                         int64_t step, int warpgroup, int slice) {
  const uint8_t* stage = stages + step % kStages * S::kStageBytes;
  const uint8_t* a = stage + warpgroup * (kARowGroups / 2) * kCoreMatrixBytes;
  const uint8_t* b = stage + kATileBytes;
  constexpr uint32_t kALeading = kARowGroups * kCoreMatrixBytes;
  constexpr uint32_t kBLeading = S::kBRowGroups * kCoreMatrixBytes;
  const uint64_t a_descriptor = wgmmaDescriptor(a + 2 * slice * kALeading, kALeading, kStrideBytes);
  const uint64_t b_descriptor = wgmmaDescriptor(b + 2 * slice * kBLeading, kBLeading, kStrideBytes);
  if constexpr (S::kTileN == 128) {
    wgmmaBf16M64N128(acc, a_descriptor, b_descriptor);
  } else {
    wgmmaBf16M64N256(acc, a_descriptor, b_descriptor);
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads, S::kMinBlocks)
    bf16WgmmaKernel(const uint16_t* __restrict__ xb, int64_t m, int64_t k,
                    const uint16_t* __restrict__ w, int64_t n, MatmulEpilogue out) {
  extern __shared__ __align__(128) uint8_t stages[];
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int warp = static_cast<int>(threadIdx.x) / 32 % 4;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * S::kTileN;

  float acc[1][S::kTileN / 8][4];
#pragma unroll
  for (int j = 0; j < S::kTileN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
  }

  const int64_t steps = (k + kTileK - 1) / kTileK;
#pragma unroll
  for (int step = 0; step < kStages - 1; ++step)
    loadStep<S>(xb, m, k, w, n, m0, n0, step, steps, stages);

  // Whole K steps, then the partial one if k is not a multiple of 64: two
  // loops, so that the four multiplies of a whole step have no branch
  // between them (a branch makes the compiler fence the accumulators).
  const int64_t whole = k / kTileK;
  for (int64_t step = 0; step < whole; ++step) {
    awaitStep();
    // Without overlap the stage refilled here was read a step ago and its
    // multiplies were waited for before the barrier above.
    if (!S::kOverlap) loadStep<S>(xb, m, k, w, n, m0, n0, step + kStages - 1, steps, stages);
    wgmmaFence();
#pragma unroll
    for (int slice = 0; slice < kTileK / kSliceK; ++slice) {
      multiply<S>(acc[0], stages, step, warpgroup, slice);
    }
    wgmmaCommit();
    if constexpr (S::kOverlap) {
      // This step's group stays in flight; the one before is done in this
      // thread, and after the barrier in every thread, so its stage (the
      // one refilled) is free.
      wgmmaWait<1>();
      __syncthreads();
      loadStep<S>(xb, m, k, w, n, m0, n0, step + kStages - 1, steps, stages);
    } else {
      wgmmaWait<0>();
    }
  }
  if (whole < steps) {
    awaitStep();  // nothing is loaded past the last step
    wgmmaFence();
    // Slices past k issue no instruction, whatever m is.
    for (int slice = 0; whole * kTileK + slice * kSliceK < k; ++slice) {
      multiply<S>(acc[0], stages, whole, warpgroup, slice);
    }
    wgmmaCommit();
  }
  wgmmaWait<0>();
  wgmmaFenceRegisters(acc[0]);
  waitCopies<0>();

  storeTiles(acc, m0 + warpgroup * 64 + warp * 16 + lane / 4, n0 + lane % 4 * 2, m, n, out);
}

template <typename S>
void launchShape(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
                 const uint16_t* weights, int64_t n, const MatmulEpilogue& out) {
  optInSharedMemory<bf16WgmmaKernel<S>>(
      S::kSmemBytes, "bf16 wgmma matmul: cudaFuncSetAttribute refused the kernel's shared memory");
  const dim3 tiles(static_cast<unsigned int>(ceilDiv(n, S::kTileN)),
                   static_cast<unsigned int>(ceilDiv(m, kTileM)));
  bf16WgmmaKernel<S><<<tiles, kThreads, S::kSmemBytes, stream>>>(x_bf16, m, k, weights, n, out);
}

// Configuration 6 (the file's header): tensor copies, a producer
// warpgroup and two consumer warpgroups.
namespace copied {

constexpr int kTileN = 256;
constexpr int kStages = 4;
constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;  // the arrivals that free a stage
// Registers a thread of the producer and of a consumer warpgroup keeps
// (setmaxnreg); together no more than the 168 a thread starts with at
// __launch_bounds__(384, 1), or a consumer's raise would wait forever.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kEntryRegisters = (128 * kProducerRegisters + 256 * kConsumerRegisters) / kThreads;
static_assert(kEntryRegisters == 168, "the warpgroups share what the block starts with");
constexpr int kBTileBytes = kTileN * kTileK * 2;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr size_t kSmemBytes =
    static_cast<size_t>(kStages) * kStageBytes + kSwizzleAtomBytes + 2 * kStages * sizeof(uint64_t);

// acc += slice `slice` of a stage's tiles, rows 64 · consumer on.
__device__ __forceinline__ void multiply(float (&acc)[kTileN / 8][4], const uint8_t* stage,
                                         int consumer, int slice) {
  const uint8_t* a = stage + consumer * 64 * 128 + slice * kSliceK * 2;
  const uint8_t* b = stage + kATileBytes + slice * kSliceK * 2;
  wgmmaBf16M64N256(acc, wgmmaSwizzledDescriptor(a), wgmmaSwizzledDescriptor(b));
}

// Output tile t: rows t % m_tiles · 128 on, columns t / m_tiles · 256 on
// (tiles that follow each other share a weight tile). Without kPersistent a
// block multiplies one tile, (blockIdx.x, blockIdx.y) its (column, row)
// tile (configuration 6); with it (configuration 7) the grid is one block
// per SM and block b multiplies tiles b, b + gridDim.x, ... The barriers'
// phases run on across a block's tiles (K step `at` of the block uses stage
// at % kStages in its at / kStages-th round), so the producer fills the
// next tile's first stages while the consumers store this one's outputs.
template <bool kPersistent>
__global__ void __launch_bounds__(kThreads, 1)
    bf16CopiedKernel(const __grid_constant__ CUtensorMap x_map,
                     const __grid_constant__ CUtensorMap w_map, int64_t m, int64_t k, int64_t n,
                     MatmulEpilogue out) {
  // Declared 128-byte aligned only, so that the compiler cannot fold
  // swizzleAligned away: the stages' 1024-byte alignment is computed here,
  // from the slack kSmemBytes holds, whatever the loader places.
  extern __shared__ __align__(128) uint8_t raw[];
  uint8_t* stages = swizzleAligned(raw);
  auto* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      initBarrier(&full[s], 1);
      initBarrier(&empty[s], kConsumerThreads);
    }
    fenceBarrierInit();
  }
  __syncthreads();
  const int64_t m_tiles = (m + kTileM - 1) / kTileM;
  const int64_t tiles = m_tiles * ((n + kTileN - 1) / kTileN);
  const int64_t first =
      kPersistent ? int64_t{blockIdx.x} : int64_t{blockIdx.x} * m_tiles + blockIdx.y;
  const int64_t stride = kPersistent ? int64_t{gridDim.x} : tiles;
  const int64_t steps = (k + kTileK - 1) / kTileK;

  if (warpgroup == 0) {
    lowerRegisters<kProducerRegisters>();
    if (threadIdx.x == 0) {
      int64_t at = 0;  // the block's K steps issued so far
      for (int64_t t = first; t < tiles; t += stride) {
        const auto m0 = static_cast<int32_t>(t % m_tiles * kTileM);
        const auto n0 = static_cast<int32_t>(t / m_tiles * kTileN);
        for (int64_t step = 0; step < steps; ++step, ++at) {
          const auto s = static_cast<int>(at % kStages);
          // The stage's multiplies of kStages steps ago are done (a fresh
          // barrier's parity-1 phase counts as done).
          waitBarrier(&empty[s], (static_cast<uint32_t>(at / kStages) & 1) ^ 1);
          uint8_t* stage = stages + s * kStageBytes;
          arriveExpectingBytes(&full[s], kStageBytes);
          const auto column = static_cast<int32_t>(step * kTileK);
          copyTileAsync(stage, &x_map, column, m0, &full[s]);
          copyTileAsync(stage + kATileBytes, &w_map, column, n0, &full[s]);
        }
      }
    }
    return;
  }

  raiseRegisters<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int warp = static_cast<int>(threadIdx.x) / 32 % 4;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t whole = k / kTileK;
  int64_t used = 0;  // the block's K steps consumed before this tile
  for (int64_t t = first; t < tiles; t += stride, used += steps) {
    float acc[1][kTileN / 8][4];
#pragma unroll
    for (int j = 0; j < kTileN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
    }
    // The zeros stay before the first multiplies' fence (set between a
    // fence and its wgmma they would serialize every multiply).
    wgmmaFenceRegisters(acc[0]);
    // Whole K steps, then the partial one: two loops, so that a whole
    // step's four multiplies have no branch between them. After each, the
    // step before is done (one group left in flight): its stage is free.
    for (int64_t step = 0; step < whole; ++step) {
      const int64_t at = used + step;
      const auto s = static_cast<int>(at % kStages);
      waitBarrier(&full[s], static_cast<uint32_t>(at / kStages) & 1);
      const uint8_t* stage = stages + s * kStageBytes;
      wgmmaFence();
#pragma unroll
      for (int slice = 0; slice < kTileK / kSliceK; ++slice) {
        multiply(acc[0], stage, consumer, slice);
      }
      wgmmaCommit();
      wgmmaWait<1>();
      if (step > 0) arriveAtBarrier(&empty[(at - 1) % kStages]);
    }
    if (whole < steps) {
      const int64_t at = used + whole;
      const auto s = static_cast<int>(at % kStages);
      waitBarrier(&full[s], static_cast<uint32_t>(at / kStages) & 1);
      const uint8_t* stage = stages + s * kStageBytes;
      wgmmaFence();
      // Slices past k issue no instruction, whatever m is.
      for (int slice = 0; whole * kTileK + slice * kSliceK < k; ++slice) {
        multiply(acc[0], stage, consumer, slice);
      }
      wgmmaCommit();
      wgmmaWait<1>();
      if (whole > 0) arriveAtBarrier(&empty[(at - 1) % kStages]);
    }
    wgmmaWait<0>();
    wgmmaFenceRegisters(acc[0]);
    // The tile's last stage is free as well: the producer fills it with the
    // next tile's step while these outputs are stored.
    arriveAtBarrier(&empty[(used + steps - 1) % kStages]);
    storeTiles(acc, t % m_tiles * kTileM + consumer * 64 + warp * 16 + lane / 4,
               t / m_tiles * kTileN + lane % 4 * 2, m, n, out);
  }
}

// kPersistent: a grid of at most `sm_count` blocks.
template <bool kPersistent>
void launch(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
            const uint16_t* weights, int64_t n, const MatmulEpilogue& out, int sm_count) {
  optInSharedMemory<bf16CopiedKernel<kPersistent>>(
      kSmemBytes, "bf16 wgmma matmul: cudaFuncSetAttribute refused the kernel's shared memory");
#if !defined(TANDEM_CUDA_EMULATION)
  // A compiler that started the kernel with fewer registers would leave the
  // consumers' setmaxnreg.inc waiting for registers that never come: a hang,
  // refused here instead (168 with the CUDA 13 ptxas).
  static const int entry_registers = [] {
    cudaFuncAttributes attributes{};
    const cudaError_t error = cudaFuncGetAttributes(&attributes, bf16CopiedKernel<kPersistent>);
    TANDEM_CHECK(error == cudaSuccess, std::string("bf16 wgmma matmul: cudaFuncGetAttributes: ") +
                                           cudaGetErrorString(error) +
                                           " (is the device's compute capability 9.0?)");
    return attributes.numRegs;
  }();
  TANDEM_CHECK(entry_registers >= kEntryRegisters,
               "bf16 wgmma matmul: the kernel starts with " + std::to_string(entry_registers) +
                   " registers a thread, fewer than the " + std::to_string(kEntryRegisters) +
                   " its warpgroups divide");
#endif
  TANDEM_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX,
               "bf16 wgmma matmul: a tensor copy's coordinates are 32-bit");
  const CUtensorMap x_map = bf16RowsTensorMap(x_bf16, m, k, kTileM);
  const CUtensorMap w_map = bf16RowsTensorMap(weights, n, k, kTileN);
  const int64_t m_tiles = ceilDiv(m, kTileM), n_tiles = ceilDiv(n, kTileN);
  dim3 grid(static_cast<unsigned int>(n_tiles), static_cast<unsigned int>(m_tiles));
  if (kPersistent) {
    grid = dim3(static_cast<unsigned int>(std::clamp<int64_t>(sm_count, 1, m_tiles * n_tiles)));
  }
  bf16CopiedKernel<kPersistent><<<grid, kThreads, kSmemBytes, stream>>>(x_map, w_map, m, k, n, out);
}

}  // namespace copied

}  // namespace

void launchBf16Wgmma(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
                     const uint16_t* weights, int64_t n, const MatmulEpilogue& out, int config,
                     int sm_count) {
  TANDEM_CHECK(k > 0 && k % 8 == 0 && reinterpret_cast<uintptr_t>(x_bf16) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(weights) % 16 == 0,
               "bf16 wgmma matmul: k must be a positive multiple of 8 and the operands 16-byte "
               "aligned");
  TANDEM_CHECK(ceilDiv(m, kTileM) <= 65535, "bf16 wgmma matmul: too many rows for one launch");
  switch (config) {
    case kBf16GemmWgmma:
      launchShape<Shape4>(stream, x_bf16, m, k, weights, n, out);
      return;
    case kBf16GemmWgmma + 1:
      launchShape<Shape5>(stream, x_bf16, m, k, weights, n, out);
      return;
    case kBf16GemmWgmma + 2:
      copied::launch<false>(stream, x_bf16, m, k, weights, n, out, sm_count);
      return;
    case kBf16GemmWgmma + 3:
      copied::launch<true>(stream, x_bf16, m, k, weights, n, out, sm_count);
      return;
    default:
      TANDEM_CHECK(false, "bf16 wgmma matmul: configuration " + std::to_string(config) +
                              " is not a wgmma configuration");
  }
}

}  // namespace tandem::kernels::cuda
