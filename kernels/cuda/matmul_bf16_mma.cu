// bf16 compute on the CUDA backend's tensor cores (--compute-dtype bf16 with
// --cuda-kernels fast): y[m, n] = bf16(x)[m, k] · w[n, k]^T for bf16
// row-major weights, fp32 accumulation, any m. As on the CPU
// (docs/engine.md#compute-dtype), each activation is first rounded to bf16,
// nearest even (the integer steps of common/dtype.h), and the weights are
// used as they are.
//
// Invariance: one fixed tile shape (64 x 64 outputs, K steps of 32, 4 warps
// of 32 x 32) and one fixed k order for every m, no split-K, stream-K or
// atomics. Each output's accumulator starts at +0 and takes one
// mma.sync.aligned.m16n8k16 (bf16 x bf16 -> fp32) per 16-wide slice of k, in
// ascending order; the slices past k are skipped and the padded positions
// of the last one are zero in both operands, so the sequence of
// instructions an output goes through is fixed by k alone. An mma's result
// for output (i, j) is a function of row i of A, column j of B and the
// accumulator (i, j) only; rows past m are zeros and never stored. So a
// row's bits do not depend on m, on the tile it falls in or on its place in
// that tile (the GPU test checks the last point on the device: a row alone
// equals the same row at position 40 of a 2048-row batch).
//
// Two kernels, one order. bf16MmaKernel: tiles go through shared memory
// (rows padded by 8 bf16, so fragment reads hit 8 distinct banks per quarter
// warp) with the next K step loaded into registers while the tensor cores
// work on this one; it takes any m, k and alignment, and runs m <= 256 (every
// decode bucket, so recorded steps never need the scratch below).
// bf16MmaPipelinedKernel, for m > 256 with k a multiple of 8 and 16-byte
// aligned operands: x is first rounded to bf16 into the backend's scratch
// (the same rounding as the other kernel's shared-memory store), then
// 128 x 128 output tiles (8 warps of 64 x 32) stream A and B through a
// three-stage cp.async pipeline of K steps of 32, zero-filled past m, n and
// k, and load fragments with ldmatrix (80-byte rows: the 8 rows of an 8 x 8
// matrix fall in distinct banks). Its mma sequence per output is the same
// chain as bf16MmaKernel's (one m16n8k16 per 16-wide slice of k, ascending,
// from +0, slices past k skipped, the last one's padding zero in both
// operands), so both give every output the same bits, and a row's bits do
// not depend on which kernel its batch size picked: the GPU test compares a
// row alone (m = 1) with the same row in a batch of 2048.
// bf16MmaSkinnyKernel, for m <= 64 (decode) where the backend holds the
// weights re-laid as mma B fragments (weight_layout.h): a warp owns 8
// output columns and streams their whole k, one 16-byte load per lane per
// two slices, with no shared memory and no barrier. x is first rounded to
// bf16 into the backend's scratch in the same fragment order (rows in the
// place of columns, zero past m and k), so the A fragments of a pair are
// 16-byte loads too; a batch of pairs of weights and x is loaded while the
// tensor cores multiply the one before (two batches in registers), the
// weights without allocating in L1 so that x stays there. Up to four
// 16-row tiles (eight row groups), so the weights are read once for all
// rows. Again the same mma chain per output, so the same bits.
// On sm_90 these are HMMA, not Hopper's wgmma (HGMMA): a faster kernel keeps
// this order only if it keeps one k16 mma chain per output, and gives these
// bits only if an HGMMA k16 step rounds as an HMMA one does. Configurations
// 4 to 7 (matmul_bf16_wgmma.cu) are that kernel, to be compared on a GPU.
// All three store through an epilogue (epilogue.h): a lane's C fragment
// holds outputs in column pairs (2j, 2j + 1), so SiLU·up over gate/up pairs
// is computed where they are stored; the epilogue runs after the chain, so
// it never changes an output's mma sequence.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "common/check.h"
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/epilogue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ptx.h"
#include "kernels/cuda/weight_layout.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 32;
constexpr int kMmaK = 16;
constexpr int kPad = 8;  // bf16 per shared-memory row beyond kTileK
constexpr int kRowStride = kTileK + kPad;
constexpr int kWarp = 32;
constexpr int kWarpsM = 2;
constexpr int kWarpsN = 2;
constexpr int kThreads = kWarpsM * kWarpsN * kWarp;
constexpr int kWarpTileM = kTileM / kWarpsM;  // 32
constexpr int kWarpTileN = kTileN / kWarpsN;  // 32
constexpr int kMmaTilesM = kWarpTileM / 16;   // 2
constexpr int kMmaTilesN = kWarpTileN / 8;    // 4
// Per thread and K step: 4 float4 of x and 2 x 16 bytes of w.
constexpr int kXVectors = kTileM * kTileK / 4 / kThreads;
constexpr int kWVectors = kTileN * kTileK / 8 / kThreads;
static_assert(kXVectors == 4 && kWVectors == 2, "loads cover the tiles exactly");
static_assert(kTileK % kMmaK == 0, "a K step holds whole mma slices");

// One K step of x (fp32, rounded to bf16 when stored) and w (bf16) held in
// registers between its global load and its shared-memory store.
struct Staged {
  float4 x[kXVectors];
  uint4 w[kWVectors];
};

