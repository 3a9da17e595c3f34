// Compute kernels of the engine, CPU implementation behind one interface.
//
// All activations are fp32, row-major. Weights may be f32, bf16, f16, fp8
// (e4m3, with scales) or MXFP4 (GPT-OSS's experts) and are used where they
// lie (memory-mapped from the checkpoint), never copied; only bf16 compute
// packs bf16 weights once, at load (packBf16Pairs).
//
// Batch invariance (the contract every kernel keeps): the result for one row
// depends only on that row's inputs, never on how many rows are in the call,
// where the row sits in the batch, or how many threads run. Reductions run in
// a fixed order chosen from the reduced length alone. Attention for a query
// depends only on the query, its position and the cached K/V of positions
// 0..pos — not on how the sequence was chunked.
//
// The vector ISA (AVX-512, AVX2 or scalar) is picked once at start-up from
// what the CPU supports (TANDEM_KERNEL_ISA=avx512|avx2|scalar overrides it);
// results are reproducible for a given ISA.
//
// Threading: kernels run on a process-wide pool (setNumThreads). Calls from
// several threads at once are serialized; a kernel returns when done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace tandem::kernels {

// The largest head_dim the attention kernels take (CPU and CUDA: a head's
// row is held on the stack or in registers); every released model's is at
// most this.
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// How a weight matrix lies in memory.
enum class WeightLayout {
  kRows,       // row-major, row stride `cols`: the checkpoint's own layout
  kBf16Pairs,  // bf16 packed by packBf16Pairs for bf16 compute
  kMxfp4,      // MXFP4 (GPT-OSS's experts as published): see WeightView
};

// A matrix of `rows` x `cols` elements of `dtype`, laid out as `layout` says.
//
// kF8E4M3 (fp8 checkpoints, docs/quantization.md) also has scales: element
// (r, c) is its fp8 value times scales[(r / scale_rows) * scaleGridCols() +
// c / scale_cols], a grid of blocks of scale_rows x scale_cols elements
// (the last ones cut short): one block for a per-tensor scale, blocks of 1 x
// cols for per-channel scales, 128 x 128 for block-wise ones. Other dtypes
// have none (scales nullptr).
//
// kMxfp4 (OCP Microscaling FP4, docs/quantization.md#mxfp4; dtype kU8, cols
// a multiple of 32): row r's cols / 2 bytes lie at data + r * row_step *
// cols / 2, each byte two FP4 E2M1 values (sign, 2 exponent bits, 1 mantissa
// bit), the low nibble first; the E8M0 exponents of its cols / 32 blocks at
// exponents + r * row_step * cols / 32, block b's values times 2^(e - 127)
// (no exponent is 255, E8M0's NaN). row_step 2 views every other row of a
// stored matrix (GPT-OSS's gate and up rows, interleaved as published).
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  WeightLayout layout = WeightLayout::kRows;
  const float* scales = nullptr;
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;
  const uint8_t* exponents = nullptr;
  int64_t row_step = 1;

  int64_t scaleGridRows() const { return (rows + scale_rows - 1) / scale_rows; }
  int64_t scaleGridCols() const { return (cols + scale_cols - 1) / scale_cols; }
  // Floats of the scale grid (0 without scales).
  int64_t scaleCount() const { return scales == nullptr ? 0 : scaleGridRows() * scaleGridCols(); }
  // The scale of element (row, col).
  float scaleAt(int64_t row, int64_t col) const {
    return scales[(row / scale_rows) * scaleGridCols() + col / scale_cols];
  }
};

// Bytes of a WeightLayout::kRows view's data; of a kMxfp4 view, the bytes
// a matmul reads (values and exponents).
inline size_t viewBytes(const WeightView& w) {
  if (w.layout == WeightLayout::kMxfp4)
    return static_cast<size_t>(w.rows * (w.cols / 2 + w.cols / 32));
  return static_cast<size_t>(w.rows * w.cols) * dtypeSize(w.dtype);
}

// The value of an MXFP4 element (kMxfp4 above) as fp32: exact (at most two
// significant bits times a power of two), but for 2 x 2^127 and beyond,
// which round to infinity as transformers' ldexp gives them.
float mxfp4Value(const WeightView& w, int64_t row, int64_t col);

