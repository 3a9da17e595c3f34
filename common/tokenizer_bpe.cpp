#include "common/tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/thread_scratch.h"
#include "common/tokenizer_utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// A string field that may be absent or null; empty then.
std::string optionalString(const nlohmann::json& object, const char* key, std::string_view source) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_string()) {
    throw Error(std::string(source) + ": model." + key + " must be a string or null");
  }
  return it->get<std::string>();
}

bool optionalBool(const nlohmann::json& object, const char* key, std::string_view source) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    throw Error(std::string(source) + ": model." + key + " must be true, false or null");
  }
  return it->get<bool>();
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, std::string_view source) {
  const std::string where(source);
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    // Dropout makes encoding random; a serving tokenizer must be
    // deterministic.
    throw Error(where + ": BPE dropout is not supported (model.dropout must be null or 0)");
  }
  fuse_unk_ = optionalBool(model, "fuse_unk", source);
  byte_fallback_ = optionalBool(model, "byte_fallback", source);
  ignore_merges_ = optionalBool(model, "ignore_merges", source);
  continuing_subword_prefix_ = optionalString(model, "continuing_subword_prefix", source);
  end_of_word_suffix_ = optionalString(model, "end_of_word_suffix", source);

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    throw Error(where + ": model.vocab must be an object mapping tokens to ids");
  }
  size_t key_bytes = 0;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) key_bytes += it.key().size();
  vocab_.reserve(vocab->size(), key_bytes);
  TokenId max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const nlohmann::json& value = it.value();
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kMaxTokenIds) {
      throw Error(where + ": model.vocab entry '" + it.key() + "' must have an integer id in [0, " +
                  std::to_string(kMaxTokenIds) + "), got " + value.dump());
    }
    const auto id = static_cast<TokenId>(value.get<int64_t>());
    vocab_.insertOrAssign(it.key(), id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string_view());
  small_char_ids_.fill(-1);
  vocab_.forEach([&](std::string_view token, TokenId id) {
    if (id_to_token_[id].data() != nullptr) {
      // Two tokens for one id: decoding it would be ambiguous.
      const auto [first, second] = std::minmax(id_to_token_[id], token);
      throw Error(where + ": model.vocab gives id " + std::to_string(id) + " to both '" +
                  std::string(first) + "' and '" + std::string(second) + "'");
    }
    id_to_token_[id] = token;
    if (token.empty()) return;
    size_t pos = 0;
    const char32_t cp = nextCodepoint(token, pos);
    if (pos == token.size() && cp < kSmallCharLimit) small_char_ids_[cp] = id;
  });

  byte_ids_.fill(-1);
  if (byte_fallback_) {
    bytes_cover_all_ = true;
    for (int byte = 0; byte < 256; ++byte) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", byte);
      if (const TokenId* id = vocab_.find(name)) byte_ids_[static_cast<size_t>(byte)] = *id;
      bytes_cover_all_ = bytes_cover_all_ && byte_ids_[static_cast<size_t>(byte)] >= 0;
    }
  }

  const std::string unk = optionalString(model, "unk_token", source);
  if (!unk.empty()) {
    const TokenId* id = vocab_.find(unk);
    if (id == nullptr) {
      throw Error(where + ": model.unk_token '" + unk + "' is not in model.vocab");
    }
    unk_id_ = *id;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || merges->is_null()) return;
  if (!merges->is_array()) throw Error(where + ": model.merges must be an array");
  merges_.reserve(merges->size());
  // The prefix marks a token that continues a word; a merge glues the right
  // part on without repeating it.
  const size_t prefix_len = continuing_subword_prefix_.size();
  uint32_t rank = 0;
  std::string left;
  std::string right;
  std::string merged;
  for (const nlohmann::json& merge : *merges) {
    // Two spellings exist: "left right" (older files, tokens never contain a
    // space) and ["left", "right"] (newer files, where they may).
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw Error(where + ": merge " + std::to_string(rank) + " '" + text +
                    "' must be two tokens separated by one space");
      }
      left.assign(text, 0, space);
      right.assign(text, space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw Error(where + ": merge " + std::to_string(rank) +
                  " must be a \"left right\" string or a [\"left\", \"right\"] pair, got " +
                  merge.dump());
    }
    const TokenId* left_id = vocab_.find(left);
    const TokenId* right_id = vocab_.find(right);
    if (left_id == nullptr || right_id == nullptr) {
      throw Error(where + ": merge " + std::to_string(rank) + " ('" + left + "', '" + right +
                  "') uses a token that is not in model.vocab");
    }
    merged = left;
    if (prefix_len > 0 && right.compare(0, prefix_len, continuing_subword_prefix_) == 0) {
      merged.append(right, prefix_len);
    } else {
      merged += right;
    }
    const TokenId* merged_id = vocab_.find(merged);
    if (merged_id == nullptr) {
      throw Error(where + ": merge " + std::to_string(rank) + " ('" + left + "', '" + right +
                  "') produces '" + merged + "', which is not in model.vocab");
    }
    // A repeated pair keeps its last rank, as Hugging Face's map does.
    merges_.insertOrAssign(pairKey(*left_id, *right_id), Merge{rank, *merged_id});
    ++rank;
  }
}

