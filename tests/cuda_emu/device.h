// The CUDA emulator's device side: what a kernel source of kernels/cuda/
// sees when it is compiled as host C++ (force-included before the source;
// docs/cuda.md#the-emulator). Every thread of a block runs as a fiber on
// the calling host thread; fibers switch only where CUDA threads wait for
// each other (__syncthreads, __syncwarp, shuffles, mma, ldmatrix), so
// everything between two such points runs as plain compiled C++. Blocks run
// one after another; a warp runs from one barrier to the next before the
// next warp starts, warps and lanes in ascending order in even-numbered
// blocks and descending in odd ones, so a read of another thread's
// shared-memory write that no barrier orders sees stale data in one of the
// two orders.
//
// Where it differs from a GPU: memory is sequentially consistent (a race
// shows only through the two orders above); mma.sync adds its 16 products
// and the accumulator in double and rounds once, so a tensor-core result
// can differ from the hardware's in the last bit (invariance and indexing
// are what it checks, not the tensor cores' rounding); cp.async copies land
// when the issuing thread waits for them (even blocks) or at once (odd
// blocks), the two ends the PTX ISA allows; fast-math intrinsics (__expf)
// are the libm functions. One host thread at a time may run kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

#define TANDEM_CUDA_EMULATION 1

namespace tandem::cuda_emu {

struct ThreadIndex {
  uint3 thread;
  uint3 block;
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadIndex& here();

// Block-wide and warp-wide waits. syncThreads: every thread of the block
// must wait at the same __syncthreads (file and line). warpExchange: every
// lane of the calling warp hands in `bytes` bytes; once all have, `combine`
// runs once over the inputs (in lane order, `lanes` of them: fewer than 32
// in a block's last, partial warp) and fills one output per lane; each lane
// gets its own. Lanes of one warp that meet different exchanges
// (divergence) or a lane that exits while the others wait abort the
// program with a message.
void syncThreads(const char* file, unsigned line);
void syncWarp();
using Combine = void (*)(const void* inputs, void* outputs, int lanes);
[[noreturn]] void fault(const char* format, ...);
void warpExchange(const void* in, size_t in_bytes, void* out, size_t out_bytes, Combine combine,
                  const char* what);

// cp.async: copies queued per thread, in commit groups, done when the
// thread waits for their group.
void asyncCopy(void* dst, const void* src, size_t bytes, size_t src_bytes);
void asyncCommit();
void asyncWait(int pending_groups);

// wgmma (kernels/cuda/wgmma.h): each thread computes its own part of the
// warpgroup's accumulator from the operands in shared memory, in commit
// groups done when the thread waits for them (odd blocks, where cp.async
// lands at once) or at once (even blocks, where cp.async lands at its
// wait). sharedOffset: a pointer's byte offset in the running block's
// dynamic shared memory (the only shared memory with an address here).
void warpgroupMma(float* d, int n, uint64_t a, uint64_t b);
void warpgroupCommit();
void warpgroupWait(int pending_groups);
uint32_t sharedOffset(const void* p);

// mbarrier and the tensor copies (kernels/cuda/tma.h). A barrier is an
// 8-byte object in the block's dynamic shared memory; its state (expected
// and pending arrivals, transaction bytes, phase) is kept beside it, so a
// wait on one never initialized in this block stops the program. A waiting
// thread gives its turn until the phase of the parity it waits for has
// completed, and the arrival that completes a phase hands the turn to a
// thread waiting for it at once; when no thread can go on, the block stops
// with where each waits. A tensor copy (cp.async.bulk.tensor.2d through a map the emulated
// cuTensorMapEncodeTiled made) lands at once in odd blocks and in even ones
// when a thread waits on its barrier (the two ends the PTX ISA allows;
// wgmma, paired the other way round, reads its operands late in odd blocks
// and at once in even ones), then counts its bytes off the barrier.
void barrierInit(uint64_t* barrier, uint32_t arrivals);
void barrierArrive(uint64_t* barrier, uint32_t expect_bytes);
void barrierWait(uint64_t* barrier, uint32_t parity);
void tensorCopy(void* shared, const void* map, int32_t column, int32_t row, uint64_t* barrier);

// A static __shared__ object reached by a thread of the running block
// (translate.cmake adds the call after each declaration): the first thread
// of the block to reach it fills it with all-ones bytes, as a GPU's shared
// memory holds whatever was there, not the last block's values.
void sharedVariable(void* object, size_t bytes);

// The dynamic shared memory of the running block (the launch's third
// argument), aligned to 128 bytes.
void* dynamicSharedMemory();

// Kernel launches: `kernel<<<grid, block, shared, stream>>>(args...)` is
// rewritten to `kernel << Launch(grid, block, shared, stream)(args...)`
// (tests/cuda_emu/translate.cmake).
struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};
// Runs `run_thread(call)` as every thread of every block of the grid, or
// records that when the stream is being captured; a shape the device would
// refuse sets cudaGetLastError's error instead.
void submitKernel(const void* kernel, const LaunchShape& shape,
                  void (*run_thread)(const void* call), std::shared_ptr<const void> call);

template <typename... Args>
struct PendingLaunch {
  LaunchShape shape;
  std::tuple<Args...> args;
};

struct Launch {
  LaunchShape shape;
  Launch(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr)
      : shape{grid, block, shared_bytes, stream} {}
  template <typename... Args>
  PendingLaunch<std::decay_t<Args>...> operator()(Args&&... args) const {
    return {shape, std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)};
  }
};

