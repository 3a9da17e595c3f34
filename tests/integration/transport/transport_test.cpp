// The UCX transport between real processes: a transport_peer child owns a
// slab filled with a seeded pattern; this process connects, reads blocks and
// checks every byte, over shared memory and over TCP (UCX_TLS is set before
// UCX starts in this process and is inherited by the child; ctest runs each
// test in its own process).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/transport/remote_slab.h"
#include "agent/transport/ucx_allocator.h"
#include "agent/transport/ucx_transport.h"
#include "tests/integration/transport/transport_pattern.h"
#include "tests/support/agent_process.h"

namespace {

using namespace std::chrono_literals;
using ::tandem::StatusCode;
using ::tandem::testing::ChildProcess;
using ::tandem::testing::fillBlockPattern;
using ::tandem::transport::BlockPair;
using ::tandem::transport::Clock;
using ::tandem::transport::LocalSlab;
using ::tandem::transport::ReadResult;
using ::tandem::transport::RemoteSlab;
using ::tandem::transport::UcxContext;
using ::tandem::transport::UcxContextOptions;
using ::tandem::transport::UcxPeer;
using ::tandem::transport::UcxSlabAllocator;

constexpr int64_t kRemoteBlocks = 64;
constexpr int64_t kLocalBlocks = 80;
constexpr uint64_t kBlockBytes = 16 * 1024;
constexpr uint64_t kSeed = 20240611;

class TransportTest : public ::testing::Test {
 protected:
  // Selects the UCX transports for this process and the peer it starts.
  void useTransports(const char* tls, const UcxContextOptions& options = {}) {
    ASSERT_EQ(::setenv("UCX_TLS", tls, 1), 0);
    context_ = UcxContext::create(options);
    allocator_ = std::make_unique<UcxSlabAllocator>(context_);
    ASSERT_NE(allocator_->allocate(kLocalBlocks * kBlockBytes), nullptr);
    auto local = allocator_->localSlab(kBlockBytes);
    ASSERT_TRUE(local.isOk()) << local.status().toString();
    local_ = *local;
  }

  // Starts the owner process and returns the slab it advertises.
  RemoteSlab startPeer() {
    peer_process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{std::string(TANDEM_TEST_BIN_DIR) + "/transport_peer", "--blocks",
                                 std::to_string(kRemoteBlocks), "--block-bytes",
                                 std::to_string(kBlockBytes), "--seed", std::to_string(kSeed),
                                 "--lifetime-s", "120"},
        temp_.path() / "peer.stderr");
    std::string line = peer_process_->waitForLine("slab: ", 30s);
    EXPECT_FALSE(line.empty()) << "peer printed no slab line; stderr:\n"
                               << peer_process_->stderrText();
    auto slab = RemoteSlab::parse(line.substr(line.find(' ') + 1));
    EXPECT_TRUE(slab.isOk()) << slab.status().toString();
    return slab.isOk() ? *slab : RemoteSlab{};
  }

  std::shared_ptr<UcxPeer> connect(const RemoteSlab& slab) {
    auto peer = context_->connect(slab, Clock::now() + 20s);
    EXPECT_TRUE(peer.isOk()) << peer.status().toString() << "\npeer stderr:\n"
                             << peer_process_->stderrText();
    return peer.isOk() ? *peer : nullptr;
  }

  const uint8_t* localBlock(int64_t block) const { return local_.base + block * kBlockBytes; }

  // Local block `local_block` holds the peer's block `remote_block`, byte for byte.
  ::testing::AssertionResult holdsRemoteBlock(int64_t local_block, int64_t remote_block) const {
    std::vector<uint8_t> expected(kBlockBytes);
    fillBlockPattern(kSeed, remote_block, kBlockBytes, expected.data());
    if (std::memcmp(localBlock(local_block), expected.data(), kBlockBytes) == 0) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "local block " << local_block << " differs from remote block " << remote_block;
  }

  ::testing::AssertionResult isZero(int64_t local_block) const {
    const uint8_t* data = localBlock(local_block);
    for (uint64_t i = 0; i < kBlockBytes; ++i) {
      if (data[i] != 0) {
        return ::testing::AssertionFailure()
               << "local block " << local_block << " was written at byte " << i;
      }
    }
    return ::testing::AssertionSuccess();
  }

