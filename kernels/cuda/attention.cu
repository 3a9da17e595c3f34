// writeKv and pagedAttention of the CUDA backend, on the block-major KV slab
// of kernels.h (its addressing: kv_store.h).
//
// writeKv: one thread per element, stored as kv_store.h stores (fp32 as is,
// bf16 with the same round-to-nearest-even integer steps as common/dtype.h),
// so the cache bytes equal the CPU backend's for the same fp32 K/V.
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
//
// The fast kernels (--cuda-kernels fast) replace step 1 with
// attentionGroupedKernel, one block per (row, kv head, split), which gives
// the same bits as attentionPartialKernel: the same operations on the same
// operands in the same order, with the K and V rows staged through shared
// memory. What changes is how they are read: the reference reads each
// position's K row element by element from its own thread (a warp's loads
// land 32 rows apart) and each V element once per query head of the group;
// the grouped kernel copies the split's K rows, then its V rows, in 16-byte
// coalesced loads, tile by tile (32 positions of bf16, 16 of f32), once for
// all the query heads that share the KV head (GQA). Per head of the group it
// then runs the reference's steps from shared memory: thread-per-position
// dot products in ascending d from +0, the same max and sum trees over 256
// slots, and per (head, d) the chain over positions in ascending order, kept
// in a register across tiles. Rows are padded to an odd number of 32-bit
// words, so the 32 positions a warp reads at one d fall in 32 banks.
// Supported where the group is at most kMaxGroup heads and a head's row is a
// whole number of 16-byte vectors; elsewhere the reference kernel runs.
//
// With fused launches (CudaBackendOptions::fused_launches) the combine
// kernel also writes each output as the o projection's bf16 x fragments
// (epilogue.h NextFragments); its arithmetic is the same.
#include "common/check.h"
#include "kernels/cuda/device_dtype.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ptx.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWriteThreads = 256;
constexpr int kSplitThreads = static_cast<int>(kAttentionSplit);