// `kVector`: k is a multiple of 8 and x, w are 16-byte aligned, so whole
// 16-byte vectors lie inside k or wholly past it.
template <bool kVector>
__device__ __forceinline__ void loadStep(const float* __restrict__ x, int64_t m, int64_t k,
                                         const uint16_t* __restrict__ w, int64_t n, int64_t m0,
                                         int64_t n0, int64_t k0, Staged& staged) {
#pragma unroll
  for (int i = 0; i < kXVectors; ++i) {
    const int index = static_cast<int>(threadIdx.x) + i * kThreads;
    const int64_t row = m0 + index / (kTileK / 4);
    const int64_t kk = k0 + (index % (kTileK / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < m) {
      const float* p = x + row * k + kk;
      if constexpr (kVector) {
        if (kk < k) v = *reinterpret_cast<const float4*>(p);
      } else {
        if (kk < k) v.x = p[0];
        if (kk + 1 < k) v.y = p[1];
        if (kk + 2 < k) v.z = p[2];
        if (kk + 3 < k) v.w = p[3];
      }
    }
    staged.x[i] = v;
  }
#pragma unroll
  for (int i = 0; i < kWVectors; ++i) {
    const int index = static_cast<int>(threadIdx.x) + i * kThreads;
    const int64_t column = n0 + index / (kTileK / 8);
    const int64_t kk = k0 + (index % (kTileK / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (column < n) {
      const uint16_t* p = w + column * k + kk;
      if constexpr (kVector) {
        if (kk < k) v = *reinterpret_cast<const uint4*>(p);
      } else {
        uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (kk + e < k) words[e / 2] |= static_cast<uint32_t>(p[e]) << (16 * (e % 2));
        }
        v = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
    staged.w[i] = v;
  }
}

__device__ __forceinline__ void storeStep(const Staged& staged, uint16_t (*a)[kRowStride],
                                          uint16_t (*b)[kRowStride]) {
#pragma unroll
  for (int i = 0; i < kXVectors; ++i) {
    const int index = static_cast<int>(threadIdx.x) + i * kThreads;
    const float4 v = staged.x[i];
    *reinterpret_cast<uint2*>(&a[index / (kTileK / 4)][(index % (kTileK / 4)) * 4]) =
        make_uint2(packBf16(v.x, v.y), packBf16(v.z, v.w));
  }
#pragma unroll
  for (int i = 0; i < kWVectors; ++i) {
    const int index = static_cast<int>(threadIdx.x) + i * kThreads;
    *reinterpret_cast<uint4*>(&b[index / (kTileK / 8)][(index % (kTileK / 8)) * 8]) = staged.w[i];
  }
}

__device__ __forceinline__ uint32_t pair(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <bool kVector>
__global__ void __launch_bounds__(kThreads)
    bf16MmaKernel(const float* __restrict__ x, int64_t m, int64_t k, const uint16_t* __restrict__ w,
                  int64_t n, MatmulEpilogue out) {
  __shared__ __align__(16) uint16_t a_tiles[2][kTileM][kRowStride];
  __shared__ __align__(16) uint16_t b_tiles[2][kTileN][kRowStride];
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int group = lane / 4;  // fragment row (A, C) or column (B)
  const int quad = lane % 4;   // fragment k pair (A, B) or column pair (C)
  const int warp_m = warp / kWarpsN * kWarpTileM;
  const int warp_n = warp % kWarpsN * kWarpTileN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;

  float acc[kMmaTilesM][kMmaTilesN][4];
  zeroTiles(acc);

  Staged staged;
  loadStep<kVector>(x, m, k, w, n, m0, n0, 0, staged);
  storeStep(staged, a_tiles[0], b_tiles[0]);
  __syncthreads();

  const int64_t steps = (k + kTileK - 1) / kTileK;
  for (int64_t step = 0; step < steps; ++step) {
    const int buffer = static_cast<int>(step % 2);
    const int64_t k0 = step * kTileK;
    if (step + 1 < steps) loadStep<kVector>(x, m, k, w, n, m0, n0, k0 + kTileK, staged);
#pragma unroll
    for (int slice = 0; slice < kTileK / kMmaK; ++slice) {
      if (k0 + slice * kMmaK >= k) break;  // past k: no instruction, whatever m is
      const int kb = slice * kMmaK + quad * 2;
      uint32_t a[kMmaTilesM][4];
#pragma unroll
      for (int i = 0; i < kMmaTilesM; ++i) {
        const int row = warp_m + i * 16 + group;
        a[i][0] = pair(&a_tiles[buffer][row][kb]);
        a[i][1] = pair(&a_tiles[buffer][row + 8][kb]);
        a[i][2] = pair(&a_tiles[buffer][row][kb + 8]);
        a[i][3] = pair(&a_tiles[buffer][row + 8][kb + 8]);
      }
#pragma unroll
      for (int j = 0; j < kMmaTilesN; ++j) {
        const int column = warp_n + j * 8 + group;
        const uint32_t b[2] = {pair(&b_tiles[buffer][column][kb]),
                               pair(&b_tiles[buffer][column][kb + 8])};
#pragma unroll
        for (int i = 0; i < kMmaTilesM; ++i) mmaBf16(acc[i][j], a[i], b);
      }
    }
    if (step + 1 < steps) {
      // The other buffer was last read before the previous barrier.
      storeStep(staged, a_tiles[1 - buffer], b_tiles[1 - buffer]);
    }
    __syncthreads();
  }

  storeTiles(acc, m0 + warp_m + group, n0 + warp_n + quad * 2, m, n, out);
}

// ---- the pipelined kernel (m > 256) ----

namespace pipelined {

constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kThreads = 256;
constexpr int kWarpsN = 4;
constexpr int kWarpTileM = 64;
constexpr int kWarpTileN = 32;
constexpr int kMmaTilesM = kWarpTileM / 16;  // 4
constexpr int kMmaTilesN = kWarpTileN / 8;   // 4
static_assert((kTileM / kWarpTileM) * kWarpsN * 32 == kThreads, "warps cover the tile");
// The wide kernel's warp tile: 64 x 64 outputs.
constexpr int kWarpWide = 64;
// The wide kernel's groups of row tiles (gemmTileOf): 16 x 128 rows of x,
// 16 MB at k = 4,096, stay in L2 while the group's weight tiles pass.
constexpr int64_t kGroupRows = 16;

// The K step and the pipeline's depth. Every configuration runs the same
// mma chain (one per 16-wide slice, ascending k) and gives the same bits;
// they differ in how many slices share a barrier and how many K steps are
// in flight. Config 0 (32, 3) is the one that ran on an H200; the others
// are for measuring (CudaBackendOptions::bf16_gemm_config). kTileNValue,
// the output tile's columns: 128 here, 256 for the wide kernel's
// configuration 9 (below).
template <int kTileKValue, int kStagesValue, int kTileNValue = kTileN>
struct Config {
  static constexpr int kTileK = kTileKValue;
  static constexpr int kStages = kStagesValue;
  static constexpr int kTileN = kTileNValue;
  // Rows padded by 16 bytes: the 8 rows an ldmatrix reads fall in 8
  // different 16-byte bank groups (80- or 144-byte rows).
  static constexpr int kRowStride = kTileK + 8;
  static constexpr int kStageElements = (kTileM + kTileN) * kRowStride;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(kStages) * kStageElements * sizeof(uint16_t);
};
using Config0 = Config<32, 3>;
using Config1 = Config<64, 3>;
using Config2 = Config<64, 4>;
using Config3 = Config<32, 4>;

// K step `step` of rows [row0, row0 + kRows) of a (rows x k, bf16,
// row-major) into a stage's kRows x kTileK tile.
template <typename C, int kRows = kTileM, int kLoadThreads = kThreads>
__device__ __forceinline__ void loadTile(const uint16_t* __restrict__ src, int64_t rows, int64_t k,
                                         int64_t row0, int64_t step, uint16_t* tile) {
  // 16-byte vectors of the tile per K step, and per thread.
  constexpr int kVectors = kRows * C::kTileK / 8;
  constexpr int kVectorsPerThread = kVectors / kLoadThreads;
  static_assert(kVectorsPerThread * kLoadThreads == kVectors, "loads cover the tile");
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int index = static_cast<int>(threadIdx.x) + i * kLoadThreads;
    const int r = index / (C::kTileK / 8);
    const int kk = (index % (C::kTileK / 8)) * 8;
    const int64_t row = row0 + r;
    const int64_t column = step * C::kTileK + kk;
    const bool valid = row < rows && column < k;
    copyAsync16(tile + r * C::kRowStride + kk, valid ? src + row * k + column : src, valid);
  }
}

// The row and column in a stage's tile of what `lane` points ldmatrix.x4
// at: A takes (rows 0-15, k 0-7) then (rows 0-15, k 8-15); B takes (n 0-7,
// k 0-7), (n 0-7, k 8-15), then the next 8 columns of n the same way.
struct FragmentLanes {
  int a_row, a_col, b_row, b_col;
};
__device__ __forceinline__ FragmentLanes fragmentLanes(int lane) {
  return {lane % 16, lane / 16 * 8, lane / 16 * 8 + lane % 8, lane / 8 % 2 * 8};
}

template <typename C>
__global__ void __launch_bounds__(kThreads)
    bf16MmaPipelinedKernel(const uint16_t* __restrict__ xb, int64_t m, int64_t k,
                           const uint16_t* __restrict__ w, int64_t n, MatmulEpilogue out) {
  constexpr int kTileK = C::kTileK;
  constexpr int kStages = C::kStages;
  constexpr int kRowStride = C::kRowStride;
  extern __shared__ __align__(16) uint16_t stages[];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4;
  const int quad = lane % 4;
  const int warp_m = warp / kWarpsN * kWarpTileM;
  const int warp_n = warp % kWarpsN * kWarpTileN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  auto a_tile = [&](int stage) { return stages + stage * C::kStageElements; };
  auto b_tile = [&](int stage) { return stages + stage * C::kStageElements + kTileM * kRowStride; };

  float acc[kMmaTilesM][kMmaTilesN][4];
  zeroTiles(acc);

  const int64_t steps = (k + kTileK - 1) / kTileK;
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < steps) {
      loadTile<C>(xb, m, k, m0, stage, a_tile(stage));
      loadTile<C>(w, n, k, n0, stage, b_tile(stage));
    }
    commitCopies();
  }

  const auto [a_row, a_col, b_row, b_col] = fragmentLanes(lane);

  for (int64_t step = 0; step < steps; ++step) {
    waitCopies<kStages - 2>();
    __syncthreads();  // this step's tile is in; the stage loaded below was last read a step ago
    const int64_t next = step + kStages - 1;
    if (next < steps) {
      loadTile<C>(xb, m, k, m0, next, a_tile(static_cast<int>(next % kStages)));
      loadTile<C>(w, n, k, n0, next, b_tile(static_cast<int>(next % kStages)));
    }
    commitCopies();

    const uint16_t* a = a_tile(static_cast<int>(step % kStages));
    const uint16_t* b = b_tile(static_cast<int>(step % kStages));
#pragma unroll
    for (int slice = 0; slice < kTileK / kMmaK; ++slice) {
      if (step * kTileK + slice * kMmaK >= k) break;  // past k: no instruction, whatever m is
      uint32_t af[kMmaTilesM][4];
#pragma unroll
      for (int i = 0; i < kMmaTilesM; ++i) {
        loadMatrices(af[i], a + (warp_m + i * 16 + a_row) * kRowStride + slice * kMmaK + a_col);
      }
#pragma unroll
      for (int j = 0; j < kMmaTilesN; j += 2) {
        uint32_t bf[4];
        loadMatrices(bf, b + (warp_n + j * 8 + b_row) * kRowStride + slice * kMmaK + b_col);
        const uint32_t b0[2] = {bf[0], bf[1]};
        const uint32_t b1[2] = {bf[2], bf[3]};
#pragma unroll
        for (int i = 0; i < kMmaTilesM; ++i) {
          mmaBf16(acc[i][j], af[i], b0);
          mmaBf16(acc[i][j + 1], af[i], b1);
        }
      }
    }
  }
  waitCopies<0>();

  storeTiles(acc, m0 + warp_m + group, n0 + warp_n + quad * 2, m, n, out);
}

// The pipelined kernel with configuration C over x rounded into x_bf16.
template <typename C>
void launchPipelined(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
                     const uint16_t* weights, int64_t n, const MatmulEpilogue& out) {
  optInSharedMemory<bf16MmaPipelinedKernel<C>>(
      C::kSmemBytes,
      "bf16 matmul: cudaFuncSetAttribute refused the pipelined kernel's shared memory");
  const dim3 tiles(static_cast<unsigned int>(ceilDiv(n, kTileN)),
                   static_cast<unsigned int>(ceilDiv(m, kTileM)));
  bf16MmaPipelinedKernel<C>
      <<<tiles, kThreads, C::kSmemBytes, stream>>>(x_bf16, m, k, weights, n, out);
}

// ---- the wide kernel (configurations 8 and 9; candidates) ----
//
// The pipelined kernel's mma chain, so its bits, fed for a higher rate.
// Three changes, each leaving every output's chain as it is:
// - Output tiles in the order of gemmTileOf (weight_layout.h): row tiles
//   fastest within groups of kGroupRows, so the blocks in flight together
//   share their weight tiles. The pipelined kernel's grid runs column tiles
//   fastest: at 2,048 rows a wave of blocks spans 1.2 row tiles and every
//   one of gate/up's 224 weight tiles, so the weights come from memory
//   again for each of 13 waves.
// - The fragments of the next 16-wide slice are loaded (ldmatrix) while
//   the tensor cores multiply this one's, across the K step's end too: the
//   last slice of a step first waits for the next step's copies, passes the
//   barrier and issues the copies kStages - 1 steps ahead into the stage
//   just read (every read of it issued: its last slice's fragments are in
//   registers), then loads the next step's first fragments. The pipelined
//   kernel loads a slice's fragments and then waits on them, and its
//   `break` past k inside the slice loop keeps the compiler from hoisting
//   the next slice's loads; here a partial last step only skips the
//   multiplies of its slices past k.
// - A warp owns 64 x 64 outputs (the pipelined kernel's 64 x 32): per
//   16-wide slice it issues 8 ldmatrix.x4 for 32 mma, where the 64 x 32
//   warp issues 6 for 16. Shared memory moves 128 bytes a cycle; with the
//   stage's copies a block of the pipelined kernel moves 32 KB of it per
//   slice for its 128 mma (2 cycles an mma, more than the ~1.6 an SM takes
//   per mma.sync on Hopper, where published microbenchmarks put mma.sync
//   at about 0.6 of the wgmma rate), configuration 8 (128 x 128 outputs, 4 warps, two blocks an SM)
//   24 KB for 128 (1.5 cycles), configuration 9 (128 x 256, 8 warps, one
//   block an SM) 44 KB for 256 (1.4 cycles).
// A warp's 128 accumulators and two slices' fragments (64 registers) take
// most of its 255 registers, hence one block of 8 warps or two of 4 per SM.

// The wide kernel's threads for configuration C: a warp per 64 x 64 outputs.
template <typename C>
constexpr int kWideThreads = (kTileM / kWarpWide) * (C::kTileN / kWarpWide) * 32;

template <typename C>
__global__ void __launch_bounds__(kWideThreads<C>, kWideThreads<C> == kThreads ? 1 : 2)
    bf16MmaWideKernel(const uint16_t* __restrict__ xb, int64_t m, int64_t k,
                      const uint16_t* __restrict__ w, int64_t n, MatmulEpilogue out) {
  constexpr int kTileK = C::kTileK;
  constexpr int kStages = C::kStages;
  constexpr int kRowStride = C::kRowStride;
  constexpr int kWideTileN = C::kTileN;
  constexpr int kWarpsWideN = kWideTileN / kWarpWide;
  constexpr int kTilesN = kWarpWide / 8;  // 8
  constexpr int kSlices = kTileK / kMmaK;
  static_assert(kSlices % 2 == 0, "a step's last slice leaves the next step's first to buffer 0");
  extern __shared__ __align__(16) uint16_t stages[];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_m = warp / kWarpsWideN * kWarpTileM;
  const int warp_n = warp % kWarpsWideN * kWarpWide;
  const GemmTile tile =
      gemmTileOf(blockIdx.x, ceilDivDevice(m, kTileM), ceilDivDevice(n, kWideTileN), kGroupRows);
  const int64_t m0 = tile.row * kTileM;
  const int64_t n0 = tile.column * kWideTileN;
  auto a_tile = [&](int64_t step) { return stages + step % kStages * C::kStageElements; };
  auto b_tile = [&](int64_t step) { return a_tile(step) + kTileM * kRowStride; };

  float acc[kMmaTilesM][kTilesN][4];
  zeroTiles(acc);

  const int64_t steps = (k + kTileK - 1) / kTileK;
  auto issue = [&](int64_t step) {
    if (step < steps) {
      loadTile<C, kTileM, kWideThreads<C>>(xb, m, k, m0, step, a_tile(step));
      loadTile<C, kWideTileN, kWideThreads<C>>(w, n, k, n0, step, b_tile(step));
    }
    commitCopies();
  };
  // Step `step`'s copies are in and every thread is past its reads of the
  // stage the copies kStages - 1 steps on land in.
  auto advance = [&](int64_t step) {
    waitCopies<kStages - 2>();
    __syncthreads();
    issue(step + kStages - 1);
  };
  const auto [a_row, a_col, b_row, b_col] = fragmentLanes(lane);
  uint32_t af[2][kMmaTilesM][4];
  uint32_t bf[2][kTilesN / 2][4];
  auto fragments = [&](int64_t step, int slice, int buffer) {
    const uint16_t* a = a_tile(step) + slice * kMmaK;
    const uint16_t* b = b_tile(step) + slice * kMmaK;
#pragma unroll
    for (int i = 0; i < kMmaTilesM; ++i) {
      loadMatrices(af[buffer][i], a + (warp_m + i * 16 + a_row) * kRowStride + a_col);
    }
#pragma unroll
    for (int j = 0; j < kTilesN / 2; ++j) {
      loadMatrices(bf[buffer][j], b + (warp_n + j * 16 + b_row) * kRowStride + b_col);
    }
  };

#pragma unroll
  for (int step = 0; step < kStages - 1; ++step) issue(step);
  advance(0);
  fragments(0, 0, 0);
  for (int64_t step = 0; step < steps; ++step) {
    // Slices inside k: all of a whole step's, those a partial last one
    // reaches (past k: no instruction, whatever m is).
    const int64_t left = k - step * kTileK;
    const int slices = left >= kTileK ? kSlices : static_cast<int>((left + kMmaK - 1) / kMmaK);
#pragma unroll
    for (int slice = 0; slice < kSlices; ++slice) {
      const int buffer = slice % 2;
      if (slice + 1 < kSlices) {
        fragments(step, slice + 1, 1 - buffer);
      } else if (step + 1 < steps) {
        advance(step + 1);
        fragments(step + 1, 0, 1 - buffer);
      }
      if (slice < slices) {
#pragma unroll
        for (int j = 0; j < kTilesN; j += 2) {
          const uint32_t b0[2] = {bf[buffer][j / 2][0], bf[buffer][j / 2][1]};
          const uint32_t b1[2] = {bf[buffer][j / 2][2], bf[buffer][j / 2][3]};
#pragma unroll
          for (int i = 0; i < kMmaTilesM; ++i) {
            mmaBf16(acc[i][j], af[buffer][i], b0);
            mmaBf16(acc[i][j + 1], af[buffer][i], b1);
          }
        }
      }
    }
  }
  waitCopies<0>();

  storeTiles(acc, m0 + warp_m + lane / 4, n0 + warp_n + lane % 4 * 2, m, n, out);
}

// Configuration 8: the pipelined kernel's 128 x 128 tiles and configuration
// 1's K step and depth; 9: 128 x 256 tiles.
using Config8 = Config<64, 3>;
using Config9 = Config<64, 3, 256>;

template <typename C>
void launchWide(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
                const uint16_t* weights, int64_t n, const MatmulEpilogue& out) {
  optInSharedMemory<bf16MmaWideKernel<C>>(
      C::kSmemBytes, "bf16 matmul: cudaFuncSetAttribute refused the wide kernel's shared memory");
  const int64_t tiles = ceilDiv(m, kTileM) * ceilDiv(n, C::kTileN);
  TANDEM_CHECK(tiles <= std::numeric_limits<int32_t>::max(),
               "bf16 matmul: too many output tiles for one launch");
  bf16MmaWideKernel<C>
      <<<static_cast<unsigned int>(tiles), kWideThreads<C>, C::kSmemBytes, stream>>>(
          x_bf16, m, k, weights, n, out);
}

// x rounded to bf16 as bf16MmaKernel's storeStep rounds it.
__global__ void roundToBf16Kernel(const float* __restrict__ x, int64_t count,
                                  uint16_t* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = f32ToBf16Bits(x[i]);
  }
}

}  // namespace pipelined

// ---- the skinny kernel (m <= 64, fragment-ordered weights) ----

namespace skinny {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// The row groups (8 rows each) a launch covers for m rows: 1, 2, 4 or 8.
int rowGroupsFor(int64_t m) {
  const int64_t groups = (m + 7) / 8;
  return groups <= 1 ? 1 : groups <= 2 ? 2 : groups <= 4 ? 4 : 8;
}

// x rounded to bf16 (as packBf16 rounds it for the other kernels) in the
// weights' fragment order (weight_layout.h MmaFragmentTiling, x's rows in
// the place of the weights' columns): lane 4g + q of row group r finds, as
// one 16-byte vector per pair p, the a0, a2 words of row 8r + g for slices
// 2p and 2p + 1. Rows past m (up to the launch's row groups) and k past the
// row are zero, as the other kernels pad their A tiles.
__global__ void xToFragmentsKernel(const float* __restrict__ x, int64_t m, int64_t k, int64_t rows,
                                   uint4* __restrict__ out) {
  const MmaFragmentTiling t{rows, k};
  const int64_t vectors = t.elements() / 8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(v % 32);
    const int64_t p = v / 32 % t.pairs();
    const int64_t row = MmaFragmentTiling::column(v / 32 / t.pairs(), lane);
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float pair[2] = {0.0f, 0.0f};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t kk = MmaFragmentTiling::kOf(p, lane, 2 * w + e);
        if (row < m && kk < k) pair[e] = x[row * k + kk];
      }
      words[w] = packBf16(pair[0], pair[1]);
    }
    out[v] = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// kPairs pairs (32 k each: two 16-wide slices) of one warp's weights and
// of x's fragments, loaded together so their latencies overlap. A warp's
// pairs run up to `end` (the whole k, `pairs`, but for the split-K variant).
template <int kRowGroups, int kPairs>
struct Batch {
  uint4 w[kPairs];
  uint4 x[kPairs][kRowGroups];
};

template <int kRowGroups, int kPairs>
__device__ __forceinline__ void loadBatch(const uint4* __restrict__ column,
                                          const uint4* __restrict__ xs, int64_t pairs, int64_t p0,
                                          int64_t end, Batch<kRowGroups, kPairs>& batch) {
#pragma unroll
  for (int u = 0; u < kPairs; ++u) {
    if (p0 + u >= end) break;
    batch.w[u] = loadStreaming(column + (p0 + u) * 32);
#pragma unroll
    for (int r = 0; r < kRowGroups; ++r) batch.x[u][r] = __ldg(xs + (r * pairs + p0 + u) * 32);
  }
}

// x's fragments of a batch alone (the staged kernel's weights come from
// shared memory).
template <int kRowGroups, int kPairs>
__device__ __forceinline__ void loadXs(const uint4* __restrict__ xs, int64_t pairs, int64_t p0,
                                       int64_t end, Batch<kRowGroups, kPairs>& batch) {
#pragma unroll
  for (int u = 0; u < kPairs; ++u) {
    if (p0 + u >= end) break;
#pragma unroll
    for (int r = 0; r < kRowGroups; ++r) batch.x[u][r] = __ldg(xs + (r * pairs + p0 + u) * 32);
  }
}

// The batch's mma, pair by pair and slice by slice in ascending k: m16n8k16
// tile i takes row groups 2i (rows 16i + g: a0, a2) and 2i + 1 (rows
// 16i + 8 + g: a1, a3; zero past the launch's groups).
template <int kRowGroups, int kPairs, int kMTiles>
__device__ __forceinline__ void multiplyBatch(const Batch<kRowGroups, kPairs>& batch, int64_t end,
                                              int64_t p0, int64_t k, float (&acc)[kMTiles][1][4]) {
#pragma unroll
  for (int u = 0; u < kPairs; ++u) {
    if (p0 + u >= end) break;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if ((p0 + u) * 32 + half * kMmaK >= k) break;  // past k: no instruction, whatever m is
      const uint4& w = batch.w[u];
      const uint32_t fragment[2] = {half == 0 ? w.x : w.z, half == 0 ? w.y : w.w};
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const uint4& low = batch.x[u][2 * i];
        const uint4 high = 2 * i + 1 < kRowGroups ? batch.x[u][2 * i + 1] : make_uint4(0, 0, 0, 0);
        const uint32_t a[4] = {half == 0 ? low.x : low.z, half == 0 ? high.x : high.z,
                               half == 0 ? low.y : low.w, half == 0 ? high.y : high.w};
        mmaBf16(acc[i][0], a, fragment);
      }
    }
  }
}

