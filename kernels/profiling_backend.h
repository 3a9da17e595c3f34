#pragma once

// ProfilingBackend: a Backend that forwards every call to another one and,
// while enabled, times each compute call on its own: it synchronizes the
// device before and after the call, so each figure is that call's wall time
// (launch included) with nothing else in flight. Calls are grouped by what
// they are (the op and its shape: "matmul m=1 k=4096 n=14336 bf16"), which
// in a decode step names each projection of the model.
//
// What it is for: the per-kernel breakdown of `tandem-bench engine
// --profile-ops`, on any backend. While enabled, steps run eagerly
// (decodeBucket() answers 0, so nothing is recorded or replayed) and each
// call pays a synchronization, so the sum of the calls exceeds a normal
// step by about the launch latency per call; the bench prints both.
// Disabled, it adds one virtual call per op and nothing else.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace tandem::kernels {

struct OpProfile {
  std::string op;  // "rmsNorm rows=1 dim=4096", "matmul m=1 k=4096 n=1024 bf16", ...
  int64_t calls = 0;
  double seconds = 0.0;
  // Bytes the calls must read at least: weights (matmul, embedding), K and V
  // rows (pagedAttention), the copy (copyToHost); 0 where not counted.
  double bytes = 0.0;
  double flops = 0.0;  // multiply-adds × 2 (matmul); 0 where not counted
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner) {}

  // Starts or stops timing; stopping keeps what was gathered.
  void setEnabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  // What was gathered since the last take(), slowest first (ties by name),
  // and forgets it.
  std::vector<OpProfile> take();

  DeviceKind kind() const override { return inner_.kind(); }
  std::string description() const override { return inner_.description(); }
  bool hostAccessible() const override { return inner_.hostAccessible(); }

  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void release(void* data, size_t bytes) override { inner_.release(data, bytes); }
  void copyFromHost(void* dst, const void* host_src, size_t bytes) override {
    inner_.copyFromHost(dst, host_src, bytes);
  }
  void copyToHost(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  void synchronize() override { inner_.synchronize(); }

  WeightView residentWeight(const WeightView& host) override { return inner_.residentWeight(host); }
  const float* residentFloats(const float* host, size_t count) override {
    return inner_.residentFloats(host, count);
  }
  WeightView matmulWeight(const WeightView& host) override { return inner_.matmulWeight(host); }
  void releaseWeight(const WeightView& host) override { inner_.releaseWeight(host); }
  void setComputeDType(DType dtype) override { inner_.setComputeDType(dtype); }

  void beginBatch(const BatchLayout& batch) override;

  void embedding(const WeightView& table, float* out) override;
  void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) override;
  void matmulAdd(const float* x, int64_t m, int64_t k, const WeightView& w, float* y,
                 float* scratch) override;
  void matmulSplit(const float* x, int64_t m, int64_t k, const WeightView& w,
                   const SplitOutputs& out, float* scratch) override;
  StackedLayout stackedLayout() const override { return inner_.stackedLayout(); }
  void matmulSiluMul(const float* x, int64_t m, int64_t k, const WeightView& gate_up, float* out,
                     float* scratch, float* up_scratch) override;
  void matmulQkvRope(const float* x, int64_t m, int64_t k, const WeightView& qkv, const QkvRope& a,
                     const KvCacheLayout& cache, float* scratch) override;
  void rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
               float* y) override;
  void addBias(float* y, const float* bias, int64_t rows, int64_t width) override;
  void applyRope(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq) override;
  bool appliesRopeVariants() const override { return inner_.appliesRopeVariants(); }
  void applyRopeWith(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq,
                     const RopeVariant& variant) override;
  void siluMul(const float* gate, const float* up, float* out, int64_t n) override;
  void geluTanhMul(const float* gate, const float* up, float* out, int64_t n) override;
  void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                     float limit) override;
  void addInPlace(float* y, const float* x, int64_t n) override;
  void copyColumns(const float* src, int64_t rows, int64_t src_width, int64_t first, int64_t width,
                   float* dst) override;
  void writeKv(const KvCacheLayout& cache, int32_t layer, const float* k, const float* v) override;
  void pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q, int64_t num_heads,
                      float scale, float* out) override;
  void pagedAttentionWith(const KvCacheLayout& cache, int32_t layer, const float* q,
                          int64_t num_heads, float scale, const AttentionVariant& variant,
                          float* out) override;
  void gatherLastRows(const float* x, int64_t width, float* out) override;
  void argmaxRows(const float* x, int64_t rows, int64_t width, int32_t* host_out) override;

  // Eager while enabled: no step is recorded or replayed.
  int64_t decodeBucket(int64_t sequences) const override {
    return enabled_ ? 0 : inner_.decodeBucket(sequences);
  }
  bool replayStep(uint64_t owner) override { return inner_.replayStep(owner); }
  void endStep(bool completed) override { inner_.endStep(completed); }
  void forgetRecordings() override { inner_.forgetRecordings(); }

  bool pinHost(void* host, size_t bytes) override { return inner_.pinHost(host, bytes); }
  void unpinHost(void* host) override { inner_.unpinHost(host); }

  void readBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                  void* host_dst) override {
    inner_.readBlocks(cache, host_blocks, count, host_dst);
  }
  void writeBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                   const void* host_src) override {
    inner_.writeBlocks(cache, host_blocks, count, host_src);
  }

 private:
  // Runs fn; when enabled, times it under the name opName() returns (built
  // only then) and adds `bytes` and `flops`.
  template <typename Name, typename Fn>
  void timed(Name&& opName, double bytes, Fn&& fn, double flops = 0.0);
  template <typename Call>
  void timedMatmul(const char* op, int64_t m, int64_t k, const WeightView& w, Call&& call);

  Backend& inner_;
  bool enabled_ = false;
  int64_t rows_ = 0;            // rows of the current batch (for the ops that take none)
  int64_t sequences_ = 0;       // sequences of the current batch
  int64_t context_tokens_ = 0;  // positions the current batch's attention reads, summed
  std::map<std::string, OpProfile> ops_;
};

}  // namespace tandem::kernels
