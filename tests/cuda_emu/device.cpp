// The CUDA emulator's device side: blocks of fibers (device.h says how a
// kernel runs here and where that differs from a GPU).
#include "tests/cuda_emu/device.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda_emu/emulator.h"
#include "tests/cuda_emu/instructions.h"

namespace tandem::cuda_emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarpSize = 32;
constexpr size_t kMaxExchangeBytes = 64;

enum class Wait { kRunning, kBarrier, kWarp, kMbarrier, kDone };

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
  size_t src_bytes;
};

// A fiber's saved context. On x86-64 a switch saves the callee-saved
// registers on the fiber's own stack (a few nanoseconds; no kernel changes
// the floating-point control words, so they are not switched); elsewhere ucontext, whose switches
// also save the signal mask, a system call each.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
extern "C" void tandem_cuda_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl tandem_cuda_emu_switch
  .type tandem_cuda_emu_switch, @function
tandem_cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tandem_cuda_emu_switch, .-tandem_cuda_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
void switchContext(Context& from, Context& to) { tandem_cuda_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t context;
};
void switchContext(Context& from, Context& to) { swapcontext(&from.context, &to.context); }
#endif

// A wgmma issued by one thread: its part of the warpgroup's accumulator.
struct WarpgroupMma {
  float* d = nullptr;
  int n = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};

// A tensor copy issued and not landed yet.
struct TensorCopy {
  uint32_t dst = 0;  // shared offset
  TensorMapFields map;
  int32_t column = 0;
  int32_t row = 0;
};

// An mbarrier's state (device.h).
struct Barrier {
  uint32_t expected = 0;
  uint32_t pending = 0;
  int64_t bytes = 0;  // transaction bytes announced and not landed
  uint32_t phase = 0;
  std::vector<TensorCopy> landing;  // issued, to land at the next wait
};

// A thread's asynchronous operations of one kind (cp.async, wgmma) in
// commit groups: those issued since the last commit, then the committed
// groups, oldest first.
template <typename Operation>
struct CommitGroups {
  std::vector<Operation> open;
  std::deque<std::vector<Operation>> committed;

  void commit() {
    committed.push_back(std::move(open));
    open.clear();
  }
  // Completes (`done` on each, in issue order) the oldest groups until at
  // most `pending` are left.
  template <typename Done>
  void wait(int pending, Done done) {
    while (committed.size() > static_cast<size_t>(pending)) {
      for (const Operation& operation : committed.front()) done(operation);
      committed.pop_front();
    }
  }
  bool empty() const { return open.empty() && committed.empty(); }
  void clear() {
    open.clear();
    committed.clear();
  }
};

struct Fiber {
  Context context;
  void* stack = nullptr;
  ThreadIndex index;
  int warp = 0;
  int lane = 0;
  Wait wait = Wait::kRunning;
  uint32_t barrier = 0;             // the mbarrier waited on (Wait::kMbarrier)
  CommitGroups<Copy> copies;        // cp.async
  CommitGroups<WarpgroupMma> mmas;  // wgmma
};

struct Warp {
  int lanes = 0;  // threads of the block in this warp
  int live = 0;   // not exited
  int arrived = 0;
  Combine combine = nullptr;
  const char* what = nullptr;
  size_t in_bytes = 0;
  alignas(16) unsigned char in[kWarpSize * kMaxExchangeBytes];
  alignas(16) unsigned char out[kWarpSize * kMaxExchangeBytes];
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0;
  int at_barrier = 0;
  const char* barrier_file = nullptr;  // where the threads at the barrier wait
  unsigned barrier_line = 0;
  Context scheduler;
  Fiber* running = nullptr;
  bool descending = false;  // the order fibers take turns in
  void (*run_thread)(const void*) = nullptr;
  const void* call = nullptr;
  void* dynamic_shared = nullptr;
  size_t dynamic_bytes = 0;
  std::vector<const void*> shared_seen;  // static __shared__ objects this block has reached
  std::map<uint32_t, Barrier> barriers;  // by shared offset, initialized in this block
};

Block* g_block = nullptr;

// Fiber stacks, kept from launch to launch: mapped once, never touched
// beyond what the kernels use.
std::vector<void*>& stacks() {
  static auto* all = new std::vector<void*>;
  return *all;
}

void* stackFor(size_t thread) {
  auto& all = stacks();
  while (all.size() <= thread) {
    void* stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED) fault("cannot map a fiber stack of %zu bytes", kStackBytes);
    // A guard page at the bottom: an overflow faults instead of writing
    // into the next fiber's stack.
    if (mprotect(stack, 4096, PROT_NONE) != 0) fault("cannot protect a fiber stack's guard page");
    all.push_back(stack);
  }
  return all[thread];
}

