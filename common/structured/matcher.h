// Runs a Grammar (grammar.h) over a tokenizer's vocabulary: which tokens may
// come next, and the state after a token.
//
// The grammar runs as a pushdown automaton over bytes. A state is a set of
// stacks; each stack is a chain of nodes (grammar position, parent node),
// interned so equal stacks are one id and a loop (right recursion) never
// deepens a stack. The allowed-token mask for a state is the union, over
// its stacks, of:
//   - the tokens the stack's top element accepts whatever lies below it
//     (computed once per grammar element with one walk of the vocabulary's
//     byte trie whose moves between frontiers are memoized), and
//   - of the tokens whose fate depends on what lies below (they leave the
//     top rule), those that the whole stack accepts, checked one by one.
// Masks are also cached per state, shared by every request of the grammar.
//
// Thread-safety: a CompiledGrammar is shared (e.g. by every request with
// the same schema) and locks itself; a Matcher belongs to one request and
// is used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/structured/grammar.h"
#include "common/tokenizer.h"

namespace tandem::structured {

// Whether the grammar derives exactly `text` (a reference recognizer for
// tests and for checking a finished output).
bool grammarAccepts(const Grammar& grammar, std::string_view text);

// A tokenizer's tokens as bytes, in a trie. Special tokens and tokens
// without bytes are not in the trie: no grammar allows them; the end of
// sequence is the caller's (Matcher::canEnd).
class Vocabulary {
 public:
  // `size`: the model's vocabulary size (at least the tokenizer's; ids past
  // the tokenizer's are never allowed).
  Vocabulary(const Tokenizer& tokenizer, int64_t size);
  // From explicit token bytes (tests); empty strings are left out.
  Vocabulary(std::vector<std::string> token_bytes, int64_t size);

  int64_t size() const { return size_; }
  int64_t maskWords() const { return (size_ + 63) / 64; }
  const std::string& bytes(TokenId id) const { return bytes_[static_cast<size_t>(id)]; }
  bool inTrie(TokenId id) const;

  struct TrieNode {
    int32_t first_child = -1;  // children are consecutive in nodes_, sorted by byte
    int32_t num_children = 0;
    int32_t first_token = 0;  // tokens_[first_token, +num_tokens) end here
    int32_t num_tokens = 0;
    uint8_t byte = 0;  // the edge into this node
  };
  const std::vector<TrieNode>& trie() const { return nodes_; }
  std::span<const TokenId> tokensAt(const TrieNode& node) const {
    return std::span<const TokenId>(tokens_).subspan(static_cast<size_t>(node.first_token),
                                                     static_cast<size_t>(node.num_tokens));
  }

 private:
  void buildTrie();

  int64_t size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<TrieNode> nodes_;  // nodes_[0] is the root
  std::vector<TokenId> tokens_;
};

// A grammar bound to a vocabulary, with its caches: every element's token
// classes, computed when it is built (so a request's first steps do not
// walk the vocabulary on the engine's thread), and, filled as they are
// met, masks per state and the automaton's moves between frontiers. Stack
// nodes, masks and moves live in a generation: once the interned nodes pass
// a million, the next request starts a new one, and an old one is freed
// with its last matcher, so no history of requests fills the node bound.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary);
  ~CompiledGrammar();

  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }

  struct Stats {
    int64_t nodes = 0;       // interned stack nodes
    int64_t visits = 0;      // expansion steps so far: the work the grammar cost
    int64_t classified = 0;  // elements whose token classes are computed
    int64_t mask_cache_hits = 0;
    int64_t mask_cache_misses = 0;
    int64_t max_mask_cost = 0;  // the costliest mask computed (see fillMask), steps
    int64_t generations = 0;    // of stacks and memos (below)
    int64_t memo_bytes = 0;     // the frontiers the memo holds now (their tops)
    int64_t memo_trims = 0;     // times the memo was dropped, past its bounds
  };
  Stats stats() const;
  // The memory it holds, approximately: its grammar, the token classes of
  // its elements, the newest generation's stacks, memo and cached masks.
  int64_t approxBytes() const;
  // Tests: the current generation's pass counters (expansion passes and
  // masks) as if that many had run, to cross their 32-bit wrap.
  void setEpochsForTest(uint32_t epoch);
  // Tests: the memo's bound in bytes of frontier tops (default 128 MB).
  void setMemoBoundForTest(int64_t bytes);

 private:
  friend class Matcher;
  struct Runtime;

  // The generation new matchers start in (guarded by mutex_).
  std::shared_ptr<Runtime> currentRuntime();
  // The newest generation's stats alone (mutex_ held).
  Stats currentStats() const;

  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  mutable std::mutex mutex_;
  // Guarded by mutex_: the stacks and memos of the newest generation (a
  // matcher keeps the one it started in), and the older ones' counts.
  std::shared_ptr<Runtime> runtime_;
  Stats retired_;
};

// One request's position in a grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> grammar);

  // Writes the allowed tokens, one bit per id (bit i of word i / 64), into
  // `mask` (Vocabulary::maskWords() words). The end of sequence is not in
  // it: it is allowed exactly when canEnd(). A mask that costs more than its
  // budget to compute leaves the matcher overflowed() and the mask empty.
  void fillMask(std::span<uint64_t> mask);
  // Advances over a token's bytes; false (state unchanged) if the grammar
  // does not allow it.
  bool accept(TokenId token);
  // The output so far is a complete sentence of the grammar.
  bool canEnd() const { return can_end_; }
  // Nothing can follow: only the end of sequence is allowed.
  bool finished() const { return tops_.empty(); }
  // The grammar proved too ambiguous to follow (nested bounded repeats of
  // the same text: more stacks or expansion steps than the bounds allow, in
  // a move or in a mask); nothing is allowed from then on.
  bool overflowed() const { return overflowed_; }

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  // The generation of stacks tops_ are nodes of (guarded by grammar_'s mutex).
  std::shared_ptr<CompiledGrammar::Runtime> runtime_;
  std::vector<int32_t> tops_;  // sorted node ids
  bool can_end_ = false;
  bool overflowed_ = false;
};

}  // namespace tandem::structured
