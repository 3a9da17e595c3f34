#include "tools/bench/multiturn_policies.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "operator/router/router.h"
#include "tools/bench/local_cluster.h"
#include "tools/bench/multiturn_summary.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::chrono::seconds kStartupTimeout{300};
constexpr const char* kReferencePolicy = "kv";

// A number at `path` in a report (e.g. {"ttft_ms", "mean"}); nullopt when absent or null.
std::optional<double> figure(const json& report, const std::vector<std::string>& path) {
  const json* node = &report;
  for (const std::string& key : path) {
    if (!node->is_object() || !node->contains(key)) return std::nullopt;
    node = &(*node)[key];
  }
  if (!node->is_number()) return std::nullopt;
  return node->get<double>();
}

struct Column {
  const char* name;
  std::vector<std::string> path;
  const char* format;  // printf format of the value
};

const std::vector<Column>& columns() {
  static const std::vector<Column> kColumns = {
      {"TTFT mean (ms)", {"ttft_ms", "mean"}, "%.1f"},
      {"TTFT p90 (ms)", {"ttft_ms", "p90"}, "%.1f"},
      {"ITL mean (ms)", {"itl_ms", "mean"}, "%.2f"},
      {"goodput (req/s)", {"goodput", "goodput"}, "%.2f"},
      {"good share", {"goodput", "share"}, "%.3f"},
      {"prompt tokens computed", {"prompt_tokens_computed", "computed"}, "%.0f"},
      {"computed / minimum", {"prompt_tokens_computed", "ratio"}, "%.3f"},
      {"decode max/mean", {"balance", "decode", "max_over_mean"}, "%.2f"},
      {"prefill max/mean", {"balance", "prefill", "max_over_mean"}, "%.2f"},
      {"req/s", {"request_throughput"}, "%.2f"},
      {"host CPU busy", {"host_cpu", "busy_fraction"}, "%.2f"},
  };
  return kColumns;
}

// The figures kv is compared on against the best other policy.
struct Versus {
  const char* name;
  std::vector<std::string> path;
  bool lower_is_better;
};

const std::vector<Versus>& versusFigures() {
  static const std::vector<Versus> kVersus = {
      {"TTFT mean", {"ttft_ms", "mean"}, true},
      {"TTFT p90", {"ttft_ms", "p90"}, true},
      {"goodput", {"goodput", "goodput"}, false},
  };
  return kVersus;
}

std::string keyOf(const std::vector<std::string>& path) {
  std::string key;
  for (const std::string& part : path) key += (key.empty() ? "" : ".") + part;
  return key;
}

std::string cell(const std::optional<double>& value, const char* format) {
  if (!value) return "n/a";
  char text[48];
  std::snprintf(text, sizeof(text), format, *value);
  return text;
}

// "median (min-max)" over rounds; the value alone for one round.
std::string spreadCell(const std::optional<Spread>& spread, const char* format) {
  if (!spread) return "n/a";
  if (spread->count == 1) return cell(spread->median, format);
  return cell(spread->median, format) + " (" + cell(spread->min, format) + "-" +
         cell(spread->max, format) + ")";
}

json spreadJson(const std::optional<Spread>& spread) {
  if (!spread) return nullptr;
  return {{"median", spread->median}, {"min", spread->min}, {"max", spread->max}};
}

// "ttft.png" → "ttft-kv.png" ("ttft-kv-r2.png" for round 2 of several).
std::string perRunPath(const std::string& path, const std::string& policy, size_t round,
                       size_t rounds) {
  if (path.empty()) return path;
  const fs::path p(path);
  std::string suffix = "-" + policy;
  if (rounds > 1) suffix += "-r" + std::to_string(round + 1);
  return (p.parent_path() / (p.stem().string() + suffix + p.extension().string())).string();
}

