#include "tools/bench/cluster_load.h"

#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/multiturn_bench.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

constexpr size_t kExamplesKept = 5;
constexpr std::chrono::milliseconds kBackoffAfterFailure{200};

// A hang is a read that timed out: no byte for (about) the whole timeout.
bool timedOut(double idle_s, double hang_timeout_s) { return idle_s >= 0.95 * hang_timeout_s; }

}  // namespace

const char* outcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kCleanError:
      return "clean_error";
    case Outcome::kUncleanError:
      return "unclean_error";
    case Outcome::kHang:
      return "hang";
    case Outcome::kTruncated:
      return "truncated";
    case Outcome::kRefusedOrReset:
      return "refused_or_reset";
  }
  return "?";
}

Outcome classify(const StreamedCompletion& r, double hang_timeout_s) {
  if (r.success) return Outcome::kOk;
  if (r.transport_error && timedOut(r.idle_s, hang_timeout_s)) return Outcome::kHang;
  if (r.http_status == 0) return Outcome::kRefusedOrReset;
  if (r.http_status != 200) {
    return r.error_body_json ? Outcome::kCleanError : Outcome::kUncleanError;
  }
  // A 200 stream: an error event must be followed by [DONE].
  if (r.error_event) return r.saw_done ? Outcome::kCleanError : Outcome::kTruncated;
  // Ended without [DONE], or complete but not the answer asked for
  // (no usage, no tokens): the client cannot trust it.
  return Outcome::kTruncated;
}

int64_t OutcomeCounts::total() const {
  int64_t sum = 0;
  for (int64_t count : counts) sum += count;
  return sum;
}

int64_t OutcomeCounts::broken() const {
  return (*this)[Outcome::kHang] + (*this)[Outcome::kTruncated] + (*this)[Outcome::kUncleanError];
}

json OutcomeCounts::toJson() const {
  json out = {{"requests", total()}};
  for (size_t i = 0; i < kNumOutcomes; ++i) out[outcomeName(static_cast<Outcome>(i))] = counts[i];
  return out;
}

void printOutcomeHeader(const char* label) {
  std::printf("%-22s %9s %8s %11s %13s %6s %10s %16s\n", label, "requests", "ok", "clean_error",
              "unclean_error", "hang", "truncated", "refused_or_reset");
}

void printOutcomeRow(const std::string& label, const OutcomeCounts& c) {
  std::printf("%-22s %9lld %8lld %11lld %13lld %6lld %10lld %16lld\n", label.c_str(),
              static_cast<long long>(c.total()), static_cast<long long>(c[Outcome::kOk]),
              static_cast<long long>(c[Outcome::kCleanError]),
              static_cast<long long>(c[Outcome::kUncleanError]),
              static_cast<long long>(c[Outcome::kHang]),
              static_cast<long long>(c[Outcome::kTruncated]),
              static_cast<long long>(c[Outcome::kRefusedOrReset]));
}

std::string greedyBody(const std::string& model, const std::vector<int32_t>& prompt,
                       int64_t max_tokens, bool stream) {
  json body = {{"model", model},     {"prompt", prompt},   {"max_tokens", max_tokens},
               {"temperature", 0.0}, {"ignore_eos", true}, {"return_token_ids", true},
               {"stream", stream}};
  if (stream) body["stream_options"] = {{"include_usage", true}};
  return body.dump();
}

PlainCompletion postCompletion(const std::string& base_url, const std::string& body,
                               double hang_timeout_s) {
  PlainCompletion out;
  const Clock::time_point sent = Clock::now();
  try {
    httplib::Client client(base_url);
    client.set_connection_timeout(10, 0);
    client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::duration<double>(hang_timeout_s)));
    client.set_keep_alive(false);
    auto result = client.Post("/v1/completions", body, "application/json");
    if (!result) {
      out.error = "request failed: " + httplib::to_string(result.error());
      out.outcome = timedOut(secondsBetween(sent, Clock::now()), hang_timeout_s)
                        ? Outcome::kHang
                        : Outcome::kRefusedOrReset;
      return out;
    }
    out.status = result->status;
    out.retry_after = result->has_header("Retry-After");
    const json answer = json::parse(result->body, nullptr, false);
    if (result->status != 200) {
      const bool json_error = answer.is_object() && answer.contains("error") &&
                              answer["error"].is_object() && answer["error"].contains("message");
      out.outcome = json_error ? Outcome::kCleanError : Outcome::kUncleanError;
      out.error = "HTTP " + std::to_string(result->status) + ": " +
                  (json_error ? answer["error"]["message"].dump() : result->body.substr(0, 200));
      return out;
    }
    try {
      out.token_ids = answer.at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
      out.outcome = Outcome::kOk;
    } catch (const std::exception& e) {
      out.outcome = Outcome::kTruncated;  // a 200 whose body is not the answer
      out.error = std::string("malformed answer: ") + e.what();
    }
  } catch (const std::exception& e) {
    out.error = std::string("request failed: ") + e.what();
  }
  return out;
}