Fiber& current() {
  if (g_block == nullptr || g_block->running == nullptr) {
    fault("a device function was called outside a kernel");
  }
  return *g_block->running;
}

// The next fiber that can run: first the other lanes of `from`'s warp, then
// the following warps, in the block's order and around; nullptr when none
// can. So a warp runs from one __syncthreads to the next before the next
// warp starts, and in one of the two orders any write and read by two warps
// that no barrier orders happen in the wrong order.
Fiber* nextRunnable(Block& block, const Fiber& from) {
  const size_t n = block.fibers.size();
  const size_t at = static_cast<size_t>(&from - block.fibers.data());
  const size_t first_lane = at / kWarpSize * kWarpSize;
  const size_t lanes = std::min<size_t>(kWarpSize, n - first_lane);
  for (size_t i = 1; i < lanes; ++i) {
    const size_t lane = at - first_lane;
    Fiber& fiber = block.fibers[first_lane + (block.descending ? (lane + lanes - i) % lanes
                                                               : (lane + i) % lanes)];
    if (fiber.wait == Wait::kRunning) return &fiber;
  }
  for (size_t i = 1; i <= n; ++i) {
    Fiber& fiber = block.fibers[block.descending ? (at + n - i) % n : (at + i) % n];
    if (fiber.wait == Wait::kRunning) return &fiber;
  }
  return nullptr;
}

// Hands the host thread to the next fiber that can run (straight, one
// switch), or to the scheduler when none can; returns once this fiber is
// resumed.
void passTurn(Fiber& fiber) {
  Block& block = *g_block;
  Fiber* next = nextRunnable(block, fiber);
  if (next == nullptr) {
    switchContext(fiber.context, block.scheduler);
  } else {
    block.running = next;
    switchContext(fiber.context, next->context);
  }
}

void releaseBarrier(Block& block) {
  for (Fiber& fiber : block.fibers) {
    if (fiber.wait == Wait::kBarrier) fiber.wait = Wait::kRunning;
  }
  block.at_barrier = 0;
}

void completeExchange(Block& block, Warp& warp, int warp_index) {
  if (warp.live != warp.lanes) {
    fault(
        "%s in warp %d of block (%u, %u, %u): %d of its %d threads have exited (a warp-wide "
        "instruction needs every lane)",
        warp.what, warp_index, block.fibers[0].index.block.x, block.fibers[0].index.block.y,
        block.fibers[0].index.block.z, warp.lanes - warp.live, warp.lanes);
  }
  warp.combine(warp.in, warp.out, warp.lanes);
  for (int lane = 0; lane < warp.lanes; ++lane) {
    block.fibers[static_cast<size_t>(warp_index * kWarpSize + lane)].wait = Wait::kRunning;
  }
  warp.arrived = 0;
  warp.combine = nullptr;
}

void threadMain() {
  Block& block = *g_block;
  block.run_thread(block.call);
  Fiber& fiber = *block.running;
  fiber.wait = Wait::kDone;
  fiber.copies.clear();  // copies never waited for land nowhere observable
  if (!fiber.mmas.empty()) {
    fault("thread %u of block (%u, %u, %u) exited with wgmma not waited for", fiber.index.thread.x,
          fiber.index.block.x, fiber.index.block.y, fiber.index.block.z);
  }
  --block.live;
  Warp& warp = block.warps[static_cast<size_t>(fiber.warp)];
  --warp.live;
  if (warp.arrived > 0) {
    fault("thread %u of block (%u, %u, %u) exited while its warp waits at %s", fiber.index.thread.x,
          fiber.index.block.x, fiber.index.block.y, fiber.index.block.z, warp.what);
  }
  if (block.at_barrier > 0 && block.at_barrier == block.live) releaseBarrier(block);
}

// A fiber's first frame: the thread, then back to the scheduler for good.
[[noreturn]] void fiberEntry() {
  threadMain();
  passTurn(*g_block->running);
  fault("an exited fiber was resumed");
}

std::string describeWaits(const Block& block) {
  int barrier = 0, warp = 0, done = 0;
  std::map<uint32_t, int> mbarriers;
  std::string ops;
  for (const Fiber& fiber : block.fibers) {
    if (fiber.wait == Wait::kBarrier) ++barrier;
    if (fiber.wait == Wait::kMbarrier) ++mbarriers[fiber.barrier];
    if (fiber.wait == Wait::kDone) ++done;
    if (fiber.wait == Wait::kWarp) {
      ++warp;
      const Warp& w = block.warps[static_cast<size_t>(fiber.warp)];
      if (fiber.lane == 0 || ops.empty()) {
        ops += " warp " + std::to_string(fiber.warp) + " at " + w.what + " (" +
               std::to_string(w.arrived) + " of " + std::to_string(w.live) + " lanes);";
      }
    }
  }
  for (const auto& [offset, threads] : mbarriers) {
    const auto state = block.barriers.find(offset);
    char text[160];
    std::snprintf(text, sizeof text, " %d at the mbarrier at shared byte %u", threads, offset);
    ops += text;
    if (state != block.barriers.end()) {
      std::snprintf(text, sizeof text, " (phase %u, %u arrivals and %lld bytes to come);",
                    state->second.phase, state->second.pending,
                    static_cast<long long>(state->second.bytes));
      ops += text;
    }
  }
  return std::to_string(barrier) + " threads at __syncthreads, " + std::to_string(warp) +
         " at warp-wide instructions," + ops + " " + std::to_string(done) + " exited";
}

