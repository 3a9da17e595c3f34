// Clients that leave the router at any moment: reset (RST) or closed (FIN)
// while sending, queued, prefilled, decoded before the headers, or
// mid-stream. Every path out of a session returns its admission slot and its
// socket, is counted as a client abort (never "rejected", never retried on
// another decode agent), stops the upstream work and leaves no KV block held
// on any agent.
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "operator/router/router.h"
#include "tests/support/router_cluster.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary
using tandem::connectLoopback;
using tandem::prometheusSample;
using tandem::resetAndClose;
using tandem::sendAll;
using tandem::router::Policy;
using tandem::router::Router;
using tandem::router::RouterConfig;

// Open descriptors of this process (the router runs in it).
int openFds() {
  int count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) ++count;
    ::closedir(dir);
  }
  return count - 3;  // ".", ".." and the directory itself
}

// The sum of every sample of `name` (all label sets).
double metricSum(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with(name)) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// A client on a raw socket, so it can leave at any byte and choose how.
class RawClient {
 public:
  explicit RawClient(int port) { fd_ = connectLoopback(port); }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return fd_ >= 0; }

  static std::string request(const json& body, const std::string& path = "/v1/completions") {
    const std::string text = body.dump();
    return "POST " + path +
           " HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(text.size()) + "\r\n\r\n" + text;
  }
  bool send(std::string_view bytes) { return sendAll(fd_, bytes); }
  // Reads until `marker` has arrived (true) or the connection ends.
  bool readUntil(const std::string& marker, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (received_.find(marker) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd entry{fd_, POLLIN, 0};
      if (::poll(&entry, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      received_.append(chunk, static_cast<size_t>(n));
    }
    return true;
  }
  const std::string& received() const { return received_; }
  void reset() {
    resetAndClose(fd_);
    fd_ = -1;
  }
  // FIN: an orderly close.
  void close() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
};

class RouterAbortTest : public RouterCluster {
 protected:
  void start(int prefills, int decodes, int64_t max_inflight, int64_t max_queued,
             const fs::path& model = tinyModelDir()) {
    RouterClusterOptions options;
    options.prefills = prefills;
    options.decodes = decodes;
    options.max_inflight = max_inflight;
    options.max_queued = max_queued;
    options.model = model;
    // Holds outlive every deadline below: only an explicit release or the
    // reader frees them in time.
    options.kv_config = ucxConfig("kv_both", {{"abort_timeout_s", 120}});
    options.client_read_timeout_s = 30;
    startCluster(options);
  }

  double routerMetric(const std::string& name, const std::string& filter = "") {
    return prometheusSample(routerMetrics(), name, filter).value_or(-1);
  }
  // Requests an agent has finished, whatever the reason.
  static double requestsSeen(const Agent& agent) {
    return metricSum(agent.metricsText(), "tandem_requests_total");
  }

  // The router holds no slot and no queued request.
  bool admissionIdle() {
    const std::string text = routerMetrics();
    return prometheusSample(text, "tandem_router_inflight_requests").value_or(-1) == 0 &&
           prometheusSample(text, "tandem_router_queued_requests").value_or(-1) == 0;
  }
  // No agent runs, queues or holds anything.
  bool agentsIdle() {
    for (Agent* agent : agents()) {
      const std::string text = agent->metricsText();
      if (prometheusSample(text, "tandem_num_requests_running").value_or(1) != 0 ||
          prometheusSample(text, "tandem_num_requests_waiting").value_or(1) != 0 ||
          prometheusSample(text, "tandem_kv_held_blocks").value_or(1) != 0 ||
          prometheusSample(text, "tandem_kv_cache_usage_ratio").value_or(1) != 0) {
        return false;
      }
    }
    return true;
  }

  // A normal request through the router, answered within the deadline.
  int normalRequest(uint32_t seed, bool stream = false) {
    httplib::Client client("127.0.0.1", router_->port());
    client.set_read_timeout(20, 0);
    json body = greedy(randomPrompt(70, seed), 4);
    body["stream"] = stream;
    auto res = client.Post("/v1/completions", body.dump(), "application/json");
    return res ? res->status : 0;
  }
};

// Three streamed requests reset at once (they land in the prefill) fill
// three slots of three when a reset leaks: the next request would wait
// forever.
TEST_F(RouterAbortTest, ResetsBeforeTheHeadersReturnTheirSlotsAndSockets) {
  start(1, 2, /*max_inflight=*/3, /*max_queued=*/2, smallModelDir());
  ASSERT_EQ(normalRequest(1), 200);
  ASSERT_TRUE(eventually([&] { return agentsIdle(); }));
  const int baseline = openFds();
  for (int i = 0; i < 3; ++i) {
    RawClient client(router_->port());
    ASSERT_TRUE(client.connected());
    json body = greedy(randomPrompt(70, 10 + i), 32);
    body["stream"] = true;
    ASSERT_TRUE(client.send(RawClient::request(body)));
    client.reset();
  }
  EXPECT_EQ(normalRequest(2), 200) << "an admission slot leaked";
  EXPECT_TRUE(eventually([&] { return admissionIdle(); })) << routerMetrics();
  // The agents' event streams and polls may hold a connection or two more.
  EXPECT_TRUE(eventually([&] { return openFds() <= baseline + 2; }))
      << openFds() << " descriptors open, " << baseline << " before";
  EXPECT_TRUE(eventually([&] { return agentsIdle(); }));
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 0);
}