  void readsContiguousAndScatteredBlocks() {
    auto peer = connect(startPeer());
    ASSERT_NE(peer, nullptr);

    // 16 consecutive blocks into 16 consecutive blocks: one operation.
    std::vector<BlockPair> contiguous;
    for (int i = 0; i < 16; ++i) contiguous.push_back({i + 3, i + 10});
    ReadResult result = peer->readBlocks(local_, contiguous, Clock::now() + 20s);
    ASSERT_TRUE(result.status.isOk()) << result.status.toString();
    EXPECT_EQ(result.num_operations, 1);
    EXPECT_EQ(result.bytes_read, 16 * kBlockBytes);
    EXPECT_TRUE(result.failed_local_blocks.empty());
    for (int i = 0; i < 16; ++i) EXPECT_TRUE(holdsRemoteBlock(i + 10, i + 3));

    // Scattered and unordered: runs {40,41}->{30,31}, {7,8,9}->{60,61,62},
    // and singles 63->0, 20->79, 21->50 (remote consecutive, local not).
    std::vector<BlockPair> scattered = {{8, 61}, {63, 0},  {41, 31}, {20, 79},
                                        {7, 60}, {21, 50}, {9, 62},  {40, 30}};
    result = peer->readBlocks(local_, scattered, Clock::now() + 20s);
    ASSERT_TRUE(result.status.isOk()) << result.status.toString();
    EXPECT_EQ(result.num_operations, 5);
    EXPECT_EQ(result.bytes_read, scattered.size() * kBlockBytes);
    for (const BlockPair& pair : scattered) {
      EXPECT_TRUE(holdsRemoteBlock(pair.local_block, pair.remote_block));
    }
    // Blocks nobody asked for are untouched.
    for (int64_t block : {1, 9, 26, 29, 32, 49, 51, 59, 63, 78}) EXPECT_TRUE(isZero(block));
  }

  void notificationReachesOwner() {
    auto peer = connect(startPeer());
    ASSERT_NE(peer, nullptr);
    ASSERT_TRUE(peer->notify("transfer 7 done: free 3 4 5", Clock::now() + 10s).isOk());
    EXPECT_EQ(peer_process_->waitForLine("message: ", 10s), "message: transfer 7 done: free 3 4 5");
    ASSERT_TRUE(peer->notify("done", Clock::now() + 10s).isOk());
    EXPECT_EQ(peer_process_->waitForLine("message: ", 10s), "message: done");
    EXPECT_EQ(peer_process_->wait(10s), 0) << peer_process_->stderrText();
  }

  // Over TCP the first read after the owner dies fails. Over shared memory
  // the owner's slab stays mapped here, so reads keep returning the bytes it
  // held until UCX keepalive (1 s by default) notices the death; from then on
  // every call fails at once.
  void deadPeerFailsWithinDeadline(bool first_read_fails) {
    auto peer = connect(startPeer());
    ASSERT_NE(peer, nullptr);
    peer_process_->signal(SIGKILL);
    ASSERT_EQ(peer_process_->wait(10s), 128 + SIGKILL);

    std::vector<BlockPair> pairs;
    for (int i = 0; i < 8; ++i) pairs.push_back({i, i});
    pairs.push_back({30, 40});
    const auto give_up = Clock::now() + 20s;
    int reads = 0;
    ReadResult result;
    do {
      const auto start = Clock::now();
      result = peer->readBlocks(local_, pairs, start + 5s);
      ++reads;
      // No call outlives its deadline by more than the bounded forced close.
      ASSERT_LT(Clock::now() - start, 5s + 5s) << result.status.toString();
      if (result.status.isOk()) {
        for (const BlockPair& pair : pairs) {
          ASSERT_TRUE(holdsRemoteBlock(pair.local_block, pair.remote_block));
        }
      }
    } while (result.status.isOk() && Clock::now() < give_up);

    ASSERT_FALSE(result.status.isOk()) << "reads still succeed 20 s after the owner died";
    if (first_read_fails) {
      EXPECT_EQ(reads, 1);
    }
    EXPECT_TRUE(result.status.code() == StatusCode::kUnavailable ||
                result.status.code() == StatusCode::kDeadlineExceeded)
        << result.status.toString();
    // Every local block is reported failed or holds the owner's bytes: over
    // shared memory a read racing keepalive's verdict may finish its first
    // run (blocks 0..7) and fail the next; over TCP nothing is read.
    const auto& failed = result.failed_local_blocks;
    EXPECT_FALSE(failed.empty()) << result.status.toString();
    if (first_read_fails) {
      EXPECT_EQ(failed.size(), pairs.size()) << result.status.toString();
    }
    for (const BlockPair& pair : pairs) {
      if (!std::binary_search(failed.begin(), failed.end(), pair.local_block)) {
        EXPECT_TRUE(holdsRemoteBlock(pair.local_block, pair.remote_block))
            << "block " << pair.local_block << " is neither reported failed nor the owner's";
      }
    }
    EXPECT_FALSE(peer->health().isOk());
    // The peer stays failed: later calls fail at once.
    result = peer->readBlocks(local_, pairs, Clock::now() + 5s);
    EXPECT_EQ(result.status.code(), StatusCode::kUnavailable) << result.status.toString();
    EXPECT_EQ(peer->notify("anyone?", Clock::now() + 1s).code(), StatusCode::kUnavailable);
  }