// One policy's report in one round, its cluster started and stopped here.
MultiTurnOutcome runOne(const MultiTurnBenchOptions& options, const std::string& policy,
                        const fs::path& work_dir, size_t round) {
  LocalClusterOptions cluster_options;
  cluster_options.cluster_file = options.cluster_file;
  cluster_options.operator_bin = options.operator_bin;
  cluster_options.operator_args = {"--policy", policy};
  cluster_options.work_dir = work_dir;
  std::printf("== policy %s%s: starting tandem-operator local -f %s (logs in %s)\n", policy.c_str(),
              options.rounds > 1 ? (", round " + std::to_string(round + 1)).c_str() : "",
              options.cluster_file.c_str(), cluster_options.work_dir.c_str());
  std::fflush(stdout);
  LocalCluster cluster(cluster_options, kStartupTimeout);
  std::vector<std::string> agent_urls;
  std::vector<std::string> names;
  for (const ClusterAgent& agent : cluster.agents()) {
    agent_urls.push_back(agent.url());
    names.push_back(agent.name);
  }
  MultiTurnBenchOptions run_options = options;
  run_options.plot_path =
      perRunPath(options.plot_path, policy, round, static_cast<size_t>(options.rounds));
  MultiTurnOutcome outcome = runMultiTurnOnce(run_options, cluster.routerUrl(), agent_urls);
  json& agents = outcome.report["prompt_tokens_computed"]["agents"];
  for (size_t i = 0; i < agents.size() && i < names.size(); ++i) agents[i]["name"] = names[i];
  return outcome;
}  // the cluster stops here, before the next one starts

}  // namespace

void validatePolicies(const std::vector<std::string>& policies) {
  if (policies.empty()) throw Error("--policies needs at least one routing policy");
  std::set<std::string> seen;
  for (const std::string& policy : policies) {
    const StatusOr<router::Policy> parsed = router::parsePolicy(policy);
    if (!parsed.isOk()) {
      throw Error("--policies (comma-separated): " + parsed.status().message());
    }
    if (!seen.insert(policy).second) throw Error("--policies names " + policy + " twice");
  }
}

