#include "tools/bench/router_scale_bench.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/prometheus_text.h"
#include "common/status.h"
#include "tools/bench/latency_stats.h"
#include "tools/bench/local_cluster.h"
#include "tools/bench/openai_client.h"
#include "tools/model/test_model.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kBlockSize = 16;  // written into the cluster file
constexpr const char* kDecisionHistogram = "tandem_router_decision_seconds";

std::string clusterYaml(const RouterScaleOptions& o, const std::string& model_dir,
                        const std::string& profile, int prefill, int decode) {
  auto pool = [&](const char* kind, const char* name, int replicas) {
    std::ostringstream out;
    out << "apiVersion: tandem.dev/v1alpha1\nkind: " << kind << "\nmetadata:\n  name: " << name
        << "\nspec:\n  replicas: " << replicas << "\n  model:\n    path: " << model_dir
        << "\n  engine:\n    simulate: " << profile << "\n    kvCacheMemory: " << o.kv_cache_memory
        << "\n    blockSize: " << kBlockSize
        << "\n    threads: 1\n    shutdownTimeoutSeconds: 5\n  kvTransfer:\n    connector: ucx\n"
        << "    role: kv_both\n";
    return out.str();
  };
  std::ostringstream out;
  out << pool("PrefillPool", "prefill", prefill) << "---\n"
      << pool("DecodePool", "decode", decode) << "---\n"
      << "apiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n  port: 0\n  policy: " << o.policy
      << "\n  maxInflightRequests: 64\n  maxQueuedRequests: 256\n";
  return out.str();
}

// One prompt in the two forms a client may send.
struct Prompt {
  json value;  // an array of token ids or a string
  int64_t tokens = 0;
};

// Distinct lowercase words, deterministic from `seed`.
std::string wordsText(size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> length(3, 8), letter(0, 25);
  std::string text;
  for (size_t w = 0; w < count; ++w) {
    if (w > 0) text += ' ';
    for (int c = length(random); c > 0; --c) text += static_cast<char>('a' + letter(random));
  }
  return text;
}

std::vector<int> tokenIds(size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> id(3, 250);  // ids every generated test model has
  std::vector<int> ids(count);
  for (int& value : ids) value = id(random);
  return ids;
}

// Tokens the agent's tokenizer makes of `text` (POST /tokenize).
int64_t countTokens(httplib::Client& agent, const std::string& text) {
  auto result = agent.Post("/tokenize", json{{"prompt", text}}.dump(), "application/json");
  if (!result || result->status != 200) {
    throw Error("POST /tokenize to an agent failed: " +
                (result
                     ? "HTTP " + std::to_string(result->status) + " " + result->body.substr(0, 200)
                     : httplib::to_string(result.error())));
  }
  return json::parse(result->body).at("count").get<int64_t>();
}

// Seconds of one completion, or the reason it failed.
struct Timed {
  double seconds = 0;
  std::string error;  // empty: HTTP 200
};

Timed timedCompletion(httplib::Client& client, const std::string& body) {
  const auto start = Clock::now();
  auto result = client.Post("/v1/completions", body, "application/json");
  Timed timed{secondsBetween(start, Clock::now()), ""};
  if (!result) {
    timed.error = httplib::to_string(result.error());
  } else if (result->status != 200) {
    timed.error = "HTTP " + std::to_string(result->status) + " " + result->body.substr(0, 200);
  }
  return timed;
}

std::unique_ptr<httplib::Client> clientFor(const std::string& url) {
  auto client = std::make_unique<httplib::Client>(url);
  client->set_read_timeout(600, 0);
  client->set_write_timeout(600, 0);
  client->set_keep_alive(false);  // a new connection per request, both ways
  return client;
}

// The router's decision histogram at one moment: cumulative bucket counts.
struct DecisionSnapshot {
  std::map<double, double> buckets;  // upper bound (+inf last) → cumulative count
  double count = 0, sum = 0;
};

DecisionSnapshot decisionSnapshot(const std::string& router_url) {
  const std::optional<std::string> text = fetchText(router_url, "/metrics", 30);
  if (!text) throw Error("GET " + router_url + "/metrics failed");
  DecisionSnapshot snapshot;
  std::istringstream lines(*text);
  const std::string bucket_name = std::string(kDecisionHistogram) + "_bucket";
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto sample = parsePrometheusSampleLine(line);
    if (!sample) continue;
    if (sample->name == bucket_name) {
      const auto le = sample->label("le");
      const auto bound = le ? prometheusValue(*le) : std::nullopt;
      if (bound) snapshot.buckets[*bound] = sample->value;
    } else if (sample->name == std::string(kDecisionHistogram) + "_count") {
      snapshot.count = sample->value;
    } else if (sample->name == std::string(kDecisionHistogram) + "_sum") {
      snapshot.sum = sample->value;
    }
  }
  return snapshot;
}

