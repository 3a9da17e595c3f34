#include "agent/kv/ucx/hold_tickets.h"

#include <atomic>
#include <cstring>

#include "agent/transport/remote_slab.h"

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
  return transport::hexEncode(
      std::string_view(reinterpret_cast<const char*>(ticket.data()), ticket.size()));
}

std::optional<HoldTickets::Ticket> HoldTickets::fromHex(std::string_view hex) {
  StatusOr<std::string> bytes = transport::hexDecode(hex);
  // Exactly the lower-case text toHex gives (hexDecode takes upper case too).
  if (!bytes.isOk() || bytes->size() != sizeof(Ticket) || transport::hexEncode(*bytes) != hex) {
    return std::nullopt;
  }
  Ticket ticket{};
  std::memcpy(ticket.data(), bytes->data(), ticket.size());
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