// The chain over pairs [begin, end) with kDepth batches in registers: the
// loads of the next kDepth - 1 are in flight while the tensor cores
// multiply this one (2: the serving and the unordered kernels). The same
// mma in the same order whatever kDepth: only when each pair's registers
// are loaded changes. Every batch index is a compile-time constant (the
// loops unroll), so the batches stay in registers.
template <int kRowGroups, int kPairs, int kDepth, int kMTiles>
__device__ __forceinline__ void multiplyPairs(const uint4* __restrict__ column,
                                              const uint4* __restrict__ xs, int64_t pairs,
                                              int64_t begin, int64_t end, int64_t k,
                                              float (&acc)[kMTiles][1][4]) {
  Batch<kRowGroups, kPairs> batches[kDepth];
#pragma unroll
  for (int s = 0; s + 1 < kDepth; ++s) {
    if (begin + s * kPairs < end) loadBatch(column, xs, pairs, begin + s * kPairs, end, batches[s]);
  }
  for (int64_t p0 = begin; p0 < end; p0 += kDepth * kPairs) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      const int64_t at = p0 + s * kPairs;
      const int64_t ahead = at + (kDepth - 1) * kPairs;
      if (ahead < end) loadBatch(column, xs, pairs, ahead, end, batches[(s + kDepth - 1) % kDepth]);
      if (at < end) multiplyBatch(batches[s], end, at, k, acc);
    }
  }
}