  ::tandem::testing::TempDir temp_{"tandem-transport-test"};
  std::shared_ptr<UcxContext> context_;
  std::unique_ptr<UcxSlabAllocator> allocator_;
  LocalSlab local_;
  std::unique_ptr<ChildProcess> peer_process_;
};

TEST_F(TransportTest, ReadsContiguousAndScatteredBlocksOverSharedMemory) {
  useTransports("sm");
  readsContiguousAndScatteredBlocks();
}

TEST_F(TransportTest, ReadsContiguousAndScatteredBlocksOverTcp) {
  useTransports("tcp");
  readsContiguousAndScatteredBlocks();
}

long minorFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Over shared memory the peer's slab is mapped here: reading a page for the
// first time faults, unless connect populated the mapping.
TEST_F(TransportTest, PrefaultedPeerMemoryReadsWithoutPageFaultsOverSharedMemory) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer shadow memory takes page faults of its own";
#endif
  UcxContextOptions prefault;
  prefault.prefault_bytes = uint64_t{1} << 30;
  useTransports("sm", prefault);
  const RemoteSlab slab = startPeer();
  std::vector<BlockPair> all;
  for (int i = 0; i < kRemoteBlocks; ++i) all.push_back({i, i});
  const long slab_pages = kRemoteBlocks * kBlockBytes / ::sysconf(_SC_PAGESIZE);

  auto peer = connect(slab);
  ASSERT_NE(peer, nullptr);
  long before = minorFaults();
  ReadResult result = peer->readBlocks(local_, all, Clock::now() + 20s);
  const long prefaulted = minorFaults() - before;
  ASSERT_TRUE(result.status.isOk()) << result.status.toString();
  for (int i = 0; i < kRemoteBlocks; ++i) EXPECT_TRUE(holdsRemoteBlock(i, i));

  // The same read through a second context that does not prefault, into
  // the same (already touched) local slab.
  auto plain_context = UcxContext::create();
  auto plain = plain_context->connect(slab, Clock::now() + 20s);
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  LocalSlab unregistered = local_;
  unregistered.memory_handle = nullptr;  // belongs to the other context
  before = minorFaults();
  result = (*plain)->readBlocks(unregistered, all, Clock::now() + 20s);
  const long faulted = minorFaults() - before;
  ASSERT_TRUE(result.status.isOk()) << result.status.toString();

  RecordProperty("minor_faults_prefaulted", static_cast<int>(prefaulted));
  RecordProperty("minor_faults_plain", static_cast<int>(faulted));
  EXPECT_LT(prefaulted, slab_pages / 4) << "faulted " << faulted << " without prefault";
  EXPECT_GT(faulted, slab_pages / 2) << "prefaulted " << prefaulted;
}

TEST_F(TransportTest, NotificationReachesOwnerOverSharedMemory) {
  useTransports("sm");
  notificationReachesOwner();
}

TEST_F(TransportTest, NotificationReachesOwnerOverTcp) {
  useTransports("tcp");
  notificationReachesOwner();
}

