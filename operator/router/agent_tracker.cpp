#include "operator/router/agent_tracker.h"

#include <algorithm>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "common/json_parse.h"
#include "common/logging.h"
#include "common/prometheus_text.h"
#include "operator/router/upstream_call.h"

namespace tandem::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A request count from an agent's /metrics. Absent, not a number or
// negative reads as 0; a huge one (+Inf included) is capped at 10^12, so that
// the count converts to an integer and sums of counts cannot overflow.
int64_t polledCount(std::string_view metrics, std::string_view name) {
  const double value = prometheusSample(metrics, name).value_or(0);
  if (!(value > 0)) return 0;
  return static_cast<int64_t>(std::min(value, 1e12));
}

// A ratio from an agent's /metrics, read into [0, 1]; not a number reads as 0.
double polledRatio(std::string_view metrics, std::string_view name) {
  const double value = prometheusSample(metrics, name).value_or(0);
  if (!(value > 0)) return 0;
  return std::min(value, 1.0);
}

}  // namespace

void AgentTracker::setAgents(std::vector<AgentEndpoint> prefill,
                             std::vector<AgentEndpoint> decode) {
  std::vector<AgentPtr> added;
  int64_t num_prefill = 0, num_decode = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string, AgentPtr> next;
    auto keep = [&](const AgentEndpoint& endpoint, bool is_prefill) {
      auto it = agents_.find(endpoint.name);
      if (it != agents_.end() && it->second->endpoint == endpoint &&
          it->second->prefill == is_prefill) {
        next[endpoint.name] = it->second;
        return;
      }
      auto agent = std::make_shared<AgentState>();
      agent->endpoint = endpoint;
      agent->prefill = is_prefill;
      next[endpoint.name] = agent;
      added.push_back(agent);
    };
    for (const auto& endpoint : prefill) keep(endpoint, true);
    for (const auto& endpoint : decode) keep(endpoint, false);
    for (auto& [name, agent] : agents_) {
      auto it = next.find(name);
      if (it == next.end() || it->second != agent) {
        // A changed address or role is a new agent (a restarted pod): the
        // blocks the old one held are not the new one's.
        agent->listed = false;
        index_.remove(name);
        if (it == next.end()) metrics_.removeAgent(name);
      }
    }
    agents_ = std::move(next);
    for (const auto& [name, agent] : agents_) ++(agent->prefill ? num_prefill : num_decode);
    metrics_.setAgentCount("prefill", num_prefill);
    metrics_.setAgentCount("decode", num_decode);
    // Every listed agent has its series from the start (unhealthy until its
    // first successful poll).
    for (const AgentPtr& agent : added) {
      metrics_.setAgentHealthy(agent->endpoint.name, false);
      metrics_.setIndexBlocks(agent->endpoint.name, 0);
    }
  }
  if (!started_) return;  // startWatching() spawns the watchers
  for (const AgentPtr& agent : added) watch(agent);
}

void AgentTracker::startWatching() {
  started_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [name, agent] : agents_) watch(agent);
}

std::vector<AgentPtr> AgentTracker::agentsOf(bool prefill) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<AgentPtr> out;
  for (const auto& [name, agent] : agents_) {
    if (agent->prefill == prefill) out.push_back(agent);
  }
  return out;
}

int64_t AgentTracker::smallestDecodeCache() {
  int64_t smallest = 0;
  for (const AgentPtr& agent : agentsOf(false)) {
    const int64_t tokens = agent->kv_cache_tokens;
    if (!agent->healthy || tokens <= 0) continue;
    smallest = smallest == 0 ? tokens : std::min(smallest, tokens);
  }
  return smallest;
}

std::vector<std::string> AgentTracker::adapterNames() {
  std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, agent] : agents_) {
    if (agent->prefill) continue;  // a request needs a decode agent serving it
    std::lock_guard<std::mutex> adapters_lock(agent->adapters_mutex);
    for (const AdapterInfo& adapter : agent->adapters) names.insert(adapter.name);
  }
  return {names.begin(), names.end()};
}

std::optional<std::string> AgentTracker::adapterIdentity(const std::string& adapter) {
  std::map<std::string, int> votes;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, agent] : agents_) {
    if (agent->prefill || !agent->healthy) continue;
    std::lock_guard<std::mutex> adapters_lock(agent->adapters_mutex);
    for (const AdapterInfo& info : agent->adapters) {
      if (info.name == adapter) ++votes[info.identity];
    }
  }
  std::optional<std::string> best;
  int most = 0;
  for (const auto& [identity, count] : votes) {
    if (count > most) {
      most = count;
      best = identity;
    }
  }
  return best;
}

bool AgentTracker::anyHealthy(bool prefill) {
  for (const AgentPtr& agent : agentsOf(prefill)) {
    if (agent->healthy) return true;
  }
  return false;
}

