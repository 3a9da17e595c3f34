// The agent's Prometheus metrics, served at /metrics in the text format.
//
// Latency histograms are observed by the HTTP layer as outputs reach the
// client (TTFT, inter-token latency, end-to-end) and from the engine's
// timings (queue, prefill, decode). Counters and gauges that the engine keeps
// (prefix cache, preemptions, running/waiting, queued prefill tokens, KV usage) are brought up to
// date from an EngineStats snapshot at each scrape. Every series carries the
// labels model and role. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/engine/engine.h"
#include "common/http/http_limits.h"
#include "common/protocol/request.h"

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

class AgentMetrics {
 public:
  AgentMetrics(const std::string& model, const std::string& role);
  ~AgentMetrics();

  void observeTimeToFirstToken(double seconds);
  void observeInterTokenLatency(double seconds);
  // A finished request: end-to-end latency, stage times from the engine's
  // timings, token counters and the finish-reason counter.
  // `resumed_tokens`: a resumed stream's tokens another agent generated,
  // left out of tandem_generation_tokens_total.
  void observeFinished(const engine::RequestOutput& final_output, double e2e_seconds,
                       int64_t resumed_tokens = 0);
  // A request refused before it reached the engine (bad input, overload).
  void observeRejected(const std::string& reason);
  // tandem_lora_requests_total{adapter}: a series at 0 for each adapter
  // served (setLoraAdapters, at start), one more for each request naming it.
  void setLoraAdapters(const std::vector<std::string>& adapters);
  void observeLoraRequest(const std::string& adapter);
  // tandem_device_info{device, description} 1: the compute backend (device
  // "cpu" or "cuda"; description as Backend::description()).
  void setDevice(const std::string& device, const std::string& description);
  // tandem_simulated_info{profile} 1: the agent is simulated (--simulate)
  // with this step-time profile; never set on a real agent.
  void setSimulated(const std::string& profile);
  // tandem_kv_buffer_info{path} 1 (path "slab" or "staging", the ucx
  // connector's KV buffer), tandem_kv_staging_blocks / _used on the
  // staging path and tandem_kv_hold_slots / _used on a producer; `info` as
  // UcxConnector::info() (null: nothing is set).
  void setKvBuffer(const nlohmann::json& info);
  // The HTTP front's connection series (common/http/http_metrics.h), as
  // HttpService::frontStats() says now; call before render().
  void observeHttpFront(const HttpFrontStats& stats);

  // Brings engine-kept figures up to date (counters and the KV load
  // histogram advance by what the engine counted since the last render)
  // and renders the text format.
  std::string render(const engine::EngineStats& stats);

 private:
  std::mutex mutex_;
  std::string model_;
  std::string role_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpFrontMetrics> http_front_;
  prometheus::Gauge* kv_buffer_info_ = nullptr;
  prometheus::Gauge* kv_staging_blocks_ = nullptr;
  prometheus::Gauge* kv_staging_used_ = nullptr;
  prometheus::Gauge* kv_hold_slots_ = nullptr;
  prometheus::Gauge* kv_hold_slots_used_ = nullptr;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* prefill_time_;
  prometheus::Histogram* decode_time_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* priority_preemptions_;
  prometheus::Counter* step_failures_;
  prometheus::Counter* prefix_waits_;
  prometheus::Counter* computed_tokens_;
  prometheus::Family<prometheus::Counter>* kv_blocks_loaded_;
  prometheus::Counter* kv_blocks_recomputed_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* lora_requests_;
  // Speculative decoding's (series only on an agent that speculates).
  prometheus::Family<prometheus::Counter>* spec_drafts_;
  prometheus::Family<prometheus::Counter>* spec_draft_tokens_;
  prometheus::Family<prometheus::Counter>* spec_accepted_;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_position_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* prefill_tokens_waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* free_blocks_;
  prometheus::Gauge* held_blocks_;
  prometheus::Gauge* grammar_cache_grammars_;
  prometheus::Gauge* grammar_cache_bytes_;
  prometheus::Gauge* draining_;
  prometheus::Counter* handovers_;
  prometheus::Counter* handover_blocks_;
  prometheus::Counter* holds_yielded_;
  prometheus::Family<prometheus::Counter>* kv_transfer_bytes_;
  prometheus::Family<prometheus::Histogram>* kv_transfer_duration_;
  prometheus::Family<prometheus::Counter>* kv_transfer_failures_;
  // Engine totals already added to the counters above.
  engine::EngineStats reported_;
};

}  // namespace tandem::server