// Hundreds of clients leave at every stage, by reset or by close: sending
// the request, queued, prefilled, decoded before the headers, mid-stream.
TEST_F(RouterAbortTest, HundredsOfClientsLeavingAtEveryStageLeakNoSlotSocketOrBlock) {
  start(1, 2, /*max_inflight=*/4, /*max_queued=*/4);
  ASSERT_EQ(normalRequest(1), 200);
  ASSERT_TRUE(eventually([&] { return agentsIdle(); }));
  const int baseline = openFds();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (int i = 0; i < kPerThread; ++i) {
        const int stage = (t + i) % 6;
        json body = greedy(randomPrompt(40 + rng() % 60, rng()), 8 + rng() % 40);
        body["stream"] = stage >= 4 || rng() % 2 == 0;
        const std::string request = RawClient::request(body);
        RawClient client(router_->port());
        if (!client.connected()) continue;
        switch (stage) {
          case 0:  // while sending the request
            client.send(std::string_view(request).substr(0, request.size() / 2));
            break;
          case 1:  // at once: queued, or in the prefill
          case 2:
            client.send(request);
            break;
          case 3:  // a moment later: prefill or decode
            client.send(request);
            client.readUntil("\r\n\r\n", std::chrono::milliseconds(rng() % 20));
            break;
          case 4:  // after the headers
            client.send(request);
            client.readUntil("\r\n\r\n", std::chrono::seconds(20));
            break;
          case 5:  // mid-stream
            client.send(request);
            client.readUntil("data: {", std::chrono::seconds(20));
            break;
        }
        if (stage == 2 || rng() % 4 == 0) {
          client.close();
        } else {
          client.reset();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(eventually([&] { return admissionIdle(); })) << routerMetrics();
  EXPECT_TRUE(eventually([&] { return openFds() <= baseline + 2; }))
      << openFds() << " descriptors open, " << baseline << " before";
  EXPECT_TRUE(eventually([&] { return agentsIdle(); }));
  EXPECT_EQ(normalRequest(2), 200);
  EXPECT_EQ(normalRequest(3, /*stream=*/true), 200);
  const std::string text = routerMetrics();
  EXPECT_GT(metricSum(text, "tandem_router_client_aborts_total"), 0) << text;
}

// A client that leaves before the headers is a cancel: one decode agent at
// most saw its request, nothing is counted as rejected.
TEST_F(RouterAbortTest, AClientLeavingBeforeTheHeadersIsNotRetriedOnAnotherDecodeAgent) {
  start(1, 2, /*max_inflight=*/8, /*max_queued=*/8, smallModelDir());
  // Non-streamed: the headers come when the decode agent has finished;
  // the client leaves while it decodes.
  {
    RawClient client(router_->port());
    ASSERT_TRUE(client.send(RawClient::request(greedy(randomPrompt(70, 20), 400))));
    ASSERT_TRUE(eventually([&] {
      return decode_[0]->metric("tandem_num_requests_running") +
                 decode_[1]->metric("tandem_num_requests_running") >
             0;
    }));
    client.reset();
  }
  EXPECT_TRUE(eventually([&] { return agentsIdle() && admissionIdle(); }));
  EXPECT_EQ(requestsSeen(*decode_[0]) + requestsSeen(*decode_[1]), 1)
      << "the request ran on one decode agent only";
  EXPECT_EQ(routerMetric("tandem_router_client_aborts_total", "stage=\"decode\""), 1);
  // Streamed: the client leaves at once, before the prefill answered.
  for (int i = 0; i < 3; ++i) {
    RawClient client(router_->port());
    json body = greedy(randomPrompt(70, 21 + i), 400);
    body["stream"] = true;
    ASSERT_TRUE(client.send(RawClient::request(body)));
    client.reset();
  }
  EXPECT_TRUE(eventually([&] {
    return metricSum(routerMetrics(), "tandem_router_client_aborts_total") == 4;
  })) << routerMetrics();
  EXPECT_TRUE(eventually([&] { return agentsIdle() && admissionIdle(); }));
  EXPECT_LE(requestsSeen(*decode_[0]) + requestsSeen(*decode_[1]), 1 + 3)
      << "no request ran on a second decode agent";
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 0);
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"retried\""), 0);
  EXPECT_EQ(metricSum(routerMetrics(), "tandem_router_upstream_errors_total"), 0)
      << "a client leaving is not an agent's fault";
}

