#include "tools/bench/multiturn_bench.h"

#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/prometheus_text.h"
#include "common/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/latency_stats.h"
#include "tools/bench/multiturn_computed_tokens.h"
#include "tools/bench/multiturn_policies.h"
#include "tools/bench/openai_client.h"
#include "tools/bench/progress_bar.h"

extern char** environ;

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kErrorsKept = 10;    // in the JSON summary
constexpr size_t kErrorsPrinted = 3;  // under the table
constexpr int kMaxClients = 4096;     // one thread each
constexpr const char* kHitsMetric = "tandem_prefix_cache_hits_total";
constexpr const char* kQueriesMetric = "tandem_prefix_cache_queries_total";

// What happened to one turn.
struct TurnRecord {
  int conversation = 0;
  int turn = 0;                     // 0-based; printed 1-based
  int client = -1;                  // -1: never sent
  bool skipped = false;             // not sent: an earlier turn of its conversation failed
  int64_t prompt_len = 0;           // tokens sent: history + new user tokens
  int64_t input_len = 0;            // new user tokens of this turn
  int64_t output_len = 0;           // max_tokens asked
  std::optional<double> arrival_s;  // the Poisson slot it waited for
  StreamedCompletion result;
};

// The figures of a set of turns (all of them, or one turn index).
struct Summary {
  int64_t completed = 0, failed = 0, skipped = 0;
  int64_t input_tokens = 0, output_tokens = 0, length_mismatches = 0;
  // Over completed requests that reported usage.prompt_tokens_details.
  int64_t cached_tokens = 0, cache_reported_prompt_tokens = 0, cache_reports = 0;
  Distribution ttft, tpot, itl, e2el;
  std::vector<double> ttfts_s;  // for the plot

  std::optional<double> cacheHitRate() const {
    if (cache_reports == 0 || cache_reported_prompt_tokens == 0) return std::nullopt;
    return static_cast<double>(cached_tokens) / static_cast<double>(cache_reported_prompt_tokens);
  }
};

Summary summarize(const std::vector<const TurnRecord*>& records) {
  Summary s;
  std::vector<double> tpots, itls, e2els;
  for (const TurnRecord* record : records) {
    const StreamedCompletion& r = record->result;
    if (record->skipped) {
      ++s.skipped;
      continue;
    }
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.completion_tokens;
    if (r.prompt_tokens != record->prompt_len || r.completion_tokens != record->output_len) {
      ++s.length_mismatches;
    }
    if (r.cached_tokens) {
      ++s.cache_reports;
      s.cached_tokens += *r.cached_tokens;
      s.cache_reported_prompt_tokens += r.prompt_tokens;
    }
    s.ttfts_s.push_back(r.ttft_s);
    if (r.completion_tokens > 1) tpots.push_back(r.tpotSeconds());
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    e2els.push_back(r.e2el_s);
  }
  s.ttft = distributionOf(s.ttfts_s);
  s.tpot = distributionOf(std::move(tpots));
  s.itl = distributionOf(std::move(itls));
  s.e2el = distributionOf(std::move(e2els));
  return s;
}

struct CacheCounters {
  double hits = 0.0;
  double queries = 0.0;
};

// The server's prefix-cache counters, when its /metrics has both.
std::optional<CacheCounters> readCacheCounters(const std::string& base_url, double timeout_s) {
  const std::optional<std::string> text = fetchText(base_url, "/metrics", timeout_s);
  if (!text) return std::nullopt;
  const auto hits = prometheusSample(*text, kHitsMetric);
  const auto queries = prometheusSample(*text, kQueriesMetric);
  if (!hits || !queries) return std::nullopt;
  return CacheCounters{*hits, *queries};
}

