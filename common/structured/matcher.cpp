#include "common/structured/matcher.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <numeric>

namespace tandem::structured {

namespace {

// Parents below every real stack node.
constexpr int32_t kBottom = -1;  // below the root rule: the sentence is complete
constexpr int32_t kEscape = -2;  // below a classified element: its rule was left

// Interned stack nodes and the automaton's moves. A node is a grammar
// position (the next element to match in some alternative) and the node
// to return to when that alternative ends. A frontier's tops are nodes
// whose position is a byte-set element.
class Stacks {
 public:
  struct Node {
    int32_t pos;
    int32_t parent;
  };
  struct Frontier {
    std::vector<int32_t> tops;
    bool complete = false;  // some stack emptied at kBottom
    bool escaped = false;   // some stack emptied at kEscape
    bool overflow = false;  // past the bounds: treated as no stack at all
    void clear() {
      tops.clear();
      complete = false;
      escaped = false;
      overflow = false;
    }
  };

  explicit Stacks(const Grammar& grammar) : g_(grammar) {}

  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const Grammar& grammar() const { return g_; }
  // Expansion steps since the stacks were made: what their work costs.
  int64_t totalVisits() const { return total_visits_; }
  // Expansion steps of the last start/advance: a function of its frontier
  // and byte alone.
  int64_t lastVisits() const { return visits_; }
  int64_t size() const { return static_cast<int64_t>(nodes_.size()); }
  void setEpochForTest(uint32_t epoch) { epoch_ = epoch; }

  int32_t intern(int32_t pos, int32_t parent) {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
    auto [it, inserted] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
    if (inserted) {
      nodes_.push_back(Node{pos, parent});
      stamp_.push_back(0);
    }
    return it->second;
  }

  // The frontier before any byte: the root rule's alternatives.
  void start(Frontier& out) {
    out.clear();
    nextEpoch();
    visits_ = 0;
    for (int32_t alternative : g_.rule_alternatives[static_cast<size_t>(g_.root)]) {
      expand(alternative, kBottom, out);
    }
    std::sort(out.tops.begin(), out.tops.end());
  }

  // The frontier of one position below `parent` (kEscape: classification).
  void startAt(int32_t pos, int32_t parent, Frontier& out) {
    out.clear();
    nextEpoch();
    visits_ = 0;
    expand(pos, parent, out);
  }

  void advance(std::span<const int32_t> tops, uint8_t byte, Frontier& out) {
    out.clear();
    nextEpoch();
    visits_ = 0;
    for (int32_t top : tops) {
      const Node n = node(top);
      const Element& e = g_.elements[static_cast<size_t>(n.pos)];
      if (g_.byte_sets[static_cast<size_t>(e.value)].contains(byte))
        expand(n.pos + 1, n.parent, out);
    }
    std::sort(out.tops.begin(), out.tops.end());
  }

  // Advances `tops` over `text`; true if every byte was consumed by some
  // stack. `out` then holds the frontier after the last byte.
  bool advanceAll(std::span<const int32_t> tops, std::string_view text, Frontier& out) {
    scratch_.tops.assign(tops.begin(), tops.end());
    for (size_t i = 0; i < text.size(); ++i) {
      advance(scratch_.tops, static_cast<uint8_t>(text[i]), out);
      if (out.overflow) return false;
      if (out.tops.empty()) return i + 1 == text.size() && (out.complete || out.escaped);
      if (i + 1 < text.size()) std::swap(scratch_.tops, out.tops);
    }
    return !text.empty();
  }