template <typename Storage>
__global__ void __launch_bounds__(kWriteThreads)
    writeKvKernel(const RowKv* row_kv, const int32_t* block_tables, CacheGeometry g, const float* k,
                  const float* v) {
  const int64_t row = blockIdx.x;
  const RowKv info = row_kv[row];
  if (info.active == 0) return;
  const int64_t width = g.slot_stride;
  for (int64_t e = threadIdx.x; e < 2 * width; e += kWriteThreads) {
    const bool is_v = e >= width;
    const int64_t c = is_v ? e - width : e;
    const float value = (is_v ? v : k)[row * width + c];
    storeKvValue(kvElement<Storage>(g, block_tables, info, is_v ? g.v_offset : g.k_offset, c),
                 value);
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

// One split's softmax statistics, as every partial kernel computes them:
// thread t holds the score of slot t (-inf where its position is absent);
// the max of the 256 slots meets in a fixed binary tree over `tree`, each
// present slot's weight is e^(score - max) (0 where absent), stored at
// weights[t], and the sum of the weights meets in the same tree. Every
// thread of the block calls it; on return, weights[] is complete and `tree`
// free for reuse.
struct SplitStats {
  float max;
  float sum;
};
// `value` of every thread of the block combined by `op` in the fixed binary
// tree over `tree` (pairs kSplitThreads / 2 apart, then half that, ...);
// `tree` is free again on return.
template <typename Op>
__device__ __forceinline__ float treeReduce(float* tree, float value, Op op) {
  const int tid = threadIdx.x;
  tree[tid] = value;
  __syncthreads();
  for (int stride = kSplitThreads / 2; stride > 0; stride /= 2) {
    if (tid < stride) tree[tid] = op(tree[tid], tree[tid + stride]);
    __syncthreads();
  }
  const float result = tree[0];
  __syncthreads();
  return result;
}

__device__ __forceinline__ SplitStats splitStats(float* tree, float* weights, float score,
                                                 bool present) {
  const float max = treeReduce(tree, score, [](float a, float b) { return fmaxf(a, b); });
  const float weight = present ? expf(score - max) : 0.0f;
  weights[threadIdx.x] = weight;
  const float sum = treeReduce(tree, weight, [](float a, float b) { return __fadd_rn(a, b); });
  return {max, sum};
}

// Positions of split `split` a row attends to: those of [split * 256,
// split * 256 + 256) up to its own position; 0 for an inactive row or a
// split past it.
__device__ __forceinline__ int64_t splitPositions(const RowKv& info, int64_t split) {
  const int64_t count = info.position + 1;
  const int64_t start = split * kAttentionSplit;
  if (info.active == 0 || start >= count) return 0;
  return min(count, start + kAttentionSplit) - start;
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
  const int64_t start = split * kAttentionSplit;
  const int64_t n = splitPositions(info, split);
  // Uniform per block, so no thread is left waiting at a barrier.
  if (n == 0) return;
  const int64_t end = start + n;
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
  const SplitStats stats = splitStats(tree, weights, score, t < end);

  const int64_t item = (row * num_heads + head) * max_splits + split;
  if (tid == 0) {
    max_and_sum[2 * item] = stats.max;
    max_and_sum[2 * item + 1] = stats.sum;
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

// kFragments: each output also goes to `next` (epilogue.h), the x
// fragments of the bf16 decode matmul that reads out (the o projection).
template <bool kFragments>
__global__ void attentionCombineKernel(const RowKv* row_kv, int64_t num_heads, int64_t head_dim,
                                       int64_t max_splits, const float* max_and_sum,
                                       const float* acc, float* out, NextFragments next) {
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
    const float value = __fdiv_rn(sum, total);
    out[(row * num_heads + head) * head_dim + d] = value;
    if constexpr (kFragments) next.store(row, head * head_dim + d, value);
  }
}

// ---- the grouped kernel (fast kernels) ----

constexpr int kMaxGroup = 8;
// Positions staged per tile, and the largest tile in 32-bit words: rows of
// up to kMaxHeadDim elements padded to an odd word count.
template <typename Storage>
constexpr int kTilePositions = sizeof(Storage) == 2 ? 32 : 16;
constexpr int kTileWords = 32 * (kMaxHeadDim / 2 + 1);
static_assert(16 * (kMaxHeadDim + 1) <= kTileWords, "an f32 tile fits the buffer");

// A tile row's stride in 32-bit words: the row's words, made odd.
__host__ __device__ constexpr int64_t tileStrideWords(int64_t head_dim, int64_t element_bytes) {
  const int64_t words = head_dim * element_bytes / 4;
  return words % 2 == 0 ? words + 1 : words;
}

// Rows pos0 .. pos0 + count - 1 of one KV head (at `offset`) into `tile`,
// 16-byte vectors read in order by consecutive threads.
template <typename Elements>
__device__ __forceinline__ void stageRows(const CacheGeometry& g, const int32_t* table,
                                          int64_t pos0, int count, int64_t offset,
                                          int64_t stride_words, uint32_t* tile) {
  const int64_t vectors =
      g.head_dim * static_cast<int64_t>(sizeof(typename Elements::Storage)) / 16;
  for (int64_t i = threadIdx.x; i < count * vectors; i += blockDim.x) {
    const int64_t p = i / vectors;
    const int64_t v = i % vectors;
    const uint4 value =
        reinterpret_cast<const uint4*>(cacheRow<Elements>(g, table, pos0 + p, offset))[v];
    uint32_t* dst = tile + p * stride_words + v * 4;
    dst[0] = value.x;
    dst[1] = value.y;
    dst[2] = value.z;
    dst[3] = value.w;
  }
}

template <typename Elements>
__global__ void __launch_bounds__(kSplitThreads)
    attentionGroupedKernel(const RowKv* row_kv, const int32_t* block_tables, CacheGeometry g,
                           const float* q, int64_t num_heads, int64_t group, float scale,
                           int64_t max_splits, float* max_and_sum, float* acc) {
  using Storage = typename Elements::Storage;
  constexpr int kPositions = kTilePositions<Storage>;
  constexpr int kItemsPerThread = kMaxGroup * kMaxHeadDim / kSplitThreads;
  __shared__ float q_heads[kMaxGroup][kMaxHeadDim];
  __shared__ float weights[kMaxGroup][kSplitThreads];  // scores, then e^(s - max)
  __shared__ float tree[kSplitThreads];
  __shared__ __align__(16) uint32_t tile_words[kTileWords];
  const auto* tile = reinterpret_cast<const Storage*>(tile_words);

  const int64_t row = blockIdx.x;
  const int64_t kv_head = blockIdx.y;
  const int64_t split = blockIdx.z;
  const RowKv info = row_kv[row];
  const int64_t start = split * kAttentionSplit;
  const int64_t n = splitPositions(info, split);
  // Uniform per block, so no thread is left waiting at a barrier.
  if (n == 0) return;
  const int64_t head_dim = g.head_dim;
  const int64_t first_head = kv_head * group;
  const int64_t stride_words = tileStrideWords(head_dim, sizeof(Storage));
  const int64_t stride = stride_words * 4 / static_cast<int64_t>(sizeof(Storage));
  const int32_t* table = block_tables + info.table_offset;
  const int tid = threadIdx.x;

  for (int64_t i = tid; i < group * head_dim; i += kSplitThreads) {
    q_heads[i / head_dim][i % head_dim] = q[(row * num_heads + first_head) * head_dim + i];
  }

  // Scores, tile by tile of K: item (h, p) is the reference's thread p of head h.
  for (int64_t t0 = 0; t0 < n; t0 += kPositions) {
    const int tn = static_cast<int>(min(static_cast<int64_t>(kPositions), n - t0));
    __syncthreads();  // the previous tile's readers are done
    stageRows<Elements>(g, table, start + t0, tn, g.k_offset + kv_head * head_dim, stride_words,
                        tile_words);
    __syncthreads();
    for (int64_t item = tid; item < group * kPositions; item += kSplitThreads) {
      const int64_t h = item / kPositions;
      const int p = static_cast<int>(item % kPositions);
      if (p >= tn) continue;
      const Storage* key = tile + p * stride;
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot = fmaf(q_heads[h][d], Elements::load(key, d), dot);
      weights[h][t0 + p] = __fmul_rn(dot, scale);
    }
  }
  __syncthreads();

  // Per head, the reference's statistics (each thread reads its own score
  // before splitStats overwrites the slot with its weight).
  for (int64_t h = 0; h < group; ++h) {
    const float score = tid < n ? weights[h][tid] : -INFINITY;
    const SplitStats stats = splitStats(tree, weights[h], score, tid < n);
    if (tid == 0) {
      const int64_t item = (row * num_heads + first_head + h) * max_splits + split;
      max_and_sum[2 * item] = stats.max;
      max_and_sum[2 * item + 1] = stats.sum;
    }
  }

  // Per (head, d), the chain over positions in ascending order, tile by
  // tile of V.
  float sums[kItemsPerThread];
#pragma unroll
  for (int i = 0; i < kItemsPerThread; ++i) sums[i] = 0.0f;
  for (int64_t t0 = 0; t0 < n; t0 += kPositions) {
    const int tn = static_cast<int>(min(static_cast<int64_t>(kPositions), n - t0));
    __syncthreads();  // the previous tile's readers are done
    stageRows<Elements>(g, table, start + t0, tn, g.v_offset + kv_head * head_dim, stride_words,
                        tile_words);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kItemsPerThread; ++i) {
      const int64_t item = tid + i * kSplitThreads;
      if (item < group * head_dim) {
        const int64_t h = item / head_dim;
        const int64_t d = item % head_dim;
        float sum = sums[i];
        for (int p = 0; p < tn; ++p) {
          sum = fmaf(weights[h][t0 + p], Elements::load(tile + p * stride, d), sum);
        }
        sums[i] = sum;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kItemsPerThread; ++i) {
    const int64_t item = tid + i * kSplitThreads;
    if (item < group * head_dim) {
      const int64_t h = item / head_dim;
      const int64_t d = item % head_dim;
      acc[((row * num_heads + first_head + h) * max_splits + split) * head_dim + d] = sums[i];
    }
  }
}

// ---- the flash kernel (tensor cores; --cuda-kernels flash) ----
//
// attentionFlashKernel, for bf16 caches with head_dim 16, 32, 64 or 128 and
// GQA groups of at most kMaxGroup heads, replaces step 1 with tensor-core
// math: its own order, not the reference's bits, and the same invariance.
// A block serves a tile of up to 16 query rows of one sequence at
// consecutive positions (a tile starts at a position that is a multiple of
// 16, or where the batch's previous row is not the same sequence's previous
// position), one KV head and one 256-position split; warp h is the group's
// head h, its mma rows the tile's rows. The split's positions go through
// shared memory 64 at a time (16-byte cp.async copies, zero past the last
// position any row of the block attends to, so a stale NaN is never
// multiplied; the next tile's K lands while this tile's softmax and outputs
// run, its V while the next scores run); mma B fragments come by ldmatrix,
// K's as stored and V's transposed (.trans). Per tile, for each row:
//  - scores: one m16n8k16 bf16 mma chain per (row, position) over head_dim
//    in ascending 16-wide slices from +0 (q rounded to bf16, nearest even),
//    times `scale`; a position past the row's own, or past the split, is
//    -inf;
//  - m' = max(m, the tile's max); weights e^(score - m'), rounded to bf16,
//    0 where -inf; the row's sum of weights: the lane's 16 in column order,
//    then the quad's in a fixed butterfly (lanes ^1, then ^2);
//    l = l·e^(m - m') + sum, and the outputs scaled by e^(m - m');
//  - outputs += weights · V: one m16n8k16 mma per 16 positions, in
//    ascending order, all four every tile.
// Every operation a row goes through is fixed by its q, its position and
// the K/V bytes of the positions it attends to: an mma's result for (row,
// column) depends on that row, that column and that accumulator only, the
// tile grid is absolute (positions [split·256 + 64t, +64)), and the masks
// depend on the row's own position. What varies with the batch is only how
// many tiles past its own position a row's block goes through, and such a
// tile changes nothing: its weights are +0 (e^(m - m) = 1 exactly, the sum
// adds +0s, the mmas add products of +0 weights). So chunked prefill, decode
// and one-shot prefill give a row the same bits, in any batch. The
// statistics written are the reference's (the split's max, the sum of
// weights relative to it, the unnormalized outputs), so the combine kernel
// is shared.
constexpr int kFlashRows = 16;
constexpr int kFlashPositions = 64;
constexpr int kFlashPad = 8;  // bf16 per shared-memory row beyond head_dim

// Whether batch row `row` begins a tile: an active row at a multiple of 16,
// or one the previous row does not precede in the same sequence. On the
// device, and on the host for flashTiles.
__host__ __device__ __forceinline__ bool flashTileStart(const RowKv* row_kv, int64_t row) {
  const RowKv info = row_kv[row];
  if (info.active == 0) return false;
  if (row == 0 || info.position % kFlashRows == 0) return true;
  const RowKv previous = row_kv[row - 1];
  return previous.active == 0 || previous.table_offset != info.table_offset ||
         previous.position + 1 != info.position;
}

// The rows of the tile that starts at batch row `first` (of `rows`): it and
// the active rows after it that start none, kFlashRows at most.
__host__ __device__ __forceinline__ int64_t flashTileRows(const RowKv* row_kv, int64_t rows,
                                                          int64_t first) {
  int64_t count = 1;
  while (count < kFlashRows && first + count < rows && row_kv[first + count].active != 0 &&
         !flashTileStart(row_kv, first + count)) {
    ++count;
  }
  return count;
}

// Position tiles in flight (kStages): 1, the next tile's K and V copied
// while this one's are used, in static shared memory; or, for the deep
// attention loads of a decode step (launchFlashStages), in dynamic shared
// memory, all of a split's four at once where the grid has at most a block
// per SM, else three (kFlashDeepStages: 102 KB a block at head_dim 128, so
// that two blocks still fit an SM, as many as the registers allow). The
// same operations on the same values, only the copies issued sooner. Slot
// s of the ring holds a tile's K in rows [2s·64, +64) and its V in the next 64.
constexpr int kFlashSplitTiles = static_cast<int>(kAttentionSplit / kFlashPositions);
constexpr int kFlashDeepStages = 3;
// cacheRow's bf16 address with 32-bit position arithmetic (positions stay
// below 2^24: launchPagedAttention checks splits > max_position / 256 and
// splits <= 65,535; block sizes at most 1,024): a shift and a mask where the block
// size is a power of two, else one 32-bit division, where cacheRow divides
// in 64 bits, once per 16-byte copy.
__device__ __forceinline__ const uint16_t* flashCacheRow(const CacheGeometry& g,
                                                         const int32_t* table, int64_t position,
                                                         int64_t offset) {
  const auto narrow = static_cast<uint32_t>(position);
  const auto size = static_cast<uint32_t>(g.block_size);
  const uint32_t index = g.block_shift >= 0 ? narrow >> g.block_shift : narrow / size;
  const uint32_t slot = narrow - index * size;
  const int64_t block = table[index];
  return reinterpret_cast<const uint16_t*>(g.base + block * g.block_bytes) + offset +
         int64_t{slot} * g.slot_stride;
}

template <int kHeadDim, int kStages>
constexpr size_t flashSharedBytes() {
  return kStages == 1 ? 0
                      : static_cast<size_t>(kStages) * 2 * kFlashPositions *
                            (kHeadDim + kFlashPad) * sizeof(uint16_t);
}

// kRuns: a block goes through a run of `splits_per_block` splits (a grid of
// tiles, launchPagedAttention's compact attention grid), each from scratch,
// so that its q fragments are loaded once and its copies run on from split
// to split; else through split blockIdx.z alone.
template <int kHeadDim, int kStages, bool kRuns>
__global__ void __launch_bounds__(kMaxGroup * 32)
    attentionFlashKernel(const RowKv* row_kv, int64_t rows, const FlashTile* tiles,
                         const int32_t* block_tables, CacheGeometry g, const float* q,
                         int64_t num_heads, int64_t group, float scale, int64_t max_splits,
                         int64_t splits_per_block, float* max_and_sum, float* acc) {
  static_assert(kStages >= 1 && kStages <= kFlashSplitTiles, "at most a whole split ahead");
  static_assert(kStages == 1 || !kRuns, "a decode step's whole-split loads take a split a block");
  constexpr int kStride = kHeadDim + kFlashPad;
  constexpr int kSlices = kHeadDim / 16;                          // k slices of the score mma
  constexpr int kDimTiles = kHeadDim / 8;                         // n tiles of the output mma
  constexpr int kPositionTiles = kFlashPositions / 8;             // n tiles of the score mma
  constexpr int kVectors = kHeadDim / 8;                          // 16-byte vectors per row
  constexpr int64_t kAhead = int64_t{kStages} * kFlashPositions;  // positions in flight
  constexpr int kFixedRows = kStages == 1 ? kFlashPositions : 1;
  __shared__ __align__(16) uint16_t fixed_k[kFixedRows][kStride];
  __shared__ __align__(16) uint16_t fixed_v[kFixedRows][kStride];
  extern __shared__ __align__(16) uint16_t staged_tiles[];
  uint16_t(*const ring)[kStride] = reinterpret_cast<uint16_t(*)[kStride]>(staged_tiles);

  // The block's tile: given (a block per tile; with runs of splits the last
  // tiles first, as a sequence's later tiles attend to more positions), or
  // found from its row (a block per row; uniform per block: every thread
  // reads the same rows).
  int64_t first = blockIdx.x;
  int64_t count = 1;
  if (tiles != nullptr) {
    const FlashTile given = tiles[kRuns ? gridDim.x - 1 - blockIdx.x : blockIdx.x];
    first = given.first_row;
    count = given.rows;
  } else {
    if (!flashTileStart(row_kv, first)) return;
    count = flashTileRows(row_kv, rows, first);
  }
  const RowKv info = row_kv[first];
  const int64_t position0 = info.position;
  // The block's splits: per_block from split blockIdx.z · per_block, up to
  // the one holding its last attended position. A 64-position tile never
  // straddles two splits, so `t0 + p < end` below is the split's own bound.
  const int64_t per_block = kRuns ? splits_per_block : 1;
  const int64_t start = static_cast<int64_t>(blockIdx.z) * per_block * kAttentionSplit;
  const int64_t last = position0 + count - 1;  // the block's last attended position
  if (start > last) return;
  const int64_t end = min(start + per_block * kAttentionSplit, last + 1);
  const int64_t kv_head = blockIdx.y;
  const int32_t* table = block_tables + info.table_offset;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int quad_row = lane / 4;  // fragment row (A, C) or column (B)
  const int quad = lane % 4;      // fragment k pair (A, B) or column pair (C)
  const int matrix = lane / 8;    // the ldmatrix matrix this lane addresses a row of
  const int matrix_row = lane % 8;
  const int64_t head = kv_head * group + warp;

  // The warp's q rows as A fragments (rows past the tile are zeros), and
  // each of the lane's two rows' own position (-1: no row).
  uint32_t qa[kSlices][4];
  int64_t own[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = quad_row + 8 * half;
    own[half] = r < count ? position0 + r : -1;
  }
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = quad_row + 8 * (e % 2);
      const int d = slice * 16 + quad * 2 + 8 * (e / 2);
      float low = 0.0f, high = 0.0f;
      if (r < count) {
        const float* q_row = q + ((first + r) * num_heads + head) * kHeadDim;
        low = q_row[d];
        high = q_row[d + 1];
      }
      qa[slice][e] = packBf16(low, high);
    }
  }

  // A split's statistics, from scratch at each split's first tile.
  float m[2];
  float l[2];
  float o[kDimTiles][4];
  auto beginSplit = [&] {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      m[half] = -INFINITY;
      l[half] = 0.0f;
    }
#pragma unroll
    for (int t = 0; t < kDimTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[t][e] = 0.0f;
    }
  };
  // Split `split`'s statistics and outputs of each row that attends into it.
  auto writeSplit = [&](int64_t split) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (own[half] < split * kAttentionSplit) continue;
      const int64_t row = first + quad_row + 8 * half;
      const int64_t item = (row * num_heads + head) * max_splits + split;
      if (quad == 0) {
        max_and_sum[2 * item] = m[half];
        max_and_sum[2 * item + 1] = l[half];
      }
#pragma unroll
      for (int t = 0; t < kDimTiles; ++t) {
        const int d = t * 8 + quad * 2;
        acc[item * kHeadDim + d] = o[t][half * 2];
        acc[item * kHeadDim + d + 1] = o[t][half * 2 + 1];
      }
    }
  };
  beginSplit();

  // One tile's K (or V) rows into `tile` by 16-byte cp.async, zeros past
  // `end`; committed as one group whether or not it copied anything, so
  // every thread's groups are K, V, K, V, ... in tile order.
  // The candidates' instances (runs of splits, deep loads) find a cache row
  // by flashCacheRow; the serving one as every attention kernel does.
  auto copyTile = [&](uint16_t(*tile)[kStride], int64_t t0, int64_t offset, bool copy) {
    if (copy) {
      for (int i = static_cast<int>(threadIdx.x); i < kFlashPositions * kVectors;
           i += static_cast<int>(blockDim.x)) {
        const int p = i / kVectors;
        const int v = i % kVectors;
        const bool valid = t0 + p < end;
        const int64_t position = valid ? t0 + p : start;
        const uint16_t* row = kRuns || kStages > 1
                                  ? flashCacheRow(g, table, position, offset)
                                  : cacheRow<Bf16Elements>(g, table, position, offset);
        copyAsync16(&tile[p][v * 8], row + v * 8, valid);
      }
    }
    commitCopies();
  };
  const int64_t k_offset = g.k_offset + kv_head * kHeadDim;
  const int64_t v_offset = g.v_offset + kv_head * kHeadDim;
  // The split's tile t in ring slot t % kStages; the groups are K, V of
  // tiles 0 .. kStages - 1, then one K and one V per tile used (K of tile
  // t + kStages after tile t's scores, its V after tile t's outputs), empty
  // where there is no such tile: tile t's K is group 2t and its V 2t + 1, so
  // before either, 2·kStages - 1 groups may still be in flight.
  auto kTile = [&](int t) {
    return kStages == 1 ? fixed_k : ring + (t % kStages) * 2 * kFlashPositions;
  };
  auto vTile = [&](int t) {
    return kStages == 1 ? fixed_v : ring + (t % kStages) * 2 * kFlashPositions + kFlashPositions;
  };