// Threads used by the kernels (default, or 0: the CPUs this process can
// keep busy, common/available_cpus.h).
void setNumThreads(int num_threads);
int numThreads();
// Runs fn(task, worker) for every task in [0, num_tasks) on the kernels'
// threads (worker < numThreads()), returning when all have run. For host
// work between kernels (the pool is idle then); not reentrant. A task that
// throws does not end the process from a worker thread: the first
// exception is thrown again here, on the caller's thread, once all have
// run.
void parallelFor(int64_t num_tasks, const std::function<void(int64_t task, int worker)>& fn);
// "avx512", "avx2" or "scalar".
std::string isaName();

// y[m, n] = x[m, k] · w[n, k]^T, fp32 accumulation. `w.cols == k`, n = w.rows.
// x has row stride k, y row stride n. y must not alias x.
//
// What is multiplied follows w.layout. kRows: fp32 activations by the
// weights widened to fp32, so every product is exact. kBf16Pairs (bf16
// compute): each activation is first rounded to bf16 (nearest even), as
// llama.cpp and GPU engines do, and each output adds pairs of exact bf16
// products into one fp32 sum, on AVX512-BF16 CPUs one dot-product
// instruction per pair for 16 outputs, twice the multiply-adds of an fp32
// FMA. What is lost is the activations' low 16 bits
// (docs/engine.md#compute-dtype). Both keep batch invariance.
//
// kRows with kF8E4M3 weights (whatever the compute dtype): each fp8 weight is
// widened to its value times 2^-8, exactly, and multiplied with fp32
// activations as above. Where a scale block spans whole rows (per-tensor or
// per-channel scales), output (i, j) is that sum times (scale x 2^8), one
// rounding. Where blocks split a row (block-wise scales), each activation is
// first multiplied by the scale of its column block in output j's row block
// (rounded to fp32), then summed as above, times 2^8. A result depends only
// on its row of x, the weights and the scales: batch invariance holds.
//
// kMxfp4 (whatever the compute dtype): each weight widened to its fp32 value
// exactly (mxfp4Value) and multiplied as kRows' bf16 weights are, in the same
// order: the bits of the same matrix decoded into bf16 rows.
void matmul(const float* x, int64_t m, int64_t k, const WeightView& w, float* y);

// Packs bf16 row-major weights for bf16 compute into `storage`, which must
// outlive the returned view: panels of 16 output rows (the last zero-padded),
// each holding, for t = 0 .. ceil(k / 2) - 1, the pairs (w[r][2t],
// w[r][2t + 1]) of its 16 rows (zero past k). Throws tandem::Error for other
// dtypes or layouts.
WeightView packBf16Pairs(const WeightView& w, std::vector<uint16_t>& storage);

// The multiply-add rate this CPU reaches on numThreads() threads from
// registers, in GFLOP/s (2 flops per multiply-add), best of `repeats`:
// compute kF32 with fp32 FMAs, kBF16 with bf16 dot products (0 where the ISA
// has none). The ceiling a compute-bound prefill is held against, as the
// memory read rate is for decode.
double peakGflops(DType compute, int repeats = 3);

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight. y may alias x.
void rmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);

// How a model's rotary embedding departs from rotating whole heads (Phi-3,
// Phi-4, GLM): only the first rotary_dim of a head's head_dim values rotate,
// cos and sin are multiplied by attention_factor (LongRoPE's), as
// transformers' partial_rotary_factor and attention_scaling do, and with
// interleaved the pairs are neighbours (2i, 2i + 1) instead of halves (GLM's
// rotate_half over x[0::2] and x[1::2]; vLLM's is_neox_style false).
struct RopeVariant {
  int64_t rotary_dim = 0;  // 0: head_dim
  float attention_factor = 1.0f;
  bool interleaved = false;
  bool operator==(const RopeVariant&) const = default;
};

// Rotary position embedding, Hugging Face "rotate_half" convention: within
// each head the pairs are (i, i + rotary_dim/2) for i < rotary_dim/2
// (rotary_dim: the variant's, else head_dim; interleaved: (2i, 2i + 1)),
// angle = position * inv_freq[i]; the values past rotary_dim are left as
// they are. cos and
// sin are rounded to fp32, then multiplied by the attention factor (fp32),
// then applied. x: rows x (num_heads * head_dim), in place; positions[r] is
// row r's position.
void applyRope(float* x, int64_t rows, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq, const RopeVariant& variant = {});

// out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
void siluMul(const float* gate, const float* up, float* out, int64_t n);

