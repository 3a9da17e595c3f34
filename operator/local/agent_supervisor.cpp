#include "operator/local/agent_supervisor.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "operator/spec/agent_command.h"

namespace tandem::local {

using spec::AgentAddress;
using spec::agentArguments;
using spec::PoolKind;
using spec::PoolSpec;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Lines longer than this are forwarded in pieces.
constexpr size_t kMaxLine = 64 * 1024;
constexpr milliseconds kHealthInterval{200};

void writeStdout(const std::string& line) {
  std::string text = line + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// /health's status, 0 when it gives no answer within a second; `body` is
// set to its body when given.
int healthStatus(const std::string& host, int port, std::string* body = nullptr) {
  httplib::Client client(host, port);
  client.set_connection_timeout(0, 200000);
  client.set_read_timeout(1, 0);
  auto response = client.Get("/health");
  if (response && body != nullptr) *body = response->body;
  return response ? response->status : 0;
}

std::string exitText(int status) {
  if (status > 128) {
    return "was killed by signal " + std::to_string(status - 128) + " (" +
           (strsignal(status - 128) != nullptr ? strsignal(status - 128) : "?") + ")";
  }
  return "exited with status " + std::to_string(status);
}

std::string secondsText(milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(duration.count()) / 1000);
  return text;
}

std::string commandText(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& arg : argv) {
    if (!text.empty()) text += ' ';
    const bool quote = arg.empty() || arg.find_first_of(" \"'{}$\\") != std::string::npos;
    text += quote ? "'" + arg + "'" : arg;
  }
  return text;
}

}  // namespace

struct AgentSupervisor::Agent {
  std::string name;
  std::string pool;
  PoolKind kind = PoolKind::kDecode;
  size_t pool_position = 0;  // order of the pool in the file
  int64_t index = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  // Between SIGTERM and SIGKILL when stopped on purpose (its spec's
  // shutdown timeout plus time to exit), as started.
  std::chrono::seconds stop_grace{0};

  std::unique_ptr<Subprocess> process;
  std::string partial_line;
  AgentState state = AgentState::kStarting;
  int port = 0;
  Clock::time_point started_at;
  Clock::time_point ready_at;
  Clock::time_point restart_at;
  Clock::time_point kill_at;
  std::chrono::milliseconds grace_given{0};  // SIGTERM to kill_at
  Clock::time_point next_health_check;
  int failed_probes = 0;     // liveness probes failed in a row
  bool killed = false;       // SIGKILL sent to the current process
  bool timed_out = false;    // killed for not getting ready in time
  bool removed = false;      // no longer wanted: stop, then forget
  bool start_again = false;  // restarted with its pool's new spec once it exited
  // Replaced by a rollout: drains while its replacement, a new agent of
  // the same name, starts (a Deployment's terminating pod counts against
  // neither maxSurge nor maxUnavailable); forgotten once it exited.
  bool retiring = false;
  bool surge = false;  // a rollout's extra agent, beyond the pool's replicas
  int failures = 0;    // consecutive crashes, for the backoff
  int restarts = 0;
};

// A pool as apply() last gave it: what its agents are started with.
struct AgentSupervisor::Pool {
  std::string name;
  PoolKind kind = PoolKind::kDecode;
  size_t position = 0;  // in the file
  int64_t replicas = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::chrono::seconds stop_grace{0};  // spec::agentStopGraceSeconds
  spec::RolloutBounds bounds;
  bool rolling = false;  // some agent ran another spec; not every one is available yet
  // Whether `agent` runs (or will run) this spec.
  bool runs(const Agent& agent) const { return agent.argv == argv && agent.env == env; }
};

const char* agentStateName(AgentState state) {
  switch (state) {
    case AgentState::kStarting:
      return "starting";
    case AgentState::kReady:
      return "ready";
    case AgentState::kBackoff:
      return "backoff";
    case AgentState::kStopping:
      return "stopping";
  }
  return "?";
}

AgentSupervisor::AgentSupervisor(SupervisorOptions options) : options_(std::move(options)) {
  if (!options_.output) options_.output = writeStdout;
}

AgentSupervisor::~AgentSupervisor() = default;  // each Subprocess kills and reaps its child

