// One completion request through the router: checked like an agent checks
// it, admitted (AdmissionGate), placed by the Chooser over what the agents
// hold, prefilled on a prefill agent (with decode → prefill pull-back when
// chosen), then decoded on a decode agent whose answer streams back to the
// client as it comes. Failed agents are retried on others while the client
// has heard nothing. See docs/router.md and docs/kv-transfer.md.
//
// Contract: complete() never throws through the request path for agent
// failures; it answers the client through its exchange (or, when the
// client left, answers nothing). A client leaving cancels the stage under
// way (rendering its chat template included) and gives back any KV
// transfer held for it.
//
// Threads: complete() runs on the client connection's strand; several run
// at once. Parsing, tokenizing and rendering run on the HTTP front's worker
// pool. The referenced components must outlive the flow.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "common/http/http_connection.h"
#include "common/protocol/openai_protocol.h"
#include "operator/router/admission_gate.h"
#include "operator/router/agent_tracker.h"
#include "operator/router/decision_log.h"
#include "operator/router/load_ledger.h"
#include "operator/router/policy.h"
#include "operator/router/router.h"
#include "operator/router/router_metrics.h"
#include "operator/router/served_model.h"
#include "operator/router/stream_splice.h"

namespace tandem::router {

class CompletionFlow {
 public:
  CompletionFlow(const RouterConfig& config, AgentTracker& agents, ServedModel& model,
                 AdmissionGate& gate, RouterMetrics& metrics, const std::atomic<bool>& stopping);
  CompletionFlow(const CompletionFlow&) = delete;
  CompletionFlow& operator=(const CompletionFlow&) = delete;

  // Serves POST /v1/completions (chat false) or /v1/chat/completions.
  boost::asio::awaitable<void> complete(server::HttpExchange& exchange, bool chat);

  // At the router's stop deadline: every request still in flight ends now,
  // a stream with an error event and [DONE], a whole answer (or a stream
  // not begun) with 503; their upstream connections close, so the agents
  // abort them and free their blocks. A request admitted after it is ended
  // at its next step. Returns how many requests it reached.
  size_t cutAll();

  // The ledger's counts for an agent (its gauges).
  LedgerCounts ledgerCounts(const AgentState& agent) { return ledger_.counts(agent); }
  // The last `n` decisions with their candidates' cost terms (newest last).
  nlohmann::json recentDecisions(size_t n) const { return decisions_.recent(n); }

 private:
  enum class Admission { kAdmitted, kRefused, kClientGone };

  struct Handoff {
    nlohmann::json params;  // the prefill agent's kv_transfer_params; null: none
    AgentPtr prefill;
    bool pulled_back = false;
    bool retried = false;
    bool client_error = false;  // the request itself is bad: answer status/body
    int status = 0;
    std::string body;
  };

  // What the kv policy predicted for a request, to compare with what its
  // client saw.
  struct Prediction {
    Decision decision;               // without candidates; predicted_ttft_s 0: none
    double observed_prefill_s = -1;  // when the prefill agent answered (from arrival)
    uint64_t logged = 0;             // its DecisionLog sequence number (0: not kept)
  };

  enum class DecodeOutcome {
    kDone,
    kRefused,            // the decode agent refused the request (4xx, passed through)
    kFailedBeforeStart,  // the decode agent failed; the client heard nothing
    kRefusedDraining,    // the same, refused by a draining agent (503)
    kRefusedOverloaded,  // the same, its waiting queue full (503; client.overload_refusal)
    kTransferRefused,    // the agent cannot read the KV arranged for it (400 kv_transfer_params)
    kBrokenAfterStart,   // the decode agent failed mid-answer
    kStalled,            // mid-answer, nothing came for the upstream timeout
    kHandedOver,         // mid-answer, the draining agent handed the stream over
    kUpstreamError,      // the decode agent's stream ended with an error event
    kClientGone,         // the client left before the response headers
    kClientGoneMidway,   // the client left after them
    kStopped,            // cut at the router's stop deadline (cutAll)
  };