// A client that leaves (closes or resets) while its long prompt is
// prefilled stops the prefill: the router ends its request to the prefill
// agent, which aborts it. Before, the router read the prefill to its end
// (the answer names blocks to release), and every abandoned prompt was
// computed whole, in front of the next clients' (3.3 s against 0.23 s).
TEST_F(RouterAbortTest, AClientLeavingDuringItsPrefillStopsIt) {
  RouterClusterOptions options;
  options.model = smallModelDir();
  options.kv_config = ucxConfig("kv_both", {{"abort_timeout_s", 120}});
  // The prompt's prefill takes steps: it is seen running, and still runs
  // when its client leaves.
  options.agent_args = [](bool prefill, int) {
    return prefill ? std::vector<std::string>{"--max-num-batched-tokens", "16"}
                   : std::vector<std::string>{};
  };
  startCluster(options);
  Agent& prefill = *prefill_[0];
  for (int i = 0; i < 2; ++i) {
    RawClient client(router_->port());
    json body = greedy(randomPrompt(1500, 30 + i), 8);
    body["stream"] = i == 0;
    ASSERT_TRUE(client.send(RawClient::request(body)));
    ASSERT_TRUE(eventually([&] { return prefill.metric("tandem_num_requests_running") >= 1; }));
    if (i == 0) {
      client.close();
    } else {
      client.reset();
    }
    EXPECT_TRUE(eventually([&] {
      return prefill.metric("tandem_requests_total", "finish_reason=\"abort\"") == i + 1;
    })) << prefill.metricsText();
  }
  EXPECT_TRUE(eventually([&] { return agentsIdle() && admissionIdle(); }));
  EXPECT_EQ(prefill.metric("tandem_requests_total", "finish_reason=\"length\""), 0)
      << "no abandoned prefill ran to its end";
  EXPECT_EQ(requestsSeen(*decode_[0]), 0);
  EXPECT_EQ(routerMetric("tandem_router_client_aborts_total", "stage=\"prefill\""), 2);
  EXPECT_EQ(metricSum(routerMetrics(), "tandem_router_upstream_errors_total"), 0)
      << "a client leaving is not an agent's fault";
  EXPECT_EQ(normalRequest(32), 200);
}

// Queued requests whose clients leave are dropped from the queue and never
// reach an agent, while the request holding the only slot goes on.
TEST_F(RouterAbortTest, QueuedRequestsWhoseClientsLeaveAreDroppedAndNeverSentUpstream) {
  start(1, 1, /*max_inflight=*/1, /*max_queued=*/4, smallModelDir());
  RawClient running(router_->port());
  json long_body = greedy(randomPrompt(30, 30), 2000);
  long_body["stream"] = true;
  ASSERT_TRUE(running.send(RawClient::request(long_body)));
  ASSERT_TRUE(running.readUntil("data: {", std::chrono::seconds(20)));
  std::vector<std::unique_ptr<RawClient>> queued;
  for (int i = 0; i < 4; ++i) {
    queued.push_back(std::make_unique<RawClient>(router_->port()));
    json body = greedy(randomPrompt(70, 31 + i), 8);
    body["stream"] = i % 2 == 0;
    ASSERT_TRUE(queued.back()->send(RawClient::request(body)));
  }
  ASSERT_TRUE(eventually([&] { return routerMetric("tandem_router_queued_requests") == 4; }))
      << routerMetrics();
  for (int i = 0; i < 4; ++i) {
    if (i % 2 == 0) {
      queued[i]->close();
    } else {
      queued[i]->reset();
    }
  }
  EXPECT_TRUE(eventually([&] {
    return routerMetric("tandem_router_queued_requests") == 0 &&
           routerMetric("tandem_router_client_aborts_total", "stage=\"queued\"") == 4;
  })) << routerMetrics();
  EXPECT_EQ(routerMetric("tandem_router_inflight_requests"), 1) << "the stream goes on";
  // The first token comes from the prefill agent; the decode agent may still
  // be reading the KV, so its running count is waited for.
  EXPECT_TRUE(eventually([&] { return decode_[0]->metric("tandem_num_requests_running") == 1; }));
  running.reset();
  EXPECT_TRUE(eventually([&] { return agentsIdle() && admissionIdle(); }));
  EXPECT_EQ(requestsSeen(*prefill_[0]), 1) << "only the running request reached an agent";
  EXPECT_EQ(requestsSeen(*decode_[0]), 1);
  EXPECT_EQ(routerMetric("tandem_router_client_aborts_total", "stage=\"response\""), 1);
}

