// writeKv and pagedAttention of the CUDA backend, on the block-major KV slab
// of kernels.h (block b at base + b * block_bytes; element (layer, kv, slot,
// kv_head, d) at ((layer * 2 + kv) * block_size + slot) * num_kv_heads *
// head_dim + kv_head * head_dim + d).
//
// writeKv: one thread per element; fp32 is stored as is, bf16 with the same
// round-to-nearest-even integer steps as common/dtype.h, so the cache bytes
// equal the CPU backend's for the same fp32 K/V.
//
// pagedAttention is one kernel pair for prefill, chunked prefill and decode.
// A query row at position p attends to positions 0..p, cut into splits of
// kAttentionSplit positions ([0, 256), [256, 512), ...): the split size is a
// constant, so the splits of a query depend on p alone, never on the batch.
//  1. attentionPartialKernel, one block per (row, head, split): thread t owns
//     position start + t and computes its score with a sequential dot over d;
//     the split's max and sum of e^(s - max) meet in a fixed binary tree over
//     the 256 threads (absent positions contribute -inf / 0); thread d then
//     accumulates p_t * V[t, d] for t in ascending order.
//  2. attentionCombineKernel, one block per (row, head): merges the splits in
//     ascending order with the usual max rescaling; each thread recomputes the
//     same scalar sums in the same order.
// Every operation's operands and order are thus fixed by (q row, p, cached
// K/V of 0..p): a row's output is bit-identical in any batch, and chunked
// prefill equals one-shot prefill because the KV bytes it reads are equal.
#include "common/check.h"
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/launch.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWriteThreads = 256;
constexpr int kSplitThreads = static_cast<int>(kAttentionSplit);

// Cache geometry the kernels need, in elements unless named *_bytes.
struct CacheGeometry {
  const char* base = nullptr;
  int64_t block_bytes = 0;
  int32_t block_size = 0;
  int64_t slot_stride = 0;  // num_kv_heads * head_dim
  int64_t head_dim = 0;
  int64_t k_offset = 0;  // (layer * 2) * block_size * slot_stride
  int64_t v_offset = 0;  // (layer * 2 + 1) * block_size * slot_stride
};

CacheGeometry geometryOf(const KvCacheLayout& cache, int32_t layer) {
  CacheGeometry g;
  g.base = static_cast<const char*>(cache.base);
  g.block_bytes = cache.blockBytes();
  g.block_size = cache.block_size;
  g.slot_stride = int64_t{cache.num_kv_heads} * cache.head_dim;
  g.head_dim = cache.head_dim;
  const int64_t layer_stride = int64_t{cache.block_size} * g.slot_stride;
  g.k_offset = int64_t{layer} * 2 * layer_stride;
  g.v_offset = (int64_t{layer} * 2 + 1) * layer_stride;
  return g;
}

template <typename Storage>
__global__ void __launch_bounds__(kWriteThreads)
    writeKvKernel(const RowKv* row_kv, const int32_t* block_tables, CacheGeometry g, const float* k,
                  const float* v) {
  const int64_t row = blockIdx.x;
  const RowKv info = row_kv[row];
  if (info.active == 0) return;
  const int64_t block = block_tables[info.table_offset + info.position / g.block_size];
  const int64_t slot = info.position % g.block_size;
  auto* dst = reinterpret_cast<Storage*>(const_cast<char*>(g.base) + block * g.block_bytes);
  const int64_t width = g.slot_stride;
  for (int64_t e = threadIdx.x; e < 2 * width; e += kWriteThreads) {
    const bool is_v = e >= width;
    const int64_t c = is_v ? e - width : e;
    const float value = (is_v ? v : k)[row * width + c];
    const int64_t element = (is_v ? g.v_offset : g.k_offset) + slot * width + c;
    if constexpr (sizeof(Storage) == 2) {
      dst[element] = f32ToBf16Bits(value);
    } else {
      dst[element] = value;
    }
  }
}