#pragma unroll
  for (int slot = 0; slot < kStages; ++slot) {
    const int64_t t0 = start + int64_t{slot} * kFlashPositions;
    copyTile(kTile(slot), t0, k_offset, slot == 0 || t0 < end);  // tile 0: start <= last
    copyTile(vTile(slot), t0, v_offset, slot == 0 || t0 < end);
  }

  // Tiles ahead land while this one's scores, softmax and outputs run.
  int tile = 0;
  for (int64_t t0 = start; t0 < end; t0 += kFlashPositions, ++tile) {
    const bool more = t0 + kAhead < end;
    uint16_t(*const k_tile)[kStride] = kTile(tile);
    uint16_t(*const v_tile)[kStride] = vTile(tile);
    waitCopies<2 * kStages - 1>();  // this tile's K (its V may still be in flight)
    __syncthreads();

    // Scores: position tile j holds positions t0 + 8j .. t0 + 8j + 7.
    float s[kPositionTiles][4];
#pragma unroll
    for (int j = 0; j < kPositionTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
    }
#pragma unroll
    for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
      for (int j = 0; j < kPositionTiles; j += 2) {
        // Matrix i: positions of tile j + i / 2, dims slice·16 + 8 (i % 2).
        uint32_t b[4];
        loadMatrices(b, &k_tile[(j + matrix / 2) * 8 + matrix_row][slice * 16 + (matrix % 2) * 8]);
        mmaBf16(s[j], qa[slice], b);
        mmaBf16(s[j + 1], qa[slice], b + 2);
      }
    }

    __syncthreads();  // every warp has read k_tile
    copyTile(k_tile, t0 + kAhead, k_offset, more);

    // Per row: mask, max, weights (rounded to bf16), their sum, rescaling.
    uint32_t pa[kFlashPositions / 16][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
      // With runs of splits (a prefill's blocks), a row whose own position
      // and the split's end lie past the whole tile (every tile of a row's
      // block but its last) masks nothing, so its scores skip the tests:
      // the same values in the same order.
      if (kRuns && t0 + kFlashPositions - 1 <= own[half] && t0 + kFlashPositions <= end) {
#pragma unroll
        for (int j = 0; j < kPositionTiles; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& score = s[j][half * 2 + c];
            score = __fmul_rn(score, scale);
            tile_max = fmaxf(tile_max, score);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kPositionTiles; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int64_t position = t0 + j * 8 + quad * 2 + c;
            float& score = s[j][half * 2 + c];
            score = position <= own[half] && position < end ? __fmul_rn(score, scale) : -INFINITY;
            tile_max = fmaxf(tile_max, score);
          }
        }
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float next = fmaxf(m[half], tile_max);
      const bool none = next == -INFINITY;  // nothing attended yet
      const float rescale = none ? 1.0f : expf(m[half] - next);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kPositionTiles; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& weight = s[j][half * 2 + c];
          weight = none || weight == -INFINITY ? 0.0f
                                               : bf16BitsToF32(f32ToBf16Bits(expf(weight - next)));
          sum = __fadd_rn(sum, weight);
        }
      }
      sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
      sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
      l[half] = __fadd_rn(__fmul_rn(l[half], rescale), sum);
      m[half] = next;