// GPT-OSS's expert activation: out[i] = (u + 1) * g / (1 + e^(-alpha g)) for
// g = min(gate[i], limit) and u = clamp(up[i], -limit, limit), in fp32; a
// NaN passes the clamps (as torch.clamp passes it). out may alias gate or
// up. Element by element: batch invariance holds.
void clampedSwiglu(const float* gate, const float* up, float* out, int64_t n, float alpha,
                   float limit);

// out[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation (PyTorch's
// gelu(approximate="tanh"), transformers' gelu_pytorch_tanh: 0.5 x (1 +
// tanh(sqrt(2 / pi) (x + 0.044715 x^3)))), in fp32, element by element.
// out may alias gate or up.
void geluTanhMul(const float* gate, const float* up, float* out, int64_t n);

// In-place numerically stable softmax over n values.
void softmax(float* x, int64_t n);

// out[r, :] = table[ids[r], :] as fp32. Ids must be < table.rows.
void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out);

// Index of the largest value; the smallest index wins a tie.
int64_t argmax(const float* x, int64_t n);

// y[i] += x[i].
void addInPlace(float* y, const float* x, int64_t n);

// Geometry of a block-major paged KV cache. Block b starts at
// base + b * block_bytes and holds, for every layer, K then V of block_size
// tokens: element (layer, kv, token, kv_head, d) sits at element offset
// (((layer * 2 + kv) * block_size + token) * num_kv_heads + kv_head) * head_dim + d
// where kv is 0 for K and 1 for V. Elements are `dtype`: f32, bf16 or
// f8e4m3. An f8e4m3 element holds its value divided by its layer's K or V
// scale (vLLM's fp8 KV cache: the value is the byte's times the scale).
struct KvCacheLayout {
  void* base = nullptr;
  DType dtype = DType::kF32;
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // f8e4m3 caches: 2 * num_layers scales, layer l's K scale at 2l and its V
  // scale at 2l + 1; null means every scale is 1. Unused by other dtypes.
  const float* scales = nullptr;

  float scale(int32_t layer, int kv) const {
    return dtype == DType::kF8E4M3 && scales != nullptr ? scales[2 * layer + kv] : 1.0f;
  }

  int64_t blockBytes() const {
    return int64_t{2} * num_layers * block_size * num_kv_heads * head_dim *
           static_cast<int64_t>(dtypeSize(dtype));
  }
};

// One sequence's share of a batched attention call: rows
// [first_row, first_row + num_rows) of q/out are its new tokens, at positions
// first_position, first_position + 1, ...; its KV for positions
// 0 .. first_position + num_rows - 1 is in the cache (blocks per block_table).
struct AttentionSequence {
  const int32_t* block_table = nullptr;
  int32_t num_blocks = 0;
  int64_t first_row = 0;
  int64_t num_rows = 0;
  int64_t first_position = 0;
};

// Writes K and V rows (rows x num_kv_heads*head_dim, fp32) of `layer` into the
// cache: row r goes to the block/slot of position first_position + (r - first_row)
// of its sequence. Converts to the cache dtype (round to nearest even; an
// f8e4m3 cache stores each value divided by its scale, saturating at ±448:
// an infinite K/V value is stored as ±448, a NaN as 0x7f, which attention
// reads as 480, so neither spreads as it does through an f32 or bf16 cache).
void writeKv(const KvCacheLayout& cache, int32_t layer, const float* k, const float* v,
             const AttentionSequence* sequences, int64_t num_sequences);

// Causal attention of q (rows x num_heads*head_dim) against the cached K/V of
// `layer`: a query at position p attends to positions 0..p, or, with a
// sliding `window` > 0, to max(0, p - window + 1)..p (the keys before are
// never read). Grouped-query: head h uses kv head h / (num_heads /
// num_kv_heads). Scores are scaled by `scale`, then, with `softcap` > 0,
// soft-capped: tanh(s / softcap) * softcap (Gemma 2). With `sinks`
// (num_heads logits; nullptr: none), head h's softmax has one more term
// that weighs no value, e^(sinks[h] - max) in its sum, the maximum taken
// over the scores and the sink (GPT-OSS's attention sinks). out has the
// shape of q and must not alias it.
void pagedAttention(const KvCacheLayout& cache, int32_t layer, const float* q, int64_t num_heads,
                    float scale, const AttentionSequence* sequences, int64_t num_sequences,
                    float* out, int64_t window = 0, float softcap = 0.0f,
                    const float* sinks = nullptr);

}  // namespace tandem::kernels
