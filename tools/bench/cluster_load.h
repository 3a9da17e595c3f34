// Load for tandem-bench's chaos and soak programs, and how its outcomes are
// judged: multi-turn conversations (multiturn_bench.h's plan, streamed
// greedy /v1/completions with token ids) sent by client threads until
// stopped; every request ends as one Outcome; every answer that came back
// complete can be checked token for token against a colocated reference
// agent (greedy decoding is exact however a request was split, batched or
// moved between agents).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/subprocess.h"
#include "tools/bench/openai_client.h"

namespace tandem::bench {

// How one request ended.
enum class Outcome {
  kOk,             // 200 and a complete answer ([DONE] for a stream)
  kCleanError,     // HTTP 4xx/5xx with a JSON error body, or an SSE error event then [DONE]
  kUncleanError,   // an error status without a JSON error body
  kHang,           // no byte for the hang timeout
  kTruncated,      // a 200 stream closed without [DONE] (and no error event before one)
  kRefusedOrReset  // the connection was refused or reset before any response
};
inline constexpr size_t kNumOutcomes = 6;
const char* outcomeName(Outcome outcome);

// The outcome of a streamed completion; `hang_timeout_s` is the read timeout
// it ran with.
Outcome classify(const StreamedCompletion& result, double hang_timeout_s);

struct OutcomeCounts {
  std::array<int64_t, kNumOutcomes> counts{};
  void add(Outcome outcome) { ++counts[static_cast<size_t>(outcome)]; }
  int64_t operator[](Outcome outcome) const { return counts[static_cast<size_t>(outcome)]; }
  int64_t total() const;
  // Outcomes that must never happen: hangs, truncated streams, unclean errors.
  int64_t broken() const;
  nlohmann::json toJson() const;
};

// Header of the outcome table, then one row per call (label in the first column).
void printOutcomeHeader(const char* label);
void printOutcomeRow(const std::string& label, const OutcomeCounts& counts);

// One request whose answer is kept for the exactness check.
struct AnsweredRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  std::vector<int32_t> token_ids;
};

// A greedy completion request body: token ids in, token ids out, ignore_eos.
std::string greedyBody(const std::string& model, const std::vector<int32_t>& prompt,
                       int64_t max_tokens, bool stream);

// A non-streamed completion as a client sees it.
struct PlainCompletion {
  Outcome outcome = Outcome::kRefusedOrReset;
  int status = 0;
  bool retry_after = false;  // a Retry-After header came with it
  std::string error;
  std::vector<int32_t> token_ids;
};
PlainCompletion postCompletion(const std::string& base_url, const std::string& body,
                               double hang_timeout_s);

struct LoadOptions {
  int clients = 4;
  int turns = 4;
  int64_t shared_prefix_tokens = 32;
  std::string input_tokens = "uniform:16,48";
  std::string output_tokens = "uniform:8,24";
  std::string vocab_range = "3:480";  // the tiny test model's text vocabulary
  uint64_t seed = 0;
  double hang_timeout_s = 30.0;
};

// One request of the load.
struct LoadRecord {
  int phase = 0;  // the phase (see setPhase) when it was sent
  Outcome outcome = Outcome::kOk;
  AnsweredRequest request;  // token_ids only when the outcome is kOk
  StreamedCompletion result;
};

// Client threads, each sending conversations turn after turn (a failed turn
// ends its conversation) until stop(); conversation n is drawn from seed + n,
// so the load never repeats and needs no plan of its own length.
class MultiTurnLoad {
 public:
  MultiTurnLoad(std::string base_url, std::string model, LoadOptions options);
  ~MultiTurnLoad();
  MultiTurnLoad(const MultiTurnLoad&) = delete;
  MultiTurnLoad& operator=(const MultiTurnLoad&) = delete;

  void start();
  // Requests sent from now on are marked with `phase`.
  void setPhase(int phase) { phase_.store(phase); }
  // Lets every request in flight end, joins the clients; idempotent.
  void stop();
  // Every record so far (copies); safe while running.
  std::vector<LoadRecord> records();
  int64_t completedRequests() const { return finished_.load(); }

 private:
  void client(int id);

  std::string base_url_, model_;
  LoadOptions options_;
  std::vector<int32_t> shared_prefix_;
  Clock::time_point start_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> phase_{0};
  std::atomic<int64_t> next_conversation_{0};
  std::atomic<int64_t> finished_{0};
  std::mutex mutex_;
  std::vector<LoadRecord> records_;
  std::vector<std::thread> threads_;
};

// A colocated `tandem-agent serve` (no KV connector) computing what the
// cluster computes, for comparison.
class ReferenceAgent {
 public:
  ReferenceAgent(const std::string& agent_bin, const std::vector<std::string>& flags,
                 const std::filesystem::path& log_dir);
  std::string url() const { return url_; }

 private:
  std::unique_ptr<Subprocess> process_;
  std::string url_;
};

struct ExactnessReport {
  int64_t checked = 0;
  int64_t mismatched = 0;
  int64_t reference_failures = 0;  // the reference could not answer
  std::vector<std::string> examples;
  nlohmann::json toJson() const;
};

// Sends every request to the reference (`parallel` at a time) and compares
// token ids.
ExactnessReport checkExactness(const std::string& reference_url, const std::string& model,
                               const std::vector<AnsweredRequest>& requests, int parallel);

}  // namespace tandem::bench
