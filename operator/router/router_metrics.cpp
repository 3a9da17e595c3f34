#include "operator/router/router_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>

#include "common/http/http_metrics.h"
#include "common/latency_buckets.h"

namespace tandem::router {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Removes the series of `labels` from `family`, if it has one.
template <typename T>
void removeSeries(prometheus::Family<T>* family, const prometheus::Labels& labels) {
  if (family->Has(labels)) family->Remove(&family->Add(labels));
}

// The agents' latency buckets, so dashboards compare like with like.
const prometheus::Histogram::BucketBoundaries& kTtftBuckets = kTtftBucketBounds;
const prometheus::Histogram::BucketBoundaries& kItlBuckets = kItlBucketBounds;
const prometheus::Histogram::BucketBoundaries& kRequestBuckets = kRequestBucketBounds;
// Fine below 1 ms (the usual decision) and between 10 and 50 ms too, where
// decisions over 100k-token prompts and many agents have landed.
const prometheus::Histogram::BucketBoundaries kDecisionBuckets = {
    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002,
    0.0025,  0.005,   0.01,   0.02,    0.03,   0.05,  0.1};
// Observed ÷ predicted, around 1 in steps of about 1.4x.
const prometheus::Histogram::BucketBoundaries kPredictionBuckets = {
    0.125, 0.25, 0.35, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0, 2.8, 4.0, 8.0};
const prometheus::Histogram::BucketBoundaries kRatioBuckets = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5,
                                                               0.6, 0.7, 0.8, 0.9, 1.0};

}  // namespace