void runBlock(Block& block, bool descending) {
  block.descending = descending;
  block.running = descending ? &block.fibers.back() : &block.fibers.front();
  switchContext(block.scheduler, block.running->context);
  // Back when no fiber can run: all have exited, or they wait for each other.
  block.running = nullptr;
  for (const Fiber& fiber : block.fibers) {
    if (fiber.wait != Wait::kDone) {
      const ThreadIndex& index = block.fibers[0].index;
      fault("block (%u, %u, %u) cannot go on: %s", index.block.x, index.block.y, index.block.z,
            describeWaits(block).c_str());
    }
  }
}

#if defined(__x86_64__)
// The stack tandem_cuda_emu_switch would have left: six registers, then
// the return address (fiberEntry, entered with the
// stack aligned as after a call).
void prepareFiber(Fiber& fiber, Block&) {
  // Stack tops staggered by a few cache lines, so that the fibers' top
  // frames do not all fall in the same cache sets.
  const size_t stagger = (static_cast<size_t>(fiber.warp) * 32 + fiber.lane) % 64 * 80 / 16 * 16;
  auto* top = reinterpret_cast<uint64_t*>(static_cast<char*>(fiber.stack) + kStackBytes - stagger);
  uint64_t* sp = top - 2;  // 16-byte aligned
  *--sp = 0;               // fiberEntry's (never used) return address
  *--sp = reinterpret_cast<uint64_t>(&fiberEntry);
  for (int r = 0; r < 6; ++r) *--sp = 0;
  fiber.context.sp = sp;
}
#else
// Out of line: getcontext returns twice, which would make the caller's
// loop variables clobberable.
[[gnu::noinline]] void prepareFiber(Fiber& fiber, Block& block) {
  getcontext(&fiber.context.context);
  fiber.context.context.uc_stack.ss_sp = fiber.stack;
  fiber.context.context.uc_stack.ss_size = kStackBytes;
  fiber.context.context.uc_link = nullptr;
  makecontext(&fiber.context.context, reinterpret_cast<void (*)()>(&fiberEntry), 0);
}
#endif

const char* checkShape(const void* kernel, const LaunchShape& shape, cudaError_t* error) {
  const uint64_t threads = static_cast<uint64_t>(shape.block.x) * shape.block.y * shape.block.z;
  *error = cudaErrorInvalidConfiguration;
  if (threads == 0 || threads > 1024 || shape.block.z > 64)
    return "block of more than 1024 threads";
  if (shape.grid.x == 0 || shape.grid.y == 0 || shape.grid.z == 0) return "empty grid";
  if (shape.grid.y > 65535 || shape.grid.z > 65535) return "grid y or z above 65535";
  *error = cudaErrorInvalidValue;
  if (shape.shared_bytes > maxDynamicShared(kernel))
    return "more dynamic shared memory than allowed";
  *error = cudaSuccess;
  return nullptr;
}

void runGrid(const LaunchShape& shape, void (*run_thread)(const void*), const void* call) {
  countKernel(shape.shared_bytes);
  const size_t threads = static_cast<size_t>(shape.block.x) * shape.block.y * shape.block.z;
  // Shared memory starts as whatever was there: all ones (NaN as bf16 or f32).
  std::unique_ptr<unsigned char[]> shared(new unsigned char[shape.shared_bytes + 128]);
  void* dynamic = shared.get() + (128 - reinterpret_cast<uintptr_t>(shared.get()) % 128);
  Block block;
  block.fibers.resize(threads);
  block.warps.resize((threads + kWarpSize - 1) / kWarpSize);
  block.run_thread = run_thread;
  block.call = call;
  block.dynamic_shared = dynamic;
  block.dynamic_bytes = shape.shared_bytes;
  Block* outer = g_block;
  g_block = &block;
  uint64_t linear = 0;
  for (unsigned z = 0; z < shape.grid.z; ++z) {
    for (unsigned y = 0; y < shape.grid.y; ++y) {
      for (unsigned x = 0; x < shape.grid.x; ++x, ++linear) {
        std::memset(dynamic, 0xff, shape.shared_bytes);
        block.shared_seen.clear();
        block.barriers.clear();
        block.live = static_cast<int>(threads);
        block.at_barrier = 0;
        for (size_t w = 0; w < block.warps.size(); ++w) {
          Warp& warp = block.warps[w];
          warp.lanes = static_cast<int>(std::min<size_t>(kWarpSize, threads - w * kWarpSize));
          warp.live = warp.lanes;
          warp.arrived = 0;
          warp.combine = nullptr;
        }
        for (size_t t = 0; t < threads; ++t) {
          Fiber& fiber = block.fibers[t];
          fiber.index.thread = {static_cast<unsigned>(t % shape.block.x),
                                static_cast<unsigned>(t / shape.block.x % shape.block.y),
                                static_cast<unsigned>(t / shape.block.x / shape.block.y)};
          fiber.index.block = {x, y, z};
          fiber.index.block_dim = shape.block;
          fiber.index.grid_dim = shape.grid;
          fiber.warp = static_cast<int>(t / kWarpSize);
          fiber.lane = static_cast<int>(t % kWarpSize);
          fiber.wait = Wait::kRunning;
          fiber.stack = stackFor(t);
          prepareFiber(fiber, block);
        }
        runBlock(block, linear % 2 == 1);
      }
    }
  }
  g_block = outer;
}

}  // namespace