// What each skinny kernel's warp starts from: its tile column (8 outputs;
// `active` false past the last, where the warp returns: these kernels have
// no barrier), the k pairs, and where its lane's weight and x fragments
// start.
struct SkinnyWarp {
  bool active;
  int lane;
  int64_t tile, pairs;
  const uint4* column;
  const uint4* xs;
};
__device__ __forceinline__ SkinnyWarp skinnyWarp(const uint4* __restrict__ x_fragments, int64_t k,
                                                 const uint4* __restrict__ fragments, int64_t n) {
  SkinnyWarp w;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  w.lane = static_cast<int>(threadIdx.x) % 32;
  const MmaFragmentTiling t{n, k};
  w.tile = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  w.active = w.tile < t.tileColumns();
  w.pairs = t.pairs();
  w.column = fragments + w.tile * w.pairs * 32 + w.lane;
  w.xs = x_fragments + w.lane;
  return w;
}

// A warp owns one tile column (8 outputs) and streams its whole k; loads of
// the next kPairs pairs are in flight while the tensor cores multiply these.
template <int kRowGroups, int kPairs>
__global__ void __launch_bounds__(kThreads)
    bf16MmaSkinnyKernel(const uint4* __restrict__ x_fragments, int64_t m, int64_t k,
                        const uint4* __restrict__ fragments, int64_t n, MatmulEpilogue out) {
  constexpr int kMTiles = (kRowGroups + 1) / 2;
  const SkinnyWarp w = skinnyWarp(x_fragments, k, fragments, n);
  if (!w.active) return;
  float acc[kMTiles][1][4];
  zeroTiles(acc);
  multiplyPairs<kRowGroups, kPairs, 2>(w.column, w.xs, w.pairs, 0, w.pairs, k, acc);
  storeTiles(acc, w.lane / 4, w.tile * 8 + w.lane % 4 * 2, m, n, out);
}

