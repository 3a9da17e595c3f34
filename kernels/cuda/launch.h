// Launchers of the CUDA backend's kernels (one .cu file per concept) and the
// device-side view of a batch they share. Internal to kernels/cuda/: every
// launcher issues its kernels on `stream` and returns without waiting; all
// pointers are device memory unless named host_*.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "kernels/backend.h"
#include "kernels/cuda/epilogue.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/kernels.h"

namespace tandem::kernels::cuda {

// Lets kKernel launch with `bytes` of dynamic shared memory, past the 48 KB
// default: asked for once per process and kernel (the attribute is set for
// the current device: one device per process, as the agent runs; a process
// driving several would have to ask per device). Aborts with `refusal`
// where the device offers less. Every caller passes its kernel's one
// constant size.
template <auto kKernel>
void optInSharedMemory(size_t bytes, const char* refusal) {
  static const cudaError_t opted_in = cudaFuncSetAttribute(
      kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  TANDEM_CHECK(opted_in == cudaSuccess, refusal);
}

// The batch of beginBatch() in device memory.
// One query tile of the flash attention kernel (attention.cu): `rows` rows
// from batch row `first_row`, of one sequence at consecutive positions.
struct FlashTile {
  int32_t first_row = 0;
  int32_t rows = 0;
};

struct DeviceBatch {
  const int32_t* token_ids = nullptr;  // rows
  const int32_t* positions = nullptr;  // rows (for RoPE)
  const RowKv* row_kv = nullptr;       // rows
  const int64_t* last_rows = nullptr;  // num_sequences; -1 for a sequence without rows
  const int32_t* block_tables = nullptr;
  int64_t rows = 0;
  int64_t num_sequences = 0;
  int64_t max_position = 0;  // largest RowKv::position of any row
  // Splits of kAttentionSplit positions pagedAttention is launched over: at
  // least max_position / kAttentionSplit + 1 (more for a recorded step; the
  // extra ones exit at once).
  int64_t attention_splits = 1;
  // The flash kernel's query tiles (flashTiles), where the backend launches
  // it over them (CudaBackendOptions::compact_attention, a step that is not
  // recorded): a block per tile and KV head, each through a run of splits;
  // nullptr: one block per row and split, those that start no tile exiting
  // at once.
  const FlashTile* flash_tiles = nullptr;
  int64_t flash_tile_count = 0;
  // The device's multiprocessors (how many splits a block of the flash
  // kernel goes through on a grid of tiles, and whether a grid is small
  // enough for whole splits in flight: attention.cu).
  int64_t sm_count = 1;
  // The flash kernel copies all of a split's K and V tiles into shared
  // memory at once (three of its four where the grid has more blocks than
  // SMs) instead of one tile ahead (CudaBackendOptions::deep_attention, a
  // decode step): the same bits.
  bool flash_whole_splits = false;
};

// Positions one attention work item covers. A fixed size, never derived from
// the batch, so a query's partial sums have the same bounds however it is
// batched or chunked.
constexpr int64_t kAttentionSplit = 256;
constexpr int kMaxHeadDim = 256;

// elementwise.cu
void launchEmbedding(cudaStream_t stream, const WeightView& table, const DeviceBatch& batch,
                     float* out);
void launchAddBias(cudaStream_t stream, float* y, const float* bias, int64_t rows, int64_t width);
void launchAddInPlace(cudaStream_t stream, float* y, const float* x, int64_t n);
void launchSiluMul(cudaStream_t stream, const float* gate, const float* up, float* out, int64_t n);
void launchGatherLastRows(cudaStream_t stream, const DeviceBatch& batch, const float* x,
                          int64_t width, float* out);
// out[r] (device) = smallest index of row r's maximum; 0 when none beats -inf.
void launchArgmax(cudaStream_t stream, const float* x, int64_t rows, int64_t width, int32_t* out);

// norm_rope.cu
// `next` (data set): y also as a bf16 decode matmul's x fragments.
void launchRmsNorm(cudaStream_t stream, const float* x, const float* weight, int64_t rows,
                   int64_t dim, float eps, float* y, const NextFragments& next = {});
void launchApplyRope(cudaStream_t stream, const DeviceBatch& batch, float* x, int64_t num_heads,
                     int64_t head_dim, const float* inv_freq);
// The first rotary_dim (even, at most head_dim) values of each head rotate,
// as halves or (interleaved) neighbour pairs, cos and sin multiplied by
// attention_factor (Backend::applyRopeWith).
void launchApplyRopeWith(cudaStream_t stream, const DeviceBatch& batch, float* x, int64_t num_heads,
                         int64_t head_dim, const float* inv_freq, int64_t rotary_dim,
                         float attention_factor, bool interleaved);

// matmul.cu
void launchMatmul(cudaStream_t stream, const float* x, int64_t m, int64_t k, const WeightView& w,
                  float* y);

// The fast kernels below store their outputs through an epilogue
// (epilogue.h: a plain store, the residual add, parts, SiLU·up pairs).
//
// gemv_fast.cu (--cuda-kernels fast): matmul for m <= kGemvMaxRows over
// weights re-laid by weight_layout.h (`relaid`: the re-laid data, with the
// dtype and n x k of the original), the same bits as launchMatmul. `scratch`
// holds the chunk partials: at least fastGemvScratchFloats(m, k, relaid,
// cap) floats; more columns than it holds run as several launches.
// `arrivals` (fused launches): at least fastGemvGroups(k, relaid)
// counters, all zero, which the call leaves zero; the fold is then done by
// the partial kernel, one launch per slice; nullptr: a fold kernel follows.
int64_t fastGemvScratchFloats(int64_t m, int64_t k, const WeightView& relaid, int64_t cap_floats);
int64_t fastGemvGroups(int64_t k, const WeightView& relaid);
void launchFastGemv(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                    const WeightView& relaid, const MatmulEpilogue& out, float* scratch,
                    int64_t scratch_floats, int sm_count, unsigned int* arrivals = nullptr);

// matmul_bf16_mma.cu (--cuda-kernels fast with --compute-dtype bf16): y =
// bf16(x) · w^T on the tensor cores, for bf16 row-major weights and any m.
// Above kBf16MmaSmallRows rows (k a multiple of 8) the pipelined kernel
// runs, with x rounded into `x_bf16`, which must hold
// bf16MmaScratchElements(m, k) elements (0: none needed); nullptr keeps the
// small kernel. Both give every output the same bits.
constexpr int64_t kBf16MmaSmallRows = 256;
// Up to kBf16MmaSkinnyRows rows, with the weights re-laid as mma fragments
// (weight_layout.h relayoutForMma, the bytes a device copy): the skinny
// decode kernel, the same bits again. `x_fragments` (16-byte aligned) holds
// x rounded to bf16 in fragment order: bf16MmaSkinnyScratchBytes(m, k).
// x_ready: x_fragments already hold x so (written by x's producer,
// epilogue.h NextFragments); else the call rounds x into them first.
// deep (CudaBackendOptions::deep_skinny): each warp streams its weights
// through a ring of batches in shared memory by cp.async, several batches
// in flight instead of one, and past 16 rows the block shares x's
// fragments through shared memory too; the same mma in the same order, so
// the same bits.
constexpr int64_t kBf16MmaSkinnyRows = 64;
int64_t bf16MmaSkinnyScratchBytes(int64_t m, int64_t k);
void launchBf16MmaSkinny(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                         const void* fragments, int64_t n, const MatmulEpilogue& out,
                         void* x_fragments, bool x_ready = false, bool deep = false);
// NOT batch-invariant, for measuring the cost of invariance only
// (CudaBackendOptions::unordered_decode): the skinny kernel with k split
// over enough blocks for four per SM and the partials added with atomics.
// Plain and adding stores only (out.kind kStore or kAdd).
void launchBf16MmaSkinnyUnordered(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                                  const void* fragments, int64_t n, const MatmulEpilogue& out,
                                  void* x_fragments, int sm_count);
// `config`: one of kernels/backend.h's kBf16GemmConfigs
// (CudaBackendOptions::bf16_gemm_config); `sm_count`, the device's
// multiprocessors (configuration 7's persistent grid).
// Whether this build holds the wgmma kernel (compiled for sm_90a when the
// architectures include 90; kernels/CMakeLists.txt).
bool bf16WgmmaBuilt();
int64_t bf16MmaScratchElements(int64_t m, int64_t k);
void launchBf16MmaMatmul(cudaStream_t stream, const float* x, int64_t m, int64_t k,
                         const WeightView& w, const MatmulEpilogue& out, uint16_t* x_bf16,
                         int config = 0, int sm_count = 1);

// matmul_bf16_wgmma.cu (sm_90a only): wgmma configuration `config`'s kernel
// (4: 128 x 128 tiles; 5: 128 x 256, overlapped steps; 6: 128 x 256 fed by
// tensor copies; 7: 6 on a persistent grid of `sm_count` blocks) over x
// already rounded to bf16 (k a multiple of 8, 16-byte aligned operands).
void launchBf16Wgmma(cudaStream_t stream, const uint16_t* x_bf16, int64_t m, int64_t k,
                     const uint16_t* weights, int64_t n, const MatmulEpilogue& out, int config,
                     int sm_count);

// attention.cu
void launchWriteKv(cudaStream_t stream, const DeviceBatch& batch, const KvCacheLayout& cache,
                   int32_t layer, const float* k, const float* v);
// Floats of scratch pagedAttention needs for this batch.
int64_t attentionScratchFloats(const DeviceBatch& batch, int64_t num_heads, int64_t head_dim);
// `grouped`: the fast kernels' partial kernel (one block per KV head, K and
// V staged through shared memory), where it supports the shape; the same
// bits as the reference either way.
// The flash kernel's query tiles of a batch whose rows are `row_kv` (host
// memory), in row order: each active row that starts a tile (a position
// that is a multiple of 16, or one the row before does not precede in the
// same sequence) with the active rows after it that start none, 16 at most.
std::vector<FlashTile> flashTiles(const RowKv* row_kv, int64_t rows);
// The dynamic shared memory a block of the flash kernel needs at `head_dim`
// with a whole split's tiles in flight (DeviceBatch::flash_whole_splits).
size_t flashWholeSplitSharedBytes(int64_t head_dim);
// Which partial kernel pagedAttention runs (attention.cu's header): the
// reference, the grouped one (its bits), or the tensor-core flash kernel
// (its own bits) where flashAttentionSupported, else the grouped one.
enum class AttentionKernel { kReference, kGrouped, kFlash };
bool flashAttentionSupported(const KvCacheLayout& cache, int64_t num_heads);
// `next` (data set): out also as a bf16 decode matmul's x fragments,
// written by the combine kernel.
void launchPagedAttention(cudaStream_t stream, const DeviceBatch& batch, const KvCacheLayout& cache,
                          int32_t layer, const float* q, int64_t num_heads, float scale,
                          float* scratch, float* out,
                          AttentionKernel kernel = AttentionKernel::kReference,
                          const NextFragments& next = {});

}  // namespace tandem::kernels::cuda