[[noreturn]] void fault(const char* format, ...) {
  std::fprintf(stderr, "CUDA emulator: ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fprintf(stderr, "\n");
  std::abort();
}

const ThreadIndex& here() { return current().index; }

void requireFullMask(unsigned mask, const char* what) {
  if (mask != 0xffffffffu)
    fault("%s with mask %#x: the emulator takes full-warp masks only", what, mask);
}

void syncThreads(const char* file, unsigned line) {
  Fiber& fiber = current();
  Block& block = *g_block;
  if (block.at_barrier == 0) {
    block.barrier_file = file;
    block.barrier_line = line;
  } else if (block.barrier_line != line || std::strcmp(block.barrier_file, file) != 0) {
    fault(
        "thread %u of block (%u, %u, %u) reached __syncthreads at %s:%u while others wait at "
        "%s:%u",
        fiber.index.thread.x, fiber.index.block.x, fiber.index.block.y, fiber.index.block.z, file,
        line, block.barrier_file, block.barrier_line);
  }
  if (block.warps[static_cast<size_t>(fiber.warp)].arrived > 0) {
    fault("thread %u reached __syncthreads while its warp waits at %s", fiber.index.thread.x,
          block.warps[static_cast<size_t>(fiber.warp)].what);
  }
  fiber.wait = Wait::kBarrier;
  if (++block.at_barrier == block.live) {
    releaseBarrier(block);
    return;
  }
  passTurn(fiber);
}

void warpExchange(const void* in, size_t in_bytes, void* out, size_t out_bytes, Combine combine,
                  const char* what) {
  if (in_bytes > kMaxExchangeBytes || out_bytes > kMaxExchangeBytes) {
    fault("%s exchanges more than %zu bytes per lane", what, kMaxExchangeBytes);
  }
  Fiber& fiber = current();
  Block& block = *g_block;
  Warp& warp = block.warps[static_cast<size_t>(fiber.warp)];
  if (warp.arrived == 0) {
    warp.combine = combine;
    warp.what = what;
    warp.in_bytes = in_bytes;
  } else if (warp.combine != combine || warp.in_bytes != in_bytes) {
    fault("the lanes of warp %d diverged: lane %d at %s while others wait at %s", fiber.warp,
          fiber.lane, what, warp.what);
  }
  std::memcpy(warp.in + static_cast<size_t>(fiber.lane) * in_bytes, in, in_bytes);
  fiber.wait = Wait::kWarp;
  if (++warp.arrived == warp.live) {
    completeExchange(block, warp, fiber.warp);
  } else {
    passTurn(fiber);
  }
  std::memcpy(out, warp.out + static_cast<size_t>(fiber.lane) * out_bytes, out_bytes);
}

void syncWarp() {
  const char nothing = 0;
  char out = 0;
  warpExchange(
      &nothing, 1, &out, 1, [](const void*, void*, int) {}, "__syncwarp");
}

void landCopy(const Copy& copy) {
  std::memcpy(copy.dst, copy.src, copy.src_bytes);
  std::memset(static_cast<unsigned char*>(copy.dst) + copy.src_bytes, 0,
              copy.bytes - copy.src_bytes);
}

void asyncCopy(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  Fiber& fiber = current();
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
      (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % bytes != 0)) {
    fault("cp.async of %zu bytes from %p to %p: both must be %zu-byte aligned", bytes, src, dst,
          bytes);
  }
  // The two ends of what the PTX ISA allows: a copy lands when its thread
  // waits for it (even blocks) or at once (odd blocks), so a read of a stage
  // before the wait, and a refill of a stage other warps still read, each
  // go wrong in one of the two.
  if (g_block->descending) {
    landCopy({dst, src, bytes, src_bytes});
  } else {
    fiber.copies.open.push_back({dst, src, bytes, src_bytes});
  }
}

