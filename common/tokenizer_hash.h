// Open-addressing hash tables for the tokenizer's vocabulary and merges.
//
// Both are filled once at load and only read afterwards, so they can be flat
// arrays with linear probing: a lookup is one or two cache lines instead of
// the pointer chase of std::unordered_map, which matters when loading means
// ~10^6 lookups and encoding one per character pair. Reads are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::tokenizer_internal {

// String -> int32 map. Keys are copied into one arena; a slot holds the
// key's place in it, so a lookup touches the slot and the key bytes only.
class StringIdTable {
 public:
  // Adds or replaces the value of `key`.
  void insertOrAssign(std::string_view key, int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    const uint64_t hash = hashOf(key);
    Slot& slot = slots_[findSlot(key, hash)];
    if (slot.length != kEmptyLength) {
      slot.value = value;
      return;
    }
    slot = {static_cast<uint32_t>(hash >> 32), value, static_cast<uint32_t>(arena_.size()),
            static_cast<uint32_t>(key.size())};
    arena_.append(key);
    ++size_;
  }
  void reserve(size_t count, size_t key_bytes) {
    arena_.reserve(key_bytes);
    size_t capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    if (capacity > slots_.size()) rehash(capacity);
  }
  const int32_t* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    const Slot& slot = slots_[findSlot(key, hashOf(key))];
    return slot.length == kEmptyLength ? nullptr : &slot.value;
  }
  size_t size() const { return size_; }
  // Calls fn(key, value) for every entry, in no particular order. The keys
  // stay valid until the table is next modified.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (const Slot& slot : slots_) {
      if (slot.length != kEmptyLength) fn(keyOf(slot), slot.value);
    }
  }

 private:
  static constexpr uint32_t kEmptyLength = ~uint32_t{0};
  struct Slot {
    uint32_t hash_bits = 0;  // High half of the hash; the low half picks the slot.
    int32_t value = 0;
    uint32_t offset = 0;
    uint32_t length = kEmptyLength;
  };
  static uint64_t hashOf(std::string_view key) { return std::hash<std::string_view>{}(key); }
  std::string_view keyOf(const Slot& slot) const {
    return std::string_view(arena_).substr(slot.offset, slot.length);
  }
  size_t findSlot(std::string_view key, uint64_t hash) const {
    const size_t mask = slots_.size() - 1;
    const auto hash_bits = static_cast<uint32_t>(hash >> 32);
    size_t index = static_cast<size_t>(hash) & mask;
    while (true) {
      const Slot& slot = slots_[index];
      if (slot.length == kEmptyLength) return index;
      if (slot.hash_bits == hash_bits && slot.length == key.size() && keyOf(slot) == key) {
        return index;
      }
      index = (index + 1) & mask;
    }
  }
  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    const size_t mask = capacity - 1;
    for (const Slot& slot : old) {
      if (slot.length == kEmptyLength) continue;
      size_t index = static_cast<size_t>(hashOf(keyOf(slot))) & mask;
      while (slots_[index].length != kEmptyLength) index = (index + 1) & mask;
      slots_[index] = slot;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// uint64 -> Value map; the all-ones key is reserved as the empty marker.
template <typename Value>
class U64Table {
 public:
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};

  void reserve(size_t count) {
    size_t capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    if (capacity > slots_.size()) rehash(capacity);
  }
  void insertOrAssign(uint64_t key, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    size_t slot = findSlot(key);
    if (slots_[slot].first == kEmptyKey) ++size_;
    slots_[slot] = {key, value};
  }
  const Value* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    const size_t slot = findSlot(key);
    return slots_[slot].first == kEmptyKey ? nullptr : &slots_[slot].second;
  }
  size_t size() const { return size_; }

 private:
  static size_t mix(uint64_t key) {
    // splitmix64's finalizer: spreads the two packed ids over all bits.
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ULL;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebULL;
    key ^= key >> 31;
    return static_cast<size_t>(key);
  }
  size_t findSlot(uint64_t key) const {
    const size_t mask = slots_.size() - 1;
    size_t slot = mix(key) & mask;
    while (slots_[slot].first != kEmptyKey && slots_[slot].first != key) slot = (slot + 1) & mask;
    return slot;
  }
  void rehash(size_t capacity) {
    std::vector<std::pair<uint64_t, Value>> old = std::move(slots_);
    slots_.assign(capacity, {kEmptyKey, Value{}});
    for (const auto& [key, value] : old) {
      if (key != kEmptyKey) slots_[findSlot(key)] = {key, value};
    }
  }

  std::vector<std::pair<uint64_t, Value>> slots_;
  size_t size_ = 0;
};

}  // namespace tandem::tokenizer_internal