// What one phase (one prompt kind) measured.
struct PhaseResult {
  std::string kind;
  int64_t prompt_tokens = 0;  // mean over the prompts
  int routed_requests = 0;    // warm-up pair included
  int failures = 0;
  std::vector<std::string> errors;  // the first few
  double decisions = 0, decision_mean_s = 0;
  double p50_s = 0, p90_s = 0, p99_s = 0;
  double largest_bound_s = 0;  // the histogram's last finite bucket
  Distribution direct, routed, added;
};

// The q-quantile of the decisions between two snapshots, interpolated
// linearly inside the bucket it falls in (as Prometheus' histogram_quantile
// does); past the last finite bound, that bound.
double bucketQuantile(const DecisionSnapshot& before, const DecisionSnapshot& after, double q) {
  const double total = after.count - before.count;
  if (total <= 0) return 0;
  const double rank = q * total;
  double lower = 0, below = 0;
  for (const auto& [bound, cumulative] : after.buckets) {
    auto it = before.buckets.find(bound);
    const double count = cumulative - (it == before.buckets.end() ? 0 : it->second);
    if (count >= rank) {
      if (std::isinf(bound)) return lower;
      const double inside = count - below;
      return inside > 0 ? lower + (bound - lower) * (rank - below) / inside : bound;
    }
    lower = bound;
    below = count;
  }
  return lower;
}

PhaseResult runPhase(const std::string& kind, const std::string& router_url,
                     const std::vector<std::string>& decode_urls,
                     const std::vector<std::string>& bodies, const std::vector<int64_t>& tokens,
                     int requests) {
  PhaseResult phase;
  phase.kind = kind;
  for (int64_t t : tokens) phase.prompt_tokens += t;
  phase.prompt_tokens /= static_cast<int64_t>(tokens.size());
  auto routed = clientFor(router_url);
  std::vector<std::unique_ptr<httplib::Client>> direct;
  for (const std::string& url : decode_urls) direct.push_back(clientFor(url));

  auto record = [&](const Timed& timed, const char* where) {
    if (timed.error.empty()) return true;
    ++phase.failures;
    if (phase.errors.size() < 5) phase.errors.push_back(std::string(where) + ": " + timed.error);
    return false;
  };
  const DecisionSnapshot before = decisionSnapshot(router_url);
  // Warm-up pair: connections, the router's first look at this prompt kind.
  record(timedCompletion(*direct[0], bodies[0]), "direct");
  record(timedCompletion(*routed, bodies[0]), "routed");
  phase.routed_requests = 1;
  std::vector<double> direct_s, routed_s, added_s;
  for (int r = 0; r < requests; ++r) {
    const size_t i = static_cast<size_t>(r) % bodies.size();
    Timed d, t;
    // Alternate which goes first so drift on a shared machine cancels out.
    if (r % 2 == 0) {
      d = timedCompletion(*direct[i], bodies[i]);
      t = timedCompletion(*routed, bodies[i]);
    } else {
      t = timedCompletion(*routed, bodies[i]);
      d = timedCompletion(*direct[i], bodies[i]);
    }
    ++phase.routed_requests;
    const bool direct_ok = record(d, "direct");
    const bool routed_ok = record(t, "routed");
    if (!direct_ok || !routed_ok) continue;
    direct_s.push_back(d.seconds);
    routed_s.push_back(t.seconds);
    added_s.push_back(t.seconds - d.seconds);
  }
  const DecisionSnapshot after = decisionSnapshot(router_url);
  phase.decisions = after.count - before.count;
  phase.decision_mean_s = phase.decisions > 0 ? (after.sum - before.sum) / phase.decisions : 0;
  phase.p50_s = bucketQuantile(before, after, 0.5);
  phase.p90_s = bucketQuantile(before, after, 0.9);
  phase.p99_s = bucketQuantile(before, after, 0.99);
  for (const auto& [bound, cumulative] : after.buckets) {
    if (!std::isinf(bound)) phase.largest_bound_s = bound;
  }
  phase.direct = distributionOf(direct_s);
  phase.routed = distributionOf(routed_s);
  phase.added = distributionOf(added_s);
  return phase;
}

