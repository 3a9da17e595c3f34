// `spec.autoscaling` of a PrefillPool or DecodePool: the bounds, targets and
// pacing the SLA planner (planner.h) works with. Parsing checks every field
// and reports the first wrong one by its path, e.g.
// `spec.autoscaling.quantile must be a number above 0 and below 1, got 1.5`.
//
// Defaults follow the HorizontalPodAutoscaler's behaviour where it has one
// (scale-down stabilisation 300 s, scale-up 0 s, a step of at most 4 replicas)
// and are listed in docs/planner.md. Plain values; no thread-safety concerns.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tandem::planner {

// Which signal a pool is scaled on: prefill pools by time to first token and
// queued prefill tokens, decode pools by inter-token latency, running
// sequences and KV cache usage.
enum class PoolKind { kPrefill, kDecode };

// "prefill" or "decode".
const char* poolKindName(PoolKind kind);

inline constexpr int kMaxReplicasLimit = 1000;

struct AutoscalingSpec {
  int min_replicas = 1;
  // Required (no default): how far the planner may scale a pool is a cost
  // decision only the user can make.
  int max_replicas = 0;
  // The latency target of the pool's kind: TTFT on prefill pools, ITL on
  // decode pools (exactly one of them is set after parsing).
  std::optional<double> target_ttft_seconds;
  std::optional<double> target_itl_seconds;
  // Optional load targets, per replica (each, when set, is one more signal;
  // the largest recommendation wins).
  std::optional<double> target_queued_prefill_tokens_per_replica;  // prefill
  std::optional<double> target_running_sequences_per_replica;      // decode
  std::optional<double> target_kv_cache_usage;                     // decode, (0, 1]
  double quantile = 0.9;
  double window_seconds = 60;
  double scale_up_stabilization_seconds = 0;
  double scale_down_stabilization_seconds = 300;
  int max_step = 4;
  double pending_timeout_seconds = 300;

  // The latency target of `kind`'s signal (target_ttft_seconds or
  // target_itl_seconds).
  double targetSeconds(PoolKind kind) const;
};

// Reads `value` (the JSON object at spec.autoscaling) for a pool of `kind`.
// InvalidArgument naming the field and the accepted range when a field has
// the wrong type or is out of range, when a field is unknown, when the
// latency target of the pool's kind is missing, or when a field belongs to
// the other kind (targetITLSeconds on a prefill pool).
StatusOr<AutoscalingSpec> parseAutoscalingSpec(const nlohmann::json& value, PoolKind kind);
// The same from JSON text (a syntax error is InvalidArgument too).
StatusOr<AutoscalingSpec> parseAutoscalingSpecText(std::string_view json_text, PoolKind kind);

}  // namespace tandem::planner