#pragma unroll
      for (int t = 0; t < kDimTiles; ++t) {
        o[t][half * 2] = __fmul_rn(o[t][half * 2], rescale);
        o[t][half * 2 + 1] = __fmul_rn(o[t][half * 2 + 1], rescale);
      }
    }
    // The weights as A fragments: the score C fragments of position tiles
    // 2kk and 2kk + 1 are the A fragment of positions 16kk .. 16kk + 15.
#pragma unroll
    for (int kk = 0; kk < kFlashPositions / 16; ++kk) {
      pa[kk][0] = packBf16(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = packBf16(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = packBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = packBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    waitCopies<2 * kStages - 1>();  // this tile's V (later tiles may still be in flight)
    __syncthreads();
    // Outputs: B fragments (k = position, n = d) are V's rows transposed.
#pragma unroll
    for (int kk = 0; kk < kFlashPositions / 16; ++kk) {
#pragma unroll
      for (int t = 0; t < kDimTiles; t += 2) {
        // Matrix i: positions kk·16 + 8 (i % 2), dims of tile t + i / 2.
        uint32_t b[4];
        loadMatricesTransposed(
            b, &v_tile[kk * 16 + (matrix % 2) * 8 + matrix_row][(t + matrix / 2) * 8]);
        mmaBf16(o[t], pa[kk], b);
        mmaBf16(o[t + 1], pa[kk], b + 2);
      }
    }
    __syncthreads();  // every warp has read v_tile
    copyTile(v_tile, t0 + kAhead, v_offset, more);
    if constexpr (kRuns) {
      // A split ends with its fourth tile or the block's last: the next
      // tile (already in flight) starts the next split from scratch.
      const int64_t next_t0 = t0 + kFlashPositions;
      if (next_t0 >= end || next_t0 % kAttentionSplit == 0) {
        writeSplit(t0 / kAttentionSplit);
        beginSplit();
      }
    }
  }
  waitCopies<0>();  // the last, empty groups
  if constexpr (!kRuns) writeSplit(blockIdx.z);
}

// The flash kernel at head_dim kHeadDim with kStages tiles in flight, with
// more dynamic shared memory than the 48 KB default where it needs it
// (optInSharedMemory).
template <int kHeadDim, int kStages, bool kRuns>
void launchFlash(cudaStream_t stream, dim3 grid, unsigned int threads, const DeviceBatch& batch,
                 const FlashTile* tiles, const CacheGeometry& g, const float* q, int64_t num_heads,
                 int64_t group, float scale, int64_t splits, int64_t per_block, float* max_and_sum,
                 float* acc) {
  constexpr size_t kShared = flashSharedBytes<kHeadDim, kStages>();
  if constexpr (kShared > 0) {
    // The backend refuses deep_attention on a device that offers less.
    optInSharedMemory<attentionFlashKernel<kHeadDim, kStages, kRuns>>(
        kShared, "flash attention: cudaFuncSetAttribute refused the deep loads' shared memory");
  }
  attentionFlashKernel<kHeadDim, kStages, kRuns><<<grid, threads, kShared, stream>>>(
      batch.row_kv, batch.rows, tiles, batch.block_tables, g, q, num_heads, group, scale, splits,
      per_block, max_and_sum, acc);
}

// The flash kernel's instance for a launch: a decode step's deep attention
// loads with a whole split in flight where the grid has at most a block per
// SM (a decode of a few sequences), else three tiles (two blocks per SM);
// a block per tile going through runs of splits (compact grid); or the
// serving kernel, a block per row and split with one tile ahead. The choice
// depends on the grid alone, so a recorded step keeps it.
template <int kHeadDim>
void launchFlashStages(cudaStream_t stream, dim3 grid, unsigned int threads,
                       const DeviceBatch& batch, const FlashTile* tiles, const CacheGeometry& g,
                       const float* q, int64_t num_heads, int64_t group, float scale,
                       int64_t splits, int64_t per_block, float* max_and_sum, float* acc) {
  if (batch.flash_whole_splits && int64_t{grid.x} * grid.y * grid.z <= batch.sm_count) {
    launchFlash<kHeadDim, kFlashSplitTiles, false>(stream, grid, threads, batch, tiles, g, q,
                                                   num_heads, group, scale, splits, per_block,
                                                   max_and_sum, acc);
  } else if (batch.flash_whole_splits) {
    launchFlash<kHeadDim, kFlashDeepStages, false>(stream, grid, threads, batch, tiles, g, q,
                                                   num_heads, group, scale, splits, per_block,
                                                   max_and_sum, acc);
  } else if (tiles != nullptr) {
    launchFlash<kHeadDim, 1, true>(stream, grid, threads, batch, tiles, g, q, num_heads, group,
                                   scale, splits, per_block, max_and_sum, acc);
  } else {
    launchFlash<kHeadDim, 1, false>(stream, grid, threads, batch, tiles, g, q, num_heads, group,
                                    scale, splits, per_block, max_and_sum, acc);
  }
}

// Splits one block of the flash kernel goes through, on a grid of `pairs`
// (query tile, KV head) pairs: all of them while that still leaves
// kFlashLoopBlocksPerSm blocks per SM, else halved until it does (at least
// one). A block's later splits then reuse its q fragments and its copies
// run on from split to split with no new block to start and fill.
constexpr int64_t kFlashLoopBlocksPerSm = 4;
int64_t flashSplitsPerBlock(int64_t pairs, int64_t splits, int64_t sm_count) {
  const int64_t target = kFlashLoopBlocksPerSm * std::max<int64_t>(sm_count, 1);
  int64_t per_block = splits;
  while (per_block > 1 && pairs * ceilDiv(splits, per_block) < target) {
    per_block = ceilDiv(per_block, 2);
  }
  return per_block;
}

}  // namespace

