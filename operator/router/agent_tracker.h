// The router's view of its agents: the listed prefill and decode agents,
// each polled for health and load (/health, /metrics) and followed through
// its /v1/kv_events stream into the ownership index. Used by the router's
// own files only.
//
// Contract: setAgents replaces the agent set; an agent whose address or
// role changed is a new agent (its old blocks leave the index). Watch loops
// run on the io_context until the agent is unlisted or `stopping` is set.
// Every metric series of an agent changes only while it is listed.
//
// Threads: every public method is thread-safe. The tracker must outlive the
// io_context's threads (its loops refer to it).
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange unincluded
// clang-format on
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/block_hash.h"
#include "operator/router/ownership_index.h"
#include "operator/router/policy.h"
#include "operator/router/router.h"
#include "operator/router/router_metrics.h"
#include "operator/router/served_model.h"

namespace tandem::router {

// What the router's ledger (load_ledger.h) holds reserved on an agent.
struct LedgerCounts {
  int64_t requests = 0;
  int64_t prefill_tokens = 0;  // uncached prompt tokens not yet computed
  int64_t kv_tokens = 0;       // decode: prompt + max_tokens of each request
  bool operator==(const LedgerCounts&) const = default;
};

// One agent and what the router knows of it.
struct AgentState {
  AgentEndpoint endpoint;
  bool prefill = false;
  std::atomic<bool> listed{true};
  std::atomic<bool> healthy{false};
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> waiting{0};
  std::atomic<double> kv_usage{0};
  // The tokens its KV cache holds (/v1/models tandem.kv_cache_tokens); 0:
  // not known yet.
  std::atomic<int64_t> kv_cache_tokens{0};
  // The requests it lets wait (/v1/models tandem.max_waiting_requests); 0:
  // not known.
  std::atomic<int64_t> max_waiting_requests{0};
  // The sequences it computes at once (/v1/models tandem.max_num_seqs); 0:
  // not known.
  std::atomic<int64_t> max_num_seqs{0};
  // The most engine requests it holds at once (running, loading their KV,
  // waiting): max_num_seqs + max_waiting_requests, as the agent bounds
  // them; 0: not known.
  int64_t maxRequestsHeld() const {
    const int64_t seats = max_num_seqs;
    const int64_t most = max_waiting_requests;
    return seats > 0 && most > 0 ? seats + most : 0;
  }
  // Whether it would refuse a request of `places` engine requests (n,
  // best_of, several prompts) sent now ("too many waiting requests"): the
  // load others gave it at the last poll (`view`'s), with the requests the
  // router has reserved on it since, leaves too few of the requests it
  // holds (never while those are not known).
  bool queueFull(const AgentView& view, int64_t places) const {
    const int64_t held = maxRequestsHeld();
    return held > 0 && view.external_requests + view.reserved_requests + places > held;
  }
  // Of the polled running + waiting, those the router's ledger did not hold
  // while the poll was under way: load another router or client sent.
  std::atomic<int64_t> external_requests{0};
  LedgerCounts ledger;  // guarded by the LoadLedger's mutex
  // The LoRA adapters its /v1/models lists, read when it turns healthy and
  // every kAdapterRefreshPolls polls after (guarded by adapters_mutex, as
  // are the two below).
  mutable std::mutex adapters_mutex;
  std::vector<AdapterInfo> adapters;
  // Its model's identity, from the same answer ("" until read): a request's
  // prefill and decode agents, and the agents a stream moves to, share it.
  std::string model_identity;
  // Its process's instance id, from its last /health ("" until read): what
  // the router's signed control requests to it name (common/kv_auth.h).
  std::string instance_id;
  int64_t polls_since_models = 0;  // its poll loop only
  std::string modelIdentity() const {
    std::lock_guard<std::mutex> lock(adapters_mutex);
    return model_identity;
  }
  std::string instanceId() const {
    std::lock_guard<std::mutex> lock(adapters_mutex);
    return instance_id;
  }
  // Whether it serves `adapter` with blocks hashed under `identity`.
  bool serves(const std::string& adapter, const std::string& identity) const {
    std::lock_guard<std::mutex> lock(adapters_mutex);
    return std::find(adapters.begin(), adapters.end(), AdapterInfo{adapter, identity}) !=
           adapters.end();
  }
};
// Polls between two reads of an agent's adapters (10 s at the default 0.5 s
// interval): an agent restarted with other adapters under the same address
// is seen within that.
inline constexpr int64_t kAdapterRefreshPolls = 20;
using AgentPtr = std::shared_ptr<AgentState>;
// Leaves in `agents` those serving `adapter` with blocks hashed under
// `identity` (AgentState::serves); an empty identity: none.
inline void keepAgentsServing(std::vector<AgentPtr>& agents, const std::string& adapter,
                              const std::string& identity) {
  std::erase_if(agents, [&](const AgentPtr& agent) {
    return identity.empty() || !agent->serves(adapter, identity);
  });
}

class AgentTracker {
 public:
  // Polls every `poll_interval_s`; the first healthy agent teaches `model`
  // the model (while it is not ready), and a decode agent of a model more
  // healthy decode agents serve than the router's teaches it again. `ioc`, `stopping`, `metrics`
  // and `model` must outlive the tracker.
  AgentTracker(boost::asio::io_context& ioc, double poll_interval_s,
               const std::atomic<bool>& stopping, RouterMetrics& metrics, ServedModel& model)
      : ioc_(ioc),
        poll_interval_s_(poll_interval_s),
        stopping_(stopping),
        metrics_(metrics),
        model_(model) {}
  AgentTracker(const AgentTracker&) = delete;
  AgentTracker& operator=(const AgentTracker&) = delete;

