// CudaBackend: the Backend of kernels/backend.h on one CUDA device.
//
// Everything is issued on one stream in call order. Memory comes from
// cudaMalloc (256-byte aligned) and is zeroed on the stream before use.
// Weights are uploaded once per host pointer and kept until destruction.
// beginBatch() packs the batch (ids, positions, per-row KV slots, last rows,
// block tables) into one pinned staging buffer and uploads it with a single
// copy into a device buffer that grows on demand; the staging buffer is only
// rewritten after the previous upload has completed. The kernels are in
// elementwise.cu, norm_rope.cu, matmul.cu and attention.cu; with the fast
// kernels (CudaBackendOptions::fast_kernels) also gemv_fast.cu, over a
// re-laid copy of each matmul weight kept beside the row-major one, and
// matmul_bf16_mma.cu for bf16 compute. With fused launches
// (CudaBackendOptions::fused_launches) the backend hands a decode matmul
// the bf16 fragments of x that x's producer wrote (fragmentsFor, produced,
// readyFragments) and the fast GEMV folds in its partial kernel.
//
// Decode steps are recorded as CUDA graphs, one per (owner: the runner whose
// buffers and KV cache they use, bucket of sequences, bucket of attention
// splits). A graph keeps the addresses and launch shapes
// of its kernels, so everything it refers to must be where it was:
//  - the packed batch has the same offsets for the same rows and sequences,
//    and its device buffer only moves when it grows, which drops the graphs;
//  - attention is launched over a power-of-two number of 256-position splits
//    (splits past a row's position exit at once and are never merged), so
//    one graph serves every context length up to its bucket;
//  - scratch buffers (the attention's here, the caller's through
//    forgetRecordings()) drop the graphs when they grow;
//  - a shape is recorded the second time it is seen: the first run grows
//    every buffer to its size, so nothing is allocated while capturing.
// A replayed step runs the same kernels with the same arguments on the same
// memory as an unrecorded one, so its results are the same bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/weight_layout.h"