void asyncCommit() {
  Fiber& fiber = current();
  fiber.copies.commit();
}

void asyncWait(int pending_groups) {
  Fiber& fiber = current();
  fiber.copies.wait(pending_groups, landCopy);
}

void sharedVariable(void* object, size_t bytes) {
  Block& block = *g_block;
  current();
  if (std::find(block.shared_seen.begin(), block.shared_seen.end(), object) !=
      block.shared_seen.end()) {
    return;
  }
  block.shared_seen.push_back(object);
  std::memset(object, 0xff, bytes);
}

void* dynamicSharedMemory() {
  current();
  return g_block->dynamic_shared;
}

void submitKernel(const void* kernel, const LaunchShape& shape,
                  void (*run_thread)(const void* call), std::shared_ptr<const void> call) {
  cudaError_t error;
  if (const char* why = checkShape(kernel, shape, &error)) {
    std::fprintf(stderr,
                 "CUDA emulator: launch refused: %s (grid %u x %u x %u, block %u x %u x %u, "
                 "%zu bytes of shared memory)\n",
                 why, shape.grid.x, shape.grid.y, shape.grid.z, shape.block.x, shape.block.y,
                 shape.block.z, shape.shared_bytes);
    setLastError(error);
    return;
  }
  enqueue(shape.stream, [shape, run_thread, call] { runGrid(shape, run_thread, call.get()); });
}

// One output of a k16 tensor-core step, as this emulator computes it: the
// accumulator, then the 16 products in ascending k, added in double and
// rounded once (products of bf16 are exact in double). `b` steps by
// `b_stride` from one k to the next.
float tensorCoreDot(float c, const double* a, const double* b, int b_stride) {
  double sum = c;
  for (int k = 0; k < 16; ++k) sum += a[k] * b[k * b_stride];
  return static_cast<float>(sum);
}

double bf16Value(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, 4);
  return f;
}

void mmaM16N8K16Bf16(float acc[4], const uint32_t a[4], const uint32_t b[2]) {
  struct Fragments {
    uint32_t a[4];
    uint32_t b[2];
    float c[4];
  };
  Fragments in;
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, acc, sizeof(in.c));
  warpExchange(
      &in, sizeof(in), acc, 4 * sizeof(float),
      [](const void* inputs, void* outputs, int warp_lanes) {
        if (warp_lanes != kWarpSize) fault("mma.sync in a warp of %d lanes", warp_lanes);
        const auto* lanes = static_cast<const Fragments*>(inputs);
        auto* d = static_cast<float*>(outputs);
        auto bf16 = [](uint32_t word, int half) {
          return bf16Value(static_cast<uint16_t>(half == 0 ? word & 0xffffu : word >> 16));
        };
        double a_m[16][16], b_m[16][8];
        float c_m[16][8];
        for (int lane = 0; lane < kWarpSize; ++lane) {
          const int group = lane / 4, quad = lane % 4;
          const Fragments& f = lanes[lane];
          for (int h = 0; h < 2; ++h) {
            a_m[group][2 * quad + h] = bf16(f.a[0], h);
            a_m[group + 8][2 * quad + h] = bf16(f.a[1], h);
            a_m[group][2 * quad + 8 + h] = bf16(f.a[2], h);
            a_m[group + 8][2 * quad + 8 + h] = bf16(f.a[3], h);
            b_m[2 * quad + h][group] = bf16(f.b[0], h);
            b_m[2 * quad + 8 + h][group] = bf16(f.b[1], h);
            c_m[group][2 * quad + h] = f.c[h];
            c_m[group + 8][2 * quad + h] = f.c[2 + h];
          }
        }
        for (int lane = 0; lane < kWarpSize; ++lane) {
          const int group = lane / 4, quad = lane % 4;
          for (int e = 0; e < 4; ++e) {
            const int row = group + 8 * (e / 2), column = 2 * quad + e % 2;
            d[lane * 4 + e] = tensorCoreDot(c_m[row][column], a_m[row], &b_m[0][column], 8);
          }
        }
      },
      "mma.sync.m16n8k16");
}

