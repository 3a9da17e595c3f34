#include "tools/bench/multiturn_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/prometheus_text.h"
#include "common/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/host_cpu.h"
#include "tools/bench/latency_stats.h"
#include "tools/bench/multiturn_computed_tokens.h"
#include "tools/bench/multiturn_policies.h"
#include "tools/bench/multiturn_summary.h"
#include "tools/bench/multiturn_workload.h"
#include "tools/bench/openai_client.h"
#include "tools/bench/progress_bar.h"
#include "tools/bench/ttft_cdf_plot.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

constexpr size_t kErrorsKept = 10;    // in the JSON summary
constexpr size_t kErrorsPrinted = 3;  // under the table
constexpr int kMaxClients = 4096;     // one thread each (open loop: each conversation)
constexpr int kMaxPrefixGroups = 4096;
constexpr int64_t kMaxPrefixTokensInAll = int64_t{1} << 26;  // over all groups
constexpr int kMaxRounds = 1000;
constexpr const char* kHitsMetric = "tandem_prefix_cache_hits_total";
constexpr const char* kQueriesMetric = "tandem_prefix_cache_queries_total";

// What happened to one turn.
struct TurnRecord {
  int conversation = 0;
  int prefix_group = 0;
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

// The server's prefix-cache counters, when its /metrics text has both.
std::optional<CacheCounters> cacheCountersIn(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  const auto hits = prometheusSample(*text, kHitsMetric);
  const auto queries = prometheusSample(*text, kQueriesMetric);
  if (!hits || !queries) return std::nullopt;
  return CacheCounters{*hits, *queries};
}

// The router's requests by routing decision (tandem_router_requests_total)
// and its lends by outcome (tandem_router_lends_total, as lend_full ...),
// when base_url is a Tandem router.
struct RouterCount {
  const char* name;
  const char* metric;
  const char* filter;
};
constexpr RouterCount kRouterCounts[] = {
    {"disaggregated", "tandem_router_requests_total", "decision=\"disaggregated\""},
    {"local_prefill", "tandem_router_requests_total", "decision=\"local_prefill\""},
    {"pull_back", "tandem_router_requests_total", "decision=\"pull_back\""},
    {"affinity", "tandem_router_requests_total", "decision=\"affinity\""},
    {"spill", "tandem_router_requests_total", "decision=\"spill\""},
    {"lend_full", "tandem_router_lends_total", "outcome=\"full\""},
    {"lend_short", "tandem_router_lends_total", "outcome=\"short\""},
    {"lend_refused", "tandem_router_lends_total", "outcome=\"refused\""},
};
using RouterDecisions = std::vector<std::pair<std::string, double>>;

std::optional<RouterDecisions> routerDecisionsIn(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  RouterDecisions decisions;
  for (const RouterCount& count : kRouterCounts) {
    const auto value = prometheusSample(*text, count.metric, count.filter);
    if (!value) return std::nullopt;
    decisions.emplace_back(count.name, *value);
  }
  return decisions;
}

std::optional<RouterDecisions> decisionsBetween(const std::optional<RouterDecisions>& before,
                                                const std::optional<RouterDecisions>& after) {
  if (!before || !after) return std::nullopt;
  RouterDecisions delta = *after;
  for (size_t i = 0; i < delta.size(); ++i) delta[i].second -= (*before)[i].second;
  return delta;
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
  if (options.prefix_groups < 1 || options.prefix_groups > kMaxPrefixGroups) {
    throw Error("--prefix-groups must be between 1 and " + std::to_string(kMaxPrefixGroups) +
                ", got " + std::to_string(options.prefix_groups));
  }
  if (options.prefix_groups > 1 && options.shared_prefix_tokens == 0) {
    throw Error("--prefix-groups " + std::to_string(options.prefix_groups) +
                " needs --shared-prefix-tokens of at least 1 (the length of each group's prefix)");
  }
  if (options.prefix_groups * options.shared_prefix_tokens > kMaxPrefixTokensInAll) {
    throw Error("--prefix-groups x --shared-prefix-tokens must be at most " +
                std::to_string(kMaxPrefixTokensInAll) + " tokens, got " +
                std::to_string(options.prefix_groups * options.shared_prefix_tokens));
  }
  if (!std::isfinite(options.prefix_zipf) || options.prefix_zipf < 0.0) {
    throw Error("--prefix-zipf must be a finite number >= 0 (0: uniform), got " +
                numberText(options.prefix_zipf));
  }
  if (!(options.request_rate > 0.0)) {
    throw Error("--request-rate must be a positive number of requests/s or inf, got " +
                numberText(options.request_rate));
  }
  const ArrivalSpec arrival = ArrivalSpec::parse(options.arrival);
  if (arrival.open_loop && std::isfinite(options.request_rate)) {
    throw Error("--request-rate paces the closed loop's clients; with --arrival " + arrival.text() +
                " leave it out (the rate is the one of --arrival)");
  }
  if (arrival.open_loop && options.num_conversations > kMaxClients) {
    throw Error("--arrival " + arrival.text() +
                " runs one thread per conversation: " + "--num-conversations must be at most " +
                std::to_string(kMaxClients) + ", got " + std::to_string(options.num_conversations));
  }
  if (options.rounds < 1 || options.rounds > kMaxRounds) {
    throw Error("--rounds must be between 1 and " + std::to_string(kMaxRounds) + ", got " +
                std::to_string(options.rounds));
  }
  if (options.rounds > 1 && options.cluster_file.empty()) {
    throw Error("--rounds " + std::to_string(options.rounds) +
                " needs --cluster-file (each round runs every policy on fresh clusters)");
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
// that completed: each shared prefix some such conversation started with
// once, then for each conversation its final prompt (its last completed
// turn's) less its prefix, less the tokens of earlier answers whose KV the
// decode steps already computed (all but each answer's last token).
// `distinct` leaves the answers in: the distinct prompt tokens of the plan.
struct PromptMinimum {
  int64_t minimum = 0;
  int64_t distinct = 0;
};

PromptMinimum promptMinimum(const std::vector<TurnRecord>& records, int turns, const Plan& plan) {
  PromptMinimum result;
  std::vector<bool> group_used(plan.prefixes.size(), false);
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
    const size_t group = static_cast<size_t>(last->prefix_group);
    const int64_t prefix = static_cast<int64_t>(plan.prefixes[group].size());
    group_used[group] = true;
    result.distinct += last->prompt_len - prefix;
    result.minimum += last->prompt_len - prefix - decoded_kv;
  }
  for (size_t group = 0; group < group_used.size(); ++group) {
    if (!group_used[group]) continue;
    result.distinct += static_cast<int64_t>(plan.prefixes[group].size());
    result.minimum += static_cast<int64_t>(plan.prefixes[group].size());
  }
  return result;
}

// How evenly the agents of one role finished the run's requests (each
// agent's Δ finished-request count).
struct RoleBalance {
  std::vector<double> finished;  // per agent, in the order given
  std::optional<double> max_over_mean;

  json toJson() const {
    return {{"agents", finished.size()},
            {"finished_requests", finished},
            {"max_over_mean", max_over_mean ? json(*max_over_mean) : json(nullptr)}};
  }
};

// Decode agents (role decode, or both: a colocated agent decodes) and
// prefill agents; nullopt when an agent could not be read.
struct RequestBalance {
  RoleBalance decode, prefill;
};

std::optional<RequestBalance> requestBalance(const ComputedPromptTokens& computed) {
  if (!computed.complete) return std::nullopt;
  RequestBalance balance;
  for (const ComputedPromptTokens::Agent& agent : computed.agents) {
    RoleBalance& role = agent.role == "prefill" ? balance.prefill : balance.decode;
    role.finished.push_back(agent.finished_requests.value_or(0.0));
  }
  balance.decode.max_over_mean = maxOverMean(balance.decode.finished);
  balance.prefill.max_over_mean = maxOverMean(balance.prefill.finished);
  return balance;
}

void printBalance(const char* label, const RoleBalance& role) {
  if (role.finished.empty()) return;
  std::string counts;
  for (double count : role.finished) {
    counts += (counts.empty() ? "" : ", ") + numberText(count);
  }
  char value[32] = "n/a";
  if (role.max_over_mean) std::snprintf(value, sizeof(value), "%.3f", *role.max_over_mean);
  std::printf("%-46s %12s  (%zu agents: %s)\n", label, value, role.finished.size(), counts.c_str());
}

// Refuses a plan whose longest conversation cannot fit the model's context.
void checkContext(const Plan& plan, const std::string& model, int64_t max_model_len) {
  for (size_t c = 0; c < plan.conversations.size(); ++c) {
    int64_t inputs = 0, outputs = 0;
    for (const TurnPlan& turn : plan.conversations[c].turns) {
      inputs += static_cast<int64_t>(turn.user_tokens.size());
      outputs += turn.output_len;
    }
    const int64_t prefix = static_cast<int64_t>(plan.prefixOf(plan.conversations[c]).size());
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

}  // namespace

Plan makePlan(const MultiTurnBenchOptions& options, const TokenCountDistribution& input,
              const TokenCountDistribution& output, std::pair<int32_t, int32_t> vocab) {
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> token_dist(vocab.first, vocab.second - 1);
  Plan plan;
  plan.prefixes.resize(static_cast<size_t>(std::max(options.prefix_groups, 1)));
  plan.prefixes[0].resize(static_cast<size_t>(options.shared_prefix_tokens));
  for (int32_t& token : plan.prefixes[0]) token = token_dist(rng);
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
    plan.arrivals_s = poissonArrivals(options.request_rate, requests, rng);
  }
  // Open loop: conversations arrive at RATE / turns per second, so that
  // RATE requests/s are offered.
  const ArrivalSpec arrival = ArrivalSpec::parse(options.arrival);
  if (arrival.open_loop) {
    plan.conversation_starts_s = poissonArrivals(arrival.rate / static_cast<double>(options.turns),
                                                 plan.conversations.size(), rng);
  }
  // More prefix groups: their prefixes and the conversations' choice among
  // them come from generators of their own, so group 0 and every turn stay
  // as they are without groups.
  if (plan.prefixes.size() > 1) {
    std::mt19937_64 group_rng = groupPrefixGenerator(options.seed);
    for (size_t group = 1; group < plan.prefixes.size(); ++group) {
      plan.prefixes[group].resize(static_cast<size_t>(options.shared_prefix_tokens));
      for (int32_t& token : plan.prefixes[group]) token = token_dist(group_rng);
    }
    const std::vector<int> groups = conversationGroups(
        options.num_conversations, options.prefix_groups, options.prefix_zipf, options.seed);
    for (size_t c = 0; c < plan.conversations.size(); ++c) {
      plan.conversations[c].prefix_group = groups[c];
    }
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
  const ArrivalSpec arrival = ArrivalSpec::parse(options.arrival);
  char rate_text[96] = "as fast as the clients go";
  if (std::isfinite(options.request_rate)) {
    std::snprintf(rate_text, sizeof(rate_text), "%g req/s (Poisson)", options.request_rate);
  }
  if (arrival.open_loop) {
    std::printf(
        "tandem-bench multiturn: %s, model %s, %d conversations x %d turns, open loop: "
        "conversations arrive Poisson at %g/s (%g req/s offered)\n",
        base_url.c_str(), model.c_str(), options.num_conversations, turns,
        arrival.rate / static_cast<double>(turns), arrival.rate);
  } else {
    std::printf(
        "tandem-bench multiturn: %s, model %s, %d conversations x %d turns, %d clients, %s\n",
        base_url.c_str(), model.c_str(), options.num_conversations, turns, options.num_clients,
        rate_text);
  }
  std::printf(
      "shared prefix %lld tokens, per turn input %s and output %s tokens, token ids in [%d, %d), "
      "seed %llu\n",
      static_cast<long long>(options.shared_prefix_tokens), input.text().c_str(),
      output.text().c_str(), vocab.first, vocab.second,
      static_cast<unsigned long long>(options.seed));
  std::vector<int64_t> conversations_per_group(plan.prefixes.size(), 0);
  for (const ConversationPlan& conversation : plan.conversations) {
    ++conversations_per_group[static_cast<size_t>(conversation.prefix_group)];
  }
  if (plan.prefixes.size() > 1) {
    std::string counts;
    for (int64_t count : conversations_per_group) {
      counts += (counts.empty() ? "" : ", ") + std::to_string(count);
    }
    std::printf("%zu prefix groups, Zipf %s: conversations per group %s\n", plan.prefixes.size(),
                numberText(options.prefix_zipf).c_str(), counts.c_str());
  }
  std::fflush(stdout);

  std::vector<TurnRecord> records(num_requests);
  for (size_t c = 0; c < plan.conversations.size(); ++c) {
    for (int t = 0; t < turns; ++t) {
      TurnRecord& record = records[c * static_cast<size_t>(turns) + static_cast<size_t>(t)];
      record.conversation = static_cast<int>(c);
      record.prefix_group = plan.conversations[c].prefix_group;
      record.turn = t;
      record.input_len = static_cast<int64_t>(plan.conversations[c].turns[t].user_tokens.size());
      record.output_len = plan.conversations[c].turns[t].output_len;
    }
  }
  const bool draw_progress =
      options.progress == "on" || (options.progress == "auto" && stderrIsTerminal());
  ProgressBar progress(num_requests, draw_progress);

  // The server's /metrics before and after the run: its prefix-cache
  // counters and, from a Tandem router, its decisions.
  const std::optional<std::string> metrics_before =
      fetchText(base_url, "/metrics", options.read_timeout_s);
  const std::optional<CacheCounters> counters_before = cacheCountersIn(metrics_before);
  const std::optional<RouterDecisions> decisions_before = routerDecisionsIn(metrics_before);
  const std::vector<AgentSnapshot> agents_before =
      snapshotAgents(agent_urls, options.read_timeout_s);

  std::atomic<int> next_conversation{0};
  std::mutex arrival_mutex;
  size_t next_arrival = 0;
  const HostCpuMeter host_cpu_meter;
  const Clock::time_point start = Clock::now();
  auto sleepUntil = [&](double due_s) {
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due_s)));
  };
  auto recordOf = [&](int c, int t) -> TurnRecord& {
    return records[static_cast<size_t>(c) * static_cast<size_t>(turns) + static_cast<size_t>(t)];
  };
  auto skipFrom = [&](int c, int first_turn) {
    for (int rest = first_turn; rest < turns; ++rest) {
      recordOf(c, rest).skipped = true;
      progress.advance();
    }
  };

