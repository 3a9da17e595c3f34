// A compute backend: the memory the engine's activations, weights and KV slab
// live in, and the kernels that run on it. The CPU backend (kernels/cpu/)
// runs the kernels of kernels.h on host memory; the CUDA backend
// (kernels/cuda/) runs its own on device memory. The engine, scheduler and
// connectors see only this interface.
//
// Exactness, on every backend: each kernel keeps the batch-invariance
// contract of kernels.h (a row's result depends only on that row's inputs,
// never on the number of rows, its place in the batch or the launch shape;
// reductions have one order chosen from the reduced length alone), so a
// sequence's logits and KV bytes are bit-identical however it was batched or
// chunked on that backend. Two backends agree to rounding, not to the bit.
//
// Pointers passed to kernels are this backend's memory (allocate(), or
// resident*()); host pointers are named host_*. Kernels are issued in order
// on one stream; copyToHost() and synchronize() wait for what was issued.
// A Backend is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/kernels.h"

namespace tandem::kernels {

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda".
// Inline: Backend's own methods use it, in every library that defines one.
inline const char* deviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

// One forward batch: rows are the new tokens of every sequence, in order.
// All pointers are host memory, valid for the duration of beginBatch().
struct BatchLayout {
  const int32_t* token_ids = nullptr;  // rows
  const int32_t* positions = nullptr;  // rows
  int64_t rows = 0;
  const AttentionSequence* sequences = nullptr;  // block_table pointers are host memory too
  int64_t num_sequences = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  // What it computes on, for /health and logs, e.g. "cpu avx512 x2 threads"
  // or "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)".
  virtual std::string description() const = 0;
  // True when this backend's memory is ordinary host memory (pointers from
  // allocate() may be read and written by the host directly).
  virtual bool hostAccessible() const = 0;

  // --- Memory ---
  // Zero-filled, aligned to at least 256 bytes; nullptr when it cannot be had.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data, size_t bytes) = 0;
  virtual void copyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits for the kernels issued before it.
  virtual void copyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // Weights in this backend's memory. CPU: the host view itself (no copy).
  // CUDA: a device copy owned by the backend until releaseWeight() ends its
  // last use (or the backend is destroyed); the same host data asked for
  // twice gives the same copy. Throws tandem::Error when
  // the memory cannot be had.
  virtual WeightView residentWeight(const WeightView& host) = 0;
  virtual const float* residentFloats(const float* host, size_t count) = 0;
  // A weight the caller will pass to matmul: residentWeight's view, or where
  // the compute dtype asks for another layout (CPU, bf16 compute, bf16
  // weights: kernels.h's packBf16Pairs) a copy in it, owned by the backend
  // until releaseWeight() ends its last use; the same host data gives the
  // same copy.
  virtual WeightView matmulWeight(const WeightView& host) { return residentWeight(host); }
  // Ends one use of a copy residentWeight(), residentFloats() (as the view
  // {host, kF32, 1, count}) or matmulWeight() made of `host`: each call that
  // returned other data than the host's is one use. The copy is freed when
  // its last use ends, so host memory that a later model reuses at the same
  // address gets a copy of its own, never a stale one. Recordings that may
  // read the copy must be forgotten first (forgetRecordings()).
  virtual void releaseWeight(const WeightView& host) {}

  // What matmul multiplies (docs/engine.md#compute-dtype): kF32, the
  // default, or kBF16, for the weights matmulWeight() gives from now on
  // (call it before making weights resident). Throws tandem::Error naming
  // what this backend accepts.
  virtual void setComputeDType(DType dtype) {
    if (dtype != DType::kF32) {
      throw Error(std::string("compute dtype ") + dtypeShortName(dtype) +
                  " is not supported by the " + deviceKindName(kind()) +
                  " backend (accepted: f32)");
    }
  }

  // --- The batch the next kernels refer to (ids, positions, sequences) ---
  virtual void beginBatch(const BatchLayout& batch) = 0;