const AgentSupervisor::Pool* AgentSupervisor::findPool(const std::string& name) const {
  auto it = std::find_if(pools_.begin(), pools_.end(),
                         [&](const Pool& pool) { return pool.name == name; });
  return it == pools_.end() ? nullptr : &*it;
}

void AgentSupervisor::apply(const std::vector<PoolSpec>& pools) {
  std::vector<Pool> next;
  for (size_t p = 0; p < pools.size(); ++p) {
    const PoolSpec& spec = pools[p];
    Pool pool;
    pool.name = spec.name;
    pool.kind = spec.kind;
    pool.position = p;
    pool.replicas = spec.replicas;
    pool.argv = agentArguments(spec, options_.agent_binary, options_.host, /*port=*/0);
    pool.env = spec::agentEnvironment(spec);
    pool.stop_grace = std::chrono::seconds(spec::agentStopGraceSeconds(spec));
    pool.bounds = spec::resolveRollout(spec.rollout, spec.replicas);
    if (const Pool* before = findPool(spec.name)) pool.rolling = before->rolling;
    next.push_back(std::move(pool));
  }
  pools_ = std::move(next);
  for (auto& agent : agents_) {
    if (agent->removed) continue;
    const Pool* pool = findPool(agent->pool);
    if (pool != nullptr && agent->index < pool->replicas) agent->surge = false;  // now a replica
    if (pool != nullptr && (agent->surge || agent->index < pool->replicas)) continue;
    agent->removed = true;
    TANDEM_LOG(kInfo) << "local: stopping " << agent->name
                      << " (beyond its pool's replicas, or its pool is gone)";
    sendStop(*agent);
  }
  for (const Pool& pool : pools_) {
    for (int64_t i = 0; i < pool.replicas; ++i) want(pool, i, /*surge=*/false);
  }
  sortAgents();
}

AgentSupervisor::Agent* AgentSupervisor::findAgent(const std::string& name) {
  auto it = std::find_if(agents_.begin(), agents_.end(), [&](const auto& agent) {
    return agent->name == name && !agent->retiring;
  });
  return it == agents_.end() ? nullptr : it->get();
}

AgentSupervisor::Agent& AgentSupervisor::want(const Pool& pool, int64_t index, bool surge) {
  const std::string name = pool.name + "-" + std::to_string(index);
  if (Agent* existing = findAgent(name)) {
    Agent& agent = *existing;
    agent.pool = pool.name;
    agent.pool_position = pool.position;  // (its kind is its process's: start() sets it)
    if (stopping_all_ || !agent.removed) return agent;
    // Scaled away (or an extra agent stopped) and wanted again before it
    // exited: run it again once it has.
    agent.removed = false;
    agent.surge = surge;
    if (agent.process) {
      agent.start_again = true;
    } else {
      start(agent);
    }
    return agent;
  }
  auto agent = std::make_unique<Agent>();
  agent->name = name;
  agent->pool = pool.name;
  agent->kind = pool.kind;
  agent->pool_position = pool.position;
  agent->index = index;
  agent->surge = surge;
  if (!stopping_all_) start(*agent);
  agents_.push_back(std::move(agent));
  return *agents_.back();
}

void AgentSupervisor::sortAgents() {
  // A retiring agent after its replacement.
  std::stable_sort(agents_.begin(), agents_.end(), [](const auto& a, const auto& b) {
    return std::tie(a->pool_position, a->index, a->retiring) <
           std::tie(b->pool_position, b->index, b->retiring);
  });
}

void AgentSupervisor::start(Agent& agent) {
  // Always with its pool's spec as it is now (a rollout's new one).
  if (const Pool* pool = findPool(agent.pool)) {
    agent.argv = pool->argv;
    agent.env = pool->env;
    agent.stop_grace = pool->stop_grace;
    agent.kind = pool->kind;
  }
  // The shell joins the agent's stderr to its stdout (one pipe, read here),
  // then replaces itself with the agent: the pid is the agent's.
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
  argv.insert(argv.end(), agent.argv.begin(), agent.argv.end());
  TANDEM_LOG(kInfo) << "local: starting " << agent.name << ": " << commandText(agent.argv);
  const auto now = Clock::now();
  agent.started_at = now;
  agent.next_health_check = now;
  agent.port = 0;
  agent.killed = false;
  agent.timed_out = false;
  agent.start_again = false;
  agent.partial_line.clear();
  agent.state = AgentState::kStarting;
  try {
    // A group of its own: Ctrl-C in the terminal (SIGINT to the foreground
    // group) reaches tandem-operator alone, which stops the agents in order
    // (docs/local-mode.md, Life cycle), instead of every agent draining at
    // once under the router.
    agent.process = std::make_unique<Subprocess>(argv, std::filesystem::path(), agent.env,
                                                 /*own_process_group=*/true);
  } catch (const Error& e) {
    // Out of processes or pipes: try again after the backoff like a crash.
    TANDEM_LOG(kError) << "local: " << agent.name << ": " << e.what();
    onExit(agent, 127);
  }
}

