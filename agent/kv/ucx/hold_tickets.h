// Hold tickets: how a reader proves that the blocks it just read were still
// held for it while it read them.
//
// A producer lends a finished request's blocks until the reader's release,
// an explicit release or abort_timeout_s, and may reuse them after. A
// one-sided read cannot see that: a descriptor used after its hold ended
// (released by someone else, timed out, read a second time) reads another
// request's KV, which the reader would compute from and cache under the
// prompt's block hashes. So every hold that offers blocks also takes a word
// of a small table the producer registers with UCX, and writes a ticket
// there; the descriptor names the word (remote_hold_slot) and the ticket
// (remote_hold_ticket, signed with the rest). The hold's end writes zero to
// the word BEFORE its blocks go back to the pool. The reader reads the word
// after its block reads have completed: still the ticket means the hold had
// not ended when the blocks were read (the read of the word comes after
// them, and any reuse of the blocks after the zero); anything else, and the
// blocks are not used.
//
// Tickets are never repeated within a table's life and have no zero byte.
// The word is stored whole (one aligned 8-byte store) and a reader's 8-byte
// get is not split in practice; were it read a byte at a time, a byte from
// the end (zero) could never pass for the ticket's, and passing for it with
// bytes of later tickets only would take the word being reused twice more
// within that one read.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::kv {

class HoldTickets {
 public:
  using Ticket = std::array<uint8_t, 8>;
  struct Taken {
    int64_t slot = 0;
    Ticket ticket{};
  };

  // `words`: 8-byte aligned memory of `capacity` words, zero-filled, that
  // outlives this table (the registered region readers read).
  HoldTickets(uint8_t* words, int64_t capacity, uint64_t first_ticket);

  // Gives `id` a word and a fresh ticket, written to that word; an earlier
  // hold under the same id ends first. nullopt when every word is taken.
  std::optional<Taken> take(const std::string& id);
  // Ends the hold of `id`: its word becomes zero, then is free again. False
  // when `id` holds none.
  bool end(const std::string& id);
  // Whether `id` holds `ticket` now.
  bool holds(const std::string& id, const Ticket& ticket) const;

  int64_t capacity() const { return capacity_; }
  int64_t used() const;

  // The n-th ticket of a table: n written with digits 1..255 (no zero byte),
  // little-endian. Distinct for every n < 255^8.
  static Ticket ticketFor(uint64_t n);
  // 16 lower-case hex characters (the ticket's bytes in memory order), and
  // back (nullopt when not exactly that).
  static std::string toHex(const Ticket& ticket);
  static std::optional<Ticket> fromHex(std::string_view hex);

 private:
  void endLocked(std::unordered_map<std::string, Taken>::iterator it);

  uint8_t* words_;
  int64_t capacity_;
  mutable std::mutex mutex_;
  uint64_t next_;
  std::vector<int64_t> free_;  // taken from the back
  std::unordered_map<std::string, Taken> held_;
};

}  // namespace tandem::kv
