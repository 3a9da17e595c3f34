// The paged KV cache: one slab of fixed-size blocks, block-major.
//
// Block b is one contiguous region holding K and V of every layer for
// block_size tokens (layout in kernels::KvCacheLayout), so moving N blocks to
// another agent is at most N memory operations. The whole slab comes from a
// KvSlabAllocator in one allocation: the default maps anonymous host memory;
// a transport can supply its own (e.g. memory that UCX allocated and
// registered itself) without the cache knowing.
//
// KvCache owns the slab for its lifetime. Which blocks belong to which
// sequence is not its business: callers pass block tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/engine/model.h"
#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

namespace tandem::engine {

using BlockId = int32_t;

// Supplies the memory of the KV slab. Memory returned by allocate() must be
// zero-filled, aligned to at least 64 bytes, and stay valid until release().
class KvSlabAllocator {
 public:
  virtual ~KvSlabAllocator() = default;
  // Returns nullptr when the memory cannot be had.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data, size_t bytes) = 0;
  virtual std::string name() const = 0;
  // Whether the slab is host memory, and whether it is committed when
  // allocated (true) or as it is first touched (false); none: device
  // memory. A slab larger than the host's memory is then refused before it
  // is allocated (common/host_memory.h).
  virtual std::optional<bool> commitsHostMemory() const { return std::nullopt; }
  // Called by the engine before allocate() with the backend that computes on
  // the slab, so an allocator can place the slab in that backend's memory
  // (e.g. device memory it then registers with a transport). Default: none.
  virtual void bindBackend(kernels::Backend& backend) {}
};

// The KV cache dtype a --kv-dtype value names: "bf16", "f32" or "fp8"
// (f8e4m3, as vLLM's --kv-cache-dtype fp8). Throws tandem::Error naming
// `option` and the accepted values.
DType kvDtypeFromName(std::string_view name, std::string_view option = "--kv-dtype");

// Anonymous private host mapping (zero-filled by the kernel, page-aligned).
class HostSlabAllocator : public KvSlabAllocator {
 public:
  void* allocate(size_t bytes) override;
  void release(void* data, size_t bytes) override;
  std::string name() const override { return "host"; }
  std::optional<bool> commitsHostMemory() const override { return false; }
};

// The slab in a compute backend's memory (Backend::allocate), for backends
// whose memory the host cannot address. The backend must outlive the cache.
class BackendSlabAllocator : public KvSlabAllocator {
 public:
  explicit BackendSlabAllocator(kernels::Backend& backend) : backend_(backend) {}
  void* allocate(size_t bytes) override { return backend_.allocate(bytes); }
  void release(void* data, size_t bytes) override { backend_.release(data, bytes); }
  std::string name() const override {
    return std::string(kernels::deviceKindName(backend_.kind()));
  }

 private:
  kernels::Backend& backend_;
};

// The slab allocator a cache computed on by `backend` gets when nothing else
// supplies one: host memory for a host-accessible backend, else the
// backend's own memory.
std::unique_ptr<KvSlabAllocator> slabAllocatorFor(kernels::Backend& backend);

struct KvCacheConfig {
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  DType dtype = DType::kBF16;  // f32, bf16 or f8e4m3
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // An f8e4m3 cache's K and V scale per layer (kernels::KvCacheLayout::scales:
  // 2 * num_layers, positive and finite); empty means every scale is 1.
  // Ignored by other dtypes.
  std::vector<float> scales;

  // Layers, KV heads and head size from `model` (num_blocks left at 0).
  static KvCacheConfig forModel(const ModelConfig& model, DType dtype, int32_t block_size);
  // As above; an f8e4m3 cache also takes the checkpoint's K/V scales
  // (Model::kvCacheScales).
  static KvCacheConfig forModel(const Model& model, DType dtype, int32_t block_size);

  int64_t blockBytes() const;
  // Largest block count whose slab fits in `bytes` (0 when not even one fits).
  int64_t blocksForBytes(int64_t bytes) const;
};

class KvCache {
 public:
  // Throws tandem::Error when the configuration is invalid (dtype other than
  // f32/bf16, non-positive sizes) or the allocator cannot supply the slab.
  KvCache(const KvCacheConfig& config, std::unique_ptr<KvSlabAllocator> allocator);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return config_; }
  int64_t numBlocks() const { return config_.num_blocks; }
  int32_t blockSize() const { return config_.block_size; }
  size_t blockBytes() const { return block_bytes_; }
  size_t slabBytes() const { return slab_bytes_; }
  uint8_t* slab() { return slab_; }
  uint8_t* blockData(BlockId block);
  const uint8_t* blockData(BlockId block) const;
  // The geometry the attention kernels read and write.
  kernels::KvCacheLayout layout();
  const KvSlabAllocator& allocator() const { return *allocator_; }
  // The compute backend whose memory the slab is (attached by the engine;
  // null for a cache used without one, whose slab is then host memory).
  // Connectors that move blocks through host memory use its
  // readBlocks/writeBlocks, on the engine thread only.
  void attachBackend(kernels::Backend* backend) { backend_ = backend; }
  kernels::Backend* backend() const { return backend_; }
  // Whether the host may read and write the slab's bytes directly.
  bool hostAccessible() const { return backend_ == nullptr || backend_->hostAccessible(); }
  // One block to or from host memory (block_bytes), through the backend's
  // readBlocks/writeBlocks when there is one; engine thread only.
  void copyBlockToHost(BlockId block, void* host_dst);
  void copyBlockFromHost(BlockId block, const void* host_src);
  // The block's bytes for the host to read: the slab itself where the host
  // can read it, else a copy in `scratch` (resized; through the backend, so
  // a failing device copy throws before the caller changes anything).
  // Engine thread only.
  const uint8_t* readableBlock(BlockId block, std::vector<uint8_t>& scratch);

 private:
  KvCacheConfig config_;
  std::unique_ptr<KvSlabAllocator> allocator_;
  size_t block_bytes_ = 0;
  size_t slab_bytes_ = 0;
  uint8_t* slab_ = nullptr;
  kernels::Backend* backend_ = nullptr;
};

}  // namespace tandem::engine