 private:
  // Every stack reachable from (pos, parent) without consuming a byte,
  // with a worklist: nested empty loops must not recurse once per step.
  void expand(int32_t pos, int32_t parent, Frontier& out) {
    work_.push_back(Node{pos, parent});
    while (!work_.empty()) {
      const Node item = work_.back();
      work_.pop_back();
      if (out.overflow) continue;
      ++total_visits_;
      if (++visits_ > kMaxVisits || out.tops.size() >= kMaxStacks || nodes_.size() >= kMaxNodes) {
        // A grammar this ambiguous (nested bounded repeats of the same
        // text) would cost more than any mask is worth.
        out.overflow = true;
        out.tops.clear();
        continue;
      }
      const int32_t id = intern(item.pos, item.parent);
      uint32_t& stamp = stamp_[static_cast<size_t>(id)];
      if (stamp == epoch_) continue;
      stamp = epoch_;
      const Element& e = g_.elements[static_cast<size_t>(item.pos)];
      switch (e.kind) {
        case Element::Kind::kBytes:
          out.tops.push_back(id);
          break;
        case Element::Kind::kEnd:
          if (item.parent == kBottom) {
            out.complete = true;
          } else if (item.parent == kEscape) {
            out.escaped = true;
          } else {
            work_.push_back(node(item.parent));
          }
          break;
        case Element::Kind::kRule: {
          // A reference in tail position returns straight to our parent, so
          // loops written as right recursion keep the stack's depth.
          const int32_t next = item.pos + 1;
          const int32_t below = g_.elements[static_cast<size_t>(next)].kind == Element::Kind::kEnd
                                    ? item.parent
                                    : intern(next, item.parent);
          for (int32_t alternative : g_.rule_alternatives[static_cast<size_t>(e.value)]) {
            work_.push_back(Node{alternative, below});
          }
          break;
        }
      }
    }
  }

  // A new expansion pass: a node is expanded once per pass (its stamp). At
  // the 32-bit counter's wrap every stamp is cleared, or stamps of long ago
  // would equal the new pass's and those nodes would be skipped.
  void nextEpoch() {
    if (++epoch_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0);
      epoch_ = 1;
    }
  }

  static constexpr size_t kMaxStacks = 10'000;      // tops of one frontier
  static constexpr int64_t kMaxVisits = 1'000'000;  // expansion steps of one move
  static constexpr size_t kMaxNodes = 4'000'000;    // interned nodes of one grammar

  const Grammar& g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
  Frontier scratch_;
  std::vector<Node> work_;
  int64_t visits_ = 0;        // since the last start/advance
  int64_t total_visits_ = 0;  // ever
};

struct VectorHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

void setBit(std::span<uint64_t> mask, TokenId id) {
  mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
}

}  // namespace

bool grammarAccepts(const Grammar& grammar, std::string_view text) {
  Stacks stacks(grammar);
  Stacks::Frontier frontier;
  stacks.start(frontier);
  if (frontier.overflow) return false;
  if (text.empty()) return frontier.complete;
  Stacks::Frontier after;
  if (!stacks.advanceAll(frontier.tops, text, after)) return false;
  return after.complete;
}

// ---- Vocabulary ----------------------------------------------------------------

Vocabulary::Vocabulary(const Tokenizer& tokenizer, int64_t size)
    : size_(std::max(size, tokenizer.vocabSize())) {
  bytes_.resize(static_cast<size_t>(size_));
  for (TokenId id = 0; id < tokenizer.vocabSize(); ++id) {
    if (!tokenizer.isSpecial(id)) bytes_[static_cast<size_t>(id)] = tokenizer.tokenBytes(id);
  }
  buildTrie();
}

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, int64_t size)
    : size_(std::max<int64_t>(size, static_cast<int64_t>(token_bytes.size()))),
      bytes_(std::move(token_bytes)) {
  bytes_.resize(static_cast<size_t>(size_));
  buildTrie();
}

bool Vocabulary::inTrie(TokenId id) const {
  return id >= 0 && id < size_ && !bytes_[static_cast<size_t>(id)].empty();
}

