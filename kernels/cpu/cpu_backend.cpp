#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/status.h"

namespace tandem::kernels::cpu {
namespace {

constexpr size_t kAlignment = 256;

}  // namespace

std::string CpuBackend::description() const {
  const int threads = numThreads();
  return "cpu " + isaName() + ", " + std::to_string(threads) +
         (threads == 1 ? " thread" : " threads") +
         (compute_ == DType::kBF16 ? ", bf16 compute" : "");
}

void CpuBackend::setComputeDType(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw Error(std::string("compute dtype ") + dtypeShortName(dtype) +
                " is not supported by cpu (accepted: f32, bf16)");
  }
  compute_ = dtype;
}

void* CpuBackend::allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; a zero-byte request
  // still gets a distinct, releasable pointer.
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (data == nullptr) return nullptr;
  std::memset(data, 0, rounded == 0 ? kAlignment : rounded);
  return data;
}

WeightView CpuBackend::matmulWeight(const WeightView& host) {
  if (compute_ != DType::kBF16 || host.dtype != DType::kBF16 ||
      host.layout != WeightLayout::kRows) {
    return host;
  }
  auto [it, inserted] = packed_.try_emplace(host.data);
  if (inserted) it->second.view = packBf16Pairs(host, it->second.storage);
  ++it->second.uses;
  return it->second.view;
}

void CpuBackend::releaseWeight(const WeightView& host) {
  auto it = packed_.find(host.data);
  if (it == packed_.end()) return;
  if (--it->second.uses <= 0) packed_.erase(it);
}

void CpuBackend::release(void* data, size_t /*bytes*/) { std::free(data); }

void CpuBackend::copyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuBackend::beginBatch(const BatchLayout& batch) {
  token_ids_.assign(batch.token_ids, batch.token_ids + batch.rows);
  positions_.assign(batch.positions, batch.positions + batch.rows);
  block_tables_.clear();
  for (int64_t s = 0; s < batch.num_sequences; ++s) {
    const AttentionSequence& sequence = batch.sequences[s];
    block_tables_.insert(block_tables_.end(), sequence.block_table,
                         sequence.block_table + sequence.num_blocks);
  }
  sequences_.assign(batch.sequences, batch.sequences + batch.num_sequences);
  size_t offset = 0;
  for (AttentionSequence& sequence : sequences_) {
    sequence.block_table = block_tables_.data() + offset;
    offset += static_cast<size_t>(sequence.num_blocks);
  }
}

void CpuBackend::embedding(const WeightView& table, float* out) {
  kernels::embedding(table, token_ids_.data(), static_cast<int64_t>(token_ids_.size()), out);
}

void CpuBackend::matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) {
  kernels::matmul(x, m, k, w, y);
}

void CpuBackend::rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                         float* y) {
  kernels::rmsNorm(x, weight, rows, dim, eps, y);
}

void CpuBackend::addBias(float* y, const float* bias, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) kernels::addInPlace(y + r * width, bias, width);
}

void CpuBackend::applyRope(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq) {
  kernels::applyRope(x, static_cast<int64_t>(positions_.size()), num_heads, head_dim,
                     positions_.data(), inv_freq);
}

void CpuBackend::applyRopeWith(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq,
                               const RopeVariant& variant) {
  kernels::applyRope(x, static_cast<int64_t>(positions_.size()), num_heads, head_dim,
                     positions_.data(), inv_freq, variant);
}

void CpuBackend::siluMul(const float* gate, const float* up, float* out, int64_t n) {
  kernels::siluMul(gate, up, out, n);
}

void CpuBackend::clampedSwiglu(const float* gate, const float* up, float* out, int64_t n,
                               float alpha, float limit) {
  kernels::clampedSwiglu(gate, up, out, n, alpha, limit);
}

void CpuBackend::geluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  kernels::geluTanhMul(gate, up, out, n);
}

void CpuBackend::addInPlace(float* y, const float* x, int64_t n) { kernels::addInPlace(y, x, n); }

void CpuBackend::writeKv(const KvCacheLayout& cache, int32_t layer, const float* k,
                         const float* v) {
  kernels::writeKv(cache, layer, k, v, sequences_.data(), static_cast<int64_t>(sequences_.size()));
}

void CpuBackend::pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q,
                                int64_t num_heads, float scale, float* out) {
  kernels::pagedAttention(cache, layer, q, num_heads, scale, sequences_.data(),
                          static_cast<int64_t>(sequences_.size()), out);
}

void CpuBackend::pagedAttentionWith(const KvCacheLayout& cache, int32_t layer, const float* q,
                                    int64_t num_heads, float scale, const AttentionVariant& variant,
                                    float* out) {
  kernels::pagedAttention(cache, layer, q, num_heads, scale, sequences_.data(),
                          static_cast<int64_t>(sequences_.size()), out, variant.window,
                          variant.softcap, variant.sinks);
}

void CpuBackend::gatherLastRows(const float* x, int64_t width, float* out) {
  for (size_t s = 0; s < sequences_.size(); ++s) {
    const AttentionSequence& sequence = sequences_[s];
    const float* row = x + (sequence.first_row + sequence.num_rows - 1) * width;
    std::memcpy(out + static_cast<int64_t>(s) * width, row,
                static_cast<size_t>(width) * sizeof(float));
  }
}

void CpuBackend::argmaxRows(const float* x, int64_t rows, int64_t width, int32_t* host_out) {
  for (int64_t r = 0; r < rows; ++r) {
    host_out[r] = static_cast<int32_t>(kernels::argmax(x + r * width, width));
  }
}

void CpuBackend::readBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                            void* host_dst) {
  const int64_t block_bytes = cache.blockBytes();
  const auto* base = static_cast<const uint8_t*>(cache.base);
  auto* dst = static_cast<uint8_t*>(host_dst);
  for (int64_t i = 0; i < count; ++i) {
    TANDEM_CHECK(host_blocks[i] >= 0 && host_blocks[i] < cache.num_blocks,
                 "readBlocks: block id out of range");
    std::memcpy(dst + i * block_bytes, base + host_blocks[i] * block_bytes,
                static_cast<size_t>(block_bytes));
  }
}

void CpuBackend::writeBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                             const void* host_src) {
  const int64_t block_bytes = cache.blockBytes();
  auto* base = static_cast<uint8_t*>(cache.base);
  const auto* src = static_cast<const uint8_t*>(host_src);
  for (int64_t i = 0; i < count; ++i) {
    TANDEM_CHECK(host_blocks[i] >= 0 && host_blocks[i] < cache.num_blocks,
                 "writeBlocks: block id out of range");
    std::memcpy(base + host_blocks[i] * block_bytes, src + i * block_bytes,
                static_cast<size_t>(block_bytes));
  }
}

}  // namespace tandem::kernels::cpu
