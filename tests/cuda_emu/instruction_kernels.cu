// The probes of instruction_kernels.h.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/ptx.h"
#include "tests/cuda_emu/instruction_kernels.h"
#include "tests/cuda_emu/wgmma_probe.h"

namespace tandem::cuda_probe {
namespace {

using kernels::cuda::commitCopies;
using kernels::cuda::copyAsync16;
using kernels::cuda::loadMatrices;
using kernels::cuda::loadMatricesTransposed;
using kernels::cuda::mmaBf16;
using kernels::cuda::waitCopies;

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::abort();
  }
}

template <typename T>
T* toDevice(const std::vector<T>& host) {
  T* device = nullptr;
  check(cudaMalloc(&device, host.size() * sizeof(T) + 1), "cudaMalloc");
  check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  return device;
}

template <typename T>
T* deviceBuffer(size_t n) {
  T* device = nullptr;
  check(cudaMalloc(&device, n * sizeof(T)), "cudaMalloc");
  return device;
}

// Waits for the kernels, copies n elements back and frees the buffer.
template <typename T>
std::vector<T> fromDevice(T* device, size_t n) {
  std::vector<T> host(n);
  check(cudaDeviceSynchronize(), "kernel");
  check(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaFree(device), "cudaFree");
  return host;
}

__global__ void mmaKernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int lane = static_cast<int>(threadIdx.x);
  const int group = lane / 4, quad = lane % 4;
  auto pair = [](const uint16_t* p, int i0, int i1) {
    return static_cast<uint32_t>(p[i0]) | (static_cast<uint32_t>(p[i1]) << 16);
  };
  const uint32_t af[4] = {
      pair(a, group * 16 + 2 * quad, group * 16 + 2 * quad + 1),
      pair(a, (group + 8) * 16 + 2 * quad, (group + 8) * 16 + 2 * quad + 1),
      pair(a, group * 16 + 2 * quad + 8, group * 16 + 2 * quad + 9),
      pair(a, (group + 8) * 16 + 2 * quad + 8, (group + 8) * 16 + 2 * quad + 9)};
  const uint32_t bf[2] = {pair(b, (2 * quad) * 8 + group, (2 * quad + 1) * 8 + group),
                          pair(b, (2 * quad + 8) * 8 + group, (2 * quad + 9) * 8 + group)};
  float acc[4] = {c[group * 8 + 2 * quad], c[group * 8 + 2 * quad + 1],
                  c[(group + 8) * 8 + 2 * quad], c[(group + 8) * 8 + 2 * quad + 1]};
  mmaBf16(acc, af, bf);
  d[group * 8 + 2 * quad] = acc[0];
  d[group * 8 + 2 * quad + 1] = acc[1];
  d[(group + 8) * 8 + 2 * quad] = acc[2];
  d[(group + 8) * 8 + 2 * quad + 1] = acc[3];
}

__global__ void loadMatricesKernel(const uint16_t* tile, bool transposed, uint32_t* out) {
  __shared__ __align__(16) uint16_t shared[32 * 8];
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = 0; i < 8; ++i) shared[lane * 8 + i] = tile[lane * 8 + i];
  __syncwarp();
  uint32_t r[4];
  if (transposed) {
    loadMatricesTransposed(r, shared + lane * 8);
  } else {
    loadMatrices(r, shared + lane * 8);
  }
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

__global__ void shuffleKernel(int lane_mask, int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  out[lane] = __shfl_xor_sync(0xffffffffu, lane, lane_mask);
}

__global__ void copyKernel(const uint8_t* src, const uint8_t* valid, int vectors, uint8_t* out) {
  __shared__ __align__(16) uint8_t shared[64 * 16];
  const int t = static_cast<int>(threadIdx.x);
  for (int i = 0; i < 16; ++i) shared[t * 16 + i] = 0xab;
  __syncthreads();
  if (t < vectors) copyAsync16(shared + t * 16, src + t * 16, valid[t] != 0);
  commitCopies();
  waitCopies<0>();
  __syncthreads();
  for (int i = 0; i < 16; ++i) out[t * 16 + i] = shared[t * 16 + i];
}

__global__ void neighbourKernel(int* out) {
  __shared__ int slots[1024];
  const int t = static_cast<int>(threadIdx.x);
  const int n = static_cast<int>(blockDim.x);
  slots[t] = 1000 * static_cast<int>(blockIdx.x) + t;
  out[blockIdx.x * n + t] = slots[t + 1 < n ? t + 1 : t];
}

__global__ void crossWarpKernel(int* out) {
  __shared__ int slots[32];
  const int t = static_cast<int>(threadIdx.x);
  if (t >= 32) slots[t - 32] = 1000 * static_cast<int>(blockIdx.x) + t - 32;
  __syncwarp();
  __syncwarp();
  if (t < 32) out[blockIdx.x * 32 + t] = slots[t];
}

__global__ void sharedBeforeWriteKernel(uint32_t* out) {
  __shared__ uint32_t slots[32];
  const int t = static_cast<int>(threadIdx.x);
  out[blockIdx.x * 32 + t] = slots[t];
  __syncthreads();
  slots[t] = 7;
}

__global__ void sharedKernel(int* out) {
  extern __shared__ int dynamic[];
  dynamic[threadIdx.x] = 1;
  out[threadIdx.x] = dynamic[threadIdx.x];
}

