// The CUDA compute backend: device memory, one stream, and kernels that keep
// the batch-invariance contract of kernels/backend.h by construction (see
// docs/cuda.md for each kernel's argument). Only kernels/registry.cpp and the
// GPU tests include this header; it needs no CUDA headers.
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/backend.h"

namespace tandem::kernels::cuda {

// CUDA devices visible now; 0 when there is no driver or no device.
int deviceCount();

struct CudaBackendOptions {
  // --cuda-kernels fast (docs/cuda.md#kernel-sets). Off: the reference
  // kernels only, and bf16 compute is refused. On: matmulWeight() keeps a
  // copy of each matrix re-laid for the fast decode GEMV (gemv_fast.cu, the
  // reference's bits, for m <= 64) beside the row-major one, so weights take
  // twice the memory; and bf16 compute runs every bf16 matmul on the tensor
  // cores (matmul_bf16_mma.cu).
  bool fast_kernels = false;
  // --cuda-kernels flash (with fast_kernels): attention over bf16 caches on
  // the tensor cores (attention.cu's flash kernel), where its shapes allow.
  bool flash_attention = false;
  // NOT batch-invariant: decode matmuls under bf16 compute (m <= 64, plain
  // and adding stores) split k over blocks and add the partials with
  // atomics, so a row's bits depend on its batch and on timing. Only for
  // measuring what the fixed order costs (tandem-bench engine
  // --unordered-decode); the agent never sets it.
  bool unordered_decode = false;
  // Under bf16 compute, decode matmuls stream each warp's weights through a
  // ring of batches in shared memory by cp.async (matmul_bf16_mma.cu,
  // bf16MmaSkinnyStagedKernel): 16 KB of weights in flight per warp for up
  // to 16 rows, 8 KB and 4 KB for up to 32 and 64, where the serving kernel
  // has one batch in registers (4 KB to 512 bytes); past 16 rows x's
  // fragments are shared by the block through shared memory too
  // (bf16MmaSkinnySharedKernel). The same bits. Not yet run on a GPU: off
  // unless asked (tandem-bench engine --deep-skinny).
  bool deep_skinny = false;
  // With flash_attention: the flash kernel launched with one block per
  // query tile and KV head of a step that is not recorded (prefill, chunked
  // prefill), the tiles listed on the host with the batch, instead of one
  // block per row of which only a tile's first works (15 of 16 in a prefill
  // exit at once); each block goes through a run of splits (all of its
  // tile's where the grid keeps 4 blocks per SM: a 2,048-token prefill),
  // each split from scratch, so its q fragments are loaded once and its
  // copies run on from split to split. The same operations on the same
  // values per split, so the same bits. Not yet run on a GPU: off unless
  // asked (tandem-bench engine --compact-attention).
  bool compact_attention = false;
  // With flash_attention: a decode step's flash kernel (every sequence one
  // row) copies all four 64-position tiles of its 256-position split into
  // shared memory at once where its grid has at most a block per SM (a
  // decode of one sequence launches KV heads x splits blocks, 64 at 2,048
  // positions on the 8B shape), else three, not one tile ahead: the same
  // operations on the same values, so the same bits. 136 KB of shared
  // memory a block at head_dim 128 (three tiles: 102 KB, two blocks per
  // SM), refused on a device that offers less. Not yet run on a GPU: off
  // unless asked (tandem-bench engine --deep-attention).
  bool deep_attention = false;
  // Fewer launches (with fast_kernels; the agent's --fuse-projections sets
  // it): the fast GEMV folds its partials in the partial kernel, and under
  // bf16 compute the kernels that compute a decode matmul's x (rmsNorm,
  // attention's combine, the SiLU·up epilogue) write it as that matmul's
  // bf16 fragments, so the matmul does not round x in a launch of its own.
  // The same bits either way (docs/cuda.md#fused-projections).
  bool fused_launches = false;
  // applyRopeWith (partial rotary dims, LongRoPE's and YaRN's attention
  // factor, GLM's neighbour pairs: norm_rope.cu's ropeKernel<true>). On
  // since it passed the gpu tests on an H200 (docs/cuda.md#kernel-sets);
  // off, the runner refuses such models on CUDA.
  bool rope_variants = true;
  // The bf16 prefill GEMM's K step and pipeline depth (matmul_bf16_mma.cu's
  // pipelined configurations, 0 .. 3; kBf16GemmServing, 1, the fastest on
  // an H200, serves), or 4 to 7: its wgmma twins, 128 x 128 and 128 x 256
  // tiles, 6 and 7 fed by tensor copies (7 on a persistent grid) (matmul_bf16_wgmma.cu; compute
  // capability 9.0 and a build for sm_90 only, refused otherwise). Every configuration runs the
  // same mma chain; tandem-bench engine --bf16-gemm-configs measures them side by side and compares
  // their bits.
  int bf16_gemm_config = kBf16GemmServing;
  // The most scratch the fast GEMV keeps for its chunk partials; a matmul
  // needing more runs its columns in slices, one launch pair each.
  size_t gemv_scratch_bytes = size_t{32} << 20;
};

// A backend on device `device` (0-based). Throws tandem::Error with the CUDA
// error text when the device cannot be used.
std::unique_ptr<Backend> makeCudaBackend(int device, const CudaBackendOptions& options = {});

}  // namespace tandem::kernels::cuda
