#include "tools/bench/chaos_bench.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include "common/loopback_socket.h"
#include "common/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/move_scenario.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

enum Phase { kWarmup = 0, kKill, kMove, kAbort, kOverload, kCooldown, kNumPhases };
constexpr const char* kPhaseNames[kNumPhases] = {"warmup", "kill",     "move",
                                                 "abort",  "overload", "cooldown"};
constexpr int kProbesAfterAborts = 4;

double secondsSince(Clock::time_point start) { return secondsBetween(start, Clock::now()); }

// ---- client aborts --------------------------------------------------------

enum class AbortStage {
  kPartialHeaders,
  kPartialBody,
  kAfterRequest,
  kAfterDelay,
  kAfterFirstBytes
};
constexpr size_t kNumAbortStages = 5;
constexpr const char* kAbortStageNames[kNumAbortStages] = {
    "partial_headers", "partial_body", "after_request", "after_delay", "after_first_bytes"};

struct AbortTally {
  // [stage][reset][stream]
  int64_t counts[kNumAbortStages][2][2] = {};
  int64_t no_answer = 0;  // after_first_bytes: not one byte within the hang timeout
  int64_t connect_failures = 0;
};

// Reads until `want` bytes came, the answer ended (its last chunk: the
// connection stays open), the peer closed, or no byte for timeout_ms. The
// bytes read; -1 when the timeout passed without any.
int64_t readUpTo(int fd, size_t want, int timeout_ms) {
  size_t got = 0;
  char buffer[4096];
  std::string received;
  while (got < want && received.find("\r\n0\r\n\r\n") == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready == 0) return got == 0 ? -1 : static_cast<int64_t>(got);
    if (ready < 0) break;
    const ssize_t n = ::recv(fd, buffer, std::min(sizeof(buffer), want - got), 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
    received.append(buffer, static_cast<size_t>(n));
  }
  return static_cast<int64_t>(got);
}

int portOf(const std::string& url) { return std::stoi(url.substr(url.rfind(':') + 1)); }

// One client that leaves at a random moment.
void abortOnce(int port, const std::string& model, std::mt19937_64& rng, double hang_timeout_s,
               std::pair<int32_t, int32_t> vocab, AbortTally& tally, std::mutex& mutex) {
  const auto stage = static_cast<AbortStage>(rng() % kNumAbortStages);
  const bool reset = rng() % 2 == 1;
  const bool stream = rng() % 2 == 1;
  std::uniform_int_distribution<int32_t> token(vocab.first, vocab.second - 1);
  std::vector<int32_t> prompt(20 + rng() % 100);
  for (int32_t& id : prompt) id = token(rng);
  const std::string body = greedyBody(model, prompt, 8 + static_cast<int64_t>(rng() % 56), stream);
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n";
  const std::string request = head + body;
  const int fd = connectLoopback(port);
  if (fd < 0) {
    std::lock_guard lock(mutex);
    ++tally.connect_failures;
    return;
  }
  bool no_answer = false;
  switch (stage) {
    case AbortStage::kPartialHeaders:
      sendAll(fd, std::string_view(request).substr(0, 1 + rng() % (head.size() - 1)));
      break;
    case AbortStage::kPartialBody:
      sendAll(fd, std::string_view(request).substr(0, head.size() + rng() % body.size()));
      break;
    case AbortStage::kAfterRequest:
      sendAll(fd, request);
      break;
    case AbortStage::kAfterDelay:
      sendAll(fd, request);
      std::this_thread::sleep_for(milliseconds(rng() % 400));
      break;
    case AbortStage::kAfterFirstBytes: {
      sendAll(fd, request);
      // Streams: headers and some events; plain answers: part of the headers.
      const size_t want = stream ? 1 + rng() % 1200 : 1 + rng() % 60;
      no_answer = readUpTo(fd, want, static_cast<int>(hang_timeout_s * 1000)) < 0;
      break;
    }
  }
  if (reset) {
    resetAndClose(fd);
  } else {
    ::close(fd);
  }
  std::lock_guard lock(mutex);
  ++tally.counts[static_cast<size_t>(stage)][reset][stream];
  tally.no_answer += no_answer;
}