int runPolicyComparison(const MultiTurnBenchOptions& options) {
  const fs::path work_dir =
      options.work_dir.empty()
          ? fs::temp_directory_path() / ("tandem-bench-multiturn-" + std::to_string(::getpid()))
          : fs::path(options.work_dir);
  const std::vector<std::string>& policies = options.policies;
  const size_t rounds = static_cast<size_t>(options.rounds);
  // reports[round][i]: policies[i]'s report in that round.
  std::vector<std::vector<json>> reports(rounds, std::vector<json>(policies.size()));
  json rounds_json = json::array();
  int exit_code = 0;
  for (size_t round = 0; round < rounds; ++round) {
    const std::vector<std::string> order = roundOrder(policies, round);
    if (rounds > 1) {
      std::string text;
      for (const std::string& policy : order) text += (text.empty() ? "" : ", ") + policy;
      std::printf("== round %zu of %zu: %s\n", round + 1, rounds, text.c_str());
      std::fflush(stdout);
    }
    for (size_t position = 0; position < order.size(); ++position) {
      const std::string& policy = order[position];
      const fs::path run_dir = rounds == 1
                                   ? work_dir / policy
                                   : work_dir / ("round-" + std::to_string(round + 1)) / policy;
      MultiTurnOutcome outcome = runOne(options, policy, run_dir, round);
      outcome.report["policy"] = policy;
      outcome.report["round"] = round + 1;
      outcome.report["position"] = position + 1;
      const size_t index = static_cast<size_t>(std::find(policies.begin(), policies.end(), policy) -
                                               policies.begin());
      reports[round][index] = std::move(outcome.report);
      exit_code = std::max(exit_code, outcome.exit_code);
    }
    rounds_json.push_back({{"round", round + 1}, {"order", order}, {"policies", reports[round]}});
  }

  // One value per round of a policy's figure (nullopt where a run lacked it).
  auto valuesOf = [&](size_t policy, const std::vector<std::string>& path) {
    std::vector<std::optional<double>> values;
    for (size_t round = 0; round < rounds; ++round) {
      values.push_back(figure(reports[round][policy], path));
    }
    return values;
  };
  auto spreadOfValues = [](const std::vector<std::optional<double>>& values) {
    std::vector<double> present;
    for (const auto& value : values) {
      if (value) present.push_back(*value);
    }
    return spreadOf(std::move(present));
  };

  const bool several = rounds > 1;
  const int width = several ? 26 : 14;
  std::printf("\n%-24s", several ? "median (min-max)" : "figure");
  for (const std::string& policy : policies) std::printf(" %*s", width, policy.c_str());
  const bool two = policies.size() == 2;
  std::string ratio_name;
  if (two) ratio_name = policies[0] + "/" + policies[1];
  if (two) std::printf(" %22s", ratio_name.c_str());
  std::printf("\n");
  json figures_json = json::object();
  json ratios = json::object();
  for (const Column& column : columns()) {
    std::printf("%-24s", column.name);
    std::vector<std::optional<Spread>> spreads;
    json per_policy = json::object();
    for (size_t p = 0; p < policies.size(); ++p) {
      const std::vector<std::optional<double>> values = valuesOf(p, column.path);
      spreads.push_back(spreadOfValues(values));
      std::printf(" %*s", width, spreadCell(spreads.back(), column.format).c_str());
      json entry = spreadJson(spreads.back());
      json values_json = json::array();
      for (const auto& value : values) values_json.push_back(value ? json(*value) : json(nullptr));
      if (entry.is_null()) entry = json::object();
      entry["values"] = std::move(values_json);
      per_policy[policies[p]] = std::move(entry);
    }
    figures_json[keyOf(column.path)] = std::move(per_policy);
    if (two) {
      std::optional<double> ratio;
      if (spreads[0] && spreads[1] && spreads[1]->median != 0.0) {
        ratio = spreads[0]->median / spreads[1]->median;
      }
      std::printf(" %22s", cell(ratio, "%.3f").c_str());
      ratios[keyOf(column.path)] = ratio ? json(*ratio) : json(nullptr);
    }
    std::printf("\n");
  }

  // kv against the best of the others: on the medians, and round by round.
  json versus_json = nullptr;
  const bool has_reference = policies.size() >= 2 && std::find(policies.begin(), policies.end(),
                                                               kReferencePolicy) != policies.end();
  if (has_reference) {
    versus_json = json::object();
    std::printf("\n%s / best other policy%s\n", kReferencePolicy,
                several ? " (medians over rounds; per round: min-max)" : "");
    for (const Versus& versus : versusFigures()) {
      std::map<std::string, double> medians;
      for (size_t p = 0; p < policies.size(); ++p) {
        const std::optional<Spread> spread = spreadOfValues(valuesOf(p, versus.path));
        if (spread) medians[policies[p]] = spread->median;
      }
      const std::optional<VersusBest> overall =
          versusBestOther(medians, kReferencePolicy, versus.lower_is_better);
      json per_round = json::array();
      std::vector<double> round_ratios;
      for (size_t round = 0; round < rounds; ++round) {
        std::map<std::string, double> values;
        for (size_t p = 0; p < policies.size(); ++p) {
          if (const auto value = figure(reports[round][p], versus.path)) {
            values[policies[p]] = *value;
          }
        }
        const std::optional<VersusBest> in_round =
            versusBestOther(values, kReferencePolicy, versus.lower_is_better);
        if (in_round) round_ratios.push_back(in_round->ratio);
        per_round.push_back(
            in_round ? json{{"best_other", in_round->best_other}, {"ratio", in_round->ratio}}
                     : json(nullptr));
      }
      const std::optional<Spread> round_spread = spreadOf(round_ratios);
      std::string text = overall
                             ? cell(overall->ratio, "%.3f") + " (vs " + overall->best_other + ")"
                             : std::string("n/a");
      if (several && round_spread) {
        text += "; per round " + cell(round_spread->min, "%.3f") + "-" +
                cell(round_spread->max, "%.3f");
      }
      std::printf("  %-22s %s\n", versus.name, text.c_str());
      versus_json[keyOf(versus.path)] = {
          {"best_other", overall ? json(overall->best_other) : json(nullptr)},
          {"ratio", overall ? json(overall->ratio) : json(nullptr)},
          {"per_round", std::move(per_round)},
          {"per_round_spread", spreadJson(round_spread)}};
    }
  }
  std::fflush(stdout);

  if (!options.json_path.empty()) {
    json out = {
        {"cluster_file", options.cluster_file},
        {"policy_names", policies},
        {"num_rounds", rounds},
        {"rounds", std::move(rounds_json)},
        {"summary", {{"figures", std::move(figures_json)}, {"kv_vs_best_other", versus_json}}}};
    if (two) {
      out["ratios"] = {
          {"numerator", policies[0]}, {"denominator", policies[1]}, {"figures", std::move(ratios)}};
    }
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return exit_code;
}

}  // namespace tandem::bench