// The deep decode loads (CudaBackendOptions::deep_skinny): the kernel above
// with each warp's weights streamed through a ring of kStages batches in
// shared memory by 16-byte cp.async (L2 only, so x stays in L1), so that
// kStages - 1 batches of weights are in flight instead of one, without
// registers for them: a ring of 16 KB a warp for m <= 16, 8 KB and 4 KB for
// m <= 32 and 64 (where a batch is 2 and 1 pairs), against batches of 4 KB,
// 2 KB, 1 KB and 512 bytes in the kernel above. x's fragments of the next batch are loaded into
// registers while this one is multiplied, as there. Each lane reads back
// only the 16 bytes it copied, so a wait on its own groups is all it needs
// (no barrier); a slot is refilled only after the batch read from it was
// multiplied. The same mma in the same order, so the same bits.
template <int kPairs>
constexpr int kSkinnyStages = kPairs >= 8 ? 4 : 8;
template <int kPairs>
constexpr size_t skinnyStagedBytes() {
  const size_t ring_pairs = static_cast<size_t>(kSkinnyStages<kPairs>) * kPairs;
  return kWarps * ring_pairs * 32 * sizeof(uint4);
}

// Batch b's weights (kPairs pairs of this lane's column) into ring slot
// b % kStages, then one commit group for them and any copy issued before
// (empty past the last batch, or where `copy` is false): batch b is group b
// of the kernels below.
template <int kPairs, int kStages>
__device__ __forceinline__ void issueWeights(uint4* ring, const uint4* __restrict__ column,
                                             int64_t pairs, int64_t batches, int64_t b, bool copy) {
  if (copy && b < batches) {
    uint4* slot = ring + (b % kStages) * kPairs * 32;
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      if (b * kPairs + u < pairs) copyAsync16(slot + u * 32, column + (b * kPairs + u) * 32);
    }
  }
  commitCopies();
}

