// Shared by the KV connector unit tests: a small real KV cache whose blocks
// can be filled with recognisable bytes, and requests with real block hashes.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/kv/connector.h"
#include "common/block_hash.h"
#include "common/status.h"
#include "kernels/cpu/cpu_backend.h"

namespace tandem::kv::testing {

constexpr int32_t kBlockSize = 4;

inline std::unique_ptr<engine::KvCache> makeCache(int64_t num_blocks = 16) {
  engine::KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = kBlockSize;
  config.dtype = DType::kF32;
  config.num_layers = 2;
  config.num_kv_heads = 1;
  config.head_dim = 4;
  return std::make_unique<engine::KvCache>(config, std::make_unique<engine::HostSlabAllocator>());
}

// A CPU backend that says the host cannot address its memory, as a GPU's
// backend does: a connector must move a cache's blocks through readBlocks
// and writeBlocks (counted here), never through blockData pointers.
class DeviceLikeBackend final : public kernels::cpu::CpuBackend {
 public:
  bool hostAccessible() const override { return false; }
  void readBlocks(const kernels::KvCacheLayout& cache, const int32_t* blocks, int64_t count,
                  void* host_dst) override {
    if (fail_reads) throw Error("injected: the device copy failed");
    reads += count;
    CpuBackend::readBlocks(cache, blocks, count, host_dst);
  }
  void writeBlocks(const kernels::KvCacheLayout& cache, const int32_t* blocks, int64_t count,
                   const void* host_src) override {
    writes += count;
    CpuBackend::writeBlocks(cache, blocks, count, host_src);
  }
  int64_t reads = 0;
  int64_t writes = 0;
  bool fail_reads = false;  // readBlocks throws, as a failing device copy does
};

// Fills `block` with bytes derived from `seed`.
inline void fillBlock(engine::KvCache& cache, BlockId block, uint32_t seed) {
  uint8_t* data = cache.blockData(block);
  for (size_t i = 0; i < cache.blockBytes(); ++i) {
    data[i] = static_cast<uint8_t>((seed * 131u + i * 7u + (i >> 8)) & 0xff);
  }
}

inline std::vector<uint8_t> blockBytes(engine::KvCache& cache, BlockId block) {
  const uint8_t* data = cache.blockData(block);
  return std::vector<uint8_t>(data, data + cache.blockBytes());
}

// A request's tokens and the hashes of its full blocks, kept alive for the
// ConnectorRequest that points into them.
struct TestRequest {
  TestRequest(std::string id, int num_tokens, TokenId first_token) : id(std::move(id)) {
    tokens.resize(static_cast<size_t>(num_tokens));
    std::iota(tokens.begin(), tokens.end(), first_token);
    BlockHasher hasher(HashAlgorithm::kXxh3_128, "test-model", kBlockSize);
    hashes = hasher.hashFullBlocks(tokens, "");
  }
  ConnectorRequest view() const {
    ConnectorRequest request;
    request.request_id = id;
    request.tokens = tokens;
    request.block_hashes = hashes;
    return request;
  }
  std::string id;
  std::vector<TokenId> tokens;
  std::vector<BlockHash> hashes;
};

inline KvTransferConfig parseConfig(const nlohmann::json& json) {
  StatusOr<KvTransferConfig> config = KvTransferConfig::parse(json.dump());
  EXPECT_TRUE(config.isOk()) << config.status().message();
  return config.isOk() ? *config : KvTransferConfig{};
}

}  // namespace tandem::kv::testing
