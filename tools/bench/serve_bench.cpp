#include "tools/bench/serve_bench.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <semaphore>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/latency_stats.h"
#include "tools/bench/openai_client.h"
#include "tools/bench/progress_bar.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

constexpr size_t kErrorsKept = 10;    // in the JSON summary
constexpr size_t kErrorsPrinted = 3;  // under the table

// Service-level objectives for goodput, in milliseconds; unset ones are not checked.
struct Slos {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;

  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

Slos parseSlos(const std::vector<std::string>& specs) {
  Slos slos;
  for (const std::string& spec : specs) {
    const size_t colon = spec.find(':');
    const std::string key = spec.substr(0, colon);
    std::optional<double>* slot = key == "ttft"   ? &slos.ttft_ms
                                  : key == "tpot" ? &slos.tpot_ms
                                  : key == "e2el" ? &slos.e2el_ms
                                                  : nullptr;
    double value = 0.0;
    size_t used = 0;
    bool parsed = false;
    if (slot != nullptr && colon != std::string::npos) {
      try {
        value = std::stod(spec.substr(colon + 1), &used);
        parsed = used == spec.size() - colon - 1 && value > 0.0 && std::isfinite(value);
      } catch (const std::exception&) {
        parsed = false;
      }
    }
    if (!parsed) {
      throw Error("--goodput takes ttft:MS, tpot:MS or e2el:MS with MS a positive number, got \"" +
                  spec + "\"");
    }
    *slot = value;
  }
  return slos;
}

// What one request asks for and when it is due.
struct RequestPlan {
  std::vector<int32_t> prompt;
  int64_t output_len = 0;
  double arrival_s = 0.0;  // since the start of the run
};

// Sends one streaming completion and times it. Never throws: a failure of any
// kind comes back as a record with success false and the reason.
StreamedCompletion runRequest(const std::string& base_url, const std::string& model,
                              const RequestPlan& plan, const ServeBenchOptions& options,
                              Clock::time_point start) {
  json body = {
      {"model", model},     {"prompt", plan.prompt}, {"max_tokens", plan.output_len},
      {"temperature", 0.0}, {"stream", true},        {"stream_options", {{"include_usage", true}}},
      {"ignore_eos", true}};
  if (options.priority) body["priority"] = *options.priority;
  return streamCompletion(base_url, body.dump(), options.read_timeout_s, start);
}

std::vector<RequestPlan> planRequests(const ServeBenchOptions& options,
                                      std::pair<int32_t, int32_t> vocab) {
  std::mt19937_64 rng(options.seed);
  auto lengths = [](int64_t len, double range) {
    const int64_t low = std::max<int64_t>(1, static_cast<int64_t>(len * (1.0 - range)));
    const int64_t high = std::max(low, static_cast<int64_t>(len * (1.0 + range)));
    return std::uniform_int_distribution<int64_t>(low, high);
  };
  auto input_dist = lengths(options.input_len, options.input_len_range);
  auto output_dist = lengths(options.output_len, options.output_len_range);
  std::uniform_int_distribution<int32_t> token_dist(vocab.first, vocab.second - 1);

  std::vector<RequestPlan> plans(static_cast<size_t>(options.num_prompts));
  for (RequestPlan& plan : plans) {
    plan.prompt.resize(static_cast<size_t>(input_dist(rng)));
    for (int32_t& token : plan.prompt) token = token_dist(rng);
    plan.output_len = output_dist(rng);
  }
  // Poisson arrivals: exponential gaps with mean 1/rate; the first is due at once.
  if (std::isfinite(options.request_rate)) {
    std::exponential_distribution<double> gap(options.request_rate);
    for (size_t i = 1; i < plans.size(); ++i)
      plans[i].arrival_s = plans[i - 1].arrival_s + gap(rng);
  }
  return plans;
}

std::string lengthText(int64_t len, double range) {
  char text[64];
  if (range > 0.0) {
    std::snprintf(text, sizeof(text), "%lld (±%g%%)", static_cast<long long>(len), range * 100.0);
  } else {
    std::snprintf(text, sizeof(text), "%lld", static_cast<long long>(len));
  }
  return text;
}

void validate(const ServeBenchOptions& options) {
  if (options.num_prompts < 1) {
    throw Error("--num-prompts must be at least 1, got " + std::to_string(options.num_prompts));
  }
  if (!(options.request_rate > 0.0)) {
    throw Error("--request-rate must be a positive number of requests/s or inf, got " +
                numberText(options.request_rate));
  }
  if (options.max_concurrency < 0) {
    throw Error("--max-concurrency must be 0 (no cap) or more, got " +
                std::to_string(options.max_concurrency));
  }
  if (options.input_len < 1 || options.output_len < 1) {
    throw Error("--input-len and --output-len must be at least 1, got " +
                std::to_string(options.input_len) + " and " + std::to_string(options.output_len));
  }
  for (double range : {options.input_len_range, options.output_len_range}) {
    if (!(range >= 0.0 && range < 1.0)) {
      throw Error("--input-len-range and --output-len-range must be in [0, 1), got " +
                  numberText(range));
    }
  }
  if (!(options.read_timeout_s > 0.0)) {
    throw Error("--read-timeout must be a positive number of seconds, got " +
                numberText(options.read_timeout_s));
  }
}

}  // namespace

