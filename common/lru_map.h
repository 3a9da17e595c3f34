// Entries kept in order of use, found by key in O(1): the bookkeeping of a
// least-recently-used cache (what to drop is the caller's: a file, a
// compiled grammar). Not thread-safe.
#pragma once

#include <cstddef>
#include <iterator>
#include <list>
#include <unordered_map>
#include <utility>

namespace tandem {

template <typename Key, typename Value>
class LruMap {
 public:
  // The value under `key`, now the most recently used; null when absent.
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }
  // Adds (or replaces) `key` as the most recently used.
  Value& put(const Key& key, Value value) {
    if (Value* found = find(key)) return *found = std::move(value);
    entries_.emplace_front(key, std::move(value));
    index_.emplace(key, entries_.begin());
    return entries_.front().second;
  }
  // The least recently used entry; size() must be above 0.
  const std::pair<Key, Value>& oldest() const { return entries_.back(); }
  void popOldest() {
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
  size_t size() const { return entries_.size(); }
  // Calls f(key, value) for every entry, most recently used first, without
  // changing their order.
  template <typename F>
  void forEach(F&& f) {
    for (auto& [key, value] : entries_) f(key, value);
  }

 private:
  std::list<std::pair<Key, Value>> entries_;  // most recently used first
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator> index_;
};

}  // namespace tandem