void Vocabulary::buildTrie() {
  std::vector<TokenId> sorted;
  for (TokenId id = 0; id < size_; ++id) {
    if (inTrie(id)) sorted.push_back(id);
  }
  std::sort(sorted.begin(), sorted.end(), [&](TokenId a, TokenId b) {
    const std::string& x = bytes(a);
    const std::string& y = bytes(b);
    return x != y ? x < y : a < b;
  });
  tokens_.clear();
  nodes_.assign(1, TrieNode{});
  // Breadth first, so each node's children are allocated together.
  struct Pending {
    int32_t node;
    size_t lo, hi;  // the sorted tokens below this node
    size_t depth;
  };
  std::deque<Pending> queue{{0, 0, sorted.size(), 0}};
  while (!queue.empty()) {
    const Pending p = queue.front();
    queue.pop_front();
    size_t i = p.lo;
    nodes_[static_cast<size_t>(p.node)].first_token = static_cast<int32_t>(tokens_.size());
    while (i < p.hi && bytes(sorted[i]).size() == p.depth) tokens_.push_back(sorted[i++]);
    nodes_[static_cast<size_t>(p.node)].num_tokens =
        static_cast<int32_t>(tokens_.size()) - nodes_[static_cast<size_t>(p.node)].first_token;
    if (i == p.hi) continue;
    nodes_[static_cast<size_t>(p.node)].first_child = static_cast<int32_t>(nodes_.size());
    while (i < p.hi) {
      const auto byte = static_cast<uint8_t>(bytes(sorted[i])[p.depth]);
      size_t j = i;
      while (j < p.hi && static_cast<uint8_t>(bytes(sorted[j])[p.depth]) == byte) ++j;
      TrieNode child;
      child.byte = byte;
      queue.push_back(Pending{static_cast<int32_t>(nodes_.size()), i, j, p.depth + 1});
      nodes_.push_back(child);
      ++nodes_[static_cast<size_t>(p.node)].num_children;
      i = j;
    }
  }
}

// ---- Compiled grammar ------------------------------------------------------------

namespace {

// Where a grammar's token classes live: exact-size arrays copied into
// chunks, the first of kFirstChunkBytes, each next twice the last up to
// kChunkBytes (a small grammar's classes take one small chunk). Classifying interleaves them with
// the memo it builds and drops (hundreds of MB for a 1,000-value enum): as three small vectors per
// element, grown as the walk went, they were scattered over those pages, which stayed resident once
// the memo was freed, 200 MB a grammar kept for its 9 MB of classes. In chunks, the pages between
// them are free whole and go back to the system.
class ClassStore {
 public:
  static constexpr size_t kFirstChunkBytes = size_t{64} << 10;
  static constexpr size_t kChunkBytes = size_t{1} << 20;

  template <typename T>
  std::span<const T> copy(const std::vector<T>& items) {
    static_assert(alignof(T) <= alignof(std::max_align_t));
    if (items.empty()) return {};
    const size_t size = items.size() * sizeof(T);
    const size_t at = (used_ + alignof(T) - 1) / alignof(T) * alignof(T);
    if (chunks_.empty() || at + size > capacity_) {
      const size_t next = chunks_.empty() ? kFirstChunkBytes : std::min(2 * capacity_, kChunkBytes);
      capacity_ = std::max(next, size);
      // Not value-initialized: only the pages written are touched.
      chunks_.push_back(std::unique_ptr<std::byte[]>(new std::byte[capacity_]));
      bytes_ += static_cast<int64_t>(capacity_);
      used_ = 0;
      return copy(items);
    }
    std::byte* into = chunks_.back().get() + at;
    std::memcpy(into, items.data(), size);
    used_ = at + size;
    return std::span<const T>(reinterpret_cast<const T*>(into), items.size());
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
  size_t used_ = 0;      // of the last chunk
  size_t capacity_ = 0;  // of the last chunk
  int64_t bytes_ = 0;
};

}  // namespace

struct CompiledGrammar::Runtime {
  // The tokens a byte-set element accepts on its own (in its grammar's
  // ClassStore).
  struct Classes {
    std::span<const uint64_t> accepted_words;  // when many: a bitmask
    std::span<const TokenId> accepted;         // otherwise: a list
    std::span<const TokenId> uncertain;        // leave the element's rule: check in context
    bool done = false;                         // classified
  };