  // --- Kernels: contracts as in kernels.h; rows = the batch's rows ---
  // out[r, :] = table[token_ids[r], :] as fp32.
  virtual void embedding(const WeightView& table, float* out) = 0;
  // y[m, n] = x[m, k] · w[n, k]^T; y must not alias x.
  virtual void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) = 0;
  virtual void rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                       float* y) = 0;
  // y[r, :] += bias for r in [0, rows); y has row stride `width`.
  virtual void addBias(float* y, const float* bias, int64_t rows, int64_t width) = 0;
  // x: batch rows x (num_heads * head_dim), in place, at the batch's positions.
  virtual void applyRope(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq) = 0;
  // applyRope with kernels.h's RopeVariant (partial rotary dims, LongRoPE's
  // attention factor: Phi-3, Phi-4; interleaved pairs: GLM). Only the CPU
  // backend has it; the model runner refuses models that need it on the
  // others first.
  // Whether applyRopeWith runs here (else it throws).
  virtual bool appliesRopeVariants() const { return false; }
  virtual void applyRopeWith(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq,
                             const RopeVariant& variant) {
    throw Error(std::string("partial rotary embedding and LongRoPE's attention factor are not "
                            "supported by the ") +
                deviceKindName(kind()) + " backend");
  }
  virtual void siluMul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // kernels.h's clampedSwiglu (GPT-OSS's experts). Only the CPU backend
  // has it; mixtures run there only.
  virtual void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                             float limit) {
    throw Error(std::string("GPT-OSS's clamped SwiGLU is not supported by the ") +
                deviceKindName(kind()) + " backend");
  }
  // kernels.h's geluTanhMul (Gemma 3's MLP). Only the CPU backend has it;
  // the model runner refuses such models on the others first.
  virtual void geluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
    throw Error(std::string("GELU (tanh) is not supported by the ") + deviceKindName(kind()) +
                " backend");
  }
  virtual void addInPlace(float* y, const float* x, int64_t n) = 0;
  // dst[r, 0..width) = src[r, first..first + width) for r in [0, rows): a
  // block of columns of a matrix with row stride src_width, made contiguous
  // (the outputs of a fused matmul, taken apart). A plain copy of bits.
  virtual void copyColumns(const float* src, int64_t rows, int64_t src_width, int64_t first,
                           int64_t width, float* dst) {
    for (int64_t r = 0; r < rows; ++r) {
      copy(dst + r * width, src + r * src_width + first,
           static_cast<size_t>(width) * sizeof(float));
    }
  }

  // --- Matmuls with their next steps (fused projections) ---
  // Each gives the bits of the unfused sequence its default implementation
  // runs; a backend may instead do those steps in the matmul's epilogue,
  // as each output is stored (docs/cuda.md#fused-projections).
  // `scratch` holds m * w.rows floats, for the matmul's outputs; as for
  // matmul, no output may overlap x.
  //
  // y[m, w.rows] += x · w^T: matmul into scratch, then addInPlace.
  virtual void matmulAdd(const float* x, int64_t m, int64_t k, const WeightView& w, float* y,
                         float* scratch) {
    matmul(x, m, k, w, scratch);
    addInPlace(y, scratch, m * w.rows);
  }
  // The outputs of a stacked matrix taken apart: parts[i] gets the next
  // widths[i] columns, as its own m x widths[i] matrix (the widths add up
  // to w.rows): matmul into scratch, then copyColumns for each part.
  struct SplitOutputs {
    static constexpr int kMaxParts = 3;
    float* parts[kMaxParts] = {};
    int64_t widths[kMaxParts] = {};
    int count = 0;
  };
  virtual void matmulSplit(const float* x, int64_t m, int64_t k, const WeightView& w,
                           const SplitOutputs& out, float* scratch) {
    matmul(x, m, k, w, scratch);
    int64_t first = 0;
    for (int i = 0; i < out.count; ++i) {
      copyColumns(scratch, m, w.rows, first, out.widths[i], out.parts[i]);
      first += out.widths[i];
    }
  }
  // How the rows of stacked matrices are to be ordered for matmulSiluMul
  // and matmulQkvRope. kPlain (the default): gate/up is the inter gate rows
  // then the inter up rows; q/k/v the matrices one after the other. kPairs:
  // gate row j then up row j for each j; and in q and k, each head's rows
  // in RoPE pairs (i, i + head_dim / 2) for i = 0 .. head_dim / 2 - 1 (v as
  // it is). Either way, what a pair of outputs is combined into meets in
  // one place of an epilogue.
  enum class StackedLayout { kPlain, kPairs };
  virtual StackedLayout stackedLayout() const { return StackedLayout::kPlain; }
  // out[m, inter] = silu(gate) * up, where gate and up are x's products
  // with the rows of `gate_up` (2 * inter rows in stackedLayout() order):
  // matmul into scratch, gate and up copied apart (into out and
  // up_scratch, m * inter floats), then siluMul(out, up_scratch, out). A
  // backend whose layout is kPairs overrides this and matmulQkvRope.
  virtual void matmulSiluMul(const float* x, int64_t m, int64_t k, const WeightView& gate_up,
                             float* out, float* scratch, float* up_scratch) {
    const int64_t inter = gate_up.rows / 2;
    matmul(x, m, k, gate_up, scratch);
    copyColumns(scratch, m, 2 * inter, 0, inter, out);
    copyColumns(scratch, m, 2 * inter, inter, inter, up_scratch);
    siluMul(out, up_scratch, out, m * inter);
  }
  // The attention block's start for a layer without q/k norm: q, k and v
  // from one stacked matrix (rows in stackedLayout() order), their biases
  // (nullptr: none), RoPE on q and k at the batch's positions, k and v into
  // the cache. On return q holds the rotated queries; k and v (m x
  // kv_width floats each) are scratch a backend may leave unwritten.
  // Default: matmulSplit into q, k, v, addBias, applyRope, writeKv.
  struct QkvRope {
    float* q = nullptr;
    float* k = nullptr;
    float* v = nullptr;
    int64_t num_heads = 0;
    int64_t num_kv_heads = 0;
    int64_t head_dim = 0;
    const float* q_bias = nullptr;
    const float* k_bias = nullptr;
    const float* v_bias = nullptr;
    const float* inv_freq = nullptr;
    int32_t layer = 0;
  };
  virtual void matmulQkvRope(const float* x, int64_t m, int64_t k, const WeightView& qkv,
                             const QkvRope& a, const KvCacheLayout& cache, float* scratch) {
    const int64_t q_width = a.num_heads * a.head_dim;
    const int64_t kv_width = a.num_kv_heads * a.head_dim;
    SplitOutputs parts;
    parts.parts[0] = a.q;
    parts.parts[1] = a.k;
    parts.parts[2] = a.v;
    parts.widths[0] = q_width;
    parts.widths[1] = kv_width;
    parts.widths[2] = kv_width;
    parts.count = 3;
    matmulSplit(x, m, k, qkv, parts, scratch);
    biasRopeWriteKv(m, a, cache);
  }
  // matmulQkvRope's steps after q, k and v are in a.q, a.k and a.v.
  void biasRopeWriteKv(int64_t m, const QkvRope& a, const KvCacheLayout& cache) {
    const int64_t q_width = a.num_heads * a.head_dim;
    const int64_t kv_width = a.num_kv_heads * a.head_dim;
    if (a.q_bias != nullptr) addBias(a.q, a.q_bias, m, q_width);
    if (a.k_bias != nullptr) addBias(a.k, a.k_bias, m, kv_width);
    if (a.v_bias != nullptr) addBias(a.v, a.v_bias, m, kv_width);
    applyRope(a.q, a.num_heads, a.head_dim, a.inv_freq);
    applyRope(a.k, a.num_kv_heads, a.head_dim, a.inv_freq);
    writeKv(cache, a.layer, a.k, a.v);
  }

  // The batch's K/V rows of `layer` into the cache (cache.base is this
  // backend's memory), then attention of q against it.
  virtual void writeKv(const KvCacheLayout& cache, int32_t layer, const float* k,
                       const float* v) = 0;
  virtual void pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q,
                              int64_t num_heads, float scale, float* out) = 0;
  // pagedAttention within a sliding window (a query at position p attends
  // to max(0, p - window + 1)..p; 0: none), with soft-capped scores
  // (tanh(s / softcap) * softcap; 0: none) and with attention sinks
  // (num_heads logits in this backend's memory, one more softmax term per
  // head; nullptr: none), as kernels.h's. Only the CPU backend has it; the
  // model runner refuses models that need it (Gemma, GPT-OSS) on the
  // others first.
  struct AttentionVariant {
    int64_t window = 0;
    float softcap = 0.0f;
    const float* sinks = nullptr;
  };
  virtual void pagedAttentionWith(const KvCacheLayout& cache, int32_t layer, const float* q,
                                  int64_t num_heads, float scale, const AttentionVariant& variant,
                                  float* out) {
    throw Error(std::string("sliding-window and soft-capped attention are not supported by the ") +
                deviceKindName(kind()) + " backend");
  }
  // out[s, :] = x[last row of sequence s, :], width floats per row.
  virtual void gatherLastRows(const float* x, int64_t width, float* out) = 0;
  // host_out[r] = argmax of x[r, 0..width) as kernels.h's argmax (the
  // smallest index wins a tie; NaN never wins; 0 when nothing beats -inf).
  // Waits for the result, which is exact on every backend.
  virtual void argmaxRows(const float* x, int64_t rows, int64_t width, int32_t* host_out) = 0;

  // --- Recorded decode steps (CUDA graphs) ---
  // Launching a decode step's hundreds of small kernels one by one costs more
  // than computing them on a small model; a backend that can record a step
  // once and replay it says so here. The caller pads a decode batch (one new
  // token per sequence) of `sequences` sequences to the returned bucket with
  // inactive rows (rows outside every sequence) and empty sequences, so that
  // one recording serves every batch of that bucket. 0 (the default): no
  // recording; run every step as issued.
  virtual int64_t decodeBucket(int64_t sequences) const { return 0; }
  // Called after beginBatch() of a padded decode batch. True: a recording of
  // this batch's shape made for `owner` was launched, and the caller must not
  // issue the step's kernels. False: the caller issues them; the backend may
  // record them (the first sight of a shape runs plainly, so every buffer has
  // its final size before a recording captures its address). Either way
  // endStep() follows. `owner` names the caller's buffers and KV cache (a
  // recording holds their addresses): callers sharing a backend never replay
  // each other's recordings.
  virtual bool replayStep(uint64_t owner) { return false; }
  // Ends the step replayStep() began. A recording in progress is kept and
  // launched when `completed`, or discarded (a kernel call threw).
  virtual void endStep(bool completed) {}
  // Memory a recording refers to was released (a scratch buffer grew):
  // recordings made so far are dropped.
  virtual void forgetRecordings() {}

  // --- Host memory the backend copies to and from often ---
  // Page-locks `bytes` of host memory at `host` so copies with this backend
  // run at full speed and truly asynchronously (CUDA: cudaHostRegister).
  // False when there is nothing to pin (host-memory backends) or pinning
  // failed; copies work either way. unpinHost() before the memory is freed.
  virtual bool pinHost(void* host, size_t bytes) { return false; }
  virtual void unpinHost(void* host) {}

  // --- KV blocks to and from host memory (staging for transfers) ---
  // host_dst receives blocks[0], blocks[1], ... back to back (block_bytes each).
  virtual void readBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                          void* host_dst) = 0;
  virtual void writeBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                           const void* host_src) = 0;
};