void AgentSupervisor::emitLine(Agent& agent, const std::string& line) {
  if (agent.state == AgentState::kStarting && agent.port == 0 &&
      line.starts_with("listening on ")) {
    const size_t colon = line.rfind(':');
    if (colon != std::string::npos) {
      try {
        agent.port = std::stoi(line.substr(colon + 1));
      } catch (const std::exception&) {
        agent.port = 0;
      }
    }
  }
  options_.output("[" + agent.name + "] " + line);
}

void AgentSupervisor::forwardOutput(Agent& agent, milliseconds wait) {
  std::string chunk = agent.process->readStdout(wait);
  if (chunk.empty()) return;
  agent.partial_line += chunk;
  size_t begin = 0;
  for (size_t newline; (newline = agent.partial_line.find('\n', begin)) != std::string::npos;
       begin = newline + 1) {
    emitLine(agent, agent.partial_line.substr(begin, newline - begin));
  }
  agent.partial_line.erase(0, begin);
  if (agent.partial_line.size() >= kMaxLine) {
    emitLine(agent, agent.partial_line);
    agent.partial_line.clear();
  }
}

void AgentSupervisor::sendStop(Agent& agent) {
  if (agent.process) {
    if (agent.state != AgentState::kStopping) {
      agent.process->signal(SIGTERM);
      // One agent stopped on purpose (a rollout, a scale-down) drains within
      // its shutdown timeout, as a Deployment's pod gets its grace period;
      // when everything stops, --stop-timeout bounds the wait.
      const std::chrono::milliseconds grace =
          stopping_all_
              ? options_.stop_timeout
              : std::max<std::chrono::milliseconds>(options_.stop_timeout, agent.stop_grace);
      agent.kill_at = Clock::now() + grace;
      agent.grace_given = grace;
    } else if (stopping_all_ && agent.kill_at > Clock::now() + options_.stop_timeout) {
      // Draining on purpose when everything stops: --stop-timeout from now.
      agent.kill_at = Clock::now() + options_.stop_timeout;
      agent.grace_given = options_.stop_timeout;
    }
  }
  agent.state = AgentState::kStopping;
}