int runServeBench(const ServeBenchOptions& options) {
  validate(options);
  const std::string base_url = checkedBaseUrl(options.url, "--url");
  const Slos slos = parseSlos(options.goodput);
  const auto vocab = parseVocabRange(options.vocab_range);
  {
    httplib::Client probe(base_url);
    if (!probe.is_valid()) throw Error("--url is not a URL httplib can connect to: " + options.url);
  }

  // The model list also gives the context length, so prompts that cannot fit
  // are refused here rather than failing one by one.
  std::string model = options.model;
  std::optional<int64_t> max_model_len;
  {
    std::vector<ServedModel> models;
    try {
      models = listModels(base_url, options.read_timeout_s);
    } catch (const Error&) {
      if (model.empty()) throw;  // with --model given, the requests will report it
    }
    if (model.empty()) {
      if (models.empty()) throw Error(base_url + "/v1/models lists no model; pass --model");
      model = models.front().id;
    }
    for (const ServedModel& served : models) {
      if (served.id == model) max_model_len = served.max_model_len;
    }
  }

  std::vector<RequestPlan> plans = planRequests(options, vocab);
  if (max_model_len) {
    for (const RequestPlan& plan : plans) {
      const int64_t needed = static_cast<int64_t>(plan.prompt.size()) + plan.output_len;
      if (needed > *max_model_len) {
        throw Error("a request needs " + std::to_string(needed) + " tokens (input " +
                    std::to_string(plan.prompt.size()) + " + output " +
                    std::to_string(plan.output_len) + ") but " + model + " has max_model_len " +
                    std::to_string(*max_model_len) + "; lower --input-len or --output-len");
      }
    }
  }

  char rate_text[64] = "all at once";
  if (std::isfinite(options.request_rate)) {
    std::snprintf(rate_text, sizeof(rate_text), "%g req/s (Poisson)", options.request_rate);
  }
  std::printf(
      "tandem-bench serve: %s, model %s, %d requests, %s, max concurrency %s\n", base_url.c_str(),
      model.c_str(), options.num_prompts, rate_text,
      options.max_concurrency > 0 ? std::to_string(options.max_concurrency).c_str() : "none");
  std::printf("input %s tokens, output %s tokens, token ids in [%d, %d), seed %llu\n",
              lengthText(options.input_len, options.input_len_range).c_str(),
              lengthText(options.output_len, options.output_len_range).c_str(), vocab.first,
              vocab.second, static_cast<unsigned long long>(options.seed));
  std::fflush(stdout);

  std::vector<StreamedCompletion> records(plans.size());
  std::unique_ptr<std::counting_semaphore<>> slots;
  if (options.max_concurrency > 0) {
    slots = std::make_unique<std::counting_semaphore<>>(options.max_concurrency);
  }
  ProgressBar progress(plans.size(), stderrIsTerminal());
  std::mutex in_flight_mutex;
  int in_flight = 0, peak_in_flight = 0;

  // One thread per in-flight request: the dispatcher waits for each arrival
  // time and then for a free slot, so at most --max-concurrency run at once.
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  workers.reserve(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(plans[i].arrival_s)));
    if (slots) slots->acquire();
    {
      std::lock_guard lock(in_flight_mutex);
      peak_in_flight = std::max(peak_in_flight, ++in_flight);
    }
    auto finish = [&, i] {
      {
        std::lock_guard lock(in_flight_mutex);
        --in_flight;
      }
      if (slots) slots->release();
      progress.advance();
    };
    try {
      workers.emplace_back([&, i, finish] {
        records[i] = runRequest(base_url, model, plans[i], options, start);
        finish();
      });
    } catch (const std::system_error& e) {
      // Out of threads: this request fails, the run goes on.
      records[i].error = std::string("cannot start a thread for the request: ") + e.what();
      finish();
    }
  }
  for (std::thread& worker : workers) worker.join();
  const double duration_s = secondsBetween(start, Clock::now());

  int64_t completed = 0, good = 0, total_input = 0, total_output = 0, length_mismatches = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  std::vector<std::string> errors;
  for (size_t i = 0; i < records.size(); ++i) {
    const StreamedCompletion& r = records[i];
    if (!r.success) {
      if (errors.size() < kErrorsKept) {
        errors.push_back("request " + std::to_string(i) + ": " + r.error);
      }
      continue;
    }
    ++completed;
    total_input += r.prompt_tokens;
    total_output += r.completion_tokens;
    if (r.prompt_tokens != static_cast<int64_t>(plans[i].prompt.size()) ||
        r.completion_tokens != plans[i].output_len) {
      ++length_mismatches;
    }
    ttfts.push_back(r.ttft_s);
    if (r.completion_tokens > 1) tpots.push_back(r.tpotSeconds());
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    e2els.push_back(r.e2el_s);
    const bool meets = (!slos.ttft_ms || r.ttft_s * 1e3 <= *slos.ttft_ms) &&
                       (!slos.tpot_ms || r.tpotSeconds() * 1e3 <= *slos.tpot_ms) &&
                       (!slos.e2el_ms || r.e2el_s * 1e3 <= *slos.e2el_ms);
    if (meets) ++good;
  }
  const int64_t failed = static_cast<int64_t>(records.size()) - completed;
  const Distribution ttft = distributionOf(ttfts), tpot = distributionOf(tpots),
                     itl = distributionOf(itls), e2el = distributionOf(e2els);
  const double request_throughput = static_cast<double>(completed) / duration_s;
  const double output_throughput = static_cast<double>(total_output) / duration_s;
  const double total_throughput = static_cast<double>(total_input + total_output) / duration_s;
  // Requests/s meeting every SLO given; only reported when some SLO was.
  const double goodput = static_cast<double>(good) / duration_s;

  std::string slo_text;
  for (auto [name, slo] : {std::pair{"ttft", slos.ttft_ms}, std::pair{"tpot", slos.tpot_ms},
                           std::pair{"e2el", slos.e2el_ms}}) {
    char text[64];
    if (slo) std::snprintf(text, sizeof(text), " %s<=%g", name, *slo);
    if (slo) slo_text += text;
  }

  std::printf("%-40s %12s\n", "figure", "value");
  std::printf("%-40s %12.2f\n", "duration (s)", duration_s);
  const std::string outcome = std::to_string(completed) + " / " + std::to_string(failed);
  std::printf("%-40s %12s\n", "requests completed / failed", outcome.c_str());
  std::printf("%-40s %12lld\n", "total input tokens", static_cast<long long>(total_input));
  std::printf("%-40s %12lld\n", "total output tokens", static_cast<long long>(total_output));
  std::printf("%-40s %12.2f\n", "request throughput (req/s)", request_throughput);
  std::printf("%-40s %12.1f\n", "output token throughput (tok/s)", output_throughput);
  std::printf("%-40s %12.1f\n", "total token throughput (tok/s)", total_throughput);
  if (slos.any()) {
    std::printf("%-40s %12.2f  (SLO ms:%s)\n", "goodput (req/s)", goodput, slo_text.c_str());
  }
  std::printf("%-40s %12d\n", "peak concurrent requests", peak_in_flight);
  std::printf("%-12s %10s %10s %10s %10s\n", "latency (ms)", "mean", "median", "p90", "p99");
  printDistribution("TTFT", ttft);
  printDistribution("TPOT", tpot);
  printDistribution("ITL", itl);
  printDistribution("E2EL", e2el);
  if (length_mismatches > 0) {
    std::printf("note: %lld completed requests report other token counts than asked\n",
                static_cast<long long>(length_mismatches));
  }
  for (size_t i = 0; i < std::min(errors.size(), kErrorsPrinted); ++i) {
    std::printf("error: %s\n", errors[i].c_str());
  }
  std::fflush(stdout);

  if (!options.json_path.empty()) {
    json requests = json::array();
    for (size_t i = 0; i < records.size(); ++i) {
      const StreamedCompletion& r = records[i];
      json entry = {{"index", i},
                    {"input_len", plans[i].prompt.size()},
                    {"output_len", plans[i].output_len},
                    {"arrival_s", plans[i].arrival_s},
                    {"send_s", r.send_s},
                    {"end_s", r.end_s},
                    {"success", r.success}};
      if (r.success) {
        json itl_ms = json::array();
        for (double gap : r.itl_s) itl_ms.push_back(gap * 1e3);
        entry["prompt_tokens"] = r.prompt_tokens;
        entry["completion_tokens"] = r.completion_tokens;
        entry["ttft_ms"] = r.ttft_s * 1e3;
        entry["tpot_ms"] = r.tpotSeconds() * 1e3;
        entry["e2el_ms"] = r.e2el_s * 1e3;
        entry["itl_ms"] = std::move(itl_ms);
      } else {
        entry["error"] = r.error;
      }
      requests.push_back(std::move(entry));
    }
    auto optionalJson = [](const std::optional<double>& value) {
      return value ? json(*value) : json(nullptr);
    };
    json out = {
        {"url", base_url},
        {"model", model},
        {"num_prompts", options.num_prompts},
        {"request_rate",
         std::isfinite(options.request_rate) ? json(options.request_rate) : json(nullptr)},
        {"max_concurrency", options.max_concurrency},
        {"input_len", options.input_len},
        {"input_len_range", options.input_len_range},
        {"output_len", options.output_len},
        {"output_len_range", options.output_len_range},
        {"seed", options.seed},
        {"vocab_range", {vocab.first, vocab.second}},
        {"priority", options.priority ? json(*options.priority) : json(nullptr)},
        {"slo_ms",
         {{"ttft", optionalJson(slos.ttft_ms)},
          {"tpot", optionalJson(slos.tpot_ms)},
          {"e2el", optionalJson(slos.e2el_ms)}}},
        {"duration_s", duration_s},
        {"completed", completed},
        {"failed", failed},
        {"total_input_tokens", total_input},
        {"total_output_tokens", total_output},
        {"request_throughput", request_throughput},
        {"output_throughput", output_throughput},
        {"total_token_throughput", total_throughput},
        {"request_goodput", slos.any() ? json(goodput) : json(nullptr)},
        {"peak_concurrency", peak_in_flight},
        {"length_mismatches", length_mismatches},
        {"ttft_ms", distributionMsJson(ttft)},
        {"tpot_ms", distributionMsJson(tpot)},
        {"itl_ms", distributionMsJson(itl)},
        {"e2el_ms", distributionMsJson(e2el)},
        {"errors", errors},
        {"requests", std::move(requests)},
    };
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace tandem::bench
