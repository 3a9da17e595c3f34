#include "common/block_hash.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <array>
#include <bit>
#include <cstring>
#include <limits>

#include "common/check.h"

namespace tandem {
namespace {

constexpr uint8_t kFormatVersion = 1;

// The encoders below write into a buffer already sized for them and return
// the position after what they wrote.
char* putU32Le(char* out, uint32_t value) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, &value, 4);
    return out + 4;
  }
  for (int shift = 0; shift < 32; shift += 8) *out++ = static_cast<char>(value >> shift);
  return out;
}

char* putU64Be(char* out, uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) *out++ = static_cast<char>(value >> shift);
  return out;
}

uint64_t readU64Be(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
  return value;
}

char* putString(char* out, std::string_view text) {
  out = putU32Le(out, static_cast<uint32_t>(text.size()));
  std::memcpy(out, text.data(), text.size());
  return out + text.size();
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string BlockHash::toHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[i] = kDigits[(high >> (60 - 4 * i)) & 0xf];
    out[16 + i] = kDigits[(low >> (60 - 4 * i)) & 0xf];
  }
  return out;
}

StatusOr<BlockHash> BlockHash::fromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return invalidArgument("block hash must be 32 hex digits, got " + std::to_string(hex.size()) +
                           " characters: '" + std::string(hex.substr(0, 64)) + "'");
  }
  BlockHash hash;
  for (size_t i = 0; i < 32; ++i) {
    const int value = hexValue(hex[i]);
    if (value < 0) {
      return invalidArgument("block hash must be 32 hex digits, got '" + std::string(hex) + "'");
    }
    uint64_t& half = i < 16 ? hash.high : hash.low;
    half = (half << 4) | static_cast<uint64_t>(value);
  }
  return hash;
}

const char* hashAlgorithmName(HashAlgorithm algorithm) {
  switch (algorithm) {
    case HashAlgorithm::kXxh3_128:
      return "xxhash";
    case HashAlgorithm::kSha256:
      return "sha256";
  }
  return "unknown";
}

StatusOr<HashAlgorithm> parseHashAlgorithm(std::string_view name) {
  if (name == "xxhash") return HashAlgorithm::kXxh3_128;
  if (name == "sha256") return HashAlgorithm::kSha256;
  return invalidArgument("block hash algorithm must be \"xxhash\" or \"sha256\", got \"" +
                         std::string(name) + "\"");
}

BlockHasher::BlockHasher(HashAlgorithm algorithm, std::string model_identity, int32_t block_size)
    : algorithm_(algorithm), model_identity_(std::move(model_identity)), block_size_(block_size) {
  if (block_size_ <= 0) {
    throw Error("block_size must be positive, got " + std::to_string(block_size_));
  }
}

void BlockHasher::encode(const BlockHash* parent, std::span<const TokenId> block_tokens,
                         std::string_view cache_salt, std::string_view model_identity,
                         std::string& out) const {
  if (model_identity.empty()) model_identity = model_identity_;
  TANDEM_CHECK(cache_salt.size() <= std::numeric_limits<uint32_t>::max() &&
                   model_identity.size() <= std::numeric_limits<uint32_t>::max(),
               "block hash extra longer than 4 GiB");
  // Sized once and written in place: a routing decision hashes every block of
  // a prompt, so this runs thousands of times per request.
  out.resize(2 + 16 + 4 + 4 * block_tokens.size() + 4 + model_identity.size() + 4 +
             cache_salt.size());
  char* p = out.data();
  *p++ = static_cast<char>(kFormatVersion);
  *p++ = parent != nullptr ? 1 : 0;
  p = putU64Be(p, parent != nullptr ? parent->high : 0);
  p = putU64Be(p, parent != nullptr ? parent->low : 0);
  p = putU32Le(p, static_cast<uint32_t>(block_tokens.size()));
  if constexpr (std::endian::native == std::endian::little && sizeof(TokenId) == 4) {
    std::memcpy(p, block_tokens.data(), 4 * block_tokens.size());
    p += 4 * block_tokens.size();
  } else {
    for (TokenId token : block_tokens) p = putU32Le(p, static_cast<uint32_t>(token));
  }
  p = putString(p, model_identity);
  p = putString(p, cache_salt);
  TANDEM_CHECK(p == out.data() + out.size(), "block hash encoding size");
}

BlockHash BlockHasher::digest(const std::string& bytes) const {
  switch (algorithm_) {
    case HashAlgorithm::kXxh3_128: {
      const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
      return BlockHash{h.high64, h.low64};
    }
    case HashAlgorithm::kSha256: {
      std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
      unsigned int md_size = 0;
      const int ok =
          EVP_Digest(bytes.data(), bytes.size(), md.data(), &md_size, EVP_sha256(), nullptr);
      TANDEM_CHECK(ok == 1 && md_size == 32, "SHA-256 digest failed");
      return BlockHash{readU64Be(md.data()), readU64Be(md.data() + 8)};
    }
  }
  TANDEM_CHECK(false, "unknown hash algorithm");
  return {};
}

BlockHash BlockHasher::hashBlock(const BlockHash* parent, std::span<const TokenId> block_tokens,
                                 std::string_view cache_salt,
                                 std::string_view model_identity) const {
  TANDEM_CHECK(block_tokens.size() == static_cast<size_t>(block_size_),
               "hashBlock needs exactly block_size tokens");
  std::string bytes;
  encode(parent, block_tokens, cache_salt, model_identity, bytes);
  return digest(bytes);
}

std::vector<BlockHash> BlockHasher::hashFullBlocks(std::span<const TokenId> tokens,
                                                   std::string_view cache_salt,
                                                   std::string_view model_identity) const {
  const size_t block = static_cast<size_t>(block_size_);
  const size_t num_blocks = tokens.size() / block;
  std::vector<BlockHash> hashes;
  hashes.reserve(num_blocks);
  std::string bytes;
  for (size_t i = 0; i < num_blocks; ++i) {
    encode(i == 0 ? nullptr : &hashes.back(), tokens.subspan(i * block, block), cache_salt,
           model_identity, bytes);
    hashes.push_back(digest(bytes));
  }
  return hashes;
}

}  // namespace tandem