void AgentSupervisor::onExit(Agent& agent, int status) {
  const pid_t pid = agent.process ? agent.process->pid() : 0;
  if (agent.process) {
    // Whatever it wrote before exiting.
    forwardOutput(agent, milliseconds(100));
    if (!agent.partial_line.empty()) emitLine(agent, agent.partial_line);
    agent.partial_line.clear();
    agent.process.reset();
  }
  const auto now = Clock::now();
  if (agent.state == AgentState::kStopping) {
    TANDEM_LOG(kInfo) << "local: " << agent.name << " (pid " << pid
                      << ") stopped: " << exitText(status);
    if (agent.start_again && !agent.removed && !stopping_all_) {
      if (held_pools_.count(agent.pool) == 0) {
        start(agent);
      } else {
        // Its model is being fetched again: started once it is, not
        // counted as a restart.
        agent.state = AgentState::kBackoff;
        agent.restart_at = now;
      }
    }
    return;
  }
  // A rollout's replacement that failed beside its predecessor, still
  // draining (on a host without room for both, say): started again once
  // that one has exited, not counted as a crash.
  const bool predecessor_drains =
      agent.state == AgentState::kStarting &&
      std::any_of(agents_.begin(), agents_.end(), [&](const auto& other) {
        return other->retiring && other->name == agent.name && other->process;
      });
  if (predecessor_drains) {
    agent.state = AgentState::kBackoff;
    agent.start_again = true;  // a replacement, not a crash's restart
    agent.restart_at = now + options_.initial_backoff;
    TANDEM_LOG(kWarn) << "local: " << agent.name << " (pid " << pid << ") "
                      << (agent.timed_out ? "was not ready in time and was killed"
                                          : exitText(status))
                      << " while its predecessor drains; starting it again in "
                      << secondsText(options_.initial_backoff);
    return;
  }
  if (agent.state == AgentState::kReady && status == 0 && !agent.killed) {
    // Drained from outside (a SIGTERM or POST /admin/drain sent to it) and
    // gone before a probe saw it draining: replaced at once, as one seen
    // draining is, not restarted as a crash after a backoff, nor counted.
    TANDEM_LOG(kInfo) << "local: " << agent.name << " (pid " << pid
                      << ") drained and exited, not asked to by local mode: starting its "
                      << "replacement";
    agent.state = AgentState::kBackoff;
    agent.start_again = true;
    agent.restart_at = now;
    return;
  }
  if (agent.state == AgentState::kStarting && first_start_) {
    // The cluster's first start: local mode stops on it, naming why (no
    // restart is promised in the log).
    if (!start_failure_) {
      std::string why = agent.name;
      if (agent.timed_out) {
        why.append(" was not ready within ").append(secondsText(options_.startup_timeout));
      } else {
        why.append(" ").append(exitText(status)).append(" before it was ready");
      }
      start_failure_ = std::move(why);
    }
    agent.state = AgentState::kBackoff;
    agent.restart_at = Clock::time_point::max();
    return;
  }
  if (agent.state == AgentState::kReady && now - agent.ready_at >= options_.backoff_reset) {
    agent.failures = 0;
  }
  ++agent.failures;
  milliseconds delay = options_.initial_backoff;
  for (int i = 1; i < agent.failures && delay < options_.max_backoff; ++i) delay *= 2;
  delay = std::min(delay, options_.max_backoff);
  agent.state = AgentState::kBackoff;
  agent.restart_at = now + delay;
  TANDEM_LOG(kWarn) << "local: " << agent.name << " (pid " << pid << ") "
                    << (agent.timed_out ? "was not ready in time and was killed" : exitText(status))
                    << "; starting it again in " << secondsText(delay);
}

void AgentSupervisor::poll() {
  // Each agent's output is waited for briefly: together these waits pace the
  // owner's loop.
  const milliseconds output_wait(agents_.size() > 8 ? 1 : 2);
  std::vector<Agent*> drained_from_outside;
  for (auto& agent_ptr : agents_) {
    Agent& agent = *agent_ptr;
    if (agent.process) {
      forwardOutput(agent, output_wait);
      const int status = agent.process->wait(milliseconds(0));
      if (status >= 0) onExit(agent, status);
    }
    const auto now = Clock::now();
    switch (agent.state) {
      case AgentState::kStarting:
        if (!agent.process) break;
        if (agent.port != 0 && now >= agent.next_health_check) {
          agent.next_health_check = now + kHealthInterval;
          if (healthStatus(options_.host, agent.port) == 200) {
            agent.state = AgentState::kReady;
            agent.ready_at = Clock::now();
            agent.failed_probes = 0;
            agent.next_health_check = agent.ready_at + options_.liveness_period;
            TANDEM_LOG(kInfo) << "local: " << agent.name << " ready on " << options_.host << ":"
                              << agent.port << " (pid " << agent.process->pid() << ")";
            break;
          }
        }
        if (now - agent.started_at > options_.startup_timeout && !agent.killed) {
          agent.timed_out = true;
          agent.killed = true;
          agent.process->signal(SIGKILL);
        }
        break;
      case AgentState::kBackoff:
        if (!stopping_all_ && now >= agent.restart_at && held_pools_.count(agent.pool) == 0) {
          startFromBackoff(agent);
        }
        break;
      case AgentState::kStopping:
        if (agent.process && !agent.killed && now >= agent.kill_at) {
          TANDEM_LOG(kWarn) << "local: " << agent.name << " did not stop within "
                            << secondsText(agent.grace_given) << ": SIGKILL";
          agent.killed = true;
          agent.process->signal(SIGKILL);
        }
        break;
      case AgentState::kReady:
        if (options_.liveness_failures > 0 && agent.process && !agent.killed &&
            now >= agent.next_health_check) {
          agent.next_health_check = now + options_.liveness_period;
          // Alive: 200, or the 503 of a drain (which ends by itself); a 503
          // of a failing engine, or no answer, is not.
          std::string body;
          const int status = healthStatus(options_.host, agent.port, &body);
          const bool draining = status == 503 && body.find("\"draining\"") != std::string::npos;
          const bool alive = status == 200 || draining;
          agent.failed_probes = alive ? 0 : agent.failed_probes + 1;
          if (draining && !agent.removed && !agent.retiring) {
            drained_from_outside.push_back(&agent);
            break;
          }
          if (agent.failed_probes >= options_.liveness_failures) {
            TANDEM_LOG(kWarn) << "local: " << agent.name << " (pid " << agent.process->pid()
                              << ") failed /health " << agent.failed_probes << " times in a row, "
                              << secondsText(options_.liveness_period) << " apart: SIGKILL";
            agent.killed = true;
            agent.process->signal(SIGKILL);
          }
        }
        break;
    }
  }
  // An agent drained by someone else (POST /admin/drain, a signal of its
  // own) is replaced at once, as a Deployment replaces a terminating pod:
  // it retires, unlisted, while its replacement starts, so that the streams
  // it hands over have an agent to resume on before it exits.
  // (Not while its pool's model is fetched again: started then, the
  // replacement could read half of one commit; it comes once the drained
  // agent has exited and the fetch is done, as a crashed one's does.)
  for (Agent* agent : drained_from_outside) {
    const Pool* pool = findPool(agent->pool);
    if (pool == nullptr || stopping_all_ || held_pools_.count(agent->pool) != 0) continue;
    TANDEM_LOG(kInfo) << "local: " << agent->name << " (pid " << agent->process->pid()
                      << ") is draining, not asked to by local mode: it retires while its "
                      << "replacement starts";
    retire(*agent, *pool);
  }
  if (!drained_from_outside.empty()) sortAgents();
  for (Pool& pool : pools_) rollOut(pool);
  std::erase_if(agents_, [](const auto& agent) { return agent->removed && !agent->process; });
}

