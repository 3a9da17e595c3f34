// The router's Prometheus metrics (docs/metrics.md, "Router"): decisions,
// decision time, prefix overlap, client-side TTFT / ITL / end-to-end
// latency, upstream errors, client aborts by stage, admission (in flight,
// queued), the agents listed per role and each listed agent's health and
// index size.
// Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/http/http_limits.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace tandem::server {
class HttpFrontMetrics;
}  // namespace tandem::server

namespace tandem::router {

class RouterMetrics {
 public:
  // `keep_errors_of_removed_agents`: how long an agent's
  // upstream-error series outlives the agent's removal (below).
  explicit RouterMetrics(
      std::chrono::steady_clock::duration keep_errors_of_removed_agents = std::chrono::minutes(10));
  ~RouterMetrics();

  // decision: disaggregated, local_prefill, pull_back, affinity, spill,
  // retried, rejected.
  void countDecision(const std::string& decision);
  void observeDecision(double seconds, double overlap_ratio);
  void observeTtft(double seconds);
  void observeItl(double seconds);
  void observeE2e(double seconds);
  void countUpstreamError(const std::string& agent);
  // A lend's hold call, by outcome: full (the lender pinned at least the
  // prefix the decision counted on), short (less: blocks the router expected
  // were not stored yet, or were evicted), refused (nothing pinned).
  void countLend(const std::string& outcome);
  // A decode agent's refusal of a KV transfer the router arranged for it
  // (a 400 naming kv_transfer_params): the agent prefilled itself. The log
  // names the agent.
  void countTransferRefused();
  // A stream that left its decode agent after it began, by reason (failure,
  // stall, drain, error) and outcome: resumed (sent on to the next decode agent
  // with the tokens so far), exhausted (no agent or migration left: the
  // client got an error event), resent (a whole answer cut short, sent
  // again from its start to the next decode agent).
  void countMigration(const std::string& reason, const std::string& outcome);
  // Where a resumed stream's KV came from: handed_over (the draining
  // agent's blocks), pulled (the prompt's, lent by the prefill agent that
  // computed it) or recomputed; and how many of its tokens (prompt and
  // output so far) were transferred and how many are left to recompute.
  void countMigrationPrefix(const std::string& source, int64_t transferred_tokens,
                            int64_t recomputed_tokens);
  // The pause a moved stream's client saw (last piece before, first after),
  // by why it moved (failure, stall, drain, error).
  void observeMigrationPause(const std::string& reason, double seconds);
  // stage: parse (parsing, rendering, tokenizing the request), queued,
  // prefill, decode (before the response headers), response.
  void countClientAbort(const std::string& stage);
  void setAdmission(int64_t inflight, int64_t queued);
  // The HTTP front's connection series (common/http/http_metrics.h), as
  // HttpService::frontStats() says now; call before render().
  void observeHttpFront(const server::HttpFrontStats& stats);
  // How many agents of a role ("prefill", "decode") the router has.
  void setAgentCount(const std::string& role, int64_t count);
  // The agent left the router's list: its health and index series go away,
  // and its upstream-error series once it has been kept for the time given
  // to the constructor (errors are what a dying agent leaves: enough scrapes
  // must see the last of them), unless the agent is listed again by then.
  // Without this, every pod that ever failed a call kept a series.
  void removeAgent(const std::string& agent);
  void setAgentHealthy(const std::string& agent, bool healthy);
  void setAgentRequests(const std::string& agent, int64_t requests);
  void setIndexBlocks(const std::string& agent, int64_t blocks);
  // The router's ledger for the agent (load_ledger.h).
  void setAgentLedger(const std::string& agent, int64_t requests, int64_t prefill_tokens,
                      int64_t kv_tokens);
  // A streamed request's observed TTFT against the kv policy's prediction.
  void observeTtftPrediction(double observed_s, double predicted_s);

  std::string render();

 private:
  // Removes the upstream-error series whose time has come (mutex_ held).
  void dropErrorsOfRemovedAgents();

  std::mutex mutex_;
  const std::chrono::steady_clock::duration keep_errors_of_removed_agents_;
  // Removed agents' upstream-error series, by when they go.
  std::map<std::string, std::chrono::steady_clock::time_point> errors_to_drop_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<server::HttpFrontMetrics> http_front_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* upstream_errors_;
  prometheus::Family<prometheus::Counter>* lends_;
  prometheus::Family<prometheus::Counter>* transfer_refusals_;
  prometheus::Family<prometheus::Counter>* migrations_;
  prometheus::Family<prometheus::Counter>* migration_prefixes_;
  prometheus::Family<prometheus::Counter>* migration_tokens_;
  prometheus::Family<prometheus::Histogram>* migration_pause_;
  prometheus::Family<prometheus::Counter>* client_aborts_;
  prometheus::Gauge* inflight_;
  prometheus::Gauge* queued_;
  prometheus::Family<prometheus::Gauge>* agents_;
  prometheus::Family<prometheus::Gauge>* agent_healthy_;
  prometheus::Family<prometheus::Gauge>* agent_requests_;
  prometheus::Family<prometheus::Gauge>* index_blocks_;
  prometheus::Family<prometheus::Gauge>* reserved_requests_;
  prometheus::Family<prometheus::Gauge>* reserved_tokens_;
  prometheus::Histogram* ttft_prediction_;
  prometheus::Histogram* decision_seconds_;
  prometheus::Histogram* overlap_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
};

}  // namespace tandem::router