// ---- kills and stops ------------------------------------------------------

struct FaultEvent {
  std::string agent;
  std::string role;
  std::string action;  // "kill", "stop" or "drain"
  double at_s = 0.0;   // since the scenarios started
  double stopped_s = 0.0;
  std::optional<double> recovery_s;  // to the first request through the router that succeeded
  std::optional<double> restart_s;   // kill, drain: until local mode had it ready again
  bool accepted = true;              // drain: the agent answered 202
  OutcomeCounts probes;
};

// Sends short requests one after another until one succeeds; its end, in
// seconds since `from`, or nullopt at the deadline.
std::optional<double> probeUntilSuccess(const std::string& url, const std::string& model,
                                        Clock::time_point from, double timeout_s,
                                        double hang_timeout_s, OutcomeCounts& probes,
                                        uint32_t seed) {
  std::mt19937_64 rng(seed);
  while (secondsSince(from) < timeout_s) {
    std::vector<int32_t> prompt(40);
    for (int32_t& id : prompt) id = 3 + static_cast<int32_t>(rng() % 470);
    const PlainCompletion result =
        postCompletion(url, greedyBody(model, prompt, 4, false), hang_timeout_s);
    probes.add(result.outcome);
    if (result.outcome == Outcome::kOk) return secondsSince(from);
    std::this_thread::sleep_for(milliseconds(50));
  }
  return std::nullopt;
}

std::string optionalSeconds(const std::optional<double>& value) {
  if (!value) return "never";
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", *value);
  return text;
}

// ---- overload -------------------------------------------------------------

struct OverloadResult {
  int clients = 0;
  OutcomeCounts outcomes;
  int64_t rejected_503 = 0;
  int64_t rejected_with_retry_after = 0;
  std::vector<AnsweredRequest> answered;
};

OverloadResult overload(const std::string& url, const std::string& model, int clients,
                        double hang_timeout_s, uint64_t seed) {
  OverloadResult out;
  out.clients = clients;
  std::mutex mutex;
  std::latch go(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(i));
      AnsweredRequest request;
      request.prompt.resize(30 + rng() % 60);
      for (int32_t& id : request.prompt) id = 3 + static_cast<int32_t>(rng() % 470);
      request.max_tokens = 8;
      go.arrive_and_wait();
      const PlainCompletion result = postCompletion(
          url, greedyBody(model, request.prompt, request.max_tokens, false), hang_timeout_s);
      std::lock_guard lock(mutex);
      out.outcomes.add(result.outcome);
      if (result.status == 503) {
        ++out.rejected_503;
        out.rejected_with_retry_after += result.retry_after;
      }
      if (result.outcome == Outcome::kOk) {
        request.token_ids = result.token_ids;
        out.answered.push_back(std::move(request));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return out;
}

std::set<std::string> parseScenarios(const std::string& text) {
  std::set<std::string> scenarios;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    if (name != "kill" && name != "move" && name != "abort" && name != "overload") {
      throw Error(
          "--scenarios takes a comma-separated list of kill, move, abort and overload, got \"" +
          text + "\"");
    }
    scenarios.insert(name);
  }
  return scenarios;
}