void validate(const MultiTurnBenchOptions& options) {
  if (options.num_clients < 1 || options.num_clients > kMaxClients) {
    throw Error("--num-clients must be between 1 and " + std::to_string(kMaxClients) + ", got " +
                std::to_string(options.num_clients));
  }
  if (options.num_conversations < 1) {
    throw Error("--num-conversations must be at least 1, got " +
                std::to_string(options.num_conversations));
  }
  if (options.turns < 1) {
    throw Error("--turns must be at least 1, got " + std::to_string(options.turns));
  }
  if (options.shared_prefix_tokens < 0 || options.shared_prefix_tokens > (1 << 24)) {
    throw Error("--shared-prefix-tokens must be between 0 and 16777216, got " +
                std::to_string(options.shared_prefix_tokens));
  }
  if (!(options.request_rate > 0.0)) {
    throw Error("--request-rate must be a positive number of requests/s or inf, got " +
                numberText(options.request_rate));
  }
  if (!(options.read_timeout_s > 0.0)) {
    throw Error("--read-timeout must be a positive number of seconds, got " +
                numberText(options.read_timeout_s));
  }
  if (options.progress != "auto" && options.progress != "on" && options.progress != "off") {
    throw Error("--progress takes auto, on or off, got \"" + options.progress + "\"");
  }
  for (auto [flag, slo] : {std::pair{"--slo-ttft-ms", options.slo_ttft_ms},
                           std::pair{"--slo-itl-ms", options.slo_itl_ms}}) {
    if (slo && !(*slo >= 0.0)) {
      throw Error(std::string(flag) + " must be a number of milliseconds >= 0, got " +
                  numberText(*slo));
    }
  }
  if (!options.cluster_file.empty()) validatePolicies(options.policies);
}

// Goodput as DistServe and vLLM's benchmarks define it: completed requests
// per second that meet every SLO given. A request's ITL figure is its mean
// gap between tokens, (E2EL - TTFT) / (tokens - 1); one with a single token
// has no gap and meets any ITL SLO.
struct Goodput {
  int64_t good = 0;
  double per_s = 0.0;
  double share = 0.0;  // good / requests of the plan (failed and skipped are not good)
};

bool meetsSlo(const StreamedCompletion& r, const MultiTurnBenchOptions& options) {
  if (!r.success) return false;
  if (options.slo_ttft_ms && r.ttft_s * 1e3 > *options.slo_ttft_ms) return false;
  if (options.slo_itl_ms && r.completion_tokens > 1 &&
      r.tpotSeconds() * 1e3 > *options.slo_itl_ms) {
    return false;
  }
  return true;
}

// The fewest prompt tokens the cluster could have computed for the turns
// that completed: the shared prefix once, then for each conversation its
// final prompt (its last completed turn's) less the prefix, less the tokens
// of earlier answers whose KV the decode steps already computed (all but
// each answer's last token). `distinct` leaves the answers in: the distinct
// prompt tokens of the plan.
struct PromptMinimum {
  int64_t minimum = 0;
  int64_t distinct = 0;
};

PromptMinimum promptMinimum(const std::vector<TurnRecord>& records, int turns, int64_t prefix) {
  PromptMinimum result;
  bool any = false;
  for (size_t first = 0; first + static_cast<size_t>(turns) <= records.size();
       first += static_cast<size_t>(turns)) {
    int64_t decoded_kv = 0;  // answer tokens of earlier turns with KV from decode
    int64_t pending = 0;     // the same, up to the turn before the current one
    const TurnRecord* last = nullptr;
    for (int t = 0; t < turns; ++t) {
      const TurnRecord& record = records[first + static_cast<size_t>(t)];
      if (record.skipped || !record.result.success) break;
      decoded_kv = pending;
      pending += std::max<int64_t>(0, record.result.completion_tokens - 1);
      last = &record;
    }
    if (last == nullptr) continue;
    any = true;
    result.distinct += last->prompt_len - prefix;
    result.minimum += last->prompt_len - prefix - decoded_kv;
  }
  if (any) {
    result.distinct += prefix;
    result.minimum += prefix;
  }
  return result;
}

// Refuses a plan whose longest conversation cannot fit the model's context.
void checkContext(const Plan& plan, const std::string& model, int64_t max_model_len) {
  for (size_t c = 0; c < plan.conversations.size(); ++c) {
    int64_t inputs = 0, outputs = 0;
    for (const TurnPlan& turn : plan.conversations[c].turns) {
      inputs += static_cast<int64_t>(turn.user_tokens.size());
      outputs += turn.output_len;
    }
    const int64_t prefix = static_cast<int64_t>(plan.shared_prefix.size());
    const int64_t needed = prefix + inputs + outputs;
    if (needed > max_model_len) {
      throw Error("conversation " + std::to_string(c) + " needs " + std::to_string(needed) +
                  " tokens by its last turn (shared prefix " + std::to_string(prefix) +
                  " + inputs " + std::to_string(inputs) + " + outputs " + std::to_string(outputs) +
                  ") but " + model + " has max_model_len " + std::to_string(max_model_len) +
                  "; lower --turns, --shared-prefix-tokens, --input-tokens or --output-tokens");
    }
  }
}

