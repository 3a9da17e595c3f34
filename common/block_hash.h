// Content hashes of full KV blocks, for prefix caching and KV-aware routing.
//
// A full block of `block_size` tokens is named by
// hash(parent_hash, token_ids, extra), where parent_hash names the block
// before it (none for the first block) and extra is the model identity and the
// request's cache_salt. Two blocks have the same hash exactly when their whole
// prefix, model and salt agree, so the hash alone says "this KV can be reused".
// The agent's block manager and the router both compute these hashes and
// compare them across processes: the byte encoding below is a protocol.
//
// Bytes fed to the hash function for one block (format version 1):
//
//   offset  size  field
//   0       1     format version: 0x01
//   1       1     has_parent: 0x00 (first block) or 0x01
//   2       16    parent hash: `high` then `low`, each 8 bytes big-endian
//                 (the 16 bytes that toHex() spells); all zero without parent
//   18      4     n: number of tokens, u32 little-endian
//   22      4*n   token ids, each as u32 little-endian (two's complement)
//   ..      4     m: model identity length in bytes, u32 little-endian
//   ..      m     model identity bytes, as given
//   ..      4     s: cache salt length in bytes, u32 little-endian
//   ..      s     cache salt bytes, as given (empty: no salt)
//
// The digest becomes a BlockHash as follows:
//   kXxh3_128: XXH3_128bits(bytes) with seed 0; high = high64, low = low64
//              (toHex() then equals xxHash's canonical big-endian form).
//   kSha256:   SHA-256(bytes) truncated to its first 16 bytes; high = bytes
//              0..7 big-endian, low = bytes 8..15 big-endian (toHex() then
//              equals the first 32 hex digits of the SHA-256 hex digest).
//
// Changing any of this changes every hash: bump the version byte and treat it
// as a protocol change (agents and routers must agree). Known-answer tests in
// tests/unit/common/block_hash_test.cpp pin the current values.
//
// BlockHasher is immutable after construction and safe to use from many
// threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer.h"

namespace tandem {

struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const BlockHash&, const BlockHash&) = default;

  // 32 lowercase hex digits, `high` first.
  std::string toHex() const;
  // Accepts exactly 32 hex digits (either case).
  static StatusOr<BlockHash> fromHex(std::string_view hex);
};

enum class HashAlgorithm { kXxh3_128, kSha256 };

// "xxhash" or "sha256".
const char* hashAlgorithmName(HashAlgorithm algorithm);
// Accepts "xxhash" and "sha256"; the error names what was given.
StatusOr<HashAlgorithm> parseHashAlgorithm(std::string_view name);

class BlockHasher {
 public:
  // Throws tandem::Error when block_size is not positive (start-up code).
  BlockHasher(HashAlgorithm algorithm, std::string model_identity, int32_t block_size);

  HashAlgorithm algorithm() const { return algorithm_; }
  const std::string& modelIdentity() const { return model_identity_; }
  int32_t blockSize() const { return block_size_; }

  // The hash of one full block. `parent` is the previous block's hash, or
  // nullptr for the first block. block_tokens.size() must equal blockSize().
  // `model_identity` replaces the hasher's own in the encoding when not
  // empty: a LoRA adapter's blocks are named by the adapter's identity
  // (docs/lora.md), which the agent reports for it in /v1/models.
  BlockHash hashBlock(const BlockHash* parent, std::span<const TokenId> block_tokens,
                      std::string_view cache_salt, std::string_view model_identity = {}) const;

  // One hash per full block of `tokens`, chained from the first block; a
  // trailing partial block has none.
  std::vector<BlockHash> hashFullBlocks(std::span<const TokenId> tokens,
                                        std::string_view cache_salt,
                                        std::string_view model_identity = {}) const;

 private:
  BlockHash digest(const std::string& bytes) const;
  void encode(const BlockHash* parent, std::span<const TokenId> block_tokens,
              std::string_view cache_salt, std::string_view model_identity, std::string& out) const;

  HashAlgorithm algorithm_;
  std::string model_identity_;
  int32_t block_size_;
};

}  // namespace tandem

template <>
struct std::hash<tandem::BlockHash> {
  size_t operator()(const tandem::BlockHash& hash) const noexcept {
    // The bits are already uniformly distributed; fold both halves.
    return static_cast<size_t>(hash.low ^ (hash.high * 0x9e3779b97f4a7c15ULL));
  }
};
