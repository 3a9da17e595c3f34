// A bound httplib::Server served on a thread of its own, for stand-ins of
// agents and hubs in tests.
#pragma once

#include <httplib.h>

#include <chrono>
#include <thread>

namespace tandem::testing {

// Serves `server` (bound already) on a new thread, returned once the server
// listens: httplib's stop() called before then is lost, and the server would
// then listen for ever (a test's join with it).
inline std::thread serveOnThread(httplib::Server& server) {
  std::thread thread([&server] { server.listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!server.is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return thread;
}

}  // namespace tandem::testing