  static constexpr size_t kMaxCachedMasks = 256;
  // Expansion steps one mask's context checks may cost, each distinct move
  // charged what computing it costs, memoized or not: milliseconds of work.
  static constexpr int64_t kMaxMaskCost = 1'000'000;
  std::vector<std::pair<int32_t, int32_t>> groups_;  // computeMask's (element, top) pairs
  Stacks::Frontier group_;                           // computeMask's tops of one element

  std::vector<int32_t> path_;  // followSorted's frontiers along a token

  // Interned frontiers and the byte moves between them, past which both
  // are dropped (at the start of an operation: no id is held across). The
  // frontiers' tops count too: a grammar of many optional repeats makes a
  // new frontier of up to a thousand tops at nearly every move, and a
  // million frontiers of up to 10,000 tops were allowed before.
  static constexpr size_t kMaxStates = 1'000'000;
  static constexpr size_t kMaxMoves = 4'000'000;
  static constexpr int64_t kMaxMemoInts = 32'000'000;  // tops held, key copies included: 128 MB
  int64_t max_memo_ints = kMaxMemoInts;
  int64_t memo_ints = 0;

  // Every element's classes, by element position, and their store.
  struct ClassTable {
    explicit ClassTable(size_t elements) : by_pos(elements) {}
    std::vector<Classes> by_pos;
    ClassStore store;
  };

  // Fresh stacks and memos. `classes`: a former generation's (they name
  // tokens and element positions, not stack nodes); none for the first,
  // whose are computed here.
  Runtime(const Grammar& grammar, const Vocabulary& vocabulary,
          std::shared_ptr<ClassTable> classes_before = nullptr)
      : stacks(grammar),
        vocab(vocabulary),
        classes(classes_before ? std::move(classes_before)
                               : std::make_shared<ClassTable>(grammar.elements.size())) {}

  // A frontier's id: its tops and flags.
  int32_t intern(const Stacks::Frontier& frontier) {
    std::vector<int32_t> key = frontier.tops;
    key.push_back(-1 - (frontier.complete ? 1 : 0) - (frontier.escaped ? 2 : 0) -
                  (frontier.overflow ? 4 : 0));
    auto [it, inserted] =
        state_index.try_emplace(std::move(key), static_cast<int32_t>(states.size()));
    if (inserted) {
      states.push_back(frontier);
      memo_ints += 2 * static_cast<int64_t>(frontier.tops.size()) + 1;
    }
    return it->second;
  }

  // A memoized move: the frontier it leads to, the expansion steps
  // computing it took, and the last mask that was charged for it.
  struct Move {
    int32_t next;
    int32_t cost;
    uint32_t charged;
  };

  // The frontier after `byte`, memoized: walks of the trie revisit the same
  // few frontiers at most of their nodes (every character of a string
  // leads back to one).
  int32_t move(int32_t state, uint8_t byte) { return moveEntry(state, byte).next; }

  Move& moveEntry(int32_t state, uint8_t byte) {
    const uint64_t key = (static_cast<uint64_t>(state) << 8) | byte;
    if (auto it = moves.find(key); it != moves.end()) return it->second;
    stacks.advance(states[static_cast<size_t>(state)].tops, byte, scratch);
    const auto cost = static_cast<int32_t>(stacks.lastVisits());
    const int32_t next = intern(scratch);
    return moves.emplace(key, Move{next, cost, 0}).first->second;
  }

