// rmsNorm and applyRope of the CUDA backend.
//
// rmsNorm invariance: one thread block owns one whole row (a row is never
// split across blocks). Thread t sums the squares of elements t, t + 256,
// t + 512, ... in that order, then the 256 partial sums meet in a fixed
// binary tree (stride 128, 64, ..., 1). Block size and tree are constants, so
// the reduction order depends on dim alone — not on the number of rows or
// where the row sits in the batch.
//
// applyRope invariance: each element pair of a row is rotated by one thread
// from that row's position and inv_freq only, by epilogue.h's ropeCosSin and
// ropeRotate (shared with the fused Q/K/V epilogue): the angle is position *
// inv_freq[i] in fp32, its cos/sin evaluated in double and rounded to fp32,
// as kernels/cpu/dispatch.cpp does; the rotation uses unfused multiplies and
// adds, like the CPU's -ffp-contract=off build. applyRopeWith's variant
// (kVariant: the first rotary_dim values of each head rotate, as halves or
// as neighbour pairs (GLM's), and cos and sin are multiplied by the
// attention factor once rounded, as the CPU's applyRope with a RopeVariant)
// is the same per-row arithmetic; only which two values pair i rotates
// differs.
//
// With fused launches (CudaBackendOptions::fused_launches) rmsNorm also
// writes its output as the next bf16 decode matmul's x fragments
// (epilogue.h NextFragments); the norm's arithmetic is the same.
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/launch.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kNormThreads = 256;

// kFragments: each output also goes to `next` (epilogue.h), the x
// fragments of the bf16 decode matmul that reads y.
template <bool kFragments>
__global__ void __launch_bounds__(kNormThreads)
    rmsNormKernel(const float* x, const float* weight, int64_t dim, float eps, float* y,
                  NextFragments next) {
  __shared__ float partial[kNormThreads];
  const int64_t row = blockIdx.x;
  const float* in = x + row * dim;
  float sum = 0.0f;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) {
    sum = __fadd_rn(sum, __fmul_rn(in[d], in[d]));
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      partial[threadIdx.x] = __fadd_rn(partial[threadIdx.x], partial[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float mean = __fdiv_rn(partial[0], static_cast<float>(dim));
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  // y may alias x: each element is read before it is written by its own thread.
  float* out = y + row * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) {
    const float value = __fmul_rn(__fmul_rn(in[d], inv), weight[d]);
    out[d] = value;
    if constexpr (kFragments) next.store(row, d, value);
  }
}

constexpr int kRopeThreads = 256;

// One block per row: the row's cos/sin table (half entries) first, then
// every head's pairs. Without kVariant, rotary_dim is head_dim, pairs are
// halves apart and attention_factor is unused.
template <bool kVariant>
__global__ void __launch_bounds__(kRopeThreads)
    ropeKernel(float* x, const int32_t* positions, int64_t num_heads, int64_t head_dim,
               const float* inv_freq, int64_t rotary_dim, float attention_factor,
               bool interleaved) {
  extern __shared__ float table[];  // cos[half], then sin[half]
  const int64_t half = (kVariant ? rotary_dim : head_dim) / 2;
  const int64_t row = blockIdx.x;
  for (int64_t i = threadIdx.x; i < half; i += kRopeThreads) {
    ropeCosSin(positions[row], inv_freq[i], table[i], table[half + i]);
    if constexpr (kVariant) {
      table[i] = __fmul_rn(table[i], attention_factor);
      table[half + i] = __fmul_rn(table[half + i], attention_factor);
    }
  }
  __syncthreads();
  float* base = x + row * num_heads * head_dim;
  for (int64_t p = threadIdx.x; p < num_heads * half; p += kRopeThreads) {
    const int64_t h = p / half;
    const int64_t i = p % half;
    float* head = base + h * head_dim;
    // Pair i: (i, i + half), or with kVariant and interleaved (2i, 2i + 1).
    const bool neighbours = kVariant && interleaved;
    float* a = head + (neighbours ? 2 * i : i);
    float* b = head + (neighbours ? 2 * i + 1 : i + half);
    float first = *a;
    float second = *b;
    ropeRotate(first, second, table[i], table[half + i]);
    *a = first;
    *b = second;
  }
}

}  // namespace

void launchRmsNorm(cudaStream_t stream, const float* x, const float* weight, int64_t rows,
                   int64_t dim, float eps, float* y, const NextFragments& next) {
  if (rows <= 0 || dim <= 0) return;
  const auto blocks = static_cast<unsigned int>(rows);
  if (next.data != nullptr) {
    rmsNormKernel<true><<<blocks, kNormThreads, 0, stream>>>(x, weight, dim, eps, y, next);
  } else {
    rmsNormKernel<false><<<blocks, kNormThreads, 0, stream>>>(x, weight, dim, eps, y, next);
  }
}

void launchApplyRope(cudaStream_t stream, const DeviceBatch& batch, float* x, int64_t num_heads,
                     int64_t head_dim, const float* inv_freq) {
  if (batch.rows <= 0 || num_heads <= 0 || head_dim <= 0) return;
  const size_t shared = static_cast<size_t>(head_dim) * sizeof(float);
  ropeKernel<false><<<static_cast<unsigned int>(batch.rows), kRopeThreads, shared, stream>>>(
      x, batch.positions, num_heads, head_dim, inv_freq, head_dim, 1.0f, false);
}

void launchApplyRopeWith(cudaStream_t stream, const DeviceBatch& batch, float* x, int64_t num_heads,
                         int64_t head_dim, const float* inv_freq, int64_t rotary_dim,
                         float attention_factor, bool interleaved) {
  if (batch.rows <= 0 || num_heads <= 0 || head_dim <= 0) return;
  const size_t shared = static_cast<size_t>(rotary_dim) * sizeof(float);
  ropeKernel<true><<<static_cast<unsigned int>(batch.rows), kRopeThreads, shared, stream>>>(
      x, batch.positions, num_heads, head_dim, inv_freq, rotary_dim, attention_factor, interleaved);
}

}  // namespace tandem::kernels::cuda