// --- Registry (kernels/registry.cpp: the one place that knows CUDA exists) ---

// The CUDA bf16 prefill GEMM's configurations (BackendOptions::
// bf16_gemm_config): the pipelined mma.sync kernel's K step and depth
// (0 .. kBf16GemmWgmma - 1), its wgmma twins (sm_90a; 6 and 7 fed by tensor
// copies), then the wide mma.sync kernel (kBf16GemmWide on: row-grouped
// tile order, fragments loaded a slice ahead; 9 with 128 x 256 tiles). The
// same mma chain, so the same bits, in each (an H200 compared 0-5:
// docs/cuda.md); kBf16GemmServing, the fastest there, is the one that
// serves.
inline constexpr int kBf16GemmConfigs = 10;
inline constexpr int kBf16GemmWgmma = 4;
inline constexpr int kBf16GemmWide = 8;
inline constexpr int kBf16GemmServing = 1;
inline constexpr const char* kBf16GemmConfigShapes[kBf16GemmConfigs] = {
    "K step 32, 3 stages",
    "K step 64, 3 stages",
    "K step 64, 4 stages",
    "K step 32, 4 stages",
    "wgmma 128 x 128, K step 64",
    "wgmma 128 x 256, K step 64, overlapped",
    "wgmma 128 x 256, tensor copies, 4 stages, producer warpgroup",
    "wgmma 128 x 256, tensor copies, persistent (a block per SM)",
    "K step 64, 3 stages, row-grouped tiles, fragments a slice ahead",
    "128 x 256 (64 x 64 a warp), K step 64, 3 stages, row-grouped, fragments ahead"};