TEST_F(TransportTest, DeadPeerFailsWithinDeadlineOverSharedMemory) {
  useTransports("sm");
  deadPeerFailsWithinDeadline(/*first_read_fails=*/false);
}

TEST_F(TransportTest, DeadPeerFailsWithinDeadlineOverTcp) {
  useTransports("tcp");
  deadPeerFailsWithinDeadline(/*first_read_fails=*/true);
}

// Agents read both ways (DESIGN: bi-directional P->D), and a handler may
// connect and notify from the progress thread it runs on.
TEST_F(TransportTest, OwnerConnectsBackFromItsMessageHandlerOverTcp) {
  useTransports("tcp");
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> received;
  context_->setMessageHandler([&](std::string message) {
    std::lock_guard lock(mutex);
    received.push_back(std::move(message));
    cv.notify_all();
  });
  auto peer = connect(startPeer());
  ASSERT_NE(peer, nullptr);
  auto own = allocator_->remoteSlab(kBlockBytes);
  ASSERT_TRUE(own.isOk()) << own.status().toString();
  ASSERT_TRUE(peer->notify("connect-back " + own->serialize(), Clock::now() + 10s).isOk());
  EXPECT_EQ(peer_process_->waitForLine("replied: ", 20s), "replied: pong")
      << peer_process_->stderrText();
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !received.empty(); }));
    EXPECT_EQ(received, std::vector<std::string>{"pong"});
  }
  EXPECT_EQ(context_->messagesReceived(), 1u);
  context_->setMessageHandler(nullptr);
}

// Over TCP UCX emulates reads with messages the owner's progress thread
// answers: an owner that stops answering makes the read miss its deadline,
// which closes the endpoint so that no late reply can land in local blocks.
TEST_F(TransportTest, StalledOwnerMakesReadsMissTheirDeadlineOverTcp) {
  useTransports("tcp");
  auto peer = connect(startPeer());
  ASSERT_NE(peer, nullptr);
  // The owner's notification handler blocks its progress thread on "stall".
  ASSERT_TRUE(peer->notify("stall", Clock::now() + 10s).isOk());
  ASSERT_EQ(peer_process_->waitForLine("message: ", 10s), "message: stall");

  std::vector<BlockPair> pairs = {{0, 0}, {1, 1}, {5, 9}};
  const auto start = Clock::now();
  ReadResult result = peer->readBlocks(local_, pairs, start + 1s);
  const auto elapsed = Clock::now() - start;

  EXPECT_EQ(result.status.code(), StatusCode::kDeadlineExceeded) << result.status.toString();
  EXPECT_NE(result.status.message().find("did not finish within the deadline"), std::string::npos)
      << result.status.message();
  EXPECT_GE(elapsed, 1s);
  EXPECT_LT(elapsed, 1s + 5s);
  EXPECT_EQ(result.num_operations, 2);
  EXPECT_EQ(result.failed_local_blocks, (std::vector<tandem::engine::BlockId>{0, 1, 9}));
  EXPECT_EQ(peer->health().code(), StatusCode::kUnavailable);
  // The endpoint is closed for good, and nothing landed in local blocks.
  result = peer->readBlocks(local_, pairs, Clock::now() + 5s);
  EXPECT_EQ(result.status.code(), StatusCode::kUnavailable);
  for (int64_t block : {0, 1, 9}) EXPECT_TRUE(isZero(block));
}