void AgentSupervisor::rollOut(Pool& pool) {
  if (stopping_all_) return;
  const bool held = held_pools_.count(pool.name) != 0;
  const auto now = Clock::now();
  std::vector<Agent*> members;  // the pool's agents still wanted
  for (auto& agent : agents_) {
    if (agent->pool == pool.name && !agent->removed) members.push_back(agent.get());
  }
  auto outdated = [&](const Agent& agent) { return !pool.runs(agent); };
  auto available = [&](const Agent& agent) {
    return agent.state == AgentState::kReady && !agent.killed &&
           now - agent.ready_at >= options_.min_ready;
  };
  // An old agent that serves nobody is replaced at once.
  for (Agent* agent : members) {
    if (held || !outdated(*agent)) continue;
    if (agent->state == AgentState::kBackoff) {
      TANDEM_LOG(kInfo) << "local: starting " << agent->name
                        << " with its pool's new spec now (it was waiting to restart)";
      agent->failures = 0;
      startFromBackoff(*agent);  // sooner than its backoff
    } else if (agent->state == AgentState::kStarting && agent->process) {
      TANDEM_LOG(kInfo) << "local: restarting " << agent->name
                        << " with its pool's new spec (it was not ready yet)";
      agent->start_again = true;
      sendStop(*agent);
    }
  }
  const auto regular = [&](const Agent* agent) { return !agent->surge; };
  const bool any_outdated = std::any_of(members.begin(), members.end(), [&](const Agent* agent) {
    return regular(agent) && outdated(*agent);
  });
  if (any_outdated && !pool.rolling) {
    pool.rolling = true;
    TANDEM_LOG(kInfo) << "local: " << pool.name << ": rolling out a changed spec over "
                      << pool.replicas << " agents (maxSurge " << pool.bounds.max_surge
                      << ", maxUnavailable " << pool.bounds.max_unavailable << ")";
  }
  if (pool.rolling && !any_outdated &&
      std::all_of(members.begin(), members.end(),
                  [&](const Agent* agent) { return !regular(agent) || available(*agent); })) {
    pool.rolling = false;
    TANDEM_LOG(kInfo) << "local: " << pool.name << ": rollout done";
  }
  // The extra agents: up to maxSurge while rolling, none after. Those
  // running are kept, whatever their index (a scale-down during the
  // rollout leaves them above replicas + maxSurge), before any is started;
  // past the count, the highest indexes go.
  const int64_t surge = pool.rolling ? std::min(pool.bounds.max_surge, pool.replicas) : 0;
  std::vector<Agent*> extras;
  for (Agent* agent : members) {
    if (agent->surge) extras.push_back(agent);
  }
  std::sort(extras.begin(), extras.end(),
            [](const Agent* a, const Agent* b) { return a->index < b->index; });
  for (size_t k = static_cast<size_t>(surge); k < extras.size(); ++k) {
    TANDEM_LOG(kInfo) << "local: stopping " << extras[k]->name << " (a rollout's extra agent)";
    extras[k]->removed = true;
    sendStop(*extras[k]);
  }
  int64_t missing = surge - std::min<int64_t>(surge, std::ssize(extras));
  bool started = false;
  for (int64_t i = pool.replicas; missing > 0 && !held; ++i) {
    // An index free of any agent: not one still stopping (scaled away).
    if (findAgent(pool.name + "-" + std::to_string(i)) != nullptr) continue;
    TANDEM_LOG(kInfo) << "local: " << pool.name << ": starting " << pool.name << "-" << i
                      << ", an extra agent for the rollout";
    members.push_back(&want(pool, i, /*surge=*/true));
    --missing;
    started = true;
  }
  if (started) sortAgents();
  // Old agents that serve go while enough others are available, the
  // highest index first.
  if (held) return;
  int64_t num_available = std::count_if(members.begin(), members.end(), [&](const Agent* agent) {
    return !agent->removed && available(*agent);
  });
  std::vector<Agent*> old;
  for (Agent* agent : members) {
    if (!agent->removed && outdated(*agent) && available(*agent)) old.push_back(agent);
  }
  std::sort(old.begin(), old.end(),
            [](const Agent* a, const Agent* b) { return a->index > b->index; });
  const int64_t floor = pool.replicas - pool.bounds.max_unavailable;
  for (Agent* agent : old) {
    if (num_available <= floor) break;
    TANDEM_LOG(kInfo) << "local: replacing " << agent->name << " (its pool's spec changed; "
                      << num_available << " of the pool's agents available): it drains while "
                      << "its replacement starts";
    retire(*agent, pool);
    started = true;
    --num_available;
  }
  if (started) sortAgents();
}

