#include "tools/bench/move_scenario.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/kv_auth.h"
#include "tools/bench/openai_client.h"

namespace tandem::bench {
namespace {

using std::chrono::milliseconds;

// A rollout's agents drain: their streams move as a drain's do.
const char* reasonOf(const std::string& action) { return action == "kill" ? "failure" : "drain"; }

// Once every stream has `tokens` tokens, the decode agent serving the
// first; nullopt at the timeout.
std::optional<ClusterAgent> servingAgent(LocalCluster& cluster,
                                         std::vector<std::unique_ptr<StreamProgress>>& progress,
                                         int64_t tokens, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const bool started = std::all_of(progress.begin(), progress.end(),
                                     [&](const auto& stream) { return stream->tokens >= tokens; });
    if (started) {
      std::string name;
      {
        std::lock_guard<std::mutex> lock(progress.front()->mutex);
        name = progress.front()->decode_agent;
      }
      for (const ClusterAgent& agent : cluster.agents()) {
        if (agent.name == name) return agent;
      }
      return std::nullopt;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return std::nullopt;
}

}  // namespace

bool postDrain(const ClusterAgent& agent, const std::string& kv_secret) {
  httplib::Client client(agent.host, agent.port);
  // Generous: on a loaded machine an agent busy handing over answers late
  // (a drain that was refused is what this reports, not a slow answer).
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(30, 0);
  nlohmann::json body = nlohmann::json::object();
  if (!kv_secret.empty()) {
    // Signed for this agent process: its instance id, from its /health.
    auto health = client.Get("/health");
    if (!health || health->status != 200) return false;
    const nlohmann::json answer = nlohmann::json::parse(health->body, nullptr, false);
    const auto id = answer.is_object() ? answer.find("instance_id") : answer.end();
    if (id == answer.end() || !id->is_string()) return false;
    kv_auth::signRequest(body, id->get<std::string>(), "/admin/drain", kv_secret);
  }
  auto result = client.Post("/admin/drain", body.dump(), "application/json");
  return result && result->status == 202;
}

MoveResult runMoveRounds(LocalCluster& cluster, const std::string& url, const std::string& model,
                         const MoveOptions& options) {
  MoveResult result;
  std::mt19937_64 rng(options.seed);
  for (int r = 0; r < options.rounds; ++r) {
    MoveRound round;
    round.action = options.actions[static_cast<size_t>(r) % options.actions.size()];
    cluster.waitForRouterToSeeAllAgents(
        milliseconds(static_cast<int64_t>(options.restart_timeout_s * 1000)));
    const RouterState before = cluster.routerState();
    std::vector<AnsweredRequest> requests(static_cast<size_t>(options.streams));
    std::vector<StreamedCompletion> streams(requests.size());
    std::vector<std::unique_ptr<StreamProgress>> progress;
    for (size_t i = 0; i < requests.size(); ++i)
      progress.push_back(std::make_unique<StreamProgress>());
    std::vector<std::thread> clients;
    const Clock::time_point start = Clock::now();
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].prompt.resize(static_cast<size_t>(options.prompt_tokens));
      for (int32_t& id : requests[i].prompt) {
        id = options.vocab.first +
             static_cast<int32_t>(
                 rng() % static_cast<uint64_t>(options.vocab.second - options.vocab.first));
      }
      requests[i].max_tokens = options.output_tokens;
      clients.emplace_back([&, i] {
        streams[i] = streamCompletion(
            url, greedyBody(model, requests[i].prompt, requests[i].max_tokens, true),
            options.hang_timeout_s, start, progress[i].get());
      });
    }
    // A few tokens into every answer: the first stream's decode agent goes.
    const std::optional<ClusterAgent> victim =
        servingAgent(cluster, progress, 8, milliseconds(60000));
    // A rollout replaces every decode agent: those running now.
    std::vector<ClusterAgent> rolled;
    if (victim && round.action == "rollout") {
      for (const ClusterAgent& agent : cluster.agents()) {
        if (agent.role == "decode") rolled.push_back(agent);
      }
      round.agent = cluster.rollDecodePool("round " + std::to_string(r));
    } else if (victim) {
      round.agent = victim->name;
      if (round.action == "drain") {
        postDrain(*victim, cluster.kvSecret());
      } else {
        ::kill(victim->pid, SIGKILL);
      }
    }
    for (std::thread& client : clients) client.join();
    std::vector<double> gaps;
    for (size_t i = 0; i < streams.size(); ++i) {
      const StreamedCompletion& stream = streams[i];
      for (double gap : stream.itl_s) {
        gaps.push_back(gap);
        round.client_max_gap_ms = std::max(round.client_max_gap_ms, 1000 * gap);
      }
      if (stream.success &&
          static_cast<int64_t>(stream.token_ids.size()) == requests[i].max_tokens) {
        ++round.complete;
        requests[i].token_ids = stream.token_ids;
        result.answered.push_back(requests[i]);
      }
    }
    if (!gaps.empty()) {
      std::nth_element(gaps.begin(), gaps.begin() + static_cast<ptrdiff_t>(gaps.size() / 2),
                       gaps.end());
      round.median_gap_ms = 1000 * gaps[gaps.size() / 2];
    }
    const RouterState after = cluster.routerState();
    const std::string reason = reasonOf(round.action);
    const RouterState::Mean none;
    const auto was =
        before.migration_pause.count(reason) ? before.migration_pause.at(reason) : none;
    const auto now = after.migration_pause.count(reason) ? after.migration_pause.at(reason) : none;
    round.moved = now.count - was.count;
    if (round.moved > 0) round.router_pause_ms = 1000 * (now.sum_s - was.sum_s) / round.moved;
    // Back means back in the router's rotation: the next round's streams
    // must have the other decode agent to move to.
    if (victim) {
      const milliseconds restart_timeout(static_cast<int64_t>(options.restart_timeout_s * 1000));
      if (round.action != "rollout") rolled = {*victim};
      round.restarted = std::all_of(rolled.begin(), rolled.end(), [&](const ClusterAgent& agent) {
        return cluster.waitForRestart(agent.name, agent.pid, restart_timeout).has_value();
      });
      round.restarted = round.restarted && cluster.waitForRouterToSeeAllAgents(restart_timeout);
    }
    result.rounds.push_back(round);
  }
  return result;
}

}  // namespace tandem::bench
