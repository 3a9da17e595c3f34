// Where a batch row's K/V go in the CUDA backend's block-major KV slab
// (kernels.h: block b at base + b * block_bytes; element (layer, kv, slot,
// kv_head, d) at ((layer * 2 + kv) * block_size + slot) * num_kv_heads *
// head_dim + kv_head * head_dim + d), and the one way an element is stored:
// fp32 as it is, bf16 with common/dtype.h's round-to-nearest-even steps, so
// the cache bytes equal the CPU backend's for the same fp32 K/V. Shared by
// writeKv and the Q/K/V epilogue (epilogue.h).
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>

#include "kernels/cuda/device_dtype.h"
#include "kernels/kernels.h"

namespace tandem::kernels::cuda {

// Where one row's token goes in the KV cache: its position and its
// sequence's block table. active == 0 marks a row outside every sequence.
struct RowKv {
  int64_t position = 0;
  int32_t table_offset = 0;  // index of the sequence's block table in block_tables
  int32_t num_blocks = 0;
  int32_t active = 0;
  int32_t padding = 0;
};

// Cache geometry the kernels need, in elements unless named *_bytes.
struct CacheGeometry {
  const char* base = nullptr;
  int64_t block_bytes = 0;
  int32_t block_size = 0;
  int32_t block_shift = -1;  // log2(block_size) where it is a power of two, else -1
  int64_t slot_stride = 0;   // num_kv_heads * head_dim
  int64_t head_dim = 0;
  int64_t k_offset = 0;  // (layer * 2) * block_size * slot_stride
  int64_t v_offset = 0;  // (layer * 2 + 1) * block_size * slot_stride
  bool bf16 = false;     // the cache's dtype: bf16, else f32
};

inline CacheGeometry geometryOf(const KvCacheLayout& cache, int32_t layer) {
  CacheGeometry g;
  g.base = static_cast<const char*>(cache.base);
  g.block_bytes = cache.blockBytes();
  g.block_size = cache.block_size;
  const auto size = static_cast<uint32_t>(cache.block_size);
  if (std::has_single_bit(size)) g.block_shift = std::countr_zero(size);
  g.slot_stride = int64_t{cache.num_kv_heads} * cache.head_dim;
  g.head_dim = cache.head_dim;
  const int64_t layer_stride = int64_t{cache.block_size} * g.slot_stride;
  g.k_offset = int64_t{layer} * 2 * layer_stride;
  g.v_offset = (int64_t{layer} * 2 + 1) * layer_stride;
  g.bf16 = cache.dtype == DType::kBF16;
  return g;
}

// The address of element `column` (kv_head * head_dim + d) of the K
// (offset g.k_offset) or V (g.v_offset) row of `info`'s position.
template <typename Storage>
__device__ __forceinline__ Storage* kvElement(const CacheGeometry& g, const int32_t* block_tables,
                                              const RowKv& info, int64_t offset, int64_t column) {
  const int64_t block = block_tables[info.table_offset + info.position / g.block_size];
  const int64_t slot = info.position % g.block_size;
  auto* dst = reinterpret_cast<Storage*>(const_cast<char*>(g.base) + block * g.block_bytes);
  return dst + offset + slot * g.slot_stride + column;
}

template <typename Storage>
__device__ __forceinline__ void storeKvValue(Storage* dst, float value) {
  if constexpr (sizeof(Storage) == 2) {
    *dst = f32ToBf16Bits(value);
  } else {
    *dst = value;
  }
}

// One K or V value of an active row into the cache, whatever its dtype.
__device__ __forceinline__ void storeKv(const CacheGeometry& g, const int32_t* block_tables,
                                        const RowKv& info, int64_t offset, int64_t column,
                                        float value) {
  if (g.bf16) {
    storeKvValue(kvElement<uint16_t>(g, block_tables, info, offset, column), value);
  } else {
    storeKvValue(kvElement<float>(g, block_tables, info, offset, column), value);
  }
}

}  // namespace tandem::kernels::cuda