namespace {

// ldmatrix.x4's lanes: lanes 8i..8i+7 give the rows of matrix i.
template <bool kTransposed>
void loadMatrixLanes(const void* inputs, void* outputs, int warp_lanes) {
  if (warp_lanes != kWarpSize) fault("ldmatrix in a warp of %d lanes", warp_lanes);
  const auto* rows = static_cast<const uint16_t* const*>(inputs);
  for (int i = 0; i < kWarpSize; ++i) {
    if (reinterpret_cast<uintptr_t>(rows[i]) % 16 != 0) {
      fault("ldmatrix row address %p is not 16-byte aligned", static_cast<const void*>(rows[i]));
    }
  }
  // Shared memory serves 128 bytes a wavefront, 32 banks of 4 bytes: a
  // matrix's 8 rows of 16 bytes take one when they fall in 8 distinct
  // groups of 4 banks (address / 16 % 8; a row given twice is read once),
  // else one more per further distinct row of the fullest group. Host
  // addresses stand in for shared ones: both are 16-byte aligned, and one
  // shift for all rows of an array keeps which of them share a group.
  int64_t conflicts = 0;
  for (int matrix = 0; matrix < 4; ++matrix) {
    const uint16_t* const* matrix_rows = rows + matrix * 8;
    int per_group[8] = {};
    for (int row = 0; row < 8; ++row) {
      if (std::find(matrix_rows, matrix_rows + row, matrix_rows[row]) != matrix_rows + row)
        continue;
      ++per_group[reinterpret_cast<uintptr_t>(matrix_rows[row]) / 16 % 8];
    }
    conflicts += *std::max_element(per_group, per_group + 8) - 1;
  }
  countMatrixLoads(4, conflicts);
  auto* words = static_cast<uint32_t*>(outputs);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int matrix = 0; matrix < 4; ++matrix) {
      const uint16_t* const* matrix_rows = rows + matrix * 8;
      uint16_t low = 0, high = 0;
      if (kTransposed) {  // column lane / 4 of rows 2 (lane % 4) and the next
        low = matrix_rows[2 * (lane % 4)][lane / 4];
        high = matrix_rows[2 * (lane % 4) + 1][lane / 4];
      } else {  // row lane / 4, columns 2 (lane % 4) and the next
        low = matrix_rows[lane / 4][2 * (lane % 4)];
        high = matrix_rows[lane / 4][2 * (lane % 4) + 1];
      }
      words[lane * 4 + matrix] = static_cast<uint32_t>(low) | (uint32_t{high} << 16);
    }
  }
}

}  // namespace

void loadMatrixX4(uint32_t r[4], const uint16_t* row_address, bool transposed) {
  warpExchange(&row_address, sizeof(row_address), r, 4 * sizeof(uint32_t),
               transposed ? &loadMatrixLanes<true> : &loadMatrixLanes<false>,
               transposed ? "ldmatrix.x4.trans" : "ldmatrix.x4");
}

uint32_t sharedOffset(const void* p) {
  Block& block = *g_block;
  current();
  const auto* base = static_cast<const unsigned char*>(block.dynamic_shared);
  const auto* at = static_cast<const unsigned char*>(p);
  if (at < base || at >= base + block.dynamic_bytes) {
    fault("shared address of %p: only the block's dynamic shared memory has one here", p);
  }
  return static_cast<uint32_t>(at - base);
}

namespace {

// The 128-byte swizzle of a shared address: its 16-byte chunk (bits 4-6)
// exclusive-ored with bits 7-9, the row of 128 bytes within 1024.
uint64_t swizzle128(uint64_t address) { return address ^ (((address >> 7) & 7) << 4); }

// A wgmma operand's element (row, k) through its descriptor, inside the
// dynamic shared memory: the no-swizzle k-major layout or the 128-byte
// swizzled one (kernels/cuda/wgmma.h: rows of 128 bytes, 8-row groups
// `stride` apart, the address's bits swizzled).
double operandElement(uint64_t descriptor, int row, int k) {
  const uint64_t address = (descriptor & 0x3fff) << 4;
  const uint64_t leading = ((descriptor >> 16) & 0x3fff) << 4;
  const uint64_t stride = ((descriptor >> 32) & 0x3fff) << 4;
  const uint64_t at =
      (descriptor >> 62) == 1
          ? swizzle128(address + static_cast<uint64_t>(row / 8) * stride +
                       static_cast<uint64_t>(row % 8) * 128 + static_cast<uint64_t>(k) * 2)
          : address + static_cast<uint64_t>(row / 8) * stride +
                static_cast<uint64_t>(k / 8) * leading + static_cast<uint64_t>(row % 8) * 16 +
                static_cast<uint64_t>(k % 8) * 2;
  if (at + 2 > g_block->dynamic_bytes) {
    fault("wgmma operand element (%d, %d) at shared byte %llu, past the block's %zu", row, k,
          static_cast<unsigned long long>(at), g_block->dynamic_bytes);
  }
  uint16_t bits;
  std::memcpy(&bits, static_cast<const unsigned char*>(g_block->dynamic_shared) + at, 2);
  return bf16Value(bits);
}

// This thread's part of one m64nNk16: register 4j + e holds row
// 16 · warp + lane / 4 (+ 8 for e >= 2), column 8j + 2 (lane % 4) + e % 2.
void multiplyWarpgroup(const Fiber& fiber, const WarpgroupMma& mma) {
  const int warp = fiber.warp % 4;
  for (int i = 0; i < mma.n / 2; ++i) {
    const int j = i / 4, e = i % 4;
    const int row = 16 * warp + fiber.lane / 4 + 8 * (e / 2);
    const int column = 8 * j + 2 * (fiber.lane % 4) + e % 2;
    double a[16], b[16];
    for (int k = 0; k < 16; ++k) {
      a[k] = operandElement(mma.a, row, k);
      b[k] = operandElement(mma.b, column, k);
    }
    mma.d[i] = tensorCoreDot(mma.d[i], a, b, 1);
  }
}

}  // namespace