std::string percentText(std::optional<double> rate) {
  if (!rate) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", *rate * 100.0);
  return text;
}

// Rows under the "latency (ms)" header, names prefixed with `indent`.
void printLatencies(const Summary& s, const char* indent) {
  for (auto [name, d] : {std::pair{"TTFT", &s.ttft}, std::pair{"TPOT", &s.tpot},
                         std::pair{"ITL", &s.itl}, std::pair{"E2EL", &s.e2el}}) {
    printDistribution((std::string(indent) + name).c_str(), *d);
  }
}

json summaryJson(const Summary& s) {
  const auto rate = s.cacheHitRate();
  return {{"completed", s.completed},
          {"failed", s.failed},
          {"skipped", s.skipped},
          {"input_tokens", s.input_tokens},
          {"output_tokens", s.output_tokens},
          {"mean_input_tokens", s.completed > 0 ? json(static_cast<double>(s.input_tokens) /
                                                       static_cast<double>(s.completed))
                                                : json(nullptr)},
          {"cached_tokens", s.cache_reports > 0 ? json(s.cached_tokens) : json(nullptr)},
          {"cache_hit_rate", rate ? json(*rate) : json(nullptr)},
          {"length_mismatches", s.length_mismatches},
          {"ttft_ms", distributionMsJson(s.ttft)},
          {"tpot_ms", distributionMsJson(s.tpot)},
          {"itl_ms", distributionMsJson(s.itl)},
          {"e2el_ms", distributionMsJson(s.e2el)}};
}

// The first executable called `name` in a directory of $PATH.
std::optional<fs::path> findOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::string_view dirs(path);
  while (true) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

// A gnuplot single-quoted string: no escapes inside, '' stands for '.
std::string gnuplotQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return quoted + "'";
}

// Draws the TTFT CDF, all turns and each turn, into `png` with gnuplot.
// Returns false, with a notice on stdout, when it could not.
bool plotTtftCdf(const fs::path& png, const Summary& overall, const std::vector<Summary>& turns,
                 const std::string& title) {
  const std::optional<fs::path> gnuplot = findOnPath("gnuplot");
  if (!gnuplot) {
    std::printf(
        "note: --plot skipped: gnuplot is not on PATH (install it, e.g. apt-get install "
        "gnuplot-nox, to draw the TTFT CDF)\n");
    return false;
  }
  if (overall.ttfts_s.empty()) {
    std::printf("note: --plot skipped: no request completed\n");
    return false;
  }
  std::string script =
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
      "  set terminal pngcairo size 960,600\n"
      "} else {\n"
      "  set terminal png size 960,600\n"
      "}\n";
  script += "set output " + gnuplotQuoted(png.string()) + "\n";
  script += "set title " + gnuplotQuoted(title) + " noenhanced\n";
  script +=
      "set xlabel 'time to first token (ms)'\n"
      "set ylabel 'fraction of requests'\n"
      "set logscale x\n"
      "set yrange [0:1]\n"
      "set grid\n"
      "set key bottom right\n";
  // All turns last, so that its line is drawn over the others.
  std::vector<std::pair<std::string, const Summary*>> series;
  for (size_t t = 0; t < turns.size(); ++t) {
    if (!turns[t].ttfts_s.empty()) series.emplace_back("turn " + std::to_string(t + 1), &turns[t]);
  }
  series.emplace_back("all turns", &overall);
  std::string plot = "plot ";
  for (size_t i = 0; i < series.size(); ++i) {
    std::vector<double> values = series[i].second->ttfts_s;
    std::sort(values.begin(), values.end());
    script += "$s" + std::to_string(i) + " << EOD\n";
    char line[64];
    std::snprintf(line, sizeof(line), "%.6f 0\n", values.front() * 1e3);
    script += line;
    for (size_t v = 0; v < values.size(); ++v) {
      std::snprintf(line, sizeof(line), "%.6f %.6f\n", values[v] * 1e3,
                    static_cast<double>(v + 1) / static_cast<double>(values.size()));
      script += line;
    }
    script += "EOD\n";
    if (i > 0) plot += ", ";
    const bool last = i + 1 == series.size();
    plot += "$s" + std::to_string(i) + " using 1:2 with steps " +
            (last ? "lw 3 lc rgb 'black'" : "lw 1.5") + " title " + gnuplotQuoted(series[i].first);
  }
  script += plot + "\n";

  std::string script_path = (fs::temp_directory_path() / "tandem-bench-plot-XXXXXX").string();
  const int fd = ::mkstemp(script_path.data());
  if (fd < 0) {
    std::printf("note: --plot skipped: cannot create a temporary file for the gnuplot script\n");
    return false;
  }
  const bool written =
      ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  int status = -1;
  if (written) {
    std::fflush(stdout);
    const std::string program = gnuplot->string();
    char* argv[] = {const_cast<char*>(program.c_str()), script_path.data(), nullptr};
    pid_t pid = 0;
    if (::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv, environ) == 0) {
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  std::error_code ignored;
  fs::remove(script_path, ignored);
  if (!written || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("note: --plot failed: %s did not draw %s (its messages are above)\n",
                gnuplot->c_str(), png.c_str());
    return false;
  }
  std::printf("TTFT CDF plotted to %s\n", png.c_str());
  return true;
}

}  // namespace