RouterMetrics::RouterMetrics(std::chrono::steady_clock::duration keep_errors_of_removed_agents)
    : keep_errors_of_removed_agents_(keep_errors_of_removed_agents),
      registry_(std::make_shared<prometheus::Registry>()),
      http_front_(std::make_unique<server::HttpFrontMetrics>(
          *registry_, std::map<std::string, std::string>{})) {
  auto histogram = [&](const char* name, const char* help,
                       const prometheus::Histogram::BucketBoundaries& buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(*registry_).Add({}, buckets);
  };
  requests_ = &BuildCounter()
                   .Name("tandem_router_requests_total")
                   .Help(
                       "Requests by routing decision: disaggregated, local_prefill, pull_back, "
                       "affinity (the chosen agents held the longest prefix any agent held) and "
                       "spill (another agent held a longer one), both also counted under their "
                       "kind, retried (also counted under its final decision), rejected "
                       "(refused: no agent could take it, or the router was overloaded), "
                       "invalid (refused as bad input, before any agent saw it).")
                   .Register(*registry_);
  for (const char* decision : {"disaggregated", "local_prefill", "pull_back", "affinity", "spill",
                               "retried", "rejected", "invalid"}) {
    requests_->Add({{"decision", decision}});
  }
  upstream_errors_ = &BuildCounter()
                          .Name("tandem_router_upstream_errors_total")
                          .Help("Failed calls to agents (refused, 5xx, timeout, broken stream).")
                          .Register(*registry_);
  lends_ = &BuildCounter()
                .Name("tandem_router_lends_total")
                .Help(
                    "Lends asked of a holder before a prefill (pull-back), by outcome: full "
                    "(the prefix the decision counted on was pinned), short (less was: "
                    "blocks expected there were not stored yet, or were evicted), refused "
                    "(nothing was).")
                .Register(*registry_);
  for (const char* outcome : {"full", "short", "refused"}) lends_->Add({{"outcome", outcome}});
  transfer_refusals_ =
      &BuildCounter()
           .Name("tandem_router_transfer_refusals_total")
           .Help(
               "KV transfers the router arranged that the decode agent refused (400 naming "
               "kv_transfer_params: pools storing KV differently); the agent prefilled itself.")
           .Register(*registry_);
  transfer_refusals_->Add({});
  migrations_ = &BuildCounter()
                     .Name("tandem_router_migrations_total")
                     .Help(
                         "Streams that left their decode agent after they began, by reason "
                         "(failure: the connection broke; stall: nothing came for the upstream "
                         "timeout; drain: the agent handed the stream over; error: the agent "
                         "ended it with an error event) and outcome: "
                         "resumed (on the next decode agent, from the tokens sent), exhausted "
                         "(none left: an error event, or a 503 for a whole answer), resent (a "
                         "whole answer cut short, sent again to the next decode agent).")
                     .Register(*registry_);
  for (const char* reason : {"failure", "stall", "drain", "error"}) {
    for (const char* outcome : {"resumed", "exhausted", "resent"}) {
      migrations_->Add({{"reason", reason}, {"outcome", outcome}});
    }
  }
  migration_prefixes_ = &BuildCounter()
                             .Name("tandem_router_migration_prefixes_total")
                             .Help(
                                 "Resumed streams by where their KV came from: handed_over (the "
                                 "draining agent's blocks, prompt and output so far), pulled "
                                 "(the prompt's, lent by the prefill agent that computed it) or "
                                 "recomputed.")
                             .Register(*registry_);
  migration_tokens_ = &BuildCounter()
                           .Name("tandem_router_migration_tokens_total")
                           .Help(
                               "Tokens of resumed streams (prompt and output so far) by how the "
                               "resuming agent got their KV: transferred (read from the "
                               "holder's blocks) or recomputed.")
                           .Register(*registry_);
  for (const char* source : {"handed_over", "pulled", "recomputed"}) {
    migration_prefixes_->Add({{"source", source}});
  }
  for (const char* kv : {"transferred", "recomputed"}) migration_tokens_->Add({{"kv", kv}});
  client_aborts_ = &BuildCounter()
                        .Name("tandem_router_client_aborts_total")
                        .Help(
                            "Requests whose client left before the end, by stage: parse "
                            "(parsing, rendering, tokenizing), queued, prefill, decode (before "
                            "the response headers), response.")
                        .Register(*registry_);
  for (const char* stage : {"parse", "queued", "prefill", "decode", "response"}) {
    client_aborts_->Add({{"stage", stage}});
  }
  inflight_ = &BuildGauge()
                   .Name("tandem_router_inflight_requests")
                   .Help("Completion requests holding an admission slot.")
                   .Register(*registry_)
                   .Add({});
  queued_ = &BuildGauge()
                 .Name("tandem_router_queued_requests")
                 .Help("Completion requests waiting for an admission slot.")
                 .Register(*registry_)
                 .Add({});
  agents_ = &BuildGauge()
                 .Name("tandem_router_agents")
                 .Help("Agents the router may send work to, by role.")
                 .Register(*registry_);
  for (const char* role : {"prefill", "decode"}) agents_->Add({{"role", role}});
  agent_healthy_ = &BuildGauge()
                        .Name("tandem_router_agent_healthy")
                        .Help("1 while the agent answers /health.")
                        .Register(*registry_);
  agent_requests_ = &BuildGauge()
                         .Name("tandem_router_agent_requests")
                         .Help(
                             "Requests running or waiting on the agent as last polled from its "
                             "/metrics (the load the kv policy weighs).")
                         .Register(*registry_);
  index_blocks_ = &BuildGauge()
                       .Name("tandem_router_index_blocks")
                       .Help("KV blocks the ownership index holds for the agent.")
                       .Register(*registry_);
  reserved_requests_ = &BuildGauge()
                            .Name("tandem_router_reserved_requests")
                            .Help(
                                "Requests the router's ledger holds reserved on the agent: sent "
                                "and not yet answered (prefill) or ended (decode).")
                            .Register(*registry_);
  reserved_tokens_ = &BuildGauge()
                          .Name("tandem_router_reserved_tokens")
                          .Help(
                              "Tokens the router's ledger holds reserved on the agent: kind "
                              "prefill (uncached prompt tokens not yet computed), kind kv "
                              "(decode: prompt + max_tokens of each reserved request).")
                          .Register(*registry_);
  migration_pause_ = &BuildHistogram()
                          .Name("tandem_router_migration_pause_seconds")
                          .Help(
                              "The pause a client of a moved stream saw, by why it moved: from "
                              "the last piece its first decode agent sent to the first piece of "
                              "the agent resuming it (detection, KV transfer or recomputation, "
                              "and the first step).")
                          .Register(*registry_);
  ttft_prediction_ =
      histogram("tandem_router_ttft_prediction_ratio",
                "Observed time to first token (a whole answer's: when its agent said the first "
                "token was out) divided by the kv policy's prediction when it was placed.",
                kPredictionBuckets);
  decision_seconds_ = histogram(
      "tandem_router_decision_seconds",
      "Time to hash a request's prompt blocks, look up the agents holding them and choose "
      "agents (parsing and tokenizing the request come before and are not included).",
      kDecisionBuckets);
  overlap_ = histogram("tandem_router_prefix_overlap_ratio",
                       "Fraction of a prompt's full blocks the chosen agents already held.",
                       kRatioBuckets);
  ttft_ =
      histogram("tandem_router_time_to_first_token_seconds",
                "Time to the first token: a stream's first event as the client gets it, a whole "
                "answer's from its agent's first-token 102.",
                kTtftBuckets);
  itl_ = histogram("tandem_router_inter_token_latency_seconds",
                   "Client-side time between streamed tokens.", kItlBuckets);
  e2e_ = histogram("tandem_router_e2e_request_latency_seconds",
                   "Client-side time from request to last byte.", kRequestBuckets);
}

RouterMetrics::~RouterMetrics() = default;

void RouterMetrics::countDecision(const std::string& decision) {
  std::lock_guard<std::mutex> lock(mutex_);
  requests_->Add({{"decision", decision}}).Increment();
}

