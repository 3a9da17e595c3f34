#include "operator/router/load_ledger.h"

namespace tandem::router {

LoadLedger::Reservation& LoadLedger::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    release();
    ledger_ = std::exchange(other.ledger_, nullptr);
    agent_ = std::move(other.agent_);
    counts_ = other.counts_;
  }
  return *this;
}

void LoadLedger::Reservation::prefillDone() {
  if (!ledger_ || counts_.prefill_tokens == 0) return;
  std::lock_guard<std::mutex> lock(ledger_->mutex_);
  ledger_->add(*agent_, {0, counts_.prefill_tokens, 0}, -1);
  counts_.prefill_tokens = 0;
}

void LoadLedger::Reservation::release() {
  LoadLedger* ledger = std::exchange(ledger_, nullptr);
  if (!ledger) return;
  std::lock_guard<std::mutex> lock(ledger->mutex_);
  ledger->add(*agent_, counts_, -1);
  agent_.reset();
}

void LoadLedger::fillView(const AgentState& agent, AgentView& view) {
  view.reserved_requests = agent.ledger.requests;
  view.reserved_prefill_tokens = agent.ledger.prefill_tokens;
  view.reserved_kv_tokens = agent.ledger.kv_tokens;
}

LoadLedger::Reservation LoadLedger::reserveLocked(const AgentPtr& agent,
                                                  const LedgerCounts& counts) {
  Reservation reservation;
  reservation.ledger_ = this;
  reservation.agent_ = agent;
  reservation.counts_ = counts;
  add(*agent, counts, 1);
  return reservation;
}

LoadLedger::Reservation LoadLedger::reserve(const AgentPtr& agent, const LedgerCounts& counts) {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserveLocked(agent, counts);
}

LedgerCounts LoadLedger::counts(const AgentState& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  return agent.ledger;
}

void LoadLedger::add(AgentState& agent, const LedgerCounts& counts, int64_t sign) {
  agent.ledger.requests += sign * counts.requests;
  agent.ledger.prefill_tokens += sign * counts.prefill_tokens;
  agent.ledger.kv_tokens += sign * counts.kv_tokens;
}

}  // namespace tandem::router
