#include "tools/bench/planner_bench.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/status.h"
#include "operator/spec/cluster_spec.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/local_cluster.h"
#include "tools/bench/openai_client.h"
#include "tools/bench/planner_plot.h"
#include "tools/bench/planner_ramp.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kPlannerLogMarker = "local: planner: ";

struct PlannerEventLine {
  double time_s = 0.0;  // when the bench saw it, since the start of the ramp
  std::string text;     // "ScaledUp: prefill pool prefill: ..."
};

void checkOptions(const PlannerBenchOptions& o) {
  auto positive = [](double value, const char* option) {
    if (!(value > 0) || !std::isfinite(value)) {
      throw Error(std::string(option) + " must be a number above 0, got " + numberText(value));
    }
  };
  positive(o.planner_interval_s, "--planner-interval");
  positive(o.target_ttft_s, "--target-ttft");
  positive(o.target_itl_s, "--target-itl");
  positive(o.window_s, "--window");
  positive(o.read_timeout_s, "--read-timeout");
  if (o.scale_down_stabilization_s < 0) {
    throw Error("--scale-down-stabilization must be 0 or more seconds, got " +
                numberText(o.scale_down_stabilization_s));
  }
  if (o.min_replicas < 1 || o.max_replicas < o.min_replicas) {
    throw Error(
        "--min-replicas must be at least 1 and --max-replicas at least --min-replicas, "
        "got " +
        std::to_string(o.min_replicas) + " and " + std::to_string(o.max_replicas));
  }
  if (o.max_step < 1)
    throw Error("--max-step must be at least 1, got " + std::to_string(o.max_step));
  if (o.max_concurrency < 1) {
    throw Error("--max-concurrency must be at least 1, got " + std::to_string(o.max_concurrency));
  }
  for (const auto& [value, option] : {std::pair{o.prefill_prompt_tokens, "--prefill-prompt-tokens"},
                                      {o.prefill_output_tokens, "--prefill-output-tokens"},
                                      {o.decode_prompt_tokens, "--decode-prompt-tokens"},
                                      {o.decode_output_tokens, "--decode-output-tokens"}}) {
    if (value < 1)
      throw Error(std::string(option) + " must be at least 1, got " + std::to_string(value));
  }
}

// The generated cluster: one PrefillPool and one DecodePool of simulated
// agents, one replica each to start, with the planner's targets.
std::string generatedClusterYaml(const PlannerBenchOptions& o, const fs::path& model_dir,
                                 const fs::path& profile) {
  auto pool = [&](const char* kind, const char* name, const std::string& target) {
    std::ostringstream out;
    out << "apiVersion: tandem.dev/v1alpha1\nkind: " << kind << "\nmetadata:\n  name: " << name
        << "\nspec:\n  replicas: " << o.min_replicas
        << "\n  model:\n    path: " << model_dir.string()
        << "\n  engine:\n    simulate: " << profile.string()
        << "\n    numBlocks: 4096\n    threads: 1\n    shutdownTimeoutSeconds: 5\n"
        << "  kvTransfer:\n    connector: ucx\n    role: kv_both\n"
        << "  autoscaling:\n    minReplicas: " << o.min_replicas
        << "\n    maxReplicas: " << o.max_replicas << "\n    " << target
        << "\n    windowSeconds: " << numberText(o.window_s)
        << "\n    scaleUpStabilizationSeconds: 0\n    scaleDownStabilizationSeconds: "
        << numberText(o.scale_down_stabilization_s) << "\n    maxStep: " << o.max_step << "\n";
    return out.str();
  };
  return pool("PrefillPool", "prefill", "targetTTFTSeconds: " + numberText(o.target_ttft_s)) +
         "---\n" + pool("DecodePool", "decode", "targetITLSeconds: " + numberText(o.target_itl_s)) +
         "---\napiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n  port: 0\n"
         "  disaggThresholdTokens: 16\n  maxInflightRequests: 1024\n"
         "  maxQueuedRequests: 4096\n";
}

