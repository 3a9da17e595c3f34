// Hold tickets (agent/kv/ucx/hold_tickets.h): what a reader's check after
// its read relies on — a ticket is in its word exactly while its hold lasts,
// no two tickets are alike, and no mix of a ticket's bytes with another
// value of its word reads as that ticket.
#include "agent/kv/ucx/hold_tickets.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace tandem::kv {
namespace {

using Ticket = HoldTickets::Ticket;

Ticket wordAt(const std::vector<uint64_t>& words, int64_t slot) {
  Ticket ticket{};
  std::memcpy(ticket.data(), &words[static_cast<size_t>(slot)], ticket.size());
  return ticket;
}

TEST(HoldTickets, ATicketIsInItsWordExactlyWhileItsHoldLasts) {
  std::vector<uint64_t> words(3, 0);
  HoldTickets tickets(reinterpret_cast<uint8_t*>(words.data()), 3, 1000);
  auto a = tickets.take("a");
  auto b = tickets.take("b");
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->slot, b->slot);
  EXPECT_EQ(wordAt(words, a->slot), a->ticket);
  EXPECT_EQ(wordAt(words, b->slot), b->ticket);
  EXPECT_NE(a->ticket, b->ticket);
  EXPECT_EQ(tickets.used(), 2);

  EXPECT_TRUE(tickets.holds("a", a->ticket));
  EXPECT_FALSE(tickets.holds("a", b->ticket));
  EXPECT_TRUE(tickets.end("a"));
  EXPECT_FALSE(tickets.holds("a", a->ticket));
  EXPECT_EQ(wordAt(words, a->slot), Ticket{}) << "an ended hold's word is zero";
  EXPECT_FALSE(tickets.end("a")) << "once";
  EXPECT_EQ(wordAt(words, b->slot), b->ticket) << "others are untouched";

  // The same id again: the earlier hold ends, the new one has a new ticket.
  auto b2 = tickets.take("b");
  ASSERT_TRUE(b2);
  EXPECT_NE(b2->ticket, b->ticket);
  EXPECT_EQ(wordAt(words, b2->slot), b2->ticket);
  if (b2->slot != b->slot) EXPECT_EQ(wordAt(words, b->slot), Ticket{});
  EXPECT_EQ(tickets.used(), 1);

  // Full: no word is handed out twice.
  ASSERT_TRUE(tickets.take("c"));
  ASSERT_TRUE(tickets.take("d"));
  EXPECT_FALSE(tickets.take("e"));
  EXPECT_EQ(tickets.used(), 3);
  EXPECT_TRUE(tickets.end("c"));
  EXPECT_TRUE(tickets.take("e"));
}

TEST(HoldTickets, TicketsAreDistinctAndHaveNoZeroByte) {
  std::set<Ticket> seen;
  // Runs that cross a carry of one digit, then of two.
  for (uint64_t start :
       {uint64_t{0}, uint64_t{255} * 255 - 7000, uint64_t{1} << 40, (uint64_t{1} << 61) + 12345}) {
    for (uint64_t n = start; n < start + 20000; ++n) {
      const Ticket ticket = HoldTickets::ticketFor(n);
      for (uint8_t byte : ticket) ASSERT_NE(byte, 0) << n;
      ASSERT_TRUE(seen.insert(ticket).second) << "ticket " << n << " repeats";
    }
  }
}

// A word read a byte at a time while it changes shows each byte from one of
// the values the word held. Mixed with zero (the hold's end), a ticket
// always has a zero byte, so it is never taken for the ticket itself.
TEST(HoldTickets, NoMixOfATicketWithZeroReadsAsTheTicket) {
  const Ticket ticket = HoldTickets::ticketFor(123456789);
  for (int mask = 0; mask < 255; ++mask) {  // 255: every byte from the ticket
    Ticket mixed{};
    for (int i = 0; i < 8; ++i)
      mixed[static_cast<size_t>(i)] = (mask >> i & 1) ? ticket[static_cast<size_t>(i)] : 0;
    EXPECT_NE(mixed, ticket) << mask;
  }
}

TEST(HoldTickets, HexRoundTripsAndRefusesOtherText) {
  const Ticket ticket = HoldTickets::ticketFor(987654321);
  const std::string hex = HoldTickets::toHex(ticket);
  EXPECT_EQ(hex.size(), 16u);
  EXPECT_EQ(HoldTickets::fromHex(hex), ticket);
  EXPECT_EQ(HoldTickets::toHex(HoldTickets::ticketFor(0)), "0101010101010101");
  EXPECT_EQ(HoldTickets::toHex(HoldTickets::ticketFor(255)), "0102010101010101");
  for (const char* bad :
       {"", "010101010101010", "01010101010101011", "0101010101010G01", "0A01010101010101"}) {
    EXPECT_FALSE(HoldTickets::fromHex(bad)) << bad;
  }
}

}  // namespace
}  // namespace tandem::kv
