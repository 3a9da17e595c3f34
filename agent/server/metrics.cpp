#include "agent/server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "common/http/http_metrics.h"
#include "common/latency_buckets.h"

namespace tandem::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Shared with the router's histograms (common/latency_buckets.h).
const Histogram::BucketBoundaries& kTtftBuckets = kTtftBucketBounds;
const Histogram::BucketBoundaries& kItlBuckets = kItlBucketBounds;
const Histogram::BucketBoundaries& kRequestBuckets = kRequestBucketBounds;

const Histogram::BucketBoundaries kTransferBuckets(engine::kKvLoadSecondsBounds.begin(),
                                                   engine::kKvLoadSecondsBounds.end());

// tandem_kv_transfer_failures_total's reasons (docs/kv-transfer.md, "Failure
// reasons"; `evicted` from the offload tier).
constexpr const char* kKvTransferFailureReasons[] = {
    "bad_params",     "incompatible",    "auth",         "unreachable", "bad_handshake",
    "peer_restarted", "read_error",      "timeout",      "injected",    "injected_handshake",
    "missing",        "truncated",       "format",       "checksum",    "evicted",
    "staging_full",   "prefix_mismatch", "hold_expired", "peer_down",   "unreadable",
    "hold_ended",     "holds_full",      "copy_error"};

