#include "tools/bench/speculative_bench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <vector>

#include "agent/engine/engine.h"
#include "kernels/kernels.h"

namespace tandem::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double secondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

struct Run {
  std::vector<std::vector<TokenId>> tokens;  // per request
  double decode_seconds = 0;                 // last first token → last finish
  int64_t decode_tokens = 0;                 // tokens after each request's first
  int64_t steps = 0;
};

std::vector<std::vector<TokenId>> promptsOf(const SpeculativeBenchOptions& options, int pair,
                                            int64_t vocab) {
  std::vector<std::vector<TokenId>> prompts;
  for (int64_t i = 0; i < options.batch; ++i) {
    std::mt19937 rng(static_cast<uint32_t>(7919 * pair + i + 1));
    auto token = [&] { return static_cast<TokenId>(3 + rng() % static_cast<uint32_t>(vocab - 3)); };
    std::vector<TokenId> prompt;
    if (options.prompts == "repeat") {
      std::vector<TokenId> part(32);
      for (TokenId& id : part) id = token();
      while (std::ssize(prompt) < options.prompt_tokens) {
        prompt.push_back(part[prompt.size() % part.size()]);
      }
    } else {
      while (std::ssize(prompt) < options.prompt_tokens) prompt.push_back(token());
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

Run runBatch(engine::Engine& engine, const std::vector<std::vector<TokenId>>& prompts,
             const SpeculativeBenchOptions& options, const std::string& tag) {
  Run run;
  run.tokens.resize(prompts.size());
  std::mutex mutex;
  std::condition_variable done;
  size_t finished = 0;
  Clock::time_point last_first{}, last_finish{};
  const int64_t steps_before = engine.stats().num_steps;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::Request request;
    request.id = tag + "-" + std::to_string(i);
    request.prompt = prompts[i];
    request.sampling.temperature = 0;
    request.sampling.ignore_eos = true;
    request.sampling.max_tokens = options.max_tokens;
    const Status added =
        engine.addRequest(std::move(request), [&, i](const engine::RequestOutput& out) {
          std::lock_guard lock(mutex);
          for (const auto& token : out.tokens) run.tokens[i].push_back(token.token);
          if (out.finished()) {
            last_first = std::max(last_first, out.timings.first_token);
            last_finish = std::max(last_finish, out.timings.finished);
            ++finished;
            done.notify_all();
          }
        });
    if (!added.isOk()) throw std::runtime_error(added.message());
  }
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return finished == prompts.size(); });
  run.decode_seconds = secondsBetween(last_first, last_finish);
  for (const auto& tokens : run.tokens) run.decode_tokens += std::ssize(tokens) - 1;
  run.steps = engine.stats().num_steps - steps_before;
  return run;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

int runSpeculativeBench(const SpeculativeBenchOptions& options) {
  auto speculative = engine::SpeculativeConfig::parse(options.speculative_config);
  if (!speculative.isOk()) {
    std::fprintf(stderr, "tandem-bench speculative: --%s\n",
                 speculative.status().message().c_str());
    return 2;
  }
  if (options.prompts != "repeat" && options.prompts != "random") {
    std::fprintf(stderr, "tandem-bench speculative: --prompts must be repeat or random\n");
    return 2;
  }
  if (options.threads > 0) kernels::setNumThreads(options.threads);
  engine::EngineConfig config;
  config.model_dir = options.model_dir;
  config.kv_cache_memory_bytes = int64_t{512} << 20;
  engine::Engine plain(config);
  config.speculative = *speculative;
  engine::Engine speculating(config);
  // Ids the tokenizer knows, so that prompts are text a model could see.
  const int64_t vocab =
      std::min<int64_t>(plain.model().config().vocab_size, plain.tokenizer().vocabSize());

  // Warm-up: the first batches touch every page of the weights and caches.
  const auto warm = promptsOf(options, -1, vocab);
  runBatch(plain, warm, options, "warm-plain");
  runBatch(speculating, warm, options, "warm-spec");
  const engine::EngineStats before = speculating.stats();

  std::vector<double> ratios;
  json pair_reports = json::array();
  bool identical = true;
  int64_t plain_steps = 0, spec_steps = 0, tokens = 0;
  for (int pair = 0; pair < options.pairs; ++pair) {
    const auto prompts = promptsOf(options, pair, vocab);
    const std::string tag = "pair-" + std::to_string(pair);
    Run without, with;
    if (pair % 2 == 0) {
      without = runBatch(plain, prompts, options, tag);
      with = runBatch(speculating, prompts, options, tag);
    } else {
      with = runBatch(speculating, prompts, options, tag);
      without = runBatch(plain, prompts, options, tag);
    }
    const bool same = without.tokens == with.tokens;
    identical = identical && same;
    const double plain_rate = static_cast<double>(without.decode_tokens) / without.decode_seconds;
    const double spec_rate = static_cast<double>(with.decode_tokens) / with.decode_seconds;
    ratios.push_back(spec_rate / plain_rate);
    plain_steps += without.steps;
    spec_steps += with.steps;
    for (const auto& answer : with.tokens) tokens += std::ssize(answer);
    pair_reports.push_back({{"decode_tokens_per_s_without", plain_rate},
                            {"decode_tokens_per_s_with", spec_rate},
                            {"ratio", spec_rate / plain_rate},
                            {"steps_without", without.steps},
                            {"steps_with", with.steps},
                            {"tokens_identical", same}});
    std::printf(
        "pair %d: decode %.1f tokens/s without drafts, %.1f with (ratio %.2f), steps "
        "%lld vs %lld, tokens %s\n",
        pair, plain_rate, spec_rate, spec_rate / plain_rate, static_cast<long long>(without.steps),
        static_cast<long long>(with.steps), same ? "identical" : "DIFFERENT");
  }
  const engine::EngineStats after = speculating.stats();
  const int64_t drafts = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens;
  const int64_t accepted =
      after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens;
  const int64_t draft_steps = after.spec_decode_num_drafts - before.spec_decode_num_drafts;
  const double acceptance = drafts > 0 ? static_cast<double>(accepted) / drafts : 0.0;
  const double ratio = median(ratios);
  std::printf(
      "\nmodel %s, %s prompts of %lld tokens, batch %lld, %lld tokens each; %s, %d threads\n",
      options.model_dir.c_str(), options.prompts.c_str(),
      static_cast<long long>(options.prompt_tokens), static_cast<long long>(options.batch),
      static_cast<long long>(options.max_tokens), kernels::isaName().c_str(),
      kernels::numThreads());
  std::printf("%-52s %10.2f\n", "decode tokens/s with drafts / without (median)", ratio);
  std::printf("%-52s %10.3f\n", "drafts accepted / drafts computed", acceptance);
  std::printf("%-52s %10.2f\n", "drafts accepted per step that drafted",
              draft_steps > 0 ? static_cast<double>(accepted) / draft_steps : 0.0);
  std::printf("%-52s %10.2f\n", "steps with drafts / without",
              plain_steps > 0 ? static_cast<double>(spec_steps) / plain_steps : 0.0);
  std::printf("%-52s %10s\n", "tokens identical in every pair", identical ? "yes" : "NO");
  if (!options.json_path.empty()) {
    const json report = {{"model", options.model_dir},
                         {"isa", kernels::isaName()},
                         {"threads", kernels::numThreads()},
                         {"speculative_config", json::parse(options.speculative_config)},
                         {"prompts", options.prompts},
                         {"prompt_tokens", options.prompt_tokens},
                         {"max_tokens", options.max_tokens},
                         {"batch", options.batch},
                         {"decode_ratio_median", ratio},
                         {"acceptance", acceptance},
                         {"draft_tokens", drafts},
                         {"accepted_tokens", accepted},
                         {"steps_ratio", plain_steps > 0 ? static_cast<double>(spec_steps) /
                                                               static_cast<double>(plain_steps)
                                                         : 0.0},
                         {"tokens_generated", tokens},
                         {"tokens_identical", identical},
                         {"pairs", pair_reports}};
    std::ofstream(options.json_path) << report.dump(2) << "\n";
  }
  return identical ? 0 : 1;
}

}  // namespace tandem::bench