json phaseJson(const PhaseResult& p) {
  const double per_s = p.decision_mean_s > 0 ? 1 / p.decision_mean_s : 0.0;
  return {
      {"prompt_tokens", p.prompt_tokens},
      {"routed_requests", p.routed_requests},
      {"decisions", p.decisions},
      {"failures", p.failures},
      {"errors", p.errors},
      {"decision_us",
       {{"mean", p.decision_mean_s * 1e6},
        {"p50", p.p50_s * 1e6},
        {"p90", p.p90_s * 1e6},
        {"p99", p.p99_s * 1e6},
        {"resolution", "p50/p90/p99 interpolated within histogram buckets; mean exact"}}},
      {"decisions_per_second_per_thread", per_s},
      {"direct_ms", distributionMsJson(p.direct)},
      {"routed_ms", distributionMsJson(p.routed)},
      {"added_ms", distributionMsJson(p.added)},
      {"routed_over_direct_median", p.direct.median > 0 ? p.routed.median / p.direct.median : 0.0}};
}

void printPhase(const PhaseResult& p) {
  std::printf("\nprompt as %s (%lld tokens): %d routed requests, %d failures\n", p.kind.c_str(),
              static_cast<long long>(p.prompt_tokens), p.routed_requests, p.failures);
  for (const std::string& error : p.errors) std::printf("  failed: %s\n", error.c_str());
  std::printf("%-12s %10s %10s %10s %10s\n", "(ms)", "mean", "median", "p90", "p99");
  printDistribution("direct", p.direct);
  printDistribution("routed", p.routed);
  printDistribution("added", p.added);
  std::printf("routed / direct median: %.2f\n",
              p.direct.median > 0 ? p.routed.median / p.direct.median : 0.0);
  std::printf(
      "decision (hash, ownership lookup, choose; %.0f decisions): mean %.1f us (exact), "
      "p50 %.0f us, p90 %.0f us, p99 %.0f us (within histogram buckets) = %.0f decisions/s "
      "per thread\n",
      p.decisions, p.decision_mean_s * 1e6, p.p50_s * 1e6, p.p90_s * 1e6, p.p99_s * 1e6,
      p.decision_mean_s > 0 ? 1 / p.decision_mean_s : 0.0);
}