// Configurations 4 to 7 run wgmma (HGMMA), the others mma.sync (HMMA).
constexpr bool bf16GemmIsWgmma(int config) {
  return config >= kBf16GemmWgmma && config < kBf16GemmWide;
}

// True when this build has the CUDA backend.
bool cudaBuilt();
// CUDA devices visible now; 0 without the CUDA backend or a driver.
int cudaDeviceCount();
// Parses --device: "cpu", "cuda" or "auto" (CUDA when a device is present).
// Throws tandem::Error naming the accepted values, or why "cuda" cannot be had
// (not built with CUDA; no device).
DeviceKind resolveDevice(const std::string& flag);
// Which kernels the CUDA backend runs (--cuda-kernels, docs/cuda.md#kernel-sets):
// kReference, the plain kernels the fast ones are checked against; kFast
// adds the decode GEMV over re-laid weights, grouped attention and the bf16
// tensor-core GEMMs (needed for --compute-dtype bf16 on CUDA). f32 results
// are the same bits either way (docs/cuda.md#kernel-sets). kFlash is kFast
// with tensor-core (flash-style) attention over bf16 caches: its own bits
// (part of the model identity), the same invariance; the default on CUDA
// since it passed the gpu tests on an H200.
enum class CudaKernels { kReference, kFast, kFlash };
// Parses --cuda-kernels for a backend of `kind`: "auto" (the flags'
// default: kFlash on CUDA, kReference, which runs nothing, on the CPU),
// "reference", "fast" or "flash" (an explicit "fast" or "flash" with the CPU
// is then refused by makeBackend). Throws tandem::Error naming `flag` and
// the accepted values.
CudaKernels resolveCudaKernels(const std::string& text, const std::string& flag, DeviceKind kind);
// What makeBackend builds beyond the device kind.
struct BackendOptions {
  CudaKernels cuda_kernels = CudaKernels::kReference;
  // CUDA fast kernels only; tandem-bench's measure of what batch invariance
  // costs, never serving: CudaBackendOptions::unordered_decode.
  bool unordered_decode = false;
  // CUDA fast kernels: CudaBackendOptions::deep_skinny (the same bits).
  bool deep_skinny = false;
  // CUDA flash kernels: CudaBackendOptions::compact_attention (a block per
  // query tile through a run of splits; the same bits).
  bool compact_attention = false;
  // CUDA flash kernels: CudaBackendOptions::deep_attention (the same bits).
  bool deep_attention = false;
  // Fewer launches per decode layer where the CUDA fast kernels run (the
  // agent's --fuse-projections), the same bits
  // (CudaBackendOptions::fused_launches); nothing elsewhere.
  bool fused_launches = false;
  // CUDA: Backend::applyRopeWith's kernel (CudaBackendOptions::
  // rope_variants).
  bool rope_variants = true;
  // The bf16 prefill GEMM's configuration: CudaBackendOptions::
  // bf16_gemm_config, one of kBf16GemmConfigs below; the others for
  // measuring (tandem-bench engine --bf16-gemm-configs).
  int bf16_gemm_config = kBf16GemmServing;
};