// The targets the planner works to, from the cluster file's autoscaled pools.
RampTargets targetsOf(const fs::path& cluster_file) {
  const spec::ClusterSpec cluster = spec::loadClusterSpec(cluster_file);
  std::optional<planner::AutoscalingSpec> prefill, decode;
  for (const spec::PoolSpec& pool : cluster.pools) {
    if (!pool.autoscaling) continue;
    auto& slot = pool.kind == spec::PoolKind::kPrefill ? prefill : decode;
    if (!slot) slot = pool.autoscaling->spec;
  }
  if (!prefill || !decode) {
    throw Error(cluster_file.string() +
                " needs a PrefillPool and a DecodePool with spec.autoscaling (targetTTFTSeconds "
                "and targetITLSeconds) for the planner to work to");
  }
  RampTargets targets;
  targets.ttft_s = *prefill->target_ttft_seconds;
  targets.itl_s = *decode->target_itl_seconds;
  targets.quantile = prefill->quantile;
  targets.window_s = prefill->window_seconds;
  return targets;
}

// Follows the operator's log for planner Events and counts each pool's
// ready agents once a second until stopped.
class RampSampler {
 public:
  RampSampler(LocalCluster& cluster, fs::path log_path, Clock::time_point start)
      : cluster_(cluster), log_path_(std::move(log_path)), start_(start) {
    sample();
    thread_ = std::thread([this] { run(); });
  }
  ~RampSampler() { stop(); }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    sample();
  }
  std::vector<ReplicaSample> samples() {
    std::lock_guard lock(mutex_);
    return samples_;
  }
  std::vector<PlannerEventLine> events() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  ReplicaSample latest() {
    std::lock_guard lock(mutex_);
    return samples_.empty() ? ReplicaSample{} : samples_.back();
  }

 private:
  void run() {
    for (int tick = 1;; ++tick) {
      std::unique_lock lock(mutex_);
      if (wake_.wait_until(lock, start_ + std::chrono::seconds(tick),
                           [this] { return stopping_; })) {
        return;
      }
      lock.unlock();
      sample();
    }
  }

  void sample() {
    ReplicaSample sample;
    for (const ClusterAgent& agent : cluster_.agents()) {
      if (!processRssKib(agent.pid)) continue;  // exited: scaled away or crashed
      if (agent.role == "prefill") ++sample.prefill;
      if (agent.role == "decode") ++sample.decode;
    }
    sample.time_s = std::max(0.0, secondsBetween(start_, Clock::now()));
    std::vector<PlannerEventLine> fresh;
    std::ifstream in(log_path_, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(log_offset_));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t end = text.rfind('\n');
    if (end != std::string::npos) {
      log_offset_ += end + 1;
      std::istringstream lines(text.substr(0, end + 1));
      for (std::string line; std::getline(lines, line);) {
        const size_t at = line.find(kPlannerLogMarker);
        if (at != std::string::npos) {
          fresh.push_back({sample.time_s, line.substr(at + std::string(kPlannerLogMarker).size())});
        }
      }
    }
    for (const PlannerEventLine& event : fresh) {
      std::printf("  %6.1f s  planner: %s\n", event.time_s, event.text.c_str());
    }
    std::fflush(stdout);
    std::lock_guard lock(mutex_);
    samples_.push_back(sample);
    events_.insert(events_.end(), fresh.begin(), fresh.end());
  }

  LocalCluster& cluster_;
  fs::path log_path_;
  Clock::time_point start_;
  size_t log_offset_ = 0;  // sampler thread (and stop(), after the join) only
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<ReplicaSample> samples_;
  std::vector<PlannerEventLine> events_;
  std::thread thread_;
};

RampRequest sendRequest(const std::string& url, const std::string& model,
                        const PlannedRequest& planned, const ShapeLengths& lengths,
                        std::pair<int32_t, int32_t> vocab, uint64_t seed, size_t index,
                        double read_timeout_s, Clock::time_point start) {
  std::mt19937_64 rng(seed * 1000003ULL + index);
  std::uniform_int_distribution<int32_t> token(vocab.first, vocab.second - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(lengths.prompt_tokens));
  for (int32_t& id : prompt) id = token(rng);
  const json body = {{"model", model},
                     {"prompt", prompt},
                     {"max_tokens", lengths.output_tokens},
                     {"temperature", 0.0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  StreamedCompletion result = streamCompletion(url, body.dump(), read_timeout_s, start);
  RampRequest request;
  request.phase = planned.phase;
  request.success = result.success;
  request.error = result.error;
  if (result.success && result.completion_tokens != lengths.output_tokens) {
    request.success = false;
    request.error = "asked for " + std::to_string(lengths.output_tokens) + " tokens, got " +
                    std::to_string(result.completion_tokens);
  }
  request.send_s = result.send_s;
  request.ttft_s = result.ttft_s;
  request.itl_s = result.itl_s;
  double at = result.send_s + result.ttft_s;
  for (double gap : result.itl_s) {
    at += gap;
    request.token_end_s.push_back(at);
  }
  return request;
}

std::string rangeText(const PoolRange& range) {
  return std::to_string(range.min) + "-" + std::to_string(range.max);
}

std::string optionalText(const std::optional<double>& value, double scale, const char* format) {
  if (!value) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), format, *value * scale);
  return text;
}

