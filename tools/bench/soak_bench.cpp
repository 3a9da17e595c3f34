#include "tools/bench/soak_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/latency_stats.h"
#include "tools/bench/progress_bar.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

void validate(const SoakBenchOptions& o) {
  if (!(o.duration_s >= 1)) {
    throw Error("--duration must be at least 1 second, got " + numberText(o.duration_s));
  }
  if (!(o.sample_interval_s >= 0.05) || o.sample_interval_s > o.duration_s) {
    throw Error("--sample-interval must be between 0.05 s and --duration, got " +
                numberText(o.sample_interval_s));
  }
  if (o.load.clients < 1) {
    throw Error("--load-clients must be at least 1, got " + std::to_string(o.load.clients));
  }
  if (!(o.load.hang_timeout_s >= 1)) {
    throw Error("--hang-timeout must be at least 1 second, got " +
                numberText(o.load.hang_timeout_s));
  }
  if (o.exactness_checks < 0) {
    throw Error("--exactness-checks must be 0 (all) or more, got " +
                std::to_string(o.exactness_checks));
  }
}

}  // namespace

int runSoakBench(const SoakBenchOptions& options) {
  validate(options);
  StartedCluster started = startBenchCluster(options.cluster, options.work_dir, "soak");
  const LocalClusterOptions& cluster_options = started.options;
  std::unique_ptr<LocalCluster>& cluster = started.cluster;
  const std::string url = started.url;
  const std::string model = started.model;
  const int baseline_fds = openFdCount(cluster->operatorPid()).value_or(0);
  std::printf("cluster %s: %zu agents, router %s, model %s; %s s of load from %d clients\n",
              cluster->clusterFile().c_str(), cluster->expectedAgents(), url.c_str(), model.c_str(),
              numberText(options.duration_s).c_str(), options.load.clients);
  std::fflush(stdout);

  RssSampler sampler(*cluster,
                     milliseconds(static_cast<int64_t>(options.sample_interval_s * 1000)));
  MultiTurnLoad load(url, model, options.load);
  const Clock::time_point start = Clock::now();
  load.start();
  {
    const int ticks = static_cast<int>(options.duration_s);
    ProgressBar progress(static_cast<size_t>(ticks), stderrIsTerminal());
    for (int i = 1; i <= ticks; ++i) {
      std::this_thread::sleep_until(start + std::chrono::seconds(i));
      progress.advance();
    }
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(options.duration_s)));
  }
  load.stop();
  const double duration_s = secondsBetween(start, Clock::now());
  const std::vector<RssSampler::Series> series = sampler.stop();
  const SettleReport settle = cluster->waitUntilSettled(
      baseline_fds, milliseconds(static_cast<int64_t>(options.settle_timeout_s * 1000)));
  const std::string& agent_bin = started.agent_bin;
  const std::vector<std::string> reference_flags = cluster->referenceAgentFlags();
  cluster.reset();

  OutcomeCounts outcomes;
  std::vector<AnsweredRequest> answered;
  std::vector<double> ttfts, tpots, e2els;
  std::vector<std::string> errors;
  for (const LoadRecord& record : load.records()) {
    outcomes.add(record.outcome);
    if (record.outcome == Outcome::kOk) {
      answered.push_back(record.request);
      ttfts.push_back(record.result.ttft_s);
      if (record.result.completion_tokens > 1) tpots.push_back(record.result.tpotSeconds());
      e2els.push_back(record.result.e2el_s);
    } else if (errors.size() < 10) {
      errors.push_back(std::string(outcomeName(record.outcome)) + ": " + record.result.error);
    }
  }
  if (options.exactness_checks > 0 &&
      static_cast<int64_t>(answered.size()) > options.exactness_checks) {
    std::mt19937_64 rng(options.load.seed);
    std::shuffle(answered.begin(), answered.end(), rng);
    answered.resize(static_cast<size_t>(options.exactness_checks));
  }
  ExactnessReport exactness;
  {
    ReferenceAgent reference(agent_bin, reference_flags, cluster_options.work_dir);
    exactness = checkExactness(reference.url(), model, answered, 2);
  }

  const Distribution ttft = distributionOf(ttfts), tpot = distributionOf(tpots),
                     e2el = distributionOf(e2els);
  std::printf("\n=== tandem-bench soak: %.1f s, %d clients, %.2f req/s completed\n", duration_s,
              options.load.clients,
              static_cast<double>(outcomes[Outcome::kOk]) / std::max(duration_s, 1e-9));
  printOutcomeHeader("requests");
  printOutcomeRow("load", outcomes);
  std::printf("%-12s %10s %10s %10s %10s\n", "latency (ms)", "mean", "median", "p90", "p99");
  printDistribution("TTFT", ttft);
  printDistribution("TPOT", tpot);
  printDistribution("E2EL", e2el);
  // The whole run's slope includes warm-up (caches and the KV event ring
  // filling); the second half's tells whether memory still grows once warm.
  std::printf("\n%-14s %8s %12s %12s %16s %8s %18s\n", "RSS", "samples", "first (KiB)",
              "last (KiB)", "slope (KiB/min)", "r2", "2nd half (KiB/min)");
  json series_json = json::array();
  for (const RssSampler::Series& s : series) {
    std::vector<std::pair<double, double>> per_minute;
    for (const auto& [t, kib] : s.samples) per_minute.emplace_back(t / 60.0, kib);
    const LineFit fit = fitLine(per_minute);
    const LineFit second_half = fitLine(std::vector<std::pair<double, double>>(
        per_minute.begin() + static_cast<std::ptrdiff_t>(per_minute.size() / 2), per_minute.end()));
    const double first = s.samples.empty() ? 0 : s.samples.front().second;
    const double last = s.samples.empty() ? 0 : s.samples.back().second;
    std::printf("%-14s %8zu %12.0f %12.0f %16.1f %8.3f %18.1f\n", s.process.c_str(),
                s.samples.size(), first, last, fit.slope, fit.r2, second_half.slope);
    json samples = json::array();
    for (const auto& [t, kib] : s.samples) samples.push_back({t, kib});
    series_json.push_back({{"process", s.process},
                           {"pid", s.pid},
                           {"samples", s.samples.size()},
                           {"first_kib", first},
                           {"last_kib", last},
                           {"slope_kib_per_min", fit.slope},
                           {"r2", fit.r2},
                           {"second_half_slope_kib_per_min", second_half.slope},
                           {"rss_kib", std::move(samples)}});
  }
  std::printf(
      "\nexactness: %lld answers checked, %lld differ from the reference, %lld reference "
      "failures\n",
      static_cast<long long>(exactness.checked), static_cast<long long>(exactness.mismatched),
      static_cast<long long>(exactness.reference_failures));
  settle.print();
  for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) {
    std::printf("error: %s\n", errors[i].c_str());
  }

  std::vector<std::string> failed;
  if (outcomes.broken() > 0) {
    failed.push_back(std::to_string(outcomes.broken()) + " hung, truncated or unclean");
  }
  if (outcomes[Outcome::kOk] == 0) failed.push_back("no request succeeded");
  if (exactness.mismatched > 0 || exactness.reference_failures > 0) failed.push_back("inexact");
  if (settle.leakedBlocks() > 0) failed.push_back("leaked blocks");
  if (!settle.settled) failed.push_back("not settled");
  std::printf("\nverdict: %s\n", failed.empty() ? "every property held" : "FAILED");
  for (const std::string& reason : failed) std::printf("  - %s\n", reason.c_str());
  std::fflush(stdout);

  if (!options.json_path.empty()) {
    json out = {{"router_url", url},
                {"model", model},
                {"duration_s", duration_s},
                {"clients", options.load.clients},
                {"sample_interval_s", options.sample_interval_s},
                {"outcomes", outcomes.toJson()},
                {"ttft_ms", distributionMsJson(ttft)},
                {"tpot_ms", distributionMsJson(tpot)},
                {"e2el_ms", distributionMsJson(e2el)},
                {"rss", std::move(series_json)},
                {"exactness", exactness.toJson()},
                {"end_state", settle.toJson()},
                {"errors", errors},
                {"failed", failed},
                {"passed", failed.empty()}};
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return failed.empty() ? 0 : 1;
}

}  // namespace tandem::bench
