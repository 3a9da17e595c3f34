// Elementwise kernels of the CUDA backend: embedding, addBias, addInPlace,
// siluMul, a matmul's epilogue over its stored result (epilogue.h),
// gatherLastRows, and argmax.
//
// Invariance: every output element is a function of the inputs at its own
// index (and, for embedding/gather, the row it copies), computed by one
// thread with no reduction, so neither the number of rows nor the launch
// shape can change a bit of it. Products use __fmul_rn/__fdiv_rn/__fadd_rn,
// which the compiler never contracts into an fma, so the arithmetic is the
// CPU's (kernels/cpu/, built with -ffp-contract=off) up to expf's rounding.
#include "common/check.h"
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/epilogue.h"
#include "kernels/cuda/launch.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned int gridFor(int64_t n) { return static_cast<unsigned int>(ceilDiv(n, kThreads)); }

// One block per row; threads stride over the columns.
template <typename Elements>
__global__ void embeddingKernel(const typename Elements::Storage* table, int64_t cols,
                                const int32_t* ids, float* out) {
  const int64_t row = blockIdx.x;
  const typename Elements::Storage* src = table + static_cast<int64_t>(ids[row]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[row * cols + c] = Elements::load(src, c);
  }
}

__global__ void addBiasKernel(float* y, const float* bias, int64_t rows, int64_t width) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  y[i] = __fadd_rn(y[i], bias[i % width]);
}

__global__ void addInPlaceKernel(float* y, const float* x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void siluMulKernel(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = siluTimes(gate[i], up[i]);
}

// One thread per output (per pair of outputs for the pair kinds) of t.
__global__ void matmulEpilogueKernel(const float* __restrict__ t, int64_t m, int64_t n,
                                     MatmulEpilogue e) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e.inPairs()) {
    const int64_t pairs = n / 2;
    if (i >= m * pairs) return;
    const int64_t row = i / pairs;
    const int64_t column = i % pairs * 2;
    e.storePair(row, column, n, t[row * n + column], t[row * n + column + 1]);
    return;
  }
  if (i >= m * n) return;
  e.storeOne(i / n, i % n, n, t[i]);
}

// One block per sequence; a sequence without rows gets zeros.
__global__ void gatherLastRowsKernel(const int64_t* last_rows, const float* x, int64_t width,
                                     float* out) {
  const int64_t s = blockIdx.x;
  const int64_t row = last_rows[s];
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    out[s * width + c] = row < 0 ? 0.0f : x[row * width + c];
  }
}

// One block per row. Thread t scans elements t, t + 256, ... keeping the
// first strictly larger value (as the CPU's scan); the 256 candidates meet in
// a fixed tree where the larger value wins and equal values go to the
// smaller index. The result is the smallest index of the row's maximum, so
// it equals the CPU's exactly (a max and an index carry no rounding).
constexpr int kArgmaxThreads = 256;
constexpr int32_t kNoIndex = INT32_MAX;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmaxKernel(const float* x, int64_t width, int32_t* out) {
  __shared__ float values[kArgmaxThreads];
  __shared__ int32_t indices[kArgmaxThreads];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * width;
  const int tid = threadIdx.x;
  float best = -INFINITY;
  int32_t index = kNoIndex;
  for (int64_t i = tid; i < width; i += kArgmaxThreads) {
    if (row[i] > best) {
      best = row[i];
      index = static_cast<int32_t>(i);
    }
  }
  values[tid] = best;
  indices[tid] = index;
  __syncthreads();
  for (int stride = kArgmaxThreads / 2; stride > 0; stride /= 2) {
    if (tid < stride) {
      const float other = values[tid + stride];
      const int32_t other_index = indices[tid + stride];
      if (other > values[tid] || (other == values[tid] && other_index < indices[tid])) {
        values[tid] = other;
        indices[tid] = other_index;
      }
    }
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = indices[0] == kNoIndex ? 0 : indices[0];
}

}  // namespace

void launchArgmax(cudaStream_t stream, const float* x, int64_t rows, int64_t width, int32_t* out) {
  if (rows <= 0 || width <= 0) return;
  argmaxKernel<<<static_cast<unsigned int>(rows), kArgmaxThreads, 0, stream>>>(x, width, out);
}

void launchEmbedding(cudaStream_t stream, const WeightView& table, const DeviceBatch& batch,
                     float* out) {
  if (batch.rows <= 0 || table.cols <= 0) return;
  const auto grid = static_cast<unsigned int>(batch.rows);
  switch (table.dtype) {
    case DType::kF32:
      embeddingKernel<F32Elements><<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(table.data), table.cols, batch.token_ids, out);
      return;
    case DType::kBF16:
      embeddingKernel<Bf16Elements><<<grid, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(table.data), table.cols, batch.token_ids, out);
      return;
    case DType::kF16:
      embeddingKernel<F16Elements><<<grid, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(table.data), table.cols, batch.token_ids, out);
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

void launchAddBias(cudaStream_t stream, float* y, const float* bias, int64_t rows, int64_t width) {
  if (rows <= 0 || width <= 0) return;
  addBiasKernel<<<gridFor(rows * width), kThreads, 0, stream>>>(y, bias, rows, width);
}

void launchAddInPlace(cudaStream_t stream, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  addInPlaceKernel<<<gridFor(n), kThreads, 0, stream>>>(y, x, n);
}

void launchSiluMul(cudaStream_t stream, const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  siluMulKernel<<<gridFor(n), kThreads, 0, stream>>>(gate, up, out, n);
}

void launchMatmulEpilogue(cudaStream_t stream, const float* t, int64_t m, int64_t n,
                          const MatmulEpilogue& e) {
  const int64_t threads = e.inPairs() ? m * (n / 2) : m * n;
  if (threads <= 0) return;
  matmulEpilogueKernel<<<gridFor(threads), kThreads, 0, stream>>>(t, m, n, e);
}

void launchGatherLastRows(cudaStream_t stream, const DeviceBatch& batch, const float* x,
                          int64_t width, float* out) {
  if (batch.num_sequences <= 0 || width <= 0) return;
  gatherLastRowsKernel<<<static_cast<unsigned int>(batch.num_sequences), kThreads, 0, stream>>>(
      batch.last_rows, x, width, out);
}

}  // namespace tandem::kernels::cuda