double secondsBetween(engine::Clock::time_point from, engine::Clock::time_point to) {
  if (from == engine::Clock::time_point{} || to == engine::Clock::time_point{} || to < from) {
    return 0.0;
  }
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void AgentMetrics::setDevice(const std::string& device, const std::string& description) {
  std::lock_guard<std::mutex> lock(mutex_);
  BuildGauge()
      .Name("tandem_device_info")
      .Help("The compute backend the engine runs on (always 1).")
      .Register(*registry_)
      .Add({{"model", model_}, {"role", role_}, {"device", device}, {"description", description}})
      .Set(1);
}

void AgentMetrics::setSimulated(const std::string& profile) {
  std::lock_guard<std::mutex> lock(mutex_);
  BuildGauge()
      .Name("tandem_simulated_info")
      .Help("The agent simulates its forward passes with this step-time profile (always 1).")
      .Register(*registry_)
      .Add({{"model", model_}, {"role", role_}, {"profile", profile}})
      .Set(1);
}

void AgentMetrics::setKvBuffer(const nlohmann::json& info) {
  if (!info.is_object() || !info.contains("kv_buffer") || !info["kv_buffer"].is_string()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (kv_buffer_info_ == nullptr) {
    kv_buffer_info_ = &BuildGauge()
                           .Name("tandem_kv_buffer_info")
                           .Help(
                               "Where the ucx connector's KV bytes move from: the KV slab "
                               "itself or a host staging area (always 1).")
                           .Register(*registry_)
                           .Add({{"model", model_},
                                 {"role", role_},
                                 {"path", info["kv_buffer"].get<std::string>()}});
    kv_buffer_info_->Set(1);
  }
  if (info.contains("staging_blocks")) {
    const prometheus::Labels labels = {{"model", model_}, {"role", role_}};
    if (kv_staging_blocks_ == nullptr) {
      kv_staging_blocks_ = &BuildGauge()
                                .Name("tandem_kv_staging_blocks")
                                .Help("Block slots of the ucx connector's host staging area.")
                                .Register(*registry_)
                                .Add(labels);
      kv_staging_used_ = &BuildGauge()
                              .Name("tandem_kv_staging_blocks_used")
                              .Help("Staging slots holding blocks for a transfer now.")
                              .Register(*registry_)
                              .Add(labels);
    }
    kv_staging_blocks_->Set(info.value("staging_blocks", 0.0));
    kv_staging_used_->Set(info.value("staging_blocks_used", 0.0));
  }
  if (info.contains("hold_slots")) {
    const prometheus::Labels labels = {{"model", model_}, {"role", role_}};
    if (kv_hold_slots_ == nullptr) {
      kv_hold_slots_ = &BuildGauge()
                            .Name("tandem_kv_hold_slots")
                            .Help(
                                "Hold tickets of the ucx connector: holds that can offer "
                                "blocks at once (kv_connector_extra_config.hold_slots).")
                            .Register(*registry_)
                            .Add(labels);
      kv_hold_slots_used_ = &BuildGauge()
                                 .Name("tandem_kv_hold_slots_used")
                                 .Help("Hold tickets taken now: holds offering blocks to a reader.")
                                 .Register(*registry_)
                                 .Add(labels);
    }
    kv_hold_slots_->Set(info.value("hold_slots", 0.0));
    kv_hold_slots_used_->Set(info.value("hold_slots_used", 0.0));
  }
}

AgentMetrics::AgentMetrics(const std::string& model, const std::string& role)
    : model_(model), role_(role), registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels = {{"model", model_}, {"role", role_}};
  http_front_ = std::make_unique<HttpFrontMetrics>(*registry_, labels);
  auto histogram = [&](const char* name, const char* help,
                       const Histogram::BucketBoundaries& buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(*registry_).Add(labels, buckets);
  };
  // A family of counters, its series labelled further by the caller.
  auto counters = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry_);
  };
  auto counter = [&](const char* name, const char* help) {
    return &counters(name, help)->Add(labels);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  ttft_ = histogram("tandem_time_to_first_token_seconds",
                    "Time from request arrival to its first generated token.", kTtftBuckets);
  itl_ = histogram("tandem_inter_token_latency_seconds",
                   "Time between consecutive generated tokens of a request.", kItlBuckets);
  e2e_ = histogram("tandem_e2e_request_latency_seconds",
                   "Time from request arrival to its last output.", kRequestBuckets);
  queue_time_ = histogram("tandem_request_queue_time_seconds",
                          "Time a request waited before it was first scheduled.", kRequestBuckets);
  prefill_time_ = histogram("tandem_request_prefill_time_seconds",
                            "Time from first scheduling to the first token.", kRequestBuckets);
  decode_time_ = histogram("tandem_request_decode_time_seconds",
                           "Time from the first token to the last.", kRequestBuckets);
  prompt_tokens_ = counter("tandem_prompt_tokens_total", "Prompt tokens of finished requests.");
  generation_tokens_ =
      counter("tandem_generation_tokens_total", "Tokens generated for finished requests.");
  prefix_queries_ =
      counter("tandem_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.");
  prefix_hits_ =
      counter("tandem_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.");
  preemptions_ = counter("tandem_preemptions_total", "Sequences preempted for recompute.");
  priority_preemptions_ =
      counter("tandem_priority_preemptions_total",
              "Running sequences preempted to admit a request of a better priority "
              "(--scheduling-policy priority); also counted in tandem_preemptions_total.");
  prefix_waits_ = counter("tandem_prefix_waits_total",
                          "Requests admitted only after another request computed prompt blocks "
                          "they share (instead of computing them twice).");
  computed_tokens_ =
      counter("tandem_computed_tokens_total", "Tokens the model computed (prefill and decode).");
  step_failures_ = counter("tandem_engine_step_failures_total",
                           "Engine steps that failed (a backend's or KV connector's error); "
                           "their requests ended with an error.");
  kv_blocks_loaded_ = counters("tandem_kv_blocks_loaded_total",
                               "KV blocks loaded through the KV connector, by source.");
  kv_transfer_bytes_ = counters("tandem_kv_transfer_bytes_total",
                                "KV bytes loaded through the KV connector, by source.");
  kv_transfer_duration_ = &BuildHistogram()
                               .Name("tandem_kv_transfer_duration_seconds")
                               .Help("Duration of one request's KV load, by source.")
                               .Register(*registry_);
  kv_transfer_failures_ =
      counters("tandem_kv_transfer_failures_total",
               "KV transfers refused or loads failed through the KV connector, by reason.");
  kv_blocks_recomputed_ =
      counter("tandem_kv_blocks_recomputed_total",
              "KV blocks that failed to load through the connector and were recomputed or failed.");
  requests_ = counters("tandem_requests_total", "Finished requests by finish reason.");
  // Every finish reason has a series from the start (at 0): the first
  // request of a reason then shows as an increase, and rates over the
  // reasons exist before any request.
  for (const char* reason :
       {"stop", "length", "abort", "error", "invalid", "rejected", "handed_over"}) {
    requests_->Add({{"model", model_}, {"role", role_}, {"finish_reason", reason}});
  }
  lora_requests_ = counters("tandem_lora_requests_total",
                            "Requests that named a LoRA adapter as their model, by adapter.");
  spec_drafts_ = counters("tandem_spec_decode_num_drafts_total",
                          "Speculative decoding: sequence steps that computed drafts.");
  spec_draft_tokens_ = counters("tandem_spec_decode_num_draft_tokens_total",
                                "Speculative decoding: drafts computed.");
  spec_accepted_ = counters("tandem_spec_decode_num_accepted_tokens_total",
                            "Speculative decoding: drafts accepted (the token sampled at their "
                            "position was the draft).");
  spec_accepted_per_position_ =
      counters("tandem_spec_decode_num_accepted_tokens_per_pos_total",
               "Speculative decoding: drafts accepted, by position in their step's drafts.");
  running_ = gauge("tandem_num_requests_running", "Requests being computed.");
  waiting_ = gauge("tandem_num_requests_waiting", "Requests queued for computation.");
  prefill_tokens_waiting_ =
      gauge("tandem_num_prefill_tokens_waiting",
            "Prompt tokens of queued requests not yet computed (the prefill backlog).");
  kv_usage_ = gauge("tandem_kv_cache_usage_ratio", "Fraction of KV blocks in use.");
  free_blocks_ = gauge("tandem_kv_cache_free_blocks", "KV blocks free or evictable.");
  held_blocks_ =
      gauge("tandem_kv_held_blocks", "KV blocks of finished requests held for a remote reader.");
  grammar_cache_grammars_ = gauge("tandem_structured_output_grammars",
                                  "Compiled structured-output grammars cached (at most 64).");
  grammar_cache_bytes_ =
      gauge("tandem_structured_output_grammar_bytes",
            "Memory of the cached structured-output grammars as last counted (bound 512 MiB).");
  draining_ = gauge("tandem_draining",
                    "1 while the agent drains (SIGTERM or POST /admin/drain): it admits nothing.");
  handovers_ =
      counter("tandem_handovers_total", "Running requests handed over to another agent on drain.");
  holds_yielded_ = counter("tandem_kv_holds_yielded_total",
                           "Finished requests' KV holds ended before their reader came, for "
                           "waiting requests that needed the blocks (--kv-hold-yield-after).");
  handover_blocks_ =
      counter("tandem_handover_blocks_total",
              "KV blocks held on drain for the agents resuming handed-over requests.");
}

