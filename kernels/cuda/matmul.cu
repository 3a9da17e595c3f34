// matmul of the CUDA backend: y[m, n] = x[m, k] · w[n, k]^T with f32, bf16 or
// f16 weights converted to fp32 on load and fp32 accumulation.
//
// Invariance: one tile shape (64 x 64 outputs, 16-deep K steps, 256 threads
// of 4 x 4 outputs each) for every m; no split-K or stream-K. Each output
// y[i, j] is owned by exactly one thread, which accumulates
// acc = fma(x[i, kk], w[j, kk], acc) for kk = 0, 1, ..., k - 1 in that order,
// starting from 0. That chain depends on k alone, so row i's result is the
// same bits whatever m is, where the row sits in its tile, or which tile the
// row lands in. Rows and columns past the edge of a tile load zeros and are
// never stored; the last K step simply runs fewer iterations (no padded
// terms enter the chain).
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

  float acc[kPerThreadM][kPerThreadN];
  for (int i = 0; i < kPerThreadM; ++i) {
    for (int j = 0; j < kPerThreadN; ++j) acc[i][j] = 0.0f;
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
        for (int j = 0; j < kPerThreadN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
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

}  // namespace

void launchMatmul(cudaStream_t stream, const float* x, int64_t m, int64_t k, const WeightView& w,
                  float* y) {
  TANDEM_CHECK(w.cols == k, "matmul: weight columns must equal k");
  const int64_t n = w.rows;
  if (m <= 0 || n <= 0) return;
  TANDEM_CHECK(ceilDiv(m, kTileM) <= 65535, "matmul: too many rows for one launch");
  const dim3 grid(static_cast<unsigned int>(ceilDiv(n, kTileN)),
                  static_cast<unsigned int>(ceilDiv(m, kTileM)));
  switch (w.dtype) {
    case DType::kF32:
      matmulKernel<F32Elements>
          <<<grid, kThreads, 0, stream>>>(x, m, k, static_cast<const float*>(w.data), n, y);
      return;
    case DType::kBF16:
      matmulKernel<Bf16Elements>
          <<<grid, kThreads, 0, stream>>>(x, m, k, static_cast<const uint16_t*>(w.data), n, y);
      return;
    case DType::kF16:
      matmulKernel<F16Elements>
          <<<grid, kThreads, 0, stream>>>(x, m, k, static_cast<const uint16_t*>(w.data), n, y);
      return;
  }
}

}  // namespace tandem::kernels::cuda
