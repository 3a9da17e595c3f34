// matmul of the CUDA backend: y[m, n] = x[m, k] · w[n, k]^T with f32, bf16 or
// f16 weights converted to fp32 on load and fp32 accumulation.
//
// Invariance: every output y[i, j] is summed in one order fixed by k alone,
// whatever m is and whichever kernel computes it. k is cut into chunks of
// kChunk = 128 ([0, 128), [128, 256), ...). Each chunk's partial is one fma
// chain part = fma(x[i, kk], w[j, kk], part) over its kk in ascending order,
// from 0; the partials are added in chunk order, total = part_0, then
// total = total + part_c (rounded adds, never contracted). No split-K or
// stream-K that depends on the shape of the batch: the chunking is part of
// the weight shape's one order.
//
// Two kernels compute that order:
//  - matmulKernel, for any m: 64 x 64 output tiles, 16-deep K steps (16
//    divides kChunk), 256 threads of 4 x 4 outputs each; every thread keeps a
//    running partial and total per output and folds the partial in at each
//    chunk boundary. Rows and columns past the edge of a tile load zeros and
//    are never stored.
//  - gemvKernel, for decode-sized m (<= 64): one warp per 4 output columns;
//    for 8 rows at a time, lane l computes the partials of chunks l, l + 32,
//    ... and one lane per (column, row) then adds its partials in chunk
//    order. Weights are read with 16-byte loads by n / 4 warps, enough to
//    keep the memory busy, which a tile per 64 columns cannot do at small m
//    (n / 64 blocks).
// Both give every output the same bits, so a row's result does not depend on
// m, its place in the batch or the kernel that ran.
#include "common/check.h"
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/launch.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 16;
constexpr int kThreadsX = 16;  // along n
constexpr int kThreadsY = 16;  // along m
constexpr int kThreads = kThreadsX * kThreadsY;
constexpr int kPerThreadM = kTileM / kThreadsY;
constexpr int kPerThreadN = kTileN / kThreadsX;
constexpr int64_t kChunk = 128;
static_assert(kChunk % kTileK == 0, "a K step never straddles a chunk");
constexpr int kGemvMaxRows = 64;  // m up to this runs gemvKernel
constexpr int kGemvGroup = 8;     // rows a lane accumulates at once
constexpr int kGemvCols = 4;      // columns a warp computes together
constexpr int kGemvWarps = 2;     // warps per block
static_assert(kGemvGroup * kGemvCols == 32, "one lane per (column, row) adds the partials");
constexpr int kWarp = 32;

template <typename Elements>
__global__ void __launch_bounds__(kThreads)
    matmulKernel(const float* x, int64_t m, int64_t k, const typename Elements::Storage* w,
                 int64_t n, float* y) {
  // K-major tiles; +1 column keeps the transposing stores off one bank.
  __shared__ float x_tile[kTileK][kTileM + 1];
  __shared__ float w_tile[kTileK][kTileN + 1];
  const int tx = threadIdx.x % kThreadsX;
  const int ty = threadIdx.x / kThreadsX;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;

  float acc[kPerThreadM][kPerThreadN];   // sum of the finished chunks
  float part[kPerThreadM][kPerThreadN];  // the current chunk's chain
  for (int i = 0; i < kPerThreadM; ++i) {
    for (int j = 0; j < kPerThreadN; ++j) {
      acc[i][j] = 0.0f;
      part[i][j] = 0.0f;
    }
  }

  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    const int steps = static_cast<int>(min(static_cast<int64_t>(kTileK), k - k0));
    // Consecutive threads read consecutive k of one row.
    for (int e = threadIdx.x; e < kTileM * kTileK; e += kThreads) {
      const int r = e / kTileK;
      const int c = e % kTileK;
      const int64_t row = m0 + r;
      x_tile[c][r] = row < m && c < steps ? x[row * k + k0 + c] : 0.0f;
    }
    for (int e = threadIdx.x; e < kTileN * kTileK; e += kThreads) {
      const int r = e / kTileK;
      const int c = e % kTileK;
      const int64_t col = n0 + r;
      w_tile[c][r] = col < n && c < steps ? Elements::load(w, col * k + k0 + c) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < steps; ++kk) {
      float a[kPerThreadM];
      float b[kPerThreadN];
      for (int i = 0; i < kPerThreadM; ++i) a[i] = x_tile[kk][ty + i * kThreadsY];
      for (int j = 0; j < kPerThreadN; ++j) b[j] = w_tile[kk][tx + j * kThreadsX];
      for (int i = 0; i < kPerThreadM; ++i) {
        for (int j = 0; j < kPerThreadN; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
      }
    }
    __syncthreads();
    if ((k0 + kTileK) % kChunk == 0 || k0 + kTileK >= k) {
      const bool first_chunk = k0 < kChunk;
      for (int i = 0; i < kPerThreadM; ++i) {
        for (int j = 0; j < kPerThreadN; ++j) {
          acc[i][j] = first_chunk ? part[i][j] : __fadd_rn(acc[i][j], part[i][j]);
          part[i][j] = 0.0f;
        }
      }
    }
  }

  for (int i = 0; i < kPerThreadM; ++i) {
    const int64_t row = m0 + ty + i * kThreadsY;
    if (row >= m) continue;
    for (int j = 0; j < kPerThreadN; ++j) {
      const int64_t col = n0 + tx + j * kThreadsX;
      if (col < n) y[row * n + col] = acc[i][j];
    }
  }
}