void AgentTracker::watch(const AgentPtr& agent) {
  asio::co_spawn(ioc_, pollLoop(agent), asio::detached);
  asio::co_spawn(ioc_, eventLoop(agent), asio::detached);
}

// An agent's series change only while it is listed: setAgents unlists
// agents and removes their series under the same lock, so a loop of an
// agent just removed or replaced never brings them back.
void AgentTracker::publishLedger(const std::function<LedgerCounts(const AgentState&)>& counts) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, agent] : agents_) {
    const LedgerCounts c = counts(*agent);
    metrics_.setAgentLedger(name, c.requests, c.prefill_tokens, c.kv_tokens);
  }
}

void AgentTracker::setHealthyIfListed(const AgentState& agent, bool healthy) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (agent.listed) metrics_.setAgentHealthy(agent.endpoint.name, healthy);
}
void AgentTracker::setRequestsIfListed(const AgentState& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (agent.listed) metrics_.setAgentRequests(agent.endpoint.name, agent.running + agent.waiting);
}
void AgentTracker::setIndexBlocksIfListed(const AgentState& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (agent.listed) {
    metrics_.setIndexBlocks(agent.endpoint.name, index_.numBlocks(agent.endpoint.name));
  }
}

// An agent's polls go on until it is unlisted, whatever one of them meets: a
// poll that throws counts as unhealthy, is logged, and the next one follows.
awaitable<void> AgentTracker::pollLoop(AgentPtr agent) {
  while (!stopping_ && agent->listed) {
    bool healthy = false;
    std::string failure;
    try {
      healthy = co_await pollOnce(*agent);
    } catch (const std::exception& error) {
      failure = error.what();
    }
    if (!failure.empty()) {
      TANDEM_LOG(kWarn) << "router: polling agent " << agent->endpoint.name
                        << " failed: " << failure;
    }
    if (agent->healthy.exchange(healthy) != healthy) {
      TANDEM_LOG(kInfo) << "router: agent " << agent->endpoint.name << " is "
                        << (healthy ? "healthy" : "unhealthy");
    }
    setHealthyIfListed(*agent, healthy);
    co_await sleepFor(poll_interval_s_);
  }
  setHealthyIfListed(*agent, false);
}

awaitable<bool> AgentTracker::pollOnce(AgentState& agent) {
  UpstreamResult health = co_await callAgent(agent.endpoint, http::verb::get,
                                             std::string("/health"), std::string(), 5.0);
  if (health.status != 200) co_return false;
  {
    const json answer = parseJsonOrDiscarded(health.body);
    const auto id = answer.is_object() ? answer.find("instance_id") : answer.end();
    std::lock_guard<std::mutex> lock(agent.adapters_mutex);
    agent.instance_id = id != answer.end() && id->is_string() ? id->get<std::string>() : "";
  }
  const int64_t mine_before = ledger_requests_ ? ledger_requests_(agent) : 0;
  UpstreamResult metrics = co_await callAgent(agent.endpoint, http::verb::get,
                                              std::string("/metrics"), std::string(), 5.0);
  if (metrics.status == 200) {
    agent.running = polledCount(metrics.body, "tandem_num_requests_running");
    agent.waiting = polledCount(metrics.body, "tandem_num_requests_waiting");
    // The router's own requests that ended or began while the poll was
    // under way are not external load either way.
    const int64_t mine = std::max(mine_before, ledger_requests_ ? ledger_requests_(agent) : 0);
    agent.external_requests = std::max<int64_t>(0, agent.running + agent.waiting - mine);
    agent.kv_usage = polledRatio(metrics.body, "tandem_kv_cache_usage_ratio");
    setRequestsIfListed(agent);
  }
  if (!model_.ready()) co_await model_.learnFrom(agent.endpoint);
  // Its adapters: when it turns healthy (a new agent, or one restarted,
  // perhaps with others) and now and then. A read that fails is tried
  // again at the next poll; what was known stays until one succeeds.
  if (!agent.healthy || ++agent.polls_since_models >= kAdapterRefreshPolls) {
    UpstreamResult models = co_await callAgent(agent.endpoint, http::verb::get,
                                               std::string("/v1/models"), std::string(), 5.0);
    if (models.status != 200) co_return true;
    std::vector<AdapterInfo> adapters;
    std::string identity;
    try {
      const json answer = parseJsonOrDiscarded(models.body);
      adapters = adaptersOf(answer);
      identity = modelIdentityOf(answer);
      agent.kv_cache_tokens = agentCountOf(answer, "kv_cache_tokens");
      agent.max_waiting_requests = agentCountOf(answer, "max_waiting_requests");
      agent.max_num_seqs = agentCountOf(answer, "max_num_seqs");
    } catch (const std::exception& error) {
      TANDEM_LOG(kWarn) << "router: the /v1/models answer of " << agent.endpoint.name
                        << " is not an agent's: " << error.what();
      co_return true;
    }
    agent.polls_since_models = 0;
    std::lock_guard<std::mutex> lock(agent.adapters_mutex);
    if (adapters != agent.adapters) {
      TANDEM_LOG(kInfo) << "router: agent " << agent.endpoint.name << " serves " << adapters.size()
                        << " LoRA adapters";
    }
    agent.adapters = std::move(adapters);
    if (identity != agent.model_identity) {
      TANDEM_LOG(kInfo) << "router: agent " << agent.endpoint.name << " serves model "
                        << (identity.empty() ? std::string("(identity not given)") : identity);
    }
    agent.model_identity = std::move(identity);
  }
  // A rollout moved the decode agents to another model: the router learns
  // it from this agent, so that prompts are checked and hashed as the
  // agents now do (their blocks are indexed under the new identity).
  if (!agent.prefill && model_.ready()) {
    const std::string identity = agent.modelIdentity();
    if (!identity.empty() && model_.wouldReplaceWith(identity) &&
        moreDecodeAgentsServe(agent, identity, model_.identity())) {
      co_await model_.learnFrom(agent.endpoint, /*replace=*/true);
    }
  }
  co_return true;
}