template <int kRowGroups, int kPairs>
__global__ void __launch_bounds__(kThreads)
    bf16MmaSkinnyStagedKernel(const uint4* __restrict__ x_fragments, int64_t m, int64_t k,
                              const uint4* __restrict__ fragments, int64_t n, MatmulEpilogue out) {
  constexpr int kMTiles = (kRowGroups + 1) / 2;
  constexpr int kStages = kSkinnyStages<kPairs>;
  extern __shared__ __align__(16) uint4 staged_weights[];
  const SkinnyWarp w = skinnyWarp(x_fragments, k, fragments, n);
  if (!w.active) return;
  const int64_t pairs = w.pairs;
  const int64_t batches = (pairs + kPairs - 1) / kPairs;
  // This lane's pair u of ring slot s: ring[(s · kPairs + u) · 32].
  uint4* ring = staged_weights + (threadIdx.x / 32) * kStages * kPairs * 32 + w.lane;

  auto issue = [&](int64_t b) {
    issueWeights<kPairs, kStages>(ring, w.column, pairs, batches, b, true);
  };

  float acc[kMTiles][1][4];
  zeroTiles(acc);
#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) issue(s);
  Batch<kRowGroups, kPairs> ready[2];  // batch b's x (and then weights) in ready[b % 2]
  loadXs(w.xs, pairs, 0, pairs, ready[0]);
  for (int64_t b0 = 0; b0 < batches; b0 += 2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t b = b0 + h;
      if (b >= batches) break;
      // Into the slot batch b - 1 was read from (and multiplied).
      issue(b + kStages - 1);
      if (b + 1 < batches) loadXs(w.xs, pairs, (b + 1) * kPairs, pairs, ready[1 - h]);
      // Groups 0 .. b + kStages - 1 are committed: batch b's has landed
      // when at most kStages - 1 are in flight.
      waitCopies<kStages - 1>();
      const uint4* slot = ring + (b % kStages) * kPairs * 32;
#pragma unroll
      for (int u = 0; u < kPairs; ++u) {
        if (b * kPairs + u < pairs) ready[h].w[u] = slot[u * 32];
      }
      multiplyBatch(ready[h], pairs, b * kPairs, k, acc);
    }
  }
  waitCopies<0>();  // the last, empty groups
  storeTiles(acc, w.lane / 4, w.tile * 8 + w.lane % 4 * 2, m, n, out);
}

// The deep decode loads at four and eight row groups (17 to 64 rows): the
// kernel above with x's fragments shared by the block's warps as well.
// There each warp reads the whole of x for its 8 outputs, four and eight
// times the bytes of its weights (a 32-row x of the 8B shape's gate/up is
// 256 KB, more than an SM's L1 beside its shared memory, so the block's
// four warps and the SM's other blocks read it again from L2). Here the
// block copies x once, a chunk of kStages batches at a time, into one of two
// shared slots (64 KB in all), and its warps read their fragments from
// there; the weights go through each warp's ring as above. Chunk c + 1 is
// copied into the slot chunk c - 1 used, after a barrier at chunk c's first
// batch that every thread reaches having waited for its own copies of chunk
// c (so all of chunk c is there, and no warp still reads chunk c - 1); its
// copies are committed with the next batch's weights, kStages batches
// before chunk c + 1 begins, so that batch's wait covers them. A warp past
// the last tile column copies its share of x and meets every barrier, and
// streams no weights. The same mma in the same order, so the same bits.
template <int kPairs>
constexpr int64_t kSkinnyChunkPairs = int64_t{kSkinnyStages<kPairs>} * kPairs;
template <int kRowGroups, int kPairs>
constexpr size_t skinnySharedBytes() {
  return skinnyStagedBytes<kPairs>() +
         2 * static_cast<size_t>(kRowGroups) * kSkinnyChunkPairs<kPairs> * 32 * sizeof(uint4);
}

