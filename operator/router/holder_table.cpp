#include "operator/router/holder_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>

namespace tandem::router {
namespace {

// Entries per table stay under 3/4 of the capacity: linear probing's probe
// lengths stay short there.
constexpr size_t kMinCapacity = 64;

bool tooFull(size_t size, size_t capacity) { return 4 * size > 3 * capacity; }

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

void HolderTable::Free::operator()(uint64_t* data) const { std::free(data); }

std::unique_ptr<uint64_t[], HolderTable::Free> HolderTable::allocate(size_t words) {
  const size_t bytes = words * sizeof(uint64_t);
  const bool huge = bytes >= kHugePage;
  const size_t alignment = huge ? kHugePage : alignof(std::max_align_t);
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, rounded);
  if (data == nullptr) throw std::bad_alloc();
  // Advice only: where transparent huge pages are off this does nothing.
  if (huge) madvise(data, rounded, MADV_HUGEPAGE);
  std::memset(data, 0, rounded);
  return std::unique_ptr<uint64_t[], Free>(static_cast<uint64_t*>(data));
}

size_t HolderTable::home(const BlockHash& hash) const {
  return std::hash<BlockHash>{}(hash)&mask();
}

bool HolderTable::occupied(size_t index) const {
  const uint64_t* bits = entry(index) + 2;
  return std::any_of(bits, bits + words_, [](uint64_t word) { return word != 0; });
}

bool HolderTable::matches(size_t index, const BlockHash& hash) const {
  const uint64_t* e = entry(index);
  return e[0] == hash.high && e[1] == hash.low;
}

size_t HolderTable::probe(const BlockHash& hash) const {
  size_t index = home(hash);
  while (occupied(index) && !matches(index, hash)) index = (index + 1) & mask();
  return index;
}

const uint64_t* HolderTable::find(const BlockHash& hash) const {
  if (size_ == 0) return nullptr;
  const size_t index = probe(hash);
  return occupied(index) ? entry(index) + 2 : nullptr;
}

void HolderTable::prefetch(const BlockHash& hash) const {
  if (capacity_ != 0) __builtin_prefetch(entry(home(hash)));
}

void HolderTable::set(const BlockHash& hash, size_t slot) {
  const size_t word = slot / kSlotsPerWord;
  if (capacity_ == 0 || word >= words_ || tooFull(size_ + 1, capacity_)) {
    size_t capacity = std::max(capacity_, kMinCapacity);
    while (tooFull(size_ + 1, capacity)) capacity *= 2;
    rebuild(capacity, std::max(words_, word + 1));
  }
  const size_t index = probe(hash);
  uint64_t* e = entry(index);
  if (!occupied(index)) {
    e[0] = hash.high;
    e[1] = hash.low;
    ++size_;
  }
  e[2 + word] |= uint64_t{1} << (slot % kSlotsPerWord);
}

void HolderTable::reset(const BlockHash& hash, size_t slot) {
  const size_t word = slot / kSlotsPerWord;
  if (size_ == 0 || word >= words_) return;
  const size_t index = probe(hash);
  if (!occupied(index)) return;
  entry(index)[2 + word] &= ~(uint64_t{1} << (slot % kSlotsPerWord));
  if (!occupied(index)) eraseAt(index);
}

void HolderTable::eraseAt(size_t hole) {
  // The entry at `hole` is already empty (no bits). Pull back every later
  // entry of the run whose home is not cyclically in (hole, index]: leaving
  // it would put the hole between it and its home.
  --size_;
  size_t index = hole;
  while (true) {
    index = (index + 1) & mask();
    if (!occupied(index)) return;
    const size_t want = home(BlockHash{entry(index)[0], entry(index)[1]});
    const bool stays =
        hole <= index ? (hole < want && want <= index) : (hole < want || want <= index);
    if (stays) continue;
    std::copy(entry(index), entry(index) + stride(), entry(hole));
    std::fill(entry(index) + 2, entry(index) + stride(), uint64_t{0});
    hole = index;
  }
}

void HolderTable::rebuild(size_t capacity, size_t words) {
  const std::unique_ptr<uint64_t[], Free> old = std::move(data_);
  const size_t old_capacity = capacity_;
  const size_t old_stride = stride();
  capacity_ = capacity;
  words_ = words;
  data_ = allocate(capacity_ * stride());
  for (size_t i = 0; i < old_capacity; ++i) {
    const uint64_t* e = old.get() + i * old_stride;
    const uint64_t* bits = e + 2;
    if (std::none_of(bits, bits + (old_stride - 2), [](uint64_t w) { return w != 0; })) continue;
    const BlockHash hash{e[0], e[1]};
    uint64_t* to = entry(probe(hash));
    std::copy(e, e + old_stride, to);
  }
}

}  // namespace tandem::router