bool AgentTracker::moreDecodeAgentsServe(const AgentState& polled, const std::string& identity,
                                         const std::string& than) {
  int64_t serving = 0;
  int64_t serving_than = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, agent] : agents_) {
    // The polled agent counts as healthy: its poll just succeeded.
    if (agent->prefill || !agent->listed || (!agent->healthy && agent.get() != &polled)) continue;
    const std::string served = agent->modelIdentity();
    serving += served == identity;
    serving_than += served == than;
  }
  return serving > serving_than;
}

// Follows the agent's /v1/kv_events stream into the ownership index;
// reconnects from scratch after a drop or a gap.
awaitable<void> AgentTracker::eventLoop(AgentPtr agent) {
  const std::string& name = agent->endpoint.name;
  while (!stopping_ && agent->listed) {
    try {
      beast::tcp_stream stream(co_await asio::this_coro::executor);
      tcp::resolver resolver(co_await asio::this_coro::executor);
      stream.expires_after(std::chrono::seconds(5));
      auto results = co_await resolver.async_resolve(
          agent->endpoint.host, std::to_string(agent->endpoint.port), use_awaitable);
      co_await stream.async_connect(results, use_awaitable);
      http::request<http::empty_body> request{http::verb::get, "/v1/kv_events?since=0", 11};
      setAgentHeaders(request, agent->endpoint);
      co_await http::async_write(stream, request, use_awaitable);
      beast::flat_buffer buffer;
      http::response_parser<http::buffer_body> parser;
      parser.body_limit(kNoBodyLimit);
      co_await http::async_read_header(stream, buffer, parser, use_awaitable);
      if (parser.get().result() != http::status::ok) throw std::runtime_error("status");
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!agent->listed) break;
        index_.connected(name);
      }
      std::string pending;
      char chunk[16384];
      bool gap = false;
      while (!stopping_ && agent->listed && !gap && !parser.is_done()) {
        // Keep-alive comments arrive every 10 s; silence beyond 30 s is a drop.
        stream.expires_after(std::chrono::seconds(30));
        parser.get().body().data = chunk;
        parser.get().body().size = sizeof chunk;
        boost::system::error_code ec;
        co_await http::async_read_some(stream, buffer, parser,
                                       asio::redirect_error(use_awaitable, ec));
        if (ec && ec != http::error::need_buffer) break;
        pending.append(chunk, sizeof chunk - parser.get().body().size);
        size_t end;
        while (!gap && (end = pending.find("\n\n")) != std::string::npos) {
          std::string event = pending.substr(0, end);
          pending.erase(0, end + 2);
          if (!event.starts_with("data: ")) continue;  // comments
          json parsed = parseJsonOrDiscarded(event.substr(6));
          // Once replaced under the same name (a restart), the index entry
          // belongs to the new agent: this stream's events stay out.
          std::lock_guard<std::mutex> lock(mutex_);
          if (!agent->listed) break;
          if (!index_.apply(name, parsed)) gap = true;
        }
        setIndexBlocksIfListed(*agent);
      }
    } catch (const std::exception&) {
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!agent->listed) break;  // replaced or removed: the index is not ours
      index_.untrust(name);
      metrics_.setIndexBlocks(name, 0);
    }
    if (!stopping_ && agent->listed) co_await sleepFor(0.5);
  }
}

}  // namespace tandem::router