template <int kRowGroups, int kPairs>
__global__ void __launch_bounds__(kThreads)
    bf16MmaSkinnySharedKernel(const uint4* __restrict__ x_fragments, int64_t m, int64_t k,
                              const uint4* __restrict__ fragments, int64_t n, MatmulEpilogue out) {
  static_assert(kRowGroups >= 4, "up to 16 rows, x is as many bytes as the weights or fewer");
  constexpr int kMTiles = (kRowGroups + 1) / 2;
  constexpr int kStages = kSkinnyStages<kPairs>;
  constexpr int64_t kChunkPairs = kSkinnyChunkPairs<kPairs>;
  constexpr int kSlotVectors = kRowGroups * static_cast<int>(kChunkPairs) * 32;
  extern __shared__ __align__(16) uint4 staged[];
  const SkinnyWarp w = skinnyWarp(x_fragments, k, fragments, n);
  const int64_t pairs = w.pairs;
  const int64_t batches = (pairs + kPairs - 1) / kPairs;
  // x's slots (vector (r · kChunkPairs + p) · 32 + lane: pair p of the
  // chunk, row group r), then the warps' weight rings as above.
  uint4* x_slots = staged;
  uint4* ring = staged + 2 * kSlotVectors + (threadIdx.x / 32) * kStages * kPairs * 32 + w.lane;

  // Chunk c's x into slot c % 2, by the whole block; not committed here.
  auto copyX = [&](int64_t c) {
    const int64_t p0 = c * kChunkPairs;
    if (p0 >= pairs) return;
    uint4* slot = x_slots + (c % 2) * kSlotVectors;
    for (int i = static_cast<int>(threadIdx.x); i < kSlotVectors; i += kThreads) {
      const int64_t p = i / 32 % kChunkPairs;
      const int64_t r = i / 32 / kChunkPairs;
      if (p0 + p < pairs) copyAsync16(slot + i, x_fragments + (r * pairs + p0 + p) * 32 + i % 32);
    }
  };
  // Batch b's weights, with whatever copyX left, as group b (no weights for
  // a warp past the last column).
  auto issue = [&](int64_t b) {
    issueWeights<kPairs, kStages>(ring, w.column, pairs, batches, b, w.active);
  };

  float acc[kMTiles][1][4];
  zeroTiles(acc);
  copyX(0);  // in group 0
#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) issue(s);
  Batch<kRowGroups, kPairs> ready;
  for (int64_t b = 0; b < batches; ++b) {
    issue(b + kStages - 1);
    // Groups 0 .. b landed: batch b's weights, and at a chunk's first batch
    // this thread's copies of the chunk's x (group b itself, closed at batch
    // b - kStages + 1; group 0 for chunk 0).
    waitCopies<kStages - 1>();
    const int64_t chunk = b / kStages;  // kChunkPairs = kStages batches
    if (b % kStages == 0) {
      __syncthreads();
      copyX(chunk + 1);  // committed with batch b + kStages's weights
    }
    if (!w.active) continue;
    const uint4* slot = ring + (b % kStages) * kPairs * 32;
    const uint4* xs = x_slots + (chunk % 2) * kSlotVectors + w.lane;
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const int64_t p = b * kPairs + u;
      if (p >= pairs) break;
      ready.w[u] = slot[u * 32];
#pragma unroll
      for (int r = 0; r < kRowGroups; ++r) {
        ready.x[u][r] = xs[(r * kChunkPairs + p - chunk * kChunkPairs) * 32];
      }
    }
    multiplyBatch(ready, pairs, b * kPairs, k, acc);
  }
  waitCopies<0>();  // the last, empty groups
  if (w.active) storeTiles(acc, w.lane / 4, w.tile * 8 + w.lane % 4 * 2, m, n, out);
}

// NOT batch-invariant: the unconstrained variant of the kernel above, for
// measuring what its fixed order costs (tandem-bench engine
// --unordered-decode, docs/cuda.md "The cost of batch invariance"), never
// a serving path. The same fragments, loads and batches, but each warp's k
// is split over gridDim.y blocks (more blocks in flight where n is small)
// and the partial sums are added into y with atomics: an output's bits
// then depend on which split lands first. y += the product (kAdd; kStore:
// y was zeroed first).
template <int kRowGroups, int kPairs>
__global__ void __launch_bounds__(kThreads)
    bf16MmaSkinnySplitKernel(const uint4* __restrict__ x_fragments, int64_t m, int64_t k,
                             const uint4* __restrict__ fragments, int64_t n, float* y) {
  constexpr int kMTiles = (kRowGroups + 1) / 2;
  const SkinnyWarp w = skinnyWarp(x_fragments, k, fragments, n);
  if (!w.active) return;
  const int64_t pairs = w.pairs;
  const int64_t per_split = (pairs + gridDim.y - 1) / gridDim.y;
  const int64_t begin = blockIdx.y * per_split;
  const int64_t end = begin + per_split < pairs ? begin + per_split : pairs;
  if (begin >= end) return;
  float acc[kMTiles][1][4];
  zeroTiles(acc);
  multiplyPairs<kRowGroups, kPairs, 2>(w.column, w.xs, pairs, begin, end, k, acc);
  const int64_t column = w.tile * 8 + w.lane % 4 * 2;
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = i * 16 + e / 2 * 8 + w.lane / 4;
      const int64_t c = column + e % 2;
      if (row < m && c < n) atomicAdd(y + row * n + c, acc[i][0][e]);
    }
  }
}

// `splits` 0: the ordered kernel through `out`; more: the unordered split-K
// variant, adding into out.y.
// x_ready: x_fragments already hold x (written by x's producer, epilogue.h
// NextFragments), so x is not rounded again.
// deep: the ordered kernel with its weights staged through shared memory
// (bf16MmaSkinnyStagedKernel; past 16 rows bf16MmaSkinnySharedKernel), with
// more dynamic shared memory than the 48 KB default (optInSharedMemory).
template <int kRowGroups, int kPairs>
void launchWith(cudaStream_t stream, const float* x, int64_t m, int64_t k, const uint4* fragments,
                int64_t n, const MatmulEpilogue& out, uint4* x_fragments, int splits, bool x_ready,
                bool deep) {
  const int64_t rows = 8 * kRowGroups;
  const int64_t vectors = MmaFragmentTiling{rows, k}.elements() / 8;
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(ceilDiv(vectors, 256), 1024));
  if (!x_ready) xToFragmentsKernel<<<blocks, 256, 0, stream>>>(x, m, k, rows, x_fragments);
  const auto tiles =
      static_cast<unsigned int>(ceilDiv(MmaFragmentTiling{n, k}.tileColumns(), kWarps));
  if constexpr (kRowGroups >= 4) {
    if (splits == 0 && deep) {
      constexpr size_t kShared = skinnySharedBytes<kRowGroups, kPairs>();
      optInSharedMemory<bf16MmaSkinnySharedKernel<kRowGroups, kPairs>>(
          kShared,
          "bf16 skinny matmul: cudaFuncSetAttribute refused the shared-x kernel's shared memory");
      bf16MmaSkinnySharedKernel<kRowGroups, kPairs>
          <<<tiles, kThreads, kShared, stream>>>(x_fragments, m, k, fragments, n, out);
      return;
    }
  }
  if (splits == 0 && deep) {
    constexpr size_t kShared = skinnyStagedBytes<kPairs>();
    optInSharedMemory<bf16MmaSkinnyStagedKernel<kRowGroups, kPairs>>(
        kShared,
        "bf16 skinny matmul: cudaFuncSetAttribute refused the staged kernel's shared memory");
    bf16MmaSkinnyStagedKernel<kRowGroups, kPairs>
        <<<tiles, kThreads, kShared, stream>>>(x_fragments, m, k, fragments, n, out);
  } else if (splits == 0) {
    bf16MmaSkinnyKernel<kRowGroups, kPairs>
        <<<tiles, kThreads, 0, stream>>>(x_fragments, m, k, fragments, n, out);
  } else {
    bf16MmaSkinnySplitKernel<kRowGroups, kPairs>
        <<<dim3(tiles, static_cast<unsigned int>(splits)), kThreads, 0, stream>>>(
            x_fragments, m, k, fragments, n, out.y);
  }
}

