#include "common/block_hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace tandem {
namespace {

constexpr int32_t kBlockSize = 4;
const std::vector<TokenId> kTokens = {1, 2, 3, 4, 128000, 6, 7, 8, 9, 10, 11, 12, 13};

BlockHasher xxhasher(std::string identity = "tandem-test-model") {
  return BlockHasher(HashAlgorithm::kXxh3_128, std::move(identity), kBlockSize);
}
BlockHasher shaHasher() {
  return BlockHasher(HashAlgorithm::kSha256, "tandem-test-model", kBlockSize);
}

std::vector<std::string> hexes(const std::vector<BlockHash>& hashes) {
  std::vector<std::string> out;
  for (const BlockHash& hash : hashes) out.push_back(hash.toHex());
  return out;
}

// Pinned once from the implementation; the SHA-256 values were checked
// against Python's hashlib over the encoding documented in block_hash.h. A
// failure here means the cross-process encoding changed: routers and agents
// built before and after would stop agreeing.
TEST(BlockHash, KnownAnswersXxh3) {
  EXPECT_EQ(hexes(xxhasher().hashFullBlocks(kTokens, "")),
            (std::vector<std::string>{"61e23736a1515ecaeb0af481cea7c20d",
                                      "1b36ac2f967b076fbf381272ddc0a87e",
                                      "d8da94b989a5d91ac8c0a743797e84bc"}));
  EXPECT_EQ(hexes(xxhasher().hashFullBlocks(kTokens, "tenant-a")),
            (std::vector<std::string>{"ec3b66ce1e80cbe4e4ff906f23e43123",
                                      "01849b5c1ad205b8ad9eb3f7ff279fce",
                                      "65aa23674dccb6335d1641e10ca7893d"}));
}

TEST(BlockHash, KnownAnswersSha256) {
  EXPECT_EQ(hexes(shaHasher().hashFullBlocks(kTokens, "")),
            (std::vector<std::string>{"de64d230667451173d689552477e7043",
                                      "9d00ac8cf103bd7ac58947a40fa95330",
                                      "5329477e6d4b05f9cceb3a2fb9487f7a"}));
  EXPECT_EQ(hexes(shaHasher().hashFullBlocks(kTokens, "tenant-a")),
            (std::vector<std::string>{"2c4c4a0ba04c0af418c066998cba7c9c",
                                      "dd2b0a73387fcaeb264ce6f46d3732d0",
                                      "f38438fed5c7a692fbee344708e9c479"}));
}

void appendU32Le(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The documented layout, built independently of the implementation.
TEST(BlockHash, EncodingMatchesTheHeaderComment) {
  const BlockHash parent{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  const std::vector<TokenId> block = {5, -1, 70000, 0};
  std::string bytes;
  bytes.push_back(1);  // version
  bytes.push_back(1);  // has parent
  for (char c :
       std::string("\x01\x23\x45\x67\x89\xab\xcd\xef\xfe\xdc\xba\x98\x76\x54\x32\x10", 16)) {
    bytes.push_back(c);
  }
  appendU32Le(bytes, 4);
  for (TokenId t : block) appendU32Le(bytes, static_cast<uint32_t>(t));
  appendU32Le(bytes, 3);
  bytes += "abc";
  appendU32Le(bytes, 2);
  bytes += "xy";
  const XXH128_hash_t expected = XXH3_128bits(bytes.data(), bytes.size());
  const BlockHash got =
      BlockHasher(HashAlgorithm::kXxh3_128, "abc", 4).hashBlock(&parent, block, "xy");
  EXPECT_EQ(got.high, expected.high64);
  EXPECT_EQ(got.low, expected.low64);
  // toHex() spells xxHash's canonical (big-endian) form of the digest.
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, expected);
  std::string canonical_hex;
  for (unsigned char byte : canonical.digest) {
    static constexpr char kDigits[] = "0123456789abcdef";
    canonical_hex.push_back(kDigits[byte >> 4]);
    canonical_hex.push_back(kDigits[byte & 0xf]);
  }
  EXPECT_EQ(got.toHex(), canonical_hex);

  // Without a parent: flag 0 and sixteen zero bytes.
  std::string root = bytes;
  root[1] = 0;
  for (int i = 2; i < 18; ++i) root[i] = 0;
  const XXH128_hash_t expected_root = XXH3_128bits(root.data(), root.size());
  const BlockHash got_root =
      BlockHasher(HashAlgorithm::kXxh3_128, "abc", 4).hashBlock(nullptr, block, "xy");
  EXPECT_EQ(got_root, (BlockHash{expected_root.high64, expected_root.low64}));
}

TEST(BlockHash, FullBlocksAreChainedHashBlocks) {
  const BlockHasher hasher = xxhasher();
  const std::vector<BlockHash> hashes = hasher.hashFullBlocks(kTokens, "salt");
  ASSERT_EQ(hashes.size(), 3u);  // 13 tokens: the partial last block has no hash
  std::span<const TokenId> tokens(kTokens);
  EXPECT_EQ(hashes[0], hasher.hashBlock(nullptr, tokens.subspan(0, 4), "salt"));
  EXPECT_EQ(hashes[1], hasher.hashBlock(&hashes[0], tokens.subspan(4, 4), "salt"));
  EXPECT_EQ(hashes[2], hasher.hashBlock(&hashes[1], tokens.subspan(8, 4), "salt"));
  EXPECT_TRUE(hasher.hashFullBlocks(tokens.first(3), "salt").empty());
}

TEST(BlockHash, SaltChangesEveryHash) {
  for (const BlockHasher& hasher : {xxhasher(), shaHasher()}) {
    const auto plain = hasher.hashFullBlocks(kTokens, "");
    const auto a = hasher.hashFullBlocks(kTokens, "a");
    const auto b = hasher.hashFullBlocks(kTokens, "b");
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_NE(plain[i], a[i]) << i;
      EXPECT_NE(a[i], b[i]) << i;
    }
  }
}

TEST(BlockHash, ModelIdentityChangesEveryHash) {
  const auto one = xxhasher("model-a").hashFullBlocks(kTokens, "");
  const auto two = xxhasher("model-b").hashFullBlocks(kTokens, "");
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NE(one[i], two[i]) << i;
}

TEST(BlockHash, EarlyTokenChangesAllLaterHashes) {
  const BlockHasher hasher = xxhasher();
  const auto base = hasher.hashFullBlocks(kTokens, "");
  std::vector<TokenId> first = kTokens;
  first[0] += 1;
  const auto changed_first = hasher.hashFullBlocks(first, "");
  for (size_t i = 0; i < base.size(); ++i) EXPECT_NE(base[i], changed_first[i]) << i;

  std::vector<TokenId> second = kTokens;
  second[5] += 1;  // in block 1
  const auto changed_second = hasher.hashFullBlocks(second, "");
  EXPECT_EQ(base[0], changed_second[0]);
  EXPECT_NE(base[1], changed_second[1]);
  EXPECT_NE(base[2], changed_second[2]);
}

TEST(BlockHash, AlgorithmsDiffer) {
  const auto x = xxhasher().hashFullBlocks(kTokens, "");
  const auto s = shaHasher().hashFullBlocks(kTokens, "");
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NE(x[i], s[i]) << i;
}

TEST(BlockHash, HexRoundTrip) {
  const BlockHash hash{0x00ff00ff12345678ULL, 0x9abcdef000000001ULL};
  EXPECT_EQ(hash.toHex(), "00ff00ff123456789abcdef000000001");
  auto parsed = BlockHash::fromHex(hash.toHex());
  ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
  EXPECT_EQ(*parsed, hash);
  auto upper = BlockHash::fromHex("00FF00FF123456789ABCDEF000000001");
  ASSERT_TRUE(upper.isOk());
  EXPECT_EQ(*upper, hash);
  for (const BlockHash& h : xxhasher().hashFullBlocks(kTokens, "")) {
    EXPECT_EQ(*BlockHash::fromHex(h.toHex()), h);
  }
}

TEST(BlockHash, FromHexRejectsMalformedInput) {
  auto short_hex = BlockHash::fromHex("abc");
  ASSERT_FALSE(short_hex.isOk());
  EXPECT_EQ(short_hex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_hex.status().message().find("32 hex digits"), std::string::npos);
  EXPECT_FALSE(BlockHash::fromHex("00ff00ff123456789abcdef00000000g").isOk());
  EXPECT_FALSE(BlockHash::fromHex("00ff00ff123456789abcdef0000000011").isOk());
}

TEST(BlockHash, ParseAlgorithm) {
  EXPECT_EQ(*parseHashAlgorithm("xxhash"), HashAlgorithm::kXxh3_128);
  EXPECT_EQ(*parseHashAlgorithm("sha256"), HashAlgorithm::kSha256);
  auto bad = parseHashAlgorithm("md5");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("\"xxhash\" or \"sha256\", got \"md5\""),
            std::string::npos);
  EXPECT_STREQ(hashAlgorithmName(HashAlgorithm::kSha256), "sha256");
  EXPECT_STREQ(hashAlgorithmName(HashAlgorithm::kXxh3_128), "xxhash");
}

TEST(BlockHash, UsableAsUnorderedKey) {
  const auto hashes = xxhasher().hashFullBlocks(kTokens, "");
  std::unordered_set<BlockHash> set(hashes.begin(), hashes.end());
  EXPECT_EQ(set.size(), hashes.size());
  EXPECT_TRUE(set.contains(hashes[1]));
}

TEST(BlockHash, RejectsNonPositiveBlockSize) {
  EXPECT_THROW(BlockHasher(HashAlgorithm::kXxh3_128, "m", 0), Error);
}

}  // namespace
}  // namespace tandem