// Throws tandem::Error when the backend cannot be created, and when
// `cuda_kernels` is kFast or kFlash for a backend other than CUDA (the CPU
// has none).
std::unique_ptr<Backend> makeBackend(DeviceKind kind, const BackendOptions& options = {});
// Parses a compute dtype flag ("f32" or "bf16", see Backend::setComputeDType);
// throws tandem::Error naming `flag` and the accepted values.
DType parseComputeDType(const std::string& text, const std::string& flag);
// The agent's --compute-dtype: "auto" (its default) is bf16 where the CUDA
// backend runs its tensor-core kernels (any set but kReference), f32
// elsewhere (the CPU, whose bf16 compute is opt-in); otherwise as
// parseComputeDType (docs/cuda.md#default-compute-dtype).
DType resolveComputeDType(const std::string& text, const std::string& flag, DeviceKind kind,
                          CudaKernels cuda_kernels);
// The agent's --fuse-projections: "auto" (its default) is on where the CUDA
// backend runs (its fused launches and epilogues: the same bits, fewer
// launches), off on the CPU (it changes little there, and the stacked copy
// replaces weights agents on one machine share through the page cache;
// docs/configuration.md); "true" or "false" as given. Throws tandem::Error
// naming `flag` and the accepted values.
bool resolveFuseProjections(const std::string& text, const std::string& flag, DeviceKind kind);

}  // namespace tandem::kernels