AgentMetrics::~AgentMetrics() = default;

void AgentMetrics::observeTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_->Observe(seconds);
}

void AgentMetrics::observeInterTokenLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  itl_->Observe(seconds);
}

void AgentMetrics::observeFinished(const engine::RequestOutput& out, double e2e_seconds,
                                   int64_t resumed_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  e2e_->Observe(e2e_seconds);
  const auto& t = out.timings;
  if (t.first_scheduled != engine::Clock::time_point{}) {
    queue_time_->Observe(secondsBetween(t.arrival, t.first_scheduled));
  }
  if (t.first_token != engine::Clock::time_point{}) {
    prefill_time_->Observe(secondsBetween(t.first_scheduled, t.first_token));
    decode_time_->Observe(secondsBetween(t.first_token, t.finished));
  }
  prompt_tokens_->Increment(static_cast<double>(out.num_prompt_tokens));
  // A resumed stream's usage counts the whole answer; this agent generated
  // only what followed the resumed tokens.
  generation_tokens_->Increment(
      static_cast<double>(std::max<int64_t>(0, out.num_generated_tokens - resumed_tokens)));
  requests_
      ->Add({{"model", model_},
             {"role", role_},
             {"finish_reason",
              out.handed_over ? "handed_over" : engine::finishReasonName(out.finish_reason)}})
      .Increment();
}

void AgentMetrics::observeRejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  requests_->Add({{"model", model_}, {"role", role_}, {"finish_reason", reason}}).Increment();
}

void AgentMetrics::setLoraAdapters(const std::vector<std::string>& adapters) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::string& adapter : adapters) {
    lora_requests_->Add({{"model", model_}, {"role", role_}, {"adapter", adapter}});
  }
}

void AgentMetrics::observeLoraRequest(const std::string& adapter) {
  std::lock_guard<std::mutex> lock(mutex_);
  lora_requests_->Add({{"model", model_}, {"role", role_}, {"adapter", adapter}}).Increment();
}

void AgentMetrics::observeHttpFront(const HttpFrontStats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  http_front_->update(stats);
}