template <typename... Params>
struct KernelCall {
  void (*kernel)(Params...);
  std::tuple<std::decay_t<Params>...> params;
  static void run(const void* call) {
    const auto& self = *static_cast<const KernelCall*>(call);
    std::apply(self.kernel, self.params);
  }
};

template <typename... Params, typename... Args>
void operator<<(void (*kernel)(Params...), PendingLaunch<Args...>&& launch) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with the wrong arguments");
  auto call = std::make_shared<KernelCall<Params...>>(KernelCall<Params...>{
      kernel, std::apply([](auto&&... a) { return std::tuple<std::decay_t<Params>...>(a...); },
                         launch.args)});
  submitKernel(reinterpret_cast<const void*>(kernel), launch.shape, &KernelCall<Params...>::run,
               std::move(call));
}

// Warp-wide instructions take full masks only (every kernel of kernels/cuda/
// uses 0xffffffff): the emulator stops on any other.
void requireFullMask(unsigned mask, const char* what);

template <typename T>
T* dynamicShared() {
  return static_cast<T*>(dynamicSharedMemory());
}

}  // namespace tandem::cuda_emu

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx (::tandem::cuda_emu::here().thread)
#define blockIdx (::tandem::cuda_emu::here().block)
#define blockDim (::tandem::cuda_emu::here().block_dim)
#define gridDim (::tandem::cuda_emu::here().grid_dim)

inline void __syncthreads(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  ::tandem::cuda_emu::syncThreads(file, line);
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::tandem::cuda_emu::requireFullMask(mask, "__syncwarp");
  ::tandem::cuda_emu::syncWarp();
}

namespace tandem::cuda_emu {

// A shuffle of 4-byte values: each lane hands in `args` with its value's
// bits in args.bits; `combine` picks each lane's result from them.
template <typename T, typename Args>
T shuffle(unsigned mask, T value, Args args, Combine combine, const char* what) {
  static_assert(sizeof(T) == 4, "the emulator shuffles 4-byte values");
  std::memcpy(&args.bits, &value, 4);
  uint32_t out = 0;
  requireFullMask(mask, what);
  warpExchange(&args, sizeof(args), &out, sizeof(out), combine, what);
  T result;
  std::memcpy(&result, &out, 4);
  return result;
}

}  // namespace tandem::cuda_emu

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  struct Args {
    uint32_t bits;
    int lane_mask;
    int width;
  };
  return ::tandem::cuda_emu::shuffle(
      mask, value, Args{0, lane_mask, width},
      [](const void* inputs, void* outputs, int lanes) {
        // PTX shfl.sync.bfly: source j = lane ^ (mask & 31), taken when it
        // is at most the last lane of this lane's segment of `width`.
        const auto* a = static_cast<const Args*>(inputs);
        auto* o = static_cast<uint32_t*>(outputs);
        for (int lane = 0; lane < lanes; ++lane) {
          const int width = a[lane].width;
          if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
            ::tandem::cuda_emu::fault("__shfl_xor_sync width %d: a power of two up to 32", width);
          }
          const int segment_mask = 32 - width;
          const int max_lane = (lane & segment_mask) | (31 & ~segment_mask);
          const int source = lane ^ (a[lane].lane_mask & 31);
          if (source > max_lane) {
            o[lane] = a[lane].bits;
          } else if (source >= lanes) {
            ::tandem::cuda_emu::fault("__shfl_xor_sync from lane %d of a warp of %d", source,
                                      lanes);
          } else {
            o[lane] = a[source].bits;
          }
        }
      },
      "__shfl_xor_sync");
}

// shfl.sync.idx over the whole warp: every lane gets lane `source`'s value.
template <typename T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
  struct Args {
    uint32_t bits;
    int source;
  };
  if (width != 32) ::tandem::cuda_emu::fault("__shfl_sync width %d: the emulator takes 32", width);
  return ::tandem::cuda_emu::shuffle(
      mask, value, Args{0, source},
      [](const void* inputs, void* outputs, int lanes) {
        const auto* a = static_cast<const Args*>(inputs);
        auto* o = static_cast<uint32_t*>(outputs);
        for (int lane = 0; lane < lanes; ++lane) {
          const int source = a[lane].source & 31;
          if (source >= lanes) {
            ::tandem::cuda_emu::fault("__shfl_sync from lane %d of a warp of %d", source, lanes);
          }
          o[lane] = a[source].bits;
        }
      },
      "__shfl_sync");
}

// cuda_runtime.h's kernel-pointer overload, declared for nvcc only.
template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute,
                                 int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

// CUDA's integer min and max for device code (the int64_t overloads).
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a < b ? b : a; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __expf(float a) { return std::exp(a); }
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
// Blocks run one at a time on one host thread: a plain add is atomic.
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  *address = old + value;
  return old;
}
// Memory is sequentially consistent: a fence orders nothing more.
inline void __threadfence() {}
// A load through L2 only: the same value here.
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