void warpgroupMma(float* d, int n, uint64_t a, uint64_t b) {
  Fiber& fiber = current();
  const dim3 shape = fiber.index.block_dim;
  if ((static_cast<size_t>(shape.x) * shape.y * shape.z) % 128 != 0) {
    fault("wgmma in a block of %u x %u x %u threads: not whole warpgroups", shape.x, shape.y,
          shape.z);
  }
  for (uint64_t descriptor : {a, b}) {
    const uint64_t swizzle = descriptor >> 62;
    const uint64_t address = (descriptor & 0x3fff) << 4;
    // The swizzled layout as kernels use it: the slice's 32 bytes within the
    // first 128-byte row of a 1024-byte aligned atom.
    const bool emulated = ((descriptor >> 49) & 7) == 0 &&
                          (swizzle == 0 || (swizzle == 1 && address % 1024 + 32 <= 128));
    if (!emulated) {
      fault(
          "wgmma descriptor %#llx: the emulator takes base offset 0 and either no swizzle or "
          "the 128-byte swizzle from a 1024-byte aligned atom",
          static_cast<unsigned long long>(descriptor));
    }
  }
  // The two ends of what the PTX ISA allows, paired with cp.async's the
  // other way round: the operands are read (and d written) when the thread
  // waits for the group in odd blocks, where copies land at once (a stage
  // refilled before its multiplies are waited for shows them the new
  // bytes), and at once in even ones, where copies land at their wait (a
  // multiply issued before its copies are waited for reads the old ones).
  const WarpgroupMma mma{d, n, a, b};
  if (!g_block->descending) {
    multiplyWarpgroup(fiber, mma);
  } else {
    fiber.mmas.open.push_back(mma);
  }
}

void warpgroupCommit() {
  Fiber& fiber = current();
  fiber.mmas.commit();
}

void warpgroupWait(int pending_groups) {
  Fiber& fiber = current();
  fiber.mmas.wait(pending_groups, [&](const WarpgroupMma& mma) { multiplyWarpgroup(fiber, mma); });
}

namespace {

// The barrier at `barrier` (an 8-byte object of the dynamic shared memory)
// and its offset, which `what` needs initialized.
Barrier& barrierAt(uint64_t* barrier, const char* what, uint32_t* offset) {
  *offset = sharedOffset(barrier);
  if (*offset % 8 != 0) fault("%s at shared byte %u: not 8-byte aligned", what, *offset);
  const auto found = g_block->barriers.find(*offset);
  if (found == g_block->barriers.end()) {
    fault("%s at shared byte %u: no mbarrier.init in this block", what, *offset);
  }
  return found->second;
}

// Lets the threads waiting on the barrier at `offset` look again; returns
// the first of them in the block's order (nullptr if none waited).
Fiber* wakeWaiters(uint32_t offset) {
  Fiber* first = nullptr;
  for (Fiber& fiber : g_block->fibers) {
    if (fiber.wait == Wait::kMbarrier && fiber.barrier == offset) {
      fiber.wait = Wait::kRunning;
      if (first == nullptr) first = &fiber;
    }
  }
  return first;
}

// The phase completes once every expected arrival has come and every
// announced byte has landed; returns a thread that waited for it, if any.
Fiber* completeIfDone(Barrier& barrier, uint32_t offset) {
  if (barrier.pending != 0 || barrier.bytes != 0) return nullptr;
  ++barrier.phase;
  barrier.pending = barrier.expected;
  return wakeWaiters(offset);
}

// The box of `copy.map` at (copy.row, copy.column) into shared memory:
// rows of box[0] elements one after another, 128-byte swizzled where the
// map says, zeros outside the matrix.
void landTensorCopy(const TensorCopy& copy) {
  const TensorMapFields& map = copy.map;
  auto* shared = static_cast<unsigned char*>(g_block->dynamic_shared);
  const uint64_t row_bytes = uint64_t{map.box[0]} * map.element_bytes;
  for (uint32_t r = 0; r < map.box[1]; ++r) {
    const int64_t y = int64_t{copy.row} + r;
    for (uint32_t e = 0; e < map.box[0]; ++e) {
      const int64_t x = int64_t{copy.column} + e;
      uint64_t at = copy.dst + r * row_bytes + uint64_t{e} * map.element_bytes;
      if (map.swizzle_bytes == 128) at = swizzle128(at);
      if (at + map.element_bytes > g_block->dynamic_bytes) {
        fault("tensor copy element (%u, %u) at shared byte %llu, past the block's %zu", r, e,
              static_cast<unsigned long long>(at), g_block->dynamic_bytes);
      }
      const bool inside = x >= 0 && y >= 0 && static_cast<uint64_t>(x) < map.dims[0] &&
                          static_cast<uint64_t>(y) < map.dims[1];
      if (inside) {
        std::memcpy(shared + at,
                    map.address + static_cast<uint64_t>(y) * map.row_bytes +
                        static_cast<uint64_t>(x) * map.element_bytes,
                    map.element_bytes);
      } else {
        std::memset(shared + at, 0, map.element_bytes);
      }
    }
  }
}

uint32_t boxBytes(const TensorMapFields& map) {
  return map.box[0] * map.box[1] * map.element_bytes;
}

// Lands the copies still in flight on `barrier`, in issue order.
void landCopies(Barrier& barrier, uint32_t offset) {
  std::vector<TensorCopy> landing;
  landing.swap(barrier.landing);
  for (const TensorCopy& copy : landing) {
    landTensorCopy(copy);
    barrier.bytes -= boxBytes(copy.map);
  }
  if (!landing.empty()) completeIfDone(barrier, offset);
}

}  // namespace

