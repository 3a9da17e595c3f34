// The owner side of transport tests: allocates a UCX KV slab, fills every
// block with the seeded pattern, prints "slab: <RemoteSlab::serialize()>",
// then prints "message: <payload>" for each notification it receives. Exits
// 0 after a "done" notification, and on its own after --lifetime-s (or when
// its parent dies) so it never outlives a test. A "stall" notification
// blocks its progress thread, so that it stops answering peers;
// "connect-back <slab>" makes it connect to that slab and send "pong".
//
//   transport_peer --blocks N --block-bytes B --seed S [--lifetime-s T]
#include <signal.h>
#include <sys/prctl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "agent/transport/ucx_allocator.h"
#include "agent/transport/ucx_transport.h"
#include "tests/integration/transport/transport_pattern.h"

namespace {

int64_t flagValue(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::strtoll(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int64_t num_blocks = flagValue(argc, argv, "--blocks", 64);
  const int64_t block_bytes = flagValue(argc, argv, "--block-bytes", 4096);
  const int64_t seed = flagValue(argc, argv, "--seed", 1);
  const int64_t lifetime_s = flagValue(argc, argv, "--lifetime-s", 120);
  if (num_blocks <= 0 || block_bytes <= 0 || block_bytes % 8 != 0) {
    std::fprintf(stderr,
                 "transport_peer: --blocks must be positive and --block-bytes a "
                 "positive multiple of 8\n");
    return 2;
  }

  try {
    auto context = tandem::transport::UcxContext::create();
    tandem::transport::UcxSlabAllocator allocator(context);
    auto* slab = static_cast<uint8_t*>(allocator.allocate(num_blocks * block_bytes));
    if (slab == nullptr) {
      std::fprintf(stderr, "transport_peer: cannot allocate the slab\n");
      return 1;
    }
    for (int64_t block = 0; block < num_blocks; ++block) {
      tandem::testing::fillBlockPattern(seed, block, block_bytes, slab + block * block_bytes);
    }

    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    context->setMessageHandler([&](std::string message) {
      std::printf("message: %s\n", message.c_str());
      std::fflush(stdout);
      std::unique_lock lock(mutex);
      if (message == "done") {
        done = true;
        cv.notify_all();
      } else if (message.rfind("connect-back ", 0) == 0) {
        // Answers on a connection of its own, from inside the handler.
        std::string reply = "pong";
        auto slab = tandem::transport::RemoteSlab::parse(message.substr(13));
        if (!slab.isOk()) {
          reply = "error " + slab.status().toString();
        } else {
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          auto back = context->connect(*slab, deadline);
          if (!back.isOk()) {
            reply = "error " + back.status().toString();
          } else {
            tandem::Status sent = (*back)->notify(reply, deadline);
            if (!sent.isOk()) reply = "error " + sent.toString();
          }
        }
        std::printf("replied: %s\n", reply.c_str());
        std::fflush(stdout);
      } else if (message == "stall") {
        // Blocks the progress thread: the owner stops answering.
        cv.wait_for(lock, std::chrono::seconds(lifetime_s), [&] { return done; });
      }
    });

    auto remote = allocator.remoteSlab(block_bytes);
    if (!remote.isOk()) {
      std::fprintf(stderr, "transport_peer: %s\n", remote.status().toString().c_str());
      return 1;
    }
    std::printf("slab: %s\n", remote->serialize().c_str());
    std::fflush(stdout);

    std::unique_lock lock(mutex);
    bool finished = cv.wait_for(lock, std::chrono::seconds(lifetime_s), [&] { return done; });
    lock.unlock();
    context->setMessageHandler(nullptr);
    allocator.release(slab, num_blocks * block_bytes);
    return finished ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transport_peer: %s\n", e.what());
    return 1;
  }
}