TEST_F(TransportTest, BadBlockIdsAndPastDeadlinesAreRefusedBeforeAnythingIsRead) {
  useTransports("sm");
  auto peer = connect(startPeer());
  ASSERT_NE(peer, nullptr);

  struct Case {
    std::vector<BlockPair> pairs;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{0, 0}, {1, 1}, {kRemoteBlocks, 2}}, "remote block id 64 is out of range"},
      {{{0, 0}, {-1, 1}}, "remote block id -1 is out of range"},
      {{{0, 0}, {2147483647, 1}}, "remote block id 2147483647 is out of range"},
      {{{0, 0}, {1, kLocalBlocks}}, "local block id 80 is out of range"},
      {{{0, 0}, {1, -3}}, "local block id -3 is out of range"},
      {{{0, 5}, {1, 5}}, "local block 5 is the destination of more than one read"},
  };
  for (const Case& c : cases) {
    ReadResult result = peer->readBlocks(local_, c.pairs, Clock::now() + 10s);
    EXPECT_EQ(result.status.code(), StatusCode::kInvalidArgument) << result.status.toString();
    EXPECT_NE(result.status.message().find(c.message), std::string::npos)
        << result.status.message();
    EXPECT_EQ(result.num_operations, 0);
    EXPECT_EQ(result.bytes_read, 0u);
    EXPECT_FALSE(result.failed_local_blocks.empty());
  }
  // A deadline already past: nothing is sent, the peer stays usable.
  std::vector<BlockPair> late = {{2, 2}, {3, 3}};
  ReadResult expired = peer->readBlocks(local_, late, Clock::now() - 1s);
  EXPECT_EQ(expired.status.code(), StatusCode::kDeadlineExceeded) << expired.status.toString();
  EXPECT_EQ(expired.num_operations, 0);
  EXPECT_EQ(expired.failed_local_blocks, (std::vector<tandem::engine::BlockId>{2, 3}));

  for (int64_t block = 0; block < kLocalBlocks; ++block) EXPECT_TRUE(isZero(block));
  // A refused call leaves the peer usable.
  EXPECT_TRUE(peer->health().isOk());
  std::vector<BlockPair> good = {{kRemoteBlocks - 1, kLocalBlocks - 1}};
  ReadResult result = peer->readBlocks(local_, good, Clock::now() + 10s);
  ASSERT_TRUE(result.status.isOk()) << result.status.toString();
  EXPECT_TRUE(holdsRemoteBlock(kLocalBlocks - 1, kRemoteBlocks - 1));
}

TEST_F(TransportTest, MismatchedBlockSizeIsRefused) {
  useTransports("sm");
  auto peer = connect(startPeer());
  ASSERT_NE(peer, nullptr);
  LocalSlab other = local_;
  other.block_bytes = kBlockBytes / 2;
  other.num_blocks = kLocalBlocks * 2;
  std::vector<BlockPair> pairs = {{0, 0}};
  ReadResult result = peer->readBlocks(other, pairs, Clock::now() + 10s);
  EXPECT_EQ(result.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status.message().find("local block size 8192 bytes differs from the peer's "
                                         "16384 bytes"),
            std::string::npos)
      << result.status.message();
  EXPECT_EQ(result.failed_local_blocks, std::vector<tandem::engine::BlockId>{0});
  EXPECT_TRUE(isZero(0));
}

TEST(RemoteSlabTest, SerializesToOneLineAndBack) {
  RemoteSlab slab;
  slab.worker_address = std::string("\x00\x01\xfe\xff:x", 6);
  slab.packed_rkey = "rkey";
  slab.base_address = 0x7f12345678a0;
  slab.block_bytes = 131072;
  slab.num_blocks = 4096;
  std::string text = slab.serialize();
  EXPECT_EQ(text, "ucx1:7f12345678a0:131072:4096:0001feff3a78:726b6579");
  auto parsed = RemoteSlab::parse(text);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
  EXPECT_EQ(*parsed, slab);
}

TEST(RemoteSlabTest, ParseSaysWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "must be 'ucx1:"},
      {"ucx2:10:4:4:00:00", "must be 'ucx1:"},
      {"ucx1:10:4:4:00", "got 5 ':'-separated fields"},
      {"ucx1:0:4:4:00:00", "base address must be non-zero hex, got '0'"},
      {"ucx1:zz:4:4:00:00", "base address must be non-zero hex, got 'zz'"},
      {"ucx1:10:0:4:00:00", "block size must be a positive integer, got '0'"},
      {"ucx1:10:4:-1:00:00", "block count must be between 1 and 2147483647, got '-1'"},
      {"ucx1:10:4:4294967296:00:00", "block count must be between 1 and 2147483647"},
      {"ucx1:ffffffffffffff00:4096:4:00:00", "overflows the address space"},
      {"ucx1:10:4:4:0:00", "worker address: hex string must have an even length"},
      {"ucx1:10:4:4:00:0g", "rkey: hex string has a non-hex character at position 1"},
      {"ucx1:10:4:4::00", "must not be empty"},
  };
  for (const auto& [text, message] : cases) {
    auto parsed = RemoteSlab::parse(text);
    ASSERT_FALSE(parsed.isOk()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(message), std::string::npos)
        << text << " -> " << parsed.status().message();
  }
}

