#include "agent/engine/kv_cache.h"

#include <sys/mman.h>

#include <cstring>

#include "common/check.h"
#include "common/host_memory.h"
#include "common/status.h"

namespace tandem::engine {

void* HostSlabAllocator::allocate(size_t bytes) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) return nullptr;
  // Large slabs benefit from huge pages (fewer TLB misses in attention);
  // a refusal is harmless.
  ::madvise(data, bytes, MADV_HUGEPAGE);
  return data;
}

DType kvDtypeFromName(std::string_view name, std::string_view option) {
  if (name == "bf16") return DType::kBF16;
  if (name == "f32") return DType::kF32;
  if (name == "fp8") return DType::kF8E4M3;
  throw Error(std::string(option) + " must be bf16, f32 or fp8 (e4m3), got \"" + std::string(name) +
              "\"");
}

void HostSlabAllocator::release(void* data, size_t bytes) { ::munmap(data, bytes); }

int64_t KvCacheConfig::blockBytes() const {
  return int64_t{2} * num_layers * block_size * num_kv_heads * head_dim *
         static_cast<int64_t>(dtypeSize(dtype));
}

int64_t KvCacheConfig::blocksForBytes(int64_t bytes) const {
  int64_t per_block = blockBytes();
  return per_block > 0 && bytes > 0 ? bytes / per_block : 0;
}

KvCache::KvCache(const KvCacheConfig& config, std::unique_ptr<KvSlabAllocator> allocator)
    : config_(config), allocator_(std::move(allocator)) {
  if (config_.dtype != DType::kF32 && config_.dtype != DType::kBF16 &&
      config_.dtype != DType::kF8E4M3) {
    throw Error(std::string("KV cache dtype must be f32, bf16 or fp8, got ") +
                dtypeShortName(config_.dtype));
  }
  if (config_.dtype == DType::kF8E4M3 && !config_.scales.empty()) {
    if (config_.scales.size() != static_cast<size_t>(2) * config_.num_layers) {
      throw Error("an fp8 KV cache of " + std::to_string(config_.num_layers) + " layers needs " +
                  std::to_string(2 * config_.num_layers) + " K/V scales, got " +
                  std::to_string(config_.scales.size()));
    }
    for (size_t i = 0; i < config_.scales.size(); ++i) {
      if (!(config_.scales[i] >= kMinKvCacheScale && config_.scales[i] <= kMaxKvCacheScale)) {
        throw Error("fp8 KV cache " + std::string(i % 2 == 0 ? "K" : "V") + " scale of layer " +
                    std::to_string(i / 2) + " is " + std::to_string(config_.scales[i]) +
                    " (accepted: from 1e-30 to 1e36)");
      }
    }
  }
  if (config_.num_blocks <= 0 || config_.block_size <= 0 || config_.num_layers <= 0 ||
      config_.num_kv_heads <= 0 || config_.head_dim <= 0) {
    throw Error(
        "KV cache needs at least one block and positive block size, layers, KV heads "
        "and head size (num_blocks=" +
        std::to_string(config_.num_blocks) + ", block_size=" + std::to_string(config_.block_size) +
        ")");
  }
  TANDEM_CHECK(allocator_ != nullptr, "KvCache needs an allocator");
  block_bytes_ = static_cast<size_t>(config_.blockBytes());
  slab_bytes_ = block_bytes_ * static_cast<size_t>(config_.num_blocks);
  if (const std::optional<bool> committed = allocator_->commitsHostMemory()) {
    requireHostMemoryFor(slab_bytes_,
                         "the KV cache of " + std::to_string(config_.num_blocks) +
                             " blocks (--kv-cache-memory, --num-blocks) from the " +
                             allocator_->name() + " allocator",
                         *committed);
  }
  slab_ = static_cast<uint8_t*>(allocator_->allocate(slab_bytes_));
  if (slab_ == nullptr) {
    throw Error("cannot allocate the KV cache: " + std::to_string(slab_bytes_) + " bytes for " +
                std::to_string(config_.num_blocks) + " blocks from the " + allocator_->name() +
                " allocator");
  }
}

KvCache::~KvCache() {
  if (slab_ != nullptr) allocator_->release(slab_, slab_bytes_);
}

uint8_t* KvCache::blockData(BlockId block) {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks, "block id out of range");
  return slab_ + static_cast<size_t>(block) * block_bytes_;
}

const uint8_t* KvCache::blockData(BlockId block) const {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks, "block id out of range");
  return slab_ + static_cast<size_t>(block) * block_bytes_;
}

void KvCache::copyBlockToHost(BlockId block, void* host_dst) {
  if (backend_ != nullptr) {
    backend_->readBlocks(layout(), &block, 1, host_dst);
  } else {
    std::memcpy(host_dst, blockData(block), block_bytes_);
  }
}

void KvCache::copyBlockFromHost(BlockId block, const void* host_src) {
  if (backend_ != nullptr) {
    backend_->writeBlocks(layout(), &block, 1, host_src);
  } else {
    std::memcpy(blockData(block), host_src, block_bytes_);
  }
}

const uint8_t* KvCache::readableBlock(BlockId block, std::vector<uint8_t>& scratch) {
  if (hostAccessible()) return blockData(block);
  scratch.resize(block_bytes_);
  copyBlockToHost(block, scratch.data());
  return scratch.data();
}

std::unique_ptr<KvSlabAllocator> slabAllocatorFor(kernels::Backend& backend) {
  if (backend.hostAccessible()) return std::make_unique<HostSlabAllocator>();
  return std::make_unique<BackendSlabAllocator>(backend);
}

KvCacheConfig KvCacheConfig::forModel(const ModelConfig& model, DType dtype, int32_t block_size) {
  KvCacheConfig config;
  config.block_size = block_size;
  config.dtype = dtype;
  config.num_layers = static_cast<int32_t>(model.num_hidden_layers);
  config.num_kv_heads = static_cast<int32_t>(model.num_key_value_heads);
  config.head_dim = static_cast<int32_t>(model.head_dim);
  return config;
}

KvCacheConfig KvCacheConfig::forModel(const Model& model, DType dtype, int32_t block_size) {
  KvCacheConfig config = forModel(model.config(), dtype, block_size);
  if (dtype == DType::kF8E4M3) config.scales = model.kvCacheScales();
  return config;
}

kernels::KvCacheLayout KvCache::layout() {
  kernels::KvCacheLayout layout;
  layout.base = slab_;
  layout.dtype = config_.dtype;
  layout.num_blocks = config_.num_blocks;
  layout.block_size = config_.block_size;
  layout.num_layers = config_.num_layers;
  layout.num_kv_heads = config_.num_kv_heads;
  layout.head_dim = config_.head_dim;
  layout.scales = config_.scales.empty() ? nullptr : config_.scales.data();
  return layout;
}

}  // namespace tandem::engine