MultiTurnLoad::MultiTurnLoad(std::string base_url, std::string model, LoadOptions options)
    : base_url_(std::move(base_url)), model_(std::move(model)), options_(std::move(options)) {
  // Validates the specs (they throw naming the option) and draws the prefix.
  MultiTurnBenchOptions plan_options;
  plan_options.num_conversations = 1;
  plan_options.turns = 1;
  plan_options.shared_prefix_tokens = options_.shared_prefix_tokens;
  plan_options.seed = options_.seed;
  const Plan plan =
      makePlan(plan_options, TokenCountDistribution::parse(options_.input_tokens, "--input-tokens"),
               TokenCountDistribution::parse(options_.output_tokens, "--output-tokens"),
               parseVocabRange(options_.vocab_range));
  shared_prefix_ = plan.prefixes.front();
}

MultiTurnLoad::~MultiTurnLoad() { stop(); }

void MultiTurnLoad::start() {
  start_ = Clock::now();
  for (int i = 0; i < options_.clients; ++i) threads_.emplace_back([this, i] { client(i); });
}

void MultiTurnLoad::stop() {
  stopping_ = true;
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

std::vector<LoadRecord> MultiTurnLoad::records() {
  std::lock_guard lock(mutex_);
  return records_;
}

void MultiTurnLoad::client(int) {
  const auto input = TokenCountDistribution::parse(options_.input_tokens, "--input-tokens");
  const auto output = TokenCountDistribution::parse(options_.output_tokens, "--output-tokens");
  const auto vocab = parseVocabRange(options_.vocab_range);
  while (!stopping_) {
    const int64_t n = next_conversation_.fetch_add(1);
    MultiTurnBenchOptions plan_options;
    plan_options.num_conversations = 1;
    plan_options.turns = options_.turns;
    plan_options.shared_prefix_tokens = 0;
    plan_options.seed = options_.seed + 1 + static_cast<uint64_t>(n);
    const Plan plan = makePlan(plan_options, input, output, vocab);
    std::vector<int32_t> history = shared_prefix_;
    for (const TurnPlan& turn : plan.conversations.front().turns) {
      if (stopping_) return;
      history.insert(history.end(), turn.user_tokens.begin(), turn.user_tokens.end());
      LoadRecord record;
      record.phase = phase_.load();
      record.request.prompt = history;
      record.request.max_tokens = turn.output_len;
      record.result =
          streamCompletion(base_url_, greedyBody(model_, history, turn.output_len, true),
                           options_.hang_timeout_s, start_);
      record.outcome = classify(record.result, options_.hang_timeout_s);
      if (record.outcome == Outcome::kOk &&
          static_cast<int64_t>(record.result.token_ids.size()) != turn.output_len) {
        record.outcome = Outcome::kTruncated;  // fewer tokens than asked with ignore_eos
        record.result.error = "answer of " + std::to_string(record.result.token_ids.size()) +
                              " tokens for max_tokens " + std::to_string(turn.output_len);
      }
      const bool ok = record.outcome == Outcome::kOk;
      if (ok) record.request.token_ids = record.result.token_ids;
      const std::vector<int32_t> answer = record.request.token_ids;
      {
        std::lock_guard lock(mutex_);
        records_.push_back(std::move(record));
      }
      ++finished_;
      if (!ok) {
        // As a client would: not straight back at a cluster that just refused.
        std::this_thread::sleep_for(kBackoffAfterFailure);
        break;
      }
      history.insert(history.end(), answer.begin(), answer.end());
    }
  }
}

ReferenceAgent::ReferenceAgent(const std::string& agent_bin, const std::vector<std::string>& flags,
                               const std::filesystem::path& log_dir) {
  std::vector<std::string> argv = {agent_bin, "serve", "--host", "127.0.0.1", "--port", "0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  process_ = std::make_unique<Subprocess>(argv, log_dir / "reference-agent.stderr");
  const std::string line = process_->waitForLine("listening on ", std::chrono::seconds(300));
  if (line.empty()) {
    throw Error("the reference agent did not start: " + process_->stderrText().substr(0, 2000));
  }
  url_ = "http://127.0.0.1:" + std::to_string(std::stoi(line.substr(line.rfind(':') + 1)));
}

json ExactnessReport::toJson() const {
  return {{"checked", checked},
          {"mismatched", mismatched},
          {"reference_failures", reference_failures},
          {"examples", examples}};
}

ExactnessReport checkExactness(const std::string& reference_url, const std::string& model,
                               const std::vector<AnsweredRequest>& requests, int parallel) {
  ExactnessReport report;
  std::mutex mutex;
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
      const AnsweredRequest& request = requests[i];
      const PlainCompletion expected = postCompletion(
          reference_url, greedyBody(model, request.prompt, request.max_tokens, false), 600.0);
      std::lock_guard lock(mutex);
      if (expected.outcome != Outcome::kOk) {
        ++report.reference_failures;
        if (report.examples.size() < kExamplesKept) {
          report.examples.push_back("reference failed: " + expected.error);
        }
        continue;
      }
      ++report.checked;
      if (expected.token_ids != request.token_ids) {
        ++report.mismatched;
        if (report.examples.size() < kExamplesKept) {
          size_t at = 0;
          while (at < expected.token_ids.size() && at < request.token_ids.size() &&
                 expected.token_ids[at] == request.token_ids[at]) {
            ++at;
          }
          report.examples.push_back("prompt of " + std::to_string(request.prompt.size()) +
                                    " tokens: answers differ from token " + std::to_string(at));
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, parallel); ++i) threads.emplace_back(worker);
  for (std::thread& thread : threads) thread.join();
  return report;
}

}  // namespace tandem::bench
