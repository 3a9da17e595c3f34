// The controller's /metrics, /healthz and /readyz answer beside connections
// that send their head a byte a second (a stuck scraper, a port scanner):
// each of those held one of the old server's few threads for as long as
// bytes kept coming, and the kubelet's probes waited behind them.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "operator/controller/controller_metrics.h"

namespace tandem::controller {
namespace {

TEST(MetricsServer, AnswersItsProbesBesideConnectionsThatTrickleAHead) {
  MetricsServer server(
      "127.0.0.1", 0, [] { return std::string("tandem_operator_is_leader 1\n"); },
      [] { return false; });
  constexpr int kTricklers = 32;
  std::vector<int> trickling;
  for (int i = 0; i < kTricklers; ++i) {
    const int fd = connectLoopback(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(sendAll(fd, "GET /metrics HTTP/1.1\r\nHost: t\r\nX-Slow: "));
    trickling.push_back(fd);
  }
  std::atomic<bool> trickle{true};
  std::thread trickler([&] {
    for (int second = 0; second < 30 && trickle; ++second) {
      for (int fd : trickling) ::send(fd, "s", 1, MSG_NOSIGNAL);
      for (int tick = 0; tick < 10 && trickle; ++tick) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  httplib::Client client("127.0.0.1", server.port());
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(10, 0);
  auto health = client.Get("/healthz");
  auto ready = client.Get("/readyz");
  auto metrics = client.Get("/metrics");
  trickle = false;
  trickler.join();
  for (int fd : trickling) ::close(fd);
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(ready->body, "caches not synced\n");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body, "tandem_operator_is_leader 1\n");
}

}  // namespace
}  // namespace tandem::controller