  // move(), charging the mask being computed for each distinct move once,
  // whether it is computed now or was memoized before: a mask's cost is
  // then what computing it from nothing costs, the same whatever requests
  // came before (at least what it costs now, so the budget bounds time).
  int32_t chargedMove(int32_t state, uint8_t byte) {
    Move& m = moveEntry(state, byte);
    if (m.charged != mask_epoch_) {
      m.charged = mask_epoch_;
      mask_cost_ += m.cost;
    }
    return m.next;
  }

  void trimMemo() {
    if (states.size() > kMaxStates || moves.size() > kMaxMoves || memo_ints > max_memo_ints) {
      states.clear();
      state_index.clear();
      moves.clear();
      memo_ints = 0;
      ++stats.memo_trims;
    }
  }

  // Whether `text` can follow the frontier `state` (every byte consumed by
  // some stack); the frontier after it in *after.
  bool follow(int32_t state, std::string_view text, int32_t* after, bool* overflow = nullptr) {
    for (size_t i = 0; i < text.size(); ++i) {
      state = move(state, static_cast<uint8_t>(text[i]));
      const Stacks::Frontier& f = states[static_cast<size_t>(state)];
      if (f.overflow) {
        if (overflow != nullptr) *overflow = true;
        return false;
      }
      if (f.tops.empty()) {
        if (i + 1 != text.size() || !(f.complete || f.escaped)) return false;
        break;
      }
    }
    *after = state;
    return !text.empty();
  }

  const Classes& classesOf(int32_t pos) {
    Classes& slot = classes->by_pos[static_cast<size_t>(pos)];
    if (!slot.done) {
      slot = classify(pos);
      ++stats.classified;
    }
    return slot;
  }

  // The lists an element's walk collects (reused: a walk allocates nothing
  // once they have grown).
  struct Collected {
    std::vector<TokenId> accepted;
    std::vector<TokenId> uncertain;
    std::vector<uint64_t> words;
  };

  // One walk of the trie from the element alone (kEscape below it).
  Classes classify(int32_t pos) {
    collected_.accepted.clear();
    collected_.uncertain.clear();
    trimMemo();
    stacks.startAt(pos, kEscape, scratch);
    // A preorder walk of the trie: the uncertain tokens that share a prefix
    // come one after another, as followSorted needs.
    walk(vocab.trie()[0], intern(scratch), false, collected_);
    Classes out;
    out.done = true;
    ClassStore& store = classes->store;
    if (static_cast<int64_t>(collected_.accepted.size()) > vocab.maskWords()) {
      collected_.words.assign(static_cast<size_t>(vocab.maskWords()), 0);
      for (TokenId id : collected_.accepted) setBit(collected_.words, id);
      out.accepted_words = store.copy(collected_.words);
    } else {
      out.accepted = store.copy(collected_.accepted);
    }
    out.uncertain = store.copy(collected_.uncertain);
    return out;
  }

  void walk(const Vocabulary::TrieNode& at, int32_t state, bool escaped_above, Collected& out) {
    if (at.num_children == 0) return;
    const auto& trie = vocab.trie();
    for (int32_t c = at.first_child; c < at.first_child + at.num_children; ++c) {
      const Vocabulary::TrieNode& child = trie[static_cast<size_t>(c)];
      const int32_t next = move(state, child.byte);
      // Copies: walking deeper may grow `states`.
      const bool live = !states[static_cast<size_t>(next)].tops.empty();
      const bool escaped_here = states[static_cast<size_t>(next)].escaped;
      const bool escaped_below = escaped_above || escaped_here;
      for (TokenId id : vocab.tokensAt(child)) {
        if (live || escaped_here) {
          out.accepted.push_back(id);
        } else if (escaped_above) {
          out.uncertain.push_back(id);
        }
      }
      if (live) {
        walk(child, next, escaped_below, out);
      } else if (escaped_below) {
        collectBelow(child, out.uncertain);
      }
    }
  }