template <typename Elements>
__device__ __forceinline__ const typename Elements::Storage* cacheRow(const CacheGeometry& g,
                                                                      const int32_t* table,
                                                                      int64_t position,
                                                                      int64_t offset) {
  const int64_t block = table[position / g.block_size];
  const int64_t slot = position % g.block_size;
  return reinterpret_cast<const typename Elements::Storage*>(g.base + block * g.block_bytes) +
         offset + slot * g.slot_stride;
}

// Partials: for item i = (row * num_heads + head) * max_splits + split,
// max_and_sum[2i], max_and_sum[2i + 1] and acc[i * head_dim + d].
template <typename Elements>
__global__ void __launch_bounds__(kSplitThreads)
    attentionPartialKernel(const RowKv* row_kv, const int32_t* block_tables, CacheGeometry g,
                           const float* q, int64_t num_heads, int64_t group, float scale,
                           int64_t max_splits, float* max_and_sum, float* acc) {
  __shared__ float q_head[kMaxHeadDim];
  __shared__ float weights[kSplitThreads];
  __shared__ float tree[kSplitThreads];
  const int64_t row = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int64_t split = blockIdx.z;
  const RowKv info = row_kv[row];
  const int64_t count = info.position + 1;
  const int64_t start = split * kAttentionSplit;
  // Uniform per block, so no thread is left waiting at a barrier.
  if (info.active == 0 || start >= count) return;
  const int64_t end = min(count, start + kAttentionSplit);
  const int64_t head_dim = g.head_dim;
  const int64_t kv_head = head / group;
  const int32_t* table = block_tables + info.table_offset;
  const int tid = threadIdx.x;

  const float* q_row = q + (row * num_heads + head) * head_dim;
  for (int64_t d = tid; d < head_dim; d += kSplitThreads) q_head[d] = q_row[d];
  __syncthreads();

  const int64_t t = start + tid;
  float score = -INFINITY;
  if (t < end) {
    const auto* key = cacheRow<Elements>(g, table, t, g.k_offset + kv_head * head_dim);
    float dot = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) dot = fmaf(q_head[d], Elements::load(key, d), dot);
    score = __fmul_rn(dot, scale);
  }
  tree[tid] = score;
  __syncthreads();
  for (int stride = kSplitThreads / 2; stride > 0; stride /= 2) {
    if (tid < stride) tree[tid] = fmaxf(tree[tid], tree[tid + stride]);
    __syncthreads();
  }
  const float max = tree[0];
  __syncthreads();
  const float weight = t < end ? expf(score - max) : 0.0f;
  weights[tid] = weight;
  tree[tid] = weight;
  __syncthreads();
  for (int stride = kSplitThreads / 2; stride > 0; stride /= 2) {
    if (tid < stride) tree[tid] = __fadd_rn(tree[tid], tree[tid + stride]);
    __syncthreads();
  }

  const int64_t item = (row * num_heads + head) * max_splits + split;
  if (tid == 0) {
    max_and_sum[2 * item] = max;
    max_and_sum[2 * item + 1] = tree[0];
  }
  for (int64_t d = tid; d < head_dim; d += kSplitThreads) {
    float sum = 0.0f;
    for (int64_t p = start; p < end; ++p) {
      const auto* value = cacheRow<Elements>(g, table, p, g.v_offset + kv_head * head_dim);
      sum = fmaf(weights[p - start], Elements::load(value, d), sum);
    }
    acc[item * head_dim + d] = sum;
  }
}