std::string AgentMetrics::render(const engine::EngineStats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto advance = [](prometheus::Counter* counter, int64_t now, int64_t& reported) {
    if (now > reported) counter->Increment(static_cast<double>(now - reported));
    reported = std::max(reported, now);
  };
  advance(prefix_queries_, stats.prefix_cache_queries, reported_.prefix_cache_queries);
  advance(prefix_hits_, stats.prefix_cache_hits, reported_.prefix_cache_hits);
  advance(preemptions_, stats.num_preemptions, reported_.num_preemptions);
  advance(priority_preemptions_, stats.num_priority_preemptions,
          reported_.num_priority_preemptions);
  advance(prefix_waits_, stats.num_prefix_waits, reported_.num_prefix_waits);
  advance(computed_tokens_, stats.num_computed_tokens, reported_.num_computed_tokens);
  advance(step_failures_, stats.num_step_failures, reported_.num_step_failures);
  advance(handovers_, stats.num_handed_over, reported_.num_handed_over);
  advance(handover_blocks_, stats.num_handed_over_blocks, reported_.num_handed_over_blocks);
  advance(holds_yielded_, stats.num_holds_yielded, reported_.num_holds_yielded);
  if (!stats.kv_connector.empty()) {
    advance(kv_blocks_recomputed_, stats.kv_blocks_failed, reported_.kv_blocks_failed);
    // Series exist from the start for the connector's own name.
    auto labels = [&](const std::string& source) {
      return prometheus::Labels{{"model", model_}, {"role", role_}, {"source", source}};
    };
    kv_blocks_loaded_->Add(labels(stats.kv_connector));
    kv_transfer_bytes_->Add(labels(stats.kv_connector));
    kv_transfer_duration_->Add(labels(stats.kv_connector), kTransferBuckets);
    // Every documented failure reason has a series from the start (at 0), so
    // a rate over them shows 0 rather than no data.
    for (const char* reason : kKvTransferFailureReasons) {
      kv_transfer_failures_->Add({{"model", model_}, {"role", role_}, {"reason", reason}});
    }
    for (const auto& [source, totals] : stats.kv_sources) {
      engine::KvSourceTotals& reported = reported_.kv_sources[source];
      // The loads finished since the last render, bucket by bucket.
      std::vector<double> loads(totals.load_seconds_buckets.size());
      bool any_load = false;
      for (size_t i = 0; i < loads.size(); ++i) {
        const int64_t now = totals.load_seconds_buckets[i];
        loads[i] =
            static_cast<double>(std::max<int64_t>(now - reported.load_seconds_buckets[i], 0));
        any_load = any_load || loads[i] > 0;
        reported.load_seconds_buckets[i] = std::max(reported.load_seconds_buckets[i], now);
      }
      if (any_load) {
        kv_transfer_duration_->Add(labels(source), kTransferBuckets)
            .ObserveMultiple(loads, totals.load_seconds_sum - reported.load_seconds_sum);
        reported.load_seconds_sum = totals.load_seconds_sum;
      }
      advance(&kv_blocks_loaded_->Add(labels(source)), totals.blocks_loaded,
              reported.blocks_loaded);
      advance(&kv_transfer_bytes_->Add(labels(source)), totals.bytes, reported.bytes);
    }
    for (const auto& [reason, count] : stats.kv_transfer_failures) {
      advance(&kv_transfer_failures_->Add({{"model", model_}, {"role", role_}, {"reason", reason}}),
              count, reported_.kv_transfer_failures[reason]);
    }
  }
  if (!stats.spec_decode_accepted_per_position.empty()) {
    const prometheus::Labels labels{{"model", model_}, {"role", role_}};
    advance(&spec_drafts_->Add(labels), stats.spec_decode_num_drafts,
            reported_.spec_decode_num_drafts);
    advance(&spec_draft_tokens_->Add(labels), stats.spec_decode_num_draft_tokens,
            reported_.spec_decode_num_draft_tokens);
    advance(&spec_accepted_->Add(labels), stats.spec_decode_num_accepted_tokens,
            reported_.spec_decode_num_accepted_tokens);
    std::vector<int64_t>& reported = reported_.spec_decode_accepted_per_position;
    reported.resize(stats.spec_decode_accepted_per_position.size());
    for (size_t position = 0; position < reported.size(); ++position) {
      advance(&spec_accepted_per_position_->Add(
                  {{"model", model_}, {"role", role_}, {"position", std::to_string(position)}}),
              stats.spec_decode_accepted_per_position[position], reported[position]);
    }
  }
  running_->Set(static_cast<double>(stats.num_running));
  waiting_->Set(static_cast<double>(stats.num_waiting));
  prefill_tokens_waiting_->Set(static_cast<double>(stats.num_prefill_tokens_waiting));
  kv_usage_->Set(stats.kv_cache_usage);
  free_blocks_->Set(static_cast<double>(stats.num_free_blocks));
  held_blocks_->Set(static_cast<double>(stats.kv_held_blocks));
  grammar_cache_grammars_->Set(static_cast<double>(stats.grammar_cache_grammars));
  grammar_cache_bytes_->Set(static_cast<double>(stats.grammar_cache_bytes));
  draining_->Set(stats.draining ? 1 : 0);
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace tandem::server