  void collectBelow(const Vocabulary::TrieNode& at, std::vector<TokenId>& out) {
    const auto& trie = vocab.trie();
    for (int32_t c = at.first_child; c < at.first_child + at.num_children; ++c) {
      const Vocabulary::TrieNode& child = trie[static_cast<size_t>(c)];
      for (TokenId id : vocab.tokensAt(child)) out.push_back(id);
      collectBelow(child, out);
    }
  }

  // The tokens some stack of `tops` takes: each top element's own tokens,
  // then the tokens that leave an element's rule, followed once per
  // element from the stacks it tops, all at once (a token is allowed when
  // some stack takes all its bytes: one walk per element, where a walk per
  // stack would repeat the shared prefixes' moves for every stack that
  // element tops). False, with an empty mask, when the walks cost more than
  // kMaxMaskCost expansion steps: a grammar that ambiguous is refused (the
  // request ends with kTooAmbiguous) rather than stalling the engine.
  bool computeMask(const std::vector<int32_t>& tops, std::span<uint64_t> mask) {
    std::fill(mask.begin(), mask.end(), 0);
    // Only here: a memo dropped within a mask would charge its moves twice.
    trimMemo();
    if (++mask_epoch_ == 0) {  // wrapped: no stamp may equal a new mask's
      for (auto& [key, m] : moves) m.charged = 0;
      mask_epoch_ = 1;
    }
    mask_cost_ = 0;
    // (element, top) pairs, by element; `tops` is sorted, so each
    // element's tops stay sorted, as a frontier's are.
    groups_.clear();
    for (int32_t top : tops) groups_.push_back({stacks.node(top).pos, top});
    std::stable_sort(groups_.begin(), groups_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < groups_.size();) {
      const int32_t pos = groups_[i].first;
      group_.clear();
      for (; i < groups_.size() && groups_[i].first == pos; ++i) {
        group_.tops.push_back(groups_[i].second);
      }
      const Classes& c = classesOf(pos);
      if (!c.accepted_words.empty()) {
        for (size_t w = 0; w < mask.size(); ++w) mask[w] |= c.accepted_words[w];
      }
      for (TokenId id : c.accepted) setBit(mask, id);
      if (!followSorted(intern(group_), c.uncertain, mask)) {
        std::fill(mask.begin(), mask.end(), 0);
        return false;
      }
    }
    stats.max_mask_cost = std::max(stats.max_mask_cost, mask_cost_);
    return true;
  }

  // follow() of every token of `sorted` from `start`, setting the bits of
  // those it accepts. `sorted` is in a trie's preorder (a token before the
  // tokens it is a prefix of, and the tokens under any prefix one after
  // another), so tokens sharing a prefix share its moves, and a prefix no
  // stack takes rules out the tokens after it that start with it, unread.
  // False when the mask's cost passes kMaxMaskCost.
  bool followSorted(int32_t start, std::span<const TokenId> sorted, std::span<uint64_t> mask) {
    constexpr size_t kNone = std::string::npos;
    path_.assign(1, start);  // path_[i]: the frontier after i bytes of `previous`
    std::string_view previous;
    size_t dead = kNone;  // `previous`'s prefix of this length is taken by no stack
    for (TokenId id : sorted) {
      const std::string& text = vocab.bytes(id);
      size_t common = 0;
      const size_t limit = std::min(previous.size(), text.size());
      while (common < limit && previous[common] == text[common]) ++common;
      if (dead != kNone && common >= dead) continue;
      previous = text;
      dead = kNone;
      path_.resize(std::min(common, path_.size() - 1) + 1);
      bool accepted = !text.empty();
      for (size_t i = path_.size() - 1; i < text.size(); ++i) {
        const int32_t next = chargedMove(path_.back(), static_cast<uint8_t>(text[i]));
        if (mask_cost_ > kMaxMaskCost) return false;
        const Stacks::Frontier& f = states[static_cast<size_t>(next)];
        if (f.overflow) {
          accepted = false;
          dead = i + 1;
          break;
        }
        if (f.tops.empty()) {
          // Only a token that ends here, where the grammar may end.
          accepted = i + 1 == text.size() && (f.complete || f.escaped);
          dead = i + 1;
          break;
        }
        path_.push_back(next);
      }
      if (accepted) setBit(mask, id);
    }
    return true;
  }