// Eight consecutive weights from 16-byte aligned storage, as fp32.
template <typename Elements>
__device__ __forceinline__ void load8(const typename Elements::Storage* p, float out[8]) {
  if constexpr (sizeof(typename Elements::Storage) == 4) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0];
    const float4 hi = reinterpret_cast<const float4*>(p)[1];
    out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
    out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
  } else {
    const uint4 bits = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
    for (int e = 0; e < 4; ++e) {
      const auto low = static_cast<typename Elements::Storage>(words[e] & 0xffffu);
      const auto high = static_cast<typename Elements::Storage>(words[e] >> 16);
      out[2 * e] = Elements::load(&low, 0);
      out[2 * e + 1] = Elements::load(&high, 0);
    }
  }
}

// One warp per kGemvCols output columns j0.. (so each x element it loads
// serves every one of them). Rows are taken kGemvGroup at a time: lane l
// computes the partials of chunks l, l + 32, ... of every (column, row) into
// partials[((warp * kGemvCols + col) * kGemvGroup + i) * chunks + c]
// (dynamic shared memory), then lane col * kGemvGroup + i adds that pair's
// partials in chunk order. `vector`: k is a multiple of 8 and x, w are
// 16-byte aligned, so weights are read 8 at a time; the chain order is the
// same either way.
template <typename Elements>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    gemvKernel(const float* x, int m, int64_t k, const typename Elements::Storage* w, int64_t n,
               float* y, bool vector) {
  extern __shared__ float partials[];
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kGemvCols;
  if (j0 >= n) return;  // the whole warp leaves together
  const int cols = static_cast<int>(min(static_cast<int64_t>(kGemvCols), n - j0));
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  float* mine = partials + static_cast<int64_t>(warp) * kGemvCols * kGemvGroup * chunks;
  const typename Elements::Storage* w0 = w + j0 * k;

  for (int r0 = 0; r0 < m; r0 += kGemvGroup) {
    const int rows = min(kGemvGroup, m - r0);
    const float* x_group = x + static_cast<int64_t>(r0) * k;
    for (int64_t c = lane; c < chunks; c += kWarp) {
      const int64_t begin = c * kChunk;
      const int64_t end = min(k, begin + kChunk);
      float part[kGemvCols][kGemvGroup];
      for (int col = 0; col < kGemvCols; ++col) {
        for (int i = 0; i < kGemvGroup; ++i) part[col][i] = 0.0f;
      }
      if (vector) {
        for (int64_t kk = begin; kk < end; kk += 8) {
          float wv[kGemvCols][8];
          for (int col = 0; col < kGemvCols; ++col) {
            if (col < cols) load8<Elements>(w0 + col * k + kk, wv[col]);
          }
          for (int i = 0; i < kGemvGroup; ++i) {
            if (i >= rows) break;
            const float* xr = x_group + i * k + kk;
            const float4 lo = reinterpret_cast<const float4*>(xr)[0];
            const float4 hi = reinterpret_cast<const float4*>(xr)[1];
            const float xv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            for (int col = 0; col < kGemvCols; ++col) {
              if (col >= cols) break;
              for (int e = 0; e < 8; ++e) part[col][i] = fmaf(xv[e], wv[col][e], part[col][i]);
            }
          }
        }
      } else {
        for (int64_t kk = begin; kk < end; ++kk) {
          for (int col = 0; col < kGemvCols; ++col) {
            if (col >= cols) break;
            const float wv = Elements::load(w0 + col * k, kk);
            for (int i = 0; i < kGemvGroup; ++i) {
              if (i >= rows) break;
              part[col][i] = fmaf(x_group[i * k + kk], wv, part[col][i]);
            }
          }
        }
      }
      for (int col = 0; col < cols; ++col) {
        for (int i = 0; i < rows; ++i) mine[(col * kGemvGroup + i) * chunks + c] = part[col][i];
      }
    }
    __syncwarp();
    const int col = lane / kGemvGroup;
    const int i = lane % kGemvGroup;
    if (col < cols && i < rows) {
      const float* pair = mine + static_cast<int64_t>(col * kGemvGroup + i) * chunks;
      float total = pair[0];
      for (int64_t c = 1; c < chunks; ++c) total = __fadd_rn(total, pair[c]);
      y[static_cast<int64_t>(r0 + i) * n + j0 + col] = total;
    }
    __syncwarp();  // the next group reuses the partials
  }
}

