// The BPE model of a Hugging Face tokenizer.json: vocabulary, ranked merges,
// and the merge loop that turns one pre-tokenized word into ids.
//
// Merges are looked up by the pair of token ids, never by strings. Immutable
// after construction; tokenize() is safe to call from many threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer.h"
#include "common/tokenizer_hash.h"

namespace tandem::tokenizer_internal {

class BpeModel {
 public:
  // Reads tokenizer.json's "model" object. Throws tandem::Error naming
  // `source` for anything other than a usable BPE model.
  BpeModel(const nlohmann::json& model, std::string_view source);

  // Appends the ids of one pre-tokenized word (already in the vocabulary's
  // alphabet, e.g. byte-level).
  void tokenize(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> tokenToId(std::string_view token) const;
  // nullopt when no vocabulary entry has this id.
  std::optional<std::string_view> idToToken(TokenId id) const;
  // One past the largest id in the vocabulary.
  int64_t idLimit() const { return static_cast<int64_t>(id_to_token_.size()); }
  // fuse_unk: a run of unknown characters, however long, becomes one id.
  // Never when byte_fallback has a token for every byte: no character is
  // unknown then.
  bool fusesUnknown() const { return unk_id_.has_value() && fuse_unk_ && !bytes_cover_all_; }

 private:
  struct Merge {
    uint32_t rank;
    TokenId merged_id;
  };
  static uint64_t pairKey(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* findMerge(TokenId left, TokenId right) const;
  // Appends the initial symbols of `word` (one per character) to `ids`.
  void splitIntoSymbols(std::string_view word, std::vector<TokenId>& ids) const;

  StringIdTable vocab_;
  // Views into vocab_'s keys; data() is null for ids no token has.
  std::vector<std::string_view> id_to_token_;
  U64Table<Merge> merges_;

  std::optional<TokenId> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  // byte_fallback's "<0xNN>" token of each byte, -1 where the vocabulary
  // has none; and whether it has all 256.
  std::array<TokenId, 256> byte_ids_{};
  bool bytes_cover_all_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  // Ids of single-character tokens below U+0200 (covers the byte-level
  // alphabet), so the common case needs no hashing; -1 where absent.
  static constexpr char32_t kSmallCharLimit = 0x200;
  std::array<TokenId, kSmallCharLimit> small_char_ids_{};
};

}  // namespace tandem::tokenizer_internal