  // Every element's classes at once (compiling, off the engine's thread).
  void classifyAll() {
    for (size_t pos = 0; pos < stacks.grammar().elements.size(); ++pos) {
      if (stacks.grammar().elements[pos].kind == Element::Kind::kBytes) {
        classesOf(static_cast<int32_t>(pos));
      }
    }
  }

  // False (an empty mask) past the budget: see computeMask.
  bool fillMask(const std::vector<int32_t>& tops, std::span<uint64_t> mask) {
    auto it = masks.find(tops);
    if (it != masks.end()) {
      ++stats.mask_cache_hits;
      std::copy(it->second.begin(), it->second.end(), mask.begin());
      return true;
    }
    ++stats.mask_cache_misses;
    if (!computeMask(tops, mask)) return false;
    if (masks.size() >= kMaxCachedMasks) masks.clear();
    masks.emplace(tops, std::vector<uint64_t>(mask.begin(), mask.end()));
    return true;
  }

  Stacks stacks;
  const Vocabulary& vocab;
  std::shared_ptr<ClassTable> classes;  // shared by the grammar's generations
  Collected collected_;                 // classify's
  std::unordered_map<std::vector<int32_t>, std::vector<uint64_t>, VectorHash> masks;
  std::vector<Stacks::Frontier> states;
  std::unordered_map<std::vector<int32_t>, int32_t, VectorHash> state_index;
  std::unordered_map<uint64_t, Move> moves;
  uint32_t mask_epoch_ = 0;  // computeMask's, starting at 1
  int64_t mask_cost_ = 0;    // the mask being computed
  Stacks::Frontier scratch;
  Stats stats;
};

namespace {
void addCounts(CompiledGrammar::Stats& into, const CompiledGrammar::Stats& from);
}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      runtime_(std::make_shared<Runtime>(grammar_, *vocabulary_)) {
  // Here, where a request is admitted, rather than at its first steps on
  // the engine's thread: a string's element walks the whole vocabulary.
  runtime_->classifyAll();
  // The stacks and memo that classifying built (hundreds of MB for a
  // 1,000-value enum) are not what requests will follow: a cached grammar
  // keeps its classes and starts a fresh generation for its matchers.
  addCounts(retired_, currentStats());
  runtime_ = std::make_shared<Runtime>(grammar_, *vocabulary_, runtime_->classes);
}

CompiledGrammar::~CompiledGrammar() = default;

int64_t CompiledGrammar::approxBytes() const {
  auto bytesOf = [](const auto& vector) {
    return static_cast<int64_t>(vector.capacity() * sizeof(vector[0]));
  };
  int64_t bytes = bytesOf(grammar_.elements) + bytesOf(grammar_.byte_sets);
  for (const auto& starts : grammar_.rule_alternatives) bytes += bytesOf(starts) + 24;
  std::lock_guard lock(mutex_);
  const Runtime& runtime = *runtime_;
  bytes += bytesOf(runtime.classes->by_pos) + runtime.classes->store.bytes();
  // Hash-map entries cost about their node and bucket besides the payload.
  constexpr int64_t kNode = 48;
  bytes += runtime.memo_ints * static_cast<int64_t>(sizeof(int32_t)) +
           static_cast<int64_t>(runtime.states.size()) * (kNode + sizeof(Stacks::Frontier)) +
           static_cast<int64_t>(runtime.moves.size()) * kNode;
  for (const auto& [tops, mask] : runtime.masks) bytes += kNode + bytesOf(tops) + bytesOf(mask);
  bytes += runtime.stacks.size() * kNode;
  return bytes;
}

void CompiledGrammar::setMemoBoundForTest(int64_t bytes) {
  std::lock_guard lock(mutex_);
  runtime_->max_memo_ints = bytes / static_cast<int64_t>(sizeof(int32_t));
}

void CompiledGrammar::setEpochsForTest(uint32_t epoch) {
  std::lock_guard lock(mutex_);
  runtime_->stacks.setEpochForTest(epoch);
  runtime_->mask_epoch_ = epoch;
}

namespace {

// Adds the counts of `from` (one generation's, or several's) to `into`;
// nodes and memo_bytes are the newest generation's alone.
void addCounts(CompiledGrammar::Stats& into, const CompiledGrammar::Stats& from) {
  into.visits += from.visits;
  into.classified += from.classified;
  into.mask_cache_hits += from.mask_cache_hits;
  into.mask_cache_misses += from.mask_cache_misses;
  into.max_mask_cost = std::max(into.max_mask_cost, from.max_mask_cost);
  into.generations += from.generations;
  into.memo_trims += from.memo_trims;
}

}  // namespace

CompiledGrammar::Stats CompiledGrammar::currentStats() const {
  Stats stats = runtime_->stats;
  stats.nodes = runtime_->stacks.size();
  stats.visits = runtime_->stacks.totalVisits();
  stats.memo_bytes = runtime_->memo_ints * static_cast<int64_t>(sizeof(int32_t));
  stats.generations = 1;
  return stats;
}

CompiledGrammar::Stats CompiledGrammar::stats() const {
  std::lock_guard lock(mutex_);
  Stats stats = currentStats();
  addCounts(stats, retired_);
  return stats;
}

// ---- Matcher ---------------------------------------------------------------------

std::shared_ptr<CompiledGrammar::Runtime> CompiledGrammar::currentRuntime() {
  // Stack nodes are interned for good (a matcher's state is node ids), so
  // each distinct nesting ever followed would stay and, past the node
  // bound, every later request would overflow: a request starts a new
  // generation once the current one is this large, and a generation is
  // freed with its last matcher.
  constexpr int64_t kNewGenerationNodes = 1'000'000;
  if (runtime_->stacks.size() > kNewGenerationNodes) {
    addCounts(retired_, currentStats());
    runtime_ = std::make_shared<Runtime>(grammar_, *vocabulary_, runtime_->classes);
  }
  return runtime_;
}

Matcher::Matcher(std::shared_ptr<CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  std::lock_guard lock(grammar_->mutex_);
  runtime_ = grammar_->currentRuntime();
  Stacks::Frontier frontier;
  runtime_->stacks.start(frontier);
  tops_ = std::move(frontier.tops);
  can_end_ = frontier.complete;
  overflowed_ = frontier.overflow;
}

void Matcher::fillMask(std::span<uint64_t> mask) {
  std::lock_guard lock(grammar_->mutex_);
  if (overflowed_ || !runtime_->fillMask(tops_, mask)) {
    overflowed_ = true;
    std::fill(mask.begin(), mask.end(), 0);
  }
}

bool Matcher::accept(TokenId token) {
  const Vocabulary& vocab = grammar_->vocabulary();
  if (overflowed_ || !vocab.inTrie(token)) return false;
  std::lock_guard lock(grammar_->mutex_);
  CompiledGrammar::Runtime& runtime = *runtime_;
  runtime.trimMemo();
  Stacks::Frontier now;
  now.tops = tops_;
  int32_t after = 0;
  bool overflow = false;
  if (!runtime.follow(runtime.intern(now), vocab.bytes(token), &after, &overflow)) {
    overflowed_ = overflowed_ || overflow;
    return false;
  }
  const Stacks::Frontier& next = runtime.states[static_cast<size_t>(after)];
  tops_ = next.tops;
  can_end_ = next.complete;
  return true;
}

}  // namespace tandem::structured