void printSummaries(const RampFigures& figures, const RampTargets& targets) {
  std::string q = "p";
  q += numberText(targets.quantile * 100);
  std::printf(
      "\ntargets: TTFT %s <= %s s (prefill), ITL %s <= %s ms (decode); missed = the %s "
      "over the last %s s above its target\n",
      q.c_str(), numberText(targets.ttft_s).c_str(), q.c_str(),
      numberText(targets.itl_s * 1e3).c_str(), q.c_str(), numberText(targets.window_s).c_str());
  std::printf("%-20s %6s %5s %8s %8s %10s %10s %9s %9s %9s\n", "phase", "reqs", "fail", "prefill",
              "decode", ("TTFT " + q + "(s)").c_str(), ("ITL " + q + "(ms)").c_str(), "goodput/s",
              "P miss(s)", "D miss(s)");
  auto row = [&](const RampSummary& s) {
    std::printf("%-20s %6zu %5zu %8s %8s %10s %10s %9.2f %9d %9d\n", s.name.c_str(), s.requests,
                s.failed, rangeText(s.prefill_replicas).c_str(),
                rangeText(s.decode_replicas).c_str(), optionalText(s.ttft_q, 1, "%.3f").c_str(),
                optionalText(s.itl_q, 1e3, "%.2f").c_str(), s.goodput, s.prefill_missed_s,
                s.decode_missed_s);
  };
  for (const RampSummary& s : figures.phases) row(s);
  row(figures.overall);
}

}  // namespace

