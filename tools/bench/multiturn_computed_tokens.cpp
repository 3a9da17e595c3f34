#include "tools/bench/multiturn_computed_tokens.h"

#include <chrono>
#include <string_view>
#include <thread>

#include "common/prometheus_text.h"
#include "tools/bench/openai_client.h"

namespace tandem::bench {
namespace {

constexpr const char* kComputedMetric = "tandem_computed_tokens_total";
constexpr const char* kGeneratedMetric = "tandem_generation_tokens_total";
constexpr const char* kFinishedMetric = "tandem_e2e_request_latency_seconds_count";

// The role label of the finished-request series; empty when it has none.
std::string roleLabel(std::string_view text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind(kFinishedMetric, 0) != 0) continue;
    const std::optional<PrometheusSampleLine> sample = parsePrometheusSampleLine(line);
    if (sample && sample->name == kFinishedMetric) return sample->label("role").value_or("");
  }
  return "";
}

std::optional<AgentTokenCounters> readCounters(const std::string& url, double timeout_s) {
  const std::optional<std::string> text = fetchText(url, "/metrics", timeout_s);
  if (!text) return std::nullopt;
  const auto computed = prometheusSample(*text, kComputedMetric);
  const auto generated = prometheusSample(*text, kGeneratedMetric);
  const auto finished = prometheusSample(*text, kFinishedMetric);
  if (!computed || !generated || !finished) return std::nullopt;
  return AgentTokenCounters{*computed, *generated, *finished, roleLabel(*text)};
}

bool sameCounters(const std::vector<AgentSnapshot>& a, const std::vector<AgentSnapshot>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& x = a[i].counters;
    const auto& y = b[i].counters;
    if (x.has_value() != y.has_value()) return false;
    if (x && (x->computed != y->computed || x->generated != y->generated ||
              x->finished != y->finished)) {
      return false;
    }
  }
  return true;
}

nlohmann::json countersJson(const std::optional<AgentTokenCounters>& counters) {
  if (!counters) return nullptr;
  return {{"computed_tokens", counters->computed},
          {"generation_tokens", counters->generated},
          {"finished_requests", counters->finished}};
}

}  // namespace

std::vector<AgentSnapshot> snapshotAgents(const std::vector<std::string>& urls, double timeout_s) {
  std::vector<AgentSnapshot> snapshot;
  for (const std::string& url : urls) snapshot.push_back({url, readCounters(url, timeout_s)});
  return snapshot;
}

std::vector<AgentSnapshot> settledSnapshot(const std::vector<std::string>& urls, double timeout_s,
                                           double settle_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(settle_s);
  std::vector<AgentSnapshot> last = snapshotAgents(urls, timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<AgentSnapshot> next = snapshotAgents(urls, timeout_s);
    const bool same = sameCounters(last, next);
    last = std::move(next);
    if (same) break;
  }
  return last;
}

ComputedPromptTokens computedPromptTokens(const std::vector<AgentSnapshot>& before,
                                          const std::vector<AgentSnapshot>& after) {
  ComputedPromptTokens result;
  result.complete = !before.empty() && before.size() == after.size();
  for (size_t i = 0; i < before.size(); ++i) {
    ComputedPromptTokens::Agent agent;
    agent.url = before[i].url;
    agent.before = before[i].counters;
    if (i < after.size()) agent.after = after[i].counters;
    if (agent.after) agent.role = agent.after->role;
    if (agent.before && agent.after) {
      agent.finished_requests = agent.after->finished - agent.before->finished;
      const double decode_steps = (agent.after->generated - agent.before->generated) -
                                  (agent.after->finished - agent.before->finished);
      agent.prompt_tokens = (agent.after->computed - agent.before->computed) - decode_steps;
      result.total += *agent.prompt_tokens;
    } else {
      result.complete = false;
    }
    result.agents.push_back(std::move(agent));
  }
  return result;
}

nlohmann::json ComputedPromptTokens::toJson() const {
  nlohmann::json list = nlohmann::json::array();
  for (const Agent& agent : agents) {
    list.push_back({{"url", agent.url},
                    {"role", agent.role},
                    {"finished_requests",
                     agent.finished_requests ? nlohmann::json(*agent.finished_requests) : nullptr},
                    {"before", countersJson(agent.before)},
                    {"after", countersJson(agent.after)},
                    {"prompt_tokens_computed",
                     agent.prompt_tokens ? nlohmann::json(*agent.prompt_tokens) : nullptr}});
  }
  return list;
}

}  // namespace tandem::bench