void RouterMetrics::observeDecision(double seconds, double overlap_ratio) {
  std::lock_guard<std::mutex> lock(mutex_);
  decision_seconds_->Observe(seconds);
  overlap_->Observe(overlap_ratio);
}

void RouterMetrics::observeTtft(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_->Observe(seconds);
}

void RouterMetrics::observeItl(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  itl_->Observe(seconds);
}

void RouterMetrics::observeE2e(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  e2e_->Observe(seconds);
}

void RouterMetrics::countUpstreamError(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  upstream_errors_->Add({{"agent", agent}}).Increment();
}

void RouterMetrics::countLend(const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  lends_->Add({{"outcome", outcome}}).Increment();
}

void RouterMetrics::countTransferRefused() {
  std::lock_guard<std::mutex> lock(mutex_);
  transfer_refusals_->Add({}).Increment();
}

void RouterMetrics::countMigration(const std::string& reason, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  migrations_->Add({{"reason", reason}, {"outcome", outcome}}).Increment();
}

void RouterMetrics::countMigrationPrefix(const std::string& source, int64_t transferred_tokens,
                                         int64_t recomputed_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  migration_prefixes_->Add({{"source", source}}).Increment();
  migration_tokens_->Add({{"kv", "transferred"}})
      .Increment(static_cast<double>(transferred_tokens));
  migration_tokens_->Add({{"kv", "recomputed"}}).Increment(static_cast<double>(recomputed_tokens));
}

void RouterMetrics::observeMigrationPause(const std::string& reason, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  migration_pause_->Add({{"reason", reason}}, kTtftBuckets).Observe(seconds);
}

void RouterMetrics::countClientAbort(const std::string& stage) {
  std::lock_guard<std::mutex> lock(mutex_);
  client_aborts_->Add({{"stage", stage}}).Increment();
}

void RouterMetrics::setAdmission(int64_t inflight, int64_t queued) {
  std::lock_guard<std::mutex> lock(mutex_);
  inflight_->Set(static_cast<double>(inflight));
  queued_->Set(static_cast<double>(queued));
}

void RouterMetrics::setAgentCount(const std::string& role, int64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  agents_->Add({{"role", role}}).Set(static_cast<double>(count));
}

void RouterMetrics::removeAgent(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  const prometheus::Labels labels = {{"agent", agent}};
  removeSeries(agent_healthy_, labels);
  removeSeries(agent_requests_, labels);
  removeSeries(index_blocks_, labels);
  removeSeries(reserved_requests_, labels);
  for (const char* kind : {"prefill", "kv"}) {
    removeSeries(reserved_tokens_, {{"agent", agent}, {"kind", kind}});
  }
  if (upstream_errors_->Has(labels)) {
    errors_to_drop_[agent] = std::chrono::steady_clock::now() + keep_errors_of_removed_agents_;
  }
  dropErrorsOfRemovedAgents();
}

void RouterMetrics::dropErrorsOfRemovedAgents() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = errors_to_drop_.begin(); it != errors_to_drop_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    removeSeries(upstream_errors_, {{"agent", it->first}});
    it = errors_to_drop_.erase(it);
  }
}

void RouterMetrics::setAgentHealthy(const std::string& agent, bool healthy) {
  std::lock_guard<std::mutex> lock(mutex_);
  errors_to_drop_.erase(agent);  // listed (again)
  agent_healthy_->Add({{"agent", agent}}).Set(healthy ? 1 : 0);
}

void RouterMetrics::setAgentRequests(const std::string& agent, int64_t requests) {
  std::lock_guard<std::mutex> lock(mutex_);
  agent_requests_->Add({{"agent", agent}}).Set(static_cast<double>(requests));
}

void RouterMetrics::setIndexBlocks(const std::string& agent, int64_t blocks) {
  std::lock_guard<std::mutex> lock(mutex_);
  index_blocks_->Add({{"agent", agent}}).Set(static_cast<double>(blocks));
}

void RouterMetrics::setAgentLedger(const std::string& agent, int64_t requests,
                                   int64_t prefill_tokens, int64_t kv_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_requests_->Add({{"agent", agent}}).Set(static_cast<double>(requests));
  reserved_tokens_->Add({{"agent", agent}, {"kind", "prefill"}})
      .Set(static_cast<double>(prefill_tokens));
  reserved_tokens_->Add({{"agent", agent}, {"kind", "kv"}}).Set(static_cast<double>(kv_tokens));
}

void RouterMetrics::observeTtftPrediction(double observed_s, double predicted_s) {
  if (predicted_s <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_prediction_->Observe(observed_s / predicted_s);
}

void RouterMetrics::observeHttpFront(const server::HttpFrontStats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  http_front_->update(stats);
}

std::string RouterMetrics::render() {
  std::lock_guard<std::mutex> lock(mutex_);
  dropErrorsOfRemovedAgents();
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace tandem::router
