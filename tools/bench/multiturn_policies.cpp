#include "tools/bench/multiturn_policies.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/bench/local_cluster.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::chrono::seconds kStartupTimeout{300};

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
      {"req/s", {"request_throughput"}, "%.2f"},
  };
  return kColumns;
}

std::string cell(const std::optional<double>& value, const char* format) {
  if (!value) return "n/a";
  char text[48];
  std::snprintf(text, sizeof(text), format, *value);
  return text;
}

// "ttft.png" → "ttft-kv.png".
std::string perPolicyPath(const std::string& path, const std::string& policy) {
  if (path.empty()) return path;
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + policy + p.extension().string())).string();
}

}  // namespace

void validatePolicies(const std::vector<std::string>& policies) {
  if (policies.empty()) throw Error("--policies needs at least one of kv, round_robin, random");
  std::set<std::string> seen;
  for (const std::string& policy : policies) {
    if (policy != "kv" && policy != "round_robin" && policy != "random") {
      throw Error("--policies takes kv, round_robin or random (comma-separated), got \"" + policy +
                  "\"");
    }
    if (!seen.insert(policy).second) throw Error("--policies names " + policy + " twice");
  }
}

int runPolicyComparison(const MultiTurnBenchOptions& options) {
  const fs::path work_dir =
      options.work_dir.empty()
          ? fs::temp_directory_path() / ("tandem-bench-multiturn-" + std::to_string(::getpid()))
          : fs::path(options.work_dir);
  json reports = json::array();
  int exit_code = 0;
  for (const std::string& policy : options.policies) {
    LocalClusterOptions cluster_options;
    cluster_options.cluster_file = options.cluster_file;
    cluster_options.operator_bin = options.operator_bin;
    cluster_options.operator_args = {"--policy", policy};
    cluster_options.work_dir = work_dir / policy;
    std::printf("== policy %s: starting tandem-operator local -f %s (logs in %s)\n", policy.c_str(),
                options.cluster_file.c_str(), cluster_options.work_dir.c_str());
    std::fflush(stdout);
    MultiTurnOutcome outcome;
    {
      LocalCluster cluster(cluster_options, kStartupTimeout);
      std::vector<std::string> agent_urls;
      for (const ClusterAgent& agent : cluster.agents()) agent_urls.push_back(agent.url());
      MultiTurnBenchOptions run_options = options;
      run_options.plot_path = perPolicyPath(options.plot_path, policy);
      outcome = runMultiTurnOnce(run_options, cluster.routerUrl(), agent_urls);
      std::vector<std::string> names;
      for (const ClusterAgent& agent : cluster.agents()) names.push_back(agent.name);
      json& agents = outcome.report["prompt_tokens_computed"]["agents"];
      for (size_t i = 0; i < agents.size() && i < names.size(); ++i) agents[i]["name"] = names[i];
    }  // the cluster stops here, before the next one starts
    outcome.report["policy"] = policy;
    reports.push_back(std::move(outcome.report));
    exit_code = std::max(exit_code, outcome.exit_code);
  }

  std::printf("\n%-24s", "figure");
  for (const std::string& policy : options.policies) std::printf(" %14s", policy.c_str());
  const bool two = options.policies.size() == 2;
  std::string ratio_name;
  if (two) ratio_name = options.policies[0] + "/" + options.policies[1];
  if (two) std::printf(" %22s", ratio_name.c_str());
  std::printf("\n");
  json ratios = json::object();
  for (const Column& column : columns()) {
    std::printf("%-24s", column.name);
    std::vector<std::optional<double>> values;
    for (const json& report : reports) {
      values.push_back(figure(report, column.path));
      std::printf(" %14s", cell(values.back(), column.format).c_str());
    }
    if (two) {
      std::optional<double> ratio;
      if (values[0] && values[1] && *values[1] != 0.0) ratio = *values[0] / *values[1];
      std::printf(" %22s", cell(ratio, "%.3f").c_str());
      std::string key;
      for (const std::string& part : column.path) key += (key.empty() ? "" : ".") + part;
      ratios[key] = ratio ? json(*ratio) : json(nullptr);
    }
    std::printf("\n");
  }
  std::fflush(stdout);

  if (!options.json_path.empty()) {
    json out = {{"cluster_file", options.cluster_file}, {"policies", std::move(reports)}};
    if (two) {
      out["ratios"] = {{"numerator", options.policies[0]},
                       {"denominator", options.policies[1]},
                       {"figures", std::move(ratios)}};
    }
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return exit_code;
}

}  // namespace tandem::bench