// Sets an environment variable for a scope, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Pages of [data, data + bytes) resident in memory (mincore).
size_t residentPages(const void* data, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
  std::vector<unsigned char> resident((end - start + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(start), end - start, resident.data()) != 0) return 0;
  size_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

TEST(UcxSlabAllocatorTest, GivesZeroedRegisteredMemoryOneSlabAtATime) {
  ASSERT_EQ(::setenv("UCX_TLS", "sm", 1), 0);
  ASSERT_EQ(::unsetenv("UCX_ALLOC_PRIO"), 0);
  auto context = UcxContext::create();
  // The context chose the allocation methods: the slab is committed, not
  // written.
  EXPECT_TRUE(context->allocationsAreFresh());
  UcxSlabAllocator allocator(context);
  EXPECT_EQ(allocator.localSlab(4096).status().code(), StatusCode::kFailedPrecondition);
  constexpr size_t kBytes = 10 * 4096 + 100;
  auto* data = static_cast<uint8_t*>(allocator.allocate(kBytes));
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 64, 0u);
  // Committed: every page is in memory before anything touched it.
  EXPECT_EQ(residentPages(data, kBytes), 11u);
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(data[i], 0) << "byte " << i;
  EXPECT_EQ(allocator.allocate(4096), nullptr);
  EXPECT_FALSE(allocator.packedRkey().empty());

  auto remote = allocator.remoteSlab(4096);
  ASSERT_TRUE(remote.isOk()) << remote.status().toString();
  EXPECT_EQ(remote->num_blocks, 10);
  EXPECT_EQ(remote->base_address, reinterpret_cast<uint64_t>(data));
  EXPECT_EQ(remote->worker_address, context->workerAddress());
  EXPECT_EQ(allocator.remoteSlab(kBytes + 1).status().code(), StatusCode::kInvalidArgument);
  allocator.release(data, kBytes);
  EXPECT_EQ(allocator.base(), nullptr);
}

TEST(UcxSlabAllocatorTest, ZeroesMemoryFromMethodsTheEnvironmentChose) {
  ASSERT_EQ(::setenv("UCX_TLS", "sm", 1), 0);
  std::shared_ptr<UcxContext> context;
  {
    // "heap" is posix_memalign: it may hand back memory freed just before.
    ScopedEnv heap("UCX_ALLOC_PRIO", "heap");
    context = UcxContext::create();
  }
  EXPECT_FALSE(context->allocationsAreFresh());
  constexpr size_t kBytes = 6 * 4096;
  for (int round = 0; round < 4; ++round) {
    void* dirty = nullptr;
    ASSERT_EQ(::posix_memalign(&dirty, 64, kBytes), 0);
    std::memset(dirty, 0xAB, kBytes);
    std::free(dirty);
    UcxSlabAllocator allocator(context);
    auto* data = static_cast<uint8_t*>(allocator.allocate(kBytes));
    ASSERT_NE(data, nullptr);
    for (size_t i = 0; i < kBytes; ++i)
      ASSERT_EQ(data[i], 0) << "round " << round << ", byte " << i;
    allocator.release(data, kBytes);
  }
}

TEST(UcxSlabAllocatorTest, SuppliesTheKvCacheSlab) {
  ASSERT_EQ(::setenv("UCX_TLS", "sm", 1), 0);
  auto context = UcxContext::create();
  tandem::engine::KvCacheConfig config;
  config.num_blocks = 12;
  config.num_layers = 2;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  tandem::engine::KvCache cache(config, std::make_unique<UcxSlabAllocator>(context));
  const auto& allocator = dynamic_cast<const UcxSlabAllocator&>(cache.allocator());
  EXPECT_EQ(allocator.name(), "ucx");
  EXPECT_EQ(allocator.base(), cache.slab());
  auto local = allocator.localSlab(cache.blockBytes());
  ASSERT_TRUE(local.isOk()) << local.status().toString();
  EXPECT_EQ(local->num_blocks, cache.numBlocks());
  EXPECT_EQ(local->base, cache.slab());
  EXPECT_NE(local->memory_handle, nullptr);
}

}  // namespace
