// The load ramp of `tandem-bench planner` and the figures drawn from it,
// without any I/O: phases parsed from the command line, Poisson arrival
// times, what each request measured, and per phase and overall the pools'
// replicas, TTFT/ITL p90 against the planner's targets, goodput and the
// seconds during which the windowed p90 missed its target.
//
// A phase is "DURATION:RATE:SHAPE", e.g. "60s:20:prefill": DURATION seconds
// (a trailing "s" is optional), requests at RATE per second with Poisson
// arrivals, SHAPE prefill (long prompts, short outputs) or decode (short
// prompts, long outputs). Every function here is pure and thread-compatible.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

enum class RampShape { kPrefill, kDecode };

struct RampPhase {
  double duration_s = 0.0;
  double rate = 0.0;  // requests per second
  RampShape shape = RampShape::kPrefill;
  std::string text;  // as written, for reports
};

// Parses "D:R:S,D:R:S,...". Throws tandem::Error naming --phases, the
// offending phase and what is accepted.
std::vector<RampPhase> parsePhases(const std::string& text);

// Token counts of each shape.
struct ShapeLengths {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};

struct PlannedRequest {
  double arrival_s = 0.0;  // since the start of the ramp
  size_t phase = 0;
  RampShape shape = RampShape::kPrefill;
};

// The arrivals of every phase in time order: exponential gaps at each
// phase's rate, drawn from `seed` (the same seed gives the same ramp).
std::vector<PlannedRequest> planArrivals(const std::vector<RampPhase>& phases, uint64_t seed);

// What one request measured; times in seconds since the start of the ramp.
struct RampRequest {
  size_t phase = 0;
  bool success = false;
  std::string error;
  double send_s = 0.0;
  double ttft_s = 0.0;              // from the send to the first token
  std::vector<double> itl_s;        // gaps between consecutive tokens
  std::vector<double> token_end_s;  // when each gap of itl_s ended
};

// One sample of the pools' ready replicas.
struct ReplicaSample {
  double time_s = 0.0;
  int prefill = 0;
  int decode = 0;
};

struct RampTargets {
  double ttft_s = 0.0;
  double itl_s = 0.0;
  double quantile = 0.9;
  double window_s = 10.0;  // the window of the "missed" p90
};

// One second of the run: the windowed quantiles at its end and what landed in it.
struct SecondFigures {
  double time_s = 0.0;  // the end of the second
  int prefill_replicas = 0, decode_replicas = 0;
  std::optional<double> ttft_window_q, itl_window_q;  // over (time - window, time]
  std::optional<double> ttft_bucket_q, itl_bucket_q;  // over (time - 1, time]
  bool prefill_missed = false, decode_missed = false;
};

struct PoolRange {
  int min = 0, max = 0;
};

struct RampSummary {
  std::string name;  // the phase as written, or "overall"
  double start_s = 0.0, end_s = 0.0;
  size_t requests = 0, failed = 0, good = 0;
  PoolRange prefill_replicas, decode_replicas;
  std::optional<double> ttft_q, itl_q;  // of the requests sent in it
  double goodput = 0.0;                 // good requests per second
  int prefill_missed_s = 0, decode_missed_s = 0;
};

struct RampFigures {
  std::vector<SecondFigures> seconds;
  std::vector<RampSummary> phases;
  RampSummary overall;
};

// The quantile `q` of `values` interpolated between closest ranks; nullopt
// when empty.
std::optional<double> quantileOf(std::vector<double> values, double q);

// A request is good when it succeeded, its TTFT is within the TTFT target and
// the quantile of its own ITL gaps is within the ITL target (a one-token
// answer has no gap and meets the ITL target).
bool meetsTargets(const RampRequest& request, const RampTargets& targets);

// Computes every figure. `samples` are in time order; the seconds run from
// 1 to the end of the last sample (or of the ramp, whichever is later).
RampFigures computeRampFigures(const std::vector<RampPhase>& phases,
                               const std::vector<RampRequest>& requests,
                               const std::vector<ReplicaSample>& samples,
                               const RampTargets& targets);

nlohmann::json rampSummaryJson(const RampSummary& summary);

}  // namespace tandem::bench