int runPlannerBench(const PlannerBenchOptions& options) {
  checkOptions(options);
  const std::vector<RampPhase> phases = parsePhases(options.phases);
  const std::pair<int32_t, int32_t> vocab = parseVocabRange(options.vocab_range);
  if (!options.plot_path.empty()) findGnuplot();  // fail before the run, not after it

  const fs::path work_dir =
      options.work_dir.empty()
          ? fs::temp_directory_path() / ("tandem-bench-planner-" + std::to_string(::getpid()))
          : fs::path(options.work_dir);
  fs::create_directories(work_dir);
  fs::path cluster_file = options.cluster_file;
  if (cluster_file.empty()) {
    const fs::path model_dir = fs::absolute(options.model_dir);
    const fs::path profile = fs::absolute(options.profile);
    if (!fs::exists(model_dir / "config.json")) {
      throw Error("--model-dir " + options.model_dir +
                  " is not a model directory (no config.json); give one such as models/small");
    }
    if (!fs::is_regular_file(profile)) {
      throw Error("--profile " + options.profile +
                  " is not a file; give a step profile such as profiles/llama3.1-8b-h100.yaml");
    }
    cluster_file = work_dir / "cluster.yaml";
    std::ofstream(cluster_file) << generatedClusterYaml(options, model_dir, profile);
  }
  const RampTargets targets = targetsOf(cluster_file);
  const ShapeLengths prefill_shape{options.prefill_prompt_tokens, options.prefill_output_tokens};
  const ShapeLengths decode_shape{options.decode_prompt_tokens, options.decode_output_tokens};

  LocalClusterOptions cluster_options;
  cluster_options.cluster_file = cluster_file.string();
  cluster_options.operator_bin = options.operator_bin;
  cluster_options.operator_args = {"--planner-interval", numberText(options.planner_interval_s)};
  StartedCluster started = startBenchCluster(cluster_options, work_dir.string(), "planner");
  LocalCluster& cluster = *started.cluster;

  const std::vector<PlannedRequest> arrivals = planArrivals(phases, options.seed);
  double ramp_s = 0.0;
  for (const RampPhase& phase : phases) ramp_s += phase.duration_s;
  std::printf("tandem-bench planner: %zu requests over %s s (%s) through %s, planner every %s s\n",
              arrivals.size(), numberText(ramp_s).c_str(), options.phases.c_str(),
              started.url.c_str(), numberText(options.planner_interval_s).c_str());
  std::fflush(stdout);

  const Clock::time_point start = Clock::now();
  RampSampler sampler(cluster, work_dir / "operator.stderr", start);
  std::vector<RampRequest> requests(arrivals.size());
  std::atomic<size_t> next{0}, done{0};
  std::vector<std::thread> workers;
  const size_t worker_count =
      std::min(arrivals.size(), static_cast<size_t>(options.max_concurrency));
  for (size_t w = 0; w < worker_count; ++w) {
    workers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < arrivals.size();) {
        std::this_thread::sleep_until(start +
                                      std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(arrivals[i].arrival_s)));
        const ShapeLengths& lengths =
            arrivals[i].shape == RampShape::kPrefill ? prefill_shape : decode_shape;
        requests[i] = sendRequest(started.url, started.model, arrivals[i], lengths, vocab,
                                  options.seed, i, options.read_timeout_s, start);
        done.fetch_add(1);
      }
    });
  }
  // A status line every 10 s while the ramp runs.
  std::thread status([&] {
    for (int tick = 10;; tick += 10) {
      while (Clock::now() < start + std::chrono::seconds(tick)) {
        if (done.load() == arrivals.size()) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      const ReplicaSample replicas = sampler.latest();
      std::printf("  %6d s  replicas prefill %d decode %d; requests done %zu of %zu\n", tick,
                  replicas.prefill, replicas.decode, done.load(), arrivals.size());
      std::fflush(stdout);
    }
  });
  for (std::thread& worker : workers) worker.join();
  status.join();
  sampler.stop();

  const RampFigures figures = computeRampFigures(phases, requests, sampler.samples(), targets);
  printSummaries(figures, targets);
  size_t failed = figures.overall.failed;
  for (const RampRequest& request : requests) {
    if (!request.success) {
      std::printf("first failure: %s\n", request.error.c_str());
      break;
    }
  }

  if (!options.plot_path.empty()) {
    renderRampPlot(phases, figures, targets, work_dir / "planner-ramp.dat",
                   work_dir / "planner-ramp.gnuplot", options.plot_path);
    std::printf("plot: %s (data %s, script %s)\n", options.plot_path.c_str(),
                (work_dir / "planner-ramp.dat").c_str(),
                (work_dir / "planner-ramp.gnuplot").c_str());
  }
  if (!options.json_path.empty()) {
    json report;
    report["cluster_file"] = cluster_file.string();
    report["planner_interval_s"] = options.planner_interval_s;
    report["phases_spec"] = options.phases;
    report["targets"] = {{"ttft_s", targets.ttft_s},
                         {"itl_s", targets.itl_s},
                         {"quantile", targets.quantile},
                         {"window_s", targets.window_s}};
    report["shapes"] = {{"prefill",
                         {{"prompt_tokens", prefill_shape.prompt_tokens},
                          {"output_tokens", prefill_shape.output_tokens}}},
                        {"decode",
                         {{"prompt_tokens", decode_shape.prompt_tokens},
                          {"output_tokens", decode_shape.output_tokens}}}};
    report["phases"] = json::array();
    for (const RampSummary& s : figures.phases) report["phases"].push_back(rampSummaryJson(s));
    report["overall"] = rampSummaryJson(figures.overall);
    report["all_succeeded"] = failed == 0;
    report["events"] = json::array();
    for (const PlannerEventLine& event : sampler.events()) {
      report["events"].push_back({{"time_s", event.time_s}, {"text", event.text}});
    }
    json seconds = json::array();
    auto optional = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    for (const SecondFigures& s : figures.seconds) {
      seconds.push_back({{"time_s", s.time_s},
                         {"prefill_replicas", s.prefill_replicas},
                         {"decode_replicas", s.decode_replicas},
                         {"ttft_window_s", optional(s.ttft_window_q)},
                         {"itl_window_s", optional(s.itl_window_q)},
                         {"prefill_missed", s.prefill_missed},
                         {"decode_missed", s.decode_missed}});
    }
    report["seconds"] = std::move(seconds);
    std::ofstream out(options.json_path);
    out << report.dump(2) << "\n";
    if (!out) throw Error("cannot write --json " + options.json_path);
  }
  std::printf("stopping the cluster\n");
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

}  // namespace tandem::bench
