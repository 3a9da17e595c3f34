// Which agent slots hold each KV block hash, for OwnershipIndex.
//
// One flat array, open addressing with linear probing: an entry is the hash
// (two words) followed by words() words of slot bits. A routing decision walks
// every block of a prompt through this table, so a lookup should cost one
// cache miss, and the walk prefetches the entries a few blocks ahead
// (prefetch) so that the misses overlap. An entry exists exactly while some
// bit is set; removing the last bit removes the entry (backward-shift
// deletion, no tombstones). Not thread-safe: OwnershipIndex locks around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/block_hash.h"

namespace tandem::router {

class HolderTable {
 public:
  static constexpr size_t kSlotsPerWord = 64;

  // The slot bits of `hash` (words() words), or nullptr when no slot holds it.
  // Valid until the next set or reset.
  const uint64_t* find(const BlockHash& hash) const;
  // Word `index` of bits find() returned: 0 for nullptr (no holder) and for
  // words past words().
  uint64_t word(const uint64_t* bits, size_t index) const {
    return bits == nullptr || index >= words_ ? 0 : bits[index];
  }
  // Starts loading the cache line where `hash` would be found.
  void prefetch(const BlockHash& hash) const;
  // Marks `slot` as holding `hash`; the table grows (entries and bits per
  // entry) as needed.
  void set(const BlockHash& hash, size_t slot);
  // Unmarks it; the entry goes when its last bit does.
  void reset(const BlockHash& hash, size_t slot);

  size_t size() const { return size_; }
  // Bit words per entry: slots [0, 64 * words()) fit without growing.
  size_t words() const { return words_; }

 private:
  size_t stride() const { return 2 + words_; }
  size_t mask() const { return capacity_ - 1; }
  size_t home(const BlockHash& hash) const;
  const uint64_t* entry(size_t index) const { return data_.get() + index * stride(); }
  uint64_t* entry(size_t index) { return data_.get() + index * stride(); }
  bool occupied(size_t index) const;
  bool matches(size_t index, const BlockHash& hash) const;
  // Index of `hash`'s entry, or of the empty entry where it would go.
  size_t probe(const BlockHash& hash) const;
  void rebuild(size_t capacity, size_t words);
  void eraseAt(size_t index);

  struct Free {
    void operator()(uint64_t* data) const;
  };
  // capacity_ * stride() words, zeroed; large tables ask for huge pages, so
  // that a walk's misses are not also TLB misses.
  static std::unique_ptr<uint64_t[], Free> allocate(size_t words);

  std::unique_ptr<uint64_t[], Free> data_;
  size_t capacity_ = 0;  // entries; a power of two, or 0 before the first set
  size_t words_ = 1;
  size_t size_ = 0;
};

}  // namespace tandem::router