  struct StopCut;
  boost::asio::awaitable<Admission> admit(server::HttpExchange& exchange);
  boost::asio::awaitable<Handoff> prefillOn(
      server::HttpExchange& exchange, const nlohmann::ordered_json& body,
      const protocol::Request& request, const std::vector<AgentPtr>& prefill_agents,
      const DecisionInput& input, const Decision& decision, const nlohmann::json& lent,
      LoadLedger::Reservation reservation, std::span<const BlockHash> hashes, StopCut& stop);
  boost::asio::awaitable<void> release(const Handoff& handoff);
  // Asks `lender` to hold the prompt's cached prefix for another agent to
  // read (a lend): its kv_transfer_params (null when nothing was pinned) and
  // whether it pinned all of the `expected_tokens` the decision counted on.
  // Counted by outcome.
  struct Lent {
    nlohmann::json params;
    bool full = false;
    int64_t tokens = 0;  // the tokens pinned
  };
  boost::asio::awaitable<Lent> lendFrom(const AgentPtr& lender, const protocol::Request& request,
                                        int64_t expected_tokens);
  void observeTtft(double ttft_s, const Prediction& prediction);
  // A request's part in cutAll(): touched on its connection's strand only.
  struct StopCut {
    bool fired = false;
    std::function<void()> close_upstream;  // set while a prefill or decode agent answers
  };
  class StopCutEnrollment;
  // The client's side of one answer across decode agents.
  struct ClientStream {
    std::shared_ptr<StopCut> stop;  // fired by cutAll()
    bool started = false;           // the response has begun (a continuation writes no headers)
    std::chrono::steady_clock::time_point last_write{};  // the last piece it got
    const char* resuming = nullptr;  // why it moved, until the continuation's first piece
    // A whole answer's first token was seen (its TTFT observed): an answer
    // sent again elsewhere is not observed twice.
    bool first_token_seen = false;
    // The last decode agent's refusal for load (its 503 "too many waiting
    // requests"): what the client gets when no other agent takes it.
    std::string overload_refusal;
    // Why the last decode agent cut a whole answer short (the migration
    // reason), until the caller sends it again (outcome resent) or finds
    // no agent to (exhausted); nullptr: it did not.
    const char* cut_whole = nullptr;
  };
  // A stream (`splice` set) is relayed event by event through the splice
  // and handed over by a draining agent when `movable()` (another agent
  // could resume it) says so: asked for in the request when it does at the
  // start, else asked for (POST /admin/hand_over) once the agent is seen
  // unhealthy while it does. `client` is updated as it is written to. A
  // stream that breaks after starting is left to the caller to resume
  // elsewhere.
  boost::asio::awaitable<DecodeOutcome> decodeOn(
      server::HttpExchange& exchange, nlohmann::ordered_json body, bool streaming,
      const AgentPtr& decode, const Handoff& handoff, const std::string& label,
      std::chrono::steady_clock::time_point arrival, LoadLedger::Reservation& reservation,
      const Prediction& prediction, StreamSplice* splice, const std::function<bool()>& movable,
      ClientStream& client);

  const double upstream_timeout_s_;
  const int64_t max_migrations_;
  const double migration_timeout_s_;
  const double full_queues_wait_s_;  // RouterConfig::full_queues_wait_s
  const std::string kv_secret_;      // signs pull-back holds; empty: unsigned
  AgentTracker& agents_;
  ServedModel& model_;
  AdmissionGate& gate_;
  RouterMetrics& metrics_;
  const std::atomic<bool>& stopping_;
  Chooser chooser_;    // guarded by the ledger's lock
  LoadLedger ledger_;  // the decision's lock
  DecisionLog decisions_;
  // The requests in flight, for cutAll(): each with its strand.
  struct StopCutEntry {
    boost::asio::any_io_executor executor;
    std::weak_ptr<StopCut> cut;
  };
  std::mutex cuts_mutex_;
  std::list<StopCutEntry> cuts_;  // guarded by cuts_mutex_
  bool cutting_ = false;          // guarded by cuts_mutex_
};

}  // namespace tandem::router