// A client that reads its stream to [DONE] and leaves at once (a reset, as
// a client closing its connection the moment it has its answer may send)
// was served: counted under its decision and in the end-to-end latency,
// never as a client abort, however soon it left before the body's last
// (empty) chunk. Before, a share of such streams counted as aborts at the
// "response" stage, and under no decision.
TEST_F(RouterAbortTest, AClientLeavingRightAfterDoneWasServed) {
  start(1, 1, /*max_inflight=*/8, /*max_queued=*/8);
  constexpr int kStreams = 12;
  for (int i = 0; i < kStreams; ++i) {
    json body = greedy(randomPrompt(20, 400 + i), 4);
    body["stream"] = true;
    if (i % 2 == 0) body["stream_options"] = {{"include_usage", true}};
    RawClient client(router_->port());
    ASSERT_TRUE(client.send(RawClient::request(body)));
    ASSERT_TRUE(client.readUntil("data: [DONE]", std::chrono::seconds(30))) << client.received();
    client.reset();
  }
  auto served = [&] {
    const std::string text = routerMetrics();
    return prometheusSample(text, "tandem_router_requests_total", "decision=\"disaggregated\"")
               .value_or(0) +
           prometheusSample(text, "tandem_router_requests_total", "decision=\"local_prefill\"")
               .value_or(0) +
           prometheusSample(text, "tandem_router_requests_total", "decision=\"pull_back\"")
               .value_or(0);
  };
  EXPECT_TRUE(eventually([&] {
    return admissionIdle() &&
           served() + routerMetric("tandem_router_client_aborts_total", "stage=\"response\"") ==
               kStreams;
  })) << routerMetrics();
  EXPECT_EQ(routerMetric("tandem_router_client_aborts_total", "stage=\"response\""), 0);
  EXPECT_EQ(served(), kStreams);
  EXPECT_EQ(routerMetric("tandem_router_e2e_request_latency_seconds_count"), kStreams);
  // Three gaps between four tokens, the usage chunk's none.
  EXPECT_EQ(routerMetric("tandem_router_inter_token_latency_seconds_count"), kStreams * 3);
}

// Sixteen clients at once leave at random moments: no prefill agent keeps
// blocks for them until its abort timeout (120 s): all are back long before.
TEST_F(RouterAbortTest, ConcurrentClientsLeavingAtRandomLeaveNoHeldBlocks) {
  start(2, 2, /*max_inflight=*/8, /*max_queued=*/16, smallModelDir());
  constexpr int kClients = 16;
  constexpr int kRounds = 4;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(2000 + c);
      for (int round = 0; round < kRounds; ++round) {
        json body = greedy(randomPrompt(50 + rng() % 80, rng()), 16 + rng() % 48);
        body["stream"] = rng() % 2 == 0;
        RawClient client(router_->port());
        if (!client.connected() || !client.send(RawClient::request(body))) continue;
        client.readUntil("data: [DONE]", std::chrono::milliseconds(rng() % 400));
        if (rng() % 2 == 0) {
          client.reset();
        } else {
          client.close();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& agent : prefill_) {
    EXPECT_TRUE(eventually([&] { return agent->metric("tandem_kv_held_blocks") == 0; },
                           std::chrono::seconds(20)))
        << agent->metricsText();
  }
  EXPECT_TRUE(eventually([&] { return agentsIdle() && admissionIdle(); }));
  EXPECT_EQ(routerMetric("tandem_router_requests_total", "decision=\"rejected\""), 0);
}

}  // namespace