  // Sends conversation c's turns one after another, each when its answer is
  // complete; a failed turn ends the conversation (its history would lack
  // the answer).
  auto runConversation = [&](int c, int client_id) {
    const ConversationPlan& conversation = plan.conversations[static_cast<size_t>(c)];
    std::vector<int32_t> history = plan.prefixOf(conversation);
    for (int t = 0; t < turns; ++t) {
      TurnRecord& record = recordOf(c, t);
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
        sleepUntil(due_s);
      } else if (t == 0 && !plan.conversation_starts_s.empty()) {
        record.arrival_s = plan.conversation_starts_s[static_cast<size_t>(c)];
        sleepUntil(*record.arrival_s);
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
        skipFrom(c, t + 1);
        break;
      }
      history.insert(history.end(), result.token_ids.begin(), result.token_ids.end());
    }
  };

  std::vector<std::thread> threads;
  std::string thread_error;
  if (arrival.open_loop) {
    // One thread per conversation, each waiting for its start: a slow
    // server delays no other conversation's arrival.
    for (int c = 0; c < options.num_conversations; ++c) {
      try {
        threads.emplace_back(runConversation, c, c);
      } catch (const std::system_error& e) {
        // The conversations left cannot arrive: their first turn fails.
        for (int rest = c; rest < options.num_conversations; ++rest) {
          TurnRecord& first = recordOf(rest, 0);
          first.result.error = std::string("no thread to send it: ") + e.what();
          progress.advance();
          skipFrom(rest, 1);
        }
        thread_error = e.what();
        break;
      }
    }
    if (!thread_error.empty()) {
      std::fprintf(stderr, "tandem-bench: only %zu of %d conversations started: %s\n",
                   threads.size(), options.num_conversations, thread_error.c_str());
    }
  } else {
    // Clients pull conversations from one counter, so a client that cannot
    // be started loses no work as long as one runs.
    auto client = [&](int client_id) {
      for (int c; (c = next_conversation.fetch_add(1)) < options.num_conversations;) {
        runConversation(c, client_id);
      }
    };
    for (int i = 0; i < options.num_clients; ++i) {
      try {
        threads.emplace_back(client, i);
      } catch (const std::system_error& e) {
        thread_error = e.what();
        break;
      }
    }
    if (threads.empty()) throw Error("cannot start a client thread: " + thread_error);
    if (!thread_error.empty()) {
      std::fprintf(stderr, "tandem-bench: only %zu of %d clients started: %s\n", threads.size(),
                   options.num_clients, thread_error.c_str());
    }
  }
  for (std::thread& thread : threads) thread.join();
  const double duration_s = secondsBetween(start, Clock::now());
  const HostCpuUse host_cpu = host_cpu_meter.finish();

  const std::optional<std::string> metrics_after =
      fetchText(base_url, "/metrics", options.read_timeout_s);
  const std::optional<CacheCounters> counters_after = cacheCountersIn(metrics_after);
  const std::optional<RouterDecisions> decisions =
      decisionsBetween(decisions_before, routerDecisionsIn(metrics_after));
  const ComputedPromptTokens computed = computedPromptTokens(
      agents_before, settledSnapshot(agent_urls, options.read_timeout_s, 10.0));
  const PromptMinimum minimum = promptMinimum(records, turns, plan);
  const std::optional<RequestBalance> balance = requestBalance(computed);
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
  if (arrival.open_loop) {
    char rates[48];
    std::snprintf(rates, sizeof(rates), "%.2f / %.2f", arrival.rate, request_throughput);
    std::printf("%-46s %12s\n", "request rate offered / achieved (req/s)", rates);
  }
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
    if (balance) {
      printBalance("requests finished per decode agent, max/mean", balance->decode);
      printBalance("requests finished per prefill agent, max/mean", balance->prefill);
    }
  }
  if (decisions) {
    std::string text;
    for (const auto& [kind, count] : *decisions) {
      text += (text.empty() ? "" : ", ") + kind + " " + std::to_string(std::llround(count));
    }
    std::printf("%-46s %12s  (%s)\n", "router decisions", "", text.c_str());
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
  {
    char busy[32] = "n/a";
    if (host_cpu.busy_fraction) {
      std::snprintf(busy, sizeof(busy), "%.1f", *host_cpu.busy_fraction * 100.0);
    }
    char load[64] = "n/a";
    if (host_cpu.load_average_1m) {
      std::snprintf(load, sizeof(load), "%.2f", *host_cpu.load_average_1m);
    }
    const std::string label =
        "host CPU busy over the run, " + std::to_string(host_cpu.cores) + " cores (%)";
    std::printf("%-46s %12s  (load average %s at the end)\n", label.c_str(), busy, load);
    if (host_cpu.overloaded()) {
      std::printf(
          "warning: host overloaded: figures measure the host, not the routing (CPU %s %% busy, "
          "load average %s)\n",
          busy, load);
    }
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
    // All turns last, so that its line is drawn over the others.
    std::vector<CdfSeries> series;
    for (size_t t = 0; t < per_turn.size(); ++t) {
      if (!per_turn[t].ttfts_s.empty()) {
        series.push_back({"turn " + std::to_string(t + 1), per_turn[t].ttfts_s});
      }
    }
    series.push_back({"all turns", overall.ttfts_s});
    plotTtftCdf(options.plot_path, series, title);
    std::fflush(stdout);
  }

  {
    json requests = json::array();
    for (const TurnRecord& record : records) {
      const StreamedCompletion& r = record.result;
      json entry = {{"conversation", record.conversation},
                    {"prefix_group", record.prefix_group},
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
    json decisions_json = nullptr;
    if (decisions) {
      decisions_json = json::object();
      for (const auto& [kind, count] : *decisions) decisions_json[kind] = std::llround(count);
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
    json balance_json = nullptr;
    if (balance) {
      balance_json = {{"decode", balance->decode.toJson()}, {"prefill", balance->prefill.toJson()}};
    }
    json host_cpu_json = {
        {"busy_fraction", host_cpu.busy_fraction ? json(*host_cpu.busy_fraction) : json(nullptr)},
        {"load_average_1m",
         host_cpu.load_average_1m ? json(*host_cpu.load_average_1m) : json(nullptr)},
        {"cores", host_cpu.cores},
        {"overloaded", host_cpu.overloaded()}};
    json out = {
        {"base_url", base_url},
        {"model", model},
        {"num_clients", options.num_clients},
        {"num_conversations", options.num_conversations},
        {"turns", turns},
        {"shared_prefix_tokens", options.shared_prefix_tokens},
        {"prefix_groups", plan.prefixes.size()},
        {"prefix_zipf", options.prefix_zipf},
        {"conversations_per_group", conversations_per_group},
        {"input_tokens", input.text()},
        {"output_tokens", output.text()},
        {"request_rate",
         std::isfinite(options.request_rate) ? json(options.request_rate) : json(nullptr)},
        {"arrival", arrival.text()},
        {"offered_rate", arrival.open_loop ? json(arrival.rate) : json(nullptr)},
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
        {"balance", std::move(balance_json)},
        {"host_cpu", std::move(host_cpu_json)},
        {"prefix_cache", {{"server", std::move(server_json)}, {"usage", std::move(usage_json)}}},
        {"router_decisions", std::move(decisions_json)},
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