void AgentSupervisor::retire(Agent& agent, const Pool& pool) {
  agent.removed = true;
  agent.retiring = true;
  sendStop(agent);
  want(pool, agent.index, agent.surge);  // an extra agent's replacement is one too
}

void AgentSupervisor::startFromBackoff(Agent& agent) {
  if (!agent.start_again) {  // a crash's restart, not a rollout's
    ++agent.restarts;
    ++restarts_by_pool_[agent.pool];
  }
  start(agent);
}

void AgentSupervisor::beginStop() {
  stopping_all_ = true;
  for (auto& agent : agents_) sendStop(*agent);
}

bool AgentSupervisor::stopped() const {
  return std::none_of(agents_.begin(), agents_.end(),
                      [](const auto& agent) { return agent->process != nullptr; });
}

std::vector<AgentStatus> AgentSupervisor::agents() const {
  std::vector<AgentStatus> statuses;
  for (const auto& agent : agents_) {
    AgentStatus status;
    status.name = agent->name;
    status.pool = agent->pool;
    status.kind = agent->kind;
    status.state = agent->state;
    status.pid = agent->process ? agent->process->pid() : 0;
    status.port = agent->port;
    status.restarts = agent->restarts;
    const Pool* pool = findPool(agent->pool);
    status.updated = pool != nullptr && pool->runs(*agent);
    status.surge = agent->surge;
    statuses.push_back(std::move(status));
  }
  return statuses;
}

std::vector<AgentAddress> AgentSupervisor::readyEndpoints(PoolKind kind) const {
  std::vector<AgentAddress> endpoints;
  for (const auto& agent : agents_) {
    if (agent->kind != kind || agent->state != AgentState::kReady || agent->removed) continue;
    endpoints.push_back({agent->name, options_.host, agent->port});
  }
  return endpoints;
}

bool AgentSupervisor::allReady() const {
  return std::all_of(agents_.begin(), agents_.end(), [](const auto& agent) {
    return agent->removed || agent->state == AgentState::kReady;
  });
}

}  // namespace tandem::local