namespace tandem::kernels::cuda {
namespace {

void throwIfFailed(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  throw Error(std::string("CUDA ") + what + ": " + cudaGetErrorName(error) + " (" +
              cudaGetErrorString(error) + ")");
}

size_t alignUp(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options)
      : device_(device),
        fast_kernels_(options.fast_kernels),
        flash_attention_(options.fast_kernels && options.flash_attention),
        unordered_decode_(options.fast_kernels && options.unordered_decode),
        deep_skinny_(options.fast_kernels && options.deep_skinny),
        compact_attention_(options.fast_kernels && options.flash_attention &&
                           options.compact_attention),
        deep_attention_(options.fast_kernels && options.flash_attention && options.deep_attention),
        fused_launches_(options.fast_kernels && options.fused_launches),
        rope_variants_(options.rope_variants),
        bf16_gemm_config_(options.bf16_gemm_config),
        gemv_scratch_cap_floats_(static_cast<int64_t>(options.gemv_scratch_bytes / sizeof(float))) {
    if (bf16_gemm_config_ < 0 || bf16_gemm_config_ >= kBf16GemmConfigs) {
      throw Error("bf16 GEMM configuration " + std::to_string(bf16_gemm_config_) +
                  " does not exist (accepted: 0.." + std::to_string(kBf16GemmConfigs - 1) + ")");
    }
    throwIfFailed(cudaSetDevice(device_), "cudaSetDevice");
    throwIfFailed(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    throwIfFailed(cudaEventCreateWithFlags(&batch_uploaded_, cudaEventDisableTiming),
                  "cudaEventCreate");
    cudaDeviceProp props{};
    throwIfFailed(cudaGetDeviceProperties(&props, device_), "cudaGetDeviceProperties");
    char text[320];
    std::snprintf(text, sizeof text, "%s (sm_%d%d, %.1f GiB)", props.name, props.major, props.minor,
                  static_cast<double>(props.totalGlobalMem) / (1024.0 * 1024 * 1024));
    description_ = text;
    if (bf16GemmIsWgmma(bf16_gemm_config_)) {
      const std::string which =
          "bf16 GEMM configuration " + std::to_string(bf16_gemm_config_) + " (wgmma)";
      if (!bf16WgmmaBuilt()) {
        throw Error(which +
                    " is not in this build: its kernel is compiled for sm_90a only when "
                    "CMAKE_CUDA_ARCHITECTURES includes 90");
      }
      if (props.major != 9 || props.minor != 0) {
        throw Error(which + " needs a compute capability 9.0 GPU (H100, H200); device " +
                    std::to_string(device_) + " is sm_" + std::to_string(props.major) +
                    std::to_string(props.minor));
      }
    }
    if (fast_kernels_)
      description_ += flash_attention_ ? ", fast kernels, flash attention" : ", fast kernels";
    if (fused_launches_) description_ += ", fused launches";
    if (bf16_gemm_config_ != kBf16GemmServing) {
      description_ += ", bf16 GEMM configuration " + std::to_string(bf16_gemm_config_);
      if (bf16GemmIsWgmma(bf16_gemm_config_)) description_ += " (wgmma)";
    }
    if (unordered_decode_) description_ += ", unordered decode matmuls (not batch-invariant)";
    if (deep_skinny_) description_ += ", deep decode loads";
    if (compact_attention_) description_ += ", compact attention grid";
    if (deep_attention_) {
      // At head_dim 128, the largest the flash kernel serves.
      const size_t needed = flashWholeSplitSharedBytes(128);
      if (props.sharedMemPerBlockOptin < needed) {
        throw Error("deep attention loads need " + std::to_string(needed) +
                    " bytes of shared memory per block; device " + std::to_string(device_) +
                    " offers " + std::to_string(props.sharedMemPerBlockOptin));
      }
      description_ += ", deep attention loads";
    }
    sm_count_ = props.multiProcessorCount;
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    dropGraphs();
    for (auto& [key, copy] : resident_) cudaFree(copy.data);
    for (auto& [key, data] : relaid_) cudaFree(data);
    for (auto& [key, data] : mma_twins_) cudaFree(data);
    for (auto& [k, buffers] : next_fragments_) {
      for (void* data : buffers.data) cudaFree(data);
    }
    cudaFree(arrivals_);
    cudaFree(gemv_scratch_);
    cudaFree(batch_device_);
    cudaFree(scratch_);
    cudaFree(argmax_out_);
    cudaFreeHost(staging_);
    cudaEventDestroy(batch_uploaded_);
    cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string description() const override {
    return compute_ == DType::kBF16 ? description_ + ", bf16 compute" : description_;
  }
  bool hostAccessible() const override { return false; }

  void* allocate(size_t bytes) override {
    activate();
    void* data = nullptr;
    if (cudaMalloc(&data, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();  // clear the allocation failure; it is reported as nullptr
      return nullptr;
    }
    throwIfFailed(cudaMemsetAsync(data, 0, bytes, stream_), "cudaMemsetAsync");
    return data;
  }

  void release(void* data, size_t bytes) override {
    if (data == nullptr) return;
    activate();
    throwIfFailed(cudaFree(data), "cudaFree");
  }

  void copyFromHost(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    // Synchronous: the host buffer may be reused as soon as this returns.
    throwIfFailed(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
                  "cudaMemcpyAsync to device");
    throwIfFailed(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void copyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    throwIfFailed(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                  "cudaMemcpyAsync to host");
    throwIfFailed(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    throwIfFailed(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                  "cudaMemcpyAsync on device");
  }

  // One strided copy (a memcpy node in a recorded step), no kernel.
  void copyColumns(const float* src, int64_t rows, int64_t src_width, int64_t first, int64_t width,
                   float* dst) override {
    if (rows == 0 || width == 0) return;
    activate();
    throwIfFailed(cudaMemcpy2DAsync(dst, static_cast<size_t>(width) * sizeof(float), src + first,
                                    static_cast<size_t>(src_width) * sizeof(float),
                                    static_cast<size_t>(width) * sizeof(float),
                                    static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_),
                  "cudaMemcpy2DAsync on device");
  }

  void synchronize() override {
    activate();
    throwIfFailed(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  WeightView residentWeight(const WeightView& host) override {
    WeightView view = host;
    view.data =
        upload(host.data, static_cast<size_t>(host.rows * host.cols) * dtypeSize(host.dtype));
    return view;
  }

  const float* residentFloats(const float* host, size_t count) override {
    return static_cast<const float*>(upload(host, count * sizeof(float)));
  }

  // The row-major resident view, as residentWeight(). With the fast kernels
  // every matrix also gets a copy re-laid by weight_layout.h, found again by
  // the resident copy's address: in mma fragment order for bf16 weights under
  // bf16 compute (the decode tensor-core kernel; prefill reads the row-major
  // copy), in GEMV tiles otherwise (the fast GEMV).
  WeightView matmulWeight(const WeightView& host) override {
    WeightView view = residentWeight(host);
    if (!fast_kernels_ || host.layout != WeightLayout::kRows) return view;
    // The twin for the kernel that will read it: mma B fragments in order
    // for the bf16 decode kernel, GEMV tiles for the fast GEMV.
    const bool mma = usesBf16Mma(view);
    auto& twins = mma ? mma_twins_ : relaid_;
    if (twins.count(view.data) != 0) return view;
    const std::vector<uint8_t> bytes =
        mma ? relayoutForMma(host.data, host.rows, host.cols)
            : relayoutForGemv(host.data, host.rows, host.cols,
                              static_cast<int64_t>(dtypeSize(host.dtype)));
    activate();
    void* data = nullptr;
    throwIfFailed(cudaMalloc(&data, bytes.size()), "cudaMalloc for re-laid weights");
    twins.emplace(view.data, data);
    copyFromHost(data, bytes.data(), bytes.size());
    return view;
  }

  // The last use frees the copy and its re-laid twin. cudaFree waits for the
  // kernels in flight; the caller forgot the recordings that read it.
  void releaseWeight(const WeightView& host) override {
    if (capturing_) throw Error("a weight was released while recording a decode step");
    auto it = resident_.find(std::make_pair(host.data, viewBytes(host)));
    if (it == resident_.end() || --it->second.uses > 0) return;
    activate();
    for (auto* twins : {&relaid_, &mma_twins_}) {
      if (auto twin = twins->find(it->second.data); twin != twins->end()) {
        throwIfFailed(cudaFree(twin->second), "cudaFree");
        twins->erase(twin);
      }
    }
    throwIfFailed(cudaFree(it->second.data), "cudaFree");
    resident_.erase(it);
  }

  // f32 always; bf16 only with the fast kernels, whose tensor-core GEMM is
  // the one that multiplies bf16.
  void setComputeDType(DType dtype) override {
    if (dtype == DType::kF32 || (dtype == DType::kBF16 && fast_kernels_)) {
      compute_ = dtype;
      return;
    }
    if (dtype == DType::kBF16) {
      throw Error(
          "compute dtype bf16 on the cuda backend needs its fast kernels (--cuda-kernels auto "
          "or fast): the reference kernels multiply in f32 only (accepted here: f32)");
    }
    throw Error(std::string("compute dtype ") + dtypeShortName(dtype) +
                " is not supported by cuda (accepted: f32; bf16 with --cuda-kernels fast)");
  }

  void beginBatch(const BatchLayout& batch) override;

  void embedding(const WeightView& table, float* out) override {
    for (int64_t r = 0; r < batch_.rows; ++r) {
      TANDEM_CHECK(host_token_ids_[r] >= 0 && host_token_ids_[r] < table.rows,
                   "embedding: id out of range");
    }
    activate();
    launchEmbedding(stream_, table, batch_, out);
    checkLaunch("embedding");
  }

  void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y) override {
    activate();
    if (fastMatmul(x, m, k, w, MatmulEpilogue::store(y))) return;
    launchMatmul(stream_, x, m, k, w, y);
    checkLaunch("matmul");
  }

  // The fused steps (backend.h) run in the fast kernels' epilogues
  // (epilogue.h); where the reference matmul runs instead, its result goes
  // to scratch and one epilogue kernel follows. The reference kernel set
  // keeps the base class's sequences.
  void matmulAdd(const float* x, int64_t m, int64_t k, const WeightView& w, float* y,
                 float* scratch) override {
    if (!fast_kernels_) return Backend::matmulAdd(x, m, k, w, y, scratch);
    MatmulEpilogue out;
    out.kind = MatmulEpilogue::kAdd;
    out.y = y;
    matmulThrough(x, m, k, w, out, scratch);
  }

  void matmulSplit(const float* x, int64_t m, int64_t k, const WeightView& w,
                   const SplitOutputs& parts, float* scratch) override {
    if (!fast_kernels_ || parts.count > MatmulEpilogue::kMaxParts) {
      return Backend::matmulSplit(x, m, k, w, parts, scratch);
    }
    MatmulEpilogue out;
    out.kind = MatmulEpilogue::kSplit;
    int64_t columns = 0;
    for (int i = 0; i < parts.count; ++i) {
      out.parts[i] = parts.parts[i];
      out.widths[i] = parts.widths[i];
      columns += parts.widths[i];
    }
    TANDEM_CHECK(columns == w.rows, "matmulSplit: the parts' widths must add up to the outputs");
    matmulThrough(x, m, k, w, out, scratch);
  }

  // The fast kernels store each lane's outputs in pairs of columns (2j, 2j +
  // 1): gate row j and up row j, or the two rows of a RoPE pair, side by
  // side meet in one thread.
  StackedLayout stackedLayout() const override {
    return fast_kernels_ ? StackedLayout::kPairs : StackedLayout::kPlain;
  }

  void matmulSiluMul(const float* x, int64_t m, int64_t k, const WeightView& gate_up, float* out,
                     float* scratch, float* up_scratch) override {
    if (!fast_kernels_) {
      return Backend::matmulSiluMul(x, m, k, gate_up, out, scratch, up_scratch);
    }
    TANDEM_CHECK(gate_up.rows % 2 == 0, "matmulSiluMul: gate/up must have an even row count");
    MatmulEpilogue epilogue;
    epilogue.kind = MatmulEpilogue::kSiluPairs;
    epilogue.y = out;
    matmulThrough(x, m, k, gate_up, epilogue, scratch);
  }

  // RoPE pairs (i, i + head_dim / 2) side by side in q and k: one lane
  // rotates its pair and stores q, or k and v into the cache (k and v, the
  // scratch of the base sequence, stay unwritten).
  void matmulQkvRope(const float* x, int64_t m, int64_t k, const WeightView& qkv, const QkvRope& a,
                     const KvCacheLayout& cache, float* scratch) override {
    if (!fast_kernels_) return Backend::matmulQkvRope(x, m, k, qkv, a, cache, scratch);
    checkCache(cache, a.layer);
    TANDEM_CHECK(m == batch_.rows, "matmulQkvRope: m must be the batch's rows");
    TANDEM_CHECK(
        a.head_dim % 2 == 0 && a.head_dim == cache.head_dim && a.num_kv_heads == cache.num_kv_heads,
        "matmulQkvRope: heads must match the cache's, with an even head_dim");
    MatmulEpilogue out;
    out.kind = MatmulEpilogue::kQkvRope;
    out.y = a.q;
    QkvRopeEpilogue& e = out.qkv;
    e.q_width = a.num_heads * a.head_dim;
    e.kv_width = a.num_kv_heads * a.head_dim;
    e.head_dim = a.head_dim;
    e.q_bias = a.q_bias;
    e.k_bias = a.k_bias;
    e.v_bias = a.v_bias;
    e.inv_freq = a.inv_freq;
    e.positions = batch_.positions;
    e.row_kv = batch_.row_kv;
    e.block_tables = batch_.block_tables;
    e.cache = geometryOf(cache, a.layer);
    TANDEM_CHECK(qkv.rows == e.q_width + 2 * e.kv_width,
                 "matmulQkvRope: the matrix must stack q, k and v");
    matmulThrough(x, m, k, qkv, out, scratch);
  }

  void rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
               float* y) override {
    activate();
    const NextFragments next = fragmentsFor(rows, dim);
    launchRmsNorm(stream_, x, weight, rows, dim, eps, y, next);
    checkLaunch("rmsNorm");
    if (next.data != nullptr) produced(y, rows, dim, next);
  }

  void addBias(float* y, const float* bias, int64_t rows, int64_t width) override {
    activate();
    launchAddBias(stream_, y, bias, rows, width);
    checkLaunch("addBias");
  }

  void applyRope(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq) override {
    TANDEM_CHECK(head_dim % 2 == 0, "applyRope: head_dim must be even");
    activate();
    launchApplyRope(stream_, batch_, x, num_heads, head_dim, inv_freq);
    checkLaunch("applyRope");
  }

  bool appliesRopeVariants() const override { return rope_variants_; }

  void applyRopeWith(float* x, int64_t num_heads, int64_t head_dim, const float* inv_freq,
                     const RopeVariant& variant) override {
    if (!rope_variants_) {
      Backend::applyRopeWith(x, num_heads, head_dim, inv_freq, variant);
      return;
    }
    const int64_t rotary_dim = variant.rotary_dim > 0 ? variant.rotary_dim : head_dim;
    TANDEM_CHECK(rotary_dim % 2 == 0 && rotary_dim <= head_dim,
                 "applyRopeWith: the rotary dims must be even and at most head_dim");
    activate();
    launchApplyRopeWith(stream_, batch_, x, num_heads, head_dim, inv_freq, rotary_dim,
                        variant.attention_factor, variant.interleaved);
    checkLaunch("applyRopeWith");
  }

  void siluMul(const float* gate, const float* up, float* out, int64_t n) override {
    activate();
    launchSiluMul(stream_, gate, up, out, n);
    checkLaunch("siluMul");
  }

  void addInPlace(float* y, const float* x, int64_t n) override {
    activate();
    launchAddInPlace(stream_, y, x, n);
    checkLaunch("addInPlace");
  }

  void writeKv(const KvCacheLayout& cache, int32_t layer, const float* k, const float* v) override {
    checkCache(cache, layer);
    activate();
    launchWriteKv(stream_, batch_, cache, layer, k, v);
    checkLaunch("writeKv");
  }

  void pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q, int64_t num_heads,
                      float scale, float* out) override {
    checkCache(cache, layer);
    activate();
    growBuffer(scratch_, scratch_floats_, attentionScratchFloats(batch_, num_heads, cache.head_dim),
               "attention scratch");
    const NextFragments next = fragmentsFor(batch_.rows, num_heads * cache.head_dim);
    launchPagedAttention(stream_, batch_, cache, layer, q, num_heads, scale, scratch_, out,
                         flash_attention_ ? AttentionKernel::kFlash
                         : fast_kernels_  ? AttentionKernel::kGrouped
                                          : AttentionKernel::kReference,
                         next);
    checkLaunch("pagedAttention");
    if (next.data != nullptr) produced(out, batch_.rows, num_heads * cache.head_dim, next);
  }

  void gatherLastRows(const float* x, int64_t width, float* out) override {
    activate();
    launchGatherLastRows(stream_, batch_, x, width, out);
    checkLaunch("gatherLastRows");
  }

  void argmaxRows(const float* x, int64_t rows, int64_t width, int32_t* host_out) override {
    if (rows <= 0) return;
    TANDEM_CHECK(width > 0 && width <= INT32_MAX, "argmaxRows: width out of range");
    activate();
    if (static_cast<size_t>(rows) > argmax_capacity_) {
      throwIfFailed(cudaFree(argmax_out_), "cudaFree");
      argmax_out_ = nullptr;
      argmax_capacity_ = 0;
      throwIfFailed(cudaMalloc(&argmax_out_, static_cast<size_t>(rows) * sizeof(int32_t)),
                    "cudaMalloc argmax");
      argmax_capacity_ = static_cast<size_t>(rows);
    }
    launchArgmax(stream_, x, rows, width, argmax_out_);
    checkLaunch("argmax");
    copyToHost(host_out, argmax_out_, static_cast<size_t>(rows) * sizeof(int32_t));
  }

  int64_t decodeBucket(int64_t sequences) const override { return bucketOf(sequences); }

  bool replayStep(uint64_t owner) override {
    activate();
    if (!step_recordable_) return false;
    const GraphKey key{owner, batch_.rows, batch_.attention_splits};
    if (auto it = graphs_.find(key); it != graphs_.end()) {
      throwIfFailed(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
      return true;
    }
    if (seen_.insert(key).second) return false;  // first sight: run plainly
    throwIfFailed(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                  "cudaStreamBeginCapture");
    capturing_ = true;
    capture_key_ = key;
    return false;
  }

  void endStep(bool completed) override {
    if (!capturing_) return;
    activate();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!completed) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();  // the step's own error is the one to report
      return;
    }
    throwIfFailed(ended, "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    throwIfFailed(made, "cudaGraphInstantiate");
    graphs_.emplace(capture_key_, exec);
    // Capturing only recorded the kernels; this runs them.
    throwIfFailed(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
  }

  void forgetRecordings() override {
    TANDEM_CHECK(!capturing_, "a buffer was released while a decode step was being recorded");
    dropGraphs();
  }

  bool pinHost(void* host, size_t bytes) override {
    activate();
    if (cudaHostRegister(host, bytes, cudaHostRegisterPortable) != cudaSuccess) {
      cudaGetLastError();  // unpinned memory still copies, more slowly
      return false;
    }
    return true;
  }

  void unpinHost(void* host) override {
    activate();
    if (cudaHostUnregister(host) != cudaSuccess) cudaGetLastError();
  }

  void readBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                  void* host_dst) override {
    activate();
    const int64_t block_bytes = cache.blockBytes();
    for (int64_t i = 0; i < count; ++i) {
      TANDEM_CHECK(host_blocks[i] >= 0 && host_blocks[i] < cache.num_blocks,
                   "readBlocks: block id out of range");
      throwIfFailed(
          cudaMemcpyAsync(
              static_cast<char*>(host_dst) + i * block_bytes,
              static_cast<const char*>(cache.base) + int64_t{host_blocks[i]} * block_bytes,
              static_cast<size_t>(block_bytes), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync KV block to host");
    }
    throwIfFailed(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void writeBlocks(const KvCacheLayout& cache, const int32_t* host_blocks, int64_t count,
                   const void* host_src) override {
    activate();
    const int64_t block_bytes = cache.blockBytes();
    for (int64_t i = 0; i < count; ++i) {
      TANDEM_CHECK(host_blocks[i] >= 0 && host_blocks[i] < cache.num_blocks,
                   "writeBlocks: block id out of range");
      throwIfFailed(
          cudaMemcpyAsync(static_cast<char*>(cache.base) + int64_t{host_blocks[i]} * block_bytes,
                          static_cast<const char*>(host_src) + i * block_bytes,
                          static_cast<size_t>(block_bytes), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync KV block to device");
    }
    throwIfFailed(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  // The CUDA runtime's current device is per host thread, and the backend may
  // be driven from different threads (one at a time). Every call that
  // issues work activates first, once: `calls_` counts them.
  void activate() {
    ++calls_;
    throwIfFailed(cudaSetDevice(device_), "cudaSetDevice");
  }

  // --- Fused launches: x's fragments written by x's producer ---
  // Where the producer of an m x k matrix writes it as a bf16 decode
  // matmul's x fragments (nothing without fused launches and bf16 compute,
  // or for more rows than the skinny kernel takes). Two zeroed buffers per
  // k, for 64 rows each, taken in turn, so a matmul whose epilogue writes
  // the next x never writes the buffer it reads; a producer writes real
  // elements only, so k's padding stays zero.
  NextFragments fragmentsFor(int64_t m, int64_t k) {
    if (!fused_launches_ || compute_ != DType::kBF16 || m < 1 || m > kBf16MmaSkinnyRows || k < 1) {
      return {};
    }
    FragmentBuffers& buffers = next_fragments_[k];
    if (buffers.data[0] == nullptr) {
      // Both at once: a recording may take the one a plain run did not.
      if (capturing_) throw Error("x fragment buffers made while recording a decode step");
      const auto bytes = static_cast<size_t>(MmaFragmentTiling{kBf16MmaSkinnyRows, k}.bytes());
      for (void*& buffer : buffers.data) {
        throwIfFailed(cudaMalloc(&buffer, bytes), "cudaMalloc x fragments");
        throwIfFailed(cudaMemsetAsync(buffer, 0, bytes, stream_), "cudaMemsetAsync x fragments");
      }
    }
    buffers.next ^= 1;
    return {static_cast<uint16_t*>(buffers.data[buffers.next]), k};
  }
  // The call that just issued its kernel wrote x (m x k) and its fragments.
  void produced(const float* x, int64_t m, int64_t k, const NextFragments& fragments) {
    produced_ = {x, m, k, calls_, fragments.data};
  }
  // x's fragments, when they were written by the call before this one (or
  // by it and read by the matmuls since, which leave x as it is); nullptr
  // when they must be made from x.
  void* readyFragments(const float* x, int64_t m, int64_t k) {
    if (produced_.x != x || produced_.m != m || produced_.k != k || produced_.call + 1 != calls_) {
      return nullptr;
    }
    produced_.call = calls_;
    return produced_.fragments;
  }
  // The fused GEMV fold's arrival counters: `groups` of them, zero.
  unsigned int* arrivalsFor(int64_t groups) {
    if (!fused_launches_) return nullptr;
    growBuffer(arrivals_, arrivals_count_, groups, "GEMV arrival counters", /*zero=*/true);
    return arrivals_;
  }

  void checkLaunch(const char* kernel) { throwIfFailed(cudaGetLastError(), kernel); }

  // bf16 compute multiplies bf16 row-major weights on the tensor cores, for
  // every m (a row's bits must not depend on the batch).
  bool usesBf16Mma(const WeightView& w) const {
    return compute_ == DType::kBF16 && w.dtype == DType::kBF16 && w.layout == WeightLayout::kRows;
  }

  // A fast kernel for this matmul, when there is one, storing through
  // `out`; false when none applies (the reference kernel's case). The
  // caller activated the device.
  bool fastMatmul(const float* x, int64_t m, int64_t k, const WeightView& w,
                  const MatmulEpilogue& out) {
    if (!fast_kernels_) return false;
    if (usesBf16Mma(w) && m <= kBf16MmaSkinnyRows) {
      if (auto it = mma_twins_.find(w.data); it != mma_twins_.end()) {
        // x's fragments as its producer wrote them, or made in the GEMV
        // scratch (one stream: no other matmul is using it).
        void* ready = readyFragments(x, m, k);
        growGemvScratch((bf16MmaSkinnyScratchBytes(m, k) + 3) / 4);
        if (unordered_decode_ &&
            (out.kind == MatmulEpilogue::kStore || out.kind == MatmulEpilogue::kAdd)) {
          launchBf16MmaSkinnyUnordered(stream_, x, m, k, it->second, w.rows, out, gemv_scratch_,
                                       sm_count_);
          checkLaunch("matmul (bf16 tensor cores, decode, unordered)");
          return true;
        }
        // SiLU·up's outputs are the down projection's x: written as its
        // fragments too (never into the buffer being read: fragmentsFor).
        MatmulEpilogue epilogue = out;
        const int64_t inter = w.rows / 2;
        if (out.kind == MatmulEpilogue::kSiluPairs) epilogue.next = fragmentsFor(m, inter);
        launchBf16MmaSkinny(stream_, x, m, k, it->second, w.rows, epilogue,
                            ready != nullptr ? ready : gemv_scratch_, ready != nullptr,
                            deep_skinny_);
        checkLaunch("matmul (bf16 tensor cores, decode)");
        if (epilogue.next.data != nullptr) produced(out.y, m, inter, epilogue.next);
        return true;
      }
    }
    if (usesBf16Mma(w)) {
      // x rounded to bf16 goes to the GEMV scratch (never in use by another
      // matmul: one stream); only above the decode buckets' row counts.
      const int64_t elements = bf16MmaScratchElements(m, k);
      growGemvScratch((elements + 1) / 2);
      launchBf16MmaMatmul(stream_, x, m, k, w, out,
                          elements > 0 ? reinterpret_cast<uint16_t*>(gemv_scratch_) : nullptr,
                          bf16_gemm_config_, sm_count_);
      checkLaunch("matmul (bf16 tensor cores)");
      return true;
    }
    if (m <= kGemvMaxRows && w.layout == WeightLayout::kRows) {
      if (auto it = relaid_.find(w.data); it != relaid_.end()) {
        WeightView relaid = w;
        relaid.data = it->second;
        const int64_t floats = fastGemvScratchFloats(m, k, relaid, gemv_scratch_cap_floats_);
        growGemvScratch(floats);
        unsigned int* arrivals = arrivalsFor(fastGemvGroups(k, relaid));
        launchFastGemv(stream_, x, m, k, relaid, out, gemv_scratch_, floats, sm_count_, arrivals);
        checkLaunch("matmul (fast GEMV)");
        return true;
      }
    }
    return false;
  }

  // matmul with the epilogue `out`: in a fast kernel, or the reference
  // kernel into scratch (m x w.rows floats) and the epilogue kernel.
  void matmulThrough(const float* x, int64_t m, int64_t k, const WeightView& w,
                     const MatmulEpilogue& out, float* scratch) {
    // The fast kernels store outputs while other blocks still read x.
    auto overlaps = [&](const float* y, int64_t count) {
      return y != nullptr && y < x + m * k && x < y + count;
    };
    TANDEM_CHECK(!overlaps(out.y, m * (out.kind == MatmulEpilogue::kSiluPairs ? w.rows / 2
                                       : out.kind == MatmulEpilogue::kQkvRope ? out.qkv.q_width
                                                                              : w.rows)) &&
                     !overlaps(out.parts[0], m * out.widths[0]) &&
                     !overlaps(out.parts[1], m * out.widths[1]) &&
                     !overlaps(out.parts[2], m * out.widths[2]),
                 "fused matmul: the outputs must not overlap x");
    activate();
    if (fastMatmul(x, m, k, w, out)) return;
    launchMatmul(stream_, x, m, k, w, scratch);
    checkLaunch("matmul");
    launchMatmulEpilogue(stream_, scratch, m, w.rows, out);
    checkLaunch("matmul epilogue");
  }

  void growGemvScratch(int64_t floats) {
    growBuffer(gemv_scratch_, gemv_scratch_floats_, floats, "fast GEMV scratch");
  }

  // A device buffer the recordings refer to (scratch, counters), of `count`
  // elements, made `wanted` long where it is shorter (its contents lost;
  // zeroed when `zero`): growing drops the recordings, which hold its
  // address, and is refused while recording. cudaFree waits for the kernels
  // that may still use the old buffer.
  template <typename T>
  void growBuffer(T*& data, int64_t& count, int64_t wanted, const char* what, bool zero = false) {
    if (wanted <= count) return;
    if (capturing_) throw Error(std::string(what) + " grew while recording a decode step");
    forgetRecordings();
    throwIfFailed(cudaFree(data), "cudaFree");
    data = nullptr;
    count = 0;
    const size_t bytes = static_cast<size_t>(wanted) * sizeof(T);
    throwIfFailed(cudaMalloc(&data, bytes), (std::string("cudaMalloc ") + what).c_str());
    if (zero) {
      throwIfFailed(cudaMemsetAsync(data, 0, bytes, stream_),
                    (std::string("cudaMemsetAsync ") + what).c_str());
    }
    count = wanted;
  }

  // One more use of the device copy of `bytes` of host memory (made now if
  // there is none); releaseWeight() ends it.
  const void* upload(const void* host, size_t bytes) {
    const auto key = std::make_pair(host, bytes);
    if (auto it = resident_.find(key); it != resident_.end()) {
      ++it->second.uses;
      return it->second.data;
    }
    activate();
    void* data = nullptr;
    throwIfFailed(cudaMalloc(&data, std::max<size_t>(bytes, 1)), "cudaMalloc for weights");
    resident_.emplace(key, ResidentCopy{data, 1});
    copyFromHost(data, host, bytes);
    return data;
  }

  // What the CPU backend checks before writeKv/pagedAttention, plus the
  // block ids of every row, which the device kernels cannot report.
  void checkCache(const KvCacheLayout& cache, int32_t layer) const {
    TANDEM_CHECK(cache.dtype == DType::kF32 || cache.dtype == DType::kBF16,
                 "KV cache dtype must be f32 or bf16");
    TANDEM_CHECK(layer >= 0 && layer < cache.num_layers, "KV cache layer out of range");
    TANDEM_CHECK(cache.block_size > 0, "KV cache block_size must be positive");
    for (const RowKv& row : host_row_kv_) {
      if (row.active == 0) continue;
      const int64_t index = row.position / cache.block_size;
      TANDEM_CHECK(index < row.num_blocks,
                   "attention sequence has too few blocks for its positions");
      const int32_t block = host_block_tables_[static_cast<size_t>(row.table_offset + index)];
      TANDEM_CHECK(block >= 0 && block < cache.num_blocks, "block id out of range");
    }
  }

  // Sequences per recorded decode step: 1, 2, 4, 8, then multiples of 8 up
  // to 256 (the sizes vLLM captures); larger batches run unrecorded.
  static int64_t bucketOf(int64_t sequences) {
    if (sequences <= 0 || sequences > kMaxRecordedSequences) return 0;
    if (sequences <= 8) {
      int64_t bucket = 1;
      while (bucket < sequences) bucket *= 2;
      return bucket;
    }
    return (sequences + 7) / 8 * 8;
  }

  void dropGraphs() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
    seen_.clear();
  }

  static constexpr int64_t kMaxRecordedSequences = 256;
  using GraphKey = std::tuple<uint64_t, int64_t, int64_t>;  // (owner, rows, attention splits)

  int device_;
  bool fast_kernels_ = false;
  bool flash_attention_ = false;
  bool unordered_decode_ = false;            // CudaBackendOptions::unordered_decode
  bool deep_skinny_ = false;                 // CudaBackendOptions::deep_skinny
  bool compact_attention_ = false;           // CudaBackendOptions::compact_attention
  bool deep_attention_ = false;              // CudaBackendOptions::deep_attention
  bool fused_launches_ = false;              // CudaBackendOptions::fused_launches
  bool rope_variants_ = false;               // CudaBackendOptions::rope_variants
  int bf16_gemm_config_ = kBf16GemmServing;  // CudaBackendOptions::bf16_gemm_config
  uint64_t calls_ = 0;                       // activate() calls so far
  // The last x written with its fragments (fragmentsFor), and the call
  // that wrote it or last read it.
  struct Produced {
    const float* x = nullptr;
    int64_t m = 0;
    int64_t k = 0;
    uint64_t call = 0;
    void* fragments = nullptr;
  };
  Produced produced_;
  struct FragmentBuffers {
    void* data[2] = {};
    int next = 1;  // the one fragmentsFor gave last
  };
  std::map<int64_t, FragmentBuffers> next_fragments_;  // by k: x fragments for 64 rows
  unsigned int* arrivals_ = nullptr;                   // the fused GEMV fold's counters
  int64_t arrivals_count_ = 0;
  int64_t gemv_scratch_cap_floats_ = 0;
  int sm_count_ = 1;
  DType compute_ = DType::kF32;
  std::string description_;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::set<GraphKey> seen_;
  bool capturing_ = false;
  GraphKey capture_key_{0, 0, 0};
  bool step_recordable_ = false;  // the current batch is a padded decode batch
  cudaStream_t stream_ = nullptr;
  cudaEvent_t batch_uploaded_ = nullptr;
  // Device copies by (host data, bytes), with their uses not yet released.
  struct ResidentCopy {
    void* data = nullptr;
    int64_t uses = 0;
  };
  std::map<std::pair<const void*, size_t>, ResidentCopy> resident_;
  // Resident row-major copy -> its re-laid copy (fast kernels only): for
  // the fast GEMV, and for the bf16 decode kernel (mma fragment order).
  std::unordered_map<const void*, void*> relaid_;
  std::unordered_map<const void*, void*> mma_twins_;
  float* gemv_scratch_ = nullptr;
  int64_t gemv_scratch_floats_ = 0;

  // The current batch: host copies for checks, device view for kernels.
  DeviceBatch batch_;
  std::vector<int32_t> host_token_ids_;
  std::vector<RowKv> host_row_kv_;
  std::vector<int32_t> host_block_tables_;
  char* staging_ = nullptr;  // pinned
  size_t staging_bytes_ = 0;
  void* batch_device_ = nullptr;
  size_t batch_device_bytes_ = 0;
  float* scratch_ = nullptr;  // attention's
  int64_t scratch_floats_ = 0;
  int32_t* argmax_out_ = nullptr;  // argmaxRows' device results
  size_t argmax_capacity_ = 0;
};

void CudaBackend::beginBatch(const BatchLayout& batch) {
  activate();
  const int64_t rows = batch.rows;
  const int64_t num_sequences = batch.num_sequences;
  TANDEM_CHECK(rows >= 0 && num_sequences >= 0, "beginBatch: negative counts");
  TANDEM_CHECK(rows == 0 || (batch.token_ids != nullptr && batch.positions != nullptr),
               "beginBatch: token_ids and positions are required for rows");
  host_token_ids_.assign(batch.token_ids, batch.token_ids + rows);
  host_row_kv_.assign(static_cast<size_t>(rows), RowKv{});
  host_block_tables_.clear();
  std::vector<int64_t> last_rows(static_cast<size_t>(num_sequences), -1);
  TANDEM_CHECK(!capturing_, "beginBatch while a decode step is being recorded");
  int64_t max_position = 0;
  bool one_row_each = rows == num_sequences;
  for (int64_t s = 0; s < num_sequences; ++s) {
    const AttentionSequence& seq = batch.sequences[s];
    TANDEM_CHECK(seq.num_rows >= 0 && seq.first_position >= 0, "attention sequence bounds");
    TANDEM_CHECK(seq.first_row >= 0 && seq.first_row + seq.num_rows <= rows,
                 "attention sequence rows outside the batch");
    const auto table_offset = static_cast<int32_t>(host_block_tables_.size());
    host_block_tables_.insert(host_block_tables_.end(), seq.block_table,
                              seq.block_table + seq.num_blocks);
    if (seq.num_rows > 1) one_row_each = false;
    if (seq.num_rows == 0) continue;
    last_rows[s] = seq.first_row + seq.num_rows - 1;
    for (int64_t r = 0; r < seq.num_rows; ++r) {
      RowKv& row = host_row_kv_[static_cast<size_t>(seq.first_row + r)];
      row.position = seq.first_position + r;
      row.table_offset = table_offset;
      row.num_blocks = seq.num_blocks;
      row.active = 1;
      max_position = std::max(max_position, row.position);
    }
  }

  // A padded decode batch (decodeBucket) may be recorded; its attention runs
  // over a power-of-two number of splits so one recording serves many
  // context lengths. Any other step's flash attention may run a block per
  // query tile (compact_attention), the tiles listed here.
  const bool recordable = one_row_each && bucketOf(num_sequences) == num_sequences;
  const std::vector<FlashTile> tiles = compact_attention_ && !recordable
                                           ? flashTiles(host_row_kv_.data(), rows)
                                           : std::vector<FlashTile>{};

  // Packed layout, every section 16-byte aligned.
  const size_t ids_at = 0;
  const size_t positions_at = alignUp(ids_at + rows * sizeof(int32_t), 16);
  const size_t row_kv_at = alignUp(positions_at + rows * sizeof(int32_t), 16);
  const size_t last_rows_at = alignUp(row_kv_at + rows * sizeof(RowKv), 16);
  const size_t tables_at = alignUp(last_rows_at + num_sequences * sizeof(int64_t), 16);
  const size_t tiles_at = alignUp(tables_at + host_block_tables_.size() * sizeof(int32_t), 16);
  const size_t total =
      std::max<size_t>(alignUp(tiles_at + tiles.size() * sizeof(FlashTile), 16), 16);

  // The staging buffer may still feed the previous batch's upload.
  throwIfFailed(cudaEventSynchronize(batch_uploaded_), "cudaEventSynchronize");
  if (total > staging_bytes_) {
    throwIfFailed(cudaFreeHost(staging_), "cudaFreeHost");
    staging_ = nullptr;
    staging_bytes_ = 0;
    throwIfFailed(cudaMallocHost(&staging_, total * 2), "cudaMallocHost batch staging");
    staging_bytes_ = total * 2;
  }
  if (total > batch_device_bytes_) {
    dropGraphs();  // they read the batch where it was
    // cudaFree waits for kernels that may still read the previous batch.
    throwIfFailed(cudaFree(batch_device_), "cudaFree");
    batch_device_ = nullptr;
    batch_device_bytes_ = 0;
    throwIfFailed(cudaMalloc(&batch_device_, total * 2), "cudaMalloc batch");
    batch_device_bytes_ = total * 2;
  }
  if (rows > 0) {
    std::memcpy(staging_ + ids_at, batch.token_ids, rows * sizeof(int32_t));
    std::memcpy(staging_ + positions_at, batch.positions, rows * sizeof(int32_t));
    std::memcpy(staging_ + row_kv_at, host_row_kv_.data(), rows * sizeof(RowKv));
  }
  if (num_sequences > 0) {
    std::memcpy(staging_ + last_rows_at, last_rows.data(), num_sequences * sizeof(int64_t));
  }
  if (!host_block_tables_.empty()) {
    std::memcpy(staging_ + tables_at, host_block_tables_.data(),
                host_block_tables_.size() * sizeof(int32_t));
  }
  if (!tiles.empty()) {
    std::memcpy(staging_ + tiles_at, tiles.data(), tiles.size() * sizeof(FlashTile));
  }
  throwIfFailed(cudaMemcpyAsync(batch_device_, staging_, total, cudaMemcpyHostToDevice, stream_),
                "cudaMemcpyAsync batch");
  throwIfFailed(cudaEventRecord(batch_uploaded_, stream_), "cudaEventRecord");

  auto* device = static_cast<char*>(batch_device_);
  batch_.token_ids = reinterpret_cast<const int32_t*>(device + ids_at);
  batch_.positions = reinterpret_cast<const int32_t*>(device + positions_at);
  batch_.row_kv = reinterpret_cast<const RowKv*>(device + row_kv_at);
  batch_.last_rows = reinterpret_cast<const int64_t*>(device + last_rows_at);
  batch_.block_tables = reinterpret_cast<const int32_t*>(device + tables_at);
  batch_.rows = rows;
  batch_.num_sequences = num_sequences;
  batch_.max_position = max_position;
  batch_.flash_tiles =
      tiles.empty() ? nullptr : reinterpret_cast<const FlashTile*>(device + tiles_at);
  batch_.flash_tile_count = static_cast<int64_t>(tiles.size());
  batch_.sm_count = sm_count_;
  batch_.flash_whole_splits = deep_attention_ && one_row_each;
  step_recordable_ = recordable;
  const int64_t splits = max_position / kAttentionSplit + 1;
  batch_.attention_splits = splits;
  if (step_recordable_) {
    batch_.attention_splits = 1;
    while (batch_.attention_splits < splits) batch_.attention_splits *= 2;
  }
}

}  // namespace

int deviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> makeCudaBackend(int device, const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("no usable CUDA device: cudaGetDeviceCount: ") +
                cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
  }
  if (device < 0 || device >= count) {
    throw Error("CUDA device " + std::to_string(device) +
                " does not exist: " + std::to_string(count) +
                " CUDA device(s) visible, accepted 0.." + std::to_string(count - 1));
  }
  return std::make_unique<CudaBackend>(device, options);
}

}  // namespace tandem::kernels::cuda