std::vector<FlashTile> flashTiles(const RowKv* row_kv, int64_t rows) {
  std::vector<FlashTile> tiles;
  for (int64_t row = 0; row < rows; ++row) {
    if (!flashTileStart(row_kv, row)) continue;
    tiles.push_back(FlashTile{static_cast<int32_t>(row),
                              static_cast<int32_t>(flashTileRows(row_kv, rows, row))});
  }
  return tiles;
}

size_t flashWholeSplitSharedBytes(int64_t head_dim) {
  switch (head_dim) {
    case 16:
      return flashSharedBytes<16, kFlashSplitTiles>();
    case 32:
      return flashSharedBytes<32, kFlashSplitTiles>();
    case 64:
      return flashSharedBytes<64, kFlashSplitTiles>();
    default:
      return flashSharedBytes<128, kFlashSplitTiles>();
  }
}

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

bool flashAttentionSupported(const KvCacheLayout& cache, int64_t num_heads) {
  const int64_t d = cache.head_dim;
  return cache.dtype == DType::kBF16 && (d == 16 || d == 32 || d == 64 || d == 128) &&
         cache.num_kv_heads >= 1 && num_heads % cache.num_kv_heads == 0 &&
         num_heads / cache.num_kv_heads <= kMaxGroup;
}