std::optional<TokenId> BpeModel::tokenToId(std::string_view token) const {
  const TokenId* id = vocab_.find(token);
  if (id == nullptr) return std::nullopt;
  return *id;
}

std::optional<std::string_view> BpeModel::idToToken(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() ||
      id_to_token_[id].data() == nullptr) {
    return std::nullopt;
  }
  return id_to_token_[id];
}

const BpeModel::Merge* BpeModel::findMerge(TokenId left, TokenId right) const {
  return merges_.find(pairKey(left, right));
}

void BpeModel::splitIntoSymbols(std::string_view word, std::vector<TokenId>& ids) const {
  const bool plain = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  // Unknown characters waiting to be emitted as unk_token (several of them
  // fused into one when fuse_unk is set).
  bool pending_unk = false;
  std::string piece;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    const char32_t cp = nextCodepoint(word, pos);
    std::optional<TokenId> id;
    if (plain) {
      if (cp < kSmallCharLimit) {
        if (small_char_ids_[cp] >= 0) id = small_char_ids_[cp];
      } else {
        id = tokenToId(word.substr(start, pos - start));
      }
      piece.assign(word, start, pos - start);
    } else {
      piece.clear();
      if (start != 0) piece += continuing_subword_prefix_;
      piece.append(word, start, pos - start);
      if (pos == word.size()) piece += end_of_word_suffix_;
      id = tokenToId(piece);
    }
    if (id) {
      if (pending_unk) ids.push_back(*unk_id_);
      pending_unk = false;
      ids.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      const size_t mark = ids.size();
      bool all_found = true;
      for (char c : piece) {
        const TokenId byte_id = byte_ids_[static_cast<unsigned char>(c)];
        if (byte_id < 0) {
          all_found = false;
          break;
        }
        ids.push_back(byte_id);
      }
      if (all_found) {
        // The unk run ends before these bytes; emit it in front of them.
        if (pending_unk) ids.insert(ids.begin() + static_cast<ptrdiff_t>(mark), *unk_id_);
        pending_unk = false;
        continue;
      }
      ids.resize(mark);
    }
    // Without an unk token the character is dropped, as Hugging Face does.
    if (!unk_id_) continue;
    if (pending_unk && !fuse_unk_) ids.push_back(*unk_id_);
    pending_unk = true;
  }
  if (pending_unk) ids.push_back(*unk_id_);
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    // Llama 3: a word that is a token as a whole is taken as is, even if the
    // merges would split it differently.
    if (auto id = tokenToId(word)) {
      out.push_back(*id);
      return;
    }
  }
  // Scratch buffers reused across calls on this thread; tokenize is not
  // re-entrant, so one set per thread is enough.
  thread_local std::vector<TokenId> ids;
  thread_local std::vector<int> prev;
  thread_local std::vector<int> next;
  struct Candidate {
    uint32_t rank;
    int pos;
    TokenId merged_id;
    // Max-heap order reversed: lowest rank first, then leftmost.
    bool operator<(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  thread_local std::vector<Candidate> heap;
  const ScratchTrim trim(ids, prev, next, heap);

  ids.clear();
  splitIntoSymbols(word, ids);
  const int n = static_cast<int>(ids.size());
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n) {
      if (const Merge* merge = findMerge(ids[i], ids[i + 1])) {
        heap.push_back({merge->rank, i, merge->merged_id});
      }
    }
  }
  std::make_heap(heap.begin(), heap.end());
  // A symbol that was merged into its left neighbour is marked dead by
  // prev == kDead; heap entries that refer to stale pairs are skipped.
  constexpr int kDead = -2;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    const int left = top.pos;
    if (prev[left] == kDead) continue;
    const int right = next[left];
    if (right < 0) continue;
    const Merge* current = findMerge(ids[left], ids[right]);
    if (current == nullptr || current->merged_id != top.merged_id) continue;

    ids[left] = top.merged_id;
    next[left] = next[right];
    prev[right] = kDead;
    if (next[left] >= 0) prev[next[left]] = left;

    if (prev[left] >= 0) {
      if (const Merge* merge = findMerge(ids[prev[left]], ids[left])) {
        heap.push_back({merge->rank, prev[left], merge->merged_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (next[left] >= 0) {
      if (const Merge* merge = findMerge(ids[left], ids[next[left]])) {
        heap.push_back({merge->rank, left, merge->merged_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace tandem::tokenizer_internal
