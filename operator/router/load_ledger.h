// The router's ledger of the load it sent: per agent, the requests reserved
// on it and not yet ended, their uncached prompt tokens not yet computed and
// (decode agents) their projected KV. A reservation is taken under the same
// lock as the decision that makes it, so simultaneous decisions see each
// other at once instead of the same polled load (which can be a poll
// interval old, and does not show a request until its prefill finished).
//
// Contract: every Reservation releases exactly once — explicitly, or when it
// is destroyed (finish, client abort at any stage, upstream error, retry on
// another agent, agent unlisted: the counts live in the AgentState the
// reservation keeps alive). prefillDone() drops the prompt tokens early
// (a prefill agent answered; a decode agent streamed its first token).
//
// Threads: thread-safe; lock() is held across building the decision's
// views, choosing and reserving. Lock order: the AgentTracker's mutex, then
// this one (the ledger never calls the tracker).
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>

#include "operator/router/agent_tracker.h"
#include "operator/router/policy.h"

namespace tandem::router {

class LoadLedger {
 public:
  class Reservation {
   public:
    Reservation() = default;
    ~Reservation() { release(); }
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;

    // Drops the reserved prompt tokens (the requests and KV stay).
    void prefillDone();
    // Gives everything back; later calls do nothing.
    void release();
    bool active() const { return ledger_ != nullptr; }

   private:
    friend class LoadLedger;
    LoadLedger* ledger_ = nullptr;
    AgentPtr agent_;
    LedgerCounts counts_;
  };

  LoadLedger() = default;
  LoadLedger(const LoadLedger&) = delete;
  LoadLedger& operator=(const LoadLedger&) = delete;

  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }
  // Under lock(): the agent's counts into its view, and a new reservation.
  static void fillView(const AgentState& agent, AgentView& view);
  Reservation reserveLocked(const AgentPtr& agent, const LedgerCounts& counts);
  // Takes the lock itself (a retry on another agent).
  Reservation reserve(const AgentPtr& agent, const LedgerCounts& counts);
  LedgerCounts counts(const AgentState& agent);

 private:
  static void add(AgentState& agent, const LedgerCounts& counts, int64_t sign);

  std::mutex mutex_;
};

}  // namespace tandem::router