  // Replaces the agent set. Agents added after startWatching() are watched
  // at once; before it, startWatching() starts them all.
  void setAgents(std::vector<AgentEndpoint> prefill, std::vector<AgentEndpoint> decode);
  void startWatching();
  // How many requests the router's ledger holds on an agent; polls subtract
  // them to find external load. Set before startWatching().
  void setLedgerReader(std::function<int64_t(const AgentState&)> reader) {
    ledger_requests_ = std::move(reader);
  }

  // The listed prefill (true) or decode (false) agents.
  std::vector<AgentPtr> agentsOf(bool prefill);
  // The LoRA adapters served (docs/lora.md): the names the listed decode
  // agents serve (sorted, once each; an adapter no decode agent serves
  // cannot be answered), and the identity `adapter`'s blocks are hashed
  // under: the one most healthy decode agents give it (a tie: the smallest
  // identity), nullopt when none serves it. An agent serving the name under
  // another identity (other files) is not sent that adapter's requests
  // (AgentState::serves).
  std::vector<std::string> adapterNames();
  std::optional<std::string> adapterIdentity(const std::string& adapter);
  bool anyHealthy(bool prefill);
  // The tokens the smallest healthy decode agent's KV cache holds (its
  // tandem.kv_cache_tokens): what a request's prompt plus max_tokens must
  // fit whichever decode agent serves it. 0 while none is known.
  int64_t smallestDecodeCache();
  // Sets every listed agent's ledger gauges to `counts(agent)` (called
  // under the tracker's lock, so an unlisted agent's series stay gone).
  void publishLedger(const std::function<LedgerCounts(const AgentState&)>& counts);
  // How many of `hashes` each agent holds as a leading run (ownership index),
  // from one walk over them; agents absent hold none.
  std::unordered_map<std::string, int64_t> leadingBlocksForAll(
      const std::vector<BlockHash>& hashes) {
    return index_.leadingBlocksForAll(hashes);
  }
  // OwnershipIndex::expect and unexpect.
  void expectBlocks(const std::string& agent, std::span<const BlockHash> hashes,
                    std::chrono::steady_clock::duration ttl) {
    index_.expect(agent, hashes, ttl);
  }
  void unexpectBlocks(const std::string& agent, std::span<const BlockHash> hashes) {
    index_.unexpect(agent, hashes);
  }

 private:
  // Whether more of the healthy listed decode agents (`polled` counted as
  // healthy) serve model `identity` than model `than`.
  bool moreDecodeAgentsServe(const AgentState& polled, const std::string& identity,
                             const std::string& than);

  void watch(const AgentPtr& agent);
  void setHealthyIfListed(const AgentState& agent, bool healthy);
  void setRequestsIfListed(const AgentState& agent);
  void setIndexBlocksIfListed(const AgentState& agent);
  boost::asio::awaitable<void> pollLoop(AgentPtr agent);
  // One poll of /health and, when healthy, /metrics: whether it is healthy.
  boost::asio::awaitable<bool> pollOnce(AgentState& agent);
  boost::asio::awaitable<void> eventLoop(AgentPtr agent);

  boost::asio::io_context& ioc_;
  const double poll_interval_s_;
  const std::atomic<bool>& stopping_;
  RouterMetrics& metrics_;
  ServedModel& model_;
  std::atomic<bool> started_{false};
  std::function<int64_t(const AgentState&)> ledger_requests_;

  std::mutex mutex_;  // guards agents_ and each agent's listed/series changes
  std::map<std::string, AgentPtr> agents_;
  OwnershipIndex index_;
};

}  // namespace tandem::router
