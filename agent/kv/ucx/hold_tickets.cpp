#include "agent/kv/ucx/hold_tickets.h"

#include <atomic>
#include <cstring>

namespace tandem::kv {

namespace {

// The word as one aligned 8-byte object, stored whole (never torn); the
// fence keeps later stores (the blocks' reuse, after their return to the
// pool) from being seen before it.
void storeWord(uint8_t* word, const HoldTickets::Ticket& value) {
  uint64_t bits = 0;
  std::memcpy(&bits, value.data(), sizeof(bits));
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(word))
      .store(bits, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace

HoldTickets::HoldTickets(uint8_t* words, int64_t capacity, uint64_t first_ticket)
    : words_(words), capacity_(capacity), next_(first_ticket) {
  free_.reserve(static_cast<size_t>(capacity));
  for (int64_t slot = capacity - 1; slot >= 0; --slot) free_.push_back(slot);
}

HoldTickets::Ticket HoldTickets::ticketFor(uint64_t n) {
  Ticket ticket{};
  for (uint8_t& byte : ticket) {
    byte = static_cast<uint8_t>(n % 255 + 1);
    n /= 255;
  }
  return ticket;
}

std::string HoldTickets::toHex(const Ticket& ticket) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(16);
  for (uint8_t byte : ticket) {
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

std::optional<HoldTickets::Ticket> HoldTickets::fromHex(std::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  Ticket ticket{};
  for (size_t i = 0; i < ticket.size(); ++i) {
    const int high = digit(hex[2 * i]);
    const int low = digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    ticket[i] = static_cast<uint8_t>(high * 16 + low);
  }
  return ticket;
}

std::optional<HoldTickets::Taken> HoldTickets::take(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = held_.find(id); it != held_.end()) endLocked(it);
  if (free_.empty()) return std::nullopt;
  Taken taken;
  taken.slot = free_.back();
  free_.pop_back();
  taken.ticket = ticketFor(next_++);
  storeWord(words_ + taken.slot * 8, taken.ticket);
  held_.emplace(id, taken);
  return taken;
}

bool HoldTickets::end(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  endLocked(it);
  return true;
}

void HoldTickets::endLocked(std::unordered_map<std::string, Taken>::iterator it) {
  storeWord(words_ + it->second.slot * 8, Ticket{});
  free_.push_back(it->second.slot);
  held_.erase(it);
}

bool HoldTickets::holds(const std::string& id, const Ticket& ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(id);
  return it != held_.end() && it->second.ticket == ticket;
}

int64_t HoldTickets::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(held_.size());
}

}  // namespace tandem::kv
