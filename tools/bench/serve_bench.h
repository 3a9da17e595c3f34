// `tandem-bench serve`: load test of a running OpenAI-compatible server.
//
// Sends --num-prompts streaming /v1/completions requests whose prompts are
// random token ids (so input lengths are exact) with ignore_eos and
// temperature 0 (so output lengths are exact), arriving all at once or as a
// Poisson process, optionally capped at --max-concurrency in flight. Measures
// per request the time to first token, the gaps between token chunks and the
// end-to-end latency, and over the run the request and token throughputs and
// the goodput under the given SLOs. Prints a table and optionally writes JSON
// with every figure and one record per request. Asserts nothing about speed;
// the exit code is 1 when any request failed, so scripts notice that the
// figures cover fewer requests than asked.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

struct ServeBenchOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme://host:port of the server
  std::string model;                          // empty: the first of GET /v1/models
  int num_prompts = 100;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf: all at once
  int max_concurrency = 0;                                        // 0: no cap
  int64_t input_len = 1024;
  double input_len_range = 0.0;  // lengths uniform in [len*(1-range), len*(1+range)]
  int64_t output_len = 128;
  double output_len_range = 0.0;
  uint64_t seed = 0;
  std::string vocab_range = "100:5000";  // prompt token ids drawn from [LO, HI)
  // Sent as every request's "priority" (vLLM's field; the server must
  // schedule by priority unless it is 0); unset: not sent.
  std::optional<int64_t> priority;
  std::vector<std::string> goodput;  // SLOs as "ttft:MS", "tpot:MS", "e2el:MS"
  double read_timeout_s = 600.0;     // longest wait for the next bytes of a response
  std::string json_path;             // empty: no JSON file
};

// Runs the benchmark against options.url. Returns 0 when every request
// completed, 1 when any failed (the figures are printed either way). Throws
// tandem::Error for bad options or when the server cannot be asked for its
// model list.
int runServeBench(const ServeBenchOptions& options);

}  // namespace tandem::bench