__global__ void divergentKernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  if (lane < 16) {
    out[lane] = __shfl_xor_sync(0xffffffffu, lane, 1);
  } else {
    __syncwarp();
  }
}

}  // namespace

int deviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::vector<float> mma(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                       const std::vector<float>& c) {
  auto* d = deviceBuffer<float>(16 * 8);
  uint16_t* da = toDevice(a);
  uint16_t* db = toDevice(b);
  float* dc = toDevice(c);
  mmaKernel<<<1, 32>>>(da, db, dc, d);
  check(cudaGetLastError(), "mmaKernel");
  auto out = fromDevice(d, 16 * 8);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return out;
}

bool wgmmaAvailable() {
#if defined(TANDEM_HAVE_WGMMA)
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  return props.major == 9 && props.minor == 0;
#else
  return false;
#endif
}

std::vector<float> warpgroupMma(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                                const std::vector<float>& c) {
  auto* d = deviceBuffer<float>(64 * 128);
  uint16_t* da = toDevice(a);
  uint16_t* db = toDevice(b);
  float* dc = toDevice(c);
#if defined(TANDEM_HAVE_WGMMA)
  launchWgmmaProbe(da, db, dc, d);
#else
  std::fprintf(stderr, "warpgroupMma: this build has no sm_90a probe\n");
  std::abort();
#endif
  check(cudaGetLastError(), "wgmmaProbeKernel");
  auto out = fromDevice(d, 64 * 128);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return out;
}

std::vector<uint8_t> tensorCopy(const std::vector<uint16_t>& matrix, int64_t rows, int64_t k,
                                int32_t column, int32_t row) {
  auto* out = deviceBuffer<uint8_t>(4096);
  uint16_t* dm = toDevice(matrix);
#if defined(TANDEM_HAVE_WGMMA)
  launchTensorCopyProbe(dm, rows, k, column, row, out);
#else
  (void)rows, (void)k, (void)column, (void)row;
  std::fprintf(stderr, "tensorCopy: this build has no sm_90a probe\n");
  std::abort();
#endif
  check(cudaGetLastError(), "tensorCopyProbeKernel");
  auto bytes = fromDevice(out, 4096);
  cudaFree(dm);
  return bytes;
}

std::vector<uint32_t> loadMatrices(const std::vector<uint16_t>& tile, bool transposed) {
  auto* out = deviceBuffer<uint32_t>(128);
  uint16_t* dt = toDevice(tile);
  loadMatricesKernel<<<1, 32>>>(dt, transposed, out);
  check(cudaGetLastError(), "loadMatricesKernel");
  auto result = fromDevice(out, 128);
  cudaFree(dt);
  return result;
}

std::vector<int> shuffleXor(int lane_mask) {
  auto* out = deviceBuffer<int>(32);
  shuffleKernel<<<1, 32>>>(lane_mask, out);
  check(cudaGetLastError(), "shuffleKernel");
  return fromDevice(out, 32);
}

std::vector<uint8_t> copyThroughShared(const std::vector<uint8_t>& bytes,
                                       const std::vector<uint8_t>& valid) {
  auto* out = deviceBuffer<uint8_t>(64 * 16);
  uint8_t* src = toDevice(bytes);
  uint8_t* dv = toDevice(valid);
  copyKernel<<<1, 64>>>(src, dv, static_cast<int>(valid.size()), out);
  check(cudaGetLastError(), "copyKernel");
  auto result = fromDevice(out, 64 * 16);
  cudaFree(src);
  cudaFree(dv);
  return result;
}

std::vector<int> neighbourWithoutBarrier(int threads) {
  auto* out = deviceBuffer<int>(2 * static_cast<size_t>(threads));
  neighbourKernel<<<2, threads>>>(out);
  check(cudaGetLastError(), "neighbourKernel");
  return fromDevice(out, 2 * static_cast<size_t>(threads));
}

std::vector<int> crossWarpWithoutBarrier() {
  auto* out = deviceBuffer<int>(64);
  crossWarpKernel<<<2, 64>>>(out);
  check(cudaGetLastError(), "crossWarpKernel");
  return fromDevice(out, 64);
}

std::vector<uint32_t> sharedBeforeWrite() {
  auto* out = deviceBuffer<uint32_t>(96);
  sharedBeforeWriteKernel<<<3, 32>>>(out);
  check(cudaGetLastError(), "sharedBeforeWriteKernel");
  return fromDevice(out, 96);
}

std::vector<int> mallocDuringCapture() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  void* memory = nullptr;
  const cudaError_t malloc_error = cudaMalloc(&memory, 256);
  cudaGraph_t graph = nullptr;
  const cudaError_t end_error = cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (memory != nullptr) cudaFree(memory);
  cudaGetLastError();
  cudaStreamDestroy(stream);
  return {static_cast<int>(malloc_error), static_cast<int>(end_error)};
}

int launchErrorForSharedBytes(int shared_bytes) {
  auto* out = deviceBuffer<int>(32);
  cudaGetLastError();
  sharedKernel<<<1, 32, static_cast<size_t>(shared_bytes)>>>(out);
  const cudaError_t error = cudaGetLastError();
  cudaDeviceSynchronize();
  cudaFree(out);
  return static_cast<int>(error);
}

void divergentWarp() {
  auto* out = deviceBuffer<int>(32);
  divergentKernel<<<1, 32>>>(out);
  cudaDeviceSynchronize();
  cudaFree(out);
}

}  // namespace tandem::cuda_probe