// Waits until the router's ownership index holds at least `blocks` blocks
// for each named agent (tandem_router_index_blocks, fed by the agents' KV
// events).
void waitForIndex(const std::string& router_url, const std::vector<std::string>& names,
                  int64_t blocks) {
  const auto deadline = Clock::now() + std::chrono::seconds(180);
  std::string missing;
  for (;;) {
    missing.clear();
    const std::optional<std::string> text = fetchText(router_url, "/metrics", 30);
    for (const std::string& name : names) {
      const double held =
          text ? prometheusSample(*text, "tandem_router_index_blocks", "agent=\"" + name + "\"")
                     .value_or(0)
               : 0;
      if (held < static_cast<double>(blocks)) {
        missing += " " + name + "(" + std::to_string(static_cast<int64_t>(held)) + ")";
      }
    }
    if (missing.empty()) return;
    if (Clock::now() > deadline) {
      throw Error("the router's ownership index did not reach " + std::to_string(blocks) +
                  " blocks in 180 s for:" + missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void checkOptions(const RouterScaleOptions& o) {
  if (o.agents < 2) {
    throw Error("--agents must be at least 2 (half prefill, half decode), got " +
                std::to_string(o.agents));
  }
  if (o.prompt_kinds != "ids" && o.prompt_kinds != "text" && o.prompt_kinds != "both") {
    throw Error("--prompt must be ids, text or both, got " + o.prompt_kinds);
  }
  if (!(o.shared_prefix >= 0 && o.shared_prefix < 1)) {
    throw Error("--shared-prefix must be in [0, 1), got " + std::to_string(o.shared_prefix));
  }
  if (o.prompt_tokens < 2 * kBlockSize) {
    throw Error("--prompt-tokens must be at least " + std::to_string(2 * kBlockSize) +
                " in cluster mode, got " + std::to_string(o.prompt_tokens));
  }
  if (!fs::is_regular_file(o.simulate)) {
    throw Error("--simulate " + o.simulate + " is not a profile file");
  }
  if (!o.model_dir.empty() && !fs::is_regular_file(fs::path(o.model_dir) / "config.json")) {
    throw Error("--model-dir " + o.model_dir +
                " holds no config.json (make run writes models/small; tandem-model --preset "
                "small --out DIR writes one)");
  }
}

}  // namespace

int runRouterScaleBench(const RouterScaleOptions& options) {
  checkOptions(options);
  const int prefill_agents = options.agents / 2;
  const int decode_agents = options.agents - prefill_agents;
  const fs::path work_dir =
      options.work_dir.empty()
          ? fs::temp_directory_path() / ("tandem-bench-router-" + std::to_string(::getpid()))
          : fs::path(options.work_dir);
  fs::create_directories(work_dir);
  std::string model_dir = options.model_dir.empty() ? "" : fs::absolute(options.model_dir).string();
  if (model_dir.empty()) {
    tools::TestModelOptions model_options;
    model_options.seed = 21;
    model_dir = (work_dir / "tiny").string();
    tools::writeTestModel(model_options, model_dir);
  }
  const std::string profile = fs::absolute(options.simulate).string();
  LocalClusterOptions cluster_options;
  cluster_options.work_dir = work_dir;
  cluster_options.operator_bin = options.operator_bin;
  cluster_options.cluster_file = (work_dir / "cluster.yaml").string();
  std::ofstream(cluster_options.cluster_file)
      << clusterYaml(options, model_dir, profile, prefill_agents, decode_agents);
  std::printf(
      "tandem-bench router: starting %d simulated agents (%d prefill, %d decode; logs in %s)\n",
      options.agents, prefill_agents, decode_agents, work_dir.c_str());
  std::fflush(stdout);
  LocalCluster cluster(cluster_options, std::chrono::seconds(300));
  const std::string router_url = cluster.routerUrl();
  const std::vector<ServedModel> models = listModels(router_url, 60);
  if (models.empty()) throw Error(router_url + "/v1/models lists no model");
  const std::string model = models.front().id;

  std::map<std::string, ClusterAgent> by_name;
  for (const ClusterAgent& agent : cluster.agents()) by_name[agent.name] = agent;
  auto agentNamed = [&](const std::string& name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("the cluster has no agent " + name);
    return it->second;
  };
  std::vector<std::string> decode_urls, warmed_names;
  for (int i = 0; i < decode_agents; ++i) {
    decode_urls.push_back(agentNamed("decode-" + std::to_string(i)).url());
    warmed_names.push_back("decode-" + std::to_string(i));
  }
  for (int i = 0; i < prefill_agents; ++i) warmed_names.push_back("prefill-" + std::to_string(i));

  // Prompt i (one per decode agent): a shared head, then its own tail.
  std::vector<std::string> kinds;
  if (options.prompt_kinds != "text") kinds.push_back("ids");
  if (options.prompt_kinds != "ids") kinds.push_back("text");
  std::map<std::string, std::vector<Prompt>> prompts;
  const auto shared_tokens =
      static_cast<size_t>(options.shared_prefix * static_cast<double>(options.prompt_tokens));
  for (const std::string& kind : kinds) {
    for (int i = 0; i < decode_agents; ++i) {
      Prompt prompt;
      if (kind == "ids") {
        std::vector<int> ids = tokenIds(shared_tokens, 7);
        const std::vector<int> tail =
            tokenIds(static_cast<size_t>(options.prompt_tokens) - shared_tokens, 1000 + i);
        ids.insert(ids.end(), tail.begin(), tail.end());
        prompt.tokens = static_cast<int64_t>(ids.size());
        prompt.value = std::move(ids);
      }
      prompts[kind].push_back(std::move(prompt));
    }
  }
  if (prompts.count("text")) {
    // Words per token of this tokenizer, from a sample, then the real count.
    httplib::Client probe(decode_urls[0]);
    probe.set_read_timeout(600, 0);
    const size_t sample_words = 4000;
    const double tokens_per_word =
        static_cast<double>(countTokens(probe, wordsText(sample_words, 3))) / sample_words;
    const auto words_for = [&](size_t tokens) {
      return static_cast<size_t>(std::ceil(static_cast<double>(tokens) / tokens_per_word));
    };
    const std::string head = wordsText(words_for(shared_tokens), 7);
    for (int i = 0; i < decode_agents; ++i) {
      std::string text = head;
      if (!text.empty()) text += ' ';
      text += wordsText(words_for(static_cast<size_t>(options.prompt_tokens) - shared_tokens),
                        1000 + i);
      prompts["text"][i].tokens = countTokens(probe, text);
      prompts["text"][i].value = std::move(text);
    }
  }
  std::map<std::string, std::vector<std::string>> bodies;
  std::map<std::string, std::vector<int64_t>> token_counts;
  for (const auto& [kind, list] : prompts) {
    for (const Prompt& prompt : list) {
      bodies[kind].push_back(json{
          {"model", model},
          {"prompt", prompt.value},
          {"max_tokens", options.max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}}.dump());
      token_counts[kind].push_back(prompt.tokens);
    }
  }

  // Warm-up: prompt i straight to decode-i and prefill-i (every kind), all
  // agents at once; nothing goes through the router yet.
  std::printf("tandem-bench router: warming every agent with its own %d-token prompt(s)\n",
              options.prompt_tokens);
  std::fflush(stdout);
  const auto warm_start = Clock::now();
  std::vector<std::string> warm_errors(static_cast<size_t>(options.agents));
  {
    std::vector<std::thread> threads;
    for (int a = 0; a < options.agents; ++a) {
      const bool decode = a < decode_agents;
      const int i = decode ? a : a - decode_agents;
      const std::string url =
          agentNamed((decode ? "decode-" : "prefill-") + std::to_string(i)).url();
      threads.emplace_back([&, a, i, url] {
        auto client = clientFor(url);
        for (const std::string& kind : kinds) {
          const Timed timed = timedCompletion(*client, bodies[kind][static_cast<size_t>(i)]);
          if (!timed.error.empty()) warm_errors[static_cast<size_t>(a)] = url + ": " + timed.error;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
  for (const std::string& error : warm_errors) {
    if (!error.empty()) throw Error("warming an agent failed: " + error);
  }
  int64_t expected_blocks = 0;
  for (const std::string& kind : kinds) {
    expected_blocks +=
        *std::min_element(token_counts[kind].begin(), token_counts[kind].end()) / kBlockSize - 1;
  }
  waitForIndex(router_url, warmed_names, expected_blocks);
  std::printf(
      "tandem-bench router: warmed in %.1f s; the router indexes >= %lld blocks per agent\n",
      secondsBetween(warm_start, Clock::now()), static_cast<long long>(expected_blocks));

  std::vector<PhaseResult> phases;
  for (const std::string& kind : kinds) {
    phases.push_back(runPhase(kind, router_url, decode_urls, bodies[kind], token_counts[kind],
                              options.requests));
  }

  std::printf(
      "\nrouter cost at scale: %d simulated agents (%d prefill + %d decode, %s), policy %s, "
      "%d pairs per prompt kind, %.0f%% of each prompt shared by all, max_tokens %d\n",
      options.agents, prefill_agents, decode_agents, options.simulate.c_str(),
      options.policy.c_str(), options.requests, options.shared_prefix * 100, options.max_tokens);
  int failures = 0;
  double decisions = 0;
  int routed_requests = 0;
  json phase_json = json::object();
  for (const PhaseResult& phase : phases) {
    printPhase(phase);
    failures += phase.failures;
    decisions += phase.decisions;
    routed_requests += phase.routed_requests;
    phase_json[phase.kind] = phaseJson(phase);
  }
  if (!phases.empty()) {
    std::printf(
        "\ndecision times come from the router's histogram: the mean is exact (sum / count); "
        "percentiles are only as fine as its buckets (up to %.0f ms). The decision excludes "
        "parsing and tokenizing the request; the added latency includes them.\n",
        phases.front().largest_bound_s * 1e3);
  }
  if (!options.json_path.empty()) {
    json out = {{"mode", "cluster"},
                {"agents", options.agents},
                {"prefill_agents", prefill_agents},
                {"decode_agents", decode_agents},
                {"policy", options.policy},
                {"profile", options.simulate},
                {"model_dir", model_dir},
                {"prompt_tokens", options.prompt_tokens},
                {"shared_prefix", options.shared_prefix},
                {"requests", options.requests},
                {"routed_requests", routed_requests},
                {"decisions", decisions},
                {"failures", failures},
                {"phases", phase_json}};
    std::ofstream(options.json_path) << out.dump(2) << "\n";
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace tandem::bench