void barrierInit(uint64_t* barrier, uint32_t arrivals) {
  current();
  const uint32_t offset = sharedOffset(barrier);
  if (offset % 8 != 0) fault("mbarrier.init at shared byte %u: not 8-byte aligned", offset);
  if (arrivals == 0 || arrivals >= (1u << 20)) {
    fault("mbarrier.init with %u arrivals (1 to 2^20 - 1 accepted)", arrivals);
  }
  Barrier& state = g_block->barriers[offset];
  if (!state.landing.empty())
    fault("mbarrier.init at shared byte %u with copies in flight", offset);
  state = Barrier{arrivals, arrivals, 0, 0, {}};
}

void barrierArrive(uint64_t* barrier, uint32_t expect_bytes) {
  Fiber& fiber = current();
  uint32_t offset = 0;
  Barrier& state = barrierAt(barrier, "mbarrier.arrive", &offset);
  if (state.pending == 0) fault("mbarrier.arrive at shared byte %u: no arrival pending", offset);
  state.bytes += expect_bytes;
  --state.pending;
  // The arrival that completes a phase hands the turn to a thread waiting
  // for it at once (this one runs on later), as a GPU may run the waiter
  // before the arriving thread's next instruction: so a thread that frees
  // a stage on behalf of others before they are done with it has the
  // stage refilled under their late reads (odd blocks).
  if (Fiber* waiter = completeIfDone(state, offset)) {
    g_block->running = waiter;
    switchContext(fiber.context, waiter->context);
  }
}

void barrierWait(uint64_t* barrier, uint32_t parity) {
  Fiber& fiber = current();
  if (parity > 1) fault("mbarrier.try_wait.parity with parity %u", parity);
  for (;;) {
    uint32_t offset = 0;
    Barrier& state = barrierAt(barrier, "mbarrier.try_wait", &offset);
    landCopies(state, offset);
    if ((state.phase & 1) != parity) return;
    fiber.wait = Wait::kMbarrier;
    fiber.barrier = offset;
    passTurn(fiber);
  }
}

void tensorCopy(void* shared, const void* map, int32_t column, int32_t row, uint64_t* barrier) {
  current();
  TensorCopy copy;
  std::memcpy(&copy.map, map, sizeof(copy.map));
  if (copy.map.magic != kTensorMapMagic) {
    fault("cp.async.bulk.tensor through %p: not a tensor map cuTensorMapEncodeTiled made", map);
  }
  copy.dst = sharedOffset(shared);
  copy.column = column;
  copy.row = row;
  const uint32_t alignment = copy.map.swizzle_bytes == 128 ? 1024 : 128;
  if (copy.dst % alignment != 0) {
    fault("cp.async.bulk.tensor into shared byte %u: not %u-byte aligned", copy.dst, alignment);
  }
  uint32_t offset = 0;
  Barrier& state = barrierAt(barrier, "cp.async.bulk.tensor's mbarrier", &offset);
  state.landing.push_back(copy);
  if (g_block->descending) {
    landCopies(state, offset);
  } else {
    wakeWaiters(offset);  // they land it as they look again
  }
}

}  // namespace tandem::cuda_emu