// Shared memory of one gemvKernel block.
size_t gemvSharedBytes(int64_t k) {
  return static_cast<size_t>(kGemvWarps * kGemvCols * kGemvGroup * ceilDiv(k, kChunk)) *
         sizeof(float);
}

template <typename Elements>
void launchFor(cudaStream_t stream, const float* x, int64_t m, int64_t k,
               const typename Elements::Storage* w, int64_t n, float* y) {
  constexpr size_t kDefaultSharedLimit = 48 * 1024;
  if (m <= kGemvMaxRows && gemvSharedBytes(k) <= kDefaultSharedLimit) {
    const bool vector = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(w) % 16 == 0;
    gemvKernel<Elements>
        <<<static_cast<unsigned int>(ceilDiv(n, kGemvWarps * kGemvCols)), kGemvWarps * kWarp,
           gemvSharedBytes(k), stream>>>(x, static_cast<int>(m), k, w, n, y, vector);
    return;
  }
  TANDEM_CHECK(ceilDiv(m, kTileM) <= 65535, "matmul: too many rows for one launch");
  const dim3 grid(static_cast<unsigned int>(ceilDiv(n, kTileN)),
                  static_cast<unsigned int>(ceilDiv(m, kTileM)));
  matmulKernel<Elements><<<grid, kThreads, 0, stream>>>(x, m, k, w, n, y);
}

}  // namespace

void launchMatmul(cudaStream_t stream, const float* x, int64_t m, int64_t k, const WeightView& w,
                  float* y) {
  TANDEM_CHECK(w.cols == k, "matmul: weight columns must equal k");
  const int64_t n = w.rows;
  if (m <= 0 || n <= 0 || k <= 0) return;
  switch (w.dtype) {
    case DType::kF32:
      launchFor<F32Elements>(stream, x, m, k, static_cast<const float*>(w.data), n, y);
      return;
    case DType::kBF16:
      launchFor<Bf16Elements>(stream, x, m, k, static_cast<const uint16_t*>(w.data), n, y);
      return;
    case DType::kF16:
      launchFor<F16Elements>(stream, x, m, k, static_cast<const uint16_t*>(w.data), n, y);
      return;
    case DType::kF8E4M3:
      // The model runner refuses fp8 weights on this backend before any launch.
      TANDEM_CHECK(false, "fp8 weights reached a CUDA kernel");
      return;
    case DType::kU8:
      TANDEM_CHECK(false, "u8 bytes reached a CUDA kernel (MXFP4 runs on the CPU backend only)");
      return;
  }
}

}  // namespace tandem::kernels::cuda