void launchPagedAttention(cudaStream_t stream, const DeviceBatch& batch, const KvCacheLayout& cache,
                          int32_t layer, const float* q, int64_t num_heads, float scale,
                          float* scratch, float* out, AttentionKernel kernel,
                          const NextFragments& next) {
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
  // One of the two partial kernels, instantiated for the cache's dtype.
  const bool bf16 = cache.dtype == DType::kBF16;
  auto partials = [&](auto bf16_kernel, auto f32_kernel, dim3 grid) {
    (bf16 ? bf16_kernel : f32_kernel)<<<grid, kSplitThreads, 0, stream>>>(
        batch.row_kv, batch.block_tables, g, q, num_heads, group, scale, splits, max_and_sum, acc);
  };
  const auto rows = static_cast<unsigned int>(batch.rows);
  const auto split_count = static_cast<unsigned int>(splits);
  if (kernel == AttentionKernel::kFlash && flashAttentionSupported(cache, num_heads)) {
    // A block per query tile where the backend gave them, each through a
    // run of splits (flashSplitsPerBlock) unless the step takes whole-split
    // loads, else a block per row and split.
    const bool per_tile = batch.flash_tiles != nullptr && batch.flash_tile_count > 0;
    const int64_t per_block = per_tile && !batch.flash_whole_splits
                                  ? flashSplitsPerBlock(batch.flash_tile_count * cache.num_kv_heads,
                                                        splits, batch.sm_count)
                                  : 1;
    const dim3 grid(per_tile ? static_cast<unsigned int>(batch.flash_tile_count) : rows,
                    static_cast<unsigned int>(cache.num_kv_heads),
                    static_cast<unsigned int>(ceilDiv(splits, per_block)));
    const auto threads = static_cast<unsigned int>(group * 32);
    const FlashTile* tiles = per_tile ? batch.flash_tiles : nullptr;
    switch (cache.head_dim) {
      case 16:
        launchFlashStages<16>(stream, grid, threads, batch, tiles, g, q, num_heads, group, scale,
                              splits, per_block, max_and_sum, acc);
        break;
      case 32:
        launchFlashStages<32>(stream, grid, threads, batch, tiles, g, q, num_heads, group, scale,
                              splits, per_block, max_and_sum, acc);
        break;
      case 64:
        launchFlashStages<64>(stream, grid, threads, batch, tiles, g, q, num_heads, group, scale,
                              splits, per_block, max_and_sum, acc);
        break;
      default:
        launchFlashStages<128>(stream, grid, threads, batch, tiles, g, q, num_heads, group, scale,
                               splits, per_block, max_and_sum, acc);
        break;
    }
  } else if (kernel != AttentionKernel::kReference && group <= kMaxGroup &&
             cache.head_dim * (bf16 ? 2 : 4) % 16 == 0) {
    partials(attentionGroupedKernel<Bf16Elements>, attentionGroupedKernel<F32Elements>,
             dim3(rows, static_cast<unsigned int>(cache.num_kv_heads), split_count));
  } else {
    partials(attentionPartialKernel<Bf16Elements>, attentionPartialKernel<F32Elements>,
             dim3(rows, static_cast<unsigned int>(num_heads), split_count));
  }
  const dim3 combine_grid(static_cast<unsigned int>(batch.rows),
                          static_cast<unsigned int>(num_heads));
  const int combine_threads =
      static_cast<int>(std::min<int64_t>(kMaxHeadDim, ceilDiv(cache.head_dim, 32) * 32));
  if (next.data != nullptr) {
    attentionCombineKernel<true><<<combine_grid, combine_threads, 0, stream>>>(
        batch.row_kv, num_heads, cache.head_dim, splits, max_and_sum, acc, out, next);
  } else {
    attentionCombineKernel<false><<<combine_grid, combine_threads, 0, stream>>>(
        batch.row_kv, num_heads, cache.head_dim, splits, max_and_sum, acc, out, next);
  }
}

}  // namespace tandem::kernels::cuda