__global__ void attentionCombineKernel(const RowKv* row_kv, int64_t num_heads, int64_t head_dim,
                                       int64_t max_splits, const float* max_and_sum,
                                       const float* acc, float* out) {
  const int64_t row = blockIdx.x;
  const int64_t head = blockIdx.y;
  const RowKv info = row_kv[row];
  if (info.active == 0) return;
  const int64_t splits = ceilDivDevice(info.position + 1, kAttentionSplit);
  const int64_t first = (row * num_heads + head) * max_splits;
  float max = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) max = fmaxf(max, max_and_sum[2 * (first + s)]);
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float total = 0.0f;
    float sum = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float rescale = expf(max_and_sum[2 * (first + s)] - max);
      total = fmaf(max_and_sum[2 * (first + s) + 1], rescale, total);
      sum = fmaf(acc[(first + s) * head_dim + d], rescale, sum);
    }
    out[(row * num_heads + head) * head_dim + d] = __fdiv_rn(sum, total);
  }
}

}  // namespace

void launchWriteKv(cudaStream_t stream, const DeviceBatch& batch, const KvCacheLayout& cache,
                   int32_t layer, const float* k, const float* v) {
  if (batch.rows <= 0) return;
  const CacheGeometry g = geometryOf(cache, layer);
  const auto grid = static_cast<unsigned int>(batch.rows);
  if (cache.dtype == DType::kBF16) {
    writeKvKernel<uint16_t>
        <<<grid, kWriteThreads, 0, stream>>>(batch.row_kv, batch.block_tables, g, k, v);
  } else {
    writeKvKernel<float>
        <<<grid, kWriteThreads, 0, stream>>>(batch.row_kv, batch.block_tables, g, k, v);
  }
}

int64_t attentionScratchFloats(const DeviceBatch& batch, int64_t num_heads, int64_t head_dim) {
  return batch.rows * num_heads * batch.attention_splits * (head_dim + 2);
}

void launchPagedAttention(cudaStream_t stream, const DeviceBatch& batch, const KvCacheLayout& cache,
                          int32_t layer, const float* q, int64_t num_heads, float scale,
                          float* scratch, float* out) {
  if (batch.rows <= 0 || num_heads <= 0) return;
  TANDEM_CHECK(cache.head_dim >= 1 && cache.head_dim <= kMaxHeadDim, "head_dim must be in 1..256");
  TANDEM_CHECK(cache.num_kv_heads >= 1 && num_heads % cache.num_kv_heads == 0,
               "num_heads must be a multiple of num_kv_heads");
  const int64_t splits = batch.attention_splits;
  TANDEM_CHECK(splits > batch.max_position / kAttentionSplit,
               "attention launched over too few splits");
  TANDEM_CHECK(num_heads <= 65535 && splits <= 65535, "attention launch too large");
  const CacheGeometry g = geometryOf(cache, layer);
  const int64_t group = num_heads / cache.num_kv_heads;
  float* max_and_sum = scratch;
  float* acc = scratch + 2 * batch.rows * num_heads * splits;
  const dim3 partial_grid(static_cast<unsigned int>(batch.rows),
                          static_cast<unsigned int>(num_heads), static_cast<unsigned int>(splits));
  if (cache.dtype == DType::kBF16) {
    attentionPartialKernel<Bf16Elements><<<partial_grid, kSplitThreads, 0, stream>>>(
        batch.row_kv, batch.block_tables, g, q, num_heads, group, scale, splits, max_and_sum, acc);
  } else {
    attentionPartialKernel<F32Elements><<<partial_grid, kSplitThreads, 0, stream>>>(
        batch.row_kv, batch.block_tables, g, q, num_heads, group, scale, splits, max_and_sum, acc);
  }
  const dim3 combine_grid(static_cast<unsigned int>(batch.rows),
                          static_cast<unsigned int>(num_heads));
  const int combine_threads =
      static_cast<int>(std::min<int64_t>(kMaxHeadDim, ceilDiv(cache.head_dim, 32) * 32));
  attentionCombineKernel<<<combine_grid, combine_threads, 0, stream>>>(
      batch.row_kv, num_heads, cache.head_dim, splits, max_and_sum, acc, out);
}

}  // namespace tandem::kernels::cuda
