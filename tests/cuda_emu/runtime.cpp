// The CUDA emulator's runtime API: the cudaXxx functions kernels/cuda/
// calls, defined over host memory, written from the CUDA Runtime API
// reference. One device (device 0, 4 multiprocessors, compute capability
// 9.0); every stream runs its work at once, in issue order, so
// synchronizing does nothing; a stream being captured records its work
// into a graph instead, and a graph launch replays it; allocating, freeing
// or synchronizing during a capture is refused and invalidates it. Device memory comes
// back filled with all-ones bytes (cudaMalloc does not clear), and copies
// and memsets through device memory are checked against the allocations.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/cuda_emu/emulator.h"

struct CUstream_st {
  cudaGraph_t capture = nullptr;  // the graph being captured, if any
};
struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
  bool invalidated = false;  // an illegal call was made during its capture
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
};
struct CUevent_st {};

namespace tandem::cuda_emu {
namespace {

std::mutex g_mutex;
cudaError_t g_last_error = cudaSuccess;
DeviceCounts g_counts;  // what has run (enqueue, countKernel)
CUstream_st g_default_stream;
// Never destroyed: backends held in static storage free their memory
// during exit, after any static of this file would have been.
std::map<const void*, size_t>& functionLimits() {
  static auto* limits = new std::map<const void*, size_t>;
  return *limits;
}
// Device allocations by start address.
std::map<uintptr_t, size_t>& allocations() {
  static auto* all = new std::map<uintptr_t, size_t>;
  return *all;
}

CUstream_st* streamOf(cudaStream_t stream) {
  return stream == nullptr ? &g_default_stream : stream;
}

// Page-locked host memory by start address: cudaMallocHost's blocks and
// cudaHostRegister's ranges.
std::map<uintptr_t, size_t>& pageLocked() {
  static auto* all = new std::map<uintptr_t, size_t>;
  return *all;
}

// Whether [p, p + bytes) lies inside one range of `ranges`.
bool insideOne(const std::map<uintptr_t, size_t>& ranges, const void* p, size_t bytes) {
  std::lock_guard lock(g_mutex);
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = ranges.upper_bound(address);
  if (it == ranges.begin()) return false;
  --it;
  return address + bytes <= it->first + it->second;
}

// Whether [p, p + bytes) lies inside one device allocation.
bool insideAllocation(const void* p, size_t bytes) { return insideOne(allocations(), p, bytes); }

bool checkDevice(const void* p, size_t bytes, const char* what) {
  if (bytes == 0 || insideAllocation(p, bytes)) return true;
  std::fprintf(stderr, "CUDA emulator: %s: %zu bytes at %p are not inside one device allocation\n",
               what, bytes, p);
  return false;
}

// The bytes of a copy between the device and host memory that is not
// page-locked (DeviceCounts::pageable_copy_bytes): 0 for any other copy.
size_t pageableBytes(const void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const void* host = kind == cudaMemcpyDeviceToHost   ? dst
                     : kind == cudaMemcpyHostToDevice ? src
                                                      : nullptr;
  return host != nullptr && bytes > 0 && !insideOne(pageLocked(), host, bytes) ? bytes : 0;
}

// Whether a copy's device ends (as `kind` names them) lie inside device
// allocations: `dst_span` bytes at dst, `src_span` at src.
bool checkCopyEnds(void* dst, size_t dst_span, const void* src, size_t src_span,
                   cudaMemcpyKind kind, const char* what) {
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const std::string name(what);
  return (!dst_device || checkDevice(dst, dst_span, (name + " destination").c_str())) &&
         (!src_device || checkDevice(src, src_span, (name + " source").c_str()));
}

cudaError_t fail(cudaError_t error) {
  g_last_error = error;
  return error;
}

// Graphs being captured. While any is, the calls that would wait for or
// change the device behind the capture's back (allocation, freeing,
// synchronous copies, device or stream synchronization) are refused and
// invalidate the capture, so its cudaStreamEndCapture fails (the runtime's
// global and thread-local capture modes).
std::vector<cudaGraph_t>& activeCaptures() {
  static auto* captures = new std::vector<cudaGraph_t>;
  return *captures;
}

// cudaErrorStreamCaptureUnsupported when a capture is under way (and it
// is invalidated), else cudaSuccess.
cudaError_t refuseDuringCapture(const char* what) {
  if (activeCaptures().empty()) return cudaSuccess;
  std::fprintf(stderr, "CUDA emulator: %s during stream capture: the capture is invalidated\n",
               what);
  for (cudaGraph_t graph : activeCaptures()) graph->invalidated = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace

void enqueue(cudaStream_t stream, std::function<void()> work) {
  CUstream_st* s = streamOf(stream);
  if (s->capture != nullptr) {
    s->capture->nodes.push_back(std::move(work));
  } else {
    ++g_counts.operations;
    work();
  }
}

void countKernel(size_t shared_bytes) {
  ++g_counts.kernels;
  g_counts.dynamic_shared_bytes += static_cast<int64_t>(shared_bytes);
}

void countPageableCopy(size_t bytes) {
  g_counts.pageable_copy_bytes += static_cast<int64_t>(bytes);
}

void countMatrixLoads(int64_t matrices, int64_t conflicts) {
  g_counts.matrix_loads += matrices;
  g_counts.matrix_load_conflicts += conflicts;
}

DeviceCounts deviceCounts() { return g_counts; }

void setLastError(cudaError_t error) { g_last_error = error; }

size_t maxDynamicShared(const void* kernel) {
  std::lock_guard lock(g_mutex);
  auto it = functionLimits().find(kernel);
  return it == functionLimits().end() ? kSharedPerBlockDefault : it->second;
}

}  // namespace tandem::cuda_emu

using tandem::cuda_emu::checkCopyEnds;
using tandem::cuda_emu::checkDevice;
using tandem::cuda_emu::enqueue;
using tandem::cuda_emu::fail;
using tandem::cuda_emu::refuseDuringCapture;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "Tandem CUDA emulator");
  prop->totalGlobalMem = size_t{16} << 30;
  prop->sharedMemPerBlock = tandem::cuda_emu::kSharedPerBlockDefault;
  prop->sharedMemPerBlockOptin = tandem::cuda_emu::kSharedPerBlockOptin;
  prop->sharedMemPerMultiprocessor = 233472;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = tandem::cuda_emu::kMultiprocessors;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->l2CacheSize = 4 << 20;
  prop->major = 9;
  prop->minor = 0;
  prop->memoryBusWidth = 256;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || static_cast<size_t>(value) > tandem::cuda_emu::kSharedPerBlockOptin) {
    return fail(cudaErrorInvalidValue);
  }
  std::lock_guard lock(tandem::cuda_emu::g_mutex);
  tandem::cuda_emu::functionLimits()[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

namespace tandem::cuda_emu {
namespace {

size_t elementBytes(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
      return 4;
    default:
      return 0;  // not emulated
  }
}

// cuTensorMapEncodeTiled (CUDA Driver API reference), for what the
// emulator's tensor copies do: rank 2, no interleave, element strides 1, no
// swizzle or the 128-byte one with 128-byte box rows. The driver's checks
// on those arguments are made (address 16-byte aligned; dims 1 to 2^32;
// the row stride a multiple of 16 below 2^40; box dims 1 to 256, a box row
// a multiple of 16 bytes, at most the swizzle's span); anything else
// returns CUDA_ERROR_INVALID_VALUE, as the driver does for what it refuses.
CUresult encodeTiled(CUtensorMap* tensor_map, CUtensorMapDataType type, cuuint32_t rank,
                     void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                     const cuuint32_t* box, const cuuint32_t* element_strides,
                     CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill fill) {
  const size_t element = elementBytes(type);
  if (tensor_map == nullptr || element == 0 || rank != 2 ||
      reinterpret_cast<uintptr_t>(address) % 16 != 0 ||
      interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || fill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (int d = 0; d < 2; ++d) {
    if (dims[d] == 0 || dims[d] > (uint64_t{1} << 32) || box[d] == 0 || box[d] > 256 ||
        element_strides[d] != 1) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const uint64_t box_row = uint64_t{box[0]} * element;
  if (strides[0] % 16 != 0 || strides[0] >= (uint64_t{1} << 40) || box_row % 16 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE &&
      (swizzle != CU_TENSOR_MAP_SWIZZLE_128B || box_row != 128)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TensorMapFields fields;
  fields.magic = kTensorMapMagic;
  fields.address = static_cast<const unsigned char*>(address);
  fields.dims[0] = dims[0];
  fields.dims[1] = dims[1];
  fields.row_bytes = strides[0];
  fields.box[0] = box[0];
  fields.box[1] = box[1];
  fields.element_bytes = static_cast<uint32_t>(element);
  fields.swizzle_bytes = swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : 0;
  static_assert(sizeof(fields) <= sizeof(CUtensorMap), "a tensor map holds the fields");
  std::memset(tensor_map, 0, sizeof(*tensor_map));
  std::memcpy(tensor_map, &fields, sizeof(fields));
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace tandem::cuda_emu

// The driver functions the backend asks the runtime for: the emulated
// cuTensorMapEncodeTiled; any other symbol is not found.
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return fail(cudaErrorInvalidValue);
  if (std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0) {
    *function = reinterpret_cast<void*>(&tandem::cuda_emu::encodeTiled);
    if (status != nullptr) *status = cudaDriverEntryPointSuccess;
    return cudaSuccess;
  }
  *function = nullptr;
  if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t error = tandem::cuda_emu::g_last_error;
  tandem::cuda_emu::g_last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return tandem::cuda_emu::g_last_error; }

namespace tandem::cuda_emu {
namespace {

struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;  // the CUDA runtime's own wording
};

// The errors the emulator returns, and cudaErrorUnknown for any other.
const ErrorText& errorText(cudaError_t error) {
  static const ErrorText known[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorIllegalState, "cudaErrorIllegalState",
       "the operation cannot be performed in the present state"},
      {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
       "operation not permitted when stream is capturing"},
      {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
       "operation failed due to a previous error during capture"},
      {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
       "part or all of the requested memory range is already mapped"},
      {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
       "pointer does not correspond to a registered memory region"},
      {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
  };
  for (const ErrorText& entry : known) {
    if (entry.error == error) return entry;
  }
  return known[std::size(known) - 1];
}

}  // namespace
}  // namespace tandem::cuda_emu

const char* cudaGetErrorName(cudaError_t error) { return tandem::cuda_emu::errorText(error).name; }

const char* cudaGetErrorString(cudaError_t error) {
  return tandem::cuda_emu::errorText(error).text;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (const cudaError_t refused = refuseDuringCapture("cudaMalloc")) return refused;
  const size_t bytes = size == 0 ? 1 : size;
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, bytes);
  std::lock_guard lock(tandem::cuda_emu::g_mutex);
  tandem::cuda_emu::allocations()[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (const cudaError_t refused = refuseDuringCapture("cudaFree")) return refused;
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard lock(tandem::cuda_emu::g_mutex);
    if (tandem::cuda_emu::allocations().erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return fail(cudaErrorInvalidValue);
    }
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(256, (size + 255) / 256 * 256 + 256);
  if (*ptr == nullptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard lock(tandem::cuda_emu::g_mutex);
  tandem::cuda_emu::pageLocked()[reinterpret_cast<uintptr_t>(*ptr)] = size;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard lock(tandem::cuda_emu::g_mutex);
    if (tandem::cuda_emu::pageLocked().erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return fail(cudaErrorInvalidValue);
    }
  }
  std::free(ptr);
  return cudaSuccess;
}

// A range is page-locked once: one that overlaps a page-locked range is
// refused, as the runtime refuses it, and unregistering needs the start
// of a registered range.
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  if (ptr == nullptr || size == 0) return fail(cudaErrorInvalidValue);
  const auto start = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(tandem::cuda_emu::g_mutex);
  auto& ranges = tandem::cuda_emu::pageLocked();
  auto after = ranges.lower_bound(start);
  const bool overlaps_next = after != ranges.end() && after->first < start + size;
  const bool overlaps_previous =
      after != ranges.begin() && std::prev(after)->first + std::prev(after)->second > start;
  if (overlaps_next || overlaps_previous) return fail(cudaErrorHostMemoryAlreadyRegistered);
  ranges[start] = size;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard lock(tandem::cuda_emu::g_mutex);
  if (tandem::cuda_emu::pageLocked().erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return fail(cudaErrorHostMemoryNotRegistered);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!checkCopyEnds(dst, count, src, count, kind, "cudaMemcpyAsync")) {
    return fail(cudaErrorInvalidValue);
  }
  const size_t pageable = tandem::cuda_emu::pageableBytes(dst, src, count, kind);
  enqueue(stream, [=] {
    tandem::cuda_emu::countPageableCopy(pageable);
    std::memmove(dst, src, count);
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t refused = refuseDuringCapture("cudaMemcpy")) return refused;
  return cudaMemcpyAsync(dst, src, count, kind, nullptr);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
  const size_t dst_span = height == 0 ? 0 : (height - 1) * dpitch + width;
  const size_t src_span = height == 0 ? 0 : (height - 1) * spitch + width;
  if (!checkCopyEnds(dst, dst_span, src, src_span, kind, "cudaMemcpy2DAsync")) {
    return fail(cudaErrorInvalidValue);
  }
  enqueue(stream, [=] {
    for (size_t row = 0; row < height; ++row) {
      std::memmove(static_cast<char*>(dst) + row * dpitch,
                   static_cast<const char*>(src) + row * spitch, width);
    }
  });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (!checkDevice(ptr, count, "cudaMemsetAsync")) return fail(cudaErrorInvalidValue);
  enqueue(stream, [=] { std::memset(ptr, value, count); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  return cudaStreamCreate(stream);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return tandem::cuda_emu::refuseDuringCapture("cudaStreamSynchronize");
}

cudaError_t cudaDeviceSynchronize() {
  return tandem::cuda_emu::refuseDuringCapture("cudaDeviceSynchronize");
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  CUstream_st* s = tandem::cuda_emu::streamOf(stream);
  if (stream == nullptr || s->capture != nullptr) return fail(cudaErrorIllegalState);
  s->capture = new CUgraph_st;
  tandem::cuda_emu::activeCaptures().push_back(s->capture);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = tandem::cuda_emu::streamOf(stream);
  if (s->capture == nullptr) return fail(cudaErrorIllegalState);
  auto& active = tandem::cuda_emu::activeCaptures();
  active.erase(std::find(active.begin(), active.end(), s->capture));
  cudaGraph_t captured = s->capture;
  s->capture = nullptr;
  if (captured->invalidated) {
    delete captured;
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = captured;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = tandem::cuda_emu::streamOf(stream)->capture != nullptr ? cudaStreamCaptureStatusActive
                                                                   : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  for (const auto& node : exec->nodes) enqueue(stream, node);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  return cudaEventCreate(event);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  return event == nullptr ? fail(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event == nullptr ? fail(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}
