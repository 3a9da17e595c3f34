// The CPU backend: the kernels of kernels/kernels.h on host memory.
//
// Memory is ordinary aligned host memory, weights are used where they lie
// (residentWeight/residentFloats return the host data itself; with bf16
// compute, matmulWeight packs bf16 weights once), and every
// kernel forwards to the free function of kernels.h with the batch recorded
// by beginBatch(), so results are bit-identical to calling those functions
// directly. Kernels run synchronously: synchronize() has nothing to wait for.
// One thread at a time (the kernels' own pool does the parallel work).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace tandem::kernels::cpu {

class CpuBackend : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  // e.g. "cpu avx512, 2 threads".
  std::string description() const override;
  bool hostAccessible() const override { return true; }

  void* allocate(size_t bytes) override;
  void release(void* data, size_t bytes) override;
  void copyFromHost(void* dst, const void* host_src, size_t bytes) override;
  void copyToHost(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}

  WeightView residentWeight(const WeightView& host) override { return host; }
  const float* residentFloats(const float* host, size_t /*count*/) override { return host; }
  // bf16 compute: bf16 weights packed by kernels::packBf16Pairs.
  WeightView matmulWeight(const WeightView& host) override;
  void releaseWeight(const WeightView& host) override;

  void setComputeDType(DType dtype) override;
  void beginBatch(const BatchLayout& batch) override;

  void embedding(const WeightView& table, float* out) override;
  void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) override;
  void rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
               float* y) override;
  void addBias(float* y, const float* bias, int64_t rows, int64_t width) override;
  void applyRope(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq) override;
  bool appliesRopeVariants() const override { return true; }
  void applyRopeWith(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq,
                     const RopeVariant& variant) override;
  void siluMul(const float* gate, const float* up, float* out, int64_t n) override;
  void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                     float limit) override;
  void geluTanhMul(const float* gate, const float* up, float* out, int64_t n) override;
  void addInPlace(float* y, const float* x, int64_t n) override;
  void writeKv(const KvCacheLayout& cache, int32_t layer, const float* k, const float* v) override;
  void pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q, int64_t num_heads,
                      float scale, float* out) override;
  void pagedAttentionWith(const KvCacheLayout& cache, int32_t layer, const float* q,
                          int64_t num_heads, float scale, const AttentionVariant& variant,
                          float* out) override;
  void gatherLastRows(const float* x, int64_t width, float* out) override;
  void argmaxRows(const float* x, int64_t rows, int64_t width, int32_t* host_out) override;

  void readBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                  void* host_dst) override;
  void writeBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                   const void* host_src) override;

 private:
  // Copies of the current batch: the caller's arrays need not outlive
  // beginBatch(). sequences_[s].block_table points into block_tables_.
  std::vector<int32_t> token_ids_;
  std::vector<int32_t> positions_;
  std::vector<int32_t> block_tables_;
  std::vector<AttentionSequence> sequences_;
  DType compute_ = DType::kF32;
  // Packed copies, and their views, by the host data they were made from,
  // with the uses matmulWeight() has handed out and releaseWeight() not ended.
  struct Packed {
    std::vector<uint16_t> storage;
    WeightView view;
    int64_t uses = 0;
  };
  std::map<const void*, Packed> packed_;
};

}  // namespace tandem::kernels::cpu