void launchSkinny(cudaStream_t stream, const float* x, int64_t m, int64_t k, const void* fragments,
                  int64_t n, const MatmulEpilogue& out, void* x_fragments, int splits, bool x_ready,
                  bool deep) {
  TANDEM_CHECK(m >= 1 && m <= kBf16MmaSkinnyRows, "bf16 skinny matmul: m must be in 1..64");
  TANDEM_CHECK(reinterpret_cast<uintptr_t>(x_fragments) % 16 == 0,
               "bf16 skinny matmul: the x scratch must be 16-byte aligned");
  const auto* frags = static_cast<const uint4*>(fragments);
  auto* xs = static_cast<uint4*>(x_fragments);
  // Pairs per batch: two batches of weights and x in registers, about 128
  // registers of loads whatever the row groups.
  switch (rowGroupsFor(m)) {
    case 1:
      launchWith<1, 8>(stream, x, m, k, frags, n, out, xs, splits, x_ready, deep);
      break;
    case 2:
      launchWith<2, 4>(stream, x, m, k, frags, n, out, xs, splits, x_ready, deep);
      break;
    case 4:
      launchWith<4, 2>(stream, x, m, k, frags, n, out, xs, splits, x_ready, deep);
      break;
    default:
      launchWith<8, 1>(stream, x, m, k, frags, n, out, xs, splits, x_ready, deep);
      break;
  }
}

}  // namespace skinny

}  // namespace

int64_t bf16MmaSkinnyScratchBytes(int64_t m, int64_t k) {
  return MmaFragmentTiling{8 * skinny::rowGroupsFor(m), k}.bytes();
}

void launchBf16MmaSkinny(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                         const void* fragments, int64_t n, const MatmulEpilogue& out,
                         void* x_fragments, bool x_ready, bool deep) {
  skinny::launchSkinny(stream, x, m, k, fragments, n, out, x_fragments, 0, x_ready, deep);
}

void launchBf16MmaSkinnyUnordered(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                                  const void* fragments, int64_t n, const MatmulEpilogue& out,
                                  void* x_fragments, int sm_count) {
  TANDEM_CHECK(out.kind == MatmulEpilogue::kStore || out.kind == MatmulEpilogue::kAdd,
               "unordered bf16 skinny matmul: a plain or adding store only");
  const MmaFragmentTiling t{n, k};
  // Enough splits of k for four blocks per SM, at least one pair each.
  const int64_t blocks = ceilDiv(t.tileColumns(), skinny::kWarps);
  const auto splits =
      static_cast<int>(std::clamp<int64_t>(ceilDiv(4 * int64_t{sm_count}, blocks), 1, t.pairs()));
  if (out.kind == MatmulEpilogue::kStore) {
    TANDEM_CHECK(cudaMemsetAsync(out.y, 0, static_cast<size_t>(m * n) * sizeof(float), stream) ==
                     cudaSuccess,
                 "unordered bf16 skinny matmul: cudaMemsetAsync");
  }
  skinny::launchSkinny(stream, x, m, k, fragments, n, out, x_fragments, splits, false, false);
}

#if !defined(TANDEM_HAVE_WGMMA)
// Without sm_90 in the build: configuration 4 is refused by the backend,
// and this stands in for the kernel it never launches.
void launchBf16Wgmma(cudaStream_t, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                     const MatmulEpilogue&, int, int) {
  TANDEM_CHECK(false, "bf16 matmul: this build has no wgmma kernel");
}
#endif

bool bf16WgmmaBuilt() {
#if defined(TANDEM_HAVE_WGMMA)
  return true;
#else
  return false;
#endif
}

int64_t bf16MmaScratchElements(int64_t m, int64_t k) {
  return m > kBf16MmaSmallRows && k % 8 == 0 ? m * k : 0;
}

void launchBf16MmaMatmul(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                         const WeightView& w, const MatmulEpilogue& out, uint16_t* x_bf16,
                         int config, int sm_count) {
  TANDEM_CHECK(config >= 0 && config < kBf16GemmConfigs, "bf16 matmul: no such configuration");
  TANDEM_CHECK(w.cols == k, "bf16 matmul: weight columns must equal k");
  TANDEM_CHECK(w.dtype == DType::kBF16 && w.layout == WeightLayout::kRows,
               "bf16 matmul: weights must be bf16, row-major");
  const int64_t n = w.rows;
  if (m <= 0 || n <= 0 || k <= 0) return;
  TANDEM_CHECK(ceilDiv(m, kTileM) <= 65535, "bf16 matmul: too many rows for one launch");
  const auto* weights = static_cast<const uint16_t*>(w.data);
  const dim3 grid(static_cast<unsigned int>(ceilDiv(n, kTileN)),
                  static_cast<unsigned int>(ceilDiv(m, kTileM)));
  if (x_bf16 != nullptr && bf16MmaScratchElements(m, k) > 0 &&
      reinterpret_cast<uintptr_t>(weights) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x_bf16) % 16 == 0) {
    const int64_t count = m * k;
    const auto blocks = static_cast<unsigned int>(std::min<int64_t>(ceilDiv(count, 256), 4096));
    pipelined::roundToBf16Kernel<<<blocks, 256, 0, stream>>>(x, count, x_bf16);
    switch (config) {
      case kBf16GemmWgmma:
      case kBf16GemmWgmma + 1:
      case kBf16GemmWgmma + 2:
      case kBf16GemmWgmma + 3:
        launchBf16Wgmma(stream, x_bf16, m, k, weights, n, out, config, sm_count);
        return;
      case 1:
        pipelined::launchPipelined<pipelined::Config1>(stream, x_bf16, m, k, weights, n, out);
        return;
      case kBf16GemmWide:
        pipelined::launchWide<pipelined::Config8>(stream, x_bf16, m, k, weights, n, out);
        return;
      case kBf16GemmWide + 1:
        pipelined::launchWide<pipelined::Config9>(stream, x_bf16, m, k, weights, n, out);
        return;
      case 2:
        pipelined::launchPipelined<pipelined::Config2>(stream, x_bf16, m, k, weights, n, out);
        return;
      case 3:
        pipelined::launchPipelined<pipelined::Config3>(stream, x_bf16, m, k, weights, n, out);
        return;
      default:
        pipelined::launchPipelined<pipelined::Config0>(stream, x_bf16, m, k, weights, n, out);
        return;
    }
  }
  const bool vector = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(weights) % 16 == 0;
  if (vector) {
    bf16MmaKernel<true><<<grid, kThreads, 0, stream>>>(x, m, k, weights, n, out);
  } else {
    bf16MmaKernel<false><<<grid, kThreads, 0, stream>>>(x, m, k, weights, n, out);
  }
}

}  // namespace tandem::kernels::cuda