Plan makePlan(const MultiTurnBenchOptions& options, const TokenCountDistribution& input,
              const TokenCountDistribution& output, std::pair<int32_t, int32_t> vocab) {
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> token_dist(vocab.first, vocab.second - 1);
  Plan plan;
  plan.shared_prefix.resize(static_cast<size_t>(options.shared_prefix_tokens));
  for (int32_t& token : plan.shared_prefix) token = token_dist(rng);
  plan.conversations.resize(static_cast<size_t>(options.num_conversations));
  for (ConversationPlan& conversation : plan.conversations) {
    conversation.turns.resize(static_cast<size_t>(options.turns));
    for (TurnPlan& turn : conversation.turns) {
      turn.user_tokens.resize(static_cast<size_t>(input.sample(rng)));
      for (int32_t& token : turn.user_tokens) token = token_dist(rng);
      turn.output_len = output.sample(rng);
    }
  }
  // Poisson arrivals: exponential gaps with mean 1/rate; the first is due at once.
  if (std::isfinite(options.request_rate)) {
    const size_t requests = plan.conversations.size() * static_cast<size_t>(options.turns);
    std::exponential_distribution<double> gap(options.request_rate);
    plan.arrivals_s.resize(requests);
    for (size_t i = 1; i < requests; ++i) plan.arrivals_s[i] = plan.arrivals_s[i - 1] + gap(rng);
  }
  return plan;
}