void validate(const ChaosBenchOptions& o) {
  auto atLeast = [](const char* name, double value, double low) {
    if (!(value >= low)) {
      throw Error(std::string(name) + " must be at least " + numberText(low) + ", got " +
                  numberText(value));
    }
  };
  atLeast("--kills", o.kills, 0);
  atLeast("--stops", o.stops, 0);
  atLeast("--drains", o.drains, 0);
  atLeast("--event-gap", o.event_gap_s, 1);
  atLeast("--stop-max", o.stop_max_s, 1);
  atLeast("--aborts", o.aborts, 0);
  atLeast("--abort-clients", o.abort_clients, 1);
  atLeast("--overload-factor", o.overload_factor, 0);
  atLeast("--overload-clients", o.overload_clients, 0);
  atLeast("--load-clients", o.load.clients, 1);
  atLeast("--hang-timeout", o.load.hang_timeout_s, 1);
  atLeast("--settle-timeout", o.settle_timeout_s, 0);
  atLeast("--exactness-checks", static_cast<double>(o.exactness_checks), 0);
}

}  // namespace

int runChaosBench(const ChaosBenchOptions& options) {
  validate(options);
  const std::set<std::string> scenarios = parseScenarios(options.scenarios);
  const auto vocab = parseVocabRange(options.load.vocab_range);
  const double hang_s = options.load.hang_timeout_s;
  std::mt19937_64 rng(options.load.seed);

  StartedCluster started = startBenchCluster(options.cluster, options.work_dir, "chaos");
  const LocalClusterOptions& cluster_options = started.options;
  std::unique_ptr<LocalCluster>& cluster = started.cluster;
  const std::string url = started.url;
  const std::string model = started.model;
  std::printf("cluster %s: %zu agents, router %s (max_inflight %lld, max_queued %lld), model %s\n",
              cluster->clusterFile().c_str(), cluster->expectedAgents(), url.c_str(),
              static_cast<long long>(cluster->maxInflightRequests()),
              static_cast<long long>(cluster->maxQueuedRequests()), model.c_str());
  std::fflush(stdout);

  // The router's descriptors with the cluster idle, after one request.
  OutcomeCounts ignored;
  probeUntilSuccess(url, model, Clock::now(), 60, hang_s, ignored, 1);
  int baseline_fds = openFdCount(cluster->operatorPid()).value_or(0);
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    baseline_fds = std::min(baseline_fds, openFdCount(cluster->operatorPid()).value_or(0));
  }

  MultiTurnLoad load(url, model, options.load);
  const Clock::time_point start = Clock::now();
  load.setPhase(kWarmup);
  load.start();
  while (load.completedRequests() < options.load.clients && secondsSince(start) < 60) {
    std::this_thread::sleep_for(milliseconds(50));
  }

  // (a) kills and stops.
  std::vector<FaultEvent> events;
  if (scenarios.count("kill")) {
    load.setPhase(kKill);
    std::vector<std::string> actions(static_cast<size_t>(options.kills), "kill");
    actions.insert(actions.end(), static_cast<size_t>(options.stops), "stop");
    actions.insert(actions.end(), static_cast<size_t>(options.drains), "drain");
    std::shuffle(actions.begin(), actions.end(), rng);
    for (const std::string& action : actions) {
      std::uniform_real_distribution<double> gap(1.0, options.event_gap_s);
      std::this_thread::sleep_for(std::chrono::duration<double>(gap(rng)));
      std::vector<ClusterAgent> agents = cluster->agents();
      if (action == "drain") {  // decode agents: what a drain hands over is their streams
        std::erase_if(agents, [](const ClusterAgent& agent) { return agent.role != "decode"; });
      }
      if (agents.empty()) continue;
      const ClusterAgent victim = agents[rng() % agents.size()];
      FaultEvent event;
      event.agent = victim.name;
      event.role = victim.role;
      event.action = action;
      event.at_s = secondsSince(start);
      std::printf("%7.1f s: %s %s (pid %d)\n", event.at_s, action.c_str(), victim.name.c_str(),
                  victim.pid);
      std::fflush(stdout);
      const Clock::time_point at = Clock::now();
      if (action == "kill" || action == "drain") {
        if (action == "kill") {
          ::kill(victim.pid, SIGKILL);
        } else {
          event.accepted = postDrain(victim, cluster->kvSecret());
        }
        event.recovery_s = probeUntilSuccess(url, model, at, options.recovery_timeout_s, hang_s,
                                             event.probes, static_cast<uint32_t>(rng()));
        if (auto back = cluster->waitForRestart(
                victim.name, victim.pid,
                milliseconds(static_cast<int64_t>(options.recovery_timeout_s * 1000)))) {
          event.restart_s = secondsSince(at);
        }
      } else {
        std::uniform_real_distribution<double> pause(1.0, options.stop_max_s);
        event.stopped_s = pause(rng);
        ::kill(victim.pid, SIGSTOP);
        std::thread probe([&] {
          event.recovery_s = probeUntilSuccess(url, model, at, options.recovery_timeout_s, hang_s,
                                               event.probes, static_cast<uint32_t>(event.at_s));
        });
        std::this_thread::sleep_until(at + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(event.stopped_s)));
        ::kill(victim.pid, SIGCONT);
        probe.join();
      }
      // One agent down at a time: the next event waits until the router
      // routes to every agent again.
      cluster->waitForAllAgents(
          milliseconds(static_cast<int64_t>(options.recovery_timeout_s * 1000)));
      cluster->waitForRouterToSeeAllAgents(
          milliseconds(static_cast<int64_t>(options.recovery_timeout_s * 1000)));
      std::printf("         recovered after %s s%s\n", optionalSeconds(event.recovery_s).c_str(),
                  action != "stop"
                      ? (", restarted after " + optionalSeconds(event.restart_s) + " s").c_str()
                      : "");
      std::fflush(stdout);
      events.push_back(std::move(event));
    }
  }

  // (b) streams moved off a drained or killed decode agent.
  MoveResult moves;
  if (scenarios.count("move")) {
    load.setPhase(kMove);
    MoveOptions move = options.move;
    move.hang_timeout_s = hang_s;
    move.restart_timeout_s = options.recovery_timeout_s;
    move.seed = options.load.seed + 7;
    move.vocab = vocab;
    moves = runMoveRounds(*cluster, url, model, move);
    cluster->waitForAllAgents(
        milliseconds(static_cast<int64_t>(options.recovery_timeout_s * 1000)));
  }

  // (c) client aborts.
  AbortTally aborts;
  OutcomeCounts after_aborts;
  if (scenarios.count("abort")) {
    load.setPhase(kAbort);
    std::mutex mutex;
    std::atomic<int> next{0};
    const int port = portOf(url);
    std::vector<std::thread> threads;
    for (int c = 0; c < options.abort_clients; ++c) {
      threads.emplace_back([&, c] {
        std::mt19937_64 client_rng(options.load.seed * 7919 + static_cast<uint64_t>(c));
        while (next.fetch_add(1) < options.aborts) {
          abortOnce(port, model, client_rng, hang_s, vocab, aborts, mutex);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int i = 0; i < kProbesAfterAborts; ++i) {
      std::vector<int32_t> prompt(50);
      for (int32_t& id : prompt) id = vocab.first + static_cast<int32_t>(rng() % 400);
      const bool stream = i % 2 == 0;
      const std::string body = greedyBody(model, prompt, 8, stream);
      after_aborts.add(stream ? classify(streamCompletion(url, body, hang_s, Clock::now()), hang_s)
                              : postCompletion(url, body, hang_s).outcome);
    }
  }

  // (d) overload.
  OverloadResult overloaded;
  if (scenarios.count("overload")) {
    load.setPhase(kOverload);
    const int clients = options.overload_clients > 0
                            ? options.overload_clients
                            : static_cast<int>(options.overload_factor *
                                               static_cast<double>(cluster->maxInflightRequests() +
                                                                   cluster->maxQueuedRequests()));
    overloaded = overload(url, model, clients, hang_s, options.load.seed + 1000003);
  }

  load.setPhase(kCooldown);
  load.stop();
  const double duration_s = secondsSince(start);
  const SettleReport settle = cluster->waitUntilSettled(
      baseline_fds, milliseconds(static_cast<int64_t>(options.settle_timeout_s * 1000)));
  // What the operator wrote last, for a failed verdict; whether it is still
  // there (its agents outlive it, so a router gone quiet may mean it died).
  const std::optional<int> operator_exit = cluster->operatorExit();
  const std::string operator_log = cluster->logTail(40);
  const std::string& agent_bin = started.agent_bin;
  const std::vector<std::string> reference_flags = cluster->referenceAgentFlags();
  cluster.reset();  // the reference gets the machine to itself

  const std::vector<LoadRecord> records = load.records();
  std::vector<OutcomeCounts> by_phase(kNumPhases);
  std::vector<std::string> errors;
  std::vector<AnsweredRequest> answered;
  for (const LoadRecord& record : records) {
    by_phase[static_cast<size_t>(record.phase)].add(record.outcome);
    if (record.outcome == Outcome::kOk) answered.push_back(record.request);
    if (record.outcome != Outcome::kOk && errors.size() < 10) {
      errors.push_back(std::string(kPhaseNames[record.phase]) + ": " + outcomeName(record.outcome) +
                       ": " + record.result.error);
    }
  }
  answered.insert(answered.end(), overloaded.answered.begin(), overloaded.answered.end());
  answered.insert(answered.end(), moves.answered.begin(), moves.answered.end());
  if (options.exactness_checks > 0 &&
      static_cast<int64_t>(answered.size()) > options.exactness_checks) {
    std::shuffle(answered.begin(), answered.end(), rng);
    answered.resize(static_cast<size_t>(options.exactness_checks));
  }
  std::printf("checking %zu answers against a colocated reference agent\n", answered.size());
  std::fflush(stdout);
  ExactnessReport exactness;
  {
    ReferenceAgent reference(agent_bin, reference_flags, cluster_options.work_dir);
    exactness = checkExactness(reference.url(), model, answered, 2);
  }

  // ---- report ----
  OutcomeCounts all_load, fault_probes;
  for (const OutcomeCounts& phase : by_phase) {
    for (size_t i = 0; i < kNumOutcomes; ++i) all_load.counts[i] += phase.counts[i];
  }
  for (const FaultEvent& event : events) {
    for (size_t i = 0; i < kNumOutcomes; ++i) fault_probes.counts[i] += event.probes.counts[i];
  }
  std::printf("\n=== tandem-bench chaos: %.1f s, %d load clients, hang timeout %s s\n", duration_s,
              options.load.clients, numberText(hang_s).c_str());
  printOutcomeHeader("requests");
  for (int phase = 0; phase < kNumPhases; ++phase) {
    if (by_phase[phase].total() > 0) {
      printOutcomeRow(std::string("load: ") + kPhaseNames[phase], by_phase[phase]);
    }
  }
  printOutcomeRow("load: all", all_load);
  if (!events.empty()) printOutcomeRow("kill/stop probes", fault_probes);
  if (scenarios.count("abort")) printOutcomeRow("after aborts", after_aborts);
  if (scenarios.count("overload")) printOutcomeRow("overload", overloaded.outcomes);

  if (!events.empty()) {
    std::printf("\n%-8s %-12s %-8s %8s %10s %12s %12s\n", "event", "agent", "role", "at (s)",
                "stopped(s)", "recovery(s)", "restart(s)");
    for (const FaultEvent& e : events) {
      std::printf("%-8s %-12s %-8s %8.1f %10s %12s %12s\n", e.action.c_str(), e.agent.c_str(),
                  e.role.c_str(), e.at_s,
                  e.action == "stop" ? numberText(std::round(e.stopped_s * 10) / 10).c_str() : "-",
                  optionalSeconds(e.recovery_s).c_str(),
                  e.action != "stop" ? optionalSeconds(e.restart_s).c_str() : "-");
    }
  }
  if (!moves.rounds.empty()) {
    std::printf("\n%-6s %-12s %6s %16s %18s %14s %9s %10s\n", "move", "agent", "moved",
                "router pause ms", "client max gap ms", "median gap ms", "complete", "restarted");
    for (const MoveRound& m : moves.rounds) {
      std::printf("%-6s %-12s %6.0f %16.1f %18.1f %14.2f %6d/%-2d %10s\n", m.action.c_str(),
                  m.agent.empty() ? "(none busy)" : m.agent.c_str(), m.moved, m.router_pause_ms,
                  m.client_max_gap_ms, m.median_gap_ms, m.complete, options.move.streams,
                  m.restarted ? "yes" : "no");
    }
  }
  int64_t total_aborts = 0;
  if (scenarios.count("abort")) {
    std::printf("\n%-18s %10s %10s %10s %10s\n", "aborts", "FIN plain", "FIN stream", "RST plain",
                "RST stream");
    for (size_t s = 0; s < kNumAbortStages; ++s) {
      std::printf("%-18s %10lld %10lld %10lld %10lld\n", kAbortStageNames[s],
                  static_cast<long long>(aborts.counts[s][0][0]),
                  static_cast<long long>(aborts.counts[s][0][1]),
                  static_cast<long long>(aborts.counts[s][1][0]),
                  static_cast<long long>(aborts.counts[s][1][1]));
      for (int r = 0; r < 2; ++r) {
        for (int st = 0; st < 2; ++st) total_aborts += aborts.counts[s][r][st];
      }
    }
    std::printf("aborts: %lld; no byte within the hang timeout: %lld; connect failures: %lld\n",
                static_cast<long long>(total_aborts), static_cast<long long>(aborts.no_answer),
                static_cast<long long>(aborts.connect_failures));
  }
  if (scenarios.count("overload")) {
    std::printf("\noverload: %d clients at once: %lld ok, %lld 503 (%lld with Retry-After)\n",
                overloaded.clients, static_cast<long long>(overloaded.outcomes[Outcome::kOk]),
                static_cast<long long>(overloaded.rejected_503),
                static_cast<long long>(overloaded.rejected_with_retry_after));
  }
  std::printf(
      "\nexactness: %lld answers checked, %lld differ from the reference, %lld reference "
      "failures\n",
      static_cast<long long>(exactness.checked), static_cast<long long>(exactness.mismatched),
      static_cast<long long>(exactness.reference_failures));
  for (const std::string& example : exactness.examples) std::printf("  %s\n", example.c_str());
  settle.print();
  for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) {
    std::printf("error: %s\n", errors[i].c_str());
  }

  // ---- verdict ----
  std::vector<std::string> failed;
  const int64_t broken = all_load.broken() + fault_probes.broken() + after_aborts.broken() +
                         overloaded.outcomes.broken() + aborts.no_answer;
  if (broken > 0) failed.push_back(std::to_string(broken) + " hung, truncated or unclean");
  if (after_aborts[Outcome::kOk] != after_aborts.total()) {
    failed.push_back("a request after the aborts did not succeed");
  }
  if (overloaded.rejected_503 != overloaded.rejected_with_retry_after) {
    failed.push_back("a 503 without Retry-After");
  }
  if (exactness.mismatched > 0 || exactness.reference_failures > 0) failed.push_back("inexact");
  for (const FaultEvent& e : events) {
    if (!e.recovery_s) failed.push_back("no recovery after " + e.action + " of " + e.agent);
    if (e.action != "stop" && !e.restart_s) failed.push_back(e.agent + " not restarted");
    if (!e.accepted) failed.push_back(e.agent + " did not accept POST /admin/drain");
  }
  for (const MoveRound& m : moves.rounds) {
    if (m.agent.empty()) failed.push_back("move: no decode agent was busy for a " + m.action);
    if (m.complete != options.move.streams) failed.push_back("move: a stream did not complete");
    if (!m.agent.empty() && !m.restarted) failed.push_back(m.agent + " not restarted");
  }
  if (settle.leakedBlocks() > 0) failed.push_back("leaked blocks");
  if (!settle.routerIdle()) failed.push_back("router in-flight/queued not back to 0");
  if (!settle.fdsBack()) failed.push_back("router descriptors not back to the baseline");
  if (!settle.settled) failed.push_back("not settled");
  if (operator_exit) {
    failed.push_back("tandem-operator exited during the run (status " +
                     std::to_string(*operator_exit) + ")");
  }
  std::printf("\nverdict: %s\n", failed.empty() ? "every property held" : "FAILED");
  for (const std::string& reason : failed) std::printf("  - %s\n", reason.c_str());
  if (!failed.empty()) std::printf("\nthe operator's log ends with:\n%s", operator_log.c_str());
  std::fflush(stdout);

  if (!options.json_path.empty()) {
    json phases = json::object();
    for (int phase = 0; phase < kNumPhases; ++phase) {
      phases[kPhaseNames[phase]] = by_phase[phase].toJson();
    }
    json event_list = json::array();
    for (const FaultEvent& e : events) {
      event_list.push_back({{"action", e.action},
                            {"agent", e.agent},
                            {"role", e.role},
                            {"at_s", e.at_s},
                            {"stopped_s", e.action == "stop" ? json(e.stopped_s) : json(nullptr)},
                            {"recovery_s", e.recovery_s ? json(*e.recovery_s) : json(nullptr)},
                            {"restart_s", e.restart_s ? json(*e.restart_s) : json(nullptr)},
                            {"probes", e.probes.toJson()}});
    }
    json move_list = json::array();
    for (const MoveRound& m : moves.rounds) {
      move_list.push_back({{"action", m.action},
                           {"agent", m.agent},
                           {"moved", m.moved},
                           {"router_pause_ms", m.router_pause_ms},
                           {"client_max_gap_ms", m.client_max_gap_ms},
                           {"median_gap_ms", m.median_gap_ms},
                           {"complete", m.complete},
                           {"restarted", m.restarted}});
    }
    json abort_stages = json::object();
    for (size_t s = 0; s < kNumAbortStages; ++s) {
      abort_stages[kAbortStageNames[s]] = {{"fin_plain", aborts.counts[s][0][0]},
                                           {"fin_stream", aborts.counts[s][0][1]},
                                           {"rst_plain", aborts.counts[s][1][0]},
                                           {"rst_stream", aborts.counts[s][1][1]}};
    }
    json out = {
        {"router_url", url},
        {"model", model},
        {"cluster_file", cluster_options.cluster_file.empty()
                             ? (cluster_options.work_dir / "cluster.yaml").string()
                             : cluster_options.cluster_file},
        {"scenarios", std::vector<std::string>(scenarios.begin(), scenarios.end())},
        {"duration_s", duration_s},
        {"hang_timeout_s", hang_s},
        {"load", {{"all", all_load.toJson()}, {"phases", std::move(phases)}}},
        {"events", std::move(event_list)},
        {"moves", move_list},
        {"operator_exit_status", operator_exit ? json(*operator_exit) : json(nullptr)},
        {"aborts",
         {{"total", total_aborts},
          {"no_answer", aborts.no_answer},
          {"connect_failures", aborts.connect_failures},
          {"stages", std::move(abort_stages)},
          {"after", after_aborts.toJson()}}},
        {"overload",
         {{"clients", overloaded.clients},
          {"outcomes", overloaded.outcomes.toJson()},
          {"rejected_503", overloaded.rejected_503},
          {"rejected_with_retry_after", overloaded.rejected_with_retry_after}}},
        {"exactness", exactness.toJson()},
        {"end_state", settle.toJson()},
        {"errors", errors},
        {"failed", failed},
        {"passed", failed.empty()},
    };
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return failed.empty() ? 0 : 1;
}

}  // namespace tandem::bench