MultiTurnOutcome runMultiTurnOnce(const MultiTurnBenchOptions& options,
                                  const std::string& server_url,
                                  const std::vector<std::string>& agent_urls) {
  const std::string base_url = checkedBaseUrl(server_url, "--base-url");
  const auto input = TokenCountDistribution::parse(options.input_tokens, "--input-tokens");
  const auto output = TokenCountDistribution::parse(options.output_tokens, "--output-tokens");
  const auto vocab = parseVocabRange(options.vocab_range);

  // The model list also gives the context length, so conversations that
  // cannot fit are refused here rather than failing turn by turn.
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

  const Plan plan = makePlan(options, input, output, vocab);
  if (max_model_len) checkContext(plan, model, *max_model_len);

  const int turns = options.turns;
  const size_t num_requests = plan.conversations.size() * static_cast<size_t>(turns);
  char rate_text[64] = "as fast as the clients go";
  if (std::isfinite(options.request_rate)) {
    std::snprintf(rate_text, sizeof(rate_text), "%g req/s (Poisson)", options.request_rate);
  }
  std::printf("tandem-bench multiturn: %s, model %s, %d conversations x %d turns, %d clients, %s\n",
              base_url.c_str(), model.c_str(), options.num_conversations, turns,
              options.num_clients, rate_text);
  std::printf(
      "shared prefix %lld tokens, per turn input %s and output %s tokens, token ids in [%d, %d), "
      "seed %llu\n",
      static_cast<long long>(options.shared_prefix_tokens), input.text().c_str(),
      output.text().c_str(), vocab.first, vocab.second,
      static_cast<unsigned long long>(options.seed));
  std::fflush(stdout);

  std::vector<TurnRecord> records(num_requests);
  for (size_t c = 0; c < plan.conversations.size(); ++c) {
    for (int t = 0; t < turns; ++t) {
      TurnRecord& record = records[c * static_cast<size_t>(turns) + static_cast<size_t>(t)];
      record.conversation = static_cast<int>(c);
      record.turn = t;
      record.input_len = static_cast<int64_t>(plan.conversations[c].turns[t].user_tokens.size());
      record.output_len = plan.conversations[c].turns[t].output_len;
    }
  }
  const bool draw_progress =
      options.progress == "on" || (options.progress == "auto" && stderrIsTerminal());
  ProgressBar progress(num_requests, draw_progress);

  const std::optional<CacheCounters> counters_before =
      readCacheCounters(base_url, options.read_timeout_s);
  const std::vector<AgentSnapshot> agents_before =
      snapshotAgents(agent_urls, options.read_timeout_s);

  std::atomic<int> next_conversation{0};
  std::mutex arrival_mutex;
  size_t next_arrival = 0;
  const Clock::time_point start = Clock::now();

  // A client takes the next conversation nobody has started and sends its
  // turns one after another, each when its answer is complete; a failed turn
  // ends the conversation (its history would lack the answer).
  auto client = [&](int client_id) {
    for (int c; (c = next_conversation.fetch_add(1)) < options.num_conversations;) {
      const ConversationPlan& conversation = plan.conversations[static_cast<size_t>(c)];
      std::vector<int32_t> history = plan.shared_prefix;
      for (int t = 0; t < turns; ++t) {
        TurnRecord& record =
            records[static_cast<size_t>(c) * static_cast<size_t>(turns) + static_cast<size_t>(t)];
        const TurnPlan& turn = conversation.turns[static_cast<size_t>(t)];
        history.insert(history.end(), turn.user_tokens.begin(), turn.user_tokens.end());
        record.client = client_id;
        record.prompt_len = static_cast<int64_t>(history.size());
        if (!plan.arrivals_s.empty()) {
          double due_s = 0.0;
          {
            std::lock_guard lock(arrival_mutex);
            due_s = plan.arrivals_s[next_arrival++];
          }
          record.arrival_s = due_s;
          std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(due_s)));
        }
        const json body = {{"model", model},
                           {"prompt", history},
                           {"max_tokens", turn.output_len},
                           {"temperature", 0.0},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}},
                           {"ignore_eos", true},
                           {"return_token_ids", true}};
        record.result = streamCompletion(base_url, body.dump(), options.read_timeout_s, start);
        StreamedCompletion& result = record.result;
        if (result.success &&
            static_cast<int64_t>(result.token_ids.size()) != result.completion_tokens) {
          result.success = false;
          result.error = "the stream carried " + std::to_string(result.token_ids.size()) +
                         " token ids for " + std::to_string(result.completion_tokens) +
                         " completion tokens; the server must honour \"return_token_ids\"";
        }
        progress.advance();
        if (!result.success) {
          for (int rest = t + 1; rest < turns; ++rest) {
            records[static_cast<size_t>(c) * static_cast<size_t>(turns) + static_cast<size_t>(rest)]
                .skipped = true;
            progress.advance();
          }
          break;
        }
        history.insert(history.end(), result.token_ids.begin(), result.token_ids.end());
      }
    }
  };

  // Clients pull conversations from one counter, so a client that cannot be
  // started loses no work as long as one runs.
  std::vector<std::thread> clients;
  std::string thread_error;
  for (int i = 0; i < options.num_clients; ++i) {
    try {
      clients.emplace_back(client, i);
    } catch (const std::system_error& e) {
      thread_error = e.what();
      break;
    }
  }
  if (clients.empty()) throw Error("cannot start a client thread: " + thread_error);
  if (!thread_error.empty()) {
    std::fprintf(stderr, "tandem-bench: only %zu of %d clients started: %s\n", clients.size(),
                 options.num_clients, thread_error.c_str());
  }
  for (std::thread& thread : clients) thread.join();
  const double duration_s = secondsBetween(start, Clock::now());

  const std::optional<CacheCounters> counters_after =
      readCacheCounters(base_url, options.read_timeout_s);
  const ComputedPromptTokens computed = computedPromptTokens(
      agents_before, settledSnapshot(agent_urls, options.read_timeout_s, 10.0));
  const PromptMinimum minimum = promptMinimum(records, turns, options.shared_prefix_tokens);
  const bool has_slo = options.slo_ttft_ms || options.slo_itl_ms;
  Goodput goodput;
  for (const TurnRecord& record : records) {
    if (!record.skipped && meetsSlo(record.result, options)) ++goodput.good;
  }

  std::vector<const TurnRecord*> all;
  std::vector<std::vector<const TurnRecord*>> by_turn(static_cast<size_t>(turns));
  std::vector<std::string> errors;
  for (const TurnRecord& record : records) {
    all.push_back(&record);
    by_turn[static_cast<size_t>(record.turn)].push_back(&record);
    if (!record.skipped && !record.result.success && errors.size() < kErrorsKept) {
      errors.push_back("conversation " + std::to_string(record.conversation) + " turn " +
                       std::to_string(record.turn + 1) + ": " + record.result.error);
    }
  }
  const Summary overall = summarize(all);
  std::vector<Summary> per_turn;
  for (const auto& turn_records : by_turn) per_turn.push_back(summarize(turn_records));

  std::optional<CacheCounters> server_cache;
  std::optional<double> server_hit_rate;
  if (counters_before && counters_after) {
    server_cache = CacheCounters{counters_after->hits - counters_before->hits,
                                 counters_after->queries - counters_before->queries};
    if (server_cache->queries > 0) server_hit_rate = server_cache->hits / server_cache->queries;
  }
  const double request_throughput = static_cast<double>(overall.completed) / duration_s;
  const double output_throughput = static_cast<double>(overall.output_tokens) / duration_s;
  const double total_throughput =
      static_cast<double>(overall.input_tokens + overall.output_tokens) / duration_s;
  goodput.per_s = static_cast<double>(goodput.good) / duration_s;
  goodput.share = static_cast<double>(goodput.good) / static_cast<double>(num_requests);
  // computed / minimum; NaN when either is unknown.
  const bool has_ratio = computed.complete && minimum.minimum > 0;
  const double computed_ratio = has_ratio ? computed.total / static_cast<double>(minimum.minimum)
                                          : std::numeric_limits<double>::quiet_NaN();

  std::printf("%-46s %12s\n", "figure", "value");
  std::printf("%-46s %12.2f\n", "duration (s)", duration_s);
  const std::string outcome = std::to_string(overall.completed) + " / " +
                              std::to_string(overall.failed) + " / " +
                              std::to_string(overall.skipped);
  std::printf("%-46s %12s\n", "requests completed / failed / skipped", outcome.c_str());
  std::printf("%-46s %12lld\n", "total input tokens", static_cast<long long>(overall.input_tokens));
  std::printf("%-46s %12lld\n", "total output tokens",
              static_cast<long long>(overall.output_tokens));
  std::printf("%-46s %12.2f\n", "request throughput (req/s)", request_throughput);
  std::printf("%-46s %12.1f\n", "output token throughput (tok/s)", output_throughput);
  std::printf("%-46s %12.1f\n", "total token throughput (tok/s)", total_throughput);
  if (has_slo) {
    char slo[96];
    std::snprintf(slo, sizeof(slo), "(TTFT <= %s ms, mean ITL <= %s ms: %lld good, %.1f %%)",
                  options.slo_ttft_ms ? numberText(*options.slo_ttft_ms).c_str() : "any",
                  options.slo_itl_ms ? numberText(*options.slo_itl_ms).c_str() : "any",
                  static_cast<long long>(goodput.good), goodput.share * 100.0);
    std::printf("%-46s %12.2f  %s\n", "goodput (req/s)", goodput.per_s, slo);
  }
  if (!agent_urls.empty()) {
    char minimum_text[96];
    std::snprintf(minimum_text, sizeof(minimum_text), "(minimum %lld, distinct %lld, %zu agents)",
                  static_cast<long long>(minimum.minimum), static_cast<long long>(minimum.distinct),
                  agent_urls.size());
    if (computed.complete) {
      std::printf("%-46s %12.0f  %s\n", "prompt tokens computed, all agents", computed.total,
                  minimum_text);
      char ratio[32] = "n/a";
      if (has_ratio) std::snprintf(ratio, sizeof(ratio), "%.3f", computed_ratio);
      std::printf("%-46s %12s\n", "prompt tokens computed / minimum", ratio);
    } else {
      std::printf("%-46s %12s  (an agent's /metrics lacked %s)\n",
                  "prompt tokens computed, all agents", "n/a", "tandem_computed_tokens_total");
    }
  }
  if (server_cache) {
    char counts[96];
    std::snprintf(counts, sizeof(counts), "(%.0f of %.0f tokens)", server_cache->hits,
                  server_cache->queries);
    std::printf("%-46s %12s  %s\n", "prefix cache hit rate, server /metrics (%)",
                percentText(server_hit_rate).c_str(), counts);
  } else {
    std::printf("%-46s %12s  (no %s in %s/metrics)\n", "prefix cache hit rate, server /metrics (%)",
                "n/a", kHitsMetric, base_url.c_str());
  }
  if (overall.cache_reports > 0) {
    char counts[96];
    std::snprintf(counts, sizeof(counts), "(%lld of %lld tokens)",
                  static_cast<long long>(overall.cached_tokens),
                  static_cast<long long>(overall.cache_reported_prompt_tokens));
    std::printf("%-46s %12s  %s\n", "prefix cache hit rate, usage cached_tokens (%)",
                percentText(overall.cacheHitRate()).c_str(), counts);
  } else {
    std::printf("%-46s %12s  (no usage.prompt_tokens_details.cached_tokens)\n",
                "prefix cache hit rate, usage cached_tokens (%)", "n/a");
  }
  std::printf("%-12s %10s %10s %10s %10s\n", "latency (ms)", "mean", "median", "p90", "p99");
  printLatencies(overall, "");
  for (size_t t = 0; t < per_turn.size(); ++t) {
    const Summary& s = per_turn[t];
    const double mean_prompt =
        s.completed > 0 ? static_cast<double>(s.input_tokens) / static_cast<double>(s.completed)
                        : 0.0;
    std::printf(
        "turn %zu: %lld completed, %lld failed, %lld skipped; prompt %.0f tokens on average, "
        "%s %% cached\n",
        t + 1, static_cast<long long>(s.completed), static_cast<long long>(s.failed),
        static_cast<long long>(s.skipped), mean_prompt, percentText(s.cacheHitRate()).c_str());
    printLatencies(s, "  ");
  }
  if (overall.length_mismatches > 0) {
    std::printf("note: %lld completed requests report other token counts than sent or asked\n",
                static_cast<long long>(overall.length_mismatches));
  }
  for (size_t i = 0; i < std::min(errors.size(), kErrorsPrinted); ++i) {
    std::printf("error: %s\n", errors[i].c_str());
  }
  std::fflush(stdout);

  if (!options.plot_path.empty()) {
    const std::string title = "TTFT CDF: " + std::to_string(options.num_conversations) +
                              " conversations x " + std::to_string(turns) + " turns, " +
                              std::to_string(options.num_clients) + " clients, " + model;
    plotTtftCdf(options.plot_path, overall, per_turn, title);
    std::fflush(stdout);
  }

  {
    json requests = json::array();
    for (const TurnRecord& record : records) {
      const StreamedCompletion& r = record.result;
      json entry = {{"conversation", record.conversation},
                    {"turn", record.turn + 1},
                    {"input_len", record.input_len},
                    {"output_len", record.output_len},
                    {"skipped", record.skipped}};
      if (record.skipped) {
        entry["success"] = false;
        requests.push_back(std::move(entry));
        continue;
      }
      entry["client"] = record.client;
      entry["prompt_len"] = record.prompt_len;
      entry["arrival_s"] = record.arrival_s ? json(*record.arrival_s) : json(nullptr);
      entry["send_s"] = r.send_s;
      entry["end_s"] = r.end_s;
      entry["success"] = r.success;
      if (r.success) {
        json itl_ms = json::array();
        for (double gap : r.itl_s) itl_ms.push_back(gap * 1e3);
        entry["prompt_tokens"] = r.prompt_tokens;
        entry["cached_tokens"] = r.cached_tokens ? json(*r.cached_tokens) : json(nullptr);
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
    json per_turn_json = json::array();
    for (size_t t = 0; t < per_turn.size(); ++t) {
      json entry = summaryJson(per_turn[t]);
      entry["turn"] = t + 1;
      per_turn_json.push_back(std::move(entry));
    }
    json server_json = nullptr;
    if (server_cache) {
      server_json = {{"hits", server_cache->hits},
                     {"queries", server_cache->queries},
                     {"hit_rate", server_hit_rate ? json(*server_hit_rate) : json(nullptr)}};
    }
    json usage_json = nullptr;
    if (overall.cache_reports > 0) {
      usage_json = {
          {"cached_tokens", overall.cached_tokens},
          {"prompt_tokens", overall.cache_reported_prompt_tokens},
          {"hit_rate", overall.cacheHitRate() ? json(*overall.cacheHitRate()) : json(nullptr)}};
    }
    json goodput_json = nullptr;
    if (has_slo) {
      goodput_json = {
          {"slo_ttft_ms", options.slo_ttft_ms ? json(*options.slo_ttft_ms) : json(nullptr)},
          {"slo_itl_ms", options.slo_itl_ms ? json(*options.slo_itl_ms) : json(nullptr)},
          {"good", goodput.good},
          {"share", goodput.share},
          {"goodput", goodput.per_s}};
    }
    json computed_json = nullptr;
    if (!agent_urls.empty()) {
      computed_json = {{"computed", computed.complete ? json(computed.total) : json(nullptr)},
                       {"minimum", minimum.minimum},
                       {"distinct", minimum.distinct},
                       {"ratio", has_ratio ? json(computed_ratio) : json(nullptr)},
                       {"agents", computed.toJson()}};
    }
    json out = {
        {"base_url", base_url},
        {"model", model},
        {"num_clients", options.num_clients},
        {"num_conversations", options.num_conversations},
        {"turns", turns},
        {"shared_prefix_tokens", options.shared_prefix_tokens},
        {"input_tokens", input.text()},
        {"output_tokens", output.text()},
        {"request_rate",
         std::isfinite(options.request_rate) ? json(options.request_rate) : json(nullptr)},
        {"seed", options.seed},
        {"vocab_range", {vocab.first, vocab.second}},
        {"num_requests", num_requests},
        {"duration_s", duration_s},
        {"completed", overall.completed},
        {"failed", overall.failed},
        {"skipped", overall.skipped},
        {"total_input_tokens", overall.input_tokens},
        {"total_output_tokens", overall.output_tokens},
        {"request_throughput", request_throughput},
        {"output_throughput", output_throughput},
        {"total_token_throughput", total_throughput},
        {"length_mismatches", overall.length_mismatches},
        {"goodput", std::move(goodput_json)},
        {"prompt_tokens_computed", std::move(computed_json)},
        {"prefix_cache", {{"server", std::move(server_json)}, {"usage", std::move(usage_json)}}},
        {"ttft_ms", distributionMsJson(overall.ttft)},
        {"tpot_ms", distributionMsJson(overall.tpot)},
        {"itl_ms", distributionMsJson(overall.itl)},
        {"e2el_ms", distributionMsJson(overall.e2el)},
        {"per_turn", std::move(per_turn_json)},
        {"errors", errors},
        {"requests", std::move(requests)},
    };
    return {overall.failed == 0 ? 0 : 1, std::move(out)};
  }
}

int runMultiTurnBench(const MultiTurnBenchOptions& options) {
  validate(options);
  if (!options.cluster_file.empty()) return runPolicyComparison(options);
  std::vector<std::string> agent_urls;
  for (const std::string& url : options.agent_metrics) {
    agent_urls.push_back(checkedBaseUrl(url, "--agent-metrics"));
  }
  MultiTurnOutcome outcome = runMultiTurnOnce(options, options.base_url, agent_urls);
  if (!options.json_path.empty()) {
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << outcome.report.dump(2) << '\n';
  }
  return outcome.exit_code;
}

}  // namespace tandem::bench
